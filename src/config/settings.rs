//! Every setting, defined once: its variable, what it accepts, its default, its parser, how it
//! prints and its one-line doc. The configuration ([`super::Config`]), the builder's setters,
//! `phasetrace check` and the CLI's flags all read this table; none has its own copy.
//!
//! ```text
//! SETTINGS ──> ConfigBuilder::resolve (env text -> parse, code values, origins)
//!          ──> ProfilerBuilder::with / with_text (code values, typed or as text)
//!          ──> phasetrace check (one row per setting: shown value, origin)
//!          ──> phasetrace flags (one --flag per setting that names one, same parser and error)
//! ```
//!
//! # Adding a setting
//!
//! 1. Name its variable in [`phasetrace_names::env`] (the `phasetrace-names` crate) (and its default in `crate::names::default`
//!    when other code needs it too).
//! 2. Add a `pub(crate) static` `Setting` below and list it in [`SETTINGS`]. A closed set of values
//!    is an enum with `FromStr` and `Display` (the `closed_set!` macro in `config.rs` writes
//!    both, plus `as_str`, `ALL` and `EXPECTED`); `show` must print what `parse` reads back, and
//!    `example` is a valid non-default value that works together with every other example (the
//!    tests set them all at once).
//! 3. Add its field to [`super::Config`] and read it in `ConfigBuilder::resolve_with` with
//!    `src.value(&s::NAME)?` (code, else the environment, else the default; the origin is
//!    recorded there) or `src.get(&s::NAME)?` when its default depends on other settings. The
//!    descriptor's `get` reads that field back for `check`.
//! 4. `flag: Some("name")` gives the `phasetrace` command a `--name` flag (nothing to change in
//!    the CLI). A typed setter on `ProfilerBuilder` is optional: `with(&settings::NAME, v)` and
//!    `with_text(&settings::NAME, "text")` work for every setting.
//! 5. Regenerate `docs/configuration.md` (`PHASETRACE_REGENERATE_DOCS=1 cargo test -p phasetrace
//!    --test it the_generated_references`) and add a row to its bad-input table.
//!
//! The tests that walk the table (`config::tests::every_setting_prints_what_it_parses_and_says_where_it_came_from`,
//! `the_settings_table_names_each_variable_and_flag_once`, and the CLI's
//! `check_prints_each_setting_as_its_variable_reads_it`) then cover the new setting.

use super::{
    Config, Expected, HistogramAggregation, HostSourceChoice, Level, Listen, MetricsExporters,
    Protocol, SpecLevel, Timing, TraceSlowerThan, TracesExporter, parse_endpoint, parse_kv_list,
};
use crate::names::{default, env};
use std::any::Any;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What a setting's value may be: cloned out of the builder, compared in tests, shared between
/// threads.
pub(crate) trait SettingValue:
    Clone + PartialEq + fmt::Debug + Send + Sync + 'static
{
}
impl<T: Clone + PartialEq + fmt::Debug + Send + Sync + 'static> SettingValue for T {}

/// One setting: everything about it that is not its use.
pub(crate) struct Setting<T: 'static> {
    /// The environment variable.
    pub(crate) var: &'static str,
    /// Variables read, in order, when `var` is unset (launchers' `RANK`, ...).
    pub(crate) fallbacks: &'static [&'static str],
    /// The CLI flag (`level` for `--level`), when the `phasetrace` command has one.
    pub(crate) flag: Option<&'static str>,
    /// One line: what it does.
    pub(crate) doc: &'static str,
    /// What is accepted, as errors and `--help` say it (`off, 0, full, 1, collectives or 2`).
    pub(crate) expected: &'static str,
    /// A valid value other than the default, for `--help`, docs and the tests that walk the
    /// table.
    pub(crate) example: &'static str,
    /// When the default depends on other settings, the words that say how (else empty).
    pub(crate) default_note: &'static str,
    /// Values are secrets: never printed (`key=****`).
    pub(crate) secret: bool,
    default: fn() -> T,
    /// Parses one trimmed, non-empty value; `Err` carries a detail for the message (or "").
    parse: fn(&str) -> Result<T, String>,
    /// The value as the variable would spell it; `None` prints as `(none)` and stands for the
    /// variable unset.
    show: fn(&T) -> Option<String>,
    /// The value a resolved configuration holds; `None` where it does not apply (OTLP settings
    /// without an endpoint), printed as `-`.
    get: fn(&Config) -> Option<T>,
}

impl<T: SettingValue> Setting<T> {
    /// Parses a value as the variable reads it (trimmed; case-insensitive for closed sets).
    pub(crate) fn parse(&self, text: &str) -> Result<T, Expected> {
        (self.parse)(text.trim()).map_err(|detail| {
            Expected(if detail.is_empty() {
                self.expected.to_owned()
            } else {
                format!("{} ({detail})", self.expected)
            })
        })
    }

    /// The default value (see [`Setting::default_note`] for defaults that depend on others).
    pub(crate) fn default_value(&self) -> T {
        (self.default)()
    }

