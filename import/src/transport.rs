//! The importer's OTLP transport is `phasetrace-transport`'s, the one the live exporters use, read
//! from the same settings ([`OtlpConfig`]: endpoint, TLS and CA, headers, gzip, timeout), so that an
//! import reaches the collector a live run reaches; this adds what the importer reads of the
//! answers (partial successes).
//!
//! ```text
//! OtlpConfig ──OtlpConfig::target──> phasetrace_transport::Target ──> channel, metadata, http_client, post
//! ```

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use phasetrace::config::OtlpConfig;

/// A partial success: how many items the collector rejected, and why.
pub(crate) type Rejected = (u64, String);

fn rejected_of(count: i64, message: &str) -> Option<Rejected> {
    (count > 0 || !message.is_empty()).then(|| (count.max(0) as u64, message.to_owned()))
}

/// The rejected data points of a metrics response, if any.
pub(crate) fn metrics_rejected(resp: &ExportMetricsServiceResponse) -> Option<Rejected> {
    let p = resp.partial_success.as_ref()?;
    rejected_of(p.rejected_data_points, &p.error_message)
}

/// The rejected spans of a traces response, if any.
pub(crate) fn traces_rejected(resp: &ExportTraceServiceResponse) -> Option<Rejected> {
    let p = resp.partial_success.as_ref()?;
    rejected_of(p.rejected_spans, &p.error_message)
}

use phasetrace_transport::Error;
pub(crate) use phasetrace_transport::{METRICS_PATH, TRACES_PATH, request, status_text};

/// The headers of `o` as gRPC metadata.
pub(crate) fn metadata(o: &OtlpConfig) -> Result<tonic::metadata::MetadataMap, Error> {
    phasetrace_transport::metadata(&o.target())
}

/// A lazily connecting gRPC channel to `o`; call it inside the runtime that drives it.
pub(crate) fn channel(o: &OtlpConfig) -> Result<tonic::transport::Channel, Error> {
    phasetrace_transport::channel(&o.target())
}

/// A blocking HTTP client for `o`.
pub(crate) fn http_client(o: &OtlpConfig) -> Result<reqwest::blocking::Client, Error> {
    phasetrace_transport::http_client(&o.target())
}

/// POSTs one protobuf body to `url` with the headers of `o`; `Err` says why (never a header
/// value).
pub(crate) fn post(
    client: &reqwest::blocking::Client,
    o: &OtlpConfig,
    url: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, String> {
    phasetrace_transport::post(client, &o.target(), url, body).map_err(|e| e.to_string())
}
