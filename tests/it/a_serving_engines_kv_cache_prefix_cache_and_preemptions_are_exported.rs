//! A serving engine's state reaches the exporters through its recorder: the KV-cache blocks
//! used and in all (and their share), the prefix cache's queried and hit tokens, the
//! preemptions, and each step's tokens by prefill (`input`) and decode (`output`), on the
//! Prometheus endpoint and on the engine's own meter provider alike. Before the engine reports
//! a family, no series of it is exported (an engine without a prefix cache shows none at 0).

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use phasetrace::{Finish, Profiler, RequestKind, SectionLevel};
use phasetrace_names::metric;

fn scrape(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

/// The value of the one sample whose line starts with `series` (a name and, optionally, the
/// start of its labels).
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .next()
}

#[test]
fn kv_cache_prefix_cache_preemptions_and_step_tokens_reach_prometheus_and_the_engines_provider() {
    let (provider, exporter) = crate::engine_meter::engine_provider(None);
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_meter_provider(provider.clone())
        .build()
        .expect("profiler");
    let addr = p.prometheus_addr().expect("endpoint");
    let rec = p.recorder();
    let class = p
        .request_kind(RequestKind::new("test-engine", "text_completion", "m"))
        .expect("kind");

    // Nothing reported yet: no engine-state series (the step tokens have no step either).
    rec.request_begin(1, class);
    rec.request_begin(2, class);
    p.flush();
    let before = scrape(addr);
    for name in [
        "phasetrace_kv_cache",
        "phasetrace_prefix_cache",
        "phasetrace_preemptions",
        "phasetrace_step_tokens",
    ] {
        assert!(
            !before.lines().any(|l| l.starts_with(name)),
            "{name} exported before the engine reported it:\n{before}"
        );
    }

    // Admission: both prompts looked up in the prefix cache, 8 of 19 tokens found.
    rec.prefix_cache(12, 8);
    rec.prefix_cache(7, 0);
    rec.kv_cache(6, 10);
    {
        // Prefill of both: 19 input tokens.
        let _s = rec.step();
        rec.serve(1, 12, 1);
        rec.serve(2, 7, 1);
    }
    {
        // Decode of both: 2 output tokens.
        let _s = rec.step();
        rec.serve(1, 1, 1);
        rec.serve(2, 1, 1);
    }
    rec.request_begin(3, class);
    // Request 2 is evicted for request 3's blocks.
    rec.preempted(1);
    {
        // Mixed: request 3's prompt (5 input tokens) beside request 1's decode (1 output).
        let _s = rec.step();
        rec.serve(3, 5, 1);
        rec.serve(1, 1, 1);
    }
    for id in 1..=3 {
        rec.request_end(id, Finish::Stop);
    }
    // Every request ended: the blocks are free.
    rec.kv_cache(0, 10);
    p.flush();

    let body = scrape(addr);
    let want = [
        ("phasetrace_kv_cache_blocks_used{", 0.0),
        ("phasetrace_kv_cache_blocks_total{", 10.0),
        ("phasetrace_kv_cache_usage_ratio{", 0.0),
        ("phasetrace_prefix_cache_queries_total{", 19.0),
        ("phasetrace_prefix_cache_hits_total{", 8.0),
        ("phasetrace_preemptions_total{", 1.0),
        (
            "phasetrace_step_tokens_sum{gen_ai_token_type=\"input\"",
            24.0,
        ),
        (
            "phasetrace_step_tokens_count{gen_ai_token_type=\"input\"",
            2.0,
        ),
        (
            "phasetrace_step_tokens_sum{gen_ai_token_type=\"output\"",
            3.0,
        ),
        (
            "phasetrace_step_tokens_count{gen_ai_token_type=\"output\"",
            2.0,
        ),
    ];
    for (series, v) in want {
        assert_eq!(value(&body, series), Some(v), "{series} in:\n{body}");
    }
    // A step of 19 input tokens is in the bucket up to 32, not below 16.
    // The labels' order on a line is the SDK's, not fixed: match the line by its labels.
    let le16 = body
        .lines()
        .find(|l| {
            l.starts_with("phasetrace_step_tokens_bucket{")
                && ["gen_ai_token_type=\"input\"", "rank=\"0\"", "le=\"16\"}"]
                    .iter()
                    .all(|label| l.contains(label))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(le16, Some(1.0), "{body}");

    // The same on the engine's provider.
    provider.force_flush().expect("flush the engine's provider");
    let all = exporter.get_finished_metrics().expect("exported");
    let last = all.last().expect("an export");
    let scope = last
        .scope_metrics()
        .find(|s| s.scope().name() == phasetrace_names::SCOPE)
        .expect("phasetrace's scope");
    let find = |name: &str| {
        scope
            .metrics()
            .find(|m| m.name() == name)
            .unwrap_or_else(|| panic!("{name} not on the engine's provider"))
            .data()
    };
    match find(metric::KV_CACHE_BLOCKS_TOTAL) {
        AggregatedMetrics::U64(MetricData::Gauge(g)) => {
            assert_eq!(g.data_points().map(|d| d.value()).collect::<Vec<_>>(), [10]);
        }
        other => panic!("blocks total: {other:?}"),
    }
    match find(metric::PREEMPTIONS) {
        AggregatedMetrics::U64(MetricData::Sum(s)) => {
            assert!(s.is_monotonic());
            assert_eq!(s.data_points().map(|d| d.value()).collect::<Vec<_>>(), [1]);
        }
        other => panic!("preemptions: {other:?}"),
    }
    match find(metric::STEP_TOKENS) {
        AggregatedMetrics::U64(MetricData::Histogram(h)) => {
            let sum: u64 = h.data_points().map(|d| d.sum()).sum();
            assert_eq!(sum, 27, "input and output tokens of the three steps");
        }
        other => panic!("step tokens: {other:?}"),
    }
    p.shutdown();
}
