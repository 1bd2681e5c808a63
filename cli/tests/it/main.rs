//! The integration tests, one binary (one link, and `phasetrace-testkit` compiled once): each
//! module is named for the behaviour it shows.

mod cli;
use phasetrace_testkit as support;

mod a_periodic_straggler_slows_by_the_given_factor;
mod a_straggler_makes_the_other_ranks_wait;
mod bad_flags_and_env_values_exit_nonzero_naming_the_variable;
mod check_probes_endpoints;
mod console_exporters_need_no_infrastructure;
mod exemplars_link_slow_steps_in_prometheus_to_their_traces;
mod imported_logs_reach_a_collector_and_backfill_into_prometheus;
mod the_demo_reaches_a_collector_and_prometheus;
mod the_demo_times_simulated_kernels_by_the_timing_setting;
mod the_tail_budget_caps_slow_traces_a_second_and_counts_the_rest;
mod with_one_in_n_off_only_the_slow_steps_are_traced;
