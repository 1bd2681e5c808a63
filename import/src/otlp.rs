//! OTLP requests (`ExportMetricsServiceRequest`, `ExportTraceServiceRequest`) that keep the
//! logs' own timestamps, built as `opentelemetry-proto` messages: [`super::send`] encodes them
//! as protobuf for a collector's `/v1/metrics` and `/v1/traces`; [`write_json_line`] writes
//! them in the OTLP/JSON mapping (the `otlp-json` output) through the messages' serde support.
//!
//! ```text
//! ImportedFile[] ─► series::build ─► histogram (sum + count, no buckets) and monotonic sum
//!                                    points, cumulative, start = run start
//!                ─► route traces ─► one trace per (file, run, step): a `decode.step` root
//!                                   with `moe.route` events, one probe span per line
//!                ─► requests of at most `max_items_per_request` points or spans and
//!                    `max_request_bytes` bytes of protobuf ─► sink
//! ```
//!
//! Requests are cut by size as well as by count, so that each stays under the 4 MiB message
//! limit of OTLP/gRPC receivers (the collector's default `max_recv_msg_size_mib`, tonic's and
//! grpc-go's default). The same requests go over OTLP/HTTP and into the `otlp-json` output.
//!
//! Each (file, run) is one resource with `service.name`, `source.file` and `source.run`; the
//! data points carry `source.file` and `source.run` too, so that a collector without
//! resource-to-label conversion still puts them on the Prometheus series, as the OpenMetrics
//! writer does.
//!
//! Ids are derived from (file, run, step, position) by hashing, so a re-import produces the
//! same ids and a backend deduplicates rather than doubles.
//!
//! The messages (attributes, resource, scope, metrics and their points) are built by
//! `phasetrace_encode::otlp`, the OTLP metric builder the live exporters use for their exemplars.

use std::io::Write;

use prost::Message as _;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, any_value,
};
use opentelemetry_proto::tonic::metrics::v1::{
    HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric,
    number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
use phasetrace_encode::otlp::{self as build, attribute as kv, int, string};

use super::contract::{
    EVENT_MOE_ROUTE, Family, Key, SCOPE_NAME, SERVICE_NAME, SPAN_STEP, Shape, TIMING, probe_bucket,
};
use super::series::{self, Resource};
use super::{ImportError, ImportRecord, ImportedFile};
use phasetrace_names::resource;

/// The default [`OtlpOptions::max_request_bytes`]: 4,000,000 bytes, under the 4 MiB
/// (4,194,304-byte) message limit that OTLP/gRPC receivers apply by default.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4_000_000;

/// Options of the OTLP writers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpOptions {
    /// Data points (metrics) or spans (traces) per request. Default 5000.
    pub max_items_per_request: usize,
    /// Bytes of encoded protobuf per request, at most: a request is cut before the point or
    /// span that would take it over. A single point or span larger than this goes alone in
    /// its own request. Default [`DEFAULT_MAX_REQUEST_BYTES`].
    pub max_request_bytes: usize,
    /// Minimum spacing of two points of one series, nanoseconds. Default 1 ms.
    pub sample_interval_ns: u64,
    /// The `rank` attribute of every series and span (`--rank`); default that of a live process
    /// without `PHASETRACE_RANK`, 0.
    pub rank: u32,
    /// The `group` attribute of every series and span (`--group`); default that of a live
    /// process without `PHASETRACE_GROUP`.
    pub group: String,
}

impl Default for OtlpOptions {
    fn default() -> Self {
        Self {
            max_items_per_request: 5000,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            sample_interval_ns: 1_000_000,
            rank: crate::live_default(phasetrace_names::env::RANK),
            group: crate::live_default(phasetrace_names::env::GROUP),
        }
    }
}

/// What a writer produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OtlpStats {
    /// Requests handed to the sink.
    pub requests: usize,
    /// Data points or spans in them.
    pub items: usize,
    /// Encoded protobuf bytes of those requests.
    pub bytes: u64,
    /// Encoded protobuf bytes of the largest request.
    pub largest_request_bytes: usize,
    /// Records left out because they had no time.
    pub untimed_records: u64,
}

/// What a request handed to a sink holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestInfo {
    /// Its place among the writer's requests, from 1.
    pub number: usize,
    /// Data points or spans in it.
    pub items: usize,
    /// Its encoded protobuf size in bytes.
    pub bytes: usize,
}

/// The most a nested message's tag and length take (lengths below 2^35).
const WRAP: usize = 1 + 5;

/// The bytes an item of `len` bytes takes in a repeated message field: its tag, its length,
/// itself.
fn in_field(len: usize) -> usize {
    1 + prost::length_delimiter_len(len) + len
}

