//! The OTLP transport that phasetrace's own exporters, its importer (`phasetrace-import`) and
//! `phasetrace check` share, so that each reaches a collector the same way: a gRPC channel for
//! the tonic clients of `opentelemetry-proto` (feature `grpc`), OTLP/HTTP protobuf POSTs
//! (feature `http`), and the TLS roots they trust, all from one [`Target`] (the settings of the
//! OTLP exporters: endpoint, headers, timeout, gzip, custom CA).
//!
//! ```text
//! Target ──root_store──> the system's roots + OTEL_EXPORTER_OTLP_CERTIFICATE
//!        ──channel─────> tonic Channel (timeout, TLS) ── MetricsServiceClient / TraceServiceClient
//!        ──metadata────> headers as gRPC metadata
//!        ──http_client─> blocking reqwest client (timeout, rustls with ring)
//!        ──post────────> POST {endpoint}/v1/{signal}: protobuf, gzip, headers
//! ```
//!
//! Error texts never hold a header value (headers carry API keys).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The OTLP/HTTP path of metrics, under the endpoint.
pub const METRICS_PATH: &str = "/v1/metrics";
/// The OTLP/HTTP path of traces, under the endpoint.
pub const TRACES_PATH: &str = "/v1/traces";

/// Where and how to send: the OTLP exporter settings that the transport reads.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    /// `http(s)://host:port` (gRPC) or the whole URL (HTTP).
    pub endpoint: &'a str,
    /// Request headers (values are never printed).
    pub headers: &'a [(String, String)],
    /// Per request, and for connecting.
    pub timeout: Duration,
    /// gzip request bodies.
    pub gzip: bool,
    /// A custom CA (PEM) trusted beside the system's roots, for `https://` endpoints.
    pub certificate: Option<&'a Path>,
    /// The variable the headers came from (`OTEL_EXPORTER_OTLP_HEADERS`, or a signal's own),
    /// as errors about them say.
    pub headers_var: &'a str,
    /// The variable the custom CA came from (`OTEL_EXPORTER_OTLP_CERTIFICATE`, or a signal's
    /// own), as errors about it say.
    pub certificate_var: &'a str,
}

impl std::fmt::Debug for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values are secrets: their names only.
        let headers: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Target")
            .field("endpoint", &self.endpoint)
            .field("headers", &headers)
            .field("timeout", &self.timeout)
            .field("gzip", &self.gzip)
            .field("certificate", &self.certificate)
            .field("headers_var", &self.headers_var)
            .field("certificate_var", &self.certificate_var)
            .finish()
    }
}

impl Target<'_> {
    /// Whether the endpoint is `https://` (the gRPC channel and the HTTP client ask).
    #[cfg(any(feature = "grpc", feature = "http"))]
    fn https(&self) -> bool {
        self.endpoint.starts_with("https://")
    }
}

/// Why the transport could not be set up or a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The custom CA could not be read or used.
    #[error("{var}={}: cannot read the CA certificate ({source})", path.display())]
    Certificate {
        /// The variable that named the file.
        var: String,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A header cannot be sent as gRPC metadata (its name only: never its value).
    #[error(
        "{var}: header {name:?} cannot be sent as gRPC metadata (expected a header name of \
         letters, digits, '-', '_' or '.', not ending in -bin, and a value without control \
         characters)"
    )]
    Header {
        /// The variable that held the headers.
        var: String,
        /// The header's name.
        name: String,
    },
    /// The client, the channel or the request failed: the text of the error and its sources.
    #[error("{0}")]
    Request(String),
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

/// The error text of `e` and its sources, each said once.
pub fn chain(e: &dyn std::error::Error) -> String {
    with_sources(e.to_string(), e.source())
}

fn request_err(e: &dyn std::error::Error) -> Error {
    Error::Request(chain(e))
}

