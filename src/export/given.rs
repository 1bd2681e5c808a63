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
    }));
    x.tracer = given
        .tracer
        .as_ref()
        .map(|p| BoxedTracer::new(p.boxed_tracer(scope())));
    Ok(())
}
