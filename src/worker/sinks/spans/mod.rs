//! The span sink: for each step and round whose trace pairing held, the tail decision (one in
//! N, or slow within the rank's budget), the span budget, the spans, and the exemplars that
//! point at them. The span budget and the exporter's counts are read here only.
//!
//! ```text
//! Step / Round (held) ──> Tail::decide ──> Keep / Head ──> budget: pending spans + n under the
//!                            │ OverBudget: tail_budget      processor's queue? ── no: span_queue
//!                            ▼                                 │ yes
//!                          dropped                   build (build.rs) ──> exemplars (offered
//!                                                    before the spans end, settled on export)
//! Drained ──> spans that failed to export since the last pass: span_export
//! ```
//!
//! The drops it decides go back to the other sinks as [`Event::Dropped`]
//! ([`super::Sinks`]).

pub(crate) mod build;
pub(crate) mod tail;

use crate::export::SpanCounts;
use crate::export::exemplars::{Exemplar, ExemplarStore};
use crate::names::DropReason;
use crate::vocab::SectionKind;
use crate::worker::attrs::{section_attrs, step_attrs, wait_attrs};
use crate::worker::event::{Event, HeldRound, HeldStep, Hold, Round};
use crate::worker::trace::StepTrace;
use build::{BuiltStep, RoundSpans, Why};
use opentelemetry::KeyValue;
use opentelemetry::global::BoxedTracer;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tail::{Kind, Tail, Verdict};

/// Tail decisions, the span budget, span building and exemplar offers.
pub(crate) struct SpanSink {
    /// `None`: no spans (no tracer, or neither head nor tail sampling).
    tracer: Option<Arc<BoxedTracer>>,
    counts: Arc<SpanCounts>,
    tail: Tail,
    exemplars: Option<Arc<ExemplarStore>>,
    /// `group` on every span.
    group: KeyValue,
    /// Spans built and handed to the span processor.
    built: u64,
    /// Steps and rounds traced for being slow.
    tail_traces: u64,
    /// The exporter's counts as of the last pass.
    exported: u64,
    failed: u64,
}

/// The span sink's share of [`super::super::Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SpanFigures {
    pub(crate) built: u64,
    pub(crate) tail_traces: u64,
    pub(crate) exported: u64,
    pub(crate) failed: u64,
}

impl SpanSink {
    pub(crate) fn new(
        tracer: Option<Arc<BoxedTracer>>,
        counts: Arc<SpanCounts>,
        tail: Tail,
        exemplars: Option<Arc<ExemplarStore>>,
        group: KeyValue,
    ) -> SpanSink {
        SpanSink {
            tracer,
            counts,
            tail,
            exemplars,
            group,
            built: 0,
            tail_traces: 0,
            exported: 0,
            failed: 0,
        }
    }

    /// The traces pairing must hold for this sink: the sampled ones when there is a tracer,
    /// every one when tail sampling may keep any.
    pub(crate) fn hold(&self) -> Hold {
        let on = self.tracer.is_some();
        Hold {
            sampled: on,
            every: on && self.tail.is_on(),
        }
    }

    /// Takes an event; returns what it decided to drop, for the other sinks to count (a tail
    /// trace over the budget and spans over the queue exclude each other, so one at most).
    #[inline(always)]
    pub(crate) fn on(&mut self, e: &Event<'_>) -> Option<(DropReason, u64)> {
        match e {
            Event::Step(s) => s.held.as_ref().and_then(|h| self.step(s.rank, s.ns, h)),
            Event::Round(r) => r.held.as_ref().and_then(|h| self.round(r, h)),
            Event::Drained => self.drained(),
            Event::Section { .. }
            | Event::Wait { .. }
            | Event::Route { .. }
            | Event::Dropped { .. } => None,
        }
    }

    /// A held step has ended: traced when it was sampled or slow (within the rank's budget),
    /// with the exemplars of what was traced.
    #[inline(never)]
    fn step(&mut self, rank: u32, ns: u64, step: &HeldStep<'_>) -> Option<(DropReason, u64)> {
        let verdict = self
            .tail
            .decide(rank, Kind::Step, ns, step.end, step.sampled);
        let why = match (step.sampled, verdict) {
            (true, _) => Why::Head,
            (false, Verdict::Keep) => Why::Tail,
            (false, Verdict::OverBudget) => return Some((DropReason::TailBudget, 1)),
            (false, Verdict::Fast) => return None,
        };
        let tracer = self.tracer.as_deref()?;
        let n = build::step_span_count(step.trace);
        if !self.budget(n) {
            return Some((DropReason::SpanQueue, n as u64));
        }
        let (exemplars, group) = (self.exemplars.as_deref(), &self.group);
        // Exemplars are offered once the spans exist and before they end (an ended span may be
        // exported at once), so that the export settles them.
        let built = build::build_step(tracer, rank, step, group, why, |built| {
            if let Some(store) = exemplars {
                offer_step_exemplars(store, group, step.trace, built, rank, ns, step.end);
            }
        });
        self.built += built as u64;
        if why == Why::Tail {
            self.tail_traces += 1;
        }
        None
    }

