//! `phasetrace demo`: a synthetic multi-rank GLM-style decode run, instrumented only through the
//! public API. Read it as the example of how an engine integrates phasetrace:
//!
//! 1. build a [`Profiler`] once (environment, then flags);
//! 2. give each engine thread (here: each tensor-parallel rank) its own [`Recorder`];
//! 3. wrap each token in `rec.step_of(kind)` (prefill, decode, mixed, speculative), each kernel
//!    group in `rec.section(..)`, each all-reduce's rendezvous probe in a `*_BAR` section,
//!    enqueue-only work in `rec.host_section(..)`, and report routed experts with
//!    `rec.moe_route(..)`;
//! 4. for speculative decoding, wrap each round in `rec.round(k)`, mark phases as they end, and
//!    time verify parts with `rec.verify_part(..)`;
//! 5. `profiler.shutdown()` at exit flushes everything.
//!
//! Host sleeps stand in for kernels, and a `Barrier` stands in for the all-reduce rendezvous, so
//! every rank really waits for the slowest one at each collective. With `--rank R --rendezvous
//! HOST:PORT` this process runs only rank R, and the rendezvous is real: a barrier over TCP
//! with the other ranks' processes (`crate::rendezvous`), as tensor-parallel ranks on separate
//! hosts meet at their all-reduces.

#[cfg(feature = "candle")]
mod candle;
mod validate;

use crate::Failure;
use crate::flags::ProfilerFlags;
use crate::rendezvous::{GroupKey, RendezvousError, TcpRendezvous, group_secret};
use crate::requests::{RequestArgs, Scheduler, Serving};
use clap::Args;
use phasetrace::{
    Phase, Profiler, Recorder, RecorderOptions, Section, SectionLevel, Site, SpecLevel, Timing,
    VerifyPart,
};
use phasetrace_sim::SimStream;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// The engine `phasetrace demo` runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Engine {
    /// Drawn section times slept or spun per rank (every flag below applies).
    #[default]
    Synthetic,
    /// A real candle decoder on the CPU (dense + MoE layers, tensor-parallel rank threads,
    /// speculative decoding); the synthetic workload's own flags (--dsa-every, --route-skew,
    /// --acceptance, --time-scale, --spin-us) do not apply.
    Candle,
}

/// `--steps`'s default for the synthetic engine.
const STEPS: u64 = 2000;

