//! The hybrid limiter: every decision local and lock-free, one limit across the fleet through
//! Redis in the background. See [`HybridLimiter`].
//!
//! The parts: `cell.rs` (the entries in the core's keyed store), `lease.rs` (GCRA: leases
//! and the view of the shared TAT), `merge.rs` (windows, EARRRL, exponential: merged states),
//! `worker.rs` (the sync thread), `push.rs` (the subscription that brings every instance's
//! changes), `link.rs` (the sync thread's connection), `scripts.rs` (the Lua).

mod cell;
mod lease;
mod link;
mod merge;
mod push;
mod scripts;
mod worker;

use super::{BackendError, Builder};
use crate::algo::{clamp, Earrrl, Exponential, FixedWindow, Gcra, SlidingWindow};
use crate::cell::StateCells;
use crate::clock::{duration_to_nanos, Clock, QuantaClock};
use crate::decision::{Decision, Policy};
use crate::error::{ConfigError, CostError, Field};
use crate::keyed::Shared;
use crate::limiter::RateLimiter;
use crate::shared::Options;
use crate::stats::{Metrics, Stats, Striped};
use crate::sweeper::{SweepReport, Sweeper};
use crate::Algorithm;
use ::redis::Value;
use cell::{Hybrid, HybridCell};
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a key does while this instance holds no quota for it from Redis: requests beyond its
/// GCRA lease, a key's requests before the fleet's state of it is known (the first seconds
/// after the limiter subscribes), and every request while Redis is unreachable.
///
/// Each instance may decide `share` of the quota on its own:
/// - *GCRA*: beyond its lease, an instance admits at most `⌊share × burst⌋` units ahead of
///   what Redis has been told (charged at the next sync), and only where the fleet's TAT as
///   this instance knows it has room; where that TAT is not known, or Redis is away, it
///   admits at `share` of the rate with a burst of `⌊share × burst⌋`, continuing from the
///   fleet's TAT as last known.
/// - *fixed and sliding window, exponential*: where the others' states are not known, they
///   are taken to hold all of the limit but `⌊share × limit⌋`.
/// - *EARRRL*: likewise, the others' rate taken as `(1 − share) × R` (a rate: nothing is
///   rounded).
///
/// The rule is the same for every algorithm: each instance's part must be at least one
/// request. A share whose part rounds to nothing (`share(0.25)` of a limit of 2 is half a
/// request) is refused by [`HybridBuilder::build`] with a [`ConfigError`] naming the share,
/// rather than quietly becoming [`Fallback::DENY`]. With `N` instances, `share(1/N)` keeps the
/// fleet within the quota even when every instance decides alone.
///
/// [`Fallback::DENY`] (share 0) admits nothing without Redis: GCRA admits only from leases,
/// the others only once the fleet's state is known. What any share admits is reconciled when
/// Redis answers: GCRA charges the units to the shared TAT, the others publish their own
/// state, which counted them.
///
/// ```
/// use hotlimit::redis::Fallback;
///
/// // Four instances: each may decide a quarter of the quota on its own.
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
    /// Nothing decided without Redis: GCRA admits only from leases, the others only on a
    /// known fleet state.
    pub const DENY: Fallback = Fallback { share: 0.0 };

    /// Each instance alone may decide the whole quota (the default): what the in-memory
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

    /// `⌊share × quota⌋`, the units an instance decides alone; an error if a share above 0
    /// leaves less than one.
    fn part(&self, quota: u64) -> Result<u64, ConfigError> {
        let part = (quota as f64 * self.share).floor();
        if self.share > 0.0 && part < 1.0 {
            return Err(ConfigError::TooSmall {
                field: Field::Share,
                value: format!(
                    "{} of a quota of {quota} ({} of a request)",
                    self.share,
                    quota as f64 * self.share
                ),
                min: "a share that leaves each instance at least one request of the quota \
                      (a larger share, or Fallback::DENY)",
            });
        }
        Ok(part as u64)
    }
}

impl Default for Fallback {
    fn default() -> Self {
        Fallback::FULL
    }
}

/// Why the hybrid limiter's sync failed last; from [`HybridLimiter::last_error`]. Cleared by
/// the next sync that reaches Redis without an error.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SyncError {
    /// Redis could not be reached: refused, reset, timed out, a cluster failing over (an
    /// outage: decisions follow the [`Fallback`] meanwhile).
    Outage(Arc<BackendError>),
    /// Redis answered with an error: a script error, a wrong type, out of memory.
    Backend(Arc<BackendError>),
    /// A state in Redis that this limiter cannot read: a limiter of another algorithm (or
    /// another version) on the same key prefix. Use distinct prefixes.
    ForeignState {
        /// The client key.
        key: String,
        /// What was found.
        found: String,
    },
    /// A reply or a pushed message without the shape the scripts give it.
    Malformed(&'static str),
}

