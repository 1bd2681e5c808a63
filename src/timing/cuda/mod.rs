//! CUDA timing backends, through cudarc's driver API loaded at run time.
//!
//! - [`CudaSyncClock`]: synchronizes the engine's stream at every boundary, then reads the host
//!   clock (the reference profilers' semantics; exact, but it serializes the stream).
//! - [`CudaEventClock`]: records a pooled, timing-enabled CUDA event onto the engine's stream at
//!   every boundary without waiting; the worker polls the events and converts their GPU
//!   timestamps to the host timeline ([`now_ns`](super::now_ns), the same timeline the host
//!   clock's TSC readings are converted to) through an anchor. Cheap enough to keep on in
//!   production.
//!
//! Both wrap either a cudarc [`Arc<CudaStream>`](cudarc::driver::CudaStream) (`new`) or a raw
//! `CUstream` owned by the engine (`from_raw_stream`, `unsafe`: the engine keeps the stream and
//! its context alive).
//!
//! The driver library is opened at run time. On a machine without it (or without a usable GPU),
//! every constructor returns [`TimingError::CudaUnavailable`] and nothing panics: cudarc panics
//! when a driver function is first called without `libcuda`, so [`probe`] checks for the library
//! and every symbol these backends call before anything else touches the driver. In a build where
//! another crate has cudarc link the driver instead (candle-core's `cuda` feature selects cudarc's
//! `dynamic-linking`, which then replaces the run-time loading for the whole build), the process
//! needs `libcuda.so.1` to start at all, and the probe's checks still hold.
//!
//! # The event backend: how a boundary is timed
//!
//! ```text
//! engine thread   mark(): pop an event from the pool, cuEventRecord(ev, engine stream) -> token
//! GPU             ...kernels... [ev timestamped when the stream reaches it] ...kernels...
//! worker          resolve(token): cuEventQuery(ev) == NOT_READY -> Pending (ask again later)
//!                                  complete -> anchor.host_ns + rate * cuEventElapsedTime(anchor, ev)
//!                 release(token): the event goes back to the pool
//! ```
//!
//! `mark` never synchronizes and never waits: with the pool exhausted, or when the record fails,
//! it returns `None` and the drop is counted ([`Clock::dropped`](crate::timing::Clock::dropped)). The worker only ever *polls*
//! (`cuEventQuery`); `cuEventElapsedTime` is called once the event is known to be complete, so it
//! does not block either.
//!
//! # Anchoring to the host timeline
//!
//! CUDA event timestamps are on the GPU's timer, which has no defined relation to the host clock;
//! `cuEventElapsedTime` only gives differences between two events. The clock therefore keeps an
//! *anchor*: an event whose host time is known. It records that anchor on a **private, idle,
//! non-blocking stream** it creates in the engine's context, and synchronizes that private stream
//! (not the engine's): since the private stream has nothing queued, the GPU timestamps the event
//! as soon as it sees it, so its host time lies between the host clock read before the record and
//! after the synchronize. The midpoint is the anchor's host time and half the bracket is its
//! uncertainty (typically a few microseconds; the best of up to [`ANCHOR_TRIES`] measurements is
//! kept). Creating the clock takes the first anchor; the engine's stream is never synchronized,
//! not even at creation. Events on different streams of one context share the GPU timer, so
//! `elapsed(anchor, ev)` is valid for the engine stream's events.
//!
//! The GPU timer and the host's monotonic clock run from different oscillators and drift apart
//! (tens of parts per million is usual: tens of microseconds per second). The worker therefore
//! **re-anchors** every [`CudaEventClockOptions::reanchor_every`] (1 s by default) when it
//! resolves, and uses consecutive anchors at least half a second apart to estimate the rate
//! between the two clocks (host ns per GPU ns, accepted within ±0.1 %); times are mapped as
//! `anchor.host_ns + rate * elapsed(anchor, ev)`. The absolute error is then bounded by the
//! anchor's uncertainty plus the residual drift over one interval, and the step a re-anchor can
//! introduce between two consecutive boundaries is about the anchor uncertainty rather than the
//! accumulated drift. `cuEventElapsedTime` itself has a resolution of about 0.5 µs.
//!
//! # CUDA graphs
//!
//! A plain `cuEventRecord` during stream capture only adds a dependency to the graph (and the
//! event later fails with `CUDA_ERROR_CAPTURED_EVENT`), so a plain `mark` checks
//! `cuStreamIsCapturing` first and returns `None` during capture, counted under
//! [`CudaEventClock::captured`]. (Checking costs one cheap driver call per mark; it can be turned
//! off with [`CudaEventClockOptions::detect_capture`] for engines that never capture.)
//!
//! Sections inside a graph are timed through the capture API
//! ([`crate::Recorder::begin_capture`], [`crate::Recorder::replay`]): while a capture is open,
//! each boundary calls [`Clock::mark_captured`](crate::timing::Clock::mark_captured), which
//! records its pooled event with `cuEventRecordWithFlags(.., CU_EVENT_RECORD_EXTERNAL)`: an
//! event-record node of the graph, recorded again at every launch. The replay guard records
//! plain fence events before and after `cuGraphLaunch`; the worker reads the graph's events once
//! the fence after the launch has completed, polling only, as for any other mark.
//!
//! Polling events from the worker thread while another thread captures in the *global* capture
//! mode would be a prohibited call that invalidates that capture (the problem PyTorch's NCCL
//! watchdog had). The worker therefore switches its own thread to the thread-local capture mode
//! (`cuThreadExchangeStreamCaptureMode`) around every query, which lets a non-capturing thread
//! query events recorded outside a capture, and restores the previous mode afterwards.

