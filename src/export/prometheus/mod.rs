//! The embedded Prometheus pull endpoint: `GET /metrics` (and `HEAD`) served by hyper on one
//! small runtime thread of its own.
//!
//! ```text
//! accept (at most PROMETHEUS_MAX_CONNECTIONS at once; at the bound the oldest idle one is
//!         closed to admit the new one: slots.rs)
//!   ─► TLS handshake (web config, re-read if changed) and the request head, within
//!      PROMETHEUS_HEAD_TIMEOUT_MS of accept; kept alive at most PROMETHEUS_IDLE_TIMEOUT_MS idle
//!   ─► hyper HTTP/1.1 (head at most PROMETHEUS_MAX_HEADER_BYTES)
//!   ─► basic auth (web config, re-read if changed; verified credentials checked inline, bcrypt
//!      on a pool of its own behind a queue fair between client addresses, 429 when the
//!      client's address has no room in it: auth.rs, fair.rs)
//!   ─► route
//!   ─► scrape on a blocking thread: ManualReader::collect ─► encode (classic | OpenMetrics |
//!      delimited protobuf with native histograms)
//!      ─► gzip when accepted
//! ```
//!
//! Binds to loopback by default (`127.0.0.1:9464`). Connections are served concurrently, so an
//! idle or slow client never delays a scrape, and idle ones never hold a scraper out; answering
//! is bounded by [`default::PROMETHEUS_REQUEST_TIMEOUT_MS`] (a stalled write too). The limits,
//! with their numbers, are in `docs/security.md`. Scraping runs off the
//! engine's threads and off the worker: it collects what the SDK aggregated.

pub(crate) mod auth;
pub(crate) mod encode;
mod fair;
pub(crate) mod negotiate;
mod proto;
pub(crate) mod reload;
mod slots;
mod watched;
pub(crate) mod web_config;

use super::exemplars::{BUCKETS, EXEMPLAR_METRICS, ExemplarStore};
use super::{ExportError, Reader};
use crate::names::AuthRefusal;
use crate::names::default;
pub(crate) use auth::AuthCounts;
use auth::{AuthPool, Verdict};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use opentelemetry::KeyValue;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{InstrumentKind, ManualReader, Pipeline, Temporality};
use reload::{LiveWebConfig, ReloadCounts};
pub(crate) use slots::ConnCounts;
use slots::{Conn, Slots};
use std::convert::Infallible;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

pub(crate) use encode::Format;

const TIMEOUT: Duration = Duration::from_millis(default::PROMETHEUS_REQUEST_TIMEOUT_MS);

/// The SDK reader behind the endpoint: a [`ManualReader`] shared with the server, which collects
/// on each scrape.
#[derive(Clone, Debug)]
pub(crate) struct PrometheusReader(pub(super) Arc<ManualReader>);

impl PrometheusReader {
    /// A reader of the endpoint's own.
    pub(crate) fn manual() -> PrometheusReader {
        PrometheusReader(Arc::new(ManualReader::builder().build()))
    }
}

impl MetricReader for PrometheusReader {
    fn register_pipeline(&self, pipeline: std::sync::Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

/// The native provider's side of the endpoint: its reader (the per-layer distributions and
/// the exponential twins of the explicit-bucket histograms), read by protobuf scrapes only,
/// and the flag the first of them sets so that the worker starts recording the twins.
#[derive(Clone, Debug)]
pub(crate) struct Native {
    pub(crate) reader: PrometheusReader,
    pub(crate) wanted: Arc<std::sync::atomic::AtomicBool>,
}

/// The running endpoint.
pub(crate) struct PrometheusServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    reloads: Option<Arc<ReloadCounts>>,
    connections: Arc<ConnCounts>,
    auth: Option<Arc<AuthCounts>>,
    tls: bool,
}

impl PrometheusServer {
    /// `http://addr/metrics`, or `https://` with TLS.
    pub(crate) fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}/metrics", self.addr)
    }

    /// The web configuration file's reloads, when there is one.
    pub(crate) fn reloads(&self) -> Option<Arc<ReloadCounts>> {
        self.reloads.clone()
    }

    /// The connections closed before their client was done, by reason.
    pub(crate) fn connections(&self) -> Arc<ConnCounts> {
        self.connections.clone()
    }

    /// The requests refused at basic auth, when there is a web configuration file.
    pub(crate) fn auth(&self) -> Option<Arc<AuthCounts>> {
        self.auth.clone()
    }

    pub(crate) fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl super::Server for PrometheusServer {
    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn url(&self) -> String {
        PrometheusServer::url(self)
    }

    fn stop(self: Box<Self>) {
        PrometheusServer::stop(*self);
    }
}

