//! Configuration: defaults, then the environment, then code. One parse, one error type.
//!
//! ```text
//! settings::SETTINGS (each setting once: variable, accepted values, default, parser, doc)
//!   defaults ──> environment (PHASETRACE_*, OTEL_*, fallbacks, legacy aliases)
//!            ──> code (builder setters, CLI flags) ──> Config (+ where each value came from)
//! ```
//!
//! Every invalid value is a [`ConfigError`] naming the variable, the value and what is accepted.
//! Header values are secrets: they never appear in errors, `Debug` output or `check`.
//! [`settings`] says how to add a setting: one declaration in `config/table.rs`.

#[cfg(test)]
mod secret_tests;
pub mod settings;
mod table;
#[cfg(feature = "transport")]
mod transport;

pub use table::Config;

use crate::names::env;
use settings::{AnySetting, Setting, SettingValue};
use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// What a setting accepts: the error of parsing one value, without the variable's name, so that
/// a flag's error and a variable's error say the same (`expected off, 0, full, 1, ...`).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("expected {0}")]
pub struct Expected(pub String);

/// The first of a list of literals.
macro_rules! first {
    ($a:literal $(, $rest:literal)*) => {
        $a
    };
}

/// `FromStr` (case-insensitive, every spelling listed), `Display` and `as_str` (the first
/// spelling, which `FromStr` reads back), `ALL` and `EXPECTED` for a closed set of values.
macro_rules! closed_set {
    ($ty:ident, $expected:literal, { $($variant:ident => [$($spelling:literal),+]),+ $(,)? }) => {
        impl $ty {
            /// Every value.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];
            /// What the setting accepts, as errors and `--help` say it.
            pub const EXPECTED: &'static str = $expected;

            /// The spelling that `Display` writes, `check` prints and `FromStr` reads back.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => first!($($spelling),+)),+
                }
            }
        }

        impl FromStr for $ty {
            type Err = Expected;

            fn from_str(s: &str) -> Result<Self, Expected> {
                let s = s.trim();
                $(
                    if [$($spelling),+].iter().any(|x| x.eq_ignore_ascii_case(s)) {
                        return Ok($ty::$variant);
                    }
                )+
                Err(Expected($expected.to_owned()))
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// Which sections are recorded (`PHASETRACE_LEVEL`).
///
/// Named `SectionLevel`, beside [`SpecLevel`], so that a file importing it and `tracing::Level`
/// needs no rename:
///
/// ```
/// use phasetrace::{Profiler, SectionLevel};
/// use tracing::Level;
///
/// let profiler = Profiler::builder()
///     .without_env()
///     .without_prometheus()
///     .with_level(SectionLevel::Collectives)
///     .build()?;
/// tracing::event!(Level::INFO, recording = profiler.is_enabled());
/// profiler.shutdown();
/// # Ok::<(), phasetrace::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SectionLevel {
    /// Nothing is recorded: every hot-path call is one relaxed load.
    #[default]
    Off,
    /// Every section.
    Full,
    /// Only collectives, their enqueue and their rendezvous probe.
    Collectives,
}

impl SectionLevel {
    pub(crate) const fn as_u8(self) -> u8 {
        match self {
            SectionLevel::Off => 0,
            SectionLevel::Full => 1,
            SectionLevel::Collectives => 2,
        }
    }

    /// The inverse of [`SectionLevel::as_u8`]; values above 2 read as `Collectives`.
    pub(crate) const fn from_u8(v: u8) -> SectionLevel {
        match v {
            0 => SectionLevel::Off,
            1 => SectionLevel::Full,
            _ => SectionLevel::Collectives,
        }
    }
}

closed_set!(SectionLevel, "off, 0, full, 1, collectives or 2", {
    Off => ["off", "0"],
    Full => ["full", "1"],
    Collectives => ["collectives", "2"],
});

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

closed_set!(SpecLevel, "off, 0, phases, 1, verify or 2 (phases and the verify sub-split)", {
    Off => ["off", "0"],
    Phases => ["phases", "1"],
    VerifySplit => ["verify", "2"],
});

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

closed_set!(Timing, "host, sync or events", {
    Host => ["host"],
    Sync => ["sync"],
    Events => ["events"],
});

/// Where host-clock boundaries are read from (`PHASETRACE_HOST_CLOCK`); see
/// [`crate::timing::host_source`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HostSourceChoice {
    /// The invariant TSC where the CPU and the kernel make it usable, else the monotonic clock.
    #[default]
    Auto,
    /// The TSC, or the profiler fails to build, saying why the TSC cannot be used.
    Tsc,
    /// The OS monotonic clock, TSC or not (a VM whose TSC rate may change on live migration).
    Monotonic,
}

closed_set!(HostSourceChoice, "auto, tsc or monotonic", {
    Auto => ["auto"],
    Tsc => ["tsc"],
    Monotonic => ["monotonic"],
});

/// OTLP transport (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP over gRPC (port 4317 by convention).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318 by convention).
    HttpProtobuf,
}

closed_set!(Protocol, "grpc or http/protobuf", {
    Grpc => ["grpc"],
    HttpProtobuf => ["http/protobuf"],
});

/// Histogram aggregation for OTLP metrics
/// (`OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HistogramAggregation {
    /// Explicit buckets, 1 µs to 10 s log-spaced.
    #[default]
    Explicit,
    /// Base-2 exponential buckets.
    Exponential,
}

closed_set!(HistogramAggregation, "explicit_bucket_histogram or base2_exponential_bucket_histogram", {
    Explicit => ["explicit_bucket_histogram"],
    Exponential => ["base2_exponential_bucket_histogram"],
});

/// Compression of OTLP request bodies (`OTEL_EXPORTER_OTLP_COMPRESSION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compression {
    /// Uncompressed.
    #[default]
    None,
    /// gzip.
    Gzip,
}

closed_set!(Compression, "gzip or none", {
    None => ["none"],
    Gzip => ["gzip"],
});

impl Compression {
    pub(crate) fn from_gzip(gzip: bool) -> Compression {
        if gzip {
            Compression::Gzip
        } else {
            Compression::None
        }
    }
}

