// G61 (docs/GUARANTEES.md) is pinned by this module's compile_fail doc test.
//! A [`tower`](https://docs.rs/tower) layer that rate-limits HTTP requests: for servers built
//! on tower (axum, hyper, tonic). A crate of its own on hotlimit's public API; it depends on
//! hotlimit, `http`, `http-body`, `tower-layer` and `tower-service` and three small crates
//! (`arrayvec`, `pin-project-lite`, `sha2`), never on a runtime or a server.
//!
//! ```
//! use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
//! use hotlimit_tower::{HeaderKey, RateLimitLayer};
//! use http::{header::RETRY_AFTER, Request, Response, StatusCode};
//! use std::{convert::Infallible, sync::Arc};
//! use tower::{Layer, ServiceExt};
//!
//! // 5 requests per second per API key, bursts of 5; a manual clock so the example is exact.
//! let clock = ManualClock::default();
//! let limiter = Arc::new(CasLimiter::<String, Gcra, _>::with_clock("5/s burst 5".parse()?, clock));
//! let layer = RateLimitLayer::builder(limiter, HeaderKey::from_static("x-api-key")).build();
//! let app = layer.layer(tower::service_fn(|_req: Request<String>| async {
//!     Ok::<_, Infallible>(Response::new(String::from("hello")))
//! }));
//!
//! let rt = tokio::runtime::Builder::new_current_thread().build()?;
//! let send = |key: &str| {
//!     let req = Request::builder().header("x-api-key", key).body(String::new()).unwrap();
//!     rt.block_on(app.clone().oneshot(req)).unwrap()
//! };
//! for _ in 0..5 {
//!     assert_eq!(send("alice").status(), StatusCode::OK);
//! }
//! let denied = send("alice");
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(denied.headers()[RETRY_AFTER], "1"); // 200 ms, rounded up to whole seconds
//! assert_eq!(denied.headers()["ratelimit-policy"], r#""default";q=5;w=1;hotlimit-burst=5"#);
//! assert_eq!(denied.headers()["ratelimit"], r#""default";r=0;t=1"#);
//! assert_eq!(send("bob").status(), StatusCode::OK); // keys are independent
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What it does
//!
//! For each request, [`RateLimit`] (the service the layer wraps around yours):
//!
//! 1. asks the cost function for the request's cost (default: [`UnitCost`], 1). A cost of 0
//!    means free: the request passes, uncounted, without rate-limit headers;
//! 2. extracts the key with a [`KeyExtractor`]: the client IP from the connection ([`PeerIp`])
//!    or from a trusted forwarded header ([`ForwardedIp`]), a header value such as an API key
//!    ([`HeaderKey`]), or any closure `Fn(&Parts) -> Option<String>`; extractors combine with
//!    [`KeyExtractor::or`]. A request without a key follows [`MissingKey`]; a key longer than
//!    [`LayerBuilder::max_key_len`] (default [`DEFAULT_MAX_KEY_LEN`] bytes) follows
//!    [`OversizedKey`], so a hostile header never becomes a huge key;
//! 3. decides it with the limiter (under the request's own quota if a plan picks one:
//!    [`LayerBuilder::plans`]), any [`AsyncRateLimiter<str>`](hotlimit::AsyncRateLimiter):
//!    every [`RateLimiter`](hotlimit::RateLimiter) (every algorithm and store of the
//!    crate, a [`ManualClock`](hotlimit::ManualClock) one in tests, a `dyn RateLimiter<str>`), decided in
//!    `call` at no cost, or the Redis backend's `AsyncRedisLimiter` (see *Over Redis*), whose
//!    round trip the response future awaits;
//! 4. acts according to the [`Mode`]: enforce (deny with `429 Too Many Requests`), dry-run
//!    (never deny, report what would have happened) or shadow (let every request through and
//!    tell the handler, which decides).
//!
//! # Headers
//!
//! The [`headers`](hotlimit::headers) module renders them, and its docs say what each field
//! means: `Retry-After` on denials, the `RateLimit-Policy` / `RateLimit` pair of the newest
//! draft-ietf-httpapi-ratelimit-headers ([`LayerBuilder::headers`] picks an older one), the legacy
//! `X-RateLimit-*` fields on request ([`LayerBuilder::headers`]). The policy is the limiter's
//! sustained rate over a whole-second window ([`AdvertisedQuota`]; `"default";q=5;w=1` above
//! is 5 per second), its burst the vendor parameter `hotlimit-burst`, so a client that spaces
//! its requests `w/q` apart gets the whole rate without a 429; for such a client, set
//! [`RateLimitHeaders::on_allowed`](hotlimit::headers::RateLimitHeaders::on_allowed). All values come from the very [`Decision`] that decided the
//! request. Denials always carry the headers; allowed responses carry them when
//! [`RateLimitHeaders::on_allowed`](hotlimit::headers::RateLimitHeaders::on_allowed) is set; dry-run responses always carry them (that is how a
//! dry run reports). The two IETF fields are lists and are appended, so nested layers (per IP,
//! then per API key) advertise both policies: give them distinct names
//! ([`QuotaPolicy::named`]).
//!
//! # Responses the layer makes itself
//!
//! In [`Mode::Enforce`] only; in the other modes every request reaches the inner service.
//!
//! | status | when |
//! |---|---|
//! | `429 Too Many Requests` | the limiter denied the request |
//! | `400 Bad Request` | no key ([`MissingKey::Reject`]) or a key over the length bound ([`OversizedKey::Reject`]) |
//! | `413 Content Too Large` | the request's cost exceeds the limiter's capacity: it could never pass |
//! | `503 Service Unavailable` | the limiter could not decide: its error is not the request's cost (a backend failure: [`QuotaError::Backend`](hotlimit::QuotaError::Backend)); no rate-limit headers, since there is no decision, and no [`LayerBuilder::on_decision`] report |
//!
//! Their body is the response body type's `Default` (empty for axum's `Body`).
//!
//! # In-flight limits: requests running at once
//!
//! With a limiter of [`InFlight`](hotlimit::algo::InFlight) permits ("at most 4 generations
//! running per API key"), [`LayerBuilder::in_flight`] makes a layer whose admitted requests
//! hold their permits until their response bodies end (read to the end, failed or dropped:
//! the body is an [`InFlightBody`]), and answers a request beyond the limit with the status
//! it was given (429 or 503) and its `Retry-After`. Stack it with a rate layer for both
//! limits: put the in-flight layer outside, so a request the rate refuses gives its permit
//! back at once.
//!
//! # Over Redis: one limit for every instance
//!
//! With this crate's `redis` feature, `hotlimit::redis::AsyncRedisLimiter` is an
//! [`AsyncRateLimiter<str>`](hotlimit::AsyncRateLimiter): put it behind the layer as any limiter
//! (it advertises its algorithm's quota, so the headers are the in-memory layer's):
//!
//! ```ignore
//! use hotlimit::{algo::Gcra, redis::{FailMode, RedisLimiter}};
//! use hotlimit_tower::{HeaderKey, RateLimitLayer};
//!
//! let limiter = RedisLimiter::builder("redis://10.0.0.5:6379/", "5/s burst 5".parse::<Gcra>()?)
//!     .fail_mode(FailMode::Closed { retry_after: Duration::from_secs(1) })
//!     .io_timeout(Duration::from_millis(100))
//!     .build_async()
//!     .await?;
//! let layer = RateLimitLayer::builder(Arc::new(limiter), HeaderKey::from_static("x-api-key")).build();
//! let app = Router::new().route("/", get(handler)).layer(layer);
//! ```
//!
//! The layer polls the limiter's future once in `call`; pending, the response future keeps
//! the request and the ready inner service and awaits it, so a slow or frozen server never
//! blocks the runtime. An outage (refused, reset, timed out after the I/O timeout) answers the
//! limiter's `FailMode`: open lets the request through
//! (without a `RateLimit` field: no remaining is known), closed answers 429 with its
//! `Retry-After`. Any other backend error (a script error, a wrong type, a misrouted command:
//! a misconfiguration, not an outage) answers 503 without rate-limit headers, never an allow,
//! and is counted in the limiter's `stats().errors`.
//!
//! The sync `RedisLimiter` does not compile behind the layer: its round trip would block a
//! runtime thread in `call`. Only the async client's type differs between these two:
//!
#![cfg_attr(
    feature = "redis",
    doc = r#"
