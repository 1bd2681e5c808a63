//! Basic auth, off the threads that render scrapes.
//!
//! ```text
//! Authorization: Basic ... ─► (user, password)      none or malformed ─► 401
//!   ─► verified before? (the users' cache: an HMAC of user and password, compared in constant
//!      time, at most PROMETHEUS_AUTH_CACHE entries for PROMETHEUS_AUTH_CACHE_TTL_SECS)
//!        yes ─► allowed, inline: no queue, no thread
//!        no  ─► a bcrypt check on the auth pool (PROMETHEUS_AUTH_THREADS threads of its own,
//!               PROMETHEUS_AUTH_QUEUE checks waiting)
//!                 queue full ─► 429 at once (Retry-After: 1)
//!                 wrong      ─► 401
//!                 right      ─► cached, allowed
//! ```
//!
//! A bcrypt check costs tens of milliseconds of CPU by design, so a client that sends wrong
//! passwords as fast as it can would otherwise hold every thread that renders scrapes. Here it
//! holds at most the pool's threads and queue, and a scraper whose credentials verified once
//! never waits behind it. Every refusal is counted in `phasetrace.prometheus.auth.refused`.

use super::web_config::Users;
use crate::names::{AuthRefusal, default};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// How a request's credentials were judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Let in.
    Allowed,
    /// Refused (see [`AuthRefusal`]).
    Refused(AuthRefusal),
}

/// Refusals counted by reason, for `phasetrace.prometheus.auth.refused`.
#[derive(Debug, Default)]
pub(crate) struct AuthCounts([AtomicU64; AuthRefusal::ALL.len()]);

impl AuthCounts {
    pub(crate) fn get(&self, r: AuthRefusal) -> u64 {
        self.0[r as usize].load(Ordering::Relaxed)
    }

    fn add(&self, r: AuthRefusal) {
        self.0[r as usize].fetch_add(1, Ordering::Relaxed);
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The bcrypt threads and the bounded queue in front of them.
pub(super) struct AuthPool {
    queue: SyncSender<Job>,
    counts: Arc<AuthCounts>,
}

impl AuthPool {
    /// Starts the pool's threads; they end when the pool is dropped (after the check in hand).
    pub(super) fn start(counts: Arc<AuthCounts>) -> std::io::Result<AuthPool> {
        let (queue, rx) = std::sync::mpsc::sync_channel::<Job>(default::PROMETHEUS_AUTH_QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..default::PROMETHEUS_AUTH_THREADS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name("phasetrace-prometheus-auth".into())
                .spawn(move || {
                    lower_priority();
                    work(&rx);
                })?;
        }
        Ok(AuthPool { queue, counts })
    }

    /// Judges the `Authorization` header value `header` against `users`: at once when the
    /// credentials verified before or the pool is full, otherwise after a bcrypt check on the
    /// pool.
    pub(super) async fn check(&self, users: Arc<Users>, header: Option<&[u8]>) -> Verdict {
        let verdict = self.judge(users, header).await;
        if let Verdict::Refused(r) = verdict {
            self.counts.add(r);
        }
        verdict
    }

    async fn judge(&self, users: Arc<Users>, header: Option<&[u8]>) -> Verdict {
        const UNAUTHORIZED: Verdict = Verdict::Refused(AuthRefusal::Unauthorized);
        let Some((user, password)) = header.and_then(basic_credentials) else {
            return UNAUTHORIZED;
        };
        if users.cached(&user, &password) {
            return Verdict::Allowed;
        }
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            // The client gave up (timed out, disconnected): no check for nobody.
            if !tx.is_closed() {
                let _ = tx.send(users.verify(&user, &password));
            }
        });
        match self.queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                return Verdict::Refused(AuthRefusal::Busy);
            }
        }
        match rx.await {
            Ok(true) => Verdict::Allowed,
            Ok(false) => UNAUTHORIZED,
            // The pool's thread is gone (it panicked): refused, never let in.
            Err(_) => Verdict::Refused(AuthRefusal::Busy),
        }
    }
}

