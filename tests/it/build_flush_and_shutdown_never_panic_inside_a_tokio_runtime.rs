//! `build()`, `flush()` and `shutdown()` called from async code: inside a Tokio runtime of
//! either flavour, with OTLP over gRPC and over HTTP/protobuf (the SDK's metrics exporter and
//! phasetrace's own with exemplars), the Prometheus endpoint and console spans, nothing panics
//! ("Cannot drop a runtime in a context where blocking is not allowed" was the blocking HTTP
//! client's) and what was recorded is seen. The OTLP endpoint is a real collector (rotel) when
//! one is installed, else a closed port (exports then fail and are counted, never a panic).

use crate::support;

use std::time::Duration;

use phasetrace::config::TracesExporter;
use phasetrace::{Profiler, Protocol, Section, SectionLevel, Site};

/// What one case turns on.
#[derive(Clone, Copy, Debug)]
enum Exporters {
    /// OTLP metrics and traces (metrics with exemplars through phasetrace's own exporter).
    OtlpBoth,
    /// OTLP metrics only (the SDK's exporter).
    OtlpMetrics,
    /// The Prometheus endpoint and console spans.
    PrometheusAndConsole,
}

fn case(endpoint: &str, protocol: Protocol, exporters: Exporters) {
    let b = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .with_shutdown_timeout(Duration::from_secs(2))
        .with_otlp_timeout(Duration::from_millis(500));
    let b = match exporters {
        Exporters::OtlpBoth => b
            .without_prometheus()
            .with_otlp_endpoint(Some(endpoint))
            .with_otlp_protocol(protocol),
        Exporters::OtlpMetrics => b
            .without_prometheus()
            .with_otlp_endpoint(Some(endpoint))
            .with_otlp_protocol(protocol)
            .with_traces_exporter(TracesExporter::None),
        Exporters::PrometheusAndConsole => b
            .with_prometheus_at(([127, 0, 0, 1], 0))
            .with_traces_exporter(TracesExporter::Console),
    };
    let profiler = b
        .build()
        .unwrap_or_else(|e| panic!("{protocol:?} {exporters:?}: {e}"));
    let rec = profiler.recorder();
    for _ in 0..3 {
        let _step = rec.step();
        let _s = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
    }
    drop(rec);
    profiler.flush();
    assert_eq!(profiler.stats().steps, 3, "{protocol:?} {exporters:?}");
    profiler.shutdown();
    assert_eq!(profiler.stats().steps, 3);
}

/// Every case, with the endpoint of `protocol`.
fn every_case(grpc: &str, http: &str) {
    for (protocol, endpoint) in [(Protocol::Grpc, grpc), (Protocol::HttpProtobuf, http)] {
        for exporters in [
            Exporters::OtlpBoth,
            Exporters::OtlpMetrics,
            Exporters::PrometheusAndConsole,
        ] {
            case(endpoint, protocol, exporters);
        }
    }
}

/// A collector's gRPC and HTTP endpoints, and the process that keeps them (if any).
fn endpoints() -> (Option<support::Rotel>, String, String) {
    if support::Tool::Rotel.find().is_some() {
        let r = support::Rotel::start();
        let (g, h) = (r.grpc_endpoint(), r.http_endpoint());
        (Some(r), g, h)
    } else {
        let closed = format!("http://127.0.0.1:{}", support::free_port());
        (None, closed.clone(), closed)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_exporter_builds_flushes_and_shuts_down_on_a_current_thread_runtime() {
    let (_rotel, grpc, http) = endpoints();
    every_case(&grpc, &http);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exporter_builds_flushes_and_shuts_down_on_a_multi_thread_runtime() {
    let (_rotel, grpc, http) = endpoints();
    every_case(&grpc, &http);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profiler_dropped_inside_a_spawned_task_shuts_down_without_a_panic() {
    let (_rotel, _grpc, http) = endpoints();
    tokio::spawn(async move {
        let profiler = Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .without_prometheus()
            .with_otlp_endpoint(Some(&http))
            .with_otlp_protocol(Protocol::HttpProtobuf)
            .with_shutdown_timeout(Duration::from_secs(2))
            .build()
            .expect("build inside a task");
        let rec = profiler.recorder();
        let _step = rec.step();
        drop(_step);
        drop(rec);
        drop(profiler); // the last clone: shuts down here
    })
    .await
    .expect("the task ran to its end");
}
