//! A simulated CUDA stream, for CPU-only tests, benchmarks and the demo.
//!
//! [`SimStream`] behaves like a CUDA stream as far as timing is concerned: the host enqueues
//! work items of given durations and returns at once, a device thread executes them in order,
//! events recorded onto the stream complete when the stream reaches them, and
//! [`SimStream::synchronize`] blocks until everything enqueued so far has finished.
//!
//! ```text
//! host thread: enqueue(30µs) record(ev) enqueue(20µs) ... synchronize() ──┐ (blocks)
//! sim device:  [──── 30µs ────]ev[── 20µs ──] ... ───────────────────────┘ (wakes the host)
//! ```
//!
//! On top of it, [`SimEventClock`] is a deferred [`Clock`] with the same behavior as the CUDA
//! event backend: `mark` records a pooled event without waiting, `resolve` answers `Pending` until
//! the simulated device has reached the event. `SyncClock::new(stream.clone())` gives the
//! synchronizing backend on the same stream, since [`SimStream`] implements [`StreamSync`].
//!
//! # Time model
//!
//! The device thread keeps a *virtual device clock* on the [`now_ns`] timeline, the way a GPU has
//! its own timer: an item starts at `max(end of the previous item, time it was enqueued)` and ends
//! `duration` later. The thread then waits (sleeping for long remainders, spinning for the last
//! few hundred microseconds) until the host clock has reached that end before it completes the
//! item. Event timestamps are the virtual device time at which the stream reached them, so they
//! stay exact to the nanosecond even when the OS preempts the device thread for a while (it then
//! catches up, like a GPU whose timestamps are unaffected by a slow host), while the host observes
//! completion at most a few microseconds late, as with a real driver.

