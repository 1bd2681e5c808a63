//! The per-layer distributions on an engine's own meter provider: created there when the
//! engine registered `phasetrace::view(true)` (its backend takes exponential histograms, one
//! series per section and layer), and not with `view(false)` (explicit buckets would cost
//! B + 3 series per layer), where the per-layer counters carry the totals as before. Read back
//! through the SDK's in-memory exporter.

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use phasetrace::{Profiler, Section, SectionLevel, Site};
use phasetrace_names::metric;

const STEPS: u64 = 4;
const LAYERS: u32 = 3;

/// What the engine's provider exported after a profiler recorded `STEPS` steps of `LAYERS`
/// layers into it, with `phasetrace::view(exponential)` registered.
fn exported(exponential: bool) -> ResourceMetrics {
    let (provider, exporter) = crate::engine_meter::engine_provider(Some(exponential));
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_meter_provider(provider.clone())
        .build()
        .expect("building the profiler");
    let rec = profiler.recorder();
    for _ in 0..STEPS {
        let _step = rec.step();
        for layer in 0..LAYERS {
            let _g = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        }
    }
    drop(rec);
    profiler.shutdown();
    provider.force_flush().expect("flush");
    let mut all = exporter.get_finished_metrics().expect("exported metrics");
    provider.shutdown().expect("shutdown");
    all.pop().expect("one export")
}

/// (layer, count) of each point of the exponential histogram `name`, if exported.
fn per_layer(rm: &ResourceMetrics, name: &str) -> Option<Vec<(String, u64)>> {
    let m = rm
        .scope_metrics()
        .flat_map(|s| s.metrics())
        .find(|m| m.name() == name)?;
    match m.data() {
        AggregatedMetrics::F64(MetricData::ExponentialHistogram(h)) => {
            let mut v: Vec<(String, u64)> = h
                .data_points()
                .map(|p| {
                    let layer = p
                        .attributes()
                        .find(|k| k.key.as_str() == phasetrace_names::attr::LAYER)
                        .map(|k| k.value.to_string())
                        .unwrap_or_default();
                    (layer, p.count() as u64)
                })
                .collect();
            v.sort();
            Some(v)
        }
        other => panic!("{name}: not an exponential f64 histogram: {other:?}"),
    }
}

#[test]
fn with_the_exponential_view_each_layer_has_its_distribution() {
    let rm = exported(true);
    let got = per_layer(&rm, metric::SECTION_LAYER_DURATION).unwrap_or_else(|| {
        panic!(
            "no {} on the engine's provider: {rm:#?}",
            metric::SECTION_LAYER_DURATION
        )
    });
    let want: Vec<(String, u64)> = (0..LAYERS).map(|l| (l.to_string(), STEPS)).collect();
    assert_eq!(got, want);
}

#[test]
fn with_explicit_buckets_the_distributions_stay_off_the_engines_provider() {
    let rm = exported(false);
    assert_eq!(per_layer(&rm, metric::SECTION_LAYER_DURATION), None);
    assert!(
        rm.scope_metrics()
            .flat_map(|s| s.metrics())
            .any(|m| m.name() == metric::SECTION_LAYER_TIME),
        "the per-layer counters carry the totals"
    );
}
