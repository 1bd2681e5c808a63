//! The OpenTelemetry Collector that `scripts/install-tools.sh` builds (tools/otelcol), running a
//! collector config of the repository (by default the bundled `otel-config/collector.yaml`,
//! unchanged) with its addresses set through the environment variables that file reads.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::{
    Peer, http_get, locate_binary, port_accepts, repo_root, start_on_free_ports, tools_dir,
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
    peer: Peer,
}

impl Otelcol {
    /// Runs the bundled `otel-config/collector.yaml`, sending traces to `jaeger_otlp_grpc`
    /// (`host:port` of an OTLP/gRPC receiver, e.g. [`crate::Jaeger::otlp_grpc_address`]).
    pub fn start(jaeger_otlp_grpc: &str) -> Otelcol {
        Otelcol::start_config(&bundled_collector_config(), jaeger_otlp_grpc)
    }

    /// Runs `config` (a file reading the same environment variables as the bundled one).
    pub fn start_config(config: &Path, jaeger_otlp_grpc: &str) -> Otelcol {
        let bin = otelcol_binary();
        let at = |port: u16| format!("127.0.0.1:{port}");
        let (ports, peer) = start_on_free_ports(
            "otelcol",
            START_TIMEOUT,
            |&[grpc, http, prometheus, health, metrics]: &[u16; 5]| {
                let mut command = Command::new(&bin);
                command
                    .arg(format!("--config={}", config.display()))
                    .env("OTELCOL_OTLP_GRPC_ENDPOINT", at(grpc))
                    .env("OTELCOL_OTLP_HTTP_ENDPOINT", at(http))
                    .env("OTELCOL_PROMETHEUS_ENDPOINT", at(prometheus))
                    .env("OTELCOL_HEALTH_ENDPOINT", at(health))
                    .env("OTELCOL_METRICS_HOST", "127.0.0.1")
                    .env("OTELCOL_METRICS_PORT", metrics.to_string())
                    .env("JAEGER_OTLP_ENDPOINT", jaeger_otlp_grpc);
                command
            },
            |&[grpc, _, _, health, _]| {
                matches!(http_get(&format!("http://{}/", at(health))), Ok((200, _)))
                    && port_accepts(grpc)
            },
        );
        let [grpc_port, http_port, prometheus_port, health_port, _] = ports;
        Otelcol {
            grpc_port,
            http_port,
            prometheus_port,
            health_port,
            peer,
        }
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
        self.peer.output()
    }
}
