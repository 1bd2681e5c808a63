//! The endpoint's web configuration file (`PHASETRACE_PROMETHEUS_WEB_CONFIG`), in the format of
//! the Prometheus exporter-toolkit, so that one file serves phasetrace and the exporters beside
//! it:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt          # PEM chain; paths are relative to this file
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert   # default NoClientCert
//!   client_ca_file: clients-ca.crt
//!   min_version: TLS12             # TLS12 (default) or TLS13; max_version likewise
//! basic_auth_users:
//!   prometheus: $2y$10$...         # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\n')
//! ```
//!
//! Every problem is a [`WebConfigError`] naming the file and the field. Passwords and their
//! hashes never appear in errors, `Debug` output or `check`.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

use super::watched::Files;
use crate::names::env;

/// A web configuration file that cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WebConfigError {
    /// The file cannot be read.
    #[error("{var}={file}: cannot read the web configuration file ({source})", var = env::PROMETHEUS_WEB_CONFIG, file = file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A field is missing, malformed or refers to something unusable.
    #[error("{var}={file}: {field}: {detail}", var = env::PROMETHEUS_WEB_CONFIG, file = file.display())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// The field, as a YAML path (`tls_server_config.cert_file`).
        field: String,
        /// What is wrong and what is expected (never a password or a hash).
        detail: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    /// Taken as a generic mapping: a typed parse could echo a hash in its error.
    basic_auth_users: Option<serde_yaml_ng::Value>,
    http_server_config: Option<serde_yaml_ng::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<String>,
    key_file: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    // exporter-toolkit fields phasetrace refuses by name rather than ignoring.
    cert: Option<serde_yaml_ng::Value>,
    key: Option<serde_yaml_ng::Value>,
    client_ca: Option<serde_yaml_ng::Value>,
    client_allowed_sans: Option<serde_yaml_ng::Value>,
    cipher_suites: Option<serde_yaml_ng::Value>,
    curve_preferences: Option<serde_yaml_ng::Value>,
    prefer_server_cipher_suites: Option<serde_yaml_ng::Value>,
}

/// How client certificates are asked for: the exporter-toolkit's `client_auth_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClientAuth {
    /// None asked for.
    NoClientCert,
    /// Asked for, not required, not verified.
    RequestClientCert,
    /// Required, not verified.
    RequireAnyClientCert,
    /// Verified against `client_ca_file` when given.
    VerifyClientCertIfGiven,
    /// Required and verified against `client_ca_file`.
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    const ALL: [(&'static str, ClientAuth); 5] = [
        ("NoClientCert", ClientAuth::NoClientCert),
        ("RequestClientCert", ClientAuth::RequestClientCert),
        ("RequireAnyClientCert", ClientAuth::RequireAnyClientCert),
        (
            "VerifyClientCertIfGiven",
            ClientAuth::VerifyClientCertIfGiven,
        ),
        (
            "RequireAndVerifyClientCert",
            ClientAuth::RequireAndVerifyClientCert,
        ),
    ];

    pub(crate) fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, a)| *a == self)
            .map_or("NoClientCert", |(n, _)| n)
    }

    /// Whether a client certificate, when given, is verified against `client_ca_file`.
    pub(crate) fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        )
    }

    /// Whether a client without a certificate is refused.
    pub(crate) fn required(self) -> bool {
        matches!(
            self,
            ClientAuth::RequireAnyClientCert | ClientAuth::RequireAndVerifyClientCert
        )
    }
}

/// The loaded configuration: a TLS server configuration and the users allowed in.
#[derive(Clone)]
pub(crate) struct WebConfig {
    pub(crate) file: PathBuf,
    pub(crate) tls: Option<Tls>,
    pub(crate) users: Option<Arc<Users>>,
}

