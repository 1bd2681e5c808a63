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

/// Installs console spans (`OTEL_TRACES_EXPORTER=console`, no tracer provider of the
/// engine's): the counted console exporter on phasetrace's own tracer provider.
pub(super) fn install(x: &mut super::Install<'_>) -> Result<(), super::ExportError> {
    use crate::config::{Exporter, Signal};
    if x.wanted.has(Signal::Traces, Exporter::Console) {
        x.span_processors
            .push(super::span_processor(super::counted::Counted::new(
                ConsoleSpanExporter,
                x.span_counts.clone(),
                x.exemplars.clone(),
            )));
    }
    Ok(())
}
