//! Tail-based tracing end to end: with `PHASETRACE_TRACE_EVERY=0` and a slow-step threshold, the
//! demo's steps made slow on purpose (`--slow-steps`) reach a real collector (rotel) as full
//! traces, and the others do not; every traced step was really slower than the threshold.

use crate::cli;

use std::collections::BTreeSet;
use std::time::Duration;

use phasetrace_names::{attr, span};
use phasetrace_testkit::Rotel;

const STEPS: u64 = 200;
const RANKS: u32 = 2;
const LAYERS: u32 = 4;
const SLOW_EVERY: u64 = 20;
/// A step of this demo takes about 2-8 ms (debug build, shared cores), and up to about 100 ms
/// on a machine whose cores are busy with other work; a slowed one (200x its compute) 400 ms
/// or more. The threshold sits between, far from both.
const THRESHOLD_MS: u64 = 200;
const SLOW_FACTOR: &str = "200";
const WAIT: Duration = Duration::from_secs(30);
const RUN: Duration = Duration::from_secs(120);

#[test]
fn only_the_steps_made_slow_are_traced_and_each_in_full() {
    let rotel = Rotel::start();
    let mut cmd = cli::command();
    cmd.args([
        "demo",
        // No requests: a slow request would trace the steps that serve it too.
        "--request-rate",
        "0",
        "--steps",
        &STEPS.to_string(),
        "--ranks",
        &RANKS.to_string(),
        "--layers",
        &LAYERS.to_string(),
        "--slow-steps",
        &SLOW_EVERY.to_string(),
        "--slow-factor",
        SLOW_FACTOR,
        "--trace-every",
        "0",
    ])
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", rotel.grpc_endpoint())
    .env("PHASETRACE_TRACE_SLOWER_THAN", format!("{THRESHOLD_MS}ms"))
    .env("PHASETRACE_TRACE_SLOW_BUDGET", "1000");
    let run = cli::run(cmd, RUN);
    assert_eq!(run.code, Some(0), "{run}");
    let planned = STEPS / SLOW_EVERY;
    assert!(
        run.stderr
            .contains(&format!("demo: {planned} steps made slow on purpose")),
        "{run}"
    );

    let slow: BTreeSet<(String, u64)> = (0..RANKS)
        .flat_map(|r| {
            (0..STEPS)
                .filter(|s| (s + 1) % SLOW_EVERY == 0)
                .map(move |s| (r.to_string(), s))
        })
        .collect();
    let p = rotel.wait_for(
        |p| {
            let traced: BTreeSet<(String, u64)> = p
                .spans_named(span::STEP)
                .iter()
                .filter_map(|s| {
                    Some((
                        s.attr(attr::RANK)?.to_owned(),
                        s.attr(attr::STEP)?.parse().ok()?,
                    ))
                })
                .collect();
            slow.is_subset(&traced)
        },
        WAIT,
    );
    let steps = p.spans_named(span::STEP);
    let mut unplanned = Vec::new();
    for s in &steps {
        assert_eq!(s.attr(attr::SAMPLED), Some("tail"), "{s:#?}");
        assert!(
            s.duration_nanos() > THRESHOLD_MS * 1_000_000,
            "a traced step no slower than the threshold: {s:#?}"
        );
        let key = (
            s.attr(attr::RANK).unwrap().to_owned(),
            s.attr(attr::STEP).unwrap().parse::<u64>().unwrap(),
        );
        if !slow.contains(&key) {
            unplanned.push(key);
        }
        // In full: one layer span per layer, each with its sections; the MoE routes as events.
        let layers: Vec<_> = p
            .children_of(s)
            .into_iter()
            .filter(|c| c.name == span::LAYER)
            .collect();
        assert_eq!(layers.len(), LAYERS as usize, "{s:#?}");
        for l in layers {
            assert!(p.children_of(l).len() >= 8, "{l:#?}");
        }
        assert_eq!(s.events.len(), LAYERS as usize - 1, "{s:#?}");
    }
    // Steps the machine made slow by itself (a preempted rank) are rightly traced too, since
    // they were slower than the threshold; on a quiet machine there are none.
    assert!(
        unplanned.len() as u64 <= STEPS * u64::from(RANKS) / 20,
        "{} steps traced that the demo did not slow: {unplanned:?}",
        unplanned.len()
    );
    assert_eq!(steps.len(), slow.len() + unplanned.len());
    assert!(
        run.stderr.contains(&format!(
            "{} traced for being slow, 0 slow ones over the tail budget",
            steps.len()
        )),
        "{run}"
    );
}
