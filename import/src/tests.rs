//! Tests of the importer: each format, interleaving, prefixes, damage, time base, gzip, the
//! fixtures under `import/tests/fixtures/`, and property tests of the parsers.
//!
//! The emitters below write the four formats from known nanosecond and call counts, the way the
//! reference profilers print them, so that a test can compare what the importer recovers with
//! the truth.

use std::cmp::Reverse;
use std::io::{BufReader, Write};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use super::*;

// ---------------------------------------------------------------------------------------------
// Emitters of the reference formats.

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `tracing`'s default timestamp: RFC 3339, microseconds, `Z`.
fn rfc3339(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ns % 1_000_000_000 / 1000
    )
}

/// 2026-09-30T12:00:00Z.
const T0: u64 = 1_790_769_600_000_000_000;
const MS: u64 = 1_000_000;
const PROFILE_TARGET: &str = "metrale_model_arch::glm5next_layer::profile";

/// One `tracing` fmt event (default format), with its trailing newline.
fn event(ns: u64, level: &str, target: &str, message: &str, ansi: bool) -> String {
    if ansi {
        let colour = match level {
            "WARN" => "\x1b[33m",
            "INFO" => "\x1b[32m",
            "DEBUG" => "\x1b[34m",
            _ => "\x1b[31m",
        };
        format!(
            "\x1b[2m{}\x1b[0m {colour}{level:>5}\x1b[0m \x1b[2m{target}\x1b[0m\x1b[2m:\x1b[0m {message}\n",
            rfc3339(ns)
        )
    } else {
        format!("{} {level:>5} {target}: {message}\n", rfc3339(ns))
    }
}

/// The decode-profile message after `steps` steps, from cumulative `(name, ns, calls)`.
fn table_message(steps: u64, buckets: &[(&str, u64, u64)]) -> String {
    let total: u64 = buckets.iter().map(|b| b.1).sum();
    let mut rows = buckets.to_vec();
    rows.sort_by_key(|r| Reverse(r.1));
    let mut out = format!(
        "GLM decode profile after {steps} steps — {:.2} ms/token measured under profiling\n",
        total as f64 / 1e6 / steps as f64
    );
    for (name, ns, calls) in rows.into_iter().filter(|r| r.2 > 0) {
        out += &format!(
            "  {:<13} {:>8.2} ms/tok  {:>6.1}%  {:>5} calls/tok  {:>7.1} us/call\n",
            name,
            ns as f64 / 1e6 / steps as f64,
            100.0 * ns as f64 / total.max(1) as f64,
            calls / steps,
            ns as f64 / 1e3 / calls as f64,
        );
    }
    out
}

fn route_message(step: u64, site: &str, layer: u32, moe: bool, bar_ns: u64, ids: &[u32]) -> String {
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    format!(
        "GLMTRACE step={step} site={site} L={layer} moe={} bar_us={:.1} ids={}",
        u8::from(moe),
        bar_ns as f64 / 1e3,
        ids.join(",")
    )
}

/// A phase line from per-burst phase nanoseconds `[draft, verify, accept, roll, maint]`.
fn spec_line(tag: &str, rounds: u64, k: u32, p: [u64; 5]) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    let per = |ns: u64| ns as f64 / 1e6 / rounds as f64;
    let total: u64 = p.iter().sum();
    format!(
        "[{tag}] rounds={rounds} k={k} total={:.2}ms | draft={:.2} verify={:.2} accept={:.2} \
         roll={:.2} maint={:.2} | per-round ms: draft={:.3} verify={:.3} accept={:.3} roll={:.3} \
         maint={:.3} total={:.3}\n",
        ms(total),
        ms(p[0]),
        ms(p[1]),
        ms(p[2]),
        ms(p[3]),
        ms(p[4]),
        per(p[0]),
        per(p[1]),
        per(p[2]),
        per(p[3]),
        per(p[4]),
        per(total)
    )
}

/// A verify sub-split line; `rest` is derived from `verify` as the reference does.
/// `mixers` are `[kda, scan, mla, ffn]` nanoseconds over the burst.
fn verify_line(tag: &str, rounds: u64, k: u32, verify: u64, mixers: [u64; 4]) -> String {
    let [kda, scan, mla, ffn] = mixers;
    let per = |ns: u64| ns as f64 / 1e6 / rounds as f64;
    format!(
        "[{tag}] rounds={rounds} k={k} | per-round ms: vkda={:.3} (scan={:.3}) vmla={:.3} \
         vrest={:.3} (vffn={:.3})\n",
        per(kda),
        per(scan),
        per(mla),
        per(verify.saturating_sub(kda + mla)),
        per(ffn)
    )
}

fn import_str(log: &str) -> ImportedFile {
    import_bytes(log.as_bytes(), ImportOptions::default())
}

fn import_bytes(log: &[u8], options: ImportOptions) -> ImportedFile {
    import_reader(log, options).expect("in-memory input cannot fail to read")
}

fn intervals(file: &ImportedFile) -> Vec<(u32, String, u64, u64, u64)> {
    file.records
        .iter()
        .filter_map(|r| match r {
            ImportRecord::SectionInterval {
                run,
                bucket,
                steps_in_interval,
                total_ns,
                calls,
                ..
            } => Some((*run, bucket.clone(), *steps_in_interval, *total_ns, *calls)),
            _ => None,
        })
        .collect()
}

/// Per (run, bucket): summed deltas (ns, calls).
fn sums(file: &ImportedFile) -> std::collections::BTreeMap<(u32, String), (u64, u64)> {
    let mut m = std::collections::BTreeMap::new();
    for (run, bucket, _, ns, calls) in intervals(file) {
        let e = m.entry((run, bucket)).or_insert((0, 0));
        e.0 += ns;
        e.1 += calls;
    }
    m
}

// ---------------------------------------------------------------------------------------------
// The decode-profile table.

#[test]
fn a_table_becomes_one_delta_per_bucket_and_consecutive_tables_subtract() {
    let t1 = [
        ("moe_experts", 8 * 60 * 41_237, 8 * 60),
        ("norm", 8 * 156 * 1_234, 8 * 156),
    ];
    let t2 = [
        ("moe_experts", t1[0].1 + 8 * 60 * 41_105, 16 * 60),
        ("norm", t1[1].1 + 8 * 156 * 1_301, 16 * 156),
    ];
    let log = event(T0, "WARN", PROFILE_TARGET, &table_message(8, &t1), false)
        + &event(
            T0 + 60 * MS,
            "WARN",
            PROFILE_TARGET,
            &table_message(16, &t2),
            false,
        );
    let file = import_str(&log);
    assert_eq!(file.summary.records_per_format.tables, 2);
    assert_eq!(file.summary.truncated_tables, 0);
    assert_eq!(file.summary.lines_bad, 0, "{:?}", file.summary.first_bad);
    let iv = intervals(&file);
    assert_eq!(iv.len(), 4);
    // Second table, moe_experts: 8 steps, 480 calls, about 480 × 41.105 µs.
    let (run, bucket, steps, ns, calls) = &iv[2];
    assert_eq!(
        (*run, bucket.as_str(), *steps, *calls),
        (0, "moe_experts", 8, 480)
    );
    assert!(ns.abs_diff(8 * 60 * 41_105) <= 2 * 480 * 50 + 10, "{ns}");
    let steps: Vec<_> = file
        .records
        .iter()
        .filter_map(|r| match r {
            ImportRecord::DecodeSteps {
                steps,
                steps_in_interval,
                at,
                ..
            } => Some((*steps, *steps_in_interval, *at)),
            _ => None,
        })
        .collect();
    assert_eq!(steps, vec![(8, 8, Some(T0)), (16, 8, Some(T0 + 60 * MS))]);
}

