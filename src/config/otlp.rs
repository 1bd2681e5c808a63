//! The OTLP connections: [`OtlpConfig`] (the general one and one per signal), the per-signal
//! settings as given (`SignalGiven`), the parsers of endpoints and header lists, and how the
//! resolution (`resolve.rs`) combines the general `OTEL_EXPORTER_OTLP_*` settings with a
//! signal's own.
//!
//! ```text
//! OTEL_EXPORTER_OTLP_*                  ──OtlpGeneral::read────> OtlpGeneral ─┐
//! OTEL_EXPORTER_OTLP_{TRACES,METRICS}_* ──Signal::given──────────> SignalGiven ─┤
//!   ──OtlpGeneral::for_signal──> OtlpConfig ──check_otlp──> Config::traces_otlp, metrics_otlp
//! ```

use super::settings;
use super::sources::Sources;
use super::{Compression, ConfigError, HistogramAggregation, Protocol};
use crate::names::env;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// The OTLP exporter's settings.
#[derive(Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The endpoint: for the general connection ([`Config::otlp`]) the base URL
    /// (`http(s)://host:port`); for a signal ([`Config::traces_otlp`], [`Config::metrics_otlp`])
    /// the URL its exporter sends to (for http/protobuf with the signal's path, `/v1/traces`).
    ///
    /// [`Config::otlp`]: super::Config::otlp
    /// [`Config::traces_otlp`]: super::Config::traces_otlp
    /// [`Config::metrics_otlp`]: super::Config::metrics_otlp
    pub endpoint: String,
    /// Transport.
    pub protocol: Protocol,
    /// Request headers (API keys): values are never printed.
    pub headers: Vec<(String, String)>,
    /// Export timeout.
    pub timeout: Duration,
    /// gzip compression of request bodies.
    pub gzip: bool,
    /// Custom CA for `https://` endpoints.
    pub certificate: Option<PathBuf>,
    /// Histogram aggregation.
    pub histogram: HistogramAggregation,
    /// The variables the values came from, for errors that name them.
    pub(crate) vars: OtlpVars,
}

/// The variables an [`OtlpConfig`]'s endpoint, headers and CA came from: a signal's own
/// (`OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`) or the general ones, so that an error names the
/// variable the user set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OtlpVars {
    pub(crate) endpoint: &'static str,
    pub(crate) headers: &'static str,
    pub(crate) certificate: &'static str,
}

impl OtlpVars {
    /// The general connection's.
    pub(crate) const GENERAL: OtlpVars = OtlpVars {
        endpoint: env::OTEL_EXPORTER_OTLP_ENDPOINT,
        headers: env::OTEL_EXPORTER_OTLP_HEADERS,
        certificate: env::OTEL_EXPORTER_OTLP_CERTIFICATE,
    };
}

impl OtlpConfig {
    /// The variable the endpoint came from (`OTEL_EXPORTER_OTLP_ENDPOINT` or a signal's own).
    pub fn endpoint_var(&self) -> &'static str {
        self.vars.endpoint
    }

    /// The variable the headers came from (`OTEL_EXPORTER_OTLP_HEADERS` or a signal's own).
    pub fn headers_var(&self) -> &'static str {
        self.vars.headers
    }

    /// The variable the custom CA came from (`OTEL_EXPORTER_OTLP_CERTIFICATE` or a signal's
    /// own).
    pub fn certificate_var(&self) -> &'static str {
        self.vars.certificate
    }
}

impl fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpConfig")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("headers", &masked_headers(&self.headers))
            .field("timeout", &self.timeout)
            .field("gzip", &self.gzip)
            .field("certificate", &self.certificate)
            .field("histogram", &self.histogram)
            .finish()
    }
}

/// The per-signal OTLP settings as given (`OTEL_EXPORTER_OTLP_TRACES_*` or `..._METRICS_*`);
/// `None`: unset, the general setting applies.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct SignalGiven {
    pub(crate) endpoint: Option<String>,
    pub(crate) protocol: Option<Protocol>,
    pub(crate) headers: Option<Vec<(String, String)>>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) compression: Option<Compression>,
    pub(crate) certificate: Option<PathBuf>,
}

impl fmt::Debug for SignalGiven {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalGiven")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("headers", &self.headers.as_deref().map(masked_headers))
            .field("timeout", &self.timeout)
            .field("compression", &self.compression)
            .field("certificate", &self.certificate)
            .finish()
    }
}

