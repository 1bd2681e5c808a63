//! The engine serves a seeded workload of requests under continuous batching (several
//! sequences per step, each over its own KV cache, prefill and decode in the same forward):
//! - each request gets the tokens it gets when served alone (a batch of one), with plain and
//!   with speculative decoding: batching changes when a request runs, never what it generates;
//! - through phasetrace's request API, the GenAI histograms count every request, with two
//!   tensor-parallel ranks, and per-request acceptance reaches `phasetrace.request.accepted_tokens`;
//! - each traced request's span holds a `request.step` span for every step that served it, on
//!   each rank, linked to that step's exported `decode.step` span; a step of the other rank
//!   drained before the request's begin has none and is counted on the request's span.

use crate::support::{engine_provider, histogram_by, small_moe, value_of};
use phasetrace::{Profiler, SectionLevel, SpecLevel};
use phasetrace_candle::{Draft, RunOptions, RunOutput, Spec, Workload, generate, weights};
use phasetrace_names::{attr, metric};
use std::collections::BTreeMap;

fn serve(
    max_batch: usize,
    ranks: usize,
    spec: Option<Spec>,
    steps: usize,
    p: Option<&Profiler>,
) -> RunOutput {
    let cfg = small_moe();
    let tensors = weights::random(&cfg, 11).expect("random weights");
    let opts = RunOptions {
        ranks,
        spec,
        serving: Some(Workload {
            requests_per_step: 0.5,
            max_batch,
            prompt_tokens: 6,
            output_tokens: 8,
            max_output_tokens: 12,
            seed: 3,
            ..Workload::default()
        }),
        ..RunOptions::new(cfg, tensors, steps, Vec::new())
    };
    generate(&opts, p).expect("serving")
}

/// The requests that got all their tokens in `out`, by id.
fn finished(out: &RunOutput) -> BTreeMap<u64, Vec<u32>> {
    out.requests.iter().cloned().collect()
}

#[test]
fn batching_never_changes_what_a_request_generates() {
    let alone = serve(1, 1, None, 160, None);
    let batched = serve(4, 1, None, 60, None);
    let s = batched.served.expect("serving figures");
    assert!(
        s.max_batch > 1,
        "batches of more than one sequence ran: {s:?}"
    );
    assert!(s.finished >= 5, "{s:?}");
    let spec = serve(
        4,
        1,
        Some(Spec {
            k: 3,
            draft: Draft::Shallow { layers: 2 },
        }),
        40,
        None,
    );
    assert!(
        spec.rounds > 0 && spec.accepted > 0 && spec.accepted < spec.drafted,
        "{spec:?}"
    );
    let reference = finished(&alone);
    let mut compared = 0;
    for (name, run) in [("batched", &batched), ("batched speculative", &spec)] {
        for (id, tokens) in &run.requests {
            let Some(r) = reference.get(id) else { continue };
            let n = tokens.len().min(r.len());
            assert_eq!(tokens[..n], r[..n], "{name}: request {id}");
            compared += 1;
        }
    }
    assert!(compared >= 10, "{compared} requests compared");
}

