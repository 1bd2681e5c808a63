//! The CLI end to end: `phasetrace demo` exports to a real OTLP collector (rotel) when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` points at it, and serves its embedded Prometheus endpoint to a
//! real Prometheus with `--prometheus`.

use crate::cli;
use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use phasetrace_names::{attr, metric, span};
use support::{Prometheus, Rotel, free_port};

const STEPS: u64 = 300;
const RANKS: u32 = 2;
const LAYERS: u32 = 4;
const TRACE_EVERY: u64 = 50;
/// Every layer has two all-reduces, each with one rendezvous probe.
const PROBES_PER_RANK: u64 = STEPS * LAYERS as u64 * 2;
const WAIT: Duration = Duration::from_secs(30);
const RUN: Duration = Duration::from_secs(60);

fn demo_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--steps",
        &STEPS.to_string(),
        "--ranks",
        &RANKS.to_string(),
        "--layers",
        &LAYERS.to_string(),
        "--trace-every",
        &TRACE_EVERY.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn the_demo_exports_spans_and_metrics_to_a_collector_over_otlp() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let endpoint = rotel.grpc_endpoint();
    let mut cmd = cli::command();
    // No requests: a traced request would trace the steps that serve it too.
    cmd.arg("demo").args(demo_args(&["--request-rate", "0"]));
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_SERVICE_NAME", "demo-e2e")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "1000")
        // Exactly one step in TRACE_EVERY: no tail traces of slow steps beside them.
        .env("PHASETRACE_TRACE_SLOWER_THAN", "off");
    let run = cli::run(cmd, RUN);
    assert_eq!(run.code, Some(0), "{run}");
    assert!(
        run.stderr
            .contains(&format!("exporting OTLP grpc to {endpoint}")),
        "{run}"
    );
    assert!(
        run.stderr.contains(&format!(
            "demo: {STEPS} steps, {STEPS} tokens on {RANKS} ranks x {LAYERS} layers"
        )),
        "{run}"
    );
    // With an OTLP endpoint, the embedded Prometheus endpoint is off by default.
    assert!(!run.stderr.contains("Prometheus metrics at"), "{run}");

    let sampled_per_rank = STEPS.div_ceil(TRACE_EVERY);
    let p = rotel.wait_for(
        |p| {
            p.spans_named(span::STEP).len() as u64 == sampled_per_rank * u64::from(RANKS)
                && (0..RANKS).all(|r| {
                    p.latest_point(metric::STEPS, &[(attr::RANK, r.to_string().as_str())])
                        .and_then(|pt| pt.value)
                        == Some(STEPS as f64)
                })
        },
        WAIT,
    );

    // Spans: the sampled steps of each rank, steps 0, 50, ..., 250.
    let mut steps_by_rank: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for step in p.spans_named(span::STEP) {
        assert!(step.is_root(), "{step:#?}");
        assert_eq!(
            step.resource.get("service.name").map(String::as_str),
            Some("demo-e2e")
        );
        steps_by_rank
            .entry(step.attr(attr::RANK).unwrap().to_string())
            .or_default()
            .push(step.attr(attr::STEP).unwrap().parse().unwrap());

        // Each sampled step has one layer span per layer, in its own trace.
        let layers = p
            .children_of(step)
            .into_iter()
            .filter(|s| s.name == span::LAYER)
            .count();
        assert_eq!(layers, LAYERS as usize, "{step:#?}");
        // Layers 1..=3 are MoE layers (one dense layer): one routing event each.
        assert_eq!(step.events.len(), LAYERS as usize - 1, "{step:#?}");
        assert!(
            step.events.iter().all(|e| e.name == span::MOE_ROUTE_EVENT),
            "{step:#?}"
        );
    }
    let expected: Vec<u64> = (0..STEPS).step_by(TRACE_EVERY as usize).collect();
    for rank in 0..RANKS {
        let mut got = steps_by_rank
            .remove(&rank.to_string())
            .unwrap_or_else(|| panic!("no decode.step spans of rank {rank}"));
        got.sort_unstable();
        assert_eq!(got, expected, "rank {rank}");
    }
    assert!(steps_by_rank.is_empty(), "{steps_by_rank:?}");

    // Nesting: every kda_front is a child of a kda_mixer of the same layer and rank.
    let fronts = p.spans_named("kda_front");
    // Layers 0, 1, 2 are KDA layers (DSA every 4th: layer 3).
    assert_eq!(fronts.len() as u64, sampled_per_rank * u64::from(RANKS) * 3);
    for front in fronts {
        let mixer = p
            .parent_of(front)
            .unwrap_or_else(|| panic!("kda_front without a parent: {front:#?}"));
        assert_eq!(mixer.name, "kda_mixer");
        assert_eq!(mixer.attr(attr::LAYER), front.attr(attr::LAYER));
        assert_eq!(mixer.attr(attr::RANK), front.attr(attr::RANK));
        let layer = p.parent_of(mixer).unwrap();
        assert_eq!(layer.name, span::LAYER);
        assert_eq!(p.parent_of(layer).unwrap().name, span::STEP);
    }

    // Metrics: the final cumulative export carries every step of every rank.
    for rank in 0..RANKS {
        let rank = rank.to_string();
        let pt = p
            .latest_point(metric::STEP_DURATION, &[(attr::RANK, rank.as_str())])
            .unwrap();
        assert_eq!(pt.count, Some(STEPS), "rank {rank}");
        let waits = p.last_metric(metric::COLLECTIVE_WAIT).unwrap();
        let probes: u64 = waits
            .points
            .iter()
            .filter(|pt| pt.attr(attr::RANK) == Some(rank.as_str()))
            .filter_map(|pt| pt.count)
            .sum();
        assert_eq!(probes, PROBES_PER_RANK, "rank {rank}");
        let sections = p.last_metric(metric::SECTION_DURATION).unwrap();
        let mixers: u64 = sections
            .points
            .iter()
            .filter(|pt| pt.matches(&[(attr::RANK, rank.as_str()), (attr::BUCKET, "kda_mixer")]))
            .filter_map(|pt| pt.count)
            .sum();
        assert_eq!(mixers, STEPS * 3, "rank {rank}");
    }
    assert_eq!(
        p.last_metric(metric::SECTION_DURATION)
            .unwrap()
            .resource
            .get("service.name")
            .map(String::as_str),
        Some("demo-e2e")
    );
}

