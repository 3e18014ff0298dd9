//! hotlimit: a lock-free, high-throughput, concurrent in-memory rate limiter for the hot path
//! of proxies and API servers.
//!
//! ```
//! use hotlimit::{algo::Gcra, CasLimiter, ManualClock, RateLimiter};
//! use std::time::Duration;
//!
//! // 10 requests per second per client, bursts of up to 5.
//! let clock = ManualClock::default(); // tests and replays; `CasLimiter::new` uses `QuantaClock`
//! let limiter = CasLimiter::<String, Gcra, _>::with_clock("10/s burst 5".parse()?, clock.clone());
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
//! `"600/h"`, `"10/min burst 20"`), and put it in a [`Limiter`] over the [`store`] that suits
//! your keys:
//!
//! | limiter | store | keys | state per key | pick it when |
//! |---|---|---|---|---|
//! | [`CasLimiter`] | [`Map`](store::Map) | any `Hash + Eq` (looked up by borrow: `&str` for `String`) | `u64`, `u32` and `Ipv4Addr` keys under a one-word state inline in the compact table; any other key a lock-free cell in a `papaya` map (the sliding log and sub-window: a per-key mutex); both grow, bounded by [`max_keys`](store::Builder::max_keys) if set | **the default**, for any key from one to millions; set `max_keys` where clients choose the keys |
//! | [`MutexLimiter`] | [`Map`](store::Map) with [`Locked`](store::Locked) | the same | the same tables, each state behind a lock | to compare pessimistic locking on your workload |
//! | [`CompactLimiter`] | [`Compact`](store::Compact) | fixed-size: `u64`, `u32`, `u128`, IP addresses, [`Hashed`](store::Hashed) | inline in a table growing up to [`max_keys`](store::Builder::max_keys) (16 bytes a slot, lock-free, for 64-bit keys and one-word states; a per-slot lock otherwise) | the compact table by name: any key as a 64-bit keyed hash ([`Hashed`](store::Hashed)) |
//! | [`DirectLimiter`] | [`Single`](store::Single) | `()` (one global limit) | one cache-padded cell | a global cap |
//!
//! They are one type, [`Limiter`], so every operation is the same everywhere, written once,
//! and reached through the two traits every limiter shares (import them: `use
//! hotlimit::{RateLimiter, Requests}`): [`check`](RateLimiter::check) and
//! [`check_n`](RateLimiter::check_n) decide a request (of cost 1, or of any cost: bytes,
//! tokens; a cost that could never be admitted is a [`QuotaError`], not an endless denial).
//! Everything else is one [`Request`], from [`request(key)`](Requests::request): set its [`cost`](Request::cost), a
//! [`quota`](Request::quota) that comes with it (a plan per client, one limiter for every
//! plan; with the `serde` feature the quotas deserialize from configuration files) or an
//! instant ([`at`](Request::at)), then [`check`](Request::check) it,
//! [`peek`](Request::peek) at it without counting, grant [`up_to`](Request::up_to) its cost
//! (the most units available now), [`take`](Request::take) it as an estimate and
//! [`settle`](Request::settle) the actual cost once known (refund, or an overrun charged as a
//! debt; an LLM response's tokens), wait [`until_ready`](Request::until_ready) (async, any
//! runtime) or [`until_ready_blocking`](Request::until_ready_blocking) with a
//! [`jitter`](Request::jitter), or
//! [`reserve`](Request::reserve) a slot (GCRA pacing). The options compose: a plan *and* a
//! partial grant is `limiter.request(key).quota(&plan).cost(n).up_to()`. [`check_all`]
//! counts one request against a hierarchy of keys at once (user ⊂ organisation ⊂ global,
//! each with its quota): all or nothing.
//! [`reconfigure`](Limiter::reconfigure) changes a [`Live`] quota while traffic flows, keeping
//! every key's state; [`metrics`](Limiter::metrics) snapshots the counters (and [`Metrics`] can
//! feed the `metrics` crate, feature `metrics`); [`check_batch`](RateLimiter::check_batch) and
//! [`check_n_batch`](RateLimiter::check_n_batch) decide a slice of requests in order, the cache
//! misses of their keys overlapped; [`sweep`](Limiter::sweep) and the metrics' `keys` keep
//! and tell the keys held. A limiter is made by `new`
//! (default clock), `with_clock`, or `builder` (one [`Builder`](store::Builder) shape: clock,
//! metrics, and for keyed stores a capacity bound and a background sweeper).
//!
//! Code generic over limiters uses [`RateLimiter`] (object-safe: checks and batches;
//! every limiter that decides in the call, never waiting on I/O: the in-memory limiters and the
//! hybrid one), [`Requests`] (every [`Request`], on every limiter: in memory, the hybrid one
//! and the blocking Redis client), or [`AsyncRateLimiter`], which the tower layer takes: every
//! `RateLimiter` is one, its future ready at once, and so is the Redis backend's async client;
//! the blocking one, whose every call is a round trip, is neither, by construction.
//!
//! The [`Decision`] says whether the request is allowed, and when denied how long until the
//! same request would pass (`retry_after`, honest: never rounded down). It also carries
//! `remaining` and `reset_after` where the algorithm knows them, and the measured `rate` for
//! the averaging algorithms, so you can run them in dry-run or shadow mode.
//!
//! The sibling crate `hotlimit-tower` (its `RateLimitLayer`) puts any limiter in front of
//! an axum, hyper or tonic service: `429` with `Retry-After` and the IETF `RateLimit` fields,
//! enforce, dry-run and shadow modes; over `AsyncRedisLimiter` (feature `redis-async`), one
//! limit shared by every instance. The headers themselves are `hotlimit::headers` (feature
//! `http`, over the `http` crate's types), for any other server or proxy.
//!
//! With the `redis` feature, `hotlimit::redis::RedisLimiter` runs every algorithm but `Live`
//! (`AllOf` included) inside Redis or a Redis Cluster (Lua scripts, one atomic round trip per
//! decision), for one limit shared by many instances of a service, with the same
//! [`Decision`]s; an outage answers its fail mode, any other backend error is an error.
//! `hotlimit::redis::HybridLimiter` decides locally instead, at in-memory speed, and keeps one
//! limit across the fleet through Redis in the background, every change pushed to every
//! instance within a sync lag: GCRA by leases (a lease never over-admits; beyond it each of
//! `N` instances admits at most `⌊share × burst⌋` ahead of Redis, so over any span the fleet
//! admits at most `rate × span + burst + N × ⌊share × burst⌋`), the windows, EARRRL and
//! exponential by merged per-instance states (bounds in its docs). Its entries live in the
//! keyed store [`CasLimiter`] uses.
//!
//! Time comes from a [`Clock`]: [`QuantaClock`] by default (the TSC, through `quanta`, where
//! the kernel keeps its own time by it; else the OS monotonic clock), [`ManualClock`] for
//! tests, simulations and trace replay, [`CoarseClock`] where a clock read per request costs
//! too much.
//!
//! Keys whose state is back to fresh are dropped by [`Limiter::sweep`](crate::Limiter::sweep), by hand or by a
//! background sweeper ([`Builder::sweep_every`](store::Builder::sweep_every)), without changing any decision; a capacity
//! bound ([`Builder::max_keys`](store::Builder::max_keys)) keeps memory bounded under floods of new keys,
//! and a flood never resets a limit: a key evicted while it still owes comes back at least as
//! limited as it left ([`Debt::restore`](algo::Debt::restore), from a bounded debt
//! table beside the store).
//!
//! The rest of the surface sits in modules: [`algo`] (the algorithms, the [`algo::Algorithm`]
//! trait and the [`algo::State`]s it keeps)
//! and [`store`] (what the limiters' signatures name: the builder, variants, compact key
//! types, sweep reports).
//!
//! # Algorithms
//!
//! | algorithm | state per key | default policy | use it when |
//! |---|---|---|---|
//! | [`algo::Gcra`] | 1 × u64 | leaky | you want a rate with a burst: the default; also the token bucket and the leaky bucket (the same state: a burst is the bucket's size), and pacing ([`Request::reserve`]) |
//! | [`algo::Earrrl`] | 1 × u64 (f64 bits) | strict | abusers must stay locked out while they keep abusing; the measured rate decays with a half-life |
//! | [`algo::Exponential`] | 1 × u128 | leaky | you want Exim's `ratelimit` semantics: a smoothed rate over a period, bursts up to the limit |
//! | [`algo::FixedWindow`] | 1 × u64 | leaky | "N per minute" as most APIs document it; cheapest, but allows 2N across a window boundary |
//! | [`algo::SlidingWindow`] | 1 × u128 | leaky | a fixed window's cost with most of a sliding window's smoothness (weighted previous window) |
//! | [`algo::SlidingLog`] | O(limit) entries, per-key lock | leaky | exactness in every window matters more than memory |
//! | [`algo::SubWindow`] | k (+1) counters, per-key lock | leaky | near-exact sliding windows in bounded memory (default 60 buckets) |
//! | [`algo::InFlight`] | 1 × u64 | leaky (only) | not a rate: at most N requests running at once per key, each holding a [`Permit`] until it ends (given back when dropped, or by its lease) |
//!
//! [`Policy::Leaky`]: only allowed requests change the state (a retrying client is not punished
//! further). [`Policy::Strict`]: every request counts, so a client that keeps hammering stays
//! locked out until it slows down.
//!
//! Every algorithm is a pure state machine, [`Algorithm::update`](algo::Algorithm::update) (a
//! state updated in place), usable on its own. Algorithms name
//! no storage: how a store keeps each state is the store's business.
//!
//! # Consistency
//!
//! Decisions are linearizable per key: whatever the threads and interleavings, they equal those
//! of some sequential order of the same requests; at one fixed `now`, N threads firing at one
//! key get exactly as many allowed as one thread would. No update is ever lost, also while a
//! sweep evicts keys. This is tested with real threads (`tests/stress.rs`,
//! `tests/eviction.rs`) and model-checked with loom (`tests/loom.rs` for the cells and
//! limiters, `src/loom.rs` for the eviction protocol and the compact table). A clock read that goes backwards (TSC skew between
//! cores) is treated as equal to the stored time, never as an error; time is capped at
//! [`algo::CLOCK_MAX`] (584 years).
//!
//! # Performance
//!
//! For a key already present, [`CasLimiter::check`](RateLimiter::check) allocates nothing and,
//! for every algorithm but the sliding log and the sub-window (a per-key lock), takes no lock:
//! one hash, one lock-free look-up (the compact table's slot for `u64`, `u32` and IPv4 keys
//! of a one-word state, `papaya`'s entry otherwise), one clock read, the pure step and one
//! `compare_exchange_weak`. A leaky denial writes nothing.
//! [`check_batch`](crate::RateLimiter::check_batch) holds the map's epoch guard across a batch of
//! requests, reads the clock once per batch and locates a chunk of keys before deciding any,
//! which pays most at a million keys. The clock
//! read is the other fixed cost: [`CoarseClock`] replaces the clock read by one load of a word
//! that a background thread refreshes (at the resolution it is built with), for quotas whose burst covers that
//! step (see its docs).
//! `cargo bench --bench keyed` compares the CAS limiter with the mutex twin, a sharded
//! `Mutex<HashMap>`, governor and a bare papaya `get` + CAS; `BENCHMARKS.md` keeps the numbers
//! and what they say.
//!
//! # Implementation
//!
//! * `algo/`: the pure state machines, depending only on the crate's leaf modules (config,
//!   decision, error). Floats are stored as bits; numerically delicate steps use `exp_m1`,
//!   `ln_1p` and log-sum-exp, each with a comment saying why. A float `retry_after` is settled
//!   against the real step (`honest_wait`), so it is never early and never late by a rounding
//!   error.
//! * `sync.rs`: every atomic and lock used by the protocol, swapped for loom's under
//!   `--cfg hotlimit_loom` (the 128-bit word too, as a model of one indivisible CAS), and the
//!   crate's one compare-and-swap loop, which every cell and slot operation calls.
//! * `cell.rs`: the CAS cell and the lock cell of the papaya store, how each state type is
//!   kept (a word with its tombstone, any other state in an `Option`), and the eviction
//!   protocol they share.
//! * `shared.rs`: the store core every limiter shares (cost check, counting, waits,
//!   reservations, live switches, metrics, the sweeper's start) and the one
//!   [`Builder`](store::Builder).
//! * `ops.rs`: [`Limiter`], every operation written once over the sealed store traits;
//!   `request.rs`: [`Request`]; `keyed/` (the papaya [`Map`](store::Map) and its pinned
//!   view), `compact/` (key types, table, slots), `direct.rs` (the [`Single`](store::Single)
//!   cell): the stores, each only its own table; `storage.rs`: how every state is kept, as
//!   traits every [`algo::State`] implies; `limiter.rs`: the [`RateLimiter`] and [`Requests`]
//!   traits and the [`Cas`](store::Cas) / [`Locked`](store::Locked) variants; `sweeper.rs`:
//!   capacity cuts and the background sweeper thread; `live.rs`:
//!   [`Live`]; `loom.rs`: the loom models of the private parts. The sharded
//!   `Mutex<HashMap>` the benchmarks compare against is not in the library:
//!   `benches/common/sharded.rs`, on the public API.
//! * `docs/DESIGN.md`: the algorithms with their formulas, the concurrency contract, the
//!   eviction protocol and the compact table's design; tests and fuzz targets cite its
//!   sections.
//!
//! # Modules
//!
//! | module | feature | what |
//! |---|---|---|
//! | [`algo`] | | the algorithms and their step machinery |
//! | [`store`] | | what the limiters' signatures name: variants, compact key types, sweep reports |
#![cfg_attr(
    feature = "http",
    doc = "| [`headers`] | `http` | rate-limit response headers (IETF drafts, legacy), for any server or proxy |"
)]
#![cfg_attr(
    not(feature = "http"),
    doc = "| `headers` | `http` | rate-limit response headers (IETF drafts, legacy), for any server or proxy |"
)]
#![cfg_attr(
    feature = "redis",
    doc = "| [`redis`] | `redis`, `redis-async` | `RedisLimiter` (every decision in Redis), `HybridLimiter` (local decisions, one limit across a fleet) |"
)]
#![cfg_attr(
    not(feature = "redis"),
    doc = "| `redis` | `redis`, `redis-async` | `RedisLimiter` (every decision in Redis), `HybridLimiter` (local decisions, one limit across a fleet) |"
)]
//!
//! On docs.rs every feature is on, and each item says the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, missing_debug_implementations, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

