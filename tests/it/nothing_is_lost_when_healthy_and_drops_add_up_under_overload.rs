//! Accounting: with a healthy collector, over a million section records with sampled spans, the
//! collector receives exactly what was recorded; under overload from 16 threads, what is recorded
//! equals what is exported plus what is counted as dropped.

use crate::support;

use phasetrace::{DropReason, Profiler, Section, SectionLevel, Site};
use std::time::Duration;
use support::Rotel;

#[test]
fn a_million_sections_arrive_exactly() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1000)
        .without_prometheus()
        .with_otlp_endpoint(Some(&rotel.grpc_endpoint()))
        .with_metric_export_interval(Duration::from_millis(500))
        .build()
        .expect("profiler");
    let rec = p.recorder();
    let sections = [
        Section::KDA_MIXER,
        Section::MOE_EXPERTS,
        Section::REDUCE_ATTN,
        Section::NORM,
    ];
    let steps = 25_000u64;
    for step in 0..steps {
        let _s = rec.step();
        for layer in 0..10u32 {
            let _g = rec.section(sections[(layer % 4) as usize], layer, Site::ATTN);
            let _h = rec.section(Section::MHC, layer, Site::NONE);
            let _i = rec.section(Section::NORM, layer, Site::NONE);
            let _j = rec.section(Section::MHC_POST, layer, Site::NONE);
        }
        if step % 500 == 0 {
            p.drain(); // an engine's steps take milliseconds; this loop takes microseconds
        }
    }
    p.flush();
    let s = p.stats();
    let recorded = steps * 40;
    assert!(recorded >= 1_000_000);
    assert_eq!(s.sections, recorded);
    // Slow steps over the tail budget are counted too, but nothing recorded is lost.
    let tail = s.dropped[phasetrace::DropReason::TailBudget];
    assert_eq!(s.dropped.total() - tail, 0, "{s:?}");
    // 25 sampled steps, and the slow ones (`p99` by default, within the budget): 1 step span +
    // 10 layer spans + 40 section spans each.
    let traced = 25 + s.tail_traces;
    assert_eq!(s.spans, traced * 51);
    let total_count = |o: &support::ParsedOutput| -> u64 {
        o.last_metric("phasetrace.section.duration")
            .map(|m| m.points.iter().filter_map(|p| p.count).sum())
            .unwrap_or(0)
    };
    let out = rotel.wait_for(
        |o| total_count(o) == recorded && o.spans.len() as u64 == s.spans,
        Duration::from_secs(60),
    );
    assert_eq!(out.spans_named("decode.step").len() as u64, traced);
    let steps_point = out
        .latest_point("phasetrace.steps", &[])
        .and_then(|p| p.value);
    assert_eq!(steps_point, Some(steps as f64));
    p.shutdown();
    let after = p.stats();
    assert_eq!(
        (
            after.sections,
            after.steps,
            after.spans,
            after.dropped.total() - after.dropped[phasetrace::DropReason::TailBudget]
        ),
        (recorded, steps, s.spans, 0),
        "stats after shutdown keep the final figures: {after:?}"
    );
}

#[test]
fn sixteen_threads_at_full_speed_account_for_every_record() {
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(0)
        .with_queue(1024)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()
        .expect("profiler");
    let per_thread = 200_000u64;
    std::thread::scope(|sc| {
        for t in 0..16u32 {
            let p = &p;
            sc.spawn(move || {
                let rec = p.recorder_with(phasetrace::RecorderOptions::new().rank(t));
                for i in 0..per_thread {
                    rec.collective_wait(Site::ATTN, (i % 8) as u32, Duration::from_nanos(i));
                }
            });
        }
    });
    p.flush();
    let s = p.stats();
    let recorded = 16 * per_thread;
    assert_eq!(
        s.marks + s.dropped[DropReason::QueueFull],
        recorded,
        "{s:?}"
    );
    assert!(
        s.dropped[DropReason::QueueFull] > 0,
        "the overload should overflow 1024-record buffers"
    );
    // What the exporter serves agrees with the accounting.
    let url = format!("http://{}/metrics", p.prometheus_addr().expect("endpoint"));
    let (code, body) = support::http_get(&url).expect("scrape");
    assert_eq!(code, 200);
    let sum_of = |name: &str, label: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        sum_of("phasetrace_collective_wait_seconds_count{", ""),
        s.marks as f64
    );
    assert_eq!(
        sum_of("phasetrace_records_dropped_total{", "reason=\"queue_full\""),
        s.dropped[DropReason::QueueFull] as f64,
        "{body}"
    );
    p.shutdown();
}
