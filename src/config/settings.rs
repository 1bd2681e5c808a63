//! What a setting is, and the `settings!` macro that turns one declaration per setting into
//! everything about it. The declarations themselves are the `config/table.rs` file: each gives
//! a setting's variable, what it accepts, its default, its parser and printer, its one-line doc,
//! its CLI flag, its [`super::Config`] field and its typed `ProfilerBuilder` setters. The
//! configuration, `phasetrace check`, the CLI's flags and the generated reference
//! (`docs/configuration.md`) all read what the declarations give; none has its own copy.
//!
//! ```text
//! table.rs: settings! { LEVEL: SectionLevel { var, flag, doc, expected, example, default, parse,
//!                                      show, field: level, setter: fn with_level(..) }, ... }
//!   ──> static LEVEL: Setting<SectionLevel> and its place in SETTINGS (check, CLI flags, docs)
//!   ──> Config::level (its doc: the setting's), read by Plain::read in resolve_with
//!   ──> ProfilerBuilder::with_level (and with_text("PHASETRACE_LEVEL", ..) for every setting)
//! ```
//!
//! # Adding a setting
//!
//! 1. Add its declaration to `config/table.rs`, where it goes in `phasetrace check`'s order:
//!    `var: "PHASETRACE_NAME"` is its variable (the one place it is spelled: `cargo xtask docs`
//!    generates [`phasetrace_names::env`] from [`SETTINGS`]), `field: name` gives it a
//!    [`super::Config`] field holding its value as resolved (code, else the environment, else
//!    the default), and `setter: fn with_name(v: T) => v` a typed setter; `flag: "name"` a
//!    `--name` flag. A closed set of values is an enum with `FromStr` and `Display`
//!    (`closed_set!` in `config/values.rs` writes both). `show` must print what `parse` reads
//!    back, and `example` is a valid non-default value that works with every other example (the
//!    tests set them all at once).
//! 2. Use the value (`cfg.name`), and regenerate `names/src/env.rs`, `docs/configuration.md`
//!    and `docs/telemetry.md` (`cargo xtask docs`; CI fails while they are stale).
//!
//! A setting whose value is combined with others (the OTLP connection, the exporters, a default
//! that depends on another setting) declares `get` (how `check` reads it back from the
//! [`super::Config`]) instead of `field`; `ConfigBuilder::resolve_with` reads it where it
//! combines it, into a field that the table's `Config` declares by hand (the table's module doc
//! lists those fields and why).
//!
//! The tests that walk the table (`config::tests::every_setting_prints_what_it_parses_and_says_where_it_came_from`,
//! `the_settings_table_names_each_variable_and_flag_once`, the CLI's
//! `check_prints_each_setting_as_its_variable_reads_it`, and
//! `the_names_crate_and_the_settings_table_list_the_same_variables`) then cover the new setting.

use super::{Config, Expected};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Every setting's descriptor, by its name in the table (`settings::LEVEL`).
pub(crate) use super::table::*;
pub use super::table::{OTLP_CONNECTION, SETTINGS};

/// What a setting's value may be: cloned out of the builder, compared in tests, shared between
/// threads.
pub(crate) trait SettingValue:
    Clone + PartialEq + fmt::Debug + Send + Sync + 'static
{
}
impl<T: Clone + PartialEq + fmt::Debug + Send + Sync + 'static> SettingValue for T {}

