//! The telemetry contract as the import writers use it: the families, units, keys and span names
//! of [`phasetrace_names`], with their Prometheus spellings derived by the live `/metrics` encoder's
//! own functions (dots to underscores, `_seconds` for the unit `s`, `_total` on counter
//! samples), so that a live run and an imported log land in the same series and traces look
//! alike. `cli/tests/it/imported_series_are_the_series_a_live_run_exports.rs` compares the two.
//!
//! Keys that only an import has (`tag`, `source.file`, `source.run`) are defined in
//! [`phasetrace_names::attr`] too.

use phasetrace::config::Timing;
use phasetrace::vocab::{Section, Site};
use phasetrace_names::prometheus;
use phasetrace_names::{attr, metric, span};
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

/// The site of a probe bucket, the inverse of [`probe_bucket`]: `attn` for `reduce_attn_bar`;
/// `None` for a bucket that is not a rendezvous probe. A table row of a probe bucket sums the
/// probes of that site, which the live library records at that site.
pub(crate) fn probe_site(bucket: &str) -> Option<&str> {
    let site = bucket.strip_prefix("reduce_")?.strip_suffix("_bar")?;
    (!site.is_empty() && probe_bucket(site) == bucket).then_some(site)
}

/// A metric family the writers emit: the live library's instruments of the same name (see
/// `worker::aggregate::Instruments`), with the same unit and attribute keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Family {
    /// Time in one decode section: sum and count (calls), attributes `bucket`, `site` (probe
    /// buckets), `rank`, `group`; no `layer`.
    SectionDuration,
    /// Time in one section per layer: a monotonic counter of seconds, attributes `bucket`,
    /// `layer`, `site`, `rank`, `group`.
    SectionLayerTime,
    /// Calls of one section per layer: a monotonic counter, the same attributes.
    SectionLayerCalls,
    /// Decode steps counted.
    Steps,
    /// Rendezvous (collective arrival skew) wait: sum and count (probes), attributes `site`,
    /// `rank`, `group`; no `layer`.
    CollectiveWait,
    /// Rendezvous wait per layer: a monotonic counter of seconds, attributes `site`, `layer`,
    /// `rank`, `group`.
    CollectiveLayerWaitTime,
    /// Rendezvous waits per layer: a monotonic counter, the same attributes.
    CollectiveLayerWaitCalls,
    /// Speculative phase time: sum and count (rounds).
    SpecPhaseDuration,
    /// Verify sub-split time: sum and count (rounds).
    SpecVerifyPartDuration,
    /// Speculative rounds counted.
    SpecRounds,
}

/// What a family's data points are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A duration distribution known only by its sum (seconds) and count: an OTLP histogram
    /// without buckets, an OpenMetrics summary without quantiles.
    SumCount,
    /// A monotonic cumulative counter of seconds (the points' `sum_ns`).
    SecondsCounter,
    /// A monotonic cumulative counter of things (the points' `count`).
    CountCounter,
}

impl Family {
    /// Every family, in the order the writers emit them.
    pub(crate) const ALL: [Family; 10] = [
        Family::SectionDuration,
        Family::SectionLayerTime,
        Family::SectionLayerCalls,
        Family::Steps,
        Family::CollectiveWait,
        Family::CollectiveLayerWaitTime,
        Family::CollectiveLayerWaitCalls,
        Family::SpecPhaseDuration,
        Family::SpecVerifyPartDuration,
        Family::SpecRounds,
    ];

