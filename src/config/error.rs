//! What the resolution reports: [`ConfigError`] (the one error type), [`Origin`] (where a
//! resolved value came from, as `phasetrace check` prints it), and how an error or a warning
//! echoes a value without its secrets ([`redact_credentials`], `echoed`).

use thiserror::Error;

/// Where a resolved setting came from, as `phasetrace check` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default.
    Default,
    /// An environment variable (or a fallback or legacy alias of one).
    Env,
    /// A builder setter (or a CLI flag).
    Code,
}

impl Origin {
    /// `default`, `env` or `code`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Origin::Default => "default",
            Origin::Env => "env",
            Origin::Code => "code",
        }
    }
}

/// A configuration error: names the input, the value (masked when secret) and what is accepted.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value that does not parse.
    #[error("{var}={value:?}: expected {expected}")]
    Invalid {
        /// The variable (or setter) name.
        var: String,
        /// The value given (masked for secrets).
        value: String,
        /// What is accepted.
        expected: String,
    },
    /// A value that is not valid UTF-8.
    #[error("{var} is not valid UTF-8: expected {expected}")]
    NotUnicode {
        /// The variable.
        var: String,
        /// What is accepted.
        expected: String,
    },
    /// Settings that contradict each other.
    #[error("{0}")]
    Conflict(String),
}

pub(super) fn invalid(var: &str, value: &str, expected: &str) -> ConfigError {
    ConfigError::Invalid {
        var: var.to_owned(),
        value: value.to_owned(),
        expected: expected.to_owned(),
    }
}

/// `text` as an error, a warning or `check` may echo it: credentials in a URL
/// (`scheme://user:password@host`) masked as `user:****@`, a user alone as `****@`. Applied
/// to every value echoed that is not a secret already (secrets are not echoed at all).
pub fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out += head;
        let end = tail.find(['/', '?', '#']).unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.split_once(':') {
                    Some((user, _)) => {
                        out += user;
                        out += ":****";
                    }
                    None => out += "****",
                }
                out += &authority[at..];
            }
            None => out += authority,
        }
        rest = &tail[end..];
    }
    out += rest;
    out
}

/// A value as an error or a warning echoes it: `<masked>` for a secret setting, otherwise
/// with the credentials of a URL masked ([`redact_credentials`]).
pub(crate) fn echoed(secret: bool, text: &str) -> String {
    if secret {
        "<masked>".to_owned()
    } else {
        redact_credentials(text)
    }
}
