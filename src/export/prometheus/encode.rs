//! The formats of `/metrics`: the classic Prometheus text format (0.0.4) and OpenMetrics
//! 1.0.0, written from what the SDK collected, and the delimited protobuf format
//! ([`encode_protobuf`], messages in `super::proto`) that carries native histograms.
//!
//! ```text
//! ResourceMetrics ─► target_info, otel_scope_info (once each)
//!                 ─► per metric: # HELP / # TYPE (/ # UNIT), then its samples
//!                    counter   name_total{..} v
//!                    gauge     name{..} v
//!                    histogram name_bucket{..,le=".."} n [# {exemplar} v t]   (exemplar: OpenMetrics only)
//!                              name_sum{..} s, name_count{..} n
//!                 ─► # EOF (OpenMetrics)
//! ```
//!
//! Names follow the OpenTelemetry-to-Prometheus rules: dots become underscores, the unit is
//! appended (`s` -> `_seconds`; annotations such as `{token}` add nothing) and counters end in
//! `_total`. The instrumentation scope is written once, as `otel_scope_info`, instead of an
//! `otel_scope_name` label on every line.
//!
//! The lines themselves (headers, label escaping, sample lines, exemplars, `# EOF`) and the
//! spelling of values are `phasetrace_encode::text`'s, the writer the importer's OpenMetrics
//! backfill uses too.

use super::proto;
use crate::names::metric;
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{
    AggregatedMetrics, Gauge, Histogram, HistogramDataPoint, Metric, MetricData, ResourceMetrics,
    Sum,
};
pub(crate) use phasetrace_encode::text::Exemplar;
use phasetrace_encode::text::{Exposition, float};
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// Which text format a scrape gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// `text/plain; version=0.0.4`.
    Classic,
    /// `application/openmetrics-text; version=1.0.0` (or the `0.0.1` draft Prometheus also
    /// asks for: the same text).
    OpenMetrics {
        /// The version echoed in the content type.
        version: &'static str,
    },
    /// The delimited protobuf format (`io.prometheus.client.MetricFamily` messages, each
    /// length-prefixed): the one that carries native histograms ([`encode_protobuf`]).
    Protobuf,
}

impl Format {
    /// The `Content-Type` of a response in this format.
    pub(crate) fn content_type(self) -> String {
        match self {
            Format::Classic => "text/plain; version=0.0.4; charset=utf-8".to_owned(),
            Format::OpenMetrics { version } => {
                format!("application/openmetrics-text; version={version}; charset=utf-8")
            }
            Format::Protobuf => PROTOBUF_CONTENT_TYPE.to_owned(),
        }
    }
}

/// The content type of the delimited protobuf format, as Prometheus asks for it.
pub(crate) const PROTOBUF_CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// A source of exemplars beyond the SDK's own: given a histogram's Prometheus base name, its
/// data point's attributes and a bucket index (`bounds.len()` for `+Inf`), the exemplar to
/// show on that bucket line.
pub(crate) type ExemplarSource<'a> = &'a dyn Fn(&str, &[KeyValue], usize) -> Option<Exemplar>;

/// What one encoding wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Encoded {
    /// Sample lines (series).
    pub(crate) series: usize,
}

/// Writes `rm` in `format` to `out`; `exemplars` may add exemplars to histogram buckets.
pub(crate) fn encode(
    rm: &ResourceMetrics,
    format: Format,
    exemplars: Option<ExemplarSource<'_>>,
    out: &mut String,
) -> Encoded {
    let mut w = Writer {
        x: Exposition::new(out, matches!(format, Format::OpenMetrics { .. })),
        exemplars,
    };
    let resource: Vec<KeyValue> = rm
        .resource()
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    if !resource.is_empty() {
        w.info("target", "Target metadata", &resource);
    }
    let mut scopes = rm.scope_metrics().peekable();
    if scopes.peek().is_some() {
        w.header(
            "otel_scope",
            "Instrumentation scope metadata",
            w.info_type(),
            "",
        );
    }
    for sm in rm.scope_metrics() {
        let scope = sm.scope();
        let mut kv = vec![KeyValue::new("otel_scope_name", scope.name().to_owned())];
        if let Some(v) = scope.version() {
            kv.push(KeyValue::new("otel_scope_version", v.to_owned()));
        }
        w.sample("otel_scope_info", &kv, None, "1");
    }
    for sm in rm.scope_metrics() {
        for m in sm.metrics() {
            w.metric(m);
        }
    }
    w.x.eof();
    Encoded {
        series: w.x.lines(),
    }
}

struct Writer<'a, 'e> {
    x: Exposition<'a>,
    exemplars: Option<ExemplarSource<'e>>,
}

// The naming rule is public in the contract (`names::prometheus`): the importer writes the same
// series from outside the crate.
pub(crate) use crate::names::prometheus::{metric_name as base_name, sanitize, unit_suffix};

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.as_str().to_owned(),
        other => other.to_string(),
    }
}

trait Num: Copy {
    fn text(self) -> String;
    fn as_f64(self) -> f64;
}

impl Num for u64 {
    fn text(self) -> String {
        self.to_string()
    }
    fn as_f64(self) -> f64 {
        self as f64
    }
}

impl Num for i64 {
    fn text(self) -> String {
        self.to_string()
    }
    fn as_f64(self) -> f64 {
        self as f64
    }
}

impl Num for f64 {
    fn text(self) -> String {
        float(self)
    }
    fn as_f64(self) -> f64 {
        self
    }
}

