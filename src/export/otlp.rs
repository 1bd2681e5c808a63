//! The OTLP exporters over gRPC (tonic) and HTTP/protobuf (blocking reqwest): phasetrace's
//! own ([`super::proto_metrics`], [`super::proto_spans`]) over the shared transport, each export
//! bounded against a hostile collector, and their failures by signal and reason
//! (`phasetrace.otlp.export.failures`).

use super::ExportError;
use super::counted::FailureCounts;
use crate::config::{Exporter, OtlpConfig, Protocol, Signal};
use crate::names::{Described, ExportFailure, attr, metric, signal};
use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;
use std::sync::Arc;

/// `phasetrace.otlp.export.failures` of one signal on `meter`: a series per reason from the
/// start.
fn failure_counter(
    meter: &Meter,
    group: &str,
    counts: Arc<FailureCounts>,
) -> opentelemetry::metrics::ObservableCounter<u64> {
    let series = ExportFailure::ALL.map(|r| {
        (
            r,
            [
                KeyValue::new(attr::SIGNAL, counts.signal),
                KeyValue::new(attr::REASON, r.as_str()),
                KeyValue::new(attr::GROUP, group.to_owned()),
            ],
        )
    });
    meter
        .u64_observable_counter(metric::OTLP_EXPORT_FAILURES)
        .described()
        .with_callback(move |o| {
            for (r, kv) in &series {
                o.observe(counts.get(*r), kv);
            }
        })
        .build()
}

/// Registers `counts` on every meter (see [`failure_counter`]).
fn count_failures(x: &mut super::Install<'_>, counts: &Arc<FailureCounts>) {
    let group = x.cfg.group.clone();
    let counts = counts.clone();
    x.own_metrics.push(Box::new(move |m, kept| {
        kept.push(super::OwnMetric::Counter(failure_counter(
            m,
            &group,
            counts.clone(),
        )));
    }));
}

/// The runtime of the tonic channels: only when an OTLP exporter of phasetrace's own uses gRPC.
pub(super) fn runtime(
    cfg: &crate::config::Config,
    wanted: super::Wanted,
) -> Result<Option<tokio::runtime::Runtime>, ExportError> {
    let grpc = |o: Option<&OtlpConfig>, signal| {
        wanted.has(signal, Exporter::Otlp) && o.is_some_and(|o| o.protocol == Protocol::Grpc)
    };
    if !grpc(cfg.metrics_otlp.as_ref(), Signal::Metrics)
        && !grpc(cfg.traces_otlp.as_ref(), Signal::Traces)
    {
        return Ok(None);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("phasetrace-otlp")
        .enable_all()
        .build()
        .map(Some)
        .map_err(ExportError::Thread)
}

/// Installs OTLP metrics (when wanted): the SDK's periodic reader over the counted exporter
/// (phasetrace's own, with the exemplars of delivered traces when traces are on); and its
/// exports, by result, and its failures, by reason, as metrics of its own.
pub(super) fn install_metrics(x: &mut super::Install<'_>) -> Result<(), ExportError> {
    use super::{counted, proto_metrics};
    let Some(o) = x
        .cfg
        .metrics_otlp
        .as_ref()
        .filter(|_| x.wanted.has(Signal::Metrics, Exporter::Otlp))
    else {
        return Ok(());
    };
    let counts = std::sync::Arc::new(counted::ExportCounts::default());
    // Said on stderr by `ExportCounts::record`, with the error's text that names the reason.
    let failures = Arc::new(FailureCounts::new(
        signal::METRICS,
        o.endpoint.clone(),
        false,
    ));
    // Without traces the store stays empty: the requests are the conversion's alone.
    let store = x.exemplars.clone().unwrap_or_default();
    let inner = proto_metrics::ProtoMetricExporter::new(o, x.runtime, store, failures.clone())?;
    count_failures(x, &failures);
    let exporter = counted::CountedMetrics::new(inner, counts.clone(), o.endpoint.clone());
    // Exponential histograms are an OTLP setting: the endpoint shares this reader only when
    // they are off (see `super::Role::Scraped`).
    x.readers.push(super::OwnReader {
        reader: super::Reader::new(
            opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
                .with_interval(x.cfg.metric_export_interval)
                .build(),
        ),
        exponential: o.histogram == crate::config::HistogramAggregation::Exponential,
        role: super::Role::Export,
    });
    // `phasetrace.metric.exports`, by result, on every meter.
    let group = x.cfg.group.clone();
    x.own_metrics.push(Box::new(move |m, kept| {
        let counts = counts.clone();
        let name = crate::names::metric::METRIC_EXPORTS;
        let (unit, help) = crate::names::unit_and_help(name);
        kept.push(super::OwnMetric::Counter(super::outcome_counter(
            m,
            name,
            unit,
            help,
            &group,
            move |r| counts.get(r),
        )));
    }));
    Ok(())
}

/// Installs OTLP spans (when wanted): phasetrace's own tracer provider over the counted
/// exporter; its failures, by reason, as a metric of its own.
pub(super) fn install_traces(x: &mut super::Install<'_>) -> Result<(), ExportError> {
    let Some(o) = x
        .cfg
        .traces_otlp
        .as_ref()
        .filter(|_| x.wanted.has(Signal::Traces, Exporter::Otlp))
    else {
        return Ok(());
    };
    let failures = Arc::new(FailureCounts::new(signal::TRACES, o.endpoint.clone(), true));
    let exporter = super::proto_spans::ProtoSpanExporter::new(o, x.runtime, failures.clone())?;
    count_failures(x, &failures);
    x.span_processors
        .push(super::span_processor(super::counted::Counted::new(
            exporter,
            x.span_counts.clone(),
            x.exemplars.clone(),
        )));
    Ok(())
}
