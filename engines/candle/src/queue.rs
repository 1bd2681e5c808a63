//! The request queue: what a rank's next step runs. Every rank runs the same queue (the same
//! draws, the same batches), so the ranks form the same batch at every step without talking;
//! rank 0's recorder alone begins and ends the requests.
//!
//! ```text
//! Scheduler (serving a Workload), at each step boundary:
//!   arrivals up to this step ──(rank 0: request_begin)──> waiting
//!   running that no longer fit the KV-cache blocks ──(rank 0: preempted)──> preempted (caches
//!     dropped; resumed first, recomputing prompt and output in one prefill)
//!   preempted, then waiting ──(room in the batch and in the blocks)──> running (prefill: its
//!     prompt, in this step's forward); rank 0: kv_cache(blocks reserved for the step, total)
//!   ── the step (step.rs, or round.rs under speculative decoding) ──
//!   after it: rank 0 request_end for those that reached their length, kv_cache(blocks held)
//! OneSequence (no workload): one sequence of the prompt, started over from the prompt (a
//!   prefill step) when it generated an end-of-sequence token or its context is full
//! ```
//!
//! The KV cache is accounted in blocks of [`Workload::kv_block_size`] positions, as a paged
//! block manager allocates them: a sequence holds the blocks its cached positions fill, and a
//! step reserves those its new tokens need before it runs. The caches themselves are one
//! tensor per layer and sequence (nothing is paged in memory); the accounting decides
//! admission and preemption as the blocks would. There is no prefix cache (the workload's
//! prompts share no prefix), so nothing is reported for one.

use crate::model::KvCache;
use crate::options::RunOutput;
use crate::step::Live;
use crate::workload::{Served, Workload};
use phasetrace::{Finish, Recorder, RequestClass};
use std::collections::{BTreeMap, VecDeque};

/// Where a rank's loop takes each step's batch from.
pub(crate) trait Queue {
    /// At a step boundary: the batch of the next step (never empty).
    fn admit(&mut self) -> &mut [Live];
    /// After the step: the sequences that are done leave.
    fn retire(&mut self);
    /// The run stopped: what the sequences generated goes into `out`.
    fn close(self, out: &mut RunOutput);
}

/// One sequence of `prompt`, decoded on and started over from the prompt when it ends or
/// fills its context: the run without a workload.
#[derive(Debug)]
pub(crate) struct OneSequence<'o> {
    prompt: &'o [u32],
    layers: usize,
    /// Positions a sequence may hold.
    context: usize,
    /// A speculative round's k (0: none): a round needs k + 2 positions free.
    k: usize,
    seq: [Live; 1],
    /// What the sequences before this one generated.
    done: Vec<u32>,
}

impl<'o> OneSequence<'o> {
    pub(crate) fn new(prompt: &'o [u32], layers: usize, context: usize, k: usize) -> Self {
        OneSequence {
            prompt,
            layers,
            context,
            k,
            seq: [Live::new(0, prompt.to_vec(), usize::MAX, layers)],
            done: Vec::new(),
        }
    }
}

impl Queue for OneSequence<'_> {
    fn admit(&mut self) -> &mut [Live] {
        let l = &self.seq[0];
        let room = self.context.saturating_sub(l.cache.len());
        if !l.decoding() || l.ended || room <= self.k + 1 {
            // A new sequence (the first, one that ended at its end-of-sequence token, or one
            // whose context is full): its prefill is a step, and yields its first token.
            let fresh = Live::new(0, self.prompt.to_vec(), usize::MAX, self.layers);
            let old = std::mem::replace(&mut self.seq[0], fresh);
            self.done.extend(old.out);
        }
        &mut self.seq
    }

    fn retire(&mut self) {}

    fn close(self, out: &mut RunOutput) {
        let [last] = self.seq;
        out.tokens = self.done;
        out.tokens.extend(last.out);
    }
}

impl Queue for Scheduler<'_, '_> {
    fn admit(&mut self) -> &mut [Live] {
        self.admit_requests();
        &mut self.running
    }

    fn retire(&mut self) {
        self.retire_requests();
    }

