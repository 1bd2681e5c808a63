//! The resolution's tests: every setting parses its valid values and an invalid one names
//! the variable, the value and what is accepted; code beats the environment and says so;
//! legacy aliases, the per-signal OTLP rules and the built-in Prometheus address.

use super::*;
use crate::names::env;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

fn resolve(b: &ConfigBuilder, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: BTreeMap<String, OsString> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), OsString::from(v)))
        .collect();
    b.resolve_with(|k| map.get(k).cloned())
}

fn env(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    resolve(&ConfigBuilder::default(), vars)
}

#[test]
fn defaults_are_off_with_the_embedded_prometheus_endpoint() {
    let c = env(&[]).unwrap();
    assert_eq!(c.level, SectionLevel::Off);
    assert_eq!(c.spec_level, SpecLevel::Off);
    assert_eq!(c.trace_every, 100);
    assert_eq!(c.trace_slower_than, TraceSlowerThan::Percentile(99.0));
    assert_eq!(c.trace_slow_budget, 5);
    assert_eq!(c.graph_read_every, 1, "every CUDA-graph replay is read");
    assert!(c.layer_attr);
    assert_eq!(c.summary_every, 0);
    assert_eq!(c.prometheus, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!(c.queue, 65_536);
    assert_eq!(c.rank, 0);
    assert_eq!(c.group, "default");
    assert_eq!(c.timing, Timing::Host);
    assert_eq!(c.service_name, "phasetrace");
    assert!(c.otlp.is_none());
    assert!(!c.is_enabled());
    assert!(c.origins.is_empty());
}

#[test]
fn every_variable_parses_its_valid_values() {
    let c = env(&[
        ("PHASETRACE_LEVEL", "collectives"),
        ("PHASETRACE_SPEC_LEVEL", "2"),
        ("PHASETRACE_TRACE_EVERY", "0"),
        ("PHASETRACE_LAYER_ATTR", "off"),
        ("PHASETRACE_SUMMARY_EVERY", "8"),
        ("PHASETRACE_SPEC_SUMMARY_EVERY", "16"),
        ("PHASETRACE_PROMETHEUS", "127.0.0.1:9999"),
        ("PHASETRACE_QUEUE", "1024"),
        ("PHASETRACE_RANK", "3"),
        ("PHASETRACE_GROUP", "tp-1.node:a_b"),
        ("PHASETRACE_EXPERT_COUNTER", "on"),
        ("PHASETRACE_TIMING", "events"),
        ("OTEL_SERVICE_NAME", "engine"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=prod,host.gpu=h200",
        ),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cr%3Dt"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        (
            "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
            "base2_exponential_bucket_histogram",
        ),
        ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
        ("OTEL_TRACES_EXPORTER", "otlp"),
        ("OTEL_METRICS_EXPORTER", "otlp,prometheus"),
    ])
    .unwrap();
    assert_eq!(c.level, SectionLevel::Collectives);
    assert_eq!(c.spec_level, SpecLevel::VerifySplit);
    assert_eq!(c.trace_every, 0);
    assert!(!c.layer_attr);
    assert_eq!(c.summary_every, 8);
    assert_eq!(c.spec_summary_every, 16);
    assert_eq!(c.prometheus, Some("127.0.0.1:9999".parse().unwrap()));
    assert_eq!(c.queue, 1024);
    assert_eq!(c.rank, 3);
    assert_eq!(c.group, "tp-1.node:a_b");
    assert!(c.expert_counter);
    assert_eq!(c.timing, Timing::Events);
    assert_eq!(c.service_name, "engine");
    assert_eq!(c.resource_attributes.len(), 2);
    let o = c.otlp.as_ref().unwrap();
    assert_eq!(o.endpoint, "http://127.0.0.1:4318");
    assert_eq!(o.protocol, Protocol::HttpProtobuf);
    assert_eq!(o.headers, vec![("api-key".into(), "s3cr=t".into())]);
    assert_eq!(o.timeout, Duration::from_millis(2500));
    assert!(o.gzip);
    assert_eq!(o.histogram, HistogramAggregation::Exponential);
    assert_eq!(c.metric_export_interval, Duration::from_millis(500));
    assert!(c.traces_otlp.is_some() && c.metrics_otlp.is_some());
    assert_eq!(c.origins.get("PHASETRACE_LEVEL"), Some(&Origin::Env));
    assert!(!format!("{c:?}").contains("s3cr"), "headers leak in Debug");
}

