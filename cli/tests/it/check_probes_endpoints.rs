//! `phasetrace check` prints the resolved configuration with the origin of every value (env,
//! default, flag), then probes the endpoints: a dead endpoint or a peer that does not speak the
//! configured protocol fails with exit 4; a real collector (rotel) passes over gRPC and HTTP.

use crate::cli;
use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use cli::{Finished, phasetrace};
use support::{Rotel, StaticHttpServer, TempDir, TlsProxy, certificates};

const RUN: Duration = Duration::from_secs(30);

/// A loopback port nobody listens on (bound, then released).
fn dead_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `(value, origin)` of a configuration row `check` printed.
fn row<'a>(run: &'a Finished, var: &str) -> (&'a str, &'a str) {
    let line = run
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(var))
        .unwrap_or_else(|| panic!("no {var} row: {run}"));
    let rest = line.trim_start()[var.len()..].trim();
    let (value, origin) = rest
        .rsplit_once(" (")
        .map(|(v, o)| (v.trim(), o.trim_end_matches(')')))
        .or_else(|| {
            rest.strip_prefix('(')
                .map(|o| ("", o.trim_end_matches(')')))
        })
        .unwrap_or_else(|| panic!("no origin on {line:?}"));
    (value, origin)
}

#[test]
fn a_dead_endpoint_fails_with_exit_4_and_says_it_is_unreachable() {
    for protocol in ["grpc", "http/protobuf"] {
        let endpoint = format!("http://127.0.0.1:{}", dead_port());
        let run = phasetrace(
            &["check", "--timeout-ms", "500"],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ],
            RUN,
        );
        assert_eq!(run.code, Some(4), "{protocol}: {run}");
        assert!(
            run.stdout
                .contains(&format!("FAIL  OTLP {protocol}: {endpoint} is unreachable")),
            "{run}"
        );
        assert!(
            run.stderr.contains(&format!(
                "phasetrace: check failed: {endpoint} is unreachable"
            )),
            "{run}"
        );
        assert!(!run.stdout.contains("all checks passed"), "{run}");
        assert_eq!(row(&run, "OTEL_EXPORTER_OTLP_PROTOCOL"), (protocol, "env"));
    }
}

#[test]
fn a_live_collector_passes_over_grpc_and_http() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let cases = [
        ("grpc", rotel.grpc_endpoint(), "gRPC (HTTP/2) endpoint at"),
        (
            "http/protobuf",
            rotel.http_endpoint(),
            "OTLP/HTTP POST /v1/metrics to",
        ),
    ];
    for (protocol, endpoint, probe) in &cases {
        // The variables, and the equivalent flags.
        let by_env = phasetrace(
            &["check"],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ],
            RUN,
        );
        let by_flag = phasetrace(
            &[
                "check",
                "--otlp-endpoint",
                endpoint,
                "--otlp-protocol",
                protocol,
            ],
            &[],
            RUN,
        );
        for (run, origin) in [(by_env, "env"), (by_flag, "flag")] {
            assert_eq!(run.code, Some(0), "{protocol} by {origin}: {run}");
            assert!(
                run.stdout
                    .contains(&format!("ok    OTLP {protocol}: {probe}")),
                "{run}"
            );
            assert!(
                run.stdout.trim_end().ends_with("all checks passed"),
                "{run}"
            );
            assert_eq!(
                row(&run, "OTEL_EXPORTER_OTLP_ENDPOINT"),
                (endpoint.as_str(), origin)
            );
            assert_eq!(
                row(&run, "OTEL_EXPORTER_OTLP_PROTOCOL"),
                (*protocol, origin)
            );
            // An OTLP endpoint turns the embedded Prometheus endpoint off by default.
            assert_eq!(row(&run, "PHASETRACE_PROMETHEUS"), ("off", "default"));
            assert!(run.stdout.contains("-     Prometheus: off"), "{run}");
            assert_eq!(row(&run, "OTEL_TRACES_EXPORTER"), ("otlp", "default"));
            assert_eq!(row(&run, "OTEL_METRICS_EXPORTER"), ("otlp", "default"));
        }
    }

    // The HTTP probe against the gRPC port: it answers, but not as OTLP/HTTP.
    let run = phasetrace(
        &["check", "--timeout-ms", "1000"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &rotel.grpc_endpoint()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ],
        RUN,
    );
    assert_eq!(run.code, Some(4), "{run}");
    assert!(run.stdout.contains("FAIL  OTLP http/protobuf: "), "{run}");
}

