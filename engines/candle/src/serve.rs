//! Serving requests under continuous batching: a seeded workload of requests (Poisson
//! arrivals, log-normal prompt and output lengths), a batch of up to `max_batch` sequences per
//! step, each with its own KV caches, prefill and decode in the same forward, and the request
//! API of phasetrace called as a serving engine's scheduler calls it.
//!
//! ```text
//! every rank, at each step boundary: arrivals up to this step ──(rank 0: request_begin)──> waiting
//!   running that no longer fit the KV-cache blocks ──(rank 0: preempted)──> preempted (caches
//!     dropped; resumed first, recomputing prompt and output in one prefill)
//!   preempted, then waiting ──(room in the batch and in the blocks)──> running (prefill: its
//!     prompt, in this step's forward); rank 0: kv_cache(blocks reserved for the step, total)
//!   plain: one step = forward_batch(each sequence: its prompt or its last token)
//!   speculative: one round per step: draft k for the decoding sequences (batched, unprofiled)
//!     ── verify: forward_batch(k+1 per decoding sequence, the new ones' prompts) ── accept
//!     per sequence ── roll each cache back ── the draft catches up and prefills the new ones
//!   inside the step: serve / serve_speculative_outputs for each sequence (every rank)
//!   after it: rank 0 request_end for those that reached their length, kv_cache(blocks held)
//! ```
//!
//! The KV cache is accounted in blocks of [`Workload::kv_block_size`] positions, as a paged
//! block manager allocates them: a sequence holds the blocks its cached positions fill, and a
//! step reserves those its new tokens need before it runs. The caches themselves are one
//! tensor per layer and sequence (nothing is paged in memory); the accounting decides
//! admission and preemption as the blocks would. There is no prefix cache (the workload's
//! prompts share no prefix), so nothing is reported for one.
//!
//! Arrivals are in steps, not seconds, so that every rank forms the same batches without
//! talking (each runs the same seeded scheduler) and two runs generate the same tokens
//! whatever the machine's speed: telemetry is compared with a checksum. The time a request
//! waits for room in the batch is real, and so is everything phasetrace measures.

use crate::EngineError;
use crate::engine::{Rank, RunOptions, RunOutput, bump, last};
use crate::model::{KvCache, Seq};
use phasetrace::{Finish, Phase, Recorder, RequestClass};
use std::collections::{BTreeMap, VecDeque};

/// Most requests a step can bring: more would only grow the queue without bound.
pub const MAX_REQUESTS_PER_STEP: f64 = 64.0;

/// Most positions one sequence may reach (prompt, output and a speculative round).
pub const MAX_POSITIONS: usize = 8192;

/// A seeded stream of requests and the batch that serves them.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Mean requests arriving per step (a Poisson process in steps); the engine waits, running
    /// no step, while nothing is queued or running.
    pub requests_per_step: f64,
    /// Most sequences in one step's batch.
    pub max_batch: usize,
    /// Mean prompt length in tokens (log-normal, coefficient of variation 0.5, at most 3x).
    pub prompt_tokens: usize,
    /// Mean output length in tokens (log-normal, coefficient of variation 0.5).
    pub output_tokens: usize,
    /// Output tokens at which a request is cut (finish reason `length`). A request ends with
    /// `stop` at the model's end-of-sequence token ([`crate::ModelConfig::eos`], a
    /// checkpoint's) or at its drawn length, whichever comes first: the drawn length is the
    /// workload's stand-in for the end-of-sequence token that random weights do not have.
    pub max_output_tokens: usize,
    /// `gen_ai.request.model` and `gen_ai.response.model`.
    pub model: String,
    /// Seeds the arrivals, lengths and prompts.
    pub seed: u64,
    /// Positions per KV-cache block.
    pub kv_block_size: usize,
    /// KV-cache blocks in all; 0: as many as a full batch of the longest sequences needs
    /// (nothing is ever preempted). Fewer make the scheduler admit less and preempt the latest
    /// admitted sequences when the running ones outgrow them.
    pub kv_blocks: usize,
}