mod events;
mod sync;

pub use events::{
    ANCHOR_TRIES, AnchorInfo, CudaEventClock, CudaEventClockOptions, DEFAULT_POOL_SIZE,
    DEFAULT_REANCHOR_EVERY, MAX_POOL_SIZE,
};
pub use sync::{CudaStreamSync, CudaSyncClock};

/// Re-exported so that engines can name the stream and context types without depending on cudarc.
pub use cudarc::driver::{CudaContext, CudaStream, sys::CUstream};

use cudarc::driver::{DriverError, sys};
use std::ptr;
use std::sync::{Arc, OnceLock};

/// A profiler given a cudarc stream ([`crate::ProfilerBuilder::with_stream`]) times it with
/// [`CudaSyncClock`] (`PHASETRACE_TIMING=sync`) or [`CudaEventClock`] (`events`); without a
/// usable driver `build()` fails naming the variable and [`TimingError`].
impl super::EngineStream for Arc<CudaStream> {
    fn clock(
        &self,
        timing: crate::Timing,
    ) -> Result<Arc<dyn super::Clock>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(match timing {
            crate::Timing::Host => Arc::new(super::HostClock),
            crate::Timing::Sync => Arc::new(CudaSyncClock::new(self.clone())?),
            crate::Timing::Events => Arc::new(CudaEventClock::new(self.clone())?),
        })
    }
}

/// Why a CUDA timing backend could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimingError {
    /// No usable CUDA driver: `libcuda` is missing, lacks a function these backends need, or
    /// `cuInit` failed (no device, driver/kernel-module mismatch, ...).
    #[error("CUDA is unavailable: {detail}")]
    CudaUnavailable {
        /// What the probe found.
        detail: String,
    },
    /// A driver call failed while setting the backend up.
    #[error("CUDA driver call {call} failed: {detail}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The driver's error.
        detail: String,
    },
}

impl TimingError {
    fn driver(call: &'static str, error: DriverError) -> Self {
        Self::Driver {
            call,
            detail: format!("{error}"),
        }
    }
}

/// Every driver function the backends (and [`open_device`]) call. cudarc resolves each symbol on
/// its first call and panics when it is missing, so all are checked up front.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorString",
    "cuGetErrorName",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuStreamGetCtx",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamIsCapturing",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventRecordWithFlags",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventElapsedTime",
    "cuThreadExchangeStreamCaptureMode",
];

