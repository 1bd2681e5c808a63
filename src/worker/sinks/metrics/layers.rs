//! The per-layer totals: time and calls per (section, layer, site, rank) and per rendezvous
//! (site, layer, rank), summed by the worker without locks and read by the per-layer observable
//! counters at each collection (a scrape or an OTLP export).
//!
//! ```text
//! LaneSeries ──(row, layer, ns)──> Row: dense cells, 64 layers a chunk (one writer: the worker)
//! collection ──> LayerTotals::each_section / each_wait ──> observable counters
//! ```
//!
//! The totals are written by one thread (the pipeline's, which holds `&mut Pipeline`), so a
//! cell is updated by a relaxed load and store, never a locked read-modify-write; collection
//! reads them concurrently and sees each counter only grow. Layers from 0 to
//! [`DENSE_LAYERS`] - 1 have dense cells; higher layer indices (no real model has them) are
//! summed in a map under a mutex, so nothing is lost.

use crate::config::LayerRanks;
use crate::names::attr;
use crate::vocab::{Section, Site};
use crate::worker::attrs::{section_layer_attrs, wait_attrs, wait_layer_attrs};
use opentelemetry::KeyValue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

/// Layers with dense cells; higher indices go to the (locked) sparse map.
pub(crate) const DENSE_LAYERS: u32 = 1024;
/// Cells per chunk: a row allocates its cells 64 layers (1 KiB) at a time.
const CHUNK: u32 = 64;
const CHUNKS: usize = (DENSE_LAYERS / CHUNK) as usize;

/// What a row sums: one section's time at one site, or the rendezvous waits at one site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum RowKind {
    Section(Section),
    Wait,
    /// The waits of a rank outside `PHASETRACE_LAYER_RANKS`: every layer's in one cell (layer
    /// 0), exported without the `layer` attribute.
    SiteWait,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct RowKey {
    pub(super) kind: RowKind,
    pub(super) site: Site,
    pub(super) rank: u32,
}

/// One layer's total time (ns) and calls.
#[derive(Default)]
struct Cell {
    ns: AtomicU64,
    calls: AtomicU64,
}

impl Cell {
    /// Single writer: see the module doc.
    #[inline]
    fn add(&self, ns: u64) {
        self.ns
            .store(self.ns.load(Relaxed).saturating_add(ns), Relaxed);
        self.calls
            .store(self.calls.load(Relaxed).saturating_add(1), Relaxed);
    }

    fn read(&self) -> (u64, u64) {
        (self.ns.load(Relaxed), self.calls.load(Relaxed))
    }
}

type Chunk = [Cell; CHUNK as usize];

/// The per-layer cells of one (kind, site, rank).
pub(crate) struct Row {
    key: RowKey,
    chunks: [OnceLock<Box<Chunk>>; CHUNKS],
}

