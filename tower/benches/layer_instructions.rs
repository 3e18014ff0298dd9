//! The layer's instructions per request, counted, not timed: `N` requests of one client
//! through the layer (allowed, no headers) on a manual clock, so callgrind's count is the same
//! run to run. Run it at two `N` and divide the difference (setup cancels):
//!
//! ```sh
//! cargo bench -p hotlimit-tower --bench layer_instructions --no-run
//! for n in 20000 40000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/deps/layer_instructions-* header $n 2>&1 | grep refs
//! done
//! ```
//!
//! `header` keys by the `x-api-key` header, `peer` by the connection's address.

use hotlimit::algo::Gcra;
use hotlimit::{CasLimiter, ManualClock};
use hotlimit_tower::{HeaderKey, KeyExtractor, PeerIp, RateLimitLayer};
use http::{Request, Response};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use tower::{service_fn, Layer, Service};

type Req = Request<()>;

fn request() -> Req {
    let mut req = Request::get("/api/orders")
        .header("x-api-key", "k-0123456789abcdef")
        .body(())
        .expect("a valid request");
    let peer: SocketAddr = "203.0.113.7:4711".parse().expect("an address");
    req.extensions_mut().insert(peer);
    req
}

/// `n` requests of one client through the layer keyed by `key`; the inner service parks each
/// request so the next iteration sends it again (no request built in the loop).
fn run<X: KeyExtractor>(key: X, n: usize) {
    let slot: Rc<Cell<Option<Req>>> = Rc::default();
    let parked = slot.clone();
    let inner = service_fn(move |req: Req| {
        parked.set(Some(req));
        std::future::ready(Ok::<_, Infallible>(Response::new(())))
    });
    // A quota no run exhausts: every request is allowed and writes.
    let gcra: Gcra = "1000000000/s burst 1099511627776".parse().expect("a quota");
    let limiter = Arc::new(CasLimiter::<String, Gcra, _>::with_clock(
        gcra,
        ManualClock::default(),
    ));
    let mut svc = RateLimitLayer::builder(limiter, key).build().layer(inner);
    slot.set(Some(request()));
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..n {
        let _ = svc.poll_ready(&mut cx);
        let req = slot.take().expect("the inner service parked it");
        let mut call = std::pin::pin!(svc.call(req));
        match call.as_mut().poll(&mut cx) {
            Poll::Ready(response) => {
                black_box(response.expect("infallible"));
            }
            Poll::Pending => unreachable!("in memory: decided at once"),
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let (Some(which), Some(n)) = (args.next(), args.next()) else {
        // `cargo bench` with no arguments: nothing to count.
        return;
    };
    let n: usize = n.parse().expect("a number of requests");
    match which.as_str() {
        "header" => run(HeaderKey::from_static("x-api-key"), n),
        "peer" => run(PeerIp::default(), n),
        other => panic!("unknown extractor {other}: header or peer"),
    }
}
