//! The telemetry contract: every metric name, unit, attribute key, span name and environment
//! variable that phasetrace emits or reads lives here, once.
//!
//! Dashboards (`dashboards/`), alert rules (`otel-config/rules/`) and the tests use these names;
//! the Prometheus spelling is the OTel name with dots turned into underscores, the unit appended
//! (`_seconds`) and `_total` on counters.

/// Metric names and units.
pub mod metric {
    /// Histogram of one section's duration, attributes `bucket`, `layer`, `site`, `rank`.
    pub const SECTION_DURATION: &str = "phasetrace.section.duration";
    /// Histogram of one decode step (token), attribute `rank`.
    pub const STEP_DURATION: &str = "phasetrace.step.duration";
    /// Counter of decode steps, attribute `rank`.
    pub const STEPS: &str = "phasetrace.steps";
    /// Histogram of the time a rank waited at a collective's rendezvous probe: its arrival skew.
    pub const COLLECTIVE_WAIT: &str = "phasetrace.collective.wait";
    /// Counter of tokens routed to each MoE expert, attributes `layer`, `expert` (opt-in).
    pub const MOE_EXPERT_TOKENS: &str = "phasetrace.moe.expert.tokens";
    /// Counter of records dropped, attribute `reason`.
    pub const RECORDS_DROPPED: &str = "phasetrace.records.dropped";
    /// Histogram of one speculative phase per round, attributes `phase`, `rank`.
    pub const SPEC_PHASE_DURATION: &str = "phasetrace.spec.phase.duration";
    /// Histogram of one verify part per round (level 2), attributes `part`, `rank`.
    pub const SPEC_VERIFY_PART_DURATION: &str = "phasetrace.spec.verify.part.duration";
    /// Counter of speculative rounds, attribute `rank`.
    pub const SPEC_ROUNDS: &str = "phasetrace.spec.rounds";
    /// Counter of drafted tokens, attribute `rank`.
    pub const SPEC_DRAFT_TOKENS: &str = "phasetrace.spec.draft_tokens";
    /// Counter of accepted tokens, attribute `rank`.
    pub const SPEC_ACCEPTED_TOKENS: &str = "phasetrace.spec.accepted_tokens";
    /// Histogram of accepted tokens per round, integer buckets `0..=k_max`, attribute `rank`.
    pub const SPEC_ACCEPTED_LENGTH: &str = "phasetrace.spec.accepted_length";

    /// Unit of every duration histogram.
    pub const UNIT_SECONDS: &str = "s";
    /// Unit of token counters and the accepted-length histogram.
    pub const UNIT_TOKENS: &str = "{token}";
    /// Unit of the step counter.
    pub const UNIT_STEPS: &str = "{step}";
    /// Unit of the round counter.
    pub const UNIT_ROUNDS: &str = "{round}";
    /// Unit of the dropped-records counter.
    pub const UNIT_RECORDS: &str = "{record}";

    /// Explicit histogram boundaries in seconds: 1 µs to 10 s, log-spaced at 1-2-5 per decade.
    pub const DURATION_BOUNDARIES: [f64; 22] = [
        1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2,
        0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
    ];
}

/// Attribute keys.
pub mod attr {
    /// Section bucket name (`kda_mixer`).
    pub const BUCKET: &str = "bucket";
    /// Layer index.
    pub const LAYER: &str = "layer";
    /// Collective or call site (`attn`, `mlp`).
    pub const SITE: &str = "site";
    /// Rank of the process or thread in the tensor-parallel group.
    pub const RANK: &str = "rank";
    /// MoE expert id.
    pub const EXPERT: &str = "expert";
    /// Why a record was dropped.
    pub const REASON: &str = "reason";
    /// Speculative phase.
    pub const PHASE: &str = "phase";
    /// Verify part.
    pub const PART: &str = "part";
    /// Step number (span attribute).
    pub const STEP: &str = "step";
    /// Expert ids routed in a layer at a step (span event attribute).
    pub const EXPERT_IDS: &str = "moe.expert_ids";
    /// Drafted tokens in a round (span attribute).
    pub const K: &str = "k";
    /// Accepted tokens in a round (span attribute).
    pub const ACCEPTED: &str = "accepted";
    /// Timing backend (span attribute).
    pub const TIMING: &str = "phasetrace.timing";
    /// Where host-clock boundaries are read from, `tsc` or `monotonic` (resource attribute; see
    /// [`crate::timing::host_source`]).
    pub const HOST_CLOCK: &str = "phasetrace.host_clock";
    /// The caller's tag of an imported speculative line (`glm5-phase`).
    pub const TAG: &str = "tag";
    /// The log file an imported record came from.
    pub const SOURCE_FILE: &str = "source.file";
    /// The run (process start) within an imported log.
    pub const SOURCE_RUN: &str = "source.run";
}

/// Span names (sections are named by their bucket).
pub mod span {
    /// One decode step (token).
    pub const STEP: &str = "decode.step";
    /// One layer inside a step.
    pub const LAYER: &str = "layer";
    /// One speculative round.
    pub const ROUND: &str = "spec.round";
    /// The span event carrying routed expert ids.
    pub const MOE_ROUTE_EVENT: &str = "moe.route";
}

