//! With traces and OTLP metrics on, the OTLP duration histograms carry exemplars: a step slower
//! than the tail threshold (`PHASETRACE_TRACE_SLOWER_THAN`, here set by the builder) is traced,
//! and its `phasetrace.step.duration` data point names that step's trace and root span, its
//! section and wait points name that trace's spans, all spans that arrived at the same endpoint
//! (the in-process receiver, read as decoded protobuf). Over gRPC with explicit buckets and over
//! HTTP/protobuf with exponential histograms. A span the collector (rotel, its traces receiver
//! off) refused never becomes an exemplar.

use crate::support;

use phasetrace::config::{HistogramAggregation, TraceSlowerThan};
use phasetrace::{Profiler, Protocol, Section, SectionLevel, Site};
use phasetrace_names::{attr, metric, span};
use std::time::Duration;
use support::OtlpReceiver;
use support::Rotel;
use support::opentelemetry_proto::tonic::common::v1::KeyValue;
use support::opentelemetry_proto::tonic::common::v1::any_value::Value;
use support::opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Exemplar, Metric, exemplar, metric::Data,
};
use support::opentelemetry_proto::tonic::trace::v1::Span;

const WAIT: Duration = Duration::from_secs(20);
const RANK: u32 = 3;
/// The slow step's mixer section: well above the threshold.
const SLOW: Duration = Duration::from_millis(30);
const THRESHOLD: Duration = Duration::from_millis(15);
/// The engine's own wait in the slow step (site mlp): points at the step's span.
const EXPLICIT_WAIT: Duration = Duration::from_millis(3);

fn profiler(endpoint: &str, protocol: Protocol, histogram: HistogramAggregation) -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_rank(RANK)
        .with_trace_every(0)
        .with_trace_slower_than(TraceSlowerThan::Duration(THRESHOLD))
        .with_otlp_endpoint(Some(endpoint))
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

/// An attribute value as text (what the collector's debug log shows).
fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn has_attrs(attributes: &[KeyValue], want: &[(&str, &str)]) -> bool {
    want.iter().all(|(k, v)| {
        attributes
            .iter()
            .any(|kv| kv.key == *k && text(kv.value.as_ref().and_then(|v| v.value.as_ref())) == *v)
    })
}

/// One histogram point, explicit or exponential: its attributes, count and exemplars.
#[derive(Debug)]
struct Point {
    attributes: Vec<KeyValue>,
    count: u64,
    exemplars: Vec<Exemplar>,
}

