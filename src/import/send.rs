//! Sends imported data to a collector over OTLP/HTTP, keeping the logs' timestamps (the SDK's
//! exporters stamp data with the export time, so they cannot).
//!
//! ```text
//! ImportedFile ──otlp::{metrics,trace}_requests──> proto messages ──encode──> protobuf ──POST──> {endpoint}/v1/{metrics,traces}
//! ```
//!
//! The requests (the same messages the `otlp-json` output writes as JSON) are sent as
//! `application/x-protobuf`: every OTLP/HTTP receiver must accept protobuf, while JSON support
//! varies (rotel's JSON decoding drops histograms, for one).

use super::otlp::{self, OtlpOptions, OtlpStats};
use super::{ImportError, ImportedFile};
use crate::config::OtlpConfig;

/// What was sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Metric requests and their data points.
    pub metrics: OtlpStats,
    /// Trace requests and their spans.
    pub traces: OtlpStats,
}

fn post<M: prost::Message>(
    client: &reqwest::blocking::Client,
    otlp: &OtlpConfig,
    url: &str,
    msg: M,
) -> Result<(), ImportError> {
    let send_err = |detail: String| ImportError::Send {
        url: url.to_owned(),
        detail,
    };
    let mut req = client
        .post(url)
        .header("content-type", "application/x-protobuf")
        .body(msg.encode_to_vec());
    for (k, v) in &otlp.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    // reqwest's error text names the URL, never header values.
    let resp = req.send().map_err(|e| send_err(e.to_string()))?;
    let status = resp.status();
    if status.is_success() {
        Ok(())
    } else {
        let text = resp.text().unwrap_or_default();
        Err(send_err(format!(
            "answered {status}: {}",
            text.chars().take(200).collect::<String>()
        )))
    }
}

/// Posts every metric and trace request of `files` to the OTLP/HTTP endpoint of `otlp`
/// (`/v1/metrics`, `/v1/traces`), with its headers, timeout and TLS settings. The endpoint must
/// accept OTLP/HTTP (port 4318 by convention), whatever `OTEL_EXPORTER_OTLP_PROTOCOL` says.
pub fn send(
    files: &[ImportedFile],
    otlp: &OtlpConfig,
    options: &OtlpOptions,
) -> Result<SendStats, ImportError> {
    let client =
        crate::export::otlp::http_client("import", otlp).map_err(|e| ImportError::Send {
            url: otlp.endpoint.clone(),
            detail: e.to_string(),
        })?;
    let metrics_url = format!("{}/v1/metrics", otlp.endpoint);
    let traces_url = format!("{}/v1/traces", otlp.endpoint);
    let metrics =
        otlp::metrics_requests(files, options, |req| post(&client, otlp, &metrics_url, req))?;
    let traces = otlp::trace_requests(files, options, |req| post(&client, otlp, &traces_url, req))?;
    Ok(SendStats { metrics, traces })
}
