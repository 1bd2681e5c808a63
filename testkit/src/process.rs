//! Spawning peer processes with their output captured, and small network helpers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it for a bind to port 0).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("binding 127.0.0.1:0 to find a free port")
}

/// The repository root (the workspace's Cargo.toml; this crate sits in `testkit/` below it).
pub fn repo_root() -> PathBuf {
    let testkit = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    testkit.parent().map(Path::to_path_buf).unwrap_or(testkit)
}

/// The folder `scripts/install-tools.sh` installs into.
pub fn tools_dir() -> PathBuf {
    repo_root().join(".tools")
}

/// Finds a tool binary: the environment variable `env_var` (written to `.tools/env` by
/// `scripts/install-tools.sh`), then the given candidates, then `PATH`.
pub fn locate_binary(env_var: &str, candidates: &[PathBuf], name_on_path: &str) -> Option<PathBuf> {
    if let Some(value) = std::env::var_os(env_var).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        if path.is_file() {
            return Some(path);
        }
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Some(found.clone());
    }
    let path_var = std::env::var_os("PATH")?;
    std::env::split_paths(&path_var)
        .map(|dir| dir.join(name_on_path))
        .find(|p| p.is_file())
}

/// True when something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_accepts(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// A fresh, empty directory under the system temp dir, removed by [`TempDir::drop`].
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating temp dir {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A child process whose stdout and stderr are appended, line by line, to a shared buffer.
pub struct CapturedChild {
    child: Child,
    readers: Vec<JoinHandle<()>>,
}

impl CapturedChild {
    /// Spawns `command` with piped stdout/stderr; both streams are appended to `output` in
    /// whole lines (see `pump_lines`), so they never interleave mid-line.
    pub fn spawn(mut command: Command, output: &Arc<Mutex<String>>) -> std::io::Result<Self> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn()?;
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            readers.push(pump_lines(stdout, Arc::clone(output)));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(pump_lines(stderr, Arc::clone(output)));
        }
        Ok(CapturedChild { child, readers })
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process (SIGKILL), reaps it and waits until its output has been read.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

/// Appends what `stream` yields to `output`, whole lines only and each read's lines under one
/// lock, so a block the process wrote at once (rotel prints each export with one `write`)
/// becomes visible at once. A read that filled the buffer is held back until the pipe is
/// drained, so blocks larger than the pipe are not seen half-written either.
fn pump_lines<R: Read + Send + 'static>(
    mut stream: R,
    output: Arc<Mutex<String>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        const CHUNK: usize = 64 * 1024;
        let mut buffer = vec![0_u8; CHUNK];
        let mut pending: Vec<u8> = Vec::new();
        let commit = |bytes: &[u8]| {
            output
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push_str(&String::from_utf8_lossy(bytes));
        };
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    pending.extend_from_slice(&buffer[..n]);
                    if n == CHUNK && pending.len() < 256 * CHUNK {
                        continue;
                    }
                    if let Some(last_newline) = pending.iter().rposition(|b| *b == b'\n') {
                        commit(&pending[..=last_newline]);
                        pending.drain(..=last_newline);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        if !pending.is_empty() {
            pending.push(b'\n');
            commit(&pending);
        }
    })
}

/// Polls `check` every 50 ms until it returns `Some`, or `None` after `timeout`.
pub fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// `GET url` over plain HTTP/1.1 (`Connection: close`). Returns the status code and body.
pub fn http_get(url: &str) -> Result<(u16, String), String> {
    http_request("GET", url, &[], &[])
}

/// One plain-HTTP/1.1 request with `Connection: close`. `url` is `http://host:port/path?query`.
/// Handles `Content-Length`, chunked and read-to-close bodies; does not follow redirects.
pub fn http_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, String), String> {
    let (status, body) = http_request_bytes(method, url, headers, body)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// [`http_request`] with the body as it came (a protobuf scrape, say).
pub fn http_request_bytes(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, Vec<u8>), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("only http:// URLs are supported: {url}"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("resolving {authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("no address for {authority}"))?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connecting to {authority}: {e}"))?;
    let io_timeout = Some(Duration::from_secs(30));
    stream
        .set_read_timeout(io_timeout)
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(io_timeout)
        .map_err(|e| e.to_string())?;

    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nUser-Agent: phasetrace-tests\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .and_then(|()| stream.write_all(body))
        .map_err(|e| format!("sending request to {authority}: {e}"))?;

    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("reading response from {authority}: {e}"))?;
    parse_http_response_bytes(&raw)
}

