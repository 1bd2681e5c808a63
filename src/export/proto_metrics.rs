//! The OTLP metrics exporter used when traces are on: the SDK's collection converted to
//! opentelemetry-proto messages by opentelemetry-proto's own `transform` (resource, scope,
//! cumulative sums and histograms, exponential histograms, as the SDK's exporter sends them),
//! with the exemplars of delivered traces added to the data points of the duration histograms
//! ([`EXEMPLAR_METRICS`]), sent over the shared transport ([`super::transport`]).
//!
//! ```text
//! PeriodicReader ──ResourceMetrics──> ExportMetricsServiceRequest::from (opentelemetry-proto)
//!   + per data point of step/section/wait: every bucket's exemplar of its series (ExemplarStore)
//!   ──grpc──> MetricsServiceClient::export on the OTLP runtime (metadata, gzip, TLS; whole call
//!             within the timeout, message at most 64 KiB)
//!   ──http──> POST {endpoint}/v1/metrics (protobuf, gzip, headers, TLS, timeout; body capped)
//! ```
//!
//! It is the OTLP metrics exporter whether traces are on or not (without them the store stays
//! empty and the request is the conversion's alone), so that every export has the bounds a
//! hostile collector cannot stretch and its failures are counted by reason
//! ([`FailureCounts`]).
//!
//! The SDK's exporter cannot carry these exemplars: its data points' exemplar fields are
//! crate-private. An exemplar is in the store only once the span it names was exported
//! ([`ExemplarStore::settle`]), so a data point never links to a span the collector did not get.
//! OTLP exemplars sit on the data point (not per bucket): each bucket's latest exemplar is
//! attached, in bucket order, after any the SDK itself sampled, each built by
//! `phasetrace_encode::otlp`, the OTLP metric builder the importer's requests use.

use super::ExportError;
use super::counted::FailureCounts;
use super::exemplars::{EXEMPLAR_METRICS, Exemplar, ExemplarStore};
use super::transport::{Otlp, signal};
use crate::config::OtlpConfig;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
#[cfg(feature = "otlp-http")]
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
#[cfg(feature = "otlp-grpc")]
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::metrics::v1 as proto;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

signal!(
    /// The metrics signal: OTLP's metrics service.
    Metrics,
    "metrics",
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
    MetricsServiceClient
);

/// An OTLP metrics exporter that adds the exemplars of an [`ExemplarStore`] and counts its
/// failures by reason.
#[derive(Debug)]
pub(crate) struct ProtoMetricExporter {
    otlp: Otlp<Metrics>,
    exemplars: Arc<ExemplarStore>,
    failures: Arc<FailureCounts>,
    shut_down: AtomicBool,
}

impl ProtoMetricExporter {
    /// The exporter for `o`, counting its failures in `failures`; gRPC needs `rt`, the OTLP
    /// runtime.
    pub(crate) fn new(
        o: &OtlpConfig,
        rt: Option<&tokio::runtime::Runtime>,
        exemplars: Arc<ExemplarStore>,
        failures: Arc<FailureCounts>,
    ) -> Result<Self, ExportError> {
        Ok(ProtoMetricExporter {
            otlp: Otlp::new(o, rt)?,
            exemplars,
            failures,
            shut_down: AtomicBool::new(false),
        })
    }

    /// The request for `rm`, with the store's exemplars on the duration histograms' points.
    pub(crate) fn request(&self, rm: &ResourceMetrics) -> ExportMetricsServiceRequest {
        request_with_exemplars(rm, &self.exemplars)
    }
}

