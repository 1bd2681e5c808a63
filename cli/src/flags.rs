//! Flags that mirror the environment variables; a flag beats its variable.

use clap::Args;
use phasetrace::{Level, ProfilerBuilder, Protocol, SpecLevel};

/// The profiler settings every command accepts.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct ProfilerFlags {
    /// Which sections are recorded: off, full (1) or collectives (2) [env: PHASETRACE_LEVEL]
    #[arg(long, value_parser = parse_level)]
    pub(crate) level: Option<Level>,
    /// Speculative detail: off, 1 (phases) or 2 (with verify sub-split) [env: PHASETRACE_SPEC_LEVEL]
    #[arg(long, value_parser = parse_spec_level)]
    pub(crate) spec_level: Option<SpecLevel>,
    /// Trace one step in N; 0 = no spans [env: PHASETRACE_TRACE_EVERY]
    #[arg(long)]
    pub(crate) trace_every: Option<u64>,
    /// Console summary every N steps; 0 = off [env: PHASETRACE_SUMMARY_EVERY]
    #[arg(long)]
    pub(crate) summary_every: Option<u64>,
    /// Prometheus listen address (host:port) or off [env: PHASETRACE_PROMETHEUS]
    #[arg(long)]
    pub(crate) prometheus: Option<String>,
    /// The Prometheus endpoint's web configuration file (TLS, basic auth; the exporter-toolkit
    /// format) [env: PHASETRACE_PROMETHEUS_WEB_CONFIG]
    #[arg(long)]
    pub(crate) prometheus_web_config: Option<std::path::PathBuf>,
    /// OTLP endpoint, http(s)://host:port [env: OTEL_EXPORTER_OTLP_ENDPOINT]
    #[arg(long)]
    pub(crate) otlp_endpoint: Option<String>,
    /// OTLP protocol: grpc or http/protobuf [env: OTEL_EXPORTER_OTLP_PROTOCOL]
    #[arg(long, value_parser = parse_protocol)]
    pub(crate) otlp_protocol: Option<Protocol>,
    /// Resource service.name [env: OTEL_SERVICE_NAME]
    #[arg(long)]
    pub(crate) service_name: Option<String>,
    /// Per-recorder buffer size in records [env: PHASETRACE_QUEUE]
    #[arg(long)]
    pub(crate) queue: Option<usize>,
    /// Per-(layer, expert) token counter: on or off [env: PHASETRACE_EXPERT_COUNTER]
    #[arg(long, value_parser = parse_onoff)]
    pub(crate) expert_counter: Option<bool>,
}

fn parse_level(s: &str) -> Result<Level, String> {
    match s {
        "off" | "0" => Ok(Level::Off),
        "full" | "1" => Ok(Level::Full),
        "collectives" | "2" => Ok(Level::Collectives),
        _ => Err("expected off, 0, full, 1, collectives or 2".into()),
    }
}

fn parse_spec_level(s: &str) -> Result<SpecLevel, String> {
    match s {
        "off" | "0" => Ok(SpecLevel::Off),
        "1" | "phases" => Ok(SpecLevel::Phases),
        "2" | "verify" => Ok(SpecLevel::VerifySplit),
        _ => Err("expected off, 0, 1 or 2".into()),
    }
}

fn parse_protocol(s: &str) -> Result<Protocol, String> {
    match s {
        "grpc" => Ok(Protocol::Grpc),
        "http/protobuf" => Ok(Protocol::HttpProtobuf),
        _ => Err("expected grpc or http/protobuf".into()),
    }
}

fn parse_onoff(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err("expected on or off".into()),
    }
}

impl ProfilerFlags {
    /// Applies the flags given on top of the builder (flags beat the environment).
    pub(crate) fn apply(&self, mut b: ProfilerBuilder) -> ProfilerBuilder {
        if let Some(l) = self.level {
            b = b.with_level(l);
        }
        if let Some(l) = self.spec_level {
            b = b.with_spec_level(l);
        }
        if let Some(n) = self.trace_every {
            b = b.with_trace_every(n);
        }
        if let Some(n) = self.summary_every {
            b = b.with_summary_every(n);
        }
        if let Some(p) = &self.prometheus {
            b = b.with_prometheus((!p.eq_ignore_ascii_case("off")).then_some(p.as_str()));
        }
        if let Some(w) = &self.prometheus_web_config {
            b = b.with_prometheus_web_config(w.clone());
        }
        if let Some(e) = &self.otlp_endpoint {
            b = b.with_otlp_endpoint(Some(e));
        }
        if let Some(p) = self.otlp_protocol {
            b = b.with_otlp_protocol(p);
        }
        if let Some(s) = &self.service_name {
            b = b.with_service_name(s.clone());
        }
        if let Some(q) = self.queue {
            b = b.with_queue(q);
        }
        if let Some(e) = self.expert_counter {
            b = b.with_expert_counter(e);
        }
        b
    }
}
