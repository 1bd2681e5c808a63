//! `docs/configuration.md` and `docs/telemetry.md` hold generated references: the settings
//! table (`phasetrace::config::settings::SETTINGS`, through the crate's public API) and the
//! telemetry contract (`names/src/lib.rs` and `src/names.rs`: every constant with its doc comment, and the values of its
//! enums). The generated text sits between two markers in each file; the prose around it is
//! written by hand. The test fails when the checked-in text differs from what the sources give,
//! and regenerates the files when asked:
//!
//! ```sh
//! PHASETRACE_REGENERATE_DOCS=1 cargo test -p phasetrace --test it the_generated_references
//! ```
//!
//! Both generators walk their source: a new setting or a new constant appears without a change
//! here. An enum in `names.rs` whose values the generator cannot find (no `as_str` arms) fails
//! the test rather than going undocumented.

use phasetrace::config::settings;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Set (to anything) to rewrite the generated parts of the docs instead of checking them.
const REGENERATE: &str = "PHASETRACE_REGENERATE_DOCS";
const BEGIN: &str = "<!-- BEGIN GENERATED";
const END: &str = "<!-- END GENERATED -->";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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
    let fence = if text.contains('`') { "`` " } else { "`" };
    let end = if text.contains('`') { " ``" } else { "`" };
    format!("{fence}{}{end}", text.replace('|', "\\|"))
}

// ---- the configuration reference -------------------------------------------------------------

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

// ---- the telemetry contract ------------------------------------------------------------------

/// One `pub const` of `names.rs`.
pub(crate) struct Constant {
    pub(crate) name: String,
    /// The value as written, a string without its quotes.
    pub(crate) value: String,
    pub(crate) doc: String,
}

/// One `pub mod` or `pub enum` of `names.rs`, in file order.
pub(crate) enum Item {
    Module {
        name: String,
        doc: String,
        constants: Vec<Constant>,
    },
    Enum {
        name: String,
        doc: String,
        /// Variant, its doc, its value (from the `as_str` arms).
        variants: Vec<(String, String, Option<String>)>,
    },
}

