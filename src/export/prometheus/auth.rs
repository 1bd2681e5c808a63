//! Basic auth, off the threads that render scrapes.
//!
//! ```text
//! Authorization: Basic ... ─► (user, password)      none or malformed ─► 401
//!   ─► verified before? (the endpoint's cache: an HMAC of user, the user's bcrypt hash and the
//!      password, compared in constant time, at most PROMETHEUS_AUTH_CACHE entries, each for
//!      PROMETHEUS_AUTH_CACHE_TTL_SECS after its last use; a reload keeps the entries of users
//!      whose hash it kept)
//!        yes ─► allowed, inline: no queue, no thread
//!        no  ─► a bcrypt check on the auth pool (PROMETHEUS_AUTH_THREADS threads of its own),
//!               queued fairly between client addresses (fair.rs)
//!                 no room for it ─► 429 at once (Retry-After: 1)
//!                 wrong          ─► 401 (nothing remembered)
//!                 right          ─► cached, allowed
//! ```
//!
//! A bcrypt check costs tens of milliseconds of CPU by design, so a client that sends wrong
//! passwords as fast as it can would otherwise hold every thread that renders scrapes. Here it
//! holds at most the pool's thread and its address's share of the queue: a scraper whose
//! credentials verified once never waits behind it, and one on another address waits for at
//! most the check in hand and its own. Every refusal is counted in
//! `phasetrace.prometheus.auth.refused`.

use super::fair::{FairQueue, Job, Limits, Source};
use super::web_config::Users;
use crate::names::{AuthRefusal, default};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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

/// The queue's bounds in force.
fn limits() -> Limits {
    Limits {
        per_source: default::PROMETHEUS_AUTH_QUEUE,
        total: default::PROMETHEUS_AUTH_QUEUE_TOTAL,
        sources: default::PROMETHEUS_AUTH_SOURCES,
        half_life: Duration::from_secs(default::PROMETHEUS_AUTH_DEMAND_HALF_LIFE_SECS),
    }
}

/// The bcrypt threads, the fair queue in front of them and the cache of verified credentials.
pub(super) struct AuthPool {
    queue: Arc<FairQueue>,
    verified: Arc<Verified>,
    counts: Arc<AuthCounts>,
}

impl Drop for AuthPool {
    fn drop(&mut self) {
        self.queue.close();
    }
}