use super::{Clock, Resolved, StreamSync, Token, now_ns};
use crossbeam_queue::ArrayQueue;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How many operations a [`SimStream`] queues before `enqueue` blocks (a CUDA stream's launch
/// queue is about a thousand entries deep; this one is a little deeper).
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// How many events a [`SimEventClock`] pools by default.
pub const DEFAULT_POOL_SIZE: usize = 4096;

/// Remainders above this are slept (minus [`SLEEP_MARGIN_NS`]); below it the device thread spins.
const SLEEP_THRESHOLD_NS: u64 = 400_000;
/// What a `thread::sleep` may overshoot by (timer slack is 50 µs by default on Linux).
const SLEEP_MARGIN_NS: u64 = 250_000;
/// The longest single sleep of the device thread (it checks for a shutdown in between).
const MAX_NAP_NS: u64 = 5_000_000;
/// How long `synchronize` spins on the completion counter before it parks on the condition
/// variable (CUDA's default scheduling spins as well).
const SYNC_SPIN: Duration = Duration::from_micros(50);

enum Op {
    Work {
        ns: u64,
        ready: u64,
    },
    Event {
        event: Arc<EventState>,
        generation: u64,
        ready: u64,
    },
}

struct State {
    queue: VecDeque<Op>,
    shutdown: bool,
    device_idle: bool,
}

struct Shared {
    state: Mutex<State>,
    /// The device thread waits here for work.
    work_cv: Condvar,
    /// `synchronize` callers and blocked enqueuers wait here.
    done_cv: Condvar,
    /// Operations ever enqueued (assigned under the lock, so in queue order).
    enqueued: AtomicU64,
    /// Operations ever completed.
    completed: AtomicU64,
    /// Threads waiting on `done_cv`.
    waiters: AtomicUsize,
    /// Set when the last handle is dropped: the item in progress stops waiting.
    stopping: AtomicBool,
    capacity: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; recover the data if that ever changes.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, cv: &Condvar, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// Pushes an op; `None` when the queue is full and `block` is false.
    fn push(&self, block: bool, make: impl FnOnce(u64) -> Op) -> Option<()> {
        let mut st = self.lock();
        if st.queue.len() >= self.capacity {
            if !block {
                return None;
            }
            self.waiters.fetch_add(1, Ordering::SeqCst);
            while st.queue.len() >= self.capacity && !st.shutdown {
                st = self.wait(&self.done_cv, st);
            }
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
        st.queue.push_back(make(now_ns()));
        self.enqueued.fetch_add(1, Ordering::SeqCst);
        if st.device_idle {
            st.device_idle = false;
            self.work_cv.notify_one();
        }
        Some(())
    }

    /// Blocks until every op enqueued before the call has completed.
    fn wait_idle(&self) {
        let target = self.enqueued.load(Ordering::SeqCst);
        if self.completed.load(Ordering::SeqCst) >= target {
            return;
        }
        let spin_until = Instant::now() + SYNC_SPIN;
        while Instant::now() < spin_until {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            if self.completed.load(Ordering::SeqCst) >= target {
                return;
            }
        }
        let mut st = self.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        while self.completed.load(Ordering::SeqCst) < target {
            st = self.wait(&self.done_cv, st);
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        drop(st);
    }

    /// The device thread's loop.
    fn run(&self) {
        // The virtual device clock: when the stream is free again.
        let mut cursor = 0u64;
        loop {
            let (op, draining) = {
                let mut st = self.lock();
                loop {
                    if let Some(op) = st.queue.pop_front() {
                        break (op, st.shutdown);
                    }
                    if st.shutdown {
                        return;
                    }
                    st.device_idle = true;
                    st = self.wait(&self.work_cv, st);
                }
            };
            match op {
                Op::Work { ns, ready } => {
                    cursor = cursor.max(ready).saturating_add(ns);
                    // When the last handle is gone, the rest of the queue completes at once (in
                    // virtual time) instead of holding up the drop.
                    if !draining {
                        wait_until(cursor, &self.stopping);
                    }
                }
                Op::Event {
                    event,
                    generation,
                    ready,
                } => {
                    cursor = cursor.max(ready);
                    event.complete(generation, cursor);
                }
            }
            self.completed.fetch_add(1, Ordering::SeqCst);
            if self.waiters.load(Ordering::SeqCst) > 0 {
                let _st = self.lock();
                self.done_cv.notify_all();
            }
        }
    }
}

/// Waits until [`now_ns`] reaches `deadline`: sleeps for long remainders (in slices, to notice a
/// shutdown), spins for the rest.
fn wait_until(deadline: u64, stopping: &AtomicBool) {
    loop {
        let now = now_ns();
        if now >= deadline || stopping.load(Ordering::Relaxed) {
            return;
        }
        let left = deadline - now;
        if left > SLEEP_THRESHOLD_NS {
            let nap = (left - SLEEP_MARGIN_NS).min(MAX_NAP_NS);
            std::thread::sleep(Duration::from_nanos(nap));
        } else {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        }
    }
}

/// Owns the device thread; the last [`SimStream`] handle dropping it stops the thread.
struct Device {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Device {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            self.shared.stopping.store(true, Ordering::Relaxed);
            self.shared.work_cv.notify_all();
            self.shared.done_cv.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            // The device thread does not panic; if it somehow did, there is nothing to clean up.
            let _ = thread.join();
        }
    }
}

/// A simulated CUDA stream: a device thread executing enqueued work items in order.
///
/// Cheap to clone (an `Arc` inside); every clone is the same stream. The device thread stops when
/// the last handle is dropped: work still queued then completes immediately in virtual time, so
/// events recorded before the drop still complete and the drop does not wait for the queue.
#[derive(Clone)]
pub struct SimStream {
    device: Arc<Device>,
}

impl std::fmt::Debug for SimStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimStream")
            .field("pending", &self.pending())
            .field("capacity", &self.device.shared.capacity)
            .finish()
    }
}

impl Default for SimStream {
    fn default() -> Self {
        Self::new()
    }
}

