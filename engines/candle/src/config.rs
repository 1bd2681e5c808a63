//! The model's shapes: built from flags ([`ModelConfig::default`] and its setters), or read from a
//! Hugging Face `config.json` (Llama / Mistral / Qwen2 dense, Qwen2-MoE and Mixtral sparse).

use crate::EngineError;
use serde::Deserialize;
use std::path::Path;

/// How a checkpoint names its tensors: one of the Hugging Face layouts the loader reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `model.layers.N.mlp.{gate,up,down}_proj` (Llama, Mistral, Qwen2): dense layers only.
    Llama,
    /// `model.layers.N.mlp.gate` (router), `mlp.experts.E.{gate,up,down}_proj`,
    /// `mlp.shared_expert.*` and `mlp.shared_expert_gate`, dense layers named as in Llama.
    Qwen2Moe,
    /// `model.layers.N.block_sparse_moe.gate` (router) and `block_sparse_moe.experts.E.w{1,2,3}`.
    Mixtral,
}

impl Layout {
    /// The `model_type` this layout writes into `config.json`.
    pub const fn model_type(self) -> &'static str {
        match self {
            Layout::Llama => "llama",
            Layout::Qwen2Moe => "qwen2_moe",
            Layout::Mixtral => "mixtral",
        }
    }
}

/// A decoder's shapes. Every layer is attention + either a dense SwiGLU MLP or an MoE block.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Vocabulary size (embedding rows, LM head columns).
    pub vocab: usize,
    /// Model width.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention: `heads` is a multiple of it).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Dense MLP width.
    pub intermediate: usize,
    /// Leading dense layers; the others are MoE layers when `experts > 0`.
    pub dense_layers: usize,
    /// Routed experts per MoE layer (0: a dense model).
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// One routed expert's MLP width.
    pub moe_intermediate: usize,
    /// The shared expert's MLP width (0: no shared expert).
    pub shared_intermediate: usize,
    /// Renormalise the top-k routing weights to sum to 1 (Mixtral; Qwen2-MoE's `norm_topk_prob`).
    pub norm_topk: bool,
    /// Biases on the q/k/v projections (Qwen2).
    pub attention_bias: bool,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// The LM head is the embedding's transpose.
    pub tie_embeddings: bool,
    /// How the tensors are named (random weights are generated in this layout).
    pub layout: Layout,
    /// End-of-sequence token ids: a sequence that generates one ends there (a request with
    /// finish reason `stop`). A checkpoint's `eos_token_id` (its `generation_config.json`'s when
    /// that file has one, else `config.json`'s); none for random weights, whose requests end
    /// at their drawn length instead.
    pub eos: Vec<u32>,
}

impl Default for ModelConfig {
    /// The demo's default (`phasetrace demo --engine candle` without model flags): 12 layers, 1
    /// dense and 11 MoE with 64 experts, top-8 and a shared expert; width 256 with 8 query and 4
    /// key/value heads; a 4096-token vocabulary; about 35 M parameters.
    fn default() -> Self {
        ModelConfig {
            vocab: 4096,
            hidden: 256,
            layers: 12,
            heads: 8,
            kv_heads: 4,
            head_dim: 32,
            intermediate: 512,
            dense_layers: 1,
            experts: 64,
            top_k: 8,
            moe_intermediate: 64,
            shared_intermediate: 256,
            norm_topk: false,
            attention_bias: false,
            rms_eps: 1e-6,
            rope_theta: 10_000.0,
            tie_embeddings: false,
            layout: Layout::Qwen2Moe,
            eos: Vec::new(),
        }
    }
}

/// The fields of a Hugging Face `config.json` the loader reads (others are ignored).
#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: usize,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    // Qwen2-MoE
    num_experts: Option<usize>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    // Mixtral
    num_local_experts: Option<usize>,
    // both
    num_experts_per_tok: Option<usize>,
    eos_token_id: Option<serde_json::Value>,
}

/// `eos_token_id` as Hugging Face writes it: one id, a list of ids, or `null` (none).
fn eos_ids(v: Option<serde_json::Value>) -> Result<Vec<u32>, String> {
    let id = |x: &serde_json::Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
    let bad = |v: &serde_json::Value| {
        format!("eos_token_id {v}: expected a token id, a list of token ids or null")
    };
    match v {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(xs)) => {
            xs.iter().map(|x| id(x).ok_or_else(|| bad(x))).collect()
        }
        Some(x) => id(&x).map(|n| vec![n]).ok_or_else(|| bad(&x)),
    }
}

