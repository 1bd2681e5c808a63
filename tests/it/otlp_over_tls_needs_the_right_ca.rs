//! OTLP/gRPC over TLS: with `OTEL_EXPORTER_OTLP_CERTIFICATE` naming the CA that signed the
//! endpoint's certificate, spans reach the real collector behind a TLS endpoint started here
//! with a freshly generated certificate; without it, the handshake is refused and the lost spans
//! are counted.

use crate::support;

use phasetrace::{Level, Profiler, Protocol, Section, Site};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use std::sync::Arc;
use std::time::Duration;
use support::{Rotel, TempDir};

/// A TLS endpoint (ALPN h2 and http/1.1) on a free port that forwards the decrypted stream to `upstream`.
struct TlsProxy {
    port: u16,
    _rt: tokio::runtime::Runtime,
}

fn start_proxy(upstream: u16, cert_pem: &str, key_pem: &str) -> TlsProxy {
    let certs: Vec<rustls::pki_types::CertificateDer<'static>> = vec![pem_der(cert_pem).into()];
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(pem_der(key_pem).into());
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server certificate");
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    rt.spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(sock).await else {
                    return;
                };
                let Ok(mut up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    TlsProxy { port, _rt: rt }
}

fn pem_der(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    decode_base64(&body)
}

fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            _ => 63,
        }
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c) << (18 - 6 * i);
        }
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    out
}

/// A CA and a `localhost` server certificate signed by it: (ca pem, server cert pem, key pem).
fn certificates() -> (String, String, String) {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("server key");
    let params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    let cert = params.signed_by(&key, &issuer).expect("server cert");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

fn run(endpoint: &str, ca: Option<&std::path::Path>, protocol: Protocol) -> Profiler {
    let mut b = Profiler::builder()
        .with_otlp_protocol(protocol)
        .without_env()
        .with_level(Level::Full)
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
    let proxy = start_proxy(rotel.grpc_port(), &cert, &key);
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
    let proxy = start_proxy(rotel.http_port(), &cert, &key);
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
        .with_level(Level::Full)
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

#[test]
fn the_probe_completes_a_tls_handshake_only_with_the_right_ca() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let (ca, cert, key) = certificates();
    let dir = TempDir::new("phasetrace-tls-probe");
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, ca).expect("write ca");
    for (upstream, protocol) in [
        (rotel.grpc_port(), Protocol::Grpc),
        (rotel.http_port(), Protocol::HttpProtobuf),
    ] {
        let proxy = start_proxy(upstream, &cert, &key);
        let endpoint = format!("https://localhost:{}", proxy.port);
        let config = |ca: Option<&std::path::Path>| {
            let mut b = Profiler::builder()
                .without_env()
                .with_otlp_endpoint(Some(&endpoint))
                .with_otlp_protocol(protocol);
            if let Some(ca) = ca {
                b = b.with_otlp_certificate(ca);
            }
            b.config().expect("config").otlp.expect("otlp")
        };
        let ok = config(Some(&ca_path))
            .probe(Duration::from_secs(5))
            .expect("probe with the CA");
        assert!(ok.contains("over TLS"), "{ok}");
        let err = config(None)
            .probe(Duration::from_secs(5))
            .expect_err("no CA: the handshake fails");
        assert!(err.contains("TLS handshake"), "{err}");
    }
}
