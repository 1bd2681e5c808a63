//! Content negotiation of a scrape: the format from `Accept`, gzip from `Accept-Encoding`
//! (RFC 9110 media ranges and codings with `q` weights).
//!
//! OpenMetrics is served when the scraper prefers it (Prometheus sends
//! `application/openmetrics-text;version=1.0.0,...;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1`);
//! the delimited protobuf format (native histograms) when it is preferred, as Prometheus 3 does
//! with `scrape_native_histograms: true`
//! (`application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited`
//! first); the classic text format otherwise, including when nothing offered is acceptable (as the Go
//! client does). gzip is used when the scraper accepts it with a non-zero weight.

use super::encode::Format;
use std::borrow::Cow;

/// One comma-separated element of a header: its value and parameters, with `q` taken out.
struct Element<'a> {
    value: &'a str,
    params: Vec<(&'a str, Cow<'a, str>)>,
    q: f32,
}

/// `s` split at each `sep` outside a quoted string (RFC 9110 5.6.4: `"..."` with `\`
/// escaping the next character), so that a comma or a semicolon inside a quoted parameter
/// value does not split it.
fn split_unquoted(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    let mut start = 0;
    let (mut quoted, mut escaped) = (false, false);
    let mut cuts = Vec::new();
    for (i, b) in s.bytes().enumerate() {
        match (quoted, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (_, _, b'"') => quoted = !quoted,
            (false, _, b) if b == sep => {
                cuts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    cuts.push(&s[start..]);
    cuts.into_iter()
}

/// A parameter value: a token as is, or a quoted string unquoted (`\x` read as `x`); `None`
/// for a quoted string that is not closed where the value ends.
fn param_value(v: &str) -> Option<Cow<'_, str>> {
    let Some(inner) = v.strip_prefix('"') else {
        return Some(Cow::Borrowed(v));
    };
    let mut out = String::new();
    let mut chars = inner.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?.1),
            '"' => return (i + 1 == inner.len()).then_some(Cow::Owned(out)),
            c => out.push(c),
        }
    }
    None
}

fn elements(header: &str) -> impl Iterator<Item = Element<'_>> {
    split_unquoted(header, b',').filter_map(|item| {
        let mut parts = split_unquoted(item, b';').map(str::trim);
        let value = parts.next().filter(|v| !v.is_empty())?;
        let mut q = 1.0;
        let mut params = Vec::new();
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            // A malformed quoted string drops its element, as a malformed weight does.
            let (k, v) = (k.trim(), param_value(v.trim())?);
            if k.eq_ignore_ascii_case("q") {
                q = v.parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q))?;
            } else {
                params.push((k, v));
            }
        }
        Some(Element { value, params, q })
    })
}

/// The format for an `Accept` header (`None`: no header).
pub(crate) fn format(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Classic;
    };
    // (weight, specificity, format): the highest weight wins, then the more specific range.
    let mut best: Option<(f32, u8, Format)> = None;
    for e in elements(accept) {
        if e.q <= 0.0 {
            continue;
        }
        let param = |name: &str| {
            e.params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_ref())
        };
        let version = param("version");
        let candidate = if e
            .value
            .eq_ignore_ascii_case("application/vnd.google.protobuf")
        {
            // Only the delimited MetricFamily stream (what Prometheus asks for); the text
            // encoding of the same messages is not served.
            (param("proto") == Some("io.prometheus.client.MetricFamily")
                && param("encoding") == Some("delimited"))
            .then_some((2, Format::Protobuf))
        } else if e.value.eq_ignore_ascii_case("application/openmetrics-text") {
            match version {
                None | Some("1.0.0") => Some((2, Format::OpenMetrics { version: "1.0.0" })),
                Some("0.0.1") => Some((2, Format::OpenMetrics { version: "0.0.1" })),
                Some(_) => None,
            }
        } else if e.value.eq_ignore_ascii_case("text/plain") {
            match version {
                None | Some("0.0.4") => Some((2, Format::Classic)),
                Some(_) => None,
            }
        } else if e.value.eq_ignore_ascii_case("text/*") {
            Some((1, Format::Classic))
        } else if e.value == "*/*" {
            Some((0, Format::Classic))
        } else {
            None
        };
        if let Some((spec, f)) = candidate {
            let better = match best {
                None => true,
                Some((bq, bs, _)) => e.q > bq || (e.q == bq && spec > bs),
            };
            if better {
                best = Some((e.q, spec, f));
            }
        }
    }
    best.map_or(Format::Classic, |(_, _, f)| f)
}