```
use hotlimit::{algo::Gcra, redis::AsyncRedisLimiter};
use hotlimit_tower::{HeaderKey, RateLimitLayer};
use std::sync::Arc;

fn layer(limiter: AsyncRedisLimiter<Gcra>) {
    let _ = RateLimitLayer::builder(Arc::new(limiter), HeaderKey::from_static("x-api-key"));
}
```

```compile_fail,E0277
use hotlimit::{algo::Gcra, redis::RedisLimiter};
use hotlimit_tower::{HeaderKey, RateLimitLayer};
use std::sync::Arc;

fn layer(limiter: RedisLimiter<Gcra>) {
    let _ = RateLimitLayer::builder(Arc::new(limiter), HeaderKey::from_static("x-api-key"));
}
```
"#
)]
//!
//! # Cost when unused
//!
//! The core crate builds without tower (a crate of its own, this one). An
//! in-memory limiter's decision is ready at the one poll in `call` (a `std::future::Ready`):
//! the request is decided there as by a synchronous layer, nothing boxed, the inner service
//! not cloned. On the allowed path without headers the layer allocates nothing for header and
//! IP keys: the key is
//! borrowed from the request or formatted on the stack. Each response that carries headers
//! allocates one small buffer per header field. `cargo bench -p hotlimit-tower --bench tower`
//! measures the layer against the bare limiter: its own cost (a header lookup, moving the
//! request head out and back, wrapping the inner future) comes on top of the limiter's check
//! and is small next to what parsing an HTTP request costs a server; see `BENCHMARKS.md`,
//! section "The tower layer (`hotlimit-tower`), ns per request".

