//! [`Profiler`]: configuration in, recorders out, a worker and exporters behind.

use crate::config::settings::{self, Setting, SettingValue};
use crate::config::{
    Config, ConfigBuilder, ConfigError, Listen, Origin, SectionLevel, SpecLevel, Timing,
};
use crate::export::{Bind, ExportError, Exporters, Given};
use crate::record::{Gate, Recorder, RecorderOptions, Shared};
use crate::timing::{Clock, EngineStream, HostClock};
use crate::worker::{Kept, Pipeline, Stats, Worker, WorkerInputs, WorkerOptions};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;

/// Why a profiler could not be built.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An exporter could not be set up.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// The host clock cannot be what `PHASETRACE_HOST_CLOCK` asks for.
    #[error(transparent)]
    HostClock(#[from] crate::timing::HostClockError),
    /// A timing backend could not be set up.
    #[error("PHASETRACE_TIMING={timing}: {detail}")]
    Timing {
        /// The backend asked for.
        timing: &'static str,
        /// What is missing.
        detail: String,
    },
}

/// Builds a [`Profiler`]: defaults, then the environment, then these settings (code wins).
#[derive(Default)]
pub struct ProfilerBuilder {
    cfg: ConfigBuilder,
    clock: Option<Arc<dyn Clock>>,
    stream: Option<Box<dyn EngineStream>>,
    drain_interval: Option<Duration>,
    spec_k_max: Option<u32>,
    use_env: Option<bool>,
    given: Given,
}

impl std::fmt::Debug for ProfilerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilerBuilder")
            .field("cfg", &self.cfg)
            .field("clock", &self.clock.as_ref().map(|c| c.timing()))
            .field("given", &self.given)
            .finish()
    }
}

impl ProfilerBuilder {
    /// Records metrics into the engine's own meter provider (an `SdkMeterProvider` clone, or any
    /// [`opentelemetry::metrics::MeterProvider`]) instead of a pipeline of phasetrace's:
    /// phasetrace then builds no metrics exporter, resource, reader or runtime of its own, and
    /// serves no Prometheus endpoint unless one is asked for (`PHASETRACE_PROMETHEUS` or
    /// `OTEL_METRICS_EXPORTER=prometheus`, served from a reader of its own). Its instruments
    /// are created under the instrumentation scope `phasetrace` with the crate's version.
    /// [`Profiler::shutdown`] never flushes or shuts the provider down: it stays the engine's.
    ///
    /// Register [`crate::view`] on the provider's builder: without it the per-layer counters
    /// keep the SDK's 2,000 series per instrument, and `build()` says so once on stderr.
    pub fn with_meter_provider<P: crate::EngineMeterProvider>(mut self, provider: P) -> Self {
        // Only a provider whose type is the SDK's records through bound handles: the API's
        // default `bind` of any other drops what it is given.
        self.given.meter_bind = Bind::of::<P>();
        self.given.meter_readers = crate::export::views::sdk_has_readers(&provider);
        self.given.meter = Some(Arc::new(provider));
        self.cfg.embedded = true;
        self
    }

    /// Builds step and round spans on the engine's own tracer provider (an
    /// `SdkTracerProvider` clone, or any [`opentelemetry::trace::TracerProvider`]) instead of a
    /// pipeline of phasetrace's: no span exporter, processor or resource of phasetrace's. The
    /// spans carry the instrumentation scope `phasetrace`; with the `tracing` feature a sampled
    /// step is a child of the engine's current `tracing` span, read through the engine's own
    /// `tracing-opentelemetry` layer. Spans on the engine's provider are the engine's to queue
    /// and count: `Stats::spans_exported` stays 0, and no exemplars link to them.
    /// [`Profiler::shutdown`] never flushes or shuts the provider down.
    pub fn with_tracer_provider<P: crate::EngineTracerProvider>(mut self, provider: P) -> Self {
        self.given.tracer = Some(Arc::new(provider));
        self.cfg.embedded = true;
        self
    }

    /// Records into `opentelemetry::global`'s meter and tracer providers, as they are when
    /// `build()` runs (the engine sets them first): [`Self::with_meter_provider`] and
    /// [`Self::with_tracer_provider`] with the globals.
    ///
    /// A global provider that is still the API's no-op default when `build()` runs records
    /// nothing: `build()` cannot tell it apart from a provider without readers, and says so
    /// once (target `phasetrace`) when its meter took none of phasetrace's instruments.
    pub fn with_global_providers(mut self) -> Self {
        // The global provider's type is not known: recorded by attributes, never bound.
        self.given.meter_bind = Bind::Unbound;
        self.given.meter = None;
        self.given.tracer = None;
        self.given.global = true;
        self.cfg.embedded = true;
        self
    }

