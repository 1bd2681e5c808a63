//! The telemetry contract of phasetrace: every metric name, unit, attribute key, span name and
//! environment variable that phasetrace emits or reads lives here, once, and the rule that
//! turns a metric name into its Prometheus spelling.
//!
//! The engine library (`phasetrace`) emits these names; the log importer
//! (`phasetrace-import`), the `phasetrace` command, the dashboards (`dashboards/`), the alert
//! rules (`otel-config/rules/`) and the tests read them from here (as
//! `opentelemetry-semantic-conventions` stands beside `opentelemetry`). The Prometheus spelling
//! is the OTel name with dots turned into underscores, the unit appended (`_seconds`) and
//! `_total` on counters ([`prometheus::metric_name`]).

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

/// The instrumentation scope of every instrument and span phasetrace creates (with the crate's
/// version), on its own providers and on the engine's alike.
pub const SCOPE: &str = "phasetrace";

/// Metric names and units. Every metric also carries [`crate::attr::GROUP`], the collective
/// group of the rank (`PHASETRACE_GROUP`).
pub mod metric {
    /// Histogram of one section's duration in seconds (all layers: quantiles per bucket),
    /// attributes `bucket`, `site` (when given), `rank`: the buckets that quantiles need, without
    /// `layer` (per-layer detail is [`SECTION_LAYER_TIME`] and [`SECTION_LAYER_CALLS`], two
    /// series per (bucket, layer) instead of 25). On the protobuf scrape this and the other
    /// duration histograms also carry a native half (base-2 exponential, in the same
    /// `Histogram` message), which Prometheus stores with `scrape_native_histograms: true`.
    pub const SECTION_DURATION: &str = "phasetrace.section.duration";
    /// Counter of the time spent in one section per layer, in seconds, attributes `bucket`,
    /// `layer`, `site` (when given), `rank` (`phasetrace_section_layer_time_seconds_total`). Off
    /// with `PHASETRACE_LAYER_ATTR=off`.
    pub const SECTION_LAYER_TIME: &str = "phasetrace.section.layer.time";
    /// Counter of the calls of one section per layer, the same attributes
    /// (`phasetrace_section_layer_calls_total`): the mean per call is time / calls.
    pub const SECTION_LAYER_CALLS: &str = "phasetrace.section.layer.calls";
    /// Histogram of one decode step (token) in seconds, attributes `rank`, `group`.
    pub const STEP_DURATION: &str = "phasetrace.step.duration";
    /// Histogram of the time one decode step spent waiting at collective rendezvous probes, in
    /// seconds (the sum over the step's probe sections and reported waits; 0 for a step without
    /// any), attributes `rank`, `group`.
    /// Divided by [`STEP_DURATION`] it is the rank's wait share: the straggler's is the lowest,
    /// and what the others wait beyond it is the step time lost to it. Per step, not per layer:
    /// it costs one histogram per rank whatever the model's depth.
    pub const STEP_COLLECTIVE_WAIT: &str = "phasetrace.step.collective_wait";
    /// Counter of decode steps, attribute `rank`.
    pub const STEPS: &str = "phasetrace.steps";
    /// Gauge of how long the rank's current decode step has been open, in seconds, attributes
    /// `rank`, `group` (`phasetrace_step_open_duration_seconds`); 0 while no step is open, so an
    /// idle engine reads 0 and a hung one (every rank blocked inside a collective) grows. The
    /// longest over the rank's recorders; with a deferred clock (CUDA events) whose stream has
    /// not reached the oldest mark, counted from when the worker first found it pending. Read
    /// at each collection (scrape or export) from when the open step began, so it grows between
    /// the worker's drains: a series per rank with a live recorder, gone with its last recorder.
    /// Alert: `PhasetraceStepHung`.
    pub const STEP_OPEN_DURATION: &str = "phasetrace.step.open_duration";
    /// Histogram of the time a rank waited at a collective's rendezvous probe, in seconds (its
    /// arrival skew: the straggler waits about 0), attributes `site`, `rank`, `group`: where the
    /// time goes, per collective.
    pub const COLLECTIVE_WAIT: &str = "phasetrace.collective.wait";
    /// Counter of the time waited at a collective's rendezvous probe per layer, in seconds,
    /// attributes `site`, `layer`, `rank`, `group`
    /// (`phasetrace_collective_layer_wait_time_seconds_total`); kept with
    /// `PHASETRACE_LAYER_ATTR=off` too.
    pub const COLLECTIVE_LAYER_WAIT_TIME: &str = "phasetrace.collective.layer.wait.time";
    /// Counter of the rendezvous waits per layer, the same attributes
    /// (`phasetrace_collective_layer_wait_calls_total`).
    pub const COLLECTIVE_LAYER_WAIT_CALLS: &str = "phasetrace.collective.layer.wait.calls";
    /// Counter of the tokens routed in one MoE layer, counted once per expert each goes to
    /// (tokens x top-k), attributes `layer`, `rank` (`phasetrace_moe_layer_tokens_total`;
    /// opt-in: `PHASETRACE_EXPERT_COUNTER=on`). One series per (layer, rank) whatever the
    /// number of experts; the full per-(layer, expert) counts are in process only
    /// (`Profiler::expert_load`).
    pub const MOE_LAYER_TOKENS: &str = "phasetrace.moe.layer.tokens";
    /// Gauge of a MoE layer's routing imbalance over the rank's last complete window of
    /// `PHASETRACE_EXPERT_WINDOW` steps: the most tokens any expert got divided by the mean
    /// over the layer's experts (1 = perfectly balanced; the number of experts when one expert
    /// got everything), attributes `layer`, `rank`.
    pub const MOE_IMBALANCE: &str = "phasetrace.moe.expert_load.imbalance";
    /// Gauge of the coefficient of variation (standard deviation / mean) of the tokens per
    /// expert over the same window, attributes `layer`, `rank`.
    pub const MOE_LOAD_CV: &str = "phasetrace.moe.expert_load.cv";
    /// Gauge of a hot expert's share of its layer's tokens in the same window (0..1),
    /// attributes `layer`, `expert`, `rank`, and `ep_rank` (the rank that hosts it) when
    /// `PHASETRACE_EXPERT_PARALLEL` is set: `PHASETRACE_EXPERT_TOP` series per (layer, rank),
    /// the set changing only at a window's end and only for an expert clearly hotter than the
    /// one it replaces.
    pub const MOE_HOT_EXPERT_SHARE: &str = "phasetrace.moe.hot_expert.share";
    /// Counter of records dropped, attribute `reason` (`phasetrace::DropReason`): everything
    /// dropped is counted, each reason a series from the start at 0; `Profiler::stats()` holds
    /// the same counts.
    pub const RECORDS_DROPPED: &str = "phasetrace.records.dropped";
    /// Histogram of one speculative phase per round in seconds, attributes `phase` (draft,
    /// verify, accept, rollback, maint), `rank`.
    pub const SPEC_PHASE_DURATION: &str = "phasetrace.spec.phase.duration";
    /// Histogram of one verify part per round in seconds (level 2), attributes `part` (kda,
    /// kda_scan, mla, ffn, rest), `rank`: `rest` = verify - kda - mla; `kda_scan` is inside
    /// `kda`, `ffn` inside `rest`.
    pub const SPEC_VERIFY_PART_DURATION: &str = "phasetrace.spec.verify.part.duration";
    /// Counter of speculative rounds, attribute `rank`.
    pub const SPEC_ROUNDS: &str = "phasetrace.spec.rounds";
    /// Counter of drafted tokens, attribute `rank`: the acceptance rate is accepted / drafted.
    pub const SPEC_DRAFT_TOKENS: &str = "phasetrace.spec.draft_tokens";
    /// Counter of accepted tokens, attribute `rank`.
    pub const SPEC_ACCEPTED_TOKENS: &str = "phasetrace.spec.accepted_tokens";
    /// Histogram of accepted tokens per round, integer buckets `0..=k_max` (`with_spec_k_max`,
    /// default 16), attribute `rank`.
    pub const SPEC_ACCEPTED_LENGTH: &str = "phasetrace.spec.accepted_length";
    /// Counter of the re-reads of the Prometheus endpoint's web configuration file
    /// (`PHASETRACE_PROMETHEUS_WEB_CONFIG`) after it or a file it names changed, attribute
    /// `result` (`phasetrace::names::Outcome`); both series exist, at 0, from the start
    /// (`phasetrace_prometheus_web_config_reloads_total`). Only with a web configuration file.
    pub const PROMETHEUS_WEB_CONFIG_RELOADS: &str = "phasetrace.prometheus.web_config.reloads";
    /// Gauge, 1 while the web configuration in force is the one on disk and 0 after a change to
    /// it was refused (the endpoint serves the configuration it read before), back to 1 with the
    /// next reload that works; attribute `group` only, no unit (a state, as Prometheus's own
    /// `prometheus_config_last_reload_successful`:
    /// `phasetrace_prometheus_web_config_last_reload_successful`). Only with a web
    /// configuration file; a change is noticed at the next connection or request, so a scrape
    /// reads the state of the file as it is then (an engine exporting only over OTLP reports it
    /// once something connects to its endpoint). Alert: `PhasetraceWebConfigReloadFailed`.
    pub const PROMETHEUS_WEB_CONFIG_LAST_RELOAD_SUCCESSFUL: &str =
        "phasetrace.prometheus.web_config.last_reload_successful";
    /// Counter of OTLP metrics exports, attribute `result` (`phasetrace::names::Outcome`); both
    /// series exist, at 0, from the start (`phasetrace_metric_exports_total`). Only with metrics
    /// over OTLP. A failed export loses nothing (the totals are cumulative; the next export
    /// carries them), but the backend's view is stale meanwhile: this says so (and stderr, once
    /// per outage with the first error, and again when exports work again). Seen at once on the
    /// Prometheus endpoint when both are on, by the collector with the first export that works.
    /// Alert: `PhasetraceMetricsExportFailing`.
    pub const METRIC_EXPORTS: &str = "phasetrace.metric.exports";

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
    /// Unit of the per-layer call counters.
    pub const UNIT_CALLS: &str = "{call}";
    /// Unit of the web configuration reload counter.
    pub const UNIT_RELOADS: &str = "{reload}";
    /// Unit of the metrics export counter.
    pub const UNIT_EXPORTS: &str = "{export}";

