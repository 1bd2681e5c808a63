//! One speculative round over the batch, the same for one sequence and for a served batch:
//! one step (the verify, of kind `speculative`), its phases timed on the round.
//!
//! ```text
//! rec.round(k)
//!   draft:    k greedy tokens per decoding sequence, one batched draft forward each
//!             (unprofiled: its time is the phase) ─────────────────────── phase draft
//!   verify:   rec.step_of(Speculative): one target forward of each decoding sequence's
//!             pending token and k drafts, and the new sequences' prompts; per sequence
//!             serve_speculative_outputs / serve (serving only) ─────────── phase verify
//!   accept:   the agreeing drafts, then the target's own token; EOS and the request's
//!             length cut what is kept ──────────────────────────────────── phase accept
//!   rollback: both caches keep what precedes the new pending token ──────── phase rollback
//!   maint:    a draft with all k accepted caches its last; new ones' drafts prefill ─ maint
//! round.end(accepted)
//! ```

use crate::EngineError;
use crate::model::Seq;
use crate::options::RunOutput;
use crate::step::{Live, Rank, last, until_eos};
use phasetrace::{Phase, RoundGuard, StepKind};

/// Each sequence's drafts: its pending token then k drafted ones (empty: it prefills in this
/// round's verify).
type Drafts = Vec<Vec<u32>>;

/// Runs one round of `k` drafted tokens over `batch` (at least one sequence decoding), and
/// counts it in `out`.
pub(crate) fn run(
    r: &mut Rank<'_, '_, '_>,
    batch: &mut [Live],
    k: usize,
    out: &mut RunOutput,
) -> Result<(), EngineError> {
    let round = r.rec.map(|rec| rec.round(k as u32));
    let drafts = draft(r, batch, k)?;
    phase(&round, Phase::Draft);
    let before: Vec<usize> = batch.iter().map(|l| l.cache.len()).collect();
    r.ctx.round = round.as_ref().map(|x| x.as_ref());
    let verified = verify(r, batch, &drafts, k);
    r.ctx.round = None;
    let (verified, accepted) = verified?;
    phase(&round, Phase::Verify);
    let eos = r.target.config().eos.clone();
    let decoding = accept(batch, &drafts, &verified, &accepted, &eos)?;
    let kept: usize = accepted.iter().sum();
    out.rounds += 1;
    out.drafted += decoding * k;
    out.accepted += kept;
    phase(&round, Phase::Accept);
    if rollback(batch, &drafts, &accepted, &before, k)? {
        phase(&round, Phase::Rollback);
    }
    maintain(r, batch, &drafts, &accepted, k)?;
    if let Some(x) = round {
        x.phase(Phase::Maint);
        // The round verifies the batch: its accepted count is the decoding sequences' mean
        // (rounded down); each request's own is exact (`serve_speculative_outputs`).
        x.end((kept / decoding.max(1)) as u32);
    }
    Ok(())
}

fn phase(round: &Option<RoundGuard<'_>>, p: Phase) {
    if let Some(x) = round {
        x.phase(p);
    }
}

/// Draft: k tokens for each decoding sequence, one batched forward each (unprofiled).
fn draft(r: &mut Rank<'_, '_, '_>, batch: &mut [Live], k: usize) -> Result<Drafts, EngineError> {
    let mut drafts: Drafts = batch
        .iter()
        .map(|l| l.pending.map(|p| vec![p]).unwrap_or_default())
        .collect();
    let (draft, depth) = (r.draft, r.depth);
    r.ctx.unrecorded(|ctx| -> Result<(), EngineError> {
        for _ in 0..k {
            let lasts: Vec<[u32; 1]> = drafts
                .iter()
                .filter_map(|d| d.last().map(|&t| [t]))
                .collect();
            let mut seqs: Vec<Seq<'_>> = batch
                .iter_mut()
                .filter(|l| l.decoding())
                .zip(&lasts)
                .map(|(l, t)| Seq {
                    tokens: t,
                    cache: &mut l.dcache,
                })
                .collect();
            let nexts = draft.forward_batch(ctx, &mut seqs, depth)?;
            for (d, n) in drafts.iter_mut().filter(|d| !d.is_empty()).zip(nexts) {
                d.push(last(n)?);
            }
        }
        Ok(())
    })?;
    Ok(drafts)
}

