//! The console sink: per-section totals for the summary table (printed every
//! `PHASETRACE_SUMMARY_EVERY` steps per rank, at shutdown, and by [`crate::Profiler::summary`]),
//! and per-window phase totals for the speculative lines (every
//! `PHASETRACE_SPEC_SUMMARY_EVERY` rounds).
//!
//! Per-step figures are labelled `ms/step`; per-token figures (`ms/token`) are step time over
//! the output tokens the steps produced ([`crate::Recorder::serve`]), by step kind, and appear
//! only where those tokens are known.
//!
//! ```text
//! Section ──> Tally.add      Step ──> Tally.step     Drained ──> summary table, when due
//! Round ──> SpecTally.add ──> the spec lines, when due
//! ```

use crate::vocab::{Phase, Section, StepKind};
use crate::worker::event::{Event, VerifySplit};
use std::io::Write;

/// The console summary's and spec lines' totals, and when to print them.
pub(crate) struct ConsoleSink {
    tally: Tally,
    spec: SpecTally,
    /// Steps per rank between summaries; 0: none.
    summary_every: u64,
    /// Rounds between spec lines; 0: none.
    spec_summary_every: u64,
    next_summary: u64,
}

impl ConsoleSink {
    pub(crate) fn new(summary_every: u64, spec_summary_every: u64) -> ConsoleSink {
        ConsoleSink {
            tally: Tally::default(),
            spec: SpecTally::default(),
            summary_every,
            spec_summary_every,
            next_summary: summary_every,
        }
    }

    /// Sections (most events) are tallied inline; the rest out of line.
    #[inline(always)]
    pub(crate) fn on(&mut self, e: &Event<'_>) {
        match e {
            Event::Section {
                section,
                ns,
                nested,
                ..
            } => self.tally.add(*section, *ns, *nested),
            Event::Wait { .. }
            | Event::Route { .. }
            | Event::Dropped { .. }
            | Event::RequestTraced(_) => {}
            Event::Step(_) | Event::Round(_) | Event::Drained | Event::Request(_) => {
                self.on_other(e)
            }
        }
    }

    #[inline(never)]
    fn on_other(&mut self, e: &Event<'_>) {
        match e {
            Event::Step(s) => {
                self.tally.step(s.rank, s.ns);
                self.tally.by_kind(s.kind, s.ns, s.outputs);
                if !s.batch.is_empty() {
                    self.tally.requests.batch(s.batch.len());
                }
            }
            Event::Request(r) => self.tally.requests.add(r),
            Event::Round(r) => {
                let sp = &mut self.spec;
                sp.add(r.k, &r.phases, &r.split.unwrap_or_default());
                if self.spec_summary_every > 0 && sp.rounds >= self.spec_summary_every {
                    let line = spec_lines(sp, r.split.is_some());
                    let _ = std::io::stderr().write_all(line.as_bytes());
                    *sp = SpecTally::default();
                }
            }
            Event::Drained => self.maybe_print_summary(),
            Event::Section { .. }
            | Event::Wait { .. }
            | Event::Route { .. }
            | Event::RequestTraced(_)
            | Event::Dropped { .. } => {}
        }
    }

    fn maybe_print_summary(&mut self) {
        if self.summary_every == 0 || self.tally.steps < self.next_summary {
            return;
        }
        let ranks = self.tally.ranks.len().max(1) as u64;
        while self.next_summary <= self.tally.steps {
            self.next_summary += self.summary_every * ranks;
        }
        let text = summary_table(&self.tally);
        let _ = std::io::stderr().write_all(text.as_bytes());
    }

    pub(crate) fn tally(&self) -> &Tally {
        &self.tally
    }
}

/// One row of the console summary.
struct SummaryRow {
    section: Section,
    ns: u64,
    calls: u64,
    nested: bool,
}

