//! The hybrid limiter: every decision local and lock-free, one limit across the fleet through
//! Redis in the background. See [`HybridLimiter`].
//!
//! The parts: `entry.rs` (the entries in the core's keyed store), `lease.rs` (GCRA: leases
//! and the view of the shared TAT), `merge.rs` (windows, EARRRL, exponential: merged states),
//! `worker.rs` (the sync thread), `push.rs` (the subscription that brings every instance's
//! changes), `link.rs` (the sync thread's connection);
//! the Lua is in `src/redis/lua/`.

mod context;
mod engine;
mod entry;
mod fallback;
mod lease;
mod link;
mod merge;
mod push;
mod report;
mod settings;
mod worker;

pub(crate) use context::{Evicted, FleetContext, Mode};
pub use engine::HybridAlgorithm;
pub(crate) use engine::{Engine, Fleet, Heard, Inner, Reason, Verdict, Visit};
use entry::Seen;
pub use fallback::Fallback;
pub use report::{HybridStats, SyncError};
pub use settings::{HybridBuilder, HybridSettings};

use super::{BackendError, RedisBuilder};
use crate::cell::StateCell;
use crate::clock::{duration_to_nanos, Clock, QuantaClock};
use crate::decision::{Decision, Ticket};
use crate::error::{ConfigError, QuotaError};
use crate::keyed::Shared;
use crate::request::Ask;
use crate::shared::Options;
use crate::stats::Metrics;
use crate::sweeper::Sweeper;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A rate limiter whose decisions are local (the crate's lock-free cells, tens of
/// nanoseconds) and whose limit is the fleet's: a background thread reconciles the keys with
/// Redis (a server or a Redis Cluster), and a subscription brings every instance's changes
/// to every other. Enabled by the `redis` feature; from [`HybridLimiter::builder`].
///
/// ```no_run
/// use hotlimit::algo::Gcra;
/// use hotlimit::redis::{Fallback, HybridLimiter};
/// use hotlimit::RateLimiter; // its decisions: `check`, `check_n`, batches
/// use std::time::Duration;
///
/// // 100/s with bursts of 20 per client, shared by every instance using this Redis.
/// let limiter = HybridLimiter::builder("redis://127.0.0.1:6379/", "100/s burst 20".parse::<Gcra>()?)
///     .redis(|r| r.key_prefix("api:"))
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
/// it. Each sync round (every [`sync_interval`](crate::store::Builder::sync_interval), 10 ms by
/// default) sends the keys that changed here to Redis in one batch; the script that writes
/// them publishes the keys' new shared states on a channel every instance subscribes to (on a
/// cluster, sharded: each node's own channel, one connection and thread per primary, so that
/// no push crosses the cluster's bus, whose delayed ACKs held them 16–56 ms). So
/// every instance learns every change within one sync lag (the interval plus a round trip,
/// [`HybridStats::sync_lag`]) plus the push's delivery, whether or not it saw a request for
/// the key, and however long ago it last did: a key each instance sees once a minute is
/// decided on the fleet's state as of a few milliseconds ago, not as a fresh key. The cost
/// is that every instance holds every key the fleet is using (bounded by
/// [`max_keys`](crate::store::Builder::max_keys)) and reads every change.
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
///   admit within one lag. While another instance is heard to hold anything of the window,
///   what this one admits that the others have not heard of (beyond its own field in the
///   key's last push) is held to `⌈share × left⌉`, its fallback share of what the union has
///   left; beyond, a request waits for the next round, which sends the key at once.
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
/// [`build`](crate::store::Builder::build) needs no Redis: a limiter that starts while Redis is
/// down decides by the [`Fallback`] ([`stats().outage`](HybridStats::outage), counted in
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
/// capacity bound ([`max_keys`](crate::store::Builder::max_keys): the keys closest to fresh are
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

impl<A: HybridAlgorithm, C: Clock> HybridLimiter<A, C> {
    fn decide_batch<'k>(
        &self,
        requests: impl Iterator<Item = (&'k str, u64)>,
        valid: impl Fn(u64) -> Result<(), QuotaError>,
        emit: impl FnMut(Result<Decision, QuotaError>),
    ) {
        let store = &self.inner.store;
        let guard = store.map.guard();
        let now = store.core.clock.now();
        let place = |_: &str, cost| valid(cost).map(|()| None);
        let find = |key: &str, found: &mut Option<_>| *found = store.map.get(key, &guard);
        let decide = |key: &str, cost, found| self.decide_found(key, cost, now, found, &guard);
        crate::batch::in_chunks(requests, place, find, decide, emit);
    }

    /// Drops idle keys now (the sweeper does every second), and evicts beyond
    /// [`max_keys`](crate::store::Builder::max_keys); returns what this sweep did, as
    /// [`Limiter::sweep`](crate::Limiter::sweep) does.
    pub fn sweep(&self) -> Metrics {
        self.inner.store.sweep()
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.inner.fleet().algo
    }

    /// The last error the sync met: what [`HybridStats::failed_calls`] and
    /// [`HybridStats::errors`] count. An outage or a Redis error is cleared by the next
    /// round that reaches Redis cleanly; a state this limiter cannot read
    /// ([`SyncError::ForeignState`]) stays until another error replaces it.
    pub fn last_error(&self) -> Option<SyncError> {
        self.inner.ctx().last_error.lock().clone()
    }

    /// The counters, and whether Redis is reachable and this instance current.
    pub fn stats(&self) -> HybridStats {
        let ctx = self.inner.ctx();
        let now = self.inner.store.core.clock.now();
        let s = &ctx.stats;
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
            hand_backs_dropped: r(&s.hand_backs_dropped),
            charged: r(&s.charged),
            pushes: r(&s.pushes),
            subscribed: r(&s.subscribed),
            deaf: r(&s.deaf),
            sync_lag: d(&s.lag),
            sync_lag_max: d(&s.lag_max),
            push_lag: Duration::from_nanos(r(&s.push_lag_sum) / r(&s.messages).max(1)),
            push_lag_max: d(&s.push_lag_max),
            outage: ctx.is_down(),
            current: !ctx.is_down() && ctx.mirrors(now, self.inner.fleet().horizon()),
        }
    }

    /// The store's counters: decisions (if [counted](crate::store::Builder::metrics)), CAS retries,
    /// sweeps, evictions, and `keys`: the keys held, this instance's and every other key the
    /// fleet is using.
    pub fn metrics(&self) -> Metrics {
        let store = &self.inner.store;
        store
            .core
            .metrics(store.core.sweep_totals(), store.map.len())
    }

    /// The Redis key holding `key`'s shared state.
    pub fn redis_key(&self, key: &str) -> String {
        redis_key(&self.inner.prefix, key, A::SUFFIX)
    }

    fn decide(&self, key: &str, cost: u64) -> Decision {
        self.decide_at(key, cost, self.inner.store.core.clock.now())
    }

    fn decide_at(&self, key: &str, cost: u64, now: u64) -> Decision {
        self.decide_found(key, cost, now, None, &self.inner.store.map.guard())
    }

    /// [`decide_at`](Self::decide_at) from `found`, the entry a batch looked up (see
    /// [`step_found`](Self::step_found)).
    fn decide_found<'g>(
        &self,
        key: &str,
        cost: u64,
        now: u64,
        found: Option<&'g entry::HybridCell<A::Word>>,
        guard: &'g impl papaya::Guard,
    ) -> Decision {
        match self.step_found(key, cost, None, found, guard, decide(now, cost)) {
            Ok(((), d)) => d,
            // The limiter's own quota is always registered.
            Err(_) => Decision::denied_ns(1),
        }
    }

    /// One request's step on `key`'s entry under `quota` (`None`: the limiter's own), `cost`
    /// being what a denial leaves waiting, with its stats and its place in the sync thread's
    /// queue; returns what `step` returned beside its verdict, and the decision, counted. A
    /// quota the limiter cannot take is an error, and changes nothing.
    fn step<T>(
        &self,
        key: &str,
        cost: u64,
        quota: Option<&A>,
        step: impl FnMut(&A, &A::Plan, &FleetContext, Seen, &mut A::Word) -> (T, Verdict),
    ) -> Result<(T, Decision), ConfigError> {
        self.step_found(key, cost, quota, None, &self.inner.store.map.guard(), step)
    }

    /// [`step`](Self::step) starting from `found`, the entry a batch's first pass looked up for
    /// `key`, if any (as [`Shared::apply_found`]).
    fn step_found<'g, T>(
        &self,
        key: &str,
        cost: u64,
        quota: Option<&A>,
        mut found: Option<&'g entry::HybridCell<A::Word>>,
        guard: &'g impl papaya::Guard,
        mut step: impl FnMut(&A, &A::Plan, &FleetContext, Seen, &mut A::Word) -> (T, Verdict),
    ) -> Result<(T, Decision), ConfigError> {
        let fleet = self.inner.fleet();
        let ((out, v), cell) = self.on_entry(key, quota, found.take(), guard, |a, p, s, w| {
            step(a, p, &fleet.ctx, s, w)
        })?;
        {
            let stats = &fleet.ctx.stats;
            match (v.reason, v.decision.is_allowed()) {
                (Reason::Fallback, allowed) => {
                    stats.degraded.incr();
                    // A load first: set once per round at most, not once per request.
                    if allowed && !fleet.ctx.alone.load(Ordering::Relaxed) {
                        fleet.ctx.alone.store(true, Ordering::Relaxed);
                    }
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
            if v.unheard > 0 {
                cell.add_unheard(v.unheard);
            }
            if v.urgent {
                self.hurry(key, cell);
            } else if v.sync {
                self.queue(key, cell);
            }
        }
        Ok((out, self.inner.store.core.count(v.decision)))
    }

    /// Runs `f` on `key`'s entry (from `found` if given and alive) under `quota`, recording
    /// the quota in the entry first (a sync that reads the change reads it by that quota);
    /// `f` is told what the cell says beside the entry ([`entry::HybridCell::seen`]).
    /// Returns `f`'s result and the cell. A quota the limiter cannot take is an error, and
    /// changes nothing.
    fn on_entry<'g, T>(
        &self,
        key: &str,
        quota: Option<&A>,
        mut found: Option<&'g entry::HybridCell<A::Word>>,
        guard: &'g impl papaya::Guard,
        mut f: impl FnMut(&A, &A::Plan, Seen, &mut A::Word) -> T,
    ) -> Result<(T, &'g entry::HybridCell<A::Word>), ConfigError> {
        let store = &self.inner.store;
        let fleet = self.inner.fleet();
        loop {
            // The quota first: one refused inserts no key.
            let held = found.take().or_else(|| store.map.get(key, guard));
            let (index, algo, plan) = fleet.index_of(quota, held.map_or(0, |c| c.quota()))?;
            let cell = held.unwrap_or_else(|| store.cell(key, guard));
            cell.set_quota(index);
            let seen = cell.seen();
            match store.core.update(cell, |w| f(algo, plan, seen, w)) {
                Some(out) => return Ok((out, cell)),
                None => store.remove_dead(key, cell, guard),
            }
        }
    }

    /// Queues `key` for the sync thread (once until it takes it), waking it for the first.
    fn queue(&self, key: &str, cell: &entry::HybridCell<A::Word>) {
        if cell.enqueue() {
            self.push(key, false);
        }
    }

    /// Queues `key` for the sync thread's next round, even if its last visit was less than
    /// a sync interval ago (once until it takes it).
    fn hurry(&self, key: &str, cell: &entry::HybridCell<A::Word>) {
        if cell.hurry() {
            self.push(key, true);
        }
    }

    /// Puts `key` on the sync thread's queue, waking it for the first key.
    fn push(&self, key: &str, urgent: bool) {
        self.inner.fleet().ctx.push_key(key, urgent);
    }
}

