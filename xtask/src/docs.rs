//! The generated references: the settings table of `docs/configuration.md` (from
//! `phasetrace::config::settings::SETTINGS`, declared in `src/config/table.rs`), the contract
//! of `docs/telemetry.md` (from the `phasetrace-names` tables: `metric::ALL`, `attr::ALL`, ...;
//! its variables from `SETTINGS`) and the variables of `phasetrace_names::env`
//! (`names/src/env.rs`, from `SETTINGS`).
//! Each sits between two markers; the prose around it is written by hand.
//!
//! ```text
//! SETTINGS ──configuration()──┐
//! names' ALL tables ──telemetry()──┴──splice between the markers──> write | compare (--check)
//! ```

use phasetrace::config::settings;
use phasetrace_names::{self as names, Metric, Name};
use std::fmt::Write as _;
use std::path::Path;

const BEGIN: &str = "<!-- BEGIN GENERATED";
const END: &str = "<!-- END GENERATED -->";

/// The generated files, each with what belongs between its markers.
pub(crate) fn references() -> Vec<(&'static str, String)> {
    vec![
        ("docs/configuration.md", configuration()),
        ("docs/telemetry.md", telemetry()),
        ("names/src/env.rs", names_env()),
    ]
}

/// A setting's constant in `phasetrace_names::env`: its variable without the `PHASETRACE_`
/// prefix (`PHASETRACE_LEVEL` is `env::LEVEL`, `OTEL_TRACES_EXPORTER` keeps its name).
fn env_constant(var: &str) -> &str {
    var.strip_prefix("PHASETRACE_").unwrap_or(var)
}

/// A setting's description in `phasetrace_names::env`: what it does, then what it accepts.
fn env_description(s: &dyn settings::AnySetting) -> String {
    format!("{}: {}.", s.doc(), s.expected().trim_end_matches('.'))
}

/// `names/src/env.rs`: the `names!` block of `phasetrace_names::env`, one constant per setting
/// of the table, in its order, so that a setting is declared in `src/config/table.rs` only.
fn names_env() -> String {
    let mut out = String::from("names! {\n");
    for s in settings::SETTINGS {
        let mut line = String::from("    ///");
        for word in env_description(*s).split_whitespace() {
            if line.len() + 1 + word.len() > 100 && line.len() > "    ///".len() {
                let _ = writeln!(out, "{line}");
                line = String::from("    ///");
            }
            line.push(' ');
            line.push_str(word);
        }
        let _ = writeln!(out, "{line}");
        let _ = writeln!(out, "    {} = {:?};", env_constant(s.var()), s.var());
    }
    // The end marker sits in a Rust comment: its line's `// ` is the generated part's end.
    out.push_str("}\n// ");
    out
}

/// A Markdown table cell: no line breaks, `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// Inline code, for values that may hold backticks or `|`.
fn code(text: &str) -> String {
    if text.is_empty() {
        return String::new();
    }
    let (open, close) = if text.contains('`') {
        ("`` ", " ``")
    } else {
        ("`", "`")
    };
    format!("{open}{}{close}", text.replace('|', "\\|"))
}

