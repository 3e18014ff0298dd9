//! A Redis backend: the same algorithms and [`Decision`]s, one limit shared by every instance
//! of a service. Enabled by the `redis` feature (off by default; it depends on the `redis`
//! crate, sync client only).
//!
//! ```no_run
//! use hotlimit::{algo::Gcra, redis::{FailMode, RedisLimiter}};
//! use std::time::Duration;
//!
//! let limiter = RedisLimiter::builder("redis://127.0.0.1:6379/", "10/s burst 5".parse::<Gcra>()?)
//!     .key_prefix("api:")
//!     .fail_mode(FailMode::Closed { retry_after: Duration::from_secs(1) })
//!     .local_fast_path(10_000)
//!     .build()?;
//! let decision = limiter.check("203.0.113.7");
//! if decision.is_denied() {
//!     println!("429, retry after {:?}", decision.retry_after());
//! }
//! // The same call, with the backend's failures visible instead of the fail mode applied:
//! match limiter.try_check_n("203.0.113.7", 1) {
//!     Ok(d) => println!("{d:?}"),
//!     Err(e) => eprintln!("rate limiter backend: {e}"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How it works
//!
//! [`algo::Gcra`](crate::algo::Gcra), [`algo::Earrrl`](crate::algo::Earrrl) and
//! [`algo::Exponential`](crate::algo::Exponential) run as Lua scripts, ports of their Rust
//! steps line by line (`honest_wait` included, so a denied `retry_after` is honest). Each
//! script is loaded once (`SCRIPT LOAD`), called by `EVALSHA` and loaded again when the server
//! answers `NOSCRIPT` (after a restart or a `SCRIPT FLUSH`), so each decision is one atomic
//! round trip: Redis runs one script at a time, which makes decisions linearizable per key
//! across every client.
//!
//! **Time** is Redis' own clock (`TIME`, read inside the script), so instances whose clocks
//! disagree still share one timeline. It is read in **microseconds** since the Unix epoch:
//! Lua's numbers are `f64`, exact for integers below 2^53, which nanoseconds since 1970
//! (1.7·10^18) exceed and microseconds (1.7·10^15) do not. So in production the resolution of
//! every time (`retry_after`, `reset_after`, stored states) is 1 µs, and a GCRA emission
//! interval that is not a whole number of microseconds is kept as a fraction of one. Times
//! sent back are converted to nanoseconds, `retry_after` rounded up (still honest).
//!
//! The `*_at` methods take an explicit `now` (nanoseconds, below 2^53) instead: for tests and
//! trace replay, where the scripts then run the very integer and float arithmetic of the
//! in-memory algorithms (see *Equivalence*). Never mix the two timelines on one key.
//!
//! **State** per key: GCRA's `tat`, EARRRL's virtual time `S`, exponential's `"t r"`, as
//! decimal strings that round-trip an `f64` exactly (`%.17g`). Each write sets `PX` to the time
//! the algorithm's [`idle_at`](crate::Algorithm::idle_at) says the state becomes equivalent to a
//! fresh key (rounded up to a millisecond): expiry is lossless, never a fixed TTL that would
//! forgive an abuser early. A leaky denial writes nothing. With explicit `now`, the expiry is
//! that many milliseconds of the *real* clock from the write; a replay slower than real time
//! would see keys expire early.
//!
//! Keys are `key_prefix + key` (default prefix `hotlimit:`); limiters with different
//! algorithms or quotas must use different prefixes, and every instance sharing a prefix must
//! use the same configuration.
//!
//! # Failures
//!
//! The connection has a connect timeout and read/write timeouts (defaults 250 ms and 500 ms),
//! so a dead server never hangs a request. A failed request drops the connection; the next
//! one reconnects, and if that fails, requests within
//! [`reconnect_after`](Builder::reconnect_after) (default 100 ms) fail at once
//! ([`BackendError::Unavailable`]) instead of each waiting for a connect timeout. [`RedisLimiter::try_check_n`] returns the [`BackendError`];
//! [`RedisLimiter::check`] and [`RedisLimiter::check_n`] apply the [`FailMode`] instead
//! (open: allow; closed: deny with a fixed `retry_after`) and count the failure
//! ([`RedisLimiter::failures`]).
//!
//! # Local fast path
//!
//! [`Builder::local_fast_path`] keeps, in process, the keys Redis recently denied, with the
//! cost and the time until which it said the same request stays denied; such a request is then
//! denied locally, without a round trip. It may only deny what Redis would deny: other
//! instances' traffic can only push a key's state further from allowing (until it expires), and
//! the deadline is measured from when the reply arrived, after Redis decided. It never
//! allows locally. Local denials carry only `retry_after`, and are not counted in Redis: under
//! [`Policy::Strict`] they do not extend the lockout as a request that
//! reached Redis would.
//!
//! # Equivalence
//!
//! With an explicit `now`, GCRA gives the same [`Decision`]s as the in-memory limiter, field
//! for field (integers below 2^53 are exact in `f64`). EARRRL and exponential use `exp` and
//! `log` from the same C library, but Lua 5.1 has neither `log1p` nor `expm1`; their
//! replacements are accurate to a few ulps, not bit-identical, so states can differ in the last
//! bits. `tests/redis.rs` replays 3,000-request traces (three keys, bursts and gaps, both
//! policies) through both: every allow/deny decision agrees, rates agree to 1e-12 relative and
//! `retry_after` to 1 ns (plus 1e-12 relative); field-for-field identical decisions were 2,979
//! to 2,988 of 3,000 for EARRRL and about 2,600 of 3,000 for exponential. A decision could
//! differ only when a rate lands within a few ulps of the limit.
//!
//! # Throughput
//!
//! One connection does one round trip at a time; use one limiter per thread
//! ([`RedisLimiter::try_clone`] opens another connection), and
//! [`RedisLimiter::try_check_pipelined`] to send a batch in one round trip. `BENCHMARKS.md`
//! has the numbers.
//!
//! With the `redis-async` feature, `AsyncRedisLimiter` (from `Builder::build_async`) is the
//! same on tokio, over one multiplexed connection that pipelines concurrent tasks' requests.