#[test]
fn a_slow_step_threshold_is_a_duration_a_percentile_or_off() {
    let ok = |s: &str| s.parse::<TraceSlowerThan>().unwrap();
    let d = TraceSlowerThan::Duration;
    assert_eq!(ok("25ms"), d(Duration::from_millis(25)));
    assert_eq!(ok("1.5s"), d(Duration::from_millis(1500)));
    assert_eq!(ok("800us"), d(Duration::from_micros(800)));
    assert_eq!(ok("800µs"), d(Duration::from_micros(800)));
    assert_eq!(ok("2500ns"), d(Duration::from_nanos(2500)));
    assert_eq!(ok("p99"), TraceSlowerThan::Percentile(99.0));
    assert_eq!(ok("P99.9"), TraceSlowerThan::Percentile(99.9));
    assert_eq!(ok("off"), TraceSlowerThan::Off);
    for bad in [
        "fast", "p0", "p101", "p100", "-3ms", "0ms", "25", "ms", "p", "3 ms", "1e3ms",
    ] {
        let e = env(&[("PHASETRACE_TRACE_SLOWER_THAN", bad)])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("PHASETRACE_TRACE_SLOWER_THAN="), "{bad}: {e}");
        assert!(e.contains(TraceSlowerThan::EXPECTED), "{bad}: {e}");
    }
    for v in ["25ms", "p99", "off", "1.5s"] {
        assert_eq!(
            ok(&ok(v).to_string()),
            ok(v),
            "{v} round-trips through Display"
        );
    }
    let mut code = ConfigBuilder::default();
    code.set(&settings::TRACE_SLOWER_THAN, TraceSlowerThan::Off);
    let c = resolve(&code, &[("PHASETRACE_TRACE_SLOWER_THAN", "p90")]).unwrap();
    assert_eq!(c.trace_slower_than, TraceSlowerThan::Off);
    assert_eq!(c.origin("PHASETRACE_TRACE_SLOWER_THAN"), Origin::Code);
}

#[test]
fn every_invalid_value_names_the_variable_value_and_what_is_accepted() {
    let cases: &[(&str, &str, &str)] = &[
        ("PHASETRACE_LEVEL", "7", "off, 0, full, 1, collectives or 2"),
        (
            "PHASETRACE_SPEC_LEVEL",
            "3",
            "off, 0, phases, 1, verify or 2",
        ),
        ("PHASETRACE_TRACE_EVERY", "-1", "whole number"),
        (
            "PHASETRACE_TRACE_SLOWER_THAN",
            "fast",
            "a duration with a unit",
        ),
        ("PHASETRACE_TRACE_SLOWER_THAN", "p0", "p0.1 to p99.9"),
        ("PHASETRACE_TRACE_SLOWER_THAN", "p101", "p0.1 to p99.9"),
        (
            "PHASETRACE_TRACE_SLOWER_THAN",
            "-3ms",
            "a duration with a unit",
        ),
        ("PHASETRACE_TRACE_SLOWER_THAN", "25", "(25ms, 1.5s, 800us)"),
        ("PHASETRACE_TRACE_SLOW_BUDGET", "0", "from 1 to 10000"),
        (
            "PHASETRACE_GRAPH_READ_EVERY",
            "all",
            "a whole number of replays (1 = every replay, 0 = none)",
        ),
        ("PHASETRACE_LAYER_ATTR", "maybe", "on, off"),
        ("PHASETRACE_SUMMARY_EVERY", "x", "whole number"),
        ("PHASETRACE_SPEC_SUMMARY_EVERY", "1.5", "whole number"),
        ("PHASETRACE_PROMETHEUS", "nowhere", "host:port"),
        ("PHASETRACE_QUEUE", "10", "64 to 16777216"),
        ("PHASETRACE_RANK", "first", "whole number"),
        ("RANK", "-2", "whole number"),
        ("PHASETRACE_GROUP", "tp 0", "letters, digits"),
        ("PHASETRACE_GROUP", "tp/0", "letters, digits"),
        ("PHASETRACE_EXPERT_COUNTER", "2", "on, off"),
        ("PHASETRACE_MOE_EXPERTS", "70000", "from 0 to 65536"),
        ("PHASETRACE_EXPERT_WINDOW", "0", "from 1 to 1000000"),
        ("PHASETRACE_EXPERT_TOP", "11", "from 0 to 10"),
        ("PHASETRACE_EXPERT_PARALLEL", "-1", "from 0 to 65536"),
        ("PHASETRACE_TIMING", "gpu", "host, sync or events"),
        ("OTEL_SDK_DISABLED", "yes", "true or false"),
        ("OTEL_RESOURCE_ATTRIBUTES", "novalue", "key=value"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317", "http://"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:99999", "http://"),
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "http/json",
            "grpc or http/protobuf",
        ),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "0", "milliseconds"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd", "gzip or none"),
        (
            "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
            "sum",
            "explicit_bucket_histogram",
        ),
        ("OTEL_METRIC_EXPORT_INTERVAL", "soon", "milliseconds"),
        ("OTEL_TRACES_EXPORTER", "jaeger", "otlp, console, none"),
        ("OTEL_TRACES_EXPORTER", "prometheus", "otlp, console, none"),
        ("OTEL_METRICS_EXPORTER", "otlp,statsd", "otlp, prometheus"),
    ];
    for (var, value, expected) in cases {
        let err = env(&[(var, value)]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("{var}=")), "{var}: {msg}");
        assert!(msg.contains(value), "{var}: {msg}");
        assert!(msg.contains(expected), "{var}: {msg}");
    }
}

