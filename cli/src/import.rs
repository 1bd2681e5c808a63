//! `phasetrace import`: replays banked logs of the reference profilers (decode-profile tables,
//! route-trace lines, speculative phase and verify-split lines) into the telemetry contract, with
//! the logs' own timestamps.

use crate::Failure;
use crate::flags::OtlpFlags;
use clap::{Args, ValueEnum};
use phasetrace::Profiler;
use phasetrace::config::Protocol;
use phasetrace::config::settings;
use phasetrace_import::openmetrics::{OpenMetricsOptions, write_openmetrics};
use phasetrace_import::otlp::{self, OtlpOptions};
use phasetrace_import::{ImportError, ImportOptions, ImportedFile, Summary};
use phasetrace_names::env;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Send OTLP to the collector at OTEL_EXPORTER_OTLP_ENDPOINT (or --otlp-endpoint), over
    /// gRPC or HTTP/protobuf as OTEL_EXPORTER_OTLP_PROTOCOL (or --otlp-protocol) says, with
    /// OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT (per request), _COMPRESSION and _CERTIFICATE as
    /// live; each request under the 4 MiB message limit of OTLP/gRPC receivers by default.
    Otlp,
    /// OTLP JSON requests, one per line (JSON Lines), to --out.
    OtlpJson,
    /// OpenMetrics text with timestamps, for `promtool tsdb create-blocks-from openmetrics`.
    Openmetrics,
}

/// `phasetrace import` flags.
#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// Log files (plain or gzip); `-` reads standard input (then give --start or timestamped logs).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "otlp")]
    format: Format,
    /// Output file for otlp-json and openmetrics (`-` = standard output).
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Keep only speculative lines with this tag (repeatable; `glm5-phase` also keeps
    /// `glm5-phase-v`). Default: every tag.
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// Time of a log's first line when it has no timestamps: RFC 3339 or Unix seconds.
    /// Default: placed before the first timestamped line, or ending at the file's mtime.
    #[arg(long)]
    start: Option<String>,
    /// The `rank` attribute of everything imported: the rank that wrote the logs (the default
    /// is a live process's without PHASETRACE_RANK).
    #[arg(
        long,
        default_value_t = setting_default::<u32>(env::RANK),
        value_parser = |text: &str| setting_value::<u32>(env::RANK, text),
    )]
    rank: u32,
    /// The `group` attribute of everything imported: the collective group of the rank that
    /// wrote the logs, letters, digits, '_', '-', '.' or ':' (at most 64 bytes; the default is
    /// a live process's without PHASETRACE_GROUP).
    #[arg(
        long,
        default_value_t = setting_default::<String>(env::GROUP),
        value_parser = |text: &str| setting_value::<String>(env::GROUP, text),
    )]
    group: String,
    /// The OTLP connection of --format otlp, as the live exporters take it (headers, timeout,
    /// compression and CA from their OTEL_EXPORTER_OTLP_* variables).
    #[command(flatten)]
    otlp: OtlpFlags,
    /// No progress bar, even on a terminal.
    #[arg(long)]
    quiet: bool,
}

struct Progress {
    on: bool,
    started: Instant,
    last: Instant,
}

impl Progress {
    fn tick(&mut self, name: &str, pass: u8, s: &Summary, force: bool) {
        if !self.on || (!force && self.last.elapsed().as_millis() < 200) {
            return;
        }
        self.last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(1e-6);
        eprint!(
            "\r  {}{}: {:.1} MB, {} lines ({:.1} MB/s, {:.0} lines/s)   ",
            crate::terminal::escape(name),
            if pass == 1 { " (measuring)" } else { "" },
            s.bytes_read as f64 / 1e6,
            s.lines_read,
            s.bytes_read as f64 / 1e6 / secs,
            s.lines_read as f64 / secs
        );
        let _ = std::io::stderr().flush();
    }
}

