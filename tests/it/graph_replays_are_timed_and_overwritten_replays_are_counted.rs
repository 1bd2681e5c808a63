//! Sections captured into a graph on the simulated stream are timed at every replay, with the
//! replayed durations; a replay whose events a later launch re-recorded before the worker read
//! them is counted, never attributed; abandoned captures and dropped graphs leak no pool events.
//!
//! The worker's drain interval is an hour, so marks are only processed at `flush()`: what the
//! worker sees when it reads a replay is decided by the test, not by scheduling. A replay is
//! readable until the next launch of the same graph re-records its events, so the tests that
//! expect every replay read flush before the next launch, as the background worker must.

use phasetrace::DropReason;
use phasetrace::timing::Clock;
use phasetrace::{CapturedGraph, Profiler, Recorder, Section, SectionLevel, Site, Stats, Timing};
use phasetrace_sim::{SimCaptureError, SimEventClock, SimGraph, SimStream};
use std::sync::Arc;
use std::time::Duration;

/// The sections of one captured decode layer and their device work, in µs.
const LAYER: [(Section, u64); 3] = [
    (Section::KDA_MIXER, 30),
    (Section::MLP_DENSE, 50),
    (Section::REDUCE_ATTN, 20),
];
const LAYERS: u32 = 2;

fn profiler(clock: Arc<SimEventClock>, read_every: u64) -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .with_timing(Timing::Events)
        .with_clock(clock)
        .with_graph_read_every(read_every)
        .with_drain_interval(Duration::from_secs(3600))
        .build()
        .expect("profiler")
}

/// Captures `LAYERS` layers of `LAYER` into a graph, as an engine captures its decode forward.
fn capture_layers(stream: &SimStream, rec: &Recorder) -> (SimGraph, CapturedGraph) {
    stream.begin_capture().unwrap();
    let capture = rec.begin_capture();
    for layer in 0..LAYERS {
        for (section, us) in LAYER {
            let _s = rec.section(section, layer, Site::ATTN);
            stream.enqueue(Duration::from_micros(us));
        }
    }
    assert_eq!(capture.marks(), 2 * LAYER.len() * LAYERS as usize);
    let graph = stream.end_capture().expect("capture");
    (graph, capture.finish())
}

/// One decode step that replays the graph.
fn replay(stream: &SimStream, rec: &Recorder, graph: &SimGraph, handle: &CapturedGraph) {
    let _step = rec.step();
    // Unmarked work before the launch, so the host runs ahead of the device.
    stream.enqueue(Duration::from_micros(200));
    let guard = rec.replay(handle);
    graph.launch(stream);
    guard.end();
}

/// µs per call of each section in the console summary, by name.
fn per_call_us(summary: &str, section: Section) -> Option<(f64, f64)> {
    summary.lines().find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        (cols.first() == Some(&section.as_str()) && cols.len() == 5)
            .then(|| (cols[3].parse().unwrap(), cols[4].parse().unwrap()))
    })
}

fn assert_exact_durations(p: &Profiler, steps: u64) {
    let summary = p.summary();
    for (section, us) in LAYER {
        let Some((calls_per_token, us_per_call)) = per_call_us(&summary, section) else {
            panic!("{} missing from\n{summary}", section.as_str());
        };
        assert_eq!(us_per_call, us as f64, "{}:\n{summary}", section.as_str());
        let per_token = f64::from(LAYERS) * p.stats().graph_replays as f64 / steps as f64;
        assert!(
            (calls_per_token - per_token).abs() < 0.01,
            "{}: {calls_per_token} calls per token, expected {per_token}:\n{summary}",
            section.as_str()
        );
    }
}

fn sections_per_replay() -> u64 {
    (LAYER.len() as u64) * u64::from(LAYERS)
}

