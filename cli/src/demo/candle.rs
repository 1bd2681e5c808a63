//! `phasetrace demo --engine candle`: the candle decoder of `phasetrace-candle` (real matrix
//! products on this machine's CPU) as the main job, with the synthetic demo's model flags,
//! profiler flags, exporters and console summary. The engine records through phasetrace's
//! public API; this file only builds the profiler, the model and the weights, and reports.

use super::DemoArgs;
use crate::Failure;
use crate::rendezvous::TcpRendezvous;
use candle_core::DType;
use clap::{Args, ValueEnum};
use phasetrace::{Profiler, SectionLevel, SpecLevel, Timing};
use phasetrace_candle::{
    AllReduce, Draft, EngineError, ModelConfig, RunOptions, Spec, Workload, weights,
};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Which draft model speculative decoding uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum DraftKind {
    /// The target's first --draft-layers layers, with its embedding and LM head.
    #[default]
    Shallow,
    /// The whole target in half precision (f16).
    F16,
    /// The whole target in bfloat16.
    Bf16,
}

/// The candle engine's own flags (the model flags are the synthetic demo's).
#[derive(Debug, Args)]
pub(crate) struct CandleArgs {
    /// With --engine candle: a Hugging Face checkpoint directory (config.json and *.safetensors;
    /// Llama, Mistral, Qwen2, Qwen2-MoE or Mixtral) instead of seeded random weights; its
    /// config.json then sets the shapes that --layers, --experts, ... set otherwise.
    #[arg(long)]
    model: Option<PathBuf>,
    /// With --engine candle and --spec: the draft model.
    #[arg(long, value_enum, default_value_t)]
    draft: DraftKind,
    /// With --draft shallow: the draft's layers (default: a quarter of --layers, at least 1).
    #[arg(long)]
    draft_layers: Option<usize>,
    /// With --engine candle: the model width of random weights (heads of 32 wide: width/32
    /// query heads, half as many key/value heads).
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// With --engine candle: requests arriving per step (a Poisson process in steps, so that
    /// two runs batch alike and their checksums compare), served under continuous batching
    /// with --max-batch, --prompt-tokens, --output-tokens, --max-output-tokens and
    /// --model-name; 0: no requests, one sequence of --prompt-tokens prompt tokens decoded on
    /// and restarted when its context (512 positions) is full.
    #[arg(long, default_value_t = 0.25)]
    requests_per_step: f64,
}

/// The model of the flags: a checkpoint's, or random weights shaped by the model flags.
fn model(a: &DemoArgs) -> Result<(ModelConfig, weights::Tensors, String), Failure> {
    let c = &a.candle;
    if let Some(dir) = &c.model {
        let cfg = ModelConfig::from_hf_dir(dir).map_err(engine_failure)?;
        fits_in_memory(a, &cfg, &format!("--model {}", dir.display()))?;
        let (cfg, t) = weights::load_checkpoint(dir).map_err(engine_failure)?;
        return Ok((cfg, t, format!("checkpoint {}", dir.display())));
    }
    if c.hidden == 0 || !c.hidden.is_multiple_of(64) {
        return Err(Failure::config(format!(
            "--hidden {}: expected a positive multiple of 64 (heads of 32 wide, key/value heads half as many)",
            c.hidden
        )));
    }
    let experts = a.experts as usize;
    let mut cfg = ModelConfig {
        layers: a.layers as usize,
        dense_layers: (a.dense_layers as usize).min(a.layers as usize),
        experts,
        top_k: (a.top_k as usize).min(experts),
        hidden: c.hidden,
        heads: c.hidden / 32,
        kv_heads: c.hidden / 64,
        intermediate: 2 * c.hidden,
        moe_intermediate: c.hidden / 4,
        shared_intermediate: c.hidden,
        ..ModelConfig::default()
    };
    if cfg.dense_layers == cfg.layers {
        cfg.experts = 0;
    }
    if cfg.experts == 0 {
        cfg.layout = phasetrace_candle::Layout::Llama;
        cfg.dense_layers = cfg.layers;
    }
    cfg.validate().map_err(|e| {
        Failure::config(format!(
            "--layers {} --dense-layers {} --experts {} --top-k {} --hidden {}: {e}",
            a.layers, a.dense_layers, a.experts, a.top_k, c.hidden
        ))
    })?;
    fits_in_memory(
        a,
        &cfg,
        &format!(
            "--layers {} --experts {} --hidden {}",
            a.layers, a.experts, c.hidden
        ),
    )?;
    let t = weights::random(&cfg, a.seed).map_err(engine_failure)?;
    Ok((cfg, t, format!("random weights (seed {})", a.seed)))
}

