//! The closed and open vocabularies of a decode loop: sections, sites, speculative phases and
//! verify parts. Each is a small `Copy` value with `as_str()`; nothing on the hot path is a string.
//!
//! Sections and sites are *registered ids*: the reference GLM set is built in, and an engine may
//! register its own names once at start-up. Phases and verify parts are closed enums. The
//! built-in names and what they mean are the telemetry contract's data
//! (`phasetrace_names::vocab`), which a unit test keeps equal to these.

use std::sync::RwLock;
use thiserror::Error;

/// How a section is recorded by level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SectionKind {
    /// Kernel work: recorded at level `full` only.
    Compute,
    /// A collective or its enqueue: recorded at level `collectives` as well as `full`.
    Collective,
    /// A collective's rendezvous probe: recorded at both levels, and its duration also feeds
    /// `phasetrace.collective.wait` (the arrival skew of this rank).
    Probe,
}

impl SectionKind {
    /// Whether sections of this kind are recorded at level `collectives`.
    pub const fn is_collective(self) -> bool {
        !matches!(self, SectionKind::Compute)
    }
}

/// A decode-loop section bucket (`kda_mixer`, `reduce_attn`, ...): a registered id.
///
/// The reference GLM buckets are associated constants; [`Section::register`] adds an engine's own.
/// Comparing, copying and recording a `Section` never touches a string.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Section {
    id: u16,
    kind: SectionKind,
}

/// A collective or call site (`attn`, `mlp`): a registered id.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Site(u16);

/// Errors from registering a section or site name.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum VocabError {
    /// The name is not `[a-z][a-z0-9_]*` of at most 48 bytes.
    #[error(
        "{what} name {name:?} is invalid: expected 1 to 48 characters of [a-z0-9_], starting with a letter"
    )]
    BadName {
        /// `section` or `site`.
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// The section name exists with another kind.
    #[error("section {name:?} is already registered as {existing:?}, not {requested:?}")]
    KindConflict {
        /// The name given.
        name: String,
        /// The kind it has.
        existing: SectionKind,
        /// The kind asked for.
        requested: SectionKind,
    },
    /// Too many names registered.
    #[error("cannot register {what} {name:?}: the registry holds at most {max} names")]
    Full {
        /// `section` or `site`.
        what: &'static str,
        /// The name given.
        name: String,
        /// The capacity.
        max: usize,
    },
}

const BUILTIN_SECTIONS: [(&str, SectionKind); 23] = [
    ("mhc", SectionKind::Compute),
    ("mhc_post", SectionKind::Compute),
    ("norm", SectionKind::Compute),
    ("kda_mixer", SectionKind::Compute),
    ("kda_front", SectionKind::Compute),
    ("kda_recur", SectionKind::Compute),
    ("kda_back", SectionKind::Compute),
    ("dsa_proj", SectionKind::Compute),
    ("dsa_indexer", SectionKind::Compute),
    ("dsa_select", SectionKind::Compute),
    ("dsa_attend", SectionKind::Compute),
    ("mlp_dense", SectionKind::Compute),
    ("moe_router", SectionKind::Compute),
    ("moe_hostsync", SectionKind::Compute),
    ("moe_experts", SectionKind::Compute),
    ("moe_shared", SectionKind::Compute),
    ("moe_combine", SectionKind::Compute),
    ("reduce_attn", SectionKind::Collective),
    ("reduce_mlp", SectionKind::Collective),
    ("reduce_attn_enq", SectionKind::Collective),
    ("reduce_mlp_enq", SectionKind::Collective),
    ("reduce_attn_bar", SectionKind::Probe),
    ("reduce_mlp_bar", SectionKind::Probe),
];

const BUILTIN_SITES: [&str; 2] = ["attn", "mlp"];

/// Most sections (built in and registered) a process can have.
pub const MAX_SECTIONS: usize = 1024;
/// Most sites a process can have.
pub const MAX_SITES: usize = 256;

