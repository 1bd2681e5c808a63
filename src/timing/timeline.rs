//! The process timeline: nanoseconds since the process epoch, the time every clock resolves to.
//!
//! ```text
//! engine thread                     worker (and any now_ns() caller)
//! HostReader::read() -> raw ticks ─> Conversion::to_ns(raw) = ns0 + (raw - tsc0) * rate
//!   (one rdtsc)                        (a calibration segment, refreshed about once a second)
//! ```
//!
//! **Source, decided once at start** (the first call that needs the timeline): the x86-64
//! time-stamp counter when the CPU reports an invariant TSC, the kernel keeps the TSC as its
//! clocksource, and the TSC's rate against the OS monotonic clock agrees across two start-up
//! windows of 2 ms (it does not on a virtualized TSC that drifts); otherwise the OS monotonic
//! clock (`Instant`). [`host_source`] says which, and why.
//!
//! **Calibration.** With the TSC, the hot path stores the raw counter, and converting ticks to
//! nanoseconds happens off it, on the worker. The mapping is piecewise linear: a segment
//! `(tsc0, ns0, rate)` maps ticks after `tsc0`. A refresh pairs one TSC reading with one
//! `Instant` reading (the best of a few tries, bracketed by two TSC reads; a pairing disturbed on
//! every try, by a VM exit or a cache miss, is retried at the next conversion), estimates the rate
//! over the last few refreshes (up to 16 s apart), and starts a new segment *where the old one
//! ends*, with a rate that also absorbs the offset it found over the next interval, as NTP slews
//! a clock: the timeline never steps and never runs backwards, and it stays within a few hundred
//! nanoseconds of `Instant` (which NTP itself slews, and which the kernel derives from the same
//! TSC). Refreshes come 4 ms after start, then at doubling intervals up to one second; whoever
//! converts (the worker on every pass, or a `now_ns` caller) refreshes when one is due, so the hot
//! path never does. An offset too large to slew away (more than 500 ppm of the interval: the TSC
//! or the OS clock jumped) is stepped instead and counted ([`HostClockInfo::steps`]).
//!
//! **Choosing.** `PHASETRACE_HOST_CLOCK=monotonic` ([`choose_host_source`], applied when a
//! profiler is built and by `phasetrace check`) keeps the timeline on the monotonic clock even
//! where the TSC is usable: for a VM whose TSC rate may change when it is live-migrated, which no
//! start-up check can foresee. `tsc` makes a profiler fail to build, saying why, where the TSC
//! cannot be used. The source is one per process and never changes once decided.

use super::tsc;
use crate::config::HostSourceChoice;
use crate::names::env;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering, fence};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where host-clock boundaries are read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostSource {
    /// The invariant time-stamp counter (`rdtsc`), converted to nanoseconds on the worker.
    Tsc,
    /// The OS monotonic clock (`Instant`, `clock_gettime(CLOCK_MONOTONIC)` on Linux).
    Monotonic,
}

impl HostSource {
    /// `tsc` or `monotonic`: the value of the `phasetrace.host_clock` resource attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            HostSource::Tsc => "tsc",
            HostSource::Monotonic => "monotonic",
        }
    }
}

impl std::fmt::Display for HostSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the host clock uses the source it does.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HostSourceReason {
    /// The CPU reports an invariant TSC, the kernel's clocksource is the TSC, and its rate held
    /// steady against the monotonic clock at start.
    InvariantTsc,
    /// Not an x86-64 machine: no TSC.
    NotX86_64,
    /// The CPU does not report an invariant TSC (CPUID leaf `8000_0007h`, EDX bit 8): its rate
    /// may change with power states.
    NoInvariantTsc,
    /// The kernel's clocksource is another clock (it found the TSC unstable, or was told not to
    /// use it).
    KernelClocksource(String),
    /// The TSC's rate against the monotonic clock differed by this many parts per million
    /// between two start-up windows (a virtualized TSC that drifts).
    UnsteadyRate {
        /// The disagreement, in parts per million.
        ppm: f64,
    },
    /// `PHASETRACE_HOST_CLOCK=monotonic`.
    Chosen,
}

