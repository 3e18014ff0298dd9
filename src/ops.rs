//! [`Limiter`]: the one in-memory limiter, generic over the [`Store`] that keeps its keys'
//! states. Every operation is written here, once; a store adds only its table (the papaya
//! map, the compact table, one cell) through the sealed traits below.

use crate::algo::{Algorithm, Gcra, Reconfigure, Reservation};
use crate::clock::{Clock, QuantaClock};
use crate::decision::{Decision, Ticket};
use crate::error::{check_cost, ConfigError, CostError, QuotaError, TicketError};
use crate::live::Live;
use crate::shared::{Builder, KeyedStore, Options};
use crate::stats::Metrics;
use crate::sweeper::{SweepReport, SweepTotals, Sweeper};
use crate::wait::{self, Jitter};
use sealed::Table;
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// The store's side of a limiter: what each store implements. Sealed (private module): a
/// caller names [`Store`] and [`Keys`], never these.
pub(crate) mod sealed {
    use crate::algo::Algorithm;
    use crate::clock::Clock;
    use crate::decision::Decision;
    use crate::error::CostError;
    use crate::shared::{Core, KeyState, Options};
    use crate::sweeper::{SweepReport, SweepTotals, Sweeper};

    /// A store's table with its [`Core`].
    pub trait Table: Send + Sync + Sized + 'static {
        /// The algorithm.
        type Algo: Algorithm;
        /// The clock.
        type Clock: Clock;
        /// The same store on another clock (what a builder's `clock` makes).
        type WithClock<C: Clock>: Table<Algo = Self::Algo, Clock = C>;

        /// The store, and its background sweeper if the options ask for one.
        fn build(
            algo: Self::Algo,
            clock: Self::Clock,
            options: &Options,
        ) -> std::io::Result<(Self, Option<Sweeper>)>;
        /// The core every store shares.
        fn core(&self) -> &Core<Self::Algo, Self::Clock>;
        /// The keys held.
        fn keys(&self) -> usize;
        /// The most keys held, if bounded.
        fn bound(&self) -> Option<usize> {
            self.core().max_keys
        }
        /// Idle and capacity eviction.
        fn sweep(&self) -> SweepReport;
        /// Totals over every sweep.
        fn sweep_totals(&self) -> SweepTotals {
            self.core().sweep_totals()
        }
        /// Rewrites every kept state (a live switch's fit).
        fn rewrite_all(&self, fit: &dyn Fn(&mut <Self::Algo as Algorithm>::State));
    }

    /// A table whose keys are looked up by `&Q`.
    pub trait Lookup<Q: ?Sized>: Table {
        /// `key`'s state, located once, for the core's request paths.
        type At<'a>: KeyState<<Self::Algo as Algorithm>::State>
        where
            Self: 'a,
            Q: 'a;

        /// Locates `key`.
        fn at<'a>(&'a self, key: &'a Q) -> Self::At<'a>;

        /// The hot path: `algo`'s step for a request of `cost` at `now` (not counted).
        fn decide(&self, algo: &Self::Algo, key: &Q, cost: u64, now: u64) -> Decision;

        /// The decision of a request of `cost` at `now`, without counting it or inserting the
        /// key.
        fn peek(&self, key: &Q, cost: u64, now: u64) -> Decision;

        /// Decides `requests` in order at one clock reading (counted); a cost `valid` refuses
        /// is that request's error. By default, one request at a time.
        fn decide_batch<'k>(
            &self,
            requests: impl IntoIterator<Item = (&'k Q, u64)>,
            valid: impl Fn(u64) -> Result<(), CostError>,
            mut emit: impl FnMut(Result<Decision, CostError>),
        ) where
            Q: 'k,
        {
            let core = self.core();
            let now = core.clock.now();
            for (key, cost) in requests {
                emit(valid(cost).map(|()| core.count(self.decide(&core.algo, key, cost, now))));
            }
        }
    }
}

/// Where a [`Limiter`] keeps its keys' states: [`Map`](crate::store::Map) (a `papaya` map,
/// any key), [`Compact`](crate::store::Compact) (a fixed table of fixed-size keys) or
/// [`Single`](crate::store::Single) (one cell, no key). Sealed; named by the limiter's type,
/// rarely in a bound (code generic over limiters takes a [`RateLimiter`](crate::RateLimiter)).
pub trait Store: sealed::Table {}

impl<T: sealed::Table> Store for T {}

