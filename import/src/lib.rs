//! `phasetrace import`: replays banked logs of the two reference profilers as telemetry.
//!
//! ```text
//! file / stdin ─► gzip? (magic bytes) ─► lines as bytes ─► parse (per line, no allocation
//!   unless a marker is found) ─► Importer: runs, time base, cumulative→delta ─► ImportRecord
//!   ─► series (cumulative per resource) ─► openmetrics (promtool backfill)
//!                                          | otlp (proto messages: protobuf to send, OTLP/JSON)
//! ```
//!
//! The series are those a live run exports (names, units and attribute keys of
//! [`phasetrace_names`]; see `series` for which record feeds which): section durations by bucket,
//! rendezvous waits by site, the per-layer counters of each route-trace probe by (bucket,
//! site, layer), and `rank` and `group` on all of them.
//!
//! # Formats
//!
//! Four formats are recognised anywhere in a line, among unrelated lines, with or without the
//! `tracing` fmt prefix (`TIMESTAMP LEVEL target: `, ANSI colours or not):
//!
//! 1. the GLM decode-profile table, a header `GLM decode profile after S steps — X ms/token ...`
//!    followed by one indented row per bucket (the rows are continuation lines of one event);
//! 2. route-trace lines `GLMTRACE step= site= L= moe= bar_us= ids=`;
//! 3. speculative phase lines `[tag] rounds= k= total=..ms | ... | per-round ms: ...`;
//! 4. level-2 verify sub-split lines `[tag] rounds= k= | per-round ms: vkda= (scan=) ...`.
//!
//! # Runs and cumulative tables
//!
//! A table holds totals since its process started. Consecutive tables of one run become
//! per-interval deltas ([`ImportRecord::SectionInterval`]). A new run (`source.run` + 1) starts
//! when a table's step count does not exceed the previous table's, or when a table or a route
//! trace reports fewer steps than the run has already seen. One file is assumed to hold one
//! rank: interleaved ranks would look like restarts.
//!
//! Precision: a row's total is recovered to within `min(5 µs × steps, 50 ns × calls)` and its
//! call count exactly whenever the bucket has a fixed number of calls per step (see
//! `parse::reconstruct_row`); other call counts land within the `calls/tok` interval. Deltas
//! telescope exactly: summed over a run they equal the run's final reconstructed totals, and
//! they are never negative (a reconstruction below the previous one, possible only within the
//! rounding, is held at the previous one).
//!
//! A truncated table (a cut row, or rows whose per-token times fall short of the header's) is
//! counted in [`Summary::truncated_tables`] and reported; its complete rows are still used,
//! because each row stands alone. Buckets it lost keep their last totals, so their time since
//! then lands, exactly, in the next table's interval (`steps_in_interval` spans both).
//!
//! # Time base
//!
//! Each record gets `at`, Unix nanoseconds, at the end of what it measured:
//! - a line with a `tracing` timestamp uses it, and becomes the anchor;
//! - a line without one (the speculative tracer prints with `eprintln!`) is placed at the last
//!   anchor plus the measured time of the untimestamped records since it: a phase line adds its
//!   burst total, a table its interval's decode time, other lines nothing (a verify split
//!   shares its burst's time);
//! - before any timestamped line the anchor is [`ImportOptions::start_unix_nanos`]; when that is
//!   `None` too, `at` is `None` and the writers skip the record.
//!
//! [`import_path`] picks the start itself when none is given: with a first timestamp in the
//! file, the untimestamped head is placed to end at it; without any, the whole file is placed
//! to end at the file's modification time (its last write).
//! `at` never goes backwards within a file: a line that would is held at the previous time and
//! counted in [`Summary::clamped_timestamps`].
//!
//! # Use
//!
//! ```no_run
//! use phasetrace_import::{ImportOptions, import_path, openmetrics};
//!
//! let file = import_path("glm.log".as_ref(), ImportOptions::default())?;
//! eprintln!("{:?}", file.summary);
//! let mut out = std::io::stdout().lock();
//! openmetrics::write_openmetrics(&mut out, &[file], &Default::default())?;
//! # Ok::<(), phasetrace_import::ImportError>(())
//! ```
//!
//! The `phasetrace import` command (`phasetrace-cli`) is its user. It reads the telemetry contract
//! (`phasetrace_names`, `phasetrace::vocab`), the settings (`phasetrace::config::settings`) and
//! the OTLP settings (`phasetrace::config::OtlpConfig`) through the core's public API only.

