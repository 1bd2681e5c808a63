//! Open steps: how long each rank's current decode step has been open, for
//! `phasetrace.step.open_duration` (the hang signal: a step that began and has not ended).
//!
//! ```text
//! LaneState (end of each drain) ──since (ns, one relaxed store)──> OpenCell (one per lane)
//! collection ──> OpenSteps::each ──(rank: max over its lanes of now - since)──> observable gauge
//! ```
//!
//! The worker is each cell's only writer; a collection (a scrape or an OTLP export) reads the
//! cells concurrently and computes the durations at its own time, so the gauge grows between
//! drains, and keeps growing if the worker itself were stuck. A lane's `since` is the time its
//! open step began (the step-begin mark's time on the [`crate::timing::now_ns`] timeline) or,
//! with a deferred clock whose oldest mark is not resolved yet, when the worker first found that
//! mark pending (a stream that never reaches its events: a hung GPU), whichever is earlier; none
//! when neither. The table is locked when a lane is adopted or forgotten and at collection,
//! never on the hot path (the engine's recorder) nor per mark.

use super::attrs::rank_attr;
use opentelemetry::KeyValue;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// A cell's `since` when no step is open and no mark is pending.
const NONE: u64 = u64::MAX;

/// One lane's open step.
struct OpenCell {
    rank: u32,
    since: AtomicU64,
}

/// The open steps of every lane of one profiler, shared by all its meter providers.
pub(crate) struct OpenSteps {
    /// `group` on every series.
    group: KeyValue,
    cells: Mutex<Vec<Arc<OpenCell>>>,
}

impl OpenSteps {
    pub(crate) fn new(group: KeyValue) -> Arc<OpenSteps> {
        Arc::new(OpenSteps {
            group,
            cells: Mutex::default(),
        })
    }

    /// A cell for a new lane of `rank`, listed until the slot is dropped.
    pub(super) fn slot(self: &Arc<Self>, rank: u32) -> OpenSlot {
        let cell = Arc::new(OpenCell {
            rank,
            since: AtomicU64::new(NONE),
        });
        self.cells
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(cell.clone());
        OpenSlot {
            table: self.clone(),
            cell,
        }
    }

    /// Calls `f(attributes, seconds)` once per rank with a lane: the longest of its lanes' open
    /// steps at `now` (ns on the [`crate::timing::now_ns`] timeline), 0 when none is open.
    pub(crate) fn each_at(&self, now: u64, mut f: impl FnMut(&[KeyValue], f64)) {
        // (rank, longest open ns); a process has a few ranks.
        let mut ranks: Vec<(u32, u64)> = Vec::new();
        {
            let cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
            for c in cells.iter() {
                let since = c.since.load(Relaxed);
                let ns = if since == NONE {
                    0
                } else {
                    now.saturating_sub(since)
                };
                match ranks.iter_mut().find(|(r, _)| *r == c.rank) {
                    Some((_, max)) => *max = (*max).max(ns),
                    None => ranks.push((c.rank, ns)),
                }
            }
        }
        ranks.sort_unstable_by_key(|(r, _)| *r);
        for (rank, ns) in ranks {
            f(
                &[rank_attr(rank), self.group.clone()],
                crate::worker::secs(ns),
            );
        }
    }

    /// [`OpenSteps::each_at`] now.
    pub(crate) fn each(&self, f: impl FnMut(&[KeyValue], f64)) {
        self.each_at(crate::timing::now_ns(), f)
    }
}

/// A lane's cell in the table; dropping it (the lane is forgotten: its recorder is gone and
/// its marks processed) removes the lane's series.
pub(super) struct OpenSlot {
    table: Arc<OpenSteps>,
    cell: Arc<OpenCell>,
}

impl OpenSlot {
    /// The lane's open step began at `since` (or its oldest mark has been pending since then);
    /// `None`: no step open, nothing pending. Single writer: the worker.
    #[inline]
    pub(super) fn set(&self, since: Option<u64>) {
        self.cell
            .since
            .store(since.map_or(NONE, |s| s.min(NONE - 1)), Relaxed);
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        let mut cells = self.table.cells.lock().unwrap_or_else(|p| p.into_inner());
        cells.retain(|c| !Arc::ptr_eq(c, &self.cell));
    }
}
