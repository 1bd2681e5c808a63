//! Pairing: turns one lane's mark stream into durations, in order, and hands them to the
//! [`super::Pipeline`]'s sinks. Unbalanced marks are counted, never fatal.

use super::aggregate::{Instruments, Tally};
use super::spans::{self, RoundTrace, SectionSpan, StepTrace};
use crate::record::Lane;
use crate::record::mark::{FLAG_CONTINUED, FLAG_HOST, FLAG_SAMPLED, Mark, MarkKind};
use crate::timing::{Conversion, Resolved, Token};
use crate::vocab::{Layer, Phase, Section, SectionKind, Site, VerifyPart};
use opentelemetry_sdk::trace::SdkTracer;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Most section spans kept for one sampled step (a step that never ends stops collecting).
const STEP_SPANS_MAX: usize = 1 << 16;
/// Most verify-part intervals kept for one sampled round.
const ROUND_PARTS_MAX: usize = 256;
/// Most nested open sections per lane.
const STACK_MAX: usize = 256;

struct Open {
    section: Section,
    site: Site,
    layer: Layer,
    start: u64,
    /// Index into the sampled step's spans.
    span: Option<usize>,
}

struct OpenStep {
    start: u64,
    number: u64,
    /// Sections open when the step began; deeper ones left open at its end are stale.
    depth: usize,
    trace: Option<StepTrace>,
}

pub(crate) struct OpenRound {
    pub(crate) start: u64,
    pub(crate) k: u32,
    pub(crate) seq: u32,
    pub(crate) last: u64,
    pub(crate) phases: [u64; 5],
    pub(crate) trace: Option<RoundTrace>,
}

/// A round that ended; finalized one drain pass later so verify parts recorded on other
/// threads before its end have arrived.
pub(crate) struct EndedRound {
    pub(crate) round: OpenRound,
    pub(crate) end: u64,
    pub(crate) accepted: Option<u32>,
    pub(crate) rank: u32,
    pub(crate) key: (u16, u32),
}

/// Verify parts gathered for one round: totals (kda, kda_scan, mla, ffn) and intervals.
#[derive(Default)]
pub(crate) struct PartsAcc {
    pub(crate) ns: [u64; 4],
    pub(crate) intervals: Vec<(&'static str, u64, u64)>,
}

/// Counters of what the worker saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Marks taken from the buffers and processed.
    pub marks: u64,
    /// Sections timed (begin and end paired).
    pub sections: u64,
    /// Steps timed.
    pub steps: u64,
    /// Rounds finalized.
    pub rounds: u64,
    /// Spans built and handed to the span processor.
    pub spans: u64,
    /// Spans the exporter delivered.
    pub spans_exported: u64,
    /// Spans lost to failed exports (collector down or refusing); counted under
    /// `reason="span_export"`. Spans built but neither exported nor failed after a flush were
    /// dropped by the span processor's full queue.
    pub spans_failed: u64,
    /// Marks dropped because a buffer was full.
    pub dropped_queue_full: u64,
    /// Marks dropped because the clock gave or resolved no time.
    pub dropped_clock: u64,
    /// Marks that did not pair (end without begin, begin never ended, wrong nesting).
    pub dropped_unbalanced: u64,
    /// Values that did not fit a record (expert id above 65535).
    pub dropped_out_of_range: u64,
    /// Spans not built because the span processor's queue was full (exporter slow or down).
    pub dropped_span_queue: u64,
}

/// Everything a lane's marks feed.
pub(crate) struct Sinks<'a> {
    pub(crate) inst: &'a [Instruments],
    pub(crate) tracer: Option<&'a SdkTracer>,
    pub(crate) tally: &'a mut Tally,
    pub(crate) stats: &'a mut Stats,
    pub(crate) parts: &'a mut HashMap<(u16, u32), PartsAcc>,
    pub(crate) ended: &'a mut Vec<EndedRound>,
    pub(crate) expert_counter: bool,
    pub(crate) span_counts: &'a crate::export::SpanCounts,
}

impl Sinks<'_> {
    /// Whether `n` more spans fit the span processor's queue; if not they are not built, and
    /// are counted under `reason="span_queue"` (the processor would drop them uncounted).
    pub(crate) fn span_budget(&mut self, n: usize) -> bool {
        let fits = span_budget(self.stats, self.span_counts, n);
        if !fits {
            self.stats.dropped_span_queue += n as u64;
            for i in self.inst {
                i.dropped(crate::names::drop_reason::SPAN_QUEUE, n as u64);
            }
        }
        fits
    }
}