/// `phasetrace demo` flags.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Which engine decodes: the synthetic workload, or a real candle model (docs/engine.md).
    #[arg(long, value_enum, default_value_t)]
    engine: Engine,
    #[cfg(feature = "candle")]
    #[command(flatten)]
    candle: candle::CandleArgs,
    /// Decode steps per rank (ignored with --duration or --forever). Default 2000; with
    /// --engine candle 500 (its steps are real forwards of a batch: about a minute on 2 cores).
    #[arg(long)]
    steps: Option<u64>,
    /// Run for this many seconds instead of a step count.
    #[arg(long)]
    duration: Option<f64>,
    /// Run until Ctrl-C.
    #[arg(long)]
    forever: bool,
    /// Tensor-parallel ranks (threads that rendezvous at every all-reduce, or with --rank the
    /// number of processes in the group).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    ranks: u32,
    /// Run only this rank of --ranks in this process; the all-reduces meet the other ranks'
    /// processes over TCP at --rendezvous.
    #[arg(long, requires = "rendezvous")]
    rank: Option<u32>,
    /// HOST:PORT where rank 0 listens and every other rank connects (with --rank). A peer that
    /// dies makes the others fail naming it.
    #[arg(long, requires = "rank")]
    rendezvous: Option<String>,
    /// Seconds a rank waits for its peers, to join and at each all-reduce, before failing.
    #[arg(long, default_value_t = 60.0)]
    rendezvous_timeout: f64,
    /// A file holding the group secret (at least 16 bytes; a trailing line break is not part
    /// of it) that every rank proves at the rendezvous; beats PHASETRACE_RENDEZVOUS_SECRET_FILE
    /// and PHASETRACE_RENDEZVOUS_SECRET. Without one, any process that reaches the rendezvous
    /// can join the group (docs/security.md).
    #[arg(long, requires = "rank")]
    rendezvous_secret_file: Option<PathBuf>,
    /// Transformer layers.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=512))]
    layers: u32,
    /// Leading dense (non-MoE) layers.
    #[arg(long, default_value_t = 1)]
    dense_layers: u32,
    /// Every Nth layer uses DSA attention; the others use the KDA linear mixer.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    dsa_every: u32,
    /// Routed experts per MoE layer.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    experts: u32,
    /// Experts per token.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    top_k: u32,
    /// Routing skew S: each routed expert id is drawn as experts x u^S, u uniform in [0, 1).
    /// 1 is uniform; higher sends more tokens to the lowest ids (the hot experts).
    #[arg(long, default_value_t = 2.0)]
    route_skew: f64,
    /// Expert parallelism over the first N ranks: each MoE layer's experts live on them in
    /// contiguous blocks, every rank's tokens run on the ranks that host their experts, and a
    /// rank's routed-expert time grows with the tokens its experts get, so a rank hosting hot
    /// experts straggles. Sets PHASETRACE_EXPERT_PARALLEL (the ep_rank of hot experts).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    expert_parallel: Option<u32>,
    /// A rank whose compute runs --straggler-factor times slower.
    #[arg(long)]
    straggler_rank: Option<u32>,
    /// How much slower the straggler's compute is.
    #[arg(long, default_value_t = 3.0)]
    straggler_factor: f64,
    /// --straggler-rank keeps pace for this many seconds from the start, then straggles: the
    /// start of a straggler that an alert's detection time is measured from (scripts/fleet.py).
    #[arg(long, default_value_t = 0.0, requires = "straggler_rank")]
    straggler_after: f64,
    /// A periodic straggler: every this many seconds, one rank (rotating) straggles for a third
    /// of the period.
    #[arg(long)]
    straggler_period: Option<f64>,
    /// Makes every Nth step slow on purpose (steps N-1, 2N-1, ... counted from 0): every rank's
    /// compute runs --slow-factor times slower in it. The run's last line says how many.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    slow_steps: Option<u64>,
    /// How much slower the --slow-steps steps are.
    #[arg(long, default_value_t = 10.0)]
    slow_factor: f64,
    /// A rank that hangs: in its step --hang-after-steps (counted from 0) it blocks forever
    /// inside its first layer's attention mixer, before that layer's all-reduce, as a rank
    /// stuck in a kernel does; every other rank then blocks at that all-reduce (with --rank
    /// processes, until --rendezvous-timeout). With a simulated stream (--gpu-sim) the kernel
    /// never finishes instead: the rank's host blocks at its next synchronize, and with
    /// PHASETRACE_TIMING=events the stream never reaches the marks after it. Ctrl-C (SIGINT) or
    /// SIGTERM still ends the demo: ranks still blocked 5 s later are left behind.
    #[arg(long)]
    hang_rank: Option<u32>,
    /// The steps --hang-rank completes before it hangs in the next one.
    #[arg(long, default_value_t = 10, requires = "hang_rank")]
    hang_after_steps: u64,
    /// Scales every section time (0.5 = twice as fast a model).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Busy-wait the last this many microseconds of each simulated kernel (shorter kernels
    /// are spun whole): host sleeps overshoot by tens of µs. 0 sleeps only, which costs little
    /// CPU when many ranks share few cores (tests).
    #[arg(long, default_value_t = 150)]
    spin_us: u64,
    /// A JSON file overriding section time distributions:
    /// {"kda_mixer": {"mean_us": 120, "cv": 0.1}, ...}
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Speculative decoding: draft K tokens per round.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    spec: Option<u32>,
    /// Probability that each drafted token is accepted (geometric acceptance).
    #[arg(long, default_value_t = 0.7)]
    acceptance: f64,
    /// Random seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Stand in for kernels with a simulated CUDA stream per rank (enqueue returns at once, the
    /// stream runs the work), so that PHASETRACE_TIMING=sync|events time it like a GPU. On by
    /// itself when PHASETRACE_TIMING is sync or events.
    #[arg(long)]
    gpu_sim: bool,
    /// Keep the process (and the Prometheus endpoint) up this many seconds after the run.
    #[arg(long, default_value_t = 0.0)]
    linger: f64,
    #[command(flatten)]
    pub(crate) requests: RequestArgs,
    #[command(flatten)]
    flags: ProfilerFlags,
}

/// Mean and coefficient of variation of a section's time.
#[derive(Clone, Copy, Debug)]
struct Dist {
    mean_us: f64,
    cv: f64,
}

fn default_dists() -> HashMap<&'static str, Dist> {
    let d = |mean_us, cv| Dist { mean_us, cv };
    HashMap::from([
        ("mhc", d(12.0, 0.10)),
        ("mhc_post", d(10.0, 0.10)),
        ("norm", d(6.0, 0.08)),
        ("kda_front", d(40.0, 0.08)),
        ("kda_recur", d(60.0, 0.12)),
        ("kda_back", d(30.0, 0.08)),
        ("dsa_proj", d(35.0, 0.08)),
        ("dsa_indexer", d(25.0, 0.10)),
        ("dsa_select", d(15.0, 0.15)),
        ("dsa_attend", d(80.0, 0.12)),
        ("mlp_dense", d(120.0, 0.06)),
        ("moe_router", d(8.0, 0.10)),
        ("moe_hostsync", d(20.0, 0.40)),
        ("moe_experts", d(150.0, 0.15)),
        ("moe_shared", d(40.0, 0.06)),
        ("moe_combine", d(12.0, 0.10)),
        ("reduce_attn", d(25.0, 0.20)),
        ("reduce_mlp", d(25.0, 0.20)),
        ("reduce_attn_enq", d(4.0, 0.20)),
        ("reduce_mlp_enq", d(4.0, 0.20)),
        ("draft", d(90.0, 0.10)),
        ("accept", d(15.0, 0.10)),
        ("rollback", d(25.0, 0.20)),
        ("maint", d(20.0, 0.20)),
    ])
}

