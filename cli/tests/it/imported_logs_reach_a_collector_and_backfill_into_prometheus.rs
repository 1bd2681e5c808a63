//! `phasetrace import` end to end: the fixture logs of the reference profilers
//! (`import/tests/fixtures/`, numbers in its README) go to the real collector (rotel) with their
//! original timestamps, and backfill the real Prometheus through
//! `promtool tsdb create-blocks-from openmetrics`, queried at the logs' timestamps.

use crate::cli;
use crate::support;

use phasetrace_import::ImportRecord;
use phasetrace_names::metric;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use support::{Prometheus, Rotel, TempDir};

/// 2026-09-30T12:00:00Z, the fixtures' T0, in Unix nanoseconds.
const T0: u64 = 1_790_769_600_000_000_000;
/// `--start` for the untimestamped speculative log: T0 + 3600 s.
const START: &str = "2026-09-30T13:00:00Z";
const S: u64 = T0 + 3_600_000_000_000;

fn fixture(name: &str) -> String {
    support::repo_root()
        .join("import/tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// What the import's summary line says it sent: (metric requests, points, trace requests,
/// spans, largest request bytes).
fn sent_counts(stderr: &str) -> (usize, usize, usize, usize, usize) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("sent to "))
        .unwrap_or_else(|| panic!("no summary line: {stderr}"));
    let numbers: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().expect("number"))
        .collect();
    // `sent to http://127.0.0.1:PORT over P: M metric requests (N points), T trace requests
    // (S spans); largest request B bytes of protobuf (at most L each)`.
    let n = numbers.len();
    assert!(n >= 6, "{line}");
    (
        numbers[n - 6],
        numbers[n - 5],
        numbers[n - 4],
        numbers[n - 3],
        numbers[n - 2],
    )
}

/// Spans and points as received, in an order that does not depend on how the collector
/// batched them.
fn canonical(out: &support::ParsedOutput) -> (Vec<String>, Vec<String>) {
    let mut spans: Vec<String> = out.spans.iter().map(|s| format!("{s:?}")).collect();
    spans.sort();
    let mut points: Vec<String> = out
        .metrics
        .iter()
        .flat_map(|m| {
            m.points.iter().map(move |p| {
                format!(
                    "{} {} {:?} {} {:?} {:?} {:?} {p:?}",
                    m.name, m.unit, m.kind, m.temporality, m.monotonic, m.resource, m.scope_name
                )
            })
        })
        .collect();
    points.sort();
    (spans, points)
}

fn point_count(out: &support::ParsedOutput) -> usize {
    out.metrics.iter().map(|m| m.points.len()).sum()
}

#[test]
fn imported_logs_reach_rotel_identically_over_grpc_and_http() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let glm = fixture("glm_run_tracing.log.gz");
    let spec = fixture("spec_phases_stderr.log");
    let mut received = Vec::new();
    for (protocol, endpoint, compression) in [
        ("grpc", rotel.grpc_endpoint(), "none"),
        ("grpc", rotel.grpc_endpoint(), "gzip"),
        ("http/protobuf", rotel.http_endpoint(), "none"),
        ("http/protobuf", rotel.http_endpoint(), "gzip"),
    ] {
        rotel.clear_output();
        let done = cli::phasetrace(
            &[
                "import",
                &glm,
                &spec,
                "--start",
                START,
                "--otlp-protocol",
                protocol,
                "--otlp-endpoint",
                &endpoint,
            ],
            &[("OTEL_EXPORTER_OTLP_COMPRESSION", compression)],
            Duration::from_secs(60),
        );
        assert_eq!(done.code, Some(0), "{done}");
        assert!(
            done.stderr.contains(&format!(
                "sent to {endpoint} over {protocol}: 1 metric requests"
            )),
            "{done}"
        );
        let (_, points, _, spans, _) = sent_counts(&done.stderr);
        let out = rotel.wait_for(
            |o| o.spans.len() >= spans && point_count(o) >= points,
            Duration::from_secs(20),
        );
        assert_eq!((out.spans.len(), point_count(&out)), (spans, points));
        assert_fixtures_arrived(&done, &out);
        received.push((format!("{protocol}, {compression}"), canonical(&out)));
    }
    let (first, want) = &received[0];
    for (how, got) in &received[1..] {
        assert!(
            got == want,
            "{how} received other spans or points than {first}"
        );
    }
}