/// A [`Store`] whose keys are looked up by `&Q`: a [`Map`](crate::store::Map) of `K` by any
/// `Q` that `K` borrows as (`&str` for `String`), a [`Compact`](crate::store::Compact) table
/// by its key's look-up form, the [`Single`](crate::store::Single) cell by `&()`. Sealed.
pub trait Keys<Q: ?Sized>: Store + sealed::Lookup<Q> {}

impl<Q: ?Sized, T: sealed::Lookup<Q>> Keys<Q> for T {}

/// A rate limiter: an algorithm, a clock and a [`Store`] of per-key states. Every operation
/// is here, the same on every store; the crate root names the usual ones:
/// [`CasLimiter`](crate::CasLimiter), [`MutexLimiter`](crate::MutexLimiter),
/// [`CompactLimiter`](crate::CompactLimiter), [`DirectLimiter`](crate::DirectLimiter).
///
/// **Consistency.** Decisions are linearizable per key: whatever the threads and
/// interleavings, they equal those of some sequential order of the same requests. At one fixed
/// `now`, N threads firing at one key get exactly as many allowed as one thread would.
/// Different keys are independent. Eviction never loses an update (see
/// [`sweep`](Limiter::sweep)).
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = CasLimiter::<String, Gcra>::with_clock("10/s burst 2".parse()?, clock.clone());
/// assert!(limiter.check("alice").is_allowed());
/// assert!(limiter.check("alice").is_allowed());
/// let denied = limiter.check("alice");
/// assert_eq!(denied.retry_after(), Duration::from_millis(100));
/// assert!(limiter.check("bob").is_allowed());
/// clock.advance(Duration::from_millis(100));
/// assert!(limiter.check("alice").is_allowed());
/// assert_eq!(limiter.len(), 2);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub struct Limiter<S: Store> {
    pub(crate) store: S,
    /// Stops and joins the background sweeper (if any) when the limiter is dropped.
    _sweeper: Option<Sweeper>,
}

impl<S: Store<Clock = QuantaClock>> Limiter<S> {
    /// A limiter running `algo` on the default (`quanta`) clock, without background sweeps
    /// (the compact store sized for [`DEFAULT_MAX_KEYS`](crate::store::DEFAULT_MAX_KEYS)).
    pub fn new(algo: S::Algo) -> Self {
        match S::build(algo, QuantaClock::new(), &Options::default()) {
            Ok((store, sweeper)) => Limiter {
                store,
                _sweeper: sweeper,
            },
            Err(_) => out_of_memory(),
        }
    }

    /// A limiter running `algo` on `clock`, without background sweeps.
    pub fn with_clock<C: Clock>(algo: S::Algo, clock: C) -> Limiter<S::WithClock<C>> {
        match Builder::<Self, S::Algo>::new(algo).clock(clock).build() {
            Ok(limiter) => limiter,
            Err(_) => out_of_memory(),
        }
    }

    /// A builder for a limiter running `algo`: clock, metrics, and for the keyed stores a
    /// capacity bound and a background sweeper.
    pub fn builder(algo: S::Algo) -> Builder<Self, S::Algo> {
        Builder::new(algo)
    }
}

/// Without a sweeper to spawn, only a default compact table (a few MB) can fail to build: out
/// of memory, abort as any allocation would.
#[cold]
fn out_of_memory() -> ! {
    std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; 64]>())
}

impl<S: Store<Clock = QuantaClock>, C: Clock> Builder<Limiter<S>, S::Algo, C> {
    /// Builds the limiter, starting the background sweeper if one was asked for.
    ///
    /// Fails only if the sweeper thread cannot be spawned, or a table or debt table sized for
    /// a `max_keys` beyond memory cannot be allocated (`ErrorKind::OutOfMemory`).
    pub fn build(self) -> std::io::Result<Limiter<S::WithClock<C>>> {
        let (store, sweeper) = S::WithClock::<C>::build(self.algo, self.clock, &self.options)?;
        Ok(Limiter {
            store,
            _sweeper: sweeper,
        })
    }
}

impl<S: Store> Limiter<S> {
    /// Decides a request of cost 1 for `key`.
    #[inline]
    pub fn check<Q: ?Sized>(&self, key: &Q) -> Decision
    where
        S: Keys<Q>,
    {
        let core = self.store.core();
        // Clock first: the TSC read is not serializing, so it can overlap the look-up.
        let now = core.clock.now();
        // Cost 1 never exceeds a capacity (capacities are at least 1).
        core.count(self.store.decide(&core.algo, key, 1, now))
    }

