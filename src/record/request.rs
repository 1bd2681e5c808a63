//! Requests under continuous batching: what an engine tells phasetrace about the requests it
//! serves, and the registry of their kinds (model, operation, provider).
//!
//! ```text
//! Profiler::request_kind(RequestKind) ──> RequestClass (a u16, registered once, cold)
//! Recorder::request_begin(id, class) ── two marks (id, begin at a host time)
//! Recorder::request_sequence(seq, id) ── two marks: seq is served as request id (n > 1)
//! Recorder::serve(id, tokens, outputs) ── one mark, no clock: the request is in this step
//!   (serve_speculative_outputs: drafted, accepted and the engine's output tokens)
//! Recorder::request_end(id, Finish) ── two marks (id, end at a host time)
//!                                       └──> worker/requests.rs: the open requests, their
//!                                            histograms, spans and links
//! ```
//!
//! The hot path keeps no per-request state: a request is the engine's id (a `u64`) in a mark,
//! and the worker keeps the open requests.

use std::sync::{Arc, RwLock};

/// What kind of request: the GenAI attributes of its metrics and span. Registered once per
/// (model, operation) with [`crate::Profiler::request_kind`], which gives the
/// [`RequestClass`] the hot path records.
///
/// ```
/// let kind = phasetrace::RequestKind::new("my-engine", "text_completion", "llama-3-8b")
///     .response_model("llama-3-8b-instruct-q8");
/// # drop(kind);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestKind {
    pub(crate) provider: String,
    pub(crate) operation: String,
    pub(crate) model: String,
    pub(crate) response_model: Option<String>,
    pub(crate) internal: bool,
}

impl RequestKind {
    /// `provider` (`gen_ai.provider.name`: the engine, or whoever serves it), `operation`
    /// (`gen_ai.operation.name`: `chat`, `text_completion`, `generate_content`, ...) and
    /// `model` (`gen_ai.request.model`).
    pub fn new(
        provider: impl Into<String>,
        operation: impl Into<String>,
        model: impl Into<String>,
    ) -> RequestKind {
        RequestKind {
            provider: provider.into(),
            operation: operation.into(),
            model: model.into(),
            response_model: None,
            internal: false,
        }
    }

    /// Requests of this kind are the engine's own (a warm-up request at start, health
    /// checks): their steps are timed as any step, but they are left out of every request
    /// figure (the `gen_ai.server.*` and `phasetrace.request.*` histograms, the waiting and
    /// running gauges, request spans, the step's batch and links, the summary's request line)
    /// and counted in [`crate::Stats::internal_requests`] instead.
    ///
    /// ```
    /// let warm_up = phasetrace::RequestKind::new("my-engine", "text_completion", "llama-3-8b")
    ///     .internal();
    /// # drop(warm_up);
    /// ```
    pub fn internal(mut self) -> RequestKind {
        self.internal = true;
        self
    }

    /// The model that serves these requests (`gen_ai.response.model`). Default: the requested
    /// model.
    pub fn response_model(mut self, model: impl Into<String>) -> RequestKind {
        self.response_model = Some(model.into());
        self
    }

    pub(crate) fn response(&self) -> &str {
        self.response_model.as_deref().unwrap_or(&self.model)
    }
}

/// A registered [`RequestKind`], for [`crate::Recorder::request_begin`]. `Copy`; from
/// [`crate::Profiler::request_kind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestClass(pub(crate) u16);

/// How a request ended ([`crate::Recorder::request_end`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finish {
    /// It reached a stop token or sequence (`gen_ai.response.finish_reasons` `stop`).
    Stop,
    /// It reached its maximum output length (`length`).
    Length,
    /// The client went away or the engine cancelled it (`cancelled`; `error.type`
    /// `cancelled`).
    Cancelled,
    /// It failed (`error`; `error.type` is the [`ErrorType`]).
    Error(ErrorType),
}

impl Finish {
    /// The finish reason, as `gen_ai.response.finish_reasons` holds it.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Cancelled => "cancelled",
            Finish::Error(_) => "error",
        }
    }

    /// The `error.type` of a request that did not succeed.
    pub fn error_type(self) -> Option<&'static str> {
        match self {
            Finish::Stop | Finish::Length => None,
            Finish::Cancelled => Some("cancelled"),
            Finish::Error(e) => Some(e.as_str()),
        }
    }

    pub(crate) fn code(self) -> (u32, u16) {
        match self {
            Finish::Stop => (0, 0),
            Finish::Length => (1, 0),
            Finish::Cancelled => (2, 0),
            Finish::Error(e) => (3, e.0),
        }
    }

    pub(crate) fn from_code(code: u32, error: u16) -> Option<Finish> {
        Some(match code {
            0 => Finish::Stop,
            1 => Finish::Length,
            2 => Finish::Cancelled,
            3 => Finish::Error(ErrorType(error)),
            _ => return None,
        })
    }
}

