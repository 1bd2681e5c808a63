//! A model's end-of-sequence token (a checkpoint's `eos_token_id`) ends a sequence where it is
//! generated, and changes nothing before it:
//! - serving, plain and speculative: each request's tokens are the tokens it gets without an
//!   end-of-sequence token, cut after the first one; requests end earlier, so more finish;
//! - one sequence: at the token the sequence starts over from the prompt (a new prefill), so
//!   plain decoding repeats the cut sequence exactly;
//! - a checkpoint's `generation_config.json` names the ids the loader reads.

use crate::support::{small_moe, temp_dir};
use phasetrace_candle::{
    Draft, ModelConfig, RunOptions, RunOutput, Spec, Workload, generate, weights,
};

const SHALLOW: Option<Spec> = Some(Spec {
    k: 3,
    draft: Draft::Shallow { layers: 2 },
});

fn run(eos: &[u32], spec: Option<Spec>, serving: bool, steps: usize) -> RunOutput {
    let cfg = small_moe();
    let tensors = weights::random(&cfg, 11).expect("random weights");
    let cfg = ModelConfig {
        eos: eos.to_vec(),
        ..cfg
    };
    let opts = RunOptions {
        spec,
        serving: serving.then(|| Workload {
            requests_per_step: 0.5,
            max_batch: 4,
            prompt_tokens: 6,
            output_tokens: 16,
            max_output_tokens: 24,
            seed: 3,
            ..Workload::default()
        }),
        ..RunOptions::new(cfg, tensors, steps, phasetrace_candle::prompt(5, 512, 9))
    };
    generate(&opts, None).expect("generating")
}

/// `tokens` cut after the first `eos`.
fn cut(tokens: &[u32], eos: u32) -> &[u32] {
    match tokens.iter().position(|&t| t == eos) {
        Some(i) => &tokens[..=i],
        None => tokens,
    }
}

/// A token that the run without an end-of-sequence token generates inside some sequences
/// (not as their first token), so that making it end-of-sequence cuts them.
fn a_token_inside(seqs: &[&[u32]]) -> u32 {
    let mut counts = std::collections::BTreeMap::<u32, usize>::new();
    for s in seqs {
        for &t in s.iter().skip(2).take(s.len().saturating_sub(3)) {
            if !s[..2].contains(&t) {
                *counts.entry(t).or_default() += 1;
            }
        }
    }
    counts
        .into_iter()
        .max_by_key(|&(t, n)| (n, std::cmp::Reverse(t)))
        .map(|(t, _)| t)
        .expect("the run generated tokens")
}

#[test]
fn serving_cuts_each_request_after_its_first_end_of_sequence_token() {
    for (name, spec) in [("plain", None), ("speculative", SHALLOW)] {
        let without = run(&[], spec, true, 80);
        let seqs: Vec<&[u32]> = without.requests.iter().map(|(_, t)| &t[..]).collect();
        // A token inside many requests, and the first token of a request admitted while
        // others decode (prefilled inside a speculative round, or a plain step).
        let inside = a_token_inside(&seqs);
        let first = without
            .requests
            .iter()
            .filter(|(id, t)| *id >= 3 && t.len() > 1)
            .map(|(_, t)| t[0])
            .next()
            .expect("a later request with tokens");
        for (which, eos) in [("inside", inside), ("first", first)] {
            let with = run(&[eos], spec, true, 80);
            served_cut(
                &format!("{name}, {which} token {eos}"),
                &without,
                &with,
                eos,
            );
            let (a, b) = (
                without.served.expect("served"),
                with.served.expect("served"),
            );
            assert!(
                b.finished > a.finished || (which == "first" && b.finished >= a.finished),
                "{name}, {which}: requests that end earlier make room for more: {a:?} then {b:?}"
            );
        }
    }
}

/// Each request of `with` has the tokens it has in `without`, cut after the first `eos`.
fn served_cut(name: &str, without: &RunOutput, with: &RunOutput, eos: u32) {
    let reference: std::collections::BTreeMap<_, _> = without.requests.iter().cloned().collect();
    let (mut compared, mut cut_short) = (0, 0);
    for (id, tokens) in &with.requests {
        assert!(
            !tokens[..tokens.len().saturating_sub(1)].contains(&eos),
            "{name}: request {id} went on after end-of-sequence {eos}: {tokens:?}"
        );
        let Some(r) = reference.get(id) else { continue };
        let expected = cut(r, eos);
        // Either run may have stopped a request early (the run's end cancels it).
        let n = tokens.len().min(expected.len());
        assert_eq!(tokens[..n], expected[..n], "{name}: request {id}");
        if tokens.last() == Some(&eos) {
            assert_eq!(
                &tokens[..],
                expected,
                "{name}: request {id} ends at its token"
            );
            cut_short += usize::from(expected.len() < r.len());
        }
        compared += 1;
    }
    assert!(
        compared >= 5 && cut_short >= 1,
        "{name}: {compared} compared, {cut_short} cut short"
    );
}

#[test]
fn one_sequence_starts_over_from_the_prompt_at_its_end_of_sequence_token() {
    let without = run(&[], None, false, 30);
    let eos = a_token_inside(&[&without.tokens]);
    let once = cut(&without.tokens, eos);
    assert!(
        once.len() < without.tokens.len(),
        "token {eos} cuts the sequence"
    );
    let with = run(&[eos], None, false, 30);
    let expected: Vec<u32> = once.iter().copied().cycle().take(30).collect();
    assert_eq!(
        with.tokens, expected,
        "plain decoding repeats the cut sequence"
    );
    // Speculative: every sequence is the cut one (the last perhaps unfinished).
    let spec = run(&[eos], SHALLOW, false, 30);
    let mut pieces = spec.tokens.split_inclusive(|&t| t == eos).peekable();
    let mut n = 0;
    while let Some(p) = pieces.next() {
        if pieces.peek().is_some() || p.last() == Some(&eos) {
            assert_eq!(p, once, "speculative sequence {n}");
        } else {
            assert_eq!(p, &once[..p.len()], "the unfinished last sequence");
        }
        n += 1;
    }
    assert!(
        n >= 2 && spec.rounds > 0,
        "{n} sequences, {} rounds",
        spec.rounds
    );
}

#[test]
fn a_checkpoint_reads_its_end_of_sequence_ids_from_generation_config() {
    let cfg = ModelConfig {
        eos: vec![5],
        ..small_moe()
    };
    let tensors = weights::random(&cfg, 1).expect("random weights");
    let dir = temp_dir("eos");
    weights::save_checkpoint(&dir, &cfg, &tensors).expect("writing the checkpoint");
    let (loaded, _) = weights::load_checkpoint(&dir).expect("reading it back");
    assert_eq!(loaded.eos, vec![5], "config.json's eos_token_id");
    let gen_path = dir.join("generation_config.json");
    std::fs::write(&gen_path, r#"{"eos_token_id": [6, 7], "do_sample": false}"#).expect("writing");
    let (loaded, _) = weights::load_checkpoint(&dir).expect("reading it back");
    assert_eq!(loaded.eos, vec![6, 7], "generation_config.json's wins");
    for (text, named) in [
        (r#"{"eos_token_id": 512}"#, "end-of-sequence token 512"),
        (r#"{"eos_token_id": "</s>"}"#, "eos_token_id \"</s>\""),
        (r#"{"eos_token_id": [6,"#, "not a generation config"),
    ] {
        std::fs::write(&gen_path, text).expect("writing");
        let e = weights::load_checkpoint(&dir).expect_err(text).to_string();
        assert!(
            e.contains(named) && e.contains("generation_config.json"),
            "{text}: {e}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
