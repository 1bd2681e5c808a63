//! OTLP headers and endpoints, general and per signal: no panic; an endpoint's verdict is the
//! same through `with_text` and `config()`; a header value never appears in an error or in
//! `Debug` output.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phasetrace::Profiler;
use phasetrace::names::env;

const MARKER: &str = "Zq9-fuzz-secret";

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let endpoints = [
        env::OTEL_EXPORTER_OTLP_ENDPOINT,
        env::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
        env::OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    ];
    let headers = [
        env::OTEL_EXPORTER_OTLP_HEADERS,
        env::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
        env::OTEL_EXPORTER_OTLP_METRICS_HEADERS,
    ];
    let i = usize::from(pick) % 3;
    // An endpoint: the verdict of `with_text` is that of `config()`.
    let b = Profiler::builder()
        .without_env()
        .with_text(endpoints[i], text);
    if let Ok(b) = b {
        assert!(
            b.config().is_ok(),
            "{}={text:?}: accepted by with_text, refused by config(): {:?}",
            endpoints[i],
            b.config().err()
        );
    }
    // Headers whose values carry the marker: never printed.
    let value = format!("{text}{MARKER}");
    let b = Profiler::builder()
        .without_env()
        .with_otlp_endpoint(Some("https://collector:4317"));
    match b.with_text(headers[i], &value) {
        Err(e) => assert!(!format!("{e} {e:?}").contains(MARKER), "{e}"),
        Ok(b) => {
            assert!(!format!("{b:?}").contains(MARKER));
            match b.config() {
                Err(e) => assert!(!format!("{e} {e:?}").contains(MARKER), "{e}"),
                Ok(c) => assert!(!format!("{c:?}").contains(MARKER)),
            }
        }
    }
});
