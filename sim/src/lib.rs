//! A simulated CUDA stream for phasetrace, for CPU-only tests, benchmarks and the demo.
//!
//! [`SimStream`] behaves like a CUDA stream as far as timing is concerned: the host enqueues
//! work items of given durations and returns at once, the simulated device executes them in
//! order, events recorded onto the stream complete when the stream reaches them, and
//! [`SimStream::synchronize`] blocks until everything enqueued so far has finished.
//!
//! ```text
//! host thread: enqueue(30µs) record(ev) enqueue(20µs) ... synchronize() ──┐ (waits)
//! sim device:  [──── 30µs ────]ev[── 20µs ──] ... ───────────────────────┘ (done)
//! ```
//!
//! On top of it, [`SimEventClock`] is a deferred [`Clock`] with the same behavior as the CUDA
//! event backend: `mark` records a pooled event without waiting, `resolve` answers `Pending` until
//! the simulated device has reached the event. `SyncClock::new(stream.clone())` gives the
//! synchronizing backend on the same stream, since [`SimStream`] implements [`StreamSync`].
//!
//! [`SimStream`] is an [`EngineStream`], so a profiler takes it as it takes a CUDA stream, and
//! `PHASETRACE_TIMING` picks the clock:
//!
//! ```
//! use phasetrace::{Profiler, SectionLevel};
//! use phasetrace_sim::SimStream;
//!
//! let stream = SimStream::new();
//! let profiler = Profiler::builder()
//!     .without_env()
//!     .with_level(SectionLevel::Full)
//!     .without_prometheus()
//!     .with_timing(phasetrace::Timing::Events)
//!     .with_stream(stream.clone())
//!     .build()?;
//! let rec = profiler.recorder();
//! {
//!     let _step = rec.step();
//!     stream.enqueue(std::time::Duration::from_micros(30));
//! }
//! stream.synchronize();
//! profiler.shutdown();
//! # Ok::<(), phasetrace::Error>(())
//! ```
//!
//! It uses only the core's public API an engine with a stream of its own would use: the
//! [`Clock`] trait and its [`Token`]s, the [`TokenPool`] of a deferred clock's events, the
//! [`StreamSync`] of the synchronizing backend and the [`now_ns`] timeline.
//!
//! # Time model
//!
//! The device is a *schedule on the [`now_ns`] timeline*, the way a GPU runs on its own timer:
//! an operation starts at `max(end of the previous operation, time it was enqueued + launch
//! latency)` and a work item ends `duration` later; an event completes at the time the stream reaches it. Because that
//! schedule is fully determined when an operation is enqueued, the stream computes it right
//! there, and "the device has finished X" is simply `now_ns() >= end(X)`:
//!
//! - no device thread burns a CPU core spinning through short kernels, which on a small machine
//!   would compete with the very threads being measured (the engine thread, phasetrace's worker);
//! - completion is observable exactly when the simulated work ends (no thread wake-up latency),
//!   and event timestamps are exact to the nanosecond even when the OS preempts a thread;
//! - nothing needs shutting down: dropping the last handle frees the stream, and events already
//!   recorded still complete at their device time, as on a GPU finishing its queue.
//!
//! `synchronize` (and an `enqueue` into a full queue) waits on the calling thread the way CUDA's
//! default spin scheduling does: it sleeps while the remaining time is long and spins for the
//! last few hundred microseconds, so it returns within a few microseconds of the device time.
//!
//! # Graph capture and replay
//!
//! Like a CUDA stream, a [`SimStream`] can be captured into a graph
//! ([`SimStream::begin_capture`] .. [`SimStream::end_capture`]): while capturing, work and
//! *external* event records ([`SimStream::record_external`], what
//! `cuEventRecordWithFlags(.., CU_EVENT_RECORD_EXTERNAL)` does) are appended to the graph instead
//! of being scheduled, and a plain record does nothing (CUDA only adds a dependency). Each
//! [`SimGraph::launch`] enqueues the graph's work again and **re-records its events at launch
//! time**, so after a second launch an event refers to that launch: pending until the stream
//! reaches it, then carrying its time. That is what makes overlapping replays observable here.
//! [`SimStream::invalidate_capture`] models an illegal call during capture, after which
//! `end_capture` fails as `cuStreamEndCapture` does.
//!
//! ```text
//! capture:  begin_capture  record_external(a) enqueue(30µs) record_external(b)  end_capture -> g
//! replay 1: g.launch()  ..a1[── 30µs ──]b1..          (a, b hold replay 1's times)
//! replay 2: g.launch()  ..a2[── 30µs ──]b2..          (a, b now refer to replay 2)
//! ```

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

