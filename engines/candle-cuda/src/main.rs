//! The candle decoder of `phasetrace-candle` on candle's CUDA device, its stream timed by
//! phasetrace: the GPU check of the reference integration (run by `scripts/gpu-check.sh`).
//!
//! ```text
//! device  = candle Device::new_cuda_with_stream(0)        (candle's own stream, cudarc 0.19)
//! stream  = device.as_cuda_device()?.cuda_stream()        Arc<cudarc::driver::CudaStream>
//! profile = Profiler::builder().with_stream(stream)       PHASETRACE_TIMING picks the clock:
//!             host   the host clock (enqueue time of GPU work)
//!             sync   cuStreamSynchronize, then the host clock (serializes every boundary)
//!             events pooled CUDA events on candle's stream, resolved by the worker
//! run     = phasetrace_candle::generate(&RunOptions { device, .. }, Some(&profiler))
//! ```
//!
//! With `--serve` the engine serves requests under continuous batching (the engine's default
//! `Workload`) instead of decoding one sequence, and every figure's name starts with
//! `serving: `.
//!
//! One run interleaves the variants round by round (unprofiled, host, sync, events) on the same
//! model, after an unprofiled warm-up that loads candle's kernels, and prints one table: tokens/s
//! per variant and its ratio to unprofiled, whether every variant generated the same tokens, and
//! each layer's time per token as the event clock, the sync clock and the host clock see it
//! (from the exported `phasetrace.section.duration` histograms, by `layer`).
//!
//! Every row is a `FIGURE\t<name>\t<value>\t<goal>\t<verdict>` line on stdout, which
//! `scripts/gpu-check.sh` gathers into its table. Any failure, no driver or no device included,
//! is one line on stderr and exit status 2 (never a panic). The binary is linked against the
//! CUDA libraries (candle-core's `cuda` feature selects cudarc's `dynamic-linking`): without
//! `libcuda.so.1`, `libcublas.so.13` and friends on the loader path it cannot start at all, which
//! `gpu-check.sh` checks first.

use candle_core::Device;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use phasetrace::timing::{EngineStream, cuda};
use phasetrace::{Profiler, SectionLevel, Timing};
use phasetrace_candle::{
    EngineError, ModelConfig, RunOptions, Workload, checksum, generate, prompt, weights,
};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: phasetrace-candle-cuda [--probe] [--serve] [--steps N] [--rounds N] \
                     [--ranks N] [--layers N] [--dense-layers N] [--experts N] [--top-k N] \
                     [--seed N]";

/// With `--serve`, every figure's name starts with this: the run serves requests under
/// continuous batching (the engine's default `Workload`) instead of decoding one sequence.
static TAG: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

#[derive(Debug, thiserror::Error)]
enum CheckError {
    #[error("{0}")]
    Cuda(#[from] cuda::TimingError),
    #[error("candle's CUDA device 0: {0}")]
    Device(candle_core::Error),
    #[error("{0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Profiler(#[from] phasetrace::Error),
    #[error("the engine's meter provider: {0}")]
    Metrics(String),
    #[error("{arg}: {why} ({USAGE})")]
    Args { arg: String, why: String },
}

struct Args {
    help: bool,
    probe: bool,
    serve: bool,
    steps: usize,
    rounds: usize,
    ranks: usize,
    seed: u64,
    cfg: ModelConfig,
}

impl Args {
    fn parse() -> Result<Args, CheckError> {
        let mut a = Args {
            help: false,
            probe: false,
            serve: false,
            steps: 48,
            rounds: 5,
            ranks: 1,
            seed: 7,
            cfg: ModelConfig::default(),
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            if arg == "--probe" {
                a.probe = true;
                continue;
            }
            if arg == "--serve" {
                a.serve = true;
                continue;
            }
            if arg == "--help" || arg == "-h" {
                a.help = true;
                continue;
            }
            let mut value = |min: u64| -> Result<u64, CheckError> {
                let text = it.next().ok_or_else(|| CheckError::Args {
                    arg: arg.clone(),
                    why: "expected a value".into(),
                })?;
                match text.parse::<u64>() {
                    Ok(n) if n >= min => Ok(n),
                    _ => Err(CheckError::Args {
                        arg: format!("{arg} {text}"),
                        why: format!("expected an integer of at least {min}"),
                    }),
                }
            };
            match arg.as_str() {
                "--steps" => a.steps = value(1)? as usize,
                "--rounds" => a.rounds = value(1)? as usize,
                "--ranks" => a.ranks = value(1)? as usize,
                "--seed" => a.seed = value(0)?,
                "--layers" => a.cfg.layers = value(1)? as usize,
                "--dense-layers" => a.cfg.dense_layers = value(0)? as usize,
                "--experts" => a.cfg.experts = value(0)? as usize,
                "--top-k" => a.cfg.top_k = value(1)? as usize,
                _ => {
                    return Err(CheckError::Args {
                        arg,
                        why: "unknown argument".into(),
                    });
                }
            }
        }
        Ok(a)
    }
}

/// The variants, in the order each round runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Unprofiled,
    Host,
    Sync,
    Events,
}

