//! Greedy speculative decoding (draft k, verify k+1 positions in one forward, accept the
//! longest agreeing prefix, roll both KV caches back) generates the tokens plain greedy decoding
//! generates, with either draft: the target's first layers or the target at bf16. The shallow
//! draft is rejected sometimes (so rollbacks ran) and accepted sometimes; every round's
//! phases and its accepted count reach the profiler.

use crate::support::small_moe;
use candle_core::DType;
use phasetrace::{Profiler, SectionLevel, SpecLevel};
use phasetrace_candle::{Draft, RunOptions, RunOutput, Spec, generate, prompt, weights};

fn run(spec: Option<Spec>, steps: usize, profiler: Option<&Profiler>) -> RunOutput {
    let cfg = small_moe();
    let tensors = weights::random(&cfg, 21).expect("random weights");
    let opts = RunOptions {
        spec,
        ..RunOptions::new(cfg.clone(), tensors, steps, prompt(5, cfg.vocab, 21))
    };
    generate(&opts, profiler).expect("generating")
}

#[test]
fn both_drafts_reproduce_greedy_decoding() {
    let plain = run(None, 48, None);
    for draft in [Draft::Shallow { layers: 2 }, Draft::Precision(DType::BF16)] {
        let profiler = Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .with_spec_level(SpecLevel::VerifySplit)
            .build()
            .expect("building the profiler");
        let spec = run(Some(Spec { k: 3, draft }), 20, Some(&profiler));
        profiler.flush();
        let stats = profiler.stats();
        profiler.shutdown();
        let n = spec.tokens.len().min(plain.tokens.len());
        assert!(n > 20, "{draft}: {n} tokens");
        assert_eq!(
            spec.tokens[..n],
            plain.tokens[..n],
            "{draft}: speculative vs greedy"
        );
        assert_eq!(
            spec.rounds, 19,
            "{draft}: one round per step after the prefill"
        );
        assert_eq!(
            spec.tokens.len(),
            1 + spec.rounds + spec.accepted,
            "{draft}"
        );
        assert_eq!(stats.rounds, spec.rounds as u64, "{draft}: rounds recorded");
        if let Draft::Shallow { .. } = draft {
            assert!(
                spec.accepted > 0 && spec.accepted < spec.drafted,
                "{draft}: {} of {} accepted: both acceptance and rollback ran",
                spec.accepted,
                spec.drafted
            );
        }
    }
}
