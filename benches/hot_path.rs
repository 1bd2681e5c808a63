//! Hot-path costs, each comparison side by side in one run:
//!
//! - `section/*`: one section begin+end: phasetrace off and on (host clock), against baselines
//!   that reproduce the reference GLM profiler (a once-read level; clock read + two relaxed
//!   `fetch_add` into static arrays), the physical floor (two TSC reads and two 24-byte stores),
//!   and one span through `tracing` + `tracing-opentelemetry`.
//! - `step/*`: one step begin+end (an empty step): not sampled; sampled (one in one) with no
//!   `tracing` span current; sampled inside an entered `tracing` span under a
//!   `tracing-opentelemetry` layer (the parent's ids read and carried in three more marks).
//! - `spec/*`: one phase mark inside a round, a disabled round.
//! - `worker/drain`: section records drained into histograms per second on one core; `_native_halves`:
//!   after a protobuf scrape, so that each section is also recorded in its native half.
//! - `graph/*`: one `Recorder::replay` guard around a CUDA-graph launch (simulated stream, event
//!   clock): off, a replay the read-every setting skips, a replay that is read (two fences).
//! - `worker/drain_steps_tail_*`: 48-section steps drained with tail-based tracing off, on with
//!   no step slow enough (the cost of holding every step's sections), and on at `p99` (about
//!   one step in a hundred traced, spans and exemplars built).
//!
//! - `moe/*`: one `Recorder::moe_route` of a token's 8 expert ids (of 384): off, on, and the
//!   reference profiler's route stash (a thread-local `Vec` refilled) off and on; the worker
//!   draining route records with the expert telemetry off and on (60 MoE layers x 384
//!   experts); one `Profiler::expert_load()` snapshot of 23,040 (layer, expert) counts.
//!
//! - `request/*`: the request API: one `Recorder::serve` (a request in a step's batch) off and
//!   on, against the floor of one 24-byte store and a per-request table updated on the hot
//!   path (a `HashMap` entry per served token, as engines that keep request stats inline do);
//!   one `request_begin` + `request_end` pair off and on.
//!
//! - `recorder/create`: one `Profiler::recorder()` created and dropped (8 others live, drained
//!   every 64 creations), against the allocation of its ring alone.
//!
//! - `current_thread_section/*`: one section begin+end through `phasetrace::current` (the
//!   thread's installed recorder, for model code with no handle): no recorder installed,
//!   installed with recording off, installed and on, beside `baseline_recorder_on`, the same
//!   section through the recorder itself in the same run.
//!
//! - `step_kind/*`: one empty step begin+end, kindless (`Recorder::step`) and of a kind
//!   (`Recorder::step_of`), on, side by side.
//!
//! - `engine_state/*`: the serving engine's state: one `Recorder::kv_cache` off and on, one
//!   `Recorder::prefix_cache` and one `Recorder::preempted` on, against the floor of one
//!   relaxed atomic store.
//!
//! Run: `cargo bench --bench hot_path`. Figures go to BENCHMARKS.md.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use phasetrace::{Phase, Profiler, Section, SectionLevel, Site, SpecLevel};
use std::hint::black_box;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The reference profiler's shape, reproduced as the baseline.
mod reference {
    use super::*;
    static NANOS: [AtomicU64; 23] = [const { AtomicU64::new(0) }; 23];
    static CALLS: [AtomicU64; 23] = [const { AtomicU64::new(0) }; 23];

    pub(super) fn level(v: u8) -> u8 {
        static L: OnceLock<u8> = OnceLock::new();
        *L.get_or_init(|| v)
    }

    #[inline(never)]
    pub(super) fn start(on: bool) -> Option<Instant> {
        on.then(Instant::now)
    }

    #[inline(never)]
    pub(super) fn end(bucket: usize, t0: Option<Instant>) {
        let Some(t0) = t0 else { return };
        NANOS[bucket].fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        CALLS[bucket].fetch_add(1, Relaxed);
    }
}

const BATCH: u64 = 8_192;

fn profiler(level: SectionLevel, spec: SpecLevel) -> Profiler {
    profiler_tracing(level, spec, 0)
}

