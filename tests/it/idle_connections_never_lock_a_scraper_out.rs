//! 2,000 clients that connect and send nothing or half a request head, and connect again as
//! soon as they are closed, never lock a scraper out: each honest scrape beside them is answered
//! within 1 s, and the endpoint closes the idle ones after its head time, counting them in
//! `phasetrace_prometheus_connections_closed_total{reason="head_timeout"}`. (Beyond the bound on
//! connections, idle ones are evicted to admit new ones: the endpoint's unit test
//! `beyond_the_bound_idle_connections_are_evicted_and_a_scraper_is_answered_at_once`.)

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use phasetrace::{Profiler, SectionLevel};

const CLIENTS: usize = 2_000;

/// One flood at a time in this test binary: two would measure each other.
pub(crate) static ONE_FLOOD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the calling thread (an attacker's) at the lowest priority: in the field its CPU is not
/// the endpoint's, and here it must not take the endpoint's share of a loaded machine.
pub(crate) fn as_an_outsider() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain integers in and out.
    unsafe {
        let _ = libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
    }
}

/// `CLIENTS` clients on a thread of their own, until `stop` is sent: even ones send nothing,
/// odd ones half a head; each connects again as soon as it is closed. `connects` counts
/// connections.
fn flood(
    addr: SocketAddr,
    stop: tokio::sync::watch::Receiver<bool>,
    connects: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    std::thread::spawn(move || {
        as_an_outsider();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let mut clients = Vec::new();
            for i in 0..CLIENTS {
                let (mut stop, connects) = (stop.clone(), connects.clone());
                clients.push(tokio::spawn(async move {
                    let mut buf = [0u8; 256];
                    while !*stop.borrow() {
                        let Ok(mut c) = tokio::net::TcpStream::connect(addr).await else {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        };
                        connects.fetch_add(1, Ordering::Relaxed);
                        if i % 2 == 1 {
                            let _ = c
                                .write_all(b"GET /metrics HTTP/1.1\r\nHost: slow\r\nAccept: ")
                                .await;
                        }
                        // Until the endpoint closes it, or the flood ends.
                        loop {
                            tokio::select! {
                                r = c.read(&mut buf) => if !matches!(r, Ok(n) if n > 0) {
                                    break;
                                },
                                _ = stop.changed() => return,
                            }
                        }
                    }
                }));
            }
            for c in clients {
                let _ = c.await;
            }
        });
    })
}

/// `GET /metrics` on a new connection: status, body, how long it took.
fn scrape(addr: SocketAddr) -> (u16, String, Duration) {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text, took)
}

fn closed(body: &str, reason: &str) -> Option<u64> {
    body.lines()
        .find(|l| {
            l.starts_with("phasetrace_prometheus_connections_closed_total{")
                && l.contains(&format!("reason=\"{reason}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn two_thousand_reconnecting_idle_clients_leave_every_scrape_under_a_second() {
    let _one = ONE_FLOOD.lock().unwrap_or_else(|p| p.into_inner());
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()
        .expect("profiler");
    let addr = p.prometheus_addr().expect("endpoint");
    // The same scrapes without the flood, for the figure.
    let mut alone = Vec::new();
    for _ in 0..20 {
        let (status, _, t) = scrape(addr);
        assert_eq!(status, 200);
        alone.push(t);
        std::thread::sleep(Duration::from_millis(50));
    }
    alone.sort();
    let (_, body, _) = scrape(addr);
    for reason in ["evicted", "refused", "head_timeout", "idle_timeout"] {
        assert_eq!(
            closed(&body, reason),
            Some(0),
            "{reason}, from the start: {body}"
        );
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let connects = Arc::new(AtomicU64::new(0));
    let flood = flood(addr, stopped, connects.clone());
    let t = Instant::now();
    while connects.load(Ordering::Relaxed) < CLIENTS as u64 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the flood never connected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Past the head time: every idle client has been closed once and has connected again.
    let until = Instant::now() + Duration::from_secs(7);
    let mut took = Vec::new();
    while Instant::now() < until {
        let (status, _, t) = scrape(addr);
        assert_eq!(status, 200, "a scrape beside {CLIENTS} idle clients");
        took.push(t);
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, body, _) = scrape(addr);
    let reconnects = connects.load(Ordering::Relaxed) - CLIENTS as u64;
    let _ = stop.send(true);
    flood.join().expect("flood");
    took.sort();
    let (median, slowest) = (took[took.len() / 2], *took.last().unwrap());
    let p99 = |v: &[Duration]| v[(v.len() * 99 / 100).min(v.len() - 1)];
    eprintln!(
        "scrape latency: alone p50 {:?} p99 {:?} ({} scrapes); beside {CLIENTS} idle clients \
         ({reconnects} reconnects) p50 {median:?} p99 {:?} slowest {slowest:?} ({} scrapes)",
        alone[alone.len() / 2],
        p99(&alone),
        alone.len(),
        p99(&took),
        took.len()
    );
    assert!(
        slowest < Duration::from_secs(1),
        "the slowest of {} scrapes took {slowest:?} (median {median:?})",
        took.len()
    );
    let timed_out = closed(&body, "head_timeout").expect("counter");
    assert!(
        timed_out >= CLIENTS as u64 / 2,
        "{timed_out} closed for no head in time: {body}"
    );
    assert_eq!(closed(&body, "refused"), Some(0));
    p.shutdown();
}