    /// The value as `check` prints it: the variable's spelling, masked when secret, `(none)`
    /// when unset.
    pub(crate) fn show(&self, value: &T) -> String {
        match (self.show)(value) {
            None => "(none)".to_owned(),
            Some(s) if self.secret => mask(&s),
            Some(s) => s,
        }
    }

    /// Checks a value given in code: it must be one the variable could hold (a queue of 10
    /// records is refused in code as in the environment).
    pub(crate) fn check_code_value(&self, value: &T) -> Result<(), Expected> {
        match (self.show)(value) {
            None => Ok(()),
            Some(text) => match self.parse(&text) {
                Ok(back) if back == *value => Ok(()),
                Ok(_) => Err(Expected(self.expected.to_owned())),
                Err(e) => Err(e),
            },
        }
    }

    /// The value `cfg` holds, `None` where the setting does not apply.
    pub(crate) fn get(&self, cfg: &Config) -> Option<T> {
        (self.get)(cfg)
    }
}

/// `k=v,k2=v2` with the values masked.
fn mask(text: &str) -> String {
    text.split(',')
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| format!("{k}=****")))
        .collect::<Vec<_>>()
        .join(",")
}

impl<T> fmt::Debug for Setting<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Setting")
            .field("var", &self.var)
            .field("flag", &self.flag)
            .finish_non_exhaustive()
    }
}

/// A setting of any value type: what the table, `check`, the CLI flags and
/// [`crate::ProfilerBuilder::with_text`] walk.
pub trait AnySetting: Sync + Send + fmt::Debug {
    /// The environment variable.
    fn var(&self) -> &'static str;
    /// The CLI flag, when there is one.
    fn flag(&self) -> Option<&'static str>;
    /// One line: what it does.
    fn doc(&self) -> &'static str;
    /// What is accepted.
    fn expected(&self) -> &'static str;
    /// A valid value other than the default.
    fn example(&self) -> &'static str;
    /// Values are secrets, never printed.
    fn secret(&self) -> bool;
    /// The default as documentation states it (`off`; `127.0.0.1:9464 when ...`).
    fn default_text(&self) -> String;
    /// Checks a value as the variable would read it.
    fn check(&self, text: &str) -> Result<(), Expected>;
    /// The value `cfg` holds as `phasetrace check` prints it: `-` where it does not apply.
    fn shown(&self, cfg: &Config) -> String;
    /// Whether what [`AnySetting::shown`] prints for `cfg` parses back to the value `cfg`
    /// holds (secret values: the keys); `Err` says what differs.
    fn round_trips(&self, cfg: &Config) -> Result<(), String>;
    /// The parsed value, type-erased, for [`crate::ProfilerBuilder::with_text`].
    #[doc(hidden)]
    fn parse_any(&self, text: &str) -> Result<Arc<dyn Any + Send + Sync>, Expected>;
    /// A value set in code, as [`AnySetting::shown`] would print it (masked when secret).
    #[doc(hidden)]
    fn show_any(&self, value: &(dyn Any + Send + Sync)) -> String;
}

impl<T: SettingValue> AnySetting for Setting<T> {
    fn var(&self) -> &'static str {
        self.var
    }
    fn flag(&self) -> Option<&'static str> {
        self.flag
    }
    fn doc(&self) -> &'static str {
        self.doc
    }
    fn expected(&self) -> &'static str {
        self.expected
    }
    fn example(&self) -> &'static str {
        self.example
    }
    fn secret(&self) -> bool {
        self.secret
    }
    fn default_text(&self) -> String {
        let d = self.show(&self.default_value());
        if self.default_note.is_empty() {
            d
        } else {
            format!("{d} {}", self.default_note)
        }
    }
    fn check(&self, text: &str) -> Result<(), Expected> {
        self.parse(text).map(drop)
    }
    fn shown(&self, cfg: &Config) -> String {
        self.get(cfg)
            .map_or_else(|| "-".to_owned(), |v| self.show(&v))
    }
    fn round_trips(&self, cfg: &Config) -> Result<(), String> {
        let Some(held) = self.get(cfg) else {
            return Ok(());
        };
        let Some(text) = (self.show)(&held) else {
            // Printed as `(none)`: the variable unset, which gives the default.
            return if held == self.default_value() {
                Ok(())
            } else {
                Err(format!("{}: (none) stands for {:?}", self.var, held))
            };
        };
        let printed = self.show(&held);
        if self.secret {
            // Only the keys are printed, the values masked.
            return if printed == mask(&text) {
                Ok(())
            } else {
                Err(format!("{}: a secret printed as {printed:?}", self.var))
            };
        }
        match self.parse(&printed) {
            Ok(back) if back == held => Ok(()),
            Ok(back) => Err(format!(
                "{}: printed {printed:?} for {held:?}, which reads back as {back:?}",
                self.var
            )),
            Err(e) => Err(format!(
                "{}: printed {printed:?}, which does not parse: {e}",
                self.var
            )),
        }
    }
    fn parse_any(&self, text: &str) -> Result<Arc<dyn Any + Send + Sync>, Expected> {
        self.parse(text)
            .map(|v| Arc::new(v) as Arc<dyn Any + Send + Sync>)
    }
    fn show_any(&self, value: &(dyn Any + Send + Sync)) -> String {
        value
            .downcast_ref::<T>()
            .map_or_else(|| "?".to_owned(), |v| self.show(v))
    }
}

