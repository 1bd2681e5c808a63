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
//!                ─► requests of at most `max_items_per_request` points or spans ─► sink
//! ```
//!
//! Each (file, run) is one resource with `service.name`, `source.file` and `source.run`; the
//! data points carry `source.file` and `source.run` too, so that a collector without
//! resource-to-label conversion still puts them on the Prometheus series, as the OpenMetrics
//! writer does.
//!
//! Ids are derived from (file, run, step, position) by hashing, so a re-import produces the
//! same ids and a backend deduplicates rather than doubles.

use std::io::Write;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, any_value,
};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};

use super::contract::{
    EVENT_MOE_ROUTE, Family, Key, SCOPE_NAME, SERVICE_NAME, SPAN_STEP, Shape, TIMING, probe_bucket,
};
use super::series::{self, Resource};
use super::{ImportError, ImportRecord, ImportedFile};
use crate::config::settings;
use crate::names::resource;

/// Options of the OTLP writers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpOptions {
    /// Data points (metrics) or spans (traces) per request. Default 5000.
    pub max_items_per_request: usize,
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
            sample_interval_ns: 1_000_000,
            rank: settings::RANK.default_value(),
            group: settings::GROUP.default_value(),
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
    /// Records left out because they had no time.
    pub untimed_records: u64,
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn string(key: &str, value: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.into()))
}

fn int(key: &str, value: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(value))
}

/// An attribute of a series label: an integer for integer keys whose value is one.
fn attr(key: Key, value: &str) -> KeyValue {
    match value.parse::<i64>() {
        Ok(v) if key.is_int() => int(key.otel(), v),
        _ => string(key.otel(), value),
    }
}

fn proto_resource(r: &Resource) -> ProtoResource {
    ProtoResource {
        attributes: vec![
            string(resource::SERVICE_NAME, SERVICE_NAME),
            string(Key::SourceFile.otel(), r.source_file.clone()),
            int(Key::SourceRun.otel(), i64::from(r.run)),
        ],
        ..Default::default()
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: SCOPE_NAME.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        ..Default::default()
    }
}

/// Something a request carries, with the index of its resource.
trait OfResource {
    fn resource(&self) -> usize;
}

/// Groups consecutive items by resource into one request's resource list.
fn by_resource<T: OfResource, R>(items: &[T], mut build: impl FnMut(usize, &[T]) -> R) -> Vec<R> {
    items
        .chunk_by(|a, b| a.resource() == b.resource())
        .map(|group| build(group[0].resource(), group))
        .collect()
}

/// One point of one series, in request order.
#[derive(Clone, Copy)]
struct PointRef {
    resource: usize,
    series: usize,
    point: usize,
}

impl OfResource for PointRef {
    fn resource(&self) -> usize {
        self.resource
    }
}

/// Nanoseconds as OTLP's signed integer value (saturating; counts never get near it).
fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Builds the metrics requests of `files` and hands each to `sink` (to write or send).
pub fn metrics_requests(
    files: &[ImportedFile],
    options: &OtlpOptions,
    mut sink: impl FnMut(ExportMetricsServiceRequest) -> Result<(), ImportError>,
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
    for chunk in order.chunks(options.max_items_per_request.max(1)) {
        let resource_metrics = by_resource(chunk, |res, group| {
            let resource = &set.resources[res];
            let metrics: Vec<Metric> = group
                .chunk_by(|a, b| set.series[a.series].family == set.series[b.series].family)
                .map(|fam| {
                    let family = set.series[fam[0].series].family;
                    let points = fam.iter().map(|r| {
                        let s = &set.series[r.series];
                        let p = s.points[r.point];
                        let mut attributes: Vec<KeyValue> =
                            s.labels.iter().map(|(k, v)| attr(*k, v)).collect();
                        attributes
                            .push(string(Key::SourceFile.otel(), resource.source_file.clone()));
                        attributes.push(int(Key::SourceRun.otel(), i64::from(resource.run)));
                        Point {
                            attributes,
                            start: resource.start_ns.min(p.at_ns),
                            at: p.at_ns,
                            sum_ns: p.sum_ns,
                            count: p.count,
                        }
                    });
                    metric_of(family, points)
                })
                .collect();
            ResourceMetrics {
                resource: Some(proto_resource(resource)),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(scope()),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }
        });
        stats.requests += 1;
        stats.items += chunk.len();
        sink(ExportMetricsServiceRequest { resource_metrics })?;
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

fn metric_of(family: Family, points: impl Iterator<Item = Point>) -> Metric {
    let temporality = AggregationTemporality::Cumulative as i32;
    let shape = family.shape();
    let data = if shape == Shape::SumCount {
        metric::Data::Histogram(Histogram {
            data_points: points
                .map(|p| HistogramDataPoint {
                    attributes: p.attributes,
                    start_time_unix_nano: p.start,
                    time_unix_nano: p.at,
                    count: p.count,
                    sum: Some(p.sum_ns as f64 / 1e9),
                    ..Default::default()
                })
                .collect(),
            aggregation_temporality: temporality,
        })
    } else {
        // The live per-layer time counters are f64 seconds, the others integers.
        let value = |p: &Point| match shape {
            Shape::SecondsCounter => number_data_point::Value::AsDouble(p.sum_ns as f64 / 1e9),
            _ => number_data_point::Value::AsInt(signed(p.count)),
        };
        metric::Data::Sum(Sum {
            data_points: points
                .map(|p| NumberDataPoint {
                    value: Some(value(&p)),
                    attributes: p.attributes,
                    start_time_unix_nano: p.start,
                    time_unix_nano: p.at,
                    ..Default::default()
                })
                .collect(),
            aggregation_temporality: temporality,
            is_monotonic: true,
        })
    };
    Metric {
        name: family.otel_name().to_owned(),
        description: family.description().to_owned(),
        unit: family.unit().to_owned(),
        data: Some(data),
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
    mut sink: impl FnMut(ExportTraceServiceRequest) -> Result<(), ImportError>,
) -> Result<OtlpStats, ImportError> {
    let set = series::build(
        files,
        options.sample_interval_ns,
        options.rank,
        &options.group,
    );
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
            let Some(res) = set
                .resources
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
    for chunk in spans.chunks(options.max_items_per_request.max(1)) {
        let resource_spans = by_resource(chunk, |res, group| ResourceSpans {
            resource: Some(proto_resource(&set.resources[res])),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope()),
                spans: group
                    .iter()
                    .map(|s| span_of(s, options.rank, &options.group))
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        });
        stats.requests += 1;
        stats.items += chunk.len();
        sink(ExportTraceServiceRequest { resource_spans })?;
    }
    Ok(stats)
}

impl OfResource for SpanOut<'_> {
    fn resource(&self) -> usize {
        self.resource
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
    use crate::import::{ImportOptions, import_reader};
    use crate::names::{attr, metric};
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
        let stats = trace_requests(&[sample()], &options, |r| {
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
        let stats = metrics_requests(&[sample()], options, |r| {
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