impl From<tsc::Unusable> for HostSourceReason {
    fn from(u: tsc::Unusable) -> HostSourceReason {
        match u {
            tsc::Unusable::NotX86_64 => HostSourceReason::NotX86_64,
            tsc::Unusable::NoInvariantTsc => HostSourceReason::NoInvariantTsc,
            tsc::Unusable::KernelClocksource(cs) => HostSourceReason::KernelClocksource(cs),
        }
    }
}

impl std::fmt::Display for HostSourceReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostSourceReason::InvariantTsc => f.write_str(
                "the CPU reports an invariant TSC, the kernel's clocksource is tsc, and its rate \
                 held steady at start",
            ),
            HostSourceReason::NotX86_64 => f.write_str("not an x86-64 CPU: no TSC"),
            HostSourceReason::NoInvariantTsc => {
                f.write_str("the CPU reports no invariant TSC (CPUID 8000_0007h EDX bit 8)")
            }
            HostSourceReason::KernelClocksource(cs) => {
                write!(f, "the kernel's clocksource is {cs}, not tsc")
            }
            HostSourceReason::Chosen => write!(f, "{}=monotonic", env::HOST_CLOCK),
            HostSourceReason::UnsteadyRate { ppm } => write!(
                f,
                "the TSC's rate against the monotonic clock moved by {ppm:.0} ppm between two \
                 start-up windows (more than {MAX_START_PPM} ppm)"
            ),
        }
    }
}

/// The host clock's source, why, and its calibration so far.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct HostClockInfo {
    /// The source.
    pub source: HostSource,
    /// Why this source.
    pub reason: HostSourceReason,
    /// TSC ticks per second, as calibrated against the monotonic clock; `None` without the TSC.
    pub tsc_hz: Option<f64>,
    /// Calibration refreshes so far.
    pub refreshes: u64,
    /// Refreshes that found an offset too large to slew away and stepped the timeline.
    pub steps: u64,
    /// What the latest refresh found the timeline ahead (+) or behind (-) the monotonic clock by,
    /// in nanoseconds, before correcting it.
    pub last_offset_ns: i64,
}

/// The host clock's source and why (decided once, at the first call needing the timeline).
pub fn host_source() -> HostClockInfo {
    timeline().info()
}

/// A `PHASETRACE_HOST_CLOCK` that this process cannot follow.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum HostClockError {
    /// `tsc` was asked for and the TSC cannot be used here.
    #[error("{var}=tsc: the TSC cannot be used here: {0}; use auto or monotonic", var = env::HOST_CLOCK)]
    TscUnusable(HostSourceReason),
    /// `monotonic` was asked for after the process's timeline had started on the TSC.
    #[error(
        "{var}=monotonic: this process's host clock already reads the TSC (decided when it was \
         first needed, before this setting was applied); set it in the first profiler built, \
         before anything else in the process reads phasetrace's clock",
        var = env::HOST_CLOCK
    )]
    AlreadyTsc,
}

/// Applies `PHASETRACE_HOST_CLOCK` to this process's timeline: `auto` leaves the choice to the
/// start-up checks; `monotonic` keeps the timeline on the monotonic clock (an error if it already
/// started on the TSC); `tsc` checks that the TSC is used (an error naming why not). Called when
/// a profiler is built; idempotent.
pub fn choose_host_source(choice: HostSourceChoice) -> Result<(), HostClockError> {
    if choice == HostSourceChoice::Monotonic {
        // Read by the detection if it has not run yet; harmless if it has.
        CHOICE.store(MONOTONIC, Ordering::Relaxed);
    }
    if choice == HostSourceChoice::Auto {
        return Ok(());
    }
    follows(choice, timeline())
}

/// Whether timeline `t` is what `choice` asks for.
fn follows(choice: HostSourceChoice, t: &Timeline) -> Result<(), HostClockError> {
    match (choice, t.source) {
        (HostSourceChoice::Auto, _)
        | (HostSourceChoice::Tsc, HostSource::Tsc)
        | (HostSourceChoice::Monotonic, HostSource::Monotonic) => Ok(()),
        (HostSourceChoice::Tsc, HostSource::Monotonic) => {
            Err(HostClockError::TscUnusable(t.reason.clone()))
        }
        (HostSourceChoice::Monotonic, HostSource::Tsc) => Err(HostClockError::AlreadyTsc),
    }
}