/// A description as one table cell: intra-doc links (`[`SECTION_LAYER_TIME`]`) become inline
/// code of their path inside the names crate.
fn meaning(doc: &str) -> String {
    let mut out = String::new();
    let mut rest = doc;
    while let Some(start) = rest.find("[`") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find("`]") {
            Some(end) => {
                let path = &after[..end];
                let path = path.strip_prefix("crate::").unwrap_or(path);
                let _ = write!(out, "`{path}`");
                rest = &after[end + 2..];
            }
            None => {
                out.push_str("[`");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    cell(&out)
}

fn configuration() -> String {
    let import: Vec<&str> = settings::OTLP_CONNECTION.iter().map(|s| s.var()).collect();
    let mut out = String::new();
    out.push_str("| variable | what it does | accepted | default | flag | example |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for s in settings::SETTINGS {
        let mut doc = cell(s.doc());
        if s.secret() {
            doc.push_str(" (secret: printed as `key=****`)");
        }
        if import.contains(&s.var()) {
            doc.push_str(" (also read by `phasetrace import`)");
        }
        let flag = s.flag().map(|f| format!("`--{f}`")).unwrap_or_default();
        let example = if s.secret() {
            String::new()
        } else {
            code(s.example())
        };
        let _ = writeln!(
            out,
            "| `{}` | {doc} | {} | {} | {flag} | {example} |",
            s.var(),
            cell(s.expected()),
            cell(&s.default_text()),
        );
    }
    out
}

fn names_table(out: &mut String, title: &str, intro: &str, module: &str, rows: &[Name]) {
    let _ = writeln!(out, "### {title}\n\n{intro}\n");
    out.push_str("| value | constant | meaning |\n| --- | --- | --- |\n");
    for n in rows {
        let constant = if n.constant.is_empty() {
            String::new()
        } else {
            format!("`{module}::{}`", n.constant)
        };
        let _ = writeln!(
            out,
            "| {} | {constant} | {} |",
            code(n.value),
            meaning(n.description)
        );
    }
    out.push('\n');
}

fn metrics_table(out: &mut String, rows: &[Metric]) {
    out.push_str(
        "### Metrics (`phasetrace_names::metric::ALL`)\n\nEvery metric with its instrument, unit \
         and attributes; the Prometheus column is the name a scrape shows.\n\n",
    );
    out.push_str(
        "| metric | Prometheus | instrument | unit | attributes | constant | meaning |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for m in rows {
        let attributes = m
            .attributes
            .iter()
            .map(|a| format!("`{a}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "| `{}` | `{}` | {} | {} | {attributes} | `metric::{}` | {} |",
            m.name,
            m.prometheus_name(),
            m.instrument.as_str(),
            code(m.unit),
            m.constant,
            meaning(m.description),
        );
    }
    out.push('\n');
}

fn list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn telemetry() -> String {
    use names::{
        attr, auth_refusal, connection_close, env, export_failure, metric, outcome, reason,
        resource, signal, span, vocab,
    };
    let mut out = String::new();
    metrics_table(&mut out, metric::ALL);
    let boundaries = metric::DURATION_BOUNDARIES
        .iter()
        .map(|b| format!("{b:e}"))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        out,
        "- Explicit duration buckets (`metric::DURATION_BOUNDARIES`), in seconds: {boundaries}.\n\
         - Per-layer distributions, exponential on every provider and left out of the text \
         scrapes (`metric::LAYER_DISTRIBUTIONS`): {}; at most {} buckets each \
         (`metric::LAYER_DISTRIBUTION_MAX_BUCKETS`).\n\
         - Per-layer counters the protobuf scrape leaves out when it serves those \
         (`metric::LAYER_COUNTERS_IN_DISTRIBUTIONS`): {}.\n\
         - Histograms with a native (base-2 exponential) half on the protobuf scrape \
         (`metric::NATIVE_HALVES`): {}.\n",
        list(&metric::LAYER_DISTRIBUTIONS),
        metric::LAYER_DISTRIBUTION_MAX_BUCKETS,
        list(&metric::LAYER_COUNTERS_IN_DISTRIBUTIONS),
        list(&metric::NATIVE_HALVES),
    );
    names_table(
        &mut out,
        "Attributes (`phasetrace_names::attr::ALL`)",
        "Attribute keys of series and spans.",
        "attr",
        attr::ALL,
    );
    names_table(
        &mut out,
        "Resource (`phasetrace_names::resource::ALL`)",
        "Resource attribute keys phasetrace sets (OpenTelemetry semantic conventions).",
        "resource",
        resource::ALL,
    );
    names_table(
        &mut out,
        "Spans (`phasetrace_names::span::ALL`)",
        "Span and event names (a section's span is named by its bucket).",
        "span",
        span::ALL,
    );
    names_table(
        &mut out,
        "Drop reasons (`phasetrace_names::reason::ALL`, `phasetrace::DropReason`)",
        &meaning(
            "The `reason` values of `phasetrace.records.dropped`; each is a series from the \
             start, at 0.",
        ),
        "reason",
        reason::ALL,
    );
    names_table(
        &mut out,
        "Outcomes (`phasetrace_names::outcome::ALL`, `phasetrace::names::Outcome`)",
        "The `result` values of `phasetrace.prometheus.web_config.reloads` and \
         `phasetrace.metric.exports`; both are series from the start.",
        "outcome",
        outcome::ALL,
    );
    names_table(
        &mut out,
        "Closed connections (`phasetrace_names::connection_close::ALL`, \
         `phasetrace::names::ConnectionClose`)",
        "The `reason` values of `phasetrace.prometheus.connections.closed`; each is a series \
         from the start, at 0.",
        "connection_close",
        connection_close::ALL,
    );
    names_table(
        &mut out,
        "Refused auth (`phasetrace_names::auth_refusal::ALL`, `phasetrace::names::AuthRefusal`)",
        "The `reason` values of `phasetrace.prometheus.auth.refused`; each is a series from the \
         start, at 0.",
        "auth_refusal",
        auth_refusal::ALL,
    );
    names_table(
        &mut out,
        "Export failures (`phasetrace_names::export_failure::ALL`, \
         `phasetrace::names::ExportFailure`)",
        "The `reason` values of `phasetrace.otlp.export.failures`; each is a series from the \
         start, at 0.",
        "export_failure",
        export_failure::ALL,
    );
    names_table(
        &mut out,
        "Signals (`phasetrace_names::signal::ALL`)",
        "The `signal` values of `phasetrace.otlp.export.failures`.",
        "signal",
        signal::ALL,
    );
    out.push_str(
        "### Built-in sections (`phasetrace_names::vocab::SECTIONS`)\n\nThe `bucket` values \
         phasetrace knows without being told (`phasetrace::Section`); an engine may register \
         its own.\n\n| bucket | kind | meaning |\n| --- | --- | --- |\n",
    );
    for s in vocab::SECTIONS {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} |",
            s.value,
            s.kind,
            meaning(s.description)
        );
    }
    out.push('\n');
    names_table(
        &mut out,
        "Sites, phases and verify parts (`phasetrace_names::vocab`)",
        "The built-in `site` values (`vocab::SITES`; an engine may register its own), the \
         speculative `phase` values (`vocab::PHASES`, closed) and the verify `part` values \
         (`vocab::VERIFY_PARTS`, closed).",
        "vocab",
        &[vocab::SITES, vocab::PHASES, vocab::VERIFY_PARTS].concat(),
    );
    names_table(
        &mut out,
        "Step kinds (`phasetrace_names::vocab::STEP_KINDS`)",
        "The `step.kind` values (closed): what the engine says a step computed \
         (`Recorder::step_of`). A step begun without a kind carries no `step.kind`.",
        "vocab",
        vocab::STEP_KINDS,
    );
    names_table(
        &mut out,
        "Environment variables (`phasetrace_names::env::ALL`)",
        &format!(
            "The variables `phasetrace::Config::from_env` reads (what each accepts and its \
             default: [configuration](configuration.md)); the rank falls back to {} \
             (`env::RANK_FALLBACKS`).",
            list(&env::RANK_FALLBACKS)
        ),
        "env",
        &env_rows(),
    );
    out.trim_end().to_owned() + "\n"
}

