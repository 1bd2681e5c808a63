//! Bad input never panics and never leaks a secret: a bad flag is a usage error (exit 2), a bad
//! environment value or profile file is a configuration error (exit 3) that names the variable,
//! the value and what is accepted, header values are never printed, and a Prometheus port that
//! is taken is a clear error naming `PHASETRACE_PROMETHEUS`.

use crate::cli;

use std::net::TcpListener;
use std::time::Duration;

use cli::{Finished, phasetrace};

const RUN: Duration = Duration::from_secs(30);

/// A demo that would finish at once if it started.
const TINY_DEMO: [&str; 9] = [
    "demo",
    "--steps",
    "1",
    "--ranks",
    "1",
    "--layers",
    "1",
    "--prometheus",
    "off",
];

fn assert_no_panic(run: &Finished) {
    assert!(!run.all().contains("panicked"), "{run}");
    assert!(!run.all().contains("RUST_BACKTRACE"), "{run}");
}

fn tiny_demo_with(extra: &[&str]) -> Vec<&'static str> {
    let mut args: Vec<&'static str> = TINY_DEMO.to_vec();
    for e in extra {
        args.push(Box::leak(e.to_string().into_boxed_str()));
    }
    args
}

#[test]
fn bad_flags_are_usage_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["demo", "--ranks", "0"], "--ranks"),
        (&["demo", "--ranks", "65"], "--ranks"),
        (&["demo", "--layers", "0"], "--layers"),
        (
            &["demo", "--level", "9"],
            "off, 0, full, 1, collectives or 2",
        ),
        (
            &["demo", "--spec-level", "3"],
            "expected off, 0, phases, 1, verify or 2",
        ),
        (
            &["check", "--otlp-protocol", "http/json"],
            "grpc or http/protobuf",
        ),
        (
            &["check", "--expert-counter", "maybe"],
            "expected on, off, true, false, 1 or 0",
        ),
        (
            &["check", "--trace-slower-than", "p101"],
            "expected a duration with a unit",
        ),
        (&["demo", "--steps", "many"], "--steps"),
        (&["demo", "--no-such-flag"], "--no-such-flag"),
        // Only this rank of the group runs here: it needs the address to meet the others at.
        (&["demo", "--rank", "1"], "--rendezvous"),
        (&["demo", "--rendezvous", "127.0.0.1:29500"], "--rank"),
        // The steps before a hang mean nothing without the rank that hangs.
        (&["demo", "--hang-after-steps", "5"], "--hang-rank"),
        (
            &["demo", "--group", "a/b"],
            "expected a group name of letters, digits",
        ),
        (&["frobnicate"], "frobnicate"),
        (&[], "Usage"),
    ];
    for (args, mentions) in cases {
        let run = phasetrace(args, &[], RUN);
        assert_eq!(run.code, Some(2), "phasetrace {args:?}: {run}");
        assert!(
            run.stderr.contains(mentions),
            "phasetrace {args:?} should mention {mentions:?}: {run}"
        );
        assert_no_panic(&run);
    }
}

#[test]
fn help_lists_the_exit_codes() {
    let run = phasetrace(&["demo", "--help"], &[], RUN);
    assert_eq!(run.code, Some(0), "{run}");
    for line in [
        "2  bad command-line usage",
        "3  invalid configuration",
        "4  check failed",
    ] {
        assert!(run.stdout.contains(line), "{line:?} missing: {run}");
    }
}

