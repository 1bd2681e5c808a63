//! Records → cumulative series, the shape both writers emit.
//!
//! ```text
//! ImportedFile.records ─► per (file, run) resource, per family and label set:
//!   time-ordered points of cumulative (sum_ns, count)
//!
//! table row (bucket)            ─► section.duration {bucket[, site of a probe bucket]}
//! route trace (site, layer, ns) ─► collective.wait {site}
//!                                  collective.layer.wait.{time,calls} {site, layer}
//!                                  section.layer.{time,calls} {bucket = probe of site, layer, site}
//! every series                  ─► + rank, group (as every live series)
//! ```
//!
//! Every record adds to the running totals of its series and appends a point at its time, so a
//! series is what a scrape of a live counter would have read at that instant: monotonic, from
//! zero at the run's start ([`Resource::start_ns`]), ready for `rate()`. Points closer together
//! than the sample interval collapse into the later one (cumulative values lose nothing by it);
//! the writers use one millisecond, Prometheus's resolution, so that no series has two samples
//! at one timestamp.
//!
//! Series of event lines (a route-trace line is one probe; a speculative line one burst) also
//! get a point at the run's end (its last record) holding their total, as a scrape at that
//! instant would read: no line since means no event since. Then every such series of a run
//! ends at one time, and `rate()` over the run, queried at its end, gives the imported totals
//! exactly. Series of tables (section durations, steps) do not: a table is a snapshot, and a
//! bucket missing from a cut last table has no known total at the run's end.
//!
//! A route-trace line is one rendezvous probe of one layer, which the live library records as a
//! probe section: the per-layer counters of its probe bucket and of the wait, and the wait
//! histogram. It is not added to `section.duration`: the tables' row of the same probe bucket
//! already holds that time (the reference profiler prints the line from the probe it times), so
//! adding it would count it twice.

use std::collections::HashMap;

use super::contract::{Family, Key, probe_bucket, probe_site};
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
    /// End of the run: its latest record time.
    pub(crate) end_ns: u64,
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
    /// `rank` and `group`, on every series.
    common: [(Key, String); 2],
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
        labels.extend(self.common.iter().cloned());
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
/// two points of one series may be; `rank` and `group` label every series, as the live exporter
/// does.
/// The runs of `files` as resources, in input order, each spanning its records' times, and how
/// many records had no time. All that the spans need of the logs' runs; [`build`] starts here.
pub(crate) fn resources(files: &[ImportedFile]) -> (Vec<Resource>, u64) {
    let mut runs = Runs::default();
    for (file_idx, file) in files.iter().enumerate() {
        for record in &file.records {
            runs.place(file_idx, file, record);
        }
    }
    (runs.resources, runs.untimed)
}

/// Resources by (file, run), as records are placed in them.
#[derive(Default)]
struct Runs {
    resources: Vec<Resource>,
    index: HashMap<(usize, u32), usize>,
    untimed: u64,
}

