//! Reachability probes of an OTLP endpoint, as `phasetrace check` runs them: a TCP connect, for
//! `https://` a TLS handshake trusting the same roots the exporters use, then a protocol probe (an
//! HTTP/2 preface answered with SETTINGS for gRPC; an empty export POST answered 2xx for HTTP).

use crate::config::{OtlpConfig, Protocol};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

impl OtlpConfig {
    /// Probes the endpoint; `Ok` says what answered, `Err` what failed (never a header value).
    pub fn probe(&self, timeout: Duration) -> Result<String, String> {
        let (tcp, addr) = connect(&self.endpoint, timeout)?;
        let _ = tcp.set_read_timeout(Some(timeout));
        let _ = tcp.set_write_timeout(Some(timeout));
        let mut stream: Box<dyn ReadWrite> = if self.endpoint.starts_with("https://") {
            Box::new(tls(self, tcp, addr)?)
        } else {
            Box::new(tcp)
        };
        let secure = if self.endpoint.starts_with("https://") {
            " over TLS"
        } else {
            ""
        };
        match self.protocol {
            Protocol::Grpc => probe_grpc(&self.endpoint, &mut stream, addr, secure),
            Protocol::HttpProtobuf => probe_http(&self.endpoint, &mut stream, addr, secure),
        }
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
    let roots = super::otlp::root_store(o).map_err(|e| e.to_string())?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
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
