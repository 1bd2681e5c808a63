//! phasetrace's overhead on real compute: tokens per second of the candle decoder (one rank,
//! the CPU, one decode step per iteration: `rec.step_of(StepKind::Decode)` around a one-token
//! forward with its ~40 sections a layer... every section, all-reduce and route call of the
//! engine; its metrics and spans carry `step.kind`) with:
//!
//! - `none`: no recorder at all (the engine without phasetrace);
//! - `off`: phasetrace built in, level `off` (one relaxed load per call);
//! - `full`: level `full` on the host clock, no spans (`PHASETRACE_TRACE_EVERY=0`);
//! - `full_sampled`: level `full`, one step in 100 traced as spans (the default), built on a
//!   tracer provider of the engine's whose exporter keeps them in memory (phasetrace builds
//!   spans on its worker thread, never on the hot path; the count is printed).
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
//! The same four variants then serve a batch (`candle_serve/<variant>`): `BATCH` sequences
//! decoding in one batched forward per step, as the serving engine runs them, each a request
//! of phasetrace's request API (`request_begin` when it starts, `serve` in every step,
//! `request_end` when its context is full and a new request takes its place), so the request
//! API's calls are inside the measured step too.
//!
//! Run: `cargo bench -p phasetrace-candle --bench overhead`.

use criterion::{Criterion, criterion_group, criterion_main};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use phasetrace::{Finish, Profiler, Recorder, RequestClass, RequestKind, SectionLevel, StepKind};
use phasetrace_candle::model::{KvCache, Model, Seq, Shard};
use phasetrace_candle::{Ctx, ModelConfig, weights};
use std::time::{Duration, Instant};

const ROUNDS: usize = 15;
const TOKENS: usize = 48;
/// Tokens before the cache starts over (same prompt), so steps stay alike.
const CONTEXT: usize = 96;
/// Sequences in a served step's batch.
const BATCH: usize = 8;

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
    /// The served batch: its requests (id, cache, next token, context at which it ends).
    batch: Vec<Request>,
    class: Option<RequestClass>,
    ids: u64,
    /// The spans of `full_sampled`, as its tracer provider exported them.
    spans: InMemorySpanExporter,
}

struct Request {
    id: u64,
    cache: KvCache,
    next: u32,
    ends_at: usize,
}

fn variant(name: &'static str, level: Option<(SectionLevel, &str)>, layers: usize) -> Variant {
    let spans = InMemorySpanExporter::default();
    let profiler = level.map(|(l, every)| {
        let b = Profiler::builder()
            .without_env()
            .with_level(l)
            .with_text("PHASETRACE_TRACE_EVERY", every)
            .expect("a valid setting");
        let b = if every == "0" {
            b
        } else {
            b.with_tracer_provider(
                SdkTracerProvider::builder()
                    .with_simple_exporter(spans.clone())
                    .build(),
            )
        };
        b.build().expect("building the profiler")
    });
    let rec = profiler.as_ref().map(Profiler::recorder);
    let class = profiler.as_ref().map(|p| {
        p.request_kind(RequestKind::new(
            "phasetrace-candle",
            "text_completion",
            "bench",
        ))
        .expect("registering the request kind")
    });
    Variant {
        name,
        profiler,
        rec,
        cache: KvCache::new(layers),
        next: 1,
        batch: Vec::new(),
        class,
        ids: 0,
        spans,
    }
}