/// Partial grants and provisional costs, decided locally as every request is; a settle goes
/// through the key's entry (for GCRA its lease) and reaches the fleet with the next round.
impl<A: HybridAlgorithm, C: Clock> HybridLimiter<A, C> {
    /// A partial grant: admits the most units available now, up to `n` (capped at the
    /// capacity), and says how many; with none, 0 and the denial of one unit. As the
    /// in-memory [`up_to`](crate::Request::up_to), on what this instance
    /// holds and knows (for GCRA: its lease first, then the fleet's TAT as known).
    fn grant_up_to(
        &self,
        key: &str,
        n: u64,
        quota: Option<&A>,
        now: u64,
    ) -> Result<(u64, Decision), QuotaError> {
        if n == 0 {
            return Err(QuotaError::ZeroCost);
        }
        Ok(self.step(key, 1, quota, |algo, plan, ctx, seen, w| {
            let most = n.min(algo.capacity());
            let fits = |c: u64| {
                let mut probe = *w;
                algo.decide_entry(plan, ctx, &mut probe, seen, now, c, false)
                    .decision
                    .is_allowed()
            };
            let granted = crate::algo::most_admitted(most, fits);
            (
                granted,
                algo.decide_entry(plan, ctx, w, seen, now, granted.max(1), false),
            )
        })?)
    }