pub mod algo;
mod batch;
mod cell;
mod clock;
mod compact;
mod config;
mod debts;
mod decision;
#[cfg(feature = "serde")]
mod deserialize;
mod direct;
mod error;
mod keyed;
mod limiter;
mod live;
#[cfg(all(test, hotlimit_loom))]
mod loom;
mod ops;
mod permit;
mod request;
mod shared;
mod stats;
mod storage;
pub mod store;
mod sweeper;
mod sync;
mod wait;

pub use clock::{Clock, CoarseClock, ManualClock, QuantaClock};
pub use compact::CompactLimiter;
pub use config::Rate;
pub use decision::{Decision, Policy, Ticket};
pub use direct::DirectLimiter;
pub use error::{BuildError, ConfigError, Field, QuotaError};
pub use keyed::{CasLimiter, MutexLimiter};
pub use limiter::{AsyncRateLimiter, RateLimiter};
pub use live::Live;
pub use ops::Limiter;
pub use permit::Permit;
pub use request::{check_all, Request, Requests};
pub use stats::Metrics;

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod headers;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

/// The README's examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's examples (`docs/`), likewise.
#[cfg(doctest)]
#[doc = include_str!("../docs/limiters.md")]
#[doc = include_str!("../docs/algorithms.md")]
#[doc = include_str!("../docs/simulation.md")]
struct GuideDoctests;
