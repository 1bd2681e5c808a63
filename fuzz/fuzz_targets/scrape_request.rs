//! The Prometheus endpoint's request handling, as a client reaches it: any bytes sent on a
//! connection, then an honest scrape on a new one must still get 200. One endpoint for the
//! process (a profiler on 127.0.0.1, port chosen by the system).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

fn endpoint() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let p = phasetrace::Profiler::builder()
            .without_env()
            .with_level(phasetrace::SectionLevel::Full)
            .with_prometheus_at(([127, 0, 0, 1], 0))
            .build()
            .expect("profiler");
        let addr = p.prometheus_addr().expect("endpoint");
        // Kept for the process's life.
        std::mem::forget(p);
        addr
    })
}

/// Sends `bytes` and reads what comes back. `half_close`: the request ends with a shutdown of
/// the write side, so the endpoint answers or closes at once instead of waiting out its header
/// timeout (for the fuzzed bytes); the honest scrape instead asks `Connection: close` and waits
/// longer (its first rendering, under the sanitizer on a loaded machine, can take seconds).
fn exchange(addr: SocketAddr, bytes: &[u8], half_close: bool) -> Vec<u8> {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return Vec::new();
    };
    let wait = if half_close { 2 } else { 30 };
    let _ = s.set_read_timeout(Some(Duration::from_secs(wait)));
    let _ = s.write_all(bytes);
    if half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut out = Vec::new();
    let _ = s.take(1 << 20).read_to_end(&mut out);
    out
}

fuzz_target!(|data: &[u8]| {
    let addr = endpoint();
    let _ = exchange(addr, data, true);
    let answer = exchange(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n",
        false,
    );
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "an honest scrape after {:?} got {:?}",
        String::from_utf8_lossy(data),
        String::from_utf8_lossy(&answer[..answer.len().min(200)])
    );
});
