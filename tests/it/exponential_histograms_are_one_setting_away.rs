//! `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram`
//! (or `with_otlp_histogram`) turns OTLP duration histograms exponential, while the embedded
//! Prometheus endpoint of the same profiler keeps the explicit 1 µs to 10 s buckets. The
//! per-layer distributions arrive over OTLP as exponential histograms too (and stay off the
//! text scrape). The OTLP side is read as decoded protobuf from the in-process gRPC receiver.

use crate::support;

use phasetrace::config::HistogramAggregation;
use phasetrace::{Profiler, Section, SectionLevel, Site};
use std::time::Duration;
use support::OtlpReceiver;
use support::opentelemetry_proto::tonic::common::v1::any_value::Value;
use support::opentelemetry_proto::tonic::metrics::v1::metric::Data;
use support::opentelemetry_proto::tonic::metrics::v1::{ExponentialHistogramDataPoint, Metric};

const WAIT: Duration = Duration::from_secs(20);

/// The last metric named `name` the receiver decoded.
fn last_metric(receiver: &OtlpReceiver, name: &str) -> Option<Metric> {
    receiver
        .metrics()
        .into_iter()
        .flat_map(|m| m.resource_metrics)
        .flat_map(|rm| rm.scope_metrics)
        .flat_map(|sm| sm.metrics)
        .rfind(|m| m.name == name)
}

/// The data points of `metric` if it is an exponential histogram.
fn exponential_points(metric: &Metric) -> Option<&[ExponentialHistogramDataPoint]> {
    match metric.data.as_ref()? {
        Data::ExponentialHistogram(h) => Some(&h.data_points),
        _ => None,
    }
}

/// Waits for the last `name` to be an exponential histogram with a point of count 10.
fn exponential_with_ten(receiver: &OtlpReceiver, name: &str) -> Metric {
    receiver
        .wait_for(WAIT, |r| {
            last_metric(r, name).filter(|m| {
                exponential_points(m).is_some_and(|pts| pts.iter().any(|pt| pt.count == 10))
            })
        })
        .unwrap_or_else(|| {
            panic!(
                "{name}: no exponential histogram with a point of count 10; last: {:#?}; \
                 refused: {:?}",
                last_metric(receiver, name),
                receiver.refused()
            )
        })
}

#[test]
fn otlp_gets_exponential_histograms_and_prometheus_keeps_explicit_buckets() {
    let receiver = OtlpReceiver::start_grpc();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(0)
        .with_otlp_endpoint(Some(&receiver.endpoint()))
        .with_otlp_protocol(phasetrace::Protocol::Grpc)
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
    exponential_with_ten(&receiver, "phasetrace.section.duration");
    // The per-layer distribution goes with it, one exponential histogram per layer.
    let layer = exponential_with_ten(&receiver, phasetrace_names::metric::SECTION_LAYER_DURATION);
    let points = exponential_points(&layer).expect("exponential");
    assert!(
        points
            .iter()
            .all(|pt| pt.attributes.iter().any(|kv| kv.key == "layer"
                && kv.value.as_ref().and_then(|v| v.value.as_ref()) == Some(&Value::IntValue(1)))),
        "{points:?}"
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
