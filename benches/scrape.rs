//! Scraping never slows the engine: the `/metrics` endpoint of a 96-layer model (the demo's
//! layout: 3 dense layers, DSA every 4th, MoE elsewhere, two all-reduces a layer) scraped every
//! 100 ms, against no scraping, in one run.
//!
//! 1. criterion: one scrape end to end (HTTP GET on loopback, collect, encode; classic text,
//!    gzip-compressed OpenMetrics, and the delimited protobuf format with native histograms,
//!    uncompressed and gzip-compressed), side by side.
//! 2. The engine's step time spent in phasetrace (a step of the 96 layers' ~1,700 sections,
//!    paced 2 ms apart) in alternating 2 s phases without and with a scraper every 100 ms:
//!    p50/p99 of each and their ratio, the scrape's wall time, and the CPU time of the
//!    endpoint's threads per scrape.
//!
//! Run: `cargo bench --bench scrape` (PHASES, default 6 of each; PHASE_SECS, default 2).
//! Figures go to the "Prometheus endpoint" section of BENCHMARKS.md.

use criterion::Criterion;
use phasetrace::{Profiler, Recorder, Section, SectionLevel, Site};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const LAYERS: u32 = 96;

/// One decode step of the demo's 96-layer layout; returns the sections recorded.
fn step(rec: &Recorder) -> u64 {
    let n = std::cell::Cell::new(0u64);
    let _step = rec.step();
    for layer in 0..LAYERS {
        let s = |sec: Section, site: Site| {
            let _g = rec.section(sec, layer, site);
            n.set(n.get() + 1);
        };
        s(Section::MHC, Site::NONE);
        s(Section::NORM, Site::NONE);
        if layer % 4 == 3 {
            for sec in [
                Section::DSA_PROJ,
                Section::DSA_INDEXER,
                Section::DSA_SELECT,
                Section::DSA_ATTEND,
            ] {
                s(sec, Site::ATTN);
            }
        } else {
            let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
            n.set(n.get() + 1);
            for sec in [Section::KDA_FRONT, Section::KDA_RECUR, Section::KDA_BACK] {
                s(sec, Site::ATTN);
            }
        }
        for sec in [
            Section::REDUCE_ATTN_ENQ,
            Section::REDUCE_ATTN_BAR,
            Section::REDUCE_ATTN,
        ] {
            s(sec, Site::ATTN);
        }
        s(Section::MHC_POST, Site::NONE);
        if layer < 3 {
            s(Section::MLP_DENSE, Site::MLP);
        } else {
            for sec in [
                Section::MOE_ROUTER,
                Section::MOE_HOSTSYNC,
                Section::MOE_EXPERTS,
                Section::MOE_SHARED,
                Section::MOE_COMBINE,
            ] {
                s(sec, Site::MLP);
            }
        }
        for sec in [
            Section::REDUCE_MLP_ENQ,
            Section::REDUCE_MLP_BAR,
            Section::REDUCE_MLP,
        ] {
            s(sec, Site::MLP);
        }
    }
    n.get()
}

fn profiler() -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(0)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()
        .expect("profiler")
}

/// One scrape: the body's length.
fn scrape(addr: SocketAddr, extra: &str) -> usize {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: b\r\n{extra}Connection: close\r\n\r\n").as_bytes(),
    )
    .expect("write");
    let mut buf = Vec::with_capacity(1 << 20);
    s.read_to_end(&mut buf).expect("read");
    assert!(buf.starts_with(b"HTTP/1.1 200"), "scrape failed");
    buf.len()
}

/// What Prometheus 3 sends with `scrape_native_histograms: true`: protobuf first.
const PROTOBUF_HEADERS: &str = "Accept: application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.5\r\n";

const PROMETHEUS_HEADERS: &str = "Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n";