impl Runs {
    /// The resource of `record` and its time, widening the resource to cover the record;
    /// `None` (counted) for a record without a time.
    fn place(
        &mut self,
        file_idx: usize,
        file: &ImportedFile,
        record: &ImportRecord,
    ) -> Option<(usize, u64)> {
        let Some(at) = record.at() else {
            self.untimed += 1;
            return None;
        };
        let run = record.run();
        let next = self.resources.len();
        let res = *self.index.entry((file_idx, run)).or_insert(next);
        if res == next {
            self.resources.push(Resource {
                source_file: file.source_file.clone(),
                run,
                start_ns: u64::MAX,
                end_ns: 0,
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
        let r = &mut self.resources[res];
        r.start_ns = r.start_ns.min(at.saturating_sub(covered));
        r.end_ns = r.end_ns.max(at);
        Some((res, at))
    }
}

pub(crate) fn build(
    files: &[ImportedFile],
    sample_interval_ns: u64,
    rank: u32,
    group: &str,
) -> SeriesSet {
    let mut b = Builder {
        interval: sample_interval_ns.max(1),
        common: [
            (Key::Rank, rank.to_string()),
            (Key::Group, group.to_owned()),
        ],
        index: HashMap::new(),
        set: SeriesSet::default(),
    };
    let mut runs = Runs::default();
    for (file_idx, file) in files.iter().enumerate() {
        for record in &file.records {
            if let Some((res, at)) = runs.place(file_idx, file, record) {
                add_record(&mut b, res, record, at);
            }
        }
    }
    b.set.resources = runs.resources;
    b.set.untimed_records = runs.untimed;
    // A series of event lines holds its total to the run's end (see the module docs).
    for series in &mut b.set.series {
        let end = b.set.resources[series.resource].end_ns;
        if let Some(&last) = series.points.last()
            && series.family.is_of_events()
            && last.at_ns / b.interval < end / b.interval
        {
            series.points.push(Point { at_ns: end, ..last });
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
            let mut labels = vec![(Key::Bucket, bucket.clone())];
            if let Some(site) = probe_site(bucket) {
                labels.push((Key::Site, site.to_owned()));
            }
            b.add(Family::SectionDuration, res, labels, at, *total_ns, *calls);
        }
        ImportRecord::RouteTrace {
            site,
            layer,
            bar_ns,
            ..
        } => {
            let (site, layer) = ((Key::Site, site.clone()), (Key::Layer, layer.to_string()));
            b.add(
                Family::CollectiveWait,
                res,
                vec![site.clone()],
                at,
                *bar_ns,
                1,
            );
            let wait = vec![site.clone(), layer.clone()];
            for family in [
                Family::CollectiveLayerWaitTime,
                Family::CollectiveLayerWaitCalls,
            ] {
                b.add(family, res, wait.clone(), at, *bar_ns, 1);
            }
            let section = vec![
                (Key::Bucket, probe_bucket(&site.1).into_owned()),
                site,
                layer,
            ];
            for family in [Family::SectionLayerTime, Family::SectionLayerCalls] {
                b.add(family, res, section.clone(), at, *bar_ns, 1);
            }
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
            3,
            "tp0",
        );
        assert_eq!(set.series.len(), 2);
        let mhc = &set.series[0];
        assert_eq!(
            mhc.labels,
            vec![
                (Key::Bucket, "mhc".to_owned()),
                (Key::Rank, "3".to_owned()),
                (Key::Group, "tp0".to_owned())
            ]
        );
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
    fn a_route_trace_feeds_the_wait_histogram_and_the_per_layer_counters_as_a_live_probe() {
        let probe = |at: u64, layer: u32, bar_ns: u64| ImportRecord::RouteTrace {
            run: 0,
            at: Some(at),
            step: 1,
            site: "mlp".into(),
            layer,
            moe: false,
            bar_ns,
            expert_ids: Vec::new(),
        };
        let set = build(
            &[file(vec![
                probe(1_000_000_000, 4, 30),
                probe(2_000_000_000, 5, 70),
                probe(3_000_000_000, 4, 100),
                interval(2_500_000_000, "reduce_mlp_bar", 500, 5),
            ])],
            1_000_000,
            0,
            "g",
        );
        let labels = |family: Family| -> Vec<Vec<(Key, &str)>> {
            set.series
                .iter()
                .filter(|s| s.family == family)
                .map(|s| s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect())
                .collect()
        };
        let common = [(Key::Rank, "0"), (Key::Group, "g")];
        let with = |own: &[(Key, &'static str)]| -> Vec<(Key, &'static str)> {
            own.iter().chain(&common).copied().collect()
        };
        // The histograms carry no layer.
        assert_eq!(
            labels(Family::CollectiveWait),
            [with(&[(Key::Site, "mlp")])]
        );
        assert_eq!(
            labels(Family::SectionDuration),
            [with(&[(Key::Bucket, "reduce_mlp_bar"), (Key::Site, "mlp")])]
        );
        let per_layer = |l: &'static str| with(&[(Key::Site, "mlp"), (Key::Layer, l)]);
        for f in [
            Family::CollectiveLayerWaitTime,
            Family::CollectiveLayerWaitCalls,
        ] {
            assert_eq!(labels(f), [per_layer("4"), per_layer("5")], "{f:?}");
        }
        let section = |l: &'static str| {
            with(&[
                (Key::Bucket, "reduce_mlp_bar"),
                (Key::Site, "mlp"),
                (Key::Layer, l),
            ])
        };
        for f in [Family::SectionLayerTime, Family::SectionLayerCalls] {
            assert_eq!(labels(f), [section("4"), section("5")], "{f:?}");
        }
        // Layer 4: running totals at each of its probes.
        let layer4 = set
            .series
            .iter()
            .find(|s| s.family == Family::SectionLayerTime)
            .expect("layer 4");
        let totals: Vec<(u64, u64, u64)> = layer4
            .points
            .iter()
            .map(|p| (p.at_ns, p.sum_ns, p.count))
            .collect();
        assert_eq!(totals, [(1_000_000_000, 30, 1), (3_000_000_000, 130, 2)]);
        let wait = set
            .series
            .iter()
            .find(|s| s.family == Family::CollectiveWait)
            .expect("wait");
        assert_eq!(
            wait.points.last().map(|p| (p.sum_ns, p.count)),
            Some((200, 3))
        );
        // Layer 5's total holds to the run's end (the last line, at 3 s): no line, no probe.
        let points = |family: Family, layer: &str| -> Vec<(u64, u64, u64)> {
            set.series
                .iter()
                .find(|s| s.family == family && s.labels.contains(&(Key::Layer, layer.to_owned())))
                .map(|s| {
                    s.points
                        .iter()
                        .map(|p| (p.at_ns, p.sum_ns, p.count))
                        .collect()
                })
                .unwrap_or_default()
        };
        for f in [
            Family::CollectiveLayerWaitTime,
            Family::CollectiveLayerWaitCalls,
            Family::SectionLayerTime,
            Family::SectionLayerCalls,
        ] {
            assert_eq!(
                points(f, "5"),
                [(2_000_000_000, 70, 1), (3_000_000_000, 70, 1)],
                "{f:?}"
            );
        }
        // A table's series ends at its last table: a snapshot says nothing about later.
        let table = set
            .series
            .iter()
            .find(|s| s.family == Family::SectionDuration)
            .expect("table");
        assert_eq!(table.points.len(), 1);
        assert_eq!(set.resources[0].end_ns, 3_000_000_000);
    }

    #[test]
    fn untimed_records_are_counted_not_emitted() {
        let mut r = interval(0, "mhc", 1, 1);
        if let ImportRecord::SectionInterval { at, .. } = &mut r {
            *at = None;
        }
        let set = build(&[file(vec![r])], 1, 0, "default");
        assert!(set.series.is_empty());
        assert_eq!(set.untimed_records, 1);
    }
}
