//! The built-in Prometheus endpoint never fails a start: on a host where launchers set
//! `LOCAL_RANK`, each rank's default port is 9464 plus it, and a default port that is taken (the
//! engine's own exporter, another rank) is said once on stderr and skipped while the demo runs
//! to its end (an address the user gave that cannot listen is still an error:
//! `a_taken_prometheus_port_is_a_clear_error_not_a_panic`).

use crate::cli;

use std::net::TcpListener;
use std::time::Duration;

const BASE: u16 = 9464;

/// A port above the base that is free now, held by the returned listener.
fn held_port() -> (TcpListener, u16) {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = l.local_addr().expect("its address").port();
        if port > BASE {
            return (l, port);
        }
    }
}

#[test]
fn a_taken_default_port_is_skipped_with_one_line_and_the_run_completes() {
    let (_held, port) = held_port();
    let local_rank = (port - BASE).to_string();
    let done = cli::phasetrace(
        &["demo", "--steps", "20", "--ranks", "1", "--layers", "2"],
        &[("LOCAL_RANK", local_rank.as_str())],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(0), "{done}");
    let said = format!("the default Prometheus endpoint 127.0.0.1:{port} cannot listen");
    assert_eq!(done.stderr.matches(&said).count(), 1, "said once: {done}");
    assert!(done.stderr.contains("PHASETRACE_PROMETHEUS"), "{done}");
    assert!(!done.stderr.contains("Prometheus metrics at"), "{done}");
}

#[test]
fn the_default_port_is_offset_by_local_rank() {
    let (held, port) = held_port();
    drop(held); // free again: the demo takes it
    let local_rank = (port - BASE).to_string();
    let done = cli::phasetrace(
        &["demo", "--steps", "5", "--ranks", "1", "--layers", "1"],
        &[("LOCAL_RANK", local_rank.as_str())],
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(0), "{done}");
    assert!(
        done.stderr.contains(&format!(
            "Prometheus metrics at http://127.0.0.1:{port}/metrics"
        )),
        "{done}"
    );
}