fn load_profile(path: &PathBuf, dists: &mut HashMap<&'static str, Dist>) -> Result<(), Failure> {
    let bad = |what: String| Failure::config(format!("--profile {}: {what}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read: {e}")))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        bad(format!(
            "not JSON ({e}); expected {{\"bucket\": {{\"mean_us\": N, \"cv\": N}}}}"
        ))
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("expected a JSON object keyed by bucket name".into()))?;
    for (k, spec) in obj {
        let key = dists
            .keys()
            .copied()
            .find(|n| *n == k.as_str())
            .ok_or_else(|| {
                let mut known: Vec<_> = dists.keys().copied().collect();
                known.sort_unstable();
                bad(format!(
                    "unknown bucket {k:?}; expected one of {}",
                    known.join(", ")
                ))
            })?;
        let num = |field: &str| spec.get(field).map(|v| v.as_f64().unwrap_or(f64::NAN));
        let d = validate::profile_entry(k, num("mean_us"), num("cv")).map_err(bad)?;
        dists.insert(key, d);
    }
    Ok(())
}

/// Draws section times and stands in for the kernels.
struct Work {
    dists: HashMap<&'static str, (LogNormal<f64>, f64)>,
    rng: SmallRng,
    scale: f64,
    /// The spun tail of each host-slept kernel (`--spin-us`).
    spin: Duration,
    /// With `--gpu-sim`: kernels are enqueued on this rank's simulated stream instead of slept.
    stream: Option<SimStream>,
    /// This rank hangs in the step being run (`--hang-rank`), at its first [`Work::hang_here`].
    hang: bool,
    /// The step being run (from 0), for the routing.
    step: u64,
}

impl Work {
    fn new(
        dists: &HashMap<&'static str, Dist>,
        seed: u64,
        scale: f64,
        spin: Duration,
        stream: Option<SimStream>,
    ) -> Work {
        let dists = dists
            .iter()
            .filter_map(|(k, d)| {
                let sigma = (1.0 + d.cv * d.cv).ln().sqrt();
                let mu = d.mean_us.max(1e-3).ln() - sigma * sigma / 2.0;
                LogNormal::new(mu, sigma).ok().map(|l| (*k, (l, d.mean_us)))
            })
            .collect();
        Work {
            dists,
            rng: SmallRng::seed_from_u64(seed),
            scale,
            spin,
            stream,
            hang: false,
            step: 0,
        }
    }

    /// Where `--hang-rank` hangs, inside a section: once armed for the step, blocks forever
    /// (a host-slept kernel), or enqueues a kernel that never finishes on the rank's stream, so
    /// that the host blocks at its next synchronize and the stream never reaches what follows.
    fn hang_here(&mut self) {
        if !std::mem::take(&mut self.hang) {
            return;
        }
        match &self.stream {
            Some(s) => s.enqueue(FOREVER),
            None => loop {
                std::thread::sleep(FOREVER);
            },
        }
    }

    /// One draw of `bucket`'s time, times `factor`: slept on the host, or enqueued as a kernel.
    fn run(&mut self, bucket: &str, factor: f64) {
        let Some((dist, mean)) = self.dists.get(bucket) else {
            return;
        };
        let us = if *mean == 0.0 {
            0.0
        } else {
            dist.sample(&mut self.rng)
        };
        let d = validate::kernel_time(us, self.scale, factor);
        match &self.stream {
            Some(s) => s.enqueue(d),
            None => spin_sleep(d, self.spin),
        }
    }

    /// Host-side work (enqueue, routing bookkeeping): always slept.
    fn host(&mut self, bucket: &str) {
        let stream = self.stream.take();
        self.run(bucket, 1.0);
        self.stream = stream;
    }

    /// Waits for the rank's stream (reading results back), when there is one.
    fn synchronize(&self) {
        if let Some(s) = &self.stream {
            s.synchronize();
        }
    }
}

/// How long a hung kernel runs: longer than any demo (finite, so that device times stay
/// ordinary numbers).
const FOREVER: Duration = Duration::from_secs(10 * 365 * 86_400);

