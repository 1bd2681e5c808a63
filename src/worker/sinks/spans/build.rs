//! Span building for traced steps and rounds (one in N, or slow), with explicit start and end
//! timestamps.
//!
//! ```text
//! decode.step ─┬─ layer ── kda_mixer ─┬─ kda_front
//!              │                      └─ kda_recur ...
//!              └─ (sections without a layer)
//! spec.round ── draft | verify ── kda | mla ... | accept | rollback | maint
//! ```

use crate::names::{attr, span};
use crate::timing::to_system_time;
use crate::vocab::{Layer, Phase, VerifyPart};
use crate::worker::event::HeldStep;
use crate::worker::trace::{Interval, Parent, StepTrace};
use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer,
};
use opentelemetry::{Context, KeyValue};

/// Why a step or round was traced (the `phasetrace.sampled` span attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    /// One in `PHASETRACE_TRACE_EVERY`, decided on the hot path.
    Head,
    /// Slower than `PHASETRACE_TRACE_SLOWER_THAN`, decided on the worker.
    Tail,
}

impl Why {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Why::Head => "head",
            Why::Tail => "tail",
        }
    }
}

/// The ids of the spans [`build_step`] built, for exemplars.
#[derive(Debug)]
pub(crate) struct BuiltStep {
    pub(crate) trace_id: TraceId,
    pub(crate) root: SpanId,
    /// The span of each section of the trace (`None`: still open at the step's end).
    pub(crate) sections: Vec<Option<SpanId>>,
}

fn parent_context(parent: Option<Parent>) -> Context {
    match parent {
        Some(Parent { trace_id, span_id }) if trace_id != 0 && span_id != 0 => Context::new()
            .with_remote_span_context(SpanContext::new(
                TraceId::from(trace_id),
                SpanId::from(span_id),
                TraceFlags::SAMPLED,
                true,
                TraceState::default(),
            )),
        _ => Context::new(),
    }
}

fn child(
    tracer: &BoxedTracer,
    parent: &Context,
    name: &'static str,
    start: u64,
    mut attrs: Vec<KeyValue>,
    group: &KeyValue,
) -> Context {
    attrs.push(group.clone());
    let s = tracer
        .span_builder(name)
        .with_start_time(to_system_time(start))
        .with_attributes(attrs)
        .start_with_context(tracer, parent);
    parent.with_span(s)
}

fn end(cx: &Context, at: u64) {
    cx.span().end_with_timestamp(to_system_time(at));
}

/// Most expert ids on one rendezvous-probe span; the rest stay on the step's `moe.route` events.
pub(crate) const PROBE_IDS_MAX: usize = 256;

/// The route trace next to the rendezvous time: on a probe section's span, the expert ids
/// its layer routed in the step (at most [`PROBE_IDS_MAX`], and how many there were).
fn route_attrs(trace: &StepTrace, layer: Layer, attrs: &mut Vec<KeyValue>) {
    if layer.get().is_none() {
        return;
    }
    let mut ids: Vec<i64> = Vec::new();
    let mut n = 0usize;
    for r in trace.routes.iter().filter(|r| r.layer == layer) {
        let of = trace.expert_ids.get(r.ids.clone()).unwrap_or_default();
        n += of.len();
        let room = PROBE_IDS_MAX.saturating_sub(ids.len());
        ids.extend(of.iter().take(room).map(|&i| i64::from(i)));
    }
    if n > 0 {
        attrs.push(KeyValue::new(
            attr::EXPERT_IDS,
            opentelemetry::Value::Array(opentelemetry::Array::I64(ids)),
        ));
        attrs.push(KeyValue::new(attr::EXPERT_IDS_COUNT, n as i64));
    }
}

/// How many spans [`build_step`] builds for `trace`.
pub(crate) fn step_span_count(trace: &StepTrace) -> usize {
    let mut layers: Vec<Layer> = trace
        .sections
        .iter()
        .filter(|s| s.parent.is_none() && s.end.is_some())
        .filter_map(|s| s.layer.get().map(|_| s.layer))
        .collect();
    layers.sort_unstable();
    layers.dedup();
    1 + layers.len() + trace.sections.iter().filter(|s| s.end.is_some()).count()
}