#[test]
fn captured_sections_come_back_at_every_replay_with_the_replayed_durations() {
    let stream = SimStream::new();
    let clock = Arc::new(SimEventClock::with_pool_size(stream.clone(), 256));
    let p = profiler(clock.clone(), 1);
    let rec = p.recorder();
    let (graph, handle) = capture_layers(&stream, &rec);
    assert_eq!(
        clock.in_flight(),
        handle.marks(),
        "the graph holds its events"
    );
    const K: u64 = 7;
    for _ in 0..K {
        replay(&stream, &rec, &graph, &handle);
        // The host reads the sampled token; the worker reads the replay before the next launch.
        stream.synchronize();
        p.flush();
    }
    let s: Stats = p.stats();
    assert_eq!(s.graph_replays, K, "{s:?}");
    assert_eq!(s.dropped_graph_replays, 0, "{s:?}");
    assert_eq!(s.sections, K * sections_per_replay(), "{s:?}");
    assert_eq!(s.steps, K);
    assert_eq!(s.dropped.total(), 0, "{s:?}");
    assert_eq!(handle.launches(), K);
    assert_exact_durations(&p, K);
    drop(handle);
    assert_eq!(
        clock.in_flight(),
        0,
        "dropping the graph gives its events back"
    );
    p.shutdown();
}

#[test]
fn a_replay_overwritten_by_the_next_launch_is_counted_not_misattributed() {
    let stream = SimStream::new();
    let clock = Arc::new(SimEventClock::with_pool_size(stream.clone(), 256));
    let p = profiler(clock.clone(), 1);
    let rec = p.recorder();
    let (graph, handle) = capture_layers(&stream, &rec);

    // 1. The next launch is enqueued before the worker reads, and has finished when it does:
    //    the events are complete but carry launch 2's times.
    replay(&stream, &rec, &graph, &handle);
    replay(&stream, &rec, &graph, &handle);
    stream.synchronize();
    p.flush();
    let s = p.stats();
    assert_eq!((s.graph_replays, s.dropped_graph_replays), (1, 1), "{s:?}");
    assert_eq!(
        s.sections,
        sections_per_replay(),
        "only launch 2 is attributed"
    );

    // 2. The worker reads launch 3 after it finished, while launch 4 is still queued: launch 3's
    //    events now point at launch 4 and are pending.
    replay(&stream, &rec, &graph, &handle);
    stream.synchronize();
    stream.enqueue(Duration::from_millis(50));
    replay(&stream, &rec, &graph, &handle);
    p.flush();
    let s = p.stats();
    assert_eq!((s.graph_replays, s.dropped_graph_replays), (1, 2), "{s:?}");
    stream.synchronize();
    p.flush();
    let s = p.stats();
    assert_eq!((s.graph_replays, s.dropped_graph_replays), (2, 2), "{s:?}");

    // 3. Read before the next launch: nothing is lost.
    for _ in 0..3 {
        replay(&stream, &rec, &graph, &handle);
        stream.synchronize();
        p.flush();
    }
    let s = p.stats();
    assert_eq!((s.graph_replays, s.dropped_graph_replays), (5, 2), "{s:?}");
    assert_eq!(s.sections, 5 * sections_per_replay(), "{s:?}");
    assert_eq!(s.dropped[DropReason::Unbalanced], 0, "{s:?}");
    // Every attributed section has exactly its device time: nothing of another launch.
    assert_exact_durations(&p, 7);
    drop(handle);
    p.flush();
    assert_eq!(clock.in_flight(), 0);
    p.shutdown();
}