#[cfg(feature = "redis-async")]
mod aio;
mod scripts;

#[cfg(feature = "redis-async")]
pub use aio::AsyncRedisLimiter;

use crate::algo::{Earrrl, Exponential, Gcra};
use crate::decision::{Decision, Policy};
use crate::error::{check_cost, CostError};
use crate::Algorithm;
use ::redis::{Client, Connection, ConnectionLike, RedisError, Value};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The latest explicit `now` (ns) the scripts count exactly: 2^53 − 1 (about 104 days).
pub const MAX_EXPLICIT_NOW: u64 = (1 << 53) - 1;

/// What [`RedisLimiter::check`] answers when the backend fails.
///
/// ```
/// use hotlimit::redis::FailMode;
/// use std::time::Duration;
///
/// let closed = FailMode::Closed { retry_after: Duration::from_secs(1) };
/// assert_eq!(closed.decision().retry_after(), Duration::from_secs(1));
/// assert!(FailMode::Open.decision().is_allowed());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// Allow every request while the backend is unreachable: availability first.
    Open,
    /// Deny every request while the backend is unreachable, telling the client to retry after
    /// `retry_after`: protection first.
    Closed {
        /// The `retry_after` of the denials.
        retry_after: Duration,
    },
}

impl FailMode {
    /// The decision this mode answers on a failure.
    pub fn decision(&self) -> Decision {
        match self {
            FailMode::Open => Decision::allowed(),
            FailMode::Closed { retry_after } => {
                Decision::denied(u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX))
            }
        }
    }
}

/// Why a Redis-backed decision could not be made.
///
/// ```
/// use hotlimit::{redis::BackendError, CostError};
///
/// let e = BackendError::from(CostError::Zero);
/// assert!(!e.is_backend_failure());
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendError {
    /// The request's cost can never be admitted (checked before any round trip).
    Cost(CostError),
    /// The server could not be reached or stopped answering (refused, reset, timed out).
    Connection(RedisError),
    /// The server answered with an error (a script error, an out-of-memory refusal, ...).
    Script(RedisError),
    /// The server's reply did not have the expected shape.
    Reply(String),
    /// The last attempt to connect failed less than
    /// [`reconnect_after`](Builder::reconnect_after) ago: not tried again yet, answered at
    /// once.
    Unavailable,
    /// An explicit `now` above [`MAX_EXPLICIT_NOW`].
    TimeOutOfRange(u64),
}

impl BackendError {
    /// Whether this is a failure of the backend (connection, server, reply), to which the
    /// [`FailMode`] applies, rather than a bad request.
    pub fn is_backend_failure(&self) -> bool {
        matches!(
            self,
            BackendError::Connection(_)
                | BackendError::Script(_)
                | BackendError::Reply(_)
                | BackendError::Unavailable
        )
    }

