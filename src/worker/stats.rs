//! The worker's own counters, as [`crate::Profiler::stats`] returns them: what pairing saw
//! (marks, sections, steps, rounds, graph replays), what was dropped (counted by the metrics
//! sink, the same counts as `phasetrace.records.dropped`) and what the span sink built.

use crate::names::DropReason;

/// Records dropped, by reason: `stats.dropped[DropReason::QueueFull]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Dropped([u64; DropReason::COUNT]);

impl Dropped {
    /// Records dropped for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        self.0[reason.index()]
    }

    /// Records dropped for any reason.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Every reason with its count, in [`DropReason::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.into_iter().map(|r| (r, self.get(r)))
    }

    pub(crate) fn add(&mut self, reason: DropReason, n: u64) {
        self.0[reason.index()] += n;
    }
}

impl std::ops::Index<DropReason> for Dropped {
    type Output = u64;

    fn index(&self, reason: DropReason) -> &u64 {
        &self.0[reason.index()]
    }
}

/// Counters of what the worker saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Spans lost to failed exports (collector down or refusing), read live from the exporter;
    /// the worker counts them under `reason="span_export"` on its next pass. Spans built but
    /// neither exported nor failed after a flush were dropped by the span processor's full
    /// queue.
    pub spans_failed: u64,
    /// Records dropped, by reason (the same counts as `phasetrace.records.dropped{reason}`).
    pub dropped: Dropped,
    /// Steps and rounds traced because they were slower than `PHASETRACE_TRACE_SLOWER_THAN`.
    pub tail_traces: u64,
    /// Requests of an internal kind ([`crate::RequestKind::internal`]: warm-up, health)
    /// that ended: left out of every request figure, counted here.
    pub internal_requests: u64,
    /// CUDA-graph replays read and attributed ([`crate::Recorder::replay`]).
    pub graph_replays: u64,
    /// CUDA-graph replays detected and counted but not attributed: a later launch re-recorded
    /// their events before the worker read them, or the graph was dropped first. Their
    /// boundaries are counted under `reason="graph_replay"`.
    pub dropped_graph_replays: u64,
}
