//! What `phasetrace import` writes is what a live run of the library exports: the same metric
//! names, units, kinds and attribute (label) keys, and for the same buckets, sites and layers
//! the same series. Each test imports the fixture logs (`import/tests/fixtures/`) with the
//! `phasetrace` binary, runs the library live on what those logs describe (the tables'
//! buckets, one probe section per route-trace line at its site and layer, one round per
//! speculative burst), and compares the two: the OpenMetrics output against a scrape of the
//! live `/metrics` endpoint, and the OTLP output against the live OTLP export, both through a
//! real collector (rotel). A family the live library adds, renames or relabels fails here until
//! the importer follows, or the list of what logs cannot give says why.

use crate::cli;
use crate::support;

use phasetrace::{
    Layer, Phase, Profiler, Protocol, Recorder, Section, SectionKind, SectionLevel, Site,
    SpecLevel, VerifyPart,
};
use phasetrace_import::{ImportOptions, ImportRecord, ImportedFile, import_path, parse_time};
use phasetrace_names::{attr, metric};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use support::{Rotel, TempDir};

/// The rank and group both sides carry.
const RANK: u32 = 2;
const GROUP: &str = "tp1";
/// `--start` of the untimestamped speculative log.
const START: &str = "2026-09-30T13:00:00Z";

/// Attribute keys only an import has: the log and run a series came from, and the speculative
/// tracer's tag.
const IMPORT_ONLY: [&str; 3] = [attr::SOURCE_FILE, attr::SOURCE_RUN, attr::TAG];

/// `/metrics` sample names a live run has and an import cannot: bucket counts (tables and
/// lines print totals, not distributions), per-step durations and waits (tables print a mean
/// over an interval), the live pipeline's own drops, acceptance (the phase lines print none),
/// and the resource and scope (an import puts `source_file` and `source_run` on every series),
/// the request gauges (a log has no requests) and the endpoint's own connection counter.
const LIVE_ONLY_PROMETHEUS: [&str; 20] = [
    "phasetrace_section_duration_seconds_bucket",
    "phasetrace_collective_wait_seconds_bucket",
    "phasetrace_spec_phase_duration_seconds_bucket",
    "phasetrace_spec_verify_part_duration_seconds_bucket",
    "phasetrace_step_duration_seconds_bucket",
    "phasetrace_step_duration_seconds_sum",
    "phasetrace_step_duration_seconds_count",
    "phasetrace_step_collective_wait_seconds_bucket",
    "phasetrace_step_collective_wait_seconds_sum",
    "phasetrace_step_collective_wait_seconds_count",
    "phasetrace_records_dropped_total",
    "phasetrace_spec_draft_tokens_total",
    "phasetrace_spec_accepted_tokens_total",
    "phasetrace_spec_accepted_length_bucket",
    "phasetrace_spec_accepted_length_sum",
    "phasetrace_spec_accepted_length_count",
    "phasetrace_requests_running",
    "phasetrace_requests_waiting",
    "phasetrace_prometheus_connections_closed_total",
    "target_info",
];

/// The same over OTLP (instrument names; the resource is not a metric there), plus the live
/// exporter's own export and failure counts and the request gauges.
const LIVE_ONLY_OTLP: [&str; 10] = [
    metric::METRIC_EXPORTS,
    metric::OTLP_EXPORT_FAILURES,
    metric::STEP_DURATION,
    metric::STEP_COLLECTIVE_WAIT,
    metric::RECORDS_DROPPED,
    metric::SPEC_DRAFT_TOKENS,
    metric::SPEC_ACCEPTED_TOKENS,
    metric::SPEC_ACCEPTED_LENGTH,
    metric::REQUESTS_RUNNING,
    metric::REQUESTS_WAITING,
];

