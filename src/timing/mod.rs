//! Where boundary times come from.
//!
//! ```text
//! hot path                         worker
//! Clock::mark() -> Token  ───────> Clock::resolve(Token) -> Resolved::At(ns) | Pending | Failed
//! ```
//!
//! Every clock hands the hot path a [`Token`]: a `Copy` word, resolved on the worker to a time on
//! one process timeline ([`now_ns`], nanoseconds since the process-wide epoch). The
//! [`HostClock`]'s token is a raw reading of the host source, the invariant TSC where the CPU has
//! one (see [`host_source`]), converted to nanoseconds on the worker; the [`SyncClock`]'s already
//! *is* the time; a deferred clock (CUDA events, the simulated stream of `phasetrace-sim`) hands
//! out a handle that the worker resolves later, off the hot path. The core has one code path for
//! all of them: it always asks the clock to resolve.
//!
//! An engine's stream comes in through one trait, [`EngineStream`]: the profiler asks it for the
//! clock the timing setting selects. The CUDA stream implements it (feature `cuda`), the
//! simulated stream in `phasetrace-sim` does, and so can an engine's own GPU abstraction, with
//! a [`TokenPool`] of its events for a deferred clock.
//!
//! Every clock resolves to [`now_ns`]: the sync clock reads it after synchronizing, the simulated
//! stream schedules its device on it, and the CUDA event clock anchors GPU timestamps to it. So a
//! step's spans from different clocks (a host section inside a synchronized one, say) nest as the
//! engine ran them.

mod host;
mod pool;
mod sync;
mod timeline;
mod tsc;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use host::HostClock;
pub use pool::TokenPool;
pub use sync::{StreamSync, SyncClock};
pub use timeline::{
    HostClockError, HostClockInfo, HostSource, HostSourceReason, choose_host_source, host_source,
    monotonic_ns, now_ns, to_system_time,
};

pub(crate) use host::is_host;
pub(crate) use timeline::{Conversion, HostReader, maintain};

use crate::config::Timing;
use std::sync::Arc;

/// A timestamp token returned by [`Clock::mark`]: either a time or a handle, as the clock decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Token(pub u64);

/// What a clock says about a token on the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// The boundary happened at this many nanoseconds after the process epoch ([`now_ns`]).
    At(u64),
    /// Not known yet (the GPU has not reached the event): ask again later.
    Pending,
    /// The token can never be resolved (event error, unknown handle); the record is dropped and
    /// counted under `reason="clock"`.
    Failed,
}

/// A source of boundary times.
///
/// `mark` runs on the engine's thread at every boundary and must return quickly; it may return
/// `None` when it cannot produce a token (an event pool is exhausted), and the core then drops the
/// record and counts it. `resolve` runs on the background worker. Tokens of one clock resolve in
/// the order they were marked, so the worker stops at the first `Pending` token of a thread.
pub trait Clock: std::any::Any + Send + Sync {
    /// Takes a timestamp token at a boundary. Must never panic; should never block (the
    /// [`SyncClock`] blocks by design: that is its semantics).
    fn mark(&self) -> Option<Token>;

    /// Turns a token into a time on the host timeline. Called on the worker only.
    fn resolve(&self, token: Token) -> Resolved;

    /// Gives the token's resources back (a pooled event) once the worker is done with it.
    fn release(&self, _token: Token) {}

    /// Takes a token while the engine's stream is being captured into a CUDA graph, for a
    /// boundary that must be timed every time the graph is replayed.
    ///
    /// The event clocks record their pooled event *into the graph* (CUDA:
    /// `cuEventRecordWithFlags(.., CU_EVENT_RECORD_EXTERNAL)`), so every launch of the graph
    /// records it again; the token then stands for "this boundary in the latest replay", and the
    /// worker reads it once per replay (see [`crate::Recorder::begin_capture`]). Clocks that
    /// cannot time work inside a graph (host, sync) return `None` (the default), and the
    /// recorder counts the drop. Must never panic or block.
    fn mark_captured(&self) -> Option<Token> {
        None
    }

    /// Whether tokens are handles resolved later (`true`) or already times (`false`).
    fn is_deferred(&self) -> bool {
        false
    }

    /// Which backend this clock is: the `PHASETRACE_TIMING` value it serves and the
    /// `phasetrace.timing` attribute of the spans it times. A clock given in code must be the
    /// backend the timing setting selects.
    fn timing(&self) -> Timing;

    /// Records dropped inside the clock so far (pool exhausted, event errors, graph capture).
    fn dropped(&self) -> u64 {
        0
    }
}

/// An engine's stream (a CUDA stream, the simulated one, an engine's own GPU abstraction), whose
/// clock the timing setting picks when the profiler is built: pass it with
/// [`ProfilerBuilder::with_stream`](crate::ProfilerBuilder::with_stream).
///
/// With `PHASETRACE_TIMING=host` the stream is not asked (the host clock times the host side of
/// each boundary). For `sync` and `events` it returns its clock of that backend, or why it has
/// none (no driver, say), which `build()` reports as [`Error::Timing`](crate::Error::Timing)
/// naming the variable.
pub trait EngineStream: Send + Sync + 'static {
    /// The clock of the `timing` backend on this stream; its [`Clock::timing`] must be `timing`.
    /// Called once, by `build()`, off the hot path.
    fn clock(
        &self,
        timing: Timing,
    ) -> Result<Arc<dyn Clock>, Box<dyn std::error::Error + Send + Sync>>;
}
