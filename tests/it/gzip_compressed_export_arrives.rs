//! `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` (or `with_otlp_gzip`): OTLP bodies over gRPC and
//! HTTP/protobuf are gzip-compressed on the wire, and arrive intact at the real collector.
//!
//! A capturing TCP proxy sits between the exporter and rotel and keeps every byte the exporter
//! sends. Over HTTP/1.1 the request says `content-encoding: gzip` and its body starts with the
//! gzip magic; over gRPC (HTTP/2) every message's length prefix has the compressed flag set and
//! its payload starts with the gzip magic. Without gzip those checks fail: the test proves the
//! encoding, not only the arrival.

use crate::support;

use phasetrace::{Profiler, Protocol, Section, SectionLevel, Site};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::Rotel;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// What one connection's client sent.
type Capture = Arc<Mutex<Vec<u8>>>;

/// A TCP proxy on a free port that forwards to `upstream` and keeps what clients sent, one
/// buffer per connection.
struct CaptureProxy {
    port: u16,
    sent: Arc<Mutex<Vec<Capture>>>,
}

impl CaptureProxy {
    fn start(upstream: u16) -> CaptureProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let sent: Arc<Mutex<Vec<Capture>>> = Arc::default();
        let connections = sent.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let buf = Arc::new(Mutex::new(Vec::new()));
                connections.lock().expect("connections").push(buf.clone());
                let (c2, s2) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                std::thread::spawn(move || pump(client, server, Some(buf)));
                std::thread::spawn(move || pump(s2, c2, None));
            }
        });
        CaptureProxy { port, sent }
    }

    /// What each connection's client sent so far.
    fn sent(&self) -> Vec<Vec<u8>> {
        self.sent
            .lock()
            .expect("connections")
            .iter()
            .map(|b| b.lock().expect("buffer").clone())
            .collect()
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, keep: Option<Capture>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(k) = &keep {
                    k.lock().expect("buffer").extend_from_slice(&buf[..n]);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// HTTP/1.1 requests in `bytes`: (lower-cased head, body).
fn http_requests(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&rest[..end]).to_ascii_lowercase();
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let body_start = end + 4;
        let body_end = (body_start + len).min(rest.len());
        out.push((head, rest[body_start..body_end].to_vec()));
        rest = &rest[body_end..];
    }
    out
}

/// The gRPC messages a client sent over HTTP/2 in `bytes`: (compressed flag, payload start).
fn grpc_messages(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let Some(mut rest) = bytes.strip_prefix(PREFACE) else {
        return Vec::new();
    };
    // DATA payloads per stream, in order.
    let mut streams: Vec<(u32, Vec<u8>)> = Vec::new();
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let (kind, flags) = (rest[3], rest[4]);
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
        if rest.len() < 9 + len {
            break;
        }
        let mut payload = &rest[9..9 + len];
        if kind == 0 {
            if flags & 0x8 != 0 && !payload.is_empty() {
                let pad = usize::from(payload[0]);
                payload = &payload[1..payload.len().saturating_sub(pad)];
            }
            match streams.iter_mut().find(|s| s.0 == stream) {
                Some(s) => s.1.extend_from_slice(payload),
                None => streams.push((stream, payload.to_vec())),
            }
        }
        rest = &rest[9 + len..];
    }
    let mut out = Vec::new();
    for (_, data) in streams {
        let mut d = data.as_slice();
        while d.len() >= 5 {
            let len = u32::from_be_bytes([d[1], d[2], d[3], d[4]]) as usize;
            let end = (5 + len).min(d.len());
            out.push((d[0], d[5..end].iter().take(2).copied().collect()));
            d = &d[end..];
        }
    }
    out
}

fn run(endpoint: &str, protocol: Protocol) -> Profiler {
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .without_prometheus()
        .with_otlp_endpoint(Some(endpoint))
        .with_otlp_protocol(protocol)
        .with_otlp_gzip(true)
        .build()
        .expect("profiler");
    assert!(p.config().otlp.as_ref().is_some_and(|o| o.gzip));
    let rec = p.recorder();
    for _ in 0..4 {
        let _s = rec.step();
        let _k = rec.section(Section::MOE_EXPERTS, 3u32, Site::MLP);
    }
    drop(rec);
    p.flush();
    p
}

fn arrived(o: &support::ParsedOutput) -> bool {
    o.spans_named("decode.step").len() == 4
        && o.latest_point("phasetrace.section.duration", &[("bucket", "moe_experts")])
            .and_then(|p| p.count)
            == Some(4)
}

fn port_of(endpoint: &str) -> u16 {
    endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("endpoint port")
}

#[test]
fn gzip_over_grpc_arrives() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let proxy = CaptureProxy::start(port_of(&rotel.grpc_endpoint()));
    let p = run(&format!("http://127.0.0.1:{}", proxy.port), Protocol::Grpc);
    rotel.wait_for(arrived, Duration::from_secs(20));
    p.shutdown();
    let messages: Vec<(u8, Vec<u8>)> = proxy.sent().iter().flat_map(|c| grpc_messages(c)).collect();
    assert!(
        messages.len() >= 2,
        "expected trace and metric messages on the wire: {messages:?}"
    );
    for (compressed, head) in &messages {
        assert_eq!(
            (*compressed, head.as_slice()),
            (1, GZIP_MAGIC.as_slice()),
            "a gRPC message not gzip-compressed on the wire (flag, first bytes): {messages:?}"
        );
    }
}

#[test]
fn gzip_over_http_arrives() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let proxy = CaptureProxy::start(port_of(&rotel.http_endpoint()));
    let p = run(
        &format!("http://127.0.0.1:{}", proxy.port),
        Protocol::HttpProtobuf,
    );
    rotel.wait_for(arrived, Duration::from_secs(20));
    p.shutdown();
    let requests: Vec<(String, Vec<u8>)> =
        proxy.sent().iter().flat_map(|c| http_requests(c)).collect();
    let posts: Vec<&(String, Vec<u8>)> = requests
        .iter()
        .filter(|(head, _)| head.starts_with("post /v1/"))
        .collect();
    assert!(
        posts.iter().any(|(h, _)| h.starts_with("post /v1/traces"))
            && posts.iter().any(|(h, _)| h.starts_with("post /v1/metrics")),
        "expected trace and metric requests: {:?}",
        requests.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    for (head, body) in posts {
        assert!(
            head.lines().any(|l| l == "content-encoding: gzip"),
            "no content-encoding: gzip:\n{head}"
        );
        assert!(body.starts_with(&GZIP_MAGIC), "body is not gzip:\n{head}");
    }
}
