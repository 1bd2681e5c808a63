//! Exporters: OTLP (gRPC, HTTP/protobuf), the embedded Prometheus endpoint, console spans, and the
//! `tracing` layer that shares the tracer provider.
//!
//! ```text
//! worker ──> SdkMeterProvider ──┬─ PeriodicReader ─ OTLP metrics: SDK exporter (traces off) |
//!                               │        ^          proto_metrics + exemplars over transport
//!                               │        (both on, same aggregation: scrapes collect here too)
//!                               └─ ManualReader <── GET /metrics (export::prometheus: hyper,
//!                                                   TLS, basic auth, classic | OpenMetrics, gzip)
//!        ──> SdkTracerProvider ─── BatchSpanProcessor ─ OTLP spans | console
//!                                       (delivered spans settle ExemplarStore entries)
//! ```

mod console;
mod counted;
pub(crate) mod exemplars;
pub(crate) mod otlp;
mod probe;
pub(crate) mod prometheus;
mod proto_metrics;
#[cfg(feature = "tracing")]
pub(crate) mod tracing_layer;
pub(crate) mod transport;

#[cfg(test)]
pub(crate) use self::counted::Counted;
pub(crate) use self::counted::SpanCounts;
pub(crate) use self::exemplars::ExemplarStore;
pub use self::prometheus::web_config::WebConfigError;
pub(crate) use self::prometheus::{PrometheusServer, reload, web_config};

use crate::config::{Config, HistogramAggregation};
use crate::names::{Outcome, default, metric, resource};
use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{
    Aggregation, Instrument, InstrumentKind, SdkMeterProvider, Stream,
};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanExporter,
};
use std::net::SocketAddr;
use std::time::Duration;
use thiserror::Error;

/// The OTLP metrics reader: the SDK's periodic reader over the counted OTLP exporter.
pub(crate) type OtlpMetricReader =
    opentelemetry_sdk::metrics::PeriodicReader<counted::CountedMetrics<MetricsExporter>>;

/// The OTLP metrics exporter: the SDK's when traces are off, phasetrace's own (the same
/// requests plus the exemplars of delivered traces) when they are on.
#[derive(Debug)]
pub(crate) enum MetricsExporter {
    /// opentelemetry-otlp's exporter.
    Sdk(opentelemetry_otlp::MetricExporter),
    /// opentelemetry-proto requests with exemplars, over [`transport`].
    WithExemplars(proto_metrics::ProtoMetricExporter),
}

impl opentelemetry_sdk::metrics::exporter::PushMetricExporter for MetricsExporter {
    async fn export(
        &self,
        metrics: &opentelemetry_sdk::metrics::data::ResourceMetrics,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        match self {
            MetricsExporter::Sdk(e) => e.export(metrics).await,
            MetricsExporter::WithExemplars(e) => e.export(metrics).await,
        }
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        match self {
            MetricsExporter::Sdk(e) => e.force_flush(),
            MetricsExporter::WithExemplars(e) => e.force_flush(),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        match self {
            MetricsExporter::Sdk(e) => e.shutdown_with_timeout(timeout),
            MetricsExporter::WithExemplars(e) => e.shutdown_with_timeout(timeout),
        }
    }

    fn temporality(&self) -> opentelemetry_sdk::metrics::Temporality {
        match self {
            MetricsExporter::Sdk(e) => e.temporality(),
            MetricsExporter::WithExemplars(e) => e.temporality(),
        }
    }
}

/// Spans the batch processor queues (its `max_queue_size`).
const SPAN_QUEUE: usize = 16_384;
/// Spans the worker lets be pending in the processor: the queue less two export batches (one
/// being exported while the next is gathered), so that the processor never drops uncounted.
pub(crate) const SPAN_QUEUE_BUDGET: usize = SPAN_QUEUE - 2 * SPAN_BATCH;
const SPAN_BATCH: usize = 512;

/// An exporter that could not be set up.
#[derive(Debug, Error)]
pub enum ExportError {
    /// The Prometheus listen address could not be bound.
    #[error(
        "PHASETRACE_PROMETHEUS={addr}: cannot listen there ({source}); expected a free local address, or off"
    )]
    PrometheusBind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The built-in default Prometheus address (nobody set `PHASETRACE_PROMETHEUS`) could not
    /// be bound: the error says it is the default and how to change it.
    #[error(
        "the built-in default Prometheus endpoint {addr} cannot listen ({source}); \
         PHASETRACE_PROMETHEUS is not set: set it to a free host:port (or host:port+rank) or off, \
         or call ProfilerBuilder::with_prometheus_at or without_prometheus"
    )]
    PrometheusDefaultBind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The Prometheus endpoint's web configuration file is unreadable or invalid.
    #[error(transparent)]
    WebConfig(#[from] WebConfigError),
    /// An OTLP exporter failed to build.
    #[error(
        "OTEL_EXPORTER_OTLP_ENDPOINT={endpoint}: the OTLP {signal} exporter failed to build: {detail}"
    )]
    Otlp {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// The endpoint.
        endpoint: String,
        /// Why.
        detail: String,
    },
    /// The custom CA could not be read.
    #[error("OTEL_EXPORTER_OTLP_CERTIFICATE={path}: cannot read the CA certificate ({source})")]
    Certificate {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A background thread or runtime could not start.
    #[error("cannot start a background thread: {0}")]
    Thread(std::io::Error),
}

