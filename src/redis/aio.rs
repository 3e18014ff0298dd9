//! The async client (feature `redis-async`, tokio): [`AsyncRedisLimiter`].

use super::client::{client_accessors, Answers, At, ClientCore, Mode, Reply, Req, Trip};
use super::connection::{cluster_nodes_cmd, info_cluster_cmd, says_cluster, Target};
use super::replies::noscript_indices;
#[cfg(doc)]
use super::FailMode;
use super::{BackendError, RedisAlgorithm, RedisBuilder};
use crate::decision::Decision;
use crate::error::QuotaError;
use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{AsyncConnectionConfig, Client, Value};
use futures_util::future::join_all;
use parking_lot::Mutex;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

/// The async twin of [`RedisLimiter`](super::RedisLimiter), on tokio: the same scripts,
/// decisions, fail modes and local fast path.
///
/// One multiplexed connection serves every task: concurrent requests are pipelined on it
/// automatically, so share one limiter rather than opening one per task; cloning it is cheap
/// and the clones share the connection, the local fast path and the counters. On a Redis
/// Cluster, one cluster connection (a multiplexed connection per node) does the same. The
/// response timeout is [`RedisBuilder::io_timeout`]. Needs a tokio runtime.
///
/// It is an [`AsyncRateLimiter<str>`](crate::AsyncRateLimiter) (its future applies the
/// [`FailMode`] to an outage and returns any other backend error), so `hotlimit-tower`'s
/// `RateLimitLayer` can put it in front of a service: one limit shared by every instance.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use hotlimit::{algo::Gcra, redis::RedisLimiter, AsyncRateLimiter};
///
/// let limiter = RedisLimiter::builder("redis://127.0.0.1:6379/", "10/s".parse::<Gcra>()?)
///     .build_async()
///     .await?;
/// // An outage answers the fail mode; another backend error is returned.
/// if limiter.check_async("203.0.113.7").await?.is_denied() {
///     // 429
/// }
/// # Ok(())
/// # }
/// ```
pub struct AsyncRedisLimiter<A> {
    // Each behind an `Arc`: a clone shares them all (the async trait's future owns a clone).
    pub(super) core: Arc<ClientCore<A>>,
    target: Arc<Target>,
    conn: Arc<Mutex<AsyncSlot>>,
}

impl<A> Clone for AsyncRedisLimiter<A> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
            target: self.target.clone(),
            conn: self.conn.clone(),
        }
    }
}

#[derive(Default)]
struct AsyncSlot {
    con: Option<AsyncCon>,
    down_until: Option<Instant>,
}

/// An open connection: to one server, or to a cluster (routed by key slot, following
/// `MOVED`/`ASK`). Both are cheap handles to a shared connection task.
#[derive(Clone)]
enum AsyncCon {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// An async connection that counts what it sends in the limiter's `round_trips`, as
/// [`Counted`](super::connection::Counted) does for the sync one.
struct CountedAsync<'c> {
    con: &'c mut AsyncCon,
    trips: &'c std::sync::atomic::AtomicU64,
}

impl ::redis::aio::ConnectionLike for CountedAsync<'_> {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a ::redis::Cmd,
    ) -> ::redis::RedisFuture<'a, Value> {
        self.trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.con {
            AsyncCon::Single(con) => con.req_packed_command(cmd),
            AsyncCon::Cluster(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<Value>> {
        self.trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.con {
            AsyncCon::Single(con) => con.req_packed_commands(cmd, offset, count),
            AsyncCon::Cluster(con) => con.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &*self.con {
            AsyncCon::Single(con) => con.get_db(),
            AsyncCon::Cluster(con) => con.get_db(),
        }
    }
}

impl<A: fmt::Debug> fmt::Debug for AsyncRedisLimiter<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.config.fmt_limiter(f, "AsyncRedisLimiter")
    }
}

impl<A: RedisAlgorithm> RedisBuilder<A> {
    /// [`build`](RedisBuilder::build) for the async client: opens the client, connects and loads
    /// the script; a URL that names a Redis Cluster node gives a cluster client (see
    /// [`RedisBuilder`]).
    pub async fn build_async(self) -> Result<AsyncRedisLimiter<A>, BackendError> {
        let mut trips = 0;
        let (target, first) = if self.seeds.is_empty() {
            let client = Client::open(self.url.as_str()).map_err(BackendError::from_redis)?;
            let mut con = client
                .get_multiplexed_async_connection_with_config(&single_config(&self))
                .await
                .map_err(BackendError::from_redis)?;
            trips += 1;
            if says_cluster(con.req_packed_command(&info_cluster_cmd()).await) {
                trips += 1;
                let nodes = con
                    .req_packed_command(&cluster_nodes_cmd())
                    .await
                    .and_then(|v| ::redis::from_redis_value::<String>(&v))
                    .unwrap_or_default();
                (Target::Cluster(self.cluster_client(&nodes)?), None)
            } else {
                (Target::Single(client), Some(AsyncCon::Single(con)))
            }
        } else {
            (Target::Cluster(self.cluster_client("")?), None)
        };
        let limiter = AsyncRedisLimiter {
            core: Arc::new(ClientCore::new(self)),
            target: Arc::new(target),
            conn: Arc::new(Mutex::new(AsyncSlot {
                con: first,
                down_until: None,
            })),
        };
        for _ in 0..trips {
            limiter.core.trip();
        }
        let mut con = limiter.connection().await?;
        limiter.reload(&mut con).await?;
        Ok(limiter)
    }
}

