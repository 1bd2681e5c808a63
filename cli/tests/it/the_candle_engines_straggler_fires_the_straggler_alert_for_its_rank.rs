//! `phasetrace demo --engine candle` with one of two tensor-parallel rank threads doing 3x the
//! compute (each of its sections runs three times: real matrix products, not a sleep): a real
//! Prometheus loading the bundled rule files unchanged (`otel-config/rules/*.yml`) fires
//! `PhasetraceRankStraggler` for that rank, and never for the other. What decides is a share
//! (the time the group loses waiting for the rank), so a loaded machine changes how fast the
//! model runs, not the verdict. About 2 minutes: the rules' 2-minute windows and `for: 1m`.

use crate::cli::Demo;
use crate::the_straggler_alert_names_the_rank_its_group_waits_for::{alerts, prometheus};

use std::time::{Duration, Instant};

const STRAGGLER: &str = "PhasetraceRankStraggler";

#[test]
fn a_rank_with_three_times_the_compute_fires_the_alert_naming_it() {
    crate::support::require_tools!(Prometheus);
    let port = crate::support::free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let mut demo = Demo::spawn(
        &[
            "--engine",
            "candle",
            "--ranks",
            "2",
            "--layers",
            "4",
            "--hidden",
            "128",
            "--experts",
            "8",
            "--top-k",
            "2",
            "--straggler-rank",
            "1",
            "--straggler-factor",
            "3",
            "--duration",
            "600",
            "--trace-every",
            "0",
            "--group",
            "candle",
            "--prometheus",
            &addr,
        ],
        &[],
    );
    demo.prometheus_addr(Duration::from_secs(60));
    let prom = prometheus("phasetrace", &[addr], "1s");
    prom.wait_for_up(Duration::from_secs(90));
    let start = Instant::now();
    let deadline = Duration::from_secs(240);
    let fired = loop {
        let now = start.elapsed();
        let found = alerts(&prom, STRAGGLER);
        for a in &found {
            assert_eq!(
                a.label("rank"),
                "1",
                "after {now:?}: a straggler alert for another rank: {a:#?}"
            );
        }
        if let Some(a) = found.into_iter().find(|a| a.state == "firing") {
            break a;
        }
        assert!(
            demo.exited().is_none(),
            "the demo exited; output:\n{}",
            demo.output()
        );
        assert!(
            now < deadline,
            "no {STRAGGLER} firing within {deadline:?}; lost: {:?}\n{}",
            prom.query_vector("phasetrace:rank_time_lost:ratio2m"),
            demo.output()
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    assert_eq!(fired.label("group"), "candle");
    // Rank 0 waits for about two thirds of each step's compute; the loss is a share.
    assert!(
        (0.2..0.95).contains(&fired.value),
        "time lost to rank 1: {} ({fired:#?})",
        fired.value
    );
    let status = demo.interrupt_and_wait(Duration::from_secs(60));
    assert!(status.success(), "{status}; output:\n{}", demo.output());
    let out = demo.output();
    // stdout (the checksum) and stderr (the console summary at shutdown) are captured
    // together, so their order here is the pipes' and not the demo's.
    assert!(
        out.lines().any(|l| l.starts_with("demo: checksum")),
        "a line names the checksum:\n{out}"
    );
}
