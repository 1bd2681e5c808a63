//! The candle engine's integration tests: one binary, one file per behaviour.

mod support;

mod a_checkpoint_written_and_loaded_back_gives_the_same_logits;
mod requests_are_served_under_continuous_batching;
mod sections_cover_each_step;
mod speculative_decoding_generates_what_greedy_decoding_generates;
mod telemetry_never_changes_the_tokens;
mod tensor_parallel_ranks_generate_what_one_rank_generates;
