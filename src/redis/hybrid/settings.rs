//! [`HybridBuilder`]: a hybrid limiter's settings (the store's, Redis', the sync's) and its
//! start: the store, the sync and push threads, the sweeper.

use super::entry::HybridCell;
use super::*;
use crate::shared::Builder;

/// Configures a [`HybridLimiter`]; from [`HybridLimiter::builder`]: the in-memory
/// limiters' [`Builder`] (clock, metrics, capacity, sweeper), with the hybrid's own settings
/// beside ([`HybridSettings`]: the sync interval, the [`Fallback`], and the Redis connection
/// of a [`RedisBuilder`]).
pub type HybridBuilder<A, C = QuantaClock> = Builder<HybridLimiter<A>, A, C, HybridSettings<A>>;

/// A hybrid limiter's own settings, kept in its [`HybridBuilder`] and set through it
/// ([`sync_interval`](Builder::sync_interval), [`fallback`](Builder::fallback),
/// [`redis`](Builder::redis)).
#[derive(Debug, Clone)]
pub struct HybridSettings<A> {
    redis: RedisBuilder<A>,
    interval: Duration,
    fallback: Fallback,
}

/// The hybrid's store is keyed: capacity and sweeper settings apply.
impl<A: HybridAlgorithm> crate::shared::sealed::Keyed for HybridLimiter<A> {}
impl<A: HybridAlgorithm> crate::shared::KeyedStore for HybridLimiter<A> {}

impl<A: HybridAlgorithm> HybridLimiter<A> {
    /// A builder for a limiter over the Redis at `url` (`redis://host:port/`), deciding with
    /// `algo`.
    ///
    /// Its store defaults differ from the in-memory limiters': a background sweep every
    /// second and [`max_keys`](Builder::max_keys) 2^20. Beyond the bound the store evicts the
    /// keys closest to fresh, handing back a GCRA key's lease and debt first, and keeping what
    /// a merged state (windows, EARRRL, exponential) still owes in two debt tables (its own
    /// state and the others' as last heard) of 25.6 bytes per key of `max_keys` each: 51.2
    /// bytes (54 MB at the default), so an entry inserted again starts at
    /// least as limited; every instance holds every key the fleet is using, so set it above
    /// that. [`forget_evicted_limits`](Builder::forget_evicted_limits) saves the table: an
    /// entry inserted again then starts as a key this instance has not heard of (its own
    /// count lost until the pushes bring the others' back; GCRA keeps no table either way).
    /// [`metrics`](Builder::metrics) counts decisions in [`HybridLimiter::metrics`]; the
    /// [`clock`](Builder::clock) is read by decisions, the sync thread keeping its offset to
    /// Redis' time.
    pub fn builder(url: impl Into<String>, algo: A) -> HybridBuilder<A> {
        let options = Options {
            sweep_every: Some(Duration::from_secs(1)),
            max_keys: Some(1 << 20),
            ..Options::default()
        };
        let settings = HybridSettings {
            redis: RedisBuilder::new(url.into(), algo.clone()),
            interval: Duration::from_millis(10),
            fallback: Fallback::default(),
        };
        Builder::with(algo, options, settings)
    }
}

impl<A: HybridAlgorithm, C: Clock> HybridBuilder<A, C> {
    /// How often keys are reconciled with Redis (default 10 ms; at least 1 ms). Shorter:
    /// a shorter lag behind the others' traffic (tighter window bounds, fresher views), more
    /// rounds.
    pub fn sync_interval(mut self, interval: Duration) -> Self {
        self.extra.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// What keys do without quota from Redis (default [`Fallback::FULL`]).
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.extra.fallback = fallback;
        self
    }

