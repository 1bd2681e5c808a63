//! The engine's own meter provider as the tests build it (test support, not a test): an SDK
//! provider with an in-memory exporter behind a periodic reader that never fires on its own
//! (the tests flush), with phasetrace's view (`Some(exponential)`) or without it (`None`).

use std::time::Duration;

use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

/// The provider and the exporter that receives what it exports.
pub(crate) fn engine_provider(view: Option<bool>) -> (SdkMeterProvider, InMemoryMetricExporter) {
    let exporter = InMemoryMetricExporter::default();
    let mut b = SdkMeterProvider::builder().with_reader(
        PeriodicReader::builder(exporter.clone())
            .with_interval(Duration::from_secs(3600))
            .build(),
    );
    if let Some(exponential) = view {
        b = b.with_view(phasetrace::view(exponential));
    }
    (b.build(), exporter)
}
