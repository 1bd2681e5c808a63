//! A span exporter that prints one line per span to stderr (`OTEL_TRACES_EXPORTER=console`).

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use std::io::Write;

#[derive(Debug, Default)]
pub(super) struct ConsoleSpanExporter;

impl SpanExporter for ConsoleSpanExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut out = String::new();
        for s in batch {
            let dur = s
                .end_time
                .duration_since(s.start_time)
                .unwrap_or_default()
                .as_secs_f64()
                * 1e6;
            let attrs: Vec<String> = s
                .attributes
                .iter()
                .map(|kv| format!("{}={}", kv.key, kv.value))
                .collect();
            out += &format!(
                "[phasetrace-span] {} trace={} span={} parent={} {:.1}us {}\n",
                s.name,
                s.span_context.trace_id(),
                s.span_context.span_id(),
                s.parent_span_id,
                dur,
                attrs.join(" ")
            );
        }
        let _ = std::io::stderr().write_all(out.as_bytes());
        Ok(())
    }
}

/// Installs console spans (`OTEL_TRACES_EXPORTER=console`, no tracer provider of the engine's):
/// phasetrace's own tracer provider over the counted console exporter. OTLP spans win (the
/// configuration never selects both).
pub(super) fn install(x: &mut super::Install<'_>) -> Result<(), super::ExportError> {
    if x.wanted.traces_console && !x.wanted.traces_otlp {
        x.tracer_provider = Some(super::tracer_provider(
            x.resource.clone(),
            super::counted::Counted::new(
                ConsoleSpanExporter,
                x.span_counts.clone(),
                x.exemplars.clone(),
            ),
        ));
    }
    Ok(())
}
