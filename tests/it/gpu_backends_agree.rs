//! The CUDA timing backends on a real GPU (`--features cuda`, `PHASETRACE_GPU=1`).
//!
//! The GPU tests are `#[ignore]`d, since CI and development machines have no GPU, and also return
//! early unless `PHASETRACE_GPU=1`; `scripts/gpu-check.sh` runs them on a GPU machine with
//! `--include-ignored`.
//!
//! - `backends_agree_on_memsets_of_known_relative_cost`: memsets of 1x, 4x and 16x the bytes,
//!   timed by the sync backend and by the event backend; medians agree within 5 %, and scale
//!   with the bytes.
//! - `event_times_lie_on_the_host_timeline`: resolved event times fall inside the host-clock
//!   bracket of the work, also after re-anchoring.
//! - `event_backend_throughput_overhead`: loops of small kernels (4 KiB, 32 MiB and 128 MiB
//!   memsets, two marks around each), unprofiled vs event backend (with a concurrent resolver, as
//!   phasetrace's worker) vs sync backend; prints the throughput ratios.
//! - `graph_capture_is_skipped_and_not_disturbed`: marks during capture are skipped and
//!   counted; resolving from another thread during a global-mode capture does not invalidate it.
//! - `sections_inside_a_captured_graph_are_timed_at_every_replay`: sections captured with
//!   `Recorder::begin_capture` are recorded into the graph as external events and read at
//!   every replay (the worker reads before the next launch).

#![cfg(feature = "cuda")]

use cudarc::driver::{result, sys};
use phasetrace::timing::cuda::{
    self, CudaContext, CudaEventClock, CudaEventClockOptions, CudaStream, CudaSyncClock,
};
use phasetrace::timing::{Clock, Resolved, Token, now_ns};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const GIB: usize = 1 << 30;

fn gpu_enabled(test: &str) -> bool {
    if std::env::var("PHASETRACE_GPU").as_deref() == Ok("1") {
        return true;
    }
    println!("{test}: skipped (set PHASETRACE_GPU=1 on a machine with an NVIDIA GPU)");
    false
}

/// Device 0 with cudarc's per-buffer event tracking off (these tests use one stream and raw
/// buffers), and a fresh non-blocking stream.
fn setup() -> (Arc<CudaContext>, Arc<CudaStream>) {
    let ctx = cuda::open_device(0).expect("PHASETRACE_GPU=1 but no usable CUDA device 0");
    // SAFETY: the tests use a single stream per buffer.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().expect("cuStreamCreate");
    println!(
        "device 0: {}",
        ctx.name().unwrap_or_else(|_| "unknown".to_owned())
    );
    (ctx, stream)
}

/// A raw device buffer, freed on drop.
struct Buf {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl Buf {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Buf {
        ctx.bind_to_thread().unwrap();
        // SAFETY: plain allocation in the current context.
        let ptr = unsafe { result::malloc_sync(bytes) }.expect("cuMemAlloc");
        Buf { ptr, bytes }
    }

