//! A parser for what `rotel-agent --debug-log traces --debug-log metrics
//! --debug-log-verbosity detailed` prints for every OTLP export it receives.
//!
//! The format (rotel 0.0.1a15, the collector's "detailed" debug exporter layout) is
//! line-oriented. A span export looks like
//!
//! ```text
//! ResourceSpans #0
//! Resource SchemaURL:
//! Resource attributes:
//!      -> service.name: Str(dump-svc)
//! ScopeSpans #0
//! ScopeSpans SchemaURL:
//! InstrumentationScope scoped 1.2.3
//! Span #0
//!     Trace ID       : 3dcf054e4583effee5e42f21da12b344
//!     Parent ID      : 94241dcb0c848021
//!     ID             : b7ba533978ab9ab4
//!     Name           : child
//!     Kind           : SPAN_KIND_INTERNAL
//! Start time: 1796055956823234531
//! End time: 1796055956823238277
//!     Status code    : STATUS_CODE_ERROR
//!     Status message : bad thing
//! Attributes:
//!      -> s: Str(a b, c: "d")
//!      -> i: Int(42)
//! Events:
//! SpanEvent #0
//!      -> Name: ev1
//!      -> Timestamp: 1796055972093613284
//!      -> DroppedAttributesCount: 0
//!      -> Attributes::
//!           -> ek: Str(ev)
//! Links:
//! SpanLink #0
//!      -> Trace ID: 83ec18f8137cdad8525689f4f5cee41a
//!      -> ID: d16453236bd5dc46
//!      -> TraceState:
//!      -> DroppedAttributesCount: 0
//! ```
//!
//! and a metric export like
//!
//! ```text
//! ResourceMetrics #0
//! Resource attributes:
//!      -> service.name: Str(dump-svc)
//! ScopeMetrics #0
//! InstrumentationScope dump
//! Metric #0
//! Descriptor:
//!      -> Name: lat
//!      -> Description:
//!      -> Unit: s
//!      -> DataType: Histogram
//!      -> AggregationTemporality: AGGREGATION_TEMPORALITY_CUMULATIVE
//! HistogramDataPoints #0
//! Data point attributes:
//!      -> phase: Str(x)
//! StartTimestamp: 1796055956825943702
//! Timestamp: 1796055956826197345
//! Count: 2
//! Sum: 0.55
//! Min: 0.05
//! Max: 0.5
//! ExplicitBounds #0: 0.1
//! ExplicitBounds #1: 1
//! Buckets #0, Count: 1
//! Buckets #1, Count: 1
//! Buckets #2, Count: 0
//! Exemplars:
//! Exemplar #0
//!      -> Trace ID: 37576b3ed8d308eaef6165994d81bf84
//!      -> Span ID: 047e72aa017bb566
//!      -> Timestamp: 1796126757785420228
//!      -> Value: 0.030106276
//! Metric #1
//! Descriptor:
//!      -> Name: cnt
//!      -> DataType: Sum
//!      -> IsMonotonic: true
//!      -> AggregationTemporality: AGGREGATION_TEMPORALITY_CUMULATIVE
//! NumberDataPoints #0
//! Data point attributes:
//!      -> k: Str(v)
//! StartTimestamp: 1796055956826007127
//! Timestamp: 1796055956826243294
//! Value: 3
//! ```
//!
//! Exponential histograms print `ExponentialHistogramDataPoints #N` with
//! `Bucket [0, 0], Count: 1` / `Bucket (0.957, 1], Count: 1` lines. Rotel's own log lines
//! (`2026-01-01T00:00:00.000000Z  INFO ...`) are skipped. String attribute values that
//! contain newlines continue on the following lines up to the closing `)`.
//!
//! Every export is printed separately, so a cumulative metric exported twice appears as two
//! [`ReceivedMetric`]s; [`ParsedOutput::latest_point`] picks the newest point.

use std::collections::BTreeMap;

