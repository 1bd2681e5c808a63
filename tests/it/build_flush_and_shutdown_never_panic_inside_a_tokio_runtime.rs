//! `build()`, `flush()` and `shutdown()` called from async code: inside a Tokio runtime of
//! either flavour, with OTLP over gRPC and over HTTP/protobuf (the SDK's metrics exporter and
//! phasetrace's own with exemplars), the Prometheus endpoint and console spans, nothing panics
//! ("Cannot drop a runtime in a context where blocking is not allowed" was the blocking HTTP
//! client's) and what was recorded is seen, both in the profiler's stats and at the endpoints:
//! in-process OTLP receivers (one gRPC, one HTTP, their own threads and runtimes) decode the spans
//! and metrics each transport sent.

use crate::support;
use support::OtlpReceiver;

use std::time::Duration;

use phasetrace::config::{Exporter, ExporterSet};
use phasetrace::{Profiler, Protocol, Section, SectionLevel, Site};
use phasetrace_names::{metric, span};

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
            .with_traces_exporter(ExporterSet::NONE),
        Exporters::PrometheusAndConsole => b
            .with_prometheus_at(([127, 0, 0, 1], 0))
            .with_traces_exporter(ExporterSet::of(&[Exporter::Console])),
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

/// A gRPC and an HTTP receiver.
fn endpoints() -> (OtlpReceiver, OtlpReceiver) {
    (OtlpReceiver::start_grpc(), OtlpReceiver::start())
}

/// Both receivers decoded step spans and the step-duration metric: each transport delivered.
/// `flush()` returned before this, so a short wait covers only the receiver's own thread.
fn both_delivered(grpc: &OtlpReceiver, http: &OtlpReceiver) {
    for (name, receiver) in [("gRPC", grpc), ("HTTP", http)] {
        let seen = receiver.wait_for(Duration::from_secs(5), |r| {
            let step = r.spans().iter().any(|s| s.name == span::STEP);
            let duration = r
                .metrics()
                .iter()
                .flat_map(|m| &m.resource_metrics)
                .flat_map(|rm| &rm.scope_metrics)
                .flat_map(|sm| &sm.metrics)
                .any(|m| m.name == metric::STEP_DURATION);
            (step && duration).then_some(())
        });
        assert!(
            seen.is_some(),
            "{name}: spans {:?}, metrics {} requests, refused {:?}",
            receiver.spans().iter().map(|s| &s.name).collect::<Vec<_>>(),
            receiver.metrics().len(),
            receiver.refused()
        );
        assert!(
            receiver.refused().is_empty(),
            "{name}: {:?}",
            receiver.refused()
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_exporter_builds_flushes_and_shuts_down_on_a_current_thread_runtime() {
    let (grpc, http) = endpoints();
    every_case(&grpc.endpoint(), &http.endpoint());
    both_delivered(&grpc, &http);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exporter_builds_flushes_and_shuts_down_on_a_multi_thread_runtime() {
    let (grpc, http) = endpoints();
    every_case(&grpc.endpoint(), &http.endpoint());
    both_delivered(&grpc, &http);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profiler_dropped_inside_a_spawned_task_shuts_down_without_a_panic() {
    let (_grpc, receiver) = endpoints();
    let http = receiver.endpoint();
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