/// Spans handed to the processor and not yet exported or failed, plus `n`, stay under the
/// processor's queue capacity (less one export batch in flight).
pub(crate) fn span_budget(stats: &Stats, counts: &crate::export::SpanCounts, n: usize) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    let done = counts.exported.load(Relaxed) + counts.failed.load(Relaxed);
    let pending = stats.spans.saturating_sub(done);
    pending + n as u64 <= crate::export::SPAN_QUEUE_BUDGET as u64
}

pub(crate) struct LaneState {
    pub(crate) lane: Arc<Lane>,
    backlog: VecDeque<Mark>,
    stack: Vec<Open>,
    step: Option<OpenStep>,
    steps: u64,
    round: Option<OpenRound>,
    parts_open: Vec<(Mark, u64)>,
    parent: [u64; 3],
    parent_parts: u8,
    last_ns: u64,
    seen: [u64; 3],
    /// The lane's clock is the host clock: its tokens are raw readings the worker converts.
    host: bool,
}

impl LaneState {
    pub(crate) fn new(lane: Arc<Lane>) -> LaneState {
        let host = crate::timing::is_host(lane.clock.as_ref());
        LaneState {
            host,
            lane,
            backlog: VecDeque::new(),
            stack: Vec::new(),
            step: None,
            steps: 0,
            round: None,
            parts_open: Vec::new(),
            parent: [0; 3],
            parent_parts: 0,
            last_ns: 0,
            seen: [0; 3],
        }
    }

    /// Whether the lane's recorder is gone and nothing is left to process.
    pub(crate) fn finished(&self) -> bool {
        self.lane.closed.load(std::sync::atomic::Ordering::Acquire)
            && self.lane.queue.is_empty()
            && self.backlog.is_empty()
    }

    /// Moves the lane's drop counters into the instruments (as deltas).
    pub(crate) fn collect_drops(&mut self, s: &mut Sinks<'_>) {
        use crate::names::drop_reason;
        use std::sync::atomic::Ordering::Relaxed;
        let now = [
            self.lane.dropped_full.load(Relaxed),
            self.lane.dropped_clock.load(Relaxed),
            self.lane.dropped_range.load(Relaxed),
        ];
        let d: [u64; 3] = std::array::from_fn(|i| now[i].saturating_sub(self.seen[i]));
        self.seen = now;
        s.stats.dropped_queue_full += d[0];
        s.stats.dropped_clock += d[1];
        s.stats.dropped_out_of_range += d[2];
        for inst in s.inst {
            inst.dropped(drop_reason::QUEUE_FULL, d[0]);
            inst.dropped(drop_reason::CLOCK, d[1]);
            inst.dropped(drop_reason::OUT_OF_RANGE, d[2]);
        }
    }

    /// Drains the lane and processes marks in order until one is not resolvable yet.
    pub(crate) fn drain(&mut self, s: &mut Sinks<'_>) {
        // The backlog holds marks a deferred clock has not resolved yet; it never outgrows the
        // lane, so a lane costs at most twice its capacity in memory.
        let max = self.lane.queue.capacity();
        while self.backlog.len() < max {
            match self.lane.pop() {
                Some(m) => self.backlog.push_back(m),
                None => break,
            }
        }
        if self.backlog.is_empty() {
            return;
        }
        // Host readings are raw (TSC ticks where the CPU has an invariant TSC): one snapshot of
        // the calibration converts this drain's marks.
        let host = Conversion::current();
        while let Some(m) = self.backlog.front().copied() {
            let t = match m.kind {
                MarkKind::Wait
                | MarkKind::Route
                | MarkKind::ParentHi
                | MarkKind::ParentLo
                | MarkKind::ParentSpan => 0,
                _ if self.host || m.flag & FLAG_HOST != 0 => host.to_ns(m.token),
                _ => match self.lane.clock.resolve(Token(m.token)) {
                    Resolved::At(ns) => {
                        self.lane.clock.release(Token(m.token));
                        ns
                    }
                    Resolved::Pending => break,
                    Resolved::Failed => {
                        self.lane.clock.release(Token(m.token));
                        self.backlog.pop_front();
                        s.stats.marks += 1;
                        s.stats.dropped_clock += 1;
                        for inst in s.inst {
                            inst.dropped(crate::names::drop_reason::CLOCK, 1);
                        }
                        continue;
                    }
                },
            };
            self.backlog.pop_front();
            s.stats.marks += 1;
            if t != 0 {
                self.last_ns = t;
            }
            self.process(m, t, s);
        }
    }

