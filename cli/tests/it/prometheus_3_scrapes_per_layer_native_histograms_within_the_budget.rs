//! Native histograms on the scrape path: one demo rank of a 96-layer model
//! (`--ranks 1 --layers 96 --dense-layers 3`) scraped by two real Prometheus 3 servers. One
//! scrapes with `scrape_native_histograms: true` and the protobuf protocol first, nothing
//! else (no `convert_classic_histograms_to_nhcb`): every layer has a per-layer p99 of its
//! sections and of its rendezvous waits, the section and step histograms are native
//! (`histogram_count(rate(..))` returns data, no classic `_bucket` series are stored), its own
//! series count stays within 5,000 and the protobuf response within 600 KB. The other scrapes the text formats only and still gets today's classic series and
//! no per-layer distribution. The bundled recording rule on the native form
//! (`phasetrace:collective_layer_wait_seconds:p99_5m`) and the dashboard's per-layer panels
//! return data for every layer. The bundled rules and dashboards read the duration
//! histograms in either form (classic `_sum`/`_count`/`_bucket` or native), so on this
//! Prometheus, which stores only the native form, the straggler and collective-wait rules
//! return data and so does every panel of the three dashboards, every template variable and
//! every rule (`scripts/promql-live-check.py`, with its allow-list for what a healthy run may
//! lack, and the native-histogram panels required).

use crate::cli::Demo;
use crate::support::{self, Prometheus, http_request, http_request_bytes, repo_root};

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const LAYERS: usize = 96;
const SERIES_BUDGET: f64 = 5_000.0;
const BYTES_BUDGET: usize = 600 * 1000;
const WAIT: Duration = Duration::from_secs(120);
const PROTOBUF: &str =
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited";

fn job(name: &str, target: &str, native: bool) -> String {
    let protocols = if native {
        "scrape_native_histograms: true\n\
         scrape_protocols: [PrometheusProto, OpenMetricsText1.0.0, PrometheusText0.0.4]\n"
    } else {
        "scrape_protocols: [OpenMetricsText1.0.0, PrometheusText0.0.4]\n"
    };
    format!("job_name: {name}\n{protocols}static_configs:\n  - targets: ['{target}']")
}

/// The `layer` labels of the samples.
fn layers(samples: &[(std::collections::BTreeMap<String, String>, f64)]) -> BTreeSet<String> {
    samples
        .iter()
        .filter(|(_, v)| v.is_finite())
        .filter_map(|(l, _)| l.get("layer").cloned())
        .collect()
}

