//! An in-process OTLP receiver for the unit-level tests, over OTLP/HTTP (protobuf) or OTLP/gRPC:
//! it decodes each export request into its `opentelemetry-proto` message, so a test asserts on
//! what was sent (span names, attributes, data points) instead of parsing a collector's debug log
//! ([`crate::otlp_debug`]). The live tests keep their real collectors ([`crate::Rotel`],
//! [`crate::Otelcol`]); this stands in where the collector itself is not under test.
//!
//! ```text
//! start():      exporter ──POST /v1/traces | /v1/metrics (gzip or not)──> hyper HTTP/1.1
//!                        ──prost decode──┐
//! start_grpc(): exporter ──TraceService/Export | MetricsService/Export──> hyper HTTP/2
//!                        ──tonic's generated servers (gzip accepted)──┤
//!                                                                     └─> Export{Trace,Metrics}
//!                                        ServiceRequest kept in arrival order ──> the test
//! ```
//!
//! One receiver speaks one transport, so a test of the gRPC exporter fails if it sends HTTP.
//! The gRPC side uses the generated `*_service_server` modules of `opentelemetry-proto` (feature
//! `gen-tonic`) on hyper's HTTP/2 server directly, routed by path here: tonic's own server and
//! router (and axum under it) are not compiled. A request refused (undecodable body, unknown
//! path or method) is answered with an error (HTTP 400/404, or a non-OK `grpc-status`) and
//! recorded in [`OtlpReceiver::refused`]; nothing in the receiver panics on what it is sent.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the receiver decoded, in arrival order, and the requests it refused.
#[derive(Debug, Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
    refused: Vec<String>,
}

/// A running receiver; stopped on drop.
#[derive(Debug)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// The transport one receiver serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// OTLP/HTTP with protobuf bodies, on HTTP/1.1.
    Http,
    /// OTLP/gRPC, on HTTP/2 with prior knowledge (what the tonic exporter speaks).
    Grpc,
}

impl OtlpReceiver {
    /// Starts an OTLP/HTTP (protobuf) receiver on a free port of 127.0.0.1, serving on a thread
    /// of its own.
    pub fn start() -> OtlpReceiver {
        OtlpReceiver::start_serving(Transport::Http)
    }

    /// Starts an OTLP/gRPC receiver (the trace and metrics services, gzip accepted) on a free
    /// port of 127.0.0.1, serving on a thread of its own.
    pub fn start_grpc() -> OtlpReceiver {
        OtlpReceiver::start_serving(Transport::Grpc)
    }