/// The fixtures' exact values at their timestamps, as `out` received them.
fn assert_fixtures_arrived(done: &cli::Finished, out: &support::ParsedOutput) {
    assert!(done.stderr.contains("1 truncated tables"), "{done}");
    assert!(
        done.stderr.contains("line 46:"),
        "the cut row is reported: {done}"
    );
    // The last table of run 0 (T0 + 4.190 s): moe_experts after 24 steps.
    // One metric per resource (file and run): search all of them.
    let points = |name: &str| -> Vec<support::Point> {
        out.metrics_named(name)
            .into_iter()
            .flat_map(|m| m.points.clone())
            .collect()
    };
    let sections = points("phasetrace.section.duration");
    let p = sections
        .iter()
        .find(|p| {
            p.matches(&[("bucket", "moe_experts"), ("source.run", "0")])
                && p.time_unix_nanos == Some(T0 + 4_190_000_000)
        })
        .expect("moe_experts point of run 0 at its table's timestamp");
    assert_eq!(p.count, Some(1440));
    assert!(close(p.sum.unwrap_or(0.0), 0.059_472), "{p:?}");
    // Run 1 restarted: its counters start again.
    let steps = points("phasetrace.steps");
    let last_run1 = steps
        .iter()
        .filter(|p| p.matches(&[("source.run", "1")]))
        .filter_map(|p| Some((p.time_unix_nanos?, p.value?)))
        .max_by_key(|(t, _)| *t)
        .expect("run 1 steps");
    assert_eq!(last_run1, (T0 + 304_120_000_000, 16.0));

    // Per layer, as live: counters by (bucket, site, layer), each a running total at its
    // lines' times and held to the run's end (T0 + 304.120 s, its last table); the wait
    // histogram by site only. Run 1, mlp probe of layer 1: 48.7 µs at step 0, 48.6 µs at step 8
    // (T0 + 304.066020 s).
    let per_layer = [("site", "mlp"), ("layer", "1"), ("source.run", "1")];
    let value_at = |name: &str, labels: &[(&str, &str)], t: u64| -> f64 {
        points(name)
            .iter()
            .find(|p| p.matches(labels) && p.time_unix_nanos == Some(t))
            .and_then(|p| p.value)
            .unwrap_or_else(|| panic!("{name} {labels:?} at {t}"))
    };
    for t in [T0 + 304_066_020_000, T0 + 304_120_000_000] {
        let time = value_at(metric::COLLECTIVE_LAYER_WAIT_TIME, &per_layer, t);
        assert!(close(time, 0.000_097_3), "{time}");
        assert_eq!(
            value_at(metric::COLLECTIVE_LAYER_WAIT_CALLS, &per_layer, t),
            2.0
        );
        let section = [per_layer.as_slice(), &[("bucket", "reduce_mlp_bar")]].concat();
        let time = value_at(metric::SECTION_LAYER_TIME, &section, t);
        assert!(close(time, 0.000_097_3), "{time}");
        assert_eq!(value_at(metric::SECTION_LAYER_CALLS, &section, t), 2.0);
    }
    let waits = points(metric::COLLECTIVE_WAIT);
    assert!(waits.iter().all(|p| p.attr("layer").is_none()), "{waits:?}");
    let mlp = waits
        .iter()
        .filter(|p| p.matches(&[("site", "mlp"), ("source.run", "1")]))
        .max_by_key(|p| p.time_unix_nanos)
        .expect("run 1 mlp waits");
    // Layers 0 and 1, steps 0 and 8: 3.4 + 48.7 + 3.4 + 48.6 µs.
    assert_eq!(
        (mlp.count, mlp.time_unix_nanos),
        (Some(4), Some(T0 + 304_120_000_000))
    );
    assert!(close(mlp.sum.unwrap_or(0.0), 0.000_104_1), "{mlp:?}");
    // Every series carries the live default rank and group.
    assert!(
        out.metrics
            .iter()
            .flat_map(|m| &m.points)
            .all(|p| p.matches(&[("rank", "0"), ("group", "default")])),
        "rank and group on every point"
    );

    // Route traces: one child span per GLMTRACE line, under its step's decode.step root.
    let probes: Vec<_> = out
        .spans
        .iter()
        .filter(|s| s.name == "reduce_attn_bar" || s.name == "reduce_mlp_bar")
        .collect();
    assert_eq!(probes.len(), 16);
    let total_ns: u64 = probes.iter().map(|s| s.duration_nanos()).sum();
    assert_eq!(total_ns, 294_400);
    assert!(
        probes
            .iter()
            .all(|s| out.parent_of(s).is_some_and(|p| p.name == "decode.step"))
    );
    assert!(
        out.spans_named("decode.step")
            .iter()
            .any(|s| s.events.iter().any(|e| e.name == "moe.route")),
        "routed expert ids arrive as moe.route events"
    );

    // Speculative phases, per tag, at the last burst's time.
    let phases = points("phasetrace.spec.phase.duration");
    let verify = phases
        .iter()
        .filter(|p| p.matches(&[("phase", "verify"), ("tag", "glm5-phase")]))
        .max_by_key(|p| p.time_unix_nanos)
        .expect("glm5-phase verify");
    assert!(close(verify.sum.unwrap_or(0.0), 0.112_265), "{verify:?}");
    assert_eq!(verify.time_unix_nanos, Some(S + 186_593_000));
}