/// What every connection shares.
struct Endpoint {
    reader: Reader,
    /// The native provider's side (see [`Native`]).
    native: Native,
    /// TLS and basic auth, re-read when the file changed.
    web: Option<LiveWebConfig>,
    /// The password checks' threads (with a web configuration file).
    auth: Option<AuthPool>,
    /// Exemplars of delivered traces, rendered on OpenMetrics bucket lines.
    exemplars: Option<Arc<ExemplarStore>>,
    /// The size of the last uncompressed scrape, to size the next one's buffer.
    last_size: AtomicUsize,
}

/// Binds `addr` and starts serving; `web` adds TLS and basic auth (TLS or plain as its file
/// said at start; certificates and users re-read when it changes); `exemplars` (traces on) adds
/// the exemplars of delivered traces to OpenMetrics scrapes. Scrapes collect from `reader`
/// (the endpoint's own, or an OTLP reader of the same aggregation: see
/// [`super::Role::Scraped`]); protobuf scrapes also collect `native` (the native provider's
/// reader).
pub(super) fn start(
    addr: SocketAddr,
    web: Option<LiveWebConfig>,
    exemplars: Option<Arc<ExemplarStore>>,
    reader: Reader,
    native: Native,
) -> Result<PrometheusServer, ExportError> {
    let bound = slots::fd_bound(default::PROMETHEUS_MAX_CONNECTIONS);
    start_with(addr, web, exemplars, reader, native, bound)
}