    fn from_redis(e: RedisError) -> Self {
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
        {
            BackendError::Connection(e)
        } else {
            BackendError::Script(e)
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Cost(e) => e.fmt(f),
            BackendError::Connection(e) => write!(f, "redis connection failed: {e}"),
            BackendError::Script(e) => write!(f, "redis script failed: {e}"),
            BackendError::Reply(s) => write!(f, "unexpected reply from redis: {s}"),
            BackendError::Unavailable => {
                f.write_str("redis unreachable at the last attempt; not retried yet")
            }
            BackendError::TimeOutOfRange(now) => write!(
                f,
                "explicit now {now} ns is above {MAX_EXPLICIT_NOW} (2^53 − 1), which Lua cannot count exactly"
            ),
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BackendError::Cost(e) => Some(e),
            BackendError::Connection(e) | BackendError::Script(e) => Some(e),
            _ => None,
        }
    }
}

impl From<CostError> for BackendError {
    fn from(e: CostError) -> Self {
        BackendError::Cost(e)
    }
}

mod private {
    pub trait Sealed {
        /// The Lua body (after the prelude).
        fn body(&self) -> &'static str;
        /// ARGV 5.., in time units of `unit_ns` nanoseconds.
        fn params(&self, unit_ns: f64) -> Vec<String>;
    }
}

/// An algorithm the Redis backend can run: [`Gcra`], [`Earrrl`], [`Exponential`]. Sealed.
pub trait RedisAlgorithm: Algorithm + private::Sealed + Clone {}

/// The shortest decimal that round-trips an `f64`; Lua's `tonumber` (strtod) reads it back
/// exactly.
fn num(x: f64) -> String {
    format!("{x:e}")
}

fn strict(p: Policy) -> String {
    if p == Policy::Strict { "1" } else { "0" }.to_string()
}

impl private::Sealed for Gcra {
    fn body(&self) -> &'static str {
        scripts::GCRA
    }
    fn params(&self, unit_ns: f64) -> Vec<String> {
        let t = self.emission_interval().as_nanos() as f64;
        let tau = self.tolerance() as f64;
        vec![num(t / unit_ns), num(tau / unit_ns), strict(self.policy())]
    }
}
impl RedisAlgorithm for Gcra {}

impl private::Sealed for Earrrl {
    fn body(&self) -> &'static str {
        scripts::EARRRL
    }
    fn params(&self, _unit_ns: f64) -> Vec<String> {
        let (lambda, max_rate, retry_offset, idle_offset) = self.redis_params();
        vec![
            num(lambda),
            num(max_rate),
            num(retry_offset),
            num(idle_offset),
            strict(self.policy()),
        ]
    }
}
impl RedisAlgorithm for Earrrl {}

impl private::Sealed for Exponential {
    fn body(&self) -> &'static str {
        scripts::EXPONENTIAL
    }
    fn params(&self, unit_ns: f64) -> Vec<String> {
        let p = self.period().as_nanos() as f64;
        vec![num(self.limit()), num(p / unit_ns), strict(self.policy())]
    }
}
impl RedisAlgorithm for Exponential {}

/// Configures a [`RedisLimiter`]; from [`RedisLimiter::builder`].
#[derive(Debug, Clone)]
pub struct Builder<A> {
    url: String,
    algo: A,
    prefix: String,
    fail_mode: FailMode,
    connect_timeout: Duration,
    io_timeout: Duration,
    local: Option<usize>,
    reconnect_after: Duration,
}

impl<A: RedisAlgorithm> Builder<A> {
    /// The prefix of every Redis key (default `hotlimit:`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// What [`RedisLimiter::check`] answers when the backend fails (default
    /// [`FailMode::Open`]).
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// The TCP connect timeout (default 250 ms).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// The read and write timeouts of the connection (default 500 ms).
    pub fn io_timeout(mut self, t: Duration) -> Self {
        self.io_timeout = t;
        self
    }

    /// After a failed connection attempt, answer [`BackendError::Unavailable`] at once
    /// (the [`FailMode`] in `check`) for this long before trying again (default 100 ms), so
    /// an unreachable server costs each request nothing rather than a connect timeout.
    pub fn reconnect_after(mut self, t: Duration) -> Self {
        self.reconnect_after = t;
        self
    }

