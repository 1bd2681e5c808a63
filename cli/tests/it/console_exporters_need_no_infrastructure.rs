//! `OTEL_TRACES_EXPORTER=console` and `OTEL_METRICS_EXPORTER=console`: with no infrastructure at
//! all, sampled spans are printed one per line with their parent links and the summary table is
//! printed every `PHASETRACE_SUMMARY_EVERY` steps (100 by default with the console exporter).

use crate::cli;

use std::time::Duration;

#[test]
fn the_demo_prints_spans_and_summary_tables_to_stderr() {
    let done = cli::phasetrace(
        // No requests: a traced request would trace the steps that serve it too.
        &[
            "demo",
            "--steps",
            "200",
            "--ranks",
            "1",
            "--layers",
            "2",
            "--request-rate",
            "0",
        ],
        &[
            ("OTEL_TRACES_EXPORTER", "console"),
            ("OTEL_METRICS_EXPORTER", "console"),
            ("PHASETRACE_TRACE_EVERY", "50"),
            // Exactly the sampled steps: no tail traces of slow steps beside them.
            ("PHASETRACE_TRACE_SLOWER_THAN", "off"),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(0), "{done}");
    let err = &done.stderr;
    assert!(
        !err.contains("Prometheus metrics at"),
        "no endpoint asked for: {done}"
    );
    let steps: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("[phasetrace-span] decode.step "))
        .collect();
    assert_eq!(steps.len(), 4, "steps 0, 50, 100, 150 are sampled: {done}");
    let kda: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("[phasetrace-span] kda_recur "))
        .collect();
    assert!(!kda.is_empty(), "{done}");
    assert!(
        kda.iter().all(|l| l.contains("bucket=kda_recur")),
        "{kda:?}"
    );
    // Every 100 steps (2 tables), plus the demo's own final table.
    let tables = err
        .lines()
        .filter(|l| l.starts_with("phasetrace decode profile after"))
        .count();
    assert!(tables >= 3, "{done}");
}
