//! Aggregation: SDK instruments (histograms and counters), which the metrics sink records into
//! ([`super`]).
//!
//! The series budget: histograms with buckets carry only the attributes that quantiles and
//! alerts use (`bucket`, `site`, `rank`); per-layer detail is summed on the worker, per
//! (section, layer, site, rank), in [`super::layers::LayerTotals`], and read by observable
//! counters at each collection (a scrape or an OTLP export): two series per (bucket, layer)
//! instead of a histogram's 25. Where a histogram costs one series (native histograms on the
//! protobuf scrape, exponential OTLP), each section and wait in a layer is also one
//! observation of its layer's base-2 exponential distribution (`with_distributions`).

use super::attachment::Attachment;
use super::experts::ExpertTotals;
use super::layers::LayerTotals;
pub(crate) use crate::export::Bind;
use crate::names::{Described, DropReason, attr, metric};
use crate::vocab::Phase;
use crate::worker::attrs::rank_attr;
use crate::worker::event::Request;
use crate::worker::open::OpenSteps;
use crate::worker::requests::RequestGauges;
use opentelemetry::KeyValue;
use opentelemetry::metrics::{
    BoundHistogram, Counter, Histogram, Meter, ObservableCounter, ObservableGauge,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The contract's instruments, created once.
pub(crate) struct Instruments {
    section: Histogram<f64>,
    step: Histogram<f64>,
    steps: Counter<u64>,
    wait: Histogram<f64>,
    /// The per-layer distributions (exponential on every provider: see `export::views`), on
    /// the meter `export::build` chose for this provider; none where nothing exports them.
    section_layer: Option<Histogram<f64>>,
    wait_layer: Option<Histogram<f64>>,
    /// Set when only the protobuf scrape reads the distributions (the endpoint's native
    /// provider): recorded from its first protobuf scrape on, as the twins, so that a process
    /// scraped as text (or not at all) never pays for them.
    layer_wanted: Option<Arc<AtomicBool>>,
    /// Base-2 exponential twins of the explicit-bucket duration histograms, on the meter
    /// whose reader only the protobuf scrape reads (see `with_native_twins`); none where
    /// nothing serves them.
    twins: Option<Box<Twins>>,
    step_wait: Histogram<f64>,
    /// The expert-load instruments (`PHASETRACE_EXPERT_COUNTER=on`), registered callbacks.
    _expert_tokens: Option<ObservableCounter<u64>>,
    _expert_gauges: Vec<ObservableGauge<f64>>,
    dropped: Counter<u64>,
    phase: Histogram<f64>,
    part: Histogram<f64>,
    rounds: Counter<u64>,
    draft_tokens: Counter<u64>,
    accepted_tokens: Counter<u64>,
    accepted_length: Histogram<u64>,
    /// The per-layer observable counters: registered callbacks, kept with the instruments.
    _layer_counters: [ObservableCounter<f64>; 2],
    _layer_calls: [ObservableCounter<u64>; 2],
    /// `phasetrace.step.open_duration`, read from the lanes' open steps at each collection.
    _open_duration: ObservableGauge<f64>,
    /// Gates every callback above (and the expert and request gauges').
    attachment: Attachment,
    /// The request instruments (`with_requests`).
    requests: Option<Box<RequestInstruments>>,
    /// The serving engine's state and the step tokens (`with_engine`).
    engine: Option<Box<super::engine::EngineInstruments>>,
    /// `group` on every series: shared, so that cloning it per record never allocates.
    group: KeyValue,
    /// Whether `section` and `wait` record through bound handles: only where the meter is
    /// known to be the SDK's (the API's default `bind` hands out a handle that drops
    /// everything; see [`Bind`]).
    bind: Bind,
    /// The same for the meter of the per-layer distributions.
    bind_layers: Bind,
    /// Every measurement, for unit tests of the pipeline.
    #[cfg(test)]
    pub(crate) log: std::sync::Mutex<Vec<Measurement>>,
}

/// One recorded measurement: instrument name, attributes, value.
#[cfg(test)]
pub(crate) type Measurement = (&'static str, Vec<(String, String)>, f64);

/// The observable instruments of one meter provider: the per-layer time and call counters and
/// the open-step gauge, whose callbacks read the worker's tables while `attachment` holds.
struct Observed {
    layer_counters: [ObservableCounter<f64>; 2],
    layer_calls: [ObservableCounter<u64>; 2],
    open_duration: ObservableGauge<f64>,
}

impl Observed {
    fn new(
        meter: &Meter,
        layers: &Arc<LayerTotals>,
        open: &Arc<OpenSteps>,
        attachment: &Attachment,
    ) -> Observed {
        let time = |name: &'static str, waits: bool| {
            let a = attachment.clone();
            let l = a.hold(layers);
            meter
                .f64_observable_counter(name)
                .described()
                .with_callback(move |o| {
                    let Some(l) = a.read(&l) else {
                        return;
                    };
                    let obs = |kv: &[KeyValue], secs: f64, _: u64| o.observe(secs, kv);
                    if waits {
                        l.each_wait(obs)
                    } else {
                        l.each_section(obs)
                    }
                })
                .build()
        };
        let calls = |name: &'static str, waits: bool| {
            let a = attachment.clone();
            let l = a.hold(layers);
            meter
                .u64_observable_counter(name)
                .described()
                .with_callback(move |o| {
                    let Some(l) = a.read(&l) else {
                        return;
                    };
                    let obs = |kv: &[KeyValue], _: f64, n: u64| o.observe(n, kv);
                    if waits {
                        l.each_wait(obs)
                    } else {
                        l.each_section(obs)
                    }
                })
                .build()
        };
        let layer_counters = [
            time(metric::SECTION_LAYER_TIME, false),
            time(metric::COLLECTIVE_LAYER_WAIT_TIME, true),
        ];
        let layer_calls = [
            calls(metric::SECTION_LAYER_CALLS, false),
            calls(metric::COLLECTIVE_LAYER_WAIT_CALLS, true),
        ];
        let open_duration = {
            let a = attachment.clone();
            let open = a.hold(open);
            meter
                .f64_observable_gauge(metric::STEP_OPEN_DURATION)
                .described()
                .with_callback(move |o| {
                    if let Some(open) = a.read(&open) {
                        open.each(|kv, secs| o.observe(secs, kv))
                    }
                })
                .build()
        };
        Observed {
            layer_counters,
            layer_calls,
            open_duration,
        }
    }
}

