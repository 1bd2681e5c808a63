//! MoE expert load: the full per-(rank, layer, expert) token counts in process, and a bounded
//! set of series derived from them (`PHASETRACE_EXPERT_COUNTER=on`).
//!
//! ```text
//! Route marks ──> ExpertWriter (the worker: one writer, no locks per id)
//!                   ├──> LayerRow cells (relaxed load + store) ──> Profiler::expert_load()
//!                   │                                           └─> phasetrace.moe.layer.tokens
//!                   └──> every PHASETRACE_EXPERT_WINDOW steps of a rank: the window's counts
//!                        (cells - counts at the window's start) -> imbalance, cv, hot experts
//!                        ──> Window (swapped under a mutex) ──> the gauges at collection
//! ```
//!
//! # Series budget
//!
//! Per rank, with `L` MoE layers and `N = PHASETRACE_EXPERT_TOP`: `L` token counters, `L`
//! imbalance gauges, `L` coefficient-of-variation gauges and `N x L` hot-expert gauges, so
//! `(3 + N) x L` whatever the number of experts: 420 at 60 layers and the default `N = 4`, 780
//! at the largest `N` (10). The per-(layer, expert) counts (23,040 at 384 experts x 60 layers)
//! are never exported as series: [`crate::Profiler::expert_load`] returns them.
//!
//! # Hot-expert churn
//!
//! The hot set of a (rank, layer) changes only when a window ends, and an expert in it keeps its
//! place while its tokens in the window are at least `1 / (1 + HOT_HYSTERESIS)` of the N-th
//! best expert's: an expert replaces it only when clearly hotter. So at most `N` series start
//! per (rank, layer) per window, and near-ties do not flap. A series that leaves the set is no
//! longer reported; Prometheus marks it stale at its next scrape.

use crate::names::{attr, default};
use crate::vocab::Layer;
use opentelemetry::KeyValue;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Layers with expert cells; routes of higher layers are dropped and counted (`out_of_range`).
pub(crate) const MAX_LAYERS: u32 = 1024;
/// Cells are allocated in blocks of this many experts when the number of experts is inferred.
const GROW: usize = 64;
/// How much hotter than an incumbent hot expert a newcomer must be to replace it.
const HOT_HYSTERESIS: f64 = 0.25;

/// The expert-load settings, from the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExpertSettings {
    pub(crate) on: bool,
    /// Routed experts per layer; 0: the highest id seen + 1.
    pub(crate) experts: u32,
    /// Steps of a rank per window.
    pub(crate) window: u32,
    /// Hot experts per (layer, rank).
    pub(crate) top: u32,
    /// Expert-parallel ranks hosting the experts in contiguous blocks; 0: none.
    pub(crate) ep: u32,
}

impl ExpertSettings {
    pub(crate) fn of(cfg: &crate::Config) -> ExpertSettings {
        ExpertSettings {
            on: cfg.expert_counter,
            experts: cfg.moe_experts,
            window: cfg.expert_window.max(1),
            top: cfg.expert_top.min(default::EXPERT_TOP_MAX),
            ep: cfg.expert_parallel,
        }
    }

    /// Off, with the defaults.
    #[cfg(test)]
    pub(crate) fn off() -> ExpertSettings {
        ExpertSettings {
            on: false,
            experts: 0,
            window: default::EXPERT_WINDOW,
            top: default::EXPERT_TOP,
            ep: 0,
        }
    }
}

/// One layer's cumulative tokens per expert: written by the worker only (a relaxed load and
/// store per id), read concurrently by snapshots and collection, which see each cell only grow.
struct LayerRow {
    cells: Box<[AtomicU64]>,
    total: AtomicU64,
}

impl LayerRow {
    fn new(len: usize, from: Option<&LayerRow>) -> LayerRow {
        let cells: Box<[AtomicU64]> = (0..len)
            .map(|i| {
                AtomicU64::new(
                    from.and_then(|r| r.cells.get(i))
                        .map_or(0, |c| c.load(Relaxed)),
                )
            })
            .collect();
        LayerRow {
            cells,
            total: AtomicU64::new(from.map_or(0, |r| r.total.load(Relaxed))),
        }
    }

