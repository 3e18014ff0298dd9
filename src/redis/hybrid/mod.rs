//! The hybrid limiter: every decision local and lock-free, one limit across the fleet through
//! Redis in the background. See [`HybridLimiter`].

mod lease;
mod link;
mod merge;
mod scripts;
mod worker;

use super::{BackendError, Builder};
use crate::algo::{Earrrl, Exponential, FixedWindow, Gcra};
use crate::clock::{duration_to_nanos, Clock, QuantaClock};
use crate::decision::Decision;
use crate::error::{check_cost, ConfigError, CostError, Field};
use crate::limiter::RateLimiter;
use crate::stats::Striped;
use crate::sweeper::SweepReport;
use crate::Algorithm;
use ::redis::Value;
use link::Link;
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a key does while this instance holds no quota for it from Redis: its first requests
/// (before the first sync interval brings a lease or the others' counts) and every request
/// while Redis is unreachable.
///
/// The fallback is the same algorithm with `share` of the quota, decided locally: GCRA with
/// `share` of the rate and of the burst (at least 1); the window algorithms, EARRRL and
/// exponential as if the other instances used all of the quota but `share` of it. What it
/// admits is reconciled when Redis answers: GCRA charges the units it admitted to the shared
/// state, the others publish their own state, which counted them. [`Fallback::DENY`]
/// (share 0) admits nothing without Redis: no over-admission ever, and a key's first requests
/// wait for its first lease (one sync interval at most).
///
/// ```
/// use hotlimit::redis::Fallback;
///
/// // Four instances: each may admit a quarter of the quota on its own.
/// let quarter = Fallback::share(0.25)?;
/// assert_eq!(quarter.local_share(), 0.25);
/// assert!(Fallback::share(1.5).is_err());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fallback {
    share: f64,
}

impl Fallback {
    /// Deny what no lease covers: Redis decides every admission.
    pub const DENY: Fallback = Fallback { share: 0.0 };

    /// Each instance alone admits the whole quota (the default): what the in-memory
    /// limiter does, so an outage costs at most N× the quota for N instances.
    pub const FULL: Fallback = Fallback { share: 1.0 };

    /// `share` of the quota, decided locally; in `(0, 1]`.
    pub fn share(share: f64) -> Result<Self, ConfigError> {
        let value = share.to_string();
        if !share.is_finite() {
            return Err(ConfigError::NotFinite {
                field: Field::Share,
                value,
            });
        }
        if share <= 0.0 {
            return Err(ConfigError::TooSmall {
                field: Field::Share,
                value,
                min: "a share above 0 (Fallback::DENY for none)",
            });
        }
        if share > 1.0 {
            return Err(ConfigError::TooLarge {
                field: Field::Share,
                value,
                max: "1 (the whole quota)",
            });
        }
        Ok(Fallback { share })
    }

    /// The share of the quota decided locally (0 for [`Fallback::DENY`]).
    pub fn local_share(&self) -> f64 {
        self.share
    }
}

impl Default for Fallback {
    fn default() -> Self {
        Fallback::FULL
    }
}

/// The hybrid limiter's counters; from [`HybridLimiter::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HybridStats {
    /// Sync intervals run.
    pub ticks: u64,
    /// Script calls sent (one per key per interval at most: a key is queued once).
    pub calls: u64,
    /// Round trips to Redis (a pipeline of calls is one on a single server).
    pub round_trips: u64,
    /// Calls that failed on an outage; the key's state is sent again next interval.
    pub failed_calls: u64,
    /// Calls that failed otherwise (a script error, a bad reply); also sent again.
    pub errors: u64,
    /// Decisions made by the [`Fallback`] (no lease yet, or Redis unreachable).
    pub degraded: u64,
    /// GCRA units leased from Redis.
    pub leased: u64,
    /// GCRA units handed back unspent.
    pub returned: u64,
    /// GCRA units admitted without a lease (or denied under a strict policy) and charged to
    /// Redis afterwards.
    pub charged: u64,
    /// Requests for a new key denied because [`max_keys`](HybridBuilder::max_keys) keys were
    /// held.
    pub rejected_keys: u64,
}

