//! `phasetrace demo --engine candle` runs a real model (dense and MoE layers, two
//! tensor-parallel ranks, speculative decoding with a shallow draft), prints the console
//! summary with the engine's sections, and ends with a `checksum` line of the generated token
//! ids that is the same with phasetrace off and at level full. The synthetic workload's own
//! flags are refused with the engine named.

use crate::cli::command;

fn run(extra: &[&str]) -> (String, String) {
    let out = command()
        .args([
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
            "12",
            "--spec",
            "3",
            "--prometheus",
            "off",
            "--trace-every",
            "0",
        ])
        .args(extra)
        .output()
        .expect("running the demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{extra:?}: {}\n{stdout}{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or("").to_owned();
    assert!(last.contains("checksum"), "{extra:?}: last line {last:?}");
    let digest = last
        .split_whitespace()
        .find(|w| w.len() == 16 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("a hex digest in {last:?}"))
        .to_owned();
    (digest, stderr)
}

#[test]
fn the_checksum_is_the_same_with_phasetrace_off_and_on() {
    let (on, stderr) = run(&["--level", "full"]);
    for bucket in ["qkv", "attention", "moe_experts", "reduce_mlp_bar"] {
        assert!(stderr.contains(bucket), "summary names {bucket}:\n{stderr}");
    }
    assert!(stderr.contains("speculative decoding"), "{stderr}");
    let (off, _) = run(&["--level", "off"]);
    assert_eq!(on, off, "telemetry changed the generated tokens");
}

#[test]
fn synthetic_flags_are_refused_naming_the_engine() {
    let out = command()
        .args(["demo", "--engine", "candle", "--gpu-sim"])
        .output()
        .expect("running the demo");
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--gpu-sim") && stderr.contains("--engine candle"),
        "{stderr}"
    );
}
