//! Jaeger v2 as `scripts/install-tools.sh` builds it (the `jaeger` binary of
//! github.com/jaegertracing/jaeger), running the bundled `otel-config/jaeger.yaml` unchanged
//! (memory storage) with its addresses set through the environment variables that file reads,
//! and queried through its HTTP API v3 (`/api/v3/traces`, `/api/v3/traces/{id}`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::process::{
    Peer, http_get, locate_binary, port_accepts, repo_root, start_on_free_ports, tools_dir,
    url_encode,
};

/// How long [`Jaeger::start`] waits for the query API and the OTLP receiver.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The `jaeger` binary: `$PHASETRACE_JAEGER_BIN`, then `.tools/bin/jaeger`, then `PATH`.
/// Panics when it is missing: tests guard with [`crate::require_tools!`] first.
pub fn jaeger_binary() -> PathBuf {
    find_jaeger().unwrap_or_else(|| panic!("jaeger not found: run scripts/test.sh"))
}

pub(crate) fn find_jaeger() -> Option<PathBuf> {
    locate_binary(
        "PHASETRACE_JAEGER_BIN",
        &[tools_dir().join("bin").join("jaeger")],
        "jaeger",
    )
}

/// The bundled Jaeger v2 configuration, the file docker-compose.yml mounts.
pub fn bundled_jaeger_config() -> PathBuf {
    repo_root().join("otel-config").join("jaeger.yaml")
}

/// One span as Jaeger's API v3 returns it (OTLP JSON), with its resource's attributes.
#[derive(Debug, Clone)]
pub struct JaegerSpan {
    /// Lower-case hex, 32 digits.
    pub trace_id: String,
    /// Lower-case hex, 16 digits.
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// Span attributes, values as strings (`intValue`s in decimal).
    pub attributes: Vec<(String, String)>,
    pub resource: Vec<(String, String)>,
}

impl JaegerSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn resource_attribute(&self, key: &str) -> Option<&str> {
        self.resource
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A running Jaeger v2, killed on drop.
pub struct Jaeger {
    otlp_grpc_port: u16,
    otlp_http_port: u16,
    query_port: u16,
    peer: Peer,
}

impl Jaeger {
    /// Runs the bundled `otel-config/jaeger.yaml` on free loopback ports.
    pub fn start() -> Jaeger {
        let bin = jaeger_binary();
        let config = bundled_jaeger_config();
        let at = |port: u16| format!("127.0.0.1:{port}");
        let (ports, peer) = start_on_free_ports(
            "jaeger",
            START_TIMEOUT,
            |&[grpc, http, query, query_grpc, health, metrics]: &[u16; 6]| {
                let mut command = Command::new(&bin);
                command
                    .arg(format!("--config={}", config.display()))
                    .env("JAEGER_OTLP_GRPC_ENDPOINT", at(grpc))
                    .env("JAEGER_OTLP_HTTP_ENDPOINT", at(http))
                    .env("JAEGER_QUERY_HTTP_ENDPOINT", at(query))
                    .env("JAEGER_QUERY_GRPC_ENDPOINT", at(query_grpc))
                    .env("JAEGER_HEALTH_ENDPOINT", at(health))
                    .env("JAEGER_METRICS_HOST", "127.0.0.1")
                    .env("JAEGER_METRICS_PORT", metrics.to_string());
                command
            },
            |&[grpc, _, query, ..]| {
                let services = format!("http://{}/api/v3/services", at(query));
                matches!(http_get(&services), Ok((200, _))) && port_accepts(grpc)
            },
        );
        let [otlp_grpc_port, otlp_http_port, query_port, ..] = ports;
        Jaeger {
            otlp_grpc_port,
            otlp_http_port,
            query_port,
            peer,
        }
    }

    /// `127.0.0.1:PORT` of the OTLP/gRPC receiver (the collector's `JAEGER_OTLP_ENDPOINT`).
    pub fn otlp_grpc_address(&self) -> String {
        format!("127.0.0.1:{}", self.otlp_grpc_port)
    }

