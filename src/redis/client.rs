//! What the sync and async clients share: everything but the connection.

use super::keys::redis_key;
use super::local_deny::LocalDeny;
use super::lua;
use super::{BackendError, FailMode, RedisAlgorithm, RedisBuilder, MAX_EXPLICIT_NOW};
use crate::decision::Decision;
use crate::error::{check_cost, CostError};
use ::redis::Value;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// One request's time: the server's (µs) or an explicit one (ns).
#[derive(Clone, Copy)]
pub(super) enum At {
    Server,
    Explicit(u64),
}

impl At {
    /// The scripts' time unit for this request, in nanoseconds.
    pub(super) fn unit_ns(self) -> f64 {
        match self {
            At::Server => 1e3,
            At::Explicit(_) => 1.0,
        }
    }
}

/// What the sync and async limiters share: the configuration, the script and its SHA1, the
/// parameters, the local fast path and the counters. Everything but the connection.
pub(super) struct ClientCore<A> {
    pub(super) config: RedisBuilder<A>,
    script: String,
    sha: Mutex<String>,
    /// ARGV 5.. in microseconds (server time) and in nanoseconds (explicit `now`).
    params_server: Vec<String>,
    params_explicit: Vec<String>,
    local: Option<LocalDeny>,
    round_trips: AtomicU64,
    failures: AtomicU64,
    errors: AtomicU64,
    /// The script's keys: the client's Redis key with each of these appended.
    suffixes: Vec<String>,
}

impl<A: RedisAlgorithm> ClientCore<A> {
    pub(super) fn new(config: RedisBuilder<A>) -> Self {
        let mut script = lua::PRELUDE.replace(
            "EXPLICIT_TTL_MS",
            &super::MIN_EXPLICIT_TTL.as_millis().to_string(),
        );
        let main = config.algo.lua(&mut script, &mut 0);
        script.push_str(&format!("return {main}(KEYS, ARGV, WRITE)\n"));
        ClientCore {
            suffixes: config.algo.key_suffixes(),
            params_server: config.algo.params(1e3),
            params_explicit: config.algo.params(1.0),
            script,
            sha: Mutex::new(String::new()),
            local: config.local.map(LocalDeny::new),
            round_trips: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            config,
        }
    }

    /// The decision of a script's reply to a request at `at`; a server error anywhere in it
    /// (the reply of an `AllOf` is nested) is the error.
    pub(super) fn decode(&self, v: Value, at: At) -> Result<Decision, BackendError> {
        let v = v.extract_error().map_err(BackendError::from_redis)?;
        self.config.algo.decode(v, at.unit_ns())
    }

    /// The decisions of a pipelined batch: its replies `values`, with `again` (the replies of
    /// the requests at `missed`, run again) in place of their `NOSCRIPT`s.
    pub(super) fn batch_decisions(
        &self,
        mut values: Vec<Value>,
        missed: Vec<usize>,
        again: Vec<Value>,
    ) -> Result<Vec<Decision>, BackendError> {
        for (i, v) in missed.into_iter().zip(again) {
            values[i] = v;
        }
        values
            .into_iter()
            .map(|v| self.decode(v, At::Server))
            .collect()
    }

    /// `prefix + "{" + escape(key) + "}"`: the hash tag keeps every Redis key of one client
    /// key in one cluster slot (for multi-key scripts) while different clients spread over
    /// the nodes. See `keys::escape`.
    pub(super) fn redis_key(&self, key: &str) -> String {
        redis_key(&self.config.prefix, key)
    }

    pub(super) fn trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests sent to Redis so far.
    pub(super) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Outages answered with the fail mode so far.
    pub(super) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Non-outage errors answered with a denial so far.
    pub(super) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub(super) fn sha(&self) -> String {
        self.sha.lock().clone()
    }

