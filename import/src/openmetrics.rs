//! OpenMetrics text with timestamps, for `promtool tsdb create-blocks-from openmetrics`.
//!
//! ```text
//! ImportedFile[] ─► series::build (cumulative, ≤ 1 point per ms per series)
//!   ─► per family: # HELP / # TYPE / # UNIT, then each series' samples in time order:
//!      0 at the run's start, then the running totals ─► # EOF
//! ```
//!
//! The names are the Prometheus names of the live exporter (derived by its encoder's rule from
//! [`phasetrace_names`]), so backfilled and live data share series, dashboards and rules. Labels:
//! the live ones (`bucket`, `site` of a probe bucket, `rank`, `group` on section times; `site`,
//! `rank`, `group` on waits; `layer` on the per-layer counters only; `tag` and `phase` or `part`
//! on speculative ones), plus `source_file` and `source_run`.
//!
//! A table knows each bucket's total time and call count, not how the calls were distributed,
//! so the duration families are written as OpenMetrics summaries without quantiles: `_sum`
//! (seconds) and `_count` series only, the same two series the live histogram exports, so that
//! `rate(x_sum) / rate(x_count)` means the same thing in both. No `_bucket` series is invented.
//! The per-layer counters (`phasetrace_section_layer_time_seconds_total`, `..._calls_total`,
//! `phasetrace_collective_layer_wait_time_seconds_total`, `..._calls_total`) are counters as
//! live.
//!
//! Every series starts with a sample of 0 at its run's start, one millisecond or more before
//! its first total (the OTLP writer says the same with the points' start time): a counter is 0
//! when its process starts, and `rate()`/`increase()` over a run then count its first interval
//! too, which Prometheus would otherwise take as the series' starting value (and a series of
//! one sample would have no rate at all).
//! Values are exact decimals of the integer nanoseconds; timestamps are seconds with
//! millisecond digits, Prometheus's resolution.
//!
//! The lines are written by `phasetrace_encode::text`, the writer of the live `/metrics`
//! endpoint: the same headers, label escaping and sample lines, here with timestamps.

use std::io::Write;

use phasetrace_encode::text::{Exposition, Seconds};

use super::contract::{Family, Key, Shape};
use super::series::{self, Point, Series, SeriesSet};
use super::{ImportError, ImportedFile};

/// Options of the OpenMetrics writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenMetricsOptions {
    /// Minimum spacing of two samples of one series, nanoseconds; rounded up to whole
    /// milliseconds, since Prometheus stores milliseconds. Default 1 ms: every record.
    pub sample_interval_ns: u64,
    /// The `rank` label of every series (`--rank`); default that of a live process without
    /// `PHASETRACE_RANK`, 0.
    pub rank: u32,
    /// The `group` label of every series (`--group`); default that of a live process without
    /// `PHASETRACE_GROUP`.
    pub group: String,
}

impl Default for OpenMetricsOptions {
    fn default() -> Self {
        Self {
            sample_interval_ns: 1_000_000,
            rank: crate::live_default(phasetrace_names::env::RANK),
            group: crate::live_default(phasetrace_names::env::GROUP),
        }
    }
}

/// What the writer wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenMetricsStats {
    /// Series written.
    pub series: usize,
    /// Sample lines written.
    pub samples: usize,
    /// Records left out because they had no time.
    pub untimed_records: u64,
}

/// Writes `files` as one OpenMetrics exposition ending in `# EOF`.
pub fn write_openmetrics<W: Write>(
    out: &mut W,
    files: &[ImportedFile],
    options: &OpenMetricsOptions,
) -> Result<OpenMetricsStats, ImportError> {
    let interval = options.sample_interval_ns.max(1).div_ceil(1_000_000) * 1_000_000;
    let set = series::build(files, interval, options.rank, &options.group);
    write_set(out, &set).map_err(|source| ImportError::Write {
        format: "openmetrics",
        source,
    })
}

fn write_set<W: Write>(out: &mut W, set: &SeriesSet) -> std::io::Result<OpenMetricsStats> {
    let mut stats = OpenMetricsStats {
        untimed_records: set.untimed_records,
        ..Default::default()
    };
    // Each series' lines are made in `text`, then written out.
    let mut text = String::new();
    let mut x = Exposition::new(&mut text, true);
    for family in Family::ALL {
        let mut members = set.series.iter().filter(|s| s.family == family).peekable();
        if members.peek().is_none() {
            continue;
        }
        let name = family.prom_family();
        let name = name.as_str();
        let kind = if family.is_counter() {
            "counter"
        } else {
            "summary"
        };
        x.header(name, family.description(), kind, family.prom_unit());
        let [total, sum_name, count_name] =
            ["_total", "_sum", "_count"].map(|s| name.to_owned() + s);
        for series in members {
            stats.series += 1;
            set_labels(&mut x, set, series);
            let start = Point {
                at_ns: set.resources[series.resource].start_ns,
                sum_ns: 0,
                count: 0,
            };
            let first_ms = series.points.first().map(|p| p.at_ns / 1_000_000);
            let zero = first_ms.is_some_and(|first| start.at_ns / 1_000_000 < first);
            for point in zero.then_some(&start).into_iter().chain(&series.points) {
                let ts = Some(point.at_ns);
                match family.shape() {
                    Shape::CountCounter => {
                        x.sample(&total, None, point.count, ts, None);
                    }
                    Shape::SecondsCounter => {
                        let sum = Seconds(point.sum_ns);
                        x.sample(&total, None, sum, ts, None);
                    }
                    Shape::SumCount => {
                        let sum = Seconds(point.sum_ns);
                        x.sample(&sum_name, None, sum, ts, None);
                        x.sample(&count_name, None, point.count, ts, None);
                    }
                }
            }
            out.write_all(x.text().as_bytes())?;
            x.text().clear();
        }
    }
    x.eof();
    stats.samples = x.lines();
    out.write_all(x.text().as_bytes())?;
    out.flush()?;
    Ok(stats)
}