/// CPU time (user + system) of this process's threads whose name starts with `prefix`.
fn threads_cpu(prefix: &str) -> Duration {
    let mut ticks = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
                continue;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            if !stat[open + 1..close].starts_with(prefix) {
                continue;
            }
            let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
            // utime and stime: fields 14 and 15 of stat, 12 and 13 after the name.
            ticks += f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
                + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

fn pct(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v[((v.len() - 1) as f64 * p) as usize]
}

fn main() {
    let p = profiler();
    let addr = p.prometheus_addr().expect("endpoint");
    let rec = p.recorder();
    for _ in 0..20 {
        step(&rec);
    }
    p.drain();

    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    let mut g = c.benchmark_group("scrape_96_layers");
    g.bench_function("classic_text", |b| b.iter(|| scrape(addr, "")));
    g.bench_function("openmetrics_gzip", |b| {
        b.iter(|| scrape(addr, PROMETHEUS_HEADERS))
    });
    g.bench_function("protobuf", |b| b.iter(|| scrape(addr, PROTOBUF_HEADERS)));
    let protobuf_gzip = format!("{PROTOBUF_HEADERS}Accept-Encoding: gzip\r\n");
    g.bench_function("protobuf_gzip", |b| b.iter(|| scrape(addr, &protobuf_gzip)));
    g.finish();
    c.final_summary();

    let phases: usize = std::env::var("PHASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let phase = Duration::from_secs_f64(
        std::env::var("PHASE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0),
    );
    let mut quiet = Vec::new();
    let mut scraped = Vec::new();
    let mut scrape_ns = Vec::new();
    let mut scrapes = 0u64;
    let mut cpu = Duration::ZERO;
    for i in 0..2 * phases {
        let scraping = i % 2 == 1;
        let stop = Arc::new(AtomicBool::new(false));
        let scraper = scraping.then(|| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut times = Vec::new();
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    scrape(addr, PROMETHEUS_HEADERS);
                    times.push(t.elapsed().as_nanos() as u64);
                    next += Duration::from_millis(100);
                    while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                times
            })
        });
        let cpu0 = threads_cpu("phasetrace-prom");
        let end = Instant::now() + phase;
        let into = if scraping { &mut scraped } else { &mut quiet };
        while Instant::now() < end {
            let t = Instant::now();
            step(&rec);
            into.push(t.elapsed().as_nanos() as u64);
            // An engine step of 96 layers takes milliseconds of GPU time: pace like one.
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(2) {
                std::hint::spin_loop();
            }
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(s) = scraper {
            let times = s.join().expect("scraper");
            scrapes += times.len() as u64;
            scrape_ns.extend(times);
            cpu += threads_cpu("phasetrace-prom").saturating_sub(cpu0);
        }
    }
    quiet.sort_unstable();
    scraped.sort_unstable();
    scrape_ns.sort_unstable();
    let body = scrape(addr, "");
    let zipped = scrape(addr, PROMETHEUS_HEADERS);
    println!(
        "\n## step time with and without a scrape every 100 ms ({phases} phases of {phase:?} each)"
    );
    println!("| case | steps | step p50 | step p99 |");
    println!("| --- | --- | --- | --- |");
    for (name, v) in [("no scraping", &quiet), ("scraped every 100 ms", &scraped)] {
        println!(
            "| {name} | {} | {:.1} us | {:.1} us |",
            v.len(),
            pct(v, 0.5) as f64 / 1e3,
            pct(v, 0.99) as f64 / 1e3
        );
    }
    println!(
        "p99 scraped / not scraped: {:.3}; p50: {:.3}",
        pct(&scraped, 0.99) as f64 / pct(&quiet, 0.99).max(1) as f64,
        pct(&scraped, 0.5) as f64 / pct(&quiet, 0.5).max(1) as f64
    );
    println!(
        "scrapes: {scrapes}; wall p50 {:.2} ms, p99 {:.2} ms; endpoint CPU {:.2} ms per scrape; response {} bytes classic, {} bytes OpenMetrics+gzip (with headers)",
        pct(&scrape_ns, 0.5) as f64 / 1e6,
        pct(&scrape_ns, 0.99) as f64 / 1e6,
        cpu.as_secs_f64() * 1e3 / scrapes.max(1) as f64,
        body,
        zipped
    );
    p.shutdown();
}
