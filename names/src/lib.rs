//! The telemetry contract of phasetrace, as plain data: every metric (its name, instrument,
//! unit, attributes and meaning), attribute key, span name, resource key and environment
//! variable that phasetrace emits or reads, the values of its closed attributes (drop reasons,
//! outcomes) and its label vocabularies (the built-in sections, sites, phases and verify parts),
//! each once, and the rule that turns a metric name into its Prometheus spelling.
//!
//! The engine library (`phasetrace`) emits these names; the log importer
//! (`phasetrace-import`), the `phasetrace` command, the dashboards (`dashboards/`), the alert
//! rules (`otel-config/rules/`) and the tests read them from here (as
//! `opentelemetry-semantic-conventions` stands beside `opentelemetry`). The Prometheus spelling
//! is the OTel name with dots turned into underscores, the unit appended (`_seconds`) and
//! `_total` on counters ([`prometheus::metric_name`], [`Metric::prometheus_name`]).
//!
//! Each name is a constant (`metric::SECTION_DURATION`) for code, and a row of its module's
//! `ALL` table ([`metric::ALL`], [`attr::ALL`], ...) for what documents or checks the contract:
//! `cargo xtask docs` writes `docs/telemetry.md` from these tables. A new metric is one entry
//! in the `metrics!` block of [`metric`] (its doc comment is its description; `help`, the one
//! line its instruments carry):
//!
//! ```text
//! /// Counter of ..., attributes `rank`, `group`.
//! NEW_THING = "phasetrace.new.thing" {
//!     instrument: Counter,
//!     unit: UNIT_CALLS,
//!     help: "New things",
//!     attributes: [attr::RANK, attr::GROUP],
//! }
//! ```

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

/// One name of the contract: an attribute key, a span name, a variable or a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Name {
    /// The constant that holds it (`BUCKET` for `attr::BUCKET`).
    pub constant: &'static str,
    /// The name itself (`bucket`).
    pub value: &'static str,
    /// What it means (the constant's doc comment).
    pub description: &'static str,
}

/// What kind of instrument a metric is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instrument {
    /// A monotonic sum (`_total` on Prometheus).
    Counter,
    /// A histogram with the explicit [`metric::DURATION_BOUNDARIES`] (or integer) buckets.
    Histogram,
    /// A base-2 exponential histogram (a Prometheus native histogram).
    ExponentialHistogram,
    /// A value read at each collection.
    Gauge,
}

impl Instrument {
    /// How the reference names it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Instrument::Counter => "counter",
            Instrument::Histogram => "histogram",
            Instrument::ExponentialHistogram => "exponential histogram",
            Instrument::Gauge => "gauge",
        }
    }
}

/// One metric of the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metric {
    /// The constant that holds its name (`SECTION_DURATION`).
    pub constant: &'static str,
    /// The OTel name (`phasetrace.section.duration`).
    pub name: &'static str,
    /// Its instrument.
    pub instrument: Instrument,
    /// Its unit (UCUM, `s`; empty for none).
    pub unit: &'static str,
    /// The one-line description its instruments carry: the `# HELP` line of a scrape, the
    /// description of an OTLP metric (at length: [`Metric::description`]).
    pub help: &'static str,
    /// The attribute keys its series carry (some only when given: the description says which).
    pub attributes: &'static [&'static str],
    /// What it measures (the constant's doc comment).
    pub description: &'static str,
}

impl Metric {
    /// The metric called `name` (its OTel name), from [`metric::ALL`].
    pub fn of(name: &str) -> Option<&'static Metric> {
        metric::ALL.iter().find(|m| m.name == name)
    }

    /// The name a Prometheus scrape shows (`phasetrace_section_layer_time_seconds_total`).
    pub fn prometheus_name(&self) -> String {
        let base = prometheus::metric_name(self.name, self.unit);
        match self.instrument {
            Instrument::Counter => base + "_total",
            _ => base,
        }
    }
}