/// Where spans go (`OTEL_TRACES_EXPORTER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TracesExporter {
    /// OTLP, to `OTEL_EXPORTER_OTLP_ENDPOINT`.
    Otlp,
    /// One line per span on stderr.
    Console,
    /// Nowhere: no spans are built.
    None,
}

closed_set!(TracesExporter, "otlp, console or none", {
    Otlp => ["otlp"],
    Console => ["console"],
    None => ["none"],
});

/// Which steps and rounds are traced besides one in `PHASETRACE_TRACE_EVERY`
/// (`PHASETRACE_TRACE_SLOWER_THAN`): decided on the worker once the step has ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TraceSlowerThan {
    /// No tail traces: only the head-sampled steps.
    Off,
    /// Steps (and rounds) that took longer than this.
    Duration(Duration),
    /// Steps slower than this percentile (above 0, below 100) of the rank's last
    /// [`TraceSlowerThan::WINDOW`] steps (rounds: of its recent rounds); `p99` is the default.
    Percentile(f64),
}

impl Default for TraceSlowerThan {
    fn default() -> Self {
        TraceSlowerThan::Percentile(crate::names::default::TRACE_SLOWER_THAN_PERCENTILE)
    }
}

impl TraceSlowerThan {
    /// What `PHASETRACE_TRACE_SLOWER_THAN` accepts.
    pub const EXPECTED: &'static str = "a duration with a unit (25ms, 1.5s, 800us), a percentile of this rank's recent steps from p0.1 to p99.9 (p99), or off";

    /// What the request thresholds (`PHASETRACE_TRACE_REQUESTS_TTFT_OVER`, `..._TPOT_OVER`)
    /// accept.
    pub const EXPECTED_REQUESTS: &'static str = "a duration with a unit (500ms, 1.5s), a percentile of recent requests from p0.1 to p99.9 (p99), or off";

    /// How many recent steps (or rounds) of a rank a percentile is taken over.
    pub const WINDOW: usize = 1000;
}

impl FromStr for TraceSlowerThan {
    type Err = Expected;

    fn from_str(s: &str) -> Result<TraceSlowerThan, Expected> {
        let bad = || Expected(TraceSlowerThan::EXPECTED.to_owned());
        let t = s.trim().to_ascii_lowercase();
        if t == "off" {
            return Ok(TraceSlowerThan::Off);
        }
        if let Some(q) = t.strip_prefix('p') {
            let q: f64 = q.parse().map_err(|_| bad())?;
            return if q.is_finite() && q > 0.0 && q < 100.0 {
                Ok(TraceSlowerThan::Percentile(q))
            } else {
                Err(bad())
            };
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, unit) = t.split_at(split);
        let per_second = match unit {
            "ns" => 1e9,
            "us" | "µs" => 1e6,
            "ms" => 1e3,
            "s" => 1.0,
            _ => return Err(bad()),
        };
        let v: f64 = num.parse().map_err(|_| bad())?;
        let d = Duration::try_from_secs_f64(v / per_second).map_err(|_| bad())?;
        if d.is_zero() {
            return Err(bad());
        }
        Ok(TraceSlowerThan::Duration(d))
    }
}

impl fmt::Display for TraceSlowerThan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceSlowerThan::Off => f.write_str("off"),
            TraceSlowerThan::Duration(d) => write!(f, "{d:?}"),
            TraceSlowerThan::Percentile(q) => write!(f, "p{q}"),
        }
    }
}

/// Where metrics go (`OTEL_METRICS_EXPORTER`): a comma list, `none` for the empty set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MetricsExporters {
    /// Pushed over OTLP.
    pub otlp: bool,
    /// Served on the embedded Prometheus endpoint.
    pub prometheus: bool,
    /// The console summary table.
    pub console: bool,
}

impl MetricsExporters {
    /// What the setting accepts.
    pub const EXPECTED: &'static str = "a comma list of otlp, prometheus, console, none";
}

impl FromStr for MetricsExporters {
    type Err = Expected;

    fn from_str(s: &str) -> Result<Self, Expected> {
        let mut m = MetricsExporters::default();
        for item in s.split(',') {
            match item.trim().to_ascii_lowercase().as_str() {
                "otlp" => m.otlp = true,
                "prometheus" => m.prometheus = true,
                "console" => m.console = true,
                "none" => {}
                _ => return Err(Expected(Self::EXPECTED.to_owned())),
            }
        }
        Ok(m)
    }
}

impl fmt::Display for MetricsExporters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v: Vec<&str> = [
            (self.otlp, "otlp"),
            (self.prometheus, "prometheus"),
            (self.console, "console"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if v.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&v.join(","))
        }
    }
}

/// The embedded Prometheus endpoint's listen address (`PHASETRACE_PROMETHEUS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listen {
    /// No endpoint.
    Off,
    /// Listen on this address.
    At(SocketAddr),
    /// Listen on this address with the port offset by the rank (`host:port+rank`), so that
    /// several ranks on one host each get their own endpoint.
    PerRank(SocketAddr),
}

impl Listen {
    /// What the setting accepts.
    pub const EXPECTED: &'static str =
        "a listen address host:port (127.0.0.1:9464), host:port+rank (one port per rank), or off";

    /// The built-in default, `127.0.0.1:9464` (plus `LOCAL_RANK` when a launcher sets it), used
    /// when metrics are pushed nowhere else.
    pub const fn builtin() -> Listen {
        Listen::At(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            crate::names::default::PROMETHEUS_PORT,
        ))
    }

    /// The address for `rank`, `None` when off; `Err` when the port plus the rank overflows.
    fn for_rank(self, rank: u32) -> Result<Option<SocketAddr>, ()> {
        match self {
            Listen::Off => Ok(None),
            Listen::At(a) => Ok(Some(a)),
            Listen::PerRank(mut a) => {
                let port = u32::from(a.port()).checked_add(rank).ok_or(())?;
                a.set_port(u16::try_from(port).map_err(drop)?);
                Ok(Some(a))
            }
        }
    }
}

impl FromStr for Listen {
    type Err = Expected;

    fn from_str(s: &str) -> Result<Self, Expected> {
        let s = s.trim();
        let bad = || Expected(Self::EXPECTED.to_owned());
        if s.eq_ignore_ascii_case("off") {
            return Ok(Listen::Off);
        }
        match s.strip_suffix("+rank") {
            Some(base) => parse_listen(base).map(Listen::PerRank).ok_or_else(bad),
            None => parse_listen(s).map(Listen::At).ok_or_else(bad),
        }
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Off => f.write_str("off"),
            Listen::At(a) => write!(f, "{a}"),
            Listen::PerRank(a) => write!(f, "{a}+rank"),
        }
    }
}