use phasetrace::Timing;
use phasetrace::timing::{
    Clock, EngineStream, HostClock, Resolved, StreamSync, SyncClock, Token, TokenPool, now_ns,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How many operations a [`SimStream`] queues before `enqueue` blocks (a CUDA stream's launch
/// queue is about a thousand entries deep; this one is a little deeper).
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// A realistic launch latency (host enqueue to device start on an idle stream) for
/// [`SimStreamOptions::launch_latency`]: a few microseconds on current NVIDIA GPUs.
pub const TYPICAL_LAUNCH_LATENCY: Duration = Duration::from_micros(5);

/// How many events a [`SimEventClock`] pools by default.
pub const DEFAULT_POOL_SIZE: usize = 4096;

/// Remainders above this are slept (minus [`SLEEP_MARGIN_NS`]); below it the waiter spins.
const SLEEP_THRESHOLD_NS: u64 = 400_000;
/// What a `thread::sleep` may overshoot by (timer slack is 50 µs by default on Linux).
const SLEEP_MARGIN_NS: u64 = 250_000;
/// An event that was never recorded.
const NEVER: u64 = u64::MAX;

/// Waits on the calling thread until [`now_ns`] reaches `deadline`: sleeps for long remainders,
/// spins for the rest (CUDA's default synchronization spins too).
fn wait_until(deadline: u64) {
    loop {
        let now = now_ns();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SLEEP_THRESHOLD_NS {
            std::thread::sleep(Duration::from_nanos(left - SLEEP_MARGIN_NS));
        } else {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        }
    }
}

struct Schedule {
    /// Device time at which everything enqueued so far has finished.
    cursor: u64,
    /// End times of the operations not yet finished at the last look, in order (at most
    /// `capacity`).
    ends: VecDeque<u64>,
    /// The graph being captured, when the stream is in capture mode.
    capture: Option<Capture>,
}

/// One operation of a captured graph.
#[derive(Clone, Debug)]
enum Op {
    Work(u64),
    Record(SimEvent),
}

struct Capture {
    ops: Vec<Op>,
    /// An illegal call happened during the capture: `end_capture` fails.
    invalid: bool,
}

impl Schedule {
    /// Forgets the operations that have finished by `now`.
    fn retire(&mut self, now: u64) {
        while self.ends.front().is_some_and(|&end| end <= now) {
            self.ends.pop_front();
        }
    }

    /// Queues an operation of `ns` launched at `now`: it starts when the launch has reached the
    /// device and the operation before it has ended. Returns its end.
    fn enqueue(&mut self, now: u64, launch_latency_ns: u64, ns: u64) -> u64 {
        let end = self
            .cursor
            .max(now.saturating_add(launch_latency_ns))
            .saturating_add(ns);
        self.cursor = end;
        self.ends.push_back(end);
        end
    }
}

struct Inner {
    schedule: Mutex<Schedule>,
    capacity: usize,
    launch_latency_ns: u64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Schedule> {
        // Nothing panics while holding the lock; recover the data if that ever changes.
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Schedules one operation lasting `ns` and returns its end; `None` when the queue is full
    /// and `block` is false. A full queue with `block` waits until the oldest operation ends.
    /// Enqueues a graph's operations as one launch: waits, as [`Self::push`], for room for
    /// one, then times every operation from one reading of the clock, back to back, as the
    /// device runs a graph's nodes (a host preempted between two of them must not open gaps
    /// on the device).
    fn push_graph(&self, ops: &[Op]) {
        loop {
            let mut st = self.lock();
            let now = now_ns();
            st.retire(now);
            if st.ends.len() < self.capacity {
                for op in ops {
                    let ns = match op {
                        Op::Work(ns) => *ns,
                        Op::Record(_) => 0,
                    };
                    let end = st.enqueue(now, self.launch_latency_ns, ns);
                    if let Op::Record(event) = op {
                        event.0.store(end, Ordering::Release);
                    }
                }
                return;
            }
            let oldest = st.ends.front().copied().unwrap_or(now);
            drop(st);
            wait_until(oldest);
        }
    }

    fn push(&self, ns: u64, block: bool) -> Option<u64> {
        loop {
            let mut st = self.lock();
            let now = now_ns();
            st.retire(now);
            if st.ends.len() < self.capacity {
                return Some(st.enqueue(now, self.launch_latency_ns, ns));
            }
            if !block {
                return None;
            }
            let oldest = st.ends.front().copied().unwrap_or(now);
            drop(st);
            wait_until(oldest);
        }
    }
}

/// Settings of a [`SimStream`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimStreamOptions {
    /// Unfinished operations the queue holds before `enqueue` waits ([`DEFAULT_QUEUE_CAPACITY`]).
    pub queue_capacity: usize,
    /// Delay between an enqueue and the earliest device start of that operation (default zero:
    /// an ideal device; [`TYPICAL_LAUNCH_LATENCY`] for a realistic one). It is hidden while the
    /// host runs ahead of the device, and paid at every boundary by a synchronizing profiler.
    pub launch_latency: Duration,
}

impl Default for SimStreamOptions {
    fn default() -> Self {
        Self {
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            launch_latency: Duration::ZERO,
        }
    }
}

impl SimStreamOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`SimStreamOptions::queue_capacity`].
    pub fn queue_capacity(mut self, operations: usize) -> Self {
        self.queue_capacity = operations;
        self
    }

    /// Sets [`SimStreamOptions::launch_latency`].
    pub fn launch_latency(mut self, latency: Duration) -> Self {
        self.launch_latency = latency;
        self
    }
}

