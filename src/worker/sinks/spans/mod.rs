//! The span sink: for each step and round whose trace pairing held, the tail decision (one in
//! N, or slow within the rank's budget), the span budget, the spans, and the exemplars that
//! point at them. The span budget and the exporter's counts are read here only.
//!
//! ```text
//! Step / Round (held) ──> Tail::decide ──> Keep / Head ──> budget: pending spans + n under the
//!                            │ OverBudget: tail_budget      processor's queue? ── no: span_queue
//!                            ▼                                 │ yes
//!                          dropped                   build (build.rs) ──> exemplars (offered
//!                                                    before the spans end, settled on export)
//! Drained ──> spans that failed to export since the last pass: span_export
//! ```
//!
//! The drops it decides go back to the other sinks as [`Event::Dropped`]
//! ([`super::Sinks`]).

pub(crate) mod build;
pub(crate) mod tail;

use crate::export::SpanCounts;
use crate::export::exemplars::{Exemplar, ExemplarStore};
use crate::names::DropReason;
use crate::vocab::SectionKind;
use crate::worker::attrs::{section_attrs, step_attrs, wait_attrs};
use crate::worker::event::{BatchEntry, Request, TracedRequest, TracedWhy};
use crate::worker::event::{Event, HeldRound, HeldStep, Hold, Round};
use build::{BatchSpans, BuiltStep, RoundSpans, Why};
use opentelemetry::Context;
use opentelemetry::KeyValue;
use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{Link, SpanKind, Status, TraceContextExt, Tracer as _};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tail::{Kind, Tail, Verdict};

/// Tail decisions, the span budget, span building and exemplar offers.
pub(crate) struct SpanSink {
    /// `None`: no spans (no tracer, or neither head nor tail sampling).
    tracer: Option<Arc<BoxedTracer>>,
    counts: Arc<SpanCounts>,
    tail: Tail,
    exemplars: Option<Arc<ExemplarStore>>,
    /// `group` on every span.
    group: KeyValue,
    /// Spans built and handed to the span processor.
    built: u64,
    /// Steps and rounds traced for being slow.
    tail_traces: u64,
    /// Spans lost to failed exports as of the last pass (those since are counted at the next).
    failed: u64,
    /// The spans of the traced requests, open until they end.
    requests: HashMap<u64, OpenRequestSpan>,
}

/// Most links from one step span to the traced requests of its batch; the rest are counted
/// (`phasetrace.batch.links_dropped`, and `reason="trace_bound"`).
pub(crate) const STEP_LINKS_MAX: usize = 64;
/// Most `request.step` spans of one request; the rest are counted on the request's span
/// (`phasetrace.request.steps_untraced`).
pub(crate) const REQUEST_STEP_SPANS_MAX: u64 = 4096;

/// A traced request's span, open from its arrival to its end.
struct OpenRequestSpan {
    cx: Context,
    /// `request.step` spans built, and steps that served it without one.
    step_spans: u64,
    unlinked: u64,
}

/// The span sink's share of [`super::super::Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SpanFigures {
    pub(crate) built: u64,
    pub(crate) tail_traces: u64,
    pub(crate) exported: u64,
    pub(crate) failed: u64,
}

impl SpanSink {
    pub(crate) fn new(
        tracer: Option<Arc<BoxedTracer>>,
        counts: Arc<SpanCounts>,
        tail: Tail,
        exemplars: Option<Arc<ExemplarStore>>,
        group: KeyValue,
    ) -> SpanSink {
        SpanSink {
            tracer,
            counts,
            tail,
            exemplars,
            group,
            built: 0,
            tail_traces: 0,
            failed: 0,
            requests: HashMap::new(),
        }
    }

    /// The traces pairing must hold for this sink: the sampled ones when there is a tracer,
    /// every one when tail sampling may keep any.
    pub(crate) fn hold(&self) -> Hold {
        let on = self.tracer.is_some();
        Hold {
            sampled: on,
            every: on && self.tail.is_on(),
        }
    }