mod contract;
pub mod openmetrics;
pub mod otlp;
mod parse;
pub mod send;
mod series;
mod transport;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use parse::{GlmHeader, Marker, Scaled, SpecLine};
pub use parse::{SpecPhases, VerifyParts};

/// Errors of the import: reading its input or writing its output. Lines that cannot be parsed
/// are not errors; they are counted and reported in the [`Summary`].
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The input file could not be opened or its metadata read.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Reading (or decompressing) the input failed.
    #[error("reading {file} after line {line}: {source}")]
    Read {
        /// The source label of the input.
        file: String,
        /// Lines read before the failure.
        line: u64,
        /// The cause; `InvalidInput`/`InvalidData` for a corrupt gzip stream.
        source: io::Error,
    },
    /// The OTLP client could not be set up (its TLS configuration, its headers).
    #[error("cannot send to {endpoint} over {protocol}: {detail}")]
    Client {
        /// The endpoint.
        endpoint: String,
        /// The transport.
        protocol: phasetrace::config::Protocol,
        /// What went wrong (header values never appear here).
        detail: String,
    },
    /// A request failed (refused, unanswered, or answered with an error): nothing after it
    /// was sent.
    #[error(transparent)]
    Send(Box<send::SendError>),
    /// Writing an output failed.
    #[error("writing {format} output: {source}")]
    Write {
        /// `openmetrics` or `otlp-json`.
        format: &'static str,
        /// The cause.
        source: io::Error,
    },
}

/// How to read one input.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Label of the input (`source.file` / `source_file`); [`import_path`] fills in the path
    /// when this is empty.
    pub source_file: String,
    /// Time of the input's first line, Unix nanoseconds, for lines before any timestamped line
    /// (the CLI's `--start`). `None`: [`import_path`] derives it; [`Importer`] leaves such
    /// lines without a time.
    pub start_unix_nanos: Option<u64>,
    /// Speculative tags to keep (`--tag`); empty keeps all. A verify-split line is kept when
    /// its tag is listed or is a listed tag plus `-v` (the reference's pairing).
    pub tags: Vec<String>,
    /// Longer lines are skipped unread and counted in [`Summary::overlong_lines`].
    pub max_line_bytes: usize,
}

impl Default for ImportOptions {
    fn default() -> Self {
        Self {
            source_file: String::new(),
            start_unix_nanos: None,
            tags: Vec::new(),
            max_line_bytes: 16 << 20,
        }
    }
}

/// One typed record replayed from a log. `run` is the run index within the file (`source.run`);
/// `at` is Unix nanoseconds at the end of what the record measured (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportRecord {
    /// The decode steps a table header adds since the previous table of the run.
    DecodeSteps {
        /// Run index within the file.
        run: u32,
        /// Time of the table.
        at: Option<u64>,
        /// Steps since process start.
        steps: u64,
        /// Steps since the previous table of the run.
        steps_in_interval: u64,
        /// Profiled decode time since process start (header ms/token × steps), nanoseconds.
        decode_ns: u64,
    },
    /// One bucket's time and calls between two tables of a run.
    SectionInterval {
        /// Run index within the file.
        run: u32,
        /// Time of the later table.
        at: Option<u64>,
        /// Steps the interval covers for this bucket (longer than the table interval when the
        /// bucket was missing from a truncated table, or first called later).
        steps_in_interval: u64,
        /// Bucket (section) name as printed.
        bucket: String,
        /// Nanoseconds in the interval.
        total_ns: u64,
        /// Calls in the interval.
        calls: u64,
    },
    /// One rendezvous probe of one reduce site in one layer.
    RouteTrace {
        /// Run index within the file.
        run: u32,
        /// Time of the line: the end of the probe.
        at: Option<u64>,
        /// Decode steps completed when it was logged.
        step: u64,
        /// Reduce site (`attn`, `mlp`).
        site: String,
        /// Layer index.
        layer: u32,
        /// Whether the layer's MLP is routed.
        moe: bool,
        /// Probe time, nanoseconds (printed as µs with one decimal: ±50 ns).
        bar_ns: u64,
        /// Expert ids last read back before the probe.
        expert_ids: Vec<u32>,
    },
    /// One speculative burst's phase totals.
    SpecBurst {
        /// Run index within the file.
        run: u32,
        /// Time of the line: the end of the burst.
        at: Option<u64>,
        /// The caller's tag.
        tag: String,
        /// Rounds in the burst.
        rounds: u64,
        /// Draft length.
        k: u32,
        /// Totals over the burst, nanoseconds (within 5 µs, or 0.5 µs × rounds if tighter).
        phases: SpecPhases,
    },
    /// One burst's level-2 verify sub-split.
    VerifySplit {
        /// Run index within the file.
        run: u32,
        /// Time of the line (that of its burst).
        at: Option<u64>,
        /// The caller's verify tag.
        tag: String,
        /// Rounds in the burst.
        rounds: u64,
        /// Draft length.
        k: u32,
        /// Totals over the burst, nanoseconds: per-round figures × rounds (±0.5 µs × rounds).
        parts: VerifyParts,
    },
}

