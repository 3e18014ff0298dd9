//! The Lua scripts, as `.lua` files under `src/redis/lua/` (Redis runs Lua 5.1: every number
//! is an `f64`).
//!
//! Each script is the shared [`PRELUDE`] followed by one function per algorithm: a body below
//! (a line-by-line port of its Rust step) inside [`LEAF_HEAD`], or an [`ALL_OF`] of two such
//! functions; the script returns the outermost's reply. ARGV layout, common to all:
//!
//! 1. `now` in time units, or empty: read Redis' `TIME` and work in microseconds;
//! 2. `ups`: time units per second (`1000000` or `1000000000`);
//! 3. `cost`; 4. the request: `0` peek, `1` check, `t` take (a check whose reply also carries
//!    `now`: `{now, reply}`), `u` a partial grant of up to `cost` (`{granted, reply}`), `s`
//!    settle (`cost` is the charged cost; the reply is 1, or 0 if the reservation was settled
//!    already);
//!
//! then the algorithm's parameters, already converted to the time unit by the Rust side; a
//! settle adds the time of its take and the actual cost, and its reservation's mark as the
//! last key.
//!
//! The reply is `{allowed (0/1), retry_after, remaining, reset_after, rate}`, the last four as
//! strings (`%.17g`, so doubles cross exactly; empty: not known): Redis would truncate a Lua
//! number reply to an integer.
//!
//! The hybrid limiter's two scripts each read Redis' `TIME` themselves, so every instance's
//! reservations and publishes share the server's timeline, and each ends by publishing what it
//! wrote to every instance (`hybrid/push.rs`).

/// Shared by every script: the time, the reply, `honest_wait`, the expiry; then come the
/// algorithm's functions ([`LEAF_HEAD`], [`ALL_OF`]) and the call of the outermost.
pub(super) const PRELUDE: &str = include_str!("lua/prelude.lua");

/// Runs the request on the outermost function (`MAIN` is replaced): a settle once per
/// reservation (its mark, the last key, set first), a partial grant by bisection on peeks,
/// a take's reply with the time it was decided.
pub(super) const TAIL: &str = include_str!("lua/tail.lua");

/// Runs a hierarchy (`check_all`) on the outermost function, `MAIN` (replaced): every level
/// decides on the state as it is; all store if all allowed, else only the first that denied
/// (by its policy). ARGV 5 is one level's parameter count, then each level's parameters;
/// the keys are each level's in turn. The reply is every level's.
pub(super) const LEVELS: &str = include_str!("lua/levels.lua");

/// Opens the function around one algorithm's body: `key` is its first key, `KEYS` and
/// `ARGV` its own (parameters from `ARGV[5]`), `write` whether to store. `NAME` is replaced.
/// The body ends with `return reply(...)`; `end` closes it.
pub(super) const LEAF_HEAD: &str = include_str!("lua/leaf_head.lua");

/// Two quotas on one key, all-or-nothing (`AllOf`): `NAME`, `FIRST`, `SECOND`, `K1` (the
/// first's key count), `N1`/`N2` (the parameter counts) are replaced. Both decide on the
/// current state without storing; then, when storing, both store if both allowed, else each
/// that denied stores what its own policy makes of the denial (deciding again on the same
/// state and time gives the same decision). The reply is the pair of replies.
pub(super) const ALL_OF: &str = include_str!("lua/all_of.lua");

/// GCRA; ARGV 5..7: `T`, `B·T` (time units), `1` for strict.
pub(super) const GCRA: &str = include_str!("lua/gcra.lua");

/// EARRRL; ARGV 5..9: `λ`, `R`, the retry offset and the idle offset (seconds), `1` for strict.
/// The state is the virtual time `S` in seconds.
pub(super) const EARRRL: &str = include_str!("lua/earrrl.lua");

/// Exponential; ARGV 5..7: `L`, `P` (time units), `1` for strict. The state is
/// `"<t_prev> <r>"`.
pub(super) const EXPONENTIAL: &str = include_str!("lua/exponential.lua");

/// In flight; ARGV 5..6: `max`, the epoch (half the lease, time units). The state is
/// `"<epoch> <prev> <cur>"`.
pub(super) const IN_FLIGHT: &str = include_str!("lua/in_flight.lua");

/// Fixed window; ARGV 5..7: `limit`, the window (time units), `1` for strict. The state is
/// `"<window index> <count>"`.
pub(super) const FIXED_WINDOW: &str = include_str!("lua/fixed_window.lua");

/// Sliding window counter; ARGV 5..8: `limit`, the window (whole time units), `1` for
/// strict, `1` for the lenient bias (floored). The state is `"<window index> <previous> <current>"`.
///
/// The weighted count `prev·(w − elapsed) + cur·w` exceeds 2^53 for large windows, so its
/// products are compared exactly in base-2^18 limbs rather than as doubles.
pub(super) const SLIDING_WINDOW: &str = include_str!("lua/sliding_window.lua");

/// Sub-window counters; ARGV 5..8: `limit`, the bucket (time units), the span in buckets,
/// `1` for strict. The state is one hash: a field per bucket index holding its count, and
/// `h`, the newest bucket seen. Fields that left the span are deleted on the next write, and
/// the key expires when its newest count leaves the span.
pub(super) const SUB_WINDOW: &str = include_str!("lua/sub_window.lua");

/// Sliding log; ARGV 5..7: `limit`, the window (time units), `1` for strict. `KEYS[1]` is a
/// sorted set of `"<t>:<cost>"` entries scored by `t`, `KEYS[2]` their total, so an allowed
/// request reads only the newest and the expired entries; a denial reads the log to find
/// when enough of it expires. Both keys share the hash tag, so one slot in a cluster.
pub(super) const SLIDING_LOG: &str = include_str!("lua/sliding_log.lua");

/// The hybrid limiter's GCRA: leases, hand-backs and charges.
pub(super) const HYBRID_LEASE: &str = include_str!("lua/hybrid_lease.lua");

/// The hybrid limiter's merged states: publish this instance's, push the whole hashes.
pub(super) const HYBRID_PUBLISH: &str = include_str!("lua/hybrid_publish.lua");
