//! In-flight limits behind the layer (issue #62): a request holds its permit until its
//! response body ends, over real loopback HTTP (an axum server, hyper's client); and the
//! body's drop and end, through `tower::ServiceExt::oneshot`, also on a limiter written outside
//! the core.
//!
//! Run with `cargo test -p hotlimit-tower --test in_flight`.

use axum::body::{Body, Bytes};
use axum::routing::get;
use axum::Router;
#[path = "../../tests/common/budget.rs"]
mod budget;

use budget::Budget;
use hotlimit::algo::InFlight;
use hotlimit::headers::{AdvertisedQuota, Mode, QuotaPolicy};
use hotlimit::{AsyncRateLimiter, CasLimiter, ManualClock, Requests};
use hotlimit_tower::{HeaderKey, InFlightBody, RateLimitLayer};
use http::header::RETRY_AFTER;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

type Limiter = CasLimiter<String, InFlight, ManualClock>;

fn limiter(max: u64) -> Arc<Limiter> {
    Arc::new(CasLimiter::with_clock(
        InFlight::new(max, Duration::from_secs(600)).unwrap(),
        ManualClock::default(),
    ))
}

/// A body that sends one chunk once its gate opens, then ends: a slow response (a
/// generation still streaming).
struct Gated(Option<oneshot::Receiver<()>>);

impl http_body::Body for Gated {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(gate) = self.0.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(gate).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => {
                self.0 = None;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"done")))))
            }
        }
    }
}

/// Gates by request id (the `x-id` header): the test opens each.
type Gates = Arc<Mutex<HashMap<String, oneshot::Receiver<()>>>>;

// Pins G77.
#[tokio::test]
async fn a_slow_response_holds_its_permit_until_its_body_ends() {
    let running = limiter(1);
    let gates: Gates = Arc::default();
    let handler_gates = gates.clone();
    let app = Router::new()
        .route(
            "/",
            get(move |req: Request<Body>| {
                let gates = handler_gates.clone();
                async move {
                    let id = req.headers()["x-id"].to_str().unwrap().to_owned();
                    let gate = gates.lock().unwrap().remove(&id);
                    Response::new(Body::new(Gated(gate)))
                }
            }),
        )
        .layer(
            RateLimitLayer::builder(running.clone(), HeaderKey::from_static("x-api-key"))
                .in_flight(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Duration::from_millis(1_500),
                ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let send = |key: &str, id: &str| {
        let req = Request::get(format!("http://{addr}/"))
            .header("x-api-key", key)
            .header("x-id", id)
            .body(Empty::new())
            .unwrap();
        client.request(req)
    };
    let (open, gate) = oneshot::channel();
    gates.lock().unwrap().insert("slow".into(), gate);
    let slow = send("alice", "slow").await.unwrap();
    assert_eq!(slow.status(), StatusCode::OK); // its head is out, its body still running
    let refused = send("alice", "second").await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()[RETRY_AFTER], "2"); // 1.5 s, rounded up
    assert!(refused.headers().get("ratelimit").is_none());
    // Another key has its own permits; its body ends at once, and so does its hold.
    for id in ["b1", "b2", "b3"] {
        let bob = send("bob", id).await.unwrap();
        assert_eq!(bob.status(), StatusCode::OK);
        assert_eq!(bob.into_body().collect().await.unwrap().to_bytes(), "");
    }
    assert_eq!(
        send("alice", "third").await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    open.send(()).unwrap();
    let body = slow.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "done");
    // Read to its end: the permit was given back before the end reached the client.
    let after = send("alice", "after").await.unwrap();
    assert_eq!(after.status(), StatusCode::OK);
}

/// The in-flight layer over `running` (in `mode`, denying with `denied` and
/// `Retry-After: 1`) around a service whose bodies are empty.
type App<L = Limiter> =
    BoxCloneService<Request<()>, Response<InFlightBody<Empty<Bytes>, L>>, Infallible>;

fn app<L>(running: &Arc<L>, mode: Mode, denied: StatusCode) -> App<L>
where
    L: AsyncRateLimiter<str> + Requests<str> + AdvertisedQuota + 'static,
{
    let layer = RateLimitLayer::builder(running.clone(), HeaderKey::from_static("x-api-key"))
        .headers(|h| h.mode = mode)
        .in_flight(denied, Duration::from_secs(1));
    BoxCloneService::new(layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    })))
}