/// Values of the `reason` attribute of `phasetrace.records.dropped`.
pub mod drop_reason {
    /// The per-thread buffer was full.
    pub const QUEUE_FULL: &str = "queue_full";
    /// An end without a begin, or a begin never ended.
    pub const UNBALANCED: &str = "unbalanced";
    /// The clock could not give or resolve a timestamp (pool exhausted, event error).
    pub const CLOCK: &str = "clock";
    /// A value outside what the record format holds (an expert id above 65535).
    pub const OUT_OF_RANGE: &str = "out_of_range";
    /// Spans not built because the span processor's queue was full (collector slow or down).
    pub const SPAN_QUEUE: &str = "span_queue";
    /// Spans lost because their export failed (collector down or refusing).
    pub const SPAN_EXPORT: &str = "span_export";
}

/// Environment variables read by [`crate::Config::from_env`].
pub mod env {
    /// `off`/`0`, `full`/`1`, `collectives`/`2`.
    pub const LEVEL: &str = "PHASETRACE_LEVEL";
    /// `off`/`0`, `1` (phases), `2` (phases and the verify sub-split).
    pub const SPEC_LEVEL: &str = "PHASETRACE_SPEC_LEVEL";
    /// Trace one step (and one round) in N; `0` builds no spans.
    pub const TRACE_EVERY: &str = "PHASETRACE_TRACE_EVERY";
    /// `on`/`off`: the `layer` attribute on section metrics.
    pub const LAYER_ATTR: &str = "PHASETRACE_LAYER_ATTR";
    /// Console summary table every N steps; `0` = off.
    pub const SUMMARY_EVERY: &str = "PHASETRACE_SUMMARY_EVERY";
    /// Console line every N speculative rounds; `0` = off.
    pub const SPEC_SUMMARY_EVERY: &str = "PHASETRACE_SPEC_SUMMARY_EVERY";
    /// Prometheus listen address, or `off`.
    pub const PROMETHEUS: &str = "PHASETRACE_PROMETHEUS";
    /// Per-thread buffer capacity in records.
    pub const QUEUE: &str = "PHASETRACE_QUEUE";
    /// This process's rank.
    pub const RANK: &str = "PHASETRACE_RANK";
    /// `on`/`off`: the per-(layer, expert) token counter.
    pub const EXPERT_COUNTER: &str = "PHASETRACE_EXPERT_COUNTER";
    /// `host`, `sync` or `events`.
    pub const TIMING: &str = "PHASETRACE_TIMING";
    /// Rank fallbacks set by launchers, read in this order after `PHASETRACE_RANK`.
    pub const RANK_FALLBACKS: [&str; 3] = ["RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK"];

    /// `true` turns phasetrace off entirely (no recording, no export), as the OTel SDKs do.
    pub const OTEL_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
    /// Resource `service.name`.
    pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
    /// Extra resource attributes, `k=v,k2=v2`.
    pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
    /// OTLP endpoint.
    pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
    /// `grpc` or `http/protobuf`.
    pub const OTEL_EXPORTER_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
    /// OTLP headers, `k=v,k2=v2` (values are secrets: never printed).
    pub const OTEL_EXPORTER_OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
    /// OTLP export timeout in milliseconds.
    pub const OTEL_EXPORTER_OTLP_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
    /// `gzip` or `none`.
    pub const OTEL_EXPORTER_OTLP_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_COMPRESSION";
    /// PEM file of a custom CA for `https://` endpoints.
    pub const OTEL_EXPORTER_OTLP_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
    /// `explicit_bucket_histogram` or `base2_exponential_bucket_histogram`.
    pub const OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION: &str =
        "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION";
    /// Metric export interval in milliseconds.
    pub const OTEL_METRIC_EXPORT_INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";
    /// `otlp`, `console` or `none`.
    pub const OTEL_TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
    /// Comma list of `otlp`, `prometheus`, `console`, `none`.
    pub const OTEL_METRICS_EXPORTER: &str = "OTEL_METRICS_EXPORTER";
}

/// Defaults, beside the names they belong to.
pub mod default {
    /// Service name when `OTEL_SERVICE_NAME` is unset.
    pub const SERVICE_NAME: &str = "phasetrace";
    /// The embedded Prometheus endpoint when no OTLP endpoint is configured.
    pub const PROMETHEUS_ADDR: &str = "127.0.0.1:9464";
    /// Per-thread buffer capacity in records (24 bytes each: 1.5 MiB a thread; rounded up to a
    /// power of two).
    pub const QUEUE: usize = 65_536;
    /// Trace one step in this many.
    pub const TRACE_EVERY: u64 = 100;
    /// OTLP export timeout.
    pub const OTLP_TIMEOUT_MS: u64 = 10_000;
    /// Metric export interval.
    pub const METRIC_EXPORT_INTERVAL_MS: u64 = 10_000;
    /// How long `shutdown()` may take before it gives up.
    pub const SHUTDOWN_TIMEOUT_MS: u64 = 5_000;
}
