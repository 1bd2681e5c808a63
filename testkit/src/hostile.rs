//! A hostile (or broken) OTLP collector on a loopback port, one misbehaviour per
//! [`HostileMode`]: what an exporter must survive without hanging or growing.
//!
//! ```text
//! OTLP/HTTP (raw HTTP/1.1)   200 + a 1 GiB body (streamed, never allocated), 200 + an endless
//!                            body at a byte a second, 200 + garbage, 307 to itself, 307 to a
//!                            second port that answers 307 back
//! OTLP/gRPC (h2 server)      a 1 GiB message (at the pace of flow control), an endless body at
//!                            a byte a second, a message that is not protobuf
//! HTTP/2 (raw frames)        garbage instead of frames, a flood of PINGs, a flood of SETTINGS
//! TLS                        a certificate for another name, signed by a CA the client trusts
//! ```
//!
//! Every connection runs on the server's own runtime; [`HostileCollector::bytes_sent`] says how
//! much it wrote, so that a test can show the client was offered far more than it kept.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The size of the huge bodies and messages: 1 GiB.
pub const HUGE: u64 = 1 << 30;

/// What the hostile collector does with every request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostileMode {
    /// OTLP/HTTP: 200 with a 1 GiB body of zeros, streamed.
    HttpHugeBody,
    /// OTLP/HTTP: 200 with a chunked body that never ends, one byte a second.
    HttpSlowBody,
    /// OTLP/HTTP: 200 with a body that is not protobuf.
    HttpGarbage,
    /// OTLP/HTTP: 307 to the same URL, for ever.
    HttpRedirectLoop,
    /// OTLP/HTTP: 307 to a second port, which answers 307 back.
    HttpRedirectAway,
    /// OTLP/gRPC: a response message whose length prefix says 1 GiB, followed by zeros.
    GrpcHugeMessage,
    /// OTLP/gRPC: response headers, then a byte a second, never a whole message.
    GrpcSlowBody,
    /// OTLP/gRPC: a whole response message that is not protobuf, and status OK.
    GrpcGarbageMessage,
    /// HTTP/2: bytes that are not HTTP/2 frames, after the client's preface.
    GrpcGarbageFrames,
    /// HTTP/2: an endless flood of PING frames, never an answer.
    PingFlood,
    /// HTTP/2: an endless flood of SETTINGS frames, never an answer.
    SettingsFlood,
    /// TLS with a certificate for `collector.invalid` (signed by [`HostileCollector::ca_pem`]).
    TlsWrongName,
}

impl HostileMode {
    /// Every mode.
    pub const ALL: [HostileMode; 12] = [
        HostileMode::HttpHugeBody,
        HostileMode::HttpSlowBody,
        HostileMode::HttpGarbage,
        HostileMode::HttpRedirectLoop,
        HostileMode::HttpRedirectAway,
        HostileMode::GrpcHugeMessage,
        HostileMode::GrpcSlowBody,
        HostileMode::GrpcGarbageMessage,
        HostileMode::GrpcGarbageFrames,
        HostileMode::PingFlood,
        HostileMode::SettingsFlood,
        HostileMode::TlsWrongName,
    ];

    /// Whether the mode speaks OTLP/HTTP (HTTP/1.1); the others speak HTTP/2 (gRPC), except
    /// [`HostileMode::TlsWrongName`], which fails both in the handshake.
    pub fn is_http(self) -> bool {
        matches!(
            self,
            HostileMode::HttpHugeBody
                | HostileMode::HttpSlowBody
                | HostileMode::HttpGarbage
                | HostileMode::HttpRedirectLoop
                | HostileMode::HttpRedirectAway
        )
    }
}

#[derive(Default)]
struct Counts {
    bytes: AtomicU64,
    connections: AtomicU64,
}

/// A hostile collector on 127.0.0.1. Stops when dropped.
pub struct HostileCollector {
    /// Its port.
    pub port: u16,
    /// What it does.
    pub mode: HostileMode,
    ca_pem: Option<String>,
    counts: Arc<Counts>,
    rt: Option<tokio::runtime::Runtime>,
}

