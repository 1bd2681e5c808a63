//! Pipeline tests against a scripted clock: known boundary times in, exact durations out.

use super::Pipeline;
use super::open::OpenSteps;
use super::sinks::Sinks;
use super::sinks::console::ConsoleSink;
use super::sinks::metrics::MetricsSink;
use super::sinks::metrics::aggregate::{Bind, Instruments};
use super::sinks::metrics::experts::{ExpertSettings, ExpertTotals};
use super::sinks::metrics::layers::LayerTotals;
use super::sinks::spans::SpanSink;
use crate::config::{SectionLevel, SpecLevel};
use crate::names::DropReason;
use crate::record::{Gate, Recorder, RecorderOptions, Shared};
use crate::timing::{Clock, Resolved, Token};
use crate::vocab::{Phase, Section, Site, VerifyPart};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU16};
use std::sync::{Arc, Mutex};

/// Hands out the scripted times in order (nanoseconds); a deferred clock when `pending` is set.
struct Script {
    times: Mutex<VecDeque<u64>>,
    hold: AtomicBool,
}

impl Script {
    fn new(times: &[u64]) -> Arc<Script> {
        Arc::new(Script {
            times: Mutex::new(times.iter().copied().collect()),
            hold: AtomicBool::new(false),
        })
    }
}

impl Clock for Script {
    fn mark(&self) -> Option<Token> {
        self.times.lock().unwrap().pop_front().map(Token)
    }
    fn resolve(&self, t: Token) -> Resolved {
        if self.hold.load(std::sync::atomic::Ordering::Relaxed) {
            Resolved::Pending
        } else {
            Resolved::At(t.0)
        }
    }
    fn is_deferred(&self) -> bool {
        true
    }
    fn timing(&self) -> crate::config::Timing {
        crate::config::Timing::Events
    }
}

/// A stream that runs work in order on the [`crate::timing::now_ns`] timeline and its event
/// clock, for the tests of graph replays and of a stuck stream: the smallest model of what
/// `phasetrace-sim`'s simulated stream does (that crate links the library as a user does, so a
/// unit test here cannot use it). `enqueue` schedules work without waiting; an event completes
/// when the timeline passes the point where it was recorded; a capture collects work and
/// captured marks, and every launch re-records the captured events.
#[derive(Default)]
struct Device {
    state: Mutex<DeviceState>,
}

#[derive(Default)]
struct DeviceState {
    /// Where everything enqueued so far ends (ns).
    cursor: u64,
    /// Each event's latest record (ns); `u64::MAX` until the first launch of a captured one.
    events: Vec<u64>,
    capture: Option<Vec<DeviceOp>>,
}

#[derive(Clone, Copy)]
enum DeviceOp {
    Work(u64),
    Record(usize),
}

impl DeviceState {
    fn push(&mut self, ns: u64) -> u64 {
        self.cursor = self.cursor.max(crate::timing::now_ns()) + ns;
        self.cursor
    }
}

impl Device {
    fn new() -> Arc<Device> {
        Arc::default()
    }
    fn enqueue(&self, d: std::time::Duration) {
        let ns = d.as_nanos() as u64;
        let mut st = self.state.lock().unwrap();
        match st.capture.as_mut() {
            Some(ops) => ops.push(DeviceOp::Work(ns)),
            None => {
                st.push(ns);
            }
        }
    }
    fn begin_capture(&self) {
        self.state.lock().unwrap().capture = Some(Vec::new());
    }
    fn end_capture(&self) -> Vec<DeviceOp> {
        self.state
            .lock()
            .unwrap()
            .capture
            .take()
            .unwrap_or_default()
    }
    fn launch(&self, graph: &[DeviceOp]) {
        let mut st = self.state.lock().unwrap();
        for op in graph {
            match *op {
                DeviceOp::Work(ns) => {
                    st.push(ns);
                }
                DeviceOp::Record(i) => st.events[i] = st.push(0),
            }
        }
    }
    fn synchronize(&self) {
        let end = self.state.lock().unwrap().cursor;
        while crate::timing::now_ns() < end {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

impl Clock for Device {
    fn mark(&self) -> Option<Token> {
        let mut st = self.state.lock().unwrap();
        if st.capture.is_some() {
            return None;
        }
        let at = st.push(0);
        st.events.push(at);
        Some(Token(st.events.len() as u64 - 1))
    }
    fn mark_captured(&self) -> Option<Token> {
        let mut st = self.state.lock().unwrap();
        let i = st.events.len();
        st.capture.as_mut()?.push(DeviceOp::Record(i));
        st.events.push(u64::MAX);
        Some(Token(i as u64))
    }
    fn resolve(&self, t: Token) -> Resolved {
        match self.state.lock().unwrap().events.get(t.0 as usize) {
            None => Resolved::Failed,
            Some(&at) if at != u64::MAX && crate::timing::now_ns() >= at => Resolved::At(at),
            Some(_) => Resolved::Pending,
        }
    }
    fn is_deferred(&self) -> bool {
        true
    }
    fn timing(&self) -> crate::config::Timing {
        crate::config::Timing::Events
    }
}

fn setup(level: SectionLevel, spec: SpecLevel, clock: Arc<dyn Clock>) -> (Arc<Shared>, Pipeline) {
    let shared = Arc::new(Shared {
        level: Gate::new(level),
        spec_level: Gate::new(spec),
        sampling: crate::record::Sampling::default(),
        queue: 1024,
        rank: 3,
        clock,
        lanes: Mutex::new(Vec::new()),
        next_lane: AtomicU16::new(1),
        graph_read_every: 1,
        graphs: Default::default(),
        kinds: Default::default(),
        spec_off_hint: AtomicBool::new(false),
        engine: Default::default(),
    });
    let experts = ExpertSettings {
        on: true,
        ..ExpertSettings::off()
    };
    let p = untraced(&shared, true, experts);
    (shared, p)
}

/// The pipeline of `shared` with one meter provider's instruments (read by [`values`]), the
/// expert load by `experts`, and a tracer, its span counts, tail rule and exemplar store when
/// given.
fn pipeline(
    shared: &Arc<Shared>,
    experts: ExpertSettings,
    layer_attr: bool,
    tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
    counts: Arc<crate::export::SpanCounts>,
    tail: super::sinks::spans::tail::Tail,
    store: Option<Arc<crate::export::ExemplarStore>>,
) -> Pipeline {
    let provider = SdkMeterProvider::builder().build();
    let layers = LayerTotals::new("tp0", layer_attr, crate::config::LayerRanks::All);
    let open = OpenSteps::new(layers.group().clone());
    let meter = provider.meter("test");
    let inst = Instruments::new(&meter, &layers, &open, 8, &Default::default())
        .with_bind(Bind::Bound)
        .with_distributions(Some((&meter, Bind::Bound)), None)
        .with_requests(&meter, &Arc::default());
    let sinks = Sinks {
        spans: SpanSink::new(
            tracer.map(|t| Arc::new(opentelemetry::global::BoxedTracer::new(Box::new(t)))),
            counts,
            tail,
            store,
            layers.group().clone(),
        ),
        metrics: MetricsSink::new(vec![inst], layers, ExpertTotals::new(experts, "tp0")),
        console: ConsoleSink::new(0, 0),
    };
    let requests = super::requests::Requests::for_tests(shared.clone(), sinks.spans.hold().sampled);
    Pipeline::new(shared.clone(), open, sinks, requests)
}

/// [`pipeline`] without spans.
fn untraced(shared: &Arc<Shared>, layer_attr: bool, experts: ExpertSettings) -> Pipeline {
    pipeline(
        shared,
        experts,
        layer_attr,
        None,
        Default::default(),
        super::sinks::spans::tail::Tail::new(crate::config::TraceSlowerThan::Off, 1),
        None,
    )
}

fn rec(shared: &Arc<Shared>) -> Recorder {
    Recorder::new(shared.clone(), RecorderOptions::new())
}

/// (value, attributes) of every measurement of `name`.
fn values(p: &Pipeline, name: &str) -> Vec<(f64, Vec<(String, String)>)> {
    p.sinks.metrics.instruments()[0]
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|m| m.0 == name)
        .map(|m| (m.2, m.1.clone()))
        .collect()
}

/// (seconds, attributes) of every per-layer total: waits, or sections.
fn layer_values(p: &Pipeline, waits: bool) -> Vec<(f64, Vec<(String, String)>)> {
    let mut v = Vec::new();
    let mut f = |kv: &[opentelemetry::KeyValue], secs: f64, _calls: u64| {
        let a = kv
            .iter()
            .map(|k| (k.key.as_str().to_owned(), k.value.to_string()))
            .collect();
        v.push((secs, a));
    };
    if waits {
        p.sinks.metrics.layers().each_wait(&mut f);
    } else {
        p.sinks.metrics.layers().each_section(&mut f);
    }
    v
}

fn attr<'a>(a: &'a [(String, String)], k: &str) -> Option<&'a str> {
    a.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
}

const US: u64 = 1_000;