/// The providers and servers behind one profiler.
pub(crate) struct Exporters {
    /// One provider per histogram flavour: OTLP may use exponential histograms while the
    /// Prometheus endpoint keeps explicit buckets.
    pub(crate) meter_providers: Vec<SdkMeterProvider>,
    pub(crate) tracer_provider: Option<SdkTracerProvider>,
    /// What the span exporter delivered and lost.
    pub(crate) span_counts: std::sync::Arc<SpanCounts>,
    /// Exemplars of traced steps for the Prometheus endpoint and OTLP metrics: present when
    /// spans and either of them are on.
    pub(crate) exemplars: Option<std::sync::Arc<ExemplarStore>>,
    pub(crate) prometheus: Option<PrometheusServer>,
    /// `phasetrace.prometheus.web_config.reloads` and `phasetrace.metric.exports`, one each per
    /// meter provider (kept with them).
    _outcome_counters: Vec<opentelemetry::metrics::ObservableCounter<u64>>,
    /// `phasetrace.prometheus.web_config.last_reload_successful`, one per meter provider.
    _state_gauges: Vec<opentelemetry::metrics::ObservableGauge<u64>>,
    /// Keeps the tonic channels' background tasks alive.
    pub(crate) runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Exporters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporters")
            .field("meter_providers", &self.meter_providers.len())
            .field("traces", &self.tracer_provider.is_some())
            .field("prometheus", &self.prometheus.as_ref().map(|p| p.addr()))
            .finish()
    }
}

pub(crate) fn resource(cfg: &Config) -> Resource {
    let mut attrs: Vec<KeyValue> = vec![
        KeyValue::new(resource::PROCESS_PID, i64::from(std::process::id())),
        KeyValue::new(resource::TELEMETRY_DISTRO_NAME, resource::DISTRO),
        KeyValue::new(
            resource::TELEMETRY_DISTRO_VERSION,
            env!("CARGO_PKG_VERSION"),
        ),
        KeyValue::new(
            crate::names::attr::HOST_CLOCK,
            crate::timing::host_source().source.as_str(),
        ),
    ];
    if let Some(exe) = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
    {
        attrs.push(KeyValue::new(resource::PROCESS_EXECUTABLE_NAME, exe));
    }
    if let Some(host) = hostname() {
        attrs.push(KeyValue::new(resource::HOST_NAME, host));
    }
    for (k, v) in &cfg.resource_attributes {
        attrs.push(KeyValue::new(k.clone(), v.clone()));
    }
    // The SDK's own `telemetry.sdk.*` (no other detector: the environment is read by
    // `Config`, which `without_env` bypasses).
    Resource::builder_empty()
        .with_detector(Box::new(
            opentelemetry_sdk::resource::TelemetryResourceDetector,
        ))
        .with_attributes(attrs)
        .with_service_name(cfg.service_name.clone())
        .build()
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
}

/// The per-layer instruments, whose cardinality limit is raised to
/// [`default::LAYER_SERIES_LIMIT`] (the expert-load ones: room for rank threads of one process
/// at 60 MoE layers, `PHASETRACE_EXPERT_TOP` hot experts each).
const LAYER_INSTRUMENTS: [&str; 8] = [
    metric::SECTION_LAYER_TIME,
    metric::SECTION_LAYER_CALLS,
    metric::COLLECTIVE_LAYER_WAIT_TIME,
    metric::COLLECTIVE_LAYER_WAIT_CALLS,
    metric::MOE_LAYER_TOKENS,
    metric::MOE_IMBALANCE,
    metric::MOE_LOAD_CV,
    metric::MOE_HOT_EXPERT_SHARE,
];