impl SyncError {
    fn from_backend(e: BackendError) -> Self {
        if e.is_outage() {
            SyncError::Outage(Arc::new(e))
        } else {
            SyncError::Backend(Arc::new(e))
        }
    }

    /// Whether this is an outage.
    pub fn is_outage(&self) -> bool {
        matches!(self, SyncError::Outage(_))
    }
}

impl fmt::Display for SyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncError::Outage(e) => write!(f, "Redis unreachable: {e}"),
            SyncError::Backend(e) => write!(f, "Redis error: {e}"),
            SyncError::ForeignState { key, found } => write!(
                f,
                "key {key:?}: not a state of this algorithm in Redis: {found:?} (another \
                 limiter on the same prefix?)"
            ),
            SyncError::Malformed(what) => write!(f, "malformed {what}"),
        }
    }
}

impl std::error::Error for SyncError {}

/// The hybrid limiter's counters; from [`HybridLimiter::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HybridStats {
    /// Sync rounds run.
    pub ticks: u64,
    /// Keys sent to Redis (one per key per round at most: a key is queued once).
    pub calls: u64,
    /// Round trips to Redis (a round's keys go in one pipeline on a server, one per node on
    /// a cluster), connects included.
    pub round_trips: u64,
    /// Keys whose sync failed on an outage; sent again next round.
    pub failed_calls: u64,
    /// Keys whose sync failed otherwise (a script error, a state this limiter cannot read).
    pub errors: u64,
    /// Decisions made by the [`Fallback`]: the fleet's state not known yet, or Redis away.
    pub degraded: u64,
    /// Denials because the fleet's state, as this instance knows it, has no room: the
    /// limit reached.
    pub denied_limit: u64,
    /// Denials for want of quota in hand: an empty GCRA lease with this instance's share
    /// spent until the next sync, or the fallback's share spent. Not (yet) the limit.
    pub denied_waiting: u64,
    /// GCRA units leased from Redis.
    pub leased: u64,
    /// GCRA units handed back unspent (quiet keys, evicted keys, the limiter dropped).
    pub returned: u64,
    /// GCRA units admitted beyond a lease (or denied under a strict policy) and charged to
    /// Redis afterwards.
    pub charged: u64,
    /// Keys' states received from the other instances (and this one's own, echoed).
    pub pushes: u64,
    /// Times the subscription was (re)established.
    pub subscribed: u64,
    /// The last sync round's lag: from the start of the round before it (the oldest change
    /// it sent) to its replies. What the others' view of this instance's traffic lags by,
    /// before the push's delivery.
    pub sync_lag: Duration,
    /// The largest sync lag so far.
    pub sync_lag_max: Duration,
    /// The largest delay seen between a state's write in Redis and its push's arrival here.
    pub push_lag_max: Duration,
}

#[derive(Debug, Default)]
struct Counters {
    ticks: AtomicU64,
    calls: AtomicU64,
    round_trips: AtomicU64,
    failed_calls: AtomicU64,
    errors: AtomicU64,
    /// Written per request: striped by thread, as are the denials.
    degraded: Striped,
    denied_limit: Striped,
    denied_waiting: Striped,
    leased: AtomicU64,
    returned: AtomicU64,
    charged: AtomicU64,
    pushes: AtomicU64,
    subscribed: AtomicU64,
    lag: AtomicU64,
    lag_max: AtomicU64,
    push_lag_max: AtomicU64,
}

/// A key the store evicted holding GCRA units or a debt: handed back by the next sync.
#[derive(Debug)]
pub struct Evicted {
    key: String,
    units: u64,
    debt: u64,
    back: bool,
}

/// What every decision, the sync thread and the subscription share.
#[derive(Debug)]
pub struct Ctx {
    /// This instance's id in the merged hashes and in pushes (random, per limiter).
    instance: String,
    interval: u64,
    share: f64,
    /// Redis' time (ns since the Unix epoch) minus the local clock.
    offset: AtomicU64,
    /// Whether the last sync round found Redis unreachable.
    down: AtomicBool,
    /// Local time the current (or last) outage began.
    down_since: AtomicU64,
    /// Local time from which a key this instance has heard nothing of is fresh for the fleet:
    /// a horizon after the subscription started, or at once if no instance wrote within a
    /// horizon before it (the prefix's live marker, `live_key`, is gone); `u64::MAX` while
    /// not subscribed.
    mirror_since: AtomicU64,
    /// Local time of the last (re)subscription, for the sync thread to look at the live
    /// marker after it (0: none yet).
    subscribed_at: AtomicU64,
    /// The sync thread, woken for a new subscription's check.
    sync_thread: std::sync::OnceLock<std::thread::Thread>,
    /// Local time of the next sync round.
    next_tick: AtomicU64,
    stats: Counters,
    last_error: Mutex<Option<SyncError>>,
    /// Keys for the sync thread (each queued once until it takes them).
    queue: Mutex<Vec<String>>,
    /// Keys evicted with units or a debt, to hand back.
    evicted: Mutex<Vec<Evicted>>,
    stop: AtomicBool,
    /// The CAS retries of the sync thread and the subscription (not the requests').
    cas: Stats,
}

