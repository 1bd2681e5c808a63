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
//!     after SETTLE_MAX)──> Event::Request
//! ```
//!
//! A request is keyed by the engine's id alone. Its share of a step is the step's duration
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

/// One `Serve` mark of a lane, gathered until its step ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Served {
    pub(crate) id: u64,
    pub(crate) tokens: u32,
    pub(crate) outputs: u32,
    pub(crate) drafted: u32,
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
}

impl Open {
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
        if r.traced.is_some() || !self.tracing {
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
        match self.open.get_mut(&id) {
            // Served on another lane before this begin was drained.
            Some(r) if r.home.is_none() && r.ended.is_none() => {
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
                self.insert(id, Open::new(class, Some(lane), t), out);
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
                self.insert(id, Open::new(class, Some(lane), t), out);
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
        self.open.insert(id, r);
        self.waiting += 1;
        true
    }

    /// The gauges and the traced count without a request that is forgotten.
    fn forget(&mut self, r: &Open) {
        if r.ended.is_none() {
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
            if !self.open.contains_key(&s.id) {
                // Perhaps begun on a lane not drained yet: kept one pass for its begin.
                let mut r = Open::new(0, None, start);
                r.orphan_since = Some(self.pass);
                r.orphan_lane = Some(lane);
                if !self.insert(s.id, r, out) {
                    continue;
                }
                self.orphans.push(s.id);
            }
            let Some(r) = self.open.get_mut(&s.id) else {
                unknown += 1;
                continue;
            };
            let tokens = u64::from(s.tokens.max(1));
            let share_ns = (u128::from(step_ns) * u128::from(tokens) / u128::from(total)) as u64;
            let wait_share_ns =
                (u128::from(wait_ns) * u128::from(tokens) / u128::from(total)) as u64;
            if let Some((_, w)) = r.wait_by_rank.iter_mut().find(|(k, _)| *k == rank) {
                *w += wait_share_ns;
            } else if r.wait_by_rank.len() < 64 {
                r.wait_by_rank.push((rank, wait_share_ns));
            }
            let prefill = r.first_token.is_none();
            let home = r.home.is_none_or(|h| h == lane);
            if home {
                if r.first_step.is_none() {
                    r.first_step = Some(start);
                    if r.ended.is_none() {
                        self.waiting = self.waiting.saturating_sub(1);
                        self.running += 1;
                    }
                }
                r.steps += 1;
                r.share_ns += share_ns;
                r.wait_share_ns += wait_share_ns;
                if r.first_token.is_none() {
                    r.input_tokens += u64::from(s.tokens);
                }
                if s.drafted > 0 {
                    r.drafted += u64::from(s.drafted);
                    r.accepted += u64::from(s.outputs.saturating_sub(1).min(s.drafted));
                }
                let before = r.outputs;
                r.outputs += u64::from(s.outputs);
                if before == 0 && r.outputs > 0 {
                    r.first_token = Some(end);
                    let ttft = end.saturating_sub(r.begin);
                    if self.ttft.decide(0, Kind::Request, ttft, end, false) == Verdict::Keep {
                        newly.push((s.id, TracedWhy::Tail));
                    }
                } else if before < TPOT_DECIDE_AFTER
                    && r.outputs >= TPOT_DECIDE_AFTER
                    && let Some(first) = r.first_token
                {
                    let tpot = end.saturating_sub(first) / (r.outputs - 1).max(1);
                    if self.tpot.decide(0, Kind::Request, tpot, end, false) == Verdict::Keep {
                        newly.push((s.id, TracedWhy::Tail));
                    }
                }
            }
            batch.push(BatchEntry {
                id: s.id,
                tokens: s.tokens,
                outputs: s.outputs,
                traced: false,
                share_ns,
                wait_share_ns,
                prefill,
            });
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
    pub(crate) fn end<S: Sink>(&mut self, id: u64, t: u64, finish: Finish, out: &mut S) {
        let Some(r) = self.open.get_mut(&id) else {
            out.on(&Event::Dropped {
                reason: DropReason::Unbalanced,
                n: 1,
            });
            return;
        };
        if r.ended.is_some() {
            out.on(&Event::Dropped {
                reason: DropReason::Unbalanced,
                n: 1,
            });
            return;
        }
        r.ended = Some((t, finish));
        r.ended_seen = crate::timing::now_ns();
        if r.first_step.is_some() {
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
        let now = crate::timing::now_ns();
        let max = self.settle_max_ns;
        let (ready, wait): (Vec<u64>, Vec<u64>) = std::mem::take(&mut self.ended_prev)
            .into_iter()
            .partition(|id| match self.open.get(id) {
                Some(r) => match r.ended {
                    Some((end, _)) => end < settled || now.saturating_sub(r.ended_seen) >= max,
                    None => true,
                },
                None => true,
            });
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

    /// Delivers every ended request now (flush, shutdown).
    pub(crate) fn flush<S: Sink>(&mut self, out: &mut S) {
        let mut ids = std::mem::take(&mut self.ended_prev);
        ids.append(&mut self.ended_now);
        self.finalize(ids, out);
    }

    fn finalize<S: Sink>(&mut self, ids: Vec<u64>, out: &mut S) {
        for id in ids {
            let Some(r) = self.open.remove(&id) else {
                continue;
            };
            let Some((end, finish)) = r.ended else {
                continue;
            };
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
