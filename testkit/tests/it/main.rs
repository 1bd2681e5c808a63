//! The harness's self-tests, one binary: each module drives a real peer process and checks that
//! the harness reads back what was sent.

use phasetrace_testkit as support;

mod prometheus_harness_scrapes_a_target;
mod rotel_harness_parses_what_the_sdk_sends;
mod the_otlp_receiver_decodes_what_the_sdk_sends;
mod the_otlp_receiver_decodes_what_the_sdk_sends_over_grpc;
