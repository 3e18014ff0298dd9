//! [`KeyedLimiter`]: a `papaya` map from key to a cell of state, with idle and capacity
//! eviction; [`Pinned`] in `pinned.rs`; partial grants, settle and per-request quotas in
//! `costs.rs`.

mod costs;
mod evict;
mod pinned;

use costs::At;

pub use pinned::Pinned;

use crate::algo::{Algorithm, Gcra, Reconfigure, Reservation};
use crate::cell::StateCell;
use crate::clock::{Clock, QuantaClock};
use crate::decision::Decision;
use crate::error::{ConfigError, CostError};
use crate::limiter::{rate_limiter_by_inherent, Cas, Locked, Variant};
use crate::live::Live;
use crate::shared::{sealed, Builder, Core, KeyedStore, Options};
use crate::stats::Metrics;
use crate::sweeper::{evict_before_insert, SweepReport, SweepTotals, Sweeper};
use crate::wait::{self, Jitter};
use std::borrow::Borrow;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

/// Keys sampled to pick the capacity-eviction threshold.
const CAPACITY_SAMPLE: usize = 1024;

/// A keyed rate limiter: a `papaya` concurrent map (hashed with `ahash`) from key to a cell of
/// state, the cell chosen by `V`.
///
/// With [`Cas`] ([`CasLimiter`]) the hot path for a known key is: clock read → hash →
/// lock-free lookup → load the state word → pure algorithm step → `compare_exchange_weak`
/// (retried with backoff on a lost race). It takes no lock and allocates nothing. A key seen
/// for the first time is inserted (one allocation). With [`Locked`] ([`MutexLimiter`]) the
/// same map holds each key's state behind a `parking_lot::Mutex`, and the same step runs under
/// it.
///
/// **Consistency.** Decisions are linearizable per key: whatever the threads and
/// interleavings, they equal those of some sequential order of the same requests. At one fixed
/// `now`, N threads firing at one key get exactly as many allowed as one thread would.
/// Different keys are independent. Eviction never loses an update (see [`sweep`]).
///
/// Look-ups borrow: a `KeyedLimiter<String, _>` is checked with `&str`, so a request
/// allocates nothing for a known key.
///
/// [`sweep`]: KeyedLimiter::sweep
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
pub struct KeyedLimiter<K, A: Algorithm, C = QuantaClock, V: Variant<A> = Cas> {
    shared: Arc<Shared<K, A, C, V>>,
    /// Stops and joins the background sweeper (if any) when the limiter is dropped.
    _sweeper: Option<Sweeper>,
}

/// The lock-free keyed limiter.
pub type CasLimiter<K, A, C = QuantaClock> = KeyedLimiter<K, A, C, Cas>;

/// The pessimistic twin: the same map and algorithm, each key's state behind a mutex.
pub type MutexLimiter<K, A, C = QuantaClock> = KeyedLimiter<K, A, C, Locked>;

/// Everything the requests and the sweeper thread share: the keyed store itself, which the
/// hybrid limiter (feature `redis`) also keeps its entries in.
pub(crate) struct Shared<K, A: Algorithm, C, V: Variant<A>> {
    pub(crate) map: papaya::HashMap<K, V::Cell, ahash::RandomState>,
    pub(crate) core: Core<A, C>,
    /// Told of every key an eviction kills, with the state it killed: what the hybrid
    /// limiter hands back to Redis. `None` for the keyed limiters.
    evicted: Option<EvictHook<K, A::State>>,
    /// Hashes keys for the debt table (papaya keeps its own hasher to itself).
    hasher: ahash::RandomState,
}

/// See `Shared::with_evict_hook` (feature `redis`).
pub(crate) type EvictHook<K, S> = Box<dyn Fn(&K, &S) + Send + Sync>;

impl<K, A, V> KeyedLimiter<K, A, QuantaClock, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    V: Variant<A>,
{
    /// A limiter running `algo` on the default (`quanta`) clock, without background sweeps.
    pub fn new(algo: A) -> Self {
        Self::with_clock(algo, QuantaClock::new())
    }

