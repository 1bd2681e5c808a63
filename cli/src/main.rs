//! The `phasetrace` command: `demo` (the main job), `check` and `import`.

mod check;
mod demo;
mod flags;
mod import;
mod probe;
mod rendezvous;
mod requests;
mod terminal;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

const EXIT_CODES: &str = "Exit codes:
  0  success
  1  runtime failure (an exporter could not start, a file could not be read)
  2  bad command-line usage
  3  invalid configuration (an environment variable, flag or profile file)
  4  check failed: an endpoint is unreachable or a listen address is taken";

/// Turns GPU inference-engine timing into OpenTelemetry.
///
/// demo: the main job, a synthetic multi-rank decode run; check: configuration and endpoints;
/// import: banked profiler logs into the same telemetry.
#[derive(Debug, Parser)]
#[command(name = "phasetrace", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start and matched at once: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run a synthetic multi-rank GLM-style decode workload instrumented through the public API.
    #[command(after_help = EXIT_CODES)]
    Demo(demo::DemoArgs),
    /// Print the resolved configuration, validate it and probe the endpoints.
    #[command(after_help = EXIT_CODES)]
    Check(check::CheckArgs),
    /// Replay banked logs of the reference profilers (decode-profile tables, route traces,
    /// speculative phase lines) into OTLP, OTLP JSON or OpenMetrics, with their timestamps.
    #[command(after_help = EXIT_CODES)]
    Import(import::ImportArgs),
}

/// A failure with its exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn config(e: impl std::fmt::Display) -> Failure {
        Failure {
            code: 3,
            message: format!("invalid configuration: {e}"),
        }
    }

    pub(crate) fn runtime(e: impl std::fmt::Display) -> Failure {
        Failure {
            code: 1,
            message: e.to_string(),
        }
    }
}

impl From<phasetrace::Error> for Failure {
    fn from(e: phasetrace::Error) -> Failure {
        match e {
            phasetrace::Error::Config(c) => Failure::config(c),
            other => Failure::runtime(other),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Check(a) => check::run(a),
        Command::Import(a) => import::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // Errors quote input (a file's line, a peer's answer): escaped for the terminal.
            eprintln!("phasetrace: {}", terminal::escape_lines(&f.message));
            ExitCode::from(f.code)
        }
    }
}