    // Per-layer latency distributions (native histograms): one series per histogram, so they
    // are exported only where a histogram costs one series (the protobuf scrape, OTLP).

    /// Base-2 exponential histogram of one section's duration per layer, in seconds,
    /// attributes `bucket`, `layer`, `site` (when given), `rank`, `group`
    /// (`phasetrace_section_layer_duration_seconds`, a native histogram). Served on the
    /// protobuf scrape (Prometheus with `scrape_native_histograms: true`) and over OTLP when
    /// its histograms are exponential; the text scrapes and OTLP with explicit buckets leave it
    /// out (their per-layer detail is [`SECTION_LAYER_TIME`] and [`SECTION_LAYER_CALLS`]); an
    /// engine's own meter provider gets it only with `phasetrace::view(true)` registered. Off
    /// with `PHASETRACE_LAYER_ATTR=off`.
    pub const SECTION_LAYER_DURATION: &str = "phasetrace.section.layer.duration";
    /// Base-2 exponential histogram of the time waited at a collective's rendezvous probe per
    /// layer, in seconds, attributes `site`, `layer`, `rank`, `group`
    /// (`phasetrace_collective_layer_wait_duration_seconds`, a native histogram); exported as
    /// [`SECTION_LAYER_DURATION`] is.
    pub const COLLECTIVE_LAYER_WAIT_DURATION: &str = "phasetrace.collective.layer.wait.duration";
    /// The per-layer distributions: exponential on every provider, skipped by the text
    /// encoders.
    pub const LAYER_DISTRIBUTIONS: [&str; 2] =
        [SECTION_LAYER_DURATION, COLLECTIVE_LAYER_WAIT_DURATION];
    /// The per-layer section counters that the protobuf scrape leaves out when it serves
    /// [`SECTION_LAYER_DURATION`]: each native histogram carries its own sum and count
    /// (`histogram_sum`/`histogram_count` of it are these counters' `rate`s), and serving both
    /// would not fit a 96-layer rank in the series budget. The text scrapes keep them.
    pub const LAYER_COUNTERS_IN_DISTRIBUTIONS: [&str; 2] =
        [SECTION_LAYER_TIME, SECTION_LAYER_CALLS];
    /// The most buckets of one per-layer distribution (the SDK lowers the scale to fit).
    pub const LAYER_DISTRIBUTION_MAX_BUCKETS: u32 = 160;
    /// The explicit-bucket duration histograms that carry a native half (base-2 exponential)
    /// on the protobuf scrape, in the same `Histogram` message as their classic buckets. The
    /// halves count from the endpoint's first protobuf scrape on (before it, no scraper asked
    /// for them and the worker records none): their count and sum, which the message's
    /// `_count` and `_sum` are, leave out what came before, so with Prometheus's
    /// `always_scrape_classic_histograms` the classic `_count` may stay below the `+Inf`
    /// bucket by a constant (rates agree).
    pub const NATIVE_HALVES: [&str; 6] = [
        SECTION_DURATION,
        STEP_DURATION,
        COLLECTIVE_WAIT,
        STEP_COLLECTIVE_WAIT,
        SPEC_PHASE_DURATION,
        SPEC_VERIFY_PART_DURATION,
    ];

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
    /// The collective group a rank belongs to (on every series and span): ranks are compared
    /// only within their group.
    pub const GROUP: &str = "group";
    /// MoE expert id.
    pub const EXPERT: &str = "expert";
    /// The expert-parallel rank that hosts an expert (`PHASETRACE_EXPERT_PARALLEL`).
    pub const EP_RANK: &str = "ep_rank";
    /// Why a record was dropped.
    pub const REASON: &str = "reason";
    /// How a re-read of the web configuration file or a metrics export ended
    /// (`phasetrace::names::Outcome`).
    pub const RESULT: &str = "result";
    /// Speculative phase.
    pub const PHASE: &str = "phase";
    /// Verify part.
    pub const PART: &str = "part";
    /// Step number (span attribute).
    pub const STEP: &str = "step";
    /// Expert ids routed in a layer at a step (on the step's `moe.route` events, and on the
    /// layer's rendezvous-probe spans, at most 256 there).
    pub const EXPERT_IDS: &str = "moe.expert_ids";
    /// How many expert ids the layer routed in the step (on rendezvous-probe spans, beside
    /// [`EXPERT_IDS`], which holds at most 256 of them).
    pub const EXPERT_IDS_COUNT: &str = "moe.expert_ids.count";
    /// Drafted tokens in a round (span attribute).
    pub const K: &str = "k";
    /// Accepted tokens in a round (span attribute).
    pub const ACCEPTED: &str = "accepted";
    /// Timing backend (span attribute).
    pub const TIMING: &str = "phasetrace.timing";
    /// Why a step or round was traced: `head` (one in `PHASETRACE_TRACE_EVERY`) or `tail`
    /// (slower than `PHASETRACE_TRACE_SLOWER_THAN`) (span attribute).
    pub const SAMPLED: &str = "phasetrace.sampled";
    /// Where host-clock boundaries are read from, `tsc` or `monotonic` (resource attribute; see
    /// `phasetrace::timing::host_source`).
    pub const HOST_CLOCK: &str = "phasetrace.host_clock";
    /// The caller's tag of an imported speculative line (`glm5-phase`).
    pub const TAG: &str = "tag";
    /// The log file an imported record came from.
    pub const SOURCE_FILE: &str = "source.file";
    /// The run (process start) within an imported log.
    pub const SOURCE_RUN: &str = "source.run";
}

