//! The decode loop of a tensor-parallel group: one thread per rank, each with its shard, its
//! KV caches and its phasetrace recorder, meeting at every all-reduce.
//!
//! ```text
//! generate ── per rank thread ──> Model::load(shard) ──> step 0: prefill the prompt
//!                                   ├─ plain: one step per token: forward(1 token)
//!                                   └─ speculative: per round (one step: the verify)
//!                                        draft k tokens (unprofiled forwards) ── phase draft
//!                                        verify k+1 positions in one forward ── phase verify
//!                                        greedy acceptance, commit ──────────── phase accept
//!                                        truncate both KV caches (rejection) ─ phase rollback
//!                                        feed the draft the last accepted ──── phase maint
//! ```

use crate::EngineError;
use crate::collective::{AllReduce, Collective};
use crate::config::ModelConfig;
use crate::instrument::{Ctx, EngineSections, Straggle};
use crate::model::{KvCache, Model, Shard};
use crate::serve::{Served, Workload};
use crate::weights::{Tensors, var_builder};
use candle_core::{DType, Device};
use phasetrace::{Phase, Profiler, Recorder, RecorderOptions, RequestClass, RequestKind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// Runs the group: every rank on its own thread with its own recorder of `profiler` (none:
/// unprofiled). Fails if a rank fails, or if the ranks disagree on the tokens.
pub fn generate(opts: &RunOptions, profiler: Option<&Profiler>) -> Result<RunOutput, EngineError> {
    let class = prepare(opts, profiler)?;
    let group = Collective::new(opts.ranks);
    let results: Vec<Result<RunOutput, EngineError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..opts.ranks)
            .map(|rank| {
                let group = &group;
                std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(scope, move || {
                        let rec = profiler
                            .map(|p| p.recorder_with(RecorderOptions::new().rank(rank as u32)));
                        let mut member = group.member(rank);
                        rank_loop(opts, rank, &mut member, rec.as_ref(), class)
                    })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| match h {
                Ok(h) => h.join().unwrap_or(Err(EngineError::RankPanicked(rank))),
                Err(e) => Err(EngineError::Config(format!("spawning rank {rank}: {e}"))),
            })
            .collect()
    });
    let mut first: Option<RunOutput> = None;
    for (rank, r) in results.into_iter().enumerate() {
        let r = r?;
        match &first {
            None => first = Some(r),
            Some(f) if f.tokens != r.tokens => return Err(EngineError::RanksDisagree(rank)),
            Some(_) => {}
        }
    }
    first.ok_or_else(|| EngineError::Config("no ranks".into()))
}

/// Runs rank `rank` of a group of `opts.ranks` whose other ranks run elsewhere (other
/// processes, other hosts), meeting them through `comm` at every all-reduce and stop
/// decision; records on a recorder of `profiler` for this rank. Every rank must run the same
/// `opts` (the same weights, shapes and seeds): each takes its own shard.
pub fn generate_rank(
    opts: &RunOptions,
    rank: usize,
    comm: &mut dyn AllReduce,
    profiler: Option<&Profiler>,
) -> Result<RunOutput, EngineError> {
    if rank >= opts.ranks || comm.ranks() != opts.ranks {
        return Err(EngineError::Config(format!(
            "rank {rank} of a group of {} meeting {}: expected a rank below the group's size, and the same size",
            opts.ranks,
            comm.ranks()
        )));
    }
    let class = prepare(opts, profiler)?;
    let rec = profiler.map(|p| p.recorder_with(RecorderOptions::new().rank(rank as u32)));
    rank_loop(opts, rank, comm, rec.as_ref(), class)
}

