//! What the settings accept, the first step of the flow: the closed sets of values
//! (`SectionLevel`, `Protocol`, ...) written by `closed_set!`, the open ones
//! (`TraceSlowerThan`, `ExporterSet`, `Listen`), each with `FromStr` and `Display`, and
//! [`Expected`], the error of parsing one value. `table.rs` declares each setting with one of
//! these types; `resolve.rs` reads the environment and code through their parsers.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;
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

/// One of phasetrace's own exporters, by the name `OTEL_TRACES_EXPORTER` and
/// `OTEL_METRICS_EXPORTER` give it. A new exporter is a variant here (its name and the signals
/// it exports), its module in `export/` and its line in the exporters' registry
/// (docs/development.md, "Adding an exporter").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Exporter {
    /// OTLP (gRPC or HTTP/protobuf), to `OTEL_EXPORTER_OTLP_ENDPOINT` or the signal's own.
    Otlp,
    /// The embedded Prometheus endpoint (metrics only; `PHASETRACE_PROMETHEUS`).
    Prometheus,
    /// Spans: one line per span on stderr; metrics: the console summary table.
    Console,
}

closed_set!(Exporter, "otlp, prometheus or console", {
    Otlp => ["otlp"],
    Prometheus => ["prometheus"],
    Console => ["console"],
});

/// A signal phasetrace exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    /// Spans (`OTEL_TRACES_EXPORTER`).
    Traces,
    /// Metrics (`OTEL_METRICS_EXPORTER`).
    Metrics,
}

impl Exporter {
    /// Whether it exports `signal`.
    pub const fn exports(self, signal: Signal) -> bool {
        !matches!((self, signal), (Exporter::Prometheus, Signal::Traces))
    }
}

/// The exporters selected for a signal (`OTEL_TRACES_EXPORTER`, `OTEL_METRICS_EXPORTER`): a
/// comma list of [`Exporter`] names, `none` for the empty set. Which one a signal accepts is
/// [`Exporter::exports`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ExporterSet(u32);

impl ExporterSet {
    /// No exporter.
    pub const NONE: ExporterSet = ExporterSet(0);
    /// What `OTEL_TRACES_EXPORTER` accepts.
    pub const TRACES_EXPECTED: &'static str = "a comma list of otlp, console, none";
    /// What `OTEL_METRICS_EXPORTER` accepts.
    pub const METRICS_EXPECTED: &'static str = "a comma list of otlp, prometheus, console, none";

    /// The set of `exporters`.
    pub fn of(exporters: &[Exporter]) -> ExporterSet {
        exporters.iter().fold(ExporterSet::NONE, |s, e| s.with(*e))
    }

    /// This set and `e`.
    #[must_use]
    pub const fn with(self, e: Exporter) -> ExporterSet {
        ExporterSet(self.0 | 1 << e as u32)
    }

    /// This set without `e`.
    #[must_use]
    pub const fn without(self, e: Exporter) -> ExporterSet {
        ExporterSet(self.0 & !(1 << e as u32))
    }

    /// This set with `e` when `on`, without it otherwise.
    #[must_use]
    pub const fn with_if(self, e: Exporter, on: bool) -> ExporterSet {
        if on { self.with(e) } else { self.without(e) }
    }

    /// Whether `e` is in the set.
    pub const fn contains(self, e: Exporter) -> bool {
        self.0 & 1 << e as u32 != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The exporters in the set, in [`Exporter::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = Exporter> {
        Exporter::ALL
            .iter()
            .copied()
            .filter(move |e| self.contains(*e))
    }

    /// The set `s` names for `signal`: every name one of [`Exporter::ALL`] that exports it,
    /// or `none`.
    pub fn parse_for(s: &str, signal: Signal) -> Result<ExporterSet, Expected> {
        let expected = || {
            Expected(
                match signal {
                    Signal::Traces => ExporterSet::TRACES_EXPECTED,
                    Signal::Metrics => ExporterSet::METRICS_EXPECTED,
                }
                .to_owned(),
            )
        };
        let mut set = ExporterSet::NONE;
        for item in s.split(',') {
            if item.trim().eq_ignore_ascii_case("none") {
                continue;
            }
            let e: Exporter = item.parse().map_err(|_| expected())?;
            if !e.exports(signal) {
                return Err(expected());
            }
            set = set.with(e);
        }
        Ok(set)
    }
}

impl fmt::Display for ExporterSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<&str> = self.iter().map(Exporter::as_str).collect();
        f.write_str(&names.join(","))
    }
}

/// Which ranks export the per-layer series (`PHASETRACE_LAYER_RANKS`): every rank, none, or
/// the listed ranks of each group. A fleet keeps one rank per group (`0`): the per-layer
/// series, which are most of a rank's series at 60-96 layers, then cost one rank in eight of a
/// tensor-parallel group of 8, and every rank keeps the per-step, per-section and per-site
/// series that the alerts read (docs/operations.md, "A fleet").
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum LayerRanks {
    /// Every rank (the default).
    #[default]
    All,
    /// No rank: the rendezvous waits are summed per site, sections have no per-layer series.
    None,
    /// These ranks (sorted, no duplicates, at least one); the others as with [`LayerRanks::None`].
    Only(Vec<u32>),
}

impl LayerRanks {
    /// What `PHASETRACE_LAYER_RANKS` accepts.
    pub const EXPECTED: &'static str =
        "all, none, or a comma-separated list of ranks (0 or 0,8,16) with per-layer series";

    /// Whether `rank` exports per-layer series.
    pub fn includes(&self, rank: u32) -> bool {
        match self {
            LayerRanks::All => true,
            LayerRanks::None => false,
            LayerRanks::Only(ranks) => ranks.binary_search(&rank).is_ok(),
        }
    }
}

impl FromStr for LayerRanks {
    type Err = Expected;

    fn from_str(s: &str) -> Result<LayerRanks, Expected> {
        let bad = || Expected(LayerRanks::EXPECTED.to_owned());
        let t = s.trim();
        if t.eq_ignore_ascii_case("all") {
            return Ok(LayerRanks::All);
        }
        if t.eq_ignore_ascii_case("none") {
            return Ok(LayerRanks::None);
        }
        let mut ranks = t
            .split(',')
            .map(|r| r.trim().parse::<u32>().map_err(|_| bad()))
            .collect::<Result<Vec<u32>, Expected>>()?;
        ranks.sort_unstable();
        ranks.dedup();
        Ok(LayerRanks::Only(ranks))
    }
}

impl fmt::Display for LayerRanks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayerRanks::All => f.write_str("all"),
            LayerRanks::None => f.write_str("none"),
            LayerRanks::Only(ranks) => {
                for (i, r) in ranks.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{r}")?;
                }
                Ok(())
            }
        }
    }
}

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
    pub(super) fn for_rank(self, rank: u32) -> Result<Option<SocketAddr>, ()> {
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