impl ImportRecord {
    /// The record's time.
    pub fn at(&self) -> Option<u64> {
        match self {
            Self::DecodeSteps { at, .. }
            | Self::SectionInterval { at, .. }
            | Self::RouteTrace { at, .. }
            | Self::SpecBurst { at, .. }
            | Self::VerifySplit { at, .. } => *at,
        }
    }

    /// The record's run index within its file.
    pub fn run(&self) -> u32 {
        match self {
            Self::DecodeSteps { run, .. }
            | Self::SectionInterval { run, .. }
            | Self::RouteTrace { run, .. }
            | Self::SpecBurst { run, .. }
            | Self::VerifySplit { run, .. } => *run,
        }
    }
}

/// Records accepted, per format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FormatCounts {
    /// Table headers accepted (each yields one [`ImportRecord::DecodeSteps`]).
    pub tables: u64,
    /// Table rows turned into [`ImportRecord::SectionInterval`].
    pub section_intervals: u64,
    /// [`ImportRecord::RouteTrace`] records.
    pub route_traces: u64,
    /// [`ImportRecord::SpecBurst`] records.
    pub spec_bursts: u64,
    /// [`ImportRecord::VerifySplit`] records.
    pub verify_splits: u64,
}

/// What one input held, and what could not be used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Whether the input was gzip-compressed.
    pub gzip: bool,
    /// Lines read.
    pub lines_read: u64,
    /// Bytes read, after decompression.
    pub bytes_read: u64,
    /// Records produced, per format.
    pub records_per_format: FormatCounts,
    /// Candidate lines (carrying a format's marker, or a table row) that produced no record:
    /// unparseable, filtered out by tag, or rows outside a table.
    pub lines_skipped: u64,
    /// Candidate lines that failed to parse (part of `lines_skipped`).
    pub lines_bad: u64,
    /// Speculative lines dropped by the tag filter (part of `lines_skipped`).
    pub lines_filtered: u64,
    /// The first five unparseable candidate lines and truncated tables: line number and why.
    pub first_bad: Vec<(u64, String)>,
    /// Tables that were cut short; their complete rows were used.
    pub truncated_tables: u64,
    /// Lines that were not valid UTF-8 (parsed as bytes; names converted lossily).
    pub non_utf8_lines: u64,
    /// Lines longer than [`ImportOptions::max_line_bytes`], skipped (the first few also in
    /// [`Summary::first_bad`]).
    pub overlong_lines: u64,
    /// Records left out because they would have added a series past [`SERIES_CAP`].
    pub series_cap_dropped: u64,
    /// Runs seen (restarts + 1), 0 for an input without GLM data or records.
    pub runs: u32,
    /// Lines with a `tracing` timestamp.
    pub timestamped_lines: u64,
    /// Records whose time was held at the previous record's, to keep time monotonic.
    pub clamped_timestamps: u64,
    /// Records without a time (no timestamp yet and no start given).
    pub untimed_records: u64,
    /// The first `tracing` timestamp of the input.
    pub first_timestamp: Option<u64>,
    /// Measured time placed before the first timestamped line.
    pub synthetic_ns_before_first_timestamp: u64,
    /// Measured time placed on untimestamped lines, in all.
    pub synthetic_ns_total: u64,
}

const MAX_FIRST_BAD: usize = 5;
const EXCERPT_BYTES: usize = 160;

impl Summary {
    /// Keeps the first few problems: why, then (when given) the start of the line.
    fn report(&mut self, line_no: u64, why: impl fmt::Display, line: &[u8]) {
        if self.first_bad.len() >= MAX_FIRST_BAD {
            return;
        }
        let text = if line.is_empty() {
            why.to_string()
        } else {
            let cut = &line[..line.len().min(EXCERPT_BYTES)];
            let ellipsis = if line.len() > EXCERPT_BYTES {
                "…"
            } else {
                ""
            };
            format!("{why}: {}{ellipsis}", String::from_utf8_lossy(cut))
        };
        self.first_bad.push((line_no, text));
    }

    fn bad(&mut self, line_no: u64, why: impl fmt::Display, line: &[u8]) {
        self.lines_bad += 1;
        self.lines_skipped += 1;
        self.report(line_no, why, line);
    }
}

