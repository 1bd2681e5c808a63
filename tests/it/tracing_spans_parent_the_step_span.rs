//! With `Profiler::tracing_layer()` installed in a `tracing` subscriber, a sampled decode step
//! recorded inside an engine's `tracing` span (`request`) becomes that span's child in the same
//! trace, and both reach a real collector through the profiler's OTLP exporter. A step recorded
//! outside any `tracing` span stays a root.
#![cfg(feature = "tracing")]

use crate::support;

use std::time::Duration;

use phasetrace::names::{attr, span};
use phasetrace::{Level, Profiler, Section, Site};
use support::Rotel;
use tracing_subscriber::layer::SubscriberExt as _;

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn a_sampled_step_is_a_child_of_the_current_tracing_span() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(Level::Full)
        .with_trace_every(1)
        .with_service_name("tracing-bridge")
        .without_prometheus()
        .with_otlp_endpoint(Some(&rotel.grpc_endpoint()))
        .build()
        .expect("building the profiler");
    let layer = profiler
        .tracing_layer()
        .expect("a traces exporter is configured, so there is a layer");
    let subscriber = tracing_subscriber::registry().with(layer);
    let rec = profiler.recorder();

    tracing::subscriber::with_default(subscriber, || {
        let request = tracing::info_span!("request", request.id = 42_i64);
        {
            let _entered = request.enter();
            let _step = rec.step();
            let _mixer = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
        }
        drop(request);
        // Outside any tracing span: a root step in a trace of its own.
        let _step = rec.step();
        let _mixer = rec.section(Section::KDA_MIXER, 1u32, Site::ATTN);
    });
    drop(rec);
    profiler.flush();

    let p = rotel.wait_for(
        |p| p.span("request").is_some() && p.spans_named(span::STEP).len() == 2,
        WAIT,
    );
    let request = p.span("request").unwrap();
    assert!(request.is_root(), "{request:#?}");
    assert_eq!(request.attr("request.id"), Some("42"));
    assert_eq!(
        request.resource.get("service.name").map(String::as_str),
        Some("tracing-bridge"),
        "the layer exports through the profiler's tracer provider"
    );

    let steps = p.spans_named(span::STEP);
    let inside = steps
        .iter()
        .find(|s| s.attr(attr::STEP) == Some("0"))
        .unwrap_or_else(|| panic!("no step 0: {steps:#?}"));
    let outside = steps
        .iter()
        .find(|s| s.attr(attr::STEP) == Some("1"))
        .unwrap_or_else(|| panic!("no step 1: {steps:#?}"));

    // The step inside the request is its child, in its trace; its own spans follow it there.
    assert_eq!(
        inside.trace_id, request.trace_id,
        "{inside:#?}\n{request:#?}"
    );
    assert_eq!(
        inside.parent_span_id.as_deref(),
        Some(request.span_id.as_str()),
        "{inside:#?}\n{request:#?}"
    );
    assert_eq!(p.parent_of(inside), Some(request));
    let layer = p
        .children_of(inside)
        .into_iter()
        .find(|s| s.name == span::LAYER)
        .unwrap_or_else(|| panic!("no layer span under the step: {}", rotel.output()));
    let mixer = p.children_of(layer);
    assert_eq!(mixer.len(), 1);
    assert_eq!(mixer[0].name, "kda_mixer");
    assert_eq!(mixer[0].trace_id, request.trace_id);
    // The request's children are exactly the step.
    assert_eq!(p.children_of(request), vec![*inside]);
    // The step lies within the request.
    assert!(inside.start_unix_nanos >= request.start_unix_nanos);
    assert!(inside.end_unix_nanos <= request.end_unix_nanos);

    // The step outside any tracing span is a root of another trace.
    assert!(outside.is_root(), "{outside:#?}");
    assert_ne!(outside.trace_id, request.trace_id);
    assert_eq!(p.spans.len(), 1 + 2 * 3, "{}", rotel.output());

    profiler.shutdown();
}

#[test]
fn without_a_traces_exporter_there_is_no_layer() {
    let profiler = Profiler::builder()
        .without_env()
        .with_level(Level::Full)
        .without_prometheus()
        .build()
        .unwrap();
    let layer = profiler.tracing_layer::<tracing_subscriber::Registry>();
    assert!(layer.is_none());
    profiler.shutdown();
}