/// A simulated CUDA stream (see the [module docs](self) for the time model).
///
/// Cheap to clone (an `Arc` inside); every clone is the same stream. Safe to use from several
/// threads, like a CUDA stream: operations are ordered as their enqueue calls are.
#[derive(Clone)]
pub struct SimStream {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SimStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimStream")
            .field("pending", &self.pending())
            .field("capacity", &self.inner.capacity)
            .finish()
    }
}

impl Default for SimStream {
    fn default() -> Self {
        Self::new()
    }
}

impl SimStream {
    /// A stream whose queue holds [`DEFAULT_QUEUE_CAPACITY`] operations.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_QUEUE_CAPACITY)
    }

    /// A stream whose queue holds `capacity` unfinished operations (at least 1) before `enqueue`
    /// blocks and `try_record` refuses.
    pub fn with_capacity(capacity: usize) -> Self {
        Self::with_options(SimStreamOptions::new().queue_capacity(capacity))
    }

    /// A stream with the given options.
    pub fn with_options(options: SimStreamOptions) -> Self {
        let capacity = options.queue_capacity.max(1);
        Self {
            inner: Arc::new(Inner {
                schedule: Mutex::new(Schedule {
                    cursor: 0,
                    ends: VecDeque::with_capacity(capacity.min(DEFAULT_QUEUE_CAPACITY)),
                    capture: None,
                }),
                capacity,
                launch_latency_ns: u64::try_from(options.launch_latency.as_nanos())
                    .unwrap_or(u64::MAX),
            }),
        }
    }

    /// Enqueues `duration` of device work and returns at once (waits only while the queue is
    /// full, as a CUDA launch does). While the stream is capturing, the work is added to the
    /// graph instead.
    pub fn enqueue(&self, duration: Duration) {
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        if self.captured(Op::Work(ns)) {
            return;
        }
        let _ = self.inner.push(ns, true);
    }

    /// Appends `op` to the graph being captured; `false` when the stream is not capturing.
    fn captured(&self, op: Op) -> bool {
        match self.inner.lock().capture.as_mut() {
            Some(c) => {
                c.ops.push(op);
                true
            }
            None => false,
        }
    }

    /// Starts capturing the stream into a graph (`cuStreamBeginCapture`). Fails when a capture
    /// is already in progress.
    pub fn begin_capture(&self) -> Result<(), SimCaptureError> {
        let mut st = self.inner.lock();
        if st.capture.is_some() {
            return Err(SimCaptureError::AlreadyCapturing);
        }
        st.capture = Some(Capture {
            ops: Vec::new(),
            invalid: false,
        });
        Ok(())
    }

    /// Whether the stream is being captured (`cuStreamIsCapturing`).
    pub fn is_capturing(&self) -> bool {
        self.inner.lock().capture.is_some()
    }

    /// Makes the capture in progress fail at [`SimStream::end_capture`], as an illegal call
    /// during a CUDA capture does. Does nothing when the stream is not capturing.
    pub fn invalidate_capture(&self) {
        if let Some(c) = self.inner.lock().capture.as_mut() {
            c.invalid = true;
        }
    }

    /// Ends the capture (`cuStreamEndCapture`) and returns the graph, or why there is none. The
    /// stream leaves capture mode either way.
    pub fn end_capture(&self) -> Result<SimGraph, SimCaptureError> {
        match self.inner.lock().capture.take() {
            None => Err(SimCaptureError::NotCapturing),
            Some(c) if c.invalid => Err(SimCaptureError::Invalidated),
            Some(c) => Ok(SimGraph {
                ops: Arc::from(c.ops),
            }),
        }
    }

    /// Records `event` into the graph being captured, so every launch of the graph records it
    /// again (`cuEventRecordWithFlags(.., CU_EVENT_RECORD_EXTERNAL)`). Returns `false`, recording
    /// nothing, when the stream is not capturing.
    pub fn record_external(&self, event: &SimEvent) -> bool {
        self.captured(Op::Record(event.clone()))
    }

    /// Creates an event and records it onto the stream (`cudaEventRecord` on a new event).
    pub fn record_event(&self) -> SimEvent {
        let event = SimEvent::new();
        self.record(&event);
        event
    }

    /// Records `event` onto the stream: it completes when the stream reaches this point. Like
    /// CUDA, re-recording an event replaces its previous record (queries then refer to the new
    /// one). Waits only while the queue is full. During a capture it records nothing (a plain
    /// CUDA record there only adds a dependency to the graph).
    pub fn record(&self, event: &SimEvent) {
        if self.is_capturing() {
            return;
        }
        if let Some(at) = self.inner.push(0, true) {
            event.0.store(at, Ordering::Release);
        }
    }

    /// Records `event` unless the queue is full or the stream is capturing; never waits.
    /// Returns whether it was recorded.
    pub fn try_record(&self, event: &SimEvent) -> bool {
        if self.is_capturing() {
            return false;
        }
        match self.inner.push(0, false) {
            Some(at) => {
                event.0.store(at, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Whether the stream has reached `event`'s latest record (`cudaEventQuery`); an event that
    /// was never recorded counts as complete, as in CUDA.
    pub fn query(&self, event: &SimEvent) -> bool {
        event.is_complete()
    }

    /// Device time from `start` to `end` (`cudaEventElapsedTime`); `None` unless both were
    /// recorded and have completed, or when `end` completed before `start`.
    pub fn elapsed(&self, start: &SimEvent, end: &SimEvent) -> Option<Duration> {
        let ns = SimEvent::elapsed_ns(start, end)?;
        u64::try_from(ns).ok().map(Duration::from_nanos)
    }

    /// Waits until all work enqueued before the call has finished (`cudaStreamSynchronize`).
    pub fn synchronize(&self) {
        let target = self.inner.lock().cursor;
        wait_until(target);
    }

    /// Operations enqueued and not finished yet.
    pub fn pending(&self) -> u64 {
        let mut st = self.inner.lock();
        st.retire(now_ns());
        st.ends.len() as u64
    }

    /// When everything enqueued so far will have finished, on the [`now_ns`] timeline.
    pub fn idle_at_ns(&self) -> u64 {
        self.inner.lock().cursor
    }

    /// Whether two handles are the same stream.
    pub fn same_stream(&self, other: &SimStream) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl StreamSync for SimStream {
    fn synchronize(&self) -> Result<(), String> {
        SimStream::synchronize(self);
        Ok(())
    }
}

/// Why a [`SimStream`] capture produced no graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimCaptureError {
    /// `begin_capture` on a stream that is already capturing.
    #[error("the stream is already being captured")]
    AlreadyCapturing,
    /// `end_capture` on a stream that is not capturing.
    #[error("the stream is not being captured")]
    NotCapturing,
    /// An illegal call invalidated the capture (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`).
    #[error("the capture was invalidated")]
    Invalidated,
}

/// A graph captured from a [`SimStream`] (`cudaGraphExec_t`). Cheap to clone.
#[derive(Clone)]
pub struct SimGraph {
    ops: Arc<[Op]>,
}

impl std::fmt::Debug for SimGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGraph")
            .field("operations", &self.ops.len())
            .finish()
    }
}

impl SimGraph {
    /// Enqueues the graph's work on `stream` (`cuGraphLaunch`) and returns at once. Its events
    /// are re-recorded now: from this call on they refer to this launch.
    pub fn launch(&self, stream: &SimStream) {
        stream.inner.push_graph(&self.ops);
    }

    /// Total device work of one launch.
    pub fn work(&self) -> Duration {
        Duration::from_nanos(
            self.ops
                .iter()
                .map(|op| match op {
                    Op::Work(ns) => *ns,
                    Op::Record(_) => 0,
                })
                .sum(),
        )
    }
}

/// An event on a [`SimStream`] (`cudaEvent_t`). Clones are the same event.
///
/// It holds the device time of its latest record; it has completed once the host clock has
/// passed that time.
#[derive(Clone)]
pub struct SimEvent(Arc<AtomicU64>);

impl std::fmt::Debug for SimEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEvent")
            .field("complete", &self.is_complete())
            .field("completed_ns", &self.completed_ns())
            .finish()
    }
}