    /// A limiter running `algo` on `clock`, without background sweeps.
    pub fn with_clock<C: Clock>(algo: A, clock: C) -> KeyedLimiter<K, A, C, V> {
        KeyedLimiter {
            shared: Arc::new(Shared::new(algo, clock, &Options::default())),
            _sweeper: None,
        }
    }

    /// A builder for a limiter running `algo`: clock, background sweeper, capacity bound,
    /// metrics.
    pub fn builder(algo: A) -> Builder<Self, A> {
        Builder::new(algo)
    }
}

impl<K, A: Algorithm, V: Variant<A>> sealed::Keyed for KeyedLimiter<K, A, QuantaClock, V> {}
impl<K, A: Algorithm, V: Variant<A>> KeyedStore for KeyedLimiter<K, A, QuantaClock, V> {}

impl<K, A, C, V> Builder<KeyedLimiter<K, A, QuantaClock, V>, A, C>
where
    K: Hash + Eq + Send + Sync + 'static,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// Builds the limiter, starting the background sweeper if one was asked for.
    ///
    /// Fails only if the sweeper thread cannot be spawned, or the debt table of a `max_keys`
    /// beyond memory cannot be allocated.
    pub fn build(self) -> std::io::Result<KeyedLimiter<K, A, C, V>> {
        let shared = Shared::new(self.algo, self.clock, &self.options)
            .with_debts(&self.options)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, e))?;
        let shared = Arc::new(shared);
        let sweeper = shared.core.spawn_sweeper(&shared, |s| {
            s.sweep();
        })?;
        Ok(KeyedLimiter {
            shared,
            _sweeper: sweeper,
        })
    }
}

