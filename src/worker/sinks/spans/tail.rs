//! Tail sampling: after a step (or round) has ended, the worker decides whether it was slow
//! enough to be traced, within a per-rank budget of tail traces a second.
//!
//! ```text
//! step ended (duration, end time) ──> Gate (rank, kind): slower than the threshold?
//!                                        │ a fixed duration, or a percentile of the
//!                                        │ rank's last WINDOW durations
//!                                        ▼
//!                                     Budget (rank): fewer than N tail traces in the last
//!                                        second? ──> Keep | OverBudget (counted) | Fast
//! ```
//!
//! The hot path is untouched: it still flags one step in `PHASETRACE_TRACE_EVERY`; the worker
//! holds every step's sections until the step's end anyway, so keeping a slow one costs only
//! the spans it builds.

use crate::config::TraceSlowerThan;
use std::collections::{HashMap, VecDeque};

/// One second in nanoseconds: the budget's window.
const SECOND_NS: u64 = 1_000_000_000;
/// Durations a percentile needs before it is trusted (fewer: no tail traces yet).
const MIN_SAMPLES: usize = 100;
/// The percentile is recomputed after this many new durations.
const REFRESH_EVERY: u32 = 50;

/// Steps and rounds keep separate percentiles: a round spans a step and more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Step,
    Round,
    /// A request's time to first token or per output token (one `Tail` each).
    Request,
}

/// What the worker does with an ended step or round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not slower than the threshold (or tail sampling is off).
    Fast,
    /// Slow, and within the rank's budget: build its spans.
    Keep,
    /// Slow, but the rank's budget for this second is spent: counted as `tail_budget`.
    OverBudget,
}

/// A rank's recent durations and the percentile they give.
#[derive(Debug, Default)]
struct Window {
    recent: VecDeque<u64>,
    since_refresh: u32,
    threshold: Option<u64>,
    scratch: Vec<u64>,
}

impl Window {
    fn push(&mut self, ns: u64, percentile: f64) {
        if self.recent.len() >= TraceSlowerThan::WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(ns);
        self.since_refresh += 1;
        if self.recent.len() >= MIN_SAMPLES
            && (self.threshold.is_none() || self.since_refresh >= REFRESH_EVERY)
        {
            self.since_refresh = 0;
            self.scratch.clear();
            self.scratch.extend(self.recent.iter().copied());
            // Nearest rank: the smallest duration with at least q% of the window at or below.
            let n = self.scratch.len();
            let rank = ((percentile / 100.0) * n as f64).ceil() as usize;
            let i = rank.clamp(1, n) - 1;
            let (_, v, _) = self.scratch.select_nth_unstable(i);
            self.threshold = Some(*v);
        }
    }
}

/// Tail-trace decisions for every rank this worker sees.
#[derive(Debug)]
pub(crate) struct Tail {
    rule: TraceSlowerThan,
    budget: usize,
    windows: HashMap<(u32, Kind), Window>,
    /// End times of each rank's tail traces within the last second.
    kept: HashMap<u32, VecDeque<u64>>,
}

impl Tail {
    pub(crate) fn new(rule: TraceSlowerThan, budget: u32) -> Tail {
        Tail {
            rule,
            budget: budget as usize,
            windows: HashMap::new(),
            kept: HashMap::new(),
        }
    }

    /// Whether any step may be kept for being slow (then every step's sections are held).
    pub(crate) fn is_on(&self) -> bool {
        self.rule != TraceSlowerThan::Off
    }

