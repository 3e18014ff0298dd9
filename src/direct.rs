//! [`DirectLimiter`]: one cell shared by every caller (a global limit).

use crate::algo::{Algorithm, Gcra, Reconfigure, Reservation};
use crate::cell::StateCell;
use crate::clock::{Clock, QuantaClock};
use crate::decision::{Decision, Ticket};
use crate::error::TicketError;
use crate::error::{ConfigError, CostError, QuotaError};
use crate::limiter::{Cas, Variant};
use crate::live::Live;
use crate::shared::{Builder, Core, KeyState, Options};
use crate::stats::Metrics;
use crate::wait::{self, Jitter};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// An unkeyed limiter: one cache-padded cell shared by every caller (a global limit). It
/// offers what the keyed limiters offer, without the key.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, DirectLimiter, ManualClock};
///
/// let global = DirectLimiter::<Gcra>::with_clock("100/s burst 2".parse()?, ManualClock::new());
/// assert!(global.check().is_allowed());
/// assert!(global.check().is_allowed());
/// assert!(global.check().is_denied());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub struct DirectLimiter<A: Algorithm, C = QuantaClock, V: Variant<A> = Cas> {
    // Padded: the one word every thread hammers must not share a line with the config.
    cell: CachePadded<V::Cell>,
    core: Core<A, C>,
}

impl<A: Algorithm, V: Variant<A>> DirectLimiter<A, QuantaClock, V> {
    /// A direct limiter running `algo` on the default clock.
    pub fn new(algo: A) -> Self {
        Self::with_clock(algo, QuantaClock::new())
    }

    /// A direct limiter running `algo` on `clock`.
    pub fn with_clock<C: Clock>(algo: A, clock: C) -> DirectLimiter<A, C, V> {
        DirectLimiter::from_parts(algo, clock, &Options::default())
    }

    /// A builder for a limiter running `algo`: [`clock`](Builder::clock) and
    /// [`metrics`](Builder::metrics).
    pub fn builder(algo: A) -> Builder<Self, A> {
        Builder::new(algo)
    }
}

impl<A: Algorithm, C: Clock, V: Variant<A>> Builder<DirectLimiter<A, QuantaClock, V>, A, C> {
    /// Builds the limiter.
    pub fn build(self) -> DirectLimiter<A, C, V> {
        DirectLimiter::from_parts(self.algo, self.clock, &self.options)
    }
}

impl<A: Algorithm, C: Clock, V: Variant<A>> DirectLimiter<A, C, V> {
    fn from_parts(algo: A, clock: C, options: &Options) -> Self {
        Self {
            cell: CachePadded::new(V::Cell::new(algo.fresh())),
            core: Core::new(algo, clock, options),
        }
    }

    /// Decides a request of cost 1.
    #[inline]
    pub fn check(&self) -> Decision {
        self.decide(1)
    }

    /// Decides a request of `cost`; errors (and counts nothing) if it is 0 or can never be
    /// admitted.
    #[inline]
    pub fn check_n(&self, cost: u64) -> Result<Decision, CostError> {
        self.core.cost(cost)?;
        Ok(self.decide(cost))
    }

    /// The decision [`check`](DirectLimiter::check) would return now, without counting it.
    #[inline]
    pub fn peek(&self) -> Decision {
        self.peek_at(1)
    }

    /// The decision [`check_n`](DirectLimiter::check_n) would return now, without counting
    /// it; errors as `check_n` does.
    #[inline]
    pub fn peek_n(&self, cost: u64) -> Result<Decision, CostError> {
        self.core.cost(cost)?;
        Ok(self.peek_at(cost))
    }

    /// Waits until a request of cost 1 is allowed and returns that decision (counted);
    /// `sleep` is the runtime's timer. See
    /// [`KeyedLimiter::until_ready`](crate::KeyedLimiter::until_ready).
    pub async fn until_ready<F, Fut>(&self, sleep: F) -> Decision
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = ()>,
    {
        let peek = || Ok(self.peek_at(1));
        let check = || self.decide(1);
        wait::infallible(
            self.core
                .until_ready(Jitter::NONE, peek, check, sleep)
                .await,
        )
    }

    /// [`until_ready`](DirectLimiter::until_ready) for a request of `cost`, adding `jitter`
    /// to each wait; errors if the cost can never be admitted.
    pub async fn until_ready_with<F, Fut>(
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
        self.core.until_ready(jitter, peek, check, sleep).await
    }

    /// [`until_ready`](DirectLimiter::until_ready) on the calling thread, sleeping with the
    /// limiter's clock.
    pub fn until_ready_blocking(&self) -> Decision {
        let (peek, check) = (|| Ok(self.peek_at(1)), || self.decide(1));
        wait::infallible(self.core.until_ready_blocking(Jitter::NONE, peek, check))
    }

    /// [`until_ready_blocking`](DirectLimiter::until_ready_blocking) for a request of `cost`,
    /// adding `jitter` to each wait; errors if the cost can never be admitted.
    pub fn until_ready_blocking_with(
        &self,
        cost: u64,
        jitter: Jitter,
    ) -> Result<Decision, CostError> {
        let (peek, check) = (|| self.peek_n(cost), || self.decide(cost));
        self.core.until_ready_blocking(jitter, peek, check)
    }

    fn peek_at(&self, cost: u64) -> Decision {
        let core = &self.core;
        let now = core.clock.now();
        self.cell
            .inspect(|state| core.algo.peek(state, now, cost))
            .unwrap_or_else(|| core.peek_fresh(now, cost))
    }

