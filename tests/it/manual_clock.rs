//! A clock the tests move by hand (not a test of its own): every mark reads the time last set,
//! so durations are exact.

use phasetrace::timing::{Clock, Resolved, Token};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub(crate) struct Manual(AtomicU64);

impl Manual {
    pub(crate) fn set(&self, ns: u64) {
        self.0.store(ns, Ordering::Relaxed);
    }
}

impl Clock for Manual {
    fn mark(&self) -> Option<Token> {
        Some(Token(self.0.load(Ordering::Relaxed)))
    }
    fn resolve(&self, t: Token) -> Resolved {
        Resolved::At(t.0)
    }
    fn timing(&self) -> phasetrace::Timing {
        phasetrace::Timing::Host
    }
}
