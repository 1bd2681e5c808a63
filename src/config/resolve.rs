//! The resolution: `ConfigBuilder` holds what code set; `resolve_with` reads every setting
//! from code, else the environment (its variable, its fallbacks, legacy aliases), else its
//! default, records where each came from, combines the OTLP (`otlp.rs`) and Prometheus
//! settings, and assembles the [`Config`].
//!
//! ```text
//! ConfigBuilder (code) + environment ──Sources::{get, value} (sources.rs)──> table::Plain
//!   + OtlpGeneral, SignalGiven (otlp.rs) + listen ──Config::assemble──> Config (+ origins)
//! ```

use super::error::invalid;
use super::otlp::{METRICS, OtlpGeneral, TRACES, check_otlp};
use super::settings::{self, AnySetting, Setting, SettingValue};
use super::sources::{CodeValue, Sources};
use super::{
    Config, ConfigError, Exporter, ExporterSet, Listen, Origin, SectionLevel, SpecLevel, echoed,
    table,
};
use crate::names::env;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::sync::Arc;

impl Config {
    /// Resolves defaults and the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        ConfigBuilder::default().resolve_with(|k| std::env::var_os(k))
    }

    /// Whether anything is recorded at all.
    pub fn is_enabled(&self) -> bool {
        !self.sdk_disabled && (self.level != SectionLevel::Off || self.spec_level != SpecLevel::Off)
    }

    /// Where the setting of variable `var` came from.
    pub fn origin(&self, var: &str) -> Origin {
        self.origins.get(var).copied().unwrap_or(Origin::Default)
    }
}

/// Settings made in code; they beat the environment. Built by [`crate::ProfilerBuilder`].
#[derive(Clone, Default)]
pub(crate) struct ConfigBuilder {
    /// Values set in code, by variable.
    pub(super) code: BTreeMap<&'static str, CodeValue>,
    /// A value given in code that did not parse, reported by `resolve_with`.
    pub(super) deferred: Option<ConfigError>,
    /// (alias variable, the phasetrace variable it stands for)
    pub(crate) aliases: Vec<(String, &'static str)>,
    /// The engine gave a provider of its own (meter, tracer or both): the process's `OTEL_*`
    /// variables are its SDK's, never read here, and no exporter of phasetrace's is on by
    /// default (only code or a `PHASETRACE_*` setting starts one).
    pub(crate) embedded: bool,
}

impl ConfigBuilder {
    /// Sets `setting` in code.
    pub(crate) fn set<T: SettingValue>(&mut self, setting: &Setting<T>, value: T) {
        self.code.insert(setting.var, Arc::new(value));
    }

    /// Sets a setting in code from its text, as its variable would read it.
    pub(crate) fn set_text(
        &mut self,
        setting: &'static dyn AnySetting,
        text: &str,
    ) -> Result<(), ConfigError> {
        let v = setting.parse_any(text).map_err(|e| ConfigError::Invalid {
            var: format!("{} set in code", setting.var()),
            value: echoed(setting.secret(), text),
            expected: e.0,
        })?;
        self.code.insert(setting.var(), v);
        Ok(())
    }

    /// Keeps the first error of a value given in code for `resolve_with`.
    pub(crate) fn defer(&mut self, e: ConfigError) {
        self.deferred.get_or_insert(e);
    }
}

impl fmt::Debug for ConfigBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (var, v) in &self.code {
            match settings::find(var) {
                Some(s) => m.entry(var, &s.show_any(v.as_ref())),
                None => m.entry(var, &"?"),
            };
        }
        m.finish()
    }
}

