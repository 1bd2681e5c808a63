//! The source checks: functions over a length, names declared outside the contract's tables,
//! module headers that name what does not exist.
//!
//! ```text
//! every crate's src/ (engines too), benches/, examples/ ──syn (line spans)──> functions over
//!   the limit, by name and length (tests skipped)
//! names/src/lib.rs ──syn──> a `pub const NAME: &str` outside `names!`/`metrics!` (not in `ALL`)
//! every crate's `//!` headers ──backticked names──> each an identifier of the workspace's code
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use syn::spanned::Spanned;
use syn::visit::Visit;

/// The sources held to the length limit: every crate of the workspace (the library, the
/// importer, the command, the helper crates, the candle engine and its CUDA build, which is a
/// workspace of its own), with their benches and examples; tests are not held to it.
pub(crate) const LENGTH_CHECKED: [&str; 15] = [
    "src",
    "import/src",
    "cli/src",
    "names/src",
    "transport/src",
    "encode/src",
    "testkit/src",
    "sim/src",
    "gpu-bench/src",
    "xtask/src",
    "engines/candle/src",
    "engines/candle-cuda/src",
    "benches",
    "examples",
    "engines/candle/benches",
];

/// Every crate's sources, for the header check.
const HEADER_CHECKED: [&str; 10] = [
    "src",
    "import/src",
    "cli/src",
    "names/src",
    "transport/src",
    "encode/src",
    "testkit/src",
    "sim/src",
    "engines/candle/src",
    "engines/candle-cuda/src",
];

/// The `.rs` files under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn parse(path: &Path) -> Result<syn::File, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read it ({e})", path.display()))?;
    syn::parse_file(&text).map_err(|e| {
        format!(
            "{}:{}: cannot parse it ({e})",
            path.display(),
            e.span().start().line
        )
    })
}

fn is_test_attr(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test"))
    })
}

/// One function over the limit.
#[derive(Debug)]
pub(crate) struct Long {
    pub(crate) file: String,
    pub(crate) line: usize,
    pub(crate) name: String,
    pub(crate) lines: usize,
}

struct Lengths<'a> {
    file: &'a str,
    max: usize,
    scope: Vec<String>,
    found: Vec<Long>,
    /// `#[cfg(test)] mod name;` declarations: files not held to the limit.
    test_modules: Vec<String>,
}

impl Lengths<'_> {
    fn note(&mut self, name: &str, start: proc_macro2::Span, block: &syn::Block) {
        let first = start.start().line;
        let last = block.brace_token.span.close().end().line;
        let lines = last + 1 - first;
        if lines > self.max {
            let mut path = self.scope.clone();
            path.push(name.to_owned());
            self.found.push(Long {
                file: self.file.to_owned(),
                line: first,
                name: path.join("::"),
                lines,
            });
        }
    }
}

