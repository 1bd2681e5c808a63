//! The hot path: recorders, guards and the per-thread buffers they fill.
//!
//! ```text
//! Recorder::section(..) ── level gate (one relaxed load) ── Clock::mark ── Lane::push (bounded)
//!                                                                            │ drained by
//!                                                                            ▼
//!                                                                      crate::worker
//! ```

mod begun;
pub mod current;
#[cfg(feature = "tracing")]
mod engine_span;
pub(crate) mod engine_state;
pub(crate) mod graph;
mod lane;
pub(crate) mod mark;
mod recorder;
pub(crate) mod request;
mod ring;
mod sampling;

pub use graph::{CapturedGraph, GraphCapture, ReplayGuard};
pub(crate) use lane::Lane;
pub use mark::RoundRef;
pub use recorder::{PartGuard, Recorder, RecorderOptions, RoundGuard, SectionGuard, StepGuard};
pub use request::{ErrorType, Finish, RequestClass, RequestKind};
pub(crate) use sampling::Sampling;

use crate::config::{SectionLevel, SpecLevel};
use crate::timing::Clock;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// A level that fits one atomic byte.
pub(crate) trait GateLevel: Copy {
    fn to_u8(self) -> u8;
    fn from_u8(v: u8) -> Self;
}

impl GateLevel for SectionLevel {
    #[inline]
    fn to_u8(self) -> u8 {
        self.as_u8()
    }
    #[inline]
    fn from_u8(v: u8) -> Self {
        SectionLevel::from_u8(v)
    }
}

impl GateLevel for SpecLevel {
    #[inline]
    fn to_u8(self) -> u8 {
        self.as_u8()
    }
    #[inline]
    fn from_u8(v: u8) -> Self {
        SpecLevel::from_u8(v)
    }
}

/// A level changed at run time and read by every hot-path call: one relaxed byte load, read
/// back as the level's enum.
pub(crate) struct Gate<L>(AtomicU8, PhantomData<L>);

impl<L: GateLevel> Gate<L> {
    pub(crate) fn new(level: L) -> Self {
        Gate(AtomicU8::new(level.to_u8()), PhantomData)
    }

    #[inline]
    pub(crate) fn load(&self) -> L {
        L::from_u8(self.0.load(Relaxed))
    }

    pub(crate) fn store(&self, level: L) {
        self.0.store(level.to_u8(), Relaxed);
    }
}

/// State shared by the profiler handle, its recorders and the worker.
pub(crate) struct Shared {
    /// The first gate of every hot-path call.
    pub(crate) level: Gate<SectionLevel>,
    /// The gate of speculative rounds and verify parts.
    pub(crate) spec_level: Gate<SpecLevel>,
    /// Which steps, rounds, requests and replays are traced, and which read the engine's span.
    pub(crate) sampling: Sampling,
    pub(crate) queue: usize,
    pub(crate) rank: u32,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) lanes: Mutex<Vec<Arc<Lane>>>,
    pub(crate) next_lane: AtomicU16,
    /// Read one CUDA-graph replay in N (`PHASETRACE_GRAPH_READ_EVERY`); 0 reads none.
    pub(crate) graph_read_every: u64,
    /// Captured graphs, for the worker.
    pub(crate) graphs: graph::Registry,
    /// The request kinds registered with `Profiler::request_kind`.
    pub(crate) kinds: request::Kinds,
    /// The speculative level is off because nobody set it: the first round recorded says so
    /// once on stderr (and clears this).
    pub(crate) spec_off_hint: AtomicBool,
    /// The engine's KV cache, prefix cache and preemptions, as last reported
    /// (`Recorder::kv_cache`, ...), read by the observable instruments.
    pub(crate) engine: Arc<engine_state::EngineState>,
}

impl Shared {
    /// A round was begun while the speculative level is off.
    #[inline]
    pub(crate) fn round_while_spec_off(&self) {
        if self
            .spec_off_hint
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.warn_spec_off();
        }
    }

    #[cold]
    fn warn_spec_off(&self) {
        if self
            .spec_off_hint
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            crate::diag::notice!(
                "a speculative round was begun but {} is off (its default), so \
                 rounds record nothing: set {}=phases or verify, or \
                 ProfilerBuilder::with_spec_level (said once)",
                crate::names::env::SPEC_LEVEL,
                crate::names::env::SPEC_LEVEL
            );
        }
    }
}
