//! The open requests: what the worker keeps of each request between its begin and its end,
//! fed by pairing (begin and end marks, and each step's batch), delivered as events.
//!
//! ```text
//! RequestBegin ──> Requests::begin ──(head-sampled)──> Event::RequestTraced
//! StepEnd + the lane's Serve marks ──> Requests::step: queue time ends, first token, shares of
//!     the step's time and waits (by tokens), tail decisions (TTFT at the first token, TPOT
//!     after TPOT_DECIDE_AFTER output tokens) ──> Event::RequestTraced, then the step's batch
//! RequestEnd ──> Requests::end ──(settled: a pass later, once no lane has a step or round
//!     begun before the end still open or unresolved, so every rank's last steps are in; or
//!     after SETTLE_MAX; at a flush the same, a shutdown delivers all)──> Event::Request
//! Sequence ──> Requests::sequence: a sequence id served as its request (n > 1, beams); the
//!     request ends with its last sequence
//! ```
//!
//! A request is keyed by the engine's id alone. A second end is counted under
//! `reason="ended_twice"` (the last [`RECENT_MAX`] ids delivered are remembered for that); an
//! internal request (warm-up, health) is kept like any other and delivered to no sink, counted. Its share of a step is the step's duration
//! times its tokens in the step over the batch's tokens; the step shares (and the tokens) are
//! counted on the lane that began it, the waits on every rank that served it. Bounded: at most
//! [`OPEN_MAX`] open requests and [`BATCH_MAX`] requests a step; beyond, counted under
//! `reason="request_bound"`.

use super::event::{BatchEntry, Event, Request, Sink, TracedRequest, TracedWhy};
use super::sinks::spans::tail::{Kind, Tail, Verdict};
use crate::names::DropReason;
use crate::record::{Finish, RequestKind, Shared};
use crate::vocab::Phase;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Most requests open at once.
pub(crate) const OPEN_MAX: usize = 1 << 16;
/// Most requests one step serves (its batch).
pub(crate) const BATCH_MAX: usize = 4096;
/// Most traced requests open at once (each holds a span open on the span sink).
pub(crate) const TRACED_MAX: usize = 1024;
/// The time per output token is judged for the tail after this many output tokens.
pub(crate) const TPOT_DECIDE_AFTER: u64 = 8;
/// Longest an ended request waits for the other ranks' steps that served it (a rank stuck in
/// a step longer than this is a hang, shown by `phasetrace.step.open_duration`); its steps
/// that end later are counted under `reason="unbalanced"`.
pub(crate) const SETTLE_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Most ids of finalized requests remembered, so that a later end of one is counted as
/// `reason="ended_twice"` (not `unbalanced`).
pub(crate) const RECENT_MAX: usize = 4096;

/// One `Serve` mark of a lane, gathered until its step ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Served {
    pub(crate) id: u64,
    pub(crate) tokens: u32,
    pub(crate) outputs: u32,
    pub(crate) drafted: u32,
    /// The drafts accepted (speculative decoding: as the engine gave them).
    pub(crate) accepted: u32,
}

/// A request's share of a step's time and of its waits (by its tokens over the batch's).
#[derive(Clone, Copy)]
struct Share {
    step: u64,
    wait: u64,
}

/// The queue and the running requests, for the gauges (read at each collection).
#[derive(Debug, Default)]
pub(crate) struct RequestGauges {
    pub(crate) waiting: AtomicU64,
    pub(crate) running: AtomicU64,
}

struct Open {
    class: u16,
    /// The lane that began it (`None`: served before its begin was seen).
    home: Option<u16>,
    begin: u64,
    first_step: Option<u64>,
    first_token: Option<u64>,
    input_tokens: u64,
    outputs: u64,
    drafted: u64,
    accepted: u64,
    steps: u64,
    share_ns: u64,
    wait_share_ns: u64,
    wait_by_rank: Vec<(u32, u64)>,
    traced: Option<TracedWhy>,
    steps_untraced: u64,
    phase_share_ns: Option<[u64; Phase::ALL.len()]>,
    /// Ended at this time, finalized once settled ([`Requests::pass_done`]).
    ended: Option<(u64, Finish)>,
    /// When its end was processed, by [`crate::timing::now_ns`] (bounds the settling).
    ended_seen: u64,
    /// The pass in which it was first seen without its begin.
    orphan_since: Option<u64>,
    /// The lane that served it before its begin was seen: its figures stand for the home
    /// lane's only until the begin names another.
    orphan_lane: Option<u16>,
    /// Of an internal kind ([`RequestKind::internal`]): in no request figure.
    internal: bool,
    /// Its sequences still running ([`Requests::sequence`]); it ends with the last.
    sequences: Vec<u64>,
}

