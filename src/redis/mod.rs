//! A Redis backend: the same algorithms and [`Decision`]s, one limit shared by every instance
//! of a service. Enabled by the `redis` feature (off by default; it depends on the `redis`
//! crate, sync client only), against one server or a Redis Cluster (see *Redis Cluster*).
//!
//! ```no_run
//! use hotlimit::{algo::Gcra, redis::{FailMode, RedisLimiter}, Requests};
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
//! match limiter.request("203.0.113.7").check() {
//!     Ok(d) => println!("{d:?}"),
//!     Err(e) => eprintln!("rate limiter backend: {e}"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How it works
//!
//! Every algorithm of the crate but [`Live`](crate::Live) runs as a Lua script, a port of its
//! Rust step line by line (`honest_wait` included, so a denied `retry_after` is honest):
//! [`Gcra`], [`Earrrl`], [`Exponential`], [`FixedWindow`], [`SlidingWindow`], [`SlidingLog`]
//! and [`SubWindow`], and [`AllOf`] of any of them (nested too: several quotas on one key,
//! all-or-nothing, in one script call). Done as separate commands (`INCR`, then `EXPIRE`;
//! `ZADD`, then `ZCARD`) the window family races; as one script it is atomic. Each
//! script is a `redis::Script`: called by `EVALSHA` and, when the server answers `NOSCRIPT`
//! (after a restart or a `SCRIPT FLUSH`), loaded and called again, by redis-rs' invocation for
//! a request and, for a pipelined batch (redis-rs pipelines the invocations' `EVALSHA` but
//! loads no missing script), by loading it and sending again the requests that got
//! `NOSCRIPT`; so each decision is one atomic round trip: Redis runs one script at a time, which makes decisions linearizable per key
//! across every client.
//!
//! **Time** is Redis' own clock (`TIME`, read inside the script), so instances whose clocks
//! disagree still share one timeline. It is read in **microseconds** since the Unix epoch:
//! Lua's numbers are `f64`, exact for integers below 2^53, which nanoseconds since 1970
//! (1.7·10^18) exceed and microseconds (1.7·10^15) do not. So in production the resolution of
//! every time (`retry_after`, `reset_after`, stored states) is 1 µs. A GCRA emission interval,
//! a fixed window, a log's window or a sub-window bucket that is not a whole number of
//! microseconds is kept as a fraction of one; a sliding window counter's window is rounded to
//! a whole microsecond (its script compares products of integers exactly). Times
//! sent back are converted to nanoseconds, `retry_after` rounded up (still honest).
//!
//! The `*_at` methods take an explicit `now` (nanoseconds, below 2^53) instead: for tests and
//! trace replay, where the scripts then run the very integer and float arithmetic of the
//! in-memory algorithms (see *Equivalence*). Never mix the two timelines on one key.
//!
//! **State** per key: GCRA's `tat`, EARRRL's virtual time `S`, exponential's `"t r"`, the fixed
//! window's `"index count"`, the sliding window counter's `"index previous current"`, as
//! decimal strings that round-trip an `f64` exactly (`%.17g`). The sub-window counters are one
//! hash per key (a field per bucket index holding its count, and `h`, the newest bucket);
//! fields that left the span are deleted by the next write. The sliding log is a sorted set of
//! `"t:cost"` entries scored by time plus their total in a second key (`<key>:n`), so an
//! allowed request reads only the newest and the expired entries. An [`AllOf`] keeps each
//! quota's state under its own key, `<key>:0` and `<key>:1` (nested further down). Each write
//! sets `PX` to the time
//! the algorithm's [`idle_at`](crate::algo::Algorithm::idle_at) says the state becomes equivalent to a
//! fresh key (rounded up to a millisecond): expiry is lossless, never a fixed TTL that would
//! forgive an abuser early. A leaky denial writes nothing. With explicit `now`, the expiry is
//! that many milliseconds of the *real* clock from the write, and at least
//! [`MIN_EXPLICIT_TTL`] (10 s): a replay slower than real time would otherwise lose states
//! early, and a later expiry changes no decision (an idle state decides as a fresh one).
//!
//! The Redis key of `key` is `key_prefix + "{" + escape(key) + "}"` (default prefix
//! `hotlimit:`; [`RedisLimiter::redis_key`] returns it), where `escape` writes `%` as `%25`
//! and `}` as `%7D`, and the empty key as a lone `%` (which escaping never yields): distinct
//! keys stay distinct, and the braces are a non-empty Redis Cluster *hash tag*, so every Redis
//! key of one client key lands in one slot (scripts that touch several keys of one client need
//! that) while different client keys spread over the nodes. Limiters with different
//! algorithms or quotas must use different prefixes, and every instance sharing a prefix must
//! use the same configuration.
//!
//! # Redis Cluster
//!
//! [`RedisBuilder::build`] (and `build_async`) asks the server at the URL `INFO cluster`; if it
//! says `cluster_enabled:1`, the limiter transparently becomes a cluster client (redis-rs'
//! cluster support), seeded with that URL and the nodes the server knows (`CLUSTER NODES`);
//! [`RedisBuilder::seed_nodes`] gives more seeds and asks for a cluster client outright.
//! [`RedisLimiter::is_cluster`] tells which one was built. Each `EVALSHA` goes to the primary
//! of its key's slot, redis-rs follows `MOVED` and `ASK`, `SCRIPT LOAD` goes to every primary,
//! and a `NOSCRIPT` (a promoted replica, a restarted node, a `SCRIPT FLUSH`) reloads it
//! everywhere and runs the request again. A batch ([`RedisLimiter::try_check_pipelined`]) may
//! span nodes: the sync client sends its requests one after another, the async one
//! concurrently. The timeouts and [`reconnect_after`](RedisBuilder::reconnect_after) hold as for
//! one server: a request is retried at most 3 times (a redirection or a lost node connection at
//! once, `TRYAGAIN` or `CLUSTERDOWN` after a wait of at most 50 ms; a node that never answers
//! a connect costs a try its connect timeout, not a hang), and an outage drops the
//! whole cluster connection, so the next
//! request reads the slot map afresh (after a failover, the new primary's).
//!
//! # Failures
//!
//! The connection has a connect timeout and read/write timeouts (defaults 250 ms and 500 ms),
//! so a dead server never hangs a request. A failed request drops the connection; the next
//! one reconnects, and if that fails, requests within
//! [`reconnect_after`](RedisBuilder::reconnect_after) (default 100 ms) fail at once
//! ([`BackendError::Unavailable`]) instead of each waiting for a connect timeout.
//!
//! [`request`](crate::Requests::request)'s operations return every
//! [`BackendError`]. [`RedisLimiter::check`] and [`check_n`](RedisLimiter::check_n) tell two
//! kinds apart ([`BackendError::is_outage`]):
//!
//! - an **outage** (a connection refused, reset or closed, an I/O timeout,
//!   [`BackendError::Unavailable`], a cluster that answers `CLUSTERDOWN`, `TRYAGAIN` or
//!   `MASTERDOWN`, or a slot whose node cannot be reached) gets the [`FailMode`] (open:
//!   allow; closed: deny with a fixed `retry_after`), counted in [`ClientStats::failures`];
//! - **any other error** (a script error, a key of the wrong type, a `MOVED`/`ASK` that
//!   surfaced, `CROSSSLOT`, a malformed reply) is a misconfiguration or a bug, not an outage:
//!   it is **denied** whatever the fail mode (with the closed mode's `retry_after`, or 1 s
//!   under [`FailMode::Open`]), counted in [`ClientStats::errors`]. Letting it through would
//!   turn a wrong setup into no rate limit at all.
//!
//! # Hybrid: local decisions, one limit
//!
//! [`HybridLimiter`] is the other way to share a limit: every decision is local (the crate's
//! lock-free cells, no round trip, no outage in the request path); a background thread sends
//! each changed key to Redis (at most once per sync interval), and the script that writes it
//! pushes the key's new state to every instance: GCRA by leasing units from the shared state
//! (what is admitted from a lease was reserved), the window algorithms, EARRRL and
//! exponential by publishing each instance's own state and merging the others'. Its docs
//! state what is exact and what lags; `docs/fleet.md` shows 4-process runs over every shape
//! of traffic.
//!
//! # Settle, partial grants, plans
//!
//! As the in-memory stores: [`request`](crate::Requests::request)'s `take` returns a [`Ticket`](crate::Ticket)
//! (with Redis' time of the decision and a reservation id), its `settle` refunds or
//! charges the difference in one script call, **idempotent per reservation**: the script looks
//! for a mark key first and sets it (kept [`SETTLE_MARK_TTL`]) once the settle has run, so a
//! retried settle that finds the mark changes nothing, and a failed settle (a lost reply, or
//! a script error, which leaves no mark) leaves the ticket open to retry.
//! [`request`](crate::Requests::request)'s `up_to` grants the most units available, up to `n`, bisecting on the
//! key's state inside the script; [`request`](crate::Requests::request) decides under a quota that
//! comes with the request, on the same keys (the script with the quota's parameters).
//!
//! # Local fast path
//!
//! [`RedisBuilder::local_fast_path`] keeps, in process, the keys Redis recently denied, with the
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
//! With an explicit `now`, GCRA, the four window algorithms and [`AllOf`]s of them give the
//! same [`Decision`]s as the in-memory limiter, field for field, checks and peeks, both
//! policies, both biases (`tests/redis.rs`, 3,000-request traces). Integers below 2^53 are exact in `f64`; the
//! sliding window counter's weighted counts (a count times a window in ns) go beyond, so its
//! script multiplies and compares them in base-2^18 limbs, exactly (a 3-day window in ns is
//! tested). EARRRL and exponential use `exp` and
//! `log` from the same C library, but Lua 5.1 has neither `log1p` nor `expm1`; their
//! replacements are accurate to a few ulps, not bit-identical, so states can differ in the last
//! bits. `tests/redis.rs` replays 3,000-request traces (three keys, bursts and gaps, both
//! policies) through both: every allow/deny decision agrees, rates agree to 1e-12 relative and
//! `retry_after` to 1 ns (plus 1e-12 relative); how many decisions are identical field for
//! field is in `BENCHMARKS.md`. A decision could differ only when a rate lands within a few
//! ulps of the limit.
//!
//! # Throughput
//!
//! One connection does one round trip at a time; use one limiter per thread
//! ([`RedisLimiter::try_clone`] opens another connection), and
//! [`RedisLimiter::try_check_pipelined`] to send a batch in one round trip. `BENCHMARKS.md`,
//! section "Redis backend (`redis` feature), checks per second", has the numbers.
//!
//! With the `redis-async` feature, `AsyncRedisLimiter` (from `RedisBuilder::build_async`) is the
//! same on tokio, over one multiplexed connection that pipelines concurrent tasks' requests.