    /// The embedded Prometheus endpoint as its variable spells it: `None` turned it **off**,
    /// the default endpoint included. Replaced by [`Self::with_prometheus_at`] and
    /// [`Self::without_prometheus`], which cannot be misread.
    #[doc(hidden)]
    #[deprecated(note = "use with_prometheus_at(addr) or without_prometheus()")]
    pub fn with_prometheus(mut self, addr: Option<&str>) -> Self {
        match addr {
            None => self.cfg.set(&settings::PROMETHEUS, Listen::Off),
            Some(text) => {
                if let Err(e) = self.cfg.set_text(&settings::PROMETHEUS, text) {
                    self.cfg.defer(e);
                }
            }
        }
        self
    }

    /// Sets any setting in code, typed: what the `with_*` setters that `config/table.rs`
    /// declares do.
    pub(crate) fn with<T: SettingValue>(mut self, setting: &Setting<T>, value: T) -> Self {
        self.cfg.set(setting, value);
        self
    }

    /// Sets any setting of [`settings::SETTINGS`] in code by its variable, from text as the
    /// variable would read it (an engine's own config file, a CLI flag): the same parser and the
    /// same error as the environment, and code wins over the environment as with every setter:
    /// `with_text("PHASETRACE_EXPERT_WINDOW", "128")?`. An unknown variable is an error naming
    /// it.
    pub fn with_text(mut self, var: &str, text: &str) -> Result<Self, ConfigError> {
        let setting = settings::find(var).ok_or_else(|| ConfigError::Invalid {
            var: var.to_owned(),
            // Not a known setting: it may be a misspelled secret one.
            value: crate::config::echoed(true, text),
            expected: "a setting's variable (phasetrace::config::settings::SETTINGS lists them: \
                       PHASETRACE_*, OTEL_*)"
                .to_owned(),
        })?;
        self.cfg.set_text(setting, text)?;
        Ok(self)
    }

    /// The default clock of every recorder (the engine's stream). Its name must match the
    /// selected timing backend.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Times the engine's stream with the backend `PHASETRACE_TIMING` selects: `host` (the host
    /// clock), `sync` (synchronize, then read the host clock) or `events` (events resolved by
    /// the worker), asking the stream for its clock of that backend ([`EngineStream`]). A
    /// cudarc `Arc<CudaStream>` is one (feature `cuda`: `timing::cuda::CudaSyncClock` and
    /// `CudaEventClock`; without a CUDA driver, `build()` returns [`Error::Timing`] for `sync`
    /// and `events`), and so is `phasetrace-sim`'s simulated stream.
    pub fn with_stream(mut self, stream: impl EngineStream) -> Self {
        self.stream = Some(Box::new(stream));
        self
    }

    /// The OTLP endpoint (`http(s)://host:port`; checked by `build()`), or `None` for no OTLP
    /// even when the variable sets one. Env: `OTEL_EXPORTER_OTLP_ENDPOINT`; default none.
    pub fn with_otlp_endpoint(mut self, endpoint: Option<&str>) -> Self {
        match endpoint {
            None => self.cfg.set(&settings::OTLP_ENDPOINT, None),
            Some(text) => {
                if let Err(e) = self.cfg.set_text(&settings::OTLP_ENDPOINT, text) {
                    self.cfg.defer(e);
                }
            }
        }
        self
    }

    /// Declares a legacy variable that stands for a phasetrace variable, usually
    /// `PHASETRACE_LEVEL` or `PHASETRACE_SPEC_LEVEL` (`"METRALE_GLM_PROFILE"`); it is read with
    /// that setting's parser. Both are honored; the phasetrace name wins, and a disagreement is
    /// reported once on stderr. A `target` that is no phasetrace variable fails `build()`.
    pub fn with_legacy_alias(mut self, target: &'static str, alias: impl Into<String>) -> Self {
        self.cfg.aliases.push((alias.into(), target));
        self
    }

    /// The largest k of a round, for the accepted-length histogram's integer buckets
    /// `0..=k_max`. Default 16.
    pub fn with_spec_k_max(mut self, k_max: u32) -> Self {
        self.spec_k_max = Some(k_max);
        self
    }

