//! The deferred event clock on the simulated stream measures known device work.
//!
//! The host enqueues sections of known durations and marks their boundaries with
//! `SimEventClock`, running ahead of the simulated device like an engine ahead of its GPU; a
//! resolver thread polls the tokens the way phasetrace's worker does. Every section's resolved
//! duration must match its enqueued duration within 5 % or 20 µs.

use phasetrace::timing::{Clock, Resolved, SyncClock, Token, now_ns};
use phasetrace_sim::{SimEvent, SimEventClock, SimStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn within(measured_ns: u64, expected: Duration) -> bool {
    let expected_ns = expected.as_nanos() as f64;
    let err = (measured_ns as f64 - expected_ns).abs();
    err <= (expected_ns * 0.05).max(20_000.0)
}

/// Resolves tokens in order on a separate thread, like the worker: stops at the first pending
/// token and polls again later. Returns the times and how many polls answered `Pending`.
fn resolver(
    clock: Arc<SimEventClock>,
    rx: mpsc::Receiver<Option<Token>>,
) -> std::thread::JoinHandle<(Vec<Option<u64>>, u64)> {
    std::thread::spawn(move || {
        let mut times = Vec::new();
        let mut pending_polls = 0u64;
        for token in rx {
            let Some(token) = token else {
                times.push(None);
                continue;
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match clock.resolve(token) {
                    Resolved::At(ns) => {
                        times.push(Some(ns));
                        clock.release(token);
                        break;
                    }
                    Resolved::Pending => {
                        pending_polls += 1;
                        assert!(Instant::now() < deadline, "token never resolved");
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    Resolved::Failed => panic!("a live token failed"),
                }
            }
        }
        (times, pending_polls)
    })
}

#[test]
fn resolved_durations_match_enqueued_work() {
    let stream = SimStream::new();
    let clock = Arc::new(SimEventClock::new(stream.clone()));
    assert!(clock.is_deferred());
    let (tx, rx) = mpsc::channel();
    let worker = resolver(Arc::clone(&clock), rx);

    let pattern = [20u64, 35, 50, 200, 1_000, 3_000, 25, 45];
    let mut expected = Vec::new();
    let mut before_first_mark = Vec::new();
    // Whether the section was marked while the device was still busy with earlier work (what
    // an engine running ahead of its GPU produces). When the host falls behind (a loaded CI
    // machine preempting the test), a boundary lands on an idle stream and the section also
    // contains the host's gap, exactly as on a GPU; those are only checked to be no shorter.
    let mut pipelined = Vec::new();
    for round in 0..6 {
        // A step starts with unmarked work (embedding lookup...), so the host runs ahead.
        stream.enqueue(Duration::from_micros(500));
        for &us in &pattern {
            let d = Duration::from_micros(us + round);
            before_first_mark.push(now_ns());
            tx.send(clock.mark()).unwrap();
            stream.enqueue(d);
            // Something before `a` was still queued: `d` starts exactly when `a` completes.
            let busy_at_enqueue = stream.pending() >= 3;
            tx.send(clock.mark()).unwrap();
            // `d` was still queued: `b` completes exactly when `d` ends.
            let busy_at_end = stream.pending() >= 2;
            expected.push(d);
            pipelined.push(busy_at_enqueue && busy_at_end);
        }
        // A decode step ends with the host reading the sampled token.
        stream.synchronize();
    }
    drop(tx);
    let (times, pending_polls) = worker.join().unwrap();

    assert_eq!(clock.dropped(), 0);
    assert_eq!(clock.in_flight(), 0, "every token was released");
    assert_eq!(times.len(), expected.len() * 2);
    assert!(
        pending_polls > 0,
        "the host ran ahead of the device at least once"
    );
    let checked = pipelined.iter().filter(|p| **p).count();
    assert!(
        checked * 2 >= expected.len(),
        "only {checked} of {} sections were marked ahead of the device",
        expected.len()
    );
    let mut last = 0u64;
    for (i, d) in expected.iter().enumerate() {
        let (Some(a), Some(b)) = (times[2 * i], times[2 * i + 1]) else {
            panic!("section {i} lost a mark");
        };
        assert!(a >= last && b >= a, "times are ordered");
        last = b;
        assert!(
            a >= before_first_mark[i],
            "a boundary cannot complete before it was marked"
        );
        if pipelined[i] {
            assert!(
                within(b - a, *d),
                "section {i}: expected {d:?}, resolved {} ns",
                b - a
            );
        } else {
            assert!(
                b - a >= d.as_nanos() as u64,
                "section {i} shorter than its work"
            );
        }
    }
    assert!(last <= now_ns());
}

#[test]
fn the_sync_backend_on_the_same_stream_agrees() {
    // The synchronizing backend serializes the stream, so each of its durations includes the
    // host's wake-up latency; it still has to agree with the known work, more loosely.
    let stream = SimStream::new();
    let clock = SyncClock::new(stream.clone());
    for &us in &[200u64, 1_000, 3_000] {
        let d = Duration::from_micros(us);
        let mut best = u64::MAX;
        for _ in 0..5 {
            let Some(Token(a)) = clock.mark() else {
                panic!("the sync clock always marks")
            };
            stream.enqueue(d);
            let Some(Token(b)) = clock.mark() else {
                panic!("the sync clock always marks")
            };
            assert!(b - a >= us * 1_000, "synchronize returned early");
            best = best.min(b - a);
        }
        let err = best - us * 1_000;
        assert!(
            err as f64 <= (us as f64 * 1_000.0 * 0.05).max(200_000.0),
            "{us} µs measured {best} ns"
        );
    }
}

#[test]
fn pool_exhaustion_is_counted_and_recovers() {
    let stream = SimStream::new();
    let clock = SimEventClock::with_pool_size(stream.clone(), 8);
    let mut tokens = Vec::new();
    for _ in 0..10 {
        stream.enqueue(Duration::from_micros(20));
        tokens.push(clock.mark());
    }
    let granted: Vec<Token> = tokens.iter().flatten().copied().collect();
    assert_eq!(granted.len(), 8);
    assert_eq!(tokens.iter().filter(|t| t.is_none()).count(), 2);
    assert_eq!(clock.dropped(), 2);
    assert_eq!(clock.pool_exhausted(), 2);
    assert_eq!(clock.in_flight(), 8);

    stream.synchronize();
    for t in &granted {
        assert!(matches!(clock.resolve(*t), Resolved::At(_)));
        clock.release(*t);
    }
    assert_eq!(clock.in_flight(), 0);
    let again = clock.mark().expect("the pool refills after release");
    assert_eq!(clock.dropped(), 2, "no new drops");
    stream.synchronize();
    assert!(matches!(clock.resolve(again), Resolved::At(_)));
    // Tokens of released slots are stale now.
    assert!(
        granted
            .iter()
            .all(|t| clock.resolve(*t) == Resolved::Failed)
    );
}

#[test]
fn no_panic_after_the_stream_is_dropped() {
    // The caller's handle goes away first: the clock keeps the stream alive.
    let stream = SimStream::new();
    let clock = SimEventClock::with_pool_size(stream.clone(), 64);
    let a = clock.mark().unwrap();
    stream.enqueue(Duration::from_millis(50));
    let b = clock.mark().unwrap();
    drop(stream);
    assert_eq!(clock.resolve(b), Resolved::Pending);
    clock.stream().synchronize();
    let (Resolved::At(ta), Resolved::At(tb)) = (clock.resolve(a), clock.resolve(b)) else {
        panic!("resolved after synchronize")
    };
    assert!(within(tb - ta, Duration::from_millis(50)));

    // Dropping the clock (the last handle) with work still queued neither waits for the work nor
    // panics; events recorded before complete at their device time, as on a GPU finishing its
    // queue.
    let ev = clock.stream().record_event();
    clock.stream().enqueue(Duration::from_millis(30));
    let late = SimEvent::new();
    clock.stream().record(&late);
    let _pending = clock.mark();
    let t0 = Instant::now();
    drop(clock);
    assert!(
        t0.elapsed() < Duration::from_millis(20),
        "drop waited for the work"
    );
    assert!(ev.is_complete());
    // The 30 ms of queued work runs on after the drop: poll for its event, up to a deadline
    // that a loaded machine cannot miss.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !late.is_complete() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(late.is_complete(), "queued events complete after the drop");
}