fn fixture(name: &str) -> String {
    support::repo_root()
        .join("import/tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// Both fixtures, read by the library as the binary reads them.
fn imported() -> Vec<ImportedFile> {
    let glm = import_path(
        fixture("glm_run_tracing.log").as_ref(),
        ImportOptions::default(),
    )
    .expect("glm fixture");
    let spec = import_path(
        fixture("spec_phases_stderr.log").as_ref(),
        ImportOptions {
            start_unix_nanos: parse_time(START),
            ..ImportOptions::default()
        },
    )
    .expect("spec fixture");
    vec![glm, spec]
}

/// A live engine profiling what the logs describe: a step per table with a section of each
/// bucket it lists (layer and site unknown, as in the table); a step per route-trace line with
/// the probe section of its site at its layer (a probe bucket's table row is the sum of these,
/// so it is not recorded again); a round per speculative burst with every phase and verify
/// part. Durations are whatever the host takes: only the shape is compared.
fn run_live(rec: &Recorder, files: &[ImportedFile]) {
    for record in files.iter().flat_map(|f| &f.records) {
        match record {
            ImportRecord::DecodeSteps { .. } | ImportRecord::VerifySplit { .. } => {}
            ImportRecord::SectionInterval { bucket, .. } => {
                let section = Section::lookup(bucket)
                    .unwrap_or_else(|| Section::register(bucket, SectionKind::Compute).unwrap());
                if section.kind() == SectionKind::Probe {
                    continue;
                }
                let _step = rec.step();
                let _section = rec.section(section, Layer::NONE, Site::NONE);
            }
            ImportRecord::RouteTrace { site, layer, .. } => {
                let probe = Section::register(&format!("reduce_{site}_bar"), SectionKind::Probe)
                    .expect("probe section");
                let site = Site::register(site).expect("site");
                let _step = rec.step();
                let _probe = rec.section(probe, *layer, site);
            }
            ImportRecord::SpecBurst { k, .. } => {
                let round = rec.round(*k);
                for part in VerifyPart::ALL {
                    let _part = rec.verify_part(round.as_ref(), part);
                }
                for phase in Phase::ALL {
                    round.phase(phase);
                }
                round.end(*k);
            }
        }
    }
}

fn live_profiler(b: phasetrace::ProfilerBuilder) -> Profiler {
    b.without_env()
        .with_level(SectionLevel::Full)
        .with_spec_level(SpecLevel::VerifySplit)
        .with_trace_every(0)
        .with_rank(RANK)
        .with_group(GROUP)
        .build()
        .expect("live profiler")
}

/// Series by name: each one's attributes, without the import-only keys and `le`.
type SeriesByName = BTreeMap<String, BTreeSet<BTreeMap<String, String>>>;

fn add_series(
    out: &mut SeriesByName,
    name: &str,
    attributes: impl IntoIterator<Item = (String, String)>,
    import_only: &[String],
) {
    let labels = attributes
        .into_iter()
        .filter(|(k, _)| k != "le" && !import_only.contains(k))
        .collect();
    out.entry(name.to_owned()).or_default().insert(labels);
}

fn keys(series: &BTreeSet<BTreeMap<String, String>>) -> BTreeSet<Vec<String>> {
    series.iter().map(|s| s.keys().cloned().collect()).collect()
}

/// The comparison both tests make. `section_duration` names the section-duration series,
/// whose imported ones are a subset of the live ones: the live probes of a site land in them,
/// while the import takes them from the tables' rows, which a log may lack for a probe bucket.
fn assert_same_series(
    import: &SeriesByName,
    live: &SeriesByName,
    live_only: &[&str],
    section_duration: &[&str],
) {
    let missing: Vec<&String> = import.keys().filter(|n| !live.contains_key(*n)).collect();
    assert!(
        missing.is_empty(),
        "imported names a live run does not export: {missing:?}; live: {:?}",
        live.keys().collect::<Vec<_>>()
    );
    let only_live: BTreeSet<&str> = live
        .keys()
        .filter(|n| !import.contains_key(*n))
        .map(String::as_str)
        .collect();
    assert_eq!(
        only_live,
        live_only.iter().copied().collect::<BTreeSet<&str>>(),
        "what a live run has and an import does not"
    );
    for (name, imported) in import {
        let lived = &live[name];
        assert_eq!(keys(imported), keys(lived), "label keys of {name}");
        if section_duration.contains(&name.as_str()) {
            let extra: Vec<_> = lived.difference(imported).collect();
            assert!(
                imported.is_subset(lived),
                "{name}: {imported:?} vs {lived:?}"
            );
            assert!(
                extra.iter().all(|s| {
                    s.get(attr::SITE).is_some_and(|site| {
                        s.get(attr::BUCKET) == Some(&format!("reduce_{site}_bar"))
                    })
                }),
                "{name}: only probe buckets without a table row are live only: {extra:?}"
            );
        } else {
            assert_eq!(imported, lived, "series of {name}");
        }
    }
    // The per-layer detail is there, by (bucket, site, layer), and only there.
    let layered = |s: &SeriesByName| -> BTreeSet<String> {
        s.iter()
            .filter(|(_, v)| v.iter().any(|l| l.contains_key(attr::LAYER)))
            .map(|(n, _)| n.clone())
            .collect()
    };
    assert_eq!(layered(import), layered(live));
    assert_eq!(layered(import).len(), 4, "{:?}", layered(import));
}

/// The samples of an exposition (OpenMetrics with timestamps or the classic text) by name.
fn exposition_series(text: &str, import_only: &[String]) -> SeriesByName {
    // A timestamp (OpenMetrics) is a third field after the labels; the parser reads two.
    let untimed: String = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, rest) = match l.rfind('}') {
                Some(i) => l.split_at(i + 1),
                None => l.split_once(' ').unwrap_or((l, "")),
            };
            let value = rest.split_whitespace().next().unwrap_or("");
            format!("{series} {value}\n")
        })
        .collect();
    let mut out = SeriesByName::new();
    for (name, labels, _) in cli::parse_exposition(&untimed) {
        add_series(&mut out, &name, labels, import_only);
    }
    out
}