static SECTIONS: RwLock<Vec<(&'static str, SectionKind)>> = RwLock::new(Vec::new());
static SITES: RwLock<Vec<&'static str>> = RwLock::new(Vec::new());

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 48
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

macro_rules! builtin_sections {
    ($($(#[$doc:meta])* $name:ident = $id:literal;)*) => {
        impl Section {
            $($(#[$doc])* pub const $name: Section = Section {
                id: $id,
                kind: BUILTIN_SECTIONS[$id].1,
            };)*
        }
    };
}

builtin_sections! {
    /// `hc_expand` and `hc_pre`.
    MHC = 0;
    /// `hc_post` (and `hc_head_mean` on the last layer).
    MHC_POST = 1;
    /// Normalization.
    NORM = 2;
    /// The whole KDA mixer; `KDA_FRONT`, `KDA_RECUR`, `KDA_BACK` nest inside it.
    KDA_MIXER = 3;
    /// KDA projections before the recurrence.
    KDA_FRONT = 4;
    /// The KDA recurrence.
    KDA_RECUR = 5;
    /// The KDA output side.
    KDA_BACK = 6;
    /// DSA projections.
    DSA_PROJ = 7;
    /// DSA indexer.
    DSA_INDEXER = 8;
    /// DSA top-k selection.
    DSA_SELECT = 9;
    /// DSA sparse attention.
    DSA_ATTEND = 10;
    /// Dense MLP.
    MLP_DENSE = 11;
    /// MoE router.
    MOE_ROUTER = 12;
    /// Reading the routed expert ids back to the host.
    MOE_HOSTSYNC = 13;
    /// Routed experts.
    MOE_EXPERTS = 14;
    /// Shared expert.
    MOE_SHARED = 15;
    /// Combining expert outputs.
    MOE_COMBINE = 16;
    /// The attention all-reduce (after its probe): a collective.
    REDUCE_ATTN = 17;
    /// The MLP all-reduce (after its probe): a collective.
    REDUCE_MLP = 18;
    /// Host time to enqueue the attention all-reduce: use with `Recorder::host_section`.
    REDUCE_ATTN_ENQ = 19;
    /// Host time to enqueue the MLP all-reduce: use with `Recorder::host_section`.
    REDUCE_MLP_ENQ = 20;
    /// The rendezvous probe before the attention all-reduce: this rank's arrival wait.
    REDUCE_ATTN_BAR = 21;
    /// The rendezvous probe before the MLP all-reduce: this rank's arrival wait.
    REDUCE_MLP_BAR = 22;
}

impl Section {
    /// The built-in reference buckets, in table order.
    pub fn builtin() -> impl Iterator<Item = Section> {
        (0..BUILTIN_SECTIONS.len()).map(|i| Section {
            id: i as u16,
            kind: BUILTIN_SECTIONS[i].1,
        })
    }

    /// Registers an engine's own section (or returns the existing one of the same name and kind).
    ///
    /// Call at start-up; it takes a lock. Built-in names may be looked up this way too.
    pub fn register(name: &str, kind: SectionKind) -> Result<Section, VocabError> {
        if !valid_name(name) {
            return Err(VocabError::BadName {
                what: "section",
                name: name.to_owned(),
            });
        }
        if let Some(i) = BUILTIN_SECTIONS.iter().position(|(n, _)| *n == name) {
            return check_kind(name, BUILTIN_SECTIONS[i].1, kind, i);
        }
        let mut reg = SECTIONS.write().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = reg.iter().position(|(n, _)| *n == name) {
            return check_kind(name, reg[i].1, kind, BUILTIN_SECTIONS.len() + i);
        }
        if BUILTIN_SECTIONS.len() + reg.len() >= MAX_SECTIONS {
            return Err(VocabError::Full {
                what: "section",
                name: name.to_owned(),
                max: MAX_SECTIONS,
            });
        }
        // Leaked once per distinct name, bounded by MAX_SECTIONS: names live for the process.
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        reg.push((leaked, kind));
        Ok(Section {
            id: (BUILTIN_SECTIONS.len() + reg.len() - 1) as u16,
            kind,
        })
    }

    /// Finds a section by name (built in or registered).
    pub fn lookup(name: &str) -> Option<Section> {
        if let Some(i) = BUILTIN_SECTIONS.iter().position(|(n, _)| *n == name) {
            return Some(Section::from_id(i as u16));
        }
        let reg = SECTIONS.read().unwrap_or_else(|p| p.into_inner());
        reg.iter().position(|(n, _)| *n == name).map(|i| Section {
            id: (BUILTIN_SECTIONS.len() + i) as u16,
            kind: reg[i].1,
        })
    }

    /// The bucket name. Built-ins read a static table; registered names take a read lock.
    pub fn as_str(self) -> &'static str {
        let i = self.id as usize;
        if let Some((n, _)) = BUILTIN_SECTIONS.get(i) {
            return n;
        }
        let reg = SECTIONS.read().unwrap_or_else(|p| p.into_inner());
        reg.get(i - BUILTIN_SECTIONS.len())
            .map_or("unknown", |(n, _)| n)
    }

    /// How this section is recorded by level.
    #[inline]
    pub const fn kind(self) -> SectionKind {
        self.kind
    }

    /// The dense id (for per-section tables on the worker).
    #[inline]
    pub const fn id(self) -> u16 {
        self.id
    }

    pub(crate) fn from_id(id: u16) -> Section {
        let i = id as usize;
        let kind = match BUILTIN_SECTIONS.get(i) {
            Some((_, k)) => *k,
            None => {
                let reg = SECTIONS.read().unwrap_or_else(|p| p.into_inner());
                reg.get(i - BUILTIN_SECTIONS.len())
                    .map_or(SectionKind::Compute, |(_, k)| *k)
            }
        };
        Section { id, kind }
    }
}

fn check_kind(
    name: &str,
    existing: SectionKind,
    requested: SectionKind,
    id: usize,
) -> Result<Section, VocabError> {
    if existing == requested {
        Ok(Section {
            id: id as u16,
            kind: existing,
        })
    } else {
        Err(VocabError::KindConflict {
            name: name.to_owned(),
            existing,
            requested,
        })
    }
}

impl std::fmt::Debug for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Section({})", self.as_str())
    }
}