#[test]
fn every_request_reaches_the_gen_ai_histograms() {
    let (provider, exporter) = engine_provider();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_spec_level(SpecLevel::VerifySplit)
        .with_meter_provider(provider.clone())
        .build()
        .expect("building the profiler");
    let spec = Spec {
        k: 2,
        draft: Draft::Shallow { layers: 1 },
    };
    let out = serve(4, 2, Some(spec), 30, Some(&profiler));
    let s = out.served.expect("serving figures");
    profiler.flush();
    let stats = profiler.stats();
    profiler.shutdown();
    provider
        .force_flush()
        .expect("flushing the engine's provider");
    let metrics = exporter.get_finished_metrics().expect("exported metrics");
    let count = |name: &str| -> u64 {
        histogram_by(&metrics, name, attr::ERROR_TYPE)
            .values()
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(s.begun, s.finished + s.cancelled, "{s:?}");
    assert_eq!(
        count(metric::GEN_AI_SERVER_REQUEST_DURATION),
        s.begun,
        "every request's duration, finished or cancelled: {s:?}"
    );
    let ttft = count(metric::GEN_AI_SERVER_TIME_TO_FIRST_TOKEN);
    assert!(
        ttft >= s.finished,
        "time to first token of {ttft} requests: {s:?}"
    );
    assert!(count(metric::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN) >= s.finished.min(1));
    assert!(
        count(metric::REQUEST_ACCEPTED_TOKENS) > 0,
        "per-request acceptance"
    );
    // Both ranks' steps, one per step of the run.
    let steps = histogram_by(&metrics, metric::STEP_DURATION, attr::RANK);
    assert_eq!(steps.len(), 2, "{steps:?}");
    for (rank, (_, n)) in &steps {
        assert_eq!(*n as usize, out.steps, "rank {rank}");
    }
    // Every step carries its kind (`Recorder::step_of`): a round's verify is `speculative`, a
    // plain step `prefill`, `decode` or `mixed`.
    let kinds = histogram_by(&metrics, metric::STEP_DURATION, attr::STEP_KIND);
    let known: Vec<&str> = phasetrace_names::vocab::STEP_KINDS
        .iter()
        .map(|n| n.value)
        .collect();
    assert!(
        kinds.keys().all(|k| known.contains(&k.as_str())),
        "a step without a kind, or of a kind not in the contract: {kinds:?}"
    );
    assert_eq!(
        kinds.values().map(|(_, n)| n).sum::<u64>(),
        2 * out.steps as u64,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.get("speculative").map_or(0, |(_, n)| *n),
        2 * out.rounds as u64,
        "one speculative step a round on each rank: {kinds:?}"
    );
    assert!(
        kinds.contains_key("prefill") || kinds.contains_key("mixed"),
        "the prompts' steps: {kinds:?}"
    );
    assert_eq!(
        stats.rounds,
        2 * out.rounds as u64,
        "each rank's rounds recorded"
    );
}

#[test]
fn a_traced_requests_trace_holds_every_step_that_served_it_on_every_rank() {
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use phasetrace_names::span;

    let spans = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .with_tracer_provider(provider.clone())
        .build()
        .expect("building the profiler");
    let out = serve(4, 2, None, 24, Some(&profiler));
    profiler.flush();
    // What the profiler dropped (lost marks, unbalanced requests), named when a count is off.
    let dropped = profiler.stats().dropped;
    profiler.shutdown();
    provider.force_flush().expect("flushing the engine's spans");
    let spans = spans.get_finished_spans().expect("exported spans");
    let steps: std::collections::HashSet<_> = spans
        .iter()
        .filter(|s| s.name == span::STEP)
        .map(|s| s.span_context.span_id())
        .collect();
    let mut checked = 0;
    for (id, tokens) in &out.requests {
        let request = spans
            .iter()
            .find(|s| {
                s.attributes.iter().any(|kv| {
                    kv.key.as_str() == attr::GEN_AI_RESPONSE_ID
                        && kv.value.to_string() == id.to_string()
                })
            })
            .unwrap_or_else(|| panic!("request {id}'s span"));
        let children: Vec<_> = spans
            .iter()
            .filter(|s| {
                s.name == span::REQUEST_STEP && s.parent_span_id == request.span_context.span_id()
            })
            .collect();
        // One token a step (plain decoding): a step per token, on each of the two ranks. The
        // rank that begins the request (rank 0) records its begin before its steps, so each of
        // its steps has a span. Another rank's step can be drained before the begin it follows
        // (the worker reads the lanes one after the other): that step has no span and is
        // counted on the request's span, so spans and counted steps add up to every step.
        let on_rank = |rank: u32| {
            children
                .iter()
                .filter(|s| value_of(s.attributes.iter(), attr::RANK) == rank.to_string())
                .count()
        };
        assert_eq!(
            on_rank(0),
            tokens.len(),
            "request {id}: rank 0's request.step spans (dropped: {dropped:?})"
        );
        let untraced: usize = value_of(request.attributes.iter(), attr::REQUEST_STEPS_UNTRACED)
            .parse()
            .unwrap_or_else(|e| panic!("request {id}: {}: {e}", attr::REQUEST_STEPS_UNTRACED));
        assert_eq!(
            children.len() + untraced,
            2 * tokens.len(),
            "request {id}: its request.step spans ({} on rank 0, {} on rank 1) and the \
             {untraced} counted untraced (dropped: {dropped:?})",
            on_rank(0),
            on_rank(1)
        );
        for c in &children {
            assert!(
                c.links
                    .iter()
                    .any(|l| steps.contains(&l.span_context.span_id())),
                "request {id}: a request.step span links to an exported decode.step span"
            );
        }
        checked += 1;
    }
    assert!(checked >= 5, "{checked} requests checked: {:?}", out.served);
}

/// One rank serving with KV-cache blocks of 4 positions, `kv_blocks` in all (0: plenty).
fn serve_blocks(kv_blocks: usize, p: Option<&Profiler>) -> RunOutput {
    serve_blocks_spec(kv_blocks, None, p)
}

fn serve_blocks_spec(kv_blocks: usize, spec: Option<Spec>, p: Option<&Profiler>) -> RunOutput {
    let cfg = small_moe();
    let tensors = weights::random(&cfg, 11).expect("random weights");
    let opts = RunOptions {
        spec,
        serving: Some(Workload {
            requests_per_step: 0.5,
            max_batch: 4,
            prompt_tokens: 6,
            output_tokens: 8,
            max_output_tokens: 12,
            seed: 3,
            kv_block_size: 4,
            kv_blocks,
            ..Workload::default()
        }),
        ..RunOptions::new(cfg, tensors, 60, Vec::new())
    };
    generate(&opts, p).expect("serving")
}

#[test]
fn kv_blocks_stay_within_the_total_are_freed_and_preemptions_are_counted_when_they_run_short() {
    let roomy = serve_blocks(0, None);
    let r = roomy.served.expect("serving figures");
    assert_eq!(r.preemptions, 0, "{r:?}");
    assert!(
        r.max_kv_blocks > 0 && r.max_kv_blocks <= r.kv_blocks,
        "{r:?}"
    );

    // 10 blocks of 4 positions: two long sequences (up to 6 x 3 + 12 positions) fill them, so
    // a batch of 4 outgrows them and the latest admitted are preempted.
    let (provider, exporter) = engine_provider();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_meter_provider(provider.clone())
        .build()
        .expect("building the profiler");
    let tight = serve_blocks(10, Some(&profiler));
    let t = tight.served.expect("serving figures");
    profiler.flush();
    profiler.shutdown();
    provider
        .force_flush()
        .expect("flushing the engine's provider");
    eprintln!("10 blocks of 4 positions: {t:?}; with room: {r:?}");
    assert!(t.preemptions > 0, "nothing preempted: {t:?}");
    assert_eq!(t.kv_blocks, 10);
    assert!(t.max_kv_blocks <= 10, "{t:?}");
    assert!(t.finished >= 5, "{t:?}");

    // A preempted request, recomputed, generates what it generates with room to spare.
    let reference = finished(&roomy);
    let mut compared = 0;
    for (id, tokens) in &tight.requests {
        let Some(r) = reference.get(id) else { continue };
        let n = tokens.len().min(r.len());
        assert_eq!(tokens[..n], r[..n], "request {id}");
        compared += 1;
    }
    assert!(compared >= 5, "{compared} requests compared");

    // Under speculative decoding too: a round reserves k + 1 positions per decoding sequence,
    // and a preempted sequence's draft cache is rebuilt with its target's.
    let spec = Spec {
        k: 2,
        draft: Draft::Shallow { layers: 2 },
    };
    let spec_tight = serve_blocks_spec(12, Some(spec), None);
    let s = spec_tight.served.expect("serving figures");
    assert!(s.preemptions > 0 && s.max_kv_blocks <= 12, "{s:?}");
    let mut compared = 0;
    for (id, tokens) in &spec_tight.requests {
        let Some(r) = reference.get(id) else { continue };
        let n = tokens.len().min(r.len());
        assert_eq!(tokens[..n], r[..n], "speculative, request {id}");
        compared += 1;
    }
    assert!(
        compared >= 5,
        "{compared} requests compared under speculative decoding"
    );

    // Exported: the preemptions counted, the total, and every block freed at the end.
    let metrics = exporter.get_finished_metrics().expect("exported metrics");
    let last = metrics.last().expect("an export");
    let find = |name: &str| -> f64 {
        use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
        let m = last
            .scope_metrics()
            .flat_map(|s| s.metrics())
            .find(|m| m.name() == name)
            .unwrap_or_else(|| panic!("{name} not exported"));
        match m.data() {
            AggregatedMetrics::U64(MetricData::Gauge(g)) => {
                g.data_points().map(|d| d.value() as f64).sum()
            }
            AggregatedMetrics::U64(MetricData::Sum(s)) => {
                s.data_points().map(|d| d.value() as f64).sum()
            }
            AggregatedMetrics::F64(MetricData::Gauge(g)) => {
                g.data_points().map(|d| d.value()).sum()
            }
            other => panic!("{name}: {other:?}"),
        }
    };
    assert_eq!(find(metric::PREEMPTIONS), t.preemptions as f64);
    assert_eq!(find(metric::KV_CACHE_BLOCKS_TOTAL), 10.0);
    assert_eq!(find(metric::KV_CACHE_BLOCKS_USED), 0.0, "blocks freed");
    assert_eq!(find(metric::KV_CACHE_USAGE), 0.0);
    // Prefill and decode tokens of the steps: the prompts (recomputed ones too) and a token a
    // step for each decoding sequence.
    let by_type = histogram_by(&metrics, metric::STEP_TOKENS, attr::GEN_AI_TOKEN_TYPE);
    assert!(
        by_type.contains_key("input") && by_type.contains_key("output"),
        "{by_type:?}"
    );
}