/// As [`profiler`], sampling one step in `trace_every` (0: none).
fn profiler_tracing(level: SectionLevel, spec: SpecLevel, trace_every: u64) -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(level)
        .with_spec_level(spec)
        .without_prometheus()
        .with_trace_every(trace_every)
        .with_queue(1 << 20)
        .with_drain_interval(Duration::from_secs(3600))
        .build()
        .expect("profiler")
}

/// An engine's `tracing` stack: a registry with a `tracing-opentelemetry` layer on a tracer
/// provider exporting through a batch processor to nowhere.
fn engine_tracing() -> (
    opentelemetry_sdk::trace::SdkTracerProvider,
    impl tracing::Subscriber + Send + Sync,
) {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(NoopExporter)
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("bench")));
    (provider, subscriber)
}

#[derive(Debug)]
struct NoopExporter;

impl opentelemetry_sdk::trace::SpanExporter for NoopExporter {
    async fn export(
        &self,
        _batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
}

fn section(c: &mut Criterion) {
    let mut g = c.benchmark_group("section");
    g.throughput(Throughput::Elements(1));

    let on_level = reference::level(0) == 1; // the reference reads its level once: off here
    g.bench_function("baseline_reference_off", |b| {
        b.iter(|| {
            let t = reference::start(black_box(on_level));
            reference::end(black_box(3), t);
        })
    });
    let off = profiler(SectionLevel::Off, SpecLevel::Off);
    let rec_off = off.recorder();
    g.bench_function("phasetrace_off", |b| {
        b.iter(|| {
            let _s = rec_off.section(black_box(Section::KDA_MIXER), 12u32, Site::ATTN);
        })
    });
    g.bench_function("baseline_reference_on", |b| {
        b.iter(|| {
            let t = reference::start(black_box(true));
            reference::end(black_box(3), t);
        })
    });
    // The floor of an enabled section: two TSC reads and two 24-byte stores into a ring, timed
    // in batches like `phasetrace_on_host_clock`.
    #[cfg(target_arch = "x86_64")]
    {
        const SLOTS: usize = 4096;
        let mut ring = vec![[0u64; 3]; SLOTS].into_boxed_slice();
        let rdtsc = || {
            // SAFETY: rdtsc has no preconditions on x86-64.
            #[allow(unused_unsafe)]
            unsafe {
                std::arch::x86_64::_rdtsc()
            }
        };
        g.bench_function("baseline_floor_tsc", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                let mut i = 0usize;
                while left > 0 {
                    let n = left.min(BATCH);
                    let t = Instant::now();
                    for _ in 0..n {
                        ring[i % SLOTS] = [rdtsc(), 12, 3];
                        ring[(i + 1) % SLOTS] = [rdtsc(), 0, 4];
                        i = i.wrapping_add(2);
                    }
                    total += t.elapsed();
                    black_box(&mut ring);
                    left -= n;
                }
                total
            })
        });
    }
    let on = profiler(SectionLevel::Full, SpecLevel::Off);
    let rec_on = on.recorder();
    g.bench_function("phasetrace_on_host_clock", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(BATCH);
                let t = Instant::now();
                for _ in 0..n {
                    let _s = rec_on.section(black_box(Section::KDA_MIXER), 12u32, Site::ATTN);
                }
                total += t.elapsed();
                on.drain(); // outside the timed region: the worker's share is benched below
                left -= n;
            }
            total
        })
    });

    // One span through tracing + tracing-opentelemetry, exported through a batch processor.
    let (provider, subscriber) = engine_tracing();
    tracing::subscriber::with_default(subscriber, || {
        g.bench_function("tracing_opentelemetry_span", |b| {
            b.iter(|| {
                let s = tracing::info_span!("kda_mixer", layer = 12u32, site = "attn");
                let _e = s.enter();
            })
        });
    });
    let _ = provider.shutdown();
    g.finish();
    on.shutdown();
}

