//! Test support shared by the integration tests (`phasetrace_testkit as support`): the real peer processes
//! that `scripts/install-tools.sh` installs, driven from Rust.
//!
//! - [`Rotel`]: an OTLP collector (gRPC + HTTP) whose debug output [`otlp_debug`] parses
//!   into [`ReceivedSpan`]s and [`ReceivedMetric`]s.
//! - [`OtlpReceiver`]: an in-process OTLP receiver (HTTP or gRPC) that decodes what it is sent
//!   into `opentelemetry-proto` messages (re-exported as [`opentelemetry_proto`]), for the tests
//!   whose subject is not the collector.
//! - [`Prometheus`]: a Prometheus 3 server scraping given targets, with PromQL queries.
//! - [`Otelcol`]: the OpenTelemetry Collector built from tools/otelcol, running the bundled
//!   `otel-config/collector.yaml`; [`Jaeger`]: Jaeger v2 running `otel-config/jaeger.yaml`,
//!   queried through its API v3.
//! - [`free_port`], [`http_get`], [`TempDir`] and other small helpers in [`process`].
//! - [`TlsProxy`] and [`certificates`]: a collector behind TLS with a generated CA, in [`tls`].
//! - [`HostileCollector`]: a collector that answers OTLP badly (huge, endless, garbage,
//!   redirecting, flooding, a certificate for another name), in [`hostile`].
//! - [`require_tools!`]: skips a test whose tools are missing (fails it under CI), see [`tools`].
//!
//! Both integration test binaries (the library's and the CLI's) use it.
#![allow(dead_code, unused_imports)]

pub mod hostile;
pub mod jaeger;
pub mod otelcol;
pub mod otlp_debug;
pub mod otlp_receiver;
pub mod process;
pub mod prometheus;
pub mod rotel;
pub mod tls;
pub mod tools;

pub use hostile::{HostileCollector, HostileMode};
pub use jaeger::{Jaeger, JaegerSpan, bundled_jaeger_config, jaeger_binary};
/// The OTLP messages [`OtlpReceiver`] decodes into, at the version it was built with.
pub use opentelemetry_proto;
pub use otelcol::{Otelcol, bundled_collector_config, otelcol_binary};
pub use otlp_debug::{
    MetricKind, ParsedOutput, Point, ReceivedEvent, ReceivedExemplar, ReceivedLink, ReceivedMetric,
    ReceivedSpan, parse_output,
};
pub use otlp_receiver::OtlpReceiver;
pub use process::{
    CapturedChild, Peer, StaticHttpServer, TempDir, free_port, http_get, http_request,
    http_request_bytes, poll, port_accepts, repo_root, spawn_ready, start_on_free_ports, tools_dir,
    url_encode,
};
pub use prometheus::{
    Prometheus, PrometheusBuilder, bundled_rule_files, prometheus_binary, promtool_binary, samples,
};
pub use rotel::{Rotel, rotel_binary};
pub use tls::{TlsProxy, certificates};
pub use tools::Tool;