/// The one view of a provider: per-layer instruments get room for their series, and with
/// `exponential` the duration histograms become base-2 exponential histograms (OTLP only).
fn view(exponential: bool) -> impl Fn(&Instrument) -> Option<Stream> + Send + Sync + 'static {
    move |i: &Instrument| {
        if LAYER_INSTRUMENTS.contains(&i.name()) {
            return Stream::builder()
                .with_cardinality_limit(default::LAYER_SERIES_LIMIT)
                .build()
                .ok();
        }
        (exponential && i.kind() == InstrumentKind::Histogram && i.unit() == metric::UNIT_SECONDS)
            .then(|| {
                Stream::builder()
                    .with_aggregation(Aggregation::Base2ExponentialHistogram {
                        max_size: 160,
                        max_scale: 20,
                        record_min_max: true,
                    })
                    .build()
                    .ok()
            })
            .flatten()
    }
}

pub(crate) fn build(cfg: &Config) -> Result<Exporters, ExportError> {
    let res = resource(cfg);
    let otlp = cfg.otlp.as_ref();
    let needs_runtime = otlp.is_some_and(|o| o.protocol == crate::config::Protocol::Grpc);
    let runtime = if needs_runtime {
        Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("phasetrace-otlp")
                .enable_all()
                .build()
                .map_err(ExportError::Thread)?,
        )
    } else {
        None
    };

    let traced = (cfg.traces_otlp && otlp.is_some()) || cfg.traces_console;
    let metrics_otlp = cfg.metrics_otlp && otlp.is_some();
    // Exemplars need both a trace to link to and a sink to show them on: the Prometheus
    // endpoint (OpenMetrics) or OTLP metrics.
    let exemplars = (traced && (cfg.prometheus.is_some() || metrics_otlp))
        .then(|| std::sync::Arc::new(ExemplarStore::default()));
    let mut otlp_reader = None;
    let mut export_counts = None;
    if let (true, Some(o)) = (cfg.metrics_otlp, otlp) {
        let counts = std::sync::Arc::new(counted::ExportCounts::default());
        // Traces off: the SDK's exporter, unchanged.
        let inner =
            match &exemplars {
                Some(store) => MetricsExporter::WithExemplars(
                    proto_metrics::ProtoMetricExporter::new(o, runtime.as_ref(), store.clone())?,
                ),
                None => MetricsExporter::Sdk(otlp::metric_exporter(o, runtime.as_ref())?),
            };
        let exporter = counted::CountedMetrics::new(inner, counts.clone(), o.endpoint.clone());
        export_counts = Some(counts);
        otlp_reader = Some(
            opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
                .with_interval(cfg.metric_export_interval)
                .build(),
        );
    }
    // Exponential histograms are an OTLP setting: never applied to the Prometheus reader.
    let exponential = otlp_reader.is_some()
        && otlp.is_some_and(|o| o.histogram == HistogramAggregation::Exponential);

    let mut prometheus_reader = None;
    let mut prometheus = None;
    if let Some(addr) = cfg.prometheus {
        let web = cfg
            .prometheus_web_config
            .as_deref()
            .map(reload::LiveWebConfig::load)
            .transpose()?;
        // With the same aggregation on both sides, scrapes read the OTLP reader's (one
        // aggregation, so the worker records each measurement once).
        let shared = otlp_reader.clone().filter(|_| !exponential);
        let (reader, server) = self::prometheus::start(addr, web, exemplars.clone(), shared)?;
        prometheus_reader = reader;
        prometheus = Some(server);
    }
    let mut meter_providers = Vec::new();
    match (otlp_reader, prometheus_reader, exponential) {
        (Some(o), Some(p), true) => {
            meter_providers.push(
                SdkMeterProvider::builder()
                    .with_resource(res.clone())
                    .with_reader(o)
                    .with_view(view(true))
                    .build(),
            );
            meter_providers.push(
                SdkMeterProvider::builder()
                    .with_resource(res.clone())
                    .with_reader(p)
                    .with_view(view(false))
                    .build(),
            );
        }
        (o, p, exp) => {
            let mut b = SdkMeterProvider::builder().with_resource(res.clone());
            if let Some(o) = o {
                b = b.with_reader(o);
            }
            if let Some(p) = p {
                b = b.with_reader(p);
            }
            meter_providers.push(b.with_view(view(exp)).build());
        }
    }

    // The web configuration file's reloads (and whether the last one worked) and the OTLP
    // metrics exports, on every meter provider (OTLP and Prometheus).
    let mut outcome_counters = Vec::new();
    let mut state_gauges = Vec::new();
    for p in &meter_providers {
        if let Some(counts) = prometheus.as_ref().and_then(PrometheusServer::reloads) {
            let last = counts.clone();
            outcome_counters.push(outcome_counter(
                p,
                metric::PROMETHEUS_WEB_CONFIG_RELOADS,
                metric::UNIT_RELOADS,
                "Re-reads of the Prometheus endpoint's web configuration file after it changed, by result",
                &cfg.group,
                move |r| counts.get(r),
            ));
            state_gauges.push(state_gauge(
                p,
                metric::PROMETHEUS_WEB_CONFIG_LAST_RELOAD_SUCCESSFUL,
                "1 while the Prometheus endpoint serves the web configuration file as it is on disk, \
                 0 after a change to it was refused (the configuration read before stays in force)",
                &cfg.group,
                move || last.last_successful(),
            ));
        }
        if let Some(counts) = export_counts.clone() {
            outcome_counters.push(outcome_counter(
                p,
                metric::METRIC_EXPORTS,
                metric::UNIT_EXPORTS,
                "OTLP metrics exports, by result",
                &cfg.group,
                move |r| counts.get(r),
            ));
        }
    }

    let span_counts = std::sync::Arc::new(SpanCounts::default());
    // Every span exporter is wrapped to count what it delivered and lost.
    let tracer_provider = match (cfg.traces_otlp, otlp, cfg.traces_console) {
        (true, Some(o), _) => {
            let exporter = otlp::span_exporter(o, runtime.as_ref())?;
            Some(tracer_provider(
                res,
                counted::Counted::new(exporter, span_counts.clone(), exemplars.clone()),
            ))
        }
        (_, _, true) => Some(tracer_provider(
            res,
            counted::Counted::new(
                console::ConsoleSpanExporter,
                span_counts.clone(),
                exemplars.clone(),
            ),
        )),
        _ => None,
    };
    Ok(Exporters {
        meter_providers,
        tracer_provider,
        span_counts,
        exemplars,
        prometheus,
        _outcome_counters: outcome_counters,
        _state_gauges: state_gauges,
        runtime,
    })
}