/// Declares name constants and their module's `ALL` table: `/// doc` `CONSTANT = "value";`.
macro_rules! names {
    ($($(#[doc = $doc:literal])* $constant:ident = $value:literal;)*) => {
        $($(#[doc = $doc])* pub const $constant: &str = $value;)*
        /// Every name of this module, in declaration order, with what it means.
        pub const ALL: &[crate::Name] = &[$(crate::Name {
            constant: stringify!($constant),
            value: $value,
            description: concat!($($doc, "\n"),*),
        }),*];
    };
}

/// Declares metric name constants and [`metric::ALL`]:
/// `/// doc` `CONSTANT = "name" { instrument: Kind, unit: UNIT, help: "...", attributes: [attr::KEY,
/// ...] }`.
macro_rules! metrics {
    ($($(#[doc = $doc:literal])* $constant:ident = $name:literal {
        instrument: $instrument:ident,
        unit: $unit:expr,
        help: $help:literal,
        attributes: [$($attribute:expr),* $(,)?] $(,)?
    })*) => {
        $($(#[doc = $doc])* pub const $constant: &str = $name;)*
        /// Every metric, in declaration order: name, instrument, unit, help, attributes, meaning.
        pub const ALL: &[crate::Metric] = &[$(crate::Metric {
            constant: stringify!($constant),
            name: $name,
            instrument: crate::Instrument::$instrument,
            unit: $unit,
            help: $help,
            attributes: &[$($attribute),*],
            description: concat!($($doc, "\n"),*),
        }),*];
    };
}

/// The instrumentation scope of every instrument and span phasetrace creates (with the crate's
/// version), on its own providers and on the engine's alike.
pub const SCOPE: &str = "phasetrace";

/// Metric names and units. Every metric also carries [`crate::attr::GROUP`], the collective
/// group of the rank (`PHASETRACE_GROUP`).
pub mod metric {
    use crate::attr;

    metrics! {
        /// Histogram of one section's duration in seconds (all layers: quantiles per bucket),
        /// attributes `bucket`, `site` (when given), `rank`: the buckets that quantiles need, without
        /// `layer` (per-layer detail is [`SECTION_LAYER_TIME`] and [`SECTION_LAYER_CALLS`], two
        /// series per (bucket, layer) instead of 25). On the protobuf scrape this and the other
        /// duration histograms also carry a native half (base-2 exponential, in the same
        /// `Histogram` message), which Prometheus stores with `scrape_native_histograms: true`.
        SECTION_DURATION = "phasetrace.section.duration" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Duration of one decode section",
            attributes: [attr::BUCKET, attr::SITE, attr::RANK, attr::GROUP],
        }
        /// Counter of the time spent in one section per layer, in seconds, attributes `bucket`,
        /// `layer`, `site` (when given), `rank` (`phasetrace_section_layer_time_seconds_total`). Off
        /// with `PHASETRACE_LAYER_ATTR=off`.
        SECTION_LAYER_TIME = "phasetrace.section.layer.time" {
            instrument: Counter,
            unit: UNIT_SECONDS,
            help: "Time spent in one decode section per layer",
            attributes: [attr::BUCKET, attr::LAYER, attr::SITE, attr::RANK, attr::GROUP],
        }
        /// Counter of the calls of one section per layer, the same attributes
        /// (`phasetrace_section_layer_calls_total`): the mean per call is time / calls.
        SECTION_LAYER_CALLS = "phasetrace.section.layer.calls" {
            instrument: Counter,
            unit: UNIT_CALLS,
            help: "Calls of one decode section per layer",
            attributes: [attr::BUCKET, attr::LAYER, attr::SITE, attr::RANK, attr::GROUP],
        }
        /// Histogram of one step (a forward pass over the batch) in seconds, attributes `rank`,
        /// `group` and, for a step whose kind the engine stated, `step.kind` (a series per kind
        /// used: prefill and decode steps apart).
        STEP_DURATION = "phasetrace.step.duration" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Duration of one decode step (token)",
            attributes: [attr::RANK, attr::GROUP, attr::STEP_KIND],
        }
        /// Histogram of the time one decode step spent waiting at collective rendezvous probes, in
        /// seconds (the sum over the step's probe sections and reported waits; 0 for a step without
        /// any), attributes `rank`, `group`, `step.kind` (as [`STEP_DURATION`]).
        /// Divided by [`STEP_DURATION`] it is the rank's wait share: the straggler's is the lowest,
        /// and what the others wait beyond it is the step time lost to it. Per step, not per layer:
        /// it costs one histogram per rank whatever the model's depth.
        STEP_COLLECTIVE_WAIT = "phasetrace.step.collective_wait" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Time one decode step of this rank spent waiting at collective rendezvous probes",
            attributes: [attr::RANK, attr::GROUP, attr::STEP_KIND],
        }
        /// Counter of steps, attributes `rank`, `group`, `step.kind` (as [`STEP_DURATION`]).
        STEPS = "phasetrace.steps" {
            instrument: Counter,
            unit: UNIT_STEPS,
            help: "Decode steps",
            attributes: [attr::RANK, attr::GROUP, attr::STEP_KIND],
        }
        /// Gauge of how long the rank's current decode step has been open, in seconds, attributes
        /// `rank`, `group` (`phasetrace_step_open_duration_seconds`); 0 while no step is open, so an
        /// idle engine reads 0 and a hung one (every rank blocked inside a collective) grows. The
        /// longest over the rank's recorders; with a deferred clock (CUDA events) whose stream has
        /// not reached the oldest mark, counted from when the worker first found it pending. Read
        /// at each collection (scrape or export) from when the open step began, so it grows between
        /// the worker's drains: a series per rank with a live recorder, gone with its last recorder.
        /// Alert: `PhasetraceStepHung`.
        STEP_OPEN_DURATION = "phasetrace.step.open_duration" {
            instrument: Gauge,
            unit: UNIT_SECONDS,
            help: "How long the rank's current decode step has been open (0: no step open); a step that began and never ends is a hang",
            attributes: [attr::RANK, attr::GROUP],
        }
        /// Histogram of the time a rank waited at a collective's rendezvous probe, in seconds (its
        /// arrival skew: the straggler waits about 0), attributes `site`, `rank`, `group`: where the
        /// time goes, per collective.
        COLLECTIVE_WAIT = "phasetrace.collective.wait" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Time this rank waited at a collective's rendezvous probe (its arrival skew)",
            attributes: [attr::SITE, attr::RANK, attr::GROUP],
        }
        /// Counter of the time waited at a collective's rendezvous probe per layer, in seconds,
        /// attributes `site`, `layer`, `rank`, `group`
        /// (`phasetrace_collective_layer_wait_time_seconds_total`); kept with
        /// `PHASETRACE_LAYER_ATTR=off` too.
        COLLECTIVE_LAYER_WAIT_TIME = "phasetrace.collective.layer.wait.time" {
            instrument: Counter,
            unit: UNIT_SECONDS,
            help: "Time this rank waited at a collective's rendezvous probe, per layer",
            attributes: [attr::SITE, attr::LAYER, attr::RANK, attr::GROUP],
        }
        /// Counter of the rendezvous waits per layer, the same attributes
        /// (`phasetrace_collective_layer_wait_calls_total`).
        COLLECTIVE_LAYER_WAIT_CALLS = "phasetrace.collective.layer.wait.calls" {
            instrument: Counter,
            unit: UNIT_CALLS,
            help: "Rendezvous waits at a collective per layer",
            attributes: [attr::SITE, attr::LAYER, attr::RANK, attr::GROUP],
        }
        /// Counter of the tokens routed in one MoE layer, counted once per expert each goes to
        /// (tokens x top-k), attributes `layer`, `rank` (`phasetrace_moe_layer_tokens_total`;
        /// opt-in: `PHASETRACE_EXPERT_COUNTER=on`). One series per (layer, rank) whatever the
        /// number of experts; the full per-(layer, expert) counts are in process only
        /// (`Profiler::expert_load`).
        MOE_LAYER_TOKENS = "phasetrace.moe.layer.tokens" {
            instrument: Counter,
            unit: UNIT_TOKENS,
            help: "Tokens routed in one MoE layer, counted once per expert each goes to (tokens x top-k)",
            attributes: [attr::LAYER, attr::RANK, attr::GROUP],
        }
        /// Gauge of a MoE layer's routing imbalance over the rank's last complete window of
        /// `PHASETRACE_EXPERT_WINDOW` steps: the most tokens any expert got divided by the mean
        /// over the layer's experts (1 = perfectly balanced; the number of experts when one expert
        /// got everything), attributes `layer`, `rank`.
        MOE_IMBALANCE = "phasetrace.moe.expert_load.imbalance" {
            instrument: Gauge,
            unit: UNIT_NONE,
            help: "Most tokens of any expert of a MoE layer over the mean per expert, in the rank's last complete window of PHASETRACE_EXPERT_WINDOW steps (1: balanced)",
            attributes: [attr::LAYER, attr::RANK, attr::GROUP],
        }
        /// Gauge of the coefficient of variation (standard deviation / mean) of the tokens per
        /// expert over the same window, attributes `layer`, `rank`.
        MOE_LOAD_CV = "phasetrace.moe.expert_load.cv" {
            instrument: Gauge,
            unit: UNIT_NONE,
            help: "Coefficient of variation of the tokens per expert of a MoE layer, in the same window",
            attributes: [attr::LAYER, attr::RANK, attr::GROUP],
        }
        /// Gauge of a hot expert's share of its layer's tokens in the same window (0..1),
        /// attributes `layer`, `expert`, `rank`, and `ep_rank` (the rank that hosts it) when
        /// `PHASETRACE_EXPERT_PARALLEL` is set: `PHASETRACE_EXPERT_TOP` series per (layer, rank),
        /// the set changing only at a window's end and only for an expert clearly hotter than the
        /// one it replaces.
        MOE_HOT_EXPERT_SHARE = "phasetrace.moe.hot_expert.share" {
            instrument: Gauge,
            unit: UNIT_NONE,
            help: "Share of a MoE layer's tokens routed to one of its hottest experts, in the same window",
            attributes: [attr::LAYER, attr::EXPERT, attr::EP_RANK, attr::RANK, attr::GROUP],
        }
        /// Counter of records dropped, attribute `reason` (`phasetrace::DropReason`): everything
        /// dropped is counted, each reason a series from the start at 0; `Profiler::stats()` holds
        /// the same counts.
        RECORDS_DROPPED = "phasetrace.records.dropped" {
            instrument: Counter,
            unit: UNIT_RECORDS,
            help: "Records dropped, by reason",
            attributes: [attr::REASON, attr::GROUP],
        }
        /// Histogram of one speculative phase per round in seconds, attributes `phase` (draft,
        /// verify, accept, rollback, maint), `rank`.
        SPEC_PHASE_DURATION = "phasetrace.spec.phase.duration" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Duration of one speculative phase in one round",
            attributes: [attr::PHASE, attr::RANK, attr::GROUP],
        }
        /// Histogram of one verify part per round in seconds (level 2), attributes `part` (kda,
        /// kda_scan, mla, ffn, rest), `rank`: `rest` = verify - kda - mla; `kda_scan` is inside
        /// `kda`, `ffn` inside `rest`.
        SPEC_VERIFY_PART_DURATION = "phasetrace.spec.verify.part.duration" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Duration of one verify part in one round",
            attributes: [attr::PART, attr::RANK, attr::GROUP],
        }
        /// Counter of speculative rounds, attribute `rank`.
        SPEC_ROUNDS = "phasetrace.spec.rounds" {
            instrument: Counter,
            unit: UNIT_ROUNDS,
            help: "Speculative rounds",
            attributes: [attr::RANK, attr::GROUP],
        }
        /// Counter of drafted tokens, attribute `rank`: the acceptance rate is accepted / drafted.
        SPEC_DRAFT_TOKENS = "phasetrace.spec.draft_tokens" {
            instrument: Counter,
            unit: UNIT_TOKENS,
            help: "Drafted tokens",
            attributes: [attr::RANK, attr::GROUP],
        }
        /// Counter of accepted tokens, attribute `rank`.
        SPEC_ACCEPTED_TOKENS = "phasetrace.spec.accepted_tokens" {
            instrument: Counter,
            unit: UNIT_TOKENS,
            help: "Accepted tokens",
            attributes: [attr::RANK, attr::GROUP],
        }
        /// Histogram of accepted tokens per round, integer buckets `0..=k_max` (`with_spec_k_max`,
        /// default 16), attribute `rank`.
        SPEC_ACCEPTED_LENGTH = "phasetrace.spec.accepted_length" {
            instrument: Histogram,
            unit: UNIT_TOKENS,
            help: "Accepted tokens per round",
            attributes: [attr::RANK, attr::GROUP],
        }
        /// Counter of the re-reads of the Prometheus endpoint's web configuration file
        /// (`PHASETRACE_PROMETHEUS_WEB_CONFIG`) after it or a file it names changed, attribute
        /// `result` (`phasetrace::names::Outcome`); both series exist, at 0, from the start
        /// (`phasetrace_prometheus_web_config_reloads_total`). Only with a web configuration file.
        PROMETHEUS_WEB_CONFIG_RELOADS = "phasetrace.prometheus.web_config.reloads" {
            instrument: Counter,
            unit: UNIT_RELOADS,
            help: "Re-reads of the Prometheus endpoint's web configuration file after it changed, by result",
            attributes: [attr::RESULT, attr::GROUP],
        }
        /// Gauge, 1 while the web configuration in force is the one on disk and 0 after a change to
        /// it was refused (the endpoint serves the configuration it read before), back to 1 with the
        /// next reload that works; attribute `group` only, no unit (a state, as Prometheus's own
        /// `prometheus_config_last_reload_successful`:
        /// `phasetrace_prometheus_web_config_last_reload_successful`). Only with a web
        /// configuration file; a change is noticed at the next connection or request, so a scrape
        /// reads the state of the file as it is then (an engine exporting only over OTLP reports it
        /// once something connects to its endpoint). Alert: `PhasetraceWebConfigReloadFailed`.
        PROMETHEUS_WEB_CONFIG_LAST_RELOAD_SUCCESSFUL = "phasetrace.prometheus.web_config.last_reload_successful" {
            instrument: Gauge,
            unit: UNIT_NONE,
            help: "1 while the Prometheus endpoint serves the web configuration file as it is on disk, 0 after a change to it was refused (the configuration read before stays in force)",
            attributes: [attr::GROUP],
        }
        /// Counter of OTLP metrics exports, attribute `result` (`phasetrace::names::Outcome`); both
        /// series exist, at 0, from the start (`phasetrace_metric_exports_total`). Only with metrics
        /// over OTLP. A failed export loses nothing (the totals are cumulative; the next export
        /// carries them), but the backend's view is stale meanwhile: this says so (and stderr, once
        /// per outage with the first error, and again when exports work again). Seen at once on the
        /// Prometheus endpoint when both are on, by the collector with the first export that works.
        /// Alert: `PhasetraceMetricsExportFailing`.
        METRIC_EXPORTS = "phasetrace.metric.exports" {
            instrument: Counter,
            unit: UNIT_EXPORTS,
            help: "OTLP metrics exports, by result",
            attributes: [attr::RESULT, attr::GROUP],
        }
        /// Counter of failed OTLP exports, attributes `signal` (`metrics`, `traces`) and `reason`
        /// (`phasetrace::names::ExportFailure`: timeout, connect, tls, redirect,
        /// response_too_large, bad_response, rejected, other); every (signal, reason) of an OTLP
        /// exporter that is on is a series from the start
        /// (`phasetrace_otlp_export_failures_total`). Each export ends within the OTLP timeout,
        /// reads at most 64 KiB of an answer and follows no redirect; the first failure of an
        /// outage is said once on stderr with its reason.
        OTLP_EXPORT_FAILURES = "phasetrace.otlp.export.failures" {
            instrument: Counter,
            unit: UNIT_EXPORTS,
            help: "Failed OTLP exports, by signal and reason",
            attributes: [attr::SIGNAL, attr::REASON, attr::GROUP],
        }
        /// Counter of the connections the Prometheus endpoint closed before their client was
        /// done, attribute `reason` (`phasetrace::names::ConnectionClose`: evicted or refused at
        /// the bound on connections, no request head in time, idle too long); every reason a
        /// series from the start (`phasetrace_prometheus_connections_closed_total`). Only with
        /// the endpoint on.
        PROMETHEUS_CONNECTIONS_CLOSED = "phasetrace.prometheus.connections.closed" {
            instrument: Counter,
            unit: UNIT_CONNECTIONS,
            help: "Connections the Prometheus endpoint closed before their client was done, by reason",
            attributes: [attr::REASON, attr::GROUP],
        }
        /// Counter of the requests the Prometheus endpoint refused at basic auth, attribute
        /// `reason` (`phasetrace::names::AuthRefusal`: 401 unauthorized, 429 busy); every reason
        /// a series from the start (`phasetrace_prometheus_auth_refused_total`). Only with a web
        /// configuration file.
        PROMETHEUS_AUTH_REFUSED = "phasetrace.prometheus.auth.refused" {
            instrument: Counter,
            unit: UNIT_REQUESTS,
            help: "Requests the Prometheus endpoint refused at basic auth, by reason",
            attributes: [attr::REASON, attr::GROUP],
        }
        /// Base-2 exponential histogram of one section's duration per layer, in seconds,
        /// attributes `bucket`, `layer`, `site` (when given), `rank`, `group`
        /// (`phasetrace_section_layer_duration_seconds`, a native histogram). Served on the
        /// protobuf scrape (Prometheus with `scrape_native_histograms: true`) and over OTLP when
        /// its histograms are exponential; the text scrapes and OTLP with explicit buckets leave it
        /// out (their per-layer detail is [`SECTION_LAYER_TIME`] and [`SECTION_LAYER_CALLS`]); an
        /// engine's own meter provider gets it only with `phasetrace::view(true)` registered. Off
        /// with `PHASETRACE_LAYER_ATTR=off`.
        SECTION_LAYER_DURATION = "phasetrace.section.layer.duration" {
            instrument: ExponentialHistogram,
            unit: UNIT_SECONDS,
            help: "Duration of one decode section per layer (a native histogram: protobuf scrape and OTLP only)",
            attributes: [attr::BUCKET, attr::LAYER, attr::SITE, attr::RANK, attr::GROUP],
        }
        /// Base-2 exponential histogram of the time waited at a collective's rendezvous probe per
        /// layer, in seconds, attributes `site`, `layer`, `rank`, `group`
        /// (`phasetrace_collective_layer_wait_duration_seconds`, a native histogram); exported as
        /// [`SECTION_LAYER_DURATION`] is.
        COLLECTIVE_LAYER_WAIT_DURATION = "phasetrace.collective.layer.wait.duration" {
            instrument: ExponentialHistogram,
            unit: UNIT_SECONDS,
            help: "Time this rank waited at a collective's rendezvous probe per layer (a native histogram: protobuf scrape and OTLP only)",
            attributes: [attr::SITE, attr::LAYER, attr::RANK, attr::GROUP],
        }
        // Requests under continuous batching: the OpenTelemetry GenAI semantic conventions'
        // server metrics (names, units, advised boundaries and attributes as the conventions give
        // them), then what the conventions lack and serving engines export. Recorded by the
        // worker when a request ends (`Recorder::request_end`), one observation per request,
        // attributes `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`,
        // `gen_ai.response.model`, `error.type` (failed requests only) and `group`.
        /// Histogram of a request's duration in seconds, from its arrival
        /// (`Recorder::request_begin`) to its end (`Recorder::request_end`), failed requests
        /// included (with `error.type`) (`gen_ai_server_request_duration_seconds`): the GenAI
        /// conventions' metric, with their advised boundaries [`GEN_AI_REQUEST_DURATION_BOUNDARIES`].
        GEN_AI_SERVER_REQUEST_DURATION = "gen_ai.server.request.duration" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "GenAI server request duration such as time-to-last byte or last output token",
            attributes: [attr::GEN_AI_OPERATION_NAME, attr::GEN_AI_PROVIDER_NAME, attr::GEN_AI_REQUEST_MODEL, attr::GEN_AI_RESPONSE_MODEL, attr::ERROR_TYPE, attr::GROUP],
        }
        /// Histogram of the time from a request's arrival to its first output token (the end of
        /// the step that produced it), in seconds, successful requests only
        /// (`gen_ai_server_time_to_first_token_seconds`); boundaries [`GEN_AI_TTFT_BOUNDARIES`].
        GEN_AI_SERVER_TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Time to generate first token for successful responses",
            attributes: [attr::GEN_AI_OPERATION_NAME, attr::GEN_AI_PROVIDER_NAME, attr::GEN_AI_REQUEST_MODEL, attr::GEN_AI_RESPONSE_MODEL, attr::ERROR_TYPE, attr::GROUP],
        }
        /// Histogram of the time per output token after the first, in seconds: (end - first
        /// token) / (output tokens - 1), successful requests with two output tokens or more
        /// (`gen_ai_server_time_per_output_token_seconds`); boundaries [`GEN_AI_TPOT_BOUNDARIES`].
        /// Alert: `PhasetraceTimePerOutputTokenHigh`.
        GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Time per output token generated after the first token for successful responses",
            attributes: [attr::GEN_AI_OPERATION_NAME, attr::GEN_AI_PROVIDER_NAME, attr::GEN_AI_REQUEST_MODEL, attr::GEN_AI_RESPONSE_MODEL, attr::ERROR_TYPE, attr::GROUP],
        }
        /// Histogram of the time a request waited before the first step that served it, in
        /// seconds (`phasetrace_request_queue_time_seconds`; vLLM's `request_queue_time`), the
        /// GenAI attributes; boundaries [`GEN_AI_TTFT_BOUNDARIES`].
        REQUEST_QUEUE_TIME = "phasetrace.request.queue_time" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Time a request waited before the first step that served it",
            attributes: [attr::GEN_AI_OPERATION_NAME, attr::GEN_AI_PROVIDER_NAME, attr::GEN_AI_REQUEST_MODEL, attr::GEN_AI_RESPONSE_MODEL, attr::ERROR_TYPE, attr::GROUP],
        }
        /// Histogram of a request's prefill, in seconds: from the start of the first step that
        /// served it to its first output token (`phasetrace_request_prefill_time_seconds`);
        /// boundaries [`GEN_AI_TTFT_BOUNDARIES`].
        REQUEST_PREFILL_TIME = "phasetrace.request.prefill_time" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Time from a request's first step to its first output token",
            attributes: [attr::GEN_AI_OPERATION_NAME, attr::GEN_AI_PROVIDER_NAME, attr::GEN_AI_REQUEST_MODEL, attr::GEN_AI_RESPONSE_MODEL, attr::ERROR_TYPE, attr::GROUP],
        }
        /// Histogram of a request's decode, in seconds: from its first output token to its end
        /// (`phasetrace_request_decode_time_seconds`); boundaries
        /// [`GEN_AI_REQUEST_DURATION_BOUNDARIES`].
        REQUEST_DECODE_TIME = "phasetrace.request.decode_time" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "Time from a request's first output token to its end",
            attributes: [attr::GEN_AI_OPERATION_NAME, attr::GEN_AI_PROVIDER_NAME, attr::GEN_AI_REQUEST_MODEL, attr::GEN_AI_RESPONSE_MODEL, attr::ERROR_TYPE, attr::GROUP],
        }
        /// Histogram of a request's share of the time of the steps that served it, in seconds:
        /// each step's duration times the request's tokens in it over the step's tokens, summed
        /// over its steps on the rank that began it (`phasetrace_request_step_share_seconds`);
        /// boundaries [`GEN_AI_REQUEST_DURATION_BOUNDARIES`]. Below the request's duration by
        /// what the batch's other requests took of the same steps (and by the queue).
        REQUEST_STEP_SHARE = "phasetrace.request.step_share" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "A request's share of the time of the steps that served it, by its tokens",
            attributes: [attr::GEN_AI_OPERATION_NAME, attr::GEN_AI_PROVIDER_NAME, attr::GEN_AI_REQUEST_MODEL, attr::GEN_AI_RESPONSE_MODEL, attr::ERROR_TYPE, attr::GROUP],
        }
        /// Histogram of a request's share of the time its steps waited at collective rendezvous
        /// (`phasetrace.step.collective_wait` shared as [`REQUEST_STEP_SHARE`] is), in seconds, on
        /// the rank that began it (`phasetrace_request_collective_wait_share_seconds`); boundaries
        /// [`GEN_AI_TTFT_BOUNDARIES`]. Per rank on the request's span.
        REQUEST_COLLECTIVE_WAIT_SHARE = "phasetrace.request.collective_wait_share" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "A request's share of the collective rendezvous waits of the steps that served it",
            attributes: [attr::GEN_AI_OPERATION_NAME, attr::GEN_AI_PROVIDER_NAME, attr::GEN_AI_REQUEST_MODEL, attr::GEN_AI_RESPONSE_MODEL, attr::ERROR_TYPE, attr::GROUP],
        }
        /// Histogram of a request's share of each speculative phase of the rounds that served
        /// it, in seconds: each round's phase times the request's tokens in the step the round
        /// overlaps over that step's tokens, summed over its rounds on the rank that began it
        /// (`phasetrace_request_phase_share_seconds`), attribute `phase` beside the GenAI ones,
        /// requests that a round served only; boundaries [`GEN_AI_REQUEST_DURATION_BOUNDARIES`].
        /// Also on the request's span ([`attr::REQUEST_PHASE_SHARE`]).
        REQUEST_PHASE_SHARE = "phasetrace.request.phase_share" {
            instrument: Histogram,
            unit: UNIT_SECONDS,
            help: "A request's share of each speculative phase of the rounds that served it",
            attributes: [attr::PHASE, attr::GEN_AI_OPERATION_NAME, attr::GEN_AI_PROVIDER_NAME, attr::GEN_AI_REQUEST_MODEL, attr::GEN_AI_RESPONSE_MODEL, attr::ERROR_TYPE, attr::GROUP],
        }
        /// Histogram of the drafted tokens accepted per request under speculative decoding
        /// (`Recorder::serve_speculative`), requests with a drafted token only
        /// (`phasetrace_request_accepted_tokens`); boundaries [`REQUEST_TOKEN_BOUNDARIES`].
        REQUEST_ACCEPTED_TOKENS = "phasetrace.request.accepted_tokens" {
            instrument: Histogram,
            unit: UNIT_TOKENS,
            help: "Drafted tokens accepted per request under speculative decoding",
            attributes: [attr::GEN_AI_OPERATION_NAME, attr::GEN_AI_PROVIDER_NAME, attr::GEN_AI_REQUEST_MODEL, attr::GEN_AI_RESPONSE_MODEL, attr::ERROR_TYPE, attr::GROUP],
        }
        /// Histogram of the requests one step served (its batch), attributes `rank`, `group`,
        /// `step.kind` (as [`STEP_DURATION`]) (`phasetrace_batch_size`), steps that served at
        /// least one; boundaries [`BATCH_SIZE_BOUNDARIES`].
        BATCH_SIZE = "phasetrace.batch.size" {
            instrument: Histogram,
            unit: UNIT_REQUESTS,
            help: "Requests one step served",
            attributes: [attr::RANK, attr::GROUP, attr::STEP_KIND],
        }
        /// Gauge of the requests begun and not yet served by any step (the queue), attribute
        /// `group` (`phasetrace_requests_waiting`).
        REQUESTS_WAITING = "phasetrace.requests.waiting" {
            instrument: Gauge,
            unit: UNIT_REQUESTS,
            help: "Requests begun and not yet served by a step (the queue)",
            attributes: [attr::GROUP],
        }
        /// Gauge of the requests served by a step and not yet ended (in flight), attribute
        /// `group` (`phasetrace_requests_running`).
        REQUESTS_RUNNING = "phasetrace.requests.running" {
            instrument: Gauge,
            unit: UNIT_REQUESTS,
            help: "Requests served by a step and not yet ended (in flight)",
            attributes: [attr::GROUP],
        }
        // Serving-engine state: what the engine's block manager and scheduler report
        // (`Recorder::kv_cache`, `Recorder::prefix_cache`, `Recorder::preempted`) and the
        // tokens of each step by prefill and decode. The GenAI conventions name none of them;
        // each says which vLLM or SGLang metric it mirrors.
        /// Gauge of the KV-cache blocks in use, as the engine last reported them
        /// (`Recorder::kv_cache`), attribute `group` (`phasetrace_kv_cache_blocks_used`;
        /// SGLang's `num_used_tokens` counts the same in tokens). Exported once reported.
        KV_CACHE_BLOCKS_USED = "phasetrace.kv_cache.blocks.used" {
            instrument: Gauge,
            unit: UNIT_BLOCKS,
            help: "KV-cache blocks in use",
            attributes: [attr::GROUP],
        }
        /// Gauge of the KV-cache blocks the engine has in all (`Recorder::kv_cache`), attribute
        /// `group` (`phasetrace_kv_cache_blocks_total`; vLLM's `num_gpu_blocks` label of
        /// `cache_config_info`). Exported once reported.
        KV_CACHE_BLOCKS_TOTAL = "phasetrace.kv_cache.blocks.total" {
            instrument: Gauge,
            unit: UNIT_BLOCKS,
            help: "KV-cache blocks in all",
            attributes: [attr::GROUP],
        }
        /// Gauge of the share of the KV cache in use, used over total blocks, 0 to 1, attribute
        /// `group` (`phasetrace_kv_cache_usage_ratio`; vLLM's `kv_cache_usage_perc`, also 0 to
        /// 1, SGLang's `token_usage`). Exported once reported.
        KV_CACHE_USAGE = "phasetrace.kv_cache.usage" {
            instrument: Gauge,
            unit: UNIT_RATIO,
            help: "Share of the KV cache in use, used over total blocks",
            attributes: [attr::GROUP],
        }
        /// Counter of the prompt tokens looked up in the prefix cache
        /// (`Recorder::prefix_cache`), attribute `group` (`phasetrace_prefix_cache_queries_total`;
        /// vLLM's `prefix_cache_queries`, in tokens too). Exported once reported.
        PREFIX_CACHE_QUERIES = "phasetrace.prefix_cache.queries" {
            instrument: Counter,
            unit: UNIT_TOKENS,
            help: "Prompt tokens looked up in the prefix cache",
            attributes: [attr::GROUP],
        }
        /// Counter of the prompt tokens found in the prefix cache (`Recorder::prefix_cache`),
        /// attribute `group` (`phasetrace_prefix_cache_hits_total`; vLLM's
        /// `prefix_cache_hits`; hits over queries is SGLang's `cache_hit_rate`). Exported once
        /// reported.
        PREFIX_CACHE_HITS = "phasetrace.prefix_cache.hits" {
            instrument: Counter,
            unit: UNIT_TOKENS,
            help: "Prompt tokens found in the prefix cache",
            attributes: [attr::GROUP],
        }
        /// Counter of the requests the scheduler preempted (evicted from the running batch for
        /// want of KV-cache blocks, to be resumed later) (`Recorder::preempted`), attribute
        /// `group` (`phasetrace_preemptions_total`; vLLM's `num_preemptions`). Exported from
        /// the first `Recorder::kv_cache` or `Recorder::preempted` on.
        PREEMPTIONS = "phasetrace.preemptions" {
            instrument: Counter,
            unit: UNIT_PREEMPTIONS,
            help: "Requests preempted for want of KV-cache blocks",
            attributes: [attr::GROUP],
        }
        /// Histogram of the tokens one step computed for its requests, by
        /// `gen_ai.token.type`: `input` for requests in prefill (their prompt, or a chunk of
        /// it, up to their first output token), `output` for requests in decode (1 a step, or a
        /// speculative round's drafted + 1), one observation per type present in the step,
        /// attributes `rank`, `group` (`phasetrace_step_tokens`; vLLM's
        /// `iteration_tokens_total` is their sum per step, its `prompt_tokens` and
        /// `generation_tokens` counters are this histogram's sums); boundaries
        /// [`STEP_TOKEN_BOUNDARIES`]. From the steps' [`REQUESTS_RUNNING`] requests
        /// (`Recorder::serve`); a step that served none observes nothing.
        STEP_TOKENS = "phasetrace.step.tokens" {
            instrument: Histogram,
            unit: UNIT_TOKENS,
            help: "Tokens one step computed for its requests, by prefill and decode",
            attributes: [attr::GEN_AI_TOKEN_TYPE, attr::RANK, attr::GROUP],
        }
    }

    /// The GenAI conventions' advised boundaries of [`GEN_AI_SERVER_REQUEST_DURATION`], s.
    pub const GEN_AI_REQUEST_DURATION_BOUNDARIES: [f64; 14] = [
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    ];
    /// The GenAI conventions' advised boundaries of [`GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN`], s.
    pub const GEN_AI_TPOT_BOUNDARIES: [f64; 13] = [
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    ];
    /// The GenAI conventions' advised boundaries of [`GEN_AI_SERVER_TIME_TO_FIRST_TOKEN`], s.
    pub const GEN_AI_TTFT_BOUNDARIES: [f64; 16] = [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    ];
    /// Boundaries of [`REQUEST_ACCEPTED_TOKENS`], tokens.
    pub const REQUEST_TOKEN_BOUNDARIES: [f64; 13] = [
        0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
    ];
    /// Boundaries of [`BATCH_SIZE`], requests.
    pub const BATCH_SIZE_BOUNDARIES: [f64; 11] = [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
    ];
    /// Boundaries of [`STEP_TOKENS`], tokens (vLLM's `iteration_tokens_total` buckets and
    /// powers of two below them).
    pub const STEP_TOKEN_BOUNDARIES: [f64; 15] = [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
        16384.0,
    ];
    /// Unit of the KV-cache block gauges.
    pub const UNIT_BLOCKS: &str = "{block}";
    /// Unit of [`PREEMPTIONS`].
    pub const UNIT_PREEMPTIONS: &str = "{preemption}";
    /// Unit of a share between 0 and 1 ([`KV_CACHE_USAGE`]).
    pub const UNIT_RATIO: &str = "1";
    /// Unit of [`BATCH_SIZE`], the request gauges and the Prometheus endpoint's refused-auth
    /// counter.
    pub const UNIT_REQUESTS: &str = "{request}";

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
    /// Unit of the Prometheus endpoint's closed-connections counter.
    pub const UNIT_CONNECTIONS: &str = "{connection}";
    /// No unit (a ratio or a state).
    pub const UNIT_NONE: &str = "";

    // Per-layer latency distributions (native histograms): one series per histogram, so they
    // are exported only where a histogram costs one series (the protobuf scrape, OTLP).

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
    names! {
        /// Section bucket name (`kda_mixer`).
        BUCKET = "bucket";
        /// Layer index.
        LAYER = "layer";
        /// Collective or call site (`attn`, `mlp`).
        SITE = "site";
        /// Rank of the process or thread in the tensor-parallel group.
        RANK = "rank";
        /// The collective group a rank belongs to (on every series and span): ranks are compared
        /// only within their group.
        GROUP = "group";
        /// MoE expert id.
        EXPERT = "expert";
        /// The expert-parallel rank that hosts an expert (`PHASETRACE_EXPERT_PARALLEL`).
        EP_RANK = "ep_rank";
        /// Why a record was dropped.
        REASON = "reason";
        /// How a re-read of the web configuration file or a metrics export ended
        /// (`phasetrace::names::Outcome`).
        RESULT = "result";
        /// The OTLP signal an export carried (`phasetrace_names::signal`).
        SIGNAL = "signal";
        /// Speculative phase.
        PHASE = "phase";
        /// Verify part.
        PART = "part";
        /// Step number (span attribute).
        STEP = "step";
        /// What a step computed: `prefill`, `decode`, `mixed` (chunked prefill) or `speculative`
        /// (`vocab::STEP_KINDS`), as the engine stated it when the step began; absent for a step
        /// of no stated kind. On the step metrics and the step span. SGLang's `forward_mode`
        /// (`extend`, `decode`, `mixed`, `target_verify`) in the OpenTelemetry attribute style;
        /// the GenAI conventions define no step-level attribute.
        STEP_KIND = "step.kind";
        /// Expert ids routed in a layer at a step (on the step's `moe.route` events, and on the
        /// layer's rendezvous-probe spans, at most 256 there).
        EXPERT_IDS = "moe.expert_ids";
        /// How many expert ids the layer routed in the step (on rendezvous-probe spans, beside
        /// [`EXPERT_IDS`], which holds at most 256 of them).
        EXPERT_IDS_COUNT = "moe.expert_ids.count";
        /// Drafted tokens in a round (span attribute).
        K = "k";
        /// Accepted tokens in a round (span attribute).
        ACCEPTED = "accepted";
        /// Timing backend (span attribute).
        TIMING = "phasetrace.timing";
        /// Why a step, round or request was traced: `head` (one in `PHASETRACE_TRACE_EVERY`),
        /// `tail` (slower than `PHASETRACE_TRACE_SLOWER_THAN`, or a request over
        /// `PHASETRACE_TRACE_REQUESTS_TTFT_OVER` / `..._TPOT_OVER`) or `request` (a step that
        /// served a traced request) (span attribute).
        SAMPLED = "phasetrace.sampled";
        /// The GenAI operation of a request (`chat`, `text_completion`, `generate_content`):
        /// required by the GenAI conventions on their metrics and spans.
        GEN_AI_OPERATION_NAME = "gen_ai.operation.name";
        /// The GenAI provider (the serving engine or its operator's name): required by the GenAI
        /// conventions.
        GEN_AI_PROVIDER_NAME = "gen_ai.provider.name";
        /// The model the request asked for.
        GEN_AI_REQUEST_MODEL = "gen_ai.request.model";
        /// The model that served it.
        GEN_AI_RESPONSE_MODEL = "gen_ai.response.model";
        /// Why a request failed (set only on failed requests), as the conventions' `error.type`.
        ERROR_TYPE = "error.type";
        /// The engine's request id (request span attribute, as `gen_ai.response.id`).
        GEN_AI_RESPONSE_ID = "gen_ai.response.id";
        /// Why the request ended (`stop`, `length`, `cancelled`, `error`), a one-element array as
        /// the conventions' `gen_ai.response.finish_reasons` (request span attribute).
        GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons";
        /// Prompt tokens the steps computed for the request (request span attribute).
        GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens";
        /// Output tokens the request got (request span attribute).
        GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens";
        /// The GenAI conventions' token type on [`crate::metric::STEP_TOKENS`]: `input`
        /// (prefill) or `output` (decode).
        GEN_AI_TOKEN_TYPE = "gen_ai.token.type";
        /// Seconds from arrival to the first step that served the request (request span
        /// attribute, as vLLM's).
        GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue";
        /// Seconds from arrival to the first output token (request span attribute, as vLLM's).
        GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token";
        /// Seconds from arrival to the end (request span attribute, as vLLM's).
        GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e";
        /// Seconds of prefill (request span attribute, as vLLM's).
        GEN_AI_LATENCY_TIME_IN_PREFILL = "gen_ai.latency.time_in_model_prefill";
        /// Seconds of decode (request span attribute, as vLLM's).
        GEN_AI_LATENCY_TIME_IN_DECODE = "gen_ai.latency.time_in_model_decode";
        /// Seconds of the request's share of its steps' time (request span attribute: vLLM's
        /// `time_in_model_forward` shared by tokens, see `metric::REQUEST_STEP_SHARE`).
        GEN_AI_LATENCY_TIME_IN_MODEL_FORWARD = "gen_ai.latency.time_in_model_forward";
        /// Seconds per output token after the first (request span attribute).
        GEN_AI_LATENCY_TIME_PER_OUTPUT_TOKEN = "gen_ai.latency.time_per_output_token";
        /// Steps that served the request (request span attribute).
        REQUEST_STEPS = "phasetrace.request.steps";
        /// The request's share of its steps' rendezvous waits, seconds, on the rank that began it
        /// (request span attribute).
        REQUEST_WAIT_SHARE = "phasetrace.request.collective_wait_share";
        /// The ranks that served the request, in the order of [`REQUEST_WAIT_BY_RANK`] (request
        /// span attribute, an array).
        REQUEST_RANKS = "phasetrace.request.ranks";
        /// Each rank's share of its steps' rendezvous waits for the request, seconds (request
        /// span attribute, an array beside [`REQUEST_RANKS`]).
        REQUEST_WAIT_BY_RANK = "phasetrace.request.collective_wait_share_by_rank";
        /// The speculative phases, in the order of [`REQUEST_PHASE_SHARE`] (request span
        /// attribute, an array; requests that a round served only).
        REQUEST_PHASES = "phasetrace.request.phases";
        /// The request's share of each phase of the rounds that served it, seconds, on the
        /// rank that began it (request span attribute, an array beside [`REQUEST_PHASES`]; see
        /// `metric::REQUEST_PHASE_SHARE`).
        REQUEST_PHASE_SHARE = "phasetrace.request.phase_share";
        /// The rank that waited least for the request's steps, the one the others waited for
        /// (request span attribute; with more than one rank).
        REQUEST_WAITED_FOR_RANK = "phasetrace.request.waited_for_rank";
        /// Drafted tokens of the request under speculative decoding (request span attribute).
        REQUEST_DRAFTED_TOKENS = "phasetrace.request.drafted_tokens";
        /// Accepted drafted tokens of the request (request span attribute).
        REQUEST_ACCEPTED_TOKENS = "phasetrace.request.accepted_tokens";
        /// Steps of the request, on any rank, whose `request.step` span was not built: beyond
        /// the bound of spans per request, served before the request was found slow, or
        /// drained before the request's begin (request span attribute).
        REQUEST_STEPS_UNTRACED = "phasetrace.request.steps_untraced";
        /// The request's tokens computed in one step (`request.step` span attribute).
        REQUEST_STEP_TOKENS = "phasetrace.request.step.tokens";
        /// The request's output tokens from one step (`request.step` span attribute).
        REQUEST_STEP_OUTPUT_TOKENS = "phasetrace.request.step.output_tokens";
        /// The request's share of one step's time, seconds (`request.step` span attribute).
        REQUEST_STEP_SHARE = "phasetrace.request.step.share";
        /// The request's share of one step's rendezvous waits, seconds (`request.step` span
        /// attribute).
        REQUEST_STEP_WAIT_SHARE = "phasetrace.request.step.collective_wait_share";
        /// The requests a step served (step span attribute).
        BATCH_SIZE = "phasetrace.batch.size";
        /// The tokens a step computed over its batch (step span attribute).
        BATCH_TOKENS = "phasetrace.batch.tokens";
        /// Traced requests of the step's batch beyond its bound of links (step span attribute).
        BATCH_LINKS_DROPPED = "phasetrace.batch.links_dropped";
        /// Where host-clock boundaries are read from, `tsc` or `monotonic` (resource attribute; see
        /// `phasetrace::timing::host_source`).
        HOST_CLOCK = "phasetrace.host_clock";
        /// The caller's tag of an imported speculative line (`glm5-phase`).
        TAG = "tag";
        /// The log file an imported record came from.
        SOURCE_FILE = "source.file";
        /// The run (process start) within an imported log.
        SOURCE_RUN = "source.run";
    }
}