impl<A: RedisAlgorithm> AsyncRedisLimiter<A> {
    client_accessors!(build_async);

    /// One request charged to every one of `levels` at once, all or nothing, in one script
    /// call: the sync client's [`check_all`](super::RedisLimiter::check_all), awaited.
    pub async fn check_all(
        &self,
        levels: &[(&str, Option<&A>)],
        cost: u64,
        at: Option<u64>,
    ) -> Result<(usize, Decision), BackendError> {
        if levels.is_empty() {
            return Ok((0, Decision::allowed()));
        }
        let invocation = self.core.levels(levels, cost, at)?;
        let mut con = self.connection().await?;
        let mut counted = CountedAsync {
            con: &mut con,
            trips: self.core.trips(),
        };
        let result = match invocation.invoke_async(&mut counted).await {
            Ok(v) => self.core.levels_answer(v, levels.len(), at),
            Err(e) => Err(BackendError::from_redis(e)),
        };
        self.on_error(&result);
        result
    }

    /// A request beyond a plain check, for `key`: a cost, a quota that comes with it, an
    /// explicit instant (see [`request`](crate::Requests::request) of [`RedisLimiter`](super::RedisLimiter)); then the
    /// async `check`, `peek`, `up_to`, `take` and `settle`, each returning the backend's
    /// failure rather than the [`FailMode`]'s answer.
    pub fn request<'a>(&'a self, key: &'a str) -> crate::Request<'a, Self, str, A> {
        crate::Request::new(self, key)
    }

    /// What [`check_n_async`](crate::AsyncRateLimiter::check_n_async) makes of a round trip's
    /// result, for a request run through [`request`](Self::request) (a per-request quota
    /// behind a layer of your own, as `hotlimit-tower`'s plans): an outage answers the
    /// [`FailMode`] (counted in `stats().failures`), any other backend error is counted in
    /// `stats().errors` and returned, a cost error is returned uncounted.
    pub fn fail_over(
        &self,
        result: Result<Decision, BackendError>,
    ) -> Result<Decision, BackendError> {
        self.core.fail_over_outages(result)
    }

    /// A batch of requests in one round trip, as
    /// [`RedisLimiter::try_check_pipelined`](super::RedisLimiter::try_check_pipelined). On a
    /// Redis Cluster the requests are sent concurrently, each to its key's node (redis-rs
    /// pipelines them per node), and each is retried on its own after a `NOSCRIPT`; the first
    /// error in batch order is returned.
    pub async fn try_check_pipelined(
        &self,
        requests: &[(&str, u64)],
    ) -> Result<Vec<Decision>, BackendError> {
        self.core.check_costs(requests)?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        // The first request's error in batch order is the batch's.
        self.send_pipelined(requests).await?.into_iter().collect()
    }