/// Resource attribute keys (OpenTelemetry semantic conventions) that phasetrace sets.
///
/// `telemetry.sdk.*` describe the OpenTelemetry SDK underneath and are the SDK's own;
/// phasetrace, a distribution of it, names itself in `telemetry.distro.*`.
pub mod resource {
    /// The service (`OTEL_SERVICE_NAME`).
    pub const SERVICE_NAME: &str = "service.name";
    /// This process's id.
    pub const PROCESS_PID: &str = "process.pid";
    /// This process's executable file name.
    pub const PROCESS_EXECUTABLE_NAME: &str = "process.executable.name";
    /// The host's name.
    pub const HOST_NAME: &str = "host.name";
    /// `phasetrace`.
    pub const TELEMETRY_DISTRO_NAME: &str = "telemetry.distro.name";
    /// phasetrace's version.
    pub const TELEMETRY_DISTRO_VERSION: &str = "telemetry.distro.version";
    /// The value of [`TELEMETRY_DISTRO_NAME`].
    pub const DISTRO: &str = "phasetrace";
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

/// Environment variables read by `phasetrace::Config::from_env`.
pub mod env {
    /// `off`/`0`, `full`/`1`, `collectives`/`2`.
    pub const LEVEL: &str = "PHASETRACE_LEVEL";
    /// `off`/`0`, `1` (phases), `2` (phases and the verify sub-split).
    pub const SPEC_LEVEL: &str = "PHASETRACE_SPEC_LEVEL";
    /// Trace one step (and one round) in N; `0` builds no spans.
    pub const TRACE_EVERY: &str = "PHASETRACE_TRACE_EVERY";
    /// Also trace a step (or round) slower than this: a duration (`25ms`), a quantile of the
    /// rank's recent steps (`p99`), or `off`.
    pub const TRACE_SLOWER_THAN: &str = "PHASETRACE_TRACE_SLOWER_THAN";
    /// Most slow-step (tail) traces a second per rank.
    pub const TRACE_SLOW_BUDGET: &str = "PHASETRACE_TRACE_SLOW_BUDGET";
    /// How long `Profiler::shutdown` may take in all (milliseconds).
    pub const SHUTDOWN_TIMEOUT: &str = "PHASETRACE_SHUTDOWN_TIMEOUT";
    /// Read one CUDA-graph replay in N; `0` reads none.
    pub const GRAPH_READ_EVERY: &str = "PHASETRACE_GRAPH_READ_EVERY";
    /// `on`/`off`: the `layer` attribute on section metrics.
    pub const LAYER_ATTR: &str = "PHASETRACE_LAYER_ATTR";
    /// Console summary table every N steps; `0` = off.
    pub const SUMMARY_EVERY: &str = "PHASETRACE_SUMMARY_EVERY";
    /// Console line every N speculative rounds; `0` = off.
    pub const SPEC_SUMMARY_EVERY: &str = "PHASETRACE_SPEC_SUMMARY_EVERY";
    /// Prometheus listen address, or `off`.
    pub const PROMETHEUS: &str = "PHASETRACE_PROMETHEUS";
    /// Path of the Prometheus endpoint's web configuration file (the exporter-toolkit format:
    /// `tls_server_config`, `basic_auth_users`).
    pub const PROMETHEUS_WEB_CONFIG: &str = "PHASETRACE_PROMETHEUS_WEB_CONFIG";
    /// Per-thread buffer capacity in records.
    pub const QUEUE: &str = "PHASETRACE_QUEUE";
    /// This process's rank.
    pub const RANK: &str = "PHASETRACE_RANK";
    /// The collective group of this process's ranks (the `group` attribute).
    pub const GROUP: &str = "PHASETRACE_GROUP";
    /// `on`/`off`: the MoE expert-load telemetry (per-layer tokens, imbalance, hot experts,
    /// `Profiler::expert_load`).
    pub const EXPERT_COUNTER: &str = "PHASETRACE_EXPERT_COUNTER";
    /// Routed experts per MoE layer; `0` infers it from the highest id seen.
    pub const MOE_EXPERTS: &str = "PHASETRACE_MOE_EXPERTS";
    /// Steps of a rank per expert-load window (imbalance, hot experts).
    pub const EXPERT_WINDOW: &str = "PHASETRACE_EXPERT_WINDOW";
    /// Hot experts exported per (layer, rank); `0` exports none.
    pub const EXPERT_TOP: &str = "PHASETRACE_EXPERT_TOP";
    /// Expert-parallel ranks that host the experts in contiguous blocks; `0` = not exported.
    pub const EXPERT_PARALLEL: &str = "PHASETRACE_EXPERT_PARALLEL";
    /// `host`, `sync` or `events`.
    pub const TIMING: &str = "PHASETRACE_TIMING";
    /// `auto`, `tsc` or `monotonic`: where the host clock reads.
    pub const HOST_CLOCK: &str = "PHASETRACE_HOST_CLOCK";
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
    /// The traces endpoint, used as is (for OTLP/HTTP the whole URL, `.../v1/traces`); unset:
    /// [`OTEL_EXPORTER_OTLP_ENDPOINT`] (plus `/v1/traces` over HTTP).
    pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
    /// The metrics endpoint, used as is (for OTLP/HTTP the whole URL, `.../v1/metrics`); unset:
    /// [`OTEL_EXPORTER_OTLP_ENDPOINT`] (plus `/v1/metrics` over HTTP).
    pub const OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT";
    /// The traces transport; unset: [`OTEL_EXPORTER_OTLP_PROTOCOL`].
    pub const OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
    /// The metrics transport; unset: [`OTEL_EXPORTER_OTLP_PROTOCOL`].
    pub const OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL";
    /// The traces request headers (replacing, not adding to, [`OTEL_EXPORTER_OTLP_HEADERS`]).
    pub const OTEL_EXPORTER_OTLP_TRACES_HEADERS: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";
    /// The metrics request headers (replacing, not adding to, [`OTEL_EXPORTER_OTLP_HEADERS`]).
    pub const OTEL_EXPORTER_OTLP_METRICS_HEADERS: &str = "OTEL_EXPORTER_OTLP_METRICS_HEADERS";
    /// The traces export timeout in milliseconds; unset: [`OTEL_EXPORTER_OTLP_TIMEOUT`].
    pub const OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT";
    /// The metrics export timeout in milliseconds; unset: [`OTEL_EXPORTER_OTLP_TIMEOUT`].
    pub const OTEL_EXPORTER_OTLP_METRICS_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT";
    /// The traces compression; unset: [`OTEL_EXPORTER_OTLP_COMPRESSION`].
    pub const OTEL_EXPORTER_OTLP_TRACES_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION";
    /// The metrics compression; unset: [`OTEL_EXPORTER_OTLP_COMPRESSION`].
    pub const OTEL_EXPORTER_OTLP_METRICS_COMPRESSION: &str =
        "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION";
    /// The traces endpoint's CA; unset: [`OTEL_EXPORTER_OTLP_CERTIFICATE`].
    pub const OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE";
    /// The metrics endpoint's CA; unset: [`OTEL_EXPORTER_OTLP_CERTIFICATE`].
    pub const OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE: &str =
        "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE";
    /// The launcher's rank of this process on its host (torchrun and most launchers set it):
    /// the built-in Prometheus port is 9464 plus it.
    pub const LOCAL_RANK: &str = "LOCAL_RANK";
    /// Metric export interval in milliseconds.
    pub const OTEL_METRIC_EXPORT_INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";
    /// `otlp`, `console` or `none`.
    pub const OTEL_TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
    /// Comma list of `otlp`, `prometheus`, `console`, `none`.
    pub const OTEL_METRICS_EXPORTER: &str = "OTEL_METRICS_EXPORTER";
}

/// How the Prometheus endpoint spells the names above: the rule its `/metrics` encoder applies,
/// public so that whatever writes the same series (the importer's OpenMetrics backfill, a rule
/// or dashboard generator) spells them the same way.
pub mod prometheus {
    /// The Prometheus spelling of a unit (`s` -> `seconds`), `None` for none or an annotation
    /// (`{token}`).
    pub fn unit_suffix(unit: &str) -> Option<&'static str> {
        match unit {
            "s" => Some("seconds"),
            "ms" => Some("milliseconds"),
            "us" => Some("microseconds"),
            "ns" => Some("nanoseconds"),
            "By" => Some("bytes"),
            "1" => Some("ratio"),
            _ => None,
        }
    }

    /// The Prometheus base name of a metric: sanitized (colons kept), with its unit suffix
    /// (`phasetrace.step.duration`, `s` -> `phasetrace_step_duration_seconds`). Counters add
    /// `_total` to it.
    pub fn metric_name(name: &str, unit: &str) -> String {
        let mut n = sanitize(name, true);
        if let Some(u) = unit_suffix(unit)
            && !n.ends_with(u)
        {
            n.push('_');
            n.push_str(u);
        }
        n
    }

    /// The Prometheus label name of an attribute key (`source.file` -> `source_file`).
    pub fn label_name(key: &str) -> String {
        sanitize(key, false)
    }

    /// A metric or label name with every character outside `[a-zA-Z0-9_]` (and `:` when `colons`)
    /// turned into `_`, and `_` before a leading digit.
    pub fn sanitize(name: &str, colons: bool) -> String {
        let mut s: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
            s.insert(0, '_');
        }
        s
    }
}
