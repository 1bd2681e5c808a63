//! The OTLP transport of the exporters built here ([`super::proto_metrics`],
//! [`super::proto_spans`]) is
//! `phasetrace-transport`'s, the one the importer and `phasetrace check` use too; this is the
//! glue: its errors as [`ExportError`]s, and one bounded exchange per export ([`grpc_call`],
//! [`http_call`]) that says why it failed ([`Failure`]). What it reads of the settings is
//! [`OtlpConfig::target`] (`config/transport.rs`), the conversion the importer and `check` use.
//!
//! [`Otlp`] is one signal's sender, gRPC or HTTP as configured; what differs between the
//! signals (their messages and their gRPC service) is a [`Signal`].
//!
//! ```text
//! Otlp::<S>::new(config, runtime) ──grpc──> S::client(channel(target), gzip), metadata, runtime
//!                                 ──http──> http_client(target), the endpoint's URL
//! Otlp::<S>::send(S::Request) ──grpc──> grpc_call(S::export(client, request(message, metadata)))
//!                             ──http──> http_call::<S::Response>(POST url, message's bytes)
//! ```

use super::ExportError;
use crate::config::{OtlpConfig, Protocol};
pub(crate) use phasetrace_transport::{Error, Failure};
#[cfg(feature = "otlp-grpc")]
pub(crate) use phasetrace_transport::{channel, metadata, request, status_failure, status_text};
#[cfg(feature = "otlp-http")]
pub(crate) use phasetrace_transport::{http_client, post};
#[cfg(feature = "otlp-http")]
use prost::Message as _;

/// `e` as the error of exporting `signal` to `o`: an unreadable CA keeps its own variant.
pub(crate) fn export_err(signal: &'static str, o: &OtlpConfig, e: Error) -> ExportError {
    match e {
        Error::Certificate { path, source, .. } => ExportError::Certificate {
            var: o.certificate_var(),
            path: path.display().to_string(),
            source,
        },
        other => ExportError::Otlp {
            signal,
            var: o.endpoint_var(),
            endpoint: o.endpoint.clone(),
            detail: other.to_string(),
        },
    }
}

/// A blocking HTTP client for `o` (see [`phasetrace_transport::http_client`]).
#[cfg(feature = "otlp-http")]
pub(crate) fn client(
    signal: &'static str,
    o: &OtlpConfig,
) -> Result<reqwest::blocking::Client, ExportError> {
    http_client(&o.target()).map_err(|e| export_err(signal, o, e))
}

/// Why an export failed, and what was said (the error's text, never a header value).
pub(crate) type Failed = (Failure, String);

/// One gRPC call on the OTLP runtime, bounded as a whole (head and message) by `timeout`:
/// tonic's own timeout ends at the response's head.
#[cfg(feature = "otlp-grpc")]
pub(crate) async fn grpc_call<T, F>(
    runtime: &tokio::runtime::Handle,
    timeout: std::time::Duration,
    call: F,
) -> Result<T, Failed>
where
    F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
    T: Send + 'static,
{
    // On the OTLP runtime: the timer and the channel need its reactor; the caller only waits.
    let task = runtime.spawn(phasetrace_transport::within(timeout, call));
    match task.await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(status)) => Err((status_failure(&status), status_text(&status))),
        Err(e) => Err((Failure::Other, format!("the export task failed: {e}"))),
    }
}

/// One OTLP/HTTP POST of `body` to `url` (the client's timeout bounds it, the answer read up to
/// [`phasetrace_transport::MAX_RESPONSE_BYTES`]); a 2xx answer must decode as `R`, the
/// signal's OTLP response.
#[cfg(feature = "otlp-http")]
pub(crate) fn http_call<R: prost::Message + Default>(
    client: &reqwest::blocking::Client,
    o: &OtlpConfig,
    url: &str,
    body: Vec<u8>,
) -> Result<R, Failed> {
    let bytes = post(client, &o.target(), url, body).map_err(|e| (e.failure(), e.to_string()))?;
    R::decode(bytes.as_slice()).map_err(|e| {
        (
            Failure::BadResponse,
            format!("answered 2xx with a body that is not an OTLP response ({e})"),
        )
    })
}

/// The error of exporting `signal` to `o`, for `detail`.
pub(crate) fn otlp_err(
    signal: &'static str,
    o: &OtlpConfig,
    detail: impl std::fmt::Display,
) -> ExportError {
    ExportError::Otlp {
        signal,
        var: o.endpoint_var(),
        endpoint: o.endpoint.clone(),
        detail: detail.to_string(),
    }
}

/// What one OTLP signal's exchange has of its own: its name, its messages and its gRPC
/// service's client. The rest is [`Otlp`]'s.
pub(crate) trait Signal: 'static {
    /// The signal as errors name it: `traces` or `metrics`.
    const NAME: &'static str;
    /// The export request.
    type Request: prost::Message + Send + 'static;
    /// The export response, decoded from a 2xx OTLP/HTTP answer.
    #[cfg(feature = "otlp-http")]
    type Response: prost::Message + Default;
    /// The signal's gRPC service client.
    #[cfg(feature = "otlp-grpc")]
    type Client: Clone + Send + Sync + 'static;
    /// The client over `channel`: answers read up to
    /// [`phasetrace_transport::MAX_RESPONSE_BYTES`], requests gzipped if `gzip`.
    #[cfg(feature = "otlp-grpc")]
    fn client(channel: tonic::transport::Channel, gzip: bool) -> Self::Client;
    /// One export call on `client` (its answer's message dropped).
    #[cfg(feature = "otlp-grpc")]
    fn export(
        client: Self::Client,
        request: tonic::Request<Self::Request>,
    ) -> impl std::future::Future<Output = Result<tonic::Response<()>, tonic::Status>> + Send + 'static;
}

