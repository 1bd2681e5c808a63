//! A dead or flapping collector never hurts the engine: recording goes on, export resumes once
//! the real collector (rotel) is back on the same port, spans lost meanwhile are counted and the
//! count is exported, failed metrics exports are counted (`phasetrace.metric.exports`), and
//! `shutdown()` with the collector down returns within its timeout.

use crate::support;

use phasetrace::{Profiler, Section, SectionLevel, Site};
use std::time::{Duration, Instant};
use support::Rotel;

fn profiler(endpoint: &str) -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(5)
        .without_prometheus()
        .with_otlp_endpoint(Some(endpoint))
        .with_metric_export_interval(Duration::from_millis(300))
        .with_shutdown_timeout(Duration::from_secs(3))
        .build()
        .expect("profiler")
}

fn steps(rec: &phasetrace::Recorder, n: usize) {
    for _ in 0..n {
        let _s = rec.step();
        for layer in 0..4u32 {
            let _a = rec.section(Section::NORM, layer, Site::NONE);
        }
    }
}

fn steps_received(o: &support::ParsedOutput) -> f64 {
    o.latest_point("phasetrace.steps", &[])
        .and_then(|p| p.value)
        .unwrap_or(0.0)
}

#[test]
fn export_resumes_after_a_restart_and_lost_spans_are_counted() {
    support::require_tools!(Rotel);
    let mut rotel = Rotel::start();
    let p = profiler(&rotel.grpc_endpoint());
    let rec = p.recorder();

    steps(&rec, 50);
    p.flush();
    rotel.wait_for(|o| steps_received(o) == 50.0, Duration::from_secs(20));

    // Collector down: the engine keeps recording; spans exported now fail and are counted.
    rotel.kill();
    steps(&rec, 100);
    p.flush();
    let lost = support::poll(Duration::from_secs(20), || {
        p.flush();
        let s = p.stats();
        (s.spans_failed > 0).then_some(s.spans_failed)
    })
    .expect("failed span exports are counted");
    assert_eq!(p.stats().sections, 150 * 4);

    // Back on the same port: new data and the drop count arrive.
    rotel.restart_same_ports();
    rotel.clear_output();
    steps(&rec, 50);
    p.flush();
    let out = rotel.wait_for(
        |o| {
            steps_received(o) == 200.0
                && o.latest_point("phasetrace.records.dropped", &[("reason", "span_export")])
                    .and_then(|pt| pt.value)
                    .is_some_and(|v| v >= lost as f64)
        },
        Duration::from_secs(30),
    );
    // Metrics are cumulative: nothing recorded during the outage is missing from the counts.
    let norm = out
        .latest_point(
            phasetrace_names::metric::SECTION_LAYER_CALLS,
            &[("bucket", "norm"), ("layer", "0")],
        )
        .expect("norm point");
    assert_eq!(norm.value, Some(200.0));
    // The metrics exports that failed meanwhile are counted, and the count arrives with the
    // first export that works (exports run every 300 ms: the outage spans several).
    let exports = |o: &support::ParsedOutput, result: &str| {
        o.latest_point(
            phasetrace_names::metric::METRIC_EXPORTS,
            &[(phasetrace_names::attr::RESULT, result)],
        )
        .and_then(|pt| pt.value)
        .unwrap_or(0.0)
    };
    let out = rotel.wait_for(
        |o| exports(o, "failed") >= 1.0 && exports(o, "ok") >= 2.0,
        Duration::from_secs(20),
    );
    eprintln!(
        "metrics exports: {} ok, {} failed",
        exports(&out, "ok"),
        exports(&out, "failed")
    );
    let s = p.stats();
    assert_eq!(s.spans_failed, s.spans - s.spans_exported, "{s:?}");

    // Shutdown with the collector down returns within its 3 s timeout.
    rotel.kill();
    steps(&rec, 10);
    let t = Instant::now();
    p.shutdown();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        t.elapsed()
    );
}

#[test]
fn a_collector_that_is_down_at_start_receives_once_it_is_up() {
    support::require_tools!(Rotel);
    let mut rotel = Rotel::start();
    rotel.kill();
    let p = profiler(&rotel.grpc_endpoint());
    let rec = p.recorder();
    steps(&rec, 20);
    p.flush();
    rotel.restart_same_ports();
    steps(&rec, 20);
    p.flush();
    rotel.wait_for(|o| steps_received(o) == 40.0, Duration::from_secs(30));
    p.shutdown();
}