impl From<SocketAddr> for Listen {
    fn from(a: SocketAddr) -> Listen {
        Listen::At(a)
    }
}

/// The OTLP exporter's settings.
#[derive(Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The endpoint: for the general connection ([`Config::otlp`]) the base URL
    /// (`http(s)://host:port`); for a signal ([`Config::traces_otlp`], [`Config::metrics_otlp`])
    /// the URL its exporter sends to (for http/protobuf with the signal's path, `/v1/traces`).
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
struct Signal {
    name: &'static str,
    path: &'static str,
    endpoint: &'static settings::Setting<Option<String>>,
    protocol: &'static settings::Setting<Option<Protocol>>,
    headers: &'static settings::Setting<Option<Vec<(String, String)>>>,
    timeout: &'static settings::Setting<Option<Duration>>,
    compression: &'static settings::Setting<Option<Compression>>,
    certificate: &'static settings::Setting<Option<PathBuf>>,
}

const TRACES: Signal = Signal {
    name: "traces",
    path: "/v1/traces",
    endpoint: &settings::TRACES_ENDPOINT,
    protocol: &settings::TRACES_PROTOCOL,
    headers: &settings::TRACES_HEADERS,
    timeout: &settings::TRACES_TIMEOUT,
    compression: &settings::TRACES_COMPRESSION,
    certificate: &settings::TRACES_CERTIFICATE,
};

const METRICS: Signal = Signal {
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

/// Where a resolved setting came from, as `phasetrace check` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default.
    Default,
    /// An environment variable (or a fallback or legacy alias of one).
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
#[non_exhaustive]
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

impl Config {
    /// Resolves defaults and the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        ConfigBuilder::default().resolve_with(|k| std::env::var_os(k))
    }

    /// Whether anything is recorded at all.
    pub fn is_enabled(&self) -> bool {
        !self.sdk_disabled && (self.level != SectionLevel::Off || self.spec_level != SpecLevel::Off)
    }

    /// Where the setting of variable `var` came from.
    pub fn origin(&self, var: &str) -> Origin {
        self.origins.get(var).copied().unwrap_or(Origin::Default)
    }
}

/// A value set in code, type-erased; its [`Setting`] knows the type.
type CodeValue = Arc<dyn Any + Send + Sync>;

/// Settings made in code; they beat the environment. Built by [`crate::ProfilerBuilder`].
#[derive(Clone, Default)]
pub(crate) struct ConfigBuilder {
    /// Values set in code, by variable.
    code: BTreeMap<&'static str, CodeValue>,
    /// A value given in code that did not parse, reported by `resolve_with`.
    deferred: Option<ConfigError>,
    /// (alias variable, the phasetrace variable it stands for)
    pub(crate) aliases: Vec<(String, &'static str)>,
    /// The engine gave a provider of its own (meter, tracer or both): the process's `OTEL_*`
    /// variables are its SDK's, never read here, and no exporter of phasetrace's is on by
    /// default (only code or a `PHASETRACE_*` setting starts one).
    pub(crate) embedded: bool,
}

impl ConfigBuilder {
    /// Sets `setting` in code.
    pub(crate) fn set<T: SettingValue>(&mut self, setting: &Setting<T>, value: T) {
        self.code.insert(setting.var, Arc::new(value));
    }

    /// Sets a setting in code from its text, as its variable would read it.
    pub(crate) fn set_text(
        &mut self,
        setting: &'static dyn AnySetting,
        text: &str,
    ) -> Result<(), ConfigError> {
        let v = setting.parse_any(text).map_err(|e| ConfigError::Invalid {
            var: format!("{} set in code", setting.var()),
            value: echoed(setting.secret(), text),
            expected: e.0,
        })?;
        self.code.insert(setting.var(), v);
        Ok(())
    }

    /// Keeps the first error of a value given in code for `resolve_with`.
    pub(crate) fn defer(&mut self, e: ConfigError) {
        self.deferred.get_or_insert(e);
    }
}

impl fmt::Debug for ConfigBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (var, v) in &self.code {
            match settings::find(var) {
                Some(s) => m.entry(var, &s.show_any(v.as_ref())),
                None => m.entry(var, &"?"),
            };
        }
        m.finish()
    }
}

/// Where values come from while resolving: code, then the environment; records origins.
struct Sources<'a> {
    env: &'a dyn Fn(&str) -> Option<OsString>,
    /// `OTEL_*` variables are not read (see [`ConfigBuilder::embedded`]).
    embedded: bool,
    code: &'a BTreeMap<&'static str, CodeValue>,
    aliases: &'a [(String, &'static str)],
    origins: BTreeMap<&'static str, Origin>,
    alias_warnings: Vec<String>,
}