/// The names the driver library goes by, most specific first.
#[cfg(windows)]
const DRIVER_LIBRARY: &[&str] = &["nvcuda.dll"];
#[cfg(not(windows))]
const DRIVER_LIBRARY: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// Opens the driver library by its usual names, or `None`. phasetrace's own look-up, so that the
/// probe works whether cudarc opens the driver at run time (its `dynamic-loading`, phasetrace's
/// default) or the process was linked against it (cudarc's `dynamic-linking`, which candle's
/// `cuda` feature selects for the whole build).
fn driver_library() -> Option<libloading::Library> {
    DRIVER_LIBRARY.iter().find_map(|name| {
        // SAFETY: opening the NVIDIA driver library runs only its own initializers, which have
        // no preconditions.
        unsafe { libloading::Library::new(*name) }.ok()
    })
}

/// Checks, once per process, that the CUDA driver library is present, exports every function the
/// backends call, and initializes (`cuInit(0)`). Never panics.
pub fn probe() -> Result<(), TimingError> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let Some(lib) = driver_library() else {
                return Err("the NVIDIA driver library (libcuda.so) was not found; \
                            is the NVIDIA driver installed and on the loader path?"
                    .to_owned());
            };
            for name in REQUIRED_SYMBOLS {
                // SAFETY: the symbol is only looked up, never called through this type.
                if unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err() {
                    return Err(format!(
                        "the NVIDIA driver library lacks {name} (driver too old?)"
                    ));
                }
            }
            // SAFETY: every symbol is present; cuInit has no preconditions.
            unsafe { sys::cuInit(0) }
                .result()
                .map_err(|e| format!("cuInit failed: {e}"))
        })
        .clone()
        .map_err(|detail| TimingError::CudaUnavailable { detail })
}

/// Opens device `ordinal`'s primary context through cudarc, after [`probe`]: the safe way to get a
/// context (and from it a stream) when the driver may be missing.
pub fn open_device(ordinal: usize) -> Result<Arc<CudaContext>, TimingError> {
    probe()?;
    CudaContext::new(ordinal).map_err(|e| TimingError::driver("cuDevicePrimaryCtxRetain", e))
}

/// Raw driver handles that may cross threads.
#[derive(Clone, Copy, Debug)]
struct Handles {
    ctx: sys::CUcontext,
    stream: sys::CUstream,
}

// SAFETY: CUDA driver contexts and streams are opaque handles that the driver API allows any
// thread to use (the driver synchronizes internally); these types only pass them to driver calls.
unsafe impl Send for Handles {}
// SAFETY: as above; nothing is mutated through a shared reference.
unsafe impl Sync for Handles {}

impl Handles {
    /// The handles of a cudarc stream (its context comes from the wrapper).
    fn of(stream: &CudaStream) -> Self {
        Self {
            ctx: stream.context().cu_ctx(),
            stream: stream.cu_stream(),
        }
    }

    /// The handles of a raw stream: asks the driver for the stream's context. For the legacy
    /// default stream (null) and the per-thread stream that is the calling thread's current
    /// context.
    ///
    /// # Safety
    ///
    /// `stream` must be a valid stream handle (or one of the special null / per-thread handles).
    unsafe fn of_raw(stream: sys::CUstream) -> Result<Self, TimingError> {
        probe()?;
        let mut ctx = ptr::null_mut();
        // SAFETY: the caller vouches for `stream`; `ctx` is a valid out-pointer.
        unsafe { sys::cuStreamGetCtx(stream, &mut ctx) }
            .result()
            .map_err(|e| TimingError::driver("cuStreamGetCtx", e))?;
        if ctx.is_null() {
            return Err(TimingError::Driver {
                call: "cuStreamGetCtx",
                detail: "the stream has no context (none is current on this thread)".to_owned(),
            });
        }
        Ok(Self { ctx, stream })
    }
}

/// Makes a context current on this thread for a scope, if it is not already.
struct CurrentCtx {
    pushed: bool,
}

