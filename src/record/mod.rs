//! The hot path: recorders, guards and the per-thread buffers they fill.
//!
//! ```text
//! Recorder::section(..) ── level gate (one relaxed load) ── Clock::mark ── Lane::push (bounded)
//!                                                                            │ drained by
//!                                                                            ▼
//!                                                                      crate::worker
//! ```

mod lane;
pub(crate) mod mark;
mod recorder;
mod ring;

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
    /// The speculative level is off because nobody set it: the first round recorded says so
    /// once on stderr (and clears this).
    pub(crate) spec_off_hint: AtomicBool,
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
            eprintln!(
                "phasetrace: a speculative round was begun but {} is off (its default), so \
                 rounds record nothing: set {}=phases or verify, or \
                 ProfilerBuilder::with_spec_level (said once)",
                crate::names::env::SPEC_LEVEL,
                crate::names::env::SPEC_LEVEL
            );
        }
    }
}