/// Declares a [`Signal`] `$ty` from its name, its OTLP request and response messages and its
/// tonic service client (generic over the channel): what the span and the metric exporters
/// each declare in one line.
macro_rules! signal {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $request:ty, $response:ty, $client:ident) => {
        $(#[$doc])*
        pub(crate) struct $ty;

        impl $crate::export::transport::Signal for $ty {
            const NAME: &'static str = $name;
            type Request = $request;
            #[cfg(feature = "otlp-http")]
            type Response = $response;
            #[cfg(feature = "otlp-grpc")]
            type Client = $client<tonic::transport::Channel>;

            #[cfg(feature = "otlp-grpc")]
            fn client(channel: tonic::transport::Channel, gzip: bool) -> Self::Client {
                let client = $client::new(channel)
                    .max_decoding_message_size(phasetrace_transport::MAX_RESPONSE_BYTES);
                match gzip {
                    true => client.send_compressed(tonic::codec::CompressionEncoding::Gzip),
                    false => client,
                }
            }

            #[cfg(feature = "otlp-grpc")]
            async fn export(
                mut client: Self::Client,
                request: tonic::Request<Self::Request>,
            ) -> Result<tonic::Response<()>, tonic::Status> {
                client.export(request).await.map(|r| r.map(drop))
            }
        }
    };
}
pub(crate) use signal;

enum Way<S: Signal> {
    #[cfg(feature = "otlp-grpc")]
    Grpc {
        client: S::Client,
        metadata: Box<tonic::metadata::MetadataMap>,
        /// The OTLP runtime, which drives the channel and each export.
        runtime: tokio::runtime::Handle,
    },
    #[cfg(feature = "otlp-http")]
    Http {
        client: reqwest::blocking::Client,
        url: String,
        /// The signal, named here for a build without gRPC (whose variant names it).
        signal: std::marker::PhantomData<fn() -> S>,
    },
}

/// One signal's OTLP sender: the configured protocol's client, and the settings it was built
/// from.
pub(crate) struct Otlp<S: Signal> {
    way: Way<S>,
    otlp: OtlpConfig,
}

impl<S: Signal> std::fmt::Debug for Otlp<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Otlp")
            .field("signal", &S::NAME)
            .field("protocol", &self.otlp.protocol)
            .field("endpoint", &self.otlp.endpoint)
            .finish()
    }
}

impl<S: Signal> Otlp<S> {
    /// The sender for `o`; gRPC needs `rt`, the OTLP runtime.
    pub(crate) fn new(
        o: &OtlpConfig,
        rt: Option<&tokio::runtime::Runtime>,
    ) -> Result<Self, ExportError> {
        let _ = &rt;
        let way = match (o.protocol, rt) {
            #[cfg(feature = "otlp-grpc")]
            (Protocol::Grpc, Some(rt)) => {
                let channel = {
                    let _guard = rt.enter();
                    channel(&o.target()).map_err(|e| export_err(S::NAME, o, e))?
                };
                let metadata = metadata(&o.target()).map_err(|e| otlp_err(S::NAME, o, e))?;
                Way::Grpc {
                    client: S::client(channel, o.gzip),
                    metadata: Box::new(metadata),
                    runtime: rt.handle().clone(),
                }
            }
            #[cfg(feature = "otlp-grpc")]
            (Protocol::Grpc, None) => {
                return Err(otlp_err(S::NAME, o, "no runtime for the gRPC channel"));
            }
            #[cfg(feature = "otlp-http")]
            (Protocol::HttpProtobuf, _) => Way::Http {
                client: client(S::NAME, o)?,
                url: o.endpoint.clone(),
                signal: std::marker::PhantomData,
            },
            #[allow(unreachable_patterns)]
            (p, _) => {
                return Err(otlp_err(
                    S::NAME,
                    o,
                    format!("this build of phasetrace has no OTLP {p} exporter"),
                ));
            }
        };
        Ok(Otlp {
            way,
            otlp: o.clone(),
        })
    }

    /// One export of `message`, bounded by the OTLP timeout; why it failed if it did.
    pub(crate) async fn send(&self, message: S::Request) -> Result<(), Failed> {
        match &self.way {
            #[cfg(feature = "otlp-grpc")]
            Way::Grpc {
                client,
                metadata,
                runtime,
            } => {
                let call = S::export(client.clone(), request(message, metadata));
                grpc_call(runtime, self.otlp.timeout, call).await
            }
            #[cfg(feature = "otlp-http")]
            Way::Http { client, url, .. } => {
                http_call::<S::Response>(client, &self.otlp, url, message.encode_to_vec()).map(drop)
            }
        }
    }
}
