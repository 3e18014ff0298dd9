//! The sync client: [`RedisLimiter`].

use super::shared::{batch_decisions, decision, is_noscript, noscript_indices, At, Core};
use super::{BackendError, Builder, RedisAlgorithm};
#[cfg(doc)]
use super::{FailMode, MAX_EXPLICIT_NOW};
use crate::decision::Decision;
use crate::error::CostError;
use ::redis::{Client, Connection, ConnectionLike};
use parking_lot::Mutex;
use std::fmt;
use std::time::Instant;

/// A rate limiter whose state lives in Redis, shared by every process that uses the same
/// server, key prefix and configuration. See the [module docs](super).
///
/// Holds one connection, used by one request at a time (a mutex): for parallel requests, give
/// each thread its own limiter ([`try_clone`](RedisLimiter::try_clone)).
pub struct RedisLimiter<A> {
    core: Core<A>,
    client: Client,
    conn: Mutex<Slot>,
}

impl<A: fmt::Debug> fmt::Debug for RedisLimiter<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.config.fmt_limiter(f, "RedisLimiter")
    }
}

impl<A: RedisAlgorithm> RedisLimiter<A> {
    /// A builder for a limiter running `algo` on the server at `url`
    /// (`redis://host:port/db`).
    pub fn builder(url: impl Into<String>, algo: A) -> Builder<A> {
        Builder::new(url.into(), algo)
    }

    /// A limiter with the default options ([`FailMode::Open`], prefix `hotlimit:`).
    pub fn connect(url: impl Into<String>, algo: A) -> Result<Self, BackendError> {
        Self::builder(url, algo).build()
    }

    /// Another limiter with the same configuration and its own connection (and its own local
    /// fast path), for another thread.
    pub fn try_clone(&self) -> Result<Self, BackendError> {
        self.core.config.clone().build()
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.core.config.algo
    }

    /// The fail mode.
    pub fn fail_mode(&self) -> super::FailMode {
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

    /// Backend failures [`check`](RedisLimiter::check) answered with the [`FailMode`].
    pub fn failures(&self) -> u64 {
        self.core.failures()
    }

    /// Decides a request of cost 1; on a backend failure, answers the [`FailMode`].
    pub fn check(&self, key: &str) -> Decision {
        match self.check_n(key, 1) {
            Ok(d) => d,
            // Cost 1 is always valid.
            Err(_) => self.core.config.fail_mode.decision(),
        }
    }

    /// Decides a request of `cost`; on a backend failure, answers the [`FailMode`].
    pub fn check_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        self.core.fail_over(self.try_check_n(key, cost))
    }

    /// Decides a request of `cost`, returning the backend's failure instead of applying the
    /// [`FailMode`].
    pub fn try_check_n(&self, key: &str, cost: u64) -> Result<Decision, BackendError> {
        self.run(key, cost, At::Server, true)
    }

    /// [`try_check_n`](RedisLimiter::try_check_n) at an explicit `now` (nanoseconds on the
    /// caller's timeline, at most [`MAX_EXPLICIT_NOW`]) instead of Redis' clock: for tests and
    /// trace replay. Never mix with server-time calls on one key.
    pub fn try_check_n_at(
        &self,
        key: &str,
        cost: u64,
        now_ns: u64,
    ) -> Result<Decision, BackendError> {
        self.run(key, cost, At::Explicit(now_ns), true)
    }

    /// What [`check`](RedisLimiter::check) would answer, without counting the request; on a
    /// backend failure, the [`FailMode`].
    pub fn peek(&self, key: &str) -> Decision {
        match self.core.fail_over(self.try_peek_n(key, 1)) {
            Ok(d) => d,
            Err(_) => self.core.config.fail_mode.decision(),
        }
    }

    /// What [`try_check_n`](RedisLimiter::try_check_n) would answer, without counting the
    /// request. Never answered by the local fast path.
    pub fn try_peek_n(&self, key: &str, cost: u64) -> Result<Decision, BackendError> {
        self.run(key, cost, At::Server, false)
    }

    /// [`try_peek_n`](RedisLimiter::try_peek_n) at an explicit `now` (see
    /// [`try_check_n_at`](RedisLimiter::try_check_n_at)).
    pub fn try_peek_n_at(
        &self,
        key: &str,
        cost: u64,
        now_ns: u64,
    ) -> Result<Decision, BackendError> {
        self.run(key, cost, At::Explicit(now_ns), false)
    }

    /// Decides a batch of requests `(key, cost)` in one round trip (a pipeline of `EVALSHA`),
    /// in order, each atomic on its own. Every cost is checked before anything is sent. The
    /// local fast path is not used. On a connection failure nothing is known of which requests
    /// were counted.
    pub fn try_check_pipelined(
        &self,
        requests: &[(&str, u64)],
    ) -> Result<Vec<Decision>, BackendError> {
        self.core.check_costs(requests)?;
        let mut guard = self.conn.lock();
        let result = self.pipelined(&mut guard, requests);
        if result.as_ref().is_err_and(BackendError::drops_connection) {
            guard.con = None;
        }
        result
    }