#[cfg(feature = "redis-async")]
mod aio;
mod bindings;
mod blocking;
mod client;
mod connection;
mod hybrid;
mod keys;
mod levels;
mod local_deny;
mod lua;
mod redis_builder;
mod replies;
mod requests;
mod traits;

#[cfg(feature = "redis-async")]
pub use aio::AsyncRedisLimiter;
pub use bindings::RedisAlgorithm;
pub use blocking::{RedisLimiter, BATCH_TRIP};
pub use hybrid::{
    Fallback, HybridAlgorithm, HybridBuilder, HybridLimiter, HybridSettings, HybridStats, SyncError,
};
pub use redis_builder::RedisBuilder;

#[cfg(doc)]
use crate::algo::{
    AllOf, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use crate::decision::Decision;
#[cfg(doc)]
use crate::decision::Policy;
use crate::error::{ConfigError, QuotaError};
use ::redis::{ErrorKind, RedisError};
use std::fmt;
use std::time::Duration;

/// The shortest expiry of a state written at an explicit `now` (`*_at` methods), in real
/// time: replays slower than real time keep their states (see the module docs).
pub const MIN_EXPLICIT_TTL: Duration = Duration::from_secs(10);

/// How long after its settle Redis remembers that a reservation was settled (its mark), less
/// a margin: a settle retried within it (after a lost reply) finds the mark and changes
/// nothing. Retries come within the client's timeouts (milliseconds); a ticket settled again
/// much later, from another process' copy of its id, is not a retry the mark covers. The
/// server's tickets live this long. Each mark lives [`MARK_CLOCK_MARGIN`] longer (an in-flight
/// permit's, its lease and the margin), so a process whose clock runs behind the settler's
/// by up to the margin, and takes the ticket for younger than it is, still finds the mark.
pub const SETTLE_MARK_TTL: Duration = Duration::from_secs(60);

/// How much longer a settle mark lives than the ticket life it covers ([`SETTLE_MARK_TTL`], or
/// an in-flight permit's lease): the clock skew between processes settling one ticket that the
/// marks absorb.
pub const MARK_CLOCK_MARGIN: Duration = Duration::from_secs(5);

/// The latest explicit `now` (ns) the scripts count exactly: 2^53 − 1 (about 104 days).
pub const MAX_EXPLICIT_NOW: u64 = (1 << 53) - 1;

/// A Redis client's counters, from `stats()` on [`RedisLimiter`] and the async client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Requests sent to Redis so far (each a round trip; a pipelined batch counts once).
    pub round_trips: u64,
    /// Outages ([`BackendError::is_outage`]) that [`check`](RedisLimiter::check) and
    /// the other fail-mode paths answered with the [`FailMode`].
    pub failures: u64,
    /// Errors that are not outages (a script error, a wrong type, a misrouted command, a bad
    /// reply) that `check` and the other fail-mode paths answered with a denial.
    pub errors: u64,
    /// The keys the local fast path holds ([`RedisBuilder::local_fast_path`]; 0 without
    /// it). Every other key's state is in Redis, which expires it; the local fast path is
    /// bounded, so there is nothing to sweep here.
    pub local_keys: u64,
}

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
            FailMode::Closed { retry_after } => Decision::denied(*retry_after),
        }
    }
}