/// How a decision was reached: what the stats count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// From a GCRA lease.
    Lease,
    /// On the fleet's state as known (merged states; GCRA beyond its lease).
    Known,
    /// By the fallback: the fleet's state not known, or Redis away.
    Fallback,
    /// Denied for want of quota in hand until the next sync.
    Waiting,
}

/// A decision and what the limiter does about it.
#[derive(Debug, Clone, Copy)]
pub struct Verdict {
    decision: Decision,
    reason: Reason,
    /// Whether the sync thread has something to do for the key.
    sync: bool,
}

/// How a decision is taken for a key: on the fleet's state as known, by the fallback while
/// it is not known yet, or by the fallback while Redis is away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Known,
    Unknown,
    Degraded,
}

impl Ctx {
    /// A context at local time `now`, Unix time `unix` (ns), not subscribed yet.
    fn new(interval: u64, share: f64, now: u64, unix: u64) -> Self {
        Ctx {
            instance: format!("{:016x}", fastrand::u64(..)),
            interval,
            share,
            offset: AtomicU64::new(unix.saturating_sub(now)),
            down: AtomicBool::new(false),
            down_since: AtomicU64::new(now),
            mirror_since: AtomicU64::new(u64::MAX),
            subscribed_at: AtomicU64::new(0),
            sync_thread: std::sync::OnceLock::new(),
            next_tick: AtomicU64::new(now.saturating_add(interval)),
            stats: Counters::default(),
            last_error: Mutex::new(None),
            queue: Mutex::new(Vec::new()),
            evicted: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            cas: Stats::default(),
        }
    }

    #[inline]
    fn shared_now(&self, local: u64) -> u64 {
        clamp(local.saturating_add(self.offset.load(Ordering::Relaxed)))
    }

    #[inline]
    fn local(&self, shared: u64) -> u64 {
        shared.saturating_sub(self.offset.load(Ordering::Relaxed))
    }

    #[inline]
    fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// The mode of a key whose state is `known` (it has heard from the fleet about it).
    #[inline]
    fn mode(&self, known: bool, now: u64) -> Mode {
        if self.is_down() {
            Mode::Degraded
        } else if known || now >= self.mirror_since.load(Ordering::Relaxed) {
            Mode::Known
        } else {
            Mode::Unknown
        }
    }

    /// The wait until the next sync round: a denial for want of quota in hand lasts that.
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

    fn fail(&self, e: SyncError) {
        *self.last_error.lock() = Some(e);
    }

    /// Redis answered cleanly: an outage or a Redis error is over. A state this limiter
    /// cannot read stays reported (it is in Redis until its writer's state idles).
    fn recovered(&self) {
        let mut last = self.last_error.lock();
        if matches!(*last, Some(SyncError::Outage(_) | SyncError::Backend(_))) {
            *last = None;
        }
    }
}

/// What the sync thread does with a key this round.
#[derive(Debug)]
pub enum Visit<S> {
    /// Nothing, and forget it until a request queues it again.
    Skip,
    /// Nothing now; look again next round.
    Keep,
    /// Send the key's arguments (after the client key) in the round's batch.
    Call(Vec<String>, S),
}

/// How an algorithm runs in the hybrid limiter. Sealed: implemented for [`Gcra`] (leases)
/// and for [`FixedWindow`], [`SlidingWindow`], [`Earrrl`] and [`Exponential`] (merged
/// states).
pub trait HybridAlgorithm: Engine {}

impl HybridAlgorithm for Gcra {}
impl HybridAlgorithm for FixedWindow {}
impl HybridAlgorithm for SlidingWindow {}
impl HybridAlgorithm for Earrrl {}
impl HybridAlgorithm for Exponential {}

mod private {
    use super::*;
    use crate::redis::hybrid::push::Reader;

