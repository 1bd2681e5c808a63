//! What the forward pass records, and where: the engine's own sections (registered once), the
//! recorder of this rank (absent for an unprofiled forward, such as the draft's), the
//! speculative round whose verify parts are being timed, and the straggler's extra compute.

use crate::EngineError;
use crate::collective::AllReduce;
use phasetrace::{Layer, PartGuard, Recorder, RoundRef, Section, SectionKind, Site, VerifyPart};
use std::sync::OnceLock;

/// The sections this engine registers next to phasetrace's built-in ones (`norm`, `mlp_dense`,
/// `moe_router`, `moe_hostsync`, `moe_experts`, `moe_shared`, the reduces and their probes).
#[derive(Clone, Copy, Debug)]
pub struct EngineSections {
    /// Token embedding lookup.
    pub embed: Section,
    /// The q, k and v projections (column-parallel).
    pub qkv: Section,
    /// Rotary position embedding of q and k.
    pub rope: Section,
    /// The KV-cache append, scores, softmax and weighted sum.
    pub attention: Section,
    /// The output projection (row-parallel: a partial output).
    pub o_proj: Section,
    /// The LM head.
    pub lm_head: Section,
    /// Greedy sampling (argmax, read back to the host).
    pub sample: Section,
}

static SECTIONS: OnceLock<EngineSections> = OnceLock::new();

impl EngineSections {
    /// Registers the engine's sections (once per process; later calls return the same ids).
    pub fn get() -> Result<&'static EngineSections, EngineError> {
        if let Some(s) = SECTIONS.get() {
            return Ok(s);
        }
        let r = |n: &str| Section::register(n, SectionKind::Compute);
        let s = EngineSections {
            embed: r("embed")?,
            qkv: r("qkv")?,
            rope: r("rope")?,
            attention: r("attention")?,
            o_proj: r("o_proj")?,
            lm_head: r("lm_head")?,
            sample: r("sample")?,
        };
        Ok(SECTIONS.get_or_init(|| s))
    }
}

/// Extra compute that makes one rank a straggler: each compute section runs `factor` times on
/// average (the whole repeats, their results discarded), so the rank really is that much
/// slower on this machine.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Straggle {
    extra: f64,
    debt: f64,
}

impl Straggle {
    /// `factor` times the compute (1: none extra).
    pub(crate) fn new(factor: f64) -> Straggle {
        Straggle {
            extra: (factor - 1.0).max(0.0),
            debt: 0.0,
        }
    }

    /// How many extra times the next section runs.
    fn repeats(&mut self) -> usize {
        self.debt += self.extra;
        let n = self.debt.floor();
        self.debt -= n;
        n as usize
    }
}

/// One forward pass's recording context.
#[derive(Debug)]
pub struct Ctx<'a, 'c> {
    pub(crate) rec: Option<&'a Recorder>,
    pub(crate) round: Option<RoundRef>,
    pub(crate) comm: Option<&'a mut (dyn AllReduce + 'c)>,
    pub(crate) sections: &'static EngineSections,
    pub(crate) straggle: Straggle,
}

impl<'a, 'c> Ctx<'a, 'c> {
    /// A context without a recorder, collective or straggler (one whole model, unprofiled).
    pub fn plain() -> Result<Ctx<'a, 'c>, EngineError> {
        Ok(Ctx {
            rec: None,
            round: None,
            comm: None,
            sections: EngineSections::get()?,
            straggle: Straggle::default(),
        })
    }

    /// Records into `rec`.
    pub fn recording(mut self, rec: Option<&'a Recorder>) -> Ctx<'a, 'c> {
        self.rec = rec;
        self
    }

    /// Runs `f` as section `s` (and again as many times as the straggler's factor asks).
    pub(crate) fn run<T>(
        &mut self,
        s: Section,
        layer: Layer,
        site: Site,
        f: impl Fn() -> candle_core::Result<T>,
    ) -> candle_core::Result<T> {
        let _g = self.rec.map(|r| r.section(s, layer, site));
        let out = f()?;
        for _ in 0..self.straggle.repeats() {
            f()?;
        }
        Ok(out)
    }

    /// Runs `f` with nothing recorded (the draft's forwards: their time is the draft or the
    /// maintenance phase, not sections), then records again, whatever `f` returns.
    pub(crate) fn unrecorded<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let rec = self.rec.take();
        let out = f(self);
        self.rec = rec;
        out
    }

    /// Times `part` of the verify forward, when this forward verifies a round.
    pub(crate) fn verify_part(&self, part: VerifyPart) -> Option<PartGuard<'a>> {
        match (self.rec, self.round) {
            (Some(r), Some(round)) => Some(r.verify_part(round, part)),
            _ => None,
        }
    }

    /// Reports one token's routed experts.
    pub(crate) fn moe_route(&self, layer: Layer, ids: &[u32]) {
        if let Some(r) = self.rec {
            r.moe_route(layer, ids);
        }
    }
}
