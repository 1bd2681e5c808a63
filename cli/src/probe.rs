//! Reachability probes, as `phasetrace check` runs them: of an OTLP endpoint (a TCP connect, for
//! `https://` a TLS handshake trusting the roots the exporters trust, then a protocol probe: an
//! HTTP/2 preface answered with SETTINGS for gRPC, an empty export POST answered 2xx for HTTP),
//! and of the Prometheus endpoint as configured (TLS, client certificates, basic auth), served
//! by a profiler built from the same settings.
//!
//! ```text
//! OtlpConfig ──connect──> TCP ──(https) TLS handshake──> gRPC preface / OTLP/HTTP POST ──> answer?
//! settings ──build(level off)──> web config checked ──free address? build(level on): serves it
//!          ──one scrape without certificate or credentials──> judged against the web config
//! ```
//!
//! Only the core's public API: the settings, `Profiler`, `Config`.

use phasetrace::config::{OtlpConfig, Protocol};
use phasetrace::{Config, HostSourceChoice, ProfilerBuilder, SectionLevel, SpecLevel, Timing};
use phasetrace_names::env;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Probes the OTLP endpoint; `Ok` says what answered, `Err` what failed (never a header value).
pub(crate) fn otlp(o: &OtlpConfig, timeout: Duration) -> Result<String, String> {
    let (tcp, addr) = connect(&o.endpoint, timeout)?;
    let _ = tcp.set_read_timeout(Some(timeout));
    let _ = tcp.set_write_timeout(Some(timeout));
    let mut stream: Box<dyn ReadWrite> = if o.endpoint.starts_with("https://") {
        Box::new(tls(o, tcp, addr)?)
    } else {
        Box::new(tcp)
    };
    let secure = if o.endpoint.starts_with("https://") {
        " over TLS"
    } else {
        ""
    };
    match o.protocol {
        Protocol::Grpc => probe_grpc(&o.endpoint, &mut stream, addr, secure),
        Protocol::HttpProtobuf => probe_http(&o.endpoint, &mut stream, addr, secure),
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Host and port of an `http(s)://host:port/...` endpoint, with the scheme's default port.
fn host_port(endpoint: &str) -> Option<(String, u16)> {
    let (rest, default) = if let Some(r) = endpoint.strip_prefix("https://") {
        (r, 443)
    } else {
        (endpoint.strip_prefix("http://")?, 80)
    };
    let authority = rest.split('/').next()?;
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            Some((h.trim_matches(['[', ']']).to_owned(), p.parse().ok()?))
        }
        _ => Some((authority.to_owned(), default)),
    }
}

fn connect(endpoint: &str, timeout: Duration) -> Result<(TcpStream, SocketAddr), String> {
    let (host, port) =
        host_port(endpoint).ok_or_else(|| format!("{endpoint}: cannot parse host and port"))?;
    let addrs: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("{endpoint}: cannot resolve {host}: {e}"))?
        .collect();
    let mut last = String::from("no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok((s, a)),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(format!("{endpoint} is unreachable ({last})"))
}

/// A TLS client connection over `tcp`, trusting the system roots and the configured CA.
fn tls(
    o: &OtlpConfig,
    tcp: TcpStream,
    addr: SocketAddr,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, String> {
    let (host, _) = host_port(&o.endpoint).unwrap_or_default();
    let mut cfg = phasetrace_transport::client_config(root_store(o)?).map_err(|e| e.to_string())?;
    cfg.alpn_protocols = match o.protocol {
        Protocol::Grpc => vec![b"h2".to_vec()],
        Protocol::HttpProtobuf => vec![b"http/1.1".to_vec()],
    };
    let name = rustls::pki_types::ServerName::try_from(host.clone())
        .map_err(|e| format!("{}: {host} is not a valid TLS server name: {e}", o.endpoint))?;
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name)
        .map_err(|e| format!("{}: TLS setup failed: {e}", o.endpoint))?;
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock).map_err(|e| {
            format!(
                "{}: TLS handshake with {addr} failed ({e}): is the server's certificate signed by a trusted CA (OTEL_EXPORTER_OTLP_CERTIFICATE)?",
                o.endpoint
            )
        })?;
    }
    Ok(stream)
}