    /// One algorithm's entry, its decisions and its sync (sealed: the trait is not nameable).
    pub trait Engine: Algorithm + Clone + fmt::Debug + Send + Sync + 'static {
        /// The state the store keeps per key: this instance's own and what it knows of the
        /// fleet's.
        type Word: StateCells + Copy + fmt::Debug;
        /// What the limiter fixes at build from the fallback share.
        type Plan: fmt::Debug + Send + Sync + 'static;
        /// The sync thread's bookkeeping of a key it watches.
        type Book: Default + Send + 'static;
        /// What a key's call sent, for when it fails.
        type Sent: Send;
        /// A pushed state, parsed.
        type Pushed;
        /// The batch script.
        const SCRIPT: &'static str;
        /// Appended to the Redis key (`:h` for the merged hashes).
        const SUFFIX: &'static str;
        /// More keys of the script per client key, the Redis key with these appended (same
        /// slot).
        const EXTRA_KEYS: &'static [&'static str];

        /// What `share` fixes; an error if it leaves an instance less than one request.
        fn plan(&self, fallback: Fallback) -> Result<Self::Plan, ConfigError>;
        /// The entry of a key nothing is known of yet.
        fn unknown(&self) -> Self::Word;
        /// Decides a request of `cost` at local time `now` on `w`, updating it.
        fn decide_entry(
            &self,
            plan: &Self::Plan,
            ctx: &Ctx,
            w: &mut Self::Word,
            now: u64,
            cost: u64,
        ) -> Verdict;
        /// The local time from which `w` is equivalent to [`unknown`](Engine::unknown) in a
        /// subscribed limiter, holding nothing: it may be dropped.
        fn entry_idle_at(&self, ctx: &Ctx, w: &Self::Word) -> u64;
        /// How long a state of this quota can stay live without a write (a full burst's
        /// payback): how long after subscribing an instance takes a key it has not heard of
        /// as unknown rather than fresh.
        fn horizon(&self) -> u64;
        /// Forgets what is known of the fleet (after a gap in the subscription).
        fn forget(&self, w: &mut Self::Word);

        /// The arguments every key of a batch shares, after the channel, the instance and
        /// the count.
        fn batch_args(&self) -> Vec<String>;
        /// The key's call this round, if any.
        fn prepare(
            &self,
            plan: &Self::Plan,
            ctx: &Ctx,
            cell: &HybridCell<Self::Word>,
            book: &mut Self::Book,
            now: u64,
            closing: bool,
        ) -> Visit<Self::Sent>;
        /// Applies the key's reply at local time `now` (`cell`: `None` if it left the
        /// store meanwhile); `Ok(true)`: visit it again next round.
        #[allow(clippy::too_many_arguments)]
        fn apply(
            &self,
            ctx: &Ctx,
            key: &str,
            cell: Option<&HybridCell<Self::Word>>,
            book: &mut Self::Book,
            reply: Value,
            sent: Self::Sent,
            now: u64,
        ) -> Result<bool, SyncError>;
        /// The key's call failed: restore what it took.
        fn failed(
            &self,
            ctx: &Ctx,
            key: &str,
            cell: Option<&HybridCell<Self::Word>>,
            sent: Self::Sent,
        );
        /// The store evicted `key` in state `w`: queue what it held to be handed back.
        fn evicted(&self, ctx: &Ctx, key: &str, w: &Self::Word);
        /// The arguments of a call handing back what an evicted key held.
        fn hand_back(&self, ctx: &Ctx, now: u64, e: &Evicted) -> Vec<String>;

        /// Reads one key's pushed state (after its client key), at local time `now`.
        fn read_push(
            &self,
            ctx: &Ctx,
            key: &str,
            r: &mut Reader<'_>,
            now: u64,
        ) -> Result<Self::Pushed, SyncError>;
        /// Whether a pushed state says nothing a fresh entry would not (no entry is made
        /// for it).
        fn push_is_idle(&self, ctx: &Ctx, p: &Self::Pushed, now: u64) -> bool;
        /// Merges a pushed state into `w` at local time `now`; `own`: pushed by this
        /// instance's own call.
        fn apply_push(&self, ctx: &Ctx, w: &mut Self::Word, p: &Self::Pushed, own: bool, now: u64);
    }
}
pub(crate) use private::Engine;

/// The algorithm the core's store runs for a hybrid limiter: `A`'s entry and decisions, with
/// the context they read.
#[derive(Debug)]
pub struct Fleet<A: Engine> {
    algo: A,
    plan: A::Plan,
    ctx: Arc<Ctx>,
}

impl<A: Engine> Algorithm for Fleet<A> {
    type State = A::Word;

    fn fresh(&self) -> A::Word {
        self.algo.unknown()
    }

    fn capacity(&self) -> u64 {
        self.algo.capacity()
    }

    fn policy(&self) -> Policy {
        self.algo.policy()
    }