/// The roots an OTLP client trusts: the system's plus the custom CA of `t`, if any.
pub fn root_store(t: &Target<'_>) -> Result<rustls::RootCertStore, Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped: a custom CA may be all that is needed.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = t.certificate {
        let invalid = |detail: String| Error::Certificate {
            var: t.certificate_var.to_owned(),
            path: path.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, detail),
        };
        let pem = std::fs::read(path).map_err(|source| Error::Certificate {
            var: t.certificate_var.to_owned(),
            path: path.to_owned(),
            source,
        })?;
        let mut n = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| invalid(format!("not a PEM certificate: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| invalid(format!("not a usable CA certificate: {e}")))?;
            n += 1;
        }
        if n == 0 {
            return Err(invalid("no PEM certificate in the file".into()));
        }
    }
    Ok(roots)
}

/// A rustls client configuration (ring) trusting `roots`.
pub fn client_config(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig, Error> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| request_err(&e))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(feature = "grpc")]
mod grpc {
    use super::{Error, Target, request_err, root_store, with_sources};
    use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};

    /// A gRPC status as `Code: message: sources`.
    pub fn status_text(status: &tonic::Status) -> String {
        let mut out = format!("{:?}", status.code());
        if !status.message().is_empty() {
            out += ": ";
            out += status.message();
        }
        with_sources(out, std::error::Error::source(status))
    }

    /// The TLS configuration of a gRPC channel to an `https://` endpoint (`None` for
    /// `http://`): the system's roots plus the custom CA.
    pub fn tls(t: &Target<'_>) -> Result<Option<tonic::transport::ClientTlsConfig>, Error> {
        if !t.https() {
            return Ok(None);
        }
        let mut cfg = tonic::transport::ClientTlsConfig::new().with_native_roots();
        if let Some(path) = t.certificate {
            // Read through the root store first: it says what is wrong with the file.
            root_store(t)?;
            let pem = std::fs::read(path).map_err(|source| Error::Certificate {
                var: t.certificate_var.to_owned(),
                path: path.to_owned(),
                source,
            })?;
            cfg = cfg.ca_certificate(tonic::transport::Certificate::from_pem(pem));
        }
        Ok(Some(cfg))
    }

    /// A lazily connecting gRPC channel to the endpoint of `t`, with its timeout (per request
    /// and for connecting) and TLS; call it inside the Tokio runtime that is to drive it.
    pub fn channel(t: &Target<'_>) -> Result<tonic::transport::Channel, Error> {
        let mut endpoint = tonic::transport::Endpoint::from_shared(t.endpoint.to_owned())
            .map_err(|e| request_err(&e))?
            .timeout(t.timeout)
            .connect_timeout(t.timeout);
        if let Some(tls) = tls(t)? {
            endpoint = endpoint.tls_config(tls).map_err(|e| request_err(&e))?;
        }
        Ok(endpoint.connect_lazy())
    }

    /// The headers of `t` as gRPC metadata; the error names the first header that cannot be
    /// one (never its value).
    pub fn metadata(t: &Target<'_>) -> Result<MetadataMap, Error> {
        let mut map = MetadataMap::new();
        for (k, v) in t.headers {
            match (
                MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
                MetadataValue::try_from(v.as_str()),
            ) {
                (Ok(k), Ok(v)) => {
                    map.insert(k, v);
                }
                _ => {
                    return Err(Error::Header {
                        var: t.headers_var.to_owned(),
                        name: k.clone(),
                    });
                }
            }
        }
        Ok(map)
    }

    /// `message` as a gRPC request carrying `metadata`.
    pub fn request<M>(message: M, metadata: &MetadataMap) -> tonic::Request<M> {
        let mut r = tonic::Request::new(message);
        *r.metadata_mut() = metadata.clone();
        r
    }
}
#[cfg(feature = "grpc")]
pub use grpc::{channel, metadata, request, status_text, tls};

#[cfg(feature = "http")]
mod http {
    use super::{Error, Target, client_config, request_err, root_store};
    use std::io::Write as _;

