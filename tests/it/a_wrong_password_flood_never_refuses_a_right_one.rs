//! 500 clients sending wrong passwords (a new one each request, as a guesser would), from one
//! address and from fifty, never get an authorized scrape refused: a scraper on a flooding
//! address (its credentials verified before the flood) and one on another address (its very
//! first scrape during the flood, and its first after a reload that changed its password) are
//! answered 200 within 1 s, plus what this machine's load makes the same scrapes take without
//! the flood. A scraper on another address waits for the check in hand and its own, never for
//! the flood's (the checks are queued fairly between addresses); one whose credentials
//! verified is answered without a check, also after a reload that kept its user. The flood
//! costs at most the pool's one thread of bcrypt CPU (read in /proc), and every refusal is
//! counted in `phasetrace_prometheus_auth_refused_total{reason}`.

use crate::idle_connections_never_lock_a_scraper_out::{ONE_FLOOD, as_an_outsider};
use crate::prometheus_scrapes_over_tls_with_basic_auth::base64;
use crate::support;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use phasetrace::{Profiler, SectionLevel};
use support::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FLOODERS: usize = 500;
/// htpasswd's -B default. A debug build's bcrypt is about 30 times slower than a release one's.
const COST: u32 = 5;
/// Scrapes of each scraper during the flood, one a second; the file changes before this one.
const ROUNDS: usize = 8;
const RELOAD_AT: usize = 4;

/// `GET /metrics` as `user:password` on a new connection from `from`: status, answer and how
/// long it took (status 0: no answer).
async fn get(addr: SocketAddr, from: Ipv4Addr, user_password: &str) -> (u16, String, Duration) {
    let t = Instant::now();
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: t\r\nAuthorization: Basic {}\r\nConnection: close\r\n\r\n",
        base64(user_password)
    );
    let exchange = async {
        let s = tokio::net::TcpSocket::new_v4()?;
        // Many connections a second from one address: ports in TIME_WAIT may be bound again.
        s.set_reuseaddr(true)?;
        s.bind(SocketAddr::from((from, 0)))?;
        let mut c = s.connect(addr).await?;
        c.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text, t.elapsed())
}