/// Cuts a stream of items into requests by count and by an upper bound of their encoded size.
struct Budget {
    max_items: usize,
    max_bytes: usize,
    items: usize,
    bytes: usize,
}

impl Budget {
    fn new(options: &OtlpOptions) -> Budget {
        Budget {
            max_items: options.max_items_per_request.max(1),
            max_bytes: options.max_request_bytes,
            items: 0,
            bytes: 0,
        }
    }

    /// Whether an item that adds at most `cost` bytes fits in the request (always, into an
    /// empty one).
    fn fits(&self, cost: usize) -> bool {
        self.items == 0
            || (self.items < self.max_items && self.bytes.saturating_add(cost) <= self.max_bytes)
    }

    fn add(&mut self, cost: usize) {
        self.items += 1;
        self.bytes = self.bytes.saturating_add(cost);
    }

    /// Hands the request to `sink` and starts an empty one.
    fn emit<M: prost::Message>(
        &mut self,
        message: M,
        stats: &mut OtlpStats,
        sink: &mut impl FnMut(M, RequestInfo) -> Result<(), ImportError>,
    ) -> Result<(), ImportError> {
        let bytes = message.encoded_len();
        debug_assert!(bytes <= self.bytes, "{bytes} > the bound {}", self.bytes);
        let info = RequestInfo {
            number: stats.requests + 1,
            items: self.items,
            bytes,
        };
        stats.requests += 1;
        stats.items += self.items;
        stats.bytes += bytes as u64;
        stats.largest_request_bytes = stats.largest_request_bytes.max(bytes);
        self.items = 0;
        self.bytes = 0;
        sink(message, info)
    }
}

/// An attribute of a series label: an integer for integer keys whose value is one.
fn attr(key: Key, value: &str) -> KeyValue {
    match value.parse::<i64>() {
        Ok(v) if key.is_int() => int(key.otel(), v),
        _ => string(key.otel(), value),
    }
}

fn proto_resource(r: &Resource) -> ProtoResource {
    build::resource(vec![
        string(resource::SERVICE_NAME, SERVICE_NAME),
        string(Key::SourceFile.otel(), r.source_file.clone()),
        int(Key::SourceRun.otel(), i64::from(r.run)),
    ])
}

fn scope() -> InstrumentationScope {
    build::scope(SCOPE_NAME, env!("CARGO_PKG_VERSION"))
}

/// One point of one series, in request order.
#[derive(Clone, Copy)]
struct PointRef {
    resource: usize,
    series: usize,
    point: usize,
}

/// Nanoseconds as OTLP's signed integer value (saturating; counts never get near it).
fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Builds the metrics requests of `files` and hands each to `sink` (to write or send).
pub fn metrics_requests(
    files: &[ImportedFile],
    options: &OtlpOptions,
    mut sink: impl FnMut(ExportMetricsServiceRequest, RequestInfo) -> Result<(), ImportError>,
) -> Result<OtlpStats, ImportError> {
    let set = series::build(
        files,
        options.sample_interval_ns,
        options.rank,
        &options.group,
    );
    let mut stats = OtlpStats {
        untimed_records: set.untimed_records,
        ..Default::default()
    };
    // Request order: resource, family, series, time.
    let mut order: Vec<PointRef> = Vec::new();
    let mut by_res: Vec<usize> = (0..set.series.len()).collect();
    by_res.sort_by_key(|&i| (set.series[i].resource, set.series[i].family));
    for i in by_res {
        let s = &set.series[i];
        order.extend((0..s.points.len()).map(|point| PointRef {
            resource: s.resource,
            series: i,
            point,
        }));
    }
    let mut budget = Budget::new(options);
    let mut request: Vec<ResourceMetrics> = Vec::new();
    // The (resource, family) that the request's last metric holds.
    let mut open: Option<(usize, Family)> = None;
    for r in &order {
        let s = &set.series[r.series];
        let resource = &set.resources[r.resource];
        let p = s.points[r.point];
        let mut attributes: Vec<KeyValue> = s.labels.iter().map(|(k, v)| attr(*k, v)).collect();
        attributes.push(string(Key::SourceFile.otel(), resource.source_file.clone()));
        attributes.push(int(Key::SourceRun.otel(), i64::from(resource.run)));
        let point = point_of(
            s.family,
            Point {
                attributes,
                start: resource.start_ns.min(p.at_ns),
                at: p.at_ns,
                sum_ns: p.sum_ns,
                count: p.count,
            },
        );
        let item = in_field(point.encoded_len());
        let opens = |open: Option<(usize, Family)>| {
            let new_resource = open.is_none_or(|(res, _)| res != r.resource);
            let new_metric = new_resource || open.is_some_and(|(_, f)| f != s.family);
            (new_resource, new_metric)
        };
        let cost = |(new_resource, new_metric): (bool, bool)| {
            let mut c = item;
            if new_metric {
                c += metric_of(s.family).encoded_len() + 2 * WRAP;
            }
            if new_resource {
                c += resource_metrics(resource).encoded_len() + 3 * WRAP;
            }
            c
        };
        if !budget.fits(cost(opens(open))) {
            let resource_metrics = std::mem::take(&mut request);
            budget.emit(
                ExportMetricsServiceRequest { resource_metrics },
                &mut stats,
                &mut sink,
            )?;
            open = None;
        }
        let (new_resource, new_metric) = opens(open);
        budget.add(cost((new_resource, new_metric)));
        if new_resource {
            request.push(resource_metrics(resource));
        }
        let metrics = request
            .last_mut()
            .and_then(|rm| rm.scope_metrics.last_mut())
            .map(|sm| &mut sm.metrics);
        let Some(metrics) = metrics else { continue };
        if new_metric {
            metrics.push(metric_of(s.family));
        }
        if let Some(metric) = metrics.last_mut() {
            point.push_into(metric);
        }
        open = Some((r.resource, s.family));
    }
    if budget.items > 0 {
        budget.emit(
            ExportMetricsServiceRequest {
                resource_metrics: request,
            },
            &mut stats,
            &mut sink,
        )?;
    }
    Ok(stats)
}