/// Why a request failed: the `error.type` attribute, a low-cardinality name (`timeout`,
/// `out_of_memory`, an exception's type). Registered once, process-wide; the hot path carries
/// its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ErrorType(u16);

/// Error types registered so far (`_OTHER`, the conventions' fallback, is id 0).
static ERROR_TYPES: RwLock<Vec<&'static str>> = RwLock::new(Vec::new());

/// The most error types: further names read as `_OTHER`.
const ERROR_TYPES_MAX: usize = 256;

impl ErrorType {
    /// The conventions' fallback, `_OTHER`.
    pub const OTHER: ErrorType = ErrorType(0);

    /// The error type named `name` (registered on first use; the same name gives the same
    /// type). Takes a lock: call it once per name (a `static`/`OnceLock`), not per request.
    /// Beyond 256 names, [`ErrorType::OTHER`].
    pub fn new(name: &str) -> ErrorType {
        let mut types = ERROR_TYPES.write().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = types.iter().position(|t| *t == name) {
            return ErrorType(i as u16 + 1);
        }
        if types.len() >= ERROR_TYPES_MAX || name.is_empty() || name == "_OTHER" {
            return ErrorType::OTHER;
        }
        types.push(Box::leak(name.to_owned().into_boxed_str()));
        ErrorType(types.len() as u16)
    }

    /// The name.
    pub fn as_str(self) -> &'static str {
        if self.0 == 0 {
            return "_OTHER";
        }
        let types = ERROR_TYPES.read().unwrap_or_else(|p| p.into_inner());
        types
            .get(usize::from(self.0) - 1)
            .copied()
            .unwrap_or("_OTHER")
    }
}

/// The most request kinds one profiler registers.
pub(crate) const KINDS_MAX: usize = 4096;

/// The request kinds of one profiler, read by the worker at a request's end.
#[derive(Default)]
pub(crate) struct Kinds(RwLock<Vec<Arc<RequestKind>>>);

impl std::fmt::Debug for Kinds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Kinds")
            .field(&self.0.read().map(|k| k.len()))
            .finish()
    }
}

impl Kinds {
    /// The class of `kind`, registered on first use; `None` beyond [`KINDS_MAX`].
    pub(crate) fn register(&self, kind: RequestKind) -> Option<RequestClass> {
        let mut k = self.0.write().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = k.iter().position(|x| **x == kind) {
            return Some(RequestClass(i as u16));
        }
        if k.len() >= KINDS_MAX {
            return None;
        }
        k.push(Arc::new(kind));
        Some(RequestClass(k.len() as u16 - 1))
    }

    pub(crate) fn get(&self, class: u16) -> Option<Arc<RequestKind>> {
        let k = self.0.read().unwrap_or_else(|p| p.into_inner());
        k.get(usize::from(class)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_types_and_finishes_read_back_what_they_were_given() {
        let t = ErrorType::new("timeout");
        assert_eq!(ErrorType::new("timeout"), t);
        assert_eq!(t.as_str(), "timeout");
        assert_eq!(ErrorType::new("_OTHER"), ErrorType::OTHER);
        for f in [
            Finish::Stop,
            Finish::Length,
            Finish::Cancelled,
            Finish::Error(t),
        ] {
            let (c, e) = f.code();
            assert_eq!(Finish::from_code(c, e), Some(f));
        }
        assert_eq!(Finish::Error(t).error_type(), Some("timeout"));
        assert_eq!(Finish::Stop.error_type(), None);
        let kinds = Kinds::default();
        let a = kinds.register(RequestKind::new("p", "chat", "m")).unwrap();
        let b = kinds.register(RequestKind::new("p", "chat", "m2")).unwrap();
        assert_ne!(a, b);
        assert_eq!(kinds.register(RequestKind::new("p", "chat", "m")), Some(a));
        assert_eq!(kinds.get(b.0).unwrap().model, "m2");
    }
}
