//! Configuration: defaults, then the environment, then code. One parse, one error type.
//!
//! ```text
//! settings::SETTINGS (each setting once: variable, accepted values, default, parser, doc)
//!   defaults ──> environment (PHASETRACE_*, OTEL_*, fallbacks, legacy aliases)
//!            ──> code (builder setters, CLI flags) ──> Config (+ where each value came from)
//! ```
//!
//! Every invalid value is a [`ConfigError`] naming the variable, the value and what is accepted.
//! Header values are secrets: they never appear in errors, `Debug` output or `check`.
//! [`settings`] says how to add a setting: one declaration in `config/table.rs`.
//!
//! The files of `config/`, in the order of the flow: `config/values.rs` (what settings
//! accept), `config/settings.rs` and `config/table.rs` (each setting declared once),
//! `config/sources.rs` (where a value comes from: code, then the environment, with its origin),
//! `config/resolve.rs` (code, then the environment, then defaults, into a [`Config`]),
//! `config/otlp.rs` (the OTLP connections it combines), `config/error.rs` (what it reports),
//! `config/transport.rs` (an OTLP connection as the transport reads it).

mod error;
mod otlp;
mod resolve;
#[cfg(test)]
mod secret_tests;
pub mod settings;
mod sources;
mod table;
#[cfg(test)]
mod tests;
#[cfg(feature = "transport")]
mod transport;
mod values;

pub(crate) use error::echoed;
pub use error::{ConfigError, Origin, redact_credentials};
pub use otlp::{OtlpConfig, masked_headers};
pub(crate) use otlp::{SignalGiven, parse_endpoint, parse_kv_list};
pub(crate) use resolve::ConfigBuilder;
use sources::Sources;
pub use table::Config;
pub use values::{
    Compression, Expected, Exporter, ExporterSet, HistogramAggregation, HostSourceChoice,
    LayerRanks, Listen, Protocol, SectionLevel, Signal, SpecLevel, Timing, TraceSlowerThan,
};
