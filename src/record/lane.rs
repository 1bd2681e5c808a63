//! A per-recorder bounded buffer of marks, drained by the worker.
//!
//! One lane per [`crate::Recorder`] (one per engine thread): the hot path is its only producer,
//! the worker its only consumer, so a push is uncontended. A full lane drops the mark and counts.

use super::mark::Mark;
use super::ring::Ring;
use crate::names::DropReason;
use crate::timing::Clock;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

pub(crate) struct Lane {
    pub(crate) id: u16,
    pub(crate) rank: u32,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) queue: Ring,
    /// Drops on the hot path, by [`DropReason::index`] (full queue, no clock token, expert id
    /// out of range); the worker moves them into the stats and the instrument.
    dropped: [AtomicU64; DropReason::COUNT],
    /// The recorder is gone: drain what is left, then forget the lane.
    pub(crate) closed: AtomicBool,
}

impl Lane {
    pub(crate) fn new(id: u16, rank: u32, clock: Arc<dyn Clock>, capacity: usize) -> Lane {
        Lane {
            id,
            rank,
            clock,
            queue: Ring::new(capacity),
            dropped: std::array::from_fn(|_| AtomicU64::new(0)),
            closed: AtomicBool::new(false),
        }
    }

    /// Stores a mark; a full queue drops and counts it. Never blocks.
    ///
    /// Called only by the lane's recorder: one producer, as [`Ring::push`] requires.
    #[inline]
    pub(crate) fn push(&self, m: Mark) -> bool {
        // SAFETY: a lane is pushed to by its one recorder only (`Recorder` owns the lane's
        // producer side and is not `Sync`).
        if unsafe { self.queue.push(m) } {
            true
        } else {
            self.count_drop(DropReason::QueueFull);
            false
        }
    }

    /// Counts one record dropped on the hot path.
    #[inline]
    pub(crate) fn count_drop(&self, reason: DropReason) {
        self.dropped[reason.index()].fetch_add(1, Relaxed);
    }

    /// Hot-path drops so far, by [`DropReason::index`].
    pub(crate) fn drops(&self) -> [u64; DropReason::COUNT] {
        std::array::from_fn(|i| self.dropped[i].load(Relaxed))
    }

    /// Takes the oldest mark. Called only by the worker's pipeline, under its mutex.
    #[inline]
    pub(crate) fn pop(&self) -> Option<Mark> {
        // SAFETY: every drain runs under the pipeline's mutex, and a lane has one `LaneState`:
        // one consumer at a time, as [`Ring::pop`] requires.
        unsafe { self.queue.pop() }
    }
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("id", &self.id)
            .field("rank", &self.rank)
            .field("clock", &self.clock.timing())
            .field("len", &self.queue.len())
            .field("capacity", &self.queue.capacity())
            .finish()
    }
}
