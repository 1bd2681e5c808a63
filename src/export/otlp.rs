//! OTLP exporters over gRPC (tonic) and HTTP/protobuf (blocking reqwest).

use super::ExportError;
use super::transport;
use crate::config::{OtlpConfig, Protocol};
#[cfg(feature = "otlp-http")]
use opentelemetry_otlp::WithHttpConfig;
#[cfg(feature = "otlp-grpc")]
use opentelemetry_otlp::WithTonicConfig;
use opentelemetry_otlp::{Compression, MetricExporter, SpanExporter, WithExportConfig};
use opentelemetry_sdk::metrics::Temporality;
#[cfg(feature = "otlp-http")]
use std::collections::HashMap;

fn err(signal: &'static str, o: &OtlpConfig, e: impl std::fmt::Display) -> ExportError {
    ExportError::Otlp {
        signal,
        var: o.endpoint_var(),
        endpoint: o.endpoint.clone(),
        detail: e.to_string(),
    }
}

/// A protocol this build has no exporter for (refused earlier, by the configuration).
#[allow(dead_code)]
fn not_compiled(signal: &'static str, o: &OtlpConfig) -> ExportError {
    err(
        signal,
        o,
        format!(
            "this build of phasetrace has no OTLP {} exporter",
            o.protocol
        ),
    )
}

pub(super) fn span_exporter(
    o: &OtlpConfig,
    rt: Option<&tokio::runtime::Runtime>,
) -> Result<SpanExporter, ExportError> {
    let _ = &rt;
    match o.protocol {
        #[cfg(not(feature = "otlp-grpc"))]
        Protocol::Grpc => Err(not_compiled("traces", o)),
        #[cfg(not(feature = "otlp-http"))]
        Protocol::HttpProtobuf => Err(not_compiled("traces", o)),
        #[cfg(feature = "otlp-grpc")]
        Protocol::Grpc => {
            let _guard = rt.map(|r| r.enter());
            let mut b = SpanExporter::builder()
                .with_tonic()
                .with_endpoint(o.endpoint.clone())
                .with_timeout(o.timeout)
                .with_metadata(transport::metadata(&o.target()).map_err(|e| err("traces", o, e))?);
            if o.gzip {
                b = b.with_compression(Compression::Gzip);
            }
            if let Some(t) = transport::tls("traces", o)? {
                b = b.with_tls_config(t);
            }
            b.build().map_err(|e| err("traces", o, e))
        }
        #[cfg(feature = "otlp-http")]
        Protocol::HttpProtobuf => {
            let mut b = SpanExporter::builder()
                .with_http()
                .with_http_client(transport::client("traces", o)?)
                .with_endpoint(o.endpoint.clone())
                .with_timeout(o.timeout)
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_headers(o.headers.iter().cloned().collect::<HashMap<_, _>>());
            if o.gzip {
                b = b.with_compression(Compression::Gzip);
            }
            b.build().map_err(|e| err("traces", o, e))
        }
    }
}

pub(super) fn metric_exporter(
    o: &OtlpConfig,
    rt: Option<&tokio::runtime::Runtime>,
) -> Result<MetricExporter, ExportError> {
    let _ = &rt;
    match o.protocol {
        #[cfg(not(feature = "otlp-grpc"))]
        Protocol::Grpc => Err(not_compiled("metrics", o)),
        #[cfg(not(feature = "otlp-http"))]
        Protocol::HttpProtobuf => Err(not_compiled("metrics", o)),
        #[cfg(feature = "otlp-grpc")]
        Protocol::Grpc => {
            let _guard = rt.map(|r| r.enter());
            let mut b = MetricExporter::builder()
                .with_tonic()
                .with_endpoint(o.endpoint.clone())
                .with_timeout(o.timeout)
                .with_metadata(transport::metadata(&o.target()).map_err(|e| err("metrics", o, e))?)
                .with_temporality(Temporality::Cumulative);
            if o.gzip {
                b = b.with_compression(Compression::Gzip);
            }
            if let Some(t) = transport::tls("metrics", o)? {
                b = b.with_tls_config(t);
            }
            b.build().map_err(|e| err("metrics", o, e))
        }
        #[cfg(feature = "otlp-http")]
        Protocol::HttpProtobuf => {
            let mut b = MetricExporter::builder()
                .with_http()
                .with_http_client(transport::client("metrics", o)?)
                .with_endpoint(o.endpoint.clone())
                .with_timeout(o.timeout)
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_headers(o.headers.iter().cloned().collect::<HashMap<_, _>>())
                .with_temporality(Temporality::Cumulative);
            if o.gzip {
                b = b.with_compression(Compression::Gzip);
            }
            b.build().map_err(|e| err("metrics", o, e))
        }
    }
}