#[test]
fn nested_sections_pair_into_exact_durations() {
    // step [0, 1000us]: kda_mixer [100, 700] with kda_front [150, 250] and kda_recur [300, 600].
    let clock = Script::new(&[
        0,
        100 * US,
        150 * US,
        250 * US,
        300 * US,
        600 * US,
        700 * US,
        1000 * US,
    ]);
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, clock);
    let r = rec(&shared);
    {
        let _step = r.step();
        let _m = r.section(Section::KDA_MIXER, 12u32, Site::ATTN);
        {
            let _f = r.section(Section::KDA_FRONT, 12u32, Site::ATTN);
        }
        let _c = r.section(Section::KDA_RECUR, 12u32, Site::ATTN);
    }
    p.flush();
    let v = values(&p, crate::names::metric::SECTION_DURATION);
    let got: Vec<(String, f64)> = v
        .iter()
        .map(|(x, a)| (attr(a, "bucket").unwrap().to_owned(), (x * 1e6).round()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("kda_front".into(), 100.0),
            ("kda_recur".into(), 300.0),
            ("kda_mixer".into(), 600.0)
        ]
    );
    let a = &v[0].1;
    assert_eq!(attr(a, "layer"), None, "the histogram has no layer");
    assert_eq!(attr(a, "site"), Some("attn"));
    assert_eq!(attr(a, "rank"), Some("3"));
    let per_layer = layer_values(&p, false);
    assert_eq!(per_layer.len(), 3);
    assert_eq!(attr(&per_layer[0].1, "layer"), Some("12"));
    assert_eq!(attr(&per_layer[0].1, "bucket"), Some("kda_front"));
    assert_eq!((per_layer[0].0 * 1e6).round(), 100.0);
    let steps = values(&p, crate::names::metric::STEP_DURATION);
    assert_eq!(steps.len(), 1);
    assert_eq!((steps[0].0 * 1e6).round(), 1000.0);
    assert_eq!(p.stats().sections, 3);
    assert_eq!(p.stats().dropped[DropReason::Unbalanced], 0);
}

#[test]
fn probes_feed_the_wait_histogram_and_level_two_records_only_collectives() {
    let clock = Script::new(&[0, 30 * US, 40 * US, 90 * US]);
    let (shared, mut p) = setup(SectionLevel::Collectives, SpecLevel::Off, clock);
    let r = rec(&shared);
    {
        let _s = r.section(Section::MOE_EXPERTS, 1u32, Site::MLP); // not recorded at level 2
    }
    {
        let _b = r.section(Section::REDUCE_MLP_BAR, 1u32, Site::MLP);
    }
    {
        let _b = r.section(Section::REDUCE_MLP, 1u32, Site::MLP);
    }
    r.collective_wait(Site::ATTN, 2u32, std::time::Duration::from_micros(7));
    p.flush();
    let waits = values(&p, crate::names::metric::COLLECTIVE_WAIT);
    assert_eq!(waits.len(), 2);
    assert_eq!((waits[0].0 * 1e6).round(), 30.0);
    assert_eq!(attr(&waits[0].1, "site"), Some("mlp"));
    assert_eq!((waits[1].0 * 1e6).round(), 7.0);
    assert_eq!(attr(&waits[1].1, "layer"), None);
    let per_layer = layer_values(&p, true);
    assert_eq!(attr(&per_layer[1].1, "layer"), Some("2"));
    assert_eq!((per_layer[1].0 * 1e6).round(), 7.0);
    let buckets: Vec<_> = values(&p, crate::names::metric::SECTION_DURATION)
        .into_iter()
        .map(|(_, a)| attr(&a, "bucket").unwrap().to_owned())
        .collect();
    assert_eq!(buckets, ["reduce_mlp_bar", "reduce_mlp"]);
}

#[test]
fn unbalanced_marks_are_counted_not_fatal() {
    let clock = Script::new(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, clock);
    let r = rec(&shared);
    r.end_section(Section::NORM); // end without begin
    r.begin_section(Section::KDA_MIXER, 0u32, Site::ATTN);
    r.begin_section(Section::KDA_FRONT, 0u32, Site::ATTN);
    r.end_section(Section::KDA_MIXER); // closes mixer, front never ended
    p.flush();
    assert_eq!(p.stats().dropped[DropReason::Unbalanced], 2);
    assert_eq!(p.stats().sections, 1);
    let dropped = values(&p, crate::names::metric::RECORDS_DROPPED);
    assert_eq!(dropped.iter().map(|d| d.0).sum::<f64>(), 2.0);
}

#[test]
fn pending_tokens_hold_the_lane_until_resolved() {
    let clock = Script::new(&[0, 500 * US]);
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, clock.clone());
    let r = rec(&shared);
    clock.hold.store(true, std::sync::atomic::Ordering::Relaxed);
    {
        let _s = r.section(Section::NORM, 0u32, Site::NONE);
    }
    p.flush();
    assert_eq!(p.stats().sections, 0);
    clock
        .hold
        .store(false, std::sync::atomic::Ordering::Relaxed);
    p.flush();
    assert_eq!(p.stats().sections, 1);
}

#[test]
fn a_full_buffer_drops_and_counts() {
    let times: Vec<u64> = (0..3000).collect();
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, Script::new(&times));
    let r = rec(&shared);
    for _ in 0..1000 {
        let _s = r.section(Section::NORM, 0u32, Site::NONE);
    }
    p.flush();
    let s = p.stats();
    // 1024 marks fit: 512 begin/end pairs; every refused begin skips its end.
    assert_eq!(s.sections, 512);
    assert_eq!(s.dropped[DropReason::QueueFull], 1000 - 512);
    assert_eq!(s.dropped[DropReason::Unbalanced], 0);
}

#[test]
fn phases_take_the_time_since_the_previous_mark_and_skipped_phases_are_absent() {
    // round [0, 1000]: draft ends 200, verify ends 900, maint ends 1000 (accept, rollback skipped)
    let clock = Script::new(&[0, 200 * US, 900 * US, 1000 * US, 1000 * US]);
    let (shared, mut p) = setup(SectionLevel::Off, SpecLevel::Phases, clock);
    let r = rec(&shared);
    let round = r.round(4);
    round.phase(Phase::Draft);
    round.phase(Phase::Verify);
    round.phase(Phase::Maint);
    round.end(3);
    p.flush();
    let ph: Vec<(String, f64)> = values(&p, crate::names::metric::SPEC_PHASE_DURATION)
        .iter()
        .map(|(v, a)| (attr(a, "phase").unwrap().to_owned(), (v * 1e6).round()))
        .collect();
    assert_eq!(
        ph,
        vec![
            ("draft".into(), 200.0),
            ("verify".into(), 700.0),
            ("maint".into(), 100.0)
        ]
    );
    assert_eq!(values(&p, crate::names::metric::SPEC_ROUNDS).len(), 1);
    let acc = values(&p, crate::names::metric::SPEC_ACCEPTED_TOKENS);
    assert_eq!(acc[0].0, 3.0);
    assert!(values(&p, crate::names::metric::SPEC_VERIFY_PART_DURATION).is_empty());
}

#[test]
fn a_round_ended_without_marks_counts_the_round_and_no_phase() {
    let clock = Script::new(&[0, 50 * US]);
    let (shared, mut p) = setup(SectionLevel::Off, SpecLevel::Phases, clock);
    let r = rec(&shared);
    r.round(2).end(0);
    p.flush();
    assert!(values(&p, crate::names::metric::SPEC_PHASE_DURATION).is_empty());
    assert_eq!(values(&p, crate::names::metric::SPEC_ROUNDS).len(), 1);
    assert_eq!(p.stats().rounds, 1);
}

#[test]
fn level_two_splits_verify_into_parts_with_rest_as_the_remainder() {
    // round 0..; draft ends 100; verify walk: kda [100,300] with scan [150,250], mla [300,450],
    // ffn [450,700]; verify ends 800 -> rest = 700 - 200 - 150 = 350, ffn reported inside it.
    let clock = Script::new(&[
        0,
        100 * US,
        100 * US,
        150 * US,
        250 * US,
        300 * US,
        300 * US,
        450 * US,
        450 * US,
        700 * US,
        800 * US,
        800 * US,
    ]);
    let (shared, mut p) = setup(SectionLevel::Off, SpecLevel::VerifySplit, clock);
    let r = rec(&shared);
    let other = rec(&shared); // a second thread of the same round
    let round = r.round(4);
    round.phase(Phase::Draft);
    {
        let _k = r.verify_part(round.as_ref(), VerifyPart::Kda);
        let _s = r.verify_part(round.as_ref(), VerifyPart::KdaScan);
    }
    {
        let _m = other.verify_part(round.as_ref(), VerifyPart::Mla);
    }
    {
        let _f = other.verify_part(round.as_ref(), VerifyPart::Ffn);
    }
    round.phase(Phase::Verify);
    round.end(2);
    p.flush();
    let parts: Vec<(String, f64)> = values(&p, crate::names::metric::SPEC_VERIFY_PART_DURATION)
        .iter()
        .map(|(v, a)| (attr(a, "part").unwrap().to_owned(), (v * 1e6).round()))
        .collect();
    assert_eq!(
        parts,
        vec![
            ("kda".into(), 200.0),
            ("kda_scan".into(), 100.0),
            ("mla".into(), 150.0),
            ("ffn".into(), 250.0),
            ("rest".into(), 350.0)
        ]
    );
}