    /// Decides a request of `cost` for `key`.
    ///
    /// Errors (and counts nothing) if `cost` is 0 or above the algorithm's capacity, since
    /// such a request could never be allowed.
    #[inline]
    pub fn check_n<Q: ?Sized>(&self, key: &Q, cost: u64) -> Result<Decision, CostError>
    where
        S: Keys<Q>,
    {
        let core = self.store.core();
        core.cost(cost)?;
        let now = core.clock.now();
        Ok(core.count(self.store.decide(&core.algo, key, cost, now)))
    }

    /// The decision [`check`](Limiter::check) would return now, without counting the
    /// request: the key's state is left untouched and an unknown key is not inserted.
    ///
    /// Use it to compute a `Retry-After` across several limits, or for dashboards. Under
    /// concurrency it is a snapshot: another request may change the state right after.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    ///
    /// let limiter = CasLimiter::<String, Gcra>::with_clock("10/s burst 1".parse()?, ManualClock::new());
    /// assert!(limiter.peek("k").is_allowed());
    /// assert!(limiter.peek("k").is_allowed()); // nothing was counted
    /// assert_eq!(limiter.len(), 0);
    /// assert!(limiter.check("k").is_allowed());
    /// assert!(limiter.peek("k").is_denied());
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    #[inline]
    pub fn peek<Q: ?Sized>(&self, key: &Q) -> Decision
    where
        S: Keys<Q>,
    {
        self.store.peek(key, 1, self.store.core().clock.now())
    }

    /// The decision [`check_n`](Limiter::check_n) would return now, without counting it;
    /// errors as `check_n` does.
    #[inline]
    pub fn peek_n<Q: ?Sized>(&self, key: &Q, cost: u64) -> Result<Decision, CostError>
    where
        S: Keys<Q>,
    {
        let core = self.store.core();
        core.cost(cost)?;
        Ok(self.store.peek(key, cost, core.clock.now()))
    }

    /// Decides a batch of requests of cost 1, one per key, in order: `out` is cleared, then
    /// holds one decision per key, each what [`check`](Limiter::check) would have
    /// returned for that key at that point of the sequence (a key twice in a batch is
    /// decided twice, the second time after the first). The batch is decided at one instant
    /// (one clock read).
    ///
    /// Faster than one `check` per key when the keys are many and spread (a proxy or broker
    /// that receives requests in batches, a replay): the keyed stores issue the batch's
    /// look-ups back to back, so the CPU overlaps their cache misses. For one hot key it gains
    /// little.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    ///
    /// let l = CasLimiter::<u64, Gcra>::with_clock("10/s burst 2".parse()?, ManualClock::new());
    /// let mut out = Vec::new();
    /// l.check_batch(&[7, 8, 7, 7], &mut out);
    /// let allowed: Vec<bool> = out.iter().map(|d| d.is_allowed()).collect();
    /// assert_eq!(allowed, [true, true, true, false]); // key 7's burst is 2
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn check_batch<'k, Q: ?Sized + 'k>(
        &self,
        keys: impl IntoIterator<Item = &'k Q>,
        out: &mut Vec<Decision>,
    ) where
        S: Keys<Q>,
    {
        out.clear();
        let requests = keys.into_iter().map(|key| (key, 1));
        // Cost 1 is never refused (capacities are at least 1): every answer is a decision.
        self.store
            .decide_batch(requests, |_| Ok(()), |answer| out.extend(answer.ok()));
    }