/// One setting: everything about it that is not its use.
pub(crate) struct Setting<T: 'static> {
    /// The environment variable.
    pub(crate) var: &'static str,
    /// Variables read, in order, when `var` is unset (launchers' `RANK`, ...).
    pub(crate) fallbacks: &'static [&'static str],
    /// The CLI flag (`level` for `--level`), when the `phasetrace` command has one.
    pub(crate) flag: Option<&'static str>,
    /// One line: what it does.
    pub(crate) doc: &'static str,
    /// What is accepted, as errors and `--help` say it (`off, 0, full, 1, collectives or 2`).
    pub(crate) expected: &'static str,
    /// A valid value other than the default, for `--help`, docs and the tests that walk the
    /// table.
    pub(crate) example: &'static str,
    /// When the default depends on other settings, the words that say how (else empty).
    pub(crate) default_note: &'static str,
    /// Values are secrets: never printed (`key=****`).
    pub(crate) secret: bool,
    pub(crate) default: fn() -> T,
    /// Parses one trimmed, non-empty value; `Err` carries a detail for the message (or "").
    pub(crate) parse: fn(&str) -> Result<T, String>,
    /// The value as the variable would spell it; `None` prints as `(none)` and stands for the
    /// variable unset.
    pub(crate) show: fn(&T) -> Option<String>,
    /// The value a resolved configuration holds; `None` where it does not apply (OTLP settings
    /// without an endpoint), printed as `-`.
    pub(crate) get: fn(&Config) -> Option<T>,
}

impl<T: SettingValue> Setting<T> {
    /// Parses a value as the variable reads it (trimmed; case-insensitive for closed sets).
    pub(crate) fn parse(&self, text: &str) -> Result<T, Expected> {
        (self.parse)(text.trim()).map_err(|detail| {
            Expected(if detail.is_empty() {
                self.expected.to_owned()
            } else {
                format!("{} ({detail})", self.expected)
            })
        })
    }

    /// The default value (see [`Setting::default_note`] for defaults that depend on others).
    pub(crate) fn default_value(&self) -> T {
        (self.default)()
    }

    /// The value as `check` prints it: the variable's spelling, masked when secret, `(none)`
    /// when unset.
    pub(crate) fn show(&self, value: &T) -> String {
        match (self.show)(value) {
            None => "(none)".to_owned(),
            Some(s) if self.secret => mask(&s),
            Some(s) => s,
        }
    }

    /// Checks a value given in code: it must be one the variable could hold (a queue of 10
    /// records is refused in code as in the environment).
    pub(crate) fn check_code_value(&self, value: &T) -> Result<(), Expected> {
        match (self.show)(value) {
            None => Ok(()),
            Some(text) => match self.parse(&text) {
                Ok(back) if back == *value => Ok(()),
                Ok(_) => Err(Expected(self.expected.to_owned())),
                Err(e) => Err(e),
            },
        }
    }

    /// The value `cfg` holds, `None` where the setting does not apply.
    pub(crate) fn get(&self, cfg: &Config) -> Option<T> {
        (self.get)(cfg)
    }
}

/// `k=v,k2=v2` with the values masked.
fn mask(text: &str) -> String {
    text.split(',')
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| format!("{k}=****")))
        .collect::<Vec<_>>()
        .join(",")
}

impl<T> fmt::Debug for Setting<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Setting")
            .field("var", &self.var)
            .field("flag", &self.flag)
            .finish_non_exhaustive()
    }
}

/// A setting of any value type: what the table, `check`, the CLI flags and
/// [`crate::ProfilerBuilder::with_text`] walk.
pub trait AnySetting: Sync + Send + fmt::Debug {
    /// The environment variable.
    fn var(&self) -> &'static str;
    /// The CLI flag, when there is one.
    fn flag(&self) -> Option<&'static str>;
    /// One line: what it does.
    fn doc(&self) -> &'static str;
    /// What is accepted.
    fn expected(&self) -> &'static str;
    /// A valid value other than the default.
    fn example(&self) -> &'static str;
    /// Values are secrets, never printed.
    fn secret(&self) -> bool;
    /// Variables read, in order, when [`AnySetting::var`] is unset (the launchers' `RANK`, ...).
    fn fallbacks(&self) -> &'static [&'static str] {
        &[]
    }
    /// The default as documentation states it (`off`; `127.0.0.1:9464 when ...`).
    fn default_text(&self) -> String;
    /// Checks a value as the variable would read it.
    fn check(&self, text: &str) -> Result<(), Expected>;
    /// The value `cfg` holds as `phasetrace check` prints it: `-` where it does not apply.
    fn shown(&self, cfg: &Config) -> String;
    /// Whether what [`AnySetting::shown`] prints for `cfg` parses back to the value `cfg`
    /// holds (secret values: the keys); `Err` says what differs.
    fn round_trips(&self, cfg: &Config) -> Result<(), String>;
    /// The parsed value, type-erased, for [`crate::ProfilerBuilder::with_text`].
    #[doc(hidden)]
    fn parse_any(&self, text: &str) -> Result<Arc<dyn Any + Send + Sync>, Expected>;
    /// A value set in code, as [`AnySetting::shown`] would print it (masked when secret).
    #[doc(hidden)]
    fn show_any(&self, value: &(dyn Any + Send + Sync)) -> String;
}