/// Resource attribute keys (OpenTelemetry semantic conventions) that phasetrace sets.
///
/// `telemetry.sdk.*` describe the OpenTelemetry SDK underneath and are the SDK's own;
/// phasetrace, a distribution of it, names itself in `telemetry.distro.*`.
pub mod resource {
    names! {
        /// The service (`OTEL_SERVICE_NAME`).
        SERVICE_NAME = "service.name";
        /// This process's id.
        PROCESS_PID = "process.pid";
        /// This process's executable file name.
        PROCESS_EXECUTABLE_NAME = "process.executable.name";
        /// The host's name.
        HOST_NAME = "host.name";
        /// `phasetrace`.
        TELEMETRY_DISTRO_NAME = "telemetry.distro.name";
        /// phasetrace's version.
        TELEMETRY_DISTRO_VERSION = "telemetry.distro.version";
    }

    /// The value of [`TELEMETRY_DISTRO_NAME`].
    pub const DISTRO: &str = "phasetrace";
}

/// Span names (sections are named by their bucket).
pub mod span {
    names! {
        /// One decode step (token).
        STEP = "decode.step";
        /// One layer inside a step.
        LAYER = "layer";
        /// One speculative round.
        ROUND = "spec.round";
        /// One step's part in a traced request, in the request's trace, linked to the step's
        /// `decode.step` span (in its own trace).
        REQUEST_STEP = "request.step";
        /// The span event carrying routed expert ids.
        MOE_ROUTE_EVENT = "moe.route";
    }
}

