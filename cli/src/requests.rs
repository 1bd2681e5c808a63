//! The demo's requests: arrivals at a rate (a Poisson process), prompt and output lengths from
//! log-normal distributions, continuous batching up to a maximum batch, prefill then decode,
//! all through the public request API ([`Recorder::request_begin`], [`Recorder::serve`],
//! [`Recorder::request_end`]), as a serving engine's scheduler would call it.
//!
//! ```text
//! scheduling rank, at each step boundary: arrivals so far ──request_begin──> waiting
//!   running that outgrew the KV-cache blocks ──preempted──> resumed first (recomputed)
//!   waiting ──(room in the batch and the blocks; prefix_cache lookup)──> running: this
//!   step's batch (prefill: the prompt less its cached prefix, and the first token; decode:
//!   one token, or a speculative round's accepted + 1); kv_cache(blocks reserved, total)
//! every rank, inside its step: serve(id, tokens, outputs) for each request of the batch
//! scheduling rank, after the step: request_end for those that got their last token,
//!   kv_cache(blocks held, total)
//! ```
//!
//! The KV cache is simulated as a paged block manager's: blocks of `--kv-block-size` tokens,
//! `--kv-blocks` in all, a request holding the blocks its prompt and output fill. Half the
//! requests open with one of [`SYSTEM_PROMPTS`] system prompts of [`SYSTEM_PROMPT_TOKENS`]
//! tokens; the prefix cache keeps every system prompt once computed (no eviction), and a hit
//! spares the prefill its full blocks. Shared blocks are counted once per request that holds
//! them (a real block manager counts them once).

use clap::Args;
use phasetrace::{Finish, Profiler, Recorder, RequestClass, RequestKind, StepKind};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// `phasetrace demo` request flags.
#[derive(Debug, Args)]
pub(crate) struct RequestArgs {
    /// Requests arriving per second (a Poisson process); 0 serves none (steps without a batch).
    /// Default 12: it keeps the default demo's 4 ranks x 12 layers below capacity (a short
    /// queue); about 20 a second saturates it. The synthetic engine's (the candle engine's
    /// arrivals are per step: --requests-per-step).
    #[arg(long)]
    pub(crate) request_rate: Option<f64>,
    /// Most requests in one step's batch (continuous batching: a finished request's place is
    /// taken at the next step).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) max_batch: u32,
    /// Mean prompt length in tokens (log-normal, coefficient of variation 0.5); a request's
    /// whole prompt is computed in its first step.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) prompt_tokens: u32,
    /// Mean output length in tokens (log-normal, coefficient of variation 0.5).
    #[arg(long, default_value_t = 48, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) output_tokens: u32,
    /// Output tokens at which a request is cut (finish reason `length`; shorter ones `stop`).
    #[arg(long, default_value_t = 160, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) max_output_tokens: u32,
    /// The model name of the requests (`gen_ai.request.model`; `--model` is the candle
    /// engine's checkpoint directory).
    #[arg(long, default_value = "glm-sim")]
    pub(crate) model_name: String,
    /// KV-cache blocks in all; 0: as many as a full batch of requests of three times the mean
    /// prompt and the most output needs (nothing preempted). Fewer: the scheduler admits less
    /// and preempts the latest admitted requests when the running ones outgrow the blocks
    /// (`phasetrace.preemptions`).
    #[arg(long, default_value_t = 0)]
    pub(crate) kv_blocks: u32,
    /// Tokens (positions) per KV-cache block.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) kv_block_size: u32,
}

/// How many system prompts the synthetic requests share (half of them open with one).
pub(crate) const SYSTEM_PROMPTS: u64 = 8;
/// Tokens of each system prompt (at most the request's prompt less one).
pub(crate) const SYSTEM_PROMPT_TOKENS: u32 = 64;

/// `--request-rate`'s default, requests a second.
const REQUEST_RATE: f64 = 12.0;

impl RequestArgs {
    /// Requests a second: `--request-rate` or its default.
    pub(crate) fn rate(&self) -> f64 {
        self.request_rate.unwrap_or(REQUEST_RATE)
    }

    /// The blocks of a long request: three times the mean prompt and the most output.
    fn long_request_blocks(&self) -> u64 {
        let longest = u64::from(self.prompt_tokens) * 3 + u64::from(self.max_output_tokens);
        longest.div_ceil(u64::from(self.kv_block_size.max(1)))
    }

    /// KV-cache blocks in all: `--kv-blocks`, or a full batch of long requests' worth.
    pub(crate) fn total_kv_blocks(&self) -> u32 {
        match self.kv_blocks {
            0 => (self.long_request_blocks() * u64::from(self.max_batch)).min(u64::from(u32::MAX))
                as u32,
            n => n,
        }
    }

