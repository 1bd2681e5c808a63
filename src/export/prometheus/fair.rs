//! The password checks waiting for the auth pool's thread, fair between the addresses they come
//! from: a flood of wrong passwords from some addresses cannot keep out the first check of a
//! scraper on another.
//!
//! ```text
//! a check from source S (an IPv4 address; an IPv6 address's /64)
//!   S's demand += 1 (the checks S asked for, halved every PROMETHEUS_AUTH_DEMAND_HALF_LIFE_SECS)
//!   S already has PROMETHEUS_AUTH_QUEUE checks waiting            ─► refused (429)
//!   PROMETHEUS_AUTH_QUEUE_TOTAL checks waiting in all
//!     the source with the highest demand asked for more than S ─► its newest check displaced (429)
//!     otherwise                                                 ─► refused (429)
//!   queued
//! the pool's thread takes the oldest check of the waiting source with the lowest demand
//! ```
//!
//! A source that floods builds up demand at the rate it asks, so a source that asks once (a
//! scraper's first scrape, its first after a reload changed its user) goes ahead of every
//! flooding one: it waits for the check in hand and its own. Demand is remembered for at most
//! PROMETHEUS_AUTH_SOURCES sources (the quietest idle one is forgotten first).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A password check, run on the pool's thread.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// Where checks come from, for fairness: an IPv4 address (an IPv4-mapped IPv6 one counts as
/// IPv4), or the /64 of an IPv6 address (one host's usual share: a host picks any address in
/// its /64).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    /// An IPv4 address.
    V4(u32),
    /// The first 64 bits of an IPv6 address.
    V6(u64),
}

impl Source {
    /// The source of a client at `ip`.
    pub(crate) fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Source::V4(u32::from(v4)),
            IpAddr::V6(v6) => Source::V6((u128::from(v6) >> 64) as u64),
        }
    }
}

/// The queue's bounds.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Checks waiting from one source.
    pub(super) per_source: usize,
    /// Checks waiting in all.
    pub(super) total: usize,
    /// Sources whose demand is remembered.
    pub(super) sources: usize,
    /// How long a source's demand takes to halve.
    pub(super) half_life: Duration,
}

/// Why a check was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Full;

struct Waiting {
    seq: u64,
    job: Job,
}

struct Entry {
    /// The checks asked for, decayed to `at`.
    demand: f64,
    at: Instant,
    waiting: VecDeque<Waiting>,
}

impl Entry {
    fn demand(&self, now: Instant, half_life: Duration) -> f64 {
        let halvings = now.saturating_duration_since(self.at).as_secs_f64()
            / half_life.as_secs_f64().max(1e-3);
        self.demand * 0.5f64.powf(halvings)
    }
}

#[derive(Default)]
struct State {
    sources: HashMap<Source, Entry>,
    waiting: usize,
    seq: u64,
    closed: bool,
}

/// Checks waiting, by source (see the module's header).
pub(super) struct FairQueue {
    limits: Limits,
    state: Mutex<State>,
    ready: Condvar,
}