/// How long the demo waits for its ranks to reach a step boundary after Ctrl-C or SIGTERM
/// before it exits without the ones still blocked (a hung rank, or the ranks waiting for it).
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Sleeps long waits, spins the last stretch (`spin`): host sleeps overshoot by tens of µs.
fn spin_sleep(d: Duration, spin: Duration) {
    let end = Instant::now() + d;
    if spin.is_zero() {
        std::thread::sleep(d);
        return;
    }
    if d > 2 * spin {
        std::thread::sleep(d - spin);
    }
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// Where the ranks meet: threads of this process, or processes over TCP.
enum Meeting {
    Threads(Barrier),
    /// Only one rank thread uses it (one rank per process); the mutex is never contended.
    Tcp(Mutex<TcpRendezvous>),
}

/// What every rank shares: the rendezvous, the stop decision and progress.
struct Group {
    meeting: Meeting,
    /// The rank that counts progress (rank 0 with threads; this process's rank with --rank).
    counter: u32,
    stop_requested: Arc<AtomicBool>,
    stop_now: AtomicBool,
    steps_done: AtomicU64,
    tokens_done: AtomicU64,
    started: Instant,
    /// The requests the ranks serve (`crate::requests`): planned by the counting rank.
    serving: Serving,
}

struct Plan {
    layers: u32,
    dense_layers: u32,
    dsa_every: u32,
    experts: u32,
    top_k: u32,
    max_steps: Option<u64>,
    deadline: Option<Duration>,
    /// `--straggler-rank`, `--straggler-factor` and `--straggler-after`.
    straggler: Option<(u32, f64, Duration)>,
    straggler_period: Option<f64>,
    straggler_factor: f64,
    slow_steps: Option<(u64, f64)>,
    /// `--hang-rank` and the steps it completes before hanging.
    hang: Option<(u32, u64)>,
    spec: Option<u32>,
    acceptance: f64,
    ranks: u32,
    /// `--route-skew`.
    route_skew: f64,
    /// `--expert-parallel`.
    expert_parallel: Option<u32>,
    /// Seeds the routing, which every rank can recompute for every other.
    seed: u64,
}

impl Group {
    /// Every rank of the group waits here until all have arrived.
    fn meet(&self) -> Result<(), RendezvousError> {
        match &self.meeting {
            Meeting::Threads(b) => {
                b.wait();
                Ok(())
            }
            Meeting::Tcp(t) => t
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .meet(false)
                .map(|_| ()),
        }
    }

    /// The stop decision of the whole group at a step boundary: rank 0 decides (`done`), and
    /// with processes any rank may ask (Ctrl-C on it), so that none is left at a rendezvous.
    fn decide_stop(&self, rank: u32, done: bool) -> Result<bool, RendezvousError> {
        match &self.meeting {
            Meeting::Threads(b) => {
                if rank == 0 {
                    self.stop_now.store(done, Ordering::Relaxed);
                }
                b.wait();
                let stop = self.stop_now.load(Ordering::Relaxed);
                b.wait();
                Ok(stop)
            }
            Meeting::Tcp(t) => t
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .meet(done || self.stop_requested.load(Ordering::Relaxed)),
        }
    }
}

impl Plan {
    /// The experts that `rank`'s token of `step` is routed to in `layer`: the same on every rank
    /// that asks, so that under expert parallelism each rank knows what it receives.
    fn route(&self, step: u64, layer: u32, rank: u32, ids: &mut [u32]) {
        let key = self.seed
            ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (u64::from(layer) << 32)
            ^ u64::from(rank).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        let mut rng = SmallRng::seed_from_u64(key);
        for id in ids.iter_mut() {
            let u: f64 = rng.random();
            *id = (u.powf(self.route_skew) * f64::from(self.experts)) as u32 % self.experts;
        }
    }

    /// Under `--expert-parallel`, the routed-expert time of `rank` in `layer` at `step` relative
    /// to a balanced placement: the tokens its block of experts gets from every rank, over
    /// the mean per expert-parallel rank (0 for a rank that hosts none).
    fn expert_factor(&self, step: u64, layer: u32, rank: u32) -> f64 {
        let Some(ep) = self.expert_parallel else {
            return 1.0;
        };
        let k = self.top_k.min(self.experts) as usize;
        let block = self.experts.div_ceil(ep).max(1);
        let mut ids = [0u32; 64];
        let mut mine = 0usize;
        for src in 0..self.ranks {
            self.route(step, layer, src, &mut ids[..k]);
            mine += ids[..k].iter().filter(|&&id| id / block == rank).count();
        }
        let mean = (self.ranks as usize * k) as f64 / f64::from(ep);
        mine as f64 / mean.max(1e-9)
    }

    /// Whether step `step` (from 0) is one made slow on purpose.
    fn slow_step(&self, step: u64) -> bool {
        self.slow_steps
            .is_some_and(|(n, _)| (step + 1).is_multiple_of(n))
    }

    /// The compute slowdown of `rank` right now, in step `step`.
    fn factor(&self, rank: u32, elapsed: Duration, step: u64) -> f64 {
        if let (true, Some((_, f))) = (self.slow_step(step), self.slow_steps) {
            return f;
        }
        if let Some((r, f, after)) = self.straggler
            && r == rank
            && elapsed >= after
        {
            return f;
        }
        if let Some(p) = self.straggler_period
            && p > 0.0
        {
            let f = self.straggler_factor;
            let t = elapsed.as_secs_f64();
            let period = (t / p) as u64;
            let in_window = (t % p) < p / 3.0;
            if in_window && (period % u64::from(self.ranks)) as u32 == rank {
                return f;
            }
        }
        1.0
    }
}

/// One decoder layer of one rank: the engine's instrumented forward pass.
fn layer_forward(
    rec: &Recorder,
    work: &mut Work,
    plan: &Plan,
    group: &Group,
    layer: u32,
    f: f64,
    round: Option<phasetrace::RoundRef>,
) -> Result<(), RendezvousError> {
    {
        let _s = rec.section(Section::MHC, layer, Site::NONE);
        work.run("mhc", f);
    }
    {
        let _s = rec.section(Section::NORM, layer, Site::NONE);
        work.run("norm", f);
    }
    if layer % plan.dsa_every == plan.dsa_every - 1 {
        let _v = round.map(|r| rec.verify_part(r, VerifyPart::Mla));
        for (s, b) in [
            (Section::DSA_PROJ, "dsa_proj"),
            (Section::DSA_INDEXER, "dsa_indexer"),
            (Section::DSA_SELECT, "dsa_select"),
            (Section::DSA_ATTEND, "dsa_attend"),
        ] {
            let _s = rec.section(s, layer, Site::ATTN);
            work.run(b, f);
            if s == Section::DSA_ATTEND {
                work.hang_here();
            }
        }
    } else {
        let _v = round.map(|r| rec.verify_part(r, VerifyPart::Kda));
        let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        {
            let _s = rec.section(Section::KDA_FRONT, layer, Site::ATTN);
            work.run("kda_front", f);
        }
        {
            let _scan = round.map(|r| rec.verify_part(r, VerifyPart::KdaScan));
            let _s = rec.section(Section::KDA_RECUR, layer, Site::ATTN);
            work.run("kda_recur", f);
        }
        {
            let _s = rec.section(Section::KDA_BACK, layer, Site::ATTN);
            work.run("kda_back", f);
            work.hang_here();
        }
    }
    all_reduce(rec, work, group, layer, Site::ATTN)?;
    {
        let _s = rec.section(Section::MHC_POST, layer, Site::NONE);
        work.run("mhc_post", f);
    }
    let _ffn = round.map(|r| rec.verify_part(r, VerifyPart::Ffn));
    if layer < plan.dense_layers {
        let _s = rec.section(Section::MLP_DENSE, layer, Site::MLP);
        work.run("mlp_dense", f);
    } else {
        {
            let _s = rec.section(Section::MOE_ROUTER, layer, Site::MLP);
            work.run("moe_router", f);
        }
        {
            // Reading the routed expert ids back to the host waits for the router.
            let _s = rec.section(Section::MOE_HOSTSYNC, layer, Site::MLP);
            work.synchronize();
            work.run("moe_hostsync", f);
        }
        // Skewed routing (--route-skew): low expert ids are hot, as in real MoE traffic.
        let mut ids = [0u32; 64];
        let k = plan.top_k.min(plan.experts) as usize;
        plan.route(work.step, layer, rec.rank(), &mut ids[..k]);
        rec.moe_route(layer, &ids[..k]);
        let ep = plan.expert_factor(work.step, layer, rec.rank());
        for (s, b, g) in [
            (Section::MOE_EXPERTS, "moe_experts", ep),
            (Section::MOE_SHARED, "moe_shared", 1.0),
            (Section::MOE_COMBINE, "moe_combine", 1.0),
        ] {
            let _s = rec.section(s, layer, Site::MLP);
            work.run(b, f * g);
        }
    }
    drop(_ffn);
    all_reduce(rec, work, group, layer, Site::MLP)
}

/// An all-reduce: host enqueue, the rendezvous probe (every rank waits for the slowest), then
/// the reduction itself.
fn all_reduce(
    rec: &Recorder,
    work: &mut Work,
    group: &Group,
    layer: u32,
    site: Site,
) -> Result<(), RendezvousError> {
    let (enq, bar, red, enq_b, red_b) = if site == Site::ATTN {
        (
            Section::REDUCE_ATTN_ENQ,
            Section::REDUCE_ATTN_BAR,
            Section::REDUCE_ATTN,
            "reduce_attn_enq",
            "reduce_attn",
        )
    } else {
        (
            Section::REDUCE_MLP_ENQ,
            Section::REDUCE_MLP_BAR,
            Section::REDUCE_MLP,
            "reduce_mlp_enq",
            "reduce_mlp",
        )
    };
    {
        let _s = rec.host_section(enq, layer, site);
        work.host(enq_b);
    }
    if work.stream.is_some() {
        // On a device the probe is a tiny all-reduce that spins until every rank arrives: the
        // host waits for its own stream, meets the others, and the spin lands on the stream.
        work.synchronize();
        let t = Instant::now();
        group.meet()?;
        let waited = t.elapsed();
        let _s = rec.section(bar, layer, site);
        if let Some(s) = &work.stream {
            s.enqueue(waited);
        }
    } else {
        let _s = rec.section(bar, layer, site);
        group.meet()?;
    }
    let _s = rec.section(red, layer, site);
    work.run(red_b, 1.0);
    Ok(())
}

/// Geometric acceptance: each drafted token is accepted with probability p until one is not.
fn accepted(rng: &mut SmallRng, k: u32, p: f64) -> u32 {
    (0..k).take_while(|_| rng.random::<f64>() < p).count() as u32
}

fn rank_loop(
    rec: &Recorder,
    mut work: Work,
    plan: Arc<Plan>,
    group: Arc<Group>,
) -> Result<(), RendezvousError> {
    let rank = rec.rank();
    let mut step = 0u64;
    loop {
        // Every rank takes the same stop decision at the same step, so none is left waiting
        // at a rendezvous.
        if rank == group.counter {
            group.serving.plan(rec);
        }
        let done = rank == 0
            && (group.stop_requested.load(Ordering::Relaxed)
                || plan.deadline.is_some_and(|d| group.started.elapsed() >= d)
                || plan
                    .max_steps
                    .is_some_and(|m| group.steps_done.load(Ordering::Relaxed) >= m));
        if group.decide_stop(rank, done)? {
            break;
        }
        let batch = group.serving.batch();
        let f = plan.factor(rank, group.started.elapsed(), step) * batch.factor();
        work.hang = plan.hang == Some((rank, step));
        work.step = step;
        step += 1;
        let tokens = if let Some(k) = plan.spec {
            let round = rec.round(k);
            work.run("draft", f * f64::from(k));
            work.synchronize();
            round.phase(Phase::Draft);
            {
                let _step = rec.step_of(batch.kind(true));
                batch.serve(rec);
                for layer in 0..plan.layers {
                    layer_forward(
                        rec,
                        &mut work,
                        &plan,
                        &group,
                        layer,
                        f,
                        Some(round.as_ref()),
                    )?;
                }
            }
            round.phase(Phase::Verify);
            let a = accepted(&mut work.rng, k, plan.acceptance);
            work.run("accept", f);
            round.phase(Phase::Accept);
            if a < k {
                work.run("rollback", f);
                round.phase(Phase::Rollback);
            }
            work.run("maint", f);
            round.phase(Phase::Maint);
            round.end(a);
            u64::from(a) + 1
        } else {
            let _step = rec.step_of(batch.kind(false));
            batch.serve(rec);
            for layer in 0..plan.layers {
                layer_forward(rec, &mut work, &plan, &group, layer, f, None)?;
            }
            work.synchronize(); // the sampled token is read back
            1
        };
        if rank == group.counter {
            group.serving.finish_step(rec);
        }
        if rank == group.counter {
            group.steps_done.fetch_add(1, Ordering::Relaxed);
            group.tokens_done.fetch_add(tokens, Ordering::Relaxed);
        }
    }
    if rank == group.counter {
        group.serving.stop(rec);
    }
    Ok(())
}

/// A rank thread: its recorder comes back with its result.
type RankThread = std::thread::JoinHandle<(Recorder, Result<(), RendezvousError>)>;

pub(crate) fn run(a: DemoArgs) -> Result<(), Failure> {
    if a.engine == Engine::Candle {
        #[cfg(feature = "candle")]
        return candle::run(a);
        #[cfg(not(feature = "candle"))]
        return Err(Failure::config(
            "--engine candle: this phasetrace was built without the `candle` feature",
        ));
    }
    a.validate()?;
    a.requests.check().map_err(Failure::config)?;
    let mut dists = default_dists();
    if let Some(p) = &a.profile {
        load_profile(p, &mut dists)?;
    }
    // The ranks this process runs: all of them as threads, or only --rank.
    let local: Vec<u32> = match a.rank {
        Some(r) => vec![r],
        None => (0..a.ranks).collect(),
    };

    // 1. Setup: the profiler, the plan, the group the ranks meet in.
    let (profiler, timing, streams) = setup_profiler(&a, &local)?;
    let stop_requested = Arc::new(AtomicBool::new(false));
    {
        let s = stop_requested.clone();
        // A second Ctrl-C while flushing falls back to the default action.
        let _ = ctrlc::set_handler(move || {
            if s.swap(true, Ordering::Relaxed) {
                std::process::exit(130);
            }
        });
    }
    let plan = Arc::new(Plan::of(&a));
    let group = setup_group(&a, &profiler, &local, stop_requested.clone())?;

    // 2. The rank loops: one recorder per rank thread.
    let handles = spawn_ranks(
        &a, &profiler, &local, streams, timing, &dists, &plan, &group,
    )?;
    if let Some((r, n)) = plan.hang
        && local.contains(&r)
    {
        eprintln!(
            "phasetrace: rank {r} will hang in its step {n} (--hang-rank), inside layer 0's attention mixer"
        );
    }
    let tty = std::io::stderr().is_terminal();
    watch(&handles, &stop_requested, &group, &plan, tty);
    let (recorders, failure) = join_ranks(&a, handles, &local, &plan, tty);

    // 3. The report.
    report(&a, &profiler, &group, &plan);
    if a.linger > 0.0 && !stop_requested.load(Ordering::Relaxed) {
        let until = Instant::now() + Duration::from_secs_f64(a.linger);
        while Instant::now() < until && !stop_requested.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    drop(recorders);
    profiler.shutdown();
    failure.map_or(Ok(()), Err)
}

/// The profiler: defaults, then environment, then flags (the demo records by default); the
/// timing backend, and the (simulated) stream of each local rank when it needs one.
fn setup_profiler(
    a: &DemoArgs,
    local: &[u32],
) -> Result<(Profiler, Timing, Vec<Option<SimStream>>), Failure> {
    let mut builder = Profiler::builder().with_level(SectionLevel::Full);
    if let Some(r) = a.rank {
        builder = builder.with_rank(r);
    }
    // The demo knows its experts: the imbalance's mean counts the ones that got nothing.
    builder = builder.with_moe_experts(a.experts);
    if let Some(n) = a.expert_parallel {
        builder = builder.with_expert_parallel(n);
    }
    if a.spec.is_some() {
        builder = builder.with_spec_level(SpecLevel::VerifySplit);
        builder = builder.with_spec_k_max(a.spec.unwrap_or(16));
    }
    // The timing backend decides whether the ranks need (simulated) streams.
    let timing = a
        .flags
        .apply(Profiler::builder())
        .map_err(Failure::config)?
        .config()
        .map_err(Failure::config)?
        .timing;
    let gpu_sim = a.gpu_sim || timing != Timing::Host;
    let streams: Vec<Option<SimStream>> =
        local.iter().map(|_| gpu_sim.then(SimStream::new)).collect();
    if let Some(Some(s)) = streams.first() {
        builder = builder.with_stream(s.clone());
    }
    let profiler = a.flags.apply(builder).map_err(Failure::config)?.build()?;
    if gpu_sim {
        eprintln!(
            "phasetrace: simulated GPU streams, timing backend {}",
            timing.as_str()
        );
    }
    say_exporters(&profiler);
    Ok((profiler, timing, streams))
}

/// Says on stderr where the profiler's telemetry goes: the Prometheus endpoint's address and
/// the OTLP protocol and endpoint, those that are on (both demos' startup lines).
fn say_exporters(profiler: &Profiler) {
    if let Some(url) = profiler.prometheus_url() {
        eprintln!("phasetrace: Prometheus metrics at {url}");
    }
    if let Some(o) = &profiler.config().otlp {
        eprintln!(
            "phasetrace: exporting OTLP {} to {}",
            o.protocol.as_str(),
            o.endpoint
        );
    }
}

impl Plan {
    fn of(a: &DemoArgs) -> Plan {
        Plan {
            layers: a.layers,
            dense_layers: a.dense_layers,
            dsa_every: a.dsa_every,
            experts: a.experts,
            top_k: a.top_k,
            max_steps: (!a.forever && a.duration.is_none()).then_some(a.steps.unwrap_or(STEPS)),
            deadline: if a.forever {
                None
            } else {
                a.duration.map(Duration::from_secs_f64)
            },
            straggler: a.straggler_rank.map(|r| {
                (
                    r,
                    a.straggler_factor,
                    Duration::from_secs_f64(a.straggler_after),
                )
            }),
            straggler_period: a.straggler_period,
            straggler_factor: a.straggler_factor,
            slow_steps: a.slow_steps.map(|n| (n, a.slow_factor)),
            hang: a.hang_rank.map(|r| (r, a.hang_after_steps)),
            spec: a.spec,
            acceptance: a.acceptance,
            ranks: a.ranks,
            route_skew: a.route_skew,
            expert_parallel: a.expert_parallel,
            seed: a.seed,
        }
    }
}

/// The group secret's key: `--rendezvous-secret-file`, else the variables
/// (`rendezvous::group_secret`); a bad one is a usage error naming its input.
fn group_key(a: &DemoArgs) -> Result<GroupKey, Failure> {
    group_secret(a.rendezvous_secret_file.as_deref())
        .map(|s| GroupKey::new(s.as_deref()))
        .map_err(Failure::config)
}

/// The group the local ranks meet in (threads, or a TCP rendezvous with --rank), with the
/// request scheduler when this process schedules requests.
fn setup_group(
    a: &DemoArgs,
    profiler: &Profiler,
    local: &[u32],
    stop_requested: Arc<AtomicBool>,
) -> Result<Arc<Group>, Failure> {
    let meeting = match (&a.rendezvous, a.rank) {
        (Some(addr), Some(r)) => {
            eprintln!(
                "phasetrace: rank {r} of {} in group {}: {} the rendezvous at {addr}",
                a.ranks,
                profiler.config().group,
                if r == 0 { "listening for" } else { "joining" }
            );
            let key = group_key(a).inspect_err(|_| profiler.shutdown())?;
            let t = TcpRendezvous::join(
                addr,
                r,
                a.ranks,
                &profiler.config().group,
                &key,
                Duration::from_secs_f64(a.rendezvous_timeout),
            )
            .map_err(|e| {
                profiler.shutdown();
                Failure::runtime(format!("rank {r} of {}: {e}", a.ranks))
            })?;
            Meeting::Tcp(Mutex::new(t))
        }
        _ => Meeting::Threads(Barrier::new(a.ranks as usize)),
    };
    let group = Arc::new(Group {
        meeting,
        counter: local[0],
        stop_requested,
        stop_now: AtomicBool::new(false),
        steps_done: AtomicU64::new(0),
        tokens_done: AtomicU64::new(0),
        started: Instant::now(),
        serving: Serving::default(),
    });
    // Requests are scheduled in this process unless it runs a rank other than 0 of a group
    // of processes (whose steps then serve no batch).
    if a.requests.rate() > 0.0 && a.rank.is_none_or(|r| r == 0) {
        let spec = a.spec.map(|k| (k, a.acceptance));
        let s = Scheduler::new(&a.requests, profiler, a.seed, spec)?;
        *group
            .serving
            .scheduler
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(s);
    }
    Ok(group)
}

/// Starts one thread per local rank, each with its recorder, running [`rank_loop`].
#[allow(clippy::too_many_arguments)]
fn spawn_ranks(
    a: &DemoArgs,
    profiler: &Profiler,
    local: &[u32],
    streams: Vec<Option<SimStream>>,
    timing: Timing,
    dists: &HashMap<&'static str, Dist>,
    plan: &Arc<Plan>,
    group: &Arc<Group>,
) -> Result<Vec<RankThread>, Failure> {
    let mut handles = Vec::new();
    for (&rank, stream) in local.iter().zip(streams) {
        let mut opts = RecorderOptions::new().rank(rank);
        if let Some(s) = &stream {
            opts = opts.clock(phasetrace_sim::clock(s, timing));
        }
        let rec = profiler.recorder_with(opts);
        let work = Work::new(
            dists,
            a.seed.wrapping_add(u64::from(rank)),
            a.time_scale,
            Duration::from_micros(a.spin_us),
            stream,
        );
        let (plan, group) = (plan.clone(), group.clone());
        // The recorder comes back with the result: an idle engine keeps its recorders (and
        // their series, `phasetrace.step.open_duration` at 0) while it lingers.
        handles.push(
            std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn(move || {
                    let r = rank_loop(&rec, work, plan, group);
                    (rec, r)
                })
                .map_err(Failure::runtime)?,
        );
    }
    Ok(handles)
}

/// Waits for the rank threads (at most [`STOP_GRACE`] after a stop request), showing progress
/// on a terminal.
fn watch(
    handles: &[RankThread],
    stop_requested: &AtomicBool,
    group: &Group,
    plan: &Plan,
    tty: bool,
) {
    let mut stop_seen: Option<Instant> = None;
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(250));
        if stop_requested.load(Ordering::Relaxed)
            && stop_seen.get_or_insert_with(Instant::now).elapsed() >= STOP_GRACE
        {
            break;
        }
        if tty {
            let steps = group.steps_done.load(Ordering::Relaxed);
            let tokens = group.tokens_done.load(Ordering::Relaxed);
            let secs = group.started.elapsed().as_secs_f64().max(1e-9);
            let of = plan.max_steps.map_or(String::new(), |m| format!("/{m}"));
            eprint!(
                "\r  steps {steps}{of}  {:.0} tokens/s  {:.1}s   ",
                tokens as f64 / secs,
                secs
            );
            let _ = std::io::stderr().flush();
        }
    }
}