    /// Takes a provisional cost: decides and counts `cost` like
    /// [`check_n`](crate::RateLimiter::check_n), and returns a [`Ticket`] to settle once the actual
    /// cost is known.
    fn take_at(
        &self,
        key: &str,
        cost: u64,
        quota: Option<&A>,
        now: u64,
    ) -> Result<Ticket, QuotaError> {
        let take = move |algo: &A, plan: &A::Plan, ctx: &FleetContext, seen, w: &mut A::Word| {
            ((), algo.decide_entry(plan, ctx, w, seen, now, cost, true))
        };
        let ((), decision) = self.step(key, cost, quota, take)?;
        let print = crate::shared::key_print(key);
        Ok(Ticket::issue(
            decision,
            cost,
            now,
            self.inner.store.core.id,
            print,
        ))
    }

    /// Settles `ticket` (taken from this limiter for `key`) with the `actual` cost, locally
    /// and lock-free like a request; the fleet hears of it with the next sync round.
    ///
    /// GCRA settles **through the lease**: refunded units return to the key's lease (they
    /// were reserved in the shared state, or are owed to it), where this instance's next
    /// requests spend them, and a quiet key hands them back to the fleet; an overrun is
    /// spent from the lease as far as it holds, and the rest is a debt charged to the
    /// shared state at the next round. The merged algorithms settle this instance's own
    /// state as in memory ([`Algorithm::settle`](crate::algo::Algorithm::settle)), and the
    /// next round publishes it.
    ///
    /// Returns whether this call settled the ticket: `false` if it was settled before or
    /// denied. A ticket never settled stands as charged. A ticket taken from another
    /// limiter or for another key is an error, and stays open.
    fn settle_at(
        &self,
        key: &str,
        ticket: &mut Ticket,
        actual: u64,
        quota: Option<&A>,
        now: Option<u64>,
    ) -> Result<bool, QuotaError> {
        let print = crate::shared::key_print(key);
        ticket.check_origin(self.inner.store.core.id, print)?;
        let fleet = self.inner.fleet();
        let (_, algo, _) = fleet.index_of(quota, 0)?;
        crate::shared::settle_limit(algo, ticket, actual)?;
        let Some((taken_at, charged)) = ticket.close() else {
            return Ok(false);
        };
        if actual == charged {
            return Ok(true);
        }
        let now = self.inner.store.core.now(now);
        let guard = self.inner.store.map.guard();
        // The states are being re-stamped while Redis' time is first heard (one walk of the
        // keys): a settle loses no refund or debt, so it waits that out, outside the cell; a
        // re-stamp not done within a second (a sync thread gone) no longer holds it.
        let started = std::time::Instant::now();
        loop {
            let wait = started.elapsed() < Duration::from_secs(1);
            let (settled, cell) = self.on_entry(key, quota, None, &guard, |algo, _, _, w| {
                algo.settle_entry(&fleet.ctx, w, now, taken_at, charged, actual, wait)
            })?;
            if settled {
                self.queue(key, cell);
                return Ok(true);
            }
            std::thread::yield_now();
        }
    }

