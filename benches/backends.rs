//! Decode-step throughput: unprofiled vs profiled with the sync backend vs the event backend.
//!
//! A synthetic decode loop on the simulated CUDA stream ([`SimStream`]): every step enqueues 40
//! sections of 20-50 µs of device work (about 1.4 ms in all), each inside a `Recorder::section`
//! guard, and then synchronizes once, like an engine reading the sampled token. The host thread
//! only enqueues, so it runs ahead of the device, as an engine does ahead of its GPU. The
//! simulated device has a launch latency of 5 µs (`TYPICAL_LAUNCH_LATENCY`: enqueue to start on
//! an idle stream), hidden while the host runs ahead.
//!
//! - `unprofiled`: no profiler at all.
//! - `sync`: a profiler whose recorder uses `SyncClock` on the stream: every boundary
//!   synchronizes, so the host can no longer run ahead and every section pays the launch
//!   latency (the reference profilers' semantics). On a real GPU each boundary also pays the
//!   driver's synchronize and launch costs on the host, which the simulation does not model: the
//!   sync figure here is a lower bound on its cost.
//! - `events`: a recorder on `SimEventClock`: every boundary records a pooled event and returns;
//!   phasetrace's worker resolves the events as the device reaches them.
//!
//! Then the same step as a CUDA graph (captured once, replayed per token), interleaved:
//! unprofiled replays against replays whose 40 sections were captured with
//! `Recorder::begin_capture` and are read by the background worker, with 0 and 300 µs of host
//! work (sampling) between a token's synchronize and the next launch: the table gives the
//! throughput ratio and how many replays the worker read before the next launch re-recorded
//! their events (the others are counted, not attributed).
//!
//! Run: `cargo bench --bench backends -- --warm-up-time 1 --measurement-time 5`. After criterion's
//! own report, a table gives each variant's median step time, tokens per second, and its ratio to
//! the unprofiled loop (goal for `events`: at least 0.97), both from criterion's samples and from
//! a run that interleaves the variants step by step (robust to load changing between criterion's
//! sequential measurements on a shared machine).

use criterion::{Criterion, Throughput};
use phasetrace::timing::{Clock, SyncClock};
use phasetrace::{Profiler, Recorder, RecorderOptions, Section, SectionLevel, Site};
use phasetrace_sim::{SimEventClock, SimStream, SimStreamOptions, TYPICAL_LAUNCH_LATENCY};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECTIONS_PER_STEP: usize = 40;

/// The sections of one step, cycling through a layer's worth of kernels.
const KINDS: [Section; 8] = [
    Section::NORM,
    Section::KDA_MIXER,
    Section::NORM,
    Section::MOE_ROUTER,
    Section::MOE_EXPERTS,
    Section::MOE_SHARED,
    Section::MOE_COMBINE,
    Section::REDUCE_MLP,
];

/// Deterministic 20-50 µs durations (a fixed LCG, so every run enqueues the same work).
fn durations() -> Vec<Duration> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..SECTIONS_PER_STEP)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            Duration::from_micros(20 + (x >> 33) % 31)
        })
        .collect()
}

/// One decode step: enqueue every section (timed when a recorder is given), then synchronize.
fn step(stream: &SimStream, rec: Option<&Recorder>, work: &[Duration]) {
    let step = rec.map(Recorder::step);
    for (i, d) in work.iter().enumerate() {
        let _s =
            rec.map(|r| r.section(KINDS[i % KINDS.len()], (i / KINDS.len()) as u32, Site::MLP));
        stream.enqueue(*d);
    }
    stream.synchronize();
    drop(step);
}

fn profiler() -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .with_otlp_endpoint(None)
        .with_summary_every(0)
        .build()
        .expect("a profiler without exporters builds")
}

/// Per-iteration step times criterion measured, by variant (the last `sample_size` are the
/// measurement; earlier ones are warm-up).
type Samples = Arc<Mutex<Vec<Duration>>>;

fn bench_variant(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    stream: &SimStream,
    rec: Option<&Recorder>,
    work: &[Duration],
) -> Samples {
    let samples: Samples = Arc::default();
    let sink = Arc::clone(&samples);
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            stream.synchronize();
            let t0 = Instant::now();
            for _ in 0..iters {
                step(stream, rec, work);
            }
            let took = t0.elapsed();
            sink.lock()
                .unwrap()
                .push(took / u32::try_from(iters.max(1)).unwrap_or(u32::MAX));
            took
        });
    });
    samples
}

