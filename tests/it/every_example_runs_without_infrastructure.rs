//! Every program in `examples/` runs to a clean exit on a machine with no collector, no
//! Prometheus and no GPU: each is compiled into this binary as it is written and run in a child
//! process (this binary again, `--exact` the case) with a clean environment. The CUDA example,
//! without a driver, exits with status 1 and a message naming what is missing, never a panic.

use std::process::Command;

macro_rules! example {
    ($module:ident, $path:literal) => {
        mod $module {
            include!($path);

            pub(super) fn run_example() -> std::process::ExitCode {
                std::process::Termination::report(main())
            }
        }
    };
}

example!(hot_experts, "../../examples/hot_experts.rs");
example!(ranks_as_threads, "../../examples/ranks_as_threads.rs");
example!(speculative, "../../examples/speculative.rs");
#[cfg(feature = "tracing")]
example!(own_providers, "../../examples/own_providers.rs");
#[cfg(feature = "cuda")]
example!(cuda_stream, "../../examples/cuda_stream.rs");

const CHILD: &str = "PHASETRACE_TEST_EXAMPLE_CHILD";

/// Runs `name`'s case of this module in a child: (exit status success, stdout, stderr).
fn in_child(name: &str) -> (bool, String, String) {
    let test = format!("every_example_runs_without_infrastructure::{name}");
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"]);
    for (key, _) in std::env::vars_os() {
        if let Some(key) = key.to_str()
            && (key.starts_with("PHASETRACE_") || key.starts_with("OTEL_"))
        {
            cmd.env_remove(key);
        }
    }
    cmd.env(CHILD, name);
    let out = cmd.output().expect("running the child test");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn child_runs(name: &str, run: fn() -> std::process::ExitCode) -> bool {
    if std::env::var(CHILD).as_deref() == Ok(name) {
        assert_eq!(
            run(),
            std::process::ExitCode::SUCCESS,
            "the {name} example failed"
        );
        return true;
    }
    false
}

#[test]
fn hot_experts() {
    if child_runs("hot_experts", hot_experts::run_example) {
        return;
    }
    let (ok, out, err) = in_child("hot_experts");
    assert!(ok, "{out}\n{err}");
    // Every routed id is in the snapshot: 640 tokens x top-8 x 60 layers.
    assert!(
        out.contains("60 (rank, layer) rows, 307200 tokens routed"),
        "{out}\n{err}"
    );
    // Expert 5 gets two of every token's eight slots in every layer: it is the hottest.
    let hot: Vec<&str> = out.lines().filter(|l| l.starts_with("hot: ")).collect();
    assert_eq!(hot.len(), 5, "{out}");
    assert!(hot.iter().all(|l| l.contains(" expert 5: ")), "{out}");
    assert!(
        out.contains("since the snapshot at step 10: 153600 tokens routed"),
        "{out}\n{err}"
    );
}

#[test]
fn ranks_as_threads() {
    if child_runs("ranks_as_threads", ranks_as_threads::run_example) {
        return;
    }
    let (ok, out, err) = in_child("ranks_as_threads");
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("40 steps, 1280 sections on 2 ranks"),
        "{out}\n{err}"
    );
}

#[test]
fn speculative() {
    if child_runs("speculative", speculative::run_example) {
        return;
    }
    let (ok, out, err) = in_child("speculative");
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("30 rounds recorded"), "{out}\n{err}");
    assert!(
        err.contains("[phasetrace-spec-v] rounds=10 k=4"),
        "{out}\n{err}"
    );
}

#[cfg(feature = "tracing")]
#[test]
fn own_providers() {
    if child_runs("own_providers", own_providers::run_example) {
        return;
    }
    let (ok, out, err) = in_child("own_providers");
    assert!(ok, "{out}\n{err}");
    // phasetrace's instruments on the engine's provider, under its own scope and version.
    let scope = format!("scope phasetrace {}: ", env!("CARGO_PKG_VERSION"));
    let line = out
        .lines()
        .find(|l| l.contains(&scope))
        .unwrap_or_else(|| panic!("no phasetrace scope: {out}\n{err}"));
    for name in ["phasetrace.step.duration", "phasetrace.section.duration"] {
        assert!(line.contains(name), "{out}");
    }
    // The engine's counter was exported after phasetrace shut down.
    assert!(out.contains("scope engine : engine.requests"), "{out}");
    // Two sampled steps, each under its request span, on the engine's tracer provider.
    let steps: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("-> decode.step"))
        .collect();
    assert_eq!(steps.len(), 2, "{out}");
    assert!(
        steps.iter().all(|l| l.ends_with("(scope phasetrace)")),
        "{out}"
    );
    // No view warning: the engine registered phasetrace::view().
    assert!(!err.contains("phasetrace::view()"), "{err}");
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_stream() {
    if std::env::var(CHILD).as_deref() == Ok("cuda_stream") {
        // Success with a GPU; without one, failure, which the parent checks.
        std::process::exit(
            if cuda_stream::run_example() == std::process::ExitCode::SUCCESS {
                0
            } else {
                1
            },
        );
    }
    let (ok, out, err) = in_child("cuda_stream");
    assert!(!err.contains("panicked"), "{out}\n{err}");
    if phasetrace::timing::cuda::probe().is_ok() {
        assert!(ok, "{out}\n{err}");
        assert!(out.contains("sections timed on the device"), "{out}\n{err}");
    } else {
        assert!(!ok, "{out}\n{err}");
        assert!(
            err.contains("cuda_stream: CUDA is unavailable"),
            "{out}\n{err}"
        );
    }
}
