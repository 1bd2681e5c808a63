//! The endpoint behind an exporter-toolkit web configuration file: a real Prometheus scrapes it
//! over TLS with a client certificate and basic auth (`up == 1`); a wrong password gets 401; a
//! client without the required certificate is refused; a bad file is an error at `build()`
//! naming the file and the field, never echoing a credential.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use phasetrace::{Profiler, Section, SectionLevel, Site};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use support::{Prometheus, TempDir};

const PASSWORD: &str = "correct horse battery staple";

/// Writes a CA, a server certificate for 127.0.0.1 / localhost and a client certificate, all in
/// `dir`: `ca.pem`, `server.pem`, `server.key`, `client.pem`, `client.key`.
pub(crate) fn certificates(dir: &Path) {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let server_key = KeyPair::generate().expect("server key");
    let server = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("params")
        .signed_by(&server_key, &issuer)
        .expect("server cert");
    let client_key = KeyPair::generate().expect("client key");
    let client = CertificateParams::new(vec!["prometheus".into()])
        .expect("params")
        .signed_by(&client_key, &issuer)
        .expect("client cert");
    for (name, text) in [
        ("ca.pem", ca_cert.pem()),
        ("server.pem", server.pem()),
        ("server.key", server_key.serialize_pem()),
        ("client.pem", client.pem()),
        ("client.key", client_key.serialize_pem()),
    ] {
        std::fs::write(dir.join(name), text).expect("write pem");
    }
}

fn web_config(dir: &Path) -> PathBuf {
    let hash = bcrypt::hash(PASSWORD, 4).expect("bcrypt");
    let path = dir.join("web.yml");
    std::fs::write(
        &path,
        format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  min_version: TLS12\nbasic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )
    .expect("write web.yml");
    path
}

/// What a `GET /metrics` over TLS answered: status, body and the server's certificate (DER).
#[derive(Debug)]
pub(crate) struct TlsAnswer {
    pub(crate) status: u16,
    pub(crate) body: String,
    pub(crate) server_cert: Vec<u8>,
}

