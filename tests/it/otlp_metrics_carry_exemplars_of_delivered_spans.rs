//! With traces and OTLP metrics on, the OTLP duration histograms carry exemplars: a step slower
//! than the tail threshold (`PHASETRACE_TRACE_SLOWER_THAN`, here set by the builder) is traced,
//! and its `phasetrace.step.duration` data point at the collector (rotel) names that step's trace
//! and root span, its section and wait points name that trace's spans, all spans that arrived at
//! the same collector. Over gRPC with explicit buckets and over HTTP/protobuf with exponential
//! histograms. A span the collector refused never becomes an exemplar.

use crate::support;

use phasetrace::config::{HistogramAggregation, TraceSlowerThan};
use phasetrace::{Profiler, Protocol, Section, SectionLevel, Site};
use phasetrace_names::{attr, metric, span};
use std::time::Duration;
use support::{MetricKind, ParsedOutput, Rotel};

const WAIT: Duration = Duration::from_secs(20);
const RANK: u32 = 3;
/// The slow step's mixer section: well above the threshold.
const SLOW: Duration = Duration::from_millis(30);
const THRESHOLD: Duration = Duration::from_millis(15);
/// The engine's own wait in the slow step (site mlp): points at the step's span.
const EXPLICIT_WAIT: Duration = Duration::from_millis(3);

fn profiler(rotel: &Rotel, protocol: Protocol, histogram: HistogramAggregation) -> Profiler {
    let endpoint = match protocol {
        Protocol::Grpc => rotel.grpc_endpoint(),
        Protocol::HttpProtobuf => rotel.http_endpoint(),
    };
    Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_rank(RANK)
        .with_trace_every(0)
        .with_trace_slower_than(TraceSlowerThan::Duration(THRESHOLD))
        .with_otlp_endpoint(Some(&endpoint))
        .with_otlp_protocol(protocol)
        .with_otlp_histogram(histogram)
        // No Prometheus endpoint: the exemplars exist for OTLP alone.
        .without_prometheus()
        .build()
        .expect("profiler")
}

/// Ten fast steps and one slow one (mixer section of [`SLOW`], an attention probe and an
/// explicit MLP wait); then a flush.
fn drive(p: &Profiler) {
    let rec = p.recorder();
    for i in 0..11 {
        let _step = rec.step();
        {
            let _mixer = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
            if i == 7 {
                std::thread::sleep(SLOW);
            }
        }
        {
            let _probe = rec.section(Section::REDUCE_ATTN_BAR, 0u32, Site::ATTN);
        }
        if i == 7 {
            rec.collective_wait(Site::MLP, 0u32, EXPLICIT_WAIT);
        }
    }
    drop(rec);
    p.flush();
}

/// The exemplars of the newest `name` point with `attrs`.
fn exemplars<'a>(
    out: &'a ParsedOutput,
    name: &str,
    attrs: &[(&str, &str)],
) -> &'a [support::ReceivedExemplar] {
    out.latest_point(name, attrs)
        .map(|p| p.exemplars.as_slice())
        .unwrap_or_default()
}