impl AuthPool {
    /// Starts the pool's threads; they end when the pool is dropped (after the check in hand).
    pub(super) fn start(counts: Arc<AuthCounts>) -> std::io::Result<AuthPool> {
        let queue = Arc::new(FairQueue::new(limits()));
        for _ in 0..default::PROMETHEUS_AUTH_THREADS {
            let queue = queue.clone();
            std::thread::Builder::new()
                // 15 bytes: the whole name shows in /proc (tests read its CPU time there).
                .name("phasetrace-auth".into())
                .spawn(move || {
                    lower_priority();
                    while let Some(job) = queue.take() {
                        // A check that panicked answers its client 429 (its sender dropped);
                        // the thread goes on with the next.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })?;
        }
        Ok(AuthPool {
            queue,
            verified: Arc::new(Verified::new()),
            counts,
        })
    }

    /// Judges the `Authorization` header value `header` of a client at `peer` against `users`:
    /// at once when the credentials verified before or the queue has no room for the check,
    /// otherwise after a bcrypt check on the pool.
    pub(super) async fn check(
        &self,
        users: Arc<Users>,
        header: Option<&[u8]>,
        peer: IpAddr,
    ) -> Verdict {
        let verdict = self.judge(users, header, peer).await;
        if let Verdict::Refused(r) = verdict {
            self.counts.add(r);
        }
        verdict
    }

    async fn judge(&self, users: Arc<Users>, header: Option<&[u8]>, peer: IpAddr) -> Verdict {
        const UNAUTHORIZED: Verdict = Verdict::Refused(AuthRefusal::Unauthorized);
        let Some((user, password)) = header.and_then(basic_credentials) else {
            return UNAUTHORIZED;
        };
        // Unknown users have no tag: never cached, checked against a dummy hash as slowly.
        let tag = users
            .hash_of(&user)
            .and_then(|hash| self.verified.tag(&user, hash, &password));
        if tag.is_some_and(|t| self.verified.holds(&t)) {
            return Verdict::Allowed;
        }
        let (tx, rx) = oneshot::channel();
        let verified = self.verified.clone();
        let job: Job = Box::new(move || {
            // The client gave up (timed out, disconnected): no check for nobody.
            if tx.is_closed() {
                return;
            }
            let ok = users.verify(&user, &password);
            if let (true, Some(t)) = (ok, tag) {
                verified.insert(t);
            }
            let _ = tx.send(ok);
        });
        if self.queue.push(Source::of(peer), job).is_err() {
            return Verdict::Refused(AuthRefusal::Busy);
        }
        match rx.await {
            Ok(true) => Verdict::Allowed,
            Ok(false) => UNAUTHORIZED,
            // Displaced by a quieter source's check, or the check failed: refused, never let in.
            Err(_) => Verdict::Refused(AuthRefusal::Busy),
        }
    }
}

/// The credentials that verified, each for [`default::PROMETHEUS_AUTH_CACHE_TTL_SECS`] after
/// its last use: a bcrypt
/// check costs tens of milliseconds, and a scraper sends the same credentials every scrape (the
/// exporter-toolkit caches them too). Each entry is an HMAC-SHA256, under a key made when the
/// endpoint starts, of the user, the user's bcrypt hash and the password: never the password.
/// As the hash is in it, an entry holds only while the configuration gives that user that
/// hash: a reload that changes or removes the user makes its entries unreachable (they age
/// out), one that keeps the user keeps them. Only a check that passed adds an entry: wrong
/// passwords never make the cache grow.
pub(crate) struct Verified {
    /// `None` when the system gave no randomness for the key: every request is checked.
    key: Option<ring::hmac::Key>,
    entries: Mutex<Vec<([u8; 32], Instant)>>,
    capacity: usize,
    ttl: Duration,
}

impl Verified {
    pub(crate) fn new() -> Verified {
        Verified::with(
            default::PROMETHEUS_AUTH_CACHE,
            Duration::from_secs(default::PROMETHEUS_AUTH_CACHE_TTL_SECS),
        )
    }

    pub(crate) fn with(capacity: usize, ttl: Duration) -> Verified {
        let key =
            ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
                .ok();
        Verified {
            key,
            entries: Mutex::new(Vec::new()),
            capacity,
            ttl,
        }
    }

    /// The cache's tag of `user` with bcrypt hash `hash` and `password`.
    pub(crate) fn tag(&self, user: &str, hash: &str, password: &[u8]) -> Option<[u8; 32]> {
        let key = self.key.as_ref()?;
        let mut ctx = ring::hmac::Context::with_key(key);
        // Length-prefixed: no two (user, hash, password) triples give the same message.
        ctx.update(&(user.len() as u64).to_le_bytes());
        ctx.update(user.as_bytes());
        ctx.update(&(hash.len() as u64).to_le_bytes());
        ctx.update(hash.as_bytes());
        ctx.update(password);
        ctx.sign().as_ref().try_into().ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<([u8; 32], Instant)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `tag` verified, or was last found here, within the TTL (found, it is renewed:
    /// a scraper stays verified while it scrapes): a constant-time comparison with each entry
    /// (a few microseconds: fine on the endpoint's thread).
    pub(crate) fn holds(&self, tag: &[u8; 32]) -> bool {
        use subtle::ConstantTimeEq;
        let mut entries = self.lock();
        let ttl = self.ttl;
        entries.retain(|(_, at)| at.elapsed() < ttl);
        // Every entry compared, whatever matched: the time says nothing about which.
        let now = Instant::now();
        let mut hit = subtle::Choice::from(0);
        for (t, at) in entries.iter_mut() {
            let found = t.ct_eq(tag);
            hit |= found;
            if bool::from(found) {
                *at = now;
            }
        }
        bool::from(hit)
    }

    /// Remembers `tag` as verified now (the oldest entry goes when full; an entry already there
    /// is renewed, not doubled).
    pub(crate) fn insert(&self, tag: [u8; 32]) {
        use subtle::ConstantTimeEq;
        let mut entries = self.lock();
        entries.retain(|(t, _)| !bool::from(t.ct_eq(&tag)));
        if entries.len() >= self.capacity.max(1) {
            entries.remove(0);
        }
        entries.push((tag, Instant::now()));
    }

    /// Entries held.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
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

/// `(user, password)` of an `Authorization: Basic ...` header value.
pub(crate) fn basic_credentials(v: &[u8]) -> Option<(String, Vec<u8>)> {
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

    fn header(user: &str, password: &str) -> String {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// Holds the pool's threads until the returned barrier is waited on (once each, from one
    /// more thread): every thread holds its blocking job when this returns.
    fn block(pool: &AuthPool, from: IpAddr) -> Arc<std::sync::Barrier> {
        let n = default::PROMETHEUS_AUTH_THREADS;
        let gate = Arc::new(std::sync::Barrier::new(n + 1));
        let (entered, inside) = std::sync::mpsc::channel();
        for _ in 0..n {
            let (g, entered) = (gate.clone(), entered.clone());
            let pushed = pool.queue.push(
                Source::of(from),
                Box::new(move || {
                    let _ = entered.send(());
                    g.wait();
                }),
            );
            assert!(pushed.is_ok());
        }
        for _ in 0..n {
            inside
                .recv_timeout(Duration::from_secs(60))
                .expect("a pool thread takes its blocking job");
        }
        gate
    }

    #[test]
    fn a_flooded_address_is_refused_while_another_goes_first_and_verified_ones_skip_the_queue() {
        let hash = bcrypt::hash("pw", 4).unwrap();
        let users = Arc::new(Users::for_test(&[("alice", &hash)]));
        let counts = Arc::new(AuthCounts::default());
        let pool = AuthPool::start(counts.clone()).unwrap();
        let (right, wrong) = (header("alice", "pw"), header("alice", "nope"));
        let (flood, other) = (ip(1), ip(2));
        let tag = pool.verified.tag("alice", &hash, b"pw").unwrap();
        runtime().block_on(async {
            let gate = block(&pool, flood);
            // The flood's address fills its share with checks that note whether the other
            // address's check ran before them.
            let order = Arc::new(Mutex::new(Vec::new()));
            for _ in 0..default::PROMETHEUS_AUTH_QUEUE {
                let (order, verified) = (order.clone(), pool.verified.clone());
                let pushed = pool.queue.push(
                    Source::of(flood),
                    Box::new(move || order.lock().unwrap().push(verified.holds(&tag))),
                );
                assert!(pushed.is_ok());
            }
            assert_eq!(
                pool.check(users.clone(), Some(wrong.as_bytes()), flood)
                    .await,
                Verdict::Refused(AuthRefusal::Busy)
            );
            // The right password from the other address, never verified: queued behind the
            // check in hand only, not behind the flood's.
            let (verdict, ()) = tokio::join!(
                pool.check(users.clone(), Some(right.as_bytes()), other),
                async {
                    tokio::task::yield_now().await;
                    gate.wait();
                }
            );
            assert_eq!(verdict, Verdict::Allowed);
            // The flood's checks ran after the other address's. The pool's thread (nice 10)
            // may still be taking them on a busy machine: wait for all of them before the
            // flood's address fills its share again.
            let deadline = Instant::now() + Duration::from_secs(60);
            while order.lock().unwrap().len() < default::PROMETHEUS_AUTH_QUEUE {
                assert!(Instant::now() < deadline, "the flood's checks never ran");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(order.lock().unwrap().iter().all(|ran_after| *ran_after));
            // Verified now: from the flood's address too, inline, with the pool held and the
            // address's share full.
            let gate = block(&pool, flood);
            for _ in 0..default::PROMETHEUS_AUTH_QUEUE {
                assert!(pool.queue.push(Source::of(flood), Box::new(|| ())).is_ok());
            }
            assert_eq!(
                pool.check(users.clone(), Some(right.as_bytes()), flood)
                    .await,
                Verdict::Allowed
            );
            assert_eq!(
                pool.check(users.clone(), None, flood).await,
                Verdict::Refused(AuthRefusal::Unauthorized)
            );
            gate.wait();
        });
        assert_eq!(counts.get(AuthRefusal::Busy), 1);
        assert_eq!(counts.get(AuthRefusal::Unauthorized), 1);
    }

    #[test]
    fn wrong_passwords_never_grow_the_cache_and_a_reload_keeps_only_unchanged_users() {
        let (a, b) = (bcrypt::hash("a", 4).unwrap(), bcrypt::hash("b", 4).unwrap());
        let before = Arc::new(Users::for_test(&[("alice", &a), ("bob", &b)]));
        let pool = AuthPool::start(Arc::new(AuthCounts::default())).unwrap();
        runtime().block_on(async {
            for i in 0..20 {
                let (u, who) = if i % 2 == 0 {
                    ("alice", ip(1))
                } else {
                    ("eve", ip(3))
                };
                let wrong = header(u, &format!("guess {i}"));
                assert_eq!(
                    pool.check(before.clone(), Some(wrong.as_bytes()), who)
                        .await,
                    Verdict::Refused(AuthRefusal::Unauthorized)
                );
            }
            assert_eq!(pool.verified.len(), 0, "wrong passwords cached");
            for (h, n) in [
                (header("alice", "a"), 1),
                (header("bob", "b"), 2),
                (header("alice", "a"), 2),
            ] {
                assert_eq!(
                    pool.check(before.clone(), Some(h.as_bytes()), ip(2)).await,
                    Verdict::Allowed
                );
                assert_eq!(pool.verified.len(), n);
            }
            // A reload that changes bob's password and keeps alice's: alice inline, bob's old
            // password no longer in the cache (and wrong), his new one checked.
            let b2 = bcrypt::hash("b2", 4).unwrap();
            let after = Arc::new(Users::for_test(&[("alice", &a), ("bob", &b2)]));
            let gate = block(&pool, ip(1));
            let alice = header("alice", "a");
            assert_eq!(
                pool.check(after.clone(), Some(alice.as_bytes()), ip(2))
                    .await,
                Verdict::Allowed,
                "alice kept her hash: answered with the pool held"
            );
            gate.wait();
            assert!(
                !pool
                    .verified
                    .holds(&pool.verified.tag("bob", &b2, b"b").unwrap())
            );
            for (pw, verdict) in [
                ("b", Verdict::Refused(AuthRefusal::Unauthorized)),
                ("b2", Verdict::Allowed),
            ] {
                let h = header("bob", pw);
                assert_eq!(
                    pool.check(after.clone(), Some(h.as_bytes()), ip(2)).await,
                    verdict
                );
            }
            // A user removed: refused, whatever was cached.
            let removed = Arc::new(Users::for_test(&[("bob", &b2)]));
            assert_eq!(
                pool.check(removed, Some(alice.as_bytes()), ip(2)).await,
                Verdict::Refused(AuthRefusal::Unauthorized)
            );
        });
    }

    #[test]
    fn the_cache_expires_unless_used_and_holds_at_most_its_capacity() {
        let v = Verified::with(2, Duration::from_secs(3));
        let tags: Vec<_> = (0..3)
            .map(|i| v.tag("u", "h", format!("p{i}").as_bytes()).unwrap())
            .collect();
        assert_ne!(
            tags[0],
            v.tag("u", "h2", b"p0").unwrap(),
            "the hash is in the tag"
        );
        assert_ne!(tags[0], v.tag("up", "h", b"0").unwrap());
        for t in &tags {
            v.insert(*t);
        }
        v.insert(tags[2]);
        assert_eq!(v.len(), 2, "the oldest gone, one renewed not doubled");
        assert!(!v.holds(&tags[0]) && v.holds(&tags[1]) && v.holds(&tags[2]));
        // Used after 2 s, tags[1] is renewed; unused, tags[2] expires at 3 s.
        std::thread::sleep(Duration::from_secs(2));
        assert!(v.holds(&tags[1]));
        std::thread::sleep(Duration::from_secs(2));
        assert!(!v.holds(&tags[2]));
        assert!(v.holds(&tags[1]));
        assert_eq!(v.len(), 1);
    }
}
