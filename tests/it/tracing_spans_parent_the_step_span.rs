//! With the engine's own `tracing-opentelemetry` layer installed (on the engine's tracer
//! provider), a sampled decode step recorded inside an engine `tracing` span (`request`) becomes
//! that span's child in the same trace, whatever tracer provider phasetrace builds its spans
//! on: the engine's (both spans in one in-memory exporter of the engine's), or phasetrace's own
//! OTLP/gRPC pipeline (the step as decoded by the in-process receiver, parented by the engine's
//! span). A step recorded
//! outside any `tracing` span stays a root. phasetrace installs no layer of its own, so a
//! registry holds exactly one and nothing panics.
#![cfg(feature = "tracing")]

use crate::support;

use std::time::Duration;

use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use phasetrace::{Profiler, Section, SectionLevel, Site};
use phasetrace_names::{attr, span};
use support::OtlpReceiver;
use support::opentelemetry_proto::tonic::common::v1::KeyValue;
use support::opentelemetry_proto::tonic::common::v1::any_value::Value;
use tracing_subscriber::layer::SubscriberExt as _;

const WAIT: Duration = Duration::from_secs(20);

/// The engine's tracer provider, exporting into memory, and a registry with its layer.
fn engine() -> (
    SdkTracerProvider,
    InMemorySpanExporter,
    impl tracing::Subscriber + Send + Sync,
) {
    let spans = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("engine")));
    (provider, spans, subscriber)
}

/// Runs one step inside a `request` span and one outside any span.
fn record(profiler: &Profiler, subscriber: impl tracing::Subscriber + Send + Sync) {
    let rec = profiler.recorder();
    tracing::subscriber::with_default(subscriber, || {
        let request = tracing::info_span!("request", request.id = 42_i64);
        {
            let _entered = request.enter();
            let _step = rec.step();
            let _mixer = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
        }
        drop(request);
        let _step = rec.step();
        let _mixer = rec.section(Section::KDA_MIXER, 1u32, Site::ATTN);
    });
}

fn step<'a>(spans: &'a [SpanData], n: &str) -> &'a SpanData {
    spans
        .iter()
        .find(|s| {
            s.name == span::STEP
                && s.attributes
                    .iter()
                    .any(|kv| kv.key.as_str() == attr::STEP && kv.value.as_str() == n)
        })
        .unwrap_or_else(|| panic!("no step {n}: {spans:#?}"))
}

