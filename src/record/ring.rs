//! A bounded single-producer, single-consumer ring of marks: the per-recorder buffer.
//!
//! The producer is the lane's [`crate::Recorder`] (one per lane, `Send` but not `Sync`, so one
//! thread at a time); the consumer is the worker's pipeline, which drains every lane under one
//! mutex. With one writer per index, a push is a relaxed load, a slot write and a release store:
//! no compare-and-swap, no lock. Full: the push fails and the caller counts the drop.

use super::mark::Mark;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keeps the producer's and the consumer's indices on separate cache lines.
#[repr(align(64))]
struct Padded<T>(T);

pub(crate) struct Ring {
    slots: Box<[UnsafeCell<MaybeUninit<Mark>>]>,
    mask: usize,
    /// Next slot the consumer reads; written by the consumer only.
    head: Padded<AtomicUsize>,
    /// Next slot the producer writes; written by the producer only.
    tail: Padded<AtomicUsize>,
    /// The producer's last view of `head`, so a push reads the consumer's line only when the
    /// ring looks full; producer only.
    head_seen: Padded<AtomicUsize>,
}

// SAFETY: slots are written only by the single producer at `tail` before publishing it with a
// release store, and read only by the single consumer below the `tail` it acquired, then released
// back through `head`: no slot is ever accessed by both sides at once. `Mark` is `Copy`.
unsafe impl Sync for Ring {}
// SAFETY: as above; the ring owns plain data.
unsafe impl Send for Ring {}

impl Ring {
    /// A ring of at least `capacity` marks (rounded up to a power of two, at least 2).
    pub(crate) fn new(capacity: usize) -> Ring {
        let cap = capacity.max(2).next_power_of_two();
        Ring {
            slots: (0..cap)
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
            mask: cap - 1,
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            head_seen: Padded(AtomicUsize::new(0)),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Marks stored and not consumed yet (a snapshot).
    pub(crate) fn len(&self) -> usize {
        let head = self.head.0.load(Ordering::Acquire);
        let tail = self.tail.0.load(Ordering::Acquire);
        tail.wrapping_sub(head)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores `m`, or returns `false` when the ring is full. Never blocks.
    ///
    /// # Safety
    /// Only one thread may push at a time: the lane's recorder, which is not `Sync`.
    #[inline]
    pub(crate) unsafe fn push(&self, m: Mark) -> bool {
        let tail = self.tail.0.load(Ordering::Relaxed);
        if tail.wrapping_sub(self.head_seen.0.load(Ordering::Relaxed)) > self.mask {
            let head = self.head.0.load(Ordering::Acquire);
            self.head_seen.0.store(head, Ordering::Relaxed);
            if tail.wrapping_sub(head) > self.mask {
                return false;
            }
        }
        // SAFETY: `tail & mask` is below `mask + 1`, the number of slots (`new`), so the index
        // needs no bounds check; the slot at `tail` is free (fewer than `capacity` marks are
        // unconsumed) and only this producer writes it until the release store below publishes it.
        unsafe { (*self.slots.get_unchecked(tail & self.mask).get()).write(m) };
        self.tail.0.store(tail.wrapping_add(1), Ordering::Release);
        true
    }

    /// Takes the oldest mark, if any.
    ///
    /// # Safety
    /// Only one thread may pop at a time: the worker, whose pipeline mutex serializes drains.
    #[inline]
    pub(crate) unsafe fn pop(&self) -> Option<Mark> {
        let head = self.head.0.load(Ordering::Relaxed);
        let tail = self.tail.0.load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        // SAFETY: `head < tail`, so the producer wrote and published this slot (acquire above),
        // and will not touch it again until `head` moves past it.
        let m = unsafe { (*self.slots[head & self.mask].get()).assume_init_read() };
        self.head.0.store(head.wrapping_add(1), Ordering::Release);
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::Ring;
    use crate::record::mark::Mark;
    use std::sync::Arc;

    fn mark(i: u64) -> Mark {
        Mark::step_end().at(i)
    }

    #[test]
    fn holds_its_capacity_in_order_and_refuses_the_rest() {
        let r = Ring::new(5);
        assert_eq!(r.capacity(), 8);
        for i in 0..8 {
            assert!(unsafe { r.push(mark(i)) });
        }
        assert!(!unsafe { r.push(mark(99)) }, "full");
        assert_eq!(r.len(), 8);
        for i in 0..8 {
            assert_eq!(unsafe { r.pop() }.map(|m| m.token()), Some(i));
        }
        assert!(unsafe { r.pop() }.is_none());
        assert!(r.is_empty());
        assert!(unsafe { r.push(mark(100)) }, "room again after draining");
    }

    proptest::proptest! {
        /// Any sequence of pushes and pops behaves like a bounded FIFO.
        #[test]
        fn behaves_like_a_bounded_fifo(ops in proptest::collection::vec(proptest::bool::ANY, 0..500),
                                       cap in 1usize..40) {
            let r = Ring::new(cap);
            let mut model = std::collections::VecDeque::new();
            let mut next = 0u64;
            for push in ops {
                if push {
                    let ok = unsafe { r.push(mark(next)) };
                    proptest::prop_assert_eq!(ok, model.len() < r.capacity());
                    if ok {
                        model.push_back(next);
                    }
                    next += 1;
                } else {
                    proptest::prop_assert_eq!(unsafe { r.pop() }.map(|m| m.token()), model.pop_front());
                }
                proptest::prop_assert_eq!(r.len(), model.len());
            }
        }
    }

    #[test]
    fn a_producer_and_a_consumer_on_two_threads_lose_nothing_in_order() {
        let r = Arc::new(Ring::new(64));
        let n = 200_000u64;
        let p = r.clone();
        let producer = std::thread::spawn(move || {
            let mut dropped = 0u64;
            for i in 0..n {
                // SAFETY: this thread is the only producer.
                while !unsafe { p.push(mark(i)) } {
                    dropped += 1;
                    std::hint::spin_loop();
                }
            }
            dropped
        });
        let mut next = 0u64;
        while next < n {
            // SAFETY: this thread is the only consumer.
            if let Some(m) = unsafe { r.pop() } {
                assert_eq!(m.token(), next);
                next += 1;
            }
        }
        let _ = producer.join();
        assert!(r.is_empty());
    }
}
