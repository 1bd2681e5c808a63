//! [`Recorder`]: the API an engine calls at every boundary.

use super::mark::{Mark, RoundRef};
use super::{Lane, Shared};
use crate::config::{SectionLevel, SpecLevel};
use crate::names::DropReason;
use crate::timing::{Clock, HostReader};
use crate::vocab::{Layer, Phase, Section, Site, StepKind, VerifyPart};
use std::cell::{Cell, RefCell};
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
            .field("clock", &self.clock.as_ref().map(|c| c.timing()))
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

/// The capture state of one recorder (engine thread).
#[derive(Default)]
pub(crate) struct CaptureSlot {
    pub(super) active: Cell<bool>,
    pub(super) marks: RefCell<Vec<Mark>>,
}

impl CaptureSlot {
    /// Whether a capture is open on this recorder: boundaries go to the capture, not the lane.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.active.get()
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
/// The measured costs of each call, off and on, beside the reference profiler's and a
/// `tracing-opentelemetry` span, with the command and the machine: [`crate::benchmarks`].
pub struct Recorder {
    shared: Arc<Shared>,
    lane: Arc<Lane>,
    host_clock: bool,
    host: HostReader,
    steps: Cell<u64>,
    rounds: Cell<u64>,
    round_seq: Cell<u32>,
    /// Requests begun, for one-in-N sampling.
    requests: Cell<u64>,
    /// The step begun by [`Recorder::begin_step`] and not yet ended (its index), if recorded.
    open_step: Cell<Option<u32>>,
    /// The round begun by [`Recorder::begin_round`] and not yet ended (its sequence); 0: none.
    pub(super) begun_round: Cell<u32>,
    capture: CaptureSlot,
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

/// The next lane id that no lane the worker still holds uses (a live recorder's, or a dropped
/// one's whose marks are not all processed), skipping 0: ids are 16 bits and name rounds
/// ([`RoundRef`]) and requests' home lanes, so after 65,535 recorders they come back, and a
/// reused id must not be a live one. Called under the lanes' lock. With 65,535 lanes held at
/// once no id is free: the id is then shared (said once on stderr); rounds and requests of the
/// two recorders may then mix, nothing else does.
fn free_lane_id(next: &std::sync::atomic::AtomicU16, lanes: &[Arc<Lane>]) -> u16 {
    let mut id = 0;
    for _ in 0..=u16::MAX {
        id = next.fetch_add(1, Relaxed);
        if id != 0 && !lanes.iter().any(|l| l.id == id) {
            return id;
        }
    }
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        crate::diag::warning!(
            "65,535 recorders are alive at once: recorder lane ids (16 bits) are shared from now on, \
         so speculative rounds and requests of two recorders may mix (said once)"
        );
    }
    id.max(1)
}

impl Recorder {
    pub(crate) fn new(shared: Arc<Shared>, opts: RecorderOptions) -> Recorder {
        let clock = opts.clock.unwrap_or_else(|| shared.clock.clone());
        // The host clock is read inline (a raw reading) rather than through the trait object.
        let host_clock = crate::timing::is_host(clock.as_ref());
        let lane = {
            let mut lanes = shared.lanes.lock().unwrap_or_else(|p| p.into_inner());
            let id = free_lane_id(&shared.next_lane, &lanes);
            let lane = Arc::new(Lane::new(
                id,
                opts.rank.unwrap_or(shared.rank),
                clock,
                shared.queue,
            ));
            lanes.push(lane.clone());
            lane
        };
        Recorder {
            shared,
            lane,
            host_clock,
            host: HostReader::new(),
            steps: Cell::new(0),
            rounds: Cell::new(0),
            round_seq: Cell::new(0),
            requests: Cell::new(0),
            open_step: Cell::new(None),
            begun_round: Cell::new(0),
            capture: Default::default(),
            _not_sync: PhantomData,
        }
    }

    /// This recorder's rank.
    pub fn rank(&self) -> u32 {
        self.lane.rank
    }

    pub(super) fn capture_slot(&self) -> &CaptureSlot {
        &self.capture
    }

    pub(super) fn lane_id(&self) -> u16 {
        self.lane.id
    }

    pub(super) fn lane_clock(&self) -> &Arc<dyn Clock> {
        &self.lane.clock
    }

    pub(super) fn shared_state(&self) -> &Shared {
        &self.shared
    }

