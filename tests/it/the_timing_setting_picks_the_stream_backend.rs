//! `PHASETRACE_TIMING` (or the builder) picks how an engine stream is timed: with `events`,
//! section durations are the device work between the boundaries even though the host only
//! enqueues; with `sync` the host waits at each boundary and measures the same work; with
//! `host`, the host measures only its enqueue time.

use phasetrace::{Profiler, Section, SectionLevel, Site, Timing};
use phasetrace_sim::SimStream;
use std::time::{Duration, Instant};

/// Sums of `kda_mixer` section time over 20 sections of 300 µs of device work each,
/// and how long the host spent issuing them.
fn run(timing: Timing) -> (Duration, Duration) {
    let stream = SimStream::new();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_timing(timing)
        .with_stream(stream.clone())
        .build()
        .expect("profiler");
    let rec = p.recorder();
    let t = Instant::now();
    for layer in 0..20u32 {
        let _s = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        stream.enqueue(Duration::from_micros(300));
    }
    let host = t.elapsed();
    stream.synchronize();
    p.flush();
    let url = format!("http://{}/metrics", p.prometheus_addr().expect("endpoint"));
    let body = scrape(&url);
    let sum: f64 = body
        .lines()
        .filter(|l| l.starts_with("phasetrace_section_duration_seconds_sum{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(p.stats().sections, 20);
    p.shutdown();
    (Duration::from_secs_f64(sum), host)
}

fn scrape(url: &str) -> String {
    use std::io::{Read, Write};
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or("");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

#[test]
fn events_measure_device_work_without_blocking_the_host() {
    let (measured, host) = run(Timing::Events);
    let want = Duration::from_micros(20 * 300);
    let err = measured.abs_diff(want);
    assert!(
        err <= want / 20 || err <= Duration::from_micros(20 * 20),
        "events measured {measured:?}, device work {want:?}"
    );
    assert!(
        host < want / 2,
        "the host waited {host:?}: events must not synchronize"
    );
}

#[test]
fn sync_measures_device_work_by_waiting() {
    let (measured, host) = run(Timing::Sync);
    let want = Duration::from_micros(20 * 300);
    assert!(measured >= want - want / 20, "sync measured {measured:?}");
    assert!(
        host >= want - want / 20,
        "sync must wait for the work: {host:?}"
    );
}

#[test]
fn host_measures_only_the_enqueue() {
    let (measured, _) = run(Timing::Host);
    assert!(
        measured < Duration::from_micros(20 * 300) / 4,
        "host timing saw device time: {measured:?}"
    );
}

#[test]
fn sync_or_events_without_a_stream_is_a_clear_error() {
    let err = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .with_timing(Timing::Events)
        .build()
        .expect_err("no stream");
    let msg = err.to_string();
    assert!(msg.starts_with("PHASETRACE_TIMING=events:"), "{msg}");
    assert!(msg.contains("with_stream"), "{msg}");
}
