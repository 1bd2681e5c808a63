//! Export accounting: spans handed to the exporter, exported, and lost to failed exports; OTLP
//! metrics exports by outcome; failed OTLP exports of each signal by reason ([`FailureCounts`]).
//!
//! The batch processor drops spans silently when its queue is full or an export fails; wrapping
//! the exporter lets the worker count what was lost and report it as
//! `phasetrace.records.dropped{reason="span_export"}`, and tells the exemplar store which
//! spans reached the collector (their exemplars become visible) and which were lost.

use super::exemplars::ExemplarStore;
#[cfg(feature = "otlp")]
use crate::names::ExportFailure;
use crate::names::{Outcome, attr, metric};
use opentelemetry::trace::SpanId;
use opentelemetry_sdk::Resource;
#[cfg(feature = "otlp")]
use opentelemetry_sdk::error::OTelSdkError;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Counters shared by the exporter wrapper and the worker.
#[derive(Debug)]
pub(crate) struct SpanCounts {
    pub(crate) exported: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// Whether the spans go through phasetrace's own (counted) exporter. Spans handed to the
    /// engine's tracer provider are the engine's to count: nothing is known of their queue.
    pub(crate) tracked: bool,
}

impl Default for SpanCounts {
    fn default() -> Self {
        SpanCounts::tracked(true)
    }
}

impl SpanCounts {
    pub(crate) fn tracked(tracked: bool) -> Self {
        SpanCounts {
            exported: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            tracked,
        }
    }
}

/// A span exporter that counts what its inner exporter delivered and lost.
#[derive(Debug)]
pub(crate) struct Counted<E> {
    inner: E,
    counts: Arc<SpanCounts>,
    exemplars: Option<Arc<ExemplarStore>>,
}