/// The TLS side of a [`WebConfig`].
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) server: Arc<rustls::ServerConfig>,
    pub(crate) client_auth: ClientAuth,
    pub(crate) min_version: &'static str,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("file", &self.file)
            .field("tls", &self.tls.as_ref().map(|t| t.client_auth))
            .field("users", &self.users.as_ref().map(|u| u.len()))
            .finish()
    }
}

impl WebConfig {
    /// What `check` says about it: never a user name, password or hash.
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        match &self.tls {
            Some(t) => parts.push(format!(
                "TLS (at least {}, client certificates: {})",
                t.min_version,
                t.client_auth.as_str()
            )),
            None => parts.push("no TLS".to_owned()),
        }
        match &self.users {
            Some(u) => parts.push(format!("basic auth ({} user(s))", u.len())),
            None => parts.push("no basic auth".to_owned()),
        }
        parts.join(", ")
    }
}

/// Reads and checks the file at `path`.
pub(crate) fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
    read(path, &mut Files::default())
}

/// Reads and checks the file at `path`, noting in `files` each file it read (itself and the
/// certificate, key and CA files it names) as it was when read, so that a change is seen later
/// (see [`super::reload`]); on an error, the files read up to it.
pub(crate) fn read(path: &Path, files: &mut Files) -> Result<WebConfig, WebConfigError> {
    let text = files
        .read(path)
        .and_then(|bytes| {
            String::from_utf8(bytes).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "stream did not contain valid UTF-8",
                )
            })
        })
        .map_err(|source| WebConfigError::Read {
            file: path.to_owned(),
            source,
        })?;
    let bad = |field: &str, detail: String| WebConfigError::Invalid {
        file: path.to_owned(),
        field: field.to_owned(),
        detail,
    };
    let file = parse(&text, &bad)?;
    if file.http_server_config.is_some() {
        return Err(bad(
            "http_server_config",
            "not supported by phasetrace (HTTP/1.1 only, no extra headers): remove it".into(),
        ));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let tls = file
        .tls_server_config
        .map(|t| tls(t, dir, files, &bad))
        .transpose()?;
    let users = file
        .basic_auth_users
        .map(|u| users(u, &bad))
        .transpose()?
        .map(Arc::new);
    Ok(WebConfig {
        file: path.to_owned(),
        tls,
        users,
    })
}