/// Installs the Prometheus endpoint (when `cfg` names an address): its server, the reader its
/// scrapes collect from when it has one of its own (the OTLP reader, when that has the same
/// aggregation, otherwise), the native reader, and its own metrics (reloads, connections
/// closed early, basic-auth refusals).
///
/// The endpoint's native histograms (the per-layer distributions, and the exponential twins of
/// the explicit-bucket histograms) live on a provider and reader of their own that only the
/// protobuf scrape reads: the text scrapes keep their shape and budget, and an OTLP exporter
/// whose reader the scrapes share does not carry them.
pub(super) fn install(x: &mut super::Install<'_>) -> Result<(), ExportError> {
    let cfg = x.cfg;
    let Some(addr) = cfg.prometheus else {
        return Ok(());
    };
    // An export reader of explicit buckets (the endpoint's aggregation) is shared: one
    // aggregation, so the worker records each measurement once.
    let shared = x
        .readers
        .iter_mut()
        .find(|r| !r.exponential && r.role == super::Role::Export);
    let web = cfg
        .prometheus_web_config
        .as_deref()
        .map(LiveWebConfig::load)
        .transpose()?;
    let native = Native {
        reader: PrometheusReader::manual(),
        wanted: x.native_wanted.clone(),
    };
    let source = match &shared {
        Some(r) => r.reader.clone(),
        None => super::Reader::new(PrometheusReader::manual()),
    };
    match start(
        addr,
        web,
        x.exemplars.clone(),
        source.clone(),
        native.clone(),
    ) {
        Ok(server) => {
            let counts = EndpointCounts {
                reloads: server.reloads(),
                closed: server.connections(),
                refused: server.auth(),
            };
            let group = cfg.group.clone();
            x.own_metrics.push(Box::new(move |m, kept| {
                endpoint_metrics(m, &group, &counts, kept)
            }));
            match shared {
                Some(r) => r.role = super::Role::Scraped,
                None => x.readers.push(super::OwnReader {
                    reader: source,
                    exponential: false,
                    role: super::Role::Scraped,
                }),
            }
            x.readers.push(super::OwnReader {
                reader: super::Reader::new(native.reader),
                exponential: true,
                role: super::Role::Native,
            });
            x.servers.push(Box::new(server));
            Ok(())
        }
        // The built-in default address is a convenience, not a promise: taken (the engine's
        // own exporter, another rank), it is said once and skipped.
        Err(ExportError::PrometheusBind { addr, source })
            if cfg.origin(crate::names::env::PROMETHEUS) == crate::config::Origin::Default =>
        {
            crate::diag::warning!(
                "the default Prometheus endpoint {addr} cannot listen \
                 ({source}); running without it (set {}=host:port, or off, to choose)",
                crate::names::env::PROMETHEUS
            );
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// What the endpoint's own metrics read: its web configuration reloads, the connections it
/// closed early, and its basic-auth refusals.
#[derive(Clone)]
struct EndpointCounts {
    reloads: Option<Arc<ReloadCounts>>,
    closed: Arc<ConnCounts>,
    refused: Option<Arc<AuthCounts>>,
}

/// The Prometheus endpoint's own metrics on `m`.
fn endpoint_metrics(
    m: &opentelemetry::metrics::Meter,
    group: &str,
    counts: &EndpointCounts,
    kept: &mut Vec<super::OwnMetric>,
) {
    use super::OwnMetric::{Counter, Gauge};
    use crate::names::{AuthRefusal, ConnectionClose, metric, unit_and_help};
    if let Some(counts) = counts.reloads.clone() {
        let last = counts.clone();
        let name = metric::PROMETHEUS_WEB_CONFIG_RELOADS;
        let (unit, help) = unit_and_help(name);
        kept.push(Counter(super::outcome_counter(
            m,
            name,
            unit,
            help,
            group,
            move |r| counts.get(r),
        )));
        let name = metric::PROMETHEUS_WEB_CONFIG_LAST_RELOAD_SUCCESSFUL;
        kept.push(Gauge(super::state_gauge(
            m,
            name,
            unit_and_help(name).1,
            group,
            move || last.last_successful(),
        )));
    }
    let closed = counts.closed.clone();
    let name = metric::PROMETHEUS_CONNECTIONS_CLOSED;
    let (unit, help) = unit_and_help(name);
    kept.push(Counter(super::reason_counter(
        m,
        name,
        unit,
        help,
        group,
        ConnectionClose::ALL.len(),
        move |i| {
            let r = ConnectionClose::ALL[i];
            (r.as_str(), closed.get(r))
        },
    )));
    if let Some(refused) = counts.refused.clone() {
        let name = metric::PROMETHEUS_AUTH_REFUSED;
        let (unit, help) = unit_and_help(name);
        kept.push(Counter(super::reason_counter(
            m,
            name,
            unit,
            help,
            group,
            AuthRefusal::ALL.len(),
            move |i| {
                let r = AuthRefusal::ALL[i];
                (r.as_str(), refused.get(r))
            },
        )));
    }
}

/// [`start`], holding at most `max_connections` connections.
fn start_with(
    addr: SocketAddr,
    web: Option<LiveWebConfig>,
    exemplars: Option<Arc<ExemplarStore>>,
    source: Reader,
    native: Native,
    max_connections: usize,
) -> Result<PrometheusServer, ExportError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(2)
        .thread_name("phasetrace-prometheus-scrape")
        .build()
        .map_err(ExportError::Thread)?;
    let listener = {
        let _in = runtime.enter();
        listen(addr).map_err(|source| ExportError::PrometheusBind { addr, source })?
    };
    let bound = listener.local_addr().unwrap_or(addr);
    let reloads = web.as_ref().map(LiveWebConfig::counts);
    let tls = web.as_ref().is_some_and(LiveWebConfig::is_tls);
    let auth_counts = web.as_ref().map(|_| Arc::new(AuthCounts::default()));
    let auth = auth_counts
        .clone()
        .map(AuthPool::start)
        .transpose()
        .map_err(ExportError::Thread)?;
    let connections = Arc::new(ConnCounts::default());
    let slots = Arc::new(Slots::new(max_connections, connections.clone()));
    let endpoint = Arc::new(Endpoint {
        reader: source,
        native,
        web,
        auth,
        exemplars,
        last_size: AtomicUsize::new(64 * 1024),
    });
    let (tx, rx) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("phasetrace-prometheus".into())
        .spawn(move || {
            runtime.block_on(accept_loop(listener, slots, endpoint, rx));
            // Dropping the runtime ends every connection task.
            runtime.shutdown_timeout(Duration::from_millis(200));
        })
        .map_err(ExportError::Thread)?;
    Ok(PrometheusServer {
        addr: bound,
        stop: Some(tx),
        thread: Some(thread),
        reloads,
        connections,
        auth: auth_counts,
        tls,
    })
}

/// The listening socket, with a backlog of [`default::PROMETHEUS_BACKLOG`] (inside a runtime).
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `std::net::TcpListener::bind` does on Unix: a restarted engine rebinds its port at
    // once (a port another process listens on stays refused).
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(default::PROMETHEUS_BACKLOG)
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    slots: Arc<Slots>,
    endpoint: Arc<Endpoint>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    // At the bound, the oldest idle connection makes room; only when every one
                    // is being answered is the new one closed (counted either way).
                    let Some(conn) = slots.admit() else {
                        drop(tcp);
                        continue;
                    };
                    let _ = tcp.set_nodelay(true);
                    let ep = endpoint.clone();
                    tokio::spawn(conn.clone().run(ep.connection(tcp, conn, peer.ip())));
                    // Its task reads what the client sent before the next accept: a burst of
                    // connections beyond the bound cannot evict it before it had the chance
                    // to send its head.
                    tokio::task::yield_now().await;
                }
                // Out of file descriptors: an idle connection gives its own back (its task
                // closes it at its next poll, hence the pause).
                Err(e) if slots::out_of_files(&e) && slots.evict_oldest() => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                // Out of descriptors with none idle, and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
}