impl Writer<'_, '_> {
    fn info_type(&self) -> &'static str {
        if self.x.openmetrics() {
            "info"
        } else {
            "gauge"
        }
    }

    /// `# HELP`, `# TYPE` and, in OpenMetrics with a unit, `# UNIT` of family `family`.
    fn header(&mut self, family: &str, help: &str, kind: &str, unit: &str) {
        let om = self.x.openmetrics();
        let name = match (om, kind) {
            (false, "counter") => format!("{family}_total"),
            (false, "gauge") if family == "target" || family == "otel_scope" => {
                format!("{family}_info")
            }
            _ => family.to_owned(),
        };
        self.x.header(&name, help, kind, unit_suffix(unit));
    }

    fn info(&mut self, family: &str, help: &str, kv: &[KeyValue]) {
        self.header(family, help, self.info_type(), "");
        self.sample(&format!("{family}_info"), kv, None, "1");
    }

    /// Makes `kv` the label set of the next samples. Keys that collide once sanitized are
    /// joined with `;`, as the OpenTelemetry compatibility rules say.
    fn render_labels(&mut self, kv: &[KeyValue]) {
        let mut pairs: Vec<(String, String)> = Vec::with_capacity(kv.len());
        for k in kv {
            let key = sanitize(k.key.as_str(), false);
            let val = value_text(&k.value);
            match pairs.iter_mut().find(|(pk, _)| *pk == key) {
                Some((_, pv)) => {
                    pv.push(';');
                    pv.push_str(&val);
                }
                None => pairs.push((key, val)),
            }
        }
        self.x.clear_labels();
        for (k, v) in &pairs {
            self.x.label(k, v);
        }
    }

    /// One sample line with the labels of `kv`, plus `le` when given.
    fn sample(&mut self, name: &str, kv: &[KeyValue], le: Option<&str>, value: &str) {
        self.render_labels(kv);
        self.line(name, le, value, None);
    }

    /// One sample line with the label set already made ([`Self::render_labels`]).
    fn line(&mut self, name: &str, le: Option<&str>, value: &str, exemplar: Option<&Exemplar>) {
        self.x.sample(name, le, value, None, exemplar);
    }

    fn metric(&mut self, m: &Metric) {
        let base = base_name(m.name(), m.unit());
        match m.data() {
            AggregatedMetrics::F64(d) => self.data(&base, m, d),
            AggregatedMetrics::U64(d) => self.data(&base, m, d),
            AggregatedMetrics::I64(d) => self.data(&base, m, d),
        }
    }

    fn data<T: Num>(&mut self, base: &str, m: &Metric, d: &MetricData<T>) {
        match d {
            MetricData::Sum(s) => self.sum(base, m, s),
            MetricData::Gauge(g) => self.gauge(base, m, g),
            MetricData::Histogram(h) => self.histogram(base, m, h),
            // The text formats have no native histograms: the per-layer distributions (the
            // only exponential histograms on the Prometheus provider; OTLP's exponential
            // setting is a provider of its own) are served by the protobuf format only, and
            // the text scrapes keep their series budget.
            MetricData::ExponentialHistogram(_) => {}
        }
    }

    fn sum<T: Num>(&mut self, base: &str, m: &Metric, s: &Sum<T>) {
        if s.is_monotonic() {
            let family = base.strip_suffix("_total").unwrap_or(base).to_owned();
            self.header(&family, m.description(), "counter", m.unit());
            let name = format!("{family}_total");
            for dp in s.data_points() {
                let kv: Vec<KeyValue> = dp.attributes().cloned().collect();
                self.sample(&name, &kv, None, &dp.value().text());
            }
        } else {
            self.header(base, m.description(), "gauge", m.unit());
            for dp in s.data_points() {
                let kv: Vec<KeyValue> = dp.attributes().cloned().collect();
                self.sample(base, &kv, None, &dp.value().text());
            }
        }
    }

    fn gauge<T: Num>(&mut self, base: &str, m: &Metric, g: &Gauge<T>) {
        self.header(base, m.description(), "gauge", m.unit());
        for dp in g.data_points() {
            let kv: Vec<KeyValue> = dp.attributes().cloned().collect();
            self.sample(base, &kv, None, &dp.value().text());
        }
    }

    fn histogram<T: Num>(&mut self, base: &str, m: &Metric, h: &Histogram<T>) {
        self.header(base, m.description(), "histogram", m.unit());
        let bucket = format!("{base}_bucket");
        let sum = format!("{base}_sum");
        let count = format!("{base}_count");
        // Every data point of one instrument has the same bounds: their text is made once.
        let mut les: Vec<String> = Vec::new();
        for dp in h.data_points() {
            let kv: Vec<KeyValue> = dp.attributes().cloned().collect();
            let bounds: Vec<f64> = dp.bounds().collect();
            if les.len() != bounds.len() + 1 {
                les = bounds.iter().map(|b| float(*b)).collect();
                les.push("+Inf".to_owned());
            }
            let om = self.x.openmetrics();
            let sdk_exemplars = if om {
                sdk_exemplars(dp, &bounds)
            } else {
                Vec::new()
            };
            self.render_labels(&kv);
            let mut cumulative = 0u64;
            let counts: Vec<u64> = dp.bucket_counts().collect();
            for (i, n) in counts.iter().enumerate().take(les.len()) {
                cumulative += n;
                let ex = match (om, self.exemplars) {
                    (true, Some(src)) => src(base, &kv, i),
                    _ => None,
                }
                .or_else(|| sdk_exemplars.get(i).cloned().flatten());
                self.line(&bucket, Some(&les[i]), &cumulative.to_string(), ex.as_ref());
            }
            if counts.len() <= bounds.len() {
                // A data point without its +Inf bucket count: the total is the count.
                self.line(&bucket, Some("+Inf"), &dp.count().to_string(), None);
            }
            self.line(&sum, None, &dp.sum().text(), None);
            self.line(&count, None, &dp.count().to_string(), None);
        }
    }
}

