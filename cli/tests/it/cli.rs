//! Running the `phasetrace` binary from the integration tests (`mod cli;`): a clean
//! environment, captured stdout and stderr, a timeout, and helpers for long-running demos.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The variables phasetrace reads: removed from every child so the developer's or CI's
/// environment cannot change what a test sees.
const READ_PREFIXES: [&str; 2] = ["PHASETRACE_", "OTEL_"];
const READ_EXACT: [&str; 4] = ["RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "RUST_LOG"];

/// The binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_phasetrace")
}

/// `phasetrace` with every variable phasetrace reads removed from its environment.
pub fn command() -> Command {
    clean(Command::new(binary()))
}

/// `PREFIX... phasetrace` (a launcher such as `ip netns exec NS`), the environment cleaned as
/// for [`command`].
pub fn wrapped(prefix: &[&str]) -> Command {
    let mut cmd = Command::new(prefix[0]);
    cmd.args(&prefix[1..]).arg(binary());
    clean(cmd)
}

fn clean(mut cmd: Command) -> Command {
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if READ_PREFIXES.iter().any(|p| key.starts_with(p)) || READ_EXACT.contains(&key) {
            cmd.env_remove(key);
        }
    }
    cmd.env("NO_COLOR", "1");
    cmd
}

/// What a finished run printed, and its exit code (`None` when killed by a signal).
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// stdout and stderr, for messages and for "never printed" assertions.
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit code {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn reader(stream: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(mut s) = stream {
            let _ = s.read_to_end(&mut text);
        }
        String::from_utf8_lossy(&text).into_owned()
    })
}

/// Runs `cmd` to completion with stdout and stderr captured; kills it and panics after
/// `timeout`.
pub fn run(mut cmd: Command, timeout: Duration) -> Finished {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child: Child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let out = reader(child.stdout.take());
    let err = reader(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for phasetrace") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let finished = Finished {
        code: status.and_then(|s| s.code()),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    };
    assert!(
        status.is_some(),
        "{cmd:?} did not finish within {timeout:?}; {finished}"
    );
    finished
}

/// `phasetrace ARGS...` with `envs` set on top of the clean environment.
pub fn phasetrace(args: &[&str], envs: &[(&str, &str)], timeout: Duration) -> Finished {
    let mut cmd = command();
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    run(cmd, timeout)
}

/// Sends SIGINT to a child this test started (the demo stops lingering and exits cleanly).
pub fn interrupt(pid: u32) {
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("running kill -INT");
    assert!(status.success(), "kill -INT {pid} failed: {status}");
}

/// Sends SIGTERM to a child this test started (as a service manager stopping it).
pub fn terminate(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("running kill -TERM");
    assert!(status.success(), "kill -TERM {pid} failed: {status}");
}

/// A `phasetrace demo` running in the background, its stdout and stderr collected line by line.
pub struct Demo {
    child: Option<Child>,
    output: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Demo {
    /// Starts `phasetrace demo ARGS...` with `envs` on top of the clean environment.
    pub fn spawn(args: &[&str], envs: &[(&str, &str)]) -> Demo {
        let mut cmd = command();
        cmd.arg("demo").args(args);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Demo::spawn_command(cmd)
    }

    /// Starts a prepared command (from [`wrapped`]) whose output is collected like the demo's.
    pub fn spawn_command(mut cmd: Command) -> Demo {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        let output = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let pump = |stream: Box<dyn Read + Send>, output: Arc<Mutex<String>>| {
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    let mut out = output.lock().unwrap_or_else(|p| p.into_inner());
                    out.push_str(&line);
                    out.push('\n');
                }
            })
        };
        if let Some(s) = child.stdout.take() {
            readers.push(pump(Box::new(s), output.clone()));
        }
        if let Some(s) = child.stderr.take() {
            readers.push(pump(Box::new(s), output.clone()));
        }
        Demo {
            child: Some(child),
            output,
            readers,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Everything printed so far.
    pub fn output(&self) -> String {
        self.output
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until a printed line satisfies `find`, and returns what it extracted. Panics with
    /// the output after `timeout`, or when the demo exits first.
    pub fn wait_for_line<T>(
        &mut self,
        mut find: impl FnMut(&str) -> Option<T>,
        timeout: Duration,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.output().lines().find_map(&mut find) {
                return found;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                // Let the readers catch up with the last lines before giving up.
                std::thread::sleep(Duration::from_millis(100));
                if let Some(found) = self.output().lines().find_map(&mut find) {
                    return found;
                }
                panic!(
                    "the demo exited ({status}) before the expected line; output:\n{}",
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the expected line did not appear within {timeout:?}; output:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The address of the embedded Prometheus endpoint the demo announced (`127.0.0.1:PORT`).
    pub fn prometheus_addr(&mut self, timeout: Duration) -> String {
        self.wait_for_line(
            |l| {
                l.strip_prefix("phasetrace: Prometheus metrics at ")
                    .and_then(|r| r.strip_prefix("http://").or(r.strip_prefix("https://")))
                    .and_then(|r| r.strip_suffix("/metrics"))
                    .map(str::to_owned)
            },
            timeout,
        )
    }

    /// Waits for the end-of-run line (`demo: N steps, ...`) and returns it.
    pub fn wait_for_run_end(&mut self, timeout: Duration) -> String {
        self.wait_for_line(|l| l.starts_with("demo: ").then(|| l.to_owned()), timeout)
    }

    /// Waits for the demo to exit; panics (after killing it) past `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("the demo was already waited for");
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for the demo") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                panic!(
                    "the demo did not exit within {timeout:?}; output:\n{}",
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        status
    }

    /// Kills the demo at once (SIGKILL), as a crash or the OOM killer would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the demo has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Asks the demo to stop with SIGTERM and waits for it to exit.
    pub fn terminate_and_wait(&mut self, timeout: Duration) -> ExitStatus {
        terminate(self.pid());
        self.wait(timeout)
    }

    /// Asks the demo to stop (SIGINT, as Ctrl-C) and waits for it to exit.
    pub fn interrupt_and_wait(&mut self, timeout: Duration) -> ExitStatus {
        interrupt(self.pid());
        self.wait(timeout)
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One sample of the Prometheus text exposition: name, labels, value.
pub type Sample = (String, Vec<(String, String)>, f64);

/// Parses the Prometheus text exposition into samples.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(parts) => parts,
            None => continue,
        };
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or(f64::NAN),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let mut pairs = Vec::new();
        let mut rest = labels;
        while let Some((key, after)) = rest.split_once("=\"") {
            let mut value = String::new();
            let mut chars = after.char_indices();
            let mut end = after.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(match n {
                                'n' => '\n',
                                other => other,
                            });
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    other => value.push(other),
                }
            }
            pairs.push((key.trim_start_matches(',').trim().to_string(), value));
            rest = &after[end..];
        }
        out.push((name.to_string(), pairs, value));
    }
    out
}

/// The sum of the values of samples called `name` whose labels include all of `labels`.
pub fn sum_samples(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v)| v)
        .sum()
}
