//! An engine that creates and drops a recorder per task, more than 65,536 times, while one
//! recorder lives throughout: a recorder's lane id is 16 bits (it names the recorder's
//! speculative rounds and its requests' home lane), so the ids come back, and the one the
//! long-lived recorder holds must not be given to a new recorder. Afterwards recording still
//! works and every count is exact: steps, sections, and the two rounds opened at once by the
//! long-lived recorder and by the recorder created 65,536 recorders after it (the one a
//! wrapping 16-bit counter gave the same id: the two rounds then had one key, and the second
//! round's verify part went to the first), each with its own verify part; nothing dropped.

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use phasetrace::{Phase, Profiler, Section, SectionLevel, Site, SpecLevel, VerifyPart};
use phasetrace_names::metric;

/// More than 65,536: the ids wrap past the long-lived recorder's at least once.
const DROPPED: u64 = 70_000;

#[test]
fn recorders_beyond_the_lane_id_range_keep_exact_counts() {
    let (provider, exporter) = crate::engine_meter::engine_provider(Some(false));
    let profiler = Profiler::builder()
        .without_env()
        .with_meter_provider(provider.clone())
        .with_level(SectionLevel::Full)
        .with_text("PHASETRACE_TRACE_EVERY", "0")
        .expect("a valid setting")
        .build()
        .expect("building the profiler");
    profiler
        .set_spec_level(SpecLevel::VerifySplit)
        .expect("the speculative level");
    let keep = profiler.recorder();
    {
        let _step = keep.step();
        let _s = keep.section(Section::NORM, 0, Site::ATTN);
    }
    let mut late = None;
    for i in 1..=DROPPED {
        let rec = profiler.recorder();
        {
            let _step = rec.step();
            let _s = rec.section(Section::NORM, 0, Site::ATTN);
        }
        if i == 65_536 {
            // Its id would be the long-lived recorder's under a wrapping counter.
            late = Some(rec);
        } else {
            drop(rec);
        }
        if i % 4096 == 0 {
            // The worker forgets dropped lanes as it drains them.
            profiler.drain();
        }
    }
    let late = late.expect("kept");
    // Two rounds open at once on the two recorders, each with a verify part, both parts seen
    // by the worker before either round ends.
    let a = keep.round(4);
    let b = late.round(4);
    a.phase(Phase::Draft);
    b.phase(Phase::Draft);
    drop(keep.verify_part(a.as_ref(), VerifyPart::Ffn));
    drop(late.verify_part(b.as_ref(), VerifyPart::Ffn));
    a.phase(Phase::Verify);
    b.phase(Phase::Verify);
    profiler.drain();
    a.end(2);
    profiler.drain();
    profiler.drain();
    b.end(3);
    {
        let _step = keep.step();
        let _s = keep.section(Section::NORM, 0, Site::ATTN);
    }
    drop(late);
    profiler.flush();
    let stats = profiler.stats();
    assert_eq!(stats.steps, DROPPED + 2, "{stats:?}");
    assert_eq!(stats.sections, DROPPED + 2, "{stats:?}");
    assert_eq!(stats.rounds, 2, "both rounds, none mixed: {stats:?}");
    assert_eq!(stats.dropped.total(), 0, "{stats:?}");
    // Per round: its verify part `ffn` and the rest of its verify.
    exporter.reset();
    provider.force_flush().expect("the provider collects");
    let all = exporter.get_finished_metrics().expect("exported metrics");
    let rm = all.last().expect("one export");
    let parts: u64 = rm
        .scope_metrics()
        .filter(|s| s.scope().name() == phasetrace_names::SCOPE)
        .flat_map(|s| s.metrics())
        .filter(|m| m.name() == metric::SPEC_VERIFY_PART_DURATION)
        .map(|m| match m.data() {
            AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                h.data_points().map(|p| p.count()).sum::<u64>()
            }
            other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(parts, 4, "each round's own verify part and rest: {rm:#?}");
    profiler.shutdown();
    provider.shutdown().expect("the provider shuts down");
}