    /// The decision `cost` would get at `now` under `quota`, changing nothing.
    fn preview_at(
        &self,
        key: &str,
        cost: u64,
        quota: Option<&A>,
        now: u64,
    ) -> Result<Decision, QuotaError> {
        let store = &self.inner.store;
        let fleet = self.inner.fleet();
        let guard = store.map.guard();
        let held = store.map.get(key, &guard);
        let (_, algo, plan) = fleet.index_of(quota, held.map_or(0, |c| c.quota()))?;
        crate::error::check_cost(cost, algo.capacity())?;
        // The entry found above, not a second look-up (`peek` comes this way too).
        let mut w = match held.and_then(|c| c.inspect(Clone::clone)) {
            Some(w) => w,
            None => store.state_of(key, &guard),
        };
        let seen = held.map_or(Seen::default(), |c| c.seen());
        Ok(algo
            .decide_entry(plan, &fleet.ctx, &mut w, seen, now, cost, false)
            .decision)
    }
}

/// A request's step: `cost` decided at `now`.
fn decide<A: HybridAlgorithm>(
    now: u64,
    cost: u64,
) -> impl FnMut(&A, &A::Plan, &FleetContext, Seen, &mut A::Word) -> ((), Verdict) {
    move |algo, plan, ctx, seen, w| ((), algo.decide_entry(plan, ctx, w, seen, now, cost, false))
}