fn points(m: &Metric) -> Vec<Point> {
    match &m.data {
        Some(Data::Histogram(h)) => h
            .data_points
            .iter()
            .map(|p| Point {
                attributes: p.attributes.clone(),
                count: p.count,
                exemplars: p.exemplars.clone(),
            })
            .collect(),
        Some(Data::ExponentialHistogram(h)) => h
            .data_points
            .iter()
            .map(|p| Point {
                attributes: p.attributes.clone(),
                count: p.count,
                exemplars: p.exemplars.clone(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Every metric the receiver decoded, in arrival order.
fn all_metrics(r: &OtlpReceiver) -> Vec<Metric> {
    r.metrics()
        .into_iter()
        .flat_map(|m| m.resource_metrics)
        .flat_map(|rm| rm.scope_metrics)
        .flat_map(|sm| sm.metrics)
        .collect()
}

/// The newest `name` point with `attrs`.
fn latest_point(r: &OtlpReceiver, name: &str, attrs: &[(&str, &str)]) -> Option<Point> {
    all_metrics(r)
        .iter()
        .rev()
        .filter(|m| m.name == name)
        .find_map(|m| {
            points(m)
                .into_iter()
                .find(|p| has_attrs(&p.attributes, attrs))
        })
}

/// The exemplars of the newest `name` point with `attrs`.
fn exemplars(r: &OtlpReceiver, name: &str, attrs: &[(&str, &str)]) -> Vec<Exemplar> {
    latest_point(r, name, attrs)
        .map(|p| p.exemplars)
        .unwrap_or_default()
}

fn value(e: &Exemplar) -> f64 {
    match e.value {
        Some(exemplar::Value::AsDouble(v)) => v,
        Some(exemplar::Value::AsInt(v)) => v as f64,
        None => f64::NAN,
    }
}

fn span_by_id(r: &OtlpReceiver, id: &[u8]) -> Option<Span> {
    r.spans().into_iter().find(|s| s.span_id == id)
}

fn check(protocol: Protocol, histogram: HistogramAggregation) {
    let receiver = match protocol {
        Protocol::Grpc => OtlpReceiver::start_grpc(),
        Protocol::HttpProtobuf => OtlpReceiver::start(),
    };
    let p = profiler(&receiver.endpoint(), protocol, histogram);
    drive(&p);
    let rank = RANK.to_string();
    let step_attrs = [(attr::RANK, rank.as_str())];
    receiver
        .wait_for(WAIT, |r| {
            let steps = r.spans().iter().filter(|s| s.name == span::STEP).count();
            (steps == 1 && !exemplars(r, metric::STEP_DURATION, &step_attrs).is_empty())
                .then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "no traced step with its exemplar; spans {:?}, refused {:?}",
                receiver.spans().iter().map(|s| &s.name).collect::<Vec<_>>(),
                receiver.refused()
            )
        });
    let steps: Vec<Span> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.name == span::STEP)
        .collect();
    assert_eq!(steps.len(), 1, "only the slow step is traced: {steps:#?}");
    let step = &steps[0];
    let m = all_metrics(&receiver)
        .into_iter()
        .rfind(|m| m.name == metric::STEP_DURATION)
        .expect("step.duration");
    let temporality = match (&m.data, histogram) {
        (Some(Data::Histogram(h)), HistogramAggregation::Explicit) => h.aggregation_temporality,
        (Some(Data::ExponentialHistogram(h)), HistogramAggregation::Exponential) => {
            h.aggregation_temporality
        }
        (data, _) => panic!("{histogram:?}: not that kind of histogram: {data:?}"),
    };
    assert_eq!(temporality, AggregationTemporality::Cumulative as i32);
    let point =
        latest_point(&receiver, metric::STEP_DURATION, &step_attrs).expect("the rank's point");
    assert_eq!(point.count, 11);
    // One exemplar: the slow step's, in its bucket.
    assert_eq!(point.exemplars.len(), 1, "{point:#?}");
    let e = &point.exemplars[0];
    assert_eq!((&e.trace_id, &e.span_id), (&step.trace_id, &step.span_id));
    let secs = (step.end_time_unix_nano - step.start_time_unix_nano) as f64 * 1e-9;
    assert!(
        value(e) >= SLOW.as_secs_f64() && (value(e) - secs).abs() < 1e-3,
        "{e:?} vs the span's {secs} s"
    );
    assert!(e.time_unix_nano > 0);

    // The mixer section's exemplar names the mixer span of that trace.
    let mixer = exemplars(
        &receiver,
        metric::SECTION_DURATION,
        &[(attr::BUCKET, Section::KDA_MIXER.as_str())],
    );
    let slow_mixer = mixer
        .iter()
        .find(|e| value(e) >= SLOW.as_secs_f64())
        .unwrap_or_else(|| panic!("the slow mixer's exemplar: {mixer:#?}"));
    assert_eq!(slow_mixer.trace_id, step.trace_id);
    let s = span_by_id(&receiver, &slow_mixer.span_id).expect("its span arrived");
    assert_eq!(
        (s.name.as_str(), &s.trace_id),
        (Section::KDA_MIXER.as_str(), &step.trace_id)
    );

    // Waits: the probe's points at the probe's span, the explicit one at the step's.
    let probe = exemplars(&receiver, metric::COLLECTIVE_WAIT, &[(attr::SITE, "attn")]);
    assert!(!probe.is_empty(), "a probe exemplar");
    for e in &probe {
        let s = span_by_id(&receiver, &e.span_id).expect("the probe's span arrived");
        assert_eq!(
            (s.name.as_str(), &s.trace_id),
            (Section::REDUCE_ATTN_BAR.as_str(), &step.trace_id)
        );
    }
    let explicit = exemplars(&receiver, metric::COLLECTIVE_WAIT, &[(attr::SITE, "mlp")]);
    assert_eq!(explicit.len(), 1, "{explicit:#?}");
    assert_eq!(explicit[0].span_id, step.span_id);
    assert!((value(&explicit[0]) - EXPLICIT_WAIT.as_secs_f64()).abs() < 1e-9);

    // Every exemplar of every metric names a span that arrived.
    for m in &all_metrics(&receiver) {
        for pt in points(m) {
            for e in &pt.exemplars {
                assert!(
                    span_by_id(&receiver, &e.span_id).is_some(),
                    "{} names an unknown span: {e:?}",
                    m.name
                );
            }
        }
    }
    assert!(receiver.refused().is_empty(), "{:?}", receiver.refused());
    p.shutdown();
}

#[test]
fn a_slow_steps_exemplars_over_grpc_name_its_spans_at_the_endpoint() {
    check(Protocol::Grpc, HistogramAggregation::Explicit);
}

#[test]
fn a_slow_steps_exemplars_over_http_on_exponential_histograms_name_its_spans() {
    check(Protocol::HttpProtobuf, HistogramAggregation::Exponential);
}

#[test]
fn a_span_the_collector_refused_is_never_an_exemplar() {
    support::require_tools!(Rotel);
    // The collector takes metrics and refuses traces.
    let rotel = Rotel::start_with_args(&["--otlp-receiver-traces-disabled"]);
    let p = profiler(
        &rotel.grpc_endpoint(),
        Protocol::Grpc,
        HistogramAggregation::Explicit,
    );
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
