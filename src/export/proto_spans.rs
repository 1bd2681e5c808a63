//! The OTLP span exporter: each batch converted to an `ExportTraceServiceRequest` by
//! opentelemetry-proto's own `transform` (as opentelemetry-otlp's exporter converts it), sent
//! over the shared transport ([`super::transport`]) with the bounds a hostile collector cannot
//! stretch: the whole exchange within the OTLP timeout, at most 64 KiB of an answer read, no
//! redirect followed; each failure counted by reason ([`FailureCounts`]).
//!
//! ```text
//! BatchSpanProcessor ──Vec<SpanData>──> group_spans_by_resource_and_scope (opentelemetry-proto)
//!   ──grpc──> TraceServiceClient::export on the OTLP runtime (metadata, gzip, TLS; whole call
//!             within the timeout, message at most 64 KiB)
//!   ──http──> POST {endpoint}/v1/traces (protobuf, gzip, headers, TLS, timeout; body capped)
//! ```

use super::ExportError;
use super::counted::FailureCounts;
use super::transport::{Otlp, signal};
use crate::config::OtlpConfig;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
#[cfg(feature = "otlp-http")]
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
#[cfg(feature = "otlp-grpc")]
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

signal!(
    /// The traces signal: OTLP's trace service.
    Traces,
    "traces",
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
    TraceServiceClient
);

/// An OTLP span exporter that counts its failures by reason.
#[derive(Debug)]
pub(crate) struct ProtoSpanExporter {
    otlp: Otlp<Traces>,
    resource: ResourceAttributesWithSchema,
    failures: Arc<FailureCounts>,
    shut_down: AtomicBool,
}

impl ProtoSpanExporter {
    /// The exporter for `o`, counting its failures in `failures`; gRPC needs `rt`, the OTLP
    /// runtime.
    pub(crate) fn new(
        o: &OtlpConfig,
        rt: Option<&tokio::runtime::Runtime>,
        failures: Arc<FailureCounts>,
    ) -> Result<Self, ExportError> {
        Ok(ProtoSpanExporter {
            otlp: Otlp::new(o, rt)?,
            resource: ResourceAttributesWithSchema::default(),
            failures,
            shut_down: AtomicBool::new(false),
        })
    }
}

impl SpanExporter for ProtoSpanExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if self.shut_down.load(Relaxed) {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        let message = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(batch, &self.resource),
        };
        match self.otlp.send(message).await {
            Ok(()) => {
                self.failures.ok();
                Ok(())
            }
            Err(failed) => Err(self.failures.failed(failed)),
        }
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        if self.shut_down.swap(true, Relaxed) {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = ResourceAttributesWithSchema::from(resource);
    }
}
