//! The sync client: [`RedisLimiter`].

use super::client::{client_accessors, Answers, At, ClientCore, Mode, Reply, Req, Trip};
use super::connection::{Con, ConnSlot, Counted, Target};
use super::replies::noscript_indices;
use super::{BackendError, RedisAlgorithm, RedisBuilder};
#[cfg(doc)]
use super::{FailMode, MAX_EXPLICIT_NOW};
use crate::decision::Decision;
use crate::error::QuotaError;
use ::redis::Value;
use parking_lot::Mutex;
use std::fmt;

/// The most requests [`RedisLimiter::check_n_batch`] (and the async client's) sends in one
/// round trip: past about 64
/// the pipeline's rate no longer grows (`BENCHMARKS.md`, "Redis backend"), and a bound keeps a
/// round trip well inside the I/O timeout whatever the batch.
pub const BATCH_TRIP: usize = 256;

/// A rate limiter whose state lives in Redis, shared by every process that uses the same
/// server, key prefix and configuration. See the [module docs](super).
///
/// Holds one connection (on a Redis Cluster, one cluster connection: one connection per node),
/// used by one request at a time (a mutex): for parallel requests, give each thread its own
/// limiter ([`try_clone`](RedisLimiter::try_clone)).
pub struct RedisLimiter<A> {
    pub(super) core: ClientCore<A>,
    target: Target,
    conn: Mutex<ConnSlot>,
}

impl<A: fmt::Debug> fmt::Debug for RedisLimiter<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.config.fmt_limiter(f, "RedisLimiter")
    }
}

impl<A: RedisAlgorithm> RedisLimiter<A> {
    /// A builder for a limiter running `algo` on the server at `url`
    /// (`redis://host:port/db`).
    pub fn builder(url: impl Into<String>, algo: A) -> RedisBuilder<A> {
        RedisBuilder::new(url.into(), algo)
    }

    /// Another limiter with the same configuration and its own connection (and its own local
    /// fast path), for another thread.
    pub fn try_clone(&self) -> Result<Self, BackendError> {
        self.core.config.clone().build()
    }

    client_accessors!(build);

    /// Decides a batch of requests `(key, cost)` in one round trip (a pipeline of `EVALSHA`),
    /// in order, each atomic on its own. Every cost is checked before anything is sent. The
    /// local fast path is not used. On a connection failure nothing is known of which requests
    /// were counted.
    ///
    /// On a Redis Cluster the requests are sent one after another, each to its key's node (a
    /// round trip each): redis-rs' cluster pipeline reports only the first error of a batch,
    /// so after a `NOSCRIPT` (a failover, a `SCRIPT FLUSH`) it could not tell which requests
    /// ran. The first error ends the batch. For one round trip per batch on a cluster, use the
    /// async client, which sends them concurrently.
    pub fn try_check_pipelined(
        &self,
        requests: &[(&str, u64)],
    ) -> Result<Vec<Decision>, BackendError> {
        self.core.check_costs(requests)?;
        // The first request's error is the batch's, as on a cluster.
        self.send_pipelined(requests)?.into_iter().collect()
    }