fn check(protocol: Protocol, histogram: HistogramAggregation) {
    let rotel = Rotel::start();
    let p = profiler(&rotel, protocol, histogram);
    drive(&p);
    let rank = RANK.to_string();
    let step_attrs = [(attr::RANK, rank.as_str())];
    let out = rotel.wait_for(
        |o| {
            o.spans_named(span::STEP).len() == 1
                && !exemplars(o, metric::STEP_DURATION, &step_attrs).is_empty()
        },
        WAIT,
    );
    let steps = out.spans_named(span::STEP);
    assert_eq!(steps.len(), 1, "only the slow step is traced: {steps:#?}");
    let step = steps[0];
    let m = out
        .last_metric(metric::STEP_DURATION)
        .expect("step.duration");
    let kind = match histogram {
        HistogramAggregation::Explicit => MetricKind::Histogram,
        HistogramAggregation::Exponential => MetricKind::ExponentialHistogram,
    };
    assert_eq!(m.kind, kind);
    assert!(m.is_cumulative());
    let point = out
        .latest_point(metric::STEP_DURATION, &step_attrs)
        .expect("the rank's point");
    assert_eq!(point.count, Some(11));
    // One exemplar: the slow step's, in its bucket.
    assert_eq!(point.exemplars.len(), 1, "{point:#?}");
    let e = &point.exemplars[0];
    assert_eq!(
        (e.trace_id.as_str(), e.span_id.as_str()),
        (step.trace_id.as_str(), step.span_id.as_str())
    );
    let secs = step.duration_nanos() as f64 * 1e-9;
    assert!(
        e.value >= SLOW.as_secs_f64() && (e.value - secs).abs() < 1e-3,
        "{e:?} vs the span's {secs} s"
    );
    assert!(e.time_unix_nanos > 0);

    // The mixer section's exemplar names the mixer span of that trace.
    let mixer = exemplars(
        &out,
        metric::SECTION_DURATION,
        &[(attr::BUCKET, Section::KDA_MIXER.as_str())],
    );
    let slow_mixer = mixer
        .iter()
        .find(|e| e.value >= SLOW.as_secs_f64())
        .unwrap_or_else(|| panic!("the slow mixer's exemplar: {mixer:#?}"));
    assert_eq!(slow_mixer.trace_id, step.trace_id);
    let s = out
        .span_by_id(&slow_mixer.span_id)
        .expect("its span arrived");
    assert_eq!(
        (s.name.as_str(), s.trace_id.as_str()),
        (Section::KDA_MIXER.as_str(), step.trace_id.as_str())
    );

    // Waits: the probe's points at the probe's span, the explicit one at the step's.
    let probe = exemplars(&out, metric::COLLECTIVE_WAIT, &[(attr::SITE, "attn")]);
    assert!(!probe.is_empty(), "a probe exemplar");
    for e in probe {
        let s = out
            .span_by_id(&e.span_id)
            .expect("the probe's span arrived");
        assert_eq!(
            (s.name.as_str(), s.trace_id.as_str()),
            (Section::REDUCE_ATTN_BAR.as_str(), step.trace_id.as_str())
        );
    }
    let explicit = exemplars(&out, metric::COLLECTIVE_WAIT, &[(attr::SITE, "mlp")]);
    assert_eq!(explicit.len(), 1, "{explicit:#?}");
    assert_eq!(explicit[0].span_id, step.span_id);
    assert!((explicit[0].value - EXPLICIT_WAIT.as_secs_f64()).abs() < 1e-9);

    // Every exemplar of every metric names a span that arrived.
    for m in &out.metrics {
        for pt in &m.points {
            for e in &pt.exemplars {
                assert!(
                    out.span_by_id(&e.span_id).is_some(),
                    "{} names an unknown span: {e:?}",
                    m.name
                );
            }
        }
    }
    p.shutdown();
}

#[test]
fn a_slow_steps_exemplars_over_grpc_name_its_spans_at_the_collector() {
    support::require_tools!(Rotel);
    check(Protocol::Grpc, HistogramAggregation::Explicit);
}

#[test]
fn a_slow_steps_exemplars_over_http_on_exponential_histograms_name_its_spans() {
    support::require_tools!(Rotel);
    check(Protocol::HttpProtobuf, HistogramAggregation::Exponential);
}

#[test]
fn a_span_the_collector_refused_is_never_an_exemplar() {
    support::require_tools!(Rotel);
    // The collector takes metrics and refuses traces.
    let rotel = Rotel::start_with_args(&["--otlp-receiver-traces-disabled"]);
    let p = profiler(&rotel, Protocol::Grpc, HistogramAggregation::Explicit);
    drive(&p);
    let rank = RANK.to_string();
    let out = rotel.wait_for(
        |o| {
            o.latest_point(metric::STEP_DURATION, &[(attr::RANK, rank.as_str())])
                .is_some_and(|pt| pt.count == Some(11))
        },
        WAIT,
    );
    let stats = p.stats();
    assert!(
        stats.tail_traces >= 1,
        "the slow step was traced: {stats:?}"
    );
    assert!(out.spans.is_empty(), "{:#?}", out.spans);
    for m in &out.metrics {
        for pt in &m.points {
            assert!(pt.exemplars.is_empty(), "{}: {:?}", m.name, pt.exemplars);
        }
    }
    p.shutdown();
}