    pub(super) fn count_clock_drop(&self) {
        self.lane.count_drop(DropReason::Clock);
    }

    pub(super) fn count_unbalanced(&self) {
        self.lane.count_drop(DropReason::Unbalanced);
    }

    #[inline]
    pub(super) fn level(&self) -> SectionLevel {
        if cfg!(not(feature = "record-off")) {
            self.shared.level.load()
        } else {
            SectionLevel::Off
        }
    }

    #[inline]
    pub(super) fn spec_level(&self) -> SpecLevel {
        if cfg!(not(feature = "record-off")) {
            self.shared.spec_level.load()
        } else {
            SpecLevel::Off
        }
    }

    /// Whether `section` is recorded at `level`.
    #[inline]
    pub(super) fn records(level: SectionLevel, section: Section) -> bool {
        match level {
            SectionLevel::Off => false,
            SectionLevel::Full => true,
            SectionLevel::Collectives => section.kind().is_collective(),
        }
    }

    /// Stamps `mark` with a time from this recorder's clock (the host clock for a host mark)
    /// and pushes it; on failure gives a deferred token back to its clock. Host readings are raw
    /// (TSC ticks where the CPU has an invariant TSC), converted on the worker.
    ///
    /// The host-clock push outside a capture is inlined into the caller (one `rdtsc`, the
    /// ring's full check, a 24-byte store and a release store: 28 instructions); a capture and
    /// any other clock take [`Recorder::push_timed_other`], out of line. Out of line as a whole,
    /// a section begin+end took 114 instructions under callgrind; inlined, 78
    /// ([`crate::benchmarks`]).
    #[inline(always)]
    pub(super) fn push_timed(&self, mark: Mark) -> bool {
        if !self.capture.active() && (mark.is_host() || self.host_clock) {
            return self.lane.push(mark.at(self.host.read()));
        }
        self.push_timed_other(mark)
    }

    /// [`Recorder::push_timed`] in a capture, or on a clock other than the host's.
    #[inline(never)]
    fn push_timed_other(&self, mark: Mark) -> bool {
        if self.capture.active() {
            return self.capture_mark(mark);
        }
        let Some(token) = self.lane.clock.mark() else {
            self.lane.count_drop(DropReason::Clock);
            return false;
        };
        let ok = self.lane.push(mark.at(token.0));
        if !ok {
            self.lane.clock.release(token);
        }
        ok
    }

    /// Begins a decode step (one token); it ends when the guard drops or [`StepGuard::end`].
    /// It states no kind (its measurements carry no `step.kind`): [`Recorder::step_of`] does.
    ///
    /// Sampling is decided here, once per step: one step in `PHASETRACE_TRACE_EVERY` gets spans.
    /// Steps slower than `PHASETRACE_TRACE_SLOWER_THAN` get spans too; the worker decides that
    /// after the step has ended. Either way the step reads the engine's current `tracing` span
    /// as its parent here (with the tail rule on, every step, since any may be kept).
    ///
    /// Cost (`step/*` in [`crate::benchmarks`], "A step's parent span"): inside a span of a
    /// `tracing-opentelemetry` layer the parent read is most of a step's cost, paid once a step,
    /// never a section; without a `tracing` subscriber it costs nothing measurable.
    #[inline]
    #[must_use = "the step ends when the guard is dropped"]
    pub fn step(&self) -> StepGuard<'_> {
        self.step_on(None)
    }