/// The recorders of the rank threads that finished, and the first failure: a rank's error, a
/// panic, or ranks still blocked inside a step (unless --hang-rank asked for it).
fn join_ranks(
    a: &DemoArgs,
    handles: Vec<RankThread>,
    local: &[u32],
    plan: &Plan,
    tty: bool,
) -> (Vec<Recorder>, Option<Failure>) {
    let mut failure = None;
    let mut recorders = Vec::new();
    let mut blocked = Vec::new();
    for (h, rank) in handles.into_iter().zip(local) {
        if !h.is_finished() {
            // Stopped while it is blocked inside a step: left behind (its thread ends with
            // the process).
            blocked.push(rank.to_string());
            continue;
        }
        match h.join() {
            Ok((rec, Ok(()))) => recorders.push(rec),
            Ok((rec, Err(e))) => {
                recorders.push(rec);
                let f = Failure::runtime(format!("rank {rank} of {}: {e}", a.ranks));
                // Said at once: with --linger the endpoint stays up a while before the exit.
                eprintln!("phasetrace: {}", f.message);
                failure.get_or_insert(f);
            }
            Err(_) => {
                failure.get_or_insert(Failure::runtime("a rank thread panicked"));
            }
        }
    }
    if tty {
        eprintln!();
    }
    if !blocked.is_empty() {
        let f = Failure::runtime(format!(
            "{} {} of {} still blocked inside a step {}s after the stop request ({}); exiting without {}",
            if blocked.len() == 1 { "rank" } else { "ranks" },
            blocked.join(", "),
            a.ranks,
            STOP_GRACE.as_secs(),
            match plan.hang {
                Some((r, _)) => format!("--hang-rank {r}"),
                None => "a hung rank or collective".to_owned(),
            },
            if blocked.len() == 1 { "it" } else { "them" },
        ));
        eprintln!("phasetrace: {}", f.message);
        // A hang asked for with --hang-rank is the demo doing as told.
        if plan.hang.is_none() {
            failure.get_or_insert(f);
        }
    }
    (recorders, failure)
}