/// Builds `decode.step -> layer -> section` spans for a step of `rank`; `started` sees their
/// ids once every span has started and before any has ended. Returns how many spans were built.
pub(crate) fn build_step(
    tracer: &BoxedTracer,
    rank: u32,
    step: &HeldStep<'_>,
    group: &KeyValue,
    why: Why,
    started: impl FnOnce(&BuiltStep),
) -> usize {
    let trace = step.trace;
    let root = child(
        tracer,
        &parent_context(trace.parent),
        span::STEP,
        step.start,
        vec![
            KeyValue::new(attr::RANK, i64::from(rank)),
            KeyValue::new(attr::STEP, step.number as i64),
            KeyValue::new(attr::TIMING, step.timing.as_str()),
            KeyValue::new(attr::SAMPLED, why.as_str()),
        ],
        group,
    );
    let mut built = 1;
    for route in &trace.routes {
        let ids: Vec<i64> = trace
            .expert_ids
            .get(route.ids.clone())
            .unwrap_or_default()
            .iter()
            .map(|&i| i64::from(i))
            .collect();
        root.span().add_event_with_timestamp(
            span::MOE_ROUTE_EVENT,
            to_system_time(route.at),
            vec![
                KeyValue::new(attr::LAYER, i64::from(route.layer.get().unwrap_or(0))),
                KeyValue::new(
                    attr::EXPERT_IDS,
                    opentelemetry::Value::Array(opentelemetry::Array::I64(ids)),
                ),
            ],
        );
    }

    // Layer spans cover their top-level sections.
    let mut layers: Vec<Interval<Layer>> = Vec::new();
    for s in trace.sections.iter().filter(|s| s.parent.is_none()) {
        let (Some(end_ns), Some(_)) = (s.end, s.layer.get()) else {
            continue;
        };
        match layers.iter_mut().find(|l| l.what == s.layer) {
            Some(e) => {
                e.start = e.start.min(s.start);
                e.end = e.end.max(end_ns);
            }
            None => layers.push(Interval {
                what: s.layer,
                start: s.start,
                end: end_ns,
            }),
        }
    }
    let layer_cx: Vec<(Layer, Context, u64)> = layers
        .into_iter()
        .map(|l| {
            let cx = child(
                tracer,
                &root,
                span::LAYER,
                l.start,
                vec![KeyValue::new(attr::LAYER, i64::from(l.what.0))],
                group,
            );
            (l.what, cx, l.end)
        })
        .collect();
    built += layer_cx.len();

    // Parents begin before their children, so one pass in begin order finds every parent.
    let mut cxs: Vec<Option<Context>> = Vec::with_capacity(trace.sections.len());
    for s in &trace.sections {
        let Some(end_ns) = s.end else {
            cxs.push(None);
            continue;
        };
        let parent = match s.parent.and_then(|p| cxs.get(p).and_then(Option::as_ref)) {
            Some(p) => p,
            None => layer_cx
                .iter()
                .find(|(l, _, _)| *l == s.layer)
                .map_or(&root, |(_, cx, _)| cx),
        };
        let mut attrs = vec![
            KeyValue::new(attr::BUCKET, s.section.as_str()),
            KeyValue::new(attr::RANK, i64::from(rank)),
        ];
        if let Some(l) = s.layer.get() {
            attrs.push(KeyValue::new(attr::LAYER, i64::from(l)));
        }
        if let Some(site) = s.site.as_str() {
            attrs.push(KeyValue::new(attr::SITE, site));
        }
        if s.section.kind() == crate::vocab::SectionKind::Probe {
            route_attrs(trace, s.layer, &mut attrs);
        }
        let cx = child(tracer, parent, s.section.as_str(), s.start, attrs, group);
        cxs.push(Some(cx.clone()));
        // Ended after its children are started; children end themselves below.
        let _ = end_ns;
        built += 1;
    }
    let root_cx = root.span().span_context().clone();
    started(&BuiltStep {
        trace_id: root_cx.trace_id(),
        root: root_cx.span_id(),
        sections: cxs
            .iter()
            .map(|c| c.as_ref().map(|c| c.span().span_context().span_id()))
            .collect(),
    });
    for (s, cx) in trace.sections.iter().zip(&cxs) {
        if let (Some(cx), Some(e)) = (cx, s.end) {
            end(cx, e);
        }
    }
    for (_, cx, e) in &layer_cx {
        end(cx, *e);
    }
    end(&root, step.end);
    built
}

/// One sampled round, ready for its spans.
pub(crate) struct RoundSpans<'a> {
    pub(crate) phases: &'a [Interval<Phase>],
    /// Verify parts, in start order.
    pub(crate) parts: &'a [Interval<VerifyPart>],
    pub(crate) rank: u32,
    pub(crate) k: u32,
    pub(crate) accepted: Option<u32>,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// `group` on every span of the round.
    pub(crate) group: &'a KeyValue,
    pub(crate) why: Why,
    /// The engine's span the round is a child of (`HeldRound::parent`).
    pub(crate) parent: Option<Parent>,
}

/// Builds `spec.round -> phase -> part` spans; returns how many spans were built.
pub(crate) fn build_round(tracer: &BoxedTracer, round: &RoundSpans<'_>) -> usize {
    let mut attrs = vec![
        KeyValue::new(attr::RANK, i64::from(round.rank)),
        KeyValue::new(attr::K, i64::from(round.k)),
        KeyValue::new(attr::SAMPLED, round.why.as_str()),
    ];
    if let Some(a) = round.accepted {
        attrs.push(KeyValue::new(attr::ACCEPTED, i64::from(a)));
    }
    let root = child(
        tracer,
        &parent_context(round.parent),
        span::ROUND,
        round.start,
        attrs,
        round.group,
    );
    let mut built = 1;
    for phase in round.phases {
        let name = phase.what.as_str();
        let cx = child(
            tracer,
            &root,
            name,
            phase.start,
            vec![KeyValue::new(attr::PHASE, name)],
            round.group,
        );
        built += 1;
        if phase.what == Phase::Verify {
            for part in round.parts {
                let name = part.what.as_str();
                let p = child(
                    tracer,
                    &cx,
                    name,
                    part.start,
                    vec![KeyValue::new(attr::PART, name)],
                    round.group,
                );
                end(&p, part.end);
                built += 1;
            }
        }
        end(&cx, phase.end);
    }
    end(&root, round.end);
    built
}
