//! Every setting, declared once, in the order `phasetrace check` prints them; the
//! [`settings!`] macro (`config/settings.rs`) derives the rest. [`Config`]'s fields written here
//! by hand are the ones derived from several settings:
//!
//! - `summary_every`: its default (100 with `OTEL_METRICS_EXPORTER=console`) depends on
//!   another setting;
//! - `prometheus`: the address for this rank, on by default only when metrics are pushed
//!   nowhere else (`PHASETRACE_PROMETHEUS`, the exporters, `LOCAL_RANK`);
//! - `otlp`, `traces_otlp`, `metrics_otlp`, `traces_exporters`, `metrics_exporters` (and the per-signal settings as
//!   given): one OTLP connection per signal from the general and the per-signal settings, and
//!   the exporters selected (`OTEL_TRACES_EXPORTER`, `OTEL_METRICS_EXPORTER`);
//! - `shutdown_timeout` (`PHASETRACE_SHUTDOWN_TIMEOUT`, read with the OTLP settings), `origins` and `alias_warnings`: not settings.
//!
//! The settings that feed them declare `get` (how `check` reads them back) instead of `field`,
//! and `ConfigBuilder::resolve_with` reads them where it combines them.

use super::settings::settings;
use super::{
    Compression, ExporterSet, HistogramAggregation, HostSourceChoice, LayerRanks, Listen, Origin,
    OtlpConfig, Protocol, SectionLevel, Signal, SignalGiven, SpecLevel, Timing, TraceSlowerThan,
    parse_endpoint, parse_kv_list,
};
use crate::config::settings::AnySetting;
use crate::names::{default, env};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