impl Instruments {
    #[cfg(test)]
    fn note(&self, name: &'static str, kv: &[KeyValue], v: f64) {
        let attrs = kv
            .iter()
            .map(|k| (k.key.as_str().to_owned(), k.value.to_string()))
            .collect();
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name, attrs, v));
    }

    #[cfg(not(test))]
    #[inline]
    fn note(&self, _name: &'static str, _kv: &[KeyValue], _v: f64) {}

    /// The instruments of one meter provider; the per-layer counters read `layers`, which the
    /// worker sums once for all providers, and the open-duration gauge reads `open`.
    pub(crate) fn new(
        meter: &Meter,
        layers: &Arc<LayerTotals>,
        open: &Arc<OpenSteps>,
        k_max: u32,
        attachment: &Attachment,
    ) -> Instruments {
        let dur = |name: &'static str| {
            meter
                .f64_histogram(name)
                .described()
                .with_boundaries(metric::DURATION_BOUNDARIES.to_vec())
                .build()
        };
        let group = layers.group().clone();
        let Observed {
            layer_counters,
            layer_calls,
            open_duration,
        } = Observed::new(meter, layers, open, attachment);
        let dropped = meter
            .u64_counter(metric::RECORDS_DROPPED)
            .described()
            .build();
        // Every reason has a series from the start, so that `rate()` reads 0, not "no data".
        for reason in DropReason::ALL {
            dropped.add(
                0,
                &[KeyValue::new(attr::REASON, reason.as_str()), group.clone()],
            );
        }
        Instruments {
            section_layer: None,
            wait_layer: None,
            layer_wanted: None,
            twins: None,
            _layer_counters: layer_counters,
            _layer_calls: layer_calls,
            _open_duration: open_duration,
            attachment: attachment.clone(),
            section: dur(metric::SECTION_DURATION),
            step: dur(metric::STEP_DURATION),
            steps: meter.u64_counter(metric::STEPS).described().build(),
            wait: dur(metric::COLLECTIVE_WAIT),
            step_wait: dur(metric::STEP_COLLECTIVE_WAIT),
            _expert_tokens: None,
            _expert_gauges: Vec::new(),
            dropped,
            phase: dur(metric::SPEC_PHASE_DURATION),
            part: dur(metric::SPEC_VERIFY_PART_DURATION),
            rounds: meter.u64_counter(metric::SPEC_ROUNDS).described().build(),
            draft_tokens: meter
                .u64_counter(metric::SPEC_DRAFT_TOKENS)
                .described()
                .build(),
            accepted_tokens: meter
                .u64_counter(metric::SPEC_ACCEPTED_TOKENS)
                .described()
                .build(),
            accepted_length: meter
                .u64_histogram(metric::SPEC_ACCEPTED_LENGTH)
                .described()
                .with_boundaries((0..=k_max).map(f64::from).collect())
                .build(),
            requests: None,
            engine: None,
            group,
            bind: Bind::Unbound,
            bind_layers: Bind::Unbound,
            #[cfg(test)]
            log: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Whether the meter these instruments were created on is an SDK provider's (its
    /// sections and waits then record through bound handles); the default is
    /// [`Bind::Unbound`].
    pub(crate) fn with_bind(mut self, bind: Bind) -> Self {
        self.bind = bind;
        self
    }

    /// One section: `kv` from the series of `h` (its handles on these instruments).
    #[inline]
    pub(crate) fn section(&self, kv: &[KeyValue], secs: f64, h: &mut Handles) {
        self.note(metric::SECTION_DURATION, kv, secs);
        record(self.bind, &self.section, &mut h.plain, kv, secs);
        if let Some(t) = self.twins() {
            record(t.bind, &t.section, &mut h.twin, kv, secs);
        }
    }

    /// One rendezvous wait: `kv` from the series of `h`.
    #[inline]
    pub(crate) fn wait(&self, kv: &[KeyValue], secs: f64, h: &mut Handles) {
        self.note(metric::COLLECTIVE_WAIT, kv, secs);
        record(self.bind, &self.wait, &mut h.plain, kv, secs);
        if let Some(t) = self.twins() {
            record(t.bind, &t.wait, &mut h.twin, kv, secs);
        }
    }

    /// The per-layer distributions, created on `meter` (the provider's own, or the one that
    /// carries them to the Prometheus endpoint), `bind`: whether that meter is the SDK's;
    /// `None`: not recorded. `wanted`: for the endpoint's native provider, the flag its first
    /// protobuf scrape sets (recorded from then on); `None`: always recorded (exponential OTLP,
    /// the engine's provider).
    pub(crate) fn with_distributions(
        mut self,
        meter: Option<(&Meter, Bind)>,
        wanted: Option<&Arc<AtomicBool>>,
    ) -> Self {
        self.layer_wanted = wanted.cloned();
        self.bind_layers = meter.map_or(Bind::Unbound, |(_, b)| b);
        let meter = meter.map(|(m, _)| m);
        let dist =
            |meter: &Meter, name: &'static str| meter.f64_histogram(name).described().build();
        self.section_layer = meter.map(|m| dist(m, metric::SECTION_LAYER_DURATION));
        self.wait_layer = meter.map(|m| dist(m, metric::COLLECTIVE_LAYER_WAIT_DURATION));
        self
    }

    /// The exponential twins of the duration histograms, created on `meter` (a provider whose
    /// view makes them base-2 exponential and whose reader only the protobuf scrape reads):
    /// same names, units and descriptions, so that the encoder can merge each twin's data
    /// point into its classic one (one native + classic histogram per series, as Prometheus's
    /// client_golang writes them). `None`: not recorded.
    /// `wanted`: set by the endpoint at its first protobuf scrape; until then nothing asked for
    /// the twins and they cost the worker nothing but a relaxed load.
    pub(crate) fn with_native_twins(
        mut self,
        meter: Option<&Meter>,
        wanted: &Arc<AtomicBool>,
    ) -> Self {
        // The twins' meter is always one of phasetrace's own SDK providers.
        self.twins = meter.map(|m| Box::new(Twins::new(m, wanted.clone(), Bind::Bound)));
        self
    }

    /// The twins, once a protobuf scrape asked for them.
    #[inline]
    fn twins(&self) -> Option<&Twins> {
        self.twins
            .as_deref()
            .filter(|t| t.wanted.load(Ordering::Relaxed))
    }

    /// A per-layer distribution, when it exists and its reader wants it.
    #[inline]
    fn layer_histogram<'a>(&self, h: &'a Option<Histogram<f64>>) -> Option<&'a Histogram<f64>> {
        let wanted = self
            .layer_wanted
            .as_ref()
            .is_none_or(|w| w.load(Ordering::Relaxed));
        h.as_ref().filter(|_| wanted)
    }

    /// One section in `layer`: `kv` as for [`Instruments::section`], `layer` added.
    #[inline]
    pub(crate) fn section_layer(&self, kv: &[KeyValue], layer: u32, secs: f64, h: &mut Handles) {
        if let Some(i) = self.layer_histogram(&self.section_layer) {
            self.layer(metric::SECTION_LAYER_DURATION, i, kv, layer, secs, h);
        }
    }

    /// One rendezvous wait in `layer`: `kv` as for [`Instruments::wait`], `layer` added.
    #[inline]
    pub(crate) fn wait_layer(&self, kv: &[KeyValue], layer: u32, secs: f64, h: &mut Handles) {
        if let Some(i) = self.layer_histogram(&self.wait_layer) {
            self.layer(
                metric::COLLECTIVE_LAYER_WAIT_DURATION,
                i,
                kv,
                layer,
                secs,
                h,
            );
        }
    }

    /// One observation of `layer`'s distribution on `i`: through the series' handle of that
    /// layer where the meter binds and the layer has a slot, else by attributes.
    #[inline]
    fn layer(
        &self,
        #[cfg_attr(not(test), allow(unused_variables))] name: &'static str,
        i: &Histogram<f64>,
        kv: &[KeyValue],
        layer: u32,
        secs: f64,
        h: &mut Handles,
    ) {
        #[cfg(test)]
        with_layer(kv, layer, |kv| self.note(name, kv, secs));
        let slot = (self.bind_layers == Bind::Bound)
            .then(|| h.layer_slot(layer))
            .flatten();
        match slot {
            Some(Some(b)) => b.record(secs),
            Some(slot) => with_layer(kv, layer, |kv| {
                slot.insert(i.bind(kv)).record(secs);
            }),
            None => with_layer(kv, layer, |kv| i.record(secs, kv)),
        }
    }

    /// One decode step: its duration and the time it spent waiting at rendezvous probes.
    pub(crate) fn step(&self, kv: &[KeyValue], secs: f64, wait_secs: f64) {
        self.note(metric::STEP_DURATION, kv, secs);
        self.step.record(secs, kv);
        self.steps.add(1, kv);
        self.note(metric::STEP_COLLECTIVE_WAIT, kv, wait_secs);
        self.step_wait.record(wait_secs, kv);
        if let Some(t) = self.twins() {
            t.step.record(secs, kv);
            t.step_wait.record(wait_secs, kv);
        }
    }

    /// Registers the expert-load instruments on `meter` when the expert telemetry is on: they
    /// read `experts` at each collection (see [`super::experts`] for the series budget).
    pub(crate) fn with_experts(mut self, meter: &Meter, experts: &Arc<ExpertTotals>) -> Self {
        if !experts.settings.on {
            return self;
        }
        let a = self.attachment.clone();
        let e = a.hold(experts);
        self._expert_tokens = Some(
            meter
                .u64_observable_counter(metric::MOE_LAYER_TOKENS)
                .described()
                .with_callback(move |o| {
                    if let Some(e) = a.read(&e) {
                        e.each_layer_tokens(|kv, n| o.observe(n, kv))
                    }
                })
                .build(),
        );
        let gauge = |name: &'static str, which: u8| {
            let a = self.attachment.clone();
            let e = a.hold(experts);
            meter
                .f64_observable_gauge(name)
                .described()
                .with_callback(move |o| {
                    let Some(e) = a.read(&e) else {
                        return;
                    };
                    match which {
                        0 => e.each_imbalance(|kv, imb, _| o.observe(imb, kv)),
                        1 => e.each_imbalance(|kv, _, cv| o.observe(cv, kv)),
                        _ => e.each_hot(|kv, share| o.observe(share, kv)),
                    }
                })
                .build()
        };
        self._expert_gauges = vec![
            gauge(metric::MOE_IMBALANCE, 0),
            gauge(metric::MOE_LOAD_CV, 1),
            gauge(metric::MOE_HOT_EXPERT_SHARE, 2),
        ];
        self
    }

    /// Creates the request instruments on `meter`: the GenAI conventions' server histograms,
    /// the per-request ones, the batch size and the queue and in-flight gauges (which read
    /// `gauges` at each collection).
    pub(crate) fn with_requests(mut self, meter: &Meter, gauges: &Arc<RequestGauges>) -> Self {
        let hist = |name: &'static str, bounds: &[f64]| {
            meter
                .f64_histogram(name)
                .described()
                .with_boundaries(bounds.to_vec())
                .build()
        };
        let gauge = |name: &'static str, running: bool| {
            let a = self.attachment.clone();
            let g = a.hold(gauges);
            let group = self.group.clone();
            meter
                .u64_observable_gauge(name)
                .described()
                .with_callback(move |o| {
                    let Some(g) = a.read(&g) else {
                        return;
                    };
                    let v = if running { &g.running } else { &g.waiting };
                    o.observe(v.load(Ordering::Relaxed), std::slice::from_ref(&group));
                })
                .build()
        };
        self.requests = Some(Box::new(RequestInstruments {
            duration: hist(
                metric::GEN_AI_SERVER_REQUEST_DURATION,
                &metric::GEN_AI_REQUEST_DURATION_BOUNDARIES,
            ),
            ttft: hist(
                metric::GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
                &metric::GEN_AI_TTFT_BOUNDARIES,
            ),
            tpot: hist(
                metric::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
                &metric::GEN_AI_TPOT_BOUNDARIES,
            ),
            queue: hist(metric::REQUEST_QUEUE_TIME, &metric::GEN_AI_TTFT_BOUNDARIES),
            prefill: hist(
                metric::REQUEST_PREFILL_TIME,
                &metric::GEN_AI_TTFT_BOUNDARIES,
            ),
            decode: hist(
                metric::REQUEST_DECODE_TIME,
                &metric::GEN_AI_REQUEST_DURATION_BOUNDARIES,
            ),
            step_share: hist(
                metric::REQUEST_STEP_SHARE,
                &metric::GEN_AI_REQUEST_DURATION_BOUNDARIES,
            ),
            wait_share: hist(
                metric::REQUEST_COLLECTIVE_WAIT_SHARE,
                &metric::GEN_AI_TTFT_BOUNDARIES,
            ),
            phase_share: hist(
                metric::REQUEST_PHASE_SHARE,
                &metric::GEN_AI_REQUEST_DURATION_BOUNDARIES,
            ),
            accepted: meter
                .u64_histogram(metric::REQUEST_ACCEPTED_TOKENS)
                .described()
                .with_boundaries(metric::REQUEST_TOKEN_BOUNDARIES.to_vec())
                .build(),
            batch: meter
                .u64_histogram(metric::BATCH_SIZE)
                .described()
                .with_boundaries(metric::BATCH_SIZE_BOUNDARIES.to_vec())
                .build(),
            _gauges: [
                gauge(metric::REQUESTS_WAITING, false),
                gauge(metric::REQUESTS_RUNNING, true),
            ],
        }));
        self
    }

    /// A request ended: the GenAI histograms (time to first token and per output token for
    /// successful requests only, as the conventions say) and the per-request ones. `kv`: its
    /// GenAI attributes (`error.type` for a failed one).
    pub(crate) fn request(&self, r: &Request, kv: &[KeyValue]) {
        let Some(i) = self.requests.as_deref() else {
            return;
        };
        let secs = crate::worker::secs;
        self.note(
            metric::GEN_AI_SERVER_REQUEST_DURATION,
            kv,
            secs(r.duration_ns()),
        );
        i.duration.record(secs(r.duration_ns()), kv);
        let ok = r.finish.error_type().is_none();
        if ok {
            if let Some(t) = r.ttft_ns() {
                self.note(metric::GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, kv, secs(t));
                i.ttft.record(secs(t), kv);
            }
            if let Some(t) = r.tpot_ns() {
                self.note(metric::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, kv, secs(t));
                i.tpot.record(secs(t), kv);
            }
        }
        if let Some(q) = r.queue_ns() {
            self.note(metric::REQUEST_QUEUE_TIME, kv, secs(q));
            i.queue.record(secs(q), kv);
            i.step_share.record(secs(r.share_ns), kv);
            i.wait_share.record(secs(r.wait_share_ns), kv);
        }
        if let Some(p) = r.prefill_ns() {
            i.prefill.record(secs(p), kv);
        }
        if let Some(d) = r.decode_ns() {
            i.decode.record(secs(d), kv);
        }
        if let Some(shares) = &r.phase_share_ns {
            let mut with_phase = Vec::with_capacity(kv.len() + 1);
            for (phase, ns) in crate::vocab::Phase::ALL.iter().zip(shares) {
                with_phase.clear();
                with_phase.push(KeyValue::new(attr::PHASE, phase.as_str()));
                with_phase.extend_from_slice(kv);
                self.note(metric::REQUEST_PHASE_SHARE, &with_phase, secs(*ns));
                i.phase_share.record(secs(*ns), &with_phase);
            }
        }
        if r.drafted > 0 {
            self.note(metric::REQUEST_ACCEPTED_TOKENS, kv, r.accepted as f64);
            i.accepted.record(r.accepted, kv);
        }
    }

    /// A step of `kv`'s rank served `n` requests.
    pub(crate) fn batch(&self, kv: &[KeyValue], n: usize) {
        if let Some(i) = self.requests.as_deref() {
            self.note(metric::BATCH_SIZE, kv, n as f64);
            i.batch.record(n as u64, kv);
        }
    }

    /// Creates the serving engine's instruments on `meter`: its KV-cache, prefix-cache and
    /// preemption state (read from `state` at each collection) and the step tokens.
    pub(crate) fn with_engine(
        mut self,
        meter: &Meter,
        state: &Arc<crate::record::engine_state::EngineState>,
    ) -> Self {
        self.engine = Some(Box::new(super::engine::EngineInstruments::new(
            meter,
            &self.attachment,
            &self.group,
            state,
        )));
        self
    }

    /// A step of `kv`'s rank served `batch`: its tokens by prefill and decode.
    pub(crate) fn step_tokens(&self, kv: &[KeyValue], batch: &[crate::worker::event::BatchEntry]) {
        if let Some(e) = self.engine.as_deref() {
            e.step(kv, batch, |attrs, v| {
                self.note(metric::STEP_TOKENS, attrs, v)
            });
        }
    }

    /// Adds to `phasetrace.records.dropped`; called by the metrics sink's drop count only.
    pub(crate) fn dropped(&self, reason: DropReason, n: u64) {
        if n > 0 {
            let kv = [
                KeyValue::new(attr::REASON, reason.as_str()),
                self.group.clone(),
            ];
            self.note(metric::RECORDS_DROPPED, &kv, n as f64);
            self.dropped.add(n, &kv);
        }
    }

    pub(crate) fn phase(&self, phase: Phase, rank: u32, secs: f64) {
        let kv = [
            KeyValue::new(attr::PHASE, phase.as_str()),
            rank_attr(rank),
            self.group.clone(),
        ];
        self.note(metric::SPEC_PHASE_DURATION, &kv, secs);
        self.phase.record(secs, &kv);
        if let Some(t) = self.twins() {
            t.phase.record(secs, &kv);
        }
    }

    pub(crate) fn part(&self, part: &'static str, rank: u32, secs: f64) {
        let kv = [
            KeyValue::new(attr::PART, part),
            rank_attr(rank),
            self.group.clone(),
        ];
        self.note(metric::SPEC_VERIFY_PART_DURATION, &kv, secs);
        self.part.record(secs, &kv);
        if let Some(t) = self.twins() {
            t.part.record(secs, &kv);
        }
    }

    pub(crate) fn round(&self, rank: u32, k: u32, accepted: Option<u32>) {
        let kv = [rank_attr(rank), self.group.clone()];
        self.rounds.add(1, &kv);
        self.note(metric::SPEC_ROUNDS, &kv, 1.0);
        if let Some(a) = accepted {
            self.note(metric::SPEC_ACCEPTED_TOKENS, &kv, f64::from(a));
            self.draft_tokens.add(u64::from(k), &kv);
            self.accepted_tokens.add(u64::from(a), &kv);
            self.accepted_length.record(u64::from(a), &kv);
        }
    }
}

