//! The web configuration file and the files it names change while the endpoint runs, as when an
//! operator rotates certificates and passwords: new TLS connections get the new certificate
//! (a client trusting only the old CA is refused, a client certificate of the old client CA
//! too), the old password gets 401 and the new one 200 (for a real Prometheus too, on its
//! kept-alive connection). A broken file, certificate or hash, or one that would turn TLS off,
//! keeps the last good configuration serving and counts
//! `phasetrace_prometheus_web_config_reloads_total{result="failed"}` once per change, and
//! `phasetrace_prometheus_web_config_last_reload_successful` reads 0; fixed, `result="ok"` and
//! the gauge back at 1.

use crate::prometheus_scrapes_over_tls_with_basic_auth::{
    TlsAnswer, certificates, job, tls_request,
};
use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use phasetrace::{Profiler, Section, SectionLevel, Site};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use support::{Prometheus, TempDir};

const OLD: &str = "old password";
const NEW: &str = "new password";

/// The web configuration of these tests: `server.pem` / `server.key`, clients verified against
/// `clients.pem` (when `mutual`), one user `prometheus` with `password`.
fn web_yml(password: &str, mutual: bool) -> String {
    let hash = bcrypt::hash(password, 4).expect("bcrypt");
    let clients = if mutual {
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: clients.pem\n"
    } else {
        ""
    };
    format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n{clients}basic_auth_users:\n  prometheus: '{hash}'\n"
    )
}

/// Replaces `to` at once: written beside it, then renamed over it (how rotations are done).
fn replace(to: &Path, text: &[u8]) {
    let tmp = to.with_extension("new");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, to).expect("rename");
}

fn copy(from: &Path, to: &Path) {
    replace(to, &std::fs::read(from).expect("read"));
}

/// `GET /metrics` trusting `ca` only, with `client`'s certificate and `prometheus:password`.
fn scrape(addr: SocketAddr, ca: &Path, client: &Path, password: &str) -> Result<TlsAnswer, String> {
    tls_request(addr, ca, Some(client), Some(("prometheus", password)))
}

