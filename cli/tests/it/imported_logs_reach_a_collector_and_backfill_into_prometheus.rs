//! `phasetrace import` end to end: the fixture logs of the reference profilers
//! (`tests/fixtures/import/`, numbers in its README) go to the real collector (rotel) with their
//! original timestamps, and backfill the real Prometheus through
//! `promtool tsdb create-blocks-from openmetrics`, queried at the logs' timestamps.

use crate::cli;
use crate::support;

use std::time::Duration;
use support::{Prometheus, Rotel, TempDir};

/// 2026-09-30T12:00:00Z, the fixtures' T0, in Unix nanoseconds.
const T0: u64 = 1_790_769_600_000_000_000;
/// `--start` for the untimestamped speculative log: T0 + 3600 s.
const START: &str = "2026-09-30T13:00:00Z";
const S: u64 = T0 + 3_600_000_000_000;

fn fixture(name: &str) -> String {
    support::repo_root()
        .join("tests/fixtures/import")
        .join(name)
        .display()
        .to_string()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn imported_logs_reach_rotel_with_their_timestamps() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let glm = fixture("glm_run_tracing.log.gz");
    let spec = fixture("spec_phases_stderr.log");
    let done = cli::phasetrace(
        &[
            "import",
            &glm,
            &spec,
            "--start",
            START,
            "--otlp-endpoint",
            &rotel.http_endpoint(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(0), "{done}");
    assert!(done.stderr.contains("1 truncated tables"), "{done}");
    assert!(
        done.stderr.contains("line 46:"),
        "the cut row is reported: {done}"
    );

    let out = rotel.wait_for(
        |o| {
            o.spans_named("decode.step").len() >= 3
                && o.metrics_named("phasetrace.spec.phase.duration").len() == 1
        },
        Duration::from_secs(20),
    );
    // The last table of run 0 (T0 + 4.190 s): moe_experts after 24 steps.
    // One metric per resource (file and run): search all of them.
    let points = |name: &str| -> Vec<support::Point> {
        out.metrics_named(name)
            .into_iter()
            .flat_map(|m| m.points.clone())
            .collect()
    };
    let sections = points("phasetrace.section.duration");
    let p = sections
        .iter()
        .find(|p| {
            p.matches(&[("bucket", "moe_experts"), ("source.run", "0")])
                && p.time_unix_nanos == Some(T0 + 4_190_000_000)
        })
        .expect("moe_experts point of run 0 at its table's timestamp");
    assert_eq!(p.count, Some(1440));
    assert!(close(p.sum.unwrap_or(0.0), 0.059_472), "{p:?}");
    // Run 1 restarted: its counters start again.
    let steps = points("phasetrace.steps");
    let last_run1 = steps
        .iter()
        .filter(|p| p.matches(&[("source.run", "1")]))
        .filter_map(|p| Some((p.time_unix_nanos?, p.value?)))
        .max_by_key(|(t, _)| *t)
        .expect("run 1 steps");
    assert_eq!(last_run1, (T0 + 304_120_000_000, 16.0));

    // Route traces: one child span per GLMTRACE line, under its step's decode.step root.
    let probes: Vec<_> = out
        .spans
        .iter()
        .filter(|s| s.name == "reduce_attn_bar" || s.name == "reduce_mlp_bar")
        .collect();
    assert_eq!(probes.len(), 16);
    let total_ns: u64 = probes.iter().map(|s| s.duration_nanos()).sum();
    assert_eq!(total_ns, 294_400);
    assert!(
        probes
            .iter()
            .all(|s| out.parent_of(s).is_some_and(|p| p.name == "decode.step"))
    );
    assert!(
        out.spans_named("decode.step")
            .iter()
            .any(|s| s.events.iter().any(|e| e.name == "moe.route")),
        "routed expert ids arrive as moe.route events"
    );

    // Speculative phases, per tag, at the last burst's time.
    let phases = points("phasetrace.spec.phase.duration");
    let verify = phases
        .iter()
        .filter(|p| p.matches(&[("phase", "verify"), ("tag", "glm5-phase")]))
        .max_by_key(|p| p.time_unix_nanos)
        .expect("glm5-phase verify");
    assert!(close(verify.sum.unwrap_or(0.0), 0.112_265), "{verify:?}");
    assert_eq!(verify.time_unix_nanos, Some(S + 186_593_000));
}

#[test]
fn openmetrics_output_backfills_prometheus_at_the_logs_timestamps() {
    support::require_tools!(Prometheus, Promtool);
    let dir = TempDir::new("phasetrace-backfill");
    let om = dir.path().join("import.om");
    let tsdb = dir.path().join("tsdb");
    let done = cli::phasetrace(
        &[
            "import",
            &fixture("glm_run_tracing.log"),
            &fixture("spec_phases_stderr.log"),
            "--start",
            START,
            "--format",
            "openmetrics",
            "--out",
            &om.display().to_string(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(0), "{done}");
    let promtool = support::promtool_binary();
    let status = std::process::Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om)
        .arg(&tsdb)
        .output()
        .expect("promtool");
    assert!(
        status.status.success(),
        "promtool: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let prom = Prometheus::builder()
        .data_dir(&tsdb)
        .arg("--storage.tsdb.retention.time=100y")
        .start();
    let at = |ns: u64| format!("{}.{:03}", ns / 1_000_000_000, (ns / 1_000_000) % 1000);
    let query_at = |q: &str, ns: u64| -> Vec<f64> {
        let v = prom
            .get_json(&format!(
                "/api/v1/query?query={}&time={}",
                support::url_encode(q),
                at(ns)
            ))
            .expect("query");
        support::samples(&v).into_iter().map(|(_, x)| x).collect()
    };
    let t = T0 + 4_190_000_000;
    assert_eq!(
        query_at(
            "phasetrace_section_duration_seconds_count{bucket=\"moe_experts\",source_run=\"0\"}",
            t
        ),
        vec![1440.0]
    );
    let sum = query_at(
        "phasetrace_section_duration_seconds_sum{bucket=\"moe_experts\",source_run=\"0\"}",
        t,
    );
    assert_eq!(sum.len(), 1);
    assert!(close(sum[0], 0.059_472), "{sum:?}");
    assert_eq!(
        query_at(
            "phasetrace_steps_total{source_run=\"1\"}",
            T0 + 304_120_000_000
        ),
        vec![16.0]
    );
    assert_eq!(
        query_at(
            "sum(phasetrace_spec_rounds_total{tag=\"glm5-phase\"})",
            S + 186_593_000
        ),
        vec![53.0]
    );
    let kda = query_at(
        "phasetrace_spec_verify_part_duration_seconds_sum{tag=\"glm5-phase-v\",part=\"kda\"}",
        S + 186_593_000,
    );
    assert!(kda.len() == 1 && close(kda[0], 0.042_564), "{kda:?}");
}
