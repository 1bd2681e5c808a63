//! Exporters: OTLP (gRPC, HTTP/protobuf), the embedded Prometheus endpoint, console spans, and the
//! engine's own providers. Each of phasetrace's own is installed by its module's `install`
//! function (one signature, `Installer`; `build` walks `INSTALLERS`), which adds its reader,
//! server or tracer provider to the one `Install` they all share.
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
pub use self::prometheus::web_config::WebConfigError;
#[cfg(feature = "prometheus")]
pub(crate) use self::prometheus::{PrometheusServer, web_config};
pub use self::views::view;

use crate::config::Config;
use crate::names::resource;
use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
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

/// The OTLP metrics reader: the SDK's periodic reader over the counted OTLP exporter.
#[cfg(feature = "otlp")]
#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
pub(crate) type OtlpMetricReader =
    opentelemetry_sdk::metrics::PeriodicReader<counted::CountedMetrics<MetricsExporter>>;

/// The OTLP metrics exporter: phasetrace's own (opentelemetry-proto's conversion, plus the
/// exemplars of delivered traces when traces are on), bounded against a hostile collector.
#[cfg(feature = "otlp")]
pub(crate) type MetricsExporter = proto_metrics::ProtoMetricExporter;

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
    #[cfg(feature = "prometheus")]
    pub(crate) prometheus: Option<PrometheusServer>,
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

/// Which of phasetrace's own pipelines `cfg` asks for, given the engine's providers: the
/// engine's meter provider carries the metrics (no OTLP metrics pipeline of phasetrace's), its
/// tracer provider the spans.
#[derive(Clone, Copy, Debug)]
struct Wanted {
    metrics_otlp: bool,
    traces_otlp: bool,
    traces_console: bool,
}

impl Wanted {
    fn of(cfg: &Config, given: &Given) -> Wanted {
        Wanted {
            metrics_otlp: given.meter.is_none() && cfg.metrics_otlp.is_some(),
            traces_otlp: given.tracer.is_none() && cfg.traces_otlp.is_some(),
            traces_console: given.tracer.is_none() && cfg.traces_console,
        }
    }

    fn own_traces(self) -> bool {
        self.traces_otlp || self.traces_console
    }
}

