//! The OTLP transport of requests built here (opentelemetry-proto messages), for the live metrics
//! exporter with exemplars ([`super::proto_metrics`]): a gRPC channel for the tonic clients of
//! opentelemetry-proto, and OTLP/HTTP protobuf POSTs, both with the live exporters' settings
//! (endpoint, TLS and CA, headers, gzip, timeout). The importer (`phasetrace-import`) has its own.
//!
//! ```text
//! OtlpConfig ──channel──> tonic Channel (timeout, TLS) ── MetricsServiceClient / TraceServiceClient
//!            ──metadata─> headers as gRPC metadata
//!            ──post─────> blocking reqwest POST {endpoint}/v1/{signal}: protobuf, gzip, headers
//! ```

#[cfg(feature = "otlp-http")]
use std::io::Write as _;

use super::ExportError;
use crate::config::OtlpConfig;

/// Appends the text of `source` and of its sources to `out`, each unless `out` says it already.
fn with_sources(mut out: String, mut source: Option<&dyn std::error::Error>) -> String {
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out += ": ";
            out += &text;
        }
        source = s.source();
    }
    out
}

/// The error text of `e` and its sources.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    with_sources(e.to_string(), e.source())
}

/// A gRPC status as `Code: message: sources`.
#[cfg(feature = "otlp-grpc")]
pub(crate) fn status_text(status: &tonic::Status) -> String {
    let mut out = format!("{:?}", status.code());
    if !status.message().is_empty() {
        out += ": ";
        out += status.message();
    }
    with_sources(out, std::error::Error::source(status))
}

/// A lazily connecting gRPC channel to the endpoint of `otlp`, with its timeout (per request and
/// for connecting) and TLS; call it inside the Tokio runtime that is to drive the channel. `Err`
/// says why.
#[cfg(feature = "otlp-grpc")]
pub(crate) fn channel(otlp: &OtlpConfig) -> Result<tonic::transport::Channel, String> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(otlp.endpoint.clone())
        .map_err(|e| chain(&e))?
        .timeout(otlp.timeout)
        .connect_timeout(otlp.timeout);
    if let Some(tls) = tls(otlp).map_err(|e| e.to_string())? {
        endpoint = endpoint.tls_config(tls).map_err(|e| chain(&e))?;
    }
    Ok(endpoint.connect_lazy())
}

/// `message` as a gRPC request carrying `metadata`.
#[cfg(feature = "otlp-grpc")]
pub(crate) fn request<M>(message: M, metadata: &tonic::metadata::MetadataMap) -> tonic::Request<M> {
    let mut r = tonic::Request::new(message);
    *r.metadata_mut() = metadata.clone();
    r
}

/// POSTs one protobuf body to `url` with the headers of `otlp`, gzip-compressed if it says so;
/// `Ok` holds the response body, `Err` the status or transport error (never a header value).
#[cfg(feature = "otlp-http")]
pub(crate) fn post(
    client: &reqwest::blocking::Client,
    otlp: &OtlpConfig,
    url: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let mut req = client
        .post(url)
        .header("content-type", "application/x-protobuf");
    let body = if otlp.gzip {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&body)
            .and_then(|()| gz.finish())
            .map_err(|e| format!("gzip: {e}"))?
    } else {
        body
    };
    if otlp.gzip {
        req = req.header("content-encoding", "gzip");
    }
    for (k, v) in &otlp.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    // reqwest's error text names the URL, never header values.
    let resp = req.body(body).send().map_err(|e| chain(&e))?;
    let status = resp.status();
    let bytes = resp.bytes().map(|b| b.to_vec()).unwrap_or_default();
    if status.is_success() {
        Ok(bytes)
    } else {
        let text = String::from_utf8_lossy(&bytes);
        Err(format!(
            "answered {status}: {}",
            text.chars().take(200).collect::<String>()
        ))
    }
}

/// The TLS configuration of a gRPC channel to `https://` endpoints (`None` for `http://`):
/// the system's roots plus `OTEL_EXPORTER_OTLP_CERTIFICATE`.
#[cfg(feature = "otlp-grpc")]
pub(crate) fn tls(
    o: &OtlpConfig,
) -> Result<Option<tonic::transport::ClientTlsConfig>, ExportError> {
    if !o.endpoint.starts_with("https://") {
        return Ok(None);
    }
    let mut cfg = tonic::transport::ClientTlsConfig::new().with_native_roots();
    if let Some(path) = &o.certificate {
        root_store(o)?;
        let pem = std::fs::read(path).map_err(|source| ExportError::Certificate {
            path: path.display().to_string(),
            source,
        })?;
        cfg = cfg.ca_certificate(tonic::transport::Certificate::from_pem(pem));
    }
    Ok(Some(cfg))
}

/// The system's roots plus the custom CA, if any.
pub(crate) fn root_store(o: &OtlpConfig) -> Result<rustls::RootCertStore, ExportError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped: a custom CA may be all that is needed.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = &o.certificate {
        let read_err = |detail: String| ExportError::Certificate {
            path: path.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, detail),
        };
        let pem = std::fs::read(path).map_err(|source| ExportError::Certificate {
            path: path.display().to_string(),
            source,
        })?;
        let mut n = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| read_err(format!("not a PEM certificate: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| read_err(format!("not a usable CA certificate: {e}")))?;
            n += 1;
        }
        if n == 0 {
            return Err(read_err("no PEM certificate in the file".into()));
        }
    }
    Ok(roots)
}