impl SimStream {
    /// A stream whose queue holds [`DEFAULT_QUEUE_CAPACITY`] operations.
    ///
    /// # Panics
    ///
    /// When the operating system cannot start a thread, as [`std::thread::spawn`] does; use
    /// [`SimStream::try_with_capacity`] to get that as an error.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_QUEUE_CAPACITY)
    }

    /// A stream whose queue holds `capacity` operations (at least 1) before `enqueue` blocks.
    ///
    /// # Panics
    ///
    /// When the operating system cannot start a thread.
    pub fn with_capacity(capacity: usize) -> Self {
        Self::try_with_capacity(capacity).expect("failed to spawn the simulated stream's thread")
    }

    /// Like [`SimStream::with_capacity`], returning the error when the thread cannot be started.
    pub fn try_with_capacity(capacity: usize) -> std::io::Result<Self> {
        let capacity = capacity.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(capacity.min(DEFAULT_QUEUE_CAPACITY)),
                shutdown: false,
                device_idle: false,
            }),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            enqueued: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            capacity,
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("phasetrace-sim-stream".into())
                .spawn(move || shared.run())?
        };
        Ok(Self {
            device: Arc::new(Device {
                shared,
                thread: Some(thread),
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.device.shared
    }

    /// Enqueues `duration` of device work and returns at once (blocks only while the queue is
    /// full, as a CUDA launch does).
    pub fn enqueue(&self, duration: Duration) {
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        let _ = self.shared().push(true, |ready| Op::Work { ns, ready });
    }

    /// Creates an event and records it onto the stream (`cudaEventRecord` on a new event).
    pub fn record_event(&self) -> SimEvent {
        let event = SimEvent::new();
        self.record(&event);
        event
    }

    /// Records `event` onto the stream: it completes when the stream reaches this point. Like
    /// CUDA, re-recording an event replaces its previous record (queries then refer to the new
    /// one). Blocks only while the queue is full.
    pub fn record(&self, event: &SimEvent) {
        let _ = self.push_record(event, true);
    }

    /// Records `event` unless the queue is full; never blocks. Returns whether it was recorded.
    pub fn try_record(&self, event: &SimEvent) -> bool {
        self.push_record(event, false)
    }

    fn push_record(&self, event: &SimEvent, block: bool) -> bool {
        self.shared()
            .push(block, |ready| {
                // Under the stream's lock, so generations enter the queue in order.
                let generation = event.0.recorded.fetch_add(1, Ordering::AcqRel) + 1;
                Op::Event {
                    event: Arc::clone(&event.0),
                    generation,
                    ready,
                }
            })
            .is_some()
    }

    /// Whether the stream has reached `event`'s latest record (`cudaEventQuery`); an event that
    /// was never recorded counts as complete, as in CUDA.
    pub fn query(&self, event: &SimEvent) -> bool {
        event.is_complete()
    }

    /// Device time from `start` to `end` (`cudaEventElapsedTime`); `None` unless both were
    /// recorded and have completed, or when `end` completed before `start`.
    pub fn elapsed(&self, start: &SimEvent, end: &SimEvent) -> Option<Duration> {
        let ns = SimEvent::elapsed_ns(start, end)?;
        u64::try_from(ns).ok().map(Duration::from_nanos)
    }

    /// Blocks until all work enqueued before the call has finished (`cudaStreamSynchronize`).
    pub fn synchronize(&self) {
        self.shared().wait_idle();
    }

    /// Operations enqueued and not yet completed.
    pub fn pending(&self) -> u64 {
        let done = self.shared().completed.load(Ordering::SeqCst);
        self.shared()
            .enqueued
            .load(Ordering::SeqCst)
            .saturating_sub(done)
    }

    /// Whether two handles are the same stream.
    pub fn same_stream(&self, other: &SimStream) -> bool {
        Arc::ptr_eq(&self.device, &other.device)
    }
}

impl StreamSync for SimStream {
    fn synchronize(&self) -> Result<(), String> {
        self.shared().wait_idle();
        Ok(())
    }
}

struct EventState {
    /// Generation of the latest record (0: never recorded).
    recorded: AtomicU64,
    /// Generation of the latest record the stream has reached.
    done: AtomicU64,
    /// Device time at which that happened, on the [`now_ns`] timeline.
    at_ns: AtomicU64,
}

impl EventState {
    fn complete(&self, generation: u64, at: u64) {
        self.at_ns.store(at, Ordering::Relaxed);
        self.done.store(generation, Ordering::Release);
    }
}

/// An event on a [`SimStream`] (`cudaEvent_t`). Clones are the same event.
#[derive(Clone)]
pub struct SimEvent(Arc<EventState>);

impl std::fmt::Debug for SimEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEvent")
            .field("complete", &self.is_complete())
            .field("completed_ns", &self.completed_ns())
            .finish()
    }
}