/// The series' labels, then its resource's, as the label set of its samples.
fn set_labels(x: &mut Exposition<'_>, set: &SeriesSet, series: &Series) {
    x.clear_labels();
    let resource = &set.resources[series.resource];
    let run = resource.run.to_string();
    let resource_labels = [
        (Key::SourceFile, resource.source_file.as_str()),
        (Key::SourceRun, run.as_str()),
    ];
    let own = series.labels.iter().map(|(k, v)| (*k, v.as_str()));
    for (key, value) in own.chain(resource_labels) {
        x.label(&key.prom(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ImportOptions, import_reader};

    #[test]
    fn output_groups_families_orders_samples_and_ends_with_eof() {
        let log = "\
2026-09-30T12:00:01.000000Z  WARN p: GLMTRACE step=0 site=attn L=0 moe=0 bar_us=10.0 ids=
2026-09-30T12:00:01.500000Z  WARN p: GLMTRACE step=0 site=mlp L=0 moe=1 bar_us=2.5 ids=1,2
2026-09-30T12:00:02.000000Z  WARN p: GLMTRACE step=1 site=attn L=0 moe=0 bar_us=30.0 ids=
[t] rounds=2 k=3 total=4.00ms | draft=1.00 verify=2.00 accept=0.50 roll=0.25 maint=0.25 | per-round ms: draft=0.500 verify=1.000 accept=0.250 roll=0.125 maint=0.125 total=2.000
";
        let file = import_reader(
            log.as_bytes(),
            ImportOptions {
                source_file: "a \"q\".log".into(),
                ..Default::default()
            },
        )
        .expect("import");
        let mut out = Vec::new();
        let stats =
            write_openmetrics(&mut out, &[file], &OpenMetricsOptions::default()).expect("write");
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.ends_with("# EOF\n"), "{text}");
        let res = "rank=\"0\",group=\"default\",source_file=\"a \\\"q\\\".log\",source_run=\"0\"";
        for line in [
            // The wait histogram: no layer; from 0 at the run's start (the first probe's start,
            // 12:00:00.99999) to the running total.
            format!(
                "phasetrace_collective_wait_seconds_sum{{site=\"attn\",{res}}} 0 1790769600.999"
            ),
            format!(
                "phasetrace_collective_wait_seconds_sum{{site=\"attn\",{res}}} 0.00001 1790769601.000"
            ),
            format!(
                "phasetrace_collective_wait_seconds_sum{{site=\"attn\",{res}}} 0.00004 1790769602.000"
            ),
            format!(
                "phasetrace_collective_wait_seconds_count{{site=\"attn\",{res}}} 2 1790769602.000"
            ),
            // The per-layer counters.
            format!(
                "phasetrace_collective_layer_wait_time_seconds_total{{site=\"attn\",layer=\"0\",{res}}} 0 1790769600.999"
            ),
            format!(
                "phasetrace_collective_layer_wait_time_seconds_total{{site=\"attn\",layer=\"0\",{res}}} 0.00004 1790769602.000"
            ),
            format!(
                "phasetrace_collective_layer_wait_calls_total{{site=\"attn\",layer=\"0\",{res}}} 2 1790769602.000"
            ),
            format!(
                "phasetrace_section_layer_time_seconds_total{{bucket=\"reduce_mlp_bar\",site=\"mlp\",layer=\"0\",{res}}} 0.0000025 1790769601.500"
            ),
            format!(
                "phasetrace_section_layer_calls_total{{bucket=\"reduce_mlp_bar\",site=\"mlp\",layer=\"0\",{res}}} 1 1790769601.500"
            ),
            format!("phasetrace_spec_rounds_total{{tag=\"t\",{res}}} 2 1790769602.004"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("phasetrace_collective_wait") && l.contains("layer=")),
            "{text}"
        );
        for header in [
            "# TYPE phasetrace_spec_rounds counter\n",
            "# UNIT phasetrace_spec_phase_duration_seconds seconds\n",
            "# TYPE phasetrace_section_layer_time_seconds counter\n# UNIT phasetrace_section_layer_time_seconds seconds\n",
            "# TYPE phasetrace_collective_layer_wait_calls counter\nphasetrace_collective_layer_wait_calls_total{",
        ] {
            assert!(text.contains(header), "{header} in {text}");
        }
        // Each family's lines are contiguous: a family's TYPE line appears once.
        assert_eq!(text.matches("# TYPE ").count(), 7);
        // Per-layer section and wait counters, 2 each (attn and mlp of layer 0), the wait
        // histogram (attn, mlp), 5 phases, 1 round counter.
        assert_eq!(stats.series, 2 * 4 + 2 + 5 + 1);
        assert_eq!(stats.untimed_records, 0);
    }
}