    /// Checks the flags that clap cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        let rate = self.rate();
        if !(rate.is_finite() && rate >= 0.0) {
            return Err(format!(
                "--request-rate {rate}: expected a non-negative number of requests a second"
            ));
        }
        if self.model_name.trim().is_empty() {
            return Err("--model-name: expected a model name".to_owned());
        }
        let one = self.long_request_blocks();
        if self.kv_blocks != 0 && u64::from(self.kv_blocks) < one {
            return Err(format!(
                "--kv-blocks {}: a request of three times --prompt-tokens and --max-output-tokens needs {one} blocks of --kv-block-size {}; expected at least {one} (or 0: enough for a full batch)",
                self.kv_blocks, self.kv_block_size
            ));
        }
        Ok(())
    }
}

/// One request of a step's batch, as every rank serves it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Served {
    pub(crate) id: u64,
    pub(crate) tokens: u32,
    pub(crate) outputs: u32,
    /// Under speculative decoding: drafted tokens verified for it (0: prefill or plain decode).
    pub(crate) drafted: u32,
    /// Of them, those accepted (its `outputs` are one more, cut at its length).
    pub(crate) accepted: u32,
    /// Its prefill (its first step: the prompt, or after a preemption the prompt and the
    /// output so far).
    pub(crate) prefill: bool,
}

/// The batch of one step: what every rank serves, and its tokens (which slow the step).
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) served: Vec<Served>,
    pub(crate) tokens: u64,
}

impl Batch {
    /// Every request of the batch, on `rec`, inside its step.
    pub(crate) fn serve(&self, rec: &Recorder) {
        for s in &self.served {
            if s.drafted > 0 {
                rec.serve_speculative_outputs(s.id, s.drafted, s.accepted, s.outputs);
            } else {
                rec.serve(s.id, s.tokens, s.outputs);
            }
        }
    }

    /// The kind of the step that runs this batch: prompts only, decode tokens only (a step
    /// without requests decodes the synthetic engine's own token), or both. A speculative
    /// round's verify step is `speculative`, whatever its batch.
    pub(crate) fn kind(&self, speculative: bool) -> StepKind {
        let prefills = self.served.iter().filter(|s| s.prefill).count();
        match prefills {
            _ if speculative => StepKind::Speculative,
            0 => StepKind::Decode,
            n if n == self.served.len() => StepKind::Prefill,
            _ => StepKind::Mixed,
        }
    }

    /// How much slower a step is for its batch's tokens (a prefill of a long prompt costs).
    pub(crate) fn factor(&self) -> f64 {
        1.0 + self.tokens as f64 / 4096.0
    }
}

struct Waiting {
    id: u64,
    prompt: u32,
    output: u32,
    /// Output tokens it got before it was preempted (0 for a new request).
    produced: u32,
    /// Its system prompt, if it opens with one.
    system: Option<u64>,
}

struct Running {
    id: u64,
    prompt: u32,
    output: u32,
    produced: u32,
}

/// Figures for the demo's last lines.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Figures {
    pub(crate) begun: u64,
    pub(crate) ended: u64,
    pub(crate) waiting: usize,
    pub(crate) running: usize,
    /// Ended as cancelled because the demo stopped.
    pub(crate) cancelled: u64,
    /// Running requests preempted for want of KV-cache blocks.
    pub(crate) preemptions: u64,
}

/// The scheduler, run by one rank at each step boundary.
pub(crate) struct Scheduler {
    class: RequestClass,
    rng: SmallRng,
    gap: Option<Exp<f64>>,
    prompt: LogNormal<f64>,
    output: LogNormal<f64>,
    max_output: u32,
    max_batch: usize,
    spec: Option<(u32, f64)>,
    started: Instant,
    /// Seconds since `started` of the next arrival.
    next_arrival: f64,
    next_id: u64,
    waiting: VecDeque<Waiting>,
    /// Preempted requests, in arrival order: admitted before any waiting one.
    resumed: VecDeque<Waiting>,
    running: Vec<Running>,
    /// The simulated block manager: tokens per block, blocks in all, and the system prompts
    /// the prefix cache holds (a bit each).
    block: u32,
    kv_total: u32,
    cached_systems: u64,
    figures: Figures,
    /// The batch of the step being run, shared with the other ranks.
    batch: Arc<Batch>,
}

fn log_normal(mean: f64, cv: f64) -> LogNormal<f64> {
    let sigma = (1.0 + cv * cv).ln().sqrt();
    let mu = mean.max(1.0).ln() - sigma * sigma / 2.0;
    // `new` refuses only a negative or NaN sigma, and sigma is the root of a finite log >= 0.
    LogNormal::new(mu, sigma).expect("a finite, non-negative sigma")
}

