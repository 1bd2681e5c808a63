//! OTLP exporters over gRPC (tonic) and HTTP/protobuf (blocking reqwest).

use super::ExportError;
#[cfg(feature = "otlp-http")]
use super::transport::root_store;
#[cfg(feature = "otlp-grpc")]
use super::transport::tls;
use crate::config::{OtlpConfig, Protocol};
#[cfg(feature = "otlp-http")]
use opentelemetry_otlp::WithHttpConfig;
#[cfg(feature = "otlp-grpc")]
use opentelemetry_otlp::WithTonicConfig;
use opentelemetry_otlp::{Compression, MetricExporter, SpanExporter, WithExportConfig};
use opentelemetry_sdk::metrics::Temporality;
#[cfg(feature = "otlp-http")]
use std::collections::HashMap;

/// `OTEL_EXPORTER_OTLP_HEADERS` as gRPC metadata; `Err` names the first header that cannot be
/// one (never its value).
#[cfg(feature = "otlp-grpc")]
pub(crate) fn metadata(o: &OtlpConfig) -> Result<tonic_metadata::MetadataMap, String> {
    let mut map = tonic_metadata::MetadataMap::new();
    for (k, v) in &o.headers {
        match (
            tonic_metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
            tonic_metadata::MetadataValue::try_from(v.as_str()),
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

#[cfg(feature = "otlp-grpc")]
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

/// A protocol this build has no exporter for (refused earlier, by the configuration).
#[allow(dead_code)]
fn not_compiled(signal: &'static str, o: &OtlpConfig) -> ExportError {
    err(
        signal,
        o,
        format!(
            "this build of phasetrace has no OTLP {} exporter",
            o.protocol
        ),
    )
}

/// A blocking HTTP client; for `https://`, rustls (ring) trusting [`root_store`].
#[cfg(feature = "otlp-http")]
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
    let _ = &rt;
    match o.protocol {
        #[cfg(not(feature = "otlp-grpc"))]
        Protocol::Grpc => Err(not_compiled("traces", o)),
        #[cfg(not(feature = "otlp-http"))]
        Protocol::HttpProtobuf => Err(not_compiled("traces", o)),
        #[cfg(feature = "otlp-grpc")]
        Protocol::Grpc => {
            let _guard = rt.map(|r| r.enter());
            let mut b = SpanExporter::builder()
                .with_tonic()
                .with_endpoint(o.endpoint.clone())
                .with_timeout(o.timeout)
                .with_metadata(metadata(o).map_err(|e| err("traces", o, e))?);
            if o.gzip {
                b = b.with_compression(Compression::Gzip);
            }
            if let Some(t) = tls(o)? {
                b = b.with_tls_config(t);
            }
            b.build().map_err(|e| err("traces", o, e))
        }
        #[cfg(feature = "otlp-http")]
        Protocol::HttpProtobuf => {
            let mut b = SpanExporter::builder()
                .with_http()
                .with_http_client(http_client("traces", o)?)
                .with_endpoint(o.endpoint.clone())
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
    let _ = &rt;
    match o.protocol {
        #[cfg(not(feature = "otlp-grpc"))]
        Protocol::Grpc => Err(not_compiled("metrics", o)),
        #[cfg(not(feature = "otlp-http"))]
        Protocol::HttpProtobuf => Err(not_compiled("metrics", o)),
        #[cfg(feature = "otlp-grpc")]
        Protocol::Grpc => {
            let _guard = rt.map(|r| r.enter());
            let mut b = MetricExporter::builder()
                .with_tonic()
                .with_endpoint(o.endpoint.clone())
                .with_timeout(o.timeout)
                .with_metadata(metadata(o).map_err(|e| err("metrics", o, e))?)
                .with_temporality(Temporality::Cumulative);
            if o.gzip {
                b = b.with_compression(Compression::Gzip);
            }
            if let Some(t) = tls(o)? {
                b = b.with_tls_config(t);
            }
            b.build().map_err(|e| err("metrics", o, e))
        }
        #[cfg(feature = "otlp-http")]
        Protocol::HttpProtobuf => {
            let mut b = MetricExporter::builder()
                .with_http()
                .with_http_client(http_client("metrics", o)?)
                .with_endpoint(o.endpoint.clone())
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

#[cfg(all(test, feature = "otlp-grpc"))]
mod tests {
    use super::*;
    use crate::config::HistogramAggregation;
    use std::time::Duration;

    fn with_headers(headers: &[(&str, &str)]) -> OtlpConfig {
        OtlpConfig {
            endpoint: "http://127.0.0.1:4317".into(),
            protocol: Protocol::Grpc,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            timeout: Duration::from_secs(1),
            gzip: false,
            certificate: None,
            histogram: HistogramAggregation::Explicit,
        }
    }

    #[test]
    fn headers_become_metadata_or_an_error_naming_the_header_not_its_value() {
        let md = metadata(&with_headers(&[("X-Api-Key", "s3cret"), ("team", "café")]))
            .expect("metadata");
        assert_eq!(
            md.get("x-api-key").and_then(|v| v.to_str().ok()),
            Some("s3cret")
        );
        assert_eq!(md.len(), 2);
        for bad in [("x-token-bin", "s3cret"), ("x-api-key", "s3\ncret")] {
            let e = metadata(&with_headers(&[("ok", "1"), bad])).expect_err("refused");
            assert!(e.contains(&format!("{:?}", bad.0)), "{e}");
            assert!(!e.contains("s3"), "{e}");
        }
    }
}