/// Why a Redis-backed decision could not be made.
///
/// Only an outage ([`is_outage`](BackendError::is_outage)) gets the [`FailMode`]; every other
/// error is a misconfiguration or a bug, which `check` answers with a denial (see the module
/// docs, *Failures*).
///
/// ```
/// use hotlimit::{redis::BackendError, QuotaError};
///
/// let e = BackendError::Cost(QuotaError::ZeroCost);
/// assert!(!e.is_outage());
/// assert!(BackendError::Unavailable.is_outage());
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendError {
    /// The request's cost can never be admitted (checked before any round trip):
    /// [`QuotaError::ZeroCost`] or [`QuotaError::ExceedsCapacity`], as in memory.
    Cost(QuotaError),
    /// The server could not be reached or stopped answering (refused, reset, timed out), or
    /// the cluster said it cannot serve the key now (`CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`,
    /// no connection to the slot's node): an outage.
    Connection(RedisError),
    /// The server answered with an error: a script error, a wrong type, an out-of-memory
    /// refusal, a `MOVED`/`ASK` redirection or `CROSSSLOT` that was not followed, ...
    Script(RedisError),
    /// The server's reply did not have the expected shape.
    Reply(String),
    /// The last attempt to connect failed less than
    /// [`reconnect_after`](RedisBuilder::reconnect_after) ago: not tried again yet, answered at
    /// once.
    Unavailable,
    /// An explicit `now` above [`MAX_EXPLICIT_NOW`].
    TimeOutOfRange(u64),
    /// A configuration the limiter cannot run (see [`HybridLimiter::builder`]), or a
    /// per-request quota that cannot read the limiter's states
    /// ([`request`](crate::Requests::request)).
    Config(ConfigError),
    /// A settle's ticket was taken from another limiter (in memory, or a client of another
    /// key prefix); nothing was sent and the ticket stays open.
    TicketFromOtherLimiter,
    /// A settle's ticket was taken for another key; nothing was sent and the ticket stays
    /// open.
    TicketForOtherKey,
    /// A thread the limiter needs (the fleet limiter's sync and subscription threads, its
    /// sweeper) could not be started.
    Spawn(std::io::Error),
    /// A table sized for the fleet limiter's `max_keys` (the debt table beside its store)
    /// could not be allocated.
    OutOfMemory,
}

