//! The tower layer's allocations per request, counted with a counting global allocator:
//! what a request costs the heap beyond the limiter's own check (which allocates nothing,
//! tests/alloc.rs). The figures are stated in docs/http.md; this pins them.
//!
//! The service behind the layer allocates nothing itself, and the future is polled by hand
//! (no runtime), so every allocation counted is the layer's.

use hotlimit::algo::Gcra;
use hotlimit::RateLimiter;
use hotlimit::{CasLimiter, ManualClock};
use hotlimit_tower::{HeaderKey, RateLimitLayer};
use http::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::future::{ready, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use tower::{Layer, Service};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// A waker that does nothing: every future here is ready at its first poll.
struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// Calls `svc` with `req` and polls the answer to completion; the status and the
/// allocations it took (the request itself built before, the response dropped after).
fn call<S>(svc: &mut S, req: Request<()>, waker: &Waker) -> (StatusCode, u64)
where
    S: Service<Request<()>, Response = Response<()>, Error = Infallible>,
{
    let mut cx = Context::from_waker(waker);
    let before = dhat::HeapStats::get().total_blocks;
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut fut = pin!(svc.call(req));
    let resp = loop {
        if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
            break r.unwrap();
        }
    };
    let n = dhat::HeapStats::get().total_blocks - before;
    (resp.status(), n)
}

fn request(key: &str) -> Request<()> {
    Request::get("/").header("x-api-key", key).body(()).unwrap()
}

/// Pins the tower layer's figures (docs/http.md, "Allocations"): an admitted request with no
/// header to add allocates nothing; the headers a response gets cost one allocation per
/// value (`http` keeps each value in a buffer of its own) and the header map's tables the
/// first time a response gets a header. The settle layer copies the key once per admitted
/// request, to settle with.
// Pins G36.
#[test]
fn the_tower_layer_allocates_per_request_what_its_headers_need() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let waker = Waker::from(Arc::new(Noop));
    let clock = ManualClock::default();
    let limiter = Arc::new(CasLimiter::<String, Gcra, _>::with_clock(
        "2/s burst 2".parse().unwrap(),
        clock.clone(),
    ));
    let inner =
        || tower::service_fn(|_: Request<()>| ready(Ok::<_, Infallible>(Response::new(()))));
    let key = || HeaderKey::from_static("x-api-key");
    // Warm up: the key's entry and this thread's reclamation slot.
    let _ = limiter.check("k");
    let measure = |svc: &mut dyn FnMut(Request<()>) -> (StatusCode, u64)| {
        clock.advance(std::time::Duration::from_secs(60));
        let allowed = svc(request("k"));
        let _ = svc(request("k"));
        let denied = svc(request("k"));
        assert_eq!(allowed.0, StatusCode::OK);
        assert_eq!(denied.0, StatusCode::TOO_MANY_REQUESTS);
        (allowed.1, denied.1)
    };

    // Headers off for admitted requests (the default): nothing on an admission; a 429's
    // `RateLimit-Policy`, `RateLimit` and `Retry-After`.
    let mut plain = RateLimitLayer::builder(limiter.clone(), key())
        .build()
        .layer(inner());
    let plain = measure(&mut |r| call(&mut plain, r, &waker));
    eprintln!(
        "layer, default headers: admitted {}, 429 {}",
        plain.0, plain.1
    );
    assert_eq!(plain.0, 0, "an admitted request without headers");

    // Headers on every answer, the legacy `X-RateLimit-*` set too.
    let mut all = RateLimitLayer::builder(limiter.clone(), key())
        .headers(|h| (h.on_allowed, h.legacy) = (true, true))
        .build()
        .layer(inner());
    let all = measure(&mut |r| call(&mut all, r, &waker));
    eprintln!("layer, every header: admitted {}, 429 {}", all.0, all.1);

    // The settle layer: the key copied to settle with.
    let mut settle = RateLimitLayer::builder(limiter.clone(), key())
        .settle(|_: &Response<()>| Some(1))
        .layer(inner());
    let settled = measure(&mut |r| call(&mut settle, r, &waker));
    eprintln!(
        "settle layer, default headers: admitted {}, 429 {}",
        settled.0, settled.1
    );
    assert_eq!(settled.0, 1, "the settle layer's copy of the key");
    assert_eq!(
        settled.1, plain.1,
        "a 429 from the settle layer as from the layer"
    );

    // Stated in docs/http.md: a 429 with its three fields, 6; every field on both, 10 and
    // 12 (six and seven fields); nothing else grows with the request.
    assert_eq!(plain, (0, 6), "the layer with its default headers");
    assert_eq!(all, (10, 12), "the layer with every header");
}
