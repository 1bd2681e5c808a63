//! Exemplars: for each histogram series and bucket, the latest traced step, section or probe
//! that landed there, as (trace id, span id, value, time).
//!
//! ```text
//! worker: spans built for a kept step ──offer──> pending (keyed by span id)
//! span exporter: batch exported ok ──settle──> visible (series, bucket) ; failed: forgotten
//! /metrics encoder ──series_of(metric, attributes)──> one exemplar per bucket, OpenMetrics text
//! OTLP metrics exporter ──series_of──> every bucket's exemplar on the data point (proto_metrics)
//! ```
//!
//! An exemplar becomes visible only once the span it names has been exported: a dashboard
//! never links to a trace the collector did not get. Only the duration histograms of
//! [`EXEMPLAR_METRICS`] carry exemplars; memory is bounded by [`SERIES_MAX`] series and
//! [`PENDING_MAX`] pending spans (beyond, new exemplars are not kept: they are a sample, not
//! records).
// `series` and `all` are read by tests; the encoder reads `series_of`.
#![cfg_attr(not(test), allow(dead_code))]

use crate::names::metric;
use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanId, TraceId};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// The histograms that carry exemplars: the step, section and wait durations, and the GenAI
/// request histograms (whose exemplars point at request spans).
pub(crate) const EXEMPLAR_METRICS: [&str; 6] = [
    metric::STEP_DURATION,
    metric::SECTION_DURATION,
    metric::COLLECTIVE_WAIT,
    metric::GEN_AI_SERVER_REQUEST_DURATION,
    metric::GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
    metric::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
];
/// Most buckets of a histogram with exemplars: one per boundary, plus `+Inf` (the duration
/// histograms have the most).
pub(crate) const BUCKETS: usize = metric::DURATION_BOUNDARIES.len() + 1;

/// The explicit boundaries of `metric`, one of [`EXEMPLAR_METRICS`].
pub(crate) fn boundaries(metric: &str) -> &'static [f64] {
    match metric {
        metric::GEN_AI_SERVER_REQUEST_DURATION => &metric::GEN_AI_REQUEST_DURATION_BOUNDARIES,
        metric::GEN_AI_SERVER_TIME_TO_FIRST_TOKEN => &metric::GEN_AI_TTFT_BOUNDARIES,
        metric::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN => &metric::GEN_AI_TPOT_BOUNDARIES,
        _ => &metric::DURATION_BOUNDARIES,
    }
}

/// The bucket of `metric` that `value` (seconds) falls in: the first whose upper bound is at
/// least `value` (`le` is inclusive), else `+Inf` (the slot after the last boundary).
pub(crate) fn bucket_of_metric(metric: &str, value: f64) -> usize {
    let b = boundaries(metric);
    b.iter().position(|&x| value <= x).unwrap_or(b.len())
}
/// Most series with exemplars (the SDK keeps at most 2,000 series per instrument).
pub(crate) const SERIES_MAX: usize = 3 * 2_000;
/// Most exemplars waiting for their span's export.
pub(crate) const PENDING_MAX: usize = 1 << 16;
/// A pending exemplar whose span was neither exported nor failed by then is forgotten.
const PENDING_TTL: Duration = Duration::from_secs(60);

/// One exemplar: the traced span a histogram measurement came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Exemplar {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    /// The measurement, in the histogram's unit (seconds).
    pub(crate) value: f64,
    /// When it was measured (the span's end).
    pub(crate) time: SystemTime,
}

/// The bucket of a duration histogram that `value` (seconds) falls in: the first whose upper
/// bound is at least `value` (`le` is inclusive), else `+Inf`.
pub(crate) fn bucket_of(value: f64) -> usize {
    metric::DURATION_BOUNDARIES
        .iter()
        .position(|&b| value <= b)
        .unwrap_or(BUCKETS - 1)
}

/// A series' attributes, sorted by key, as `k=v` joined by `\x1f`.
type SeriesKey = String;
pub(crate) type Buckets = [Option<Exemplar>; BUCKETS];