/// Cumulative truth for `intervals` tables of 8 steps each: per bucket a fixed calls-per-step
/// and a per-interval time per call. Returns the log and the final truth per bucket.
fn run_of_tables(
    buckets: &[(&'static str, u64, Vec<u64>)],
    ansi: bool,
    t0: u64,
) -> (String, Vec<(&'static str, u64, u64)>) {
    let intervals = buckets.iter().map(|b| b.2.len()).max().unwrap_or(0);
    let mut cum: Vec<(&str, u64, u64)> = buckets.iter().map(|b| (b.0, 0, 0)).collect();
    let mut log = String::new();
    for i in 0..intervals {
        for (c, (_, per_step, per_call)) in cum.iter_mut().zip(buckets) {
            let calls = 8 * per_step;
            c.1 += calls * per_call[i];
            c.2 += calls;
        }
        let steps = 8 * (i as u64 + 1);
        log += &event(
            t0 + i as u64 * 100 * MS,
            "WARN",
            PROFILE_TARGET,
            &table_message(steps, &cum),
            ansi,
        );
    }
    (log, cum)
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Deltas telescope to the final reconstruction, which is within the stated bound of the
    /// truth; fixed-rate call counts come back exactly.
    #[test]
    fn cumulative_tables_convert_to_exact_deltas(
        buckets in prop::collection::vec((1u64..200, prop::collection::vec(1u64..300_000, 1..8)), 1..6),
        ansi in any::<bool>(),
    ) {
        const NAMES: [&str; 6] = ["mhc", "norm", "kda_mixer", "moe_experts", "reduce_mlp", "dsa_attend"];
        let n = buckets.iter().map(|b| b.1.len()).max().unwrap_or(1);
        let spec: Vec<(&'static str, u64, Vec<u64>)> = buckets
            .iter()
            .zip(NAMES)
            .map(|((per_step, per_call), name)| {
                let mut v = per_call.clone();
                v.resize(n, per_call[0]);
                (name, *per_step, v)
            })
            .collect();
        let (log, truth) = run_of_tables(&spec, ansi, T0);
        let file = import_str(&log);
        prop_assert_eq!(file.summary.truncated_tables, 0, "{:?}", file.summary.first_bad);
        prop_assert_eq!(file.summary.records_per_format.tables, n as u64);
        let got = sums(&file);
        let steps = 8 * n as u64;
        for (name, ns, calls) in truth {
            let (got_ns, got_calls) = got[&(0, name.to_owned())];
            prop_assert_eq!(got_calls, calls);
            let bound = (5_000 * steps).min(50 * calls) + 2 + (ns >> 29);
            prop_assert!(got_ns.abs_diff(ns) <= bound, "{} {} vs {} bound {}", name, got_ns, ns, bound);
        }
    }
}

#[test]
fn a_table_cut_mid_row_is_reported_and_its_complete_rows_used_and_the_rest_carried() {
    let t1 = [
        ("moe_experts", 8_000_000, 480),
        ("kda_mixer", 4_000_000, 360),
        ("norm", 1_000_000, 1248),
    ];
    let t2 = [
        ("moe_experts", 16_100_000, 960),
        ("kda_mixer", 8_050_000, 720),
        ("norm", 2_020_000, 2496),
    ];
    let t3 = [
        ("moe_experts", 24_300_000, 1440),
        ("kda_mixer", 12_000_000, 1080),
        ("norm", 3_030_000, 3744),
    ];
    let msg2 = table_message(16, &t2);
    // Keep the header, the first row and half of the second.
    let cut: String = {
        let lines: Vec<&str> = msg2.lines().collect();
        format!("{}\n{}\n{}\n", lines[0], lines[1], &lines[2][..20])
    };
    let log = event(T0, "WARN", PROFILE_TARGET, &table_message(8, &t1), false)
        + &event(T0 + 100 * MS, "WARN", PROFILE_TARGET, &cut, false)
        + &event(
            T0 + 200 * MS,
            "WARN",
            PROFILE_TARGET,
            &table_message(24, &t3),
            false,
        );
    let file = import_str(&log);
    assert_eq!(file.summary.truncated_tables, 1);
    assert_eq!(file.summary.lines_bad, 1);
    assert_eq!(
        file.summary.first_bad.len(),
        2,
        "{:?}",
        file.summary.first_bad
    );
    assert!(
        file.summary.first_bad[0].1.starts_with("table row"),
        "{:?}",
        file.summary.first_bad
    );
    assert!(
        file.summary.first_bad[1].1.contains("truncated"),
        "{:?}",
        file.summary.first_bad
    );
    let iv = intervals(&file);
    let kda: Vec<_> = iv
        .iter()
        .filter(|r| r.1 == "kda_mixer")
        .map(|r| (r.2, r.4))
        .collect();
    // kda_mixer missed the cut table: its second delta spans 16 steps.
    assert_eq!(kda, vec![(8, 360), (16, 720)]);
    let moe: Vec<_> = iv
        .iter()
        .filter(|r| r.1 == "moe_experts")
        .map(|r| (r.2, r.4))
        .collect();
    assert_eq!(moe, vec![(8, 480), (8, 480), (8, 480)]);
    let s = sums(&file);
    assert!(s[&(0, "kda_mixer".into())].0.abs_diff(12_000_000) <= 50 * 1080);
    assert_eq!(file.summary.runs, 1);
}

#[test]
fn a_table_cut_at_a_row_boundary_is_told_by_its_row_sum() {
    let t = [
        ("moe_experts", 8_000_000, 480),
        ("kda_mixer", 4_000_000, 360),
        ("norm", 1_000_000, 1248),
    ];
    let msg = table_message(8, &t);
    let first_two: Vec<&str> = msg.lines().take(3).collect();
    let log = event(
        T0,
        "WARN",
        PROFILE_TARGET,
        &(first_two.join("\n") + "\n"),
        false,
    ) + "2026-09-30T12:00:01.000000Z  INFO other: next process\n";
    let file = import_str(&log);
    assert_eq!(file.summary.truncated_tables, 1);
    assert_eq!(file.summary.lines_bad, 0);
    assert_eq!(file.summary.records_per_format.section_intervals, 2);
    // The header and two rows are not candidates that failed: nothing was skipped.
    assert_eq!(file.summary.lines_skipped, 0);
}

#[test]
fn a_table_at_the_end_of_the_input_without_newline_is_complete() {
    let t = [("mhc", 800_000, 624)];
    let log = event(T0, "WARN", PROFILE_TARGET, &table_message(8, &t), false);
    let log = log.trim_end();
    let file = import_str(log);
    assert_eq!(file.summary.truncated_tables, 0);
    assert_eq!(intervals(&file).len(), 1);
}

#[test]
fn a_restart_starts_a_new_run_by_steps_going_down() {
    let t = [("mhc", 800_000, 624)];
    let t2 = [("mhc", 1_600_000, 1248)];
    let msg = |s, t: &[_]| table_message(s, t);
    let log = event(T0, "WARN", PROFILE_TARGET, &msg(8, &t), false)
        + &event(T0 + MS, "WARN", PROFILE_TARGET, &msg(16, &t2), false)
        + &event(
            T0 + 2 * MS,
            "WARN",
            PROFILE_TARGET,
            &route_message(3, "attn", 0, false, 1000, &[]),
            false,
        )
        + &event(T0 + 3 * MS, "WARN", PROFILE_TARGET, &msg(8, &t), false)
        + &event(T0 + 4 * MS, "WARN", PROFILE_TARGET, &msg(8, &t), false);
    let file = import_str(&log);
    let runs: Vec<u32> = file.records.iter().map(ImportRecord::run).collect();
    // tables 8, 16 | trace at step 3 (< 16) | table 8 (= 8, not above) | table 8 again.
    assert_eq!(runs, vec![0, 0, 0, 0, 1, 1, 1, 2, 2]);
    assert_eq!(file.summary.runs, 3);
    // Every run's first interval starts from zero.
    let iv = intervals(&file);
    assert_eq!(
        iv.iter().map(|r| r.4).collect::<Vec<_>>(),
        vec![624, 624, 624, 624]
    );
}

#[test]
fn rows_outside_a_table_and_broken_headers_are_reported() {
    let log = "  norm              0.50 ms/tok     4.0%     10 calls/tok      6.2 us/call\n\
               x GLM decode profile after 8 st\n\
               x GLM decode profile after 8 steps — 1e3 ms/token measured\n";
    let file = import_str(log);
    assert_eq!(file.summary.lines_bad, 3);
    assert!(file.records.is_empty());
    assert_eq!(file.summary.first_bad[0].0, 1);
    assert!(file.summary.first_bad[0].1.contains("without a header"));
}

// ---------------------------------------------------------------------------------------------
// Route traces, speculative lines, interleaving, prefixes.

#[test]
fn route_traces_parse_with_and_without_ansi_among_unrelated_lines() {
    let mut log = String::new();
    log += &event(
        T0,
        "INFO",
        "metrale_server",
        "listening on 0.0.0.0:8080",
        false,
    );
    log += &event(
        T0 + MS,
        "WARN",
        PROFILE_TARGET,
        &route_message(7, "attn", 1, true, 12_300, &[3, 17, 250]),
        false,
    );
    log += "panicked? no: unrelated stderr GLM text\n";
    log += &event(
        T0 + 2 * MS,
        "WARN",
        PROFILE_TARGET,
        &route_message(7, "mlp", 1, true, 48_700, &[]),
        true,
    );
    log += &event(
        T0 + 3 * MS,
        "DEBUG",
        "metrale_engine::sched",
        "batch 1",
        true,
    );
    let file = import_str(&log);
    assert_eq!(file.summary.lines_read, 5);
    assert_eq!(file.summary.timestamped_lines, 4);
    assert_eq!(file.summary.lines_bad, 0, "{:?}", file.summary.first_bad);
    assert_eq!(
        file.records,
        vec![
            ImportRecord::RouteTrace {
                run: 0,
                at: Some(T0 + MS),
                step: 7,
                site: "attn".into(),
                layer: 1,
                moe: true,
                bar_ns: 12_300,
                expert_ids: vec![3, 17, 250],
            },
            ImportRecord::RouteTrace {
                run: 0,
                at: Some(T0 + 2 * MS),
                step: 7,
                site: "mlp".into(),
                layer: 1,
                moe: true,
                bar_ns: 48_700,
                expert_ids: vec![],
            },
        ]
    );
}

#[test]
fn a_table_with_ansi_prefix_parses_like_a_plain_one() {
    let t = [("moe_experts", 8_000_000, 480), ("norm", 1_000_000, 1248)];
    let plain = import_str(&event(
        T0,
        "WARN",
        PROFILE_TARGET,
        &table_message(8, &t),
        false,
    ));
    let ansi = import_str(&event(
        T0,
        "WARN",
        PROFILE_TARGET,
        &table_message(8, &t),
        true,
    ));
    assert_eq!(plain.records, ansi.records);
    assert_eq!(ansi.records.len(), 3);
}

#[test]
fn escapes_inside_a_message_are_stripped_before_parsing() {
    let log = "\x1b[2m2026-09-30T12:00:00.000000Z\x1b[0m \x1b[33m WARN\x1b[0m p: GLMTRACE step=1 site=attn L=0 moe=0 \x1b[3mbar_us\x1b[0m=5.0 ids=\n";
    let file = import_str(log);
    assert_eq!(file.summary.lines_bad, 0, "{:?}", file.summary.first_bad);
    assert!(matches!(
        file.records[0],
        ImportRecord::RouteTrace { bar_ns: 5000, .. }
    ));
}

#[test]
fn a_level_two_burst_yields_phases_and_a_verify_split_sharing_a_time() {
    let p = [3_210_000, 33_456_000, 1_234_000, 567_000, 890_000];
    let log = spec_line("glm5-phase", 16, 4, p)
        + &verify_line(
            "glm5-phase-v",
            16,
            4,
            p[1],
            [12_345_000, 2_345_000, 9_876_000, 8_000_000],
        );
    let start = T0;
    let file = import_bytes(
        log.as_bytes(),
        ImportOptions {
            start_unix_nanos: Some(start),
            ..Default::default()
        },
    );
    assert_eq!(file.summary.lines_bad, 0, "{:?}", file.summary.first_bad);
    let total: u64 = p.iter().sum();
    let [
        ImportRecord::SpecBurst {
            tag,
            rounds,
            k,
            phases,
            at,
            ..
        },
        ImportRecord::VerifySplit {
            tag: tag_v,
            parts,
            at: at_v,
            ..
        },
    ] = file.records.as_slice()
    else {
        panic!("{:?}", file.records)
    };
    assert_eq!(
        (tag.as_str(), *rounds, *k, tag_v.as_str()),
        ("glm5-phase", 16, 4, "glm5-phase-v")
    );
    assert_eq!(*at, Some(start + phases.total_ns()));
    assert_eq!(at, at_v);
    for (got, want) in [
        phases.draft_ns,
        phases.verify_ns,
        phases.accept_ns,
        phases.rollback_ns,
        phases.maint_ns,
    ]
    .into_iter()
    .zip(p)
    {
        // Per-round figures with 3 decimals over 16 rounds: ±8 µs; totals ±5 µs: the tighter.
        assert!(got.abs_diff(want) <= 5_001, "{got} vs {want}");
    }
    assert!(phases.total_ns().abs_diff(total) <= 5 * 5_001);
    // Verify parts are per-round × rounds: within 0.5 µs × 16.
    let rest = p[1] - 12_345_000 - 9_876_000;
    for (got, want) in [
        (parts.kda_ns, 12_345_000),
        (parts.kda_scan_ns, 2_345_000),
        (parts.mla_ns, 9_876_000),
        (parts.rest_ns, rest),
        (parts.ffn_ns, 8_000_000),
    ] {
        assert!(got.abs_diff(want) <= 8_000, "{got} vs {want}");
    }
}

#[test]
fn the_tag_filter_keeps_listed_tags_and_their_verify_lines() {
    let p = [1_000_000, 2_000_000, 300_000, 100_000, 50_000];
    let log = spec_line("glm5-phase", 4, 3, p)
        + &verify_line(
            "glm5-phase-v",
            4,
            3,
            p[1],
            [500_000, 100_000, 400_000, 700_000],
        )
        + &spec_line("mtp-phase", 4, 2, p)
        + &verify_line("mtp-phase-v", 4, 2, p[1], [0, 0, 0, 0]);
    let options = ImportOptions {
        tags: vec!["glm5-phase".into()],
        start_unix_nanos: Some(T0),
        ..Default::default()
    };
    let file = import_bytes(log.as_bytes(), options);
    let tags: Vec<&str> = file
        .records
        .iter()
        .map(|r| match r {
            ImportRecord::SpecBurst { tag, .. } | ImportRecord::VerifySplit { tag, .. } => {
                tag.as_str()
            }
            _ => "",
        })
        .collect();
    assert_eq!(tags, vec!["glm5-phase", "glm5-phase-v"]);
    assert_eq!(file.summary.lines_filtered, 2);
    assert_eq!(file.summary.lines_skipped, 2);
    // The filtered burst still advanced the clock: a later burst would sit after it.
    let ImportRecord::SpecBurst { phases, .. } = &file.records[0] else {
        panic!()
    };
    assert_eq!(file.summary.synthetic_ns_total, 2 * phases.total_ns());
}

#[test]
fn untimestamped_lines_follow_the_last_timestamp_plus_measured_time() {
    let p = [1_000_000, 2_000_000, 0, 0, 0];
    let log = event(T0, "INFO", "x", "start", false)
        + &spec_line("a", 1, 1, p)
        + &spec_line("a", 1, 1, p)
        + &event(T0 + 100 * MS, "INFO", "x", "tick", false)
        + &spec_line("a", 1, 1, p);
    let file = import_str(&log);
    let at: Vec<_> = file.records.iter().map(ImportRecord::at).collect();
    assert_eq!(
        at,
        vec![Some(T0 + 3 * MS), Some(T0 + 6 * MS), Some(T0 + 103 * MS)]
    );
    assert_eq!(file.summary.first_timestamp, Some(T0));
    assert_eq!(file.summary.synthetic_ns_total, 9 * MS);
}

#[test]
fn without_any_time_records_have_none_and_with_a_start_they_follow_it() {
    let p = [1_000_000, 0, 0, 0, 0];
    let log = spec_line("a", 1, 1, p) + &spec_line("a", 1, 1, p);
    let none = import_str(&log);
    assert!(none.records.iter().all(|r| r.at().is_none()));
    assert_eq!(none.summary.untimed_records, 2);
    let started = import_bytes(
        log.as_bytes(),
        ImportOptions {
            start_unix_nanos: Some(T0),
            ..Default::default()
        },
    );
    let at: Vec<_> = started.records.iter().map(ImportRecord::at).collect();
    assert_eq!(at, vec![Some(T0 + MS), Some(T0 + 2 * MS)]);
}

#[test]
fn start_times_parse_as_rfc3339_or_unix_seconds() {
    assert_eq!(parse_time("2026-09-30T12:00:00Z"), Some(T0));
    assert_eq!(
        parse_time(" 2026-09-30T14:00:00.5+02:00 "),
        Some(T0 + 500 * MS)
    );
    assert_eq!(parse_time("1790769600"), Some(T0));
    assert_eq!(parse_time("1790769600.25"), Some(T0 + 250 * MS));
    for bad in [
        "",
        "yesterday",
        "-1",
        "1e9",
        "2026-13-01T00:00:00Z",
        "99999999999999999999",
    ] {
        assert_eq!(parse_time(bad), None, "{bad}");
    }
}

#[test]
fn time_never_goes_backwards_within_a_file() {
    let log = event(
        T0 + 10 * MS,
        "WARN",
        "p",
        &route_message(1, "attn", 0, false, 1, &[]),
        false,
    ) + &event(
        T0,
        "WARN",
        "p",
        &route_message(1, "mlp", 0, false, 1, &[]),
        false,
    );
    let file = import_str(&log);
    let at: Vec<_> = file.records.iter().map(ImportRecord::at).collect();
    assert_eq!(at, vec![Some(T0 + 10 * MS), Some(T0 + 10 * MS)]);
    assert_eq!(file.summary.clamped_timestamps, 1);
}

#[test]
fn import_path_places_an_untimestamped_file_to_end_at_its_mtime() {
    let dir = std::env::temp_dir().join(format!("phasetrace-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("spec.log");
    let p = [1_000_000, 0, 0, 0, 0];
    std::fs::write(&path, spec_line("a", 1, 1, p) + &spec_line("a", 1, 1, p)).expect("write");
    let mtime = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .expect("mtime")
        .duration_since(UNIX_EPOCH)
        .expect("after epoch")
        .as_nanos() as u64;
    let file = import_path(&path, ImportOptions::default()).expect("import");
    let at: Vec<_> = file.records.iter().map(ImportRecord::at).collect();
    assert_eq!(at, vec![Some(mtime - MS), Some(mtime)]);
    assert_eq!(file.source_file, path.display().to_string());
    // A head before the first timestamp ends at that timestamp.
    std::fs::write(
        &path,
        spec_line("a", 1, 1, p) + &event(T0, "INFO", "x", "y", false) + &spec_line("a", 1, 1, p),
    )
    .expect("write");
    let file = import_path(&path, ImportOptions::default()).expect("import");
    let at: Vec<_> = file.records.iter().map(ImportRecord::at).collect();
    assert_eq!(at, vec![Some(T0), Some(T0 + MS)]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(matches!(
        import_path(&dir.join("missing.log"), ImportOptions::default()),
        Err(ImportError::Open { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// Damage: encodings, garbage, huge values, long lines, buffer boundaries, gzip.

#[test]
fn non_utf8_bytes_are_counted_and_do_not_stop_parsing() {
    let mut log = b"GET /caf\xe9 200\n".to_vec();
    // The em dash of a header replaced by a Latin-1 byte still parses.
    log.extend_from_slice(b"2026-09-30T12:00:00Z  WARN p: GLM decode profile after 8 steps \x97 1.00 ms/token measured under profiling\n");
    log.extend_from_slice(
        b"  mhc\xff             1.00 ms/tok   100.0%     78 calls/tok     12.8 us/call\n\n",
    );
    log.extend_from_slice(b"[t\xc3\x28] rounds=1 k=1 total=1.00ms | draft=1.00 verify=0.00 accept=0.00 roll=0.00 maint=0.00 | per-round ms: draft=1.000 verify=0.000 accept=0.000 roll=0.000 maint=0.000 total=1.000\n");
    let file = import_bytes(&log, ImportOptions::default());
    assert_eq!(file.summary.non_utf8_lines, 4);
    assert_eq!(file.summary.lines_bad, 0, "{:?}", file.summary.first_bad);
    let names: Vec<String> = file
        .records
        .iter()
        .filter_map(|r| match r {
            ImportRecord::SectionInterval { bucket, .. } => Some(bucket.clone()),
            ImportRecord::SpecBurst { tag, .. } => Some(tag.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        names,
        vec!["mhc\u{fffd}".to_owned(), "t\u{fffd}(".to_owned()]
    );
}

#[test]
fn garbage_and_huge_numbers_are_reported_and_skipped() {
    let lines = [
        "GLMTRACE step=1 site=attn L=0 moe=0 bar_us=NaN ids=",
        "GLMTRACE step=1 site=attn L=0 moe=0 bar_us=1e9 ids=",
        "GLMTRACE step=99999999999999999999999 site=attn L=0 moe=0 bar_us=1.0 ids=",
        "GLMTRACE step=1 site=attn L=0 moe=0 bar_us=18446744073709551615.0 ids=",
        "GLMTRACE step=1 site=attn L=0 moe=0 bar_us=1.0 ids=4294967296",
        "[t] rounds=0 k=1 total=1.00ms | draft=1.00 verify=0.00 accept=0.00 roll=0.00 maint=0.00 | per-round ms: draft=1.000 verify=0.000 accept=0.000 roll=0.000 maint=0.000 total=1.000",
        "[t] rounds=18446744073709551615 k=1 total=1.00ms | draft=1.00 verify=0.00 accept=0.00 roll=0.00 maint=0.00 | per-round ms: draft=1.000 verify=0.000 accept=0.000 roll=0.000 maint=0.000 total=1.000",
        "[t] rounds=1 k=1 total=-1.00ms | draft=1.00 verify=0.00 accept=0.00 roll=0.00 maint=0.00 | per-round ms: draft=1.000 verify=0.000 accept=0.000 roll=0.000 maint=0.000 total=1.000",
        "[t] rounds=3 k=1 | per-round ms: vkda=99999999999999999.000 (scan=0.000) vmla=0.000 vrest=0.000 (vffn=0.000)",
        "x GLM decode profile after 18446744073709551615 steps — 99999999999999.99 ms/token measured",
    ];
    let log = lines.join("\n") + "\n";
    let file = import_str(&log);
    assert_eq!(
        file.summary.lines_bad,
        lines.len() as u64,
        "{:?}",
        file.summary.first_bad
    );
    assert_eq!(file.summary.lines_skipped, lines.len() as u64);
    assert_eq!(file.summary.first_bad.len(), 5);
    assert!(
        file.summary.first_bad[0].1.contains("bar_us"),
        "{:?}",
        file.summary.first_bad
    );
    assert!(file.records.is_empty());
}

#[test]
fn a_huge_but_valid_table_does_not_overflow() {
    let steps = u64::MAX / 4;
    let row = format!(
        "  mhc {:.2} ms/tok   100.0%  {} calls/tok  5.0 us/call",
        1e6, 4
    );
    let log =
        format!("GLM decode profile after {steps} steps — 1000000.00 ms/token measured\n{row}\n");
    let file = import_str(&log);
    // 1e6 ms/token × 4.6e18 steps does not fit u64 nanoseconds: the row is reported.
    assert_eq!(file.summary.lines_bad, 1, "{:?}", file.summary.first_bad);
}

#[test]
fn overlong_lines_are_skipped_and_lines_across_buffer_edges_are_whole() {
    let p = [1_000_000, 2_000_000, 300_000, 100_000, 50_000];
    let mut log = String::new();
    for i in 0..50 {
        log += &spec_line("glm5-phase", 4, 3, p);
        log += &event(
            T0 + i * MS,
            "WARN",
            "p",
            &route_message(i, "attn", 3, true, 1500, &[1, 2, 3]),
            i % 2 == 0,
        );
        log += &"x".repeat(i as usize * 7);
        log += "\n";
    }
    let whole = import_str(&log);
    assert_eq!(whole.summary.lines_bad, 0);
    for cap in [1, 7, 64, 333] {
        let reader = BufReader::with_capacity(cap, log.as_bytes());
        let split = import_reader(reader, ImportOptions::default()).expect("read");
        assert_eq!(split.records, whole.records, "capacity {cap}");
        assert_eq!(split.summary, whole.summary, "capacity {cap}");
    }
    let reader = BufReader::with_capacity(16, log.as_bytes());
    let capped = import_reader(
        reader,
        ImportOptions {
            max_line_bytes: 200,
            ..Default::default()
        },
    )
    .expect("read");
    assert_eq!(capped.summary.overlong_lines, 50 - 200 / 7 - 1);
    assert_eq!(capped.summary.lines_read, whole.summary.lines_read);
    assert_eq!(capped.records.len(), whole.records.len());
}

#[test]
fn the_line_length_limit_holds_whatever_the_buffering_and_is_reported() {
    // Lines of 10 to 400 bytes, a limit of 200: the same lines are skipped whether a line lies
    // inside one buffer (a big one) or across several (small ones), and the first are said.
    let mut log = String::new();
    for i in 0..40u64 {
        log += &event(
            T0 + i * MS,
            "WARN",
            "p",
            &route_message(i, "attn", 3, true, 1500, &[1, 2, 3]),
            false,
        );
        log += &"y".repeat(i as usize * 10);
        log += "\n";
    }
    let long = log.lines().filter(|l| l.len() > 200).count() as u64;
    assert!(long > 10, "{long}");
    let mut summaries = Vec::new();
    for cap in [8, 64, 1 << 20] {
        let reader = BufReader::with_capacity(cap, log.as_bytes());
        let got = import_reader(
            reader,
            ImportOptions {
                max_line_bytes: 200,
                ..Default::default()
            },
        )
        .expect("read");
        assert_eq!(got.summary.overlong_lines, long, "buffer of {cap} bytes");
        assert!(
            got.summary.first_bad[0]
                .1
                .contains("longer than the limit of 200 bytes"),
            "{:?}",
            got.summary.first_bad
        );
        summaries.push(got.summary);
    }
    assert!(summaries.windows(2).all(|w| w[0] == w[1]), "{summaries:#?}");
}

#[test]
fn distinct_series_past_the_cap_are_left_out_counted_and_said() {
    // One route-trace line per layer, past the cap, and one more line of a known layer.
    let n = SERIES_CAP as u64 + 100;
    let mut log = String::new();
    for layer in 0..n {
        log += &event(
            T0 + layer * MS,
            "WARN",
            "p",
            &route_message(layer, "attn", layer as u32, false, 1500, &[]),
            false,
        );
    }
    log += &event(
        T0 + n * MS,
        "WARN",
        "p",
        &route_message(n, "attn", 7, false, 1500, &[]),
        false,
    );
    let got = import_str(&log);
    assert_eq!(got.records.len(), SERIES_CAP + 1);
    assert_eq!(got.summary.series_cap_dropped, 100);
    assert!(
        got.summary
            .first_bad
            .iter()
            .any(|(_, why)| why.contains("more than 8192 distinct series")),
        "{:?}",
        got.summary.first_bad
    );
}

#[test]
fn an_absurd_probe_time_is_a_bad_line_and_does_not_move_the_run() {
    let mut log = event(
        T0,
        "WARN",
        "p",
        &route_message(1, "attn", 0, false, 1500, &[]),
        false,
    );
    log += &event(
        T0 + MS,
        "WARN",
        "p",
        "GLMTRACE step=2 site=attn L=0 moe=0 bar_us=18446744073709551.615 ids=",
        false,
    );
    let got = import_str(&log);
    assert_eq!(got.records.len(), 1);
    assert_eq!(got.summary.lines_bad, 1);
    assert!(
        got.summary.first_bad[0].1.contains("bar_us"),
        "{:?}",
        got.summary.first_bad
    );
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).expect("compress");
    enc.finish().expect("compress")
}

#[test]
fn gzip_input_is_detected_and_concatenated_members_are_read() {
    let p = [1_000_000, 2_000_000, 300_000, 100_000, 50_000];
    let a = spec_line("a", 4, 3, p);
    let b = event(
        T0,
        "WARN",
        "p",
        &route_message(1, "attn", 3, true, 1500, &[1, 2, 3]),
        false,
    );
    let plain = import_str(&(a.clone() + &b));
    let mut gz = gzip(a.as_bytes());
    gz.extend(gzip(b.as_bytes()));
    let file = import_bytes(&gz, ImportOptions::default());
    assert!(file.summary.gzip);
    assert_eq!(file.records, plain.records);
    assert_eq!(file.summary.bytes_read, (a.len() + b.len()) as u64);
    // A corrupt stream is a read error, not a panic and not silent.
    let mut bad = gzip(a.as_bytes());
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    bad.truncate(bad.len() - 4);
    assert!(matches!(
        import_reader(bad.as_slice(), ImportOptions::default()),
        Err(ImportError::Read { .. })
    ));
    // An empty input is an empty import.
    let empty = import_bytes(b"", ImportOptions::default());
    assert_eq!((empty.records.len(), empty.summary.lines_read), (0, 0));
}

// ---------------------------------------------------------------------------------------------
// The fixtures under import/tests/fixtures/ (see the README there for the numbers).

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The GLM fixture: run 0 plain (tables after 8, 16 and a table after 24 cut mid-row), a
/// restart, run 1 with ANSI colours (tables after 8 and 16); route traces at steps 7, 8 of run
/// 0 and 0, 8 of run 1; unrelated lines between, one of them not UTF-8.
fn glm_fixture() -> Vec<u8> {
    // name, calls per step, time per call per interval (ns), first interval with calls.
    const BUCKETS: [(&str, u64, u64, usize); 11] = [
        ("moe_experts", 60, 41_237, 0),
        ("kda_mixer", 45, 30_411, 0),
        ("dsa_attend", 15, 52_013, 0),
        ("reduce_mlp", 78, 9_876, 0),
        ("reduce_attn", 78, 8_765, 0),
        ("moe_hostsync", 60, 15_007, 1),
        ("reduce_attn_bar", 78, 3_210, 0),
        ("moe_router", 60, 4_321, 0),
        ("mlp_dense", 18, 25_003, 0),
        ("mhc", 78, 2_345, 0),
        ("norm", 156, 1_234, 0),
    ];
    let per_call = |b: usize, run: u64, interval: usize| {
        BUCKETS[b].2 + ((b as u64 * 7 + interval as u64 * 13 + run * 5) % 11) * 37
    };
    let tables = |run: u64, n: usize| -> Vec<String> {
        let mut cum: Vec<(&str, u64, u64)> = BUCKETS.iter().map(|b| (b.0, 0, 0)).collect();
        (0..n)
            .map(|i| {
                for (b, c) in cum.iter_mut().enumerate() {
                    if i >= BUCKETS[b].3 {
                        let calls = 8 * BUCKETS[b].1;
                        c.1 += calls * per_call(b, run, i);
                        c.2 += calls;
                    }
                }
                table_message(8 * (i as u64 + 1), &cum)
            })
            .collect()
    };
    let traces = |t: u64, step: u64, prev: &[u32], ids: &[u32], ansi: bool| -> String {
        let mut s = String::new();
        s += &event(
            t,
            "WARN",
            PROFILE_TARGET,
            &route_message(step, "attn", 0, false, 12_300 + step * 100, prev),
            ansi,
        );
        s += &event(
            t + 310_000,
            "WARN",
            PROFILE_TARGET,
            &route_message(step, "mlp", 0, false, 3_400, prev),
            ansi,
        );
        s += &event(
            t + 2_150_000,
            "WARN",
            PROFILE_TARGET,
            &route_message(step, "attn", 1, true, 8_700, prev),
            ansi,
        );
        s += &event(
            t + 4_020_000,
            "WARN",
            PROFILE_TARGET,
            &route_message(step, "mlp", 1, true, 48_700 - step * 10, ids),
            ansi,
        );
        s
    };
    let ids_a = [3, 17, 42, 101, 7, 88, 250, 12];
    let ids_b = [9, 17, 64, 130, 201, 5, 77, 250];
    let server = "metrale_server";
    let mut log = Vec::new();
    let mut push = |s: &str| log.extend_from_slice(s.as_bytes());
    // Run 0: plain.
    let r0 = tables(0, 3);
    let t = T0;
    push(&event(
        t,
        "INFO",
        server,
        "starting metrale 0.9.3 (pid 4242)",
        false,
    ));
    push(&event(
        t + 120 * MS,
        "INFO",
        "metrale_model_arch::loader",
        "loading GLM-5.3 weights from /models/glm-5.3 (tp=1)",
        false,
    ));
    push(&event(
        t + 3_500 * MS,
        "INFO",
        server,
        "listening on 0.0.0.0:8080",
        false,
    ));
    push(&event(
        t + 3_800 * MS,
        "INFO",
        "metrale_server::http",
        "POST /v1/completions request_id=7f3a prompt_tokens=512",
        false,
    ));
    push(&traces(t + 4_061 * MS, 7, &[], &ids_a, false));
    push(&event(
        t + 4_068 * MS,
        "WARN",
        PROFILE_TARGET,
        &r0[0],
        false,
    ));
    push(&traces(t + 4_070 * MS, 8, &ids_a, &ids_b, false));
    push(&event(
        t + 4_090 * MS,
        "DEBUG",
        "metrale_engine::sched",
        "batch size 1, kv blocks 33/4096",
        false,
    ));
    push(&event(
        t + 4_130 * MS,
        "WARN",
        PROFILE_TARGET,
        &r0[1],
        false,
    ));
    log.extend_from_slice(
        b"2026-09-30T12:00:04.150000Z  INFO metrale_server::http: GET /caf\xe9/health 200\n",
    );
    let mut push = |s: &str| log.extend_from_slice(s.as_bytes());
    // The process dies while the third table is written: header, five rows, half a row.
    let third = event(t + 4_190 * MS, "WARN", PROFILE_TARGET, &r0[2], false);
    let kept: Vec<&str> = third.lines().take(7).collect();
    push(&kept[..6].join("\n"));
    push("\n");
    push(&kept[6][..24]);
    push("\n");
    // Run 1: a restart, with ANSI colours.
    let r1 = tables(1, 2);
    let t = T0 + 300_000 * MS;
    push(&event(
        t,
        "INFO",
        server,
        "starting metrale 0.9.3 (pid 4311)",
        true,
    ));
    push(&event(
        t + 3_400 * MS,
        "INFO",
        server,
        "listening on 0.0.0.0:8080",
        true,
    ));
    push(&traces(t + 4_000 * MS, 0, &[], &ids_b, true));
    push(&event(t + 4_060 * MS, "WARN", PROFILE_TARGET, &r1[0], true));
    push(&traces(t + 4_062 * MS, 8, &ids_b, &ids_a, true));
    push(&event(t + 4_120 * MS, "WARN", PROFILE_TARGET, &r1[1], true));
    push(&event(
        t + 9_000 * MS,
        "INFO",
        server,
        "shutting down: SIGTERM",
        true,
    ));
    log
}

/// The speculative fixture: plain stderr, no timestamps; four `glm5-phase` and two `mtp-phase`
/// bursts, each with its level-2 line, among unrelated lines.
fn spec_fixture() -> String {
    let mut log = String::new();
    log += "metrale-spec 0.4.1: loading /models/glm-5.3 (draft: mtp head)\n";
    log += "[spec-trace] MEMRA_SPEC_TRACE=2 overrides MEMRA_GLM5_SPEC_TRACE=1 (the general flag wins; unset one to silence this)\n";
    log += "warmup: 3 requests\n";
    let burst = |tag: &str, rounds: u64, k: u32, seed: u64, mixers: bool| {
        let p = [
            rounds * (412_345 + seed * 1_111),
            rounds * (2_101_987 + seed * 7_777),
            rounds * (98_765 + seed * 333),
            rounds * (45_678 + seed * 99),
            rounds * (23_456 + seed * 55),
        ];
        let (kda, scan, mla, ffn) = if mixers {
            (
                rounds * (801_234 + seed * 1_000),
                rounds * 123_456,
                rounds * (402_468 + seed * 500),
                rounds * 612_345,
            )
        } else {
            (0, 0, 0, 0)
        };
        let mut s = spec_line(tag, rounds, k, p);
        s += &verify_line(&format!("{tag}-v"), rounds, k, p[1], [kda, scan, mla, ffn]);
        s
    };
    log += &burst("glm5-phase", 16, 4, 0, true);
    log += "request 1 done: 128 tokens in 1.84 s\n";
    log += &burst("glm5-phase", 16, 4, 1, true);
    log += &burst("mtp-phase", 8, 2, 2, false);
    log += "warning: kv cache 91% full\n";
    log += &burst("glm5-phase", 5, 4, 3, true);
    log += &burst("mtp-phase", 8, 2, 4, false);
    log += &burst("glm5-phase", 16, 4, 5, true);
    log += "shutdown: 4 requests, 0 errors\n";
    log
}

#[test]
#[ignore = "writes the fixtures; run after changing their generators"]
fn write_fixtures() {
    std::fs::write(fixture("glm_run_tracing.log"), glm_fixture()).expect("write");
    std::fs::write(fixture("glm_run_tracing.log.gz"), gzip(&glm_fixture())).expect("write");
    std::fs::write(fixture("spec_phases_stderr.log"), spec_fixture()).expect("write");
}

#[test]
fn the_fixtures_are_what_their_generators_write() {
    assert_eq!(
        std::fs::read(fixture("glm_run_tracing.log")).expect("read"),
        glm_fixture()
    );
    assert_eq!(
        std::fs::read_to_string(fixture("spec_phases_stderr.log")).expect("read"),
        spec_fixture()
    );
}

/// 2026-09-30T13:00:00Z, the `--start` the README uses for the speculative fixture.
const SPEC_START: u64 = T0 + 3_600_000 * MS;

/// What the writers make of both fixtures, as (length, FNV-1a digest) of the OpenMetrics text
/// and of the OTLP/JSON metrics and trace requests: any change of spelling, escaping, order or
/// chunking shows here. The line writers are the live exporters' (`phasetrace-encode`); after a
/// change that is meant, put the new figures in.
#[test]
fn the_fixtures_write_the_bytes_they_always_wrote() {
    let files: Vec<ImportedFile> = [
        ("glm_run_tracing.log", None),
        ("spec_phases_stderr.log", Some(SPEC_START)),
    ]
    .into_iter()
    .map(|(name, start)| {
        let options = ImportOptions {
            source_file: name.into(),
            start_unix_nanos: start,
            ..Default::default()
        };
        import_path(&fixture(name), options).expect("import")
    })
    .collect();
    let digest = |bytes: &[u8]| {
        let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        (bytes.len(), format!("{h:016x}"))
    };
    let (rank, group) = (3, "g\"1".to_owned());
    let mut om = Vec::new();
    let options = openmetrics::OpenMetricsOptions {
        rank,
        group: group.clone(),
        ..Default::default()
    };
    openmetrics::write_openmetrics(&mut om, &files, &options).expect("openmetrics");
    let options = otlp::OtlpOptions {
        rank,
        group,
        max_items_per_request: 37,
        ..Default::default()
    };
    let mut json = Vec::new();
    otlp::metrics_requests(&files, &options, |r, _| {
        otlp::write_json_line(&mut json, &r)
    })
    .expect("metrics");
    otlp::trace_requests(&files, &options, |r, _| {
        otlp::write_json_line(&mut json, &r)
    })
    .expect("traces");
    assert_eq!(
        [digest(&om), digest(&json)],
        [
            (84_893, "c1e18a094e1ffa06".to_owned()),
            (137_809, "28a248287db024fc".to_owned())
        ]
    );
}

#[test]
fn the_glm_fixture_imports_to_the_numbers_in_its_readme() {
    // (run, bucket) -> (summed total_ns, summed calls) over the run's intervals.
    const WANT: [(u32, &str, u64, u64); 22] = [
        (0, "dsa_attend", 18_792_000, 360),
        (0, "kda_mixer", 33_048_000, 1_080),
        (0, "mhc", 3_369_600, 1_248),
        (0, "mlp_dense", 7_228_800, 288),
        (0, "moe_experts", 59_472_000, 1_440),
        (0, "moe_hostsync", 7_280_000, 480),
        (0, "moe_router", 4_320_000, 960),
        (0, "norm", 3_520_000, 2_496),
        (0, "reduce_attn", 17_035_200, 1_872),
        (0, "reduce_attn_bar", 4_240_000, 1_248),
        (0, "reduce_mlp", 18_720_000, 1_872),
        (1, "dsa_attend", 12_560_000, 240),
        (1, "kda_mixer", 21_960_000, 720),
        (1, "mhc", 3_120_000, 1_248),
        (1, "mlp_dense", 7_280_000, 288),
        (1, "moe_experts", 39_840_000, 960),
        (1, "moe_hostsync", 7_344_000, 480),
        (1, "moe_router", 4_320_000, 960),
        (1, "norm", 3_520_000, 2_496),
        (1, "reduce_attn", 10_982_400, 1_248),
        (1, "reduce_attn_bar", 4_240_000, 1_248),
        (1, "reduce_mlp", 12_560_000, 1_248),
    ];
    for name in ["glm_run_tracing.log", "glm_run_tracing.log.gz"] {
        let file = import_path(
            &fixture(name),
            ImportOptions {
                source_file: "glm".into(),
                ..Default::default()
            },
        )
        .expect("import");
        let s = &file.summary;
        assert_eq!(s.gzip, name.ends_with(".gz"));
        assert_eq!(
            (s.lines_read, s.bytes_read, s.timestamped_lines),
            (82, 7_884, 30),
            "{name}"
        );
        assert_eq!(s.runs, 2);
        assert_eq!(
            s.records_per_format,
            FormatCounts {
                tables: 5,
                section_intervals: 47,
                route_traces: 16,
                spec_bursts: 0,
                verify_splits: 0
            }
        );
        assert_eq!(
            (s.truncated_tables, s.lines_bad, s.lines_skipped),
            (1, 1, 1)
        );
        assert_eq!(s.non_utf8_lines, 1);
        let bad_lines: Vec<u64> = s.first_bad.iter().map(|b| b.0).collect();
        assert_eq!(bad_lines, vec![46, 40]);
        let got = sums(&file);
        assert_eq!(got.len(), WANT.len());
        for (run, bucket, ns, calls) in WANT {
            assert_eq!(
                got[&(run, bucket.to_owned())],
                (ns, calls),
                "{name} run {run} {bucket}"
            );
        }
        let steps: Vec<(u32, u64, u64, u64)> = file
            .records
            .iter()
            .filter_map(|r| match r {
                ImportRecord::DecodeSteps {
                    run,
                    at,
                    steps,
                    steps_in_interval,
                    ..
                } => Some((
                    *run,
                    at.map_or(0, |a| (a - T0) / MS),
                    *steps,
                    *steps_in_interval,
                )),
                _ => None,
            })
            .collect();
        assert_eq!(
            steps,
            vec![
                (0, 4_068, 8, 8),
                (0, 4_130, 16, 8),
                (0, 4_190, 24, 8),
                (1, 304_060, 8, 8),
                (1, 304_120, 16, 8)
            ]
        );
        let bar: Vec<u64> = file
            .records
            .iter()
            .filter_map(|r| match r {
                ImportRecord::RouteTrace { bar_ns, .. } => Some(*bar_ns),
                _ => None,
            })
            .collect();
        assert_eq!((bar.len(), bar.iter().sum::<u64>()), (16, 294_400));
        assert_eq!(
            file.records.last().and_then(ImportRecord::at),
            Some(T0 + 304_120 * MS)
        );
    }
}

#[test]
fn the_spec_fixture_imports_to_the_numbers_in_its_readme() {
    let options = ImportOptions {
        start_unix_nanos: Some(SPEC_START),
        ..Default::default()
    };
    let file = import_path(&fixture("spec_phases_stderr.log"), options).expect("import");
    let s = &file.summary;
    assert_eq!(
        (s.lines_read, s.bytes_read, s.timestamped_lines),
        (18, 2_047, 0)
    );
    assert_eq!(s.records_per_format.spec_bursts, 6);
    assert_eq!(s.records_per_format.verify_splits, 6);
    assert_eq!((s.lines_bad, s.lines_skipped), (0, 0));
    assert_eq!(s.synthetic_ns_total, 186_593_000);
    // tag -> (rounds, phase sums, verify part sums), in the order of the lines.
    let mut per_tag = std::collections::BTreeMap::<String, (u64, [u64; 5], [u64; 5])>::new();
    for r in &file.records {
        match r {
            ImportRecord::SpecBurst {
                tag,
                rounds,
                phases: p,
                ..
            } => {
                let e = per_tag.entry(tag.clone()).or_default();
                e.0 += rounds;
                let v = [
                    p.draft_ns,
                    p.verify_ns,
                    p.accept_ns,
                    p.rollback_ns,
                    p.maint_ns,
                ];
                e.1.iter_mut().zip(v).for_each(|(a, v)| *a += v);
            }
            ImportRecord::VerifySplit { tag, parts: p, .. } => {
                let e = per_tag
                    .entry(tag.trim_end_matches("-v").to_owned())
                    .or_default();
                let v = [p.kda_ns, p.kda_scan_ns, p.mla_ns, p.rest_ns, p.ffn_ns];
                e.2.iter_mut().zip(v).for_each(|(a, v)| *a += v);
            }
            _ => panic!("{r:?}"),
        }
    }
    assert_eq!(
        per_tag["glm5-phase"],
        (
            53,
            [21_986_000, 112_265_000, 5_278_000, 2_430_000, 1_256_000],
            [42_564_000, 6_519_000, 21_380_000, 48_313_000, 32_436_000]
        )
    );
    assert_eq!(
        per_tag["mtp-phase"],
        (
            16,
            [6_655_000, 34_008_000, 1_595_000, 736_000, 384_000],
            [0, 0, 0, 34_008_000, 0]
        )
    );
    let at: Vec<u64> = file
        .records
        .iter()
        .filter_map(|r| match r {
            ImportRecord::SpecBurst { at, .. } => at.map(|a| a - SPEC_START),
            _ => None,
        })
        .collect();
    assert_eq!(
        at,
        vec![
            42_916_000,
            85_992_000,
            107_611_000,
            121_166_000,
            142_925_000,
            186_593_000
        ]
    );
    let filtered = import_path(
        &fixture("spec_phases_stderr.log"),
        ImportOptions {
            tags: vec!["mtp-phase".into()],
            start_unix_nanos: Some(SPEC_START),
            ..Default::default()
        },
    )
    .expect("import");
    assert_eq!(filtered.records.len(), 4);
    assert_eq!(filtered.summary.lines_filtered, 8);
}

// ---------------------------------------------------------------------------------------------
// Property tests: the parsers never panic.

fn valid_lines() -> Vec<Vec<u8>> {
    let t = [("moe_experts", 8_000_000, 480), ("norm", 1_000_000, 1248)];
    let p = [1_000_000, 2_000_000, 300_000, 100_000, 50_000];
    let mut v: Vec<Vec<u8>> = table_message(8, &t)
        .lines()
        .map(|l| l.as_bytes().to_vec())
        .collect();
    v.push(
        event(
            T0,
            "WARN",
            "p",
            &route_message(7, "attn", 1, true, 12_300, &[3, 17, 250]),
            true,
        )
        .into_bytes(),
    );
    v.push(spec_line("glm5-phase", 16, 4, p).into_bytes());
    v.push(
        verify_line(
            "glm5-phase-v",
            16,
            4,
            p[1],
            [500_000, 100_000, 400_000, 700_000],
        )
        .into_bytes(),
    );
    v
}

/// Imports arbitrary bytes: a read error is allowed only for input that starts like gzip.
fn import_any(data: &[u8], options: ImportOptions) -> Option<ImportedFile> {
    match import_reader(data, options) {
        Ok(file) => Some(file),
        Err(ImportError::Read { .. }) if data.first() == Some(&0x1f) => None,
        Err(e) => panic!("{e}"),
    }
}

fn check_invariants(file: &ImportedFile) {
    let s = &file.summary;
    assert!(s.first_bad.len() <= MAX_FIRST_BAD);
    assert!(s.lines_bad + s.lines_filtered <= s.lines_skipped);
    let mut last = None;
    for r in &file.records {
        if let Some(at) = r.at() {
            assert!(last.is_none_or(|l| l <= at));
            last = Some(at);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Some(file) = import_any(&data, ImportOptions::default()) {
            check_invariants(&file);
            let lines = data.split(|&b| b == b'\n').count() as u64
                - u64::from(data.ends_with(b"\n") || data.is_empty());
            prop_assert_eq!(file.summary.lines_read, lines);
            prop_assert_eq!(file.summary.bytes_read, data.len() as u64);
        }
    }

    #[test]
    fn mutated_valid_lines_never_panic(
        picks in prop::collection::vec(0usize..16, 1..8),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..5, any::<u8>()), 0..6),
    ) {
        let valid = valid_lines();
        let mut data = Vec::new();
        for p in picks {
            data.extend_from_slice(&valid[p % valid.len()]);
            data.push(b'\n');
        }
        for (at, kind, byte) in edits {
            if data.is_empty() {
                break;
            }
            let i = at.index(data.len());
            match kind {
                0 => data[i] = byte,
                1 => { data.remove(i); }
                2 => data.insert(i, byte),
                3 => data.splice(i..i, b"99999999999999999999".iter().copied()).for_each(drop),
                _ => data.truncate(i),
            }
        }
        if let Some(file) = import_any(&data, ImportOptions::default()) {
            check_invariants(&file);
        }
        let file = import_bytes(&gzip(&data), ImportOptions::default());
        check_invariants(&file);
    }
}

/// Inputs that once broke a parser, or sit on an edge of one; kept so that they stay fixed.
#[test]
fn regression_corpus_never_panics() {
    let corpus: &[&[u8]] = &[
        b"",
        b"\n",
        b"\x1f",
        b"\x1f\x8b",
        b"\x1b[",
        b"\x1b[2m",
        b"G",
        b"GLMTRACE ",
        b"GLM decode profile after ",
        b"]",
        b"] rounds=",
        b"[] rounds=1 k=1",
        b"[a] rounds=1 k=1 |",
        b"[a] rounds=1 k=1 | per-round ms: vkda=1 (scan=1",
        b"GLM decode profile after 8 steps \xe2\x80\x94 0.00 ms/token\n  a 0.00 ms/tok 0.0% 0 calls/tok 0.0 us/call",
        b"GLM decode profile after 1 steps - 0.01 ms/token\n  a 0.01 ms/tok 100.0% 18446744073709551615 calls/tok 0.0 us/call",
        b"GLM decode profile after 18446744073709551615 steps - 0.01 ms/token\n  a 0.01 ms/tok 1.0% 1 calls/tok 0.1 us/call",
        b"2026-09-30T12:00:00.0000000000000000000000Z x",
        b"9999-99-99T99:99:99Z x",
        b"2500-12-31T23:59:60.999999999+23:59 x",
        b"1970-01-01T00:00:00-23:59 x",
        b"  x 1 ms/tok 1% 1 calls/tok 1 us/call",
        b"GLM decode profile after 18446744073709551615 steps - 18446744073709.55 ms/token\n  a 18446744073709.55 ms/tok 100.0% 18446744073709551615 calls/tok 0.1 us/call",
        b"GLM decode profile after 18446744073709551615 steps - 1.00 ms/token\n  a 18446744073709.55 ms/tok 100.0% 1 calls/tok 18446744073709551.6 us/call",
    ];
    for input in corpus {
        for start in [None, Some(u64::MAX)] {
            let options = ImportOptions {
                start_unix_nanos: start,
                ..Default::default()
            };
            if let Some(file) = import_any(input, options) {
                check_invariants(&file);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The OpenMetrics backfill through promtool.

/// Backfills both fixtures with `promtool tsdb create-blocks-from openmetrics` and reads exact
/// values back with `promtool tsdb dump`. promtool is found as every other test finds it
/// (`$PHASETRACE_PROMTOOL_BIN`, `.tools/bin`, then `PATH`); without it the test is skipped,
/// except under CI or `PHASETRACE_REQUIRE_TOOLS=1`, where it fails.
#[test]
fn promtool_backfills_the_fixtures_with_exact_values() {
    phasetrace_testkit::require_tools!(Promtool);
    let promtool = phasetrace_testkit::promtool_binary();
    let glm = import_path(
        &fixture("glm_run_tracing.log"),
        ImportOptions {
            source_file: "glm_run_tracing.log".into(),
            ..Default::default()
        },
    )
    .expect("import");
    let spec = import_path(
        &fixture("spec_phases_stderr.log"),
        ImportOptions {
            source_file: "spec_phases_stderr.log".into(),
            start_unix_nanos: Some(SPEC_START),
            ..Default::default()
        },
    )
    .expect("import");
    let dir = std::env::temp_dir().join(format!("phasetrace-promtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let om = dir.join("fixtures.om");
    let mut out = std::fs::File::create(&om).expect("create");
    let stats =
        openmetrics::write_openmetrics(&mut out, &[glm, spec], &Default::default()).expect("write");
    // 82 series: 22 section durations, 2 step counters, 4 wait histograms (site, no layer), and
    // per (site, layer) of each run 4 per-layer counters (section and wait, time and calls);
    // 20 phase and verify-part summaries, 2 round counters. 510 samples: the 257 of the
    // records' points without the per-layer counters (8 + 8 points a run), 64 of the per-layer
    // counters, a 0 at the run's start of each series (2 samples a summary, 1 a counter: 128),
    // and the totals at the run's end of the series of event lines that ended before it (the
    // 2 wait histograms and 16 per-layer counters of each GLM run, 2 x 20 samples; mtp-phase's
    // 10 summaries and 1 counter, 21 samples).
    assert_eq!((stats.series, stats.samples), (82, 510));
    let db = dir.join("tsdb");
    let run = |args: &[&std::ffi::OsStr]| {
        let output = std::process::Command::new(&promtool)
            .args(args)
            .output()
            .expect("run promtool");
        assert!(
            output.status.success(),
            "promtool {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    run(&[
        "tsdb".as_ref(),
        "create-blocks-from".as_ref(),
        "openmetrics".as_ref(),
        om.as_os_str(),
        db.as_os_str(),
    ]);
    // `tsdb dump` opens the directory as a database, which needs a (here empty) WAL.
    std::fs::create_dir_all(db.join("wal")).expect("wal dir");
    let dump = run(&["tsdb".as_ref(), "dump".as_ref(), db.as_os_str()]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(dump.lines().count(), 510);
    for want in [
        r#"{__name__="phasetrace_section_duration_seconds_sum", bucket="moe_experts", group="default", rank="0", source_file="glm_run_tracing.log", source_run="0"} 0.059472 1790769604190"#,
        r#"{__name__="phasetrace_section_duration_seconds_count", bucket="moe_experts", group="default", rank="0", source_file="glm_run_tracing.log", source_run="1"} 960 1790769904120"#,
        // A probe bucket's row carries its site, as the live probe section does.
        r#"{__name__="phasetrace_section_duration_seconds_count", bucket="reduce_attn_bar", group="default", rank="0", site="attn", source_file="glm_run_tracing.log", source_run="0"} 1248 1790769604130"#,
        r#"{__name__="phasetrace_steps_total", group="default", rank="0", source_file="glm_run_tracing.log", source_run="0"} 24 1790769604190"#,
        // The wait histogram has no layer: run 1's four mlp probes (layers 0 and 1, steps 0
        // and 8).
        r#"{__name__="phasetrace_collective_wait_seconds_count", group="default", rank="0", site="mlp", source_file="glm_run_tracing.log", source_run="1"} 4 1790769904066"#,
        // Per layer: layer 1's mlp probes of run 1, 48.7 + 48.6 us.
        r#"{__name__="phasetrace_collective_layer_wait_calls_total", group="default", layer="1", rank="0", site="mlp", source_file="glm_run_tracing.log", source_run="1"} 2 1790769904066"#,
        r#"{__name__="phasetrace_collective_layer_wait_time_seconds_total", group="default", layer="1", rank="0", site="mlp", source_file="glm_run_tracing.log", source_run="1"} 9.73e-05 1790769904066"#,
        r#"{__name__="phasetrace_section_layer_calls_total", bucket="reduce_mlp_bar", group="default", layer="1", rank="0", site="mlp", source_file="glm_run_tracing.log", source_run="1"} 2 1790769904066"#,
        r#"{__name__="phasetrace_section_layer_time_seconds_total", bucket="reduce_mlp_bar", group="default", layer="1", rank="0", site="mlp", source_file="glm_run_tracing.log", source_run="1"} 9.73e-05 1790769904066"#,
        r#"{__name__="phasetrace_spec_phase_duration_seconds_sum", group="default", phase="verify", rank="0", source_file="spec_phases_stderr.log", source_run="0", tag="glm5-phase"} 0.112265 1790773200186"#,
        r#"{__name__="phasetrace_spec_rounds_total", group="default", rank="0", source_file="spec_phases_stderr.log", source_run="0", tag="mtp-phase"} 16 1790773200142"#,
        r#"{__name__="phasetrace_spec_verify_part_duration_seconds_sum", group="default", part="kda", rank="0", source_file="spec_phases_stderr.log", source_run="0", tag="glm5-phase-v"} 0.042564 1790773200186"#,
        // Run 0 of the speculative log starts at its --start: every series begins there at 0.
        r#"{__name__="phasetrace_spec_rounds_total", group="default", rank="0", source_file="spec_phases_stderr.log", source_run="0", tag="mtp-phase"} 0 1790773200000"#,
    ] {
        assert!(
            dump.lines().any(|l| l == want),
            "missing from the dump: {want}"
        );
    }
    // No series has a layer unless it is a per-layer counter; each begins at 0 and only grows.
    let mut series: std::collections::BTreeMap<&str, Vec<(u64, f64)>> = Default::default();
    for line in dump.lines() {
        let (labels, rest) = line.rsplit_once('}').expect("labels");
        let mut fields = rest.split_whitespace();
        let value: f64 = fields.next().and_then(|v| v.parse().ok()).expect("value");
        let at: u64 = fields.next().and_then(|v| v.parse().ok()).expect("time");
        series.entry(labels).or_default().push((at, value));
    }
    assert_eq!(
        series.len(),
        36 + 2 * 46,
        "one per counter, two per summary"
    );
    for (labels, samples) in &series {
        let per_layer = labels.contains("_layer_");
        assert_eq!(labels.contains(" layer=\""), per_layer, "{labels}");
        assert_eq!(samples[0].1, 0.0, "{labels} starts at 0");
        assert!(
            samples
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{labels}: {samples:?}"
        );
    }
}