/// The one field of a `generation_config.json` the loader reads.
#[derive(Debug, Deserialize)]
struct GenerationConfig {
    eos_token_id: Option<serde_json::Value>,
}

impl ModelConfig {
    /// Whether layer `layer` is an MoE layer.
    pub fn is_moe(&self, layer: usize) -> bool {
        self.experts > 0 && layer >= self.dense_layers
    }

    /// Most parameters a model may have: shapes beyond it are a typo, not a model (the
    /// largest open models have about 10^12), and every tensor's element count then fits.
    pub const MAX_PARAMETERS: u64 = 1 << 42;

    /// The model's parameter count (every tensor of its layout, biases included); `None` when
    /// it exceeds [`ModelConfig::MAX_PARAMETERS`].
    pub fn parameters(&self) -> Option<u64> {
        // Checked throughout: the figures come from flags and files.
        let mul = |xs: &[usize]| {
            xs.iter()
                .try_fold(1u64, |a, &x| a.checked_mul(u64::try_from(x).ok()?))
        };
        let add = |xs: &[Option<u64>]| xs.iter().try_fold(0u64, |a, x| a.checked_add((*x)?));
        let h = self.hidden;
        let rows = add(&[
            mul(&[self.heads, self.head_dim]),
            mul(&[2, self.kv_heads, self.head_dim]),
        ]);
        let attention = add(&[
            mul(&[2, h]),
            rows.and_then(|r| {
                r.checked_mul(u64::try_from(h).ok()? + u64::from(self.attention_bias))
            }),
            mul(&[h, self.heads, self.head_dim]),
        ]);
        let dense = add(&[attention, mul(&[3, h, self.intermediate])]);
        let shared = match self.shared_intermediate {
            0 => Some(0),
            s => add(&[mul(&[3, h, s]), Some(h as u64)]),
        };
        let moe = add(&[
            attention,
            mul(&[self.experts, h]),
            mul(&[self.experts, 3, h, self.moe_intermediate]),
            shared,
        ]);
        let sparse = if self.experts > 0 {
            self.layers.saturating_sub(self.dense_layers)
        } else {
            0
        };
        let n = add(&[
            mul(&[self.vocab, h]),
            Some(h as u64),
            if self.tie_embeddings {
                Some(0)
            } else {
                mul(&[self.vocab, h])
            },
            dense.and_then(|d| d.checked_mul((self.layers - sparse) as u64)),
            moe.and_then(|m| m.checked_mul(sparse as u64)),
        ]);
        n.filter(|&n| n <= Self::MAX_PARAMETERS)
    }

