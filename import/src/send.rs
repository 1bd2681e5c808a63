//! Sends imported data to a collector over OTLP/gRPC or OTLP/HTTP, as the live exporter's
//! settings choose (`OTEL_EXPORTER_OTLP_PROTOCOL`, the endpoint, headers, timeout, compression
//! and CA), keeping the logs' timestamps (the SDK's exporters stamp data with the export time,
//! so they cannot).
//!
//! ```text
//! ImportedFile ──otlp::{metrics,trace}_requests──> proto messages (each ≤ max_request_bytes)
//!   grpc:          tonic clients of opentelemetry-proto ──> {endpoint} MetricsService/Export, TraceService/Export
//!   http/protobuf: protobuf body ──POST──> {endpoint}/v1/metrics, {endpoint}/v1/traces
//! ```
//!
//! Both transports send the same requests, one at a time, in order: metrics, then traces.
//! The first request that fails ends the import with [`ImportError::Send`], which says what
//! was sent before it. Points or spans that a collector answers as rejected (an OTLP partial
//! success) are counted in [`SendStats`]. OTLP/HTTP bodies are protobuf
//! (`application/x-protobuf`): every OTLP/HTTP receiver must accept it, while JSON support
//! varies (rotel's JSON decoding drops histograms, for one).

use std::fmt;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use prost::Message as _;

use super::otlp::{self, OtlpOptions, OtlpStats, RequestInfo};
use super::{ImportError, ImportedFile};
use crate::transport::{
    self, Rejected, metrics_rejected, post, request, status_text, traces_rejected,
};
use phasetrace::config::{OtlpConfig, Protocol};

/// What a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Metric data points.
    Metrics,
    /// Spans.
    Traces,
}

impl Signal {
    /// `metrics` or `traces`.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Traces => "traces",
        }
    }

    /// What its items are called: `points` or `spans`.
    pub fn items(self) -> &'static str {
        match self {
            Signal::Metrics => "points",
            Signal::Traces => "spans",
        }
    }

    /// The OTLP/HTTP path.
    fn http_path(self) -> &'static str {
        match self {
            Signal::Metrics => transport::METRICS_PATH,
            Signal::Traces => transport::TRACES_PATH,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What was sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Metric requests and their data points.
    pub metrics: OtlpStats,
    /// Trace requests and their spans.
    pub traces: OtlpStats,
    /// Data points the collector answered as rejected (OTLP partial success).
    pub rejected_points: u64,
    /// Spans the collector answered as rejected (OTLP partial success).
    pub rejected_spans: u64,
}

impl fmt::Display for SendStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} metric requests ({} points), {} trace requests ({} spans)",
            self.metrics.requests, self.metrics.items, self.traces.requests, self.traces.items
        )
    }
}

/// A request that failed, and what was sent before it.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "sending {signal} request {request} ({items} {}, {bytes} bytes of protobuf) to {target} over {protocol} failed: {detail}; sent before it: {sent}",
    signal.items()
)]
pub struct SendError {
    /// The endpoint (gRPC) or the URL posted to (HTTP).
    pub target: String,
    /// The transport.
    pub protocol: Protocol,
    /// What the request carried.
    pub signal: Signal,
    /// Its number among the requests of its signal, from 1.
    pub request: usize,
    /// Its data points or spans.
    pub items: usize,
    /// Its encoded size.
    pub bytes: usize,
    /// What went wrong (header values never appear here).
    pub detail: String,
    /// What was sent before it.
    pub sent: SendStats,
}

/// Sends requests one at a time and keeps the tally the errors report.
struct Sender<'a> {
    otlp: &'a OtlpConfig,
    stats: SendStats,
    rejections: Option<String>,
}

impl Sender<'_> {
    /// Records the outcome of request `info` of `signal` sent to `target`.
    fn record(
        &mut self,
        signal: Signal,
        target: &str,
        info: RequestInfo,
        outcome: Result<Option<Rejected>, String>,
    ) -> Result<(), ImportError> {
        match outcome {
            Ok(rejected) => {
                let s = match signal {
                    Signal::Metrics => &mut self.stats.metrics,
                    Signal::Traces => &mut self.stats.traces,
                };
                s.requests += 1;
                s.items += info.items;
                s.bytes += info.bytes as u64;
                s.largest_request_bytes = s.largest_request_bytes.max(info.bytes);
                if let Some((n, message)) = rejected {
                    match signal {
                        Signal::Metrics => self.stats.rejected_points += n,
                        Signal::Traces => self.stats.rejected_spans += n,
                    }
                    self.rejections.get_or_insert(message);
                }
                Ok(())
            }
            Err(detail) => Err(ImportError::Send(Box::new(SendError {
                target: target.to_owned(),
                protocol: self.otlp.protocol,
                signal,
                request: info.number,
                items: info.items,
                bytes: info.bytes,
                detail,
                sent: self.stats,
            }))),
        }
    }
}

