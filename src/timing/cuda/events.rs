//! The event backend (documented in the parent module).

use super::{CurrentCtx, Handles, TimingError, is_capture_error, probe};
use crate::timing::pool::TokenPool;
use crate::timing::{Clock, Resolved, Token, now_ns};
use cudarc::driver::{CudaStream, DriverError, sys};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Events pooled by default: far more than the boundaries a few decode steps produce before the
/// worker resolves them.
pub const DEFAULT_POOL_SIZE: usize = 4096;
/// The most events a pool may hold.
pub const MAX_POOL_SIZE: usize = 1 << 20;
/// How often the worker re-anchors by default.
pub const DEFAULT_REANCHOR_EVERY: Duration = Duration::from_secs(1);
/// Anchor measurements tried per anchoring; the tightest bracket wins.
pub const ANCHOR_TRIES: usize = 4;
/// A bracket this tight (half-width) ends the anchoring early.
const ANCHOR_GOOD_ENOUGH_NS: u64 = 5_000;
/// Shortest baseline between anchors for a rate estimate.
const RATE_MIN_BASELINE_NS: f64 = 0.5e9;
/// Rate estimates further than this from 1 are rejected as noise.
const RATE_MAX_DEVIATION: f64 = 1e-3;

/// Settings of a [`CudaEventClock`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaEventClockOptions {
    /// Events in the pool ([`DEFAULT_POOL_SIZE`]; clamped to `1..=`[`MAX_POOL_SIZE`]). All are
    /// created up front; an exhausted pool drops marks (counted), it never grows or blocks.
    pub pool_size: usize,
    /// How often the worker re-anchors the GPU timeline to the host's ([`DEFAULT_REANCHOR_EVERY`]).
    pub reanchor_every: Duration,
    /// Check `cuStreamIsCapturing` at every mark and skip marks during graph capture (default
    /// `true`). Only turn it off for engines that never capture the stream.
    pub detect_capture: bool,
}

impl Default for CudaEventClockOptions {
    fn default() -> Self {
        Self {
            pool_size: DEFAULT_POOL_SIZE,
            reanchor_every: DEFAULT_REANCHOR_EVERY,
            detect_capture: true,
        }
    }
}

impl CudaEventClockOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`CudaEventClockOptions::pool_size`].
    pub fn pool_size(mut self, events: usize) -> Self {
        self.pool_size = events;
        self
    }

    /// Sets [`CudaEventClockOptions::reanchor_every`].
    pub fn reanchor_every(mut self, interval: Duration) -> Self {
        self.reanchor_every = interval;
        self
    }

    /// Sets [`CudaEventClockOptions::detect_capture`].
    pub fn detect_capture(mut self, on: bool) -> Self {
        self.detect_capture = on;
        self
    }
}

/// The state of a [`CudaEventClock`]'s anchor, for diagnostics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AnchorInfo {
    /// Host time of the current anchor, on the [`now_ns`] timeline.
    pub host_ns: u64,
    /// Half-width of the bracket the anchor was measured in.
    pub uncertainty_ns: u64,
    /// Host nanoseconds per GPU nanosecond in use (1.0 until two anchors are far enough apart).
    pub rate: f64,
    /// Successful re-anchorings since creation.
    pub reanchors: u64,
    /// Failed re-anchoring attempts (the previous anchor stays in use).
    pub failures: u64,
}

/// A CUDA event handle that may cross threads.
#[derive(Clone, Copy, Debug)]
struct Ev(sys::CUevent);

// SAFETY: CUDA events are driver handles usable from any thread; the driver synchronizes.
unsafe impl Send for Ev {}
// SAFETY: as above; the handle itself is never mutated through a shared reference.
unsafe impl Sync for Ev {}

struct Anchor {
    ev: Ev,
    host_ns: u64,
    uncertainty_ns: u64,
    taken: Instant,
}

struct AnchorState {
    current: Anchor,
    /// Scratch events for the next measurement (best so far, and the one being tried).
    best: Ev,
    trial: Ev,
    rate: f64,
    reanchors: u64,
    failures: u64,
}

/// Destroys what it holds unless disarmed: makes construction leak-free on every error path.
struct Resources {
    ctx: sys::CUcontext,
    events: Vec<Ev>,
    private: sys::CUstream,
}

