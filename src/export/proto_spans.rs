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
use super::transport;
use crate::config::{OtlpConfig, Protocol};
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
#[cfg(feature = "otlp-http")]
use prost::Message as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

enum Transport {
    #[cfg(feature = "otlp-grpc")]
    Grpc {
        client: TraceServiceClient<tonic::transport::Channel>,
        metadata: Box<tonic::metadata::MetadataMap>,
        /// The OTLP runtime, which drives the channel and each export.
        runtime: tokio::runtime::Handle,
    },
    #[cfg(feature = "otlp-http")]
    Http {
        client: reqwest::blocking::Client,
        url: String,
    },
}

/// An OTLP span exporter that counts its failures by reason.
pub(crate) struct ProtoSpanExporter {
    transport: Transport,
    otlp: OtlpConfig,
    resource: ResourceAttributesWithSchema,
    failures: Arc<FailureCounts>,
    shut_down: AtomicBool,
}

impl std::fmt::Debug for ProtoSpanExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtoSpanExporter")
            .field("protocol", &self.otlp.protocol)
            .field("endpoint", &self.otlp.endpoint)
            .finish()
    }
}

fn err(o: &OtlpConfig, detail: impl std::fmt::Display) -> ExportError {
    ExportError::Otlp {
        signal: "traces",
        var: o.endpoint_var(),
        endpoint: o.endpoint.clone(),
        detail: detail.to_string(),
    }
}

impl ProtoSpanExporter {
    /// The exporter for `o`, counting its failures in `failures`; gRPC needs `rt`, the OTLP
    /// runtime.
    pub(crate) fn new(
        o: &OtlpConfig,
        rt: Option<&tokio::runtime::Runtime>,
        failures: Arc<FailureCounts>,
    ) -> Result<Self, ExportError> {
        let _ = &rt;
        let transport = match (o.protocol, rt) {
            #[cfg(feature = "otlp-grpc")]
            (Protocol::Grpc, Some(rt)) => {
                let channel = {
                    let _guard = rt.enter();
                    transport::channel(&o.target())
                        .map_err(|e| transport::export_err("traces", o, e))?
                };
                let mut client = TraceServiceClient::new(channel)
                    .max_decoding_message_size(phasetrace_transport::MAX_RESPONSE_BYTES);
                if o.gzip {
                    client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                Transport::Grpc {
                    client,
                    metadata: Box::new(transport::metadata(&o.target()).map_err(|e| err(o, e))?),
                    runtime: rt.handle().clone(),
                }
            }
            #[cfg(feature = "otlp-grpc")]
            (Protocol::Grpc, None) => return Err(err(o, "no runtime for the gRPC channel")),
            #[cfg(feature = "otlp-http")]
            (Protocol::HttpProtobuf, _) => Transport::Http {
                client: transport::client("traces", o)?,
                url: o.endpoint.clone(),
            },
            #[allow(unreachable_patterns)]
            (p, _) => {
                return Err(err(
                    o,
                    format!("this build of phasetrace has no OTLP {p} exporter"),
                ));
            }
        };
        Ok(ProtoSpanExporter {
            transport,
            otlp: o.clone(),
            resource: ResourceAttributesWithSchema::default(),
            failures,
            shut_down: AtomicBool::new(false),
        })
    }

    async fn send(&self, message: ExportTraceServiceRequest) -> Result<(), transport::Failed> {
        match &self.transport {
            #[cfg(feature = "otlp-grpc")]
            Transport::Grpc {
                client,
                metadata,
                runtime,
            } => {
                let mut client = client.clone();
                let req = transport::request(message, metadata);
                transport::grpc_call(runtime, self.otlp.timeout, async move {
                    client.export(req).await
                })
                .await
                .map(drop)
            }
            #[cfg(feature = "otlp-http")]
            Transport::Http { client, url } => transport::http_call::<ExportTraceServiceResponse>(
                client,
                &self.otlp,
                url,
                message.encode_to_vec(),
            )
            .map(drop),
        }
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
        match self.send(message).await {
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