    /// Single writer: see the type's doc.
    #[inline]
    fn add(&self, id: usize) {
        let c = &self.cells[id];
        c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
        self.total
            .store(self.total.load(Relaxed).wrapping_add(1), Relaxed);
    }
}

/// One hot expert of a layer in the last complete window.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Hot {
    expert: u16,
    share: f64,
    ep_rank: Option<u32>,
}

/// One layer's figures in the last complete window.
#[derive(Clone, Debug, PartialEq)]
struct LayerWindow {
    layer: u32,
    imbalance: f64,
    cv: f64,
    hot: Vec<Hot>,
}

/// What collection and snapshots read of one rank.
struct RankLoad {
    rank: u32,
    rank_kv: KeyValue,
    /// Index: layer. A row is replaced (grown) by the worker, never changed in length in place.
    rows: Mutex<Vec<Option<Arc<LayerRow>>>>,
    /// The last complete window, swapped in whole when a window ends.
    window: Mutex<Arc<Vec<LayerWindow>>>,
}

/// The expert load of a profiler: one per profiler, shared by the worker, every meter
/// provider's instruments and [`crate::Profiler::expert_load`].
pub(crate) struct ExpertTotals {
    pub(crate) settings: ExpertSettings,
    group: KeyValue,
    ranks: Mutex<Vec<Arc<RankLoad>>>,
}

impl std::fmt::Debug for ExpertTotals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertTotals")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl ExpertTotals {
    pub(crate) fn new(settings: ExpertSettings, group: &str) -> Arc<ExpertTotals> {
        Arc::new(ExpertTotals {
            settings,
            group: KeyValue::new(
                attr::GROUP,
                opentelemetry::StringValue::from(Arc::<str>::from(group)),
            ),
            ranks: Mutex::default(),
        })
    }

    fn rank(&self, rank: u32) -> Arc<RankLoad> {
        let mut ranks = self.ranks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = ranks.iter().find(|r| r.rank == rank) {
            return r.clone();
        }
        let r = Arc::new(RankLoad {
            rank,
            rank_kv: crate::worker::attrs::rank_attr(rank),
            rows: Mutex::default(),
            window: Mutex::default(),
        });
        ranks.push(r.clone());
        ranks.sort_by_key(|r| r.rank);
        r
    }

    fn each_rank(&self) -> Vec<Arc<RankLoad>> {
        self.ranks.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The cumulative counts of every (rank, layer) routed so far.
    pub(crate) fn snapshot(&self) -> ExpertLoad {
        let mut layers = Vec::new();
        for r in self.each_rank() {
            let rows: Vec<Option<Arc<LayerRow>>> =
                r.rows.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for (layer, row) in rows.iter().enumerate() {
                let Some(row) = row else { continue };
                let mut tokens: Vec<u64> = row.cells.iter().map(|c| c.load(Relaxed)).collect();
                if self.settings.experts == 0 {
                    // Inferred: trailing cells past the highest id seen are growth slack.
                    while tokens.last() == Some(&0) {
                        tokens.pop();
                    }
                }
                layers.push(LayerLoad {
                    rank: r.rank,
                    layer: layer as u32,
                    tokens,
                });
            }
        }
        ExpertLoad { layers }
    }

    /// Calls `f(attributes, tokens)` for every (layer, rank) that routed a token.
    pub(crate) fn each_layer_tokens(&self, mut f: impl FnMut(&[KeyValue], u64)) {
        for r in self.each_rank() {
            let rows: Vec<Option<Arc<LayerRow>>> =
                r.rows.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for (layer, row) in rows.iter().enumerate() {
                if let Some(row) = row {
                    let kv = [
                        KeyValue::new(attr::LAYER, layer as i64),
                        r.rank_kv.clone(),
                        self.group.clone(),
                    ];
                    f(&kv, row.total.load(Relaxed));
                }
            }
        }
    }

    fn each_window(&self, mut f: impl FnMut(&RankLoad, &LayerWindow)) {
        for r in self.each_rank() {
            let w = r.window.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for l in w.iter() {
                f(&r, l);
            }
        }
    }

    /// Calls `f(attributes, imbalance, cv)` for every (layer, rank) of the last windows.
    pub(crate) fn each_imbalance(&self, mut f: impl FnMut(&[KeyValue], f64, f64)) {
        self.each_window(|r, l| {
            let kv = [
                KeyValue::new(attr::LAYER, i64::from(l.layer)),
                r.rank_kv.clone(),
                self.group.clone(),
            ];
            f(&kv, l.imbalance, l.cv);
        });
    }

    /// Calls `f(attributes, share)` for every hot expert of the last windows.
    pub(crate) fn each_hot(&self, mut f: impl FnMut(&[KeyValue], f64)) {
        self.each_window(|r, l| {
            for h in &l.hot {
                let base = [
                    KeyValue::new(attr::LAYER, i64::from(l.layer)),
                    KeyValue::new(attr::EXPERT, i64::from(h.expert)),
                    r.rank_kv.clone(),
                    self.group.clone(),
                ];
                match h.ep_rank {
                    Some(ep) => {
                        let mut kv = base.to_vec();
                        kv.push(KeyValue::new(attr::EP_RANK, i64::from(ep)));
                        f(&kv, h.share);
                    }
                    None => f(&base, h.share),
                }
            }
        });
    }
}

