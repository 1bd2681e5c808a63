//! OTLP exporters over gRPC (tonic) and HTTP/protobuf (blocking reqwest).

use super::ExportError;
use crate::config::{OtlpConfig, Protocol};
use opentelemetry_otlp::{
    Compression, MetricExporter, SpanExporter, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use opentelemetry_sdk::metrics::Temporality;
use std::collections::HashMap;

fn metadata(o: &OtlpConfig) -> tonic_metadata::MetadataMap {
    let mut map = tonic_metadata::MetadataMap::new();
    for (k, v) in &o.headers {
        if let (Ok(k), Ok(v)) = (
            tonic_metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
            tonic_metadata::MetadataValue::try_from(v.as_str()),
        ) {
            map.insert(k, v);
        }
    }
    map
}

mod tonic_metadata {
    pub(super) use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
}

fn err(signal: &'static str, o: &OtlpConfig, e: impl std::fmt::Display) -> ExportError {
    ExportError::Otlp {
        signal,
        endpoint: o.endpoint.clone(),
        detail: e.to_string(),
    }
}

fn tls(o: &OtlpConfig) -> Result<Option<tonic::transport::ClientTlsConfig>, ExportError> {
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

/// A blocking HTTP client; for `https://`, rustls (ring) trusting [`root_store`].
pub(crate) fn http_client(
    signal: &'static str,
    o: &OtlpConfig,
) -> Result<reqwest::blocking::Client, ExportError> {
    // rustls with ring, configured here: reqwest is built without a default crypto provider.
    let roots = if o.endpoint.starts_with("https://") {
        root_store(o)?
    } else {
        rustls::RootCertStore::empty()
    };
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(signal, o, e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let b = reqwest::blocking::Client::builder()
        .timeout(o.timeout)
        .tls_backend_preconfigured(tls);
    b.build().map_err(|e| err(signal, o, e))
}

pub(super) fn span_exporter(
    o: &OtlpConfig,
    rt: Option<&tokio::runtime::Runtime>,
) -> Result<SpanExporter, ExportError> {
    match o.protocol {
        Protocol::Grpc => {
            let _guard = rt.map(|r| r.enter());
            let mut b = SpanExporter::builder()
                .with_tonic()
                .with_endpoint(o.endpoint.clone())
                .with_timeout(o.timeout)
                .with_metadata(metadata(o));
            if o.gzip {
                b = b.with_compression(Compression::Gzip);
            }
            if let Some(t) = tls(o)? {
                b = b.with_tls_config(t);
            }
            b.build().map_err(|e| err("traces", o, e))
        }
        Protocol::HttpProtobuf => {
            let mut b = SpanExporter::builder()
                .with_http()
                .with_http_client(http_client("traces", o)?)
                .with_endpoint(format!("{}/v1/traces", o.endpoint))
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
    match o.protocol {
        Protocol::Grpc => {
            let _guard = rt.map(|r| r.enter());
            let mut b = MetricExporter::builder()
                .with_tonic()
                .with_endpoint(o.endpoint.clone())
                .with_timeout(o.timeout)
                .with_metadata(metadata(o))
                .with_temporality(Temporality::Cumulative);
            if o.gzip {
                b = b.with_compression(Compression::Gzip);
            }
            if let Some(t) = tls(o)? {
                b = b.with_tls_config(t);
            }
            b.build().map_err(|e| err("metrics", o, e))
        }
        Protocol::HttpProtobuf => {
            let mut b = MetricExporter::builder()
                .with_http()
                .with_http_client(http_client("metrics", o)?)
                .with_endpoint(format!("{}/v1/metrics", o.endpoint))
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
