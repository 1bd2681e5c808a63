//! Every program in `examples/` and every `rust` code block of the README and
//! docs/integrating.md builds as an engine's own crate builds it: one crate outside the
//! workspace whose manifest names phasetrace by path and only the engine's own crates the docs
//! name beside it (`opentelemetry`, `opentelemetry_sdk`, `tracing`, `tracing-subscriber`,
//! `tracing-opentelemetry`, `tokio`), never a crate of phasetrace's workspace
//! (`phasetrace-names`, `phasetrace-testkit`, ...). Each program is an example of that crate,
//! checked with `cargo check --offline --examples`, versions pinned by this workspace's
//! `Cargo.lock`, in a target directory of its own under `target/tmp` that later runs reuse.
//! A `rust` block must be a complete program (`fn main`); a fragment is marked `rust,ignore`
//! and preceded by a line that says where it builds (`<!-- snippet: builds in
//! tests/snippets/NAME.rs -->`, a program whose `// {snippet}` line it replaces) or why it
//! cannot (`<!-- snippet: not built: REASON -->`); every doc is read (the README and `docs/`).
//!
//! And a provider of another `opentelemetry` version (to the compiler, a type that does not
//! implement this version's provider traits) is refused at compile time with a message that
//! names the version to align on, which is the workspace's own `opentelemetry` version.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The docs a user reads: (program name prefix, path), the README and every page of `docs/`.
fn docs() -> Vec<(String, PathBuf)> {
    let mut docs = vec![("readme".to_owned(), Path::new(ROOT).join("README.md"))];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .map(|e| e.expect("an entry of docs/").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    for p in pages {
        let stem = p.file_stem().expect("a file name").to_string_lossy();
        docs.push((stem.replace('-', "_"), p));
    }
    docs
}

/// A code block of a doc: a program (```` ```rust ````) or a fragment (```` ```rust,ignore ````)
/// with the line before its fence.
struct Block {
    fragment: bool,
    before: String,
    code: String,
}

/// The `rust` and `rust,ignore` blocks of `markdown` (fences may be indented, in a list).
fn rust_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    let mut before = "";
    for line in markdown.lines() {
        let fence = line.trim();
        match open.as_mut() {
            None if fence == "```rust" || fence == "```rust,ignore" => {
                open = Some(Block {
                    fragment: fence.ends_with("ignore"),
                    before: before.trim().to_owned(),
                    code: String::new(),
                });
            }
            None => {}
            Some(_) if fence == "```" => blocks.extend(open.take()),
            Some(block) => {
                block.code.push_str(line);
                block.code.push('\n');
            }
        }
        before = line;
    }
    assert!(open.is_none(), "an unclosed rust block");
    blocks
}

/// A fragment inside the program its marker names, or `None` with the reason it is not built.
fn in_context(doc: &Path, i: usize, b: &Block) -> Result<String, String> {
    let at = || format!("{}, rust block {i}", doc.display());
    let marker = b
        .before
        .strip_prefix("<!-- snippet: ")
        .and_then(|m| m.strip_suffix(" -->"))
        .unwrap_or_else(|| {
            panic!(
                "{}: a fragment without a marker on the line before it; say where it builds \
                 (<!-- snippet: builds in tests/snippets/NAME.rs -->) or why not \
                 (<!-- snippet: not built: REASON -->)",
                at()
            )
        });
    if let Some(reason) = marker.strip_prefix("not built: ") {
        assert!(reason.len() > 10, "{}: say why it is not built", at());
        return Err(reason.to_owned());
    }
    let file = marker
        .strip_prefix("builds in ")
        .unwrap_or_else(|| panic!("{}: unknown marker {marker:?}", at()));
    let context = std::fs::read_to_string(Path::new(ROOT).join(file))
        .unwrap_or_else(|e| panic!("{}: {file}: {e}", at()));
    assert!(
        context.contains("// {snippet}"),
        "{file}: no `// {{snippet}}` line"
    );
    let indented: String = b.code.lines().map(|l| format!("    {l}\n")).collect();
    Ok(context.replace("    // {snippet}\n", &indented))
}

/// (example name, source) for every program to build.
fn programs() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut examples: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("examples"))
        .expect("examples/")
        .map(|e| e.expect("an entry of examples/").path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    examples.sort();
    for path in examples {
        let name = path.file_stem().expect("a file name").to_string_lossy();
        // Its feature is named below only when this build has it (cudarc is not compiled else).
        if name == "cuda_stream" && !cfg!(feature = "cuda") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("an example");
        out.push((name.into_owned(), text));
    }
    for (prefix, doc) in docs() {
        let text = std::fs::read_to_string(&doc).expect("a doc");
        for (i, block) in rust_blocks(&text).into_iter().enumerate() {
            let name = format!("{prefix}_{}", i + 1);
            if !block.fragment {
                assert!(
                    block.code.contains("fn main"),
                    "{}, rust block {}: not a complete program; mark a fragment `rust,ignore`",
                    doc.display(),
                    i + 1
                );
                out.push((name, block.code));
            } else if let Ok(program) = in_context(&doc, i + 1, &block) {
                out.push((name, program));
            }
        }
    }
    out
}