impl Scheduler {
    /// `spec`: speculative decoding with k drafted tokens and this acceptance.
    pub(crate) fn new(
        a: &RequestArgs,
        profiler: &Profiler,
        seed: u64,
        spec: Option<(u32, f64)>,
    ) -> Result<Scheduler, phasetrace::Error> {
        let class = profiler.request_kind(
            RequestKind::new("phasetrace.demo", "text_completion", a.model_name.clone())
                .response_model(a.model_name.clone()),
        )?;
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x0005_EED0_F4E9);
        let gap = (a.rate() > 0.0).then(|| Exp::new(a.rate()).ok()).flatten();
        let next_arrival = gap.as_ref().map_or(f64::INFINITY, |g| g.sample(&mut rng));
        Ok(Scheduler {
            class,
            rng,
            gap,
            prompt: log_normal(f64::from(a.prompt_tokens), 0.5),
            output: log_normal(f64::from(a.output_tokens), 0.5),
            max_output: a.max_output_tokens,
            max_batch: a.max_batch as usize,
            spec,
            started: Instant::now(),
            next_arrival,
            next_id: 1,
            waiting: VecDeque::new(),
            resumed: VecDeque::new(),
            running: Vec::new(),
            block: a.kv_block_size.max(1),
            kv_total: a.total_kv_blocks(),
            cached_systems: 0,
            figures: Figures::default(),
            batch: Arc::new(Batch::default()),
        })
    }

    /// At a step boundary: the requests that arrived since the last one begin, and the
    /// next step's batch is formed (running requests decode, waiting ones are admitted in
    /// arrival order while there is room).
    pub(crate) fn plan(&mut self, rec: &Recorder) -> Arc<Batch> {
        let now = self.started.elapsed().as_secs_f64();
        while self.next_arrival <= now {
            let Some(gap) = self.gap else { break };
            let id = self.next_id;
            self.next_id += 1;
            let prompt = (self.prompt.sample(&mut self.rng) as u32).max(1);
            let output = (self.output.sample(&mut self.rng) as u32).max(1);
            let system = (prompt > 1 && self.rng.random::<bool>())
                .then(|| self.rng.random_range(0..SYSTEM_PROMPTS));
            rec.request_begin(id, self.class);
            self.figures.begun += 1;
            self.waiting.push_back(Waiting {
                id,
                prompt,
                output,
                produced: 0,
                system,
            });
            self.next_arrival += gap.sample(&mut self.rng);
        }
        self.preempt(rec);
        let mut batch = Batch::default();
        for r in &self.running {
            let left = r.output.min(self.max_output) - r.produced;
            let s = match self.spec {
                Some((k, p)) => {
                    let accepted = (0..k).take_while(|_| self.rng.random::<f64>() < p).count();
                    Served {
                        id: r.id,
                        tokens: k + 1,
                        outputs: (accepted as u32 + 1).min(left),
                        drafted: k,
                        accepted: accepted as u32,
                        prefill: false,
                    }
                }
                None => Served {
                    id: r.id,
                    tokens: 1,
                    outputs: 1,
                    drafted: 0,
                    accepted: 0,
                    prefill: false,
                },
            };
            batch.tokens += u64::from(s.tokens);
            batch.served.push(s);
        }
        let mut used: u64 = self.running.iter().map(|r| self.need(r)).sum();
        while self.running.len() < self.max_batch {
            let Some(w) = self.resumed.front().or(self.waiting.front()) else {
                break;
            };
            // Its prompt, its output so far (a resumed one) and its next token.
            let need = u64::from(w.prompt + w.produced + 1).div_ceil(u64::from(self.block));
            if !self.running.is_empty() && used + need > u64::from(self.kv_total) {
                break;
            }
            let Some(w) = self
                .resumed
                .pop_front()
                .or_else(|| self.waiting.pop_front())
            else {
                break;
            };
            used += need;
            // Prefill: the prompt less what the prefix cache holds (a resumed request
            // recomputes its output too), and the next output token.
            let hit = if w.produced == 0 {
                self.prefix_lookup(rec, &w)
            } else {
                0
            };
            let tokens = (w.prompt + w.produced - hit).max(1);
            batch.served.push(Served {
                id: w.id,
                tokens,
                outputs: 1,
                drafted: 0,
                accepted: 0,
                prefill: true,
            });
            batch.tokens += u64::from(tokens);
            self.running.push(Running {
                id: w.id,
                prompt: w.prompt,
                output: w.output,
                produced: w.produced,
            });
        }
        rec.kv_cache(used.min(u64::from(u32::MAX)) as u32, self.kv_total);
        self.batch = Arc::new(batch);
        self.batch.clone()
    }

    /// The blocks `r` holds once its next step cached its new tokens (a speculative round
    /// reserves k + 1).
    fn need(&self, r: &Running) -> u64 {
        let new = self.spec.map_or(1, |(k, _)| k + 1);
        u64::from(r.prompt + r.produced + new).div_ceil(u64::from(self.block))
    }

    /// The blocks the running requests hold now.
    fn held(&self) -> u32 {
        let held: u64 = self
            .running
            .iter()
            .map(|r| u64::from(r.prompt + r.produced).div_ceil(u64::from(self.block)))
            .sum();
        held.min(u64::from(u32::MAX)) as u32
    }

    /// While the running requests' next step needs more blocks than there are, the latest
    /// admitted is preempted: it goes back to the front of the queue, to be recomputed.
    fn preempt(&mut self, rec: &Recorder) {
        while self.running.len() > 1
            && self.running.iter().map(|r| self.need(r)).sum::<u64>() > u64::from(self.kv_total)
        {
            let Some(r) = self.running.pop() else { break };
            rec.preempted(1);
            self.figures.preemptions += 1;
            let at = self.resumed.partition_point(|w| w.id < r.id);
            self.resumed.insert(
                at,
                Waiting {
                    id: r.id,
                    prompt: r.prompt,
                    output: r.output,
                    produced: r.produced,
                    system: None,
                },
            );
        }
    }

    /// The prefix-cache lookup of a new request's prompt: the full blocks of its system
    /// prompt when that was computed before (then cached for good), else none.
    fn prefix_lookup(&mut self, rec: &Recorder, w: &Waiting) -> u32 {
        let hit = match w.system {
            Some(s) => {
                let len = SYSTEM_PROMPT_TOKENS.min(w.prompt - 1);
                let bit = 1u64 << s;
                let cached = self.cached_systems & bit != 0;
                self.cached_systems |= bit;
                if cached {
                    len / self.block * self.block
                } else {
                    0
                }
            }
            None => 0,
        };
        rec.prefix_cache(u64::from(w.prompt), u64::from(hit));
        hit
    }

    /// After the step: the requests that got their last token end.
    pub(crate) fn finish_step(&mut self, rec: &Recorder) {
        let batch = self.batch.clone();
        let max = self.max_output;
        for s in &batch.served {
            if let Some(r) = self.running.iter_mut().find(|r| r.id == s.id) {
                r.produced += s.outputs;
            }
        }
        let mut ended = 0;
        self.running.retain(|r| {
            let limit = r.output.min(max);
            if r.produced < limit {
                return true;
            }
            let finish = if r.output >= max {
                Finish::Length
            } else {
                Finish::Stop
            };
            rec.request_end(r.id, finish);
            ended += 1;
            false
        });
        self.figures.ended += ended;
        rec.kv_cache(self.held(), self.kv_total);
    }

    /// The requests still open end, cancelled (the demo is stopping).
    pub(crate) fn cancel_all(&mut self, rec: &Recorder) {
        for r in self.running.drain(..) {
            rec.request_end(r.id, Finish::Cancelled);
            self.figures.cancelled += 1;
        }
        for w in self.resumed.drain(..).chain(self.waiting.drain(..)) {
            rec.request_end(w.id, Finish::Cancelled);
            self.figures.cancelled += 1;
        }
        rec.kv_cache(0, self.kv_total);
    }

    pub(crate) fn figures(&self) -> Figures {
        Figures {
            waiting: self.waiting.len() + self.resumed.len(),
            running: self.running.len(),
            ..self.figures
        }
    }
}