/// Whether an `Accept-Encoding` header accepts gzip.
pub(crate) fn gzip(accept_encoding: Option<&str>) -> bool {
    let Some(h) = accept_encoding else {
        return false;
    };
    let mut gzip = None;
    let mut any = None;
    for e in elements(h) {
        if e.value.eq_ignore_ascii_case("gzip") || e.value.eq_ignore_ascii_case("x-gzip") {
            gzip = Some(e.q);
        } else if e.value == "*" {
            any = Some(e.q);
        }
    }
    gzip.or(any).is_some_and(|q| q > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMETHEUS_2: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

    #[test]
    fn prometheus_gets_openmetrics_and_others_the_classic_format() {
        let om = Format::OpenMetrics { version: "1.0.0" };
        assert_eq!(format(Some(PROMETHEUS_2)), om);
        assert_eq!(format(None), Format::Classic);
        assert_eq!(format(Some("*/*")), Format::Classic);
        assert_eq!(format(Some("text/plain")), Format::Classic);
        assert_eq!(format(Some("application/json")), Format::Classic);
        assert_eq!(format(Some("application/openmetrics-text")), om);
        assert_eq!(
            format(Some("application/openmetrics-text; version=0.0.1")),
            Format::OpenMetrics { version: "0.0.1" }
        );
        // The weights decide, not the order.
        assert_eq!(
            format(Some(
                "text/plain;version=0.0.4;q=0.9, application/openmetrics-text;q=0.5"
            )),
            Format::Classic
        );
        assert_eq!(
            format(Some("application/openmetrics-text;q=0, text/plain")),
            Format::Classic
        );
        assert_eq!(
            format(Some(
                "application/openmetrics-text;version=2.0.0, text/plain;q=0.1"
            )),
            Format::Classic
        );
        // A malformed weight drops only its element.
        assert_eq!(
            format(Some("application/openmetrics-text;q=high, */*")),
            Format::Classic
        );
    }

    #[test]
    fn prometheus_with_native_histograms_gets_protobuf() {
        const NATIVE: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
        assert_eq!(format(Some(NATIVE)), Format::Protobuf);
        // Another encoding or message of the same media type is not what is served.
        assert_eq!(
            format(Some(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text, text/plain;q=0.5"
            )),
            Format::Classic
        );
        assert_eq!(
            format(Some("application/vnd.google.protobuf;encoding=delimited")),
            Format::Classic
        );
        // Preferred below OpenMetrics: OpenMetrics.
        assert_eq!(
            format(Some(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.4,application/openmetrics-text;version=1.0.0"
            )),
            Format::OpenMetrics { version: "1.0.0" }
        );
    }

    #[test]
    fn quoted_parameters_are_one_value_commas_and_escapes_included() {
        // A comma inside a quoted value does not start an element (RFC 9110 5.6.4, 12.5.1).
        assert_eq!(
            format(Some(
                "text/plain;q=0.5, application/openmetrics-text;note=\"x,application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited\""
            )),
            Format::OpenMetrics { version: "1.0.0" }
        );
        // Nor a semicolon, and a quoted-pair stands for its character.
        assert_eq!(
            format(Some(
                "application/openmetrics-text;x=\"a;version=2\";version=\"0.0\\.1\""
            )),
            Format::OpenMetrics { version: "0.0.1" }
        );
        assert_eq!(
            format(Some(
                "application/vnd.google.protobuf;proto=\"io.prometheus.client.MetricFamily\";encoding=\"delimited\""
            )),
            Format::Protobuf
        );
        // An unclosed quote drops its element only.
        assert_eq!(
            format(Some(
                "application/openmetrics-text;version=\"1.0.0, text/plain"
            )),
            Format::Classic
        );
        assert_eq!(
            format(Some(
                "text/plain;q=0.1, application/openmetrics-text;version=\"1.0.0\"x"
            )),
            Format::Classic
        );
        assert!(gzip(Some("br;x=\"a,gzip\", gzip")));
        assert!(!gzip(Some("br;x=\"a,gzip\"")));
    }

    #[test]
    fn gzip_only_when_accepted_with_a_weight() {
        assert!(gzip(Some("gzip")));
        assert!(gzip(Some("br, gzip;q=0.5")));
        assert!(gzip(Some("*")));
        assert!(!gzip(Some("gzip;q=0")));
        assert!(!gzip(Some("*, gzip;q=0")));
        assert!(!gzip(Some("identity")));
        assert!(!gzip(None));
    }
}
