//! Self-test of the in-process OTLP/gRPC receiver (`support::OtlpReceiver::start_grpc`): the
//! OpenTelemetry SDK's tonic exporters send a span and a counter (the metrics gzip-compressed),
//! and the receiver holds them as decoded `opentelemetry-proto` messages (names, attributes,
//! values). A gRPC request whose body is no OTLP message, or that names no OTLP service, gets a
//! non-OK `grpc-status` and is recorded as refused; the receiver goes on serving.

use crate::support::OtlpReceiver;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
use opentelemetry_otlp::{Compression, WithExportConfig as _, WithTonicConfig as _};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn the_otlp_receiver_decodes_what_the_sdk_sends_over_grpc() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let receiver = OtlpReceiver::start_grpc();
    // The tonic exporters need a Tokio runtime to build their channels in and to run on.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let _entered = runtime.enter();
    let span_exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(receiver.endpoint())
        .build()
        .expect("gRPC span exporter");
    let metric_exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_tonic()
        .with_endpoint(receiver.endpoint())
        .with_compression(Compression::Gzip)
        .build()
        .expect("gRPC metric exporter");
    let traces = SdkTracerProvider::builder()
        .with_batch_exporter(span_exporter)
        .build();
    let metrics = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metric_exporter).build())
        .build();

    let mut span = traces
        .tracer("receiver-self-test")
        .start("receiver.grpc.span");
    span.set_attribute(KeyValue::new("layer", 7_i64));
    span.end();
    let counter = metrics
        .meter("receiver-self-test")
        .u64_counter("receiver.grpc.calls")
        .build();
    counter.add(3, &[KeyValue::new("rank", 1_i64)]);
    traces.force_flush().expect("span flush");
    metrics.force_flush().expect("metrics flush");

    let span = receiver
        .wait_for(WAIT, |r| {
            r.spans()
                .into_iter()
                .find(|s| s.name == "receiver.grpc.span")
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
                .filter(|m| m.name == "receiver.grpc.calls")
                .find_map(|m| match &m.data {
                    Some(Data::Sum(sum)) => sum.data_points.first().and_then(|p| p.value),
                    _ => None,
                })
        })
        .unwrap_or_else(|| panic!("no counter received; refused: {:?}", receiver.refused()));
    assert_eq!(total, number_data_point::Value::AsInt(3));
    assert!(receiver.refused().is_empty(), "{:?}", receiver.refused());
    traces.shutdown().expect("span shutdown");
    metrics.shutdown().expect("metric shutdown");
}

/// Sends one unary gRPC request with `message` as its (uncompressed) body and returns the
/// `grpc-status` the receiver answered with, from the headers (a trailers-only answer) or the
/// trailers.
async fn grpc_status(endpoint: &str, path: &str, message: &[u8]) -> Option<String> {
    let authority = endpoint.trim_start_matches("http://");
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(connection);
    // A gRPC length-prefixed message: no compression flag, then the big-endian length.
    let mut frame = vec![0_u8];
    frame.extend_from_slice(&u32::try_from(message.len()).expect("short").to_be_bytes());
    frame.extend_from_slice(message);
    let request = hyper::Request::post(format!("{endpoint}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(frame)))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    assert_eq!(response.status(), 200, "gRPC answers errors in grpc-status");
    let from_headers = response.headers().get("grpc-status").cloned();
    let body = response.into_body().collect().await.expect("body");
    let from_trailers = body.trailers().and_then(|t| t.get("grpc-status").cloned());
    from_headers
        .or(from_trailers)
        .map(|v| v.to_str().expect("ascii").to_owned())
}

#[test]
fn a_malformed_grpc_request_gets_an_error_status_and_is_counted() {
    let receiver = OtlpReceiver::start_grpc();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let export = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
    runtime.block_on(async {
        // Not protobuf: a field tag that runs past the end of the message.
        let status = grpc_status(&receiver.endpoint(), export, b"\xff\xff\xff not protobuf").await;
        assert_eq!(
            status.as_deref(),
            Some("13"),
            "Internal: the body did not decode"
        );
        // No such service.
        let status = grpc_status(&receiver.endpoint(), "/no.such.Service/Export", b"").await;
        assert_eq!(status.as_deref(), Some("12"), "Unimplemented");
        // And it still serves: an empty message is a valid (empty) export request.
        let status = grpc_status(&receiver.endpoint(), export, b"").await;
        assert_eq!(status.as_deref(), Some("0"), "OK");
    });
    let refused = receiver.refused();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused[0].contains("TraceService/Export"), "{refused:?}");
    assert!(refused[1].contains("no.such.Service"), "{refused:?}");
    assert_eq!(receiver.traces().len(), 1, "the valid request was kept");
}