impl Open {
    fn internal(mut self, internal: bool) -> Open {
        self.internal = internal;
        self
    }

    fn new(class: u16, home: Option<u16>, begin: u64) -> Open {
        Open {
            class,
            home,
            begin,
            first_step: None,
            first_token: None,
            input_tokens: 0,
            outputs: 0,
            drafted: 0,
            accepted: 0,
            steps: 0,
            share_ns: 0,
            wait_share_ns: 0,
            wait_by_rank: Vec::new(),
            traced: None,
            steps_untraced: 0,
            phase_share_ns: None,
            ended: None,
            ended_seen: 0,
            orphan_since: None,
            orphan_lane: None,
            internal: false,
            sequences: Vec::new(),
        }
    }
}

/// The open requests of one profiler.
pub(crate) struct Requests {
    shared: Arc<Shared>,
    open: HashMap<u64, Open>,
    /// Ids ended in an earlier pass, finalized once settled; and in this pass.
    ended_prev: Vec<u64>,
    ended_now: Vec<u64>,
    /// Requests seen served before their begin, by pass.
    orphans: Vec<u64>,
    pass: u64,
    traced_open: usize,
    /// Whether there is a tracer at all (else nothing is traced).
    tracing: bool,
    ttft: Tail,
    tpot: Tail,
    gauges: Arc<RequestGauges>,
    waiting: u64,
    running: u64,
    /// [`SETTLE_MAX`], shorter in tests.
    settle_max_ns: u64,
    /// The ids of the last [`RECENT_MAX`] requests finalized, oldest first, and as a set.
    recent: std::collections::VecDeque<u64>,
    recent_set: std::collections::HashSet<u64>,
    /// Internal requests delivered (counted, in no figure).
    internal_done: u64,
    /// The sequences of requests with several (`n > 1`, beams): sequence id to request id.
    aliases: HashMap<u64, u64>,
}

impl Requests {
    pub(crate) fn new(
        shared: Arc<Shared>,
        tracing: bool,
        ttft: Tail,
        tpot: Tail,
        gauges: Arc<RequestGauges>,
    ) -> Requests {
        Requests {
            shared,
            open: HashMap::new(),
            ended_prev: Vec::new(),
            ended_now: Vec::new(),
            orphans: Vec::new(),
            pass: 0,
            traced_open: 0,
            tracing,
            ttft,
            tpot,
            gauges,
            waiting: 0,
            running: 0,
            settle_max_ns: SETTLE_MAX.as_nanos() as u64,
            recent: Default::default(),
            recent_set: Default::default(),
            internal_done: 0,
            aliases: HashMap::new(),
        }
    }

    /// Another bound on settling (tests).
    #[cfg(test)]
    pub(crate) fn set_settle_max(&mut self, max: std::time::Duration) {
        self.settle_max_ns = max.as_nanos() as u64;
    }

    /// The requests of a test pipeline: no tail rules.
    #[cfg(test)]
    pub(crate) fn for_tests(shared: Arc<Shared>, tracing: bool) -> Requests {
        use crate::config::TraceSlowerThan;
        Requests::new(
            shared,
            tracing,
            Tail::new(TraceSlowerThan::Off, 1),
            Tail::new(TraceSlowerThan::Off, 1),
            Arc::default(),
        )
    }

    /// Whether a traced request is open: pairing then holds each step's trace.
    pub(crate) fn any_traced(&self) -> bool {
        self.traced_open > 0
    }

    fn kind(&self, class: u16) -> Arc<RequestKind> {
        self.shared
            .kinds
            .get(class)
            .unwrap_or_else(|| Arc::new(RequestKind::new("_OTHER", "_OTHER", "_OTHER")))
    }

    fn publish(&self) {
        self.gauges.waiting.store(self.waiting, Relaxed);
        self.gauges.running.store(self.running, Relaxed);
    }

    /// Marks `id` traced for `why`, unless too many are: the span sink starts its span.
    fn trace<S: Sink>(&mut self, id: u64, why: TracedWhy, out: &mut S) {
        let Some(r) = self.open.get(&id) else {
            return;
        };
        if r.traced.is_some() || !self.tracing || r.internal {
            return;
        }
        if self.traced_open >= TRACED_MAX {
            out.on(&Event::Dropped {
                reason: DropReason::TraceBound,
                n: 1,
            });
            return;
        }
        let (class, begin) = (r.class, r.begin);
        let kind = self.kind(class);
        if let Some(r) = self.open.get_mut(&id) {
            r.traced = Some(why);
        }
        self.traced_open += 1;
        out.on(&Event::RequestTraced(&TracedRequest {
            id,
            kind,
            begin,
            why,
        }));
    }