impl Default for SimEvent {
    fn default() -> Self {
        Self::new()
    }
}

impl SimEvent {
    /// An event that was never recorded (complete, without a time, as in CUDA).
    pub fn new() -> Self {
        Self(Arc::new(AtomicU64::new(NEVER)))
    }

    /// Whether the stream has reached the event's latest record.
    pub fn is_complete(&self) -> bool {
        let at = self.0.load(Ordering::Acquire);
        at == NEVER || now_ns() >= at
    }

    /// When the stream reached the event's latest record, in [`now_ns`] nanoseconds; `None` while
    /// pending or when never recorded.
    pub fn completed_ns(&self) -> Option<u64> {
        let at = self.0.load(Ordering::Acquire);
        (at != NEVER && now_ns() >= at).then_some(at)
    }

    /// Signed device time from `start` to `end` in nanoseconds, when both have completed.
    pub fn elapsed_ns(start: &SimEvent, end: &SimEvent) -> Option<i64> {
        let a = start.completed_ns()?;
        let b = end.completed_ns()?;
        Some((b as i128 - a as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64)
    }
}

/// The event backend on a [`SimStream`]: a deferred [`Clock`].
///
/// `mark` records an event from a bounded pool onto the stream and returns at once; when the pool
/// is exhausted (or the stream's queue is full) it returns `None` and counts the drop. `resolve`
/// answers `Pending` until the stream has reached the event, then `At(device time)`. `release`
/// returns the event to the pool. Memory is bounded by the pool size; nothing panics. The clock
/// holds a handle to its stream, so the stream lives as long as the clock does.
///
/// A token is `generation << 32 | slot`: resolving or releasing a token after its slot has been
/// released gives `Failed` / does nothing.
pub struct SimEventClock {
    stream: SimStream,
    pool: TokenPool<SimEvent>,
    dropped: AtomicU64,
    pool_exhausted: AtomicU64,
    queue_full: AtomicU64,
    captured: AtomicU64,
}

impl std::fmt::Debug for SimEventClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEventClock")
            .field("pool_size", &self.pool_size())
            .field("in_flight", &self.in_flight())
            .field("dropped", &self.dropped.load(Ordering::Relaxed))
            .finish()
    }
}

