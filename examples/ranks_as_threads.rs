// Tensor-parallel ranks as threads of one process: one recorder per rank thread
// (`RecorderOptions::rank`), a barrier standing in for each all-reduce, and the rendezvous
// probe section around the wait, so that `phasetrace.collective.wait` shows which rank
// arrives late. Rank 1 is made 1.2x slower, like a mild straggler.
//
// `cargo run --example ranks_as_threads`

use phasetrace::{Profiler, RecorderOptions, Section, SectionLevel, Site};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const RANKS: u32 = 2;
const LAYERS: u32 = 8;
const STEPS: u32 = 20;

/// Stands in for a kernel: busy-waits, as a GPU-bound engine thread would be occupied.
fn work(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profiler = Profiler::builder()
        .with_level(SectionLevel::Full)
        // A free port, printed below; the default is 127.0.0.1:9464.
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()?;
    if let Some(addr) = profiler.prometheus_addr() {
        println!("metrics at http://{addr}/metrics while it runs");
    }
    let all_reduce = Arc::new(Barrier::new(RANKS as usize));
    let threads: Vec<_> = (0..RANKS)
        .map(|rank| {
            let profiler = profiler.clone();
            let all_reduce = all_reduce.clone();
            std::thread::spawn(move || {
                let rec = profiler.recorder_with(RecorderOptions::new().rank(rank));
                let slow = if rank == 1 { 1.2 } else { 1.0 };
                for _ in 0..STEPS {
                    let _step = rec.step();
                    for layer in 0..LAYERS {
                        {
                            let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
                            work(Duration::from_micros(40).mul_f64(slow));
                        }
                        {
                            // The wait at the rendezvous: ~0 for the straggler, its lag for
                            // the others.
                            let _probe = rec.section(Section::REDUCE_ATTN_BAR, layer, Site::ATTN);
                            all_reduce.wait();
                        }
                        {
                            let _experts = rec.section(Section::MOE_EXPERTS, layer, Site::MLP);
                            work(Duration::from_micros(60).mul_f64(slow));
                        }
                        {
                            let _probe = rec.section(Section::REDUCE_MLP_BAR, layer, Site::MLP);
                            all_reduce.wait();
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a rank thread panicked")?;
    }
    profiler.flush();
    let stats = profiler.stats();
    print!("{}", profiler.summary());
    println!(
        "{} steps, {} sections on {RANKS} ranks",
        stats.steps, stats.sections
    );
    profiler.shutdown();
    Ok(())
}