impl<T: SettingValue> AnySetting for Setting<T> {
    fn var(&self) -> &'static str {
        self.var
    }
    fn flag(&self) -> Option<&'static str> {
        self.flag
    }
    fn doc(&self) -> &'static str {
        self.doc
    }
    fn expected(&self) -> &'static str {
        self.expected
    }
    fn example(&self) -> &'static str {
        self.example
    }
    fn secret(&self) -> bool {
        self.secret
    }
    fn fallbacks(&self) -> &'static [&'static str] {
        self.fallbacks
    }
    fn default_text(&self) -> String {
        let d = self.show(&self.default_value());
        if self.default_note.is_empty() {
            d
        } else {
            format!("{d} {}", self.default_note)
        }
    }
    fn check(&self, text: &str) -> Result<(), Expected> {
        self.parse(text).map(drop)
    }
    fn shown(&self, cfg: &Config) -> String {
        self.get(cfg)
            .map_or_else(|| "-".to_owned(), |v| self.show(&v))
    }
    fn round_trips(&self, cfg: &Config) -> Result<(), String> {
        let Some(held) = self.get(cfg) else {
            return Ok(());
        };
        let Some(text) = (self.show)(&held) else {
            // Printed as `(none)`: the variable unset, which gives the default.
            return if held == self.default_value() {
                Ok(())
            } else {
                Err(format!("{}: (none) stands for {:?}", self.var, held))
            };
        };
        let printed = self.show(&held);
        if self.secret {
            // Only the keys are printed, the values masked.
            return if printed == mask(&text) {
                Ok(())
            } else {
                Err(format!("{}: a secret printed as {printed:?}", self.var))
            };
        }
        match self.parse(&printed) {
            Ok(back) if back == held => Ok(()),
            Ok(back) => Err(format!(
                "{}: printed {printed:?} for {held:?}, which reads back as {back:?}",
                self.var
            )),
            Err(e) => Err(format!(
                "{}: printed {printed:?}, which does not parse: {e}",
                self.var
            )),
        }
    }
    fn parse_any(&self, text: &str) -> Result<Arc<dyn Any + Send + Sync>, Expected> {
        self.parse(text)
            .map(|v| Arc::new(v) as Arc<dyn Any + Send + Sync>)
    }
    fn show_any(&self, value: &(dyn Any + Send + Sync)) -> String {
        value
            .downcast_ref::<T>()
            .map_or_else(|| "?".to_owned(), |v| self.show(v))
    }
}

/// The setting whose variable is `var`.
pub fn find(var: &str) -> Option<&'static dyn AnySetting> {
    SETTINGS.iter().copied().find(|s| s.var() == var)
}