/// Spans and metrics found in rotel's output, in the order they were printed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedOutput {
    pub spans: Vec<ReceivedSpan>,
    pub metrics: Vec<ReceivedMetric>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReceivedSpan {
    pub name: String,
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// `None` for a root span (rotel prints an empty `Parent ID`).
    pub parent_span_id: Option<String>,
    /// `SPAN_KIND_INTERNAL`, `SPAN_KIND_SERVER`, ...
    pub kind: String,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    /// `STATUS_CODE_UNSET`, `STATUS_CODE_OK` or `STATUS_CODE_ERROR`.
    pub status_code: String,
    pub status_message: String,
    /// Attribute values without their type wrapper: `Str(x)` → `x`, `Int(42)` → `42`,
    /// `Double(1.5)` → `1.5`, `Bool(true)` → `true`; anything else (`Slice(..)`, ...) as printed.
    pub attributes: BTreeMap<String, String>,
    pub events: Vec<ReceivedEvent>,
    pub links: Vec<ReceivedLink>,
    pub resource: BTreeMap<String, String>,
    pub scope_name: String,
    pub scope_version: String,
}

impl ReceivedSpan {
    pub fn duration_nanos(&self) -> u64 {
        self.end_unix_nanos.saturating_sub(self.start_unix_nanos)
    }

    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    pub fn is_root(&self) -> bool {
        self.parent_span_id.is_none()
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReceivedEvent {
    pub name: String,
    pub time_unix_nanos: u64,
    pub attributes: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReceivedLink {
    pub trace_id: String,
    pub span_id: String,
    pub attributes: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MetricKind {
    Histogram,
    ExponentialHistogram,
    Sum,
    Gauge,
    Summary,
    /// A `DataType` this parser does not know, as printed.
    Other(String),
    #[default]
    Unknown,
}

impl MetricKind {
    fn from_data_type(text: &str) -> MetricKind {
        match text {
            "Histogram" => MetricKind::Histogram,
            "ExponentialHistogram" => MetricKind::ExponentialHistogram,
            "Sum" => MetricKind::Sum,
            "Gauge" => MetricKind::Gauge,
            "Summary" => MetricKind::Summary,
            other => MetricKind::Other(other.to_string()),
        }
    }
}

/// One metric of one export.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReceivedMetric {
    pub name: String,
    pub description: String,
    pub unit: String,
    pub kind: MetricKind,
    /// `Some` for sums.
    pub monotonic: Option<bool>,
    /// `AGGREGATION_TEMPORALITY_CUMULATIVE` / `..._DELTA`; empty for gauges.
    pub temporality: String,
    pub points: Vec<Point>,
    pub resource: BTreeMap<String, String>,
    pub scope_name: String,
    pub scope_version: String,
}

impl ReceivedMetric {
    pub fn is_cumulative(&self) -> bool {
        self.temporality.ends_with("CUMULATIVE")
    }

    /// The first point whose attributes include all of `attributes`.
    pub fn point(&self, attributes: &[(&str, &str)]) -> Option<&Point> {
        self.points.iter().find(|p| p.matches(attributes))
    }
}

/// One data point. Histograms fill `count`, `sum`, `min`, `max`, `explicit_bounds` and
/// `bucket_counts` (one more count than bounds); exponential histograms fill `bucket_counts`
/// and `exp_bucket_ranges` (one `(lower, upper)` per count, the zero bucket first); sums and
/// gauges fill `value`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Point {
    pub attributes: BTreeMap<String, String>,
    pub start_unix_nanos: Option<u64>,
    pub time_unix_nanos: Option<u64>,
    pub count: Option<u64>,
    pub sum: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub value: Option<f64>,
    pub bucket_counts: Vec<u64>,
    pub explicit_bounds: Vec<f64>,
    pub exp_bucket_ranges: Vec<(f64, f64)>,
    /// The point's exemplars, in the order they arrived.
    pub exemplars: Vec<ReceivedExemplar>,
}

/// An exemplar of a data point: the span a measurement came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReceivedExemplar {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    pub time_unix_nanos: u64,
    pub value: f64,
}

impl Point {
    /// True when the point's attributes include every `(key, value)` of `attributes`.
    pub fn matches(&self, attributes: &[(&str, &str)]) -> bool {
        attributes
            .iter()
            .all(|(k, v)| self.attributes.get(*k).is_some_and(|have| have == v))
    }

    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

impl ParsedOutput {
    /// All spans called `name`, in arrival order.
    pub fn spans_named(&self, name: &str) -> Vec<&ReceivedSpan> {
        self.spans.iter().filter(|s| s.name == name).collect()
    }

