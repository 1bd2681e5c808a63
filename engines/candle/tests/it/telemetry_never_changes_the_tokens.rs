//! The generated tokens are the same with phasetrace absent, built but off, at level
//! `collectives` and at level `full` (spans on every step), with two tensor-parallel ranks and
//! speculative decoding: telemetry observes the engine, never steers it.

use crate::support::small_moe;
use phasetrace::{Profiler, SectionLevel, SpecLevel};
use phasetrace_candle::{Draft, RunOptions, Spec, checksum, generate, prompt, weights};

fn run(profiler: Option<&Profiler>) -> Vec<u32> {
    let cfg = small_moe();
    let tensors = weights::random(&cfg, 5).expect("random weights");
    let opts = RunOptions {
        ranks: 2,
        spec: Some(Spec {
            k: 3,
            draft: Draft::Shallow { layers: 1 },
        }),
        ..RunOptions::new(cfg.clone(), tensors, 12, prompt(5, cfg.vocab, 5))
    };
    generate(&opts, profiler).expect("generating").tokens
}

fn profiler(level: SectionLevel) -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(level)
        .with_spec_level(SpecLevel::VerifySplit)
        .with_text("PHASETRACE_TRACE_EVERY", "1")
        .expect("a valid setting")
        .build()
        .expect("building the profiler")
}

#[test]
fn tokens_are_identical_with_phasetrace_off_and_at_every_level() {
    let reference = run(None);
    assert!(reference.len() >= 12, "{} tokens", reference.len());
    for level in [
        SectionLevel::Off,
        SectionLevel::Collectives,
        SectionLevel::Full,
    ] {
        let p = profiler(level);
        let tokens = run(Some(&p));
        p.shutdown();
        assert_eq!(
            checksum(&tokens),
            checksum(&reference),
            "level {level:?}: {tokens:?} vs {reference:?}"
        );
        if level == SectionLevel::Full {
            assert!(p.stats().sections > 0, "level full recorded sections");
        }
    }
}

#[test]
fn served_requests_get_the_same_tokens_with_phasetrace_off_and_on() {
    let cfg = small_moe();
    let run = |p: Option<&Profiler>| {
        let opts = RunOptions {
            ranks: 2,
            spec: Some(Spec {
                k: 2,
                draft: Draft::Shallow { layers: 1 },
            }),
            serving: Some(phasetrace_candle::Workload {
                requests_per_step: 0.6,
                max_batch: 3,
                prompt_tokens: 5,
                output_tokens: 6,
                seed: 9,
                ..Default::default()
            }),
            ..RunOptions::new(
                cfg.clone(),
                weights::random(&cfg, 9).expect("random weights"),
                16,
                Vec::new(),
            )
        };
        generate(&opts, p).expect("serving")
    };
    let reference = run(None);
    assert!(reference.requests.len() >= 3, "{:?}", reference.served);
    for level in [SectionLevel::Off, SectionLevel::Full] {
        let p = profiler(level);
        let out = run(Some(&p));
        p.shutdown();
        assert_eq!(out.requests, reference.requests, "level {level:?}");
    }
}
