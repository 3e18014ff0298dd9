//! The public limiters: [`KeyedLimiter`] (lock-free or mutex cells over a `papaya` map),
//! [`DirectLimiter`] (one unkeyed cell) and [`ShardedLimiter`] (a sharded `Mutex<HashMap>`
//! baseline), all behind the [`RateLimiter`] trait.

use crate::algo::{Algorithm, Gcra, Reservation};
use crate::cell::{CasCell, LockCell};
use crate::clock::{duration_to_nanos, Clock, QuantaClock};
use crate::decision::Decision;
use crate::error::{check_cost, CostError};
use crate::stats::{CasStats, Stats};
use crate::sync::Mutex;
use crossbeam_utils::CachePadded;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

/// Anything that decides requests for keys of type `Q`: every keyed limiter of the crate.
/// Tests, benches and tools are written against this trait.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, MutexLimiter, ManualClock, RateLimiter};
///
/// fn admitted(l: &dyn RateLimiter<str>, n: usize) -> usize {
///     (0..n).filter(|_| l.check("k").is_allowed()).count()
/// }
/// let g: Gcra = "10/s burst 3".parse()?;
/// assert_eq!(admitted(&CasLimiter::<String, _, _>::with_clock(g, ManualClock::new()), 10), 3);
/// assert_eq!(admitted(&MutexLimiter::<String, _, _>::with_clock(g, ManualClock::new()), 10), 3);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait RateLimiter<Q: ?Sized>: Send + Sync {
    /// Decides a request of `cost` for `key`. Errors if the cost is 0 or can never be
    /// admitted.
    fn check_n(&self, key: &Q, cost: u64) -> Result<Decision, CostError>;

    /// Decides a request of cost 1 for `key`.
    fn check(&self, key: &Q) -> Decision;

    /// The number of keys currently held.
    fn len(&self) -> usize;

    /// Whether no key is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

mod sealed {
    pub trait Sealed {}
}

/// How a [`KeyedLimiter`] or [`DirectLimiter`] keeps each key's state: [`Cas`] or [`Locked`].
/// Sealed.
pub trait Variant<A: Algorithm>: sealed::Sealed + Send + Sync + 'static {
    /// The per-key cell.
    #[doc(hidden)]
    type Cell: Send + Sync + fmt::Debug;
    #[doc(hidden)]
    fn new_cell(algo: &A) -> Self::Cell;
    #[doc(hidden)]
    fn step(cell: &Self::Cell, algo: &A, now: u64, cost: u64, stats: &Stats) -> Decision;
}

/// Optimistic: the state word is updated by compare-and-swap, no lock.
#[derive(Debug, Clone, Copy)]
pub enum Cas {}

/// Pessimistic: the state sits behind a `parking_lot::Mutex` (EARRRL in its two-field form).
#[derive(Debug, Clone, Copy)]
pub enum Locked {}

impl sealed::Sealed for Cas {}
impl sealed::Sealed for Locked {}

impl<A: Algorithm> Variant<A> for Cas {
    type Cell = CasCell<A::State>;

    #[inline]
    fn new_cell(algo: &A) -> Self::Cell {
        CasCell::new(algo.fresh())
    }

    #[inline(always)]
    fn step(cell: &Self::Cell, algo: &A, now: u64, cost: u64, stats: &Stats) -> Decision {
        cell.step(algo, now, cost, stats)
    }
}

impl<A: Algorithm> Variant<A> for Locked {
    type Cell = LockCell<A::Locked>;

    #[inline]
    fn new_cell(algo: &A) -> Self::Cell {
        LockCell::new(algo.fresh_locked())
    }

    #[inline]
    fn step(cell: &Self::Cell, algo: &A, now: u64, cost: u64, _: &Stats) -> Decision {
        cell.with(|state| algo.step_locked(state, now, cost))
    }
}

/// A keyed rate limiter: a `papaya` concurrent map (hashed with `ahash`) from key to a cell of
/// state, the cell chosen by `V`.
///
/// With [`Cas`] ([`CasLimiter`]) the hot path for a known key is: hash → lock-free lookup →
/// load the state word → pure algorithm step → `compare_exchange_weak` (retried with backoff on
/// a lost race). It takes no lock and allocates nothing. A key seen for the first time is
/// inserted (one allocation). With [`Locked`] ([`MutexLimiter`]) the same map holds each key's
/// state behind a `parking_lot::Mutex`.
///
/// **Consistency.** Decisions are linearizable per key: whatever the threads and
/// interleavings, they equal those of some sequential order of the same requests. At one fixed
/// `now`, N threads firing at one key get exactly as many allowed as one thread would.
/// Different keys are independent.
///
/// Look-ups borrow: a `KeyedLimiter<String, _>` is checked with `&str`, so a request
/// allocates nothing for a known key.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = CasLimiter::<String, _, _>::with_clock("10/s burst 2".parse::<Gcra>()?, clock.clone());
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
    map: papaya::HashMap<K, V::Cell, ahash::RandomState>,
    algo: A,
    clock: C,
    stats: Stats,
}

