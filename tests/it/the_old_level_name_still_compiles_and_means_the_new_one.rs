//! `phasetrace::Level` was renamed `SectionLevel` (it collided with `tracing::Level`); the old
//! name stays as a deprecated alias, and a file can import `tracing::Level` beside phasetrace's
//! names.

use phasetrace::{Profiler, SectionLevel};
use tracing::Level;

#[test]
#[allow(deprecated)]
fn the_deprecated_alias_names_the_same_type() {
    let old: phasetrace::Level = phasetrace::Level::Collectives;
    let new: SectionLevel = old;
    assert_eq!(new, SectionLevel::Collectives);
    assert_eq!(
        "full".parse::<phasetrace::Level>().ok(),
        Some(SectionLevel::Full)
    );
}

#[test]
fn tracing_level_and_section_level_live_in_one_file() {
    let profiler = Profiler::builder()
        .without_env()
        .without_prometheus()
        .with_level(SectionLevel::Full)
        .build()
        .expect("a profiler without exporters builds");
    tracing::event!(Level::INFO, enabled = profiler.is_enabled());
    assert!(profiler.is_enabled());
    profiler
        .set_level(SectionLevel::Off)
        .expect("set_level(Off) succeeds");
    assert!(!profiler.is_enabled());
    profiler.shutdown();
}