    /// Remember up to `max_keys` recently denied keys in process and deny them locally, without
    /// a round trip, until Redis' `retry_after` has passed (see the module docs).
    pub fn local_fast_path(mut self, max_keys: usize) -> Self {
        self.local = Some(max_keys.max(1));
        self
    }

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

/// Recently denied keys: `key → (deny until, cost, explicit timeline)`.
struct LocalDeny {
    max: usize,
    map: Mutex<HashMap<String, (u64, u64, bool)>>,
    origin: Instant,
}

impl LocalDeny {
    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn lookup(&self, key: &str, cost: u64, now: u64, explicit: bool) -> Option<Decision> {
        let map = self.map.lock();
        let &(until, c, e) = map.get(key)?;
        (c == cost && e == explicit && until > now).then(|| Decision::denied(until - now))
    }

    fn forget(&self, key: &str) {
        let mut map = self.map.lock();
        if !map.is_empty() {
            map.remove(key);
        }
    }

    fn remember(&self, key: &str, cost: u64, until: u64, explicit: bool) {
        let mut map = self.map.lock();
        if map.len() >= self.max && !map.contains_key(key) {
            let now = self.now();
            map.retain(|_, &mut (u, _, e)| if e { true } else { u > now });
            if map.len() >= self.max {
                // Still full: forget everything rather than grow (only round trips are lost).
                map.clear();
            }
        }
        map.insert(key.to_owned(), (until, cost, explicit));
    }
}

/// One request's time: the server's (µs) or an explicit one (ns).
#[derive(Clone, Copy)]
enum At {
    Server,
    Explicit(u64),
}

/// What the sync and async limiters share: the configuration, the script and its SHA1, the
/// parameters, the local fast path and the counters. Everything but the connection.
struct Core<A> {
    config: Builder<A>,
    script: String,
    sha: Mutex<String>,
    /// ARGV 5.. in microseconds (server time) and in nanoseconds (explicit `now`).
    params_server: Vec<String>,
    params_explicit: Vec<String>,
    local: Option<LocalDeny>,
    round_trips: AtomicU64,
    failures: AtomicU64,
}

impl<A: RedisAlgorithm> Core<A> {
    fn new(config: Builder<A>) -> Self {
        let mut script = String::from(scripts::PRELUDE);
        script.push_str(config.algo.body());
        Core {
            params_server: config.algo.params(1e3),
            params_explicit: config.algo.params(1.0),
            script,
            sha: Mutex::new(String::new()),
            local: config.local.map(|max| LocalDeny {
                max,
                map: Mutex::new(HashMap::new()),
                origin: Instant::now(),
            }),
            round_trips: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            config,
        }
    }

    fn redis_key(&self, key: &str) -> String {
        let mut k = String::with_capacity(self.config.prefix.len() + key.len());
        k.push_str(&self.config.prefix);
        k.push_str(key);
        k
    }

    fn trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    fn sha(&self) -> String {
        self.sha.lock().clone()
    }

    fn load_cmd(&self) -> ::redis::Cmd {
        let mut cmd = ::redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.script);
        cmd
    }

    /// Reads `SCRIPT LOAD`'s reply (the SHA1) and keeps it.
    fn loaded(&self, v: Value) -> Result<String, BackendError> {
        let v = v.extract_error().map_err(BackendError::from_redis)?;
        let sha = ::redis::from_redis_value::<String>(&v)
            .map_err(|e| BackendError::Reply(e.to_string()))?;
        *self.sha.lock() = sha.clone();
        Ok(sha)
    }

    fn evalsha(&self, sha: &str, key: &str, cost: u64, at: At, write: bool) -> ::redis::Cmd {
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(sha).arg(1).arg(self.redis_key(key));
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

    fn fail_over(&self, r: Result<Decision, BackendError>) -> Result<Decision, CostError> {
        match r {
            Ok(d) => Ok(d),
            Err(BackendError::Cost(e)) => Err(e),
            Err(_) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                Ok(self.config.fail_mode.decision())
            }
        }
    }

