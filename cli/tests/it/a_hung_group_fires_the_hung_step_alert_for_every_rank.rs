//! `PhasetraceStepHung` against a real hang: `phasetrace demo --hang-rank R` blocks rank R
//! forever inside a step (in a section, before its all-reduce), so the other ranks block at that
//! all-reduce, as NCCL ranks do when one of them hangs. The processes stay up and exporting, so
//! no rank is silent and none straggles; what tells the hang from an idle engine is
//! `phasetrace_step_open_duration_seconds`, the step that began and has not ended.
//!
//! - Rank threads, one demo process per group, in one Prometheus job (scraped every second,
//!   rules evaluated every second, the bundled rule files unchanged): in group `hung` (4 ranks,
//!   rank 2 hangs) the gauge grows on every rank's `/metrics`, and `PhasetraceStepHung` fires for
//!   each of the 4 ranks within 90 s of the hang (threshold 30 s, `for: 30s`, plus the scrape and
//!   evaluation), its description naming the group's hung ranks, instance and host; the group
//!   raises no silent or straggler alert. A healthy group (`busy`) and an idle one (`idle`,
//!   finished its steps and lingering: the gauge at 0 on every rank) beside it raise none. Then
//!   SIGINT ends the hung demo (the ranks still blocked are left behind, said on stderr).
//! - Ranks as processes (`--rank R --rendezvous`): rank 1 hangs with the CUDA event backend on a
//!   simulated stream (a kernel that never finishes: the host blocks at its next synchronize,
//!   the stream never reaches the marks after it); rank 0 blocks in the TCP rendezvous. Both
//!   gauges grow; SIGTERM ends the blocked rank 0 and SIGINT the hung rank 1.
//!
//! About 75 s for the first test (the alert's own threshold and `for:`), 15 s for the second,
//! in parallel.

use crate::cli::{self, Demo, parse_exposition};
use crate::support::{self, http_get};
use crate::the_straggler_alert_names_the_rank_its_group_waits_for::{Alert, alerts, prometheus};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const HUNG: &str = "PhasetraceStepHung";
const POLL: Duration = Duration::from_secs(2);
/// From the hang to the alert firing at most: the 30 s threshold, `for: 30s`, a scrape and an
/// evaluation interval, and a loaded machine's slack.
const LIMIT: Duration = Duration::from_secs(90);

/// `phasetrace_step_open_duration_seconds` per rank on one demo's endpoint.
fn open_durations(addr: &str) -> BTreeMap<String, f64> {
    let (status, body) = http_get(&format!("http://{addr}/metrics"))
        .unwrap_or_else(|e| panic!("scraping {addr}: {e}"));
    assert_eq!(status, 200, "{body}");
    parse_exposition(&body)
        .into_iter()
        .filter(|(name, _, _)| name == "phasetrace_step_open_duration_seconds")
        .map(|(_, labels, v)| {
            let rank = labels
                .iter()
                .find(|(k, _)| k == "rank")
                .map(|(_, r)| r.clone())
                .unwrap_or_default();
            (rank, v)
        })
        .collect()
}

fn demo(group: &str, addr: &str, extra: &[&str]) -> Demo {
    let mut args = vec![
        "--layers",
        "4",
        "--time-scale",
        "20",
        "--spin-us",
        "0",
        "--trace-every",
        "0",
        "--group",
        group,
        "--prometheus",
        addr,
    ];
    args.extend(extra);
    Demo::spawn(&args, &[])
}

