//! The record the hot path stores: a small `Copy` mark, 24 bytes.

/// What a mark says. The worker pairs begins with ends and turns marks into durations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum MarkKind {
    /// A step began; `flag` = 1 when the step is sampled for spans.
    StepBegin,
    /// The current step ended.
    StepEnd,
    /// A section began: `id` section, `site`, `layer`.
    SectionBegin,
    /// A section ended: `id` section.
    SectionEnd,
    /// A rendezvous wait measured by the engine: `site`, `layer`, `token` = nanoseconds.
    Wait,
    /// Routed expert ids: `layer`, `site` = how many ids (1 to 4), `token` = 4 x u16 packed.
    Route,
    /// A speculative round began: `layer` = k, `flag` = sampled, `token` = time.
    RoundBegin,
    /// A phase just ended: `id` = phase.
    Phase,
    /// The round ended: `layer` = accepted (u32::MAX: dropped without `end`).
    RoundEnd,
    /// A verify part began: `id` = part, `site` = round owner lane, `layer` = round sequence.
    PartBegin,
    /// A verify part ended (same fields as the begin).
    PartEnd,
    /// Parent span context of the next sampled step, in three marks: trace id high, low, span id.
    ParentHi,
    /// See [`MarkKind::ParentHi`].
    ParentLo,
    /// See [`MarkKind::ParentHi`].
    ParentSpan,
}

/// `flag` bit: the token is a raw host-clock reading (converted on the worker), whatever the
/// lane's clock is.
pub(crate) const FLAG_HOST: u8 = 1;
/// `flag` bit: the step or round is sampled for spans.
pub(crate) const FLAG_SAMPLED: u8 = 2;
/// `flag` bit of a `Route` mark: more ids of the same `moe_route` call as the previous mark.
pub(crate) const FLAG_CONTINUED: u8 = 4;

/// One boundary: 8-byte token, 4-byte layer, two 2-byte ids, kind and flags.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    pub(crate) token: u64,
    pub(crate) layer: u32,
    pub(crate) id: u16,
    pub(crate) site: u16,
    pub(crate) kind: MarkKind,
    pub(crate) flag: u8,
}

/// Size of one mark in a buffer, for the memory bound.
pub(crate) const MARK_BYTES: usize = std::mem::size_of::<Mark>();

const _: () = assert!(MARK_BYTES == 24);