/// The Redis key of `key`'s state: the [`RedisLimiter`](super::RedisLimiter)'s, with
/// `suffix`.
fn redis_key(prefix: &str, key: &str, suffix: &str) -> String {
    let mut k = String::new();
    push_redis_key(&mut k, prefix, key, suffix);
    k
}

/// [`redis_key`] appended to `k`.
fn push_redis_key(k: &mut String, prefix: &str, key: &str, suffix: &str) {
    super::keys::push_redis_key(k, prefix, key);
    k.push_str(suffix);
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

impl<A: HybridAlgorithm, C: Clock> HybridLimiter<A, C> {
    /// Stops the sync and subscription threads after a last sync (leases handed back, debts
    /// charged, states published, within the I/O timeout) and waits for them, and for the
    /// sweeper. It blocks for up to a round trip or the I/O timeout: from async code, call it
    /// on a blocking thread (`spawn_blocking`). Dropping the limiter starts the same last
    /// sync and returns at once; shut down before the process exits, so that the last sync is
    /// not cut off with it.
    pub fn shutdown(mut self) {
        self.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(sweeper) = self._sweeper.take() {
            sweeper.shutdown();
        }
    }

    /// Tells the threads to make their last sync and end.
    fn stop(&self) {
        self.inner.ctx().stop.store(true, Ordering::Release);
        for t in &self.threads {
            t.thread().unpark();
        }
    }
}

/// Only signals: the threads make their last sync and end by themselves, so a drop never
/// blocks (it may run on an async runtime's thread); [`shutdown`](HybridLimiter::shutdown)
/// waits for them.
impl<A: HybridAlgorithm, C: Clock> Drop for HybridLimiter<A, C> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The hybrid limiter's waits. Its checks and requests are [`RateLimiter`](crate::RateLimiter)'s
/// and [`Requests`](crate::Requests)' (import them), as on every in-memory limiter. Every call
/// is local.
impl<A: HybridAlgorithm, C: Clock> HybridLimiter<A, C> {
    /// Waits on the calling thread until a request of cost 1 for `key` is allowed: checks,
    /// sleeping (on the limiter's clock) for each denial's `retry_after`, at least 1 ms.
    pub fn until_ready_blocking(&self, key: &str) -> Decision {
        // Not the in-memory limiters' loop (`wait::until_ready_blocking`): it peeks before
        // it checks, and a peek asks Redis for nothing, so a waiter on an empty lease would
        // wait for a lease nobody asks for. Each check here is the demand that brings it.
        loop {
            let d = self.decide(key, 1);
            if d.is_allowed() {
                return d;
            }
            let clock = &self.inner.store.core.clock;
            clock.sleep(d.retry_after().max(Duration::from_millis(1)));
        }
    }
}

/// The hybrid limiter as a [`RateLimiter<str>`](crate::RateLimiter): every decision is local
/// (Redis is only reached by the background sync), so it is an
/// [`AsyncRateLimiter`](crate::AsyncRateLimiter) that never blocks an async task (the tower
/// layer takes it as it takes the in-memory limiters).
impl<A: HybridAlgorithm, C: Clock> crate::RateLimiter<str> for HybridLimiter<A, C> {
    /// Decides a request of cost 1 for `key`, counting it.
    #[inline]
    fn check(&self, key: &str) -> Decision {
        // Cost 1 is valid for every algorithm (capacity ≥ 1).
        self.decide(key, 1)
    }

    /// Decides a request of `cost` for `key`, counting it; a cost that can never be
    /// admitted is a [`QuotaError`].
    #[inline]
    fn check_n(&self, key: &str, cost: u64) -> Result<Decision, QuotaError> {
        self.inner.store.core.cost(cost)?;
        Ok(self.decide(key, cost))
    }

    /// Locally, as every request, all at one instant; the entries of a chunk of keys are
    /// looked up back to back first, as in the in-memory limiters' [`check_batch`](crate::RateLimiter::check_batch).
    fn check_batch<'k>(&self, keys: impl IntoIterator<Item = &'k str>, out: &mut Vec<Decision>) {
        out.clear();
        let requests = keys.into_iter().map(|key| (key, 1));
        // Cost 1 is never refused (capacities are at least 1): every answer is a decision.
        self.decide_batch(requests, |_| Ok(()), |answer| out.extend(answer.ok()));
    }

    fn check_n_batch<'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k str, u64)>,
        out: &mut Vec<Result<Decision, QuotaError>>,
    ) {
        out.clear();
        let core = &self.inner.store.core;
        self.decide_batch(
            requests.into_iter(),
            |cost| core.cost(cost),
            |answer| out.push(answer),
        );
    }
}