/// Password checks of clients not verified yet are the endpoint's least urgent work: on Linux
/// the pool's threads run at nice 10, so that a flood of wrong passwords takes CPU from the
/// engine only where it is idle (a thread's nice value is its own on Linux).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority take and return plain integers; a failure leaves the
    // priority as it was.
    unsafe {
        let tid = libc::gettid();
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

fn work(rx: &Mutex<Receiver<Job>>) {
    loop {
        // One thread waits for the next check while holding the lock; the others wait for
        // the lock. A poisoned lock only means another thread panicked in `recv`.
        let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

/// `(user, password)` of an `Authorization: Basic ...` header value.
pub(super) fn basic_credentials(v: &[u8]) -> Option<(String, Vec<u8>)> {
    use base64::Engine as _;
    let v = std::str::from_utf8(v).ok()?.trim();
    let (scheme, b64) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let colon = raw.iter().position(|b| *b == b':')?;
    let user = String::from_utf8(raw[..colon].to_vec()).ok()?;
    Some((user, raw[colon + 1..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_decode_and_reject_other_schemes() {
        // "alice:pa:ss"
        assert_eq!(
            basic_credentials(b"Basic YWxpY2U6cGE6c3M="),
            Some(("alice".into(), b"pa:ss".to_vec()))
        );
        assert_eq!(basic_credentials(b"Bearer YWxpY2U6cGE6c3M="), None);
        assert_eq!(basic_credentials(b"Basic !!!"), None);
        assert_eq!(basic_credentials(b"Basic bm9jb2xvbg=="), None);
    }

    #[test]
    fn a_full_pool_answers_busy_at_once_and_cached_credentials_skip_it() {
        use base64::Engine as _;
        let hash = bcrypt::hash("pw", 4).unwrap();
        let users = Arc::new(Users::for_test(&[("alice", &hash)]));
        let counts = Arc::new(AuthCounts::default());
        let pool = AuthPool::start(counts.clone()).unwrap();
        let header = |p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("alice:{p}"))
            )
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let right = header("pw");
            assert_eq!(
                pool.check(users.clone(), Some(right.as_bytes())).await,
                Verdict::Allowed
            );
            // Block the pool's threads and fill its queue. The queue is filled only once every
            // thread holds its blocking job: filled before, a thread's taking its job would
            // free a slot, the wrong password below would queue instead of being refused, and
            // the test would wait for it forever.
            let gate = Arc::new(std::sync::Barrier::new(
                default::PROMETHEUS_AUTH_THREADS + 1,
            ));
            let (entered, inside) = std::sync::mpsc::channel();
            for _ in 0..default::PROMETHEUS_AUTH_THREADS {
                let g = gate.clone();
                let entered = entered.clone();
                pool.queue
                    .try_send(Box::new(move || {
                        let _ = entered.send(());
                        g.wait();
                    }))
                    .unwrap();
            }
            for _ in 0..default::PROMETHEUS_AUTH_THREADS {
                inside
                    .recv_timeout(std::time::Duration::from_secs(60))
                    .expect("a pool thread takes its blocking job");
            }
            let mut filled = 0;
            while pool.queue.try_send(Box::new(|| ())).is_ok() {
                filled += 1;
            }
            assert_eq!(filled, default::PROMETHEUS_AUTH_QUEUE);
            let wrong = header("nope");
            assert_eq!(
                pool.check(users.clone(), Some(wrong.as_bytes())).await,
                Verdict::Refused(AuthRefusal::Busy)
            );
            // Verified before: no queue.
            assert_eq!(
                pool.check(users.clone(), Some(right.as_bytes())).await,
                Verdict::Allowed
            );
            assert_eq!(
                pool.check(users.clone(), None).await,
                Verdict::Refused(AuthRefusal::Unauthorized)
            );
            gate.wait();
        });
        assert_eq!(counts.get(AuthRefusal::Busy), 1);
        assert_eq!(counts.get(AuthRefusal::Unauthorized), 1);
    }
}