/// The request instruments ([`Instruments::with_requests`]).
struct RequestInstruments {
    duration: Histogram<f64>,
    ttft: Histogram<f64>,
    tpot: Histogram<f64>,
    queue: Histogram<f64>,
    prefill: Histogram<f64>,
    decode: Histogram<f64>,
    step_share: Histogram<f64>,
    wait_share: Histogram<f64>,
    phase_share: Histogram<f64>,
    accepted: Histogram<u64>,
    batch: Histogram<u64>,
    _gauges: [ObservableGauge<u64>; 2],
}

/// The explicit-bucket duration histograms' base-2 exponential twins (see
/// [`Instruments::with_native_twins`]).
struct Twins {
    /// Set once the endpoint served a protobuf scrape.
    wanted: Arc<AtomicBool>,
    bind: Bind,
    section: Histogram<f64>,
    step: Histogram<f64>,
    wait: Histogram<f64>,
    step_wait: Histogram<f64>,
    phase: Histogram<f64>,
    part: Histogram<f64>,
}

impl Twins {
    fn new(meter: &Meter, wanted: Arc<AtomicBool>, bind: Bind) -> Twins {
        let dur = |name: &'static str| meter.f64_histogram(name).described().build();
        Twins {
            wanted,
            bind,
            section: dur(metric::SECTION_DURATION),
            step: dur(metric::STEP_DURATION),
            wait: dur(metric::COLLECTIVE_WAIT),
            step_wait: dur(metric::STEP_COLLECTIVE_WAIT),
            phase: dur(metric::SPEC_PHASE_DURATION),
            part: dur(metric::SPEC_VERIFY_PART_DURATION),
        }
    }
}

