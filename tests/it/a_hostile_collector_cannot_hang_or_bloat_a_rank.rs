//! Against a collector that answers OTLP/HTTP and OTLP/gRPC with a 1 GiB body, an endless slow
//! body, garbage, a redirect loop, an HTTP/2 flood of PINGs or SETTINGS, or a TLS certificate
//! for another name (`phasetrace_testkit::HostileCollector`), a profiler recording steps keeps
//! every flush and its shutdown within the OTLP timeout (plus a margin for a busy machine), its
//! peak resident memory grows by less than [`RSS_BOUND_KIB`], every failure is counted in
//! `phasetrace.otlp.export.failures` with the reason that names the misbehaviour (and said once
//! on stderr), and the recording calls return at once with every step counted (issue "Hostile
//! peers, second round", point 3).
//!
//! Each case runs in a child process (this test, run again with [`CASE_VAR`] set), so that its
//! resident memory is its own, not the test binary's other tests'; up to [`PARALLEL`] at once.

use phasetrace::config::ExporterSet;
use phasetrace::{Profiler, Protocol, Section, SectionLevel, Site};
use phasetrace_testkit::{HostileCollector, HostileMode, OtlpReceiver, TempDir, http_get};
use std::process::Command;
use std::time::{Duration, Instant};

/// The OTLP timeout of every case.
const OTLP_TIMEOUT: Duration = Duration::from_millis(2_000);
/// What a flush or shutdown may take beyond its timeout on a busy machine (the worker's last
/// drain, thread hand-offs, a flood's server and client sharing a busy machine's cores); less
/// than a second timeout, so that two exports one after the other, or one that waits for a
/// body trickled a byte a second, fail.
const MARGIN: Duration = Duration::from_millis(1_500);
/// The most the peak resident memory of a case may exceed its resident memory before the
/// profiler was built (runtimes, clients, TLS roots, the Prometheus endpoint).
const RSS_BOUND_KIB: u64 = 48 * 1024;
/// The longest a recording call may take on a busy machine (it never waits on an export).
const HOT_PATH_BOUND: Duration = Duration::from_millis(50);
/// The child's case: `mode/protocol/traces`.
const CASE_VAR: &str = "PHASETRACE_TEST_HOSTILE_CASE";
/// `phasetrace.otlp.export.failures` as the Prometheus endpoint names it.
const FAILURES: &str = "phasetrace_otlp_export_failures_total";
/// Children at once.
const PARALLEL: usize = 4;
/// The name of this test, as the child is asked to run it.
const TEST: &str = "a_hostile_collector_cannot_hang_or_bloat_a_rank::every_export_ends_in_time_memory_stays_flat_and_the_reason_is_counted";

/// One case: the collector's misbehaviour (`None`: a collector that behaves, the baseline of
/// every figure), the protocol and whether traces are on.
#[derive(Clone, Copy, Debug)]
struct Case {
    mode: Option<HostileMode>,
    protocol: Protocol,
    traces: bool,
}

fn cases() -> Vec<Case> {
    let mut out: Vec<Case> = HostileMode::ALL
        .into_iter()
        .filter(|m| *m != HostileMode::TlsWrongName)
        .map(|mode| Case {
            mode: Some(mode),
            protocol: if mode.is_http() {
                Protocol::HttpProtobuf
            } else {
                Protocol::Grpc
            },
            traces: true,
        })
        .collect();
    for protocol in [Protocol::HttpProtobuf, Protocol::Grpc] {
        out.push(Case {
            mode: Some(HostileMode::TlsWrongName),
            protocol,
            traces: true,
        });
        // The baseline: a collector that answers as it should.
        out.push(Case {
            mode: None,
            protocol,
            traces: true,
        });
    }
    // The SDK's own metrics exporters (traces off).
    for (mode, protocol) in [
        (HostileMode::HttpHugeBody, Protocol::HttpProtobuf),
        (HostileMode::HttpRedirectAway, Protocol::HttpProtobuf),
        (HostileMode::GrpcHugeMessage, Protocol::Grpc),
        (HostileMode::GrpcSlowBody, Protocol::Grpc),
    ] {
        out.push(Case {
            mode: Some(mode),
            protocol,
            traces: false,
        });
    }
    out
}