    fn start_serving(transport: Transport) -> OtlpReceiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("local address");
        let received = Arc::new(Mutex::new(Received::default()));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = received.clone();
        let thread = std::thread::Builder::new()
            .name("otlp-receiver".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("receiver runtime");
                runtime.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    loop {
                        tokio::select! {
                            _ = &mut stopped => break,
                            accepted = listener.accept() => {
                                let Ok((stream, _)) = accepted else { continue };
                                let io = TokioIo::new(stream);
                                let shared = shared.clone();
                                match transport {
                                    Transport::Http => tokio::spawn(async move {
                                        let service =
                                            service_fn(move |req| answer(req, shared.clone()));
                                        let _ = hyper::server::conn::http1::Builder::new()
                                            .serve_connection(io, service)
                                            .await;
                                    }),
                                    Transport::Grpc => tokio::spawn(async move {
                                        let _ = hyper::server::conn::http2::Builder::new(
                                            TokioExecutor::new(),
                                        )
                                        .serve_connection(io, grpc::service(shared))
                                        .await;
                                    }),
                                };
                            }
                        }
                    }
                });
            })
            .expect("receiver thread");
        OtlpReceiver {
            addr,
            received,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The base URL (`http://127.0.0.1:PORT`): `OTEL_EXPORTER_OTLP_ENDPOINT` with
    /// `OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf` for a receiver from [`OtlpReceiver::start`],
    /// with `grpc` for one from [`OtlpReceiver::start_grpc`].
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every trace export request received so far, in order.
    pub fn traces(&self) -> Vec<ExportTraceServiceRequest> {
        self.lock().traces.clone()
    }

    /// Every metrics export request received so far, in order.
    pub fn metrics(&self) -> Vec<ExportMetricsServiceRequest> {
        self.lock().metrics.clone()
    }

    /// Every span received so far, in order.
    pub fn spans(&self) -> Vec<Span> {
        self.lock()
            .traces
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| ss.spans.iter().cloned())
            .collect()
    }

    /// The requests refused (unknown path or method, undecodable body), each with why: for gRPC
    /// the path, the status code and its message.
    pub fn refused(&self) -> Vec<String> {
        self.lock().refused.clone()
    }

    /// Polls `found` until it gives a value or `timeout` passes.
    pub fn wait_for<T>(&self, timeout: Duration, found: impl Fn(&Self) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = found(self) {
                return Some(v);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Received> {
        self.received.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn reply(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-protobuf"),
    );
    response
}

async fn answer(
    req: Request<Incoming>,
    received: Arc<Mutex<Received>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let gzip = req
        .headers()
        .get(hyper::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    let refuse = |why: String| {
        received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .refused
            .push(why);
        Ok(reply(StatusCode::BAD_REQUEST, Vec::new()))
    };
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(e) => return refuse(format!("{path}: reading the body: {e}")),
    };
    let body = if gzip {
        let mut out = Vec::new();
        if let Err(e) = flate2::read::GzDecoder::new(body.as_slice()).read_to_end(&mut out) {
            return refuse(format!("{path}: gzip: {e}"));
        }
        out
    } else {
        body
    };
    match path.as_str() {
        "/v1/traces" => match ExportTraceServiceRequest::decode(body.as_slice()) {
            Ok(m) => {
                received
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .traces
                    .push(m);
                Ok(reply(
                    StatusCode::OK,
                    ExportTraceServiceResponse::default().encode_to_vec(),
                ))
            }
            Err(e) => refuse(format!("{path}: not an ExportTraceServiceRequest: {e}")),
        },
        "/v1/metrics" => match ExportMetricsServiceRequest::decode(body.as_slice()) {
            Ok(m) => {
                received
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .metrics
                    .push(m);
                Ok(reply(
                    StatusCode::OK,
                    ExportMetricsServiceResponse::default().encode_to_vec(),
                ))
            }
            Err(e) => refuse(format!("{path}: not an ExportMetricsServiceRequest: {e}")),
        },
        other => {
            received
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .refused
                .push(format!("{other}: no such OTLP path"));
            Ok(reply(StatusCode::NOT_FOUND, Vec::new()))
        }
    }
}

/// The gRPC side: the generated trace and metrics servers, routed by path on one HTTP/2
/// connection; every answer whose headers carry a non-OK `grpc-status` (a trailers-only
/// response, which is how tonic answers a request it could not decode or route) is recorded as
/// refused.
mod grpc {
    use super::Received;
    use hyper::body::Incoming;
    use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
        MetricsService, MetricsServiceServer,
    };
    use opentelemetry_proto::tonic::collector::metrics::v1::{
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use tonic::codec::CompressionEncoding;
    use tonic::codegen::Service as _;

    const TRACE_SERVICE: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/";
    const METRICS_SERVICE: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/";

    /// What the generated servers store decoded requests into.
    #[derive(Debug, Clone)]
    struct Sink(Arc<Mutex<Received>>);

    impl Sink {
        fn lock(&self) -> std::sync::MutexGuard<'_, Received> {
            self.0.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    #[tonic::async_trait]
    impl TraceService for Sink {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            self.lock().traces.push(request.into_inner());
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    #[tonic::async_trait]
    impl MetricsService for Sink {
        async fn export(
            &self,
            request: tonic::Request<ExportMetricsServiceRequest>,
        ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
            self.lock().metrics.push(request.into_inner());
            Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
        }
    }

    type Answer = hyper::Response<tonic::body::Body>;

    /// The per-connection service: routes a request to the trace or metrics server by its path
    /// and records a refusal.
    #[derive(Debug, Clone)]
    pub(super) struct Routes {
        sink: Sink,
        traces: TraceServiceServer<Sink>,
        metrics: MetricsServiceServer<Sink>,
    }

    pub(super) fn service(received: Arc<Mutex<Received>>) -> Routes {
        let sink = Sink(received);
        Routes {
            traces: TraceServiceServer::new(sink.clone())
                .accept_compressed(CompressionEncoding::Gzip),
            metrics: MetricsServiceServer::new(sink.clone())
                .accept_compressed(CompressionEncoding::Gzip),
            sink,
        }
    }

    impl hyper::service::Service<hyper::Request<Incoming>> for Routes {
        type Response = Answer;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

        fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
            let routes = self.clone();
            Box::pin(async move {
                let path = req.uri().path().to_owned();
                let answer = if path.starts_with(TRACE_SERVICE) {
                    routes.traces.clone().call(req).await?
                } else if path.starts_with(METRICS_SERVICE) {
                    routes.metrics.clone().call(req).await?
                } else {
                    tonic::Status::unimplemented(format!("{path}: no such OTLP service"))
                        .into_http()
                };
                if let Some(status) = tonic::Status::from_header_map(answer.headers())
                    && status.code() != tonic::Code::Ok
                {
                    routes.sink.lock().refused.push(format!(
                        "{path}: gRPC status {:?}: {}",
                        status.code(),
                        status.message()
                    ));
                }
                Ok(answer)
            })
        }
    }
}