impl Resources {
    fn new_event(&mut self) -> Result<Ev, TimingError> {
        let mut ev = ptr::null_mut();
        // SAFETY: `ev` is a valid out-pointer; the context is current (the caller's guard).
        // CU_EVENT_DEFAULT keeps timing on (cudarc's `new_event(None)` would disable it).
        unsafe { sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DEFAULT as u32) }
            .result()
            .map_err(|e| TimingError::driver("cuEventCreate", e))?;
        self.events.push(Ev(ev));
        Ok(Ev(ev))
    }
}

impl Drop for Resources {
    fn drop(&mut self) {
        if self.events.is_empty() && self.private.is_null() {
            return;
        }
        // SAFETY: the context outlives the clock (owned or vouched for); the handles were created
        // here and are destroyed once. Destroying an event or stream with work pending is allowed:
        // the driver frees it when the work completes.
        unsafe {
            let _ctx = CurrentCtx::push(self.ctx);
            for ev in self.events.drain(..) {
                let _ = sys::cuEventDestroy_v2(ev.0);
            }
            if !self.private.is_null() {
                let _ = sys::cuStreamDestroy_v2(self.private);
                self.private = ptr::null_mut();
            }
        }
    }
}

/// Sets this thread's stream-capture mode for a scope (`cuThreadExchangeStreamCaptureMode`).
struct CaptureModeGuard {
    previous: Option<sys::CUstreamCaptureMode>,
}

impl CaptureModeGuard {
    fn thread_local() -> Self {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: `mode` is a valid in/out pointer.
        let ok = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }
            .result()
            .is_ok();
        Self {
            previous: ok.then_some(mode),
        }
    }
}

impl Drop for CaptureModeGuard {
    fn drop(&mut self) {
        if let Some(mut mode) = self.previous {
            // SAFETY: restores the mode this guard replaced.
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}

/// Records one anchor measurement into `ev` on the idle private stream.
///
/// # Safety
///
/// The handles are live and the context is current.
unsafe fn measure(private: sys::CUstream, ev: Ev) -> Result<(u64, u64), DriverError> {
    let t0 = now_ns();
    // SAFETY: forwarded to the caller.
    unsafe {
        sys::cuEventRecord(ev.0, private).result()?;
        sys::cuEventSynchronize(ev.0).result()?;
    }
    let t1 = now_ns();
    let half = (t1 - t0) / 2;
    Ok((t0 + half, half))
}

/// Measures an anchor up to [`ANCHOR_TRIES`] times; leaves the best one in `*best` and returns its
/// `(host_ns, uncertainty_ns)`.
///
/// # Safety
///
/// As [`measure`].
unsafe fn take_anchor(
    private: sys::CUstream,
    best: &mut Ev,
    trial: &mut Ev,
) -> Result<(u64, u64), DriverError> {
    // SAFETY: forwarded to the caller.
    let mut found = unsafe { measure(private, *best) }?;
    for _ in 1..ANCHOR_TRIES {
        if found.1 <= ANCHOR_GOOD_ENOUGH_NS {
            break;
        }
        // SAFETY: forwarded to the caller.
        let m = unsafe { measure(private, *trial) }?;
        if m.1 < found.1 {
            std::mem::swap(best, trial);
            found = m;
        }
    }
    Ok(found)
}

/// Device milliseconds from `a` to `b`, both complete.
///
/// # Safety
///
/// Both are live timing-enabled events of the current context.
unsafe fn elapsed_ms(a: Ev, b: Ev) -> Result<f32, DriverError> {
    let mut ms = 0f32;
    // SAFETY: forwarded to the caller; `ms` is a valid out-pointer.
    unsafe { sys::cuEventElapsedTime(&mut ms, a.0, b.0) }.result()?;
    Ok(ms)
}

/// The event backend on a CUDA stream: a deferred [`Clock`].
///
/// See the [`cuda` module docs](super) for how boundaries are timed, anchored to the host
/// timeline, and skipped during graph capture.
pub struct CudaEventClock {
    handles: Handles,
    private: sys::CUstream,
    pool: TokenPool<Ev>,
    anchor: Mutex<AnchorState>,
    reanchor_every: Duration,
    detect_capture: bool,
    dropped: AtomicU64,
    pool_exhausted: AtomicU64,
    captured: AtomicU64,
    graph_marks: AtomicU64,
    record_errors: AtomicU64,
    query_errors: AtomicU64,
    /// Owns every event and the private stream; destroys them on drop.
    _resources: Resources,
    /// Keeps a cudarc stream (and its context) alive; `None` for a borrowed raw stream. Declared
    /// last so it drops after `resources`.
    _owner: Option<Arc<CudaStream>>,
}

// SAFETY: the raw handles (`private`, the ones in `resources`) are driver handles usable from any
// thread; all mutable state is atomic or behind the mutex.
unsafe impl Send for CudaEventClock {}
// SAFETY: as above.
unsafe impl Sync for CudaEventClock {}

impl std::fmt::Debug for CudaEventClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEventClock")
            .field("stream", &self.handles.stream)
            .field("pool_size", &self.pool_size())
            .field("in_flight", &self.in_flight())
            .field("dropped", &self.dropped())
            .field("anchor", &self.anchor_info())
            .finish_non_exhaustive()
    }
}

