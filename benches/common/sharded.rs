//! The baseline the benchmarks, the load test and the store-equivalence tests measure hotlimit
//! against: [`ShardedLimiter`], a plain `HashMap` split into mutex-guarded shards, the way many
//! hand-rolled limiters are written. Built on hotlimit's public API only (the algorithms are
//! pure state machines), so it is not part of the library. Included by path from
//! `benches/common`, `tests/common` and `examples/loadtest`.

use crossbeam_utils::CachePadded;
use hotlimit::algo::{Algorithm, CLOCK_MAX};
use hotlimit::Metrics;
use hotlimit::{Clock, Decision, QuantaClock, QuotaError, RateLimiter};
use parking_lot::Mutex;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

/// A sharded `Mutex<HashMap>` running a hotlimit algorithm: same algorithms, same decisions
/// as the crate's limiters. Not a choice for production use.
pub struct ShardedLimiter<K, A: Algorithm, C = QuantaClock> {
    shards: Box<[Shard<K, A::State>]>,
    hasher: ahash::RandomState,
    algo: A,
    clock: C,
}

/// One lock-guarded shard, padded so neighbouring locks do not share a cache line.
type Shard<K, S> = CachePadded<Mutex<HashMap<K, S, ahash::RandomState>>>;

impl<K: Hash + Eq + Send, A: Algorithm> ShardedLimiter<K, A, QuantaClock> {
    /// A sharded baseline running `algo` on the default clock.
    pub fn new(algo: A) -> Self {
        Self::with_clock(algo, QuantaClock::default())
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
    pub fn check_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, QuotaError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.admissible(cost)?;
        Ok(self.decide(key, cost))
    }

    /// The decision [`check_n`](Self::check_n) would return now, without counting it.
    pub fn peek_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, QuotaError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.admissible(cost)?;
        Ok(self.peek_at(key, cost))
    }

    /// The decision [`check`](Self::check) would return now, without counting it.
    pub fn peek<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.peek_at(key, 1)
    }

    /// Waits on the calling thread (sleeping with the clock) until a request of cost 1 for
    /// `key` is allowed; the denial if that lies past the clock's range.
    pub fn until_ready_blocking<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        loop {
            let peeked = self.peek_at(key, 1);
            let denied = if peeked.is_allowed() {
                let decided = self.decide(key, 1);
                if decided.is_allowed() {
                    return decided;
                }
                decided
            } else {
                peeked
            };
            let wait = denied.retry_after();
            let reachable = u64::try_from(wait.as_nanos())
                .ok()
                .and_then(|w| self.clock.now().checked_add(w))
                .is_some_and(|at| at <= CLOCK_MAX);
            if !reachable {
                return denied;
            }
            self.clock.sleep(wait);
        }
    }

    /// The number of keys held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops idle keys, shard by shard (each shard locked while it is swept).
    pub fn sweep(&self) -> Metrics {
        let started = Instant::now();
        let now = self.clock.now().min(CLOCK_MAX);
        let mut report = Metrics::default();
        for shard in self.shards.iter() {
            let mut map = shard.lock();
            let before = map.len();
            map.retain(|_, state| self.algo.idle_at(state) > now);
            report.scanned += before as u64;
            report.evicted_idle += (before - map.len()) as u64;
        }
        report.sweep_busy = started.elapsed();
        report
    }

    fn admissible(&self, cost: u64) -> Result<(), QuotaError> {
        let capacity = self.algo.capacity();
        match cost {
            0 => Err(QuotaError::ZeroCost),
            c if c > capacity => Err(QuotaError::ExceedsCapacity { cost, capacity }),
            _ => Ok(()),
        }
    }

    /// The shard holding `key`: the hash's low bits pick it; the shard's own map rehashes (a
    /// baseline, kept plain).
    #[inline]
    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> &Shard<K, A::State> {
        let hash = self.hasher.hash_one(key);
        &self.shards[(hash as usize) & (self.shards.len() - 1)]
    }

    fn decide<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // The clock is read before the lock, as the keyed limiter reads it before its lookup:
        // a TSC read inside the critical section would handicap the baseline.
        let now = self.clock.now();
        let mut map = self.shard(key).lock();
        if let Some(state) = map.get_mut(key) {
            return self.algo.update(state, now, cost);
        }
        let mut state = self.algo.fresh();
        let decision = self.algo.update(&mut state, now, cost);
        map.insert(key.to_owned(), state);
        decision
    }

    fn peek_at<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.clock.now();
        let map = self.shard(key).lock();
        match map.get(key) {
            Some(state) => self.algo.peek(state, now, cost),
            None => self.algo.peek(&self.algo.fresh(), now, cost),
        }
    }
}

impl<K, Q, A, C> RateLimiter<Q> for ShardedLimiter<K, A, C>
where
    K: Hash + Eq + Send + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
{
    fn check_n(&self, key: &Q, cost: u64) -> Result<Decision, QuotaError> {
        ShardedLimiter::check_n(self, key, cost)
    }

    fn check(&self, key: &Q) -> Decision {
        ShardedLimiter::check(self, key)
    }
}
