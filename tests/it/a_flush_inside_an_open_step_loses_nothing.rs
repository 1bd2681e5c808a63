//! A serving engine hands a client its last token inside the step, so the client may call
//! `Profiler::flush()` before the engine ends that step: 4 requests of 16 output tokens each,
//! ended inside their last step, a flush there (on the engine's thread, from another thread,
//! from a Tokio task), then the step ends; a speculative round is open across the flush too. Every output token is counted, the running-requests
//! gauge reads 0 once the engine is idle, and nothing is dropped as unbalanced.

use std::sync::mpsc;

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use phasetrace::{Finish, Phase, Profiler, RequestKind, SectionLevel, SpecLevel};
use phasetrace_names::metric;

const REQUESTS: u64 = 4;
const TOKENS: u32 = 16;
const PROMPT: u32 = 8;

/// Who calls `flush` while the last step is open.
#[derive(Clone, Copy, Debug)]
enum Client {
    EngineThread,
    OtherThread,
    TokioTask,
}

/// The value of the gauge `name` summed over its points.
fn gauge(
    provider: &opentelemetry_sdk::metrics::SdkMeterProvider,
    exporter: &opentelemetry_sdk::metrics::InMemoryMetricExporter,
    name: &str,
) -> u64 {
    exporter.reset();
    provider
        .force_flush()
        .expect("the engine's provider collects");
    let all = exporter.get_finished_metrics().expect("exported metrics");
    let rm = all.last().expect("one export");
    rm.scope_metrics()
        .flat_map(|s| s.metrics())
        .filter(|m| m.name() == name)
        .map(|m| match m.data() {
            AggregatedMetrics::U64(MetricData::Gauge(g)) => {
                g.data_points().map(|p| p.value()).sum::<u64>()
            }
            other => panic!("{name}: {other:?}"),
        })
        .sum()
}

/// Serves the requests, `flush` called by `client` after the last tokens are handed out and
/// before the step that produced them ends.
fn serve_with_a_flush_inside_the_last_step(client: Client) {
    let (provider, exporter) = crate::engine_meter::engine_provider(Some(false));
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_spec_level(SpecLevel::Phases)
        .without_prometheus()
        .with_meter_provider(provider.clone())
        .build()
        .expect("building the profiler");
    let class = profiler
        .request_kind(RequestKind::new("engine", "chat", "m"))
        .expect("a request kind");
    // The client: told that its last token is out, it flushes and answers.
    let (last_token, rx) = mpsc::channel::<()>();
    let (flushed_tx, flushed) = mpsc::channel::<()>();
    let (p, rt) = (
        profiler.clone(),
        tokio::runtime::Runtime::new().expect("a runtime"),
    );
    let mut thread = None;
    let mut task = None;
    match client {
        Client::EngineThread => {}
        Client::OtherThread => {
            thread = Some(std::thread::spawn(move || {
                rx.recv().expect("the last token");
                p.flush();
                flushed_tx.send(()).expect("the engine waits");
            }));
        }
        Client::TokioTask => {
            task = Some(rt.spawn(async move {
                tokio::task::spawn_blocking(move || rx.recv())
                    .await
                    .expect("the waiting thread")
                    .expect("the last token");
                p.flush();
                flushed_tx.send(()).expect("the engine waits");
            }));
        }
    }
    let rec = profiler.recorder();
    for id in 0..REQUESTS {
        rec.request_begin(id, class);
    }
    for token in 0..TOKENS {
        let step = rec.step();
        for id in 0..REQUESTS {
            rec.serve(id, if token == 0 { PROMPT } else { 1 }, 1);
        }
        // The last step verifies a speculative round, open across the flush too.
        let round = (token + 1 == TOKENS).then(|| rec.round(2));
        if let Some(round) = &round {
            round.phase(Phase::Draft);
            for id in 0..REQUESTS {
                rec.request_end(id, Finish::Stop);
            }
            match client {
                Client::EngineThread => profiler.flush(),
                _ => {
                    last_token.send(()).expect("the client listens");
                    flushed.recv().expect("the client flushed");
                }
            }
            round.phase(Phase::Verify);
        }
        if let Some(round) = round {
            round.end(1);
        }
        drop(step);
    }
    if let Some(t) = thread {
        t.join().expect("the client thread");
    }
    if let Some(t) = task {
        rt.block_on(t).expect("the client task");
    }
    // The engine is idle: nothing runs, every request is counted whole.
    profiler.flush();
    let stats = profiler.stats();
    assert_eq!(stats.steps, u64::from(TOKENS), "{client:?}: {stats:?}");
    assert_eq!(stats.rounds, 1, "{client:?}: {stats:?}");
    assert_eq!(stats.dropped.total(), 0, "{client:?}: {:?}", stats.dropped);
    let summary = profiler.summary();
    let want = format!(
        "requests: {REQUESTS} done (0 failed), {} output tokens",
        REQUESTS * u64::from(TOKENS)
    );
    assert!(summary.contains(&want), "{client:?}: {summary}");
    assert_eq!(
        gauge(&provider, &exporter, metric::REQUESTS_RUNNING),
        0,
        "{client:?}: no request runs on an idle engine"
    );
    assert_eq!(gauge(&provider, &exporter, metric::REQUESTS_WAITING), 0);
    drop(rec);
    profiler.shutdown();
    drop(rt);
}

#[test]
fn a_flush_on_the_engines_thread_inside_the_step_loses_nothing() {
    serve_with_a_flush_inside_the_last_step(Client::EngineThread);
}

#[test]
fn a_flush_from_another_thread_inside_the_step_loses_nothing() {
    serve_with_a_flush_inside_the_last_step(Client::OtherThread);
}

#[test]
fn a_flush_from_a_tokio_task_inside_the_step_loses_nothing() {
    serve_with_a_flush_inside_the_last_step(Client::TokioTask);
}

/// Shut down with a step still open and a request never ended: the request that ended inside
/// that step is delivered with what its finished steps gave it, and the open step and the
/// request never ended are counted under `reason="open_at_shutdown"`, not as unbalanced.
#[test]
fn what_is_still_open_at_shutdown_is_counted_as_such() {
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .build()
        .expect("building the profiler");
    let class = profiler
        .request_kind(RequestKind::new("engine", "chat", "m"))
        .expect("a request kind");
    let rec = profiler.recorder();
    rec.request_begin(1, class);
    rec.request_begin(2, class);
    {
        let _step = rec.step();
        rec.serve(1, PROMPT, 1);
        rec.serve(2, PROMPT, 1);
    }
    rec.begin_step();
    rec.serve(1, 1, 1);
    rec.serve(2, 1, 1);
    rec.request_end(1, Finish::Stop);
    profiler.flush();
    assert!(
        !profiler.summary().contains("requests: 1 done"),
        "request 1 waits for the step it ended in"
    );
    profiler.shutdown();
    let stats = profiler.stats();
    assert_eq!(
        stats.dropped[phasetrace::DropReason::OpenAtShutdown],
        2,
        "{:?}",
        stats.dropped
    );
    assert_eq!(
        stats.dropped[phasetrace::DropReason::Unbalanced],
        0,
        "{:?}",
        stats.dropped
    );
    assert!(
        profiler
            .summary()
            .contains("requests: 1 done (0 failed), 1 output tokens"),
        "{}",
        profiler.summary()
    );
    drop(rec);
}
