//! The host clock: a raw reading of the host source at the boundary, converted on the worker.

use super::timeline::{HostReader, host_to_ns};
use super::{Clock, Resolved, Token};

/// Reads the host clock at each boundary; never synchronizes anything.
///
/// Right for CPU work, for host-side enqueue times, and for engines that already synchronize
/// where they need to. The token is a raw reading of the host source ([`super::host_source`]):
/// TSC ticks (one `rdtsc`) where the CPU has an invariant TSC, else `Instant::now()` nanoseconds;
/// the worker converts it to the [`super::now_ns`] timeline. Measured: [`crate::benchmarks`].
#[derive(Clone, Copy, Debug, Default)]
pub struct HostClock;

impl Clock for HostClock {
    #[inline]
    fn mark(&self) -> Option<Token> {
        Some(Token(HostReader::new().read()))
    }

    #[inline]
    fn resolve(&self, token: Token) -> Resolved {
        Resolved::At(host_to_ns(token.0))
    }

    fn timing(&self) -> crate::config::Timing {
        crate::config::Timing::Host
    }
}

/// Whether `clock` is the host clock, whose raw readings the recorder takes itself and the worker
/// converts without asking the clock.
/// Only [`HostClock`] itself: another clock that reports [`crate::config::Timing::Host`] is
/// asked for every token.
pub(crate) fn is_host(clock: &dyn Clock) -> bool {
    (clock as &dyn std::any::Any).is::<HostClock>()
}
