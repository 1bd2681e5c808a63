//! Configuration: defaults, then the environment, then code. One parse, one error type.
//!
//! ```text
//! defaults ──> environment (PHASETRACE_*, OTEL_*, legacy aliases) ──> builder setters ──> Config
//! ```
//!
//! Every invalid value is a [`ConfigError`] naming the variable, the value and what is accepted.
//! Header values are secrets: they never appear in errors, `Debug` output or `check`.

use crate::names::{default, env};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// Which sections are recorded (`PHASETRACE_LEVEL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Level {
    /// Nothing is recorded: every hot-path call is one relaxed load.
    #[default]
    Off,
    /// Every section.
    Full,
    /// Only collectives, their enqueue and their rendezvous probe.
    Collectives,
}

impl Level {
    pub(crate) const fn as_u8(self) -> u8 {
        match self {
            Level::Off => 0,
            Level::Full => 1,
            Level::Collectives => 2,
        }
    }

    /// The inverse of [`Level::as_u8`]; values above 2 read as `Collectives`.
    pub(crate) const fn from_u8(v: u8) -> Level {
        match v {
            0 => Level::Off,
            1 => Level::Full,
            _ => Level::Collectives,
        }
    }
}

/// Speculative-decoding detail (`PHASETRACE_SPEC_LEVEL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SpecLevel {
    /// No round telemetry.
    #[default]
    Off,
    /// Rounds and phases.
    Phases,
    /// Rounds, phases and the verify sub-split.
    VerifySplit,
}

impl SpecLevel {
    pub(crate) const fn as_u8(self) -> u8 {
        match self {
            SpecLevel::Off => 0,
            SpecLevel::Phases => 1,
            SpecLevel::VerifySplit => 2,
        }
    }

    /// The inverse of [`SpecLevel::as_u8`]; values above 2 read as `VerifySplit`.
    pub(crate) const fn from_u8(v: u8) -> SpecLevel {
        match v {
            0 => SpecLevel::Off,
            1 => SpecLevel::Phases,
            _ => SpecLevel::VerifySplit,
        }
    }
}

/// Where boundary times come from (`PHASETRACE_TIMING`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Timing {
    /// The monotonic host clock.
    #[default]
    Host,
    /// Synchronize the engine's stream, then read the host clock (the reference semantics).
    Sync,
    /// Record events on the engine's stream and resolve them off the hot path.
    Events,
}

impl Timing {
    /// The spelling of `PHASETRACE_TIMING`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Timing::Host => "host",
            Timing::Sync => "sync",
            Timing::Events => "events",
        }
    }
}

/// OTLP transport (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP over gRPC (port 4317 by convention).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318 by convention).
    HttpProtobuf,
}

impl Protocol {
    /// The spelling of `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Histogram aggregation for OTLP metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HistogramAggregation {
    /// Explicit buckets, 1 µs to 10 s log-spaced.
    #[default]
    Explicit,
    /// Base-2 exponential buckets.
    Exponential,
}

/// The OTLP exporter's settings.
#[derive(Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// Base endpoint, `http://host:port` or `https://host:port`.
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
}

impl std::fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

/// Header names with their values masked, for display.
pub fn masked_headers(h: &[(String, String)]) -> String {
    h.iter()
        .map(|(k, _)| format!("{k}=****"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Where a resolved setting came from, as `phasetrace check` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default.
    Default,
    /// An environment variable (or a legacy alias of one).
    Env,
    /// A builder setter (or a CLI flag).
    Code,
}

impl Origin {
    /// `default`, `env` or `code`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Origin::Default => "default",
            Origin::Env => "env",
            Origin::Code => "code",
        }
    }
}

/// A configuration error: names the input, the value (masked when secret) and what is accepted.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A value that does not parse.
    #[error("{var}={value:?}: expected {expected}")]
    Invalid {
        /// The variable (or setter) name.
        var: String,
        /// The value given (masked for secrets).
        value: String,
        /// What is accepted.
        expected: String,
    },
    /// A value that is not valid UTF-8.
    #[error("{var} is not valid UTF-8: expected {expected}")]
    NotUnicode {
        /// The variable.
        var: String,
        /// What is accepted.
        expected: String,
    },
    /// Settings that contradict each other.
    #[error("{0}")]
    Conflict(String),
}

fn invalid(var: &str, value: &str, expected: &str) -> ConfigError {
    ConfigError::Invalid {
        var: var.to_owned(),
        value: value.to_owned(),
        expected: expected.to_owned(),
    }
}

