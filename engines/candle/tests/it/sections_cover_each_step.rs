//! On the demo's default model (12 layers, 64 experts, top-8) with the demo's 4 tensor-parallel
//! ranks, the sections phasetrace exports add up to at least 95 % of the step time it exports,
//! on every rank: the table shows where the time really goes. Measured from the exported
//! histograms (`phasetrace.section.duration` and `phasetrace.step.duration` sums), not from the
//! engine's own clock. Every layer's sections are there, and the router's real choices reached
//! the expert-load telemetry.

use crate::support::{engine_provider, histogram_by};
use phasetrace::{Profiler, SectionLevel};
use phasetrace_candle::{ModelConfig, RunOptions, generate, prompt, weights};
use phasetrace_names::{attr, metric};

#[test]
fn sections_add_up_to_the_step_on_every_rank() {
    let cfg = ModelConfig::default();
    let tensors = weights::random(&cfg, 7).expect("random weights");
    let (provider, exporter) = engine_provider();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_expert_counter(true)
        .with_meter_provider(provider.clone())
        .build()
        .expect("building the profiler");
    let opts = RunOptions {
        ranks: 4,
        ..RunOptions::new(cfg.clone(), tensors, 24, prompt(8, cfg.vocab, 7))
    };
    let out = generate(&opts, Some(&profiler)).expect("generating");
    assert_eq!(out.tokens.len(), 24);
    profiler.flush();
    let load = profiler.expert_load();
    profiler.shutdown();
    provider
        .force_flush()
        .expect("flushing the engine's provider");
    let metrics = exporter.get_finished_metrics().expect("exported metrics");
    let steps = histogram_by(&metrics, metric::STEP_DURATION, attr::RANK);
    let sections = histogram_by(&metrics, metric::SECTION_DURATION, attr::RANK);
    assert_eq!(steps.len(), 4, "four ranks' steps: {steps:?}");
    for (rank, (step_s, n)) in &steps {
        assert_eq!(*n, 24, "rank {rank}: one step per token");
        let (sec_s, _) = sections[rank];
        let share = sec_s / step_s;
        eprintln!(
            "rank {rank}: sections {sec_s:.4}s of steps {step_s:.4}s = {:.1} %",
            100.0 * share
        );
        assert!(
            (0.95..=1.0 + 1e-6).contains(&share),
            "rank {rank}: sections cover {:.1} % of the step",
            100.0 * share
        );
    }
    let buckets = histogram_by(&metrics, metric::SECTION_DURATION, attr::BUCKET);
    for b in [
        "embed",
        "norm",
        "qkv",
        "rope",
        "attention",
        "o_proj",
        "reduce_attn_enq",
        "reduce_attn_bar",
        "reduce_attn",
        "mlp_dense",
        "moe_router",
        "moe_hostsync",
        "moe_experts",
        "moe_shared",
        "reduce_mlp_bar",
        "reduce_mlp",
        "lm_head",
        "sample",
    ] {
        assert!(
            buckets.contains_key(b),
            "bucket {b} recorded: {:?}",
            buckets.keys()
        );
    }
    // 11 MoE layers x 24 tokens x top-8, on each of the 4 ranks (every rank routes the same).
    let routed: u64 = load.layers.iter().map(|l| l.total()).sum();
    assert_eq!(routed, 4 * 11 * (24 + 7) * 8, "routed expert ids: {load:?}");
}
