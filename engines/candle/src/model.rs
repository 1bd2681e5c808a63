//! The decoder, one tensor-parallel shard of it, and its instrumented forward pass.
//!
//! ```text
//! tokens ─embed─> x ─┬─ per layer ───────────────────────────────────────────────────────┐
//!                    │  norm ─ qkv ─ rope ─ attention (KV cache) ─ o_proj ─ all-reduce(+x) │
//!                    │  norm ─ mlp_dense | moe_router ─ moe_hostsync ─ moe_experts          │
//!                    │                     ─ moe_shared ─ all-reduce(+x)                    │
//!                    └─> norm ─ lm_head ─ sample ─> token ids                              ┘
//! ```
//!
//! A rank holds its shard: the query and key/value heads `r/N` of every layer (column-parallel
//! q/k/v, row-parallel o_proj), the columns `r/N` of every MLP and expert (column-parallel
//! gate/up, row-parallel down). Each block ends in a partial output that the all-reduce sums
//! across ranks; the residual add happens inside the all-reduce section. The router, norms,
//! embedding and LM head are replicated.
//!
//! A forward runs a batch of sequences ([`Seq`], continuous batching): their new tokens are
//! the rows of one matrix through every row-wise operation, and RoPE and attention run per
//! sequence, each at its own positions and over its own KV cache.

use crate::config::ModelConfig;
use crate::instrument::Ctx;
use crate::weights::{Names, Proj, mlp_name};
use candle_core::{D, DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use phasetrace::{Layer, Section, Site, VerifyPart};

/// A rank's place in the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This rank.
    pub rank: usize,
    /// Ranks in the group.
    pub ranks: usize,
}

impl Shard {
    /// The whole model on one rank.
    pub const WHOLE: Shard = Shard { rank: 0, ranks: 1 };

    /// This rank's slice of `n` along `dim` of `t`, contiguous.
    fn split(self, t: &Tensor, dim: usize, n: usize) -> Result<Tensor> {
        let len = n / self.ranks;
        t.narrow(dim, self.rank * len, len)?.contiguous()
    }
}

/// A matrix applied as `x W^T (+ b)`.
#[derive(Clone, Debug)]
struct Proj2 {
    w: Tensor,
    b: Option<Tensor>,
}

impl Proj2 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.w.t()?)?;
        match &self.b {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    fn to_dtype(&self, dtype: DType) -> Result<Proj2> {
        Ok(Proj2 {
            w: self.w.to_dtype(dtype)?,
            b: self.b.as_ref().map(|b| b.to_dtype(dtype)).transpose()?,
        })
    }
}

/// A SwiGLU MLP shard: `down(silu(gate x) * up x)`, a partial output.
#[derive(Clone, Debug)]
struct Mlp {
    gate: Proj2,
    up: Proj2,
    down: Proj2,
}