impl std::fmt::Display for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Site {
    /// The attention collective site.
    pub const ATTN: Site = Site(0);
    /// The MLP collective site.
    pub const MLP: Site = Site(1);
    /// No site: the `site` attribute is omitted.
    pub const NONE: Site = Site(u16::MAX);

    /// Registers an engine's own site (or returns the existing one of that name).
    pub fn register(name: &str) -> Result<Site, VocabError> {
        if !valid_name(name) {
            return Err(VocabError::BadName {
                what: "site",
                name: name.to_owned(),
            });
        }
        if let Some(i) = BUILTIN_SITES.iter().position(|n| *n == name) {
            return Ok(Site(i as u16));
        }
        let mut reg = SITES.write().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = reg.iter().position(|n| *n == name) {
            return Ok(Site((BUILTIN_SITES.len() + i) as u16));
        }
        if BUILTIN_SITES.len() + reg.len() >= MAX_SITES {
            return Err(VocabError::Full {
                what: "site",
                name: name.to_owned(),
                max: MAX_SITES,
            });
        }
        // Leaked once per distinct name, bounded by MAX_SITES.
        reg.push(Box::leak(name.to_owned().into_boxed_str()));
        Ok(Site((BUILTIN_SITES.len() + reg.len() - 1) as u16))
    }

    /// The site name; `None` for [`Site::NONE`].
    pub fn as_str(self) -> Option<&'static str> {
        if self == Site::NONE {
            return None;
        }
        let i = self.0 as usize;
        if let Some(n) = BUILTIN_SITES.get(i) {
            return Some(n);
        }
        let reg = SITES.read().unwrap_or_else(|p| p.into_inner());
        reg.get(i - BUILTIN_SITES.len()).copied()
    }

    pub(crate) const fn id(self) -> u16 {
        self.0
    }

    pub(crate) const fn from_id(id: u16) -> Site {
        Site(id)
    }
}

impl std::fmt::Debug for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Site({})", self.as_str().unwrap_or("none"))
    }
}

/// A layer index; [`Layer::NONE`] when a section belongs to no layer.
///
/// Recording calls take anything that converts: `u32`, `usize` (`for (layer, w) in
/// weights.iter().enumerate()`) and `i32`, the type of a plain `for layer in 0..8` loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Layer(pub u32);

impl Layer {
    /// No layer: the `layer` attribute is omitted.
    pub const NONE: Layer = Layer(u32::MAX);

    /// The index, or `None` for [`Layer::NONE`].
    pub fn get(self) -> Option<u32> {
        (self != Layer::NONE).then_some(self.0)
    }
}

impl From<u32> for Layer {
    #[inline]
    fn from(v: u32) -> Self {
        Layer(v)
    }
}

