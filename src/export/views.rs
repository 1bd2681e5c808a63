//! What phasetrace needs from a meter provider: room for the per-layer series, and base-2
//! exponential duration histograms where OTLP asks for them. phasetrace registers this view on
//! the providers it builds; an engine that hands phasetrace its own provider registers it there
//! ([`view`]), and a profiler built on a provider without it says so once at `build()`: what a
//! provider's views did is learnt while the instruments are created on it ([`watch`]).

use crate::names::{default, metric};
use opentelemetry_sdk::metrics::{Aggregation, Instrument, InstrumentKind, Stream};

/// The per-layer instruments, whose cardinality limit is raised to
/// [`default::LAYER_SERIES_LIMIT`] (the expert-load ones: room for rank threads of one process
/// at 60 MoE layers, `PHASETRACE_EXPERT_TOP` hot experts each).
const LAYER_INSTRUMENTS: [&str; 8] = [
    metric::SECTION_LAYER_TIME,
    metric::SECTION_LAYER_CALLS,
    metric::COLLECTIVE_LAYER_WAIT_TIME,
    metric::COLLECTIVE_LAYER_WAIT_CALLS,
    metric::MOE_LAYER_TOKENS,
    metric::MOE_IMBALANCE,
    metric::MOE_LOAD_CV,
    metric::MOE_HOT_EXPERT_SHARE,
];

/// Whether `provider`, when it is an `SdkMeterProvider`, has at least one reader (`None` for
/// any other type). The SDK has no accessor for it; its `Debug` shows the pipelines, one per
/// reader, as `Pipelines([..])`. Should that shape change, the answer is "has readers", and the
/// missing-view hint is said as before.
pub(crate) fn sdk_has_readers<P: 'static>(provider: &P) -> Option<bool> {
    let sdk = (provider as &dyn std::any::Any)
        .downcast_ref::<opentelemetry_sdk::metrics::SdkMeterProvider>()?;
    Some(!format!("{sdk:?}").contains("Pipelines([])"))
}

/// What a provider's views did with phasetrace's instruments while they were created on it:
/// learnt by [`watch`], per provider, and carried no further than the caller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ViewSeen {
    /// A [`view`] raised the cardinality limit of a per-layer instrument: the provider has it.
    pub(crate) layer: bool,
    /// A `view(true)` made a duration histogram exponential (the provider's backend takes them).
    pub(crate) exponential: bool,
}

std::thread_local! {
    /// The [`watch`] under way on this thread, if any. The SDK asks a provider's views while an
    /// instrument is built, on the building thread, so a watch sees its own provider's views
    /// only; outside a watch [`view`] writes nothing.
    static WATCH: std::cell::Cell<Option<ViewSeen>> = const { std::cell::Cell::new(None) };
}

/// Runs `create`, which creates instruments on one provider, and returns what that provider's
/// views did with them. The view is the engine's closure once registered on its provider, so
/// this thread-scoped watch is its one way back to phasetrace.
pub(crate) fn watch<T>(create: impl FnOnce() -> T) -> (T, ViewSeen) {
    let outer = WATCH.with(|w| w.replace(Some(ViewSeen::default())));
    let made = create();
    let seen = WATCH.with(|w| w.replace(outer)).unwrap_or_default();
    (made, seen)
}

/// Notes what a view did, when a [`watch`] is under way on this thread.
fn saw(note: impl FnOnce(&mut ViewSeen)) {
    WATCH.with(|w| {
        if let Some(mut seen) = w.get() {
            note(&mut seen);
            w.set(Some(seen));
        }
    });
}

