//! A tensor-parallel group's ranks, and each rank's loop: one thread per rank (or one rank of
//! a group whose others run elsewhere), each with its shard, its KV caches and its phasetrace
//! recorder, meeting at every all-reduce. At each step boundary every rank takes the group's
//! stop decision, takes the step's batch from its queue, runs the step and retires what is
//! done.
//!
//! ```text
//! generate ── per rank thread ──> Model::load(shard), the draft ──> rank_loop:
//!   every step: stop decided? ── queue.rs: admit ──> the batch
//!     ├─ plain (no speculation, or nothing decoding yet): step.rs ── one step
//!     └─ speculative: round.rs ── one round (its step: the verify)
//!   ── queue.rs: retire (rank 0: request_end)
//! ```

use crate::EngineError;
use crate::collective::{AllReduce, Collective};
use crate::instrument::{Ctx, EngineSections, Straggle};
use crate::model::{Model, Shard};
use crate::options::{Draft, RunOptions, RunOutput};
use crate::queue::{OneSequence, Queue, Scheduler};
use crate::step::{Live, Rank};
use crate::weights::var_builder;
use crate::{round, step};
use candle_core::DType;
use phasetrace::{Profiler, Recorder, RecorderOptions, RequestClass, RequestKind};
use std::sync::atomic::Ordering;
use std::time::Instant;

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

/// One rank's part of the run: its models, then its loop over the queue of the run
/// (the workload's requests, or one sequence).
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
    let factor = match opts.straggler {
        Some((r, f)) if r == rank => f,
        _ => 1.0,
    };
    let mut r = Rank {
        rank,
        rec,
        ctx: Ctx {
            rec,
            round: None,
            comm: Some(comm),
            sections: EngineSections::get()?,
            straggle: Straggle::new(factor),
        },
        target: &target,
        draft: half.as_ref().unwrap_or(&target),
        layers: cfg.layers,
        depth,
        serving: opts.serving.is_some(),
    };
    match &opts.serving {
        Some(w) => {
            // Rank 0 begins and ends the requests; every rank serves them in its steps.
            let begins = rec.filter(|_| rank == 0);
            let queue = Scheduler::new(w, cfg.vocab, cfg.layers, k, begins, class);
            decode(opts, &mut r, queue)
        }
        None => decode(
            opts,
            &mut r,
            OneSequence::new(&opts.prompt, cfg.layers, context, k),
        ),
    }
}

/// The loop of one rank: a step per iteration until `opts.steps` or the group's stop, each
/// over the batch its queue admits.
fn decode(
    opts: &RunOptions,
    r: &mut Rank<'_, '_, '_>,
    mut queue: impl Queue,
) -> Result<RunOutput, EngineError> {
    let mut out = RunOutput::default();
    let started = Instant::now();
    while out.steps < opts.steps {
        if stop_decided(opts, &mut r.ctx)? {
            break;
        }
        let batch = queue.admit();
        match opts.spec {
            Some(spec) if batch.iter().any(Live::decoding) => {
                round::run(r, batch, spec.k, &mut out)?;
            }
            _ => step::plain(r, batch, opts.spec.is_some())?,
        }
        queue.retire();
        bump(opts, r.rank, &mut out);
    }
    out.wall = started.elapsed();
    queue.close(&mut out);
    Ok(out)
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

/// A step is done: counted, and on rank 0 shown to the caller's progress counter.
fn bump(opts: &RunOptions, rank: usize, out: &mut RunOutput) {
    out.steps += 1;
    if rank == 0
        && let Some(p) = &opts.progress
    {
        p.fetch_add(1, Ordering::Relaxed);
    }
}
