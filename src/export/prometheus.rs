//! The embedded Prometheus pull endpoint: `GET /metrics` on a small HTTP/1.1 server thread.
//!
//! Binds to loopback by default (`127.0.0.1:9464`). Binding it elsewhere exposes per-layer
//! timing of the engine to whoever reaches that address: put it behind the network policy you
//! would give any metrics port.

use super::ExportError;
use prometheus::{Encoder, Registry, TextEncoder};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// The running endpoint.
pub(crate) struct PrometheusServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PrometheusServer {
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(super) fn start(
    addr: SocketAddr,
) -> Result<
    (
        opentelemetry_prometheus::PrometheusExporter,
        PrometheusServer,
    ),
    ExportError,
> {
    let registry = Registry::new();
    let reader = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .build()
        .map_err(|e| ExportError::Prometheus(e.to_string()))?;
    let listener =
        TcpListener::bind(addr).map_err(|source| ExportError::PrometheusBind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let thread = std::thread::Builder::new()
        .name("phasetrace-prometheus".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::Acquire) {
                    break;
                }
                if let Ok(c) = conn {
                    serve(c, &registry);
                }
            }
        })
        .map_err(ExportError::Thread)?;
    Ok((
        reader,
        PrometheusServer {
            addr: bound,
            stop,
            thread: Some(thread),
        },
    ))
}

fn serve(mut c: TcpStream, registry: &Registry) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = c.set_write_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 4096];
    let mut n = 0;
    // Read the request head (bounded); the body, if any, is ignored.
    while n < buf.len() {
        match c.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                n += k;
                if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        }
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => {
            let mut out = Vec::new();
            let enc = TextEncoder::new();
            match enc.encode(&registry.gather(), &mut out) {
                Ok(()) => ("200 OK", enc.format_type().to_owned(), out),
                Err(e) => (
                    "500 Internal Server Error",
                    "text/plain".to_owned(),
                    e.to_string().into_bytes(),
                ),
            }
        }
        ("GET", "/") => (
            "200 OK",
            "text/plain".to_owned(),
            b"phasetrace: metrics at /metrics\n".to_vec(),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain".to_owned(),
            b"not found: try /metrics\n".to_vec(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain".to_owned(),
            b"only GET\n".to_vec(),
        ),
    };
    let _ = write!(
        c,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = c.write_all(&body);
}