/// Refuses a model whose run would not fit in the memory this machine has available (it would
/// be killed partway through allocating, or swap), naming the flags that shaped it.
fn fits_in_memory(a: &DemoArgs, cfg: &ModelConfig, flags: &str) -> Result<(), Failure> {
    let draft = match (a.spec, a.candle.draft) {
        (Some(_), DraftKind::F16) => Some(DType::F16),
        (Some(_), DraftKind::Bf16) => Some(DType::BF16),
        _ => None,
    };
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let params = cfg.parameters().unwrap_or(u64::MAX);
    let need = weights::host_bytes(cfg, a.ranks as usize, draft).unwrap_or(u64::MAX);
    match available_memory() {
        Some(have) if need > have => Err(Failure::config(format!(
            "{flags}: a model of {:.2} G parameters needs about {:.1} GiB on {} ranks{} (f32 weights and the ranks' shards), and this machine has {:.1} GiB available (MemAvailable): fewer layers or experts, a smaller width, or another machine",
            params as f64 / 1e9,
            gib(need),
            a.ranks,
            draft.map_or(String::new(), |d| format!(" with a {d:?} draft")),
            gib(have)
        ))),
        _ => Ok(()),
    }
}

/// `MemAvailable` of `/proc/meminfo` in bytes (`None` where there is no such file).
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

fn engine_failure(e: EngineError) -> Failure {
    match e {
        EngineError::Config(_) | EngineError::Checkpoint(_) => Failure::config(e),
        other => Failure::runtime(other),
    }
}

/// The requests of the flags (none with `--requests-per-step 0`).
fn workload(a: &DemoArgs) -> Result<Option<Workload>, Failure> {
    let rate = a.candle.requests_per_step;
    if !(rate.is_finite() && rate >= 0.0) {
        return Err(Failure::config(format!(
            "--requests-per-step {rate}: expected a non-negative number of requests a step"
        )));
    }
    a.requests.check().map_err(Failure::config)?;
    if rate == 0.0 {
        return Ok(None);
    }
    let r = &a.requests;
    let w = Workload {
        requests_per_step: rate,
        max_batch: r.max_batch as usize,
        prompt_tokens: r.prompt_tokens as usize,
        output_tokens: r.output_tokens as usize,
        max_output_tokens: r.max_output_tokens as usize,
        model: r.model_name.clone(),
        seed: a.seed,
        kv_block_size: r.kv_block_size as usize,
        kv_blocks: r.kv_blocks as usize,
    };
    w.validate().map_err(|e| {
        Failure::config(format!(
            "the request flags (--max-batch, --prompt-tokens, --output-tokens, --max-output-tokens, --kv-blocks, --kv-block-size) with --engine candle: {e}"
        ))
    })?;
    Ok(Some(w))
}

/// Rejects the synthetic workload's flags that have no meaning for a real model.
fn synthetic_only(a: &DemoArgs) -> Result<(), Failure> {
    let given = [
        ("--expert-parallel", a.expert_parallel.is_some()),
        ("--straggler-period", a.straggler_period.is_some()),
        ("--slow-steps", a.slow_steps.is_some()),
        ("--hang-rank", a.hang_rank.is_some()),
        ("--profile", a.profile.is_some()),
        ("--gpu-sim", a.gpu_sim),
        ("--request-rate", a.requests.request_rate.is_some()),
    ];
    if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
        return Err(Failure::config(format!(
            "{flag}: a flag of the synthetic engine; --engine candle runs a real model on rank threads for --steps steps, --duration seconds or --forever, its requests arriving per step (--requests-per-step)"
        )));
    }
    Ok(())
}

/// candle's CPU kernels split each matrix product over `RAYON_NUM_THREADS` threads (default:
/// every core), and every tensor-parallel rank is a thread that runs them: on a small machine
/// that oversubscribes the cores (one rank on 2 cores ran 3.7x slower on rayon's default pool
/// than on one thread, docs/engine.md). Unless the user set it, each rank gets its share of the
/// cores (at least one thread: then candle runs the kernels on the rank's own thread).
fn share_cores(ranks: u32) -> Option<usize> {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = (cores / ranks.max(1) as usize).max(1);
    // SAFETY: called first in `run`, on the main thread, before the profiler's worker, the
    // Ctrl-C handler or any rank thread exists: no other thread reads the environment.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    Some(n)
}