#[test]
fn a_dead_or_silent_grpc_endpoint_fails_naming_it() {
    let glm = fixture("glm_run_tracing.log");
    // Nothing listens: refused at once.
    let dead = format!("http://127.0.0.1:{}", support::free_port());
    let done = cli::phasetrace(
        &["import", &glm, "--otlp-endpoint", &dead],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(1), "{done}");
    let message = done
        .stderr
        .lines()
        .find(|l| l.starts_with("phasetrace: "))
        .unwrap_or_else(|| panic!("no error line: {done}"));
    for part in [
        "phasetrace: sending metrics request 1 (168 points, ",
        &format!(" bytes of protobuf) to {dead} over grpc failed: Unavailable: "),
        "Connection refused",
        "; sent before it: 0 metric requests (0 points), 0 trace requests (0 spans)",
        "an OTLP/HTTP endpoint, 4318, needs --otlp-protocol http/protobuf",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    assert!(!done.stderr.contains("sent to "), "{done}");

    // Something accepts connections but never answers: OTEL_EXPORTER_OTLP_TIMEOUT ends each
    // request.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_at = format!("http://{}", silent.local_addr().expect("addr"));
    let started = std::time::Instant::now();
    let done = cli::phasetrace(
        &["import", &glm, "--otlp-endpoint", &silent_at],
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "500")],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(1), "{done}");
    assert!(started.elapsed() < Duration::from_secs(20), "{done}");
    assert!(
        done.stderr
            .contains("phasetrace: sending metrics request 1 (168 points, ")
            && done
                .stderr
                .contains(&format!(" to {silent_at} over grpc failed: ")),
        "{done}"
    );
    drop(silent);

    // An unreadable CA for an https:// endpoint: said before anything is sent.
    let done = cli::phasetrace(
        &["import", &glm, "--otlp-endpoint", "https://127.0.0.1:4317"],
        &[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(1), "{done}");
    assert!(
        done.stderr.contains(
            "phasetrace: cannot send to https://127.0.0.1:4317 over grpc: OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/ca.pem: cannot read the CA certificate"
        ),
        "{done}"
    );
}

/// Steps of route-trace lines in a big log: 64 routed layers, each line with 256 expert ids,
/// so that a step's root span holds 64 `moe.route` events of 256 ids (about 85 kB).
const BIG_STEPS: u64 = 100;
const BIG_LAYERS: u32 = 64;
const BIG_IDS: u32 = 256;
/// The 4 MiB message limit of OTLP/gRPC receivers by default (rotel's too).
const GRPC_LIMIT: usize = 4 << 20;

/// Writes the big log (about 6.4 MB) to `path`.
fn big_log(path: &std::path::Path) {
    let ids: Vec<String> = (0..BIG_IDS).map(|i| i.to_string()).collect();
    let ids = ids.join(",");
    let mut out = String::new();
    for step in 0..BIG_STEPS {
        for layer in 0..BIG_LAYERS {
            let us = 2_000 * step + 10 * u64::from(layer);
            out += &format!(
                "2026-09-30T12:00:{:02}.{:06}Z  WARN p: GLMTRACE step={step} site=mlp L={layer} moe=1 bar_us=2.5 ids={ids}\n",
                us / 1_000_000,
                us % 1_000_000
            );
        }
    }
    std::fs::write(path, out).expect("big log");
}

/// Lines of `output` that start with one of `prefixes`.
fn lines_starting(output: &str, prefixes: &[&str]) -> usize {
    output
        .lines()
        .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
        .count()
}

