//! `ProfilerBuilder::with_legacy_alias` reads a legacy variable (`METRALE_GLM_PROFILE`) as
//! `PHASETRACE_LEVEL`: either name alone is honored; when both are set the phasetrace name wins
//! and `build()` warns once on stderr; agreeing values are silent; a bad legacy value is an error
//! naming the legacy variable.
//!
//! The builder reads the process environment, so each case runs in a child process: this test
//! binary re-runs itself (`--exact` this test) with the case's variables, and the child prints
//! what it resolved and recorded on one `RESULT` line.

use std::process::Command;

use phasetrace::{Profiler, Section, SectionLevel, Site, SpecLevel};
use phasetrace_names::env;

const CHILD: &str = "PHASETRACE_TEST_ALIAS_CHILD";
/// This test's path in the test binary (module, then function), for `--exact`.
const TEST_NAME: &str = "legacy_alias_honors_both_names_and_the_phasetrace_name_wins::legacy_alias_honors_both_names_and_the_phasetrace_name_wins";
const ALIAS: &str = "METRALE_GLM_PROFILE";
const SPEC_ALIAS: &str = "METRALE_GLM_SPEC_PROFILE";
const WARNING: &str = "the phasetrace name wins; unset one to silence this";

/// In the child: build from the environment with the aliases, record one step with a compute
/// section and a probe section, and report the level and what was recorded.
fn child() {
    let built = Profiler::builder()
        .with_legacy_alias(env::LEVEL, ALIAS)
        .with_legacy_alias(env::SPEC_LEVEL, SPEC_ALIAS)
        .without_prometheus()
        .with_otlp_endpoint(None)
        .build();
    let profiler = match built {
        Ok(p) => p,
        Err(e) => {
            println!("RESULT error={e}");
            return;
        }
    };
    let rec = profiler.recorder();
    {
        let _step = rec.step();
        {
            let _compute = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
        }
        {
            let _probe = rec.section(Section::REDUCE_ATTN_BAR, 0u32, Site::ATTN);
        }
        let round = rec.round(2);
        round.phase(phasetrace::Phase::Draft);
        round.end(1);
    }
    drop(rec);
    profiler.flush();
    let stats = profiler.stats();
    let level = match profiler.config().level {
        SectionLevel::Off => "off",
        SectionLevel::Full => "full",
        SectionLevel::Collectives => "collectives",
    };
    let spec = match profiler.config().spec_level {
        SpecLevel::Off => "off",
        SpecLevel::Phases => "phases",
        SpecLevel::VerifySplit => "verify",
    };
    println!(
        "RESULT level={level} spec={spec} sections={} steps={} rounds={}",
        stats.sections, stats.steps, stats.rounds
    );
    profiler.shutdown();
}

struct Outcome {
    result: String,
    stderr: String,
}

/// Runs this test in a child process with exactly `vars` among the variables phasetrace reads.
fn run_child(vars: &[(&str, &str)]) -> Outcome {
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"]);
    for (key, _) in std::env::vars_os() {
        if let Some(key) = key.to_str()
            && (key.starts_with("PHASETRACE_")
                || key.starts_with("OTEL_")
                || key.starts_with("METRALE_")
                || ["RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK"].contains(&key))
        {
            cmd.env_remove(key);
        }
    }
    cmd.env(CHILD, "1");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running the child test");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "child {vars:?} failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    let result = stdout
        .lines()
        // The harness prints `test NAME ... ` before the child's own output, on the same line.
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("child {vars:?} printed no RESULT:\n{stdout}\n{stderr}"))
        .to_owned();
    Outcome { result, stderr }
}

#[test]
fn legacy_alias_honors_both_names_and_the_phasetrace_name_wins() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }

    // Nothing set: off, nothing recorded.
    let none = run_child(&[]);
    assert_eq!(
        none.result,
        "level=off spec=off sections=0 steps=0 rounds=0"
    );

    // The legacy name alone is honored: level 2 records only the probe section.
    let legacy = run_child(&[(ALIAS, "2")]);
    assert_eq!(
        legacy.result,
        "level=collectives spec=off sections=1 steps=1 rounds=0"
    );
    assert!(!legacy.stderr.contains(WARNING), "{}", legacy.stderr);

    // The phasetrace name alone.
    let general = run_child(&[(env::LEVEL, "1")]);
    assert_eq!(
        general.result,
        "level=full spec=off sections=2 steps=1 rounds=0"
    );
    assert!(!general.stderr.contains(WARNING), "{}", general.stderr);

    // Both, disagreeing: the phasetrace name wins, and build() says so once.
    let both = run_child(&[(ALIAS, "2"), (env::LEVEL, "1")]);
    assert_eq!(
        both.result,
        "level=full spec=off sections=2 steps=1 rounds=0"
    );
    let line = format!("phasetrace: PHASETRACE_LEVEL=1 overrides {ALIAS}=2 ({WARNING})");
    assert_eq!(
        both.stderr.matches(&line).count(),
        1,
        "expected {line:?} once in:\n{}",
        both.stderr
    );

    // The other way round: the phasetrace name still wins.
    let both = run_child(&[(ALIAS, "full"), (env::LEVEL, "off")]);
    assert_eq!(
        both.result,
        "level=off spec=off sections=0 steps=0 rounds=0"
    );
    assert!(
        both.stderr
            .contains(&format!("PHASETRACE_LEVEL=off overrides {ALIAS}=full")),
        "{}",
        both.stderr
    );

    // Both, agreeing in different spellings: silent.
    let agree = run_child(&[(ALIAS, "1"), (env::LEVEL, "full")]);
    assert_eq!(
        agree.result,
        "level=full spec=off sections=2 steps=1 rounds=0"
    );
    assert!(!agree.stderr.contains(WARNING), "{}", agree.stderr);

    // A speculative-level alias works the same way.
    let spec = run_child(&[(SPEC_ALIAS, "1")]);
    assert_eq!(
        spec.result,
        "level=off spec=phases sections=0 steps=0 rounds=1"
    );
    let spec_both = run_child(&[(SPEC_ALIAS, "1"), (env::SPEC_LEVEL, "2")]);
    assert!(
        spec_both.result.starts_with("level=off spec=verify "),
        "{}",
        spec_both.result
    );
    assert!(
        spec_both
            .stderr
            .contains(&format!("PHASETRACE_SPEC_LEVEL=2 overrides {SPEC_ALIAS}=1")),
        "{}",
        spec_both.stderr
    );

    // A bad legacy value is an error naming the legacy variable, value and what is accepted.
    let bad = run_child(&[(ALIAS, "yes")]);
    assert_eq!(
        bad.result,
        format!("error={ALIAS}=\"yes\": expected off, 0, full, 1, collectives or 2")
    );
    // ... even when the phasetrace name is set and would win.
    let bad = run_child(&[(ALIAS, "yes"), (env::LEVEL, "1")]);
    assert!(
        bad.result.starts_with(&format!("error={ALIAS}=\"yes\"")),
        "{}",
        bad.result
    );
}
