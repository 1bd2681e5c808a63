//! The per-layer distributions over OTLP, live: one demo rank of a 96-layer model
//! (`--ranks 1 --layers 96 --dense-layers 3`) pushes OTLP/HTTP metrics with exponential
//! histograms (`OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram`)
//! straight to Prometheus 3's OTLP receiver (`--web.enable-otlp-receiver`, the bundled
//! `otel-config/prometheus-otlp.yml` unchanged). They are stored as native histograms (one
//! series each: `histogram_count` reads them, no `_bucket` series exist), and a per-layer
//! `histogram_quantile(0.99, ...)` by layer returns a p99 for every layer, of the sections and
//! of the rendezvous waits; the bundled per-layer wait p99 rule fills for every layer too.

use crate::cli::Demo;
use crate::support::{self, Prometheus, repo_root};

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const LAYERS: usize = 96;
const SERVICE: &str = "phasetrace-otlp-native";
const WAIT: Duration = Duration::from_secs(120);

type Samples = [(BTreeMap<String, String>, f64)];

/// The `layer` labels of the finite, positive samples.
fn layers(samples: &Samples) -> BTreeSet<String> {
    samples
        .iter()
        .filter(|(_, v)| v.is_finite() && *v > 0.0)
        .filter_map(|(l, _)| l.get("layer").cloned())
        .collect()
}

#[test]
fn exponential_otlp_gives_every_layer_a_native_p99_in_prometheus() {
    support::require_tools!(Prometheus);
    let prometheus = Prometheus::builder()
        .config_file(repo_root().join("otel-config/prometheus-otlp.yml"))
        .arg("--web.enable-otlp-receiver")
        .start();
    let endpoint = format!("{}/api/v1/otlp/v1/metrics", prometheus.base_url());
    let mut demo = Demo::spawn(
        &[
            "--ranks",
            "1",
            "--layers",
            "96",
            "--dense-layers",
            "3",
            "--forever",
            "--trace-every",
            "0",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            (
                "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                "base2_exponential_bucket_histogram",
            ),
            ("OTEL_SERVICE_NAME", SERVICE),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRICS_EXPORTER", "otlp"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
        ],
    );

    let every_layer = |s: &Samples| layers(s).len() == LAYERS;
    for (what, name) in [
        ("sections", "phasetrace_section_layer_duration_seconds"),
        ("waits", "phasetrace_collective_layer_wait_duration_seconds"),
    ] {
        let q = format!(
            "histogram_quantile(0.99, sum by (layer) (rate({name}{{job=\"{SERVICE}\"}}[1m])))"
        );
        let got = prometheus.wait_for_query(&q, every_layer, WAIT);
        assert_eq!(
            layers(&got).len(),
            LAYERS,
            "a p99 of the {what} of every layer: {got:?}\ndemo:\n{}",
            demo.output()
        );
        // Native histograms: `histogram_count` reads them (it returns nothing for float
        // series), one series per (bucket, layer, site), and no classic `_bucket` series.
        prometheus.wait_for_query(
            &format!("histogram_count({name}{{job=\"{SERVICE}\"}})"),
            every_layer,
            WAIT,
        );
        assert!(
            prometheus
                .query_vector(&format!("{name}_bucket"))
                .is_empty(),
            "{name} arrives as a native histogram, not as buckets"
        );
    }
    // The bundled rule on the native form, per (site, layer, rank).
    prometheus.wait_for_query(
        &format!("phasetrace:collective_layer_wait_seconds:p99_5m{{job=\"{SERVICE}\"}}"),
        every_layer,
        WAIT,
    );
    demo.kill();
}
