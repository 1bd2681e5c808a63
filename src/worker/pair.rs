//! Pairing: turns each lane's mark stream into durations, in order, and delivers them as
//! [`Event`]s to a [`Sink`]. Unbalanced marks are counted (as [`Event::Dropped`]), never fatal.
//!
//! ```text
//! Pairing ──adopt──> LaneState per lane: resolve tokens in order, pair begin/end, hold the
//!    │                open step (and its trace when held) ──> Section, Wait, Route, Step
//!    └─ rounds ended in the previous pass, joined with the verify parts any lane recorded
//!       for them ──> Round
//! ```

use super::event::BatchEntry;
use super::event::{Event, HeldRound, HeldStep, Hold, Round, Sink, Step, VerifySplit};
use super::open::{OpenSlot, OpenSteps};
use super::requests::{BATCH_MAX, Requests, Served};
use super::trace::{Interval, Parent, RoundTrace, Route, SectionSpan, StepTrace, Wait};
use crate::config::SpecLevel;
use crate::names::DropReason;
use crate::record::mark::{Mark, MarkKind};
use crate::record::{Lane, RoundRef, Shared};
use crate::timing::{Conversion, Resolved, Token};
use crate::vocab::{Layer, Phase, Section, SectionKind, Site, StepKind, VerifyPart};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Most sections held for one step's trace (a 100-layer model records about 2,500); the rest
/// are counted under `reason="trace_bound"`. 48 bytes each: at most 384 KiB a lane.
pub(crate) const STEP_SPANS_MAX: usize = 1 << 13;
/// Most routed expert ids and measured waits held for one step's trace.
const STEP_IDS_MAX: usize = 1 << 16;
/// Most verify-part intervals kept for one sampled round.
const ROUND_PARTS_MAX: usize = 256;
/// Most nested open sections per lane.
const STACK_MAX: usize = 256;

struct Open {
    section: Section,
    site: Site,
    layer: Layer,
    start: u64,
    /// Index into the sampled step's spans.
    span: Option<usize>,
}

struct OpenStep {
    start: u64,
    number: u64,
    /// Time spent at rendezvous probes (and reported waits) so far in this step.
    wait_ns: u64,
    /// Sections open when the step began; deeper ones left open at its end are stale.
    depth: usize,
    /// One in N, flagged on the hot path.
    sampled: bool,
    /// Whether the lane's `trace` holds this step (sampled, or tail sampling is on).
    collect: bool,
    /// The recorder's index of a step recorded live (`None`: replayed from a graph, whose
    /// captured index repeats).
    index: Option<u32>,
    /// What the engine said it computes (`None`: not stated).
    kind: Option<StepKind>,
}

/// A round as the worker keys it: its [`RoundRef`] and, for a round captured inside a CUDA
/// graph, the replay it came from (0: recorded live). Every replay of a graph repeats the
/// captured round's sequence number, so without the replay the verify parts of two replays
/// awaiting their finalization would mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RoundKey {
    pub(crate) round: RoundRef,
    pub(crate) replay: u64,
}

pub(crate) struct OpenRound {
    pub(crate) start: u64,
    pub(crate) k: u32,
    pub(crate) round: RoundKey,
    pub(crate) last: u64,
    pub(crate) phases: [u64; 5],
    /// Bit per phase marked in this round (a phase may take 0 ns and still have run).
    pub(crate) ran: u8,
    /// One in N, flagged on the hot path.
    pub(crate) sampled: bool,
    /// Held while the round may be traced (sampled, or tail sampling is on).
    pub(crate) trace: Option<RoundTrace>,
    /// The requests (id, tokens) of the step it overlaps, whose shares of its phases are
    /// counted when it is finalized.
    pub(crate) batch: Vec<(u64, u32)>,
}

/// A round that ended; finalized one drain pass later so verify parts recorded on other
/// threads before its end have arrived.
pub(crate) struct EndedRound {
    pub(crate) round: OpenRound,
    pub(crate) end: u64,
    pub(crate) accepted: Option<u32>,
    pub(crate) rank: u32,
}

/// Verify parts gathered for one round: totals by `VerifyPart` and intervals.
#[derive(Default)]
pub(crate) struct PartsAcc {
    pub(crate) ns: [u64; VerifyPart::ALL.len()],
    /// Bit per part that ended at least once.
    pub(crate) ran: u8,
    pub(crate) intervals: Vec<Interval<VerifyPart>>,
}

/// An open verify part.
struct OpenPart {
    part: VerifyPart,
    round: RoundKey,
    start: u64,
}

