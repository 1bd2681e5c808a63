//! [`Recorder`]: the API an engine calls at every boundary.

use super::mark::{FLAG_CONTINUED, FLAG_HOST, FLAG_SAMPLED, Mark, MarkKind};
use super::{Lane, Shared};
use crate::timing::{Clock, HostReader, Token};
use crate::vocab::{Layer, Phase, Section, Site, VerifyPart};
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::time::Duration;

/// Options for [`crate::Profiler::recorder_with`].
#[derive(Clone, Default)]
pub struct RecorderOptions {
    rank: Option<u32>,
    clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for RecorderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecorderOptions")
            .field("rank", &self.rank)
            .field("clock", &self.clock.as_ref().map(|c| c.name()))
            .finish()
    }
}

impl RecorderOptions {
    /// Default options: the profiler's rank and clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `rank` attribute of everything this recorder records (ranks as threads, as in the
    /// demo). Default: the profiler's rank (`PHASETRACE_RANK`, `RANK`, `LOCAL_RANK`).
    pub fn rank(mut self, rank: u32) -> Self {
        self.rank = Some(rank);
        self
    }

    /// The clock of this recorder's boundaries (its engine stream). Default: the profiler's.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }
}

/// Records one engine thread's boundaries. Get one per thread from
/// [`crate::Profiler::recorder`]; it is `Send` but not `Sync`.
///
/// Every method first loads the profiler's level with one relaxed load and returns an inert
/// guard when its kind of record is off. When on, a boundary is one clock mark and one push into
/// this recorder's bounded buffer: no lock, no allocation, no waiting. A full buffer drops the
/// mark and counts it under `phasetrace.records.dropped{reason="queue_full"}`.
///
/// With the host clock, a boundary stores a raw TSC reading (where the CPU has an invariant TSC;
/// see [`crate::timing::host_source`]) and the worker converts it to nanoseconds.
///
/// Measured (`cargo bench --bench hot_path`, 2-vCPU EPYC VM; ratios from one run, see
/// `BENCHMARKS.md`): a section begin+end costs 2.3 ns off and 52 ns on with the host clock, at the
/// floor of two TSC reads and two stores and 0.23x the reference profiler's enabled path; a
/// phase mark 32 ns.
pub struct Recorder {
    shared: Arc<Shared>,
    lane: Arc<Lane>,
    host_clock: bool,
    host: HostReader,
    steps: Cell<u64>,
    rounds: Cell<u64>,
    round_seq: Cell<u32>,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("lane", &self.lane)
            .field("steps", &self.steps.get())
            .finish()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.lane.closed.store(true, Release);
    }
}

impl Recorder {
    pub(crate) fn new(shared: Arc<Shared>, opts: RecorderOptions) -> Recorder {
        let clock = opts.clock.unwrap_or_else(|| shared.clock.clone());
        let host_clock = crate::timing::is_host(clock.as_ref());
        let id = shared.next_lane.fetch_add(1, Relaxed);
        let lane = Arc::new(Lane::new(
            id,
            opts.rank.unwrap_or(shared.rank),
            clock,
            shared.queue,
        ));
        shared
            .lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(lane.clone());
        Recorder {
            shared,
            lane,
            host_clock,
            host: HostReader::new(),
            steps: Cell::new(0),
            rounds: Cell::new(0),
            round_seq: Cell::new(0),
            _not_sync: PhantomData,
        }
    }

    /// This recorder's rank.
    pub fn rank(&self) -> u32 {
        self.lane.rank
    }

    #[inline]
    fn level(&self) -> u8 {
        if cfg!(feature = "record") {
            self.shared.level.load(Relaxed)
        } else {
            0
        }
    }

    #[inline]
    fn spec_level(&self) -> u8 {
        if cfg!(feature = "record") {
            self.shared.spec_level.load(Relaxed)
        } else {
            0
        }
    }

