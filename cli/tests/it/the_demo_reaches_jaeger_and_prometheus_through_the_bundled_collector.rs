//! The bundled stack, live, on the programs `scripts/install-tools.sh` builds: demo ranks ->
//! OTLP/gRPC -> the collector (tools/otelcol) running `otel-config/collector.yaml` unchanged ->
//! Jaeger v2 running `otel-config/jaeger.yaml` unchanged (traces), and Prometheus 3 scraping the
//! collector's `prometheus` exporter with the bundled rules (metrics, alerts). Only the
//! addresses differ from compose: the configs read them from environment variables.
//!
//! Asserted through the real APIs: Jaeger's `/api/v3/traces` returns the `decode.step` traces
//! with their layer and section children and attributes, and the `spec.round` traces with their
//! phases; Prometheus has every
//! rank's steps under the job the service name gives; `PhasetraceRankStraggler` fires for the
//! 3x straggler and for no other rank; and a trace id that Prometheus's `query_exemplars`
//! returns for the step-duration histogram is a trace Jaeger's `/api/v3/traces/{id}` has, with
//! the `decode.step` span the exemplar names (the trace Grafana's exemplar link opens).

use crate::cli::Demo;
use crate::support::{self, Jaeger, JaegerSpan, Otelcol, Prometheus, poll};
use crate::the_straggler_alert_names_the_rank_its_group_waits_for::alerts;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use phasetrace_names::{attr, span};

const SERVICE: &str = "phasetrace-stack-e2e";
const GROUP: &str = "e2e";
const RANKS: usize = 4;
const LAYERS: usize = 4;
const STRAGGLER_RANK: &str = "1";
const STRAGGLER: &str = "PhasetraceRankStraggler";
/// A 3x straggler fires within 2 minutes on a direct scrape; the collector adds its batch
/// timeout and the exporter's refresh.
const ALERT_DEADLINE: Duration = Duration::from_secs(300);
const WAIT: Duration = Duration::from_secs(90);

/// The ancestors' names of `span` within `trace`, nearest first.
fn ancestors<'a>(trace: &'a [JaegerSpan], span: &JaegerSpan) -> Vec<&'a str> {
    let mut names = Vec::new();
    let mut parent = span.parent_span_id.clone();
    // Bounded: a trace of a step has a handful of levels.
    for _ in 0..16 {
        let Some(p) = trace.iter().find(|s| s.span_id == parent) else {
            break;
        };
        names.push(p.name.as_str());
        parent = p.parent_span_id.clone();
    }
    names
}

