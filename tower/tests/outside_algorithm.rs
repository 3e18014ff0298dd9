//! An algorithm written outside the core, on its public API only (issue #60; the tick-refilled
//! token bucket of `tests/common/tick_bucket.rs`, checked on every store by
//! `tests/outside_algorithm.rs`), limiting HTTP requests behind the layer.

#[path = "../../tests/common/tick_bucket.rs"]
mod tick_bucket;
use hotlimit::headers::{AdvertisedQuota, QuotaPolicy};
use hotlimit::{CasLimiter, ManualClock};
use hotlimit_tower::{HeaderKey, RateLimitLayer};
use http::{Request, StatusCode};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tick_bucket::{bucket, TickBucket};
use tower::{service_fn, Layer, ServiceExt};

/// What the layer advertises: `size` per the time a full refill takes.
impl AdvertisedQuota for TickBucket {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        let refill = self.size.div_ceil(self.per_tick) * self.tick;
        Some(QuotaPolicy::new(self.size, Duration::from_nanos(refill)))
    }
}

/// Behind the layer: 3 requests pass, the 4th is a 429 whose Retry-After is the next
/// tick, and a tick later one passes again.
#[tokio::test]
async fn an_outside_algorithm_limits_http_requests() {
    let clock = ManualClock::default();
    let limiter = Arc::new(CasLimiter::<String, TickBucket, _>::with_clock(
        bucket(),
        clock.clone(),
    ));
    let layer = RateLimitLayer::builder(limiter, HeaderKey::from_static("x-api-key")).build();
    let service = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(()))
    }));
    let call = |service: &_| {
        let service = Clone::clone(service);
        async move {
            let req = Request::get("/").header("x-api-key", "k").body(()).unwrap();
            ServiceExt::<Request<()>>::oneshot(service, req)
                .await
                .unwrap()
        }
    };
    for _ in 0..3 {
        assert_eq!(call(&service).await.status(), StatusCode::OK);
    }
    let denied = call(&service).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "1");
    clock.set(Duration::from_millis(100));
    assert_eq!(call(&service).await.status(), StatusCode::OK);
}
