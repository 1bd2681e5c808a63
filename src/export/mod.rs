//! Exporters: OTLP (gRPC, HTTP/protobuf), the embedded Prometheus endpoint, console spans, and the
//! engine's own providers. Each of phasetrace's own is installed by its module's `install`
//! function (one signature, `Installer`; `build` walks `INSTALLERS`), which adds generic
//! outputs to the one `Install` they all share: readers with their aggregation and role
//! (`OwnReader`), servers (`Server`), a tracer provider, its own metrics. The meter providers
//! are then built by one loop over the readers (`OwnMeters::build`): one provider per
//! aggregation, the native reader's apart. A new exporter is its module, its line in
//! `INSTALLERS` and its variant of `config::Exporter` (docs/development.md).
//!
//! ```text
//! worker ──> SdkMeterProvider ──┬─ PeriodicReader ─ OTLP metrics: proto_metrics (+ exemplars
//!                               │        ^          when traces are on) over transport
//!                               │        (both on, same aggregation: scrapes collect here too)
//!                               └─ ManualReader <── GET /metrics (export::prometheus: hyper,
//!                                                   TLS, basic auth, classic | OpenMetrics |
//!                                                   protobuf with native histograms, gzip)
//!        ──> native provider (with the endpoint): ManualReader that only the protobuf
//!            scrape reads: the per-layer distributions and the exponential twins of the
//!            explicit-bucket duration histograms (see `ProviderMeter::distributions`, `twins`)
//!        ──> SdkTracerProvider ─── BatchSpanProcessor ─ OTLP spans (proto_spans) | console
//!                                       (delivered spans settle ExemplarStore entries)
//! ```

mod console;
mod counted;
pub(crate) mod exemplars;
mod given;
#[cfg(feature = "otlp")]
pub(crate) mod otlp;
#[cfg(feature = "prometheus")]
pub(crate) mod prometheus;
#[cfg(feature = "otlp")]
mod proto_metrics;
#[cfg(feature = "otlp")]
mod proto_spans;
#[cfg(feature = "otlp")]
pub(crate) mod transport;
pub(crate) mod views;

#[cfg(test)]
pub(crate) use self::counted::Counted;
pub(crate) use self::counted::SpanCounts;
pub(crate) use self::exemplars::ExemplarStore;
pub(crate) use self::given::{Bind, Given, hint_missing_view};
#[cfg(feature = "prometheus")]
pub(crate) use self::prometheus::web_config;
#[cfg(feature = "prometheus")]
pub use self::prometheus::web_config::WebConfigError;
pub use self::views::view;

use crate::config::{Config, Exporter, ExporterSet, Signal};
use crate::names::resource;
use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanExporter,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use thiserror::Error;

/// The instrumentation scope of every instrument and span phasetrace creates: `phasetrace` with
/// the crate's version.
pub(crate) fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(crate::names::SCOPE)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// Spans the batch processor queues (its `max_queue_size`).
const SPAN_QUEUE: usize = 16_384;
/// Spans the worker lets be pending in the processor: the queue less two export batches (one
/// being exported while the next is gathered), so that the processor never drops uncounted.
pub(crate) const SPAN_QUEUE_BUDGET: usize = SPAN_QUEUE - 2 * SPAN_BATCH;
const SPAN_BATCH: usize = 512;