/// What [`send`] returns: the tally, and the collector's first rejection message, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sent {
    /// Requests, items and rejections.
    pub stats: SendStats,
    /// The collector's message with its first partial success (rejected points or spans).
    pub rejection: Option<String>,
}

/// Sends every metric and trace request of `files` to the collector of `otlp`: over gRPC
/// (`MetricsService/Export`, `TraceService/Export` at the endpoint; port 4317 by convention)
/// or HTTP (`/v1/metrics`, `/v1/traces` under it; port 4318), as `otlp.protocol` says, with
/// its headers, timeout (per request), compression and TLS settings. Each request holds at
/// most `options.max_request_bytes` bytes of protobuf (see [`OtlpOptions`]).
pub fn send(
    files: &[ImportedFile],
    otlp: &OtlpConfig,
    options: &OtlpOptions,
) -> Result<Sent, ImportError> {
    let mut sender = Sender {
        otlp,
        stats: SendStats::default(),
        rejections: None,
    };
    match otlp.protocol {
        Protocol::Grpc => send_grpc(files, otlp, options, &mut sender)?,
        Protocol::HttpProtobuf => send_http(files, otlp, options, &mut sender)?,
    }
    Ok(Sent {
        stats: sender.stats,
        rejection: sender.rejections,
    })
}

fn client_err(otlp: &OtlpConfig, detail: impl fmt::Display) -> ImportError {
    ImportError::Client {
        endpoint: otlp.endpoint.clone(),
        protocol: otlp.protocol,
        detail: detail.to_string(),
    }
}

fn send_grpc(
    files: &[ImportedFile],
    otlp: &OtlpConfig,
    options: &OtlpOptions,
    sender: &mut Sender<'_>,
) -> Result<(), ImportError> {
    use tonic::codec::CompressionEncoding;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| client_err(otlp, e))?;
    let metadata = transport::metadata(otlp).map_err(|e| client_err(otlp, e))?;
    let channel = {
        let _guard = rt.enter();
        transport::channel(otlp).map_err(|e| client_err(otlp, e))?
    };
    let mut metrics = MetricsServiceClient::new(channel.clone());
    let mut traces = TraceServiceClient::new(channel);
    if otlp.gzip {
        metrics = metrics.send_compressed(CompressionEncoding::Gzip);
        traces = traces.send_compressed(CompressionEncoding::Gzip);
    }
    let target = otlp.endpoint.as_str();
    otlp::metrics_requests(files, options, |message, info| {
        let outcome = rt
            .block_on(metrics.export(request(message, &metadata)))
            .map(|resp| metrics_rejected(resp.get_ref()))
            .map_err(|status| status_text(&status));
        sender.record(Signal::Metrics, target, info, outcome)
    })?;
    otlp::trace_requests(files, options, |message, info| {
        let outcome = rt
            .block_on(traces.export(request(message, &metadata)))
            .map(|resp| traces_rejected(resp.get_ref()))
            .map_err(|status| status_text(&status));
        sender.record(Signal::Traces, target, info, outcome)
    })?;
    Ok(())
}

fn send_http(
    files: &[ImportedFile],
    otlp: &OtlpConfig,
    options: &OtlpOptions,
    sender: &mut Sender<'_>,
) -> Result<(), ImportError> {
    let client = transport::http_client(otlp).map_err(|e| client_err(otlp, e))?;
    let metrics_url = format!("{}{}", otlp.endpoint, Signal::Metrics.http_path());
    let traces_url = format!("{}{}", otlp.endpoint, Signal::Traces.http_path());
    otlp::metrics_requests(files, options, |message, info| {
        let outcome = post(&client, otlp, &metrics_url, message.encode_to_vec()).map(|body| {
            // An empty or undecodable success body is a full success.
            ExportMetricsServiceResponse::decode(body.as_slice())
                .ok()
                .and_then(|r| metrics_rejected(&r))
        });
        sender.record(Signal::Metrics, &metrics_url, info, outcome)
    })?;
    otlp::trace_requests(files, options, |message, info| {
        let outcome = post(&client, otlp, &traces_url, message.encode_to_vec()).map(|body| {
            ExportTraceServiceResponse::decode(body.as_slice())
                .ok()
                .and_then(|r| traces_rejected(&r))
        });
        sender.record(Signal::Traces, &traces_url, info, outcome)
    })?;
    Ok(())
}