    /// A blocking HTTP client with the timeout of `t`; for `https://`, rustls (ring) trusting
    /// [`root_store`] (reqwest is built without a default crypto provider).
    pub fn http_client(t: &Target<'_>) -> Result<reqwest::blocking::Client, Error> {
        let roots = if t.https() {
            root_store(t)?
        } else {
            rustls::RootCertStore::empty()
        };
        reqwest::blocking::Client::builder()
            .timeout(t.timeout)
            .tls_backend_preconfigured(client_config(roots)?)
            .build()
            .map_err(|e| request_err(&e))
    }

    /// POSTs one protobuf body to `url` with the headers of `t`, gzip-compressed if it says so;
    /// `Ok` holds the response body, `Err` the status or transport error (never a header value).
    pub fn post(
        client: &reqwest::blocking::Client,
        t: &Target<'_>,
        url: &str,
        body: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let mut req = client
            .post(url)
            .header("content-type", "application/x-protobuf");
        let body = if t.gzip {
            req = req.header("content-encoding", "gzip");
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(&body)
                .and_then(|()| gz.finish())
                .map_err(|e| Error::Request(format!("gzip: {e}")))?
        } else {
            body
        };
        for (k, v) in t.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        // reqwest's error text names the URL, never header values.
        let resp = req.body(body).send().map_err(|e| request_err(&e))?;
        let status = resp.status();
        let bytes = resp.bytes().map(|b| b.to_vec()).unwrap_or_default();
        if status.is_success() {
            Ok(bytes)
        } else {
            let text = String::from_utf8_lossy(&bytes);
            Err(Error::Request(format!(
                "answered {status}: {}",
                text.chars().take(200).collect::<String>()
            )))
        }
    }
}
#[cfg(feature = "http")]
pub use http::{http_client, post};

#[cfg(test)]
mod tests {
    use super::*;

    fn target(certificate: Option<&Path>) -> Target<'_> {
        Target {
            endpoint: "https://127.0.0.1:4317",
            headers: &[],
            timeout: Duration::from_secs(1),
            gzip: false,
            certificate,
            headers_var: "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            certificate_var: "OTEL_EXPORTER_OTLP_CERTIFICATE",
        }
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_an_error_naming_the_variable_and_the_file() {
        let dir = std::env::temp_dir().join(format!("phasetrace-transport-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let e = root_store(&target(Some(&missing))).unwrap_err().to_string();
        assert!(e.starts_with("OTEL_EXPORTER_OTLP_CERTIFICATE="), "{e}");
        assert!(
            e.contains("missing.pem: cannot read the CA certificate"),
            "{e}"
        );
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = root_store(&target(Some(&empty))).unwrap_err().to_string();
        assert!(e.contains("no PEM certificate in the file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn headers_become_metadata_or_an_error_naming_the_header_not_its_value() {
        let of = |headers: &[(&str, &str)]| -> Vec<(String, String)> {
            headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let good = of(&[("X-Api-Key", "s3cret"), ("team", "café")]);
        let md = metadata(&Target {
            headers: &good,
            ..target(None)
        })
        .expect("metadata");
        assert_eq!(
            md.get("x-api-key").and_then(|v| v.to_str().ok()),
            Some("s3cret")
        );
        assert_eq!(md.len(), 2);
        for bad in [
            ("x-token-bin", "s3cret"),
            ("x-api-key", "s3\ncret"),
            ("bad header", "s3"),
        ] {
            let headers = of(&[("ok", "1"), bad]);
            let e = metadata(&Target {
                headers: &headers,
                ..target(None)
            })
            .expect_err("refused")
            .to_string();
            assert!(e.starts_with("OTEL_EXPORTER_OTLP_TRACES_HEADERS: "), "{e}");
            assert!(e.contains(&format!("{:?}", bad.0)), "{e}");
            assert!(!e.contains("s3"), "{e}");
        }
    }
}
