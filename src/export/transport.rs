//! The OTLP transport of the exporters built here (the live metrics exporter with exemplars,
//! [`super::proto_metrics`], and the TLS and HTTP client of the opentelemetry-otlp exporters) is
//! `phasetrace-transport`'s, the one the importer and `phasetrace check` use too; this is the
//! glue: its errors as [`ExportError`]s. What it reads of the settings is
//! [`OtlpConfig::target`] (`config/transport.rs`), the conversion the importer and `check` use.

use super::ExportError;
use crate::config::OtlpConfig;
pub(crate) use phasetrace_transport::Error;
#[cfg(feature = "otlp-grpc")]
pub(crate) use phasetrace_transport::{channel, metadata, request, status_text};
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

/// The TLS configuration of a gRPC channel to `https://` endpoints (`None` for `http://`).
#[cfg(feature = "otlp-grpc")]
pub(crate) fn tls(
    signal: &'static str,
    o: &OtlpConfig,
) -> Result<Option<tonic::transport::ClientTlsConfig>, ExportError> {
    phasetrace_transport::tls(&o.target()).map_err(|e| export_err(signal, o, e))
}