    /// Takes an event; returns what it decided to drop, for the other sinks to count (a tail
    /// trace over the budget and spans over the queue exclude each other, so one at most).
    #[inline(always)]
    pub(crate) fn on(&mut self, e: &Event<'_>) -> Option<(DropReason, u64)> {
        match e {
            Event::Step(s) => match s.held.as_ref() {
                Some(h) => self.step(s.rank, s.ns, h, s.batch),
                None => {
                    self.unlinked(s.batch);
                    None
                }
            },
            Event::Round(r) => r.held.as_ref().and_then(|h| self.round(r, h)),
            Event::Drained => self.drained(),
            Event::RequestTraced(t) => {
                self.request_traced(t);
                None
            }
            Event::Request(r) => {
                self.request_ended(r);
                None
            }
            Event::Section { .. }
            | Event::Wait { .. }
            | Event::Route { .. }
            | Event::Dropped { .. } => None,
        }
    }

    /// A held step has ended: traced when it was sampled or slow (within the rank's budget),
    /// or when it served a traced request, with the exemplars of what was traced; linked to
    /// the traced requests of its batch, each of which gets a `request.step` span.
    #[inline(never)]
    fn step(
        &mut self,
        rank: u32,
        ns: u64,
        step: &HeldStep<'_>,
        batch: &[BatchEntry],
    ) -> Option<(DropReason, u64)> {
        let verdict = self
            .tail
            .decide(rank, Kind::Step, ns, step.end, step.sampled);
        let serves_traced = batch.iter().any(|b| b.traced);
        let why = match (step.sampled, verdict, serves_traced) {
            (true, _, _) => Why::Head,
            (false, Verdict::Keep, _) => Why::Tail,
            (false, _, true) => Why::Request,
            (false, Verdict::OverBudget, false) => return Some((DropReason::TailBudget, 1)),
            (false, Verdict::Fast, false) => return None,
        };
        let tracer = self.tracer.clone()?;
        let traced: Vec<&BatchEntry> = batch
            .iter()
            .filter(|b| b.traced && self.requests.contains_key(&b.id))
            .collect();
        let n = build::step_span_count(step.trace) + traced.len();
        if !self.budget(n) {
            self.unlinked(batch);
            return Some((DropReason::SpanQueue, n as u64));
        }
        let mut links = Vec::new();
        for b in traced.iter().take(STEP_LINKS_MAX) {
            if let Some(r) = self.requests.get(&b.id) {
                links.push(Link::with_context(r.cx.span().span_context().clone()));
            }
        }
        let links_dropped = traced.len().saturating_sub(STEP_LINKS_MAX);
        let mut attrs = Vec::new();
        if let Some(kind) = step.kind {
            attrs.push(KeyValue::new(crate::names::attr::STEP_KIND, kind.as_str()));
        }
        if !batch.is_empty() {
            attrs.push(KeyValue::new(
                crate::names::attr::BATCH_SIZE,
                batch.len() as i64,
            ));
            attrs.push(KeyValue::new(
                crate::names::attr::BATCH_TOKENS,
                batch.iter().map(|b| i64::from(b.tokens)).sum::<i64>(),
            ));
        }
        if links_dropped > 0 {
            attrs.push(KeyValue::new(
                crate::names::attr::BATCH_LINKS_DROPPED,
                links_dropped as i64,
            ));
        }
        let (exemplars, group) = (self.exemplars.as_deref(), &self.group);
        let mut root: Option<opentelemetry::trace::SpanContext> = None;
        // Exemplars are offered once the spans exist and before they end (an ended span may be
        // exported at once), so that the export settles them.
        let built = build::build_step(
            &tracer,
            rank,
            step,
            group,
            why,
            BatchSpans { links, attrs },
            |built| {
                root = Some(opentelemetry::trace::SpanContext::new(
                    built.trace_id,
                    built.root,
                    opentelemetry::trace::TraceFlags::SAMPLED,
                    false,
                    Default::default(),
                ));
                if let Some(store) = exemplars {
                    offer_step_exemplars(store, group, step, built, rank, ns);
                }
            },
        );
        self.built += built as u64;
        if why == Why::Tail {
            self.tail_traces += 1;
        }
        // Each traced request's part in the step, in the request's trace, linked to the step.
        for b in traced {
            let Some(r) = self.requests.get_mut(&b.id) else {
                continue;
            };
            if r.step_spans >= REQUEST_STEP_SPANS_MAX {
                r.unlinked += 1;
                continue;
            }
            r.step_spans += 1;
            let links = root.clone().map(Link::with_context).into_iter().collect();
            let secs = |ns: u64| ns as f64 * 1e-9;
            let cx = build::child_linked(
                &tracer,
                &r.cx,
                crate::names::span::REQUEST_STEP,
                step.start,
                vec![
                    KeyValue::new(crate::names::attr::RANK, i64::from(rank)),
                    KeyValue::new(crate::names::attr::STEP, step.number as i64),
                    KeyValue::new(crate::names::attr::REQUEST_STEP_TOKENS, i64::from(b.tokens)),
                    KeyValue::new(
                        crate::names::attr::REQUEST_STEP_OUTPUT_TOKENS,
                        i64::from(b.outputs),
                    ),
                    KeyValue::new(crate::names::attr::REQUEST_STEP_SHARE, secs(b.share_ns)),
                    KeyValue::new(
                        crate::names::attr::REQUEST_STEP_WAIT_SHARE,
                        secs(b.wait_share_ns),
                    ),
                    KeyValue::new(crate::names::attr::BATCH_SIZE, batch.len() as i64),
                ],
                links,
                &self.group,
            );
            build::end(&cx, step.end);
            self.built += 1;
        }
        if links_dropped > 0 {
            return Some((DropReason::TraceBound, links_dropped as u64));
        }
        None
    }

