//! The boundary after pairing: what pairing measured, as events, and the [`Sink`] that takes
//! them.
//!
//! ```text
//! pairing (marks -> durations) ──&Event──> Sink::on ──> metrics | spans | console
//!   Section, Wait, Route, Step (and its batch), Round, Dropped,    (super::sinks)
//!   RequestTraced, Request, Drained
//! ```
//!
//! An event borrows what pairing holds (the held trace of a step or round, a route's ids), so
//! delivering one allocates nothing. Pairing knows no instrument, tracer or table; a sink learns
//! nothing but events, and tells pairing nothing back: which traces to hold is fixed when the
//! pipeline is built ([`Hold`]). The requests' payloads ([`BatchEntry`], [`TracedRequest`],
//! [`Request`]) are defined here too: the open requests (`requests.rs`) fill them and the
//! sinks read them, so this boundary imports neither.

use super::trace::{Interval, StepTrace};
use crate::config::Timing;
use crate::names::DropReason;
use crate::record::{Finish, RequestKind};
use crate::vocab::{Layer, Phase, Section, Site, StepKind, VerifyPart};
use std::sync::Arc;

/// One measured thing, in the order pairing found it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event<'a> {
    /// A section paired: `ns` from its begin to its end on one lane of `rank`.
    Section {
        rank: u32,
        section: Section,
        site: Site,
        layer: Layer,
        ns: u64,
        /// Recorded inside another section.
        nested: bool,
    },
    /// Time `rank` waited at a collective's rendezvous: a probe section (which is also a
    /// [`Event::Section`]) or a wait the engine measured itself.
    Wait {
        rank: u32,
        site: Site,
        layer: Layer,
        ns: u64,
    },
    /// Expert ids routed in one MoE layer.
    Route {
        rank: u32,
        layer: Layer,
        ids: &'a [u16],
    },
    /// A step ended.
    Step(Step<'a>),
    /// A speculative round ended, joined with the verify parts recorded for it.
    Round(Round<'a>),
    /// `n` records dropped for `reason` (never 0).
    Dropped { reason: DropReason, n: u64 },
    /// A request became traced (one in N at its begin, or found slow): its span starts.
    RequestTraced(&'a TracedRequest),
    /// A request ended (delivered one pass after its end, with every rank's last steps).
    Request(&'a Request),
    /// A drain pass is over: every lane drained, the ready rounds finalized.
    Drained,
}

/// A step that ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step<'a> {
    pub(crate) rank: u32,
    /// What the engine said the step computes (`None`: not stated).
    pub(crate) kind: Option<StepKind>,
    /// The output tokens of its batch ([`crate::Recorder::serve`]); 0 for an engine that
    /// does not use the request API.
    pub(crate) outputs: u64,
    pub(crate) ns: u64,
    /// Of `ns`, the time spent at rendezvous probes and in waits the engine reported.
    pub(crate) wait_ns: u64,
    /// The step's trace, when pairing held it.
    pub(crate) held: Option<HeldStep<'a>>,
    /// The requests it served ([`crate::Recorder::serve`]), with their shares; empty for an
    /// engine that does not use the request API.
    pub(crate) batch: &'a [BatchEntry],
}

/// What a step's spans need that only pairing knows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeldStep<'a> {
    /// Its sections, routes, waits and parent span.
    pub(crate) trace: &'a StepTrace,
    /// The lane's step count before this one.
    pub(crate) number: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// One in N, flagged on the hot path.
    pub(crate) sampled: bool,
    /// What the engine said the step computes (`None`: not stated).
    pub(crate) kind: Option<StepKind>,
    /// The lane's timing backend.
    pub(crate) timing: Timing,
}

/// A round that ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Round<'a> {
    pub(crate) rank: u32,
    pub(crate) k: u32,
    /// `None`: the round ended without an accepted count (counted as unbalanced).
    pub(crate) accepted: Option<u32>,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Nanoseconds by `Phase`.
    pub(crate) phases: [u64; Phase::ALL.len()],
    /// Bit per phase marked in this round (a phase may take 0 ns and still have run).
    pub(crate) ran: u8,
    /// The verify sub-split, at `PHASETRACE_SPEC_LEVEL=2` only.
    pub(crate) split: Option<VerifySplit>,
    /// The round's trace, when pairing held it.
    pub(crate) held: Option<HeldRound<'a>>,
}

