//! The endpoint's connections: a bounded total, a short time to send a request head, and, at the
//! bound, the oldest idle connection closed to admit a new one, so that clients that connect and
//! send nothing (or half a head) never lock a scraper out, however fast they reconnect.
//!
//! ```text
//! accept ─► admit
//!   under the bound            ─► in
//!   at the bound               ─► the oldest waiting connection closed (evicted), then in:
//!                                 first those without a complete request head, then those
//!                                 kept alive between requests
//!   at the bound, none waiting ─► the new one closed (refused; every one is being answered)
//!
//! a connection   Fresh ──head complete──► Busy ──response flushed──► KeptAlive
//!   (deadline)   (head time from accept,   (the answer's own           (idle time)
//!                 50-100% of it, spread)
//!                 TLS handshake included)   timeout)                      │ first byte
//!                                          Busy ◄──head complete── Head ◄─┘
//!                                                               (head time from that byte)
//! ```
//!
//! Fresh, Head and KeptAlive connections are "waiting": they may be evicted. Every close the
//! client did not ask for is counted in `phasetrace.prometheus.connections.closed{reason}`.
//!
//! The bound is also kept under the process's file descriptor limit: at start the endpoint
//! raises the soft `RLIMIT_NOFILE` towards the hard one as far as the bound needs (as Go does for
//! every program), and holds fewer connections when it cannot (said once on stderr); an accept
//! that fails for lack of descriptors evicts a waiting connection too.

use crate::names::{ConnectionClose, default};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

const HEAD: Duration = Duration::from_millis(default::PROMETHEUS_HEAD_TIMEOUT_MS);
const IDLE: Duration = Duration::from_millis(default::PROMETHEUS_IDLE_TIMEOUT_MS);

/// Closes counted by reason, for `phasetrace.prometheus.connections.closed`.
#[derive(Debug, Default)]
pub(crate) struct ConnCounts([AtomicU64; ConnectionClose::ALL.len()]);

impl ConnCounts {
    pub(crate) fn get(&self, r: ConnectionClose) -> u64 {
        self.0[r as usize].load(Ordering::Relaxed)
    }

