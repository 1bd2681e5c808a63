//! Requests as a serving engine has them: speculative rounds whose output tokens the engine
//! gives (no bonus token when every draft is accepted, a round truncated at the maximum
//! length), a warm-up request of the engine's own, an API request of several sequences
//! (`n > 1`), and a sequence ended twice. Read back from the summary, the stats and the
//! engine's meter provider.

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, SdkMeterProvider};
use phasetrace::{DropReason, Finish, Profiler, Recorder, RequestKind, SectionLevel};
use phasetrace_names::metric;

/// A profiler on the engine's meter provider, with its recorder (`with` builds on it).
fn profiler() -> (Profiler, SdkMeterProvider, InMemoryMetricExporter) {
    let (provider, exporter) = crate::engine_meter::engine_provider(Some(false));
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .with_meter_provider(provider.clone())
        .build()
        .expect("building the profiler");
    (profiler, provider, exporter)
}

/// `name`'s histogram points as (count, sum) totals, or the gauge's value as count.
fn read(provider: &SdkMeterProvider, exporter: &InMemoryMetricExporter, name: &str) -> (u64, f64) {
    exporter.reset();
    provider
        .force_flush()
        .expect("the engine's provider collects");
    let all = exporter.get_finished_metrics().expect("exported metrics");
    let rm = all.last().expect("one export");
    let mut total = (0, 0.0);
    for m in rm.scope_metrics().flat_map(|s| s.metrics()) {
        if m.name() != name {
            continue;
        }
        match m.data() {
            AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                for p in h.data_points() {
                    total.0 += p.count();
                    total.1 += p.sum();
                }
            }
            AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                for p in h.data_points() {
                    total.0 += p.count();
                    total.1 += p.sum() as f64;
                }
            }
            AggregatedMetrics::U64(MetricData::Gauge(g)) => {
                total.0 += g.data_points().map(|p| p.value()).sum::<u64>();
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    total
}

/// One step of `rec` serving each (id, tokens, outputs).
fn step(rec: &Recorder, batch: &[(u64, u32, u32)]) {
    let _step = rec.step();
    for &(id, tokens, outputs) in batch {
        rec.serve(id, tokens, outputs);
    }
}

#[test]
fn speculative_output_tokens_are_the_engines_and_acceptance_is_unchanged() {
    let (profiler, provider, exporter) = profiler();
    let class = profiler
        .request_kind(RequestKind::new("engine", "chat", "m"))
        .expect("a kind");
    let rec = profiler.recorder();
    rec.request_begin(1, class);
    step(&rec, &[(1, 8, 1)]); // prefill: the first token
    for (drafted, accepted, outputs) in [
        (4, 4, 4), // every draft accepted, no bonus token
        (4, 2, 3), // two accepted and the target model's token
        (4, 4, 2), // truncated at the maximum length
    ] {
        let _step = rec.step();
        rec.serve_speculative_outputs(1, drafted, accepted, outputs);
    }
    // The old call still means accepted + 1 output tokens.
    {
        let _step = rec.step();
        rec.serve_speculative(1, 4, 1);
    }
    rec.request_end(1, Finish::Length);
    profiler.flush();
    let summary = profiler.summary();
    assert!(
        summary.contains("requests: 1 done (0 failed), 12 output tokens"),
        "1 + 4 + 3 + 2 + 2 output tokens: {summary}"
    );
    assert_eq!(
        read(&provider, &exporter, metric::REQUEST_ACCEPTED_TOKENS),
        (1, 11.0),
        "accepted drafts: 4 + 2 + 4 + 1"
    );
    assert_eq!(profiler.stats().dropped.total(), 0);
    drop(rec);
    profiler.shutdown();
}

#[test]
fn an_internal_request_is_in_no_request_figure_and_is_counted() {
    let (profiler, provider, exporter) = profiler();
    let class = profiler
        .request_kind(RequestKind::new("engine", "chat", "m"))
        .expect("a kind");
    let warm_up = profiler
        .request_kind(RequestKind::new("engine", "chat", "m").internal())
        .expect("an internal kind");
    assert_ne!(class, warm_up);
    let rec = profiler.recorder();
    rec.request_begin(100, warm_up);
    step(&rec, &[(100, 4, 1)]);
    step(&rec, &[(100, 1, 1)]);
    profiler.flush();
    assert_eq!(
        read(&provider, &exporter, metric::REQUESTS_RUNNING).0,
        0,
        "a warm-up request is not a running request"
    );
    rec.request_end(100, Finish::Stop);
    rec.request_begin(1, class);
    step(&rec, &[(1, 4, 1)]);
    step(&rec, &[(1, 1, 1)]);
    rec.request_end(1, Finish::Stop);
    profiler.flush();
    let stats = profiler.stats();
    assert_eq!(stats.steps, 4, "the warm-up's steps are timed");
    assert_eq!(stats.internal_requests, 1, "{stats:?}");
    assert_eq!(stats.dropped.total(), 0, "{:?}", stats.dropped);
    let summary = profiler.summary();
    assert!(
        summary.contains("requests: 1 done (0 failed), 2 output tokens"),
        "{summary}"
    );
    assert_eq!(
        read(&provider, &exporter, metric::GEN_AI_SERVER_REQUEST_DURATION).0,
        1,
        "only the client's request is measured"
    );
    assert_eq!(read(&provider, &exporter, metric::BATCH_SIZE).0, 2);
    drop(rec);
    profiler.shutdown();
}

#[test]
fn the_sequences_of_one_api_request_are_one_request() {
    let (profiler, provider, exporter) = profiler();
    let class = profiler
        .request_kind(RequestKind::new("engine", "chat", "m"))
        .expect("a kind");
    let rec = profiler.recorder();
    // One API request (id 7) with n = 3: sequences 70, 71, 72.
    rec.request_begin(7, class);
    for seq in 70..73 {
        rec.request_sequence(seq, 7);
    }
    step(&rec, &[(70, 8, 1), (71, 8, 1), (72, 8, 1)]);
    step(&rec, &[(70, 1, 1), (71, 1, 1), (72, 1, 1)]);
    rec.request_end(71, Finish::Stop);
    step(&rec, &[(70, 1, 1), (72, 1, 1)]);
    rec.request_end(70, Finish::Stop);
    profiler.flush();
    assert!(
        !profiler.summary().contains("requests: 1 done"),
        "a sequence still runs: {}",
        profiler.summary()
    );
    step(&rec, &[(72, 1, 1)]);
    rec.request_end(72, Finish::Length);
    profiler.flush();
    let summary = profiler.summary();
    assert!(
        summary.contains("requests: 1 done (0 failed), 9 output tokens"),
        "3 + 3 + 2 + 1 output tokens: {summary}"
    );
    assert_eq!(
        read(&provider, &exporter, metric::GEN_AI_SERVER_REQUEST_DURATION).0,
        1
    );
    assert_eq!(
        read(&provider, &exporter, metric::BATCH_SIZE),
        (4, 4.0),
        "one request a step, however many of its sequences the step serves"
    );
    assert_eq!(read(&provider, &exporter, metric::REQUESTS_RUNNING).0, 0);
    assert_eq!(
        profiler.stats().dropped.total(),
        0,
        "{:?}",
        profiler.stats().dropped
    );
    drop(rec);
    profiler.shutdown();
}

#[test]
fn a_request_ended_twice_is_counted_once_and_the_second_end_as_ended_twice() {
    let (profiler, _provider, _exporter) = profiler();
    let class = profiler
        .request_kind(RequestKind::new("engine", "chat", "m"))
        .expect("a kind");
    let rec = profiler.recorder();
    // Finishes in its prompt step: ended there, and again by the engine's completion path,
    // once in the same drain and once after it was delivered.
    rec.request_begin(1, class);
    rec.request_begin(2, class);
    {
        let _step = rec.step();
        rec.serve(1, 8, 1);
        rec.serve(2, 8, 1);
        rec.request_end(1, Finish::Stop);
        rec.request_end(2, Finish::Stop);
    }
    rec.request_end(1, Finish::Stop);
    profiler.flush();
    rec.request_end(2, Finish::Stop);
    profiler.flush();
    let stats = profiler.stats();
    assert_eq!(
        stats.dropped[DropReason::EndedTwice],
        2,
        "{:?}",
        stats.dropped
    );
    assert_eq!(
        stats.dropped[DropReason::Unbalanced],
        0,
        "{:?}",
        stats.dropped
    );
    assert!(
        profiler
            .summary()
            .contains("requests: 2 done (0 failed), 2 output tokens"),
        "{}",
        profiler.summary()
    );
    // An end of a request never begun is still unbalanced.
    rec.request_end(99, Finish::Stop);
    profiler.flush();
    assert_eq!(profiler.stats().dropped[DropReason::Unbalanced], 1);
    drop(rec);
    profiler.shutdown();
}
