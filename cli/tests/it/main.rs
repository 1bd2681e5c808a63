//! The integration tests, one binary (one link, and `phasetrace-testkit` compiled once): each
//! module is named for the behaviour it shows.

mod cli;
use phasetrace_testkit as support;

mod a_96_layer_model_stays_within_the_series_budget;
mod a_periodic_straggler_slows_by_the_given_factor;
mod a_straggler_makes_the_other_ranks_wait;
mod bad_flags_and_env_values_exit_nonzero_naming_the_variable;
mod check_names_the_host_clock_source;
mod check_prints_each_setting_as_its_variable_reads_it;
mod check_probes_endpoints;
mod console_exporters_need_no_infrastructure;
mod imported_logs_reach_a_collector_and_backfill_into_prometheus;
mod the_demo_reaches_a_collector_and_prometheus;
mod the_demo_times_simulated_kernels_by_the_timing_setting;
mod the_straggler_alert_names_the_rank_its_group_waits_for;
