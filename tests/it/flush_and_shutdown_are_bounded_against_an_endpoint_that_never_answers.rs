//! Against an OTLP endpoint that accepts connections and never answers (a hung collector, a
//! black-holing proxy), `flush()` returns within the OTLP timeout and `shutdown()` within the
//! shutdown timeout, each plus a stated margin, over gRPC and HTTP/protobuf, called from a
//! plain thread and from inside a multi-thread Tokio runtime (issue "Day one inside an
//! engine", point 5). What could not be sent is counted (`phasetrace.metric.exports`
//! `result="failed"`), never waited for.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use phasetrace::{Profiler, Protocol, Section, SectionLevel, Site};

const OTLP_TIMEOUT: Duration = Duration::from_millis(2_000);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_millis(2_000);
/// What a call may take beyond its timeout: the worker's last drain and thread hand-offs, on
/// a busy machine. Less than the OTLP timeout, so that flushing the metrics and then the
/// traces one after the other (two timeouts) fails; the SDK's own bounds are 5-15 s.
const MARGIN: Duration = Duration::from_millis(1_500);

/// A listener that accepts every connection, reads what is sent and never writes a byte.
struct BlackHole {
    addr: std::net::SocketAddr,
    _held: Arc<Mutex<Vec<TcpStream>>>,
}

impl BlackHole {
    fn start() -> BlackHole {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let addr = listener.local_addr().expect("its address");
        let held = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&held);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = stream.try_clone().expect("a second handle");
                // Drain what arrives so that the client's writes never block on a full window.
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
                });
                keep.lock().unwrap_or_else(|p| p.into_inner()).push(stream);
            }
        });
        BlackHole { addr, _held: held }
    }
}

fn profiler(endpoint: &str, protocol: Protocol) -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(1)
        .without_prometheus()
        .with_otlp_endpoint(Some(endpoint))
        .with_otlp_protocol(protocol)
        .with_otlp_timeout(OTLP_TIMEOUT)
        .with_shutdown_timeout(SHUTDOWN_TIMEOUT)
        .build()
        .unwrap_or_else(|e| panic!("{protocol:?}: {e}"))
}

/// Records, then times `flush()` and `shutdown()`.
fn bounded(endpoint: &str, protocol: Protocol, place: &str) {
    let p = profiler(endpoint, protocol);
    let rec = p.recorder();
    for _ in 0..4 {
        let _step = rec.step();
        let _s = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
    }
    drop(rec);
    let t = Instant::now();
    p.flush();
    let flush = t.elapsed();
    assert_eq!(p.stats().steps, 4, "{protocol:?} {place}");
    let t = Instant::now();
    p.shutdown();
    let shutdown = t.elapsed();
    eprintln!("{protocol:?} {place}: flush {flush:?}, shutdown {shutdown:?}");
    assert!(
        flush <= OTLP_TIMEOUT + MARGIN,
        "{protocol:?} {place}: flush() took {flush:?} against an endpoint that never answers \
         (OTLP timeout {OTLP_TIMEOUT:?})"
    );
    assert!(
        shutdown <= SHUTDOWN_TIMEOUT + MARGIN,
        "{protocol:?} {place}: shutdown() took {shutdown:?} against an endpoint that never \
         answers (shutdown timeout {SHUTDOWN_TIMEOUT:?})"
    );
}

#[test]
fn flush_and_shutdown_return_within_their_timeouts_from_a_thread_and_inside_tokio() {
    let hole = BlackHole::start();
    let grpc = format!("http://{}", hole.addr);
    let http = format!("http://{}", hole.addr);
    for (protocol, endpoint) in [(Protocol::Grpc, &grpc), (Protocol::HttpProtobuf, &http)] {
        bounded(endpoint, protocol, "on a thread");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let endpoint = endpoint.clone();
        rt.block_on(async move {
            tokio::task::spawn_blocking(move || bounded(&endpoint, protocol, "in spawn_blocking"))
                .await
                .expect("the blocking task");
        });
        let endpoint2 = grpc.clone();
        let endpoint2 = if protocol == Protocol::Grpc {
            endpoint2
        } else {
            http.clone()
        };
        rt.block_on(async move { bounded(&endpoint2, protocol, "on a runtime thread") });
    }
}
