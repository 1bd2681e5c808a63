//! Where the weights come from: seeded random tensors under the checkpoint layout's names, or a
//! Hugging Face checkpoint directory (`config.json` + `*.safetensors`). Both end in one
//! [`candle_nn::VarBuilder`], so the model is built by the same loading code either way.

use crate::EngineError;
use crate::config::{Layout, ModelConfig};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use std::path::Path;

/// The tensors of a model by checkpoint name, on the host.
pub type Tensors = HashMap<String, Tensor>;

/// The names a layout gives a layer's tensors.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Names {
    pub(crate) layout: Layout,
}

/// Which of an MLP's three matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proj {
    Gate,
    Up,
    Down,
}

impl Names {
    pub(crate) fn layer(l: usize) -> String {
        format!("model.layers.{l}")
    }

    /// The MoE block's prefix inside a layer.
    fn moe(self) -> &'static str {
        match self.layout {
            Layout::Mixtral => "block_sparse_moe",
            _ => "mlp",
        }
    }

    pub(crate) fn router(self) -> String {
        format!("{}.gate", self.moe())
    }

    pub(crate) fn expert(self, e: usize, p: Proj) -> String {
        let m = self.moe();
        match (self.layout, p) {
            (Layout::Mixtral, Proj::Gate) => format!("{m}.experts.{e}.w1"),
            (Layout::Mixtral, Proj::Down) => format!("{m}.experts.{e}.w2"),
            (Layout::Mixtral, Proj::Up) => format!("{m}.experts.{e}.w3"),
            (_, p) => format!("{m}.experts.{e}.{}", mlp_name(p)),
        }
    }
}

pub(crate) fn mlp_name(p: Proj) -> &'static str {
    match p {
        Proj::Gate => "gate_proj",
        Proj::Up => "up_proj",
        Proj::Down => "down_proj",
    }
}

/// SplitMix64: a tiny seeded generator, identical on every platform and device.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-a, a).
    fn uniform(&mut self, a: f32) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * a
    }
}

/// Every tensor name and shape of `cfg` in its layout, in a fixed order, with the standard
/// deviation of its random initialisation (`None`: a norm weight, initialised to 1).
fn shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>, Option<f32>)> {
    let (h, hd) = (cfg.hidden, cfg.head_dim);
    let inv = |fan_in: usize| Some(1.0 / (fan_in as f32).sqrt());
    // Output projections scaled down with depth (GPT-2's initialisation), so the residual
    // stream stays in range and early layers carry most of the signal.
    let out = |fan_in: usize| Some(1.0 / ((fan_in * 2 * cfg.layers) as f32).sqrt());
    let names = Names { layout: cfg.layout };
    let mut v = vec![(
        "model.embed_tokens.weight".to_owned(),
        vec![cfg.vocab, h],
        Some(1.0),
    )];
    for l in 0..cfg.layers {
        let p = Names::layer(l);
        v.push((format!("{p}.input_layernorm.weight"), vec![h], None));
        for (n, rows) in [
            ("q_proj", cfg.heads * hd),
            ("k_proj", cfg.kv_heads * hd),
            ("v_proj", cfg.kv_heads * hd),
        ] {
            v.push((format!("{p}.self_attn.{n}.weight"), vec![rows, h], inv(h)));
            if cfg.attention_bias {
                v.push((format!("{p}.self_attn.{n}.bias"), vec![rows], Some(0.02)));
            }
        }
        v.push((
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, cfg.heads * hd],
            out(cfg.heads * hd),
        ));
        v.push((
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            None,
        ));
        let mlp = |v: &mut Vec<_>, prefix: &str, i: usize| {
            v.push((format!("{prefix}.gate_proj.weight"), vec![i, h], inv(h)));
            v.push((format!("{prefix}.up_proj.weight"), vec![i, h], inv(h)));
            v.push((format!("{prefix}.down_proj.weight"), vec![h, i], out(i)));
        };
        if !cfg.is_moe(l) {
            mlp(&mut v, &format!("{p}.mlp"), cfg.intermediate);
            continue;
        }
        v.push((
            format!("{p}.{}.weight", names.router()),
            vec![cfg.experts, h],
            inv(h),
        ));
        let i = cfg.moe_intermediate;
        for e in 0..cfg.experts {
            for (proj, shape, std) in [
                (Proj::Gate, vec![i, h], inv(h)),
                (Proj::Up, vec![i, h], inv(h)),
                (Proj::Down, vec![h, i], out(i)),
            ] {
                v.push((format!("{p}.{}.weight", names.expert(e, proj)), shape, std));
            }
        }
        if cfg.shared_intermediate > 0 {
            mlp(
                &mut v,
                &format!("{p}.mlp.shared_expert"),
                cfg.shared_intermediate,
            );
            v.push((
                format!("{p}.mlp.shared_expert_gate.weight"),
                vec![1, h],
                inv(h),
            ));
        }
    }
    v.push(("model.norm.weight".to_owned(), vec![h], None));
    if !cfg.tie_embeddings {
        v.push(("lm_head.weight".to_owned(), vec![cfg.vocab, h], inv(h)));
    }
    v
}

