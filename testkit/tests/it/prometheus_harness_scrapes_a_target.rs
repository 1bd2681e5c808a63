//! Self-test of the Prometheus harness in `phasetrace-testkit`: a real Prometheus scrapes a static
//! exposition served from this process, evaluates a recording rule, and the query helpers
//! return the exact values.

use crate::support;

use std::time::Duration;

use support::{Prometheus, StaticHttpServer, http_get, process, url_encode};

const WAIT: Duration = Duration::from_secs(30);
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn exposition(decode: f64) -> String {
    format!(
        "# HELP phasetrace_harness_value A value to scrape.\n\
         # TYPE phasetrace_harness_value gauge\n\
         phasetrace_harness_value{{phase=\"prefill\"}} 12.5\n\
         phasetrace_harness_value{{phase=\"decode\"}} {decode}\n\
         # HELP phasetrace_harness_total A counter.\n\
         # TYPE phasetrace_harness_total counter\n\
         phasetrace_harness_total 42\n"
    )
}

const RULES: &str = "\
groups:
  - name: harness
    rules:
      - record: phasetrace:harness_value:sum
        expr: sum(phasetrace_harness_value)
";

#[test]
fn prometheus_scrapes_exact_values_and_evaluates_rules() {
    support::require_tools!(Prometheus);
    let target = StaticHttpServer::start(&exposition(3.0), CONTENT_TYPE);
    let prometheus = Prometheus::builder()
        .targets(&[target.address()])
        .scrape_interval("1s")
        .rule_text("harness.rules.yml", RULES)
        .start();
    prometheus.wait_for_up(WAIT);
    assert!(target.requests() >= 1);

    let mut values = prometheus.query_vector("phasetrace_harness_value");
    values.sort_by(|a, b| a.0.get("phase").cmp(&b.0.get("phase")));
    assert_eq!(values.len(), 2, "{values:?}");
    assert_eq!(values[0].0.get("phase").map(String::as_str), Some("decode"));
    assert_eq!(values[0].1, 3.0);
    assert_eq!(
        values[1].0.get("phase").map(String::as_str),
        Some("prefill")
    );
    assert_eq!(values[1].1, 12.5);
    let labels = &values[1].0;
    assert_eq!(labels.get("job").map(String::as_str), Some("target-0"));
    assert_eq!(labels.get("instance"), Some(&target.address()));
    assert_eq!(
        labels.get("__name__").map(String::as_str),
        Some("phasetrace_harness_value")
    );

    assert_eq!(
        prometheus.query_scalar("phasetrace_harness_total"),
        Some(42.0)
    );
    assert_eq!(
        prometheus.query_scalar("scalar(sum(phasetrace_harness_value))"),
        Some(15.5)
    );
    assert_eq!(prometheus.query_scalar("phasetrace_no_such_metric"), None);
    assert_eq!(prometheus.query("vector(1)")["status"], "success");

    // The recording rule is evaluated against the scraped data.
    prometheus.wait_for_query(
        "phasetrace:harness_value:sum",
        |s| s.len() == 1 && s[0].1 == 15.5,
        WAIT,
    );
    assert_eq!(
        prometheus.rules()["data"]["groups"][0]["rules"][0]["name"],
        "phasetrace:harness_value:sum"
    );

    // A new value is picked up by the next scrapes.
    target.set_body(&exposition(7.25));
    prometheus.wait_for_query(
        "phasetrace_harness_value{phase=\"decode\"}",
        |s| s.len() == 1 && s[0].1 == 7.25,
        WAIT,
    );
    prometheus.wait_for_query(
        "phasetrace:harness_value:sum",
        |s| s.len() == 1 && s[0].1 == 19.75,
        WAIT,
    );

    // A bad query is an error, not a panic, through try_query.
    assert!(prometheus.try_query("sum(").is_err());
    let targets = prometheus.targets();
    assert_eq!(targets["data"]["activeTargets"][0]["health"], "up");
}

#[test]
fn wait_for_up_covers_every_target() {
    support::require_tools!(Prometheus);
    let first = StaticHttpServer::start(&exposition(1.0), CONTENT_TYPE);
    let second = StaticHttpServer::start(&exposition(2.0), CONTENT_TYPE);
    let prometheus = Prometheus::start(&[first.address(), second.address()], "1s");
    prometheus.wait_for_up(WAIT);
    let up = prometheus.query_vector("up");
    assert_eq!(up.len(), 2, "{up:?}");
    let decode =
        prometheus.query_vector("sum by (job) (phasetrace_harness_value{phase=\"decode\"})");
    let mut by_job: Vec<(String, f64)> = decode
        .into_iter()
        .map(|(labels, value)| (labels["job"].clone(), value))
        .collect();
    by_job.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        by_job,
        vec![("target-0".to_string(), 1.0), ("target-1".to_string(), 2.0)]
    );
}

#[test]
fn http_get_reads_static_and_chunked_responses() {
    let server = StaticHttpServer::start("hello\nworld\n", "text/plain");
    let (status, body) = http_get(&format!("{}/metrics", server.url())).expect("GET");
    assert_eq!((status, body.as_str()), (200, "hello\nworld\n"));
    assert!(http_get("https://127.0.0.1:1/").is_err());
    assert!(http_get(&format!("http://127.0.0.1:{}/", support::free_port())).is_err());

    let raw = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n";
    assert_eq!(
        process::parse_http_response(raw).expect("chunked response"),
        (404, "Wikipedia".to_string())
    );
    assert_eq!(url_encode("up{job=\"a b\"}"), "up%7Bjob%3D%22a%20b%22%7D");
}