/// One OTLP signal: its name, OTLP/HTTP path, per-signal settings and exporter variable.
pub(super) struct Signal {
    pub(super) name: &'static str,
    path: &'static str,
    pub(super) endpoint: &'static settings::Setting<Option<String>>,
    pub(super) protocol: &'static settings::Setting<Option<Protocol>>,
    pub(super) headers: &'static settings::Setting<Option<Vec<(String, String)>>>,
    pub(super) timeout: &'static settings::Setting<Option<Duration>>,
    pub(super) compression: &'static settings::Setting<Option<Compression>>,
    pub(super) certificate: &'static settings::Setting<Option<PathBuf>>,
}

impl Signal {
    /// The per-signal OTLP settings of this signal as given (unset: `None`).
    pub(super) fn given(&self, src: &mut Sources<'_>) -> Result<SignalGiven, ConfigError> {
        Ok(SignalGiven {
            endpoint: src.value(self.endpoint)?,
            protocol: src.value(self.protocol)?,
            headers: src.value(self.headers)?,
            timeout: src.value(self.timeout)?,
            compression: src.value(self.compression)?,
            certificate: src.value(self.certificate)?,
        })
    }
}

pub(super) const TRACES: Signal = Signal {
    name: "traces",
    path: "/v1/traces",
    endpoint: &settings::TRACES_ENDPOINT,
    protocol: &settings::TRACES_PROTOCOL,
    headers: &settings::TRACES_HEADERS,
    timeout: &settings::TRACES_TIMEOUT,
    compression: &settings::TRACES_COMPRESSION,
    certificate: &settings::TRACES_CERTIFICATE,
};

pub(super) const METRICS: Signal = Signal {
    name: "metrics",
    path: "/v1/metrics",
    endpoint: &settings::METRICS_ENDPOINT,
    protocol: &settings::METRICS_PROTOCOL,
    headers: &settings::METRICS_HEADERS,
    timeout: &settings::METRICS_TIMEOUT,
    compression: &settings::METRICS_COMPRESSION,
    certificate: &settings::METRICS_CERTIFICATE,
};

/// The OTLP/gRPC and OTLP/HTTP transports this build has (the `otlp-grpc` and `otlp-http`
/// features): a protocol that is not compiled in is refused by name.
pub(crate) fn protocol_compiled(p: Protocol) -> bool {
    match p {
        Protocol::Grpc => cfg!(feature = "otlp-grpc"),
        Protocol::HttpProtobuf => cfg!(feature = "otlp-http"),
    }
}

/// Header names with their values masked, for display.
pub fn masked_headers(h: &[(String, String)]) -> String {
    h.iter()
        .map(|(k, _)| format!("{k}=****"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Checks an OTLP endpoint: `http(s)://host[:port][/path]`, by the `url` crate's rules (WHATWG)
/// and those an exporter needs: nothing to percent-encode or drop silently (whitespace, control
/// characters, a query or a fragment), a host, and no credentials (they would be printed with the
/// URL, and not every transport sends them: an API key goes in `OTEL_EXPORTER_OTLP_HEADERS`).
/// The one parser of endpoints: the environment, `with_text`, the typed setters and
/// `config()` all read a value through it. `Ok` is the text as given, without trailing `/`.
pub(crate) fn parse_endpoint(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("whitespace or a control character in the URL".into());
    }
    let url = url::Url::parse(s).map_err(|e| e.to_string())?;
    if !matches!(url.scheme(), "http" | "https")
        || !(s.starts_with("http://") || s.starts_with("https://"))
    {
        return Err("the scheme must be http:// or https://".into());
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "credentials in the URL are refused: send them as a header (OTEL_EXPORTER_OTLP_HEADERS)"
                .into(),
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("a query or a fragment is not sent by OTLP exporters".into());
    }
    Ok(s.trim_end_matches('/').to_owned())
}

/// Parses `k=v,k2=v2` (values percent-decoded, blank entries skipped). The error names the
/// first bad entry by its position only, never its text: header values are secrets.
pub(crate) fn parse_kv_list(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, item) in s.split(',').enumerate() {
        if item.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("entry {} has no '='", i + 1));
        };
        let k = k.trim();
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic() && b != b'=') {
            return Err(format!("entry {} has an empty or invalid key", i + 1));
        }
        let v = percent_encoding::percent_decode_str(v.trim()).decode_utf8_lossy();
        // A header value cannot hold CR, LF or NUL (RFC 9110 5.5), and a transport that refuses
        // one might quote it: refused here, by position.
        if v.chars().any(char::is_control) {
            return Err(format!(
                "entry {} has a control character in its value",
                i + 1
            ));
        }
        out.push((k.to_owned(), v.into_owned()));
    }
    Ok(out)
}

/// The general OTLP settings (`OTEL_EXPORTER_OTLP_*`), which a signal's own override.
pub(super) struct OtlpGeneral {
    pub(super) endpoint: Option<String>,
    protocol: Protocol,
    headers: Vec<(String, String)>,
    timeout: Duration,
    compression: Compression,
    certificate: Option<PathBuf>,
    histogram: HistogramAggregation,
}

