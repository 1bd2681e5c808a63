//! The engine's own providers as an exporter: handed to the builder, phasetrace records into
//! them and builds no pipeline of its own for their signals; installed first, so that the
//! engine's meter comes first.

use super::{ExportError, Install, ProviderMeter, scope};
use opentelemetry::global::{BoxedTracer, ObjectSafeTracerProvider};
use opentelemetry::metrics::MeterProvider;
use std::sync::Arc;

/// Whether a meter's instruments may be recorded through bound handles.
///
/// `Histogram::bind` is the API's: a `MeterProvider` that is not the SDK's inherits its
/// default, a handle that drops every measurement. Bound only where the provider is known to
/// be an `opentelemetry_sdk::metrics::SdkMeterProvider` (phasetrace's own, or the engine's
/// when its type says so); any other provider, the globals included, is recorded by
/// attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Bind {
    /// Record through handles bound once per series.
    Bound,
    /// Record by attributes (`Histogram::record(value, attrs)`), every time.
    #[default]
    Unbound,
}

impl Bind {
    /// [`Bind::Bound`] exactly when `P` is the SDK's meter provider.
    pub(crate) fn of<P: 'static>() -> Bind {
        if std::any::TypeId::of::<P>()
            == std::any::TypeId::of::<opentelemetry_sdk::metrics::SdkMeterProvider>()
        {
            Bind::Bound
        } else {
            Bind::Unbound
        }
    }
}

/// The engine's own providers, handed to the builder: phasetrace records into them and builds
/// no pipeline of its own for their signals.
#[derive(Clone, Default)]
pub(crate) struct Given {
    pub(crate) meter: Option<Arc<dyn MeterProvider + Send + Sync>>,
    /// Whether `meter` is known to be an `SdkMeterProvider` (its type said so at
    /// `with_meter_provider`): only then do its instruments record through bound handles.
    pub(crate) meter_bind: Bind,
    pub(crate) tracer: Option<Arc<dyn ObjectSafeTracerProvider + Send + Sync>>,
    /// `with_global_providers`: `meter` and `tracer` are `opentelemetry::global`'s, read when
    /// `build()` runs.
    pub(crate) global: bool,
    /// Whether `meter`, an `SdkMeterProvider`, has a reader; `None` for another type.
    pub(crate) meter_readers: Option<bool>,
}

impl std::fmt::Debug for Given {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Given")
            .field("meter_provider", &self.meter.is_some())
            .field("tracer_provider", &self.tracer.is_some())
            .finish()
    }
}

/// Installs the engine's providers: its meter (first of the meters the worker records into) and
/// its tracer (which then carries the step and round spans).
pub(super) fn install(x: &mut Install<'_>) -> Result<(), ExportError> {
    let given = x.given;
    x.meters.extend(given.meter.iter().map(|p| ProviderMeter {
        meter: p.meter_with_scope(scope()),
        bind: given.meter_bind,
        distributions: None,
        twins: None,
        given: true,
    }));
    x.tracer = given
        .tracer
        .as_ref()
        .map(|p| BoxedTracer::new(p.boxed_tracer(scope())));
    Ok(())
}

/// Says once per profiler (`warned`) when the engine's meter provider took none of phasetrace's
/// per-layer instruments through [`crate::view`] (`seen`, learnt while they were created on it;
/// `layer_attr`: they carry the layer). The SDK consults a provider's views only for its
/// readers: a view not consulted means no view, no reader, or a no-op provider, told apart
/// where the type says enough.
pub(crate) fn hint_missing_view(
    given: &Given,
    seen: super::views::ViewSeen,
    layer_attr: bool,
    warned: &std::sync::atomic::AtomicBool,
) {
    if seen.layer || !layer_attr || warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    match (given.global, given.meter_readers) {
        (true, _) => crate::diag::warning!(
            "with_global_providers: the global meter provider took none of phasetrace's \
             instruments through phasetrace::view(): it is still the API's no-op \
             default (call opentelemetry::global::set_meter_provider before build()), \
             has no reader, or has no phasetrace::view() (said once)"
        ),
        (false, Some(false)) => crate::diag::warning!(
            "the meter provider given to with_meter_provider has no reader: \
             phasetrace's instruments on it record nowhere; add the engine's reader \
             (SdkMeterProvider::builder().with_reader(..)) (said once)"
        ),
        (false, Some(true)) => crate::diag::warning!(
            "the meter provider given to with_meter_provider has no \
             phasetrace::view(): its per-layer counters ({}, {}, ...) keep the SDK's \
             2000 series each, and a model with more (section, layer) pairs folds the \
             rest into one otel.metric.overflow series; register it with \
             SdkMeterProvider::builder().with_view(phasetrace::view(false)) (said once)",
            crate::names::metric::SECTION_LAYER_TIME,
            crate::names::metric::SECTION_LAYER_CALLS,
        ),
        // Another crate's provider: views are the SDK's, nothing to say.
        (false, None) => {}
    }
}
