//! The lines of the Prometheus text format (0.0.4) and of OpenMetrics 1.0.0, written into a
//! `String` by an [`Exposition`]:
//!
//! ```text
//! header   # HELP name help            (help escaped: \\ and \n; OpenMetrics also ")
//!          # TYPE name kind
//!          # UNIT name unit            (OpenMetrics only)
//! label*   k="v",k2="v2"               (values escaped: \\, \", \n)
//! sample   name{labels,le=".."} value[ timestamp][ # {trace_id="..",span_id=".."} v t]
//! eof      # EOF                       (OpenMetrics)
//! ```
//!
//! Values are the caller's to spell: [`float`] writes an `f64` as Prometheus reads it
//! (shortest round-trip decimal, `NaN`, `+Inf`, `-Inf`), [`Seconds`] integer nanoseconds as
//! exact decimal seconds. A timestamp is Unix nanoseconds, written as seconds with millisecond
//! digits (truncated), Prometheus's resolution. Exemplars are written in OpenMetrics only.

use std::fmt::{Display, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

/// An exemplar on a sample line (OpenMetrics only): the trace one recorded value came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Exemplar {
    /// The trace id, 16 bytes.
    pub trace_id: [u8; 16],
    /// The span id, 8 bytes.
    pub span_id: [u8; 8],
    /// The recorded value.
    pub value: f64,
    /// When it was recorded.
    pub time: SystemTime,
}

/// A writer of exposition lines into a `String`, in the classic text format or in OpenMetrics,
/// with a scratch label set for the samples that follow ([`Exposition::label`]).
#[derive(Debug)]
pub struct Exposition<'a> {
    out: &'a mut String,
    openmetrics: bool,
    /// The rendered label set of the next samples, without braces.
    labels: String,
    lines: usize,
}

impl<'a> Exposition<'a> {
    /// Writes to the end of `out`, in OpenMetrics when `openmetrics`, else the classic format.
    pub fn new(out: &'a mut String, openmetrics: bool) -> Self {
        Exposition {
            out,
            openmetrics,
            labels: String::new(),
            lines: 0,
        }
    }

    /// Whether this writes OpenMetrics.
    pub fn openmetrics(&self) -> bool {
        self.openmetrics
    }

    /// Sample lines written so far.
    pub fn lines(&self) -> usize {
        self.lines
    }

    /// The text written so far (a streaming caller writes it out and clears it).
    pub fn text(&mut self) -> &mut String {
        self.out
    }

    /// `# HELP`, `# TYPE` and, in OpenMetrics with a `unit`, `# UNIT` of the family `name`.
    pub fn header(&mut self, name: &str, help: &str, kind: &str, unit: Option<&str>) {
        let _ = write!(self.out, "# HELP {name} ");
        for c in help.chars() {
            match c {
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '"' if self.openmetrics => self.out.push_str("\\\""),
                c => self.out.push(c),
            }
        }
        let _ = writeln!(self.out, "\n# TYPE {name} {kind}");
        if let (true, Some(unit)) = (self.openmetrics, unit) {
            let _ = writeln!(self.out, "# UNIT {name} {unit}");
        }
    }

    /// Empties the label set.
    pub fn clear_labels(&mut self) {
        self.labels.clear();
    }

    /// Adds `key="value"` to the label set, the value escaped; `key` must be a valid label
    /// name already.
    pub fn label(&mut self, key: &str, value: &str) {
        if !self.labels.is_empty() {
            self.labels.push(',');
        }
        self.labels.push_str(key);
        self.labels.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => self.labels.push_str("\\\\"),
                '"' => self.labels.push_str("\\\""),
                '\n' => self.labels.push_str("\\n"),
                c => self.labels.push(c),
            }
        }
        self.labels.push('"');
    }

    /// One sample line of `name` with the label set (and `le`, when given, last): its value,
    /// then its timestamp (Unix nanoseconds) when given, then its exemplar in OpenMetrics.
    pub fn sample(
        &mut self,
        name: &str,
        le: Option<&str>,
        value: impl Display,
        timestamp_ns: Option<u64>,
        exemplar: Option<&Exemplar>,
    ) {
        self.out.push_str(name);
        if !self.labels.is_empty() || le.is_some() {
            self.out.push('{');
            self.out.push_str(&self.labels);
            if let Some(le) = le {
                if !self.labels.is_empty() {
                    self.out.push(',');
                }
                self.out.push_str("le=\"");
                self.out.push_str(le);
                self.out.push('"');
            }
            self.out.push('}');
        }
        let _ = write!(self.out, " {value}");
        if let Some(ns) = timestamp_ns {
            let ms = ns / 1_000_000;
            let _ = write!(self.out, " {}.{:03}", ms / 1000, ms % 1000);
        }
        if let (true, Some(e)) = (self.openmetrics, exemplar) {
            write_exemplar(self.out, e);
        }
        self.out.push('\n');
        self.lines += 1;
    }

    /// `# EOF`, the end of an OpenMetrics exposition (nothing in the classic format).
    pub fn eof(&mut self) {
        if self.openmetrics {
            self.out.push_str("# EOF\n");
        }
    }
}

