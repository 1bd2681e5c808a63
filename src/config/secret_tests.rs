//! Secrets never print: a marker set in every secret setting, and as the password of every
//! endpoint, through every way in (environment, `with_text`, typed setters), valid or not, is
//! searched for in every output (errors, `Debug`, what `check` prints, warnings).

use super::settings::{AnySetting, SETTINGS};
use super::*;
use crate::Profiler;
use crate::names::env;
use std::collections::BTreeMap;
use std::ffi::OsString;

const MARKER: &str = "S3CRET-MARKER-7f3a";

/// Every output a configuration or its error gives.
fn outputs(r: &Result<Config, ConfigError>) -> Vec<String> {
    match r {
        Ok(c) => {
            let mut out = vec![format!("{c:?}")];
            out.extend(c.alias_warnings.iter().cloned());
            out.extend(SETTINGS.iter().map(|s| s.shown(c)));
            out
        }
        Err(e) => vec![e.to_string(), format!("{e:?}")],
    }
}

fn assert_hidden(what: &str, outs: &[String]) {
    for o in outs {
        assert!(!o.contains(MARKER), "{what}: the secret printed in {o:?}");
    }
}

fn env_of(vars: &[(&str, String)]) -> impl Fn(&str) -> Option<OsString> + use<> {
    let map: BTreeMap<String, OsString> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
        .collect();
    move |k| map.get(k).cloned()
}

/// Values of a secret setting that hold the marker: valid, and refused in each way.
fn secret_texts() -> Vec<String> {
    vec![
        format!("x-api-key={MARKER}"),
        format!("a=b,x-api-key={MARKER}"),
        format!("x-api-key:{MARKER}"),
        format!("x-api-key={MARKER},oops"),
        format!("x-api-key={MARKER}%0A"),
        format!("{MARKER}"),
        format!("bad key={MARKER}"),
    ]
}

/// Endpoints whose password (or user) is the marker, each refused.
fn endpoint_texts() -> Vec<String> {
    vec![
        format!("http://user:{MARKER}@collector:4318"),
        format!("https://{MARKER}@collector:4317"),
        format!("http://user:{MARKER}@collector:4318/a /"),
        format!("http://user:{MARKER}@127.0.0.1:1:2"),
        format!("grpc://user:{MARKER}@collector"),
    ]
}

fn endpoint_vars() -> [&'static str; 3] {
    [
        env::OTEL_EXPORTER_OTLP_ENDPOINT,
        env::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
        env::OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    ]
}

/// An environment where every OTLP setting applies.
fn base() -> Vec<(&'static str, String)> {
    vec![
        (
            env::OTEL_EXPORTER_OTLP_ENDPOINT,
            "https://collector:4317".into(),
        ),
        (env::OTEL_TRACES_EXPORTER, "otlp".into()),
        (env::OTEL_METRICS_EXPORTER, "otlp".into()),
    ]
}

#[test]
fn secret_settings_never_print_from_the_environment() {
    let secrets: Vec<_> = SETTINGS.iter().filter(|s| s.secret()).collect();
    assert!(secrets.len() >= 3, "the general and per-signal headers");
    for s in &secrets {
        for text in secret_texts() {
            let mut vars = base();
            vars.push((s.var(), text.clone()));
            let r = ConfigBuilder::default().resolve_with(env_of(&vars));
            assert_hidden(&format!("{}={text}", s.var()), &outputs(&r));
        }
    }
}

#[test]
fn secret_settings_never_print_from_code() {
    for s in SETTINGS.iter().filter(|s| s.secret()) {
        for text in secret_texts() {
            let what = format!("with_text({}, {text})", s.var());
            match Profiler::builder().without_env().with_text(s.var(), &text) {
                Err(e) => assert_hidden(&what, &[e.to_string(), format!("{e:?}")]),
                Ok(b) => {
                    let b = b.with_otlp_endpoint(Some("https://collector:4317"));
                    assert_hidden(&what, &[format!("{b:?}")]);
                    assert_hidden(&what, &outputs(&b.config()));
                }
            }
        }
    }
    // The typed setter: a valid value, and one refused at `config()`.
    for v in [MARKER.to_owned(), format!("{MARKER}\r\n")] {
        let b = Profiler::builder()
            .without_env()
            .with_otlp_endpoint(Some("https://collector:4317"))
            .with_otlp_headers(vec![("x-api-key".into(), v.clone())]);
        assert_hidden("with_otlp_headers", &[format!("{b:?}")]);
        let r = b.config();
        assert_eq!(r.is_ok(), !v.contains('\n'), "{:?}", r.as_ref().err());
        assert_hidden("with_otlp_headers", &outputs(&r));
    }
    // A misspelled variable may be a secret one.
    let e = Profiler::builder()
        .with_text("OTEL_EXPORTER_OTLP_HEADER", &format!("x-api-key={MARKER}"))
        .unwrap_err();
    assert_hidden("an unknown variable", &[e.to_string(), format!("{e:?}")]);
}