    /// A step that served traced requests was not traced (not held, or over the span
    /// queue): their spans count it.
    fn unlinked(&mut self, batch: &[BatchEntry]) {
        for b in batch.iter().filter(|b| b.traced) {
            if let Some(r) = self.requests.get_mut(&b.id) {
                r.unlinked += 1;
            }
        }
    }

    /// A request became traced: its span starts (at its arrival), for the steps to link to.
    fn request_traced(&mut self, t: &TracedRequest) {
        let Some(tracer) = self.tracer.as_deref() else {
            return;
        };
        use crate::names::attr;
        let k = &t.kind;
        let span = tracer
            .span_builder(format!("{} {}", k.operation, k.model))
            .with_kind(SpanKind::Server)
            .with_start_time(crate::timing::to_system_time(t.begin))
            .with_attributes(vec![
                KeyValue::new(attr::GEN_AI_OPERATION_NAME, k.operation.clone()),
                KeyValue::new(attr::GEN_AI_PROVIDER_NAME, k.provider.clone()),
                KeyValue::new(attr::GEN_AI_REQUEST_MODEL, k.model.clone()),
                KeyValue::new(attr::GEN_AI_RESPONSE_MODEL, k.response().to_owned()),
                KeyValue::new(attr::GEN_AI_RESPONSE_ID, t.id.to_string()),
                KeyValue::new(
                    attr::SAMPLED,
                    match t.why {
                        TracedWhy::Head => Why::Head.as_str(),
                        TracedWhy::Tail => Why::Tail.as_str(),
                    },
                ),
                self.group.clone(),
            ])
            .start_with_context(tracer, &Context::new());
        if t.why == TracedWhy::Tail {
            self.tail_traces += 1;
        }
        self.requests.insert(
            t.id,
            OpenRequestSpan {
                cx: Context::new().with_span(span),
                step_spans: 0,
                unlinked: 0,
            },
        );
    }