#[derive(Debug, Default)]
struct Counters {
    ticks: AtomicU64,
    calls: AtomicU64,
    round_trips: AtomicU64,
    failed_calls: AtomicU64,
    errors: AtomicU64,
    /// Written per request (while degraded): striped by thread.
    degraded: Striped,
    leased: AtomicU64,
    returned: AtomicU64,
    charged: AtomicU64,
    /// Written per request (at capacity): striped by thread.
    rejected_keys: Striped,
}

/// What every key's decisions share: this instance's id, the clock offset to Redis' time,
/// whether Redis is reachable, the fallback, the counters.
#[derive(Debug)]
pub struct Ctx {
    /// This instance's field in the merged hashes (random, per limiter).
    instance: String,
    interval: u64,
    /// Redis' time (ns since the Unix epoch) minus the local clock.
    offset: AtomicU64,
    down: AtomicBool,
    /// Local time of the next sync.
    next_tick: AtomicU64,
    share: f64,
    fallback_gcra: Option<Gcra>,
    stats: Counters,
    /// The last failed call's error.
    last_error: Mutex<Option<String>>,
}

impl Ctx {
    #[inline]
    fn shared_now(&self, local: u64) -> u64 {
        local.saturating_add(self.offset.load(Ordering::Relaxed))
    }

    #[inline]
    fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    fn share(&self) -> f64 {
        self.share
    }

    /// The wait until the next sync: a denial for want of a lease lasts at least that.
    fn until_tick(&self, now: u64) -> u64 {
        self.next_tick
            .load(Ordering::Relaxed)
            .saturating_sub(now)
            .clamp(1, self.interval.max(1))
    }

    /// Redis said `redis_ns` at about local time `local`.
    fn observe_time(&self, redis_ns: u64, local: u64) {
        self.offset
            .store(redis_ns.saturating_sub(local), Ordering::Relaxed);
    }
}

/// What the sync thread does with a key this interval.
#[derive(Debug)]
pub enum Step<S> {
    /// Nothing, and forget it until a request queues it again.
    Skip,
    /// Nothing now; look again next interval.
    Keep,
    /// Call the script with these arguments.
    Call(Vec<String>, S),
}

/// How an algorithm runs in the hybrid limiter. Sealed: implemented for [`Gcra`] (leases)
/// and for [`FixedWindow`], [`SlidingWindow`](crate::algo::SlidingWindow), [`Earrrl`] and
/// [`Exponential`] (merged states).
pub trait HybridAlgorithm: Engine {}

impl HybridAlgorithm for Gcra {}
impl HybridAlgorithm for FixedWindow {}
impl HybridAlgorithm for crate::algo::SlidingWindow {}
impl HybridAlgorithm for Earrrl {}
impl HybridAlgorithm for Exponential {}

mod private {
    use super::*;

    /// One algorithm's local state per key and its sync (sealed: the trait is not nameable).
    pub trait Engine: Algorithm + Clone + fmt::Debug + Send + Sync + 'static {
        /// Per-key state.
        type Entry: Send + Sync + 'static;
        /// What a call sent, for when it fails.
        type Sent: Send;
        /// The Lua script.
        const SCRIPT: &'static str;
        /// Appended to the Redis key (`:h` for the merged hashes).
        const SUFFIX: &'static str;
        /// More keys of the script, the Redis key with these appended (same slot).
        const EXTRA_KEYS: &'static [&'static str];

        /// GCRA's fallback with `share` of the quota; `None` for the others (their fallback
        /// is [`Merge::degraded`](merge::Merge::degraded)).
        fn lease_fallback(&self, _share: f64) -> Option<Gcra> {
            None
        }

        /// A new key's state.
        fn entry(&self) -> Self::Entry;
        /// Decides (counts if `write`) a request at local time `now`; `None`: the entry was
        /// swept, look the key up again.
        fn decide(
            &self,
            ctx: &Ctx,
            e: &Self::Entry,
            now: u64,
            cost: u64,
            write: bool,
        ) -> Option<Decision>;
        /// The call for this interval.
        fn prepare(&self, ctx: &Ctx, e: &Self::Entry, now: u64, closing: bool) -> Step<Self::Sent>;
        /// Applies a reply; `Ok(true)`: sync the key again next interval.
        fn apply(
            &self,
            ctx: &Ctx,
            e: &Self::Entry,
            reply: Value,
            sent: Self::Sent,
            now: u64,
        ) -> Result<bool, String>;
        /// The call failed.
        fn failed(&self, ctx: &Ctx, e: &Self::Entry, sent: Self::Sent);
        /// Tombstones an idle entry: `true` if it may be removed.
        fn kill(&self, ctx: &Ctx, e: &Self::Entry, now: u64) -> bool;
    }
}
use private::Engine;

