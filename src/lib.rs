//! # phasetrace
//!
//! Turns the timing instrumentation of GPU inference engines (per-section decode timers,
//! speculative-decoding phase splits, collective rendezvous probes) into OpenTelemetry: histogram
//! metrics, spans for sampled steps, OTLP (gRPC and HTTP), a Prometheus endpoint and a console
//! summary.
//!
//! ```text
//! engine thread (hot path)        background worker                  exporters
//! Recorder::section/step/round    drain lanes, resolve clock tokens  OTLP gRPC / HTTP
//!   -> Clock::mark                 pair begin/end, aggregate          Prometheus /metrics
//!   -> push Mark (bounded lane)    spans for sampled or slow steps    console summary
//! ```
//!
//! The hot path stores marks, not durations: a 24-byte record per boundary into a per-thread
//! bounded single-producer ring. Off, each call is one relaxed atomic load. On, it is a clock
//! mark and a push, never a lock or a wait (with the host clock a raw TSC read, converted on the
//! worker); a full ring drops and counts. The measured costs,
//! with their commands and machine, are in [`benchmarks`] (`BENCHMARKS.md`).
//!
//! ## Integrating
//!
//! `examples/minimal.rs`, which is also the README's snippet (a test runs it and scrapes what it
//! serves). Both levels are off by default; the other programs in `examples/` show ranks as
//! threads, speculative decoding, the `tracing` parent and a cudarc stream, and the
//! `phasetrace demo` command (`cli/src/demo.rs`, in the `phasetrace-cli` package) is a complete
//! multi-rank integration.
//!
#![doc = concat!("```no_run\n", include_str!("../examples/minimal.rs"), "```")]
//!
//! Settings: [`config::settings`] defines each one once (variable, values, default, parser).

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

/// The measured costs (`BENCHMARKS.md`, the one home of machine-specific figures: doc comments
/// state what a call does and link here). Documentation only.
#[doc = include_str!("../BENCHMARKS.md")]
pub mod benchmarks {}
pub mod config;
mod diag;
mod export;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
#[allow(missing_docs)]
pub mod fuzzing;
pub mod names;
mod profiler;
mod provider;
mod record;
pub mod timing;
pub mod vocab;
mod worker;

pub use config::{
    Config, ConfigError, HostSourceChoice, LayerRanks, Origin, Protocol, SectionLevel, SpecLevel,
    Timing, TraceSlowerThan,
};
/// The former name of [`SectionLevel`]; it collided with `tracing::Level`.
#[deprecated(note = "renamed SectionLevel (it collided with tracing::Level)")]
pub type Level = SectionLevel;
pub use export::ExportError;
#[cfg(feature = "prometheus")]
pub use export::WebConfigError;
pub use export::view;
pub use names::DropReason;
pub use profiler::{Error, Profiler, ProfilerBuilder};
pub use provider::{EngineMeterProvider, EngineTracerProvider};
pub use record::current;
pub use record::{
    CapturedGraph, ErrorType, Finish, GraphCapture, PartGuard, Recorder, RecorderOptions,
    ReplayGuard, RequestClass, RequestKind, RoundGuard, RoundRef, SectionGuard, StepGuard,
};
pub use vocab::{Layer, Phase, Section, SectionKind, Site, StepKind, VerifyPart, VocabError};
pub use worker::sinks::metrics::experts::{ExpertLoad, LayerLoad};
pub use worker::{Dropped, Stats};