/// The `reason` each misbehaviour must be counted under.
/// The reasons a failure against `mode` may be counted under: one, but for garbage frames,
/// where the call in flight when the client's HTTP/2 connection fails on the bad frame is
/// cancelled as "connection closed" (hyper's report to the call, about a third of the time
/// here) rather than failed by the frame's error itself.
fn expected(mode: HostileMode) -> &'static [&'static str] {
    use phasetrace::names::export_failure as reason;
    match mode {
        HostileMode::HttpHugeBody | HostileMode::GrpcHugeMessage => &[reason::RESPONSE_TOO_LARGE],
        HostileMode::HttpSlowBody
        | HostileMode::GrpcSlowBody
        | HostileMode::PingFlood
        | HostileMode::SettingsFlood => &[reason::TIMEOUT],
        HostileMode::HttpGarbage | HostileMode::GrpcGarbageMessage => &[reason::BAD_RESPONSE],
        HostileMode::GrpcGarbageFrames => &[reason::BAD_RESPONSE, reason::CONNECT],
        HostileMode::HttpRedirectLoop | HostileMode::HttpRedirectAway => &[reason::REDIRECT],
        HostileMode::TlsWrongName => &[reason::TLS],
    }
}

fn encode(c: Case) -> String {
    let mode = c
        .mode
        .map_or_else(|| "WellBehaved".to_owned(), |m| format!("{m:?}"));
    format!("{mode}/{:?}/{}", c.protocol, c.traces)
}

fn decode(s: &str) -> Case {
    let mut it = s.split('/');
    let mode = it.next().unwrap_or_default();
    let mode = (mode != "WellBehaved").then(|| {
        HostileMode::ALL
            .into_iter()
            .find(|m| format!("{m:?}") == mode)
            .unwrap_or_else(|| panic!("{CASE_VAR}={s}: no mode {mode}"))
    });
    let protocol = match it.next() {
        Some("Grpc") => Protocol::Grpc,
        _ => Protocol::HttpProtobuf,
    };
    let traces = it.next() == Some("true");
    Case {
        mode,
        protocol,
        traces,
    }
}

/// A `/proc/self/status` figure in KiB (`VmRSS`, `VmHWM`).
fn status_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/self/status"))
}

/// The failures counted on the Prometheus endpoint, as `signal:reason` (those above 0).
fn failures(url: &str) -> Vec<String> {
    let (_, body) = http_get(url).expect("scraping the profiler's own endpoint");
    let mut out = Vec::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix(&format!("{FAILURES}{{")) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        if value.trim().parse::<f64>().unwrap_or(0.0) > 0.0 {
            out.push(format!("{}:{}", label("signal"), label("reason")));
        }
    }
    out.sort();
    out
}

/// The collector of a case: hostile, or the in-process receiver that behaves.
enum Collector {
    Hostile(HostileCollector),
    WellBehaved(OtlpReceiver),
}

impl Collector {
    fn endpoint(&self) -> String {
        match self {
            Collector::Hostile(h) => h.endpoint(),
            Collector::WellBehaved(r) => r.endpoint(),
        }
    }

    fn bytes_sent(&self) -> u64 {
        match self {
            Collector::Hostile(h) => h.bytes_sent(),
            Collector::WellBehaved(_) => 0,
        }
    }

    fn ca_pem(&self) -> Option<&str> {
        match self {
            Collector::Hostile(h) => h.ca_pem(),
            Collector::WellBehaved(_) => None,
        }
    }
}

/// Runs one case in this process and prints its figures as one `HOSTILE` line.
fn child(case: Case) {
    let server = match case.mode {
        Some(mode) => Collector::Hostile(HostileCollector::start(mode)),
        None if case.protocol == Protocol::Grpc => {
            Collector::WellBehaved(OtlpReceiver::start_grpc())
        }
        None => Collector::WellBehaved(OtlpReceiver::start()),
    };
    let dir = TempDir::new("phasetrace-hostile");
    let rss_before = status_kib("VmRSS");
    let mut b = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_otlp_endpoint(Some(&server.endpoint()))
        .with_otlp_protocol(case.protocol)
        .with_otlp_timeout(OTLP_TIMEOUT)
        .with_shutdown_timeout(OTLP_TIMEOUT)
        .with_metric_export_interval(Duration::from_secs(3600));
    if !case.traces {
        b = b.with_traces_exporter(ExporterSet::NONE);
    }
    if let Some(ca) = server.ca_pem() {
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, ca).expect("writing the CA");
        b = b.with_otlp_certificate(path);
    }
    let p = b.build().expect("the profiler");
    let url = p.prometheus_url().expect("the endpoint");
    let rec = p.recorder();
    let (mut hot, mut flush) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..2 {
        for layer in 0..20u32 {
            let t = Instant::now();
            {
                let _step = rec.step();
                let _s = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
            }
            hot = hot.max(t.elapsed());
        }
        let t = Instant::now();
        p.flush();
        flush = flush.max(t.elapsed());
    }
    let reasons = failures(&url);
    let steps = p.stats().steps;
    drop(rec);
    let t = Instant::now();
    p.shutdown();
    let shutdown = t.elapsed();
    let growth = status_kib("VmHWM").saturating_sub(rss_before);
    println!(
        "HOSTILE flush_ms={} shutdown_ms={} rss_growth_kib={growth} hot_us={} steps={steps} \
         served_kib={} reasons={}",
        flush.as_millis(),
        shutdown.as_millis(),
        hot.as_micros(),
        server.bytes_sent() / 1024,
        reasons.join(",")
    );
}