impl Endpoint {
    /// Serves one connection (its deadlines are [`Conn::run`]'s: the TLS handshake and the
    /// first head are within the head time of accept).
    async fn connection(self: Arc<Self>, tcp: tokio::net::TcpStream, conn: Conn, peer: IpAddr) {
        // Each handshake with the certificates of now: a `stat` per file when none changed.
        let web = self.web.as_ref().map(LiveWebConfig::get);
        match web.as_ref().and_then(|w| w.tls.as_ref()) {
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
                if let Ok(stream) = acceptor.accept(tcp).await {
                    self.http(stream, conn, peer).await;
                }
            }
            None => self.http(tcp, conn, peer).await,
        }
    }

    async fn http<I>(self: Arc<Self>, io: I, conn: Conn, peer: IpAddr)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let ep = self.clone();
        let c = conn.clone();
        let service =
            hyper::service::service_fn(move |req| ep.clone().handle(req, c.clone(), peer));
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            // The connection's own deadlines bound the head, and tell it from an idle
            // kept-alive wait (hyper's one timer would cut both at the same time).
            .header_read_timeout(None)
            .max_buf_size(default::PROMETHEUS_MAX_HEADER_BYTES)
            .serve_connection(TokioIo::new(Tracked::new(io, conn)), service)
            .await;
    }

    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        conn: Conn,
        peer: IpAddr,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        conn.busy();
        let answer = tokio::time::timeout(TIMEOUT, self.answer(req, peer)).await;
        conn.answered();
        Ok(answer.unwrap_or_else(|_| {
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the scrape took too long\n",
            )
        }))
    }

    async fn answer(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: IpAddr,
    ) -> Response<Full<Bytes>> {
        // Each request with the users of now: a kept-alive scraper's too.
        if let Some(users) = self.web.as_ref().and_then(|w| w.get().users.clone()) {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes);
            let verdict = match &self.auth {
                Some(pool) => pool.check(users, given, peer).await,
                None => Verdict::Refused(AuthRefusal::Busy),
            };
            match verdict {
                Verdict::Allowed => {}
                Verdict::Refused(AuthRefusal::Unauthorized) => {
                    let mut r = text(StatusCode::UNAUTHORIZED, "unauthorized\n");
                    r.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        HeaderValue::from_static("Basic realm=\"phasetrace\""),
                    );
                    return r;
                }
                Verdict::Refused(AuthRefusal::Busy) => {
                    let mut r = text(
                        StatusCode::TOO_MANY_REQUESTS,
                        "too many password checks at once: retry\n",
                    );
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    return r;
                }
            }
        }
        let get = matches!(*req.method(), Method::GET | Method::HEAD);
        match (get, req.uri().path()) {
            (true, "/metrics") => self.scrape(&req).await,
            (true, "/") => text(StatusCode::OK, "phasetrace: metrics at /metrics\n"),
            (false, "/metrics" | "/") => {
                let mut r = text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "only GET and HEAD are allowed\n",
                );
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
                r
            }
            _ => text(StatusCode::NOT_FOUND, "not found: try /metrics\n"),
        }
    }

    async fn scrape(self: &Arc<Self>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        let h = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
        let format = negotiate::format(h(header::ACCEPT));
        let gzip = negotiate::gzip(h(header::ACCEPT_ENCODING));
        let ep = self.clone();
        let body = tokio::task::spawn_blocking(move || ep.render(format, gzip)).await;
        match body {
            Ok(Ok(body)) => {
                let mut r = Response::new(Full::new(Bytes::from(body)));
                let hs = r.headers_mut();
                if let Ok(v) = HeaderValue::from_str(&format.content_type()) {
                    hs.insert(header::CONTENT_TYPE, v);
                }
                if gzip {
                    hs.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                }
                hs.insert(
                    header::VARY,
                    HeaderValue::from_static("Accept, Accept-Encoding"),
                );
                r
            }
            Ok(Err(why)) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("cannot collect metrics: {why}\n"),
            ),
            Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "the scrape failed\n"),
        }
    }

    /// Collects, encodes and (with `gzip`) compresses one scrape.
    fn render(&self, format: Format, gzip: bool) -> Result<Vec<u8>, String> {
        if format == Format::Protobuf {
            self.native.wanted.store(true, Ordering::Relaxed);
        }
        let body = scrape(
            &self.reader,
            Some(&self.native.reader),
            format,
            self.last_size.load(Ordering::Relaxed),
            self.exemplars.as_deref(),
        )?;
        self.last_size.store(body.len(), Ordering::Relaxed);
        if !gzip {
            return Ok(body);
        }
        // The fastest level: a scrape compresses 10-20x at it, at a fraction of level 6's CPU.
        let mut z = flate2::write::GzEncoder::new(
            Vec::with_capacity(body.len() / 8),
            flate2::Compression::fast(),
        );
        z.write_all(&body)
            .and_then(|()| z.finish())
            .map_err(|e| e.to_string())
    }
}