/// The summary header's step count: per rank when all ranks ran as many steps, else the
/// range over ranks.
fn steps_per_rank(t: &Tally) -> String {
    let min = t.ranks.values().copied().min().unwrap_or(0);
    let max = t.ranks.values().copied().max().unwrap_or(0);
    match t.ranks.len() {
        0 | 1 => format!("{} steps", t.steps),
        n if min == max => format!("{max} steps x {n} ranks (per rank)"),
        n => format!("{} steps over {n} ranks ({min} to {max} per rank)", t.steps),
    }
}

/// The summary's line of steps by kind, once a step stated a kind or produced known tokens:
/// each kind's steps, ms/step and, where its steps produced tokens, ms/token.
fn kinds_line(t: &Tally) -> Option<String> {
    use std::fmt::Write as _;
    let stated = t.kinds[1..].iter().any(|k| k.steps > 0);
    if !stated && t.kinds[0].outputs == 0 {
        return None;
    }
    let mut line = String::from("  steps by kind:");
    let names = std::iter::once("unstated").chain(StepKind::ALL.iter().map(|k| k.as_str()));
    let mut first = true;
    for (name, k) in names.zip(&t.kinds) {
        if k.steps == 0 {
            continue;
        }
        let _ = write!(
            line,
            "{} {name} {} at {:.3} ms/step",
            if first { "" } else { ";" },
            k.steps,
            k.ns as f64 / 1e6 / k.steps as f64,
        );
        first = false;
        if k.outputs > 0 {
            let _ = write!(
                line,
                ", {:.3} ms/token over {} tokens",
                k.ns as f64 / 1e6 / k.outputs as f64,
                k.outputs
            );
        }
    }
    line.push('\n');
    Some(line)
}

/// The console summary: its title line, the steps by kind (ms/step, and ms/token where the
/// tokens are known) and the requests, then the table, per bucket ms/step, share %,
/// calls/step, µs/call, sorted.
pub(crate) fn summary_table(t: &Tally) -> String {
    use std::fmt::Write as _;
    let steps = t.steps.max(1) as f64;
    let top: u64 = t.sections.iter().filter(|s| !s.nested).map(|s| s.ns).sum();
    let mut rows: Vec<SummaryRow> = t
        .sections
        .iter()
        .enumerate()
        .filter(|(_, s)| s.calls > 0)
        .map(|(i, s)| SummaryRow {
            section: Section::from_id(i as u16),
            ns: s.ns,
            calls: s.calls,
            nested: s.nested,
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.ns));
    let mut out = String::new();
    let outputs: u64 = t.kinds.iter().map(|k| k.outputs).sum();
    let per_token = if outputs > 0 {
        format!(
            ", {:.3} ms/token over {outputs} output tokens",
            t.step_ns as f64 / 1e6 / outputs as f64
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "phasetrace decode profile after {}: {:.3} ms/step in sections, {:.3} ms/step{per_token}",
        steps_per_rank(t),
        top as f64 / 1e6 / steps,
        t.step_ns as f64 / 1e6 / steps,
    );
    // The lines of steps by kind and of requests, then the table: its header and its rows.
    if let Some(line) = kinds_line(t) {
        out.push_str(&line);
    }
    if let Some(line) = t.requests.line() {
        out.push_str(&line);
    }
    let _ = writeln!(
        out,
        "  {:<16} {:>10} {:>7} {:>10} {:>10}",
        "bucket", "ms/step", "share", "calls/step", "us/call"
    );
    for r in rows {
        let name = r.section.as_str();
        let _ = writeln!(
            out,
            "  {:<16} {:>10.3} {:>6.1}% {:>10.2} {:>10.1}",
            if r.nested {
                format!(" ↳{name}")
            } else {
                name.to_owned()
            },
            r.ns as f64 / 1e6 / steps,
            100.0 * r.ns as f64 / top.max(1) as f64,
            r.calls as f64 / steps,
            r.ns as f64 / 1e3 / r.calls.max(1) as f64,
        );
    }
    out
}

/// The speculative console lines: phases per round, and the verify sub-split at level 2.
pub(crate) fn spec_lines(sp: &SpecTally, split: bool) -> String {
    let per = |ns: u64| ns as f64 / 1e6 / sp.rounds.max(1) as f64;
    let ms = |ns: u64| ns as f64 / 1e6;
    let total: u64 = sp.phases.iter().sum();
    let (draft, verify, accept, roll, maint) = (
        sp.phase(Phase::Draft),
        sp.phase(Phase::Verify),
        sp.phase(Phase::Accept),
        sp.phase(Phase::Rollback),
        sp.phase(Phase::Maint),
    );
    let mut s = format!(
        "[phasetrace-spec] rounds={} k={} total={:.2}ms | draft={:.2} verify={:.2} accept={:.2} roll={:.2} maint={:.2} | per-round ms: draft={:.3} verify={:.3} accept={:.3} roll={:.3} maint={:.3} total={:.3}\n",
        sp.rounds,
        sp.k,
        ms(total),
        ms(draft),
        ms(verify),
        ms(accept),
        ms(roll),
        ms(maint),
        per(draft),
        per(verify),
        per(accept),
        per(roll),
        per(maint),
        per(total)
    );
    if split {
        let v = &sp.split;
        s += &format!(
            "[phasetrace-spec-v] rounds={} k={} | per-round ms: vkda={:.3} (scan={:.3}) vmla={:.3} vrest={:.3} (vffn={:.3})\n",
            sp.rounds,
            sp.k,
            per(v.kda),
            per(v.kda_scan),
            per(v.mla),
            per(v.rest),
            per(v.ffn)
        );
    }
    s
}

/// One section's totals for the console summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SectionTally {
    pub(crate) ns: u64,
    pub(crate) calls: u64,
    /// Ever recorded inside another section.
    pub(crate) nested: bool,
}