/// `CHOICE` value: the monotonic clock was asked for (0: decide by the start-up checks).
const MONOTONIC: u8 = 1;
static CHOICE: AtomicU8 = AtomicU8::new(0);

/// Nanoseconds on the process timeline since the process-wide epoch: the time every clock
/// resolves to, and what span timestamps are made of.
///
/// With the TSC, one `rdtsc` and a conversion; otherwise [`monotonic_ns`]. Either way it follows
/// [`monotonic_ns`] closely; the cost and the drift measured over 10 minutes are in
/// [`crate::benchmarks`].
#[inline]
pub fn now_ns() -> u64 {
    let t = timeline();
    match t.source {
        HostSource::Monotonic => monotonic_ns(),
        HostSource::Tsc => t.now(),
    }
}

/// Nanoseconds on the OS monotonic clock (`Instant`) since the same epoch as [`now_ns`]: the
/// reference the timeline follows. Costs one `Instant::now()`; measured: [`crate::benchmarks`].
#[inline]
pub fn monotonic_ns() -> u64 {
    Instant::now()
        .saturating_duration_since(epoch().instant)
        .as_nanos() as u64
}

/// Converts a time on the [`now_ns`] timeline into wall-clock time for span timestamps.
pub fn to_system_time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(epoch().unix_ns.saturating_add(ns))
}

/// Reads the host clock's raw counter on the hot path: TSC ticks, or monotonic nanoseconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostReader {
    tsc: bool,
}

impl HostReader {
    /// The reader of the process's host source (decides it on first use).
    pub(crate) fn new() -> HostReader {
        HostReader {
            tsc: timeline().source == HostSource::Tsc,
        }
    }

    /// One raw reading: `rdtsc`, or `Instant::now()` since the epoch.
    #[inline(always)]
    pub(crate) fn read(self) -> u64 {
        if self.tsc {
            tsc::read()
        } else {
            monotonic_ns()
        }
    }
}

/// Turns raw host readings into timeline nanoseconds: a snapshot of the calibration, taken once
/// per drain so that a mark costs a compare, a multiply and a shift.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Conversion {
    /// Raw readings already are timeline nanoseconds.
    Identity,
    /// TSC ticks through a calibration.
    Tsc(Calib),
}

impl Conversion {
    /// The current conversion; refreshes the calibration first when a refresh is due.
    pub(crate) fn current() -> Conversion {
        let t = timeline();
        match t.source {
            HostSource::Monotonic => Conversion::Identity,
            HostSource::Tsc => {
                t.maintain(tsc::read());
                Conversion::Tsc(t.load())
            }
        }
    }

    #[inline]
    pub(crate) fn to_ns(self, raw: u64) -> u64 {
        match self {
            Conversion::Identity => raw,
            Conversion::Tsc(c) => c.to_ns(raw),
        }
    }
}

/// Refreshes the calibration if a refresh is due (the worker calls it on every pass, so that the
/// calibration stays fresh through idle stretches).
pub(crate) fn maintain() {
    let t = timeline();
    if t.source == HostSource::Tsc {
        t.maintain(tsc::read());
    }
}

/// Converts one raw host reading (used where there is no snapshot at hand).
pub(crate) fn host_to_ns(raw: u64) -> u64 {
    let t = timeline();
    match t.source {
        HostSource::Monotonic => raw,
        HostSource::Tsc => t.load().to_ns(raw),
    }
}