/// Most rounds with verify parts awaiting their round's end; beyond, they are given up and
/// counted (bounded memory).
const PARTS_MAX: usize = 65_536;

/// What pairing counted: the pairing half of [`super::Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) marks: u64,
    pub(crate) sections: u64,
    pub(crate) steps: u64,
    pub(crate) rounds: u64,
    pub(crate) graph_replays: u64,
    pub(crate) dropped_graph_replays: u64,
    /// Internal requests ended ([`crate::RequestKind::internal`]).
    pub(crate) internal_requests: u64,
}

/// Pairing for every lane of one profiler, and the rounds that wait for their verify parts.
pub(crate) struct Pairing {
    shared: Arc<Shared>,
    open: Arc<OpenSteps>,
    hold: Hold,
    lanes: Vec<LaneState>,
    /// Verify parts by round, from whichever lane recorded them.
    parts: HashMap<RoundKey, PartsAcc>,
    /// Rounds ended in the previous pass, finalized in this one.
    ended_prev: Vec<EndedRound>,
    ended_now: Vec<EndedRound>,
    counts: Counts,
    /// A lane waits for a graph replay's end fence (see [`LaneState::awaiting_replay`]).
    awaiting_replay: bool,
    /// The open requests of every lane.
    requests: Requests,
}

impl Pairing {
    pub(crate) fn new(
        shared: Arc<Shared>,
        open: Arc<OpenSteps>,
        hold: Hold,
        requests: Requests,
    ) -> Pairing {
        Pairing {
            requests,
            shared,
            open,
            hold,
            lanes: Vec::new(),
            parts: HashMap::new(),
            ended_prev: Vec::new(),
            ended_now: Vec::new(),
            counts: Counts::default(),
            awaiting_replay: false,
        }
    }

    /// One pass: adopts new lanes, drains each into `out`, forgets finished lanes, then
    /// finalizes the rounds ended in the previous pass.
    pub(crate) fn pass<S: Sink>(&mut self, out: &mut S) {
        {
            let lanes = self.shared.lanes.lock().unwrap_or_else(|p| p.into_inner());
            for l in lanes.iter() {
                if !self.lanes.iter().any(|s| Arc::ptr_eq(&s.lane, l)) {
                    self.lanes.push(LaneState::new(l.clone(), &self.open));
                }
            }
        }
        let mut cx = Cx {
            out,
            counts: &mut self.counts,
            parts: &mut self.parts,
            ended: &mut self.ended_now,
            graphs: &self.shared.graphs,
            hold: self.hold,
            requests: &mut self.requests,
        };
        self.awaiting_replay = false;
        // Every lane's queue is taken first, then processed: lanes are then read at nearly one
        // instant, so a rank's step is seldom seen before the request begin another rank
        // recorded before it (and the requests' settling below reads one consistent pass).
        for lane in &mut self.lanes {
            lane.fill();
        }
        for lane in &mut self.lanes {
            lane.drain(&mut cx);
            lane.collect_drops(&mut cx);
            self.awaiting_replay |= lane.awaiting_replay();
        }
        // Forget lanes whose recorder is gone and whose marks are all processed.
        let before = self.lanes.len();
        self.lanes.retain(|l| !l.finished());
        if self.lanes.len() != before {
            let mut shared = self.shared.lanes.lock().unwrap_or_else(|p| p.into_inner());
            shared.retain(|l| {
                !(l.closed.load(Ordering::Acquire) && l.queue.is_empty())
                    || self.lanes.iter().any(|s| Arc::ptr_eq(&s.lane, l))
            });
        }
        self.finalize_ended(out);
        self.ended_prev = std::mem::take(&mut self.ended_now);
        let settled = self.settled();
        self.requests.pass_done(settled, out);
        if self.parts.len() > PARTS_MAX {
            let n = self.parts.len() as u64;
            self.parts.clear();
            out.on(&Event::Dropped {
                reason: DropReason::Unbalanced,
                n,
            });
        }
    }

    /// Finalizes the rounds ended in the previous pass (at flush: in this very pass).
    pub(crate) fn finalize_ended<S: Sink>(&mut self, out: &mut S) {
        let ready = std::mem::take(&mut self.ended_prev);
        for r in ready {
            self.finalize_round(r, out);
        }
    }