const VARIANTS: [Variant; 4] = [
    Variant::Unprofiled,
    Variant::Host,
    Variant::Sync,
    Variant::Events,
];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Unprofiled => "unprofiled",
            Variant::Host => "host clock",
            Variant::Sync => "sync clock",
            Variant::Events => "events clock",
        }
    }
}

/// What the variants measured over every round.
#[derive(Default)]
struct Tally {
    tokens_per_s: Vec<f64>,
    checksums: Vec<String>,
    /// Seconds by layer (`""`: sections outside any layer), summed over rounds.
    layers: BTreeMap<String, f64>,
    /// Step seconds, summed over rounds.
    steps_s: f64,
    tokens: usize,
    dropped: u64,
}

/// A meter provider whose exporter keeps what it receives (exported on `force_flush`).
fn provider() -> (SdkMeterProvider, InMemoryMetricExporter) {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(
            PeriodicReader::builder(exporter.clone())
                .with_interval(Duration::from_secs(3600))
                .build(),
        )
        .with_view(phasetrace::view(false))
        .build();
    (provider, exporter)
}

/// Histogram `name`'s sums by the value of attribute `key`, in the last export.
fn histogram_sums(metrics: &[ResourceMetrics], name: &str, key: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Some(rm) = metrics.last() else {
        return out;
    };
    for scope in rm.scope_metrics() {
        for m in scope.metrics().filter(|m| m.name() == name) {
            if let AggregatedMetrics::F64(MetricData::Histogram(h)) = m.data() {
                for p in h.data_points() {
                    let v = p
                        .attributes()
                        .find(|kv| kv.key.as_str() == key)
                        .map(|kv| kv.value.to_string())
                        .unwrap_or_default();
                    *out.entry(v).or_insert(0.0) += p.sum();
                }
            }
        }
    }
    out
}

