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
//!        ──http_client─> blocking reqwest client (timeout, rustls with ring, no redirects)
//!        ──post────────> POST {endpoint}/v1/{signal}: protobuf, gzip, headers; the answer read
//!                        up to MAX_RESPONSE_BYTES
//! ```
//!
//! Error texts never hold a header value (headers carry API keys). A failed request says why
//! as a [`Failure`] ([`Error::failure`]): a collector that answers slowly, hugely, with garbage
//! or a redirect costs at most the timeout and [`MAX_RESPONSE_BYTES`] of memory.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The OTLP/HTTP path of metrics, under the endpoint.
pub const METRICS_PATH: &str = "/v1/metrics";
/// The OTLP/HTTP path of traces, under the endpoint.
pub const TRACES_PATH: &str = "/v1/traces";

/// The most of an answer read (HTTP body or gRPC message): an OTLP answer is a few bytes (a
/// partial-success count and message); beyond this the connection is dropped and the request
/// fails with [`Failure::ResponseTooLarge`].
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Why an export failed: the `reason` attribute of `phasetrace.otlp.export.failures`
/// (`phasetrace_names::export_failure`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Failure {
    /// Not over within the timeout.
    Timeout,
    /// No connection (refused, unreachable, closed early).
    Connect,
    /// The TLS handshake failed.
    Tls,
    /// A redirect (3xx): never followed.
    Redirect,
    /// An answer over [`MAX_RESPONSE_BYTES`].
    ResponseTooLarge,
    /// An answer that is not OTLP (not protobuf, not HTTP/2).
    BadResponse,
    /// An error status (HTTP 4xx/5xx, a gRPC error code).
    Rejected,
    /// Anything else.
    Other,
}

impl Failure {
    /// Every reason, in the order of `phasetrace_names::export_failure::ALL`.
    pub const ALL: [Failure; 8] = [
        Failure::Timeout,
        Failure::Connect,
        Failure::Tls,
        Failure::Redirect,
        Failure::ResponseTooLarge,
        Failure::BadResponse,
        Failure::Rejected,
        Failure::Other,
    ];

    /// The `reason` attribute value.
    pub const fn as_str(self) -> &'static str {
        use phasetrace_names::export_failure as n;
        match self {
            Failure::Timeout => n::TIMEOUT,
            Failure::Connect => n::CONNECT,
            Failure::Tls => n::TLS,
            Failure::Redirect => n::REDIRECT,
            Failure::ResponseTooLarge => n::RESPONSE_TOO_LARGE,
            Failure::BadResponse => n::BAD_RESPONSE,
            Failure::Rejected => n::REJECTED,
            Failure::Other => n::OTHER,
        }
    }

    /// The reason an HTTP status gives, `None` for a success.
    pub fn of_status(status: u16) -> Option<Failure> {
        match status {
            200..=299 => None,
            300..=399 => Some(Failure::Redirect),
            _ => Some(Failure::Rejected),
        }
    }

    /// The reason an error text says (an error and its sources, [`chain`]); for errors whose
    /// type says less than their text (a connect error that is a TLS one, an I/O error that is
    /// a timeout).
    pub fn of_text(text: &str) -> Failure {
        let t = text.to_ascii_lowercase();
        let any = |words: &[&str]| words.iter().any(|w| t.contains(w));
        if any(&["timed out", "timeout", "deadline"]) {
            Failure::Timeout
        } else if any(&["certificate", "tls", "handshake", "alert"]) {
            Failure::Tls
        } else if any(&["too large", "message length"]) {
            Failure::ResponseTooLarge
        } else if any(&[
            "h2 protocol",
            "protocol error",
            "frame",
            "decode",
            "invalid http",
            "invalid status",
            "parse",
            "unexpected",
        ]) {
            Failure::BadResponse
        } else if any(&[
            "connect",
            "connection refused",
            "connection reset",
            "broken pipe",
            "unreachable",
            "closed",
        ]) {
            Failure::Connect
        } else {
            Failure::Other
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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
    /// A request failed for `reason`: what was said, and why.
    #[error("{detail}")]
    Export {
        /// Why, as counted.
        reason: Failure,
        /// The text of the error and its sources (never a header value).
        detail: String,
    },
}

impl Error {
    /// Why the request failed, as counted: the reason of [`Error::Export`], else what the text
    /// says.
    pub fn failure(&self) -> Failure {
        match self {
            Error::Export { reason, .. } => *reason,
            Error::Certificate { .. } => Failure::Tls,
            Error::Header { .. } => Failure::Other,
            Error::Request(text) => Failure::of_text(text),
        }
    }
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
    use super::{Error, Failure, Target, request_err, root_store, with_sources};
    use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};

    /// Why a gRPC call failed: its code where it says (a deadline, a message over the client's
    /// limit), else the text of the status and its sources (TLS, connect, a broken HTTP/2
    /// answer); any other code is the server's refusal.
    pub fn status_failure(status: &tonic::Status) -> Failure {
        use tonic::Code;
        match status.code() {
            // tonic's own timeout is `Cancelled` ("Timeout expired"); a connection closed
            // under a call is `Cancelled` too, and says so.
            Code::DeadlineExceeded => return Failure::Timeout,
            Code::OutOfRange if status.message().contains("too large") => {
                return Failure::ResponseTooLarge;
            }
            _ => {}
        }
        let text = status_text(status);
        let local = std::error::Error::source(status).is_some()
            || status.message().contains("decode")
            || status.message().contains("h2 protocol");
        match Failure::of_text(&text) {
            Failure::Other if !local => Failure::Rejected,
            r => r,
        }
    }

    /// `fut` (a gRPC call), failed with [`tonic::Code::DeadlineExceeded`] once `timeout` has
    /// passed: tonic's own timeout ends at the response's head, not its body; this bounds the
    /// whole call. Call it on the runtime that drives the channel.
    pub async fn within<T>(
        timeout: std::time::Duration,
        fut: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no whole answer within the timeout ({timeout:?})"
            ))),
        }
    }

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
pub use grpc::{channel, metadata, request, status_failure, status_text, tls, within};