/// `n` empty steps on `rec`, timed in batches; drained outside the timed region.
fn steps(p: &Profiler, iters: u64) -> Duration {
    let rec = p.recorder();
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH);
        let t = Instant::now();
        for _ in 0..n {
            let _s = rec.step();
        }
        total += t.elapsed();
        p.drain();
        left -= n;
    }
    total
}

fn step(c: &mut Criterion) {
    let mut g = c.benchmark_group("step");
    g.throughput(Throughput::Elements(1));
    let sampled = |every: u64| profiler_tracing(SectionLevel::Full, SpecLevel::Off, every);
    let unsampled = sampled(0);
    g.bench_function("unsampled", |b| b.iter_custom(|n| steps(&unsampled, n)));
    unsampled.shutdown();
    let every = sampled(1);
    g.bench_function("sampled_outside_a_span", |b| {
        b.iter_custom(|n| steps(&every, n))
    });
    let (provider, subscriber) = engine_tracing();
    tracing::subscriber::with_default(subscriber, || {
        let request = tracing::info_span!("request");
        let _entered = request.enter();
        g.bench_function("sampled_in_a_tracing_span", |b| {
            b.iter_custom(|n| steps(&every, n))
        });
    });
    every.shutdown();
    // The tail rule on: every step reads the engine's current span (its parent if it is kept),
    // not only the head-sampled ones. None is sampled here: what is timed is the parent read.
    let tail = || {
        Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .without_prometheus()
            .with_trace_every(0)
            .with_text("PHASETRACE_TRACE_SLOWER_THAN", "p99")
            .expect("a valid setting")
            .with_queue(1 << 20)
            .with_drain_interval(Duration::from_secs(3600))
            .build()
            .expect("profiler")
    };
    let outside = tail();
    g.bench_function("tail_rule_outside_a_span", |b| {
        b.iter_custom(|n| steps(&outside, n))
    });
    outside.shutdown();
    let inside = tail();
    let (provider_tail, subscriber_tail) = engine_tracing();
    tracing::subscriber::with_default(subscriber_tail, || {
        let request = tracing::info_span!("request");
        let _entered = request.enter();
        g.bench_function("tail_rule_in_a_tracing_span", |b| {
            b.iter_custom(|n| steps(&inside, n))
        });
    });
    inside.shutdown();
    let _ = provider.shutdown();
    let _ = provider_tail.shutdown();
    g.finish();
}

fn spec(c: &mut Criterion) {
    let mut g = c.benchmark_group("spec");
    g.throughput(Throughput::Elements(1));
    let on = profiler(SectionLevel::Off, SpecLevel::Phases);
    let rec = on.recorder();
    g.bench_function("phase_mark_on", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(BATCH);
                let round = rec.round(4);
                let t = Instant::now();
                for _ in 0..n {
                    round.phase(black_box(Phase::Verify));
                }
                total += t.elapsed();
                round.end(2);
                on.drain();
                left -= n;
            }
            total
        })
    });
    let off = profiler(SectionLevel::Off, SpecLevel::Off);
    let rec_off = off.recorder();
    g.bench_function("round_off", |b| {
        b.iter(|| {
            let r = rec_off.round(black_box(4));
            r.phase(Phase::Draft);
            r.end(2);
        })
    });
    g.finish();
    on.shutdown();
}

fn worker(c: &mut Criterion) {
    let mut g = c.benchmark_group("worker");
    g.sample_size(10);
    let records: u64 = 200_000;
    g.throughput(Throughput::Elements(records));
    for (layer_attr, protobuf) in [(true, false), (false, false), (true, true)] {
        let p = Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .with_prometheus_at(([127, 0, 0, 1], 0))
            .with_trace_every(0)
            .with_layer_attr(layer_attr)
            .with_queue(1 << 22)
            .with_drain_interval(Duration::from_secs(3600))
            .build()
            .expect("profiler");
        if protobuf {
            protobuf_scrape(p.prometheus_addr().expect("endpoint"));
        }
        let rec = p.recorder();
        let sections = [
            Section::KDA_MIXER,
            Section::MOE_EXPERTS,
            Section::REDUCE_ATTN,
            Section::NORM,
        ];
        g.bench_with_input(
            BenchmarkId::new(
                match (layer_attr, protobuf) {
                    (true, false) => "drain_sections_into_histograms",
                    (false, _) => "drain_sections_into_histograms_no_layer_attr",
                    (true, true) => "drain_sections_into_histograms_native_halves",
                },
                records,
            ),
            &records,
            |b, &n| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        for i in 0..n {
                            let s = sections[(i % 4) as usize];
                            let _g = rec.section(s, (i % 96) as u32, Site::ATTN);
                        }
                        let t = Instant::now();
                        p.drain();
                        total += t.elapsed();
                    }
                    total
                })
            },
        );
        p.shutdown();
    }
    g.finish();
}

