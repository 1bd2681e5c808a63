//! `phasetrace_names::env` (the telemetry contract that other crates read) and the settings
//! table (`phasetrace::config::settings::SETTINGS`, declared in `src/config/table.rs`) name the
//! same variables: every variable of the names crate (`env::ALL` and the rank fallbacks) is read
//! by a setting (as its variable or one of its fallbacks), and every variable a setting reads is
//! named there. `names/src/env.rs` is generated from the table by `cargo xtask docs`: this test
//! fails while that file is stale (as `cargo xtask docs --check` does).

use phasetrace::config::settings::SETTINGS;
use phasetrace_names::env;
use std::collections::BTreeSet;

#[test]
fn the_names_crate_and_the_settings_table_list_the_same_variables() {
    let named: BTreeSet<&str> = env::ALL
        .iter()
        .map(|n| n.value)
        .chain(env::RANK_FALLBACKS)
        .collect();
    let read: BTreeSet<&str> = SETTINGS
        .iter()
        .flat_map(|s| std::iter::once(s.var()).chain(s.fallbacks().iter().copied()))
        .collect();
    let unread: Vec<&&str> = named.difference(&read).collect();
    let unnamed: Vec<&&str> = read.difference(&named).collect();
    assert!(
        unread.is_empty() && unnamed.is_empty(),
        "phasetrace_names::env names variables that no setting reads: {unread:?}; settings read \
         variables that phasetrace_names::env does not name: {unnamed:?} (names/src/env.rs is \
         generated from src/config/table.rs: run cargo xtask docs)"
    );
}