#[derive(Debug)]
pub struct Slot<E> {
    redis_key: String,
    queued: AtomicBool,
    e: E,
}

struct Shared<A: Engine, C> {
    algo: A,
    clock: C,
    ctx: Ctx,
    map: papaya::HashMap<Box<str>, Arc<Slot<A::Entry>>, ahash::RandomState>,
    queue: Mutex<Vec<Arc<Slot<A::Entry>>>>,
    stop: AtomicBool,
    max_keys: usize,
    prefix: String,
}

/// A rate limiter whose decisions are local (the crate's lock-free cells, tens of
/// nanoseconds) and whose limit is the fleet's: a background thread reconciles every key
/// with Redis (a server or a Redis Cluster) once per sync interval. Enabled by the `redis`
/// feature; from [`HybridLimiter::builder`].
///
/// ```no_run
/// use hotlimit::algo::Gcra;
/// use hotlimit::redis::{Fallback, HybridLimiter};
/// use std::time::Duration;
///
/// // 100/s with bursts of 20 per client, shared by every instance using this Redis.
/// let limiter = HybridLimiter::builder("redis://127.0.0.1:6379/", "100/s burst 20".parse::<Gcra>()?)
///     .key_prefix("api:")
///     .sync_interval(Duration::from_millis(10))
///     .fallback(Fallback::share(0.25)?) // 4 instances: a quarter each while Redis is away
///     .build()?;
/// let d = limiter.check("203.0.113.7");
/// println!("{} (stats: {:?})", d.is_allowed(), limiter.stats());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # How each algorithm is shared
///
/// **GCRA: leases.** Per key, an instance holds a lease: units reserved in the shared GCRA
/// state (`LEASE` script: the shared TAT advances by every unit granted, exactly as if that
/// many requests had been admitted) and spent locally by CAS. Each interval the lease is
/// renewed to about two intervals of the key's recent demand on this instance (at most the
/// burst); a key quiet for three of its usual gaps between requests (2 to 100 intervals)
/// hands its lease back (the TAT moves back by those units, never below now), so a quiet
/// key does not hold quota a busy instance needs, while a sparse one keeps its unit. Every
/// unit admitted from a lease was reserved in Redis, so leases never over-admit: over any
/// span the fleet admits at most `rate × span + burst`. Units admitted by the [`Fallback`]
/// are charged to the shared TAT afterwards (under [`Policy::Strict`](crate::Policy), denied
/// units too): a key's first requests as of the charge, an outage's back-dated to when they
/// were admitted (on a TAT of their own, so a fleet whose shares add up to at most 1 owes
/// nothing afterwards). Before its charge arrives, the fallback may admit beyond the limit
/// its own burst (`max(1, ⌊share × burst⌋)`) per instance: when an instance first sees a key
/// (one the others have exhausted too) or an outage starts; the excess is paid back by
/// denials, as the charged TAT runs ahead. [`Fallback::DENY`] never over-admits.
/// The TAT key is the one the [`RedisLimiter`](super::RedisLimiter) uses, in the same form:
/// a `RedisLimiter<Gcra>` with the same prefix and quota shares the limit.
///
/// **Window algorithms, EARRRL, exponential: merged states.** Each instance keeps its own
/// traffic's state (the algorithm's own word) and, each interval in which the key had
/// requests here, publishes it whole in a hash per key (`<prefix>{key}:h`, a field per
/// instance) and reads the others' back. A
/// decision runs the algorithm's step on the union: its own state merged with the others'
/// last published ones. Publishing a whole state, not a delta, makes a retried publish
/// idempotent. What is exact and what lags:
/// - *fixed and sliding window*: counts add exactly, per window index in Redis' time (windows
///   are aligned to the Unix epoch). What lags is the others' traffic since their last
///   publish: the fleet may exceed a window's limit by what the other instances admit within
///   one sync interval plus a round trip: at most (N−1) limits in the worst case, if each
///   of N instances alone could fill a window within one interval.
/// - *EARRRL*: its rate is a sum of decayed impulses, so the rate of the union is the sum of
///   the instances' rates, exactly (the states merge by log-sum-exp). It lags by the others'
///   impulses of the last interval; their published part decays exactly.
/// - *exponential*: each instance's average is exact for its own traffic; the union's is
///   their sum decayed to a common time, which Exim's average equals for steady traffic and
///   bursts, but not request for request: Exim weighs each request by the interval since the
///   previous one, and the union's intervals are shorter. It lags as EARRRL does.
///
/// Times are Redis' (`TIME`), through an offset to the local clock refreshed at every sync
/// (off by up to half a round trip).
///
/// # Outages
///
/// When a sync fails on an outage ([`BackendError::is_outage`]), the limiter keeps deciding
/// locally: leases are spent to the last unit, and what they do not cover goes to the
/// [`Fallback`]; each such decision is counted ([`HybridStats::degraded`]). A failed call is
/// sent again the next interval, never dropped: GCRA keeps its debt until it is charged (a
/// call whose reply was lost may have charged it already: charged twice errs strict; the
/// units it handed back are not taken again), merged states publish their newest state, which
/// holds everything the failed one held. Any other error (a script error, a wrong type) is
/// counted in [`HybridStats::errors`] and handled the same way.
///
/// # Cost
///
/// `check` is a map lookup, a clock read and one CAS (GCRA: on the lease counter; merged
/// states: on the own word, after merging with the others' word). It allocates only for a
/// key's first request and takes a lock only once per key per interval: the first check
/// after a sync pushes the key on the sync thread's queue. The sync thread makes at most one script call
/// per key per interval, pipelined in one round trip on a single server, one per key on a
/// cluster. Keys idle for a while (nothing leased, owed or counted) are removed by the sync
/// thread, losing nothing.
pub struct HybridLimiter<A: HybridAlgorithm, C: Clock = QuantaClock> {
    shared: Arc<Shared<A, C>>,
    thread: Option<JoinHandle<()>>,
}

