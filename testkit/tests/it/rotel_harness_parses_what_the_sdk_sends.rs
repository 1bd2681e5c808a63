//! Self-test of the rotel harness in `phasetrace-testkit`: the OpenTelemetry SDK sends a span tree,
//! a histogram and a counter to a real `rotel-agent` over OTLP/gRPC and OTLP/HTTP (protobuf),
//! and the debug-output parser must recover exactly what was sent.

use crate::support;

/// reqwest is built without a default rustls provider (phasetrace configures its own); the
/// SDK's default HTTP client here needs one installed.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use support::{MetricKind, ParsedOutput, Rotel, parse_output, port_accepts};

const WAIT: Duration = Duration::from_secs(20);

fn resource(service: &str) -> Resource {
    Resource::builder()
        .with_service_name(service.to_string())
        .with_attribute(KeyValue::new("harness.build", "self-test"))
        .build()
}

/// Emits, in one trace: `request` → `prefill` → `kernel`, plus a span with an event; a
/// histogram `harness.latency` (4 values, one per bucket) and a counter `harness.tokens`
/// (= 128); then flushes both providers.
fn emit(traces: &SdkTracerProvider, metrics: &SdkMeterProvider, transport: &str) {
    let tracer = traces.tracer("harness");
    tracer.in_span("request", |cx| {
        cx.span()
            .set_attribute(KeyValue::new("transport", transport.to_string()));
        let mut prefill = tracer.start("prefill");
        prefill.set_attribute(KeyValue::new("phase", "prefill"));
        prefill.set_attribute(KeyValue::new("tokens", 128_i64));
        prefill.set_attribute(KeyValue::new("ratio", 0.5_f64));
        prefill.set_attribute(KeyValue::new("cached", true));
        prefill.set_attribute(KeyValue::new("note", "a, b: (c)"));
        let prefill_cx = cx.with_span(prefill);
        let mut kernel = tracer.start_with_context("kernel", &prefill_cx);
        kernel.add_event("launched", vec![KeyValue::new("stream", 7_i64)]);
        kernel.end();
        prefill_cx.span().end();
    });

    let meter = metrics.meter("harness");
    let attrs = [KeyValue::new("transport", transport.to_string())];
    let latency = meter
        .f64_histogram("harness.latency")
        .with_unit("s")
        .with_boundaries(vec![0.01, 0.1, 1.0])
        .build();
    for value in [0.005, 0.05, 0.5, 5.0] {
        latency.record(value, &attrs);
    }
    let tokens = meter.u64_counter("harness.tokens").build();
    tokens.add(100, &attrs);
    tokens.add(28, &attrs);

    traces.force_flush().expect("flushing spans");
    metrics.force_flush().expect("flushing metrics");
}