    /// The connection to Redis, set as a [`RedisLimiter`](crate::redis::RedisLimiter)'s:
    /// [`key_prefix`](RedisBuilder::key_prefix) (of every key and of the sync channel,
    /// default `hotlimit:`), the [timeouts](RedisBuilder::io_timeout),
    /// [`reconnect_after`](RedisBuilder::reconnect_after) and a cluster's
    /// [`seed_nodes`](RedisBuilder::seed_nodes). Its fail mode and local fast path do not
    /// apply: keys without quota follow the [`fallback`](Builder::fallback).
    ///
    /// ```no_run
    /// use hotlimit::{algo::Gcra, redis::HybridLimiter};
    /// use std::time::Duration;
    ///
    /// let fleet = HybridLimiter::builder("redis://127.0.0.1/", "100/s".parse::<Gcra>()?)
    ///     .redis(|r| r.key_prefix("api:").io_timeout(Duration::from_millis(100)))
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn redis(mut self, set: impl FnOnce(RedisBuilder<A>) -> RedisBuilder<A>) -> Self {
        self.extra.redis = set(self.extra.redis);
        self
    }

    /// Starts the limiter: the sync thread (`hotlimit-hybrid`), the subscription
    /// (`hotlimit-push`) and the sweeper. Needs no Redis: until it is reached, decisions
    /// follow the [`Fallback`]. Fails on a configuration error ([`BackendError::Config`]: a
    /// fallback share that leaves an instance less than one request, a GCRA burst above
    /// 2^29 units, a [`sweep_every`](Builder::sweep_every) below 1 ms) or an invalid URL,
    /// before any thread starts; on a debt table beyond memory for its
    /// [`max_keys`](Builder::max_keys) ([`BackendError::OutOfMemory`]); or on a thread that
    /// cannot start ([`BackendError::Spawn`]: those that did are stopped).
    pub fn build(self) -> Result<HybridLimiter<A, C>, BackendError> {
        let HybridSettings {
            redis,
            interval,
            fallback,
        } = self.extra;
        let algo = self.algo;
        let plan = algo.plan(fallback).map_err(BackendError::Config)?;
        if let Some(every) = self.options.sweep_every {
            // Refused here, not after the sync and push threads have started (they would be
            // left running).
            crate::shared::check_sweep_interval(every).map_err(BackendError::Config)?;
        }
        // The URLs parse now: a typo is an error here, not an outage later.
        for url in std::iter::once(&redis.url).chain(&redis.seeds) {
            ::redis::Client::open(url.as_str()).map_err(BackendError::from_redis)?;
        }
        let now = self.clock.now();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, duration_to_nanos);
        let ctx = Arc::new(
            FleetContext::new(
                duration_to_nanos(interval),
                fallback.local_share(),
                now,
                unix,
            )
            .with_max_keys(self.options.max_keys),
        );
        // Instances reconnect and subscribe again up to `reconnect_after` apart, then publish
        // within a round.
        ctx.recover_for.store(
            duration_to_nanos(2 * redis.reconnect_after + 2 * interval),
            std::sync::atomic::Ordering::Relaxed,
        );
        let fleet = Fleet {
            algo: algo.clone(),
            plan,
            ctx: ctx.clone(),
            fallback,
            quotas: Default::default(),
        };
        let hook_ctx = ctx.clone();
        let store = Shared::new(fleet, self.clock, &self.options)
            .with_debts(&self.options)
            .map_err(|_| BackendError::OutOfMemory)?
            .with_evict_hook(Box::new(
                move |key: &String, cell: &HybridCell<A::Word>, w: &A::Word| {
                    algo.evicted(&hook_ctx, key, cell.quota(), w)
                },
            ));
        let inner = Arc::new(Inner {
            store,
            prefix: redis.prefix.clone(),
        });
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(BackendError::Spawn)
        };
        let sweeper = inner.store.core.spawn_sweeper(&inner, |i| {
            i.store.sweep();
        })?;
        // Made before its threads: if one cannot start, dropping it stops those that did.
        let mut limiter = HybridLimiter {
            inner: inner.clone(),
            threads: Vec::new(),
            _sweeper: sweeper,
        };
        let (worker, config) = (inner.clone(), redis.clone());
        limiter.threads.push(spawn(
            "hotlimit-hybrid",
            Box::new(move || worker::sync_loop(&worker, config, interval)),
        )?);
        let _ = ctx.sync_thread.set(limiter.threads[0].thread().clone());
        let (subscriber, config) = (inner, redis);
        limiter.threads.push(spawn(
            "hotlimit-push",
            Box::new(move || push::subscribe_loop(&subscriber, &config)),
        )?);
        Ok(limiter)
    }
}
