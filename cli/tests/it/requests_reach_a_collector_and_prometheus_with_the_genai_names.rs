//! Requests under continuous batching, live: the demo serves Poisson arrivals in batches
//! through the request API, exports over OTLP to a real collector (rotel) and serves its
//! Prometheus endpoint to a real Prometheus 3.
//!
//! Asserted on the wire: the three `gen_ai.server.*` histograms arrive over OTLP with the
//! GenAI conventions' names, unit, advised boundaries and attributes, and Prometheus stores
//! them under the names the OTel translation gives (`gen_ai_server_request_duration_seconds`,
//! ...) with those boundaries as `le`; a traced request's trace holds one `request.step` span
//! per step that served it on every rank, each linked to that step's `decode.step` span, which
//! exists and links back to the request.

use crate::cli;
use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use phasetrace_names::{attr, metric, span};
use support::{Prometheus, Rotel, free_port};

const RANKS: u32 = 2;
const WAIT: Duration = Duration::from_secs(30);
const RUN: Duration = Duration::from_secs(90);
/// The demo's request kind.
const OPERATION: &str = "text_completion";
const PROVIDER: &str = "phasetrace.demo";
const MODEL: &str = "glm-sim";

fn demo_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--steps",
        "240",
        "--ranks",
        "2",
        "--layers",
        "2",
        "--spin-us",
        "0",
        "--trace-every",
        "8",
        "--request-rate",
        "150",
        "--output-tokens",
        "12",
        "--model-name",
        MODEL,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The three GenAI server histograms with the conventions' advised boundaries.
fn genai_histograms() -> [(&'static str, &'static [f64]); 3] {
    [
        (
            metric::GEN_AI_SERVER_REQUEST_DURATION,
            &metric::GEN_AI_REQUEST_DURATION_BOUNDARIES,
        ),
        (
            metric::GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
            &metric::GEN_AI_TTFT_BOUNDARIES,
        ),
        (
            metric::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
            &metric::GEN_AI_TPOT_BOUNDARIES,
        ),
    ]
}

#[test]
fn the_genai_histograms_and_request_traces_reach_a_collector_over_otlp() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let mut cmd = cli::command();
    cmd.arg("demo").args(demo_args(&[]));
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", rotel.grpc_endpoint())
        .env("OTEL_SERVICE_NAME", "requests-e2e")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "1000")
        // Tail sampling on with nothing slow enough: every step is held, so each step that
        // serves a traced request is traced from its begin, on every rank.
        .env("PHASETRACE_TRACE_SLOWER_THAN", "60s")
        .env("PHASETRACE_TRACE_REQUESTS_TTFT_OVER", "off")
        .env("PHASETRACE_TRACE_REQUESTS_TPOT_OVER", "off");
    let run = cli::run(cmd, RUN);
    assert_eq!(run.code, Some(0), "{run}");
    assert!(
        run.stderr.contains("  requests: "),
        "the summary's request line: {run}"
    );
    assert!(run.stderr.contains("span_queue=0"), "{run}");

    let request_span = format!("{OPERATION} {MODEL}");
    let p = rotel.wait_for(
        |p| {
            !p.spans_named(&request_span).is_empty()
                && genai_histograms()
                    .iter()
                    .all(|(m, _)| p.last_metric(m).is_some())
        },
        WAIT,
    );

    // The histograms: the conventions' names, unit, boundaries and attributes.
    for (name, bounds) in genai_histograms() {
        let m = p.last_metric(name).unwrap();
        assert_eq!(m.unit, "s", "{name}");
        let ok: Vec<_> = m
            .points
            .iter()
            .filter(|pt| pt.attr(attr::ERROR_TYPE).is_none())
            .collect();
        assert!(!ok.is_empty(), "{name}: no successful requests: {m:#?}");
        for pt in &ok {
            assert_eq!(pt.explicit_bounds, bounds, "{name}");
            assert_eq!(
                pt.attr(attr::GEN_AI_OPERATION_NAME),
                Some(OPERATION),
                "{name}"
            );
            assert_eq!(
                pt.attr(attr::GEN_AI_PROVIDER_NAME),
                Some(PROVIDER),
                "{name}"
            );
            assert_eq!(pt.attr(attr::GEN_AI_REQUEST_MODEL), Some(MODEL), "{name}");
            assert_eq!(pt.attr(attr::GEN_AI_RESPONSE_MODEL), Some(MODEL), "{name}");
            assert!(pt.count.unwrap_or(0) > 0, "{name}: {pt:?}");
        }
    }
    // Requests cancelled at the stop are counted in the duration only, with error.type.
    let duration = p
        .last_metric(metric::GEN_AI_SERVER_REQUEST_DURATION)
        .unwrap();
    for pt in &duration.points {
        if let Some(e) = pt.attr(attr::ERROR_TYPE) {
            assert_eq!(e, "cancelled", "{pt:?}");
        }
    }

    // A traced request that ran to its end: one request.step span per step that served it on
    // each rank, each linked to its decode.step span, which links back.
    let finished: Vec<_> = p
        .spans_named(&request_span)
        .into_iter()
        .filter(|r| r.attr(attr::ERROR_TYPE).is_none())
        .filter(|r| r.attr(attr::REQUEST_STEPS).is_some_and(|s| s != "0"))
        .collect();
    assert!(!finished.is_empty(), "no traced request ran to its end");
    // A request whose steps were all traced has every one in its trace, on every rank (an
    // ended request waits for the other rank's last step). The span counts the steps it could
    // not link in phasetrace.request.steps_untraced: a rank's step drained before the request's
    // begin, which a busy machine can make happen now and then, hence most rather than all.
    let complete: Vec<_> = finished
        .iter()
        .filter(|r| r.attr(attr::REQUEST_STEPS_UNTRACED) == Some("0"))
        .collect();
    eprintln!(
        "traced requests with every step linked: {} of {}",
        complete.len(),
        finished.len()
    );
    assert!(
        complete.len() * 2 >= finished.len(),
        "most traced requests have every step traced: {} of {}",
        complete.len(),
        finished.len()
    );
    for req in complete {
        assert!(req.is_root(), "{req:#?}");
        assert_eq!(req.kind, "SPAN_KIND_SERVER");
        let steps: usize = req.attr(attr::REQUEST_STEPS).unwrap().parse().unwrap();
        let parts: Vec<_> = p
            .children_of(req)
            .into_iter()
            .filter(|s| s.name == span::REQUEST_STEP)
            .collect();
        let by_rank = |r: &str| {
            parts
                .iter()
                .filter(|s| s.attr(attr::RANK) == Some(r))
                .count()
        };
        assert_eq!(
            parts.len(),
            steps * RANKS as usize,
            "rank 0: {}, rank 1: {}; {req:#?}",
            by_rank("0"),
            by_rank("1")
        );
        let mut ranks = BTreeSet::new();
        for part in parts {
            assert_eq!(part.trace_id, req.trace_id);
            assert_eq!(part.links.len(), 1, "{part:#?}");
            let step = p
                .span_by_id(&part.links[0].span_id)
                .unwrap_or_else(|| panic!("the linked step span is missing: {part:#?}"));
            assert_eq!(step.name, span::STEP);
            assert_eq!(step.trace_id, part.links[0].trace_id);
            assert_ne!(step.trace_id, req.trace_id, "a step sits in its own trace");
            assert_eq!(step.start_unix_nanos, part.start_unix_nanos);
            assert_eq!(step.attr(attr::RANK), part.attr(attr::RANK));
            assert!(
                step.links.iter().any(|l| l.span_id == req.span_id),
                "the step links back to the request: {step:#?}"
            );
            // The step's layers are there, under it, in its trace.
            assert!(
                p.children_of(step).iter().any(|s| s.name == span::LAYER),
                "{step:#?}"
            );
            ranks.insert(part.attr(attr::RANK).unwrap().to_owned());
        }
        assert_eq!(ranks.len(), RANKS as usize);
        for a in [
            attr::GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN,
            attr::GEN_AI_LATENCY_TIME_IN_QUEUE,
            attr::GEN_AI_LATENCY_E2E,
            attr::GEN_AI_LATENCY_TIME_IN_MODEL_FORWARD,
            attr::REQUEST_WAITED_FOR_RANK,
        ] {
            assert!(req.attr(a).is_some(), "{a}: {req:#?}");
        }
    }
}

