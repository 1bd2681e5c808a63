//! API keys in `OTEL_EXPORTER_OTLP_HEADERS` never appear in what phasetrace or the OpenTelemetry
//! SDK log: every `tracing` event at every level, emitted while a profiler with a secret header
//! is built, exports to a real collector, fails to export to a dead one and shuts down, is
//! captured and searched for the secret. Each run first proves the path it names was taken:
//! spans delivered, or exports failed, counted as `span_export` drops, with the connection
//! errors for that endpoint among the captured events.

use crate::support;

use phasetrace::{DropReason, Profiler, Protocol, Section, SectionLevel, Site};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::Rotel;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

const SECRET: &str = "sk-live-9f8e7d6c5b4a";

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<String>>);

struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut line = format!("{} {}", event.metadata().level(), event.metadata().target());
        event.record(&mut Fields(&mut line));
        line.push('\n');
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_str(&line);
    }
}

/// Which path an export run must prove it took.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// A live collector: every span is exported.
    Delivered,
    /// A dead endpoint: exports fail, and the lost spans are counted as `span_export` drops.
    Failed,
}

/// Logs captured so far.
fn logged(capture: &Capture) -> String {
    capture.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

fn run(capture: &Capture, endpoint: &str, protocol: Protocol, path: Path) {
    let before = logged(capture).len();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .without_prometheus()
        .with_otlp_endpoint(Some(endpoint))
        .with_otlp_protocol(protocol)
        .with_otlp_headers(vec![("x-api-key".into(), SECRET.into())])
        .with_metric_export_interval(Duration::from_millis(200))
        .with_shutdown_timeout(Duration::from_secs(2))
        .build()
        .expect("profiler");
    assert!(!format!("{p:?}").contains(SECRET), "Debug of the profiler");
    let rec = p.recorder();
    for _ in 0..3 {
        let _s = rec.step();
        let _k = rec.section(Section::NORM, 0u32, Site::NONE);
    }
    drop(rec);
    // Poll until the export has visibly gone the expected way: delivered, or failed and
    // counted. A failure that was not counted, or a delivery to a dead endpoint, times out.
    let deadline = Instant::now() + Duration::from_secs(30);
    let reached = |s: &phasetrace::Stats| match path {
        Path::Delivered => s.spans > 0 && s.spans_exported == s.spans,
        Path::Failed => s.spans_failed > 0 && s.dropped[DropReason::SpanExport] == s.spans_failed,
    };
    loop {
        p.flush();
        let s = p.stats();
        if reached(&s) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{path:?} export to {endpoint} ({protocol:?}) never showed: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    p.shutdown();
    if path == Path::Failed {
        // The failing export path logged its connection error for this run's endpoint (a port
        // no other test uses), and those events are part of what the secret is searched in.
        let addr = endpoint.trim_start_matches("http://");
        let logs = logged(capture);
        assert!(
            logs[before..]
                .lines()
                .any(|l| l.contains("connect error") && l.contains(addr)),
            "no connect error for {addr} was logged while exports to it ({protocol:?}) failed"
        );
    }
}

#[test]
fn no_log_line_carries_the_header_value() {
    support::require_tools!(Rotel);
    let capture = Capture::default();
    // Global: the SDK logs from its own export threads. No other test of this binary sets a
    // global subscriber; what other tests log while this one runs is searched too.
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone()))
        .expect("first subscriber");
    let rotel = Rotel::start();
    let dead = format!("http://127.0.0.1:{}", support::free_port());
    run(
        &capture,
        &rotel.grpc_endpoint(),
        Protocol::Grpc,
        Path::Delivered,
    );
    run(
        &capture,
        &rotel.http_endpoint(),
        Protocol::HttpProtobuf,
        Path::Delivered,
    );
    run(&capture, &dead, Protocol::Grpc, Path::Failed);
    run(&capture, &dead, Protocol::HttpProtobuf, Path::Failed);
    rotel.wait_for(
        |o| o.spans_named("decode.step").len() >= 6,
        Duration::from_secs(20),
    );
    let logs = logged(&capture);
    assert!(!logs.contains(SECRET), "secret in the logs:\n{logs}");
}