    /// The time before which every lane has delivered what it will: a request that ended
    /// earlier has all its steps. Rounds still to be finalized hold phase shares of the
    /// requests they served.
    fn settled(&self) -> u64 {
        self.lanes
            .iter()
            .map(LaneState::complete_before)
            .chain(self.ended_prev.iter().map(|r| r.round.start))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Delivers the ended requests whose steps are all in (at flush): one that ended inside a
    /// step still open waits for it. `closing` (shutdown): every ended request, and the steps,
    /// rounds and requests still open counted under `reason="open_at_shutdown"`.
    pub(crate) fn finalize_requests<S: Sink>(&mut self, closing: bool, out: &mut S) {
        if closing {
            let open: u64 = self
                .lanes
                .iter_mut()
                .map(|l| u64::from(l.step.take().is_some()) + u64::from(l.round.take().is_some()))
                .sum();
            if open > 0 {
                out.on(&Event::Dropped {
                    reason: DropReason::OpenAtShutdown,
                    n: open,
                });
            }
        }
        let settled = self.settled();
        self.requests.flush(settled, closing, out);
    }

    /// A round joined with its verify parts, delivered as [`Event::Round`].
    fn finalize_round<S: Sink>(&mut self, r: EndedRound, out: &mut S) {
        let parts = self.parts.remove(&r.round.round);
        let split = (self.shared.spec_level.load() == SpecLevel::VerifySplit).then(|| {
            VerifySplit::of(
                r.round.phases[Phase::Verify as usize],
                r.round.ran & (1 << Phase::Verify as u8) != 0,
                &parts.as_ref().map_or([0; 4], |p| p.ns),
                parts.as_ref().map_or(0, |p| p.ran),
            )
        });
        self.counts.rounds += 1;
        self.requests
            .round(r.round.round.round.lane, &r.round.batch, &r.round.phases);
        let mut intervals = Vec::new();
        if r.round.trace.is_some() {
            intervals = parts.map(|p| p.intervals).unwrap_or_default();
            intervals.sort_by_key(|p| p.start);
        }
        out.on(&Event::Round(Round {
            rank: r.rank,
            k: r.round.k,
            accepted: r.accepted,
            start: r.round.start,
            end: r.end,
            phases: r.round.phases,
            ran: r.round.ran,
            split,
            held: r.round.trace.as_ref().map(|t| HeldRound {
                sampled: r.round.sampled,
                phases: &t.phases,
                parts: &intervals,
                parent: t.parent,
            }),
        }));
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts {
            internal_requests: self.requests.internal_done(),
            ..self.counts
        }
    }

    /// Whether a lane waits for the end fence of a graph replay.
    pub(crate) fn awaiting_replay(&self) -> bool {
        self.awaiting_replay
    }

    /// Sets how long an ended request waits for the other ranks' steps (tests).
    #[cfg(test)]
    pub(crate) fn set_settle_max(&mut self, max: std::time::Duration) {
        self.requests.set_settle_max(max);
    }

    #[cfg(test)]
    pub(crate) fn open(&self) -> &OpenSteps {
        &self.open
    }
}

/// What a lane's pairing reaches beyond the lane: the sink, the counts, the rounds and verify
/// parts shared by all lanes, the graph registry.
pub(crate) struct Cx<'a, S> {
    out: &'a mut S,
    counts: &'a mut Counts,
    parts: &'a mut HashMap<RoundKey, PartsAcc>,
    ended: &'a mut Vec<EndedRound>,
    graphs: &'a crate::record::graph::Registry,
    hold: Hold,
    requests: &'a mut Requests,
}

impl<S: Sink> Cx<'_, S> {
    #[inline(always)]
    fn emit(&mut self, e: &Event<'_>) {
        self.out.on(e);
    }

    /// Counts `n` records dropped for `reason`.
    fn drop(&mut self, reason: DropReason, n: u64) {
        if n > 0 {
            self.out.on(&Event::Dropped { reason, n });
        }
    }
}

pub(crate) struct LaneState {
    pub(crate) lane: Arc<Lane>,
    backlog: VecDeque<Mark>,
    stack: Vec<Open>,
    step: Option<OpenStep>,
    /// The open step's sections, routes and waits, reused from step to step.
    trace: StepTrace,
    steps: u64,
    round: Option<OpenRound>,
    parts_open: Vec<OpenPart>,
    parent: ParentWords,
    last_ns: u64,
    /// The lane's hot-path drop counts already moved into the stats.
    seen: [u64; DropReason::COUNT],
    replay: Option<OpenReplay>,
    awaiting_replay: bool,
    /// Graph replays processed so far; the one being processed while its captured marks are
    /// (0: live marks). Keys the rounds of each replay apart ([`RoundKey`]).
    replays: u64,
    in_replay: u64,
    /// Round sequence numbers begun by the replay being processed.
    replay_rounds: Vec<u32>,
    /// The lane's clock is the host clock: its tokens are raw readings the worker converts.
    host: bool,
    /// Since when the oldest mark has been pending (a deferred clock that has not reached it),
    /// by [`crate::timing::now_ns`] at the first drain that found it pending.
    pending_since: Option<u64>,
    /// The lost step end already acted on ([`Lane::last_lost_step_end`]).
    lost_end_seen: u64,
    /// The lane's open step as `phasetrace.step.open_duration` reads it.
    open: OpenSlot,
    /// The request id of the next `RequestBegin` or `RequestEnd`.
    request_id: Option<u64>,
    /// `Serve` marks since the last step end: the batch of the open (or next) step.
    served: Vec<Served>,
    /// The batch of the step being delivered, reused.
    batch: Vec<BatchEntry>,
}