/// Refuses a straggler that cannot be: a factor below 1, a rank outside the group.
fn straggler(a: &DemoArgs) -> Result<(), Failure> {
    if !(a.straggler_factor.is_finite() && a.straggler_factor >= 1.0) {
        return Err(Failure::config(format!(
            "--straggler-factor {}: expected a number of at least 1",
            a.straggler_factor
        )));
    }
    if let Some(r) = a.straggler_rank
        && r >= a.ranks
    {
        return Err(Failure::config(format!(
            "--straggler-rank {r}: expected a rank below --ranks {}",
            a.ranks
        )));
    }
    Ok(())
}

/// Speculative decoding of `--spec K` with the draft of `--draft` (and `--draft-layers`).
fn speculation(a: &DemoArgs, cfg: &ModelConfig) -> Option<Spec> {
    a.spec.map(|k| Spec {
        k: k as usize,
        draft: match a.candle.draft {
            DraftKind::Shallow => Draft::Shallow {
                layers: a
                    .candle
                    .draft_layers
                    .unwrap_or(cfg.layers.div_ceil(4).max(1)),
            },
            DraftKind::F16 => Draft::Precision(DType::F16),
            DraftKind::Bf16 => Draft::Precision(DType::BF16),
        },
    })
}

/// `--steps`'s default for this engine.
const STEPS: u64 = 500;

pub(crate) fn run(a: DemoArgs) -> Result<(), Failure> {
    let steps = a.steps.unwrap_or(STEPS);
    if let Some(n) = share_cores(a.ranks) {
        eprintln!(
            "phasetrace: candle kernels on {n} thread(s) per rank ({} ranks; RAYON_NUM_THREADS sets it)",
            a.ranks
        );
    }
    synthetic_only(&a)?;
    straggler(&a)?;
    let serving = workload(&a)?;
    let (cfg, tensors, source) = model(&a)?;
    let spec = speculation(&a, &cfg);

    // 1. Setup: the profiler, the run's options.
    let profiler = setup_profiler(&a, &cfg, &source, spec)?;
    if let Some(d) = a.duration
        && !(d.is_finite() && d > 0.0)
    {
        return Err(Failure::config(format!(
            "--duration {d}: expected a positive number of seconds"
        )));
    }
    let progress = Arc::new(AtomicU64::new(0));
    // Ends the run (the deadline, Ctrl-C); `interrupted`: Ctrl-C, which skips --linger too.
    let stop = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let (s, i) = (stop.clone(), interrupted.clone());
        // A second Ctrl-C while flushing falls back to the default action.
        let _ = ctrlc::set_handler(move || {
            s.store(true, Ordering::Relaxed);
            if i.swap(true, Ordering::Relaxed) {
                std::process::exit(130);
            }
        });
    }
    let unbounded = a.forever || a.duration.is_some();
    let opts = RunOptions {
        ranks: a.ranks as usize,
        steps: if unbounded {
            usize::MAX
        } else {
            steps as usize
        },
        stop: Some(stop.clone()),
        prompt: phasetrace_candle::prompt(a.requests.prompt_tokens as usize, cfg.vocab, a.seed),
        serving,
        spec,
        straggler: a.straggler_rank.map(|r| (r as usize, a.straggler_factor)),
        progress: Some(progress.clone()),
        ..RunOptions::new(cfg, tensors, steps as usize, Vec::new())
    };

    // 2. The run, watched: every rank on a thread of this process, or with --rank this
    // process's rank, meeting the others' processes over TCP.
    let mut tcp = match join_group(&a, &profiler) {
        Ok(t) => t,
        Err(e) => {
            profiler.shutdown();
            return Err(e);
        }
    };
    let out = match generate_watched(&a, &opts, &profiler, (&stop, &progress), tcp.as_mut()) {
        Ok(o) => o,
        Err(e) => {
            profiler.shutdown();
            return Err(engine_failure(e));
        }
    };

    // 3. The report.
    report(&a, &profiler, &opts, &out, spec);
    if a.linger > 0.0 && !interrupted.load(Ordering::Relaxed) {
        let until = Instant::now() + Duration::from_secs_f64(a.linger);
        while Instant::now() < until && !interrupted.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    profiler.shutdown();
    // The last line: compare two runs' generations (telemetry never changes them).
    println!(
        "demo: checksum {} of {} generated token ids",
        phasetrace_candle::checksum(&out.tokens),
        out.tokens.len()
    );
    Ok(())
}