/// The resolved configuration of a profiler.
#[derive(Clone, Debug)]
pub struct Config {
    /// Which sections are recorded.
    pub level: Level,
    /// Speculative-decoding detail.
    pub spec_level: SpecLevel,
    /// Build spans for one step (and round) in N; 0 = never.
    pub trace_every: u64,
    /// Read one CUDA-graph replay in N; 0 = never.
    pub graph_read_every: u64,
    /// The `layer` attribute on section metrics.
    pub layer_attr: bool,
    /// Console summary every N steps; 0 = off.
    pub summary_every: u64,
    /// Console speculative line every N rounds; 0 = off.
    pub spec_summary_every: u64,
    /// The embedded Prometheus endpoint's listen address.
    pub prometheus: Option<SocketAddr>,
    /// Per-thread buffer capacity in records.
    pub queue: usize,
    /// This process's rank.
    pub rank: u32,
    /// The opt-in per-(layer, expert) token counter.
    pub expert_counter: bool,
    /// Timing backend.
    pub timing: Timing,
    /// `OTEL_SDK_DISABLED=true`: nothing recorded, nothing exported.
    pub sdk_disabled: bool,
    /// Resource `service.name`.
    pub service_name: String,
    /// Extra resource attributes.
    pub resource_attributes: Vec<(String, String)>,
    /// OTLP export, when an endpoint is configured and an exporter selects it.
    pub otlp: Option<OtlpConfig>,
    /// Whether spans go to OTLP.
    pub traces_otlp: bool,
    /// Whether spans are printed to stderr (`OTEL_TRACES_EXPORTER=console`).
    pub traces_console: bool,
    /// Whether metrics go to OTLP.
    pub metrics_otlp: bool,
    /// Metric export interval (OTLP push).
    pub metric_export_interval: Duration,
    /// How long shutdown may take.
    pub shutdown_timeout: Duration,
    /// Where each setting came from, keyed by its environment variable name.
    pub origins: BTreeMap<&'static str, Origin>,
    /// Legacy-alias disagreements found while resolving (reported once on stderr by `build`).
    pub alias_warnings: Vec<String>,
}

impl Config {
    /// Resolves defaults and the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        ConfigBuilder::default().resolve_with(|k| std::env::var_os(k))
    }

    /// Whether anything is recorded at all.
    pub fn is_enabled(&self) -> bool {
        !self.sdk_disabled && (self.level != Level::Off || self.spec_level != SpecLevel::Off)
    }
}

/// Settings made in code; they beat the environment. Built by [`crate::ProfilerBuilder`].
#[derive(Clone, Debug, Default)]
pub(crate) struct ConfigBuilder {
    pub(crate) level: Option<Level>,
    pub(crate) spec_level: Option<SpecLevel>,
    pub(crate) trace_every: Option<u64>,
    pub(crate) graph_read_every: Option<u64>,
    pub(crate) layer_attr: Option<bool>,
    pub(crate) summary_every: Option<u64>,
    pub(crate) spec_summary_every: Option<u64>,
    pub(crate) prometheus: Option<Option<String>>,
    pub(crate) queue: Option<usize>,
    pub(crate) rank: Option<u32>,
    pub(crate) expert_counter: Option<bool>,
    pub(crate) timing: Option<Timing>,
    pub(crate) service_name: Option<String>,
    pub(crate) otlp_endpoint: Option<Option<String>>,
    pub(crate) otlp_protocol: Option<Protocol>,
    pub(crate) otlp_headers: Option<Vec<(String, String)>>,
    pub(crate) otlp_certificate: Option<PathBuf>,
    pub(crate) otlp_gzip: Option<bool>,
    pub(crate) otlp_histogram: Option<HistogramAggregation>,
    pub(crate) metric_export_interval: Option<Duration>,
    pub(crate) shutdown_timeout: Option<Duration>,
    /// (alias variable, the phasetrace variable it stands for)
    pub(crate) aliases: Vec<(String, &'static str)>,
}

struct Env<'a> {
    get: &'a dyn Fn(&str) -> Option<OsString>,
    origins: BTreeMap<&'static str, Origin>,
}

impl Env<'_> {
    /// The value of `var`, `None` when unset or empty.
    fn str(&mut self, var: &'static str, expected: &str) -> Result<Option<String>, ConfigError> {
        match (self.get)(var) {
            None => Ok(None),
            Some(v) => match v.into_string() {
                Ok(s) if s.trim().is_empty() => Ok(None),
                Ok(s) => {
                    self.origins.insert(var, Origin::Env);
                    Ok(Some(s.trim().to_owned()))
                }
                Err(_) => Err(ConfigError::NotUnicode {
                    var: var.to_owned(),
                    expected: expected.to_owned(),
                }),
            },
        }
    }

    fn parsed<T>(
        &mut self,
        var: &'static str,
        expected: &str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Result<Option<T>, ConfigError> {
        match self.str(var, expected)? {
            None => Ok(None),
            Some(s) => parse(&s)
                .map(Some)
                .ok_or_else(|| invalid(var, &s, expected)),
        }
    }
}