#[cfg(feature = "http")]
mod http {
    use super::{
        Error, Failure, MAX_RESPONSE_BYTES, Target, client_config, request_err, root_store,
    };
    use std::io::Write as _;
    use std::time::Instant;

    /// A blocking HTTP client with the timeout of `t` (from connecting to the answer's head,
    /// and for each read of its body: [`post`] bounds the whole body); for `https://`, rustls (ring) trusting [`root_store`] (reqwest is built
    /// without a default crypto provider). It follows no redirect: an OTLP endpoint has no
    /// reason to send one, and following it would send the telemetry and the headers (API
    /// keys) to wherever it points; a 3xx is an error ([`Failure::Redirect`]).
    pub fn http_client(t: &Target<'_>) -> Result<reqwest::blocking::Client, Error> {
        let roots = if t.https() {
            root_store(t)?
        } else {
            rustls::RootCertStore::empty()
        };
        reqwest::blocking::Client::builder()
            .timeout(t.timeout)
            .tls_backend_preconfigured(client_config(roots)?)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| request_err(&e))
    }

    /// POSTs one protobuf body to `url` with the headers of `t`, gzip-compressed if it says so;
    /// `Ok` holds the response body (at most [`MAX_RESPONSE_BYTES`]), `Err` the status or
    /// transport error and its [`Failure`] (never a header value). The whole exchange, the
    /// body included, ends within the timeout of `t`.
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
        // reqwest's error text names the URL, never header values. The client's timeout bounds
        // the exchange up to the answer's head; the body gets what is left of it.
        let deadline = Instant::now() + t.timeout;
        let resp = req.body(body).send().map_err(|e| send_error(&e))?;
        let status = resp.status();
        let bytes = read_within(resp, deadline)?;
        match Failure::of_status(status.as_u16()) {
            None => Ok(bytes),
            Some(reason) => {
                let text = String::from_utf8_lossy(&bytes);
                Err(Error::Export {
                    reason,
                    detail: format!(
                        "answered {status}: {}",
                        text.chars().take(200).collect::<String>()
                    ),
                })
            }
        }
    }

    /// A failed send, with its reason: the error's kind where it says one, else its text.
    pub fn send_error(e: &reqwest::Error) -> Error {
        let detail = super::chain(e);
        let reason = if e.is_timeout() {
            Failure::Timeout
        } else if e.is_redirect() {
            Failure::Redirect
        } else if e.is_body() || e.is_decode() {
            match Failure::of_text(&detail) {
                Failure::Timeout => Failure::Timeout,
                _ => Failure::BadResponse,
            }
        } else {
            match Failure::of_text(&detail) {
                // A connect error is a TLS one when its sources say so.
                Failure::Other | Failure::BadResponse if e.is_connect() => Failure::Connect,
                r => r,
            }
        };
        Error::Export { reason, detail }
    }

    /// The body of `resp`, up to [`MAX_RESPONSE_BYTES`], by `deadline`: a longer one is not
    /// read further (the connection is dropped with the response) and fails with
    /// [`Failure::ResponseTooLarge`], a slower one with [`Failure::Timeout`]. The blocking
    /// client's timeout bounds each read, not the body: the reads run on a thread of their
    /// own, which stops at the deadline too (so it outlives the call by at most one read).
    fn read_within(resp: reqwest::blocking::Response, deadline: Instant) -> Result<Vec<u8>, Error> {
        let announced = resp.content_length();
        if announced.is_some_and(|n| n > MAX_RESPONSE_BYTES as u64) {
            return Err(too_large(announced));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("phasetrace-otlp-answer".into())
            .spawn(move || {
                let _ = tx.send(read_capped(resp, deadline));
            })
            .map_err(|e| Error::Export {
                reason: Failure::Other,
                detail: format!("no thread to read the answer: {e}"),
            })?;
        let left = deadline.saturating_duration_since(Instant::now());
        rx.recv_timeout(left).unwrap_or_else(|_| Err(too_slow()))
    }

    fn read_capped(
        mut resp: reqwest::blocking::Response,
        deadline: Instant,
    ) -> Result<Vec<u8>, Error> {
        use std::io::Read as _;
        let mut out = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = resp.read(&mut buf).map_err(|e| {
                let detail = format!("reading the answer: {}", super::chain(&e));
                let reason = match (e.kind(), Failure::of_text(&detail)) {
                    (std::io::ErrorKind::TimedOut, _) | (_, Failure::Timeout) => Failure::Timeout,
                    _ => Failure::BadResponse,
                };
                Error::Export { reason, detail }
            })?;
            if n == 0 {
                return Ok(out);
            }
            if out.len() + n > MAX_RESPONSE_BYTES {
                return Err(too_large(None));
            }
            out.extend_from_slice(&buf[..n]);
            if Instant::now() >= deadline {
                return Err(too_slow());
            }
        }
    }

    fn too_slow() -> Error {
        Error::Export {
            reason: Failure::Timeout,
            detail: "the answer's body did not end within the timeout".into(),
        }
    }

    fn too_large(announced: Option<u64>) -> Error {
        let size = announced.map_or_else(|| "more".to_owned(), |n| format!("{n} bytes"));
        Error::Export {
            reason: Failure::ResponseTooLarge,
            detail: format!(
                "the answer's body is {size} (at most {MAX_RESPONSE_BYTES} bytes are read): \
                 not read, the connection dropped"
            ),
        }
    }
}
#[cfg(feature = "http")]
pub use http::{http_client, post, send_error};

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

    #[test]
    fn a_status_and_an_error_text_say_why_an_export_failed() {
        assert_eq!(Failure::of_status(200), None);
        assert_eq!(Failure::of_status(307), Some(Failure::Redirect));
        assert_eq!(Failure::of_status(503), Some(Failure::Rejected));
        for (text, want) in [
            (
                "error sending request: operation timed out",
                Failure::Timeout,
            ),
            (
                "client error (Connect): invalid peer certificate: NotValidForName",
                Failure::Tls,
            ),
            (
                "tcp connect error: Connection refused (os error 111)",
                Failure::Connect,
            ),
            (
                "h2 protocol error: http2 error: connection error",
                Failure::BadResponse,
            ),
            (
                "decoded message length too large: found 1073741823 bytes",
                Failure::ResponseTooLarge,
            ),
            ("something new", Failure::Other),
        ] {
            assert_eq!(Failure::of_text(text), want, "{text}");
        }
        let names: Vec<&str> = Failure::ALL.iter().map(|f| f.as_str()).collect();
        let data: Vec<&str> = phasetrace_names::export_failure::ALL
            .iter()
            .map(|n| n.value)
            .collect();
        assert_eq!(names, data, "the order of the names crate");
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
