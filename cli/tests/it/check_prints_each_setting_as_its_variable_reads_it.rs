//! `phasetrace check` prints every setting of the library's table, each value spelled as its
//! variable reads it: fed back through the environment, the printed values give the same
//! configuration. The origin column says `default`, `env` or `flag` truthfully.

use crate::cli;

use cli::phasetrace;
use phasetrace::config::settings::SETTINGS;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::time::Duration;

const RUN: Duration = Duration::from_secs(30);

/// The configuration rows of a `check` run: variable -> (value, origin).
fn rows(stdout: &str) -> BTreeMap<String, (String, String)> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("phasetrace configuration"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            let var = w.next().unwrap().to_owned();
            let value = w.next().unwrap().to_owned();
            let origin = w.next().unwrap().trim_matches(['(', ')']).to_owned();
            (var, (value, origin))
        })
        .collect()
}

fn dead_endpoint() -> String {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    format!("https://127.0.0.1:{port}")
}

#[test]
fn every_printed_value_reads_back_through_its_variable() {
    let endpoint = dead_endpoint();
    let args = ["check", "--timeout-ms", "200"];

    // Defaults: every row is there, and says so.
    let defaults = phasetrace(&args, &[("PHASETRACE_PROMETHEUS", "off")], RUN);
    let d = rows(&defaults.stdout);
    assert_eq!(d.len(), SETTINGS.len(), "{defaults}");
    for s in SETTINGS {
        let (_, origin) = &d[s.var()];
        let want = if s.var() == "PHASETRACE_PROMETHEUS" {
            "env"
        } else {
            "default"
        };
        assert_eq!(origin, want, "{}: {defaults}", s.var());
    }

    // Every setting from the environment (its example value; a dead local endpoint).
    let given: Vec<(&str, String)> = SETTINGS
        .iter()
        .map(|s| {
            let v = if s.var() == "OTEL_EXPORTER_OTLP_ENDPOINT" {
                endpoint.clone()
            } else {
                s.example().to_owned()
            };
            (s.var(), v)
        })
        .collect();
    let vars: Vec<(&str, &str)> = given.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let first = phasetrace(&args, &vars, RUN);
    let printed = rows(&first.stdout);
    assert_eq!(printed.len(), SETTINGS.len(), "{first}");
    for s in SETTINGS {
        assert_eq!(printed[s.var()].1, "env", "{}: {first}", s.var());
    }
    assert!(
        !first.all().contains("s3cr"),
        "a header value was printed: {first}"
    );

    // The printed values, fed back, print the same (secrets are masked: their variable is
    // given as before).
    let back: Vec<(String, String)> = SETTINGS
        .iter()
        .map(|s| {
            let (value, _) = &printed[s.var()];
            let v = if s.secret() {
                s.example().to_owned()
            } else {
                value.clone()
            };
            (s.var().to_owned(), v)
        })
        .collect();
    let back_vars: Vec<(&str, &str)> = back.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let second = phasetrace(&args, &back_vars, RUN);
    assert_eq!(
        rows(&second.stdout),
        printed,
        "printed values read back differently:\n{first}\n{second}"
    );
}

#[test]
fn flags_report_flag_as_their_origin_and_use_the_variables_parser() {
    let flagged: Vec<_> = SETTINGS.iter().filter(|s| s.flag().is_some()).collect();
    assert!(flagged.len() >= 10, "fewer flags than before");
    let mut args: Vec<String> = vec!["check".into(), "--timeout-ms".into(), "200".into()];
    let endpoint = dead_endpoint();
    for s in &flagged {
        args.push(format!("--{}", s.flag().unwrap()));
        args.push(if s.var() == "OTEL_EXPORTER_OTLP_ENDPOINT" {
            endpoint.clone()
        } else {
            s.example().to_owned()
        });
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = phasetrace(&args, &[], RUN);
    let r = rows(&run.stdout);
    for s in &flagged {
        assert_eq!(r[s.var()].1, "flag", "{}: {run}", s.var());
    }
    // A bad flag value is refused with the variable's own words.
    for s in &flagged {
        let flag = format!("--{}", s.flag().unwrap());
        if s.check("not a value!").is_ok() {
            continue;
        }
        let bad = phasetrace(&["check", &flag, "not a value!"], &[], RUN);
        assert_eq!(bad.code, Some(2), "{flag}: {bad}");
        assert!(
            bad.stderr.contains(&format!("expected {}", s.expected())),
            "{flag}: {bad}"
        );
    }
}