impl Default for SimEvent {
    fn default() -> Self {
        Self::new()
    }
}

impl SimEvent {
    /// An event that was never recorded (complete, without a time, as in CUDA).
    pub fn new() -> Self {
        Self(Arc::new(EventState {
            recorded: AtomicU64::new(0),
            done: AtomicU64::new(0),
            at_ns: AtomicU64::new(0),
        }))
    }

    /// Whether the stream has reached the event's latest record.
    pub fn is_complete(&self) -> bool {
        let recorded = self.0.recorded.load(Ordering::Acquire);
        self.0.done.load(Ordering::Acquire) >= recorded
    }

    /// When the stream reached the event's latest record, in [`now_ns`] nanoseconds; `None` while
    /// pending or when never recorded.
    pub fn completed_ns(&self) -> Option<u64> {
        let recorded = self.0.recorded.load(Ordering::Acquire);
        let done = self.0.done.load(Ordering::Acquire);
        (recorded != 0 && done >= recorded).then(|| self.0.at_ns.load(Ordering::Relaxed))
    }

    /// Signed device time from `start` to `end` in nanoseconds, when both have completed.
    pub fn elapsed_ns(start: &SimEvent, end: &SimEvent) -> Option<i64> {
        let a = start.completed_ns()?;
        let b = end.completed_ns()?;
        Some((b as i128 - a as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64)
    }
}

struct Slot {
    event: SimEvent,
    /// Bumped at every release; tokens carry it so stale tokens resolve as `Failed`.
    generation: AtomicU32,
}

/// The event backend on a [`SimStream`]: a deferred [`Clock`].
///
/// `mark` records an event from a bounded pool onto the stream and returns at once; when the pool
/// is exhausted (or the stream's queue is full) it returns `None` and counts the drop. `resolve`
/// answers `Pending` until the stream has reached the event, then `At(device time)`. `release`
/// returns the event to the pool. Memory is bounded by the pool size; nothing panics. The clock
/// holds a handle to its stream, so the stream lives as long as the clock does.
///
/// A token is `generation << 32 | slot`: resolving or releasing a token after its slot has been
/// released gives `Failed` / does nothing.
pub struct SimEventClock {
    stream: SimStream,
    slots: Box<[Slot]>,
    free: ArrayQueue<u32>,
    dropped: AtomicU64,
    pool_exhausted: AtomicU64,
    queue_full: AtomicU64,
}

impl std::fmt::Debug for SimEventClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEventClock")
            .field("pool_size", &self.pool_size())
            .field("in_flight", &self.in_flight())
            .field("dropped", &self.dropped.load(Ordering::Relaxed))
            .finish()
    }
}

impl SimEventClock {
    /// An event clock on `stream` with [`DEFAULT_POOL_SIZE`] events.
    pub fn new(stream: SimStream) -> Self {
        Self::with_pool_size(stream, DEFAULT_POOL_SIZE)
    }