    /// Decides a batch of `(key, cost)` requests in order, as one
    /// [`check_n`](Limiter::check_n) each: `out` is cleared, then holds one answer per
    /// request. A refused cost (0, or above the capacity) is that request's error and counts
    /// nothing; the others are decided. See [`check_batch`](Limiter::check_batch).
    pub fn check_n_batch<'k, Q: ?Sized + 'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k Q, u64)>,
        out: &mut Vec<Result<Decision, CostError>>,
    ) where
        S: Keys<Q>,
    {
        out.clear();
        let core = self.store.core();
        self.store
            .decide_batch(requests, |cost| core.cost(cost), |answer| out.push(answer));
    }

    /// Waits until a request of cost 1 for `key` is allowed and returns that decision (the
    /// request is counted): client-side self-limiting. `sleep` is the runtime's timer, e.g.
    /// `tokio::time::sleep`, so this works on any runtime.
    ///
    /// It peeks while it waits and sleeps each honest `retry_after`, so it is never counted as
    /// denied while it waits and returns at the earliest time the limiter allows (plus any
    /// [`Jitter`] of [`until_ready_with`](Limiter::until_ready_with)). Under a strict
    /// policy a peek's `retry_after` also covers the denial it would have counted, so the
    /// wait can be longer than the least one, never shorter. Other callers may take the
    /// budget first; it then waits again. A wait the limiter's clock cannot reach (past
    /// [`CLOCK_MAX`](crate::algo::CLOCK_MAX), where a clock saturates) returns the denial
    /// instead: no sleep would end it.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, Clock, ManualClock};
    /// use std::time::Duration;
    ///
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     struct Noop;
    /// #     impl std::task::Wake for Noop { fn wake(self: std::sync::Arc<Self>) {} }
    /// #     let waker = std::task::Waker::from(std::sync::Arc::new(Noop));
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop {
    /// #         if let std::task::Poll::Ready(out) = f.as_mut().poll(&mut std::task::Context::from_waker(&waker)) {
    /// #             return out;
    /// #         }
    /// #     }
    /// # }
    /// let clock = ManualClock::new();
    /// let limiter = CasLimiter::<u32, Gcra>::with_clock("4/s burst 1".parse()?, clock.clone());
    /// assert!(limiter.check(&1).is_allowed()); // the burst of 1, spent
    /// // With tokio: `limiter.until_ready(&1, tokio::time::sleep).await`.
    /// let fake_sleep = |d| {
    ///     clock.advance(d);
    ///     std::future::ready(())
    /// };
    /// assert!(block_on(limiter.until_ready(&1, fake_sleep)).is_allowed());
    /// assert_eq!(clock.now(), 250_000_000);
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub async fn until_ready<Q: ?Sized, F, Fut>(&self, key: &Q, sleep: F) -> Decision
    where
        S: Keys<Q>,
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (peek, check) = (|| Ok(self.peek(key)), || self.check(key));
        let core = self.store.core();
        wait::infallible(core.until_ready(Jitter::NONE, peek, check, sleep).await)
    }

    /// [`until_ready`](Limiter::until_ready) for a request of `cost`, adding `jitter` to
    /// each wait; errors if the cost can never be admitted (at once, or as soon as a live
    /// reconfiguration makes it so).
    pub async fn until_ready_with<Q: ?Sized, F, Fut>(
        &self,
        key: &Q,
        cost: u64,
        jitter: Jitter,
        sleep: F,
    ) -> Result<Decision, CostError>
    where
        S: Keys<Q>,
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (peek, check) = (|| self.peek_n(key, cost), || self.decide(key, cost));
        let core = self.store.core();
        core.until_ready(jitter, peek, check, sleep).await
    }

    /// [`until_ready`](Limiter::until_ready) on the calling thread, sleeping with the
    /// limiter's clock ([`Clock::sleep`]: a real sleep, or a [`ManualClock`](crate::ManualClock)
    /// moving itself forward).
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, Clock, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = CasLimiter::<u32, Gcra>::with_clock("4/s burst 1".parse()?, clock.clone());
    /// assert!(limiter.check(&1).is_allowed()); // the burst of 1, spent
    /// assert!(limiter.until_ready_blocking(&1).is_allowed());
    /// assert_eq!(clock.now(), 250_000_000);
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn until_ready_blocking<Q: ?Sized>(&self, key: &Q) -> Decision
    where
        S: Keys<Q>,
    {
        let (peek, check) = (|| Ok(self.peek(key)), || self.check(key));
        let core = self.store.core();
        wait::infallible(core.until_ready_blocking(Jitter::NONE, peek, check))
    }

    /// [`until_ready_blocking`](Limiter::until_ready_blocking) for a request of `cost`,
    /// adding `jitter` to each wait; errors if the cost can never be admitted (at once, or as
    /// soon as a live reconfiguration makes it so).
    pub fn until_ready_blocking_with<Q: ?Sized>(
        &self,
        key: &Q,
        cost: u64,
        jitter: Jitter,
    ) -> Result<Decision, CostError>
    where
        S: Keys<Q>,
    {
        let (peek, check) = (|| self.peek_n(key, cost), || self.decide(key, cost));
        self.store.core().until_ready_blocking(jitter, peek, check)
    }

    /// A request of a cost already checked, by the limiter's own quota; counted.
    #[inline(always)]
    fn decide<Q: ?Sized>(&self, key: &Q, cost: u64) -> Decision
    where
        S: Keys<Q>,
    {
        let core = self.store.core();
        let now = core.clock.now();
        core.count(self.store.decide(&core.algo, key, cost, now))
    }

    /// A partial grant: admits the most units available now, up to `n`, and says how many:
    /// `(granted, decision)`, `granted` in `0..=n`. For a batch of messages, a streaming
    /// response, a transfer cut to what the quota allows. `n` above the capacity is capped at
    /// it (no request is ever admitted more at once). With nothing available, `granted` is 0
    /// and the decision is the denial of one unit, with its honest `retry_after` (and counted
    /// as one denied unit under the strict policy). Errors only for `n == 0`.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    ///
    /// let l = CasLimiter::<String, Gcra>::with_clock("10/s burst 8".parse()?, ManualClock::new());
    /// assert_eq!(l.check_up_to("k", 5)?.0, 5);
    /// let (granted, decision) = l.check_up_to("k", 5)?; // 3 units left
    /// assert_eq!((granted, decision.is_allowed()), (3, true));
    /// let (granted, decision) = l.check_up_to("k", 5)?;
    /// assert_eq!((granted, decision.is_denied()), (0, true));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_up_to<Q: ?Sized>(&self, key: &Q, n: u64) -> Result<(u64, Decision), CostError>
    where
        S: Keys<Q>,
    {
        self.store.core().grant_up_to(n, self.store.at(key))
    }

    /// Takes a provisional cost: decides and charges `cost` like
    /// [`check_n`](Limiter::check_n), and returns a [`Ticket`] to
    /// [`settle`](Limiter::settle) once the actual cost is known (an LLM response's
    /// tokens, a body's bytes). Same errors as `check_n`.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    ///
    /// let l = CasLimiter::<String, Gcra>::with_clock("10/s burst 10".parse()?, ManualClock::new());
    /// let mut ticket = l.take("k", 4)?;
    /// assert!(l.settle("k", &mut ticket, 9)?); // 5 more than estimated: charged now
    /// assert_eq!(l.peek("k").remaining(), Some(0)); // 10 − 9 − the peeked unit
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn take<Q: ?Sized>(&self, key: &Q, cost: u64) -> Result<Ticket, CostError>
    where
        S: Keys<Q>,
    {
        let core = self.store.core();
        core.take(&core.algo, cost, self.store.at(key))
    }

    /// Settles `ticket` (taken from this limiter for `key`) with the `actual` cost: unused
    /// units are refunded, an overrun is charged now, past the burst if need be (a debt the
    /// key pays before its next admission); [`Algorithm::settle`]
    /// says what each algorithm makes of it. Lock-free, on the same CAS path as a request.
    ///
    /// Returns whether this call settled the ticket: `false` if it was already settled (a
    /// retried settle changes nothing) or was denied (it holds nothing). Any `actual` is
    /// valid, 0 included (a full refund). A ticket taken from another limiter or for another
    /// key is a [`TicketError`], and stays open: settled here it would refund or charge
    /// another client.
    pub fn settle<Q: ?Sized>(
        &self,
        key: &Q,
        ticket: &mut Ticket,
        actual: u64,
    ) -> Result<bool, TicketError>
    where
        S: Keys<Q>,
    {
        let core = self.store.core();
        core.settle(&core.algo, ticket, actual, self.store.at(key))
    }

    /// Decides a request of `cost` for `key` under `quota`, a quota that comes with the
    /// request (a client's plan, a tenant's contract) instead of the limiter's own: one
    /// limiter serves every plan. The key's state means the same whatever quota reads it
    /// (GCRA: the time its spent budget is paid back; the windows: their counts), so a key
    /// whose plan changes keeps what it spent: moved to a larger burst it gains the
    /// difference at once, to a smaller one it waits until its spending fits the new burst.
    ///
    /// `quota` must be able to read the limiter's states
    /// ([`Reconfigure::check_change`]: any GCRA; a
    /// window of the same length; EARRRL of the same half-life), else
    /// [`QuotaError::Quota`]; a cost of 0 or above the quota's capacity is
    /// [`QuotaError::Cost`]. Nothing is counted on an error. The sweeper judges idleness by
    /// the state alone, which every quota reads alike.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    ///
    /// let free: Gcra = "10/min".parse()?;
    /// let pro: Gcra = "1000/min burst 100".parse()?;
    /// let l = CasLimiter::<String, Gcra>::with_clock(free, ManualClock::new());
    /// assert_eq!(l.check_n_with("alice", 50, &pro)?.remaining(), Some(50));
    /// assert!(l.check_n_with("bob", 50, &free).is_err()); // more than the free burst
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_n_with<Q: ?Sized>(
        &self,
        key: &Q,
        cost: u64,
        quota: &S::Algo,
    ) -> Result<Decision, QuotaError>
    where
        S: Keys<Q>,
        S::Algo: Reconfigure,
    {
        let core = self.store.core();
        let quota = core.quota(quota)?;
        check_cost(cost, quota.capacity())?;
        // The path of `check`, by the request's quota: clock first.
        let now = core.clock.now();
        Ok(core.count(self.store.decide(quota, key, cost, now)))
    }

    /// [`check`](Limiter::check) under a quota that comes with the request: a request of
    /// cost 1; see [`check_n_with`](Limiter::check_n_with). Errors only for a quota that
    /// cannot read the limiter's states (never for GCRA).
    // Always: left to LLVM it stays a call (the `Result` puts it past the inlining
    // threshold), a cost `check`, inlined, does not pay (`BENCHMARKS.md`, issue #32).
    #[inline(always)]
    pub fn check_with<Q: ?Sized>(&self, key: &Q, quota: &S::Algo) -> Result<Decision, QuotaError>
    where
        S: Keys<Q>,
        S::Algo: Reconfigure,
    {
        let core = self.store.core();
        let quota = core.quota(quota)?;
        // The path of `check`, by the request's quota; cost 1 never exceeds a capacity.
        let now = core.clock.now();
        Ok(core.count(self.store.decide(quota, key, 1, now)))
    }

    /// [`take`](Limiter::take) under a quota that comes with the request; see
    /// [`check_n_with`](Limiter::check_n_with).
    pub fn take_with<Q: ?Sized>(
        &self,
        key: &Q,
        cost: u64,
        quota: &S::Algo,
    ) -> Result<Ticket, QuotaError>
    where
        S: Keys<Q>,
        S::Algo: Reconfigure,
    {
        let core = self.store.core();
        let quota = core.quota(quota)?;
        Ok(core.take(quota, cost, self.store.at(key))?)
    }

    /// [`settle`](Limiter::settle) under the quota the ticket was taken with (GCRA
    /// refunds and charges in its emission interval).
    pub fn settle_with<Q: ?Sized>(
        &self,
        key: &Q,
        ticket: &mut Ticket,
        actual: u64,
        quota: &S::Algo,
    ) -> Result<bool, QuotaError>
    where
        S: Keys<Q>,
        S::Algo: Reconfigure,
    {
        let core = self.store.core();
        let quota = core.quota(quota)?;
        Ok(core.settle(quota, ticket, actual, self.store.at(key))?)
    }

    /// Drops every key whose state is equivalent to a fresh key's at `now − grace` (so no
    /// future decision changes), then, if a capacity bound is set and still exceeded, evicts
    /// down to 7/8 of it. Safe to run while other threads `check`: see the protocol in the
    /// crate's Implementation notes. Returns what it did. (The single cell is never swept.)
    pub fn sweep(&self) -> SweepReport {
        self.store.sweep()
    }

    /// Totals over every sweep so far, by hand or in the background (the compact store's
    /// `evicted_capacity` also counts keys evicted by inserts that found their probe window
    /// full).
    pub fn sweep_totals(&self) -> SweepTotals {
        self.store.sweep_totals()
    }

    /// The number of keys held (1 for the single cell). The papaya map sums it from
    /// per-thread counters one by one, so while other threads insert and evict it is a
    /// snapshot that can be off by what they did during the read.
    pub fn len(&self) -> usize {
        self.store.keys()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The capacity bound ([`Builder::max_keys`]), if one is set (always for the compact
    /// store, sized by it).
    pub fn max_keys(&self) -> Option<usize> {
        self.store.bound()
    }

    /// The background sweeper's interval ([`Builder::sweep_every`]), if one runs.
    pub fn sweep_every(&self) -> Option<Duration> {
        self.store.core().sweep_every
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &S::Algo {
        &self.store.core().algo
    }

    /// The clock.
    pub fn clock(&self) -> &S::Clock {
        &self.store.core().clock
    }

    /// A snapshot of the counters: decisions (if [counted](Builder::metrics)), CAS retries,
    /// sweeps, evictions, keys.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock};
    ///
    /// let limiter = CompactLimiter::<u64, Gcra>::builder("10/s burst 2".parse()?)
    ///     .clock(ManualClock::new())
    ///     .metrics(true)
    ///     .build()?;
    /// let allowed = [1, 1, 1, 2].map(|key| limiter.check(&key).is_allowed());
    /// assert_eq!(allowed, [true, true, false, true]);
    /// let m = limiter.metrics();
    /// assert_eq!((m.allowed, m.denied, m.keys), (3, 1, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> Metrics {
        self.store.core().metrics(self.sweep_totals(), self.len())
    }
}

impl<S: Store<Algo = Gcra>> Limiter<S> {
    /// Pacing: admits a request of `cost` for `key` now with the delay after which it
    /// conforms, if that delay is at most `max_wait`; otherwise counts nothing.
    /// See [`Gcra::reserve`].
    ///
    /// ```
    /// use hotlimit::{algo::{Gcra, Reservation}, CasLimiter, ManualClock};
    /// use std::time::Duration;
    ///
    /// let l = CasLimiter::<u32, Gcra>::with_clock("10/s burst 1".parse()?, ManualClock::new());
    /// let wait = Duration::from_secs(1);
    /// assert_eq!(l.reserve(&7, 1, wait), Ok(Reservation::Admitted { delay: Duration::ZERO }));
    /// assert_eq!(l.reserve(&7, 1, wait), Ok(Reservation::Admitted { delay: Duration::from_millis(100) }));
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn reserve<Q: ?Sized>(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation, CostError>
    where
        S: Keys<Q>,
    {
        self.store
            .core()
            .reserve(cost, max_wait, self.store.at(key))
    }
}

impl<A: Reconfigure, S: Store<Algo = Live<A>>> Limiter<S> {
    /// Switches to the configuration `new` while traffic flows, keeping every key: each
    /// request runs entirely under the old or the new configuration, then every kept state is
    /// [fitted](Reconfigure::fit) to the new quota (clamped, never reset to fresh). Returns the
    /// configuration replaced; errors, changing nothing, if `new` would change what the kept
    /// states mean (see [`Reconfigure`]). See [`Live`] for the guarantees.
    pub fn reconfigure(&self, new: A) -> Result<A, ConfigError> {
        let store = &self.store;
        store.core().reconfigure(new, |fit| store.rewrite_all(fit))
    }
}

/// Every in-memory limiter, through the one request path.
impl<Q: ?Sized, S: Keys<Q>> crate::RateLimiter<Q> for Limiter<S> {
    #[inline]
    fn check_n(&self, key: &Q, cost: u64) -> Result<Decision, CostError> {
        Limiter::check_n(self, key, cost)
    }

    #[inline]
    fn check(&self, key: &Q) -> Decision {
        Limiter::check(self, key)
    }

    #[inline]
    fn peek_n(&self, key: &Q, cost: u64) -> Result<Decision, CostError> {
        Limiter::peek_n(self, key, cost)
    }

    #[inline]
    fn peek(&self, key: &Q) -> Decision {
        Limiter::peek(self, key)
    }

    fn check_batch(&self, keys: &[&Q], out: &mut Vec<Decision>) {
        Limiter::check_batch(self, keys.iter().copied(), out)
    }

    fn check_n_batch(&self, requests: &[(&Q, u64)], out: &mut Vec<Result<Decision, CostError>>) {
        Limiter::check_n_batch(self, requests.iter().copied(), out)
    }

    fn until_ready_blocking(&self, key: &Q) -> Decision {
        Limiter::until_ready_blocking(self, key)
    }

    fn len(&self) -> usize {
        Limiter::len(self)
    }

    fn sweep(&self) -> SweepReport {
        Limiter::sweep(self)
    }
}

impl<S: Store + KeyedStore> crate::shared::sealed::Keyed for Limiter<S> {}
impl<S: Store + KeyedStore> KeyedStore for Limiter<S> {}

impl<S: Store> fmt::Debug for Limiter<S>
where
    S::Algo: fmt::Debug,
    S::Clock: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("core", self.store.core())
            .field("keys", &self.store.keys())
            .finish()
    }
}