fn assert_received(rotel: &Rotel, service: &str, transport: &str) {
    let parsed = rotel.wait_for(
        |p| {
            p.spans
                .iter()
                .filter(|s| s.resource.get("service.name").map(String::as_str) == Some(service))
                .count()
                >= 3
                && p.last_metric("harness.latency").is_some()
                && p.last_metric("harness.tokens").is_some()
        },
        WAIT,
    );
    let context = || format!("transport {transport}; rotel output:\n{}", rotel.output());

    let request = parsed
        .span("request")
        .unwrap_or_else(|| panic!("{}", context()));
    let prefill = parsed
        .span("prefill")
        .unwrap_or_else(|| panic!("{}", context()));
    let kernel = parsed
        .span("kernel")
        .unwrap_or_else(|| panic!("{}", context()));

    assert!(request.is_root(), "{request:?}");
    assert_eq!(request.trace_id.len(), 32, "{request:?}");
    assert_eq!(request.span_id.len(), 16, "{request:?}");
    assert_eq!(request.attr("transport"), Some(transport));
    assert_eq!(request.kind, "SPAN_KIND_INTERNAL");
    assert_eq!(request.scope_name, "harness");
    assert_eq!(
        request.resource.get("service.name").map(String::as_str),
        Some(service)
    );
    assert_eq!(
        request.resource.get("harness.build").map(String::as_str),
        Some("self-test")
    );

    assert_eq!(prefill.trace_id, request.trace_id);
    assert_eq!(
        prefill.parent_span_id.as_deref(),
        Some(request.span_id.as_str())
    );
    assert_eq!(prefill.attr("phase"), Some("prefill"));
    assert_eq!(prefill.attr("tokens"), Some("128"));
    assert_eq!(prefill.attr("ratio"), Some("0.5"));
    assert_eq!(prefill.attr("cached"), Some("true"));
    assert_eq!(prefill.attr("note"), Some("a, b: (c)"));

    assert_eq!(kernel.trace_id, request.trace_id);
    assert_eq!(parsed.parent_of(kernel), Some(prefill));
    assert_eq!(parsed.children_of(request), vec![prefill]);
    assert_eq!(kernel.events.len(), 1, "{kernel:?}");
    assert_eq!(kernel.events[0].name, "launched");
    assert_eq!(
        kernel.events[0]
            .attributes
            .get("stream")
            .map(String::as_str),
        Some("7")
    );

    // Children lie within their parents, and timestamps are real wall-clock nanoseconds.
    assert!(request.start_unix_nanos > 1_600_000_000_000_000_000);
    for (parent, child) in [(request, prefill), (prefill, kernel)] {
        assert!(
            child.start_unix_nanos >= parent.start_unix_nanos,
            "{parent:?} {child:?}"
        );
        assert!(
            child.end_unix_nanos <= parent.end_unix_nanos,
            "{parent:?} {child:?}"
        );
        assert!(child.start_unix_nanos <= child.end_unix_nanos, "{child:?}");
    }

    let latency = parsed.last_metric("harness.latency").expect("latency");
    assert_eq!(latency.kind, MetricKind::Histogram);
    assert_eq!(latency.unit, "s");
    assert!(latency.is_cumulative(), "{latency:?}");
    assert_eq!(
        latency.resource.get("service.name").map(String::as_str),
        Some(service)
    );
    let point = parsed
        .latest_point("harness.latency", &[("transport", transport)])
        .unwrap_or_else(|| panic!("no latency point; {}", context()));
    assert_eq!(point.count, Some(4));
    let sum = point.sum.expect("histogram sum");
    assert!((sum - 5.555).abs() < 1e-9, "sum {sum}");
    assert_eq!(point.min, Some(0.005));
    assert_eq!(point.max, Some(5.0));
    assert_eq!(point.explicit_bounds, vec![0.01, 0.1, 1.0]);
    assert_eq!(point.bucket_counts, vec![1, 1, 1, 1]);
    assert!(point.time_unix_nanos >= point.start_unix_nanos);

    let tokens = parsed.last_metric("harness.tokens").expect("tokens");
    assert_eq!(tokens.kind, MetricKind::Sum);
    assert_eq!(tokens.monotonic, Some(true));
    let point = parsed
        .latest_point("harness.tokens", &[("transport", transport)])
        .unwrap_or_else(|| panic!("no tokens point; {}", context()));
    assert_eq!(point.value, Some(128.0));
    assert_eq!(point.count, None);
}

#[test]
fn grpc_export_round_trips_through_the_parser() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    // The tonic exporters must be built inside a Tokio runtime, which outlives them.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (traces, metrics) = {
        let _guard = runtime.enter();
        let span_exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(rotel.grpc_endpoint())
            .build()
            .expect("gRPC span exporter");
        let metric_exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(rotel.grpc_endpoint())
            .build()
            .expect("gRPC metric exporter");
        (
            SdkTracerProvider::builder()
                .with_simple_exporter(span_exporter)
                .with_resource(resource("harness-grpc"))
                .build(),
            SdkMeterProvider::builder()
                .with_reader(PeriodicReader::builder(metric_exporter).build())
                .with_resource(resource("harness-grpc"))
                .build(),
        )
    };
    emit(&traces, &metrics, "grpc");
    assert_received(&rotel, "harness-grpc", "grpc");
    traces.shutdown().expect("span shutdown");
    metrics.shutdown().expect("metric shutdown");
    drop(runtime);
}

