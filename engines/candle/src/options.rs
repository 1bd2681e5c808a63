//! What a run is asked to do and what it gives back, shared by every stage of the engine:
//! [`RunOptions`] (the model, the ranks, the steps, speculation, serving), [`RunOutput`] (the
//! tokens and the counts), the deterministic [`prompt`] and the token [`checksum`].

use crate::config::ModelConfig;
use crate::weights::Tensors;
use crate::workload::{Served, Workload};
use candle_core::{DType, Device};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

/// The draft model of speculative decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draft {
    /// The target's first `layers` layers, with its embedding, final norm and LM head.
    Shallow {
        /// Layers the draft runs.
        layers: usize,
    },
    /// The whole target at a lower precision (`DType::F16` or `DType::BF16`).
    Precision(DType),
}

impl std::fmt::Display for Draft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Draft::Shallow { layers } => write!(f, "shallow ({layers} layers)"),
            Draft::Precision(d) => write!(f, "the target at {d:?}"),
        }
    }
}

/// Speculative decoding: draft `k` tokens per round with `draft`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// Tokens drafted per round.
    pub k: usize,
    /// The draft model.
    pub draft: Draft,
}

/// What to generate, and how.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The model's shapes.
    pub cfg: ModelConfig,
    /// Its weights by checkpoint name (on the host; each rank takes its shard).
    pub tensors: Arc<Tensors>,
    /// Tensor-parallel ranks (threads).
    pub ranks: usize,
    /// Decode steps: forwards of the target (each sequence's prefill is one; with `spec`, one
    /// round per other step).
    pub steps: usize,
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Speculative decoding.
    pub spec: Option<Spec>,
    /// A rank that runs `factor` times the compute of the others.
    pub straggler: Option<(usize, f64)>,
    /// Where the model runs.
    pub device: Device,
    /// Counts the steps rank 0 has finished (progress for a caller's display).
    pub progress: Option<Arc<AtomicU64>>,
    /// Ends the run at the next step boundary once set (every rank at the same step).
    pub stop: Option<Arc<AtomicBool>>,
    /// Most positions a sequence holds: when the KV cache is full, a new sequence starts from
    /// the prompt (a prefill step), as a server starts its next request.
    pub context: usize,
    /// Serve a workload of requests under continuous batching instead of one endless sequence
    /// (`prompt` and `context` are then unused: each request has its own).
    pub serving: Option<Workload>,
}

impl RunOptions {
    /// `steps` steps of `cfg` with `tensors` on the CPU, one rank, no speculation.
    pub fn new(cfg: ModelConfig, tensors: Tensors, steps: usize, prompt: Vec<u32>) -> RunOptions {
        RunOptions {
            cfg,
            tensors: Arc::new(tensors),
            ranks: 1,
            steps,
            prompt,
            spec: None,
            straggler: None,
            device: Device::Cpu,
            progress: None,
            stop: None,
            context: 512,
            serving: None,
        }
    }
}

/// What a run produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunOutput {
    /// The generated token ids (after the prompt), the same on every rank.
    pub tokens: Vec<u32>,
    /// Steps run (forwards of the target).
    pub steps: usize,
    /// Speculative rounds.
    pub rounds: usize,
    /// Tokens drafted in them.
    pub drafted: usize,
    /// Drafted tokens the target accepted.
    pub accepted: usize,
    /// Wall time of the decode loop (after loading).
    pub wall: Duration,
    /// With [`RunOptions::serving`]: what happened to the requests.
    pub served: Option<Served>,
    /// With [`RunOptions::serving`]: each request's id and generated tokens, by id (`tokens`
    /// is their concatenation); a request cancelled by the run's end has what it got.
    pub requests: Vec<(u64, Vec<u32>)>,
}

impl RunOutput {
    /// Accepted over drafted tokens (0 without speculation).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Generated tokens per second.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// A deterministic prompt of `len` token ids below `vocab`.
pub fn prompt(len: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed ^ 0x5DEE_CE66_D1CE_4E5B;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab.max(1) as u64) as u32
        })
        .collect()
}

/// The FNV-1a 64-bit digest of token ids (little-endian u32 each), as 16 hex digits: equal
/// digests, equal generations.
pub fn checksum(tokens: &[u32]) -> String {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in tokens.iter().flat_map(|t| t.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    format!("{h:016x}")
}