#[test]
fn prometheus_stores_the_genai_histograms_under_their_translated_names() {
    support::require_tools!(Prometheus);
    let port = free_port();
    let target = format!("127.0.0.1:{port}");
    let prometheus = Prometheus::builder()
        .job("demo", &target)
        .scrape_interval("1s")
        .start();
    let mut demo = cli::Demo::spawn(
        &demo_args(&["--prometheus", &target, "--linger", "8"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &[],
    );
    assert_eq!(demo.prometheus_addr(WAIT), target);
    demo.wait_for_run_end(RUN);
    for (name, bounds) in genai_histograms() {
        let prom = phasetrace_names::prometheus::metric_name(name, metric::UNIT_SECONDS);
        let query = format!("{prom}_bucket{{error_type=\"\"}}");
        let series = prometheus.wait_for_query(&query, |s| s.len() == bounds.len() + 1, WAIT);
        let mut les: Vec<f64> = series
            .iter()
            .map(|(l, _)| {
                let le = &l["le"];
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                }
            })
            .collect();
        les.sort_by(f64::total_cmp);
        let mut want = bounds.to_vec();
        want.push(f64::INFINITY);
        assert_eq!(les, want, "{prom}");
        for (l, _) in &series {
            assert_eq!(l["gen_ai_request_model"], MODEL, "{l:?}");
            assert_eq!(l["gen_ai_operation_name"], OPERATION, "{l:?}");
            assert_eq!(l["gen_ai_provider_name"], PROVIDER, "{l:?}");
        }
    }
    assert_eq!(
        phasetrace_names::prometheus::metric_name(
            metric::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
            metric::UNIT_SECONDS
        ),
        "gen_ai_server_time_per_output_token_seconds"
    );
    // The batch and the queue, for the dashboard's request row.
    // One series per rank once summed over the step kinds (the demo's steps carry theirs).
    prometheus.wait_for_query(
        "sum by (rank) (phasetrace_batch_size_count)",
        |s| s.len() == 2,
        WAIT,
    );
    prometheus.wait_for_query("phasetrace_requests_running", |s| s.len() == 1, WAIT);
    let status = demo.interrupt_and_wait(WAIT);
    assert!(status.success(), "{status}; output:\n{}", demo.output());
}
