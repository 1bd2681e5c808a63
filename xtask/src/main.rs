//! The repository's own tasks (`cargo xtask ...`, an alias in `.cargo/config.toml`):
//!
//! - `docs`: regenerate the generated references (`docs/configuration.md`'s settings table,
//!   `docs/telemetry.md`'s contract) from their data; `docs --check` fails when the checked-in
//!   files differ or a name of the contract is declared outside its table.
//! - `long-fns [--max N] [--in DIR]... [--deny]`: the functions of every crate of the workspace
//!   (the candle engine and its CUDA build included; tests not), or of the folders named,
//!   longer than N lines (150); a NOTICE, or a failure with `--deny`.
//! - `headers [--deny]`: module headers that name what no code of the workspace spells.

mod docs;
mod source;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The longest function any crate of the workspace may have (tests excepted).
const MAX_FUNCTION_LINES: usize = 150;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

const USAGE: &str = "usage: cargo xtask docs [--check] | long-fns [--max N] [--in DIR]... [--deny] | headers [--deny]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let root = root();
    let result = match args.first().map(String::as_str) {
        Some("docs") => docs_task(&root, flag("--check")),
        Some("long-fns") => {
            let max = match args.iter().position(|a| a == "--max") {
                Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
                    Some(n) => n,
                    None => {
                        eprintln!("--max: expected a whole number of lines\n{USAGE}");
                        return ExitCode::from(2);
                    }
                },
                None => MAX_FUNCTION_LINES,
            };
            // `--in DIR` (repeatable) checks other folders instead (`--in benches`).
            let dirs: Vec<&str> = args
                .windows(2)
                .filter(|w| w[0] == "--in")
                .map(|w| w[1].as_str())
                .collect();
            let dirs = if dirs.is_empty() {
                source::LENGTH_CHECKED.to_vec()
            } else {
                dirs
            };
            long_fns_task(&root, &dirs, max, flag("--deny"))
        }
        Some("headers") => headers_task(&root, flag("--deny")),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn docs_task(root: &Path, check: bool) -> Result<(), String> {
    let untabled = source::untabled_names(root)?;
    if !untabled.is_empty() {
        return Err(untabled.join("\n"));
    }
    for line in docs::run(root, check)? {
        println!("{line}");
    }
    Ok(())
}

fn long_fns_task(root: &Path, dirs: &[&str], max: usize, deny: bool) -> Result<(), String> {
    let long = source::long_functions(root, dirs, max)?;
    if long.is_empty() {
        println!("no function over {max} lines in {}", dirs.join(", "));
        return Ok(());
    }
    let mut report = format!(
        "{} {} function(s) over {max} lines in {}:\n",
        if deny { "error:" } else { "NOTICE:" },
        long.len(),
        dirs.join(", ")
    );
    for l in &long {
        report.push_str(&format!(
            "  {}:{} {} ({} lines)\n",
            l.file, l.line, l.name, l.lines
        ));
    }
    if deny {
        Err(report)
    } else {
        print!("{report}");
        Ok(())
    }
}

fn headers_task(root: &Path, deny: bool) -> Result<(), String> {
    let stale = source::stale_headers(root)?;
    if stale.is_empty() {
        println!("every module header names only what the code has");
        return Ok(());
    }
    let report = format!(
        "{} module headers name what no code spells:\n  {}\n",
        if deny { "error:" } else { "NOTICE:" },
        stale.join("\n  ")
    );
    if deny {
        Err(report)
    } else {
        print!("{report}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in references are what their data gives (regenerate: `cargo xtask docs`).
    #[test]
    fn the_checked_in_docs_match_the_data() {
        if let Err(e) = docs::run(&root(), true) {
            panic!("{e}");
        }
    }

    /// Every name of the contract is in its module's table, so in the reference.
    #[test]
    fn every_name_of_the_contract_is_in_its_table() {
        let untabled = source::untabled_names(&root()).unwrap_or_else(|e| panic!("{e}"));
        assert!(untabled.is_empty(), "{}", untabled.join("\n"));
    }

    /// The names check sees a constant written outside the table (shown failing once).
    #[test]
    fn a_plain_metric_constant_is_reported() {
        let dir = std::env::temp_dir().join(format!("xtask-names-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("names/src")).unwrap();
        std::fs::write(
            dir.join("names/src/lib.rs"),
            "pub mod metric {\n    pub const UNIT_X: &str = \"x\";\n    pub const NEW: &str = \"phasetrace.new\";\n}\n",
        )
        .unwrap();
        let found = source::untabled_names(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("metric::NEW"), "{found:?}");
    }

    /// The length check measures from the signature to the closing brace and names the item.
    #[test]
    fn the_length_check_names_long_functions_and_skips_tests() {
        let dir = std::env::temp_dir().join(format!("xtask-len-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("src")).unwrap();
        let body = "    let _ = 1;\n".repeat(10);
        std::fs::write(
            dir.join("src/lib.rs"),
            format!(
                "/// doc\nfn short() {{}}\nstruct S;\nimpl S {{\n    fn long() {{\n{body}    }}\n}}\n#[test]\nfn a_test() {{\n{body}}}\n#[cfg(test)]\nmod tests;\n"
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("src/tests.rs"),
            format!("fn long_test_helper() {{\n{body}}}\n"),
        )
        .unwrap();
        let found = source::long_functions(&dir, &["src"], 5).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].name, "S::long");
        assert_eq!(found[0].lines, 12);
        assert_eq!(found[0].line, 5);
    }
}