/// What a round's spans need that only pairing knows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeldRound<'a> {
    /// One in N, flagged on the hot path.
    pub(crate) sampled: bool,
    pub(crate) phases: &'a [Interval<Phase>],
    /// Verify parts, in start order.
    pub(crate) parts: &'a [Interval<VerifyPart>],
    /// The span the round's spans are children of (see `RoundTrace::parent`).
    pub(crate) parent: Option<super::trace::Parent>,
}

/// Which steps and rounds pairing holds the trace of, for the span sink; fixed when the
/// pipeline is built, so no sink steers pairing at run time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hold {
    /// Those flagged one in N on the hot path (there is a tracer).
    pub(crate) sampled: bool,
    /// Every one, since any may turn out slow (tail sampling is on too).
    pub(crate) every: bool,
}

/// Takes the events of pairing. Implemented by the fixed set of sinks
/// ([`super::sinks::Sinks`]); pairing is generic over it, so delivery is a direct call.
pub(crate) trait Sink {
    fn on(&mut self, e: &Event<'_>);
}

/// The verify sub-split of one round or a window of rounds, nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct VerifySplit {
    pub(crate) kda: u64,
    pub(crate) kda_scan: u64,
    pub(crate) mla: u64,
    pub(crate) ffn: u64,
    /// Verify less kda and mla.
    pub(crate) rest: u64,
    /// Bit per [`VerifyPart`] that was timed (a part may take 0 ns and still have run); bit
    /// [`VerifySplit::REST_RAN`] when the verify phase ran. The others are not exported.
    pub(crate) ran: u8,
}

impl VerifySplit {
    /// The split of a round whose verify phase took `verify` ns, from its parts' totals.
    pub(crate) fn of(
        verify: u64,
        verify_ran: bool,
        parts: &[u64; VerifyPart::ALL.len()],
        ran: u8,
    ) -> VerifySplit {
        let part = |p: VerifyPart| parts[p as usize];
        VerifySplit {
            ran: ran | if verify_ran { Self::REST_RAN } else { 0 },
            kda: part(VerifyPart::Kda),
            kda_scan: part(VerifyPart::KdaScan),
            mla: part(VerifyPart::Mla),
            ffn: part(VerifyPart::Ffn),
            rest: verify.saturating_sub(part(VerifyPart::Kda) + part(VerifyPart::Mla)),
        }
    }

    /// The `ran` bit of the rest of verify.
    pub(crate) const REST_RAN: u8 = 1 << VerifyPart::ALL.len();

    /// Each `part` value with its nanoseconds, the parts that ran only.
    pub(crate) fn by_name(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        [
            (
                VerifyPart::Kda.as_str(),
                self.kda,
                1 << VerifyPart::Kda as u8,
            ),
            (
                VerifyPart::KdaScan.as_str(),
                self.kda_scan,
                1 << VerifyPart::KdaScan as u8,
            ),
            (
                VerifyPart::Mla.as_str(),
                self.mla,
                1 << VerifyPart::Mla as u8,
            ),
            (
                VerifyPart::Ffn.as_str(),
                self.ffn,
                1 << VerifyPart::Ffn as u8,
            ),
            (VerifyPart::REST, self.rest, Self::REST_RAN),
        ]
        .into_iter()
        .filter(|&(_, _, bit)| self.ran & bit != 0)
        .map(|(name, ns, _)| (name, ns))
    }

    pub(crate) fn add(&mut self, o: &VerifySplit) {
        self.kda += o.kda;
        self.kda_scan += o.kda_scan;
        self.mla += o.mla;
        self.ffn += o.ffn;
        self.rest += o.rest;
        self.ran |= o.ran;
    }
}

