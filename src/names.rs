//! The values of the telemetry contract that the library's API carries (why a record was
//! dropped, the outcome of an export) as types, and the defaults of its settings. The names and
//! values themselves (metrics, units, attributes, spans, variables, `reason` and `result`
//! values, with what they mean) are the `phasetrace-names` crate's data ([`phasetrace_names`]),
//! re-exported here so that a crate depending on phasetrace alone spells them
//! `phasetrace::names::env::LEVEL`, `phasetrace::names::metric::STEP_DURATION`; a unit test keeps
//! the enums and that data equal. Instruments take their unit and description from that data
//! (`Described`).

pub use phasetrace_names::{
    SCOPE, attr, auth_refusal, connection_close, env, export_failure, metric, outcome, prometheus,
    reason, resource, signal, span,
};

/// An instrument builder given the unit and the one-line description that the contract holds
/// for the metric it builds ([`phasetrace_names::Metric`]'s `unit` and `help`), so that each
/// is written once, there.
pub(crate) trait Described: Sized {
    /// The contract's unit and description for the builder's name (a name outside
    /// [`metric::ALL`] keeps neither, and fails debug builds).
    fn described(self) -> Self;
}

/// The contract's entry for the instrument `name`.
fn contract(name: &str) -> Option<&'static phasetrace_names::Metric> {
    let m = phasetrace_names::Metric::of(name);
    debug_assert!(
        m.is_some(),
        "{name} is not in phasetrace_names::metric::ALL"
    );
    m
}

/// The contract's unit and one-line description of the metric `name`, for the builders of
/// `crate::export`'s own metrics, which take them apart.
#[cfg(any(feature = "prometheus", feature = "otlp"))]
pub(crate) fn unit_and_help(name: &str) -> (&'static str, &'static str) {
    contract(name).map_or(("", ""), |m| (m.unit, m.help))
}

macro_rules! described {
    ($($builder:ident<$($p:ident),*>),*) => {$(
        impl<$($p),*> Described for opentelemetry::metrics::$builder<'_, $($p),*> {
            fn described(mut self) -> Self {
                if let Some(m) = contract(&self.name) {
                    self.unit = Some(m.unit.into());
                    self.description = Some(m.help.into());
                }
                self
            }
        }
    )*};
}
described!(HistogramBuilder<T>, InstrumentBuilder<T>, AsyncInstrumentBuilder<I, M>);

/// Why an OTLP export failed: the `reason` attribute of `phasetrace.otlp.export.failures`
/// (`ExportFailure::ALL`, `as_str`), in the order of [`export_failure::ALL`]. It is the
/// transport's own type (`phasetrace-transport`), which says why each request failed.
#[cfg(feature = "transport")]
pub use phasetrace_transport::Failure as ExportFailure;

/// Why a record was dropped: the `reason` attribute of `phasetrace.records.dropped`, and the
/// index of [`crate::Stats::dropped`]. Every reason has a series from the start (at 0), so that
/// `rate()` over it reads 0, not "no data".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DropReason {
    /// The per-thread buffer was full.
    QueueFull,
    /// An end without a begin, or a begin never ended.
    Unbalanced,
    /// The clock could not give or resolve a timestamp (pool exhausted, event error).
    Clock,
    /// A value outside what the record format holds (an expert id above 65535).
    OutOfRange,
    /// Spans not built because the span processor's queue was full (collector slow or down).
    SpanQueue,
    /// Spans lost because their export failed (collector down or refusing).
    SpanExport,
    /// Slow steps or rounds not traced because their rank's tail-trace budget
    /// (`PHASETRACE_TRACE_SLOW_BUDGET` a second) was spent: one record per step or round.
    TailBudget,
    /// Sections, expert ids or waits of one step beyond what the worker holds for its trace
    /// (the step is still measured; its trace is built without them).
    TraceBound,
    /// Boundaries of a CUDA-graph replay whose events a later launch re-recorded before the
    /// worker read them (or whose graph was dropped first): counted, never attributed to
    /// another replay.
    GraphReplay,
    /// Requests beyond what the worker keeps open at once (65,536) or serves in one step
    /// (4,096): their telemetry is not recorded.
    RequestBound,
    /// A step, round or request still open when the profiler shut down (the engine never ended
    /// it): what it would have recorded at its end is not recorded.
    OpenAtShutdown,
    /// A second end of a request already ended: ignored, the request counted once.
    EndedTwice,
}

impl DropReason {
    /// How many reasons there are.
    pub const COUNT: usize = 12;
    /// Every reason, in the order of [`DropReason::index`].
    pub const ALL: [DropReason; DropReason::COUNT] = [
        DropReason::QueueFull,
        DropReason::Unbalanced,
        DropReason::Clock,
        DropReason::OutOfRange,
        DropReason::SpanQueue,
        DropReason::SpanExport,
        DropReason::TailBudget,
        DropReason::TraceBound,
        DropReason::GraphReplay,
        DropReason::RequestBound,
        DropReason::OpenAtShutdown,
        DropReason::EndedTwice,
    ];

