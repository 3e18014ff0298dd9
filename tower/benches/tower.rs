//! The tower layer's overhead over the bare limiter.
//!
//! `cargo bench -p hotlimit-tower --bench tower`. One thread, one key, a GCRA quota no row
//! exhausts (except the `denied` row), the default TSC clock. Rows:
//!
//! * `bare-check`: `limiter.check(key)`, the floor.
//! * `inner-only`: the trivial inner service (`service_fn` answering an empty response at
//!   once) without the layer: `poll_ready`, `call`, one poll of its ready future.
//! * `layer/...`: the same through the layer, allowed: keyed by a header (borrowed key), by
//!   the connection's address (formatted on the stack), by `X-Forwarded-For`; with and
//!   without the rate-limit headers on the response.
//! * `denied/...`: a limiter that denies every request, so the layer answers 429 itself
//!   (with `Retry-After` and the IETF fields); the request is consumed, so `build-request`
//!   gives the cost of building one, included in the `denied` row.
//!
//! The layer's own cost is `layer/... − inner-only`; its overhead over the limiter is that
//! minus `bare-check`. The inner service parks the request it gets in a slot and the next
//! iteration sends it again, so the allowed rows allocate no request.

use criterion::{criterion_group, criterion_main, Criterion};
use hotlimit::algo::Gcra;
use hotlimit::CasLimiter;
use hotlimit::RateLimiter;
use hotlimit_tower::{ForwardedIp, HeaderKey, KeyExtractor, PeerIp, RateLimitLayer};
use http::{Request, Response};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::{Future, Ready};
use std::hint::black_box;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
use tower::{service_fn, Layer, Service};

const KEY: &str = "k-0123456789abcdef";

type Req = Request<()>;
type Res = Response<()>;
/// Where the inner service parks the request it was sent.
type Slot = Rc<Cell<Option<Req>>>;

/// A limiter whose quota no benchmark exhausts.
fn roomy() -> Arc<CasLimiter<String, Gcra>> {
    Arc::new(CasLimiter::new(gcra()))
}

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// Polls a future that is ready at once (the inner service's and the layer's are).
fn poll_now<F: Future>(cx: &mut Context<'_>, f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(cx) {
        Poll::Ready(out) => out,
        Poll::Pending => unreachable!("the benchmark's futures are ready at once"),
    }
}

/// The inner service: parks the request in `slot` and answers an empty response at once.
fn inner(
    slot: &Slot,
) -> impl Service<Req, Response = Res, Error = Infallible, Future = Ready<Result<Res, Infallible>>> + Clone
{
    let slot = slot.clone();
    service_fn(move |req: Req| {
        slot.set(Some(req));
        std::future::ready(Ok(Response::new(())))
    })
}

/// A request with an API key, a forwarded header and the peer address.
fn request() -> Req {
    let mut req = Request::get("/api/orders")
        .header("x-api-key", KEY)
        .header("x-forwarded-for", "10.0.0.1, 203.0.113.7")
        .header("user-agent", "bench")
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert("203.0.113.7:4711".parse::<SocketAddr>().unwrap());
    req
}

/// Benchmarks `svc` (built around `inner(slot)`) on one request sent again and again.
fn bench_reusing<S>(c: &mut Criterion, name: &str, slot: &Slot, mut svc: S)
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
{
    slot.set(Some(request()));
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    c.bench_function(name, |b| {
        b.iter(|| {
            let _ = svc.poll_ready(&mut cx);
            let req = slot.take().expect("allowed: the inner service parked it");
            let resp = poll_now(&mut cx, svc.call(req)).unwrap();
            black_box(resp)
        })
    });
}

fn bench_layer<X: KeyExtractor>(c: &mut Criterion, name: &str, key: X, headers: bool) {
    let slot = Slot::default();
    let svc = RateLimitLayer::builder(roomy(), key)
        .headers(|h| h.on_allowed = headers)
        .build()
        .layer(inner(&slot));
    bench_reusing(c, name, &slot, svc);
}

fn benches(c: &mut Criterion) {
    let limiter = roomy();
    c.bench_function("tower/bare-check", |b| {
        b.iter(|| black_box(limiter.check(black_box(KEY))))
    });
    let slot = Slot::default();
    bench_reusing(c, "tower/inner-only", &slot, inner(&slot));
    let header = || HeaderKey::from_static("x-api-key");
    bench_layer(c, "tower/layer/header-key", header(), false);
    bench_layer(c, "tower/layer/header-key+headers", header(), true);
    bench_layer(c, "tower/layer/peer-ip", PeerIp::default(), false);
    let xff = ForwardedIp::x_forwarded_for(1);
    bench_layer(c, "tower/layer/x-forwarded-for", xff, false);

    // Denials: the layer answers 429 itself; each iteration builds a new request.
    c.bench_function("tower/build-request", |b| b.iter(|| black_box(request())));
    let strict = Arc::new(CasLimiter::<String, Gcra>::new(
        "1/h burst 1".parse().unwrap(),
    ));
    let _ = strict.check(KEY);
    let mut svc = RateLimitLayer::builder(strict, header())
        .build()
        .layer(inner(&slot));
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    c.bench_function("tower/denied/header-key", |b| {
        b.iter(|| {
            let _ = svc.poll_ready(&mut cx);
            let resp = poll_now(&mut cx, svc.call(request())).unwrap();
            assert_eq!(resp.status(), 429);
            black_box(resp)
        })
    });
}

criterion_group! {
    name = tower_benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = benches
}
criterion_main!(tower_benches);

/// A quota no benchmark exhausts (as the core's benches): every request takes the write path.
fn gcra() -> Gcra {
    "1000000000/s burst 1099511627776".parse().unwrap()
}