#[test]
fn on_the_engines_tracer_provider_a_sampled_step_is_a_child_of_the_request_span() {
    let (provider, spans, subscriber) = engine();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .without_prometheus()
        .with_tracer_provider(provider.clone())
        .build()
        .expect("building the profiler");
    record(&profiler, subscriber);
    profiler.shutdown();
    let all = spans.get_finished_spans().expect("the engine's spans");
    let request = all
        .iter()
        .find(|s| s.name == "request")
        .unwrap_or_else(|| panic!("no request span: {all:#?}"));
    let inside = step(&all, "0");
    let outside = step(&all, "1");
    assert_eq!(
        inside.span_context.trace_id(),
        request.span_context.trace_id()
    );
    assert_eq!(inside.parent_span_id, request.span_context.span_id());
    assert_eq!(inside.instrumentation_scope.name(), "phasetrace");
    assert_eq!(
        inside.instrumentation_scope.version(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    // The step's own spans follow it into the request's trace.
    let children: Vec<&SpanData> = all
        .iter()
        .filter(|s| s.parent_span_id == inside.span_context.span_id())
        .collect();
    assert_eq!(children.len(), 1, "{all:#?}");
    assert_eq!(children[0].name, span::LAYER);
    assert!(
        all.iter().any(
            |s| s.name == "kda_mixer" && s.parent_span_id == children[0].span_context.span_id()
        )
    );
    // Outside any tracing span: a root of a trace of its own.
    assert_eq!(outside.parent_span_id, SpanId::INVALID);
    assert_ne!(
        outside.span_context.trace_id(),
        request.span_context.trace_id()
    );
    // The engine's provider outlives the profiler.
    provider
        .force_flush()
        .expect("the engine's provider still runs");
    provider
        .shutdown()
        .expect("the engine shuts its provider down");
}

/// The value of attribute `key` in an OTLP attribute list.
fn otlp_attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

#[test]
fn on_phasetraces_own_grpc_pipeline_the_engines_span_parents_the_exported_step() {
    let receiver = OtlpReceiver::start_grpc();
    let (provider, spans, subscriber) = engine();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .with_service_name("tracing-bridge")
        .without_prometheus()
        .with_otlp_endpoint(Some(&receiver.endpoint()))
        .with_otlp_protocol(phasetrace::Protocol::Grpc)
        .build()
        .expect("building the profiler");
    record(&profiler, subscriber);
    profiler.flush();
    let steps = receiver
        .wait_for(WAIT, |r| {
            let steps: Vec<_> = r
                .spans()
                .into_iter()
                .filter(|s| s.name == span::STEP)
                .collect();
            (steps.len() == 2).then_some(steps)
        })
        .unwrap_or_else(|| {
            panic!(
                "not two step spans: {:#?}; refused: {:?}",
                receiver.spans(),
                receiver.refused()
            )
        });
    let engine_spans = spans.get_finished_spans().expect("the engine's spans");
    let request = engine_spans
        .iter()
        .find(|s| s.name == "request")
        .expect("the request span, at the engine's exporter");
    let inside = steps
        .iter()
        .find(|s| otlp_attr(&s.attributes, attr::STEP) == Some(&Value::IntValue(0)))
        .unwrap_or_else(|| panic!("no step 0: {steps:#?}"));
    let outside = steps
        .iter()
        .find(|s| otlp_attr(&s.attributes, attr::STEP) == Some(&Value::IntValue(1)))
        .unwrap_or_else(|| panic!("no step 1: {steps:#?}"));
    assert_eq!(
        inside.trace_id,
        request.span_context.trace_id().to_bytes(),
        "{inside:#?}"
    );
    assert_eq!(
        inside.parent_span_id,
        request.span_context.span_id().to_bytes(),
        "{inside:#?}"
    );
    let traces = receiver.traces();
    let services: Vec<Option<&Value>> = traces
        .iter()
        .flat_map(|t| &t.resource_spans)
        .map(|rs| {
            rs.resource
                .as_ref()
                .and_then(|r| otlp_attr(&r.attributes, "service.name"))
        })
        .collect();
    assert!(
        !services.is_empty()
            && services
                .iter()
                .all(|s| *s == Some(&Value::StringValue("tracing-bridge".to_owned()))),
        "service.name on every resource: {services:?}"
    );
    assert!(outside.parent_span_id.is_empty(), "a root: {outside:#?}");
    profiler.shutdown();
    provider
        .shutdown()
        .expect("the engine shuts its provider down");
}

/// Under the tail rule alone (no head sampling), the steps it keeps are the request's children
/// as head-sampled ones are, and a speculative round begun inside a step of the request sits in
/// the request's trace with its phases under it.
#[test]
fn tail_kept_steps_and_their_rounds_are_children_of_the_request_span() {
    use phasetrace::{Phase, SpecLevel, TraceSlowerThan};
    let (provider, spans, subscriber) = engine();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_spec_level(SpecLevel::Phases)
        .with_trace_every(0)
        .with_trace_slower_than(TraceSlowerThan::Duration(Duration::from_nanos(1)))
        .with_trace_slow_budget(10_000)
        .without_prometheus()
        .with_tracer_provider(provider.clone())
        .build()
        .expect("building the profiler");
    let rec = profiler.recorder();
    tracing::subscriber::with_default(subscriber, || {
        let request = tracing::info_span!("request", request.id = 7_i64);
        let _entered = request.enter();
        for layer in 0..3u32 {
            let _step = rec.step();
            let round = rec.round(4);
            std::thread::sleep(Duration::from_micros(50));
            round.phase(Phase::Draft);
            let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
            std::thread::sleep(Duration::from_micros(50));
            drop(_mixer);
            round.phase(Phase::Verify);
            round.end(2);
        }
    });
    profiler.shutdown();
    let all = spans.get_finished_spans().expect("the engine's spans");
    let request = all
        .iter()
        .find(|s| s.name == "request")
        .unwrap_or_else(|| panic!("no request span: {all:#?}"));
    let under_request = |s: &&SpanData| {
        s.parent_span_id == request.span_context.span_id()
            && s.span_context.trace_id() == request.span_context.trace_id()
    };
    let steps: Vec<&SpanData> = all.iter().filter(|s| s.name == span::STEP).collect();
    assert_eq!(steps.len(), 3, "every step kept by the tail rule: {all:#?}");
    assert!(steps.iter().all(under_request), "{steps:#?}");
    assert!(
        steps.iter().all(|s| s
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == attr::SAMPLED && kv.value.as_str() == "tail")),
        "{steps:#?}"
    );
    let rounds: Vec<&SpanData> = all.iter().filter(|s| s.name == span::ROUND).collect();
    assert_eq!(rounds.len(), 3, "{all:#?}");
    assert!(rounds.iter().all(under_request), "{rounds:#?}");
    for r in &rounds {
        assert!(
            all.iter()
                .any(|s| s.name == "draft" && s.parent_span_id == r.span_context.span_id()),
            "the round's phases follow it: {all:#?}"
        );
    }
    let _ = provider.shutdown();
}
