//! The hot path: recorders, guards and the per-thread buffers they fill.
//!
//! ```text
//! Recorder::section(..) ── level gate (one relaxed load) ── Clock::mark ── Lane::push (bounded)
//!                                                                            │ drained by
//!                                                                            ▼
//!                                                                      crate::worker
//! ```

pub(crate) mod graph;
mod lane;
pub(crate) mod mark;
mod recorder;
mod ring;

pub use graph::{CapturedGraph, GraphCapture, ReplayGuard};
pub(crate) use lane::Lane;
pub use recorder::{
    PartGuard, Recorder, RecorderOptions, RoundGuard, RoundRef, SectionGuard, StepGuard,
};

use crate::timing::Clock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16};
use std::sync::{Arc, Mutex};

/// State shared by the profiler handle, its recorders and the worker.
pub(crate) struct Shared {
    /// `Level::as_u8`; 0 = off. The first gate of every hot-path call.
    pub(crate) level: AtomicU8,
    /// `SpecLevel::as_u8`.
    pub(crate) spec_level: AtomicU8,
    pub(crate) trace_every: u64,
    pub(crate) expert_counter: bool,
    pub(crate) queue: usize,
    pub(crate) rank: u32,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) lanes: Mutex<Vec<Arc<Lane>>>,
    pub(crate) next_lane: AtomicU16,
    /// Set once a `tracing` layer is installed: sampled steps then carry the current span.
    pub(crate) tracing_parent: AtomicBool,
    /// Read one CUDA-graph replay in N (`PHASETRACE_GRAPH_READ_EVERY`); 0 reads none.
    pub(crate) graph_read_every: u64,
    /// Captured graphs, for the worker.
    pub(crate) graphs: graph::Registry,
}
