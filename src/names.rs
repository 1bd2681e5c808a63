//! The values of the telemetry contract that the library's API carries (why a record was
//! dropped, the outcome of an export) as types, and the defaults of its settings. The names and
//! values themselves (metrics, units, attributes, spans, variables, `reason` and `result`
//! values, with what they mean) are the `phasetrace-names` crate's data ([`phasetrace_names`]),
//! re-exported here so that a crate depending on phasetrace alone spells them
//! `phasetrace::names::env::LEVEL`, `phasetrace::names::metric::STEP_DURATION`; a unit test keeps
//! the enums and that data equal.

pub use phasetrace_names::{SCOPE, attr, env, metric, outcome, prometheus, reason, resource, span};

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
}

impl DropReason {
    /// How many reasons there are.
    pub const COUNT: usize = 10;
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
    /// Connections the Prometheus endpoint serves at once; more are closed at accept.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_MAX_CONNECTIONS: usize = 512;
    /// Largest request head (request line and headers) the Prometheus endpoint reads.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_MAX_HEADER_BYTES: usize = 16 * 1024;
    /// Time a Prometheus request may take at each stage: the TLS handshake, reading the request
    /// head (an idle kept-alive connection included), answering, and each stalled write.
    #[cfg(feature = "prometheus")]
    pub(crate) const PROMETHEUS_REQUEST_TIMEOUT_MS: u64 = 10_000;
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
    }
}
