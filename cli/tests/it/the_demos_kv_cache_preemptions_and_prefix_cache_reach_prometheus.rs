//! The demo's simulated block manager reports through the recorder: with `--kv-blocks` too few
//! for the requests it admits, it preempts (the count it prints is the one Prometheus reads),
//! the blocks are all free once every request ended, the prefix cache of system prompts hits,
//! and each step's tokens are split into prefill (`input`) and decode (`output`).

use crate::cli;
use crate::support;

use std::time::Duration;

use support::{free_port, http_get};

const RUN: Duration = Duration::from_secs(120);

/// The value of the first sample whose line starts with `series`.
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(series))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
}

#[test]
fn too_few_kv_blocks_preempt_and_every_block_is_free_at_the_end() {
    let target = format!("127.0.0.1:{}", free_port());
    let mut demo = cli::Demo::spawn(
        &[
            "--ranks",
            "1",
            "--layers",
            "2",
            "--duration",
            "6",
            "--request-rate",
            "40",
            "--prompt-tokens",
            "64",
            "--output-tokens",
            "48",
            "--max-output-tokens",
            "96",
            "--kv-blocks",
            "40",
            "--prometheus",
            &target,
            "--linger",
            "60",
        ],
        &[],
    );
    assert_eq!(demo.prometheus_addr(RUN), target);
    let preempted: u64 = demo.wait_for_line(
        |l| {
            let (_, rest) = l.split_once("still open cancelled at the stop, ")?;
            let (n, rest) = rest.split_once(" preempted for KV-cache blocks (")?;
            rest.starts_with("40 in all)").then(|| n.parse().ok())?
        },
        RUN,
    );
    assert!(preempted > 0, "nothing preempted:\n{}", demo.output());

    let (status, body) = http_get(&format!("http://{target}/metrics")).expect("scrape");
    assert_eq!(status, 200);
    assert_eq!(
        value(&body, "phasetrace_preemptions_total{"),
        Some(preempted as f64),
        "{body}"
    );
    assert_eq!(
        value(&body, "phasetrace_kv_cache_blocks_total{"),
        Some(40.0)
    );
    assert_eq!(
        value(&body, "phasetrace_kv_cache_blocks_used{"),
        Some(0.0),
        "every request ended, every block free"
    );
    let queries = value(&body, "phasetrace_prefix_cache_queries_total{").expect("queries");
    let hits = value(&body, "phasetrace_prefix_cache_hits_total{").expect("hits");
    assert!(hits > 0.0 && hits < queries, "hits {hits} of {queries}");
    for kind in ["input", "output"] {
        let n = value(
            &body,
            &format!("phasetrace_step_tokens_count{{gen_ai_token_type=\"{kind}\""),
        );
        assert!(n.is_some_and(|n| n > 0.0), "{kind} tokens: {n:?}\n{body}");
    }
    demo.terminate_and_wait(Duration::from_secs(30));
}