#[test]
fn a_verify_part_never_timed_is_not_exported() {
    // Two rounds that time kda only: mla, ffn and kda_scan have no series (not two zeros).
    let clock = Script::new(&[
        0,
        100 * US,
        100 * US,
        300 * US,
        400 * US,
        400 * US,
        400 * US,
        500 * US,
        500 * US,
        600 * US,
        700 * US,
        700 * US,
    ]);
    let (shared, mut p) = setup(SectionLevel::Off, SpecLevel::VerifySplit, clock);
    let r = rec(&shared);
    for _ in 0..2 {
        let round = r.round(4);
        round.phase(Phase::Draft);
        {
            let _k = r.verify_part(round.as_ref(), VerifyPart::Kda);
        }
        round.phase(Phase::Verify);
        round.end(2);
    }
    p.flush();
    let mut parts: Vec<String> = values(&p, crate::names::metric::SPEC_VERIFY_PART_DURATION)
        .iter()
        .map(|(_, a)| attr(a, "part").unwrap().to_owned())
        .collect();
    parts.sort();
    assert_eq!(parts, ["kda", "kda", "rest", "rest"]);
}

#[test]
fn concurrent_sessions_do_not_mix_their_rounds() {
    let c1 = Script::new(&[0, 100 * US, 110 * US, 160 * US, 400 * US, 400 * US]);
    let c2 = Script::new(&[0, 300 * US, 310 * US, 330 * US, 900 * US, 900 * US]);
    let (shared, mut p) = setup(SectionLevel::Off, SpecLevel::VerifySplit, Script::new(&[]));
    let a = Recorder::new(shared.clone(), RecorderOptions::new().clock(c1));
    let b = Recorder::new(shared.clone(), RecorderOptions::new().clock(c2));
    let ra = a.round(2);
    let rb = b.round(2);
    ra.phase(Phase::Draft);
    rb.phase(Phase::Draft);
    {
        let _k = a.verify_part(ra.as_ref(), VerifyPart::Kda);
    }
    {
        let _k = b.verify_part(rb.as_ref(), VerifyPart::Kda);
    }
    ra.phase(Phase::Verify);
    rb.phase(Phase::Verify);
    ra.end(1);
    rb.end(2);
    p.flush();
    let kda: Vec<f64> = values(&p, crate::names::metric::SPEC_VERIFY_PART_DURATION)
        .iter()
        .filter(|(_, a)| attr(a, "part") == Some("kda"))
        .map(|(v, _)| (v * 1e6).round())
        .collect();
    assert_eq!(kda, vec![50.0, 20.0]);
}

#[test]
fn routed_experts_are_counted_per_layer_and_expert_and_huge_ids_dropped() {
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, Script::new(&[0, 1]));
    let r = rec(&shared);
    r.moe_route(5u32, &[3, 17, 3, 70_000, 42, 9, 3]);
    p.flush();
    let load = p.sinks.metrics.experts().snapshot();
    let layer = load.layer(3, 5).expect("layer 5 routed at rank 3");
    assert_eq!(layer.tokens[3], 3);
    assert_eq!(layer.total(), 6, "six ids fit a record");
    assert_eq!(
        p.stats().dropped[DropReason::OutOfRange],
        1,
        "70000 does not fit 16 bits"
    );
}

#[test]
fn layer_attribution_off_drops_only_the_layer_attribute() {
    let shared = Arc::new(Shared {
        level: Gate::new(SectionLevel::Full),
        spec_level: Gate::new(SpecLevel::Off),
        sampling: crate::record::Sampling::default(),
        queue: 64,
        rank: 0,
        clock: Script::new(&[0, 10, 20, 30]),
        lanes: Mutex::new(Vec::new()),
        next_lane: AtomicU16::new(1),
        graph_read_every: 1,
        graphs: Default::default(),
        kinds: Default::default(),
        spec_off_hint: AtomicBool::new(false),
        engine: Default::default(),
    });
    let mut p = untraced(&shared, false, ExpertSettings::off());
    let r = rec(&shared);
    {
        let _s = r.section(Section::REDUCE_ATTN_BAR, 7u32, Site::ATTN);
    }
    p.flush();
    let section = values(&p, crate::names::metric::SECTION_DURATION);
    assert_eq!(attr(&section[0].1, "layer"), None);
    assert_eq!(attr(&section[0].1, "bucket"), Some("reduce_attn_bar"));
    // The wait histogram has no layer (the per-layer totals are counters); the per-step wait
    // total, which the straggler alert reads, never had one.
    let wait = values(&p, crate::names::metric::COLLECTIVE_WAIT);
    assert_eq!(attr(&wait[0].1, "layer"), None);
    assert_eq!(attr(&wait[0].1, "site"), Some("attn"));
    assert!(layer_values(&p, false).is_empty());
    let wait = layer_values(&p, true);
    assert_eq!(
        attr(&wait[0].1, "layer"),
        Some("7"),
        "the per-layer waits keep their layer"
    );
    // The per-layer distributions follow: sections' off, waits' kept.
    use crate::names::metric::{COLLECTIVE_LAYER_WAIT_DURATION, SECTION_LAYER_DURATION};
    assert!(values(&p, SECTION_LAYER_DURATION).is_empty());
    let wait = values(&p, COLLECTIVE_LAYER_WAIT_DURATION);
    assert_eq!(wait.len(), 1);
    assert_eq!(attr(&wait[0].1, "layer"), Some("7"));
}

#[test]
fn each_section_and_wait_in_a_layer_is_one_observation_of_its_layers_distribution() {
    let clock = Script::new(&[0, 10 * US, 20 * US, 50 * US, 60 * US, 70 * US]);
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, clock);
    let r = rec(&shared);
    {
        let _step = r.step();
        {
            let _b = r.section(Section::REDUCE_ATTN_BAR, 5u32, Site::ATTN);
        }
        let _c = r.section(Section::KDA_MIXER, crate::vocab::Layer::NONE, Site::ATTN);
    }
    p.flush();
    use crate::names::metric::{
        COLLECTIVE_LAYER_WAIT_DURATION, COLLECTIVE_WAIT, SECTION_DURATION, SECTION_LAYER_DURATION,
    };
    let sections = values(&p, SECTION_DURATION);
    let by_layer = values(&p, SECTION_LAYER_DURATION);
    // One per section that has a layer, with the section's value and attributes plus `layer`.
    assert_eq!(by_layer.len(), 1, "{by_layer:?}");
    let (v, a) = &by_layer[0];
    let same = sections
        .iter()
        .find(|(_, s)| attr(s, "bucket") == attr(a, "bucket"))
        .expect("the section");
    assert_eq!(*v, same.0);
    assert_eq!(attr(a, "layer"), Some("5"));
    for k in ["bucket", "site", "rank", "group"] {
        assert_eq!(attr(a, k), attr(&same.1, k), "{k}");
    }
    let waits = values(&p, COLLECTIVE_WAIT);
    let wait_by_layer = values(&p, COLLECTIVE_LAYER_WAIT_DURATION);
    assert_eq!(wait_by_layer.len(), 1, "{wait_by_layer:?}");
    assert_eq!(wait_by_layer[0].0, waits[0].0);
    assert_eq!(attr(&wait_by_layer[0].1, "layer"), Some("5"));
}

#[test]
fn each_step_records_its_total_rendezvous_wait_beside_its_duration() {
    // step 1 [0, 1000us]: attn probe [100, 400] (300 us), a compute section [400, 500], mlp
    // probe [500, 550] (50 us), plus a reported wait of 25 us. step 2 [2000, 2100]: no probe.
    let clock = Script::new(&[
        0,
        100 * US,
        400 * US,
        400 * US,
        500 * US,
        500 * US,
        550 * US,
        1000 * US,
        2000 * US,
        2100 * US,
    ]);
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, clock);
    let r = rec(&shared);
    {
        let _step = r.step();
        {
            let _b = r.section(Section::REDUCE_ATTN_BAR, 0u32, Site::ATTN);
        }
        {
            let _c = r.section(Section::MOE_EXPERTS, 0u32, Site::MLP);
        }
        {
            let _b = r.section(Section::REDUCE_MLP_BAR, 0u32, Site::MLP);
        }
        r.collective_wait(Site::MLP, 1u32, std::time::Duration::from_micros(25));
    }
    {
        let _step = r.step();
    }
    p.flush();
    let waits = values(&p, crate::names::metric::STEP_COLLECTIVE_WAIT);
    let got: Vec<f64> = waits.iter().map(|(v, _)| (v * 1e6).round()).collect();
    // The step without a probe records a zero wait: the count is the step count, so the wait
    // share (wait sum / step duration sum) is never biased by the steps that did not wait.
    assert_eq!(got, vec![375.0, 0.0]);
    for (_, a) in &waits {
        assert_eq!(attr(a, "rank"), Some("3"));
        assert_eq!(attr(a, "group"), Some("tp0"));
        assert_eq!(attr(a, "layer"), None, "a per-step total has no layer");
        assert_eq!(attr(a, "site"), None);
    }
    assert_eq!(values(&p, crate::names::metric::STEP_DURATION).len(), 2);
}