mod cost;
mod extract;
mod hierarchy;
mod in_flight;
mod layer;
mod options;
mod plan;
mod settle;

pub use cost::{RequestCost, UnitCost};
pub use extract::{ForwardedIp, HeaderKey, Key, KeyExtractor, Or, PeerIp};
pub use hierarchy::{Hierarchy, HierarchyFuture, HierarchyLayer};
pub use in_flight::{InFlightBody, InFlightFuture, InFlightLayer, InFlightService};
pub use layer::{Pending, RateLimit, RateLimitLayer, ResponseFuture};
pub use options::{LayerBuilder, MissingKey, OversizedKey, Report, ShadowDecision};
pub use plan::{NoPlans, PlanLimiter, Planned, Plans, RequestPlan};
pub use settle::{ResponseCost, Settle, SettleFuture, SettleLayer};

// The layer's headers, modes and policies are `hotlimit::headers`' own, with one path each.
#[cfg(doc)]
use hotlimit::headers::QuotaPolicy;
use hotlimit::headers::{AdvertisedQuota, Mode};

#[cfg(doc)]
use hotlimit::Decision;
use http::header::HeaderName;

/// The default bound on a key's length in bytes; see [`LayerBuilder::max_key_len`].
///
/// Long enough for IP addresses, UUIDs and typical API keys, short enough that a flood of
/// distinct keys costs little memory. Longer keys (a JWT, say) are hashed by default
/// ([`OversizedKey::Hash`]).
pub const DEFAULT_MAX_KEY_LEN: usize = 256;

/// `X-Forwarded-For`, which [`ForwardedIp`] reads.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