impl<A: HybridAlgorithm, C: Clock> fmt::Debug for HybridLimiter<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HybridLimiter")
            .field("algorithm", &self.shared.algo)
            .field("prefix", &self.shared.prefix)
            .field(
                "sync_interval",
                &Duration::from_nanos(self.shared.ctx.interval),
            )
            .field("fallback_share", &self.shared.ctx.share)
            .field("keys", &self.shared.map.len())
            .finish()
    }
}

/// Configures a [`HybridLimiter`]; from [`HybridLimiter::builder`]. The connection settings
/// are the [`RedisLimiter`](super::RedisLimiter)'s ([`Builder`]).
#[derive(Debug, Clone)]
pub struct HybridBuilder<A, C = QuantaClock> {
    redis: Builder<A>,
    clock: C,
    interval: Duration,
    fallback: Fallback,
    max_keys: usize,
}

impl<A: HybridAlgorithm> HybridLimiter<A> {
    /// A builder for a limiter over the Redis at `url` (`redis://host:port/`), deciding with
    /// `algo`.
    pub fn builder(url: impl Into<String>, algo: A) -> HybridBuilder<A> {
        HybridBuilder {
            redis: Builder::new(url.into(), algo),
            clock: QuantaClock::new(),
            interval: Duration::from_millis(10),
            fallback: Fallback::default(),
            max_keys: 1 << 20,
        }
    }
}

