//! Expert parallelism end to end: `phasetrace demo --ranks 4 --expert-parallel 4 --route-skew 6`
//! places each MoE layer's 64 experts on the 4 ranks in blocks of 16 and sends most tokens to
//! the lowest ids, so rank 0 computes most of the routed-expert work and the others wait for
//! it. A real Prometheus loading the bundled rules unchanged fires `PhasetraceRankStraggler`
//! for rank 0 only, and its description names the hot experts rank 0 hosts (layer, expert
//! ids), read from `phasetrace_moe_hot_expert_share{ep_rank="0"}`.

use crate::cli::Demo;
use crate::support;
use crate::the_straggler_alert_names_the_rank_its_group_waits_for::{alerts, prometheus};

use std::time::{Duration, Instant};

const STRAGGLER: &str = "PhasetraceRankStraggler";

#[test]
fn a_rank_hosting_hot_experts_straggles_and_its_alert_names_them() {
    support::require_tools!(Prometheus);
    let addr = format!("127.0.0.1:{}", support::free_port());
    let mut demo = Demo::spawn(
        &[
            "--group",
            "ep4",
            "--ranks",
            "4",
            "--layers",
            "4",
            "--dense-layers",
            "1",
            "--experts",
            "64",
            "--top-k",
            "8",
            "--expert-parallel",
            "4",
            "--route-skew",
            "6",
            "--expert-counter",
            "on",
            "--expert-window",
            "16",
            "--duration",
            "600",
            "--time-scale",
            "20",
            "--spin-us",
            "0",
            "--trace-every",
            "0",
            "--prometheus",
            &addr,
        ],
        &[],
    );
    let prom = prometheus("phasetrace", std::slice::from_ref(&addr), "1s");
    prom.wait_for_up(Duration::from_secs(90));
    let start = Instant::now();
    let fired = loop {
        let now = alerts(&prom, STRAGGLER);
        for a in &now {
            assert_eq!(
                a.label("rank"),
                "0",
                "a straggler alert for another rank: {a:#?}"
            );
        }
        if let Some(a) = now.into_iter().find(|a| a.state == "firing") {
            break a;
        }
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "no {STRAGGLER} for rank 0 within 4 minutes; lost: {:?}\nhot: {:?}\n{}",
            prom.query_vector("phasetrace:rank_time_lost:ratio2m"),
            prom.query_vector("phasetrace_moe_hot_expert_share"),
            demo.output()
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    let d = fired
        .annotations
        .get("description")
        .cloned()
        .unwrap_or_default();
    eprintln!(
        "{STRAGGLER} for rank 0 after {:.0} s, value {:.3}: {d}",
        start.elapsed().as_secs_f64(),
        fired.value
    );
    assert!(d.contains("Rank 0 of group ep4"), "{d}");
    // Expert 0 of each MoE layer gets about half the tokens (u^6 < 1/64 half the time).
    assert!(d.contains("It hosts the hot experts 0 of layer "), "{d}");
    assert!(d.contains("replicate or move those experts"), "{d}");
    // Only experts of rank 0's block (ids 0-15) are named.
    let named: Vec<u32> = d
        .split("hot experts")
        .nth(1)
        .unwrap_or("")
        .split(" of layer ")
        .filter_map(|s| s.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(
        !named.is_empty() && named.iter().all(|&e| e < 16),
        "{named:?}: {d}"
    );
    assert!(fired.value > 0.05, "time lost {}", fired.value);
    let _ = demo.interrupt_and_wait(Duration::from_secs(60));
}