    /// Decides a batch of requests of cost 1, in order: `out` is cleared, then holds one
    /// decision per key. Batched as [`check_n_batch`](AsyncRedisLimiter::check_n_batch) is.
    pub async fn check_batch<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str>,
        out: &mut Vec<Decision>,
    ) {
        let mut answers = Vec::new();
        self.check_n_batch(keys.into_iter().map(|key| (key, 1)), &mut answers)
            .await;
        self.core.batch_of_ones(answers, out);
    }

    /// Decides a batch of `(key, cost)` requests in order, as the sync client's
    /// [`check_n_batch`](super::RedisLimiter::check_n_batch) does (an outage answered by the
    /// [`FailMode`], another backend error by a denial, each counted): one round trip
    /// per [`BATCH_TRIP`](super::BATCH_TRIP) requests, the local fast path before and after it,
    /// the fail mode for a failed one. On a Redis Cluster a round trip's requests go
    /// concurrently, each to its key's node.
    pub async fn check_n_batch<'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k str, u64)>,
        out: &mut Vec<Result<Decision, QuotaError>>,
    ) {
        out.clear();
        let mut trip = Trip::default();
        for (key, cost) in requests {
            if trip.add(&self.core, key, cost, out) {
                let result = self.send_pipelined(trip.requests()).await;
                trip.finish(&self.core, result, out);
            }
        }
        if !trip.requests().is_empty() {
            let result = self.send_pipelined(trip.requests()).await;
            trip.finish(&self.core, result, out);
        }
    }

    /// One round trip of a batch: each request's answer, or the error that failed the trip; a
    /// connection an error broke is dropped.
    async fn send_pipelined(&self, requests: &[(&str, u64)]) -> Result<Answers, BackendError> {
        let mut con = self.connection().await?;
        let result = self.pipelined(&mut con, requests).await;
        self.on_error(&result);
        // On a cluster each request has its own connection's fate.
        for answer in result.iter().flatten() {
            self.on_error(answer);
        }
        result
    }

    /// One script call: the checks and the local fast path, the round trip, the reply.
    pub(super) async fn run(&self, req: Req<'_, A>) -> Result<Reply, BackendError> {
        if let Some(d) = self.core.before(&req)? {
            return Ok(Reply::Decided(d));
        }
        let mut con = self.connection().await?;
        let result = match self.eval_one(&mut con, &req).await {
            Ok(v) => self.core.decode_reply(v, &req),
            Err(e) => Err(e),
        };
        self.on_error(&result);
        let reply = result?;
        self.core.after(&req, &reply);
        Ok(reply)
    }

    /// A broken connection is dropped; the next request reconnects.
    fn on_error<T>(&self, result: &Result<T, BackendError>) {
        if result.as_ref().is_err_and(BackendError::drops_connection) {
            self.conn.lock().con = None;
        }
    }

    async fn connection(&self) -> Result<AsyncCon, BackendError> {
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
        let opened = match &*self.target {
            Target::Single(client) => client
                .get_multiplexed_async_connection_with_config(&single_config(config))
                .await
                .map(AsyncCon::Single),
            Target::Cluster(client) => client.get_async_connection().await.map(AsyncCon::Cluster),
        };
        match opened {
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

    /// `SCRIPT LOAD`, by redis-rs (on a cluster, on every primary).
    async fn reload(&self, con: &mut AsyncCon) -> Result<(), BackendError> {
        self.core.trip();
        let script = &self.core.script;
        match con {
            AsyncCon::Single(c) => script.load_async(c).await,
            AsyncCon::Cluster(c) => script.load_async(c).await,
        }
        .map(drop)
        .map_err(BackendError::from_redis)
    }

    /// The script's raw reply to `req`: one round trip, three after a `NOSCRIPT` (redis-rs
    /// loads the script and sends it again).
    async fn eval_one(&self, con: &mut AsyncCon, req: &Req<'_, A>) -> Result<Value, BackendError> {
        let invocation = self.core.invocation(req);
        let mut counted = CountedAsync {
            con,
            trips: self.core.trips(),
        };
        invocation
            .invoke_async(&mut counted)
            .await
            .map_err(BackendError::from_redis)
    }

    async fn pipelined(
        &self,
        con: &mut AsyncCon,
        requests: &[(&str, u64)],
    ) -> Result<Answers, BackendError> {
        let single = match con {
            AsyncCon::Single(single) => single,
            AsyncCon::Cluster(_) => {
                // Every request on its own handle, all in flight at once.
                let futures = requests.iter().map(|&(key, cost)| {
                    let mut con = con.clone();
                    async move {
                        let req = Req::new(key, cost, At::Server, Mode::Check);
                        let v = self.eval_one(&mut con, &req).await?;
                        self.core.decode(v, At::Server)
                    }
                });
                return Ok(join_all(futures).await);
            }
        };
        let pipe = self.core.pipeline(requests);
        self.core.trip();
        let values = single
            .send_packed_commands(&pipe, 0, requests.len())
            .await
            .map_err(BackendError::from_redis)?;
        let missed = noscript_indices(&values);
        let mut again = Vec::new();
        if !missed.is_empty() {
            self.reload(con).await?;
            let AsyncCon::Single(single) = con else {
                unreachable!("a standalone connection stays one");
            };
            let pipe = self.core.retry_pipeline(requests, &missed);
            self.core.trip();
            again = single
                .send_packed_commands(&pipe, 0, missed.len())
                .await
                .map_err(BackendError::from_redis)?;
        }
        Ok(self.core.batch_decisions(values, missed, again))
    }
}

/// The standalone connection's configuration: the builder's timeouts.
fn single_config<A>(config: &RedisBuilder<A>) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(config.connect_timeout)
        .set_response_timeout(config.io_timeout)
}

/// The limiter behind the tower layer: an outage answers the [`FailMode`] (counted in
/// [`failures`](super::ClientStats::failures)); any other backend error (a script error, a
/// wrong type, a misrouted command) is returned, counted in
/// [`errors`](super::ClientStats::errors), so the layer answers 503 rather than pass or deny
/// as if the limit said so. The future owns a clone of the limiter and the key.
impl<A: RedisAlgorithm> crate::AsyncRateLimiter<str> for AsyncRedisLimiter<A> {
    type Error = BackendError;
    // Boxed: an `async` block has no name, and next to a round trip the box costs nothing.
    type Future = Pin<Box<dyn Future<Output = Result<Decision, BackendError>> + Send>>;

    fn check_n_async(&self, key: &str, cost: u64) -> Self::Future {
        let limiter = self.clone();
        let key = key.to_owned();
        Box::pin(async move {
            let r = limiter.request(&key).cost(cost).check().await;
            limiter.core.fail_over_outages(r)
        })
    }
}