/// The lock-free keyed limiter.
pub type CasLimiter<K, A, C = QuantaClock> = KeyedLimiter<K, A, C, Cas>;

/// The pessimistic twin: the same map and algorithm, each key's state behind a mutex.
pub type MutexLimiter<K, A, C = QuantaClock> = KeyedLimiter<K, A, C, Locked>;

impl<K, A, V> KeyedLimiter<K, A, QuantaClock, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    V: Variant<A>,
{
    /// A limiter running `algo` on the default (`quanta`) clock.
    pub fn new(algo: A) -> Self {
        Self::with_clock(algo, QuantaClock::new())
    }
}

impl<K, A, C, V> KeyedLimiter<K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// A limiter running `algo` on `clock`.
    pub fn with_clock(algo: A, clock: C) -> Self {
        Self {
            map: papaya::HashMap::builder()
                .hasher(ahash::RandomState::new())
                .build(),
            algo,
            clock,
            stats: Stats::default(),
        }
    }

    /// Decides a request of cost 1 for `key`.
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Cost 1 never exceeds a capacity (capacities are at least 1).
        self.decide(key, 1)
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
        check_cost(cost, self.algo.capacity())?;
        Ok(self.decide(key, cost))
    }

    #[inline]
    fn decide<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Clock first: the TSC read is not serializing, so it overlaps the hash and probe.
        let now = self.clock.now();
        let guard = self.map.guard();
        let cell = self.cell(key, &guard);
        V::step(cell, &self.algo, now, cost, &self.stats)
    }

    /// The cell for `key`, inserted fresh on first sight.
    #[inline(always)]
    fn cell<'g, Q>(&self, key: &Q, guard: &'g impl papaya::Guard) -> &'g V::Cell
    where
        K: Borrow<Q> + 'g,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(cell) = self.map.get(key, guard) {
            return cell;
        }
        // `try_insert`, not `get_or_insert_with`: in papaya 0.2.5, filling a map through
        // `get_or_insert_with` under incremental resizing left later reads ~13x slower
        // (1.35 us vs 0.10 us per get at 1M keys, measured); `try_insert` does not.
        match self
            .map
            .try_insert(key.to_owned(), V::new_cell(&self.algo), guard)
        {
            Ok(cell) => cell,
            Err(occupied) => occupied.current,
        }
    }

    /// The number of keys held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.algo
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// CAS retries so far (always zero for the [`Locked`] variant).
    pub fn cas_stats(&self) -> CasStats {
        self.stats.snapshot()
    }
}

impl<K, C> KeyedLimiter<K, Gcra, C, Cas>
where
    K: Hash + Eq + Send + Sync,
    C: Clock,
{
    /// Pacing: admits a request of `cost` for `key` now with the delay after which it
    /// conforms, if that delay is at most `max_wait`; otherwise counts nothing.
    /// See [`Gcra::reserve`].
    ///
    /// ```
    /// use hotlimit::{algo::{Gcra, Reservation}, CasLimiter, ManualClock};
    /// use std::time::Duration;
    ///
    /// let l = CasLimiter::<u32, _, _>::with_clock("10/s burst 1".parse::<Gcra>()?, ManualClock::new());
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
        check_cost(cost, self.algo.capacity())?;
        let max_wait = duration_to_nanos(max_wait);
        let guard = self.map.guard();
        let cell = self.cell(key, &guard);
        let now = self.clock.now();
        Ok(cell.update(&self.stats, |tat| {
            self.algo.reserve(tat, now, cost, max_wait)
        }))
    }
}

impl<K, C> KeyedLimiter<K, Gcra, C, Locked>
where
    K: Hash + Eq + Send + Sync,
    C: Clock,
{
    /// Pacing, as [`CasLimiter::reserve`](KeyedLimiter::reserve).
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
        check_cost(cost, self.algo.capacity())?;
        let max_wait = duration_to_nanos(max_wait);
        let guard = self.map.guard();
        let cell = self.cell(key, &guard);
        let now = self.clock.now();
        Ok(cell.with(|tat| {
            let (outcome, new) = self.algo.reserve(*tat, now, cost, max_wait);
            *tat = new.unwrap_or(*tat);
            outcome
        }))
    }
}