/// `text` (a YAML error) with nothing of the file that could be a secret: what stands between
/// double quotes (serde quotes an unexpected value in full) becomes `…`, and so does what stands
/// between backticks unless it is a plain name (serde's `unknown field` and `expected one of`:
/// a key such as `alice:$2y$...`, a user line missing its space, is not echoed), and any run
/// that reads like a bcrypt hash (`$2` and its alphabet) left elsewhere.
fn redact(text: &str) -> String {
    let plain = |name: &str| {
        name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['"', '`']) {
        let quote = &rest[at..=at];
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let Some(end) = after.find(quote) else {
            // An unclosed quote: what follows it is dropped.
            out.push_str(quote);
            out.push('…');
            return scrub_hashes(&out);
        };
        let inner = &after[..end];
        out.push_str(quote);
        out.push_str(if quote == "`" && plain(inner) {
            inner
        } else {
            "…"
        });
        out.push_str(quote);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    scrub_hashes(&out)
}

/// `text` with each `$2` followed by 20 or more characters of bcrypt's alphabet (`$`, `.`, `/`,
/// letters and digits) replaced by `…`.
fn scrub_hashes(text: &str) -> String {
    let hashy = |c: char| c.is_ascii_alphanumeric() || matches!(c, '$' | '.' | '/');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("$2") {
        out.push_str(&rest[..at]);
        let run = rest[at..]
            .find(|c: char| !hashy(c))
            .unwrap_or(rest.len() - at);
        if run >= 20 {
            out.push('…');
        } else {
            out.push_str(&rest[at..at + run]);
        }
        rest = &rest[at + run..];
    }
    out.push_str(rest);
    out
}

/// The document, refused when it configures nothing: a file that is empty, comments only, `---`,
/// `null` or `{}`, or that names `tls_server_config` or `basic_auth_users` with nothing under it
/// (a file cut right after the key), reads as "no TLS, no basic auth", which is what a file
/// caught half-written looks like, never what an operator means (leaving the variable unset
/// means that).
fn parse(text: &str, bad: &dyn Fn(&str, String) -> WebConfigError) -> Result<File, WebConfigError> {
    use serde_yaml_ng::Value;
    let yaml_error = |e: serde_yaml_ng::Error| {
        // serde quotes an unexpected value in full (`invalid type: string "$2y$..."`): that
        // value may be a bcrypt hash or a password, so what stood between double quotes is not
        // echoed (found by the `web_config` fuzz target).
        let msg = redact(&e.to_string());
        // serde_yaml_ng prefixes the path of the offending field: keep it as the field.
        match msg.split_once(": ") {
            Some((field, rest)) if !field.contains(' ') => bad(field, rest.to_owned()),
            _ => bad("(document)", msg),
        }
    };
    let doc: Value = serde_yaml_ng::from_str(text).map_err(yaml_error)?;
    let nothing = match &doc {
        Value::Null => true,
        Value::Mapping(m) => m.is_empty(),
        _ => false,
    };
    if nothing {
        return Err(bad(
            "(document)",
            format!(
                "configures nothing (empty, comments only, `---`, `null` or `{{}}`, as a file \
                 caught while being written reads): expected tls_server_config, \
                 basic_auth_users or both; to serve plain HTTP without basic auth, unset {}",
                env::PROMETHEUS_WEB_CONFIG
            ),
        ));
    }
    if let Value::Mapping(m) = &doc {
        for (key, what) in [
            ("tls_server_config", "cert_file and key_file"),
            ("basic_auth_users", "user names mapped to bcrypt hashes"),
        ] {
            let empty = match m.get(key) {
                Some(Value::Null) => true,
                Some(Value::Mapping(v)) => key == "basic_auth_users" && v.is_empty(),
                _ => false,
            };
            if empty {
                return Err(bad(
                    key,
                    format!(
                        "empty (as a file cut right after `{key}:` reads): expected {what}; \
                         remove the key to go without it"
                    ),
                ));
            }
        }
    }
    // Parsed again as the typed document: its errors name the field's path.
    serde_yaml_ng::from_str(text).map_err(yaml_error)
}

fn tls(
    t: TlsFile,
    dir: &Path,
    files: &mut Files,
    bad: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<Tls, WebConfigError> {
    refuse_unsupported(&t, bad)?;
    let cert_file = tls_path(dir, "cert_file", t.cert_file, bad)?;
    let key_file = tls_path(dir, "key_file", t.key_file, bad)?;
    let (certs, key) = server_identity(&cert_file, &key_file, files, bad)?;
    let client_auth = client_auth(t.client_auth_type.as_deref(), bad)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = client_verifier(client_auth, t.client_ca_file, dir, files, &provider, bad)?;
    let (min, versions) = protocol_versions(t.min_version, t.max_version, bad)?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| bad("tls_server_config.min_version", e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| {
            bad(
                "tls_server_config.key_file",
                format!(
                    "{}: not usable with cert_file {} ({e})",
                    key_file.display(),
                    cert_file.display()
                ),
            )
        })?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Tls {
        server: Arc::new(server),
        client_auth,
        min_version: if min == 13 { "TLS13" } else { "TLS12" },
    })
}

/// Refuses the fields of exporter-toolkit's `tls_server_config` that phasetrace does not
/// support, saying what to use instead.
fn refuse_unsupported(
    t: &TlsFile,
    bad: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<(), WebConfigError> {
    let unsupported = [
        ("cert", t.cert.is_some(), "use cert_file"),
        ("key", t.key.is_some(), "use key_file"),
        ("client_ca", t.client_ca.is_some(), "use client_ca_file"),
        (
            "client_allowed_sans",
            t.client_allowed_sans.is_some(),
            "restrict clients with client_ca_file",
        ),
        (
            "cipher_suites",
            t.cipher_suites.is_some(),
            "rustls offers only modern suites",
        ),
        (
            "curve_preferences",
            t.curve_preferences.is_some(),
            "rustls picks modern curves",
        ),
        (
            "prefer_server_cipher_suites",
            t.prefer_server_cipher_suites.is_some(),
            "rustls decides",
        ),
    ];
    match unsupported.iter().find(|(_, set, _)| *set) {
        Some((field, _, hint)) => Err(bad(
            &format!("tls_server_config.{field}"),
            format!("not supported by phasetrace ({hint}): remove it"),
        )),
        None => Ok(()),
    }
}

/// The PEM file that `field` names, relative to the web configuration file's folder.
fn tls_path(
    dir: &Path,
    field: &str,
    v: Option<String>,
    bad: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<PathBuf, WebConfigError> {
    match v.filter(|s| !s.trim().is_empty()) {
        Some(s) => Ok(dir.join(s)),
        None => Err(bad(
            &format!("tls_server_config.{field}"),
            "missing: expected the path of a PEM file".into(),
        )),
    }
}

/// The server's certificate chain and private key, read from their PEM files.
fn server_identity(
    cert_file: &Path,
    key_file: &Path,
    files: &mut Files,
    bad: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), WebConfigError> {
    let certs: Vec<CertificateDer<'static>> = files
        .read_pem(cert_file)
        .and_then(|pem| CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            bad(
                "tls_server_config.cert_file",
                format!(
                    "{}: cannot read a PEM certificate ({e})",
                    cert_file.display()
                ),
            )
        })?;
    if certs.is_empty() {
        return Err(bad(
            "tls_server_config.cert_file",
            format!("{}: no PEM certificate in it", cert_file.display()),
        ));
    }
    let key = files
        .read_pem(key_file)
        .and_then(|pem| PrivateKeyDer::from_pem_slice(&pem))
        .map_err(|e| {
            bad(
                "tls_server_config.key_file",
                format!(
                    "{}: cannot read a PEM private key ({e})",
                    key_file.display()
                ),
            )
        })?;
    Ok((certs, key))
}

/// `client_auth_type`, `NoClientCert` when absent.
fn client_auth(
    v: Option<&str>,
    bad: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<ClientAuth, WebConfigError> {
    match v {
        None | Some("") => Ok(ClientAuth::NoClientCert),
        Some(s) => ClientAuth::ALL
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, a)| *a)
            .ok_or_else(|| {
                bad(
                    "tls_server_config.client_auth_type",
                    format!(
                        "{s:?}: expected one of {}",
                        ClientAuth::ALL.map(|(n, _)| n).join(", ")
                    ),
                )
            }),
    }
}

/// How client certificates are checked: not asked for, verified against `client_ca_file`, or
/// asked for without a CA ([`AnyClientCert`]).
fn client_verifier(
    client_auth: ClientAuth,
    client_ca_file: Option<String>,
    dir: &Path,
    files: &mut Files,
    provider: &Arc<rustls::crypto::CryptoProvider>,
    bad: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<Arc<dyn ClientCertVerifier>, WebConfigError> {
    match (client_auth, client_ca_file) {
        (ClientAuth::NoClientCert, Some(_)) => Err(bad(
            "tls_server_config.client_ca_file",
            "set, but client_auth_type is NoClientCert: set client_auth_type to RequireAndVerifyClientCert (or VerifyClientCertIfGiven), or remove client_ca_file".into(),
        )),
        (ClientAuth::NoClientCert, None) => Ok(WebPkiClientVerifier::no_client_auth()),
        (a, None) if a.verifies() => Err(bad(
            "tls_server_config.client_ca_file",
            format!(
                "missing: client_auth_type {} needs the CA that signs client certificates",
                a.as_str()
            ),
        )),
        (a, ca) if a.verifies() => {
            let ca_file = tls_path(dir, "client_ca_file", ca, bad)?;
            let mut roots = rustls::RootCertStore::empty();
            let cas = files
                .read_pem(&ca_file)
                .and_then(|pem| CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>())
                .map_err(|e| {
                    bad(
                        "tls_server_config.client_ca_file",
                        format!("{}: cannot read a PEM certificate ({e})", ca_file.display()),
                    )
                })?;
            let (added, _) = roots.add_parsable_certificates(cas);
            if added == 0 {
                return Err(bad(
                    "tls_server_config.client_ca_file",
                    format!("{}: no usable CA certificate in it", ca_file.display()),
                ));
            }
            let b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let b = if a == ClientAuth::VerifyClientCertIfGiven {
                b.allow_unauthenticated()
            } else {
                b
            };
            b.build().map_err(|e| {
                bad(
                    "tls_server_config.client_ca_file",
                    format!("{}: {e}", ca_file.display()),
                )
            })
        }
        (a, _) => Ok(Arc::new(AnyClientCert {
            required: a.required(),
            provider: provider.clone(),
        })),
    }
}

/// `min_version` (TLS12 when absent) and the protocol versions from it to `max_version` (TLS13
/// when absent).
fn protocol_versions(
    min_version: Option<String>,
    max_version: Option<String>,
    bad: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<(u8, Vec<&'static rustls::SupportedProtocolVersion>), WebConfigError> {
    let version = |field: &str, v: Option<String>, default| match v.as_deref() {
        None | Some("") => Ok(default),
        Some("TLS12") => Ok(12u8),
        Some("TLS13") => Ok(13),
        Some(s) => Err(bad(
            &format!("tls_server_config.{field}"),
            format!("{s:?}: expected TLS12 or TLS13 (rustls has no older versions)"),
        )),
    };
    let min = version("min_version", min_version, 12)?;
    let max = version("max_version", max_version, 13)?;
    if min > max {
        return Err(bad(
            "tls_server_config.min_version",
            "above max_version: expected min_version <= max_version".into(),
        ));
    }
    let versions = [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
        .into_iter()
        .filter(|(v, _)| (min..=max).contains(v))
        .map(|(_, p)| p)
        .collect();
    Ok((min, versions))
}

/// `RequestClientCert` / `RequireAnyClientCert`: a certificate is asked for (required or not)
/// and its handshake signature checked, but it is not verified against any CA.
#[derive(Debug)]
struct AnyClientCert {
    required: bool,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.required
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The users of `basic_auth_users`: names and bcrypt hashes. The endpoint's cache of the
/// credentials that verified is the auth pool's (`auth.rs`): it outlives a reload, and an
/// entry holds only while the user keeps the hash it verified against.
pub(crate) struct Users {
    hashes: Vec<(String, String)>,
    /// A hash at the first user's cost, checked for unknown users so that their answer takes as
    /// long as a known user's (made on first use).
    dummy: std::sync::OnceLock<String>,
}

fn users(
    v: serde_yaml_ng::Value,
    bad: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<Users, WebConfigError> {
    let field = "basic_auth_users";
    let serde_yaml_ng::Value::Mapping(m) = v else {
        return Err(bad(
            field,
            "expected a mapping of user names to bcrypt hashes".into(),
        ));
    };
    let mut hashes = Vec::new();
    for (i, (k, v)) in m.into_iter().enumerate() {
        let entry = format!("{field} (entry {})", i + 1);
        let (serde_yaml_ng::Value::String(user), serde_yaml_ng::Value::String(hash)) = (k, v)
        else {
            return Err(bad(
                &entry,
                "expected a user name mapped to a bcrypt hash, both strings".into(),
            ));
        };
        if user.contains(':') || user.is_empty() {
            return Err(bad(
                &entry,
                "a user name must be non-empty and hold no ':'".into(),
            ));
        }
        if hash.parse::<bcrypt::HashParts>().is_err() {
            return Err(bad(
                &entry,
                "not a bcrypt hash: expected $2a$, $2b$ or $2y$ hashes (htpasswd -nBC 10 \"\" | tr -d ':\\n')".into(),
            ));
        }
        hashes.push((user, hash));
    }
    Ok(Users::new(hashes))
}

impl Users {
    fn new(hashes: Vec<(String, String)>) -> Users {
        Users {
            hashes,
            dummy: std::sync::OnceLock::new(),
        }
    }

    /// Users from `(name, bcrypt hash)` pairs, unchecked.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn for_test(users: &[(&str, &str)]) -> Users {
        Users::new(
            users
                .iter()
                .map(|(u, h)| ((*u).to_owned(), (*h).to_owned()))
                .collect(),
        )
    }

    pub(crate) fn len(&self) -> usize {
        self.hashes.len()
    }

    /// The bcrypt hash of `user`, when the configuration has that user.
    pub(crate) fn hash_of(&self, user: &str) -> Option<&str> {
        self.hashes
            .iter()
            .find(|(u, _)| u == user)
            .map(|(_, h)| h.as_str())
    }

    /// Whether `user:password` may scrape, by bcrypt (blocking: tens of milliseconds at the
    /// usual costs). An unknown user is checked against a dummy hash at the first user's cost,
    /// so that the answer takes as long.
    pub(crate) fn verify(&self, user: &str, password: &[u8]) -> bool {
        let hash = self.hash_of(user);
        let checked = match hash {
            Some(h) => h,
            None => self.dummy.get_or_init(|| {
                let cost = self
                    .hashes
                    .first()
                    .and_then(|(_, h)| h.parse::<bcrypt::HashParts>().ok())
                    .map_or(bcrypt::DEFAULT_COST, |p| p.get_cost());
                bcrypt::hash_with_salt(b"phasetrace", cost, [7; 16])
                    .map(|p| p.format_for_version(bcrypt::Version::TwoY))
                    .unwrap_or_default()
            }),
        };
        bcrypt::verify(password, checked).unwrap_or(false) && hash.is_some()
    }

    /// [`Users::verify`] (blocking).
    #[cfg(test)]
    pub(crate) fn allows(&self, user: &str, password: &[u8]) -> bool {
        self.verify(user, password)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("phasetrace-web-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn err(text: &str, tag: &str) -> String {
        let d = tmp(tag);
        let f = write(&d, "web.yml", text);
        let e = load(&f).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(&f.display().to_string()), "{e}");
        e
    }

    #[test]
    fn a_document_that_is_a_string_holding_a_hash_is_refused_without_echoing_it() {
        // What the `web_config` fuzz target found: serde quoted the whole (string) document,
        // bcrypt hash included, in its error.
        let hash = "$2y$04$8TOHE6wLwOTUBh1Dl9FOXOVlb3FnE4vQ/R1dddddddddddddddddddd";
        let e = err(&format!(")# m)# ma ~{hash}...==)# =m"), "string-doc");
        assert!(!e.contains(hash), "{e}");
        assert!(e.contains("invalid type"), "{e}");
    }

    #[test]
    fn a_key_holding_a_hash_is_refused_without_echoing_it() {
        // What the `web_config` fuzz target found next (2026-12-06): a user line missing the
        // space after its colon is one key, echoed by serde's `unknown field`.
        let hash = "$2y$04$8TOHE6wLwOTU1lhBD8FOphbjXVVlb3FnE4vQ/R2yFnE4vQ/R2yFpPv";
        for (i, text) in [
            format!("ba{hash}tlice:FpPvtlice: $2y$B6Zbpbh"),
            format!("alice:{hash}: x\n"),
            format!("tls_server_config:\n  alice:{hash}: x\n"),
        ]
        .iter()
        .enumerate()
        {
            let e = err(text, &format!("hash-key{i}"));
            assert!(!e.contains(hash) && !e.contains("$2y$04$8TOHE"), "{e}");
            assert!(e.contains("unknown field `…`"), "{e}");
        }
        // Plain names are still named.
        assert!(redact("unknown field `colour`, expected `cert_file`").contains("`colour`"));
        assert_eq!(scrub_hashes("a $2y$10$ short"), "a $2y$10$ short");
        assert_eq!(scrub_hashes(&format!("x {hash} y")), "x … y");
    }

    #[test]
    fn every_bad_field_is_named_and_no_hash_is_echoed() {
        let hash = "$2y$04$8TOHE6wLwOTUBh1Dl8FOXOVlb3FnE4vQ/R1yFpPvtB6ZbphbjW7o6";
        let cases: &[(&str, &str, &str)] = &[
            (
                "tls_server_config:\n  key_file: k.pem\n",
                "tls_server_config.cert_file",
                "missing",
            ),
            (
                "tls_server_config:\n  cert_file: nope.pem\n  key_file: k.pem\n",
                "tls_server_config.cert_file",
                "nope.pem",
            ),
            (
                "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  cipher_suites: [x]\n",
                "tls_server_config.cipher_suites",
                "not supported",
            ),
            (
                "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  colour: red\n",
                "tls_server_config",
                "unknown field `colour`",
            ),
            (
                "basic_auth_users:\n  alice: notahash-s3cret\n",
                "basic_auth_users (entry 1)",
                "not a bcrypt hash",
            ),
            (
                "basic_auth_users:\n  - alice\n",
                "basic_auth_users",
                "mapping",
            ),
            (
                "http_server_config:\n  http2: true\n",
                "http_server_config",
                "not supported",
            ),
            ("weird: 1\n", "(document)", "unknown field `weird`"),
            ("", "(document)", "configures nothing"),
            ("# managed by ...\n", "(document)", "configures nothing"),
            ("---\n", "(document)", "configures nothing"),
            ("{}\n", "(document)", "configures nothing"),
            ("null\n", "(document)", "configures nothing"),
            ("tls_server_config:\n", "tls_server_config", "empty"),
            ("basic_auth_users:\n", "basic_auth_users", "empty"),
            ("basic_auth_users: {}\n", "basic_auth_users", "empty"),
        ];
        for (i, (text, field, detail)) in cases.iter().enumerate() {
            let e = err(text, &format!("bad{i}"));
            assert!(e.contains(&format!(": {field}: ")), "{field}: {e}");
            assert!(e.contains(detail), "{detail}: {e}");
            assert!(!e.contains("s3cret") && !e.contains(hash), "{e}");
        }
        let missing = load(Path::new("/nonexistent/web.yml"))
            .unwrap_err()
            .to_string();
        assert!(
            missing
                .starts_with("PHASETRACE_PROMETHEUS_WEB_CONFIG=/nonexistent/web.yml: cannot read"),
            "{missing}"
        );
    }

    #[test]
    fn users_verify_by_bcrypt_and_unknown_users_fail() {
        let hash = bcrypt::hash("pw", 4).unwrap();
        let d = tmp("users");
        let f = write(
            &d,
            "web.yml",
            &format!("basic_auth_users:\n  alice: '{hash}'\n"),
        );
        let c = load(&f).unwrap();
        let u = c.users.as_ref().unwrap();
        assert!(u.allows("alice", b"pw"));
        assert_eq!(u.hash_of("alice"), Some(hash.as_str()));
        assert_eq!(u.hash_of("bob"), None);
        assert!(!u.allows("alice", b"wrong"));
        assert!(!u.allows("bob", b"pw"));
        assert!(!format!("{c:?}").contains(&hash));
        assert_eq!(c.describe(), "no TLS, basic auth (1 user(s))");
    }
}
