//! docs/integrating.md: the engine hands phasetrace its own providers.
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The engine's own pipeline, as the fragment assumes it.
    let reader = PeriodicReader::builder(InMemoryMetricExporter::default()).build();
    let tracer_provider = SdkTracerProvider::builder().build();
    // {snippet}
    drop(profiler);
    meter_provider.shutdown()?;
    tracer_provider.shutdown()?;
    Ok(())
}
