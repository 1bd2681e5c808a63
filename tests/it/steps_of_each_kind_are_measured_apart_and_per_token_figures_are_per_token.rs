//! A serving engine's steps have a kind: prefill steps (a batch's prompts), decode steps (a
//! token per request), mixed steps (chunked prefill beside decode) and speculative verify
//! steps. On a clock the test moves by hand, 3 prefill steps of 12 ms, 10 decode steps of 4 ms
//! and 2 mixed steps of 6 ms serve 4 requests, and one step states no kind. The step
//! histogram and counter carry `step.kind` (a series per kind used, none for the kindless
//! step), so do the step spans, and the summary labels per-step figures `ms/step` and gives
//! `ms/token` as step time over the tokens the steps produced: 4 ms steps of 4 tokens are
//! 1 ms/token.

use std::collections::BTreeMap;
use std::sync::Arc;

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use phasetrace::{Finish, Profiler, RecorderOptions, RequestKind, SectionLevel, StepKind};
use phasetrace_names::{attr, metric, span};

use crate::manual_clock::Manual;

const REQUESTS: u64 = 4;
const MS: u64 = 1_000_000;

/// Histogram `name`'s count by its `step.kind` value ("" for points without one).
fn counts_by_kind(rm: &[ResourceMetrics], name: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(rm) = rm.last() else { return out };
    for scope in rm.scope_metrics() {
        for m in scope.metrics().filter(|m| m.name() == name) {
            let points: Vec<(String, u64)> = match m.data() {
                AggregatedMetrics::F64(MetricData::Histogram(h)) => h
                    .data_points()
                    .map(|p| (kind_of(p.attributes()), p.count()))
                    .collect(),
                AggregatedMetrics::U64(MetricData::Sum(s)) => s
                    .data_points()
                    .map(|p| (kind_of(p.attributes()), p.value()))
                    .collect(),
                other => panic!("{name}: {other:?}"),
            };
            for (k, n) in points {
                *out.entry(k).or_default() += n;
            }
        }
    }
    out
}

fn kind_of<'a>(mut kv: impl Iterator<Item = &'a opentelemetry::KeyValue>) -> String {
    kv.find(|kv| kv.key.as_str() == attr::STEP_KIND)
        .map(|kv| kv.value.to_string())
        .unwrap_or_default()
}

#[test]
fn step_kinds_reach_metrics_spans_and_the_summary_with_per_token_figures() {
    let (meters, metrics) = crate::engine_meter::engine_provider(None);
    let spans = InMemorySpanExporter::default();
    let tracer = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .without_prometheus()
        .with_meter_provider(meters.clone())
        .with_tracer_provider(tracer.clone())
        .build()
        .expect("a profiler on the engine's providers builds");
    let class = profiler
        .request_kind(RequestKind::new("phasetrace-test", "text_completion", "m"))
        .expect("one kind registers");
    let clock = Arc::new(Manual::default());
    let rec = profiler.recorder_with(RecorderOptions::new().clock(clock.clone()));
    let mut t = 0;
    let mut step = |kind: Option<StepKind>, ms: u64, serve: &dyn Fn()| {
        clock.set(t);
        let guard = match kind {
            Some(k) => rec.step_of(k),
            None => rec.step(),
        };
        serve();
        t += ms * MS;
        clock.set(t);
        drop(guard);
    };
    for id in 0..REQUESTS {
        rec.request_begin(id, class);
    }
    // Prefill in three steps: two chunks that sample nothing, then the rest and a first token.
    for outputs in [0, 0, 1] {
        step(Some(StepKind::Prefill), 12, &|| {
            (0..REQUESTS).for_each(|id| rec.serve(id, 16, outputs))
        });
    }
    for _ in 0..10 {
        step(Some(StepKind::Decode), 4, &|| {
            (0..REQUESTS).for_each(|id| rec.serve(id, 1, 1))
        });
    }
    for _ in 0..2 {
        step(Some(StepKind::Mixed), 6, &|| {
            (0..REQUESTS).for_each(|id| rec.serve(id, 1, 1))
        });
    }
    step(None, 2, &|| {});
    for id in 0..REQUESTS {
        rec.request_end(id, Finish::Stop);
    }
    profiler.flush();
    let summary = profiler.summary();
    profiler.shutdown();
    meters.force_flush().expect("the engine's provider flushes");

    let got = metrics
        .get_finished_metrics()
        .expect("the engine's metrics");
    let want: BTreeMap<String, u64> = [("", 1), ("decode", 10), ("mixed", 2), ("prefill", 3)]
        .into_iter()
        .map(|(k, n)| (k.to_owned(), n))
        .collect();
    assert_eq!(counts_by_kind(&got, metric::STEP_DURATION), want);
    assert_eq!(counts_by_kind(&got, metric::STEPS), want);
    assert_eq!(counts_by_kind(&got, metric::STEP_COLLECTIVE_WAIT), want);

    let finished = spans.get_finished_spans().expect("the engine's spans");
    let mut span_kinds: BTreeMap<String, u64> = BTreeMap::new();
    for s in finished.iter().filter(|s| s.name == span::STEP) {
        *span_kinds.entry(kind_of(s.attributes.iter())).or_default() += 1;
    }
    assert_eq!(span_kinds, want, "{finished:#?}");

    // 16 steps: (36 + 40 + 12 + 2) ms over 16 steps; 4 + 40 + 8 = 52 output tokens.
    assert!(
        summary.contains("after 16 steps: 0.000 ms/step in sections, 5.625 ms/step, 1.731 ms/token over 52 output tokens"),
        "{summary}"
    );
    assert!(
        summary.contains("ms/step") && summary.contains("calls/step"),
        "{summary}"
    );
    for line in [
        " unstated 1 at 2.000 ms/step",
        " prefill 3 at 12.000 ms/step, 9.000 ms/token over 4 tokens",
        " decode 10 at 4.000 ms/step, 1.000 ms/token over 40 tokens",
        " mixed 2 at 6.000 ms/step, 1.500 ms/token over 8 tokens",
    ] {
        assert!(summary.contains(line), "{line:?} in\n{summary}");
    }
    tracer.shutdown().expect("the engine's tracer shuts down");
}