    /// A traced request ended: its span gets the request's figures and ends; its exemplars
    /// are offered.
    fn request_ended(&mut self, r: &Request) {
        let Some(open) = self.requests.remove(&r.id) else {
            return;
        };
        use crate::names::{attr, metric};
        let secs = |ns: u64| ns as f64 * 1e-9;
        let span = open.cx.span();
        let mut kv = vec![
            KeyValue::new(
                attr::GEN_AI_RESPONSE_FINISH_REASONS,
                opentelemetry::Value::Array(opentelemetry::Array::String(vec![
                    r.finish.as_str().into(),
                ])),
            ),
            KeyValue::new(attr::GEN_AI_USAGE_INPUT_TOKENS, r.input_tokens as i64),
            KeyValue::new(attr::GEN_AI_USAGE_OUTPUT_TOKENS, r.outputs as i64),
            KeyValue::new(attr::GEN_AI_LATENCY_E2E, secs(r.duration_ns())),
            KeyValue::new(attr::GEN_AI_LATENCY_TIME_IN_MODEL_FORWARD, secs(r.share_ns)),
            KeyValue::new(attr::REQUEST_WAIT_SHARE, secs(r.wait_share_ns)),
            KeyValue::new(attr::REQUEST_STEPS, r.steps as i64),
            KeyValue::new(
                attr::REQUEST_STEPS_UNTRACED,
                (r.steps_untraced + open.unlinked) as i64,
            ),
        ];
        let mut opt = |k: &'static str, v: Option<u64>| {
            if let Some(v) = v {
                kv.push(KeyValue::new(k, secs(v)));
            }
        };
        opt(attr::GEN_AI_LATENCY_TIME_IN_QUEUE, r.queue_ns());
        opt(attr::GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN, r.ttft_ns());
        opt(attr::GEN_AI_LATENCY_TIME_IN_PREFILL, r.prefill_ns());
        opt(attr::GEN_AI_LATENCY_TIME_IN_DECODE, r.decode_ns());
        opt(attr::GEN_AI_LATENCY_TIME_PER_OUTPUT_TOKEN, r.tpot_ns());
        if !r.wait_by_rank.is_empty() {
            kv.push(KeyValue::new(
                attr::REQUEST_RANKS,
                opentelemetry::Value::Array(opentelemetry::Array::I64(
                    r.wait_by_rank.iter().map(|(k, _)| i64::from(*k)).collect(),
                )),
            ));
            kv.push(KeyValue::new(
                attr::REQUEST_WAIT_BY_RANK,
                opentelemetry::Value::Array(opentelemetry::Array::F64(
                    r.wait_by_rank.iter().map(|(_, w)| secs(*w)).collect(),
                )),
            ));
        }
        if let Some(shares) = &r.phase_share_ns {
            kv.push(KeyValue::new(
                attr::REQUEST_PHASES,
                opentelemetry::Value::Array(opentelemetry::Array::String(
                    crate::vocab::Phase::ALL
                        .iter()
                        .map(|p| p.as_str().into())
                        .collect(),
                )),
            ));
            kv.push(KeyValue::new(
                attr::REQUEST_PHASE_SHARE,
                opentelemetry::Value::Array(opentelemetry::Array::F64(
                    shares.iter().map(|ns| secs(*ns)).collect(),
                )),
            ));
        }
        if let Some(rank) = r.waited_for_rank() {
            kv.push(KeyValue::new(
                attr::REQUEST_WAITED_FOR_RANK,
                i64::from(rank),
            ));
        }
        if r.drafted > 0 {
            kv.push(KeyValue::new(
                attr::REQUEST_DRAFTED_TOKENS,
                r.drafted as i64,
            ));
            kv.push(KeyValue::new(
                attr::REQUEST_ACCEPTED_TOKENS,
                r.accepted as i64,
            ));
        }
        if let Some(e) = r.finish.error_type() {
            kv.push(KeyValue::new(attr::ERROR_TYPE, e));
            span.set_status(Status::error(e));
        }
        span.set_attributes(kv);
        let sc = span.span_context().clone();
        if let Some(store) = self.exemplars.as_deref() {
            let attrs = crate::worker::sinks::metrics::request_attrs(r, &self.group);
            let time = crate::timing::to_system_time(r.end);
            let offer = |m: &'static str, ns: Option<u64>| {
                if let Some(ns) = ns {
                    store.offer(
                        m,
                        &attrs,
                        Exemplar {
                            trace_id: sc.trace_id(),
                            span_id: sc.span_id(),
                            value: secs(ns),
                            time,
                        },
                    );
                }
            };
            offer(
                metric::GEN_AI_SERVER_REQUEST_DURATION,
                Some(r.duration_ns()),
            );
            if r.finish.error_type().is_none() {
                offer(metric::GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, r.ttft_ns());
                offer(metric::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, r.tpot_ns());
            }
        }
        span.end_with_timestamp(crate::timing::to_system_time(r.end));
        self.built += 1;
    }

    /// A held round has ended: traced when it was sampled or slow (within the rank's budget).
    fn round(&mut self, r: &Round<'_>, held: &HeldRound<'_>) -> Option<(DropReason, u64)> {
        let ns = r.end.saturating_sub(r.start);
        let verdict = self
            .tail
            .decide(r.rank, Kind::Round, ns, r.end, held.sampled);
        let why = match (held.sampled, verdict) {
            (true, _) => Why::Head,
            (false, Verdict::Keep) => Why::Tail,
            (false, Verdict::OverBudget) => return Some((DropReason::TailBudget, 1)),
            (false, Verdict::Fast) => return None,
        };
        let n = 1 + held.phases.len() + held.parts.len();
        if !self.budget(n) {
            return Some((DropReason::SpanQueue, n as u64));
        }
        let tracer = self.tracer.as_deref()?;
        if why == Why::Tail {
            self.tail_traces += 1;
        }
        self.built += build::build_round(
            tracer,
            &RoundSpans {
                phases: held.phases,
                parts: held.parts,
                rank: r.rank,
                k: r.k,
                accepted: r.accepted,
                start: r.start,
                end: r.end,
                group: &self.group,
                why,
                parent: held.parent,
            },
        ) as u64;
        None
    }

    /// Spans handed to the processor and not yet exported or failed, plus `n`, stay under the
    /// processor's queue capacity (less one export batch in flight); if not they are not built,
    /// and are counted under `reason="span_queue"` (the processor would drop them uncounted).
    fn budget(&self, n: usize) -> bool {
        if !self.counts.tracked {
            // The engine's provider: its processor's queue is its own to bound and count.
            return true;
        }
        let done = self.counts.exported.load(Relaxed) + self.counts.failed.load(Relaxed);
        let pending = self.built.saturating_sub(done);
        pending + n as u64 <= crate::export::SPAN_QUEUE_BUDGET as u64
    }

    /// The end of a pass: spans lost to failed exports since the last one are counted.
    fn drained(&mut self) -> Option<(DropReason, u64)> {
        let failed = self.counts.failed.load(Relaxed);
        let lost = failed.saturating_sub(self.failed);
        self.failed = failed;
        (lost > 0).then_some((DropReason::SpanExport, lost))
    }

    pub(crate) fn figures(&self) -> SpanFigures {
        SpanFigures {
            built: self.built,
            tail_traces: self.tail_traces,
            // Live, as the exporter counts them (not as of the last pass).
            exported: self.counts.exported.load(Relaxed),
            failed: self.counts.failed.load(Relaxed),
        }
    }
}

