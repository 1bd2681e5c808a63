//! Two and four tensor-parallel ranks (heads and MLP columns split, partial outputs summed by
//! the all-reduce) generate the same tokens as the whole model on one rank; shapes that do not
//! split evenly are refused, naming the width.

use crate::support::small_moe;
use phasetrace_candle::{EngineError, ModelConfig, RunOptions, generate, prompt, weights};

fn tokens(cfg: &ModelConfig, ranks: usize) -> Result<Vec<u32>, EngineError> {
    let tensors = weights::random(cfg, 9)?;
    let opts = RunOptions {
        ranks,
        ..RunOptions::new(cfg.clone(), tensors, 16, prompt(4, cfg.vocab, 9))
    };
    Ok(generate(&opts, None)?.tokens)
}

#[test]
fn shards_meet_in_the_all_reduce_and_agree_with_the_whole_model() {
    let cfg = small_moe();
    let one = tokens(&cfg, 1).expect("one rank");
    assert_eq!(one.len(), 16);
    assert_eq!(tokens(&cfg, 2).expect("two ranks"), one);
    let four = ModelConfig {
        heads: 8,
        kv_heads: 4,
        head_dim: 8,
        ..cfg
    };
    assert_eq!(
        tokens(&four, 4).expect("four ranks"),
        tokens(&four, 1).expect("one rank")
    );
}

#[test]
fn shapes_that_do_not_split_are_refused() {
    let err = tokens(&small_moe(), 3).expect_err("kv_heads 2 over 3 ranks");
    assert!(err.to_string().contains("kv_heads 2"), "{err}");
}
