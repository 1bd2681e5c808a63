//! Sections inside CUDA graphs: capture once, time every replay.
//!
//! ```text
//! capture   rec.begin_capture()  boundaries -> Clock::mark_captured (event recorded INTO the graph)
//!           capture.finish() -> CapturedGraph (the captured marks: a template, kept here)
//! replay    rec.replay(&graph): fence B (plain event), launch seq++ ; cuGraphLaunch ; fence E
//!           lane: ReplayBegin(B, graph, seq) .. ReplayEnd(E, graph, seq)
//! worker    E complete -> read every template event -> this replay's sections, steps, rounds
//!           re-recorded by a later launch (pending, or outside [B, E) while a later launch
//!           has begun) -> the replay is counted under reason="graph_replay", never attributed
//! ```
//!
//! The captured marks never enter the lane: they stay with the capture on the engine thread and
//! become the graph's template. Their tokens (pooled events) belong to the graph until the last
//! [`CapturedGraph`] handle and the worker are done with it; an abandoned capture gives them back
//! at once.

use super::mark::{Mark, MarkKind};
use super::recorder::Recorder;
use crate::config::SectionLevel;
use crate::timing::{Clock, Token};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Most boundaries one capture keeps; beyond, marks are dropped and counted (`reason="clock"`).
pub(crate) const CAPTURE_MARKS_MAX: usize = 1 << 16;

/// What the worker and the handles share about one captured graph.
pub(crate) struct GraphShared {
    pub(crate) id: u32,
    /// The captured marks in order; their tokens are the graph's events.
    pub(crate) template: Box<[Mark]>,
    /// The clock the template's tokens belong to.
    pub(crate) clock: Arc<dyn Clock>,
    /// Launches begun so far (read or not): a replay's events are its own only while no later
    /// launch has begun.
    pub(crate) launched: AtomicU64,
}

impl Drop for GraphShared {
    fn drop(&mut self) {
        for m in self.template.iter() {
            self.clock.release(Token(m.token()));
        }
    }
}

/// The live graphs of one profiler, by id, for the worker.
#[derive(Default)]
pub(crate) struct Registry {
    graphs: Mutex<HashMap<u32, Weak<GraphShared>>>,
}

impl Registry {
    fn insert(&self, g: &Arc<GraphShared>) {
        let mut map = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(g.id, Arc::downgrade(g));
    }

    /// The graph, while a handle to it lives.
    pub(crate) fn get(&self, id: u32) -> Option<Arc<GraphShared>> {
        let map = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&id).and_then(Weak::upgrade)
    }
}

/// A stream capture in progress on one [`Recorder`]; from [`Recorder::begin_capture`].
///
/// End it with [`GraphCapture::finish`] once `cuStreamEndCapture` has returned a graph, or with
/// [`GraphCapture::abandon`] (or by dropping it) when the capture failed or its graph will never
/// be launched: the captured events then go back to the clock's pool at once.
#[must_use = "finish the capture with GraphCapture::finish, or abandon it"]
pub struct GraphCapture<'a> {
    rec: Option<&'a Recorder>,
}

impl std::fmt::Debug for GraphCapture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphCapture")
            .field("active", &self.rec.is_some())
            .finish()
    }
}

impl GraphCapture<'_> {
    /// Boundaries captured so far.
    pub fn marks(&self) -> usize {
        self.rec
            .map_or(0, |r| r.capture_slot().marks.borrow().len())
    }

    /// The round for [`Recorder::verify_part`] calls captured into this graph: at every replay
    /// the parts belong to the round open on the recorder that launches the graph (the usual
    /// shape: the host opens the round, launches the draft and verify graphs, marks the phases
    /// and ends it with the accepted count). A part captured for a round that is itself captured
    /// in the graph (`rec.round(k)` during the capture) stays with that round's replays.
    pub fn round(&self) -> crate::RoundRef {
        crate::RoundRef {
            lane: self.rec.map_or(0, |r| r.lane_id()),
            seq: if self.rec.is_some() {
                crate::RoundRef::LAUNCHING_SEQ
            } else {
                0
            },
        }
    }

    /// The capture succeeded: the captured boundaries become the graph's template, timed at
    /// every [`Recorder::replay`] of the returned handle.
    pub fn finish(mut self) -> CapturedGraph {
        let Some(rec) = self.rec.take() else {
            return CapturedGraph { inner: None };
        };
        let slot = rec.capture_slot();
        slot.active.set(false);
        let marks = std::mem::take(&mut *slot.marks.borrow_mut());
        if marks.is_empty() {
            return CapturedGraph { inner: None };
        }
        static NEXT_ID: AtomicU32 = AtomicU32::new(1);
        let g = Arc::new(GraphShared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            template: marks.into_boxed_slice(),
            clock: rec.lane_clock().clone(),
            launched: AtomicU64::new(0),
        });
        rec.shared_state().graphs.insert(&g);
        CapturedGraph { inner: Some(g) }
    }

    /// The capture failed (`cuStreamEndCapture` returned an error) or its graph is discarded:
    /// gives the captured events back to the pool. Dropping the capture does the same.
    pub fn abandon(self) {}
}