/// The exemplars of a traced step: its duration, each section's, each probe's wait and each
/// wait the engine measured (those point at the step's span).
fn offer_step_exemplars(
    store: &ExemplarStore,
    group: &KeyValue,
    step: &HeldStep<'_>,
    built: &BuiltStep,
    rank: u32,
    ns: u64,
) {
    use crate::names::metric;
    let (trace, end) = (step.trace, step.end);
    let ex = |span_id, ns: u64, at: u64| Exemplar {
        trace_id: built.trace_id,
        span_id,
        value: ns as f64 * 1e-9,
        time: crate::timing::to_system_time(at),
    };
    store.offer(
        metric::STEP_DURATION,
        &step_attrs(group, rank, step.kind),
        ex(built.root, ns, end),
    );
    for (sec, id) in trace.sections.iter().zip(&built.sections) {
        let (Some(id), Some(e)) = (id, sec.end) else {
            continue;
        };
        let d = e.saturating_sub(sec.start);
        let (kv, n) = section_attrs(group, sec.section, sec.site, rank);
        store.offer(metric::SECTION_DURATION, &kv[..n], ex(*id, d, e));
        if sec.section.kind() == SectionKind::Probe {
            let (kv, n) = wait_attrs(group, sec.site, rank);
            store.offer(metric::COLLECTIVE_WAIT, &kv[..n], ex(*id, d, e));
        }
    }
    for w in &trace.waits {
        let (kv, n) = wait_attrs(group, w.site, rank);
        store.offer(
            metric::COLLECTIVE_WAIT,
            &kv[..n],
            ex(built.root, w.ns, w.at),
        );
    }
}
