//! A scheduler's speculative step holds a round across `.await`: every guard phasetrace hands
//! out (step, section, round and its phases, verify part) has a begin/end form whose future is
//! `Send`. Six tasks spawned on a 4-thread Tokio runtime each run 20 speculative steps whose
//! round, phases, verify part and section stay open across sleeps and yields, so that they end
//! on another worker thread than they began. Every step, section, round, phase and part
//! reaches the engine's meter provider exactly; a round ended twice is refused and counted as
//! unbalanced, once per task, and nothing else is dropped.

use std::collections::BTreeMap;
use std::time::Duration;

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use phasetrace::{
    DropReason, Phase, Profiler, Section, SectionLevel, Site, SpecLevel, StepKind, VerifyPart,
};
use phasetrace_names::{attr, metric};

const TASKS: u64 = 6;
const ROUNDS: u64 = 20;
const K: u32 = 4;

/// Whether `f` is `Send`, at compile time: `tokio::spawn` needs it; said here on its own.
fn send<F: std::future::Future + Send>(f: F) -> F {
    f
}

/// Histogram `name`'s count by the value of attribute `key`.
fn counts_by(rm: &[ResourceMetrics], name: &str, key: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(rm) = rm.last() else { return out };
    for scope in rm.scope_metrics() {
        for m in scope.metrics().filter(|m| m.name() == name) {
            let AggregatedMetrics::F64(MetricData::Histogram(h)) = m.data() else {
                panic!("{name}: not an f64 histogram");
            };
            for p in h.data_points() {
                let v = p
                    .attributes()
                    .find(|kv| kv.key.as_str() == key)
                    .map(|kv| kv.value.to_string())
                    .unwrap_or_default();
                *out.entry(v).or_default() += p.count();
            }
        }
    }
    out
}

/// One speculative step of a scheduler task: every boundary pair spans an await. It owns the
/// recorder while it runs (a `&Recorder` held across an await would not be `Send`).
async fn speculative_step(rec: phasetrace::Recorder, i: u64) -> (phasetrace::Recorder, bool) {
    let began_on = std::thread::current().id();
    rec.begin_step_of(StepKind::Speculative);
    let round = rec.begin_round(K);
    if i.is_multiple_of(2) {
        tokio::time::sleep(Duration::from_micros(100)).await;
    } else {
        tokio::task::yield_now().await;
    }
    rec.round_phase(round, Phase::Draft);
    rec.begin_section(Section::KDA_MIXER, 0u32, Site::ATTN);
    rec.begin_verify_part(round, VerifyPart::Mla);
    tokio::task::yield_now().await;
    rec.end_verify_part(round, VerifyPart::Mla);
    rec.end_section(Section::KDA_MIXER);
    rec.round_phase(round, Phase::Verify);
    tokio::task::yield_now().await;
    rec.round_phase(round, Phase::Accept);
    rec.end_round(round, (i % u64::from(K + 1)) as u32);
    rec.end_step();
    let moved = std::thread::current().id() != began_on;
    (rec, moved)
}

#[test]
fn rounds_phases_parts_steps_and_sections_held_across_await_are_counted_exactly() {
    let (meters, metrics) = crate::engine_meter::engine_provider(None);
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_spec_level(SpecLevel::VerifySplit)
        .without_prometheus()
        .with_meter_provider(meters.clone())
        .build()
        .expect("a profiler on the engine's provider builds");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .expect("a multi-thread runtime starts");
    let moved = rt.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let mut rec = profiler.recorder();
                tokio::spawn(send(async move {
                    let mut moved = 0u64;
                    let mut last = None;
                    for i in 0..ROUNDS {
                        let (back, m) = speculative_step(rec, i).await;
                        rec = back;
                        moved += u64::from(m);
                        last = Some(i);
                    }
                    // Ending a round that is over records nothing and counts it.
                    let round = rec.begin_round(K);
                    rec.end_round(round, 1);
                    rec.end_round(round, 1);
                    rec.round_phase(round, Phase::Maint);
                    assert_eq!(last, Some(ROUNDS - 1));
                    moved
                }))
            })
            .collect();
        let mut moved = 0;
        for task in tasks {
            moved += task.await.expect("a scheduler task finishes");
        }
        moved
    });
    drop(rt);
    profiler.flush();
    let stats = profiler.stats();
    profiler.shutdown();
    eprintln!(
        "{moved} of {} speculative steps ended on another thread than they began",
        TASKS * ROUNDS
    );
    let n = TASKS * ROUNDS;
    assert_eq!(
        (stats.steps, stats.sections, stats.rounds),
        (n, n, n + TASKS),
        "{stats:?}"
    );
    // The second `end_round` and the phase after it, per task.
    assert_eq!(
        stats.dropped.get(DropReason::Unbalanced),
        2 * TASKS,
        "{stats:?}"
    );
    assert_eq!(stats.dropped.total(), 2 * TASKS, "{stats:?}");

    meters.force_flush().expect("the engine's provider flushes");
    let got = metrics
        .get_finished_metrics()
        .expect("the engine's metrics");
    let phases = counts_by(&got, metric::SPEC_PHASE_DURATION, attr::PHASE);
    for p in [Phase::Draft, Phase::Verify, Phase::Accept] {
        assert_eq!(phases.get(p.as_str()), Some(&n), "{phases:?}");
    }
    assert_eq!(phases.get(Phase::Maint.as_str()), None, "{phases:?}");
    let parts = counts_by(&got, metric::SPEC_VERIFY_PART_DURATION, attr::PART);
    assert_eq!(parts.get(VerifyPart::Mla.as_str()), Some(&n), "{parts:?}");
    let steps = counts_by(&got, metric::STEP_DURATION, attr::STEP_KIND);
    assert_eq!(steps.get("speculative"), Some(&n), "{steps:?}");
    let sections = counts_by(&got, metric::SECTION_DURATION, attr::BUCKET);
    assert_eq!(sections.get("kda_mixer"), Some(&n), "{sections:?}");
}