struct Figures {
    case: Case,
    line: String,
    stderr: String,
    field: std::collections::HashMap<String, String>,
}

impl Figures {
    fn num(&self, k: &str) -> u64 {
        self.field
            .get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{:?}: no {k} in {:?}", self.case, self.line))
    }
}

fn run_child(case: Case) -> std::process::Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CASE_VAR, encode(case))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running the case in a child")
}

fn figures(case: Case, child: std::process::Child) -> Figures {
    let out = child.wait_with_output().expect("the child's output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("HOSTILE ").map(|(_, figures)| figures))
        .unwrap_or_else(|| panic!("{case:?}: the child printed no figures\n{stdout}\n{stderr}"))
        .to_owned();
    let field = line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Figures {
        case,
        line,
        stderr,
        field,
    }
}

fn check(f: &Figures) {
    let c = f.case;
    let bound = (OTLP_TIMEOUT + MARGIN).as_millis() as u64;
    assert!(
        f.num("flush_ms") <= bound,
        "{c:?}: a flush took {} ms (OTLP timeout {OTLP_TIMEOUT:?}): {}",
        f.num("flush_ms"),
        f.line
    );
    assert!(
        f.num("shutdown_ms") <= bound,
        "{c:?}: shutdown took {} ms (timeout {OTLP_TIMEOUT:?}): {}",
        f.num("shutdown_ms"),
        f.line
    );
    assert!(
        f.num("rss_growth_kib") < RSS_BOUND_KIB,
        "{c:?}: the peak resident memory grew by {} KiB: {}",
        f.num("rss_growth_kib"),
        f.line
    );
    assert!(
        f.num("hot_us") < HOT_PATH_BOUND.as_micros() as u64,
        "{c:?}: a recording call took {} µs: {}",
        f.num("hot_us"),
        f.line
    );
    assert_eq!(f.num("steps"), 40, "{c:?}: every step counted: {}", f.line);
    let reasons = f.field.get("reasons").cloned().unwrap_or_default();
    let Some(mode) = c.mode else {
        assert_eq!(reasons, "", "{c:?}: no export failed: {}", f.line);
        return;
    };
    let want = expected(mode);
    let mut signals = vec!["metrics"];
    if c.traces {
        signals.push("traces");
    }
    for signal in signals {
        assert!(
            reasons
                .split(',')
                .any(|r| want.iter().any(|w| r == format!("{signal}:{w}"))),
            "{c:?}: the {signal} failures are not counted as {want:?}: {}",
            f.line
        );
        // The first failure is said on stderr with its reason (which of several a racing
        // misbehaviour shows first, a counted one).
        let said = f
            .stderr
            .lines()
            .find(|l| l.contains(&format!("OTLP {signal} export to ")))
            .and_then(|l| l.split_once(" reason ")?.1.split([' ', ':']).next())
            .unwrap_or_else(|| panic!("{c:?}: no {signal} failure on stderr:\n{}", f.stderr));
        assert!(
            reasons.split(',').any(|r| r == format!("{signal}:{said}")),
            "{c:?}: stderr names {said:?}, not counted: {}\n{}",
            f.line,
            f.stderr
        );
    }
}

#[test]
fn every_export_ends_in_time_memory_stays_flat_and_the_reason_is_counted() {
    if let Ok(case) = std::env::var(CASE_VAR) {
        child(decode(&case));
        return;
    }
    let all = cases();
    let mut got = Vec::new();
    for chunk in all.chunks(PARALLEL) {
        let running: Vec<_> = chunk.iter().map(|c| (*c, run_child(*c))).collect();
        got.extend(running.into_iter().map(|(c, child)| figures(c, child)));
    }
    for f in &got {
        eprintln!("{}: {}", encode(f.case), f.line);
    }
    for f in &got {
        check(f);
    }
}
