//! Prometheus 3's own OTLP receiver: the demo pushes OTLP/HTTP metrics straight to Prometheus
//! (`--web.enable-otlp-receiver`), which runs the bundled `otel-config/prometheus-otlp.yml`
//! unchanged (its `otlp:` block: underscore names with their suffixes, the resource attributes
//! promoted to labels; the bundled rules at its 15 s evaluation interval). What arrives has the
//! names and labels the rules and dashboards read: every rank's steps under job = service.name,
//! the recording rules' per-rank series, `PhasetraceRankStraggler` firing for the 3x straggler
//! and no other rank, and every dashboard and rule expression returning data
//! (`scripts/promql-live-check.py`, as the live check runs it on the scrape path).

use crate::cli::Demo;
use crate::support::{self, Prometheus, poll, repo_root};
use crate::the_straggler_alert_names_the_rank_its_group_waits_for::alerts;

use std::time::{Duration, Instant};

const SERVICE: &str = "phasetrace-otlp-e2e";
const GROUP: &str = "otlp";
const RANKS: usize = 4;
const STRAGGLER_RANK: &str = "2";
const STRAGGLER: &str = "PhasetraceRankStraggler";
/// The rules' 2-minute windows and `for: 1m` at a 15 s evaluation interval.
const ALERT_DEADLINE: Duration = Duration::from_secs(330);
const WAIT: Duration = Duration::from_secs(90);

#[test]
fn otlp_metrics_pushed_to_prometheus_3_feed_the_bundled_rules() {
    support::require_tools!(Prometheus);
    let prometheus = Prometheus::builder()
        .config_file(repo_root().join("otel-config/prometheus-otlp.yml"))
        .arg("--web.enable-otlp-receiver")
        .arg("--enable-feature=exemplar-storage")
        .start();
    let endpoint = format!("{}/api/v1/otlp", prometheus.base_url());
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
            "0",
            "--group",
            GROUP,
            "--straggler-rank",
            STRAGGLER_RANK,
            "--straggler-factor",
            "3",
            // What the speculative-decoding dashboard and the MoE panels read.
            "--spec",
            "4",
            "--expert-counter",
            "on",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", SERVICE),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRICS_EXPORTER", "otlp"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "2000"),
        ],
    );
    let start = Instant::now();

    // The names the collector's exporter writes, the labels the rules aggregate by.
    let steps = prometheus.wait_for_query(
        &format!("phasetrace_steps_total{{job=\"{SERVICE}\",group=\"{GROUP}\"}} > 0"),
        |s| s.len() == RANKS,
        WAIT,
    );
    let mut ranks: Vec<&str> = steps.iter().map(|(l, _)| l["rank"].as_str()).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, ["0", "1", "2", "3"], "{steps:?}");
    prometheus.wait_for_query(
        &format!("sum by (rank) (phasetrace_step_duration_seconds_count{{job=\"{SERVICE}\"}}) > 0"),
        |s| s.len() == RANKS,
        WAIT,
    );
    prometheus.wait_for_query(
        &format!("sum by (rank) (phasetrace_collective_wait_seconds_bucket{{job=\"{SERVICE}\",le=\"+Inf\"}})"),
        |s| s.len() == RANKS,
        WAIT,
    );
    // The recording rules read it: the time each rank costs its group.
    prometheus.wait_for_query(
        &format!("phasetrace:rank_time_lost:ratio2m{{job=\"{SERVICE}\",group=\"{GROUP}\"}}"),
        |s| s.len() == RANKS,
        Duration::from_secs(120),
    );

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
            "{STRAGGLER} not firing for rank {STRAGGLER_RANK} within {ALERT_DEADLINE:?}: {:#?}\nlost: {:?}\ndemo:\n{}\nprometheus:\n{}",
            alerts(&prometheus, STRAGGLER),
            prometheus.query_vector("phasetrace:rank_time_lost:ratio2m"),
            demo.output(),
            prometheus.output()
        )
    });
    assert_eq!(fired.label("job"), SERVICE, "{fired:#?}");
    assert_eq!(fired.label("group"), GROUP, "{fired:#?}");

    // Every dashboard panel, template variable and rule expression returns data on what arrived
    // over OTLP (the built-in allow-list: alert conditions, silent ranks, opt-in series).
    let check = std::process::Command::new("python3")
        .arg(repo_root().join("scripts/promql-live-check.py"))
        .args(["--prometheus", prometheus.base_url()])
        .args(["--retry-for", "60", "--retry-interval", "5"])
        .output()
        .expect("running scripts/promql-live-check.py");
    let out = String::from_utf8_lossy(&check.stdout);
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{out}\n{err}");
    assert!(out.contains(" passed, 0 failed"), "{out}\n{err}");
    demo.kill();
}
