//! A limiter written outside the core (`tests/common/budget.rs`: a budget of units per key
//! that never refills, on the core's public API alone, its tickets issued and settled as the
//! crate's limiters do theirs) behind the layer's in-flight mode: each admitted request's
//! take is settled with 0 when its response body ends, which gives the budget back, so the
//! budget holds at most its limit of requests running per key.

#[path = "../../tests/common/budget.rs"]
mod budget;

use axum::body::Bytes;
use budget::Budget;
use hotlimit::headers::{AdvertisedQuota, QuotaPolicy};
use hotlimit_tower::{HeaderKey, InFlightBody, RateLimitLayer};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

/// No rate to advertise: a budget in flight is a count.
impl AdvertisedQuota for Budget {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        None
    }
}

type App = BoxCloneService<Request<()>, Response<InFlightBody<Empty<Bytes>, Budget>>, Infallible>;

async fn send(app: &App) -> Response<InFlightBody<Empty<Bytes>, Budget>> {
    let req = Request::builder()
        .header("x-api-key", "k")
        .body(())
        .unwrap();
    app.clone().oneshot(req).await.unwrap()
}

#[tokio::test]
async fn an_outside_limiter_holds_each_request_until_its_body_ends() {
    let running = Arc::new(Budget::new(0x7011, 2));
    let layer = RateLimitLayer::builder(running.clone(), HeaderKey::from_static("x-api-key"))
        .in_flight(StatusCode::TOO_MANY_REQUESTS, Duration::from_secs(1));
    let app: App = BoxCloneService::new(layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::new()))
    })));
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