/// Places records in time (see the module docs).
#[derive(Debug)]
struct Clock {
    anchor: Option<u64>,
    offset: u64,
    last: Option<u64>,
}

impl Clock {
    fn stamp(&mut self, ts: u64, summary: &mut Summary) {
        self.anchor = Some(ts);
        self.offset = 0;
        summary.timestamped_lines += 1;
        summary.first_timestamp.get_or_insert(ts);
    }

    /// Moves the clock past what an untimestamped line measured; a stamped line carries its
    /// own time.
    fn advance(&mut self, stamped: bool, advance_ns: u64, summary: &mut Summary) {
        if stamped {
            return;
        }
        self.offset = self.offset.saturating_add(advance_ns);
        summary.synthetic_ns_total = summary.synthetic_ns_total.saturating_add(advance_ns);
        if summary.first_timestamp.is_none() {
            summary.synthetic_ns_before_first_timestamp = summary
                .synthetic_ns_before_first_timestamp
                .saturating_add(advance_ns);
        }
    }

    /// Time of the record of the current line; `None` before any anchor.
    fn place(&mut self, summary: &mut Summary) -> Option<u64> {
        let anchor = self.anchor?;
        let mut at = anchor.saturating_add(self.offset);
        if let Some(last) = self.last.filter(|&last| at < last) {
            summary.clamped_timestamps += 1;
            at = last;
        }
        self.last = Some(at);
        Some(at)
    }
}

/// A bucket's last known cumulative totals in the current run.
#[derive(Debug, Default, Clone, Copy)]
struct Cumulative {
    steps: u64,
    total_ns: u64,
    calls: u64,
}

/// Run detection and the cumulative state of the current run.
#[derive(Debug, Default)]
struct RunState {
    run: u32,
    last_table_steps: Option<u64>,
    high_water: u64,
    last_decode_ns: u64,
    buckets: HashMap<Box<[u8]>, Cumulative>,
}

impl RunState {
    /// Notes a step count; starts a new run when it shows a restart.
    fn observe(&mut self, steps: u64, is_table: bool) {
        let restart = steps < self.high_water
            || (is_table && self.last_table_steps.is_some_and(|last| steps <= last));
        if restart {
            *self = Self {
                run: self.run + 1,
                ..Self::default()
            };
        }
        self.high_water = self.high_water.max(steps);
    }
}

/// A table being read: its header and the rows so far.
#[derive(Debug)]
struct PendingTable {
    line_no: u64,
    at: Option<u64>,
    header: GlmHeader,
    rows: Vec<(Box<[u8]>, Scaled, parse::RowTotals)>,
    cut: bool,
}

/// The per-line state machine, apart from the input so that a line can be borrowed from the
/// input's buffer while the state changes.
#[derive(Debug)]
struct LineParser {
    tags: Vec<Vec<u8>>,
    summary: Summary,
    out: VecDeque<ImportRecord>,
    clock: Clock,
    runs: RunState,
    table: Option<PendingTable>,
    ansi: Vec<u8>,
    series: SeriesCap,
}

/// The importer's cap on distinct series: the label sets seen so far of each kind of record
/// (route traces by (site, layer), table rows by bucket, speculative lines by tag), at most
/// [`SERIES_CAP`] each. A record that would add one past the cap is left out and counted in
/// [`Summary::series_cap_dropped`], so that memory stays bounded however many distinct names
/// or layers an input holds.
#[derive(Debug, Default)]
struct SeriesCap {
    /// Per kind: name -> the layers seen with it (0 for kinds without a layer).
    seen: [HashMap<String, HashSet<u32>>; 4],
    /// Per kind: distinct (name, layer) pairs in `seen`.
    count: [usize; 4],
}

/// Distinct series of each kind one input may add: route-trace (site, layer) pairs, table
/// buckets, speculative tags, verify tags. The live library's per-layer cap
/// (`PHASETRACE`'s 8,192 series per per-layer instrument) as the importer's.
pub const SERIES_CAP: usize = 8_192;