/// Gives `round` the batch of the step it overlaps, unless it has one.
fn take_batch(round: &mut OpenRound, served: &[Served]) {
    if round.batch.is_empty() {
        round
            .batch
            .extend(served.iter().take(BATCH_MAX).map(|s| (s.id, s.tokens)));
    }
}

/// A graph launch whose begin fence has resolved.
struct OpenReplay {
    graph: u32,
    seq: u32,
    start: u64,
    sampled: bool,
}

/// The parent span context of the next sampled step, as its three marks arrive.
#[derive(Default)]
struct ParentWords {
    trace_hi: Option<u64>,
    trace_lo: Option<u64>,
    span: Option<u64>,
}

impl ParentWords {
    /// The complete parent, if all three words arrived; starts over either way.
    fn take(&mut self) -> Option<Parent> {
        let w = std::mem::take(self);
        Some(Parent {
            trace_id: (u128::from(w.trace_hi?) << 64) | u128::from(w.trace_lo?),
            span_id: w.span?,
        })
    }
}

impl LaneState {
    pub(crate) fn new(lane: Arc<Lane>, open: &Arc<OpenSteps>) -> LaneState {
        let host = crate::timing::is_host(lane.clock.as_ref());
        LaneState {
            pending_since: None,
            lost_end_seen: 0,
            open: open.slot(lane.rank),
            host,
            lane,
            backlog: VecDeque::new(),
            stack: Vec::new(),
            step: None,
            trace: StepTrace::default(),
            steps: 0,
            round: None,
            parts_open: Vec::new(),
            parent: ParentWords::default(),
            last_ns: 0,
            seen: [0; DropReason::COUNT],
            replay: None,
            awaiting_replay: false,
            replays: 0,
            in_replay: 0,
            replay_rounds: Vec::new(),
            request_id: None,
            served: Vec::new(),
            batch: Vec::new(),
        }
    }

    /// Whether the lane's recorder is gone and nothing is left to process.
    pub(crate) fn finished(&self) -> bool {
        self.lane.closed.load(std::sync::atomic::Ordering::Acquire)
            && self.lane.queue.is_empty()
            && self.backlog.is_empty()
    }

    /// Delivers the lane's hot-path drop counts (as deltas).
    pub(crate) fn collect_drops<S: Sink>(&mut self, s: &mut Cx<'_, S>) {
        let now = self.lane.drops();
        for reason in DropReason::ALL {
            let i = reason.index();
            s.drop(reason, now[i].saturating_sub(self.seen[i]));
        }
        self.seen = now;
    }

    /// Whether the lane waits for the end fence of a graph replay: the worker then polls sooner,
    /// since the replay is readable only until the engine launches the graph again.
    pub(crate) fn awaiting_replay(&self) -> bool {
        self.awaiting_replay
    }

    /// Processes the lane's backlog ([`LaneState::fill`]) in order until a mark is not
    /// resolvable yet, then publishes since when the lane's step has been open (or its oldest
    /// mark pending).
    pub(crate) fn drain<S: Sink>(&mut self, s: &mut Cx<'_, S>) {
        self.drain_marks(s);
        self.close_step_whose_end_was_lost(s);
        let step = self.step.as_ref().map(|st| st.start);
        self.open.set(match (step, self.pending_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        });
    }