    fn add(&self, r: ConnectionClose) {
        self.0[r as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Where a connection is in its life (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Fresh,
    Head,
    Busy,
    /// Answered, the response not yet flushed.
    Answered,
    KeptAlive,
}

impl State {
    /// The order of eviction (lower first), for the waiting states.
    fn class(self) -> Option<u8> {
        match self {
            State::Fresh | State::Head => Some(0),
            State::KeptAlive => Some(1),
            State::Busy | State::Answered => None,
        }
    }
}

/// Every connection of the endpoint.
pub(super) struct Slots {
    cap: usize,
    /// The head and idle times ([`HEAD`], [`IDLE`]; shorter in tests).
    head: Duration,
    idle: Duration,
    inner: Mutex<Inner>,
    counts: Arc<ConnCounts>,
}

#[derive(Default)]
struct Inner {
    seq: u64,
    live: HashMap<u64, Arc<Shared>>,
    /// The waiting connections by (class, when they began to wait): the first is evicted
    /// first.
    waiting: BTreeMap<(u8, u64), u64>,
}

/// One connection's side that the registry, its task, its IO and its requests share.
struct Shared {
    id: u64,
    slot: Mutex<Slot>,
    /// Told when the connection must close now (evicted).
    close: Notify,
    /// Told when its deadline changed.
    changed: Notify,
}

struct Slot {
    state: State,
    /// Its key in [`Inner::waiting`] while waiting.
    key: Option<(u8, u64)>,
    deadline: Option<(Instant, ConnectionClose)>,
}

impl Slots {
    /// At most `cap` connections at once.
    pub(super) fn new(cap: usize, counts: Arc<ConnCounts>) -> Slots {
        Slots {
            cap,
            head: HEAD,
            idle: IDLE,
            inner: Mutex::new(Inner::default()),
            counts,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new connection, evicting the oldest waiting one at the bound; `None` (counted) when
    /// every connection is being answered.
    pub(super) fn admit(self: &Arc<Self>) -> Option<Conn> {
        let mut inner = self.lock();
        if inner.live.len() >= self.cap && !self.evict_one(&mut inner) {
            self.counts.add(ConnectionClose::Refused);
            return None;
        }
        inner.seq += 1;
        let id = inner.seq;
        let key = (0, id);
        let shared = Arc::new(Shared {
            id,
            slot: Mutex::new(Slot {
                state: State::Fresh,
                key: Some(key),
                deadline: Some((
                    Instant::now() + spread(self.head, id),
                    ConnectionClose::HeadTimeout,
                )),
            }),
            close: Notify::new(),
            changed: Notify::new(),
        });
        inner.waiting.insert(key, id);
        inner.live.insert(id, shared.clone());
        Some(Conn {
            slots: self.clone(),
            shared,
        })
    }

    /// Closes the oldest waiting connection (counted), to free a slot or a file descriptor:
    /// whether there was one.
    pub(super) fn evict_oldest(&self) -> bool {
        let mut inner = self.lock();
        self.evict_one(&mut inner)
    }

    fn evict_one(&self, inner: &mut Inner) -> bool {
        let Some((_, id)) = inner.waiting.pop_first() else {
            return false;
        };
        if let Some(s) = inner.live.remove(&id) {
            lock(&s.slot).key = None;
            s.close.notify_one();
        }
        self.counts.add(ConnectionClose::Evicted);
        true
    }

    /// How many connections are held now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().live.len()
    }

    /// Moves `s` to `state`, with `deadline`, in and out of the waiting set.
    fn set(&self, s: &Shared, state: State, deadline: Option<(Instant, ConnectionClose)>) {
        let mut inner = self.lock();
        let mut slot = lock(&s.slot);
        if !inner.live.contains_key(&s.id) {
            // Evicted already: it closes at its task's next poll.
            return;
        }
        if let Some(k) = slot.key.take() {
            inner.waiting.remove(&k);
        }
        if let Some(class) = state.class() {
            inner.seq += 1;
            let k = (class, inner.seq);
            inner.waiting.insert(k, s.id);
            slot.key = Some(k);
        }
        slot.state = state;
        slot.deadline = deadline;
        drop(slot);
        drop(inner);
        s.changed.notify_one();
    }
}

/// Between 50% and 100% of `time`, by connection: a crowd that connected together (a flood, a
/// fleet of scrapers restarted at once) is not closed together, so that the endpoint never has
/// thousands of closes and reconnects to handle in one instant.
fn spread(time: Duration, id: u64) -> Duration {
    // A multiplicative hash of the id: evenly spread, no state.
    let frac = (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as u32; // 0..1024
    time - time / 2 * frac / 1024
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One admitted connection: its task runs it with [`Conn::run`]; its IO and its requests tell
/// it where it is.
#[derive(Clone)]
pub(super) struct Conn {
    slots: Arc<Slots>,
    shared: Arc<Shared>,
}

impl Conn {
    fn state(&self) -> State {
        lock(&self.shared.slot).state
    }

    /// A complete request head arrived: not evictable, no deadline until it is answered.
    pub(super) fn busy(&self) {
        self.slots.set(&self.shared, State::Busy, None);
    }

    /// The answer is made; the connection waits again once it is flushed.
    pub(super) fn answered(&self) {
        if self.state() == State::Busy {
            self.slots.set(&self.shared, State::Answered, None);
        }
    }

    /// The IO read bytes: on a kept-alive connection, a new head begins.
    pub(super) fn read_some(&self) {
        if self.state() == State::KeptAlive {
            let at = Instant::now() + self.slots.head;
            self.slots.set(
                &self.shared,
                State::Head,
                Some((at, ConnectionClose::HeadTimeout)),
            );
        }
    }

    /// The IO flushed everything written: an answered connection is idle now.
    pub(super) fn flushed(&self) {
        if self.state() == State::Answered {
            let at = Instant::now() + self.slots.idle;
            self.slots.set(
                &self.shared,
                State::KeptAlive,
                Some((at, ConnectionClose::IdleTimeout)),
            );
        }
    }

    /// Runs `serve` until it ends, the connection is evicted, or its deadline passes
    /// (counted); then gives its slot back.
    pub(super) async fn run(self, serve: impl std::future::Future<Output = ()>) {
        tokio::pin!(serve);
        loop {
            let deadline = lock(&self.shared.slot).deadline;
            let expiry = async {
                match deadline {
                    Some((at, _)) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = self.shared.close.notified() => break,
                () = &mut serve => break,
                () = self.shared.changed.notified() => {}
                () = expiry => {
                    let now = lock(&self.shared.slot).deadline;
                    if let Some((at, reason)) = now
                        && at <= Instant::now()
                    {
                        self.slots.counts.add(reason);
                        break;
                    }
                }
            }
        }
        let mut inner = self.slots.lock();
        if inner.live.remove(&self.shared.id).is_some()
            && let Some(k) = lock(&self.shared.slot).key.take()
        {
            inner.waiting.remove(&k);
        }
    }
}

/// How many connections the endpoint may hold under the process's file descriptor limit,
/// raising the soft limit towards the hard one first as far as `want` connections need.
pub(super) fn fd_bound(want: usize) -> usize {
    #[cfg(unix)]
    {
        // What the engine's own files get beside the endpoint's connections.
        const RESERVE: u64 = 1_024;
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` through a valid pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return want;
        }
        let need = want as u64 + RESERVE;
        if lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < need {
            let raised = libc::rlimit {
                rlim_cur: need.min(lim.rlim_max),
                rlim_max: lim.rlim_max,
            };
            // SAFETY: setrlimit reads one `rlimit` through a valid pointer.
            if raised.rlim_cur > lim.rlim_cur
                && unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0
            {
                lim.rlim_cur = raised.rlim_cur;
            }
        }
        if lim.rlim_cur == libc::RLIM_INFINITY || lim.rlim_cur >= need {
            return want;
        }
        let soft = lim.rlim_cur;
        let bound = usize::try_from(soft.saturating_sub(RESERVE).max(soft / 2)).unwrap_or(want);
        let bound = bound.clamp(1, want);
        eprintln!(
            "phasetrace: warning: the Prometheus endpoint holds at most {bound} connections, \
             not {want}: the process may open {soft} files (RLIMIT_NOFILE, hard limit {}); \
             raise `ulimit -n` to at least {need} for the full bound",
            lim.rlim_max
        );
        bound
    }
    #[cfg(not(unix))]
    want
}

/// Whether an accept failed for lack of file descriptors.
pub(super) fn out_of_files(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_bound_the_oldest_without_a_head_goes_first_then_the_oldest_kept_alive() {
        let counts = Arc::new(ConnCounts::default());
        let slots = Arc::new(Slots::new(3, counts.clone()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _in = rt.enter();
        let a = slots.admit().unwrap();
        let b = slots.admit().unwrap();
        let c = slots.admit().unwrap();
        // a: answered and kept alive; b: busy; c: no head yet.
        a.busy();
        a.answered();
        a.flushed();
        b.busy();
        assert_eq!(a.state(), State::KeptAlive);
        let d = slots.admit().expect("c makes room");
        assert_eq!(counts.get(ConnectionClose::Evicted), 1);
        let live = |x: &Conn| slots.lock().live.contains_key(&x.shared.id);
        assert!(!live(&c) && live(&a) && live(&b) && live(&d));
        d.busy();
        let e = slots.admit().expect("then the kept-alive a");
        assert!(!live(&a) && live(&e));
        e.busy();
        assert!(
            slots.admit().is_none(),
            "every one busy: the new one is refused"
        );
        assert_eq!(counts.get(ConnectionClose::Refused), 1);
        assert_eq!(slots.len(), 3);
        // A kept-alive connection that starts a head waits among those without one.
        b.answered();
        b.flushed();
        b.read_some();
        assert_eq!(b.state(), State::Head);
        let f = slots.admit().expect("b makes room");
        assert!(!live(&b) && live(&f));
    }

    #[test]
    fn deadlines_close_a_connection_without_a_head_and_an_idle_one_and_count_them() {
        let counts = Arc::new(ConnCounts::default());
        let (head, idle) = (Duration::from_millis(100), Duration::from_millis(300));
        let slots = Arc::new(Slots {
            head,
            idle,
            ..Slots::new(8, counts.clone())
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        // Timers fire late on a loaded machine, never early.
        let within =
            |took: Duration, want: Duration| took >= want && took < want + Duration::from_secs(5);
        rt.block_on(async {
            let fresh = slots.admit().unwrap();
            let t = Instant::now();
            fresh.clone().run(std::future::pending()).await;
            assert!(within(t.elapsed(), head / 2), "{:?}", t.elapsed());
            assert!(
                t.elapsed() < head + Duration::from_secs(5),
                "{:?}",
                t.elapsed()
            );
            assert_eq!(counts.get(ConnectionClose::HeadTimeout), 1);
            let kept = slots.admit().unwrap();
            kept.busy();
            kept.answered();
            kept.flushed();
            let t = Instant::now();
            kept.clone().run(std::future::pending()).await;
            assert!(within(t.elapsed(), idle), "{:?}", t.elapsed());
            assert_eq!(counts.get(ConnectionClose::IdleTimeout), 1);
            // Busy: no deadline of its own; it ends with its future.
            let busy = slots.admit().unwrap();
            busy.busy();
            let t = Instant::now();
            busy.clone().run(tokio::time::sleep(idle * 2)).await;
            assert!(within(t.elapsed(), idle * 2), "{:?}", t.elapsed());
            assert_eq!(slots.len(), 0, "every slot given back");
        });
        assert_eq!(counts.get(ConnectionClose::Evicted), 0);
    }

    #[test]
    fn head_times_spread_over_the_second_half() {
        let head = Duration::from_millis(5_000);
        let times: Vec<Duration> = (1..=1000).map(|id| spread(head, id)).collect();
        assert!(times.iter().all(|t| *t > head / 2 && *t <= head));
        let early = times.iter().filter(|t| **t < head * 3 / 4).count();
        assert!(
            (400..600).contains(&early),
            "{early} of 1000 in the first half of the spread"
        );
    }
}
