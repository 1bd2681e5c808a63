//! A decoder written with candle the way an engine team writes one (embedding; per layer
//! RMSNorm, attention with RoPE, grouped-query heads and a KV cache, a SwiGLU MLP or an MoE
//! block with a router, top-k routing, routed experts and a shared expert; final norm, LM head,
//! greedy sampling), tensor-parallel over ranks that are threads of one process or processes
//! meeting through an [`AllReduce`], with speculative decoding,
//! and instrumented with phasetrace's public API only: the reference integration
//! (`docs/engine.md`).
//!
//! The files, in the order one step runs through them (`docs/engine.md` walks it):
//!
//! ```text
//! options.rs, workload.rs   what a run is asked (RunOptions, Workload) and gives (RunOutput)
//! rank.rs      generate: a thread per rank ─> Model::load(shard) ─> the rank's loop
//! queue.rs     each step boundary: the batch (requests admitted, begun, ended; or one sequence)
//! step.rs      a plain step: rec.step_of(kind), serve per request, forward_batch
//! round.rs     a speculative round: draft, verify (the step), accept, rollback, maint
//! model.rs     the forward pass: sections per layer, all-reduces, sampling
//! instrument.rs  Ctx: the one place a section opens around the work (rec.section)
//! collective.rs  the all-reduce the ranks meet at (threads; processes through AllReduce)
//! config.rs, weights.rs     the shapes, and the weights (random or a checkpoint)
//! ```
//!
//! The model runs on any candle [`Device`](candle_core::Device) given in
//! [`RunOptions::device`]; the CPU is the default.

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

pub mod collective;
pub mod config;
mod instrument;
pub mod model;
mod options;
mod queue;
mod rank;
mod round;
mod step;
pub mod weights;
pub mod workload;

pub use collective::AllReduce;
pub use config::{Layout, ModelConfig};
pub use instrument::{Ctx, EngineSections};
pub use options::{Draft, RunOptions, RunOutput, Spec, checksum, prompt};
pub use rank::{generate, generate_rank};
pub use workload::{Served, Workload};

/// What can go wrong building or running the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Shapes or options that cannot work; the message names which and why.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// A checkpoint directory that cannot be read.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A candle operation failed (a shape mismatch, a missing tensor, a device error).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// A section name could not be registered.
    #[error("phasetrace: {0}")]
    Vocab(#[from] phasetrace::VocabError),
    /// The profiler refused a registration (the requests' kind).
    #[error("phasetrace: {0}")]
    Profiler(#[from] phasetrace::Error),
    /// A rank thread panicked.
    #[error("rank {0} panicked")]
    RankPanicked(usize),
    /// A rank generated other tokens than rank 0 (the all-reduce is broken).
    #[error("rank {0} generated other tokens than rank 0")]
    RanksDisagree(usize),
}
