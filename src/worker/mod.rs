//! The background worker: drain buffers, resolve times, pair marks, aggregate, build spans.
//!
//! ```text
//! lanes ──drain──> LaneState (resolve tokens in order, pair begin/end, hold the open step)
//!                     ├──> LaneSeries (attribute sets built once) ─┬─> Instruments (SDK
//!                     │                                             │   histograms, counters)
//!                     │                                             └─> LayerTotals (per-layer
//!                     │                                                 cells, no locks)
//!                     ├──> at the end of each drain: OpenSteps (when the open step began, or
//!                     │    since when the oldest mark is pending: one cell a lane, no locks)
//!                     ├──> at a step's end: Tail (sampled one in N? slower than the
//!                     │    threshold, within the rank's budget?) ──> spans ──> exemplars
//!                     └──> Tally ──> console summary
//! ```
//!
//! The pipeline sits behind a mutex that only the worker thread and explicit
//! [`crate::Profiler::flush`] calls take; the hot path never touches it.

pub(crate) mod aggregate;
mod attrs;
pub(crate) mod experts;
pub(crate) mod layers;
pub(crate) mod open;
mod pair;
mod replay;
pub(crate) mod series;
pub(crate) mod spans;
pub(crate) mod tail;

pub use pair::{Dropped, Stats};

use crate::config::SpecLevel;
use crate::names::DropReason;
use crate::record::Shared;
use crate::vocab::{Phase, Section};
use aggregate::{Instruments, SpecTally, Tally, VerifySplit};
use opentelemetry::global::BoxedTracer;
use pair::{EndedRound, LaneState, PartsAcc, RoundKey, Sinks, count_drop};
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How far idle passes stretch the drain interval (1 ms -> 16 ms by default).
const IDLE_BACKOFF: u32 = 16;
/// How much sooner the worker polls while a graph replay waits to be read (1 ms -> 100 µs).
const REPLAY_SPEEDUP: u32 = 10;

/// Most rounds with verify parts awaiting their round's end; beyond, they are given up and
/// counted (bounded memory).
const PARTS_MAX: usize = 65_536;

pub(crate) struct Pipeline {
    shared: Arc<Shared>,
    lanes: Vec<LaneState>,
    inst: Vec<Instruments>,
    /// The per-layer totals every provider's instruments read.
    layers: Arc<layers::LayerTotals>,
    /// Each lane's open step, which every provider's open-duration gauge reads.
    open: Arc<open::OpenSteps>,
    tracer: Option<Arc<BoxedTracer>>,
    tally: Tally,
    spec: SpecTally,
    stats: Stats,
    parts: HashMap<RoundKey, PartsAcc>,
    /// Rounds ended in the previous pass, finalized in this one.
    ended_prev: Vec<EndedRound>,
    ended_now: Vec<EndedRound>,
    summary_every: u64,
    spec_summary_every: u64,
    next_summary: u64,
    experts: experts::ExpertWriter,
    span_counts: Arc<crate::export::SpanCounts>,
    span_failed_seen: u64,
    /// A lane waits for a graph replay's end fence (see [`pair::LaneState::awaiting_replay`]).
    awaiting_replay: bool,
    /// `group` on every span.
    group: opentelemetry::KeyValue,
    tail: tail::Tail,
    exemplars: Option<Arc<crate::export::ExemplarStore>>,
}

