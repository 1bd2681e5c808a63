//! The profiler flags every command accepts: one `--flag` for each setting of
//! [`phasetrace::config::settings::SETTINGS`] that names one, checked by the library's own
//! parser (the variable's rules and the variable's message). A flag beats its variable.
//! A setting gets a flag by naming it in the table; nothing here changes.

use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};
use phasetrace::config::settings::{AnySetting, SETTINGS};
use phasetrace::{ConfigError, ProfilerBuilder};

/// The profiler flags given on the command line, as text the library parses.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProfilerFlags {
    given: Vec<(&'static dyn AnySetting, String)>,
}

fn with_flags() -> impl Iterator<Item = (&'static dyn AnySetting, &'static str)> {
    SETTINGS.iter().filter_map(|s| s.flag().map(|f| (*s, f)))
}

impl Args for ProfilerFlags {
    fn augment_args(cmd: Command) -> Command {
        with_flags().fold(cmd, |cmd, (s, flag)| {
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
                    .value_parser(move |text: &str| s.check(text).map(|()| text.to_owned())),
            )
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for ProfilerFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let given = with_flags()
            .filter_map(|(s, flag)| m.get_one::<String>(flag).map(|v| (s, v.clone())))
            .collect();
        Ok(ProfilerFlags { given })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl ProfilerFlags {
    /// Applies the flags given on top of the builder (flags beat the environment).
    pub(crate) fn apply(&self, mut b: ProfilerBuilder) -> Result<ProfilerBuilder, ConfigError> {
        for (s, text) in &self.given {
            b = b.with_text(*s, text)?;
        }
        Ok(b)
    }
}
