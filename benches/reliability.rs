//! Reliability figures (not a criterion bench: it reports tail latencies and memory over time).
//!
//! 1. The engine's step time spent in phasetrace (a step of 48 sections) with the collector up
//!    (real rotel) and down (nothing listening on the endpoint): p50/p99/p99.9 side by side, and
//!    their ratio.
//! 2. Memory: RSS sampled every second over a run at the maximum record rate with the collector
//!    down (every span export fails), against the stated bound.
//!
//! Run: `source .tools/env && cargo bench --bench reliability` (SOAK_SECS, default 60; PHASE_SECS,
//! default 10). Figures go to the Reliability section of BENCHMARKS.md.

use phasetrace::{Profiler, Section, SectionLevel, Site};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(43170)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn start_rotel(port: u16) -> Option<Child> {
    let bin = std::env::var("PHASETRACE_ROTEL_BIN").ok()?;
    let child = Command::new(bin)
        .args([
            "start",
            "--otlp-grpc-endpoint",
            &format!("127.0.0.1:{port}"),
            "--otlp-http-endpoint",
            &format!("127.0.0.1:{}", free_port()),
            "--exporter",
            "blackhole",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn profiler(port: u16) -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(10)
        .without_prometheus()
        .with_otlp_endpoint(Some(&format!("http://127.0.0.1:{port}")))
        .with_metric_export_interval(Duration::from_secs(1))
        .with_shutdown_timeout(Duration::from_secs(3))
        .build()
        .expect("profiler")
}

const SECTIONS: [Section; 4] = [
    Section::KDA_MIXER,
    Section::MOE_EXPERTS,
    Section::REDUCE_ATTN,
    Section::NORM,
];

/// Records steps of 48 sections for `secs`; returns the time each step spent in phasetrace
/// calls (the step's 48 section pairs and its own begin/end), sorted, and the sections recorded.
fn latencies(p: &Profiler, secs: u64) -> (Vec<u64>, u64) {
    let rec = p.recorder();
    let mut lat = Vec::with_capacity(1 << 20);
    let mut n = 0u64;
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let t = Instant::now();
        {
            let _s = rec.step();
            for i in 0..48u32 {
                let _g = rec.section(SECTIONS[(i % 4) as usize], i / 4, Site::ATTN);
            }
        }
        lat.push(t.elapsed().as_nanos() as u64);
        n += 48;
        // An engine step takes milliseconds of GPU time; pace like one so the measurement is of
        // the hot path, not of a saturated buffer.
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(900) {
            std::hint::spin_loop();
        }
    }
    lat.sort_unstable();
    (lat, n)
}

fn pct(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v[((v.len() - 1) as f64 * p) as usize]
}

fn main() {
    // Criterion passes flags such as --bench; this program takes none.
    let phase = std::env::var("PHASE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let soak = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);

    println!("## hot path with the collector up and down ({phase} s each)");
    let port = free_port();
    let mut rotel = start_rotel(port);
    if rotel.is_none() {
        println!("rotel not found (PHASETRACE_ROTEL_BIN): measuring 'down' only");
    }
    let mut rows = Vec::new();
    if rotel.is_some() {
        let p = profiler(port);
        let (lat, n) = latencies(&p, phase);
        p.flush();
        let s = p.stats();
        rows.push(("up", lat, n, s));
        p.shutdown();
    }
    if let Some(mut c) = rotel.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
    let p = profiler(port);
    let (lat, n) = latencies(&p, phase);
    p.flush();
    let s = p.stats();
    let t = Instant::now();
    p.shutdown();
    let shutdown_down = t.elapsed();
    rows.push(("down", lat, n, s));
    println!(
        "| collector | sections | step p50 ns | step p99 ns | step p99.9 ns | spans built | spans exported | spans failed | spans not built (queue full) | marks dropped (buffer full) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, lat, n, s) in &rows {
        println!(
            "| {name} | {n} | {} | {} | {} | {} | {} | {} | {} | {} |",
            pct(lat, 0.5),
            pct(lat, 0.99),
            pct(lat, 0.999),
            s.spans,
            s.spans_exported,
            s.spans_failed,
            s.dropped[phasetrace::DropReason::SpanQueue],
            s.dropped[phasetrace::DropReason::QueueFull]
        );
    }
    if rows.len() == 2 {
        println!(
            "p99 down / up = {:.2}",
            pct(&rows[1].1, 0.99) as f64 / pct(&rows[0].1, 0.99).max(1) as f64
        );
    }
    println!("shutdown with the collector down: {shutdown_down:?} (timeout 3 s)");

    println!("\n## memory at the maximum record rate, collector down ({soak} s)");
    let p = profiler(free_port());
    let rec = p.recorder();
    let start_rss = rss_kib();
    let mut max_rss = start_rss;
    let mut n = 0u64;
    let end = Instant::now() + Duration::from_secs(soak);
    let mut next = Instant::now();
    let mut samples = Vec::new();
    while Instant::now() < end {
        let _s = rec.step();
        for i in 0..48u32 {
            let _g = rec.section(SECTIONS[(i % 4) as usize], i / 4, Site::ATTN);
        }
        n += 48;
        if Instant::now() >= next {
            let r = rss_kib();
            max_rss = max_rss.max(r);
            samples.push(r);
            next += Duration::from_secs(1);
        }
    }
    p.flush();
    let s = p.stats();
    let first = samples.get(5).copied().unwrap_or(start_rss);
    let last = samples.last().copied().unwrap_or(start_rss);
    println!(
        "| sections recorded | processed | dropped (queue) | spans failed | RSS start KiB | RSS at 5 s KiB | RSS end KiB | RSS max KiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {n} | {} | {} | {} | {start_rss} | {first} | {last} | {max_rss} |",
        s.sections,
        s.dropped[phasetrace::DropReason::QueueFull],
        s.spans_failed
    );
    println!(
        "spans: built {} = exported {} + failed {} + pending {}; not built (processor queue full) {}",
        s.spans,
        s.spans_exported,
        s.spans_failed,
        s.spans - s.spans_exported - s.spans_failed,
        s.dropped[phasetrace::DropReason::SpanQueue]
    );
    p.shutdown();
}