impl Sources<'_> {
    /// The trimmed text of `var`, `None` when unset or empty.
    fn text(&self, var: &str, expected: &str) -> Result<Option<String>, ConfigError> {
        if self.embedded && var.starts_with("OTEL_") {
            return Ok(None);
        }
        match (self.env)(var) {
            None => Ok(None),
            Some(v) => match v.into_string() {
                Ok(s) if s.trim().is_empty() => Ok(None),
                Ok(s) => Ok(Some(s.trim().to_owned())),
                Err(_) => Err(ConfigError::NotUnicode {
                    var: var.to_owned(),
                    expected: expected.to_owned(),
                }),
            },
        }
    }

    fn parse<T: SettingValue>(s: &Setting<T>, var: &str, text: &str) -> Result<T, ConfigError> {
        s.parse(text).map_err(|e| ConfigError::Invalid {
            var: var.to_owned(),
            // Never echo secrets: header values carry API keys.
            value: echoed(s.secret, text),
            expected: e.0,
        })
    }

    /// The environment's value of `s`: its variable, else its fallbacks in order; legacy
    /// aliases are honored when the variable is unset, and a disagreement is noted.
    fn env<T: SettingValue>(&mut self, s: &Setting<T>) -> Result<Option<T>, ConfigError> {
        let mut found = None;
        for var in std::iter::once(&s.var).chain(s.fallbacks) {
            if let Some(text) = self.text(var, s.expected)? {
                found = Some((Self::parse(s, var, &text)?, text));
                break;
            }
        }
        for (alias, target) in self.aliases {
            if *target != s.var {
                continue;
            }
            let Some(raw) = self.text(alias, s.expected)? else {
                continue;
            };
            let v = Self::parse(s, alias, &raw)?;
            match &found {
                None => found = Some((v, raw)),
                Some((g, text)) if *g != v => self.alias_warnings.push(format!(
                    "{target}={} overrides {alias}={} (the phasetrace name wins; unset one to silence this)",
                    echoed(s.secret, text),
                    echoed(s.secret, &raw),
                )),
                Some(_) => {}
            }
        }
        Ok(found.map(|(v, _)| v))
    }

    /// The value of `s` set in code, else in the environment (parsed either way: a bad value
    /// is an error even when code overrides it), `None` when neither sets it.
    fn get<T: SettingValue>(&mut self, s: &Setting<T>) -> Result<Option<T>, ConfigError> {
        let env = self.env(s)?;
        if let Some(v) = self.code.get(s.var).and_then(|v| v.downcast_ref::<T>()) {
            s.check_code_value(v).map_err(|e| ConfigError::Invalid {
                var: format!("{} set in code", s.var),
                value: echoed(s.secret, &s.show(v)),
                expected: e.0,
            })?;
            self.origins.insert(s.var, Origin::Code);
            return Ok(Some(v.clone()));
        }
        // A value that stands for the variable unset (`(none)`: a per-signal header list with
        // no entries) keeps the default's origin, as `check` prints it.
        if env.as_ref().is_some_and(|v| (s.show)(v).is_some()) {
            self.origins.insert(s.var, Origin::Env);
        }
        Ok(env)
    }

    /// The value of `s`: code, else the environment, else its default.
    fn value<T: SettingValue>(&mut self, s: &Setting<T>) -> Result<T, ConfigError> {
        Ok(self.get(s)?.unwrap_or_else(|| s.default_value()))
    }

    /// The per-signal OTLP settings of `sig` as given (unset: `None`).
    fn signal_given(&mut self, sig: &Signal) -> Result<SignalGiven, ConfigError> {
        Ok(SignalGiven {
            endpoint: self.value(sig.endpoint)?,
            protocol: self.value(sig.protocol)?,
            headers: self.value(sig.headers)?,
            timeout: self.value(sig.timeout)?,
            compression: self.value(sig.compression)?,
            certificate: self.value(sig.certificate)?,
        })
    }

    /// The built-in Prometheus address: `127.0.0.1:9464`, the port offset by `LOCAL_RANK` when
    /// a launcher set it, so that the ranks of one host each get their own without
    /// configuration.
    fn builtin_listen(&self) -> Result<Listen, ConfigError> {
        let expected = "a whole number from 0 to 56071 (the launcher's rank on this host)";
        let Some(text) = self.text(env::LOCAL_RANK, expected)? else {
            return Ok(Listen::builtin());
        };
        let mut a = match Listen::builtin() {
            Listen::At(a) => a,
            other => return Ok(other),
        };
        let port = text
            .parse::<u16>()
            .ok()
            .and_then(|n| a.port().checked_add(n))
            .ok_or_else(|| invalid(env::LOCAL_RANK, &text, expected))?;
        a.set_port(port);
        Ok(Listen::At(a))
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

/// `text` as an error, a warning or `check` may echo it: credentials in a URL
/// (`scheme://user:password@host`) masked as `user:****@`, a user alone as `****@`. Applied
/// to every value echoed that is not a secret already (secrets are not echoed at all).
pub fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out += head;
        let end = tail.find(['/', '?', '#']).unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.split_once(':') {
                    Some((user, _)) => {
                        out += user;
                        out += ":****";
                    }
                    None => out += "****",
                }
                out += &authority[at..];
            }
            None => out += authority,
        }
        rest = &tail[end..];
    }
    out += rest;
    out
}

