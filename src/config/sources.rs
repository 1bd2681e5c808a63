//! Where a setting's value comes from while resolving: [`Sources`] reads code, then the
//! environment (the variable, its fallbacks, legacy aliases), and records each value's origin.
//! The resolution (`resolve.rs`) and the OTLP settings (`otlp.rs`) both read through it.
//!
//! ```text
//! code (ConfigBuilder's values) + environment ──Sources::{get, value}──> typed value + Origin
//! ```

use super::error::invalid;
use super::settings::{Setting, SettingValue};
use super::{ConfigError, Listen, Origin, echoed};
use crate::names::env;
use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::Arc;

/// A value set in code, type-erased; its [`Setting`] knows the type.
pub(super) type CodeValue = Arc<dyn Any + Send + Sync>;

/// Where values come from while resolving: code, then the environment; records origins.
pub(super) struct Sources<'a> {
    pub(super) env: &'a dyn Fn(&str) -> Option<OsString>,
    /// `OTEL_*` variables are not read (see `ConfigBuilder::embedded`).
    pub(super) embedded: bool,
    pub(super) code: &'a BTreeMap<&'static str, CodeValue>,
    pub(super) aliases: &'a [(String, &'static str)],
    pub(super) origins: BTreeMap<&'static str, Origin>,
    pub(super) alias_warnings: Vec<String>,
}

impl Sources<'_> {
    /// The trimmed text of `var`, `None` when unset or empty.
    fn text(&self, var: &str, expected: &str) -> Result<Option<String>, ConfigError> {
        if self.embedded && var.starts_with("OTEL_") {
            return Ok(None);
        }
        match (self.env)(var) {
            None => Ok(None),
            Some(v) => match v.into_string() {
                Ok(s) if s.trim().is_empty() => Ok(None),
                Ok(s) => Ok(Some(s.trim().to_owned())),
                Err(_) => Err(ConfigError::NotUnicode {
                    var: var.to_owned(),
                    expected: expected.to_owned(),
                }),
            },
        }
    }

    fn parse<T: SettingValue>(s: &Setting<T>, var: &str, text: &str) -> Result<T, ConfigError> {
        s.parse(text).map_err(|e| ConfigError::Invalid {
            var: var.to_owned(),
            // Never echo secrets: header values carry API keys.
            value: echoed(s.secret, text),
            expected: e.0,
        })
    }

    /// The environment's value of `s`: its variable, else its fallbacks in order; legacy
    /// aliases are honored when the variable is unset, and a disagreement is noted.
    fn env<T: SettingValue>(&mut self, s: &Setting<T>) -> Result<Option<T>, ConfigError> {
        let mut found = None;
        for var in std::iter::once(&s.var).chain(s.fallbacks) {
            if let Some(text) = self.text(var, s.expected)? {
                found = Some((Self::parse(s, var, &text)?, text));
                break;
            }
        }
        for (alias, target) in self.aliases {
            if *target != s.var {
                continue;
            }
            let Some(raw) = self.text(alias, s.expected)? else {
                continue;
            };
            let v = Self::parse(s, alias, &raw)?;
            match &found {
                None => found = Some((v, raw)),
                Some((g, text)) if *g != v => self.alias_warnings.push(format!(
                    "{target}={} overrides {alias}={} (the phasetrace name wins; unset one to silence this)",
                    echoed(s.secret, text),
                    echoed(s.secret, &raw),
                )),
                Some(_) => {}
            }
        }
        Ok(found.map(|(v, _)| v))
    }

    /// The value of `s` set in code, else in the environment (parsed either way: a bad value
    /// is an error even when code overrides it), `None` when neither sets it.
    pub(super) fn get<T: SettingValue>(
        &mut self,
        s: &Setting<T>,
    ) -> Result<Option<T>, ConfigError> {
        let env = self.env(s)?;
        if let Some(v) = self.code.get(s.var).and_then(|v| v.downcast_ref::<T>()) {
            s.check_code_value(v).map_err(|e| ConfigError::Invalid {
                var: format!("{} set in code", s.var),
                value: echoed(s.secret, &s.show(v)),
                expected: e.0,
            })?;
            self.origins.insert(s.var, Origin::Code);
            return Ok(Some(v.clone()));
        }
        // A value that stands for the variable unset (`(none)`: a per-signal header list with
        // no entries) keeps the default's origin, as `check` prints it.
        if env.as_ref().is_some_and(|v| (s.show)(v).is_some()) {
            self.origins.insert(s.var, Origin::Env);
        }
        Ok(env)
    }

    /// The value of `s`: code, else the environment, else its default.
    pub(super) fn value<T: SettingValue>(&mut self, s: &Setting<T>) -> Result<T, ConfigError> {
        Ok(self.get(s)?.unwrap_or_else(|| s.default_value()))
    }

    /// The built-in Prometheus address: `127.0.0.1:9464`, the port offset by `LOCAL_RANK` when
    /// a launcher set it, so that the ranks of one host each get their own without
    /// configuration.
    pub(super) fn builtin_listen(&self) -> Result<Listen, ConfigError> {
        let expected = "a whole number from 0 to 56071 (the launcher's rank on this host)";
        let Some(text) = self.text(env::LOCAL_RANK, expected)? else {
            return Ok(Listen::builtin());
        };
        let mut a = match Listen::builtin() {
            Listen::At(a) => a,
            other => return Ok(other),
        };
        let port = text
            .parse::<u16>()
            .ok()
            .and_then(|n| a.port().checked_add(n))
            .ok_or_else(|| invalid(env::LOCAL_RANK, &text, expected))?;
        a.set_port(port);
        Ok(Listen::At(a))
    }
}