    fn close(self, out: &mut RunOutput) {
        let (requests, served) = self.close_requests();
        out.tokens = requests
            .iter()
            .flat_map(|(_, t)| t.iter().copied())
            .collect();
        out.requests = requests;
        out.served = Some(served);
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

/// The scheduler every rank runs: the same draws, the same batches.
pub(crate) struct Scheduler<'o, 'a> {
    w: &'o Workload,
    /// Rank 0's recorder, which begins and ends the requests (other ranks: none), and the
    /// requests' kind.
    rec: Option<&'a Recorder>,
    class: Option<RequestClass>,
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

impl<'o, 'a> Scheduler<'o, 'a> {
    /// The scheduler of `w` for a model of `vocab` tokens and `layers` layers, speculative
    /// rounds of `k` (0: none); `rec` (rank 0's) begins and ends the requests as `class`.
    pub(crate) fn new(
        w: &'o Workload,
        vocab: usize,
        layers: usize,
        k: usize,
        rec: Option<&'a Recorder>,
        class: Option<RequestClass>,
    ) -> Scheduler<'o, 'a> {
        let mut draws = Draws(w.seed ^ 0x9E37_79B9_7F4A_7C15 | 1);
        let first = Self::draw(w, vocab, &mut draws, 1, 0.0);
        Scheduler {
            w,
            rec,
            class,
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
    fn preempt(&mut self) {
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
            if let Some(r) = self.rec {
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
            prompt: crate::options::prompt(len, vocab, w.seed ^ id.wrapping_mul(0x100_0193)),
            want: drawn.min(w.max_output_tokens),
        }
    }

    /// The arrivals up to now begin (on `rec`, rank 0's); with nothing queued or running, the
    /// engine waits for the next one. Then the batch fills from the queue, in arrival order.
    fn admit_requests(&mut self) {
        if self.waiting.is_empty() && self.running.is_empty() && self.next.at > self.now {
            self.now = self.next.at;
        }
        while self.next.at <= self.now {
            let id = self.next.id + 1;
            let after = self.next.at;
            let next = Self::draw(self.w, self.vocab, &mut self.draws, id, after);
            let a = std::mem::replace(&mut self.next, next);
            if let (Some(r), Some(c)) = (self.rec, self.class) {
                r.request_begin(a.id, c);
            }
            self.served.begun += 1;
            self.waiting.push_back(a);
        }
        self.preempt();
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
            let cut = a.want >= self.w.max_output_tokens;
            self.running.push(Live {
                cut,
                ..Live::new(a.id, a.prompt, a.want, self.layers)
            });
        }
        // Resumed sequences take their place in arrival order.
        self.running.sort_by_key(|l| l.id);
        if let Some(r) = self.rec {
            r.kv_cache(used as u32, total as u32);
        }
        self.served.max_kv_blocks = self.served.max_kv_blocks.max(used);
        self.served.sequences += self.running.len() as u64;
        self.served.max_batch = self.served.max_batch.max(self.running.len());
    }

    /// After a step: the requests that have their tokens end (on rank 0's `rec`).
    fn retire_requests(&mut self) {
        self.now += 1.0;
        let mut i = 0;
        while i < self.running.len() {
            let l = &self.running[i];
            if !l.ended && l.out.len() < l.want {
                i += 1;
                continue;
            }
            let l = self.running.swap_remove(i);
            if let Some(r) = self.rec {
                let cut = l.cut && !l.ended;
                r.request_end(l.id, if cut { Finish::Length } else { Finish::Stop });
            }
            self.served.finished += 1;
            self.done.insert(l.id, l.out);
        }
        // Keep the batch in arrival order (swap_remove moved the last one).
        self.running.sort_by_key(|l| l.id);
        if let Some(r) = self.rec {
            r.kv_cache(self.held() as u32, self.served.kv_blocks as u32);
        }
    }

    /// The run stopped: what is still open ends cancelled; every request's tokens, by id.
    fn close_requests(mut self) -> (Vec<(u64, Vec<u32>)>, Served) {
        let rec = self.rec;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draws_are_the_same_for_the_same_seed_and_lengths_stay_in_bounds() {
        let w = Workload::default();
        let mut a = Scheduler::new(&w, 100, 2, 0, None, None);
        let mut b = Scheduler::new(&w, 100, 2, 0, None, None);
        for _ in 0..50 {
            a.admit();
            b.admit();
            a.retire();
            b.retire();
        }
        let ids = |s: &Scheduler<'_, '_>| s.running.iter().map(|l| l.id).collect::<Vec<_>>();
        assert_eq!(ids(&a), ids(&b));
        assert!(a.served.begun > 5, "{:?}", a.served);
        let mut d = Draws(7);
        for _ in 0..1000 {
            let n = d.length(24, 72);
            assert!((1..=72).contains(&n), "{n}");
        }
    }
}