impl Drop for GraphCapture<'_> {
    fn drop(&mut self) {
        if let Some(rec) = self.rec.take() {
            let slot = rec.capture_slot();
            slot.active.set(false);
            let clock = rec.lane_clock();
            for m in slot.marks.borrow_mut().drain(..) {
                clock.release(Token(m.token()));
            }
        }
    }
}

/// A captured graph whose boundaries phasetrace times at every replay. From
/// [`GraphCapture::finish`]; pass it to [`Recorder::replay`] at every launch.
///
/// Drop it only once the graph will not be launched again and its last launch has finished (for
/// example after `cuGraphExecDestroy` and a synchronize): its events then go back to the pool
/// and may be reused for other boundaries. Cheap to clone.
#[derive(Clone)]
pub struct CapturedGraph {
    inner: Option<Arc<GraphShared>>,
}

impl std::fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedGraph")
            .field("id", &self.inner.as_ref().map(|g| g.id))
            .field("marks", &self.marks())
            .field("launches", &self.launches())
            .finish()
    }
}

impl CapturedGraph {
    /// Boundaries captured (timed at every replay that is read). 0 when the capture recorded
    /// nothing (profiler off, or a clock that cannot time inside graphs).
    pub fn marks(&self) -> usize {
        self.inner.as_ref().map_or(0, |g| g.template.len())
    }

    /// Launches passed to [`Recorder::replay`] so far, read or not.
    pub fn launches(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |g| g.launched.load(Ordering::Relaxed))
    }
}

/// An open replay of a [`CapturedGraph`]: launch the graph while it lives; dropping it marks the
/// end of the launch.
#[must_use = "launch the graph while the guard lives"]
#[derive(Debug)]
pub struct ReplayGuard<'a> {
    rec: Option<&'a Recorder>,
    graph: u32,
    seq: u32,
}

impl ReplayGuard<'_> {
    /// Ends the replay now (after `cuGraphLaunch`).
    pub fn end(self) {}
}

impl Drop for ReplayGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(rec) = self.rec {
            rec.push_timed(Mark::replay_end(self.graph, self.seq));
        }
    }
}