#[test]
fn malformed_headers_never_echo_their_values() {
    let err = env(&[("OTEL_EXPORTER_OTLP_HEADERS", "api-key:topsecret")]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{msg}");
    assert!(!msg.contains("topsecret"), "{msg}");
}

#[cfg(unix)]
#[test]
fn non_utf8_values_are_errors_naming_the_variable() {
    use std::os::unix::ffi::OsStringExt;
    let bad = OsString::from_vec(vec![0x66, 0xff, 0x6f]);
    let err = ConfigBuilder::default()
        .resolve_with(|k| (k == "PHASETRACE_LEVEL").then(|| bad.clone()))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "PHASETRACE_LEVEL is not valid UTF-8: expected off, 0, full, 1, collectives or 2"
    );
}

#[test]
fn code_beats_env_and_records_its_origin() {
    let mut b = ConfigBuilder::default();
    b.set(&settings::LEVEL, SectionLevel::Full);
    b.set(&settings::RANK, 7);
    b.set(&settings::GROUP, "tp1".to_owned());
    let c = resolve(
        &b,
        &[
            ("PHASETRACE_LEVEL", "2"),
            ("PHASETRACE_RANK", "1"),
            ("PHASETRACE_GROUP", "tp0"),
        ],
    )
    .unwrap();
    assert_eq!(c.level, SectionLevel::Full);
    assert_eq!(c.rank, 7);
    assert_eq!(c.group, "tp1");
    assert_eq!(c.origins.get("PHASETRACE_LEVEL"), Some(&Origin::Code));
    assert_eq!(c.origins.get("PHASETRACE_GROUP"), Some(&Origin::Code));
}

#[test]
fn rank_falls_back_to_launcher_variables_and_explicit_wins() {
    assert_eq!(env(&[("LOCAL_RANK", "5")]).unwrap().rank, 5);
    assert_eq!(env(&[("RANK", "2"), ("LOCAL_RANK", "5")]).unwrap().rank, 2);
    assert_eq!(
        env(&[("PHASETRACE_RANK", "1"), ("RANK", "2")])
            .unwrap()
            .rank,
        1
    );
}