impl HostileCollector {
    /// Listens on a free loopback port and misbehaves as `mode` says.
    pub fn start(mode: HostileMode) -> HostileCollector {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("hostile-collector")
            .enable_all()
            .build()
            .expect("runtime");
        let counts = Arc::new(Counts::default());
        let bind = || {
            rt.block_on(TcpListener::bind("127.0.0.1:0"))
                .expect("binding 127.0.0.1:0")
        };
        let listener = bind();
        let port = listener.local_addr().expect("addr").port();
        let mut ca_pem = None;
        match mode {
            HostileMode::HttpRedirectAway => {
                let away = bind();
                let away_port = away.local_addr().expect("addr").port();
                rt.spawn(serve(listener, counts.clone(), move |s, c| {
                    http1(s, c, HostileMode::HttpRedirectAway, away_port)
                }));
                rt.spawn(serve(away, counts.clone(), move |s, c| {
                    http1(s, c, HostileMode::HttpRedirectAway, port)
                }));
            }
            HostileMode::TlsWrongName => {
                let (ca, cert, key) = crate::tls::certificates_for("collector.invalid");
                let acceptor = crate::tls::acceptor(&cert, &key);
                ca_pem = Some(ca);
                rt.spawn(serve(listener, counts.clone(), move |s, _| {
                    let acceptor = acceptor.clone();
                    async move {
                        // The client refuses the certificate: nothing more is said.
                        let _ = acceptor.accept(s).await;
                    }
                }));
            }
            m if m.is_http() => {
                rt.spawn(serve(listener, counts.clone(), move |s, c| {
                    http1(s, c, m, port)
                }));
            }
            m @ (HostileMode::GrpcHugeMessage
            | HostileMode::GrpcSlowBody
            | HostileMode::GrpcGarbageMessage) => {
                rt.spawn(serve(listener, counts.clone(), move |s, c| grpc(s, c, m)));
            }
            m => {
                rt.spawn(serve(listener, counts.clone(), move |s, c| raw_h2(s, c, m)));
            }
        }
        HostileCollector {
            port,
            mode,
            ca_pem,
            counts,
            rt: Some(rt),
        }
    }

    /// The OTLP endpoint to configure: `http://127.0.0.1:{port}`, or
    /// `https://localhost:{port}` for [`HostileMode::TlsWrongName`].
    pub fn endpoint(&self) -> String {
        match self.mode {
            HostileMode::TlsWrongName => format!("https://localhost:{}", self.port),
            _ => format!("http://127.0.0.1:{}", self.port),
        }
    }

    /// The CA (PEM) that signed the wrong-name certificate ([`HostileMode::TlsWrongName`]).
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The bytes written to clients so far (bodies, frames).
    pub fn bytes_sent(&self) -> u64 {
        self.counts.bytes.load(Relaxed)
    }

    /// The connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.counts.connections.load(Relaxed)
    }
}

impl Drop for HostileCollector {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

async fn serve<F, Fut>(listener: TcpListener, counts: Arc<Counts>, handle: F)
where
    F: Fn(TcpStream, Arc<Counts>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = sock.set_nodelay(true);
        counts.connections.fetch_add(1, Relaxed);
        tokio::spawn(handle(sock, counts.clone()));
    }
}

/// Reads one HTTP/1.1 request (head and a `content-length` body); its path, or `None` at the
/// end of the connection.
async fn read_request(s: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.ok()? == 0 || head.len() > 64 * 1024 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let path = head.split_whitespace().nth(1)?.to_owned();
    let len: u64 = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; 16 * 1024];
    let mut left = len;
    while left > 0 {
        let n = s
            .read(&mut body[..left.min(16 * 1024) as usize])
            .await
            .ok()?;
        if n == 0 {
            return None;
        }
        left -= n as u64;
    }
    Some(path)
}

async fn write(s: &mut TcpStream, counts: &Counts, bytes: &[u8]) -> bool {
    let ok = s.write_all(bytes).await.is_ok();
    if ok {
        counts.bytes.fetch_add(bytes.len() as u64, Relaxed);
    }
    ok
}

/// The OTLP/HTTP modes; `other` is the port a redirect names.
async fn http1(mut s: TcpStream, counts: Arc<Counts>, mode: HostileMode, other: u16) {
    while let Some(path) = read_request(&mut s).await {
        match mode {
            HostileMode::HttpHugeBody => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n\
                     content-length: {HUGE}\r\n\r\n"
                );
                if !write(&mut s, &counts, head.as_bytes()).await {
                    return;
                }
                let zeros = vec![0u8; 64 * 1024];
                let mut left = HUGE;
                while left > 0 {
                    let n = left.min(zeros.len() as u64) as usize;
                    if !write(&mut s, &counts, &zeros[..n]).await {
                        return;
                    }
                    left -= n as u64;
                }
            }
            HostileMode::HttpSlowBody => {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n\
                            transfer-encoding: chunked\r\n\r\n";
                if !write(&mut s, &counts, head.as_bytes()).await {
                    return;
                }
                // A byte a second (a chunk of one zero byte), for ever.
                while write(&mut s, &counts, b"1\r\n\0\r\n").await {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                return;
            }
            HostileMode::HttpGarbage => {
                let body = garbage();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n\
                     content-length: {}\r\n\r\n",
                    body.len()
                );
                if !write(&mut s, &counts, head.as_bytes()).await
                    || !write(&mut s, &counts, &body).await
                {
                    return;
                }
            }
            _ => {
                let port = if mode == HostileMode::HttpRedirectLoop {
                    s.local_addr().map(|a| a.port()).unwrap_or(other)
                } else {
                    other
                };
                let head = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:{port}{path}\r\n\
                     content-length: 0\r\n\r\n"
                );
                if !write(&mut s, &counts, head.as_bytes()).await {
                    return;
                }
            }
        }
    }
}