/// The roots the OTLP exporters trust: the system's, plus `OTEL_EXPORTER_OTLP_CERTIFICATE` (read
/// by the transport the exporters use, so `check` trusts exactly what they trust).
fn root_store(o: &OtlpConfig) -> Result<rustls::RootCertStore, String> {
    phasetrace_transport::root_store(&o.target()).map_err(|e| e.to_string())
}

/// An OTLP/HTTP probe: an empty protobuf export request must be answered 2xx.
fn probe_http(
    endpoint: &str,
    s: &mut dyn ReadWrite,
    a: SocketAddr,
    secure: &str,
) -> Result<String, String> {
    let (host, port) = host_port(endpoint).unwrap_or_default();
    let base = endpoint
        .split_once("://")
        .and_then(|(_, r)| r.split_once('/').map(|(_, p)| p))
        .unwrap_or("")
        .trim_end_matches('/');
    let path = if base.is_empty() {
        "/v1/metrics".to_owned()
    } else {
        format!("/{base}/v1/metrics")
    };
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .and_then(|()| s.flush())
        .map_err(|e| format!("{endpoint}: write failed: {e}"))?;
    let mut buf = Vec::new();
    let _ = s.take(4096).read_to_end(&mut buf);
    let head = String::from_utf8_lossy(&buf);
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status.starts_with('2') {
        Ok(format!(
            "OTLP/HTTP POST {path} to {a}{secure} answered {status}"
        ))
    } else if status.is_empty() {
        Err(format!("{endpoint}: no HTTP answer from {a}"))
    } else {
        Err(format!(
            "{endpoint}: POST {path} answered {status}: is this an OTLP/HTTP endpoint?"
        ))
    }
}

/// An OTLP/gRPC probe: the server must speak HTTP/2 (it answers our connection preface with a
/// SETTINGS frame).
fn probe_grpc(
    endpoint: &str,
    s: &mut dyn ReadWrite,
    a: SocketAddr,
    secure: &str,
) -> Result<String, String> {
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // empty SETTINGS frame
    s.write_all(&preface)
        .and_then(|()| s.flush())
        .map_err(|e| format!("{endpoint}: write failed: {e}"))?;
    let mut head = [0u8; 9];
    match s.read_exact(&mut head) {
        Ok(()) if head[3] == 4 => Ok(format!("gRPC (HTTP/2) endpoint at {a}{secure} answered")),
        Ok(()) => Err(format!(
            "{endpoint}: {a} answered, but not with HTTP/2 SETTINGS: is this an OTLP/gRPC endpoint?"
        )),
        Err(e) => Err(format!("{endpoint}: no HTTP/2 answer from {a} ({e})")),
    }
}