/// A value as an error or a warning echoes it: `<masked>` for a secret setting, otherwise
/// with the credentials of a URL masked ([`redact_credentials`]).
pub(crate) fn echoed(secret: bool, text: &str) -> String {
    if secret {
        "<masked>".to_owned()
    } else {
        redact_credentials(text)
    }
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
struct OtlpGeneral {
    endpoint: Option<String>,
    protocol: Protocol,
    headers: Vec<(String, String)>,
    timeout: Duration,
    compression: Compression,
    certificate: Option<PathBuf>,
    histogram: HistogramAggregation,
}

impl OtlpGeneral {
    fn read(src: &mut Sources<'_>) -> Result<OtlpGeneral, ConfigError> {
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
    fn config(&self) -> Option<OtlpConfig> {
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
    fn for_signal(&self, sig: &Signal, given: &SignalGiven) -> Option<OtlpConfig> {
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
fn check_otlp(
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

impl ConfigBuilder {
    /// Resolves defaults, then `get` (the environment), then the settings in code.
    pub(crate) fn resolve_with(
        &self,
        get: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Config, ConfigError> {
        use settings as s;
        if let Some(e) = &self.deferred {
            return Err(e.clone());
        }
        for (alias, target) in &self.aliases {
            if settings::find(target).is_none() {
                return Err(ConfigError::Conflict(format!(
                    "legacy alias {alias} stands for {target}, which is not a phasetrace variable"
                )));
            }
        }
        let mut src = Sources {
            env: &get,
            embedded: self.embedded,
            code: &self.code,
            aliases: &self.aliases,
            origins: BTreeMap::new(),
            alias_warnings: Vec::new(),
        };

        // Every setting with a `Config` field, in the table's order; then those combined here.
        let plain = table::Plain::read(&mut src)?;
        let summary_every = src.get(&s::SUMMARY_EVERY)?;
        let prometheus = src.get(&s::PROMETHEUS)?;
        let otlp = OtlpGeneral::read(&mut src)?;
        let traces_exporter = src.get(&s::TRACES_EXPORTER)?;
        let shutdown_timeout = src.value(&s::SHUTDOWN_TIMEOUT)?;
        let metrics_exporters = src.get(&s::METRICS_EXPORTER)?;

        let mut given_traces = src.signal_given(&TRACES)?;
        let mut given_metrics = src.signal_given(&METRICS)?;
        // `with_otlp_endpoint(None)` means no OTLP: a signal's endpoint from the environment
        // does not bring it back (one set in code for that signal does).
        if otlp.endpoint.is_none() && src.origins.get(s::OTLP_ENDPOINT.var) == Some(&Origin::Code) {
            for (sig, given) in [(&TRACES, &mut given_traces), (&METRICS, &mut given_metrics)] {
                if src.origins.get(sig.endpoint.var) == Some(&Origin::Env) {
                    given.endpoint = None;
                    src.origins.remove(sig.endpoint.var);
                }
            }
        }
        let traces_endpoint = otlp.for_signal(&TRACES, &given_traces);
        let metrics_endpoint = otlp.for_signal(&METRICS, &given_metrics);

        let metrics_explicit = metrics_exporters.is_some();
        let metrics = metrics_exporters.unwrap_or(MetricsExporters {
            otlp: metrics_endpoint.is_some(),
            ..MetricsExporters::default()
        });
        let traces_on = match traces_exporter {
            Some(t) => t == TracesExporter::Otlp,
            None => traces_endpoint.is_some(),
        };
        for (on, sig, e, var) in [
            (
                traces_on,
                &TRACES,
                &traces_endpoint,
                env::OTEL_TRACES_EXPORTER,
            ),
            (
                metrics.otlp,
                &METRICS,
                &metrics_endpoint,
                env::OTEL_METRICS_EXPORTER,
            ),
        ] {
            if on && e.is_none() {
                return Err(ConfigError::Conflict(format!(
                    "OTLP export of {} is selected ({var}) but neither {} nor {} is set: set one, \
                     or select another exporter",
                    sig.name,
                    sig.endpoint.var,
                    env::OTEL_EXPORTER_OTLP_ENDPOINT
                )));
            }
        }
        let traces_otlp = traces_endpoint.filter(|_| traces_on);
        let metrics_otlp = metrics_endpoint.filter(|_| metrics.otlp);
        for (sig, given, o) in [
            (&TRACES, &given_traces, &traces_otlp),
            (&METRICS, &given_metrics, &metrics_otlp),
        ] {
            if let Some(o) = o {
                check_otlp(&src, sig, given, o)?;
            }
        }

        let listen = self.listen(
            &src,
            prometheus,
            &metrics,
            metrics_explicit,
            metrics_otlp.is_some(),
        )?;
        let prometheus = listen
            .for_rank(plain.rank)
            .map_err(|()| invalid(env::PROMETHEUS, &listen.to_string(), Listen::EXPECTED))?;

        Ok(Config::assemble(
            plain,
            table::Derived {
                summary_every: summary_every.unwrap_or(if metrics.console { 100 } else { 0 }),
                prometheus,
                otlp: otlp.config(),
                traces_otlp,
                traces_console: traces_exporter == Some(TracesExporter::Console),
                metrics_otlp,
                given_traces,
                given_metrics,
                shutdown_timeout,
                origins: src.origins,
                alias_warnings: src.alias_warnings,
            },
        ))
    }

    /// Where the embedded Prometheus endpoint listens: `set` when given; otherwise the built-in
    /// address when metrics are pushed nowhere, and off when the engine gave a provider.
    fn listen(
        &self,
        src: &Sources<'_>,
        set: Option<Listen>,
        metrics: &MetricsExporters,
        metrics_explicit: bool,
        metrics_otlp: bool,
    ) -> Result<Listen, ConfigError> {
        Ok(match set {
            Some(l) if l != Listen::Off && !cfg!(feature = "prometheus") => {
                return Err(ConfigError::Conflict(format!(
                    "{}={l}: this build of phasetrace has no Prometheus endpoint (its cargo \
                     feature `prometheus` is off): enable the feature, or set it to off",
                    env::PROMETHEUS
                )));
            }
            Some(l) => l,
            // The engine gave a provider: phasetrace starts no exporter it was not asked for,
            // whatever features the build has.
            None if self.embedded && !metrics.prometheus => Listen::Off,
            None if !cfg!(feature = "prometheus") => Listen::Off,
            None if metrics.prometheus || (!metrics_explicit && !metrics_otlp) => {
                src.builtin_listen()?
            }
            None => Listen::Off,
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
        assert_eq!(c.level, SectionLevel::Off);
        assert_eq!(c.spec_level, SpecLevel::Off);
        assert_eq!(c.trace_every, 100);
        assert_eq!(c.trace_slower_than, TraceSlowerThan::Percentile(99.0));
        assert_eq!(c.trace_slow_budget, 5);
        assert_eq!(c.graph_read_every, 1, "every CUDA-graph replay is read");
        assert!(c.layer_attr);
        assert_eq!(c.summary_every, 0);
        assert_eq!(c.prometheus, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(c.queue, 65_536);
        assert_eq!(c.rank, 0);
        assert_eq!(c.group, "default");
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
            ("PHASETRACE_GROUP", "tp-1.node:a_b"),
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
        assert_eq!(c.level, SectionLevel::Collectives);
        assert_eq!(c.spec_level, SpecLevel::VerifySplit);
        assert_eq!(c.trace_every, 0);
        assert!(!c.layer_attr);
        assert_eq!(c.summary_every, 8);
        assert_eq!(c.spec_summary_every, 16);
        assert_eq!(c.prometheus, Some("127.0.0.1:9999".parse().unwrap()));
        assert_eq!(c.queue, 1024);
        assert_eq!(c.rank, 3);
        assert_eq!(c.group, "tp-1.node:a_b");
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
        assert!(c.traces_otlp.is_some() && c.metrics_otlp.is_some());
        assert_eq!(c.origins.get("PHASETRACE_LEVEL"), Some(&Origin::Env));
        assert!(!format!("{c:?}").contains("s3cr"), "headers leak in Debug");
    }

    #[test]
    fn a_slow_step_threshold_is_a_duration_a_percentile_or_off() {
        let ok = |s: &str| s.parse::<TraceSlowerThan>().unwrap();
        let d = TraceSlowerThan::Duration;
        assert_eq!(ok("25ms"), d(Duration::from_millis(25)));
        assert_eq!(ok("1.5s"), d(Duration::from_millis(1500)));
        assert_eq!(ok("800us"), d(Duration::from_micros(800)));
        assert_eq!(ok("800µs"), d(Duration::from_micros(800)));
        assert_eq!(ok("2500ns"), d(Duration::from_nanos(2500)));
        assert_eq!(ok("p99"), TraceSlowerThan::Percentile(99.0));
        assert_eq!(ok("P99.9"), TraceSlowerThan::Percentile(99.9));
        assert_eq!(ok("off"), TraceSlowerThan::Off);
        for bad in [
            "fast", "p0", "p101", "p100", "-3ms", "0ms", "25", "ms", "p", "3 ms", "1e3ms",
        ] {
            let e = env(&[("PHASETRACE_TRACE_SLOWER_THAN", bad)])
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("PHASETRACE_TRACE_SLOWER_THAN="), "{bad}: {e}");
            assert!(e.contains(TraceSlowerThan::EXPECTED), "{bad}: {e}");
        }
        for v in ["25ms", "p99", "off", "1.5s"] {
            assert_eq!(
                ok(&ok(v).to_string()),
                ok(v),
                "{v} round-trips through Display"
            );
        }
        let mut code = ConfigBuilder::default();
        code.set(&settings::TRACE_SLOWER_THAN, TraceSlowerThan::Off);
        let c = resolve(&code, &[("PHASETRACE_TRACE_SLOWER_THAN", "p90")]).unwrap();
        assert_eq!(c.trace_slower_than, TraceSlowerThan::Off);
        assert_eq!(c.origin("PHASETRACE_TRACE_SLOWER_THAN"), Origin::Code);
    }

    #[test]
    fn every_invalid_value_names_the_variable_value_and_what_is_accepted() {
        let cases: &[(&str, &str, &str)] = &[
            ("PHASETRACE_LEVEL", "7", "off, 0, full, 1, collectives or 2"),
            (
                "PHASETRACE_SPEC_LEVEL",
                "3",
                "off, 0, phases, 1, verify or 2",
            ),
            ("PHASETRACE_TRACE_EVERY", "-1", "whole number"),
            (
                "PHASETRACE_TRACE_SLOWER_THAN",
                "fast",
                "a duration with a unit",
            ),
            ("PHASETRACE_TRACE_SLOWER_THAN", "p0", "p0.1 to p99.9"),
            ("PHASETRACE_TRACE_SLOWER_THAN", "p101", "p0.1 to p99.9"),
            (
                "PHASETRACE_TRACE_SLOWER_THAN",
                "-3ms",
                "a duration with a unit",
            ),
            ("PHASETRACE_TRACE_SLOWER_THAN", "25", "(25ms, 1.5s, 800us)"),
            ("PHASETRACE_TRACE_SLOW_BUDGET", "0", "from 1 to 10000"),
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
            ("PHASETRACE_GROUP", "tp 0", "letters, digits"),
            ("PHASETRACE_GROUP", "tp/0", "letters, digits"),
            ("PHASETRACE_EXPERT_COUNTER", "2", "on, off"),
            ("PHASETRACE_MOE_EXPERTS", "70000", "from 0 to 65536"),
            ("PHASETRACE_EXPERT_WINDOW", "0", "from 1 to 1000000"),
            ("PHASETRACE_EXPERT_TOP", "11", "from 0 to 10"),
            ("PHASETRACE_EXPERT_PARALLEL", "-1", "from 0 to 65536"),
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
        let mut b = ConfigBuilder::default();
        b.set(&settings::LEVEL, SectionLevel::Full);
        b.set(&settings::RANK, 7);
        b.set(&settings::GROUP, "tp1".to_owned());
        let c = resolve(
            &b,
            &[
                ("PHASETRACE_LEVEL", "2"),
                ("PHASETRACE_RANK", "1"),
                ("PHASETRACE_GROUP", "tp0"),
            ],
        )
        .unwrap();
        assert_eq!(c.level, SectionLevel::Full);
        assert_eq!(c.rank, 7);
        assert_eq!(c.group, "tp1");
        assert_eq!(c.origins.get("PHASETRACE_LEVEL"), Some(&Origin::Code));
        assert_eq!(c.origins.get("PHASETRACE_GROUP"), Some(&Origin::Code));
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
        assert_eq!(alone.level, SectionLevel::Collectives);
        assert!(alone.alias_warnings.is_empty());
        let both = resolve(
            &b,
            &[("METRALE_GLM_PROFILE", "2"), ("PHASETRACE_LEVEL", "1")],
        )
        .unwrap();
        assert_eq!(both.level, SectionLevel::Full);
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
    fn the_shutdown_timeout_is_a_setting_with_a_variable() {
        let c = env(&[("PHASETRACE_SHUTDOWN_TIMEOUT", "1500")]).unwrap();
        assert_eq!(c.shutdown_timeout, Duration::from_millis(1500));
        assert_eq!(c.origin(env::SHUTDOWN_TIMEOUT), Origin::Env);
        let d = env(&[]).unwrap();
        assert_eq!(d.shutdown_timeout, Duration::from_secs(5));
        let e = env(&[("PHASETRACE_SHUTDOWN_TIMEOUT", "soon")]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("PHASETRACE_SHUTDOWN_TIMEOUT=\"soon\""),
            "{e}"
        );
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
                "PHASETRACE_SPEC_LEVEL=2 overrides MEMRA_SPEC_TRACE=1 (the phasetrace name wins; unset one to silence this)"
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
        assert!(c.traces_otlp.is_some() && c.metrics_otlp.is_some());
        assert_eq!(c.otlp.unwrap().protocol, Protocol::Grpc);
        let off = env(&[("PHASETRACE_PROMETHEUS", "off")]).unwrap();
        assert!(off.prometheus.is_none());
        let err = env(&[("OTEL_TRACES_EXPORTER", "otlp")]).unwrap_err();
        assert!(err.to_string().contains("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let console = env(&[("OTEL_METRICS_EXPORTER", "console")]).unwrap();
        assert_eq!(console.summary_every, 100);
    }

    /// The environment every walk starts from: an https endpoint, so that the OTLP settings
    /// (the CA included) apply.
    const BASE: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4317");

    fn walk_check(c: &Config, label: &str) {
        for s in settings::SETTINGS {
            if let Err(e) = s.round_trips(c) {
                panic!("{label}: {e}");
            }
        }
    }

    #[test]
    fn every_setting_prints_what_it_parses_and_says_where_it_came_from() {
        // Default: the base endpoint only.
        let defaults = env(&[BASE]).unwrap();
        walk_check(&defaults, "defaults");
        for s in settings::SETTINGS {
            let expect = if s.var() == BASE.0 {
                Origin::Env
            } else {
                Origin::Default
            };
            assert_eq!(defaults.origin(s.var()), expect, "{}", s.var());
        }
        // Each setting from the environment, then from code: its example value, printed back.
        for s in settings::SETTINGS {
            let mut vars = vec![BASE, (s.var(), s.example())];
            if s.var() == BASE.0 {
                vars.remove(0);
            }
            let from_env = env(&vars).unwrap_or_else(|e| panic!("{}: {e}", s.var()));
            assert_eq!(from_env.origin(s.var()), Origin::Env, "{}", s.var());
            walk_check(&from_env, s.var());

            let mut b = ConfigBuilder::default();
            b.set_text(*s, s.example()).unwrap();
            let from_code = resolve(&b, &[BASE]).unwrap_or_else(|e| panic!("{}: {e}", s.var()));
            assert_eq!(from_code.origin(s.var()), Origin::Code, "{}", s.var());
            walk_check(&from_code, s.var());
            // Code and environment give the same value, and `check` prints it as it was given
            // (secrets masked).
            assert_eq!(s.shown(&from_env), s.shown(&from_code), "{}", s.var());
            let shown = s.shown(&from_env);
            if s.secret() {
                assert!(!shown.contains("s3cr"), "{}: {shown}", s.var());
            } else if s.var() != env::PROMETHEUS && s.var() != env::OTEL_METRICS_EXPORTER {
                // (The Prometheus address is printed resolved for the rank; the metrics
                // exporters are printed as they take effect.)
                assert_eq!(shown, s.example(), "{}", s.var());
            }
            // Code beats the environment, and both are parsed.
            let both = resolve(&b, &[BASE, (s.var(), s.example())]).unwrap();
            assert_eq!(both.origin(s.var()), Origin::Code, "{}", s.var());
        }
    }

    #[test]
    fn the_spec_level_check_prints_is_one_the_variable_reads() {
        let c = env(&[("PHASETRACE_SPEC_LEVEL", "2")]).unwrap();
        let shown = settings::SPEC_LEVEL.show(&c.spec_level);
        assert_eq!(shown, "verify");
        assert_eq!(
            env(&[("PHASETRACE_SPEC_LEVEL", &shown)])
                .unwrap()
                .spec_level,
            SpecLevel::VerifySplit
        );
    }

    #[test]
    fn settings_made_in_code_report_code_as_their_origin() {
        let mut b = ConfigBuilder::default();
        b.set(
            &settings::OTLP_ENDPOINT,
            Some("https://127.0.0.1:4317".into()),
        );
        b.set(&settings::OTLP_HEADERS, vec![("k".into(), "v".into())]);
        b.set(&settings::OTLP_COMPRESSION, Compression::Gzip);
        b.set(&settings::OTLP_CERTIFICATE, Some(PathBuf::from("/ca.pem")));
        b.set(&settings::OTLP_HISTOGRAM, HistogramAggregation::Exponential);
        let c = resolve(&b, &[]).unwrap();
        for var in [
            env::OTEL_EXPORTER_OTLP_ENDPOINT,
            env::OTEL_EXPORTER_OTLP_HEADERS,
            env::OTEL_EXPORTER_OTLP_COMPRESSION,
            env::OTEL_EXPORTER_OTLP_CERTIFICATE,
            env::OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION,
        ] {
            assert_eq!(c.origin(var), Origin::Code, "{var}");
        }
    }

    #[test]
    fn the_settings_table_names_each_variable_and_flag_once() {
        let mut vars = std::collections::BTreeSet::new();
        let mut flags = std::collections::BTreeSet::new();
        for s in settings::SETTINGS {
            assert!(vars.insert(s.var()), "{} twice", s.var());
            if let Some(f) = s.flag() {
                assert!(flags.insert(f), "--{f} twice");
            }
            assert!(
                !s.doc().is_empty() && !s.expected().is_empty(),
                "{}",
                s.var()
            );
            assert!(!s.default_text().is_empty(), "{}", s.var());
            s.check(s.example())
                .unwrap_or_else(|e| panic!("{} example: {e}", s.var()));
            assert!(
                s.check("\u{1}bogus value\u{1}").is_err()
                    || s.var() == env::OTEL_SERVICE_NAME
                    || s.var() == env::OTEL_EXPORTER_OTLP_CERTIFICATE
                    || s.var() == env::OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE
                    || s.var() == env::OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE
                    || s.var() == env::PROMETHEUS_WEB_CONFIG,
                "{}",
                s.var()
            );
        }
    }

    #[test]
    fn every_closed_set_reads_back_what_it_prints_in_any_case() {
        fn walk<T: FromStr<Err = Expected> + fmt::Display + PartialEq + fmt::Debug + Copy>(
            all: &[T],
            expected: &str,
        ) {
            for v in all {
                let text = v.to_string();
                assert!(expected.contains(&text), "{text} not in {expected:?}");
                assert_eq!(text.parse::<T>().unwrap(), *v);
                assert_eq!(text.to_ascii_uppercase().parse::<T>().unwrap(), *v);
            }
            assert_eq!("nope".parse::<T>().unwrap_err().0, expected);
        }
        walk(SectionLevel::ALL, SectionLevel::EXPECTED);
        walk(SpecLevel::ALL, SpecLevel::EXPECTED);
        walk(Timing::ALL, Timing::EXPECTED);
        walk(Protocol::ALL, Protocol::EXPECTED);
        walk(HistogramAggregation::ALL, HistogramAggregation::EXPECTED);
        walk(Compression::ALL, Compression::EXPECTED);
        walk(TracesExporter::ALL, TracesExporter::EXPECTED);
        for text in ["none", "otlp", "otlp,prometheus", "otlp,prometheus,console"] {
            let m: MetricsExporters = text.parse().unwrap();
            assert_eq!(m.to_string(), text);
        }
        for text in ["off", "127.0.0.1:9464", "127.0.0.1:9464+rank", "[::1]:9000"] {
            let l: Listen = text.parse().unwrap();
            assert_eq!(l.to_string(), text);
        }
    }

    #[test]
    fn a_legacy_alias_reads_with_its_settings_parser_and_must_name_a_known_variable() {
        let b = ConfigBuilder {
            aliases: vec![("OLD_QUEUE".into(), env::QUEUE)],
            ..Default::default()
        };
        assert_eq!(resolve(&b, &[("OLD_QUEUE", "4096")]).unwrap().queue, 4096);
        let bad = resolve(&b, &[("OLD_QUEUE", "5")]).unwrap_err().to_string();
        assert!(
            bad.starts_with("OLD_QUEUE=\"5\": expected a whole number of records"),
            "{bad}"
        );
        let unknown = ConfigBuilder {
            aliases: vec![("OLD".into(), "PHASETRACE_NOPE")],
            ..Default::default()
        };
        let err = resolve(&unknown, &[]).unwrap_err().to_string();
        assert!(
            err.contains("PHASETRACE_NOPE, which is not a phasetrace variable"),
            "{err}"
        );
    }

    #[test]
    fn values_given_in_code_are_checked_like_the_variable() {
        let mut b = ConfigBuilder::default();
        b.set(&settings::QUEUE, 10);
        let err = resolve(&b, &[]).unwrap_err().to_string();
        assert_eq!(
            err,
            "PHASETRACE_QUEUE set in code=\"10\": expected a whole number of records from 64 to 16777216"
        );
        let mut b = ConfigBuilder::default();
        assert!(b.set_text(&settings::LEVEL, "loud").is_err());
    }

    #[test]
    fn a_signals_own_variables_win_over_the_general_ones() {
        let c = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-key=general"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:4318/custom/path",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-key=traces"),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip"),
        ])
        .unwrap();
        let t = c.traces_otlp.as_ref().expect("traces over OTLP");
        let m = c.metrics_otlp.as_ref().expect("metrics over OTLP");
        // A signal's own endpoint is used as is; the general one gets the signal's path.
        assert_eq!(t.endpoint, "http://traces:4318/custom/path");
        assert_eq!(m.endpoint, "http://general:4318/v1/metrics");
        // Headers replace the general ones; other settings are inherited one by one.
        assert_eq!(t.headers, vec![("x-key".into(), "traces".into())]);
        assert_eq!(m.headers, vec![("x-key".into(), "general".into())]);
        assert_eq!(
            (t.timeout, m.timeout),
            (Duration::from_millis(1000), Duration::from_millis(2500))
        );
        assert_eq!((t.gzip, m.gzip), (false, true));
        // The general connection stays the base (what `import` sends with).
        assert_eq!(c.otlp.as_ref().unwrap().endpoint, "http://general:4318");
        // Metrics go over OTLP: no default Prometheus endpoint.
        assert_eq!(c.prometheus, None);
        for var in [
            env::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
            env::OTEL_EXPORTER_OTLP_METRICS_TIMEOUT,
        ] {
            assert_eq!(c.origin(var), Origin::Env, "{var}");
        }
        assert_eq!(
            c.origin(env::OTEL_EXPORTER_OTLP_METRICS_ENDPOINT),
            Origin::Default
        );
    }

    #[test]
    fn a_grpc_endpoint_is_used_as_given_and_one_signal_alone_can_be_sent() {
        let c = env(&[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:4317")]).unwrap();
        assert_eq!(
            c.metrics_otlp.as_ref().map(|o| o.endpoint.as_str()),
            Some("http://m:4317")
        );
        assert!(c.traces_otlp.is_none(), "no endpoint for traces: none sent");
        assert_eq!(c.prometheus, None);
        let c = env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4317")]).unwrap();
        assert!(c.traces_otlp.is_some() && c.metrics_otlp.is_none());
        // Metrics are pushed nowhere: the default endpoint serves them.
        assert!(c.prometheus.is_some());
    }

    #[test]
    fn otlp_selected_without_an_endpoint_names_both_variables() {
        let e = env(&[("OTEL_TRACES_EXPORTER", "otlp")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), "{e}");
        assert!(e.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{e}");
        let e = env(&[("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "thrift")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=\"thrift\""),
            "{e}"
        );
        assert!(e.contains("grpc or http/protobuf"), "{e}");
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/ca.pem"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE is set"),
            "{e}"
        );
    }

    #[test]
    fn the_default_prometheus_port_is_offset_by_the_launchers_local_rank() {
        let c = env(&[("LOCAL_RANK", "3")]).unwrap();
        assert_eq!(c.prometheus, Some("127.0.0.1:9467".parse().unwrap()));
        // An address given is kept as given.
        let c = env(&[
            ("LOCAL_RANK", "3"),
            ("PHASETRACE_PROMETHEUS", "127.0.0.1:9000"),
        ])
        .unwrap();
        assert_eq!(c.prometheus, Some("127.0.0.1:9000".parse().unwrap()));
        for bad in ["-1", "x", "60000"] {
            let e = env(&[("LOCAL_RANK", bad), ("PHASETRACE_RANK", "0")])
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("LOCAL_RANK=\"{bad}\"")), "{e}");
            assert!(e.contains("0 to 56071"), "{e}");
        }
    }

    #[test]
    fn a_protocol_this_build_lacks_is_refused_by_its_feature() {
        let c = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ]);
        if cfg!(feature = "otlp-http") {
            assert!(c.is_ok(), "{c:?}");
        } else {
            let e = c.unwrap_err().to_string();
            assert!(
                e.contains("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf"),
                "{e}"
            );
            assert!(e.contains("`otlp-http`"), "{e}");
        }
        let c = env(&[("PHASETRACE_PROMETHEUS", "127.0.0.1:9999")]);
        if cfg!(feature = "prometheus") {
            assert!(c.is_ok());
        } else {
            let e = c.unwrap_err().to_string();
            assert!(e.contains("`prometheus`"), "{e}");
            // Unset, the default endpoint is simply absent from such a build.
            assert_eq!(env(&[]).unwrap().prometheus, None);
        }
    }
}