#[test]
fn every_measurement_carries_the_group() {
    let clock = Script::new(&[0, 10 * US, 20 * US, 30 * US]);
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, clock);
    let r = rec(&shared);
    {
        let _step = r.step();
        let _b = r.section(Section::REDUCE_ATTN_BAR, 2u32, Site::ATTN);
    }
    r.moe_route(2u32, &[1, 2]);
    p.flush();
    // The expert-load series, read at collection.
    let mut expert_series = 0;
    p.sinks.metrics.experts().each_layer_tokens(|kv, _| {
        expert_series += 1;
        assert!(
            kv.contains(&opentelemetry::KeyValue::new("group", "tp0")),
            "{kv:?}"
        );
    });
    assert_eq!(expert_series, 1);
    let log = p.sinks.metrics.instruments()[0].log.lock().unwrap();
    assert!(log.len() >= 3, "{log:?}");
    for (name, a, _) in log.iter() {
        assert_eq!(
            attr(a, "group"),
            Some("tp0"),
            "{name} without its group: {a:?}"
        );
    }
}

/// Spans as the exporter got them, and whether exports succeed.
#[derive(Debug, Default)]
struct Capture {
    spans: Mutex<Vec<opentelemetry_sdk::trace::SpanData>>,
    fail: AtomicBool,
}

#[derive(Debug)]
struct CaptureExporter(Arc<Capture>);

impl opentelemetry_sdk::trace::SpanExporter for CaptureExporter {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        if self.0.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                "collector down".into(),
            ));
        }
        self.0.spans.lock().unwrap().extend(batch);
        Ok(())
    }
}

struct Traced {
    shared: Arc<Shared>,
    p: Pipeline,
    capture: Arc<Capture>,
    store: Arc<crate::export::ExemplarStore>,
    _provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

/// A pipeline with a tracer whose spans are exported at once (through the exporter wrapper that
/// settles exemplars), tail sampling by `rule`, and one step in `trace_every` head-sampled.
fn traced(
    clock: Arc<dyn Clock>,
    trace_every: u64,
    rule: crate::config::TraceSlowerThan,
    budget: u32,
) -> Traced {
    use opentelemetry::trace::TracerProvider as _;
    let shared = Arc::new(Shared {
        level: Gate::new(SectionLevel::Full),
        spec_level: Gate::new(SpecLevel::Off),
        sampling: crate::record::Sampling::new(
            trace_every,
            rule != crate::config::TraceSlowerThan::Off,
        ),
        queue: 1 << 16,
        rank: 3,
        clock,
        lanes: Mutex::new(Vec::new()),
        next_lane: AtomicU16::new(1),
        kinds: Default::default(),
        spec_off_hint: AtomicBool::new(false),
        graph_read_every: 1,
        graphs: Default::default(),
        engine: Default::default(),
    });
    let capture = Arc::new(Capture::default());
    let store = Arc::new(crate::export::ExemplarStore::default());
    let counts: Arc<crate::export::SpanCounts> = Default::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(crate::export::Counted::new(
            CaptureExporter(capture.clone()),
            counts.clone(),
            Some(store.clone()),
        ))
        .build();
    let p = pipeline(
        &shared,
        ExpertSettings::off(),
        true,
        Some(provider.tracer("test")),
        counts,
        super::sinks::spans::tail::Tail::new(rule, budget),
        Some(store.clone()),
    );
    Traced {
        shared,
        p,
        capture,
        store,
        _provider: provider,
    }
}

/// Scripted times of `steps.len()` steps, each one section (`kda_mixer`) inside: step i begins
/// at `i * gap` and lasts `steps[i]` ns, its section from +10 ns to 10 ns before its end.
fn step_times(steps: &[u64], gap: u64) -> Vec<u64> {
    steps
        .iter()
        .enumerate()
        .flat_map(|(i, &d)| {
            let t = i as u64 * gap;
            [t, t + 10, t + d - 10, t + d]
        })
        .collect()
}

fn run_steps(t: &Traced, n: usize) {
    let r = rec(&t.shared);
    for _ in 0..n {
        let _step = r.step();
        let _s = r.section(Section::KDA_MIXER, 2u32, Site::ATTN);
    }
}

fn step_spans(c: &Capture) -> Vec<(i64, String, opentelemetry::trace::TraceId)> {
    c.spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.name == crate::names::span::STEP)
        .map(|s| {
            let get = |k: &str| {
                s.attributes
                    .iter()
                    .find(|kv| kv.key.as_str() == k)
                    .map(|kv| kv.value.clone())
            };
            let step = match get(crate::names::attr::STEP) {
                Some(opentelemetry::Value::I64(v)) => v,
                other => panic!("step attribute {other:?}"),
            };
            let why = get(crate::names::attr::SAMPLED)
                .map(|v| v.to_string())
                .unwrap_or_default();
            (step, why, s.span_context.trace_id())
        })
        .collect()
}

#[test]
fn with_one_in_n_off_only_the_slow_steps_are_traced_in_full() {
    use crate::config::TraceSlowerThan;
    // Ten steps of 1 µs; steps 3 and 7 take 50 µs. Threshold 20 µs.
    let mut d = vec![US; 10];
    d[3] = 50 * US;
    d[7] = 50 * US;
    let t = traced(
        Script::new(&step_times(&d, 100 * US)),
        0,
        TraceSlowerThan::Duration(std::time::Duration::from_micros(20)),
        100,
    );
    let mut t = t;
    run_steps(&t, 10);
    t.p.flush();
    let steps = step_spans(&t.capture);
    let got: Vec<(i64, &str)> = steps.iter().map(|(s, w, _)| (*s, w.as_str())).collect();
    assert_eq!(got, vec![(3, "tail"), (7, "tail")]);
    // In full: each traced step has its layer and its section.
    let spans = t.capture.spans.lock().unwrap();
    for (_, _, trace) in &steps {
        let names: Vec<&str> = spans
            .iter()
            .filter(|s| s.span_context.trace_id() == *trace)
            .map(|s| s.name.as_ref())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(
            names.contains(&"kda_mixer") && names.contains(&"layer"),
            "{names:?}"
        );
    }
    drop(spans);
    let s = t.p.stats();
    assert_eq!(
        (s.steps, s.tail_traces, s.dropped[DropReason::TailBudget]),
        (10, 2, 0)
    );
}

#[test]
fn a_head_sampled_step_is_traced_once_and_a_slow_one_beside_it() {
    use crate::config::TraceSlowerThan;
    // One in 4 (steps 0, 4): step 4 is also slow, traced once as head; step 5 slow: tail.
    let mut d = vec![US; 8];
    d[4] = 50 * US;
    d[5] = 50 * US;
    let mut t = traced(
        Script::new(&step_times(&d, 100 * US)),
        4,
        TraceSlowerThan::Duration(std::time::Duration::from_micros(20)),
        100,
    );
    run_steps(&t, 8);
    t.p.flush();
    let got: Vec<(i64, String)> = step_spans(&t.capture)
        .into_iter()
        .map(|(s, w, _)| (s, w))
        .collect();
    assert_eq!(
        got,
        vec![(0, "head".into()), (4, "head".into()), (5, "tail".into())]
    );
}

#[test]
fn over_the_budget_slow_steps_are_counted_not_traced() {
    use crate::config::TraceSlowerThan;
    // 30 slow steps, one every 100 ms (3 s), budget 2 a second.
    let d = vec![50 * US; 30];
    let mut t = traced(
        Script::new(&step_times(&d, 100_000 * US)),
        0,
        TraceSlowerThan::Duration(std::time::Duration::from_micros(20)),
        2,
    );
    run_steps(&t, 30);
    t.p.flush();
    let steps = step_spans(&t.capture);
    assert_eq!(steps.len(), 6, "{steps:?}");
    let s = t.p.stats();
    assert_eq!((s.tail_traces, s.dropped[DropReason::TailBudget]), (6, 24));
    let dropped: f64 = values(&t.p, crate::names::metric::RECORDS_DROPPED)
        .iter()
        .filter(|(_, a)| attr(a, "reason") == Some("tail_budget"))
        .map(|(v, _)| v)
        .sum();
    assert_eq!(dropped, 24.0);
}

