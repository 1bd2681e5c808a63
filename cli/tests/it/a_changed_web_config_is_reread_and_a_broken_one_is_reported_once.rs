//! What an operator sees on the engine's stderr when the web configuration file changes under a
//! running `phasetrace demo`: a broken file is one warning naming the file and the error (the
//! start-up error's text), not repeated by later scrapes, while the endpoint keeps serving with
//! the configuration read before; the fixed file is one line saying it was applied.

use crate::cli;
use crate::support;

use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const OLD: &str = "old password";
const NEW: &str = "new password";

fn users(password: &str) -> String {
    format!(
        "basic_auth_users:\n  prometheus: '{}'\n",
        bcrypt::hash(password, 4).expect("bcrypt")
    )
}

/// Written beside `to`, then renamed over it.
fn replace(to: &Path, text: &str) {
    let tmp = to.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

fn base64(s: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in s.as_bytes().chunks(3) {
        let b = |i: usize| u32::from(*chunk.get(i).unwrap_or(&0));
        let n = (b(0) << 16) | (b(1) << 8) | b(2);
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                A[((n >> (18 - 6 * i)) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

/// `GET /metrics` with basic auth `prometheus:password`: the status and the body.
fn scrape(addr: &str, password: &str) -> (u16, String) {
    let auth = format!("Basic {}", base64(&format!("prometheus:{password}")));
    support::http_request(
        "GET",
        &format!("http://{addr}/metrics"),
        &[("Authorization", &auth)],
        &[],
    )
    .expect("scrape")
}

#[test]
fn a_broken_web_config_is_one_warning_and_the_fixed_one_one_line() {
    let dir = support::TempDir::new("phasetrace-cli-web-reload");
    let web = dir.path().join("web.yml");
    replace(&web, &users(OLD));
    let web_s = web.display().to_string();
    let mut demo = cli::Demo::spawn(
        &[
            "--steps",
            "5",
            "--ranks",
            "1",
            "--layers",
            "2",
            "--spin-us",
            "0",
            "--linger",
            "120",
            "--prometheus",
            "127.0.0.1:0",
            "--prometheus-web-config",
            &web_s,
        ],
        &[],
    );
    let addr = demo.prometheus_addr(WAIT);
    assert_eq!(scrape(&addr, OLD).0, 200);

    replace(&web, "basic_auth_users: [\n");
    for _ in 0..3 {
        let (status, body) = scrape(&addr, OLD);
        assert_eq!(status, 200, "the last good configuration keeps serving");
        assert!(
            body.contains("phasetrace_prometheus_web_config_reloads_total{")
                && body
                    .lines()
                    .any(|l| l.contains("result=\"failed\"") && l.ends_with(" 1")),
            "{body}"
        );
    }
    let warning = format!(
        "phasetrace: warning: the changed web configuration is not applied, the Prometheus endpoint keeps the one it read before (no TLS, basic auth (1 user(s))) until the file is fixed (counted in phasetrace.prometheus.web_config.reloads{{result=\"failed\"}}): PHASETRACE_PROMETHEUS_WEB_CONFIG={web_s}: (document): "
    );
    demo.wait_for_line(|l| l.starts_with(&warning).then_some(()), WAIT);

    replace(&web, &users(NEW));
    assert_eq!(scrape(&addr, NEW).0, 200);
    assert_eq!(scrape(&addr, OLD).0, 401);
    let applied = format!(
        "phasetrace: PHASETRACE_PROMETHEUS_WEB_CONFIG={web_s}: re-read after a change and applied: no TLS, basic auth (1 user(s))"
    );
    demo.wait_for_line(|l| (l == applied).then_some(()), WAIT);

    let out = demo.output();
    assert_eq!(
        out.matches(&warning).count(),
        1,
        "said once per change:\n{out}"
    );
    assert_eq!(out.matches(&applied).count(), 1, "{out}");
    assert!(
        !out.contains(OLD) && !out.contains("$2"),
        "no password or hash:\n{out}"
    );
    let status = demo.interrupt_and_wait(WAIT);
    assert!(status.success(), "{status}\n{}", demo.output());
}
