//! The bridge to `tracing` on the hot path: the lookup that makes a sampled step a child of the engine's current
//! `tracing` span, read through the engine's own `tracing-opentelemetry` layer (phasetrace
//! installs no layer of its own).

use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The current `tracing` span's OTel ids, when the layer is installed and a span is active.
/// Called only for sampled steps.
pub(crate) fn current_parent() -> Option<(u128, u64)> {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| {
        (
            u128::from_be_bytes(sc.trace_id().to_bytes()),
            u64::from_be_bytes(sc.span_id().to_bytes()),
        )
    })
}