/// Verify, the round's step: each decoding sequence's pending token and drafts, the new ones'
/// prompts, in one target forward; then greedy acceptance per sequence (host work, inside
/// the step: serving reports it). Returns the target's tokens and each sequence's accepted
/// drafts.
fn verify(
    r: &mut Rank<'_, '_, '_>,
    batch: &mut [Live],
    drafts: &Drafts,
    k: usize,
) -> Result<(Vec<Vec<u32>>, Vec<usize>), EngineError> {
    let rec = r.rec;
    let _step = rec.map(|rec| rec.step_of(StepKind::Speculative));
    let mut seqs: Vec<Seq<'_>> = batch
        .iter_mut()
        .zip(drafts)
        .map(|(l, d)| {
            let Live { prompt, cache, .. } = l;
            Seq {
                tokens: if d.is_empty() { &prompt[..] } else { &d[..] },
                cache,
            }
        })
        .collect();
    let verified = r.target.forward_batch(&mut r.ctx, &mut seqs, r.layers)?;
    let eos = &r.target.config().eos;
    let mut accepted = vec![0usize; batch.len()];
    for (i, ((l, d), v)) in batch.iter().zip(drafts).zip(&verified).enumerate() {
        let serve = rec.filter(|_| r.serving);
        if d.is_empty() {
            if let Some(rec) = serve {
                rec.serve(l.id, l.prompt.len() as u32, 1);
            }
            continue;
        }
        let a = d[1..].iter().zip(v).take_while(|(x, y)| x == y).count();
        accepted[i] = a;
        // The tokens this round gives the request: the agreeing drafts and the target's own,
        // up to its length and its end-of-sequence token: the engine's output tokens, given
        // as they are; the acceptance is the agreeing drafts.
        let left = l.want.saturating_sub(l.out.len()).max(1);
        let emitted = match until_eos(&d[1..=a], eos) {
            (n, true) => n,
            _ => a + 1,
        }
        .min(left);
        if let Some(rec) = serve {
            rec.serve_speculative_outputs(l.id, k as u32, a as u32, emitted as u32);
        }
    }
    Ok((verified, accepted))
}

/// Accept: each decoding sequence keeps its agreeing drafts, then the target's own token
/// there (no more than its length, nothing after its end-of-sequence token); a sequence
/// prefilled in this round takes its first token. Returns the decoding sequences' count.
fn accept(
    batch: &mut [Live],
    drafts: &Drafts,
    verified: &[Vec<u32>],
    accepted: &[usize],
    eos: &[u32],
) -> Result<usize, EngineError> {
    let mut decoding = 0;
    for (((l, d), v), &a) in batch.iter_mut().zip(drafts).zip(verified).zip(accepted) {
        if d.is_empty() {
            // A sequence prefilled in this round: its first token may end it already.
            let t = last(v.clone())?;
            l.out.push(t);
            l.pending = Some(t);
            l.ended = eos.contains(&t);
            continue;
        }
        let from = l.out.len();
        l.out.extend_from_slice(&d[1..=a]);
        let next = v.get(a).copied().ok_or_else(|| {
            EngineError::Config("a verify forward returned too few tokens".into())
        })?;
        l.out.push(next);
        l.out.truncate(l.want);
        let (keep, ended) = until_eos(&l.out[from..], eos);
        l.out.truncate(from + keep);
        l.ended = ended;
        l.pending = Some(next);
        decoding += 1;
    }
    Ok(decoding)
}

/// Rollback: each cache keeps what precedes its new pending token. Whether any rolled back.
fn rollback(
    batch: &mut [Live],
    drafts: &Drafts,
    accepted: &[usize],
    before: &[usize],
    k: usize,
) -> Result<bool, EngineError> {
    let mut rolled = false;
    for (((l, d), &a), &n) in batch.iter_mut().zip(drafts).zip(accepted).zip(before) {
        if d.is_empty() || a >= k {
            continue;
        }
        l.cache.truncate(n + 1 + a)?;
        l.dcache.truncate(n + 1 + a)?;
        rolled = true;
    }
    Ok(rolled)
}

/// Maintenance: a draft that had all k accepted caches its last token; the new sequences'
/// drafts prefill (unprofiled).
fn maintain(
    r: &mut Rank<'_, '_, '_>,
    batch: &mut [Live],
    drafts: &Drafts,
    accepted: &[usize],
    k: usize,
) -> Result<(), EngineError> {
    let mut seqs: Vec<Seq<'_>> = batch
        .iter_mut()
        .zip(drafts)
        .zip(accepted)
        .filter_map(|((l, d), &a)| {
            let Live { prompt, dcache, .. } = l;
            let tokens = match d.len() {
                0 => &prompt[..],
                _ if a >= k => &d[k..],
                _ => return None,
            };
            Some(Seq {
                tokens,
                cache: dcache,
            })
        })
        .collect();
    if !seqs.is_empty() {
        let (draft, depth) = (r.draft, r.depth);
        r.ctx
            .unrecorded(|ctx| draft.forward_batch(ctx, &mut seqs, depth))?;
    }
    Ok(())
}