/// An exporter that could not be set up.
#[derive(Debug, Error)]
#[non_exhaustive]
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
    /// The Prometheus endpoint's web configuration file is unreadable or invalid.
    #[cfg(feature = "prometheus")]
    #[error(transparent)]
    WebConfig(#[from] WebConfigError),
    /// An OTLP exporter failed to build.
    #[error("{var}={endpoint}: the OTLP {signal} exporter failed to build: {detail}")]
    Otlp {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// The variable the endpoint came from (`OTEL_EXPORTER_OTLP_ENDPOINT` or the
        /// signal's own).
        var: &'static str,
        /// The endpoint.
        endpoint: String,
        /// Why.
        detail: String,
    },
    /// The custom CA could not be read.
    #[error("{var}={path}: cannot read the CA certificate ({source})")]
    Certificate {
        /// The variable that named the file (`OTEL_EXPORTER_OTLP_CERTIFICATE` or the signal's
        /// own).
        var: &'static str,
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A background thread or runtime could not start.
    #[error("cannot start a background thread: {0}")]
    Thread(std::io::Error),
}

/// What the worker's instruments on one meter provider need: its meter, how they record on it,
/// and where its per-layer distributions and exponential twins go.
#[derive(Clone, Debug)]
pub(crate) struct ProviderMeter {
    /// The meter the instruments are created on.
    pub(crate) meter: Meter,
    /// Whether it records through bound handles: its provider is an `SdkMeterProvider`
    /// (phasetrace's own always are).
    pub(crate) bind: Bind,
    /// The meter its per-layer distributions are created on, if any (see `OwnMeters::push`):
    /// always one of phasetrace's own SDK providers.
    pub(crate) distributions: Option<Meter>,
    /// The meter of the base-2 exponential twins of its explicit-bucket duration histograms
    /// (the native halves of the protobuf scrape's histograms), if any: the native provider's,
    /// for the meter that serves the endpoint.
    pub(crate) twins: Option<Meter>,
    /// The engine's provider (given, or the globals): the one whose views phasetrace cannot
    /// know until its instruments are created there (see [`ProviderMeter::create`]); phasetrace's
    /// own always carry [`view`].
    pub(crate) given: bool,
}

impl ProviderMeter {
    /// Runs `create` with this provider's meter (it creates the worker's instruments there) and
    /// returns what the provider's views did with them ([`views::watch`]).
    pub(crate) fn create<T>(&self, create: impl FnOnce(&Meter) -> T) -> (T, views::ViewSeen) {
        views::watch(|| create(&self.meter))
    }
}

/// The providers and servers behind one profiler: what the worker records into (meters and a
/// tracer, the engine's or phasetrace's own) and what phasetrace owns and so shuts down.
pub(crate) struct Exporters {
    /// The meters the worker's instruments are created on, one per provider: the engine's
    /// (given), and phasetrace's own (OTLP and Prometheus; two when OTLP uses exponential
    /// histograms and the Prometheus endpoint keeps explicit buckets).
    pub(crate) meters: Vec<ProviderMeter>,
    /// Set by the endpoint when it serves its first protobuf scrape: the twins are recorded
    /// from then on (a text-only scraper never pays for them).
    pub(crate) native_wanted: Arc<std::sync::atomic::AtomicBool>,
    /// The providers phasetrace built, flushed and shut down with it.
    own_meter_providers: Vec<SdkMeterProvider>,
    /// The tracer of step and round spans, on the given tracer provider or phasetrace's own.
    pub(crate) tracer: Option<Arc<BoxedTracer>>,
    own_tracer_provider: Option<SdkTracerProvider>,
    /// What the span exporter delivered and lost (tracked with phasetrace's own provider only).
    pub(crate) span_counts: Arc<SpanCounts>,
    /// Exemplars of traced steps for the Prometheus endpoint and OTLP metrics: present when
    /// phasetrace's own spans and either of them are on.
    pub(crate) exemplars: Option<Arc<ExemplarStore>>,
    /// The servers phasetrace runs (the Prometheus endpoint), stopped at shutdown.
    servers: Vec<Box<dyn Server>>,
    /// The exporters' own metrics on every meter (see [`OwnMetrics`]), kept with them.
    _own_metrics: Vec<OwnMetric>,
    /// Keeps the tonic channels' background tasks alive.
    #[cfg(feature = "otlp")]
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Exporters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporters")
            .field("meters", &self.meters.len())
            .field("own_meter_providers", &self.own_meter_providers.len())
            .field("traces", &self.tracer.is_some())
            .field("prometheus", &self.prometheus_addr())
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

/// Which of phasetrace's own exporters are in force for each signal, given the engine's
/// providers: the engine's meter provider carries the metrics (no OTLP metrics pipeline of
/// phasetrace's), its tracer provider the spans.
#[derive(Clone, Copy, Debug)]
struct Wanted {
    traces: ExporterSet,
    metrics: ExporterSet,
}

impl Wanted {
    fn of(cfg: &Config, given: &Given) -> Wanted {
        let unless = |taken: bool, set: ExporterSet| if taken { ExporterSet::NONE } else { set };
        Wanted {
            traces: unless(given.tracer.is_some(), cfg.traces_exporters),
            // The endpoint is its own setting: asked for in so many words, it serves beside
            // the engine's provider (`Config::prometheus`).
            metrics: unless(given.meter.is_some(), cfg.metrics_exporters),
        }
    }

    /// Whether `e` is in force for `signal`.
    fn has(self, signal: Signal, e: Exporter) -> bool {
        match signal {
            Signal::Traces => self.traces.contains(e),
            Signal::Metrics => self.metrics.contains(e),
        }
    }

    fn own_traces(self) -> bool {
        !self.traces.is_empty()
    }
}

/// The exporter seam: what every exporter's install step reads (the first group of fields)
/// and the generic outputs it adds (the second). One install function per exporter, in its own
/// module, of the one signature [`Installer`]; [`build`] walks [`INSTALLERS`] in order, then
/// builds the meter providers over the readers they added ([`OwnMeters::build`]), registers
/// the exporters' own metrics ([`Install::own_metrics`]) on every meter, and builds the tracer
/// over their tracer provider.
struct Install<'a> {
    #[cfg_attr(not(any(feature = "otlp", feature = "prometheus")), allow(dead_code))]
    cfg: &'a Config,
    given: &'a Given,
    wanted: Wanted,
    /// Present when phasetrace's own spans and a metrics sink of its own are on.
    exemplars: &'a Option<Arc<ExemplarStore>>,
    /// What a span exporter of phasetrace's own delivered and lost (its `Counted` wrapper).
    span_counts: &'a Arc<SpanCounts>,
    /// Set by the endpoint at its first protobuf scrape (see [`Exporters::native_wanted`]).
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    native_wanted: &'a Arc<AtomicBool>,
    /// The tonic channels' runtime (gRPC only).
    #[cfg(feature = "otlp")]
    runtime: Option<&'a tokio::runtime::Runtime>,

    /// phasetrace's own readers, in install order, each with its aggregation and role.
    readers: Vec<OwnReader>,
    /// The servers phasetrace runs.
    servers: Vec<Box<dyn Server>>,
    /// The engine's meter, and its tracer (see `given::install`).
    meters: Vec<ProviderMeter>,
    tracer: Option<BoxedTracer>,
    /// The span exporters of phasetrace's own (OTLP, console), each behind its batch
    /// processor: one tracer provider of phasetrace's is built over them all.
    span_processors: Vec<BatchSpanProcessor>,
    /// The exporters' own metrics (OTLP metrics exports, the endpoint's reloads, closed
    /// connections and refusals), registered on every meter once the meters exist.
    own_metrics: Vec<OwnMetrics>,
}

/// A metric reader of phasetrace's own, shared between the meter provider it is registered
/// with and whoever collects from it on demand (the endpoint's scrapes).
#[derive(Clone, Debug)]
pub(crate) struct Reader(Arc<dyn MetricReader>);

impl Reader {
    #[cfg_attr(not(any(feature = "otlp", feature = "prometheus")), allow(dead_code))]
    pub(crate) fn new(reader: impl MetricReader) -> Reader {
        Reader(Arc::new(reader))
    }
}

impl MetricReader for Reader {
    fn register_pipeline(&self, pipeline: std::sync::Weak<opentelemetry_sdk::metrics::Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(
        &self,
        rm: &mut opentelemetry_sdk::metrics::data::ResourceMetrics,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(
        &self,
        kind: opentelemetry_sdk::metrics::InstrumentKind,
    ) -> opentelemetry_sdk::metrics::Temporality {
        self.0.temporality(kind)
    }
}

/// What a reader is for: it decides what its provider's meter carries besides the worker's
/// instruments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(all(feature = "otlp", feature = "prometheus")), allow(dead_code))]
pub(crate) enum Role {
    /// Pushed to a backend (OTLP metrics).
    Export,
    /// Collected by scrapes: the endpoint's own, or an export reader of the aggregation the
    /// endpoint serves, which the endpoint then shares (one aggregation, each measurement
    /// recorded once). Its provider's per-layer distributions and twins go to the native
    /// reader's provider.
    Scraped,
    /// The endpoint's native side, read by protobuf scrapes only: a provider of its own
    /// (exponential histograms) that carries the per-layer distributions and the exponential
    /// twins of the scraped provider's explicit-bucket histograms.
    Native,
}

/// A reader an installer added: the reader, whether its provider's histograms are base-2
/// exponential (else explicit buckets), and its role.
pub(crate) struct OwnReader {
    pub(crate) reader: Reader,
    pub(crate) exponential: bool,
    pub(crate) role: Role,
}

/// A server phasetrace runs for an exporter (the Prometheus endpoint): where it is reached,
/// and how it stops.
pub(crate) trait Server: Send {
    /// The address it listens on.
    fn addr(&self) -> SocketAddr;
    /// Its URL (`https://` when it serves TLS).
    fn url(&self) -> String;
    /// Stops it (after the request in hand).
    fn stop(self: Box<Self>);
}

/// What one exporter registers of its own metrics on a meter (each of phasetrace's and the
/// engine's): instruments whose callbacks read the exporter's counts at each collection.
type OwnMetrics = Box<dyn Fn(&Meter, &mut Vec<OwnMetric>)>;

/// One of an exporter's own metrics, kept as long as the exporters.
pub(crate) enum OwnMetric {
    /// By result or by reason.
    #[cfg_attr(not(any(feature = "otlp", feature = "prometheus")), allow(dead_code))]
    Counter(opentelemetry::metrics::ObservableCounter<u64>),
    /// A 0/1 state.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    Gauge(opentelemetry::metrics::ObservableGauge<u64>),
}

/// One exporter's install step: reads what `cfg` asks of it and adds its reader, server or
/// tracer provider to the [`Install`]; does nothing when it is not configured.
type Installer = fn(&mut Install<'_>) -> Result<(), ExportError>;

/// The exporters, in the order they install: the engine's providers first (its meter is the
/// first), OTLP metrics before the endpoint (whose scrapes may share its reader), OTLP spans
/// before console spans (never both: the configuration selects one).
const INSTALLERS: &[Installer] = &[
    given::install,
    #[cfg(feature = "otlp")]
    otlp::install_metrics,
    #[cfg(feature = "prometheus")]
    self::prometheus::install,
    #[cfg(feature = "otlp")]
    otlp::install_traces,
    console::install,
];

/// Builds what `cfg` asks for around the providers the engine gave. Run it off any async runtime
/// of the caller's (the blocking HTTP client and the OTLP runtime must not be created or dropped
/// on an async thread): [`crate::Profiler`] calls it on a thread of its own.
///
/// The steps: the OTLP runtime, each exporter's install ([`INSTALLERS`]), the meter providers
/// over their readers (after the engine's meter), the exporters' own metrics on every meter,
/// the tracer (the engine's, or phasetrace's own).
pub(crate) fn build(cfg: &Config, given: &Given) -> Result<Exporters, ExportError> {
    let resource = resource(cfg);
    let wanted = Wanted::of(cfg, given);
    #[cfg(feature = "otlp")]
    let runtime = otlp::runtime(cfg, wanted)?;
    // Exemplars need both a trace of phasetrace's own to link to (its exporter says which spans
    // were delivered) and a sink of its own to show them on: the Prometheus endpoint
    // (OpenMetrics) or OTLP metrics.
    let exemplars = (wanted.own_traces()
        && (cfg.prometheus.is_some() || wanted.has(Signal::Metrics, Exporter::Otlp)))
    .then(|| Arc::new(ExemplarStore::default()));
    let span_counts = Arc::new(SpanCounts::tracked(given.tracer.is_none()));
    let native_wanted = Arc::new(AtomicBool::new(false));

    let mut x = Install {
        cfg,
        given,
        wanted,
        exemplars: &exemplars,
        span_counts: &span_counts,
        native_wanted: &native_wanted,
        #[cfg(feature = "otlp")]
        runtime: runtime.as_ref(),
        readers: Vec::new(),
        servers: Vec::new(),
        meters: Vec::new(),
        tracer: None,
        span_processors: Vec::new(),
        own_metrics: Vec::new(),
    };
    for install in INSTALLERS {
        install(&mut x)?;
    }
    let Install {
        readers,
        servers,
        meters: engine_meters,
        tracer: engine_tracer,
        span_processors,
        own_metrics,
        ..
    } = x;
    let own_tracer_provider = (!span_processors.is_empty()).then(|| {
        span_processors
            .into_iter()
            .fold(
                SdkTracerProvider::builder().with_resource(resource.clone()),
                |b, p| b.with_span_processor(p),
            )
            .build()
    });
    let own_meters = OwnMeters::build(&resource, engine_meters, readers);
    // On every meter (OTLP and Prometheus, the engine's too), in install order.
    let mut kept = Vec::new();
    for m in &own_meters.meters {
        for register in &own_metrics {
            register(&m.meter, &mut kept);
        }
    }
    // The engine's tracer, else phasetrace's own (never both: `Wanted`).
    let tracer = engine_tracer.or_else(|| {
        own_tracer_provider.as_ref().map(|p| {
            BoxedTracer::new(Box::new(
                opentelemetry::trace::TracerProvider::tracer_with_scope(p, scope()),
            ))
        })
    });
    let OwnMeters {
        meters,
        providers: own_meter_providers,
    } = own_meters;
    Ok(Exporters {
        meters,
        native_wanted,
        own_meter_providers,
        tracer: tracer.map(Arc::new),
        own_tracer_provider,
        span_counts,
        exemplars,
        servers,
        _own_metrics: kept,
        #[cfg(feature = "otlp")]
        runtime,
    })
}

/// The meters the instruments are created on and, for each, whether it binds and where its
/// per-layer distributions and exponential twins go; the providers phasetrace built for them.
struct OwnMeters {
    meters: Vec<ProviderMeter>,
    providers: Vec<SdkMeterProvider>,
}

impl OwnMeters {
    /// The engine's meter (`engine`) first, then one provider of phasetrace's own per
    /// aggregation over the readers of that aggregation, in the order they were installed; the
    /// native readers get a provider apart, whose meter carries the per-layer distributions and
    /// the twins of the provider whose reader scrapes collect. A provider of exponential
    /// histograms that no scrape reads carries its distributions itself (one series each);
    /// one of explicit buckets, none (they would cost B + 3 series per layer).
    fn build(res: &Resource, engine: Vec<ProviderMeter>, readers: Vec<OwnReader>) -> OwnMeters {
        let provider = |readers: Vec<Reader>, exponential: bool| {
            let mut b = SdkMeterProvider::builder().with_resource(res.clone());
            for r in readers {
                b = b.with_reader(r);
            }
            b.with_view(view(exponential)).build()
        };
        let mut own = OwnMeters {
            meters: engine,
            providers: Vec::new(),
        };
        let (native, readers): (Vec<OwnReader>, Vec<OwnReader>) =
            readers.into_iter().partition(|r| r.role == Role::Native);
        let native_meter = (!native.is_empty()).then(|| {
            let p = provider(native.into_iter().map(|r| r.reader).collect(), true);
            let m = p.meter_with_scope(scope());
            own.providers.push(p);
            m
        });
        // The aggregations in install order, each once.
        let mut aggregations = Vec::new();
        for r in &readers {
            if !aggregations.contains(&r.exponential) {
                aggregations.push(r.exponential);
            }
        }
        for exponential in aggregations {
            let (mine, scraped): (Vec<Reader>, bool) = readers
                .iter()
                .filter(|r| r.exponential == exponential)
                .fold((Vec::new(), false), |(mut v, s), r| {
                    v.push(r.reader.clone());
                    (v, s || r.role == Role::Scraped)
                });
            let p = provider(mine, exponential);
            let m = p.meter_with_scope(scope());
            let native = native_meter.clone().filter(|_| scraped);
            own.meters.push(ProviderMeter {
                distributions: native.clone().or_else(|| exponential.then(|| m.clone())),
                twins: native,
                meter: m,
                bind: Bind::Bound,
                given: false,
            });
            own.providers.push(p);
        }
        own
    }
}

/// A counter by [`Outcome`](crate::names::Outcome) (`result`) on `meter`, read by `get` at each collection; both
/// results from the start.
#[cfg(any(feature = "otlp", feature = "prometheus"))]
fn outcome_counter(
    meter: &Meter,
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    group: &str,
    get: impl Fn(crate::names::Outcome) -> u64 + Send + Sync + 'static,
) -> opentelemetry::metrics::ObservableCounter<u64> {
    use crate::names::attr;
    let series = crate::names::Outcome::ALL.map(|r| {
        (
            r,
            [
                KeyValue::new(attr::RESULT, r.as_str()),
                KeyValue::new(attr::GROUP, group.to_owned()),
            ],
        )
    });
    meter
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

/// A counter on `meter` with one series per `reason` (`n` of them, each from the start):
/// `get(i)` gives the i-th reason's attribute value and count.
#[cfg(feature = "prometheus")]
fn reason_counter(
    meter: &Meter,
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    group: &str,
    n: usize,
    get: impl Fn(usize) -> (&'static str, u64) + Send + Sync + 'static,
) -> opentelemetry::metrics::ObservableCounter<u64> {
    use crate::names::attr;
    let group = group.to_owned();
    meter
        .u64_observable_counter(name)
        .with_unit(unit)
        .with_description(description)
        .with_callback(move |o| {
            for i in 0..n {
                let (reason, count) = get(i);
                o.observe(
                    count,
                    &[
                        KeyValue::new(attr::REASON, reason),
                        KeyValue::new(attr::GROUP, group.clone()),
                    ],
                );
            }
        })
        .build()
}

/// A 0/1 gauge on `meter` (1 when `get` says so), read at each collection; attribute `group`,
/// no unit.
#[cfg(feature = "prometheus")]
fn state_gauge(
    meter: &Meter,
    name: &'static str,
    description: &'static str,
    group: &str,
    get: impl Fn() -> bool + Send + Sync + 'static,
) -> opentelemetry::metrics::ObservableGauge<u64> {
    let kv = [KeyValue::new(crate::names::attr::GROUP, group.to_owned())];
    meter
        .u64_observable_gauge(name)
        .with_description(description)
        .with_callback(move |o| o.observe(u64::from(get()), &kv))
        .build()
}

/// A span exporter behind a batch processor sized to [`SPAN_QUEUE`].
fn span_processor<E: SpanExporter + 'static>(exporter: E) -> BatchSpanProcessor {
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(SPAN_QUEUE)
        .with_max_export_batch_size(SPAN_BATCH)
        .with_scheduled_delay(Duration::from_millis(500))
        .build();
    BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch)
        .build()
}

impl Exporters {
    /// What phasetrace runs of its own here (listeners, providers, threads), by name: empty
    /// when everything goes to the engine's providers.
    #[cfg(test)]
    pub(crate) fn own(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        if let Some(a) = self.prometheus_addr() {
            v.push(format!("prometheus endpoint {a}"));
        }
        v.extend((0..self.own_meter_providers.len()).map(|i| format!("meter provider {i}")));
        if self.own_tracer_provider.is_some() {
            v.push("tracer provider".to_owned());
        }
        #[cfg(feature = "otlp")]
        if self.runtime.is_some() {
            v.push("OTLP runtime".to_owned());
        }
        v
    }

    /// The embedded Prometheus endpoint's address, when it runs.
    pub(crate) fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.servers.first().map(|s| s.addr())
    }

    /// The embedded Prometheus endpoint's URL, when it runs.
    pub(crate) fn prometheus_url(&self) -> Option<String> {
        self.servers.first().map(|s| s.url())
    }

    /// Pushes everything buffered in phasetrace's own providers to their exporters (the
    /// engine's providers are the engine's to flush).
    pub(crate) fn force_flush(&self) {
        // Side by side, so that against endpoints that never answer the call takes one OTLP
        // timeout, not one per provider (each export is bounded by it).
        std::thread::scope(|scope| {
            if let Some(t) = &self.own_tracer_provider {
                scope.spawn(move || {
                    let _ = t.force_flush();
                });
            }
            for m in &self.own_meter_providers {
                scope.spawn(move || {
                    let _ = m.force_flush();
                });
            }
        });
    }

    /// Flushes and shuts phasetrace's own exporters down within `timeout` in all (the
    /// configured shutdown timeout): each provider gets what its predecessors left of it. The
    /// engine's providers are left running.
    pub(crate) fn shutdown(&mut self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        if let Some(t) = &self.own_tracer_provider {
            let _ = t.shutdown_with_timeout(left());
        }
        for m in &self.own_meter_providers {
            let _ = m.shutdown_with_timeout(left());
        }
        for server in self.servers.drain(..) {
            server.stop();
        }
        #[cfg(feature = "otlp")]
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(left().min(Duration::from_millis(500)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration with OTLP traces and metrics and the Prometheus endpoint all asked for.
    fn everything() -> Config {
        crate::Profiler::builder()
            .without_env()
            .with_otlp_endpoint(Some("http://127.0.0.1:9"))
            .with_text(crate::names::env::OTEL_METRICS_EXPORTER, "otlp,prometheus")
            .expect("exporters")
            .with_prometheus_at(([127, 0, 0, 1], 0))
            .config()
            .expect("config")
    }

    #[test]
    fn with_the_engines_providers_phasetrace_builds_no_pipeline_of_its_own() {
        let meter = SdkMeterProvider::builder().build();
        let tracer = SdkTracerProvider::builder().build();
        let mut cfg = everything();
        // As `build()` leaves it when a meter provider is given and Prometheus was not asked
        // for in so many words.
        cfg.prometheus = None;
        let given = Given {
            meter: Some(Arc::new(meter)),
            meter_bind: Bind::of::<SdkMeterProvider>(),
            tracer: Some(Arc::new(tracer)),
            global: false,
            meter_readers: Some(false),
        };
        let mut e = build(&cfg, &given).expect("exporters");
        assert_eq!(e.meters.len(), 1, "the engine's meter only");
        assert_eq!(e.meters[0].bind, Bind::Bound, "an SdkMeterProvider binds");
        assert!(
            e.meters[0].distributions.is_none(),
            "no per-layer distributions on the engine's provider"
        );
        assert!(
            e.meters[0].twins.is_none(),
            "no native twins on the engine's provider"
        );
        assert!(e.own_meter_providers.is_empty());
        assert!(e.own_tracer_provider.is_none());
        assert!(e.tracer.is_some(), "spans on the engine's provider");
        assert!(e.exemplars.is_none());
        assert!(!e.span_counts.tracked);
        #[cfg(feature = "otlp")]
        assert!(e.runtime.is_none(), "no OTLP runtime thread");
        assert_eq!(e.prometheus_addr(), None);
        e.shutdown(Duration::from_millis(100));
    }

    #[test]
    fn without_providers_phasetrace_builds_its_own() {
        let mut e = build(&everything(), &Given::default()).expect("exporters");
        assert!(!e.own_meter_providers.is_empty());
        assert!(e.meters.iter().all(|m| m.distributions.is_some()));
        #[cfg(feature = "prometheus")]
        assert!(
            e.meters.iter().all(|m| m.twins.is_some()),
            "the meter that serves the endpoint has native twins"
        );
        #[cfg(feature = "prometheus")]
        assert_eq!(
            e.own_meter_providers.len(),
            e.meters.len() + 1,
            "the native histograms get a provider of their own, read by protobuf scrapes only"
        );
        assert!(e.own_tracer_provider.is_some());
        assert!(e.span_counts.tracked);
        #[cfg(feature = "otlp-grpc")]
        assert!(e.runtime.is_some());
        #[cfg(feature = "prometheus")]
        assert!(e.prometheus_addr().is_some());
        e.shutdown(Duration::from_millis(500));
    }

    #[cfg(all(feature = "prometheus", feature = "otlp"))]
    #[test]
    fn exponential_otlp_carries_the_distributions_and_only_the_endpoint_gets_twins() {
        let mut cfg = everything();
        if let Some(o) = cfg.metrics_otlp.as_mut() {
            o.histogram = crate::config::HistogramAggregation::Exponential;
        }
        let mut e = build(&cfg, &Given::default()).expect("exporters");
        assert_eq!(e.meters.len(), 2, "OTLP's provider and the endpoint's");
        assert!(e.meters.iter().all(|m| m.distributions.is_some()));
        assert_eq!(
            e.meters.iter().filter(|m| m.twins.is_some()).count(),
            1,
            "twins for the endpoint's explicit buckets only: OTLP's histograms are exponential"
        );
        e.shutdown(Duration::from_millis(500));
    }
}