#[test]
fn bad_environment_values_are_configuration_errors_naming_variable_value_and_accepted() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "PHASETRACE_LEVEL",
            "7",
            "PHASETRACE_LEVEL=\"7\": expected off, 0, full, 1, collectives or 2",
        ),
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "http/json",
            "OTEL_EXPORTER_OTLP_PROTOCOL=\"http/json\": expected grpc or http/protobuf",
        ),
        (
            "PHASETRACE_QUEUE",
            "5",
            "PHASETRACE_QUEUE=\"5\": expected a whole number of records from 64 to 16777216",
        ),
        (
            "PHASETRACE_TRACE_EVERY",
            "-1",
            "PHASETRACE_TRACE_EVERY=\"-1\": expected a whole number",
        ),
        (
            "PHASETRACE_TRACE_SLOWER_THAN",
            "fast",
            "PHASETRACE_TRACE_SLOWER_THAN=\"fast\": expected a duration with a unit (25ms, 1.5s, 800us), a percentile of this rank's recent steps from p0.1 to p99.9 (p99), or off",
        ),
        (
            "PHASETRACE_TRACE_SLOWER_THAN",
            "p0",
            "PHASETRACE_TRACE_SLOWER_THAN=\"p0\": expected a duration with a unit",
        ),
        (
            "PHASETRACE_TRACE_SLOWER_THAN",
            "p101",
            "PHASETRACE_TRACE_SLOWER_THAN=\"p101\": expected a duration with a unit",
        ),
        (
            "PHASETRACE_TRACE_SLOWER_THAN",
            "-3ms",
            "PHASETRACE_TRACE_SLOWER_THAN=\"-3ms\": expected a duration with a unit",
        ),
        (
            "PHASETRACE_TRACE_SLOW_BUDGET",
            "0",
            "PHASETRACE_TRACE_SLOW_BUDGET=\"0\": expected a whole number of tail traces a second per rank, from 1 to 10000",
        ),
        (
            "PHASETRACE_PROMETHEUS",
            "nowhere",
            "PHASETRACE_PROMETHEUS=\"nowhere\": expected a listen address",
        ),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "localhost:4317",
            "OTEL_EXPORTER_OTLP_ENDPOINT=\"localhost:4317\": expected an http:// or https:// URL",
        ),
        (
            "PHASETRACE_TIMING",
            "gpu",
            "PHASETRACE_TIMING=\"gpu\": expected host, sync or events",
        ),
        (
            "PHASETRACE_GROUP",
            "tp 0",
            "PHASETRACE_GROUP=\"tp 0\": expected a group name of letters, digits, '_', '-', '.' or ':' (at most 64 bytes)",
        ),
    ];
    // The demo without `--prometheus off`, which would hide a bad PHASETRACE_PROMETHEUS.
    let demo = ["demo", "--steps", "1", "--ranks", "1", "--layers", "1"];
    for (var, value, message) in cases {
        for command in [&["check"][..], &demo[..]] {
            let run = phasetrace(command, &[(var, value)], RUN);
            assert_eq!(run.code, Some(3), "{var}={value} {command:?}: {run}");
            assert!(
                run.stderr.contains("phasetrace: invalid configuration: "),
                "{run}"
            );
            assert!(
                run.stderr.contains(message),
                "{var}={value} {command:?}: expected {message:?} in {run}"
            );
            assert_no_panic(&run);
        }
    }
}

#[test]
fn an_env_value_is_checked_even_when_a_flag_overrides_it() {
    // The flag wins over the variable, but a broken variable is still reported: it would break
    // the next run that does not pass the flag.
    let run = phasetrace(
        &["check", "--level", "full", "--prometheus", "off"],
        &[("PHASETRACE_LEVEL", "7")],
        RUN,
    );
    assert_eq!(run.code, Some(3), "{run}");
    assert!(run.stderr.contains("PHASETRACE_LEVEL=\"7\""), "{run}");
}

