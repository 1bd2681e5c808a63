//! The telemetry contract as the import writers use it: the families, keys and span names of
//! [`crate::names`], with their Prometheus spellings derived by the rule stated there (dots to
//! underscores, `_seconds` for the unit `s`, `_total` on counter samples), so that a live run and
//! an imported log land in the same series and traces look alike.
//!
//! Keys that only an import has (`tag`, `source.file`, `source.run`) are defined here.

use crate::config::Timing;
use crate::names::{attr, metric, span};
use crate::vocab::{Section, Site};
use std::borrow::Cow;

/// `service.name` of every imported resource.
pub(crate) const SERVICE_NAME: &str = "phasetrace-import";
/// Instrumentation scope of the imported metrics and spans.
pub(crate) const SCOPE_NAME: &str = "phasetrace.import";
/// Root span of one decode step.
pub(crate) const SPAN_STEP: &str = span::STEP;
/// Span event carrying a layer's routed expert ids.
pub(crate) const EVENT_MOE_ROUTE: &str = span::MOE_ROUTE_EVENT;
/// `phasetrace.timing` of imported spans: the reference profilers synchronise the stream before
/// reading the host clock, which is what the live `sync` backend does.
pub(crate) const TIMING: Timing = Timing::Sync;

/// The probe bucket (and so the span name) of a rendezvous at `site`: the vocabulary's probe
/// section for the built-in sites (`reduce_attn_bar`, `reduce_mlp_bar`), the same pattern for
/// another site of a log.
pub(crate) fn probe_bucket(site: &str) -> Cow<'static, str> {
    match site {
        s if Site::ATTN.as_str() == Some(s) => Cow::Borrowed(Section::REDUCE_ATTN_BAR.as_str()),
        s if Site::MLP.as_str() == Some(s) => Cow::Borrowed(Section::REDUCE_MLP_BAR.as_str()),
        s => Cow::Owned(format!("reduce_{s}_bar")),
    }
}

/// A metric family the writers emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Family {
    /// Time in one decode section: sum and count (calls).
    SectionDuration,
    /// Decode steps counted.
    Steps,
    /// Rendezvous (collective arrival skew) wait: sum and count (probes).
    CollectiveWait,
    /// Speculative phase time: sum and count (rounds).
    SpecPhaseDuration,
    /// Verify sub-split time: sum and count (rounds).
    SpecVerifyPartDuration,
    /// Speculative rounds counted.
    SpecRounds,
}

impl Family {
    /// Every family, in the order the writers emit them.
    pub(crate) const ALL: [Family; 6] = [
        Family::SectionDuration,
        Family::Steps,
        Family::CollectiveWait,
        Family::SpecPhaseDuration,
        Family::SpecVerifyPartDuration,
        Family::SpecRounds,
    ];

    /// The OpenTelemetry instrument name.
    pub(crate) fn otel_name(self) -> &'static str {
        match self {
            Self::SectionDuration => metric::SECTION_DURATION,
            Self::Steps => metric::STEPS,
            Self::CollectiveWait => metric::COLLECTIVE_WAIT,
            Self::SpecPhaseDuration => metric::SPEC_PHASE_DURATION,
            Self::SpecVerifyPartDuration => metric::SPEC_VERIFY_PART_DURATION,
            Self::SpecRounds => metric::SPEC_ROUNDS,
        }
    }

    /// The OpenTelemetry unit (UCUM).
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Self::Steps => metric::UNIT_STEPS,
            Self::SpecRounds => metric::UNIT_ROUNDS,
            _ => metric::UNIT_SECONDS,
        }
    }

    /// Whether the family is a monotonic counter; otherwise it is a duration with sum and count.
    pub(crate) fn is_counter(self) -> bool {
        matches!(self, Self::Steps | Self::SpecRounds)
    }

    /// The Prometheus family name (`# TYPE` line; counters without `_total`).
    pub(crate) fn prom_family(self) -> String {
        let mut name = self.otel_name().replace('.', "_");
        if self.unit() == metric::UNIT_SECONDS {
            name.push_str("_seconds");
        }
        name
    }

    /// One-line description (`# HELP`, OTLP `description`).
    pub(crate) fn description(self) -> &'static str {
        match self {
            Self::SectionDuration => "Time spent in a decode section, imported from a profile log",
            Self::Steps => "Decode steps, imported from a profile log",
            Self::CollectiveWait => {
                "Time a rank waited at a collective's rendezvous probe, imported from a route trace"
            }
            Self::SpecPhaseDuration => {
                "Speculative round time per phase, imported from a phase log"
            }
            Self::SpecVerifyPartDuration => {
                "Verify time per mixer-class part, imported from a phase log"
            }
            Self::SpecRounds => "Speculative rounds, imported from a phase log",
        }
    }
}

/// A label (Prometheus) or attribute (OpenTelemetry) key the writers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Key {
    /// Section bucket name.
    Bucket,
    /// Collective site (`attn`, `mlp`).
    Site,
    /// Layer index.
    Layer,
    /// Tensor-parallel rank, given on the command line.
    Rank,
    /// Speculative phase.
    Phase,
    /// Verify sub-split part.
    Part,
    /// The speculative tracer's caller tag (import only: one log may hold several loops).
    Tag,
    /// Decode steps completed (span attribute).
    Step,
    /// Routed expert ids (span event attribute).
    ExpertIds,
    /// Timing backend (span attribute).
    Timing,
    /// The imported file (import only).
    SourceFile,
    /// Run index within the file (import only).
    SourceRun,
}

impl Key {
    /// The OpenTelemetry attribute key.
    pub(crate) fn otel(self) -> &'static str {
        match self {
            Self::Bucket => attr::BUCKET,
            Self::Site => attr::SITE,
            Self::Layer => attr::LAYER,
            Self::Rank => attr::RANK,
            Self::Phase => attr::PHASE,
            Self::Part => attr::PART,
            Self::Tag => attr::TAG,
            Self::Step => attr::STEP,
            Self::ExpertIds => attr::EXPERT_IDS,
            Self::Timing => attr::TIMING,
            Self::SourceFile => attr::SOURCE_FILE,
            Self::SourceRun => attr::SOURCE_RUN,
        }
    }

    /// The Prometheus label name: the OpenTelemetry key with `.` as `_`.
    pub(crate) fn prom(self) -> String {
        self.otel().replace('.', "_")
    }

    /// Whether values of this key are integers (OTLP `intValue`).
    pub(crate) fn is_int(self) -> bool {
        matches!(
            self,
            Self::Layer | Self::Rank | Self::Step | Self::SourceRun
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_names_follow_the_contract_rule() {
        let names: Vec<String> = Family::ALL.iter().map(|f| f.prom_family()).collect();
        assert_eq!(
            names,
            [
                "phasetrace_section_duration_seconds",
                "phasetrace_steps",
                "phasetrace_collective_wait_seconds",
                "phasetrace_spec_phase_duration_seconds",
                "phasetrace_spec_verify_part_duration_seconds",
                "phasetrace_spec_rounds",
            ]
        );
        assert_eq!(Key::SourceFile.prom(), "source_file");
        assert_eq!(Key::Bucket.prom(), "bucket");
        assert_eq!(probe_bucket("attn"), "reduce_attn_bar");
        assert_eq!(probe_bucket("mlp"), "reduce_mlp_bar");
        assert_eq!(probe_bucket("moe_a2a"), "reduce_moe_a2a_bar");
    }
}