    /// The first span called `name`.
    pub fn span(&self, name: &str) -> Option<&ReceivedSpan> {
        self.spans.iter().find(|s| s.name == name)
    }

    /// The span with this span id.
    pub fn span_by_id(&self, span_id: &str) -> Option<&ReceivedSpan> {
        self.spans.iter().find(|s| s.span_id == span_id)
    }

    /// The spans whose parent is `parent` (same trace, parent id = its span id).
    pub fn children_of(&self, parent: &ReceivedSpan) -> Vec<&ReceivedSpan> {
        self.spans
            .iter()
            .filter(|s| {
                s.trace_id == parent.trace_id
                    && s.parent_span_id.as_deref() == Some(parent.span_id.as_str())
            })
            .collect()
    }

    /// The parent of `span`, if it was received.
    pub fn parent_of(&self, span: &ReceivedSpan) -> Option<&ReceivedSpan> {
        let parent_id = span.parent_span_id.as_deref()?;
        self.spans
            .iter()
            .find(|s| s.trace_id == span.trace_id && s.span_id == parent_id)
    }

    /// Every export of the metric called `name`, oldest first.
    pub fn metrics_named(&self, name: &str) -> Vec<&ReceivedMetric> {
        self.metrics.iter().filter(|m| m.name == name).collect()
    }

    /// The newest export of the metric called `name`.
    pub fn last_metric(&self, name: &str) -> Option<&ReceivedMetric> {
        self.metrics.iter().rev().find(|m| m.name == name)
    }

