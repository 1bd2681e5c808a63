//! What the `phasetrace` command prints: a secret given in any setting never appears (stdout or
//! stderr of `check`, of a failing `demo`, of `import`), and input echoed to the terminal (a log
//! line's excerpt, a file name, a configuration value) has its control characters escaped.

use crate::cli;

use cli::phasetrace;
use std::time::Duration;

const RUN: Duration = Duration::from_secs(60);
const MARKER: &str = "S3CRET-CLI-MARKER";

/// No byte that would control a terminal: ESC, CSI, BEL, CR, ... (newlines and tabs separate
/// phasetrace's own lines and columns).
fn assert_no_controls(what: &str, text: &str) {
    let bad: Vec<char> = text
        .chars()
        .filter(|c| c.is_control() && !matches!(c, '\n' | '\t'))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: control characters {bad:?} reached the terminal:\n{text}"
    );
}

#[test]
fn check_never_prints_a_header_value_or_a_url_password() {
    let header = format!("x-api-key={MARKER}");
    let envs = [
        ("PHASETRACE_PROMETHEUS", "off"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
        ("OTEL_EXPORTER_OTLP_HEADERS", header.as_str()),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", header.as_str()),
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", header.as_str()),
        ("OTEL_TRACES_EXPORTER", "otlp"),
    ];
    let run = phasetrace(&["check", "--timeout-ms", "200"], &envs, RUN);
    assert!(run.stdout.contains("x-api-key=****"), "{run}");
    assert!(!run.all().contains(MARKER), "{run}");

    // Refused values: a bad header list, a password in the endpoint, a misspelled variable.
    let bad_header = format!("x-api-key:{MARKER}");
    let password = format!("http://user:{MARKER}@127.0.0.1:9");
    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_HEADERS", bad_header.as_str()),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", bad_header.as_str()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", password.as_str()),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", password.as_str()),
    ] {
        for cmd in [
            &["check", "--timeout-ms", "200"][..],
            &["demo", "--steps", "1"][..],
        ] {
            let run = phasetrace(cmd, &[("PHASETRACE_PROMETHEUS", "off"), (var, value)], RUN);
            assert_eq!(run.code, Some(3), "{var}: {run}");
            assert!(run.stderr.contains(var), "{var}: {run}");
            assert!(!run.all().contains(MARKER), "{var}={value}: {run}");
        }
    }
    let run = phasetrace(
        &["check", "--otlp-endpoint", &password, "--timeout-ms", "200"],
        &[("PHASETRACE_PROMETHEUS", "off")],
        RUN,
    );
    // A flag's value is a usage error (2), echoed as the library would.
    assert_eq!(run.code, Some(2), "{run}");
    assert!(run.stderr.contains("user:****@127.0.0.1"), "{run}");
    assert!(run.stderr.contains("--otlp-endpoint"), "{run}");
    assert!(!run.all().contains(MARKER), "{run}");
}

#[test]
fn check_escapes_what_it_echoes() {
    let title = "engine\u{1b}]0;owned\u{7}\r\u{1b}[2K";
    let run = phasetrace(
        &["check", "--timeout-ms", "200"],
        &[
            ("PHASETRACE_PROMETHEUS", "off"),
            ("OTEL_SERVICE_NAME", title),
        ],
        RUN,
    );
    assert!(
        run.stdout.contains("engine\\x1b]0;owned\\x07\\r\\x1b[2K"),
        "{run}"
    );
    assert_no_controls("check", &run.stdout);
    assert_no_controls("check", &run.stderr);
    // A flag's refused value too.
    let run = phasetrace(
        &[
            "check",
            "--service-name",
            "\u{1b}]0;x\u{7}",
            "--level",
            "\u{1b}[2Jbad",
        ],
        &[],
        RUN,
    );
    assert_eq!(run.code, Some(2), "{run}");
    assert!(run.stderr.contains("\\x1b[2Jbad"), "{run}");
    assert_no_controls("check flags", &run.stderr);
}

#[test]
fn the_import_summary_escapes_the_lines_it_quotes() {
    let dir = std::env::temp_dir().join(format!("phasetrace-escape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("evil\u{1b}]0;name\u{7}.log");
    std::fs::write(
        &log,
        "GLMTRACE step=1 site=attn L=0 moe=0 bar_us=\u{1b}]8;;http://evil/\u{1b}\\click\u{1b}]8;;\u{1b}\\ ids=\n\
         GLMTRACE step=2 site=attn L=0 moe=0 bar_us=1.0\r\u{1b}[1A\u{1b}[2Kall good ids=\n\
         GLMTRACE step=3 site=attn L=0 moe=0 bar_us=18446744073709551.615 ids=\n",
    )
    .unwrap();
    let out = dir.join("out.om");
    let run = phasetrace(
        &[
            "import",
            "--format",
            "openmetrics",
            "--start",
            "1790769600",
            "--out",
            out.to_str().unwrap(),
            log.to_str().unwrap(),
        ],
        &[],
        RUN,
    );
    assert!(run.code == Some(0), "{run}");
    assert!(run.stderr.contains("3 unparseable"), "{run}");
    assert!(
        run.stderr.contains("line 1: "),
        "the bad lines are quoted: {run}"
    );
    assert!(run.stderr.contains("evil\\x1b]0;name\\x07.log"), "{run}");
    assert_no_controls("import", &run.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rendezvous_secret_never_prints() {
    let short = "S3CRET-CLI";
    let demo = [
        "demo",
        "--ranks",
        "2",
        "--rank",
        "1",
        "--rendezvous",
        "127.0.0.1:1",
        "--rendezvous-timeout",
        "1",
        "--steps",
        "1",
        "--prometheus",
        "off",
    ];
    // Too short: a usage error naming the variable, the value masked.
    let run = phasetrace(&demo, &[("PHASETRACE_RENDEZVOUS_SECRET", short)], RUN);
    assert_eq!(run.code, Some(3), "{run}");
    assert!(
        run.stderr.contains(
            "PHASETRACE_RENDEZVOUS_SECRET (masked): a group secret of 10 bytes, expected at least 16"
        ),
        "{run}"
    );
    assert!(!run.all().contains(short), "{run}");
    // Accepted, then the rendezvous fails (nothing listens): still never printed.
    let run = phasetrace(&demo, &[("PHASETRACE_RENDEZVOUS_SECRET", MARKER)], RUN);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stderr.contains("cannot reach rank 0 at 127.0.0.1:1"),
        "{run}"
    );
    assert!(!run.all().contains(MARKER), "{run}");
    // Both variables: which to take is ambiguous.
    let run = phasetrace(
        &demo,
        &[
            ("PHASETRACE_RENDEZVOUS_SECRET", MARKER),
            ("PHASETRACE_RENDEZVOUS_SECRET_FILE", "/nonexistent"),
        ],
        RUN,
    );
    assert_eq!(run.code, Some(3), "{run}");
    assert!(run.stderr.contains("are both set"), "{run}");
    assert!(!run.all().contains(MARKER), "{run}");
}