impl SeriesCap {
    /// Whether `record` may be kept: its series is known, or there is room for it.
    fn admits(&mut self, record: &ImportRecord) -> bool {
        let (kind, name, layer) = match record {
            ImportRecord::DecodeSteps { .. } => return true,
            ImportRecord::RouteTrace { site, layer, .. } => (0, site, *layer),
            ImportRecord::SectionInterval { bucket, .. } => (1, bucket, 0),
            ImportRecord::SpecBurst { tag, .. } => (2, tag, 0),
            ImportRecord::VerifySplit { tag, .. } => (3, tag, 0),
        };
        if self.seen[kind]
            .get(name.as_str())
            .is_some_and(|layers| layers.contains(&layer))
        {
            return true;
        }
        if self.count[kind] >= SERIES_CAP {
            return false;
        }
        self.count[kind] += 1;
        self.seen[kind]
            .entry(name.clone())
            .or_default()
            .insert(layer);
        true
    }
}

impl LineParser {
    fn new(options: &ImportOptions) -> Self {
        Self {
            tags: options.tags.iter().map(|t| t.as_bytes().to_vec()).collect(),
            summary: Summary::default(),
            out: VecDeque::new(),
            clock: Clock {
                anchor: options.start_unix_nanos,
                offset: 0,
                last: None,
            },
            runs: RunState::default(),
            table: None,
            ansi: Vec::new(),
            series: SeriesCap::default(),
        }
    }

    /// A line longer than `max` bytes: counted, said, not parsed; a table in progress ends at
    /// it. The same wherever the line lies in the input's buffers.
    fn overlong(&mut self, max: usize) {
        self.summary.lines_read += 1;
        self.summary.overlong_lines += 1;
        let line_no = self.summary.lines_read;
        self.summary.report(
            line_no,
            format_args!("longer than the limit of {max} bytes: skipped"),
            b"",
        );
        self.finish_table();
    }

    fn emit(&mut self, record: ImportRecord) {
        if !self.series.admits(&record) {
            if self.summary.series_cap_dropped == 0 {
                let line_no = self.summary.lines_read;
                self.summary.report(
                    line_no,
                    format_args!(
                        "more than {SERIES_CAP} distinct series of one kind (route-trace site and layer, table bucket or speculative tag): this and every later record of a new one left out"
                    ),
                    b"",
                );
            }
            self.summary.series_cap_dropped += 1;
            return;
        }
        if record.at().is_none() {
            self.summary.untimed_records += 1;
        }
        self.summary.runs = self.summary.runs.max(self.runs.run + 1);
        self.out.push_back(record);
    }

    /// Handles one line, without its `\n`.
    fn line(&mut self, raw: &[u8]) {
        self.summary.lines_read += 1;
        let line_no = self.summary.lines_read;
        if !raw.is_ascii() && std::str::from_utf8(raw).is_err() {
            self.summary.non_utf8_lines += 1;
        }
        let line = parse::trim_end(raw);
        let ts = parse::line_timestamp(line);
        if let Some(ts) = ts {
            self.clock.stamp(ts, &mut self.summary);
        }
        if let Some(table) = &mut self.table {
            if ts.is_none() && parse::indented_like_row(line) {
                let steps = table.header.steps;
                let parsed = parse::parse_glm_row(line).and_then(|row| {
                    let totals = parse::reconstruct_row(&row, steps)?;
                    Ok((row, totals))
                });
                match parsed {
                    Ok((row, totals)) => {
                        table.rows.push((row.name.into(), row.ns_per_token, totals));
                        return;
                    }
                    Err(e) => {
                        table.cut = true;
                        self.summary
                            .bad(line_no, format_args!("table row: {e}"), line);
                        self.finish_table();
                        return;
                    }
                }
            }
            self.finish_table();
        }
        let Some((marker, at)) = parse::find_marker(line) else {
            if parse::looks_like_row(line) {
                self.summary
                    .bad(line_no, "table row without a header", line);
            }
            return;
        };
        if line[at..].contains(&0x1b) {
            let mut clean = std::mem::take(&mut self.ansi);
            parse::strip_ansi_into(line, &mut clean);
            match parse::find_marker(&clean) {
                Some((marker, at)) => self.candidate(&clean, marker, at, line_no, ts.is_some()),
                None => self.summary.bad(line_no, "marker broken by escapes", line),
            }
            self.ansi = clean;
        } else {
            self.candidate(line, marker, at, line_no, ts.is_some());
        }
    }