#[test]
fn a_peer_speaking_the_wrong_protocol_fails() {
    // A plain HTTP/1.1 server is not a gRPC endpoint.
    let http1 = StaticHttpServer::start("hello", "text/plain");
    let run = phasetrace(
        &["check", "--timeout-ms", "1000"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &http1.url())],
        RUN,
    );
    assert_eq!(run.code, Some(4), "{run}");
    assert!(
        run.stdout
            .contains("answered, but not with HTTP/2 SETTINGS: is this an OTLP/gRPC endpoint?"),
        "{run}"
    );

    // An HTTP server that has no /v1/metrics is not an OTLP/HTTP endpoint.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let _ = conn
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        String::from_utf8_lossy(&head).into_owned()
    });
    let run = phasetrace(
        &["check", "--timeout-ms", "2000"],
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                &format!("http://127.0.0.1:{port}/otlp/"),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ],
        RUN,
    );
    let request = server.join().unwrap();
    assert!(
        request.starts_with("POST /otlp/v1/metrics HTTP/1.1\r\n"),
        "the probe posts under the endpoint's path: {request:?}"
    );
    assert!(
        request.contains("Content-Type: application/x-protobuf"),
        "{request:?}"
    );
    assert_eq!(run.code, Some(4), "{run}");
    assert!(
        run.stdout
            .contains("POST /otlp/v1/metrics answered 404: is this an OTLP/HTTP endpoint?"),
        "{run}"
    );
}