/// One protobuf scrape of the endpoint at `addr`, as Prometheus with native histograms asks:
/// from then on the worker also records the native halves of the duration histograms.
fn protobuf_scrape(addr: std::net::SocketAddr) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.write_all(
        b"GET /metrics HTTP/1.1\r\nHost: b\r\nAccept: application/vnd.google.protobuf;\
          proto=io.prometheus.client.MetricFamily;encoding=delimited\r\nConnection: close\r\n\r\n",
    )
    .expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read");
    assert!(buf.starts_with(b"HTTP/1.1 200"), "protobuf scrape failed");
}

/// The replay guard around a launch of a graph of 8 captured sections (the launch itself, the
/// engine's cost, is not timed).
fn graph(c: &mut Criterion) {
    use phasetrace::Timing;
    use phasetrace_sim::{SimEventClock, SimStream};
    use std::sync::Arc;
    let mut g = c.benchmark_group("graph");
    g.throughput(Throughput::Elements(1));
    for (name, level, read_every) in [
        ("replay_off", SectionLevel::Off, 1),
        ("replay_not_read", SectionLevel::Full, u64::MAX),
        ("replay_read", SectionLevel::Full, 1),
    ] {
        let stream = SimStream::new();
        let p = Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .without_prometheus()
            .with_trace_every(0)
            .with_queue(1 << 20)
            .with_timing(Timing::Events)
            .with_clock(Arc::new(SimEventClock::new(stream.clone())))
            .with_graph_read_every(read_every)
            .with_drain_interval(Duration::from_secs(3600))
            .build()
            .expect("profiler");
        let rec = p.recorder();
        stream.begin_capture().expect("capture");
        let capture = rec.begin_capture();
        for layer in 0..8u32 {
            let _s = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        }
        let _graph = stream.end_capture().expect("graph");
        let handle = capture.finish();
        p.set_level(level).expect("level");
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(BATCH);
                    let t = Instant::now();
                    for _ in 0..n {
                        let r = rec.replay(black_box(&handle));
                        r.end();
                    }
                    total += t.elapsed();
                    p.drain();
                    left -= n;
                }
                total
            })
        });
        drop(handle);
        p.shutdown();
    }
    g.finish();
}

fn worker_tail(c: &mut Criterion) {
    use phasetrace::TraceSlowerThan;
    let mut g = c.benchmark_group("worker");
    g.sample_size(10);
    const SECTIONS: u64 = 48;
    let steps: u64 = 4_000;
    g.throughput(Throughput::Elements(steps * SECTIONS));
    let cases = [
        ("drain_steps_tail_off", TraceSlowerThan::Off),
        (
            "drain_steps_tail_on_none_slow",
            TraceSlowerThan::Duration(Duration::from_secs(10)),
        ),
        ("drain_steps_tail_on_p99", TraceSlowerThan::Percentile(99.0)),
    ];
    let sections = [
        Section::KDA_MIXER,
        Section::MOE_EXPERTS,
        Section::REDUCE_ATTN,
        Section::NORM,
    ];
    for (name, rule) in cases {
        // Spans go to a closed port (their export fails off the worker); the exemplar store
        // exists because both spans and the Prometheus endpoint are on.
        let p = Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .with_prometheus_at(([127, 0, 0, 1], 0))
            .with_otlp_endpoint(Some("http://127.0.0.1:9"))
            .with_otlp_protocol(phasetrace::Protocol::HttpProtobuf)
            .with_trace_every(0)
            .with_trace_slower_than(rule)
            .with_trace_slow_budget(10_000)
            .with_queue(1 << 22)
            .with_drain_interval(Duration::from_secs(3600))
            .build()
            .expect("profiler");
        let rec = p.recorder();
        g.bench_with_input(BenchmarkId::new(name, steps), &steps, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    for _ in 0..n {
                        let _step = rec.step();
                        for i in 0..SECTIONS {
                            let s = sections[(i % 4) as usize];
                            let _g = rec.section(s, (i / 4) as u32, Site::ATTN);
                        }
                    }
                    let t = Instant::now();
                    p.drain();
                    total += t.elapsed();
                }
                total
            })
        });
        p.shutdown();
    }
    g.finish();
}