impl CudaEventClock {
    /// On a cudarc stream, with the default options. Returns [`TimingError::CudaUnavailable`]
    /// without a usable driver.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, TimingError> {
        Self::with_options(stream, CudaEventClockOptions::default())
    }

    /// On a cudarc stream.
    pub fn with_options(
        stream: Arc<CudaStream>,
        options: CudaEventClockOptions,
    ) -> Result<Self, TimingError> {
        probe()?;
        Self::build(Handles::of(&stream), Some(stream), &options)
    }

    /// On a stream the engine owns (for example a C++ engine's `cudaStream_t`, the same handle as
    /// a `CUstream`), with the default options. Returns [`TimingError::CudaUnavailable`] without
    /// a usable driver, before the handle is used.
    ///
    /// # Safety
    ///
    /// `stream` must be a valid `CUstream`, or the null / per-thread default stream, whose context
    /// is the one current on the calling thread now (and marks must then come from threads where
    /// that context is current). The engine must keep the stream and its context alive for as
    /// long as the clock exists.
    pub unsafe fn from_raw_stream(stream: sys::CUstream) -> Result<Self, TimingError> {
        // SAFETY: forwarded to the caller.
        unsafe { Self::from_raw_stream_with(stream, CudaEventClockOptions::default()) }
    }

    /// [`CudaEventClock::from_raw_stream`] with options.
    ///
    /// # Safety
    ///
    /// As [`CudaEventClock::from_raw_stream`].
    pub unsafe fn from_raw_stream_with(
        stream: sys::CUstream,
        options: CudaEventClockOptions,
    ) -> Result<Self, TimingError> {
        // SAFETY: forwarded to the caller.
        let handles = unsafe { Handles::of_raw(stream) }?;
        Self::build(handles, None, &options)
    }

    fn build(
        handles: Handles,
        owner: Option<Arc<CudaStream>>,
        options: &CudaEventClockOptions,
    ) -> Result<Self, TimingError> {
        // SAFETY: the context is live (owned through `owner`, or vouched for by the caller).
        let _ctx = unsafe { CurrentCtx::push(handles.ctx) }
            .map_err(|e| TimingError::driver("cuCtxPushCurrent", e))?;
        let _mode = CaptureModeGuard::thread_local();

        // Validate the stream handle (capture status itself does not matter here).
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream is live; `status` is a valid out-pointer.
        match unsafe { sys::cuStreamIsCapturing(handles.stream, &mut status) }.result() {
            Ok(()) => {}
            Err(e) if is_capture_error(e) => {}
            Err(e) => return Err(TimingError::driver("cuStreamIsCapturing", e)),
        }

        let n = options.pool_size.clamp(1, MAX_POOL_SIZE);
        let mut res = Resources {
            ctx: handles.ctx,
            events: Vec::with_capacity(n + 3),
            private: ptr::null_mut(),
        };
        // SAFETY: `private` is a valid out-pointer; the context is current.
        unsafe {
            sys::cuStreamCreate(
                &mut res.private,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        }
        .result()
        .map_err(|e| TimingError::driver("cuStreamCreate", e))?;

        let mut events = Vec::with_capacity(n);
        for _ in 0..n {
            events.push(res.new_event()?);
        }
        let mut current = res.new_event()?;
        let mut spare = res.new_event()?;
        let trial = res.new_event()?;
        // SAFETY: the events and the private stream were just created in the current context.
        let (host_ns, uncertainty_ns) =
            unsafe { take_anchor(res.private, &mut current, &mut spare) }
                .map_err(|e| TimingError::driver("cuEventSynchronize", e))?;

        Ok(Self {
            handles,
            private: res.private,
            pool: TokenPool::new(events),
            anchor: Mutex::new(AnchorState {
                current: Anchor {
                    ev: current,
                    host_ns,
                    uncertainty_ns,
                    taken: Instant::now(),
                },
                best: spare,
                trial,
                rate: 1.0,
                reanchors: 0,
                failures: 0,
            }),
            reanchor_every: options.reanchor_every,
            detect_capture: options.detect_capture,
            dropped: AtomicU64::new(0),
            pool_exhausted: AtomicU64::new(0),
            captured: AtomicU64::new(0),
            graph_marks: AtomicU64::new(0),
            record_errors: AtomicU64::new(0),
            query_errors: AtomicU64::new(0),
            _resources: res,
            _owner: owner,
        })
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

    /// Marks dropped because of graph capture: a plain `mark` during a capture (use
    /// [`crate::Recorder::begin_capture`] to time inside graphs), or a captured mark on a stream
    /// that was not in an active capture.
    pub fn captured(&self) -> u64 {
        self.captured.load(Ordering::Relaxed)
    }

    /// Events recorded into CUDA graphs with `CU_EVENT_RECORD_EXTERNAL` (timed at every replay).
    pub fn graph_marks(&self) -> u64 {
        self.graph_marks.load(Ordering::Relaxed)
    }

    /// Marks dropped because recording the event failed.
    pub fn record_errors(&self) -> u64 {
        self.record_errors.load(Ordering::Relaxed)
    }

    /// Tokens that resolved as `Failed` because a query or elapsed-time call failed.
    pub fn query_errors(&self) -> u64 {
        self.query_errors.load(Ordering::Relaxed)
    }

    /// The current anchor.
    pub fn anchor_info(&self) -> AnchorInfo {
        let st = self.anchor.lock().unwrap_or_else(PoisonError::into_inner);
        AnchorInfo {
            host_ns: st.current.host_ns,
            uncertainty_ns: st.current.uncertainty_ns,
            rate: st.rate,
            reanchors: st.reanchors,
            failures: st.failures,
        }
    }

    fn drop_mark(&self, index: u32, counter: &AtomicU64) -> Option<Token> {
        self.pool.cancel(index);
        counter.fetch_add(1, Ordering::Relaxed);
        self.dropped.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Whether the engine's stream is being captured (errors about capture count as capturing).
    ///
    /// # Safety
    ///
    /// The stream is live.
    unsafe fn capturing(&self) -> Result<bool, DriverError> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: forwarded to the caller; `status` is a valid out-pointer.
        match unsafe { sys::cuStreamIsCapturing(self.handles.stream, &mut status) }.result() {
            Ok(()) => Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE),
            Err(e) if is_capture_error(e) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Re-anchors when the anchor is older than the interval. Errors keep the old anchor.
    ///
    /// # Safety
    ///
    /// The context is current.
    unsafe fn maybe_reanchor(&self, st: &mut AnchorState) {
        if st.current.taken.elapsed() < self.reanchor_every {
            return;
        }
        // SAFETY: forwarded to the caller; the events and the private stream are ours.
        let measured = unsafe { take_anchor(self.private, &mut st.best, &mut st.trial) };
        let (host_ns, uncertainty_ns) = match measured {
            Ok(m) => m,
            Err(_) => {
                st.failures += 1;
                st.current.taken = Instant::now();
                return;
            }
        };
        // SAFETY: both anchors are complete timing events of this context.
        if let Ok(ms) = unsafe { elapsed_ms(st.current.ev, st.best) } {
            let device_ns = f64::from(ms) * 1e6;
            let host_delta = host_ns as f64 - st.current.host_ns as f64;
            if device_ns >= RATE_MIN_BASELINE_NS {
                let rate = host_delta / device_ns;
                if (rate - 1.0).abs() <= RATE_MAX_DEVIATION {
                    st.rate = rate;
                }
            }
        }
        std::mem::swap(&mut st.current.ev, &mut st.best);
        st.current.host_ns = host_ns;
        st.current.uncertainty_ns = uncertainty_ns;
        st.current.taken = Instant::now();
        st.reanchors += 1;
    }
}

impl Clock for CudaEventClock {
    fn mark(&self) -> Option<Token> {
        let Some((index, ev)) = self.pool.acquire() else {
            self.pool_exhausted.fetch_add(1, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        // SAFETY: the stream and its context are live (owned, or vouched for by the caller of
        // `from_raw_stream`); the event is ours. The guard only pushes when the engine thread has
        // another context current, and pops it again.
        unsafe {
            let Ok(_ctx) = CurrentCtx::push(self.handles.ctx) else {
                return self.drop_mark(index, &self.record_errors);
            };
            if self.detect_capture {
                match self.capturing() {
                    Ok(false) => {}
                    Ok(true) => return self.drop_mark(index, &self.captured),
                    Err(_) => return self.drop_mark(index, &self.record_errors),
                }
            }
            if sys::cuEventRecord(ev.0, self.handles.stream)
                .result()
                .is_err()
            {
                return self.drop_mark(index, &self.record_errors);
            }
        }
        Some(self.pool.token(index))
    }

    fn mark_captured(&self) -> Option<Token> {
        let Some((index, ev)) = self.pool.acquire() else {
            self.pool_exhausted.fetch_add(1, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        // SAFETY: as in `mark`. The stream must be in an active capture: only then does the
        // external record become a node of the graph (outside one it would be a plain record).
        unsafe {
            let Ok(_ctx) = CurrentCtx::push(self.handles.ctx) else {
                return self.drop_mark(index, &self.record_errors);
            };
            let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            if sys::cuStreamIsCapturing(self.handles.stream, &mut status)
                .result()
                .is_err()
                || status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
            {
                return self.drop_mark(index, &self.captured);
            }
            if sys::cuEventRecordWithFlags(
                ev.0,
                self.handles.stream,
                sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
            )
            .result()
            .is_err()
            {
                return self.drop_mark(index, &self.record_errors);
            }
        }
        self.graph_marks.fetch_add(1, Ordering::Relaxed);
        Some(self.pool.token(index))
    }

    fn resolve(&self, token: Token) -> Resolved {
        let Some(ev) = self.pool.get(token) else {
            return Resolved::Failed;
        };
        // SAFETY: the context is live; `set` makes it current on the worker (phasetrace's own
        // thread) when it is not. Events are ours and were recorded outside any capture.
        unsafe {
            let _mode = CaptureModeGuard::thread_local();
            if CurrentCtx::set(self.handles.ctx).is_err() {
                self.query_errors.fetch_add(1, Ordering::Relaxed);
                return Resolved::Failed;
            }
            match sys::cuEventQuery(ev.0).result() {
                Ok(()) => {}
                Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => return Resolved::Pending,
                Err(e) if is_capture_error(e) => return Resolved::Pending,
                Err(_) => {
                    self.query_errors.fetch_add(1, Ordering::Relaxed);
                    return Resolved::Failed;
                }
            }
            let mut st = self.anchor.lock().unwrap_or_else(PoisonError::into_inner);
            self.maybe_reanchor(&mut st);
            let Ok(ms) = elapsed_ms(st.current.ev, *ev) else {
                self.query_errors.fetch_add(1, Ordering::Relaxed);
                return Resolved::Failed;
            };
            let t = st.current.host_ns as f64 + f64::from(ms) * 1e6 * st.rate;
            Resolved::At(if t > 0.0 { t.round() as u64 } else { 0 })
        }
    }

    fn release(&self, token: Token) {
        self.pool.release(token);
    }

    fn is_deferred(&self) -> bool {
        true
    }

    fn timing(&self) -> crate::config::Timing {
        crate::config::Timing::Events
    }

    fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
