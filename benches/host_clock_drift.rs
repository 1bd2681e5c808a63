//! How far the process timeline (`now_ns`, what span timestamps are made of) drifts from the OS
//! monotonic clock over a long run, and how far a TSC calibrated once at start (as `quanta`
//! does) would have drifted over the same run.
//!
//! Every `DRIFT_SAMPLE_MS` (default 1000) it pairs `now_ns()` with the monotonic clock (best of
//! 7 brackets `monotonic, now_ns, monotonic`), for `DRIFT_SECS` (default 600). Mostly asleep: it
//! can run in the background.
//!
//! Run: `cargo bench --bench host_clock_drift` (`DRIFT_SECS=60` for a short run). Figures go to
//! BENCHMARKS.md and the README.

use phasetrace::timing::{HostSource, host_source, monotonic_ns, now_ns};
use std::time::{Duration, Instant};

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("{name}={v:?}: expected a whole number; using {default}");
            default
        }),
        Err(_) => default,
    }
}

/// (timeline - monotonic, half the bracket) in ns, best of 7.
fn offset() -> (i64, u64) {
    let mut best = (0i64, u64::MAX);
    for _ in 0..7 {
        let a = monotonic_ns();
        let t = now_ns();
        let b = monotonic_ns();
        let half = (b - a) / 2;
        if half < best.1 {
            best = (t as i64 - (a + half) as i64, half);
        }
    }
    best
}

#[cfg(target_arch = "x86_64")]
fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn rdtsc() -> u64 {
    monotonic_ns()
}

/// (TSC, monotonic ns) paired, best of 7 brackets.
fn tsc_pair() -> (u64, u64) {
    let mut best = (0, 0, u64::MAX);
    for _ in 0..7 {
        let a = rdtsc();
        let m = monotonic_ns();
        let b = rdtsc();
        if b - a < best.2 {
            best = (a + (b - a) / 2, m, b - a);
        }
    }
    (best.0, best.1)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let secs = env_u64("DRIFT_SECS", 600);
    let every = Duration::from_millis(env_u64("DRIFT_SAMPLE_MS", 1000).max(1));
    let _ = now_ns(); // decides the source and calibrates
    let start_info = host_source();
    let (tsc0, mono0) = tsc_pair();
    let hz0 = start_info.tsc_hz;
    println!(
        "host clock: {} ({}); calibrated at start: {:?} Hz; sampling every {every:?} for {secs} s",
        start_info.source, start_info.reason, hz0
    );
    let start = Instant::now();
    let mut worst = 0i64;
    let mut worst_once = 0i64;
    let mut samples = 0u64;
    let mut last = (0i64, 0i64);
    let mut next_line = Duration::from_secs(60);
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(every);
        let (off, _half) = offset();
        worst = worst.max(off.abs());
        let once = match (start_info.source, hz0) {
            (HostSource::Tsc, Some(hz)) => {
                let (t, m) = tsc_pair();
                let predicted = mono0 as f64 + (t - tsc0) as f64 / hz * 1e9;
                predicted as i64 - m as i64
            }
            _ => 0,
        };
        worst_once = worst_once.max(once.abs());
        last = (off, once);
        samples += 1;
        if start.elapsed() >= next_line {
            println!(
                "{:>5} s: timeline {:+} ns off the monotonic clock (worst {} ns); calibrated once: {:+} ns",
                start.elapsed().as_secs(),
                off,
                worst,
                once
            );
            next_line += Duration::from_secs(60);
        }
    }
    let end = host_source();
    println!(
        "after {:.0} s ({samples} samples): timeline worst |offset| {worst} ns, at the end {:+} ns; \
         a TSC calibrated once at start: worst {worst_once} ns, at the end {:+} ns; \
         {} refreshes, {} steps, rate now {:?} Hz",
        start.elapsed().as_secs_f64(),
        last.0,
        last.1,
        end.refreshes,
        end.steps,
        end.tsc_hz
    );
}