impl BackendError {
    /// The same error again: for every batch of a failed round trip, and for a backend's
    /// error held in a [`QuotaError`] (`RedisError` is not `Clone`).
    pub(crate) fn copied(&self) -> BackendError {
        match self {
            BackendError::Connection(r) => BackendError::Connection(RedisError::from((
                ErrorKind::IoError,
                "connection failed",
                r.to_string(),
            ))),
            BackendError::Script(r) => BackendError::Script(RedisError::from((
                r.kind(),
                "request failed",
                r.to_string(),
            ))),
            BackendError::Reply(s) => BackendError::Reply(s.clone()),
            BackendError::Unavailable => BackendError::Unavailable,
            BackendError::Cost(c) => BackendError::Cost(c.clone()),
            BackendError::TimeOutOfRange(t) => BackendError::TimeOutOfRange(*t),
            BackendError::Config(c) => BackendError::Config(c.clone()),
            BackendError::TicketFromOtherLimiter => BackendError::TicketFromOtherLimiter,
            BackendError::TicketForOtherKey => BackendError::TicketForOtherKey,
            BackendError::Spawn(e) => {
                BackendError::Spawn(std::io::Error::new(e.kind(), e.to_string()))
            }
            BackendError::OutOfMemory => BackendError::OutOfMemory,
        }
    }

    /// Whether the connection that returned this error must be dropped (the next request
    /// opens a new one): after an outage or a bad reply, since a timed-out or broken
    /// connection may still deliver a stale reply; and after a redirection that surfaced,
    /// since a new cluster connection reads the slot map afresh. A script's own error says
    /// nothing against the connection.
    pub(crate) fn drops_connection(&self) -> bool {
        match self {
            BackendError::Connection(_) | BackendError::Reply(_) => true,
            BackendError::Script(e) => matches!(e.kind(), ErrorKind::Moved | ErrorKind::Ask),
            BackendError::Cost(_)
            | BackendError::Unavailable
            | BackendError::TimeOutOfRange(_)
            | BackendError::Config(_)
            | BackendError::TicketFromOtherLimiter
            | BackendError::TicketForOtherKey
            | BackendError::Spawn(_)
            | BackendError::OutOfMemory => false,
        }
    }

