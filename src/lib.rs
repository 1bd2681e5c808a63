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
//!   -> push Mark (bounded lane)    spans for sampled steps/rounds     console summary
//! ```
//!
//! The hot path stores marks, not durations: a 24-byte record per boundary into a per-thread
//! bounded single-producer ring. Off, each call is one relaxed atomic load (a section: 2.3 ns).
//! On, it is a clock mark and a push: with the host clock a raw TSC read at each boundary,
//! converted on the worker (a section begin+end: 52 ns, 0.23x the reference profiler's enabled
//! path in the same run); a full ring drops and counts. Figures and commands are in
//! `BENCHMARKS.md`.
//!
//! ## Integrating
//!
//! ```
//! use phasetrace::{Level, Phase, Profiler, Section, Site};
//!
//! // From the environment (PHASETRACE_LEVEL, OTEL_EXPORTER_OTLP_ENDPOINT, ...); code wins.
//! let profiler = Profiler::builder()
//!     .with_level(Level::Full)
//!     .with_prometheus(None)
//!     .build()?;
//! let rec = profiler.recorder(); // one per engine thread
//!
//! let _step = rec.step(); // one decoded token
//! {
//!     let _s = rec.section(Section::KDA_MIXER, 12u32, Site::ATTN);
//!     let _inner = rec.section(Section::KDA_RECUR, 12u32, Site::ATTN); // nests
//! }
//! {
//!     let _probe = rec.section(Section::REDUCE_ATTN_BAR, 12u32, Site::ATTN); // arrival wait
//! }
//! let _enq = rec.host_section(Section::REDUCE_ATTN_ENQ, 12u32, Site::ATTN); // never syncs
//! rec.moe_route(12u32, &[3, 17, 42, 101]);
//! # drop(_enq); drop(_step);
//!
//! // Speculative decoding: mark each phase as it ends, then the accepted count.
//! let round = rec.round(4);
//! round.phase(Phase::Draft);
//! {
//!     let _kda = rec.verify_part(round.as_ref(), phasetrace::VerifyPart::Kda); // level 2
//! }
//! round.phase(Phase::Verify);
//! round.phase(Phase::Accept);
//! round.end(3);
//!
//! profiler.shutdown(); // flushes everything, bounded by a timeout
//! # Ok::<(), phasetrace::Error>(())
//! ```
//!
//! The `phasetrace demo` command (`cli/src/demo.rs`, in the `phasetrace-cli` package) is a complete multi-rank
//! integration example.

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

pub mod config;
mod export;
#[cfg(feature = "import")]
pub mod import;
pub mod names;
mod profiler;
mod record;
pub mod timing;
pub mod vocab;
mod worker;

pub use config::{Config, ConfigError, Level, Origin, Protocol, SpecLevel, Timing};
pub use export::ExportError;
pub use profiler::{Error, Profiler, ProfilerBuilder};
pub use record::{
    PartGuard, Recorder, RecorderOptions, RoundGuard, RoundRef, SectionGuard, StepGuard,
};
pub use vocab::{Layer, Phase, Section, SectionKind, Site, VerifyPart, VocabError};
pub use worker::Stats;