/// Environment variables read by `phasetrace::Config::from_env`.
pub mod env {
    include!("env.rs");

    /// Rank fallbacks set by launchers, read in this order after `PHASETRACE_RANK`.
    pub const RANK_FALLBACKS: [&str; 3] = ["RANK", LOCAL_RANK, "OMPI_COMM_WORLD_RANK"];
    /// The launcher's rank of this process on its host (torchrun, `mpirun`): a rank fallback,
    /// and the Prometheus port offset (`9464 + LOCAL_RANK`).
    pub const LOCAL_RANK: &str = "LOCAL_RANK";
}

/// The values of the `reason` attribute of [`metric::RECORDS_DROPPED`]: why a record was
/// dropped (`phasetrace::DropReason`, whose `as_str` spells these). Every reason has a series
/// from the start (at 0), so that `rate()` over it reads 0, not "no data".
pub mod reason {
    names! {
        /// The per-thread buffer was full.
        QUEUE_FULL = "queue_full";
        /// An end without a begin, or a begin never ended.
        UNBALANCED = "unbalanced";
        /// The clock could not give or resolve a timestamp (pool exhausted, event error).
        CLOCK = "clock";
        /// A value outside what the record format holds (an expert id above 65535).
        OUT_OF_RANGE = "out_of_range";
        /// Spans not built because the span processor's queue was full (collector slow or down).
        SPAN_QUEUE = "span_queue";
        /// Spans lost because their export failed (collector down or refusing).
        SPAN_EXPORT = "span_export";
        /// Slow steps or rounds not traced because their rank's tail-trace budget
        /// (`PHASETRACE_TRACE_SLOW_BUDGET` a second) was spent: one record per step or round.
        TAIL_BUDGET = "tail_budget";
        /// Sections, expert ids or waits of one step beyond what the worker holds for its trace
        /// (the step is still measured; its trace is built without them).
        TRACE_BOUND = "trace_bound";
        /// Boundaries of a CUDA-graph replay whose events a later launch re-recorded before the
        /// worker read them (or whose graph was dropped first): counted, never attributed to
        /// another replay.
        GRAPH_REPLAY = "graph_replay";
        /// Requests beyond what the worker keeps open at once (65,536) or serves in one step
        /// (4,096): their telemetry is not recorded.
        REQUEST_BOUND = "request_bound";
        /// A step, round or request still open when the profiler shut down (the engine never
        /// ended it): what it would have recorded at its end is not recorded.
        OPEN_AT_SHUTDOWN = "open_at_shutdown";
        /// A second end of a request already ended (a sequence finishing in its prompt step
        /// and ended again): ignored, the request counted once.
        ENDED_TWICE = "ended_twice";
    }
}