impl Recorder {
    /// Starts capturing this recorder's boundaries into a CUDA graph. Call it right after
    /// `cuStreamBeginCapture` on the engine's stream, and end it with [`GraphCapture::finish`]
    /// after `cuStreamEndCapture` (or [`GraphCapture::abandon`] when that fails).
    ///
    /// While the capture is open, every boundary of this recorder records its event into the
    /// graph ([`Clock::mark_captured`]): the event clocks only; at most 65 536 boundaries; with the host or sync clock the
    /// boundaries are dropped and counted under `reason="clock"`, and host sections
    /// ([`Recorder::host_section`]) too, since a replay has no host time. Nothing reaches the
    /// worker until the graph is replayed. A capture while one is open, or while recording is
    /// off, records nothing.
    ///
    /// ```
    /// use phasetrace_sim::SimStream;
    /// use phasetrace::{Profiler, Section, SectionLevel, Site, Timing};
    /// use std::time::Duration;
    ///
    /// let stream = SimStream::new();
    /// let profiler = Profiler::builder()
    ///     .without_env()
    ///     .with_level(SectionLevel::Full)
    ///     .without_prometheus()
    ///     .with_timing(Timing::Events)
    ///     .with_stream(stream.clone())
    ///     .build()?;
    /// let rec = profiler.recorder();
    ///
    /// stream.begin_capture().unwrap(); // cuStreamBeginCapture
    /// let capture = rec.begin_capture();
    /// for layer in 0..2u32 {
    ///     let _s = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
    ///     stream.enqueue(Duration::from_micros(30)); // the layer's kernels
    /// }
    /// let graph = match stream.end_capture() { // cuStreamEndCapture
    ///     Ok(g) => (g, capture.finish()),
    ///     Err(_) => { capture.abandon(); panic!("capture failed") }
    /// };
    ///
    /// for _token in 0..3 {
    ///     let _step = rec.step();
    ///     let replay = rec.replay(&graph.1);
    ///     graph.0.launch(&stream); // cuGraphLaunch
    ///     replay.end();
    ///     stream.synchronize(); // the host reads the sampled token
    ///     // A replay is readable until the next launch re-records its events; the background
    ///     // worker polls every millisecond, `drain` reads it now.
    ///     profiler.drain();
    /// }
    /// profiler.flush();
    /// assert_eq!(profiler.stats().graph_replays, 3);
    /// assert_eq!(profiler.stats().sections, 6);
    /// # profiler.shutdown();
    /// # Ok::<(), phasetrace::Error>(())
    /// ```
    pub fn begin_capture(&self) -> GraphCapture<'_> {
        let slot = self.capture_slot();
        if self.level() == SectionLevel::Off || slot.active() {
            return GraphCapture { rec: None };
        }
        slot.marks.borrow_mut().clear();
        slot.active.set(true);
        GraphCapture { rec: Some(self) }
    }

    /// Marks one launch of `graph`: call it right before `cuGraphLaunch` and drop the guard right
    /// after, on the stream the graph was captured from.
    ///
    /// The guard records a plain event before and after the launch; once the later one has
    /// completed, the worker reads the graph's events and attributes them to this replay
    /// (without any synchronize). If a later launch re-recorded them first, the replay is counted
    /// (`phasetrace.records.dropped{reason="graph_replay"}`, [`crate::Stats`]) and nothing is
    /// attributed to it. Which replays are read is `PHASETRACE_GRAPH_READ_EVERY` (every one by
    /// default). Measured (`cargo bench --bench hot_path -- graph/`, simulated stream, 2-vCPU VM,
    /// `BENCHMARKS.md`): a replay that is not read (or recording off) costs one atomic increment,
    /// **4 ns**; one that is read **46 ns** (two fence events and two ring pushes).
    #[inline]
    pub fn replay<'a>(&'a self, graph: &CapturedGraph) -> ReplayGuard<'a> {
        let inert = ReplayGuard {
            rec: None,
            graph: 0,
            seq: 0,
        };
        let Some(g) = graph.inner.as_ref() else {
            return inert;
        };
        if self.capture_slot().active() {
            // A launch inside a capture is part of the outer graph, not a replay.
            return inert;
        }
        // Every launch counts, read or not: it re-records the events of earlier replays.
        let n = g.launched.fetch_add(1, Ordering::SeqCst);
        let seq = n.wrapping_add(1) as u32;
        let every = self.shared_state().graph_read_every;
        if self.level() == SectionLevel::Off || every == 0 || !n.is_multiple_of(every) {
            return inert;
        }
        if !Arc::ptr_eq(&g.clock, self.lane_clock()) {
            // Fences on another stream's clock cannot bracket this graph's events.
            self.count_clock_drop();
            return inert;
        }
        let sampled = self.shared_state().sampling.head(n);
        let ok = self.push_timed(Mark::replay_begin(g.id, seq, sampled));
        ReplayGuard {
            rec: ok.then_some(self),
            graph: g.id,
            seq,
        }
    }

    /// Stores a boundary of an open capture; `false` (counted) when the clock cannot time it
    /// inside a graph.
    #[cold]
    pub(super) fn capture_mark(&self, m: Mark) -> bool {
        let slot = self.capture_slot();
        if m.is_host()
            || matches!(m.kind(), MarkKind::ReplayBegin | MarkKind::ReplayEnd)
            || slot.marks.borrow().len() >= CAPTURE_MARKS_MAX
        {
            self.count_clock_drop();
            return false;
        }
        let Some(token) = self.lane_clock().mark_captured() else {
            self.count_clock_drop();
            return false;
        };
        slot.marks.borrow_mut().push(m.at(token.0));
        true
    }
}