fn summary_text(file: &ImportedFile, secs: f64) -> String {
    let s = &file.summary;
    let f = &s.records_per_format;
    let mut out = format!(
        "{}: {} lines, {:.1} MB{} in {:.2}s ({:.0} MB/s); records: {} tables ({} section intervals), {} route traces, {} speculative bursts, {} verify splits; {} runs; {} lines skipped, {} unparseable{}{}{}\n",
        crate::terminal::escape(&file.source_file),
        s.lines_read,
        s.bytes_read as f64 / 1e6,
        if s.gzip { " (gzip)" } else { "" },
        secs,
        s.bytes_read as f64 / 1e6 / secs.max(1e-6),
        f.tables,
        f.section_intervals,
        f.route_traces,
        f.spec_bursts,
        f.verify_splits,
        s.runs,
        s.lines_skipped,
        s.lines_bad,
        if s.truncated_tables > 0 {
            format!(", {} truncated tables", s.truncated_tables)
        } else {
            String::new()
        },
        if s.non_utf8_lines > 0 {
            format!(", {} non-UTF-8 lines", s.non_utf8_lines)
        } else {
            String::new()
        },
        if s.untimed_records > 0 {
            format!(", {} records without a time (left out)", s.untimed_records)
        } else {
            String::new()
        },
    );
    // What was left out for the limits, said on a line of its own (the bounds are in
    // docs/security.md).
    let mut limits = Vec::new();
    if s.overlong_lines > 0 {
        limits.push(format!(
            "{} lines over the line length limit skipped",
            s.overlong_lines
        ));
    }
    if s.series_cap_dropped > 0 {
        limits.push(format!(
            "{} records of new series past the cap of {} distinct series of a kind left out",
            s.series_cap_dropped,
            phasetrace_import::SERIES_CAP
        ));
    }
    if !limits.is_empty() {
        out += &format!("  limits: {}\n", limits.join("; "));
    }
    for (line, text) in &s.first_bad {
        // The excerpts are the input's own bytes.
        out += &format!("  line {line}: {}\n", crate::terminal::escape(text));
    }
    out
}

fn writer(out: &Option<PathBuf>, what: &str) -> Result<Box<dyn Write>, Failure> {
    match out.as_deref() {
        None => Err(Failure {
            code: 2,
            message: format!("--format {what} needs --out FILE (or --out - for standard output)"),
        }),
        Some(p) if p.as_os_str() == "-" => Ok(Box::new(BufWriter::new(std::io::stdout()))),
        Some(p) => std::fs::File::create(p)
            .map(|f| Box::new(BufWriter::new(f)) as Box<dyn Write>)
            .map_err(|e| Failure::runtime(format!("--out {}: cannot create: {e}", p.display()))),
    }
}

/// A failed send, with a note on the transport when nothing got through.
fn send_failure(e: ImportError) -> Failure {
    let hint = match &e {
        ImportError::Send(f) if f.sent.metrics.requests + f.sent.traces.requests == 0 => {
            match f.protocol {
                Protocol::Grpc => {
                    " (OTLP/gRPC listens on port 4317 by convention; an OTLP/HTTP endpoint, 4318, needs --otlp-protocol http/protobuf)"
                }
                Protocol::HttpProtobuf => {
                    " (OTLP/HTTP listens on port 4318 by convention; an OTLP/gRPC endpoint, 4317, needs --otlp-protocol grpc)"
                }
            }
        }
        _ => "",
    };
    Failure::runtime(format!("{e}{hint}"))
}

