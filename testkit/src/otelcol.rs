//! The OpenTelemetry Collector that `scripts/install-tools.sh` builds (tools/otelcol), running a
//! collector config of the repository (by default the bundled `otel-config/collector.yaml`,
//! unchanged) with its addresses set through the environment variables that file reads.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::process::{
    CapturedChild, free_port, http_get, locate_binary, port_accepts, repo_root, spawn_ready,
    tools_dir,
};

/// How long [`Otelcol::start`] waits for the health check to answer 200.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The collector binary: `$PHASETRACE_OTELCOL_BIN`, then `.tools/bin/otelcol`, then `PATH`.
/// Panics when it is missing: tests guard with [`crate::require_tools!`] first.
pub fn otelcol_binary() -> PathBuf {
    find_otelcol().unwrap_or_else(|| panic!("otelcol not found: run scripts/test.sh"))
}

pub(crate) fn find_otelcol() -> Option<PathBuf> {
    locate_binary(
        "PHASETRACE_OTELCOL_BIN",
        &[tools_dir().join("bin").join("otelcol")],
        "otelcol",
    )
}

/// The bundled collector configuration, the file docker-compose.yml mounts.
pub fn bundled_collector_config() -> PathBuf {
    repo_root().join("otel-config").join("collector.yaml")
}

/// A running collector on free loopback ports, killed on drop.
pub struct Otelcol {
    grpc_port: u16,
    http_port: u16,
    prometheus_port: u16,
    health_port: u16,
    output: Arc<Mutex<String>>,
    child: Option<CapturedChild>,
}

impl Otelcol {
    /// `otelcol validate --config CONFIG` with the given environment: `Ok(output)` when the
    /// collector accepts the file, `Err(output)` when it refuses it.
    pub fn validate(config: &Path, env: &[(&str, &str)]) -> Result<String, String> {
        let out = Command::new(otelcol_binary())
            .arg("validate")
            .arg(format!("--config={}", config.display()))
            .envs(env.iter().copied())
            .output()
            .unwrap_or_else(|e| panic!("running otelcol validate: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(text)
        }
    }

    /// Runs the bundled `otel-config/collector.yaml`, sending traces to `jaeger_otlp_grpc`
    /// (`host:port` of an OTLP/gRPC receiver, e.g. [`crate::Jaeger::otlp_grpc_address`]).
    pub fn start(jaeger_otlp_grpc: &str) -> Otelcol {
        Otelcol::start_config(&bundled_collector_config(), jaeger_otlp_grpc)
    }

    /// Runs `config` (a file reading the same environment variables as the bundled one).
    pub fn start_config(config: &Path, jaeger_otlp_grpc: &str) -> Otelcol {
        let bin = otelcol_binary();
        let mut last_error = String::new();
        for _attempt in 0..3 {
            let (grpc_port, http_port, prometheus_port, health_port, metrics_port) = (
                free_port(),
                free_port(),
                free_port(),
                free_port(),
                free_port(),
            );
            let mut command = Command::new(&bin);
            command
                .arg(format!("--config={}", config.display()))
                .env(
                    "OTELCOL_OTLP_GRPC_ENDPOINT",
                    format!("127.0.0.1:{grpc_port}"),
                )
                .env(
                    "OTELCOL_OTLP_HTTP_ENDPOINT",
                    format!("127.0.0.1:{http_port}"),
                )
                .env(
                    "OTELCOL_PROMETHEUS_ENDPOINT",
                    format!("127.0.0.1:{prometheus_port}"),
                )
                .env(
                    "OTELCOL_HEALTH_ENDPOINT",
                    format!("127.0.0.1:{health_port}"),
                )
                .env("OTELCOL_METRICS_HOST", "127.0.0.1")
                .env("OTELCOL_METRICS_PORT", metrics_port.to_string())
                .env("JAEGER_OTLP_ENDPOINT", jaeger_otlp_grpc);
            let health = format!("http://127.0.0.1:{health_port}/");
            let started = spawn_ready("otelcol", command, START_TIMEOUT, || {
                matches!(http_get(&health), Ok((200, _))) && port_accepts(grpc_port)
            });
            match started {
                Ok(ready) => {
                    return Otelcol {
                        grpc_port,
                        http_port,
                        prometheus_port,
                        health_port,
                        output: ready.output,
                        child: Some(ready.child),
                    };
                }
                Err(e) => last_error = e,
            }
        }
        panic!("{last_error}");
    }

    /// `http://127.0.0.1:PORT` of the OTLP/gRPC receiver (for `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// `http://127.0.0.1:PORT` of the OTLP/HTTP receiver.
    pub fn http_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// `127.0.0.1:PORT` of the `prometheus` exporter, the scrape target.
    pub fn prometheus_target(&self) -> String {
        format!("127.0.0.1:{}", self.prometheus_port)
    }

    pub fn health_port(&self) -> u16 {
        self.health_port
    }

    /// The collector's log so far.
    pub fn output(&self) -> String {
        self.output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl Drop for Otelcol {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            child.kill();
        }
    }
}
