//! `phasetrace check`: the resolved configuration, where each value came from, and whether the
//! endpoints answer. Header values are never printed.

use crate::Failure;
use crate::flags::ProfilerFlags;
use clap::Args;
use phasetrace::config::settings::SETTINGS;
use phasetrace::{Config, Origin, Profiler};
use phasetrace_names::env;
use std::net::TcpListener;
use std::time::Duration;

/// `phasetrace check` flags.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    flags: ProfilerFlags,
    /// How long to wait for an endpoint to answer, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
}

fn origin(cfg: &Config, var: &str) -> &'static str {
    match cfg.origin(var) {
        Origin::Code => "flag",
        o => o.as_str(),
    }
}

/// Which source host-clock boundaries are read from, and why.
fn host_clock_lines(info: &phasetrace::timing::HostClockInfo) -> String {
    let mut out = format!(
        "\nhost clock\n  {:<57} {}\n  {:<57} {}\n",
        phasetrace_names::attr::HOST_CLOCK,
        info.source,
        "why",
        info.reason
    );
    if let Some(hz) = info.tsc_hz {
        out += &format!(
            "  {:<57} {:.4} GHz against the monotonic clock, refreshed while running\n",
            "TSC rate",
            hz / 1e9
        );
    }
    out
}

pub(crate) fn run(a: CheckArgs) -> Result<(), Failure> {
    let builder = a
        .flags
        .apply(Profiler::builder())
        .map_err(Failure::config)?;
    let cfg = builder.config().map_err(Failure::config)?;
    // The Prometheus probe builds profilers of these settings.
    let settings = || {
        a.flags
            .apply(Profiler::builder())
            .map_err(|e| e.to_string())
    };
    for w in &cfg.alias_warnings {
        eprintln!("{}", crate::terminal::escape_lines(w));
    }
    let mut out = String::from("phasetrace configuration\n");
    for s in SETTINGS {
        let var = s.var();
        let value = s.shown(&cfg);
        out += &format!("  {var:<57} {value:<34} ({})\n", origin(&cfg, var));
    }
    let mut problems = Vec::new();
    // As a profiler built with this configuration would: the choice first, then what it gives.
    let chosen = phasetrace::timing::choose_host_source(cfg.host_clock);
    out += &host_clock_lines(&phasetrace::timing::host_source());
    if let Err(e) = chosen {
        out += &format!("  FAIL  {e}\n");
        problems.push(e.to_string());
    }
    let timeout = Duration::from_millis(a.timeout_ms);
    out += "\nprobes\n";
    if let Some(o) = &cfg.otlp {
        match crate::probe::otlp(o, timeout) {
            Ok(m) => out += &format!("  ok    OTLP {}: {m}\n", o.protocol.as_str()),
            Err(m) => {
                out += &format!("  FAIL  OTLP {}: {m}\n", o.protocol.as_str());
                problems.push(m);
            }
        }
    } else {
        out += "  -     OTLP: no endpoint configured (set OTEL_EXPORTER_OTLP_ENDPOINT)\n";
    }
    if let Some(addr) = cfg.prometheus {
        // The endpoint as configured (web config: TLS, client certificates, basic auth).
        match crate::probe::prometheus(&cfg, settings, timeout) {
            Ok(m) => {
                out += &format!("  ok    Prometheus: {m}\n");
                if !addr.ip().is_loopback() && cfg.prometheus_web_config.is_none() {
                    out += &format!(
                        "        note: not a loopback address, and no TLS or basic auth ({}): anyone who reaches it can read the engine's timings\n",
                        env::PROMETHEUS_WEB_CONFIG
                    );
                }
            }
            Err(probe) => match (TcpListener::bind(addr), cfg.origin(env::PROMETHEUS)) {
                // As the profiler does: the built-in default is skipped, never a failure.
                (Err(e), Origin::Default) => {
                    out += &format!(
                        "  warn  Prometheus: the default endpoint {addr} cannot listen there \
                         ({e}); the profiler runs without it: set {}=host:port (a free port) \
                         or off, or pass --prometheus\n",
                        env::PROMETHEUS
                    );
                }
                (bind, origin) => {
                    let m = match (bind, origin) {
                        (Err(e), Origin::Code) => format!(
                            "--prometheus {addr}: cannot listen there ({e}); pick a free port or off"
                        ),
                        _ => probe,
                    };
                    out += &format!("  FAIL  Prometheus: {m}\n");
                    problems.push(m);
                }
            },
        }
    } else {
        out += "  -     Prometheus: off\n";
    }
    // Values, paths and probe answers are input: escaped for the terminal.
    print!("{}", crate::terminal::escape_lines(&out));
    if problems.is_empty() {
        println!("\nall checks passed");
        Ok(())
    } else {
        Err(Failure {
            code: 4,
            message: format!("check failed: {}", problems.join("; ")),
        })
    }
}