    /// One request charged to every one of `levels` at once, all or nothing: a hierarchy
    /// (user ⊂ organisation ⊂ global, say), each level a key of this limiter with its own
    /// quota (`None`: the limiter's; a quota must read its states, as
    /// [`Request::quota`](crate::Request::quota)'s). One script call: every level decides on
    /// the state as it is; if all allow, all are charged; else only the first that denied
    /// counts the denial, by its own policy, and no other level is touched. Answers as
    /// [`check_all`](crate::check_all) does in memory: `(level, decision)`, the first level
    /// that denied (its retry waiting for every later level too), else the tightest level
    /// (the least remaining). `at`: an explicit instant (nanoseconds on the caller's
    /// timeline, as [`request`](crate::Requests::request)'s `at`), else Redis' clock.
    ///
    /// The local fast path is not used and the fail mode does not apply: the backend's
    /// failure is returned. A Redis key at two levels is refused
    /// ([`ConfigError::Repeated`](crate::ConfigError::Repeated)). On a Redis Cluster every
    /// level's key must live in one slot: give the limiter a prefix holding a hash tag
    /// (`"rl:{tenants}:"`), which puts all its keys in that tag's slot; else the cluster
    /// answers `CROSSSLOT` ([`BackendError::Script`]).
    ///
    /// ```no_run
    /// use hotlimit::{algo::Gcra, redis::RedisLimiter};
    ///
    /// let limiter = RedisLimiter::builder("redis://127.0.0.1/", "100/s".parse::<Gcra>()?)
    ///     .key_prefix("rl:{tenants}:")
    ///     .build()?;
    /// let (user, org): (Gcra, Gcra) = ("10/s".parse()?, "50/s".parse()?);
    /// let levels = [("user:alice", Some(&user)), ("org:acme", Some(&org)), ("global", None)];
    /// let (level, decision) = limiter.check_all(&levels, 1, None)?;
    /// if decision.is_denied() {
    ///     println!("denied by level {level}: retry in {:?}", decision.retry_after());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_all(
        &self,
        levels: &[(&str, Option<&A>)],
        cost: u64,
        at: Option<u64>,
    ) -> Result<(usize, Decision), BackendError> {
        if levels.is_empty() {
            return Ok((0, Decision::allowed()));
        }
        let invocation = self.core.levels(levels, cost, at)?;
        let mut guard = self.conn.lock();
        let result = self
            .connection(&mut guard)
            .and_then(|con| {
                let mut counted = Counted::new(con, self.core.trips());
                invocation
                    .invoke(&mut counted)
                    .map_err(BackendError::from_redis)
            })
            .and_then(|v| self.core.levels_answer(v, levels.len(), at));
        if result.as_ref().is_err_and(BackendError::drops_connection) {
            guard.drop_connection();
        }
        result
    }

    /// Both batches: `(key, cost)` requests in order, as `check_n_batch` describes, without
    /// collecting them first.
    fn decide_batch<'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k str, u64)>,
        out: &mut Vec<Result<Decision, QuotaError>>,
    ) {
        out.clear();
        if self.target.is_cluster() {
            out.extend(
                requests
                    .into_iter()
                    .map(|(key, cost)| self.check_n(key, cost)),
            );
            return;
        }
        let mut trip = Trip::default();
        for (key, cost) in requests {
            if trip.add(&self.core, key, cost, out) {
                let result = self.send_pipelined(trip.requests());
                trip.finish(&self.core, result, out);
            }
        }
        if !trip.requests().is_empty() {
            let result = self.send_pipelined(trip.requests());
            trip.finish(&self.core, result, out);
        }
    }

    /// One pipeline round trip (one script call a request, on a cluster one after another, the
    /// first error ending it): each request's answer, or the error that failed the trip; a
    /// connection it broke is dropped.
    fn send_pipelined(&self, requests: &[(&str, u64)]) -> Result<Answers, BackendError> {
        let mut guard = self.conn.lock();
        let result = self.pipelined(&mut guard, requests);
        if result.as_ref().is_err_and(BackendError::drops_connection) {
            guard.drop_connection();
        }
        result
    }

    fn decide_req(&self, req: Req<'_, A>) -> Result<Decision, BackendError> {
        self.run(req)?.decision()
    }

    /// One script call: the checks and the local fast path, the round trip, the reply.
    pub(super) fn run(&self, req: Req<'_, A>) -> Result<Reply, BackendError> {
        if let Some(d) = self.core.before(&req)? {
            return Ok(Reply::Decided(d));
        }
        let mut guard = self.conn.lock();
        let result = self
            .eval_one(&mut guard, &req)
            .and_then(|v| self.core.decode_reply(v, &req));
        if result.as_ref().is_err_and(BackendError::drops_connection) {
            guard.drop_connection();
        }
        drop(guard);
        let reply = result?;
        self.core.after(&req, &reply);
        Ok(reply)
    }

    fn connection<'c>(&self, slot: &'c mut ConnSlot) -> Result<&'c mut Con, BackendError> {
        slot.connection(&self.target, &self.core.config)
    }

    /// `SCRIPT LOAD`, by redis-rs (on a cluster, on every primary).
    fn reload(&self, con: &mut Con) -> Result<(), BackendError> {
        self.core.trip();
        self.core
            .script
            .load(con.like())
            .map(drop)
            .map_err(BackendError::from_redis)
    }

    /// The script's raw reply to `req`: one round trip, three after a `NOSCRIPT` (redis-rs
    /// loads the script and sends it again).
    fn eval_one(&self, slot: &mut ConnSlot, req: &Req<'_, A>) -> Result<Value, BackendError> {
        let con = self.connection(slot)?;
        let mut counted = Counted::new(con, self.core.trips());
        self.core
            .invocation(req)
            .invoke(&mut counted)
            .map_err(BackendError::from_redis)
    }

    fn pipelined(
        &self,
        slot: &mut ConnSlot,
        requests: &[(&str, u64)],
    ) -> Result<Answers, BackendError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        if matches!(self.connection(slot)?, Con::Cluster(_)) {
            return requests
                .iter()
                .map(|&(key, cost)| {
                    let req = Req::new(key, cost, At::Server, Mode::Check);
                    self.core.decode(self.eval_one(slot, &req)?, At::Server)
                })
                .map(|answer| answer.map(Ok))
                .collect();
        }
        let con = self.connection(slot)?;
        let pipe = self.core.pipeline(requests);
        self.core.trip();
        let values = con
            .like()
            .req_packed_commands(&pipe.get_packed_pipeline(), 0, requests.len())
            .map_err(BackendError::from_redis)?;
        // After a SCRIPT FLUSH, the requests that got NOSCRIPT were not run: run them again.
        let missed = noscript_indices(&values);
        let mut again = Vec::new();
        if !missed.is_empty() {
            self.reload(con)?;
            let pipe = self.core.retry_pipeline(requests, &missed);
            self.core.trip();
            again = con
                .like()
                .req_packed_commands(&pipe.get_packed_pipeline(), 0, missed.len())
                .map_err(BackendError::from_redis)?;
        }
        Ok(self.core.batch_decisions(values, missed, again))
    }
}