// The requests' payloads: what `requests.rs` delivers in `Event::Step`'s batch,
// `Event::RequestTraced` and `Event::Request`.

/// One request of a step's batch, as the step event carries it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct BatchEntry {
    pub(crate) id: u64,
    pub(crate) tokens: u32,
    pub(crate) outputs: u32,
    /// The request is traced: the step links to it, and it gets a `request.step` span.
    pub(crate) traced: bool,
    /// Its share of the step's time and of the step's rendezvous waits, ns.
    pub(crate) share_ns: u64,
    pub(crate) wait_share_ns: u64,
    /// The request had no output token before this step: its tokens here are prefill.
    pub(crate) prefill: bool,
}

/// Why a request is traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TracedWhy {
    /// One in `PHASETRACE_TRACE_EVERY`, decided on the hot path.
    Head,
    /// Its time to first token or per output token was over the threshold.
    Tail,
}

/// A request that became traced: the span sink starts its span (at `begin`).
#[derive(Clone, Debug)]
pub(crate) struct TracedRequest {
    pub(crate) id: u64,
    pub(crate) kind: Arc<RequestKind>,
    pub(crate) begin: u64,
    pub(crate) why: TracedWhy,
}

/// A request that ended, with everything its metrics and span need.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub(crate) id: u64,
    pub(crate) kind: Arc<RequestKind>,
    pub(crate) finish: Finish,
    pub(crate) begin: u64,
    pub(crate) end: u64,
    /// Start of the first step that served it.
    pub(crate) first_step: Option<u64>,
    /// End of the step that gave its first output token.
    pub(crate) first_token: Option<u64>,
    pub(crate) input_tokens: u64,
    pub(crate) outputs: u64,
    pub(crate) drafted: u64,
    pub(crate) accepted: u64,
    /// Steps that served it on the lane that began it.
    pub(crate) steps: u64,
    pub(crate) share_ns: u64,
    pub(crate) wait_share_ns: u64,
    /// Each rank that served it, with its share of that rank's steps' waits (ns).
    pub(crate) wait_by_rank: Vec<(u32, u64)>,
    /// Steps, on any rank, that served it without a `request.step` span: before it was traced,
    /// or before its begin was seen.
    pub(crate) steps_untraced: u64,
    /// Its share of the speculative phases of the rounds that served it, ns by [`Phase`], on
    /// the rank that began it (`None`: no round served it).
    pub(crate) phase_share_ns: Option<[u64; Phase::ALL.len()]>,
}

impl Request {
    pub(crate) fn duration_ns(&self) -> u64 {
        self.end.saturating_sub(self.begin)
    }

    pub(crate) fn queue_ns(&self) -> Option<u64> {
        self.first_step.map(|s| s.saturating_sub(self.begin))
    }

    pub(crate) fn ttft_ns(&self) -> Option<u64> {
        self.first_token.map(|t| t.saturating_sub(self.begin))
    }

    pub(crate) fn prefill_ns(&self) -> Option<u64> {
        Some(self.first_token?.saturating_sub(self.first_step?))
    }

    pub(crate) fn decode_ns(&self) -> Option<u64> {
        self.first_token.map(|t| self.end.saturating_sub(t))
    }

    /// Time per output token after the first: with two output tokens or more.
    pub(crate) fn tpot_ns(&self) -> Option<u64> {
        let first = self.first_token?;
        (self.outputs >= 2).then(|| self.end.saturating_sub(first) / (self.outputs - 1))
    }

    /// The rank the others waited for: the one that waited least (with two ranks or more).
    pub(crate) fn waited_for_rank(&self) -> Option<u32> {
        if self.wait_by_rank.len() < 2 {
            return None;
        }
        self.wait_by_rank
            .iter()
            .min_by_key(|(_, w)| *w)
            .map(|(r, _)| *r)
    }
}