    /// Whether this is an outage of the backend (a connection refused, reset or closed, an
    /// I/O timeout, [`Unavailable`](BackendError::Unavailable), a cluster that is down or
    /// failing over): the errors to which the [`FailMode`] applies. Anything else (a script
    /// error, a misrouted command, a bad reply, a bad request) is not an outage: no fail mode
    /// hides it.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            BackendError::Connection(_) | BackendError::Unavailable
        )
    }

    pub(crate) fn from_redis(e: RedisError) -> Self {
        let cluster_outage = matches!(
            e.kind(),
            ErrorKind::ClusterDown
                | ErrorKind::TryAgain
                | ErrorKind::MasterDown
                | ErrorKind::BusyLoadingError
                | ErrorKind::ClusterConnectionNotFound
        );
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || cluster_outage
        {
            BackendError::Connection(e)
        } else {
            BackendError::Script(e)
        }
    }
}

/// A cause is printed or returned by `source`, never both (a report walking the chain would
/// print it twice): Redis' errors are causes; a cost, configuration or ticket error is this
/// error itself, word for word.
impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Cost(e) => e.fmt(f),
            BackendError::Connection(_) => f.write_str("redis connection failed"),
            BackendError::Script(_) => f.write_str("redis script failed"),
            BackendError::Reply(s) => write!(f, "unexpected reply from redis: {s}"),
            BackendError::Unavailable => {
                f.write_str("redis unreachable at the last attempt; not retried yet")
            }
            BackendError::TimeOutOfRange(now) => write!(
                f,
                "explicit now {now} ns is above {MAX_EXPLICIT_NOW} (2^53 − 1), which Lua cannot count exactly"
            ),
            BackendError::Config(e) => e.fmt(f),
            BackendError::TicketFromOtherLimiter => QuotaError::TicketFromOtherLimiter.fmt(f),
            BackendError::TicketForOtherKey => QuotaError::TicketForOtherKey.fmt(f),
            BackendError::Spawn(e) => write!(f, "cannot start a thread: {e}"),
            BackendError::OutOfMemory => {
                f.write_str("cannot allocate a table sized for max_keys: out of memory")
            }
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BackendError::Connection(e) | BackendError::Script(e) => Some(e),
            BackendError::Spawn(e) => Some(e),
            _ => None,
        }
    }
}

/// A builder's error in the limiter's own terms: a refused setting, a thread or a table.
impl From<crate::BuildError> for BackendError {
    fn from(e: crate::BuildError) -> Self {
        match e {
            crate::BuildError::Config(e) => BackendError::Config(e),
            crate::BuildError::Spawn(e) => BackendError::Spawn(e),
            crate::BuildError::OutOfMemory => BackendError::OutOfMemory,
        }
    }
}

impl From<ConfigError> for BackendError {
    fn from(e: ConfigError) -> Self {
        BackendError::Config(e)
    }
}

/// The request's faults stay what they are; a quota this limiter cannot use is its
/// configuration error; a backend's error held in a [`QuotaError`] is that error again.
impl From<QuotaError> for BackendError {
    fn from(e: QuotaError) -> Self {
        match e {
            QuotaError::Quota(c) => BackendError::Config(*c),
            QuotaError::TicketFromOtherLimiter => BackendError::TicketFromOtherLimiter,
            QuotaError::TicketForOtherKey => BackendError::TicketForOtherKey,
            QuotaError::Backend(e) => match e.downcast_ref::<BackendError>() {
                Some(b) => b.copied(),
                None => BackendError::Reply(e.to_string()),
            },
            cost => BackendError::Cost(cost),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::hybrid::SyncError;
    use super::*;
    use crate::error::report;

    /// A report that prints an error and then its sources prints each cause once.
    #[test]
    fn backend_and_sync_errors_print_each_cause_once() {
        let refused = || RedisError::from((ErrorKind::IoError, "refused"));
        let e = BackendError::Connection(refused());
        let cause = refused().to_string();
        assert_eq!(report(&e), format!("redis connection failed: {cause}"));
        let sync = SyncError::Outage(std::sync::Arc::new(BackendError::Connection(refused())));
        assert_eq!(
            report(&sync),
            format!("Redis unreachable: redis connection failed: {cause}")
        );
        let cost = BackendError::Cost(QuotaError::ZeroCost);
        assert_eq!(report(&cost), QuotaError::ZeroCost.to_string());
    }
}