/// The exporter seam: what every exporter's install step reads (the first group of fields)
/// and what it adds (the second). One install function per exporter, in its own module, of
/// the one signature [`Installer`]; [`build`] walks [`INSTALLERS`] in order, then builds the
/// meter providers over the readers they added, registers the exporters' own metrics
/// ([`Install::own_metrics`]) on every meter, and builds the tracer over their tracer provider.
struct Install<'a> {
    #[cfg_attr(not(any(feature = "otlp", feature = "prometheus")), allow(dead_code))]
    cfg: &'a Config,
    given: &'a Given,
    wanted: Wanted,
    resource: &'a Resource,
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

    /// The OTLP metrics reader (which the endpoint's scrapes share when the aggregation is the
    /// same), and whether its histograms are exponential.
    #[cfg(feature = "otlp")]
    otlp_reader: Option<OtlpMetricReader>,
    exponential: bool,
    /// The endpoint's own reader (none when it shares the OTLP one), its server, and the
    /// native reader that only its protobuf scrapes read.
    #[cfg(feature = "prometheus")]
    prometheus_reader: Option<self::prometheus::PrometheusReader>,
    #[cfg(feature = "prometheus")]
    prometheus: Option<PrometheusServer>,
    #[cfg(feature = "prometheus")]
    native: Option<self::prometheus::Native>,
    /// The engine's meter, and its tracer (see `given::install`).
    meters: Vec<ProviderMeter>,
    tracer: Option<BoxedTracer>,
    /// phasetrace's own tracer provider (OTLP or console spans).
    tracer_provider: Option<SdkTracerProvider>,
    /// The exporters' own metrics (OTLP metrics exports, the endpoint's reloads, closed
    /// connections and refusals), registered on every meter once the meters exist.
    own_metrics: Vec<OwnMetrics>,
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
    let exemplars = (wanted.own_traces() && (cfg.prometheus.is_some() || wanted.metrics_otlp))
        .then(|| Arc::new(ExemplarStore::default()));
    let span_counts = Arc::new(SpanCounts::tracked(given.tracer.is_none()));
    let native_wanted = Arc::new(AtomicBool::new(false));

    let mut x = Install {
        cfg,
        given,
        wanted,
        resource: &resource,
        exemplars: &exemplars,
        span_counts: &span_counts,
        native_wanted: &native_wanted,
        #[cfg(feature = "otlp")]
        runtime: runtime.as_ref(),
        #[cfg(feature = "otlp")]
        otlp_reader: None,
        exponential: false,
        #[cfg(feature = "prometheus")]
        prometheus_reader: None,
        #[cfg(feature = "prometheus")]
        prometheus: None,
        #[cfg(feature = "prometheus")]
        native: None,
        meters: Vec::new(),
        tracer: None,
        tracer_provider: None,
        own_metrics: Vec::new(),
    };
    for install in INSTALLERS {
        install(&mut x)?;
    }
    let Install {
        #[cfg(feature = "otlp")]
        otlp_reader,
        exponential,
        #[cfg(feature = "prometheus")]
        prometheus_reader,
        #[cfg(feature = "prometheus")]
        prometheus,
        #[cfg(feature = "prometheus")]
        native,
        meters: engine_meters,
        tracer: engine_tracer,
        tracer_provider: own_tracer_provider,
        own_metrics,
        ..
    } = x;
    #[cfg(not(feature = "otlp"))]
    let otlp_reader: Option<SdkReaderStub> = None;
    #[cfg(not(feature = "prometheus"))]
    let prometheus_reader: Option<SdkReaderStub> = None;

    let own_meters = OwnMeters::build(
        &resource,
        engine_meters,
        #[cfg(feature = "prometheus")]
        native,
        otlp_reader,
        prometheus_reader,
        exponential,
    );
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
        #[cfg(feature = "prometheus")]
        prometheus,
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
    /// The engine's meter (`engine`) first, then phasetrace's own providers over `otlp` and `prometheus`
    /// (one, or two when OTLP is exponential and the endpoint keeps explicit buckets), and the
    /// native provider over the endpoint's native reader.
    fn build<O, P>(
        res: &Resource,
        engine: Vec<ProviderMeter>,
        #[cfg(feature = "prometheus")] native_reader: Option<self::prometheus::Native>,
        otlp: Option<O>,
        prometheus: Option<P>,
        exponential: bool,
    ) -> OwnMeters
    where
        O: opentelemetry_sdk::metrics::reader::MetricReader,
        P: opentelemetry_sdk::metrics::reader::MetricReader,
    {
        let provider = |readers: Vec<Box<dyn FnOnce(MeterBuilder) -> MeterBuilder>>, exp: bool| {
            let mut b = SdkMeterProvider::builder().with_resource(res.clone());
            for r in readers {
                b = r(b);
            }
            b.with_view(view(exp)).build()
        };
        let mut own = OwnMeters {
            meters: engine,
            providers: Vec::new(),
        };
        // The native provider: exponential histograms only (its view), read by the protobuf
        // scrape only.
        #[cfg(feature = "prometheus")]
        let native_meter = native_reader.map(|n| {
            let p = provider(vec![with_reader(n.reader)], true);
            let m = p.meter_with_scope(scope());
            own.providers.push(p);
            m
        });
        #[cfg(not(feature = "prometheus"))]
        let native_meter: Option<Meter> = None;
        // Scrapes read this provider's reader when the endpoint runs and has none of its own.
        let shared_with_endpoint = native_meter.is_some() && prometheus.is_none();
        match (otlp, prometheus, exponential) {
            (Some(o), Some(p), true) => {
                own.push(
                    provider(vec![with_reader(o)], true),
                    &native_meter,
                    true,
                    false,
                );
                own.push(
                    provider(vec![with_reader(p)], false),
                    &native_meter,
                    false,
                    true,
                );
            }
            (None, None, _) => {}
            (o, p, exp) => {
                let serves = p.is_some() || shared_with_endpoint;
                let mut readers = Vec::new();
                if let Some(o) = o {
                    readers.push(with_reader(o));
                }
                if let Some(p) = p {
                    readers.push(with_reader(p));
                }
                own.push(provider(readers, exp), &native_meter, exp, serves);
            }
        }
        own
    }

    /// One of phasetrace's own providers: its per-layer distributions and exponential twins go
    /// to the native provider's meter for the provider that serves the endpoint; to the same
    /// meter (distributions only: its histograms are exponential already) for an OTLP exporter
    /// of exponential histograms; nowhere otherwise (OTLP with explicit buckets only; the
    /// engine's own provider).
    fn push(
        &mut self,
        p: SdkMeterProvider,
        native_meter: &Option<Meter>,
        exponential_otlp: bool,
        serves_endpoint: bool,
    ) {
        let m = p.meter_with_scope(scope());
        let native = native_meter.clone().filter(|_| serves_endpoint);
        self.meters.push(ProviderMeter {
            distributions: native
                .clone()
                .or_else(|| exponential_otlp.then(|| m.clone())),
            twins: native,
            meter: m,
            bind: Bind::Bound,
            given: false,
        });
        self.providers.push(p);
    }
}

type MeterBuilder = opentelemetry_sdk::metrics::MeterProviderBuilder;

/// A reader as a step of the provider's builder (readers of different types in one list).
fn with_reader<R>(r: R) -> Box<dyn FnOnce(MeterBuilder) -> MeterBuilder>
where
    R: opentelemetry_sdk::metrics::reader::MetricReader,
{
    Box::new(move |b| b.with_reader(r))
}

/// Stands for a reader type in builds without the exporter that has one.
#[cfg(not(all(feature = "otlp", feature = "prometheus")))]
type SdkReaderStub = opentelemetry_sdk::metrics::ManualReader;

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
        #[cfg(feature = "prometheus")]
        return self.prometheus.as_ref().map(PrometheusServer::addr);
        #[cfg(not(feature = "prometheus"))]
        None
    }

    /// The embedded Prometheus endpoint's URL, when it runs.
    pub(crate) fn prometheus_url(&self) -> Option<String> {
        #[cfg(feature = "prometheus")]
        return self.prometheus.as_ref().map(PrometheusServer::url);
        #[cfg(not(feature = "prometheus"))]
        None
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
        #[cfg(feature = "prometheus")]
        if let Some(p) = self.prometheus.take() {
            p.stop();
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