/// Per-section totals for the console summary.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    /// Indexed by section id.
    pub(crate) sections: Vec<SectionTally>,
    /// Steps of all ranks.
    pub(crate) steps: u64,
    pub(crate) step_ns: u64,
    /// Steps per rank.
    pub(crate) ranks: std::collections::BTreeMap<u32, u64>,
    /// Steps by kind: none stated, then `StepKind::ALL`.
    pub(crate) kinds: [KindTally; 1 + StepKind::ALL.len()],
    /// The requests' figures.
    pub(crate) requests: RequestTally,
}

/// The most recent requests whose times the summary's percentiles are taken over.
const REQUEST_WINDOW: usize = 4096;

/// The requests' figures for the summary's request line: counts, and the recent requests'
/// times for percentiles.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestTally {
    pub(crate) done: u64,
    pub(crate) failed: u64,
    pub(crate) outputs: u64,
    batch_sum: u64,
    batch_steps: u64,
    ttft: std::collections::VecDeque<u64>,
    tpot: std::collections::VecDeque<u64>,
    queue: std::collections::VecDeque<u64>,
}

impl RequestTally {
    fn keep(q: &mut std::collections::VecDeque<u64>, v: Option<u64>) {
        if let Some(v) = v {
            if q.len() >= REQUEST_WINDOW {
                q.pop_front();
            }
            q.push_back(v);
        }
    }

    pub(crate) fn add(&mut self, r: &crate::worker::event::Request) {
        self.done += 1;
        self.outputs += r.outputs;
        if r.finish.error_type().is_some() {
            self.failed += 1;
        } else {
            Self::keep(&mut self.ttft, r.ttft_ns());
            Self::keep(&mut self.tpot, r.tpot_ns());
        }
        Self::keep(&mut self.queue, r.queue_ns());
    }

    pub(crate) fn batch(&mut self, n: usize) {
        self.batch_sum += n as u64;
        self.batch_steps += 1;
    }

