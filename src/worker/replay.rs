//! Reading one replay of a captured CUDA graph.
//!
//! ```text
//! stream:  B_n [graph: e1 .. ek] E_n   B_n+1 [graph: e1 .. ek] E_n+1 ...
//! worker:  E_n complete -> resolve e1..ek -> still replay n's? -> times | counted, not attributed
//! ```
//!
//! A graph's events are recorded again by every launch, so what an event says depends on which
//! launch recorded it last. Once the fence `E_n` (recorded after launch `n`) has completed,
//! every event of launch `n` has too, so a *pending* event was re-recorded by a later launch.
//! A *complete* one is launch `n`'s when no later launch had begun when the worker finished
//! reading (the launch counter is bumped before `cuGraphLaunch`, and read after the events);
//! when one had, the events are kept only if all lie inside `[B_n, E_n)`, since a later launch
//! runs after `E_n` on the same stream. Anything else is counted, never attributed.

use crate::record::graph::GraphShared;
use crate::timing::{Resolved, Token};
use std::sync::atomic::{Ordering, fence};

/// The times of launch `seq`'s captured boundaries, in template order, or `None` when they are
/// not (or no longer) that launch's. `begin`/`end` are the fences' times.
pub(crate) fn read(g: &GraphShared, seq: u32, begin: u64, end: u64) -> Option<Vec<u64>> {
    let mut times = Vec::with_capacity(g.template.len());
    for m in g.template.iter() {
        match g.clock.resolve(Token(m.token())) {
            Resolved::At(t) => times.push(t),
            Resolved::Pending | Resolved::Failed => return None,
        }
    }
    // The reads above happen before the load below; the engine bumps the counter before it
    // launches again.
    fence(Ordering::SeqCst);
    let latest = g.launched.load(Ordering::SeqCst) as u32;
    if latest == seq {
        return Some(times);
    }
    times
        .iter()
        .all(|&t| t >= begin && t < end)
        .then_some(times)
}