impl OtlpGeneral {
    pub(super) fn read(src: &mut Sources<'_>) -> Result<OtlpGeneral, ConfigError> {
        use settings as s;
        Ok(OtlpGeneral {
            endpoint: src.value(&s::OTLP_ENDPOINT)?,
            protocol: src.value(&s::OTLP_PROTOCOL)?,
            headers: src.value(&s::OTLP_HEADERS)?,
            timeout: src.value(&s::OTLP_TIMEOUT)?,
            compression: src.value(&s::OTLP_COMPRESSION)?,
            certificate: src.value(&s::OTLP_CERTIFICATE)?,
            histogram: src.value(&s::OTLP_HISTOGRAM)?,
        })
    }

    /// The general connection ([`Config::otlp`]), when an endpoint is set.
    ///
    /// [`Config::otlp`]: super::Config::otlp
    pub(super) fn config(&self) -> Option<OtlpConfig> {
        self.endpoint.clone().map(|endpoint| OtlpConfig {
            protocol: self.protocol,
            endpoint,
            headers: self.headers.clone(),
            timeout: self.timeout,
            gzip: self.compression == Compression::Gzip,
            certificate: self.certificate.clone(),
            histogram: self.histogram,
            vars: OtlpVars::GENERAL,
        })
    }

    /// A signal's connection. A signal's own variable wins over the general one (the OTel SDK
    /// environment spec); the general endpoint gets the signal's path over HTTP, a signal's own
    /// is used as is.
    pub(super) fn for_signal(&self, sig: &Signal, given: &SignalGiven) -> Option<OtlpConfig> {
        let protocol = given.protocol.unwrap_or(self.protocol);
        let endpoint = match (&given.endpoint, &self.endpoint) {
            (Some(e), _) => e.clone(),
            (None, Some(e)) if protocol == Protocol::HttpProtobuf => format!("{e}{}", sig.path),
            (None, Some(e)) => e.clone(),
            (None, None) => return None,
        };
        Some(OtlpConfig {
            endpoint,
            protocol,
            headers: given
                .headers
                .clone()
                .unwrap_or_else(|| self.headers.clone()),
            timeout: given.timeout.unwrap_or(self.timeout),
            gzip: given.compression.unwrap_or(self.compression) == Compression::Gzip,
            certificate: given
                .certificate
                .clone()
                .or_else(|| self.certificate.clone()),
            histogram: self.histogram,
            vars: OtlpVars {
                endpoint: if given.endpoint.is_some() {
                    sig.endpoint.var
                } else {
                    OtlpVars::GENERAL.endpoint
                },
                headers: if given.headers.is_some() {
                    sig.headers.var
                } else {
                    OtlpVars::GENERAL.headers
                },
                certificate: if given.certificate.is_some() {
                    sig.certificate.var
                } else {
                    OtlpVars::GENERAL.certificate
                },
            },
        })
    }
}

/// Refuses a signal's OTLP connection that this build cannot make (its protocol's feature is
/// off) or that names a CA for a plain `http://` endpoint.
pub(super) fn check_otlp(
    src: &Sources<'_>,
    sig: &Signal,
    given: &SignalGiven,
    o: &OtlpConfig,
) -> Result<(), ConfigError> {
    let protocol_var = if given.protocol.is_some() {
        sig.protocol.var
    } else {
        env::OTEL_EXPORTER_OTLP_PROTOCOL
    };
    // A protocol nobody set is the default's: say so, and what asked for OTLP.
    let asked = match src.origins.get(protocol_var) {
        Some(_) => format!("{protocol_var}={}", o.protocol),
        None => format!(
            "{}={} ({protocol_var} unset: {} by default)",
            o.vars.endpoint, o.endpoint, o.protocol
        ),
    };
    let (endpoint_var, certificate_var) = (o.vars.endpoint, o.vars.certificate);
    if !protocol_compiled(o.protocol) {
        let feature = match o.protocol {
            Protocol::Grpc => "otlp-grpc",
            Protocol::HttpProtobuf => "otlp-http",
        };
        return Err(ConfigError::Conflict(format!(
            "{asked}: this build of phasetrace has no OTLP {} exporter for {} \
             (its cargo feature `{feature}` is off): enable the feature, or choose \
             another protocol",
            o.protocol, sig.name
        )));
    }
    if o.certificate.is_some() && !o.endpoint.starts_with("https://") {
        return Err(ConfigError::Conflict(format!(
            "{certificate_var} is set but {endpoint_var}={} is not an https:// endpoint",
            o.endpoint
        )));
    }
    Ok(())
}