/// The reference profiler's route stash: a once-read switch, then the ids copied into a
/// thread-local buffer for the next trace line.
mod reference_route {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        static ROUTE: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn trace_on(v: bool) -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| v)
    }

    #[inline(never)]
    pub(super) fn stash(on: bool, ids: &[i32]) {
        if !on {
            return;
        }
        ROUTE.with(|r| {
            let mut v = r.borrow_mut();
            v.clear();
            v.extend_from_slice(ids);
        });
    }
}

const MOE_LAYERS: u32 = 60;
const EXPERTS: u32 = 384;

fn moe_profiler(level: SectionLevel, experts: bool) -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(level)
        .with_expert_counter(experts)
        .with_moe_experts(EXPERTS)
        .without_prometheus()
        .with_trace_every(0)
        .with_queue(1 << 22)
        .with_drain_interval(Duration::from_secs(3600))
        .build()
        .expect("profiler")
}

/// The 8 ids of token `t` in `layer`, spread over the 384 experts.
fn ids_of(t: u32, layer: u32) -> [u32; 8] {
    std::array::from_fn(|j| (t * 31 + j as u32 * 48 + layer * 7) % EXPERTS)
}

fn moe(c: &mut Criterion) {
    let mut g = c.benchmark_group("moe");
    g.throughput(Throughput::Elements(1));
    let ids = ids_of(5, 3);
    let ids_i32: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    let off_switch = reference_route::trace_on(false);
    g.bench_function("baseline_reference_route_off", |b| {
        b.iter(|| reference_route::stash(black_box(off_switch), black_box(&ids_i32)))
    });
    g.bench_function("baseline_reference_route_on", |b| {
        b.iter(|| reference_route::stash(black_box(true), black_box(&ids_i32)))
    });
    let off = moe_profiler(SectionLevel::Off, true);
    let rec_off = off.recorder();
    g.bench_function("route_off", |b| {
        b.iter(|| rec_off.moe_route(black_box(3u32), black_box(&ids)))
    });
    // On: two 24-byte records (four ids each) into the lane; the worker is not running, so
    // the ring is drained outside the timed batches.
    let on = moe_profiler(SectionLevel::Full, true);
    let rec_on = on.recorder();
    g.bench_function("route_on_384_experts", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(BATCH);
                let t = Instant::now();
                for _ in 0..n {
                    rec_on.moe_route(black_box(3u32), black_box(&ids));
                }
                total += t.elapsed();
                on.drain();
                left -= n;
            }
            total
        })
    });
    g.finish();
    off.shutdown();

    // The worker: route records of 60 MoE layers x 384 experts drained, telemetry off and on.
    let mut g = c.benchmark_group("moe");
    g.sample_size(10);
    let tokens: u32 = 2_000;
    let ids_per_pass = u64::from(tokens * MOE_LAYERS * 8);
    g.throughput(Throughput::Elements(ids_per_pass));
    for experts in [false, true] {
        let p = moe_profiler(SectionLevel::Full, experts);
        let rec = p.recorder();
        let name = if experts {
            "drain_routes_expert_load_on_60x384"
        } else {
            "drain_routes_expert_load_off_60x384"
        };
        g.bench_with_input(BenchmarkId::new(name, ids_per_pass), &tokens, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    for t in 0..n {
                        let _s = rec.step();
                        for layer in 0..MOE_LAYERS {
                            rec.moe_route(layer, &ids_of(t, layer));
                        }
                    }
                    let t = Instant::now();
                    p.drain();
                    total += t.elapsed();
                }
                total
            })
        });
        if experts {
            // Every one of the 23,040 (layer, expert) cells has counts by now.
            g.throughput(Throughput::Elements(u64::from(MOE_LAYERS * EXPERTS)));
            g.bench_function("expert_load_snapshot_60x384", |b| {
                b.iter(|| black_box(p.expert_load()))
            });
        }
        p.shutdown();
    }
    g.finish();
    on.shutdown();
}