    /// The OpenTelemetry instrument name.
    pub(crate) fn otel_name(self) -> &'static str {
        match self {
            Self::SectionDuration => metric::SECTION_DURATION,
            Self::SectionLayerTime => metric::SECTION_LAYER_TIME,
            Self::SectionLayerCalls => metric::SECTION_LAYER_CALLS,
            Self::Steps => metric::STEPS,
            Self::CollectiveWait => metric::COLLECTIVE_WAIT,
            Self::CollectiveLayerWaitTime => metric::COLLECTIVE_LAYER_WAIT_TIME,
            Self::CollectiveLayerWaitCalls => metric::COLLECTIVE_LAYER_WAIT_CALLS,
            Self::SpecPhaseDuration => metric::SPEC_PHASE_DURATION,
            Self::SpecVerifyPartDuration => metric::SPEC_VERIFY_PART_DURATION,
            Self::SpecRounds => metric::SPEC_ROUNDS,
        }
    }

    /// The OpenTelemetry unit (UCUM), as the live instrument declares it.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Self::Steps => metric::UNIT_STEPS,
            Self::SpecRounds => metric::UNIT_ROUNDS,
            Self::SectionLayerCalls | Self::CollectiveLayerWaitCalls => metric::UNIT_CALLS,
            Self::SectionDuration
            | Self::SectionLayerTime
            | Self::CollectiveWait
            | Self::CollectiveLayerWaitTime
            | Self::SpecPhaseDuration
            | Self::SpecVerifyPartDuration => metric::UNIT_SECONDS,
        }
    }

    /// What the family's points are.
    pub(crate) fn shape(self) -> Shape {
        match self {
            Self::Steps
            | Self::SpecRounds
            | Self::SectionLayerCalls
            | Self::CollectiveLayerWaitCalls => Shape::CountCounter,
            Self::SectionLayerTime | Self::CollectiveLayerWaitTime => Shape::SecondsCounter,
            Self::SectionDuration
            | Self::CollectiveWait
            | Self::SpecPhaseDuration
            | Self::SpecVerifyPartDuration => Shape::SumCount,
        }
    }

    /// Whether the family's records are events (one route-trace line is one probe, one
    /// speculative line one burst), so that its total holds until the next line; otherwise
    /// they are a table's snapshots of running totals.
    pub(crate) fn is_of_events(self) -> bool {
        !matches!(self, Self::SectionDuration | Self::Steps)
    }

    /// Whether the family is a monotonic counter; otherwise it is a duration with sum and count.
    pub(crate) fn is_counter(self) -> bool {
        self.shape() != Shape::SumCount
    }

    /// The Prometheus family name (`# TYPE` line; counters without `_total`), by the live
    /// endpoint's own rule ([`phasetrace_names::prometheus::metric_name`]).
    pub(crate) fn prom_family(self) -> String {
        let base = prometheus::metric_name(self.otel_name(), self.unit());
        match base.strip_suffix("_total") {
            Some(family) if self.is_counter() => family.to_owned(),
            _ => base,
        }
    }

    /// The OpenMetrics `# UNIT` of the family, as the live endpoint writes it (`seconds`).
    pub(crate) fn prom_unit(self) -> Option<&'static str> {
        prometheus::unit_suffix(self.unit())
    }

    /// One-line description (`# HELP`, OTLP `description`).
    pub(crate) fn description(self) -> &'static str {
        match self {
            Self::SectionDuration => "Time spent in a decode section, imported from a profile log",
            Self::SectionLayerTime => {
                "Time spent in a decode section per layer, imported from a route trace"
            }
            Self::SectionLayerCalls => {
                "Calls of a decode section per layer, imported from a route trace"
            }
            Self::Steps => "Decode steps, imported from a profile log",
            Self::CollectiveWait => {
                "Time a rank waited at a collective's rendezvous probe, imported from a route trace"
            }
            Self::CollectiveLayerWaitTime => {
                "Time a rank waited at a collective's rendezvous probe per layer, imported from a route trace"
            }
            Self::CollectiveLayerWaitCalls => {
                "Rendezvous waits at a collective per layer, imported from a route trace"
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
    /// Tensor-parallel rank, given on the command line (`--rank`, default 0 as live).
    Rank,
    /// Collective group of the rank, given on the command line (`--group`, default as live).
    Group,
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
            Self::Group => attr::GROUP,
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

    /// The Prometheus label name, by the live endpoint's rule (`source.file` ->
    /// `source_file`).
    pub(crate) fn prom(self) -> String {
        prometheus::label_name(self.otel())
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
                "phasetrace_section_layer_time_seconds",
                "phasetrace_section_layer_calls",
                "phasetrace_steps",
                "phasetrace_collective_wait_seconds",
                "phasetrace_collective_layer_wait_time_seconds",
                "phasetrace_collective_layer_wait_calls",
                "phasetrace_spec_phase_duration_seconds",
                "phasetrace_spec_verify_part_duration_seconds",
                "phasetrace_spec_rounds",
            ]
        );
        assert_eq!(Key::SourceFile.prom(), "source_file");
        assert_eq!(Key::Bucket.prom(), "bucket");
        assert_eq!(Family::SectionLayerTime.prom_unit(), Some("seconds"));
        assert_eq!(Family::SectionLayerCalls.prom_unit(), None);
        assert_eq!(probe_bucket("attn"), "reduce_attn_bar");
        assert_eq!(probe_bucket("mlp"), "reduce_mlp_bar");
        assert_eq!(probe_bucket("moe_a2a"), "reduce_moe_a2a_bar");
        for site in ["attn", "mlp", "moe_a2a"] {
            assert_eq!(probe_site(&probe_bucket(site)), Some(site));
        }
        for bucket in [
            "reduce_attn",
            "reduce_attn_enq",
            "reduce__bar",
            "kda_mixer",
            "reduce_bar",
        ] {
            assert_eq!(probe_site(bucket), None, "{bucket}");
        }
    }
}