    /// Request `id` of `class` arrived at `t` on lane `lane`.
    pub(crate) fn begin<S: Sink>(
        &mut self,
        id: u64,
        class: u16,
        t: u64,
        sampled: bool,
        lane: u16,
        out: &mut S,
    ) {
        if self.recent_set.remove(&id) {
            self.recent.retain(|r| *r != id);
        }
        let internal = self.kind(class).internal;
        match self.open.get_mut(&id) {
            // Served on another lane before this begin was drained.
            Some(r) if r.home.is_none() && r.ended.is_none() => {
                if internal {
                    // Counted in the gauges while its kind was unknown.
                    if r.first_step.is_some() {
                        self.running = self.running.saturating_sub(1);
                    } else {
                        self.waiting = self.waiting.saturating_sub(1);
                    }
                    r.internal = true;
                }
                r.home = Some(lane);
                r.class = class;
                r.begin = t;
                r.orphan_since = None;
                if r.orphan_lane.take().is_some_and(|l| l != lane) {
                    // Another rank's steps were counted as the home lane's: the home lane
                    // counts its own (the shares and tokens once, not once per rank).
                    r.steps = 0;
                    r.share_ns = 0;
                    r.wait_share_ns = 0;
                    r.input_tokens = 0;
                    r.outputs = 0;
                    r.drafted = 0;
                    r.accepted = 0;
                    r.first_token = None;
                    r.phase_share_ns = None;
                }
            }
            None => {
                self.insert(id, Open::new(class, Some(lane), t).internal(internal), out);
            }
            Some(_) => {
                // The id is reused while open: the old request never ended (counted).
                if let Some(old) = self.open.remove(&id) {
                    self.forget(&old);
                }
                out.on(&Event::Dropped {
                    reason: DropReason::Unbalanced,
                    n: 1,
                });
                self.insert(id, Open::new(class, Some(lane), t).internal(internal), out);
            }
        }
        if sampled {
            self.trace(id, TracedWhy::Head, out);
        }
        self.publish();
    }

    fn insert<S: Sink>(&mut self, id: u64, r: Open, out: &mut S) -> bool {
        if self.open.len() >= OPEN_MAX {
            out.on(&Event::Dropped {
                reason: DropReason::RequestBound,
                n: 1,
            });
            return false;
        }
        if !r.internal {
            self.waiting += 1;
        }
        self.open.insert(id, r);
        true
    }

    /// The gauges and the traced count without a request that is forgotten.
    fn forget(&mut self, r: &Open) {
        for seq in &r.sequences {
            self.aliases.remove(seq);
        }
        if r.ended.is_none() && !r.internal {
            if r.first_step.is_some() {
                self.running = self.running.saturating_sub(1);
            } else {
                self.waiting = self.waiting.saturating_sub(1);
            }
        }
        if r.traced.is_some() {
            self.traced_open = self.traced_open.saturating_sub(1);
        }
    }

