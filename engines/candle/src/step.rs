//! One step of a rank: the batch's sequences ([`Live`]) through one forward of the target,
//! inside a phasetrace step of its kind. A speculative round's step is `round.rs`; this is
//! the plain step, and what both run on.
//!
//! ```text
//! rec.step_of(kind)           prefill (prompts only) | decode (one token each) | mixed
//!   rec.serve(id, tokens, 1)  each request's share of the step (serving only)
//!   target.forward_batch      each sequence: its prompt, or its pending token ── model.rs
//! (step ends)
//! draft.forward_batch         speculative decoding only: the draft prefills the new ones
//!                             (unprofiled: outside every step)
//! each sequence: its next token is its output and its pending token; EOS ends it
//! ```

use crate::EngineError;
use crate::instrument::Ctx;
use crate::model::{KvCache, Model, Seq};
use phasetrace::{Recorder, StepKind};

/// What one rank runs its steps with: its recorder, its forward context, the models.
#[derive(Debug)]
pub(crate) struct Rank<'a, 'c, 'm> {
    pub(crate) rank: usize,
    pub(crate) rec: Option<&'a Recorder>,
    pub(crate) ctx: Ctx<'a, 'c>,
    pub(crate) target: &'m Model,
    pub(crate) draft: &'m Model,
    /// The target's layers, and the draft's.
    pub(crate) layers: usize,
    pub(crate) depth: usize,
    /// Whether the sequences are requests: each step then reports each one's share of it
    /// (`serve`, `serve_speculative_outputs`).
    pub(crate) serving: bool,
}

/// A running sequence: its caches, the token whose KV is not cached yet (none: its prompt is
/// not prefilled), what it generated.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) id: u64,
    /// What its prefill computes: the prompt, and after a preemption the output so far too.
    pub(crate) prompt: Vec<u32>,
    /// The prompt's own length (`prompt` beyond it: output recomputed after a preemption).
    pub(crate) prompt_len: usize,
    /// Output tokens it may get.
    pub(crate) want: usize,
    /// It is cut at the workload's most output tokens (finish reason `length`).
    pub(crate) cut: bool,
    /// It generated an end-of-sequence token (its last).
    pub(crate) ended: bool,
    pub(crate) cache: KvCache,
    pub(crate) dcache: KvCache,
    pub(crate) pending: Option<u32>,
    pub(crate) out: Vec<u32>,
}

impl Live {
    /// A sequence of `prompt` that may generate `want` tokens, nothing cached yet.
    pub(crate) fn new(id: u64, prompt: Vec<u32>, want: usize, layers: usize) -> Live {
        Live {
            id,
            prompt_len: prompt.len(),
            prompt,
            want,
            cut: false,
            ended: false,
            cache: KvCache::new(layers),
            dcache: KvCache::new(layers),
            pending: None,
            out: Vec::new(),
        }
    }

    /// Whether it decodes in its next step (its prompt is prefilled).
    pub(crate) fn decoding(&self) -> bool {
        self.pending.is_some()
    }
}

/// The kind of a plain step over `batch`: prompts only, decode tokens only, or both.
pub(crate) fn kind(batch: &[Live]) -> StepKind {
    match (
        batch.iter().any(Live::decoding),
        batch.iter().all(Live::decoding),
    ) {
        (false, _) => StepKind::Prefill,
        (true, true) => StepKind::Decode,
        (true, false) => StepKind::Mixed,
    }
}

/// A step without a round: every sequence decodes one token or prefills its prompt (and,
/// under speculative decoding, the draft prefills it too, outside the step).
pub(crate) fn plain(
    r: &mut Rank<'_, '_, '_>,
    batch: &mut [Live],
    spec: bool,
) -> Result<(), EngineError> {
    let nexts = {
        let _step = r.rec.map(|rec| rec.step_of(kind(batch)));
        if let Some(rec) = r.rec.filter(|_| r.serving) {
            for l in batch.iter() {
                match l.pending {
                    None => rec.serve(l.id, l.prompt.len() as u32, 1),
                    Some(_) => rec.serve(l.id, 1, 1),
                }
            }
        }
        let inputs: Vec<Vec<u32>> = batch
            .iter()
            .map(|l| l.pending.map_or_else(|| l.prompt.clone(), |p| vec![p]))
            .collect();
        let mut seqs: Vec<Seq<'_>> = batch
            .iter_mut()
            .zip(&inputs)
            .map(|(l, t)| Seq {
                tokens: t,
                cache: &mut l.cache,
            })
            .collect();
        r.target.forward_batch(&mut r.ctx, &mut seqs, r.layers)?
    };
    if spec {
        // The draft's caches hold what the target's hold (unprofiled: outside every step).
        let mut seqs: Vec<Seq<'_>> = batch
            .iter_mut()
            .filter(|l| l.pending.is_none())
            .map(|l| {
                let Live { prompt, dcache, .. } = l;
                Seq {
                    tokens: prompt,
                    cache: dcache,
                }
            })
            .collect();
        let (draft, depth) = (r.draft, r.depth);
        r.ctx
            .unrecorded(|ctx| draft.forward_batch(ctx, &mut seqs, depth))?;
    }
    let eos = &r.target.config().eos;
    for (l, next) in batch.iter_mut().zip(nexts) {
        let t = last(next)?;
        l.out.push(t);
        l.pending = Some(t);
        l.ended = eos.contains(&t);
    }
    Ok(())
}

/// Where a sequence's new tokens end: after the first end-of-sequence token among them (its
/// index + 1), or all of them.
pub(crate) fn until_eos(new: &[u32], eos: &[u32]) -> (usize, bool) {
    match new.iter().position(|t| eos.contains(t)) {
        Some(i) => (i + 1, true),
        None => (new.len(), false),
    }
}

/// The token sampled after the last position of a forward.
pub(crate) fn last(ids: Vec<u32>) -> Result<u32, EngineError> {
    ids.last()
        .copied()
        .ok_or_else(|| EngineError::Config("a forward over no tokens".into()))
}