fn series_key<'a>(attrs: impl Iterator<Item = (&'a str, String)>) -> String {
    let mut kv: Vec<(&str, String)> = attrs.collect();
    kv.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut out = String::new();
    for (i, (k, v)) in kv.iter().enumerate() {
        if i > 0 {
            out.push('\x1f');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out
}

/// The exemplars of one series, as [`ExemplarStore::all`] lists them.
#[derive(Debug)]
pub(crate) struct SeriesExemplars {
    pub(crate) metric: &'static str,
    /// Sorted by key.
    pub(crate) attributes: Vec<(String, String)>,
    /// One slot per bucket (`le` order, `+Inf` last).
    pub(crate) buckets: Buckets,
}

struct Pending {
    metric: &'static str,
    series: SeriesKey,
    bucket: usize,
    exemplar: Exemplar,
    since: Instant,
}

#[derive(Default)]
struct Inner {
    visible: HashMap<&'static str, HashMap<SeriesKey, Buckets>>,
    series: usize,
    /// Keyed by span id; a probe section's span carries two (section and wait).
    pending: HashMap<u64, Vec<Pending>>,
    pending_len: usize,
    swept: Option<Instant>,
}

/// The exemplars of one profiler, shared by the worker, the span exporter and the encoder.
#[derive(Default)]
pub(crate) struct ExemplarStore {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ExemplarStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("ExemplarStore")
            .field("series", &i.series)
            .field("pending", &i.pending_len)
            .finish()
    }
}

impl ExemplarStore {
    /// Offers the exemplar of a measurement of `metric` with `attrs` (as recorded), which
    /// becomes visible once its span is exported.
    pub(crate) fn offer(&self, metric: &'static str, attrs: &[KeyValue], exemplar: Exemplar) {
        debug_assert!(
            EXEMPLAR_METRICS.contains(&metric),
            "{metric} has no exemplars"
        );
        let series = series_key(
            attrs
                .iter()
                .map(|kv| (kv.key.as_str(), kv.value.to_string())),
        );
        let mut i = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if i.pending_len >= PENDING_MAX {
            i.sweep(now);
            if i.pending_len >= PENDING_MAX {
                return;
            }
        }
        i.pending_len += 1;
        let id = u64::from_be_bytes(exemplar.span_id.to_bytes());
        i.pending.entry(id).or_default().push(Pending {
            metric,
            series,
            bucket: bucket_of_metric(metric, exemplar.value),
            exemplar,
            since: now,
        });
    }

    /// Whether any exemplar waits for a span's export (the exporter skips its work if not).
    pub(crate) fn has_pending(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending_len
            > 0
    }

    /// The spans `ids` were exported (`ok`) or lost: their exemplars become visible or are
    /// forgotten.
    pub(crate) fn settle(&self, ids: &[SpanId], ok: bool) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let i = &mut *guard;
        for id in ids {
            let Some(ps) = i.pending.remove(&u64::from_be_bytes(id.to_bytes())) else {
                continue;
            };
            i.pending_len -= ps.len();
            if !ok {
                continue;
            }
            for p in ps {
                let full = i.series >= SERIES_MAX;
                let m = i.visible.entry(p.metric).or_default();
                match m.get_mut(&p.series) {
                    Some(b) => b[p.bucket] = Some(p.exemplar),
                    None if !full => {
                        let mut b = [None; BUCKETS];
                        b[p.bucket] = Some(p.exemplar);
                        m.insert(p.series, b);
                        i.series += 1;
                    }
                    None => {}
                }
            }
        }
        let now = Instant::now();
        if i.swept.is_none_or(|t| now.duration_since(t) > PENDING_TTL) {
            i.sweep(now);
        }
    }

    /// The exemplars of one series, one slot per bucket (`le` order, `+Inf` last); `attrs` in
    /// any order, values as the encoder prints them (`rank="0"`: `("rank", "0")`).
    pub(crate) fn series(&self, metric: &str, attrs: &[(&str, &str)]) -> Buckets {
        self.lookup(
            metric,
            &series_key(attrs.iter().map(|(k, v)| (*k, (*v).to_owned()))),
        )
    }

    /// [`ExemplarStore::series`] for attributes as the SDK reports a data point's.
    pub(crate) fn series_of<'a>(
        &self,
        metric: &str,
        attrs: impl IntoIterator<Item = &'a KeyValue>,
    ) -> Buckets {
        if !EXEMPLAR_METRICS.contains(&metric) {
            return [None; BUCKETS];
        }
        let key = series_key(
            attrs
                .into_iter()
                .map(|kv| (kv.key.as_str(), kv.value.to_string())),
        );
        self.lookup(metric, &key)
    }

    /// The visible exemplars of the series `key` of `metric`, one slot per bucket.
    fn lookup(&self, metric: &str, key: &SeriesKey) -> Buckets {
        let i = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        i.visible
            .get(metric)
            .and_then(|m| m.get(key))
            .copied()
            .unwrap_or([None; BUCKETS])
    }

    /// Every series with exemplars.
    pub(crate) fn all(&self) -> Vec<SeriesExemplars> {
        let i = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (m, series) in &i.visible {
            for (k, b) in series {
                let attrs = k
                    .split('\x1f')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                out.push(SeriesExemplars {
                    metric: m,
                    attributes: attrs,
                    buckets: *b,
                });
            }
        }
        out
    }
}