#[test]
fn legacy_alias_is_honored_and_the_phasetrace_name_wins_loudly() {
    let b = ConfigBuilder {
        aliases: vec![("METRALE_GLM_PROFILE".into(), env::LEVEL)],
        ..Default::default()
    };
    let alone = resolve(&b, &[("METRALE_GLM_PROFILE", "2")]).unwrap();
    assert_eq!(alone.level, SectionLevel::Collectives);
    assert!(alone.alias_warnings.is_empty());
    let both = resolve(
        &b,
        &[("METRALE_GLM_PROFILE", "2"), ("PHASETRACE_LEVEL", "1")],
    )
    .unwrap();
    assert_eq!(both.level, SectionLevel::Full);
    assert_eq!(both.alias_warnings.len(), 1);
    assert!(both.alias_warnings[0].contains("PHASETRACE_LEVEL=1 overrides METRALE_GLM_PROFILE=2"));
    let agree = resolve(
        &b,
        &[("METRALE_GLM_PROFILE", "1"), ("PHASETRACE_LEVEL", "full")],
    )
    .unwrap();
    assert!(agree.alias_warnings.is_empty());
    let bad = resolve(&b, &[("METRALE_GLM_PROFILE", "yes")]).unwrap_err();
    assert!(bad.to_string().starts_with("METRALE_GLM_PROFILE=\"yes\""));
}

#[test]
fn the_shutdown_timeout_is_a_setting_with_a_variable() {
    let c = env(&[("PHASETRACE_SHUTDOWN_TIMEOUT", "1500")]).unwrap();
    assert_eq!(c.shutdown_timeout, Duration::from_millis(1500));
    assert_eq!(c.origin(env::SHUTDOWN_TIMEOUT), Origin::Env);
    let d = env(&[]).unwrap();
    assert_eq!(d.shutdown_timeout, Duration::from_secs(5));
    let e = env(&[("PHASETRACE_SHUTDOWN_TIMEOUT", "soon")]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("PHASETRACE_SHUTDOWN_TIMEOUT=\"soon\""),
        "{e}"
    );
}

#[test]
fn a_spec_level_alias_set_to_another_level_loses_loudly() {
    let b = ConfigBuilder {
        aliases: vec![("MEMRA_SPEC_TRACE".into(), env::SPEC_LEVEL)],
        ..Default::default()
    };
    let c = resolve(
        &b,
        &[("MEMRA_SPEC_TRACE", "1"), ("PHASETRACE_SPEC_LEVEL", "2")],
    )
    .unwrap();
    assert_eq!(c.spec_level, SpecLevel::VerifySplit);
    assert_eq!(
        c.alias_warnings,
        vec![
            "PHASETRACE_SPEC_LEVEL=2 overrides MEMRA_SPEC_TRACE=1 (the phasetrace name wins; unset one to silence this)"
        ]
    );
    let alone = resolve(&b, &[("MEMRA_SPEC_TRACE", "2")]).unwrap();
    assert_eq!(alone.spec_level, SpecLevel::VerifySplit);
}

#[test]
fn a_prometheus_port_can_be_offset_by_the_rank() {
    let c = env(&[
        ("PHASETRACE_PROMETHEUS", "127.0.0.1:9464+rank"),
        ("LOCAL_RANK", "3"),
    ])
    .unwrap();
    assert_eq!(c.prometheus, Some("127.0.0.1:9467".parse().unwrap()));
    let err = env(&[
        ("PHASETRACE_PROMETHEUS", "127.0.0.1:65535+rank"),
        ("RANK", "1"),
    ])
    .unwrap_err();
    assert!(err.to_string().contains("host:port+rank"), "{err}");
}

