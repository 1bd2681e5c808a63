//! An operator can turn profiling on, down and off while the engine runs: a profiler built off
//! starts nothing until `set_level`, then records at the new level; after shutdown the level is
//! frozen.

use phasetrace::{Profiler, Section, SectionLevel, Site, SpecLevel};

fn sections(rec: &phasetrace::Recorder) {
    let _c = rec.section(Section::MOE_EXPERTS, 0u32, Site::MLP);
    let _r = rec.section(Section::REDUCE_MLP, 0u32, Site::MLP);
}

#[test]
fn a_profiler_built_off_starts_on_demand_and_follows_the_level() {
    let p = Profiler::builder()
        .without_env()
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()
        .expect("profiler");
    assert!(!p.is_enabled());
    assert!(p.prometheus_addr().is_none(), "off: no endpoint, no thread");
    let rec = p.recorder();
    sections(&rec);
    p.flush();
    assert_eq!(p.stats().sections, 0);

    p.set_level(SectionLevel::Full).expect("on");
    assert!(p.prometheus_addr().is_some(), "exporters started");
    sections(&rec);
    p.flush();
    assert_eq!(p.stats().sections, 2);

    p.set_level(SectionLevel::Collectives).expect("down");
    sections(&rec);
    p.flush();
    assert_eq!(p.stats().sections, 3, "only the collective at level 2");

    p.set_level(SectionLevel::Off).expect("off");
    sections(&rec);
    p.set_spec_level(SpecLevel::Phases).expect("spec on");
    rec.round(2).end(1);
    p.flush();
    assert_eq!(p.stats().sections, 3);
    assert_eq!(p.stats().rounds, 1);

    p.shutdown();
    let err = p
        .set_level(SectionLevel::Full)
        .expect_err("frozen after shutdown");
    assert!(err.to_string().contains("shut down"), "{err}");
    assert!(!p.is_enabled());
}
