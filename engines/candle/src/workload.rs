//! What a serving run is asked to serve, and what it did: [`Workload`] (a seeded stream of
//! requests: Poisson arrivals counted in steps, log-normal prompt and output lengths, the
//! batch and the KV-cache blocks that serve them) and [`Served`] (the requests' fate). The
//! scheduler that serves it is `queue.rs`.
//!
//! Arrivals are in steps, not seconds, so that every rank forms the same batches without
//! talking (each runs the same seeded scheduler) and two runs generate the same tokens
//! whatever the machine's speed: telemetry is compared with a checksum. The time a request
//! waits for room in the batch is real, and so is everything phasetrace measures.

use crate::EngineError;

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
}