    /// A step whose end mark the recorder lost (a full queue: counted there) would stay open
    /// until the rank's next step, and read as a hang (`phasetrace.step.open_duration`) if the
    /// rank then idles: it is closed without a duration. Its sections left open are stale
    /// (counted as unbalanced). Checked after each drain; a loss is acted on once, when its
    /// step is the open one, or forgotten once a later step has begun.
    fn close_step_whose_end_was_lost<S: Sink>(&mut self, s: &mut Cx<'_, S>) {
        let Some((v, index)) = self.lane.last_lost_step_end() else {
            return;
        };
        if v == self.lost_end_seen {
            return;
        }
        let Some(open) = self.step.as_ref().and_then(|st| st.index) else {
            // No live step open: the lost step's begin is still queued; look again next time.
            return;
        };
        if open == index {
            if let Some(step) = self.step.take()
                && self.stack.len() > step.depth
            {
                Self::unbalanced(s, (self.stack.len() - step.depth) as u64);
                self.stack.truncate(step.depth);
            }
            self.lost_end_seen = v;
        } else if (open.wrapping_sub(index) as i32) > 0 {
            // A later step began: the lost one was closed as unbalanced then.
            self.lost_end_seen = v;
        }
    }

    /// Takes the lane's queued marks into its backlog, for [`LaneState::drain`].
    pub(crate) fn fill(&mut self) {
        // The backlog holds marks a deferred clock has not resolved yet; it never outgrows the
        // lane, so a lane costs at most twice its capacity in memory.
        let max = self.lane.queue.capacity();
        while self.backlog.len() < max {
            match self.lane.pop() {
                Some(m) => self.backlog.push_back(m),
                None => break,
            }
        }
    }

    /// The time before which this lane has nothing more to deliver after its last drain:
    /// the start of its open step or round, or its last resolved mark while marks wait for a
    /// deferred clock (`u64::MAX` when none). A request that ended earlier has every step of this
    /// lane that served it.
    pub(crate) fn complete_before(&self) -> u64 {
        let mut t = u64::MAX;
        if let Some(step) = &self.step {
            t = t.min(step.start);
        }
        if let Some(round) = &self.round {
            t = t.min(round.start);
        }
        if !self.backlog.is_empty() {
            t = t.min(self.last_ns);
        }
        t
    }

    fn drain_marks<S: Sink>(&mut self, s: &mut Cx<'_, S>) {
        self.awaiting_replay = false;
        if self.backlog.is_empty() {
            return;
        }
        // Host readings are raw (TSC ticks where the CPU has an invariant TSC): one snapshot of
        // the calibration converts this drain's marks.
        let host = Conversion::current();
        while let Some(m) = self.backlog.front().copied() {
            let t = if m.is_untimed() {
                0
            } else if self.host || m.is_host() {
                host.to_ns(m.token())
            } else {
                let token = Token(m.token());
                match self.lane.clock.resolve(token) {
                    Resolved::At(ns) => {
                        self.lane.clock.release(token);
                        self.pending_since = None;
                        ns
                    }
                    Resolved::Pending => {
                        self.awaiting_replay = m.kind() == MarkKind::ReplayEnd;
                        // Counted from the first drain that found this mark pending: a stream
                        // stuck that long is the hang, whether or not its step had begun.
                        if self.pending_since.is_none() {
                            self.pending_since = Some(crate::timing::now_ns());
                        }
                        return;
                    }
                    Resolved::Failed => {
                        self.lane.clock.release(token);
                        self.pending_since = None;
                        self.backlog.pop_front();
                        s.counts.marks += 1;
                        s.drop(DropReason::Clock, 1);
                        if m.kind() == MarkKind::StepEnd {
                            // The step ended, at an unknown time: not left open (a false hang).
                            self.step = None;
                        }
                        continue;
                    }
                }
            };
            self.backlog.pop_front();
            s.counts.marks += 1;
            if t != 0 {
                self.last_ns = t;
            }
            self.process(m, t, s);
        }
    }

    /// Processes the captured boundaries of one graph launch whose end fence completed at `end`,
    /// or counts the launch when its events are not (or no longer) its own.
    fn replayed<S: Sink>(&mut self, r: &OpenReplay, end: u64, s: &mut Cx<'_, S>) {
        let Some(g) = s.graphs.get(r.graph) else {
            s.counts.dropped_graph_replays += 1;
            return;
        };
        let Some(times) = super::replay::read(&g, r.seq, r.start, end) else {
            s.counts.dropped_graph_replays += 1;
            s.drop(DropReason::GraphReplay, g.template.len() as u64);
            return;
        };
        s.counts.graph_replays += 1;
        self.replays += 1;
        self.in_replay = self.replays;
        self.replay_rounds.clear();
        for (m, t) in g.template.iter().zip(times) {
            let m = match m.kind() {
                // Sampling is decided per replay, not once at capture.
                MarkKind::StepBegin | MarkKind::RoundBegin => m.with_sampled(r.sampled),
                MarkKind::ReplayBegin | MarkKind::ReplayEnd => continue,
                _ => *m,
            };
            self.last_ns = t;
            self.process(m, t, s);
        }
        self.in_replay = 0;
    }