    /// A token from this recorder's clock (or the host clock when `host`): host readings are raw
    /// (TSC ticks where the CPU has an invariant TSC), converted on the worker.
    #[inline]
    fn mark_token(&self, host: bool) -> Option<(u64, u8)> {
        if host || self.host_clock {
            return Some((self.host.read(), if host { FLAG_HOST } else { 0 }));
        }
        match self.lane.clock.mark() {
            Some(t) => Some((t.0, 0)),
            None => {
                self.lane.dropped_clock.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Pushes a timed mark; on failure gives a deferred token back to its clock.
    #[inline]
    fn push_timed(&self, kind: MarkKind, id: u16, site: u16, layer: u32, flag: u8) -> bool {
        let host = flag & FLAG_HOST != 0;
        let Some((token, tflag)) = self.mark_token(host) else {
            return false;
        };
        let ok = self.lane.push(Mark {
            token,
            layer,
            id,
            site,
            kind,
            flag: flag | tflag,
        });
        if !ok && tflag & FLAG_HOST == 0 && !self.host_clock {
            self.lane.clock.release(Token(token));
        }
        ok
    }

    /// Begins a decode step (one token); it ends when the guard drops or [`StepGuard::end`].
    ///
    /// Sampling is decided here, once per step: one step in `PHASETRACE_TRACE_EVERY` gets spans.
    #[inline]
    #[must_use = "the step ends when the guard is dropped"]
    pub fn step(&self) -> StepGuard<'_> {
        if self.level() == 0 {
            return StepGuard { rec: None };
        }
        let n = self.steps.get();
        self.steps.set(n.wrapping_add(1));
        let every = self.shared.trace_every;
        let sampled = every != 0 && n % every == 0;
        if sampled {
            self.push_parent();
        }
        let ok = self.push_timed(
            MarkKind::StepBegin,
            0,
            0,
            0,
            if sampled { FLAG_SAMPLED } else { 0 },
        );
        StepGuard {
            rec: ok.then_some(self),
        }
    }

    #[cfg(feature = "tracing")]
    fn push_parent(&self) {
        if !self.shared.tracing_parent.load(Relaxed) {
            return;
        }
        if let Some((trace, span)) = crate::export::tracing_layer::current_parent() {
            for (kind, token) in [
                (MarkKind::ParentHi, (trace >> 64) as u64),
                (MarkKind::ParentLo, trace as u64),
                (MarkKind::ParentSpan, span),
            ] {
                self.lane.push(Mark {
                    token,
                    layer: 0,
                    id: 0,
                    site: 0,
                    kind,
                    flag: 0,
                });
            }
        }
    }

    #[cfg(not(feature = "tracing"))]
    #[inline]
    fn push_parent(&self) {}

    /// Times a section of the current step, on this recorder's clock (host, sync or events).
    ///
    /// Sections nest: `kda_front` inside `kda_mixer` becomes a child span. At level
    /// `collectives` only collective and probe sections are recorded. A probe section
    /// (`reduce_attn_bar`) also feeds `phasetrace.collective.wait`.
    ///
    /// Cost of a begin/end pair, measured (`cargo bench --bench hot_path`, `BENCHMARKS.md`, on a
    /// 2-vCPU EPYC VM): off, one relaxed load, **2.3 ns**; on with the host clock, two raw TSC
    /// reads and two ring pushes, **52 ns**, **0.23x** the reference profiler's enabled path (its
    /// two `Instant` reads and atomics: 226 ns) and at the floor of two TSC reads and two stores;
    /// one `tracing-opentelemetry` span: 8.3 µs.
    #[inline]
    #[must_use = "the section ends when the guard is dropped"]
    pub fn section(
        &self,
        section: Section,
        layer: impl Into<Layer>,
        site: Site,
    ) -> SectionGuard<'_> {
        self.section_on(section, layer.into(), site, 0)
    }

    /// Times a section with the host clock only, never synchronizing or recording an event
    /// (host enqueue time, as `reduce_attn_enq`).
    #[inline]
    #[must_use = "the section ends when the guard is dropped"]
    pub fn host_section(
        &self,
        section: Section,
        layer: impl Into<Layer>,
        site: Site,
    ) -> SectionGuard<'_> {
        self.section_on(section, layer.into(), site, FLAG_HOST)
    }