/// `rm` as opentelemetry-proto converts it, plus the exemplars of `store`.
pub(crate) fn request_with_exemplars(
    rm: &ResourceMetrics,
    store: &ExemplarStore,
) -> ExportMetricsServiceRequest {
    let mut req = ExportMetricsServiceRequest::from(rm);
    // The conversion keeps the SDK's order of scopes, metrics and data points.
    let Some(resource) = req.resource_metrics.first_mut() else {
        return req;
    };
    for (sdk_scope, scope) in rm.scope_metrics().zip(resource.scope_metrics.iter_mut()) {
        for (sdk_metric, metric) in sdk_scope.metrics().zip(scope.metrics.iter_mut()) {
            if EXEMPLAR_METRICS.contains(&sdk_metric.name()) {
                attach(store, sdk_metric, metric);
            }
        }
    }
    req
}

/// Adds every bucket's exemplar of each data point's series to the point.
fn attach(store: &ExemplarStore, sdk: &Metric, metric: &mut proto::Metric) {
    use proto::metric::Data;
    let name = sdk.name();
    let of = |attrs: Vec<&opentelemetry::KeyValue>| {
        store
            .series_of(name, attrs)
            .iter()
            .flatten()
            .map(to_proto)
            .collect::<Vec<_>>()
    };
    match (sdk.data(), metric.data.as_mut()) {
        (AggregatedMetrics::F64(MetricData::Histogram(h)), Some(Data::Histogram(p))) => {
            for (sdk_dp, dp) in h.data_points().zip(p.data_points.iter_mut()) {
                dp.exemplars.extend(of(sdk_dp.attributes().collect()));
            }
        }
        (
            AggregatedMetrics::F64(MetricData::ExponentialHistogram(h)),
            Some(Data::ExponentialHistogram(p)),
        ) => {
            for (sdk_dp, dp) in h.data_points().zip(p.data_points.iter_mut()) {
                dp.exemplars.extend(of(sdk_dp.attributes().collect()));
            }
        }
        _ => {}
    }
}

/// The exemplar as an OTLP message, by the builder the importer's requests use.
fn to_proto(e: &Exemplar) -> proto::Exemplar {
    phasetrace_encode::otlp::exemplar(
        &e.trace_id.to_bytes(),
        &e.span_id.to_bytes(),
        e.time,
        e.value,
    )
}

