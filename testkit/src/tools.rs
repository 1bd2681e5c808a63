//! The peer tools a test needs, and what happens when one is missing.
//!
//! `scripts/test.sh` installs rotel, Prometheus and promtool, Jaeger and the collector, and
//! runs every test. A plain
//! `cargo test` on a machine without them skips the tests that need them, each with a line
//! naming `scripts/test.sh`; under CI (`CI=true`, or `PHASETRACE_REQUIRE_TOOLS=1`, which
//! `scripts/test.sh` sets) a missing tool fails the test instead, so that CI cannot go green
//! without the tools.

use std::path::PathBuf;

/// A peer process the integration tests drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// The `rotel-agent` OTLP collector.
    Rotel,
    /// The `prometheus` server.
    Prometheus,
    /// `promtool` (rule tests, TSDB backfill).
    Promtool,
    /// Jaeger v2 (`jaeger`).
    Jaeger,
    /// The OpenTelemetry Collector built from tools/otelcol (`otelcol`).
    Otelcol,
}

impl Tool {
    /// The binary's name.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Rotel => "rotel-agent",
            Tool::Prometheus => "prometheus",
            Tool::Promtool => "promtool",
            Tool::Jaeger => "jaeger",
            Tool::Otelcol => "otelcol",
        }
    }

    /// Where the tool is installed, if it is.
    pub fn find(self) -> Option<PathBuf> {
        match self {
            Tool::Rotel => crate::rotel::find_rotel(),
            Tool::Prometheus => crate::prometheus::find_prometheus(),
            Tool::Promtool => crate::prometheus::find_promtool(),
            Tool::Jaeger => crate::jaeger::find_jaeger(),
            Tool::Otelcol => crate::otelcol::find_otelcol(),
        }
    }
}

/// What a test does about a tool: run, skip, or fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The tool is there.
    Run,
    /// Skip the test with this message.
    Skip(String),
    /// Fail the test with this message.
    Fail(String),
}

/// The verdict for `tool`, found or not, in CI or not.
pub fn verdict(tool: Tool, found: bool, required: bool) -> Verdict {
    match (found, required) {
        (true, _) => Verdict::Run,
        (false, false) => Verdict::Skip(format!(
            "skipped: {} not found; run scripts/test.sh",
            tool.name()
        )),
        (false, true) => Verdict::Fail(format!(
            "{} not found, and missing tools fail under CI=true or PHASETRACE_REQUIRE_TOOLS=1: \
             run scripts/test.sh, which installs them",
            tool.name()
        )),
    }
}

/// Whether a missing tool fails the test (`CI=true`, `PHASETRACE_REQUIRE_TOOLS=1`).
pub fn tools_required() -> bool {
    let set = |name: &str, yes: &[&str]| {
        std::env::var(name).is_ok_and(|v| yes.iter().any(|y| v.trim().eq_ignore_ascii_case(y)))
    };
    set("CI", &["true", "1"]) || set("PHASETRACE_REQUIRE_TOOLS", &["1", "true"])
}

/// Whether every tool in `tools` is installed: `false` (after printing why) means the test
/// should return now; under CI a missing tool panics instead. Use [`crate::require_tools!`].
pub fn available(tools: &[Tool]) -> bool {
    let required = tools_required();
    for &tool in tools {
        match verdict(tool, tool.find().is_some(), required) {
            Verdict::Run => {}
            Verdict::Skip(message) => {
                eprintln!("{message}");
                return false;
            }
            Verdict::Fail(message) => panic!("{message}"),
        }
    }
    true
}

/// Returns from the calling test when a tool it needs is missing (see [`tools`](self)):
/// `support::require_tools!(Rotel, Prometheus);`
#[macro_export]
macro_rules! require_tools {
    ($($tool:ident),+ $(,)?) => {
        if !$crate::tools::available(&[$($crate::tools::Tool::$tool),+]) {
            return;
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_skips_naming_the_script_and_fails_under_ci() {
        assert_eq!(verdict(Tool::Rotel, true, true), Verdict::Run);
        assert_eq!(
            verdict(Tool::Rotel, false, false),
            Verdict::Skip("skipped: rotel-agent not found; run scripts/test.sh".into())
        );
        let Verdict::Fail(message) = verdict(Tool::Promtool, false, true) else {
            panic!("a missing tool under CI must fail");
        };
        assert!(message.contains("promtool") && message.contains("scripts/test.sh"));
    }
}