    /// An event clock on `stream` pooling `pool_size` events (clamped to 1..=2^31).
    pub fn with_pool_size(stream: SimStream, pool_size: usize) -> Self {
        let n = pool_size.clamp(1, 1 << 31);
        let free = ArrayQueue::new(n);
        let slots = (0..n)
            .map(|i| {
                // Cannot fail: the queue has exactly `n` places.
                let _ = free.push(i as u32);
                Slot {
                    event: SimEvent::new(),
                    generation: AtomicU32::new(0),
                }
            })
            .collect();
        Self {
            stream,
            slots,
            free,
            dropped: AtomicU64::new(0),
            pool_exhausted: AtomicU64::new(0),
            queue_full: AtomicU64::new(0),
        }
    }

    /// The stream the events are recorded onto.
    pub fn stream(&self) -> &SimStream {
        &self.stream
    }

    /// Events in the pool.
    pub fn pool_size(&self) -> usize {
        self.slots.len()
    }

    /// Events handed out and not released yet.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Marks dropped because every pooled event was in flight.
    pub fn pool_exhausted(&self) -> u64 {
        self.pool_exhausted.load(Ordering::Relaxed)
    }

    /// Marks dropped because the stream's queue was full.
    pub fn queue_full(&self) -> u64 {
        self.queue_full.load(Ordering::Relaxed)
    }

    fn slot(&self, token: Token) -> Option<&Slot> {
        let slot = self.slots.get((token.0 & 0xffff_ffff) as usize)?;
        (slot.generation.load(Ordering::Acquire) == (token.0 >> 32) as u32).then_some(slot)
    }
}

