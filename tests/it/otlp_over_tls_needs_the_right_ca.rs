//! OTLP/gRPC over TLS: with `OTEL_EXPORTER_OTLP_CERTIFICATE` naming the CA that signed the
//! endpoint's certificate, spans reach the real collector behind a TLS endpoint started here
//! with a freshly generated certificate; without it, the handshake is refused and the lost spans
//! are counted.

use crate::support;

use phasetrace::{Profiler, Protocol, Section, SectionLevel, Site};
use std::time::Duration;
use support::{Rotel, TempDir, TlsProxy, certificates};

fn run(endpoint: &str, ca: Option<&std::path::Path>, protocol: Protocol) -> Profiler {
    let mut b = Profiler::builder()
        .with_otlp_protocol(protocol)
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .without_prometheus()
        .with_otlp_endpoint(Some(endpoint))
        .with_otlp_headers(vec![("x-api-key".into(), "topsecret".into())])
        .with_shutdown_timeout(Duration::from_secs(3));
    if let Some(ca) = ca {
        b = b.with_otlp_certificate(ca);
    }
    let p = b.build().expect("profiler");
    let rec = p.recorder();
    for _ in 0..3 {
        let _s = rec.step();
        let _k = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
    }
    drop(rec);
    p.flush();
    p
}

#[test]
fn spans_cross_tls_with_the_custom_ca_and_are_refused_without_it() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let (ca, cert, key) = certificates();
    let dir = TempDir::new("phasetrace-tls");
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, ca).expect("write ca");
    let proxy = TlsProxy::start(rotel.grpc_port(), &cert, &key);
    let endpoint = format!("https://localhost:{}", proxy.port);

    let p = run(&endpoint, Some(&ca_path), Protocol::Grpc);
    rotel.wait_for(
        |o| o.spans_named("decode.step").len() == 3,
        Duration::from_secs(20),
    );
    p.shutdown();

    // Without the CA the server's certificate is not trusted: nothing arrives, the loss counts.
    rotel.clear_output();
    let p = run(&endpoint, None, Protocol::Grpc);
    let failed = support::poll(Duration::from_secs(20), || {
        p.flush();
        let s = p.stats();
        (s.spans_failed > 0).then_some(s.spans_failed)
    });
    assert!(
        failed.is_some(),
        "export to an untrusted endpoint must fail"
    );
    assert!(rotel.parsed().spans_named("decode.step").is_empty());
    p.shutdown();
}

#[test]
fn http_protobuf_crosses_tls_with_the_custom_ca() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let (ca, cert, key) = certificates();
    let dir = TempDir::new("phasetrace-tls-http");
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, ca).expect("write ca");
    let proxy = TlsProxy::start(rotel.http_port(), &cert, &key);
    let endpoint = format!("https://localhost:{}", proxy.port);
    let p = run(&endpoint, Some(&ca_path), Protocol::HttpProtobuf);
    rotel.wait_for(
        |o| o.spans_named("decode.step").len() == 3,
        Duration::from_secs(20),
    );
    p.shutdown();
}

#[test]
fn a_missing_ca_file_is_a_clear_error() {
    let err = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .with_otlp_endpoint(Some("https://localhost:4317"))
        .with_otlp_certificate("/nonexistent/ca.pem")
        .build()
        .expect_err("missing CA");
    let msg = err.to_string();
    assert!(
        msg.contains("OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/ca.pem"),
        "{msg}"
    );
}

/// A signal's own CA or headers variable, when it is the one set, is the one a bad value's
/// error names (not the general `OTEL_EXPORTER_OTLP_*` it overrides).
#[test]
fn errors_name_the_signals_own_variable_when_it_was_set() {
    let build = |vars: &[(&str, &str)]| {
        let mut b = Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .without_prometheus();
        for (var, value) in vars {
            b = b.with_text(var, value).expect("a known variable");
        }
        b.build().expect_err("a bad value").to_string()
    };
    let msg = build(&[
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://localhost:4317",
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "/nonexistent/traces-ca.pem",
        ),
    ]);
    assert!(
        msg.contains("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE=/nonexistent/traces-ca.pem"),
        "{msg}"
    );
    let msg = build(&[
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://localhost:4317",
        ),
        ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "ok=1"),
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-token-bin=s3cret"),
    ]);
    assert!(
        msg.contains("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=http://localhost:4317"),
        "{msg}"
    );
    assert!(
        msg.contains("OTEL_EXPORTER_OTLP_METRICS_HEADERS: header \"x-token-bin\""),
        "{msg}"
    );
    assert!(!msg.contains("s3cret"), "{msg}");
    // The metrics exporter over gRPC names its own CA variable too.
    let msg = build(&[
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "https://localhost:4317",
        ),
        ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"),
        (
            "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
            "/nonexistent/metrics-ca.pem",
        ),
    ]);
    assert!(
        msg.contains("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE=/nonexistent/metrics-ca.pem"),
        "{msg}"
    );
    // The general variables, when they are the ones set, are named as before.
    let msg = build(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://localhost:4317"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"),
    ]);
    assert!(
        msg.contains("OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/ca.pem"),
        "{msg}"
    );
}
