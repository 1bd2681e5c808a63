//! Random weights written as a Hugging Face checkpoint directory (config.json and
//! model.safetensors, by candle's safetensors writer) in each layout the loader reads (Qwen2
//! dense with q/k/v biases and tied embeddings, Qwen2-MoE with a shared expert, Mixtral), read
//! back through `load_checkpoint`, give the same config and bit-identical logits; a missing
//! tensor or a bad config.json is an error naming it.

use crate::support::{small_dense, small_moe, temp_dir};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use phasetrace_candle::model::{KvCache, Model, Shard};
use phasetrace_candle::{Ctx, EngineError, Layout, ModelConfig, weights};

fn logits(cfg: &ModelConfig, t: &weights::Tensors) -> Vec<Vec<f32>> {
    let vb = VarBuilder::from_tensors(t.clone(), DType::F32, &Device::Cpu);
    let model = Model::load(&vb, cfg, Shard::WHOLE, 64).expect("building the model");
    let mut ctx = Ctx::plain().expect("the engine's sections");
    let mut cache = KvCache::new(cfg.layers);
    let prompt = phasetrace_candle::prompt(6, cfg.vocab, 3);
    let mut rows = model
        .logits(&mut ctx, &prompt, &mut cache, cfg.layers)
        .expect("prefill")
        .to_vec2::<f32>()
        .expect("logits");
    // One decode position after the prefill, through the KV cache.
    rows.extend(
        model
            .logits(&mut ctx, &[7], &mut cache, cfg.layers)
            .expect("decode")
            .to_vec2::<f32>()
            .expect("logits"),
    );
    rows
}

fn round_trip(name: &str, cfg: ModelConfig) {
    let tensors = weights::random(&cfg, 11).expect("random weights");
    let dir = temp_dir(name);
    weights::save_checkpoint(&dir, &cfg, &tensors).expect("writing the checkpoint");
    let (loaded_cfg, loaded) = weights::load_checkpoint(&dir).expect("reading it back");
    assert_eq!(loaded_cfg, cfg, "{name}: config.json round trip");
    assert_eq!(loaded.len(), tensors.len(), "{name}: tensor count");
    let (a, b) = (logits(&cfg, &tensors), logits(&loaded_cfg, &loaded));
    assert_eq!(a, b, "{name}: logits of the loaded checkpoint");
    assert!(
        a.iter().flatten().all(|x| x.is_finite()),
        "{name}: finite logits"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn qwen2_dense_with_biases_and_tied_embeddings() {
    round_trip(
        "qwen2",
        ModelConfig {
            attention_bias: true,
            tie_embeddings: true,
            ..small_dense()
        },
    );
}

#[test]
fn qwen2_moe_with_a_shared_expert() {
    round_trip("qwen2moe", small_moe());
}

#[test]
fn mixtral() {
    round_trip(
        "mixtral",
        ModelConfig {
            layout: Layout::Mixtral,
            dense_layers: 0,
            shared_intermediate: 0,
            norm_topk: true,
            // Mixtral's experts are `intermediate_size` wide.
            intermediate: 32,
            moe_intermediate: 32,
            ..small_moe()
        },
    );
}

#[test]
fn a_missing_tensor_and_a_bad_config_are_named() {
    let cfg = small_dense();
    let mut tensors = weights::random(&cfg, 1).expect("random weights");
    tensors.remove("model.layers.1.mlp.up_proj.weight");
    let dir = temp_dir("missing");
    weights::save_checkpoint(&dir, &cfg, &tensors).expect("writing the checkpoint");
    let (cfg, loaded) = weights::load_checkpoint(&dir).expect("reading it back");
    let vb = VarBuilder::from_tensors(loaded, DType::F32, &Device::Cpu);
    let err = Model::load(&vb, &cfg, Shard::WHOLE, 16).expect_err("a tensor is missing");
    assert!(
        err.to_string()
            .contains("model.layers.1.mlp.up_proj.weight"),
        "{err}"
    );
    std::fs::write(dir.join("config.json"), r#"{"model_type": "gpt2"}"#).expect("writing");
    let err = weights::load_checkpoint(&dir).expect_err("not a decoder config");
    assert!(matches!(err, EngineError::Checkpoint(_)), "{err}");
    assert!(err.to_string().contains("config.json"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
