//! An engine's meter provider that is not `opentelemetry_sdk`'s receives every section, wait
//! and step by attributes. The worker records through bound handles only where the provider is
//! known to be an `SdkMeterProvider`: the API's default `SyncInstrument::bind`, which a custom
//! provider inherits, hands out a handle that drops every measurement, so binding here would
//! lose everything silently. The provider below counts each `measure` call per instrument and
//! never overrides `bind`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::{
    Counter, Histogram, HistogramBuilder, InstrumentBuilder, InstrumentProvider, Meter,
    MeterProvider, SyncInstrument,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use phasetrace::{Profiler, Section, SectionLevel, Site};
use phasetrace_names::metric;

const STEPS: u64 = 5;
const LAYERS: u32 = 40;

/// Measurements received, per instrument name.
type Received = Arc<Mutex<HashMap<String, u64>>>;

/// A meter provider of the engine's own making (a bridge to another metrics library, say).
#[derive(Clone, Default)]
struct CountingProvider {
    received: Received,
}

impl MeterProvider for CountingProvider {
    fn meter_with_scope(&self, _scope: InstrumentationScope) -> Meter {
        Meter::new(Arc::new(CountingInstruments {
            received: self.received.clone(),
        }))
    }
}

struct CountingInstruments {
    received: Received,
}

impl InstrumentProvider for CountingInstruments {
    fn f64_histogram(&self, b: HistogramBuilder<'_, Histogram<f64>>) -> Histogram<f64> {
        Histogram::new(Arc::new(Counting {
            name: b.name.into_owned(),
            received: self.received.clone(),
        }))
    }

    fn u64_counter(&self, b: InstrumentBuilder<'_, Counter<u64>>) -> Counter<u64> {
        Counter::new(Arc::new(Counting {
            name: b.name.into_owned(),
            received: self.received.clone(),
        }))
    }
}

/// One instrument: counts its `measure` calls; `bind` is the API's default.
struct Counting {
    name: String,
    received: Received,
}

impl<T> SyncInstrument<T> for Counting {
    fn measure(&self, _value: T, _attributes: &[KeyValue]) {
        let mut m = self.received.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(self.name.clone()).or_default() += 1;
    }
}

#[test]
fn every_section_wait_and_step_reaches_a_custom_meter_provider() {
    let provider = CountingProvider::default();
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_meter_provider(provider.clone())
        .build()
        .expect("building the profiler");
    let rec = profiler.recorder();
    for _ in 0..STEPS {
        let _step = rec.step();
        for layer in 0..LAYERS {
            drop(rec.section(Section::KDA_MIXER, layer, Site::ATTN));
            drop(rec.section(Section::NORM, layer, Site::NONE));
            rec.collective_wait(Site::MLP, layer, Duration::from_micros(3));
        }
    }
    drop(rec);
    profiler.shutdown();
    assert_eq!(profiler.stats().dropped.total(), 0, "nothing was dropped");
    let got = provider
        .received
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let n = |name: &str| got.get(name).copied().unwrap_or(0);
    let per_step = u64::from(LAYERS);
    assert_eq!(
        n(metric::SECTION_DURATION),
        STEPS * per_step * 2,
        "every section, by attributes: {got:?}"
    );
    assert_eq!(
        n(metric::COLLECTIVE_WAIT),
        STEPS * per_step,
        "every wait: {got:?}"
    );
    assert_eq!(n(metric::STEP_DURATION), STEPS, "every step: {got:?}");
}