    #[inline]
    fn update(&self, w: &mut A::Word, now: u64, cost: u64) -> Decision {
        self.algo
            .decide_entry(&self.plan, &self.ctx, w, now, cost)
            .decision
    }

    fn idle_at(&self, w: &A::Word) -> u64 {
        self.algo.entry_idle_at(&self.ctx, w)
    }
}

type Store<A, C> = Shared<String, Fleet<A>, C, Hybrid>;

/// What the limiter, its sync thread and its subscription share.
struct Inner<A: Engine, C> {
    store: Store<A, C>,
    prefix: String,
}

impl<A: Engine, C> Inner<A, C> {
    fn fleet(&self) -> &Fleet<A> {
        &self.store.core.algo
    }

    fn ctx(&self) -> &Ctx {
        &self.store.core.algo.ctx
    }
}

/// A rate limiter whose decisions are local (the crate's lock-free cells, tens of
/// nanoseconds) and whose limit is the fleet's: a background thread reconciles the keys with
/// Redis (a server or a Redis Cluster), and a subscription brings every instance's changes
/// to every other. Enabled by the `redis` feature; from [`HybridLimiter::builder`].
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
///     .fallback(Fallback::share(0.25)?) // 4 instances: a quarter each on their own
///     .build()?;
/// let d = limiter.check("203.0.113.7");
/// println!("{} (stats: {:?})", d.is_allowed(), limiter.stats());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # What each instance knows
///
/// Every instance keeps, per key, its own traffic's state and the fleet's as it last heard
/// it. Each sync round (every [`sync_interval`](HybridBuilder::sync_interval), 10 ms by
/// default) sends the keys that changed here to Redis in one batch; the script that writes
/// them publishes the keys' new shared states on a channel every instance subscribes to. So
/// every instance learns every change within one sync lag (the interval plus a round trip,
/// [`HybridStats::sync_lag`]) plus the push's delivery, whether or not it saw a request for
/// the key, and however long ago it last did: a key each instance sees once a minute is
/// decided on the fleet's state as of a few milliseconds ago, not as a fresh key. The cost
/// is that every instance holds every key the fleet is using (bounded by
/// [`max_keys`](HybridBuilder::max_keys)) and reads every change.
///
/// A key this instance has not heard of is fresh for the fleet, once the subscription has
/// run for a horizon (a full burst's payback, a window, a few half-lives: what a state can
/// stay live without a write). Before that (right after the limiter starts, or after the
/// subscription broke), such a key's first requests are decided by the [`Fallback`] while
/// the sync thread asks Redis for it (one round): the same for sync and async callers, since
/// a decision never waits for the network.
///
/// # How each algorithm is shared
///
/// **GCRA: leases.** A key with requests every round holds a lease: units reserved in the
/// shared GCRA state (the script advances the shared TAT by every unit granted) and spent
/// locally by CAS, renewed to about two rounds of the key's demand, handed back when the key
/// goes quiet. Every unit admitted from a lease was reserved, so leases never over-admit.
/// Beyond its lease, an instance admits only where the fleet's TAT as it knows it has room,
/// and at most `⌊share × burst⌋` units ahead of what Redis has been told; those are charged
/// to the shared TAT at the next round. That is how a sparse key (no lease) is decided: on
/// the fleet's TAT, a sync lag old. Over any span the fleet admits at most `rate × span +
/// burst`, plus what the instances admit beyond their leases on views that are a lag old:
/// with `N` instances at most `N × ⌊share × burst⌋` units when all start at once (a key's
/// first burst, an outage), none when `share ≤ 1/N`. The TAT key is the one the
/// [`RedisLimiter`](super::RedisLimiter) uses, in the same form: a `RedisLimiter<Gcra>`
/// with the same prefix and quota shares the limit (its changes reach the hybrid instances
/// at their next call for the key, not by a push).
///
/// **Windows, EARRRL, exponential: merged states.** Each instance keeps its own traffic's
/// state (the algorithm's own word) and publishes it whole in a hash per key (a field per
/// instance); the push carries the whole hash, and each instance merges the others' fields.
/// A decision runs the algorithm's own step on the union. What lags is the others' traffic of
/// the last sync lag:
/// - *fixed and sliding window*: counts add exactly, per window in Redis' time (windows are
///   aligned to the Unix epoch); a window may exceed its limit by what the other instances
///   admit within one lag.
/// - *EARRRL*: the rate of the union is the sum of the instances' rates, exactly (the states
///   merge by log-sum-exp); it lags by the others' impulses of the last lag.
/// - *exponential*: the union's average is the instances' averages decayed to a common time
///   and added; Exim's average equals it for steady traffic and bursts, not request for
///   request (Exim weighs each request by the gap before it, and the union's gaps are
///   shorter). It lags as EARRRL does.
///
/// Times are Redis' (`TIME`), through an offset to the local clock refreshed every round
/// (off by up to half a round trip).
///
/// # Outages and start
///
/// [`build`](HybridBuilder::build) needs no Redis: a limiter that starts while Redis is
/// down decides by the [`Fallback`] ([`is_degraded`](HybridLimiter::is_degraded), counted in
/// [`HybridStats::degraded`]) and connects when Redis comes back. While a sync fails on an
/// outage, leases are spent to the last unit and the fallback decides the rest, continuing
/// from the fleet's state as last known; a failed key is sent again the next round, never
/// dropped (GCRA keeps its debt until it is charged; a debt incurred during an outage is
/// charged back-dated, so a fleet whose shares stayed within the quota owes nothing after
/// it). Any other error (a script error, another algorithm's state on the same key) is
/// counted in [`HybridStats::errors`] and shown by [`last_error`](HybridLimiter::last_error),
/// which the next clean round clears.
///
/// # Memory and cost
///
/// The keys live in the crate's keyed store ([`CasLimiter`](crate::CasLimiter)'s): its
/// capacity bound ([`max_keys`](HybridBuilder::max_keys): the keys closest to fresh are
/// evicted, a GCRA key's lease and debt handed back first), its sweeper (idle keys dropped
/// losslessly, every second by default) and its [`Metrics`]. `check` is a map lookup, a
/// clock read and one CAS (the sliding window and the exponential limiter, whose entries are
/// two 128-bit words, take a per-key lock instead, as the core does for its own states that
/// are not one word); the first request of a key in a round also pushes it on the sync
/// thread's queue (a lock). The sync thread makes at most one script call per key per round,
/// batched: one round trip on a server, one per node on a cluster.
pub struct HybridLimiter<A: HybridAlgorithm, C: Clock = QuantaClock> {
    inner: Arc<Inner<A, C>>,
    threads: Vec<JoinHandle<()>>,
    _sweeper: Option<Sweeper>,
}

