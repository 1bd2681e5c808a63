//! Model code has no handle to the engine's recorder: a layer's `forward` records with
//! `phasetrace::current`, on whatever recorder its thread installed. Two engine threads (ranks
//! 0 and 1) install theirs and run steps whose layers record sections and a wait through the
//! free functions; every one is counted on its thread's rank. The same forward on a thread
//! that installed nothing, and after the guard is dropped, records nothing. An install over
//! another makes the new one current until its guard drops, then the old one again.

use std::collections::BTreeMap;
use std::time::Duration;

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use phasetrace::{Profiler, RecorderOptions, Section, SectionLevel, Site, StepKind, current};
use phasetrace_names::{attr, metric};

const STEPS: u64 = 30;
const LAYERS: u32 = 4;

/// A layer's forward, deep in model code: two sections (one nested, on the host clock) and a
/// rendezvous wait the layer measured itself.
fn layer_forward(layer: u32) {
    let _mixer = current::section(Section::KDA_MIXER, layer, Site::ATTN);
    {
        let _recur = current::host_section(Section::KDA_RECUR, layer, Site::ATTN);
        std::hint::black_box(layer);
    }
    current::with(|rec| rec.collective_wait(Site::MLP, layer, Duration::from_micros(3)));
}

/// Histogram `name`'s count by its `rank`.
fn counts_by_rank(rm: &[ResourceMetrics], name: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(rm) = rm.last() else { return out };
    for scope in rm.scope_metrics() {
        for m in scope.metrics().filter(|m| m.name() == name) {
            let AggregatedMetrics::F64(MetricData::Histogram(h)) = m.data() else {
                panic!("{name}: not an f64 histogram");
            };
            for p in h.data_points() {
                let rank = p
                    .attributes()
                    .find(|kv| kv.key.as_str() == attr::RANK)
                    .map(|kv| kv.value.to_string())
                    .unwrap_or_default();
                *out.entry(rank).or_default() += p.count();
            }
        }
    }
    out
}

#[test]
fn layers_without_a_handle_record_on_their_threads_recorder_and_nowhere_else() {
    let (meters, metrics) = crate::engine_meter::engine_provider(None);
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .with_meter_provider(meters.clone())
        .build()
        .expect("a profiler on the engine's provider builds");
    std::thread::scope(|s| {
        for rank in 0..2u32 {
            let profiler = &profiler;
            s.spawn(move || {
                assert!(!current::is_installed());
                let rec =
                    current::install(profiler.recorder_with(RecorderOptions::new().rank(rank)));
                assert!(current::is_installed());
                for _ in 0..STEPS {
                    let _step = rec.step_of(StepKind::Decode);
                    (0..LAYERS).for_each(layer_forward);
                }
                drop(rec);
                assert!(!current::is_installed());
                // Uninstalled: the same forward records nothing.
                (0..LAYERS).for_each(layer_forward);
            });
        }
        // A thread that never installed a recorder.
        s.spawn(|| {
            (0..LAYERS).for_each(layer_forward);
            assert_eq!(current::with(|_| ()), None);
        });
    });

    // Nested installs on this thread: rank 7 is current inside rank 5's, then rank 5 again.
    let outer = profiler.install_thread_recorder_with(RecorderOptions::new().rank(5));
    layer_forward(0);
    {
        let inner = current::install(profiler.recorder_with(RecorderOptions::new().rank(7)));
        assert_eq!(current::with(|r| r.rank()), Some(7));
        layer_forward(0);
        layer_forward(1);
        drop(inner);
    }
    assert_eq!(current::with(|r| r.rank()), Some(5));
    layer_forward(2);
    drop(outer);
    assert!(!current::is_installed());

    profiler.flush();
    let stats = profiler.stats();
    profiler.shutdown();
    let per_rank = STEPS * u64::from(LAYERS);
    assert_eq!(stats.steps, 2 * STEPS, "{stats:?}");
    assert_eq!(stats.sections, 2 * (2 * per_rank) + 2 * 4, "{stats:?}");
    assert_eq!(stats.dropped.total(), 0, "{stats:?}");

    meters.force_flush().expect("the engine's provider flushes");
    let got = metrics
        .get_finished_metrics()
        .expect("the engine's metrics");
    let sections = counts_by_rank(&got, metric::SECTION_DURATION);
    let want: BTreeMap<String, u64> =
        [("0", 2 * per_rank), ("1", 2 * per_rank), ("5", 4), ("7", 4)]
            .into_iter()
            .map(|(r, n)| (r.to_owned(), n))
            .collect();
    assert_eq!(sections, want);
    let waits = counts_by_rank(&got, metric::COLLECTIVE_WAIT);
    assert_eq!(waits.get("0"), Some(&per_rank), "{waits:?}");
    assert_eq!(waits.get("1"), Some(&per_rank), "{waits:?}");
}