#[test]
fn a_hung_group_fires_for_every_rank_and_a_busy_or_idle_one_does_not() {
    support::require_tools!(Prometheus);
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", support::free_port()))
        .collect();
    let mut hung = demo(
        "hung",
        &addrs[0],
        &[
            "--ranks",
            "4",
            "--duration",
            "900",
            "--hang-rank",
            "2",
            "--hang-after-steps",
            "20",
        ],
    );
    let mut busy = demo("busy", &addrs[1], &["--ranks", "2", "--duration", "900"]);
    let mut idle = demo(
        "idle",
        &addrs[2],
        &["--ranks", "2", "--steps", "20", "--linger", "900"],
    );
    let prom = prometheus("phasetrace", &addrs, "1s");
    prom.wait_for_up(Duration::from_secs(90));
    let outputs = |demos: &[&Demo]| {
        demos
            .iter()
            .map(|d| d.output())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    idle.wait_for_run_end(Duration::from_secs(60));

    let start = Instant::now();
    // When the hang began (the latest scrape's time less the longest open step), the gauge
    // readings of the hung group (each must grow), and when each rank's alert fired.
    let mut hang_began: Option<Instant> = None;
    let mut first: BTreeMap<String, f64> = BTreeMap::new();
    let mut last: BTreeMap<String, f64> = BTreeMap::new();
    let mut fired: BTreeMap<String, (Instant, Alert)> = BTreeMap::new();
    loop {
        let now = Instant::now();
        let open = open_durations(&addrs[0]);
        if let Some(max) = open.values().copied().reduce(f64::max)
            && max > 1.0
        {
            hang_began.get_or_insert(now - Duration::from_secs_f64(max));
            for (r, v) in &open {
                first.entry(r.clone()).or_insert(*v);
            }
            last = open;
        }
        // The idle demo: every rank's series exists, at 0.
        let idle_open = open_durations(&addrs[2]);
        assert_eq!(
            idle_open,
            BTreeMap::from([("0".to_owned(), 0.0), ("1".to_owned(), 0.0)]),
            "the idle demo's open steps"
        );
        for a in alerts(&prom, HUNG) {
            assert_eq!(
                a.label("group"),
                "hung",
                "a hung-step alert outside the hung group: {a:#?}\n{}",
                outputs(&[&hung, &busy, &idle])
            );
            if a.state == "firing" {
                fired.entry(a.label("rank").to_owned()).or_insert((now, a));
            }
        }
        // Neither silent nor straggling: not the hung group (pending included), nor any other.
        for name in ["PhasetraceRankSilent", "PhasetraceRankStraggler"] {
            let wrong: Vec<_> = alerts(&prom, name)
                .into_iter()
                .filter(|a| a.label("group") == "hung" || a.state == "firing")
                .collect();
            assert!(wrong.is_empty(), "{name} beside a hung group: {wrong:#?}");
        }
        if fired.len() == 4 {
            break;
        }
        let since = hang_began.map_or(start, |t| t);
        assert!(
            now.duration_since(since) < LIMIT + POLL,
            "{HUNG} not firing for every rank of group hung within {LIMIT:?} of the hang: fired for {:?}; \
             open steps {last:?}; alerts {:#?}\n{}\n{}",
            fired.keys().collect::<Vec<_>>(),
            alerts(&prom, HUNG),
            outputs(&[&hung, &busy, &idle]),
            prom.output()
        );
        std::thread::sleep(POLL);
    }
    let began = hang_began.expect("the hung group's steps never opened");
    // Every rank of the hung group has a growing open step.
    assert_eq!(first.len(), 4, "{first:?}");
    for (r, v) in &first {
        assert!(
            last[r] > v + 20.0,
            "rank {r}: open {v} s, then {} s",
            last[r]
        );
    }
    for (rank, (at, a)) in &fired {
        let after = at.duration_since(began);
        assert!(
            after <= LIMIT,
            "rank {rank}: fired {after:?} after the hang"
        );
        let d = &a.annotations["description"];
        assert!(
            d.contains(&format!("Rank {rank} of group hung in phasetrace (instance 127.0.0.1:"))
                && d.contains(", host ")
                && d.contains("Hung in group hung: 4 of the 4 ranks seen in the last 10 minutes (rank 0, 1, 2, 3)"),
            "{d}"
        );
        eprintln!(
            "{HUNG} firing for rank {rank} of group hung {:.0} s after the hang (value {:.0} s)",
            after.as_secs_f64(),
            a.value
        );
    }
    eprintln!("  {}", fired["2"].1.annotations["description"]);
    // The busy group steps on, the idle one stays at 0 (checked above); neither ever alerted.
    let busy_open = open_durations(&addrs[1]);
    assert_eq!(busy_open.len(), 2, "{busy_open:?}");
    assert!(busy_open.values().all(|v| *v < 5.0), "{busy_open:?}");

    // SIGINT ends the hung demo: the blocked ranks are left behind, said on stderr, exit 0 (the
    // hang was asked for).
    let status = hung.interrupt_and_wait(Duration::from_secs(30));
    let out = hung.output();
    assert_eq!(status.code(), Some(0), "{status}\n{out}");
    assert!(
        out.contains("phasetrace: ranks 0, 1, 2, 3 of 4 still blocked inside a step 5s after the stop request (--hang-rank 2)"),
        "{out}"
    );
    for d in [&mut busy, &mut idle] {
        let status = d.interrupt_and_wait(Duration::from_secs(30));
        assert_eq!(status.code(), Some(0), "{status}\n{}", d.output());
    }
}

#[test]
fn a_hung_rank_process_and_the_peer_blocked_on_it_both_count_and_stop_on_signals() {
    let rendezvous = format!("127.0.0.1:{}", support::free_port());
    let addrs: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", support::free_port()))
        .collect();
    let mut ranks: Vec<Demo> = (0..2)
        .map(|r| {
            let rank = r.to_string();
            let mut cmd = cli::command();
            cmd.args([
                "demo",
                "--ranks",
                "2",
                "--rank",
                &rank,
                "--rendezvous",
                &rendezvous,
                "--rendezvous-timeout",
                "600",
                "--group",
                "tp0",
                "--duration",
                "900",
                "--layers",
                "4",
                "--spin-us",
                "0",
                "--trace-every",
                "0",
                "--prometheus",
                &addrs[r],
                "--hang-rank",
                "1",
                "--hang-after-steps",
                "10",
            ]);
            if r == 1 {
                // A kernel that never finishes on the rank's (simulated) stream, timed by events.
                cmd.env("PHASETRACE_TIMING", "events");
            }
            Demo::spawn_command(cmd)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen: Vec<Vec<f64>> = vec![Vec::new(); 2];
    while seen.iter().any(|v| v.len() < 2 || v[v.len() - 1] < 3.0) {
        assert!(
            Instant::now() < deadline,
            "open steps {seen:?}\n{}\n---\n{}",
            ranks[0].output(),
            ranks[1].output()
        );
        for (r, addr) in addrs.iter().enumerate() {
            if let Ok((200, body)) = http_get(&format!("http://{addr}/metrics")) {
                let v = parse_exposition(&body)
                    .into_iter()
                    .find(|(n, l, _)| {
                        n == "phasetrace_step_open_duration_seconds"
                            && l.iter().any(|(k, v)| k == "rank" && *v == r.to_string())
                    })
                    .map(|(_, _, v)| v);
                if let Some(v) = v
                    && v > 0.5
                {
                    seen[r].push(v);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    for (r, v) in seen.iter().enumerate() {
        assert!(v.windows(2).all(|w| w[1] > w[0]), "rank {r}: {v:?}");
    }
    assert!(
        ranks[1].output().contains("timing backend events"),
        "{}",
        ranks[1].output()
    );
    // SIGTERM on the rank blocked in the rendezvous, SIGINT on the hung one: both exit, each
    // saying which rank it left blocked.
    let t = Instant::now();
    let status = ranks[0].terminate_and_wait(Duration::from_secs(30));
    let out0 = ranks[0].output();
    assert_eq!(status.code(), Some(0), "{status}\n{out0}");
    assert!(
        out0.contains("phasetrace: rank 0 of 2 still blocked inside a step 5s after the stop request (--hang-rank 1)"),
        "{out0}"
    );
    let status = ranks[1].interrupt_and_wait(Duration::from_secs(30));
    let out1 = ranks[1].output();
    assert_eq!(status.code(), Some(0), "{status}\n{out1}");
    assert!(
        out1.contains("phasetrace: rank 1 of 2 still blocked inside a step 5s after the stop request (--hang-rank 1)"),
        "{out1}"
    );
    eprintln!(
        "open steps (s) rank 0 {:?}, rank 1 {:?}; both stopped {:.1} s after the signals",
        seen[0],
        seen[1],
        t.elapsed().as_secs_f64()
    );
}