#[test]
fn a_big_import_goes_in_several_messages_under_the_grpc_limit_and_all_arrives() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start_with_args(&["--otlp-grpc-max-recv-msg-size-mib", "4"]);
    let dir = TempDir::new("phasetrace-big-import");
    let log = dir.path().join("big.log");
    big_log(&log);
    let log = log.display().to_string();

    // The premise: cut by count only (5000 spans), a trace request would be over the limit.
    let file = phasetrace_import::import_path(log.as_ref(), Default::default()).expect("import");
    let mut by_count = Vec::new();
    phasetrace_import::otlp::trace_requests(
        std::slice::from_ref(&file),
        &phasetrace_import::otlp::OtlpOptions {
            max_request_bytes: usize::MAX,
            ..Default::default()
        },
        |_, info| {
            by_count.push(info.bytes);
            Ok(())
        },
    )
    .expect("requests");
    assert!(
        by_count.iter().any(|&b| b > GRPC_LIMIT),
        "the log is big enough: {by_count:?}"
    );

    let spans = (BIG_STEPS * (1 + u64::from(BIG_LAYERS))) as usize;
    let last = T0 + 2_000_000 * (BIG_STEPS - 1) + 10_000 * u64::from(BIG_LAYERS - 1);
    let mut reports = Vec::new();
    for (protocol, endpoint) in [
        ("grpc", rotel.grpc_endpoint()),
        ("http/protobuf", rotel.http_endpoint()),
    ] {
        rotel.clear_output();
        let done = cli::phasetrace(
            &[
                "import",
                &log,
                "--otlp-protocol",
                protocol,
                "--otlp-endpoint",
                &endpoint,
            ],
            &[],
            Duration::from_secs(120),
        );
        assert_eq!(done.code, Some(0), "{done}");
        let (metric_requests, points, trace_requests, sent_spans, largest) =
            sent_counts(&done.stderr);
        assert_eq!(sent_spans, spans, "{done}");
        assert!(trace_requests >= 3, "several trace messages: {done}");
        assert!(metric_requests >= 2, "{done}");
        assert!(largest < GRPC_LIMIT, "{done}");
        reports.push((metric_requests, points, trace_requests, sent_spans, largest));

        // Everything arrives: count what rotel printed, then read it.
        let arrived = support::poll(Duration::from_secs(60), || {
            let output = rotel.output();
            let got = (
                lines_starting(&output, &["Span #"]),
                lines_starting(&output, &["NumberDataPoints #", "HistogramDataPoints #"]),
            );
            (got == (spans, points)).then_some(got)
        });
        assert_eq!(
            arrived,
            Some((spans, points)),
            "{protocol}: every span and point arrives"
        );
        let out = rotel.parsed();
        let roots = out.spans_named("decode.step");
        assert_eq!(roots.len(), BIG_STEPS as usize);
        for root in &roots {
            assert_eq!(root.events.len(), BIG_LAYERS as usize, "{}", root.span_id);
            assert!(
                root.events.iter().all(|e| e.name == "moe.route"
                    && e.attributes
                        .get("moe.expert_ids")
                        .is_some_and(|ids| ids.contains(&format!("{}", BIG_IDS - 1)))),
                "{:?}",
                root.events.first()
            );
        }
        // The last layer's counters at its last line: every step counted.
        let calls = out
            .metrics_named(metric::SECTION_LAYER_CALLS)
            .into_iter()
            .flat_map(|m| m.points.iter())
            .filter(|p| p.matches(&[("layer", &(BIG_LAYERS - 1).to_string())]))
            .filter_map(|p| Some((p.time_unix_nanos?, p.value?)))
            .max_by_key(|(t, _)| *t);
        assert_eq!(calls, Some((last, BIG_STEPS as f64)), "{protocol}");
    }
    assert_eq!(
        reports[0], reports[1],
        "the same requests over gRPC and HTTP"
    );
}

#[test]
fn a_request_over_the_collectors_limit_fails_saying_what_was_sent_before_it() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start_with_args(&["--otlp-grpc-max-recv-msg-size-mib", "2"]);
    let dir = TempDir::new("phasetrace-big-import-limit");
    let log = dir.path().join("big.log");
    big_log(&log);
    let log = log.display().to_string();
    let file = phasetrace_import::import_path(log.as_ref(), Default::default()).expect("import");
    let metrics = phasetrace_import::otlp::metrics_requests(
        std::slice::from_ref(&file),
        &Default::default(),
        |_, info| {
            assert!(info.bytes < 2 << 20, "metric requests fit: {info:?}");
            Ok(())
        },
    )
    .expect("metrics");

    let done = cli::phasetrace(
        &["import", &log, "--otlp-endpoint", &rotel.grpc_endpoint()],
        &[],
        Duration::from_secs(120),
    );
    assert_eq!(done.code, Some(1), "{done}");
    for part in [
        "phasetrace: sending traces request 1 (".to_owned(),
        format!(
            " to {} over grpc failed: OutOfRange: ",
            rotel.grpc_endpoint()
        ),
        format!(
            "; sent before it: {} metric requests ({} points), 0 trace requests (0 spans)",
            metrics.requests, metrics.items
        ),
    ] {
        assert!(done.stderr.contains(&part), "{part:?} in {done}");
    }
    // What was sent before arrived.
    let arrived = support::poll(Duration::from_secs(60), || {
        let n = lines_starting(
            &rotel.output(),
            &["NumberDataPoints #", "HistogramDataPoints #"],
        );
        (n == metrics.items).then_some(n)
    });
    assert_eq!(arrived, Some(metrics.items), "the points sent arrived");
}

