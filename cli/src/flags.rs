//! The profiler flags every command accepts: one `--flag` for each setting of
//! [`phasetrace::config::settings::SETTINGS`] that names one, checked by the library's own
//! parser (the variable's rules and the variable's message). A flag beats its variable.
//! A setting gets a flag by naming it in the table; nothing here changes.
//! `phasetrace import` takes only the flags of the OTLP connection
//! ([`phasetrace::config::settings::OTLP_CONNECTION`]): [`OtlpFlags`].

use clap::error::ErrorKind;
use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};
use phasetrace::config::settings::{AnySetting, OTLP_CONNECTION, SETTINGS};
use phasetrace::{ConfigError, ProfilerBuilder};
use std::marker::PhantomData;

/// Which settings of the table a command takes flags for.
pub(crate) trait FlagSet: Send + Sync + 'static {
    /// The settings.
    const SETTINGS: &'static [&'static dyn AnySetting];
}

/// Every setting (`demo`, `check`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AllSettings;

impl FlagSet for AllSettings {
    const SETTINGS: &'static [&'static dyn AnySetting] = SETTINGS;
}

/// The OTLP connection's settings (`import`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OtlpConnection;

impl FlagSet for OtlpConnection {
    const SETTINGS: &'static [&'static dyn AnySetting] = OTLP_CONNECTION;
}

/// The profiler flags given on the command line, as text the library parses.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProfilerFlags<S: FlagSet = AllSettings> {
    given: Vec<(&'static dyn AnySetting, String)>,
    set: PhantomData<S>,
}

/// The flags of the OTLP connection only.
pub(crate) type OtlpFlags = ProfilerFlags<OtlpConnection>;

fn with_flags<S: FlagSet>() -> impl Iterator<Item = (&'static dyn AnySetting, &'static str)> {
    S::SETTINGS.iter().filter_map(|s| s.flag().map(|f| (*s, f)))
}

/// A flag's value checked by its setting's parser. Its error is clap's, but echoes the value
/// as errors of the library do: masked for a secret, credentials in a URL masked, control
/// characters escaped (clap's own message would print the value as given).
#[derive(Clone)]
struct SettingParser(&'static dyn AnySetting);

impl clap::builder::TypedValueParser for SettingParser {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &Command,
        arg: Option<&Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let s = self.0;
        let flag = arg.and_then(Arg::get_long).unwrap_or_else(|| s.var());
        let fail = |kind, message: String| clap::Error::raw(kind, message).with_cmd(cmd);
        let text = value.to_str().ok_or_else(|| {
            fail(
                ErrorKind::InvalidUtf8,
                format!("--{flag} is not valid UTF-8: {}\n", s.expected()),
            )
        })?;
        s.check(text).map(|()| text.to_owned()).map_err(|e| {
            let shown = if s.secret() {
                "<masked>".to_owned()
            } else {
                crate::terminal::escape(&phasetrace::config::redact_credentials(text)).into_owned()
            };
            fail(
                ErrorKind::ValueValidation,
                format!("invalid value '{shown}' for '--{flag}': {e}\n"),
            )
        })
    }
}

impl<S: FlagSet> Args for ProfilerFlags<S> {
    fn augment_args(cmd: Command) -> Command {
        with_flags::<S>().fold(cmd, |cmd, (s, flag)| {
            cmd.arg(
                Arg::new(flag)
                    .long(flag)
                    .help(format!(
                        "{}: {} [env: {}] [default: {}]",
                        s.doc(),
                        s.expected(),
                        s.var(),
                        s.default_text()
                    ))
                    .value_parser(SettingParser(s)),
            )
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl<S: FlagSet> FromArgMatches for ProfilerFlags<S> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let given = with_flags::<S>()
            .filter_map(|(s, flag)| m.get_one::<String>(flag).map(|v| (s, v.clone())))
            .collect();
        Ok(ProfilerFlags {
            given,
            set: PhantomData,
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl<S: FlagSet> ProfilerFlags<S> {
    /// Applies the flags given on top of the builder (flags beat the environment).
    pub(crate) fn apply(&self, mut b: ProfilerBuilder) -> Result<ProfilerBuilder, ConfigError> {
        for (s, text) in &self.given {
            b = b.with_text(s.var(), text)?;
        }
        Ok(b)
    }
}
