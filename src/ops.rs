//! [`Limiter`]: the one in-memory limiter, generic over the [`Store`] that keeps its keys'
//! states. Every operation is written here, once; a store adds only its table (the papaya
//! map, the compact table, one cell) through the sealed traits below.

use crate::algo::{Algorithm, Gcra, Reservation};
use crate::clock::{Clock, QuantaClock};
use crate::decision::{Decision, Ticket};
use crate::error::{check_cost, BuildError, ConfigError, QuotaError};
use crate::live::Live;
use crate::request::{Ask, Request, Requests};
use crate::shared::{Builder, KeyedStore, Options};
use crate::stats::Metrics;
use crate::sweeper::Sweeper;
use crate::wait;
use sealed::Table;
use std::future::Future;

use std::fmt;

use std::time::Duration;

/// The store's side of a limiter: what each store implements. Sealed (private module): a
/// caller names [`Store`] and [`Keys`], never these.
pub(crate) mod sealed {
    use crate::algo::Algorithm;
    use crate::clock::Clock;
    use crate::decision::Decision;
    use crate::error::QuotaError;
    use crate::shared::{Core, KeyState, Options};
    use crate::stats::Metrics;
    use crate::sweeper::Sweeper;

    /// A store's table with its [`Core`], owned by a limiter and built from its options.
    pub trait Table: Sized + Send + Sync + 'static {
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
        ) -> Result<(Self, Option<Sweeper>), crate::error::BuildError>;
        /// The core every store shares.
        fn core(&self) -> &Core<Self::Algo, Self::Clock>;
        /// The keys held.
        fn keys(&self) -> usize;
        /// Where the keys are held, in words (what a limiter's `Debug` shows).
        fn table(&self) -> &'static str;
        /// Idle and capacity eviction.
        fn sweep(&self) -> Metrics;
        /// Totals over every sweep (the sweep fields of a [`Metrics`]).
        fn sweep_totals(&self) -> Metrics {
            self.core().sweep_totals()
        }
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

        /// A check: the clock read, the limiter's own step, counted. A store behind an `Arc`
        /// overrides it to reach its core and its table through one pointer: reached twice
        /// (`core()`, then `decide`), the pointer was reloaded after the clock's acquire load,
        /// 7 more instructions a check (measured for issue #47; the sitting is in git history).
        #[inline(always)]
        fn check(&self, key: &Q, cost: u64) -> Decision {
            let core = self.core();
            // Clock first: a TSC read (the default clock's, where the kernel keeps time by the
            // TSC) is not serializing, so it can overlap the look-up.
            let now = core.clock.now();
            core.count(self.decide(&core.algo, key, cost, now))
        }

        /// `algo`'s decision of a request of `cost` at `now`, without counting it or
        /// inserting the key.
        fn peek(&self, algo: &Self::Algo, key: &Q, cost: u64, now: u64) -> Decision;

        /// Decides `requests` in order at one clock reading (counted); a cost `valid` refuses
        /// is that request's error. By default, one request at a time.
        fn decide_batch<'k>(
            &self,
            requests: impl IntoIterator<Item = (&'k Q, u64)>,
            valid: impl Fn(u64) -> Result<(), QuotaError>,
            mut emit: impl FnMut(Result<Decision, QuotaError>),
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
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, RateLimiter};
/// use std::time::Duration;
///
/// let clock = ManualClock::default();
/// let limiter = CasLimiter::<String, Gcra, _>::with_clock("10/s burst 2".parse()?, clock.clone());
/// assert!(limiter.check("alice").is_allowed());
/// assert!(limiter.check("alice").is_allowed());
/// let denied = limiter.check("alice");
/// assert_eq!(denied.retry_after(), Duration::from_millis(100));
/// assert!(limiter.check("bob").is_allowed());
/// clock.advance(Duration::from_millis(100));
/// assert!(limiter.check("alice").is_allowed());
/// assert_eq!(limiter.metrics().keys, 2);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub struct Limiter<S: Store> {
    pub(crate) store: S,
    /// Stops the background sweeper (if any) when the limiter is dropped.
    _sweeper: Option<Sweeper>,
}

impl<S: Store<Clock = QuantaClock>> Limiter<S> {
    /// A limiter running `algo` on the default (`quanta`) clock, without background sweeps
    /// (the compact store bound by [`DEFAULT_MAX_KEYS`](crate::store::DEFAULT_MAX_KEYS)).
    ///
    /// Like `Vec::with_capacity`, it aborts if what the compact store allocates at build
    /// cannot be (its first lines and its debt table: about 2 MB);
    /// [`builder`](Self::builder)'s `build` returns [`BuildError::OutOfMemory`] instead.
    pub fn new(algo: S::Algo) -> Self {
        match S::build(algo, QuantaClock::default(), &Options::default()) {
            Ok((store, sweeper)) => Limiter {
                store,
                _sweeper: sweeper,
            },
            Err(_) => out_of_memory(),
        }
    }