/// A request for key `k` through `app`: its response, the body unread.
async fn send<L: Requests<str> + 'static>(app: &App<L>) -> Response<InFlightBody<Empty<Bytes>, L>> {
    let req = Request::builder()
        .header("x-api-key", "k")
        .body(())
        .unwrap();
    app.clone().oneshot(req).await.unwrap()
}

// Pins G77.
#[tokio::test]
async fn a_dropped_body_gives_its_permit_back_and_a_denial_holds_none() {
    let running = limiter(2);
    let app = app(&running, Mode::Enforce, StatusCode::TOO_MANY_REQUESTS);
    let first = send(&app).await;
    let second = send(&app).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK);
    for _ in 0..3 {
        let refused = send(&app).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers()[RETRY_AFTER], "1");
    }
    drop(first); // a client gone before the body was read
    let third = send(&app).await;
    assert_eq!(third.status(), StatusCode::OK);
    assert_eq!(send(&app).await.status(), StatusCode::TOO_MANY_REQUESTS);
    // Read to its end without being dropped: given back at the end.
    let mut body = second.into_body();
    assert!(body.frame().await.is_none());
    assert_eq!(send(&app).await.status(), StatusCode::OK);
    drop((body, third));
}

// Pins G77.
#[tokio::test]
async fn dry_run_lets_every_request_through_and_admitted_ones_still_hold() {
    let running = limiter(1);
    let app = app(&running, Mode::DryRun, StatusCode::SERVICE_UNAVAILABLE);
    let held = send(&app).await;
    let over = send(&app).await;
    assert_eq!(
        (held.status(), over.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    // The one admitted holds the only permit; the one let through over the limit holds none.
    assert!(running.request("k").peek().unwrap().is_denied());
    drop(over);
    assert!(running.request("k").peek().unwrap().is_denied());
    drop(held);
    assert!(running.request("k").peek().unwrap().is_allowed());
}

/// No rate to advertise: a budget in flight is a count.
impl AdvertisedQuota for Budget {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        None
    }
}

/// A limiter written outside the core (`tests/common/budget.rs`: a budget of units per key
/// that never refills, on the core's public API alone, its tickets issued and settled as the
/// crate's limiters do theirs) behind the in-flight layer: each admitted request's take is
/// settled with 0 when its response body ends, which gives the budget back, so the budget
/// holds at most its limit of requests running per key.
#[tokio::test]
async fn an_outside_limiter_holds_each_request_until_its_body_ends() {
    let running = Arc::new(Budget::new(0x7011, 2));
    let app = app(&running, Mode::Enforce, StatusCode::TOO_MANY_REQUESTS);
    let (first, second) = (send(&app).await, send(&app).await);
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    assert_eq!(running.spent("k"), 2);
    let refused = send(&app).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(refused); // a denial holds nothing
    assert_eq!(running.spent("k"), 2);
    drop(first); // a client gone before the body was read: its unit comes back
    assert_eq!(running.spent("k"), 1);
    let third = send(&app).await;
    assert_eq!(third.status(), StatusCode::OK);
    assert_eq!(send(&app).await.status(), StatusCode::TOO_MANY_REQUESTS);
    // Read to its end: given back at the end, before the body is dropped.
    let mut body = second.into_body();
    assert!(body.frame().await.is_none());
    assert_eq!(running.spent("k"), 1);
    drop((body, third));
    assert_eq!(running.spent("k"), 0);
}