/// The setting whose variable is `var`.
pub fn find(var: &str) -> Option<&'static dyn AnySetting> {
    SETTINGS.iter().copied().find(|s| s.var() == var)
}

// Parsers and printers shared by several settings.

fn closed<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| String::new())
}

fn whole<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| String::new())
}

fn millis(s: &str) -> Result<Duration, String> {
    match s.parse::<u64>() {
        Ok(n) if n > 0 => Ok(Duration::from_millis(n)),
        _ => Err(String::new()),
    }
}

fn show_millis(d: &Duration) -> Option<String> {
    Some(d.as_millis().to_string())
}

fn shown<T: ToString>(v: &T) -> Option<String> {
    Some(v.to_string())
}

/// `on`/`off` switches; `true`/`false` and `1`/`0` are read too.
fn switch(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(String::new()),
    }
}

fn show_switch(on: &bool) -> Option<String> {
    Some(if *on { "on" } else { "off" }.to_owned())
}

const SWITCH: &str = "on, off, true, false, 1 or 0";
const KV: &str = "key=value pairs separated by commas";

fn kv_list(s: &str) -> Result<Vec<(String, String)>, String> {
    parse_kv_list(s)
}

#[allow(clippy::ptr_arg)] // a `Setting<Vec<_>>` printer: `fn(&T)` with `T = Vec<_>`
fn show_kv(list: &Vec<(String, String)>) -> Option<String> {
    // Values percent-encoded where they would not read back (`,`, `=`, `%`, spaces).
    const ESCAPE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
        .add(b',')
        .add(b'=')
        .add(b'%')
        .add(b' ');
    (!list.is_empty()).then(|| {
        list.iter()
            .map(|(k, v)| format!("{k}={}", percent_encoding::utf8_percent_encode(v, ESCAPE)))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// Which sections are recorded.
pub(crate) static LEVEL: Setting<Level> = Setting {
    var: env::LEVEL,
    fallbacks: &[],
    flag: Some("level"),
    doc: "Which sections are recorded",
    expected: Level::EXPECTED,
    example: "collectives",
    default_note: "",
    secret: false,
    default: || Level::Off,
    parse: closed,
    show: shown,
    get: |c| Some(c.level),
};

/// Speculative-decoding detail.
pub(crate) static SPEC_LEVEL: Setting<SpecLevel> = Setting {
    var: env::SPEC_LEVEL,
    fallbacks: &[],
    flag: Some("spec-level"),
    doc: "Speculative-decoding detail",
    expected: SpecLevel::EXPECTED,
    example: "verify",
    default_note: "",
    secret: false,
    default: || SpecLevel::Off,
    parse: closed,
    show: shown,
    get: |c| Some(c.spec_level),
};

/// Spans for one step (and round) in N.
pub(crate) static TRACE_EVERY: Setting<u64> = Setting {
    var: env::TRACE_EVERY,
    fallbacks: &[],
    flag: Some("trace-every"),
    doc: "Build spans for one step (and one round) in N",
    expected: "a whole number (0 = no spans)",
    example: "10",
    default_note: "",
    secret: false,
    default: || default::TRACE_EVERY,
    parse: whole,
    show: shown,
    get: |c| Some(c.trace_every),
};

/// Tail-based tracing: also trace the steps (and rounds) slower than this.
pub(crate) static TRACE_SLOWER_THAN: Setting<TraceSlowerThan> = Setting {
    var: env::TRACE_SLOWER_THAN,
    fallbacks: &[],
    flag: Some("trace-slower-than"),
    doc: "Also trace every step (and round) slower than this, decided on the worker after it ended",
    expected: TraceSlowerThan::EXPECTED,
    example: "25ms",
    default_note: "",
    secret: false,
    default: TraceSlowerThan::default,
    parse: closed,
    show: shown,
    get: |c| Some(c.trace_slower_than),
};

/// Most tail traces a second per rank.
pub(crate) static TRACE_SLOW_BUDGET: Setting<u32> = Setting {
    var: env::TRACE_SLOW_BUDGET,
    fallbacks: &[],
    flag: Some("trace-slow-budget"),
    doc: "Most slow-step (tail) traces in any one second per rank; the rest are counted as dropped",
    expected: "a whole number of tail traces a second per rank, from 1 to 10000",
    example: "20",
    default_note: "",
    secret: false,
    default: || default::TRACE_SLOW_BUDGET,
    parse: |s| match s.parse::<u32>() {
        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
        _ => Err(String::new()),
    },
    show: shown,
    get: |c| Some(c.trace_slow_budget),
};

/// Read one CUDA-graph replay in N.
pub(crate) static GRAPH_READ_EVERY: Setting<u64> = Setting {
    var: env::GRAPH_READ_EVERY,
    fallbacks: &[],
    flag: Some("graph-read-every"),
    doc: "Read one CUDA-graph replay in N (Recorder::replay)",
    expected: "a whole number of replays (1 = every replay, 0 = none)",
    example: "10",
    default_note: "",
    secret: false,
    default: || default::GRAPH_READ_EVERY,
    parse: whole,
    show: shown,
    get: |c| Some(c.graph_read_every),
};

/// The `layer` attribute on section metrics.
pub(crate) static LAYER_ATTR: Setting<bool> = Setting {
    var: env::LAYER_ATTR,
    fallbacks: &[],
    flag: Some("layer-attr"),
    doc: "The layer attribute on section metrics",
    expected: SWITCH,
    example: "off",
    default_note: "",
    secret: false,
    default: || true,
    parse: switch,
    show: show_switch,
    get: |c| Some(c.layer_attr),
};

/// Console summary every N steps.
pub(crate) static SUMMARY_EVERY: Setting<u64> = Setting {
    var: env::SUMMARY_EVERY,
    fallbacks: &[],
    flag: Some("summary-every"),
    doc: "Console summary table every N steps",
    expected: "a whole number of steps (0 = off)",
    example: "50",
    default_note: "(100 with OTEL_METRICS_EXPORTER=console)",
    secret: false,
    default: || 0,
    parse: whole,
    show: shown,
    get: |c| Some(c.summary_every),
};

/// Console speculative line every N rounds.
pub(crate) static SPEC_SUMMARY_EVERY: Setting<u64> = Setting {
    var: env::SPEC_SUMMARY_EVERY,
    fallbacks: &[],
    flag: Some("spec-summary-every"),
    doc: "Console speculative line every N rounds",
    expected: "a whole number of rounds (0 = off)",
    example: "20",
    default_note: "",
    secret: false,
    default: || 0,
    parse: whole,
    show: shown,
    get: |c| Some(c.spec_summary_every),
};

/// The embedded Prometheus endpoint.
pub(crate) static PROMETHEUS: Setting<Listen> = Setting {
    var: env::PROMETHEUS,
    fallbacks: &[],
    flag: Some("prometheus"),
    doc: "The embedded Prometheus endpoint's listen address",
    expected: Listen::EXPECTED,
    example: "127.0.0.1:9464+rank",
    default_note: "when no OTLP endpoint is set, else off",
    secret: false,
    default: Listen::builtin,
    parse: closed,
    show: shown,
    get: |c| Some(c.prometheus.map_or(Listen::Off, Listen::At)),
};

/// The Prometheus endpoint's web configuration file.
pub(crate) static PROMETHEUS_WEB_CONFIG: Setting<Option<PathBuf>> = Setting {
    var: env::PROMETHEUS_WEB_CONFIG,
    fallbacks: &[],
    flag: Some("prometheus-web-config"),
    doc: "The Prometheus endpoint's web configuration file: TLS and basic auth in the exporter-toolkit format (unset: plain HTTP, no auth)",
    expected: "a path",
    example: "/etc/phasetrace/web.yml",
    default_note: "",
    secret: false,
    default: || None,
    parse: |s| Ok(Some(PathBuf::from(s))),
    show: |p| p.as_ref().map(|p| p.display().to_string()),
    get: |c| Some(c.prometheus_web_config.clone()),
};

/// Per-recorder buffer capacity.
pub(crate) static QUEUE: Setting<usize> = Setting {
    var: env::QUEUE,
    fallbacks: &[],
    flag: Some("queue"),
    doc: "Records per recorder buffer (24 bytes each; rounded up to a power of two)",
    expected: "a whole number of records from 64 to 16777216",
    example: "4096",
    default_note: "",
    secret: false,
    default: || default::QUEUE,
    parse: |s| match s.parse::<usize>() {
        Ok(n) if (64..=1 << 24).contains(&n) => Ok(n),
        _ => Err(String::new()),
    },
    show: shown,
    get: |c| Some(c.queue),
};

/// This process's rank.
pub(crate) static RANK: Setting<u32> = Setting {
    var: env::RANK,
    fallbacks: &env::RANK_FALLBACKS,
    flag: None,
    doc: "This process's rank",
    expected: "a whole number",
    example: "3",
    default_note: "",
    secret: false,
    default: || 0,
    parse: whole,
    show: shown,
    get: |c| Some(c.rank),
};

/// The collective group of this process's ranks: the `group` attribute on every series and
/// span, so that ranks are compared only within their group.
pub(crate) static GROUP: Setting<String> = Setting {
    var: env::GROUP,
    fallbacks: &[],
    flag: Some("group"),
    doc: "The collective group of this process's ranks (the group attribute on every series and span)",
    expected: "a group name of letters, digits, '_', '-', '.' or ':' (at most 64 bytes)",
    example: "tp1",
    default_note: "",
    secret: false,
    default: || default::GROUP.to_owned(),
    // A label value that rules and dashboards can match verbatim.
    parse: |s| {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
        if ok {
            Ok(s.to_owned())
        } else {
            Err(String::new())
        }
    },
    show: |s| Some(s.clone()),
    get: |c| Some(c.group.clone()),
};

/// The MoE expert-load telemetry: tokens per layer, imbalance, hot experts, and the in-process
/// per-(layer, expert) counts (`Profiler::expert_load`).
pub(crate) static EXPERT_COUNTER: Setting<bool> = Setting {
    var: env::EXPERT_COUNTER,
    fallbacks: &[],
    flag: Some("expert-counter"),
    doc: "MoE expert load: tokens per layer, imbalance and hot experts per (layer, rank), and the per-(layer, expert) counts in process",
    expected: SWITCH,
    example: "on",
    default_note: "",
    secret: false,
    default: || false,
    parse: switch,
    show: show_switch,
    get: |c| Some(c.expert_counter),
};

/// Routed experts per MoE layer (the mean of the imbalance counts experts that got nothing).
pub(crate) static MOE_EXPERTS: Setting<u32> = Setting {
    var: env::MOE_EXPERTS,
    fallbacks: &[],
    flag: Some("moe-experts"),
    doc: "Routed experts per MoE layer; ids at or above it are dropped and counted (0: the highest id seen + 1)",
    expected: "a whole number of experts, from 0 to 65536",
    example: "384",
    default_note: "",
    secret: false,
    default: || 0,
    parse: |s| match s.parse::<u32>() {
        Ok(n) if n <= 65_536 => Ok(n),
        _ => Err(String::new()),
    },
    show: shown,
    get: |c| Some(c.moe_experts),
};

/// Steps of a rank per expert-load window.
pub(crate) static EXPERT_WINDOW: Setting<u32> = Setting {
    var: env::EXPERT_WINDOW,
    fallbacks: &[],
    flag: Some("expert-window"),
    doc: "Steps of a rank per expert-load window: imbalance and hot experts read the last complete one",
    expected: "a whole number of steps, from 1 to 1000000",
    example: "128",
    default_note: "",
    secret: false,
    default: || default::EXPERT_WINDOW,
    parse: |s| match s.parse::<u32>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
        _ => Err(String::new()),
    },
    show: shown,
    get: |c| Some(c.expert_window),
};

/// Hot experts exported per (layer, rank).
pub(crate) static EXPERT_TOP: Setting<u32> = Setting {
    var: env::EXPERT_TOP,
    fallbacks: &[],
    flag: Some("expert-top"),
    doc: "Hot experts exported per (layer, rank), by tokens in the window",
    expected: "a whole number from 0 to 10",
    example: "2",
    default_note: "",
    secret: false,
    default: || default::EXPERT_TOP,
    parse: |s| match s.parse::<u32>() {
        Ok(n) if n <= default::EXPERT_TOP_MAX => Ok(n),
        _ => Err(String::new()),
    },
    show: shown,
    get: |c| Some(c.expert_top),
};

/// Expert-parallel placement: the group's first N ranks host the experts in contiguous blocks.
pub(crate) static EXPERT_PARALLEL: Setting<u32> = Setting {
    var: env::EXPERT_PARALLEL,
    fallbacks: &[],
    flag: None,
    doc: "Expert-parallel ranks hosting each layer's experts in contiguous blocks (the ep_rank attribute of hot experts; 0: none)",
    expected: "a whole number of ranks, from 0 to 65536",
    example: "4",
    default_note: "",
    secret: false,
    default: || 0,
    parse: |s| match s.parse::<u32>() {
        Ok(n) if n <= 65_536 => Ok(n),
        _ => Err(String::new()),
    },
    show: shown,
    get: |c| Some(c.expert_parallel),
};

/// The timing backend.
pub(crate) static TIMING: Setting<Timing> = Setting {
    var: env::TIMING,
    fallbacks: &[],
    flag: Some("timing"),
    doc: "Where boundary times come from",
    expected: Timing::EXPECTED,
    example: "events",
    default_note: "",
    secret: false,
    default: || Timing::Host,
    parse: closed,
    show: shown,
    get: |c| Some(c.timing),
};

/// Where host-clock boundaries are read from.
pub(crate) static HOST_CLOCK: Setting<HostSourceChoice> = Setting {
    var: env::HOST_CLOCK,
    fallbacks: &[],
    flag: Some("host-clock"),
    doc: "Where the host clock reads: the TSC where usable, or forced",
    expected: HostSourceChoice::EXPECTED,
    example: "monotonic",
    default_note: "",
    secret: false,
    default: || HostSourceChoice::Auto,
    parse: closed,
    show: shown,
    get: |c| Some(c.host_clock),
};

/// Turns phasetrace off entirely.
pub(crate) static SDK_DISABLED: Setting<bool> = Setting {
    var: env::OTEL_SDK_DISABLED,
    fallbacks: &[],
    flag: None,
    doc: "true turns phasetrace off entirely: nothing recorded, nothing exported",
    expected: "true or false",
    example: "true",
    default_note: "",
    secret: false,
    default: || false,
    parse: |s| match s.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(String::new()),
    },
    show: shown,
    get: |c| Some(c.sdk_disabled),
};

/// Resource `service.name`.
pub(crate) static SERVICE_NAME: Setting<String> = Setting {
    var: env::OTEL_SERVICE_NAME,
    fallbacks: &[],
    flag: Some("service-name"),
    doc: "Resource service.name",
    expected: "a service name",
    example: "engine",
    default_note: "",
    secret: false,
    default: || default::SERVICE_NAME.to_owned(),
    parse: |s| Ok(s.to_owned()),
    show: |s| Some(s.clone()),
    get: |c| Some(c.service_name.clone()),
};

/// Extra resource attributes.
pub(crate) static RESOURCE_ATTRIBUTES: Setting<Vec<(String, String)>> = Setting {
    var: env::OTEL_RESOURCE_ATTRIBUTES,
    fallbacks: &[],
    flag: None,
    doc: "Extra resource attributes (values percent-decoded)",
    expected: KV,
    example: "deployment.environment=prod,host.gpu=h200",
    default_note: "",
    secret: false,
    default: Vec::new,
    parse: kv_list,
    show: show_kv,
    get: |c| Some(c.resource_attributes.clone()),
};

/// The OTLP endpoint.
pub(crate) static OTLP_ENDPOINT: Setting<Option<String>> = Setting {
    var: env::OTEL_EXPORTER_OTLP_ENDPOINT,
    fallbacks: &[],
    flag: Some("otlp-endpoint"),
    doc: "The OTLP endpoint that spans and metrics are pushed to",
    expected: "an http:// or https:// URL with a host and an optional port",
    example: "https://collector.example:4317",
    default_note: "",
    secret: false,
    default: || None,
    parse: |s| parse_endpoint(s).map(Some).ok_or_else(String::new),
    show: Option::clone,
    get: |c| Some(c.otlp.as_ref().map(|o| o.endpoint.clone())),
};

/// The OTLP transport.
pub(crate) static OTLP_PROTOCOL: Setting<Protocol> = Setting {
    var: env::OTEL_EXPORTER_OTLP_PROTOCOL,
    fallbacks: &[],
    flag: Some("otlp-protocol"),
    doc: "The OTLP transport",
    expected: Protocol::EXPECTED,
    example: "http/protobuf",
    default_note: "",
    secret: false,
    // gRPC, as before; http/protobuf in a build that has only the OTLP/HTTP exporter.
    default: || {
        if cfg!(feature = "otlp-grpc") || !cfg!(feature = "otlp-http") {
            Protocol::Grpc
        } else {
            Protocol::HttpProtobuf
        }
    },
    parse: closed,
    show: shown,
    get: |c| c.otlp.as_ref().map(|o| o.protocol),
};

/// OTLP request headers.
pub(crate) static OTLP_HEADERS: Setting<Vec<(String, String)>> = Setting {
    var: env::OTEL_EXPORTER_OTLP_HEADERS,
    fallbacks: &[],
    flag: None,
    doc: "OTLP request headers (API keys; values are never printed)",
    expected: KV,
    example: "x-api-key=s3cr%2Ct",
    default_note: "",
    secret: true,
    default: Vec::new,
    parse: kv_list,
    show: show_kv,
    get: |c| c.otlp.as_ref().map(|o| o.headers.clone()),
};

/// OTLP export timeout.
pub(crate) static OTLP_TIMEOUT: Setting<Duration> = Setting {
    var: env::OTEL_EXPORTER_OTLP_TIMEOUT,
    fallbacks: &[],
    flag: None,
    doc: "OTLP export timeout in milliseconds",
    expected: "a whole number of milliseconds, at least 1",
    example: "2500",
    default_note: "",
    secret: false,
    default: || Duration::from_millis(default::OTLP_TIMEOUT_MS),
    parse: millis,
    show: show_millis,
    get: |c| c.otlp.as_ref().map(|o| o.timeout),
};

/// gzip compression of OTLP requests.
pub(crate) static OTLP_COMPRESSION: Setting<super::Compression> = Setting {
    var: env::OTEL_EXPORTER_OTLP_COMPRESSION,
    fallbacks: &[],
    flag: None,
    doc: "Compression of OTLP request bodies",
    expected: super::Compression::EXPECTED,
    example: "gzip",
    default_note: "",
    secret: false,
    default: || super::Compression::None,
    parse: closed,
    show: shown,
    get: |c| {
        c.otlp
            .as_ref()
            .map(|o| super::Compression::from_gzip(o.gzip))
    },
};

/// A custom CA for `https://` endpoints.
pub(crate) static OTLP_CERTIFICATE: Setting<Option<PathBuf>> = Setting {
    var: env::OTEL_EXPORTER_OTLP_CERTIFICATE,
    fallbacks: &[],
    flag: None,
    doc: "PEM file of a custom CA for https:// endpoints (unset: the system's roots)",
    expected: "a path",
    example: "/etc/ssl/collector-ca.pem",
    default_note: "",
    secret: false,
    default: || None,
    parse: |s| Ok(Some(PathBuf::from(s))),
    show: |p| p.as_ref().map(|p| p.display().to_string()),
    get: |c| c.otlp.as_ref().map(|o| o.certificate.clone()),
};

/// Histogram aggregation of OTLP metrics.
pub(crate) static OTLP_HISTOGRAM: Setting<HistogramAggregation> = Setting {
    var: env::OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION,
    fallbacks: &[],
    flag: None,
    doc: "Histogram aggregation of OTLP metrics (the Prometheus endpoint keeps explicit buckets)",
    expected: HistogramAggregation::EXPECTED,
    example: "base2_exponential_bucket_histogram",
    default_note: "",
    secret: false,
    default: || HistogramAggregation::Explicit,
    parse: closed,
    show: shown,
    get: |c| c.otlp.as_ref().map(|o| o.histogram),
};

/// How often metrics are pushed over OTLP.
pub(crate) static METRIC_EXPORT_INTERVAL: Setting<Duration> = Setting {
    var: env::OTEL_METRIC_EXPORT_INTERVAL,
    fallbacks: &[],
    flag: None,
    doc: "How often metrics are pushed over OTLP, in milliseconds",
    expected: "a whole number of milliseconds, at least 1",
    example: "1000",
    default_note: "",
    secret: false,
    default: || Duration::from_millis(default::METRIC_EXPORT_INTERVAL_MS),
    parse: millis,
    show: show_millis,
    get: |c| Some(c.metric_export_interval),
};

/// Where spans go.
pub(crate) static TRACES_EXPORTER: Setting<TracesExporter> = Setting {
    var: env::OTEL_TRACES_EXPORTER,
    fallbacks: &[],
    flag: None,
    doc: "Where spans go",
    expected: TracesExporter::EXPECTED,
    example: "console",
    default_note: "(otlp when an OTLP endpoint is set)",
    secret: false,
    default: || TracesExporter::None,
    parse: closed,
    show: shown,
    get: |c| {
        Some(if c.traces_otlp.is_some() {
            TracesExporter::Otlp
        } else if c.traces_console {
            TracesExporter::Console
        } else {
            TracesExporter::None
        })
    },
};

/// Where metrics go.
pub(crate) static METRICS_EXPORTER: Setting<MetricsExporters> = Setting {
    var: env::OTEL_METRICS_EXPORTER,
    fallbacks: &[],
    flag: None,
    doc: "Where metrics go (console: the summary table)",
    expected: MetricsExporters::EXPECTED,
    example: "otlp,prometheus",
    default_note: "(otlp when an OTLP endpoint is set, else prometheus)",
    secret: false,
    default: MetricsExporters::default,
    parse: closed,
    show: shown,
    get: |c| {
        Some(MetricsExporters {
            otlp: c.metrics_otlp.is_some(),
            prometheus: c.prometheus.is_some(),
            console: c.summary_every > 0,
        })
    },
};

/// A per-signal OTLP setting (`OTEL_EXPORTER_OTLP_{TRACES,METRICS}_*`): the general setting's
/// parser, printer and accepted values; unset (`None`) it inherits the general one.
macro_rules! per_signal {
    ($(#[$m:meta])* $name:ident: $t:ty = $base:ident, $var:expr, $signal:literal, $field:ident.$part:ident, $doc:literal, $example:literal) => {
        $(#[$m])*
        pub(crate) static $name: Setting<Option<$t>> = Setting {
            var: $var,
            fallbacks: &[],
            flag: None,
            doc: concat!($doc, " of ", $signal, " (unset: the general setting's)"),
            expected: per_signal!(@expected $base),
            example: $example,
            default_note: "",
            secret: per_signal!(@secret $base),
            default: || None,
            parse: per_signal!(@parse $base),
            show: per_signal!(@show $base),
            get: |c| Some(c.$field.$part.clone()),
        };
    };
    (@expected OTLP_ENDPOINT) => { "an http:// or https:// URL with a host and an optional port (and a path)" };
    (@expected OTLP_PROTOCOL) => { Protocol::EXPECTED };
    (@expected OTLP_HEADERS) => { KV };
    (@expected OTLP_TIMEOUT) => { "a whole number of milliseconds, at least 1" };
    (@expected OTLP_COMPRESSION) => { super::Compression::EXPECTED };
    (@expected OTLP_CERTIFICATE) => { "a path" };
    (@secret OTLP_HEADERS) => { true };
    // The endpoint and the CA are optional already: unset is their `None`.
    (@parse OTLP_ENDPOINT) => { |s| (OTLP_ENDPOINT.parse)(s) };
    (@parse OTLP_CERTIFICATE) => { |s| (OTLP_CERTIFICATE.parse)(s) };
    (@parse $b:ident) => { |s| ($b.parse)(s).map(Some) };
    (@show OTLP_ENDPOINT) => { |v| (OTLP_ENDPOINT.show)(v) };
    (@show OTLP_CERTIFICATE) => { |v| (OTLP_CERTIFICATE.show)(v) };
    (@show $b:ident) => { |v| v.as_ref().and_then(|v| ($b.show)(v)) };
    (@secret $other:ident) => { false };
}

per_signal!(
    /// The traces endpoint, used as is.
    TRACES_ENDPOINT: String = OTLP_ENDPOINT, env::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "traces",
    given_traces.endpoint, "The OTLP endpoint (for http/protobuf the whole URL)", "https://collector.example:4318/v1/traces"
);
per_signal!(
    /// The metrics endpoint, used as is.
    METRICS_ENDPOINT: String = OTLP_ENDPOINT, env::OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, "metrics",
    given_metrics.endpoint, "The OTLP endpoint (for http/protobuf the whole URL)", "https://collector.example:4317"
);
per_signal!(
    /// The traces transport.
    TRACES_PROTOCOL: Protocol = OTLP_PROTOCOL, env::OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "traces",
    given_traces.protocol, "The OTLP transport", "http/protobuf"
);
per_signal!(
    /// The metrics transport.
    METRICS_PROTOCOL: Protocol = OTLP_PROTOCOL, env::OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, "metrics",
    given_metrics.protocol, "The OTLP transport", "grpc"
);
per_signal!(
    /// The traces request headers.
    TRACES_HEADERS: Vec<(String, String)> = OTLP_HEADERS, env::OTEL_EXPORTER_OTLP_TRACES_HEADERS, "traces",
    given_traces.headers, "OTLP request headers", "x-api-key=tr4ces"
);
per_signal!(
    /// The metrics request headers.
    METRICS_HEADERS: Vec<(String, String)> = OTLP_HEADERS, env::OTEL_EXPORTER_OTLP_METRICS_HEADERS, "metrics",
    given_metrics.headers, "OTLP request headers", "x-api-key=m3trics"
);
per_signal!(
    /// The traces export timeout.
    TRACES_TIMEOUT: Duration = OTLP_TIMEOUT, env::OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, "traces",
    given_traces.timeout, "OTLP export timeout in milliseconds", "3000"
);
per_signal!(
    /// The metrics export timeout.
    METRICS_TIMEOUT: Duration = OTLP_TIMEOUT, env::OTEL_EXPORTER_OTLP_METRICS_TIMEOUT, "metrics",
    given_metrics.timeout, "OTLP export timeout in milliseconds", "4000"
);
per_signal!(
    /// The traces compression.
    TRACES_COMPRESSION: super::Compression = OTLP_COMPRESSION, env::OTEL_EXPORTER_OTLP_TRACES_COMPRESSION, "traces",
    given_traces.compression, "Compression of OTLP request bodies", "none"
);
per_signal!(
    /// The metrics compression.
    METRICS_COMPRESSION: super::Compression = OTLP_COMPRESSION, env::OTEL_EXPORTER_OTLP_METRICS_COMPRESSION, "metrics",
    given_metrics.compression, "Compression of OTLP request bodies", "gzip"
);
per_signal!(
    /// The traces endpoint's CA.
    TRACES_CERTIFICATE: PathBuf = OTLP_CERTIFICATE, env::OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE, "traces",
    given_traces.certificate, "PEM file of a custom CA for https:// endpoints", "/etc/ssl/traces-ca.pem"
);
per_signal!(
    /// The metrics endpoint's CA.
    METRICS_CERTIFICATE: PathBuf = OTLP_CERTIFICATE, env::OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE, "metrics",
    given_metrics.certificate, "PEM file of a custom CA for https:// endpoints", "/etc/ssl/metrics-ca.pem"
);

/// Every setting, in the order `phasetrace check` prints them.
pub static SETTINGS: &[&dyn AnySetting] = &[
    &LEVEL,
    &SPEC_LEVEL,
    &TRACE_EVERY,
    &TRACE_SLOWER_THAN,
    &TRACE_SLOW_BUDGET,
    &GRAPH_READ_EVERY,
    &LAYER_ATTR,
    &SUMMARY_EVERY,
    &SPEC_SUMMARY_EVERY,
    &PROMETHEUS,
    &PROMETHEUS_WEB_CONFIG,
    &QUEUE,
    &RANK,
    &GROUP,
    &EXPERT_COUNTER,
    &MOE_EXPERTS,
    &EXPERT_WINDOW,
    &EXPERT_TOP,
    &EXPERT_PARALLEL,
    &TIMING,
    &HOST_CLOCK,
    &SDK_DISABLED,
    &SERVICE_NAME,
    &RESOURCE_ATTRIBUTES,
    &OTLP_ENDPOINT,
    &OTLP_PROTOCOL,
    &OTLP_HEADERS,
    &OTLP_TIMEOUT,
    &OTLP_COMPRESSION,
    &OTLP_CERTIFICATE,
    &OTLP_HISTOGRAM,
    &TRACES_ENDPOINT,
    &TRACES_PROTOCOL,
    &TRACES_HEADERS,
    &TRACES_TIMEOUT,
    &TRACES_COMPRESSION,
    &TRACES_CERTIFICATE,
    &METRICS_ENDPOINT,
    &METRICS_PROTOCOL,
    &METRICS_HEADERS,
    &METRICS_TIMEOUT,
    &METRICS_COMPRESSION,
    &METRICS_CERTIFICATE,
    &METRIC_EXPORT_INTERVAL,
    &TRACES_EXPORTER,
    &METRICS_EXPORTER,
];

/// The settings of the OTLP connection (where to, how, with what): the ones that
/// `phasetrace import` reads to send what it imports, as the live exporters do.
pub static OTLP_CONNECTION: &[&dyn AnySetting] = &[
    &OTLP_ENDPOINT,
    &OTLP_PROTOCOL,
    &OTLP_HEADERS,
    &OTLP_TIMEOUT,
    &OTLP_COMPRESSION,
    &OTLP_CERTIFICATE,
];
