//! `phasetrace_names::env` (the telemetry contract that other crates read) and the settings
//! table (`phasetrace::config::settings::SETTINGS`, declared in `src/config/table.rs`) name the
//! same variables: every variable of the names crate (`env::ALL` and the rank fallbacks) is read
//! by a setting (as its variable or one of its fallbacks), and every variable a setting reads is
//! named there. A setting is its declaration plus its variable's name; this test fails while
//! either is missing.

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
         variables that phasetrace_names::env does not name: {unnamed:?} (a setting is its \
         declaration in src/config/table.rs plus its variable in names/src/lib.rs)"
    );
}
