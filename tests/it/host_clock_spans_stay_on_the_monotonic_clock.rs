//! Span timestamps made from host-clock marks (raw TSC readings where the CPU has an invariant
//! TSC, converted on the worker) stay within 10 µs of the OS monotonic clock over a 60 s run, as
//! they go over OTLP/gRPC (decoded by the in-process receiver); the source is a resource
//! attribute. And a step's spans from different clocks (host sections inside synchronized ones)
//! nest, because every clock resolves to one timeline.

use crate::support;

use phasetrace::timing::{host_source, monotonic_ns, to_system_time};
use phasetrace::{Profiler, Section, SectionLevel, Site, Timing};
use phasetrace_names::{attr, span};
use phasetrace_sim::SimStream;
use std::collections::HashMap;
use std::time::{Duration, Instant, UNIX_EPOCH};
use support::OtlpReceiver;
use support::opentelemetry_proto::tonic::common::v1::KeyValue;
use support::opentelemetry_proto::tonic::common::v1::any_value::Value;
use support::opentelemetry_proto::tonic::trace::v1::Span;

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

/// The value of attribute `key` in an OTLP attribute list.
fn otlp_attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

/// Every span received, each with the resource attributes it was sent under.
fn spans_with_resource(receiver: &OtlpReceiver) -> Vec<(Vec<KeyValue>, Span)> {
    let mut out = Vec::new();
    for request in receiver.traces() {
        for rs in request.resource_spans {
            let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
            for ss in rs.scope_spans {
                out.extend(ss.spans.into_iter().map(|s| (resource.clone(), s)));
            }
        }
    }
    out
}

/// The resource's `key` as a string.
fn resource_str<'a>(resource: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match otlp_attr(resource, key)? {
        Value::StringValue(v) => Some(v.as_str()),
        _ => None,
    }
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
    let receiver = OtlpReceiver::start_grpc();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .with_service_name("host-clock-drift")
        .without_prometheus()
        .with_otlp_endpoint(Some(&receiver.endpoint()))
        .with_otlp_protocol(phasetrace::Protocol::Grpc)
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
    let received = receiver
        .wait_for(Duration::from_secs(30), |r| {
            let all = spans_with_resource(r);
            (all.iter().filter(|(_, s)| s.name == span::STEP).count() >= n).then_some(all)
        })
        .unwrap_or_else(|| {
            panic!(
                "fewer than {n} step spans; refused: {:?}",
                receiver.refused()
            )
        });
    let by_step: HashMap<u64, &(Vec<KeyValue>, Span)> = received
        .iter()
        .filter(|(_, s)| s.name == span::STEP)
        .filter_map(|rs| match otlp_attr(&rs.1.attributes, attr::STEP)? {
            Value::IntValue(i) => Some((u64::try_from(*i).ok()?, rs)),
            _ => None,
        })
        .collect();
    let source = host_source().source;
    let mut worst = 0u64;
    for (i, b) in steps.iter().enumerate() {
        let (resource, s) = by_step
            .get(&(i as u64))
            .unwrap_or_else(|| panic!("no span for step {i}"));
        assert_eq!(
            resource_str(resource, attr::HOST_CLOCK),
            Some(source.as_str()),
            "the host clock's source is a resource attribute"
        );
        let sections: Vec<&Span> = received
            .iter()
            .map(|(_, c)| c)
            .filter(|c| c.trace_id == s.trace_id && c.parent_span_id == s.span_id)
            .collect();
        assert_eq!(sections.len(), 1, "step {i}: {sections:#?}");
        let sec = sections[0];
        for (what, t, br) in [
            ("step start", s.start_time_unix_nano, b.step_begin),
            ("section start", sec.start_time_unix_nano, b.section_begin),
            ("section end", sec.end_time_unix_nano, b.section_end),
            ("step end", s.end_time_unix_nano, b.step_end),
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
    let receiver = OtlpReceiver::start_grpc();
    let stream = SimStream::new();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .with_service_name("mixed-clocks")
        .without_prometheus()
        .with_otlp_endpoint(Some(&receiver.endpoint()))
        .with_otlp_protocol(phasetrace::Protocol::Grpc)
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
    let received = receiver
        .wait_for(Duration::from_secs(30), |r| {
            let all = spans_with_resource(r);
            let fronts = all
                .iter()
                .filter(|(_, s)| s.name == Section::KDA_FRONT.as_str())
                .count();
            (fronts >= steps as usize).then_some(all)
        })
        .unwrap_or_else(|| {
            panic!(
                "fewer than {steps} front spans; refused: {:?}",
                receiver.refused()
            )
        });
    let mine: Vec<&Span> = received
        .iter()
        .filter(|(r, _)| resource_str(r, "service.name") == Some("mixed-clocks"))
        .map(|(_, s)| s)
        .collect();
    let mut checked = 0;
    for child in &mine {
        let Some(parent) = mine.iter().find(|p| {
            !child.parent_span_id.is_empty()
                && p.trace_id == child.trace_id
                && p.span_id == child.parent_span_id
        }) else {
            continue;
        };
        assert!(
            parent.start_time_unix_nano <= child.start_time_unix_nano
                && child.end_time_unix_nano <= parent.end_time_unix_nano,
            "{} [{}, {}] does not lie inside its parent {} [{}, {}]",
            child.name,
            child.start_time_unix_nano,
            child.end_time_unix_nano,
            parent.name,
            parent.start_time_unix_nano,
            parent.end_time_unix_nano
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
