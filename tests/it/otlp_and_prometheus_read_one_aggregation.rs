//! With metrics going both over OTLP and to the Prometheus endpoint (`otlp,prometheus`, explicit
//! buckets), scrapes collect from the OTLP reader's aggregation instead of a second one: a real
//! Prometheus and a real collector (rotel) read the same exact totals, after one batch and after
//! the next (cumulative on both sides, nothing counted twice or missed). The worker cost of two
//! aggregations is in `BENCHMARKS.md` (`worker/drain_steps_*`).

use crate::support;

use crate::manual_clock::Manual;
use phasetrace::{Profiler, RecorderOptions, Section, SectionLevel, Site};
use std::sync::Arc;
use std::time::Duration;
use support::{Prometheus, Rotel};

const US: u64 = 1_000;

/// `n` kda_mixer sections of 100 µs, one per layer 0..n, from `t`; returns the time after.
fn batch(rec: &phasetrace::Recorder, clock: &Manual, mut t: u64, n: u32) -> u64 {
    for layer in 0..n {
        clock.set(t);
        let _s = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        t += 100 * US;
        clock.set(t);
    }
    t + 10 * US
}

#[test]
fn a_scrape_and_an_otlp_export_read_the_same_totals() {
    support::require_tools!(Rotel, Prometheus);
    let rotel = Rotel::start();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(0)
        .with_otlp_endpoint(Some(&rotel.grpc_endpoint()))
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_text(
            phasetrace_names::env::OTEL_METRICS_EXPORTER,
            "otlp,prometheus",
        )
        .expect("metrics exporters")
        .with_text(phasetrace_names::env::OTEL_METRIC_EXPORT_INTERVAL, "500")
        .expect("interval")
        .build()
        .expect("profiler");
    let addr = p.prometheus_addr().expect("prometheus endpoint");
    let prom = Prometheus::builder()
        .job("engine", &addr.to_string())
        .scrape_interval("1s")
        .start();
    prom.wait_for_up(Duration::from_secs(30));
    let clock = Arc::new(Manual::default());
    let rec = p.recorder_with(RecorderOptions::new().rank(1).clock(clock.clone()));
    let mut t = phasetrace::timing::now_ns();
    for (round, n) in [(1u32, 8u32), (2, 8)] {
        t = batch(&rec, &clock, t, n);
        p.flush();
        let calls = f64::from(8 * round);
        let sum = calls * 100e-6;
        // The collector: the histogram's count and sum, and one layer's counter.
        let out = rotel.wait_for(
            |o| {
                o.latest_point(
                    "phasetrace.section.duration",
                    &[("bucket", "kda_mixer"), ("rank", "1")],
                )
                .and_then(|pt| pt.count)
                    == Some(calls as u64)
            },
            Duration::from_secs(20),
        );
        let pt = out
            .latest_point(
                "phasetrace.section.duration",
                &[("bucket", "kda_mixer"), ("rank", "1")],
            )
            .expect("histogram point");
        assert!((pt.sum.unwrap() - sum).abs() < 1e-9, "{pt:?}");
        let layer = out
            .latest_point(
                "phasetrace.section.layer.time",
                &[("bucket", "kda_mixer"), ("layer", "3")],
            )
            .and_then(|pt| pt.value)
            .expect("layer 3's counter");
        assert!((layer - f64::from(round) * 100e-6).abs() < 1e-9, "{layer}");
        // Prometheus, scraping the endpoint: the same totals.
        let q = |expr: &str, want: f64| {
            prom.wait_for_query(
                expr,
                |s| s.len() == 1 && (s[0].1 - want).abs() < 1e-9,
                Duration::from_secs(20),
            );
        };
        q(
            "phasetrace_section_duration_seconds_count{bucket=\"kda_mixer\",rank=\"1\"}",
            calls,
        );
        q(
            "phasetrace_section_duration_seconds_sum{bucket=\"kda_mixer\",rank=\"1\"}",
            sum,
        );
        q(
            "phasetrace_section_layer_time_seconds_total{bucket=\"kda_mixer\",layer=\"3\"}",
            f64::from(round) * 100e-6,
        );
    }
    p.shutdown();
}