    /// Checks the shapes, naming the first that cannot work (and why).
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |what: String| Err(EngineError::Config(what));
        if self.vocab == 0 || self.hidden == 0 || self.layers == 0 || self.head_dim == 0 {
            return bad("vocab, hidden, layers and head_dim must be positive".into());
        }
        if self.parameters().is_none() {
            return bad(format!(
                "{} layers of width {} ({} experts of width {}, vocabulary {}): more than {} parameters",
                self.layers,
                self.hidden,
                self.experts,
                self.moe_intermediate,
                self.vocab,
                Self::MAX_PARAMETERS
            ));
        }
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "heads {} must be a positive multiple of kv_heads {}",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {}: RoPE needs an even head width",
                self.head_dim
            ));
        }
        if self.experts > 0 && (self.top_k == 0 || self.top_k > self.experts) {
            return bad(format!(
                "top_k {}: expected 1 to experts ({})",
                self.top_k, self.experts
            ));
        }
        if self.experts > 0 && self.moe_intermediate == 0 {
            return bad("moe_intermediate must be positive in an MoE model".into());
        }
        if self.experts > 0 && self.layout == Layout::Llama {
            return bad("the Llama layout has no MoE layers (experts must be 0)".into());
        }
        if self.experts == 0 && self.layout != Layout::Llama {
            return bad(format!(
                "the {} layout needs experts > 0",
                self.layout.model_type()
            ));
        }
        if self.layout == Layout::Mixtral && self.shared_intermediate > 0 {
            return bad("the Mixtral layout has no shared expert".into());
        }
        if let Some(&id) = self.eos.iter().find(|&&id| id as usize >= self.vocab) {
            return bad(format!(
                "end-of-sequence token {id}: expected an id below the vocabulary size {}",
                self.vocab
            ));
        }
        Ok(())
    }

    /// Checks that `ranks` tensor-parallel shards divide the heads and MLP widths.
    pub fn check_ranks(&self, ranks: usize) -> Result<(), EngineError> {
        let mut widths = vec![
            ("kv_heads", self.kv_heads),
            ("intermediate", self.intermediate),
        ];
        if self.experts > 0 {
            widths.push(("moe_intermediate", self.moe_intermediate));
            if self.shared_intermediate > 0 {
                widths.push(("shared_intermediate", self.shared_intermediate));
            }
        }
        for (what, n) in widths {
            if ranks == 0 || !n.is_multiple_of(ranks) {
                return Err(EngineError::Config(format!(
                    "{ranks} ranks: {what} {n} is not a multiple of the rank count (each rank holds an equal shard)"
                )));
            }
        }
        Ok(())
    }

    /// Reads `dir/config.json`.
    pub fn from_hf_dir(dir: &Path) -> Result<ModelConfig, EngineError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            EngineError::Checkpoint(format!("{}: cannot read: {e}", path.display()))
        })?;
        let mut cfg = ModelConfig::from_hf_json(&text)
            .map_err(|e| EngineError::Checkpoint(format!("{}: {e}", path.display())))?;
        // Generation reads its end-of-sequence ids from generation_config.json where there is
        // one (as `transformers`' `generate` does), else from config.json.
        let gen_path = dir.join("generation_config.json");
        match std::fs::read_to_string(&gen_path) {
            Ok(text) => {
                if let Some(eos) = eos_from_generation_config(&text)
                    .map_err(|e| EngineError::Checkpoint(format!("{}: {e}", gen_path.display())))?
                {
                    cfg.eos = eos;
                    cfg.validate().map_err(|e| {
                        EngineError::Checkpoint(format!("{}: {e}", gen_path.display()))
                    })?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(EngineError::Checkpoint(format!(
                    "{}: cannot read: {e}",
                    gen_path.display()
                )));
            }
        }
        Ok(cfg)
    }

    /// Parses a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<ModelConfig, String> {
        let c: HfConfig = serde_json::from_str(text).map_err(|e| {
            format!("not a decoder config ({e}); expected vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size")
        })?;
        let model_type = c.model_type.as_deref().unwrap_or("llama");
        let layout = match model_type {
            "llama" | "mistral" | "qwen2" => Layout::Llama,
            "qwen2_moe" => Layout::Qwen2Moe,
            "mixtral" => Layout::Mixtral,
            other => {
                return Err(format!(
                    "model_type {other:?}: expected llama, mistral, qwen2, qwen2_moe or mixtral"
                ));
            }
        };
        let heads = c.num_attention_heads;
        let head_dim = c.head_dim.unwrap_or(c.hidden_size / heads.max(1));
        let mut cfg = ModelConfig {
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            layers: c.num_hidden_layers,
            heads,
            kv_heads: c.num_key_value_heads.unwrap_or(heads),
            head_dim,
            intermediate: c.intermediate_size,
            dense_layers: c.num_hidden_layers,
            experts: 0,
            top_k: 0,
            moe_intermediate: 0,
            shared_intermediate: 0,
            norm_topk: false,
            attention_bias: c.attention_bias.unwrap_or(model_type.starts_with("qwen2")),
            rms_eps: c.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: c.rope_theta.unwrap_or(10_000.0),
            tie_embeddings: c.tie_word_embeddings.unwrap_or(false),
            layout,
            eos: eos_ids(c.eos_token_id)?,
        };
        match layout {
            Layout::Llama => {}
            Layout::Qwen2Moe => {
                cfg.experts = c.num_experts.ok_or("qwen2_moe: num_experts missing")?;
                cfg.top_k = c.num_experts_per_tok.unwrap_or(4);
                cfg.moe_intermediate = c
                    .moe_intermediate_size
                    .ok_or("qwen2_moe: moe_intermediate_size missing")?;
                cfg.shared_intermediate = c.shared_expert_intermediate_size.unwrap_or(0);
                cfg.norm_topk = c.norm_topk_prob.unwrap_or(false);
                // This engine's MoE layers are the trailing ones: the dense layers lead.
                let step = c.decoder_sparse_step.unwrap_or(1);
                let dense = c.mlp_only_layers.unwrap_or_default();
                let lead = (0..cfg.layers)
                    .take_while(|l| dense.contains(l) || !(l + 1).is_multiple_of(step.max(1)))
                    .count();
                let sparse_after = (lead..cfg.layers)
                    .all(|l| !dense.contains(&l) && (l + 1).is_multiple_of(step.max(1)));
                if !sparse_after {
                    return Err(format!(
                        "qwen2_moe: decoder_sparse_step {step} and mlp_only_layers {dense:?} interleave dense and MoE layers; this engine reads leading dense layers then MoE layers only"
                    ));
                }
                cfg.dense_layers = lead;
            }
            Layout::Mixtral => {
                cfg.experts = c
                    .num_local_experts
                    .ok_or("mixtral: num_local_experts missing")?;
                cfg.top_k = c.num_experts_per_tok.unwrap_or(2);
                cfg.moe_intermediate = c.intermediate_size;
                cfg.norm_topk = true;
                cfg.dense_layers = 0;
            }
        }
        cfg.validate().map_err(|e| e.to_string())?;
        Ok(cfg)
    }

    /// The `config.json` of this model in its layout (what [`crate::weights::save_checkpoint`]
    /// writes).
    pub fn to_hf_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "model_type": self.layout.model_type(),
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "rms_norm_eps": self.rms_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_embeddings,
            "attention_bias": self.attention_bias,
        });
        if !self.eos.is_empty() {
            v["eos_token_id"] = match self.eos.as_slice() {
                [one] => (*one).into(),
                many => many.to_vec().into(),
            };
        }
        match self.layout {
            Layout::Llama => {}
            Layout::Qwen2Moe => {
                v["num_experts"] = self.experts.into();
                v["num_experts_per_tok"] = self.top_k.into();
                v["moe_intermediate_size"] = self.moe_intermediate.into();
                v["shared_expert_intermediate_size"] = self.shared_intermediate.into();
                v["norm_topk_prob"] = self.norm_topk.into();
                v["decoder_sparse_step"] = 1.into();
                v["mlp_only_layers"] = (0..self.dense_layers).collect::<Vec<_>>().into();
            }
            Layout::Mixtral => {
                v["num_local_experts"] = self.experts.into();
                v["num_experts_per_tok"] = self.top_k.into();
                v["intermediate_size"] = self.moe_intermediate.into();
            }
        }
        v
    }
}