#[test]
fn abandoned_captures_and_dropped_graphs_leak_no_pool_events() {
    let stream = SimStream::new();
    let clock = Arc::new(SimEventClock::with_pool_size(stream.clone(), 64));
    let p = profiler(clock.clone(), 1);
    let rec = p.recorder();

    // cuStreamEndCapture fails: the engine abandons the capture.
    stream.begin_capture().unwrap();
    let capture = rec.begin_capture();
    for layer in 0..4u32 {
        let _s = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        stream.enqueue(Duration::from_micros(10));
    }
    assert_eq!(clock.in_flight(), 8);
    stream.invalidate_capture();
    assert_eq!(
        stream.end_capture().err(),
        Some(SimCaptureError::Invalidated)
    );
    capture.abandon();
    assert_eq!(
        clock.in_flight(),
        0,
        "abandon gives the events back at once"
    );

    // A capture dropped without finish (an early return, a panic unwinding) does the same.
    stream.begin_capture().unwrap();
    {
        let _capture = rec.begin_capture();
        let _s = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
    }
    let _ = stream.end_capture();
    assert_eq!(clock.in_flight(), 0);

    // A graph that is never launched.
    let (_graph, handle) = capture_layers(&stream, &rec);
    assert!(clock.in_flight() > 0);
    drop(handle);
    assert_eq!(clock.in_flight(), 0);

    // A graph launched, with its last replay still unread when the handle goes.
    let (graph, handle) = capture_layers(&stream, &rec);
    replay(&stream, &rec, &graph, &handle);
    replay(&stream, &rec, &graph, &handle);
    drop(handle);
    stream.synchronize();
    p.flush();
    let s = p.stats();
    assert_eq!(clock.in_flight(), 0, "{s:?}");
    assert_eq!(s.graph_replays, 0, "{s:?}");
    assert_eq!(s.dropped_graph_replays, 2, "{s:?}");
    assert_eq!(s.dropped[DropReason::Clock], 0, "{s:?}");

    // The pool is whole: a capture that needs most of it still fits.
    let (graph, handle) = capture_layers(&stream, &rec);
    replay(&stream, &rec, &graph, &handle);
    stream.synchronize();
    p.flush();
    assert_eq!(p.stats().graph_replays, 1);
    drop(handle);
    assert_eq!(clock.in_flight(), 0);
    p.shutdown();
}

#[test]
fn one_replay_in_n_is_read_and_every_launch_is_counted() {
    let stream = SimStream::new();
    let clock = Arc::new(SimEventClock::with_pool_size(stream.clone(), 256));
    let p = profiler(clock.clone(), 3);
    let rec = p.recorder();
    let (graph, handle) = capture_layers(&stream, &rec);
    for _ in 0..9 {
        replay(&stream, &rec, &graph, &handle);
        stream.synchronize();
        p.flush();
    }
    let s = p.stats();
    assert_eq!(handle.launches(), 9);
    assert_eq!((s.graph_replays, s.dropped_graph_replays), (3, 0), "{s:?}");
    assert_eq!(s.sections, 3 * sections_per_replay());
    assert_eq!(s.steps, 9, "steps around the launches are timed every time");
    assert_exact_durations(&p, 9);
    p.shutdown();
}

#[test]
fn plain_marks_during_a_capture_and_clocks_without_graph_support_are_counted() {
    // The host clock cannot time inside a graph: captured boundaries are dropped and counted.
    let stream = SimStream::new();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .with_drain_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let rec = p.recorder();
    stream.begin_capture().unwrap();
    let capture = rec.begin_capture();
    {
        let _s = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
    }
    let graph = stream.end_capture().unwrap();
    let handle = capture.finish();
    assert_eq!(handle.marks(), 0);
    let guard = rec.replay(&handle);
    graph.launch(&stream);
    guard.end();
    p.flush();
    let s = p.stats();
    assert_eq!(s.dropped[DropReason::Clock], 1, "{s:?}");
    assert_eq!((s.sections, s.graph_replays), (0, 0), "{s:?}");
    p.shutdown();

    // The event clock without the capture API: a plain mark during capture is skipped, counted.
    let clock = SimEventClock::new(stream.clone());
    stream.begin_capture().unwrap();
    assert_eq!(clock.mark(), None);
    assert_eq!(clock.captured(), 1);
    let _ = stream.end_capture();
    assert_eq!(clock.mark_captured(), None, "not capturing any more");
    assert_eq!(clock.captured(), 2);
    assert_eq!(clock.in_flight(), 0);
}