impl Default for Workload {
    fn default() -> Workload {
        Workload {
            requests_per_step: 0.25,
            max_batch: 8,
            prompt_tokens: 24,
            output_tokens: 24,
            max_output_tokens: 64,
            model: "phasetrace-candle".to_owned(),
            seed: 0,
            kv_block_size: 16,
            kv_blocks: 0,
        }
    }
}

impl Workload {
    /// Checks the figures, naming the one that cannot work.
    pub fn validate(&self) -> Result<(), EngineError> {
        if !(self.requests_per_step.is_finite()
            && self.requests_per_step > 0.0
            && self.requests_per_step <= MAX_REQUESTS_PER_STEP)
        {
            return Err(EngineError::Config(format!(
                "requests per step {}: expected a positive number of at most {MAX_REQUESTS_PER_STEP}",
                self.requests_per_step
            )));
        }
        for (name, v) in [
            ("max batch", self.max_batch),
            ("prompt tokens", self.prompt_tokens),
            ("output tokens", self.output_tokens),
            ("max output tokens", self.max_output_tokens),
            ("KV block size", self.kv_block_size),
        ] {
            if v == 0 {
                return Err(EngineError::Config(format!(
                    "{name} 0: expected at least 1"
                )));
            }
        }
        if self.model.trim().is_empty() {
            return Err(EngineError::Config("model name: expected a name".into()));
        }
        // Checked with the largest speculative round the CLI offers; `generate` checks the
        // run's own k again.
        self.check_positions(0)
    }

    /// Refuses a workload whose longest sequence (with a round of `k`) exceeds
    /// [`MAX_POSITIONS`]: the RoPE tables and a prefill's causal mask grow with it.
    pub(crate) fn check_positions(&self, k: usize) -> Result<(), EngineError> {
        let p = self
            .prompt_tokens
            .saturating_mul(3)
            .saturating_add(self.max_output_tokens)
            .saturating_add(k + 2);
        if p > MAX_POSITIONS {
            return Err(EngineError::Config(format!(
                "prompt tokens {} and max output tokens {}: a sequence may reach {p} positions (prompts up to 3x their mean); expected at most {MAX_POSITIONS}",
                self.prompt_tokens, self.max_output_tokens
            )));
        }
        let one = self.max_positions(k).div_ceil(self.kv_block_size.max(1));
        if self.kv_blocks != 0 && self.kv_blocks < one {
            return Err(EngineError::Config(format!(
                "KV blocks {}: the longest sequence may need {one} blocks of {} positions; expected at least {one} (or 0: enough for the whole batch)",
                self.kv_blocks, self.kv_block_size
            )));
        }
        Ok(())
    }

    /// KV-cache blocks in all, with speculative rounds of `k`: [`Workload::kv_blocks`], or
    /// what a full batch of the longest sequences needs.
    pub fn total_kv_blocks(&self, k: usize) -> usize {
        match self.kv_blocks {
            0 => self.max_batch * self.max_positions(k).div_ceil(self.kv_block_size.max(1)),
            n => n,
        }
    }

    /// Positions the longest sequence can reach: the longest prompt, the most output and a
    /// speculative round of `k` beyond it.
    pub fn max_positions(&self, k: usize) -> usize {
        (3 * self.prompt_tokens + self.max_output_tokens + k + 2).min(MAX_POSITIONS)
    }
}

/// What a serving run did with its requests.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Served {
    /// Requests that arrived.
    pub begun: u64,
    /// Requests that got all their tokens.
    pub finished: u64,
    /// Requests still queued or running when the run stopped (ended as cancelled).
    pub cancelled: u64,
    /// Steps run, and the sequences they served in all (mean batch: `sequences / steps`).
    pub sequences: u64,
    /// The largest batch.
    pub max_batch: usize,
    /// Running sequences preempted for want of KV-cache blocks (each resumed later).
    pub preemptions: u64,
    /// KV-cache blocks in all.
    pub kv_blocks: usize,
    /// The most KV-cache blocks reserved for one step (never above the total).
    pub max_kv_blocks: usize,
}