/// The end-of-sequence ids of a `generation_config.json` (`None`: it names none).
fn eos_from_generation_config(text: &str) -> Result<Option<Vec<u32>>, String> {
    let g: GenerationConfig = serde_json::from_str(text).map_err(|e| {
        format!("not a generation config ({e}); expected an object whose eos_token_id is an id or a list of ids")
    })?;
    match g.eos_token_id {
        None | Some(serde_json::Value::Null) => Ok(None),
        v => eos_ids(v).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"{"model_type": "llama", "vocab_size": 100, "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64"#;

    fn with(extra: &str) -> Result<ModelConfig, String> {
        ModelConfig::from_hf_json(&format!("{LLAMA}{extra}}}"))
    }

    #[test]
    fn eos_token_id_is_read_as_one_id_a_list_or_none() {
        assert_eq!(with("").expect("no eos").eos, Vec::<u32>::new());
        assert_eq!(
            with(r#", "eos_token_id": null"#).expect("null").eos,
            Vec::<u32>::new()
        );
        assert_eq!(with(r#", "eos_token_id": 7"#).expect("one").eos, vec![7]);
        assert_eq!(
            with(r#", "eos_token_id": [7, 9]"#).expect("a list").eos,
            vec![7, 9]
        );
    }

    #[test]
    fn an_eos_token_id_that_cannot_be_a_token_is_refused_naming_it() {
        let e = with(r#", "eos_token_id": 100"#).expect_err("not below the vocabulary");
        assert!(
            e.contains("end-of-sequence token 100") && e.contains("100"),
            "{e}"
        );
        for bad in [r#""</s>""#, "-1", "[2, 1.5]", "4294967296"] {
            let e = with(&format!(r#", "eos_token_id": {bad}"#)).expect_err(bad);
            assert!(
                e.contains("eos_token_id") && e.contains("expected a token id"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_eos_ids_survive_the_config_json_round_trip() {
        for eos in [vec![], vec![3], vec![3, 5]] {
            let cfg = ModelConfig {
                eos: eos.clone(),
                ..ModelConfig::default()
            };
            let back = ModelConfig::from_hf_json(&cfg.to_hf_json().to_string()).expect("read back");
            assert_eq!(back.eos, eos);
        }
    }

    #[test]
    fn a_generation_config_names_its_eos_ids_or_none() {
        assert_eq!(
            eos_from_generation_config(r#"{"eos_token_id": [1, 2], "do_sample": true}"#),
            Ok(Some(vec![1, 2]))
        );
        assert_eq!(
            eos_from_generation_config(r#"{"temperature": 0.7}"#),
            Ok(None)
        );
        let e = eos_from_generation_config(r#"{"eos_token_id": "#).expect_err("half-written");
        assert!(e.contains("not a generation config"), "{e}");
    }
}