/// `n` calls of `f` timed in batches of [`BATCH`], `p` drained outside the timed region.
fn batched(p: &Profiler, iters: u64, mut f: impl FnMut(u64)) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    let mut i = 0u64;
    while left > 0 {
        let n = left.min(BATCH);
        let t = Instant::now();
        for _ in 0..n {
            f(i);
            i = i.wrapping_add(1);
        }
        total += t.elapsed();
        p.drain();
        left -= n;
    }
    total
}

fn request(c: &mut Criterion) {
    let mut g = c.benchmark_group("request");
    g.throughput(Throughput::Elements(1));
    let kind = || phasetrace::RequestKind::new("bench", "text_completion", "m");
    let off = profiler(SectionLevel::Off, SpecLevel::Off);
    let rec_off = off.recorder();
    g.bench_function("serve_off", |b| {
        b.iter(|| rec_off.serve(black_box(7), black_box(1), 1))
    });
    let on = profiler(SectionLevel::Full, SpecLevel::Off);
    let rec_on = on.recorder();
    g.bench_function("serve_on", |b| {
        b.iter_custom(|iters| {
            batched(&on, iters, |i| {
                rec_on.serve(black_box(i & 31), black_box(1), 1);
            })
        })
    });
    // The floor of a served request: one 24-byte store into a ring.
    {
        const SLOTS: usize = 4096;
        let mut ring = vec![[0u64; 3]; SLOTS].into_boxed_slice();
        g.bench_function("baseline_floor_store", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for i in 0..iters as usize {
                    ring[i % SLOTS] = [black_box(i as u64 & 31), 1, 1];
                }
                let e = t.elapsed();
                black_box(&mut ring);
                e
            })
        });
    }
    // A per-request table on the hot path: an entry per open request, updated per token.
    {
        let mut table: std::collections::HashMap<u64, (u64, u64, Instant)> =
            (0..32).map(|i| (i, (0, 0, Instant::now()))).collect();
        g.bench_function("baseline_request_table", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for i in 0..iters {
                    let e = table.entry(black_box(i & 31)).or_insert((0, 0, t));
                    e.0 += 1;
                    e.1 += 1;
                }
                t.elapsed()
            })
        });
        black_box(&table);
    }
    let class_off = off.request_kind(kind()).expect("a kind");
    g.bench_function("begin_end_off", |b| {
        b.iter(|| {
            rec_off.request_begin(black_box(9), class_off);
            rec_off.request_end(black_box(9), phasetrace::Finish::Stop);
        })
    });
    let class_on = on.request_kind(kind()).expect("a kind");
    g.bench_function("begin_end_on", |b| {
        b.iter_custom(|iters| {
            batched(&on, iters, |i| {
                rec_on.request_begin(black_box(i), class_on);
                rec_on.request_end(black_box(i), phasetrace::Finish::Stop);
            })
        })
    });
    g.finish();
    on.shutdown();
}

/// Creations between two drains in `recorder/create`: the worker forgets dropped lanes as it
/// drains (every drain interval in an engine), so only a few are ever held at once.
const CREATE_BATCH: u64 = 64;