#[test]
fn prometheus_scrapes_the_demos_embedded_endpoint() {
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

    // Summed over the step kinds: the demo's steps carry theirs (prefill, decode, mixed).
    let steps = prometheus.wait_for_query(
        "sum by (job, instance, rank) (phasetrace_steps_total)",
        |s| s.len() == RANKS as usize && s.iter().all(|(_, v)| *v == STEPS as f64),
        WAIT,
    );
    let mut ranks: Vec<&str> = steps.iter().map(|(l, _)| l["rank"].as_str()).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, ["0", "1"]);
    for (labels, _) in &steps {
        assert_eq!(labels.get("job").map(String::as_str), Some("demo"));
        assert_eq!(labels.get("instance"), Some(&target));
    }

    let per_rank = |promql: &str| -> BTreeMap<String, f64> {
        prometheus
            .query_vector(promql)
            .into_iter()
            .map(|(l, v)| (l.get("rank").cloned().unwrap_or_default(), v))
            .collect()
    };
    let expected = |v: f64| BTreeMap::from([("0".to_string(), v), ("1".to_string(), v)]);
    assert_eq!(
        per_rank("sum by (rank) (phasetrace_step_duration_seconds_count)"),
        expected(STEPS as f64)
    );
    assert_eq!(
        per_rank("sum by (rank) (phasetrace_collective_wait_seconds_count)"),
        expected(PROBES_PER_RANK as f64)
    );
    assert_eq!(
        per_rank("sum by (rank) (phasetrace_section_duration_seconds_count{bucket=\"kda_mixer\"})"),
        expected((STEPS * 3) as f64)
    );
    assert_eq!(
        per_rank("count by (rank) (count by (rank, layer) (phasetrace_section_layer_calls_total))"),
        expected(f64::from(LAYERS))
    );
    // The median section time is a real, positive duration.
    for (_, v) in prometheus.query_vector(
        "histogram_quantile(0.5, sum by (le, rank) (phasetrace_section_duration_seconds_bucket{bucket=\"moe_experts\"}))",
    ) {
        assert!(v > 0.0 && v < 0.1, "{v}");
    }

    // Ctrl-C ends the linger early, and the demo exits cleanly.
    let status = demo.interrupt_and_wait(WAIT);
    assert!(status.success(), "{status}; output:\n{}", demo.output());
}
