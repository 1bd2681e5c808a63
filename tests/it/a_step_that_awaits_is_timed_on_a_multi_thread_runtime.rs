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