impl<A: HybridAlgorithm, C: Clock> HybridBuilder<A, C> {
    /// The prefix of every Redis key (default `hotlimit:`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.redis.prefix = prefix.into();
        self
    }

    /// How often keys are reconciled with Redis (default 10 ms; at least 1 ms). Shorter:
    /// tighter window bounds and fresher merged states, more calls.
    pub fn sync_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// What keys do without quota from Redis (default [`Fallback::FULL`]).
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// The most keys held in memory (default 2^20); a new key beyond is denied until the
    /// sync thread removes idle ones ([`HybridStats::rejected_keys`]).
    pub fn max_keys(mut self, max: usize) -> Self {
        self.max_keys = max.max(1);
        self
    }

    /// The TCP connect timeout (default 250 ms).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.redis.connect_timeout = t;
        self
    }

    /// The read and write timeout of each round trip (default 500 ms).
    pub fn io_timeout(mut self, t: Duration) -> Self {
        self.redis.io_timeout = t;
        self
    }

    /// After a failed connect, how long syncs fail at once before connecting again (default
    /// 100 ms).
    pub fn reconnect_after(mut self, t: Duration) -> Self {
        self.redis.reconnect_after = t;
        self
    }

    /// More Redis Cluster seeds; makes the client a cluster client (see [`Builder::seed_nodes`]).
    pub fn seed_nodes<S: Into<String>>(mut self, urls: impl IntoIterator<Item = S>) -> Self {
        self.redis.seeds.extend(urls.into_iter().map(Into::into));
        self
    }

    /// The local clock (default [`QuantaClock`]). Decisions read it; the sync thread keeps
    /// its offset to Redis' time.
    pub fn clock<C2: Clock>(self, clock: C2) -> HybridBuilder<A, C2> {
        HybridBuilder {
            redis: self.redis,
            clock,
            interval: self.interval,
            fallback: self.fallback,
            max_keys: self.max_keys,
        }
    }

    /// Connects (failing if the URL is invalid or Redis cannot be reached now) and starts
    /// the sync thread (`hotlimit-hybrid`).
    pub fn build(self) -> Result<HybridLimiter<A, C>, BackendError> {
        let link = Link::open(self.redis.clone())?;
        let algo = self.redis.algo.clone();
        let share = self.fallback.share;
        let fallback_gcra = if share > 0.0 {
            algo.lease_fallback(share)
        } else {
            None
        };
        let now = self.clock.now();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, duration_to_nanos);
        let interval = duration_to_nanos(self.interval);
        let shared = Arc::new(Shared {
            algo,
            ctx: Ctx {
                instance: format!("{:016x}", fastrand::u64(..)),
                interval,
                offset: AtomicU64::new(unix.saturating_sub(now)),
                down: AtomicBool::new(false),
                next_tick: AtomicU64::new(now.saturating_add(interval)),
                share,
                fallback_gcra,
                stats: Counters::default(),
                last_error: Mutex::new(None),
            },
            clock: self.clock,
            map: papaya::HashMap::builder()
                .hasher(ahash::RandomState::new())
                .build(),
            queue: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            max_keys: self.max_keys,
            prefix: self.redis.prefix.clone(),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("hotlimit-hybrid".into())
            .spawn(move || worker::sync_loop(&worker, link, self.interval))
            .map_err(|e| BackendError::Reply(format!("cannot start the sync thread: {e}")))?;
        Ok(HybridLimiter {
            shared,
            thread: Some(thread),
        })
    }
}

impl<A: HybridAlgorithm, C: Clock> HybridLimiter<A, C> {
    /// Decides a request of cost 1 for `key`, counting it.
    #[inline]
    pub fn check(&self, key: &str) -> Decision {
        match self.decide(key, 1, true) {
            Ok(d) => d,
            // Cost 1 is valid for every algorithm (capacity ≥ 1).
            Err(_) => Decision::denied(1),
        }
    }

