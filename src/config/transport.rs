//! The OTLP settings as the transport reads them: the one conversion from an [`OtlpConfig`] to
//! a `phasetrace-transport` [`Target`], which the live exporters, the importer and
//! `phasetrace check` all send with.
//!
//! ```text
//! OtlpConfig ──target()──> phasetrace_transport::Target ──> channel, metadata, tls, http_client, post
//! ```

use super::OtlpConfig;
use phasetrace_transport::Target;

impl OtlpConfig {
    /// What the transport reads of this connection: endpoint, headers, timeout, gzip, the CA,
    /// and the variables its headers and CA came from (for errors that name them).
    pub fn target(&self) -> Target<'_> {
        Target {
            endpoint: &self.endpoint,
            headers: &self.headers,
            timeout: self.timeout,
            gzip: self.gzip,
            certificate: self.certificate.as_deref(),
            headers_var: self.headers_var(),
            certificate_var: self.certificate_var(),
        }
    }
}