    /// The round a verify part belongs to. [`RoundRef::LAUNCHING_SEQ`]: the round open on this
    /// lane now. Inside a replay: the replay's own round when the graph began it, else (a part
    /// captured for a round recorded around the capture, which is long gone) the round open on
    /// this lane, which launched the graph. `None`: no round to belong to.
    fn part_round(&self, round: RoundRef) -> Option<RoundKey> {
        let open = || self.round.as_ref().map(|r| r.round);
        if round.seq == RoundRef::LAUNCHING_SEQ {
            return open();
        }
        if self.in_replay == 0 {
            return Some(RoundKey { round, replay: 0 });
        }
        if round.lane == self.lane.id && self.replay_rounds.contains(&round.seq) {
            return Some(RoundKey {
                round,
                replay: self.in_replay,
            });
        }
        open()
    }

    fn unbalanced<S: Sink>(s: &mut Cx<'_, S>, n: u64) {
        s.drop(DropReason::Unbalanced, n);
    }

    /// Pairs one resolved mark at `t`: the request and step parts, the round parts, then the
    /// graph replay and verify parts, each in its own method below.
    fn process<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        match m.kind() {
            MarkKind::ParentHi => self.parent.trace_hi = Some(m.token()),
            MarkKind::ParentLo => self.parent.trace_lo = Some(m.token()),
            MarkKind::ParentSpan => self.parent.span = Some(m.token()),
            MarkKind::RequestId => {
                if self.request_id.replace(m.token()).is_some() {
                    Self::unbalanced(s, 1);
                }
            }
            MarkKind::RequestBegin => self.request_begin(m, t, s),
            MarkKind::RequestEnd => self.request_end(m, t, s),
            MarkKind::Sequence => match self.request_id.take() {
                Some(seq) => s.requests.sequence(seq, m.token(), s.out),
                None => Self::unbalanced(s, 1),
            },
            MarkKind::Serve => self.serve(m, s),
            MarkKind::StepBegin => self.step_begin(m, t, s),
            MarkKind::StepEnd => self.step_end(t, s),
            MarkKind::SectionBegin => self.section_begin(m, t, s),
            MarkKind::SectionEnd => self.section_end(m, t, s),
            MarkKind::Wait => self.wait(m, s),
            MarkKind::Route => self.route(m, s),
            MarkKind::RoundBegin => self.round_begin(m, t, s),
            MarkKind::Phase => self.phase(m, t, s),
            MarkKind::RoundEnd => self.round_end(m, t, s),
            MarkKind::ReplayBegin => self.replay_begin(m, t, s),
            MarkKind::ReplayEnd => self.replay_end(m, t, s),
            MarkKind::PartBegin => self.part_begin(m, t, s),
            MarkKind::PartEnd => self.part_end(m, t, s),
        }
    }

    // The request and step parts: a request's life, a step and what it contains.

    fn request_begin<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        let Some(id) = self.request_id.take() else {
            Self::unbalanced(s, 1);
            return;
        };
        s.requests
            .begin(id, m.class(), t, m.is_sampled(), self.lane.id, s.out);
    }

    fn request_end<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        let Some(id) = self.request_id.take() else {
            Self::unbalanced(s, 1);
            return;
        };
        let (code, error) = m.finish();
        let Some(finish) = crate::record::Finish::from_code(code, error) else {
            Self::unbalanced(s, 1);
            return;
        };
        s.requests.end(id, t, finish, s.out);
    }

    fn serve<S: Sink>(&mut self, m: Mark, s: &mut Cx<'_, S>) {
        let (id, tokens, outputs, drafted, accepted) = m.served();
        if self.served.len() >= BATCH_MAX {
            s.drop(DropReason::RequestBound, 1);
            return;
        }
        self.served.push(Served {
            id,
            tokens,
            outputs,
            drafted,
            accepted,
        });
    }

    fn step_begin<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        if self.step.is_some() {
            Self::unbalanced(s, 1);
        }
        let sampled = m.is_sampled() && s.hold.sampled;
        let parent = self.parent.take();
        self.steps += 1;
        self.trace.clear();
        self.trace.parent = parent;
        self.step = Some(OpenStep {
            start: t,
            number: self.steps - 1,
            wait_ns: 0,
            depth: self.stack.len(),
            sampled,
            collect: sampled || s.hold.every || (s.hold.sampled && s.requests.any_traced()),
            index: (self.in_replay == 0).then(|| m.step_index()),
            kind: m.step_kind(),
        });
    }

    fn step_end<S: Sink>(&mut self, t: u64, s: &mut Cx<'_, S>) {
        let rank = self.lane.rank;
        let Some(step) = self.step.take() else {
            Self::unbalanced(s, 1);
            return;
        };
        // A section begun in this step whose end was lost (a full buffer) would otherwise
        // sit on the stack and pair with a later end of the same section.
        if self.stack.len() > step.depth {
            Self::unbalanced(s, (self.stack.len() - step.depth) as u64);
            self.stack.truncate(step.depth);
        }
        s.counts.steps += 1;
        s.requests.step(
            rank,
            self.lane.id,
            step.start,
            t,
            step.wait_ns,
            &self.served,
            &mut self.batch,
            s.out,
        );
        if let Some(round) = self.round.as_mut() {
            take_batch(round, &self.served);
        }
        let outputs = self.served.iter().map(|r| u64::from(r.outputs)).sum();
        self.served.clear();
        s.emit(&Event::Step(Step {
            rank,
            kind: step.kind,
            outputs,
            ns: t.saturating_sub(step.start),
            wait_ns: step.wait_ns,
            batch: &self.batch,
            held: step.collect.then_some(HeldStep {
                trace: &self.trace,
                number: step.number,
                start: step.start,
                end: t,
                sampled: step.sampled,
                kind: step.kind,
                timing: self.lane.clock.timing(),
            }),
        }));
    }

    fn section_begin<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        if self.stack.len() >= STACK_MAX {
            Self::unbalanced(s, 1);
            return;
        }
        let (section, site, layer) = (m.section(), m.site(), m.layer());
        let parent = self.stack.last().and_then(|o| o.span);
        let collect = self.step.as_ref().is_some_and(|st| st.collect);
        let span = if !collect {
            None
        } else if self.trace.sections.len() < STEP_SPANS_MAX {
            self.trace.sections.push(SectionSpan {
                section,
                layer,
                site,
                start: t,
                end: None,
                parent,
            });
            Some(self.trace.sections.len() - 1)
        } else {
            s.drop(DropReason::TraceBound, 1);
            None
        };
        self.stack.push(Open {
            section,
            site,
            layer,
            start: t,
            span,
        });
    }

    fn section_end<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        let rank = self.lane.rank;
        let section = m.section();
        let Some(pos) = self.stack.iter().rposition(|o| o.section == section) else {
            Self::unbalanced(s, 1);
            return;
        };
        let inner = self.stack.len() - 1 - pos;
        if inner > 0 {
            // Sections opened inside this one and never ended.
            self.stack.truncate(pos + 1);
            Self::unbalanced(s, inner as u64);
        }
        let Some(open) = self.stack.pop() else {
            return;
        };
        let ns = t.saturating_sub(open.start);
        s.counts.sections += 1;
        s.emit(&Event::Section {
            rank,
            section: open.section,
            site: open.site,
            layer: open.layer,
            ns,
            nested: !self.stack.is_empty(),
        });
        // A rendezvous probe's section is the rank's wait there.
        if open.section.kind() == SectionKind::Probe {
            s.emit(&Event::Wait {
                rank,
                site: open.site,
                layer: open.layer,
                ns,
            });
            if let Some(step) = self.step.as_mut() {
                step.wait_ns = step.wait_ns.saturating_add(ns);
            }
        }
        if let Some(sp) = open.span.and_then(|i| self.trace.sections.get_mut(i)) {
            sp.end = Some(t);
        }
    }

    fn wait<S: Sink>(&mut self, m: Mark, s: &mut Cx<'_, S>) {
        let rank = self.lane.rank;
        if let Some(step) = self.step.as_mut() {
            step.wait_ns = step.wait_ns.saturating_add(m.wait_ns());
        }
        s.emit(&Event::Wait {
            rank,
            site: m.site(),
            layer: m.layer(),
            ns: m.wait_ns(),
        });
        if self.step.as_ref().is_some_and(|st| st.collect) {
            if self.trace.waits.len() < STEP_IDS_MAX {
                self.trace.waits.push(Wait {
                    site: m.site(),
                    layer: m.layer(),
                    ns: m.wait_ns(),
                    at: self.last_ns,
                });
            } else {
                s.drop(DropReason::TraceBound, 1);
            }
        }
    }

    fn route<S: Sink>(&mut self, m: Mark, s: &mut Cx<'_, S>) {
        let rank = self.lane.rank;
        let (ids, n) = m.expert_ids();
        let layer = m.layer();
        s.emit(&Event::Route {
            rank,
            layer,
            ids: &ids[..n],
        });
        let at = self.last_ns;
        if self.step.as_ref().is_some_and(|st| st.collect) {
            let tr = &mut self.trace;
            if tr.expert_ids.len() + n > STEP_IDS_MAX {
                s.drop(DropReason::TraceBound, n as u64);
            } else {
                let from = tr.expert_ids.len();
                tr.expert_ids.extend_from_slice(&ids[..n]);
                let to = tr.expert_ids.len();
                match tr.routes.last_mut() {
                    Some(r) if m.is_continued() && r.layer == layer && r.ids.end == from => {
                        r.ids.end = to;
                    }
                    _ => tr.routes.push(Route {
                        layer,
                        ids: from..to,
                        at,
                    }),
                }
            }
        }
    }

    // The round parts: a draft/verify round and its phases.

    fn round_begin<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        if self.round.take().is_some() {
            // A round never ended: its phases are lost, counted.
            Self::unbalanced(s, 1);
        }
        let sampled = m.is_sampled() && s.hold.sampled;
        let collect = sampled || s.hold.every;
        // Its own parent marks (the engine's span at its begin), else the step's it
        // runs in: a round is in the trace of the step and request that ran it.
        let parent = self
            .parent
            .take()
            .or_else(|| self.step.as_ref().and(self.trace.parent));
        if self.in_replay != 0 {
            self.replay_rounds.push(m.round_seq());
        }
        self.round = Some(OpenRound {
            start: t,
            k: m.k(),
            round: RoundKey {
                round: RoundRef {
                    lane: self.lane.id,
                    seq: m.round_seq(),
                },
                replay: self.in_replay,
            },
            last: t,
            phases: [0; 5],
            ran: 0,
            sampled,
            trace: collect.then(|| RoundTrace {
                phases: Vec::new(),
                parent,
            }),
            batch: Vec::new(),
        });
    }

    fn phase<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        let (Some(r), Some(phase)) = (self.round.as_mut(), m.phase_of()) else {
            Self::unbalanced(s, 1);
            return;
        };
        let ns = t.saturating_sub(r.last);
        r.phases[phase as usize] += ns;
        r.ran |= 1 << phase as u8;
        if let Some(tr) = r.trace.as_mut() {
            tr.phases.push(Interval {
                what: phase,
                start: r.last,
                end: t,
            });
        }
        r.last = t;
    }

    fn round_end<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        let rank = self.lane.rank;
        let Some(mut round) = self.round.take() else {
            Self::unbalanced(s, 1);
            return;
        };
        // A round inside a step: the step's batch so far.
        take_batch(&mut round, &self.served);
        let accepted = m.accepted();
        if accepted.is_none() {
            Self::unbalanced(s, 1);
        }
        s.ended.push(EndedRound {
            round,
            end: t,
            accepted,
            rank,
        });
    }

    // The replay parts: a graph launch's captured boundaries, and the verify parts.

    fn replay_begin<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        if self.replay.take().is_some() {
            Self::unbalanced(s, 1);
        }
        self.replay = Some(OpenReplay {
            graph: m.graph(),
            seq: m.replay_seq(),
            start: t,
            sampled: m.is_sampled(),
        });
    }

    fn replay_end<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        let Some(r) = self
            .replay
            .take()
            .filter(|r| r.graph == m.graph() && r.seq == m.replay_seq())
        else {
            Self::unbalanced(s, 1);
            return;
        };
        self.replayed(&r, t, s);
    }

    fn part_begin<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        if self.parts_open.len() >= STACK_MAX {
            // The oldest open part never ended (its round is long gone): give it up.
            self.parts_open.remove(0);
            Self::unbalanced(s, 1);
        }
        let (Some(part), Some(round)) = (m.part(), self.part_round(m.round())) else {
            Self::unbalanced(s, 1);
            return;
        };
        self.parts_open.push(OpenPart {
            part,
            round,
            start: t,
        });
    }

    fn part_end<S: Sink>(&mut self, m: Mark, t: u64, s: &mut Cx<'_, S>) {
        let (part, round) = (m.part(), self.part_round(m.round()));
        let Some(pos) = self
            .parts_open
            .iter()
            .rposition(|b| Some(b.part) == part && Some(b.round) == round)
        else {
            Self::unbalanced(s, 1);
            return;
        };
        let open = self.parts_open.remove(pos);
        let acc = s.parts.entry(open.round).or_default();
        acc.ns[open.part as usize] += t.saturating_sub(open.start);
        acc.ran |= 1 << open.part as u8;
        if acc.intervals.len() < ROUND_PARTS_MAX {
            acc.intervals.push(Interval {
                what: open.part,
                start: open.start,
                end: t,
            });
        }
    }
}
