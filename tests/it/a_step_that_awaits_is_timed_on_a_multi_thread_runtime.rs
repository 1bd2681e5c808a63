//! An async decode loop: each spawned task owns its recorder and times every step with
//! `begin_step` / `end_step` around bodies that `.await` (sleeps and yields, a section open
//! across an await with `begin_section` / `end_section`), on a multi-thread Tokio runtime where
//! the task may resume on another worker thread. Every step and section is counted exactly and
//! nothing is dropped or unbalanced.

use std::time::Duration;

use phasetrace::{Profiler, Section, SectionLevel, Site};

const TASKS: u64 = 8;
const STEPS: u64 = 40;

#[test]
fn steps_held_across_await_in_spawned_tasks_are_counted_exactly() {
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .without_prometheus()
        .build()
        .expect("a profiler without exporters builds");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .expect("a multi-thread runtime starts");
    let moved = rt.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let rec = profiler.recorder();
                tokio::spawn(async move {
                    let mut moved = 0u64;
                    for i in 0..STEPS {
                        let began_on = std::thread::current().id();
                        rec.begin_step();
                        {
                            // A guard whose scope holds no `.await`.
                            let _mixer = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
                        }
                        rec.begin_section(Section::REDUCE_ATTN, 0u32, Site::ATTN);
                        if (i + t) % 2 == 0 {
                            tokio::time::sleep(Duration::from_micros(200)).await;
                        } else {
                            tokio::task::yield_now().await;
                        }
                        rec.end_section(Section::REDUCE_ATTN);
                        tokio::task::yield_now().await;
                        rec.end_step();
                        moved += u64::from(std::thread::current().id() != began_on);
                    }
                    // Without an open step, `end_step` does nothing.
                    rec.end_step();
                    moved
                })
            })
            .collect();
        let mut moved = 0;
        for task in tasks {
            moved += task.await.expect("a decode task finishes");
        }
        moved
    });
    drop(rt);
    profiler.flush();
    let stats = profiler.stats();
    eprintln!(
        "{moved} of {} steps ended on another thread than they began",
        TASKS * STEPS
    );
    assert_eq!(stats.steps, TASKS * STEPS, "{stats:?}");
    assert_eq!(stats.sections, 2 * TASKS * STEPS, "{stats:?}");
    assert_eq!(stats.dropped.total(), 0, "{stats:?}");
    profiler.shutdown();
}

/// Inside `tracing::Instrument`, a step begun with `begin_step` is a child of the task's span
/// (the span current when it began), on the engine's tracer provider, whichever worker thread
/// the task resumes on.
#[cfg(feature = "tracing")]
#[test]
fn a_begun_step_is_a_child_of_the_instrumented_tasks_span() {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use phasetrace_names::span;
    use tracing::Instrument as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    const REQUESTS: u64 = 4;
    const PER_REQUEST: u64 = 5;
    let spans = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let dispatch = tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("engine"))),
    );
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .without_prometheus()
        .with_tracer_provider(provider.clone())
        .build()
        .expect("building the profiler");
    let on_start = dispatch.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        // The engine's subscriber on every worker thread, for the thread's life.
        .on_thread_start(move || std::mem::forget(tracing::dispatcher::set_default(&on_start)))
        .build()
        .expect("a multi-thread runtime starts");
    rt.block_on(async {
        let tasks: Vec<_> = (0..REQUESTS)
            .map(|id| {
                let rec = profiler.recorder();
                let request = tracing::dispatcher::with_default(&dispatch, || {
                    tracing::info_span!("request", request.id = id as i64)
                });
                tokio::spawn(
                    async move {
                        for _ in 0..PER_REQUEST {
                            rec.begin_step();
                            tokio::task::yield_now().await;
                            rec.begin_section(Section::KDA_MIXER, 0u32, Site::ATTN);
                            tokio::task::yield_now().await;
                            rec.end_section(Section::KDA_MIXER);
                            rec.end_step();
                        }
                    }
                    .instrument(request),
                )
            })
            .collect();
        for task in tasks {
            task.await.expect("a decode task finishes");
        }
    });
    drop(rt);
    profiler.shutdown();
    let all = spans.get_finished_spans().expect("the engine's spans");
    let requests: Vec<_> = all.iter().filter(|s| s.name == "request").collect();
    assert_eq!(requests.len() as u64, REQUESTS, "{all:#?}");
    let steps: Vec<_> = all.iter().filter(|s| s.name == span::STEP).collect();
    assert_eq!(steps.len() as u64, REQUESTS * PER_REQUEST, "{all:#?}");
    for request in requests {
        let children = steps
            .iter()
            .filter(|s| {
                s.parent_span_id == request.span_context.span_id()
                    && s.span_context.trace_id() == request.span_context.trace_id()
            })
            .count() as u64;
        assert_eq!(children, PER_REQUEST, "{all:#?}");
    }
    provider
        .shutdown()
        .expect("the engine shuts its provider down");
}