impl<A: HybridAlgorithm, C: Clock> fmt::Debug for HybridLimiter<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ctx = self.inner.ctx();
        f.debug_struct("HybridLimiter")
            .field("algorithm", &self.inner.fleet().algo)
            .field("prefix", &self.inner.prefix)
            .field("sync_interval", &Duration::from_nanos(ctx.interval))
            .field("fallback_share", &ctx.share)
            .field("keys", &self.inner.store.map.len())
            .finish()
    }
}

/// Configures a [`HybridLimiter`]; from [`HybridLimiter::builder`]. The connection settings
/// are the [`RedisLimiter`](super::RedisLimiter)'s ([`Builder`]); the store's (capacity,
/// sweeper, metrics) are the in-memory limiters' ([`crate::Builder`]).
#[derive(Debug, Clone)]
#[must_use]
pub struct HybridBuilder<A, C = QuantaClock> {
    redis: Builder<A>,
    clock: C,
    interval: Duration,
    fallback: Fallback,
    options: Options,
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
            options: Options {
                sweep_every: Some(Duration::from_secs(1)),
                max_keys: Some(1 << 20),
                ..Options::default()
            },
        }
    }
}

impl<A: HybridAlgorithm, C: Clock> HybridBuilder<A, C> {
    /// The prefix of every Redis key and of the sync channel (default `hotlimit:`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.redis.prefix = prefix.into();
        self
    }

    /// How often keys are reconciled with Redis (default 10 ms; at least 1 ms). Shorter:
    /// a shorter lag behind the others' traffic (tighter window bounds, fresher views), more
    /// rounds.
    pub fn sync_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// What keys do without quota from Redis (default [`Fallback::FULL`]).
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// The most keys held (default 2^20): beyond it, the store evicts the keys closest to
    /// fresh, as [`crate::Builder::max_keys`] describes, handing back a GCRA key's lease and
    /// debt first. Every instance holds every key the fleet is using: set it above that.
    pub fn max_keys(mut self, max: usize) -> Self {
        self.options.max_keys = Some(max.max(1));
        self
    }

    /// How often the background sweeper drops idle keys (default every second); see
    /// [`crate::Builder::sweep_every`].
    pub fn sweep_every(mut self, interval: Duration) -> Self {
        self.options.sweep_every = Some(interval);
        self
    }

    /// Counts allowed and denied decisions in [`HybridLimiter::metrics`]; see
    /// [`crate::Builder::metrics`].
    pub fn metrics(mut self, enabled: bool) -> Self {
        self.options.metrics = enabled;
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
            options: self.options,
        }
    }

    /// Starts the limiter: the sync thread (`hotlimit-hybrid`), the subscription
    /// (`hotlimit-push`) and the sweeper. Needs no Redis: until it is reached, decisions
    /// follow the [`Fallback`]. Fails on a configuration error ([`BackendError::Config`]: a
    /// fallback share that leaves an instance less than one request, a GCRA burst above
    /// 2^29 units) or an invalid URL.
    pub fn build(self) -> Result<HybridLimiter<A, C>, BackendError> {
        let algo = self.redis.algo.clone();
        let plan = algo.plan(self.fallback).map_err(BackendError::Config)?;
        // The URLs parse now: a typo is an error here, not an outage later.
        for url in std::iter::once(&self.redis.url).chain(&self.redis.seeds) {
            ::redis::Client::open(url.as_str()).map_err(BackendError::from_redis)?;
        }
        let now = self.clock.now();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, duration_to_nanos);
        let interval = duration_to_nanos(self.interval);
        let ctx = Arc::new(Ctx::new(interval, self.fallback.share, now, unix));
        let fleet = Fleet {
            algo: algo.clone(),
            plan,
            ctx: ctx.clone(),
        };
        let hook_ctx = ctx.clone();
        let store = Shared::new(fleet, self.clock, &self.options).with_evict_hook(Box::new(
            move |key: &String, w: &A::Word| algo.evicted(&hook_ctx, key, w),
        ));
        let inner = Arc::new(Inner {
            store,
            prefix: self.redis.prefix.clone(),
        });
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| BackendError::Reply(format!("cannot start a thread: {e}")))
        };
        let mut threads = Vec::new();
        let (worker, config) = (inner.clone(), self.redis.clone());
        threads.push(spawn(
            "hotlimit-hybrid",
            Box::new(move || worker::sync_loop(&worker, config, self.interval)),
        )?);
        let _ = ctx.sync_thread.set(threads[0].thread().clone());
        let (subscriber, config) = (inner.clone(), self.redis);
        threads.push(spawn(
            "hotlimit-push",
            Box::new(move || push::subscribe_loop(&subscriber, &config)),
        )?);
        let sweeper = inner
            .store
            .core
            .spawn_sweeper(&inner, |i| {
                i.store.sweep();
            })
            .map_err(|e| BackendError::Reply(format!("cannot start the sweeper: {e}")))?;
        Ok(HybridLimiter {
            inner,
            threads,
            _sweeper: sweeper,
        })
    }
}

