//! `phasetrace demo --straggler-period P --straggler-factor F`: for a third of every period one
//! rank (rotating) runs its compute F times slower. The factor is the one given: with
//! `--straggler-factor 1` nothing slows down, so (almost) no `moe_experts` section (about
//! 3 ms at `--time-scale 20`) takes more than 5 ms; with a factor of 6 the sections that run in
//! the straggling windows take about 18 ms. Durations are read from the demo's embedded
//! Prometheus endpoint. Long sections keep host sleep overshoot on a busy machine (up to a
//! millisecond or so) well below the 2 ms margin.

use crate::cli;
use crate::support;

use std::time::Duration;

use cli::{Demo, parse_exposition, sum_samples};
use support::http_get;

const WAIT: Duration = Duration::from_secs(30);
const STEPS: u64 = 60;
/// Both layers are MoE layers (`--dense-layers 0`).
const MOE_LAYERS: u64 = 2;

/// The share of `moe_experts` sections slower than 5 ms in one single-rank demo run.
fn share_over_5ms(extra: &[&str]) -> f64 {
    let steps = STEPS.to_string();
    let mut args = vec![
        "--steps",
        &steps,
        "--ranks",
        "1",
        "--layers",
        "2",
        "--dense-layers",
        "0",
        "--time-scale",
        "20",
        "--trace-every",
        "0",
        "--prometheus",
        "127.0.0.1:0",
        "--linger",
        "30",
    ];
    args.extend_from_slice(extra);
    let mut demo = Demo::spawn(&args, &[]);
    let addr = demo.prometheus_addr(WAIT);
    demo.wait_for_run_end(WAIT);
    let (status, body) =
        http_get(&format!("http://{addr}/metrics")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status, 200, "{body}");
    let samples = parse_exposition(&body);
    let count = sum_samples(
        &samples,
        "phasetrace_section_duration_seconds_count",
        &[("bucket", "moe_experts")],
    );
    assert_eq!(count, (STEPS * MOE_LAYERS) as f64, "{body}");
    let within_5ms = sum_samples(
        &samples,
        "phasetrace_section_duration_seconds_bucket",
        &[("bucket", "moe_experts"), ("le", "0.005")],
    );
    let status = demo.interrupt_and_wait(WAIT);
    assert!(status.success(), "{status}; output:\n{}", demo.output());
    1.0 - within_5ms / count
}

#[test]
fn a_periodic_straggler_uses_the_given_factor() {
    let plain = share_over_5ms(&[]);
    let factor_one = share_over_5ms(&["--straggler-period", "0.2", "--straggler-factor", "1"]);
    let factor_six = share_over_5ms(&["--straggler-period", "0.2", "--straggler-factor", "6"]);
    eprintln!(
        "moe_experts sections over 5 ms: plain {:.1}%, period with factor 1 {:.1}%, with factor 6 {:.1}%",
        plain * 100.0,
        factor_one * 100.0,
        factor_six * 100.0
    );
    // The straggling windows happen: a third of the wall time runs 6x slower, so about
    // 1/(1 + 2*6) = 8% of the sections fall in them (3% is asked, for the phase of the windows
    // against a short run).
    assert!(
        factor_six > 0.03 + plain,
        "--straggler-factor 6: {:.1}% of sections over 5 ms, {:.1}% without a straggler",
        factor_six * 100.0,
        plain * 100.0
    );
    // A factor of 1 slows nothing down. (Were a factor of 3 applied instead, about a fifth of
    // the sections would take 9 ms.)
    assert!(
        factor_one < 0.10 + plain,
        "--straggler-period 0.2 --straggler-factor 1: {:.1}% of sections over 5 ms, {:.1}% \
         without a straggler: the periodic straggler ignores --straggler-factor",
        factor_one * 100.0,
        plain * 100.0
    );
}