    /// Decides on a step or round of `rank` that took `ns` and ended at `end` (ns). `head`:
    /// already traced as one in N (it then takes nothing from the budget).
    pub(crate) fn decide(
        &mut self,
        rank: u32,
        kind: Kind,
        ns: u64,
        end: u64,
        head: bool,
    ) -> Verdict {
        let slow = match self.rule {
            TraceSlowerThan::Off => false,
            TraceSlowerThan::Duration(d) => u128::from(ns) > d.as_nanos(),
            TraceSlowerThan::Percentile(q) => {
                let w = self.windows.entry((rank, kind)).or_default();
                let slow = w.threshold.is_some_and(|t| ns > t);
                w.push(ns, q);
                slow
            }
        };
        if !slow || head {
            return Verdict::Fast;
        }
        let kept = self.kept.entry(rank).or_default();
        while kept
            .front()
            .is_some_and(|&t| t.saturating_add(SECOND_NS) <= end)
        {
            kept.pop_front();
        }
        if kept.len() >= self.budget {
            return Verdict::OverBudget;
        }
        kept.push_back(end);
        Verdict::Keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_fixed_threshold_keeps_only_what_is_slower() {
        let mut t = Tail::new(TraceSlowerThan::Duration(Duration::from_millis(25)), 100);
        assert_eq!(t.decide(0, Kind::Step, 25 * MS, 0, false), Verdict::Fast);
        assert_eq!(
            t.decide(0, Kind::Step, 25 * MS + 1, MS, false),
            Verdict::Keep
        );
        // A head-sampled step is traced anyway: it takes nothing from the budget.
        assert_eq!(
            t.decide(0, Kind::Step, 90 * MS, 2 * MS, true),
            Verdict::Fast
        );
        let mut off = Tail::new(TraceSlowerThan::Off, 100);
        assert!(!off.is_on());
        assert_eq!(off.decide(0, Kind::Step, u64::MAX, 0, false), Verdict::Fast);
    }

    #[test]
    fn a_percentile_needs_a_window_then_keeps_the_slowest() {
        let mut t = Tail::new(TraceSlowerThan::Percentile(99.0), 10_000);
        // Steps of 10.00..10.99 ms, evenly spread.
        let d = |i: u64| 10 * MS + (i * 37 % 100) * MS / 100;
        // No threshold before MIN_SAMPLES durations: nothing is kept.
        for i in 0..MIN_SAMPLES as u64 {
            assert_eq!(t.decide(0, Kind::Step, d(i), i * MS, false), Verdict::Fast);
        }
        // Then about 1% of the steps are slower than the p99 of the last WINDOW steps.
        let mut kept = 0;
        for i in 0..2000u64 {
            let v = t.decide(0, Kind::Step, d(i), i * MS, false);
            kept += u64::from(v == Verdict::Keep);
        }
        assert!((10..=40).contains(&kept), "{kept}");
        assert_eq!(
            t.decide(0, Kind::Step, 20 * MS, 3_000 * MS, false),
            Verdict::Keep
        );
        assert_eq!(
            t.decide(0, Kind::Step, 10 * MS + MS / 2, 3_001 * MS, false),
            Verdict::Fast
        );
        // Ranks and kinds have their own windows.
        assert_eq!(
            t.decide(1, Kind::Step, 20 * MS, 3_002 * MS, false),
            Verdict::Fast
        );
        assert_eq!(
            t.decide(0, Kind::Round, 20 * MS, 3_003 * MS, false),
            Verdict::Fast
        );
    }

    #[test]
    fn the_budget_allows_n_tail_traces_in_any_second_per_rank() {
        let mut t = Tail::new(TraceSlowerThan::Duration(Duration::from_nanos(1)), 5);
        let mut kept_at = Vec::new();
        let mut over = 0;
        // A slow step every 10 ms for 3 s, on two ranks.
        for i in 0..300u64 {
            for rank in 0..2 {
                match t.decide(rank, Kind::Step, 10 * MS, i * 10 * MS, false) {
                    Verdict::Keep if rank == 0 => kept_at.push(i * 10 * MS),
                    Verdict::Keep => {}
                    Verdict::OverBudget => over += 1,
                    Verdict::Fast => panic!("every step is slow"),
                }
            }
        }
        assert_eq!(kept_at.len(), 15, "{kept_at:?}");
        assert_eq!(over, 600 - 30);
        for (i, &a) in kept_at.iter().enumerate() {
            let in_second = kept_at[i..]
                .iter()
                .take_while(|&&b| b < a + SECOND_NS)
                .count();
            assert!(in_second <= 5, "{kept_at:?}");
        }
    }
}