    fn unbalanced(s: &mut Sinks<'_>, n: u64) {
        s.stats.dropped_unbalanced += n;
        for inst in s.inst {
            inst.dropped(crate::names::drop_reason::UNBALANCED, n);
        }
    }

    fn process(&mut self, m: Mark, t: u64, s: &mut Sinks<'_>) {
        let rank = self.lane.rank;
        match m.kind {
            MarkKind::ParentHi | MarkKind::ParentLo | MarkKind::ParentSpan => {
                let i = m.kind as usize - MarkKind::ParentHi as usize;
                self.parent[i] = m.token;
                self.parent_parts |= 1 << i;
            }
            MarkKind::StepBegin => {
                if self.step.is_some() {
                    Self::unbalanced(s, 1);
                }
                let sampled = m.flag & FLAG_SAMPLED != 0 && s.tracer.is_some();
                let parent = (self.parent_parts == 7).then(|| {
                    (
                        (u128::from(self.parent[0]) << 64) | u128::from(self.parent[1]),
                        self.parent[2],
                    )
                });
                self.parent_parts = 0;
                self.steps += 1;
                self.step = Some(OpenStep {
                    start: t,
                    number: self.steps - 1,
                    depth: self.stack.len(),
                    trace: sampled.then(|| StepTrace {
                        parent,
                        ..StepTrace::default()
                    }),
                });
            }
            MarkKind::StepEnd => {
                let Some(step) = self.step.take() else {
                    Self::unbalanced(s, 1);
                    return;
                };
                // A section begun in this step whose end was lost (a full buffer) would otherwise
                // sit on the stack and pair with a later end of the same section.
                if self.stack.len() > step.depth {
                    Self::unbalanced(s, (self.stack.len() - step.depth) as u64);
                    self.stack.truncate(step.depth);
                }
                let ns = t.saturating_sub(step.start);
                for inst in s.inst {
                    inst.step(rank, ns as f64 * 1e-9);
                }
                s.stats.steps += 1;
                s.tally.steps += 1;
                s.tally.step_ns += ns;
                s.tally.ranks.insert(rank);
                if let (Some(trace), Some(tracer)) = (step.trace, s.tracer)
                    && s.span_budget(spans::step_span_count(&trace))
                {
                    s.stats.spans += spans::build_step(
                        tracer,
                        &trace,
                        rank,
                        step.number,
                        step.start,
                        t,
                        self.lane.clock.name(),
                    ) as u64;
                }
            }
            MarkKind::SectionBegin => {
                if self.stack.len() >= STACK_MAX {
                    Self::unbalanced(s, 1);
                    return;
                }
                let section = Section::from_id(m.id);
                let site = Site::from_id(m.site);
                let layer = Layer(m.layer);
                let parent = self.stack.last().and_then(|o| o.span);
                let span = self
                    .step
                    .as_mut()
                    .and_then(|st| st.trace.as_mut())
                    .filter(|tr| tr.sections.len() < STEP_SPANS_MAX)
                    .map(|tr| {
                        tr.sections.push(SectionSpan {
                            section,
                            layer,
                            site,
                            start: t,
                            end: None,
                            parent,
                        });
                        tr.sections.len() - 1
                    });
                self.stack.push(Open {
                    section,
                    site,
                    layer,
                    start: t,
                    span,
                });
            }
            MarkKind::SectionEnd => {
                let Some(pos) = self.stack.iter().rposition(|o| o.section.id() == m.id) else {
                    Self::unbalanced(s, 1);
                    return;
                };
                let inner = self.stack.len() - 1 - pos;
                if inner > 0 {
                    // Sections opened inside this one and never ended.
                    self.stack.truncate(pos + 1);
                    Self::unbalanced(s, inner as u64);
                }
                let Some(open) = self.stack.pop() else {
                    return;
                };
                let ns = t.saturating_sub(open.start);
                let secs = ns as f64 * 1e-9;
                for inst in s.inst {
                    inst.section(open.section, open.layer, open.site, rank, secs);
                    if open.section.kind() == SectionKind::Probe {
                        inst.wait(open.site, open.layer, rank, secs);
                    }
                }
                s.stats.sections += 1;
                s.tally.add(open.section, ns, !self.stack.is_empty());
                if let (Some(i), Some(tr)) = (
                    open.span,
                    self.step.as_mut().and_then(|st| st.trace.as_mut()),
                ) && let Some(sp) = tr.sections.get_mut(i)
                {
                    sp.end = Some(t);
                }
            }
            MarkKind::Wait => {
                for inst in s.inst {
                    inst.wait(
                        Site::from_id(m.site),
                        Layer(m.layer),
                        rank,
                        m.token as f64 * 1e-9,
                    );
                }
            }
            MarkKind::Route => {
                let n = (m.site as usize).min(4);
                let ids: [u16; 4] = std::array::from_fn(|i| (m.token >> (16 * i)) as u16);
                let continued = m.flag & FLAG_CONTINUED != 0;
                if s.expert_counter {
                    for inst in s.inst {
                        for &id in &ids[..n] {
                            inst.expert(Layer(m.layer), id);
                        }
                    }
                }
                let at = self.last_ns;
                if let Some(tr) = self.step.as_mut().and_then(|st| st.trace.as_mut()) {
                    match tr.routes.last_mut() {
                        Some((l, v, _)) if continued && *l == Layer(m.layer) => {
                            v.extend_from_slice(&ids[..n]);
                        }
                        _ => tr.routes.push((Layer(m.layer), ids[..n].to_vec(), at)),
                    }
                }
            }
            MarkKind::RoundBegin => {
                if self.round.take().is_some() {
                    // A round never ended: its phases are lost, counted.
                    Self::unbalanced(s, 1);
                }
                let sampled = m.flag & FLAG_SAMPLED != 0 && s.tracer.is_some();
                self.round = Some(OpenRound {
                    start: t,
                    k: m.layer,
                    seq: (u32::from(m.id) << 16) | u32::from(m.site),
                    last: t,
                    phases: [0; 5],
                    trace: sampled.then(RoundTrace::default),
                });
            }
            MarkKind::Phase => {
                let (Some(r), Some(phase)) = (self.round.as_mut(), Phase::from_u8(m.id as u8))
                else {
                    Self::unbalanced(s, 1);
                    return;
                };
                let ns = t.saturating_sub(r.last);
                r.phases[phase as usize] += ns;
                if let Some(tr) = r.trace.as_mut() {
                    tr.phases.push((phase, r.last, t));
                }
                r.last = t;
            }
            MarkKind::RoundEnd => {
                let Some(round) = self.round.take() else {
                    Self::unbalanced(s, 1);
                    return;
                };
                let accepted = (m.layer != u32::MAX).then_some(m.layer);
                if accepted.is_none() {
                    Self::unbalanced(s, 1);
                }
                let key = (self.lane.id, round.seq);
                s.ended.push(EndedRound {
                    round,
                    end: t,
                    accepted,
                    rank,
                    key,
                });
            }
            MarkKind::PartBegin => {
                if self.parts_open.len() >= STACK_MAX {
                    // The oldest open part never ended (its round is long gone): give it up.
                    self.parts_open.remove(0);
                    Self::unbalanced(s, 1);
                }
                self.parts_open.push((m, t));
            }
            MarkKind::PartEnd => {
                let Some(pos) = self
                    .parts_open
                    .iter()
                    .rposition(|(b, _)| b.id == m.id && b.site == m.site && b.layer == m.layer)
                else {
                    Self::unbalanced(s, 1);
                    return;
                };
                let (b, start) = self.parts_open.remove(pos);
                let Some(part) = VerifyPart::from_u8(b.id as u8) else {
                    Self::unbalanced(s, 1);
                    return;
                };
                let acc = s.parts.entry((b.site, b.layer)).or_default();
                acc.ns[part as usize] += t.saturating_sub(start);
                if acc.intervals.len() < ROUND_PARTS_MAX {
                    acc.intervals.push((part.as_str(), start, t));
                }
            }
        }
    }
}
