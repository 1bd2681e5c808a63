//! The speculative console lines a profiler prints (`PHASETRACE_SPEC_SUMMARY_EVERY`, with the
//! verify split at `PHASETRACE_SPEC_LEVEL=2`) are lines the importer reads back: a
//! `[phasetrace-spec]` burst with its rounds, draft length and phase totals, and its
//! `[phasetrace-spec-v]` verify split. The demo prints them; `phasetrace_import` parses its
//! stderr.

use crate::cli;
use phasetrace_import::{ImportOptions, ImportRecord, import_reader};
use std::time::Duration;

/// The `name=` value of a console line, in milliseconds, as nanoseconds.
fn field_ns(line: &str, name: &str) -> u64 {
    let at = line
        .find(&format!(" {name}="))
        .unwrap_or_else(|| panic!("{name}= in {line}"));
    let rest = &line[at + name.len() + 2..];
    let end = rest.find([' ', '|']).unwrap_or(rest.len());
    let ms: f64 = rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("{name}= in {line}: {e}"));
    (ms * 1e6).round() as u64
}

#[test]
fn the_console_spec_lines_replay_through_the_importer() {
    let done = cli::phasetrace(
        &[
            "demo", "--steps", "48", "--ranks", "1", "--layers", "2", "--spec", "4",
        ],
        &[
            ("PHASETRACE_SPEC_LEVEL", "2"),
            ("PHASETRACE_SPEC_SUMMARY_EVERY", "16"),
            ("PHASETRACE_PROMETHEUS", "off"),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(0), "{done}");
    let first = done
        .stderr
        .lines()
        .find(|l| l.starts_with("[phasetrace-spec] "))
        .unwrap_or_else(|| panic!("no [phasetrace-spec] line: {done}"))
        .to_owned();

    let file = import_reader(
        done.stderr.as_bytes(),
        ImportOptions {
            start_unix_nanos: Some(0),
            ..ImportOptions::default()
        },
    )
    .expect("the demo's stderr imports");
    let bursts: Vec<_> = file
        .records
        .iter()
        .filter_map(|r| match r {
            ImportRecord::SpecBurst {
                tag,
                rounds,
                k,
                phases,
                ..
            } => Some((tag.clone(), *rounds, *k, *phases)),
            _ => None,
        })
        .collect();
    assert!(!bursts.is_empty(), "no burst imported: {done}");
    let (tag, rounds, k, phases) = &bursts[0];
    assert_eq!(tag, "phasetrace-spec");
    assert_eq!((*rounds, *k), (16, 4), "{first}");
    // The totals are the line's, within the importer's stated 5 µs.
    for (got, name) in [(phases.draft_ns, "draft"), (phases.verify_ns, "verify")] {
        let want = field_ns(&first, name);
        assert!(
            got.abs_diff(want) <= 5_000,
            "{name}: imported {got} ns, the line says {want} ns: {first}"
        );
    }
    assert!(phases.verify_ns > 0, "{first}");
    let splits = file
        .records
        .iter()
        .filter(|r| {
            matches!(r, ImportRecord::VerifySplit { tag, rounds: 16, k: 4, .. } if tag == "phasetrace-spec-v")
        })
        .count();
    assert_eq!(
        splits,
        bursts.len(),
        "each burst has its verify split: {done}"
    );
}