/// The SDK's own exemplars of a data point, by bucket (the last one that falls in each).
fn sdk_exemplars<T: Num>(dp: &HistogramDataPoint<T>, bounds: &[f64]) -> Vec<Option<Exemplar>> {
    let mut by_bucket = vec![None; bounds.len() + 1];
    for e in dp.exemplars() {
        let v = e.value.as_f64();
        let i = bounds.iter().position(|b| v <= *b).unwrap_or(bounds.len());
        by_bucket[i] = Some(Exemplar {
            trace_id: *e.trace_id(),
            span_id: *e.span_id(),
            value: v,
            time: e.time(),
        });
    }
    by_bucket
}

/// Writes `rm` as delimited `MetricFamily` messages to `out`: counters, gauges, explicit-bucket
/// histograms as classic histograms, and base-2 exponential histograms as native histograms
/// (schema, zero bucket, spans and deltas); `exemplars` may add exemplars to classic buckets.
/// Names and labels as in the text formats.
///
/// `native` is what the native provider collected: the per-layer distributions (families of
/// their own) and the exponential twins of `rm`'s explicit-bucket histograms (same names),
/// each twin's data point merged into the classic one of the same labels, so that one
/// `Histogram` message carries both halves (as Prometheus's client_golang writes them:
/// Prometheus stores the native half, and the classic buckets too with
/// `always_scrape_classic_histograms`). With the per-layer section distribution present, the
/// per-layer section counters it carries are left out
/// ([`metric::LAYER_COUNTERS_IN_DISTRIBUTIONS`]).
pub(crate) fn encode_protobuf(
    rm: &ResourceMetrics,
    native: Option<&ResourceMetrics>,
    exemplars: Option<ExemplarSource<'_>>,
    out: &mut Vec<u8>,
) -> Encoded {
    use prost::Message as _;
    let mut series = 0;
    let mut push = |family: proto::MetricFamily, out: &mut Vec<u8>| {
        if family.metric.is_empty() {
            return;
        }
        series += family.metric.len();
        // Encoding into a Vec cannot run out of room.
        let _ = family.encode_length_delimited(out);
    };
    let resource: Vec<KeyValue> = rm
        .resource()
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    if !resource.is_empty() {
        push(
            family(
                "target_info",
                "Target metadata",
                proto::MetricType::Gauge,
                vec![scalar(label_pairs(&resource), 1.0, false)],
            ),
            out,
        );
    }
    let scopes: Vec<proto::Metric> = rm
        .scope_metrics()
        .map(|sm| {
            let scope = sm.scope();
            let mut kv = vec![KeyValue::new("otel_scope_name", scope.name().to_owned())];
            if let Some(v) = scope.version() {
                kv.push(KeyValue::new("otel_scope_version", v.to_owned()));
            }
            scalar(label_pairs(&kv), 1.0, false)
        })
        .collect();
    push(
        family(
            "otel_scope_info",
            "Instrumentation scope metadata",
            proto::MetricType::Gauge,
            scopes,
        ),
        out,
    );
    let natives: Vec<&Metric> = native
        .into_iter()
        .flat_map(|n| n.scope_metrics())
        .flat_map(|sm| sm.metrics())
        .collect();
    let metrics = || rm.scope_metrics().flat_map(|sm| sm.metrics());
    // The per-layer section counters are in the per-layer distributions' sums and counts.
    let has_distribution = metrics()
        .chain(natives.iter().copied())
        .any(|m| m.name() == metric::SECTION_LAYER_DURATION);
    // With the native side collected, each histogram of `NATIVE_HALVES` gets its native half:
    // its twin's data point, or an empty one before the twin recorded anything (so that a
    // series never switches between classic and native).
    let halves_of = |m: &Metric| {
        (native.is_some() && is_explicit(m) && metric::NATIVE_HALVES.contains(&m.name())).then(
            || {
                natives
                    .iter()
                    .copied()
                    .find(|t| t.name() == m.name() && is_exponential(t))
            },
        )
    };
    for m in metrics() {
        if has_distribution && metric::LAYER_COUNTERS_IN_DISTRIBUTIONS.contains(&m.name()) {
            continue;
        }
        push(proto_family(m, halves_of(m), exemplars), out);
    }
    // Native-only families (the per-layer distributions); twins went into their classic ones.
    for t in &natives {
        if !metrics().any(|m| m.name() == t.name() && is_explicit(m)) {
            push(proto_family(t, None, exemplars), out);
        }
    }
    Encoded { series }
}

fn is_explicit(m: &Metric) -> bool {
    matches!(
        m.data(),
        AggregatedMetrics::F64(MetricData::Histogram(_))
            | AggregatedMetrics::U64(MetricData::Histogram(_))
            | AggregatedMetrics::I64(MetricData::Histogram(_))
    )
}

fn is_exponential(m: &Metric) -> bool {
    matches!(
        m.data(),
        AggregatedMetrics::F64(MetricData::ExponentialHistogram(_))
            | AggregatedMetrics::U64(MetricData::ExponentialHistogram(_))
            | AggregatedMetrics::I64(MetricData::ExponentialHistogram(_))
    )
}

/// A counter's or a gauge's sample.
fn scalar(label: Vec<proto::LabelPair>, value: f64, counter: bool) -> proto::Metric {
    let mut m = proto::Metric {
        label,
        ..Default::default()
    };
    if counter {
        m.counter = Some(proto::Counter {
            value,
            ..Default::default()
        });
    } else {
        m.gauge = Some(proto::Gauge { value });
    }
    m
}