/// `kv` (at most 4) and `layer`, on the stack: no allocation per measurement.
#[inline]
fn with_layer(kv: &[KeyValue], layer: u32, f: impl FnOnce(&[KeyValue])) {
    let l = KeyValue::new(attr::LAYER, i64::from(layer));
    // The section and wait attribute sets hold four keys (bucket or site, rank, group, ...):
    // a fifth would be cut here, so a new key must grow the array.
    debug_assert!(
        kv.len() <= 4,
        "with_layer takes at most 4 attributes: {kv:?}"
    );
    let n = kv.len().min(4);
    let all: [KeyValue; 5] = std::array::from_fn(|i| if i < n { kv[i].clone() } else { l.clone() });
    f(&all[..=n]);
}

/// Layers whose distribution a series keeps a bound handle for; higher layer indices (no
/// real model has them) are recorded by attributes.
const LAYER_HANDLES: u32 = super::layers::DENSE_LAYERS;

/// One series' bound handles on one provider's instruments: the duration histogram's, its
/// native twin's and, per layer, the distribution's.
///
/// Each is bound at the series' first record on that instrument, never before: a cumulative
/// reader exports every series the SDK holds, so a handle bound ahead would export an empty
/// series that was never recorded. Bound then, a handle meets the cardinality limit exactly
/// where an unbound record would: under it, its own series; at it, the SDK's
/// `otel.metric.overflow` series, which it keeps writing to. A handle keeps its series from
/// being evicted under delta temporality (phasetrace's own readers are cumulative).
#[derive(Default)]
pub(crate) struct Handles {
    plain: Option<BoundHistogram<f64>>,
    twin: Option<BoundHistogram<f64>>,
    /// Indexed by layer, grown to the highest layer seen (below [`LAYER_HANDLES`]).
    layers: Vec<Option<BoundHistogram<f64>>>,
}

