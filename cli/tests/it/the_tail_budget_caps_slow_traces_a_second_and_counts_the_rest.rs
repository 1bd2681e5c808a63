//! The tail-trace budget: when every step is slower than the threshold, a rank's tail traces
//! reaching a real collector (rotel) stay at `PHASETRACE_TRACE_SLOW_BUDGET` in any second, and
//! every slow step over it is counted in `phasetrace.records.dropped{reason="tail_budget"}`.

use crate::cli;

use std::time::Duration;

use phasetrace::DropReason;
use phasetrace_names::{attr, metric, span};
use phasetrace_testkit::Rotel;

const BUDGET: usize = 4;
const SECONDS: f64 = 4.0;
const WAIT: Duration = Duration::from_secs(30);
const RUN: Duration = Duration::from_secs(60);

#[test]
fn tail_traces_stay_at_the_cap_and_the_excess_is_counted() {
    let rotel = Rotel::start();
    let mut cmd = cli::command();
    cmd.args([
        "demo",
        // No requests: a slow request would trace the steps that serve it too.
        "--request-rate",
        "0",
        "--duration",
        &SECONDS.to_string(),
        "--ranks",
        "1",
        "--layers",
        "2",
        "--trace-every",
        "0",
    ])
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", rotel.grpc_endpoint())
    .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
    // Every step is slower than 1 µs.
    .env("PHASETRACE_TRACE_SLOWER_THAN", "1us")
    .env("PHASETRACE_TRACE_SLOW_BUDGET", BUDGET.to_string());
    let run = cli::run(cmd, RUN);
    assert_eq!(run.code, Some(0), "{run}");

    // The final export carries every step and every drop.
    let steps_of = |p: &phasetrace_testkit::ParsedOutput| {
        p.latest_point(metric::STEPS, &[(attr::RANK, "0")])
            .and_then(|pt| pt.value)
    };
    let dropped_of = |p: &phasetrace_testkit::ParsedOutput| {
        p.latest_point(
            metric::RECORDS_DROPPED,
            &[(attr::REASON, DropReason::TailBudget.as_str())],
        )
        .and_then(|pt| pt.value)
    };
    let p = rotel.wait_for(
        |p| {
            let (Some(steps), Some(dropped)) = (steps_of(p), dropped_of(p)) else {
                return false;
            };
            p.spans_named(span::STEP).len() as f64 + dropped == steps
        },
        WAIT,
    );
    let steps = steps_of(&p).unwrap();
    let mut ends: Vec<u64> = p
        .spans_named(span::STEP)
        .iter()
        .map(|s| {
            assert_eq!(s.attr(attr::SAMPLED), Some("tail"), "{s:#?}");
            s.end_unix_nanos
        })
        .collect();
    ends.sort_unstable();
    let traced = ends.len();
    assert!(
        steps > (traced * 10) as f64,
        "the demo should run far more steps ({steps}) than the budget lets through ({traced})"
    );
    // At the cap: never more than BUDGET in any one second, and the budget is used.
    for (i, &a) in ends.iter().enumerate() {
        let in_second = ends[i..]
            .iter()
            .take_while(|&&b| b < a + 1_000_000_000)
            .count();
        assert!(
            in_second <= BUDGET,
            "{in_second} tail traces within 1 s of {a}: {ends:?}"
        );
    }
    let floor = BUDGET * (SECONDS as usize - 1);
    let ceil = BUDGET * (SECONDS as usize + 1);
    assert!(
        (floor..=ceil).contains(&traced),
        "{traced} tail traces in {SECONDS} s at {BUDGET}/s"
    );
}