    /// The newest point of metric `name` whose attributes include all of `attributes`.
    pub fn latest_point(&self, name: &str, attributes: &[(&str, &str)]) -> Option<&Point> {
        self.metrics
            .iter()
            .rev()
            .filter(|m| m.name == name)
            .find_map(|m| m.points.iter().rev().find(|p| p.matches(attributes)))
    }
}

/// Where `-> key: value` lines currently go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    None,
    ResourceAttributes,
    SpanAttributes,
    Events,
    EventAttributes,
    Links,
    LinkAttributes,
    Descriptor,
    PointAttributes,
    /// `Exemplar #N` of the current point.
    Exemplar,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Spans,
    Metrics,
}

struct Parser {
    out: ParsedOutput,
    target: Target,
    section: Section,
    resource: BTreeMap<String, String>,
    scope_name: String,
    scope_version: String,
    span: Option<ReceivedSpan>,
    metric: Option<ReceivedMetric>,
    point: Option<Point>,
    /// A `Str(` value still waiting for its closing `)`: section, key, text so far.
    pending_str: Option<(Section, String, String)>,
}

/// Parses everything rotel printed (see the module docs for the format).
pub fn parse_output(output: &str) -> ParsedOutput {
    let mut parser = Parser {
        out: ParsedOutput::default(),
        target: Target::Spans,
        section: Section::None,
        resource: BTreeMap::new(),
        scope_name: String::new(),
        scope_version: String::new(),
        span: None,
        metric: None,
        point: None,
        pending_str: None,
    };
    for line in output.lines() {
        parser.line(line);
    }
    parser.finish_span();
    parser.finish_metric();
    parser.out
}

fn is_log_line(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes.len() > 20
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[4] == b'-'
        && bytes[7] == b'-'
        && bytes[10] == b'T'
}

/// `Str(x)` → `x`, `Int(42)` → `42`, `Double(1.5)` → `1.5`, `Bool(true)` → `true`,
/// anything else unchanged.
fn unwrap_value(raw: &str) -> String {
    for prefix in ["Str(", "Int(", "Double(", "Bool("] {
        if let Some(inner) = raw.strip_prefix(prefix).and_then(|r| r.strip_suffix(')')) {
            return inner.to_string();
        }
    }
    raw.to_string()
}

fn parse_u64(text: &str) -> u64 {
    text.trim().parse().unwrap_or_default()
}

fn parse_f64(text: &str) -> Option<f64> {
    text.trim().parse().ok()
}

/// Splits `     -> key: value` into its indentation depth (1 or 2), key and raw value.
fn arrow_line(line: &str) -> Option<(usize, &str, &str)> {
    let trimmed = line.trim_start();
    let rest = trimmed.strip_prefix("->")?;
    let indent = line.len() - trimmed.len();
    let depth = if indent >= 8 { 2 } else { 1 };
    let rest = rest.strip_prefix(' ').unwrap_or(rest);
    let (key, value) = match rest.split_once(": ") {
        Some((k, v)) => (k, v),
        // `-> Description:` with an empty value, or `-> Attributes::`.
        None => (rest.strip_suffix(':').unwrap_or(rest), ""),
    };
    Some((depth, key, value))
}

/// Splits `    Trace ID       : value` / `Start time: value` at the first `:`.
fn field_line(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.split_once(':')?;
    Some((
        key.trim(),
        value.strip_prefix(' ').unwrap_or(value).trim_end(),
    ))
}

/// True for `HEADER #N`.
fn numbered(line: &str, header: &str) -> bool {
    line.strip_prefix(header)
        .and_then(|rest| rest.strip_prefix(" #"))
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

impl Parser {
    fn line(&mut self, line: &str) {
        if let Some((section, key, mut text)) = self.pending_str.take() {
            text.push('\n');
            if let Some(last) = line.strip_suffix(')') {
                text.push_str(last);
                self.put_attribute(section, key, text);
            } else {
                text.push_str(line);
                self.pending_str = Some((section, key, text));
            }
            return;
        }
        if line.trim().is_empty() || is_log_line(line) {
            return;
        }
        if let Some((depth, key, value)) = arrow_line(line) {
            self.arrow(depth, key, value);
            return;
        }
        self.header_or_field(line.trim_end());
    }

    fn header_or_field(&mut self, line: &str) {
        if numbered(line, "ResourceSpans") || numbered(line, "ResourceMetrics") {
            self.finish_span();
            self.finish_metric();
            self.target = if line.starts_with("ResourceSpans") {
                Target::Spans
            } else {
                Target::Metrics
            };
            self.resource.clear();
            self.scope_name.clear();
            self.scope_version.clear();
            self.section = Section::None;
        } else if line == "Resource attributes:" {
            self.section = Section::ResourceAttributes;
        } else if numbered(line, "ScopeSpans") || numbered(line, "ScopeMetrics") {
            self.finish_span();
            self.finish_metric();
            self.scope_name.clear();
            self.scope_version.clear();
            self.section = Section::None;
        } else if let Some(scope) = line.strip_prefix("InstrumentationScope") {
            let mut parts = scope.split_whitespace();
            self.scope_name = parts.next().unwrap_or_default().to_string();
            self.scope_version = parts.next().unwrap_or_default().to_string();
        } else if numbered(line, "Span") {
            self.finish_span();
            self.section = Section::None;
            self.span = Some(ReceivedSpan {
                resource: self.resource.clone(),
                scope_name: self.scope_name.clone(),
                scope_version: self.scope_version.clone(),
                ..ReceivedSpan::default()
            });
        } else if line == "Attributes:" {
            self.section = Section::SpanAttributes;
        } else if line == "Events:" {
            self.section = Section::Events;
        } else if numbered(line, "SpanEvent") {
            self.section = Section::Events;
            if let Some(span) = self.span.as_mut() {
                span.events.push(ReceivedEvent::default());
            }
        } else if line == "Links:" {
            self.section = Section::Links;
        } else if numbered(line, "SpanLink") {
            self.section = Section::Links;
            if let Some(span) = self.span.as_mut() {
                span.links.push(ReceivedLink::default());
            }
        } else if numbered(line, "Metric") {
            self.finish_metric();
            self.section = Section::None;
            self.metric = Some(ReceivedMetric {
                resource: self.resource.clone(),
                scope_name: self.scope_name.clone(),
                scope_version: self.scope_version.clone(),
                ..ReceivedMetric::default()
            });
        } else if line == "Descriptor:" {
            self.section = Section::Descriptor;
        } else if numbered(line, "HistogramDataPoints")
            || numbered(line, "ExponentialHistogramDataPoints")
            || numbered(line, "NumberDataPoints")
            || numbered(line, "SummaryDataPoints")
        {
            self.finish_point();
            self.section = Section::None;
            self.point = Some(Point::default());
        } else if line == "Data point attributes:" {
            self.section = Section::PointAttributes;
        } else if line == "Exemplars:" {
            self.section = Section::None;
        } else if numbered(line, "Exemplar") {
            self.section = Section::Exemplar;
            if let Some(point) = self.point.as_mut() {
                point.exemplars.push(ReceivedExemplar::default());
            }
        } else if self.target == Target::Metrics {
            self.point_field(line);
        } else {
            self.span_field(line);
        }
    }

    fn span_field(&mut self, line: &str) {
        let (Some(span), Some((key, value))) = (self.span.as_mut(), field_line(line)) else {
            return;
        };
        match key {
            "Trace ID" => span.trace_id = value.to_string(),
            "Parent ID" => span.parent_span_id = (!value.is_empty()).then(|| value.to_string()),
            "ID" => span.span_id = value.to_string(),
            "Name" => span.name = value.to_string(),
            "Kind" => span.kind = value.to_string(),
            "Start time" => span.start_unix_nanos = parse_u64(value),
            "End time" => span.end_unix_nanos = parse_u64(value),
            "Status code" => span.status_code = value.to_string(),
            "Status message" => span.status_message = value.to_string(),
            _ => {}
        }
    }

    fn point_field(&mut self, line: &str) {
        let Some(point) = self.point.as_mut() else {
            return;
        };
        if let Some(rest) = line.strip_prefix("ExplicitBounds #") {
            if let Some(bound) = rest.split_once(": ").and_then(|(_, v)| parse_f64(v)) {
                point.explicit_bounds.push(bound);
            }
        } else if let Some(rest) = line.strip_prefix("Buckets #") {
            if let Some((_, count)) = rest.split_once("Count: ") {
                point.bucket_counts.push(parse_u64(count));
            }
        } else if let Some(rest) = line.strip_prefix("Bucket ") {
            // `Bucket [0, 0], Count: 1` or `Bucket (0.95, 1], Count: 1`
            if let Some((range, count)) = rest.split_once("], Count: ") {
                let range = range.trim_start_matches(['[', '(']);
                let (lower, upper) = range.split_once(", ").unwrap_or((range, range));
                point.exp_bucket_ranges.push((
                    parse_f64(lower).unwrap_or(f64::NAN),
                    parse_f64(upper).unwrap_or(f64::NAN),
                ));
                point.bucket_counts.push(parse_u64(count));
            }
        } else if let Some((key, value)) = field_line(line) {
            match key {
                "StartTimestamp" => point.start_unix_nanos = Some(parse_u64(value)),
                "Timestamp" => point.time_unix_nanos = Some(parse_u64(value)),
                "Count" => point.count = Some(parse_u64(value)),
                "Sum" => point.sum = parse_f64(value),
                "Min" => point.min = parse_f64(value),
                "Max" => point.max = parse_f64(value),
                "Value" => point.value = parse_f64(value),
                _ => {}
            }
        }
    }

    fn arrow(&mut self, depth: usize, key: &str, value: &str) {
        let section = match (self.section, depth) {
            (Section::EventAttributes | Section::Events, 1) => Section::Events,
            (Section::LinkAttributes | Section::Links, 1) => Section::Links,
            (section, _) => section,
        };
        self.section = section;
        match section {
            Section::Events => {
                let Some(event) = self.span.as_mut().and_then(|s| s.events.last_mut()) else {
                    return;
                };
                match key {
                    "Name" => event.name = value.to_string(),
                    "Timestamp" => event.time_unix_nanos = parse_u64(value),
                    "Attributes:" | "Attributes" => self.section = Section::EventAttributes,
                    _ => {}
                }
            }
            Section::Links => {
                let Some(link) = self.span.as_mut().and_then(|s| s.links.last_mut()) else {
                    return;
                };
                match key {
                    "Trace ID" => link.trace_id = value.to_string(),
                    "ID" => link.span_id = value.to_string(),
                    "Attributes:" | "Attributes" => self.section = Section::LinkAttributes,
                    _ => {}
                }
            }
            Section::Descriptor => {
                let Some(metric) = self.metric.as_mut() else {
                    return;
                };
                match key {
                    "Name" => metric.name = value.to_string(),
                    "Description" => metric.description = value.to_string(),
                    "Unit" => metric.unit = value.to_string(),
                    "DataType" => metric.kind = MetricKind::from_data_type(value),
                    "IsMonotonic" => metric.monotonic = Some(value == "true"),
                    "AggregationTemporality" => metric.temporality = value.to_string(),
                    _ => {}
                }
            }
            Section::Exemplar => {
                let Some(e) = self.point.as_mut().and_then(|p| p.exemplars.last_mut()) else {
                    return;
                };
                match key {
                    "Trace ID" => e.trace_id = value.to_string(),
                    "Span ID" => e.span_id = value.to_string(),
                    "Timestamp" => e.time_unix_nanos = parse_u64(value),
                    "Value" => e.value = parse_f64(value).unwrap_or(f64::NAN),
                    _ => {}
                }
            }
            Section::ResourceAttributes
            | Section::SpanAttributes
            | Section::EventAttributes
            | Section::LinkAttributes
            | Section::PointAttributes => {
                if value.starts_with("Str(") && !value.ends_with(')') {
                    let text = value.trim_start_matches("Str(").to_string();
                    self.pending_str = Some((section, key.to_string(), text));
                } else {
                    self.put_attribute(section, key.to_string(), unwrap_value(value));
                }
            }
            Section::None => {}
        }
    }

    fn put_attribute(&mut self, section: Section, key: String, value: String) {
        let map = match section {
            Section::ResourceAttributes => Some(&mut self.resource),
            Section::SpanAttributes => self.span.as_mut().map(|s| &mut s.attributes),
            Section::EventAttributes => self
                .span
                .as_mut()
                .and_then(|s| s.events.last_mut())
                .map(|e| &mut e.attributes),
            Section::LinkAttributes => self
                .span
                .as_mut()
                .and_then(|s| s.links.last_mut())
                .map(|l| &mut l.attributes),
            Section::PointAttributes => self.point.as_mut().map(|p| &mut p.attributes),
            _ => None,
        };
        if let Some(map) = map {
            map.insert(key, value);
        }
    }

    fn finish_span(&mut self) {
        if let Some(span) = self.span.take() {
            self.out.spans.push(span);
        }
    }

    fn finish_point(&mut self) {
        if let (Some(point), Some(metric)) = (self.point.take(), self.metric.as_mut()) {
            metric.points.push(point);
        }
    }

    fn finish_metric(&mut self) {
        self.finish_point();
        if let Some(metric) = self.metric.take() {
            self.out.metrics.push(metric);
        }
    }
}