/// Checks `opts`, registers the engine's sections and the requests' kind.
fn prepare(
    opts: &RunOptions,
    profiler: Option<&Profiler>,
) -> Result<Option<RequestClass>, EngineError> {
    opts.cfg.validate()?;
    opts.cfg.check_ranks(opts.ranks)?;
    if let Some(w) = &opts.serving {
        w.validate()?;
        w.check_positions(opts.spec.map_or(0, |s| s.k))?;
    }
    if opts.serving.is_none() && opts.prompt.is_empty() {
        return Err(EngineError::Config("the prompt is empty".into()));
    }
    if let Some(&t) = opts.prompt.iter().find(|&&t| t as usize >= opts.cfg.vocab) {
        return Err(EngineError::Config(format!(
            "prompt token {t}: expected ids below the vocabulary size {}",
            opts.cfg.vocab
        )));
    }
    if let Some(s) = opts.spec {
        if s.k == 0 {
            return Err(EngineError::Config("spec k: expected at least 1".into()));
        }
        match s.draft {
            Draft::Shallow { layers } if layers == 0 || layers >= opts.cfg.layers => {
                return Err(EngineError::Config(format!(
                    "draft layers {layers}: expected 1 to {} (fewer than the target's)",
                    opts.cfg.layers.saturating_sub(1)
                )));
            }
            Draft::Precision(d) if !matches!(d, DType::F16 | DType::BF16 | DType::F32) => {
                return Err(EngineError::Config(format!(
                    "draft dtype {d:?}: expected f16 or bf16"
                )));
            }
            _ => {}
        }
    }
    if let Some((r, f)) = opts.straggler
        && (r >= opts.ranks || !(f.is_finite() && f >= 1.0))
    {
        return Err(EngineError::Config(format!(
            "straggler rank {r} factor {f}: expected a rank below {} and a factor of at least 1",
            opts.ranks
        )));
    }
    EngineSections::get()?;
    // The requests' kind (`gen_ai.*` attributes), registered once for the run.
    let class = match (&opts.serving, profiler) {
        (Some(w), Some(p)) => Some(
            p.request_kind(
                RequestKind::new("phasetrace-candle", "text_completion", w.model.clone())
                    .response_model(w.model.clone()),
            )?,
        ),
        _ => None,
    };
    Ok(class)
}

/// One rank's decode loop.
fn rank_loop(
    opts: &RunOptions,
    rank: usize,
    comm: &mut dyn AllReduce,
    rec: Option<&Recorder>,
    class: Option<RequestClass>,
) -> Result<RunOutput, EngineError> {
    let cfg = &opts.cfg;
    let shard = Shard {
        rank,
        ranks: opts.ranks,
    };
    let k = opts.spec.map_or(0, |s| s.k);
    let context = match &opts.serving {
        Some(w) => w.max_positions(k),
        None => opts.context.max(opts.prompt.len() + k + 2),
    };
    let vb = var_builder(&opts.tensors, DType::F32, &opts.device);
    let target = Model::load(&vb, cfg, shard, context + k + 2)?;
    // The draft: the target's first layers (same tensors), or a lower-precision copy.
    let (half, depth) = match opts.spec.map(|s| s.draft) {
        Some(Draft::Shallow { layers }) => (None, layers),
        Some(Draft::Precision(d)) => (Some(target.to_dtype(d)?), cfg.layers),
        None => (None, 0),
    };
    let draft = half.as_ref().unwrap_or(&target);
    let factor = match opts.straggler {
        Some((r, f)) if r == rank => f,
        _ => 1.0,
    };
    let mut ctx = Ctx {
        rec,
        round: None,
        comm: Some(comm),
        sections: EngineSections::get()?,
        straggle: Straggle::new(factor),
    };
    if let Some(w) = &opts.serving {
        let mut r = Rank {
            rank,
            rec,
            ctx,
            target: &target,
            draft,
            layers: cfg.layers,
            depth,
        };
        return crate::serve::serve_loop(opts, w, &mut r, class);
    }
    let mut cache = KvCache::new(cfg.layers);
    let mut dcache = KvCache::new(cfg.layers);
    let mut out = RunOutput::default();
    let started = Instant::now();
    // The token whose KV is not cached yet; `None`: a sequence starts with the prompt.
    let mut pending: Option<u32> = None;
    let mut tokens = Vec::with_capacity(k + 1);
    while out.steps < opts.steps {
        if stop_decided(opts, &mut ctx)? {
            break;
        }
        let room = context.saturating_sub(cache.len());
        let Some(p) = pending.filter(|_| room > k + 1) else {
            // A new sequence (the first, or the context is full): the prefill is a step, and
            // yields its first token.
            cache = KvCache::new(cfg.layers);
            let first = {
                let _step = rec.map(Recorder::step);
                last(target.forward(&mut ctx, &opts.prompt, &mut cache, cfg.layers)?)?
            };
            if opts.spec.is_some() {
                // The draft's cache holds what the target's holds (unprofiled: its time is
                // outside every step and round).
                dcache = KvCache::new(cfg.layers);
                ctx.unrecorded(|ctx| draft.forward(ctx, &opts.prompt, &mut dcache, depth))?;
            }
            out.tokens.push(first);
            // A sequence that ends at once (its first token is end-of-sequence) starts over.
            pending = Some(first).filter(|t| !cfg.eos.contains(t));
            bump(opts, rank, &mut out);
            continue;
        };
        let Some(spec) = opts.spec else {
            let next = {
                let _step = rec.map(Recorder::step);
                last(target.forward(&mut ctx, &[p], &mut cache, cfg.layers)?)?
            };
            out.tokens.push(next);
            // At its end-of-sequence token the sequence ends; the next starts from the prompt.
            pending = Some(next).filter(|t| !cfg.eos.contains(t));
            bump(opts, rank, &mut out);
            continue;
        };
        let n = cache.len();
        let round = rec.map(|r| r.round(spec.k as u32));
        // Draft: k greedy tokens, one forward each (the draft's sections are not recorded:
        // its time is the draft phase).
        tokens.clear();
        tokens.push(p);
        ctx.unrecorded(|ctx| -> Result<(), EngineError> {
            for _ in 0..spec.k {
                let input = [tokens[tokens.len() - 1]];
                tokens.push(last(draft.forward(ctx, &input, &mut dcache, depth)?)?);
            }
            Ok(())
        })?;
        if let Some(r) = &round {
            r.phase(Phase::Draft);
        }
        // Verify: the pending token and the k drafted ones in one forward (one step).
        ctx.round = round.as_ref().map(|r| r.as_ref());
        let verified = {
            let _step = rec.map(Recorder::step);
            target.forward(&mut ctx, &tokens, &mut cache, cfg.layers)?
        };
        ctx.round = None;
        bump(opts, rank, &mut out);
        if let Some(r) = &round {
            r.phase(Phase::Verify);
        }
        // Accept: the drafted tokens up to the first the target would not have chosen, then
        // the target's own token there.
        let accepted = tokens[1..]
            .iter()
            .zip(&verified)
            .take_while(|(d, v)| d == v)
            .count();
        let from = out.tokens.len();
        out.tokens.extend_from_slice(&tokens[1..=accepted]);
        let next = verified[accepted];
        out.tokens.push(next);
        // Nothing after an end-of-sequence token: the next sequence starts from the prompt.
        let (keep, ended) = crate::serve::until_eos(&out.tokens[from..], &cfg.eos);
        out.tokens.truncate(from + keep);
        pending = Some(next).filter(|_| !ended);
        out.rounds += 1;
        out.drafted += spec.k;
        out.accepted += accepted;
        if let Some(r) = &round {
            r.phase(Phase::Accept);
        }
        // Rollback: both caches keep what precedes the new pending token.
        let keep = n + 1 + accepted;
        if accepted < spec.k {
            cache.truncate(keep)?;
            dcache.truncate(keep)?;
            if let Some(r) = &round {
                r.phase(Phase::Rollback);
            }
        }
        // Maintenance: all k accepted, so the draft has not cached its own last token yet.
        if dcache.len() < keep {
            ctx.unrecorded(|ctx| draft.forward(ctx, &tokens[spec.k..], &mut dcache, depth))?;
        }
        if let Some(r) = round {
            r.phase(Phase::Maint);
            r.end(accepted as u32);
        }
    }
    out.wall = started.elapsed();
    Ok(out)
}

