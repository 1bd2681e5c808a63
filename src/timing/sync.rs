//! The synchronizing clock: the reference profilers' semantics, for any engine's GPU abstraction.

use super::{Clock, Resolved, Token, now_ns};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Something that can wait until all work enqueued so far on a stream has finished.
///
/// Implemented for closures returning `Result<(), E>`, so an engine passes
/// `move || gpu.synchronize(stream)`.
pub trait StreamSync: Send + Sync + 'static {
    /// Blocks until the stream is idle. An error is counted, and the boundary is still timed.
    fn synchronize(&self) -> Result<(), String>;
}

impl<F, E> StreamSync for F
where
    F: Fn() -> Result<(), E> + Send + Sync + 'static,
    E: std::fmt::Display,
{
    fn synchronize(&self) -> Result<(), String> {
        self().map_err(|e| e.to_string())
    }
}

/// Synchronizes the engine's stream, then reads the process timeline ([`now_ns`]: the host
/// clock, converted at once since the boundary waits anyway), so that its boundaries and the host
/// clock's raw ones land on one timeline and nest.
///
/// Exact per-boundary walls of device work, at the price the reference profilers pay: every
/// boundary serializes the stream, so a profiled run's throughput is not a serving figure and its
/// numbers are shares. Use the event backend to keep profiling on in production.
pub struct SyncClock<S: StreamSync> {
    stream: S,
    sync_errors: AtomicU64,
}

impl<S: StreamSync> SyncClock<S> {
    /// Wraps the engine's synchronize call.
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            sync_errors: AtomicU64::new(0),
        }
    }

    /// How many `synchronize` calls have failed (the boundary was still timed).
    pub fn sync_errors(&self) -> u64 {
        self.sync_errors.load(Relaxed)
    }
}

impl<S: StreamSync> std::fmt::Debug for SyncClock<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncClock")
            .field("sync_errors", &self.sync_errors())
            .finish_non_exhaustive()
    }
}

impl<S: StreamSync> Clock for SyncClock<S> {
    fn mark(&self) -> Option<Token> {
        if self.stream.synchronize().is_err() {
            self.sync_errors.fetch_add(1, Relaxed);
        }
        Some(Token(now_ns()))
    }

    fn resolve(&self, token: Token) -> Resolved {
        Resolved::At(token.0)
    }

    fn timing(&self) -> crate::config::Timing {
        crate::config::Timing::Sync
    }
}
