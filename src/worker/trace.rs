//! What pairing holds of a step or round for its spans: kept for every step while tail sampling
//! is on (the buffers are reused from step to step), else for sampled steps only. It rides in
//! the step and round events ([`super::event`]) to the span sink, which alone builds spans.

use crate::vocab::{Layer, Phase, Section, Site};

/// One timed section of a sampled step; `end == None` while open.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SectionSpan {
    pub(crate) section: Section,
    pub(crate) layer: Layer,
    pub(crate) site: Site,
    pub(crate) start: u64,
    pub(crate) end: Option<u64>,
    /// Index of the enclosing section in the same step.
    pub(crate) parent: Option<usize>,
}

/// The expert ids routed in one layer of a traced step, at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    pub(crate) layer: Layer,
    /// The range of [`StepTrace::expert_ids`] (one buffer per step, reused).
    pub(crate) ids: std::ops::Range<usize>,
    pub(crate) at: u64,
}

/// A rendezvous wait the engine measured itself, in a traced step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    pub(crate) site: Site,
    pub(crate) layer: Layer,
    pub(crate) ns: u64,
    pub(crate) at: u64,
}

/// The span context of the engine's `tracing` span that parents a sampled step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Parent {
    pub(crate) trace_id: u128,
    pub(crate) span_id: u64,
}

/// Something (a phase, a verify part) that ran from `start` to `end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Interval<T> {
    pub(crate) what: T,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// What the worker holds of the open step for its trace: kept for every step while tail
/// sampling is on (the buffers are reused from step to step), else for sampled steps only.
#[derive(Debug, Default)]
pub(crate) struct StepTrace {
    pub(crate) sections: Vec<SectionSpan>,
    pub(crate) routes: Vec<Route>,
    pub(crate) expert_ids: Vec<u16>,
    pub(crate) waits: Vec<Wait>,
    pub(crate) parent: Option<Parent>,
}

impl StepTrace {
    /// Empties the trace for the next step, keeping its buffers.
    pub(crate) fn clear(&mut self) {
        self.sections.clear();
        self.routes.clear();
        self.expert_ids.clear();
        self.waits.clear();
        self.parent = None;
    }
}

/// What a sampled round collected: its phase intervals.
#[derive(Debug, Default)]
pub(crate) struct RoundTrace {
    pub(crate) phases: Vec<Interval<Phase>>,
    /// The engine's span current when the round began, else that of the step it ran in.
    pub(crate) parent: Option<Parent>,
}