/// One served step of `v`: each request of the batch decodes a token, in one forward; a
/// request whose context is full ends and a new one takes its place (the contexts are
/// staggered, so the batch's requests end at different steps).
fn serve_step(model: &Model, v: &mut Variant) {
    let layers = model.config().layers;
    while v.batch.len() < BATCH {
        let i = v.batch.len();
        let q = new_request(v, layers, CONTEXT / 2 + i * CONTEXT / (2 * BATCH));
        v.batch.push(q);
    }
    for i in 0..BATCH {
        if v.batch[i].cache.len() >= v.batch[i].ends_at {
            if let Some(r) = &v.rec {
                r.request_end(v.batch[i].id, Finish::Stop);
            }
            let ends_at = v.batch[i].ends_at;
            v.batch[i] = new_request(v, layers, ends_at);
        }
    }
    let mut ctx = Ctx::plain().expect("sections").recording(v.rec.as_ref());
    let _step = v.rec.as_ref().map(|r| r.step_of(StepKind::Decode));
    if let Some(r) = &v.rec {
        for q in &v.batch {
            r.serve(q.id, 1, 1);
        }
    }
    let inputs: Vec<[u32; 1]> = v.batch.iter().map(|q| [q.next]).collect();
    let mut seqs: Vec<Seq<'_>> = v
        .batch
        .iter_mut()
        .zip(&inputs)
        .map(|(q, t)| Seq {
            tokens: t,
            cache: &mut q.cache,
        })
        .collect();
    let ids = model
        .forward_batch(&mut ctx, &mut seqs, layers)
        .expect("forward");
    for (q, next) in v.batch.iter_mut().zip(ids) {
        q.next = next[0];
    }
}

fn new_request(v: &mut Variant, layers: usize, ends_at: usize) -> Request {
    v.ids += 1;
    if let (Some(r), Some(c)) = (&v.rec, v.class) {
        r.request_begin(v.ids, c);
    }
    Request {
        id: v.ids,
        cache: KvCache::new(layers),
        next: (v.ids % 100) as u32 + 1,
        ends_at,
    }
}

/// One decode step of `v`: a token through the whole model.
fn step(model: &Model, v: &mut Variant) {
    let layers = model.config().layers;
    if v.cache.len() >= CONTEXT {
        v.cache = KvCache::new(layers);
    }
    let mut ctx = Ctx::plain().expect("sections").recording(v.rec.as_ref());
    let _step = v.rec.as_ref().map(|r| r.step_of(StepKind::Decode));
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

/// The interleaved pass of `step` over the variants, the order rotating; prints each variant's
/// median tokens/s and its paired ratios to `off` and `none`.
fn interleaved(
    what: &str,
    cfg: &ModelConfig,
    model: &Model,
    vs: &mut [Variant],
    (step, per_step): (fn(&Model, &mut Variant), usize),
) {
    // Warm-up: every variant a while.
    for v in vs.iter_mut() {
        for _ in 0..TOKENS {
            step(model, v);
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
                step(model, v);
            }
            tps[i].push((TOKENS * per_step) as f64 / t.elapsed().as_secs_f64());
        }
    }
    eprintln!(
        "interleaved, {what}: {rounds} rounds x {TOKENS} steps per variant, order rotating; {} layers, width {}, {} experts top-{}",
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
            1e3 * per_step as f64 / m,
        );
    }
    for v in vs.iter() {
        if let Some(p) = &v.profiler {
            p.flush();
            let s = p.stats();
            let exported = v.spans.get_finished_spans().map_or(0, |s| s.len());
            v.spans.reset();
            eprintln!(
                "  {:<13} sections {} steps {} spans exported {exported} dropped {:?}",
                v.name, s.sections, s.steps, s.dropped
            );
        }
    }
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
    interleaved("one sequence", &cfg, &model, &mut vs, (step, 1));
    interleaved(
        &format!("a batch of {BATCH} requests"),
        &cfg,
        &model,
        &mut vs,
        (serve_step, BATCH),
    );

    let mut g = c.benchmark_group("candle_decode");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for v in vs.iter_mut() {
        let name = v.name;
        g.bench_function(name, |b| b.iter(|| step(&model, v)));
    }
    g.finish();
    let mut g = c.benchmark_group("candle_serve");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for v in vs.iter_mut() {
        let name = v.name;
        g.bench_function(name, |b| b.iter(|| serve_step(&model, v)));
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