impl SimEventClock {
    /// An event clock on `stream` with [`DEFAULT_POOL_SIZE`] events.
    pub fn new(stream: SimStream) -> Self {
        Self::with_pool_size(stream, DEFAULT_POOL_SIZE)
    }

    /// An event clock on `stream` pooling `pool_size` events (clamped to 1..=2^31).
    pub fn with_pool_size(stream: SimStream, pool_size: usize) -> Self {
        let n = pool_size.clamp(1, 1 << 31);
        Self {
            stream,
            pool: TokenPool::new((0..n).map(|_| SimEvent::new()).collect()),
            dropped: AtomicU64::new(0),
            pool_exhausted: AtomicU64::new(0),
            queue_full: AtomicU64::new(0),
            captured: AtomicU64::new(0),
        }
    }

    /// The stream the events are recorded onto.
    pub fn stream(&self) -> &SimStream {
        &self.stream
    }

    /// Events in the pool.
    pub fn pool_size(&self) -> usize {
        self.pool.capacity()
    }

    /// Events handed out and not released yet.
    pub fn in_flight(&self) -> usize {
        self.pool.in_flight()
    }

    /// Marks dropped because every pooled event was in flight.
    pub fn pool_exhausted(&self) -> u64 {
        self.pool_exhausted.load(Ordering::Relaxed)
    }

    /// Marks dropped because the stream's queue was full.
    pub fn queue_full(&self) -> u64 {
        self.queue_full.load(Ordering::Relaxed)
    }

    /// Marks dropped because `mark` came during a capture, or `mark_captured` outside one.
    pub fn captured(&self) -> u64 {
        self.captured.load(Ordering::Relaxed)
    }