    pub(super) fn load_cmd(&self) -> ::redis::Cmd {
        let mut cmd = ::redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.script);
        cmd
    }

    /// Reads `SCRIPT LOAD`'s reply (the SHA1) and keeps it.
    pub(super) fn loaded(&self, v: Value) -> Result<String, BackendError> {
        let v = v.extract_error().map_err(BackendError::from_redis)?;
        let sha = ::redis::from_redis_value::<String>(&v)
            .map_err(|e| BackendError::Reply(e.to_string()))?;
        *self.sha.lock() = sha.clone();
        Ok(sha)
    }

    pub(super) fn evalsha(
        &self,
        sha: &str,
        key: &str,
        cost: u64,
        at: At,
        write: bool,
    ) -> ::redis::Cmd {
        let mut cmd = ::redis::cmd("EVALSHA");
        let base = self.redis_key(key);
        cmd.arg(sha).arg(self.suffixes.len());
        for suffix in &self.suffixes {
            if suffix.is_empty() {
                cmd.arg(&base);
            } else {
                cmd.arg(format!("{base}{suffix}"));
            }
        }
        let params = match at {
            At::Server => {
                cmd.arg("").arg("1000000");
                &self.params_server
            }
            At::Explicit(now) => {
                cmd.arg(now).arg("1000000000");
                &self.params_explicit
            }
        };
        cmd.arg(cost).arg(if write { "1" } else { "0" });
        for p in params {
            cmd.arg(p.as_str());
        }
        cmd
    }

    /// [`fail_over_outages`](ClientCore::fail_over_outages) for callers that must answer a decision:
    /// an error that is not an outage (a misconfiguration or a bug: a misrouted command, a
    /// wrong type, a bad reply) is the [`error_decision`](ClientCore::error_decision), never an
    /// allow, whatever the fail mode.
    pub(super) fn fail_over(
        &self,
        r: Result<Decision, BackendError>,
    ) -> Result<Decision, CostError> {
        match self.fail_over_outages(r) {
            Ok(d) => Ok(d),
            Err(BackendError::Cost(e)) => Err(e),
            Err(_) => Ok(self.error_decision()),
        }
    }

    /// The one place a backend failure is classified and counted: an outage answers the fail
    /// mode, counted in `failures`; any other backend error is returned, counted in `errors`
    /// (the async trait returns it, so the tower layer answers 503); a cost error is the
    /// caller's, counted nowhere.
    pub(super) fn fail_over_outages(
        &self,
        r: Result<Decision, BackendError>,
    ) -> Result<Decision, BackendError> {
        match r {
            Err(e) if e.is_outage() => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                Ok(self.config.fail_mode.decision())
            }
            Err(e @ BackendError::Cost(_)) => Err(e),
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
            ok => ok,
        }
    }

    /// The denial answered on a non-outage error: the closed fail mode's, else 1 s.
    pub(super) fn error_decision(&self) -> Decision {
        match self.config.fail_mode {
            FailMode::Closed { .. } => self.config.fail_mode.decision(),
            FailMode::Open => Decision::denied(1_000_000_000),
        }
    }

    /// Before the round trip: the cost and time checks, then the local fast path, which may
    /// answer (`Some`).
    pub(super) fn before(
        &self,
        key: &str,
        cost: u64,
        at: At,
        write: bool,
    ) -> Result<Option<Decision>, BackendError> {
        check_cost(cost, self.config.algo.capacity())?;
        if let At::Explicit(now) = at {
            if now > MAX_EXPLICIT_NOW {
                return Err(BackendError::TimeOutOfRange(now));
            }
        }
        let Some(l) = self.local.as_ref().filter(|_| write) else {
            return Ok(None);
        };
        Ok(match at {
            At::Server => l.lookup(key, cost, l.now(), false),
            At::Explicit(now) => l.lookup(key, cost, now, true),
        })
    }

    /// After the round trip: the local fast path learns from Redis' decision.
    pub(super) fn after(&self, key: &str, cost: u64, at: At, write: bool, d: &Decision) {
        let Some(l) = self.local.as_ref().filter(|_| write) else {
            return;
        };
        if d.is_allowed() {
            // The key's state moved: a remembered deadline may now be early.
            l.forget(key);
            return;
        }
        let (now, explicit) = match at {
            // Measured after the reply: Redis decided before this instant.
            At::Server => (l.now(), false),
            At::Explicit(now) => (now, true),
        };
        l.remember(
            key,
            cost,
            now.saturating_add(d.retry_after_nanos()),
            explicit,
        );
    }

    pub(super) fn check_costs(&self, requests: &[(&str, u64)]) -> Result<(), BackendError> {
        for &(_, cost) in requests {
            check_cost(cost, self.config.algo.capacity())?;
        }
        Ok(())
    }

    pub(super) fn pipeline(&self, sha: &str, requests: &[(&str, u64)]) -> ::redis::Pipeline {
        let mut pipe = ::redis::pipe();
        for &(key, cost) in requests {
            pipe.add_command(self.evalsha(sha, key, cost, At::Server, true));
        }
        pipe
    }

    /// The pipeline that runs again the requests at `missed` (indices into `requests`, from
    /// [`noscript_indices`](super::replies::noscript_indices)).
    pub(super) fn retry_pipeline(
        &self,
        sha: &str,
        requests: &[(&str, u64)],
        missed: &[usize],
    ) -> ::redis::Pipeline {
        let again: Vec<(&str, u64)> = missed.iter().map(|&i| requests[i]).collect();
        self.pipeline(sha, &again)
    }
}

/// The accessors both clients have, written once (each client holds `core: ClientCore<A>`
/// and `target: Target`); `$build` names its builder's method, for the docs.
macro_rules! client_accessors {
    ($build:ident) => {
        /// The algorithm.
        pub fn algorithm(&self) -> &A {
            &self.core.config.algo
        }

        /// The fail mode.
        pub fn fail_mode(&self) -> super::FailMode {
            self.core.config.fail_mode
        }

        /// The Redis key that holds `key`'s state: `prefix{escaped key}` (see the module docs).
        pub fn redis_key(&self, key: &str) -> String {
            self.core.redis_key(key)
        }

        #[doc = concat!(
                            "Whether this limiter talks to a Redis Cluster (detected at [`",
                            stringify!($build),
                            "`](super::RedisBuilder::",
                            stringify!($build),
                            "), or asked for with [`seed_nodes`](super::RedisBuilder::seed_nodes))."
                        )]
        pub fn is_cluster(&self) -> bool {
            self.target.is_cluster()
        }

        /// Requests sent to Redis so far (each a round trip; a pipelined batch counts once).
        pub fn round_trips(&self) -> u64 {
            self.core.round_trips()
        }

        /// Outages ([`BackendError::is_outage`](super::BackendError::is_outage)) that
        /// [`check`](Self::check) and the other fail-mode methods answered with the
        /// [`FailMode`](super::FailMode).
        pub fn failures(&self) -> u64 {
            self.core.failures()
        }

        /// Errors that are not outages (a script error, a wrong type, a misrouted command, a
        /// bad reply) that [`check`](Self::check) and the other fail-mode methods answered
        /// with a denial.
        pub fn errors(&self) -> u64 {
            self.core.errors()
        }
    };
}
pub(super) use client_accessors;