/// One scrape's text: what the reader collects, in `format` (a text format); in OpenMetrics,
/// with the exemplars `store` holds (only of exported traces) on the bucket lines of their
/// series.
#[cfg(test)]
pub(crate) fn scrape_text(
    reader: &Reader,
    format: Format,
    capacity: usize,
    store: Option<&ExemplarStore>,
) -> Result<String, String> {
    let body = scrape(reader, None, format, capacity, store)?;
    String::from_utf8(body).map_err(|e| e.to_string())
}

/// One scrape's body in `format`: in OpenMetrics and protobuf, with the exemplars `store`
/// holds (only of exported traces) on the buckets of their series.
pub(crate) fn scrape(
    reader: &Reader,
    native: Option<&PrometheusReader>,
    format: Format,
    capacity: usize,
    store: Option<&ExemplarStore>,
) -> Result<Vec<u8>, String> {
    let mut rm = ResourceMetrics::default();
    reader.collect(&mut rm).map_err(|e| e.to_string())?;
    let names = EXEMPLAR_METRICS.map(|m| (encode::base_name(m, "s"), m));
    // The encoders ask bucket by bucket, 0 first, for each data point: one store lookup per
    // data point.
    let cache = std::cell::RefCell::new([None; BUCKETS]);
    let source = |base: &str, kv: &[KeyValue], i: usize| -> Option<encode::Exemplar> {
        let store = store?;
        let metric = names.iter().find(|(b, _)| b == base)?.1;
        if i == 0 {
            *cache.borrow_mut() = store.series_of(metric, kv);
        }
        let e = (*cache.borrow()).get(i).copied().flatten()?;
        Some(encode::Exemplar {
            trace_id: e.trace_id.to_bytes(),
            span_id: e.span_id.to_bytes(),
            value: e.value,
            time: e.time,
        })
    };
    let source: Option<encode::ExemplarSource<'_>> = store.is_some().then_some(&source);
    match format {
        Format::Protobuf => {
            let mut extra = ResourceMetrics::default();
            if let Some(n) = native {
                n.collect(&mut extra).map_err(|e| e.to_string())?;
            }
            let mut out = Vec::with_capacity(capacity + capacity / 8);
            encode::encode_protobuf(&rm, native.map(|_| &extra), source, &mut out);
            Ok(out)
        }
        Format::OpenMetrics { .. } => {
            let mut out = String::with_capacity(capacity + capacity / 8);
            encode::encode(&rm, format, source, &mut out);
            Ok(out.into_bytes())
        }
        Format::Classic => {
            let mut out = String::with_capacity(capacity + capacity / 8);
            encode::encode(&rm, format, None, &mut out);
            Ok(out.into_bytes())
        }
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The connection's IO, telling it where it is ([`Conn::read_some`], [`Conn::flushed`]), whose
/// writes fail with `TimedOut` once one has made no progress for [`TIMEOUT`]: a client that
/// stops reading its response loses its connection instead of holding a slot.
struct Tracked<I> {
    io: I,
    conn: Conn,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<I> Tracked<I> {
    fn new(io: I, conn: Conn) -> Self {
        Tracked {
            io,
            conn,
            stalled: None,
        }
    }

    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(TIMEOUT)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.read_some();
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Tracked<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.check(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.check(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.conn.flushed();
        }
        self.check(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.check(cx, r)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn openmetrics_and_protobuf_scrapes_show_exemplars_of_exported_spans_only() {
        use super::super::exemplars::{Exemplar, ExemplarStore};
        use super::{Format, PrometheusReader, scrape_text};
        use crate::names::metric;
        use opentelemetry::KeyValue;
        use opentelemetry::metrics::MeterProvider as _;
        use opentelemetry::trace::{SpanId, TraceId};
        use opentelemetry_sdk::metrics::{ManualReader, SdkMeterProvider};
        use std::sync::Arc;
        use std::time::{Duration, SystemTime};

        let reader = PrometheusReader(Arc::new(ManualReader::builder().build()));
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.clone())
            .build();
        let h = provider
            .meter("t")
            .f64_histogram(metric::STEP_DURATION)
            .with_unit("s")
            .with_boundaries(metric::DURATION_BOUNDARIES.to_vec())
            .build();
        let attrs = [KeyValue::new("rank", 0), KeyValue::new("group", "tp0")];
        h.record(0.0042, &attrs);
        let store = ExemplarStore::default();
        let e = |span: u64| Exemplar {
            trace_id: TraceId::from(0xabc_u128),
            span_id: SpanId::from(span),
            value: 0.0042,
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_578_880_123),
        };
        store.offer(metric::STEP_DURATION, &attrs, e(0x1f));
        let om = Format::OpenMetrics { version: "1.0.0" };
        let source = crate::export::Reader::new(reader);
        let text = |format, store| scrape_text(&source, format, 0, store).expect("scrape");
        assert!(
            !text(om, Some(&store)).contains("# {"),
            "a pending exemplar is not shown"
        );
        store.settle(&[SpanId::from(0x1f)], true);
        let got = text(om, Some(&store));
        let line = got
            .lines()
            .find(|l| l.contains("# {"))
            .expect("an exemplar line");
        assert!(
            line.starts_with("phasetrace_step_duration_seconds_bucket{")
                && line.contains("le=\"0.005\"")
                && line.ends_with(
                    " # {trace_id=\"00000000000000000000000000000abc\",span_id=\"000000000000001f\"} 0.0042 1764578880.123"
                ),
            "{line}"
        );
        assert_eq!(got.matches("# {").count(), 1, "{got}");
        let classic = text(Format::Classic, Some(&store));
        assert!(!classic.contains("# {"), "{classic}");
        assert_eq!(classic, text(Format::Classic, None));
        // The protobuf scrape carries it on the same bucket, as an Exemplar message.
        {
            use prost::Message as _;
            let body = super::scrape(&source, None, Format::Protobuf, 0, Some(&store))
                .expect("protobuf scrape");
            let mut buf = &body[..];
            let mut exemplars = Vec::new();
            while !buf.is_empty() {
                let f = super::proto::MetricFamily::decode_length_delimited(&mut buf)
                    .expect("delimited MetricFamily");
                for m in &f.metric {
                    for b in m.histogram.iter().flat_map(|h| &h.bucket) {
                        if let Some(e) = &b.exemplar {
                            exemplars.push((f.name.clone(), b.upper_bound, e.clone()));
                        }
                    }
                }
            }
            assert_eq!(exemplars.len(), 1, "{exemplars:?}");
            let (name, le, e) = &exemplars[0];
            assert_eq!(name, "phasetrace_step_duration_seconds");
            assert_eq!(*le, 0.005);
            assert_eq!(e.value, 0.0042);
            let label = |k: &str| {
                e.label
                    .iter()
                    .find(|l| l.name == k)
                    .map(|l| l.value.as_str())
            };
            assert_eq!(label("trace_id"), Some("00000000000000000000000000000abc"));
            assert_eq!(label("span_id"), Some("000000000000001f"));
            let ts = e.timestamp.as_ref().expect("timestamp");
            assert_eq!((ts.seconds, ts.nanos), (1_764_578_880, 123_000_000));
        }
        // A failed export leaves nothing.
        store.offer(metric::STEP_DURATION, &attrs, e(0x20));
        store.settle(&[SpanId::from(0x20)], false);
        assert!(text(om, Some(&store)).contains("span_id=\"000000000000001f\""));
    }

    /// One GET of `/metrics` with `accept`: the body.
    fn get(addr: std::net::SocketAddr, accept: &str) -> Vec<u8> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: t\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        )
        .expect("request");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("response");
        let at = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("head");
        assert!(raw.starts_with(b"HTTP/1.1 200"), "{:?}", &raw[..at]);
        raw[at + 4..].to_vec()
    }

    /// The observations of the per-layer section distribution, over all its points.
    fn layer_observations(body: &[u8]) -> u64 {
        use prost::Message as _;
        let mut buf = body;
        let mut n = 0;
        while !buf.is_empty() {
            let f = super::proto::MetricFamily::decode_length_delimited(&mut buf).expect("decode");
            if f.name == "phasetrace_section_layer_duration_seconds" {
                n += f
                    .metric
                    .iter()
                    .map(|m| m.histogram.as_ref().map_or(0, |h| h.sample_count))
                    .sum::<u64>();
            }
        }
        n
    }

    /// (classic `+Inf` count, native count, native spans) of each section histogram point.
    fn sections(body: &[u8]) -> Vec<(u64, u64, usize)> {
        use prost::Message as _;
        let mut buf = body;
        let mut got = Vec::new();
        while !buf.is_empty() {
            let f = super::proto::MetricFamily::decode_length_delimited(&mut buf).expect("decode");
            if f.name != "phasetrace_section_duration_seconds" {
                continue;
            }
            for m in &f.metric {
                let h = m.histogram.as_ref().expect("histogram");
                let inf = h.bucket.last().map_or(0, |b| b.cumulative_count);
                got.push((inf, h.sample_count, h.positive_span.len()));
            }
        }
        got
    }

    #[test]
    fn native_halves_and_layer_distributions_are_recorded_from_the_first_protobuf_scrape_on() {
        use crate::{Profiler, Section, SectionLevel, Site};
        let p = Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .with_trace_every(0)
            .with_prometheus_at(([127, 0, 0, 1], 0))
            .build()
            .expect("profiler");
        let addr = p.prometheus_addr().expect("endpoint");
        let rec = p.recorder();
        let record = |n: u32| {
            for layer in 0..n {
                let _g = rec.section(Section::NORM, layer, Site::NONE);
            }
            p.drain();
        };
        record(3);
        const PROTOBUF: &str = super::encode::PROTOBUF_CONTENT_TYPE;
        // The first protobuf scrape: the classic buckets hold the 3, the native half is empty
        // (nothing asked for it before) but present, so the series is native from the start.
        let first_body = get(addr, PROTOBUF);
        let first = sections(&first_body);
        assert_eq!(first, vec![(3, 0, 1)], "{first:?}");
        // So are the per-layer distributions: only the protobuf scrape reads them.
        assert_eq!(layer_observations(&first_body), 0);
        record(5);
        let second_body = get(addr, PROTOBUF);
        assert_eq!(
            layer_observations(&second_body),
            5,
            "the per-layer distributions count from the first protobuf scrape"
        );
        let second = sections(&second_body);
        assert_eq!(second.len(), 1);
        let (inf, native, spans) = second[0];
        assert_eq!(
            (inf, native),
            (8, 5),
            "the native half counts from the first scrape"
        );
        assert!(spans >= 1);
        // The text scrape is unchanged by all this.
        let text = String::from_utf8(get(addr, "text/plain;version=0.0.4")).expect("utf-8");
        assert!(
            text.contains("phasetrace_section_duration_seconds_count{"),
            "{text}"
        );
        assert!(!text.contains("layer_duration"));
        p.shutdown();
    }

    /// `n` clients on a thread of their own that connect, send nothing (even) or half a head
    /// (odd), and connect again as soon as they are closed, until `stop` is sent.
    pub(crate) fn flood(
        addr: std::net::SocketAddr,
        n: usize,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> std::thread::JoinHandle<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        std::thread::spawn(move || {
            // An attacker's CPU is its own: at the lowest priority here.
            #[cfg(target_os = "linux")]
            // SAFETY: plain integers in and out.
            unsafe {
                let _ = libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("flood runtime");
            rt.block_on(async move {
                let clients: Vec<_> = (0..n)
                    .map(|i| {
                        let mut stop = stop.clone();
                        tokio::spawn(async move {
                            let mut buf = [0u8; 256];
                            while !*stop.borrow() {
                                let Ok(mut c) = tokio::net::TcpStream::connect(addr).await else {
                                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                                    continue;
                                };
                                if i % 2 == 1 {
                                    let _ =
                                        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await;
                                }
                                // Until the endpoint closes it, or the flood ends.
                                loop {
                                    tokio::select! {
                                        r = c.read(&mut buf) => if !matches!(r, Ok(n) if n > 0) {
                                            break;
                                        },
                                        _ = stop.changed() => return,
                                    }
                                }
                            }
                        })
                    })
                    .collect();
                for c in clients {
                    let _ = c.await;
                }
            });
        })
    }

    /// `GET /metrics` on a new connection: the status and how long it took.
    pub(crate) fn timed_get(addr: std::net::SocketAddr) -> (u16, std::time::Duration) {
        use std::io::{Read, Write};
        let t = std::time::Instant::now();
        // Bounded: with the accept queue full, a plain connect retries its SYN for minutes.
        let Ok(mut s) =
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(10))
        else {
            return (0, t.elapsed());
        };
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        .expect("request");
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let status = std::str::from_utf8(raw.get(9..12).unwrap_or_default())
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, t.elapsed())
    }

    #[test]
    fn beyond_the_bound_idle_connections_are_evicted_and_a_scraper_is_answered_at_once() {
        use crate::names::ConnectionClose;
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        use std::time::Duration;
        // Well above the runtime's event interval (61 tasks between two polls of the sockets):
        // a new connection's head is read before a burst of accepts could evict it.
        const BOUND: usize = 256;
        let native = super::Native {
            reader: super::PrometheusReader::manual(),
            wanted: Arc::new(AtomicBool::new(false)),
        };
        let own = crate::export::Reader::new(super::PrometheusReader::manual());
        let server = super::start_with(
            ([127, 0, 0, 1], 0).into(),
            None,
            None,
            own.clone(),
            native,
            BOUND,
        )
        .expect("endpoint");
        // Scrapes collect from a registered reader.
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(own)
            .build();
        let addr = server.addr;
        let closed = server.connections();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        // Three times the bound, reconnecting as soon as they are closed.
        let flood = flood(addr, 3 * BOUND, stopped);
        let t = std::time::Instant::now();
        while closed.get(ConnectionClose::Evicted) < 10 * BOUND as u64 {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the flood never filled the bound"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut took = Vec::new();
        for _ in 0..20 {
            let (status, t) = timed_get(addr);
            assert_eq!(status, 200, "a scrape under the flood (0: closed)");
            took.push(t);
            std::thread::sleep(Duration::from_millis(50));
        }
        let evicted = closed.get(ConnectionClose::Evicted);
        let _ = stop.send(true);
        flood.join().unwrap();
        server.stop();
        drop(provider);
        took.sort();
        let slowest = *took.last().unwrap();
        assert!(
            slowest < Duration::from_secs(1),
            "the slowest of 20 scrapes beside {} reconnecting idle clients took {slowest:?} \
             (median {:?})",
            3 * BOUND,
            took[10]
        );
        assert!(evicted >= 10 * BOUND as u64, "{evicted}");
        assert_eq!(
            closed.get(ConnectionClose::Refused),
            0,
            "none refused: idle ones make room"
        );
    }
}