    fn run(&self, key: &str, cost: u64, at: At, write: bool) -> Result<Decision, BackendError> {
        if let Some(d) = self.core.before(key, cost, at, write)? {
            return Ok(d);
        }
        let mut guard = self.conn.lock();
        let result = self.eval_one(&mut guard, key, cost, at, write);
        if result.as_ref().is_err_and(BackendError::drops_connection) {
            guard.con = None;
        }
        drop(guard);
        let d = result?;
        self.core.after(key, cost, at, write, &d);
        Ok(d)
    }

    fn connection<'c>(&self, slot: &'c mut Slot) -> Result<&'c mut Connection, BackendError> {
        if slot.con.is_none() {
            if slot.down_until.is_some_and(|t| Instant::now() < t) {
                return Err(BackendError::Unavailable);
            }
            let config = &self.core.config;
            let opened = self
                .client
                .get_connection_with_timeout(config.connect_timeout)
                .and_then(|con| {
                    con.set_read_timeout(Some(config.io_timeout))?;
                    con.set_write_timeout(Some(config.io_timeout))?;
                    Ok(con)
                });
            match opened {
                Ok(con) => {
                    slot.con = Some(con);
                    slot.down_until = None;
                }
                Err(e) => {
                    slot.down_until = Some(Instant::now() + config.reconnect_after);
                    return Err(BackendError::from_redis(e));
                }
            }
        }
        slot.con
            .as_mut()
            .ok_or_else(|| BackendError::Reply("no connection".into()))
    }

    /// `SCRIPT LOAD`: returns the script's SHA1 and keeps it.
    fn reload(&self, con: &mut Connection) -> Result<String, BackendError> {
        self.core.trip();
        let v = con
            .req_packed_command(&self.core.load_cmd().get_packed_command())
            .map_err(BackendError::from_redis)?;
        self.core.loaded(v)
    }

    fn eval_one(
        &self,
        slot: &mut Slot,
        key: &str,
        cost: u64,
        at: At,
        write: bool,
    ) -> Result<Decision, BackendError> {
        let con = self.connection(slot)?;
        let cmd = |sha: &str| {
            self.core
                .evalsha(sha, key, cost, at, write)
                .get_packed_command()
        };
        self.core.trip();
        let mut v = con
            .req_packed_command(&cmd(&self.core.sha()))
            .map_err(BackendError::from_redis)?;
        if is_noscript(&v) {
            let sha = self.reload(con)?;
            self.core.trip();
            v = con
                .req_packed_command(&cmd(&sha))
                .map_err(BackendError::from_redis)?;
        }
        decision(v, at)
    }

    fn pipelined(
        &self,
        slot: &mut Slot,
        requests: &[(&str, u64)],
    ) -> Result<Vec<Decision>, BackendError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let con = self.connection(slot)?;
        let pipe = self.core.pipeline(&self.core.sha(), requests);
        self.core.trip();
        let values = con
            .req_packed_commands(&pipe.get_packed_pipeline(), 0, requests.len())
            .map_err(BackendError::from_redis)?;
        // After a SCRIPT FLUSH, the requests that got NOSCRIPT were not run: run them again.
        let missed = noscript_indices(&values);
        let mut again = Vec::new();
        if !missed.is_empty() {
            let sha = self.reload(con)?;
            let pipe = self.core.retry_pipeline(&sha, requests, &missed);
            self.core.trip();
            again = con
                .req_packed_commands(&pipe.get_packed_pipeline(), 0, missed.len())
                .map_err(BackendError::from_redis)?;
        }
        batch_decisions(values, missed, again)
    }
}

impl<A: RedisAlgorithm> Builder<A> {
    /// Opens the client, connects and loads the script: fails if the URL is invalid or the
    /// server cannot be reached now.
    pub fn build(self) -> Result<RedisLimiter<A>, BackendError> {
        let client = Client::open(self.url.as_str()).map_err(BackendError::from_redis)?;
        let limiter = RedisLimiter {
            core: Core::new(self),
            client,
            conn: Mutex::new(Slot::default()),
        };
        {
            let mut slot = limiter.conn.lock();
            let con = limiter.connection(&mut slot)?;
            match limiter.reload(con) {
                Ok(_) => {}
                Err(e) => {
                    slot.con = None;
                    return Err(e);
                }
            }
        }
        Ok(limiter)
    }
}

/// The connection, if open, and until when not to try opening one.
#[derive(Default)]
struct Slot {
    con: Option<Connection>,
    down_until: Option<Instant>,
}