    /// A step of `rank` on `lane` ran from `start` to `end` with `wait_ns` at rendezvous and
    /// served `served`: fills `batch` for the step event (emitting the requests it made
    /// traced first).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn step<S: Sink>(
        &mut self,
        rank: u32,
        lane: u16,
        start: u64,
        end: u64,
        wait_ns: u64,
        served: &[Served],
        batch: &mut Vec<BatchEntry>,
        out: &mut S,
    ) {
        batch.clear();
        if served.is_empty() {
            return;
        }
        let step_ns = end.saturating_sub(start);
        let total: u64 = served.iter().map(|s| u64::from(s.tokens.max(1))).sum();
        let mut unknown = 0;
        let mut newly: Vec<(u64, TracedWhy)> = Vec::new();
        for s in served {
            // A sequence of a request with several is served as its request.
            let aliased = self.aliases.get(&s.id).copied();
            let id = aliased.unwrap_or(s.id);
            if !self.open.contains_key(&id) {
                // Perhaps begun on a lane not drained yet: kept one pass for its begin.
                let mut r = Open::new(0, None, start);
                r.orphan_since = Some(self.pass);
                r.orphan_lane = Some(lane);
                if !self.insert(id, r, out) {
                    continue;
                }
                self.orphans.push(id);
            }
            let tokens = u64::from(s.tokens.max(1));
            let share = Share {
                step: (u128::from(step_ns) * u128::from(tokens) / u128::from(total)) as u64,
                wait: (u128::from(wait_ns) * u128::from(tokens) / u128::from(total)) as u64,
            };
            // Another sequence of the same request already in this step's batch.
            let merged = aliased.is_some() && batch.iter().any(|b| b.id == id);
            // Prefill up to and including the step that gives the request its first token
            // (read before this step credits it).
            let prefill = self.open.get(&id).is_none_or(|r| r.first_token.is_none());
            let Some(internal) =
                self.credit(id, s, rank, lane, (start, end), share, merged, &mut newly)
            else {
                unknown += 1;
                continue;
            };
            if internal {
                continue;
            }
            match batch.iter_mut().find(|b| merged && b.id == id) {
                Some(b) => {
                    b.tokens = b.tokens.saturating_add(s.tokens);
                    b.outputs = b.outputs.saturating_add(s.outputs);
                    b.share_ns += share.step;
                    b.wait_share_ns += share.wait;
                }
                None => batch.push(BatchEntry {
                    id,
                    tokens: s.tokens,
                    outputs: s.outputs,
                    traced: false,
                    share_ns: share.step,
                    wait_share_ns: share.wait,
                    prefill,
                }),
            }
        }
        for (id, why) in newly {
            self.trace(id, why, out);
        }
        // Counted on every rank: a step of another rank that served it before its begin was
        // seen (drained later) has no `request.step` span either.
        for b in batch.iter_mut() {
            if let Some(r) = self.open.get_mut(&b.id) {
                b.traced = r.traced.is_some();
                if !b.traced {
                    r.steps_untraced += 1;
                }
            }
        }
        if unknown > 0 {
            out.on(&Event::Dropped {
                reason: DropReason::Unbalanced,
                n: unknown,
            });
        }
        self.publish();
    }

    /// Credits request `id` with `s`, served in a step of `rank` on `lane` over `span`
    /// (start, end), and its `share` of the step; `merged`: another of its sequences was
    /// credited for this step already (the step is counted once). Pushes the requests that the
    /// tail rules make traced to `newly`. `Some(internal)`, or `None` when `id` is not open.
    #[allow(clippy::too_many_arguments)]
    fn credit(
        &mut self,
        id: u64,
        s: &Served,
        rank: u32,
        lane: u16,
        (start, end): (u64, u64),
        share: Share,
        merged: bool,
        newly: &mut Vec<(u64, TracedWhy)>,
    ) -> Option<bool> {
        let r = self.open.get_mut(&id)?;
        if let Some((_, w)) = r.wait_by_rank.iter_mut().find(|(k, _)| *k == rank) {
            *w += share.wait;
        } else if r.wait_by_rank.len() < 64 {
            r.wait_by_rank.push((rank, share.wait));
        }
        if r.home.is_some_and(|h| h != lane) {
            return Some(r.internal);
        }
        if r.first_step.is_none() {
            r.first_step = Some(start);
            if r.ended.is_none() && !r.internal {
                self.waiting = self.waiting.saturating_sub(1);
                self.running += 1;
            }
        }
        if !merged {
            r.steps += 1;
        }
        r.share_ns += share.step;
        r.wait_share_ns += share.wait;
        if r.first_token.is_none() {
            r.input_tokens += u64::from(s.tokens);
        }
        if s.drafted > 0 {
            r.drafted += u64::from(s.drafted);
            r.accepted += u64::from(s.accepted.min(s.drafted));
        }
        let before = r.outputs;
        r.outputs += u64::from(s.outputs);
        if r.internal {
            return Some(true);
        }
        if before == 0 && r.outputs > 0 {
            r.first_token = Some(end);
            let ttft = end.saturating_sub(r.begin);
            if self.ttft.decide(0, Kind::Request, ttft, end, false) == Verdict::Keep {
                newly.push((id, TracedWhy::Tail));
            }
        } else if before < TPOT_DECIDE_AFTER
            && r.outputs >= TPOT_DECIDE_AFTER
            && let Some(first) = r.first_token
        {
            let tpot = end.saturating_sub(first) / (r.outputs - 1).max(1);
            if self.tpot.decide(0, Kind::Request, tpot, end, false) == Verdict::Keep {
                newly.push((id, TracedWhy::Tail));
            }
        }
        Some(false)
    }

    /// A round of `lane` that overlapped a step serving `batch` (id, tokens) ended with
    /// `phases`: each request begun on that lane gets its share of every phase, by its tokens.
    pub(crate) fn round(
        &mut self,
        lane: u16,
        batch: &[(u64, u32)],
        phases: &[u64; Phase::ALL.len()],
    ) {
        let total: u64 = batch.iter().map(|(_, t)| u64::from((*t).max(1))).sum();
        if total == 0 {
            return;
        }
        for (id, tokens) in batch {
            let id = self.aliases.get(id).unwrap_or(id);
            let Some(r) = self.open.get_mut(id) else {
                continue;
            };
            if r.home.is_some_and(|h| h != lane) {
                continue;
            }
            let share = r.phase_share_ns.get_or_insert([0; Phase::ALL.len()]);
            for (acc, ns) in share.iter_mut().zip(phases) {
                *acc += (u128::from(*ns) * u128::from((*tokens).max(1)) / u128::from(total)) as u64;
            }
        }
    }

    /// Request `id` ended at `t`: finalized at the end of the next pass.
    /// Sequence `seq` belongs to request `request` (an API request with several choices,
    /// `n > 1`, or beams): the steps that serve `seq` serve the request, and the request ends
    /// with its last sequence (or its own end). A request not open, or `seq` already a
    /// sequence or an open request, is counted under `reason="unbalanced"`.
    pub(crate) fn sequence<S: Sink>(&mut self, seq: u64, request: u64, out: &mut S) {
        let free = seq != request
            && !self.aliases.contains_key(&seq)
            && !self.open.contains_key(&seq)
            && !self.aliases.contains_key(&request);
        let Some(r) = self
            .open
            .get_mut(&request)
            .filter(|r| r.ended.is_none() && free)
        else {
            out.on(&Event::Dropped {
                reason: DropReason::Unbalanced,
                n: 1,
            });
            return;
        };
        if self.aliases.len() >= OPEN_MAX || r.sequences.len() >= BATCH_MAX {
            out.on(&Event::Dropped {
                reason: DropReason::RequestBound,
                n: 1,
            });
            return;
        }
        r.sequences.push(seq);
        self.aliases.insert(seq, request);
    }

    /// Internal requests delivered so far (counted, in no figure).
    pub(crate) fn internal_done(&self) -> u64 {
        self.internal_done
    }

    /// A second end (of a request ended and not yet delivered, or delivered among the last
    /// [`RECENT_MAX`]) is ignored and counted under `reason="ended_twice"`; an end of a request
    /// never begun under `reason="unbalanced"`.
    pub(crate) fn end<S: Sink>(&mut self, id: u64, t: u64, finish: Finish, out: &mut S) {
        if let Some(request) = self.aliases.remove(&id) {
            // A sequence ended: its request ends with its last sequence.
            let Some(r) = self.open.get_mut(&request) else {
                return;
            };
            r.sequences.retain(|s| *s != id);
            if r.ended.is_some() {
                out.on(&Event::Dropped {
                    reason: DropReason::EndedTwice,
                    n: 1,
                });
            }
            if !r.sequences.is_empty() || r.ended.is_some() {
                return;
            }
            return self.end(request, t, finish, out);
        }
        let Some(r) = self.open.get_mut(&id) else {
            let reason = if self.recent_set.contains(&id) {
                DropReason::EndedTwice
            } else {
                DropReason::Unbalanced
            };
            out.on(&Event::Dropped { reason, n: 1 });
            return;
        };
        if r.ended.is_some() {
            out.on(&Event::Dropped {
                reason: DropReason::EndedTwice,
                n: 1,
            });
            return;
        }
        r.ended = Some((t, finish));
        r.ended_seen = crate::timing::now_ns();
        if r.internal {
            // In no gauge.
        } else if r.first_step.is_some() {
            self.running = self.running.saturating_sub(1);
        } else {
            self.waiting = self.waiting.saturating_sub(1);
        }
        self.ended_now.push(id);
        self.publish();
    }

    /// The end of a pass in which every lane was drained: the requests ended in an earlier
    /// pass are delivered once settled, that is when they ended before `settled` (no lane has
    /// a step begun earlier still open, or marks from earlier unresolved: every rank's steps
    /// that served them are in) or [`SETTLE_MAX`] ago; those served without a begin since the
    /// previous pass are given up (counted).
    pub(crate) fn pass_done<S: Sink>(&mut self, settled: u64, out: &mut S) {
        let prev = std::mem::take(&mut self.ended_prev);
        let (ready, wait) = self.settled(prev, settled);
        self.finalize(ready, out);
        self.ended_prev = wait;
        self.ended_prev.append(&mut self.ended_now);
        let pass = self.pass;
        let mut gone = 0;
        let orphans = std::mem::take(&mut self.orphans);
        for id in orphans {
            match self.open.get(&id) {
                Some(r) if r.home.is_none() && r.orphan_since.is_some_and(|p| p < pass) => {
                    if let Some(r) = self.open.remove(&id) {
                        self.forget(&r);
                    }
                    gone += 1;
                }
                Some(r) if r.home.is_none() => self.orphans.push(id),
                _ => {}
            }
        }
        if gone > 0 {
            out.on(&Event::Dropped {
                reason: DropReason::Unbalanced,
                n: gone,
            });
            self.publish();
        }
        self.pass += 1;
    }

    /// Splits `ids` (ended requests) into those settled (ended before `settled`, or ended
    /// [`SETTLE_MAX`] ago, or gone) and those still waiting for a step that served them.
    fn settled(&self, ids: Vec<u64>, settled: u64) -> (Vec<u64>, Vec<u64>) {
        let now = crate::timing::now_ns();
        let max = self.settle_max_ns;
        ids.into_iter().partition(|id| match self.open.get(id) {
            Some(r) => match r.ended {
                Some((end, _)) => end < settled || now.saturating_sub(r.ended_seen) >= max,
                None => true,
            },
            None => true,
        })
    }

    /// Delivers the ended requests that are settled (at flush): a request that ended inside a
    /// step still open (a client given its last token flushes before the engine ends that
    /// step) waits for that step, whose tokens are its own, and is delivered at the pass that
    /// sees it end. `closing` (shutdown): every ended request now, and the requests never
    /// ended counted under `reason="open_at_shutdown"`.
    pub(crate) fn flush<S: Sink>(&mut self, settled: u64, closing: bool, out: &mut S) {
        let mut ids = std::mem::take(&mut self.ended_prev);
        ids.append(&mut self.ended_now);
        if closing {
            self.finalize(ids, out);
            let open = self.open.len() as u64;
            self.open.clear();
            self.orphans.clear();
            self.aliases.clear();
            (self.waiting, self.running) = (0, 0);
            self.publish();
            if open > 0 {
                out.on(&Event::Dropped {
                    reason: DropReason::OpenAtShutdown,
                    n: open,
                });
            }
            return;
        }
        let (ready, wait) = self.settled(ids, settled);
        self.finalize(ready, out);
        self.ended_prev = wait;
    }

    /// Remembers `id` as finalized, forgetting the oldest beyond [`RECENT_MAX`].
    fn remember(&mut self, id: u64) {
        if self.recent_set.insert(id) {
            self.recent.push_back(id);
        }
        while self.recent.len() > RECENT_MAX {
            if let Some(old) = self.recent.pop_front() {
                self.recent_set.remove(&old);
            }
        }
    }

    fn finalize<S: Sink>(&mut self, ids: Vec<u64>, out: &mut S) {
        for id in ids {
            let Some(r) = self.open.remove(&id) else {
                continue;
            };
            let Some((end, finish)) = r.ended else {
                continue;
            };
            self.remember(id);
            for seq in &r.sequences {
                // Ended after their request: a later end is counted as ended twice.
                self.aliases.remove(seq);
                self.remember(*seq);
            }
            if r.internal {
                self.internal_done += 1;
                continue;
            }
            if r.traced.is_some() {
                self.traced_open = self.traced_open.saturating_sub(1);
            }
            let kind = self.kind(r.class);
            let req = Request {
                id,
                kind,
                finish,
                begin: r.begin,
                end,
                first_step: r.first_step,
                first_token: r.first_token,
                input_tokens: r.input_tokens,
                outputs: r.outputs,
                drafted: r.drafted,
                accepted: r.accepted,
                steps: r.steps,
                share_ns: r.share_ns,
                wait_share_ns: r.wait_share_ns,
                wait_by_rank: r.wait_by_rank,
                steps_untraced: r.steps_untraced,
                phase_share_ns: r.phase_share_ns,
            };
            if let Some(tpot) = req.tpot_ns()
                && req.outputs < TPOT_DECIDE_AFTER
            {
                // Too short to have been judged while it ran: judged now, for the window.
                let _ = self.tpot.decide(0, Kind::Request, tpot, end, true);
            }
            out.on(&Event::Request(&req));
        }
    }
}
