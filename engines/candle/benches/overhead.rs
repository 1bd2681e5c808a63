//! phasetrace's overhead on real compute: tokens per second of the candle decoder (one rank,
//! the CPU, one decode step per iteration: `rec.step()` around a one-token forward with its
//! ~40 sections a layer... every section, all-reduce and route call of the engine) with:
//!
//! - `none`: no recorder at all (the engine without phasetrace);
//! - `off`: phasetrace built in, level `off` (one relaxed load per call);
//! - `full`: level `full` on the host clock, no spans (`PHASETRACE_TRACE_EVERY=0`);
//! - `full_sampled`: level `full`, one step in 100 traced as spans (the default).
//!
//! The variants run in one process, interleaved: first a pass of `ROUNDS` rounds (or
//! `PHASETRACE_BENCH_ROUNDS`), each timing `TOKENS` tokens of every variant in turn, the order
//! rotating from round to round so that no variant always runs first. Printed: each variant's
//! median tokens/s, and its ratio to `off` and to `none` paired within each round (the noise of
//! a shared machine moves every variant of a round alike), as the median of the rounds' ratios
//! with a 95 % bootstrap interval of that median: the figure in BENCHMARKS.md. Then criterion's
//! own groups with stable ids (`candle_decode/<variant>`).
//! The model: `BENCH_MODEL` (the demo's default shapes with 4 layers: 1 dense and 3 MoE with 64
//! experts, top-8), whose step takes 1-10 ms on the development machine.
//!
//! Run: `cargo bench -p phasetrace-candle --bench overhead`.

use criterion::{Criterion, criterion_group, criterion_main};
use phasetrace::{Profiler, Recorder, SectionLevel};
use phasetrace_candle::model::{KvCache, Model, Shard};
use phasetrace_candle::{Ctx, ModelConfig, weights};
use std::time::{Duration, Instant};

const ROUNDS: usize = 15;
const TOKENS: usize = 48;
/// Tokens before the cache starts over (same prompt), so steps stay alike.
const CONTEXT: usize = 96;

fn bench_model() -> ModelConfig {
    ModelConfig {
        layers: 4,
        ..ModelConfig::default()
    }
}

struct Variant {
    name: &'static str,
    /// Kept alive for the recorder.
    profiler: Option<Profiler>,
    rec: Option<Recorder>,
    cache: KvCache,
    next: u32,
}

fn variant(name: &'static str, level: Option<(SectionLevel, &str)>, layers: usize) -> Variant {
    let profiler = level.map(|(l, every)| {
        Profiler::builder()
            .without_env()
            .with_level(l)
            .with_text("PHASETRACE_TRACE_EVERY", every)
            .expect("a valid setting")
            .build()
            .expect("building the profiler")
    });
    let rec = profiler.as_ref().map(Profiler::recorder);
    Variant {
        name,
        profiler,
        rec,
        cache: KvCache::new(layers),
        next: 1,
    }
}

/// One decode step of `v`: a token through the whole model.
fn step(model: &Model, v: &mut Variant) {
    let layers = model.config().layers;
    if v.cache.len() >= CONTEXT {
        v.cache = KvCache::new(layers);
    }
    let mut ctx = Ctx::plain().expect("sections").recording(v.rec.as_ref());
    let _step = v.rec.as_ref().map(Recorder::step);
    let ids = model
        .forward(&mut ctx, &[v.next], &mut v.cache, layers)
        .expect("forward");
    v.next = ids[0];
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median of `v` with a 95 % bootstrap interval of it (2,000 resamples, a fixed seed).
fn median_with_interval(v: &[f64]) -> (f64, f64, f64) {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        // xorshift64*: enough to resample indices.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut medians: Vec<f64> = (0..2000)
        .map(|_| {
            let mut s: Vec<f64> = (0..v.len())
                .map(|_| v[(next() % v.len() as u64) as usize])
                .collect();
            median(&mut s)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    let mut all = v.to_vec();
    (median(&mut all), medians[50], medians[1949])
}

fn benches(c: &mut Criterion) {
    let cfg = bench_model();
    let tensors = weights::random(&cfg, 7).expect("random weights");
    let vb = candle_nn::VarBuilder::from_tensors(
        tensors,
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    );
    let model = Model::load(&vb, &cfg, Shard::WHOLE, CONTEXT + 8).expect("model");
    let mut vs = vec![
        variant("none", None, cfg.layers),
        variant("off", Some((SectionLevel::Off, "0")), cfg.layers),
        variant("full", Some((SectionLevel::Full, "0")), cfg.layers),
        variant(
            "full_sampled",
            Some((SectionLevel::Full, "100")),
            cfg.layers,
        ),
    ];
    // Warm-up: every variant a while.
    for v in vs.iter_mut() {
        for _ in 0..TOKENS {
            step(&model, v);
        }
    }
    // The interleaved pass, the order rotating.
    let rounds = std::env::var("PHASETRACE_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse::<usize>().ok())
        .filter(|r| *r > 0)
        .unwrap_or(ROUNDS);
    let n = vs.len();
    let mut tps: Vec<Vec<f64>> = vec![Vec::new(); n];
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let v = &mut vs[i];
            let t = Instant::now();
            for _ in 0..TOKENS {
                step(&model, v);
            }
            tps[i].push(TOKENS as f64 / t.elapsed().as_secs_f64());
        }
    }
    eprintln!(
        "interleaved: {rounds} rounds x {TOKENS} tokens per variant, order rotating; {} layers, width {}, {} experts top-{}",
        cfg.layers, cfg.hidden, cfg.experts, cfg.top_k
    );
    let ratios = |to: usize, i: usize| -> Vec<f64> {
        tps[i].iter().zip(&tps[to]).map(|(a, b)| a / b).collect()
    };
    for (i, v) in vs.iter().enumerate() {
        let m = median(&mut tps[i].clone());
        let (off, off_lo, off_hi) = median_with_interval(&ratios(1, i));
        let (none, none_lo, none_hi) = median_with_interval(&ratios(0, i));
        eprintln!(
            "  {:<13} {:>8.1} tokens/s  {:>6.3} ms/step  {off:.4}x of off [{off_lo:.4}, {off_hi:.4}]  {none:.4}x of none [{none_lo:.4}, {none_hi:.4}]",
            v.name,
            m,
            1e3 / m,
        );
    }
    for v in &vs {
        if let Some(p) = &v.profiler {
            p.flush();
            let s = p.stats();
            eprintln!(
                "  {:<13} sections {} steps {} spans {} dropped {:?}",
                v.name, s.sections, s.steps, s.spans, s.dropped
            );
        }
    }

    let mut g = c.benchmark_group("candle_decode");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for v in vs.iter_mut() {
        let name = v.name;
        g.bench_function(name, |b| b.iter(|| step(&model, v)));
    }
    g.finish();
    for v in vs {
        if let Some(p) = v.profiler {
            drop(v.rec);
            p.shutdown();
        }
    }
}

criterion_group!(overhead, benches);
criterion_main!(overhead);