#[test]
fn the_background_worker_reads_replays_without_a_flush() {
    let stream = SimStream::new();
    let clock = Arc::new(SimEventClock::with_pool_size(stream.clone(), 256));
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .with_timing(Timing::Events)
        .with_clock(clock.clone())
        .build()
        .expect("profiler");
    let rec = p.recorder();
    let (graph, handle) = capture_layers(&stream, &rec);
    for k in 1..=5u64 {
        replay(&stream, &rec, &graph, &handle);
        stream.synchronize();
        // The host's per-token work; the worker (1 ms drain interval) reads the replay meanwhile.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while p.stats().graph_replays < k {
            assert!(
                std::time::Instant::now() < deadline,
                "replay {k} never read: {:?}",
                p.stats()
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let s = p.stats();
    assert_eq!((s.graph_replays, s.dropped_graph_replays), (5, 0), "{s:?}");
    assert_eq!(s.sections, 5 * sections_per_replay());
    p.shutdown();
}

mod arbitrary_sequences {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        BeginCapture,
        Section(u8, u16),
        FinishCapture(bool),
        AbandonCapture,
        Launch(u8, bool),
        LaunchPlain(u8),
        Sync,
        Flush,
        DropGraph(u8),
        Step,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::BeginCapture),
            (0..4u8, 0..300u16).prop_map(|(s, us)| Op::Section(s, us)),
            any::<bool>().prop_map(Op::FinishCapture),
            Just(Op::AbandonCapture),
            (any::<u8>(), any::<bool>()).prop_map(|(g, s)| Op::Launch(g, s)),
            any::<u8>().prop_map(Op::LaunchPlain),
            Just(Op::Sync),
            Just(Op::Flush),
            any::<u8>().prop_map(Op::DropGraph),
            Just(Op::Step),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Captures begun, finished, invalidated and abandoned in any order, graphs launched with
        /// and without the replay guard, synchronized or overlapping, dropped at any time: no
        /// panic, nothing attributed beyond what was launched, and no pool event leaks.
        #[test]
        fn any_capture_and_replay_sequence_leaks_nothing(ops in proptest::collection::vec(op(), 0..80)) {
            let stream = SimStream::new();
            let clock = Arc::new(SimEventClock::with_pool_size(stream.clone(), 512));
            let p = profiler(clock.clone(), 1);
            let rec = p.recorder();
            let mut capture = None;
            let mut graphs: Vec<(SimGraph, CapturedGraph)> = Vec::new();
            let mut launched = 0u64;
            for op in &ops {
                match op {
                    Op::BeginCapture => {
                        if capture.is_none() && stream.begin_capture().is_ok() {
                            capture = Some(rec.begin_capture());
                        }
                    }
                    Op::Section(s, us) => {
                        let _g = rec.section(LAYER[*s as usize % LAYER.len()].0, 0u32, Site::ATTN);
                        stream.enqueue(Duration::from_micros(u64::from(*us)));
                    }
                    Op::FinishCapture(invalid) => {
                        if let Some(c) = capture.take() {
                            if *invalid {
                                stream.invalidate_capture();
                            }
                            match stream.end_capture() {
                                Ok(g) => graphs.push((g, c.finish())),
                                Err(_) => c.abandon(),
                            }
                        }
                    }
                    Op::AbandonCapture => {
                        if let Some(c) = capture.take() {
                            let _ = stream.end_capture();
                            drop(c);
                        }
                    }
                    Op::Launch(i, sync) => {
                        if capture.is_none() && !graphs.is_empty() {
                            let (g, h) = &graphs[*i as usize % graphs.len()];
                            let guard = rec.replay(h);
                            g.launch(&stream);
                            guard.end();
                            launched += 1;
                            if *sync {
                                stream.synchronize();
                            }
                        }
                    }
                    Op::LaunchPlain(i) => {
                        if capture.is_none() && !graphs.is_empty() {
                            let (g, _) = &graphs[*i as usize % graphs.len()];
                            g.launch(&stream);
                        }
                    }
                    Op::Sync => stream.synchronize(),
                    Op::Flush => p.flush(),
                    Op::DropGraph(i) => {
                        if !graphs.is_empty() {
                            let n = graphs.len();
                            graphs.remove(*i as usize % n);
                        }
                    }
                    Op::Step => {
                        let _s = rec.step();
                    }
                }
            }
            if let Some(c) = capture.take() {
                let _ = stream.end_capture();
                c.abandon();
            }
            stream.synchronize();
            p.flush();
            let s = p.stats();
            prop_assert!(s.graph_replays + s.dropped_graph_replays <= launched, "{s:?}");
            drop(graphs);
            drop(capture);
            drop(rec);
            p.flush();
            prop_assert_eq!(clock.in_flight(), 0, "{:?}", p.stats());
            p.shutdown();
        }
    }
}