impl Pipeline {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        shared: Arc<Shared>,
        inst: Vec<Instruments>,
        layers: Arc<layers::LayerTotals>,
        open: Arc<open::OpenSteps>,
        tracer: Option<Arc<BoxedTracer>>,
        summary_every: u64,
        spec_summary_every: u64,
        span_counts: Arc<crate::export::SpanCounts>,
        tail: tail::Tail,
        exemplars: Option<Arc<crate::export::ExemplarStore>>,
    ) -> Pipeline {
        let experts = experts::ExpertWriter::new(shared.experts.clone());
        Pipeline {
            shared,
            lanes: Vec::new(),
            inst,
            tracer,
            tally: Tally::default(),
            spec: SpecTally::default(),
            stats: Stats::default(),
            parts: HashMap::new(),
            ended_prev: Vec::new(),
            ended_now: Vec::new(),
            summary_every,
            spec_summary_every,
            next_summary: summary_every,
            experts,
            span_counts,
            span_failed_seen: 0,
            awaiting_replay: false,
            group: layers.group().clone(),
            layers,
            open,
            tail,
            exemplars,
        }
    }

    /// One pass: adopt new lanes, drain each, finalize rounds ended in the previous pass.
    pub(crate) fn pass(&mut self) {
        crate::timing::maintain();
        {
            let lanes = self.shared.lanes.lock().unwrap_or_else(|p| p.into_inner());
            for l in lanes.iter() {
                if !self.lanes.iter().any(|s| Arc::ptr_eq(&s.lane, l)) {
                    self.lanes
                        .push(LaneState::new(l.clone(), &self.layers, &self.open));
                }
            }
        }
        let mut sinks = Sinks {
            inst: &self.inst,
            tracer: self.tracer.as_deref(),
            tally: &mut self.tally,
            stats: &mut self.stats,
            parts: &mut self.parts,
            ended: &mut self.ended_now,
            experts: &mut self.experts,
            span_counts: &self.span_counts,
            graphs: &self.shared.graphs,
            group: &self.group,
            tail: &mut self.tail,
            exemplars: self.exemplars.as_deref(),
        };
        self.awaiting_replay = false;
        for lane in &mut self.lanes {
            lane.drain(&mut sinks);
            lane.collect_drops(&mut sinks);
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
        let ready = std::mem::take(&mut self.ended_prev);
        for r in ready {
            self.finalize_round(r);
        }
        self.ended_prev = std::mem::take(&mut self.ended_now);
        if self.parts.len() > PARTS_MAX {
            let n = self.parts.len() as u64;
            self.parts.clear();
            count_drop(&mut self.stats, &self.inst, DropReason::Unbalanced, n);
        }
        let failed = self.span_counts.failed.load(Ordering::Relaxed);
        if failed > self.span_failed_seen {
            let n = failed - self.span_failed_seen;
            count_drop(&mut self.stats, &self.inst, DropReason::SpanExport, n);
            self.span_failed_seen = failed;
        }
        self.stats.spans_exported = self.span_counts.exported.load(Ordering::Relaxed);
        self.stats.spans_failed = failed;
        self.maybe_print_summary();
    }

    /// Finalizes everything, including rounds ended in this very pass (used at flush/shutdown).
    pub(crate) fn flush(&mut self) {
        self.pass();
        let ready = std::mem::take(&mut self.ended_prev);
        for r in ready {
            self.finalize_round(r);
        }
    }

    fn finalize_round(&mut self, r: EndedRound) {
        let rank = r.rank;
        let parts = self.parts.remove(&r.round.round);
        let split_on = self.shared.spec_level.load() == SpecLevel::VerifySplit;
        for inst in &self.inst {
            for p in Phase::ALL {
                let ns = r.round.phases[p as usize];
                // A phase that never ran in this round is not a zero-length phase.
                if ns > 0 || r.round.ran & (1 << p as u8) != 0 {
                    inst.phase(p, rank, ns as f64 * 1e-9);
                }
            }
            inst.round(rank, r.round.k, r.accepted);
        }
        let verify = r.round.phases[Phase::Verify as usize];
        let mut split = VerifySplit::default();
        if split_on {
            split = VerifySplit::of(verify, &parts.as_ref().map_or([0; 4], |p| p.ns));
            for inst in &self.inst {
                for (name, v) in split.by_name() {
                    inst.part(name, rank, v as f64 * 1e-9);
                }
            }
        }
        self.stats.rounds += 1;
        let sp = &mut self.spec;
        sp.add(r.round.k, &r.round.phases, &split);
        // Held rounds are traced when sampled, or slow within the rank's budget.
        let why = match r.round.trace.as_ref() {
            None => None,
            Some(_) => {
                let ns = r.end.saturating_sub(r.round.start);
                let verdict = self
                    .tail
                    .decide(rank, tail::Kind::Round, ns, r.end, r.round.sampled);
                if verdict == tail::Verdict::OverBudget {
                    count_drop(&mut self.stats, &self.inst, DropReason::TailBudget, 1);
                }
                match (r.round.sampled, verdict) {
                    (true, _) => Some(spans::Why::Head),
                    (false, tail::Verdict::Keep) => Some(spans::Why::Tail),
                    _ => None,
                }
            }
        };
        let round_spans = r.round.trace.as_ref().map_or(0, |t| {
            1 + t.phases.len() + parts.as_ref().map_or(0, |p| p.intervals.len())
        });
        let fits = why.is_some() && pair::span_budget(&self.stats, &self.span_counts, round_spans);
        if !fits && why.is_some() {
            count_drop(
                &mut self.stats,
                &self.inst,
                DropReason::SpanQueue,
                round_spans as u64,
            );
        }
        if let (true, Some(why), Some(trace), Some(tracer)) =
            (fits, why, r.round.trace.as_ref(), self.tracer.as_deref())
        {
            if why == spans::Why::Tail {
                self.stats.tail_traces += 1;
            }
            let mut parts = parts.map(|p| p.intervals).unwrap_or_default();
            parts.sort_by_key(|p| p.start);
            self.stats.spans += spans::build_round(
                tracer,
                &spans::RoundSpans {
                    phases: &trace.phases,
                    parts: &parts,
                    rank,
                    k: r.round.k,
                    accepted: r.accepted,
                    start: r.round.start,
                    end: r.end,
                    group: &self.group,
                    why,
                },
            ) as u64;
        }
        let sp = &mut self.spec;
        if self.spec_summary_every > 0 && sp.rounds >= self.spec_summary_every {
            let line = spec_lines(sp, split_on);
            let _ = std::io::stderr().write_all(line.as_bytes());
            *sp = SpecTally::default();
        }
    }

    fn maybe_print_summary(&mut self) {
        if self.summary_every == 0 || self.tally.steps < self.next_summary {
            return;
        }
        let ranks = self.tally.ranks.len().max(1) as u64;
        while self.next_summary <= self.tally.steps {
            self.next_summary += self.summary_every * ranks;
        }
        let text = summary_table(&self.tally);
        let _ = std::io::stderr().write_all(text.as_bytes());
    }

    pub(crate) fn stats(&self) -> Stats {
        self.stats
    }

    pub(crate) fn tally(&self) -> &Tally {
        &self.tally
    }
}