/// The profiler: defaults, then environment, then flags (as the synthetic demo); host timing
/// only. Says where metrics go and what runs.
fn setup_profiler(
    a: &DemoArgs,
    cfg: &ModelConfig,
    source: &str,
    spec: Option<Spec>,
) -> Result<Profiler, Failure> {
    let mut builder = Profiler::builder().with_level(SectionLevel::Full);
    builder = builder.with_moe_experts(cfg.experts.max(1) as u32);
    if let Some(k) = a.spec {
        builder = builder
            .with_spec_level(SpecLevel::VerifySplit)
            .with_spec_k_max(k);
    }
    let builder = a.flags.apply(builder).map_err(Failure::config)?;
    let timing = builder.config().map_err(Failure::config)?.timing;
    if timing != Timing::Host {
        return Err(Failure::config(format!(
            "PHASETRACE_TIMING={}: the candle engine runs on the CPU here, timed on the host clock (expected host)",
            timing.as_str()
        )));
    }
    let profiler = builder.build()?;
    super::say_exporters(&profiler);
    eprintln!(
        "phasetrace: candle engine on the CPU: {} layers ({} dense, {} MoE: {} experts, top-{}), width {}, {:.1} M parameters, {} ranks, {source}{}",
        cfg.layers,
        cfg.layers.min(cfg.dense_layers),
        cfg.layers.saturating_sub(cfg.dense_layers.min(cfg.layers)),
        cfg.experts,
        cfg.top_k,
        cfg.hidden,
        cfg.parameters().unwrap_or(0) as f64 / 1e6,
        a.ranks,
        spec.map_or(String::new(), |s| format!(
            ", speculative k={} with {}",
            s.k, s.draft
        )),
    );
    Ok(profiler)
}

/// Runs the engine on a thread of its own while this one stops it at the deadline and shows
/// progress on a terminal.
fn generate_watched(
    a: &DemoArgs,
    opts: &RunOptions,
    profiler: &Profiler,
    (stop, progress): (&AtomicBool, &AtomicU64),
    tcp: Option<&mut TcpAllReduce>,
) -> Result<phasetrace_candle::RunOutput, EngineError> {
    let unbounded = a.forever || a.duration.is_some();
    let deadline = if a.forever {
        None
    } else {
        a.duration.map(Duration::from_secs_f64)
    };
    let started = Instant::now();
    std::thread::scope(|s| {
        let run = s.spawn(|| match tcp {
            Some(t) => {
                let rank = t.rank;
                phasetrace_candle::generate_rank(opts, rank, t, Some(profiler))
            }
            None => phasetrace_candle::generate(opts, Some(profiler)),
        });
        let tty = std::io::stderr().is_terminal();
        let of = if unbounded {
            String::new()
        } else {
            format!("/{}", opts.steps)
        };
        while !run.is_finished() {
            std::thread::sleep(Duration::from_millis(100));
            if deadline.is_some_and(|d| started.elapsed() >= d) {
                stop.store(true, Ordering::Relaxed);
            }
            if tty {
                let steps = progress.load(Ordering::Relaxed);
                eprint!(
                    "\r  steps {steps}{of}  {:.1}s   ",
                    started.elapsed().as_secs_f64()
                );
                let _ = std::io::stderr().flush();
            }
        }
        if tty {
            eprintln!();
        }
        run.join().unwrap_or(Err(EngineError::RankPanicked(0)))
    })
}

/// With `--rank R --rendezvous HOST:PORT`: this process's rank joins the group's other
/// processes (rank 0 listens, the others join it, until `--rendezvous-timeout`).
fn join_group(a: &DemoArgs, profiler: &Profiler) -> Result<Option<TcpAllReduce>, Failure> {
    let (Some(r), Some(addr)) = (a.rank, &a.rendezvous) else {
        return Ok(None);
    };
    let group = &profiler.config().group;
    eprintln!(
        "phasetrace: rank {r} of {} in group {group}: {} the rendezvous at {addr}",
        a.ranks,
        if r == 0 { "listening for" } else { "joining" }
    );
    let key = super::group_key(a)?;
    let rv = TcpRendezvous::join(
        addr,
        r,
        a.ranks,
        group,
        &key,
        Duration::from_secs_f64(a.rendezvous_timeout),
    )
    .map_err(|e| Failure::runtime(format!("rank {r} of {}: {e}", a.ranks)))?;
    Ok(Some(TcpAllReduce {
        rv,
        rank: r as usize,
        ranks: a.ranks as usize,
        sent: Vec::new(),
        like: None,
        parts: Vec::new(),
    }))
}

