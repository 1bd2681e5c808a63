//! Series: each rank's attribute sets, built once per (section, site) and reused for every
//! measurement, with their bound handles on each provider's instruments
//! ([`super::aggregate::Handles`]); each measurement goes to every provider's histogram and,
//! per layer, to the lock-free totals of [`super::layers`].
//!
//! ```text
//! MetricsSink ──(section, site, layer, ns)──> LaneSeries: attributes built on first sight
//!                                              ├──> Instruments (each provider's histogram,
//!                                              │    through the series' bound handles)
//!                                              └──> LayerTotals: the per-layer cells
//! ```
//!
//! Why: building and dropping four `KeyValue`s per section, and summing per-layer totals in a
//! `Mutex<HashMap>` keyed by a hashed tuple, cost the worker about a third of its time per
//! section; the SDK's hashing and lookup of the attribute set per record (one for the
//! histogram, one for the per-layer distribution, one per native twin) cost it most of the
//! rest, which the bound handles skip on an SDK provider; see `worker/drain_*` in
//! `BENCHMARKS.md`.

use super::aggregate::{Handles, Instruments};
use super::layers::{LayerTotals, Row, RowKey, RowKind};
use crate::vocab::{Layer, Section, Site, StepKind};
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
    /// Its bound handles on each provider's instruments, in the order of the instruments.
    handles: Vec<Handles>,
}

/// The series of the rendezvous waits at one site of a lane's rank.
struct WaitSeries {
    site: Site,
    kv: [KeyValue; 3],
    n: usize,
    row: Arc<Row>,
    /// Whether the rank exports per-layer series (`PHASETRACE_LAYER_RANKS`); else `row` sums
    /// every layer's waits in one cell.
    per_layer: bool,
    handles: Vec<Handles>,
}

/// A lane's attribute sets and rows, built on first use. The lane's rank never changes.
pub(crate) struct LaneSeries {
    rank: u32,
    totals: Arc<LayerTotals>,
    /// The step measurements' attributes by kind: no kind stated, then `StepKind::ALL`.
    step: [Vec<KeyValue>; 1 + StepKind::ALL.len()],
    /// Indexed by section id; a few sites each, searched in order.
    sections: Vec<Vec<SectionSeries>>,
    waits: Vec<WaitSeries>,
}

impl LaneSeries {
    pub(crate) fn new(rank: u32, totals: Arc<LayerTotals>) -> LaneSeries {
        LaneSeries {
            rank,
            step: std::array::from_fn(|i| {
                let kind = i.checked_sub(1).map(|k| StepKind::ALL[k]);
                step_attrs(&totals.group, rank, kind)
            }),
            totals,
            sections: Vec::new(),
            waits: Vec::new(),
        }
    }

    /// The attributes of this lane's steps of `kind`.
    pub(crate) fn step(&self, kind: Option<StepKind>) -> &[KeyValue] {
        // Codes 1 to 4, in the order of `StepKind::ALL`; 0 is "none stated".
        &self.step[kind.map_or(0, |k| k as usize)]
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
        let e = Self::section_series(&mut self.sections, &self.totals, inst, self.rank, s, site);
        let kv = &e.kv[..e.n];
        for (i, h) in inst.iter().zip(&mut e.handles) {
            i.section(kv, secs, h);
        }
        if let (Some(row), Some(l)) = (&e.row, layer.get()) {
            self.totals.add(row, l, ns);
            for (i, h) in inst.iter().zip(&mut e.handles) {
                i.section_layer(kv, l, secs, h);
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
        let e = Self::wait_series(&mut self.waits, &self.totals, inst, self.rank, site);
        let kv = &e.kv[..e.n];
        for (i, h) in inst.iter().zip(&mut e.handles) {
            i.wait(kv, secs, h);
        }
        if let Some(l) = layer.get() {
            if e.per_layer {
                self.totals.add(&e.row, l, ns);
                for (i, h) in inst.iter().zip(&mut e.handles) {
                    i.wait_layer(kv, l, secs, h);
                }
            } else {
                self.totals.add(&e.row, 0, ns);
            }
        }
    }

    fn section_series<'a>(
        sections: &'a mut Vec<Vec<SectionSeries>>,
        totals: &LayerTotals,
        inst: &[Instruments],
        rank: u32,
        s: Section,
        site: Site,
    ) -> &'a mut SectionSeries {
        let i = usize::from(s.id());
        if sections.len() <= i {
            sections.resize_with(i + 1, Vec::new);
        }
        let at = match sections[i].iter().position(|e| e.site == site) {
            Some(at) => at,
            None => {
                let (kv, n) = section_attrs(&totals.group, s, site, rank);
                let row = (totals.layer_attr && totals.per_layer(rank)).then(|| {
                    totals.row(RowKey {
                        kind: RowKind::Section(s),
                        site,
                        rank,
                    })
                });
                let handles = inst.iter().map(|_| Handles::default()).collect();
                sections[i].push(SectionSeries {
                    site,
                    kv,
                    n,
                    row,
                    handles,
                });
                sections[i].len() - 1
            }
        };
        &mut sections[i][at]
    }

