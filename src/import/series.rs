//! Records → cumulative series, the shape both writers emit.
//!
//! ```text
//! ImportedFile.records ─► per (file, run) resource, per family and label set:
//!   time-ordered points of cumulative (sum_ns, count) or counter value
//! ```
//!
//! Every record adds to the running totals of its series and appends a point at its time, so a
//! series is what a scrape of a live counter would have read at that instant: monotonic,
//! starting from zero at the run's start, ready for `rate()`. Points closer together than the
//! sample interval collapse into the later one (cumulative values lose nothing by it); the
//! writers use one millisecond, Prometheus's resolution, so that no series has two samples at
//! one timestamp.

use std::collections::HashMap;

use super::contract::{Family, Key};
use super::{ImportRecord, ImportedFile};

/// One imported resource: a run of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resource {
    /// `source.file`.
    pub(crate) source_file: String,
    /// `source.run`.
    pub(crate) run: u32,
    /// Start of the run: the earliest record time minus what that record measured.
    pub(crate) start_ns: u64,
}

/// One cumulative sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Point {
    /// Unix nanoseconds.
    pub(crate) at_ns: u64,
    /// Cumulative sum in nanoseconds (duration families; 0 for counters).
    pub(crate) sum_ns: u64,
    /// Cumulative count (observations of a duration family, or the counter's value).
    pub(crate) count: u64,
}

/// One series: a family, a resource and a label set, with its points in time order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Series {
    /// The metric family.
    pub(crate) family: Family,
    /// Index into [`SeriesSet::resources`].
    pub(crate) resource: usize,
    /// Labels besides the resource's.
    pub(crate) labels: Vec<(Key, String)>,
    /// Cumulative points, time-ordered, at most one per sample interval.
    pub(crate) points: Vec<Point>,
}

/// All series of a set of imported files, sorted by family, then resource, then labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SeriesSet {
    /// Resources in input order.
    pub(crate) resources: Vec<Resource>,
    /// The series.
    pub(crate) series: Vec<Series>,
    /// Records left out because they had no time.
    pub(crate) untimed_records: u64,
}

type SeriesKey = (Family, usize, Vec<(Key, String)>);

struct Builder {
    interval: u64,
    rank: Option<String>,
    index: HashMap<SeriesKey, usize>,
    set: SeriesSet,
}

impl Builder {
    fn add(
        &mut self,
        family: Family,
        resource: usize,
        mut labels: Vec<(Key, String)>,
        at: u64,
        sum_ns: u64,
        count: u64,
    ) {
        if let Some(rank) = &self.rank {
            labels.push((Key::Rank, rank.clone()));
        }
        let key = (family, resource, labels);
        let next = self.set.series.len();
        let idx = *self.index.entry(key.clone()).or_insert(next);
        if idx == next {
            self.set.series.push(Series {
                family,
                resource,
                labels: key.2,
                points: Vec::new(),
            });
        }
        let series = &mut self.set.series[idx];
        let (prev_sum, prev_count) = series.points.last().map_or((0, 0), |p| (p.sum_ns, p.count));
        let point = Point {
            at_ns: at,
            sum_ns: prev_sum.saturating_add(sum_ns),
            count: prev_count.saturating_add(count),
        };
        match series.points.last_mut() {
            Some(last) if last.at_ns / self.interval == at / self.interval => *last = point,
            _ => series.points.push(point),
        }
    }
}

/// Builds the cumulative series of `files`. `sample_interval_ns` (at least 1) bounds how close
/// two points of one series may be; `rank` adds a `rank` label to every series, as the live
/// exporter has.
pub(crate) fn build(
    files: &[ImportedFile],
    sample_interval_ns: u64,
    rank: Option<u32>,
) -> SeriesSet {
    let mut b = Builder {
        interval: sample_interval_ns.max(1),
        rank: rank.map(|r| r.to_string()),
        index: HashMap::new(),
        set: SeriesSet::default(),
    };
    let mut resource_of: HashMap<(usize, u32), usize> = HashMap::new();
    for (file_idx, file) in files.iter().enumerate() {
        for record in &file.records {
            let Some(at) = record.at() else {
                b.set.untimed_records += 1;
                continue;
            };
            let run = record.run();
            let next = b.set.resources.len();
            let res = *resource_of.entry((file_idx, run)).or_insert(next);
            if res == next {
                b.set.resources.push(Resource {
                    source_file: file.source_file.clone(),
                    run,
                    start_ns: u64::MAX,
                });
            }
            let covered = match record {
                ImportRecord::DecodeSteps {
                    decode_ns,
                    steps,
                    steps_in_interval,
                    ..
                } => {
                    // Only a run's first table covers the time since the process started.
                    if steps == steps_in_interval {
                        *decode_ns
                    } else {
                        0
                    }
                }
                ImportRecord::RouteTrace { bar_ns, .. } => *bar_ns,
                ImportRecord::SpecBurst { phases, .. } => phases.total_ns(),
                ImportRecord::SectionInterval { .. } | ImportRecord::VerifySplit { .. } => 0,
            };
            let start = &mut b.set.resources[res].start_ns;
            *start = (*start).min(at.saturating_sub(covered));
            add_record(&mut b, res, record, at);
        }
    }
    b.set
        .series
        .sort_by(|x, y| (x.family, x.resource, &x.labels).cmp(&(y.family, y.resource, &y.labels)));
    b.set
}

