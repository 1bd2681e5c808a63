//! The embedded `/metrics` endpoint as a scraper and a port scanner see it: idle and slow
//! connections never delay a scrape; methods, paths and oversized heads get the right status;
//! the format follows `Accept` and gzip `Accept-Encoding`; `promtool check metrics` is clean.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use phasetrace::{Profiler, Section, SectionLevel, Site};

fn profiler() -> Profiler {
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()
        .expect("profiler");
    let rec = p.recorder();
    for _ in 0..5 {
        let _step = rec.step();
        for layer in 0..4u32 {
            let _s = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
            let _b = rec.section(Section::REDUCE_ATTN_BAR, layer, Site::ATTN);
        }
    }
    p.flush();
    p
}

/// One HTTP/1.1 request (`Connection: close`): status, lower-cased head, body.
fn request(addr: SocketAddr, head: &str) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(head.as_bytes()).expect("write");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, head, raw[split + 4..].to_vec())
}

fn get(addr: SocketAddr, method: &str, path: &str, extra: &str) -> (u16, String, Vec<u8>) {
    request(
        addr,
        &format!("{method} {path} HTTP/1.1\r\nHost: t\r\n{extra}Connection: close\r\n\r\n"),
    )
}

#[test]
fn a_hundred_idle_or_slow_connections_never_delay_a_scrape() {
    let p = profiler();
    let addr = p.prometheus_addr().expect("endpoint");
    assert_eq!(
        p.prometheus_url(),
        Some(format!("http://{addr}/metrics")),
        "plain HTTP"
    );
    let mut held = Vec::new();
    for i in 0..100 {
        let mut c = TcpStream::connect(addr).expect("connect");
        if i % 2 == 1 {
            // A slow client: half a request head, then nothing.
            c.write_all(b"GET /metrics HTTP/1.1\r\nHost: slow\r\nAccept: ")
                .expect("write");
        }
        held.push(c);
    }
    for attempt in 0..3 {
        let t = Instant::now();
        let (status, _, body) = get(addr, "GET", "/metrics", "");
        let took = t.elapsed();
        assert_eq!(status, 200, "attempt {attempt}");
        assert!(
            String::from_utf8_lossy(&body).contains("phasetrace_steps_total"),
            "attempt {attempt}"
        );
        assert!(
            took < Duration::from_secs(1),
            "attempt {attempt}: a scrape took {took:?} with 100 idle or slow connections open"
        );
    }
    drop(held);
    p.shutdown();
}

#[test]
fn methods_paths_formats_and_gzip_get_the_right_answer() {
    support::require_tools!(Promtool);
    let p = profiler();
    let addr = p.prometheus_addr().expect("endpoint");

    let (status, head, classic) = get(addr, "GET", "/metrics?x=1", "");
    assert_eq!(status, 200);
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let classic = String::from_utf8(classic).expect("utf-8");
    assert!(!classic.contains("# EOF"));
    let scoped: Vec<&str> = classic
        .lines()
        .filter(|l| l.contains("otel_scope_name="))
        .collect();
    assert_eq!(scoped.len(), 1, "scope once only: {scoped:?}");
    assert!(
        scoped[0].starts_with("otel_scope_info{otel_scope_name=\"phasetrace\""),
        "{scoped:?}"
    );

    let (status, head, body) = get(addr, "HEAD", "/metrics", "");
    assert_eq!(status, 200);
    assert!(head.contains("content-length: "), "{head}");
    assert!(body.is_empty(), "HEAD has no body");

    let (status, head, _) = get(addr, "POST", "/metrics", "Content-Length: 0\r\n");
    assert_eq!(status, 405);
    assert!(head.contains("allow: get, head"), "{head}");
    assert_eq!(get(addr, "DELETE", "/", "").0, 405);
    assert_eq!(get(addr, "GET", "/metrics/x", "").0, 404);
    assert_eq!(get(addr, "GET", "/", "").0, 200);

    let big = format!("X-Big: {}\r\n", "a".repeat(20 * 1024));
    assert_eq!(
        get(addr, "GET", "/metrics", &big).0,
        431,
        "an oversized head"
    );

    let accept = "Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n";
    let (status, head, om) = get(addr, "GET", "/metrics", accept);
    assert_eq!(status, 200);
    assert!(
        head.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    let om = String::from_utf8(om).expect("utf-8");
    assert!(om.ends_with("# EOF\n"));
    assert!(om.contains("# TYPE phasetrace_steps counter\n"), "{om}");

    let (status, head, zipped) = get(addr, "GET", "/metrics", "Accept-Encoding: gzip\r\n");
    assert_eq!(status, 200);
    assert!(head.contains("content-encoding: gzip"), "{head}");
    let mut unzipped = String::new();
    flate2::read::GzDecoder::new(zipped.as_slice())
        .read_to_string(&mut unzipped)
        .expect("gzip");
    assert!(zipped.len() * 4 < unzipped.len(), "compresses");
    assert!(unzipped.contains("phasetrace_steps_total"));
    let (_, head, _) = get(addr, "GET", "/metrics", "Accept-Encoding: gzip;q=0\r\n");
    assert!(!head.contains("content-encoding"), "{head}");

    // The classic text passes Prometheus's own linter.
    let mut promtool = Command::new(support::promtool_binary())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(classic.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().expect("promtool");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && report.trim().is_empty(), "{report}");
    p.shutdown();
}