impl Clock for SimEventClock {
    fn mark(&self) -> Option<Token> {
        let Some(index) = self.free.pop() else {
            self.pool_exhausted.fetch_add(1, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let slot = &self.slots[index as usize];
        if !self.stream.try_record(&slot.event) {
            let _ = self.free.push(index);
            self.queue_full.fetch_add(1, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let generation = slot.generation.load(Ordering::Acquire);
        Some(Token(u64::from(generation) << 32 | u64::from(index)))
    }

    fn resolve(&self, token: Token) -> Resolved {
        let Some(slot) = self.slot(token) else {
            return Resolved::Failed;
        };
        match slot.event.completed_ns() {
            Some(ns) => Resolved::At(ns),
            None => Resolved::Pending,
        }
    }

    fn release(&self, token: Token) {
        let index = (token.0 & 0xffff_ffff) as u32;
        let Some(slot) = self.slots.get(index as usize) else {
            return;
        };
        let generation = (token.0 >> 32) as u32;
        // Only the first release of a token returns its slot.
        if slot
            .generation
            .compare_exchange(
                generation,
                generation.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            let _ = self.free.push(index);
        }
    }

    fn is_deferred(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "events"
    }

    fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::SyncClock;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn enqueue_returns_at_once_and_synchronize_waits() {
        let s = SimStream::new();
        let t0 = Instant::now();
        s.enqueue(us(3_000));
        assert!(t0.elapsed() < us(1_000), "enqueue blocked");
        assert_eq!(s.pending(), 1);
        s.synchronize();
        assert!(t0.elapsed() >= us(3_000));
        assert_eq!(s.pending(), 0);
    }

    #[test]
    fn events_complete_in_order_with_device_times() {
        let s = SimStream::new();
        let a = s.record_event();
        s.enqueue(us(2_000));
        let b = s.record_event();
        s.enqueue(us(500));
        s.enqueue(us(500));
        let c = s.record_event();
        assert!(!s.query(&c));
        assert_eq!(c.completed_ns(), None);
        s.synchronize();
        assert!(s.query(&a) && s.query(&b) && s.query(&c));
        let ab = s.elapsed(&a, &b).unwrap();
        let bc = s.elapsed(&b, &c).unwrap();
        // `a` was recorded on an idle stream: the work started when it was enqueued, a little
        // after `a`. From then on the stream was busy, and virtual device time is exact.
        assert!(ab >= us(2_000) && ab < us(2_000) + us(500), "{ab:?}");
        assert_eq!(bc, us(1_000));
        assert_eq!(s.elapsed(&c, &a), None);
        assert_eq!(
            SimEvent::elapsed_ns(&c, &a),
            Some(-((ab + bc).as_nanos() as i64))
        );
        assert!(c.completed_ns().unwrap() <= now_ns());
    }

    #[test]
    fn never_recorded_event_is_complete_without_time() {
        let s = SimStream::new();
        let e = SimEvent::new();
        assert!(s.query(&e));
        assert_eq!(e.completed_ns(), None);
        assert_eq!(s.elapsed(&e, &e), None);
    }

    #[test]
    fn rerecording_refers_to_the_latest_record() {
        let s = SimStream::new();
        let e = s.record_event();
        s.synchronize();
        let first = e.completed_ns().unwrap();
        s.enqueue(us(1_000));
        s.record(&e);
        assert!(!s.query(&e), "the new record is pending");
        s.synchronize();
        assert!(e.completed_ns().unwrap() >= first + 1_000_000);
    }

    #[test]
    fn idle_gap_starts_work_at_enqueue_time() {
        let s = SimStream::new();
        let a = s.record_event();
        s.synchronize();
        std::thread::sleep(us(2_000));
        let before = now_ns();
        s.enqueue(us(100));
        let b = s.record_event();
        s.synchronize();
        let b_ns = b.completed_ns().unwrap();
        assert!(b_ns >= before + 100_000);
        assert!(s.elapsed(&a, &b).unwrap() >= us(2_100));
    }

    #[test]
    fn durations_are_accurate_in_real_time() {
        let s = SimStream::new();
        for &d in &[50u64, 200, 1_000, 3_000] {
            let mut best = Duration::MAX;
            for _ in 0..5 {
                s.synchronize();
                let t0 = Instant::now();
                s.enqueue(us(d));
                s.synchronize();
                let took = t0.elapsed();
                assert!(took >= us(d), "{d}µs took {took:?}");
                best = best.min(took);
            }
            // Generous bound: loaded CI machines preempt the spinning device thread (the virtual
            // clock keeps event times exact regardless).
            assert!(best < us(d) + us(10_000), "{d}µs took {best:?} at best");
        }
    }

    #[test]
    fn full_queue_try_record_fails_and_enqueue_blocks() {
        let s = SimStream::with_capacity(2);
        s.enqueue(us(2_000));
        s.enqueue(us(1));
        s.enqueue(us(1)); // the first one may already have been popped; fill up for sure
        let e = SimEvent::new();
        let mut refused = false;
        for _ in 0..4 {
            if !s.try_record(&e) {
                refused = true;
                break;
            }
        }
        assert!(refused);
        s.synchronize();
        assert!(s.try_record(&e));
        s.synchronize();
        assert!(s.query(&e));
    }

    #[test]
    fn drop_with_pending_work_does_not_wait_and_completes_events() {
        let s = SimStream::new();
        s.enqueue(Duration::from_secs(30));
        let e = s.record_event();
        std::thread::sleep(us(200));
        let t0 = Instant::now();
        drop(s);
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(e.is_complete());
    }

    #[test]
    fn stream_sync_for_the_sync_clock() {
        let s = SimStream::new();
        let clock = SyncClock::new(s.clone());
        let Some(Token(t0)) = clock.mark() else {
            panic!("sync clock always marks")
        };
        s.enqueue(us(1_500));
        let Some(Token(t1)) = clock.mark() else {
            panic!("sync clock always marks")
        };
        assert!(t1 - t0 >= 1_500_000);
        assert_eq!(clock.resolve(Token(t1)), Resolved::At(t1));
        assert_eq!(clock.sync_errors(), 0);
    }

    #[test]
    fn event_clock_pending_then_at() {
        let s = SimStream::new();
        let clock = SimEventClock::new(s.clone());
        assert!(clock.is_deferred());
        assert_eq!(clock.name(), "events");
        s.enqueue(us(1_000));
        let a = clock.mark().unwrap();
        s.enqueue(us(3_000));
        let b = clock.mark().unwrap();
        assert_eq!(clock.resolve(b), Resolved::Pending);
        s.synchronize();
        let (Resolved::At(ta), Resolved::At(tb)) = (clock.resolve(a), clock.resolve(b)) else {
            panic!("both resolved after synchronize")
        };
        assert_eq!(tb - ta, 3_000_000);
        assert_eq!(clock.in_flight(), 2);
        clock.release(a);
        clock.release(b);
        assert_eq!(clock.in_flight(), 0);
        // Stale tokens fail; double release is harmless.
        assert_eq!(clock.resolve(a), Resolved::Failed);
        clock.release(a);
        assert_eq!(clock.in_flight(), 0);
        assert_eq!(clock.resolve(Token(u64::MAX)), Resolved::Failed);
        clock.release(Token(u64::MAX));
    }

    #[test]
    fn event_clock_pool_exhaustion_is_counted() {
        let s = SimStream::new();
        let clock = SimEventClock::with_pool_size(s, 3);
        let tokens: Vec<_> = (0..3).map(|_| clock.mark().unwrap()).collect();
        assert_eq!(clock.mark(), None);
        assert_eq!(clock.mark(), None);
        assert_eq!(clock.dropped(), 2);
        assert_eq!(clock.pool_exhausted(), 2);
        clock.release(tokens[1]);
        let again = clock.mark().unwrap();
        assert_ne!(again, tokens[1], "a reused slot carries a new generation");
        assert_eq!(clock.resolve(tokens[1]), Resolved::Failed);
    }

    #[test]
    fn event_clock_counts_a_full_stream_queue() {
        let s = SimStream::with_capacity(1);
        let clock = SimEventClock::with_pool_size(s.clone(), 16);
        s.enqueue(us(3_000));
        s.enqueue(us(1));
        let mut none = 0;
        for _ in 0..4 {
            if clock.mark().is_none() {
                none += 1;
            }
        }
        assert!(none >= 1);
        assert_eq!(clock.queue_full(), none);
        assert_eq!(clock.dropped(), none);
        assert_eq!(
            clock.in_flight() as u64,
            4 - none,
            "refused marks give their slot back"
        );
    }

    #[test]
    fn event_clock_survives_the_callers_stream_handle() {
        let s = SimStream::new();
        let clock = SimEventClock::new(s.clone());
        drop(s);
        let a = clock.mark().unwrap();
        clock.stream().enqueue(us(100));
        let b = clock.mark().unwrap();
        clock.stream().synchronize();
        assert!(matches!(clock.resolve(a), Resolved::At(_)));
        assert!(matches!(clock.resolve(b), Resolved::At(_)));
        drop(clock);
    }

    #[test]
    fn clock_is_usable_as_a_trait_object_across_threads() {
        let s = SimStream::new();
        let clock: Arc<dyn Clock> = Arc::new(SimEventClock::new(s.clone()));
        let marker = {
            let clock = Arc::clone(&clock);
            let s = s.clone();
            std::thread::spawn(move || {
                let mut tokens = Vec::new();
                for _ in 0..100 {
                    tokens.extend(clock.mark());
                    s.enqueue(us(10));
                }
                tokens
            })
        };
        let tokens = marker.join().unwrap();
        s.synchronize();
        let mut last = 0;
        for t in tokens {
            let Resolved::At(ns) = clock.resolve(t) else {
                panic!("resolved after synchronize")
            };
            assert!(ns >= last);
            last = ns;
            clock.release(t);
        }
        assert_eq!(clock.dropped(), 0);
    }
}
