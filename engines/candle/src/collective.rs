//! The all-reduce the forward pass meets through ([`AllReduce`]), and its implementation for
//! tensor-parallel ranks that are threads of one process ([`Collective`]; ranks that are
//! processes implement [`AllReduce`] over their own transport, as `phasetrace demo --engine
//! candle --rank R --rendezvous HOST:PORT` does over TCP).
//!
//! Threads: each rank deposits
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

/// What a rank's forward pass needs of its group: an all-reduce in three steps, which the engine
/// times as three sections (the enqueue, the rendezvous probe, the sum), and the group's stop
/// decision at a step boundary. Every rank must see the same sum, bit for bit (sum the partials
/// in rank order), or the ranks sample different tokens.
pub trait AllReduce: std::fmt::Debug {
    /// Ranks in the group.
    fn ranks(&self) -> usize;
    /// The group's decision to stop, the same on every rank: rank 0's `says` (a group of
    /// processes may also take any rank's).
    fn decide(&mut self, says: bool) -> Result<bool>;
    /// Hands this rank's partial output to the all-reduce (host work: enqueue, send).
    fn deposit(&mut self, partial: &Tensor) -> Result<()>;
    /// Waits until every rank has deposited: the wait for the slowest rank.
    fn arrive(&mut self) -> Result<()>;
    /// The sum of every rank's partial, in rank order.
    fn sum(&mut self) -> Result<Tensor>;
}
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

impl AllReduce for Member<'_> {
    fn ranks(&self) -> usize {
        self.group.ranks
    }

    /// Rank 0's decision (`says` on rank 0; ignored elsewhere), taken by every rank at the
    /// same point.
    fn decide(&mut self, says: bool) -> Result<bool> {
        if self.rank == 0 {
            self.group.verdict.store(says, Ordering::Relaxed);
        }
        self.group.barrier.wait();
        let v = self.group.verdict.load(Ordering::Relaxed);
        self.group.barrier.wait();
        Ok(v)
    }

    fn deposit(&mut self, partial: &Tensor) -> Result<()> {
        let mut s = self.group.slots[self.parity]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        s[self.rank] = Some(partial.clone());
        Ok(())
    }

    fn arrive(&mut self) -> Result<()> {
        self.group.barrier.wait();
        Ok(())
    }

    /// After [`AllReduce::arrive`].
    fn sum(&mut self) -> Result<Tensor> {
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
        sum_in_order(&parts)
    }
}

/// Sums `parts` in their order (rank order): the one summation every implementation of
/// [`AllReduce`] uses, so that ranks of threads and ranks of processes get the same bits.
pub fn sum_in_order(parts: &[Tensor]) -> Result<Tensor> {
    let Some((first, rest)) = parts.split_first() else {
        candle_core::bail!("all-reduce: no partials");
    };
    let mut acc = first.clone();
    for p in rest {
        acc = (acc + p)?;
    }
    Ok(acc)
}