/// The values of the `result` attribute of [`metric::PROMETHEUS_WEB_CONFIG_RELOADS`] (a re-read
/// of the web configuration file) and [`metric::METRIC_EXPORTS`] (one OTLP metrics export):
/// how an attempt ended (`phasetrace::names::Outcome`). Both have a series from the start.
pub mod outcome {
    names! {
        /// It worked: for a reload, new connections and requests use the file read.
        OK = "ok";
        /// It failed: a reload keeps the configuration read before (a warning on stderr says
        /// why); a failed export is retried with the next interval's cumulative totals.
        FAILED = "failed";
    }
}

/// The values of the `reason` attribute of [`metric::OTLP_EXPORT_FAILURES`]: why an OTLP export
/// failed (`phasetrace::names::ExportFailure`). Every reason has a series from the start (at 0).
pub mod export_failure {
    names! {
        /// The export did not end within the OTLP timeout (no answer, an answer too slow, an
        /// HTTP/2 connection kept busy with PINGs or SETTINGS).
        TIMEOUT = "timeout";
        /// No connection to the endpoint (refused, unreachable, closed before an answer).
        CONNECT = "connect";
        /// The TLS handshake failed (a certificate for another name, not signed by a trusted CA).
        TLS = "tls";
        /// The endpoint answered with a redirect (3xx); an OTLP exporter follows none.
        REDIRECT = "redirect";
        /// The answer was larger than the exporter reads (64 KiB): the connection was dropped.
        RESPONSE_TOO_LARGE = "response_too_large";
        /// The answer was not OTLP: not protobuf, or not HTTP/2 frames.
        BAD_RESPONSE = "bad_response";
        /// The endpoint refused the export (an HTTP status of 400 or more, a gRPC error status).
        REJECTED = "rejected";
        /// Anything else (the text is on stderr).
        OTHER = "other";
    }
}