pub(crate) fn run(a: ImportArgs) -> Result<(), Failure> {
    let start = match &a.start {
        None => None,
        Some(t) => Some(phasetrace_import::parse_time(t).ok_or_else(|| {
            Failure::config(format!(
                "--start {t:?}: expected RFC 3339 (2026-09-30T12:00:00Z) or Unix seconds"
            ))
        })?),
    };
    // The OTLP connection is resolved like the profiler's: flag, then environment.
    let otlp = if a.format == Format::Otlp {
        let b = a.otlp.apply(Profiler::builder()).map_err(Failure::config)?;
        let cfg = b.config().map_err(Failure::config)?;
        Some(cfg.otlp.ok_or_else(|| Failure {
            code: 3,
            message: "invalid configuration: --format otlp needs OTEL_EXPORTER_OTLP_ENDPOINT or --otlp-endpoint (OTLP/gRPC by default, e.g. http://127.0.0.1:4317; OTLP/HTTP with --otlp-protocol http/protobuf, e.g. http://127.0.0.1:4318); or choose --format otlp-json or openmetrics".into(),
        })?)
    } else {
        None
    };
    let mut progress = Progress {
        on: !a.quiet && std::io::stderr().is_terminal(),
        started: Instant::now(),
        last: Instant::now(),
    };
    let mut files = Vec::new();
    for path in &a.files {
        let options = ImportOptions {
            start_unix_nanos: start,
            tags: a.tags.clone(),
            ..ImportOptions::default()
        };
        let t = Instant::now();
        let name = path.display().to_string();
        let file = if path.as_os_str() == "-" {
            let stdin = std::io::stdin();
            phasetrace_import::import_reader_with_progress(
                stdin.lock(),
                ImportOptions {
                    source_file: "stdin".into(),
                    ..options
                },
                &mut |s| progress.tick(&name, 2, s, false),
            )
        } else {
            phasetrace_import::import_path_with_progress(path, options, &mut |pass, s| {
                progress.tick(&name, pass, s, false)
            })
        }
        .map_err(Failure::runtime)?;
        progress.tick(&name, 2, &file.summary, true);
        if progress.on {
            eprintln!();
        }
        eprint!("{}", summary_text(&file, t.elapsed().as_secs_f64()));
        files.push(file);
    }

    let (rank, group) = (a.rank, a.group.clone());
    match a.format {
        Format::Otlp => {
            let otlp = otlp.ok_or_else(|| Failure::runtime("no OTLP endpoint"))?;
            let opts = OtlpOptions {
                rank,
                group: group.clone(),
                ..OtlpOptions::default()
            };
            let sent = phasetrace_import::send::send(&files, &otlp, &opts).map_err(send_failure)?;
            let st = &sent.stats;
            eprintln!(
                "sent to {} over {}: {st}; largest request {} bytes of protobuf (at most {} each)",
                otlp.endpoint,
                otlp.protocol,
                st.metrics
                    .largest_request_bytes
                    .max(st.traces.largest_request_bytes),
                opts.max_request_bytes,
            );
            if let Some(why) = &sent.rejection {
                return Err(Failure::runtime(format!(
                    "{} at {} rejected {} points and {} spans of what was sent: {why}",
                    otlp.protocol, otlp.endpoint, st.rejected_points, st.rejected_spans
                )));
            }
        }
        Format::OtlpJson => {
            let mut w = writer(&a.out, "otlp-json")?;
            let opts = OtlpOptions {
                rank,
                group: group.clone(),
                ..OtlpOptions::default()
            };
            let m = otlp::metrics_requests(&files, &opts, |r, _| otlp::write_json_line(&mut w, &r))
                .map_err(Failure::runtime)?;
            let t = otlp::trace_requests(&files, &opts, |r, _| otlp::write_json_line(&mut w, &r))
                .map_err(Failure::runtime)?;
            w.flush().map_err(Failure::runtime)?;
            eprintln!(
                "wrote {} metric requests ({} points) and {} trace requests ({} spans)",
                m.requests, m.items, t.requests, t.items
            );
        }
        Format::Openmetrics => {
            let mut w = writer(&a.out, "openmetrics")?;
            let opts = OpenMetricsOptions {
                rank,
                group,
                ..OpenMetricsOptions::default()
            };
            let st = write_openmetrics(&mut w, &files, &opts).map_err(Failure::runtime)?;
            w.flush().map_err(Failure::runtime)?;
            eprintln!(
                "wrote {} series, {} samples; backfill with: promtool tsdb create-blocks-from openmetrics FILE DATA_DIR",
                st.series, st.samples
            );
        }
    }
    Ok(())
}

/// The default of the library's setting of `var` (the settings table is the one home of
/// defaults), read as `T`.
fn setting_default<T: std::str::FromStr + Default>(var: &str) -> T {
    settings::find(var)
        .and_then(|s| s.default_text().parse().ok())
        .unwrap_or_default()
}

/// `text` checked by the library's parser of `var` (the same error as the variable), then read.
fn setting_value<T: std::str::FromStr>(var: &str, text: &str) -> Result<T, String> {
    let setting = settings::find(var).ok_or_else(|| format!("{var}: no such setting"))?;
    setting.check(text).map_err(|e| e.to_string())?;
    text.trim()
        .parse()
        .map_err(|_| format!("expected {}", setting.expected()))
}