#[test]
fn native_histograms_give_every_layer_a_p99_and_text_scrapers_keep_the_classic_series() {
    support::require_tools!(Prometheus);
    let target = format!("127.0.0.1:{}", support::free_port());
    let mut demo = Demo::spawn(
        &[
            "--ranks",
            "1",
            "--layers",
            "96",
            "--dense-layers",
            "3",
            // What the speculative-decoding dashboard reads (its phase and verify-part
            // histograms are among those with a native half).
            "--spec",
            "4",
            "--forever",
            "--prometheus",
            &target,
        ],
        &[],
    );
    assert_eq!(demo.prometheus_addr(WAIT), target);
    let native = Prometheus::builder()
        .scrape_interval("1s")
        .bundled_rules()
        .raw_job(&job("native", &target, true))
        .start();
    let text = Prometheus::builder()
        .scrape_interval("1s")
        .raw_job(&job("text", &target, false))
        .start();
    native.wait_for_up(WAIT);
    text.wait_for_up(WAIT);

    // Every layer: the p99 of its sections and of its rendezvous waits, from native histograms.
    let all = |s: &[(std::collections::BTreeMap<String, String>, f64)]| layers(s).len() == LAYERS;
    let p99 = native.wait_for_query(
        "histogram_quantile(0.99, sum by (layer) (rate(phasetrace_section_layer_duration_seconds[1m])))",
        all,
        WAIT,
    );
    assert!(p99.iter().all(|(_, v)| *v > 0.0), "{p99:?}");
    native.wait_for_query(
        "histogram_quantile(0.99, sum by (layer) (rate(phasetrace_collective_layer_wait_duration_seconds[1m])))",
        all,
        WAIT,
    );
    // The recording rule on the native form: the per-layer p99 of the rendezvous wait.
    native.wait_for_query("phasetrace:collective_layer_wait_seconds:p99_5m", all, WAIT);
    // The explicit-bucket histograms carry a native half (base-2 exponential): stored as
    // native histograms, their classic buckets not (no `always_scrape_classic_histograms`).
    let counts = native.wait_for_query(
        "histogram_count(rate(phasetrace_section_duration_seconds[1m]))",
        |s| !s.is_empty() && s.iter().any(|(_, v)| *v > 0.0),
        WAIT,
    );
    native.wait_for_query(
        "histogram_quantile(0.99, sum by (rank) (rate(phasetrace_step_duration_seconds[1m])))",
        |s| s.iter().any(|(_, v)| v.is_finite() && *v > 0.0),
        WAIT,
    );
    assert!(
        native
            .query_vector("{__name__=~\"phasetrace_(section|step)_duration_seconds_bucket\"}")
            .is_empty(),
        "the native scrape stores the native halves only"
    );
    assert!(
        native
            .query_vector(
                "{__name__=~\"phasetrace_(step_)?collective_wait_seconds_(sum|count|bucket)\"}"
            )
            .is_empty(),
        "the native scrape stores no classic wait series"
    );
    // The rules the straggler and collective-wait alerts read, from the native form alone.
    let share = native.wait_for_query(
        "phasetrace:rank_wait_share:ratio2m",
        |s| s.iter().any(|(_, v)| v.is_finite()),
        WAIT,
    );
    assert!(
        share
            .iter()
            .all(|(l, v)| l.contains_key("rank") && (0.0..=1.0).contains(v)),
        "{share:?}"
    );
    for rule in [
        "phasetrace:collective_wait_seconds:site_p99_5m",
        "phasetrace:collective_wait_seconds:p99_5m",
        "phasetrace:section_seconds_per_step:rate5m",
    ] {
        native.wait_for_query(
            rule,
            |s| s.iter().any(|(_, v)| v.is_finite() && *v > 0.0),
            WAIT,
        );
    }
    // The per-layer sums are what the text scrape's per-layer time counters say.
    native.wait_for_query(
        "count(histogram_sum(rate(phasetrace_section_layer_duration_seconds[1m])) > 0)",
        |s| s.first().is_some_and(|(_, v)| *v >= LAYERS as f64),
        WAIT,
    );

    // The dashboards' per-layer panels: the native-histogram ones (decode sections and
    // collectives), and the per-layer time ones that fall back to the distributions' sums
    // where the counters are left out (decode sections, speculative decoding).
    let mut checked = 0;
    for file in [
        "decode-sections.json",
        "collectives-rank-skew.json",
        "speculative-decoding.json",
    ] {
        let dashboard: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(support::repo_root().join("dashboards").join(file))
                .expect("dashboard"),
        )
        .expect("dashboard JSON");
        for panel in dashboard["panels"].as_array().expect("panels") {
            let title = panel["title"].as_str().unwrap_or_default();
            let Some(targets) = panel["targets"].as_array() else {
                continue;
            };
            for t in targets {
                let expr = t["expr"].as_str().unwrap_or_default();
                if !expr.contains("phasetrace_section_layer_")
                    && !title.contains("(native histograms)")
                {
                    continue;
                }
                let q = expr
                    .replace("$__rate_interval", "1m")
                    .replace("$__range", "5m")
                    .replace("$nested", "kda_mixer");
                let q = ["$job", "$group", "$rank", "$layer", "$bucket", "$site"]
                    .iter()
                    .fold(q, |q, v| q.replace(v, ".*"));
                let got = native.wait_for_query(&q, |s| layers(s).len() == LAYERS, WAIT);
                assert_eq!(layers(&got).len(), LAYERS, "{file}: {title}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 6, "{checked} per-layer panel expressions");

    // Every panel of the three dashboards, every template variable and every rule, as the
    // live stack check runs them: its built-in allow-list (alert conditions, opt-in series,
    // what needs a web config or OTLP), the native-histogram panels and rules required here,
    // and what a group of one rank legitimately lacks (the time lost to a rank compares it
    // with the other ranks of its group: none).
    let check = std::process::Command::new("python3")
        .arg(repo_root().join("scripts/promql-live-check.py"))
        .args(["--prometheus", native.base_url()])
        .args(["--retry-for", "120", "--retry-interval", "5"])
        .args(["--expect-data", r"\(native histograms\)"])
        .args(["--expect-data", "phasetrace:collective_layer_wait_seconds:"])
        .args([
            "--expect-empty",
            "phasetrace:rank_time_lost:|phasetrace:group_time_lost:",
        ])
        .output()
        .expect("running scripts/promql-live-check.py");
    let out = String::from_utf8_lossy(&check.stdout);
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{out}\n{err}");
    assert!(out.contains(" passed, 0 failed"), "{out}\n{err}");
    // What the allow-list let be empty, and the tally.
    for line in out
        .lines()
        .filter(|l| l.starts_with("empty (allowed") || l.contains(" passed, "))
    {
        eprintln!("{line}");
    }

    // The budget, in Prometheus's own count (its TSDB head) and in bytes.
    let head = native.get_json("/api/v1/status/tsdb").expect("tsdb status");
    let series = head["data"]["headStats"]["numSeries"]
        .as_f64()
        .expect("numSeries");
    let (status, body) = http_request_bytes(
        "GET",
        &format!("http://{target}/metrics"),
        &[("Accept", PROTOBUF)],
        &[],
    )
    .expect("protobuf scrape");
    assert_eq!(status, 200);
    eprintln!(
        "96 layers, 1 rank, native histograms: {series} series in Prometheus, {} bytes per \
         protobuf scrape, {} section histograms",
        body.len(),
        counts.len()
    );
    // Where the series go (for BENCHMARKS.md).
    let mut by_name = native.query_vector("count by (__name__) ({__name__=~\".+\"})");
    by_name.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (l, n) in by_name.iter().take(12) {
        eprintln!("  {n:>6} {}", l.get("__name__").map_or("", String::as_str));
    }
    assert!(series <= SERIES_BUDGET, "{series} series");
    assert!(body.len() <= BYTES_BUDGET, "{} bytes", body.len());
    // What a scrape costs in each format (for BENCHMARKS.md; not asserted).
    for (name, accept) in [
        ("protobuf", PROTOBUF),
        ("text", "text/plain;version=0.0.4"),
        ("openmetrics", "application/openmetrics-text;version=1.0.0"),
    ] {
        let start = Instant::now();
        let mut bytes = 0;
        for _ in 0..5 {
            let (_, b) = http_request_bytes(
                "GET",
                &format!("http://{target}/metrics"),
                &[("Accept", accept)],
                &[],
            )
            .expect("scrape");
            bytes = b.len();
        }
        eprintln!(
            "{name}: {bytes} bytes, {:.1} ms per scrape",
            start.elapsed().as_secs_f64() * 1000.0 / 5.0
        );
    }

    // The text scraper: the classic series, the per-layer counters, no distributions.
    text.wait_for_query(
        "count(phasetrace_section_duration_seconds_bucket)",
        |s| s.first().is_some_and(|(_, v)| *v > 0.0),
        WAIT,
    );
    let calls = text.wait_for_query(
        "sum by (layer) (phasetrace_section_layer_calls_total)",
        |s| layers(s).len() == LAYERS,
        WAIT,
    );
    assert_eq!(layers(&calls).len(), LAYERS);
    assert!(
        text.query_vector("{__name__=~\"phasetrace_.*layer_.*duration_seconds.*\"}")
            .is_empty(),
        "the text scrape has no per-layer distribution"
    );
    let (_, classic) = http_request(
        "GET",
        &format!("http://{target}/metrics"),
        &[("Accept", "text/plain;version=0.0.4")],
        &[],
    )
    .expect("text scrape");
    assert!(classic.contains("phasetrace_section_layer_calls_total{"));
    assert!(!classic.contains("layer_duration"));
    let _ = demo.interrupt_and_wait(WAIT);
}
