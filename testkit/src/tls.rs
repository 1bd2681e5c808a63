//! TLS for the tests: a freshly generated CA and a `localhost` certificate it signed, and a TLS
//! endpoint that forwards the decrypted stream to a plain one (a real collector behind TLS).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// A TLS endpoint (ALPN h2 and http/1.1) on a free loopback port that forwards the decrypted
/// stream to a plain TCP port. Stops when dropped.
pub struct TlsProxy {
    /// Where it listens, on 127.0.0.1 (its certificate names `localhost`).
    pub port: u16,
    _rt: tokio::runtime::Runtime,
}

impl TlsProxy {
    /// Listens with the PEM certificate and key, forwarding every connection to
    /// `127.0.0.1:upstream`.
    pub fn start(upstream: u16, cert_pem: &str, key_pem: &str) -> TlsProxy {
        let acceptor = acceptor(cert_pem, key_pem);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        rt.spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(sock).await else {
                        return;
                    };
                    let Ok(mut up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
        TlsProxy { port, _rt: rt }
    }
}

/// A TLS acceptor (ALPN h2 and http/1.1) with the PEM certificate and key.
pub fn acceptor(cert_pem: &str, key_pem: &str) -> tokio_rustls::TlsAcceptor {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .expect("server certificate PEM");
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("server key PEM");
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server certificate");
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

/// A CA and a `localhost` server certificate signed by it: (ca pem, server cert pem, key pem).
pub fn certificates() -> (String, String, String) {
    certificates_for("localhost")
}

/// A CA and a server certificate for `name` signed by it: (ca pem, server cert pem, key pem).
pub fn certificates_for(name: &str) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("server key");
    let params = CertificateParams::new(vec![name.to_string()]).expect("params");
    let cert = params.signed_by(&key, &issuer).expect("server cert");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}