    /// Ignore the process environment (tests, embedding). Default: read it.
    pub fn without_env(mut self) -> Self {
        self.use_env = Some(false);
        self
    }

    /// How often the worker drains the buffers. Default 1 ms, stretched up to 16x while the
    /// buffers stay empty (an idle engine costs few wake-ups).
    pub fn with_drain_interval(mut self, every: Duration) -> Self {
        self.drain_interval = Some(every);
        self
    }

    /// Resolves the configuration without starting anything (what `phasetrace check` prints).
    pub fn config(&self) -> Result<Config, ConfigError> {
        if self.use_env == Some(false) {
            self.cfg.resolve_with(|_| None)
        } else {
            self.cfg.resolve_with(|k| std::env::var_os(k))
        }
    }

    /// Resolves the configuration, starts the exporters and the worker.
    ///
    /// Safe to call from async code (inside a Tokio runtime of either flavour): the exporters
    /// are set up on a thread of their own, and the caller only waits for it.
    pub fn build(self) -> Result<Profiler, Error> {
        let cfg = self.config()?;
        let mut given = self.given;
        if given.global {
            given.meter = Some(opentelemetry::global::meter_provider());
            given.tracer = Some(Arc::new(opentelemetry::global::tracer_provider()));
        }
        for w in &cfg.alias_warnings {
            crate::diag::notice!("{w}");
        }
        if !cfg.sdk_disabled {
            crate::timing::choose_host_source(cfg.host_clock)?;
        }
        // Checked now even when the profiler starts off: a bad file is never found only later,
        // when an operator turns profiling on.
        #[cfg(feature = "prometheus")]
        if let (Some(_), Some(path)) = (cfg.prometheus, &cfg.prometheus_web_config) {
            crate::export::web_config::load(path).map_err(ExportError::from)?;
        }
        let clock: Arc<dyn Clock> = match (cfg.timing, self.clock) {
            (t, None) if self.stream.is_some() => match &self.stream {
                Some(s) => stream_clock(s.as_ref(), t)?,
                None => Arc::new(HostClock),
            },
            (_, Some(c)) if c.timing() == cfg.timing => c,
            (Timing::Host, None) => Arc::new(HostClock),
            (t, Some(c)) => {
                return Err(Error::Timing {
                    timing: t.as_str(),
                    detail: format!(
                        "the clock given in code is the {} backend; expected the {} backend",
                        c.timing().as_str(),
                        t.as_str()
                    ),
                });
            }
            (t, None) => {
                return Err(Error::Timing {
                    timing: t.as_str(),
                    detail: "this backend needs the engine's stream: pass it with \
                             ProfilerBuilder::with_stream, or a clock with with_clock"
                        .to_owned(),
                });
            }
        };
        let enabled = cfg.is_enabled();
        let shared = Arc::new(Shared {
            level: Gate::new(if enabled {
                cfg.level
            } else {
                SectionLevel::Off
            }),
            spec_level: Gate::new(if enabled {
                cfg.spec_level
            } else {
                SpecLevel::Off
            }),
            sampling: crate::record::Sampling::of(&cfg),
            graph_read_every: cfg.graph_read_every,
            graphs: Default::default(),
            queue: cfg.queue,
            rank: cfg.rank,
            clock,
            lanes: Mutex::new(Vec::new()),
            next_lane: AtomicU16::new(1),
            kinds: Default::default(),
            spec_off_hint: AtomicBool::new(
                !cfg.sdk_disabled && cfg.origin(crate::names::env::SPEC_LEVEL) == Origin::Default,
            ),
            engine: Default::default(),
        });
        let start = Start {
            opts: WorkerOptions {
                k_max: self.spec_k_max.unwrap_or(16),
                drain_interval: self.drain_interval.unwrap_or(Duration::from_millis(1)),
            },
            given,
            kept: Kept::new(&cfg),
        };
        // A profiler built off starts no thread and no exporter until `set_level` turns it on.
        let running = if enabled {
            Some(start.run(&shared, &cfg)?)
        } else {
            None
        };
        Ok(Profiler {
            inner: Arc::new(Inner {
                shared,
                cfg,
                start,
                running: Mutex::new(running),
                shut_down: AtomicBool::new(false),
                warned_off: AtomicBool::new(false),
                stopped: Mutex::new(None),
            }),
        })
    }
}