/// `GET /metrics` over a new TLS connection trusting `ca` only, with the client certificate of
/// `client` (a folder of [`certificates`]) when given, and `user:password` basic auth when
/// given: the answer, or why it failed.
pub(crate) fn tls_request(
    addr: SocketAddr,
    ca: &Path,
    client: Option<&Path>,
    auth: Option<(&str, &str)>,
) -> Result<TlsAnswer, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let cfg = if let Some(dir) = client {
        let certs = CertificateDer::pem_file_iter(dir.join("client.pem"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(dir.join("client.key")).unwrap();
        b.with_client_auth_cert(certs, key).unwrap()
    } else {
        b.with_no_client_auth()
    };
    let conn = rustls::ClientConnection::new(
        Arc::new(cfg),
        ServerName::try_from("localhost".to_owned()).unwrap(),
    )
    .map_err(|e| e.to_string())?;
    let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let authz = auth.map_or(String::new(), |(u, p)| {
        format!("Authorization: Basic {}\r\n", base64(&format!("{u}:{p}")))
    });
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{authz}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let server_cert = s
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let (status, body) = support::process::parse_http_response(&raw)?;
    Ok(TlsAnswer {
        status,
        body,
        server_cert,
    })
}

/// [`tls_request`] trusting `dir/ca.pem`, with `dir`'s client certificate when `client_cert`:
/// the status.
fn tls_get(
    addr: SocketAddr,
    dir: &Path,
    client_cert: bool,
    auth: Option<(&str, &str)>,
) -> Result<u16, String> {
    tls_request(addr, &dir.join("ca.pem"), client_cert.then_some(dir), auth).map(|a| a.status)
}

pub(crate) fn base64(s: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub(crate) fn job(name: &str, addr: SocketAddr, dir: &Path, password: &str) -> String {
    format!(
        "job_name: {name}\nscheme: https\nscrape_interval: 1s\nscrape_timeout: 1s\ntls_config:\n  ca_file: {ca}\n  cert_file: {cert}\n  key_file: {key}\n  server_name: localhost\nbasic_auth:\n  username: prometheus\n  password: '{password}'\nstatic_configs:\n  - targets: ['{addr}']",
        ca = dir.join("ca.pem").display(),
        cert = dir.join("client.pem").display(),
        key = dir.join("client.key").display(),
    )
}

#[test]
fn a_real_prometheus_scrapes_over_tls_with_basic_auth_and_others_are_refused() {
    support::require_tools!(Prometheus);
    let dir = TempDir::new("phasetrace-web-config");
    certificates(dir.path());
    let web = web_config(dir.path());
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_prometheus_web_config(&web)
        .build()
        .expect("profiler with TLS and basic auth");
    let rec = p.recorder();
    for _ in 0..3 {
        let _step = rec.step();
        let _s = rec.section(Section::MOE_EXPERTS, 1u32, Site::MLP);
    }
    p.flush();
    let addr = p.prometheus_addr().expect("endpoint");
    assert_eq!(
        p.prometheus_url().as_deref(),
        Some(format!("https://{addr}/metrics").as_str()),
        "the URL says TLS"
    );

    assert_eq!(
        tls_get(addr, dir.path(), true, Some(("prometheus", PASSWORD))),
        Ok(200)
    );
    assert_eq!(
        tls_get(addr, dir.path(), true, Some(("prometheus", "wrong"))),
        Ok(401)
    );
    assert_eq!(
        tls_get(addr, dir.path(), true, Some(("nobody", PASSWORD))),
        Ok(401)
    );
    assert_eq!(tls_get(addr, dir.path(), true, None), Ok(401));
    let no_cert = tls_get(addr, dir.path(), false, Some(("prometheus", PASSWORD)));
    assert!(
        no_cert.is_err(),
        "a client without a certificate got {no_cert:?}"
    );
    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = Vec::new();
    let _ = plain.read_to_end(&mut buf);
    assert!(!String::from_utf8_lossy(&buf).contains("phasetrace_"));

    let prometheus = Prometheus::builder()
        .raw_job(&job("tls-ok", addr, dir.path(), PASSWORD))
        .raw_job(&job("tls-wrong-password", addr, dir.path(), "wrong"))
        .start();
    prometheus.wait_for_query(
        "up",
        |s| {
            s.iter()
                .any(|(l, v)| l.get("job").map(String::as_str) == Some("tls-ok") && *v == 1.0)
                && s.iter().any(|(l, v)| {
                    l.get("job").map(String::as_str) == Some("tls-wrong-password") && *v == 0.0
                })
        },
        Duration::from_secs(30),
    );
    prometheus.wait_for_query(
        "phasetrace_steps_total{job=\"tls-ok\"}",
        |s| s.iter().any(|(_, v)| *v == 3.0),
        Duration::from_secs(30),
    );
    let targets = prometheus.targets().to_string();
    assert!(
        targets.contains("401"),
        "the wrong password's scrape error: {targets}"
    );
    let log = prometheus.output();
    assert!(!log.contains(PASSWORD));
    p.shutdown();
}

#[test]
fn a_bad_web_config_is_an_error_at_build_naming_the_file_and_the_field() {
    let dir = TempDir::new("phasetrace-web-config-bad");
    certificates(dir.path());
    let secret_hash = bcrypt::hash(PASSWORD, 4).unwrap();
    let cases: &[(&str, String, &str)] = &[
        (
            "missing-key.yml",
            "tls_server_config:\n  cert_file: server.pem\n  key_file: nowhere.key\n".into(),
            "tls_server_config.key_file",
        ),
        (
            "bad-auth-type.yml",
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: Sometimes\n".into(),
            "tls_server_config.client_auth_type",
        ),
        (
            "ca-without-auth.yml",
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_ca_file: ca.pem\n".into(),
            "tls_server_config.client_ca_file",
        ),
        (
            "old-tls.yml",
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  min_version: TLS10\n".into(),
            "tls_server_config.min_version",
        ),
        (
            "bad-hash.yml",
            format!("basic_auth_users:\n  prometheus: '{secret_hash}x'\n"),
            "basic_auth_users (entry 1)",
        ),
        (
            "key-for-cert.yml",
            "tls_server_config:\n  cert_file: server.pem\n  key_file: client.key\n".into(),
            "tls_server_config.key_file",
        ),
    ];
    for (name, text, field) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        // Off: nothing starts, yet the file is checked.
        let err = Profiler::builder()
            .without_env()
            .with_prometheus_at(([127, 0, 0, 1], 0))
            .with_prometheus_web_config(&path)
            .build()
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&path.display().to_string()), "{name}: {err}");
        assert!(err.contains(&format!(": {field}: ")), "{name}: {err}");
        assert!(!err.contains(&secret_hash), "{name}: {err}");
    }
    let missing = dir.path().join("absent.yml");
    let err = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_prometheus_web_config(&missing)
        .build()
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "PHASETRACE_PROMETHEUS_WEB_CONFIG={}: cannot read",
            missing.display()
        )),
        "{err}"
    );
}
