//! An engine that owns its OpenTelemetry pipeline hands phasetrace its meter provider: the
//! instruments are created there (scope `phasetrace` with the crate's version), the engine's
//! exporter receives exactly what was recorded, nothing is served unless asked for, and after
//! `Profiler::shutdown()` the engine's own instruments still export. With
//! `with_global_providers()` the globals are used the same way. The per-signal OTLP variables
//! send metrics to the metrics endpoint even when the general endpoint points elsewhere.

use crate::support;

use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, SdkMeterProvider};
use phasetrace::{Profiler, Section, SectionLevel, Site};
use phasetrace_names::env;
use phasetrace_names::{metric, span};
use support::Rotel;

const STEPS: u64 = 5;
const LAYERS: u32 = 3;

fn engine_provider(view: bool) -> (SdkMeterProvider, InMemoryMetricExporter) {
    crate::engine_meter::engine_provider(view.then_some(false))
}

fn drive(profiler: &Profiler) {
    let rec = profiler.recorder();
    for _ in 0..STEPS {
        let _step = rec.step();
        for layer in 0..LAYERS {
            let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        }
    }
}

/// The count of histogram `name` summed over its points, in the scope `phasetrace`.
fn histogram_count(rm: &ResourceMetrics, name: &str) -> Option<u64> {
    let scope = rm
        .scope_metrics()
        .find(|s| s.scope().name() == phasetrace_names::SCOPE)?;
    assert_eq!(scope.scope().version(), Some(env!("CARGO_PKG_VERSION")));
    let m = scope.metrics().find(|m| m.name() == name)?;
    match m.data() {
        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
            Some(h.data_points().map(|p| p.count()).sum())
        }
        other => panic!("{name}: not an f64 histogram: {other:?}"),
    }
}

#[test]
fn the_engines_meter_provider_receives_what_was_recorded_and_outlives_the_profiler() {
    let (provider, exporter) = engine_provider(true);
    let engine_counter = provider
        .meter("engine")
        .u64_counter("engine.requests")
        .build();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_meter_provider(provider.clone())
        .build()
        .expect("building the profiler");
    assert_eq!(
        profiler.prometheus_addr(),
        None,
        "with the engine's provider nothing is served unless asked for"
    );
    drive(&profiler);
    profiler.shutdown();
    engine_counter.add(7, &[]);
    provider
        .force_flush()
        .expect("the engine's provider still runs");

    let all = exporter.get_finished_metrics().expect("exported metrics");
    let last = all.last().expect("one export");
    assert_eq!(
        histogram_count(last, metric::STEP_DURATION),
        Some(STEPS),
        "{last:#?}"
    );
    assert_eq!(
        histogram_count(last, metric::SECTION_DURATION),
        Some(STEPS * u64::from(LAYERS))
    );
    // The engine's own counter, added after phasetrace shut down, arrived too.
    let engine = last
        .scope_metrics()
        .find(|s| s.scope().name() == "engine")
        .expect("the engine's scope");
    let requests = engine
        .metrics()
        .find(|m| m.name() == "engine.requests")
        .expect("the engine's counter");
    match requests.data() {
        AggregatedMetrics::U64(MetricData::Sum(s)) => {
            assert_eq!(s.data_points().map(|p| p.value()).sum::<u64>(), 7);
        }
        other => panic!("engine.requests: {other:?}"),
    }
    provider
        .shutdown()
        .expect("the engine shuts its provider down");
}

#[test]
fn the_global_providers_are_recorded_into() {
    let (provider, exporter) = engine_provider(true);
    opentelemetry::global::set_meter_provider(provider.clone());
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_global_providers()
        .build()
        .expect("building the profiler");
    drive(&profiler);
    profiler.shutdown();
    provider.force_flush().expect("flush");
    let all = exporter.get_finished_metrics().expect("exported metrics");
    assert_eq!(
        histogram_count(all.last().expect("one export"), metric::STEP_DURATION),
        Some(STEPS)
    );
    provider.shutdown().expect("shutdown");
}

#[test]
fn a_prometheus_endpoint_asked_for_is_served_beside_the_engines_provider() {
    let (provider, exporter) = engine_provider(true);
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_meter_provider(provider.clone())
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()
        .expect("building the profiler");
    let addr = profiler.prometheus_addr().expect("asked for, so served");
    drive(&profiler);
    profiler.drain();
    let (status, body) = support::http_get(&format!("http://{addr}/metrics")).expect("a scrape");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("phasetrace_step_duration_seconds_count{"),
        "{body}"
    );
    profiler.shutdown();
    provider.force_flush().expect("flush");
    let all = exporter.get_finished_metrics().expect("exported metrics");
    assert_eq!(
        histogram_count(all.last().expect("one export"), metric::STEP_DURATION),
        Some(STEPS),
        "the engine's provider gets every measurement too"
    );
}

#[test]
fn the_metrics_endpoint_variable_wins_over_the_general_endpoint() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    // The general endpoint is a port nothing listens on; metrics have their own (OTLP/HTTP,
    // the whole URL), traces inherit the general one and are off.
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(0)
        .without_prometheus()
        .with_otlp_endpoint(Some("http://127.0.0.1:9"))
        .with_text(
            env::OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
            &format!("{}/v1/metrics", rotel.http_endpoint()),
        )
        .and_then(|b| b.with_text(env::OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, "http/protobuf"))
        .and_then(|b| b.with_text(env::OTEL_TRACES_EXPORTER, "none"))
        .expect("settings")
        .build()
        .expect("building the profiler");
    let cfg = profiler.config();
    assert_eq!(
        cfg.metrics_otlp.as_ref().map(|o| o.endpoint.as_str()),
        Some(format!("{}/v1/metrics", rotel.http_endpoint()).as_str())
    );
    assert!(cfg.traces_otlp.is_none());
    drive(&profiler);
    profiler.flush();
    let p = rotel.wait_for(
        |p| {
            p.last_metric(metric::STEP_DURATION)
                .is_some_and(|m| m.points.iter().filter_map(|pt| pt.count).sum::<u64>() == STEPS)
        },
        Duration::from_secs(20),
    );
    assert!(p.spans_named(span::STEP).is_empty());
    profiler.shutdown();
}