/// One run of `variant`: the generated tokens and, when profiled, what was exported.
fn run_variant<S: EngineStream + Clone>(
    opts: &RunOptions,
    stream: &S,
    variant: Variant,
    tally: &mut Tally,
) -> Result<(), CheckError> {
    let timing = match variant {
        Variant::Unprofiled => None,
        Variant::Host => Some(Timing::Host),
        Variant::Sync => Some(Timing::Sync),
        Variant::Events => Some(Timing::Events),
    };
    let Some(timing) = timing else {
        let out = generate(opts, None)?;
        tally.tokens_per_s.push(out.tokens_per_second());
        tally.checksums.push(checksum(&out.tokens));
        tally.tokens += out.tokens.len();
        return Ok(());
    };
    let (provider, exporter) = provider();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(0)
        .with_meter_provider(provider.clone())
        .with_timing(timing)
        .with_stream(stream.clone())
        .build()?;
    let out = generate(opts, Some(&profiler))?;
    profiler.flush();
    tally.dropped += profiler.stats().dropped.total();
    profiler.shutdown();
    provider
        .force_flush()
        .map_err(|e| CheckError::Metrics(e.to_string()))?;
    let metrics = exporter
        .get_finished_metrics()
        .map_err(|e| CheckError::Metrics(e.to_string()))?;
    let _ = provider.shutdown();
    tally.tokens_per_s.push(out.tokens_per_second());
    tally.checksums.push(checksum(&out.tokens));
    tally.tokens += out.tokens.len();
    for (layer, s) in histogram_sums(
        &metrics,
        phasetrace_names::metric::SECTION_DURATION,
        phasetrace_names::attr::LAYER,
    ) {
        *tally.layers.entry(layer).or_insert(0.0) += s;
    }
    tally.steps_s += histogram_sums(
        &metrics,
        phasetrace_names::metric::STEP_DURATION,
        phasetrace_names::attr::RANK,
    )
    .get("0")
    .copied()
    .unwrap_or(0.0);
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn figure(name: &str, value: String, goal: &str, verdict: &str) {
    let tag = TAG.get().copied().unwrap_or("");
    println!("FIGURE\t{tag}{name}\t{value}\t{goal}\t{verdict}");
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("phasetrace-candle-cuda: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), CheckError> {
    let a = Args::parse()?;
    if a.help {
        println!("{USAGE}");
        return Ok(());
    }
    // phasetrace's probe first: a missing driver function or a failed cuInit is an error here,
    // before candle touches the driver.
    let ctx = cuda::open_device(0)?;
    let name = ctx.name().unwrap_or_else(|_| "unknown".into());
    drop(ctx);
    let device = Device::new_cuda_with_stream(0).map_err(CheckError::Device)?;
    let stream = device
        .as_cuda_device()
        .map_err(CheckError::Device)?
        .cuda_stream();
    if a.probe {
        println!("device 0: {name} (candle's CUDA device, its own stream)");
        return Ok(());
    }
    let cfg = a.cfg.clone();
    let tensors = weights::random(&cfg, a.seed)?;
    let opts = RunOptions {
        ranks: a.ranks,
        device,
        serving: a.serve.then(|| Workload {
            seed: a.seed,
            ..Workload::default()
        }),
        ..RunOptions::new(cfg.clone(), tensors, a.steps, prompt(8, cfg.vocab, a.seed))
    };
    if a.serve {
        let _ = TAG.set("serving: ");
    }
    describe(&a, name);
    let started = Instant::now();
    // Warm-up: candle loads (JIT-compiles) each kernel module on first use.
    let warm = generate(&opts, None)?;
    let reference = checksum(&warm.tokens);
    let mut tallies: Vec<Tally> = VARIANTS.iter().map(|_| Tally::default()).collect();
    for _ in 0..a.rounds {
        for (v, t) in VARIANTS.iter().zip(tallies.iter_mut()) {
            run_variant(&opts, &stream, *v, t)?;
        }
    }
    report_speed(&tallies, &reference);
    report_layers(&tallies);
    report_shares(&tallies);
    figure(
        "candle check wall time",
        format!("{:.1} s", started.elapsed().as_secs_f64()),
        "",
        "",
    );
    Ok(())
}

/// The device, the model and the runs, as the table's first rows.
fn describe(a: &Args, device: String) {
    let cfg = &a.cfg;
    figure("device", device, "", "");
    figure(
        "model",
        format!(
            "{} layers ({} dense, {} MoE x {} experts top-{}), hidden {}, vocab {}, {} rank(s), f32",
            cfg.layers,
            if cfg.experts == 0 {
                cfg.layers
            } else {
                cfg.dense_layers.min(cfg.layers)
            },
            if cfg.experts == 0 {
                0
            } else {
                cfg.layers.saturating_sub(cfg.dense_layers)
            },
            cfg.experts,
            cfg.top_k,
            cfg.hidden,
            cfg.vocab,
            a.ranks
        ),
        "",
        "",
    );
    figure(
        "runs",
        format!(
            "{} rounds x {} variants x {} tokens, interleaved, after one unprofiled warm-up",
            a.rounds,
            VARIANTS.len(),
            a.steps
        ),
        "",
        "",
    );
}

/// Tokens/s of each variant against unprofiled, the same tokens everywhere, nothing dropped.
fn report_speed(tallies: &[Tally], reference: &str) {
    let base = median(&tallies[0].tokens_per_s);
    for (v, t) in VARIANTS.iter().zip(tallies) {
        let tps = median(&t.tokens_per_s);
        let ratio = tps / base;
        let (goal, verdict) = match v {
            Variant::Events => (">= 0.99x", if ratio >= 0.99 { "met" } else { "MISSED" }),
            _ => ("", ""),
        };
        figure(
            &format!("candle tokens/s {}", v.name()),
            format!("{tps:.1} ({ratio:.3}x, median of {})", t.tokens_per_s.len()),
            goal,
            verdict,
        );
    }
    let same = tallies
        .iter()
        .all(|t| t.checksums.iter().all(|c| c == reference));
    figure(
        "candle tokens identical in every variant",
        format!("checksum {reference}"),
        "same tokens",
        if same { "met" } else { "MISSED" },
    );
    let dropped: u64 = tallies.iter().map(|t| t.dropped).sum();
    figure(
        "candle records dropped",
        dropped.to_string(),
        "0",
        if dropped == 0 { "met" } else { "MISSED" },
    );
}

/// Each layer's time per token under each clock (the events clock judged: every layer timed).
fn report_layers(tallies: &[Tally]) {
    let per_token = |t: &Tally, layer: &str| -> Option<f64> {
        let s = t.layers.get(layer)?;
        Some(s * 1e6 / t.tokens.max(1) as f64)
    };
    let (host, sync, events) = (&tallies[1], &tallies[2], &tallies[3]);
    let mut layers: Vec<&String> = events
        .layers
        .keys()
        .chain(sync.layers.keys())
        .filter(|l| !l.is_empty())
        .collect();
    layers.sort_by_key(|l| l.parse::<u64>().unwrap_or(u64::MAX));
    layers.dedup();
    for layer in &layers {
        let show = |m: Option<f64>| m.map_or("-".to_owned(), |m| format!("{m:.1}"));
        let e = per_token(events, layer);
        figure(
            &format!("layer {layer} µs/token: events | sync | host"),
            format!(
                "{} | {} | {}",
                show(e),
                show(per_token(sync, layer)),
                show(per_token(host, layer))
            ),
            "events > 0",
            if e.is_some_and(|e| e > 0.0) {
                "met"
            } else {
                "MISSING"
            },
        );
    }
}

/// The layers' share of the step under each clock (the events clock judged: within the step).
fn report_shares(tallies: &[Tally]) {
    for (v, t) in VARIANTS.iter().zip(tallies).skip(1) {
        let layered: f64 = t
            .layers
            .iter()
            .filter(|(l, _)| !l.is_empty())
            .map(|(_, s)| s)
            .sum();
        let step_us = t.steps_s * 1e6 / t.tokens.max(1) as f64;
        let share = if t.steps_s > 0.0 {
            layered / t.steps_s
        } else {
            0.0
        };
        let judged = *v == Variant::Events;
        figure(
            &format!("layers' share of the step, {}", v.name()),
            format!("{:.1} % of {step_us:.1} µs/token", 100.0 * share),
            if judged { "<= 100 %" } else { "" },
            match (judged, share <= 1.0 + 1e-6 && share > 0.0) {
                (false, _) => "",
                (true, true) => "met",
                (true, false) => "MISSED",
            },
        );
    }
}
