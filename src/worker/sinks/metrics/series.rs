//! Series: each rank's attribute sets, built once per (section, site) and reused for every
//! measurement; each measurement goes to every provider's histogram and, per layer, to the
//! lock-free totals of [`super::layers`].
//!
//! ```text
//! MetricsSink ──(section, site, layer, ns)──> LaneSeries: attributes built on first sight
//!                                              ├──> Instruments (each provider's histogram)
//!                                              └──> LayerTotals: the per-layer cells
//! ```
//!
//! Why: building and dropping four `KeyValue`s per section, and summing per-layer totals in a
//! `Mutex<HashMap>` keyed by a hashed tuple, cost the worker about a third of its time per
//! section; see `worker/drain_*` in `BENCHMARKS.md`.

use super::aggregate::Instruments;
use super::layers::{LayerTotals, Row, RowKey, RowKind};
use crate::vocab::{Layer, Section, Site};
use crate::worker::attrs::{section_attrs, step_attrs, wait_attrs};
use opentelemetry::KeyValue;
use std::sync::Arc;

/// The series of one section at one site of a lane's rank.
struct SectionSeries {
    site: Site,
    kv: [KeyValue; 4],
    n: usize,
    /// `None` with the layer attribute off.
    row: Option<Arc<Row>>,
}

/// The series of the rendezvous waits at one site of a lane's rank.
struct WaitSeries {
    site: Site,
    kv: [KeyValue; 3],
    n: usize,
    row: Arc<Row>,
}

/// A lane's attribute sets and rows, built on first use. The lane's rank never changes.
pub(crate) struct LaneSeries {
    rank: u32,
    totals: Arc<LayerTotals>,
    step: [KeyValue; 2],
    /// Indexed by section id; a few sites each, searched in order.
    sections: Vec<Vec<SectionSeries>>,
    waits: Vec<WaitSeries>,
}

impl LaneSeries {
    pub(crate) fn new(rank: u32, totals: Arc<LayerTotals>) -> LaneSeries {
        LaneSeries {
            rank,
            step: step_attrs(&totals.group, rank),
            totals,
            sections: Vec::new(),
            waits: Vec::new(),
        }
    }

    /// The attributes of this lane's steps.
    pub(crate) fn step(&self) -> &[KeyValue] {
        &self.step
    }

    /// One section of `ns` nanoseconds: every provider's histogram and, with the layer
    /// attribute on, the per-layer totals.
    #[inline]
    pub(crate) fn section(
        &mut self,
        inst: &[Instruments],
        s: Section,
        site: Site,
        layer: Layer,
        ns: u64,
    ) {
        if inst.is_empty() {
            return;
        }
        let secs = ns as f64 * 1e-9;
        let e = Self::section_series(&mut self.sections, &self.totals, self.rank, s, site);
        for i in inst {
            i.section(&e.kv[..e.n], secs);
        }
        if let (Some(row), Some(l)) = (&e.row, layer.get()) {
            self.totals.add(row, l, ns);
            for i in inst {
                i.section_layer(&e.kv[..e.n], l, secs);
            }
        }
    }

    /// One rendezvous wait of `ns` nanoseconds: every provider's histogram and the per-layer
    /// totals (kept with the layer attribute off too: two counters per (site, layer)).
    #[inline]
    pub(crate) fn wait(&mut self, inst: &[Instruments], site: Site, layer: Layer, ns: u64) {
        if inst.is_empty() {
            return;
        }
        let secs = ns as f64 * 1e-9;
        let e = Self::wait_series(&mut self.waits, &self.totals, self.rank, site);
        for i in inst {
            i.wait(&e.kv[..e.n], secs);
        }
        if let Some(l) = layer.get() {
            self.totals.add(&e.row, l, ns);
            for i in inst {
                i.wait_layer(&e.kv[..e.n], l, secs);
            }
        }
    }