    /// A builder for a limiter running `algo`: clock, metrics, and for the keyed stores a
    /// capacity bound and a background sweeper.
    pub fn builder(algo: S::Algo) -> Builder<Self, S::Algo> {
        Builder::new(algo)
    }
}

impl<S: Store> Limiter<S> {
    /// A limiter running `algo` on `clock`, without background sweeps: a limiter of this very
    /// type, whose clock is the aliases' `C` (`_` infers it from `clock`):
    /// `CasLimiter::<String, Gcra, _>::with_clock(gcra, ManualClock::default())`.
    pub fn with_clock(algo: S::Algo, clock: S::Clock) -> Self {
        // Not through `Builder::new`: that would start (and calibrate) a default clock only
        // to drop it.
        match S::build(algo, clock, &Options::default()) {
            Ok((store, sweeper)) => Limiter {
                store,
                _sweeper: sweeper,
            },
            Err(_) => out_of_memory(),
        }
    }
}

/// Without a sweeper to spawn, only a default compact table (about 2 MB at build) can fail to
/// build: out of memory, abort as any allocation would.
#[cold]
fn out_of_memory() -> ! {
    std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; 64]>())
}

impl<S: Store<Clock = QuantaClock>, C: Clock> Builder<Limiter<S>, S::Algo, C> {
    /// Builds the limiter, starting the background sweeper if one was asked for.
    ///
    /// Fails with [`BuildError::Config`] for a sweep interval below its floor,
    /// [`BuildError::Spawn`] if the sweeper thread cannot be started, and
    /// [`BuildError::OutOfMemory`] if a table or debt table sized for `max_keys` cannot be
    /// allocated.
    pub fn build(self) -> Result<Limiter<S::WithClock<C>>, BuildError> {
        let (store, sweeper) = S::WithClock::<C>::build(self.algo, self.clock, &self.options)?;
        Ok(Limiter {
            store,
            _sweeper: sweeper,
        })
    }
}

impl<S: Store> Limiter<S> {
    /// Drops the limiter and waits for its background sweeper (if any) to end, a sweep under
    /// way finishing first. Dropping it only signals the sweeper, which then ends by itself:
    /// a drop never blocks.
    pub fn shutdown(mut self) {
        if let Some(sweeper) = self._sweeper.take() {
            sweeper.shutdown();
        }
    }

    /// Drops every key whose state is equivalent to a fresh key's at `now − grace` (so no
    /// future decision changes), then, if a capacity bound is set and still exceeded, evicts
    /// down to 7/8 of it. Safe to run while other threads `check`: see the protocol in the
    /// crate's Implementation notes. (The single cell is never swept.)
    ///
    /// Returns what this sweep did, as a [`Metrics`] of its own (what
    /// [`metrics`](Limiter::metrics) adds up over every sweep): `sweeps` 1, the keys it
    /// `scanned`, `evicted_idle` and `evicted_capacity`, its time in `sweep_busy`, and the
    /// `keys` held after it; the other counters 0.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, RateLimiter};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::default();
    /// let limiter = CasLimiter::<u64, Gcra, _>::builder("10/s".parse()?)
    ///     .clock(clock.clone())
    ///     .sweep_grace(Duration::ZERO)
    ///     .build()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// assert!(limiter.check(&2).is_allowed());
    /// assert_eq!(limiter.sweep().evicted_idle, 0); // both still counting down
    /// clock.advance(Duration::from_millis(100));
    /// let report = limiter.sweep();
    /// assert_eq!((report.scanned, report.evicted_idle, report.keys), (2, 2, 0));
    /// assert_eq!((limiter.metrics().sweeps, limiter.metrics().scanned), (2, 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sweep(&self) -> Metrics {
        self.store.sweep()
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &S::Algo {
        &self.store.core().algo
    }

    /// A snapshot of the counters: decisions (if [counted](Builder::metrics)), CAS retries,
    /// sweeps, evictions, keys.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock, RateLimiter};
    ///
    /// let limiter = CompactLimiter::<u64, Gcra>::builder("10/s burst 2".parse()?)
    ///     .clock(ManualClock::default())
    ///     .metrics(true)
    ///     .build()?;
    /// let allowed = [1, 1, 1, 2].map(|key| limiter.check(&key).is_allowed());
    /// assert_eq!(allowed, [true, true, false, true]);
    /// let m = limiter.metrics();
    /// assert_eq!((m.allowed, m.denied, m.keys), (3, 1, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> Metrics {
        self.store
            .core()
            .metrics(self.store.sweep_totals(), self.store.keys())
    }
}