    /// The `q` percentile (nearest rank) of `v`, in ms.
    fn ms(v: &std::collections::VecDeque<u64>, q: f64) -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        let mut s: Vec<u64> = v.iter().copied().collect();
        s.sort_unstable();
        let i = ((q / 100.0) * s.len() as f64).ceil() as usize;
        s[i.clamp(1, s.len()) - 1] as f64 / 1e6
    }

    /// The summary's request line, once a request ended or a step served one.
    pub(crate) fn line(&self) -> Option<String> {
        if self.done == 0 && self.batch_steps == 0 {
            return None;
        }
        Some(format!(
            "  requests: {} done ({} failed), {} output tokens; TTFT p50 {:.1} ms p99 {:.1} ms; TPOT p50 {:.2} ms p99 {:.2} ms; queue p50 {:.1} ms; batch {:.1} requests/step\n",
            self.done,
            self.failed,
            self.outputs,
            Self::ms(&self.ttft, 50.0),
            Self::ms(&self.ttft, 99.0),
            Self::ms(&self.tpot, 50.0),
            Self::ms(&self.tpot, 99.0),
            Self::ms(&self.queue, 50.0),
            self.batch_sum as f64 / self.batch_steps.max(1) as f64,
        ))
    }
}

impl Tally {
    pub(crate) fn add(&mut self, s: Section, ns: u64, nested: bool) {
        let i = s.id() as usize;
        if self.sections.len() <= i {
            self.sections.resize(i + 1, SectionTally::default());
        }
        let e = &mut self.sections[i];
        e.ns += ns;
        e.calls += 1;
        e.nested |= nested;
    }

    /// A step of `kind` that took `ns` and produced `outputs` tokens (0: none known).
    pub(crate) fn by_kind(&mut self, kind: Option<StepKind>, ns: u64, outputs: u64) {
        // Codes 1 to 4, in the order of `StepKind::ALL`; 0 is "none stated".
        let k = &mut self.kinds[kind.map_or(0, |k| k as usize)];
        k.steps += 1;
        k.ns += ns;
        k.outputs += outputs;
    }

    pub(crate) fn step(&mut self, rank: u32, ns: u64) {
        self.steps += 1;
        self.step_ns += ns;
        *self.ranks.entry(rank).or_default() += 1;
    }
}

/// The steps of one kind, for the summary's line by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KindTally {
    pub(crate) steps: u64,
    pub(crate) ns: u64,
    /// Output tokens its steps' batches got.
    pub(crate) outputs: u64,
}

/// Per-round-window totals for the speculative console line.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecTally {
    pub(crate) rounds: u64,
    pub(crate) k: u32,
    /// Indexed by `Phase`.
    pub(crate) phases: [u64; Phase::ALL.len()],
    pub(crate) split: VerifySplit,
}

impl SpecTally {
    pub(crate) fn add(&mut self, k: u32, phases: &[u64; Phase::ALL.len()], split: &VerifySplit) {
        self.rounds += 1;
        self.k = self.k.max(k);
        for (acc, v) in self.phases.iter_mut().zip(phases) {
            *acc += v;
        }
        self.split.add(split);
    }

    pub(crate) fn phase(&self, p: Phase) -> u64 {
        self.phases[p as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's header is followed by its rows: the lines of steps by kind and of requests
    /// come before it.
    #[test]
    fn the_header_is_followed_by_the_rows() {
        let mut t = Tally::default();
        t.add(Section::from_id(0), 2_000_000, false);
        t.step(0, 3_000_000);
        t.by_kind(Some(StepKind::ALL[0]), 3_000_000, 4);
        t.requests.batch(4);
        let text = summary_table(&t);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(
            lines[0].starts_with("phasetrace decode profile after 1 steps"),
            "{text}"
        );
        assert!(lines[1].starts_with("  steps by kind:"), "{text}");
        assert!(lines[2].starts_with("  requests: 0 done"), "{text}");
        assert!(lines[3].trim_start().starts_with("bucket"), "{text}");
        assert!(
            lines[4]
                .trim_start()
                .starts_with(Section::from_id(0).as_str()),
            "{text}"
        );
    }
}