/// The candle engine's all-reduce between processes: each rank sends its partial output to
/// every other over the demo's TCP rendezvous (`crate::rendezvous`: a full mesh, so no rank is
/// a hub that looks like a straggler), then sums all of them in rank order in the partial's own
/// dtype, exactly as ranks that are threads do, so a group of processes generates the tokens
/// of a group of threads (test). The partials travel as little-endian f32 (f16 and bf16 widen
/// to f32 exactly and narrow back exactly).
struct TcpAllReduce {
    rv: TcpRendezvous,
    rank: usize,
    ranks: usize,
    /// This rank's partial, encoded by `deposit`.
    sent: Vec<u8>,
    /// The partial's shape, dtype and device, for decoding the others'.
    like: Option<candle_core::Tensor>,
    /// Every rank's partial after `arrive`, in rank order.
    parts: Vec<Vec<u8>>,
}

impl std::fmt::Debug for TcpAllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpAllReduce")
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .finish_non_exhaustive()
    }
}

impl AllReduce for TcpAllReduce {
    fn ranks(&self) -> usize {
        self.ranks
    }

    /// Any rank's request to stop (Ctrl-C, the deadline) stops the group: a process cannot
    /// leave the others waiting at a rendezvous.
    fn decide(&mut self, says: bool) -> candle_core::Result<bool> {
        self.rv.meet(says).map_err(candle_core::Error::msg)
    }

    fn deposit(&mut self, partial: &candle_core::Tensor) -> candle_core::Result<()> {
        let flat = partial
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?;
        self.sent.clear();
        self.sent.extend(flat.iter().flat_map(|x| x.to_le_bytes()));
        self.like = Some(partial.clone());
        Ok(())
    }

    fn arrive(&mut self) -> candle_core::Result<()> {
        self.parts = self
            .rv
            .exchange(&self.sent)
            .map_err(candle_core::Error::msg)?;
        Ok(())
    }

    fn sum(&mut self) -> candle_core::Result<candle_core::Tensor> {
        let Some(like) = self.like.take() else {
            candle_core::bail!("all-reduce: sum before deposit");
        };
        let mut parts = Vec::with_capacity(self.parts.len());
        for (r, bytes) in self.parts.iter().enumerate() {
            if bytes.len() != self.sent.len() {
                candle_core::bail!(
                    "all-reduce: rank {r} sent {} bytes, this rank {} (shape {:?}): the ranks run different models or batches",
                    bytes.len(),
                    self.sent.len(),
                    like.dims()
                );
            }
            let values: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            parts.push(
                candle_core::Tensor::from_vec(values, like.shape(), like.device())?
                    .to_dtype(like.dtype())?,
            );
        }
        phasetrace_candle::collective::sum_in_order(&parts)
    }
}

/// The closing report: the summary table (unless the profiler prints it), steps, tokens,
/// sections, spans and drops, and the speculative rounds.
fn report(
    a: &DemoArgs,
    profiler: &Profiler,
    opts: &RunOptions,
    out: &phasetrace_candle::RunOutput,
    spec: Option<Spec>,
) {
    profiler.flush();
    let stats = profiler.stats();
    if profiler.is_enabled() && profiler.config().summary_every == 0 {
        eprint!("{}", profiler.summary());
    }
    eprintln!(
        "demo: candle engine, {} steps, {} tokens on {} ranks x {} layers in {:.2}s ({:.1} tokens/s); {} sections, {} spans, dropped:{}",
        out.steps,
        out.tokens.len(),
        a.ranks,
        opts.cfg.layers,
        out.wall.as_secs_f64(),
        out.tokens_per_second(),
        stats.sections,
        stats.spans,
        stats
            .dropped
            .iter()
            .map(|(reason, n)| format!(" {reason}={n}"))
            .collect::<String>(),
    );
    if let Some(s) = spec {
        eprintln!(
            "demo: speculative decoding with {}: {} rounds, {} of {} drafted tokens accepted ({:.1} %), {:.2} tokens per sequence and round",
            s.draft,
            out.rounds,
            out.accepted,
            out.drafted,
            100.0 * out.acceptance(),
            1.0 + out.accepted as f64 / (out.drafted as f64 / s.k as f64).max(1.0),
        );
    }
    if let (Some(r), Some(w)) = (out.served, &opts.serving) {
        eprintln!(
            "demo: {} requests begun, {} finished, {} still open cancelled at the stop; --requests-per-step {}, --max-batch {}: {:.1} sequences a step on average, {} at most; KV cache: {} blocks of {} positions, at most {} reserved for a step, {} preemptions",
            r.begun,
            r.finished,
            r.cancelled,
            w.requests_per_step,
            w.max_batch,
            r.mean_batch(out.steps),
            r.max_batch,
            r.kv_blocks,
            w.kv_block_size,
            r.max_kv_blocks,
            r.preemptions,
        );
    }
}