/// Seeded random weights for `cfg`, named as a checkpoint in `cfg.layout` would name them (f32,
/// on the host). The same seed gives the same tensors on every machine.
pub fn random(cfg: &ModelConfig, seed: u64) -> Result<Tensors, EngineError> {
    cfg.validate()?;
    let mut rng = SplitMix(seed);
    let mut map = HashMap::new();
    for (name, shape, std) in shapes(cfg) {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = match std {
            None => vec![1.0; n],
            // Uniform with the given standard deviation.
            Some(s) => (0..n).map(|_| rng.uniform(s * 3f32.sqrt())).collect(),
        };
        map.insert(name, Tensor::from_vec(data, shape, &Device::Cpu)?);
    }
    Ok(map)
}

/// About the bytes of host memory a run of `cfg` on `ranks` rank threads holds (`draft_copy`: a
/// precision draft, a second copy of the whole model at `dtype`'s width): the f32 weights, plus
/// half of them again for the ranks' shards that are copies (a row-parallel projection's
/// columns), plus the draft. Measured on the demo's shapes (`/usr/bin/time -f %M`): 1.03x the
/// f32 weights on one rank, 1.34-1.40x on four, 1.95x on four with an f16 draft; this rounds up.
/// `None` past [`ModelConfig::MAX_PARAMETERS`].
pub fn host_bytes(cfg: &ModelConfig, ranks: usize, draft_copy: Option<DType>) -> Option<u64> {
    let p = cfg.parameters()?;
    let shards = if ranks > 1 { p * 2 } else { 0 };
    let draft = draft_copy.map_or(0, |d| p * d.size_in_bytes() as u64);
    Some(p * 4 + shards + draft)
}

/// Writes `tensors` as a checkpoint directory: `config.json` and `model.safetensors` (candle's
/// safetensors writer).
pub fn save_checkpoint(
    dir: &Path,
    cfg: &ModelConfig,
    tensors: &Tensors,
) -> Result<(), EngineError> {
    let io = |e: std::io::Error| EngineError::Checkpoint(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let json = serde_json::to_string_pretty(&cfg.to_hf_json())
        .map_err(|e| EngineError::Checkpoint(e.to_string()))?;
    std::fs::write(dir.join("config.json"), json).map_err(io)?;
    candle_core::safetensors::save(tensors, dir.join("model.safetensors"))?;
    Ok(())
}

/// Reads a checkpoint directory: `config.json` and every `*.safetensors` file in it (sharded
/// checkpoints are several), onto the host.
pub fn load_checkpoint(dir: &Path) -> Result<(ModelConfig, Tensors), EngineError> {
    let cfg = ModelConfig::from_hf_dir(dir)?;
    let entries = std::fs::read_dir(dir)
        .map_err(|e| EngineError::Checkpoint(format!("{}: cannot list: {e}", dir.display())))?;
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(EngineError::Checkpoint(format!(
            "{}: no *.safetensors file",
            dir.display()
        )));
    }
    let mut map = HashMap::new();
    for f in files {
        let part = candle_core::safetensors::load(&f, &Device::Cpu)
            .map_err(|e| EngineError::Checkpoint(format!("{}: {e}", f.display())))?;
        map.extend(part);
    }
    Ok((cfg, map))
}

/// The model's tensors as a [`VarBuilder`] of `dtype` on `device` (what the model is built from).
pub(crate) fn var_builder(tensors: &Tensors, dtype: DType, device: &Device) -> VarBuilder<'static> {
    VarBuilder::from_tensors(tensors.clone(), dtype, device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Layout;

    #[test]
    fn the_parameter_count_is_the_tensors_element_count() {
        let moe = ModelConfig::default();
        for cfg in [
            moe.clone(),
            ModelConfig {
                attention_bias: true,
                tie_embeddings: true,
                shared_intermediate: 0,
                ..moe.clone()
            },
            ModelConfig {
                experts: 0,
                dense_layers: 12,
                layout: Layout::Llama,
                ..moe.clone()
            },
            ModelConfig {
                layout: Layout::Mixtral,
                shared_intermediate: 0,
                dense_layers: 0,
                ..moe
            },
        ] {
            let elements: usize = shapes(&cfg)
                .iter()
                .map(|(_, s, _)| s.iter().product::<usize>())
                .sum();
            assert_eq!(cfg.parameters(), Some(elements as u64), "{cfg:?}");
        }
    }

    #[test]
    fn shapes_past_any_model_are_refused_before_anything_is_allocated() {
        for cfg in [
            ModelConfig {
                layers: 1 << 20,
                experts: 1 << 16,
                top_k: 8,
                ..ModelConfig::default()
            },
            ModelConfig {
                hidden: usize::MAX / 2,
                ..ModelConfig::default()
            },
            ModelConfig {
                vocab: usize::MAX,
                ..ModelConfig::default()
            },
        ] {
            assert_eq!(cfg.parameters(), None);
            let e = random(&cfg, 1).expect_err("refused").to_string();
            assert!(e.contains("parameters"), "{e}");
        }
    }
}