impl<K, Q, A, C, V> RateLimiter<Q> for KeyedLimiter<K, A, C, V>
where
    K: Hash + Eq + Send + Sync + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    #[inline]
    fn check_n(&self, key: &Q, cost: u64) -> Result<Decision, CostError> {
        KeyedLimiter::check_n(self, key, cost)
    }

    #[inline]
    fn check(&self, key: &Q) -> Decision {
        KeyedLimiter::check(self, key)
    }

    fn len(&self) -> usize {
        KeyedLimiter::len(self)
    }
}

impl<K: Hash + Eq, A: Algorithm + fmt::Debug, C: fmt::Debug, V: Variant<A>> fmt::Debug
    for KeyedLimiter<K, A, C, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("algo", &self.algo)
            .field("clock", &self.clock)
            .field("keys", &self.map.len())
            .field("cas", &self.stats)
            .finish()
    }
}

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
            cell: CachePadded::new(V::new_cell(&algo)),
            algo,
            clock,
            stats: Stats::default(),
        }
    }

    /// Decides a request of cost 1.
    #[inline]
    pub fn check(&self) -> Decision {
        V::step(&self.cell, &self.algo, self.clock.now(), 1, &self.stats)
    }

    /// Decides a request of `cost`; errors if it is 0 or can never be admitted.
    #[inline]
    pub fn check_n(&self, cost: u64) -> Result<Decision, CostError> {
        check_cost(cost, self.algo.capacity())?;
        Ok(V::step(
            &self.cell,
            &self.algo,
            self.clock.now(),
            cost,
            &self.stats,
        ))
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

/// A benchmark baseline: a plain `HashMap` split into mutex-guarded shards, the way many
/// hand-rolled limiters are written. Same algorithms (locked form), same decisions.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, ShardedLimiter, ManualClock};
///
/// let l = ShardedLimiter::<u64, _, _>::with_clock("1/s".parse::<Gcra>()?, ManualClock::new());
/// assert!(l.check(&1).is_allowed());
/// assert!(l.check(&1).is_denied());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub struct ShardedLimiter<K, A: Algorithm, C = QuantaClock> {
    shards: Box<[Shard<K, A::Locked>]>,
    hasher: ahash::RandomState,
    algo: A,
    clock: C,
}

/// One lock-guarded shard, padded so neighbouring locks do not share a cache line.
type Shard<K, S> = CachePadded<Mutex<HashMap<K, S, ahash::RandomState>>>;

impl<K: Hash + Eq + Send, A: Algorithm> ShardedLimiter<K, A, QuantaClock> {
    /// A sharded baseline running `algo` on the default clock.
    pub fn new(algo: A) -> Self {
        Self::with_clock(algo, QuantaClock::new())
    }
}

impl<K: Hash + Eq + Send, A: Algorithm, C: Clock> ShardedLimiter<K, A, C> {
    /// A sharded baseline running `algo` on `clock`, with 4 shards per available core
    /// (rounded up to a power of two).
    pub fn with_clock(algo: A, clock: C) -> Self {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        let shards = (cores * 4).next_power_of_two();
        Self {
            shards: (0..shards)
                .map(|_| CachePadded::new(Mutex::new(HashMap::default())))
                .collect(),
            hasher: ahash::RandomState::new(),
            algo,
            clock,
        }
    }

    /// Decides a request of cost 1 for `key`.
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, 1)
    }

    /// Decides a request of `cost` for `key`.
    pub fn check_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        check_cost(cost, self.algo.capacity())?;
        Ok(self.decide(key, cost))
    }

    fn decide<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // High bits pick the shard; the shard's own map rehashes (a baseline, kept plain).
        let hash = self.hasher.hash_one(key);
        let shard = (hash as usize) & (self.shards.len() - 1);
        let mut map = self.shards[shard].lock();
        let now = self.clock.now();
        if let Some(state) = map.get_mut(key) {
            return self.algo.step_locked(state, now, cost);
        }
        let mut state = self.algo.fresh_locked();
        let decision = self.algo.step_locked(&mut state, now, cost);
        map.insert(key.to_owned(), state);
        decision
    }

    /// The number of keys held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K, Q, A, C> RateLimiter<Q> for ShardedLimiter<K, A, C>
where
    K: Hash + Eq + Send + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
{
    fn check_n(&self, key: &Q, cost: u64) -> Result<Decision, CostError> {
        ShardedLimiter::check_n(self, key, cost)
    }

    fn check(&self, key: &Q) -> Decision {
        ShardedLimiter::check(self, key)
    }

    fn len(&self) -> usize {
        ShardedLimiter::len(self)
    }
}

impl<K, A: Algorithm + fmt::Debug, C: fmt::Debug> fmt::Debug for ShardedLimiter<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedLimiter")
            .field("algo", &self.algo)
            .field("clock", &self.clock)
            .field("shards", &self.shards.len())
            .finish()
    }
}