    /// The `reason` attribute value.
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => reason::QUEUE_FULL,
            DropReason::Unbalanced => reason::UNBALANCED,
            DropReason::Clock => reason::CLOCK,
            DropReason::OutOfRange => reason::OUT_OF_RANGE,
            DropReason::SpanQueue => reason::SPAN_QUEUE,
            DropReason::SpanExport => reason::SPAN_EXPORT,
            DropReason::TailBudget => reason::TAIL_BUDGET,
            DropReason::TraceBound => reason::TRACE_BOUND,
            DropReason::GraphReplay => reason::GRAPH_REPLAY,
            DropReason::RequestBound => reason::REQUEST_BOUND,
            DropReason::OpenAtShutdown => reason::OPEN_AT_SHUTDOWN,
            DropReason::EndedTwice => reason::ENDED_TWICE,
        }
    }

    /// The position in [`DropReason::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an attempt ended: the `result` attribute of [`metric::PROMETHEUS_WEB_CONFIG_RELOADS`]
/// (a re-read of the web configuration file) and of [`metric::METRIC_EXPORTS`] (one OTLP metrics
/// export).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It worked: for a reload, new connections and requests use the file read.
    Ok,
    /// It failed: a reload keeps the configuration read before (a warning on stderr says why);
    /// a failed export is retried with the next interval's cumulative totals.
    Failed,
}

impl Outcome {
    /// Both results, each a series from the start.
    pub const ALL: [Outcome; 2] = [Outcome::Ok, Outcome::Failed];

    /// The `result` attribute value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => outcome::OK,
            Outcome::Failed => outcome::FAILED,
        }
    }
}

/// Why the Prometheus endpoint closed a connection it had accepted before the client was done:
/// the `reason` attribute of [`metric::PROMETHEUS_CONNECTIONS_CLOSED`]. Every reason has a
/// series from the start (at 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectionClose {
    /// At the bound on connections, the oldest idle one (no complete request head yet, or kept
    /// alive between requests) was closed to admit a new one.
    Evicted,
    /// At the bound, with every connection in the middle of a request: the new one was closed.
    Refused,
    /// No complete request head within the head time (slowloris, a port scanner).
    HeadTimeout,
    /// Kept alive without a new request for the idle time.
    IdleTimeout,
}

impl ConnectionClose {
    /// Every reason, each a series from the start.
    pub const ALL: [ConnectionClose; 4] = [
        ConnectionClose::Evicted,
        ConnectionClose::Refused,
        ConnectionClose::HeadTimeout,
        ConnectionClose::IdleTimeout,
    ];

    /// The `reason` attribute value.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConnectionClose::Evicted => connection_close::EVICTED,
            ConnectionClose::Refused => connection_close::REFUSED,
            ConnectionClose::HeadTimeout => connection_close::HEAD_TIMEOUT,
            ConnectionClose::IdleTimeout => connection_close::IDLE_TIMEOUT,
        }
    }
}

/// Why the Prometheus endpoint refused a request's basic auth: the `reason` attribute of
/// [`metric::PROMETHEUS_AUTH_REFUSED`]. Every reason has a series from the start (at 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuthRefusal {
    /// 401: no credentials, malformed ones, an unknown user or a wrong password.
    Unauthorized,
    /// 429: credentials not verified before, and no room for their check: the client's
    /// address had its share of checks waiting, or every slot was taken by addresses that asked
    /// for fewer checks, or a quieter address's check displaced it.
    Busy,
}

impl AuthRefusal {
    /// Every reason, each a series from the start.
    pub const ALL: [AuthRefusal; 2] = [AuthRefusal::Unauthorized, AuthRefusal::Busy];

    /// The `reason` attribute value.
    pub const fn as_str(self) -> &'static str {
        match self {
            AuthRefusal::Unauthorized => auth_refusal::UNAUTHORIZED,
            AuthRefusal::Busy => auth_refusal::BUSY,
        }
    }
}