impl Row {
    fn new(key: RowKey) -> Row {
        Row {
            key,
            chunks: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Adds one call of `ns` at `layer`; `false` when the layer has no dense cell.
    #[inline]
    fn add(&self, layer: u32, ns: u64) -> bool {
        let Some(chunk) = self.chunks.get((layer / CHUNK) as usize) else {
            return false;
        };
        let chunk = chunk.get_or_init(|| Box::new(std::array::from_fn(|_| Cell::default())));
        chunk[(layer % CHUNK) as usize].add(ns);
        true
    }

    /// Every layer with at least one call: (layer, ns, calls).
    fn each(&self, mut f: impl FnMut(u32, u64, u64)) {
        for (c, chunk) in self.chunks.iter().enumerate() {
            let Some(chunk) = chunk.get() else { continue };
            for (i, cell) in chunk.iter().enumerate() {
                let (ns, calls) = cell.read();
                if calls > 0 {
                    f(c as u32 * CHUNK + i as u32, ns, calls);
                }
            }
        }
    }
}

/// Time (ns) and calls per (section, layer, site, rank) and per rendezvous (site, layer,
/// rank): written by the worker, read by the per-layer observable counters at each collection.
/// One per profiler, shared by all its meter providers.
pub(crate) struct LayerTotals {
    /// `group` on every series.
    pub(super) group: KeyValue,
    /// Whether sections are summed per layer (`PHASETRACE_LAYER_ATTR`); waits always are, on
    /// the ranks of `layer_ranks`.
    pub(super) layer_attr: bool,
    /// The ranks with per-layer series (`PHASETRACE_LAYER_RANKS`); the others' waits are summed
    /// per site.
    layer_ranks: LayerRanks,
    /// Every row, in order of first use; locked when a lane meets a new (section, site) and
    /// at collection.
    rows: Mutex<Vec<Arc<Row>>>,
    /// Layers at or above [`DENSE_LAYERS`].
    sparse: Mutex<HashMap<(RowKey, u32), (u64, u64)>>,
}

impl LayerTotals {
    pub(crate) fn new(group: &str, layer_attr: bool, layer_ranks: LayerRanks) -> Arc<LayerTotals> {
        Arc::new(LayerTotals {
            group: KeyValue::new(
                attr::GROUP,
                opentelemetry::StringValue::from(Arc::<str>::from(group)),
            ),
            layer_attr,
            layer_ranks,
            rows: Mutex::default(),
            sparse: Mutex::default(),
        })
    }

    /// Whether `rank` exports per-layer series (`PHASETRACE_LAYER_RANKS`).
    pub(super) fn per_layer(&self, rank: u32) -> bool {
        self.layer_ranks.includes(rank)
    }

    /// `group` on every series: shared, so that cloning it never allocates.
    pub(crate) fn group(&self) -> &KeyValue {
        &self.group
    }

    /// The row of `key`, created on first use.
    pub(super) fn row(&self, key: RowKey) -> Arc<Row> {
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = rows.iter().find(|r| r.key == key) {
            return r.clone();
        }
        let r = Arc::new(Row::new(key));
        rows.push(r.clone());
        r
    }

    pub(super) fn add(&self, row: &Row, layer: u32, ns: u64) {
        if !row.add(layer, ns) {
            let mut m = self.sparse.lock().unwrap_or_else(|p| p.into_inner());
            let e = m.entry((row.key, layer)).or_default();
            e.0 = e.0.saturating_add(ns);
            e.1 = e.1.saturating_add(1);
        }
    }

    /// Every (key, layer, ns, calls), dense rows first.
    fn each(&self, mut f: impl FnMut(RowKey, u32, u64, u64)) {
        // The row list is copied out (Arc clones), so the worker waits at most for the copy.
        let rows: Vec<Arc<Row>> = self.rows.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for r in &rows {
            r.each(|layer, ns, calls| f(r.key, layer, ns, calls));
        }
        let sparse: Vec<_> = {
            let m = self.sparse.lock().unwrap_or_else(|p| p.into_inner());
            m.iter().map(|(k, v)| (*k, *v)).collect()
        };
        for ((key, layer), (ns, calls)) in sparse {
            f(key, layer, ns, calls);
        }
    }

    /// Calls `f(attributes, seconds, calls)` for every per-layer section total.
    pub(crate) fn each_section(&self, mut f: impl FnMut(&[KeyValue], f64, u64)) {
        self.each(|key, layer, ns, calls| {
            if let RowKind::Section(s) = key.kind {
                let kv = section_layer_attrs(&self.group, s, layer, key.site, key.rank);
                f(&kv, crate::worker::secs(ns), calls);
            }
        });
    }

    /// Calls `f(attributes, seconds, calls)` for every per-layer wait total, and for every
    /// per-site total of the ranks outside `PHASETRACE_LAYER_RANKS` (no `layer` attribute).
    pub(crate) fn each_wait(&self, mut f: impl FnMut(&[KeyValue], f64, u64)) {
        self.each(|key, layer, ns, calls| match key.kind {
            RowKind::Wait => {
                let kv = wait_layer_attrs(&self.group, key.site, layer, key.rank);
                f(&kv, crate::worker::secs(ns), calls);
            }
            RowKind::SiteWait => {
                let (kv, n) = wait_attrs(&self.group, key.site, key.rank);
                f(&kv[..n], crate::worker::secs(ns), calls);
            }
            RowKind::Section(_) => {}
        });
    }
}