/// Turns the table of declarations into the settings: each one's [`Setting`] static and its
/// place in [`SETTINGS`], the [`super::Config`] (a field for each setting that declares
/// `field`, its doc the setting's, plus the fields written by hand at the top), the `Plain`
/// values that `resolve_with` reads in one pass, and the typed `ProfilerBuilder` setters.
///
/// A declaration, its keys in this order (`[..]`: optional):
///
/// ```text
/// NAME: Type {
///     var: env::VAR, [fallbacks: &env::FALLBACKS,] [flag: "name",] doc: "One line",
///     expected: "what is accepted", example: "a valid non-default value", default: expr,
///     [default_note: "(when it depends on others)",] [secret: true,]
///     parse: fn(&str) -> Result<Type, String>, show: fn(&Type) -> Option<String>,
///     field: config_field,          (or) get: |c: &Config| -> Option<Type>,
///     [/// doc
///      setter: fn with_name(arg: ArgType, ..) => value_of_type,]*
/// }
/// ```
///
/// and the short form of a per-signal OTLP setting (`OTEL_EXPORTER_OTLP_TRACES_*`), which
/// takes its general setting's accepted values, parser, printer and secrecy, and is unset
/// (`None`, inheriting the general one) by default:
///
/// ```text
/// NAME: Type = signal(GENERAL, "traces") { var: .., doc: "..", example: "..", given: given_traces.part }
/// ```
macro_rules! settings {
    // `fallbacks`, `flag`, `default_note`, `secret`: the value given, else the default.
    (@or ; $default:expr) => { $default };
    (@or $given:expr ; $default:expr) => { $given };
    // How `check` reads a setting back: its field, or the `get` declared.
    (@get $field:ident ;) => { |c| Some(c.$field.clone()) };
    (@get ; $get:expr) => { $get };

    // The per-signal settings take their general setting's words, parser and printer.
    (@signal_expected OTLP_ENDPOINT) => {
        "an http:// or https:// URL with a host and an optional port (and a path)"
    };
    (@signal_expected $general:ident) => { $general.expected };
    (@signal_secret $general:ident) => { $general.secret };
    // The endpoint and the CA are optional already: unset is their `None`.
    (@signal_parse OTLP_ENDPOINT) => { |s| (OTLP_ENDPOINT.parse)(s) };
    (@signal_parse OTLP_CERTIFICATE) => { |s| (OTLP_CERTIFICATE.parse)(s) };
    // A list with no entries (`,`) is no list: unset, the general headers apply (as an empty
    // value does), never "send none" while `check` prints `(none)`.
    (@signal_parse OTLP_HEADERS) => {
        |s| (OTLP_HEADERS.parse)(s).map(|v: Vec<(String, String)>| (!v.is_empty()).then_some(v))
    };
    (@signal_parse $general:ident) => { |s| ($general.parse)(s).map(Some) };
    (@signal_show OTLP_ENDPOINT) => { |v| (OTLP_ENDPOINT.show)(v) };
    (@signal_show OTLP_CERTIFICATE) => { |v| (OTLP_CERTIFICATE.show)(v) };
    (@signal_show $general:ident) => { |v| v.as_ref().and_then(|v| ($general.show)(v)) };

    // Normalizes the declarations one at a time: a per-signal one into the full form.
    (@munch $config:tt [$($done:tt)*]
        $name:ident: $t:ty = signal($general:ident, $signal:literal) {
            var: $var:expr,
            doc: $doc:literal,
            example: $example:literal,
            given: $given:ident.$part:ident $(,)?
        }
        $(, $($rest:tt)*)?
    ) => {
        $crate::config::settings::settings!(@munch $config [$($done)* [
            $name: Option<$t> {
                var: $var,
                doc: concat!($doc, " of ", $signal, " (unset: the general setting's)"),
                expected: $crate::config::settings::settings!(@signal_expected $general),
                example: $example,
                default: None,
                secret: $crate::config::settings::settings!(@signal_secret $general),
                parse: $crate::config::settings::settings!(@signal_parse $general),
                show: $crate::config::settings::settings!(@signal_show $general),
                get: |c| Some(c.$given.$part.clone()),
            }
        ]] $($($rest)*)?);
    };
    (@munch $config:tt [$($done:tt)*] $name:ident: $t:ty { $($body:tt)* } $(, $($rest:tt)*)?) => {
        $crate::config::settings::settings!(@munch $config [$($done)* [$name: $t { $($body)* }]] $($($rest)*)?);
    };
    (@munch $config:tt [$($done:tt)*]) => {
        $crate::config::settings::settings!(@emit $config $($done)*);
    };

    (@emit {
        $(#[$config_meta:meta])*
        pub struct Config {
            $($(#[$derived_meta:meta])* $derived_vis:vis $derived:ident: $derived_t:ty),* $(,)?
        }
    } $([
        $name:ident: $t:ty {
            var: $var:expr,
            $(fallbacks: $fallbacks:expr,)?
            $(flag: $flag:literal,)?
            doc: $doc:expr,
            expected: $expected:expr,
            example: $example:literal,
            default: $default:expr,
            $(default_note: $note:literal,)?
            $(secret: $secret:expr,)?
            parse: $parse:expr,
            show: $show:expr,
            $(field: $field:ident,)?
            $(get: $get:expr,)?
            $($(#[$setter_meta:meta])* setter: fn $setter:ident($($arg:ident: $arg_t:ty),*) => $value:expr,)*
        }
    ])*) => {
        $(
            #[doc = $doc]
            pub(crate) static $name: $crate::config::settings::Setting<$t> =
                $crate::config::settings::Setting {
                    var: $var,
                    fallbacks: $crate::config::settings::settings!(@or $($fallbacks)? ; &[]),
                    flag: $crate::config::settings::settings!(@or $(Some($flag))? ; None),
                    doc: $doc,
                    expected: $expected,
                    example: $example,
                    default_note: $crate::config::settings::settings!(@or $($note)? ; ""),
                    secret: $crate::config::settings::settings!(@or $($secret)? ; false),
                    default: || $default,
                    parse: $parse,
                    show: $show,
                    get: $crate::config::settings::settings!(@get $($field)? ; $($get)?),
                };
        )*

        /// Every setting, in the order `phasetrace check` prints them.
        pub static SETTINGS: &[&dyn $crate::config::settings::AnySetting] = &[$(&$name),*];

        $(#[$config_meta])*
        pub struct Config {
            $($(
                #[doc = concat!($doc, ".")]
                #[doc = ""]
                #[doc = concat!("Variable: `", $var, "`.")]
                pub $field: $t,
            )?)*
            $($(#[$derived_meta])* $derived_vis $derived: $derived_t,)*
        }

        /// The value of each setting that has a [`Config`] field, read in one pass (code, else
        /// the environment, else the default; origins recorded).
        pub(super) struct Plain {
            $($(pub(super) $field: $t,)?)*
        }

        impl Plain {
            pub(super) fn read(
                src: &mut $crate::config::Sources<'_>,
            ) -> Result<Plain, $crate::config::ConfigError> {
                Ok(Plain {
                    $($($field: src.value(&$name)?,)?)*
                })
            }
        }

        /// The fields of [`Config`] that `resolve_with` derives from several settings.
        pub(super) struct Derived {
            $($(#[$derived_meta])* pub(super) $derived: $derived_t,)*
        }

        impl Config {
            /// The configuration of the plain values and the derived fields.
            pub(super) fn assemble(plain: Plain, derived: Derived) -> Config {
                Config {
                    $($($field: plain.$field,)?)*
                    $($derived: derived.$derived,)*
                }
            }
        }

        impl $crate::ProfilerBuilder {
            $($(
                $(#[$setter_meta])*
                pub fn $setter(self, $($arg: $arg_t),*) -> Self {
                    self.with(&$name, $value)
                }
            )*)*
        }
    };

    ($(#[$config_meta:meta])* pub struct Config { $($derived:tt)* } $($declarations:tt)*) => {
        $crate::config::settings::settings!(@munch {
            $(#[$config_meta])* pub struct Config { $($derived)* }
        } [] $($declarations)*);
    };
}
pub(crate) use settings;
