//! The monotonic host clock: the token is the time.

use super::{Clock, Resolved, Token, now_ns};

/// Reads the monotonic host clock at each boundary; never synchronizes anything.
///
/// Right for CPU work, for host-side enqueue times, and for engines that already synchronize
/// where they need to. Costs one `Instant::now()`.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostClock;

impl Clock for HostClock {
    #[inline]
    fn mark(&self) -> Option<Token> {
        Some(Token(now_ns()))
    }

    #[inline]
    fn resolve(&self, token: Token) -> Resolved {
        Resolved::At(token.0)
    }

    fn timing(&self) -> crate::config::Timing {
        crate::config::Timing::Host
    }
}