/// One rank's part of a run: its recorder, its forward context, the models.
#[derive(Debug)]
pub(crate) struct Rank<'a, 'c, 'm> {
    pub(crate) rank: usize,
    pub(crate) rec: Option<&'a Recorder>,
    pub(crate) ctx: Ctx<'a, 'c>,
    pub(crate) target: &'m Model,
    pub(crate) draft: &'m Model,
    /// The target's layers, and the draft's.
    pub(crate) layers: usize,
    pub(crate) depth: usize,
}

impl Rank<'_, '_, '_> {
    /// Whether the run stops here: the group's decision, taken by every rank at the same step
    /// boundary.
    pub(crate) fn stop_decided(&mut self, opts: &RunOptions) -> Result<bool, EngineError> {
        stop_decided(opts, &mut self.ctx)
    }
}

/// Whether the run stops at this step boundary: the group's decision over `opts.stop` (rank
/// 0's for threads; any rank's for processes), which every rank takes at the same boundary
/// through the collective.
fn stop_decided(opts: &RunOptions, ctx: &mut Ctx<'_, '_>) -> Result<bool, EngineError> {
    let Some(stop) = &opts.stop else {
        return Ok(false);
    };
    let says = stop.load(Ordering::Relaxed);
    match ctx.comm.as_deref_mut() {
        Some(c) => Ok(c.decide(says)?),
        None => Ok(says),
    }
}

pub(crate) fn bump(opts: &RunOptions, rank: usize, out: &mut RunOutput) {
    out.steps += 1;
    if rank == 0
        && let Some(p) = &opts.progress
    {
        p.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) fn last(ids: Vec<u32>) -> Result<u32, EngineError> {
    ids.last()
        .copied()
        .ok_or_else(|| EngineError::Config("a forward over no tokens".into()))
}
