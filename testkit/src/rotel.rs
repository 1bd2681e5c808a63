//! A real OpenTelemetry collector (rotel's `rotel-agent`) that logs everything it receives.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::otlp_debug::{ParsedOutput, parse_output};
use super::process::{CapturedChild, free_port, locate_binary, poll, port_accepts, tools_dir};

/// How long [`Rotel::start`] waits for the OTLP ports to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running `rotel-agent` with OTLP/gRPC and OTLP/HTTP receivers on free loopback ports,
/// the blackhole exporter, and detailed debug logging of traces and metrics. Everything it
/// prints is captured; [`Rotel::parsed`] turns that into spans and metrics.
pub struct Rotel {
    bin: PathBuf,
    grpc_port: u16,
    http_port: u16,
    output: Arc<Mutex<String>>,
    child: Option<CapturedChild>,
    /// Arguments added to `rotel-agent start`.
    extra_args: Vec<String>,
}

/// The `rotel-agent` binary: `$PHASETRACE_ROTEL_BIN`, then `.tools/venv`, then `PATH`.
/// Panics when it is missing: tests guard with [`crate::require_tools!`] first.
pub fn rotel_binary() -> PathBuf {
    find_rotel().unwrap_or_else(|| panic!("rotel-agent not found: run scripts/test.sh"))
}

/// Where `rotel-agent` is installed, if it is.
pub(crate) fn find_rotel() -> Option<PathBuf> {
    let venv = tools_dir().join("venv");
    let mut candidates = vec![venv.join("bin").join("rotel-agent")];
    if let Ok(entries) = std::fs::read_dir(venv.join("lib")) {
        for entry in entries.flatten() {
            candidates.push(
                entry
                    .path()
                    .join("site-packages")
                    .join("rotel")
                    .join("rotel-agent"),
            );
        }
    }
    locate_binary("PHASETRACE_ROTEL_BIN", &candidates, "rotel-agent")
}

impl Rotel {
    /// Starts rotel on two free ports and waits until both accept connections.
    pub fn start() -> Rotel {
        Rotel::start_with_args(&[])
    }

    /// [`Rotel::start`] with more arguments to `rotel-agent start`
    /// (`--otlp-grpc-max-recv-msg-size-mib 2`).
    pub fn start_with_args(extra_args: &[&str]) -> Rotel {
        let bin = rotel_binary();
        let mut last_output = String::new();
        // A free port can be taken by someone else between the probe and rotel's bind:
        // retry with fresh ports when the process dies during startup.
        for _attempt in 0..3 {
            let mut rotel = Rotel {
                bin: bin.clone(),
                grpc_port: free_port(),
                http_port: free_port(),
                output: Arc::new(Mutex::new(String::new())),
                child: None,
                extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
            };
            if rotel.grpc_port == rotel.http_port {
                continue;
            }
            match rotel.spawn_and_wait() {
                Ok(()) => return rotel,
                Err(message) => last_output = message,
            }
        }
        panic!("rotel-agent did not start:\n{last_output}");
    }

    /// `http://127.0.0.1:PORT` of the OTLP/gRPC receiver.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// `http://127.0.0.1:PORT` of the OTLP/HTTP receiver (append `/v1/traces`, `/v1/metrics`).
    pub fn http_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    pub fn grpc_port(&self) -> u16 {
        self.grpc_port
    }

    pub fn http_port(&self) -> u16 {
        self.http_port
    }

    /// Everything rotel printed so far (stdout and stderr, whole lines), across restarts.
    pub fn output(&self) -> String {
        self.output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Forgets the output captured so far.
    pub fn clear_output(&self) {
        self.output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
    }

    /// The spans and metrics in [`Rotel::output`].
    pub fn parsed(&self) -> ParsedOutput {
        parse_output(&self.output())
    }

    /// Polls the parsed output every 100 ms until `done` holds, then returns it. Panics with
    /// the raw output after `timeout`.
    pub fn wait_for(
        &self,
        mut done: impl FnMut(&ParsedOutput) -> bool,
        timeout: Duration,
    ) -> ParsedOutput {
        let found = poll(timeout, || {
            let parsed = self.parsed();
            done(&parsed).then_some(parsed)
        });
        found.unwrap_or_else(|| {
            panic!(
                "rotel did not receive the expected data within {timeout:?}; its output:\n{}",
                self.output()
            )
        })
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.exited().is_none())
    }

    /// Kills rotel (SIGKILL). The ports are closed until [`Rotel::restart_same_ports`].
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            child.kill();
        }
    }

    /// Kills rotel if it runs, then starts it again on the same two ports and waits until
    /// they accept connections. The captured output is kept and appended to.
    pub fn restart_same_ports(&mut self) {
        self.kill();
        let mut last_error = String::new();
        // The old listening sockets are gone once the process is reaped, but retry a few
        // times in case the kernel is slow to release them.
        for _attempt in 0..5 {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(message) => {
                    last_error = message;
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        panic!("rotel-agent did not restart on the same ports:\n{last_error}");
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let mut command = Command::new(&self.bin);
        command
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .arg("start")
            .arg("--otlp-grpc-endpoint")
            .arg(format!("127.0.0.1:{}", self.grpc_port))
            .arg("--otlp-http-endpoint")
            .arg(format!("127.0.0.1:{}", self.http_port))
            .args(["--exporter", "blackhole"])
            .args(["--debug-log", "traces", "--debug-log", "metrics"])
            .args(["--debug-log-verbosity", "detailed"])
            .args(&self.extra_args);
        let mut child = CapturedChild::spawn(command, &self.output)
            .map_err(|e| format!("spawning {}: {e}", self.bin.display()))?;
        let (grpc, http) = (self.grpc_port, self.http_port);
        let mut exited = None;
        let ready = poll(START_TIMEOUT, || {
            if let Some(status) = child.exited() {
                exited = Some(status);
                return Some(false);
            }
            (port_accepts(grpc) && port_accepts(http)).then_some(true)
        });
        match ready {
            Some(true) => {
                self.child = Some(child);
                Ok(())
            }
            Some(false) => {
                child.kill();
                Err(format!(
                    "{} exited during startup ({:?}); output:\n{}",
                    self.bin.display(),
                    exited,
                    self.output()
                ))
            }
            None => {
                child.kill();
                Err(format!(
                    "{} did not accept connections on {grpc} and {http} within {START_TIMEOUT:?}; output:\n{}",
                    self.bin.display(),
                    self.output()
                ))
            }
        }
    }
}

impl Drop for Rotel {
    fn drop(&mut self) {
        self.kill();
    }
}
