//! [`DirectLimiter`]: one unkeyed cell.

use crate::algo::Algorithm;
use crate::cell::StateCell;
use crate::clock::{Clock, QuantaClock};
use crate::decision::Decision;
use crate::error::{check_cost, ConfigError, CostError};
use crate::limiter::{Cas, Variant};
use crate::live::{update_fitted, Live, Reconfigure};
use crate::stats::{CasStats, Metrics, Stats};
use crate::sweeper::SweepTotals;
use crate::wait::{self, Jitter};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::future::Future;
use std::time::Duration;

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
    counting: bool,
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
            counting: false,
        }
    }

    /// Counts allowed and denied decisions for [`metrics`](DirectLimiter::metrics) (off by
    /// default: a `fetch_add` on a per-thread stripe per request).
    pub fn with_metrics(mut self) -> Self {
        self.counting = true;
        self
    }

    /// A snapshot of the counters (no keys or sweeps here: `keys` is 1).
    pub fn metrics(&self) -> Metrics {
        Metrics::new(&self.stats, SweepTotals::default(), 1)
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

    /// The decision [`check`](DirectLimiter::check) would return now, without counting it.
    #[inline]
    pub fn peek(&self) -> Decision {
        self.peek_at(1)
    }

    /// The decision [`check_n`](DirectLimiter::check_n) would return now, without counting
    /// it.
    #[inline]
    pub fn peek_n(&self, cost: u64) -> Result<Decision, CostError> {
        check_cost(cost, self.algo.capacity())?;
        Ok(self.peek_at(cost))
    }

    /// Waits until a request of `cost` is allowed and returns that decision; see
    /// [`KeyedLimiter::until_ready_with`](crate::KeyedLimiter::until_ready_with).
    pub async fn until_ready<F, Fut>(
        &self,
        cost: u64,
        jitter: Jitter,
        sleep: F,
    ) -> Result<Decision, CostError>
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (peek, check) = (|| self.peek_n(cost), || self.decide(cost));
        wait::until_ready(peek, check, || self.clock.now(), jitter, sleep).await
    }

    /// [`until_ready`](DirectLimiter::until_ready) on the calling thread, sleeping with the
    /// limiter's clock; see
    /// [`KeyedLimiter::until_ready_blocking`](crate::KeyedLimiter::until_ready_blocking).
    pub fn until_ready_blocking(&self, cost: u64, jitter: Jitter) -> Result<Decision, CostError> {
        let (peek, check) = (|| self.peek_n(cost), || self.decide(cost));
        let sleep = |d| self.clock.sleep(d);
        wait::until_ready_blocking(peek, check, || self.clock.now(), jitter, sleep)
    }

    fn peek_at(&self, cost: u64) -> Decision {
        let now = self.clock.now();
        self.cell
            .inspect(|state| self.algo.peek(state, now, cost))
            .unwrap_or_else(|| self.algo.peek(&self.algo.fresh(), now, cost))
    }

    #[inline]
    fn decide(&self, cost: u64) -> Decision {
        let now = self.clock.now();
        // The one cell is never swept, so it is never dead; were it ever, the request would
        // be decided as a fresh key's (what the sweeper guarantees a dead cell was).
        let step = |state: &mut A::State| self.algo.update(state, now, cost);
        let decision = update_fitted(&self.algo, &self.clock, &*self.cell, &self.stats, step)
            .unwrap_or_else(|| self.algo.update(&mut self.algo.fresh(), now, cost));
        if self.counting {
            self.stats.decided(decision.is_allowed());
        }
        decision
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

impl<A: Reconfigure, C: Clock, V: Variant<Live<A>>> DirectLimiter<Live<A>, C, V> {
    /// Switches to the configuration `new`, keeping the state (fitted to the new quota); see
    /// [`KeyedLimiter::reconfigure`](crate::KeyedLimiter::reconfigure).
    pub fn reconfigure(&self, new: A) -> Result<A, ConfigError> {
        self.algo.switch(new, |new| {
            let now = self.clock.now();
            self.cell.rewrite(|state| new.fit(state, now));
        })
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