/// The worker's side of one rank: the rows it writes and the counts at the window's start.
struct RankWriter {
    shared: Arc<RankLoad>,
    rows: Vec<Option<Arc<LayerRow>>>,
    /// Per layer: the cells' values when the window began.
    base: Vec<Vec<u64>>,
    /// Per layer: the hot set of the last window.
    hot: Vec<Vec<u16>>,
    /// Highest expert id seen + 1, over the rank's layers.
    seen: usize,
    steps: u32,
}

/// The worker's writer of expert load (only the worker thread holds it).
pub(crate) struct ExpertWriter {
    totals: Arc<ExpertTotals>,
    ranks: Vec<RankWriter>,
    /// Index into `ranks` of the last rank written.
    last: usize,
}

impl ExpertWriter {
    pub(crate) fn new(totals: Arc<ExpertTotals>) -> ExpertWriter {
        ExpertWriter {
            totals,
            ranks: Vec::new(),
            last: 0,
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        self.totals.settings.on
    }

    #[cfg(test)]
    pub(crate) fn totals(&self) -> &ExpertTotals {
        &self.totals
    }

    fn writer(&mut self, rank: u32) -> &mut RankWriter {
        if self
            .ranks
            .get(self.last)
            .is_none_or(|w| w.shared.rank != rank)
        {
            self.last = match self.ranks.iter().position(|w| w.shared.rank == rank) {
                Some(i) => i,
                None => {
                    // A worker started again (`set_level` off, then on) goes on from the
                    // counts so far: the rows are the rank's, and its window starts now.
                    let shared = self.totals.rank(rank);
                    let rows = shared
                        .rows
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    let base: Vec<Vec<u64>> = rows
                        .iter()
                        .map(|r| {
                            r.as_ref().map_or_else(Vec::new, |r| {
                                r.cells.iter().map(|c| c.load(Relaxed)).collect()
                            })
                        })
                        .collect();
                    let seen = base
                        .iter()
                        .filter_map(|b| b.iter().rposition(|&c| c > 0))
                        .map(|i| i + 1)
                        .max()
                        .unwrap_or(0);
                    self.ranks.push(RankWriter {
                        shared,
                        rows,
                        base,
                        hot: Vec::new(),
                        seen,
                        steps: 0,
                    });
                    self.ranks.len() - 1
                }
            };
        }
        &mut self.ranks[self.last]
    }

    /// Counts `ids` routed in `layer` at `rank`; returns how many were out of range (a layer at
    /// or above [`MAX_LAYERS`] or without an index, or an id at or above `PHASETRACE_MOE_EXPERTS`).
    pub(crate) fn route(&mut self, rank: u32, layer: Layer, ids: &[u16]) -> u64 {
        let fixed = self.totals.settings.experts as usize;
        let Some(layer) = layer.get().filter(|l| *l < MAX_LAYERS) else {
            return ids.len() as u64;
        };
        let w = self.writer(rank);
        let li = layer as usize;
        if w.rows.len() <= li {
            w.rows.resize(li + 1, None);
        }
        let mut out = 0;
        for &id in ids {
            let id = usize::from(id);
            if fixed > 0 && id >= fixed {
                out += 1;
                continue;
            }
            let len = w.rows[li].as_ref().map_or(0, |r| r.cells.len());
            if id >= len {
                let want = if fixed > 0 {
                    fixed
                } else {
                    (id + 1).div_ceil(GROW) * GROW
                };
                let row = Arc::new(LayerRow::new(want, w.rows[li].as_deref()));
                w.rows[li] = Some(row.clone());
                let mut shared = w.shared.rows.lock().unwrap_or_else(|p| p.into_inner());
                if shared.len() <= li {
                    shared.resize(li + 1, None);
                }
                shared[li] = Some(row);
            }
            w.seen = w.seen.max(id + 1);
            if let Some(r) = &w.rows[li] {
                r.add(id);
            }
        }
        out
    }

    /// A step of `rank` ended: at every `PHASETRACE_EXPERT_WINDOW`-th, the window's figures.
    pub(crate) fn step_end(&mut self, rank: u32) {
        let settings = self.totals.settings;
        let w = self.writer(rank);
        w.steps += 1;
        if w.steps < settings.window {
            return;
        }
        w.steps = 0;
        let experts = if settings.experts > 0 {
            settings.experts as usize
        } else {
            w.seen
        };
        if experts == 0 {
            return;
        }
        let block = (settings.ep > 0).then(|| experts.div_ceil(settings.ep as usize).max(1));
        let mut figures = Vec::new();
        w.base.resize_with(w.rows.len(), Vec::new);
        w.hot.resize_with(w.rows.len(), Vec::new);
        let mut counts = vec![0u64; experts];
        for (li, row) in w.rows.iter().enumerate() {
            let Some(row) = row else { continue };
            let base = &mut w.base[li];
            base.resize(row.cells.len(), 0);
            counts.iter_mut().for_each(|c| *c = 0);
            for (i, cell) in row.cells.iter().enumerate() {
                let now = cell.load(Relaxed);
                if let Some(c) = counts.get_mut(i) {
                    *c = now.wrapping_sub(base[i]);
                }
                base[i] = now;
            }
            let Some(f) = window_figures(&counts) else {
                w.hot[li].clear();
                continue;
            };
            let hot = hot_set(&counts, &w.hot[li], settings.top as usize);
            let sum = f.2;
            figures.push(LayerWindow {
                layer: li as u32,
                imbalance: f.0,
                cv: f.1,
                hot: hot
                    .iter()
                    .map(|&e| Hot {
                        expert: e,
                        share: counts[usize::from(e)] as f64 / sum as f64,
                        ep_rank: block.map(|b| (usize::from(e) / b) as u32),
                    })
                    .collect(),
            });
            w.hot[li] = hot;
        }
        *w.shared.window.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(figures);
    }
}

/// (max / mean, standard deviation / mean, sum) of a window's tokens per expert; `None` when
/// the layer routed nothing in it.
fn window_figures(counts: &[u64]) -> Option<(f64, f64, u64)> {
    let sum: u64 = counts.iter().sum();
    if sum == 0 || counts.is_empty() {
        return None;
    }
    let n = counts.len() as f64;
    let mean = sum as f64 / n;
    let max = counts.iter().copied().max().unwrap_or(0) as f64;
    let var = counts
        .iter()
        .map(|&c| {
            let d = c as f64 - mean;
            d * d
        })
        .sum::<f64>()
        / n;
    Some((max / mean, var.sqrt() / mean, sum))
}

/// The `top` hottest experts of a window, where an expert of `before` (the last window's set)
/// keeps its place against a newcomer unless the newcomer got more than `1 + HOT_HYSTERESIS`
/// times its tokens (see the module doc). Hottest first.
fn hot_set(counts: &[u64], before: &[u16], top: usize) -> Vec<u16> {
    if top == 0 {
        return Vec::new();
    }
    let count = |e: u16| counts.get(usize::from(e)).copied().unwrap_or(0);
    let by_count = |a: &u16, b: &u16| count(*b).cmp(&count(*a)).then(a.cmp(b));
    let mut order: Vec<u16> = (0..counts.len().min(usize::from(u16::MAX) + 1))
        .filter(|&i| counts[i] > 0)
        .map(|i| i as u16)
        .collect();
    if order.len() > top {
        order.select_nth_unstable_by(top - 1, by_count);
        order.truncate(top);
    }
    order.sort_unstable_by(by_count);
    // Newcomers, hottest first, and the incumbents they would push out, hottest first.
    let (mut set, mut newcomers): (Vec<u16>, Vec<u16>) =
        order.iter().partition(|e| before.contains(e));
    let mut pushed: Vec<u16> = before
        .iter()
        .copied()
        .filter(|&e| count(e) > 0 && !order.contains(&e))
        .collect();
    pushed.sort_unstable_by(by_count);
    for e in pushed {
        // The weakest newcomer takes a place only if clearly hotter than the best incumbent
        // left out; if not, that incumbent keeps the place.
        match newcomers.last() {
            Some(&o) if (count(o) as f64) <= count(e) as f64 * (1.0 + HOT_HYSTERESIS) => {
                newcomers.pop();
                set.push(e);
            }
            _ => break,
        }
    }
    set.extend(newcomers);
    set.sort_unstable_by(by_count);
    set
}

/// The tokens routed to each expert of one (rank, layer), from [`crate::Profiler::expert_load`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerLoad {
    /// The rank that routed them.
    pub rank: u32,
    /// The MoE layer.
    pub layer: u32,
    /// Tokens per expert, indexed by expert id (its length: `PHASETRACE_MOE_EXPERTS`, or the
    /// highest id seen + 1).
    pub tokens: Vec<u64>,
}