#[test]
fn imported_openmetrics_has_the_series_of_a_live_scrape() {
    let dir = TempDir::new("phasetrace-import-shape");
    let om = dir.path().join("import.om");
    let rank = RANK.to_string();
    let done = cli::phasetrace(
        &[
            "import",
            &fixture("glm_run_tracing.log"),
            &fixture("spec_phases_stderr.log"),
            "--start",
            START,
            "--rank",
            &rank,
            "--group",
            GROUP,
            "--format",
            "openmetrics",
            "--out",
            &om.display().to_string(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(0), "{done}");

    let p = live_profiler(Profiler::builder().with_prometheus_at(([127, 0, 0, 1], 0)));
    run_live(&p.recorder(), &imported());
    p.flush();
    let url = format!("http://{}/metrics", p.prometheus_addr().expect("endpoint"));
    let (status, live_text) = support::http_get(&url).expect("scrape");
    assert_eq!(status, 200, "{live_text}");
    p.shutdown();

    let import_only: Vec<String> = IMPORT_ONLY.iter().map(|k| k.replace('.', "_")).collect();
    let import_text = std::fs::read_to_string(&om).expect("import output");
    let import = exposition_series(&import_text, &import_only);
    // The scope's info series is live only too (the classic format names it too).
    let mut live = exposition_series(&live_text, &import_only);
    live.remove("otel_scope_info");
    assert_same_series(
        &import,
        &live,
        &LIVE_ONLY_PROMETHEUS,
        &[
            "phasetrace_section_duration_seconds_sum",
            "phasetrace_section_duration_seconds_count",
        ],
    );
    // Both carry the rank and group given.
    for series in import.values().flatten() {
        assert_eq!(series.get(attr::RANK).map(String::as_str), Some("2"));
        assert_eq!(series.get(attr::GROUP).map(String::as_str), Some(GROUP));
    }
}

#[test]
fn imported_otlp_has_the_names_units_kinds_and_series_of_a_live_export() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let rank = RANK.to_string();
    let done = cli::phasetrace(
        &[
            "import",
            &fixture("glm_run_tracing.log"),
            &fixture("spec_phases_stderr.log"),
            "--start",
            START,
            "--rank",
            &rank,
            "--group",
            GROUP,
            "--otlp-protocol",
            "http/protobuf",
            "--otlp-endpoint",
            &rotel.http_endpoint(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(0), "{done}");

    let p = live_profiler(
        Profiler::builder()
            .without_prometheus()
            .with_service_name("phasetrace-live")
            .with_otlp_endpoint(Some(&rotel.http_endpoint()))
            .with_otlp_protocol(Protocol::HttpProtobuf)
            .with_metric_export_interval(Duration::from_millis(500)),
    );
    run_live(&p.recorder(), &imported());
    p.flush();
    let is_live = |m: &support::ReceivedMetric| {
        m.resource.get("service.name").map(String::as_str) == Some("phasetrace-live")
    };
    let out = rotel.wait_for(
        |o| {
            let names = |live: bool| -> BTreeSet<&str> {
                o.metrics
                    .iter()
                    .filter(|m| is_live(m) == live)
                    .map(|m| m.name.as_str())
                    .collect()
            };
            names(true).contains(metric::COLLECTIVE_LAYER_WAIT_CALLS)
                && names(true).contains(metric::SPEC_ROUNDS)
                && names(false).contains(metric::SPEC_ROUNDS)
                && names(false).contains(metric::SECTION_LAYER_TIME)
        },
        Duration::from_secs(20),
    );
    p.shutdown();

    let import_only: Vec<String> = IMPORT_ONLY.iter().map(|k| (*k).to_owned()).collect();
    let mut series = [SeriesByName::new(), SeriesByName::new()];
    // (unit, kind, monotonic, temporality) by name, per side.
    let mut shape: [BTreeMap<String, BTreeSet<String>>; 2] = Default::default();
    for m in &out.metrics {
        let side = usize::from(is_live(m));
        shape[side]
            .entry(m.name.clone())
            .or_default()
            .insert(format!(
                "unit={:?} kind={:?} monotonic={:?} temporality={}",
                m.unit, m.kind, m.monotonic, m.temporality
            ));
        for point in &m.points {
            add_series(
                &mut series[side],
                &m.name,
                point.attributes.clone(),
                &import_only,
            );
        }
    }
    let [import, live] = &series;
    assert_same_series(import, live, &LIVE_ONLY_OTLP, &[metric::SECTION_DURATION]);
    for (name, imported) in &shape[0] {
        assert_eq!(imported.len(), 1, "{name}: {imported:?}");
        assert_eq!(Some(imported), shape[1].get(name), "unit, kind of {name}");
    }
}
