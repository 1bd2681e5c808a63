//! `phasetrace check`: the resolved configuration, where each value came from, and whether the
//! endpoints answer. Header values are never printed.

use crate::Failure;
use crate::flags::ProfilerFlags;
use clap::Args;
use phasetrace::config::masked_headers;
use phasetrace::names::env;
use phasetrace::{Config, Origin, Profiler};
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
    match cfg.origins.get(var) {
        Some(Origin::Code) => "flag",
        Some(o) => o.as_str(),
        None => Origin::Default.as_str(),
    }
}

fn rows(cfg: &Config) -> Vec<(&'static str, String)> {
    let otlp = cfg.otlp.as_ref();
    vec![
        (env::LEVEL, format!("{:?}", cfg.level).to_lowercase()),
        (
            env::SPEC_LEVEL,
            format!("{:?}", cfg.spec_level).to_lowercase(),
        ),
        (env::TRACE_EVERY, cfg.trace_every.to_string()),
        (
            env::LAYER_ATTR,
            if cfg.layer_attr { "on" } else { "off" }.into(),
        ),
        (env::SUMMARY_EVERY, cfg.summary_every.to_string()),
        (env::SPEC_SUMMARY_EVERY, cfg.spec_summary_every.to_string()),
        (
            env::PROMETHEUS,
            cfg.prometheus.map_or("off".into(), |a| a.to_string()),
        ),
        (env::QUEUE, cfg.queue.to_string()),
        (env::RANK, cfg.rank.to_string()),
        (
            env::EXPERT_COUNTER,
            if cfg.expert_counter { "on" } else { "off" }.into(),
        ),
        (env::TIMING, cfg.timing.as_str().into()),
        (env::OTEL_SDK_DISABLED, cfg.sdk_disabled.to_string()),
        (env::OTEL_SERVICE_NAME, cfg.service_name.clone()),
        (
            env::OTEL_RESOURCE_ATTRIBUTES,
            if cfg.resource_attributes.is_empty() {
                "(none)".into()
            } else {
                cfg.resource_attributes
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            },
        ),
        (
            env::OTEL_EXPORTER_OTLP_ENDPOINT,
            otlp.map_or("(none)".into(), |o| o.endpoint.clone()),
        ),
        (
            env::OTEL_EXPORTER_OTLP_PROTOCOL,
            otlp.map_or("-".into(), |o| o.protocol.as_str().into()),
        ),
        (
            env::OTEL_EXPORTER_OTLP_HEADERS,
            otlp.map_or("-".into(), |o| masked_headers(&o.headers)),
        ),
        (
            env::OTEL_EXPORTER_OTLP_TIMEOUT,
            otlp.map_or("-".into(), |o| format!("{}ms", o.timeout.as_millis())),
        ),
        (
            env::OTEL_EXPORTER_OTLP_COMPRESSION,
            otlp.map_or("-".into(), |o| if o.gzip { "gzip" } else { "none" }.into()),
        ),
        (
            env::OTEL_EXPORTER_OTLP_CERTIFICATE,
            otlp.and_then(|o| o.certificate.as_ref())
                .map_or("(system roots)".into(), |p| p.display().to_string()),
        ),
        (
            env::OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION,
            otlp.map_or("-".into(), |o| {
                match o.histogram {
                    phasetrace::config::HistogramAggregation::Explicit => {
                        "explicit_bucket_histogram"
                    }
                    phasetrace::config::HistogramAggregation::Exponential => {
                        "base2_exponential_bucket_histogram"
                    }
                }
                .into()
            }),
        ),
        (
            env::OTEL_METRIC_EXPORT_INTERVAL,
            format!("{}ms", cfg.metric_export_interval.as_millis()),
        ),
        (
            env::OTEL_TRACES_EXPORTER,
            if cfg.traces_otlp {
                "otlp"
            } else if cfg.traces_console {
                "console"
            } else {
                "none"
            }
            .into(),
        ),
        (env::OTEL_METRICS_EXPORTER, {
            let mut v = Vec::new();
            if cfg.metrics_otlp {
                v.push("otlp");
            }
            if cfg.prometheus.is_some() {
                v.push("prometheus");
            }
            if cfg.summary_every > 0 {
                v.push("console");
            }
            if v.is_empty() {
                v.push("none");
            }
            v.join(",")
        }),
    ]
}

/// Which source host-clock boundaries are read from, and why.
fn host_clock_lines(info: &phasetrace::timing::HostClockInfo) -> String {
    let mut out = format!(
        "\nhost clock\n  {:<57} {}\n  {:<57} {}\n",
        phasetrace::names::attr::HOST_CLOCK,
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
    let builder = a.flags.apply(Profiler::builder());
    let cfg = builder.config().map_err(Failure::config)?;
    for w in &cfg.alias_warnings {
        eprintln!("{w}");
    }
    let mut out = String::from("phasetrace configuration\n");
    for (var, value) in rows(&cfg) {
        out += &format!("  {var:<57} {value:<34} ({})\n", origin(&cfg, var));
    }
    out += &host_clock_lines(&phasetrace::timing::host_source());
    let timeout = Duration::from_millis(a.timeout_ms);
    let mut problems = Vec::new();
    out += "\nprobes\n";
    if let Some(o) = &cfg.otlp {
        match o.probe(timeout) {
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
        match TcpListener::bind(addr) {
            Ok(_) => {
                out += &format!("  ok    Prometheus: {addr} is free to listen on\n");
                if !addr.ip().is_loopback() {
                    out += "        note: not a loopback address: anyone who reaches it can read the engine's timings\n";
                }
            }
            Err(e) => {
                let m = format!(
                    "{}={addr}: cannot listen there ({e}); pick a free port or off",
                    env::PROMETHEUS
                );
                out += &format!("  FAIL  Prometheus: {m}\n");
                problems.push(m);
            }
        }
    } else {
        out += "  -     Prometheus: off\n";
    }
    print!("{out}");
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