impl Served {
    /// Sequences per step.
    pub fn mean_batch(&self, steps: usize) -> f64 {
        self.sequences as f64 / steps.max(1) as f64
    }
}

/// A xorshift64* stream: the workload's draws, the same on every rank.
#[derive(Clone, Debug)]
struct Draws(u64);

impl Draws {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        // 53 bits in (0, 1].
        ((x >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn exponential(&mut self, rate: f64) -> f64 {
        -self.uniform().ln() / rate
    }

    /// Log-normal with mean `mean` and coefficient of variation 0.5 (Box-Muller), as whole
    /// tokens in `[1, max]`.
    fn length(&mut self, mean: usize, max: usize) -> usize {
        let sigma = (1.0f64 + 0.25).ln().sqrt();
        let mu = (mean.max(1) as f64).ln() - sigma * sigma / 2.0;
        let (u, v) = (self.uniform(), self.uniform());
        let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
        ((mu + sigma * z).exp().round() as usize).clamp(1, max.max(1))
    }
}

struct Arrival {
    id: u64,
    at: f64,
    prompt: Vec<u32>,
    want: usize,
}

/// A running request: its caches, the token whose KV is not cached yet (none: its prompt is
/// not prefilled), what it generated.
struct Live {
    id: u64,
    /// What its prefill computes: the prompt, and after a preemption the output so far too.
    prompt: Vec<u32>,
    /// The prompt's own length (`prompt` beyond it: output recomputed after a preemption).
    prompt_len: usize,
    want: usize,
    cut: bool,
    /// It generated an end-of-sequence token (its last).
    ended: bool,
    cache: KvCache,
    dcache: KvCache,
    pending: Option<u32>,
    out: Vec<u32>,
}

/// The scheduler every rank runs: the same draws, the same batches.
struct Scheduler<'o> {
    w: &'o Workload,
    vocab: usize,
    layers: usize,
    draws: Draws,
    next: Arrival,
    now: f64,
    waiting: VecDeque<Arrival>,
    running: Vec<Live>,
    /// Sequences preempted, in arrival order: resumed before any waiting one is admitted.
    preempted: VecDeque<Live>,
    done: BTreeMap<u64, Vec<u32>>,
    served: Served,
    /// Positions per KV-cache block, the blocks in all, and a speculative round's k (a step
    /// of a decoding sequence caches up to k + 1 positions).
    block: usize,
    k: usize,
}

impl<'o> Scheduler<'o> {
    fn new(w: &'o Workload, vocab: usize, layers: usize, k: usize) -> Scheduler<'o> {
        let mut draws = Draws(w.seed ^ 0x9E37_79B9_7F4A_7C15 | 1);
        let first = Self::draw(w, vocab, &mut draws, 1, 0.0);
        Scheduler {
            w,
            vocab,
            layers,
            draws,
            next: first,
            now: 0.0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            preempted: VecDeque::new(),
            done: BTreeMap::new(),
            served: Served {
                kv_blocks: w.total_kv_blocks(k),
                ..Served::default()
            },
            block: w.kv_block_size.max(1),
            k,
        }
    }

    /// The blocks `l` holds once its next step cached its new tokens (its prompt in prefill,
    /// up to k + 1 in decode).
    fn need(&self, l: &Live) -> usize {
        let new = match l.pending {
            None => l.prompt.len(),
            Some(_) => 1 + self.k,
        };
        (l.cache.len() + new).div_ceil(self.block)
    }

    /// The blocks the running sequences hold now.
    fn held(&self) -> usize {
        self.running
            .iter()
            .map(|l| l.cache.len().div_ceil(self.block))
            .sum()
    }

    /// While the running sequences' next step needs more blocks than there are, the latest
    /// admitted is preempted (on rank 0's `rec`): its caches are dropped, and it is resumed
    /// later by a prefill of its prompt and its output so far. The earliest always runs.
    fn preempt(&mut self, rec: Option<&Recorder>) {
        let total = self.served.kv_blocks;
        while self.running.len() > 1
            && self.running.iter().map(|l| self.need(l)).sum::<usize>() > total
        {
            let Some(mut l) = self.running.pop() else {
                break;
            };
            l.prompt.truncate(l.prompt_len);
            l.prompt.extend_from_slice(&l.out);
            l.cache = KvCache::new(self.layers);
            l.dcache = KvCache::new(self.layers);
            l.pending = None;
            if let Some(r) = rec {
                r.preempted(1);
            }
            self.served.preemptions += 1;
            let at = self.preempted.partition_point(|p| p.id < l.id);
            self.preempted.insert(at, l);
        }
    }

    fn draw(w: &Workload, vocab: usize, d: &mut Draws, id: u64, after: f64) -> Arrival {
        let at = after + d.exponential(w.requests_per_step);
        let len = d.length(w.prompt_tokens, 3 * w.prompt_tokens);
        let drawn = d.length(w.output_tokens, usize::MAX);
        Arrival {
            id,
            at,
            prompt: crate::engine::prompt(len, vocab, w.seed ^ id.wrapping_mul(0x100_0193)),
            want: drawn.min(w.max_output_tokens),
        }
    }

    /// The arrivals up to now begin (on `rec`, rank 0's); with nothing queued or running, the
    /// engine waits for the next one. Then the batch fills from the queue, in arrival order.
    fn admit(&mut self, rec: Option<&Recorder>, class: Option<RequestClass>) {
        if self.waiting.is_empty() && self.running.is_empty() && self.next.at > self.now {
            self.now = self.next.at;
        }
        while self.next.at <= self.now {
            let id = self.next.id + 1;
            let after = self.next.at;
            let next = Self::draw(self.w, self.vocab, &mut self.draws, id, after);
            let a = std::mem::replace(&mut self.next, next);
            if let (Some(r), Some(c)) = (rec, class) {
                r.request_begin(a.id, c);
            }
            self.served.begun += 1;
            self.waiting.push_back(a);
        }
        self.preempt(rec);
        let total = self.served.kv_blocks;
        let mut used: usize = self.running.iter().map(|l| self.need(l)).sum();
        while self.running.len() < self.w.max_batch {
            // The preempted first, then the queue, each while its prompt's blocks fit.
            let next = match (self.preempted.front(), self.waiting.front()) {
                (Some(p), _) => p.prompt.len(),
                (None, Some(a)) => a.prompt.len(),
                (None, None) => break,
            };
            let need = next.div_ceil(self.block);
            if used + need > total {
                break;
            }
            used += need;
            if let Some(l) = self.preempted.pop_front() {
                self.running.push(l);
                continue;
            }
            let Some(a) = self.waiting.pop_front() else {
                break;
            };
            self.running.push(Live {
                id: a.id,
                cut: a.want >= self.w.max_output_tokens,
                ended: false,
                prompt_len: a.prompt.len(),
                prompt: a.prompt,
                want: a.want,
                cache: KvCache::new(self.layers),
                dcache: KvCache::new(self.layers),
                pending: None,
                out: Vec::new(),
            });
        }
        // Resumed sequences take their place in arrival order.
        self.running.sort_by_key(|l| l.id);
        if let Some(r) = rec {
            r.kv_cache(used as u32, total as u32);
        }
        self.served.max_kv_blocks = self.served.max_kv_blocks.max(used);
        self.served.sequences += self.running.len() as u64;
        self.served.max_batch = self.served.max_batch.max(self.running.len());
    }

    /// After a step: the requests that have their tokens end (on rank 0's `rec`).
    fn retire(&mut self, rec: Option<&Recorder>) {
        self.now += 1.0;
        let mut i = 0;
        while i < self.running.len() {
            let l = &self.running[i];
            if !l.ended && l.out.len() < l.want {
                i += 1;
                continue;
            }
            let l = self.running.swap_remove(i);
            if let Some(r) = rec {
                let cut = l.cut && !l.ended;
                r.request_end(l.id, if cut { Finish::Length } else { Finish::Stop });
            }
            self.served.finished += 1;
            self.done.insert(l.id, l.out);
        }
        // Keep the batch in arrival order (swap_remove moved the last one).
        self.running.sort_by_key(|l| l.id);
        if let Some(r) = rec {
            r.kv_cache(self.held() as u32, self.served.kv_blocks as u32);
        }
    }

    /// The run stopped: what is still open ends cancelled; every request's tokens, by id.
    fn close(mut self, rec: Option<&Recorder>) -> (Vec<(u64, Vec<u32>)>, Served) {
        let open: Vec<Live> = self
            .running
            .drain(..)
            .chain(self.preempted.drain(..))
            .collect();
        for l in open {
            if let Some(r) = rec {
                r.request_end(l.id, Finish::Cancelled);
            }
            self.served.cancelled += 1;
            self.done.insert(l.id, l.out);
        }
        for a in self.waiting.drain(..) {
            if let Some(r) = rec {
                r.request_end(a.id, Finish::Cancelled);
            }
            self.served.cancelled += 1;
        }
        // Every sequence let go of its blocks.
        if let Some(r) = rec {
            r.kv_cache(0, self.served.kv_blocks as u32);
        }
        (self.done.into_iter().collect(), self.served)
    }
}

/// One rank serving `w` for `opts.steps` steps. Rank 0 (`begins`) begins and ends the
/// requests; every rank serves them in its steps.
pub(crate) fn serve_loop(
    opts: &RunOptions,
    w: &Workload,
    c: &mut Rank<'_, '_, '_>,
    class: Option<RequestClass>,
) -> Result<RunOutput, EngineError> {
    let k = opts.spec.map_or(0, |s| s.k);
    let mut s = Scheduler::new(w, opts.cfg.vocab, opts.cfg.layers, k);
    let mut out = RunOutput::default();
    let begins = if c.rank == 0 { c.rec } else { None };
    let started = std::time::Instant::now();
    while out.steps < opts.steps {
        if c.stop_decided(opts)? {
            break;
        }
        s.admit(begins, class);
        match opts.spec {
            Some(spec) if s.running.iter().any(|l| l.pending.is_some()) => {
                spec_step(c, &mut s.running, spec.k, &mut out)?;
            }
            _ => plain_step(c, &mut s.running, opts.spec.is_some())?,
        }
        s.retire(begins);
        bump(opts, c.rank, &mut out);
    }
    out.wall = started.elapsed();
    let (requests, served) = s.close(begins);
    out.tokens = requests
        .iter()
        .flat_map(|(_, t)| t.iter().copied())
        .collect();
    out.requests = requests;
    out.served = Some(served);
    Ok(out)
}

/// A step without a round: every running sequence decodes one token or prefills its prompt
/// (and, under speculative decoding, the draft prefills it too, outside the step).
fn plain_step(
    c: &mut Rank<'_, '_, '_>,
    running: &mut [Live],
    spec: bool,
) -> Result<(), EngineError> {
    let rec = c.rec;
    let nexts = {
        let _step = rec.map(Recorder::step);
        if let Some(r) = rec {
            for l in running.iter() {
                match l.pending {
                    None => r.serve(l.id, l.prompt.len() as u32, 1),
                    Some(_) => r.serve(l.id, 1, 1),
                }
            }
        }
        let inputs: Vec<Vec<u32>> = running
            .iter()
            .map(|l| l.pending.map_or_else(|| l.prompt.clone(), |p| vec![p]))
            .collect();
        let mut seqs: Vec<Seq<'_>> = running
            .iter_mut()
            .zip(&inputs)
            .map(|(l, t)| Seq {
                tokens: t,
                cache: &mut l.cache,
            })
            .collect();
        c.target.forward_batch(&mut c.ctx, &mut seqs, c.layers)?
    };
    if spec {
        // The draft's caches hold what the target's hold (unprofiled: outside every step).
        let mut seqs: Vec<Seq<'_>> = running
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
        let (draft, depth) = (c.draft, c.depth);
        c.ctx
            .unrecorded(|ctx| draft.forward_batch(ctx, &mut seqs, depth))?;
    }
    let eos = &c.target.config().eos;
    for (l, next) in running.iter_mut().zip(nexts) {
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

/// A speculative round over the batch (one step: the verify), as in
/// [`crate::generate`]'s single sequence, per sequence; sequences admitted in this step
/// prefill in the verify forward.
fn spec_step(
    c: &mut Rank<'_, '_, '_>,
    running: &mut [Live],
    k: usize,
    out: &mut RunOutput,
) -> Result<(), EngineError> {
    let rec = c.rec;
    let eos = c.target.config().eos.clone();
    let round = rec.map(|r| r.round(k as u32));
    // Draft: k tokens for each decoding sequence, one batched forward each (unprofiled).
    let mut drafts: Vec<Vec<u32>> = running
        .iter()
        .map(|l| l.pending.map(|p| vec![p]).unwrap_or_default())
        .collect();
    let (draft, depth) = (c.draft, c.depth);
    c.ctx.unrecorded(|ctx| -> Result<(), EngineError> {
        for _ in 0..k {
            let lasts: Vec<[u32; 1]> = drafts
                .iter()
                .filter_map(|d| d.last().map(|&t| [t]))
                .collect();
            let mut seqs: Vec<Seq<'_>> = running
                .iter_mut()
                .filter(|l| l.pending.is_some())
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
    if let Some(r) = &round {
        r.phase(Phase::Draft);
    }
    // Verify: each decoding sequence's pending token and drafts; the new ones' prompts.
    let before: Vec<usize> = running.iter().map(|l| l.cache.len()).collect();
    c.ctx.round = round.as_ref().map(|r| r.as_ref());
    let mut accepted = vec![0usize; running.len()];
    let verified = {
        let _step = rec.map(Recorder::step);
        let mut seqs: Vec<Seq<'_>> = running
            .iter_mut()
            .zip(&drafts)
            .map(|(l, d)| {
                let Live { prompt, cache, .. } = l;
                Seq {
                    tokens: if d.is_empty() { &prompt[..] } else { &d[..] },
                    cache,
                }
            })
            .collect();
        let verified = c.target.forward_batch(&mut c.ctx, &mut seqs, c.layers)?;
        // Greedy acceptance per sequence (host work, inside the step: serving needs it).
        for (i, ((l, d), v)) in running.iter().zip(&drafts).zip(&verified).enumerate() {
            let left = l.want.saturating_sub(l.out.len()).max(1);
            if d.is_empty() {
                if let Some(r) = rec {
                    r.serve(l.id, l.prompt.len() as u32, 1);
                }
                continue;
            }
            let a = d[1..].iter().zip(v).take_while(|(x, y)| x == y).count();
            accepted[i] = a;
            // The tokens this round gives the request: the agreeing drafts and the target's
            // own, up to its length and its end-of-sequence token: the engine's output
            // tokens, given as they are; the acceptance is the agreeing drafts.
            let emitted = match until_eos(&d[1..=a], &eos) {
                (n, true) => n,
                _ => a + 1,
            }
            .min(left);
            if let Some(r) = rec {
                r.serve_speculative_outputs(l.id, k as u32, a as u32, emitted as u32);
            }
        }
        verified
    };
    c.ctx.round = None;
    if let Some(r) = &round {
        r.phase(Phase::Verify);
    }
    // Accept: the agreeing drafts, then the target's own token there.
    let (mut drafted, mut kept, mut decoding) = (0, 0, 0);
    for (((l, d), v), &a) in running
        .iter_mut()
        .zip(&drafts)
        .zip(&verified)
        .zip(&accepted)
    {
        if d.is_empty() {
            // A request prefilled in this round: its first token may end it already.
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
        // A request gets no more than its length, however many drafts agreed, and nothing
        // after its end-of-sequence token.
        l.out.truncate(l.want);
        let (keep, ended) = until_eos(&l.out[from..], &eos);
        l.out.truncate(from + keep);
        l.ended = ended;
        l.pending = Some(next);
        drafted += k;
        kept += a;
        decoding += 1;
    }
    out.rounds += 1;
    out.drafted += drafted;
    out.accepted += kept;
    if let Some(r) = &round {
        r.phase(Phase::Accept);
    }
    // Rollback: each cache keeps what precedes its new pending token.
    let mut rolled = false;
    for (((l, d), &a), &n) in running.iter_mut().zip(&drafts).zip(&accepted).zip(&before) {
        if d.is_empty() || a >= k {
            continue;
        }
        l.cache.truncate(n + 1 + a)?;
        l.dcache.truncate(n + 1 + a)?;
        rolled = true;
    }
    if rolled && let Some(r) = &round {
        r.phase(Phase::Rollback);
    }
    // Maintenance: a draft that had all k accepted caches its last token; new sequences'
    // drafts prefill.
    {
        let mut seqs: Vec<Seq<'_>> = running
            .iter_mut()
            .zip(&drafts)
            .zip(&accepted)
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
            c.ctx
                .unrecorded(|ctx| c.draft.forward_batch(ctx, &mut seqs, c.depth))?;
        }
    }
    if let Some(r) = round {
        r.phase(Phase::Maint);
        // The round verifies the batch: its accepted count is the decoding sequences' mean
        // (rounded down); each request's own is exact (`serve_speculative_outputs`).
        r.end((kept / decoding.max(1)) as u32);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_that_cannot_work_is_refused_naming_the_figure() {
        assert!(Workload::default().validate().is_ok());
        for (w, named) in [
            (
                Workload {
                    requests_per_step: f64::NAN,
                    ..Workload::default()
                },
                "requests per step NaN",
            ),
            (
                Workload {
                    requests_per_step: 65.0,
                    ..Workload::default()
                },
                "at most 64",
            ),
            (
                Workload {
                    max_batch: 0,
                    ..Workload::default()
                },
                "max batch 0",
            ),
            (
                Workload {
                    prompt_tokens: 100_000,
                    ..Workload::default()
                },
                "prompt tokens 100000",
            ),
            (
                Workload {
                    kv_blocks: 1,
                    ..Workload::default()
                },
                "KV blocks 1: the longest sequence may need 9 blocks",
            ),
            (
                Workload {
                    kv_block_size: 0,
                    ..Workload::default()
                },
                "KV block size 0",
            ),
        ] {
            let e = w.validate().expect_err(named).to_string();
            assert!(e.contains(named), "{e}");
        }
    }

    #[test]
    fn the_draws_are_the_same_for_the_same_seed_and_lengths_stay_in_bounds() {
        let w = Workload::default();
        let mut a = Scheduler::new(&w, 100, 2, 0);
        let mut b = Scheduler::new(&w, 100, 2, 0);
        for _ in 0..50 {
            a.admit(None, None);
            b.admit(None, None);
            a.retire(None);
            b.retire(None);
        }
        let ids = |s: &Scheduler<'_>| s.running.iter().map(|l| l.id).collect::<Vec<_>>();
        assert_eq!(ids(&a), ids(&b));
        assert!(a.served.begun > 5, "{:?}", a.served);
        let mut d = Draws(7);
        for _ in 0..1000 {
            let n = d.length(24, 72);
            assert!((1..=72).contains(&n), "{n}");
        }
    }
}
