//! A web configuration file rewritten into something that would let more clients in is never
//! applied by a reload: a file that configures nothing (comments only, `---`, `{}`, `null`,
//! empty) or is cut mid-way (right after `basic_auth_users:`, inside a hash), and a valid file
//! that drops basic auth, client certificates or the TLS version in force. After each, an
//! unauthenticated scrape still gets 401 (a client without its certificate is still refused),
//! the authorized one 200, `phasetrace_prometheus_web_config_reloads_total{result="failed"}`
//! counts it once and the last-reload gauge reads 0. The same files at start are an error
//! naming the file and what was expected.

use crate::prometheus_scrapes_over_tls_with_basic_auth::{base64, certificates, tls_request};
use crate::support;

use std::path::Path;

use phasetrace::{Profiler, SectionLevel};
use support::TempDir;

const PASSWORD: &str = "right password";

fn hash() -> String {
    bcrypt::hash(PASSWORD, 4).expect("bcrypt")
}

/// Written beside `to`, then renamed over it (so that no read sees it half-written: the
/// truncations below are the files themselves).
fn replace(to: &Path, text: &str) {
    let tmp = to.with_extension("new");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, to).expect("rename");
}

/// The value of `name{...result="failed"...}` (or of the gauge) in a scrape.
fn value(body: &str, prefix: &str, needle: &str) -> Option<u64> {
    body.lines()
        .find(|l| l.starts_with(prefix) && l.contains(needle))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn failed_reloads(body: &str) -> Option<u64> {
    value(
        body,
        "phasetrace_prometheus_web_config_reloads_total{",
        "result=\"failed\"",
    )
}

fn last_reload_successful(body: &str) -> Option<u64> {
    value(
        body,
        "phasetrace_prometheus_web_config_last_reload_successful{",
        "",
    )
}

/// Files that configure nothing, or are cut short, each refused at start and on reload.
fn nothing_or_cut(users: &str) -> Vec<(&'static str, String)> {
    vec![
        ("empty", String::new()),
        ("comments only", "# managed by config management\n".into()),
        ("`---`", "---\n".into()),
        ("`{}`", "{}\n".into()),
        ("`null`", "null\n".into()),
        (
            "cut after `basic_auth_users:`",
            "basic_auth_users:\n".into(),
        ),
        ("cut inside a hash", users[..users.len() - 25].into()),
        ("an empty user list", "basic_auth_users: {}\n".into()),
    ]
}

#[test]
fn a_file_that_configures_nothing_or_is_cut_short_keeps_basic_auth_on_reload_and_fails_at_start() {
    let dir = TempDir::new("phasetrace-web-lower");
    let web = dir.path().join("web.yml");
    let users = format!("basic_auth_users:\n  prometheus: '{}'\n", hash());
    replace(&web, &users);
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_prometheus_web_config(&web)
        .build()
        .expect("profiler with basic auth");
    let url = format!("http://{}/metrics", p.prometheus_addr().expect("endpoint"));
    let auth = format!("Basic {}", base64(&format!("prometheus:{PASSWORD}")));
    let scrape = |authorized: bool| {
        let headers: &[(&str, &str)] = if authorized {
            &[("Authorization", &auth)]
        } else {
            &[]
        };
        support::http_request("GET", &url, headers, &[]).expect("scrape")
    };
    assert_eq!(scrape(false).0, 401);
    assert_eq!(scrape(true).0, 200);

    for (i, (what, text)) in nothing_or_cut(&users).iter().enumerate() {
        replace(&web, text);
        let (status, body) = scrape(false);
        assert_eq!(
            status, 401,
            "{what}: an unauthenticated scrape after the reload: {body}"
        );
        let (status, body) = scrape(true);
        assert_eq!(status, 200, "{what}");
        assert_eq!(failed_reloads(&body), Some(i as u64 + 1), "{what}: {body}");
        assert_eq!(last_reload_successful(&body), Some(0), "{what}");
        assert_eq!(scrape(false).0, 401, "{what}: still");
    }
    // Fixed: applied.
    replace(&web, &users);
    let (status, body) = scrape(true);
    assert_eq!(status, 200);
    assert_eq!(last_reload_successful(&body), Some(1), "{body}");
    assert_eq!(scrape(false).0, 401);
    p.shutdown();

    for (what, text) in nothing_or_cut(&users) {
        replace(&web, &text);
        let e = Profiler::builder()
            .without_env()
            .with_prometheus_at(([127, 0, 0, 1], 0))
            .with_prometheus_web_config(&web)
            .build()
            .map(|_| ())
            .expect_err(what)
            .to_string();
        assert!(
            e.contains(&format!(
                "PHASETRACE_PROMETHEUS_WEB_CONFIG={}",
                web.display()
            )),
            "{what}: {e}"
        );
        assert!(e.contains("expected"), "{what}: {e}");
        assert!(!e.contains("$2"), "{what}: no hash in {e}");
    }
}

#[test]
fn a_reload_that_drops_basic_auth_client_certificates_or_the_tls_version_is_refused() {
    let dir = TempDir::new("phasetrace-web-lower-tls");
    certificates(dir.path());
    let web = dir.path().join("web.yml");
    let tls = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";
    let mutual = "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n";
    let tls13 = "  min_version: TLS13\n";
    let users = format!("basic_auth_users:\n  prometheus: '{}'\n", hash());
    let good = format!("{tls}{mutual}{tls13}{users}");
    replace(&web, &good);
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_prometheus_web_config(&web)
        .build()
        .expect("profiler with TLS and basic auth");
    let addr = p.prometheus_addr().expect("endpoint");
    let ca = dir.path().join("ca.pem");
    let with_cert = |auth: Option<(&str, &str)>| tls_request(addr, &ca, Some(dir.path()), auth);
    let authorized = || with_cert(Some(("prometheus", PASSWORD))).expect("authorized scrape");
    assert_eq!(authorized().status, 200);
    assert_eq!(with_cert(None).expect("scrape").status, 401);
    assert!(tls_request(addr, &ca, None, Some(("prometheus", PASSWORD))).is_err());

    let lowered = [
        ("basic auth removed", format!("{tls}{mutual}{tls13}")),
        (
            "client certificates no longer required",
            format!("{tls}{tls13}{users}"),
        ),
        (
            "client certificates no longer verified",
            format!("{tls}  client_auth_type: RequireAnyClientCert\n{tls13}{users}"),
        ),
        (
            "TLS 1.2 allowed again",
            format!("{tls}{mutual}  min_version: TLS12\n{users}"),
        ),
        ("TLS removed", users.clone()),
        (
            "cut after `tls_server_config:`",
            "tls_server_config:\n".into(),
        ),
    ];
    for (i, (what, text)) in lowered.iter().enumerate() {
        replace(&web, text);
        let r = authorized();
        assert_eq!(r.status, 200, "{what}");
        assert_eq!(
            failed_reloads(&r.body),
            Some(i as u64 + 1),
            "{what}: {}",
            r.body
        );
        assert_eq!(last_reload_successful(&r.body), Some(0), "{what}");
        assert_eq!(
            with_cert(None).map(|r| r.status),
            Ok(401),
            "{what}: an unauthenticated scrape"
        );
        let without_cert = tls_request(addr, &ca, None, Some(("prometheus", PASSWORD)));
        assert!(
            without_cert.is_err(),
            "{what}: a client without a certificate got {without_cert:?}"
        );
    }
    // Rotating within the same requirements still applies.
    replace(&web, &good.replace("TLS13", "TLS13\n  max_version: TLS13"));
    let r = authorized();
    assert_eq!(last_reload_successful(&r.body), Some(1), "{}", r.body);
    p.shutdown();
}
