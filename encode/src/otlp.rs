//! OTLP metric messages (opentelemetry-proto's), built from plain values: what the importer
//! writes for the series it rebuilds from a log, and the exemplars the exporters add to the
//! SDK's own conversion (`ExportMetricsServiceRequest::from`).
//!
//! ```text
//! attributes   string / int / attribute ──> KeyValue
//! resource     resource(attributes), scope(name, version)
//! metric       histogram / monotonic_sum (cumulative, no points yet) ◄── histogram_point /
//!              number_point (start, time, value) pushed by the caller
//! exemplar     exemplar(trace id, span id, time, value)
//! ```

use std::time::SystemTime;

use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Exemplar, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum,
    exemplar, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// An attribute of any value.
pub fn attribute(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// A string attribute.
pub fn string(key: &str, value: impl Into<String>) -> KeyValue {
    attribute(key, any_value::Value::StringValue(value.into()))
}

/// An integer attribute.
pub fn int(key: &str, value: i64) -> KeyValue {
    attribute(key, any_value::Value::IntValue(value))
}

/// A resource of `attributes`.
pub fn resource(attributes: Vec<KeyValue>) -> Resource {
    Resource {
        attributes,
        ..Default::default()
    }
}

/// An instrumentation scope.
pub fn scope(name: &str, version: &str) -> InstrumentationScope {
    InstrumentationScope {
        name: name.to_owned(),
        version: version.to_owned(),
        ..Default::default()
    }
}

fn metric(name: &str, description: &str, unit: &str, data: metric::Data) -> Metric {
    Metric {
        name: name.to_owned(),
        description: description.to_owned(),
        unit: unit.to_owned(),
        data: Some(data),
        ..Default::default()
    }
}

/// A cumulative histogram metric without points yet.
pub fn histogram(name: &str, description: &str, unit: &str) -> Metric {
    let data = metric::Data::Histogram(Histogram {
        data_points: Vec::new(),
        aggregation_temporality: AggregationTemporality::Cumulative as i32,
    });
    metric(name, description, unit, data)
}

/// A cumulative monotonic sum (a counter) without points yet.
pub fn monotonic_sum(name: &str, description: &str, unit: &str) -> Metric {
    let data = metric::Data::Sum(Sum {
        data_points: Vec::new(),
        aggregation_temporality: AggregationTemporality::Cumulative as i32,
        is_monotonic: true,
    });
    metric(name, description, unit, data)
}

/// A histogram point of a count and a sum (no buckets), from `start_ns` to `time_ns` (Unix
/// nanoseconds).
pub fn histogram_point(
    attributes: Vec<KeyValue>,
    start_ns: u64,
    time_ns: u64,
    count: u64,
    sum: f64,
) -> HistogramDataPoint {
    HistogramDataPoint {
        attributes,
        start_time_unix_nano: start_ns,
        time_unix_nano: time_ns,
        count,
        sum: Some(sum),
        ..Default::default()
    }
}

/// A point of a sum or a gauge, from `start_ns` to `time_ns` (Unix nanoseconds).
pub fn number_point(
    attributes: Vec<KeyValue>,
    start_ns: u64,
    time_ns: u64,
    value: number_data_point::Value,
) -> NumberDataPoint {
    NumberDataPoint {
        attributes,
        start_time_unix_nano: start_ns,
        time_unix_nano: time_ns,
        value: Some(value),
        ..Default::default()
    }
}

/// An exemplar: the span (`trace_id`, `span_id`, big-endian bytes) that recorded `value` at
/// `time`, without filtered attributes.
pub fn exemplar(trace_id: &[u8], span_id: &[u8], time: SystemTime, value: f64) -> Exemplar {
    Exemplar {
        filtered_attributes: Vec::new(),
        time_unix_nano: unix_nanos(time),
        span_id: span_id.to_vec(),
        trace_id: trace_id.to_vec(),
        value: Some(exemplar::Value::AsDouble(value)),
    }
}

/// `time` as Unix nanoseconds: 0 before the epoch, saturating past `u64`.
pub fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn builders_fill_what_they_name_and_leave_the_rest_default() {
        let m = monotonic_sum("a.b", "d", "s");
        assert!(matches!(
            m.data,
            Some(metric::Data::Sum(Sum {
                is_monotonic: true,
                aggregation_temporality: 2,
                ..
            }))
        ));
        let h = histogram("a.c", "d", "s");
        assert!(matches!(
            h.data,
            Some(metric::Data::Histogram(Histogram {
                aggregation_temporality: 2,
                ..
            }))
        ));
        let p = histogram_point(vec![int("k", 3)], 1, 2, 4, 0.5);
        assert_eq!(
            (p.start_time_unix_nano, p.time_unix_nano, p.count, p.sum),
            (1, 2, 4, Some(0.5))
        );
        assert!(p.bucket_counts.is_empty() && p.explicit_bounds.is_empty());
        let e = exemplar(
            &[1; 16],
            &[2; 8],
            SystemTime::UNIX_EPOCH + Duration::from_nanos(7),
            0.25,
        );
        assert_eq!((e.time_unix_nano, e.span_id.len()), (7, 8));
        assert_eq!(
            unix_nanos(SystemTime::UNIX_EPOCH - Duration::from_secs(1)),
            0
        );
    }
}