#[test]
fn exemplars_name_the_exported_trace_of_a_slow_step() {
    use crate::config::TraceSlowerThan;
    use crate::export::exemplars::bucket_of;
    use crate::names::metric;
    let mut d = vec![US; 4];
    d[2] = 3_000 * US; // 3 ms: the (2 ms, 5 ms] bucket
    let mut t = traced(
        Script::new(&step_times(&d, 10_000 * US)),
        0,
        TraceSlowerThan::Duration(std::time::Duration::from_millis(1)),
        100,
    );
    run_steps(&t, 4);
    t.p.flush();
    let steps = step_spans(&t.capture);
    assert_eq!(steps.len(), 1);
    let trace = steps[0].2;
    let b = t
        .store
        .series(metric::STEP_DURATION, &[("rank", "3"), ("group", "tp0")]);
    let i = bucket_of(0.003);
    let e = b[i].expect("an exemplar in the 5 ms bucket");
    assert_eq!(e.trace_id, trace);
    assert!((e.value - 0.003).abs() < 1e-12, "{e:?}");
    assert_eq!(b.iter().filter(|x| x.is_some()).count(), 1);
    // The section's exemplar points at the section's own span, in the same trace.
    let sb = t.store.series(
        metric::SECTION_DURATION,
        &[
            ("bucket", "kda_mixer"),
            ("group", "tp0"),
            ("rank", "3"),
            ("site", "attn"),
        ],
    );
    let se = sb[bucket_of(0.003 - 20e-9)].expect("a section exemplar");
    assert_eq!(se.trace_id, trace);
    let spans = t.capture.spans.lock().unwrap();
    let span = spans
        .iter()
        .find(|s| s.span_context.span_id() == se.span_id)
        .expect("the exemplar's span was exported");
    assert_eq!(span.name, "kda_mixer");
}

#[test]
fn a_trace_that_failed_to_export_leaves_no_exemplar() {
    use crate::config::TraceSlowerThan;
    use crate::names::metric;
    let d = vec![3_000 * US; 2];
    let mut t = traced(
        Script::new(&step_times(&d, 10_000 * US)),
        0,
        TraceSlowerThan::Duration(std::time::Duration::from_millis(1)),
        100,
    );
    t.capture
        .fail
        .store(true, std::sync::atomic::Ordering::Relaxed);
    run_steps(&t, 2);
    t.p.flush();
    assert_eq!(t.p.stats().tail_traces, 2);
    let b = t
        .store
        .series(metric::STEP_DURATION, &[("rank", "3"), ("group", "tp0")]);
    assert!(b.iter().all(Option::is_none), "{b:?}");
    assert!(!t.store.has_pending());
}

#[test]
fn sections_beyond_the_trace_bound_are_counted() {
    use crate::config::TraceSlowerThan;
    let n = super::pair::STEP_SPANS_MAX + 5;
    let mut times = vec![0u64];
    for i in 0..n as u64 {
        times.extend([10 + 2 * i, 11 + 2 * i]);
    }
    times.push(10 + 2 * n as u64);
    let mut t = traced(Script::new(&times), 1, TraceSlowerThan::Off, 1);
    let r = rec(&t.shared);
    {
        let _step = r.step();
        for _ in 0..n {
            let _s = r.section(Section::NORM, 0u32, Site::NONE);
        }
    }
    t.p.flush();
    let s = t.p.stats();
    assert_eq!(s.sections, n as u64, "every section is measured");
    assert_eq!(s.dropped[DropReason::TraceBound], 5);
    let kept = t
        .capture
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.name == "norm")
        .count();
    assert_eq!(kept, super::pair::STEP_SPANS_MAX);
}

#[test]
fn a_slow_speculative_round_is_traced_with_its_phases() {
    use crate::config::TraceSlowerThan;
    // Four rounds (begin, draft, verify, end); round 2 takes 50 µs, the others 1 µs.
    let mut times = Vec::new();
    for i in 0..4u64 {
        let t = i * 100 * US;
        let d = if i == 2 { 50 * US } else { US };
        times.extend([t, t + d / 2, t + d, t + d]);
    }
    let mut t = traced(
        Script::new(&times),
        0,
        TraceSlowerThan::Duration(std::time::Duration::from_micros(20)),
        100,
    );
    t.shared.spec_level.store(SpecLevel::Phases);
    let r = rec(&t.shared);
    for _ in 0..4 {
        let round = r.round(4);
        round.phase(Phase::Draft);
        round.phase(Phase::Verify);
        round.end(3);
    }
    t.p.flush();
    let spans = t.capture.spans.lock().unwrap();
    let rounds: Vec<_> = spans
        .iter()
        .filter(|s| s.name == crate::names::span::ROUND)
        .collect();
    assert_eq!(rounds.len(), 1, "{rounds:?}");
    let round = rounds[0];
    let why = round
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == crate::names::attr::SAMPLED)
        .map(|kv| kv.value.to_string());
    assert_eq!(why.as_deref(), Some("tail"));
    let d = round.end_time.duration_since(round.start_time).unwrap();
    assert_eq!(d, std::time::Duration::from_micros(50));
    let phases: Vec<&str> = spans
        .iter()
        .filter(|s| s.parent_span_id == round.span_context.span_id())
        .map(|s| s.name.as_ref())
        .collect();
    assert_eq!(phases, ["draft", "verify"]);
    drop(spans);
    assert_eq!(t.p.stats().tail_traces, 1);
}

#[test]
fn rounds_captured_in_a_graph_keep_their_own_verify_parts_at_every_replay() {
    // A whole round captured into a graph: draft 40 us, then verify with a kda part of 30 us and
    // 20 us more. Each replay repeats the captured round's sequence number; each replay's round
    // is finalized one pass after it ended, while the next replay's parts arrive.
    let stream = Device::new();
    let clock = stream.clone();
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::VerifySplit, clock);
    let r = rec(&shared);
    let us = std::time::Duration::from_micros;
    stream.begin_capture();
    let capture = r.begin_capture();
    {
        let round = r.round(4);
        stream.enqueue(us(40));
        round.phase(Phase::Draft);
        {
            let _kda = r.verify_part(round.as_ref(), VerifyPart::Kda);
            stream.enqueue(us(30));
        }
        stream.enqueue(us(20));
        round.phase(Phase::Verify);
        round.end(3);
    }
    let graph = stream.end_capture();
    let handle = capture.finish();
    const REPLAYS: usize = 3;
    for _ in 0..REPLAYS {
        let g = r.replay(&handle);
        stream.launch(&graph);
        g.end();
        stream.synchronize();
        p.pass();
    }
    p.flush();
    assert_eq!(p.stats().graph_replays, REPLAYS as u64);
    assert_eq!(p.stats().rounds, REPLAYS as u64);
    let parts = values(&p, crate::names::metric::SPEC_VERIFY_PART_DURATION);
    let of = |name: &str| -> Vec<f64> {
        parts
            .iter()
            .filter(|(_, a)| attr(a, "part") == Some(name))
            .map(|(v, _)| (v * 1e6).round())
            .collect()
    };
    assert_eq!(of("kda"), vec![30.0; REPLAYS], "each replay's own kda part");
    assert_eq!(of("rest"), vec![20.0; REPLAYS]);
    let phases = values(&p, crate::names::metric::SPEC_PHASE_DURATION);
    let verify: Vec<f64> = phases
        .iter()
        .filter(|(_, a)| attr(a, "phase") == Some("verify"))
        .map(|(v, _)| (v * 1e6).round())
        .collect();
    assert_eq!(verify, vec![50.0; REPLAYS]);
}

#[test]
fn verify_parts_captured_in_a_graph_belong_to_the_round_it_is_launched_in() {
    // The usual shape: the host opens the round, launches the verify graph, marks the phase and
    // ends the round with the accepted count. The graph holds a kda part of 30 us and 20 us
    // more, captured once with `capture.round()` and once inside a warm-up round (`as_ref()` of
    // a round long gone at replay time): both attach to the round open at each launch.
    let stream = Device::new();
    let clock = stream.clone();
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::VerifySplit, clock);
    let r = rec(&shared);
    let us = std::time::Duration::from_micros;
    let capture_verify = |warmup: bool| {
        let warm = warmup.then(|| r.round(4));
        stream.begin_capture();
        let capture = r.begin_capture();
        let round = match &warm {
            Some(w) => w.as_ref(),
            None => capture.round(),
        };
        {
            let _kda = r.verify_part(round, VerifyPart::Kda);
            stream.enqueue(us(30));
        }
        stream.enqueue(us(20));
        let graph = stream.end_capture();
        let handle = capture.finish();
        if let Some(w) = warm {
            w.end(0);
        }
        (graph, handle)
    };
    let graphs = [capture_verify(false), capture_verify(true)];
    p.flush();
    let warmup_rounds = p.stats().rounds;
    const ROUNDS: usize = 4;
    for i in 0..ROUNDS {
        let (graph, handle) = &graphs[i % 2];
        let round = r.round(4);
        stream.enqueue(us(40));
        round.phase(Phase::Draft);
        let g = r.replay(handle);
        stream.launch(graph);
        g.end();
        round.phase(Phase::Verify);
        round.end(2);
        stream.synchronize();
        p.pass();
    }
    p.flush();
    assert_eq!(p.stats().graph_replays, ROUNDS as u64);
    assert_eq!(p.stats().rounds - warmup_rounds, ROUNDS as u64);
    assert_eq!(p.stats().dropped[DropReason::Unbalanced], 0);
    let parts = values(&p, crate::names::metric::SPEC_VERIFY_PART_DURATION);
    let of = |name: &str| -> Vec<f64> {
        parts
            .iter()
            .filter(|(_, a)| attr(a, "part") == Some(name))
            .map(|(v, _)| (v * 1e6).round())
            .collect::<Vec<_>>()
    };
    // The warm-up round ran no part and no verify phase (the capture only recorded them): it
    // exports none.
    assert_eq!(of("kda"), vec![30.0; ROUNDS], "each round's own kda part");
    assert_eq!(of("rest"), vec![20.0; ROUNDS]);
}

