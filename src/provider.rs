//! The engine's providers as phasetrace takes them: [`EngineMeterProvider`] and
//! [`EngineTracerProvider`], implemented for every provider of the `opentelemetry` version
//! phasetrace is built against (0.33) and for nothing else, so that a provider of another
//! version is a compile error that says what to align instead of a bare E0277 (the test:
//! `tests/it/every_example_and_docs_snippet_builds_as_an_outside_crate.rs`).

use opentelemetry::global::ObjectSafeTracerProvider;

/// A meter provider of the `opentelemetry` version phasetrace records into (0.33): what
/// [`crate::ProfilerBuilder::with_meter_provider`] takes. Implemented for every
/// `opentelemetry::metrics::MeterProvider + Send + Sync + 'static`; not to be implemented by
/// hand.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a meter provider of opentelemetry 0.33, the version phasetrace 0.1 records into",
    label = "a provider of another opentelemetry version (or not a MeterProvider)",
    note = "align the engine's opentelemetry and opentelemetry_sdk on 0.33 (and tracing-opentelemetry on 0.34): `cargo tree -d -i opentelemetry` lists the copies in the build"
)]
pub trait EngineMeterProvider:
    opentelemetry::metrics::MeterProvider + Send + Sync + 'static
{
}

impl<P> EngineMeterProvider for P where
    P: opentelemetry::metrics::MeterProvider + Send + Sync + 'static
{
}

/// A tracer provider of the `opentelemetry` version phasetrace builds spans with (0.33), whose
/// tracers and spans are `Send + Sync`: what [`crate::ProfilerBuilder::with_tracer_provider`]
/// takes. Implemented for every such `opentelemetry::trace::TracerProvider`; not to be
/// implemented by hand.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a tracer provider of opentelemetry 0.33, the version phasetrace 0.1 builds spans with",
    label = "a provider of another opentelemetry version (or its tracer or spans are not Send + Sync)",
    note = "align the engine's opentelemetry and opentelemetry_sdk on 0.33 (and tracing-opentelemetry on 0.34): `cargo tree -d -i opentelemetry` lists the copies in the build"
)]
pub trait EngineTracerProvider: ObjectSafeTracerProvider + Send + Sync + 'static {}

impl<P, T, S> EngineTracerProvider for P
where
    S: opentelemetry::trace::Span + Send + Sync + 'static,
    T: opentelemetry::trace::Tracer<Span = S> + Send + Sync + 'static,
    P: opentelemetry::trace::TracerProvider<Tracer = T> + Send + Sync + 'static,
{
}