settings! {
    /// The resolved configuration of a profiler: a field for each setting whose value is used as
    /// it resolved (code, else the environment, else the default), and the fields derived from
    /// several.
    #[derive(Clone, Debug)]
    #[non_exhaustive]
    pub struct Config {
        /// Console summary every N steps; 0 = off.
        pub summary_every: u64,
        /// The embedded Prometheus endpoint's listen address.
        pub prometheus: Option<SocketAddr>,
        /// The general OTLP connection (`OTEL_EXPORTER_OTLP_*`), when its endpoint is set: what
        /// `phasetrace import` sends with, and what each signal inherits.
        pub otlp: Option<OtlpConfig>,
        /// Where spans go over OTLP (the per-signal settings over the general ones; for
        /// http/protobuf the endpoint is the whole URL), when OTLP is selected for spans.
        pub traces_otlp: Option<OtlpConfig>,
        /// The exporters in force for spans: OTLP when [`Config::traces_otlp`] is set, the
        /// console when selected.
        pub traces_exporters: ExporterSet,
        /// The exporters in force for metrics: OTLP when [`Config::metrics_otlp`] is set,
        /// Prometheus when [`Config::prometheus`] is, the console when the summary table is on.
        pub metrics_exporters: ExporterSet,
        /// Where metrics go over OTLP, as [`Config::traces_otlp`], when OTLP is selected for them.
        pub metrics_otlp: Option<OtlpConfig>,
        /// The per-signal settings as given (`None`: inherited), for `phasetrace check`.
        pub(crate) given_traces: SignalGiven,
        pub(crate) given_metrics: SignalGiven,
        /// How long shutdown may take.
        pub shutdown_timeout: Duration,
        /// Where each setting came from, keyed by its environment variable name; absent: the
        /// default ([`Config::origin`]).
        pub origins: BTreeMap<&'static str, Origin>,
        /// Legacy-alias disagreements found while resolving (reported once on stderr by `build`).
        pub alias_warnings: Vec<String>,
    }

    LEVEL: SectionLevel {
        var: "PHASETRACE_LEVEL",
        flag: "level",
        doc: "Which sections are recorded",
        expected: SectionLevel::EXPECTED,
        example: "collectives",
        default: SectionLevel::Off,
        parse: closed,
        show: shown,
        field: level,
        /// Which sections are recorded. Env: `PHASETRACE_LEVEL`; default off.
        setter: fn with_level(level: SectionLevel) => level,
    },
    SPEC_LEVEL: SpecLevel {
        var: "PHASETRACE_SPEC_LEVEL",
        flag: "spec-level",
        doc: "Speculative-decoding detail",
        expected: SpecLevel::EXPECTED,
        example: "verify",
        default: SpecLevel::Off,
        parse: closed,
        show: shown,
        field: spec_level,
        /// Speculative-decoding detail. Env: `PHASETRACE_SPEC_LEVEL`; default off.
        setter: fn with_spec_level(level: SpecLevel) => level,
    },
    TRACE_EVERY: u64 {
        var: "PHASETRACE_TRACE_EVERY",
        flag: "trace-every",
        doc: "Build spans for one step (and one round) in N",
        expected: "a whole number (0 = no spans)",
        example: "10",
        default: default::TRACE_EVERY,
        parse: whole,
        show: shown,
        field: trace_every,
        /// Build spans for one step (and one round) in `n`; 0 = none.
        /// Env: `PHASETRACE_TRACE_EVERY`; default 100.
        setter: fn with_trace_every(n: u64) => n,
    },
    TRACE_SLOWER_THAN: TraceSlowerThan {
        var: "PHASETRACE_TRACE_SLOWER_THAN",
        flag: "trace-slower-than",
        doc: "Also trace every step (and round) slower than this, decided on the worker after it ended",
        expected: TraceSlowerThan::EXPECTED,
        example: "25ms",
        default: TraceSlowerThan::default(),
        parse: closed,
        show: shown,
        field: trace_slower_than,
        /// Also trace steps (and rounds) slower than this: a duration, a percentile of the rank's
        /// recent steps, or off. Decided on the worker after the step has ended, so the hot path
        /// pays nothing. Env: `PHASETRACE_TRACE_SLOWER_THAN`; default `p99`.
        setter: fn with_trace_slower_than(threshold: TraceSlowerThan) => threshold,
    },
    TRACE_SLOW_BUDGET: u32 {
        var: "PHASETRACE_TRACE_SLOW_BUDGET",
        flag: "trace-slow-budget",
        doc: "Most slow-step (tail) traces in any one second per rank; the rest are counted as dropped",
        expected: "a whole number of tail traces a second per rank, from 1 to 10000",
        example: "20",
        default: default::TRACE_SLOW_BUDGET,
        parse: |s| within(s, 1..=10_000),
        show: shown,
        field: trace_slow_budget,
        /// Most slow-step (tail) traces a second per rank, 1 to 10000; slow steps over it are
        /// counted as `phasetrace.records.dropped{reason="tail_budget"}`.
        /// Env: `PHASETRACE_TRACE_SLOW_BUDGET`; default 5.
        setter: fn with_trace_slow_budget(per_second: u32) => per_second,
    },
    TRACE_REQUESTS_TTFT_OVER: TraceSlowerThan {
        var: "PHASETRACE_TRACE_REQUESTS_TTFT_OVER",
        flag: "trace-requests-ttft-over",
        doc: "Also trace every request whose time to first token is over this (from its first token on), within the tail budget",
        expected: TraceSlowerThan::EXPECTED_REQUESTS,
        example: "500ms",
        default: TraceSlowerThan::default(),
        parse: closed,
        show: shown,
        field: trace_requests_ttft_over,
        /// Also trace requests whose time to first token is over this: a duration, a
        /// percentile of recent requests, or off; decided on the worker at the request's first
        /// token, so its later steps are traced and linked. Env:
        /// `PHASETRACE_TRACE_REQUESTS_TTFT_OVER`; default `p99`.
        setter: fn with_trace_requests_ttft_over(threshold: TraceSlowerThan) => threshold,
    },
    TRACE_REQUESTS_TPOT_OVER: TraceSlowerThan {
        var: "PHASETRACE_TRACE_REQUESTS_TPOT_OVER",
        flag: "trace-requests-tpot-over",
        doc: "Also trace every request whose time per output token so far is over this (from then on), within the tail budget",
        expected: TraceSlowerThan::EXPECTED_REQUESTS,
        example: "40ms",
        default: TraceSlowerThan::default(),
        parse: closed,
        show: shown,
        field: trace_requests_tpot_over,
        /// Also trace requests whose time per output token so far is over this: a duration, a
        /// percentile of recent requests, or off; decided on the worker at each step that
        /// serves the request, so its later steps are traced and linked. Env:
        /// `PHASETRACE_TRACE_REQUESTS_TPOT_OVER`; default `p99`.
        setter: fn with_trace_requests_tpot_over(threshold: TraceSlowerThan) => threshold,
    },
    GRAPH_READ_EVERY: u64 {
        var: "PHASETRACE_GRAPH_READ_EVERY",
        flag: "graph-read-every",
        doc: "Read one CUDA-graph replay in N (Recorder::replay)",
        expected: "a whole number of replays (1 = every replay, 0 = none)",
        example: "10",
        default: default::GRAPH_READ_EVERY,
        parse: whole,
        show: shown,
        field: graph_read_every,
        /// Read one CUDA-graph replay in `n` ([`crate::Recorder::replay`]); 0 = none. Reading a
        /// replay costs the worker one event query per captured boundary; the others cost the hot
        /// path one atomic increment. Env: `PHASETRACE_GRAPH_READ_EVERY`; default 1 (every replay).
        setter: fn with_graph_read_every(n: u64) => n,
    },
    LAYER_ATTR: bool {
        var: "PHASETRACE_LAYER_ATTR",
        flag: "layer-attr",
        doc: "The layer attribute on section metrics",
        expected: SWITCH,
        example: "off",
        default: true,
        parse: switch,
        show: show_switch,
        field: layer_attr,
        /// The per-layer section counters (`phasetrace.section.layer.time` and `.calls`, two series
        /// per (bucket, layer)). Env: `PHASETRACE_LAYER_ATTR`; default on.
        setter: fn with_layer_attr(on: bool) => on,
    },
    LAYER_RANKS: LayerRanks {
        var: "PHASETRACE_LAYER_RANKS",
        flag: "layer-ranks",
        doc: "The ranks that export per-layer series (a fleet: one rank per group)",
        expected: LayerRanks::EXPECTED,
        example: "0",
        default: LayerRanks::All,
        parse: closed,
        show: shown,
        field: layer_ranks,
        /// The ranks of each group that export the per-layer series (sections and collective
        /// waits by `layer`, and the per-layer distributions): `all`, `none` or a list such as
        /// `0`. The other ranks sum their rendezvous waits per site (no `layer` attribute) and
        /// keep every per-step, per-section and per-site series, which is what the alerts read.
        /// Env: `PHASETRACE_LAYER_RANKS`; default `all`.
        setter: fn with_layer_ranks(ranks: LayerRanks) => ranks,
    },
    SUMMARY_EVERY: u64 {
        var: "PHASETRACE_SUMMARY_EVERY",
        flag: "summary-every",
        doc: "Console summary table every N steps",
        expected: "a whole number of steps (0 = off)",
        example: "50",
        default: 0,
        default_note: "(100 with OTEL_METRICS_EXPORTER=console)",
        parse: whole,
        show: shown,
        get: |c| Some(c.summary_every),
        /// Console summary table every `n` steps; 0 = off. Env: `PHASETRACE_SUMMARY_EVERY`;
        /// default 0 (100 when `OTEL_METRICS_EXPORTER` includes `console`).
        setter: fn with_summary_every(n: u64) => n,
    },
    SPEC_SUMMARY_EVERY: u64 {
        var: "PHASETRACE_SPEC_SUMMARY_EVERY",
        flag: "spec-summary-every",
        doc: "Console speculative line every N rounds",
        expected: "a whole number of rounds (0 = off)",
        example: "20",
        default: 0,
        parse: whole,
        show: shown,
        field: spec_summary_every,
        /// Console speculative line every `n` rounds; 0 = off.
        /// Env: `PHASETRACE_SPEC_SUMMARY_EVERY`; default 0.
        setter: fn with_spec_summary_every(n: u64) => n,
    },
    PROMETHEUS: Listen {
        var: "PHASETRACE_PROMETHEUS",
        flag: "prometheus",
        doc: "The embedded Prometheus endpoint's listen address",
        expected: Listen::EXPECTED,
        example: "127.0.0.1:9464+rank",
        default: Listen::builtin(),
        default_note: "(port + LOCAL_RANK when a launcher sets it) when no OTLP endpoint is set and no provider of the engine's is given, else off",
        parse: closed,
        show: shown,
        get: |c| Some(c.prometheus.map_or(Listen::Off, Listen::At)),
        /// Serves metrics on the embedded Prometheus endpoint at `addr`
        /// (`([0, 0, 0, 0], 9464)`, a [`SocketAddr`]; port 0 picks a free one, see
        /// [`Profiler::prometheus_addr`](crate::Profiler::prometheus_addr)). Env:
        /// `PHASETRACE_PROMETHEUS`; default `127.0.0.1:9464` when no OTLP endpoint is set, else
        /// off. Leave it unset to keep that default. From text, name the type for `parse`
        /// (`"127.0.0.1:19465".parse::<SocketAddr>()?`: `impl Into<SocketAddr>` leaves it
        /// nothing to infer), or give the text as the variable reads it:
        /// `with_text("PHASETRACE_PROMETHEUS", "127.0.0.1:19465")?`.
        setter: fn with_prometheus_at(addr: impl Into<SocketAddr>) => Listen::At(addr.into()),
        /// Turns the embedded Prometheus endpoint off, the default one included (engines that only
        /// push OTLP, tests). Env: `PHASETRACE_PROMETHEUS=off`.
        setter: fn without_prometheus() => Listen::Off,
    },
    PROMETHEUS_WEB_CONFIG: Option<PathBuf> {
        var: "PHASETRACE_PROMETHEUS_WEB_CONFIG",
        flag: "prometheus-web-config",
        doc: "The Prometheus endpoint's web configuration file: TLS and basic auth in the exporter-toolkit format (unset: plain HTTP, no auth)",
        expected: "a path",
        example: "/etc/phasetrace/web.yml",
        default: None,
        parse: path,
        show: show_path,
        field: prometheus_web_config,
        /// The Prometheus endpoint's web configuration file: TLS (`tls_server_config`) and basic
        /// auth (`basic_auth_users`, bcrypt hashes) in the Prometheus exporter-toolkit format. Read
        /// and checked by `build()`: an unreadable or invalid file is an error naming the file and
        /// the field. While the endpoint runs, it is re-read when it or a file it names changes (new
        /// connections get new certificates, requests new users); a broken change keeps the last
        /// good configuration, warns on stderr and counts
        /// `phasetrace.prometheus.web_config.reloads{result="failed"}`, and
        /// `phasetrace.prometheus.web_config.last_reload_successful` reads 0 until a change that
        /// works. Whether the endpoint speaks TLS is fixed at start. Env: `PHASETRACE_PROMETHEUS_WEB_CONFIG`; default none (plain HTTP,
        /// no auth).
        setter: fn with_prometheus_web_config(path: impl Into<PathBuf>) => Some(path.into()),
    },
    QUEUE: usize {
        var: "PHASETRACE_QUEUE",
        flag: "queue",
        doc: "Records per recorder buffer (24 bytes each; rounded up to a power of two)",
        expected: "a whole number of records from 64 to 16777216",
        example: "4096",
        default: default::QUEUE,
        parse: |s| within(s, 64..=1 << 24),
        show: shown,
        field: queue,
        /// Per-recorder buffer capacity in records (24 bytes each; rounded up to a power of two).
        /// Env: `PHASETRACE_QUEUE`; default 65536 (1.5 MiB per recorder).
        setter: fn with_queue(records: usize) => records,
    },
    RANK: u32 {
        var: "PHASETRACE_RANK",
        fallbacks: &env::RANK_FALLBACKS,
        doc: "This process's rank",
        expected: "a whole number",
        example: "3",
        default: 0,
        parse: whole,
        show: shown,
        field: rank,
        /// This process's rank. Env: `PHASETRACE_RANK`, then `RANK`, `LOCAL_RANK`,
        /// `OMPI_COMM_WORLD_RANK`; default 0.
        setter: fn with_rank(rank: u32) => rank,
    },
    GROUP: String {
        var: "PHASETRACE_GROUP",
        flag: "group",
        doc: "The collective group of this process's ranks (the group attribute on every series and span)",
        expected: "a group name of letters, digits, '_', '-', '.' or ':' (at most 64 bytes)",
        example: "tp1",
        default: default::GROUP.to_owned(),
        parse: group,
        show: |s| Some(s.clone()),
        field: group,
        /// The collective group of this process's ranks: the `group` attribute on every series and
        /// span, so rules and dashboards compare ranks only within their group (two tensor-parallel
        /// groups of one job both have ranks 0..N). Letters, digits, `_`, `-`, `.`, `:`, at most 64
        /// bytes. Env: `PHASETRACE_GROUP`; default `default`.
        setter: fn with_group(group: impl Into<String>) => group.into(),
    },
    EXPERT_COUNTER: bool {
        var: "PHASETRACE_EXPERT_COUNTER",
        flag: "expert-counter",
        doc: "MoE expert load: tokens per layer, imbalance and hot experts per (layer, rank), and the per-(layer, expert) counts in process",
        expected: SWITCH,
        example: "on",
        default: false,
        parse: switch,
        show: show_switch,
        field: expert_counter,
        /// The MoE expert-load telemetry: tokens per (layer, rank), routing imbalance and hot
        /// experts per (layer, rank), at most `(3 + PHASETRACE_EXPERT_TOP) x layers` series a rank
        /// whatever the number of experts, and the full counts in process
        /// ([`Profiler::expert_load`](crate::Profiler::expert_load)). Env:
        /// `PHASETRACE_EXPERT_COUNTER`; default off. The window, the number of experts and of hot
        /// experts, and the expert-parallel placement are [`Self::with_expert_window`],
        /// [`Self::with_moe_experts`], [`Self::with_expert_top`] and
        /// [`Self::with_expert_parallel`]; see `docs/moe.md`.
        setter: fn with_expert_counter(on: bool) => on,
    },
    MOE_EXPERTS: u32 {
        var: "PHASETRACE_MOE_EXPERTS",
        flag: "moe-experts",
        doc: "Routed experts per MoE layer; ids at or above it are dropped and counted (0: the highest id seen + 1)",
        expected: "a whole number of experts, from 0 to 65536",
        example: "384",
        default: 0,
        parse: |s| within(s, 0..=65_536),
        show: shown,
        field: moe_experts,
        /// Routed experts per MoE layer: ids at or above it are dropped and counted (0: the
        /// highest id seen + 1). Env: `PHASETRACE_MOE_EXPERTS`; default 0.
        setter: fn with_moe_experts(experts: u32) => experts,
    },
    EXPERT_WINDOW: u32 {
        var: "PHASETRACE_EXPERT_WINDOW",
        flag: "expert-window",
        doc: "Steps of a rank per expert-load window: imbalance and hot experts read the last complete one",
        expected: "a whole number of steps, from 1 to 1000000",
        example: "128",
        default: default::EXPERT_WINDOW,
        parse: |s| within(s, 1..=1_000_000),
        show: shown,
        field: expert_window,
        /// Steps of a rank per expert-load window (imbalance and hot experts read the last complete
        /// one). Env: `PHASETRACE_EXPERT_WINDOW`; default 64.
        setter: fn with_expert_window(steps: u32) => steps,
    },
    EXPERT_TOP: u32 {
        var: "PHASETRACE_EXPERT_TOP",
        flag: "expert-top",
        doc: "Hot experts exported per (layer, rank), by tokens in the window",
        expected: "a whole number from 0 to 10",
        example: "2",
        default: default::EXPERT_TOP,
        parse: |s| within(s, 0..=default::EXPERT_TOP_MAX),
        show: shown,
        field: expert_top,
        /// Hot experts exported per (layer, rank), 0 to 10. Env: `PHASETRACE_EXPERT_TOP`; default 4.
        setter: fn with_expert_top(n: u32) => n,
    },
    EXPERT_PARALLEL: u32 {
        var: "PHASETRACE_EXPERT_PARALLEL",
        doc: "Expert-parallel ranks hosting each layer's experts in contiguous blocks (the ep_rank attribute of hot experts; 0: none)",
        expected: "a whole number of ranks, from 0 to 65536",
        example: "4",
        default: 0,
        parse: |s| within(s, 0..=65_536),
        show: shown,
        field: expert_parallel,
        /// Expert-parallel ranks hosting each layer's experts in contiguous blocks (the `ep_rank`
        /// attribute of hot experts; 0: none). Env: `PHASETRACE_EXPERT_PARALLEL`; default 0.
        setter: fn with_expert_parallel(ranks: u32) => ranks,
    },
    TIMING: Timing {
        var: "PHASETRACE_TIMING",
        flag: "timing",
        doc: "Where boundary times come from",
        expected: Timing::EXPECTED,
        example: "events",
        default: Timing::Host,
        parse: closed,
        show: shown,
        field: timing,
        /// The timing backend by name. Env: `PHASETRACE_TIMING`; default `host`. `sync` and
        /// `events` need the engine's stream: pass it with [`Self::with_stream`] (or a clock with
        /// [`Self::with_clock`]).
        setter: fn with_timing(timing: Timing) => timing,
    },
    HOST_CLOCK: HostSourceChoice {
        var: "PHASETRACE_HOST_CLOCK",
        flag: "host-clock",
        doc: "Where the host clock reads: the TSC where usable, or forced",
        expected: HostSourceChoice::EXPECTED,
        example: "monotonic",
        default: HostSourceChoice::Auto,
        parse: closed,
        show: shown,
        field: host_clock,
        /// Where the host clock reads: `auto` (the TSC where usable), `tsc` or `monotonic`.
        /// Env: `PHASETRACE_HOST_CLOCK`; default `auto`.
        setter: fn with_host_clock(choice: HostSourceChoice) => choice,
    },
    SDK_DISABLED: bool {
        var: "OTEL_SDK_DISABLED",
        doc: "true turns phasetrace off entirely: nothing recorded, nothing exported",
        expected: "true or false",
        example: "true",
        default: false,
        parse: |s| match s.to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(String::new()),
        },
        show: shown,
        field: sdk_disabled,
    },
    SERVICE_NAME: String {
        var: "OTEL_SERVICE_NAME",
        flag: "service-name",
        doc: "Resource service.name",
        expected: "a service name",
        example: "engine",
        default: default::SERVICE_NAME.to_owned(),
        parse: |s| Ok(s.to_owned()),
        show: |s| Some(s.clone()),
        field: service_name,
        /// Resource `service.name`. Env: `OTEL_SERVICE_NAME`; default `phasetrace`.
        setter: fn with_service_name(name: impl Into<String>) => name.into(),
    },
    RESOURCE_ATTRIBUTES: Vec<(String, String)> {
        var: "OTEL_RESOURCE_ATTRIBUTES",
        doc: "Extra resource attributes (values percent-decoded)",
        expected: KV,
        example: "deployment.environment=prod,host.gpu=h200",
        default: Vec::new(),
        parse: parse_kv_list,
        show: show_kv,
        field: resource_attributes,
    },

    // The general OTLP connection: `Config::otlp`, and what each signal inherits.
    OTLP_ENDPOINT: Option<String> {
        var: "OTEL_EXPORTER_OTLP_ENDPOINT",
        flag: "otlp-endpoint",
        doc: "The OTLP endpoint that spans and metrics are pushed to",
        expected: "an http:// or https:// URL with a host and an optional port",
        example: "https://collector.example:4317",
        default: None,
        parse: |s| parse_endpoint(s).map(Some),
        show: Option::clone,
        get: |c| Some(c.otlp.as_ref().map(|o| o.endpoint.clone())),
    },
    OTLP_PROTOCOL: Protocol {
        var: "OTEL_EXPORTER_OTLP_PROTOCOL",
        flag: "otlp-protocol",
        doc: "The OTLP transport",
        expected: Protocol::EXPECTED,
        example: "http/protobuf",
        // gRPC, as before; http/protobuf in a build that has only the OTLP/HTTP exporter.
        default: if cfg!(feature = "otlp-grpc") || !cfg!(feature = "otlp-http") {
            Protocol::Grpc
        } else {
            Protocol::HttpProtobuf
        },
        parse: closed,
        show: shown,
        get: |c| c.otlp.as_ref().map(|o| o.protocol),
        /// The OTLP transport. Env: `OTEL_EXPORTER_OTLP_PROTOCOL`; default `grpc`.
        setter: fn with_otlp_protocol(protocol: Protocol) => protocol,
    },
    OTLP_HEADERS: Vec<(String, String)> {
        var: "OTEL_EXPORTER_OTLP_HEADERS",
        doc: "OTLP request headers (API keys; values are never printed)",
        expected: KV,
        example: "x-api-key=s3cr%2Ct",
        default: Vec::new(),
        secret: true,
        parse: parse_kv_list,
        show: show_kv,
        get: |c| c.otlp.as_ref().map(|o| o.headers.clone()),
        /// OTLP request headers (API keys); values are never printed.
        /// Env: `OTEL_EXPORTER_OTLP_HEADERS`; default none.
        setter: fn with_otlp_headers(headers: Vec<(String, String)>) => headers,
    },
    OTLP_TIMEOUT: Duration {
        var: "OTEL_EXPORTER_OTLP_TIMEOUT",
        doc: "OTLP export timeout in milliseconds",
        expected: MILLIS,
        example: "2500",
        default: Duration::from_millis(default::OTLP_TIMEOUT_MS),
        parse: millis,
        show: show_millis,
        get: |c| c.otlp.as_ref().map(|o| o.timeout),
        /// The OTLP export timeout. Env: `OTEL_EXPORTER_OTLP_TIMEOUT` (ms); default 10 s.
        setter: fn with_otlp_timeout(timeout: Duration) => timeout,
    },
    SHUTDOWN_TIMEOUT: Duration {
        var: "PHASETRACE_SHUTDOWN_TIMEOUT",
        doc: "How long shutdown may take in all, in milliseconds (its OTLP exports included)",
        expected: MILLIS,
        example: "2000",
        default: Duration::from_millis(default::SHUTDOWN_TIMEOUT_MS),
        parse: millis,
        show: show_millis,
        get: |c| Some(c.shutdown_timeout),
        /// How long [`Profiler::shutdown`](crate::Profiler::shutdown) may take in all: the last
        /// drain and phasetrace's own exporters' final flush and shutdown share it.
        /// Env: `PHASETRACE_SHUTDOWN_TIMEOUT` (ms); default 5 s.
        setter: fn with_shutdown_timeout(timeout: Duration) => timeout,
    },
    OTLP_COMPRESSION: Compression {
        var: "OTEL_EXPORTER_OTLP_COMPRESSION",
        doc: "Compression of OTLP request bodies",
        expected: Compression::EXPECTED,
        example: "gzip",
        default: Compression::None,
        parse: closed,
        show: shown,
        get: |c| c.otlp.as_ref().map(|o| Compression::from_gzip(o.gzip)),
        /// gzip-compress OTLP request bodies. Env: `OTEL_EXPORTER_OTLP_COMPRESSION` (`gzip`, `none`);
        /// default none.
        setter: fn with_otlp_gzip(on: bool) => Compression::from_gzip(on),
    },
    OTLP_CERTIFICATE: Option<PathBuf> {
        var: "OTEL_EXPORTER_OTLP_CERTIFICATE",
        doc: "PEM file of a custom CA for https:// endpoints (unset: the system's roots)",
        expected: "a path",
        example: "/etc/ssl/collector-ca.pem",
        default: None,
        parse: path,
        show: show_path,
        get: |c| c.otlp.as_ref().map(|o| o.certificate.clone()),
        /// A PEM file of the CA that signed the collector's certificate (`https://` endpoints).
        /// Env: `OTEL_EXPORTER_OTLP_CERTIFICATE`; default: the system's roots.
        setter: fn with_otlp_certificate(path: impl Into<PathBuf>) => Some(path.into()),
    },
    OTLP_HISTOGRAM: HistogramAggregation {
        var: "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
        doc: "Histogram aggregation of OTLP metrics (the Prometheus endpoint keeps explicit buckets)",
        expected: HistogramAggregation::EXPECTED,
        example: "base2_exponential_bucket_histogram",
        default: HistogramAggregation::Explicit,
        parse: closed,
        show: shown,
        get: |c| c.otlp.as_ref().map(|o| o.histogram),
        /// Histogram aggregation of OTLP metrics: explicit buckets (1 µs to 10 s) or base-2
        /// exponential. Env: `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`; default
        /// explicit. The Prometheus endpoint always keeps explicit buckets.
        setter: fn with_otlp_histogram(aggregation: HistogramAggregation) => aggregation,
    },

    // Each signal's own connection: its variables win over the general ones.
    TRACES_ENDPOINT: String = signal(OTLP_ENDPOINT, "traces") {
        var: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        doc: "The OTLP endpoint (for http/protobuf the whole URL)",
        example: "https://collector.example:4318/v1/traces",
        given: given_traces.endpoint,
    },
    TRACES_PROTOCOL: Protocol = signal(OTLP_PROTOCOL, "traces") {
        var: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        doc: "The OTLP transport",
        example: "http/protobuf",
        given: given_traces.protocol,
    },
    TRACES_HEADERS: Vec<(String, String)> = signal(OTLP_HEADERS, "traces") {
        var: "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        doc: "OTLP request headers",
        example: "x-api-key=tr4ces",
        given: given_traces.headers,
    },
    TRACES_TIMEOUT: Duration = signal(OTLP_TIMEOUT, "traces") {
        var: "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        doc: "OTLP export timeout in milliseconds",
        example: "3000",
        given: given_traces.timeout,
    },
    TRACES_COMPRESSION: Compression = signal(OTLP_COMPRESSION, "traces") {
        var: "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        doc: "Compression of OTLP request bodies",
        example: "none",
        given: given_traces.compression,
    },
    TRACES_CERTIFICATE: PathBuf = signal(OTLP_CERTIFICATE, "traces") {
        var: "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        doc: "PEM file of a custom CA for https:// endpoints",
        example: "/etc/ssl/traces-ca.pem",
        given: given_traces.certificate,
    },
    METRICS_ENDPOINT: String = signal(OTLP_ENDPOINT, "metrics") {
        var: "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        doc: "The OTLP endpoint (for http/protobuf the whole URL)",
        example: "https://collector.example:4317",
        given: given_metrics.endpoint,
    },
    METRICS_PROTOCOL: Protocol = signal(OTLP_PROTOCOL, "metrics") {
        var: "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        doc: "The OTLP transport",
        example: "grpc",
        given: given_metrics.protocol,
    },
    METRICS_HEADERS: Vec<(String, String)> = signal(OTLP_HEADERS, "metrics") {
        var: "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        doc: "OTLP request headers",
        example: "x-api-key=m3trics",
        given: given_metrics.headers,
    },
    METRICS_TIMEOUT: Duration = signal(OTLP_TIMEOUT, "metrics") {
        var: "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
        doc: "OTLP export timeout in milliseconds",
        example: "4000",
        given: given_metrics.timeout,
    },
    METRICS_COMPRESSION: Compression = signal(OTLP_COMPRESSION, "metrics") {
        var: "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
        doc: "Compression of OTLP request bodies",
        example: "gzip",
        given: given_metrics.compression,
    },
    METRICS_CERTIFICATE: PathBuf = signal(OTLP_CERTIFICATE, "metrics") {
        var: "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
        doc: "PEM file of a custom CA for https:// endpoints",
        example: "/etc/ssl/metrics-ca.pem",
        given: given_metrics.certificate,
    },

    METRIC_EXPORT_INTERVAL: Duration {
        var: "OTEL_METRIC_EXPORT_INTERVAL",
        doc: "How often metrics are pushed over OTLP",
        expected: MILLIS,
        example: "1000",
        default: Duration::from_millis(default::METRIC_EXPORT_INTERVAL_MS),
        parse: millis,
        show: show_millis,
        field: metric_export_interval,
        /// How often metrics are pushed over OTLP. Env: `OTEL_METRIC_EXPORT_INTERVAL` (ms);
        /// default 10 s.
        setter: fn with_metric_export_interval(every: Duration) => every,
    },
    TRACES_EXPORTER: ExporterSet {
        var: "OTEL_TRACES_EXPORTER",
        doc: "Where spans go",
        expected: ExporterSet::TRACES_EXPECTED,
        example: "console",
        default: ExporterSet::NONE,
        default_note: "(otlp when an OTLP endpoint is set)",
        parse: traces_exporters,
        show: shown,
        get: |c| Some(c.traces_exporters),
        /// Where spans go when phasetrace builds its own pipeline: OTLP, the console, both or
        /// nowhere ([`ExporterSet::NONE`]). Env: `OTEL_TRACES_EXPORTER`; default `otlp` when an
        /// OTLP endpoint is set, else none.
        setter: fn with_traces_exporter(exporters: ExporterSet) => exporters,
    },
    METRICS_EXPORTER: ExporterSet {
        var: "OTEL_METRICS_EXPORTER",
        doc: "Where metrics go (console: the summary table)",
        expected: ExporterSet::METRICS_EXPECTED,
        example: "otlp,prometheus",
        default: ExporterSet::NONE,
        default_note: "(otlp when an OTLP endpoint is set, else prometheus)",
        parse: metrics_exporters,
        show: shown,
        get: |c| Some(c.metrics_exporters),
    },
}

