//! The importer's OTLP transport: a gRPC channel for the tonic clients of opentelemetry-proto, and
//! OTLP/HTTP protobuf POSTs, both with the live exporters' settings ([`OtlpConfig`]: endpoint, TLS
//! and CA, headers, gzip, timeout), so that an import reaches the collector a live run reaches.
//!
//! ```text
//! OtlpConfig ──channel──> tonic Channel (timeout, TLS) ── MetricsServiceClient / TraceServiceClient
//!            ──metadata─> headers as gRPC metadata
//!            ──post─────> blocking reqwest POST {endpoint}/v1/{signal}: protobuf, gzip, headers
//! ```
//!
//! The core keeps a transport of its own for its OTLP metrics exporter with exemplars; the two
//! read the same settings and share no code, because the core's is internal to its exporters.

use std::io::Write as _;

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
fn chain(e: &dyn std::error::Error) -> String {
    with_sources(e.to_string(), e.source())
}

/// A gRPC status as `Code: message: sources`.
pub(crate) fn status_text(status: &tonic::Status) -> String {
    let mut out = format!("{:?}", status.code());
    if !status.message().is_empty() {
        out += ": ";
        out += status.message();
    }
    with_sources(out, std::error::Error::source(status))
}

/// The headers of `otlp` as gRPC metadata; `Err` names the header that cannot be sent (never
/// its value).
pub(crate) fn metadata(o: &OtlpConfig) -> Result<tonic::metadata::MetadataMap, String> {
    use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
    let mut map = MetadataMap::new();
    for (k, v) in &o.headers {
        match (
            MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
            MetadataValue::try_from(v.as_str()),
        ) {
            (Ok(k), Ok(v)) => {
                map.insert(k, v);
            }
            _ => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_HEADERS: header {k:?} cannot be sent as gRPC metadata \
                     (expected a header name of letters, digits, '-', '_' or '.', not ending \
                     in -bin, and a value without control characters)"
                ));
            }
        }
    }
    Ok(map)
}

/// A lazily connecting gRPC channel to the endpoint of `otlp`, with its timeout (per request and
/// for connecting) and TLS; call it inside the Tokio runtime that is to drive the channel. `Err`
/// says why.
pub(crate) fn channel(otlp: &OtlpConfig) -> Result<tonic::transport::Channel, String> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(otlp.endpoint.clone())
        .map_err(|e| chain(&e))?
        .timeout(otlp.timeout)
        .connect_timeout(otlp.timeout);
    if let Some(tls) = tls(otlp)? {
        endpoint = endpoint.tls_config(tls).map_err(|e| chain(&e))?;
    }
    Ok(endpoint.connect_lazy())
}

/// `message` as a gRPC request carrying `metadata`.
pub(crate) fn request<M>(message: M, metadata: &tonic::metadata::MetadataMap) -> tonic::Request<M> {
    let mut r = tonic::Request::new(message);
    *r.metadata_mut() = metadata.clone();
    r
}

/// A blocking HTTP client; for `https://`, rustls (ring) trusting [`root_store`].
pub(crate) fn http_client(o: &OtlpConfig) -> Result<reqwest::blocking::Client, String> {
    // rustls with ring, configured here: reqwest is built without a default crypto provider.
    let roots = if o.endpoint.starts_with("https://") {
        root_store(o)?
    } else {
        rustls::RootCertStore::empty()
    };
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| chain(&e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::blocking::Client::builder()
        .timeout(o.timeout)
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| chain(&e))
}

/// POSTs one protobuf body to `url` with the headers of `otlp`, gzip-compressed if it says so;
/// `Ok` holds the response body, `Err` the status or transport error (never a header value).
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

/// The OTLP/HTTP path of metrics, under the endpoint.
pub(crate) const METRICS_PATH: &str = "/v1/metrics";
/// The OTLP/HTTP path of traces, under the endpoint.
pub(crate) const TRACES_PATH: &str = "/v1/traces";

/// `OTEL_EXPORTER_OTLP_CERTIFICATE=path: cannot read the CA certificate (detail)`, as the live
/// exporters word it.
fn certificate_err(path: &std::path::Path, detail: impl std::fmt::Display) -> String {
    format!(
        "{}={}: cannot read the CA certificate ({detail})",
        phasetrace_names::env::OTEL_EXPORTER_OTLP_CERTIFICATE,
        path.display()
    )
}

/// The TLS configuration of a gRPC channel to `https://` endpoints (`None` for `http://`):
/// the system's roots plus `OTEL_EXPORTER_OTLP_CERTIFICATE`.
fn tls(o: &OtlpConfig) -> Result<Option<tonic::transport::ClientTlsConfig>, String> {
    if !o.endpoint.starts_with("https://") {
        return Ok(None);
    }
    let mut cfg = tonic::transport::ClientTlsConfig::new().with_native_roots();
    if let Some(path) = &o.certificate {
        root_store(o)?;
        let pem = std::fs::read(path).map_err(|e| certificate_err(path, e))?;
        cfg = cfg.ca_certificate(tonic::transport::Certificate::from_pem(pem));
    }
    Ok(Some(cfg))
}

/// The system's roots plus the custom CA, if any.
fn root_store(o: &OtlpConfig) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped: a custom CA may be all that is needed.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = &o.certificate {
        let pem = std::fs::read(path).map_err(|e| certificate_err(path, e))?;
        let mut n = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert =
                cert.map_err(|e| certificate_err(path, format!("not a PEM certificate: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| certificate_err(path, format!("not a usable CA certificate: {e}")))?;
            n += 1;
        }
        if n == 0 {
            return Err(certificate_err(path, "no PEM certificate in the file"));
        }
    }
    Ok(roots)
}
