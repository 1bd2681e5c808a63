//! `phasetrace demo --engine candle --rank R --rendezvous HOST:PORT` runs one tensor-parallel
//! rank of the candle decoder per process, the ranks' partial outputs meeting in a real
//! all-reduce over TCP: on one host and on separate hosts (network namespaces), a group of
//! processes generates exactly the tokens a group of rank threads generates (the same
//! `checksum` line on every rank), serving requests with speculative decoding. A rank whose
//! peers never come is told which are missing.

use crate::cli::{self, Finished};
use crate::hosts::{Hosts, is_root};
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

/// The model and run: 2 ranks, dense and MoE layers, a shallow draft, requests served.
const RUN: &[&str] = &[
    "demo",
    "--engine",
    "candle",
    "--ranks",
    "2",
    "--layers",
    "3",
    "--hidden",
    "128",
    "--experts",
    "8",
    "--top-k",
    "2",
    "--steps",
    "16",
    "--spec",
    "3",
    "--prometheus",
    "off",
    "--trace-every",
    "0",
];

fn checksum(f: &Finished, who: &str) -> String {
    assert_eq!(f.code, Some(0), "{who}: {f}");
    let last = f.stdout.lines().last().unwrap_or("");
    assert!(last.contains("checksum"), "{who}: last line {last:?}\n{f}");
    last.split_whitespace()
        .find(|w| w.len() == 16 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("{who}: a hex digest in {last:?}"))
        .to_owned()
}

/// Runs every rank of the group meeting at `rendezvous`, rank `r` through `launch(r)`, and
/// returns each one's output.
fn group(rendezvous: &str, launch: impl Fn(usize) -> Command) -> Vec<Finished> {
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let mut cmd = launch(r);
            cmd.args(RUN).args([
                "--rank",
                &r.to_string(),
                "--rendezvous",
                rendezvous,
                "--rendezvous-timeout",
                "60",
            ]);
            std::thread::spawn(move || cli::run(cmd, Duration::from_secs(300)))
        })
        .collect();
    ranks
        .into_iter()
        .map(|h| h.join().expect("a rank's runner"))
        .collect()
}

fn threads() -> String {
    let mut cmd = cli::command();
    cmd.args(RUN);
    checksum(&cli::run(cmd, Duration::from_secs(300)), "rank threads")
}

#[test]
fn ranks_as_processes_on_one_host_generate_what_rank_threads_generate() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("its address").to_string()
    };
    let ranks = group(&addr, |_| cli::command());
    let expected = threads();
    for (r, f) in ranks.iter().enumerate() {
        assert_eq!(
            checksum(f, &format!("rank {r}")),
            expected,
            "rank {r} of processes against rank threads"
        );
        assert!(
            f.stderr.contains("reduce_mlp_bar"),
            "rank {r}'s summary: {f}"
        );
    }
    // Rank 0 schedules the requests: its summary has their line.
    assert!(ranks[0].stderr.contains("requests begun"), "{}", ranks[0]);
}

#[test]
fn ranks_on_separate_hosts_generate_what_rank_threads_generate() {
    if !is_root() {
        eprintln!(
            "SKIPPED ranks_on_separate_hosts_generate_what_rank_threads_generate: it makes \
             network namespaces (ip netns add), which needs root; CI runs it as root"
        );
        return;
    }
    let hosts = Hosts::new(2).unwrap_or_else(|e| panic!("setting up the hosts: {e}"));
    let rendezvous = format!("{}:29500", hosts.addr(0));
    let ranks = group(&rendezvous, |r| {
        cli::wrapped(&["ip", "netns", "exec", &hosts.namespaces[r]])
    });
    let expected = threads();
    for (r, f) in ranks.iter().enumerate() {
        assert_eq!(
            checksum(f, &format!("rank {r} on host {r}")),
            expected,
            "rank {r} on its own host against rank threads"
        );
    }
}

#[test]
fn a_rank_whose_peers_never_come_names_them() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("its address").to_string()
    };
    let mut cmd = cli::command();
    cmd.args(RUN).args([
        "--rank",
        "0",
        "--rendezvous",
        &addr,
        "--rendezvous-timeout",
        "1",
    ]);
    let f = cli::run(cmd, Duration::from_secs(120));
    assert_ne!(f.code, Some(0), "{f}");
    assert!(
        f.stderr.contains("missing ranks 1") && f.stderr.contains("rank 0 of 2"),
        "{f}"
    );
}