impl From<usize> for Layer {
    /// Indices above `u32::MAX - 1` saturate to `u32::MAX - 1`.
    #[inline]
    fn from(v: usize) -> Self {
        Layer(u32::try_from(v).unwrap_or(u32::MAX - 1).min(u32::MAX - 1))
    }
}

impl From<i32> for Layer {
    /// So that a plain `for layer in 0..8` loop works. A negative index is no layer index:
    /// it becomes [`Layer::NONE`] (the section is still recorded, without a `layer`).
    #[inline]
    fn from(v: i32) -> Self {
        u32::try_from(v).map_or(Layer::NONE, Layer)
    }
}

/// A phase of a speculative-decoding round. The time between two marks belongs to the phase that
/// just ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    /// The draft model proposes k tokens.
    Draft = 0,
    /// The target model verifies them.
    Verify = 1,
    /// Accepted tokens are committed.
    Accept = 2,
    /// Rejected state is rolled back.
    Rollback = 3,
    /// Source maintenance (caches, drafter state).
    Maint = 4,
}

impl Phase {
    /// All phases in round order.
    pub const ALL: [Phase; 5] = [
        Phase::Draft,
        Phase::Verify,
        Phase::Accept,
        Phase::Rollback,
        Phase::Maint,
    ];

    /// The `phase` attribute value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Draft => "draft",
            Phase::Verify => "verify",
            Phase::Accept => "accept",
            Phase::Rollback => "rollback",
            Phase::Maint => "maint",
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<Phase> {
        Phase::ALL.get(v as usize).copied()
    }
}

/// A recorded part of the verify walk (level 2). `rest` is derived: verify - kda - mla.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum VerifyPart {
    /// The KDA mixer.
    Kda = 0,
    /// The sequential scan inside the KDA mixer (reported inside `kda`).
    KdaScan = 1,
    /// The MLA mixer.
    Mla = 2,
    /// The FFN / MoE branch (reported inside `rest`).
    Ffn = 3,
}

impl VerifyPart {
    /// All recordable parts.
    pub const ALL: [VerifyPart; 4] = [
        VerifyPart::Kda,
        VerifyPart::KdaScan,
        VerifyPart::Mla,
        VerifyPart::Ffn,
    ];
    /// The `part` value of the derived remainder: verify - kda - mla.
    pub const REST: &'static str = "rest";

    /// The `part` attribute value.
    pub const fn as_str(self) -> &'static str {
        match self {
            VerifyPart::Kda => "kda",
            VerifyPart::KdaScan => "kda_scan",
            VerifyPart::Mla => "mla",
            VerifyPart::Ffn => "ffn",
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<VerifyPart> {
        VerifyPart::ALL.get(v as usize).copied()
    }
}

/// What a step computes, given when it begins ([`crate::Recorder::step_of`]): the `step.kind`
/// attribute of the step histograms and spans, and the summary's lines by kind. Steps begun
/// with [`crate::Recorder::step`] state no kind and carry no attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum StepKind {
    /// Prompt tokens only (a prompt, or a chunk of one); it may sample each request's first
    /// output token.
    Prefill = 1,
    /// One output token per request of the batch (and no prompt tokens).
    Decode = 2,
    /// Prompt chunks and decode tokens in one batch (chunked prefill).
    Mixed = 3,
    /// The target model verifies drafted tokens (a speculative round's verify step).
    Speculative = 4,
}

impl StepKind {
    /// All kinds, in the order of the vocabulary.
    pub const ALL: [StepKind; 4] = [
        StepKind::Prefill,
        StepKind::Decode,
        StepKind::Mixed,
        StepKind::Speculative,
    ];

    /// The `step.kind` attribute value.
    pub const fn as_str(self) -> &'static str {
        match self {
            StepKind::Prefill => "prefill",
            StepKind::Decode => "decode",
            StepKind::Mixed => "mixed",
            StepKind::Speculative => "speculative",
        }
    }

    /// The kind of code `v` (`as u8`); `None` for 0 (no kind stated) or an unknown code.
    pub(crate) fn from_u8(v: u8) -> Option<StepKind> {
        StepKind::ALL.get(usize::from(v).checked_sub(1)?).copied()
    }
}

