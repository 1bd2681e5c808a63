//! The record the hot path stores: a small `Copy` mark, 24 bytes.
//!
//! A mark's payload fields mean different things by kind, so they are private: a mark is made
//! by a constructor named for its kind and read through accessors named for what they return.
//! The recorder builds a mark without its time, then [`Mark::at`] stamps the clock's token.

use crate::vocab::{Layer, Phase, Section, Site, StepKind, VerifyPart};

/// What a mark says. The worker pairs begins with ends and turns marks into durations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum MarkKind {
    /// A step began.
    StepBegin,
    /// The current step ended.
    StepEnd,
    /// A section began, in a layer, at a site.
    SectionBegin,
    /// A section ended.
    SectionEnd,
    /// A rendezvous wait measured by the engine; the token is its duration in nanoseconds.
    Wait,
    /// Up to four routed expert ids of a layer, packed into the token.
    Route,
    /// A speculative round of k drafted tokens began.
    RoundBegin,
    /// A phase of the open round just ended.
    Phase,
    /// The round ended, with its accepted count when known.
    RoundEnd,
    /// A verify part of a round (possibly another thread's) began.
    PartBegin,
    /// A verify part ended (same round and part as its begin).
    PartEnd,
    /// Parent span context of the next sampled step, in three marks: trace id high, low, span id.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    ParentHi,
    /// See [`MarkKind::ParentHi`].
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    ParentLo,
    /// See [`MarkKind::ParentHi`].
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    ParentSpan,
    /// A captured CUDA graph is about to be launched; the token is the fence before the launch.
    ReplayBegin,
    /// The launch was enqueued; the token is the fence after it (same graph and sequence).
    ReplayEnd,
    /// The engine's id of the request that the next `RequestBegin` or `RequestEnd` is about
    /// (the token).
    RequestId,
    /// A request arrived (a host time), of a registered class.
    RequestBegin,
    /// A request is served by the open step (or, between steps, the next): its id (the
    /// token), the tokens it computes and the output tokens it gets there.
    Serve,
    /// A request ended (a host time), with its finish.
    RequestEnd,
    /// The request of the last `RequestId` is a sequence of the request in the token (`n > 1`,
    /// beams).
    Sequence,
}

/// Names a round for verify parts recorded on other threads. `Copy + Send`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RoundRef {
    /// The lane of the round's recorder.
    pub(crate) lane: u16,
    /// The round's sequence number in its lane; 0 = no round; [`RoundRef::LAUNCHING_SEQ`]: the
    /// round open when a captured graph is launched.
    pub(crate) seq: u32,
}

impl RoundRef {
    /// `seq` of [`crate::GraphCapture::round`]: whatever round is open on the recorder when the
    /// part runs (at a replay: the round the graph is launched in). Never a real round's.
    pub(crate) const LAUNCHING_SEQ: u32 = u32::MAX;
}

/// `flag` bit: the token is a raw host-clock reading (converted on the worker), whatever the
/// lane's clock is.
const FLAG_HOST: u8 = 1;
/// `flag` bit: the step or round is sampled for spans.
const FLAG_SAMPLED: u8 = 2;
/// `flag` bit of a `Route` mark: more ids of the same `moe_route` call as the previous mark.
const FLAG_CONTINUED: u8 = 4;
/// `flag` bit of a `Serve` mark: a speculative verify, `wide` holding the accepted drafts (the
/// tokens computed are the drafted ones and one more).
const FLAG_SPECULATIVE: u8 = 8;

/// `wide` of a `RoundEnd` whose round was dropped without `end` (acceptance unknown).
const ACCEPTED_UNKNOWN: u32 = u32::MAX;