/// The values of the `signal` attribute of [`metric::OTLP_EXPORT_FAILURES`]: the OTLP signal an
/// export carried.
pub mod signal {
    names! {
        /// Metrics (`/v1/metrics`, `MetricsService/Export`).
        METRICS = "metrics";
        /// Traces (`/v1/traces`, `TraceService/Export`).
        TRACES = "traces";
    }
}

/// The values of the `reason` attribute of [`metric::PROMETHEUS_CONNECTIONS_CLOSED`]: why the
/// Prometheus endpoint closed a connection before its client was done
/// (`phasetrace::names::ConnectionClose`). Every reason has a series from the start (at 0).
pub mod connection_close {
    names! {
        /// At the bound on connections, the oldest idle one (no complete request head yet, or
        /// kept alive between requests) was closed to admit a new one.
        EVICTED = "evicted";
        /// At the bound, with every connection in the middle of a request: the new one was
        /// closed.
        REFUSED = "refused";
        /// No complete request head within the head time (slowloris, a port scanner).
        HEAD_TIMEOUT = "head_timeout";
        /// Kept alive without a new request for the idle time.
        IDLE_TIMEOUT = "idle_timeout";
    }
}

/// The values of the `reason` attribute of [`metric::PROMETHEUS_AUTH_REFUSED`]: why the
/// Prometheus endpoint refused a request at basic auth (`phasetrace::names::AuthRefusal`).
/// Every reason has a series from the start (at 0).
pub mod auth_refusal {
    names! {
        /// 401: no credentials, malformed ones, an unknown user or a wrong password.
        UNAUTHORIZED = "unauthorized";
        /// 429: credentials not verified before, and no room for their check: the client's
        /// address had its share of checks waiting, or its check gave way to one from an
        /// address that asked for fewer.
        BUSY = "busy";
    }
}

