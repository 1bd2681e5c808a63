//! What phasetrace needs from a meter provider: room for the per-layer series, and base-2
//! exponential duration histograms where OTLP asks for them. phasetrace registers this view on
//! the providers it builds; an engine that hands phasetrace its own provider registers it there
//! ([`view`]), and a profiler built on a provider without it says so once at `build()`.

use crate::names::{default, metric};
use opentelemetry_sdk::metrics::{Aggregation, Instrument, InstrumentKind, Stream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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

/// How many per-layer instruments a [`view`] has been asked about, process-wide: `build()`
/// compares it before and after creating its instruments on a given provider to tell whether
/// the view is registered there.
static LAYER_VIEWS_APPLIED: AtomicU64 = AtomicU64::new(0);

pub(crate) fn layer_views_applied() -> u64 {
    LAYER_VIEWS_APPLIED.load(Relaxed)
}

/// Whether `provider`, when it is an `SdkMeterProvider`, has at least one reader (`None` for
/// any other type). The SDK has no accessor for it; its `Debug` shows the pipelines, one per
/// reader, as `Pipelines([..])`. Should that shape change, the answer is "has readers", and the
/// missing-view hint is said as before.
pub(crate) fn sdk_has_readers<P: 'static>(provider: &P) -> Option<bool> {
    let sdk = (provider as &dyn std::any::Any)
        .downcast_ref::<opentelemetry_sdk::metrics::SdkMeterProvider>()?;
    Some(!format!("{sdk:?}").contains("Pipelines([])"))
}

std::thread_local! {
    /// How many duration histograms a `view(true)` made exponential on this thread. The SDK
    /// asks the views while an instrument is built, on the building thread, so `build()`
    /// reads it before and after creating its instruments on a given provider to learn that
    /// the provider's histograms are exponential (its backend takes them), race-free.
    static EXPONENTIAL_VIEWS_APPLIED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

pub(crate) fn exponential_views_applied() -> u64 {
    EXPONENTIAL_VIEWS_APPLIED.with(std::cell::Cell::get)
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
            LAYER_VIEWS_APPLIED.fetch_add(1, Relaxed);
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
            LAYER_VIEWS_APPLIED.fetch_add(1, Relaxed);
            return Stream::builder()
                .with_cardinality_limit(default::LAYER_SERIES_LIMIT)
                .build()
                .ok();
        }
        (exponential && i.kind() == InstrumentKind::Histogram && i.unit() == metric::UNIT_SECONDS)
            .then(|| {
                EXPONENTIAL_VIEWS_APPLIED.with(|n| n.set(n.get() + 1));
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
}
