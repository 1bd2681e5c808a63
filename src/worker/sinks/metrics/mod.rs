//! The metrics sink: every event into each meter provider's instruments, the per-layer totals
//! and the expert load, and every drop into `phasetrace.records.dropped` and [`Dropped`].
//!
//! ```text
//! Section, Wait ──> LaneSeries of the rank (attributes built once) ─┬─> Instruments (each
//!                                                                    │   provider's histograms)
//!                                                                    └─> LayerTotals (per layer)
//! Step ──> step histograms, and the expert window of the rank    Route ──> ExpertWriter
//! Round ──> phase, part and round instruments                    Dropped ──> counted here only
//! ```

pub(crate) mod aggregate;
pub(crate) mod attachment;
pub(crate) mod engine;
pub(crate) mod experts;
pub(crate) mod layers;
pub(crate) mod series;

use crate::names::DropReason;
use crate::vocab::Phase;
use crate::worker::event::Event;
use crate::worker::stats::Dropped;
use aggregate::Instruments;
use experts::{ExpertTotals, ExpertWriter};
use layers::LayerTotals;
use series::LaneSeries;
use std::sync::Arc;

/// The instruments of every meter provider, the series of every rank, the expert writer and
/// the drop counts.
pub(crate) struct MetricsSink {
    inst: Vec<Instruments>,
    /// The per-layer totals every provider's instruments read.
    layers: Arc<LayerTotals>,
    /// Each rank's attribute sets and per-layer rows, built on first use.
    series: Vec<(u32, LaneSeries)>,
    /// Index into `series` of the last rank recorded.
    last: usize,
    experts: ExpertWriter,
    dropped: Dropped,
}

impl MetricsSink {
    /// `inst`: one set per meter provider (none: drops and expert load are still counted); `layers`: the
    /// totals their per-layer counters read; `experts`: the expert load of the profiler.
    pub(crate) fn new(
        inst: Vec<Instruments>,
        layers: Arc<LayerTotals>,
        experts: Arc<ExpertTotals>,
    ) -> MetricsSink {
        MetricsSink {
            inst,
            layers,
            series: Vec::new(),
            last: 0,
            experts: ExpertWriter::new(experts),
            dropped: Dropped::default(),
        }
    }

    /// Sections and waits (most events) are recorded inline; the rest out of line.
    #[inline(always)]
    pub(crate) fn on(&mut self, e: &Event<'_>) {
        match *e {
            Event::Section {
                rank,
                section,
                site,
                layer,
                ns,
                ..
            } => series_of(&mut self.series, &mut self.last, &self.layers, rank)
                .section(&self.inst, section, site, layer, ns),
            Event::Wait {
                rank,
                site,
                layer,
                ns,
            } => series_of(&mut self.series, &mut self.last, &self.layers, rank)
                .wait(&self.inst, site, layer, ns),
            _ => self.on_other(e),
        }
    }

    #[inline(never)]
    fn on_other(&mut self, e: &Event<'_>) {
        match *e {
            Event::Section { .. } | Event::Wait { .. } | Event::Drained => {}
            Event::Route { rank, layer, ids } => {
                if self.experts.is_on() {
                    let out = self.experts.route(rank, layer, ids);
                    self.drop(DropReason::OutOfRange, out);
                }
            }
            Event::Step(s) => {
                let (secs, wait) = (s.ns as f64 * 1e-9, s.wait_ns as f64 * 1e-9);
                let kv =
                    series_of(&mut self.series, &mut self.last, &self.layers, s.rank).step(s.kind);
                for inst in &self.inst {
                    inst.step(kv, secs, wait);
                    if !s.batch.is_empty() {
                        inst.batch(kv, s.batch.len());
                        inst.step_tokens(kv, s.batch);
                    }
                }
                if self.experts.is_on() {
                    self.experts.step_end(s.rank);
                }
            }
            Event::Round(r) => {
                for inst in &self.inst {
                    for p in Phase::ALL {
                        let ns = r.phases[p as usize];
                        // A phase that never ran in this round is not a zero-length phase.
                        if ns > 0 || r.ran & (1 << p as u8) != 0 {
                            inst.phase(p, r.rank, ns as f64 * 1e-9);
                        }
                    }
                    inst.round(r.rank, r.k, r.accepted);
                }
                if let Some(split) = r.split {
                    for inst in &self.inst {
                        for (name, v) in split.by_name() {
                            inst.part(name, r.rank, v as f64 * 1e-9);
                        }
                    }
                }
            }
            Event::Dropped { reason, n } => self.drop(reason, n),
            Event::RequestTraced(_) => {}
            Event::Request(r) => {
                let kv = request_attrs(r, self.layers.group());
                for inst in &self.inst {
                    inst.request(r, &kv);
                }
            }
        }
    }

    /// Counts `n` records dropped for `reason`: in the stats and in every provider's
    /// `phasetrace.records.dropped`. The one place the worker counts a drop.
    fn drop(&mut self, reason: DropReason, n: u64) {
        if n == 0 {
            return;
        }
        self.dropped.add(reason, n);
        for i in &self.inst {
            i.dropped(reason, n);
        }
    }

    pub(crate) fn dropped(&self) -> Dropped {
        self.dropped
    }

    #[cfg(test)]
    pub(crate) fn instruments(&self) -> &[Instruments] {
        &self.inst
    }

    #[cfg(test)]
    pub(crate) fn layers(&self) -> &LayerTotals {
        &self.layers
    }

    #[cfg(test)]
    pub(crate) fn experts(&self) -> &ExpertTotals {
        self.experts.totals()
    }
}

/// The GenAI attributes of a request's measurements: operation, provider, requested and
/// response model, `error.type` when it failed, and `group`.
pub(crate) fn request_attrs(
    r: &crate::worker::event::Request,
    group: &opentelemetry::KeyValue,
) -> Vec<opentelemetry::KeyValue> {
    use crate::names::attr;
    use opentelemetry::KeyValue;
    let k = &r.kind;
    let mut kv = vec![
        KeyValue::new(attr::GEN_AI_OPERATION_NAME, k.operation.clone()),
        KeyValue::new(attr::GEN_AI_PROVIDER_NAME, k.provider.clone()),
        KeyValue::new(attr::GEN_AI_REQUEST_MODEL, k.model.clone()),
        KeyValue::new(attr::GEN_AI_RESPONSE_MODEL, k.response().to_owned()),
        group.clone(),
    ];
    if let Some(e) = r.finish.error_type() {
        kv.push(KeyValue::new(attr::ERROR_TYPE, e));
    }
    kv
}

/// The series of `rank`, built on its first measurement; `last` caches where the previous
/// rank's were (one lane, or a few ranks, per worker).
#[inline(always)]
fn series_of<'a>(
    series: &'a mut Vec<(u32, LaneSeries)>,
    last: &mut usize,
    layers: &Arc<LayerTotals>,
    rank: u32,
) -> &'a mut LaneSeries {
    if series.get(*last).is_none_or(|(r, _)| *r != rank) {
        *last = match series.iter().position(|(r, _)| *r == rank) {
            Some(i) => i,
            None => {
                series.push((rank, LaneSeries::new(rank, layers.clone())));
                series.len() - 1
            }
        };
    }
    &mut series[*last].1
}