impl<A: HybridAlgorithm, C: Clock> HybridLimiter<A, C> {
    /// Decides a request of cost 1 for `key`, counting it.
    #[inline]
    pub fn check(&self, key: &str) -> Decision {
        // Cost 1 is valid for every algorithm (capacity ≥ 1).
        self.decide(key, 1)
    }

    /// Decides a request of `cost` for `key`, counting it; a cost that can never be
    /// admitted is a [`CostError`].
    #[inline]
    pub fn check_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        self.inner.store.core.cost(cost)?;
        Ok(self.decide(key, cost))
    }

    /// What [`check`](Self::check) would answer now, without counting.
    pub fn peek(&self, key: &str) -> Decision {
        self.peek_n(key, 1).unwrap_or_else(|_| Decision::denied(1))
    }

    /// What [`check_n`](Self::check_n) would answer now, without counting.
    pub fn peek_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        let store = &self.inner.store;
        store.core.cost(cost)?;
        let now = store.core.clock.now();
        Ok(store.peek(key, cost, now, &store.map.guard()))
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
            self.inner
                .store
                .core
                .clock
                .sleep(d.retry_after().max(Duration::from_millis(1)));
        }
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.inner.fleet().algo
    }

    /// The keys held: this instance's and every other key the fleet is using.
    pub fn len(&self) -> usize {
        self.inner.store.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The capacity bound ([`HybridBuilder::max_keys`]).
    pub fn max_keys(&self) -> Option<usize> {
        self.inner.store.core.max_keys
    }

    /// Whether the last sync round found Redis unreachable (decisions use the [`Fallback`]).
    pub fn is_degraded(&self) -> bool {
        self.inner.ctx().is_down()
    }

    /// Whether this instance knows the fleet's state of every key: Redis reachable,
    /// subscribed, and past the horizon after subscribing (at once if no state of the prefix
    /// was live then). Until then a key it has not heard of is decided by the [`Fallback`].
    pub fn is_current(&self) -> bool {
        let ctx = self.inner.ctx();
        let now = self.inner.store.core.clock.now();
        !ctx.is_down() && now >= ctx.mirror_since.load(Ordering::Relaxed)
    }

    /// The last error the sync met: what [`HybridStats::failed_calls`] and
    /// [`HybridStats::errors`] count. An outage or a Redis error is cleared by the next
    /// round that reaches Redis cleanly; a state this limiter cannot read
    /// ([`SyncError::ForeignState`]) stays until another error replaces it.
    pub fn last_error(&self) -> Option<SyncError> {
        self.inner.ctx().last_error.lock().clone()
    }

    /// The counters.
    pub fn stats(&self) -> HybridStats {
        let s = &self.inner.ctx().stats;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let d = |a: &AtomicU64| Duration::from_nanos(r(a));
        HybridStats {
            ticks: r(&s.ticks),
            calls: r(&s.calls),
            round_trips: r(&s.round_trips),
            failed_calls: r(&s.failed_calls),
            errors: r(&s.errors),
            degraded: s.degraded.sum(),
            denied_limit: s.denied_limit.sum(),
            denied_waiting: s.denied_waiting.sum(),
            leased: r(&s.leased),
            returned: r(&s.returned),
            charged: r(&s.charged),
            pushes: r(&s.pushes),
            subscribed: r(&s.subscribed),
            sync_lag: d(&s.lag),
            sync_lag_max: d(&s.lag_max),
            push_lag_max: d(&s.push_lag_max),
        }
    }

    /// The store's counters: decisions (if [counted](HybridBuilder::metrics)), CAS retries,
    /// sweeps, evictions, keys.
    pub fn metrics(&self) -> Metrics {
        let store = &self.inner.store;
        store
            .core
            .metrics(store.core.totals.snapshot(), store.map.len())
    }

    /// Drops idle keys now (the sweeper does every second), and evicts beyond
    /// [`max_keys`](HybridBuilder::max_keys).
    pub fn sweep(&self) -> SweepReport {
        self.inner.store.sweep()
    }

    /// The Redis key holding `key`'s shared state.
    pub fn redis_key(&self, key: &str) -> String {
        redis_key(&self.inner.prefix, key, A::SUFFIX)
    }

    fn decide(&self, key: &str, cost: u64) -> Decision {
        let store = &self.inner.store;
        let fleet = self.inner.fleet();
        let now = store.core.clock.now();
        let guard = store.map.guard();
        loop {
            let cell = store.cell(key, &guard);
            let verdict = store.core.update(cell, |w| {
                fleet
                    .algo
                    .decide_entry(&fleet.plan, &fleet.ctx, w, now, cost)
            });
            let Some(v) = verdict else {
                store.remove_dead(key, cell, &guard);
                continue;
            };
            let stats = &fleet.ctx.stats;
            match (v.reason, v.decision.is_allowed()) {
                (Reason::Fallback, allowed) => {
                    stats.degraded.incr();
                    if !allowed {
                        stats.denied_waiting.incr();
                        cell.add_denied(cost);
                    }
                }
                (Reason::Waiting, _) => {
                    stats.denied_waiting.incr();
                    cell.add_denied(cost);
                }
                (Reason::Known | Reason::Lease, false) => stats.denied_limit.incr(),
                _ => {}
            }
            if v.sync && cell.enqueue() {
                let mut queue = fleet.ctx.queue.lock();
                queue.push(key.to_owned());
                // The first key since the sync thread took the queue wakes it.
                if queue.len() == 1 {
                    drop(queue);
                    if let Some(t) = fleet.ctx.sync_thread.get() {
                        t.unpark();
                    }
                }
            }
            return store.core.count(v.decision);
        }
    }
}

/// The Redis key of `key`'s state: the [`RedisLimiter`](super::RedisLimiter)'s, with
/// `suffix`.
fn redis_key(prefix: &str, key: &str, suffix: &str) -> String {
    let mut k = super::shared::redis_key(prefix, key);
    k.push_str(suffix);
    k
}

/// The channel every instance of a prefix publishes its keys' states on.
fn channel(prefix: &str, suffix: &str) -> String {
    format!("{prefix}~sync{suffix}")
}

/// The prefix's live marker: set by every round that writes, expiring a horizon later. While
/// it exists some state of the prefix may be live; once it is gone, none is.
fn live_key(prefix: &str, suffix: &str) -> String {
    format!("{prefix}~live{suffix}")
}

impl<A: HybridAlgorithm, C: Clock> Drop for HybridLimiter<A, C> {
    /// Stops the threads after a last sync: leases handed back, debts charged, states
    /// published (within the I/O timeout).
    fn drop(&mut self) {
        self.inner.ctx().stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
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

    fn sweep(&self) -> SweepReport {
        HybridLimiter::sweep(self)
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
        self.inner.fleet().algo.advertised_quota()
    }
}
