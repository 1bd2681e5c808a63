//! The series budget: `phasetrace demo --ranks 1 --layers 96 --dense-layers 3` with default
//! settings serves at most 5,000 series and 600 KB per scrape on `/metrics`, and over OTLP no
//! instrument comes near the SDK's cardinality limit (no overflow series) while the same
//! series count holds.

use crate::cli;
use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::{Rotel, free_port, http_get};

const SERIES_BUDGET: usize = 5_000;
const BYTES_BUDGET: usize = 600 * 1000;
const RUN: Duration = Duration::from_secs(120);

#[test]
fn a_96_layer_model_serves_at_most_5000_series_and_600_kb_and_otlp_keeps_the_budget() {
    let rotel = Rotel::start();
    let target = format!("127.0.0.1:{}", free_port());
    let mut demo = cli::Demo::spawn(
        &[
            "--ranks",
            "1",
            "--layers",
            "96",
            "--dense-layers",
            "3",
            "--steps",
            "60",
            "--prometheus",
            &target,
            "--linger",
            "30",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &rotel.grpc_endpoint()),
            ("OTEL_METRICS_EXPORTER", "otlp,prometheus"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
        ],
    );
    assert_eq!(demo.prometheus_addr(RUN), target);
    demo.wait_for_run_end(RUN);

    let (status, body) = http_get(&format!("http://{target}/metrics")).expect("scrape");
    assert_eq!(status, 200);
    let series: Vec<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let mut by_name: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &series {
        *by_name
            .entry(s.split(['{', ' ']).next().unwrap())
            .or_default() += 1;
    }
    eprintln!(
        "96 layers, 1 rank: {} series, {} bytes per scrape: {by_name:#?}",
        series.len(),
        body.len()
    );
    assert!(
        series.len() <= SERIES_BUDGET,
        "{} series: {by_name:#?}",
        series.len()
    );
    assert!(body.len() <= BYTES_BUDGET, "{} bytes", body.len());
    // The per-layer detail is all there: time and calls for every layer.
    let layers: std::collections::BTreeSet<&str> = series
        .iter()
        .filter(|s| s.starts_with("phasetrace_section_layer_calls_total{"))
        .filter_map(|s| s.split("layer=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(layers.len(), 96);

    // OTLP: the same instruments, none overflowing, the same series count.
    let parsed = rotel.wait_for(
        |p| {
            p.last_metric(phasetrace_names::metric::SECTION_LAYER_CALLS)
                .is_some_and(|m| m.points.len() >= 1_500)
        },
        RUN,
    );
    let mut otlp_series = 0;
    let names: std::collections::BTreeSet<String> =
        parsed.metrics.iter().map(|m| m.name.clone()).collect();
    for name in &names {
        let m = parsed.last_metric(name).expect("metric");
        assert!(m.points.len() < 2_000, "{name}: {} points", m.points.len());
        for pt in &m.points {
            assert!(
                pt.attr("otel.metric.overflow").is_none(),
                "{name} overflowed"
            );
            otlp_series += if pt.explicit_bounds.is_empty() && pt.bucket_counts.is_empty() {
                1
            } else {
                pt.bucket_counts.len() + 2
            };
        }
    }
    assert!(otlp_series <= SERIES_BUDGET, "OTLP: {otlp_series} series");
    let _ = demo.interrupt_and_wait(RUN);
}