/// One cumulative point of a family.
struct Point {
    attributes: Vec<KeyValue>,
    start: u64,
    at: u64,
    sum_ns: u64,
    count: u64,
}

/// One point as its family's kind of data point.
enum DataPoint {
    Histogram(HistogramDataPoint),
    Number(NumberDataPoint),
}

impl DataPoint {
    fn encoded_len(&self) -> usize {
        match self {
            DataPoint::Histogram(p) => p.encoded_len(),
            DataPoint::Number(p) => p.encoded_len(),
        }
    }

    /// Appends the point to `metric`'s data, which is of the point's kind (both come from
    /// the family).
    fn push_into(self, metric: &mut Metric) {
        match (self, &mut metric.data) {
            (DataPoint::Histogram(p), Some(metric::Data::Histogram(h))) => h.data_points.push(p),
            (DataPoint::Number(p), Some(metric::Data::Sum(s))) => s.data_points.push(p),
            _ => debug_assert!(false, "a point of another kind than its metric"),
        }
    }
}

fn point_of(family: Family, p: Point) -> DataPoint {
    let seconds = p.sum_ns as f64 / 1e9;
    match family.shape() {
        Shape::SumCount => DataPoint::Histogram(build::histogram_point(
            p.attributes,
            p.start,
            p.at,
            p.count,
            seconds,
        )),
        shape => {
            // The live per-layer time counters are f64 seconds, the others integers.
            let value = match shape {
                Shape::SecondsCounter => number_data_point::Value::AsDouble(seconds),
                _ => number_data_point::Value::AsInt(signed(p.count)),
            };
            DataPoint::Number(build::number_point(p.attributes, p.start, p.at, value))
        }
    }
}

/// A family's metric, without points yet.
fn metric_of(family: Family) -> Metric {
    let (name, description, unit) = (family.otel_name(), family.description(), family.unit());
    if family.shape() == Shape::SumCount {
        build::histogram(name, description, unit)
    } else {
        build::monotonic_sum(name, description, unit)
    }
}