    fn candidate(&mut self, line: &[u8], marker: Marker, at: usize, line_no: u64, stamped: bool) {
        match marker {
            Marker::GlmHeader => match parse::parse_glm_header(&line[at..]) {
                Ok(header) => {
                    self.runs.observe(header.steps, true);
                    let cumulative = parse::header_bounds(&header).best().unwrap_or(u64::MAX);
                    let advance = cumulative.saturating_sub(self.runs.last_decode_ns);
                    self.clock.advance(stamped, advance, &mut self.summary);
                    let at = self.clock.place(&mut self.summary);
                    self.table = Some(PendingTable {
                        line_no,
                        at,
                        header,
                        rows: Vec::new(),
                        cut: false,
                    });
                }
                Err(e) => self
                    .summary
                    .bad(line_no, format_args!("table header: {e}"), line),
            },
            Marker::RouteTrace => match parse::parse_route_trace(&line[at..]) {
                Ok(r) => {
                    self.runs.observe(r.step, false);
                    let at = self.clock.place(&mut self.summary);
                    self.summary.records_per_format.route_traces += 1;
                    self.emit(ImportRecord::RouteTrace {
                        run: self.runs.run,
                        at,
                        step: r.step,
                        site: String::from_utf8_lossy(r.site).into_owned(),
                        layer: r.layer,
                        moe: r.moe,
                        bar_ns: r.bar_ns,
                        expert_ids: r.expert_ids,
                    });
                }
                Err(e) => self
                    .summary
                    .bad(line_no, format_args!("GLMTRACE: {e}"), line),
            },
            Marker::Spec => match parse::parse_spec(line, at) {
                Ok(SpecLine::Phases {
                    tag,
                    rounds,
                    k,
                    phases,
                }) => {
                    // The burst took its time whether or not the filter keeps it.
                    self.clock
                        .advance(stamped, phases.total_ns(), &mut self.summary);
                    if !self.keeps(tag, false) {
                        self.filtered();
                        return;
                    }
                    let at = self.clock.place(&mut self.summary);
                    self.summary.records_per_format.spec_bursts += 1;
                    self.emit(ImportRecord::SpecBurst {
                        run: self.runs.run,
                        at,
                        tag: String::from_utf8_lossy(tag).into_owned(),
                        rounds,
                        k,
                        phases,
                    });
                }
                Ok(SpecLine::VerifySplit {
                    tag,
                    rounds,
                    k,
                    parts,
                }) => {
                    if !self.keeps(tag, true) {
                        self.filtered();
                        return;
                    }
                    let at = self.clock.place(&mut self.summary);
                    self.summary.records_per_format.verify_splits += 1;
                    self.emit(ImportRecord::VerifySplit {
                        run: self.runs.run,
                        at,
                        tag: String::from_utf8_lossy(tag).into_owned(),
                        rounds,
                        k,
                        parts,
                    });
                }
                Err(e) => self
                    .summary
                    .bad(line_no, format_args!("speculative line: {e}"), line),
            },
        }
    }

    fn keeps(&self, tag: &[u8], verify: bool) -> bool {
        self.tags.is_empty()
            || self.tags.iter().any(|t| {
                t.as_slice() == tag
                    || (verify
                        && tag
                            .strip_suffix(b"-v")
                            .is_some_and(|base| base == t.as_slice()))
            })
    }

    fn filtered(&mut self) {
        self.summary.lines_filtered += 1;
        self.summary.lines_skipped += 1;
    }

    /// Closes the pending table: completeness check, then one delta per row.
    fn finish_table(&mut self) {
        let Some(table) = self.table.take() else {
            return;
        };
        let steps = table.header.steps;
        let per_token: Vec<Scaled> = table.rows.iter().map(|r| r.1).collect();
        let covered = parse::rows_cover_header(&table.header, &per_token);
        if table.cut || !covered {
            self.summary.truncated_tables += 1;
            let rows_ns: u64 = per_token.iter().map(|s| s.value).sum();
            self.summary.report(
                table.line_no,
                format_args!(
                    "table after {steps} steps is truncated: its {} rows cover {:.2} of {:.2} \
                     ms/token; the complete rows were used",
                    table.rows.len(),
                    rows_ns as f64 / 1e6,
                    table.header.ns_per_token.value as f64 / 1e6,
                ),
                b"",
            );
        }
        let run = self.runs.run;
        let decode_ns = parse::header_bounds(&table.header)
            .best()
            .unwrap_or(u64::MAX);
        let steps_in_interval = steps - self.runs.last_table_steps.unwrap_or(0).min(steps);
        self.summary.records_per_format.tables += 1;
        self.emit(ImportRecord::DecodeSteps {
            run,
            at: table.at,
            steps,
            steps_in_interval,
            decode_ns,
        });
        for (name, _, totals) in table.rows {
            let cum = self.runs.buckets.entry(name.clone()).or_default();
            let total_ns = totals.total_ns.max(cum.total_ns);
            let calls = totals.calls.max(cum.calls);
            let record = ImportRecord::SectionInterval {
                run,
                at: table.at,
                steps_in_interval: steps.saturating_sub(cum.steps),
                bucket: String::from_utf8_lossy(&name).into_owned(),
                total_ns: total_ns - cum.total_ns,
                calls: calls - cum.calls,
            };
            *cum = Cumulative {
                steps,
                total_ns,
                calls,
            };
            self.summary.records_per_format.section_intervals += 1;
            self.emit(record);
        }
        self.runs.last_table_steps = Some(steps);
        self.runs.last_decode_ns = decode_ns;
    }

