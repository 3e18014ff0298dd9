//! [`DirectLimiter`]: one unkeyed cell.

use crate::algo::Algorithm;
use crate::cell::StateCell;
use crate::clock::{Clock, QuantaClock};
use crate::decision::Decision;
use crate::error::{check_cost, CostError};
use crate::limiter::{Cas, Variant};
use crate::stats::{CasStats, Stats};
use crossbeam_utils::CachePadded;
use std::fmt;

/// An unkeyed limiter: one cache-padded cell shared by every caller (a global limit).
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, DirectLimiter, ManualClock};
///
/// let global = DirectLimiter::<_, _>::with_clock("100/s burst 2".parse::<Gcra>()?, ManualClock::new());
/// assert!(global.check().is_allowed());
/// assert!(global.check().is_allowed());
/// assert!(global.check().is_denied());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub struct DirectLimiter<A: Algorithm, C = QuantaClock, V: Variant<A> = Cas> {
    // Padded: the one word every thread hammers must not share a line with the config.
    cell: CachePadded<V::Cell>,
    algo: A,
    clock: C,
    stats: Stats,
}

impl<A: Algorithm, V: Variant<A>> DirectLimiter<A, QuantaClock, V> {
    /// A direct limiter running `algo` on the default clock.
    pub fn new(algo: A) -> Self {
        Self::with_clock(algo, QuantaClock::new())
    }
}

impl<A: Algorithm, C: Clock, V: Variant<A>> DirectLimiter<A, C, V> {
    /// A direct limiter running `algo` on `clock`.
    pub fn with_clock(algo: A, clock: C) -> Self {
        Self {
            cell: CachePadded::new(V::Cell::new(algo.fresh())),
            algo,
            clock,
            stats: Stats::default(),
        }
    }

    /// Decides a request of cost 1.
    #[inline]
    pub fn check(&self) -> Decision {
        self.decide(1)
    }

    /// Decides a request of `cost`; errors if it is 0 or can never be admitted.
    #[inline]
    pub fn check_n(&self, cost: u64) -> Result<Decision, CostError> {
        check_cost(cost, self.algo.capacity())?;
        Ok(self.decide(cost))
    }

    #[inline]
    fn decide(&self, cost: u64) -> Decision {
        let now = self.clock.now();
        // The one cell is never swept, so it is never dead; were it ever, the request would
        // be decided as a fresh key's (what the sweeper guarantees a dead cell was).
        self.cell
            .update(&self.stats, |state| self.algo.update(state, now, cost))
            .unwrap_or_else(|| self.algo.update(&mut self.algo.fresh(), now, cost))
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.algo
    }

    /// CAS retries so far.
    pub fn cas_stats(&self) -> CasStats {
        self.stats.snapshot()
    }
}

impl<A: Algorithm + fmt::Debug, C: fmt::Debug, V: Variant<A>> fmt::Debug
    for DirectLimiter<A, C, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectLimiter")
            .field("algo", &self.algo)
            .field("clock", &self.clock)
            .field("cell", &*self.cell)
            .finish()
    }
}
