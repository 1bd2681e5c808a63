//! The attribute sets of every series the worker records, defined once: the histograms' (built
//! once per rank and reused, see [`super::sinks::metrics::series`]), the per-layer counters'
//! (built at each collection, see [`super::sinks::metrics::layers`]) and the exemplars' (keyed
//! on the histograms').

use crate::names::attr;
use crate::vocab::{Section, Site};
use opentelemetry::KeyValue;

/// The attributes of a section measurement (the first `n`): bucket, rank, group and site;
/// exemplars key on the same. Built once per (lane, section, site) by
/// [`super::sinks::metrics::series::LaneSeries`].
pub(crate) fn section_attrs(
    group: &KeyValue,
    s: Section,
    site: Site,
    rank: u32,
) -> ([KeyValue; 4], usize) {
    let mut kv: [KeyValue; 4] = [
        KeyValue::new(attr::BUCKET, s.as_str()),
        rank_attr(rank),
        group.clone(),
        KeyValue::new(attr::RANK, 0),
    ];
    let mut n = 3;
    if let Some(site) = site.as_str() {
        kv[n] = KeyValue::new(attr::SITE, site);
        n += 1;
    }
    (kv, n)
}

/// The attributes of a collective-wait measurement (the first `n`): rank, group and site.
pub(crate) fn wait_attrs(group: &KeyValue, site: Site, rank: u32) -> ([KeyValue; 3], usize) {
    let mut kv: [KeyValue; 3] = [rank_attr(rank), group.clone(), KeyValue::new(attr::RANK, 0)];
    let mut n = 2;
    if let Some(site) = site.as_str() {
        kv[n] = KeyValue::new(attr::SITE, site);
        n += 1;
    }
    (kv, n)
}

/// The attributes of a step measurement: `rank`, `group`, and `step.kind` when stated.
pub(crate) fn step_attrs(
    group: &KeyValue,
    rank: u32,
    kind: Option<crate::vocab::StepKind>,
) -> Vec<KeyValue> {
    let mut kv = vec![rank_attr(rank), group.clone()];
    if let Some(k) = kind {
        kv.push(KeyValue::new(attr::STEP_KIND, k.as_str()));
    }
    kv
}

pub(crate) fn rank_attr(rank: u32) -> KeyValue {
    KeyValue::new(attr::RANK, i64::from(rank))
}

/// The attributes of one per-layer section series: a section measurement's and `layer`.
pub(crate) fn section_layer_attrs(
    group: &KeyValue,
    s: Section,
    layer: u32,
    site: Site,
    rank: u32,
) -> Vec<KeyValue> {
    let (kv, n) = section_attrs(group, s, site, rank);
    let mut v: Vec<KeyValue> = kv[..n].to_vec();
    v.push(KeyValue::new(attr::LAYER, i64::from(layer)));
    v
}

/// The attributes of one per-layer wait series: a wait measurement's and `layer`.
pub(crate) fn wait_layer_attrs(
    group: &KeyValue,
    site: Site,
    layer: u32,
    rank: u32,
) -> Vec<KeyValue> {
    let (kv, n) = wait_attrs(group, site, rank);
    let mut v: Vec<KeyValue> = kv[..n].to_vec();
    v.push(KeyValue::new(attr::LAYER, i64::from(layer)));
    v
}