    /// A held round has ended: traced when it was sampled or slow (within the rank's budget).
    fn round(&mut self, r: &Round<'_>, held: &HeldRound<'_>) -> Option<(DropReason, u64)> {
        let ns = r.end.saturating_sub(r.start);
        let verdict = self
            .tail
            .decide(r.rank, Kind::Round, ns, r.end, held.sampled);
        let why = match (held.sampled, verdict) {
            (true, _) => Why::Head,
            (false, Verdict::Keep) => Why::Tail,
            (false, Verdict::OverBudget) => return Some((DropReason::TailBudget, 1)),
            (false, Verdict::Fast) => return None,
        };
        let n = 1 + held.phases.len() + held.parts.len();
        if !self.budget(n) {
            return Some((DropReason::SpanQueue, n as u64));
        }
        let tracer = self.tracer.as_deref()?;
        if why == Why::Tail {
            self.tail_traces += 1;
        }
        self.built += build::build_round(
            tracer,
            &RoundSpans {
                phases: held.phases,
                parts: held.parts,
                rank: r.rank,
                k: r.k,
                accepted: r.accepted,
                start: r.start,
                end: r.end,
                group: &self.group,
                why,
                parent: held.parent,
            },
        ) as u64;
        None
    }

    /// Spans handed to the processor and not yet exported or failed, plus `n`, stay under the
    /// processor's queue capacity (less one export batch in flight); if not they are not built,
    /// and are counted under `reason="span_queue"` (the processor would drop them uncounted).
    fn budget(&self, n: usize) -> bool {
        if !self.counts.tracked {
            // The engine's provider: its processor's queue is its own to bound and count.
            return true;
        }
        let done = self.counts.exported.load(Relaxed) + self.counts.failed.load(Relaxed);
        let pending = self.built.saturating_sub(done);
        pending + n as u64 <= crate::export::SPAN_QUEUE_BUDGET as u64
    }

    /// The end of a pass: spans lost to failed exports since the last one are counted.
    fn drained(&mut self) -> Option<(DropReason, u64)> {
        let failed = self.counts.failed.load(Relaxed);
        let lost = failed.saturating_sub(self.failed);
        self.failed = failed;
        self.exported = self.counts.exported.load(Relaxed);
        (lost > 0).then_some((DropReason::SpanExport, lost))
    }

    pub(crate) fn figures(&self) -> SpanFigures {
        SpanFigures {
            built: self.built,
            tail_traces: self.tail_traces,
            exported: self.exported,
            failed: self.failed,
        }
    }
}

/// The exemplars of a traced step: its duration, each section's, each probe's wait and each
/// wait the engine measured (those point at the step's span).
fn offer_step_exemplars(
    store: &ExemplarStore,
    group: &KeyValue,
    trace: &StepTrace,
    built: &BuiltStep,
    rank: u32,
    ns: u64,
    end: u64,
) {
    use crate::names::metric;
    let ex = |span_id, ns: u64, at: u64| Exemplar {
        trace_id: built.trace_id,
        span_id,
        value: ns as f64 * 1e-9,
        time: crate::timing::to_system_time(at),
    };
    store.offer(
        metric::STEP_DURATION,
        &step_attrs(group, rank),
        ex(built.root, ns, end),
    );
    for (sec, id) in trace.sections.iter().zip(&built.sections) {
        let (Some(id), Some(e)) = (id, sec.end) else {
            continue;
        };
        let d = e.saturating_sub(sec.start);
        let (kv, n) = section_attrs(group, sec.section, sec.site, rank);
        store.offer(metric::SECTION_DURATION, &kv[..n], ex(*id, d, e));
        if sec.section.kind() == SectionKind::Probe {
            let (kv, n) = wait_attrs(group, sec.site, rank);
            store.offer(metric::COLLECTIVE_WAIT, &kv[..n], ex(*id, d, e));
        }
    }
    for w in &trace.waits {
        let (kv, n) = wait_attrs(group, w.site, rank);
        store.offer(
            metric::COLLECTIVE_WAIT,
            &kv[..n],
            ex(built.root, w.ns, w.at),
        );
    }
}