/// Probes the Prometheus endpoint of `cfg` as configured. A profiler from `builder` (the
/// builder of `cfg`'s settings, called once per profiler), built with recording off, checks the
/// web configuration file (an error names the file and the field); when the address is free,
/// one built with recording on serves the endpoint there for the probe, otherwise what listens
/// there (a running engine) is probed; then a client without a certificate and without
/// credentials must be refused where the configuration says so (TLS handshake, 401), or
/// served. `Ok` says what answered, `Err` what failed (never a credential).
pub(crate) fn prometheus(
    cfg: &Config,
    builder: impl Fn() -> Result<ProfilerBuilder, String>,
    timeout: Duration,
) -> Result<String, String> {
    let Some(addr) = cfg.prometheus else {
        return Err("the Prometheus endpoint is off".to_owned());
    };
    // Only the endpoint: no OTLP, no spans, no console output, no stream to time, and the host
    // clock's own check is reported on its own line.
    let only_the_endpoint = |level: SectionLevel| {
        let b = builder()?
            .with_level(level)
            .with_spec_level(SpecLevel::Off)
            .with_otlp_endpoint(None)
            .with_timing(Timing::Host)
            .with_host_clock(HostSourceChoice::Auto)
            .with_summary_every(0)
            .with_spec_summary_every(0)
            .with_trace_every(0)
            .with_trace_slower_than(phasetrace::TraceSlowerThan::Off);
        b.with_text(env::OTEL_METRICS_EXPORTER, "prometheus")
            .and_then(|b| b.with_text(env::OTEL_TRACES_EXPORTER, "none"))
            .map_err(|e| e.to_string())
    };
    // Built off, a profiler starts nothing, and still reads the web configuration file.
    only_the_endpoint(SectionLevel::Off)?
        .build()
        .map_err(|e| e.to_string())?
        .shutdown();
    let web = cfg
        .prometheus_web_config
        .as_deref()
        .map(WebConfig::read)
        .transpose()?;
    let described = web
        .as_ref()
        .map_or_else(|| "no TLS, no basic auth".to_owned(), WebConfig::describe);
    let scheme = if web.as_ref().is_some_and(|w| w.tls.is_some()) {
        "https"
    } else {
        "http"
    };
    let free = std::net::TcpListener::bind(addr).is_ok();
    let (answer, where_) = if free {
        let profiler = only_the_endpoint(SectionLevel::Full)?
            .build()
            .map_err(|e| e.to_string())?;
        let r = match profiler.prometheus_addr() {
            Some(target) => probe_scrape(target, web.as_ref(), timeout),
            None => Err("the profiler serves no endpoint".to_owned()),
        };
        profiler.shutdown();
        (r, format!("{scheme}://{addr}/metrics would serve"))
    } else {
        (
            probe_scrape(addr, web.as_ref(), timeout),
            format!("{scheme}://{addr}/metrics is already served (a running engine?) and"),
        )
    };
    match answer {
        Ok(what) => Ok(format!("{where_} as configured ({described}): {what}")),
        Err(why) if free => Err(format!(
            "{}={addr}: the endpoint does not answer as configured ({described}): {why}",
            phasetrace_names::env::PROMETHEUS
        )),
        Err(why) => Err(format!(
            "{}={addr}: cannot listen there (in use), and what listens does not answer as configured ({described}): {why}",
            phasetrace_names::env::PROMETHEUS
        )),
    }
}

/// What the probe needs of a web configuration file that the core has accepted: whether it
/// turns TLS on (and asks for client certificates) and basic auth, and how `check` words it.
struct WebConfig {
    /// `(min_version, client_auth_type)` when TLS is on.
    tls: Option<(String, String)>,
    /// Basic-auth users, when any.
    users: Option<usize>,
}

impl WebConfig {
    /// The file's TLS and auth facts (the core checked it; the defaults are the core's).
    fn read(path: &std::path::Path) -> Result<WebConfig, String> {
        use serde_yaml_ng::Value;
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "{}={}: {e}",
                phasetrace_names::env::PROMETHEUS_WEB_CONFIG,
                path.display()
            )
        })?;
        let doc: Value = serde_yaml_ng::from_str(&text).map_err(|e| {
            format!(
                "{}={}: {e}",
                phasetrace_names::env::PROMETHEUS_WEB_CONFIG,
                path.display()
            )
        })?;
        let field = |v: &Value, k: &str, default: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_owned()
        };
        let tls = doc.get("tls_server_config").map(|t| {
            (
                field(t, "min_version", "TLS12"),
                field(t, "client_auth_type", "NoClientCert"),
            )
        });
        let users = doc
            .get("basic_auth_users")
            .and_then(Value::as_mapping)
            .map(|m| m.len());
        Ok(WebConfig { tls, users })
    }

    /// Whether a client without a certificate is refused.
    fn cert_required(&self) -> bool {
        self.tls.as_ref().is_some_and(|(_, auth)| {
            matches!(
                auth.as_str(),
                "RequireAnyClientCert" | "RequireAndVerifyClientCert"
            )
        })
    }

    /// What `check` says about it: never a user name, password or hash.
    fn describe(&self) -> String {
        let tls = match &self.tls {
            Some((min, auth)) => format!("TLS (at least {min}, client certificates: {auth})"),
            None => "no TLS".to_owned(),
        };
        let auth = match self.users {
            Some(n) => format!("basic auth ({n} user(s))"),
            None => "no basic auth".to_owned(),
        };
        format!("{tls}, {auth}")
    }
}

