//! Every relative link of the Markdown files the crate ships (README.md, BENCHMARKS.md,
//! docs/*.md) names a file that exists in the repository and that the package
//! holds (`include` in Cargo.toml), and every `#anchor` names a heading of its target; so the
//! links work on a clone and in the packaged crate alike. A file outside the package is named
//! as a path in code, never linked. (`.ci/run` also checks the real `cargo package --list`.)

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files the package ships.
fn shipped_markdown() -> Vec<PathBuf> {
    // CHANGELOG.md stays in the repository (it would take the package past 1 MiB).
    let mut files: Vec<PathBuf> = ["README.md", "BENCHMARKS.md"]
        .iter()
        .map(|f| root().join(f))
        .collect();
    let docs = std::fs::read_dir(root().join("docs")).expect("docs/ exists");
    let mut pages: Vec<PathBuf> = docs
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

/// The `include` patterns of the `[package]` section, e.g. `/src/**`, `/README.md`.
fn include_patterns() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let start = manifest
        .find("\ninclude = [")
        .expect("Cargo.toml's [package] has an include list");
    let list = &manifest[start + "\ninclude = [".len()..];
    let list = &list[..list.find(']').expect("the include list ends")];
    list.split(',')
        .map(|p| p.trim().trim_matches('"').to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Whether a repository-relative path (`docs/telemetry.md`) is in the package.
fn packaged(relative: &str, patterns: &[String]) -> bool {
    let matches = |p: &str| {
        let p = p.trim_start_matches('/');
        match p.strip_suffix("/**") {
            Some(dir) => relative.starts_with(&format!("{dir}/")),
            None => relative == p,
        }
    };
    // `!pattern` takes a file back out (gitignore-style, as cargo reads `include`).
    let excluded = patterns
        .iter()
        .filter_map(|p| p.strip_prefix('!'))
        .any(matches);
    !excluded
        && patterns
            .iter()
            .filter(|p| !p.starts_with('!'))
            .any(|p| matches(p))
}

/// Link targets in a Markdown text, outside code blocks and inline code: `[text](target)`.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (no, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Drop inline code spans so that `a](b)` inside backticks is not a link.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((no + 1, after[..end].trim().to_owned()));
            rest = &after[end + 1..];
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(&line.trim_start_matches('#').replace('`', "")));
        }
    }
    out
}

/// `a/b/../c` -> `a/c`, relative to the repository root; `None` when it leaves the root.
fn normalize(path: &Path) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(parts.join("/"))
}

#[test]
fn every_link_in_the_readme_and_docs_resolves() {
    let patterns = include_patterns();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in shipped_markdown() {
        let relative = file
            .strip_prefix(root())
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        assert!(
            packaged(&relative, &patterns),
            "{relative} is shipped documentation but not in the package's include list"
        );
        let text = std::fs::read_to_string(&file).expect("readable");
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue; // absolute: resolves wherever the file is read
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let folder = Path::new(&relative).parent().unwrap_or(Path::new(""));
            let resolved = if path.is_empty() {
                Some(relative.clone())
            } else {
                normalize(&folder.join(path))
            };
            let Some(resolved) = resolved else {
                broken.push(format!(
                    "{relative}:{line}: {target}: leaves the repository"
                ));
                continue;
            };
            let on_disk = root().join(&resolved);
            if !on_disk.exists() {
                broken.push(format!(
                    "{relative}:{line}: {target}: {resolved} does not exist"
                ));
                continue;
            }
            if !packaged(&resolved, &patterns) {
                broken.push(format!(
                    "{relative}:{line}: {target}: {resolved} is not in the package (name it as a path instead)"
                ));
            }
            if let Some(anchor) = anchor {
                let target_text = std::fs::read_to_string(&on_disk).unwrap_or_default();
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!(
                        "{relative}:{line}: {target}: no heading with anchor #{anchor} in {resolved}"
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked >= 10,
        "only {checked} relative links found: the README links into docs/"
    );
}

#[test]
fn the_link_reader_sees_links_and_skips_code() {
    let text = "see [a](docs/a.md#x) and `[b](c)`\n```\n[d](e)\n```\n[f](g)";
    let found: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(found, ["docs/a.md#x", "g"]);
    assert_eq!(
        slug("Slow steps: from the alert to the trace"),
        "slow-steps-from-the-alert-to-the-trace"
    );
    assert!(packaged("docs/a.md", &["/docs/**".to_owned()]));
    assert!(!packaged("scripts/test.sh", &["/docs/**".to_owned()]));
}
