//! `phasetrace_records_dropped_total` has a series per reason from the first scrape, at 0, so
//! that `rate()` over it reads 0 rather than "no data" on a healthy engine.

use crate::support;

use phasetrace::{DropReason, Profiler, SectionLevel};

#[test]
fn every_drop_reason_reads_zero_before_anything_drops() {
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()
        .expect("profiler");
    let url = format!("http://{}/metrics", p.prometheus_addr().expect("endpoint"));
    let (code, body) = support::http_get(&url).expect("scrape");
    assert_eq!(code, 200, "{body}");
    for reason in DropReason::ALL {
        let label = format!("reason=\"{reason}\"");
        let line = body
            .lines()
            .find(|l| l.starts_with("phasetrace_records_dropped_total{") && l.contains(&label))
            .unwrap_or_else(|| panic!("no {label} series:\n{body}"));
        assert_eq!(line.rsplit(' ').next(), Some("0"), "{line}");
    }
    assert_eq!(p.stats().dropped.total(), 0);
    p.shutdown();
}