/// A counter by [`Outcome`] (`result`) on `provider`, read by `get` at each collection; both
/// results from the start.
fn outcome_counter(
    provider: &SdkMeterProvider,
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    group: &str,
    get: impl Fn(Outcome) -> u64 + Send + Sync + 'static,
) -> opentelemetry::metrics::ObservableCounter<u64> {
    use crate::names::attr;
    use opentelemetry::metrics::MeterProvider as _;
    let series = Outcome::ALL.map(|r| {
        (
            r,
            [
                KeyValue::new(attr::RESULT, r.as_str()),
                KeyValue::new(attr::GROUP, group.to_owned()),
            ],
        )
    });
    provider
        .meter("phasetrace")
        .u64_observable_counter(name)
        .with_unit(unit)
        .with_description(description)
        .with_callback(move |o| {
            for (r, kv) in &series {
                o.observe(get(*r), kv);
            }
        })
        .build()
}

/// A 0/1 gauge on `provider` (1 when `get` says so), read at each collection; attribute `group`,
/// no unit.
fn state_gauge(
    provider: &SdkMeterProvider,
    name: &'static str,
    description: &'static str,
    group: &str,
    get: impl Fn() -> bool + Send + Sync + 'static,
) -> opentelemetry::metrics::ObservableGauge<u64> {
    use opentelemetry::metrics::MeterProvider as _;
    let kv = [KeyValue::new(crate::names::attr::GROUP, group.to_owned())];
    provider
        .meter("phasetrace")
        .u64_observable_gauge(name)
        .with_description(description)
        .with_callback(move |o| o.observe(u64::from(get()), &kv))
        .build()
}

/// A tracer provider exporting through a batch processor sized to [`SPAN_QUEUE`].
fn tracer_provider<E: SpanExporter + 'static>(res: Resource, exporter: E) -> SdkTracerProvider {
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(SPAN_QUEUE)
        .with_max_export_batch_size(SPAN_BATCH)
        .with_scheduled_delay(Duration::from_millis(500))
        .build();
    SdkTracerProvider::builder()
        .with_resource(res)
        .with_span_processor(
            BatchSpanProcessor::builder(exporter)
                .with_batch_config(batch)
                .build(),
        )
        .build()
}

impl Exporters {
    /// Pushes everything buffered to the exporters.
    pub(crate) fn force_flush(&self) {
        if let Some(t) = &self.tracer_provider {
            let _ = t.force_flush();
        }
        for m in &self.meter_providers {
            let _ = m.force_flush();
        }
    }

    /// Flushes and shuts every exporter down within `timeout` in all (the configured shutdown
    /// timeout): each provider gets what its predecessors left of it.
    pub(crate) fn shutdown(&mut self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        if let Some(t) = &self.tracer_provider {
            let _ = t.shutdown_with_timeout(left());
        }
        for m in &self.meter_providers {
            let _ = m.shutdown_with_timeout(left());
        }
        if let Some(p) = self.prometheus.take() {
            p.stop();
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(left().min(Duration::from_millis(500)));
        }
    }
}