/// Bytes that are not a protobuf message (a varint that never ends, then text).
fn garbage() -> Vec<u8> {
    let mut b = vec![0xffu8; 12];
    b.extend_from_slice(b"<html>this is not protobuf</html>");
    b
}

/// The gRPC modes on a real HTTP/2 server (h2): every request gets the mode's answer.
async fn grpc(s: TcpStream, counts: Arc<Counts>, mode: HostileMode) {
    let Ok(mut conn) = h2::server::handshake(s).await else {
        return;
    };
    while let Some(Ok((req, respond))) = conn.accept().await {
        tokio::spawn(grpc_answer(req, respond, counts.clone(), mode));
    }
}

async fn grpc_answer(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
    counts: Arc<Counts>,
    mode: HostileMode,
) {
    // Drain the request so that the client's flow control never stalls its send.
    let mut body = req.into_body();
    tokio::spawn(async move {
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
        }
    });
    let head = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .expect("a response head");
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let sent = |n: usize| counts.bytes.fetch_add(n as u64, Relaxed);
    match mode {
        HostileMode::GrpcHugeMessage => {
            let mut prefix = vec![0u8];
            prefix.extend_from_slice(&((HUGE - 1) as u32).to_be_bytes());
            if send.send_data(prefix.into(), false).is_err() {
                return;
            }
            let mut left = HUGE - 1;
            while left > 0 {
                send.reserve_capacity(64 * 1024);
                let cap = match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                    Some(Ok(cap)) => cap,
                    _ => return,
                };
                let n = (cap as u64).min(left) as usize;
                if send
                    .send_data(bytes::Bytes::from(vec![0u8; n]), false)
                    .is_err()
                {
                    return;
                }
                sent(n);
                left -= n as u64;
            }
        }
        HostileMode::GrpcSlowBody => loop {
            if send
                .send_data(bytes::Bytes::from_static(&[0u8]), false)
                .is_err()
            {
                return;
            }
            sent(1);
            tokio::time::sleep(Duration::from_secs(1)).await;
        },
        _ => {
            let body = garbage();
            let mut msg = vec![0u8];
            msg.extend_from_slice(&(body.len() as u32).to_be_bytes());
            msg.extend_from_slice(&body);
            sent(msg.len());
            let _ = send.send_data(msg.into(), false);
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let _ = send.send_trailers(trailers);
        }
    }
}

/// The raw HTTP/2 modes: after the client's preface, garbage or an endless flood of frames;
/// what the client sends is read and thrown away.
async fn raw_h2(s: TcpStream, counts: Arc<Counts>, mode: HostileMode) {
    let (mut rd, mut wr) = s.into_split();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        while matches!(rd.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    // An empty SETTINGS frame: the server's preface.
    const SETTINGS: [u8; 9] = [0, 0, 0, 0x4, 0, 0, 0, 0, 0];
    let frame: Vec<u8> = match mode {
        HostileMode::PingFlood => {
            let mut f = vec![0, 0, 8, 0x6, 0, 0, 0, 0, 0];
            f.extend_from_slice(b"pingpong");
            f
        }
        HostileMode::SettingsFlood => {
            // SETTINGS_MAX_CONCURRENT_STREAMS = 100, changed again and again.
            vec![0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 0x3, 0, 0, 0, 100]
        }
        _ => garbage(),
    };
    let first: Vec<u8> = if mode == HostileMode::GrpcGarbageFrames {
        frame.clone()
    } else {
        SETTINGS.to_vec()
    };
    if wr.write_all(&first).await.is_err() {
        return;
    }
    counts.bytes.fetch_add(first.len() as u64, Relaxed);
    if mode == HostileMode::GrpcGarbageFrames {
        // Nothing more: the client must give up on its own.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        return;
    }
    // Batches of a thousand frames, a millisecond apart: a flood, without taking a whole core
    // of a busy test machine.
    let batch: Vec<u8> = frame.repeat(1000);
    loop {
        if wr.write_all(&batch).await.is_err() {
            return;
        }
        counts.bytes.fetch_add(batch.len() as u64, Relaxed);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