impl std::fmt::Display for StepKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_keep_the_reference_names_and_kinds() {
        let names: Vec<_> = Section::builtin().map(Section::as_str).collect();
        assert_eq!(names.len(), 23);
        assert!(names.contains(&"kda_recur"));
        assert_eq!(Section::KDA_MIXER.as_str(), "kda_mixer");
        assert_eq!(Section::REDUCE_MLP_BAR.as_str(), "reduce_mlp_bar");
        assert_eq!(Section::REDUCE_ATTN_BAR.kind(), SectionKind::Probe);
        assert!(Section::REDUCE_ATTN.kind().is_collective());
        assert!(!Section::MOE_EXPERTS.kind().is_collective());
        for s in Section::builtin() {
            assert_eq!(Section::lookup(s.as_str()), Some(s));
        }
    }

    #[test]
    fn registering_validates_and_is_idempotent() {
        let a = Section::register("mla_mixer", SectionKind::Compute).unwrap();
        let b = Section::register("mla_mixer", SectionKind::Compute).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_str(), "mla_mixer");
        assert!(matches!(
            Section::register("mla_mixer", SectionKind::Collective),
            Err(VocabError::KindConflict { .. })
        ));
        for bad in ["", "Kda", "9x", "a-b", "x y", &"a".repeat(49)] {
            let e = Section::register(bad, SectionKind::Compute).unwrap_err();
            assert!(e.to_string().contains("expected"), "{e}");
        }
        assert_eq!(
            Section::register("kda_mixer", SectionKind::Compute).unwrap(),
            Section::KDA_MIXER
        );
        let s = Site::register("moe_a2a").unwrap();
        assert_eq!(s.as_str(), Some("moe_a2a"));
        assert_eq!(Site::register("attn").unwrap(), Site::ATTN);
        assert_eq!(Site::NONE.as_str(), None);
    }

    #[test]
    fn the_builtins_are_the_vocabularies_of_the_names_crate() {
        use phasetrace_names::vocab;
        let ours: Vec<(&str, &str)> = Section::builtin()
            .map(|s| {
                let kind = match s.kind() {
                    SectionKind::Compute => "compute",
                    SectionKind::Collective => "collective",
                    SectionKind::Probe => "probe",
                };
                (s.as_str(), kind)
            })
            .collect();
        let data: Vec<(&str, &str)> = vocab::SECTIONS.iter().map(|s| (s.value, s.kind)).collect();
        assert_eq!(ours, data);
        let sites: Vec<&str> = BUILTIN_SITES.to_vec();
        let data: Vec<&str> = vocab::SITES.iter().map(|n| n.value).collect();
        assert_eq!(sites, data);
        let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
        let data: Vec<&str> = vocab::PHASES.iter().map(|n| n.value).collect();
        assert_eq!(phases, data);
        let parts: Vec<&str> = VerifyPart::ALL
            .iter()
            .map(|p| p.as_str())
            .chain([VerifyPart::REST])
            .collect();
        let data: Vec<&str> = vocab::VERIFY_PARTS.iter().map(|n| n.value).collect();
        assert_eq!(parts, data);
        let kinds: Vec<&str> = StepKind::ALL.iter().map(|k| k.as_str()).collect();
        let data: Vec<&str> = vocab::STEP_KINDS.iter().map(|n| n.value).collect();
        assert_eq!(kinds, data);
        for k in StepKind::ALL {
            assert_eq!(StepKind::from_u8(k as u8), Some(k));
        }
        assert_eq!(StepKind::from_u8(0), None);
        assert_eq!(StepKind::from_u8(5), None);
    }

    #[test]
    fn phases_and_parts_have_contract_names() {
        let p: Vec<_> = Phase::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(p, ["draft", "verify", "accept", "rollback", "maint"]);
        let v: Vec<_> = VerifyPart::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(v, ["kda", "kda_scan", "mla", "ffn"]);
        assert_eq!(Phase::from_u8(4), Some(Phase::Maint));
        assert_eq!(Phase::from_u8(5), None);
    }

    #[test]
    fn layers_come_from_the_integer_types_loops_use() {
        let from_loop: Vec<Layer> = (0..3).map(Layer::from).collect();
        assert_eq!(from_loop, [Layer(0), Layer(1), Layer(2)]);
        assert_eq!(Layer::from(7usize), Layer(7));
        assert_eq!(Layer::from(-1), Layer::NONE);
        assert_eq!(Layer::from(-1).get(), None);
    }
}
