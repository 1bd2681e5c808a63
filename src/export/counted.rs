//! Span export accounting: spans handed to the exporter, exported, and lost to failed exports.
//!
//! The batch processor drops spans silently when its queue is full or an export fails; wrapping
//! the exporter lets the worker count what was lost and report it as
//! `phasetrace.records.dropped{reason="span_export"}`, and tells the exemplar store which
//! spans reached the collector (their exemplars become visible) and which were lost.

use super::exemplars::ExemplarStore;
use opentelemetry::trace::SpanId;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Counters shared by the exporter wrapper and the worker.
#[derive(Debug, Default)]
pub(crate) struct SpanCounts {
    pub(crate) exported: AtomicU64,
    pub(crate) failed: AtomicU64,
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