impl ConfigBuilder {
    /// Resolves defaults, then `get` (the environment), then the settings in code.
    pub(crate) fn resolve_with(
        &self,
        get: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Config, ConfigError> {
        use settings as s;
        if let Some(e) = &self.deferred {
            return Err(e.clone());
        }
        for (alias, target) in &self.aliases {
            if settings::find(target).is_none() {
                return Err(ConfigError::Conflict(format!(
                    "legacy alias {alias} stands for {target}, which is not a phasetrace variable"
                )));
            }
        }
        let mut src = Sources {
            env: &get,
            embedded: self.embedded,
            code: &self.code,
            aliases: &self.aliases,
            origins: BTreeMap::new(),
            alias_warnings: Vec::new(),
        };

        // Every setting with a `Config` field, in the table's order; then those combined here.
        let plain = table::Plain::read(&mut src)?;
        let summary_every = src.get(&s::SUMMARY_EVERY)?;
        let prometheus = src.get(&s::PROMETHEUS)?;
        let otlp = OtlpGeneral::read(&mut src)?;
        let traces_exporter = src.get(&s::TRACES_EXPORTER)?;
        let shutdown_timeout = src.value(&s::SHUTDOWN_TIMEOUT)?;
        let metrics_exporters = src.get(&s::METRICS_EXPORTER)?;

        let mut given_traces = TRACES.given(&mut src)?;
        let mut given_metrics = METRICS.given(&mut src)?;
        // `with_otlp_endpoint(None)` means no OTLP: a signal's endpoint from the environment
        // does not bring it back (one set in code for that signal does).
        if otlp.endpoint.is_none() && src.origins.get(s::OTLP_ENDPOINT.var) == Some(&Origin::Code) {
            for (sig, given) in [(&TRACES, &mut given_traces), (&METRICS, &mut given_metrics)] {
                if src.origins.get(sig.endpoint.var) == Some(&Origin::Env) {
                    given.endpoint = None;
                    src.origins.remove(sig.endpoint.var);
                }
            }
        }
        let traces_endpoint = otlp.for_signal(&TRACES, &given_traces);
        let metrics_endpoint = otlp.for_signal(&METRICS, &given_metrics);

        let metrics_explicit = metrics_exporters.is_some();
        let otlp_if = |endpoint: bool| {
            if endpoint {
                ExporterSet::of(&[Exporter::Otlp])
            } else {
                ExporterSet::NONE
            }
        };
        let metrics = metrics_exporters.unwrap_or_else(|| otlp_if(metrics_endpoint.is_some()));
        let traces = traces_exporter.unwrap_or_else(|| otlp_if(traces_endpoint.is_some()));
        let traces_on = traces.contains(Exporter::Otlp);
        for (on, sig, e, var) in [
            (
                traces_on,
                &TRACES,
                &traces_endpoint,
                env::OTEL_TRACES_EXPORTER,
            ),
            (
                metrics.contains(Exporter::Otlp),
                &METRICS,
                &metrics_endpoint,
                env::OTEL_METRICS_EXPORTER,
            ),
        ] {
            if on && e.is_none() {
                return Err(ConfigError::Conflict(format!(
                    "OTLP export of {} is selected ({var}) but neither {} nor {} is set: set one, \
                     or select another exporter",
                    sig.name,
                    sig.endpoint.var,
                    env::OTEL_EXPORTER_OTLP_ENDPOINT
                )));
            }
        }
        let traces_otlp = traces_endpoint.filter(|_| traces_on);
        let metrics_otlp = metrics_endpoint.filter(|_| metrics.contains(Exporter::Otlp));
        for (sig, given, o) in [
            (&TRACES, &given_traces, &traces_otlp),
            (&METRICS, &given_metrics, &metrics_otlp),
        ] {
            if let Some(o) = o {
                check_otlp(&src, sig, given, o)?;
            }
        }

        let listen = self.listen(
            &src,
            prometheus,
            metrics,
            metrics_explicit,
            metrics_otlp.is_some(),
        )?;
        let prometheus = listen
            .for_rank(plain.rank)
            .map_err(|()| invalid(env::PROMETHEUS, &listen.to_string(), Listen::EXPECTED))?;

        let summary_every = summary_every.unwrap_or(if metrics.contains(Exporter::Console) {
            100
        } else {
            0
        });
        Ok(Config::assemble(
            plain,
            table::Derived {
                summary_every,
                prometheus,
                otlp: otlp.config(),
                // The exporters in force: those selected, as their settings resolved (OTLP
                // with an endpoint, the endpoint with an address, the summary with a period).
                traces_exporters: traces.with_if(Exporter::Otlp, traces_otlp.is_some()),
                metrics_exporters: metrics
                    .with_if(Exporter::Otlp, metrics_otlp.is_some())
                    .with_if(Exporter::Prometheus, prometheus.is_some())
                    .with_if(Exporter::Console, summary_every > 0),
                traces_otlp,
                metrics_otlp,
                given_traces,
                given_metrics,
                shutdown_timeout,
                origins: src.origins,
                alias_warnings: src.alias_warnings,
            },
        ))
    }

    /// Where the embedded Prometheus endpoint listens: `set` when given; otherwise the built-in
    /// address when metrics are pushed nowhere, and off when the engine gave a provider.
    fn listen(
        &self,
        src: &Sources<'_>,
        set: Option<Listen>,
        metrics: ExporterSet,
        metrics_explicit: bool,
        metrics_otlp: bool,
    ) -> Result<Listen, ConfigError> {
        Ok(match set {
            Some(l) if l != Listen::Off && !cfg!(feature = "prometheus") => {
                return Err(ConfigError::Conflict(format!(
                    "{}={l}: this build of phasetrace has no Prometheus endpoint (its cargo \
                     feature `prometheus` is off): enable the feature, or set it to off",
                    env::PROMETHEUS
                )));
            }
            Some(l) => l,
            // The engine gave a provider: phasetrace starts no exporter it was not asked for,
            // whatever features the build has.
            None if self.embedded && !metrics.contains(Exporter::Prometheus) => Listen::Off,
            None if !cfg!(feature = "prometheus") => Listen::Off,
            None if metrics.contains(Exporter::Prometheus)
                || (!metrics_explicit && !metrics_otlp) =>
            {
                src.builtin_listen()?
            }
            None => Listen::Off,
        })
    }
}