const LEVEL_EXPECTED: &str = "off, 0, full, 1, collectives or 2";
const SPEC_LEVEL_EXPECTED: &str = "off, 0, 1 (phases) or 2 (phases and verify sub-split)";
const BOOL_EXPECTED: &str = "on, off, true, false, 1 or 0";

pub(crate) fn parse_level(s: &str) -> Option<Level> {
    match s.to_ascii_lowercase().as_str() {
        "off" | "0" => Some(Level::Off),
        "full" | "1" => Some(Level::Full),
        "collectives" | "2" => Some(Level::Collectives),
        _ => None,
    }
}

pub(crate) fn parse_spec_level(s: &str) -> Option<SpecLevel> {
    match s.to_ascii_lowercase().as_str() {
        "off" | "0" => Some(SpecLevel::Off),
        "1" | "phases" => Some(SpecLevel::Phases),
        "2" | "verify" => Some(SpecLevel::VerifySplit),
        _ => None,
    }
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Some(true),
        "off" | "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    s.parse().ok()
}

const PROMETHEUS_EXPECTED: &str =
    "a listen address host:port (127.0.0.1:9464), host:port+rank (one port per rank), or off";

/// Parses the Prometheus listen address; `host:port+rank` offsets the port by the rank, so that
/// several ranks on one host each get their own endpoint.
fn parse_prometheus(s: &str, rank: u32) -> Option<SocketAddr> {
    match s.strip_suffix("+rank") {
        Some(base) => {
            let mut a = parse_listen(base)?;
            let port = u16::try_from(u32::from(a.port()).checked_add(rank)?).ok()?;
            a.set_port(port);
            Some(a)
        }
        None => parse_listen(s),
    }
}

/// Parses `host:port` into one socket address (the first it resolves to).
pub(crate) fn parse_listen(s: &str) -> Option<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    let (host, port) = s.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    if host.is_empty() {
        return None;
    }
    (host, port).to_socket_addrs().ok()?.next()
}

/// Checks an OTLP endpoint: `http(s)://host[:port][/path]`.
pub(crate) fn parse_endpoint(s: &str) -> Option<String> {
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))?;
    let authority = rest.split('/').next()?;
    if authority.is_empty() || authority.contains(char::is_whitespace) {
        return None;
    }
    if let Some((host, port)) = authority.rsplit_once(':')
        && !host.ends_with(']')
        && (host.is_empty() || port.parse::<u16>().is_err())
    {
        return None;
    }
    Some(s.trim_end_matches('/').to_owned())
}