/// The start-up windows compared for a steady TSC rate.
const START_WINDOW: Duration = Duration::from_millis(2);
/// Most disagreement (ppm) between the two start-up windows' rates for the TSC to be used.
const MAX_START_PPM: f64 = 500.0;
/// Longest interval between calibration refreshes.
const REFRESH_MAX_NS: u64 = 1_000_000_000;
/// Refresh points the rate is estimated over (the oldest to the newest).
const HISTORY: usize = 16;
/// Tries of one (TSC, Instant) pairing; the tightest bracket is kept.
const PAIR_TRIES: usize = 7;
/// A pairing whose best bracket is wider than this (every try preempted) is never used.
const MAX_BRACKET_NS: f64 = 2_000.0;
/// A refresh pairing wider than this many times the narrowest of the recent ones (a VM exit or
/// a cache miss inside every try) is not used either, up to [`MAX_SKIPS`] times in a row: an
/// `Instant` read anywhere inside a bracket of width `w` puts the pair up to `w / 2` off.
const WIDTH_FACTOR: u64 = 3;
/// Refreshes skipped in a row for a wide bracket before one is taken anyway.
const MAX_SKIPS: u32 = 32;
/// Largest offset correction, as a fraction of the next interval (NTP slews at most 500 ppm).
const MAX_SLEW: f64 = 500e-6;
/// Fixed-point fraction bits of a segment's rate (nanoseconds per tick).
const FRAC: u32 = 40;

struct Epoch {
    instant: Instant,
    unix_ns: u64,
}

fn epoch() -> &'static Epoch {
    static EPOCH: OnceLock<Epoch> = OnceLock::new();
    EPOCH.get_or_init(|| Epoch {
        instant: Instant::now(),
        // A system clock before 1970 is a broken machine; 0 keeps spans ordered anyway.
        unix_ns: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    })
}

pub(crate) fn timeline() -> &'static Timeline {
    static TIMELINE: OnceLock<Timeline> = OnceLock::new();
    TIMELINE.get_or_init(|| {
        if CHOICE.load(Ordering::Relaxed) == MONOTONIC {
            let _ = epoch();
            Timeline::monotonic(HostSourceReason::Chosen)
        } else {
            Timeline::detect()
        }
    })
}

/// One linear piece of the mapping: ticks at or after `tsc0` map to `ns0 + (t - tsc0) * rate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seg {
    tsc0: u64,
    ns0: u64,
    /// Nanoseconds per tick, `FRAC` fraction bits.
    mult: u64,
}

impl Seg {
    #[inline]
    fn to_ns(self, t: u64) -> u64 {
        let scale = |ticks: u64| {
            ((u128::from(ticks) * u128::from(self.mult) + (1 << (FRAC - 1))) >> FRAC) as u64
        };
        if t >= self.tsc0 {
            self.ns0.saturating_add(scale(t - self.tsc0))
        } else {
            self.ns0.saturating_sub(scale(self.tsc0 - t))
        }
    }

    fn rate(&self) -> f64 {
        self.mult as f64 / (1u64 << FRAC) as f64
    }
}

fn mult(rate_ns_per_tick: f64) -> u64 {
    (rate_ns_per_tick * (1u64 << FRAC) as f64).round() as u64
}

/// The current segment and the one before it (for readings taken before the latest refresh).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Calib {
    cur: Seg,
    prev: Seg,
}

impl Calib {
    #[inline]
    fn to_ns(self, t: u64) -> u64 {
        if t >= self.cur.tsc0 {
            self.cur.to_ns(t)
        } else {
            self.prev.to_ns(t)
        }
    }
}

/// A (TSC, monotonic) pair measured together.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    tsc: u64,
    ns: u64,
    /// Width of the TSC bracket around the `Instant` read, in ticks.
    width: u64,
}

/// Measures one pair: `rdtsc`, `Instant::now()`, `rdtsc`, best of [`PAIR_TRIES`]; the TSC value
/// is the bracket's midpoint.
fn pair() -> Point {
    let mut best = Point {
        tsc: 0,
        ns: 0,
        width: u64::MAX,
    };
    for _ in 0..PAIR_TRIES {
        let a = tsc::read();
        let ns = monotonic_ns();
        let b = tsc::read();
        let w = b.wrapping_sub(a);
        if w < best.width {
            best = Point {
                tsc: a + w / 2,
                ns,
                width: w,
            };
        }
    }
    best
}

/// The narrowest of three [`pair`]s: the start-up calibration's pairs count most.
fn start_pair() -> Point {
    let (a, b, c) = (pair(), pair(), pair());
    [b, c]
        .into_iter()
        .fold(a, |x, y| if y.width < x.width { y } else { x })
}