/// The sync client's decisions, each a round trip (or the local fast path's answer): `check`
/// and `check_n` need no trait in scope (the client is no `RateLimiter`); every other request
/// is [`Requests::request`](crate::Requests::request)'s, as on every limiter of the crate.
impl<A: RedisAlgorithm> RedisLimiter<A> {
    /// Decides a request of cost 1; on an outage, answers the [`FailMode`]; on any other
    /// backend error, a denial (see [`check_n`](RedisLimiter::check_n)).
    pub fn check(&self, key: &str) -> Decision {
        match self.check_n(key, 1) {
            Ok(d) => d,
            // Cost 1 is always valid.
            Err(_) => self.core.config.fail_mode.decision(),
        }
    }

    /// Decides a request of `cost`. On an outage ([`BackendError::is_outage`]) answers the
    /// [`FailMode`] and counts it in [`failures`](super::ClientStats::failures); on any other
    /// backend error answers a denial (with the `retry_after` of [`FailMode::Closed`] if that
    /// is the mode, else 1 s) and counts it in [`errors`](super::ClientStats::errors): a
    /// misconfiguration is never let through. Only a cost error is returned; a
    /// [`request`](crate::Requests::request)'s `check` returns the backend's failure instead.
    pub fn check_n(&self, key: &str, cost: u64) -> Result<Decision, QuotaError> {
        let req = Req::new(key, cost, At::Server, Mode::Check);
        self.core.fail_over(self.decide_req(req))
    }
}