/// What starting the worker and exporters needs beyond the configuration.
#[derive(Clone)]
struct Start {
    opts: WorkerOptions,
    given: Given,
    /// What the worker keeps across restarts.
    kept: Kept,
}

impl Start {
    /// The exporters, then the worker over them.
    fn run(&self, shared: &Arc<Shared>, cfg: &Config) -> Result<Running, Error> {
        let given = &self.given;
        let mut exporters = off_runtime(|| crate::export::build(cfg, given))??;
        let inputs = WorkerInputs {
            cfg,
            shared,
            exporters: &exporters,
            given,
            kept: &self.kept,
            opts: self.opts,
        };
        match Worker::build(&inputs) {
            Ok(worker) => Ok(Running { worker, exporters }),
            Err(e) => {
                let _ = off_runtime(move || exporters.shutdown(Duration::from_millis(500)));
                Err(Error::Export(ExportError::Thread(e)))
            }
        }
    }
}

/// Runs `f` on a thread of its own and waits for it: exporters are set up (and, on failure,
/// dropped) off any async runtime the caller is in, where a blocking HTTP client or a Tokio
/// runtime must be neither created nor dropped.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, Error> {
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("phasetrace-setup".into())
            .spawn_scoped(s, f)
            .map_err(|e| Error::Export(ExportError::Thread(e)))?;
        handle.join().map_err(|_| {
            Error::Export(ExportError::Thread(std::io::Error::other(
                "the exporter setup thread panicked",
            )))
        })
    })
}

/// The clock `timing` selects for the engine's stream; the host backend needs nothing of it.
fn stream_clock(stream: &dyn EngineStream, timing: Timing) -> Result<Arc<dyn Clock>, Error> {
    if timing == Timing::Host {
        return Ok(Arc::new(HostClock));
    }
    let err = |detail: String| Error::Timing {
        timing: timing.as_str(),
        detail,
    };
    let clock = stream.clock(timing).map_err(|e| err(e.to_string()))?;
    if clock.timing() != timing {
        return Err(err(format!(
            "the engine's stream gave a clock of the {} backend",
            clock.timing().as_str()
        )));
    }
    Ok(clock)
}

struct Running {
    worker: Worker,
    exporters: Exporters,
}

struct Inner {
    shared: Arc<Shared>,
    cfg: Config,
    start: Start,
    running: Mutex<Option<Running>>,
    shut_down: AtomicBool,
    /// The off-by-default warning was given.
    warned_off: AtomicBool,
    /// What a shut-down profiler keeps for `stats()` and `summary()`: the final figures.
    stopped: Mutex<Option<Figures>>,
}

/// Where the worker's figures live: its pipeline (whose `stats()` assembles [`Stats`]).
#[derive(Clone)]
struct Figures {
    pipeline: Arc<Mutex<Pipeline>>,
}

impl Figures {
    fn of(r: &Running) -> Figures {
        Figures {
            pipeline: r.worker.pipeline.clone(),
        }
    }

    fn stats(&self) -> Stats {
        self.pipeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stats()
    }

    fn summary(&self) -> String {
        crate::worker::summary_table(
            self.pipeline
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .tally(),
        )
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let running = self
            .running
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(r) = running {
            finish(r, self.cfg.shutdown_timeout, self.cfg.summary_every > 0);
        }
        // A provider keeps every callback registered on it: a profiler built on it later
        // must be the only one that observes.
        self.start.kept.detach();
    }
}

/// Stops the worker and the exporters, giving up after `timeout` (the rest continues on a
/// detached thread, which the process exit ends).
fn finish(r: Running, timeout: Duration, summary: bool) {
    let (tx, rx) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    let spawned = std::thread::Builder::new()
        .name("phasetrace-shutdown".into())
        .spawn(move || {
            let mut r = r;
            r.worker.stop();
            if summary {
                let p = r.worker.pipeline.lock().unwrap_or_else(|e| e.into_inner());
                if p.tally().steps > 0 {
                    eprint!("{}", crate::worker::summary_table(p.tally()));
                }
            }
            // The exporters get what the worker left of the timeout.
            r.exporters
                .shutdown(timeout.saturating_sub(started.elapsed()));
            let _ = tx.send(());
        });
    if spawned.is_ok() {
        let _ = rx.recv_timeout(timeout);
    }
}