/// The runtime of the tonic channels: only when an OTLP exporter of phasetrace's own uses gRPC.
pub(super) fn runtime(
    cfg: &crate::config::Config,
    wanted: super::Wanted,
) -> Result<Option<tokio::runtime::Runtime>, ExportError> {
    let grpc =
        |o: Option<&OtlpConfig>, on: bool| on && o.is_some_and(|o| o.protocol == Protocol::Grpc);
    if !grpc(cfg.metrics_otlp.as_ref(), wanted.metrics_otlp)
        && !grpc(cfg.traces_otlp.as_ref(), wanted.traces_otlp)
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

/// Installs OTLP metrics (when wanted): the SDK's periodic reader over the counted exporter,
/// the SDK's when traces are off, phasetrace's own (with the exemplars of delivered traces)
/// when they are on; and its exports, by result, as a metric of its own.
pub(super) fn install_metrics(x: &mut super::Install<'_>) -> Result<(), ExportError> {
    use super::{MetricsExporter, counted, proto_metrics};
    let Some(o) = x
        .cfg
        .metrics_otlp
        .as_ref()
        .filter(|_| x.wanted.metrics_otlp)
    else {
        return Ok(());
    };
    let counts = std::sync::Arc::new(counted::ExportCounts::default());
    let inner = match x.exemplars {
        Some(store) => MetricsExporter::WithExemplars(proto_metrics::ProtoMetricExporter::new(
            o,
            x.runtime,
            store.clone(),
        )?),
        None => MetricsExporter::Sdk(metric_exporter(o, x.runtime)?),
    };
    let exporter = counted::CountedMetrics::new(inner, counts.clone(), o.endpoint.clone());
    x.otlp_reader = Some(
        opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
            .with_interval(x.cfg.metric_export_interval)
            .build(),
    );
    // `phasetrace.metric.exports`, by result, on every meter.
    let group = x.cfg.group.clone();
    x.own_metrics.push(Box::new(move |m, kept| {
        let counts = counts.clone();
        kept.push(super::OwnMetric::Counter(super::outcome_counter(
            m,
            crate::names::metric::METRIC_EXPORTS,
            crate::names::metric::UNIT_EXPORTS,
            "OTLP metrics exports, by result",
            &group,
            move |r| counts.get(r),
        )));
    }));
    // Exponential histograms are an OTLP setting: never applied to the Prometheus reader.
    x.exponential = o.histogram == crate::config::HistogramAggregation::Exponential;
    Ok(())
}

/// Installs OTLP spans (when wanted): phasetrace's own tracer provider over the counted
/// exporter.
pub(super) fn install_traces(x: &mut super::Install<'_>) -> Result<(), ExportError> {
    let Some(o) = x.cfg.traces_otlp.as_ref().filter(|_| x.wanted.traces_otlp) else {
        return Ok(());
    };
    let exporter = span_exporter(o, x.runtime)?;
    x.tracer_provider = Some(super::tracer_provider(
        x.resource.clone(),
        super::counted::Counted::new(exporter, x.span_counts.clone(), x.exemplars.clone()),
    ));
    Ok(())
}
