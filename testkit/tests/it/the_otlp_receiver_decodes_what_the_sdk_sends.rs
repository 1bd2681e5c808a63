//! Self-test of the in-process OTLP/HTTP receiver (`support::OtlpReceiver`): the OpenTelemetry
//! SDK exports a span and a counter over OTLP/HTTP protobuf, and the receiver holds them as
//! decoded `opentelemetry-proto` messages (names, attributes, values); a body that is no OTLP
//! message is refused and said so.

use crate::support::{OtlpReceiver, http_request};
use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn the_otlp_receiver_decodes_what_the_sdk_sends() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let receiver = OtlpReceiver::start();
    let span_exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{}/v1/traces", receiver.endpoint()))
        .build()
        .expect("HTTP span exporter");
    let metric_exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{}/v1/metrics", receiver.endpoint()))
        .build()
        .expect("HTTP metric exporter");
    let traces = SdkTracerProvider::builder()
        .with_simple_exporter(span_exporter)
        .build();
    let metrics = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metric_exporter).build())
        .build();

    let mut span = traces.tracer("receiver-self-test").start("receiver.span");
    span.set_attribute(KeyValue::new("layer", 7_i64));
    span.end();
    let counter = metrics
        .meter("receiver-self-test")
        .u64_counter("receiver.calls")
        .build();
    counter.add(3, &[KeyValue::new("rank", 1_i64)]);
    metrics.force_flush().expect("metrics flush");

    let span = receiver
        .wait_for(WAIT, |r| {
            r.spans().into_iter().find(|s| s.name == "receiver.span")
        })
        .unwrap_or_else(|| panic!("no span received; refused: {:?}", receiver.refused()));
    let layer = span
        .attributes
        .iter()
        .find(|kv| kv.key == "layer")
        .and_then(|kv| kv.value.as_ref()?.value.clone());
    assert_eq!(layer, Some(Value::IntValue(7)));

    let total = receiver
        .wait_for(WAIT, |r| {
            r.metrics()
                .iter()
                .flat_map(|m| &m.resource_metrics)
                .flat_map(|rm| &rm.scope_metrics)
                .flat_map(|sm| &sm.metrics)
                .filter(|m| m.name == "receiver.calls")
                .find_map(|m| match &m.data {
                    Some(Data::Sum(sum)) => sum.data_points.first().and_then(|p| p.value),
                    _ => None,
                })
        })
        .unwrap_or_else(|| panic!("no counter received; refused: {:?}", receiver.refused()));
    assert_eq!(total, number_data_point::Value::AsInt(3));

    // A body that is no OTLP message is refused with 400 and recorded.
    let (status, _) = http_request(
        "POST",
        &format!("{}/v1/traces", receiver.endpoint()),
        &[("content-type", "application/x-protobuf")],
        b"\xff\xff\xff not protobuf",
    )
    .expect("POST");
    assert_eq!(status, 400);
    assert_eq!(receiver.refused().len(), 1, "{:?}", receiver.refused());
    traces.shutdown().expect("span shutdown");
    metrics.shutdown().expect("metric shutdown");
}