/// The profiler: owns the configuration, the worker and the exporters; hands out
/// [`Recorder`]s. Cheap to clone; shuts down when [`Profiler::shutdown`] is called or the last
/// clone drops.
///
/// ```
/// use phasetrace::{Profiler, Section, SectionLevel, Site};
///
/// let profiler = Profiler::builder()
///     .without_env()
///     .with_level(SectionLevel::Full)
///     .without_prometheus()
///     .build()?;
/// let rec = profiler.recorder();
/// for _token in 0..3 {
///     let _step = rec.step();
///     for layer in 0..2u32 {
///         let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
///         let _front = rec.section(Section::KDA_FRONT, layer, Site::ATTN);
///     }
/// }
/// profiler.flush();
/// assert_eq!(profiler.stats().sections, 12);
/// profiler.shutdown();
/// # Ok::<(), phasetrace::Error>(())
/// ```
#[derive(Clone)]
pub struct Profiler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Profiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profiler")
            .field("config", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

impl Profiler {
    /// A builder: defaults, then environment, then code.
    pub fn builder() -> ProfilerBuilder {
        ProfilerBuilder::default()
    }

    /// Builds a profiler from the environment alone.
    pub fn from_env() -> Result<Profiler, Error> {
        Self::builder().build()
    }

    /// A recorder for the calling engine thread, with the profiler's rank and clock.
    ///
    /// With no level set anywhere (`PHASETRACE_LEVEL` unset, no `with_level`), the profiler is
    /// off and its recorders record nothing: the first recorder says so once on stderr.
    ///
    /// Cost: about 5 µs in a release build (`recorder/create`, 2-vCPU development VM under
    /// load: [`crate::benchmarks`]), including one short lock: cheap once per thread or task,
    /// not per token. Recorders may be created and
    /// dropped without bound: a dropped one's 16-bit lane id is reused once the worker has
    /// drained it, never while a live recorder holds it.
    pub fn recorder(&self) -> Recorder {
        self.recorder_with(RecorderOptions::default())
    }

    /// A recorder with its own rank or clock (ranks as threads; one stream per thread).
    pub fn recorder_with(&self, opts: RecorderOptions) -> Recorder {
        self.warn_if_off_by_default();
        Recorder::new(self.inner.shared.clone(), opts)
    }

    /// A recorder made current on this thread ([`crate::current::install`]): model code
    /// that has no handle to it (a layer's `forward`) records on it with
    /// [`crate::current::section`]. Dropping the guard uninstalls and drops it.
    pub fn install_thread_recorder(&self) -> crate::current::Installed {
        crate::current::install(self.recorder())
    }

    /// [`Profiler::install_thread_recorder`] with a rank or clock of its own
    /// ([`Profiler::recorder_with`]).
    pub fn install_thread_recorder_with(&self, opts: RecorderOptions) -> crate::current::Installed {
        crate::current::install(self.recorder_with(opts))
    }

    fn warn_if_off_by_default(&self) {
        let cfg = &self.inner.cfg;
        let unset = |var| cfg.origin(var) == Origin::Default;
        if !self.is_enabled()
            && !cfg.sdk_disabled
            && unset(crate::names::env::LEVEL)
            && unset(crate::names::env::SPEC_LEVEL)
            && !self.inner.warned_off.swap(true, Ordering::Relaxed)
        {
            crate::diag::notice!(
                "recording is off: {} and {} are off by default, so this recorder \
                 records nothing until one is set ({}=full, ProfilerBuilder::with_level, or \
                 Profiler::set_level at run time; said once)",
                crate::names::env::LEVEL,
                crate::names::env::SPEC_LEVEL,
                crate::names::env::LEVEL
            );
        }
    }

    /// Registers a kind of request (provider, operation, model), for
    /// [`Recorder::request_begin`]: the same kind gives the same class. Takes a lock: call it
    /// once per kind, not per request. Fails beyond 4,096 kinds.
    pub fn request_kind(&self, kind: crate::RequestKind) -> Result<crate::RequestClass, Error> {
        self.inner.shared.kinds.register(kind).ok_or_else(|| {
            Error::Config(ConfigError::Conflict(
                "Profiler::request_kind: more than 4096 request kinds registered (one per \
                 provider, operation and model is enough)"
                    .to_owned(),
            ))
        })
    }

    /// The resolved configuration.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Whether anything is recorded.
    pub fn is_enabled(&self) -> bool {
        self.inner.shared.level.load() != SectionLevel::Off
            || self.inner.shared.spec_level.load() != SpecLevel::Off
    }

    /// Changes which sections are recorded, at run time (an operator turning profiling on in
    /// production, or down to collectives only). A profiler built off starts its worker and
    /// exporters on the first change to a level other than off. Fails after
    /// [`Profiler::shutdown`], or when `OTEL_SDK_DISABLED=true`.
    pub fn set_level(&self, level: SectionLevel) -> Result<(), Error> {
        self.set(level == SectionLevel::Off, || {
            self.inner.shared.level.store(level)
        })
    }

    /// Changes the speculative-decoding detail at run time; see [`Profiler::set_level`].
    pub fn set_spec_level(&self, level: SpecLevel) -> Result<(), Error> {
        self.inner
            .shared
            .spec_off_hint
            .store(false, Ordering::Relaxed);
        self.set(level == SpecLevel::Off, || {
            self.inner.shared.spec_level.store(level)
        })
    }

    /// Stores a level (`off` when it is off) unless the profiler cannot record.
    fn set(&self, off: bool, store: impl FnOnce()) -> Result<(), Error> {
        let refuse = |why: &str| {
            Err(Error::Config(ConfigError::Conflict(format!(
                "cannot change the level: {why}"
            ))))
        };
        if self.inner.cfg.sdk_disabled {
            return refuse("OTEL_SDK_DISABLED=true");
        }
        let mut running = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
        // Checked under the lock `shutdown` takes: a shut-down profiler never restarts.
        if self.inner.shut_down.load(Ordering::Relaxed) {
            return refuse("the profiler is shut down");
        }
        if !off && running.is_none() {
            *running = Some(self.inner.start.run(&self.inner.shared, &self.inner.cfg)?);
        }
        store();
        Ok(())
    }

    /// The embedded Prometheus endpoint's bound address, when it runs.
    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        let r = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
        r.as_ref().and_then(|r| r.exporters.prometheus_addr())
    }

    /// The embedded Prometheus endpoint's URL (`https://` when its web config serves TLS), when
    /// it runs.
    pub fn prometheus_url(&self) -> Option<String> {
        let r = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
        r.as_ref().and_then(|r| r.exporters.prometheus_url())
    }

    /// Processes everything recorded so far on the calling thread (resolving what the clocks can
    /// resolve now), then pushes buffered spans and metrics to the exporters, side by side:
    /// against endpoints that never answer it returns after one OTLP timeout
    /// (`OTEL_EXPORTER_OTLP_TIMEOUT`), not one per exporter.
    pub fn flush(&self) {
        let r = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = r.as_ref() {
            r.worker.flush();
            r.exporters.force_flush();
        }
    }

    /// Processes everything recorded so far, without pushing to exporters.
    pub fn drain(&self) {
        let r = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = r.as_ref() {
            r.worker.flush();
        }
    }

    /// The worker's figures: those of the running worker, or the final ones after
    /// [`Profiler::shutdown`]; `None` when it never started.
    fn figures(&self) -> Option<Figures> {
        let r = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
        match r.as_ref() {
            Some(r) => Some(Figures::of(r)),
            None => self
                .inner
                .stopped
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// What the worker has seen so far: marks, sections, steps, rounds, spans, drops. After
    /// [`Profiler::shutdown`], the final figures.
    ///
    /// Locks: takes the profiler's state lock (the one `flush`, `set_level` and `shutdown`
    /// take), then the worker's pipeline lock, which a drain pass holds while it processes
    /// marks: it may wait for one pass or a `flush` in progress. Meant for monitoring and tests,
    /// not for every token; recorders never take either lock.
    pub fn stats(&self) -> Stats {
        self.figures().map_or_else(Stats::default, |f| f.stats())
    }

    /// The tokens routed to every (rank, layer, expert) since the profiler was built, for
    /// expert-parallel load balancers; empty unless `PHASETRACE_EXPERT_COUNTER=on`
    /// ([`ProfilerBuilder::with_expert_counter`]). [`crate::ExpertLoad::since`] gives what was
    /// routed between two calls; [`crate::ExpertLoad::hottest`] the hottest experts.
    ///
    /// Counts are what the worker has processed (at most one drain interval behind the
    /// recorders; [`Profiler::flush`] first to include everything recorded). Cost: one short
    /// lock per rank (no pipeline lock, so it never waits for a drain pass) and a copy of every
    /// counter, 23,040 of them at 384 experts x 60 layers (`benches/hot_path.rs`,
    /// `moe/expert_load_snapshot_60x384`; figures in `docs/moe.md`): cheap enough to call every
    /// few seconds, not per token.
    pub fn expert_load(&self) -> crate::ExpertLoad {
        self.inner.start.kept.expert_load()
    }

    /// The console summary table of everything recorded so far; after
    /// [`Profiler::shutdown`], of everything recorded.
    ///
    /// Locks: the same as [`Profiler::stats`], the pipeline lock for as long as the table takes
    /// to format; recorders never take either.
    pub fn summary(&self) -> String {
        self.figures().map_or_else(String::new, |f| f.summary())
    }

    /// Stops recording, processes what is left, flushes every exporter and stops them, within
    /// the configured shutdown timeout (default 5 s) even when a collector is down.
    /// Later hot-path calls cost one relaxed load and record nothing.
    pub fn shutdown(&self) {
        let running = {
            let mut r = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
            self.inner.shut_down.store(true, Ordering::Relaxed);
            self.inner.shared.level.store(SectionLevel::Off);
            self.inner.shared.spec_level.store(SpecLevel::Off);
            if let Some(r) = r.as_ref() {
                *self.inner.stopped.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(Figures::of(r));
            }
            r.take()
        };
        if let Some(r) = running {
            finish(
                r,
                self.inner.cfg.shutdown_timeout,
                self.inner.cfg.summary_every > 0,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Section, Site};

    #[test]
    fn only_an_sdk_meter_provider_records_through_bound_handles() {
        let bind = |b: ProfilerBuilder| b.given.meter_bind;
        let sdk = opentelemetry_sdk::metrics::SdkMeterProvider::builder().build();
        assert_eq!(
            bind(Profiler::builder().with_meter_provider(sdk)),
            Bind::Bound
        );
        let noop = opentelemetry::metrics::noop::NoopMeterProvider::new();
        assert_eq!(
            bind(Profiler::builder().with_meter_provider(noop)),
            Bind::Unbound,
            "another provider's bind may drop what it is given"
        );
        let sdk = opentelemetry_sdk::metrics::SdkMeterProvider::builder().build();
        assert_eq!(
            bind(
                Profiler::builder()
                    .with_meter_provider(sdk)
                    .with_global_providers()
            ),
            Bind::Unbound,
            "the globals' type is not known"
        );
    }

    /// What an engine's environment typically holds for its own SDK, plus a value phasetrace
    /// would refuse: none of it is phasetrace's once a provider is given.
    const ENGINE_ENV: &[(&str, &str)] = &[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:9/v1/traces",
        ),
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://127.0.0.1:9/v1/metrics",
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ("OTEL_TRACES_EXPORTER", "otlp"),
        ("OTEL_METRICS_EXPORTER", "otlp,prometheus"),
        ("OTEL_RESOURCE_ATTRIBUTES", "novalue"),
        ("OTEL_SDK_DISABLED", "true"),
    ];

    fn resolve(b: &ProfilerBuilder, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        b.cfg.resolve_with(|k| {
            vars.iter()
                .find(|(v, _)| *v == k)
                .map(|(_, x)| std::ffi::OsString::from(x))
        })
    }

    /// The same assertions hold in every feature set (`scripts/check-features.sh` runs this
    /// test with no default features too): which exporters run is configuration, never what
    /// another crate's features compiled in.
    #[test]
    fn with_an_engines_provider_its_otel_environment_starts_nothing_of_phasetraces() {
        use opentelemetry_sdk::metrics::SdkMeterProvider;
        use opentelemetry_sdk::trace::SdkTracerProvider;
        let meter = SdkMeterProvider::builder().build();
        let tracer = SdkTracerProvider::builder().build();
        let cases = [
            (
                "both",
                Profiler::builder()
                    .with_meter_provider(meter.clone())
                    .with_tracer_provider(tracer.clone()),
            ),
            (
                "meter only",
                Profiler::builder().with_meter_provider(meter.clone()),
            ),
            (
                "tracer only",
                Profiler::builder().with_tracer_provider(tracer.clone()),
            ),
        ];
        for (what, b) in cases {
            let cfg = resolve(&b, ENGINE_ENV).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(cfg.prometheus, None, "{what}");
            assert!(
                cfg.traces_otlp.is_none() && cfg.metrics_otlp.is_none(),
                "{what}"
            );
            assert!(
                !cfg.sdk_disabled,
                "{what}: OTEL_SDK_DISABLED is the engine's SDK's"
            );
            let mut e = crate::export::build(&cfg, &b.given).expect("exporters");
            assert_eq!(e.own(), Vec::<String>::new(), "{what}");
            e.shutdown(Duration::from_millis(100));
        }
        // Asked in code or by a PHASETRACE_* setting, phasetrace's own exporter runs (where
        // the build has it; where not, `build()` says which feature is off).
        let b = Profiler::builder()
            .with_meter_provider(meter.clone())
            .with_prometheus_at(([127, 0, 0, 1], 0));
        let asked = resolve(&b, ENGINE_ENV);
        if cfg!(feature = "prometheus") {
            assert!(asked.expect("config").prometheus.is_some());
        } else {
            let e = asked.expect_err("no endpoint compiled in").to_string();
            assert!(e.contains("feature `prometheus` is off"), "{e}");
        }
        let env = [ENGINE_ENV, &[("PHASETRACE_PROMETHEUS", "127.0.0.1:0")]].concat();
        let b = Profiler::builder().with_meter_provider(meter);
        assert_eq!(
            resolve(&b, &env).map(|c| c.prometheus.is_some()).ok(),
            cfg!(feature = "prometheus").then_some(true),
        );
    }

    #[test]
    fn no_otlp_in_code_also_turns_a_signals_endpoint_from_the_environment_off() {
        let b = Profiler::builder().with_otlp_endpoint(None);
        let c = resolve(
            &b,
            &[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9"),
                ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://127.0.0.1:9"),
            ],
        )
        .expect("config");
        assert!(c.traces_otlp.is_none() && c.metrics_otlp.is_none());
    }

    #[test]
    fn a_protocol_nobody_set_is_named_as_the_default_when_it_is_not_compiled_in() {
        if cfg!(feature = "otlp-grpc") {
            return;
        }
        let b = Profiler::builder().with_otlp_endpoint(Some("http://127.0.0.1:9"));
        let e = resolve(&b, &[]).expect_err("no grpc").to_string();
        assert!(
            e.starts_with(
                "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9 (OTEL_EXPORTER_OTLP_PROTOCOL \
                 unset: grpc by default)"
            ),
            "{e}"
        );
    }

    fn profiler() -> Profiler {
        Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .without_prometheus()
            .build()
            .expect("profiler")
    }

    /// With `record-off` every recording call is empty: a profiler at full level sees nothing.
    #[cfg(feature = "record-off")]
    #[test]
    fn recording_compiled_out_records_nothing() {
        let p = profiler();
        let rec = p.recorder();
        for layer in 0..4u32 {
            let _step = rec.step();
            let _s = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        }
        p.flush();
        let s = p.stats();
        assert_eq!((s.marks, s.steps, s.sections), (0, 0, 0), "{s:?}");
        p.shutdown();
    }

    #[cfg_attr(feature = "record-off", ignore = "recording is compiled out")]
    #[test]
    fn stats_and_summary_keep_the_final_figures_after_shutdown() {
        let p = profiler();
        let rec = p.recorder();
        for layer in 0..4u32 {
            let _step = rec.step();
            let _s = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
        }
        drop(rec);
        p.shutdown();
        let s = p.stats();
        assert_eq!((s.steps, s.sections, s.dropped.total()), (4, 4, 0), "{s:?}");
        let summary = p.summary();
        assert!(summary.contains("after 4 steps:"), "{summary}");
        assert!(summary.contains("kda_mixer"), "{summary}");
    }

    #[test]
    fn the_summary_header_counts_the_steps_of_each_rank() {
        let p = profiler();
        let ranks: Vec<Recorder> = (0..3)
            .map(|r| p.recorder_with(RecorderOptions::new().rank(r)))
            .collect();
        for rec in &ranks {
            for _ in 0..4 {
                let _step = rec.step();
            }
        }
        p.drain();
        let summary = p.summary();
        assert!(
            summary.contains("after 4 steps x 3 ranks (per rank)"),
            "{summary}"
        );
        let _step = ranks[0].step();
        drop(_step);
        p.drain();
        let summary = p.summary();
        assert!(
            summary.contains("after 13 steps over 3 ranks (4 to 5 per rank)"),
            "{summary}"
        );
        p.shutdown();
    }
}