impl<E> Counted<E> {
    pub(crate) fn new(
        inner: E,
        counts: Arc<SpanCounts>,
        exemplars: Option<Arc<ExemplarStore>>,
    ) -> Self {
        Counted {
            inner,
            counts,
            exemplars,
        }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let n = batch.len() as u64;
        let counts = self.counts.clone();
        let exemplars = self.exemplars.clone().filter(|e| e.has_pending());
        let ids: Vec<SpanId> = match &exemplars {
            Some(_) => batch.iter().map(|s| s.span_context.span_id()).collect(),
            None => Vec::new(),
        };
        let fut = self.inner.export(batch);
        async move {
            let r = fut.await;
            match &r {
                Ok(()) => counts.exported.fetch_add(n, Relaxed),
                Err(_) => counts.failed.fetch_add(n, Relaxed),
            };
            if let Some(e) = exemplars {
                e.settle(&ids, r.is_ok());
            }
            r
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// OTLP metrics exports so far, by [`Outcome`], and the current run of failures.
#[derive(Debug, Default)]
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
pub(crate) struct ExportCounts {
    counts: [AtomicU64; Outcome::ALL.len()],
    failing: AtomicU64,
}

#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
impl ExportCounts {
    pub(crate) fn get(&self, o: Outcome) -> u64 {
        self.counts[o as usize].load(Relaxed)
    }

    /// Counts one export; says on stderr when exports start failing (once per outage, with the
    /// first error) and when they work again.
    fn record(&self, r: &OTelSdkResult, endpoint: &str) {
        match r {
            Ok(()) => {
                self.counts[Outcome::Ok as usize].fetch_add(1, Relaxed);
                let failed = self.failing.swap(0, Relaxed);
                if failed > 0 {
                    crate::diag::notice!(
                        "OTLP metrics export to {endpoint} works again after {failed} \
                         failed export(s)"
                    );
                }
            }
            Err(e) => {
                self.counts[Outcome::Failed as usize].fetch_add(1, Relaxed);
                if self.failing.fetch_add(1, Relaxed) == 0 {
                    crate::diag::warning!(
                        "OTLP metrics export to {endpoint} failed ({e}); \
                         nothing is lost (the next export carries the cumulative totals) but the \
                         backend's view is stale until one succeeds; counted in {}{{{}=\"{}\"}}",
                        metric::METRIC_EXPORTS,
                        attr::RESULT,
                        Outcome::Failed.as_str()
                    );
                }
            }
        }
    }
}

/// A metrics exporter that counts its exports by outcome (see [`ExportCounts::record`]).
#[derive(Debug)]
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
pub(crate) struct CountedMetrics<E> {
    inner: E,
    counts: Arc<ExportCounts>,
    /// Named in the stderr lines.
    endpoint: String,
}

#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
impl<E> CountedMetrics<E> {
    pub(crate) fn new(inner: E, counts: Arc<ExportCounts>, endpoint: String) -> Self {
        CountedMetrics {
            inner,
            counts,
            endpoint,
        }
    }
}

impl<E: PushMetricExporter> PushMetricExporter for CountedMetrics<E> {
    fn export(
        &self,
        metrics: &ResourceMetrics,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let fut = self.inner.export(metrics);
        let counts = self.counts.clone();
        let endpoint = self.endpoint.clone();
        async move {
            let r = fut.await;
            counts.record(&r, &endpoint);
            r
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// Failed OTLP exports of one signal by reason (`phasetrace.otlp.export.failures`), and the
/// current run of failures; the exporters of [`super::proto_metrics`] and
/// [`super::proto_spans`] count here.
#[derive(Debug)]
#[cfg(feature = "otlp")]
pub(crate) struct FailureCounts {
    /// `metrics` or `traces`.
    pub(crate) signal: &'static str,
    /// Named in the stderr line.
    endpoint: String,
    counts: [AtomicU64; ExportFailure::ALL.len()],
    failing: AtomicU64,
    /// Whether the first failure of a run is said on stderr here (the metrics' is said by
    /// [`ExportCounts::record`], with the error text that names the reason).
    warn: bool,
}

#[cfg(feature = "otlp")]
impl FailureCounts {
    pub(crate) fn new(signal: &'static str, endpoint: String, warn: bool) -> Self {
        FailureCounts {
            signal,
            endpoint,
            counts: Default::default(),
            failing: AtomicU64::new(0),
            warn,
        }
    }

    fn index(reason: ExportFailure) -> usize {
        // `ALL` lists every variant: the fallback is never taken.
        ExportFailure::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(ExportFailure::ALL.len() - 1)
    }

    /// Failed exports for `reason` so far.
    pub(crate) fn get(&self, reason: ExportFailure) -> u64 {
        self.counts[Self::index(reason)].load(Relaxed)
    }

    /// An export worked: the run of failures, if any, is over.
    pub(crate) fn ok(&self) {
        let failed = self.failing.swap(0, Relaxed);
        if failed > 0 && self.warn {
            crate::diag::notice!(
                "OTLP {} export to {} works again after {failed} failed export(s)",
                self.signal,
                self.endpoint
            );
        }
    }

    /// Counts a failed export and gives the error the exporter returns, which names the
    /// reason; the first failure of a run is said on stderr.
    pub(crate) fn failed(&self, (reason, detail): (ExportFailure, String)) -> OTelSdkError {
        self.counts[Self::index(reason)].fetch_add(1, Relaxed);
        if self.failing.fetch_add(1, Relaxed) == 0 && self.warn {
            crate::diag::warning!(
                "OTLP {} export to {} failed, reason {reason} ({detail}); the spans of a failed \
                 export are lost, counted in {}{{{}=\"{}\"}} and {}{{{}=\"{reason}\"}}",
                self.signal,
                self.endpoint,
                metric::RECORDS_DROPPED,
                attr::REASON,
                crate::names::reason::SPAN_EXPORT,
                metric::OTLP_EXPORT_FAILURES,
                attr::REASON,
            );
        }
        OTelSdkError::InternalFailure(format!("reason {reason}: {detail}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::error::OTelSdkError;

    #[test]
    fn exports_are_counted_by_outcome_and_an_outage_is_one_run() {
        let c = ExportCounts::default();
        let fail = Err(OTelSdkError::InternalFailure("connection refused".into()));
        c.record(&Ok(()), "http://x:4317");
        for _ in 0..3 {
            c.record(&fail, "http://x:4317");
        }
        assert_eq!(c.failing.load(Relaxed), 3);
        c.record(&Ok(()), "http://x:4317");
        assert_eq!(c.failing.load(Relaxed), 0, "the outage ended");
        assert_eq!((c.get(Outcome::Ok), c.get(Outcome::Failed)), (2, 3));
    }
}
