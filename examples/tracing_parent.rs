// The engine's `tracing` spans (a request) parent phasetrace's step spans: install
// `profiler.tracing_layer()` in the subscriber, and a sampled step begun inside a request span
// becomes its child. Spans go to the console here (`OTEL_TRACES_EXPORTER=console`, set in
// code); with `OTEL_EXPORTER_OTLP_ENDPOINT` they go to a collector instead.
//
// `cargo run --example tracing_parent` (feature `tracing`, on by default)

use phasetrace::config::{TracesExporter, settings};
use phasetrace::{Level, Profiler, Section, Site};
use tracing_subscriber::layer::SubscriberExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profiler = Profiler::builder()
        .with_level(Level::Full)
        .with_trace_every(1) // spans for every step
        .with(&settings::TRACES_EXPORTER, TracesExporter::Console)
        .without_prometheus()
        .build()?;
    let layer = profiler
        .tracing_layer()
        .ok_or("no traces exporter is configured")?;
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        let rec = profiler.recorder();
        for request in 0..2 {
            let span = tracing::info_span!("request", id = request);
            let _entered = span.enter();
            let _step = rec.step(); // a child of `request`
            let _s = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
        }
    });
    profiler.flush();
    println!(
        "{} steps, {} spans exported (printed on stderr as [phasetrace-span] lines)",
        profiler.stats().steps,
        profiler.stats().spans_exported
    );
    profiler.shutdown();
    Ok(())
}
