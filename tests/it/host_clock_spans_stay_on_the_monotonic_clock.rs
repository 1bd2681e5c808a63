//! Span timestamps made from host-clock marks (raw TSC readings where the CPU has an invariant
//! TSC, converted on the worker) stay within 10 µs of the OS monotonic clock over a 60 s run, as a
//! real collector receives them; the source is a resource attribute. And a step's spans from
//! different clocks (host sections inside synchronized ones) nest, because every clock resolves
//! to one timeline.

use crate::support;

use phasetrace::timing::{host_source, monotonic_ns, to_system_time};
use phasetrace::{Profiler, Section, SectionLevel, Site, Timing};
use phasetrace_names::{attr, span};
use phasetrace_sim::SimStream;
use std::collections::HashMap;
use std::time::{Duration, Instant, UNIX_EPOCH};
use support::Rotel;

const RUN: Duration = Duration::from_secs(60);
const EVERY: Duration = Duration::from_millis(500);
const TOLERANCE_NS: u64 = 10_000;

fn unix_ns(ns: u64) -> u64 {
    to_system_time(ns)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// How far `t` lies outside `[lo, hi]` (0 inside).
fn outside(t: u64, (lo, hi): (u64, u64)) -> u64 {
    lo.saturating_sub(t).max(t.saturating_sub(hi))
}

/// Monotonic-clock brackets (unix ns) of one step's begin, its section's begin and end, and its
/// end: each boundary lies between the two monotonic reads around it.
struct Brackets {
    step_begin: (u64, u64),
    section_begin: (u64, u64),
    section_end: (u64, u64),
    step_end: (u64, u64),
}

#[test]
fn host_clock_span_timestamps_stay_within_10us_of_the_monotonic_clock_for_60s() {
    let rotel = Rotel::start();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .with_service_name("host-clock-drift")
        .without_prometheus()
        .with_otlp_endpoint(Some(&rotel.grpc_endpoint()))
        .build()
        .expect("building the profiler");
    let rec = profiler.recorder();
    let bracket = |f: &mut dyn FnMut()| {
        let a = monotonic_ns();
        f();
        (unix_ns(a), unix_ns(monotonic_ns()))
    };
    let mut steps = Vec::new();
    let start = Instant::now();
    while start.elapsed() < RUN {
        let mut step = None;
        let mut section = None;
        let step_begin = bracket(&mut || step = Some(rec.step()));
        let section_begin =
            bracket(&mut || section = Some(rec.section(Section::KDA_MIXER, 7u32, Site::ATTN)));
        let section_end = bracket(&mut || drop(section.take()));
        let step_end = bracket(&mut || drop(step.take()));
        steps.push(Brackets {
            step_begin,
            section_begin,
            section_end,
            step_end,
        });
        std::thread::sleep(EVERY);
    }
    drop(rec);
    profiler.flush();

    let n = steps.len();
    let p = rotel.wait_for(
        |p| p.spans_named(span::STEP).len() >= n,
        Duration::from_secs(30),
    );
    let by_step: HashMap<u64, _> = p
        .spans_named(span::STEP)
        .into_iter()
        .filter_map(|s| Some((s.attr(attr::STEP)?.parse::<u64>().ok()?, s)))
        .collect();
    let source = host_source().source;
    let mut worst = 0u64;
    for (i, b) in steps.iter().enumerate() {
        let s = by_step
            .get(&(i as u64))
            .unwrap_or_else(|| panic!("no span for step {i}"));
        assert_eq!(
            s.resource.get(attr::HOST_CLOCK).map(String::as_str),
            Some(source.as_str()),
            "the host clock's source is a resource attribute"
        );
        let sections = p.children_of(s);
        assert_eq!(sections.len(), 1, "step {i}: {sections:#?}");
        let sec = sections[0];
        for (what, t, br) in [
            ("step start", s.start_unix_nanos, b.step_begin),
            ("section start", sec.start_unix_nanos, b.section_begin),
            ("section end", sec.end_unix_nanos, b.section_end),
            ("step end", s.end_unix_nanos, b.step_end),
        ] {
            let off = outside(t, br);
            worst = worst.max(off);
            assert!(
                off <= TOLERANCE_NS,
                "step {i} ({:.1} s into the run): the {what} is {off} ns off the monotonic clock \
                 ({t} outside [{}, {}])",
                (br.0 - steps[0].step_begin.0) as f64 * 1e-9,
                br.0,
                br.1
            );
        }
    }
    eprintln!(
        "{n} steps over {RUN:?} on the {source} host clock: the farthest span timestamp was {worst} \
         ns outside the monotonic clock's bracket ({:?})",
        host_source()
    );
    profiler.shutdown();
}

#[test]
fn host_sections_inside_synchronized_sections_nest_in_time() {
    let rotel = Rotel::start();
    let stream = SimStream::new();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .with_service_name("mixed-clocks")
        .without_prometheus()
        .with_otlp_endpoint(Some(&rotel.grpc_endpoint()))
        .with_timing(Timing::Sync)
        .with_stream(stream.clone())
        .build()
        .expect("building the profiler");
    let rec = profiler.recorder();
    let steps = 200u32;
    for layer in 0..steps {
        let _step = rec.step();
        let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        {
            // Host enqueue time, right after the synchronized begin: tens of nanoseconds apart.
            let _enq = rec.host_section(Section::REDUCE_ATTN_ENQ, layer, Site::ATTN);
            let _front = rec.section(Section::KDA_FRONT, layer, Site::ATTN);
            stream.enqueue(Duration::from_micros(2));
        }
    }
    drop(rec);
    profiler.flush();
    let p = rotel.wait_for(
        |p| p.spans_named(Section::KDA_FRONT.as_str()).len() >= steps as usize,
        Duration::from_secs(30),
    );
    let mut checked = 0;
    for child in p
        .spans
        .iter()
        .filter(|s| s.resource.get("service.name").map(String::as_str) == Some("mixed-clocks"))
    {
        let Some(parent) = p.parent_of(child) else {
            continue;
        };
        assert!(
            parent.start_unix_nanos <= child.start_unix_nanos
                && child.end_unix_nanos <= parent.end_unix_nanos,
            "{} [{}, {}] does not lie inside its parent {} [{}, {}]",
            child.name,
            child.start_unix_nanos,
            child.end_unix_nanos,
            parent.name,
            parent.start_unix_nanos,
            parent.end_unix_nanos
        );
        checked += 1;
    }
    // Per step: the mixer in the step, the host section in the mixer, the front in the host section.
    assert!(
        checked >= 3 * steps as usize,
        "only {checked} parent-child pairs"
    );
    profiler.shutdown();
}
