// An expert-parallel load balancer's view: `Profiler::expert_load()` returns the tokens routed
// to every (rank, layer, expert), here for a Kimi-K2-shaped model (60 MoE layers of 384
// experts, top-8) whose router favours a few experts; the program prints the hottest ones and
// what was routed between two snapshots. `cargo run --example hot_experts`.
use phasetrace::{Profiler, SectionLevel};

const LAYERS: u32 = 60;
const EXPERTS: u32 = 384;
const TOP_K: u32 = 8;
const TOKENS: u32 = 32; // per step: one decode batch

/// A skewed router: expert `(token * 7 + j * j * 13 + layer) % 384`, and every fourth slot of
/// a token goes to expert 5 of each layer (a hot expert, as real routers have).
fn route(layer: u32, token: u32, ids: &mut [u32]) {
    for (j, id) in ids.iter_mut().enumerate() {
        let j = j as u32;
        *id = if j.is_multiple_of(4) {
            5
        } else {
            (token * 7 + j * j * 13 + layer) % EXPERTS
        };
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_expert_counter(true)
        .with_moe_experts(EXPERTS)
        .without_prometheus()
        // 20 steps of 3,840 route records each, recorded faster than the worker drains them.
        .with_queue(1 << 17)
        .with_summary_every(0)
        .build()?;
    let rec = profiler.recorder();
    let mut ids = [0u32; TOP_K as usize];
    let mut earlier = None;
    for step in 0..20 {
        let _step = rec.step();
        for layer in 0..LAYERS {
            for token in 0..TOKENS {
                route(layer, token + step * TOKENS, &mut ids);
                rec.moe_route(layer, &ids);
            }
        }
        drop(_step);
        if step == 9 {
            profiler.flush();
            earlier = Some(profiler.expert_load());
        }
    }
    profiler.flush(); // the snapshot holds what the worker has processed
    let load = profiler.expert_load();
    let routed: u64 = load.layers.iter().map(|l| l.total()).sum();
    println!(
        "{} (rank, layer) rows, {routed} tokens routed ({} tokens x top-{TOP_K} x {LAYERS} layers)",
        load.layers.len(),
        20 * TOKENS
    );
    for (rank, layer, expert, tokens) in load.hottest(5) {
        let row = load.layer(rank, layer).map_or(1, |l| l.total().max(1));
        println!(
            "hot: rank {rank} layer {layer} expert {expert}: {tokens} tokens ({:.1}% of the layer's)",
            100.0 * tokens as f64 / row as f64
        );
    }
    if let Some(earlier) = earlier {
        let recent = load.since(&earlier);
        let routed: u64 = recent.layers.iter().map(|l| l.total()).sum();
        println!("since the snapshot at step 10: {routed} tokens routed");
    }
    profiler.shutdown();
    Ok(())
}