/// The rows of the environment variables' table, from the settings table itself (what
/// `names/src/env.rs` is generated from), so that one `cargo xtask docs` brings both up to date.
fn env_rows() -> Vec<Name> {
    settings::SETTINGS
        .iter()
        .map(|s| Name {
            constant: env_constant(s.var()),
            value: s.var(),
            description: Box::leak(env_description(*s).into_boxed_str()),
        })
        .collect()
}

/// The file with its generated part replaced by `generated`.
fn splice(path: &Path, text: &str, generated: &str) -> Result<String, String> {
    let at = |what: &str| format!("{}: {what}", path.display());
    let begin = text
        .find(BEGIN)
        .ok_or_else(|| at(&format!("no `{BEGIN} ... -->` marker")))?;
    let body = begin
        + text[begin..]
            .find("-->")
            .ok_or_else(|| at("the begin marker is not closed"))?
        + "-->".len();
    let end = text[body..]
        .find(END)
        .map(|i| body + i)
        .ok_or_else(|| at(&format!("no `{END}` marker")))?;
    Ok(format!("{}\n{generated}{}", &text[..body], &text[end..]))
}

/// Rewrites the generated parts under `root` (`check`: compares instead); `Err` lists the files
/// that differ, each with its first differing line.
pub(crate) fn run(root: &Path, check: bool) -> Result<Vec<String>, String> {
    let mut stale = Vec::new();
    let mut written = Vec::new();
    for (relative, generated) in references() {
        let path = root.join(relative);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("{}: cannot read it ({e})", path.display()))?;
        let want = splice(&path, &text, &generated)?;
        if want == text {
            continue;
        }
        if check {
            let first = text
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| text.lines().count().min(want.lines().count()));
            stale.push(format!(
                "{relative} differs from what its data gives, first at line {}:\n  checked in: {:?}\n  generated:  {:?}",
                first + 1,
                text.lines().nth(first).unwrap_or("(end of file)"),
                want.lines().nth(first).unwrap_or("(end of file)"),
            ));
        } else {
            std::fs::write(&path, &want)
                .map_err(|e| format!("{}: cannot write it ({e})", path.display()))?;
            written.push(format!("regenerated {relative}"));
        }
    }
    if stale.is_empty() {
        Ok(written)
    } else {
        Err(stale.join("\n") + "\nregenerate with: cargo xtask docs")
    }
}