    /// Before the round trip: the cost and time checks, then the local fast path, which may
    /// answer (`Some`).
    fn before(
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
    fn after(&self, key: &str, cost: u64, at: At, write: bool, d: &Decision) {
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

    fn check_costs(&self, requests: &[(&str, u64)]) -> Result<(), BackendError> {
        for &(_, cost) in requests {
            check_cost(cost, self.config.algo.capacity())?;
        }
        Ok(())
    }

    fn pipeline(&self, sha: &str, requests: &[(&str, u64)]) -> ::redis::Pipeline {
        let mut pipe = ::redis::pipe();
        for &(key, cost) in requests {
            pipe.add_command(self.evalsha(sha, key, cost, At::Server, true));
        }
        pipe
    }
}

/// A rate limiter whose state lives in Redis, shared by every process that uses the same
/// server, key prefix and configuration. See the [module docs](self).
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

impl<A: fmt::Debug> Builder<A> {
    fn fmt_limiter(&self, f: &mut fmt::Formatter<'_>, name: &str) -> fmt::Result {
        f.debug_struct(name)
            .field("algo", &self.algo)
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("fail_mode", &self.fail_mode)
            .field("local_fast_path", &self.local)
            .finish_non_exhaustive()
    }
}

impl<A: RedisAlgorithm> RedisLimiter<A> {
    /// A builder for a limiter running `algo` on the server at `url`
    /// (`redis://host:port/db`).
    pub fn builder(url: impl Into<String>, algo: A) -> Builder<A> {
        Builder {
            url: url.into(),
            algo,
            prefix: "hotlimit:".into(),
            fail_mode: FailMode::Open,
            connect_timeout: Duration::from_millis(250),
            io_timeout: Duration::from_millis(500),
            local: None,
            reconnect_after: Duration::from_millis(100),
        }
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

    /// The Redis key that holds `key`'s state.
    pub fn redis_key(&self, key: &str) -> String {
        self.core.redis_key(key)
    }

    /// Requests sent to Redis so far (each a round trip; a pipelined batch counts once).
    pub fn round_trips(&self) -> u64 {
        self.core.round_trips.load(Ordering::Relaxed)
    }

    /// Backend failures [`check`](RedisLimiter::check) answered with the [`FailMode`].
    pub fn failures(&self) -> u64 {
        self.core.failures.load(Ordering::Relaxed)
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
        if let Err(e) = &result {
            if !matches!(e, BackendError::Script(_)) {
                guard.con = None;
            }
        }
        result
    }

    fn run(&self, key: &str, cost: u64, at: At, write: bool) -> Result<Decision, BackendError> {
        if let Some(d) = self.core.before(key, cost, at, write)? {
            return Ok(d);
        }
        let mut guard = self.conn.lock();
        let result = self.eval_one(&mut guard, key, cost, at, write);
        if let Err(e) = &result {
            // A timed-out or broken connection may still deliver a stale reply: drop it.
            if !matches!(e, BackendError::Script(_)) {
                guard.con = None;
            }
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
        let mut values = con
            .req_packed_commands(&pipe.get_packed_pipeline(), 0, requests.len())
            .map_err(BackendError::from_redis)?;
        // After a SCRIPT FLUSH, the requests that got NOSCRIPT were not run: run them again.
        let missed: Vec<usize> = (0..values.len())
            .filter(|&i| is_noscript(&values[i]))
            .collect();
        if !missed.is_empty() {
            let sha = self.reload(con)?;
            let again: Vec<(&str, u64)> = missed.iter().map(|&i| requests[i]).collect();
            let pipe = self.core.pipeline(&sha, &again);
            self.core.trip();
            let again = con
                .req_packed_commands(&pipe.get_packed_pipeline(), 0, missed.len())
                .map_err(BackendError::from_redis)?;
            for (i, v) in missed.into_iter().zip(again) {
                values[i] = v;
            }
        }
        values
            .into_iter()
            .map(|v| decision(v, At::Server))
            .collect()
    }
}

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// Builds the [`Decision`] from a script's reply; times in the request's unit.
fn decision(v: Value, at: At) -> Result<Decision, BackendError> {
    let v = v.extract_error().map_err(BackendError::from_redis)?;
    let bad = || BackendError::Reply(format!("{v:?}"));
    let Value::Array(items) = &v else {
        return Err(bad());
    };
    let [allowed, retry, remaining, reset, rate] = items.as_slice() else {
        return Err(bad());
    };
    let allowed = matches!(allowed, Value::Int(1));
    let field = |x: &Value| -> Result<Option<f64>, BackendError> {
        match x {
            Value::BulkString(b) if b.is_empty() => Ok(None),
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .map(Some)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    };
    let unit_ns = match at {
        At::Server => 1e3,
        At::Explicit(_) => 1.0,
    };
    // Rounded up: a retry_after from µs arithmetic stays honest in ns. `as` saturates.
    let ns = |x: f64| (x * unit_ns).ceil() as u64;
    let mut d = if allowed {
        Decision::allowed()
    } else {
        Decision::denied(field(retry)?.map_or(0, ns))
    };
    if let Some(r) = field(remaining)? {
        d = d.with_remaining(r as u64);
    }
    if let Some(r) = field(reset)? {
        d = d.with_reset_after(ns(r));
    }
    if let Some(r) = field(rate)? {
        d = d.with_rate(r);
    }
    Ok(d)
}