fn slope(a: Point, b: Point) -> Option<f64> {
    (b.tsc > a.tsc && b.ns > a.ns).then(|| (b.ns - a.ns) as f64 / (b.tsc - a.tsc) as f64)
}

/// What a refresh decides: the next calibration from the current one and a new pair.
#[derive(Debug, PartialEq)]
struct Next {
    calib: Calib,
    /// The timeline's offset from the monotonic clock at the new pair, before correction.
    offset_ns: i64,
    stepped: bool,
}

/// The next calibration: a segment starting where the current one is at `m.tsc` (continuity),
/// with the rate measured from `oldest` to `m`, corrected to absorb the offset found at `m` over
/// `interval_ns`; a step to `m` when that correction would exceed [`MAX_SLEW`].
fn next_calib(cur: Calib, oldest: Point, m: Point, interval_ns: u64) -> Option<Next> {
    let rate = slope(oldest, m)?;
    let at = cur.cur.to_ns(m.tsc);
    let offset_ns = at as i64 - m.ns as i64;
    let slew = -(offset_ns as f64) / interval_ns.max(1) as f64;
    let (ns0, r, stepped) = if slew.abs() <= MAX_SLEW {
        (at, rate * (1.0 + slew), false)
    } else {
        (m.ns, rate, true)
    };
    Some(Next {
        calib: Calib {
            cur: Seg {
                tsc0: m.tsc,
                ns0,
                mult: mult(r),
            },
            prev: cur.cur,
        },
        offset_ns,
        stepped,
    })
}

struct Refresh {
    history: VecDeque<Point>,
    interval_ns: u64,
    /// Refreshes skipped in a row for a wide bracket.
    skips: u32,
    refreshes: u64,
    steps: u64,
    last_offset_ns: i64,
}

/// The process timeline: its source and, with the TSC, the published calibration.
pub(crate) struct Timeline {
    source: HostSource,
    reason: HostSourceReason,
    /// Two calibration slots (the 6 words of a `Calib` each); `generation & 1` is the one readers use.
    slots: [[AtomicU64; 6]; 2],
    generation: AtomicU64,
    /// TSC value from which a refresh is due (a hint: read relaxed, re-checked under the lock).
    due: AtomicU64,
    refresh: Mutex<Refresh>,
}

impl Timeline {
    /// Decides the source for this process.
    fn detect() -> Timeline {
        let _ = epoch();
        match tsc::check() {
            Ok(()) => Timeline::calibrated(),
            Err(reason) => Timeline::monotonic(reason.into()),
        }
    }

    fn monotonic(reason: HostSourceReason) -> Timeline {
        Timeline::with(HostSource::Monotonic, reason, None, VecDeque::new(), 0)
    }

    /// Calibrates the TSC over two start-up windows; the monotonic clock if its rate moved.
    fn calibrated() -> Timeline {
        let p0 = start_pair();
        std::thread::sleep(START_WINDOW);
        let p1 = start_pair();
        std::thread::sleep(START_WINDOW);
        let p2 = start_pair();
        let (Some(r1), Some(r2), Some(rate)) = (slope(p0, p1), slope(p1, p2), slope(p0, p2)) else {
            return Timeline::monotonic(HostSourceReason::UnsteadyRate { ppm: f64::INFINITY });
        };
        let ppm = (r1 / r2 - 1.0).abs() * 1e6;
        if ppm > MAX_START_PPM {
            return Timeline::monotonic(HostSourceReason::UnsteadyRate { ppm });
        }
        let seg = Seg {
            tsc0: p2.tsc,
            ns0: p2.ns,
            mult: mult(rate),
        };
        let baseline = p2.ns - p0.ns;
        Timeline::with(
            HostSource::Tsc,
            HostSourceReason::InvariantTsc,
            Some((
                Calib {
                    cur: seg,
                    prev: seg,
                },
                p2.tsc + (baseline as f64 / rate) as u64,
            )),
            VecDeque::from([p0, p1, p2]),
            baseline,
        )
    }