#[test]
fn an_otlp_endpoint_turns_the_embedded_prometheus_default_off() {
    let c = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")]).unwrap();
    assert!(c.prometheus.is_none());
    assert!(c.traces_otlp.is_some() && c.metrics_otlp.is_some());
    assert_eq!(c.otlp.unwrap().protocol, Protocol::Grpc);
    let off = env(&[("PHASETRACE_PROMETHEUS", "off")]).unwrap();
    assert!(off.prometheus.is_none());
    let err = env(&[("OTEL_TRACES_EXPORTER", "otlp")]).unwrap_err();
    assert!(err.to_string().contains("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let console = env(&[("OTEL_METRICS_EXPORTER", "console")]).unwrap();
    assert_eq!(console.summary_every, 100);
}

/// The environment every walk starts from: an https endpoint, so that the OTLP settings
/// (the CA included) apply.
const BASE: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4317");

fn walk_check(c: &Config, label: &str) {
    for s in settings::SETTINGS {
        if let Err(e) = s.round_trips(c) {
            panic!("{label}: {e}");
        }
    }
}

#[test]
fn every_setting_prints_what_it_parses_and_says_where_it_came_from() {
    // Default: the base endpoint only.
    let defaults = env(&[BASE]).unwrap();
    walk_check(&defaults, "defaults");
    for s in settings::SETTINGS {
        let expect = if s.var() == BASE.0 {
            Origin::Env
        } else {
            Origin::Default
        };
        assert_eq!(defaults.origin(s.var()), expect, "{}", s.var());
    }
    // Each setting from the environment, then from code: its example value, printed back.
    for s in settings::SETTINGS {
        let mut vars = vec![BASE, (s.var(), s.example())];
        if s.var() == BASE.0 {
            vars.remove(0);
        }
        let from_env = env(&vars).unwrap_or_else(|e| panic!("{}: {e}", s.var()));
        assert_eq!(from_env.origin(s.var()), Origin::Env, "{}", s.var());
        walk_check(&from_env, s.var());

        let mut b = ConfigBuilder::default();
        b.set_text(*s, s.example()).unwrap();
        let from_code = resolve(&b, &[BASE]).unwrap_or_else(|e| panic!("{}: {e}", s.var()));
        assert_eq!(from_code.origin(s.var()), Origin::Code, "{}", s.var());
        walk_check(&from_code, s.var());
        // Code and environment give the same value, and `check` prints it as it was given
        // (secrets masked).
        assert_eq!(s.shown(&from_env), s.shown(&from_code), "{}", s.var());
        let shown = s.shown(&from_env);
        if s.secret() {
            assert!(!shown.contains("s3cr"), "{}: {shown}", s.var());
        } else if s.var() != env::PROMETHEUS && s.var() != env::OTEL_METRICS_EXPORTER {
            // (The Prometheus address is printed resolved for the rank; the metrics
            // exporters are printed as they take effect.)
            assert_eq!(shown, s.example(), "{}", s.var());
        }
        // Code beats the environment, and both are parsed.
        let both = resolve(&b, &[BASE, (s.var(), s.example())]).unwrap();
        assert_eq!(both.origin(s.var()), Origin::Code, "{}", s.var());
    }
}

#[test]
fn the_spec_level_check_prints_is_one_the_variable_reads() {
    let c = env(&[("PHASETRACE_SPEC_LEVEL", "2")]).unwrap();
    let shown = settings::SPEC_LEVEL.show(&c.spec_level);
    assert_eq!(shown, "verify");
    assert_eq!(
        env(&[("PHASETRACE_SPEC_LEVEL", &shown)])
            .unwrap()
            .spec_level,
        SpecLevel::VerifySplit
    );
}

#[test]
fn settings_made_in_code_report_code_as_their_origin() {
    let mut b = ConfigBuilder::default();
    b.set(
        &settings::OTLP_ENDPOINT,
        Some("https://127.0.0.1:4317".into()),
    );
    b.set(&settings::OTLP_HEADERS, vec![("k".into(), "v".into())]);
    b.set(&settings::OTLP_COMPRESSION, Compression::Gzip);
    b.set(&settings::OTLP_CERTIFICATE, Some(PathBuf::from("/ca.pem")));
    b.set(&settings::OTLP_HISTOGRAM, HistogramAggregation::Exponential);
    let c = resolve(&b, &[]).unwrap();
    for var in [
        env::OTEL_EXPORTER_OTLP_ENDPOINT,
        env::OTEL_EXPORTER_OTLP_HEADERS,
        env::OTEL_EXPORTER_OTLP_COMPRESSION,
        env::OTEL_EXPORTER_OTLP_CERTIFICATE,
        env::OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION,
    ] {
        assert_eq!(c.origin(var), Origin::Code, "{var}");
    }
}

#[test]
fn the_settings_table_names_each_variable_and_flag_once() {
    let mut vars = std::collections::BTreeSet::new();
    let mut flags = std::collections::BTreeSet::new();
    for s in settings::SETTINGS {
        assert!(vars.insert(s.var()), "{} twice", s.var());
        if let Some(f) = s.flag() {
            assert!(flags.insert(f), "--{f} twice");
        }
        assert!(
            !s.doc().is_empty() && !s.expected().is_empty(),
            "{}",
            s.var()
        );
        assert!(!s.default_text().is_empty(), "{}", s.var());
        s.check(s.example())
            .unwrap_or_else(|e| panic!("{} example: {e}", s.var()));
        assert!(
            s.check("\u{1}bogus value\u{1}").is_err()
                || s.var() == env::OTEL_SERVICE_NAME
                || s.var() == env::OTEL_EXPORTER_OTLP_CERTIFICATE
                || s.var() == env::OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE
                || s.var() == env::OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE
                || s.var() == env::PROMETHEUS_WEB_CONFIG,
            "{}",
            s.var()
        );
    }
}

#[test]
fn every_closed_set_reads_back_what_it_prints_in_any_case() {
    fn walk<T: FromStr<Err = Expected> + fmt::Display + PartialEq + fmt::Debug + Copy>(
        all: &[T],
        expected: &str,
    ) {
        for v in all {
            let text = v.to_string();
            assert!(expected.contains(&text), "{text} not in {expected:?}");
            assert_eq!(text.parse::<T>().unwrap(), *v);
            assert_eq!(text.to_ascii_uppercase().parse::<T>().unwrap(), *v);
        }
        assert_eq!("nope".parse::<T>().unwrap_err().0, expected);
    }
    walk(SectionLevel::ALL, SectionLevel::EXPECTED);
    walk(SpecLevel::ALL, SpecLevel::EXPECTED);
    walk(Timing::ALL, Timing::EXPECTED);
    walk(Protocol::ALL, Protocol::EXPECTED);
    walk(HistogramAggregation::ALL, HistogramAggregation::EXPECTED);
    walk(Compression::ALL, Compression::EXPECTED);
    walk(Exporter::ALL, Exporter::EXPECTED);
    for text in ["none", "otlp", "otlp,prometheus", "otlp,prometheus,console"] {
        let m = ExporterSet::parse_for(text, Signal::Metrics).unwrap();
        assert_eq!(m.to_string(), text);
    }
    for text in ["none", "otlp", "console", "otlp,console"] {
        let t = ExporterSet::parse_for(text, Signal::Traces).unwrap();
        assert_eq!(t.to_string(), text);
    }
    for text in ["off", "127.0.0.1:9464", "127.0.0.1:9464+rank", "[::1]:9000"] {
        let l: Listen = text.parse().unwrap();
        assert_eq!(l.to_string(), text);
    }
}

#[test]
fn a_legacy_alias_reads_with_its_settings_parser_and_must_name_a_known_variable() {
    let b = ConfigBuilder {
        aliases: vec![("OLD_QUEUE".into(), env::QUEUE)],
        ..Default::default()
    };
    assert_eq!(resolve(&b, &[("OLD_QUEUE", "4096")]).unwrap().queue, 4096);
    let bad = resolve(&b, &[("OLD_QUEUE", "5")]).unwrap_err().to_string();
    assert!(
        bad.starts_with("OLD_QUEUE=\"5\": expected a whole number of records"),
        "{bad}"
    );
    let unknown = ConfigBuilder {
        aliases: vec![("OLD".into(), "PHASETRACE_NOPE")],
        ..Default::default()
    };
    let err = resolve(&unknown, &[]).unwrap_err().to_string();
    assert!(
        err.contains("PHASETRACE_NOPE, which is not a phasetrace variable"),
        "{err}"
    );
}

#[test]
fn values_given_in_code_are_checked_like_the_variable() {
    let mut b = ConfigBuilder::default();
    b.set(&settings::QUEUE, 10);
    let err = resolve(&b, &[]).unwrap_err().to_string();
    assert_eq!(
        err,
        "PHASETRACE_QUEUE set in code=\"10\": expected a whole number of records from 64 to 16777216"
    );
    let mut b = ConfigBuilder::default();
    assert!(b.set_text(&settings::LEVEL, "loud").is_err());
}

#[test]
fn a_signals_own_variables_win_over_the_general_ones() {
    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-key=general"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://traces:4318/custom/path",
        ),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-key=traces"),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip"),
    ])
    .unwrap();
    let t = c.traces_otlp.as_ref().expect("traces over OTLP");
    let m = c.metrics_otlp.as_ref().expect("metrics over OTLP");
    // A signal's own endpoint is used as is; the general one gets the signal's path.
    assert_eq!(t.endpoint, "http://traces:4318/custom/path");
    assert_eq!(m.endpoint, "http://general:4318/v1/metrics");
    // Headers replace the general ones; other settings are inherited one by one.
    assert_eq!(t.headers, vec![("x-key".into(), "traces".into())]);
    assert_eq!(m.headers, vec![("x-key".into(), "general".into())]);
    assert_eq!(
        (t.timeout, m.timeout),
        (Duration::from_millis(1000), Duration::from_millis(2500))
    );
    assert_eq!((t.gzip, m.gzip), (false, true));
    // The general connection stays the base (what `import` sends with).
    assert_eq!(c.otlp.as_ref().unwrap().endpoint, "http://general:4318");
    // Metrics go over OTLP: no default Prometheus endpoint.
    assert_eq!(c.prometheus, None);
    for var in [
        env::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
        env::OTEL_EXPORTER_OTLP_METRICS_TIMEOUT,
    ] {
        assert_eq!(c.origin(var), Origin::Env, "{var}");
    }
    assert_eq!(
        c.origin(env::OTEL_EXPORTER_OTLP_METRICS_ENDPOINT),
        Origin::Default
    );
}