impl<'ast> Visit<'ast> for Lengths<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_test_attr(&m.attrs) {
            if m.content.is_none() {
                self.test_modules.push(m.ident.to_string());
            }
            return;
        }
        self.scope.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.scope.pop();
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test_attr(&i.attrs) {
            return;
        }
        let ty = &i.self_ty;
        let name = quote_type(ty);
        self.scope.push(name);
        syn::visit::visit_item_impl(self, i);
        self.scope.pop();
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if is_test_attr(&f.attrs) {
            return;
        }
        self.note(&f.sig.ident.to_string(), f.sig.span(), &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test_attr(&f.attrs) {
            return;
        }
        self.note(&f.sig.ident.to_string(), f.sig.span(), &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.note(&f.sig.ident.to_string(), f.sig.span(), block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// A type as the report names it (`LaneState`, `Start`).
fn quote_type(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map_or_else(|| "?".to_owned(), |s| s.ident.to_string()),
        _ => "impl".to_owned(),
    }
}

/// The functions under `dirs` (relative to `root`) longer than `max` lines, from their
/// signature to their closing brace (doc comments and attributes not counted), longest first.
/// Tests (`#[test]`, `#[cfg(test)]` modules and the files they name) are not held to it.
pub(crate) fn long_functions(root: &Path, dirs: &[&str], max: usize) -> Result<Vec<Long>, String> {
    let mut found = Vec::new();
    for dir in dirs {
        let files = rust_files(&root.join(dir));
        let mut skipped: BTreeSet<PathBuf> = BTreeSet::new();
        for path in &files {
            if skipped.contains(path) {
                continue;
            }
            let relative = path
                .strip_prefix(root)
                .unwrap_or(path)
                .display()
                .to_string();
            let file = parse(path)?;
            let mut v = Lengths {
                file: &relative,
                max,
                scope: Vec::new(),
                found: Vec::new(),
                test_modules: Vec::new(),
            };
            v.visit_file(&file);
            // `#[cfg(test)] mod tests;` in `a/b.rs` or `a/b/mod.rs` is `a/b/tests.rs`.
            let stem = path.with_extension("");
            let base = if path
                .file_name()
                .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs")
            {
                path.parent().map(Path::to_path_buf).unwrap_or_default()
            } else {
                stem
            };
            for m in &v.test_modules {
                skipped.insert(base.join(format!("{m}.rs")));
                skipped.insert(base.join(m).join("mod.rs"));
            }
            found.extend(v.found);
        }
    }
    found.sort_by(|a, b| b.lines.cmp(&a.lines).then(a.file.cmp(&b.file)));
    Ok(found)
}

/// The modules of `names/src/lib.rs` whose string constants must be declared in their table
/// (`names!` or `metrics!`), with the constants that are plain values, not names.
const TABLED: [(&str, &[&str]); 12] = [
    ("metric", &["UNIT_"]),
    ("attr", &[]),
    ("resource", &["DISTRO"]),
    ("span", &[]),
    // `env::ALL` is generated from the settings table; `LOCAL_RANK` is a rank fallback (in
    // `env::RANK_FALLBACKS`, which the reference lists), not a setting's variable.
    ("env", &["LOCAL_RANK"]),
    ("reason", &[]),
    ("outcome", &[]),
    ("connection_close", &[]),
    ("auth_refusal", &[]),
    ("export_failure", &[]),
    ("signal", &[]),
    ("vocab", &[]),
];

/// A `pub const NAME: &str` written directly in a module of the contract instead of its
/// table: it would be missing from `ALL`, so from the generated reference.
pub(crate) fn untabled_names(root: &Path) -> Result<Vec<String>, String> {
    let path = root.join("names/src/lib.rs");
    let file = parse(&path)?;
    let mut out = Vec::new();
    for item in &file.items {
        let syn::Item::Mod(m) = item else { continue };
        let Some((_, plain)) = TABLED.iter().find(|(n, _)| m.ident == n) else {
            continue;
        };
        for item in m.content.iter().flat_map(|(_, items)| items) {
            let syn::Item::Const(c) = item else { continue };
            let is_str = matches!(&*c.ty, syn::Type::Reference(r) if matches!(&*r.elem, syn::Type::Path(p) if p.path.is_ident("str")));
            let name = c.ident.to_string();
            if is_str
                && matches!(c.vis, syn::Visibility::Public(_))
                && !plain.iter().any(|p| name.starts_with(p))
            {
                out.push(format!(
                    "names/src/lib.rs:{}: `{}::{name}` is a plain constant: declare it in the \
                     `{}!` block of `mod {}` (it is then in `{}::ALL` and the reference)",
                    c.span().start().line,
                    m.ident,
                    if m.ident == "metric" {
                        "metrics"
                    } else {
                        "names"
                    },
                    m.ident,
                    m.ident,
                ));
            }
        }
    }
    Ok(out)
}

/// Backticked names of headers that are not Rust items of the workspace on purpose (a message
/// the module leaves out, a formula, a PromQL function), by file: reviewed, not checked.
const NOT_CODE: [(&str, &str); 3] = [
    ("src/export/prometheus/proto.rs", "Quantile"),
    ("src/worker/replay.rs", "E_n"),
    ("import/src/openmetrics.rs", "increase()"),
];

/// Every identifier written in the code (not the comments) of the workspace's crates.
fn identifiers(root: &Path) -> Result<BTreeSet<String>, String> {
    let mut out = BTreeSet::new();
    for dir in HEADER_CHECKED.iter().chain(
        [
            "tests",
            "benches",
            "examples",
            "engines/candle/tests",
            "engines/candle/benches",
        ]
        .iter(),
    ) {
        for path in rust_files(&root.join(dir)) {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let tokens: proc_macro2::TokenStream = text
                .parse()
                .map_err(|e| format!("{}: cannot tokenize it ({e})", path.display()))?;
            collect_idents(tokens, &mut out);
        }
    }
    Ok(out)
}

fn collect_idents(tokens: proc_macro2::TokenStream, out: &mut BTreeSet<String>) {
    for t in tokens {
        match t {
            proc_macro2::TokenTree::Ident(i) => {
                out.insert(i.to_string().trim_start_matches("r#").to_owned());
            }
            proc_macro2::TokenTree::Group(g) => collect_idents(g.stream(), out),
            proc_macro2::TokenTree::Literal(l) => {
                // Names a module header may quote that live in strings (`"decode.step"`).
                let s = l.to_string();
                if let Some(inner) = s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
                    out.insert(inner.to_owned());
                }
            }
            proc_macro2::TokenTree::Punct(_) => {}
        }
    }
}

/// Whether a backticked span of a header reads as a Rust name: a path (`a::B`), a call
/// (`probe()`), or a type-like identifier (`LaneState`); plain words and values are prose.
fn rust_name(span: &str) -> Option<&str> {
    let s = span.strip_suffix("()").unwrap_or(span);
    let ok = !s.is_empty()
        && s.split("::").all(|seg| {
            !seg.is_empty()
                && seg
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && seg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    let code_like = s.contains("::")
        || span.ends_with("()")
        || (s.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && s.chars().any(|c| c.is_ascii_lowercase()));
    (ok && code_like).then_some(s)
}

/// The backticked names of each module header (`//!`) that no code of the workspace spells:
/// an item renamed or removed while its header kept naming it. A file name (`pair.rs`) must be
/// a file of the repository.
pub(crate) fn stale_headers(root: &Path) -> Result<Vec<String>, String> {
    let known = identifiers(root)?;
    let mut out = Vec::new();
    for dir in HEADER_CHECKED {
        for path in rust_files(&root.join(dir)) {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let relative = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .display()
                .to_string();
            for (no, line) in text.lines().enumerate() {
                let Some(doc) = line.trim_start().strip_prefix("//!") else {
                    continue;
                };
                for (i, span) in doc.split('`').enumerate() {
                    if i % 2 == 0 {
                        continue;
                    }
                    if span.ends_with(".rs") && !span.contains(' ') {
                        if !file_exists(root, &path, span) {
                            out.push(format!("{relative}:{}: `{span}`: no such file", no + 1));
                        }
                        continue;
                    }
                    if NOT_CODE.contains(&(relative.as_str(), span)) {
                        continue;
                    }
                    let Some(name) = rust_name(span) else {
                        continue;
                    };
                    let last = name.rsplit("::").next().unwrap_or(name);
                    if !known.contains(last) {
                        out.push(format!(
                            "{relative}:{}: `{span}`: no code of the workspace names `{last}`",
                            no + 1
                        ));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Whether `name` (`pair.rs`, `config/table.rs`) is a file beside `from`, under its crate's
/// `src/`, or anywhere in the repository's sources.
fn file_exists(root: &Path, from: &Path, name: &str) -> bool {
    let mut dir = from.parent();
    while let Some(d) = dir {
        if d.join(name).is_file() || d.join("src").join(name).is_file() {
            return true;
        }
        if d == root {
            break;
        }
        dir = d.parent();
    }
    false
}