impl LayerLoad {
    /// The tokens routed in the layer (tokens x top-k).
    pub fn total(&self) -> u64 {
        self.tokens.iter().sum()
    }
}

/// The full per-(rank, layer, expert) token counts, for expert-parallel load balancers:
/// [`crate::Profiler::expert_load`]. Counts are cumulative since the profiler was built;
/// [`ExpertLoad::since`] gives what was routed between two snapshots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpertLoad {
    /// One entry per (rank, layer) that routed a token, by rank then layer.
    pub layers: Vec<LayerLoad>,
}

impl ExpertLoad {
    /// The counts of one (rank, layer).
    pub fn layer(&self, rank: u32, layer: u32) -> Option<&LayerLoad> {
        self.layers
            .iter()
            .find(|l| l.rank == rank && l.layer == layer)
    }

    /// What was routed since `earlier` (a snapshot of the same profiler): each count less the
    /// earlier one.
    pub fn since(&self, earlier: &ExpertLoad) -> ExpertLoad {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let before = earlier.layer(l.rank, l.layer);
                LayerLoad {
                    rank: l.rank,
                    layer: l.layer,
                    tokens: l
                        .tokens
                        .iter()
                        .enumerate()
                        .map(|(i, &t)| {
                            t.saturating_sub(
                                before.and_then(|b| b.tokens.get(i)).copied().unwrap_or(0),
                            )
                        })
                        .collect(),
                }
            })
            .collect();
        ExpertLoad { layers }
    }

    /// The `n` hottest (rank, layer, expert, tokens), hottest first.
    pub fn hottest(&self, n: usize) -> Vec<(u32, u32, u16, u64)> {
        let mut all: Vec<(u32, u32, u16, u64)> = self
            .layers
            .iter()
            .flat_map(|l| {
                l.tokens
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| **t > 0)
                    .map(move |(e, &t)| (l.rank, l.layer, e as u16, t))
            })
            .collect();
        all.sort_unstable_by(|a, b| b.3.cmp(&a.3).then((a.0, a.1, a.2).cmp(&(b.0, b.1, b.2))));
        all.truncate(n);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(experts: u32, window: u32, top: u32, ep: u32) -> ExpertSettings {
        ExpertSettings {
            on: true,
            experts,
            window,
            top,
            ep,
        }
    }

    #[test]
    fn imbalance_is_max_over_mean_and_cv_is_sd_over_mean() {
        let (imb, cv, sum) = window_figures(&[4, 0, 0, 0]).unwrap();
        assert_eq!(sum, 4);
        assert!((imb - 4.0).abs() < 1e-12);
        assert!((cv - 3f64.sqrt()).abs() < 1e-12);
        let (imb, cv, _) = window_figures(&[2, 2, 2, 2]).unwrap();
        assert!((imb - 1.0).abs() < 1e-12 && cv.abs() < 1e-12);
        assert!(window_figures(&[0, 0]).is_none());
    }

    #[test]
    fn an_incumbent_keeps_its_place_until_clearly_beaten() {
        // 3 is hot first; then 5 is a little hotter: 3 stays.
        let first = hot_set(&[0, 1, 0, 10, 0, 9], &[], 1);
        assert_eq!(first, vec![3]);
        assert_eq!(hot_set(&[0, 1, 0, 10, 0, 11], &first, 1), vec![3]);
        // 5 now has more than 1.25 x 3's tokens: it replaces 3.
        assert_eq!(hot_set(&[0, 1, 0, 10, 0, 13], &first, 1), vec![5]);
        // Hottest first, ties broken by id.
        assert_eq!(hot_set(&[5, 5, 9], &[], 3), vec![2, 0, 1]);
        assert!(hot_set(&[5], &[], 0).is_empty());
    }

    #[test]
    fn windows_count_only_their_own_steps_and_snapshots_add_up() {
        let t = ExpertTotals::new(settings(8, 2, 2, 4), "g");
        let mut w = ExpertWriter::new(t.clone());
        assert_eq!(w.route(0, Layer(3), &[1, 1, 1, 6]), 0);
        assert_eq!(w.route(0, Layer(3), &[9]), 1, "id 9 >= 8 experts");
        assert_eq!(w.route(0, Layer::NONE, &[1]), 1);
        w.step_end(0);
        assert!(t.each_window_len() == 0, "the window is two steps");
        w.step_end(0);
        let mut hot = Vec::new();
        t.each_hot(|kv, share| hot.push((kv.to_vec(), share)));
        assert_eq!(hot.len(), 2);
        assert!((hot[0].1 - 0.75).abs() < 1e-12);
        // Expert 6 of 8 on 4 EP ranks lives on rank 3.
        assert!(hot[1].0.contains(&KeyValue::new(attr::EP_RANK, 3i64)));
        // The next window sees only its own tokens.
        w.route(0, Layer(3), &[2, 2]);
        w.step_end(0);
        w.step_end(0);
        let mut imb = Vec::new();
        t.each_imbalance(|_, i, _| imb.push(i));
        assert_eq!(imb, vec![8.0]);
        let snap = t.snapshot();
        assert_eq!(
            snap.layer(0, 3).unwrap().tokens,
            vec![0, 3, 2, 0, 0, 0, 1, 0]
        );
        assert_eq!(snap.layer(0, 3).unwrap().total(), 6);
        assert_eq!(snap.hottest(1), vec![(0, 3, 1, 3)]);
        w.route(0, Layer(3), &[7]);
        let later = t.snapshot().since(&snap);
        assert_eq!(later.layer(0, 3).unwrap().total(), 1);
    }

    #[test]
    fn a_new_writer_goes_on_from_the_counts_so_far() {
        let t = ExpertTotals::new(settings(4, 1, 1, 0), "g");
        let mut w = ExpertWriter::new(t.clone());
        w.route(0, Layer(1), &[2, 2]);
        drop(w);
        let mut w = ExpertWriter::new(t.clone());
        w.route(0, Layer(1), &[2, 3]);
        w.step_end(0);
        assert_eq!(t.snapshot().layer(0, 1).unwrap().tokens, vec![0, 0, 3, 1]);
        let mut imb = Vec::new();
        t.each_imbalance(|_, i, _| imb.push(i));
        assert_eq!(
            imb,
            vec![2.0],
            "the window holds only what the new writer saw"
        );
    }

    #[test]
    fn inferred_experts_grow_the_row_without_losing_counts() {
        let t = ExpertTotals::new(settings(0, 1, 1, 0), "g");
        let mut w = ExpertWriter::new(t.clone());
        w.route(1, Layer(0), &[3]);
        w.route(1, Layer(0), &[200, 3]);
        assert_eq!(t.snapshot().layer(1, 0).unwrap().tokens.len(), 201);
        assert_eq!(t.snapshot().layer(1, 0).unwrap().tokens[3], 2);
        let mut tokens = Vec::new();
        t.each_layer_tokens(|_, n| tokens.push(n));
        assert_eq!(tokens, vec![3]);
    }

    impl ExpertTotals {
        fn each_window_len(&self) -> usize {
            let mut n = 0;
            self.each_window(|_, _| n += 1);
            n
        }
    }
}