#[test]
fn a_grpc_endpoint_is_used_as_given_and_one_signal_alone_can_be_sent() {
    let c = env(&[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:4317")]).unwrap();
    assert_eq!(
        c.metrics_otlp.as_ref().map(|o| o.endpoint.as_str()),
        Some("http://m:4317")
    );
    assert!(c.traces_otlp.is_none(), "no endpoint for traces: none sent");
    assert_eq!(c.prometheus, None);
    let c = env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4317")]).unwrap();
    assert!(c.traces_otlp.is_some() && c.metrics_otlp.is_none());
    // Metrics are pushed nowhere: the default endpoint serves them.
    assert!(c.prometheus.is_some());
}

#[test]
fn otlp_selected_without_an_endpoint_names_both_variables() {
    let e = env(&[("OTEL_TRACES_EXPORTER", "otlp")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), "{e}");
    assert!(e.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{e}");
    let e = env(&[("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "thrift")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=\"thrift\""),
        "{e}"
    );
    assert!(e.contains("grpc or http/protobuf"), "{e}");
    let e = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
        ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/ca.pem"),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE is set"),
        "{e}"
    );
}

#[test]
fn the_default_prometheus_port_is_offset_by_the_launchers_local_rank() {
    let c = env(&[("LOCAL_RANK", "3")]).unwrap();
    assert_eq!(c.prometheus, Some("127.0.0.1:9467".parse().unwrap()));
    // An address given is kept as given.
    let c = env(&[
        ("LOCAL_RANK", "3"),
        ("PHASETRACE_PROMETHEUS", "127.0.0.1:9000"),
    ])
    .unwrap();
    assert_eq!(c.prometheus, Some("127.0.0.1:9000".parse().unwrap()));
    for bad in ["-1", "x", "60000"] {
        let e = env(&[("LOCAL_RANK", bad), ("PHASETRACE_RANK", "0")])
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("LOCAL_RANK=\"{bad}\"")), "{e}");
        assert!(e.contains("0 to 56071"), "{e}");
    }
}

#[test]
fn a_protocol_this_build_lacks_is_refused_by_its_feature() {
    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
    ]);
    if cfg!(feature = "otlp-http") {
        assert!(c.is_ok(), "{c:?}");
    } else {
        let e = c.unwrap_err().to_string();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf"),
            "{e}"
        );
        assert!(e.contains("`otlp-http`"), "{e}");
    }
    let c = env(&[("PHASETRACE_PROMETHEUS", "127.0.0.1:9999")]);
    if cfg!(feature = "prometheus") {
        assert!(c.is_ok());
    } else {
        let e = c.unwrap_err().to_string();
        assert!(e.contains("`prometheus`"), "{e}");
        // Unset, the default endpoint is simply absent from such a build.
        assert_eq!(env(&[]).unwrap().prometheus, None);
    }
}