    #[inline]
    fn section_on(&self, section: Section, layer: Layer, site: Site, flag: u8) -> SectionGuard<'_> {
        let lvl = self.level();
        if lvl == 0 || (lvl == 2 && !section.kind().is_collective()) {
            return SectionGuard {
                rec: None,
                id: 0,
                flag: 0,
            };
        }
        let ok = self.push_timed(
            MarkKind::SectionBegin,
            section.id(),
            site.id(),
            layer.0,
            flag,
        );
        SectionGuard {
            rec: ok.then_some(self),
            id: section.id(),
            flag,
        }
    }

    /// Begins a section without a guard, for engines whose begin and end sit in different
    /// scopes. Pair it with [`Recorder::end_section`]; unbalanced marks are counted, never fatal.
    #[inline]
    pub fn begin_section(&self, section: Section, layer: impl Into<Layer>, site: Site) {
        std::mem::forget(self.section(section, layer, site));
    }

    /// Ends the innermost open section, which must be `section`.
    #[inline]
    pub fn end_section(&self, section: Section) {
        let lvl = self.level();
        if lvl == 0 || (lvl == 2 && !section.kind().is_collective()) {
            return;
        }
        self.push_timed(MarkKind::SectionEnd, section.id(), 0, 0, 0);
    }

    /// Records a rendezvous wait the engine measured itself (the probe's duration) into
    /// `phasetrace.collective.wait`. Recorded at both levels.
    #[inline]
    pub fn collective_wait(&self, site: Site, layer: impl Into<Layer>, wait: Duration) {
        if self.level() == 0 {
            return;
        }
        self.lane.push(Mark {
            token: u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX),
            layer: layer.into().0,
            id: 0,
            site: site.id(),
            kind: MarkKind::Wait,
            flag: 0,
        });
    }

    /// The MoE expert ids routed in `layer` at the current step. Attached to the step's trace
    /// when the step is sampled, and counted per (layer, expert) when the expert counter is on.
    /// Ids above 65535 are dropped and counted (`reason="out_of_range"`).
    #[inline]
    pub fn moe_route(&self, layer: impl Into<Layer>, expert_ids: &[u32]) {
        if self.level() != 1 {
            return;
        }
        let layer = layer.into().0;
        let mut flag = 0;
        for chunk in expert_ids.chunks(4) {
            let mut packed = 0u64;
            let mut n = 0u16;
            for &id in chunk {
                match u16::try_from(id) {
                    Ok(v) => {
                        packed |= (v as u64) << (16 * n);
                        n += 1;
                    }
                    Err(_) => {
                        self.lane.dropped_range.fetch_add(1, Relaxed);
                    }
                }
            }
            if n > 0 {
                self.lane.push(Mark {
                    token: packed,
                    layer,
                    id: 0,
                    site: n,
                    kind: MarkKind::Route,
                    flag,
                });
                flag = FLAG_CONTINUED;
            }
        }
    }

    /// Begins a speculative round that drafts `k` tokens. Mark each phase as it ends with
    /// [`RoundGuard::phase`], then [`RoundGuard::end`] with the accepted count.
    ///
    /// Off (`PHASETRACE_SPEC_LEVEL` unset): one relaxed load; a whole disabled round (begin, a
    /// phase mark, end) measured **1.3 ns**.
    #[inline]
    #[must_use = "end the round with RoundGuard::end(accepted)"]
    pub fn round(&self, k: u32) -> RoundGuard<'_> {
        if self.spec_level() == 0 {
            return RoundGuard { rec: None, seq: 0 };
        }
        let n = self.rounds.get();
        self.rounds.set(n.wrapping_add(1));
        // Sequences skip 0, which marks "no round" in a RoundRef.
        let seq = self.round_seq.get().wrapping_add(1).max(1);
        self.round_seq.set(seq);
        let every = self.shared.trace_every;
        let sampled = every != 0 && n % every == 0;
        let ok = self.push_timed(
            MarkKind::RoundBegin,
            (seq >> 16) as u16,
            seq as u16,
            k,
            if sampled { FLAG_SAMPLED } else { 0 },
        );
        RoundGuard {
            rec: ok.then_some(self),
            seq,
        }
    }

    /// Times a part of the verify walk (level 2) for `round`, from any thread of the round.
    #[inline]
    #[must_use = "the part ends when the guard is dropped"]
    pub fn verify_part(&self, round: RoundRef, part: VerifyPart) -> PartGuard<'_> {
        if self.spec_level() < 2 || round.seq == 0 {
            return PartGuard {
                rec: None,
                round,
                part,
            };
        }
        let ok = self.push_timed(MarkKind::PartBegin, part as u16, round.lane, round.seq, 0);
        PartGuard {
            rec: ok.then_some(self),
            round,
            part,
        }
    }
}