/// The scheduler and the batch of the step being run, shared by the rank threads: the
/// scheduling rank plans before the step's stop decision (a barrier), every rank reads the
/// batch after it.
#[derive(Default)]
pub(crate) struct Serving {
    pub(crate) scheduler: Mutex<Option<Scheduler>>,
    pub(crate) batch: Mutex<Arc<Batch>>,
}

impl Serving {
    /// On the scheduling rank, before the stop decision: the next step's batch.
    pub(crate) fn plan(&self, rec: &Recorder) {
        let mut s = self.scheduler.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = s.as_mut() {
            *self.batch.lock().unwrap_or_else(|p| p.into_inner()) = s.plan(rec);
        }
    }

    /// On every rank, after the stop decision: the batch of this step.
    pub(crate) fn batch(&self) -> Arc<Batch> {
        self.batch.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// On the scheduling rank, after its step.
    pub(crate) fn finish_step(&self, rec: &Recorder) {
        let mut s = self.scheduler.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = s.as_mut() {
            s.finish_step(rec);
        }
    }

    /// On the scheduling rank, once the ranks stopped.
    pub(crate) fn stop(&self, rec: &Recorder) {
        let mut s = self.scheduler.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = s.as_mut() {
            s.cancel_all(rec);
        }
    }

    pub(crate) fn figures(&self) -> Option<Figures> {
        let s = self.scheduler.lock().unwrap_or_else(|p| p.into_inner());
        s.as_ref().map(Scheduler::figures)
    }
}
