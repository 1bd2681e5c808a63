//! The all-reduce of tensor-parallel ranks that are threads of one process: each rank deposits
//! its partial output, waits until every rank has deposited (the rendezvous, which the engine
//! times as the probe section), then sums the partials itself, in rank order, so every rank
//! holds bit-identical results.
//!
//! ```text
//! rank r: deposit(partial_r) ──> arrive (Barrier: the wait for the slowest rank)
//!         ──> sum(partial_0 .. partial_{n-1}) (+ residual)
//! ```
//!
//! Two slot sets alternate between consecutive all-reduces: a rank can only deposit into the set
//! of all-reduce `n + 2` after every rank has arrived at `n + 1`, that is after every rank has
//! finished reading the partials of `n`.

use candle_core::{Result, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};

/// The meeting point of a group of thread ranks.
#[derive(Debug)]
pub struct Collective {
    ranks: usize,
    barrier: Barrier,
    slots: [Mutex<Vec<Option<Tensor>>>; 2],
    verdict: AtomicBool,
}

impl Collective {
    /// A group of `ranks` ranks.
    pub fn new(ranks: usize) -> Collective {
        let slots = || Mutex::new(vec![None; ranks]);
        Collective {
            ranks,
            barrier: Barrier::new(ranks),
            slots: [slots(), slots()],
            verdict: AtomicBool::new(false),
        }
    }

    /// The handle rank `rank` uses.
    pub fn member(&self, rank: usize) -> Member<'_> {
        Member {
            group: self,
            rank,
            parity: 0,
        }
    }
}

/// One rank's handle on its [`Collective`].
#[derive(Debug)]
pub struct Member<'a> {
    group: &'a Collective,
    rank: usize,
    parity: usize,
}

impl Member<'_> {
    /// Ranks in the group.
    pub fn ranks(&self) -> usize {
        self.group.ranks
    }

    /// Rank 0's decision (`says` on rank 0; ignored elsewhere), taken by every rank at the
    /// same point.
    pub fn decide(&self, says: bool) -> bool {
        if self.rank == 0 {
            self.group.verdict.store(says, Ordering::Relaxed);
        }
        self.group.barrier.wait();
        let v = self.group.verdict.load(Ordering::Relaxed);
        self.group.barrier.wait();
        v
    }

    /// Hands this rank's partial output to the all-reduce.
    pub fn deposit(&mut self, partial: &Tensor) {
        let mut s = self.group.slots[self.parity]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        s[self.rank] = Some(partial.clone());
    }

    /// Waits until every rank of the group has deposited.
    pub fn arrive(&self) {
        self.group.barrier.wait();
    }

    /// The sum of every rank's partial, in rank order (after [`Member::arrive`]).
    pub fn sum(&mut self) -> Result<Tensor> {
        let parts: Vec<Tensor> = {
            let s = self.group.slots[self.parity]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            s.iter().flatten().cloned().collect()
        };
        self.parity ^= 1;
        if parts.len() != self.group.ranks {
            candle_core::bail!(
                "all-reduce: {} of {} partials deposited",
                parts.len(),
                self.group.ranks
            );
        }
        let mut acc = parts[0].clone();
        for p in &parts[1..] {
            acc = (acc + p)?;
        }
        Ok(acc)
    }
}