    fn refuse(&self, index: u32, counter: &AtomicU64) -> Option<Token> {
        self.pool.cancel(index);
        counter.fetch_add(1, Ordering::Relaxed);
        self.dropped.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl Clock for SimEventClock {
    fn mark(&self) -> Option<Token> {
        let Some((index, event)) = self.pool.acquire() else {
            self.pool_exhausted.fetch_add(1, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        // As the CUDA event clock: a plain mark during a capture is skipped and counted.
        if self.stream.is_capturing() {
            return self.refuse(index, &self.captured);
        }
        if !self.stream.try_record(event) {
            return self.refuse(index, &self.queue_full);
        }
        Some(self.pool.token(index))
    }

    fn mark_captured(&self) -> Option<Token> {
        let Some((index, event)) = self.pool.acquire() else {
            self.pool_exhausted.fetch_add(1, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        if !self.stream.record_external(event) {
            return self.refuse(index, &self.captured);
        }
        Some(self.pool.token(index))
    }

    fn resolve(&self, token: Token) -> Resolved {
        let Some(event) = self.pool.get(token) else {
            return Resolved::Failed;
        };
        match event.completed_ns() {
            Some(ns) => Resolved::At(ns),
            None => Resolved::Pending,
        }
    }

    fn release(&self, token: Token) {
        self.pool.release(token);
    }

    fn is_deferred(&self) -> bool {
        true
    }

    fn timing(&self) -> Timing {
        Timing::Events
    }

    fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The clock `timing` selects for `stream`: the host clock, a [`SyncClock`] on the stream, or a
/// [`SimEventClock`] (what `PHASETRACE_TIMING` means for a simulated stream).
pub fn clock(stream: &SimStream, timing: Timing) -> Arc<dyn Clock> {
    match timing {
        Timing::Host => Arc::new(HostClock),
        Timing::Sync => Arc::new(SyncClock::new(stream.clone())),
        Timing::Events => Arc::new(SimEventClock::new(stream.clone())),
    }
}

/// A profiler given the stream ([`ProfilerBuilder::with_stream`]) times it with the clock
/// [`clock`] picks; a simulated stream has every backend.
///
/// [`ProfilerBuilder::with_stream`]: phasetrace::ProfilerBuilder::with_stream
impl EngineStream for SimStream {
    fn clock(
        &self,
        timing: Timing,
    ) -> Result<Arc<dyn Clock>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(clock(self, timing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn enqueue_returns_at_once_and_synchronize_waits() {
        let s = SimStream::new();
        let t0 = Instant::now();
        // The work is long next to any descheduling on a busy machine.
        s.enqueue(us(300_000));
        assert!(t0.elapsed() < us(200_000), "enqueue blocked");
        assert_eq!(s.pending(), 1);
        s.synchronize();
        assert!(t0.elapsed() >= us(300_000));
        assert_eq!(s.pending(), 0);
    }

    #[test]
    fn events_complete_in_order_with_device_times() {
        let s = SimStream::new();
        let a = s.record_event();
        s.enqueue(us(200_000));
        let b = s.record_event();
        s.enqueue(us(50_000));
        s.enqueue(us(50_000));
        let c = s.record_event();
        assert!(!s.query(&c));
        assert_eq!(c.completed_ns(), None);
        s.synchronize();
        assert!(s.query(&a) && s.query(&b) && s.query(&c));
        let ab = s.elapsed(&a, &b).unwrap();
        let bc = s.elapsed(&b, &c).unwrap();
        // `a` was recorded on an idle stream: the work started when it was enqueued, a little
        // after `a` (how little depends on the machine's load). From then on the stream was
        // busy, and virtual device time is exact.
        assert!(
            ab >= us(200_000) && ab < us(200_000) + us(100_000),
            "{ab:?}"
        );
        assert_eq!(bc, us(100_000));
        assert_eq!(s.elapsed(&c, &a), None);
        assert_eq!(
            SimEvent::elapsed_ns(&c, &a),
            Some(-((ab + bc).as_nanos() as i64))
        );
        assert!(c.completed_ns().unwrap() <= now_ns());
    }

    #[test]
    fn never_recorded_event_is_complete_without_time() {
        let s = SimStream::new();
        let e = SimEvent::new();
        assert!(s.query(&e));
        assert_eq!(e.completed_ns(), None);
        assert_eq!(s.elapsed(&e, &e), None);
    }

    #[test]
    fn rerecording_refers_to_the_latest_record() {
        let s = SimStream::new();
        let e = s.record_event();
        s.synchronize();
        let first = e.completed_ns().unwrap();
        s.enqueue(us(300_000));
        s.record(&e);
        assert!(!s.query(&e), "the new record is pending");
        s.synchronize();
        assert!(e.completed_ns().unwrap() >= first + 300_000_000);
    }

    #[test]
    fn idle_gap_starts_work_at_enqueue_time() {
        let s = SimStream::new();
        let a = s.record_event();
        s.synchronize();
        std::thread::sleep(us(2_000));
        let before = now_ns();
        s.enqueue(us(100));
        let b = s.record_event();
        s.synchronize();
        let b_ns = b.completed_ns().unwrap();
        assert!(b_ns >= before + 100_000);
        assert!(s.elapsed(&a, &b).unwrap() >= us(2_100));
    }

    #[test]
    fn launch_latency_delays_work_on_an_idle_stream_only() {
        let s = SimStream::with_options(SimStreamOptions::new().launch_latency(us(100)));
        let before = now_ns();
        let a = s.record_event();
        s.enqueue(us(200_000));
        let b = s.record_event();
        s.enqueue(us(50_000));
        let c = s.record_event();
        s.synchronize();
        assert!(
            a.completed_ns().unwrap() >= before + 100_000,
            "paid on the idle stream"
        );
        // The upper bound leaves room for this thread being descheduled between `a` and the
        // enqueue on a busy machine.
        let ab = s.elapsed(&a, &b).unwrap();
        assert!(ab >= us(200_000) && ab < us(200_000) + us(50_000), "{ab:?}");
        assert_eq!(
            s.elapsed(&b, &c).unwrap(),
            us(50_000),
            "hidden behind queued work"
        );
    }

    #[test]
    fn durations_are_accurate_in_real_time() {
        let s = SimStream::new();
        for &d in &[50u64, 200, 1_000, 3_000] {
            let mut best = Duration::MAX;
            for _ in 0..5 {
                s.synchronize();
                let t0 = Instant::now();
                s.enqueue(us(d));
                s.synchronize();
                let took = t0.elapsed();
                assert!(took >= us(d), "{d}µs took {took:?}");
                best = best.min(took);
            }
            // Generous bound: a loaded CI machine may preempt the waiting thread (event times stay
            // exact regardless; they do not depend on any thread's scheduling).
            assert!(best < us(d) + us(10_000), "{d}µs took {best:?} at best");
        }
    }

    #[test]
    fn full_queue_try_record_fails_and_enqueue_blocks() {
        let s = SimStream::with_capacity(2);
        s.enqueue(us(1_000_000));
        s.enqueue(us(1_000_000));
        let e = SimEvent::new();
        assert!(
            !s.try_record(&e),
            "two unfinished operations fill the queue"
        );
        assert_eq!(s.pending(), 2);
        let t0 = Instant::now();
        s.enqueue(us(1));
        let waited = t0.elapsed();
        assert!(
            waited >= us(500_000),
            "enqueue into a full queue waited only {waited:?}"
        );
        s.synchronize();
        assert!(s.try_record(&e));
        s.synchronize();
        assert!(s.query(&e));
    }

    #[test]
    fn drop_with_pending_work_does_not_wait_and_events_still_complete() {
        // Long work and loose bounds: the test holds on a machine busy enough to deschedule
        // this thread for a second.
        let s = SimStream::new();
        s.enqueue(us(3_000_000));
        let e = s.record_event();
        let t0 = Instant::now();
        drop(s);
        assert!(t0.elapsed() < us(1_500_000), "the drop waited for the work");
        assert!(!e.is_complete());
        let deadline = Instant::now() + Duration::from_secs(30);
        while !e.is_complete() && Instant::now() < deadline {
            std::thread::sleep(us(10_000));
        }
        assert!(e.is_complete(), "the device finishes its queue");
    }

    #[test]
    fn stream_sync_for_the_sync_clock() {
        let s = SimStream::new();
        let clock = SyncClock::new(s.clone());
        let Some(Token(t0)) = clock.mark() else {
            panic!("sync clock always marks")
        };
        s.enqueue(us(1_500));
        let Some(Token(t1)) = clock.mark() else {
            panic!("sync clock always marks")
        };
        assert!(t1 - t0 >= 1_500_000);
        assert_eq!(clock.resolve(Token(t1)), Resolved::At(t1));
        assert_eq!(clock.sync_errors(), 0);
    }

    #[test]
    fn event_clock_pending_then_at() {
        let s = SimStream::new();
        let clock = SimEventClock::new(s.clone());
        assert!(clock.is_deferred());
        assert_eq!(clock.timing(), Timing::Events);
        // b is half a second of queued work away: still pending however busy the machine.
        s.enqueue(us(1_000));
        let a = clock.mark().unwrap();
        s.enqueue(us(500_000));
        let b = clock.mark().unwrap();
        assert_eq!(clock.resolve(b), Resolved::Pending);
        s.synchronize();
        let (Resolved::At(ta), Resolved::At(tb)) = (clock.resolve(a), clock.resolve(b)) else {
            panic!("both resolved after synchronize")
        };
        assert_eq!(tb - ta, 500_000_000);
        assert_eq!(clock.in_flight(), 2);
        clock.release(a);
        clock.release(b);
        assert_eq!(clock.in_flight(), 0);
        // Stale tokens fail; double release is harmless.
        assert_eq!(clock.resolve(a), Resolved::Failed);
        clock.release(a);
        assert_eq!(clock.in_flight(), 0);
        assert_eq!(clock.resolve(Token(u64::MAX)), Resolved::Failed);
        clock.release(Token(u64::MAX));
    }

    #[test]
    fn event_clock_pool_exhaustion_is_counted() {
        let s = SimStream::new();
        let clock = SimEventClock::with_pool_size(s, 3);
        let tokens: Vec<_> = (0..3).map(|_| clock.mark().unwrap()).collect();
        assert_eq!(clock.mark(), None);
        assert_eq!(clock.mark(), None);
        assert_eq!(clock.dropped(), 2);
        assert_eq!(clock.pool_exhausted(), 2);
        clock.release(tokens[1]);
        let again = clock.mark().unwrap();
        assert_ne!(again, tokens[1], "a reused slot carries a new generation");
        assert_eq!(clock.resolve(tokens[1]), Resolved::Failed);
    }

    #[test]
    fn event_clock_counts_a_full_stream_queue() {
        let s = SimStream::with_capacity(1);
        let clock = SimEventClock::with_pool_size(s.clone(), 16);
        s.enqueue(us(2_000_000));
        for _ in 0..4 {
            assert_eq!(clock.mark(), None);
        }
        assert_eq!(clock.queue_full(), 4);
        assert_eq!(clock.dropped(), 4);
        assert_eq!(clock.in_flight(), 0, "refused marks give their slot back");
        s.synchronize();
        let t = clock.mark().expect("room again");
        s.synchronize();
        assert!(matches!(clock.resolve(t), Resolved::At(_)));
    }

    #[test]
    fn event_clock_survives_the_callers_stream_handle() {
        let s = SimStream::new();
        let clock = SimEventClock::new(s.clone());
        drop(s);
        let a = clock.mark().unwrap();
        clock.stream().enqueue(us(100));
        let b = clock.mark().unwrap();
        clock.stream().synchronize();
        assert!(matches!(clock.resolve(a), Resolved::At(_)));
        assert!(matches!(clock.resolve(b), Resolved::At(_)));
        drop(clock);
    }

    #[test]
    fn a_captured_graph_replays_its_work_and_rerecords_its_events_at_launch() {
        let s = SimStream::new();
        s.begin_capture().unwrap();
        assert_eq!(s.begin_capture(), Err(SimCaptureError::AlreadyCapturing));
        assert!(s.is_capturing());
        let (a, b, plain) = (SimEvent::new(), SimEvent::new(), SimEvent::new());
        assert!(s.record_external(&a));
        s.enqueue(us(1_000));
        s.record(&plain);
        assert!(
            !s.try_record(&plain),
            "a plain record during capture records nothing"
        );
        assert!(s.record_external(&b));
        assert_eq!(s.pending(), 0, "captured work is not scheduled");
        let g = s.end_capture().unwrap();
        assert!(!s.is_capturing());
        assert_eq!(g.work(), us(1_000));
        assert_eq!(plain.completed_ns(), None);
        assert_eq!(s.elapsed(&a, &b), None, "not launched yet");

        // Behind queued work, as an engine running ahead: device time is exact.
        s.enqueue(us(2_000));
        g.launch(&s);
        s.synchronize();
        assert_eq!(s.elapsed(&a, &b), Some(us(1_000)));
        let first = b.completed_ns().unwrap();

        // A second launch behind queued work: the events now refer to it, pending.
        s.enqueue(us(5_000));
        g.launch(&s);
        assert!(!s.query(&a) && !s.query(&b));
        s.synchronize();
        assert_eq!(s.elapsed(&a, &b), Some(us(1_000)));
        assert!(a.completed_ns().unwrap() >= first + 5_000_000);
        assert!(!s.record_external(&a), "not capturing");
    }

    #[test]
    fn an_invalidated_capture_gives_no_graph() {
        let s = SimStream::new();
        assert_eq!(s.end_capture().err(), Some(SimCaptureError::NotCapturing));
        s.begin_capture().unwrap();
        s.enqueue(us(10));
        s.invalidate_capture();
        assert_eq!(s.end_capture().err(), Some(SimCaptureError::Invalidated));
        assert!(!s.is_capturing(), "the stream leaves capture mode");
        s.invalidate_capture();
        s.begin_capture().unwrap();
        assert!(s.end_capture().is_ok(), "a later capture is unaffected");
    }

    #[test]
    fn clock_is_usable_as_a_trait_object_across_threads() {
        let s = SimStream::new();
        let clock: Arc<dyn Clock> = Arc::new(SimEventClock::new(s.clone()));
        let marker = {
            let clock = Arc::clone(&clock);
            let s = s.clone();
            std::thread::spawn(move || {
                let mut tokens = Vec::new();
                for _ in 0..100 {
                    tokens.extend(clock.mark());
                    s.enqueue(us(10));
                }
                tokens
            })
        };
        let tokens = marker.join().unwrap();
        s.synchronize();
        let mut last = 0;
        for t in tokens {
            let Resolved::At(ns) = clock.resolve(t) else {
                panic!("resolved after synchronize")
            };
            assert!(ns >= last);
            last = ns;
            clock.release(t);
        }
        assert_eq!(clock.dropped(), 0);
    }
}