fn family(
    name: &str,
    help: &str,
    kind: proto::MetricType,
    metric: Vec<proto::Metric>,
) -> proto::MetricFamily {
    proto::MetricFamily {
        name: name.to_owned(),
        help: help.to_owned(),
        r#type: kind as i32,
        metric,
        unit: String::new(),
    }
}

/// The labels of `kv`, sanitized; keys that collide once sanitized are joined with `;`.
fn label_pairs<'k>(kv: impl IntoIterator<Item = &'k KeyValue>) -> Vec<proto::LabelPair> {
    let kv = kv.into_iter();
    let mut pairs: Vec<proto::LabelPair> = Vec::with_capacity(kv.size_hint().0);
    for k in kv {
        let name = sanitize(k.key.as_str(), false);
        let value = value_text(&k.value);
        match pairs.iter_mut().find(|p| p.name == name) {
            Some(p) => {
                p.value.push(';');
                p.value.push_str(&value);
            }
            None => pairs.push(proto::LabelPair { name, value }),
        }
    }
    pairs
}

fn timestamp(t: SystemTime) -> proto::Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    proto::Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn proto_exemplar(e: &Exemplar) -> proto::Exemplar {
    proto::Exemplar {
        label: vec![
            proto::LabelPair {
                name: "trace_id".to_owned(),
                value: hex(&e.trace_id),
            },
            proto::LabelPair {
                name: "span_id".to_owned(),
                value: hex(&e.span_id),
            },
        ],
        value: e.value,
        timestamp: Some(timestamp(e.time)),
    }
}

/// One metric's family; `halves` (`Some`: this histogram has native halves; the twin, an
/// exponential histogram of the same name, if it recorded anything) adds the native half to
/// each classic histogram: its twin's data point of the same labels, or an empty one.
fn proto_family(
    m: &Metric,
    halves: Option<Option<&Metric>>,
    exemplars: Option<ExemplarSource<'_>>,
) -> proto::MetricFamily {
    let base = base_name(m.name(), m.unit());
    let mut f = match m.data() {
        AggregatedMetrics::F64(d) => family_of(&base, m, d, halves, exemplars),
        AggregatedMetrics::U64(d) => family_of(&base, m, d, halves, exemplars),
        AggregatedMetrics::I64(d) => family_of(&base, m, d, halves, exemplars),
    };
    f.unit = unit_suffix(m.unit()).unwrap_or_default().to_owned();
    f
}

fn family_of<T: Num>(
    base: &str,
    m: &Metric,
    d: &MetricData<T>,
    halves: Option<Option<&Metric>>,
    exemplars: Option<ExemplarSource<'_>>,
) -> proto::MetricFamily {
    let help = m.description();
    match d {
        MetricData::Sum(s) => {
            let counter = s.is_monotonic();
            let metric = s
                .data_points()
                .map(|dp| scalar(label_pairs(dp.attributes()), dp.value().as_f64(), counter))
                .collect();
            if counter {
                let name = format!("{}_total", base.strip_suffix("_total").unwrap_or(base));
                family(&name, help, proto::MetricType::Counter, metric)
            } else {
                family(base, help, proto::MetricType::Gauge, metric)
            }
        }
        MetricData::Gauge(g) => {
            let metric = g
                .data_points()
                .map(|dp| scalar(label_pairs(dp.attributes()), dp.value().as_f64(), false))
                .collect();
            family(base, help, proto::MetricType::Gauge, metric)
        }
        MetricData::Histogram(h) => {
            let mut natives = halves.flatten().map(natives_of).unwrap_or_default();
            let metric = h
                .data_points()
                .map(|dp| {
                    let kv: Vec<KeyValue> = dp.attributes().cloned().collect();
                    let label = label_pairs(&kv);
                    let bounds: Vec<f64> = dp.bounds().collect();
                    let sdk = sdk_exemplars(dp, &bounds);
                    let mut cumulative = 0u64;
                    let bucket = dp
                        .bucket_counts()
                        .zip(bounds.iter().copied().chain([f64::INFINITY]))
                        .enumerate()
                        .map(|(i, (n, upper_bound))| {
                            cumulative += n;
                            let ex = exemplars
                                .and_then(|src| src(base, &kv, i))
                                .or_else(|| sdk.get(i).cloned().flatten());
                            proto::Bucket {
                                cumulative_count: cumulative,
                                upper_bound,
                                exemplar: ex.as_ref().map(proto_exemplar),
                                ..Default::default()
                            }
                        })
                        .collect();
                    // The native half keeps its own count and sum: Prometheus checks them
                    // against its buckets. The twin was collected just after the classic
                    // histogram, so it may hold a few more observations than `bucket`.
                    let native_half = take_native(&mut natives, &label).or_else(|| {
                        halves.map(|_| native(0, 0.0, 0, (0, [].into_iter()), (0, [].into_iter())))
                    });
                    let histogram = match native_half {
                        Some(mut n) => {
                            n.bucket = bucket;
                            n
                        }
                        None => proto::Histogram {
                            sample_count: dp.count(),
                            sample_sum: dp.sum().as_f64(),
                            bucket,
                            ..Default::default()
                        },
                    };
                    proto::Metric {
                        label,
                        histogram: Some(histogram),
                        ..Default::default()
                    }
                })
                .collect();
            family(base, help, proto::MetricType::Histogram, metric)
        }
        MetricData::ExponentialHistogram(h) => {
            let metric = h
                .data_points()
                .map(|dp| proto::Metric {
                    label: label_pairs(dp.attributes()),
                    histogram: Some(native_of(dp)),
                    ..Default::default()
                })
                .collect();
            family(base, help, proto::MetricType::Histogram, metric)
        }
    }
}