impl Mlp {
    fn load(vb: &VarBuilder, names: [String; 3], i: usize, h: usize, s: Shard) -> Result<Mlp> {
        let [g, u, d] = names;
        let m = |w: Tensor| Proj2 { w, b: None };
        Ok(Mlp {
            gate: m(s.split(&vb.get((i, h), &format!("{g}.weight"))?, 0, i)?),
            up: m(s.split(&vb.get((i, h), &format!("{u}.weight"))?, 0, i)?),
            down: m(s.split(&vb.get((h, i), &format!("{d}.weight"))?, 1, i)?),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = candle_nn::ops::silu(&self.gate.forward(x)?)?;
        self.down.forward(&(g * self.up.forward(x)?)?)
    }

    fn to_dtype(&self, dtype: DType) -> Result<Mlp> {
        Ok(Mlp {
            gate: self.gate.to_dtype(dtype)?,
            up: self.up.to_dtype(dtype)?,
            down: self.down.to_dtype(dtype)?,
        })
    }
}

#[derive(Clone, Debug)]
struct Attention {
    q: Proj2,
    k: Proj2,
    v: Proj2,
    o: Proj2,
    /// This rank's query heads and key/value heads.
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

#[derive(Clone, Debug)]
struct Moe {
    router: Tensor,
    experts: Vec<Mlp>,
    shared: Option<(Mlp, Tensor)>,
    top_k: usize,
    norm_topk: bool,
}

#[derive(Clone, Debug)]
enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

#[derive(Clone, Debug)]
struct Block {
    ln1: Tensor,
    attn: Attention,
    ln2: Tensor,
    ffn: Ffn,
}

/// One rank's shard of the decoder, in one dtype on one device.
#[derive(Clone, Debug)]
pub struct Model {
    cfg: ModelConfig,
    shard: Shard,
    dtype: DType,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    head: Tensor,
    cos: Tensor,
    sin: Tensor,
}

/// A key/value cache per layer: `[kv_heads, positions, head_dim]` tensors, grown by
/// concatenation and rolled back by truncation.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    kv: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    /// An empty cache for `layers` layers.
    pub fn new(layers: usize) -> KvCache {
        KvCache {
            kv: vec![None; layers],
            len: 0,
        }
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every position from `len` on (speculative rollback).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len >= self.len {
            return Ok(());
        }
        for (k, v) in self.kv.iter_mut().flatten() {
            *k = k.narrow(1, 0, len)?;
            *v = v.narrow(1, 0, len)?;
        }
        self.len = len;
        Ok(())
    }
}

/// One sequence of a batched forward: its new tokens and its cache (which the forward grows).
#[derive(Debug)]
pub struct Seq<'s> {
    /// The tokens to run, at the positions after the cache.
    pub tokens: &'s [u32],
    /// The sequence's KV cache.
    pub cache: &'s mut KvCache,
}

/// Where a sequence sits in a batch: its first row, its new tokens, the positions cached
/// before them, its causal mask.
#[derive(Debug)]
struct Rows {
    row: usize,
    t: usize,
    pos: usize,
    mask: Option<Tensor>,
}

impl Model {
    /// Builds rank `shard`'s part of the model from `vb` (random weights or a checkpoint),
    /// with RoPE tables for `max_positions`.
    pub fn load(
        vb: &VarBuilder,
        cfg: &ModelConfig,
        shard: Shard,
        max_positions: usize,
    ) -> Result<Model> {
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let embed = vb.get((cfg.vocab, h), "model.embed_tokens.weight")?;
        let mut blocks = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let lb = vb.pp(Names::layer(l));
            let a = lb.pp("self_attn");
            let proj = |name: &str, rows: usize| -> Result<Proj2> {
                let w = shard.split(&a.get((rows, h), &format!("{name}.weight"))?, 0, rows)?;
                let b = if cfg.attention_bias {
                    Some(shard.split(&a.get(rows, &format!("{name}.bias"))?, 0, rows)?)
                } else {
                    None
                };
                Ok(Proj2 { w, b })
            };
            let attn = Attention {
                q: proj("q_proj", cfg.heads * hd)?,
                k: proj("k_proj", cfg.kv_heads * hd)?,
                v: proj("v_proj", cfg.kv_heads * hd)?,
                o: Proj2 {
                    w: shard.split(
                        &a.get((h, cfg.heads * hd), "o_proj.weight")?,
                        1,
                        cfg.heads * hd,
                    )?,
                    b: None,
                },
                heads: cfg.heads / shard.ranks,
                kv_heads: cfg.kv_heads / shard.ranks,
                head_dim: hd,
            };
            let ffn = load_ffn(&lb, cfg, shard, l)?;
            blocks.push(Block {
                ln1: lb.get(h, "input_layernorm.weight")?,
                attn,
                ln2: lb.get(h, "post_attention_layernorm.weight")?,
                ffn,
            });
        }
        let norm = vb.get(h, "model.norm.weight")?;
        let head = if cfg.tie_embeddings {
            embed.clone()
        } else {
            vb.get((cfg.vocab, h), "lm_head.weight")?
        };
        let (cos, sin) = rope_tables(cfg, max_positions, vb.dtype(), vb.device())?;
        Ok(Model {
            cfg: cfg.clone(),
            shard,
            dtype: vb.dtype(),
            embed,
            blocks,
            norm,
            head,
            cos,
            sin,
        })
    }