/// Every other request, through [`request`](crate::Requests::request): a cost, an instant;
/// then `check`, `peek`, `up_to` (a partial grant), `take` and `settle`. A request's quota
/// decides it as on the in-memory limiters, and the key's entry keeps it for the sync thread
/// (GCRA's leases are in its units); one the limiter cannot read states by (another window,
/// half-life or period), or beyond the 65,536 distinct quotas a limiter keeps, is refused
/// ([`QuotaError::Quota`]) and changes nothing.
impl<A: HybridAlgorithm, C: Clock> crate::Requests<str> for HybridLimiter<A, C> {
    type Algo = A;
    type Error = QuotaError;

    fn decide(&self, key: &str, ask: Ask<'_, A>) -> Result<Decision, QuotaError> {
        let now = self.inner.store.core.now(ask.at);
        let Some(quota) = ask.quota else {
            self.inner.store.core.cost(ask.cost)?;
            return Ok(self.decide_at(key, ask.cost, now));
        };
        crate::error::check_cost(ask.cost, quota.capacity())?;
        Ok(self
            .step(key, ask.cost, Some(quota), decide(now, ask.cost))?
            .1)
    }

    fn peek(&self, key: &str, ask: Ask<'_, A>) -> Result<Decision, QuotaError> {
        let now = self.inner.store.core.now(ask.at);
        self.preview_at(key, ask.cost, ask.quota, now)
    }

    fn up_to(&self, key: &str, ask: Ask<'_, A>) -> Result<(u64, Decision), QuotaError> {
        let now = self.inner.store.core.now(ask.at);
        self.grant_up_to(key, ask.cost, ask.quota, now)
    }

    fn take(&self, key: &str, ask: Ask<'_, A>) -> Result<Ticket, QuotaError> {
        let now = self.inner.store.core.now(ask.at);
        let capacity = ask.quota.unwrap_or(self.algorithm()).capacity();
        crate::error::check_cost(ask.cost, capacity)?;
        self.take_at(key, ask.cost, ask.quota, now)
    }

    fn settle(
        &self,
        key: &str,
        ticket: &mut Ticket,
        actual: u64,
        ask: Ask<'_, A>,
    ) -> Result<bool, QuotaError> {
        self.settle_at(key, ticket, actual, ask.quota, ask.at)
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

#[cfg(all(test, not(hotlimit_loom)))]
mod tests {
    use super::HybridLimiter;
    use crate::algo::{Earrrl, Exponential, FixedWindow, Gcra, SlidingWindow};
    use crate::redis::HybridAlgorithm;
    use std::time::Duration;

    /// The bytes of the debt table of a limiter for `max_keys` (a dead URL: `build` needs no
    /// Redis), `None` without one.
    fn table<A: HybridAlgorithm>(algo: A, max_keys: Option<usize>) -> Option<usize> {
        let b = HybridLimiter::builder("redis://127.0.0.1:1/", algo);
        let l = match max_keys {
            Some(m) => b.max_keys(m),
            None => b,
        }
        .build()
        .unwrap();
        l.inner.store.core.debts.as_ref().map(|d| d.bytes())
    }

    /// The merged states keep two halves per key (own and others'): 51.2 bytes per key of
    /// `max_keys`, 54 MB at the default bound; GCRA keeps none (leases go back to Redis).
    // Pins G72.
    #[test]
    fn the_fleet_debt_table_is_51_2_bytes_per_key_of_max_keys() {
        let w = Duration::from_secs(1);
        let m = Some(1_000_000);
        assert_eq!(table(FixedWindow::new(10, w).unwrap(), m), Some(51_200_000));
        assert_eq!(
            table(SlidingWindow::new(10, w).unwrap(), m),
            Some(51_200_000)
        );
        let earrrl = Earrrl::new(w, "10/s".parse().unwrap()).unwrap();
        assert_eq!(table(earrrl, m), Some(51_200_000));
        let exponential = Exponential::new(10.0, w).unwrap();
        assert_eq!(table(exponential, m), Some(51_200_000));
        assert_eq!(table("10/s".parse::<Gcra>().unwrap(), m), None);
        let default = table(FixedWindow::new(10, w).unwrap(), None).unwrap();
        assert_eq!((default as f64 / 1e6).round(), 54.0, "{default}");
    }
}