fn recorder(c: &mut Criterion) {
    let mut g = c.benchmark_group("recorder");
    g.throughput(Throughput::Elements(1));
    let p = profiler(SectionLevel::Full, SpecLevel::Off);
    // An engine's other threads keep theirs.
    let live: Vec<_> = (0..8).map(|_| p.recorder()).collect();
    g.bench_function("create", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(CREATE_BATCH);
                let t = Instant::now();
                for _ in 0..n {
                    drop(black_box(p.recorder()));
                }
                total += t.elapsed();
                p.drain();
                left -= n;
            }
            total
        })
    });
    // The floor: the allocation of a recorder's ring alone (the default 65,536 marks of 24 bytes).
    g.bench_function("baseline_ring_alloc", |b| {
        b.iter(|| black_box(Box::<[[u64; 3]]>::new_uninit_slice(65_536)))
    });
    drop(live);
    g.finish();
    p.shutdown();
}

/// `phasetrace::current::section` against the recorder's own `section`, in one run.
fn current_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("current_thread_section");
    g.throughput(Throughput::Elements(1));
    g.bench_function("not_installed", |b| {
        b.iter(|| {
            let _s = phasetrace::current::section(black_box(Section::KDA_MIXER), 12u32, Site::ATTN);
        })
    });
    let off = profiler(SectionLevel::Off, SpecLevel::Off);
    let installed = off.install_thread_recorder();
    g.bench_function("off", |b| {
        b.iter(|| {
            let _s = phasetrace::current::section(black_box(Section::KDA_MIXER), 12u32, Site::ATTN);
        })
    });
    drop(installed);
    off.shutdown();
    let on = profiler(SectionLevel::Full, SpecLevel::Off);
    let installed = on.install_thread_recorder();
    g.bench_function("on", |b| {
        b.iter_custom(|iters| {
            batched(&on, iters, |_| {
                let _s =
                    phasetrace::current::section(black_box(Section::KDA_MIXER), 12u32, Site::ATTN);
            })
        })
    });
    g.bench_function("baseline_recorder_on", |b| {
        b.iter_custom(|iters| {
            batched(&on, iters, |_| {
                let _s = installed.section(black_box(Section::KDA_MIXER), 12u32, Site::ATTN);
            })
        })
    });
    drop(installed);
    g.finish();
    on.shutdown();
}

/// A step of a stated kind against a kindless one, in one run.
fn step_kind(c: &mut Criterion) {
    let mut g = c.benchmark_group("step_kind");
    g.throughput(Throughput::Elements(1));
    let on = profiler(SectionLevel::Full, SpecLevel::Off);
    let rec = on.recorder();
    g.bench_function("kindless_on", |b| {
        b.iter_custom(|iters| {
            batched(&on, iters, |_| {
                let _s = black_box(&rec).step();
            })
        })
    });
    g.bench_function("decode_on", |b| {
        b.iter_custom(|iters| {
            batched(&on, iters, |_| {
                let _s = black_box(&rec).step_of(black_box(phasetrace::StepKind::Decode));
            })
        })
    });
    g.finish();
    drop(rec);
    on.shutdown();
}

fn engine_state(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_state");
    g.throughput(Throughput::Elements(1));
    let off = profiler(SectionLevel::Off, SpecLevel::Off);
    let rec_off = off.recorder();
    g.bench_function("kv_cache_off", |b| {
        b.iter(|| rec_off.kv_cache(black_box(7), black_box(100)))
    });
    let on = profiler(SectionLevel::Full, SpecLevel::Off);
    let rec_on = on.recorder();
    g.bench_function("kv_cache_on", |b| {
        let mut i = 0u32;
        b.iter(|| {
            i = i.wrapping_add(1);
            rec_on.kv_cache(black_box(i & 63), black_box(100))
        })
    });
    g.bench_function("prefix_cache_on", |b| {
        b.iter(|| rec_on.prefix_cache(black_box(256), black_box(64)))
    });
    g.bench_function("preempted_on", |b| {
        b.iter(|| rec_on.preempted(black_box(1)))
    });
    let floor = AtomicU64::new(0);
    g.bench_function("baseline_atomic_store", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i = i.wrapping_add(1);
            floor.store(black_box(i), Relaxed)
        })
    });
    g.finish();
    off.shutdown();
    on.shutdown();
}

criterion_group!(
    benches,
    request,
    recorder,
    current_thread,
    step_kind,
    section,
    step,
    spec,
    worker,
    graph,
    worker_tail,
    moe,
    engine_state
);
criterion_main!(benches);