/// One boundary: 8-byte token, a 4-byte and two 2-byte payload fields, kind and flags.
///
/// Payload by kind (what the constructors store and the accessors read):
///
/// | kind | `wide` | `id` | `aux` | `token` |
/// | --- | --- | --- | --- | --- |
/// | `StepBegin` | step index (low 32 bits) | kind (0: none stated) | | time |
/// | `SectionBegin` | layer | section | site | time |
/// | `SectionEnd` | | section | | time |
/// | `Wait` | layer | | site | wait ns |
/// | `Route` | layer | | id count | 4 x u16 ids |
/// | `RoundBegin` | k | seq high | seq low | time |
/// | `Phase` | | phase | | time |
/// | `RoundEnd` | accepted | | | time |
/// | `PartBegin`/`PartEnd` | round seq | part | round lane | time |
/// | `Parent*` | | | | id word |
/// | `ReplayBegin`/`ReplayEnd` | graph id | launch seq high | launch seq low | fence time |
/// | `RequestId` | | | | request id |
/// | `RequestBegin` | | class | | host time |
/// | `Serve` | tokens computed (speculative: accepted drafts) | output tokens | drafted tokens | request id |
/// | `RequestEnd` | finish code | error type | | host time |
/// | `Sequence` | | | | the request id |
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    token: u64,
    wide: u32,
    id: u16,
    aux: u16,
    kind: MarkKind,
    flag: u8,
}

/// Size of one mark in a buffer, for the memory bound.
pub(crate) const MARK_BYTES: usize = std::mem::size_of::<Mark>();

const _: () = assert!(MARK_BYTES == 24);

impl Mark {
    #[inline]
    const fn new(kind: MarkKind, wide: u32, id: u16, aux: u16, flag: u8) -> Mark {
        Mark {
            token: 0,
            wide,
            id,
            aux,
            kind,
            flag,
        }
    }

    #[inline]
    const fn sampled_flag(sampled: bool) -> u8 {
        if sampled { FLAG_SAMPLED } else { 0 }
    }

    #[inline]
    const fn host_flag(host: bool) -> u8 {
        if host { FLAG_HOST } else { 0 }
    }

    /// Step `index` (the recorder's count, low 32 bits) of `kind` begins; `sampled` when it
    /// gets spans.
    #[inline]
    pub(crate) const fn step_begin(sampled: bool, index: u32, kind: Option<StepKind>) -> Mark {
        let kind = match kind {
            Some(k) => k as u16,
            None => 0,
        };
        Mark::new(
            MarkKind::StepBegin,
            index,
            kind,
            0,
            Mark::sampled_flag(sampled),
        )
    }

    /// The current step ends.
    #[inline]
    pub(crate) const fn step_end() -> Mark {
        Mark::new(MarkKind::StepEnd, 0, 0, 0, 0)
    }

    /// A section begins; `host` when it is timed on the host clock whatever the lane's clock.
    #[inline]
    pub(crate) const fn section_begin(
        section: Section,
        layer: Layer,
        site: Site,
        host: bool,
    ) -> Mark {
        Mark::new(
            MarkKind::SectionBegin,
            layer.0,
            section.id(),
            site.id(),
            Mark::host_flag(host),
        )
    }

    /// A section ends (the same `host` as its begin).
    #[inline]
    pub(crate) const fn section_end(section: Section, host: bool) -> Mark {
        Mark::new(
            MarkKind::SectionEnd,
            0,
            section.id(),
            0,
            Mark::host_flag(host),
        )
    }

    /// A wait the engine measured itself, `ns` long.
    #[inline]
    pub(crate) const fn wait(site: Site, layer: Layer, ns: u64) -> Mark {
        let mut m = Mark::new(MarkKind::Wait, layer.0, 0, site.id(), 0);
        m.token = ns;
        m
    }

    /// Up to four expert ids of `layer`; `continued` when they extend the previous mark's call.
    #[inline]
    pub(crate) fn route(layer: Layer, ids: &[u16], continued: bool) -> Mark {
        let n = ids.len().min(4);
        let mut packed = 0u64;
        for (i, &id) in ids[..n].iter().enumerate() {
            packed |= u64::from(id) << (16 * i);
        }
        let flag = if continued { FLAG_CONTINUED } else { 0 };
        let mut m = Mark::new(MarkKind::Route, layer.0, 0, n as u16, flag);
        m.token = packed;
        m
    }

    /// A round of `k` drafted tokens begins, the `seq`-th of its lane.
    #[inline]
    pub(crate) const fn round_begin(seq: u32, k: u32, sampled: bool) -> Mark {
        Mark::new(
            MarkKind::RoundBegin,
            k,
            (seq >> 16) as u16,
            seq as u16,
            Mark::sampled_flag(sampled),
        )
    }

    /// `phase` of the open round ended.
    #[inline]
    pub(crate) const fn phase(phase: Phase) -> Mark {
        Mark::new(MarkKind::Phase, 0, phase as u16, 0, 0)
    }

