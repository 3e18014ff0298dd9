//! The tower layer's overhead over the bare limiter.
//!
//! `cargo bench --features tower --bench tower`. One thread, one key, a GCRA quota no row
//! exhausts (except the `denied` rows), the default TSC clock. Rows:
//!
//! * `bare-check`: `limiter.check(key)`, the floor.
//! * `inner-only`: the trivial inner service (`service_fn` answering an empty response)
//!   without the layer: `poll_ready`, `call`, one poll of its ready future.
//! * `layer/...`: the same through the layer, allowed: keyed by a header (borrowed key), by
//!   the connection's address (formatted on the stack), by `X-Forwarded-For`; with and
//!   without the rate-limit headers on the response.
//! * `denied/...`: a limiter that denies every request, so the layer answers 429 itself
//!   (with its headers); the request is consumed, so `build-request` gives the cost of
//!   building one, included in the `denied` row.
//!
//! The layer's own cost is `layer/... − inner-only`; its overhead over the limiter is that
//! minus `bare-check`. No allocation per request on the allowed path without headers: the
//! inner service hands the request back in its response body, so every iteration reuses one
//! request.

use criterion::{criterion_group, criterion_main, Criterion};
use hotlimit::algo::Gcra;
use hotlimit::tower::{ForwardedIp, HeaderKey, KeyExtractor, PeerIp, RateLimitLayer};
use hotlimit::CasLimiter;
use http::{Request, Response};
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
use tower::{service_fn, Layer, Service};

const KEY: &str = "k-0123456789abcdef";

/// A quota no benchmark exhausts: 1 event per ns with a burst of 2^40.
fn roomy() -> Arc<CasLimiter<String, Gcra>> {
    Arc::new(CasLimiter::new(
        "1000000000/s burst 1099511627776".parse().unwrap(),
    ))
}

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// Polls a future that is ready at once (the inner service's and the layer's are).
fn poll_ready_now<F: Future>(cx: &mut Context<'_>, f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(cx) {
        Poll::Ready(out) => out,
        Poll::Pending => unreachable!("the benchmark's futures are ready at once"),
    }
}

/// The inner service: answers at once and hands the request back in the body, so the next
/// iteration reuses it (no per-iteration request allocation).
type Req = Request<()>;
type Res = Response<Option<Req>>;

fn inner() -> impl Service<
    Req,
    Response = Res,
    Error = std::convert::Infallible,
    Future = std::future::Ready<Result<Res, std::convert::Infallible>>,
> + Clone {
    service_fn(|req: Req| std::future::ready(Ok(Response::new(Some(req)))))
}

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

/// Runs `svc` on one reused request per iteration.
fn bench_reusing<S>(c: &mut Criterion, name: &str, mut svc: S)
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
{
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let mut req = Some(request());
    c.bench_function(name, |b| {
        b.iter(|| {
            let _ = svc.poll_ready(&mut cx);
            let r = req
                .take()
                .expect("the inner service hands the request back");
            let resp = poll_ready_now(&mut cx, svc.call(r)).unwrap();
            let (parts, body) = resp.into_parts();
            black_box(&parts.headers);
            req = Some(body.expect("allowed: the request came back"));
        })
    });
}

fn layered<X: KeyExtractor>(
    key: X,
    headers: bool,
) -> impl Service<Req, Response = Res, Error = std::convert::Infallible> {
    RateLimitLayer::builder(roomy(), key)
        .headers_on_allowed(headers)
        .build()
        .layer(inner())
}

fn benches(c: &mut Criterion) {
    let limiter = roomy();
    c.bench_function("tower/bare-check", |b| {
        b.iter(|| black_box(limiter.check(black_box(KEY))))
    });
    bench_reusing(c, "tower/inner-only", inner());
    let header = || HeaderKey::from_static("x-api-key");
    bench_reusing(c, "tower/layer/header-key", layered(header(), false));
    bench_reusing(c, "tower/layer/header-key+headers", layered(header(), true));
    bench_reusing(c, "tower/layer/peer-ip", layered(PeerIp::new(), false));
    bench_reusing(
        c,
        "tower/layer/x-forwarded-for",
        layered(ForwardedIp::x_forwarded_for(1), false),
    );

    // Denials: the layer answers 429 with Retry-After and the IETF fields.
    c.bench_function("tower/build-request", |b| b.iter(|| black_box(request())));
    let strict = Arc::new(CasLimiter::<String, Gcra>::new(
        "1/h burst 1".parse().unwrap(),
    ));
    strict.check(KEY);
    let mut svc = RateLimitLayer::builder(strict, header())
        .build()
        .layer(inner());
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    c.bench_function("tower/denied/header-key", |b| {
        b.iter(|| {
            let _ = svc.poll_ready(&mut cx);
            let resp = poll_ready_now(&mut cx, svc.call(request())).unwrap();
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