/// (rank, microseconds) of every `phasetrace.step.open_duration` series read at `now` (ns);
/// each carries the group.
fn open_at(p: &Pipeline, now: u64) -> Vec<(String, f64)> {
    let mut v = Vec::new();
    p.pairing.open().each_at(now, |kv, secs| {
        let a: Vec<(String, String)> = kv
            .iter()
            .map(|k| (k.key.as_str().to_owned(), k.value.to_string()))
            .collect();
        assert_eq!(attr(&a, "group"), Some("tp0"), "{a:?}");
        assert_eq!(a.len(), 2, "rank and group only: {a:?}");
        v.push((attr(&a, "rank").unwrap().to_owned(), (secs * 1e6).round()));
    });
    v
}

fn ranks(v: &[(&str, f64)]) -> Vec<(String, f64)> {
    v.iter().map(|(r, us)| ((*r).to_owned(), *us)).collect()
}

#[test]
fn the_open_step_grows_until_it_ends_per_rank_and_reads_zero_when_idle() {
    // Rank 3's step begins at 1000 us and ends at 9000 us; a second recorder of rank 3 opens
    // one step [2000, 2500]; rank 5 (a rank thread of the same process) never steps.
    let clock = Script::new(&[1000 * US, 2000 * US, 2500 * US, 9000 * US]);
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, clock);
    let r = rec(&shared);
    let twin = rec(&shared);
    let other = Recorder::new(shared.clone(), RecorderOptions::new().rank(5));
    p.pass();
    // Idle: a series per rank, at 0.
    assert_eq!(open_at(&p, 500 * US), ranks(&[("3", 0.0), ("5", 0.0)]));
    let step = r.step();
    p.pass();
    assert_eq!(open_at(&p, 4000 * US), ranks(&[("3", 3000.0), ("5", 0.0)]));
    // Read at collection: it grows between drains.
    assert_eq!(open_at(&p, 6000 * US), ranks(&[("3", 5000.0), ("5", 0.0)]));
    {
        let _s = twin.step();
        p.pass();
        // Lanes of one rank: the longest.
        assert_eq!(open_at(&p, 6000 * US), ranks(&[("3", 5000.0), ("5", 0.0)]));
    }
    p.pass();
    assert_eq!(open_at(&p, 6000 * US), ranks(&[("3", 5000.0), ("5", 0.0)]));
    drop(step);
    p.pass();
    assert_eq!(open_at(&p, 60_000 * US), ranks(&[("3", 0.0), ("5", 0.0)]));
    // A rank whose recorder is gone disappears; one of its recorders left keeps it.
    drop(other);
    drop(twin);
    p.pass();
    assert_eq!(open_at(&p, 60_000 * US), ranks(&[("3", 0.0)]));
    drop(r);
    p.pass();
    assert_eq!(open_at(&p, 60_000 * US), ranks(&[]));
    assert_eq!(p.stats().steps, 2);
}

#[test]
fn a_stream_that_never_reaches_its_marks_counts_from_the_first_drain_that_found_one_pending() {
    use crate::timing::now_ns;
    use std::time::Duration;
    let stream = Device::new();
    let clock = stream.clone();
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, clock);
    let r = rec(&shared);
    const S10: u64 = 10_000_000_000;
    // A healthy step: its marks resolve, it ends, the rank reads 0.
    {
        let _s = r.step();
        stream.enqueue(Duration::from_micros(50));
    }
    stream.synchronize();
    p.pass();
    assert_eq!(open_at(&p, now_ns() + S10), ranks(&[("3", 0.0)]));

    // The stream hangs before the next step's begin (a kernel that never finishes): the begin
    // never resolves, so the worker sees no open step; it counts from its first drain that
    // found the mark pending, and later drains do not restart the count.
    stream.enqueue(Duration::from_millis(300));
    let step = r.step();
    let before = now_ns();
    p.pass();
    let after = now_ns();
    assert_eq!(p.stats().steps, 1);
    let within = |v: &[(String, f64)], lo: u64, hi: u64| {
        assert_eq!(v.len(), 1, "{v:?}");
        let us = v[0].1;
        assert!(
            us >= (lo / 1000) as f64 && us <= (hi / 1000) as f64 + 1.0,
            "{us} us outside [{lo}, {hi}] ns"
        );
    };
    within(&open_at(&p, after + S10), S10, S10 + (after - before));
    std::thread::sleep(Duration::from_millis(20));
    p.pass();
    within(&open_at(&p, after + S10), S10, S10 + (after - before));
    // The stream gets there: the step began at the end of the stuck kernel, and once its end
    // resolves too the rank reads 0 again.
    drop(step);
    stream.synchronize();
    p.pass();
    assert_eq!(p.stats().steps, 2);
    assert_eq!(open_at(&p, now_ns() + S10), ranks(&[("3", 0.0)]));

    // A step that began (its begin resolved), then the stream hangs inside it: counted from
    // the step's begin, not from when the worker found the later marks pending.
    let t0 = now_ns();
    let step = r.step();
    let t1 = now_ns();
    stream.enqueue(Duration::from_secs(3600));
    let _s = r.section(Section::MOE_EXPERTS, 0u32, Site::MLP);
    std::thread::sleep(Duration::from_millis(30));
    p.pass();
    within(&open_at(&p, t1 + S10), S10, S10 + (t1 - t0));
    std::thread::sleep(Duration::from_millis(20));
    p.pass();
    within(&open_at(&p, t1 + S10), S10, S10 + (t1 - t0));
    drop(_s);
    drop(step);
}

#[test]
fn a_step_whose_end_was_lost_to_a_full_queue_is_not_left_open() {
    // The queue holds 1024 marks; a step of 600 sections fills it, so the step's end is lost
    // (counted under queue_full). The step must not stay open, or an idle rank would read as
    // hung. The next step is measured as usual.
    const SECTIONS: u64 = 600;
    let times: Vec<u64> = (0..2 * SECTIONS + 10).map(|i| (i + 1) * US).collect();
    let clock = Script::new(&times);
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, clock);
    let r = rec(&shared);
    {
        let _step = r.step();
        for i in 0..SECTIONS {
            let _s = r.section(Section::NORM, (i % 8) as u32, Site::NONE);
        }
    }
    p.pass();
    assert!(
        p.stats().dropped[DropReason::QueueFull] > 0,
        "{:?}",
        p.stats()
    );
    assert_eq!(p.stats().steps, 0, "the step's end never arrived");
    assert_eq!(
        open_at(&p, 1_000_000 * US),
        ranks(&[("3", 0.0)]),
        "a step whose end was lost is not held open"
    );
    {
        let _step = r.step();
        let _s = r.section(Section::NORM, 0u32, Site::NONE);
    }
    p.pass();
    assert_eq!(p.stats().steps, 1, "{:?}", p.stats());
}

/// A scripted clock that cannot resolve the token `fail` (a failed event query).
struct FailOne {
    script: Arc<Script>,
    fail: u64,
}

impl Clock for FailOne {
    fn mark(&self) -> Option<Token> {
        self.script.mark()
    }
    fn resolve(&self, t: Token) -> Resolved {
        if t.0 == self.fail {
            Resolved::Failed
        } else {
            self.script.resolve(t)
        }
    }
    fn is_deferred(&self) -> bool {
        true
    }
    fn timing(&self) -> crate::config::Timing {
        crate::config::Timing::Events
    }
}

#[test]
fn a_step_whose_end_the_clock_could_not_time_is_not_left_open() {
    // The step's end is marked at 777 us, a token the clock fails to resolve.
    let clock = Arc::new(FailOne {
        script: Script::new(&[100 * US, 200 * US, 300 * US, 777 * US]),
        fail: 777 * US,
    });
    let (shared, mut p) = setup(SectionLevel::Full, SpecLevel::Off, clock);
    let r = rec(&shared);
    {
        let _step = r.step();
        let _s = r.section(Section::NORM, 0u32, Site::NONE);
    }
    p.pass();
    assert_eq!(p.stats().dropped[DropReason::Clock], 1);
    assert_eq!(open_at(&p, 1_000_000 * US), ranks(&[("3", 0.0)]));
}