fn add_record(b: &mut Builder, res: usize, record: &ImportRecord, at: u64) {
    match record {
        ImportRecord::DecodeSteps {
            steps_in_interval, ..
        } => {
            b.add(Family::Steps, res, Vec::new(), at, 0, *steps_in_interval);
        }
        ImportRecord::SectionInterval {
            bucket,
            total_ns,
            calls,
            ..
        } => {
            let labels = vec![(Key::Bucket, bucket.clone())];
            b.add(Family::SectionDuration, res, labels, at, *total_ns, *calls);
        }
        ImportRecord::RouteTrace {
            site,
            layer,
            bar_ns,
            ..
        } => {
            let labels = vec![(Key::Site, site.clone()), (Key::Layer, layer.to_string())];
            b.add(Family::CollectiveWait, res, labels, at, *bar_ns, 1);
        }
        ImportRecord::SpecBurst {
            tag,
            rounds,
            phases,
            ..
        } => {
            for (phase, ns) in phases.by_phase() {
                let labels = vec![
                    (Key::Tag, tag.clone()),
                    (Key::Phase, phase.as_str().to_owned()),
                ];
                b.add(Family::SpecPhaseDuration, res, labels, at, ns, *rounds);
            }
            b.add(
                Family::SpecRounds,
                res,
                vec![(Key::Tag, tag.clone())],
                at,
                0,
                *rounds,
            );
        }
        ImportRecord::VerifySplit {
            tag, rounds, parts, ..
        } => {
            for (part, ns) in parts.by_part() {
                let labels = vec![(Key::Tag, tag.clone()), (Key::Part, part.to_owned())];
                b.add(Family::SpecVerifyPartDuration, res, labels, at, ns, *rounds);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(records: Vec<ImportRecord>) -> ImportedFile {
        ImportedFile {
            source_file: "f.log".into(),
            records,
            summary: Default::default(),
        }
    }

    fn interval(at: u64, bucket: &str, total_ns: u64, calls: u64) -> ImportRecord {
        ImportRecord::SectionInterval {
            run: 0,
            at: Some(at),
            steps_in_interval: 8,
            bucket: bucket.into(),
            total_ns,
            calls,
        }
    }

    #[test]
    fn deltas_accumulate_into_monotonic_series_and_close_points_collapse() {
        let set = build(
            &[file(vec![
                interval(1_000_000_000, "mhc", 10, 1),
                interval(1_000_000_500, "mhc", 5, 1),
                interval(2_000_000_000, "mhc", 7, 2),
                interval(2_000_000_000, "norm", 3, 3),
            ])],
            1_000_000,
            None,
        );
        assert_eq!(set.series.len(), 2);
        let mhc = &set.series[0];
        assert_eq!(mhc.labels, vec![(Key::Bucket, "mhc".to_owned())]);
        assert_eq!(
            mhc.points,
            vec![
                Point {
                    at_ns: 1_000_000_500,
                    sum_ns: 15,
                    count: 2
                },
                Point {
                    at_ns: 2_000_000_000,
                    sum_ns: 22,
                    count: 4
                },
            ]
        );
        assert_eq!(set.resources[0].start_ns, 1_000_000_000);
    }

    #[test]
    fn untimed_records_are_counted_not_emitted() {
        let mut r = interval(0, "mhc", 1, 1);
        if let ImportRecord::SectionInterval { at, .. } = &mut r {
            *at = None;
        }
        let set = build(&[file(vec![r])], 1, None);
        assert!(set.series.is_empty());
        assert_eq!(set.untimed_records, 1);
    }
}