    /// Enqueues a memset of the first `bytes` bytes (a kernel whose cost is proportional).
    fn memset(&self, stream: &CudaStream, bytes: usize) {
        assert!(bytes <= self.bytes);
        // SAFETY: the range is inside the allocation; the stream belongs to its context.
        unsafe { result::memset_d8_async(self.ptr, 0, bytes, stream.cu_stream()) }
            .expect("cuMemsetD8Async");
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn resolve_now(clock: &dyn Clock, token: Token) -> u64 {
    match clock.resolve(token) {
        Resolved::At(ns) => {
            clock.release(token);
            ns
        }
        other => panic!("token {token:?} did not resolve after synchronize: {other:?}"),
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it"]
fn backends_agree_on_memsets_of_known_relative_cost() {
    if !gpu_enabled("backends_agree_on_memsets_of_known_relative_cost") {
        return;
    }
    let (ctx, stream) = setup();
    let base = 2 * GIB;
    let buf = Buf::new(&ctx, 16 * base);
    let sync = CudaSyncClock::new(Arc::clone(&stream)).unwrap();
    // The raw-stream constructor, as an engine owning its stream would use it.
    // SAFETY: the stream outlives the clock (both live until the end of the test).
    let events = unsafe { CudaEventClock::from_raw_stream(stream.cu_stream()) }.unwrap();
    const REPS: usize = 15;

    // Warm up (first-touch, clocks).
    for _ in 0..3 {
        buf.memset(&stream, 16 * base);
    }
    stream.synchronize().unwrap();

    println!(
        "{:>6} {:>10} {:>14} {:>14} {:>8} {:>10}",
        "size", "GiB", "sync (µs)", "events (µs)", "diff %", "vs 1x"
    );
    let mut first_event = 0.0;
    for mult in [1usize, 4, 16] {
        let bytes = mult * base;
        let mut by_sync = Vec::new();
        for _ in 0..REPS {
            let a = sync.mark().unwrap();
            buf.memset(&stream, bytes);
            let b = sync.mark().unwrap();
            by_sync.push(resolve_now(&sync, b) - resolve_now(&sync, a));
        }
        let mut pairs = Vec::new();
        for _ in 0..REPS {
            let a = events.mark().expect("pool has room");
            buf.memset(&stream, bytes);
            let b = events.mark().expect("pool has room");
            pairs.push((a, b));
        }
        stream.synchronize().unwrap();
        let by_events: Vec<u64> = pairs
            .into_iter()
            .map(|(a, b)| {
                let (ta, tb) = (resolve_now(&events, a), resolve_now(&events, b));
                tb - ta
            })
            .collect();
        let (s, e) = (median(by_sync) as f64, median(by_events) as f64);
        if mult == 1 {
            first_event = e;
        }
        let diff = (e - s) / s * 100.0;
        println!(
            "{:>5}x {:>10} {:>14.1} {:>14.1} {:>8.2} {:>10.2}",
            mult,
            bytes / GIB,
            s / 1e3,
            e / 1e3,
            diff,
            e / first_event
        );
        println!(
            "FIGURE\tmemset {mult}x: events vs sync\t{:.1} vs {:.1} µs ({diff:+.2} %)\twithin 5 %\t{}",
            e / 1e3,
            s / 1e3,
            if diff.abs() <= 5.0 { "met" } else { "MISSED" }
        );
        assert!(diff.abs() <= 5.0, "{mult}x: sync {s} ns vs events {e} ns");
        let ratio = e / first_event;
        let m = mult as f64;
        assert!(
            (m * 0.8..=m * 1.2).contains(&ratio),
            "{mult}x memset took {ratio:.2}x the 1x one"
        );
    }
    assert_eq!(events.dropped(), 0);
    assert_eq!(sync.sync_errors(), 0);
    println!("anchor: {:?}", events.anchor_info());
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it"]
fn event_times_lie_on_the_host_timeline() {
    if !gpu_enabled("event_times_lie_on_the_host_timeline") {
        return;
    }
    let (ctx, stream) = setup();
    let buf = Buf::new(&ctx, 8 * GIB);
    let clock = CudaEventClock::with_options(
        Arc::clone(&stream),
        CudaEventClockOptions::new().reanchor_every(Duration::from_millis(20)),
    )
    .unwrap();
    let info = clock.anchor_info();
    println!("first anchor: {info:?}");
    assert!(info.uncertainty_ns < 100_000, "anchor bracket {info:?}");

    for round in 0..5 {
        stream.synchronize().unwrap();
        let h0 = now_ns();
        let a = clock.mark().unwrap();
        buf.memset(&stream, 8 * GIB);
        let b = clock.mark().unwrap();
        assert_eq!(
            clock.resolve(b),
            Resolved::Pending,
            "an 8 GiB memset takes a while"
        );
        stream.synchronize().unwrap();
        let h1 = now_ns();
        let (ta, tb) = (resolve_now(&clock, a), resolve_now(&clock, b));
        let tol = 50_000 + clock.anchor_info().uncertainty_ns;
        println!(
            "round {round}: host bracket {} µs, events {} µs after its start, lasting {} µs",
            (h1 - h0) / 1_000,
            (ta as i64 - h0 as i64) / 1_000,
            (tb - ta) / 1_000
        );
        assert!(ta + tol >= h0, "event before its mark: {ta} < {h0}");
        assert!(
            tb <= h1 + tol,
            "event after the synchronize returned: {tb} > {h1}"
        );
        std::thread::sleep(Duration::from_millis(30));
    }
    let info = clock.anchor_info();
    println!("after re-anchoring: {info:?}");
    assert!(info.reanchors >= 3, "{info:?}");
    assert_eq!(info.failures, 0);
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it"]
fn event_backend_throughput_overhead() {
    if !gpu_enabled("event_backend_throughput_overhead") {
        return;
    }
    let (ctx, stream) = setup();
    // Memsets from launch-bound (4 KiB) to section-sized (128 MiB, about 30 µs on an H200).
    let buf = Buf::new(&ctx, 128 << 20);
    let cases = [
        ("4 KiB (launch-bound)", 4usize << 10, 20_000usize),
        ("32 MiB (~8 µs)", 32 << 20, 8_000),
        ("128 MiB (~30 µs)", 128 << 20, 3_000),
    ];

    println!(
        "{:<22} {:>14} {:>14} {:>14} {:>10} {:>10}",
        "kernel", "unprofiled ms", "events ms", "sync ms", "events x", "sync x"
    );
    for (label, bytes, n) in cases {
        let run_plain = || {
            stream.synchronize().unwrap();
            let t0 = Instant::now();
            for _ in 0..n {
                buf.memset(&stream, bytes);
            }
            stream.synchronize().unwrap();
            t0.elapsed()
        };
        let run_events = || {
            let clock = Arc::new(CudaEventClock::new(Arc::clone(&stream)).unwrap());
            let (tx, rx) = std::sync::mpsc::channel::<Token>();
            let stop = Arc::new(AtomicBool::new(false));
            let resolver = {
                let clock = Arc::clone(&clock);
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut resolved = 0u64;
                    let mut pending: std::collections::VecDeque<Token> = Default::default();
                    loop {
                        pending.extend(rx.try_iter());
                        while let Some(&t) = pending.front() {
                            match clock.resolve(t) {
                                Resolved::Pending => break,
                                _ => {
                                    clock.release(t);
                                    pending.pop_front();
                                    resolved += 1;
                                }
                            }
                        }
                        if stop.load(Ordering::Relaxed) && pending.is_empty() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    pending.extend(rx.try_iter());
                    resolved
                })
            };
            stream.synchronize().unwrap();
            let t0 = Instant::now();
            for _ in 0..n {
                tx.send(clock.mark().unwrap_or(Token(u64::MAX))).unwrap();
                buf.memset(&stream, bytes);
                tx.send(clock.mark().unwrap_or(Token(u64::MAX))).unwrap();
            }
            stream.synchronize().unwrap();
            let took = t0.elapsed();
            stop.store(true, Ordering::Relaxed);
            let resolved = resolver.join().unwrap();
            (took, clock.dropped(), resolved)
        };
        let run_sync = || {
            let clock = CudaSyncClock::new(Arc::clone(&stream)).unwrap();
            stream.synchronize().unwrap();
            let t0 = Instant::now();
            for _ in 0..n {
                let _ = clock.mark();
                buf.memset(&stream, bytes);
                let _ = clock.mark();
            }
            stream.synchronize().unwrap();
            t0.elapsed()
        };
        run_plain(); // warm up
        let plain: Vec<Duration> = (0..3).map(|_| run_plain()).collect();
        let ev: Vec<(Duration, u64, u64)> = (0..3).map(|_| run_events()).collect();
        let sy: Vec<Duration> = (0..3).map(|_| run_sync()).collect();
        let best = |v: &[Duration]| v.iter().min().copied().unwrap();
        let (p, e, s) = (
            best(&plain),
            best(&ev.iter().map(|x| x.0).collect::<Vec<_>>()),
            best(&sy),
        );
        let (ex, sx) = (
            p.as_secs_f64() / e.as_secs_f64(),
            p.as_secs_f64() / s.as_secs_f64(),
        );
        println!(
            "{:<22} {:>14.2} {:>14.2} {:>14.2} {:>10.3} {:>10.3}",
            label,
            p.as_secs_f64() * 1e3,
            e.as_secs_f64() * 1e3,
            s.as_secs_f64() * 1e3,
            ex,
            sx
        );
        for (_, dropped, resolved) in &ev {
            println!("  events run: {resolved} tokens resolved, {dropped} marks dropped");
        }
        println!(
            "FIGURE\tthroughput {label}: events / sync vs unprofiled\t{ex:.3}x / {sx:.3}x\t{}\t{}",
            if bytes >= 64 << 20 {
                "events >= 0.95x"
            } else {
                ""
            },
            match (bytes >= 64 << 20, ex >= 0.95) {
                (false, _) => "",
                (true, true) => "met",
                (true, false) => "MISSED",
            }
        );
        if bytes >= 64 << 20 {
            // GPU-bound: the event records hide behind device work.
            assert!(
                ex >= 0.95,
                "event backend kept only {ex:.3}x of unprofiled throughput"
            );
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it"]
fn graph_capture_is_skipped_and_not_disturbed() {
    if !gpu_enabled("graph_capture_is_skipped_and_not_disturbed") {
        return;
    }
    let (ctx, stream) = setup();
    let buf = Buf::new(&ctx, 256 << 20);
    let clock = Arc::new(CudaEventClock::new(Arc::clone(&stream)).unwrap());

    // Tokens recorded before the capture, still unresolved while it runs.
    let mut before = Vec::new();
    for _ in 0..50 {
        before.push(clock.mark().unwrap());
        buf.memset(&stream, 256 << 20);
    }

    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        .expect("begin capture");
    // Another thread (phasetrace's worker) polls the earlier events during the global capture.
    let poller = {
        let clock = Arc::clone(&clock);
        let tokens = before.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_millis(50);
            let mut polls = 0u32;
            while Instant::now() < deadline {
                for t in &tokens {
                    let _ = clock.resolve(*t);
                    polls += 1;
                }
            }
            polls
        })
    };
    let skipped_before = clock.captured();
    assert_eq!(clock.mark(), None, "no event is recorded into the graph");
    buf.memset(&stream, 1 << 20);
    assert_eq!(clock.mark(), None);
    let polls = poller.join().unwrap();
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .expect("the capture was not invalidated by the worker's polling")
        .expect("a graph");
    assert_eq!(clock.captured() - skipped_before, 2);
    println!(
        "captured marks skipped: {}, polls during capture: {polls}",
        clock.captured()
    );

    // Replaying the graph between two marks times it as one section.
    let a = clock.mark().unwrap();
    graph.launch().unwrap();
    let b = clock.mark().unwrap();
    stream.synchronize().unwrap();
    for t in before {
        resolve_now(&*clock, t);
    }
    let (ta, tb) = (resolve_now(&*clock, a), resolve_now(&*clock, b));
    assert!(tb >= ta);
    println!("graph replay: {} µs", (tb - ta) / 1_000);
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it"]
fn sections_inside_a_captured_graph_are_timed_at_every_replay() {
    if !gpu_enabled("sections_inside_a_captured_graph_are_timed_at_every_replay") {
        return;
    }
    use phasetrace::{Profiler, Section, SectionLevel, Site, Timing};
    let (ctx, stream) = setup();
    let buf = Buf::new(&ctx, 256 << 20);
    let sizes = [
        (Section::KDA_MIXER, 16usize << 20),
        (Section::MLP_DENSE, 64 << 20),
    ];
    let clock = Arc::new(CudaEventClock::new(Arc::clone(&stream)).unwrap());
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .with_timing(Timing::Events)
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let rec = p.recorder();

    // The same sections eagerly, for their durations.
    for _ in 0..20 {
        for (section, bytes) in sizes {
            let _s = rec.section(section, 0u32, Site::ATTN);
            buf.memset(&stream, bytes);
        }
    }
    stream.synchronize().unwrap();
    p.flush();
    let eager = p.summary();

    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        .expect("begin capture");
    let capture = rec.begin_capture();
    for (section, bytes) in sizes {
        let _s = rec.section(section, 1u32, Site::ATTN);
        buf.memset(&stream, bytes);
    }
    let graph = match stream.end_capture(sys::CUgraphInstantiate_flags(0)) {
        Ok(Some(g)) => g,
        other => {
            capture.abandon();
            panic!("capture failed: {:?}", other.err());
        }
    };
    let handle = capture.finish();
    assert_eq!(handle.marks(), 4);
    assert_eq!(
        clock.graph_marks(),
        4,
        "recorded with CU_EVENT_RECORD_EXTERNAL"
    );
    let before = p.stats();
    const K: u64 = 20;
    for _ in 0..K {
        let replay = rec.replay(&handle);
        graph.launch().unwrap();
        replay.end();
        stream.synchronize().unwrap();
        // The worker reads the replay before the next launch re-records its events.
        p.flush();
    }
    let s = p.stats();
    println!(
        "FIGURE\tgraph replays read (memsets)\t{} of {K}\t{K}\t{}",
        s.graph_replays - before.graph_replays,
        if s.graph_replays - before.graph_replays == K {
            "met"
        } else {
            "MISSED"
        }
    );
    assert_eq!(s.graph_replays - before.graph_replays, K, "{s:?}");
    assert_eq!(s.dropped_graph_replays, 0, "{s:?}");
    assert_eq!(s.sections - before.sections, K * 2);
    let replayed = p.summary();
    println!("eager:\n{eager}\neager + {K} replays:\n{replayed}");
    drop(handle);
    drop(graph);
    p.flush();
    p.shutdown();
    assert_eq!(
        clock.in_flight(),
        0,
        "the graph's events went back to the pool"
    );
}

#[test]
fn gpu_tests_skip_cleanly_without_the_flag() {
    // Always runs: documents the opt-in and checks that the skip path itself is sound.
    if std::env::var("PHASETRACE_GPU").as_deref() == Ok("1") {
        cuda::probe().expect("PHASETRACE_GPU=1 but the CUDA driver is unusable");
    } else {
        assert!(!gpu_enabled("gpu_tests_skip_cleanly_without_the_flag"));
    }
}