/// An open step; ends on drop.
#[must_use = "the step ends when the guard is dropped"]
#[derive(Debug)]
pub struct StepGuard<'a> {
    rec: Option<&'a Recorder>,
}

impl StepGuard<'_> {
    /// Ends the step now.
    pub fn end(self) {}
}

impl Drop for StepGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(rec) = self.rec {
            rec.push_timed(MarkKind::StepEnd, 0, 0, 0, 0);
        }
    }
}

/// An open section; ends on drop.
#[must_use = "the section ends when the guard is dropped"]
#[derive(Debug)]
pub struct SectionGuard<'a> {
    rec: Option<&'a Recorder>,
    id: u16,
    flag: u8,
}

impl SectionGuard<'_> {
    /// Ends the section now.
    pub fn end(self) {}
}

impl Drop for SectionGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(rec) = self.rec {
            rec.push_timed(MarkKind::SectionEnd, self.id, 0, 0, self.flag);
        }
    }
}

/// Names a round for verify parts recorded on other threads. `Copy + Send`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundRef {
    lane: u16,
    seq: u32,
}

/// An open speculative round.
#[must_use = "end the round with RoundGuard::end(accepted)"]
#[derive(Debug)]
pub struct RoundGuard<'a> {
    rec: Option<&'a Recorder>,
    seq: u32,
}

impl RoundGuard<'_> {
    /// Marks the end of `phase`: the time since the round began or since the previous phase mark
    /// belongs to it. Skip phases that did not run. Measured: **32 ns** with the host clock
    /// (0.14x the reference profiler's enabled section; `BENCHMARKS.md`).
    #[inline]
    pub fn phase(&self, phase: Phase) {
        if let Some(rec) = self.rec {
            rec.push_timed(MarkKind::Phase, phase as u16, 0, 0, 0);
        }
    }

    /// A handle for [`Recorder::verify_part`] on any thread of this round.
    pub fn as_ref(&self) -> RoundRef {
        RoundRef {
            lane: self.rec.map_or(0, |r| r.lane.id),
            seq: if self.rec.is_some() { self.seq } else { 0 },
        }
    }

    /// Ends the round with `accepted` of its k drafted tokens accepted.
    #[inline]
    pub fn end(mut self, accepted: u32) {
        if let Some(rec) = self.rec.take() {
            rec.push_timed(MarkKind::RoundEnd, 0, 0, accepted.min(u32::MAX - 1), 0);
        }
    }
}

impl Drop for RoundGuard<'_> {
    fn drop(&mut self) {
        // Dropped without `end`: phases still count, acceptance is unknown (counted unbalanced).
        if let Some(rec) = self.rec.take() {
            rec.push_timed(MarkKind::RoundEnd, 0, 0, u32::MAX, 0);
        }
    }
}

/// An open verify part; ends on drop.
#[must_use = "the part ends when the guard is dropped"]
#[derive(Debug)]
pub struct PartGuard<'a> {
    rec: Option<&'a Recorder>,
    round: RoundRef,
    part: VerifyPart,
}

impl Drop for PartGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(rec) = self.rec {
            rec.push_timed(
                MarkKind::PartEnd,
                self.part as u16,
                self.round.lane,
                self.round.seq,
                0,
            );
        }
    }
}