impl<S: Store<Algo = Gcra>> Limiter<S> {
    /// `reserve` of [`Request`]: pacing by GCRA.
    pub(crate) fn reserve<Q: ?Sized>(
        &self,
        key: &Q,
        ask: Ask<'_, Gcra>,
        max_wait: Duration,
    ) -> Result<Reservation, QuotaError>
    where
        S: Keys<Q>,
    {
        let core = self.store.core();
        let now = core.now(ask.at);
        core.reserve(ask.quota, ask.cost, max_wait, now, self.store.at(key))
    }
}

impl<A: Algorithm + Copy, S: Store<Algo = Live<A>>> Limiter<S> {
    /// Switches to the configuration `new` while traffic flows, keeping every key: each
    /// request runs entirely under the old or the new configuration, and every kept state
    /// reads as it is under the new quota (never reset to fresh, never handed budget back).
    /// Returns the configuration replaced; errors, changing nothing, if `new` would change
    /// what the kept states mean (see [`Algorithm::check_quota`]). See [`Live`] for the guarantees.
    pub fn reconfigure(&self, new: A) -> Result<A, ConfigError> {
        self.store.core().reconfigure(new)
    }
}

/// Every in-memory limiter, through the one request path: decided in the call, never
/// waiting on I/O.
impl<Q: ?Sized, S: Keys<Q>> crate::RateLimiter<Q> for Limiter<S> {
    // Always: behind the store's trait methods, `#[inline]` left the compact and mutex stores'
    // one-key check 1–2 ns slower than their own inherent `check`s had been (measured for
    // issue #47; the sitting is in git history).
    #[inline(always)]
    fn check(&self, key: &Q) -> Decision {
        // Cost 1 never exceeds a capacity (capacities are at least 1).
        self.store.check(key, 1)
    }

    #[inline(always)]
    fn check_n(&self, key: &Q, cost: u64) -> Result<Decision, QuotaError> {
        self.store.core().cost(cost)?;
        Ok(self.store.check(key, cost))
    }

    fn check_batch<'k>(&self, keys: impl IntoIterator<Item = &'k Q>, out: &mut Vec<Decision>)
    where
        Q: 'k,
    {
        out.clear();
        let requests = keys.into_iter().map(|key| (key, 1));
        // Cost 1 is never refused (capacities are at least 1): every answer is a decision.
        self.store
            .decide_batch(requests, |_| Ok(()), |answer| out.extend(answer.ok()));
    }

    fn check_n_batch<'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k Q, u64)>,
        out: &mut Vec<Result<Decision, QuotaError>>,
    ) where
        Q: 'k,
    {
        out.clear();
        let core = self.store.core();
        self.store
            .decide_batch(requests, |cost| core.cost(cost), |answer| out.push(answer));
    }
}

impl<Q: ?Sized, S: Keys<Q>> crate::Requests<Q> for Limiter<S> {
    type Algo = S::Algo;
    type Error = QuotaError;

    #[inline(always)]
    fn decide(&self, key: &Q, ask: Ask<'_, S::Algo>) -> Result<Decision, QuotaError> {
        let core = self.store.core();
        let algo = core.pick(ask.quota)?;
        check_cost(ask.cost, algo.capacity())?;
        // The path of `check`, by the request's quota: clock first.
        let now = core.now(ask.at);
        Ok(core.count(self.store.decide(algo, key, ask.cost, now)))
    }

    #[inline(always)]
    fn peek(&self, key: &Q, ask: Ask<'_, S::Algo>) -> Result<Decision, QuotaError> {
        let core = self.store.core();
        let algo = core.pick(ask.quota)?;
        check_cost(ask.cost, algo.capacity())?;
        Ok(self.store.peek(algo, key, ask.cost, core.now(ask.at)))
    }

    #[inline(always)]
    fn up_to(&self, key: &Q, ask: Ask<'_, S::Algo>) -> Result<(u64, Decision), QuotaError> {
        let core = self.store.core();
        let algo = core.pick(ask.quota)?;
        let now = core.now(ask.at);
        core.grant_up_to(algo, ask.cost, now, self.store.at(key))
    }

    #[inline(always)]
    fn take(&self, key: &Q, ask: Ask<'_, S::Algo>) -> Result<Ticket, QuotaError> {
        let core = self.store.core();
        let algo = core.pick(ask.quota)?;
        let now = core.now(ask.at);
        core.take(algo, ask.cost, now, self.store.at(key))
    }

    #[inline(always)]
    fn settle(
        &self,
        key: &Q,
        ticket: &mut Ticket,
        actual: u64,
        ask: Ask<'_, S::Algo>,
    ) -> Result<bool, QuotaError> {
        let core = self.store.core();
        let algo = core.pick(ask.quota)?;
        core.settle(algo, ticket, actual, ask.at, self.store.at(key))
    }
}