    fn wait_series<'a>(
        waits: &'a mut Vec<WaitSeries>,
        totals: &LayerTotals,
        inst: &[Instruments],
        rank: u32,
        site: Site,
    ) -> &'a mut WaitSeries {
        let at = match waits.iter().position(|e| e.site == site) {
            Some(at) => at,
            None => {
                let (kv, n) = wait_attrs(&totals.group, site, rank);
                let per_layer = totals.per_layer(rank);
                let row = totals.row(RowKey {
                    kind: if per_layer {
                        RowKind::Wait
                    } else {
                        RowKind::SiteWait
                    },
                    site,
                    rank,
                });
                let handles = inst.iter().map(|_| Handles::default()).collect();
                waits.push(WaitSeries {
                    site,
                    kv,
                    n,
                    row,
                    per_layer,
                    handles,
                });
                waits.len() - 1
            }
        };
        &mut waits[at]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LayerRanks;
    use crate::names::{attr, metric};
    use crate::worker::sinks::metrics::aggregate::Bind;
    use crate::worker::sinks::metrics::layers::DENSE_LAYERS;
    use opentelemetry::metrics::MeterProvider;
    use opentelemetry_sdk::metrics::InMemoryMetricExporter;
    use std::collections::HashMap;

    /// One provider's instruments over `t`.
    fn inst(t: &Arc<LayerTotals>) -> Vec<Instruments> {
        let p = opentelemetry_sdk::metrics::SdkMeterProvider::builder().build();
        let open = crate::worker::open::OpenSteps::new(t.group().clone());
        vec![Instruments::new(
            &p.meter("test"),
            t,
            &open,
            8,
            &Default::default(),
        )]
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
        let t = LayerTotals::new("g", true, LayerRanks::All);
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
        let t = LayerTotals::new("g", true, LayerRanks::All);
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
        let t = LayerTotals::new("g", false, LayerRanks::All);
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
    fn ranks_outside_the_layer_ranks_sum_their_waits_per_site_and_keep_no_per_layer_sections() {
        let t = LayerTotals::new("g", true, "0".parse::<LayerRanks>().unwrap());
        let inst = inst(&t);
        let (mut detail, mut other) =
            (LaneSeries::new(0, t.clone()), LaneSeries::new(1, t.clone()));
        for layer in 0..3 {
            detail.section(&inst, Section::NORM, Site::NONE, Layer(layer), 10);
            other.section(&inst, Section::NORM, Site::NONE, Layer(layer), 10);
            detail.wait(&inst, Site::ATTN, Layer(layer), 5);
            other.wait(&inst, Site::ATTN, Layer(layer), 7);
        }
        let got = sections(&t);
        assert_eq!(got.len(), 3, "rank 0's three layers only: {got:?}");
        assert!(
            got.iter()
                .all(|(a, _)| a.contains(&("rank".into(), "0".into())))
        );
        let mut waits: Vec<(String, Option<String>, u64, u64)> = Vec::new();
        t.each_wait(|kv, secs, calls| {
            let get = |k: &str| {
                kv.iter()
                    .find(|x| x.key.as_str() == k)
                    .map(|x| x.value.to_string())
            };
            waits.push((
                get(attr::RANK).unwrap(),
                get(attr::LAYER),
                (secs * 1e9).round() as u64,
                calls,
            ));
        });
        waits.sort();
        assert_eq!(
            waits,
            vec![
                ("0".into(), Some("0".into()), 5, 1),
                ("0".into(), Some("1".into()), 5, 1),
                ("0".into(), Some("2".into()), 5, 1),
                ("1".into(), None, 21, 3),
            ]
        );
    }

    #[test]
    fn without_a_meter_provider_nothing_is_summed() {
        let t = LayerTotals::new("g", true, LayerRanks::All);
        let mut lane = LaneSeries::new(0, t.clone());
        lane.section(&[], Section::NORM, Site::NONE, Layer(1), 1);
        assert!(sections(&t).is_empty());
    }

    /// Per data point of the histogram `name` in what `provider`'s in-memory exporter got:
    /// (attributes, count), sorted.
    fn points(
        exporter: &opentelemetry_sdk::metrics::InMemoryMetricExporter,
        name: &str,
    ) -> Vec<(Attrs, u64)> {
        use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
        let all = exporter.get_finished_metrics().expect("exported");
        let rm = all.last().expect("one export");
        let attrs = |it: &mut dyn Iterator<Item = &KeyValue>| -> Attrs {
            let mut a: Attrs = it
                .map(|k| (k.key.as_str().to_owned(), k.value.to_string()))
                .collect();
            a.sort();
            a
        };
        let mut v: Vec<(Attrs, u64)> = Vec::new();
        for m in rm.scope_metrics().flat_map(|s| s.metrics()) {
            if m.name() != name {
                continue;
            }
            match m.data() {
                AggregatedMetrics::F64(MetricData::Histogram(h)) => v.extend(
                    h.data_points()
                        .map(|p| (attrs(&mut p.attributes()), p.count())),
                ),
                AggregatedMetrics::F64(MetricData::ExponentialHistogram(h)) => v.extend(
                    h.data_points()
                        .map(|p| (attrs(&mut p.attributes()), p.count() as u64)),
                ),
                other => panic!("{name}: {other:?}"),
            }
        }
        v.sort();
        v
    }

    /// Records `n` sections over `layers` layers and waits over the same layers through
    /// instruments that bind or not, on a provider whose per-layer distributions keep at
    /// most `limit` series; what its exporter got.
    fn exported(bind: Bind, n: u32, layers: u32, limit: usize) -> InMemoryMetricExporter {
        use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Stream};
        let exporter = InMemoryMetricExporter::default();
        let p = SdkMeterProvider::builder()
            .with_reader(
                PeriodicReader::builder(exporter.clone())
                    .with_interval(std::time::Duration::from_secs(3600))
                    .build(),
            )
            .with_view(move |i: &opentelemetry_sdk::metrics::Instrument| {
                metric::LAYER_DISTRIBUTIONS.contains(&i.name()).then(|| {
                    Stream::builder()
                        .with_cardinality_limit(limit)
                        .build()
                        .expect("a stream")
                })
            })
            .build();
        let t = LayerTotals::new("g", true, LayerRanks::All);
        let open = crate::worker::open::OpenSteps::new(t.group().clone());
        let m = p.meter("test");
        let inst = vec![
            Instruments::new(&m, &t, &open, 8, &Default::default())
                .with_bind(bind)
                .with_distributions(Some((&m, bind)), None),
        ];
        let mut lane = LaneSeries::new(0, t.clone());
        for i in 0..n {
            lane.section(&inst, Section::NORM, Site::NONE, Layer(i % layers), 1_000);
            lane.wait(&inst, Site::MLP, Layer(i % layers), 1_000);
        }
        // One record past the layers that keep a handle: recorded by attributes.
        lane.section(&inst, Section::NORM, Site::NONE, Layer(u32::MAX - 1), 1_000);
        p.force_flush().expect("flush");
        exporter
    }

    #[test]
    fn bound_and_unbound_records_export_the_same_series() {
        let (n, layers) = (1_000, 96);
        let bound = exported(Bind::Bound, n, layers, 8_192);
        let unbound = exported(Bind::Unbound, n, layers, 8_192);
        for name in [
            metric::SECTION_DURATION,
            metric::COLLECTIVE_WAIT,
            metric::SECTION_LAYER_DURATION,
            metric::COLLECTIVE_LAYER_WAIT_DURATION,
        ] {
            let (b, u) = (points(&bound, name), points(&unbound, name));
            assert!(!b.is_empty(), "{name}: nothing exported");
            assert_eq!(b, u, "{name}");
        }
        let layer = points(&bound, metric::SECTION_LAYER_DURATION);
        assert_eq!(layer.len(), layers as usize + 1, "one series per layer");
        assert_eq!(layer.iter().map(|(_, c)| c).sum::<u64>(), u64::from(n) + 1);
        assert_eq!(
            points(&bound, metric::SECTION_DURATION),
            vec![(
                vec![
                    ("bucket".to_owned(), "norm".to_owned()),
                    ("group".to_owned(), "g".to_owned()),
                    ("rank".to_owned(), "0".to_owned()),
                ],
                u64::from(n) + 1
            )]
        );
    }

    #[test]
    fn bound_records_past_the_cardinality_limit_are_counted_in_the_overflow_series() {
        let (n, layers, limit) = (1_000, 96, 10);
        let bound = exported(Bind::Bound, n, layers, limit);
        let unbound = exported(Bind::Unbound, n, layers, limit);
        for name in [
            metric::SECTION_LAYER_DURATION,
            metric::COLLECTIVE_LAYER_WAIT_DURATION,
        ] {
            let b = points(&bound, name);
            assert_eq!(b, points(&unbound, name), "{name}");
            // The SDK keeps `limit` series of their own and folds the rest into one.
            assert_eq!(b.len(), limit + 1, "{name}: {b:?}");
            let overflow: u64 = b
                .iter()
                .filter(|(a, _)| a.iter().any(|(k, _)| k == "otel.metric.overflow"))
                .map(|(_, c)| c)
                .sum();
            assert!(overflow > 0, "{name}: no overflow series in {b:?}");
            let total: u64 = b.iter().map(|(_, c)| c).sum();
            let want = u64::from(n) + u64::from(name == metric::SECTION_LAYER_DURATION);
            assert_eq!(total, want, "{name}: every record counted");
        }
    }

    #[test]
    fn a_concurrent_reader_sees_every_counter_only_grow() {
        let t = LayerTotals::new("g", true, LayerRanks::All);
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