#[test]
fn a_traced_steps_rendezvous_probes_carry_the_expert_ids_their_layer_routed() {
    use crate::config::TraceSlowerThan;
    use opentelemetry::Value;
    let times = [0, 10 * US, 20 * US, 30 * US, 40 * US, 50 * US];
    let mut t = traced(Script::new(&times), 1, TraceSlowerThan::Off, 100);
    let r = rec(&t.shared);
    let many: Vec<u32> = (0..300).map(|i| i % 7).collect();
    {
        let _step = r.step();
        r.moe_route(2u32, &many);
        {
            let _b = r.section(Section::REDUCE_MLP_BAR, 2u32, Site::MLP);
        }
        let _b = r.section(Section::REDUCE_MLP_BAR, 3u32, Site::MLP);
    }
    t.p.flush();
    let spans = t.capture.spans.lock().unwrap();
    let probe = |layer: i64| {
        spans
            .iter()
            .find(|s| {
                s.name == Section::REDUCE_MLP_BAR.as_str()
                    && s.attributes
                        .iter()
                        .any(|kv| kv.key.as_str() == "layer" && kv.value == Value::I64(layer))
            })
            .unwrap_or_else(|| panic!("no probe span of layer {layer}: {spans:?}"))
    };
    let get = |s: &opentelemetry_sdk::trace::SpanData, k: &str| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == k)
            .map(|kv| kv.value.clone())
    };
    let l2 = probe(2);
    match get(l2, crate::names::attr::EXPERT_IDS) {
        Some(Value::Array(opentelemetry::Array::I64(ids))) => {
            assert_eq!(ids.len(), super::sinks::spans::build::PROBE_IDS_MAX);
            assert_eq!(&ids[..8], &[0, 1, 2, 3, 4, 5, 6, 0]);
        }
        other => panic!("layer 2's probe: {other:?}"),
    }
    assert_eq!(
        get(l2, crate::names::attr::EXPERT_IDS_COUNT),
        Some(Value::I64(300))
    );
    // A layer that routed nothing in the step: its probe carries no ids.
    assert_eq!(get(probe(3), crate::names::attr::EXPERT_IDS), None);
}

/// What pairing delivers, kept as text, with no sink behind it.
#[derive(Default)]
struct Events(Vec<String>);

impl super::event::Sink for Events {
    fn on(&mut self, e: &super::event::Event<'_>) {
        use super::event::Event;
        let us = |ns: u64| ns / US;
        self.0.push(match e {
            Event::Section {
                section,
                ns,
                nested,
                ..
            } => format!("section {} {}us nested={nested}", section.as_str(), us(*ns)),
            Event::Wait { ns, .. } => format!("wait {}us", us(*ns)),
            Event::Route { ids, .. } => format!("route {ids:?}"),
            Event::Step(s) => format!(
                "step {}us wait {}us held={}",
                us(s.ns),
                us(s.wait_ns),
                s.held.is_some()
            ),
            Event::Round(r) => format!(
                "round k={} accepted={:?} draft {}us verify {}us",
                r.k,
                r.accepted,
                us(r.phases[Phase::Draft as usize]),
                us(r.phases[Phase::Verify as usize])
            ),
            Event::Dropped { reason, n } => format!("dropped {} {n}", reason.as_str()),
            Event::RequestTraced(t) => format!("request {} traced", t.id),
            Event::Request(r) => format!("request {} ended", r.id),
            Event::Drained => "drained".to_owned(),
        });
    }
}

#[test]
fn pairing_alone_turns_marks_into_events_in_order() {
    let clock = Script::new(&[
        0,
        100 * US,
        150 * US,
        250 * US,
        300 * US,
        340 * US,
        350 * US,
        700 * US,
        1000 * US,
        1100 * US,
        1200 * US,
        1500 * US,
        1600 * US,
    ]);
    let (shared, _) = setup(SectionLevel::Full, SpecLevel::Phases, clock);
    let open = OpenSteps::new(opentelemetry::KeyValue::new("group", "tp0"));
    let mut pairing = super::pair::Pairing::new(
        shared.clone(),
        open,
        Default::default(),
        super::requests::Requests::for_tests(shared.clone(), false),
    );
    let r = rec(&shared);
    {
        let _step = r.step();
        let _m = r.section(Section::KDA_MIXER, 1u32, Site::ATTN);
        {
            let _f = r.section(Section::KDA_FRONT, 1u32, Site::ATTN);
        }
        {
            let _p = r.section(Section::REDUCE_ATTN_BAR, 1u32, Site::ATTN);
        }
        r.end_section(Section::NORM); // never begun
    }
    let round = r.round(4);
    round.phase(Phase::Draft);
    round.phase(Phase::Verify);
    round.end(3);
    let mut events = Events::default();
    pairing.pass(&mut events);
    // A round is finalized one pass after its end, when verify parts from other threads are in.
    let before_finalize = events.0.len();
    pairing.finalize_ended(&mut events);
    assert_eq!(
        events.0,
        [
            "section kda_front 100us nested=true",
            "section reduce_attn_bar 40us nested=true",
            "wait 40us",
            "dropped unbalanced 1",
            "section kda_mixer 600us nested=false",
            "step 1000us wait 40us held=false",
            "round k=4 accepted=Some(3) draft 100us verify 300us",
        ]
    );
    assert_eq!(before_finalize, 6);
    let c = pairing.counts();
    assert_eq!((c.marks, c.sections, c.steps, c.rounds), (13, 3, 1, 1));
}

/// Requests under continuous batching: a traced request's span, its `request.step` spans (one
/// per step that served it, each linked to the step's `decode.step` span), the step spans
/// linked back to it, and the GenAI histograms of both requests, traced or not.
#[test]
fn a_traced_request_links_every_step_that_served_it_and_each_request_is_measured() {
    use crate::config::TraceSlowerThan;
    use crate::names::{attr, metric, span};
    use crate::{Finish, RequestKind};
    let t = traced(
        Arc::new(crate::timing::HostClock),
        2,
        TraceSlowerThan::Off,
        100,
    );
    let class = t
        .shared
        .kinds
        .register(RequestKind::new("phasetrace-test", "text_completion", "m"))
        .unwrap();
    let r = rec(&t.shared);
    // Request 7 is the first begun (head-sampled with one in 2), request 8 is not.
    r.request_begin(7, class);
    r.request_begin(8, class);
    for (i, batch) in [
        &[(7u64, 5u32, 1u32), (8, 3, 1)][..],
        &[(7, 1, 1), (8, 1, 1)],
        &[(7, 1, 1)],
    ]
    .iter()
    .enumerate()
    {
        let _step = r.step();
        for &(id, tokens, outputs) in *batch {
            r.serve(id, tokens, outputs);
        }
        let _s = r.section(Section::KDA_MIXER, 0u32, Site::ATTN);
        std::thread::sleep(std::time::Duration::from_millis(1 + i as u64));
        if i == 1 {
            drop(_s);
            r.request_end(8, Finish::Length);
        }
    }
    r.request_end(7, Finish::Stop);
    let mut p = t.p;
    p.flush();
    p.flush();

    let spans = t.capture.spans.lock().unwrap();
    let request: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "text_completion m")
        .collect();
    assert_eq!(request.len(), 1, "one request span, for the traced request");
    let req = request[0];
    assert_eq!(req.span_kind, opentelemetry::trace::SpanKind::Server);
    let get = |s: &opentelemetry_sdk::trace::SpanData, k: &str| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == k)
            .map(|kv| kv.value.clone())
    };
    assert_eq!(
        get(req, attr::GEN_AI_RESPONSE_ID).map(|v| v.to_string()),
        Some("7".into())
    );
    assert_eq!(
        get(req, attr::GEN_AI_USAGE_OUTPUT_TOKENS),
        Some(opentelemetry::Value::I64(3))
    );
    assert_eq!(
        get(req, attr::GEN_AI_USAGE_INPUT_TOKENS),
        Some(opentelemetry::Value::I64(5))
    );
    assert_eq!(
        get(req, attr::REQUEST_STEPS),
        Some(opentelemetry::Value::I64(3))
    );
    let steps: Vec<_> = spans.iter().filter(|s| s.name == span::STEP).collect();
    assert_eq!(
        steps.len(),
        3,
        "every step that served the traced request is traced"
    );
    let whys: Vec<String> = steps
        .iter()
        .map(|s| get(s, attr::SAMPLED).unwrap().to_string())
        .collect();
    assert_eq!(whys, ["head", "request", "head"]);
    for s in &steps {
        let links = &s.links.links;
        assert_eq!(links.len(), 1, "{:?}", s.attributes);
        assert_eq!(links[0].span_context, req.span_context);
    }
    let parts: Vec<_> = spans
        .iter()
        .filter(|s| s.name == span::REQUEST_STEP)
        .collect();
    assert_eq!(parts.len(), 3);
    for (part, step) in parts.iter().zip(&steps) {
        assert_eq!(part.parent_span_id, req.span_context.span_id());
        assert_eq!(part.span_context.trace_id(), req.span_context.trace_id());
        assert_eq!(part.links.links[0].span_context, step.span_context);
        assert_eq!(part.start_time, step.start_time);
    }
    // The first step's share: its time by 5 of its 8 tokens.
    let share = match get(parts[0], attr::REQUEST_STEP_SHARE) {
        Some(opentelemetry::Value::F64(v)) => v,
        other => panic!("{other:?}"),
    };
    let step_secs = steps[0]
        .end_time
        .duration_since(steps[0].start_time)
        .unwrap()
        .as_secs_f64();
    assert!(
        (share - step_secs * 5.0 / 8.0).abs() < 1e-6,
        "{share} {step_secs}"
    );

    let durations = values(&p, metric::GEN_AI_SERVER_REQUEST_DURATION);
    assert_eq!(durations.len(), 2);
    let model = ("gen_ai.request.model".to_owned(), "m".to_owned());
    assert!(
        durations.iter().all(|(_, kv)| kv.contains(&model)),
        "{durations:?}"
    );
    assert_eq!(
        values(&p, metric::GEN_AI_SERVER_TIME_TO_FIRST_TOKEN).len(),
        2
    );
    let tpot = values(&p, metric::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN);
    assert_eq!(
        tpot.len(),
        2,
        "both requests have two output tokens or more"
    );
    let batch: Vec<f64> = values(&p, metric::BATCH_SIZE).iter().map(|v| v.0).collect();
    assert_eq!(batch, [2.0, 2.0, 1.0]);
    assert_eq!(p.stats().dropped.total(), 0, "{:?}", p.stats().dropped);
}