/// One row of the console summary.
struct SummaryRow {
    section: Section,
    ns: u64,
    calls: u64,
    nested: bool,
}

/// The summary header's step count: per rank when all ranks ran as many steps, else the
/// range over ranks.
fn steps_per_rank(t: &Tally) -> String {
    let min = t.ranks.values().copied().min().unwrap_or(0);
    let max = t.ranks.values().copied().max().unwrap_or(0);
    match t.ranks.len() {
        0 | 1 => format!("{} steps", t.steps),
        n if min == max => format!("{max} steps x {n} ranks (per rank)"),
        n => format!("{} steps over {n} ranks ({min} to {max} per rank)", t.steps),
    }
}

/// The console summary table: per bucket ms/token, share %, calls/token, µs/call, sorted.
pub(crate) fn summary_table(t: &Tally) -> String {
    use std::fmt::Write as _;
    let steps = t.steps.max(1) as f64;
    let top: u64 = t.sections.iter().filter(|s| !s.nested).map(|s| s.ns).sum();
    let mut rows: Vec<SummaryRow> = t
        .sections
        .iter()
        .enumerate()
        .filter(|(_, s)| s.calls > 0)
        .map(|(i, s)| SummaryRow {
            section: Section::from_id(i as u16),
            ns: s.ns,
            calls: s.calls,
            nested: s.nested,
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.ns));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "phasetrace decode profile after {}: {:.3} ms/token in sections, {:.3} ms/token per step",
        steps_per_rank(t),
        top as f64 / 1e6 / steps,
        t.step_ns as f64 / 1e6 / steps,
    );
    let _ = writeln!(
        out,
        "  {:<16} {:>10} {:>7} {:>10} {:>10}",
        "bucket", "ms/token", "share", "calls/tok", "us/call"
    );
    for r in rows {
        let name = r.section.as_str();
        let _ = writeln!(
            out,
            "  {:<16} {:>10.3} {:>6.1}% {:>10.2} {:>10.1}",
            if r.nested {
                format!(" ↳{name}")
            } else {
                name.to_owned()
            },
            r.ns as f64 / 1e6 / steps,
            100.0 * r.ns as f64 / top.max(1) as f64,
            r.calls as f64 / steps,
            r.ns as f64 / 1e3 / r.calls.max(1) as f64,
        );
    }
    out
}