#[test]
fn openmetrics_output_backfills_prometheus_at_the_logs_timestamps() {
    support::require_tools!(Prometheus, Promtool);
    let dir = TempDir::new("phasetrace-backfill");
    let om = dir.path().join("import.om");
    let tsdb = dir.path().join("tsdb");
    let done = cli::phasetrace(
        &[
            "import",
            &fixture("glm_run_tracing.log"),
            &fixture("spec_phases_stderr.log"),
            "--start",
            START,
            "--format",
            "openmetrics",
            "--out",
            &om.display().to_string(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(0), "{done}");
    let promtool = support::promtool_binary();
    let status = std::process::Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om)
        .arg(&tsdb)
        .output()
        .expect("promtool");
    assert!(
        status.status.success(),
        "promtool: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let prom = Prometheus::builder()
        .data_dir(&tsdb)
        .arg("--storage.tsdb.retention.time=100y")
        .start();
    let at = |ns: u64| format!("{}.{:03}", ns / 1_000_000_000, (ns / 1_000_000) % 1000);
    let query_at = |q: &str, ns: u64| -> Vec<f64> {
        let v = prom
            .get_json(&format!(
                "/api/v1/query?query={}&time={}",
                support::url_encode(q),
                at(ns)
            ))
            .expect("query");
        support::samples(&v).into_iter().map(|(_, x)| x).collect()
    };
    let t = T0 + 4_190_000_000;
    assert_eq!(
        query_at(
            "phasetrace_section_duration_seconds_count{bucket=\"moe_experts\",source_run=\"0\"}",
            t
        ),
        vec![1440.0]
    );
    let sum = query_at(
        "phasetrace_section_duration_seconds_sum{bucket=\"moe_experts\",source_run=\"0\"}",
        t,
    );
    assert_eq!(sum.len(), 1);
    assert!(close(sum[0], 0.059_472), "{sum:?}");
    assert_eq!(
        query_at(
            "phasetrace_steps_total{source_run=\"1\"}",
            T0 + 304_120_000_000
        ),
        vec![16.0]
    );
    assert_eq!(
        query_at(
            "sum(phasetrace_spec_rounds_total{tag=\"glm5-phase\"})",
            S + 186_593_000
        ),
        vec![53.0]
    );
    let kda = query_at(
        "phasetrace_spec_verify_part_duration_seconds_sum{tag=\"glm5-phase-v\",part=\"kda\"}",
        S + 186_593_000,
    );
    assert!(kda.len() == 1 && close(kda[0], 0.042_564), "{kda:?}");
}

// ---------------------------------------------------------------------------------------------
// Per-layer counters: backfilled, then read by the dashboards' and rules' own expressions.

/// Window of every range in the per-layer queries: covers one run of the fixture, whose runs
/// are 300 s apart.
const RANGE: &str = "60s";

/// The fixture with every route-trace probe 1.0 µs longer: rank 1 of the same group, so that
/// the ranks differ by exactly 1 µs at every (site, layer).
fn slower_rank(path: &std::path::Path) {
    let text = std::fs::read(fixture("glm_run_tracing.log")).expect("fixture");
    let mut out = Vec::new();
    for line in text.split_inclusive(|&b| b == b'\n') {
        let probe = String::from_utf8_lossy(line);
        match probe.split_once("bar_us=") {
            Some((head, tail)) => {
                let (us, rest) = tail.split_once(' ').expect("bar_us=X ids=");
                let us: f64 = us.parse().expect("bar_us");
                out.extend_from_slice(format!("{head}bar_us={:.1} {rest}", us + 1.0).as_bytes());
            }
            None => out.extend_from_slice(line),
        }
    }
    std::fs::write(path, out).expect("rank 1 log");
}

/// Per (rank, run): the run's end, its steps, and per (site, layer) the probes' ns and count,
/// as the library reads the logs.
#[derive(Default)]
struct Truth {
    end: BTreeMap<u32, u64>,
    steps: BTreeMap<(u32, u32), u64>,
    probes: BTreeMap<(u32, u32, String, u32), (u64, u64)>,
}

impl Truth {
    fn read(&mut self, rank: u32, path: &str) {
        let file =
            phasetrace_import::import_path(path.as_ref(), Default::default()).expect("import");
        for r in &file.records {
            let at = r.at().expect("timestamped");
            let end = self.end.entry(r.run()).or_default();
            *end = (*end).max(at);
            match r {
                ImportRecord::DecodeSteps {
                    run,
                    steps_in_interval,
                    ..
                } => *self.steps.entry((rank, *run)).or_default() += steps_in_interval,
                ImportRecord::RouteTrace {
                    run,
                    site,
                    layer,
                    bar_ns,
                    ..
                } => {
                    let e = self
                        .probes
                        .entry((rank, *run, site.clone(), *layer))
                        .or_default();
                    e.0 += bar_ns;
                    e.1 += 1;
                }
                _ => {}
            }
        }
    }

    /// Seconds and probes of `run` summed over what `keep(rank, site, layer)` selects, grouped
    /// by `key(rank, site, layer)`.
    fn sums(
        &self,
        run: u32,
        key: impl Fn(u32, &str, u32) -> Labels,
    ) -> BTreeMap<Labels, (f64, f64)> {
        let mut out: BTreeMap<Labels, (u64, u64)> = BTreeMap::new();
        for ((rank, r, site, layer), (ns, calls)) in &self.probes {
            if *r == run {
                let e = out.entry(key(*rank, site, *layer)).or_default();
                e.0 += ns;
                e.1 += calls;
            }
        }
        out.into_iter()
            .map(|(k, (ns, calls))| (k, (ns as f64 / 1e9, calls as f64)))
            .collect()
    }

    fn steps(&self, run: u32) -> f64 {
        self.steps
            .iter()
            .filter(|((_, r), _)| *r == run)
            .map(|(_, s)| *s as f64)
            .sum()
    }
}

type Labels = BTreeMap<String, String>;

fn labels(pairs: &[(&str, String)]) -> Labels {
    let mut l: Labels = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    l.insert("group".into(), "default".into());
    l
}

/// The bundled dashboards: (file, title, expression) of every panel target that reads a
/// per-layer counter, and (file, variable, query) of every variable that lists one's labels.
/// Variables take the dashboards' defaults (`All` is their `allValue`, `.*`; a constant its
/// value) and `$__range` and `$__rate_interval` are [`RANGE`].
#[allow(clippy::type_complexity)]
fn dashboards() -> (Vec<(String, String, String)>, Vec<(String, String, String)>) {
    let dir = support::repo_root().join("dashboards");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("dashboards/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    let (mut panels, mut variables) = (Vec::new(), Vec::new());
    for path in paths {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
        let mut vars: Vec<(String, String)> = vec![
            ("__rate_interval".into(), RANGE.into()),
            ("__range".into(), RANGE.into()),
        ];
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            // A query variable with no saved value (the group: Grafana selects its first
            // value) matches every value here, as its `All` does.
            let value = match v["allValue"].as_str() {
                Some(all) if v["includeAll"] == true => all,
                _ => match v["current"]["value"].as_str() {
                    None | Some("") if v["type"] == "query" => ".*",
                    saved => saved.unwrap_or_default(),
                },
            };
            vars.push((v["name"].as_str().unwrap_or_default().into(), value.into()));
            if let Some(q) = v["query"].as_str().filter(|q| q.contains("_layer_")) {
                variables.push((
                    name.clone(),
                    v["name"].as_str().unwrap_or_default().into(),
                    q.to_owned(),
                ));
            }
        }
        // Longest names first: `$layer` must not eat a longer name's prefix.
        vars.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
        let fill = |e: &str| {
            vars.iter()
                .fold(e.to_owned(), |e, (n, v)| e.replace(&format!("${n}"), v))
        };
        let mut stack: Vec<&serde_json::Value> =
            d["panels"].as_array().into_iter().flatten().collect();
        while let Some(p) = stack.pop() {
            stack.extend(p["panels"].as_array().into_iter().flatten());
            for t in p["targets"].as_array().into_iter().flatten() {
                let title = p["title"].as_str().unwrap_or_default().to_owned();
                // Banked logs carry totals, not latency distributions: the panels on the live
                // protobuf scrape's native histograms have nothing to answer from a backfill
                // (the importer writes the per-layer counters the other panels read).
                if title.ends_with("(native histograms)") {
                    continue;
                }
                if let Some(e) = t["expr"].as_str().filter(|e| e.contains("_layer_")) {
                    panels.push((name.clone(), title, fill(e)));
                }
            }
        }
        for v in &mut variables {
            v.2 = fill(&v.2);
        }
    }
    (panels, variables)
}

/// The expression of recording rule `record` in `otel-config/rules/phasetrace-recording.yml`.
fn recording_rule(record: &str) -> String {
    let path = support::repo_root().join("otel-config/rules/phasetrace-recording.yml");
    let text = std::fs::read_to_string(path).expect("rules");
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim() != format!("- record: {record}"))
        .skip(1);
    let expr = lines.next().expect("expr line");
    let indent = expr.len() - expr.trim_start().len();
    match expr.trim().strip_prefix("expr:").map(str::trim) {
        Some("|") => lines
            .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
            .collect::<Vec<_>>()
            .join("\n"),
        Some(inline) => inline.to_owned(),
        None => panic!("{record}: no expr after the record line"),
    }
}

fn assert_exact(what: &str, got: &[(Labels, f64)], want: &BTreeMap<Labels, f64>) {
    let got: BTreeMap<Labels, f64> = got.iter().cloned().collect();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: series"
    );
    for (k, w) in want {
        let g = got[k];
        assert!(
            (g - w).abs() <= 1e-12 * w.abs().max(1e-9),
            "{what} {k:?}: {g:e}, imported {w:e}"
        );
    }
}

