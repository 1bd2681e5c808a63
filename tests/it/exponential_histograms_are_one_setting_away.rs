//! `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram`
//! (or `with_otlp_histogram`) turns OTLP duration histograms exponential, while the embedded
//! Prometheus endpoint of the same profiler keeps the explicit 1 µs to 10 s buckets. The
//! per-layer distributions arrive over OTLP as exponential histograms too (and stay off the
//! text scrape).

use crate::support;

use phasetrace::config::HistogramAggregation;
use phasetrace::{Profiler, Section, SectionLevel, Site};
use std::time::Duration;
use support::{MetricKind, Rotel};

#[test]
fn otlp_gets_exponential_histograms_and_prometheus_keeps_explicit_buckets() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(0)
        .with_otlp_endpoint(Some(&rotel.grpc_endpoint()))
        .with_otlp_histogram(HistogramAggregation::Exponential)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()
        .expect("profiler");
    let rec = p.recorder();
    for _ in 0..10 {
        let _s = rec.step();
        let _k = rec.section(Section::KDA_MIXER, 1u32, Site::ATTN);
    }
    drop(rec);
    p.flush();
    let out = rotel.wait_for(
        |o| {
            o.last_metric("phasetrace.section.duration")
                .is_some_and(|m| m.points.iter().any(|pt| pt.count == Some(10)))
        },
        Duration::from_secs(20),
    );
    let m = out
        .last_metric("phasetrace.section.duration")
        .expect("metric");
    assert_eq!(m.kind, MetricKind::ExponentialHistogram);
    // The per-layer distribution goes with it, one exponential histogram per layer.
    let out = rotel.wait_for(
        |o| {
            o.last_metric(phasetrace_names::metric::SECTION_LAYER_DURATION)
                .is_some_and(|m| m.points.iter().any(|pt| pt.count == Some(10)))
        },
        Duration::from_secs(20),
    );
    let layer = out
        .last_metric(phasetrace_names::metric::SECTION_LAYER_DURATION)
        .expect("metric");
    assert_eq!(layer.kind, MetricKind::ExponentialHistogram);
    assert!(
        layer
            .points
            .iter()
            .all(|pt| pt.attr("layer").is_some_and(|l| l == "1")),
        "{:?}",
        layer.points
    );
    let url = format!("http://{}/metrics", p.prometheus_addr().expect("endpoint"));
    let (code, body) = support::http_get(&url).expect("scrape");
    assert_eq!(code, 200);
    assert!(
        body.lines().any(
            |l| l.starts_with("phasetrace_section_duration_seconds_bucket{")
                && l.contains("le=\"0.000001\"")
        ),
        "explicit buckets from 1 µs on the Prometheus endpoint:\n{body}"
    );
    assert!(
        !body.contains("layer_duration"),
        "no per-layer distribution on the text scrape"
    );
    p.shutdown();
}