    fn with(
        source: HostSource,
        reason: HostSourceReason,
        calib: Option<(Calib, u64)>,
        history: VecDeque<Point>,
        interval_ns: u64,
    ) -> Timeline {
        let t = Timeline {
            source,
            reason,
            slots: Default::default(),
            generation: AtomicU64::new(0),
            due: AtomicU64::new(u64::MAX),
            refresh: Mutex::new(Refresh {
                history,
                interval_ns,
                skips: 0,
                refreshes: 0,
                steps: 0,
                last_offset_ns: 0,
            }),
        };
        if let Some((c, due)) = calib {
            t.store(0, c);
            t.due.store(due, Ordering::Relaxed);
        }
        t
    }

    fn store(&self, slot: usize, c: Calib) {
        let w = [
            c.cur.tsc0,
            c.cur.ns0,
            c.cur.mult,
            c.prev.tsc0,
            c.prev.ns0,
            c.prev.mult,
        ];
        for (a, v) in self.slots[slot].iter().zip(w) {
            a.store(v, Ordering::Relaxed);
        }
    }

    /// The published calibration. Never waits for a writer: a writer fills the slot readers are
    /// not using, then flips `generation`; a reader retries only if two refreshes happened meanwhile.
    #[inline]
    fn load(&self) -> Calib {
        loop {
            let g = self.generation.load(Ordering::Acquire);
            let s = &self.slots[(g & 1) as usize];
            let w: [u64; 6] = std::array::from_fn(|i| s[i].load(Ordering::Relaxed));
            // Pairs with the release fence before a writer reuses this slot: had we read any of
            // its new values, the load below would see a newer generation.
            fence(Ordering::Acquire);
            if self.generation.load(Ordering::Relaxed) == g {
                return Calib {
                    cur: Seg {
                        tsc0: w[0],
                        ns0: w[1],
                        mult: w[2],
                    },
                    prev: Seg {
                        tsc0: w[3],
                        ns0: w[4],
                        mult: w[5],
                    },
                };
            }
        }
    }

    /// Publishes a new calibration. Called with the refresh lock held (one writer).
    fn publish(&self, c: Calib) {
        let g = self.generation.load(Ordering::Relaxed);
        let next = g.wrapping_add(1);
        // Orders the generation readers may have loaded before the slot writes below.
        fence(Ordering::Release);
        self.store((next & 1) as usize, c);
        self.generation.store(next, Ordering::Release);
    }

    /// Timeline nanoseconds now (TSC source).
    #[inline]
    fn now(&self) -> u64 {
        let raw = tsc::read();
        self.maintain(raw);
        self.load().to_ns(raw)
    }

    /// Refreshes the calibration when one is due at `raw`; never waits for another refresher.
    #[inline]
    fn maintain(&self, raw: u64) {
        if raw >= self.due.load(Ordering::Relaxed) {
            self.refresh_now();
        }
    }

    #[cold]
    fn refresh_now(&self) {
        let Ok(mut st) = self.refresh.try_lock() else {
            return;
        };
        let m = pair();
        if m.tsc < self.due.load(Ordering::Relaxed) {
            return; // another thread refreshed meanwhile
        }
        let cur = self.load();
        let Some(&oldest) = st.history.front() else {
            return;
        };
        let floor = st.history.iter().map(|p| p.width).min().unwrap_or(m.width);
        if m.width as f64 * cur.cur.rate() > MAX_BRACKET_NS
            || (m.width > floor.saturating_mul(WIDTH_FACTOR) && st.skips < MAX_SKIPS)
        {
            // Disturbed on every try: try again at the next conversion.
            st.skips += 1;
            return;
        }
        st.skips = 0;
        let interval_ns = st.interval_ns.saturating_mul(2).clamp(1, REFRESH_MAX_NS);
        let Some(next) = next_calib(cur, oldest, m, interval_ns) else {
            // The TSC did not advance against the monotonic clock: keep the calibration, and
            // start the history over from this pair.
            st.history.clear();
            st.history.push_back(m);
            return;
        };
        self.publish(next.calib);
        st.history.push_back(m);
        if st.history.len() > HISTORY {
            st.history.pop_front();
        }
        st.interval_ns = interval_ns;
        st.refreshes += 1;
        st.steps += u64::from(next.stepped);
        st.last_offset_ns = next.offset_ns;
        let rate = slope(oldest, m).unwrap_or(cur.cur.rate());
        self.due.store(
            m.tsc.saturating_add((interval_ns as f64 / rate) as u64),
            Ordering::Relaxed,
        );
    }

