//! A bounded pool of items handed out as generation-checked [`Token`]s: the event pools of the
//! deferred clocks.

use super::Token;
use crossbeam_queue::ArrayQueue;
use std::sync::atomic::{AtomicU32, Ordering};

struct Slot<T> {
    item: T,
    generation: AtomicU32,
}

/// A bounded pool of items (a deferred clock's events) handed out as generation-checked
/// [`Token`]s, lock-free: what a [`Clock`](super::Clock) over an engine's own events needs to
/// give its `mark` a token without allocating, and its `resolve` and `release` a stale-proof
/// lookup.
///
/// A token is `generation << 32 | index`. Releasing bumps the slot's generation, so a stale
/// token (released twice, or resolved after release) no longer finds its item.
pub struct TokenPool<T> {
    slots: Box<[Slot<T>]>,
    free: ArrayQueue<u32>,
}

impl<T> std::fmt::Debug for TokenPool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenPool")
            .field("capacity", &self.capacity())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl<T> TokenPool<T> {
    /// A pool holding `items` (at least one, at most 2^31: the caller clamps; indexes past 2^32
    /// would not fit a token).
    pub fn new(items: Vec<T>) -> Self {
        let free = ArrayQueue::new(items.len().max(1));
        let slots: Box<[Slot<T>]> = items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                // Cannot fail: the queue has a place for every item.
                let _ = free.push(i as u32);
                Slot {
                    item,
                    generation: AtomicU32::new(0),
                }
            })
            .collect();
        TokenPool { slots, free }
    }

    /// Items in the pool.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Items handed out and not released yet.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Takes a free item, or `None` when every item is in flight. Never blocks.
    pub fn acquire(&self) -> Option<(u32, &T)> {
        let index = self.free.pop()?;
        Some((index, &self.slots[index as usize].item))
    }

    /// Gives back an item taken with [`Self::acquire`] that never became a token.
    pub fn cancel(&self, index: u32) {
        let _ = self.free.push(index);
    }

    /// The token of an acquired item.
    pub fn token(&self, index: u32) -> Token {
        let generation = self.slots[index as usize]
            .generation
            .load(Ordering::Acquire);
        Token(u64::from(generation) << 32 | u64::from(index))
    }

    /// The item of a live token; `None` for a stale or unknown one.
    pub fn get(&self, token: Token) -> Option<&T> {
        let slot = self.slots.get((token.0 & 0xffff_ffff) as usize)?;
        (slot.generation.load(Ordering::Acquire) == (token.0 >> 32) as u32).then_some(&slot.item)
    }

    /// Returns a token's item to the pool; only the first release of a token does anything.
    pub fn release(&self, token: Token) {
        let index = (token.0 & 0xffff_ffff) as u32;
        let Some(slot) = self.slots.get(index as usize) else {
            return;
        };
        let generation = (token.0 >> 32) as u32;
        if slot
            .generation
            .compare_exchange(
                generation,
                generation.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            let _ = self.free.push(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TokenPool;

    #[test]
    fn tokens_are_generation_checked_and_released_once() {
        let pool = TokenPool::new(vec!['a', 'b']);
        let (i, _) = pool.acquire().unwrap();
        let t = pool.token(i);
        assert_eq!(pool.get(t), Some(&'a'));
        let (j, _) = pool.acquire().unwrap();
        assert!(pool.acquire().is_none(), "exhausted");
        pool.release(t);
        pool.release(t); // a second release does nothing
        assert_eq!(pool.get(t), None, "stale after release");
        assert_eq!(pool.in_flight(), 1);
        let (k, _) = pool.acquire().unwrap();
        assert_eq!(k, i);
        assert_ne!(pool.token(k), t, "a reused slot carries a new generation");
        pool.cancel(j);
        assert_eq!(pool.in_flight(), 1);
        assert_eq!(pool.capacity(), 2);
    }
}