impl FairQueue {
    pub(super) fn new(limits: Limits) -> FairQueue {
        FairQueue {
            limits,
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a thread panicked holding it: the state stays consistent
        // (each change is made whole before anything can panic).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job` from `source`, or refuses it (the job is dropped: its client is answered
    /// 429). A check it displaces is dropped likewise.
    pub(super) fn push(&self, source: Source, job: Job) -> Result<(), Full> {
        let displaced;
        {
            let mut s = self.lock();
            if s.closed {
                return Err(Full);
            }
            let now = Instant::now();
            let demand = self.ask(&mut s, source, now);
            let mine = s.sources.get(&source).map_or(0, |e| e.waiting.len());
            if mine >= self.limits.per_source {
                return Err(Full);
            }
            displaced = if s.waiting >= self.limits.total {
                match self.displace(&mut s, demand, now) {
                    Some(job) => Some(job),
                    None => return Err(Full),
                }
            } else {
                None
            };
            s.seq += 1;
            let seq = s.seq;
            if let Some(e) = s.sources.get_mut(&source) {
                e.waiting.push_back(Waiting { seq, job });
                s.waiting += 1;
            }
        }
        self.ready.notify_one();
        drop(displaced);
        Ok(())
    }

    /// Counts a check asked for by `source` (remembering the source, forgetting the quietest
    /// idle one when at the bound): its demand now.
    fn ask(&self, s: &mut State, source: Source, now: Instant) -> f64 {
        let half_life = self.limits.half_life;
        if !s.sources.contains_key(&source) && s.sources.len() >= self.limits.sources {
            let quietest = s
                .sources
                .iter()
                .filter(|(_, e)| e.waiting.is_empty())
                .min_by(|(_, a), (_, b)| {
                    a.demand(now, half_life)
                        .total_cmp(&b.demand(now, half_life))
                })
                .map(|(k, _)| *k);
            if let Some(k) = quietest {
                s.sources.remove(&k);
            }
        }
        let e = s.sources.entry(source).or_insert_with(|| Entry {
            demand: 0.0,
            at: now,
            waiting: VecDeque::new(),
        });
        e.demand = e.demand(now, half_life) + 1.0;
        e.at = now;
        e.demand
    }

    /// The newest check of the waiting source that asked for the most, when that is more than
    /// `demand`: taken out of the queue.
    fn displace(&self, s: &mut State, demand: f64, now: Instant) -> Option<Job> {
        let half_life = self.limits.half_life;
        let (_, loudest) = s
            .sources
            .iter_mut()
            .filter(|(_, e)| !e.waiting.is_empty())
            .map(|(_, e)| (e.demand(now, half_life), e))
            .max_by(|(a, _), (b, _)| a.total_cmp(b))
            .filter(|(d, _)| *d > demand)?;
        let job = loudest.waiting.pop_back()?.job;
        s.waiting -= 1;
        Some(job)
    }

    /// The next check: the oldest of the waiting source with the lowest demand (blocking);
    /// `None` once the queue is closed.
    pub(super) fn take(&self) -> Option<Job> {
        let half_life = self.limits.half_life;
        let mut s = self.lock();
        loop {
            if s.closed {
                return None;
            }
            if s.waiting > 0 {
                let now = Instant::now();
                let next = s
                    .sources
                    .iter()
                    .filter_map(|(k, e)| {
                        let head = e.waiting.front()?;
                        Some((e.demand(now, half_life), head.seq, *k))
                    })
                    .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                    .map(|(_, _, k)| k);
                let job = next
                    .and_then(|k| s.sources.get_mut(&k))
                    .and_then(|e| e.waiting.pop_front());
                if let Some(w) = job {
                    s.waiting -= 1;
                    return Some(w.job);
                }
            }
            s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Wakes the pool's threads to end; the checks still waiting are dropped (their clients
    /// answered 429).
    pub(super) fn close(&self) {
        let dropped: Vec<Entry> = {
            let mut s = self.lock();
            s.closed = true;
            s.waiting = 0;
            s.sources.drain().map(|(_, e)| e).collect()
        };
        self.ready.notify_all();
        drop(dropped);
    }

    /// Checks waiting, and sources remembered.
    #[cfg(test)]
    pub(super) fn sizes(&self) -> (usize, usize) {
        let s = self.lock();
        (s.waiting, s.sources.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::sync::Arc;
    use std::sync::mpsc;

    fn limits() -> Limits {
        Limits {
            per_source: 2,
            total: 4,
            sources: 8,
            half_life: Duration::from_secs(3600),
        }
    }

    fn v4(last: u8) -> Source {
        Source::of(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
    }

    /// A job that says `name` when run, and `(name, false)` when dropped unrun.
    fn job(name: &'static str, out: &mpsc::Sender<(&'static str, bool)>) -> Job {
        struct Unrun(Option<(&'static str, mpsc::Sender<(&'static str, bool)>)>);
        impl Drop for Unrun {
            fn drop(&mut self) {
                if let Some((n, tx)) = self.0.take() {
                    let _ = tx.send((n, false));
                }
            }
        }
        let mut guard = Unrun(Some((name, out.clone())));
        Box::new(move || {
            if let Some((n, tx)) = guard.0.take() {
                let _ = tx.send((n, true));
            }
        })
    }

    #[test]
    fn sources_are_keyed_by_ipv4_address_and_ipv6_slash_64() {
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::ffff:1".parse().unwrap();
        let c: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        assert_eq!(Source::of(a), Source::of(b));
        assert_ne!(Source::of(a), Source::of(c));
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        assert_eq!(Source::of(mapped), v4(2));
        assert_ne!(v4(1), v4(2));
    }

    #[test]
    fn the_quietest_source_goes_first_and_a_flooding_one_is_held_to_its_share() {
        let q = FairQueue::new(limits());
        let (tx, rx) = mpsc::channel();
        // The flood asks many times: twice queued, the rest refused at once.
        assert_eq!(q.push(v4(1), job("flood 1", &tx)), Ok(()));
        assert_eq!(q.push(v4(1), job("flood 2", &tx)), Ok(()));
        for _ in 0..50 {
            assert_eq!(q.push(v4(1), job("flood refused", &tx)), Err(Full));
        }
        assert_eq!(rx.try_recv(), Ok(("flood refused", false)));
        while rx.try_recv().is_ok() {}
        // A scraper on another address, after the flood's checks, goes first.
        assert_eq!(q.push(v4(2), job("scraper", &tx)), Ok(()));
        q.take().unwrap()();
        assert_eq!(rx.try_recv(), Ok(("scraper", true)));
        q.take().unwrap()();
        assert_eq!(rx.try_recv(), Ok(("flood 1", true)));
        assert_eq!(q.sizes(), (1, 2));
    }

    #[test]
    fn at_the_total_bound_the_loudest_source_gives_way_to_a_quieter_one() {
        let q = FairQueue::new(limits());
        let (tx, rx) = mpsc::channel();
        // Two flooding sources fill every slot (total 4).
        for _ in 0..10 {
            let _ = q.push(v4(1), job("a", &tx));
        }
        for _ in 0..5 {
            let _ = q.push(v4(3), job("b", &tx));
        }
        while rx.try_recv().is_ok() {}
        assert_eq!(q.sizes().0, 4);
        // The loudest (127.0.0.1, 10 asked) loses its newest check to the scraper.
        assert_eq!(q.push(v4(2), job("scraper", &tx)), Ok(()));
        assert_eq!(rx.try_recv(), Ok(("a", false)));
        assert_eq!(q.sizes().0, 4);
        q.take().unwrap()();
        assert_eq!(rx.try_recv(), Ok(("scraper", true)));
        // A source as loud as every waiting one displaces none: refused.
        for _ in 0..20 {
            let _ = q.push(v4(4), job("c", &tx));
        }
        while rx.try_recv().is_ok() {}
        assert_eq!(q.sizes().0, 4);
    }

    #[test]
    fn sources_beyond_the_bound_forget_the_quietest_idle_one_and_close_wakes_the_threads() {
        let q = Arc::new(FairQueue::new(limits()));
        let (tx, rx) = mpsc::channel();
        for i in 0..20 {
            let _ = q.push(v4(10 + i), job("x", &tx));
            q.take().unwrap()();
        }
        while rx.try_recv().is_ok() {}
        assert_eq!(q.sizes(), (0, 8));
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || q.take().is_none())
        };
        assert_eq!(q.push(v4(1), job("left", &tx)), Ok(()));
        // The waiting thread may take it before the close; either way it ends.
        std::thread::sleep(Duration::from_millis(20));
        q.close();
        let _ = waiter.join();
        let _ = rx.recv_timeout(Duration::from_secs(10));
        assert_eq!(q.push(v4(1), job("late", &tx)), Err(Full));
        assert!(q.take().is_none());
    }
}