#[test]
fn demo_ranks_reach_jaeger_v2_and_prometheus_3_through_the_bundled_collector() {
    support::require_tools!(Otelcol, Jaeger, Prometheus);
    let jaeger = Jaeger::start();
    let collector = Otelcol::start(&jaeger.otlp_grpc_address());
    // As otel-config/prometheus.yml scrapes it (honor_labels keeps the exporter's job), but
    // every second, with exemplar storage on as in docker-compose.yml.
    let builder = Prometheus::builder()
        .scrape_interval("1s")
        .evaluation_interval("1s")
        .raw_job(&format!(
            "job_name: otel-collector\nhonor_labels: true\nstatic_configs:\n  - targets: ['{}']",
            collector.prometheus_target()
        ))
        .arg("--enable-feature=exemplar-storage")
        .bundled_rules();
    let prometheus = builder.start();

    let endpoint = collector.grpc_endpoint();
    let mut demo = Demo::spawn(
        &[
            "--duration",
            "600",
            "--ranks",
            "4",
            "--layers",
            "4",
            "--time-scale",
            "20",
            "--spin-us",
            "0",
            "--trace-every",
            "25",
            "--spec",
            "2",
            "--group",
            GROUP,
            "--straggler-rank",
            STRAGGLER_RANK,
            "--straggler-factor",
            "3",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SERVICE_NAME", SERVICE),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
        ],
    );
    let start = Instant::now();
    let context = |demo: &Demo| {
        format!(
            "\ndemo:\n{}\ncollector:\n{}\njaeger:\n{}",
            demo.output(),
            collector.output(),
            jaeger.output()
        )
    };

    // Metrics through the collector: every rank's steps, under job = service.name.
    prometheus.wait_for_query(
        &format!("phasetrace_steps_total{{job=\"{SERVICE}\",group=\"{GROUP}\"}} > 0"),
        |s| s.len() == RANKS,
        WAIT,
    );

    // Traces through the collector: decode.step roots in Jaeger, each a whole trace.
    let steps = poll(WAIT, || {
        std::thread::sleep(Duration::from_millis(500));
        let spans = jaeger
            .find_traces(SERVICE, Some(span::STEP), Duration::from_secs(600), 50)
            .ok()?;
        let roots: Vec<JaegerSpan> = spans
            .into_iter()
            .filter(|s| s.name == span::STEP && s.parent_span_id.is_empty())
            .collect();
        (roots.len() >= RANKS).then_some(roots)
    })
    .unwrap_or_else(|| {
        panic!(
            "no {RANKS} decode.step traces of {SERVICE} in Jaeger (services: {:?}){}",
            jaeger.services(),
            context(&demo)
        )
    });
    let mut ranks_seen = BTreeSet::new();
    for step in &steps {
        assert_eq!(
            step.resource_attribute("service.name"),
            Some(SERVICE),
            "{step:#?}"
        );
        assert_eq!(step.attribute(attr::GROUP), Some(GROUP), "{step:#?}");
        let rank = step
            .attribute(attr::RANK)
            .unwrap_or_else(|| panic!("{step:#?}"));
        ranks_seen.insert(rank.to_string());
        assert!(step.attribute(attr::STEP).is_some(), "{step:#?}");
        // The trace is complete in Jaeger once its last spans arrive (batches of 2 s).
        let trace = poll(WAIT, || {
            let trace = jaeger.trace(&step.trace_id).ok()?;
            let layers = trace
                .iter()
                .filter(|s| s.name == span::LAYER && s.parent_span_id == step.span_id)
                .count();
            (layers == LAYERS).then_some(trace)
        })
        .unwrap_or_else(|| {
            panic!(
                "trace {} of rank {rank}: not {LAYERS} layer spans under its step: {:#?}",
                step.trace_id,
                jaeger.trace(&step.trace_id)
            )
        });
        assert!(trace.iter().all(|s| s.trace_id == step.trace_id));
        // Sections: the children of the layers, named by their bucket, carrying the layer and
        // the rank.
        let sections: Vec<&JaegerSpan> = trace
            .iter()
            .filter(|s| ancestors(&trace, s).first() == Some(&span::LAYER))
            .collect();
        assert!(
            sections.len() >= LAYERS,
            "trace {}: sections {sections:#?}",
            step.trace_id
        );
        for section in &sections {
            assert!(section.attribute(attr::LAYER).is_some(), "{section:#?}");
            assert_eq!(section.attribute(attr::RANK), Some(rank), "{section:#?}");
        }
    }
    assert_eq!(
        ranks_seen.len(),
        RANKS,
        "decode.step traces of ranks {ranks_seen:?} only"
    );

    // Speculative rounds (--spec 2): `spec.round` traces of their own, with the phases
    // (draft, verify, accept, ...) as children and the round's draft length and rank.
    let rounds = poll(WAIT, || {
        std::thread::sleep(Duration::from_millis(500));
        let spans = jaeger
            .find_traces(SERVICE, Some(span::ROUND), Duration::from_secs(600), 20)
            .ok()?;
        let roots: Vec<JaegerSpan> = spans
            .into_iter()
            .filter(|s| s.name == span::ROUND && s.parent_span_id.is_empty())
            .collect();
        (!roots.is_empty()).then_some(roots)
    })
    .unwrap_or_else(|| {
        panic!(
            "no spec.round traces of {SERVICE} in Jaeger{}",
            context(&demo)
        )
    });
    for round in rounds.iter().take(4) {
        assert_eq!(round.attribute(attr::K), Some("2"), "{round:#?}");
        assert!(round.attribute(attr::RANK).is_some(), "{round:#?}");
        let trace = poll(WAIT, || {
            let trace = jaeger.trace(&round.trace_id).ok()?;
            let phases: BTreeSet<String> = trace
                .iter()
                .filter(|s| s.parent_span_id == round.span_id)
                .map(|s| s.name.clone())
                .collect();
            ["draft", "verify", "accept"]
                .iter()
                .all(|p| phases.contains(*p))
                .then_some(trace)
        })
        .unwrap_or_else(|| {
            panic!(
                "round {}: no draft/verify/accept children: {:#?}",
                round.trace_id,
                jaeger.trace(&round.trace_id)
            )
        });
        for phase in trace.iter().filter(|s| s.parent_span_id == round.span_id) {
            assert_eq!(
                phase.attribute(attr::PHASE),
                Some(phase.name.as_str()),
                "{phase:#?}"
            );
        }
    }

    // The exemplar link: a trace id Prometheus keeps as an exemplar of the step histogram
    // (through the collector's exporter, scraped as OpenMetrics) is a trace in Jaeger.
    let histogram =
        format!("phasetrace_step_duration_seconds_bucket{{job=\"{SERVICE}\",group=\"{GROUP}\"}}");
    let exemplars = poll(WAIT, || {
        let found: Vec<_> = prometheus
            .exemplars(&histogram, Duration::from_secs(600))
            .into_iter()
            .filter(|(_, labels, _)| labels.contains_key("trace_id"))
            .collect();
        (!found.is_empty()).then_some(found)
    })
    .unwrap_or_else(|| {
        panic!(
            "no exemplars with a trace_id on {histogram}{}",
            context(&demo)
        )
    });
    let mut linked = 0;
    for (series, labels, value) in exemplars.iter().take(5) {
        let trace_id = &labels["trace_id"];
        let trace = poll(WAIT, || {
            let trace = jaeger.trace(trace_id).ok()?;
            (!trace.is_empty()).then_some(trace)
        })
        .unwrap_or_else(|| {
            panic!("exemplar {labels:?} ({value} s on {series:?}): trace {trace_id} not in Jaeger")
        });
        let step = trace
            .iter()
            .find(|s| s.name == span::STEP)
            .unwrap_or_else(|| panic!("trace {trace_id} has no decode.step: {trace:#?}"));
        if let Some(span_id) = labels.get("span_id") {
            assert_eq!(&step.span_id, span_id, "exemplar {labels:?}: {trace:#?}");
        }
        assert_eq!(
            step.attribute(attr::RANK),
            series.get("rank").map(String::as_str)
        );
        linked += 1;
    }
    assert!(linked > 0);

    // The bundled alert on what the collector exports: the straggler fires, nobody else.
    let fired = poll(ALERT_DEADLINE.saturating_sub(start.elapsed()), || {
        std::thread::sleep(Duration::from_secs(1));
        let all = alerts(&prometheus, STRAGGLER);
        let wrong: Vec<_> = all
            .iter()
            .filter(|a| a.state == "firing" && a.label("rank") != STRAGGLER_RANK)
            .collect();
        assert!(wrong.is_empty(), "straggler alerts for other ranks: {wrong:#?}");
        all.into_iter()
            .find(|a| a.state == "firing" && a.label("rank") == STRAGGLER_RANK)
    })
    .unwrap_or_else(|| {
        panic!(
            "{STRAGGLER} not firing for rank {STRAGGLER_RANK} within {ALERT_DEADLINE:?}: {:#?}\nlost: {:?}{}",
            alerts(&prometheus, STRAGGLER),
            prometheus.query_vector("phasetrace:rank_time_lost:ratio2m"),
            context(&demo)
        )
    });
    assert_eq!(fired.label("job"), SERVICE, "{fired:#?}");
    assert_eq!(fired.label("group"), GROUP, "{fired:#?}");
    demo.kill();
}