    #[inline]
    fn decide(&self, cost: u64) -> Decision {
        let core = &self.core;
        let now = core.clock.now();
        // The one cell is never swept, so it is never dead; were it ever, the request would
        // be decided as a fresh key's (what the sweeper guarantees a dead cell was).
        let decision = core
            .update(&*self.cell, |state| core.algo.update(state, now, cost))
            .unwrap_or_else(|| core.algo.update(&mut core.algo.fresh(), now, cost));
        core.count(decision)
    }

    /// A partial grant: admits the most units available now, up to `n`, and says how many:
    /// `(granted, decision)`, `granted` in `0..=n`. For a batch of messages, a streaming
    /// response, a transfer cut to what the quota allows. `n` above the capacity is capped at
    /// it (no request is ever admitted more at once). With nothing available, `granted` is 0
    /// and the decision is the denial of one unit, with its honest `retry_after` (and counted
    /// as one denied unit under the strict policy). Errors only for `n == 0`.
    /// See [`KeyedLimiter::check_up_to`](crate::KeyedLimiter::check_up_to).
    pub fn check_up_to(&self, n: u64) -> Result<(u64, Decision), CostError> {
        self.core.grant_up_to(n, self)
    }

    /// Takes a provisional cost, to settle once the actual one is known. See
    /// [`KeyedLimiter::take`](crate::KeyedLimiter::take).
    pub fn take(&self, cost: u64) -> Result<Ticket, CostError> {
        self.core.take(&self.core.algo, cost, self)
    }

    /// Settles `ticket` with the actual cost. See
    /// [`KeyedLimiter::settle`](crate::KeyedLimiter::settle).
    pub fn settle(&self, ticket: &mut Ticket, actual: u64) -> Result<bool, TicketError> {
        self.core.settle(&self.core.algo, ticket, actual, self)
    }

    /// A request of cost 1 under a quota that comes with it. See
    /// [`KeyedLimiter::check_with`](crate::KeyedLimiter::check_with).
    pub fn check_with(&self, quota: &A) -> Result<Decision, QuotaError>
    where
        A: Reconfigure,
    {
        self.check_n_with(1, quota)
    }

    /// A request of `cost` under a quota that comes with it. See
    /// [`KeyedLimiter::check_n_with`](crate::KeyedLimiter::check_n_with).
    pub fn check_n_with(&self, cost: u64, quota: &A) -> Result<Decision, QuotaError>
    where
        A: Reconfigure,
    {
        let quota = self.core.quota(quota)?;
        Ok(self.core.charge(quota, cost, self)?.0)
    }

    /// [`take`](DirectLimiter::take) under a quota that comes with the request.
    pub fn take_with(&self, cost: u64, quota: &A) -> Result<Ticket, QuotaError>
    where
        A: Reconfigure,
    {
        let quota = self.core.quota(quota)?;
        Ok(self.core.take(quota, cost, self)?)
    }

    /// [`settle`](DirectLimiter::settle) under the quota the ticket was taken with.
    pub fn settle_with(
        &self,
        ticket: &mut Ticket,
        actual: u64,
        quota: &A,
    ) -> Result<bool, QuotaError>
    where
        A: Reconfigure,
    {
        let quota = self.core.quota(quota)?;
        Ok(self.core.settle(quota, ticket, actual, self)?)
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.core.algo
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.core.clock
    }

    /// A snapshot of the counters: decisions (if [counted](Builder::metrics)), CAS retries
    /// (no keys or sweeps here: `keys` is 1).
    pub fn metrics(&self) -> Metrics {
        self.core.metrics(Default::default(), 1)
    }
}

/// The one cell, for the request paths of the core. It is never swept, so it is never dead;
/// were it ever, `f` would run on a fresh state (what the sweeper guarantees a dead cell was).
impl<A: Algorithm, C: Clock, V: Variant<A>> KeyState<A::State> for &DirectLimiter<A, C, V> {
    #[inline(always)]
    fn apply<T>(&self, mut f: impl FnMut(&mut A::State) -> T) -> T {
        let mut fresh = None;
        self.core
            .update(&*self.cell, &mut f)
            .unwrap_or_else(|| f(fresh.insert(self.core.algo.fresh())))
    }

    fn key_print(&self) -> u64 {
        0
    }
}

impl<C: Clock, V: Variant<Gcra>> DirectLimiter<Gcra, C, V> {
    /// Pacing: admits a request of `cost` now with the delay after which it conforms, if that
    /// delay is at most `max_wait`; otherwise counts nothing. See [`Gcra::reserve`].
    pub fn reserve(&self, cost: u64, max_wait: Duration) -> Result<Reservation, CostError> {
        self.core.reserve(cost, max_wait, self)
    }
}

impl<A: Reconfigure, C: Clock, V: Variant<Live<A>>> DirectLimiter<Live<A>, C, V> {
    /// Switches to the configuration `new`, keeping the state (fitted to the new quota); see
    /// [`KeyedLimiter::reconfigure`](crate::KeyedLimiter::reconfigure).
    pub fn reconfigure(&self, new: A) -> Result<A, ConfigError> {
        self.core.reconfigure(new, |fit| {
            self.cell.rewrite(fit);
        })
    }
}

impl<A: Algorithm + fmt::Debug, C: fmt::Debug, V: Variant<A>> fmt::Debug
    for DirectLimiter<A, C, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectLimiter")
            .field("core", &self.core)
            .field("cell", &*self.cell)
            .finish()
    }
}
