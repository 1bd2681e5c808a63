// An engine that owns its OpenTelemetry pipeline: its own meter and tracer providers (their
// exporters and resource) and its own `tracing-opentelemetry` layer. phasetrace records into
// what it is given: no second pipeline, no endpoint, no runtime of its own; sampled steps are
// children of the engine's current `tracing` span; and its shutdown leaves the engine's
// providers running. In-memory exporters stand for the engine's OTLP exporters here, so this
// needs no infrastructure.
//
// `cargo run --example own_providers` (feature `tracing`, on by default)

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use phasetrace::{Profiler, Section, SectionLevel, Site};
use tracing_subscriber::layer::SubscriberExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The engine's pipeline, as it already is: phasetrace's view registered beside its own.
    let metrics = InMemoryMetricExporter::default();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metrics.clone()).build())
        .with_view(phasetrace::view(false))
        .build();
    let spans = InMemorySpanExporter::default();
    let tracer_provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer_provider.tracer("engine")));
    let requests = meter_provider
        .meter("engine")
        .u64_counter("engine.requests")
        .build();

    // phasetrace on the engine's providers.
    let profiler = Profiler::builder()
        .with_level(SectionLevel::Full)
        .with_trace_every(3) // a span tree for one step in three
        .with_meter_provider(meter_provider.clone())
        .with_tracer_provider(tracer_provider.clone())
        .build()?;
    assert!(profiler.prometheus_addr().is_none(), "nothing is served");

    tracing::subscriber::with_default(subscriber, || {
        let rec = profiler.recorder();
        for id in 0..2i64 {
            let request = tracing::info_span!("request", id);
            let _entered = request.enter();
            requests.add(1, &[]);
            for _token in 0..3 {
                let _step = rec.step(); // sampled: a child of `request`
                for layer in 0..4u32 {
                    let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
                    let _attn = rec.section(Section::DSA_ATTEND, layer, Site::ATTN);
                }
            }
        }
    });
    // Processes what is left into the engine's providers and stops phasetrace's worker; the
    // providers are the engine's to flush and shut down.
    profiler.shutdown();
    requests.add(1, &[]); // the engine's instruments keep working
    meter_provider.force_flush()?;

    let collected = metrics.get_finished_metrics()?;
    let last = collected.last().ok_or("no metrics were exported")?;
    for scope in last.scope_metrics() {
        let names: Vec<&str> = scope.metrics().map(|m| m.name()).collect();
        println!(
            "scope {} {}: {}",
            scope.scope().name(),
            scope.scope().version().unwrap_or(""),
            names.join(", ")
        );
    }

    let finished = spans.get_finished_spans()?;
    let requests: Vec<_> = finished.iter().filter(|s| s.name == "request").collect();
    let steps: Vec<_> = finished
        .iter()
        .filter(|s| s.name == phasetrace::names::span::STEP)
        .collect();
    for step in &steps {
        let parent = requests
            .iter()
            .find(|r| r.span_context.span_id() == step.parent_span_id)
            .ok_or("a sampled step is not a child of its request span")?;
        println!(
            "trace {}: request {} -> {} (scope {})",
            step.span_context.trace_id(),
            parent.span_context.span_id(),
            step.name,
            step.instrumentation_scope.name()
        );
    }
    if steps.len() != 2 {
        return Err(format!("expected 2 sampled steps, found {}", steps.len()).into());
    }

    tracer_provider.shutdown()?;
    meter_provider.shutdown()?;
    Ok(())
}