/// The native histogram of each data point of an exponential histogram, with its labels
/// sorted by name (the two providers of a classic histogram and its twin may list a data
/// point's attributes in different orders).
fn natives_of(m: &Metric) -> Vec<(Vec<proto::LabelPair>, proto::Histogram)> {
    fn points<T: Num>(d: &MetricData<T>) -> Vec<(Vec<proto::LabelPair>, proto::Histogram)> {
        match d {
            MetricData::ExponentialHistogram(h) => h
                .data_points()
                .map(|dp| (sorted(label_pairs(dp.attributes())), native_of(dp)))
                .collect(),
            _ => Vec::new(),
        }
    }
    match m.data() {
        AggregatedMetrics::F64(d) => points(d),
        AggregatedMetrics::U64(d) => points(d),
        AggregatedMetrics::I64(d) => points(d),
    }
}

fn sorted(mut label: Vec<proto::LabelPair>) -> Vec<proto::LabelPair> {
    label.sort_by(|a, b| a.name.cmp(&b.name));
    label
}

/// The native histogram of the twin data point with `label`, taken out of `natives`.
fn take_native(
    natives: &mut Vec<(Vec<proto::LabelPair>, proto::Histogram)>,
    label: &[proto::LabelPair],
) -> Option<proto::Histogram> {
    if natives.is_empty() {
        return None;
    }
    let want = sorted(label.to_vec());
    let at = natives.iter().position(|(l, _)| *l == want)?;
    Some(natives.swap_remove(at).1)
}

/// One exponential data point as a native histogram, with its count, sum and exemplars.
fn native_of<T: Num>(
    dp: &opentelemetry_sdk::metrics::data::ExponentialHistogramDataPoint<T>,
) -> proto::Histogram {
    let mut hist = native(
        dp.scale(),
        dp.zero_threshold(),
        dp.zero_count(),
        (dp.positive_bucket().offset(), dp.positive_bucket().counts()),
        (dp.negative_bucket().offset(), dp.negative_bucket().counts()),
    );
    hist.sample_count = dp.count() as u64;
    hist.sample_sum = dp.sum().as_f64();
    hist.exemplars = dp
        .exemplars()
        .map(|e| {
            proto_exemplar(&Exemplar {
                trace_id: *e.trace_id(),
                span_id: *e.span_id(),
                value: e.value.as_f64(),
                time: e.time(),
            })
        })
        .collect();
    hist
}

/// The highest native-histogram schema Prometheus stores: finer OpenTelemetry scales are
/// merged down to it.
const MAX_SCHEMA: i8 = 8;

