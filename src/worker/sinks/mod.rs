//! The sinks of pairing's events, one per output: metrics (the SDK instruments, per-layer
//! totals, expert load, drop counts), spans (tail decision, span budget, spans, exemplars) and
//! the console summary.
//!
//! ```text
//! &Event ──> Sinks::on ─┬─> MetricsSink::on
//!                       ├─> ConsoleSink::on
//!                       └─> SpanSink::on ──(a drop it decided)──> Event::Dropped to the others
//! ```
//!
//! A fixed set, called directly: no allocation and no dynamic dispatch per event.

pub(crate) mod console;
pub(crate) mod metrics;
pub(crate) mod spans;

use super::event::{Event, Sink};
use console::ConsoleSink;
use metrics::MetricsSink;
use spans::SpanSink;

/// Every sink of one pipeline.
pub(crate) struct Sinks {
    pub(crate) metrics: MetricsSink,
    pub(crate) spans: SpanSink,
    pub(crate) console: ConsoleSink,
}

impl Sink for Sinks {
    #[inline(always)]
    fn on(&mut self, e: &Event<'_>) {
        self.metrics.on(e);
        self.console.on(e);
        if let Some((reason, n)) = self.spans.on(e) {
            let dropped = Event::Dropped { reason, n };
            self.metrics.on(&dropped);
            self.console.on(&dropped);
        }
    }
}
