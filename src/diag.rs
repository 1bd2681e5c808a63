//! phasetrace's own warnings and notices, where the engine looks: `tracing` events under the
//! target `phasetrace` (feature `tracing`) when a subscriber is installed, so the engine's
//! filters and format apply; stderr, prefixed `phasetrace: `, when nothing listens (no global
//! or scoped subscriber) or the build has no `tracing`.
//!
//! A subscriber that filters the target out silences them: that is the engine's choice.

/// The target of every diagnostic event (`RUST_LOG=phasetrace=warn` keeps them).
pub(crate) const TARGET: &str = "phasetrace";

/// How loud a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Severity {
    /// Something is lost or misconfigured.
    Warn,
    /// A state change worth a line (a reload applied, exports working again).
    Info,
}

/// Says `message` once, as a `tracing` event or on stderr (see the module docs).
pub(crate) fn say(severity: Severity, message: std::fmt::Arguments<'_>) {
    #[cfg(feature = "tracing")]
    if tracing::dispatcher::get_default(|d| !d.is::<tracing::subscriber::NoSubscriber>()) {
        match severity {
            Severity::Warn => tracing::warn!(target: TARGET, "{message}"),
            Severity::Info => tracing::info!(target: TARGET, "{message}"),
        }
        return;
    }
    match severity {
        Severity::Warn => eprintln!("{TARGET}: warning: {message}"),
        Severity::Info => eprintln!("{TARGET}: {message}"),
    }
}

/// A warning: `warning!("... {x} ...")`.
macro_rules! warning {
    ($($t:tt)*) => {
        $crate::diag::say($crate::diag::Severity::Warn, format_args!($($t)*))
    };
}

/// A notice: `notice!("... {x} ...")`.
macro_rules! notice {
    ($($t:tt)*) => {
        $crate::diag::say($crate::diag::Severity::Info, format_args!($($t)*))
    };
}

pub(crate) use {notice, warning};

#[cfg(all(test, feature = "tracing"))]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// Records each event's target, level and message.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<(String, tracing::Level, String)>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            struct Msg(String);
            impl tracing::field::Visit for Msg {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    if f.name() == "message" {
                        self.0 = format!("{v:?}");
                    }
                }
            }
            let mut m = Msg(String::new());
            e.record(&mut m);
            let md = e.metadata();
            if let Ok(mut v) = self.0.lock() {
                v.push((md.target().to_owned(), *md.level(), m.0));
            }
        }
    }

    #[test]
    fn with_a_subscriber_diagnostics_are_events_under_the_phasetrace_target() {
        let cap = Capture::default();
        let sub = tracing_subscriber::registry().with(cap.clone());
        tracing::subscriber::with_default(sub, || {
            warning!("the {} is {}", "view", "missing");
            notice!("applied");
        });
        let got = cap.0.lock().expect("events").clone();
        assert_eq!(
            got,
            [
                (
                    TARGET.to_owned(),
                    tracing::Level::WARN,
                    "the view is missing".to_owned()
                ),
                (
                    TARGET.to_owned(),
                    tracing::Level::INFO,
                    "applied".to_owned()
                ),
            ]
        );
    }
}
