//! Which steps, rounds, requests and graph replays are head-sampled, and which read the
//! engine's current span: decided here only, from `PHASETRACE_TRACE_EVERY` and
//! `PHASETRACE_TRACE_SLOWER_THAN`.
//!
//! ```text
//! the n-th (from 0) step, round, request or replay of a recorder
//!   ── head(n): one in `every`, the first included (0: none)
//!   ── reads_parent: head-sampled, or any under a tail rule (it may keep any)
//! traces(): either rule on (else the worker gives its span sink no tracer)
//! ```

use crate::config::{Config, TraceSlowerThan};

/// The sampling rules of one profiler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sampling {
    /// One in `every` is traced from its start; 0 traces none that way.
    every: u64,
    /// A tail rule may keep any step or round once it ended.
    tail: bool,
}

impl Sampling {
    /// The rules `cfg` sets.
    pub(crate) fn of(cfg: &Config) -> Sampling {
        Sampling::new(
            cfg.trace_every,
            cfg.trace_slower_than != TraceSlowerThan::Off,
        )
    }

    /// Head sampling one in `every` (0: none), with or without a tail rule.
    pub(crate) const fn new(every: u64, tail: bool) -> Sampling {
        Sampling { every, tail }
    }

    /// Whether the `n`-th (from 0) step, round, request or graph replay is head-sampled.
    #[inline]
    pub(crate) fn head(self, n: u64) -> bool {
        self.every != 0 && n.is_multiple_of(self.every)
    }

    /// Whether a step or round whose head sampling gave `sampled` reads the engine's current
    /// span (one `Span::current` lookup through the engine's layer): the tail rule may keep
    /// any of them.
    #[inline]
    pub(crate) fn reads_parent(self, sampled: bool) -> bool {
        sampled || self.tail
    }

    /// Whether anything is ever traced.
    pub(crate) fn traces(self) -> bool {
        self.every != 0 || self.tail
    }
}

#[cfg(test)]
mod tests {
    use super::Sampling;

    #[test]
    fn one_in_every_from_the_first_and_none_at_zero() {
        let s = Sampling::new(3, false);
        let picked: Vec<u64> = (0..7).filter(|n| s.head(*n)).collect();
        assert_eq!(picked, [0, 3, 6]);
        assert!(!(0..100).any(|n| Sampling::new(0, false).head(n)));
        assert!(Sampling::new(0, true).reads_parent(false));
        assert!(!Sampling::new(0, false).traces());
        assert!(Sampling::new(0, true).traces() && Sampling::new(1, false).traces());
    }
}