    /// Decides a request of `cost` for `key`, counting it; a cost that can never be
    /// admitted is a [`CostError`].
    #[inline]
    pub fn check_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        self.decide(key, cost, true)
    }

    /// What [`check`](Self::check) would answer now, without counting.
    pub fn peek(&self, key: &str) -> Decision {
        self.peek_n(key, 1).unwrap_or_else(|_| Decision::denied(1))
    }

    /// What [`check_n`](Self::check_n) would answer now, without counting.
    pub fn peek_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        self.decide(key, cost, false)
    }

    /// Checks until allowed, sleeping (on the limiter's clock) for each denial's
    /// `retry_after`, at least 1 ms.
    pub fn until_ready_blocking(&self, key: &str) -> Decision {
        // Not the in-memory limiters' loop (`wait::until_ready_blocking`): it peeks before
        // it checks, and a peek asks Redis for nothing, so a waiter on an empty lease would
        // wait for a lease nobody asks for. Each check here is the demand that brings it.
        loop {
            let d = self.check(key);
            if d.is_allowed() {
                return d;
            }
            self.shared
                .clock
                .sleep(d.retry_after().max(Duration::from_millis(1)));
        }
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.shared.algo
    }

    /// The keys held in memory.
    pub fn len(&self) -> usize {
        self.shared.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the last sync found Redis unreachable (decisions use the [`Fallback`]).
    pub fn is_degraded(&self) -> bool {
        self.shared.ctx.is_down()
    }

    /// The last error a sync met (an outage or another failure), if any: what
    /// [`HybridStats::failed_calls`] and [`HybridStats::errors`] count.
    pub fn last_error(&self) -> Option<String> {
        self.shared.ctx.last_error.lock().clone()
    }

    /// The counters.
    pub fn stats(&self) -> HybridStats {
        let s = &self.shared.ctx.stats;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HybridStats {
            ticks: r(&s.ticks),
            calls: r(&s.calls),
            round_trips: r(&s.round_trips),
            failed_calls: r(&s.failed_calls),
            errors: r(&s.errors),
            degraded: s.degraded.sum(),
            leased: r(&s.leased),
            returned: r(&s.returned),
            charged: r(&s.charged),
            rejected_keys: s.rejected_keys.sum(),
        }
    }

    /// The Redis key holding `key`'s shared state.
    pub fn redis_key(&self, key: &str) -> String {
        redis_key(&self.shared.prefix, key, A::SUFFIX)
    }

    fn decide(&self, key: &str, cost: u64, write: bool) -> Result<Decision, CostError> {
        check_cost(cost, self.shared.algo.capacity())?;
        let s = &*self.shared;
        let now = s.clock.now();
        let map = s.map.pin();
        loop {
            let slot = match map.get(key) {
                Some(slot) => slot,
                None if !write => {
                    // A peek at an unknown key: what its first request would meet.
                    let e = s.algo.entry();
                    return Ok(s
                        .algo
                        .decide(&s.ctx, &e, now, cost, false)
                        .unwrap_or_else(|| Decision::denied(1)));
                }
                None => {
                    if map.len() >= s.max_keys {
                        s.ctx.stats.rejected_keys.incr();
                        return Ok(Decision::denied(s.ctx.until_tick(now)));
                    }
                    let slot = Arc::new(Slot {
                        redis_key: redis_key(&s.prefix, key, A::SUFFIX),
                        queued: AtomicBool::new(false),
                        e: s.algo.entry(),
                    });
                    match map.try_insert(key.into(), slot) {
                        Ok(slot) => slot,
                        Err(occupied) => occupied.current,
                    }
                }
            };
            if let Some(d) = s.algo.decide(&s.ctx, &slot.e, now, cost, write) {
                if write
                    && !slot.queued.load(Ordering::Relaxed)
                    && !slot.queued.swap(true, Ordering::AcqRel)
                {
                    s.queue.lock().push(Arc::clone(slot));
                }
                return Ok(d);
            }
            // Swept: the sync thread removes it right after; look again.
            std::thread::yield_now();
        }
    }
}

fn redis_key(prefix: &str, key: &str, suffix: &str) -> String {
    let mut k = super::shared::redis_key(prefix, key);
    k.push_str(suffix);
    k
}

impl<A: HybridAlgorithm, C: Clock> Drop for HybridLimiter<A, C> {
    /// Stops the sync thread after a last sync: leases handed back, states published (within
    /// the I/O timeout).
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// The hybrid limiter as a [`RateLimiter<str>`]: every call is local, so through the
/// blanket [`AsyncRateLimiter`](crate::AsyncRateLimiter) impl it never blocks an async task
/// (the tower layer takes it as it takes the in-memory limiters).
impl<A: HybridAlgorithm, C: Clock> RateLimiter<str> for HybridLimiter<A, C> {
    fn check_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        HybridLimiter::check_n(self, key, cost)
    }

    fn check(&self, key: &str) -> Decision {
        HybridLimiter::check(self, key)
    }

    fn peek_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        HybridLimiter::peek_n(self, key, cost)
    }

    fn peek(&self, key: &str) -> Decision {
        HybridLimiter::peek(self, key)
    }

    fn until_ready_blocking(&self, key: &str) -> Decision {
        HybridLimiter::until_ready_blocking(self, key)
    }

    fn len(&self) -> usize {
        HybridLimiter::len(self)
    }

    /// Idle keys are removed by the sync thread every second; this sweeps now.
    fn sweep(&self) -> SweepReport {
        worker::sweep(&self.shared)
    }
}

/// The algorithm's quota, as the in-memory limiters advertise it.
#[cfg(feature = "http")]
impl<A, C> crate::headers::AdvertisedQuota for HybridLimiter<A, C>
where
    A: HybridAlgorithm + crate::headers::AdvertisedQuota,
    C: Clock,
{
    fn advertised_quota(&self) -> Option<crate::headers::QuotaPolicy> {
        self.shared.algo.advertised_quota()
    }
}