/// The manifest of an outside crate named `name`.
fn manifest(name: &str) -> String {
    let features = if cfg!(feature = "cuda") {
        r#", features = ["cuda"]"#
    } else {
        ""
    };
    let mut m = String::new();
    writeln!(
        m,
        r#"[package]
name = "{name}"
version = "0.0.0"
edition = "2024"
publish = false

# Not a member of the phasetrace workspace that contains this directory.
[workspace]

[dependencies]
phasetrace = {{ path = {ROOT:?}{features} }}
opentelemetry = "0.33"
opentelemetry_sdk = {{ version = "0.33", features = ["testing"] }}
tracing = "0.1"
tracing-subscriber = {{ version = "0.3", default-features = false, features = ["registry", "std"] }}
tracing-opentelemetry = {{ version = "0.34", default-features = false }}
tokio = {{ version = "1", features = ["rt-multi-thread", "macros", "time"] }}"#
    )
    .expect("writing to a String");
    m
}

#[test]
fn every_example_and_docs_snippet_builds_as_an_outside_crate() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("outside-crate");
    let examples = dir.join("examples");
    // Programs removed since the last run must not linger.
    let _ = std::fs::remove_dir_all(&examples);
    std::fs::create_dir_all(&examples).expect("the crate's directory");
    std::fs::create_dir_all(dir.join("src")).expect("src/");
    std::fs::write(dir.join("src/lib.rs"), "").expect("src/lib.rs");
    std::fs::write(dir.join("Cargo.toml"), manifest("phasetrace-outside")).expect("Cargo.toml");
    std::fs::copy(Path::new(ROOT).join("Cargo.lock"), dir.join("Cargo.lock"))
        .expect("the workspace's Cargo.lock");
    let programs = programs();
    for (name, source) in &programs {
        std::fs::write(examples.join(format!("{name}.rs")), source).expect("an example");
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["check", "--offline", "--examples", "--message-format=short"])
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .output()
        .expect("running cargo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let names: Vec<&str> = programs.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        out.status.success(),
        "{names:?} as an outside crate ({}):\n{stderr}",
        dir.display()
    );
    // A warning in a printed program (a deprecated name, an unused import) is a user's too.
    assert!(
        !stderr.contains("`phasetrace-outside`"),
        "{names:?}: warnings:\n{stderr}"
    );
    for name in [
        "minimal",
        "own_providers",
        "readme_1",
        "integrating_1",
        "integrating_2",
        "moe_1",
        "moe_2",
    ] {
        assert!(names.contains(&name), "{name} was not built: {names:?}");
    }
}

/// The `major.minor` of the workspace's `opentelemetry` requirement (`Cargo.toml`).
fn opentelemetry_version() -> String {
    let manifest = std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).expect("Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.starts_with("opentelemetry = "))
        .expect("the opentelemetry dependency in Cargo.toml");
    let version = line
        .split("version = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("its version");
    version.split('.').take(2).collect::<Vec<_>>().join(".")
}

#[test]
fn a_provider_of_another_opentelemetry_version_is_refused_naming_the_version_to_align_on() {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = base.join("outside-crate-mismatch");
    std::fs::create_dir_all(dir.join("src")).expect("the crate's directory");
    std::fs::write(
        dir.join("Cargo.toml"),
        manifest("phasetrace-outside-mismatch"),
    )
    .expect("Cargo.toml");
    std::fs::copy(Path::new(ROOT).join("Cargo.lock"), dir.join("Cargo.lock"))
        .expect("the workspace's Cargo.lock");
    // What the engine's SdkMeterProvider and SdkTracerProvider of opentelemetry 0.32 are to
    // the compiler here: types without this version's provider traits.
    std::fs::write(
        dir.join("src/lib.rs"),
        r#"pub struct MeterProviderOfAnotherVersion;
pub struct TracerProviderOfAnotherVersion;
pub fn build() {
    let _ = phasetrace::Profiler::builder()
        .with_meter_provider(MeterProviderOfAnotherVersion)
        .with_tracer_provider(TracerProviderOfAnotherVersion);
}
"#,
    )
    .expect("src/lib.rs");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["check", "--offline", "--lib", "--message-format=short"])
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        // The dependencies the other test built (cargo's lock serializes the two).
        .env(
            "CARGO_TARGET_DIR",
            base.join("outside-crate").join("target"),
        )
        .output()
        .expect("running cargo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it compiled:\n{stderr}");
    let version = opentelemetry_version();
    for provider in [
        "MeterProviderOfAnotherVersion",
        "TracerProviderOfAnotherVersion",
    ] {
        let kind = if provider.starts_with("Meter") {
            "meter"
        } else {
            "tracer"
        };
        let message = format!(
            "`{provider}` is not a {kind} provider of opentelemetry {version}, the version phasetrace"
        );
        assert!(stderr.contains(&message), "no {message:?} in:\n{stderr}");
    }
    // --message-format=short leaves the notes out: the long form has the advice.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let long = Command::new(cargo)
        .args(["check", "--offline", "--lib"])
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .env(
            "CARGO_TARGET_DIR",
            base.join("outside-crate").join("target"),
        )
        .output()
        .expect("running cargo");
    let long = String::from_utf8_lossy(&long.stderr);
    let advice = format!("align the engine's opentelemetry and opentelemetry_sdk on {version}");
    assert!(long.contains(&advice), "no {advice:?} in:\n{long}");
    assert!(long.contains("cargo tree -d -i opentelemetry"), "{long}");
}