/// The batches, named and typed as [`RateLimiter`](crate::RateLimiter)'s (any iterator of
/// requests), and a blocking wait. The
/// sync client is not one: each call holds its thread for a round trip, and a `RateLimiter`
/// never waits on I/O (so it is an async limiter at no cost, which this client must not be;
/// the tower layer takes the async client). An outage answers the [`FailMode`].
impl<A: RedisAlgorithm> RedisLimiter<A> {
    /// Decides a batch of requests of cost 1, in order, as one [`check`](RedisLimiter::check)
    /// each: `out` is cleared, then holds one decision per key. Batched as
    /// [`check_n_batch`](RedisLimiter::check_n_batch) is.
    pub fn check_batch<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str>,
        out: &mut Vec<Decision>,
    ) {
        let mut answers = Vec::new();
        self.decide_batch(keys.into_iter().map(|key| (key, 1)), &mut answers);
        self.core.batch_of_ones(answers, out);
    }

    /// Decides a batch of `(key, cost)` requests in order, as one
    /// [`check_n`](RedisLimiter::check_n) each (the [`FailMode`] answering an outage): `out` is
    /// cleared, then holds one answer per request, a refused cost that request's error (it is
    /// not sent). The local fast path, if enabled, answers from what it knew before each round
    /// trip and learns from its replies; the rest goes to Redis in **one round trip per
    /// [`BATCH_TRIP`] requests**, a pipeline of atomic script calls as in
    /// [`try_check_pipelined`](RedisLimiter::try_check_pipelined) (bounded, so that a huge
    /// batch cannot outlast the I/O timeout). A failed round trip answers every request it
    /// carried as `check_n` would have (counted once each in
    /// [`failures`](super::ClientStats::failures) or [`errors`](super::ClientStats::errors)); which of them
    /// Redis counted is then unknown. On a Redis Cluster, one `check_n` after another (see
    /// `try_check_pipelined` for why).
    pub fn check_n_batch<'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k str, u64)>,
        out: &mut Vec<Result<Decision, QuotaError>>,
    ) {
        self.decide_batch(requests, out);
    }

    /// Waits on the calling thread until a request of cost 1 for `key` is allowed: sleeps for
    /// each denial's `retry_after` and asks again (other instances may take the freed quota
    /// first, so it may wait more than once). An outage answers the [`FailMode`] (open: at
    /// once; closed: its `retry_after`, then again). An error that is not an outage returns its
    /// denial at once rather than wait on a misconfiguration forever.
    pub fn until_ready_blocking(&self, key: &str) -> Decision {
        loop {
            let req = Req::new(key, 1, At::Server, Mode::Check);
            let d = match self.core.fail_over_outages(self.decide_req(req)) {
                Ok(d) => d,
                // Not an outage (cost 1 is always valid): counted, and answered at once.
                Err(_) => return self.core.error_decision(),
            };
            if d.is_allowed() {
                return d;
            }
            // At least 1 ms, so a zero wait cannot spin on the server.
            std::thread::sleep(d.retry_after().max(std::time::Duration::from_millis(1)));
        }
    }
}

impl<A: RedisAlgorithm> RedisBuilder<A> {
    /// Opens the client, connects and loads the script: fails if the URL is invalid or the
    /// server cannot be reached now. A URL that names a Redis Cluster node gives a cluster
    /// client (see [`RedisBuilder`]); on a cluster the script is loaded on every primary.
    pub fn build(self) -> Result<RedisLimiter<A>, BackendError> {
        let (target, slot, trips) = self.open_target()?;
        let limiter = RedisLimiter {
            core: ClientCore::new(self),
            target,
            conn: Mutex::new(slot),
        };
        for _ in 0..trips {
            limiter.core.trip();
        }
        {
            let mut slot = limiter.conn.lock();
            let con = limiter.connection(&mut slot)?;
            match limiter.reload(con) {
                Ok(_) => {}
                Err(e) => {
                    slot.drop_connection();
                    return Err(e);
                }
            }
        }
        Ok(limiter)
    }
}
