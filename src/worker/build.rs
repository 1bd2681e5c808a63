//! The worker's one constructor: the resolved configuration and the exporters in, the running
//! worker out. Every worker setting is read here or below (a new one: its declaration in
//! `config/table.rs`, its consumer here or in the sink it configures).
//!
//! ```text
//! Config ─┬─> LayerTotals, OpenSteps, RequestGauges
//!         ├─> Instruments on each of the exporters' meters (ProviderMeter::create)
//!         ├─> Sinks: SpanSink (the tracer when Sampling traces), MetricsSink, ConsoleSink
//!         └─> Requests (their own tail rules)
//!               ──> Pipeline ──> Worker::start (the drain thread)
//! Kept: what outlives a stop and a restart (`set_level` off, then on): the observable
//! callbacks' attachment, the expert load, the missing-view notice said once.
//! ```

use super::open::OpenSteps;
use super::requests::{RequestGauges, Requests};
use super::sinks::Sinks;
use super::sinks::console::ConsoleSink;
use super::sinks::metrics::MetricsSink;
use super::sinks::metrics::aggregate::{Bind, Instruments};
use super::sinks::metrics::attachment::Attachment;
use super::sinks::metrics::experts::{ExpertSettings, ExpertTotals};
use super::sinks::metrics::layers::LayerTotals;
use super::sinks::spans::{SpanSink, tail::Tail};
use super::{Pipeline, Worker};
use crate::config::Config;
use crate::export::{Exporters, Given};
use crate::record::{Sampling, Shared};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// What one profiler's workers share across restarts.
#[derive(Clone)]
pub(crate) struct Kept {
    /// This profiler's observable callbacks on every meter provider, detached when it drops
    /// (after `shutdown()` they still report its final totals).
    attachment: Attachment,
    /// The MoE expert load (`PHASETRACE_EXPERT_COUNTER`): written by the metrics sink, read by
    /// `Profiler::expert_load`.
    experts: Arc<ExpertTotals>,
    /// The missing-view line was said (once per profiler).
    views_warned: Arc<AtomicBool>,
}

impl Kept {
    pub(crate) fn new(cfg: &Config) -> Kept {
        Kept {
            attachment: Attachment::default(),
            experts: ExpertTotals::new(ExpertSettings::of(cfg), &cfg.group),
            views_warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The tokens routed to every (rank, layer, expert) so far.
    pub(crate) fn expert_load(&self) -> crate::ExpertLoad {
        self.experts.snapshot()
    }

    /// Detaches the observable callbacks from every provider (the profiler is gone).
    pub(crate) fn detach(&self) {
        self.attachment.detach();
    }
}

/// What the profiler's builder sets in code only (no variable).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Options {
    /// The most draft tokens a round proposes (`ProfilerBuilder::with_spec_k_max`).
    pub(crate) k_max: u32,
    /// How often the worker drains (`ProfilerBuilder::with_drain_interval`).
    pub(crate) drain_interval: Duration,
}

/// What the worker is built from: the resolved configuration, the recorders' shared state,
/// the exporters in force, the engine's own providers, what outlives a restart and the
/// builder's options.
pub(crate) struct Inputs<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) shared: &'a Arc<Shared>,
    pub(crate) exporters: &'a Exporters,
    pub(crate) given: &'a Given,
    pub(crate) kept: &'a Kept,
    pub(crate) opts: Options,
}

impl Worker {
    /// Builds the pipeline `cfg` asks for over `exporters` and starts its drain thread.
    pub(crate) fn build(i: &Inputs<'_>) -> std::io::Result<Worker> {
        let Inputs {
            cfg,
            shared,
            exporters,
            kept,
            opts,
            ..
        } = i;
        let layers = LayerTotals::new(&cfg.group, cfg.layer_attr, cfg.layer_ranks.clone());
        let parts = Parts {
            open: OpenSteps::new(layers.group().clone()),
            request_gauges: Arc::new(RequestGauges::default()),
            layers,
        };
        let inst = instruments(i, &parts);
        let Parts {
            layers,
            open,
            request_gauges,
        } = parts;
        let tracer = exporters
            .tracer
            .clone()
            .filter(|_| Sampling::of(cfg).traces());
        let tracing_requests = tracer.is_some();
        let sinks = Sinks {
            spans: SpanSink::new(
                tracer,
                exporters.span_counts.clone(),
                Tail::new(cfg.trace_slower_than, cfg.trace_slow_budget),
                exporters.exemplars.clone(),
                layers.group().clone(),
            ),
            metrics: MetricsSink::new(inst, layers, kept.experts.clone()),
            console: ConsoleSink::new(cfg.summary_every, cfg.spec_summary_every),
        };
        let requests = Requests::new(
            (*shared).clone(),
            tracing_requests,
            Tail::new(cfg.trace_requests_ttft_over, cfg.trace_slow_budget),
            Tail::new(cfg.trace_requests_tpot_over, cfg.trace_slow_budget),
            request_gauges,
        );
        let pipeline = Pipeline::new((*shared).clone(), open, sinks, requests);
        Worker::start(pipeline, opts.drain_interval)
    }
}

/// What the instruments and the sinks share.
struct Parts {
    layers: Arc<LayerTotals>,
    open: Arc<OpenSteps>,
    request_gauges: Arc<RequestGauges>,
}

/// The worker's instruments on each of the exporters' meters; says once when the engine's
/// provider took none of the per-layer instruments through `phasetrace::view()`.
fn instruments(i: &Inputs<'_>, parts: &Parts) -> Vec<Instruments> {
    let Inputs {
        cfg,
        shared,
        exporters,
        given,
        kept,
        opts,
    } = i;
    let Parts {
        layers,
        open,
        request_gauges,
    } = parts;
    // What the engine's provider's views did with the instruments, learnt on it alone while
    // they are created there (`ProviderMeter::create`).
    let mut engine_view = None;
    let inst = exporters
        .meters
        .iter()
        .map(|pm| {
            let (m, bind, d, t) = (&pm.meter, pm.bind, &pm.distributions, &pm.twins);
            let (i, seen) = pm.create(|m| {
                Instruments::new(m, layers, open, opts.k_max, &kept.attachment)
                    .with_experts(m, &kept.experts)
                    .with_requests(m, request_gauges)
                    .with_engine(m, &shared.engine)
                    .with_bind(bind)
            });
            if pm.given {
                engine_view = Some(seen);
            }
            // A provider whose histograms a `view(true)` made exponential (the engine's own,
            // told so by its view) carries the per-layer distributions at one series each;
            // explicit buckets would cost B + 3 series per layer. The distributions' own meter
            // is phasetrace's (an SDK provider); on the provider's meter they bind as its
            // instruments do.
            let d = match d {
                Some(d) => Some((d, Bind::Bound)),
                None => seen.exponential.then_some((m, bind)),
            };
            // With twins, the distributions' meter is the endpoint's native provider, which
            // only protobuf scrapes read: recorded from the first one on, as the twins.
            let wanted = t.is_some().then_some(&exporters.native_wanted);
            i.with_distributions(d, wanted)
                .with_native_twins(t.as_ref(), &exporters.native_wanted)
        })
        .collect();
    if let Some(seen) = engine_view {
        crate::export::hint_missing_view(given, seen, cfg.layer_attr, &kept.views_warned);
    }
    inst
}