#[test]
fn http_protobuf_export_round_trips_through_the_parser() {
    support::require_tools!(Rotel);
    install_crypto_provider();
    let rotel = Rotel::start();
    // The reqwest-blocking client must be built outside any Tokio runtime.
    let span_exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{}/v1/traces", rotel.http_endpoint()))
        .build()
        .expect("HTTP span exporter");
    let metric_exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{}/v1/metrics", rotel.http_endpoint()))
        .build()
        .expect("HTTP metric exporter");
    let traces = SdkTracerProvider::builder()
        .with_simple_exporter(span_exporter)
        .with_resource(resource("harness-http"))
        .build();
    let metrics = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metric_exporter).build())
        .with_resource(resource("harness-http"))
        .build();
    emit(&traces, &metrics, "http");
    assert_received(&rotel, "harness-http", "http");
    traces.shutdown().expect("span shutdown");
    metrics.shutdown().expect("metric shutdown");
}

#[test]
fn restart_keeps_the_same_endpoints() {
    support::require_tools!(Rotel);
    install_crypto_provider();
    let mut rotel = Rotel::start();
    let endpoint = rotel.http_endpoint();
    rotel.kill();
    let before_restart = rotel.output();
    assert!(
        !port_accepts(rotel.http_port()),
        "port still open after kill"
    );
    assert!(
        !port_accepts(rotel.grpc_port()),
        "port still open after kill"
    );
    rotel.restart_same_ports();
    assert_eq!(rotel.http_endpoint(), endpoint);
    assert!(rotel.is_running());

    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{endpoint}/v1/traces"))
        .build()
        .expect("HTTP span exporter");
    let traces = SdkTracerProvider::builder()
        .with_simple_exporter(exporter)
        .build();
    traces.tracer("harness").in_span("after-restart", |_| {});
    traces.shutdown().expect("span shutdown");
    rotel.wait_for(|p| p.span("after-restart").is_some(), WAIT);
    // Output from before the restart is kept, the new process' output follows it.
    let output = rotel.output();
    assert!(output.starts_with(&before_restart), "{output}");
    assert!(
        output[before_restart.len()..].contains("Starting Rotel"),
        "{output}"
    );
}

/// Rotel's debug output as printed by 0.0.1a15, including the parts the SDK round trips above
/// do not produce (multi-line strings, links, exponential histograms, log lines, gauges).
const RECORDED: &str = "\
2026-11-30T16:24:40.656875Z  INFO Starting Rotel. grpc_endpoint=\"127.0.0.1:14317\"
ResourceSpans #0
Resource SchemaURL: 
Resource attributes:
     -> service.name: Str(dump-svc)
     -> host.name: Str(h1)
ScopeSpans #0
ScopeSpans SchemaURL: 
InstrumentationScope scoped 1.2.3
Span #0
    Trace ID       : 4a0c6079943f786affe7b185025ef7b6
    Parent ID      : a90d68c6a432abf5
    ID             : ff0b569044a24ba7
    Name           : child
    Kind           : SPAN_KIND_INTERNAL
Start time: 1796055972093610049
End time: 1796055972093616299
    Status code    : STATUS_CODE_ERROR
    Status message : bad thing
