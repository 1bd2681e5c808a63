//! `phasetrace_names::env` (the telemetry contract that other crates read) and the settings
//! table (`phasetrace::config::settings::SETTINGS`, declared in `src/config/table.rs`) name the
//! same variables: every variable of the names crate is read by a setting (as its variable or
//! one of its fallbacks), and every variable a setting reads is named there. A setting is its
//! declaration plus its variable's name; this test fails while either is missing.

use crate::the_generated_references_match_the_checked_in_docs::{Item, parse_names};
use phasetrace::config::settings::SETTINGS;
use std::collections::BTreeSet;

/// The variables a constant's value names: a string, or an array of strings
/// (`["RANK", "LOCAL_RANK", ...]`).
fn variables(value: &str) -> Vec<String> {
    match value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
        Some(list) => list
            .split(',')
            .map(|v| v.trim().trim_matches('"').to_owned())
            .filter(|v| !v.is_empty())
            .collect(),
        None => vec![value.to_owned()],
    }
}

#[test]
fn the_names_crate_and_the_settings_table_list_the_same_variables() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/names/src/lib.rs");
    let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let items = parse_names(&source).unwrap_or_else(|e| panic!("{e}"));
    let named: BTreeSet<String> = items
        .iter()
        .find_map(|i| match i {
            Item::Module {
                name, constants, ..
            } if name == "env" => {
                Some(constants.iter().flat_map(|c| variables(&c.value)).collect())
            }
            _ => None,
        })
        .expect("names/src/lib.rs has `pub mod env`");
    // The reader saw the module: a variable, an array's member and the last constant.
    for var in [
        phasetrace_names::env::LEVEL,
        phasetrace_names::env::RANK_FALLBACKS[2],
        phasetrace_names::env::OTEL_METRICS_EXPORTER,
    ] {
        assert!(
            named.contains(var),
            "the reader of names/src/lib.rs missed {var}"
        );
    }

    let read: BTreeSet<String> = SETTINGS
        .iter()
        .flat_map(|s| std::iter::once(s.var()).chain(s.fallbacks().iter().copied()))
        .map(str::to_owned)
        .collect();
    let unread: Vec<&String> = named.difference(&read).collect();
    let unnamed: Vec<&String> = read.difference(&named).collect();
    assert!(
        unread.is_empty() && unnamed.is_empty(),
        "phasetrace_names::env names variables that no setting reads: {unread:?}; settings read \
         variables that phasetrace_names::env does not name: {unnamed:?} (a setting is its \
         declaration in src/config/table.rs plus its variable in names/src/lib.rs)"
    );
}
