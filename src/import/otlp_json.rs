//! OTLP/JSON requests (`ExportMetricsServiceRequest`, `ExportTraceServiceRequest`) that keep the
//! logs' own timestamps, for a collector's `/v1/metrics` and `/v1/traces`.
//!
//! ```text
//! ImportedFile[] ─► series::build ─► histogram (sum + count, no buckets) and monotonic sum
//!                                    points, cumulative, startTimeUnixNano = run start
//!                ─► route traces ─► one trace per (file, run, step): a `decode.step` root
//!                                   with `moe.route` events, one probe span per line
//!                ─► requests of at most `max_items_per_request` points or spans ─► sink
//! ```
//!
//! The JSON mapping follows the OTLP spec: camelCase keys, 64-bit integers as strings, enums as
//! numbers, trace and span ids as lowercase hex. Each (file, run) is one resource with
//! `service.name`, `source.file` and `source.run`; the data points carry `source.file` and
//! `source.run` too, so that a collector without resource-to-label conversion still puts them
//! on the Prometheus series, as the OpenMetrics writer does.
//!
//! Ids are derived from (file, run, step, position) by hashing, so a re-import produces the
//! same ids and a backend deduplicates rather than doubles.

use std::io::Write;

use serde_json::{Value, json};

use super::contract::{
    EVENT_MOE_ROUTE, Family, Key, SCOPE_NAME, SERVICE_NAME, SPAN_STEP, TIMING_SYNC, probe_bucket,
};
use super::series::{self, Resource};
use super::{ImportError, ImportRecord, ImportedFile};

/// Options of the OTLP/JSON writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OtlpJsonOptions {
    /// Data points (metrics) or spans (traces) per request. Default 5000.
    pub max_items_per_request: usize,
    /// Minimum spacing of two points of one series, nanoseconds. Default 1 ms.
    pub sample_interval_ns: u64,
    /// Value of a `rank` attribute on every series and span (`--rank`); `None` leaves it out.
    pub rank: Option<u32>,
}

impl Default for OtlpJsonOptions {
    fn default() -> Self {
        Self {
            max_items_per_request: 5000,
            sample_interval_ns: 1_000_000,
            rank: None,
        }
    }
}

/// What a writer produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OtlpJsonStats {
    /// Requests handed to the sink.
    pub requests: usize,
    /// Data points or spans in them.
    pub items: usize,
    /// Records left out because they had no time.
    pub untimed_records: u64,
}

/// OTLP `AGGREGATION_TEMPORALITY_CUMULATIVE`.
const CUMULATIVE: u8 = 2;
/// OTLP `SPAN_KIND_INTERNAL`.
const SPAN_KIND_INTERNAL: u8 = 1;

fn attr(key: Key, value: &str) -> Value {
    match value.parse::<i64>() {
        Ok(v) if key.is_int() => {
            json!({ "key": key.otel(), "value": { "intValue": v.to_string() } })
        }
        _ => json!({ "key": key.otel(), "value": { "stringValue": value } }),
    }
}

fn resource_attrs(r: &Resource) -> Vec<Value> {
    vec![
        json!({ "key": "service.name", "value": { "stringValue": SERVICE_NAME } }),
        attr(Key::SourceFile, &r.source_file),
        attr(Key::SourceRun, &r.run.to_string()),
    ]
}

fn scope() -> Value {
    json!({ "name": SCOPE_NAME, "version": env!("CARGO_PKG_VERSION") })
}

/// Groups consecutive `(resource, item)` pairs by resource into one request's resource list.
fn by_resource<T>(
    items: &[(usize, T)],
    mut build: impl FnMut(usize, &[(usize, T)]) -> Value,
) -> Vec<Value> {
    items
        .chunk_by(|a, b| a.0 == b.0)
        .map(|group| build(group[0].0, group))
        .collect()
}