impl CurrentCtx {
    /// Pushes `ctx` when another context (or none) is current, and pops it again on drop: leaves
    /// the engine thread's context stack as it was.
    ///
    /// # Safety
    ///
    /// `ctx` must be a live context.
    unsafe fn push(ctx: sys::CUcontext) -> Result<Self, DriverError> {
        let mut current = ptr::null_mut();
        // SAFETY: `current` is a valid out-pointer.
        unsafe { sys::cuCtxGetCurrent(&mut current) }.result()?;
        if current == ctx {
            return Ok(Self { pushed: false });
        }
        // SAFETY: the caller vouches that `ctx` is live.
        unsafe { sys::cuCtxPushCurrent_v2(ctx) }.result()?;
        Ok(Self { pushed: true })
    }

    /// Makes `ctx` current for good when it is not (for phasetrace's own worker thread, where
    /// switching once is cheaper than pushing and popping at every call).
    ///
    /// # Safety
    ///
    /// `ctx` must be a live context.
    unsafe fn set(ctx: sys::CUcontext) -> Result<Self, DriverError> {
        let mut current = ptr::null_mut();
        // SAFETY: `current` is a valid out-pointer.
        unsafe { sys::cuCtxGetCurrent(&mut current) }.result()?;
        if current != ctx {
            // SAFETY: the caller vouches that `ctx` is live.
            unsafe { sys::cuCtxSetCurrent(ctx) }.result()?;
        }
        Ok(Self { pushed: false })
    }
}

impl Drop for CurrentCtx {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped = ptr::null_mut();
            // SAFETY: pops the context this guard pushed; `popped` is a valid out-pointer.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

/// Whether a driver error is about stream capture (the call was not allowed while a stream, this
/// one or another thread's in global mode, is being captured into a CUDA graph).
fn is_capture_error(e: DriverError) -> bool {
    // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) ..= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (908),
    // CUDA_ERROR_CAPTURED_EVENT (907) included.
    (900..=908).contains(&(e.0 as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::Clock;

    /// On a machine without a driver (CI, this crate's development machine) every constructor
    /// returns `CudaUnavailable` and nothing panics; with a driver, the probe passes.
    #[test]
    fn constructors_without_a_driver_return_an_error() {
        let has_lib = driver_library().is_some();
        let probed = probe();
        if !has_lib {
            assert!(
                matches!(probed, Err(TimingError::CudaUnavailable { .. })),
                "{probed:?}"
            );
        }
        match probed {
            Err(e @ TimingError::CudaUnavailable { .. }) => {
                assert!(e.to_string().starts_with("CUDA is unavailable: "), "{e}");
                assert!(matches!(
                    open_device(0),
                    Err(TimingError::CudaUnavailable { .. })
                ));
                // SAFETY: without a driver the constructors return before using the handle.
                let sync = unsafe { CudaSyncClock::from_raw_stream(ptr::null_mut()) };
                assert!(matches!(sync, Err(TimingError::CudaUnavailable { .. })));
                // SAFETY: as above.
                let events = unsafe { CudaEventClock::from_raw_stream(ptr::null_mut()) };
                assert!(matches!(events, Err(TimingError::CudaUnavailable { .. })));
                // SAFETY: as above.
                let events = unsafe {
                    CudaEventClock::from_raw_stream_with(
                        ptr::null_mut(),
                        CudaEventClockOptions::default(),
                    )
                };
                assert!(matches!(events, Err(TimingError::CudaUnavailable { .. })));
            }
            Err(e) => panic!("the probe only reports CudaUnavailable: {e}"),
            Ok(()) => {
                // A driver is here: the clocks can be built on device 0 when it exists.
                if let Ok(ctx) = open_device(0) {
                    let stream = ctx.default_stream();
                    let sync = CudaSyncClock::new(Arc::clone(&stream)).expect("sync clock");
                    assert!(sync.mark().is_some());
                    let events = CudaEventClock::new(stream).expect("event clock");
                    assert!(events.is_deferred());
                }
            }
        }
    }

    #[test]
    fn capture_errors_are_recognized() {
        assert!(is_capture_error(DriverError(
            sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
        )));
        assert!(is_capture_error(DriverError(
            sys::CUresult::CUDA_ERROR_CAPTURED_EVENT
        )));
        assert!(!is_capture_error(DriverError(
            sys::CUresult::CUDA_ERROR_NOT_READY
        )));
    }
}