/// The speculative console lines: phases per round, and the verify sub-split at level 2.
pub(crate) fn spec_lines(sp: &SpecTally, split: bool) -> String {
    let per = |ns: u64| ns as f64 / 1e6 / sp.rounds.max(1) as f64;
    let ms = |ns: u64| ns as f64 / 1e6;
    let total: u64 = sp.phases.iter().sum();
    let (draft, verify, accept, roll, maint) = (
        sp.phase(Phase::Draft),
        sp.phase(Phase::Verify),
        sp.phase(Phase::Accept),
        sp.phase(Phase::Rollback),
        sp.phase(Phase::Maint),
    );
    let mut s = format!(
        "[phasetrace-spec] rounds={} k={} total={:.2}ms | draft={:.2} verify={:.2} accept={:.2} roll={:.2} maint={:.2} | per-round ms: draft={:.3} verify={:.3} accept={:.3} roll={:.3} maint={:.3} total={:.3}\n",
        sp.rounds,
        sp.k,
        ms(total),
        ms(draft),
        ms(verify),
        ms(accept),
        ms(roll),
        ms(maint),
        per(draft),
        per(verify),
        per(accept),
        per(roll),
        per(maint),
        per(total)
    );
    if split {
        let v = &sp.split;
        s += &format!(
            "[phasetrace-spec-v] rounds={} k={} | per-round ms: vkda={:.3} (scan={:.3}) vmla={:.3} vrest={:.3} (vffn={:.3})\n",
            sp.rounds,
            sp.k,
            per(v.kda),
            per(v.kda_scan),
            per(v.mla),
            per(v.rest),
            per(v.ffn)
        );
    }
    s
}

/// The worker thread and the pipeline it drives.
pub(crate) struct Worker {
    pub(crate) pipeline: Arc<Mutex<Pipeline>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Worker {
    pub(crate) fn start(pipeline: Pipeline, interval: Duration) -> std::io::Result<Worker> {
        let pipeline = Arc::new(Mutex::new(pipeline));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, st) = (pipeline.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("phasetrace-worker".into())
            .spawn(move || {
                // Idle passes back off (up to IDLE_BACKOFF x the interval) so that an idle
                // engine costs few wake-ups; the first mark found snaps back to the interval.
                let mut wait = interval;
                while !st.load(Ordering::Acquire) {
                    let (busy, replay) = {
                        let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
                        let before = p.stats.marks;
                        p.pass();
                        (p.stats.marks != before, p.awaiting_replay)
                    };
                    // A graph replay is readable only until the engine launches the graph
                    // again: poll sooner while one waits for its end fence.
                    wait = if replay {
                        interval / REPLAY_SPEEDUP
                    } else if busy {
                        interval
                    } else {
                        (wait * 2).min(interval * IDLE_BACKOFF)
                    };
                    std::thread::park_timeout(wait);
                }
            })?;
        Ok(Worker {
            pipeline,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Drains and processes everything recorded so far on the calling thread.
    pub(crate) fn flush(&self) {
        self.pipeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .flush();
    }

    /// Stops the thread and processes what is left.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            h.thread().unpark();
            let _ = h.join();
        }
        self.flush();
    }
}

#[cfg(test)]
mod tests;