/// The label vocabularies: the values of the `bucket`, `site`, `phase` and `part` attributes
/// that phasetrace knows without being told (`phasetrace::Section`, `Site`, `Phase`,
/// `VerifyPart`). An engine may register sections and sites of its own; phases and parts are
/// closed.
pub mod vocab {
    /// A built-in section bucket: its `bucket` value, how it is recorded by level, and what it
    /// times.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Section {
        /// The `bucket` value (`kda_mixer`).
        pub value: &'static str,
        /// `compute` (level `full` only), `collective` (levels `full` and `collectives`) or
        /// `probe` (a rendezvous probe: both levels, and it feeds `phasetrace.collective.wait`).
        pub kind: &'static str,
        /// What it times.
        pub description: &'static str,
    }

    const fn section(
        value: &'static str,
        kind: &'static str,
        description: &'static str,
    ) -> Section {
        Section {
            value,
            kind,
            description,
        }
    }

    const fn label(value: &'static str, description: &'static str) -> crate::Name {
        crate::Name {
            constant: "",
            value,
            description,
        }
    }

    /// The built-in section buckets (the reference GLM decoder's), in id order.
    pub const SECTIONS: &[Section] = &[
        section("mhc", "compute", "`hc_expand` and `hc_pre`."),
        section(
            "mhc_post",
            "compute",
            "`hc_post` (and `hc_head_mean` on the last layer).",
        ),
        section("norm", "compute", "Normalization."),
        section(
            "kda_mixer",
            "compute",
            "The whole KDA mixer; `kda_front`, `kda_recur`, `kda_back` nest inside it.",
        ),
        section(
            "kda_front",
            "compute",
            "KDA projections before the recurrence.",
        ),
        section("kda_recur", "compute", "The KDA recurrence."),
        section("kda_back", "compute", "The KDA output side."),
        section("dsa_proj", "compute", "DSA projections."),
        section("dsa_indexer", "compute", "DSA indexer."),
        section("dsa_select", "compute", "DSA top-k selection."),
        section("dsa_attend", "compute", "DSA sparse attention."),
        section("mlp_dense", "compute", "Dense MLP."),
        section("moe_router", "compute", "MoE router."),
        section(
            "moe_hostsync",
            "compute",
            "Reading the routed expert ids back to the host.",
        ),
        section("moe_experts", "compute", "Routed experts."),
        section("moe_shared", "compute", "Shared expert."),
        section("moe_combine", "compute", "Combining expert outputs."),
        section(
            "reduce_attn",
            "collective",
            "The attention all-reduce (after its probe).",
        ),
        section(
            "reduce_mlp",
            "collective",
            "The MLP all-reduce (after its probe).",
        ),
        section(
            "reduce_attn_enq",
            "collective",
            "Host time to enqueue the attention all-reduce.",
        ),
        section(
            "reduce_mlp_enq",
            "collective",
            "Host time to enqueue the MLP all-reduce.",
        ),
        section(
            "reduce_attn_bar",
            "probe",
            "The rendezvous probe before the attention all-reduce: this rank's arrival wait.",
        ),
        section(
            "reduce_mlp_bar",
            "probe",
            "The rendezvous probe before the MLP all-reduce: this rank's arrival wait.",
        ),
    ];

    /// The built-in collective sites (`site`).
    pub const SITES: &[crate::Name] = &[
        label("attn", "The attention block's collective."),
        label("mlp", "The MLP (or MoE) block's collective."),
    ];

    /// The speculative phases (`phase`), in round order.
    pub const PHASES: &[crate::Name] = &[
        label("draft", "The draft model proposes k tokens."),
        label("verify", "The target model verifies them."),
        label("accept", "Accepted tokens are committed."),
        label("rollback", "Rejected state is rolled back."),
        label("maint", "Source maintenance (caches, drafter state)."),
    ];

    /// The kinds of step (`step.kind`), closed: what the engine says a step computed.
    pub const STEP_KINDS: &[crate::Name] = &[
        label(
            "prefill",
            "Prompt tokens only (a prompt or a chunk of one); it may sample first tokens.",
        ),
        label("decode", "One output token per request of the batch."),
        label(
            "mixed",
            "Prompt chunks and decode tokens in one batch (chunked prefill).",
        ),
        label(
            "speculative",
            "The target model verifies drafted tokens (a speculative round's verify).",
        ),
    ];

    /// The verify parts (`part`, level 2); `rest` is derived: verify - kda - mla.
    pub const VERIFY_PARTS: &[crate::Name] = &[
        label("kda", "The KDA mixer."),
        label(
            "kda_scan",
            "The sequential scan inside the KDA mixer (reported inside `kda`).",
        ),
        label("mla", "The MLA mixer."),
        label("ffn", "The FFN / MoE branch (reported inside `rest`)."),
        label("rest", "Derived: verify - kda - mla."),
    ];
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

#[cfg(test)]
mod tests {
    use super::{Metric, metric};

    /// Each metric's `help` is one line (a `# HELP` line), and [`Metric::of`] finds each by name.
    #[test]
    fn every_metric_has_a_one_line_help_and_is_found_by_name() {
        for m in metric::ALL {
            assert!(!m.help.is_empty(), "{}: no help", m.name);
            assert!(
                !m.help.contains('\n'),
                "{}: help of more than a line",
                m.name
            );
            assert_eq!(Metric::of(m.name), Some(m));
        }
        assert_eq!(Metric::of("phasetrace.no.such.metric"), None);
    }
}
