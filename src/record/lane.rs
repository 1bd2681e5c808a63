//! A per-recorder bounded buffer of marks, drained by the worker.
//!
//! One lane per [`crate::Recorder`] (one per engine thread): the hot path is its only producer,
//! the worker its only consumer, so a push is uncontended. A full lane drops the mark and counts.

use super::mark::Mark;
use super::ring::Ring;
use crate::names::DropReason;
use crate::timing::Clock;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, Ordering::Relaxed};

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
    /// The latest step whose end mark was lost: (losses so far) << 32 | step index; 0: none.
    /// Written only on that failure path, read by the worker once per drain.
    step_end_lost: AtomicU64,
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
            step_end_lost: AtomicU64::new(0),
        }
    }

    /// The end mark of step `index` was lost (a full queue; counted there).
    pub(crate) fn step_end_lost(&self, index: u32) {
        // 1 to u32::MAX, so that the value is never 0 ("none").
        let losses = (self.step_end_lost.load(Relaxed) >> 32) % u64::from(u32::MAX) + 1;
        // Release: the worker that sees this sees the step's begin mark in the queue too.
        self.step_end_lost
            .store((losses << 32) | u64::from(index), Ordering::Release);
    }

    /// The latest lost step end: (a value that changes with each loss, step index); `None`
    /// when no step end was ever lost.
    pub(crate) fn last_lost_step_end(&self) -> Option<(u64, u32)> {
        let v = self.step_end_lost.load(Ordering::Acquire);
        (v != 0).then_some((v, v as u32))
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
            self.queue_full()
        }
    }

    /// A push found the queue full: counts the drop, off the inlined hot path.
    #[cold]
    #[inline(never)]
    fn queue_full(&self) -> bool {
        self.count_drop(DropReason::QueueFull);
        false
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