    /// `http://127.0.0.1:PORT` of the OTLP/HTTP receiver.
    pub fn otlp_http_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.otlp_http_port)
    }

    /// `http://127.0.0.1:PORT` of the query service (API and UI).
    pub fn query_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.query_port)
    }

    /// Jaeger's log so far.
    pub fn output(&self) -> String {
        self.peer.output()
    }

    /// `GET path` on the query service: `Ok(Some(json))` for 200, `Ok(None)` for 404 (the API's
    /// answer for "no traces found"), `Err` otherwise.
    pub fn get_json(&self, path_and_query: &str) -> Result<Option<serde_json::Value>, String> {
        let url = format!("{}{path_and_query}", self.query_url());
        let (status, body) = http_get(&url)?;
        match status {
            200 => serde_json::from_str(&body)
                .map(Some)
                .map_err(|e| format!("GET {url}: body is not JSON ({e}): {body}")),
            404 => Ok(None),
            _ => Err(format!("GET {url}: status {status}: {body}")),
        }
    }

    /// The services Jaeger has spans of (`/api/v3/services`).
    pub fn services(&self) -> Result<Vec<String>, String> {
        let json = self.get_json("/api/v3/services")?.unwrap_or_default();
        Ok(json["services"]
            .as_array()
            .map(|names| {
                names
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Spans of the traces of `service` whose root started in the last `within`
    /// (`/api/v3/traces`, at most `num_traces` traces); empty when there are none.
    pub fn find_traces(
        &self,
        service: &str,
        operation: Option<&str>,
        within: Duration,
        num_traces: usize,
    ) -> Result<Vec<JaegerSpan>, String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let min = now.saturating_sub(within);
        let max = now + Duration::from_secs(60);
        let mut query = format!(
            "/api/v3/traces?query.service_name={}&query.start_time_min={}&query.start_time_max={}&query.num_traces={num_traces}",
            url_encode(service),
            url_encode(&rfc3339(min)),
            url_encode(&rfc3339(max)),
        );
        if let Some(operation) = operation {
            query.push_str(&format!("&query.operation_name={}", url_encode(operation)));
        }
        Ok(self
            .get_json(&query)?
            .map(|json| spans_of(&json))
            .unwrap_or_default())
    }

    /// The spans of trace `trace_id` (hex) from `/api/v3/traces/{id}`; empty when Jaeger has
    /// no such trace.
    pub fn trace(&self, trace_id: &str) -> Result<Vec<JaegerSpan>, String> {
        Ok(self
            .get_json(&format!("/api/v3/traces/{}", url_encode(trace_id)))?
            .map(|json| spans_of(&json))
            .unwrap_or_default())
    }
}

/// `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ` for a time since the Unix epoch (UTC, proleptic Gregorian).
pub fn rfc3339(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since_epoch.subsec_nanos()
    )
}

/// The spans in an API v3 answer: `{"result": {"resourceSpans": [...]}}` (OTLP JSON).
pub fn spans_of(json: &serde_json::Value) -> Vec<JaegerSpan> {
    let result = json.get("result").unwrap_or(json);
    let mut spans = Vec::new();
    for resource_spans in result["resourceSpans"].as_array().into_iter().flatten() {
        let resource = attributes_of(&resource_spans["resource"]["attributes"]);
        for scope_spans in resource_spans["scopeSpans"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for span in scope_spans["spans"].as_array().into_iter().flatten() {
                spans.push(JaegerSpan {
                    trace_id: id_hex(&span["traceId"]),
                    span_id: id_hex(&span["spanId"]),
                    parent_span_id: id_hex(&span["parentSpanId"]),
                    name: span["name"].as_str().unwrap_or_default().to_string(),
                    attributes: attributes_of(&span["attributes"]),
                    resource: resource.clone(),
                });
            }
        }
    }
    spans
}

fn attributes_of(list: &serde_json::Value) -> Vec<(String, String)> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|kv| {
            let key = kv["key"].as_str().unwrap_or_default().to_string();
            let value = &kv["value"];
            let text = ["stringValue", "intValue", "doubleValue", "boolValue"]
                .iter()
                .find_map(|kind| value.get(*kind))
                .map(|v| match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .unwrap_or_else(|| value.to_string());
            (key, text)
        })
        .collect()
}

/// A trace or span id as lower-case hex: OTLP JSON writes hex, protobuf's JSON mapping base64.
fn id_hex(value: &serde_json::Value) -> String {
    let text = value.as_str().unwrap_or_default();
    let is_hex = |s: &str| {
        !s.is_empty() && s.len().is_multiple_of(2) && s.bytes().all(|b| b.is_ascii_hexdigit())
    };
    if text.is_empty() || is_hex(text) && (text.len() == 32 || text.len() == 16) {
        return text.to_ascii_lowercase();
    }
    match base64_decode(text) {
        Some(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        None => text.to_ascii_lowercase(),
    }
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0_u32, 0_u32);
    for c in text.bytes().filter(|c| *c != b'=') {
        acc = (acc << 6) | value(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_writes_utc_civil_time() {
        assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            rfc3339(Duration::new(1_709_251_199, 5)),
            "2024-02-29T23:59:59.000000005Z"
        );
    }

    #[test]
    fn ids_read_as_hex_from_hex_or_base64() {
        let hex = "0af7651916cd43dd8448eb211c80319c";
        assert_eq!(id_hex(&serde_json::json!(hex)), hex);
        assert_eq!(id_hex(&serde_json::json!("CvdlGRbNQ92ESOshHIAxnA==")), hex);
        assert_eq!(id_hex(&serde_json::Value::Null), "");
    }
}