    /// The open round ended with `accepted` tokens accepted, or `None` when dropped without
    /// `end`. Counts above `u32::MAX - 1` are held there.
    #[inline]
    pub(crate) const fn round_end(accepted: Option<u32>) -> Mark {
        let wide = match accepted {
            Some(a) if a < ACCEPTED_UNKNOWN => a,
            Some(_) => ACCEPTED_UNKNOWN - 1,
            None => ACCEPTED_UNKNOWN,
        };
        Mark::new(MarkKind::RoundEnd, wide, 0, 0, 0)
    }

    /// A verify part of `round` begins.
    #[inline]
    pub(crate) const fn part_begin(part: VerifyPart, round: RoundRef) -> Mark {
        Mark::new(MarkKind::PartBegin, round.seq, part as u16, round.lane, 0)
    }

    /// A verify part of `round` ends.
    #[inline]
    pub(crate) const fn part_end(part: VerifyPart, round: RoundRef) -> Mark {
        Mark::new(MarkKind::PartEnd, round.seq, part as u16, round.lane, 0)
    }

    /// One word of the next sampled step's parent span context (`kind` is a `Parent*`).
    #[inline]
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) const fn parent(kind: MarkKind, word: u64) -> Mark {
        let mut m = Mark::new(kind, 0, 0, 0, 0);
        m.token = word;
        m
    }

    /// Launch `seq` of captured graph `graph` is about to be enqueued; `sampled` when its steps
    /// and rounds get spans.
    #[inline]
    pub(crate) const fn replay_begin(graph: u32, seq: u32, sampled: bool) -> Mark {
        Mark::new(
            MarkKind::ReplayBegin,
            graph,
            (seq >> 16) as u16,
            seq as u16,
            Mark::sampled_flag(sampled),
        )
    }

    /// Launch `seq` of graph `graph` was enqueued.
    #[inline]
    pub(crate) const fn replay_end(graph: u32, seq: u32) -> Mark {
        Mark::new(
            MarkKind::ReplayEnd,
            graph,
            (seq >> 16) as u16,
            seq as u16,
            0,
        )
    }

    /// The id of the request the next `RequestBegin` or `RequestEnd` is about.
    #[inline]
    pub(crate) const fn request_id(id: u64) -> Mark {
        let mut m = Mark::new(MarkKind::RequestId, 0, 0, 0, 0);
        m.token = id;
        m
    }

    /// A request of `class` arrived; `sampled` when it gets a span (timed on the host clock).
    #[inline]
    pub(crate) const fn request_begin(class: u16, sampled: bool) -> Mark {
        Mark::new(
            MarkKind::RequestBegin,
            0,
            class,
            0,
            FLAG_HOST | Mark::sampled_flag(sampled),
        )
    }

    /// Request `id` computes `tokens` and gets `outputs` output tokens (of `drafted` drafted
    /// ones, under speculative decoding) in the open step. Counts beyond a field are held at
    /// its maximum.
    #[inline]
    pub(crate) fn serve(id: u64, tokens: u32, outputs: u32, drafted: u32) -> Mark {
        let sat = |v: u32| v.min(u32::from(u16::MAX)) as u16;
        let mut m = Mark::new(MarkKind::Serve, tokens, sat(outputs), sat(drafted), 0);
        m.token = id;
        m
    }

    /// Request `id` verifies `drafted` drafted tokens (computing `drafted + 1`), accepts
    /// `accepted` of them and gets `outputs` output tokens, as the engine counts them.
    #[inline]
    pub(crate) fn serve_speculative(id: u64, drafted: u32, accepted: u32, outputs: u32) -> Mark {
        let sat = |v: u32| v.min(u32::from(u16::MAX)) as u16;
        let mut m = Mark::new(
            MarkKind::Serve,
            accepted,
            sat(outputs),
            sat(drafted),
            FLAG_SPECULATIVE,
        );
        m.token = id;
        m
    }

    /// The request of the previous `RequestId` mark is a sequence of `request`.
    #[inline]
    pub(crate) const fn sequence(request: u64) -> Mark {
        let mut m = Mark::new(MarkKind::Sequence, 0, 0, 0, 0);
        m.token = request;
        m
    }

    /// A request ended: `code` and `error` from `Finish::code` (timed on the host clock).
    #[inline]
    pub(crate) const fn request_end(code: u32, error: u16) -> Mark {
        Mark::new(MarkKind::RequestEnd, code, error, 0, FLAG_HOST)
    }

    /// The class of a `RequestBegin`.
    #[inline]
    pub(crate) const fn class(&self) -> u16 {
        self.id
    }

    /// A `Serve`'s (request id, tokens computed, output tokens, drafted tokens, accepted
    /// drafts).
    #[inline]
    pub(crate) const fn served(&self) -> (u64, u32, u32, u32, u32) {
        let (outputs, drafted) = (self.id as u32, self.aux as u32);
        if self.flag & FLAG_SPECULATIVE != 0 {
            (self.token, drafted + 1, outputs, drafted, self.wide)
        } else {
            (self.token, self.wide, outputs, drafted, 0)
        }
    }

    /// A `RequestEnd`'s finish (code, error type).
    #[inline]
    pub(crate) const fn finish(&self) -> (u32, u16) {
        (self.wide, self.id)
    }

    /// The same mark sampled (or not) for spans: a captured step or round takes its replay's
    /// sampling, not the one decided at capture.
    #[inline]
    pub(crate) const fn with_sampled(mut self, sampled: bool) -> Mark {
        self.flag = (self.flag & !FLAG_SAMPLED) | Mark::sampled_flag(sampled);
        self
    }

    /// The graph id of a `ReplayBegin` or `ReplayEnd`.
    #[inline]
    pub(crate) const fn graph(&self) -> u32 {
        self.wide
    }

    /// The launch sequence of a `ReplayBegin` or `ReplayEnd`.
    #[inline]
    pub(crate) const fn replay_seq(&self) -> u32 {
        ((self.id as u32) << 16) | self.aux as u32
    }

    /// The mark with its time token (a host time for a host mark).
    #[inline]
    pub(crate) const fn at(mut self, token: u64) -> Mark {
        self.token = token;
        self
    }

    /// What the mark says.
    #[inline]
    pub(crate) const fn kind(&self) -> MarkKind {
        self.kind
    }

    /// The clock's token (a time or a handle), or the kind's word (`Wait`, `Route`, `Parent*`).
    #[inline]
    pub(crate) const fn token(&self) -> u64 {
        self.token
    }

    /// Whether the time needs no clock: the token is a host time, or the kind carries no time.
    #[inline]
    pub(crate) const fn is_untimed(&self) -> bool {
        matches!(
            self.kind,
            MarkKind::Wait
                | MarkKind::Route
                | MarkKind::RequestId
                | MarkKind::Serve
                | MarkKind::Sequence
                | MarkKind::ParentHi
                | MarkKind::ParentLo
                | MarkKind::ParentSpan
        )
    }

    /// Whether the token is a host-clock time whatever the lane's clock is.
    #[inline]
    pub(crate) const fn is_host(&self) -> bool {
        self.flag & FLAG_HOST != 0
    }

    /// Whether the step or round is sampled for spans.
    #[inline]
    pub(crate) const fn is_sampled(&self) -> bool {
        self.flag & FLAG_SAMPLED != 0
    }

    /// The section of a `SectionBegin` or `SectionEnd`.
    #[inline]
    pub(crate) fn section(&self) -> Section {
        Section::from_id(self.id)
    }

    /// The site of a `SectionBegin` or `Wait`.
    #[inline]
    pub(crate) fn site(&self) -> Site {
        Site::from_id(self.aux)
    }

    /// The layer of a `SectionBegin`, `Wait` or `Route`.
    #[inline]
    pub(crate) const fn layer(&self) -> Layer {
        Layer(self.wide)
    }

    /// The wait of a `Wait`, in nanoseconds.
    #[inline]
    pub(crate) const fn wait_ns(&self) -> u64 {
        self.token
    }

    /// The expert ids of a `Route` (at most four).
    #[inline]
    pub(crate) fn expert_ids(&self) -> ([u16; 4], usize) {
        let ids = std::array::from_fn(|i| (self.token >> (16 * i)) as u16);
        (ids, usize::from(self.aux).min(4))
    }

    /// Whether a `Route` extends the previous mark's `moe_route` call.
    #[inline]
    pub(crate) const fn is_continued(&self) -> bool {
        self.flag & FLAG_CONTINUED != 0
    }

    /// The drafted tokens of a `RoundBegin`.
    #[inline]
    pub(crate) const fn k(&self) -> u32 {
        self.wide
    }

    /// The kind of a `StepBegin` (`None`: none stated).
    #[inline]
    pub(crate) fn step_kind(&self) -> Option<StepKind> {
        u8::try_from(self.id).ok().and_then(StepKind::from_u8)
    }

    /// The recorder's index of a `StepBegin` (low 32 bits).
    #[inline]
    pub(crate) const fn step_index(&self) -> u32 {
        self.wide
    }

    /// The lane's round sequence number of a `RoundBegin`.
    #[inline]
    pub(crate) const fn round_seq(&self) -> u32 {
        ((self.id as u32) << 16) | self.aux as u32
    }

    /// The phase of a `Phase` mark (`None`: not a phase id).
    #[inline]
    pub(crate) fn phase_of(&self) -> Option<Phase> {
        u8::try_from(self.id).ok().and_then(Phase::from_u8)
    }

    /// The accepted count of a `RoundEnd` (`None`: the round was dropped without `end`).
    #[inline]
    pub(crate) const fn accepted(&self) -> Option<u32> {
        if self.wide == ACCEPTED_UNKNOWN {
            None
        } else {
            Some(self.wide)
        }
    }

    /// The part of a `PartBegin` or `PartEnd` (`None`: not a part id).
    #[inline]
    pub(crate) fn part(&self) -> Option<VerifyPart> {
        u8::try_from(self.id).ok().and_then(VerifyPart::from_u8)
    }

    /// The round of a `PartBegin` or `PartEnd`.
    #[inline]
    pub(crate) const fn round(&self) -> RoundRef {
        RoundRef {
            lane: self.aux,
            seq: self.wide,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_reads_back_what_it_was_built_with() {
        let m = Mark::section_begin(Section::KDA_MIXER, Layer(61), Site::ATTN, true).at(7);
        assert_eq!(m.kind(), MarkKind::SectionBegin);
        assert_eq!(
            (m.section(), m.layer(), m.site()),
            (Section::KDA_MIXER, Layer(61), Site::ATTN)
        );
        assert!(m.is_host() && !m.is_sampled());
        assert_eq!(m.token(), 7);

        let m = Mark::round_begin(0x0003_0002, 5, true);
        assert_eq!(
            (m.round_seq(), m.k(), m.is_sampled()),
            (0x0003_0002, 5, true)
        );

        assert_eq!(Mark::round_end(Some(3)).accepted(), Some(3));
        assert_eq!(Mark::round_end(None).accepted(), None);
        assert_eq!(
            Mark::round_end(Some(u32::MAX)).accepted(),
            Some(u32::MAX - 1)
        );

        let round = RoundRef {
            lane: 9,
            seq: 70_000,
        };
        let m = Mark::part_end(VerifyPart::Mla, round);
        assert_eq!((m.part(), m.round()), (Some(VerifyPart::Mla), round));

        let m = Mark::route(Layer(2), &[1, 2, 65_535], true);
        assert_eq!(m.expert_ids(), ([1, 2, 65_535, 0], 3));
        assert!(m.is_continued() && m.is_untimed());

        let m = Mark::replay_begin(7, 0x0001_0004, true);
        assert_eq!(
            (m.kind(), m.graph(), m.replay_seq(), m.is_sampled()),
            (MarkKind::ReplayBegin, 7, 0x0001_0004, true)
        );
        assert!(!m.with_sampled(false).is_sampled());
        let m = Mark::replay_end(7, 0x0001_0004);
        assert_eq!((m.graph(), m.replay_seq()), (7, 0x0001_0004));
        let m = Mark::step_begin(false, 0x8000_0001, Some(StepKind::Mixed)).with_sampled(true);
        assert!(m.is_sampled());
        assert_eq!(
            (m.kind(), m.step_index(), m.step_kind()),
            (MarkKind::StepBegin, 0x8000_0001, Some(StepKind::Mixed))
        );
        assert_eq!(Mark::step_begin(true, 7, None).step_kind(), None);

        let m = Mark::wait(Site::MLP, Layer(4), 1_500);
        assert_eq!(
            (m.site(), m.layer(), m.wait_ns()),
            (Site::MLP, Layer(4), 1_500)
        );
        assert_eq!(
            Mark::phase(Phase::Rollback).phase_of(),
            Some(Phase::Rollback)
        );
    }
}