    fn section_series<'a>(
        sections: &'a mut Vec<Vec<SectionSeries>>,
        totals: &LayerTotals,
        rank: u32,
        s: Section,
        site: Site,
    ) -> &'a SectionSeries {
        let i = usize::from(s.id());
        if sections.len() <= i {
            sections.resize_with(i + 1, Vec::new);
        }
        let at = match sections[i].iter().position(|e| e.site == site) {
            Some(at) => at,
            None => {
                let (kv, n) = section_attrs(&totals.group, s, site, rank);
                let row = totals.layer_attr.then(|| {
                    totals.row(RowKey {
                        kind: RowKind::Section(s),
                        site,
                        rank,
                    })
                });
                sections[i].push(SectionSeries { site, kv, n, row });
                sections[i].len() - 1
            }
        };
        &sections[i][at]
    }

    fn wait_series<'a>(
        waits: &'a mut Vec<WaitSeries>,
        totals: &LayerTotals,
        rank: u32,
        site: Site,
    ) -> &'a WaitSeries {
        let at = match waits.iter().position(|e| e.site == site) {
            Some(at) => at,
            None => {
                let (kv, n) = wait_attrs(&totals.group, site, rank);
                let row = totals.row(RowKey {
                    kind: RowKind::Wait,
                    site,
                    rank,
                });
                waits.push(WaitSeries { site, kv, n, row });
                waits.len() - 1
            }
        };
        &waits[at]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::attr;
    use crate::worker::sinks::metrics::layers::DENSE_LAYERS;
    use opentelemetry::metrics::MeterProvider;
    use std::collections::HashMap;

    /// One provider's instruments over `t`.
    fn inst(t: &Arc<LayerTotals>) -> Vec<Instruments> {
        let p = opentelemetry_sdk::metrics::SdkMeterProvider::builder().build();
        let open = crate::worker::open::OpenSteps::new(t.group().clone());
        vec![Instruments::new(&p.meter("test"), t, &open, 8)]
    }

    type Attrs = Vec<(String, String)>;

    /// (attributes, (ns, calls)) of every per-layer section total.
    fn sections(t: &LayerTotals) -> Vec<(Attrs, (u64, u64))> {
        let mut v = Vec::new();
        t.each_section(|kv, secs, calls| {
            let a = kv
                .iter()
                .map(|k| (k.key.as_str().to_owned(), k.value.to_string()))
                .collect();
            v.push((a, ((secs * 1e9).round() as u64, calls)));
        });
        v
    }

    #[test]
    fn dense_and_sparse_layers_sum_exactly() {
        let t = LayerTotals::new("g", true);
        let inst = inst(&t);
        let mut lane = LaneSeries::new(2, t.clone());
        let layers = [
            (0, 5),
            (0, 7),
            (63, 1),
            (64, 2),
            (DENSE_LAYERS - 1, 3),
            (DENSE_LAYERS, 4),
            (u32::MAX - 1, 9),
        ];
        for (layer, ns) in layers {
            lane.section(&inst, Section::KDA_MIXER, Site::ATTN, Layer(layer), ns);
        }
        // Untimed layer: histogram only.
        lane.section(&inst, Section::KDA_MIXER, Site::ATTN, Layer::NONE, 100);
        let got = sections(&t);
        let layer = |a: &[(String, String)]| {
            a.iter()
                .find(|(k, _)| k == attr::LAYER)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        let mut by_layer: Vec<(String, (u64, u64))> =
            got.iter().map(|(a, v)| (layer(a), *v)).collect();
        by_layer.sort();
        let want = |l: u32, ns: u64, calls: u64| (l.to_string(), (ns, calls));
        let mut expect = vec![
            want(0, 12, 2),
            want(63, 1, 1),
            want(64, 2, 1),
            want(DENSE_LAYERS - 1, 3, 1),
            want(DENSE_LAYERS, 4, 1),
            want(u32::MAX - 1, 9, 1),
        ];
        expect.sort();
        assert_eq!(by_layer, expect);
        let a = &got[0].0;
        for (k, v) in [
            ("bucket", "kda_mixer"),
            ("site", "attn"),
            ("rank", "2"),
            ("group", "g"),
        ] {
            assert!(
                a.contains(&(k.to_owned(), v.to_owned())),
                "{k}={v} in {a:?}"
            );
        }
    }

    #[test]
    fn lanes_of_one_rank_share_a_row_and_other_ranks_do_not() {
        let t = LayerTotals::new("g", true);
        let inst = inst(&t);
        let (mut a, mut b, mut c) = (
            LaneSeries::new(0, t.clone()),
            LaneSeries::new(0, t.clone()),
            LaneSeries::new(1, t.clone()),
        );
        a.section(&inst, Section::NORM, Site::NONE, Layer(3), 10);
        b.section(&inst, Section::NORM, Site::NONE, Layer(3), 20);
        c.section(&inst, Section::NORM, Site::NONE, Layer(3), 40);
        a.wait(&inst, Site::MLP, Layer(3), 1);
        let got = sections(&t);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].1, (30, 2));
        assert_eq!(got[1].1, (40, 1));
        let mut waits = 0;
        t.each_wait(|kv, _, calls| {
            waits += calls;
            assert!(!kv.iter().any(|k| k.key.as_str() == attr::BUCKET));
        });
        assert_eq!(waits, 1);
    }

    #[test]
    fn without_the_layer_attribute_sections_keep_no_per_layer_totals() {
        let t = LayerTotals::new("g", false);
        let inst = inst(&t);
        let mut lane = LaneSeries::new(0, t.clone());
        lane.section(&inst, Section::NORM, Site::NONE, Layer(1), 1);
        assert!(sections(&t).is_empty());
        lane.wait(&inst, Site::ATTN, Layer(1), 1);
        let mut n = 0;
        t.each_wait(|_, _, c| n += c);
        assert_eq!(n, 1, "waits are summed per layer either way");
    }

    #[test]
    fn without_a_meter_provider_nothing_is_summed() {
        let t = LayerTotals::new("g", true);
        let mut lane = LaneSeries::new(0, t.clone());
        lane.section(&[], Section::NORM, Site::NONE, Layer(1), 1);
        assert!(sections(&t).is_empty());
    }

    #[test]
    fn a_concurrent_reader_sees_every_counter_only_grow() {
        let t = LayerTotals::new("g", true);
        let inst = inst(&t);
        let reader = {
            let t = t.clone();
            std::thread::spawn(move || {
                let mut last: HashMap<String, (f64, u64)> = HashMap::new();
                for _ in 0..200 {
                    t.each_section(|kv, secs, calls| {
                        let key = format!("{kv:?}");
                        let prev = last.insert(key, (secs, calls)).unwrap_or((0.0, 0));
                        assert!(secs >= prev.0 && calls >= prev.1);
                    });
                }
            })
        };
        let mut lane = LaneSeries::new(0, t.clone());
        for i in 0..200_000u32 {
            lane.section(&inst, Section::MOE_EXPERTS, Site::MLP, Layer(i % 200), 1);
        }
        reader.join().unwrap();
        let total: u64 = sections(&t).iter().map(|(_, (_, calls))| calls).sum();
        assert_eq!(total, 200_000);
    }
}
