//! API keys in `OTEL_EXPORTER_OTLP_HEADERS` never appear in what phasetrace or the OpenTelemetry
//! SDK log: every `tracing` event at every level, emitted while a profiler with a secret header
//! is built, exports to a real collector, fails to export to a dead one and shuts down, is
//! captured and searched for the secret.

use crate::support;

use phasetrace::{Level, Profiler, Protocol, Section, Site};
use std::sync::{Arc, Mutex};
use std::time::Duration;
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

fn run(endpoint: &str, protocol: Protocol) {
    let p = Profiler::builder()
        .without_env()
        .with_level(Level::Full)
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
    p.flush();
    std::thread::sleep(Duration::from_millis(500));
    p.shutdown();
}

#[test]
fn no_log_line_carries_the_header_value() {
    let capture = Capture::default();
    // Global: the SDK logs from its own export threads. The only test of this binary.
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone()))
        .expect("first subscriber");
    let rotel = Rotel::start();
    let dead = format!("http://127.0.0.1:{}", support::free_port());
    run(&rotel.grpc_endpoint(), Protocol::Grpc);
    run(&rotel.http_endpoint(), Protocol::HttpProtobuf);
    run(&dead, Protocol::Grpc);
    run(&dead, Protocol::HttpProtobuf);
    rotel.wait_for(
        |o| o.spans_named("decode.step").len() >= 6,
        Duration::from_secs(20),
    );
    let logs = capture.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        !logs.is_empty(),
        "the SDK logged nothing: the capture is not working"
    );
    assert!(!logs.contains(SECRET), "secret in the logs:\n{logs}");
}