    fn finish(&mut self) {
        self.finish_table();
    }
}

/// Streams [`ImportRecord`]s out of one input; gzip is detected by its magic bytes.
///
/// Iterating yields records as their lines are read (a table's records when the line after it
/// is read); an `Err` ends the stream. [`Importer::summary`] is complete once the iterator has
/// returned `None`.
pub struct Importer<'a> {
    input: Box<dyn BufRead + 'a>,
    source_file: String,
    parser: LineParser,
    straddling: Straddling,
    done: bool,
}

/// A line that straddles input buffers, assembled up to the length limit.
#[derive(Debug)]
struct Straddling {
    bytes: Vec<u8>,
    overlong: bool,
    max: usize,
}

impl Straddling {
    fn active(&self) -> bool {
        self.overlong || !self.bytes.is_empty()
    }

    fn push(&mut self, part: &[u8]) {
        if self.overlong {
            return;
        }
        if self.bytes.len() + part.len() > self.max {
            self.overlong = true;
            self.bytes = Vec::new();
        } else {
            self.bytes.extend_from_slice(part);
        }
    }

    fn end(&mut self, parser: &mut LineParser) {
        if self.overlong {
            parser.overlong(self.max);
        } else {
            parser.line(&self.bytes);
        }
        self.bytes.clear();
        self.overlong = false;
    }
}

impl fmt::Debug for Importer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Importer")
            .field("source_file", &self.source_file)
            .field("summary", &self.parser.summary)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

impl<'a> Importer<'a> {
    /// Reads `reader`, decompressing it when it starts with the gzip magic bytes (concatenated
    /// members are read as one stream).
    pub fn new<R: BufRead + 'a>(
        mut reader: R,
        options: ImportOptions,
    ) -> Result<Self, ImportError> {
        let head = reader.fill_buf().map_err(|source| ImportError::Read {
            file: options.source_file.clone(),
            line: 0,
            source,
        })?;
        // A one-byte first read can only be told by its first byte; no log starts with 0x1f.
        let gzip =
            head.first() == Some(&GZIP_MAGIC[0]) && head.get(1).is_none_or(|b| *b == GZIP_MAGIC[1]);
        let input: Box<dyn BufRead + 'a> = if gzip {
            Box::new(BufReader::with_capacity(
                1 << 18,
                flate2::bufread::MultiGzDecoder::new(reader),
            ))
        } else {
            Box::new(reader)
        };
        let mut parser = LineParser::new(&options);
        parser.summary.gzip = gzip;
        Ok(Self {
            input,
            source_file: options.source_file,
            parser,
            straddling: Straddling {
                bytes: Vec::new(),
                overlong: false,
                max: options.max_line_bytes,
            },
            done: false,
        })
    }

    /// Opens a file (plain or gzip).
    pub fn open(path: &Path, options: ImportOptions) -> Result<Importer<'static>, ImportError> {
        let file = File::open(path).map_err(|source| ImportError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Importer::new(BufReader::with_capacity(1 << 18, file), options)
    }

    /// What has been read so far; complete once iteration has ended.
    pub fn summary(&self) -> &Summary {
        &self.parser.summary
    }

    /// Consumes the importer, returning its summary.
    pub fn into_summary(self) -> Summary {
        self.parser.summary
    }

    /// Reads one buffer's worth of lines (at least one line, unless at the end).
    /// Returns `false` at the end of the input.
    fn fill(&mut self) -> Result<bool, ImportError> {
        let buf = match self.input.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(source) => {
                return Err(ImportError::Read {
                    file: self.source_file.clone(),
                    line: self.parser.summary.lines_read,
                    source,
                });
            }
        };
        if buf.is_empty() {
            if self.straddling.active() {
                self.straddling.end(&mut self.parser);
            }
            self.parser.finish();
            return Ok(false);
        }
        let len = buf.len();
        let mut start = 0;
        // Lines wholly inside the buffer are parsed in place; only a line that straddles two
        // buffers is copied.
        while let Some(nl) = buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + nl;
            if self.straddling.active() {
                self.straddling.push(&buf[start..end]);
                self.straddling.end(&mut self.parser);
            } else if end - start > self.straddling.max {
                self.parser.overlong(self.straddling.max);
            } else {
                self.parser.line(&buf[start..end]);
            }
            start = end + 1;
        }
        if start < len {
            self.straddling.push(&buf[start..]);
        }
        self.parser.summary.bytes_read += len as u64;
        self.input.consume(len);
        Ok(true)
    }
}