/// A resource's entry of a metrics request, with its scope and no metrics yet.
fn resource_metrics(resource: &Resource) -> ResourceMetrics {
    ResourceMetrics {
        resource: Some(proto_resource(resource)),
        scope_metrics: vec![ScopeMetrics {
            scope: Some(scope()),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// 64-bit FNV-1a, then a finaliser so that nearby inputs spread over all bits.
fn hash64(parts: &[&[u8]], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h.max(1)
}

/// The probe site that follows a layer's MoE, whose line carries that layer's routing.
const ROUTE_SITE: &str = "mlp";

/// One route-trace line of a step group.
struct Probe<'a> {
    run: u32,
    step: u64,
    at: u64,
    bar_ns: u64,
    site: &'a str,
    layer: u32,
    moe: bool,
    expert_ids: &'a [u32],
}

/// A routed layer whose routing a step root carries as an event.
struct RouteEvent<'a> {
    at: u64,
    layer: u32,
    expert_ids: &'a [u32],
}

/// What a span is: a step root with its route events, or a probe under its root.
enum SpanKind<'a> {
    Root { routes: Vec<RouteEvent<'a>> },
    Probe { parent: u64, probe: Probe<'a> },
}

/// One span to write.
struct SpanOut<'a> {
    resource: usize,
    trace_id: [u8; 16],
    span_id: u64,
    step: u64,
    start: u64,
    end: u64,
    kind: SpanKind<'a>,
}

/// Builds the trace requests of `files` and hands each to `sink`.
///
/// Each (file, run, step) of route-trace lines becomes one trace shaped like a live one: a
/// `decode.step` root spanning its probes, with a `moe.route` event (layer, expert ids) per
/// routed layer, and one span per line named by its probe bucket (`reduce_attn_bar`,
/// `reduce_mlp_bar`) with `bucket`, `site` and `layer`, ending at the line's time and lasting
/// its `bar_us`. A line prints the ids the router last read back, so only the `mlp` probe of a
/// routed layer (after that layer's MoE) carries that layer's routing; the other lines repeat
/// an earlier layer's ids and add no event.
pub fn trace_requests(
    files: &[ImportedFile],
    options: &OtlpOptions,
    mut sink: impl FnMut(ExportTraceServiceRequest, RequestInfo) -> Result<(), ImportError>,
) -> Result<OtlpStats, ImportError> {
    // The spans need the runs' resources, not the series.
    let (resources, _) = series::resources(files);
    let mut stats = OtlpStats::default();
    let mut spans: Vec<SpanOut<'_>> = Vec::new();
    for file in files {
        let mut probes: Vec<Probe<'_>> = Vec::new();
        for record in &file.records {
            if let ImportRecord::RouteTrace {
                run,
                at,
                step,
                site,
                layer,
                moe,
                bar_ns,
                expert_ids,
            } = record
            {
                let Some(at) = *at else {
                    stats.untimed_records += 1;
                    continue;
                };
                probes.push(Probe {
                    run: *run,
                    step: *step,
                    at,
                    bar_ns: *bar_ns,
                    site,
                    layer: *layer,
                    moe: *moe,
                    expert_ids,
                });
            }
        }
        for group in probes.chunk_by(|a, b| a.run == b.run && a.step == b.step) {
            let (run, step) = (group[0].run, group[0].step);
            let Some(res) = resources
                .iter()
                .position(|r| r.source_file == file.source_file && r.run == run)
            else {
                continue;
            };
            let key = [
                file.source_file.as_bytes(),
                &run.to_le_bytes(),
                &step.to_le_bytes(),
            ];
            let mut trace_id = [0u8; 16];
            trace_id[..8].copy_from_slice(&hash64(&key, 1).to_be_bytes());
            trace_id[8..].copy_from_slice(&hash64(&key, 2).to_be_bytes());
            let root = hash64(&key, 3);
            let start = group
                .iter()
                .map(|g| g.at.saturating_sub(g.bar_ns))
                .min()
                .unwrap_or(0);
            let end = group.iter().map(|g| g.at).max().unwrap_or(start);
            let routes = group
                .iter()
                .filter(|g| g.moe && g.site == ROUTE_SITE && !g.expert_ids.is_empty())
                .map(|g| RouteEvent {
                    at: g.at,
                    layer: g.layer,
                    expert_ids: g.expert_ids,
                })
                .collect();
            spans.push(SpanOut {
                resource: res,
                trace_id,
                span_id: root,
                step,
                start,
                end,
                kind: SpanKind::Root { routes },
            });
            for (i, probe) in group.iter().enumerate() {
                let span_id = hash64(&[key[0], key[1], key[2], &(i as u64).to_le_bytes()], 4);
                spans.push(SpanOut {
                    resource: res,
                    trace_id,
                    span_id,
                    step,
                    start: probe.at.saturating_sub(probe.bar_ns),
                    end: probe.at,
                    kind: SpanKind::Probe {
                        parent: root,
                        probe: Probe {
                            expert_ids: &[],
                            ..*probe
                        },
                    },
                });
            }
        }
    }
    let mut budget = Budget::new(options);
    let mut request: Vec<ResourceSpans> = Vec::new();
    // The resource that the request's last entry holds.
    let mut open: Option<usize> = None;
    for out in &spans {
        let span = span_of(out, options.rank, &options.group);
        let item = in_field(span.encoded_len());
        let resource = &resources[out.resource];
        let cost = |new_resource: bool| {
            if new_resource {
                item + resource_spans(resource).encoded_len() + 3 * WRAP
            } else {
                item
            }
        };
        if !budget.fits(cost(open != Some(out.resource))) {
            let resource_spans = std::mem::take(&mut request);
            budget.emit(
                ExportTraceServiceRequest { resource_spans },
                &mut stats,
                &mut sink,
            )?;
            open = None;
        }
        let new_resource = open != Some(out.resource);
        budget.add(cost(new_resource));
        if new_resource {
            request.push(resource_spans(resource));
        }
        if let Some(ss) = request.last_mut().and_then(|rs| rs.scope_spans.last_mut()) {
            ss.spans.push(span);
        }
        open = Some(out.resource);
    }
    if budget.items > 0 {
        budget.emit(
            ExportTraceServiceRequest {
                resource_spans: request,
            },
            &mut stats,
            &mut sink,
        )?;
    }
    Ok(stats)
}

/// A resource's entry of a trace request, with its scope and no spans yet.
fn resource_spans(resource: &Resource) -> ResourceSpans {
    ResourceSpans {
        resource: Some(proto_resource(resource)),
        scope_spans: vec![ScopeSpans {
            scope: Some(scope()),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn span_of(s: &SpanOut<'_>, rank: u32, group: &str) -> Span {
    // `rank` and `group` on every span, as live.
    let mut attributes = vec![
        int(Key::Rank.otel(), i64::from(rank)),
        string(Key::Group.otel(), group),
    ];
    let mut out = Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_be_bytes().to_vec(),
        kind: span::SpanKind::Internal as i32,
        start_time_unix_nano: s.start,
        end_time_unix_nano: s.end,
        ..Default::default()
    };
    match &s.kind {
        SpanKind::Root { routes } => {
            attributes.push(int(Key::Step.otel(), signed(s.step)));
            attributes.push(string(Key::Timing.otel(), TIMING.as_str()));
            out.name = SPAN_STEP.to_owned();
            out.events = routes
                .iter()
                .map(|r| span::Event {
                    time_unix_nano: r.at,
                    name: EVENT_MOE_ROUTE.to_owned(),
                    attributes: vec![
                        int(Key::Layer.otel(), i64::from(r.layer)),
                        kv(
                            Key::ExpertIds.otel(),
                            any_value::Value::ArrayValue(ArrayValue {
                                values: r
                                    .expert_ids
                                    .iter()
                                    .map(|&id| AnyValue {
                                        value: Some(any_value::Value::IntValue(i64::from(id))),
                                    })
                                    .collect(),
                            }),
                        ),
                    ],
                    ..Default::default()
                })
                .collect();
        }
        SpanKind::Probe { parent, probe } => {
            let bucket = probe_bucket(probe.site);
            attributes.push(string(Key::Bucket.otel(), bucket.as_ref()));
            attributes.push(int(Key::Layer.otel(), i64::from(probe.layer)));
            attributes.push(string(Key::Site.otel(), probe.site));
            out.name = bucket.into_owned();
            out.parent_span_id = parent.to_be_bytes().to_vec();
        }
    }
    out.attributes = attributes;
    out
}

/// Writes a request as one line of OTLP/JSON (JSON Lines, the OTLP file-exporter layout).
pub fn write_json_line<W: Write, M: serde::Serialize>(
    out: &mut W,
    request: &M,
) -> Result<(), ImportError> {
    serde_json::to_writer(&mut *out, request)
        .map_err(std::io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(|source| ImportError::Write {
            format: "otlp-json",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ImportOptions, import_reader};
    use phasetrace_names::{attr, metric};
    use serde_json::{Value, json};

    fn sample() -> ImportedFile {
        let log = "\
2026-09-30T12:00:01.000000Z  WARN p: GLMTRACE step=7 site=attn L=0 moe=0 bar_us=10.0 ids=
2026-09-30T12:00:01.000100Z  WARN p: GLMTRACE step=7 site=mlp L=0 moe=1 bar_us=2.5 ids=1,2
2026-09-30T12:00:02.000000Z  WARN p: GLMTRACE step=8 site=attn L=0 moe=0 bar_us=30.0 ids=
";
        import_reader(
            log.as_bytes(),
            ImportOptions {
                source_file: "r.log".into(),
                ..Default::default()
            },
        )
        .expect("import")
    }

    #[test]
    fn traces_look_like_live_ones_with_hex_ids_and_string_times() {
        let mut requests = Vec::new();
        let options = OtlpOptions {
            rank: 3,
            group: "tp1".into(),
            ..Default::default()
        };
        let stats = trace_requests(&[sample()], &options, |r, _| {
            let json = serde_json::to_value(&r).expect("OTLP/JSON");
            // What a collector's OTLP/JSON receiver decodes is the message that was built.
            let back: ExportTraceServiceRequest =
                serde_json::from_value(json.clone()).expect("decodes");
            assert!(back == r, "{json}");
            requests.push(json);
            Ok(())
        })
        .expect("traces");
        // Step 7: root + 2 probes; step 8: root + 1 probe.
        assert_eq!((stats.requests, stats.items), (1, 5));
        let spans = &requests[0]["resourceSpans"][0]["scopeSpans"][0]["spans"];
        let root = &spans[0];
        assert_eq!(root["name"], SPAN_STEP);
        assert_eq!(root["startTimeUnixNano"], "1790769600999990000");
        assert_eq!(root["endTimeUnixNano"], "1790769601000100000");
        // An empty parent id marks the root, in OTLP/JSON as in protobuf.
        assert_eq!(root["parentSpanId"], "");
        let route = &root["events"][0];
        assert_eq!(route["name"], EVENT_MOE_ROUTE);
        assert_eq!(route["timeUnixNano"], "1790769601000100000");
        assert_eq!(route["attributes"][0]["value"]["intValue"], "0");
        assert_eq!(route["attributes"][1]["key"], "moe.expert_ids");
        let ids = &route["attributes"][1]["value"]["arrayValue"]["values"];
        assert_eq!(ids[1]["intValue"], "2");
        let probe = &spans[2];
        assert_eq!(probe["name"], "reduce_mlp_bar");
        assert_eq!(probe["parentSpanId"], root["spanId"]);
        assert_eq!(probe["traceId"], root["traceId"]);
        assert_eq!(probe["startTimeUnixNano"], "1790769601000097500");
        let attrs: Vec<(&str, &Value)> = probe["attributes"]
            .as_array()
            .expect("attributes")
            .iter()
            .map(|a| (a["key"].as_str().unwrap_or(""), &a["value"]))
            .collect();
        assert_eq!(
            attrs,
            vec![
                ("rank", &json!({ "intValue": "3" })),
                ("group", &json!({ "stringValue": "tp1" })),
                ("bucket", &json!({ "stringValue": "reduce_mlp_bar" })),
                ("layer", &json!({ "intValue": "0" })),
                ("site", &json!({ "stringValue": "mlp" })),
            ]
        );
        let trace_id = root["traceId"].as_str().expect("hex");
        assert!(trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(spans[3]["traceId"], root["traceId"]);
        // A line with moe=0 adds no route event.
        assert_eq!(spans[3]["events"], json!([]));
        let res = &requests[0]["resourceSpans"][0]["resource"]["attributes"];
        assert_eq!(res[0]["value"]["stringValue"], SERVICE_NAME);
        assert_eq!(res[2]["value"]["intValue"], "0");
    }

    /// Every metric of `requests`, by name, with its points in request order.
    fn metrics_by_name(requests: &[Value]) -> std::collections::BTreeMap<String, Vec<Value>> {
        let mut out: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
        for r in requests {
            for rm in r["resourceMetrics"].as_array().into_iter().flatten() {
                for sm in rm["scopeMetrics"].as_array().into_iter().flatten() {
                    for m in sm["metrics"].as_array().into_iter().flatten() {
                        let name = m["name"].as_str().unwrap_or_default().to_owned();
                        out.entry(name).or_default().push(m.clone());
                    }
                }
            }
        }
        out
    }

    /// The attribute keys and the value of `key` of an OTLP/JSON data point.
    fn keys_and(point: &Value, key: &str) -> (Vec<String>, Value) {
        let attrs = point["attributes"].as_array().cloned().unwrap_or_default();
        let mut keys: Vec<String> = attrs
            .iter()
            .map(|a| a["key"].as_str().unwrap_or_default().to_owned())
            .collect();
        keys.sort();
        let value = attrs
            .iter()
            .find(|a| a["key"] == key)
            .map(|a| a["value"].clone())
            .unwrap_or(Value::Null);
        (keys, value)
    }

    fn requests_of(options: &OtlpOptions) -> (OtlpStats, Vec<Value>) {
        let mut requests = Vec::new();
        let stats = metrics_requests(&[sample()], options, |r, _| {
            let json = serde_json::to_value(&r).expect("OTLP/JSON");
            let back: ExportMetricsServiceRequest =
                serde_json::from_value(json.clone()).expect("decodes");
            assert!(back == r, "{json}");
            requests.push(json);
            Ok(())
        })
        .expect("metrics");
        (stats, requests)
    }

    #[test]
    fn metrics_are_chunked() {
        let (stats, requests) = requests_of(&OtlpOptions {
            max_items_per_request: 2,
            ..Default::default()
        });
        // Per family: attn layer 0 (2 points) and mlp layer 0 (1, and its total again at the
        // run's end): the wait histogram, the two per-layer wait counters and the two per-layer
        // section counters.
        assert_eq!((stats.requests, stats.items), (10, 20));
        let mut line = Vec::new();
        write_json_line(&mut line, &requests[1]).expect("write");
        assert!(line.ends_with(b"}\n") && !line[..line.len() - 1].contains(&b'\n'));
    }

    /// Route-trace lines of `steps` steps of `layers` routed layers, each line with `ids`
    /// expert ids: big root spans (one route event per layer) and many series.
    fn routed(steps: u64, layers: u32, ids: u32) -> ImportedFile {
        let ids: Vec<String> = (0..ids).map(|i| i.to_string()).collect();
        let ids = ids.join(",");
        let mut log = String::new();
        for step in 0..steps {
            for layer in 0..layers {
                let us = 1_000 * step + u64::from(layer);
                log += &format!(
                    "2026-09-30T12:00:{:02}.{us:06}Z  WARN p: GLMTRACE step={step} site=mlp L={layer} moe=1 bar_us=2.5 ids={ids}\n",
                    step / 1000
                );
            }
        }
        import_reader(
            log.as_bytes(),
            ImportOptions {
                source_file: "routed.log".into(),
                ..Default::default()
            },
        )
        .expect("import")
    }

    /// Every (resource, metric, point) of metrics requests, encoded, sorted.
    fn metric_points(requests: &[ExportMetricsServiceRequest]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for r in requests {
            for rm in &r.resource_metrics {
                let res = rm
                    .resource
                    .as_ref()
                    .map(|r| r.encode_to_vec())
                    .unwrap_or_default();
                for sm in &rm.scope_metrics {
                    for m in &sm.metrics {
                        let head = [res.clone(), m.name.clone().into_bytes()].concat();
                        match &m.data {
                            Some(super::metric::Data::Histogram(h)) => out.extend(
                                h.data_points
                                    .iter()
                                    .map(|p| [head.clone(), p.encode_to_vec()].concat()),
                            ),
                            Some(super::metric::Data::Sum(s)) => out.extend(
                                s.data_points
                                    .iter()
                                    .map(|p| [head.clone(), p.encode_to_vec()].concat()),
                            ),
                            other => panic!("unexpected data {other:?}"),
                        }
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// Every (resource, span) of trace requests, encoded, sorted.
    fn spans_of(requests: &[ExportTraceServiceRequest]) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = requests
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| {
                let res = rs
                    .resource
                    .as_ref()
                    .map(|r| r.encode_to_vec())
                    .unwrap_or_default();
                rs.scope_spans
                    .iter()
                    .flat_map(|ss| &ss.spans)
                    .map(move |s| [res.clone(), s.encode_to_vec()].concat())
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn requests_are_cut_by_size_and_carry_everything() {
        let file = [routed(40, 16, 64)];
        let whole = OtlpOptions {
            max_items_per_request: usize::MAX,
            max_request_bytes: usize::MAX,
            ..Default::default()
        };
        let mut all_m = Vec::new();
        let mut all_t = Vec::new();
        let m = metrics_requests(&file, &whole, |r, _| {
            all_m.push(r);
            Ok(())
        })
        .expect("metrics");
        let t = trace_requests(&file, &whole, |r, _| {
            all_t.push(r);
            Ok(())
        })
        .expect("traces");
        assert_eq!((m.requests, t.requests), (1, 1));
        // 40 roots with 16 route events of 64 ids, 640 probes.
        assert_eq!(t.items, 680);
        assert!(t.bytes > 200_000, "{t:?}");
        for limit in [20_000, 64_000, 150_000] {
            let options = OtlpOptions {
                max_request_bytes: limit,
                ..whole.clone()
            };
            for (what, stats, sizes, same) in [
                {
                    let mut got = Vec::new();
                    let mut sizes = Vec::new();
                    let stats = metrics_requests(&file, &options, |r, info| {
                        assert_eq!(info.bytes, r.encoded_len());
                        assert_eq!(info.number, got.len() + 1);
                        sizes.push(info.bytes);
                        got.push(r);
                        Ok(())
                    })
                    .expect("metrics");
                    (
                        "metrics",
                        stats,
                        sizes,
                        metric_points(&got) == metric_points(&all_m),
                    )
                },
                {
                    let mut got = Vec::new();
                    let mut sizes = Vec::new();
                    let stats = trace_requests(&file, &options, |r, info| {
                        assert_eq!(info.bytes, r.encoded_len());
                        sizes.push(info.bytes);
                        got.push(r);
                        Ok(())
                    })
                    .expect("traces");
                    ("traces", stats, sizes, spans_of(&got) == spans_of(&all_t))
                },
            ] {
                assert!(same, "{what} at {limit}: the same points or spans, split");
                let total = if what == "metrics" { m } else { t };
                assert_eq!(stats.items, total.items, "{what} at {limit}");
                assert!(stats.requests > 1, "{what} at {limit}: {stats:?}");
                assert_eq!(
                    stats.largest_request_bytes,
                    *sizes.iter().max().unwrap_or(&0)
                );
                assert!(
                    sizes.iter().all(|&b| b <= limit),
                    "{what} at {limit}: {sizes:?}"
                );
                // The bound is close: every request but the last is nearly full (a root span,
                // 16 events of 64 ids, is a quarter of the smallest limit).
                let full = if what == "metrics" { 0.9 } else { 0.75 };
                assert!(
                    sizes[..sizes.len() - 1]
                        .iter()
                        .all(|&b| b as f64 > limit as f64 * full),
                    "{what} at {limit}: {sizes:?}"
                );
            }
        }
    }

    #[test]
    fn a_span_larger_than_the_limit_goes_alone() {
        let file = [routed(3, 8, 256)];
        let options = OtlpOptions {
            max_request_bytes: 1_000,
            ..Default::default()
        };
        let mut sizes = Vec::new();
        let stats = trace_requests(&file, &options, |r, info| {
            sizes.push((r.resource_spans[0].scope_spans[0].spans.len(), info.bytes));
            Ok(())
        })
        .expect("traces");
        // A root (8 events of 256 ids) is over 1,000 bytes: alone in its request.
        assert_eq!(stats.items, 27);
        assert!(sizes.iter().any(|&(n, b)| n == 1 && b > 1_000), "{sizes:?}");
        assert!(
            sizes.iter().all(|&(n, b)| n == 1 || b <= 1_000),
            "{sizes:?}"
        );
    }

    #[test]
    fn metrics_are_cumulative_histograms_without_layer_and_per_layer_counters() {
        let (stats, requests) = requests_of(&OtlpOptions::default());
        assert_eq!((stats.requests, stats.items), (1, 20));
        let by_name = metrics_by_name(&requests);
        let names: Vec<&str> = by_name.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                metric::COLLECTIVE_LAYER_WAIT_CALLS,
                metric::COLLECTIVE_LAYER_WAIT_TIME,
                metric::COLLECTIVE_WAIT,
                metric::SECTION_LAYER_CALLS,
                metric::SECTION_LAYER_TIME,
            ]
        );
        let keys = |own: &[&str]| -> Vec<String> {
            let mut k: Vec<String> = own
                .iter()
                .chain(&[attr::RANK, attr::GROUP, attr::SOURCE_FILE, attr::SOURCE_RUN])
                .map(|s| (*s).to_owned())
                .collect();
            k.sort();
            k
        };

        let wait = &by_name[metric::COLLECTIVE_WAIT][0];
        assert_eq!(wait["unit"], metric::UNIT_SECONDS);
        let h = &wait["histogram"];
        assert_eq!(h["aggregationTemporality"], 2);
        let p = &h["dataPoints"][1];
        assert_eq!(
            keys_and(p, attr::SITE),
            (keys(&[attr::SITE]), json!({"stringValue": "attn"}))
        );
        assert_eq!(p["count"], "2");
        assert_eq!(p["sum"], 0.00004);
        assert_eq!(p["timeUnixNano"], "1790769602000000000");
        assert_eq!(p["startTimeUnixNano"], "1790769600999990000");

        for (name, unit, own) in [
            (
                metric::COLLECTIVE_LAYER_WAIT_TIME,
                metric::UNIT_SECONDS,
                &[attr::SITE, attr::LAYER][..],
            ),
            (
                metric::COLLECTIVE_LAYER_WAIT_CALLS,
                metric::UNIT_CALLS,
                &[attr::SITE, attr::LAYER][..],
            ),
            (
                metric::SECTION_LAYER_TIME,
                metric::UNIT_SECONDS,
                &[attr::BUCKET, attr::SITE, attr::LAYER][..],
            ),
            (
                metric::SECTION_LAYER_CALLS,
                metric::UNIT_CALLS,
                &[attr::BUCKET, attr::SITE, attr::LAYER][..],
            ),
        ] {
            let m = &by_name[name][0];
            assert_eq!(m["unit"], unit, "{name}");
            let sum = &m["sum"];
            assert_eq!(sum["aggregationTemporality"], 2, "{name}");
            assert_eq!(sum["isMonotonic"], true, "{name}");
            let points = sum["dataPoints"].as_array().expect("points");
            assert_eq!(points.len(), 4, "{name}");
            // attn, layer 0: the running total at each of its two probes.
            let (k, layer) = keys_and(&points[1], attr::LAYER);
            assert_eq!(k, keys(own), "{name}");
            assert_eq!(layer, json!({"intValue": "0"}), "{name}");
            assert_eq!(points[1]["timeUnixNano"], "1790769602000000000", "{name}");
            let (first, last) = if unit == metric::UNIT_CALLS {
                (json!("1"), json!("2"))
            } else {
                (json!(0.00001), json!(0.00004))
            };
            let value = if unit == metric::UNIT_CALLS {
                "asInt"
            } else {
                "asDouble"
            };
            assert_eq!(points[0][value], first, "{name}");
            assert_eq!(points[1][value], last, "{name}");
        }
        let bucket = keys_and(
            &by_name[metric::SECTION_LAYER_TIME][0]["sum"]["dataPoints"][0],
            attr::BUCKET,
        )
        .1;
        assert_eq!(bucket, json!({"stringValue": "reduce_attn_bar"}));
    }
}
