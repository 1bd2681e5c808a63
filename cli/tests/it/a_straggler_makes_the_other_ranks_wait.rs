//! `phasetrace demo --straggler-rank 1 --straggler-factor 4`: rank 1's compute runs four times
//! slower, so at every all-reduce rendezvous rank 0 arrives first and waits. The collective
//! wait histogram (`phasetrace_collective_wait_seconds`, read from the demo's embedded
//! Prometheus endpoint) must show it: rank 0's mean wait is far higher than without a
//! straggler, and higher than the straggler's own.

use crate::cli;
use crate::support;

use std::time::Duration;

use cli::{Demo, parse_exposition, sum_samples};
use support::http_get;

const WAIT: Duration = Duration::from_secs(30);
const STEPS: u64 = 60;
const LAYERS: u32 = 2;

/// Mean collective wait (seconds) and wait count per rank, after a demo run.
#[derive(Debug)]
struct Waits {
    mean: [f64; 2],
    count: [f64; 2],
}

fn run_demo(straggler: bool) -> Waits {
    let steps = STEPS.to_string();
    let layers = LAYERS.to_string();
    let mut args = vec![
        "--steps",
        &steps,
        "--ranks",
        "2",
        "--layers",
        &layers,
        "--prometheus",
        "127.0.0.1:0",
        "--trace-every",
        "0",
        // Longer sections: the straggler's extra compute stands well above scheduling noise.
        "--time-scale",
        "4",
        "--linger",
        "30",
    ];
    if straggler {
        args.extend(["--straggler-rank", "1", "--straggler-factor", "4"]);
    }
    let mut demo = Demo::spawn(&args, &[]);
    let addr = demo.prometheus_addr(WAIT);
    let end = demo.wait_for_run_end(WAIT);
    assert!(end.starts_with(&format!("demo: {STEPS} steps")), "{end}");
    // The run is over and flushed: the endpoint now holds the final values.
    let (status, body) =
        http_get(&format!("http://{addr}/metrics")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status, 200, "{body}");
    let samples = parse_exposition(&body);
    let mut waits = Waits {
        mean: [0.0; 2],
        count: [0.0; 2],
    };
    for rank in 0..2 {
        let r = rank.to_string();
        let labels = [("rank", r.as_str())];
        let sum = sum_samples(&samples, "phasetrace_collective_wait_seconds_sum", &labels);
        let count = sum_samples(
            &samples,
            "phasetrace_collective_wait_seconds_count",
            &labels,
        );
        waits.count[rank] = count;
        waits.mean[rank] = sum / count;
    }
    let status = demo.interrupt_and_wait(WAIT);
    assert!(status.success(), "{status}; output:\n{}", demo.output());
    waits
}

#[test]
fn rank_zero_waits_for_a_slow_rank_one() {
    let even = run_demo(false);
    let skewed = run_demo(true);
    eprintln!("without a straggler: {even:?}\nwith rank 1 straggling: {skewed:?}");

    // Every rank passes two rendezvous probes per layer and step, in both runs.
    let probes = (STEPS * u64::from(LAYERS) * 2) as f64;
    assert_eq!(even.count, [probes, probes]);
    assert_eq!(skewed.count, [probes, probes]);

    // Rank 1's compute between two rendezvous is about 4 x 4 x (150..240) µs, rank 0's a
    // quarter of that: rank 0 should wait about 2.3 ms longer at each probe. Scheduling noise
    // on a busy machine adds a few hundred µs to both runs.
    let extra = skewed.mean[0] - even.mean[0];
    assert!(
        extra > 1e-3 && skewed.mean[0] > 2.0 * even.mean[0],
        "rank 0 mean wait {:.1} µs with the straggler vs {:.1} µs without",
        skewed.mean[0] * 1e6,
        even.mean[0] * 1e6
    );
    // The straggler arrives last and barely waits.
    assert!(
        skewed.mean[0] > 3.0 * skewed.mean[1],
        "rank 0 waits {:.1} µs, rank 1 waits {:.1} µs",
        skewed.mean[0] * 1e6,
        skewed.mean[1] * 1e6
    );
}
