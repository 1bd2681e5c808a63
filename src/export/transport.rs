//! The OTLP transport of the exporters built here ([`super::proto_metrics`],
//! [`super::proto_spans`]) is
//! `phasetrace-transport`'s, the one the importer and `phasetrace check` use too; this is the
//! glue: its errors as [`ExportError`]s, and one bounded exchange per export ([`grpc_call`],
//! [`http_call`]) that says why it failed ([`Failure`]). What it reads of the settings is
//! [`OtlpConfig::target`] (`config/transport.rs`), the conversion the importer and `check` use.

use super::ExportError;
use crate::config::OtlpConfig;
pub(crate) use phasetrace_transport::{Error, Failure};
#[cfg(feature = "otlp-grpc")]
pub(crate) use phasetrace_transport::{channel, metadata, request, status_failure, status_text};
#[cfg(feature = "otlp-http")]
pub(crate) use phasetrace_transport::{http_client, post};

/// `e` as the error of exporting `signal` to `o`: an unreadable CA keeps its own variant.
pub(crate) fn export_err(signal: &'static str, o: &OtlpConfig, e: Error) -> ExportError {
    match e {
        Error::Certificate { path, source, .. } => ExportError::Certificate {
            var: o.certificate_var(),
            path: path.display().to_string(),
            source,
        },
        other => ExportError::Otlp {
            signal,
            var: o.endpoint_var(),
            endpoint: o.endpoint.clone(),
            detail: other.to_string(),
        },
    }
}

/// A blocking HTTP client for `o` (see [`phasetrace_transport::http_client`]).
#[cfg(feature = "otlp-http")]
pub(crate) fn client(
    signal: &'static str,
    o: &OtlpConfig,
) -> Result<reqwest::blocking::Client, ExportError> {
    http_client(&o.target()).map_err(|e| export_err(signal, o, e))
}

/// Why an export failed, and what was said (the error's text, never a header value).
pub(crate) type Failed = (Failure, String);

/// One gRPC call on the OTLP runtime, bounded as a whole (head and message) by `timeout`:
/// tonic's own timeout ends at the response's head.
#[cfg(feature = "otlp-grpc")]
pub(crate) async fn grpc_call<T, F>(
    runtime: &tokio::runtime::Handle,
    timeout: std::time::Duration,
    call: F,
) -> Result<T, Failed>
where
    F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
    T: Send + 'static,
{
    // On the OTLP runtime: the timer and the channel need its reactor; the caller only waits.
    let task = runtime.spawn(phasetrace_transport::within(timeout, call));
    match task.await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(status)) => Err((status_failure(&status), status_text(&status))),
        Err(e) => Err((Failure::Other, format!("the export task failed: {e}"))),
    }
}

/// One OTLP/HTTP POST of `body` to `url` (the client's timeout bounds it, the answer read up to
/// [`phasetrace_transport::MAX_RESPONSE_BYTES`]); a 2xx answer must decode as `R`, the
/// signal's OTLP response.
#[cfg(feature = "otlp-http")]
pub(crate) fn http_call<R: prost::Message + Default>(
    client: &reqwest::blocking::Client,
    o: &OtlpConfig,
    url: &str,
    body: Vec<u8>,
) -> Result<R, Failed> {
    let bytes = post(client, &o.target(), url, body).map_err(|e| (e.failure(), e.to_string()))?;
    R::decode(bytes.as_slice()).map_err(|e| {
        (
            Failure::BadResponse,
            format!("answered 2xx with a body that is not an OTLP response ({e})"),
        )
    })
}
