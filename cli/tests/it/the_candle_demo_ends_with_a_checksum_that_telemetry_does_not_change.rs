//! `phasetrace demo --engine candle` runs a real model (dense and MoE layers, two
//! tensor-parallel ranks, speculative decoding with a shallow draft), prints the console
//! summary with the engine's sections, and ends with a `checksum` line of the generated token
//! ids that is the same with phasetrace off and at level full, serving requests under
//! continuous batching as it does by default. The synthetic workload's own flags, a bad
//! `--requests-per-step`, and model shapes past any model or past this machine's memory are
//! refused with the flags named, before any weight is allocated.

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
    // The default workload: requests arrive, are batched, and the summary has their line.
    assert!(
        stderr.contains("requests begun") && stderr.contains("requests:"),
        "{stderr}"
    );
    let (off, _) = run(&["--level", "off"]);
    assert_eq!(on, off, "telemetry changed the generated tokens");
}

#[test]
fn synthetic_flags_are_refused_naming_the_engine() {
    for (args, named) in [
        (&["--gpu-sim"][..], "--engine candle"),
        (&["--request-rate", "5"][..], "--requests-per-step"),
        (&["--requests-per-step=-1"][..], "a non-negative number"),
        (&["--requests-per-step", "NaN"][..], "a non-negative number"),
        (&["--prompt-tokens", "100000"][..], "expected at most 8192"),
        // 5.1 x 10^12 parameters: past any model.
        (
            &["--hidden", "32768", "--layers", "100", "--experts", "64"][..],
            "parameters",
        ),
        // 3.1 x 10^12 parameters (18 TB as f32): past any machine's memory.
        (
            &["--hidden", "32768", "--layers", "60", "--experts", "64"][..],
            "GiB available (MemAvailable)",
        ),
    ] {
        let out = command()
            .args(["demo", "--engine", "candle"])
            .args(args)
            .output()
            .expect("running the demo");
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let flag = args[0].split('=').next().unwrap_or_default();
        assert!(
            stderr.contains(flag) && stderr.contains(named),
            "{args:?}: {stderr}"
        );
    }
}
