//! The synchronizing backend on a CUDA stream.

use super::{CurrentCtx, Handles, TimingError, probe};
use crate::timing::{Clock, Resolved, StreamSync, SyncClock, Token};
use cudarc::driver::{CudaStream, sys};
use std::sync::Arc;

/// `cuStreamSynchronize` on one stream, as a [`StreamSync`].
pub struct CudaStreamSync {
    handles: Handles,
    /// Keeps a cudarc stream (and its context) alive; `None` for a borrowed raw stream.
    _owner: Option<Arc<CudaStream>>,
}

impl std::fmt::Debug for CudaStreamSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStreamSync")
            .field("stream", &self.handles.stream)
            .finish_non_exhaustive()
    }
}

impl CudaStreamSync {
    /// Synchronizes a cudarc stream. Checks for the driver first.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, TimingError> {
        probe()?;
        Ok(Self {
            handles: Handles::of(&stream),
            _owner: Some(stream),
        })
    }

    /// Synchronizes a stream the engine owns.
    ///
    /// # Safety
    ///
    /// `stream` must be a valid `CUstream` (or the null / per-thread default stream, resolved in
    /// the context current on the calling thread now), and the engine must keep the stream and
    /// its context alive for as long as this value exists.
    pub unsafe fn from_raw_stream(stream: sys::CUstream) -> Result<Self, TimingError> {
        // SAFETY: forwarded to the caller.
        let handles = unsafe { Handles::of_raw(stream) }?;
        Ok(Self {
            handles,
            _owner: None,
        })
    }
}

impl StreamSync for CudaStreamSync {
    fn synchronize(&self) -> Result<(), String> {
        // SAFETY: the handles are live (owned through `_owner`, or vouched for by the caller of
        // `from_raw_stream`); the guard pops the context again if it had to push it.
        unsafe {
            let _ctx = CurrentCtx::push(self.handles.ctx).map_err(|e| e.to_string())?;
            sys::cuStreamSynchronize(self.handles.stream)
                .result()
                .map_err(|e| e.to_string())
        }
    }
}

/// Synchronizes the engine's CUDA stream at every boundary, then reads the host clock.
///
/// The CUDA form of [`SyncClock`]: exact walls of device work per section, at the price of
/// serializing the stream at every boundary (the host cannot run ahead of the GPU), so a profiled
/// run's throughput is not a serving figure. A failed synchronize is counted in
/// [`CudaSyncClock::sync_errors`] and the boundary is still timed.
#[derive(Debug)]
pub struct CudaSyncClock {
    inner: SyncClock<CudaStreamSync>,
}

impl CudaSyncClock {
    /// On a cudarc stream. Returns [`TimingError::CudaUnavailable`] without a usable driver.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, TimingError> {
        Ok(Self {
            inner: SyncClock::new(CudaStreamSync::new(stream)?),
        })
    }

    /// On a stream the engine owns (for example the `cudaStream_t` of a C++ engine, which is the
    /// same handle as a `CUstream`). Returns [`TimingError::CudaUnavailable`] without a usable
    /// driver, before the handle is used.
    ///
    /// # Safety
    ///
    /// `stream` must be a valid `CUstream` (or the null / per-thread default stream, whose
    /// context is the one current on the calling thread now), and the engine must keep the
    /// stream and its context alive for as long as the clock exists.
    pub unsafe fn from_raw_stream(stream: sys::CUstream) -> Result<Self, TimingError> {
        Ok(Self {
            // SAFETY: forwarded to the caller.
            inner: SyncClock::new(unsafe { CudaStreamSync::from_raw_stream(stream) }?),
        })
    }

    /// How many `cuStreamSynchronize` calls have failed.
    pub fn sync_errors(&self) -> u64 {
        self.inner.sync_errors()
    }
}

impl Clock for CudaSyncClock {
    fn mark(&self) -> Option<Token> {
        self.inner.mark()
    }

    fn resolve(&self, token: Token) -> Resolved {
        self.inner.resolve(token)
    }

    fn timing(&self) -> crate::config::Timing {
        crate::config::Timing::Sync
    }

    fn dropped(&self) -> u64 {
        self.inner.dropped()
    }
}