/// The DER of the first certificate in `pem`.
fn der(pem: &Path) -> Vec<u8> {
    CertificateDer::pem_file_iter(pem)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

/// `(ok, failed)` of the reload counter in a scrape; `None` when it is not there.
fn reloads(body: &str) -> Option<(u64, u64)> {
    let value = |result: &str| {
        body.lines()
            .find(|l| {
                l.starts_with("phasetrace_prometheus_web_config_reloads_total{")
                    && l.contains(&format!("result=\"{result}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    Some((value("ok")?, value("failed")?))
}

/// The value of the last-reload-successful gauge in a scrape; `None` when it is not there.
fn last_reload_successful(body: &str) -> Option<u64> {
    body.lines()
        .find(|l| l.starts_with("phasetrace_prometheus_web_config_last_reload_successful{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn rotated_certificates_and_passwords_apply_and_a_broken_file_keeps_the_last_good_one() {
    let root = TempDir::new("phasetrace-web-reload");
    let (a, b, srv) = (
        root.path().join("a"),
        root.path().join("b"),
        root.path().join("srv"),
    );
    for d in [&a, &b, &srv] {
        std::fs::create_dir_all(d).unwrap();
    }
    certificates(&a);
    certificates(&b);
    let use_certs = |from: &Path| {
        copy(&from.join("server.pem"), &srv.join("server.pem"));
        copy(&from.join("server.key"), &srv.join("server.key"));
        copy(&from.join("ca.pem"), &srv.join("clients.pem"));
    };
    use_certs(&a);
    let web = srv.join("web.yml");
    std::fs::write(&web, web_yml(OLD, true)).unwrap();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_prometheus_web_config(&web)
        .build()
        .expect("profiler with TLS and basic auth");
    let rec = p.recorder();
    for _ in 0..2 {
        let _step = rec.step();
        let _s = rec.section(Section::MOE_EXPERTS, 1u32, Site::MLP);
    }
    p.flush();
    let addr = p.prometheus_addr().expect("endpoint");
    let ca_a = a.join("ca.pem");
    let ca_b = b.join("ca.pem");
    let status =
        |ca: &Path, client: &Path, pw: &str| scrape(addr, ca, client, pw).map(|r| r.status);

    let first = scrape(addr, &ca_a, &a, OLD).expect("scrape with certificate A");
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        first.body.contains("phasetrace_steps_total"),
        "{}",
        first.body
    );
    assert_eq!(first.server_cert, der(&a.join("server.pem")));
    assert_eq!(
        reloads(&first.body),
        Some((0, 0)),
        "both series from the start"
    );
    assert_eq!(
        last_reload_successful(&first.body),
        Some(1),
        "the file read at start is in force: {}",
        first.body
    );

    // The password, rewritten in place.
    std::fs::write(&web, web_yml(NEW, true)).unwrap();
    assert_eq!(
        status(&ca_a, &a, OLD),
        Ok(401),
        "the old password after rotation"
    );
    let r = scrape(addr, &ca_a, &a, NEW).unwrap();
    assert_eq!(r.status, 200, "the new password");
    assert_eq!(reloads(&r.body), Some((1, 0)));
    assert_eq!(last_reload_successful(&r.body), Some(1));

    // Certificate, key and client CA, each renamed into place.
    use_certs(&b);
    let refused = scrape(addr, &ca_a, &a, NEW);
    assert!(
        refused.is_err(),
        "a client trusting only CA A after the rotation to B got {refused:?}"
    );
    let r = scrape(addr, &ca_b, &b, NEW).expect("scrape with certificate B");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.server_cert,
        der(&b.join("server.pem")),
        "new connections see B"
    );
    assert_eq!(reloads(&r.body), Some((2, 0)));
    let old_client = scrape(addr, &ca_b, &a, NEW);
    assert!(
        old_client.is_err(),
        "a client certificate of the old client CA got {old_client:?}"
    );

    // Broken in four ways, one after another: each keeps B and the new password serving and
    // is counted once.
    let good_key = std::fs::read(srv.join("server.key")).unwrap();
    type Breakage<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let breakages: [Breakage; 4] = [
        (
            "bad YAML",
            Box::new(|| std::fs::write(&web, "basic_auth_users: [\n").unwrap()),
        ),
        (
            "a key that is not PEM",
            Box::new(|| {
                std::fs::write(&web, web_yml(NEW, true)).unwrap();
                replace(&srv.join("server.key"), b"not a key");
            }),
        ),
        (
            "a password instead of a hash",
            Box::new(|| {
                replace(&srv.join("server.key"), &good_key);
                std::fs::write(
                    &web,
                    "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\nbasic_auth_users:\n  prometheus: hunter2\n",
                )
                .unwrap();
            }),
        ),
        (
            "TLS removed",
            Box::new(|| {
                std::fs::write(
                    &web,
                    format!(
                        "basic_auth_users:\n  prometheus: '{}'\n",
                        bcrypt::hash(NEW, 4).unwrap()
                    ),
                )
                .unwrap()
            }),
        ),
    ];
    for (i, (what, break_it)) in breakages.iter().enumerate() {
        break_it();
        for _ in 0..2 {
            let r = scrape(addr, &ca_b, &b, NEW)
                .unwrap_or_else(|e| panic!("{what}: the endpoint stopped serving: {e}"));
            assert_eq!(r.status, 200, "{what}");
            assert_eq!(r.server_cert, der(&b.join("server.pem")), "{what}");
            assert_eq!(reloads(&r.body), Some((2, i as u64 + 1)), "{what}");
            assert_eq!(last_reload_successful(&r.body), Some(0), "{what}");
        }
        assert_eq!(status(&ca_b, &b, OLD), Ok(401), "{what}");
    }

    // Fixed, with a third password.
    std::fs::write(&web, web_yml("third", true)).unwrap();
    let r = scrape(addr, &ca_b, &b, "third").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(reloads(&r.body), Some((3, 4)));
    assert_eq!(last_reload_successful(&r.body), Some(1), "fixed");
    assert_eq!(status(&ca_b, &b, NEW), Ok(401));
    p.shutdown();
}

#[test]
fn a_real_prometheus_follows_a_password_rotation_on_its_kept_alive_connection() {
    support::require_tools!(Prometheus);
    let dir = TempDir::new("phasetrace-web-reload-prometheus");
    certificates(dir.path());
    copy(&dir.path().join("ca.pem"), &dir.path().join("clients.pem"));
    let web = dir.path().join("web.yml");
    replace(&web, web_yml(OLD, true).as_bytes());
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_prometheus_web_config(&web)
        .build()
        .expect("profiler with TLS and basic auth");
    let addr = p.prometheus_addr().expect("endpoint");
    let prometheus = Prometheus::builder()
        .raw_job(&job("old", addr, dir.path(), OLD))
        .raw_job(&job("new", addr, dir.path(), NEW))
        .start();
    let up = |old: f64, new: f64| {
        prometheus.wait_for_query(
            "up",
            |s| {
                let of = |j: &str| {
                    s.iter()
                        .find(|(l, _)| l.get("job").map(String::as_str) == Some(j))
                        .map(|(_, v)| *v)
                };
                of("old") == Some(old) && of("new") == Some(new)
            },
            Duration::from_secs(30),
        );
    };
    let reloads = |result: &str, n: f64| {
        prometheus.wait_for_query(
            &format!("phasetrace_prometheus_web_config_reloads_total{{result=\"{result}\"}}"),
            |s| s.iter().any(|(_, v)| *v == n),
            Duration::from_secs(30),
        );
    };
    let last_ok = |v: f64| {
        prometheus.wait_for_query(
            "phasetrace_prometheus_web_config_last_reload_successful",
            |s| !s.is_empty() && s.iter().all(|(_, x)| *x == v),
            Duration::from_secs(30),
        );
    };
    up(1.0, 0.0);
    reloads("ok", 0.0);
    last_ok(1.0);

    replace(&web, web_yml(NEW, true).as_bytes());
    up(0.0, 1.0);
    reloads("ok", 1.0);

    replace(&web, b"tls_server_config: {cert_file: server.pem\n");
    reloads("failed", 1.0);
    last_ok(0.0);
    up(0.0, 1.0);

    replace(&web, web_yml(NEW, true).as_bytes());
    reloads("ok", 2.0);
    last_ok(1.0);
    up(0.0, 1.0);
    assert!(!prometheus.output().contains(OLD));
    p.shutdown();
}