/// Parses `k=v,k2=v2` (values percent-decoded, blank entries skipped). The error names the
/// first bad entry by its position only, never its text: header values are secrets.
fn parse_kv_list(s: &str) -> Result<Vec<(String, String)>, String> {
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
        out.push((k.to_owned(), percent_decode(v.trim())));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

impl ConfigBuilder {
    /// Resolves defaults, then `get` (the environment), then the settings in code.
    pub(crate) fn resolve_with(
        &self,
        get: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Config, ConfigError> {
        let mut e = Env {
            get: &get,
            origins: BTreeMap::new(),
        };
        let mut alias_warnings = Vec::new();

        // Levels, with legacy aliases: both honored, the phasetrace name wins loudly.
        let mut level = e.parsed(env::LEVEL, LEVEL_EXPECTED, parse_level)?;
        let mut spec_level = e.parsed(env::SPEC_LEVEL, SPEC_LEVEL_EXPECTED, parse_spec_level)?;
        for (alias, target) in &self.aliases {
            let raw = match get(alias) {
                None => continue,
                Some(v) => v.into_string().map_err(|_| ConfigError::NotUnicode {
                    var: alias.clone(),
                    expected: LEVEL_EXPECTED.to_owned(),
                })?,
            };
            if raw.trim().is_empty() {
                continue;
            }
            let raw = raw.trim();
            let (general_raw, differs) = match *target {
                env::LEVEL => {
                    let v = parse_level(raw).ok_or_else(|| invalid(alias, raw, LEVEL_EXPECTED))?;
                    let differs = level.is_some_and(|g| g != v);
                    if level.is_none() {
                        level = Some(v);
                        e.origins.insert(env::LEVEL, Origin::Env);
                    }
                    (get(env::LEVEL), differs)
                }
                env::SPEC_LEVEL => {
                    let v = parse_spec_level(raw)
                        .ok_or_else(|| invalid(alias, raw, SPEC_LEVEL_EXPECTED))?;
                    let differs = spec_level.is_some_and(|g| g != v);
                    if spec_level.is_none() {
                        spec_level = Some(v);
                        e.origins.insert(env::SPEC_LEVEL, Origin::Env);
                    }
                    (get(env::SPEC_LEVEL), differs)
                }
                other => {
                    return Err(ConfigError::Conflict(format!(
                        "legacy alias {alias} stands for {other}, but only {} and {} take aliases",
                        env::LEVEL,
                        env::SPEC_LEVEL
                    )));
                }
            };
            if differs {
                let g = general_raw
                    .and_then(|v| v.into_string().ok())
                    .unwrap_or_default();
                alias_warnings.push(format!(
                    "phasetrace: {target}={} overrides {alias}={raw} (the phasetrace name wins; unset one to silence this)",
                    g.trim()
                ));
            }
        }

        let sdk_disabled = e
            .parsed(env::OTEL_SDK_DISABLED, "true or false", |s| {
                match s.to_ascii_lowercase().as_str() {
                    "true" => Some(true),
                    "false" => Some(false),
                    _ => None,
                }
            })?
            .unwrap_or(false);
        let trace_every = e.parsed(env::TRACE_EVERY, "a whole number (0 = no spans)", parse_u64)?;
        let graph_read_every = e.parsed(
            env::GRAPH_READ_EVERY,
            "a whole number of replays (1 = every replay, 0 = none)",
            parse_u64,
        )?;
        let layer_attr = e.parsed(env::LAYER_ATTR, BOOL_EXPECTED, parse_bool)?;
        let summary_every = e.parsed(
            env::SUMMARY_EVERY,
            "a whole number of steps (0 = off)",
            parse_u64,
        )?;
        let spec_summary_every = e.parsed(
            env::SPEC_SUMMARY_EVERY,
            "a whole number of rounds (0 = off)",
            parse_u64,
        )?;
        let prometheus_env = e.str(env::PROMETHEUS, "host:port or off")?;
        // Checked even when code overrides it: a bad value is never silently ignored.
        if let Some(s) = &prometheus_env
            && !s.eq_ignore_ascii_case("off")
            && parse_prometheus(s, 0).is_none()
        {
            return Err(invalid(env::PROMETHEUS, s, PROMETHEUS_EXPECTED));
        }
        let queue = e.parsed(
            env::QUEUE,
            "a whole number of records from 64 to 16777216",
            |s| {
                s.parse::<usize>()
                    .ok()
                    .filter(|n| (64..=1 << 24).contains(n))
            },
        )?;
        let rank = match e.parsed(env::RANK, "a whole number", |s| s.parse::<u32>().ok())? {
            Some(r) => Some(r),
            None => {
                let mut found = None;
                for var in env::RANK_FALLBACKS {
                    if let Some(s) = e.str(var, "a whole number")? {
                        found = Some(
                            s.parse::<u32>()
                                .map_err(|_| invalid(var, &s, "a whole number"))?,
                        );
                        e.origins.insert(env::RANK, Origin::Env);
                        break;
                    }
                }
                found
            }
        };
        let expert_counter = e.parsed(env::EXPERT_COUNTER, BOOL_EXPECTED, parse_bool)?;
        let timing = e.parsed(env::TIMING, "host, sync or events", |s| {
            match s.to_ascii_lowercase().as_str() {
                "host" => Some(Timing::Host),
                "sync" => Some(Timing::Sync),
                "events" => Some(Timing::Events),
                _ => None,
            }
        })?;
        let service_name = e.str(env::OTEL_SERVICE_NAME, "a service name")?;
        let resource_attributes = match e.str(env::OTEL_RESOURCE_ATTRIBUTES, "key=value,...")? {
            None => Vec::new(),
            Some(s) => parse_kv_list(&s).map_err(|why| {
                invalid(
                    env::OTEL_RESOURCE_ATTRIBUTES,
                    &s,
                    &format!("key=value pairs separated by commas ({why})"),
                )
            })?,
        };
        let endpoint_env = e.parsed(
            env::OTEL_EXPORTER_OTLP_ENDPOINT,
            "an http:// or https:// URL with a host and an optional port",
            parse_endpoint,
        )?;
        let protocol = e.parsed(
            env::OTEL_EXPORTER_OTLP_PROTOCOL,
            "grpc or http/protobuf",
            |s| match s {
                "grpc" => Some(Protocol::Grpc),
                "http/protobuf" => Some(Protocol::HttpProtobuf),
                _ => None,
            },
        )?;
        let headers = match e.str(env::OTEL_EXPORTER_OTLP_HEADERS, "key=value,...")? {
            None => Vec::new(),
            Some(s) => parse_kv_list(&s).map_err(|why| {
                // Never echo header values: they carry API keys.
                invalid(
                    env::OTEL_EXPORTER_OTLP_HEADERS,
                    "<masked>",
                    &format!("key=value pairs separated by commas ({why})"),
                )
            })?,
        };
        let timeout = e.parsed(
            env::OTEL_EXPORTER_OTLP_TIMEOUT,
            "a whole number of milliseconds, at least 1",
            |s| s.parse::<u64>().ok().filter(|&n| n > 0),
        )?;
        let gzip = e.parsed(
            env::OTEL_EXPORTER_OTLP_COMPRESSION,
            "gzip or none",
            |s| match s {
                "gzip" => Some(true),
                "none" => Some(false),
                _ => None,
            },
        )?;
        let certificate = e.str(env::OTEL_EXPORTER_OTLP_CERTIFICATE, "a path")?;
        let histogram = e.parsed(
            env::OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION,
            "explicit_bucket_histogram or base2_exponential_bucket_histogram",
            |s| match s {
                "explicit_bucket_histogram" => Some(HistogramAggregation::Explicit),
                "base2_exponential_bucket_histogram" => Some(HistogramAggregation::Exponential),
                _ => None,
            },
        )?;
        let interval = e.parsed(
            env::OTEL_METRIC_EXPORT_INTERVAL,
            "a whole number of milliseconds, at least 1",
            |s| s.parse::<u64>().ok().filter(|&n| n > 0),
        )?;
        let traces_exporter = e.parsed(
            env::OTEL_TRACES_EXPORTER,
            "otlp, console or none",
            |s| match s {
                "otlp" | "console" | "none" => Some(s.to_owned()),
                _ => None,
            },
        )?;
        let metrics_exporters = e.parsed(
            env::OTEL_METRICS_EXPORTER,
            "a comma list of otlp, prometheus, console, none",
            |s| {
                let v: Vec<String> = s.split(',').map(|x| x.trim().to_owned()).collect();
                v.iter()
                    .all(|x| matches!(x.as_str(), "otlp" | "prometheus" | "console" | "none"))
                    .then_some(v)
            },
        )?;

        let mut origins = e.origins;
        let mut code = |var: &'static str, set: bool| {
            if set {
                origins.insert(var, Origin::Code);
            }
        };
        code(env::LEVEL, self.level.is_some());
        code(env::SPEC_LEVEL, self.spec_level.is_some());
        code(env::TRACE_EVERY, self.trace_every.is_some());
        code(env::GRAPH_READ_EVERY, self.graph_read_every.is_some());
        code(env::LAYER_ATTR, self.layer_attr.is_some());
        code(env::SUMMARY_EVERY, self.summary_every.is_some());
        code(env::SPEC_SUMMARY_EVERY, self.spec_summary_every.is_some());
        code(env::PROMETHEUS, self.prometheus.is_some());
        code(env::QUEUE, self.queue.is_some());
        code(env::RANK, self.rank.is_some());
        code(env::EXPERT_COUNTER, self.expert_counter.is_some());
        code(env::TIMING, self.timing.is_some());
        code(env::OTEL_SERVICE_NAME, self.service_name.is_some());
        code(
            env::OTEL_EXPORTER_OTLP_ENDPOINT,
            self.otlp_endpoint.is_some(),
        );
        code(
            env::OTEL_EXPORTER_OTLP_PROTOCOL,
            self.otlp_protocol.is_some(),
        );
        code(
            env::OTEL_METRIC_EXPORT_INTERVAL,
            self.metric_export_interval.is_some(),
        );

        let endpoint = match &self.otlp_endpoint {
            Some(Some(s)) => Some(parse_endpoint(s).ok_or_else(|| {
                invalid(
                    "otlp endpoint",
                    s,
                    "an http:// or https:// URL with a host and an optional port",
                )
            })?),
            Some(None) => None,
            None => endpoint_env,
        };
        let metrics_explicit = metrics_exporters.is_some();
        let metrics_exporters = metrics_exporters.unwrap_or_else(|| {
            let mut v = Vec::new();
            if endpoint.is_some() {
                v.push("otlp".to_owned());
            }
            v
        });
        let wants = |name: &str| metrics_exporters.iter().any(|x| x == name);
        let traces_otlp = match traces_exporter.as_deref() {
            Some("otlp") => true,
            Some(_) => false,
            None => endpoint.is_some(),
        };
        let metrics_otlp = wants("otlp");
        if (traces_otlp || metrics_otlp) && endpoint.is_none() {
            return Err(ConfigError::Conflict(format!(
                "OTLP export is selected ({}/{}) but {} is not set: set it, or select another exporter",
                env::OTEL_TRACES_EXPORTER,
                env::OTEL_METRICS_EXPORTER,
                env::OTEL_EXPORTER_OTLP_ENDPOINT
            )));
        }

        // The embedded Prometheus endpoint is the default when nothing is pushed anywhere.
        let prom_raw: Option<String> = match &self.prometheus {
            Some(v) => v.clone(),
            None => match prometheus_env {
                Some(s) if s.eq_ignore_ascii_case("off") => None,
                Some(s) => Some(s),
                None if wants("prometheus") || (!metrics_explicit && endpoint.is_none()) => {
                    Some(default::PROMETHEUS_ADDR.to_owned())
                }
                None => None,
            },
        };
        let rank = self.rank.or(rank).unwrap_or(0);
        let prometheus = match prom_raw {
            None => None,
            Some(s) => Some(
                parse_prometheus(&s, rank)
                    .ok_or_else(|| invalid(env::PROMETHEUS, &s, PROMETHEUS_EXPECTED))?,
            ),
        };
        let summary_default = if wants("console") { 100 } else { 0 };

        let otlp = endpoint.map(|endpoint| OtlpConfig {
            protocol: self.otlp_protocol.or(protocol).unwrap_or(Protocol::Grpc),
            endpoint,
            headers: self.otlp_headers.clone().unwrap_or(headers),
            timeout: Duration::from_millis(timeout.unwrap_or(default::OTLP_TIMEOUT_MS)),
            gzip: self.otlp_gzip.or(gzip).unwrap_or(false),
            certificate: self
                .otlp_certificate
                .clone()
                .or(certificate.map(PathBuf::from)),
            histogram: self.otlp_histogram.or(histogram).unwrap_or_default(),
        });
        if let Some(o) = &otlp
            && o.certificate.is_some()
            && !o.endpoint.starts_with("https://")
        {
            return Err(ConfigError::Conflict(format!(
                "{} is set but {}={} is not an https:// endpoint",
                env::OTEL_EXPORTER_OTLP_CERTIFICATE,
                env::OTEL_EXPORTER_OTLP_ENDPOINT,
                o.endpoint
            )));
        }

        let trace_every = self
            .trace_every
            .or(trace_every)
            .unwrap_or(default::TRACE_EVERY);
        let queue = self.queue.or(queue).unwrap_or(default::QUEUE);
        if !(64..=1 << 24).contains(&queue) {
            return Err(invalid(
                "queue",
                &queue.to_string(),
                "a whole number of records from 64 to 16777216",
            ));
        }
        Ok(Config {
            level: self.level.or(level).unwrap_or_default(),
            spec_level: self.spec_level.or(spec_level).unwrap_or_default(),
            trace_every,
            graph_read_every: self
                .graph_read_every
                .or(graph_read_every)
                .unwrap_or(default::GRAPH_READ_EVERY),
            layer_attr: self.layer_attr.or(layer_attr).unwrap_or(true),
            summary_every: self
                .summary_every
                .or(summary_every)
                .unwrap_or(summary_default),
            spec_summary_every: self.spec_summary_every.or(spec_summary_every).unwrap_or(0),
            prometheus,
            queue,
            rank,
            expert_counter: self.expert_counter.or(expert_counter).unwrap_or(false),
            timing: self.timing.or(timing).unwrap_or_default(),
            sdk_disabled,
            service_name: self
                .service_name
                .clone()
                .or(service_name)
                .unwrap_or_else(|| default::SERVICE_NAME.to_owned()),
            resource_attributes,
            traces_otlp,
            traces_console: traces_exporter.as_deref() == Some("console"),
            metrics_otlp,
            otlp,
            metric_export_interval: self.metric_export_interval.unwrap_or(Duration::from_millis(
                interval.unwrap_or(default::METRIC_EXPORT_INTERVAL_MS),
            )),
            shutdown_timeout: self
                .shutdown_timeout
                .unwrap_or(Duration::from_millis(default::SHUTDOWN_TIMEOUT_MS)),
            origins,
            alias_warnings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(b: &ConfigBuilder, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: BTreeMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        b.resolve_with(|k| map.get(k).cloned())
    }

    fn env(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        resolve(&ConfigBuilder::default(), vars)
    }

    #[test]
    fn defaults_are_off_with_the_embedded_prometheus_endpoint() {
        let c = env(&[]).unwrap();
        assert_eq!(c.level, Level::Off);
        assert_eq!(c.spec_level, SpecLevel::Off);
        assert_eq!(c.trace_every, 100);
        assert_eq!(c.graph_read_every, 1, "every CUDA-graph replay is read");
        assert!(c.layer_attr);
        assert_eq!(c.summary_every, 0);
        assert_eq!(c.prometheus, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(c.queue, 65_536);
        assert_eq!(c.rank, 0);
        assert_eq!(c.timing, Timing::Host);
        assert_eq!(c.service_name, "phasetrace");
        assert!(c.otlp.is_none());
        assert!(!c.is_enabled());
        assert!(c.origins.is_empty());
    }

    #[test]
    fn every_variable_parses_its_valid_values() {
        let c = env(&[
            ("PHASETRACE_LEVEL", "collectives"),
            ("PHASETRACE_SPEC_LEVEL", "2"),
            ("PHASETRACE_TRACE_EVERY", "0"),
            ("PHASETRACE_LAYER_ATTR", "off"),
            ("PHASETRACE_SUMMARY_EVERY", "8"),
            ("PHASETRACE_SPEC_SUMMARY_EVERY", "16"),
            ("PHASETRACE_PROMETHEUS", "127.0.0.1:9999"),
            ("PHASETRACE_QUEUE", "1024"),
            ("PHASETRACE_RANK", "3"),
            ("PHASETRACE_EXPERT_COUNTER", "on"),
            ("PHASETRACE_TIMING", "events"),
            ("OTEL_SERVICE_NAME", "engine"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod,host.gpu=h200",
            ),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cr%3Dt"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            (
                "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                "base2_exponential_bucket_histogram",
            ),
            ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_METRICS_EXPORTER", "otlp,prometheus"),
        ])
        .unwrap();
        assert_eq!(c.level, Level::Collectives);
        assert_eq!(c.spec_level, SpecLevel::VerifySplit);
        assert_eq!(c.trace_every, 0);
        assert!(!c.layer_attr);
        assert_eq!(c.summary_every, 8);
        assert_eq!(c.spec_summary_every, 16);
        assert_eq!(c.prometheus, Some("127.0.0.1:9999".parse().unwrap()));
        assert_eq!(c.queue, 1024);
        assert_eq!(c.rank, 3);
        assert!(c.expert_counter);
        assert_eq!(c.timing, Timing::Events);
        assert_eq!(c.service_name, "engine");
        assert_eq!(c.resource_attributes.len(), 2);
        let o = c.otlp.as_ref().unwrap();
        assert_eq!(o.endpoint, "http://127.0.0.1:4318");
        assert_eq!(o.protocol, Protocol::HttpProtobuf);
        assert_eq!(o.headers, vec![("api-key".into(), "s3cr=t".into())]);
        assert_eq!(o.timeout, Duration::from_millis(2500));
        assert!(o.gzip);
        assert_eq!(o.histogram, HistogramAggregation::Exponential);
        assert_eq!(c.metric_export_interval, Duration::from_millis(500));
        assert!(c.traces_otlp && c.metrics_otlp);
        assert_eq!(c.origins.get("PHASETRACE_LEVEL"), Some(&Origin::Env));
        assert!(!format!("{c:?}").contains("s3cr"), "headers leak in Debug");
    }

    #[test]
    fn every_invalid_value_names_the_variable_value_and_what_is_accepted() {
        let cases: &[(&str, &str, &str)] = &[
            ("PHASETRACE_LEVEL", "7", "off, 0, full, 1, collectives or 2"),
            ("PHASETRACE_SPEC_LEVEL", "3", "off, 0, 1"),
            ("PHASETRACE_TRACE_EVERY", "-1", "whole number"),
            (
                "PHASETRACE_GRAPH_READ_EVERY",
                "all",
                "a whole number of replays (1 = every replay, 0 = none)",
            ),
            ("PHASETRACE_LAYER_ATTR", "maybe", "on, off"),
            ("PHASETRACE_SUMMARY_EVERY", "x", "whole number"),
            ("PHASETRACE_SPEC_SUMMARY_EVERY", "1.5", "whole number"),
            ("PHASETRACE_PROMETHEUS", "nowhere", "host:port"),
            ("PHASETRACE_QUEUE", "10", "64 to 16777216"),
            ("PHASETRACE_RANK", "first", "whole number"),
            ("RANK", "-2", "whole number"),
            ("PHASETRACE_EXPERT_COUNTER", "2", "on, off"),
            ("PHASETRACE_TIMING", "gpu", "host, sync or events"),
            ("OTEL_SDK_DISABLED", "yes", "true or false"),
            ("OTEL_RESOURCE_ATTRIBUTES", "novalue", "key=value"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317", "http://"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:99999", "http://"),
            (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                "http/json",
                "grpc or http/protobuf",
            ),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "0", "milliseconds"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd", "gzip or none"),
            (
                "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                "sum",
                "explicit_bucket_histogram",
            ),
            ("OTEL_METRIC_EXPORT_INTERVAL", "soon", "milliseconds"),
            ("OTEL_TRACES_EXPORTER", "jaeger", "otlp, console or none"),
            ("OTEL_METRICS_EXPORTER", "otlp,statsd", "otlp, prometheus"),
        ];
        for (var, value, expected) in cases {
            let err = env(&[(var, value)]).unwrap_err();
            let msg = err.to_string();
            assert!(msg.starts_with(&format!("{var}=")), "{var}: {msg}");
            assert!(msg.contains(value), "{var}: {msg}");
            assert!(msg.contains(expected), "{var}: {msg}");
        }
    }

    #[test]
    fn malformed_headers_never_echo_their_values() {
        let err = env(&[("OTEL_EXPORTER_OTLP_HEADERS", "api-key:topsecret")]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{msg}");
        assert!(!msg.contains("topsecret"), "{msg}");
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_values_are_errors_naming_the_variable() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0x66, 0xff, 0x6f]);
        let err = ConfigBuilder::default()
            .resolve_with(|k| (k == "PHASETRACE_LEVEL").then(|| bad.clone()))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "PHASETRACE_LEVEL is not valid UTF-8: expected off, 0, full, 1, collectives or 2"
        );
    }

    #[test]
    fn code_beats_env_and_records_its_origin() {
        let b = ConfigBuilder {
            level: Some(Level::Full),
            rank: Some(7),
            ..Default::default()
        };
        let c = resolve(&b, &[("PHASETRACE_LEVEL", "2"), ("PHASETRACE_RANK", "1")]).unwrap();
        assert_eq!(c.level, Level::Full);
        assert_eq!(c.rank, 7);
        assert_eq!(c.origins.get("PHASETRACE_LEVEL"), Some(&Origin::Code));
    }

    #[test]
    fn rank_falls_back_to_launcher_variables_and_explicit_wins() {
        assert_eq!(env(&[("LOCAL_RANK", "5")]).unwrap().rank, 5);
        assert_eq!(env(&[("RANK", "2"), ("LOCAL_RANK", "5")]).unwrap().rank, 2);
        assert_eq!(
            env(&[("PHASETRACE_RANK", "1"), ("RANK", "2")])
                .unwrap()
                .rank,
            1
        );
    }

    #[test]
    fn legacy_alias_is_honored_and_the_phasetrace_name_wins_loudly() {
        let b = ConfigBuilder {
            aliases: vec![("METRALE_GLM_PROFILE".into(), env::LEVEL)],
            ..Default::default()
        };
        let alone = resolve(&b, &[("METRALE_GLM_PROFILE", "2")]).unwrap();
        assert_eq!(alone.level, Level::Collectives);
        assert!(alone.alias_warnings.is_empty());
        let both = resolve(
            &b,
            &[("METRALE_GLM_PROFILE", "2"), ("PHASETRACE_LEVEL", "1")],
        )
        .unwrap();
        assert_eq!(both.level, Level::Full);
        assert_eq!(both.alias_warnings.len(), 1);
        assert!(
            both.alias_warnings[0].contains("PHASETRACE_LEVEL=1 overrides METRALE_GLM_PROFILE=2")
        );
        let agree = resolve(
            &b,
            &[("METRALE_GLM_PROFILE", "1"), ("PHASETRACE_LEVEL", "full")],
        )
        .unwrap();
        assert!(agree.alias_warnings.is_empty());
        let bad = resolve(&b, &[("METRALE_GLM_PROFILE", "yes")]).unwrap_err();
        assert!(bad.to_string().starts_with("METRALE_GLM_PROFILE=\"yes\""));
    }

    #[test]
    fn a_spec_level_alias_set_to_another_level_loses_loudly() {
        let b = ConfigBuilder {
            aliases: vec![("MEMRA_SPEC_TRACE".into(), env::SPEC_LEVEL)],
            ..Default::default()
        };
        let c = resolve(
            &b,
            &[("MEMRA_SPEC_TRACE", "1"), ("PHASETRACE_SPEC_LEVEL", "2")],
        )
        .unwrap();
        assert_eq!(c.spec_level, SpecLevel::VerifySplit);
        assert_eq!(
            c.alias_warnings,
            vec![
                "phasetrace: PHASETRACE_SPEC_LEVEL=2 overrides MEMRA_SPEC_TRACE=1 (the phasetrace name wins; unset one to silence this)"
            ]
        );
        let alone = resolve(&b, &[("MEMRA_SPEC_TRACE", "2")]).unwrap();
        assert_eq!(alone.spec_level, SpecLevel::VerifySplit);
    }

    #[test]
    fn a_prometheus_port_can_be_offset_by_the_rank() {
        let c = env(&[
            ("PHASETRACE_PROMETHEUS", "127.0.0.1:9464+rank"),
            ("LOCAL_RANK", "3"),
        ])
        .unwrap();
        assert_eq!(c.prometheus, Some("127.0.0.1:9467".parse().unwrap()));
        let err = env(&[
            ("PHASETRACE_PROMETHEUS", "127.0.0.1:65535+rank"),
            ("RANK", "1"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("host:port+rank"), "{err}");
    }

    #[test]
    fn an_otlp_endpoint_turns_the_embedded_prometheus_default_off() {
        let c = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")]).unwrap();
        assert!(c.prometheus.is_none());
        assert!(c.traces_otlp && c.metrics_otlp);
        assert_eq!(c.otlp.unwrap().protocol, Protocol::Grpc);
        let off = env(&[("PHASETRACE_PROMETHEUS", "off")]).unwrap();
        assert!(off.prometheus.is_none());
        let err = env(&[("OTEL_TRACES_EXPORTER", "otlp")]).unwrap_err();
        assert!(err.to_string().contains("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let console = env(&[("OTEL_METRICS_EXPORTER", "console")]).unwrap();
        assert_eq!(console.summary_every, 100);
    }
}