/// Doc comment text as plain Markdown: intra-doc links become inline code of their path
/// inside `names` (`[`crate::names::attr::GROUP`]` -> `attr::GROUP`).
fn plain_doc(lines: &[String]) -> String {
    let text = lines.join(" ");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("[`") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find("`]") {
            Some(end) => {
                let path = &after[..end];
                let path = path.strip_prefix("crate::").unwrap_or(path);
                let path = path.strip_prefix("names::").unwrap_or(path);
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
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The line without string literals and comments, for counting braces.
fn code_only(line: &str) -> String {
    let line = match line.find("//") {
        Some(i) if !line[..i].contains('"') => &line[..i],
        _ => line,
    };
    let mut out = String::new();
    let mut in_str = false;
    for ch in line.chars() {
        match ch {
            '"' => in_str = !in_str,
            _ if in_str => {}
            _ => out.push(ch),
        }
    }
    out
}

/// Reads `names.rs`: its modules' constants and its enums, each with its doc comment. The file
/// is regular (rustfmt'd, one item a line or a few), which a line reader follows.
pub(crate) fn parse_names(source: &str) -> Result<Vec<Item>, String> {
    enum Scope {
        Module(usize),
        Enum(usize),
        Other,
    }
    let mut items: Vec<Item> = Vec::new();
    let mut stack: Vec<Scope> = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut lines = source.lines().enumerate();
    while let Some((no, raw)) = lines.next() {
        let line = raw.trim();
        if let Some(d) = line.strip_prefix("///") {
            doc.push(d.trim().to_owned());
            continue;
        }
        if line.starts_with("#[") || line.starts_with("//") || line.is_empty() {
            continue;
        }
        let in_module = matches!(stack.last(), Some(Scope::Module(_)));
        if let Some(rest) = line.strip_prefix("pub mod ")
            && let Some(name) = rest.strip_suffix(" {")
        {
            items.push(Item::Module {
                name: name.to_owned(),
                doc: plain_doc(&doc),
                constants: Vec::new(),
            });
            stack.push(Scope::Module(items.len() - 1));
        } else if let Some(rest) = line.strip_prefix("pub enum ")
            && let Some(name) = rest.strip_suffix(" {")
        {
            items.push(Item::Enum {
                name: name.to_owned(),
                doc: plain_doc(&doc),
                variants: Vec::new(),
            });
            stack.push(Scope::Enum(items.len() - 1));
        } else if in_module && line.starts_with("pub const ") && !line.starts_with("pub const fn") {
            // `pub const NAME: TYPE = VALUE;`, the value possibly on the following lines.
            let mut text = line.to_owned();
            while !text.ends_with(';') {
                let (_, next) = lines
                    .next()
                    .ok_or(format!("names.rs line {}: a constant without `;`", no + 1))?;
                text.push(' ');
                text.push_str(next.trim());
            }
            let decl = &text["pub const ".len()..text.len() - 1];
            let (name, rest) = decl.split_once(':').ok_or(format!(
                "names.rs line {}: `pub const` without a type",
                no + 1
            ))?;
            let (_, value) = rest.split_once('=').ok_or(format!(
                "names.rs line {}: `pub const` without a value",
                no + 1
            ))?;
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            if let Some(Scope::Module(i)) = stack.last()
                && let Item::Module { constants, .. } = &mut items[*i]
            {
                constants.push(Constant {
                    name: name.trim().to_owned(),
                    value: value
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                        .replace("[ ", "[")
                        .replace(", ]", "]"),
                    doc: plain_doc(&doc),
                });
            }
        } else if let Some(Scope::Enum(i)) = stack.last()
            && let Some(variant) = line.strip_suffix(',')
            && variant.chars().all(|c| c.is_ascii_alphanumeric())
            && let Item::Enum { variants, .. } = &mut items[*i]
        {
            variants.push((variant.to_owned(), plain_doc(&doc), None));
        } else if let Some((lhs, rhs)) = line.split_once(" => \"")
            && let Some((enum_name, variant)) = lhs.trim().split_once("::")
            && let Some(value) = rhs.strip_suffix("\",")
        {
            // An `as_str` arm: `DropReason::QueueFull => "queue_full",`.
            for item in &mut items {
                if let Item::Enum { name, variants, .. } = item
                    && name == enum_name
                    && let Some(v) = variants.iter_mut().find(|v| v.0 == variant)
                {
                    v.2 = Some(value.to_owned());
                }
            }
        }
        doc.clear();
        let counted = code_only(line);
        let opens = counted.matches('{').count();
        let closes = counted.matches('}').count();
        let opened_scope =
            (line.starts_with("pub mod ") || line.starts_with("pub enum ")) && line.ends_with(" {");
        for _ in 0..opens.saturating_sub(usize::from(opened_scope)) {
            stack.push(Scope::Other);
        }
        for _ in 0..closes {
            stack
                .pop()
                .ok_or(format!("names.rs line {}: unbalanced braces", no + 1))?;
        }
    }
    if !stack.is_empty() {
        return Err("names.rs: unbalanced braces at the end of the file".to_owned());
    }
    Ok(items)
}

fn telemetry(source: &str) -> Result<String, String> {
    let mut out = String::new();
    for item in parse_names(source)? {
        match item {
            Item::Module {
                name,
                doc,
                constants,
            } => {
                let _ = writeln!(out, "### `phasetrace_names::{name}`\n");
                if !doc.is_empty() {
                    let _ = writeln!(out, "{doc}\n");
                }
                out.push_str("| value | constant | meaning |\n| --- | --- | --- |\n");
                for c in constants {
                    let _ = writeln!(
                        out,
                        "| {} | `{name}::{}` | {} |",
                        code(&c.value),
                        c.name,
                        cell(&c.doc)
                    );
                }
                out.push('\n');
            }
            Item::Enum {
                name,
                doc,
                variants,
            } => {
                let _ = writeln!(out, "### `phasetrace::names::{name}`\n");
                if !doc.is_empty() {
                    let _ = writeln!(out, "{doc}\n");
                }
                out.push_str("| value | variant | meaning |\n| --- | --- | --- |\n");
                for (variant, vdoc, value) in variants {
                    let value = value.ok_or(format!(
                        "names.rs: {name}::{variant} has no `as_str` arm, so its value is unknown \
                         to the telemetry reference"
                    ))?;
                    let _ = writeln!(out, "| `{value}` | `{name}::{variant}` | {} |", cell(&vdoc));
                }
                out.push('\n');
            }
        }
    }
    Ok(out.trim_end().to_owned() + "\n")
}

// ---- checking and regenerating -------------------------------------------------------------

/// The file with its generated part replaced by `generated`.
fn splice(path: &Path, text: &str, generated: &str) -> String {
    let begin = text
        .find(BEGIN)
        .unwrap_or_else(|| panic!("{}: no `{BEGIN} ... -->` marker", path.display()));
    let body = begin
        + text[begin..]
            .find("-->")
            .unwrap_or_else(|| panic!("{}: the begin marker is not closed", path.display()))
        + "-->".len();
    let end = text[body..]
        .find(END)
        .map(|i| body + i)
        .unwrap_or_else(|| panic!("{}: no `{END}` marker", path.display()));
    format!("{}\n{generated}{}", &text[..body], &text[end..])
}

fn check_or_regenerate(relative: &str, generated: &str) -> Option<String> {
    let path = root().join(relative);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: cannot read it ({e})", path.display()));
    let want = splice(&path, &text, generated);
    if want == text {
        return None;
    }
    if std::env::var_os(REGENERATE).is_some() {
        std::fs::write(&path, &want)
            .unwrap_or_else(|e| panic!("{}: cannot write it ({e})", path.display()));
        eprintln!("regenerated {relative}");
        return None;
    }
    let first = text
        .lines()
        .zip(want.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| text.lines().count().min(want.lines().count()));
    Some(format!(
        "{relative} differs from what its source gives, first at line {}:\n  checked in: {:?}\n  generated:  {:?}",
        first + 1,
        text.lines().nth(first).unwrap_or("(end of file)"),
        want.lines().nth(first).unwrap_or("(end of file)"),
    ))
}

/// The telemetry contract's source: the names (`names/src/lib.rs`, the `phasetrace-names`
/// crate) and the values the library's API carries (`src/names.rs`: drop reasons, outcomes).
fn contract_source() -> String {
    ["names/src/lib.rs", "src/names.rs"]
        .iter()
        .map(|f| std::fs::read_to_string(root().join(f)).unwrap_or_else(|e| panic!("{f}: {e}")))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_generated_references_match_the_checked_in_docs() {
    let names = contract_source();
    let telemetry = telemetry(&names).unwrap_or_else(|e| panic!("{e}"));
    let stale: Vec<String> = [
        check_or_regenerate("docs/configuration.md", &configuration()),
        check_or_regenerate("docs/telemetry.md", &telemetry),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(
        stale.is_empty(),
        "{}\nregenerate with: {REGENERATE}=1 cargo test -p phasetrace --test it the_generated_references",
        stale.join("\n")
    );
}

/// The reader of `names.rs` sees what the crate's public API says is there: every drop reason
/// and every metric name, so a change to the file's shape that the reader misses fails here
/// rather than leaving the reference short.
#[test]
fn the_names_reader_finds_every_drop_reason_and_metric() {
    let names = contract_source();
    let items = parse_names(&names).unwrap_or_else(|e| panic!("{e}"));
    let reasons: Vec<String> = items
        .iter()
        .find_map(|i| match i {
            Item::Enum { name, variants, .. } if name == "DropReason" => {
                Some(variants.iter().filter_map(|v| v.2.clone()).collect())
            }
            _ => None,
        })
        .expect("names.rs has DropReason");
    let expected: Vec<String> = phasetrace::DropReason::ALL
        .iter()
        .map(|r| r.as_str().to_owned())
        .collect();
    assert_eq!(reasons, expected);

    let metrics: Vec<&str> = items
        .iter()
        .find_map(|i| match i {
            Item::Module {
                name, constants, ..
            } if name == "metric" => Some(constants.iter().map(|c| c.value.as_str()).collect()),
            _ => None,
        })
        .expect("names.rs has mod metric");
    for name in [
        phasetrace_names::metric::SECTION_DURATION,
        phasetrace_names::metric::RECORDS_DROPPED,
        phasetrace_names::metric::METRIC_EXPORTS,
        phasetrace_names::metric::PROMETHEUS_WEB_CONFIG_LAST_RELOAD_SUCCESSFUL,
        phasetrace_names::metric::UNIT_SECONDS,
    ] {
        assert!(metrics.contains(&name), "the reader missed {name}");
    }
    // A constant nested in an impl block (`DropReason::COUNT`) is not a module's constant.
    assert!(items.iter().all(|i| match i {
        Item::Module { constants, .. } => constants.iter().all(|c| c.name != "COUNT"),
        Item::Enum { .. } => true,
    }));
}