impl Handles {
    /// The slot of `layer`'s handle; `None` above [`LAYER_HANDLES`].
    #[inline]
    fn layer_slot(&mut self, layer: u32) -> Option<&mut Option<BoundHistogram<f64>>> {
        if layer >= LAYER_HANDLES {
            return None;
        }
        let l = layer as usize;
        if self.layers.len() <= l {
            self.layers.resize_with(l + 1, || None);
        }
        self.layers.get_mut(l)
    }
}

/// One record on `i`: through `slot`'s handle (bound now on the first) where `bind` allows,
/// else by attributes.
#[inline]
fn record(
    bind: Bind,
    i: &Histogram<f64>,
    slot: &mut Option<BoundHistogram<f64>>,
    kv: &[KeyValue],
    secs: f64,
) {
    match (bind, slot) {
        (Bind::Bound, Some(b)) => b.record(secs),
        (Bind::Bound, slot) => slot.insert(i.bind(kv)).record(secs),
        (Bind::Unbound, _) => i.record(secs, kv),
    }
}

#[cfg(test)]
mod tests {
    use super::Attachment;
    use std::sync::Arc;

    #[test]
    fn a_detached_callback_reads_nothing_and_its_table_is_let_go() {
        let attachment = Attachment::default();
        let table = Arc::new(7u64);
        let weak = attachment.hold(&table);
        drop(table);
        // Kept while attached: after `shutdown()` the final totals are still read.
        assert_eq!(attachment.read(&weak).as_deref(), Some(&7));
        attachment.clone().detach();
        assert_eq!(attachment.read(&weak), None);
        assert!(weak.upgrade().is_none(), "the table is freed at the detach");
    }
}