#[test]
fn origins_say_whether_a_value_came_from_the_environment_a_flag_or_the_default() {
    let run = phasetrace(
        &[
            "check",
            "--trace-every",
            "5",
            "--prometheus",
            "127.0.0.1:0",
            "--group",
            "tp1",
        ],
        &[
            ("PHASETRACE_LEVEL", "full"),
            ("PHASETRACE_QUEUE", "4096"),
            ("PHASETRACE_TRACE_EVERY", "7"),
            ("OTEL_SERVICE_NAME", "checked"),
            ("LOCAL_RANK", "3"),
        ],
        RUN,
    );
    assert_eq!(run.code, Some(0), "{run}");
    assert_eq!(row(&run, "PHASETRACE_LEVEL"), ("full", "env"));
    assert_eq!(row(&run, "PHASETRACE_QUEUE"), ("4096", "env"));
    // The flag beats the variable.
    assert_eq!(row(&run, "PHASETRACE_TRACE_EVERY"), ("5", "flag"));
    assert_eq!(row(&run, "PHASETRACE_PROMETHEUS"), ("127.0.0.1:0", "flag"));
    assert_eq!(row(&run, "OTEL_SERVICE_NAME"), ("checked", "env"));
    // A launcher's rank variable counts as the environment.
    assert_eq!(row(&run, "PHASETRACE_RANK"), ("3", "env"));
    assert_eq!(row(&run, "PHASETRACE_GROUP"), ("tp1", "flag"));
    assert_eq!(row(&run, "PHASETRACE_SPEC_LEVEL"), ("off", "default"));
    assert_eq!(row(&run, "PHASETRACE_TIMING"), ("host", "default"));
    assert_eq!(
        row(&run, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ("(none)", "default")
    );
    assert_eq!(
        row(&run, "OTEL_METRICS_EXPORTER"),
        ("prometheus", "default")
    );
    assert!(
        run.stdout.contains("-     OTLP: no endpoint configured"),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("ok    Prometheus: http://127.0.0.1:0/metrics would serve as configured (no TLS, no basic auth): GET /metrics answered 200"),
        "{run}"
    );
    assert!(
        run.stdout.trim_end().ends_with("all checks passed"),
        "{run}"
    );
}

/// A web configuration file for a generated certificate, with one bcrypt user; `client_auth`
/// is its `client_auth_type`.
fn web_config(dir: &std::path::Path, client_auth: &str, hash: &str) -> std::path::PathBuf {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
    let path = dir.join(format!("web-{client_auth}.yml"));
    let ca_line = if client_auth == "NoClientCert" {
        String::new()
    } else {
        "  client_ca_file: ca.pem\n".to_owned()
    };
    std::fs::write(
        &path,
        format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: {client_auth}\n{ca_line}basic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn check_probes_the_prometheus_endpoint_with_its_tls_and_basic_auth() {
    let dir = support::TempDir::new("phasetrace-check-web");
    let hash = bcrypt::hash("s3cret-pw", 4).unwrap();
    for (auth, expect) in [
        (
            "RequireAndVerifyClientCert",
            "a client without a certificate is refused",
        ),
        (
            "NoClientCert",
            "a scrape without credentials is refused with 401",
        ),
    ] {
        let web = web_config(dir.path(), auth, &hash);
        let web_s = web.display().to_string();
        let run = phasetrace(
            &[
                "check",
                "--prometheus",
                "127.0.0.1:0",
                "--prometheus-web-config",
                &web_s,
            ],
            &[],
            RUN,
        );
        assert_eq!(run.code, Some(0), "{auth}: {run}");
        assert_eq!(
            row(&run, "PHASETRACE_PROMETHEUS_WEB_CONFIG"),
            (web_s.as_str(), "flag")
        );
        let line = format!(
            "ok    Prometheus: https://127.0.0.1:0/metrics would serve as configured (TLS (at least TLS12, client certificates: {auth}), basic auth (1 user(s))): {expect}"
        );
        assert!(run.stdout.contains(&line), "{auth}: {run}");
        assert!(!run.stdout.contains(&hash) && !run.stderr.contains(&hash));
        assert!(!run.stdout.contains("prometheus:"), "no user names: {run}");
    }

    // An invalid file fails the check, naming the file and the field.
    let bad = dir.path().join("bad.yml");
    std::fs::write(
        &bad,
        format!("tls_server_config:\n  cert_file: server.pem\nbasic_auth_users:\n  prometheus: '{hash}'\n"),
    )
    .unwrap();
    let run = phasetrace(
        &["check", "--prometheus", "127.0.0.1:0"],
        &[(
            "PHASETRACE_PROMETHEUS_WEB_CONFIG",
            &bad.display().to_string(),
        )],
        RUN,
    );
    assert_eq!(run.code, Some(4), "{run}");
    assert!(
        run.stdout.contains(&format!(
            "FAIL  Prometheus: PHASETRACE_PROMETHEUS_WEB_CONFIG={}: tls_server_config.key_file: missing",
            bad.display()
        )),
        "{run}"
    );
    assert!(!run.stdout.contains(&hash) && !run.stderr.contains(&hash));
}

/// `check` completes the TLS handshake with an OTLP endpoint behind TLS only when
/// `OTEL_EXPORTER_OTLP_CERTIFICATE` names the CA that signed its certificate.
#[test]
fn the_probe_completes_a_tls_handshake_only_with_the_right_ca() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let (ca, cert, key) = certificates();
    let dir = TempDir::new("phasetrace-tls-probe");
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, ca).expect("write ca");
    let ca_path = ca_path.display().to_string();
    for (upstream, protocol) in [
        (rotel.grpc_port(), "grpc"),
        (rotel.http_port(), "http/protobuf"),
    ] {
        let proxy = TlsProxy::start(upstream, &cert, &key);
        let endpoint = format!("https://localhost:{}", proxy.port);
        let check = |ca: Option<&str>| {
            let mut env = vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ];
            env.extend(ca.map(|ca| ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca)));
            phasetrace(&["check", "--timeout-ms", "5000"], &env, RUN)
        };
        let ok = check(Some(&ca_path));
        assert_eq!(ok.code, Some(0), "{protocol} with the CA: {ok}");
        let line = ok
            .stdout
            .lines()
            .find(|l| l.contains(&format!("OTLP {protocol}:")))
            .unwrap_or_else(|| panic!("no OTLP probe line: {ok}"));
        assert!(line.contains("ok") && line.contains("over TLS"), "{ok}");
        let err = check(None);
        assert_eq!(err.code, Some(4), "{protocol} without the CA: {err}");
        assert!(
            err.stdout.contains(&format!("FAIL  OTLP {protocol}: "))
                && err.stdout.contains("TLS handshake"),
            "{err}"
        );
    }
}