fn refused(body: &str, reason: &str) -> Option<u64> {
    body.lines()
        .find(|l| {
            l.starts_with("phasetrace_prometheus_auth_refused_total{")
                && l.contains(&format!("reason=\"{reason}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The ids of this process's threads named `phasetrace-auth` (the endpoint's password checks).
fn auth_threads() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "phasetrace-auth")
        })
        .map(|t| t.file_name().to_string_lossy().into_owned())
        .collect()
}

/// CPU time (user and system) the threads `tids` have used.
fn cpu(tids: &[String]) -> Duration {
    // SAFETY: sysconf takes and returns plain integers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let ticks: u64 = tids
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/self/task/{t}/stat")).ok())
        .filter_map(|stat| {
            // After the name (in parentheses): state is field 3; utime and stime 14 and 15.
            let rest = stat.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .sum();
    Duration::from_secs_f64(ticks as f64 / hz)
}

fn users(same: &str, other: &str) -> String {
    format!("basic_auth_users:\n  prometheus: '{same}'\n  other: '{other}'\n")
}

/// What the flooders saw: each answer's status and how long it took.
type Answers = Arc<Mutex<Vec<(u16, Duration)>>>;

/// `FLOODERS` clients spread over `from`, on a thread of their own at the lowest priority, each
/// sending a new wrong password for the scraper's user as soon as it has its answer, until
/// `stop` says so.
fn flood(
    addr: SocketAddr,
    from: Vec<Ipv4Addr>,
    stop: tokio::sync::watch::Receiver<bool>,
    answers: Answers,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        as_an_outsider();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let tasks: Vec<_> = (0..FLOODERS)
                .map(|i| {
                    let (stop, answers) = (stop.clone(), answers.clone());
                    let source = from[i % from.len()];
                    tokio::spawn(async move {
                        let mut mine = Vec::new();
                        let mut n = 0u64;
                        while !*stop.borrow() {
                            n += 1;
                            let (status, _, took) =
                                get(addr, source, &format!("prometheus:guess {i} {n}")).await;
                            mine.push((status, took));
                            if status == 0 {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                        answers.lock().unwrap().extend(mine);
                    })
                })
                .collect();
            for t in tasks {
                let _ = t.await;
            }
        });
    })
}

/// One authorized scrape under the flood: who, which round, status, time, and whether its
/// credentials needed a bcrypt check (a first scrape, a first after the reload).
struct Scrape {
    who: &'static str,
    round: usize,
    status: u16,
    took: Duration,
    checked: bool,
}

/// The whole run: a scraper on `same` (one of the flood's addresses), one on `other`, the flood
/// from `flood_from`.
fn run(flood_from: Vec<Ipv4Addr>, same: Ipv4Addr, other: Ipv4Addr) {
    let _one = ONE_FLOOD.lock().unwrap_or_else(|p| p.into_inner());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = TempDir::new("phasetrace-auth-fair");
    let (same_hash, first_hash) = (
        bcrypt::hash("same's", COST).expect("bcrypt"),
        bcrypt::hash("other's", COST).expect("bcrypt"),
    );
    let t = Instant::now();
    assert!(!bcrypt::verify("wrong", &same_hash).unwrap());
    let one_check = t.elapsed();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, users(&same_hash, &first_hash)).unwrap();
    let before = auth_threads();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_prometheus_web_config(&web)
        .build()
        .expect("profiler with basic auth");
    let pool: Vec<String> = auth_threads()
        .into_iter()
        .filter(|t| !before.contains(t))
        .collect();
    assert!(
        !pool.is_empty(),
        "the endpoint's password-check thread, in /proc"
    );
    let addr = p.prometheus_addr().expect("endpoint");

    // Without the flood, for how slow this machine is right now: the scraper on the flood's
    // address verifies (one bcrypt check on the pool, at nice 10), then scrapes from the cache.
    let (status, body, calm_check) = rt.block_on(get(addr, same, "prometheus:same's"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(refused(&body, "busy"), Some(0), "from the start: {body}");
    let mut calm = Duration::ZERO;
    for _ in 0..10 {
        let (status, body, t) = rt.block_on(get(addr, same, "prometheus:same's"));
        assert_eq!(status, 200, "{body}");
        calm = calm.max(t);
        std::thread::sleep(Duration::from_millis(50));
    }
    // The bounds: 1 s, plus five times the slowest calm scrape; a scrape that needs a check
    // also waits for the check in hand and its own (twice the calm check). A starved scraper
    // is refused (429) or waits for the flood's checks: far past either.
    let cached_bound = Duration::from_secs(1) + calm * 5;
    let checked_bound = cached_bound + calm_check * 2;

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let answers: Answers = Arc::new(Mutex::new(Vec::new()));
    let flooders = flood(addr, flood_from.clone(), stopped, answers.clone());
    std::thread::sleep(Duration::from_secs(1));
    let (cpu0, t0) = (cpu(&pool), Instant::now());
    let mut scrapes = Vec::new();
    let mut password = "other:other's";
    for round in 0..ROUNDS {
        let started = Instant::now();
        if round == RELOAD_AT {
            change_password(&web, &same_hash);
            password = "other:other's new";
        }
        for (who, from, up) in [
            ("same", same, "prometheus:same's"),
            ("other", other, password),
        ] {
            // Judged after the flood stops: a panic here would leave it running.
            let (status, _, took) = rt.block_on(get(addr, from, up));
            let checked = who == "other" && (round == 0 || round == RELOAD_AT);
            scrapes.push(Scrape {
                who,
                round,
                status,
                took,
                checked,
            });
        }
        std::thread::sleep(Duration::from_secs(1).saturating_sub(started.elapsed()));
    }
    let (spent, lasted) = (cpu(&pool).saturating_sub(cpu0), t0.elapsed());
    let _ = stop.send(true);
    flooders.join().expect("flood");
    let (_, body, _) = rt.block_on(get(addr, same, "prometheus:same's"));
    p.shutdown();

    let answers = answers.lock().unwrap().clone();
    let count = |s: u16| answers.iter().filter(|(x, _)| *x == s).count();
    let show = |s: &Scrape| {
        format!(
            "{} round {}{}: {} in {:?}",
            s.who,
            s.round,
            if s.checked { " (checked)" } else { "" },
            s.status,
            s.took
        )
    };
    let report: Vec<String> = scrapes.iter().map(show).collect();
    let cores = spent.as_secs_f64() / lasted.as_secs_f64();
    eprintln!(
        "flood from {} address(es): one bcrypt check (cost {COST}, this build) {one_check:?}, \
         on the pool without the flood {calm_check:?}; slowest calm cached scrape {calm:?}; \
         {} wrong-password answers in {lasted:?} ({} 401, {} 429); the pool's bcrypt CPU \
         {spent:?} ({cores:.2} cores); scrapes: {report:#?}",
        flood_from.len(),
        answers.len(),
        count(401),
        count(429),
    );
    for s in &scrapes {
        let bound = if s.checked {
            checked_bound
        } else {
            cached_bound
        };
        assert!(
            s.status == 200 && s.took < bound,
            "{} (bound {bound:?}: calm scrape {calm:?}, calm check {calm_check:?}); every \
             scrape: {report:#?}",
            show(s)
        );
    }
    // A flooder's own connection may get no answer (status 0) on a loaded machine: the
    // flooders run at nice 19, and with both cores busy 137 of 1,457 of their requests timed out
    // on their side. That is the attacker's loss; the endpoint was answering the authorized
    // scrapes above all along, and the flood must still have been checked (401s, below). Any
    // status but 401, 429 or none (a 200 above all) fails.
    let others: Vec<_> = answers
        .iter()
        .filter(|(s, _)| *s != 401 && *s != 429 && *s != 0)
        .collect();
    assert!(
        others.is_empty(),
        "flooders got other answers: {:?}",
        &others[..others.len().min(5)]
    );
    assert!(count(401) > 0, "the flood was checked: {} 401", count(401));
    // The pool is one thread: the flood costs at most one core of bcrypt (ticks are 10 ms:
    // the margin), and it did cost some.
    assert!(
        spent > Duration::ZERO && cores <= pool.len() as f64 + 0.05,
        "the pool's bcrypt CPU under the flood: {spent:?} in {lasted:?} ({} thread(s))",
        pool.len()
    );
    assert_eq!(refused(&body, "busy"), Some(count(429) as u64), "{body}");
    assert_eq!(
        refused(&body, "unauthorized"),
        Some(count(401) as u64),
        "{body}"
    );
}

/// Rewrites the file with a new password for `other` and the same hash for `prometheus`.
fn change_password(web: &Path, same_hash: &str) {
    let new = bcrypt::hash("other's new", COST).expect("bcrypt");
    let next = web.with_extension("next");
    std::fs::write(&next, users(same_hash, &new)).unwrap();
    std::fs::rename(&next, web).unwrap();
}

#[test]
fn five_hundred_guessers_on_one_address_never_refuse_a_right_password() {
    let flood = Ipv4Addr::new(127, 0, 0, 1);
    run(vec![flood], flood, Ipv4Addr::new(127, 0, 0, 2));
}

#[test]
fn five_hundred_guessers_on_fifty_addresses_never_refuse_a_right_password() {
    let flood: Vec<Ipv4Addr> = (1..=50).map(|i| Ipv4Addr::new(127, 1, 0, i)).collect();
    run(flood.clone(), flood[0], Ipv4Addr::new(127, 0, 0, 2));
}