/// The settings of the OTLP connection (where to, how, with what): the ones that
/// `phasetrace import` reads to send what it imports, as the live exporters do.
pub static OTLP_CONNECTION: &[&dyn AnySetting] = &[
    &OTLP_ENDPOINT,
    &OTLP_PROTOCOL,
    &OTLP_HEADERS,
    &OTLP_TIMEOUT,
    &OTLP_COMPRESSION,
    &OTLP_CERTIFICATE,
];

// Parsers and printers shared by several settings: `parse` gets a trimmed, non-empty value and
// returns a detail for the message (or ""); `show` prints what `parse` reads back.

fn traces_exporters(s: &str) -> Result<ExporterSet, String> {
    ExporterSet::parse_for(s, Signal::Traces).map_err(|_| String::new())
}

fn metrics_exporters(s: &str) -> Result<ExporterSet, String> {
    ExporterSet::parse_for(s, Signal::Metrics).map_err(|_| String::new())
}

fn closed<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| String::new())
}

fn whole<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| String::new())
}

/// A whole number in `range`.
fn within<T: std::str::FromStr + PartialOrd>(
    s: &str,
    range: std::ops::RangeInclusive<T>,
) -> Result<T, String> {
    match s.parse::<T>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(String::new()),
    }
}

const MILLIS: &str = "a whole number of milliseconds, at least 1";

