//! An engine that drops its profiler and builds another on the same meter provider, three
//! times: the provider's synchronous instruments (`phasetrace.steps`, the duration histograms)
//! add up over the three, the observable per-layer counters (`phasetrace.section.layer.calls`)
//! report the live profiler's calls exactly, never a dropped one's (the SDK keeps every
//! callback; a dropped profiler's observe nothing), even for a section only the first profiler
//! timed, and after the last drop nothing of phasetrace's observable instruments is reported.

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, SdkMeterProvider};
use phasetrace::{Profiler, Section, SectionLevel, Site};
use phasetrace_names::metric;

const LAYERS: u32 = 3;

/// The points of `name` in the scope `phasetrace` as (sum of u64 values, sum of histogram
/// counts), or `None` when the export has no such metric.
fn totals(rm: &ResourceMetrics, name: &str) -> Option<u64> {
    let scope = rm
        .scope_metrics()
        .find(|s| s.scope().name() == phasetrace_names::SCOPE)?;
    let m = scope.metrics().find(|m| m.name() == name)?;
    Some(match m.data() {
        AggregatedMetrics::U64(MetricData::Sum(s)) => s.data_points().map(|p| p.value()).sum(),
        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
            h.data_points().map(|p| p.count()).sum()
        }
        other => panic!("{name}: {other:?}"),
    })
}

fn collect(provider: &SdkMeterProvider, exporter: &InMemoryMetricExporter) -> ResourceMetrics {
    exporter.reset();
    provider
        .force_flush()
        .expect("the engine's provider collects");
    let mut all = exporter.get_finished_metrics().expect("exported metrics");
    all.pop().expect("one export")
}

#[test]
fn three_build_drop_cycles_on_one_provider_give_exact_counts() {
    let (provider, exporter) = crate::engine_meter::engine_provider(Some(false));
    let mut steps_so_far = 0;
    let mut sections_so_far = 0;
    for cycle in 1..=3u64 {
        let steps = cycle + 2;
        // Only the first profiler times `kda_front`: its series must not outlive it.
        let per_step = if cycle == 1 { 2 * LAYERS } else { LAYERS };
        let profiler = Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .with_meter_provider(provider.clone())
            .build()
            .expect("building the profiler");
        let rec = profiler.recorder();
        for _ in 0..steps {
            let _step = rec.step();
            for layer in 0..LAYERS {
                let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
                if cycle == 1 {
                    let _front = rec.section(Section::KDA_FRONT, layer, Site::ATTN);
                }
            }
        }
        drop(rec);
        profiler.flush();
        steps_so_far += steps;
        let calls = steps * u64::from(per_step);
        sections_so_far += calls;
        let rm = collect(&provider, &exporter);
        assert_eq!(
            totals(&rm, metric::STEPS),
            Some(steps_so_far),
            "cycle {cycle}: the steps counter adds up over the profilers"
        );
        assert_eq!(
            totals(&rm, metric::SECTION_DURATION),
            Some(sections_so_far),
            "cycle {cycle}"
        );
        assert_eq!(
            totals(&rm, metric::SECTION_LAYER_CALLS),
            Some(calls),
            "cycle {cycle}: the per-layer calls are the live profiler's alone: {rm:#?}"
        );
        // After `shutdown()` the final totals are still reported (the engine's last collection).
        profiler.shutdown();
        let rm = collect(&provider, &exporter);
        assert_eq!(
            totals(&rm, metric::SECTION_LAYER_CALLS),
            Some(calls),
            "cycle {cycle}, after shutdown"
        );
        drop(profiler);
    }
    let rm = collect(&provider, &exporter);
    assert_eq!(totals(&rm, metric::STEPS), Some(steps_so_far));
    assert_eq!(
        totals(&rm, metric::SECTION_LAYER_CALLS).unwrap_or(0),
        0,
        "every profiler is dropped: none observes: {rm:#?}"
    );
    provider
        .shutdown()
        .expect("the engine shuts its provider down");
}
