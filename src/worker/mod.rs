//! The background worker: drain buffers, resolve times, pair marks into events, and hand the
//! events to one sink per output.
//!
//! ```text
//! lanes ──drain──> pair.rs: LaneState per lane (resolve tokens in order, pair begin/end, hold
//!                  │  the open step, and its trace while spans may want it: trace.rs)
//!                  │   └──> at the end of each drain: OpenSteps (when the open step began, or
//!                  │        since when the oldest mark is pending: one cell a lane, no locks)
//!                  ├──> requests.rs: the open requests (begin, each step's batch, end)
//!                  └──> event.rs: Section, Wait, Route, Step, Round, RequestTraced, Request,
//!                       Dropped, Drained
//!                         └──> sinks/: Sinks::on, each event to every sink in turn
//!                                ├──> metrics/: LaneSeries (series.rs) ─┬─> Instruments
//!                                │    (aggregate.rs: SDK histograms and counters)
//!                                │                                    └─> LayerTotals
//!                                │    (layers.rs), ExpertWriter (experts.rs), drop counts
//!                                ├──> spans/: Tail (tail.rs: sampled one in N? slower than the
//!                                │    threshold, within the rank's budget?) ──> span budget
//!                                │    ──> spans (build.rs) ──> exemplars
//!                                └──> console.rs: Tally, SpecTally ──> summary, spec lines
//! ```
//!
//! Nothing flows back from a sink into pairing: which traces pairing holds is fixed when the
//! pipeline is built ([`event::Hold`]), and the span budget and the exporter's counts are the
//! span sink's alone. The pipeline sits behind a mutex that only the worker thread and explicit
//! [`crate::Profiler::flush`] calls take; the hot path never touches it.

mod attrs;
mod build;
mod event;
pub(crate) mod open;
mod pair;
mod replay;
pub(crate) mod requests;
pub(crate) mod sinks;
mod stats;
mod trace;

pub(crate) use build::{Inputs as WorkerInputs, Kept, Options as WorkerOptions};
pub(crate) use sinks::console::summary_table;
pub use stats::{Dropped, Stats};

use crate::record::Shared;
use event::{Event, Sink};
use pair::Pairing;
use sinks::Sinks;
use sinks::console::Tally;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How far idle passes stretch the drain interval (1 ms -> 16 ms by default).
const IDLE_BACKOFF: u32 = 16;
/// How much sooner the worker polls while a graph replay waits to be read (1 ms -> 100 µs).
const REPLAY_SPEEDUP: u32 = 10;

/// Integer nanoseconds as seconds, the double nearest the exact decimal (a division by 1e9 is
/// correctly rounded; a product with 1e-9 is not): a total of 2,687,350 ns is exported as
/// `0.00268735`, not `0.0026873500000000002`, which also keeps the scrape's text short. What
/// the observable instruments report (per-layer totals, open steps, request figures) goes
/// through it; the drain's histogram recordings still multiply by 1e-9.
pub(crate) fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Pairing and the sinks of its events.
pub(crate) struct Pipeline {
    pairing: Pairing,
    sinks: Sinks,
}

impl Pipeline {
    /// The pipeline of `shared`'s lanes into `sinks`; `open` is where pairing publishes each
    /// lane's open step (read by the metrics' open-duration gauge).
    pub(crate) fn new(
        shared: Arc<Shared>,
        open: Arc<open::OpenSteps>,
        sinks: Sinks,
        requests: requests::Requests,
    ) -> Pipeline {
        let hold = sinks.spans.hold();
        Pipeline {
            pairing: Pairing::new(shared, open, hold, requests),
            sinks,
        }
    }

    /// One pass: adopt new lanes, drain each, finalize rounds ended in the previous pass.
    pub(crate) fn pass(&mut self) {
        crate::timing::maintain();
        self.pairing.pass(&mut self.sinks);
        self.sinks.on(&Event::Drained);
    }

    /// [`Pipeline::finish`] at a flush: what is open stays open.
    #[cfg(test)]
    pub(crate) fn flush(&mut self) {
        self.finish(false);
    }

    /// Finalizes everything that has ended, including rounds ended in this very pass (at
    /// flush); what is still open (a step, and the requests that ended inside it) stays open
    /// for the pass that sees it end. `closing` (shutdown): what is still open is counted
    /// under `reason="open_at_shutdown"` and given up.
    pub(crate) fn finish(&mut self, closing: bool) {
        self.pass();
        self.pairing.finalize_ended(&mut self.sinks);
        self.pairing.finalize_requests(closing, &mut self.sinks);
    }

    /// The one place [`Stats`] is assembled: pairing's counts, the span sink's figures (the
    /// exporter's counts read live) and the metrics sink's drop counts.
    pub(crate) fn stats(&self) -> Stats {
        let c = self.pairing.counts();
        let spans = self.sinks.spans.figures();
        Stats {
            marks: c.marks,
            sections: c.sections,
            steps: c.steps,
            rounds: c.rounds,
            spans: spans.built,
            spans_exported: spans.exported,
            spans_failed: spans.failed,
            dropped: self.sinks.metrics.dropped(),
            tail_traces: spans.tail_traces,
            internal_requests: c.internal_requests,
            graph_replays: c.graph_replays,
            dropped_graph_replays: c.dropped_graph_replays,
        }
    }

    pub(crate) fn tally(&self) -> &Tally {
        self.sinks.console.tally()
    }
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
                        let before = p.pairing.counts().marks;
                        p.pass();
                        (
                            p.pairing.counts().marks != before,
                            p.pairing.awaiting_replay(),
                        )
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
            .finish(false);
    }

    /// Stops the thread and processes what is left; what is still open is counted under
    /// `reason="open_at_shutdown"` ([`Pipeline::finish`]).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            h.thread().unpark();
            let _ = h.join();
        }
        self.pipeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .finish(true);
    }
}

#[cfg(test)]
mod tests;
