//! `phasetrace check`: the resolved configuration, where each value came from, and whether the
//! endpoints answer. Header values are never printed.

use crate::Failure;
use crate::flags::ProfilerFlags;
use clap::Args;
use phasetrace::config::masked_headers;
use phasetrace::names::env;
use phasetrace::{Config, Origin, Profiler, Protocol};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
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
            cfg.resource_attributes
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
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

/// Host and port of an `http(s)://host:port/...` endpoint, with the scheme's default port.
fn host_port(endpoint: &str) -> Option<(String, u16)> {
    let (rest, default) = if let Some(r) = endpoint.strip_prefix("https://") {
        (r, 443)
    } else {
        (endpoint.strip_prefix("http://")?, 80)
    };
    let authority = rest.split('/').next()?;
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            Some((h.trim_matches(['[', ']']).to_owned(), p.parse().ok()?))
        }
        _ => Some((authority.to_owned(), default)),
    }
}

fn connect(endpoint: &str, timeout: Duration) -> Result<(TcpStream, SocketAddr), String> {
    let (host, port) =
        host_port(endpoint).ok_or_else(|| format!("{endpoint}: cannot parse host and port"))?;
    let addrs: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("{endpoint}: cannot resolve {host}: {e}"))?
        .collect();
    let mut last = String::from("no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok((s, a)),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(format!("{endpoint} is unreachable ({last})"))
}

/// An OTLP/HTTP probe: an empty protobuf export request must be answered 2xx.
fn probe_http(endpoint: &str, timeout: Duration) -> Result<String, String> {
    if endpoint.starts_with("https://") {
        let (_, a) = connect(endpoint, timeout)?;
        return Ok(format!(
            "TCP connect to {a} succeeded (TLS handshake not probed)"
        ));
    }
    let (mut s, a) = connect(endpoint, timeout)?;
    let (host, port) = host_port(endpoint).unwrap_or_default();
    let base = endpoint
        .strip_prefix("http://")
        .and_then(|r| r.split_once('/').map(|(_, p)| p))
        .unwrap_or("")
        .trim_end_matches('/');
    let path = if base.is_empty() {
        "/v1/metrics".to_owned()
    } else {
        format!("/{base}/v1/metrics")
    };
    let _ = s.set_read_timeout(Some(timeout));
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("{endpoint}: write failed: {e}"))?;
    let mut buf = Vec::new();
    let _ = s.take(4096).read_to_end(&mut buf);
    let head = String::from_utf8_lossy(&buf);
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status.starts_with('2') {
        Ok(format!("OTLP/HTTP POST {path} to {a} answered {status}"))
    } else if status.is_empty() {
        Err(format!("{endpoint}: no HTTP answer from {a}"))
    } else {
        Err(format!(
            "{endpoint}: POST {path} answered {status}: is this an OTLP/HTTP endpoint?"
        ))
    }
}

/// An OTLP/gRPC probe: the server must speak HTTP/2 (it answers our connection preface with a
/// SETTINGS frame).
fn probe_grpc(endpoint: &str, timeout: Duration) -> Result<String, String> {
    let (mut s, a) = connect(endpoint, timeout)?;
    if endpoint.starts_with("https://") {
        return Ok(format!(
            "TCP connect to {a} succeeded (TLS handshake not probed)"
        ));
    }
    let _ = s.set_read_timeout(Some(timeout));
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // empty SETTINGS frame
    s.write_all(&preface)
        .map_err(|e| format!("{endpoint}: write failed: {e}"))?;
    let mut head = [0u8; 9];
    match s.read_exact(&mut head) {
        Ok(()) if head[3] == 4 => Ok(format!("gRPC (HTTP/2) endpoint at {a} answered")),
        Ok(()) => Err(format!(
            "{endpoint}: {a} answered, but not with HTTP/2 SETTINGS: is this an OTLP/gRPC endpoint?"
        )),
        Err(e) => Err(format!("{endpoint}: no HTTP/2 answer from {a} ({e})")),
    }
}

pub(crate) fn run(a: CheckArgs) -> Result<(), Failure> {
    let builder = a.flags.apply(Profiler::builder());
    let cfg = builder.config().map_err(Failure::config)?;
    for w in &cfg.alias_warnings {
        eprintln!("{w}");
    }
    let mut out = String::from("phasetrace configuration\n");
    for (var, value) in rows(&cfg) {
        out += &format!("  {var:<42} {value:<32} ({})\n", origin(&cfg, var));
    }
    let timeout = Duration::from_millis(a.timeout_ms);
    let mut problems = Vec::new();
    out += "\nprobes\n";
    if let Some(o) = &cfg.otlp {
        let r = match o.protocol {
            Protocol::Grpc => probe_grpc(&o.endpoint, timeout),
            Protocol::HttpProtobuf => probe_http(&o.endpoint, timeout),
        };
        match r {
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

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn endpoints_split_into_host_and_port() {
        assert_eq!(
            host_port("http://127.0.0.1:4317"),
            Some(("127.0.0.1".into(), 4317))
        );
        assert_eq!(
            host_port("https://collector/otlp"),
            Some(("collector".into(), 443))
        );
        assert_eq!(host_port("http://[::1]:4318/"), Some(("::1".into(), 4318)));
    }
}