    /// Begins a step of `kind` (prefill, decode, mixed, speculative): [`Recorder::step`], and
    /// the step's metrics and span carry `step.kind`, so that prefill and decode steps have
    /// distributions apart (a series per kind used). Its batch's output tokens
    /// ([`Recorder::serve`]) give the summary's per-token figure by kind. Same cost as
    /// [`Recorder::step`] (the kind rides in the step's begin record).
    #[inline]
    #[must_use = "the step ends when the guard is dropped"]
    pub fn step_of(&self, kind: StepKind) -> StepGuard<'_> {
        self.step_on(Some(kind))
    }

    #[inline]
    fn step_on(&self, kind: Option<StepKind>) -> StepGuard<'_> {
        if self.level() == SectionLevel::Off {
            return StepGuard {
                rec: None,
                index: 0,
            };
        }
        let n = self.steps.get();
        self.steps.set(n.wrapping_add(1));
        let sampled = self.shared.sampling.head(n);
        // Three marks more when there is a span.
        if self.shared.sampling.reads_parent(sampled) {
            self.push_parent();
        }
        let ok = self.push_timed(Mark::step_begin(sampled, n as u32, kind));
        StepGuard {
            rec: ok.then_some(self),
            index: n as u32,
        }
    }

    /// Begins a decode step without a guard, for a step whose body awaits: pair it with
    /// [`Recorder::end_step`]. Same records, sampling and cost as [`Recorder::step`].
    ///
    /// A [`StepGuard`] borrows its recorder, and a `Recorder` is `Send` but not `Sync`, so a
    /// future that holds a guard across `.await` is not `Send` and cannot be spawned on a
    /// multi-thread runtime. With this pair the future holds only the recorder, which it owns
    /// (one per decode-loop task): it is `Send`, moves between worker threads with the task,
    /// and is used from one thread at a time. The step's parent span is read here, at the
    /// begin, as for [`Recorder::step`] (inside `tracing::Instrument`, the task's span).
    ///
    /// A second `begin_step` before `end_step` leaves the first step's end missing (counted
    /// as unbalanced by the worker, never fatal); `end_step` without an open step does nothing.
    ///
    /// ```
    /// # fn main() -> Result<(), phasetrace::Error> {
    /// use phasetrace::{Profiler, Section, SectionLevel, Site};
    ///
    /// let profiler = Profiler::builder()
    ///     .without_env()
    ///     .with_level(SectionLevel::Full)
    ///     .without_prometheus()
    ///     .build()?;
    /// let rec = profiler.recorder();
    /// let decode = async move {
    ///     for _token in 0..3 {
    ///         rec.begin_step();
    ///         {
    ///             // A guard is fine where no `.await` falls inside its scope.
    ///             let _mixer = rec.section(Section::KDA_MIXER, 0u32, Site::ATTN);
    ///         }
    ///         std::future::ready(()).await; // the engine's awaits (a batch, a stream, a channel)
    ///         rec.end_step();
    ///     }
    /// };
    /// fn spawnable<F: std::future::Future + Send + 'static>(_: &F) {}
    /// spawnable(&decode); // `Send`: a multi-thread runtime can spawn it
    /// # drop(decode);
    /// # profiler.shutdown();
    /// # Ok(())
    /// # }
    /// ```
    #[inline]
    pub fn begin_step(&self) {
        self.begin_step_on(None);
    }

    /// [`Recorder::begin_step`] for a step of `kind` ([`Recorder::step_of`]); end it with
    /// [`Recorder::end_step`].
    #[inline]
    pub fn begin_step_of(&self, kind: StepKind) {
        self.begin_step_on(Some(kind));
    }

    #[inline]
    fn begin_step_on(&self, kind: Option<StepKind>) {
        let guard = self.step_on(kind);
        if guard.rec.is_some() {
            self.open_step.set(Some(guard.index));
        }
        // Its end is pushed by `end_step`.
        std::mem::forget(guard);
    }

    /// Ends the step begun by [`Recorder::begin_step`], as dropping its [`StepGuard`] would.
    #[inline]
    pub fn end_step(&self) {
        if let Some(index) = self.open_step.take() {
            drop(StepGuard {
                rec: Some(self),
                index,
            });
        }
    }

    #[cfg(feature = "tracing")]
    fn push_parent(&self) {
        use super::mark::MarkKind;
        if let Some((trace, span)) = super::engine_span::current_parent() {
            for (kind, token) in [
                (MarkKind::ParentHi, (trace >> 64) as u64),
                (MarkKind::ParentLo, trace as u64),
                (MarkKind::ParentSpan, span),
            ] {
                self.lane.push(Mark::parent(kind, token));
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
    /// Cost of a begin/end pair: off, one relaxed load; on, two clock marks and two ring
    /// pushes. Measured on a quiet 2-vCPU VM, side by side in one run: off 0.35 ns; on with the
    /// host clock 17.4 ns, **0.34x** the reference profiler's enabled section and 1.03x the
    /// floor of two TSC reads and two stores (a `tracing-opentelemetry` span: 1.03 µs). Ratios
    /// hold across machines better than times; figures, command and machine:
    /// [`crate::benchmarks`] (`cargo bench --bench hot_path`).
    #[inline]
    #[must_use = "the section ends when the guard is dropped"]
    pub fn section(
        &self,
        section: Section,
        layer: impl Into<Layer>,
        site: Site,
    ) -> SectionGuard<'_> {
        self.section_on(section, layer.into(), site, false)
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
        self.section_on(section, layer.into(), site, true)
    }

    #[inline]
    fn section_on(
        &self,
        section: Section,
        layer: Layer,
        site: Site,
        host: bool,
    ) -> SectionGuard<'_> {
        if !Self::records(self.level(), section) {
            return SectionGuard {
                rec: None,
                section,
                host: false,
            };
        }
        let ok = self.push_timed(Mark::section_begin(section, layer, site, host));
        SectionGuard {
            rec: ok.then_some(self),
            section,
            host,
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
        if !Self::records(self.level(), section) {
            return;
        }
        self.push_timed(Mark::section_end(section, false));
    }

    /// Records a rendezvous wait the engine measured itself (the probe's duration) into
    /// `phasetrace.collective.wait`. Recorded at both levels.
    #[inline]
    pub fn collective_wait(&self, site: Site, layer: impl Into<Layer>, wait: Duration) {
        if self.level() == SectionLevel::Off {
            return;
        }
        let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.lane.push(Mark::wait(site, layer.into(), ns));
    }

    /// The MoE expert ids routed in `layer` at the current step (one id per (token, expert):
    /// call it once per layer with every token's top-k ids, or once per token). Attached to
    /// the step's trace when the step is traced (a `moe.route` event, and the layer's
    /// rendezvous-probe spans), and, with `PHASETRACE_EXPERT_COUNTER=on`, counted per (rank,
    /// layer, expert) on the worker: [`crate::Profiler::expert_load`], and per-layer tokens,
    /// imbalance and hot experts as metrics (`docs/moe.md`). Ids above 65535 are dropped and
    /// counted (`reason="out_of_range"`), as are ids at or above `PHASETRACE_MOE_EXPERTS`.
    /// Recorded at the full level only. Cost: a 24-byte record per four ids
    /// ([`crate::benchmarks`], `moe/route_on_384_experts`).
    #[inline]
    pub fn moe_route(&self, layer: impl Into<Layer>, expert_ids: &[u32]) {
        if self.level() != SectionLevel::Full {
            return;
        }
        let layer = layer.into();
        let mut continued = false;
        for chunk in expert_ids.chunks(4) {
            let mut ids = [0u16; 4];
            let mut n = 0;
            for &id in chunk {
                match u16::try_from(id) {
                    Ok(v) => {
                        ids[n] = v;
                        n += 1;
                    }
                    Err(_) => self.lane.count_drop(DropReason::OutOfRange),
                }
            }
            if n > 0 {
                self.lane.push(Mark::route(layer, &ids[..n], continued));
                continued = true;
            }
        }
    }

    /// A request arrived: `id` is the engine's (unique among the requests open at once),
    /// `class` its registered kind ([`crate::Profiler::request_kind`]). Its queue time runs
    /// until the first step that [`Recorder::serve`]s it, and it ends with
    /// [`Recorder::request_end`]; the worker keeps it open in between (the hot path keeps
    /// nothing). Sampling is decided here: one request in `PHASETRACE_TRACE_EVERY` gets a span,
    /// and so does one found slow later (`PHASETRACE_TRACE_REQUESTS_TTFT_OVER`,
    /// `..._TPOT_OVER`); every step that serves a traced request is traced and linked to it.
    ///
    /// Recorded at both levels, on any recorder of the profiler (the engine's scheduler
    /// thread, say), on the host clock. Cost: off, one relaxed load; on, one host-clock read
    /// and two 24-byte records, no lock. Measured with [`Recorder::request_end`], the pair:
    /// 23-29 ns on, about 1 ns off (`request/begin_end_on`, `request/begin_end_off`, 2-vCPU
    /// development VM under load: [`crate::benchmarks`]).
    #[inline]
    pub fn request_begin(&self, id: u64, class: crate::RequestClass) {
        if self.level() == SectionLevel::Off {
            return;
        }
        let n = self.requests.get();
        self.requests.set(n.wrapping_add(1));
        let sampled = self.shared.sampling.head(n);
        if self.lane.push(Mark::request_id(id)) {
            self.lane
                .push(Mark::request_begin(class.0, sampled).at(self.host.read()));
        }
    }

    /// Request `id` is in the batch of this recorder's open step (or, called between steps,
    /// of its next one): it computes `tokens` there (its prompt or a chunk of it in prefill,
    /// 1 in decode) and gets `outputs` output tokens (0 for a prefill chunk that samples
    /// nothing, 1 per decode step; its first output token ends its time to first token).
    /// Call it once per request and step, from every rank that runs the batch: each rank's
    /// step links to the request, and the request's share of step time (by `tokens` over the
    /// batch's tokens) is counted on the rank that began it.
    ///
    /// Cost: off, one relaxed load (0.7-0.8 ns); on, one 24-byte record and no clock read (the
    /// step's boundaries time it): 2.4-2.9 ns, 0.15-0.17x a per-request `HashMap` entry updated
    /// inline (`request/serve_on` beside `request/baseline_request_table`, 2-vCPU development
    /// VM under load: [`crate::benchmarks`]). A batch of 32 costs 32 records, under 0.1 µs, a
    /// step.
    #[inline]
    pub fn serve(&self, id: u64, tokens: u32, outputs: u32) {
        if self.level() == SectionLevel::Off {
            return;
        }
        self.lane.push(Mark::serve(id, tokens, outputs, 0));
    }

    /// [`Recorder::serve`] under speculative decoding: request `id` verified `drafted`
    /// drafted tokens in this step (computing `drafted + 1`) and kept `accepted` of them
    /// (getting `accepted + 1` output tokens: the accepted drafts and the target model's bonus
    /// token); `phasetrace.request.accepted_tokens` sums them per request. An engine whose
    /// output tokens differ (no bonus token when every draft is accepted, a round truncated
    /// at the maximum length) gives them: [`Recorder::serve_speculative_outputs`].
    #[inline]
    pub fn serve_speculative(&self, id: u64, drafted: u32, accepted: u32) {
        let accepted = accepted.min(drafted);
        self.serve_speculative_outputs(id, drafted, accepted, accepted.saturating_add(1));
    }

    /// [`Recorder::serve_speculative`] with the output tokens the engine produced for request
    /// `id` in this round, `outputs`, counted as they are (the bonus token, and truncation at
    /// the maximum length or a stop token, are the engine's business): the request's output
    /// tokens, time to first token and time per output token follow `outputs`; the acceptance
    /// figures (`phasetrace.request.accepted_tokens`, and the round's
    /// `phasetrace.spec.accepted_tokens` from [`RoundGuard::end`]) follow `accepted`, as
    /// before. Same cost as [`Recorder::serve`]: one 24-byte record.
    #[inline]
    pub fn serve_speculative_outputs(&self, id: u64, drafted: u32, accepted: u32, outputs: u32) {
        if self.level() == SectionLevel::Off {
            return;
        }
        self.lane.push(Mark::serve_speculative(
            id,
            drafted,
            accepted.min(drafted),
            outputs,
        ));
    }

    /// Sequence `seq` belongs to request `request` (begun with [`Recorder::request_begin`]):
    /// an API request with several choices (`n > 1`) or beams, which the engine schedules as
    /// sequences of their own ids. The steps that [`Recorder::serve`] `seq` serve the
    /// request (its tokens, its first token, its share of each step; a step serving two of
    /// its sequences counts once in its steps and its batch), and the request ends with its
    /// last sequence's [`Recorder::request_end`] (`seq` as the id), with that sequence's
    /// finish; or with its own, earlier. An end of a sequence after its request ended is
    /// counted under `reason="ended_twice"`. Call it after `request_begin` and before the
    /// sequence is served, from any recorder. Sequence ids must differ from every open
    /// request's id and from each other (else counted under `reason="unbalanced"`).
    ///
    /// Cost: as [`Recorder::request_begin`] without the clock read: two 24-byte records.
    #[inline]
    pub fn request_sequence(&self, seq: u64, request: u64) {
        if self.level() == SectionLevel::Off {
            return;
        }
        if self.lane.push(Mark::request_id(seq)) {
            self.lane.push(Mark::sequence(request));
        }
    }

    /// Request `id` ended: its duration, time to first token and time per output token go
    /// to the `gen_ai.server.*` histograms (the last two for successful requests), and its
    /// span, if traced, ends. Cost: as [`Recorder::request_begin`].
    ///
    /// A request is ended once: a second end (a sequence that finishes in its prompt step
    /// and is ended there and again later) is ignored and counted under
    /// `reason="ended_twice"` (`phasetrace.records.dropped`), the request counted once.
    #[inline]
    pub fn request_end(&self, id: u64, finish: crate::Finish) {
        if self.level() == SectionLevel::Off {
            return;
        }
        let (code, error) = finish.code();
        if self.lane.push(Mark::request_id(id)) {
            self.lane
                .push(Mark::request_end(code, error).at(self.host.read()));
        }
    }

    /// Begins a speculative round that drafts `k` tokens. Mark each phase as it ends with
    /// [`RoundGuard::phase`], then [`RoundGuard::end`] with the accepted count.
    ///
    /// Off (`PHASETRACE_SPEC_LEVEL` off, its default): one relaxed load per call, and nothing is
    /// recorded (the first such round says so once on stderr when the level was never set).
    /// Measured: [`crate::benchmarks`].
    #[inline]
    #[must_use = "end the round with RoundGuard::end(accepted)"]
    pub fn round(&self, k: u32) -> RoundGuard<'_> {
        if self.spec_level() == SpecLevel::Off {
            self.shared.round_while_spec_off();
            return RoundGuard { rec: None, seq: 0 };
        }
        let n = self.rounds.get();
        self.rounds.set(n.wrapping_add(1));
        // Sequences skip 0, which marks "no round" in a RoundRef, and the launching round's.
        let seq = match self.round_seq.get().wrapping_add(1) {
            0 | RoundRef::LAUNCHING_SEQ => 1,
            s => s,
        };
        self.round_seq.set(seq);
        // A round begun by `begin_round` and still open is now over (counted by the worker).
        self.begun_round.set(0);
        let sampled = self.shared.sampling.head(n);
        if self.shared.sampling.reads_parent(sampled) {
            self.push_parent();
        }
        let ok = self.push_timed(Mark::round_begin(seq, k, sampled));
        RoundGuard {
            rec: ok.then_some(self),
            seq,
        }
    }

    /// Times a part of the verify walk (level 2) for `round`, from any thread of the round.
    #[inline]
    #[must_use = "the part ends when the guard is dropped"]
    pub fn verify_part(&self, round: RoundRef, part: VerifyPart) -> PartGuard<'_> {
        if self.spec_level() != SpecLevel::VerifySplit || round.seq == 0 {
            return PartGuard {
                rec: None,
                round,
                part,
            };
        }
        let ok = self.push_timed(Mark::part_begin(part, round));
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
    /// The recorder's step index (low 32 bits), named when the end is lost.
    index: u32,
}