/// One scrape by a client without a certificate or credentials: what the endpoint did with it,
/// judged against `web`.
fn probe_scrape(
    addr: SocketAddr,
    web: Option<&WebConfig>,
    timeout: Duration,
) -> Result<String, String> {
    let tcp = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{addr}: {e}"))?;
    let _ = tcp.set_read_timeout(Some(timeout));
    let _ = tcp.set_write_timeout(Some(timeout));
    let tls = web.and_then(|w| w.tls.as_ref());
    let cert_required = web.is_some_and(WebConfig::cert_required);
    let mut stream: Box<dyn ReadWrite> = match tls {
        None => Box::new(tcp),
        Some(_) => {
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .dangerous()
                .with_custom_certificate_verifier(std::sync::Arc::new(AnyServer(provider)))
                .with_no_client_auth();
            let name = rustls::pki_types::ServerName::from(addr.ip());
            let conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name)
                .map_err(|e| e.to_string())?;
            let mut s = rustls::StreamOwned::new(conn, tcp);
            while s.conn.is_handshaking() {
                if let Err(e) = s.conn.complete_io(&mut s.sock) {
                    return if cert_required {
                        Ok(format!("a client without a certificate is refused ({e})"))
                    } else {
                        Err(format!("TLS handshake failed: {e}"))
                    };
                }
            }
            Box::new(s)
        }
    };
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let sent = stream
        .write_all(req.as_bytes())
        .and_then(|()| stream.flush());
    let mut buf = Vec::new();
    let read = sent.and_then(|()| stream.take(1 << 20).read_to_end(&mut buf));
    let head = String::from_utf8_lossy(&buf);
    let status = head.split_whitespace().nth(1).unwrap_or("").to_owned();
    let auth = web.is_some_and(|w| w.users.is_some());
    match (cert_required, auth, status.as_str()) {
        (true, _, "") => Ok(format!(
            "a client without a certificate is refused ({})",
            read.err()
                .map_or("connection closed".to_owned(), |e| e.to_string())
        )),
        (true, _, s) => Err(format!(
            "a client without a certificate was answered {s}, although client_auth_type requires one"
        )),
        (false, true, "401") => Ok("a scrape without credentials is refused with 401".to_owned()),
        (false, false, "200") => Ok(format!("GET /metrics answered 200 ({} bytes)", buf.len())),
        (_, _, "") => Err(format!(
            "no HTTP answer ({})",
            read.err()
                .map_or("connection closed".to_owned(), |e| e.to_string())
        )),
        (_, _, s) => Err(format!("GET /metrics without credentials answered {s}")),
    }
}

/// The probe's view of the server certificate: accepted as it is (the probe checks what the
/// endpoint does, not whom to trust), its handshake signature still checked.
#[derive(Debug)]
struct AnyServer(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn endpoints_split_into_host_and_port() {
        assert_eq!(
            host_port("http://127.0.0.1:4317"),
            Some(("127.0.0.1".into(), 4317))
        );
        assert_eq!(
            host_port("https://collector/otlp"),
            Some(("collector".into(), 443))
        );
        assert_eq!(host_port("http://[::1]:4318/"), Some(("::1".into(), 4318)));
    }
}
