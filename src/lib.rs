//! hotlimit: a lock-free, high-throughput, concurrent in-memory rate limiter for the hot path
//! of proxies and API servers.
//!
//! ```
//! use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
//! use std::time::Duration;
//!
//! // 10 requests per second per client, bursts of up to 5.
//! let clock = ManualClock::new(); // tests and replays; `CasLimiter::new` uses the TSC clock
//! let limiter = CasLimiter::<String, _>::with_clock("10/s burst 5".parse::<Gcra>()?, clock.clone());
//!
//! for _ in 0..5 {
//!     assert!(limiter.check("203.0.113.7").is_allowed());
//! }
//! let denied = limiter.check("203.0.113.7");
//! assert!(denied.is_denied());
//! assert_eq!(denied.retry_after(), Duration::from_millis(100)); // honest: retry then and pass
//!
//! clock.advance(denied.retry_after());
//! assert!(limiter.check("203.0.113.7").is_allowed());
//! assert!(limiter.check("198.51.100.1").is_allowed()); // keys are independent
//! # Ok::<(), hotlimit::ConfigError>(())
//! ```
//!
//! # Usage
//!
//! Pick an algorithm from [`algo`], configure it (constructors validate and return
//! [`ConfigError`]; [`Rate`] and [`algo::Gcra`] also parse strings such as `"100/s"`,
//! `"600/h"`, `"10/min burst 20"`), and put it in a limiter:
//!
//! * [`CasLimiter`]: keyed, lock-free (the default choice).
//! * [`MutexLimiter`]: keyed, the same map with each key's state behind a mutex (the
//!   pessimistic twin, to compare on your workload).
//! * [`DirectLimiter`]: one unkeyed limit (a global cap).
//! * [`ShardedLimiter`]: a sharded `Mutex<HashMap>`, kept as a benchmark baseline.
//! * [`CompactLimiter`]: keyed, for keys of a fixed small size (`u64`, `u32`, `u128`, IP
//!   addresses, or [`Hashed`] keys): a fixed-capacity table with each key's state inline, one
//!   128-bit CAS per check and one cache line in the common case; for millions of keys.
//!
//! [`KeyedLimiter::check`] decides a request of cost 1, [`KeyedLimiter::check_n`] one of any
//! cost (bytes, tokens); a cost that could never be admitted is a [`CostError`], not an
//! endless denial. The [`Decision`] says whether the request is allowed, and when denied how
//! long until the same request would pass (`retry_after`, honest: never rounded down). It also
//! carries `remaining` and `reset_after` where the algorithm knows them, and the measured
//! `rate` for the averaging algorithms, so you can run them in dry-run or shadow mode.
//!
//! With the `tower` feature, `hotlimit::tower::RateLimitLayer` puts any limiter in front of
//! an axum, hyper or tonic service: `429` with `Retry-After` and the IETF `RateLimit` fields,
//! enforce, dry-run and shadow modes.
//!
//! With the `redis` feature, `hotlimit::redis::RedisLimiter` runs GCRA, EARRRL and the
//! exponential limiter inside Redis (Lua scripts, one atomic round trip per decision), for one
//! limit shared by many instances of a service, with the same [`Decision`]s.
//!
//! Time comes from a [`Clock`]: [`QuantaClock`] (TSC-backed) by default, [`ManualClock`] for
//! tests, simulations and trace replay.
//!
//! Keys whose state is back to fresh are dropped by [`KeyedLimiter::sweep`], by hand or by a
//! background sweeper ([`Builder::sweep_every`]), without changing any decision; a capacity
//! bound ([`Builder::max_keys`]) keeps memory bounded under floods of new keys.
//!
//! Beyond `check`: [`KeyedLimiter::peek`] evaluates without counting; [`algo::AllOf`] puts
//! several quotas on one key, all-or-nothing, in one cell; [`Live`] with
//! [`KeyedLimiter::reconfigure`] changes a quota while traffic flows, keeping every key's
//! state; [`KeyedLimiter::metrics`] snapshots striped counters (and [`Metrics`] can feed the
//! `metrics` crate, feature `metrics`); [`KeyedLimiter::until_ready`] (async, any runtime) and
//! [`KeyedLimiter::until_ready_blocking`] wait for a client limiting itself, with [`Jitter`].
//!
//! # Algorithms
//!
//! | algorithm | state per key | default policy | use it when |
//! |---|---|---|---|
//! | [`algo::Gcra`] | 1 × u64 | leaky | you want a rate with a burst: the default; also the token bucket ([`algo::Gcra::token_bucket`]) and leaky bucket ([`algo::Gcra::leaky_bucket`]), and pacing ([`CasLimiter::reserve`](KeyedLimiter::reserve)) |
//! | [`algo::Earrrl`] | 1 × u64 (f64 bits) | strict | abusers must stay locked out while they keep abusing; the measured rate decays with a half-life |
//! | [`algo::Exponential`] | 1 × u128 | leaky | you want Exim's `ratelimit` semantics: a smoothed rate over a period, bursts up to the limit |
//! | [`algo::FixedWindow`] | 1 × u64 | leaky | "N per minute" as most APIs document it; cheapest, but allows 2N across a window boundary |
//! | [`algo::SlidingWindow`] | 1 × u128 | leaky | a fixed window's cost with most of a sliding window's smoothness (weighted previous window) |
//! | [`algo::SlidingLog`] | O(limit) entries, per-key lock | leaky | exactness in every window matters more than memory |
//! | [`algo::SubWindow`] | k (+1) counters, per-key lock | leaky | near-exact sliding windows in bounded memory (default 60 buckets) |
//!
//! [`Policy::Leaky`]: only allowed requests change the state (a retrying client is not punished
//! further). [`Policy::Strict`]: every request counts, so a client that keeps hammering stays
//! locked out until it slows down.
//!
//! Every algorithm is a pure state machine, [`Algorithm::update`] (in place) or
//! [`WordStep::step`] (by value, for word states), usable on its own.
//!
//! # Consistency
//!
//! Decisions are linearizable per key: whatever the threads and interleavings, they equal those
//! of some sequential order of the same requests; at one fixed `now`, N threads firing at one
//! key get exactly as many allowed as one thread would. No update is ever lost, also while a
//! sweep evicts keys. This is tested with real threads (`tests/stress.rs`,
//! `tests/eviction.rs`) and model-checked with loom (`tests/loom.rs` for the cells, the
//! eviction protocol in `src/cell.rs`). A clock read that goes backwards (TSC skew between
//! cores) is treated as equal to the stored time, never as an error; time is capped at
//! [`algo::CLOCK_MAX`] (584 years).
//!
//! # Performance
//!
//! For a key already present, [`CasLimiter::check`](KeyedLimiter::check) takes no lock and
//! allocates nothing: one hash, one lock-free `papaya` lookup, one clock read, the pure step
//! and one `compare_exchange_weak`. A leaky denial writes nothing. [`KeyedLimiter::pin`] holds
//! the map's epoch guard across a batch of requests, saving its cost per request. The clock
//! read is the other fixed cost: [`CoarseClock`] replaces the TSC read by one load of a word
//! that a background thread refreshes (1 ms by default), for quotas whose burst covers that
//! step (see its docs).
//! `cargo bench --bench keyed` compares the CAS limiter with the mutex twin, a sharded
//! `Mutex<HashMap>`, governor and a bare papaya `get` + CAS; `BENCHMARKS.md` keeps the numbers
//! and what they say.
//!
//! # Implementation
//!
//! * `algo/`: the pure state machines. Floats are stored as bits; numerically delicate steps
//!   use `exp_m1`, `ln_1p` and log-sum-exp, each with a comment saying why. A float
//!   `retry_after` is settled against the real step (`honest_wait`), so it is never early and
//!   never late by a rounding error.
//! * `cell.rs`: the CAS cell ([`Algorithm::update`] re-run on a copy of the word that won a
//!   race), the lock cell, and the eviction tombstone protocol both share.
//! * `limiter.rs`: the [`RateLimiter`] trait and the [`Cas`] / [`Locked`] variants;
//!   `keyed.rs`, `direct.rs`, `sharded.rs`: the limiters; `sweeper.rs`: the background
//!   sweeper thread.
//! * `sync.rs`: every atomic and lock used by the protocol, swapped for loom's under
//!   `--cfg hotlimit_loom` (the 128-bit word too, as a model of one indivisible CAS), and the
//!   crate's one compare-and-swap loop, which every cell and slot operation calls.
//! * `compact.rs`, `compact/slot.rs`: the compact store (its design, and the crates evaluated
//!   before writing it, are in [`CompactLimiter`]'s docs).
#![deny(missing_docs, missing_debug_implementations, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

pub mod algo;
pub mod baseline;
mod cell;
mod clock;
mod compact;
mod config;
mod decision;
mod direct;
mod error;
mod keyed;
mod limiter;
mod live;
#[cfg(all(test, hotlimit_loom))]
mod loom;
mod shared;
mod stats;
pub mod store;
mod sweeper;
mod sync;
mod wait;

pub use algo::Algorithm;
pub use clock::{Clock, CoarseClock, ManualClock, QuantaClock};
pub use compact::{CompactLimiter, Hashed};
pub use config::Rate;
pub use decision::{Decision, Policy};
pub use direct::DirectLimiter;
pub use error::{ConfigError, CostError, Field};
pub use keyed::{CasLimiter, KeyedLimiter, MutexLimiter};
pub use limiter::{Cas, Locked, RateLimiter};
pub use live::Live;
pub use shared::Builder;
pub use stats::Metrics;
pub use wait::Jitter;

#[cfg(feature = "tower")]
pub mod tower;

#[cfg(feature = "redis")]
pub mod redis;

/// The README's examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
