//! What the tests share: small models, and the engine's own meter provider with an in-memory
//! exporter (what phasetrace exported, read back).

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use phasetrace_candle::{Layout, ModelConfig};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// A small MoE model (2 dense + 2 MoE layers, a shared expert), quick in debug builds.
pub(crate) fn small_moe() -> ModelConfig {
    ModelConfig {
        vocab: 512,
        hidden: 64,
        layers: 4,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        intermediate: 128,
        dense_layers: 2,
        experts: 8,
        top_k: 2,
        moe_intermediate: 32,
        shared_intermediate: 64,
        ..ModelConfig::default()
    }
}

/// A small dense model in the Llama layout.
pub(crate) fn small_dense() -> ModelConfig {
    ModelConfig {
        dense_layers: 4,
        experts: 0,
        top_k: 0,
        moe_intermediate: 0,
        shared_intermediate: 0,
        layout: Layout::Llama,
        ..small_moe()
    }
}

/// A fresh directory under the system's temporary directory.
pub(crate) fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("phasetrace-candle-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creating a temporary directory");
    d
}

/// A meter provider whose exporter keeps what it receives.
pub(crate) fn engine_provider() -> (SdkMeterProvider, InMemoryMetricExporter) {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(
            PeriodicReader::builder(exporter.clone())
                .with_interval(Duration::from_secs(3600))
                .build(),
        )
        .with_view(phasetrace::view(false))
        .build();
    (provider, exporter)
}

/// Histogram `name`'s sums and counts by the value of attribute `key`, in the last export.
pub(crate) fn histogram_by(
    metrics: &[ResourceMetrics],
    name: &str,
    key: &str,
) -> BTreeMap<String, (f64, u64)> {
    let mut out = BTreeMap::new();
    let Some(rm) = metrics.last() else {
        return out;
    };
    for scope in rm.scope_metrics() {
        for m in scope.metrics().filter(|m| m.name() == name) {
            // Durations are f64 histograms, token counts u64 ones.
            let points: Vec<(String, f64, u64)> = match m.data() {
                AggregatedMetrics::F64(MetricData::Histogram(h)) => h
                    .data_points()
                    .map(|p| (value_of(p.attributes(), key), p.sum(), p.count()))
                    .collect(),
                AggregatedMetrics::U64(MetricData::Histogram(h)) => h
                    .data_points()
                    .map(|p| (value_of(p.attributes(), key), p.sum() as f64, p.count()))
                    .collect(),
                _ => Vec::new(),
            };
            for (v, sum, count) in points {
                let e = out.entry(v).or_insert((0.0, 0));
                e.0 += sum;
                e.1 += count;
            }
        }
    }
    out
}

/// The value of attribute `key` as text (empty when absent).
pub(crate) fn value_of<'a>(
    mut attrs: impl Iterator<Item = &'a opentelemetry::KeyValue>,
    key: &str,
) -> String {
    attrs
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
        .unwrap_or_default()
}