/// The native-histogram fields of an OpenTelemetry base-2 exponential histogram of `scale`:
/// `(offset, counts)` of each side. OpenTelemetry's bucket `i` is `(base^i, base^(i+1)]` and
/// Prometheus's is `(base^(i-1), base^i]`, so each index moves up by one (after merging a
/// scale above [`MAX_SCHEMA`] down to it, as Prometheus's own OTLP translation does). Empty
/// buckets are left out (gaps between spans); a histogram without any bucket gets one empty
/// span so that Prometheus still reads it as native. Scales below Prometheus's lowest schema
/// (-4) are passed on as they are (Prometheus refuses them): the SDK goes there only for values
/// spread over more than 2^2560 at 160 buckets, which durations in seconds never are.
pub(crate) fn native(
    scale: i8,
    zero_threshold: f64,
    zero_count: u64,
    positive: (i32, impl Iterator<Item = u64>),
    negative: (i32, impl Iterator<Item = u64>),
) -> proto::Histogram {
    let down = u32::try_from(scale.saturating_sub(MAX_SCHEMA)).unwrap_or(0);
    let side = |(offset, counts): (i32, &mut dyn Iterator<Item = u64>)| {
        // (Prometheus index, count), ascending: merging keeps the order.
        let mut merged: Vec<(i32, u64)> = Vec::new();
        for (k, n) in counts.enumerate() {
            if n == 0 {
                continue;
            }
            let otel = offset.saturating_add(i32::try_from(k).unwrap_or(i32::MAX));
            let idx = (otel >> down).saturating_add(1);
            match merged.last_mut() {
                Some((last, c)) if *last == idx => *c += n,
                _ => merged.push((idx, n)),
            }
        }
        let mut spans: Vec<proto::BucketSpan> = Vec::new();
        let mut deltas = Vec::with_capacity(merged.len());
        let (mut prev_idx, mut prev_count) = (None::<i32>, 0i64);
        for (idx, n) in merged {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            match (prev_idx, spans.last_mut()) {
                (Some(p), Some(span)) if idx == p + 1 => span.length += 1,
                (p, _) => spans.push(proto::BucketSpan {
                    offset: p.map_or(idx, |p| idx - p - 1),
                    length: 1,
                }),
            }
            deltas.push(n - prev_count);
            prev_count = n;
            prev_idx = Some(idx);
        }
        (spans, deltas)
    };
    let (mut pos_it, mut neg_it) = (positive.1, negative.1);
    let (mut positive_span, positive_delta) = side((positive.0, &mut pos_it));
    let (negative_span, negative_delta) = side((negative.0, &mut neg_it));
    if positive_span.is_empty()
        && negative_span.is_empty()
        && zero_threshold == 0.0
        && zero_count == 0
    {
        positive_span.push(proto::BucketSpan {
            offset: 0,
            length: 0,
        });
    }
    proto::Histogram {
        schema: i32::from(scale.min(MAX_SCHEMA)),
        zero_threshold,
        zero_count,
        positive_span,
        positive_delta,
        negative_span,
        negative_delta,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::metrics::{ManualReader, SdkMeterProvider};
    use std::sync::Arc;

    fn collected() -> ResourceMetrics {
        let reader = super::super::PrometheusReader(Arc::new(ManualReader::builder().build()));
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.clone())
            .with_resource(
                Resource::builder_empty()
                    .with_service_name("svc \"q\"")
                    .with_attribute(KeyValue::new("host.name", "h1"))
                    .build(),
            )
            .build();
        let meter = provider.meter("phasetrace");
        let h = meter
            .f64_histogram("phasetrace.section.duration")
            .with_unit("s")
            .with_description("Duration of one\nsection \\ \"x\"")
            .with_boundaries(vec![0.001, 0.01])
            .build();
        h.record(0.0005, &[KeyValue::new("bucket", "kda\"mixer")]);
        h.record(0.5, &[KeyValue::new("bucket", "kda\"mixer")]);
        let c = meter
            .u64_counter("phasetrace.steps")
            .with_unit("{step}")
            .with_description("Decode steps")
            .build();
        c.add(3, &[KeyValue::new("rank", 0)]);
        let t = meter
            .f64_counter("phasetrace.section.layer.time")
            .with_unit("s")
            .build();
        t.add(0.25, &[KeyValue::new("layer", 7)]);
        let mut rm = ResourceMetrics::default();
        opentelemetry_sdk::metrics::reader::MetricReader::collect(&reader, &mut rm).unwrap();
        rm
    }

    #[test]
    fn classic_text_names_units_counters_and_escapes() {
        let mut out = String::new();
        let e = encode(&collected(), Format::Classic, None, &mut out);
        assert!(
            out.contains("# TYPE phasetrace_section_duration_seconds histogram\n"),
            "{out}"
        );
        assert!(out.contains(
            "# HELP phasetrace_section_duration_seconds Duration of one\\nsection \\\\ \"x\"\n"
        ));
        assert!(out.contains(
            "phasetrace_section_duration_seconds_bucket{bucket=\"kda\\\"mixer\",le=\"0.001\"} 1\n"
        ));
        assert!(out.contains(
            "phasetrace_section_duration_seconds_bucket{bucket=\"kda\\\"mixer\",le=\"+Inf\"} 2\n"
        ));
        assert!(
            out.contains("phasetrace_section_duration_seconds_count{bucket=\"kda\\\"mixer\"} 2\n")
        );
        assert!(out.contains(
            "# TYPE phasetrace_steps_total counter\nphasetrace_steps_total{rank=\"0\"} 3\n"
        ));
        assert!(out.contains("phasetrace_section_layer_time_seconds_total{layer=\"7\"} 0.25\n"));
        assert!(out.contains("# TYPE target_info gauge\n"));
        assert!(out.contains("host_name=\"h1\""));
        assert!(out.contains("service_name=\"svc \\\"q\\\"\""));
        assert!(out.contains("otel_scope_info{otel_scope_name=\"phasetrace\"} 1\n"));
        assert!(
            !out.contains("otel_scope_name=\"phasetrace\","),
            "scope once"
        );
        assert!(!out.contains("# EOF"));
        // target_info, scope, 3 buckets + sum + count, the counter, the layer time
        assert_eq!(e.series, 1 + 1 + 5 + 1 + 1);
    }

    #[test]
    fn openmetrics_has_families_units_info_and_eof() {
        let mut out = String::new();
        let fmt = Format::OpenMetrics { version: "1.0.0" };
        encode(&collected(), fmt, None, &mut out);
        assert!(out.ends_with("# EOF\n"), "{out}");
        assert!(out.contains("# TYPE phasetrace_steps counter\n"));
        assert!(out.contains("phasetrace_steps_total{rank=\"0\"} 3\n"));
        assert!(out.contains(
            "# TYPE phasetrace_section_layer_time_seconds counter\n# UNIT phasetrace_section_layer_time_seconds seconds\n"
        ));
        assert!(out.contains("# TYPE target info\n"));
        assert!(out.contains("# TYPE otel_scope info\n"));
        assert!(out.contains("Duration of one\\nsection \\\\ \\\"x\\\""));
        assert_eq!(
            fmt.content_type(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
    }

    #[test]
    fn an_exemplar_attaches_to_its_bucket_line_in_openmetrics_only() {
        let src = |base: &str, kv: &[KeyValue], i: usize| {
            (base == "phasetrace_section_duration_seconds"
                && kv.iter().any(|k| k.key.as_str() == "bucket")
                && i == 2)
                .then(|| Exemplar {
                    trace_id: [0xab; 16],
                    span_id: [0x01; 8],
                    value: 0.5,
                    time: UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123),
                })
        };
        let mut om = String::new();
        encode(
            &collected(),
            Format::OpenMetrics { version: "1.0.0" },
            Some(&src),
            &mut om,
        );
        assert!(om.contains(
            "le=\"+Inf\"} 2 # {trace_id=\"abababababababababababababababab\",span_id=\"0101010101010101\"} 0.5 1700000000.123\n"
        ), "{om}");
        let mut classic = String::new();
        encode(&collected(), Format::Classic, Some(&src), &mut classic);
        assert!(!classic.contains("trace_id"));
    }

    #[test]
    fn native_spans_and_deltas_merge_fine_scales_and_shift_indices() {
        // Scale 10 -> schema 8 (indices >> 2), OpenTelemetry index i -> Prometheus i + 1.
        let h = native(
            10,
            0.0,
            0,
            (-5, [1, 0, 2, 3, 0, 0, 0, 4].into_iter()),
            (0, [].into_iter()),
        );
        assert_eq!(h.schema, 8);
        assert_eq!(
            h.positive_span,
            vec![proto::BucketSpan {
                offset: -1,
                length: 3
            }]
        );
        assert_eq!(h.positive_delta, vec![1, 4, -1]);
        // A gap starts a new span, offset from the end of the previous one.
        let h = native(
            2,
            0.0,
            0,
            (0, [2, 0, 0, 5].into_iter()),
            (0, [].into_iter()),
        );
        assert_eq!(h.schema, 2);
        assert_eq!(
            h.positive_span,
            vec![
                proto::BucketSpan {
                    offset: 1,
                    length: 1
                },
                proto::BucketSpan {
                    offset: 2,
                    length: 1
                }
            ]
        );
        assert_eq!(h.positive_delta, vec![2, 3]);
        // Empty: one empty span, so that it is still read as native.
        let h = native(20, 0.0, 0, (0, [].into_iter()), (0, [].into_iter()));
        assert_eq!(
            h.positive_span,
            vec![proto::BucketSpan {
                offset: 0,
                length: 0
            }]
        );
    }

    #[test]
    fn the_protobuf_scrape_decodes_to_native_and_classic_histograms() {
        use prost::Message as _;
        let reader = super::super::PrometheusReader(Arc::new(ManualReader::builder().build()));
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.clone())
            .with_view(crate::export::view(false))
            .build();
        let meter = provider.meter("phasetrace");
        let layer = meter
            .f64_histogram(crate::names::metric::SECTION_LAYER_DURATION)
            .with_unit("s")
            .build();
        let kv = [KeyValue::new("bucket", "attn"), KeyValue::new("layer", 7)];
        let observed = [0.001, 0.001, 0.001, 0.004, 0.0041];
        for v in observed {
            layer.record(v, &kv);
        }
        let classic = meter
            .f64_histogram("phasetrace.section.duration")
            .with_unit("s")
            .with_boundaries(vec![0.002, 0.01])
            .build();
        for v in observed {
            classic.record(v, &kv[..1]);
        }
        meter.u64_counter("phasetrace.steps").build().add(3, &[]);
        let layer_time = meter
            .f64_counter(crate::names::metric::SECTION_LAYER_TIME)
            .with_unit("s")
            .build();
        layer_time.add(0.0111, &kv);
        let mut rm = ResourceMetrics::default();
        opentelemetry_sdk::metrics::reader::MetricReader::collect(&reader, &mut rm).unwrap();
        let mut out = Vec::new();
        let enc = encode_protobuf(&rm, None, None, &mut out);
        let mut buf = &out[..];
        let mut families = Vec::new();
        while !buf.is_empty() {
            families.push(proto::MetricFamily::decode_length_delimited(&mut buf).expect("decode"));
        }
        assert_eq!(
            enc.series,
            families.iter().map(|f| f.metric.len()).sum::<usize>()
        );
        let get = |name: &str| {
            families
                .iter()
                .find(|f| f.name == name)
                .unwrap_or_else(|| panic!("{name} in {families:?}"))
        };
        let f = get("phasetrace_section_layer_duration_seconds");
        assert_eq!(f.r#type, proto::MetricType::Histogram as i32);
        assert_eq!(f.unit, "seconds");
        let m = &f.metric[0];
        assert!(m.label.iter().any(|l| l.name == "layer" && l.value == "7"));
        let h = m.histogram.as_ref().expect("histogram");
        assert_eq!(h.sample_count, 5);
        assert!((h.sample_sum - observed.iter().sum::<f64>()).abs() < 1e-12);
        assert!(h.bucket.is_empty(), "native only");
        assert!((-4..=8).contains(&h.schema));
        // Rebuild (index, count) from spans and deltas; each observation must fall in
        // (base^(i-1), base^i] of a bucket holding it.
        let mut buckets = Vec::new();
        let (mut last, mut count) = (None::<i32>, 0i64);
        for s in &h.positive_span {
            let start = last.map_or(s.offset, |l| l + 1 + s.offset);
            for k in 0..s.length {
                count += h.positive_delta[buckets.len()];
                buckets.push((start + k as i32, count));
                last = Some(start + k as i32);
            }
        }
        let base = 2f64.powf(2f64.powi(-h.schema));
        let of = |v: f64| {
            buckets
                .iter()
                .find(|(i, _)| base.powi(*i - 1) < v && v <= base.powi(*i))
                .map(|b| b.1)
        };
        assert_eq!(buckets.iter().map(|b| b.1).sum::<i64>(), 5, "{buckets:?}");
        assert_eq!(of(0.001), Some(3), "{buckets:?} schema {}", h.schema);
        assert!(of(0.004).is_some() && of(0.0041).is_some(), "{buckets:?}");
        // The explicit-bucket histogram: classic cumulative buckets, no native fields.
        let c = get("phasetrace_section_duration_seconds").metric[0]
            .histogram
            .clone()
            .expect("histogram");
        let cum: Vec<(f64, u64)> = c
            .bucket
            .iter()
            .map(|b| (b.upper_bound, b.cumulative_count))
            .collect();
        assert_eq!(cum, vec![(0.002, 3), (0.01, 5), (f64::INFINITY, 5)]);
        assert!(c.positive_span.is_empty() && c.schema == 0);
        let steps = &get("phasetrace_steps_total").metric[0];
        assert_eq!(steps.counter.as_ref().map(|c| c.value), Some(3.0));
        // The per-layer counter is in the distribution's sum: left out of the protobuf scrape.
        assert!(
            !families.iter().any(|f| f.name.contains("layer_time")),
            "{families:?}"
        );
        // The text scrapes leave the per-layer distribution out and keep the counter.
        let mut text = String::new();
        encode(&rm, Format::Classic, None, &mut text);
        assert!(!text.contains("layer_duration"), "{text}");
        assert!(text.contains("phasetrace_section_layer_time_seconds_total{"));
        assert!(text.contains("phasetrace_section_duration_seconds_bucket"));
    }

    #[test]
    fn a_twin_adds_its_native_half_to_the_classic_histogram_of_the_same_labels() {
        use prost::Message as _;
        let reader = |exp: bool| {
            let r = super::super::PrometheusReader(Arc::new(ManualReader::builder().build()));
            let p = SdkMeterProvider::builder()
                .with_reader(r.clone())
                .with_view(crate::export::view(exp))
                .build();
            (r, p)
        };
        let ((classic_r, classic_p), (native_r, native_p)) = (reader(false), reader(true));
        let hist = |p: &SdkMeterProvider| {
            p.meter("phasetrace")
                .f64_histogram(crate::names::metric::SECTION_DURATION)
                .with_unit("s")
                .with_boundaries(vec![0.002, 0.01])
                .build()
        };
        let (classic, twin) = (hist(&classic_p), hist(&native_p));
        // The same series, attributes listed in another order on each side.
        let a = [KeyValue::new("bucket", "attn"), KeyValue::new("rank", 0)];
        let b = [KeyValue::new("rank", 0), KeyValue::new("bucket", "attn")];
        let other = [KeyValue::new("bucket", "norm"), KeyValue::new("rank", 0)];
        for v in [0.001, 0.003, 0.02] {
            classic.record(v, &a);
            twin.record(v, &b);
        }
        classic.record(0.5, &other);
        twin.record(0.5, &other);
        // A histogram with native halves whose twin recorded nothing yet, and one without.
        let m = classic_p.meter("phasetrace");
        let step = m
            .f64_histogram(crate::names::metric::STEP_DURATION)
            .with_unit("s")
            .with_boundaries(vec![0.1])
            .build();
        step.record(0.05, &a);
        let accepted = m
            .u64_histogram(crate::names::metric::SPEC_ACCEPTED_LENGTH)
            .with_boundaries(vec![1.0, 2.0])
            .build();
        accepted.record(2, &a);
        // Recorded between the two collections: only the twin has it.
        let mut rm = ResourceMetrics::default();
        opentelemetry_sdk::metrics::reader::MetricReader::collect(&classic_r, &mut rm).unwrap();
        twin.record(0.004, &b);
        let mut nm = ResourceMetrics::default();
        opentelemetry_sdk::metrics::reader::MetricReader::collect(&native_r, &mut nm).unwrap();

        let mut out = Vec::new();
        let enc = encode_protobuf(&rm, Some(&nm), None, &mut out);
        let mut buf = &out[..];
        let mut families = Vec::new();
        while !buf.is_empty() {
            families.push(proto::MetricFamily::decode_length_delimited(&mut buf).expect("decode"));
        }
        let sections: Vec<_> = families
            .iter()
            .filter(|f| f.name == "phasetrace_section_duration_seconds")
            .collect();
        assert_eq!(
            sections.len(),
            1,
            "one family: the twin merged, {families:?}"
        );
        assert_eq!(sections[0].metric.len(), 2);
        assert_eq!(
            enc.series,
            4 + 2,
            "four histograms, target_info, otel_scope_info"
        );
        let only = |name: &str| {
            families
                .iter()
                .find(|f| f.name == name)
                .and_then(|f| f.metric[0].histogram.clone())
                .unwrap_or_else(|| panic!("{name} in {families:?}"))
        };
        let step = only("phasetrace_step_duration_seconds");
        assert_eq!(step.bucket.len(), 2, "classic buckets kept");
        assert_eq!(
            (
                step.sample_count,
                step.positive_span.len(),
                step.positive_delta.len()
            ),
            (0, 1, 0),
            "an empty native half: native from its first scrape"
        );
        let accepted = only("phasetrace_spec_accepted_length");
        assert!(
            accepted.positive_span.is_empty() && accepted.sample_count == 1,
            "no native half outside NATIVE_HALVES"
        );
        let of = |bucket: &str| {
            sections[0]
                .metric
                .iter()
                .find(|m| m.label.iter().any(|l| l.value == bucket))
                .and_then(|m| m.histogram.clone())
                .expect("histogram")
        };
        let attn = of("attn");
        let cum: Vec<(f64, u64)> = attn
            .bucket
            .iter()
            .map(|b| (b.upper_bound, b.cumulative_count))
            .collect();
        assert_eq!(cum, vec![(0.002, 1), (0.01, 2), (f64::INFINITY, 3)]);
        // The native half: its own count (4, the late observation in), buckets adding up.
        assert_eq!(attn.sample_count, 4);
        assert!((attn.sample_sum - 0.028).abs() < 1e-12);
        assert!(!attn.positive_span.is_empty() && (-4..=8).contains(&attn.schema));
        assert_eq!(
            attn.positive_delta
                .iter()
                .scan(0, |c, d| {
                    *c += d;
                    Some(*c)
                })
                .sum::<i64>(),
            4
        );
        let norm = of("norm");
        assert_eq!(norm.sample_count, 1);
        assert_eq!(norm.positive_delta, vec![1]);
        // The text scrape of the classic side alone: unchanged.
        let mut text = String::new();
        encode(&rm, Format::Classic, None, &mut text);
        assert!(
            text.contains(
                "phasetrace_section_duration_seconds_count{bucket=\"attn\",rank=\"0\"} 3\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn names_and_values_are_sanitized() {
        assert_eq!(base_name("a.b-c", "s"), "a_b_c_seconds");
        assert_eq!(base_name("x.seconds", "s"), "x_seconds");
        assert_eq!(base_name("tokens", "{token}"), "tokens");
        assert_eq!(sanitize("9lives", false), "_9lives");
        assert_eq!(float(f64::INFINITY), "+Inf");
        assert_eq!(float(f64::NAN), "NaN");
        assert_eq!(float(0.000001), "0.000001");
        assert_eq!(float(10.0), "10");
    }
}