/// The waits and pacing of the in-memory limiter's [`Request`]: they run on its clock.
impl<'a, S: Keys<Q>, Q: ?Sized> Request<'a, Limiter<S>, Q, S::Algo> {
    /// Waits until the request is allowed and returns that decision (the request is
    /// counted): client-side self-limiting. `sleep` is the runtime's timer, e.g.
    /// `tokio::time::sleep`, so this works on any runtime.
    ///
    /// It peeks while it waits and sleeps each honest `retry_after` (plus the
    /// [`jitter`](Request::jitter)), so it is never counted as denied while it waits and
    /// returns at the earliest time the limiter allows. Under a strict policy a peek's
    /// `retry_after` also covers the denial it would have counted, so the wait can be longer
    /// than the least one, never shorter. Other callers may take the budget first; it then
    /// waits again. A wait the limiter's clock cannot reach (past
    /// [`CLOCK_MAX`](crate::algo::CLOCK_MAX), where a clock saturates) returns the denial
    /// instead: no sleep would end it. Errors if the cost can never be admitted (at once, or
    /// as soon as a live reconfiguration makes it so). An [`at`](Request::at) is ignored:
    /// a wait runs on the clock.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, Clock, ManualClock, RateLimiter, Requests};
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
    /// let clock = ManualClock::default();
    /// let limiter = CasLimiter::<u32, Gcra, _>::with_clock("4/s burst 1".parse()?, clock.clone());
    /// assert!(limiter.check(&1).is_allowed()); // the burst of 1, spent
    /// // With tokio: `limiter.request(&1).until_ready(tokio::time::sleep).await`.
    /// let fake_sleep = |d| {
    ///     clock.advance(d);
    ///     std::future::ready(())
    /// };
    /// assert!(block_on(limiter.request(&1).until_ready(fake_sleep))?.is_allowed());
    /// assert_eq!(clock.now(), 250_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn until_ready<F, Fut>(self, sleep: F) -> Result<Decision, QuotaError>
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (peek, check) = self.steps();
        let clock = &self.limiter.store.core().clock;
        wait::until_ready(peek, check, || clock.now(), self.jitter, sleep).await
    }

    /// [`until_ready`](Request::until_ready) on the calling thread, sleeping with the
    /// limiter's clock ([`Clock::sleep`]: a real sleep, or a
    /// [`ManualClock`](crate::ManualClock) moving itself forward).
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, Clock, ManualClock, RateLimiter, Requests};
    ///
    /// let clock = ManualClock::default();
    /// let limiter = CasLimiter::<u32, Gcra, _>::with_clock("4/s burst 1".parse()?, clock.clone());
    /// assert!(limiter.check(&1).is_allowed()); // the burst of 1, spent
    /// assert!(limiter.request(&1).until_ready_blocking()?.is_allowed());
    /// assert_eq!(clock.now(), 250_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn until_ready_blocking(self) -> Result<Decision, QuotaError> {
        let (peek, check) = self.steps();
        let clock = &self.limiter.store.core().clock;
        let (now, sleep) = (|| clock.now(), |d| clock.sleep(d));
        wait::until_ready_blocking(peek, check, now, self.jitter, sleep)
    }

    /// A wait's two steps, this request's peek and check, on the clock (a wait ignores `at`).
    fn steps(
        &self,
    ) -> (
        impl Fn() -> Result<Decision, QuotaError> + 'a,
        impl Fn() -> Result<Decision, QuotaError> + 'a,
    ) {
        let (l, key) = (self.limiter, self.key);
        let ask = Ask {
            at: None,
            ..self.ask
        };
        (move || l.peek(key, ask), move || l.decide(key, ask))
    }
}

impl<'a, S: Keys<Q> + Store<Algo = Gcra>, Q: ?Sized> Request<'a, Limiter<S>, Q, Gcra> {
    /// Pacing: admits the request now with the delay after which it conforms, if that delay
    /// is at most `max_wait`; otherwise counts nothing. See [`Gcra::reserve`].
    ///
    /// ```
    /// use hotlimit::{algo::{Gcra, Reservation}, CasLimiter, ManualClock, Requests};
    /// use std::time::Duration;
    ///
    /// let l = CasLimiter::<u32, Gcra, _>::with_clock("10/s burst 1".parse()?, ManualClock::default());
    /// let wait = Duration::from_secs(1);
    /// assert_eq!(l.request(&7).reserve(wait)?, Reservation::Admitted { delay: Duration::ZERO });
    /// assert_eq!(l.request(&7).reserve(wait)?, Reservation::Admitted { delay: Duration::from_millis(100) });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve(self, max_wait: Duration) -> Result<Reservation, QuotaError> {
        self.limiter.reserve(self.key, self.ask, max_wait)
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
            .field("table", &self.store.table())
            .field("keys", &self.store.keys())
            .finish()
    }
}