#[test]
fn a_legacy_alias_of_a_secret_setting_never_prints_either_value() {
    let mut b = ConfigBuilder::default();
    b.aliases
        .push(("LEGACY_HEADERS".into(), env::OTEL_EXPORTER_OTLP_HEADERS));
    let mut vars = base();
    vars.push((env::OTEL_EXPORTER_OTLP_HEADERS, format!("k={MARKER}")));
    vars.push(("LEGACY_HEADERS", format!("k={MARKER}-old")));
    let c = b.resolve_with(env_of(&vars)).unwrap();
    assert_eq!(c.alias_warnings.len(), 1, "the disagreement is still said");
    assert_hidden("alias", &outputs(&Ok(c)));
}

#[test]
fn credentials_in_an_endpoint_are_refused_without_being_printed() {
    for var in endpoint_vars() {
        for text in endpoint_texts() {
            let what = format!("{var}={text}");
            let mut vars = base();
            vars.push((var, text.clone()));
            let r = ConfigBuilder::default().resolve_with(env_of(&vars));
            assert!(r.is_err(), "{what}: accepted");
            assert_hidden(&what, &outputs(&r));
            let r = Profiler::builder().without_env().with_text(var, &text);
            let e = r
                .err()
                .unwrap_or_else(|| panic!("with_text {what}: accepted"));
            assert_hidden(&what, &[e.to_string(), format!("{e:?}")]);
        }
    }
    for text in endpoint_texts() {
        let b = Profiler::builder()
            .without_env()
            .with_otlp_endpoint(Some(&text));
        assert_hidden(&text, &[format!("{b:?}")]);
        let r = b.config();
        assert!(r.is_err(), "with_otlp_endpoint({text}): accepted");
        assert_hidden(&text, &outputs(&r));
    }
    let e = ConfigBuilder::default()
        .resolve_with(env_of(&[(
            env::OTEL_EXPORTER_OTLP_ENDPOINT,
            format!("http://user:{MARKER}@collector:4318"),
        )]))
        .unwrap_err();
    assert!(e.to_string().contains("user:****@collector"), "{e}");
    assert!(e.to_string().contains("OTEL_EXPORTER_OTLP_HEADERS"), "{e}");
}

#[test]
fn credentials_are_masked_wherever_a_url_is_echoed() {
    assert_eq!(
        redact_credentials("to http://u:pw@h:1/x and https://tok@h2/?q, ftp://h3"),
        "to http://u:****@h:1/x and https://****@h2/?q, ftp://h3"
    );
    assert_eq!(redact_credentials("no url here: a@b"), "no url here: a@b");
}

#[test]
fn an_empty_per_signal_header_list_inherits_the_general_headers() {
    for empty in [",", " , ,", ",,"] {
        let mut vars = base();
        vars.push((env::OTEL_EXPORTER_OTLP_HEADERS, "x-api-key=general".into()));
        vars.push((env::OTEL_EXPORTER_OTLP_TRACES_HEADERS, empty.into()));
        let c = ConfigBuilder::default()
            .resolve_with(env_of(&vars))
            .unwrap();
        let t = c.traces_otlp.as_ref().unwrap();
        assert_eq!(
            t.headers,
            vec![("x-api-key".into(), "general".into())],
            "{empty:?}"
        );
        assert_eq!(t.headers_var(), env::OTEL_EXPORTER_OTLP_HEADERS);
        // `check` prints it as unset, from the default: what the traces use is the general's.
        assert_eq!(settings::TRACES_HEADERS.shown(&c), "(none)");
        assert_eq!(
            c.origin(env::OTEL_EXPORTER_OTLP_TRACES_HEADERS),
            Origin::Default
        );
    }
}

#[test]
fn endpoints_get_one_verdict_from_text_and_from_config() {
    let cases = [
        ("http://h/a /", false),
        ("http://127.0.0.1:1:2", false),
        ("http://h:99999", false),
        ("http://", false),
        ("http://h\t:1", false),
        ("localhost:4317", false),
        ("http://h?x=1", false),
        ("http://h#f", false),
        ("http://[::1]:4317", true),
        ("https://collector.example:4318/v1/traces", true),
        ("http://127.0.0.1:4318/", true),
    ];
    for (text, ok) in cases {
        let from_text = Profiler::builder()
            .without_env()
            .with_text(env::OTEL_EXPORTER_OTLP_ENDPOINT, text)
            .and_then(|b| b.config());
        let from_setter = Profiler::builder()
            .without_env()
            .with_otlp_endpoint(Some(text))
            .config();
        let from_env = ConfigBuilder::default()
            .resolve_with(env_of(&[(env::OTEL_EXPORTER_OTLP_ENDPOINT, text.into())]));
        for (way, r) in [
            ("with_text", from_text),
            ("setter", from_setter),
            ("env", from_env),
        ] {
            assert_eq!(r.is_ok(), ok, "{way} {text:?}: {:?}", r.err());
        }
    }
}
