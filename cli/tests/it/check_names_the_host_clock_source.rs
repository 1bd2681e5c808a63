//! `phasetrace check` says where host-clock boundaries are read from (`tsc` or `monotonic`) and
//! why, as the library decides it on this machine, under the resource attribute's name.

use crate::cli;

use std::time::Duration;

use cli::phasetrace;
use phasetrace::names::attr;
use phasetrace::timing::{HostSource, HostSourceReason, host_source};

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