impl Iterator for Importer<'_> {
    type Item = Result<ImportRecord, ImportError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(record) = self.parser.out.pop_front() {
                return Some(Ok(record));
            }
            if self.done {
                return None;
            }
            match self.fill() {
                Ok(true) => {}
                Ok(false) => self.done = true,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// One input read to the end: its label, records and summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportedFile {
    /// `source.file` of its records.
    pub source_file: String,
    /// The records, in input order (so in time order).
    pub records: Vec<ImportRecord>,
    /// What the input held.
    pub summary: Summary,
}

/// Parses a time given on the command line (`--start`) into Unix nanoseconds: RFC 3339 as the
/// logs print it (`2026-09-30T12:00:00Z`, fraction and offset optional) or Unix seconds
/// (`1790769600`, `1790769600.25`).
pub fn parse_time(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Some(ns) = parse::line_timestamp(text.as_bytes()) {
        return Some(ns);
    }
    let s = parse::parse_scaled(text.as_bytes(), 9)?;
    Some(s.value)
}

/// Reads a whole input from `reader` (stdin, a test buffer) in one pass.
pub fn import_reader<R: BufRead>(
    reader: R,
    options: ImportOptions,
) -> Result<ImportedFile, ImportError> {
    import_reader_with_progress(reader, options, &mut |_| {})
}

/// [`import_reader`], calling `progress` with the running summary after every record and at
/// the end (the CLI's progress bar throttles it).
pub fn import_reader_with_progress<R: BufRead>(
    reader: R,
    options: ImportOptions,
    progress: &mut dyn FnMut(&Summary),
) -> Result<ImportedFile, ImportError> {
    let source_file = options.source_file.clone();
    let mut importer = Importer::new(reader, options)?;
    let mut records = Vec::new();
    while let Some(record) = importer.next() {
        records.push(record?);
        progress(importer.summary());
    }
    progress(importer.summary());
    Ok(ImportedFile {
        source_file,
        records,
        summary: importer.into_summary(),
    })
}

/// Reads a whole file. Without a start time it reads the file twice: first to measure the
/// untimestamped time, then to place it (see the module docs).
pub fn import_path(path: &Path, options: ImportOptions) -> Result<ImportedFile, ImportError> {
    import_path_with_progress(path, options, &mut |_, _| {})
}

/// [`import_path`], calling `progress(pass, summary)` as it reads: pass 1 measures a file
/// without a start time, pass 2 reads it.
pub fn import_path_with_progress(
    path: &Path,
    mut options: ImportOptions,
    progress: &mut dyn FnMut(u8, &Summary),
) -> Result<ImportedFile, ImportError> {
    if options.source_file.is_empty() {
        options.source_file = path.display().to_string();
    }
    if options.start_unix_nanos.is_none() {
        let mut probe = Importer::open(
            path,
            ImportOptions {
                start_unix_nanos: Some(0),
                ..options.clone()
            },
        )?;
        while let Some(record) = probe.next() {
            record?;
            progress(1, probe.summary());
        }
        let summary = probe.into_summary();
        let start = match summary.first_timestamp {
            Some(first) => first.saturating_sub(summary.synthetic_ns_before_first_timestamp),
            None => {
                let open_err = |source| ImportError::Open {
                    path: path.to_path_buf(),
                    source,
                };
                let modified = std::fs::metadata(path)
                    .and_then(|m| m.modified())
                    .map_err(open_err)?;
                let mtime = modified
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                mtime.saturating_sub(summary.synthetic_ns_total)
            }
        };
        options.start_unix_nanos = Some(start);
    }
    let file = File::open(path).map_err(|source| ImportError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    import_reader_with_progress(BufReader::with_capacity(1 << 18, file), options, &mut |s| {
        progress(2, s)
    })
}

#[cfg(test)]
mod tests;

/// The default a live process takes for the setting of `var` when nothing sets it (the
/// library's settings table is the one home of defaults), parsed; `T::default()` only if the
/// table has no such setting.
pub(crate) fn live_default<T: std::str::FromStr + Default>(var: &str) -> T {
    phasetrace::config::settings::find(var)
        .and_then(|s| s.default_text().parse().ok())
        .unwrap_or_default()
}