pub fn parse_http_response(raw: &[u8]) -> Result<(u16, String), String> {
    let (status, body) = parse_http_response_bytes(raw)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// [`parse_http_response`] with the body as it came.
pub fn parse_http_response_bytes(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| "response without a complete header".to_string())?;
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line: {status_line:?}"))?;
    let mut chunked = false;
    let mut content_length = None;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().contains("chunked")
            {
                chunked = true;
            } else if name.eq_ignore_ascii_case("content-length") {
                content_length = value.parse::<usize>().ok();
            }
        }
    }
    let payload = &raw[head_end + 4..];
    let body = if chunked {
        decode_chunked(payload)?
    } else if let Some(len) = content_length {
        payload[..len.min(payload.len())].to_vec()
    } else {
        payload.to_vec()
    };
    Ok((status, body))
}

fn decode_chunked(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| "truncated chunk size line".to_string())?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|e| format!("bad chunk size {size_text:?}: {e}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        if data.len() < size {
            return Err("truncated chunk".to_string());
        }
        body.extend_from_slice(&data[..size]);
        data = data.get(size + 2..).unwrap_or_default();
    }
}

/// A tiny HTTP server on a free loopback port that answers every request with the same
/// (replaceable) body, e.g. a Prometheus exposition to scrape. Stops on drop.
pub struct StaticHttpServer {
    port: u16,
    body: Arc<Mutex<(String, String)>>,
    requests: Arc<AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StaticHttpServer {
    /// Serves `body` with `content_type` (for Prometheus: `text/plain; version=0.0.4`).
    pub fn start(body: &str, content_type: &str) -> StaticHttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let port = listener.local_addr().expect("local addr").port();
        let body = Arc::new(Mutex::new((body.to_string(), content_type.to_string())));
        let requests = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (body, requests, stop) = (body.clone(), requests.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(mut stream) = stream else { continue };
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    // Read the request head; the body of a GET is empty.
                    let mut head = Vec::new();
                    let mut byte = [0_u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
                        match stream.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => break,
                        }
                    }
                    requests.fetch_add(1, Ordering::SeqCst);
                    let (text, content_type) = body
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .clone();
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                        text.len()
                    );
                    let _ = stream.write_all(response.as_bytes());
                }
            })
        };
        StaticHttpServer {
            port,
            body,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`, the form Prometheus' `static_configs` want.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Replaces the body served from now on.
    pub fn set_body(&self, body: &str) {
        self.body
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0 = body.to_string();
    }

    /// How many requests were answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for StaticHttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_secs(1),
        );
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A started peer process and its captured output, from [`spawn_ready`]; killed on drop.
pub struct Peer {
    child: Option<CapturedChild>,
    output: Arc<Mutex<String>>,
}

impl Peer {
    /// Everything the process printed so far (stdout and stderr, whole lines).
    pub fn output(&self) -> String {
        self.output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            child.kill();
        }
    }
}

/// Spawns `command` and waits up to `timeout` for `ready` to hold. Fails (with the process'
/// log) when it exits first or is not ready in time. Callers retry with fresh ports:
/// [`free_port`] can race with another process taking the port (see [`start_on_free_ports`]).
pub fn spawn_ready(
    what: &str,
    command: Command,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<Peer, String> {
    let output = Arc::new(Mutex::new(String::new()));
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = CapturedChild::spawn(command, &output)
        .map_err(|e| format!("spawning {what} ({program}): {e}"))?;
    let state = poll(timeout, || {
        if child.exited().is_some() {
            return Some(false);
        }
        ready().then_some(true)
    });
    let log = || {
        output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    };
    match state {
        Some(true) => Ok(Peer {
            child: Some(child),
            output,
        }),
        Some(false) => {
            child.kill();
            Err(format!("{what} exited during startup; log:\n{}", log()))
        }
        None => {
            child.kill();
            Err(format!(
                "{what} not ready within {timeout:?}; log:\n{}",
                log()
            ))
        }
    }
}

/// Starts a peer listening on `N` fresh loopback ports: `command(ports)` builds its command,
/// `ready(ports)` says when it serves. Another process may take a port between [`free_port`]
/// and the peer's bind, so a peer that dies or is not ready in `timeout` is started again on
/// fresh ports, three times at most; then this panics with the last log.
pub fn start_on_free_ports<const N: usize>(
    what: &str,
    timeout: Duration,
    mut command: impl FnMut(&[u16; N]) -> Command,
    mut ready: impl FnMut(&[u16; N]) -> bool,
) -> ([u16; N], Peer) {
    let mut last_error = String::new();
    for _attempt in 0..3 {
        let ports: [u16; N] = std::array::from_fn(|_| free_port());
        match spawn_ready(what, command(&ports), timeout, || ready(&ports)) {
            Ok(peer) => return (ports, peer),
            Err(e) => last_error = e,
        }
    }
    panic!("{last_error}");
}