Attributes:
     -> s: Str(a b, c: \"d\")
     -> i: Int(42)
     -> f: Double(1.5)
     -> b: Bool(true)
     -> arr: Slice(Int(1), Int(2))
     -> ml: Str(line1
line2)
     -> empty: Str()
Events:
SpanEvent #0
     -> Name: ev1
     -> Timestamp: 1796055972093613284
     -> DroppedAttributesCount: 0
     -> Attributes::
          -> ek: Str(ev)
Span #1
    Trace ID       : 4a0c6079943f786affe7b185025ef7b6
    Parent ID      : a90d68c6a432abf5
    ID             : 822fe9dd39efeff7
    Name           : linked
    Kind           : SPAN_KIND_INTERNAL
Start time: 1796055981238871576
End time: 1796055981238874790
    Status code    : STATUS_CODE_UNSET
    Status message : 
Links:
SpanLink #0
     -> Trace ID: 83ec18f8137cdad8525689f4f5cee41a
     -> ID: d16453236bd5dc46
     -> TraceState: 
     -> DroppedAttributesCount: 0
ResourceSpans #0
Resource SchemaURL: 
Resource attributes:
     -> service.name: Str(other)
ScopeSpans #0
ScopeSpans SchemaURL: 
InstrumentationScope plain 
Span #0
    Trace ID       : 4a0c6079943f786affe7b185025ef7b6
    Parent ID      : 
    ID             : a90d68c6a432abf5
    Name           : root op
    Kind           : SPAN_KIND_SERVER
Start time: 1796055972093602047
End time: 1796055972094998580
    Status code    : STATUS_CODE_UNSET
    Status message : 
ResourceMetrics #0
Resource SchemaURL: 
Resource attributes:
     -> service.name: Str(dump-svc)
ScopeMetrics #0
ScopeMetrics SchemaURL: 
InstrumentationScope dump 
Metric #0
Descriptor:
     -> Name: expo
     -> Description: 
     -> Unit: 
     -> DataType: ExponentialHistogram
     -> AggregationTemporality: AGGREGATION_TEMPORALITY_CUMULATIVE
ExponentialHistogramDataPoints #0
StartTimestamp: 1796055972095672576
Timestamp: 1796055972095837076
Count: 3
Sum: 3
Min: 0
Max: 2
Bucket [0, 0], Count: 1
Bucket (0.9576032806985737, 1], Count: 1
Bucket (1.9152065613971472, 2], Count: 1
Metric #1
Descriptor:
     -> Name: gg
     -> Description: a gauge
     -> Unit: By
     -> DataType: Gauge
NumberDataPoints #0
StartTimestamp: 1796055956826095799
Timestamp: 1796055956826259428
Value: 7.25
Metric #2
Descriptor:
     -> Name: ud
     -> Description: 
     -> Unit: 
     -> DataType: Sum
     -> IsMonotonic: false
     -> AggregationTemporality: AGGREGATION_TEMPORALITY_DELTA
NumberDataPoints #0
Data point attributes:
     -> k: Str(v)
StartTimestamp: 1796055956826118603
Timestamp: 1796055956826267159
Value: -2
NumberDataPoints #1
Data point attributes:
     -> k: Str(w)
StartTimestamp: 1796055956826118603
Timestamp: 1796055956826267159
Value: 5
2026-11-30T16:24:45.650520Z  INFO Shutdown signal received.
";

#[test]
fn parses_a_recorded_sample() {
    let parsed: ParsedOutput = parse_output(RECORDED);
    assert_eq!(parsed.spans.len(), 3, "{parsed:#?}");
    assert_eq!(parsed.metrics.len(), 3, "{parsed:#?}");

    let child = parsed.span("child").unwrap();
    assert_eq!(child.parent_span_id.as_deref(), Some("a90d68c6a432abf5"));
    assert_eq!(child.span_id, "ff0b569044a24ba7");
    assert_eq!(child.status_code, "STATUS_CODE_ERROR");
    assert_eq!(child.status_message, "bad thing");
    assert_eq!(child.duration_nanos(), 6250);
    assert_eq!(child.scope_name, "scoped");
    assert_eq!(child.scope_version, "1.2.3");
    assert_eq!(child.attr("s"), Some("a b, c: \"d\""));
    assert_eq!(child.attr("i"), Some("42"));
    assert_eq!(child.attr("f"), Some("1.5"));
    assert_eq!(child.attr("b"), Some("true"));
    assert_eq!(child.attr("arr"), Some("Slice(Int(1), Int(2))"));
    assert_eq!(child.attr("ml"), Some("line1\nline2"));
    assert_eq!(child.attr("empty"), Some(""));
    assert_eq!(child.attributes.len(), 7);
    assert_eq!(child.events.len(), 1);
    assert_eq!(child.events[0].name, "ev1");
    assert_eq!(child.events[0].time_unix_nanos, 1796055972093613284);
    assert_eq!(
        child.events[0].attributes.get("ek").map(String::as_str),
        Some("ev")
    );
    assert_eq!(
        child.resource.get("host.name").map(String::as_str),
        Some("h1")
    );

    let linked = parsed.span("linked").unwrap();
    assert!(linked.attributes.is_empty());
    assert_eq!(linked.links.len(), 1);
    assert_eq!(linked.links[0].trace_id, "83ec18f8137cdad8525689f4f5cee41a");
    assert_eq!(linked.links[0].span_id, "d16453236bd5dc46");

    let root = parsed.span("root op").unwrap();
    assert!(root.is_root());
    assert_eq!(root.kind, "SPAN_KIND_SERVER");
    assert_eq!(root.scope_name, "plain");
    assert_eq!(root.scope_version, "");
    assert_eq!(
        root.resource.get("service.name").map(String::as_str),
        Some("other")
    );
    assert_eq!(root.resource.len(), 1);
    assert_eq!(
        parsed.children_of(root),
        vec![child, linked],
        "children are matched by trace and span id, across resources"
    );
    assert_eq!(parsed.parent_of(child), Some(root));

    let expo = parsed.last_metric("expo").unwrap();
    assert_eq!(expo.kind, MetricKind::ExponentialHistogram);
    let point = &expo.points[0];
    assert_eq!(point.count, Some(3));
    assert_eq!(point.sum, Some(3.0));
    assert_eq!(point.bucket_counts, vec![1, 1, 1]);
    assert_eq!(point.exp_bucket_ranges[0], (0.0, 0.0));
    assert_eq!(point.exp_bucket_ranges[2], (1.9152065613971472, 2.0));
    assert!(point.attributes.is_empty());

    let gauge = parsed.last_metric("gg").unwrap();
    assert_eq!(gauge.kind, MetricKind::Gauge);
    assert_eq!(gauge.description, "a gauge");
    assert_eq!(gauge.unit, "By");
    assert_eq!(gauge.temporality, "");
    assert_eq!(gauge.points[0].value, Some(7.25));
    assert_eq!(gauge.points[0].time_unix_nanos, Some(1796055956826259428));

    let ud = parsed.last_metric("ud").unwrap();
    assert_eq!(ud.monotonic, Some(false));
    assert!(!ud.is_cumulative());
    assert_eq!(ud.points.len(), 2);
    assert_eq!(ud.point(&[("k", "v")]).unwrap().value, Some(-2.0));
    assert_eq!(
        parsed.latest_point("ud", &[("k", "w")]).unwrap().value,
        Some(5.0)
    );
    assert!(parsed.latest_point("ud", &[("k", "x")]).is_none());
}

/// What rotel printed for a histogram point with one exemplar (phasetrace's OTLP exporter).
const RECORDED_EXEMPLAR: &str = "\
ResourceMetrics #0
Resource attributes:
     -> service.name: Str(phasetrace)
ScopeMetrics #0
InstrumentationScope phasetrace
Metric #0
Descriptor:
     -> Name: phasetrace.step.duration
     -> Unit: s
     -> DataType: Histogram
     -> AggregationTemporality: AGGREGATION_TEMPORALITY_CUMULATIVE
HistogramDataPoints #0
Data point attributes:
     -> rank: Int(3)
Count: 11
Sum: 0.0301
Buckets #0, Count: 10
Buckets #1, Count: 1
Exemplars:
Exemplar #0
     -> Trace ID: 37576b3ed8d308eaef6165994d81bf84
     -> Span ID: 047e72aa017bb566
     -> Timestamp: 1796126757785420228
     -> Value: 0.030106276
Exemplar #1
     -> Trace ID: 0000000000000000000000000000abcd
     -> Span ID: 00000000000000ef
     -> Timestamp: 1796126757785420229
     -> Value: 0.0000011120000000000001
HistogramDataPoints #1
Data point attributes:
     -> rank: Int(4)
Count: 1
";

#[test]
fn parses_exemplars_of_a_point() {
    let parsed = parse_output(RECORDED_EXEMPLAR);
    let m = parsed.last_metric("phasetrace.step.duration").unwrap();
    assert_eq!(m.points.len(), 2);
    let e = &m.points[0].exemplars;
    assert_eq!(e.len(), 2, "{e:#?}");
    assert_eq!(e[0].trace_id, "37576b3ed8d308eaef6165994d81bf84");
    assert_eq!(e[0].span_id, "047e72aa017bb566");
    assert_eq!(e[0].time_unix_nanos, 1796126757785420228);
    assert_eq!(e[0].value, 0.030106276);
    assert_eq!(e[1].span_id, "00000000000000ef");
    assert!((e[1].value - 1.112e-6).abs() < 1e-15);
    assert_eq!(
        m.points[0].count,
        Some(11),
        "exemplar lines leave the point's fields alone"
    );
    assert!(m.points[1].exemplars.is_empty());
}
