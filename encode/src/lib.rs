//! The metric writers that phasetrace's exporters (the `phasetrace` crate) and its log importer
//! (`phasetrace-import`) share, so that a series reads the same whether it was scraped live or
//! backfilled from a log:
//!
//! - [`text`]: the lines of the Prometheus text format (0.0.4) and of OpenMetrics 1.0.0 —
//!   `# HELP` / `# TYPE` / `# UNIT` headers, label sets with their escaping, sample lines with
//!   an optional timestamp and exemplar, `# EOF` — and the spelling of their values.
//! - `otlp` (feature `otlp`): opentelemetry-proto metric messages — attributes, resource,
//!   scope, cumulative histogram and monotonic sum metrics, their data points and exemplars.
//!
//! ```text
//! phasetrace /metrics:  SDK ResourceMetrics ──names, values──> text::Exposition ──> scrape
//! phasetrace-import:    log series ─────────names, values──> text::Exposition ──> backfill
//! phasetrace OTLP:      ExportMetricsServiceRequest::from(SDK) + otlp::exemplar
//! phasetrace-import:    log series ──otlp::{resource, scope, histogram, monotonic_sum,
//!                                            histogram_point, number_point}──> requests
//! ```
//!
//! Names are not decided here: the Prometheus naming rule is the contract's
//! (`phasetrace_names::prometheus`); these writers take the names they are given.

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

#[cfg(feature = "otlp")]
pub mod otlp;
pub mod text;