/// Defaults, beside the names they belong to; `config::settings` reads them.
pub(crate) mod default {
    /// Service name when `OTEL_SERVICE_NAME` is unset.
    pub(crate) const SERVICE_NAME: &str = "phasetrace";
    /// Per-thread buffer capacity in records (24 bytes each: 1.5 MiB a thread; rounded up to a
    /// power of two).
    pub(crate) const QUEUE: usize = 65_536;
    /// The embedded Prometheus endpoint's port (on 127.0.0.1, plus `LOCAL_RANK` when set) when
    /// metrics are pushed nowhere else.
    pub(crate) const PROMETHEUS_PORT: u16 = 9464;
    /// The `group` attribute when `PHASETRACE_GROUP` is unset.
    pub(crate) const GROUP: &str = "default";
    /// Trace one step in this many.
    pub(crate) const TRACE_EVERY: u64 = 100;
    /// Trace the steps slower than this percentile of the rank's recent steps (`p99`).
    pub(crate) const TRACE_SLOWER_THAN_PERCENTILE: f64 = 99.0;
    /// Most tail traces a second per rank.
    pub(crate) const TRACE_SLOW_BUDGET: u32 = 5;
    /// Steps of a rank per expert-load window.
    pub(crate) const EXPERT_WINDOW: u32 = 64;
    /// Hot experts exported per (layer, rank).
    pub(crate) const EXPERT_TOP: u32 = 4;
    /// Most hot experts per (layer, rank): keeps a 60-layer model under 1,000 expert series a
    /// rank (3 x 60 + 10 x 60 = 780).
    pub(crate) const EXPERT_TOP_MAX: u32 = 10;
    /// Read every CUDA-graph replay.
    pub(crate) const GRAPH_READ_EVERY: u64 = 1;
    /// OTLP export timeout.
    pub(crate) const OTLP_TIMEOUT_MS: u64 = 10_000;
    /// Metric export interval.
    pub(crate) const METRIC_EXPORT_INTERVAL_MS: u64 = 10_000;
    /// How long `shutdown()` may take before it gives up.
    pub(crate) const SHUTDOWN_TIMEOUT_MS: u64 = 5_000;
    /// Connections the Prometheus endpoint holds at once (also bounded by the process's file
    /// descriptors: see docs/security.md). At the bound, the oldest idle one is closed to
    /// admit a new one; only when every one is in the middle of a request is the new one
    /// closed.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_MAX_CONNECTIONS: usize = 4_096;
    /// Connections waiting in the kernel to be accepted (the listen backlog).
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_BACKLOG: u32 = 1_024;
    /// Largest request head (request line and headers) the Prometheus endpoint reads.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_MAX_HEADER_BYTES: usize = 16 * 1024;
    /// Time a client has to send a whole request head: from accept on a new connection (the
    /// TLS handshake included), from its first byte on a kept-alive one (as Go's
    /// `ReadHeaderTimeout`).
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_HEAD_TIMEOUT_MS: u64 = 5_000;
    /// Time a kept-alive connection may wait for its next request (as Go's `IdleTimeout`):
    /// longer than the usual scrape intervals, so that a scraper keeps its connection.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_IDLE_TIMEOUT_MS: u64 = 90_000;
    /// Time a Prometheus request may take to be answered, and each stalled write.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_REQUEST_TIMEOUT_MS: u64 = 10_000;
    /// Threads of the endpoint's own that check passwords (bcrypt): never the threads that
    /// render scrapes, at most this much of the engine's CPU, and at a lower priority (nice
    /// 10 on Linux) than the engine's threads.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_AUTH_THREADS: usize = 1;
    /// Password checks waiting for those threads from one client address (an IPv6 /64); more
    /// are answered 429 at once, without touching other addresses' checks.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_AUTH_QUEUE: usize = 4;
    /// Password checks waiting in all; at this bound a check from an address that asked for
    /// fewer displaces the newest check of the address that asked for the most (429).
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_AUTH_QUEUE_TOTAL: usize = 32;
    /// Client addresses whose demand for password checks is remembered (the quietest idle one
    /// is forgotten first).
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_AUTH_SOURCES: usize = 1_024;
    /// How long an address's demand for password checks (the checks it asked for) takes to
    /// halve: the pool's thread takes the waiting check of the address with the lowest demand.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_AUTH_DEMAND_HALF_LIFE_SECS: u64 = 10;
    /// Credentials remembered as verified (checked without bcrypt), at most.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_AUTH_CACHE: usize = 64;
    /// How long verified credentials are remembered after their last use (while their user
    /// keeps the bcrypt hash they verified against).
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_AUTH_CACHE_TTL_SECS: u64 = 900;
    /// Series each per-layer instrument may hold before new attribute sets fold into the SDK's
    /// overflow series (the SDK's default is 2,000): room for 4 ranks as threads of one process
    /// at 96 layers and 20 sections a layer.
    pub(crate) const LAYER_SERIES_LIMIT: usize = 8_192;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_enums_spell_the_values_of_the_names_crate_in_its_order() {
        let reasons: Vec<&str> = DropReason::ALL.iter().map(|r| r.as_str()).collect();
        let data: Vec<&str> = reason::ALL.iter().map(|n| n.value).collect();
        assert_eq!(reasons, data);
        let outcomes: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        let data: Vec<&str> = outcome::ALL.iter().map(|n| n.value).collect();
        assert_eq!(outcomes, data);
        let closes: Vec<&str> = ConnectionClose::ALL.iter().map(|c| c.as_str()).collect();
        let data: Vec<&str> = connection_close::ALL.iter().map(|n| n.value).collect();
        assert_eq!(closes, data);
        let refusals: Vec<&str> = AuthRefusal::ALL.iter().map(|r| r.as_str()).collect();
        let data: Vec<&str> = auth_refusal::ALL.iter().map(|n| n.value).collect();
        assert_eq!(refusals, data);
        #[cfg(feature = "transport")]
        {
            let failures: Vec<&str> = ExportFailure::ALL.iter().map(|r| r.as_str()).collect();
            let data: Vec<&str> = export_failure::ALL.iter().map(|n| n.value).collect();
            assert_eq!(failures, data);
        }
    }
}
