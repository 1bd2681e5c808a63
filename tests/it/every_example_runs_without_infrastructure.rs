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
example!(tracing_parent, "../../examples/tracing_parent.rs");
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

#[test]
fn tracing_parent() {
    if child_runs("tracing_parent", tracing_parent::run_example) {
        return;
    }
    let (ok, out, err) = in_child("tracing_parent");
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("2 steps, 8 spans exported"), "{out}\n{err}");
    // Each step's parent is the request span it ran in.
    let span_id = |line: &str, key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(str::to_owned)
    };
    let requests: Vec<String> = err
        .lines()
        .filter(|l| l.starts_with("[phasetrace-span] request "))
        .filter_map(|l| span_id(l, "span="))
        .collect();
    let step_parents: Vec<String> = err
        .lines()
        .filter(|l| l.starts_with("[phasetrace-span] decode.step "))
        .filter_map(|l| span_id(l, "parent="))
        .collect();
    assert_eq!(requests.len(), 2, "{err}");
    assert_eq!(step_parents.len(), 2, "{err}");
    for p in &step_parents {
        assert!(requests.contains(p), "a step not under a request: {err}");
    }
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