fn millis(s: &str) -> Result<Duration, String> {
    within(s, 1..=u64::MAX).map(Duration::from_millis)
}

fn show_millis(d: &Duration) -> Option<String> {
    Some(d.as_millis().to_string())
}

fn shown<T: ToString>(v: &T) -> Option<String> {
    Some(v.to_string())
}

/// `on`/`off` switches; `true`/`false` and `1`/`0` are read too.
fn switch(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(String::new()),
    }
}

fn show_switch(on: &bool) -> Option<String> {
    Some(if *on { "on" } else { "off" }.to_owned())
}

const SWITCH: &str = "on, off, true, false, 1 or 0";
const KV: &str = "key=value pairs separated by commas";

#[allow(clippy::ptr_arg)] // a `Setting<Vec<_>>` printer: `fn(&T)` with `T = Vec<_>`
fn show_kv(list: &Vec<(String, String)>) -> Option<String> {
    // Values percent-encoded where they would not read back (`,`, `=`, `%`, spaces).
    const ESCAPE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
        .add(b',')
        .add(b'=')
        .add(b'%')
        .add(b' ');
    (!list.is_empty()).then(|| {
        list.iter()
            .map(|(k, v)| format!("{k}={}", percent_encoding::utf8_percent_encode(v, ESCAPE)))
            .collect::<Vec<_>>()
            .join(",")
    })
}

fn path(s: &str) -> Result<Option<PathBuf>, String> {
    Ok(Some(PathBuf::from(s)))
}

fn show_path(p: &Option<PathBuf>) -> Option<String> {
    p.as_ref().map(|p| p.display().to_string())
}

/// A label value that rules and dashboards can match verbatim.
fn group(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if ok {
        Ok(s.to_owned())
    } else {
        Err(String::new())
    }
}