fn median(samples: &Samples, n: usize) -> Duration {
    let all = samples.lock().unwrap();
    let mut last: Vec<Duration> = all[all.len().saturating_sub(n)..].to_vec();
    last.sort();
    last.get(last.len() / 2).copied().unwrap_or_default()
}

const SAMPLE_SIZE: usize = 60;

/// Interleaved rounds after criterion's run (`PHASETRACE_BENCH_ROUNDS`, default 600: about 3 s).
fn interleaved_rounds() -> usize {
    std::env::var("PHASETRACE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600)
        .max(1)
}

/// One row of the CUDA-graph table: the host gap between replays, the unprofiled and the
/// profiled replay's medians, the replays read and the replays counted as overwritten.
struct GraphRow {
    gap: Duration,
    plain: Duration,
    profiled: Duration,
    read: u64,
    dropped: u64,
}

/// Criterion measures the variants one after the other, so a change in machine load between
/// them (other processes on a small machine) biases their ratio. The same steps interleaved
/// (unprofiled, sync, events, unprofiled, ...) give every variant the same conditions: the
/// median step of each variant.
fn interleaved_medians(
    stream: &SimStream,
    recs: [Option<&Recorder>; 3],
    work: &[Duration],
    rounds: usize,
) -> Vec<Duration> {
    let mut inter: [Vec<Duration>; 3] = Default::default();
    for _ in 0..rounds {
        for (v, rec) in recs.into_iter().enumerate() {
            stream.synchronize();
            let t0 = Instant::now();
            step(stream, rec, work);
            inter[v].push(t0.elapsed());
        }
    }
    inter
        .iter_mut()
        .map(|v| {
            v.sort();
            v[v.len() / 2]
        })
        .collect()
}

/// Busy host work between replays (the engine's sampling and scheduling).
fn host_work(gap: Duration) {
    let t = Instant::now();
    while t.elapsed() < gap {
        std::hint::spin_loop();
    }
}

/// CUDA graphs: the step captured once (plain and profiled), replayed per token, interleaved,
/// with no host gap and with 300 µs of host work between replays.
fn graph_rows(stream: &SimStream, work: &[Duration], rounds: usize) -> Vec<GraphRow> {
    let p_graph = profiler();
    let rec_graph = p_graph
        .recorder_with(RecorderOptions::new().clock(Arc::new(SimEventClock::new(stream.clone()))));
    stream.synchronize();
    stream.begin_capture().expect("capture");
    for d in work {
        stream.enqueue(*d);
    }
    let plain_graph = stream.end_capture().expect("graph");
    stream.begin_capture().expect("capture");
    let capture = rec_graph.begin_capture();
    for (i, d) in work.iter().enumerate() {
        let _s = rec_graph.section(KINDS[i % KINDS.len()], (i / KINDS.len()) as u32, Site::MLP);
        stream.enqueue(*d);
    }
    let profiled_graph = stream.end_capture().expect("graph");
    let handle = capture.finish();
    let mut rows = Vec::new();
    for gap in [Duration::ZERO, Duration::from_micros(300)] {
        let before = p_graph.stats();
        let mut times: [Vec<Duration>; 2] = Default::default();
        for _ in 0..rounds {
            stream.synchronize();
            let t0 = Instant::now();
            plain_graph.launch(stream);
            stream.synchronize();
            host_work(gap);
            times[0].push(t0.elapsed());
            let t0 = Instant::now();
            {
                let _step = rec_graph.step();
                let replay = rec_graph.replay(&handle);
                profiled_graph.launch(stream);
                replay.end();
                stream.synchronize();
            }
            host_work(gap);
            times[1].push(t0.elapsed());
        }
        p_graph.drain();
        let after = p_graph.stats();
        for t in &mut times {
            t.sort();
        }
        rows.push(GraphRow {
            gap,
            plain: times[0][rounds / 2],
            profiled: times[1][rounds / 2],
            read: after.graph_replays - before.graph_replays,
            dropped: after.dropped_graph_replays - before.dropped_graph_replays,
        });
    }
    drop(handle);
    drop(rec_graph);
    p_graph.shutdown();
    rows
}

/// One variant's row of the step table: its name, criterion samples, sections recorded and
/// clock drops (`None` for the unprofiled baseline).
type StepRow<'a> = (&'static str, &'a Samples, Option<u64>, Option<u64>);

fn print_steps(device_per_step: Duration, rounds: usize, rows: &[StepRow<'_>], inter: &[Duration]) {
    let base_median = median(rows[0].1, SAMPLE_SIZE);
    println!();
    println!(
        "decode step: {SECTIONS_PER_STEP} sections, {:.0} µs of device work",
        device_per_step.as_secs_f64() * 1e6
    );
    println!(
        "criterion: median of the last {SAMPLE_SIZE} samples per variant (run one after the other); \
         interleaved: median of {rounds} single steps per variant, variants alternating"
    );
    println!(
        "{:<11} {:>10} {:>10} {:>8} {:>13} {:>13} {:>10} {:>8}",
        "variant", "step µs", "tokens/s", "ratio", "inter. µs", "inter. ratio", "sections", "drops"
    );
    for (v, (name, samples, sections, drops)) in rows.iter().enumerate() {
        let m = median(samples, SAMPLE_SIZE);
        let im = inter[v];
        let fmt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        println!(
            "{:<11} {:>10.1} {:>10.1} {:>8.4} {:>13.1} {:>13.4} {:>10} {:>8}",
            name,
            m.as_secs_f64() * 1e6,
            1.0 / m.as_secs_f64(),
            base_median.as_secs_f64() / m.as_secs_f64(),
            im.as_secs_f64() * 1e6,
            inter[0].as_secs_f64() / im.as_secs_f64(),
            fmt(*sections),
            fmt(*drops),
        );
    }
}

fn print_graph(rounds: usize, rows: &[GraphRow]) {
    println!();
    println!(
        "CUDA graph on the simulated stream ({rounds} replays per row, interleaved with unprofiled replays):"
    );
    println!(
        "{:<14} {:>14} {:>14} {:>8} {:>16} {:>10}",
        "host gap", "unprofiled µs", "events µs", "ratio", "replays read", "counted"
    );
    for r in rows {
        println!(
            "{:<14} {:>14.1} {:>14.1} {:>8.4} {:>16} {:>10}",
            format!("{} µs", r.gap.as_micros()),
            r.plain.as_secs_f64() * 1e6,
            r.profiled.as_secs_f64() * 1e6,
            r.plain.as_secs_f64() / r.profiled.as_secs_f64(),
            format!("{} of {rounds}", r.read),
            r.dropped
        );
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(SAMPLE_SIZE)
        .configure_from_args();
    let work = durations();
    let device_per_step: Duration = work.iter().sum();
    let stream =
        SimStream::with_options(SimStreamOptions::new().launch_latency(TYPICAL_LAUNCH_LATENCY));

    let sync_clock = Arc::new(SyncClock::new(stream.clone()));
    let event_clock = Arc::new(SimEventClock::new(stream.clone()));
    let p_sync = profiler();
    let p_events = profiler();
    let rec_sync = p_sync.recorder_with(RecorderOptions::new().clock(sync_clock.clone()));
    let rec_events = p_events.recorder_with(RecorderOptions::new().clock(event_clock.clone()));

    let mut group = c.benchmark_group("decode_step_40x20-50us");
    group.throughput(Throughput::Elements(1));
    let base = bench_variant(&mut group, "unprofiled", &stream, None, &work);
    let sync = bench_variant(&mut group, "sync", &stream, Some(&rec_sync), &work);
    let events = bench_variant(&mut group, "events", &stream, Some(&rec_events), &work);
    group.finish();

    let rounds = interleaved_rounds();
    let inter = interleaved_medians(
        &stream,
        [None, Some(&rec_sync), Some(&rec_events)],
        &work,
        rounds,
    );
    let graphs = graph_rows(&stream, &work, rounds);

    p_sync.drain();
    p_events.drain();
    let (s_stats, e_stats) = (p_sync.stats(), p_events.stats());
    let rows = [
        ("unprofiled", &base, None, None),
        (
            "sync",
            &sync,
            Some(s_stats.sections),
            Some(sync_clock.dropped()),
        ),
        (
            "events",
            &events,
            Some(e_stats.sections),
            Some(event_clock.dropped()),
        ),
    ];
    print_steps(device_per_step, rounds, &rows, &inter);
    print_graph(rounds, &graphs);
    drop(rec_sync);
    drop(rec_events);
    p_sync.shutdown();
    p_events.shutdown();
    c.final_summary();
}
