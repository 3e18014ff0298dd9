//! [`HybridBuilder`]: a hybrid limiter's settings (Redis', the store's, the sync's) and its
//! start: the store, the sync and push threads, the sweeper.

use super::*;

/// Configures a [`HybridLimiter`]; from [`HybridLimiter::builder`]. The connection settings
/// are the [`RedisLimiter`](crate::redis::RedisLimiter)'s ([`RedisBuilder`]); the store's (capacity,
/// sweeper, metrics) are the in-memory limiters' ([`crate::store::Builder`]).
#[derive(Debug, Clone)]
#[must_use]
pub struct HybridBuilder<A, C = QuantaClock> {
    redis: RedisBuilder<A>,
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
            redis: RedisBuilder::new(url.into(), algo),
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
    /// fresh, as [`crate::store::Builder::max_keys`] describes, handing back a GCRA key's lease and
    /// debt first, and keeping what a merged state (windows, EARRRL, exponential) still owes
    /// in a debt table of 25.6 bytes per key of `max_keys` (27 MB at the default), so an
    /// entry inserted again starts at least as limited. Every instance holds every key the
    /// fleet is using: set it above that.
    pub fn max_keys(mut self, max: usize) -> Self {
        self.options.max_keys = Some(max.max(1));
        self
    }

    /// Lets capacity eviction forget what an evicted key owes, as
    /// [`crate::store::Builder::forget_evicted_limits`] describes: an entry inserted again
    /// starts as a key this instance has not heard of (the windows, EARRRL and exponential:
    /// its own count lost, published over its field, until the pushes bring the others'
    /// back). Saves the debt table (25.6 bytes per key of `max_keys`). GCRA keeps no table
    /// either way: an evicted key's lease and debt go back to Redis.
    pub fn forget_evicted_limits(mut self) -> Self {
        self.options.forget = true;
        self
    }

    /// How often the background sweeper drops idle keys (default every second); see
    /// [`crate::store::Builder::sweep_every`].
    pub fn sweep_every(mut self, interval: Duration) -> Self {
        self.options.sweep_every = Some(interval);
        self
    }

    /// Counts allowed and denied decisions in [`HybridLimiter::metrics`]; see
    /// [`crate::store::Builder::metrics`].
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

    /// More Redis Cluster seeds; makes the client a cluster client (see [`RedisBuilder::seed_nodes`]).
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
    /// 2^29 units, a zero [`sweep_every`](HybridBuilder::sweep_every)) or an invalid URL;
    /// before any thread starts.
    pub fn build(self) -> Result<HybridLimiter<A, C>, BackendError> {
        let algo = self.redis.algo.clone();
        let plan = algo.plan(self.fallback).map_err(BackendError::Config)?;
        if self.options.sweep_every.is_some_and(|d| d.is_zero()) {
            // A sweeper that never sleeps would spin a core; refused here, not after the sync
            // and push threads have started (they would be left running).
            return Err(BackendError::Config(ConfigError::Zero {
                field: Field::SweepInterval,
                value: "0s".into(),
            }));
        }
        // The URLs parse now: a typo is an error here, not an outage later.
        for url in std::iter::once(&self.redis.url).chain(&self.redis.seeds) {
            ::redis::Client::open(url.as_str()).map_err(BackendError::from_redis)?;
        }
        let now = self.clock.now();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, duration_to_nanos);
        let interval = duration_to_nanos(self.interval);
        let ctx = Arc::new(FleetContext::new(
            interval,
            self.fallback.local_share(),
            now,
            unix,
        ));
        let fleet = Fleet {
            algo: algo.clone(),
            plan,
            ctx: ctx.clone(),
        };
        let hook_ctx = ctx.clone();
        let store = Shared::new(fleet, self.clock, &self.options)
            .with_debts(&self.options)
            .map_err(|e| BackendError::Reply(format!("cannot allocate the debt table: {e}")))?
            .with_evict_hook(Box::new(move |key: &String, w: &A::Word| {
                algo.evicted(&hook_ctx, key, w)
            }));
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
