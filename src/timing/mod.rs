//! Where boundary times come from.
//!
//! ```text
//! hot path                         worker
//! Clock::mark() -> Token  ───────> Clock::resolve(Token) -> Resolved::At(ns) | Pending | Failed
//! ```
//!
//! Every clock hands the hot path a [`Token`]: a `Copy` word. For the [`HostClock`] and the
//! [`SyncClock`] the token already *is* the time (nanoseconds since the process-wide epoch, see
//! [`now_ns`]); a deferred clock (CUDA events, the simulated stream) hands out a handle that the
//! worker resolves later, off the hot path. The core has one code path for all of them: it always
//! asks the clock to resolve, and only deferred clocks have work to do there.

mod host;
mod pool;
pub mod sim;
mod sync;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use host::HostClock;
pub use sync::{StreamSync, SyncClock};

use crate::config::Timing;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

struct Epoch {
    instant: Instant,
    unix_ns: u64,
}

fn epoch() -> &'static Epoch {
    static EPOCH: OnceLock<Epoch> = OnceLock::new();
    EPOCH.get_or_init(|| Epoch {
        instant: Instant::now(),
        // A system clock before 1970 is a broken machine; 0 keeps spans ordered anyway.
        unix_ns: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    })
}

/// Nanoseconds on the monotonic host clock since the process-wide epoch (the first call).
///
/// This is the timeline every clock resolves to. It costs one `Instant::now()` (a vDSO clock
/// read on Linux) plus a subtraction; measured: [`crate::benchmarks`].
#[inline]
pub fn now_ns() -> u64 {
    let e = epoch();
    Instant::now()
        .saturating_duration_since(e.instant)
        .as_nanos() as u64
}

/// Converts a time on the [`now_ns`] timeline into wall-clock time for span timestamps.
pub fn to_system_time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(epoch().unix_ns.saturating_add(ns))
}