/// Builds the metrics requests of `files` and hands each to `sink` (to write or POST).
pub fn metrics_requests(
    files: &[ImportedFile],
    options: &OtlpJsonOptions,
    mut sink: impl FnMut(Value) -> Result<(), ImportError>,
) -> Result<OtlpJsonStats, ImportError> {
    let set = series::build(files, options.sample_interval_ns, options.rank);
    let mut stats = OtlpJsonStats {
        untimed_records: set.untimed_records,
        ..Default::default()
    };
    // (resource, (series, point)) in request order: resource, family, series, time.
    let mut order: Vec<(usize, (usize, usize))> = Vec::new();
    let mut by_res: Vec<usize> = (0..set.series.len()).collect();
    by_res.sort_by_key(|&i| (set.series[i].resource, set.series[i].family));
    for i in by_res {
        let s = &set.series[i];
        order.extend((0..s.points.len()).map(|p| (s.resource, (i, p))));
    }
    for chunk in order.chunks(options.max_items_per_request.max(1)) {
        let resource_metrics = by_resource(chunk, |res, group| {
            let resource = &set.resources[res];
            let metrics: Vec<Value> = group
                .chunk_by(|a, b| set.series[a.1.0].family == set.series[b.1.0].family)
                .map(|fam| {
                    let family = set.series[fam[0].1.0].family;
                    let points: Vec<Value> = fam
                        .iter()
                        .map(|&(_, (si, pi))| {
                            let s = &set.series[si];
                            let p = s.points[pi];
                            let mut attributes: Vec<Value> =
                                s.labels.iter().map(|(k, v)| attr(*k, v)).collect();
                            attributes.push(attr(Key::SourceFile, &resource.source_file));
                            attributes.push(attr(Key::SourceRun, &resource.run.to_string()));
                            let start = resource.start_ns.min(p.at_ns);
                            if family.is_counter() {
                                json!({
                                    "attributes": attributes,
                                    "startTimeUnixNano": start.to_string(),
                                    "timeUnixNano": p.at_ns.to_string(),
                                    "asInt": p.count.to_string(),
                                })
                            } else {
                                json!({
                                    "attributes": attributes,
                                    "startTimeUnixNano": start.to_string(),
                                    "timeUnixNano": p.at_ns.to_string(),
                                    "count": p.count.to_string(),
                                    "sum": p.sum_ns as f64 / 1e9,
                                    "bucketCounts": [],
                                    "explicitBounds": [],
                                })
                            }
                        })
                        .collect();
                    metric(family, points)
                })
                .collect();
            json!({
                "resource": { "attributes": resource_attrs(resource) },
                "scopeMetrics": [{ "scope": scope(), "metrics": metrics }],
            })
        });
        stats.requests += 1;
        stats.items += chunk.len();
        sink(json!({ "resourceMetrics": resource_metrics }))?;
    }
    Ok(stats)
}

fn metric(family: Family, points: Vec<Value>) -> Value {
    let mut m = json!({
        "name": family.otel_name(),
        "description": family.description(),
        "unit": family.unit(),
    });
    let data = if family.is_counter() {
        (
            "sum",
            json!({ "aggregationTemporality": CUMULATIVE, "isMonotonic": true, "dataPoints": points }),
        )
    } else {
        (
            "histogram",
            json!({ "aggregationTemporality": CUMULATIVE, "dataPoints": points }),
        )
    };
    if let Some(obj) = m.as_object_mut() {
        obj.insert(data.0.to_owned(), data.1);
    }
    m
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
    at: u64,
    bar_ns: u64,
    site: &'a str,
    layer: u32,
    moe: bool,
    expert_ids: &'a [u32],
}