/// The closing report: the summary table (unless the profiler prints it), steps, tokens,
/// sections, spans and drops, the requests, the steps made slow.
fn report(a: &DemoArgs, profiler: &Profiler, group: &Group, plan: &Plan) {
    let wall = group.started.elapsed().as_secs_f64();
    let steps = group.steps_done.load(Ordering::Relaxed);
    let tokens = group.tokens_done.load(Ordering::Relaxed);

    profiler.flush();
    let stats = profiler.stats();
    // With a periodic console summary the profiler prints the final table itself at shutdown.
    if profiler.is_enabled() && profiler.config().summary_every == 0 {
        eprint!("{}", profiler.summary());
    }
    eprintln!(
        "demo: {steps} steps, {tokens} tokens on {} x {} layers in {wall:.2}s ({:.0} tokens/s); {} sections, {} spans, dropped:{}",
        match a.rank {
            Some(r) => format!("rank {r} of {} ranks", a.ranks),
            None => format!("{} ranks", a.ranks),
        },
        a.layers,
        tokens as f64 / wall.max(1e-9),
        stats.sections,
        stats.spans,
        stats
            .dropped
            .iter()
            .map(|(reason, n)| format!(" {reason}={n}"))
            .collect::<String>(),
    );
    if let Some(r) = group.serving.figures() {
        eprintln!(
            "demo: {} requests begun, {} ended, {} still open cancelled at the stop, {} preempted for KV-cache blocks ({} in all); --request-rate {}/s, --max-batch {}",
            r.begun,
            r.ended,
            r.cancelled + (r.waiting + r.running) as u64,
            r.preemptions,
            a.requests.total_kv_blocks(),
            a.requests.rate(),
            a.requests.max_batch,
        );
    }
    if let Some((n, f)) = plan.slow_steps {
        let slow = (0..steps).filter(|&s| plan.slow_step(s)).count();
        eprintln!(
            "demo: {slow} steps made slow on purpose ({f}x: every {n}th, steps {} to {}); {} traced for being slow, {} slow ones over the tail budget",
            n - 1,
            (steps / n * n).saturating_sub(1),
            stats.tail_traces,
            stats.dropped[phasetrace::DropReason::TailBudget],
        );
    }
}