#[test]
fn backfilled_per_layer_counters_answer_the_dashboards_and_rules_exactly() {
    support::require_tools!(Prometheus, Promtool);
    let dir = TempDir::new("phasetrace-backfill-layers");
    let rank1 = dir.path().join("glm_rank1.log");
    slower_rank(&rank1);
    let tsdb = dir.path().join("tsdb");
    let mut truth = Truth::default();
    for (rank, log) in [
        (0u32, fixture("glm_run_tracing.log")),
        (1, rank1.display().to_string()),
    ] {
        let om = dir.path().join(format!("rank{rank}.om"));
        let done = cli::phasetrace(
            &[
                "import",
                &log,
                "--rank",
                &rank.to_string(),
                "--format",
                "openmetrics",
                "--out",
                &om.display().to_string(),
            ],
            &[],
            Duration::from_secs(60),
        );
        assert_eq!(done.code, Some(0), "{done}");
        let status = std::process::Command::new(support::promtool_binary())
            .args(["tsdb", "create-blocks-from", "openmetrics"])
            .arg(&om)
            .arg(&tsdb)
            .output()
            .expect("promtool");
        assert!(
            status.status.success(),
            "promtool: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        truth.read(rank, &log);
    }
    assert_eq!(truth.end.len(), 2, "two runs");
    let prom = Prometheus::builder()
        .data_dir(&tsdb)
        .arg("--storage.tsdb.retention.time=100y")
        .start();
    let at = |ns: u64| format!("{}.{:03}", ns / 1_000_000_000, (ns / 1_000_000) % 1000);
    let query_at = |q: &str, ns: u64| -> Vec<(Labels, f64)> {
        let v = prom
            .get_json(&format!(
                "/api/v1/query?query={}&time={}",
                support::url_encode(q),
                at(ns)
            ))
            .unwrap_or_else(|e| panic!("{q}: {e}"));
        support::samples(&v)
    };

    let (panels, variables) = dashboards();
    let titles: BTreeSet<(&str, &str)> = panels
        .iter()
        .map(|(f, t, _)| (f.as_str(), t.as_str()))
        .collect();
    assert_eq!(
        titles,
        BTreeSet::from([
            ("collectives-rank-skew.json", "Mean wait: layer x rank"),
            ("collectives-rank-skew.json", "Rank skew by site and layer"),
            ("collectives-rank-skew.json", "Mean wait by layer"),
            (
                "decode-sections.json",
                "Layer x bucket heatmap (time per token)"
            ),
            ("decode-sections.json", "Time per token by layer over time"),
            (
                "speculative-decoding.json",
                "Section time per round by layer"
            ),
        ]),
        "the per-layer panels this test knows; a new one needs its expectation here"
    );
    let bucket = |site: &str| format!("reduce_{site}_bar");
    for (&run, &end) in &truth.end {
        let steps = truth.steps(run);
        let mean = |(s, c): (f64, f64)| s / c;
        for (file, title, expr) in &panels {
            let (expr, want): (&str, BTreeMap<Labels, f64>) = match title.as_str() {
                // Mean wait per (layer, rank), both sites together.
                "Mean wait: layer x rank" => (
                    expr,
                    truth
                        .sums(run, |r, _, l| {
                            labels(&[("layer", l.to_string()), ("rank", r.to_string())])
                        })
                        .into_iter()
                        .map(|(k, v)| (k, mean(v)))
                        .collect(),
                ),
                // The same per layer, all ranks together.
                "Mean wait by layer" => (
                    expr,
                    truth
                        .sums(run, |_, _, l| labels(&[("layer", l.to_string())]))
                        .into_iter()
                        .map(|(k, v)| (k, mean(v)))
                        .collect(),
                ),
                // Rank 1 waits 1 µs longer at every probe: the skew of every (site, layer).
                "Rank skew by site and layer" => {
                    let by_rank = truth.sums(run, |r, s, l| {
                        labels(&[
                            ("site", s.into()),
                            ("layer", l.to_string()),
                            ("rank", r.to_string()),
                        ])
                    });
                    let mut want: BTreeMap<Labels, f64> = BTreeMap::new();
                    for (k, v) in by_rank {
                        let mut key = k.clone();
                        let rank = key.remove("rank");
                        let sign = if rank.as_deref() == Some("1") {
                            1.0
                        } else {
                            -1.0
                        };
                        *want.entry(key).or_default() += sign * mean(v);
                    }
                    for v in want.values() {
                        assert!((v - 1e-6).abs() < 1e-12, "the fixture's skew is 1 µs: {v}");
                    }
                    (expr, want)
                }
                // Time per token per (layer, bucket): the probe buckets of the route traces.
                "Layer x bucket heatmap (time per token)" => (
                    expr,
                    truth
                        .sums(run, |_, s, l| {
                            labels(&[("layer", l.to_string()), ("bucket", bucket(s))])
                        })
                        .into_iter()
                        .map(|(k, (secs, _))| (k, secs / steps))
                        .collect(),
                ),
                "Time per token by layer over time" => (
                    expr,
                    truth
                        .sums(run, |_, _, l| labels(&[("layer", l.to_string())]))
                        .into_iter()
                        .map(|(k, (secs, _))| (k, secs / steps))
                        .collect(),
                ),
                // Divided by rounds, which the speculative log has at other times: its
                // per-layer numerator, a rate over the window, times the window.
                "Section time per round by layer" => {
                    let numerator = expr
                        .split_once("/ on (group) group_left ()")
                        .map_or(expr.as_str(), |(n, _)| n)
                        .trim();
                    let secs: f64 = RANGE.trim_end_matches('s').parse().expect("seconds");
                    let got: Vec<(Labels, f64)> = query_at(numerator, end)
                        .into_iter()
                        .map(|(k, v)| (k, v * secs))
                        .collect();
                    let want = truth
                        .sums(run, |_, _, l| labels(&[("layer", l.to_string())]))
                        .into_iter()
                        .map(|(k, (s, _))| (k, s))
                        .collect();
                    assert_exact(
                        &format!("{file} {title:?} (numerator), run {run}"),
                        &got,
                        &want,
                    );
                    continue;
                }
                other => panic!("no expectation for the per-layer panel {other:?}"),
            };
            let got = query_at(expr, end);
            assert_exact(&format!("{file} {title:?}, run {run}"), &got, &want);
        }
    }

    // The recording rule the collectives rules and alerts build on, at run 0's end (its 5m
    // window holds no other run there).
    let rule = recording_rule("phasetrace:collective_wait_seconds:mean5m");
    let want = truth
        .sums(0, |r, s, l| {
            labels(&[
                ("site", s.into()),
                ("layer", l.to_string()),
                ("rank", r.to_string()),
            ])
        })
        .into_iter()
        .map(|(k, v)| (k, v.0 / v.1))
        .collect();
    assert_exact(
        "phasetrace:collective_wait_seconds:mean5m",
        &query_at(&rule, truth.end[&0]),
        &want,
    );

    // The dashboards' variables list the imported sites, ranks, layers and probe buckets.
    let (first, last) = (truth.end[&0] - 60_000_000_000, truth.end[&1]);
    for (file, name, query) in &variables {
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{file} ${name}: {query}"));
        let (selector, label) = inner
            .rsplit_once(',')
            .expect("label_values(selector, label)");
        let label = label.trim();
        let v = prom
            .get_json(&format!(
                "/api/v1/label/{label}/values?match[]={}&start={}&end={}",
                support::url_encode(selector.trim()),
                at(first),
                at(last)
            ))
            .expect("label values");
        let got: BTreeSet<&str> = v["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str())
            .collect();
        let want: BTreeSet<&str> = match label {
            "group" => ["default"].into(),
            "site" => ["attn", "mlp"].into(),
            "rank" | "layer" => ["0", "1"].into(),
            "bucket" => ["reduce_attn_bar", "reduce_mlp_bar"].into(),
            // Backfilled data has no scrape job; the variable's `All` (`.*`) matches it.
            "job" => BTreeSet::new(),
            other => panic!("{file} ${name}: no expectation for label {other}"),
        };
        assert_eq!(got, want, "{file} ${name} = {query}");
    }
}