/// ` # {trace_id="..",span_id=".."} value timestamp`, as OpenMetrics writes an exemplar.
fn write_exemplar(out: &mut String, e: &Exemplar) {
    out.push_str(" # {trace_id=\"");
    for b in e.trace_id {
        let _ = write!(out, "{b:02x}");
    }
    out.push_str("\",span_id=\"");
    for b in e.span_id {
        let _ = write!(out, "{b:02x}");
    }
    let t = e
        .time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let _ = write!(out, "\"}} {} {t:.3}", float(e.value));
}

/// A sample value: floats in Rust's shortest round-trip decimal, non-finite values as
/// Prometheus spells them.
pub fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        format!("{v}")
    }
}

/// Integer nanoseconds printed as exact decimal seconds (`1.5`, `0.000012`, `3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seconds(pub u64);

impl Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let whole = self.0 / 1_000_000_000;
        let frac = self.0 % 1_000_000_000;
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let digits = format!("{frac:09}");
        write!(f, "{whole}.{}", digits.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_print_exactly() {
        assert_eq!(Seconds(1_500_000_000).to_string(), "1.5");
        assert_eq!(Seconds(12_000).to_string(), "0.000012");
        assert_eq!(Seconds(3_000_000_000).to_string(), "3");
        assert_eq!(Seconds(0).to_string(), "0");
        assert_eq!(float(f64::INFINITY), "+Inf");
        assert_eq!(float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(float(f64::NAN), "NaN");
        assert_eq!(float(0.000001), "0.000001");
        assert_eq!(float(10.0), "10");
    }

    #[test]
    fn lines_escape_and_place_le_timestamps_and_exemplars() {
        let e = Exemplar {
            trace_id: [0xab; 16],
            span_id: [0x01; 8],
            value: 0.5,
            time: UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123),
        };
        for om in [false, true] {
            let mut out = String::new();
            let mut x = Exposition::new(&mut out, om);
            x.header("a_seconds", "h \"q\" \\ \n", "histogram", Some("seconds"));
            x.sample("a_seconds_count", None, 1, None, None);
            x.label("k", "v\"\\\n");
            x.label("j", "w");
            x.sample("a_seconds_bucket", Some("+Inf"), 2, None, Some(&e));
            x.sample(
                "a_seconds_sum",
                None,
                Seconds(1_500),
                Some(1_790_769_601_123_456_789),
                None,
            );
            x.sample("t", None, 0, Some(5_000_000), None);
            x.eof();
            assert_eq!(x.lines(), 4);
            let want = if om {
                "# HELP a_seconds h \\\"q\\\" \\\\ \\n\n# TYPE a_seconds histogram\n# UNIT a_seconds seconds\n\
                 a_seconds_count 1\n\
                 a_seconds_bucket{k=\"v\\\"\\\\\\n\",j=\"w\",le=\"+Inf\"} 2 # {trace_id=\"abababababababababababababababab\",span_id=\"0101010101010101\"} 0.5 1700000000.123\n\
                 a_seconds_sum{k=\"v\\\"\\\\\\n\",j=\"w\"} 0.0000015 1790769601.123\nt{k=\"v\\\"\\\\\\n\",j=\"w\"} 0 0.005\n# EOF\n"
            } else {
                "# HELP a_seconds h \"q\" \\\\ \\n\n# TYPE a_seconds histogram\n\
                 a_seconds_count 1\n\
                 a_seconds_bucket{k=\"v\\\"\\\\\\n\",j=\"w\",le=\"+Inf\"} 2\n\
                 a_seconds_sum{k=\"v\\\"\\\\\\n\",j=\"w\"} 0.0000015 1790769601.123\nt{k=\"v\\\"\\\\\\n\",j=\"w\"} 0 0.005\n"
            };
            assert_eq!(out, want, "openmetrics: {om}");
        }
    }
}