impl PushMetricExporter for ProtoMetricExporter {
    fn export(
        &self,
        metrics: &ResourceMetrics,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let shut = self.shut_down.load(Relaxed);
        let message = (!shut).then(|| self.request(metrics));
        async move {
            let Some(message) = message else {
                return Err(OTelSdkError::AlreadyShutdown);
            };
            match self.otlp.send(message).await {
                Ok(()) => {
                    self.failures.ok();
                    Ok(())
                }
                Err(failed) => Err(self.failures.failed(failed)),
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        if self.shut_down.swap(true, Relaxed) {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::metric;
    use opentelemetry::KeyValue;
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry::trace::{SpanId, TraceId};
    use opentelemetry_sdk::metrics::{ManualReader, SdkMeterProvider};
    use proto::metric::Data;
    use std::time::SystemTime;

    /// A collection with two series of the section histogram (explicit or exponential) and a
    /// counter.
    fn collected(exponential: bool) -> ResourceMetrics {
        let reader =
            crate::export::prometheus::PrometheusReader(Arc::new(ManualReader::builder().build()));
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.clone())
            .with_view(crate::export::view(exponential))
            .build();
        let meter = provider.meter("phasetrace");
        let h = meter
            .f64_histogram(metric::SECTION_DURATION)
            .with_unit(metric::UNIT_SECONDS)
            .with_boundaries(metric::DURATION_BOUNDARIES.to_vec())
            .build();
        for (bucket, v) in [("norm", 0.0042), ("norm", 2e-6), ("attn", 0.0042)] {
            h.record(
                v,
                &[KeyValue::new("bucket", bucket), KeyValue::new("rank", 0)],
            );
        }
        meter
            .u64_counter(metric::STEPS)
            .build()
            .add(1, &[KeyValue::new("rank", 0)]);
        let mut rm = ResourceMetrics::default();
        opentelemetry_sdk::metrics::reader::MetricReader::collect(&reader, &mut rm).unwrap();
        rm
    }

    fn exemplar(span: u64, value: f64) -> Exemplar {
        Exemplar {
            trace_id: TraceId::from(0xabc_u128),
            span_id: SpanId::from(span),
            value,
            time: SystemTime::UNIX_EPOCH + Duration::from_nanos(1_764_578_880_123_456_789),
        }
    }

    /// The exemplars of each point of the section histogram, by its `bucket` attribute.
    fn section_exemplars(req: &ExportMetricsServiceRequest) -> Vec<(String, Vec<proto::Exemplar>)> {
        let m = req.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == metric::SECTION_DURATION)
            .expect("the histogram");
        let points: Vec<(
            &[opentelemetry_proto::tonic::common::v1::KeyValue],
            &[proto::Exemplar],
        )> = match m.data.as_ref() {
            Some(Data::Histogram(h)) => h
                .data_points
                .iter()
                .map(|p| (p.attributes.as_slice(), p.exemplars.as_slice()))
                .collect(),
            Some(Data::ExponentialHistogram(h)) => h
                .data_points
                .iter()
                .map(|p| (p.attributes.as_slice(), p.exemplars.as_slice()))
                .collect(),
            other => panic!("{other:?}"),
        };
        let mut out: Vec<_> = points
            .into_iter()
            .map(|(attrs, ex)| {
                let bucket = attrs
                    .iter()
                    .find(|kv| kv.key == "bucket")
                    .and_then(|kv| kv.value.as_ref())
                    .map(|v| format!("{v:?}"))
                    .unwrap_or_default();
                (bucket, ex.to_vec())
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    #[test]
    fn each_points_series_gets_every_buckets_exemplar_and_only_delivered_ones() {
        for exponential in [false, true] {
            let store = ExemplarStore::default();
            let norm = [KeyValue::new("rank", 0), KeyValue::new("bucket", "norm")];
            store.offer(metric::SECTION_DURATION, &norm, exemplar(7, 0.0042));
            store.offer(metric::SECTION_DURATION, &norm, exemplar(8, 2e-6));
            // Never delivered: not on the wire.
            store.offer(metric::SECTION_DURATION, &norm, exemplar(9, 0.5));
            store.settle(&[SpanId::from(7), SpanId::from(8)], true);
            store.settle(&[SpanId::from(9)], false);
            let rm = collected(exponential);
            let req = request_with_exemplars(&rm, &store);
            let got = section_exemplars(&req);
            assert_eq!(got.len(), 2, "{got:?}");
            let (attn, norm) = (&got[0], &got[1]);
            assert!(attn.0.contains("attn") && attn.1.is_empty(), "{attn:?}");
            assert!(norm.0.contains("norm"), "{norm:?}");
            // Bucket order: 2 µs before 4.2 ms.
            let ids: Vec<&[u8]> = norm.1.iter().map(|e| e.span_id.as_slice()).collect();
            assert_eq!(
                ids,
                [&8u64.to_be_bytes()[..], &7u64.to_be_bytes()[..]],
                "exponential: {exponential}"
            );
            let e = &norm.1[1];
            assert_eq!(e.trace_id, 0xabc_u128.to_be_bytes().to_vec());
            assert_eq!(e.value, Some(proto::exemplar::Value::AsDouble(0.0042)));
            assert_eq!(e.time_unix_nano, 1_764_578_880_123_456_789);
            // Everything else is the conversion's: the same request as without a store entry.
            let plain = ExportMetricsServiceRequest::from(&rm);
            let mut stripped = req.clone();
            for m in &mut stripped.resource_metrics[0].scope_metrics[0].metrics {
                match m.data.as_mut() {
                    Some(Data::Histogram(h)) => {
                        h.data_points.iter_mut().for_each(|p| p.exemplars.clear())
                    }
                    Some(Data::ExponentialHistogram(h)) => {
                        h.data_points.iter_mut().for_each(|p| p.exemplars.clear())
                    }
                    _ => {}
                }
            }
            assert_eq!(stripped, plain);
        }
    }
}