/// A traced pipeline on the host clock where every request and step is head-sampled, with the
/// request class `text_completion m` registered: the request tests' setup.
fn traced_requests() -> (Traced, crate::RequestClass) {
    let t = traced(
        Arc::new(crate::timing::HostClock),
        1,
        crate::config::TraceSlowerThan::Off,
        100,
    );
    let class = t
        .shared
        .kinds
        .register(crate::RequestKind::new(
            "phasetrace-test",
            "text_completion",
            "m",
        ))
        .unwrap();
    (t, class)
}

/// The spans of a request-settling test: the request spans named `text_completion m`, the
/// `request.step` spans, and one attribute of a span as an i64.
fn request_spans(
    t: &[opentelemetry_sdk::trace::SpanData],
) -> (
    Vec<&opentelemetry_sdk::trace::SpanData>,
    Vec<&opentelemetry_sdk::trace::SpanData>,
) {
    let named = |n: &str| t.iter().filter(|s| s.name == n).collect::<Vec<_>>();
    (
        named("text_completion m"),
        named(crate::names::span::REQUEST_STEP),
    )
}

fn int_attr(s: &opentelemetry_sdk::trace::SpanData, k: &str) -> Option<i64> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == k)
        .and_then(|kv| match kv.value {
            opentelemetry::Value::I64(v) => Some(v),
            _ => None,
        })
}

/// Two ranks serve a traced request; the rank that ends it is ahead of the other, whose step
/// is still open (a slow or descheduled rank). The request waits for that step however many
/// passes run, then has both ranks' `request.step` spans.
#[test]
fn an_ended_request_waits_for_every_rank_step_that_served_it() {
    use crate::Finish;
    use crate::names::attr;
    let (t, class) = traced_requests();
    let (r0, r1) = (rec(&t.shared), rec(&t.shared));
    let mut p = t.p;
    r0.request_begin(7, class);
    p.pass();
    let late = r1.step();
    r1.serve(7, 1, 1);
    {
        let _step = r0.step();
        r0.serve(7, 1, 1);
    }
    r0.request_end(7, Finish::Stop);
    for _ in 0..4 {
        p.pass();
    }
    {
        let spans = t.capture.spans.lock().unwrap();
        let (req, _) = request_spans(&spans);
        assert!(req.is_empty(), "ended before the late rank's step: {req:?}");
    }
    drop(late);
    p.pass();
    p.pass();
    let spans = t.capture.spans.lock().unwrap();
    let (req, parts) = request_spans(&spans);
    assert_eq!(
        req.len(),
        1,
        "the request ended once both ranks' steps were in"
    );
    assert_eq!(parts.len(), 2, "one request.step span per rank");
    assert_eq!(int_attr(req[0], attr::REQUEST_STEPS_UNTRACED), Some(0));
    assert_eq!(p.stats().dropped.total(), 0, "{:?}", p.stats().dropped);
}

/// A rank stuck in its step does not hold a request back for ever: after the settling bound
/// the request ends without that rank's step, which is counted when it comes.
#[test]
fn a_stuck_rank_holds_an_ended_request_only_up_to_the_settling_bound() {
    use crate::Finish;
    let (t, class) = traced_requests();
    let (r0, r1) = (rec(&t.shared), rec(&t.shared));
    let mut p = t.p;
    p.pairing
        .set_settle_max(std::time::Duration::from_millis(50));
    r0.request_begin(7, class);
    p.pass();
    let stuck = r1.step();
    r1.serve(7, 1, 1);
    {
        let _step = r0.step();
        r0.serve(7, 1, 1);
    }
    r0.request_end(7, Finish::Stop);
    p.pass();
    std::thread::sleep(std::time::Duration::from_millis(60));
    p.pass();
    {
        let spans = t.capture.spans.lock().unwrap();
        let (req, parts) = request_spans(&spans);
        assert_eq!(req.len(), 1, "ended after the bound");
        assert_eq!(parts.len(), 1, "the stuck rank's step is not in");
    }
    drop(stuck);
    p.pass();
    p.pass();
    assert_eq!(
        p.stats().dropped.get(DropReason::Unbalanced),
        1,
        "the late step is counted: {:?}",
        p.stats().dropped
    );
}

/// A rank's step drained before the request's begin (recorded on another rank, drained a pass
/// later) has no `request.step` span: the request's span says so.
#[test]
fn a_step_drained_before_its_request_begin_is_counted_untraced() {
    use crate::Finish;
    use crate::names::attr;
    let (t, class) = traced_requests();
    let (r1, r0) = (rec(&t.shared), rec(&t.shared));
    let mut p = t.p;
    {
        let _step = r1.step();
        r1.serve(7, 1, 1);
    }
    p.pass();
    r0.request_begin(7, class);
    {
        let _step = r0.step();
        r0.serve(7, 1, 1);
    }
    r0.request_end(7, Finish::Stop);
    p.flush();
    let spans = t.capture.spans.lock().unwrap();
    let (req, parts) = request_spans(&spans);
    assert_eq!(req.len(), 1);
    assert_eq!(parts.len(), 1);
    assert_eq!(int_attr(req[0], attr::REQUEST_STEPS_UNTRACED), Some(1));
    assert_eq!(int_attr(req[0], attr::REQUEST_STEPS), Some(1));
}

/// A speculative round serving two requests (3 tokens and 1 in its step) gives each its share
/// of every phase by its tokens: on the request's span and in the per-phase histogram.
#[test]
fn a_round_gives_each_request_its_share_of_every_phase_by_its_tokens() {
    use crate::Finish;
    use crate::names::{attr, metric};
    let (t, class) = traced_requests();
    t.shared.spec_level.store(SpecLevel::Phases);
    let r = rec(&t.shared);
    r.request_begin(1, class);
    r.request_begin(2, class);
    let pause = |ms| std::thread::sleep(std::time::Duration::from_millis(ms));
    let round = r.round(4);
    pause(2);
    round.phase(Phase::Draft);
    {
        let _step = r.step();
        r.serve_speculative(1, 4, 2);
        r.serve(2, 1, 1);
        pause(4);
    }
    round.phase(Phase::Verify);
    pause(1);
    round.phase(Phase::Accept);
    round.end(2);
    r.request_end(1, Finish::Stop);
    r.request_end(2, Finish::Stop);
    let mut p = t.p;
    p.pass();
    p.pass();
    p.pass();
    let spans = t.capture.spans.lock().unwrap();
    let (req, _) = request_spans(&spans);
    assert_eq!(req.len(), 2);
    let shares = |s: &opentelemetry_sdk::trace::SpanData| -> Vec<f64> {
        let get = |k: &str| {
            s.attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| kv.value.clone())
        };
        let phases = get(attr::REQUEST_PHASES).map(|v| v.to_string());
        assert_eq!(
            phases.as_deref(),
            Some(r#"["draft","verify","accept","rollback","maint"]"#),
            "{:?}",
            s.attributes
        );
        match get(attr::REQUEST_PHASE_SHARE) {
            Some(opentelemetry::Value::Array(opentelemetry::Array::F64(v))) => v,
            other => panic!("{other:?}"),
        }
    };
    let id = |s: &opentelemetry_sdk::trace::SpanData| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == attr::GEN_AI_RESPONSE_ID)
            .map(|kv| kv.value.to_string())
    };
    let (a, b) = if id(req[0]).as_deref() == Some("1") {
        (shares(req[0]), shares(req[1]))
    } else {
        (shares(req[1]), shares(req[0]))
    };
    // Request 1 has 4 drafted tokens verified (5 tokens in the step), request 2 one token.
    assert!(a[0] >= 0.002 * 5.0 / 6.0 * 0.99, "draft: {a:?}");
    assert!(a[1] >= 0.004 * 5.0 / 6.0 * 0.99, "verify: {a:?}");
    for (x, y) in a.iter().zip(&b) {
        assert!((x - 5.0 * y).abs() < 1e-8, "shares by tokens: {a:?} {b:?}");
    }
    assert_eq!(a[3], 0.0, "no rollback");
    let by_phase = values(&p, metric::REQUEST_PHASE_SHARE);
    assert_eq!(by_phase.len(), 2 * Phase::ALL.len(), "{by_phase:?}");
    let verify: Vec<f64> = by_phase
        .iter()
        .filter(|(_, kv)| kv.contains(&(attr::PHASE.to_owned(), "verify".to_owned())))
        .map(|v| v.0)
        .collect();
    assert_eq!(verify.len(), 2);
    assert!(
        verify.iter().any(|v| (v - a[1]).abs() < 1e-9),
        "{verify:?} {a:?}"
    );
}