impl<K, A, C, V> KeyedLimiter<K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// Decides a request of cost 1 for `key`.
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Cost 1 never exceeds a capacity (capacities are at least 1).
        self.shared.decide(key, 1)
    }

    /// Decides a request of `cost` for `key`.
    ///
    /// Errors (and counts nothing) if `cost` is 0 or above the algorithm's capacity, since
    /// such a request could never be allowed.
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.shared.core.cost(cost)?;
        Ok(self.shared.decide(key, cost))
    }

    /// The decision [`check`](KeyedLimiter::check) would return now, without counting the
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
    pub fn peek<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.shared.core.clock.now();
        self.shared.peek(key, 1, now, &self.shared.map.guard())
    }

    /// The decision [`check_n`](KeyedLimiter::check_n) would return now, without counting
    /// it; errors as `check_n` does.
    #[inline]
    pub fn peek_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shared.core.cost(cost)?;
        let now = self.shared.core.clock.now();
        Ok(self.shared.peek(key, cost, now, &self.shared.map.guard()))
    }

    /// Waits until a request of cost 1 for `key` is allowed and returns that decision (the
    /// request is counted): client-side self-limiting. `sleep` is the runtime's timer, e.g.
    /// `tokio::time::sleep`, so this works on any runtime.
    ///
    /// It peeks while it waits and sleeps each honest `retry_after`, so it is never counted as
    /// denied while it waits and returns at the earliest time the limiter allows (plus any
    /// [`Jitter`] of [`until_ready_with`](KeyedLimiter::until_ready_with)). Under a strict
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
    pub async fn until_ready<Q, F, Fut>(&self, key: &Q, sleep: F) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (peek, check) = (|| Ok(self.peek(key)), || self.check(key));
        wait::infallible(
            self.shared
                .core
                .until_ready(Jitter::NONE, peek, check, sleep)
                .await,
        )
    }

    /// [`until_ready`](KeyedLimiter::until_ready) for a request of `cost`, adding `jitter` to
    /// each wait; errors if the cost can never be admitted (at once, or as soon as a live
    /// reconfiguration makes it so).
    pub async fn until_ready_with<Q, F, Fut>(
        &self,
        key: &Q,
        cost: u64,
        jitter: Jitter,
        sleep: F,
    ) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (peek, check) = (|| self.peek_n(key, cost), || self.shared.decide(key, cost));
        self.shared
            .core
            .until_ready(jitter, peek, check, sleep)
            .await
    }

    /// [`until_ready`](KeyedLimiter::until_ready) on the calling thread, sleeping with the
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
    pub fn until_ready_blocking<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (peek, check) = (|| Ok(self.peek(key)), || self.check(key));
        wait::infallible(
            self.shared
                .core
                .until_ready_blocking(Jitter::NONE, peek, check),
        )
    }

    /// [`until_ready_blocking`](KeyedLimiter::until_ready_blocking) for a request of `cost`,
    /// adding `jitter` to each wait; errors if the cost can never be admitted (at once, or as
    /// soon as a live reconfiguration makes it so).
    pub fn until_ready_blocking_with<Q>(
        &self,
        key: &Q,
        cost: u64,
        jitter: Jitter,
    ) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (peek, check) = (|| self.peek_n(key, cost), || self.shared.decide(key, cost));
        self.shared.core.until_ready_blocking(jitter, peek, check)
    }

    /// Pins the map for a batch of checks from this thread, saving the pin each
    /// [`check`](KeyedLimiter::check) otherwise pays (an epoch-based reclamation guard,
    /// dearer under contention; `BENCHMARKS.md` has its cost).
    ///
    /// While a [`Pinned`] lives, memory of entries removed meanwhile (evicted keys) is not
    /// reclaimed, so pin per batch of requests (a read from a socket, a pipeline of requests),
    /// not for a thread's lifetime. Decisions are the same as through the limiter; the handle
    /// is not `Send`.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
    ///
    /// let limiter = CasLimiter::<u64, Gcra>::with_clock("10/s burst 2".parse()?, ManualClock::new());
    /// let batch = [7, 7, 9, 7];
    /// let pinned = limiter.pin();
    /// let allowed: Vec<bool> = batch.iter().map(|k| pinned.check(k).is_allowed()).collect();
    /// assert_eq!(allowed, [true, true, true, false]);
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn pin(&self) -> Pinned<'_, K, A, C, V> {
        Pinned {
            shared: &self.shared,
            guard: self.shared.map.guard(),
        }
    }

    /// Drops every key whose state is equivalent to a fresh key's at `now − grace` (so no
    /// future decision changes), then, if a capacity bound is set and still exceeded, evicts
    /// down to 7/8 of it. Safe to run while other threads `check`: see the protocol in the
    /// crate's Implementation notes. Returns what it did.
    pub fn sweep(&self) -> SweepReport {
        self.shared.sweep()
    }

    /// Totals over every sweep so far, by hand or in the background.
    pub fn sweep_totals(&self) -> SweepTotals {
        self.shared.core.sweep_totals()
    }

    /// The number of keys held. papaya sums it from per-thread counters one by one, so
    /// while other threads insert and evict it is a snapshot that can be off by what they did
    /// during the read.
    pub fn len(&self) -> usize {
        self.shared.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The capacity bound ([`Builder::max_keys`]), if one is set.
    pub fn max_keys(&self) -> Option<usize> {
        self.shared.core.max_keys
    }

    /// The background sweeper's interval ([`Builder::sweep_every`]), if one runs.
    pub fn sweep_every(&self) -> Option<Duration> {
        self.shared.core.sweep_every
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.shared.core.algo
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.shared.core.clock
    }

    /// A snapshot of the counters: decisions (if [counted](Builder::metrics)), CAS retries,
    /// sweeps, evictions, keys.
    pub fn metrics(&self) -> Metrics {
        self.shared.core.metrics(self.sweep_totals(), self.len())
    }
}