    /// The same shard in another dtype (the lower-precision draft).
    pub fn to_dtype(&self, dtype: DType) -> Result<Model> {
        let t = |x: &Tensor| x.to_dtype(dtype);
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                let a = &b.attn;
                Ok(Block {
                    ln1: t(&b.ln1)?,
                    attn: Attention {
                        q: a.q.to_dtype(dtype)?,
                        k: a.k.to_dtype(dtype)?,
                        v: a.v.to_dtype(dtype)?,
                        o: a.o.to_dtype(dtype)?,
                        ..a.clone()
                    },
                    ln2: t(&b.ln2)?,
                    ffn: match &b.ffn {
                        Ffn::Dense(m) => Ffn::Dense(m.to_dtype(dtype)?),
                        Ffn::Moe(m) => Ffn::Moe(Moe {
                            router: t(&m.router)?,
                            experts: m
                                .experts
                                .iter()
                                .map(|e| e.to_dtype(dtype))
                                .collect::<Result<_>>()?,
                            shared: m
                                .shared
                                .as_ref()
                                .map(|(s, g)| {
                                    Ok::<_, candle_core::Error>((s.to_dtype(dtype)?, t(g)?))
                                })
                                .transpose()?,
                            ..m.clone()
                        }),
                    },
                })
            })
            .collect::<Result<_>>()?;
        Ok(Model {
            cfg: self.cfg.clone(),
            shard: self.shard,
            dtype,
            embed: t(&self.embed)?,
            blocks,
            norm: t(&self.norm)?,
            head: t(&self.head)?,
            cos: t(&self.cos)?,
            sin: t(&self.sin)?,
        })
    }

    /// The model's shapes.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        self.embed.device()
    }

    /// Runs `tokens` (at the positions after `cache`) through the first `depth` layers, the
    /// final norm and the LM head, and returns the greedy next token after each position.
    /// Every section is recorded through `ctx`; every all-reduce meets the other ranks.
    pub fn forward(
        &self,
        ctx: &mut Ctx<'_, '_>,
        tokens: &[u32],
        cache: &mut KvCache,
        depth: usize,
    ) -> Result<Vec<u32>> {
        let mut one = [Seq { tokens, cache }];
        let mut out = self.forward_batch(ctx, &mut one, depth)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// [`Model::forward`] over a batch (continuous batching): every sequence's new tokens
    /// after its own cache, in one pass. The row-wise work (norms, projections, MLP and MoE,
    /// all-reduces, LM head) runs on the batch's tokens as one matrix; RoPE and attention run
    /// per sequence, each at its positions and over its cache. Returns each sequence's greedy
    /// next tokens.
    pub fn forward_batch(
        &self,
        ctx: &mut Ctx<'_, '_>,
        seqs: &mut [Seq<'_>],
        depth: usize,
    ) -> Result<Vec<Vec<u32>>> {
        let logits = self.logits_batch(ctx, seqs, depth)?;
        let ids = ctx.run(ctx.sections.sample, Layer::NONE, Site::NONE, || {
            logits.argmax(D::Minus1)?.to_vec1::<u32>()
        })?;
        let mut rest = ids.as_slice();
        Ok(seqs
            .iter()
            .map(|s| {
                let (now, later) = rest.split_at(s.tokens.len().min(rest.len()));
                rest = later;
                now.to_vec()
            })
            .collect())
    }

    /// What [`Model::forward`] samples from: the logits after each position, `[t, vocab]` f32.
    pub fn logits(
        &self,
        ctx: &mut Ctx<'_, '_>,
        tokens: &[u32],
        cache: &mut KvCache,
        depth: usize,
    ) -> Result<Tensor> {
        self.logits_batch(ctx, &mut [Seq { tokens, cache }], depth)
    }

    /// What [`Model::forward_batch`] samples from: the logits after each position of each
    /// sequence, in order, `[tokens, vocab]` f32.
    pub fn logits_batch(
        &self,
        ctx: &mut Ctx<'_, '_>,
        seqs: &mut [Seq<'_>],
        depth: usize,
    ) -> Result<Tensor> {
        let s = ctx.sections;
        if seqs.iter().any(|q| q.tokens.is_empty()) || seqs.is_empty() {
            return Err(candle_core::Error::Msg(
                "a forward over a sequence of no tokens".into(),
            ));
        }
        let mut x = ctx.run(s.embed, Layer::NONE, Site::NONE, || {
            let ids: Vec<u32> = seqs.iter().flat_map(|q| q.tokens.iter().copied()).collect();
            let ids = Tensor::new(ids.as_slice(), self.device())?;
            self.embed.index_select(&ids, 0)
        })?;
        // Each sequence's rows of the batch, its positions, and its causal mask (a sequence
        // of one new token attends to everything cached).
        let mut spans = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for q in seqs.iter() {
            let t = q.tokens.len();
            let mask = if t > 1 {
                Some(causal_mask(t, q.cache.len, self.dtype, self.device())?)
            } else {
                None
            };
            spans.push(Rows {
                row,
                t,
                pos: q.cache.len,
                mask,
            });
            row += t;
        }
        for (l, b) in self.blocks.iter().take(depth).enumerate() {
            let layer = Layer(l as u32);
            x = self.attention_block(ctx, b, layer, &x, seqs, &spans)?;
            x = self.ffn_block(ctx, b, layer, &x)?;
        }
        for (q, r) in seqs.iter_mut().zip(&spans) {
            q.cache.len = r.pos + r.t;
        }
        let x = ctx.run(Section::NORM, Layer::NONE, Site::NONE, || {
            candle_nn::ops::rms_norm(&x, &self.norm, self.cfg.rms_eps as f32)
        })?;
        ctx.run(s.lm_head, Layer::NONE, Site::NONE, || {
            x.matmul(&self.head.t()?)?.to_dtype(DType::F32)
        })
    }

    fn attention_block(
        &self,
        ctx: &mut Ctx<'_, '_>,
        b: &Block,
        layer: Layer,
        x: &Tensor,
        seqs: &mut [Seq<'_>],
        spans: &[Rows],
    ) -> Result<Tensor> {
        let s = ctx.sections;
        let a = &b.attn;
        let part = ctx.verify_part(VerifyPart::Mla);
        let h = ctx.run(Section::NORM, layer, Site::NONE, || {
            candle_nn::ops::rms_norm(x, &b.ln1, self.cfg.rms_eps as f32)
        })?;
        let (q, k, v) = ctx.run(s.qkv, layer, Site::ATTN, || {
            Ok((a.q.forward(&h)?, a.k.forward(&h)?, a.v.forward(&h)?))
        })?;
        // Per sequence: its rows as heads, `[1, n, t, hd]`, rotated at its positions.
        let rotated = ctx.run(s.rope, layer, Site::ATTN, || {
            spans
                .iter()
                .map(|r| {
                    let heads = |m: &Tensor, n: usize| {
                        m.narrow(0, r.row, r.t)?
                            .reshape((r.t, n, a.head_dim))?
                            .transpose(0, 1)?
                            .contiguous()?
                            .unsqueeze(0)
                    };
                    let cos = self.cos.narrow(0, r.pos, r.t)?;
                    let sin = self.sin.narrow(0, r.pos, r.t)?;
                    Ok((
                        candle_nn::rotary_emb::rope(&heads(&q, a.heads)?, &cos, &sin)?,
                        candle_nn::rotary_emb::rope(&heads(&k, a.kv_heads)?, &cos, &sin)?,
                        heads(&v, a.kv_heads)?,
                    ))
                })
                .collect::<Result<Vec<_>>>()
        })?;
        let l = layer.0 as usize;
        let attended = ctx.run(s.attention, layer, Site::ATTN, || {
            rotated
                .iter()
                .zip(spans)
                .zip(seqs.iter())
                .map(|(((q, k, v), r), seq)| {
                    let slot = seq.cache.kv.get(l).and_then(Option::as_ref);
                    attend(a, q, k, v, slot, r.mask.as_ref(), r.t)
                })
                .collect::<Result<Vec<_>>>()
        })?;
        let mut ys = Vec::with_capacity(attended.len());
        // The caches grow once, whatever a straggler repeats.
        for ((y, k_all, v_all), seq) in attended.into_iter().zip(seqs.iter_mut()) {
            if let Some(slot) = seq.cache.kv.get_mut(l) {
                *slot = Some((k_all, v_all));
            }
            ys.push(y);
        }
        // One sequence (plain decode): its rows as they are, no copy.
        let y = match ys.as_slice() {
            [one] => one.clone(),
            _ => Tensor::cat(&ys, 0)?,
        };
        let partial = ctx.run(s.o_proj, layer, Site::ATTN, || a.o.forward(&y))?;
        drop(part);
        all_reduce(ctx, layer, Site::ATTN, &partial, x)
    }

    fn ffn_block(
        &self,
        ctx: &mut Ctx<'_, '_>,
        b: &Block,
        layer: Layer,
        x: &Tensor,
    ) -> Result<Tensor> {
        let part = ctx.verify_part(VerifyPart::Ffn);
        let h = ctx.run(Section::NORM, layer, Site::NONE, || {
            candle_nn::ops::rms_norm(x, &b.ln2, self.cfg.rms_eps as f32)
        })?;
        let partial = match &b.ffn {
            Ffn::Dense(m) => ctx.run(Section::MLP_DENSE, layer, Site::MLP, || m.forward(&h))?,
            Ffn::Moe(m) => moe_forward(ctx, m, layer, &h)?,
        };
        drop(part);
        all_reduce(ctx, layer, Site::MLP, &partial, x)
    }
}

/// Layer `l`'s MLP (or MoE block: router, routed experts, shared expert) from its weights under
/// `lb`, this rank's shard of it.
fn load_ffn(lb: &VarBuilder, cfg: &ModelConfig, shard: Shard, l: usize) -> Result<Ffn> {
    let h = cfg.hidden;
    let names = Names { layout: cfg.layout };
    let dense_names =
        |p: &str| [Proj::Gate, Proj::Up, Proj::Down].map(|x| format!("{p}.{}", mlp_name(x)));
    if cfg.is_moe(l) {
        let experts = (0..cfg.experts)
            .map(|e| {
                let n = [Proj::Gate, Proj::Up, Proj::Down].map(|p| names.expert(e, p));
                Mlp::load(lb, n, cfg.moe_intermediate, h, shard)
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = if cfg.shared_intermediate > 0 {
            let m = Mlp::load(
                lb,
                dense_names("mlp.shared_expert"),
                cfg.shared_intermediate,
                h,
                shard,
            )?;
            Some((m, lb.get((1, h), "mlp.shared_expert_gate.weight")?))
        } else {
            None
        };
        Ok(Ffn::Moe(Moe {
            router: lb.get((cfg.experts, h), &format!("{}.weight", names.router()))?,
            experts,
            shared,
            top_k: cfg.top_k,
            norm_topk: cfg.norm_topk,
        }))
    } else {
        Ok(Ffn::Dense(Mlp::load(
            lb,
            dense_names("mlp"),
            cfg.intermediate,
            h,
            shard,
        )?))
    }
}

/// One sequence's attention over its cache and its `t` new positions: the new keys and values
/// appended, grouped-query scores, the causal mask, softmax and the weighted sum. Returns the
/// output rows `[t, heads * hd]` and the grown keys and values.
fn attend(
    a: &Attention,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cached: Option<&(Tensor, Tensor)>,
    mask: Option<&Tensor>,
    t: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (k, v) = (k.squeeze(0)?, v.squeeze(0)?);
    let (k_all, v_all) = match cached {
        Some((kc, vc)) => (Tensor::cat(&[kc, &k], 1)?, Tensor::cat(&[vc, &v], 1)?),
        None => (k, v),
    };
    let rep = a.heads / a.kv_heads;
    let total = k_all.dim(1)?;
    // Grouped-query attention: the `rep` query heads of a key/value head attend as one
    // matrix of `rep * t` rows.
    let q = q.reshape((a.kv_heads, rep * t, a.head_dim))?;
    let scale = 1.0 / (a.head_dim as f64).sqrt();
    let mut att = (q.matmul(&k_all.t()?)? * scale)?;
    if let Some(m) = mask {
        att = att
            .reshape((a.kv_heads, rep, t, total))?
            .broadcast_add(m)?
            .reshape((a.kv_heads, rep * t, total))?;
    }
    let att = candle_nn::ops::softmax_last_dim(&att)?;
    let y = att
        .matmul(&v_all)?
        .reshape((a.heads, t, a.head_dim))?
        .transpose(0, 1)?
        .reshape((t, a.heads * a.head_dim))?;
    Ok((y, k_all, v_all))
}

/// The MoE block of one rank: the replicated router, the routed experts' shards, the shared
/// expert's shard; a partial output.
fn moe_forward(ctx: &mut Ctx<'_, '_>, m: &Moe, layer: Layer, h: &Tensor) -> Result<Tensor> {
    let probs = ctx.run(Section::MOE_ROUTER, layer, Site::MLP, || {
        let logits = h.matmul(&m.router.t()?)?.to_dtype(DType::F32)?;
        candle_nn::ops::softmax_last_dim(&logits)
    })?;
    // The routed ids and weights come back to the host, as in every engine that routes on
    // the host: per expert, the rows it serves and their weights.
    let routes = ctx.run(Section::MOE_HOSTSYNC, layer, Site::MLP, || {
        let rows = probs.to_vec2::<f32>()?;
        Ok(route(&rows, m.top_k, m.norm_topk))
    })?;
    for ids in &routes.per_token {
        ctx.moe_route(layer, ids);
    }
    let dtype = h.dtype();
    let mut out = ctx.run(Section::MOE_EXPERTS, layer, Site::MLP, || {
        let mut out = h.zeros_like()?;
        for (e, rows, weights) in &routes.per_expert {
            let idx = Tensor::new(rows.as_slice(), h.device())?;
            let w = Tensor::new(weights.as_slice(), h.device())?
                .to_dtype(dtype)?
                .unsqueeze(1)?;
            let y = m.experts[*e].forward(&h.index_select(&idx, 0)?)?;
            out = out.index_add(&idx, &y.broadcast_mul(&w)?, 0)?;
        }
        Ok(out)
    })?;
    if let Some((shared, gate)) = &m.shared {
        out = ctx.run(Section::MOE_SHARED, layer, Site::MLP, || {
            let g = candle_nn::ops::sigmoid(&h.matmul(&gate.t()?)?)?;
            out.clone() + shared.forward(h)?.broadcast_mul(&g)?
        })?;
    }
    Ok(out)
}

/// The routing decision of one MoE layer for `t` tokens.
#[derive(Debug, Default)]
struct Routes {
    /// Each token's top-k expert ids, best first.
    per_token: Vec<Vec<u32>>,
    /// Each used expert (ascending), its token rows and routing weights.
    per_expert: Vec<(usize, Vec<u32>, Vec<f32>)>,
}

/// Top-k routing over softmax probabilities (ties to the lower id); the weights renormalised
/// to sum to 1 when `norm`.
fn route(rows: &[Vec<f32>], k: usize, norm: bool) -> Routes {
    let experts = rows.first().map_or(0, Vec::len);
    let mut per_expert: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); experts];
    let mut per_token = Vec::with_capacity(rows.len());
    for (r, p) in rows.iter().enumerate() {
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        order.truncate(k);
        let total: f32 = order.iter().map(|&e| p[e]).sum();
        for &e in &order {
            let w = if norm && total > 0.0 {
                p[e] / total
            } else {
                p[e]
            };
            per_expert[e].0.push(r as u32);
            per_expert[e].1.push(w);
        }
        per_token.push(order.iter().map(|&e| e as u32).collect());
    }
    Routes {
        per_token,
        per_expert: per_expert
            .into_iter()
            .enumerate()
            .filter(|(_, (rows, _))| !rows.is_empty())
            .map(|(e, (rows, w))| (e, rows, w))
            .collect(),
    }
}

/// The all-reduce of a block's partial output, with the residual added: deposit (the enqueue),
/// the rendezvous probe (this rank's wait for the slowest), the sum. One rank has no
/// collective: the residual add alone, in the reduce section.
fn all_reduce(
    ctx: &mut Ctx<'_, '_>,
    layer: Layer,
    site: Site,
    partial: &Tensor,
    residual: &Tensor,
) -> Result<Tensor> {
    let (enq, bar, red) = if site == Site::ATTN {
        (
            Section::REDUCE_ATTN_ENQ,
            Section::REDUCE_ATTN_BAR,
            Section::REDUCE_ATTN,
        )
    } else {
        (
            Section::REDUCE_MLP_ENQ,
            Section::REDUCE_MLP_BAR,
            Section::REDUCE_MLP,
        )
    };
    let rec = ctx.rec;
    let comm = match ctx.comm.as_deref_mut() {
        Some(c) if c.ranks() > 1 => c,
        _ => {
            let _s = rec.map(|r| r.section(red, layer, site));
            return partial + residual;
        }
    };
    {
        let _s = rec.map(|r| r.host_section(enq, layer, site));
        comm.deposit(partial)?;
    }
    {
        let _s = rec.map(|r| r.section(bar, layer, site));
        comm.arrive()?;
    }
    let _s = rec.map(|r| r.section(red, layer, site));
    comm.sum()? + residual
}

/// The additive causal mask of `t` new positions after `pos` cached ones: `[t, pos + t]`.
fn causal_mask(t: usize, pos: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let total = pos + t;
    let m: Vec<f32> = (0..t)
        .flat_map(|i| (0..total).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(m, (t, total), device)?.to_dtype(dtype)
}

/// RoPE's cos and sin tables, `[positions, head_dim / 2]`.
fn rope_tables(
    cfg: &ModelConfig,
    positions: usize,
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let half = cfg.head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|j| 1.0 / cfg.rope_theta.powf(2.0 * j as f64 / cfg.head_dim as f64) as f32)
        .collect();
    let inv = Tensor::from_vec(inv, (1, half), device)?;
    let p = Tensor::arange(0u32, positions as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((positions, 1))?;
    let f = p.broadcast_mul(&inv)?;
    Ok((f.cos()?.to_dtype(dtype)?, f.sin()?.to_dtype(dtype)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_takes_the_top_k_and_renormalises_on_request() {
        let rows = vec![vec![0.1, 0.5, 0.2, 0.2], vec![0.7, 0.1, 0.1, 0.1]];
        let r = route(&rows, 2, false);
        assert_eq!(r.per_token, vec![vec![1, 2], vec![0, 1]]);
        // Experts ascending, each with its rows.
        let used: Vec<_> = r
            .per_expert
            .iter()
            .map(|(e, rows, _)| (*e, rows.clone()))
            .collect();
        assert_eq!(used, vec![(0, vec![1]), (1, vec![0, 1]), (2, vec![0])]);
        let n = route(&rows, 2, true);
        let w0: f32 = n
            .per_expert
            .iter()
            .flat_map(|(_, rows, w)| {
                rows.iter()
                    .zip(w)
                    .filter(|(r, _)| **r == 0)
                    .map(|(_, w)| *w)
            })
            .sum();
        assert!((w0 - 1.0).abs() < 1e-6);
    }
}
