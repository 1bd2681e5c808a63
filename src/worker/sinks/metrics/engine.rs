//! The serving engine's state on one meter provider: the KV-cache gauges, the prefix-cache
//! and preemption counters (observable, reading what the recorders stored), and the tokens
//! each step computed, by prefill (`input`) and decode (`output`).
//!
//! ```text
//! EngineState (atomics) ──(each collection, while attached)──> observable gauges, counters
//! Event::Step's batch ──> step tokens: one observation per token type present in the step
//! ```

use super::attachment::Attachment;
use crate::names::{Described, attr, metric};
use crate::record::engine_state::{EngineState, usage};
use crate::worker::event::BatchEntry;
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter, ObservableCounter, ObservableGauge};
use std::sync::Arc;

/// The engine-state instruments of one meter provider.
pub(crate) struct EngineInstruments {
    step_tokens: Histogram<u64>,
    /// `gen_ai.token.type` `input` and `output`, built once.
    input: KeyValue,
    output: KeyValue,
    /// Registered callbacks, kept with the instruments.
    _blocks: [ObservableGauge<u64>; 2],
    _usage: ObservableGauge<f64>,
    _counters: [ObservableCounter<u64>; 3],
}

/// What one observable reads from the engine state, or nothing before the engine reported it.
type Read<T> = fn(&EngineState) -> Option<T>;

impl EngineInstruments {
    /// The instruments on `meter`; the observables read `state` while `attachment` holds.
    pub(crate) fn new(
        meter: &Meter,
        attachment: &Attachment,
        group: &KeyValue,
        state: &Arc<EngineState>,
    ) -> EngineInstruments {
        let gauge = |name: &'static str, read: Read<u64>| {
            let (a, group) = (attachment.clone(), group.clone());
            let s = a.hold(state);
            meter
                .u64_observable_gauge(name)
                .described()
                .with_callback(move |o| {
                    if let Some(v) = a.read(&s).and_then(|s| read(&s)) {
                        o.observe(v, std::slice::from_ref(&group));
                    }
                })
                .build()
        };
        let counter = |name: &'static str, read: Read<u64>| {
            let (a, group) = (attachment.clone(), group.clone());
            let s = a.hold(state);
            meter
                .u64_observable_counter(name)
                .described()
                .with_callback(move |o| {
                    if let Some(v) = a.read(&s).and_then(|s| read(&s)) {
                        o.observe(v, std::slice::from_ref(&group));
                    }
                })
                .build()
        };
        let usage_gauge = {
            let (a, group) = (attachment.clone(), group.clone());
            let s = a.hold(state);
            meter
                .f64_observable_gauge(metric::KV_CACHE_USAGE)
                .described()
                .with_callback(move |o| {
                    if let Some((used, total)) = a.read(&s).and_then(|s| s.kv()) {
                        o.observe(usage(used, total), std::slice::from_ref(&group));
                    }
                })
                .build()
        };
        EngineInstruments {
            step_tokens: meter
                .u64_histogram(metric::STEP_TOKENS)
                .described()
                .with_boundaries(metric::STEP_TOKEN_BOUNDARIES.to_vec())
                .build(),
            input: KeyValue::new(attr::GEN_AI_TOKEN_TYPE, "input"),
            output: KeyValue::new(attr::GEN_AI_TOKEN_TYPE, "output"),
            _blocks: [
                gauge(metric::KV_CACHE_BLOCKS_USED, |s| {
                    s.kv().map(|(used, _)| u64::from(used))
                }),
                gauge(metric::KV_CACHE_BLOCKS_TOTAL, |s| {
                    s.kv().map(|(_, total)| u64::from(total))
                }),
            ],
            _usage: usage_gauge,
            _counters: [
                counter(metric::PREFIX_CACHE_QUERIES, |s| s.prefix().map(|(q, _)| q)),
                counter(metric::PREFIX_CACHE_HITS, |s| s.prefix().map(|(_, h)| h)),
                counter(metric::PREEMPTIONS, EngineState::preemptions),
            ],
        }
    }

    /// A step of `kv`'s rank (attributes `rank`, `group`) served `batch`: its prefill and
    /// decode tokens, each observed when the step had some. `note` sees each observation (the
    /// unit tests' log).
    pub(crate) fn step(
        &self,
        kv: &[KeyValue],
        batch: &[BatchEntry],
        mut note: impl FnMut(&[KeyValue], f64),
    ) {
        let (mut input, mut output) = (0u64, 0u64);
        for b in batch {
            if b.prefill {
                input += u64::from(b.tokens);
            } else {
                output += u64::from(b.tokens);
            }
        }
        for (n, kind) in [(input, &self.input), (output, &self.output)] {
            if n == 0 {
                continue;
            }
            // `rank` and `group` beside the token type: three keys, on the stack.
            let mut all: [KeyValue; 3] = std::array::from_fn(|_| kind.clone());
            for (slot, k) in all[1..].iter_mut().zip(kv) {
                *slot = k.clone();
            }
            let attrs = &all[..1 + kv.len().min(2)];
            note(attrs, n as f64);
            self.step_tokens.record(n, attrs);
        }
    }
}