impl StepGuard<'_> {
    /// Ends the step now.
    pub fn end(self) {}
}

impl Drop for StepGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(rec) = self.rec
            && !rec.push_timed(Mark::step_end())
        {
            // The end is lost (counted): say which step, so that the worker does not hold the
            // step open (and `phasetrace.step.open_duration` growing) until the next one.
            rec.lane.step_end_lost(self.index);
        }
    }
}

/// An open section; ends on drop.
#[must_use = "the section ends when the guard is dropped"]
#[derive(Debug)]
pub struct SectionGuard<'a> {
    rec: Option<&'a Recorder>,
    section: Section,
    host: bool,
}

impl SectionGuard<'_> {
    /// Ends the section now.
    pub fn end(self) {}
}

impl Drop for SectionGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(rec) = self.rec {
            rec.push_timed(Mark::section_end(self.section, self.host));
        }
    }
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
    /// belongs to it. Skip phases that did not run. One clock mark and one ring push: 8.5 ns on
    /// the host clock, 0.17x the reference profiler's enabled section in the same run
    /// ([`crate::benchmarks`], `spec/phase_mark_on`).
    #[inline]
    pub fn phase(&self, phase: Phase) {
        if let Some(rec) = self.rec {
            rec.push_timed(Mark::phase(phase));
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
            rec.push_timed(Mark::round_end(Some(accepted)));
        }
    }
}

impl Drop for RoundGuard<'_> {
    fn drop(&mut self) {
        // Dropped without `end`: phases still count, acceptance is unknown (counted unbalanced).
        if let Some(rec) = self.rec.take() {
            rec.push_timed(Mark::round_end(None));
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
            rec.push_timed(Mark::part_end(self.part, self.round));
        }
    }
}
