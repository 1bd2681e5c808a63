//! `phasetrace check` says where host-clock boundaries are read from (`tsc` or `monotonic`) and
//! why, as the library decides it on this machine, under the resource attribute's name.

use crate::cli;

use std::time::Duration;

use cli::phasetrace;
use phasetrace::timing::{HostSource, HostSourceReason, host_source};
use phasetrace_names::attr;

#[test]
fn check_prints_the_host_clock_source_and_why() {
    let run = phasetrace(&["check"], &[], Duration::from_secs(30));
    assert_eq!(run.code, Some(0), "{run}");
    let value = |key: &str| {
        run.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .map(|l| l.trim_start()[key.len()..].trim().to_owned())
            .unwrap_or_else(|| panic!("no {key} line: {run}"))
    };
    let here = host_source();
    assert_eq!(value(attr::HOST_CLOCK), here.source.as_str(), "{run}");
    // The reason is the library's own words for this machine (a measured rate differs from
    // process to process).
    if let HostSourceReason::UnsteadyRate { .. } = here.reason {
        assert!(value("why").starts_with("the TSC's rate"), "{run}");
    } else {
        assert_eq!(value("why"), here.reason.to_string(), "{run}");
    }
    if here.source == HostSource::Tsc {
        let rate = value("TSC");
        let ghz: f64 = rate
            .trim_start_matches("rate")
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no rate in {rate:?}"));
        let lib = here.tsc_hz.expect("a TSC source has a rate") / 1e9;
        assert!((ghz - lib).abs() < 1e-3 * lib, "{ghz} GHz vs {lib} GHz");
    } else {
        assert!(!run.stdout.contains("TSC rate"), "{run}");
    }
}

/// The value of `key`'s line in `check`'s output.
fn line_value(stdout: &str, key: &str) -> Option<String> {
    stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(key))
        .map(|l| l.trim_start()[key.len()..].trim().to_owned())
}

#[test]
fn the_host_clock_setting_forces_the_monotonic_clock_or_insists_on_the_tsc() {
    use phasetrace_names::env;
    // Forced monotonic, by flag and by variable: used whatever this machine's TSC is, and why.
    for (args, envs) in [
        (&["check", "--host-clock", "monotonic"][..], &[][..]),
        (&["check"][..], &[(env::HOST_CLOCK, "monotonic")][..]),
    ] {
        let run = phasetrace(args, envs, Duration::from_secs(30));
        assert_eq!(run.code, Some(0), "{run}");
        let out = &run.stdout;
        assert_eq!(
            line_value(out, attr::HOST_CLOCK).as_deref(),
            Some("monotonic"),
            "{run}"
        );
        assert_eq!(
            line_value(out, "why").as_deref(),
            Some("PHASETRACE_HOST_CLOCK=monotonic"),
            "{run}"
        );
        assert!(!out.contains("TSC rate"), "{run}");
    }
    // Insisting on the TSC: used where this machine allows it, else a failed check saying why.
    let run = phasetrace(
        &["check", "--host-clock", "tsc"],
        &[],
        Duration::from_secs(30),
    );
    let here = host_source();
    if here.source == HostSource::Tsc {
        assert_eq!(run.code, Some(0), "{run}");
        assert_eq!(
            line_value(&run.stdout, attr::HOST_CLOCK).as_deref(),
            Some("tsc")
        );
    } else {
        assert_ne!(run.code, Some(0), "{run}");
        assert!(
            run.stdout
                .contains("FAIL  PHASETRACE_HOST_CLOCK=tsc: the TSC cannot be used here: "),
            "{run}"
        );
    }
    // A value outside the set names the variable and what it accepts.
    let run = phasetrace(
        &["check"],
        &[(env::HOST_CLOCK, "rdtsc")],
        Duration::from_secs(30),
    );
    assert_ne!(run.code, Some(0), "{run}");
    assert!(
        run.stderr.contains("PHASETRACE_HOST_CLOCK")
            && run.stderr.contains("auto, tsc or monotonic"),
        "{run}"
    );
}

#[test]
fn a_demo_on_the_forced_monotonic_clock_says_so_in_its_resource() {
    let target = format!("127.0.0.1:{}", crate::support::free_port());
    let mut demo = cli::Demo::spawn(
        &[
            "--ranks",
            "1",
            "--steps",
            "20",
            "--prometheus",
            &target,
            "--linger",
            "30",
            "--host-clock",
            "monotonic",
        ],
        &[],
    );
    assert_eq!(demo.prometheus_addr(Duration::from_secs(60)), target);
    let end = demo.wait_for_run_end(Duration::from_secs(60));
    let (status, body) =
        crate::support::http_get(&format!("http://{target}/metrics")).expect("scrape");
    assert_eq!(status, 200);
    let info = body
        .lines()
        .find(|l| l.starts_with("target_info{"))
        .unwrap_or_else(|| panic!("no target_info in\n{body}"));
    let label = format!("{}=\"monotonic\"", attr::HOST_CLOCK.replace('.', "_"));
    assert!(info.contains(&label), "{label} not in {info}");
    // Sections were timed on it: the demo's summary has non-zero sections.
    let samples = cli::parse_exposition(&body);
    let calls = cli::sum_samples(&samples, "phasetrace_section_duration_seconds_count", &[]);
    assert!(calls > 0.0, "no sections timed ({end}):\n{body}");
    demo.kill();
}
