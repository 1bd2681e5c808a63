//! An engine that hands phasetrace a meter provider without `phasetrace::view()` is told, once
//! per profiler on stderr, which per-layer instruments will fold into the SDK's overflow series
//! and how to register the view; a provider with the view is told nothing. The line is written
//! by the library in this process, so the scenario runs in a child (this test binary again,
//! `--exact` the case) whose stderr the parent reads.

use std::process::Command;

use opentelemetry_sdk::metrics::SdkMeterProvider;
use phasetrace::{Profiler, Section, SectionLevel, Site};
use phasetrace_names::metric;

const CHILD: &str = "PHASETRACE_TEST_VIEW_WARNING_CHILD";
const WARNING: &str = "has no phasetrace::view()";

fn provider(view: bool) -> SdkMeterProvider {
    crate::engine_meter::engine_provider(view.then_some(false)).0
}

fn record(profiler: &Profiler) {
    let rec = profiler.recorder();
    for _ in 0..3 {
        let _step = rec.step();
        for layer in 0..4 {
            let _s = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        }
    }
    profiler.flush();
}

/// The scenario of the child: with the view first (silent), then without it, recording before
/// and after the level is turned off and on again.
fn scenario() {
    let with_view = provider(true);
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_meter_provider(with_view.clone())
        .build()
        .expect("profiler on a provider with the view");
    record(&p);
    p.shutdown();
    eprintln!("-- without the view --");

    let without = provider(false);
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_meter_provider(without.clone())
        .build()
        .expect("profiler on a provider without the view");
    record(&p);
    p.set_level(SectionLevel::Off).expect("off");
    p.set_level(SectionLevel::Full).expect("on again");
    record(&p);
    p.shutdown();
    let _ = with_view.shutdown();
    let _ = without.shutdown();

    eprintln!("-- without a reader --");
    let readerless = SdkMeterProvider::builder()
        .with_view(phasetrace::view(false))
        .build();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_meter_provider(readerless)
        .build()
        .expect("profiler on a provider without a reader");
    record(&p);
    p.shutdown();

    // The globals are read when `build()` runs: set after `with_global_providers()` and before
    // `build()`, they get every record, and nothing is said.
    eprintln!("-- globals --");
    let (global, exporter) = crate::engine_meter::engine_provider(Some(false));
    let b = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_global_providers();
    opentelemetry::global::set_meter_provider(global.clone());
    let p = b.build().expect("profiler on the globals");
    record(&p);
    p.shutdown();
    global.force_flush().expect("flush");
    let exported = exporter.get_finished_metrics().expect("metrics");
    let steps = exported
        .last()
        .into_iter()
        .flat_map(|rm| rm.scope_metrics())
        .flat_map(|s| s.metrics())
        .any(|m| m.name() == metric::STEPS);
    eprintln!("global steps exported: {steps}");
    let _ = global.shutdown();
}

#[test]
fn a_provider_without_the_view_is_named_once_and_one_with_it_never() {
    if std::env::var_os(CHILD).is_some() {
        scenario();
        return;
    }
    let test = "a_meter_provider_without_the_view_is_named_once_on_stderr::a_provider_without_the_view_is_named_once_and_one_with_it_never";
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"]);
    for (key, _) in std::env::vars_os() {
        if let Some(key) = key.to_str()
            && (key.starts_with("PHASETRACE_") || key.starts_with("OTEL_"))
        {
            cmd.env_remove(key);
        }
    }
    cmd.env(CHILD, "1");
    let out = cmd.output().expect("running the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed:\n{stderr}");
    let (with_view, rest) = stderr
        .split_once("-- without the view --")
        .unwrap_or_else(|| panic!("the child did not reach its second part:\n{stderr}"));
    let (without, rest) = rest
        .split_once("-- without a reader --")
        .unwrap_or_else(|| panic!("the child did not reach its third part:\n{stderr}"));
    let (readerless, globals) = rest
        .split_once("-- globals --")
        .unwrap_or_else(|| panic!("the child did not reach its fourth part:\n{stderr}"));
    assert!(
        !readerless.contains(WARNING) && readerless.contains("has no reader"),
        "a provider with the view but no reader is named as such:\n{readerless}"
    );
    assert!(
        globals.contains("global steps exported: true") && !globals.contains("phasetrace:"),
        "globals set before build() get the records, silently:\n{globals}"
    );
    assert!(
        !with_view.contains(WARNING),
        "a provider with the view was warned about:\n{with_view}"
    );
    let lines: Vec<&str> = without.lines().filter(|l| l.contains(WARNING)).collect();
    assert_eq!(
        lines.len(),
        1,
        "one line for the profiler, however long it records:\n{stderr}"
    );
    let line = lines[0];
    for needed in [
        metric::SECTION_LAYER_TIME,
        metric::SECTION_LAYER_CALLS,
        "otel.metric.overflow",
        "with_view(phasetrace::view(false))",
    ] {
        assert!(line.contains(needed), "the line lacks {needed:?}: {line}");
    }
}
