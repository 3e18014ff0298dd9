//! The async client (feature `redis-async`, tokio): [`AsyncRedisLimiter`].

use super::shared::{batch_decisions, decision, is_noscript, noscript_indices, At, Core};
use super::{BackendError, Builder, FailMode, RedisAlgorithm};
use crate::decision::Decision;
use crate::error::CostError;
use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client, Value};
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

/// The async twin of [`RedisLimiter`](super::RedisLimiter), on tokio: the same scripts,
/// decisions, fail modes and local fast path.
///
/// One multiplexed connection serves every task: concurrent requests are pipelined on it
/// automatically, so share one limiter rather than opening one per task; cloning it is cheap
/// and the clones share the connection, the local fast path and the counters. The response
/// timeout is [`Builder::io_timeout`]. Needs a tokio runtime.
///
/// It is an [`AsyncRateLimiter<str>`](crate::AsyncRateLimiter) (its future applies the
/// [`FailMode`], as [`check_n`](AsyncRedisLimiter::check_n) does), so the `tower` feature's
/// `RateLimitLayer` can put it in front of a service: one limit shared by every instance.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use hotlimit::{algo::Gcra, redis::RedisLimiter};
///
/// let limiter = RedisLimiter::builder("redis://127.0.0.1:6379/", "10/s".parse::<Gcra>()?)
///     .build_async()
///     .await?;
/// if limiter.check("203.0.113.7").await.is_denied() {
///     // 429
/// }
/// # Ok(())
/// # }
/// ```
pub struct AsyncRedisLimiter<A> {
    // Each behind an `Arc`: a clone shares them all (the async trait's future owns a clone).
    core: Arc<Core<A>>,
    client: Arc<Client>,
    conn: Arc<Mutex<AsyncSlot>>,
}

impl<A> Clone for AsyncRedisLimiter<A> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
            client: self.client.clone(),
            conn: self.conn.clone(),
        }
    }
}

#[derive(Default)]
struct AsyncSlot {
    con: Option<MultiplexedConnection>,
    down_until: Option<Instant>,
}

impl<A: fmt::Debug> fmt::Debug for AsyncRedisLimiter<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.config.fmt_limiter(f, "AsyncRedisLimiter")
    }
}

impl<A: RedisAlgorithm> Builder<A> {
    /// [`build`](Builder::build) for the async client: opens the client, connects and loads
    /// the script.
    pub async fn build_async(self) -> Result<AsyncRedisLimiter<A>, BackendError> {
        let client = Client::open(self.url.as_str()).map_err(BackendError::from_redis)?;
        let limiter = AsyncRedisLimiter {
            core: Arc::new(Core::new(self)),
            client: Arc::new(client),
            conn: Arc::new(Mutex::new(AsyncSlot::default())),
        };
        let mut con = limiter.connection().await?;
        limiter.reload(&mut con).await?;
        Ok(limiter)
    }
}