impl Inner {
    fn sweep(&mut self, now: Instant) {
        self.swept = Some(now);
        let mut gone = 0;
        self.pending.retain(|_, ps| {
            let keep = ps.iter().any(|p| now.duration_since(p.since) < PENDING_TTL);
            if !keep {
                gone += ps.len();
            }
            keep
        });
        self.pending_len -= gone;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(span: u64, value: f64) -> Exemplar {
        Exemplar {
            trace_id: TraceId::from(0xabc_u128),
            span_id: SpanId::from(span),
            value,
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_578_880_123),
        }
    }

    #[test]
    fn an_exemplar_is_visible_only_after_its_span_is_exported() {
        let s = ExemplarStore::default();
        let attrs = [KeyValue::new("rank", 0), KeyValue::new("bucket", "norm")];
        s.offer(metric::SECTION_DURATION, &attrs, ex(7, 0.0042));
        s.offer(metric::SECTION_DURATION, &attrs, ex(8, 0.0043));
        assert!(s.has_pending());
        let none = s.series(
            metric::SECTION_DURATION,
            &[("bucket", "norm"), ("rank", "0")],
        );
        assert!(none.iter().all(Option::is_none));
        s.settle(&[SpanId::from(8)], false);
        s.settle(&[SpanId::from(7)], true);
        assert!(!s.has_pending());
        // 4.2 ms falls in the (2 ms, 5 ms] bucket; attribute order does not matter.
        let got = s.series(
            metric::SECTION_DURATION,
            &[("rank", "0"), ("bucket", "norm")],
        );
        let i = bucket_of(0.0042);
        assert_eq!(metric::DURATION_BOUNDARIES[i], 5e-3);
        assert_eq!(got[i], Some(ex(7, 0.0042)));
        assert_eq!(got.iter().filter(|e| e.is_some()).count(), 1);
        let all = s.all();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].metric, metric::SECTION_DURATION);
        assert_eq!(all[0].buckets, got);
        assert_eq!(
            all[0].attributes,
            [
                ("bucket".into(), "norm".into()),
                ("rank".into(), "0".into())
            ]
        );
        assert_eq!(s.series_of(metric::SECTION_DURATION, &attrs), got);
        // Another metric's series with the same attributes has none.
        let other = s.series(
            metric::COLLECTIVE_WAIT,
            &[("rank", "0"), ("bucket", "norm")],
        );
        assert!(other.iter().all(Option::is_none));
    }

    #[test]
    fn buckets_follow_the_inclusive_upper_bounds() {
        assert_eq!(bucket_of(1e-6), 0);
        assert_eq!(bucket_of(1.5e-6), 1);
        assert_eq!(bucket_of(10.0), BUCKETS - 2);
        assert_eq!(bucket_of(11.0), BUCKETS - 1);
    }
}
