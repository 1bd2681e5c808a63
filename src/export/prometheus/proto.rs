//! The messages of the Prometheus protobuf exposition format, derived with prost from the
//! Prometheus data model's `io/prometheus/client/metrics.proto` (package
//! `io.prometheus.client`, as in `prometheus/client_model` and `prometheus/prometheus`'s
//! `prompb/io/prometheus/client/metrics.proto`): the same messages, fields and field numbers.
//! Only what `/metrics` writes is here (no `Summary`, `Quantile` or `Untyped`); the
//! `google.protobuf.Timestamp` they reference is [`Timestamp`], its two fields.
//!
//! A scrape in this format is a sequence of `MetricFamily` messages, each prefixed with its
//! length as a varint (`encoding=delimited`).

/// `io.prometheus.client.LabelPair`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LabelPair {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) value: String,
}

/// `io.prometheus.client.MetricType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum MetricType {
    Counter = 0,
    Gauge = 1,
    Summary = 2,
    Untyped = 3,
    Histogram = 4,
    GaugeHistogram = 5,
}

/// `google.protobuf.Timestamp`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Timestamp {
    #[prost(int64, tag = "1")]
    pub(crate) seconds: i64,
    #[prost(int32, tag = "2")]
    pub(crate) nanos: i32,
}

/// `io.prometheus.client.Gauge`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Gauge {
    #[prost(double, tag = "1")]
    pub(crate) value: f64,
}

/// `io.prometheus.client.Counter`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Counter {
    #[prost(double, tag = "1")]
    pub(crate) value: f64,
    #[prost(message, optional, tag = "2")]
    pub(crate) exemplar: Option<Exemplar>,
    #[prost(message, optional, tag = "3")]
    pub(crate) start_timestamp: Option<Timestamp>,
}

/// `io.prometheus.client.Histogram`: classic buckets (`bucket`), a native histogram (schema,
/// zero bucket, spans and deltas), or both.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Histogram {
    #[prost(uint64, tag = "1")]
    pub(crate) sample_count: u64,
    #[prost(double, tag = "4")]
    pub(crate) sample_count_float: f64,
    #[prost(double, tag = "2")]
    pub(crate) sample_sum: f64,
    #[prost(message, repeated, tag = "3")]
    pub(crate) bucket: Vec<Bucket>,
    #[prost(message, optional, tag = "15")]
    pub(crate) start_timestamp: Option<Timestamp>,
    #[prost(sint32, tag = "5")]
    pub(crate) schema: i32,
    #[prost(double, tag = "6")]
    pub(crate) zero_threshold: f64,
    #[prost(uint64, tag = "7")]
    pub(crate) zero_count: u64,
    #[prost(double, tag = "8")]
    pub(crate) zero_count_float: f64,
    #[prost(message, repeated, tag = "9")]
    pub(crate) negative_span: Vec<BucketSpan>,
    #[prost(sint64, repeated, tag = "10")]
    pub(crate) negative_delta: Vec<i64>,
    #[prost(double, repeated, tag = "11")]
    pub(crate) negative_count: Vec<f64>,
    #[prost(message, repeated, tag = "12")]
    pub(crate) positive_span: Vec<BucketSpan>,
    #[prost(sint64, repeated, tag = "13")]
    pub(crate) positive_delta: Vec<i64>,
    #[prost(double, repeated, tag = "14")]
    pub(crate) positive_count: Vec<f64>,
    #[prost(message, repeated, tag = "16")]
    pub(crate) exemplars: Vec<Exemplar>,
}

/// `io.prometheus.client.Bucket`: one classic bucket, cumulative.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Bucket {
    #[prost(uint64, tag = "1")]
    pub(crate) cumulative_count: u64,
    #[prost(double, tag = "4")]
    pub(crate) cumulative_count_float: f64,
    #[prost(double, tag = "2")]
    pub(crate) upper_bound: f64,
    #[prost(message, optional, tag = "3")]
    pub(crate) exemplar: Option<Exemplar>,
}

/// `io.prometheus.client.BucketSpan`: `length` consecutive native buckets, `offset` after the
/// previous span (or the index of the first, for the first span).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct BucketSpan {
    #[prost(sint32, tag = "1")]
    pub(crate) offset: i32,
    #[prost(uint32, tag = "2")]
    pub(crate) length: u32,
}

/// `io.prometheus.client.Exemplar`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Exemplar {
    #[prost(message, repeated, tag = "1")]
    pub(crate) label: Vec<LabelPair>,
    #[prost(double, tag = "2")]
    pub(crate) value: f64,
    #[prost(message, optional, tag = "3")]
    pub(crate) timestamp: Option<Timestamp>,
}

/// `io.prometheus.client.Metric`: one series (labels and one of the typed values).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Metric {
    #[prost(message, repeated, tag = "1")]
    pub(crate) label: Vec<LabelPair>,
    #[prost(message, optional, tag = "2")]
    pub(crate) gauge: Option<Gauge>,
    #[prost(message, optional, tag = "3")]
    pub(crate) counter: Option<Counter>,
    #[prost(message, optional, tag = "7")]
    pub(crate) histogram: Option<Histogram>,
    #[prost(int64, tag = "6")]
    pub(crate) timestamp_ms: i64,
}

/// `io.prometheus.client.MetricFamily`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct MetricFamily {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) help: String,
    #[prost(enumeration = "MetricType", tag = "3")]
    pub(crate) r#type: i32,
    #[prost(message, repeated, tag = "4")]
    pub(crate) metric: Vec<Metric>,
    #[prost(string, tag = "5")]
    pub(crate) unit: String,
}