impl<A: RedisAlgorithm> AsyncRedisLimiter<A> {
    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.core.config.algo
    }

    /// The fail mode.
    pub fn fail_mode(&self) -> FailMode {
        self.core.config.fail_mode
    }

    /// The Redis key that holds `key`'s state.
    pub fn redis_key(&self, key: &str) -> String {
        self.core.redis_key(key)
    }

    /// Requests sent to Redis so far (each a round trip; a pipelined batch counts once).
    pub fn round_trips(&self) -> u64 {
        self.core.round_trips()
    }

    /// Backend failures [`check`](AsyncRedisLimiter::check) answered with the [`FailMode`].
    pub fn failures(&self) -> u64 {
        self.core.failures()
    }

    /// Decides a request of cost 1; on a backend failure, answers the [`FailMode`].
    pub async fn check(&self, key: &str) -> Decision {
        match self.check_n(key, 1).await {
            Ok(d) => d,
            Err(_) => self.core.config.fail_mode.decision(),
        }
    }

    /// Decides a request of `cost`; on a backend failure, answers the [`FailMode`].
    pub async fn check_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        self.core.fail_over(self.try_check_n(key, cost).await)
    }

    /// Decides a request of `cost`, returning the backend's failure instead of applying the
    /// [`FailMode`].
    pub async fn try_check_n(&self, key: &str, cost: u64) -> Result<Decision, BackendError> {
        self.run(key, cost, At::Server, true).await
    }

    /// [`try_check_n`](AsyncRedisLimiter::try_check_n) at an explicit `now` (nanoseconds, at
    /// most [`MAX_EXPLICIT_NOW`](super::MAX_EXPLICIT_NOW)), for tests and replay.
    pub async fn try_check_n_at(
        &self,
        key: &str,
        cost: u64,
        now_ns: u64,
    ) -> Result<Decision, BackendError> {
        self.run(key, cost, At::Explicit(now_ns), true).await
    }

    /// What [`try_check_n`](AsyncRedisLimiter::try_check_n) would answer, without counting
    /// the request.
    pub async fn try_peek_n(&self, key: &str, cost: u64) -> Result<Decision, BackendError> {
        self.run(key, cost, At::Server, false).await
    }

    /// A batch of requests in one round trip, as
    /// [`RedisLimiter::try_check_pipelined`](super::RedisLimiter::try_check_pipelined).
    pub async fn try_check_pipelined(
        &self,
        requests: &[(&str, u64)],
    ) -> Result<Vec<Decision>, BackendError> {
        self.core.check_costs(requests)?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let mut con = self.connection().await?;
        let result = self.pipelined(&mut con, requests).await;
        self.on_error(&result);
        result
    }

    async fn run(
        &self,
        key: &str,
        cost: u64,
        at: At,
        write: bool,
    ) -> Result<Decision, BackendError> {
        if let Some(d) = self.core.before(key, cost, at, write)? {
            return Ok(d);
        }
        let mut con = self.connection().await?;
        let result = self.eval_one(&mut con, key, cost, at, write).await;
        self.on_error(&result);
        let d = result?;
        self.core.after(key, cost, at, write, &d);
        Ok(d)
    }

    /// A broken connection is dropped; the next request reconnects.
    fn on_error<T>(&self, result: &Result<T, BackendError>) {
        if result.as_ref().is_err_and(BackendError::drops_connection) {
            self.conn.lock().con = None;
        }
    }

    async fn connection(&self) -> Result<MultiplexedConnection, BackendError> {
        {
            let slot = self.conn.lock();
            if let Some(con) = &slot.con {
                return Ok(con.clone());
            }
            if slot.down_until.is_some_and(|t| Instant::now() < t) {
                return Err(BackendError::Unavailable);
            }
        }
        let config = &self.core.config;
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(config.connect_timeout)
            .set_response_timeout(config.io_timeout);
        match self
            .client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
        {
            Ok(con) => {
                let mut slot = self.conn.lock();
                slot.con = Some(con.clone());
                slot.down_until = None;
                Ok(con)
            }
            Err(e) => {
                self.conn.lock().down_until = Some(Instant::now() + config.reconnect_after);
                Err(BackendError::from_redis(e))
            }
        }
    }

    async fn reload(&self, con: &mut MultiplexedConnection) -> Result<String, BackendError> {
        self.core.trip();
        let v = con
            .send_packed_command(&self.core.load_cmd())
            .await
            .map_err(BackendError::from_redis)?;
        self.core.loaded(v)
    }

    async fn eval_one(
        &self,
        con: &mut MultiplexedConnection,
        key: &str,
        cost: u64,
        at: At,
        write: bool,
    ) -> Result<Decision, BackendError> {
        let sha = self.core.sha();
        self.core.trip();
        let mut v: Value = con
            .send_packed_command(&self.core.evalsha(&sha, key, cost, at, write))
            .await
            .map_err(BackendError::from_redis)?;
        if is_noscript(&v) {
            let sha = self.reload(con).await?;
            self.core.trip();
            v = con
                .send_packed_command(&self.core.evalsha(&sha, key, cost, at, write))
                .await
                .map_err(BackendError::from_redis)?;
        }
        decision(v, at)
    }

    async fn pipelined(
        &self,
        con: &mut MultiplexedConnection,
        requests: &[(&str, u64)],
    ) -> Result<Vec<Decision>, BackendError> {
        let pipe = self.core.pipeline(&self.core.sha(), requests);
        self.core.trip();
        let values = con
            .send_packed_commands(&pipe, 0, requests.len())
            .await
            .map_err(BackendError::from_redis)?;
        let missed = noscript_indices(&values);
        let mut again = Vec::new();
        if !missed.is_empty() {
            let sha = self.reload(con).await?;
            let pipe = self.core.retry_pipeline(&sha, requests, &missed);
            self.core.trip();
            again = con
                .send_packed_commands(&pipe, 0, missed.len())
                .await
                .map_err(BackendError::from_redis)?;
        }
        batch_decisions(values, missed, again)
    }
}