    fn info(&self) -> HostClockInfo {
        let st = self.refresh.lock().unwrap_or_else(PoisonError::into_inner);
        HostClockInfo {
            source: self.source,
            reason: self.reason.clone(),
            tsc_hz: (self.source == HostSource::Tsc).then(|| 1e9 / self.load().cur.rate()),
            refreshes: st.refreshes,
            steps: st.steps,
            last_offset_ns: st.last_offset_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GHZ3: f64 = 1.0 / 3.0; // ns per tick of a 3 GHz TSC

    fn pt(tsc: u64, ns: u64) -> Point {
        Point { tsc, ns, width: 0 }
    }

    fn seg(tsc0: u64, ns0: u64, rate: f64) -> Seg {
        Seg {
            tsc0,
            ns0,
            mult: mult(rate),
        }
    }

    #[test]
    fn a_segment_maps_ticks_before_and_after_its_start() {
        let s = seg(3_000, 1_000, GHZ3);
        assert_eq!(s.to_ns(3_000), 1_000);
        assert_eq!(s.to_ns(6_000), 2_000);
        assert_eq!(s.to_ns(3_000 + 3_000_000_000), 1_000_001_000);
        assert_eq!(s.to_ns(0), 0);
        assert_eq!(s.to_ns(1_500), 500);
        // An hour of ticks: the rate's 40 fraction bits leave a few nanoseconds of rounding.
        let hour = 3_000_000_000u64 * 3600;
        assert!(s.to_ns(3_000 + hour).abs_diff(1_000 + 3_600_000_000_000) < 10);
    }

    #[test]
    fn a_refresh_slews_the_offset_away_without_a_step() {
        // The calibration runs 1 µs behind the monotonic clock at the new pair.
        let c = Calib {
            cur: seg(0, 0, GHZ3),
            prev: seg(0, 0, GHZ3),
        };
        let oldest = pt(0, 0);
        let m = pt(3_000_000_000, 1_000_001_000);
        let n = next_calib(c, oldest, m, 1_000_000_000).unwrap();
        assert!(!n.stepped);
        assert_eq!(n.offset_ns, -1_000);
        // Continuous where the old segment ends...
        assert_eq!(n.calib.cur.to_ns(m.tsc), c.cur.to_ns(m.tsc));
        assert_eq!(n.calib.to_ns(m.tsc - 1), c.cur.to_ns(m.tsc - 1));
        // ...and caught up with the monotonic clock one interval later (the rate measured from
        // `oldest` to `m` continues).
        let later = m.tsc + 3_000_000_000;
        let truth = m.ns as f64 + 3e9 * slope(oldest, m).unwrap();
        assert!((n.calib.to_ns(later) as f64 - truth).abs() < 2.0);
    }

    #[test]
    fn an_offset_too_large_to_slew_is_stepped_and_said() {
        let c = Calib {
            cur: seg(0, 0, GHZ3),
            prev: seg(0, 0, GHZ3),
        };
        let m = pt(3_000_000_000, 1_002_000_000);
        let n = next_calib(c, pt(0, 0), m, 1_000_000_000).unwrap();
        assert!(n.stepped);
        assert_eq!(n.calib.cur.to_ns(m.tsc), m.ns);
    }

    #[test]
    fn a_tsc_that_did_not_advance_gives_no_calibration() {
        let c = Calib {
            cur: seg(0, 0, GHZ3),
            prev: seg(0, 0, GHZ3),
        };
        let p = pt(10, 10);
        assert_eq!(next_calib(c, p, p, 1_000), None);
    }

    #[test]
    fn the_host_clock_setting_is_followed_or_refused_with_the_reason() {
        let mono = Timeline::monotonic(HostSourceReason::NoInvariantTsc);
        let tsc = Timeline::with(
            HostSource::Tsc,
            HostSourceReason::InvariantTsc,
            None,
            VecDeque::new(),
            0,
        );
        for t in [&mono, &tsc] {
            assert_eq!(follows(HostSourceChoice::Auto, t), Ok(()));
        }
        assert_eq!(follows(HostSourceChoice::Tsc, &tsc), Ok(()));
        assert_eq!(follows(HostSourceChoice::Monotonic, &mono), Ok(()));
        let e = follows(HostSourceChoice::Tsc, &mono).unwrap_err();
        assert_eq!(
            e.to_string(),
            "PHASETRACE_HOST_CLOCK=tsc: the TSC cannot be used here: the CPU reports no invariant \
             TSC (CPUID 8000_0007h EDX bit 8); use auto or monotonic"
        );
        let e = follows(HostSourceChoice::Monotonic, &tsc).unwrap_err();
        assert_eq!(e, HostClockError::AlreadyTsc);
        assert!(
            e.to_string()
                .starts_with("PHASETRACE_HOST_CLOCK=monotonic: "),
            "{e}"
        );
        assert_eq!(
            HostSourceReason::Chosen.to_string(),
            "PHASETRACE_HOST_CLOCK=monotonic"
        );
    }

    #[test]
    fn a_monotonic_timeline_is_the_monotonic_clock() {
        let t = Timeline::monotonic(HostSourceReason::NotX86_64);
        assert_eq!(t.info().source, HostSource::Monotonic);
        assert_eq!(t.info().tsc_hz, None);
        assert_eq!(Conversion::Identity.to_ns(12_345), 12_345);
        let reader = HostReader { tsc: false };
        let a = monotonic_ns();
        let r = reader.read();
        let b = monotonic_ns();
        assert!(a <= r && r <= b);
    }

    /// The choice agrees with what the kernel says about this machine's TSC.
    #[test]
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn the_source_follows_the_cpu_flags_and_the_kernel_clocksource() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags = cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .unwrap_or_default();
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        let clocksource = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .unwrap_or_default();
        let info = host_source();
        if !(has("constant_tsc") && has("nonstop_tsc")) {
            assert_eq!(info.reason, HostSourceReason::NoInvariantTsc, "{info:?}");
        } else if clocksource.trim() != "tsc" {
            assert_eq!(
                info.reason,
                HostSourceReason::KernelClocksource(clocksource.trim().to_owned())
            );
        } else {
            assert!(
                matches!(
                    info.reason,
                    HostSourceReason::InvariantTsc | HostSourceReason::UnsteadyRate { .. }
                ),
                "{info:?}"
            );
        }
        assert_eq!(info.source == HostSource::Tsc, info.tsc_hz.is_some());
        if let Some(hz) = info.tsc_hz {
            assert!((1e8..1e10).contains(&hz), "{hz} Hz");
        }
    }

    /// Readings converted on the worker and `now_ns` (what the sync, simulated and CUDA clocks
    /// read) are one monotone timeline, through calibration refreshes: a reading taken before a
    /// `now_ns` call never converts to a later time, nor one taken after it to an earlier one.
    #[test]
    fn converted_readings_and_now_ns_are_one_monotone_timeline_across_refreshes() {
        let t = Timeline::detect();
        if t.source != HostSource::Tsc {
            eprintln!("no TSC here ({}): nothing to compare", t.reason);
            return;
        }
        let reader = HostReader { tsc: true };
        let start = Instant::now();
        let mut n = 0u64;
        let mut last = 0u64;
        // Long enough for several refreshes of a fresh timeline (4, 8, 16, 32, 64 ms...).
        while start.elapsed() < Duration::from_millis(150) || t.info().refreshes < 3 {
            let r0 = reader.read();
            let mid = t.now();
            let r1 = reader.read();
            let c = t.load();
            let (a, b) = (c.to_ns(r0), c.to_ns(r1));
            assert!(a <= mid && mid <= b, "{a} <= {mid} <= {b} (iteration {n})");
            assert!(mid >= last, "now went backwards: {last} -> {mid}");
            last = mid;
            n += 1;
            assert!(start.elapsed() < Duration::from_secs(20), "no refresh came");
        }
        let info = t.info();
        assert_eq!(info.steps, 0, "{info:?}");
        assert!(
            info.last_offset_ns.abs() < 20_000,
            "the calibration is {} ns off the monotonic clock",
            info.last_offset_ns
        );
    }
}