/// One span to write: a step root (with its route events) or a probe.
struct SpanOut<'a> {
    trace_id: String,
    span_id: u64,
    step: u64,
    start: u64,
    end: u64,
    /// `None` for the root; the root's id and the probe for a probe span.
    probe: Option<(u64, Probe<'a>)>,
    /// For the root: the probes whose lines carry a MoE layer's routing.
    routes: Vec<(u64, u32, &'a [u32])>,
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
    options: &OtlpJsonOptions,
    mut sink: impl FnMut(Value) -> Result<(), ImportError>,
) -> Result<OtlpJsonStats, ImportError> {
    let set = series::build(files, options.sample_interval_ns, options.rank);
    let mut stats = OtlpJsonStats::default();
    let mut spans: Vec<(usize, SpanOut<'_>)> = Vec::new();
    for file in files {
        let mut probes: Vec<(u32, u64, Probe<'_>)> = Vec::new();
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
                let probe = Probe {
                    at,
                    bar_ns: *bar_ns,
                    site,
                    layer: *layer,
                    moe: *moe,
                    expert_ids,
                };
                probes.push((*run, *step, probe));
            }
        }
        for group in probes.chunk_by(|a, b| a.0 == b.0 && a.1 == b.1) {
            let (run, step) = (group[0].0, group[0].1);
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
            let trace_id = format!("{:016x}{:016x}", hash64(&key, 1), hash64(&key, 2));
            let root = hash64(&key, 3);
            let start = group
                .iter()
                .map(|g| g.2.at.saturating_sub(g.2.bar_ns))
                .min()
                .unwrap_or(0);
            let end = group.iter().map(|g| g.2.at).max().unwrap_or(start);
            let routes = group
                .iter()
                .filter(|g| g.2.moe && g.2.site == ROUTE_SITE && !g.2.expert_ids.is_empty())
                .map(|g| (g.2.at, g.2.layer, g.2.expert_ids))
                .collect();
            spans.push((
                res,
                SpanOut {
                    trace_id: trace_id.clone(),
                    span_id: root,
                    step,
                    start,
                    end,
                    probe: None,
                    routes,
                },
            ));
            for (i, (_, _, probe)) in group.iter().enumerate() {
                let span_id = hash64(&[key[0], key[1], key[2], &(i as u64).to_le_bytes()], 4);
                spans.push((
                    res,
                    SpanOut {
                        trace_id: trace_id.clone(),
                        span_id,
                        step,
                        start: probe.at.saturating_sub(probe.bar_ns),
                        end: probe.at,
                        probe: Some((
                            root,
                            Probe {
                                expert_ids: &[],
                                ..*probe
                            },
                        )),
                        routes: Vec::new(),
                    },
                ));
            }
        }
    }
    for chunk in spans.chunks(options.max_items_per_request.max(1)) {
        let resource_spans = by_resource(chunk, |res, group| {
            let spans: Vec<Value> = group
                .iter()
                .map(|(_, s)| span_json(s, options.rank))
                .collect();
            json!({
                "resource": { "attributes": resource_attrs(&set.resources[res]) },
                "scopeSpans": [{ "scope": scope(), "spans": spans }],
            })
        });
        stats.requests += 1;
        stats.items += chunk.len();
        sink(json!({ "resourceSpans": resource_spans }))?;
    }
    Ok(stats)
}

fn span_json(s: &SpanOut<'_>, rank: Option<u32>) -> Value {
    let mut attributes = Vec::new();
    if let Some(rank) = rank {
        attributes.push(attr(Key::Rank, &rank.to_string()));
    }
    let mut span = json!({
        "traceId": s.trace_id,
        "spanId": format!("{:016x}", s.span_id),
        "kind": SPAN_KIND_INTERNAL,
        "startTimeUnixNano": s.start.to_string(),
        "endTimeUnixNano": s.end.to_string(),
    });
    let Some(obj) = span.as_object_mut() else {
        return span;
    };
    match &s.probe {
        None => {
            attributes.push(attr(Key::Step, &s.step.to_string()));
            attributes.push(attr(Key::Timing, TIMING_SYNC));
            let events: Vec<Value> = s
                .routes
                .iter()
                .map(|(at, layer, ids)| {
                    let ids: Vec<Value> = ids
                        .iter()
                        .map(|id| json!({ "intValue": id.to_string() }))
                        .collect();
                    json!({
                        "timeUnixNano": at.to_string(),
                        "name": EVENT_MOE_ROUTE,
                        "attributes": [
                            attr(Key::Layer, &layer.to_string()),
                            { "key": Key::ExpertIds.otel(), "value": { "arrayValue": { "values": ids } } },
                        ],
                    })
                })
                .collect();
            obj.insert("name".to_owned(), json!(SPAN_STEP));
            obj.insert("events".to_owned(), json!(events));
        }
        Some((parent, probe)) => {
            let bucket = probe_bucket(probe.site);
            attributes.push(attr(Key::Bucket, &bucket));
            attributes.push(attr(Key::Layer, &probe.layer.to_string()));
            attributes.push(attr(Key::Site, probe.site));
            obj.insert("name".to_owned(), json!(bucket));
            obj.insert("parentSpanId".to_owned(), json!(format!("{parent:016x}")));
        }
    }
    obj.insert("attributes".to_owned(), json!(attributes));
    span
}

/// Writes requests as JSON Lines (one request per line), the OTLP file-exporter layout.
pub fn write_json_line<W: Write>(out: &mut W, request: &Value) -> Result<(), ImportError> {
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
        let options = OtlpJsonOptions {
            rank: Some(3),
            ..Default::default()
        };
        let stats = trace_requests(&[sample()], &options, |r| {
            requests.push(r);
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
        assert!(root.get("parentSpanId").is_none());
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

    #[test]
    fn metrics_are_cumulative_histograms_and_chunked() {
        let mut requests = Vec::new();
        let options = OtlpJsonOptions {
            max_items_per_request: 2,
            ..Default::default()
        };
        let stats = metrics_requests(&[sample()], &options, |r| {
            requests.push(r);
            Ok(())
        })
        .expect("metrics");
        // attn: 2 points, mlp: 1 point.
        assert_eq!((stats.requests, stats.items), (2, 3));
        let m = &requests[0]["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0];
        assert_eq!(m["name"], "phasetrace.collective.wait");
        assert_eq!(m["unit"], "s");
        let h = &m["histogram"];
        assert_eq!(h["aggregationTemporality"], 2);
        let p = &h["dataPoints"][1];
        assert_eq!(p["count"], "2");
        assert_eq!(p["sum"], 0.00004);
        assert_eq!(p["timeUnixNano"], "1790769602000000000");
        assert_eq!(p["startTimeUnixNano"], "1790769600999990000");
        let mut line = Vec::new();
        write_json_line(&mut line, &requests[1]).expect("write");
        assert!(line.ends_with(b"}\n") && !line[..line.len() - 1].contains(&b'\n'));
    }
}