impl<K, A, C, V> KeyedLimiter<K, Live<A>, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Reconfigure,
    C: Clock,
    V: Variant<Live<A>>,
{
    /// Switches to the configuration `new` while traffic flows, keeping every key: each
    /// request runs entirely under the old or the new configuration, then every kept state is
    /// [fitted](Reconfigure::fit) to the new quota (clamped, never reset to fresh). Returns the
    /// configuration replaced; errors, changing nothing, if `new` would change what the kept
    /// states mean (see [`Reconfigure`]). See [`Live`] for the guarantees.
    pub fn reconfigure(&self, new: A) -> Result<A, ConfigError> {
        let sh = &*self.shared;
        sh.core.reconfigure(new, |fit| {
            let guard = sh.map.guard();
            for (_, cell) in sh.map.iter(&guard) {
                cell.rewrite(fit);
            }
        })
    }
}

impl<K, C, V> KeyedLimiter<K, Gcra, C, V>
where
    K: Hash + Eq + Send + Sync,
    C: Clock,
    V: Variant<Gcra>,
{
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
    pub fn reserve<Q>(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let sh = &*self.shared;
        sh.core.reserve(cost, max_wait, At(sh, key))
    }
}

impl<K, A, C, V> Shared<K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    pub(crate) fn new(algo: A, clock: C, options: &Options) -> Self {
        Self {
            map: papaya::HashMap::builder()
                .hasher(ahash::RandomState::new())
                .build(),
            core: Core::new(algo, clock, options),
            evicted: None,
            hasher: ahash::RandomState::new(),
        }
    }

    /// Adds the debt table, if the options ask for a bounded store that remembers.
    pub(crate) fn with_debts(
        mut self,
        options: &Options,
    ) -> Result<Self, std::collections::TryReserveError> {
        self.core = self.core.with_debts(options)?;
        Ok(self)
    }

    /// The hash of `key` the debt table files it under.
    #[inline]
    fn debt_hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Calls `hook` with the key and the state of every cell a sweep kills (idle or for
    /// capacity), after the kill: a state that holds something outside this process (a
    /// lease) is handed back through it.
    #[cfg(feature = "redis")]
    pub(crate) fn with_evict_hook(mut self, hook: EvictHook<K, A::State>) -> Self {
        self.evicted = Some(hook);
        self
    }

    #[inline(always)]
    fn decide<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Clock first: the TSC read is not serializing, so it can overlap the pin, hash and
        // probe.
        let now = self.core.clock.now();
        self.decide_pinned(key, cost, now, &self.map.guard())
    }

    #[inline(always)]
    pub(crate) fn decide_pinned<Q>(
        &self,
        key: &Q,
        cost: u64,
        now: u64,
        guard: &impl papaya::Guard,
    ) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide_pinned_by(&self.core.algo, key, cost, now, guard)
    }

    /// [`decide_pinned`](Shared::decide_pinned) by `algo` (the limiter's or a request's quota).
    #[inline(always)]
    pub(crate) fn decide_pinned_by<Q>(
        &self,
        algo: &A,
        key: &Q,
        cost: u64,
        now: u64,
        guard: &impl papaya::Guard,
    ) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.core
            .count(self.apply(key, guard, |state| algo.update(state, now, cost)))
    }

    /// A step on a copy of `key`'s state (a fresh one if the key is absent or being
    /// evicted, which is what a dead cell's state was equivalent to).
    #[inline]
    pub(crate) fn peek<Q>(
        &self,
        key: &Q,
        cost: u64,
        now: u64,
        guard: &impl papaya::Guard,
    ) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map
            .get(key, guard)
            .and_then(|cell| cell.inspect(|state| self.core.algo.peek(state, now, cost)))
            .unwrap_or_else(|| self.core.peek_absent(|| self.debt_hash(key), now, cost))
    }

    /// Runs `f` on `key`'s state in its cell, retrying on a fresh cell if the sweeper killed
    /// the one found. Every request path goes through here.
    #[inline(always)]
    pub(crate) fn apply<Q, T>(
        &self,
        key: &Q,
        guard: &impl papaya::Guard,
        f: impl FnMut(&mut A::State) -> T,
    ) -> T
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.apply_found(key, None, guard, f)
    }

    /// [`apply`](Shared::apply) starting from `found`, a cell the caller already looked up
    /// for `key` (a batch's first pass), if any: it is tried first, and the look-up (insert
    /// included) runs only when there is none or it turns out dead.
    #[inline(always)]
    pub(crate) fn apply_found<'g, Q, T>(
        &self,
        key: &Q,
        mut found: Option<&'g V::Cell>,
        guard: &'g impl papaya::Guard,
        mut f: impl FnMut(&mut A::State) -> T,
    ) -> T
    where
        K: Borrow<Q> + 'g,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        loop {
            let cell = match found.take() {
                Some(cell) => cell,
                None => self.cell(key, guard),
            };
            match self.core.update(cell, &mut f) {
                Some(out) => return out,
                None => self.remove_dead(key, cell, guard),
            }
        }
    }

    /// The cell for `key`, inserted fresh on first sight.
    #[inline(always)]
    pub(crate) fn cell<'g, Q>(&self, key: &Q, guard: &'g impl papaya::Guard) -> &'g V::Cell
    where
        K: Borrow<Q> + 'g,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.map.get(key, guard) {
            Some(cell) => cell,
            None => self.insert_fresh(key, guard),
        }
    }

    /// The miss path of [`cell`](Shared::cell): evicts first if the map is full, then
    /// inserts a fresh cell (or finds the one a racing insert put there). Out of line, so that
    /// a hit keeps fewer values live across the look-up.
    #[cold]
    #[inline(never)]
    fn insert_fresh<'g, Q>(&self, key: &Q, guard: &'g impl papaya::Guard) -> &'g V::Cell
    where
        K: Borrow<Q> + 'g,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(max) = self.core.max_keys {
            // papaya's `retain` walks the map in one go: a waiting request cannot take part.
            evict_before_insert(
                || self.map.len(),
                max,
                &self.core.pass,
                &self.core.totals,
                || self.evict_capacity(max, guard),
                None,
            );
        }
        // Read before the insert, which excludes no eviction of this key: caught up after.
        let hash = self.core.debts.as_ref().map(|_| self.debt_hash(key));
        let stamp = hash.map(|h| self.core.debt_stamp(h));
        let state = match hash {
            Some(h) => self.core.start_state(|| h),
            None => self.core.algo.fresh(),
        };
        // `try_insert`, not `get_or_insert_with`: in papaya 0.2.5, filling a map through
        // `get_or_insert_with` under incremental resizing left later reads ~13x slower
        // (1.35 us vs 0.10 us per get at 1M keys, measured); `try_insert` does not.
        match self
            .map
            .try_insert(key.to_owned(), V::Cell::new(state), guard)
        {
            Ok(cell) => {
                if let (Some(hash), Some(stamp)) = (hash, stamp) {
                    self.core.catch_up(hash, stamp, |merge| {
                        cell.rewrite(merge);
                    });
                }
                // Woken after the insert, so the sweep it triggers sees this key: a wake
                // consumed by a sweep that started before the insert would be lost.
                if self.core.max_keys.is_some_and(|max| self.map.len() > max) {
                    self.core.signal.wake();
                }
                cell
            }
            Err(occupied) => occupied.current,
        }
    }

    /// Removes `cell` (found dead) from the map if it is still there: the sweeper that killed
    /// it may not have got to it yet.
    #[cold]
    pub(crate) fn remove_dead<Q>(&self, key: &Q, cell: &V::Cell, guard: &impl papaya::Guard)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let _ = self.map.remove_if(key, |_, c| std::ptr::eq(c, cell), guard);
    }
}

rate_limiter_by_inherent! {
    impl[K, Q, A, C, V] RateLimiter<Q> for KeyedLimiter<K, A, C, V>
    where [
        K: Hash + Eq + Send + Sync + Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        A: Algorithm,
        C: Clock,
        V: Variant<A>,
    ]
    { keys, batches }
}

impl<K: Hash + Eq, A: Algorithm + fmt::Debug, C: fmt::Debug, V: Variant<A>> fmt::Debug
    for KeyedLimiter<K, A, C, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("core", &self.shared.core)
            .field("keys", &self.shared.map.len())
            .finish()
    }
}
