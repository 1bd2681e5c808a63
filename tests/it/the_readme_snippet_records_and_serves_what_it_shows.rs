//! The README's integration snippet is `examples/minimal.rs` character for character, and run as
//! printed it records every step, section, route and round it shows, and serves them on the
//! endpoint it prints.
//!
//! The snippet reads the process environment, so it runs in a child process: this test binary
//! re-runs itself (`--exact` this test) with only `PHASETRACE_PROMETHEUS` set (a free port, so
//! the run never depends on 9464 being free), scrapes the endpoint the child prints, then
//! presses Enter for it.

use crate::support;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod readme {
    include!("../../examples/minimal.rs");

    pub(super) fn run() -> Result<(), Box<dyn std::error::Error>> {
        main()
    }
}

const CHILD: &str = "PHASETRACE_TEST_README_CHILD";
const TEST_NAME: &str = "the_readme_snippet_records_and_serves_what_it_shows::the_readme_snippet_records_and_serves_what_it_shows";
const SNIPPET: &str = include_str!("../../examples/minimal.rs");
const README: &str = include_str!("../../README.md");

/// The sum of the samples of `name` whose labels include every pair of `labels`, and how many
/// series that is.
fn samples(body: &str, name: &str, labels: &[(&str, &str)]) -> (f64, usize) {
    let mut sum = 0.0;
    let mut n = 0;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels_text, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once("} ") {
                Some(x) => x,
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(v) => ("", v),
                None => continue,
            },
        };
        if labels
            .iter()
            .all(|(k, v)| labels_text.contains(&format!("{k}=\"{v}\"")))
        {
            sum += value.trim().parse::<f64>().unwrap_or(f64::NAN);
            n += 1;
        }
    }
    (sum, n)
}

#[test]
fn the_readme_snippet_records_and_serves_what_it_shows() {
    if std::env::var_os(CHILD).is_some() {
        readme::run().expect("the README snippet failed");
        return;
    }
    assert!(
        README.contains(&format!("```rust\n{SNIPPET}```\n")),
        "README.md must show examples/minimal.rs exactly, in a ```rust block"
    );

    let port = support::free_port();
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"]);
    for (key, _) in std::env::vars_os() {
        if let Some(key) = key.to_str()
            && (key.starts_with("PHASETRACE_")
                || key.starts_with("OTEL_")
                || ["RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK"].contains(&key))
        {
            cmd.env_remove(key);
        }
    }
    cmd.env(CHILD, "1")
        .env("PHASETRACE_PROMETHEUS", format!("127.0.0.1:{port}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("running the child test");
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some((_, url)) = line.split_once("metrics at ") {
                let url = url.split_whitespace().next().unwrap_or_default().to_owned();
                let _ = tx.send(url);
            }
            all += &line;
            all += "\n";
        }
        all
    });
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the snippet printed no endpoint");
    assert_eq!(url, format!("http://127.0.0.1:{port}/metrics"));

    // The snippet flushed before printing: everything is on the endpoint already, but poll to a
    // deadline all the same (a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = support::http_get(&url).map(|(_, b)| b).unwrap_or_default();
        if samples(&body, "phasetrace_spec_rounds_total", &[]).0 >= 1.0 || Instant::now() > deadline
        {
            break body;
        }
        std::thread::sleep(Duration::from_millis(50));
    };

    // 4 steps of 8 layers; each layer: kda_mixer with kda_recur inside, the probe, the enqueue.
    assert_eq!(
        samples(&body, "phasetrace_steps_total", &[("rank", "0")]).0,
        4.0,
        "{body}"
    );
    for bucket in [
        "kda_mixer",
        "kda_recur",
        "reduce_attn_bar",
        "reduce_attn_enq",
    ] {
        // The histogram: one series per bucket (all layers); the per-layer calls: one a layer.
        let (count, series) = samples(
            &body,
            "phasetrace_section_duration_seconds_count",
            &[("bucket", bucket)],
        );
        assert_eq!(
            (count, series),
            (32.0, 1),
            "{bucket}: 4 steps x 8 layers\n{body}"
        );
        let (calls, series) = samples(
            &body,
            "phasetrace_section_layer_calls_total",
            &[("bucket", bucket)],
        );
        assert_eq!(
            (calls, series),
            (32.0, 8),
            "{bucket}: 4 steps x 8 layers\n{body}"
        );
    }
    // Tokens routed per layer (one series a layer, whatever the number of experts).
    let (tokens, series) = samples(&body, "phasetrace_moe_layer_tokens_total", &[]);
    assert_eq!(
        (tokens, series),
        (128.0, 8),
        "4 experts x 8 layers, one token each a step\n{body}"
    );
    assert_eq!(
        samples(&body, "phasetrace_spec_rounds_total", &[]).0,
        1.0,
        "{body}"
    );
    assert_eq!(
        samples(&body, "phasetrace_spec_draft_tokens_total", &[]).0,
        4.0,
        "{body}"
    );
    assert_eq!(
        samples(&body, "phasetrace_spec_accepted_tokens_total", &[]).0,
        3.0,
        "{body}"
    );
    for phase in ["draft", "verify", "accept"] {
        let (n, _) = samples(
            &body,
            "phasetrace_spec_phase_duration_seconds_count",
            &[("phase", phase)],
        );
        assert_eq!(n, 1.0, "{phase}\n{body}");
    }
    let (kda, _) = samples(
        &body,
        "phasetrace_spec_verify_part_duration_seconds_count",
        &[("part", "kda")],
    );
    assert_eq!(kda, 1.0, "{body}");

    // Enter: the snippet prints its summary and shuts down cleanly.
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(b"\n")
        .expect("pressing Enter");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for the child") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the snippet did not exit after Enter");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = reader.join().expect("reading stdout");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(status.success(), "{status}\n{out}\n{err}");
    assert!(out.contains("kda_recur"), "no summary table:\n{out}");
    // Both levels were set: no off-by-default warning.
    assert!(!err.contains("is off"), "{err}");
}