#[test]
fn a_bad_profile_file_is_a_configuration_error_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("phasetrace-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let not_json = write("not-json.json", "{ kda_mixer: 3 ");
    let unknown = write("unknown.json", r#"{"warp_drive": {"mean_us": 5}}"#);
    let negative = write("negative.json", r#"{"kda_front": {"mean_us": -5}}"#);
    let bad_cv = write(
        "bad-cv.json",
        r#"{"kda_front": {"mean_us": 5, "cv": "wide"}}"#,
    );
    let array = write("array.json", "[1, 2]");
    let missing = dir.join("missing.json").display().to_string();
    let cases: Vec<(String, &str)> = vec![
        (not_json.clone(), "not JSON"),
        (
            unknown.clone(),
            "unknown bucket \"warp_drive\"; expected one of",
        ),
        (
            negative,
            "kda_front.mean_us: expected a non-negative number",
        ),
        (bad_cv, "kda_front.cv: expected a non-negative number"),
        (array, "expected a JSON object keyed by bucket name"),
        (missing.clone(), "cannot read"),
    ];
    for (path, message) in &cases {
        let run = phasetrace(&tiny_demo_with(&["--profile", path]), &[], RUN);
        assert_eq!(run.code, Some(3), "--profile {path}: {run}");
        assert!(
            run.stderr
                .contains(&format!("invalid configuration: --profile {path}: ")),
            "{run}"
        );
        assert!(run.stderr.contains(message), "{message:?} missing: {run}");
        assert_no_panic(&run);
    }
    // A good profile runs.
    let good = write("good.json", r#"{"kda_front": {"mean_us": 5, "cv": 0.2}}"#);
    let run = phasetrace(&tiny_demo_with(&["--profile", &good]), &[], RUN);
    assert_eq!(run.code, Some(0), "{run}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn other_bad_demo_numbers_are_configuration_errors() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--time-scale", "0"],
            "--time-scale 0: expected a positive number",
        ),
        (
            &["--acceptance", "1.5"],
            "--acceptance 1.5: expected a probability",
        ),
        (
            &["--straggler-factor", "0.5"],
            "--straggler-factor 0.5: expected a number of at least 1",
        ),
        (
            &["--straggler-rank", "1"],
            "--straggler-rank 1: expected a rank below --ranks 1",
        ),
        (
            &["--hang-rank", "1"],
            "--hang-rank 1: expected a rank below --ranks 1",
        ),
        (
            &["--duration", "0"],
            "--duration 0: expected a positive number",
        ),
        (
            &["--route-skew", "0"],
            "--route-skew 0: expected a positive number (1: uniform routing)",
        ),
        (
            &["--expert-parallel", "2"],
            "--expert-parallel 2: expected at most --ranks 1 and at most --experts 64",
        ),
        (
            &["--rank", "1", "--rendezvous", "127.0.0.1:1"],
            "--rank 1: expected a rank below --ranks 1",
        ),
        (
            &[
                "--rank",
                "0",
                "--rendezvous",
                "127.0.0.1:1",
                "--rendezvous-timeout",
                "0",
            ],
            "--rendezvous-timeout 0: expected a positive number of seconds",
        ),
        (
            &["--kv-blocks", "10"],
            "--kv-blocks 10: a request of three times --prompt-tokens and --max-output-tokens needs 58 blocks of --kv-block-size 16; expected at least 58",
        ),
    ];
    for (extra, message) in cases {
        let run = phasetrace(&tiny_demo_with(extra), &[], RUN);
        assert_eq!(run.code, Some(3), "{extra:?}: {run}");
        assert!(run.stderr.contains(message), "{message:?} missing: {run}");
        assert_no_panic(&run);
    }
}

#[test]
fn header_values_are_never_printed() {
    // A dead endpoint: `check` prints the whole configuration, then fails its probe.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let endpoint = format!("http://127.0.0.1:{dead}");
    let run = phasetrace(
        &["check", "--timeout-ms", "500"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "api-key=topsecret,x-tenant=hushhush",
            ),
        ],
        RUN,
    );
    assert_eq!(run.code, Some(4), "{run}");
    assert!(run.stdout.contains("api-key=****,x-tenant=****"), "{run}");
    assert!(!run.all().contains("topsecret"), "{run}");
    assert!(!run.all().contains("hushhush"), "{run}");

    // A malformed list is an error that names the variable but not the values.
    let run = phasetrace(
        &["check"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key:topsecret"),
        ],
        RUN,
    );
    assert_eq!(run.code, Some(3), "{run}");
    assert!(run.stderr.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{run}");
    assert!(!run.all().contains("topsecret"), "{run}");
    assert_no_panic(&run);

    // The demo, which exports with the headers, does not print them either.
    let run = phasetrace(
        &TINY_DEMO,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=topsecret"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "200"),
        ],
        RUN,
    );
    assert!(!run.all().contains("topsecret"), "{run}");
    assert_no_panic(&run);
}

#[test]
fn a_taken_default_port_is_a_warning_in_check_not_a_failure() {
    // Hold the default port (or find it held by another process: taken either way). The demo
    // itself runs without it (the_default_prometheus_endpoint_follows_local_rank_...).
    let _held = TcpListener::bind("127.0.0.1:9464");
    let check = phasetrace(&["check"], &[], RUN);
    assert_eq!(check.code, Some(0), "{check}");
    assert!(
        check
            .stdout
            .contains("warn  Prometheus: the default endpoint 127.0.0.1:9464 cannot listen there"),
        "{check}"
    );
    assert!(
        check.stdout.contains("the profiler runs without it"),
        "{check}"
    );
    assert_no_panic(&check);
}

#[test]
fn a_taken_prometheus_port_is_a_clear_error_not_a_panic() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();

    // As a flag and as the variable.
    let demo = ["demo", "--steps", "1", "--ranks", "1", "--layers", "1"];
    let by_flag = {
        let mut args = demo.to_vec();
        args.extend(["--prometheus", &addr]);
        phasetrace(&args, &[], RUN)
    };
    let by_env = phasetrace(&demo, &[("PHASETRACE_PROMETHEUS", &addr)], RUN);
    for run in [by_flag, by_env] {
        // Exit 1: an exporter could not start.
        assert_eq!(run.code, Some(1), "{run}");
        assert!(
            run.stderr.contains(&format!(
                "PHASETRACE_PROMETHEUS={addr}: cannot listen there"
            )),
            "{run}"
        );
        assert!(run.stderr.contains("or off"), "{run}");
        assert!(
            !run.stderr.contains("demo: "),
            "the demo must not run: {run}"
        );
        assert_no_panic(&run);
    }

    // `check` finds it too, with its own exit code.
    let run = phasetrace(&["check"], &[("PHASETRACE_PROMETHEUS", &addr)], RUN);
    assert_eq!(run.code, Some(4), "{run}");
    assert!(
        run.stdout.contains(&format!(
            "FAIL  Prometheus: PHASETRACE_PROMETHEUS={addr}: cannot listen there"
        )),
        "{run}"
    );
    assert!(
        run.stderr.contains("check failed: PHASETRACE_PROMETHEUS="),
        "{run}"
    );
    assert_no_panic(&run);
    drop(taken);
}