/// The view phasetrace's instruments need, for an engine that brings its own
/// `SdkMeterProvider` (`ProfilerBuilder::with_meter_provider`): register it on the provider's
/// builder.
///
/// - The per-layer instruments (`phasetrace.section.layer.*`, `phasetrace.collective.layer.wait.*`:
///   one series per bucket, layer, site, rank and group; the MoE expert-load gauges and counter,
///   per layer and rank) get a cardinality limit of 8,192
///   series each instead of the SDK's 2,000; without the view a model with more (bucket, layer)
///   pairs than that folds the rest into one `otel.metric.overflow` series.
/// - With `exponential`, every duration histogram (unit `s`) becomes a base-2 exponential
///   histogram (at most 160 buckets, scale 20 down as needed); otherwise the instruments keep
///   their explicit buckets (1 µs to 10 s). Choose `true` only for a provider whose exporter
///   sends OTLP to a backend that takes exponential histograms.
///
/// - The per-layer distributions (`phasetrace.section.layer.duration`,
///   `phasetrace.collective.layer.wait.duration`) are always base-2 exponential histograms with
///   the same cardinality limit. phasetrace creates them on a given provider only when it has
///   `view(true)` (its backend takes exponential histograms: one series per section and
///   layer); with `view(false)` or no view the per-layer counters carry the per-layer totals.
///
/// Instruments of other libraries and of the engine pass through unchanged (the view returns
/// `None` for them).
///
/// ```
/// use opentelemetry_sdk::metrics::SdkMeterProvider;
///
/// let provider = SdkMeterProvider::builder()
///     .with_view(phasetrace::view(false))
///     .build();
/// # drop(provider);
/// ```
pub fn view(exponential: bool) -> impl Fn(&Instrument) -> Option<Stream> + Send + Sync + 'static {
    move |i: &Instrument| {
        // The per-layer distributions are exponential on every provider: one series per
        // (section, layer) whatever the spread of the values, and only encoders that write a
        // histogram as one series (protobuf scrape, OTLP) export them.
        if metric::LAYER_DISTRIBUTIONS.contains(&i.name()) {
            saw(|s| s.layer = true);
            return Stream::builder()
                .with_cardinality_limit(default::LAYER_SERIES_LIMIT)
                .with_aggregation(Aggregation::Base2ExponentialHistogram {
                    max_size: metric::LAYER_DISTRIBUTION_MAX_BUCKETS,
                    max_scale: 20,
                    record_min_max: true,
                })
                .build()
                .ok();
        }
        if LAYER_INSTRUMENTS.contains(&i.name()) {
            saw(|s| s.layer = true);
            return Stream::builder()
                .with_cardinality_limit(default::LAYER_SERIES_LIMIT)
                .build()
                .ok();
        }
        (exponential && i.kind() == InstrumentKind::Histogram && i.unit() == metric::UNIT_SECONDS)
            .then(|| {
                saw(|s| s.exponential = true);
                Stream::builder()
                    .with_aggregation(Aggregation::Base2ExponentialHistogram {
                        max_size: 160,
                        max_scale: 20,
                        record_min_max: true,
                    })
                    .build()
                    .ok()
            })
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::metrics::{ManualReader, SdkMeterProvider};

    #[test]
    fn an_sdk_provider_is_told_with_or_without_readers_and_another_type_not_at_all() {
        let none = SdkMeterProvider::builder().build();
        let one = SdkMeterProvider::builder()
            .with_reader(ManualReader::builder().build())
            .build();
        assert_eq!(sdk_has_readers(&none), Some(false));
        assert_eq!(sdk_has_readers(&one), Some(true));
        let noop = opentelemetry::metrics::noop::NoopMeterProvider::new();
        assert_eq!(sdk_has_readers(&noop), None);
    }

    #[test]
    fn a_watch_sees_only_the_provider_it_watches() {
        use opentelemetry::metrics::MeterProvider;
        let with = SdkMeterProvider::builder()
            .with_reader(ManualReader::builder().build())
            .with_view(view(true))
            .build();
        let without = SdkMeterProvider::builder()
            .with_reader(ManualReader::builder().build())
            .build();
        let layer = |p: &SdkMeterProvider| {
            let m = p.meter("test");
            let _c = m.u64_counter(metric::SECTION_LAYER_CALLS).build();
            let _h = m.f64_histogram("d").with_unit(metric::UNIT_SECONDS).build();
        };
        let ((), seen) = watch(|| layer(&with));
        assert_eq!(
            seen,
            ViewSeen {
                layer: true,
                exponential: true
            }
        );
        let ((), seen) = watch(|| layer(&without));
        assert_eq!(seen, ViewSeen::default());
        // Outside a watch the view notes nothing, and the next watch starts clean.
        layer(&with);
        let ((), seen) = watch(|| ());
        assert_eq!(seen, ViewSeen::default());
    }
}
