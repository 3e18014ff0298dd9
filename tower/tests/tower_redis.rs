//! The tower layer over the Redis backend (`AsyncRedisLimiter`) against a real `redis-server`
//! that each test starts on 127.0.0.1: the same headers as the in-memory layer, one limit
//! shared by two servers, and a frozen server that the layer awaits without blocking its
//! runtime. Without `redis-server` on the PATH the tests print why and pass, unless
//! `HOTLIMIT_REQUIRE_REDIS=1`.
//!
//! Run with `cargo test -p hotlimit-tower --features redis --test tower_redis`.

use axum::body::Bytes;
use axum::routing::get;
use axum::Router;
use hotlimit::algo::Gcra;
use hotlimit::redis::{AsyncRedisLimiter, FailMode, RedisLimiter};
use hotlimit::{CasLimiter, ManualClock};
use hotlimit_tower::{HeaderKey, RateLimitLayer};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::{Layer, ServiceExt};

#[path = "../../tests/redis_server/mod.rs"]
mod redis_server;
use redis_server::Server;

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

async fn serve(app: Router) -> (SocketAddr, HttpClient) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, Client::builder(TokioExecutor::new()).build_http())
}

/// Status and the rate-limit headers of a GET with `x-api-key: key`.
async fn fetch(client: &HttpClient, addr: SocketAddr, key: &str) -> (u16, Vec<Option<String>>) {
    let req = Request::get(format!("http://{addr}/"))
        .header("x-api-key", key)
        .body(Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    body.collect().await.unwrap();
    (parts.status.as_u16(), rate_headers(&parts.headers))
}

fn rate_headers(h: &HeaderMap) -> Vec<Option<String>> {
    [
        "retry-after",
        "ratelimit-policy",
        "ratelimit",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ]
    .iter()
    .map(|name| h.get(*name).map(|v| v.to_str().unwrap().to_owned()))
    .collect()
}

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

/// 5 per minute, bursts of 5: T = 12 s, so the few milliseconds a test takes never return a
/// unit, and every header value is exact.
fn quota() -> Gcra {
    "5/min burst 5".parse().unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

// Pins G61.
#[test]
fn same_headers_as_the_in_memory_layer_and_one_limit_for_two_servers() {
    let Some(server) = Server::start() else {
        return;
    };
    rt().block_on(async {
        let layer = |l| {
            RateLimitLayer::builder(l, HeaderKey::from_static("x-api-key"))
                .headers(|h| (h.on_allowed, h.legacy) = (true, true))
                .build()
        };
        let redis: Arc<AsyncRedisLimiter<Gcra>> = Arc::new(
            RedisLimiter::builder(server.url(), quota())
                .key_prefix("headers:")
                .build_async()
                .await
                .unwrap(),
        );
        let (redis_addr, client) = serve(hello().layer(layer(redis))).await;
        let memory = Arc::new(CasLimiter::<String, Gcra, _>::with_clock(
            quota(),
            ManualClock::default(),
        ));
        let memory_layer = RateLimitLayer::builder(memory, HeaderKey::from_static("x-api-key"))
            .headers(|h| (h.on_allowed, h.legacy) = (true, true))
            .build();
        let (memory_addr, _) = serve(hello().layer(memory_layer)).await;

        let mut from_redis = Vec::new();
        let mut from_memory = Vec::new();
        for _ in 0..7 {
            from_redis.push(fetch(&client, redis_addr, "alice").await);
            from_memory.push(fetch(&client, memory_addr, "alice").await);
        }
        let s = |v: &str| Some(v.to_owned());
        // k requests in: the next unit is back in 12 s (draft 10's `t`), the key is full again
        // k × 12 s later (`X-RateLimit-Reset`).
        let allowed = |k: u64| {
            let reset = (12 * k).to_string();
            (
                200,
                vec![
                    None,
                    s(r#""default";q=5;w=60;hotlimit-burst=5"#),
                    s(&format!(r#""default";r={};t=12"#, 5 - k)),
                    s("5"),
                    s(&(5 - k).to_string()),
                    s(&reset),
                ],
            )
        };
        let denied = (
            429,
            vec![
                s("12"),
                s(r#""default";q=5;w=60;hotlimit-burst=5"#),
                s(r#""default";r=0;t=12"#),
                s("5"),
                s("0"),
                s("60"),
            ],
        );
        let want: Vec<_> = (1..=5)
            .map(allowed)
            .chain([denied.clone(), denied])
            .collect();
        assert_eq!(from_memory, want);
        assert_eq!(from_redis, want);

        // Two instances of a service, each with its own connection, share one limit.
        let (a, b) = (
            Arc::new(
                RedisLimiter::builder(server.url(), quota())
                    .key_prefix("shared:")
                    .build_async()
                    .await
                    .unwrap(),
            ),
            Arc::new(
                RedisLimiter::builder(server.url(), quota())
                    .key_prefix("shared:")
                    .build_async()
                    .await
                    .unwrap(),
            ),
        );
        let (addr_a, _) = serve(hello().layer(layer(a))).await;
        let (addr_b, _) = serve(hello().layer(layer(b))).await;
        // A key over the layer's bound (a JWT, say) is hashed the same by both instances:
        // still one limit, not one each.
        let long = "j".repeat(1_000);
        for key in ["bob", long.as_str()] {
            let mut statuses = [0usize; 2];
            for i in 0..20 {
                let addr = if i % 2 == 0 { addr_a } else { addr_b };
                let (status, _) = fetch(&client, addr, key).await;
                statuses[usize::from(status == 429)] += 1;
            }
            assert_eq!(statuses, [5, 15], "{}", &key[..3]);
        }
    });
}

/// The hybrid limiter behind the layer, as any in-memory limiter: two servers, each with
/// its own `HybridLimiter` on one Redis, share each client's quota (5, no fallback: every
/// admission leased); allowed responses carry the quota's policy, denials a 429.
// Pins G46.
#[test]
fn the_hybrid_limiter_behind_the_layer_shares_one_limit_for_two_servers() {
    use hotlimit::redis::{Fallback, HybridLimiter};
    let Some(server) = Server::start() else {
        return;
    };
    rt().block_on(async {
        let hybrid = || {
            Arc::new(
                HybridLimiter::builder(server.url(), quota())
                    .redis(|r| r.key_prefix("hybrid:"))
                    .sync_interval(Duration::from_millis(5))
                    .fallback(Fallback::DENY)
                    .build()
                    .unwrap(),
            )
        };
        let layer = |l: Arc<HybridLimiter<Gcra>>| {
            RateLimitLayer::builder(l, HeaderKey::from_static("x-api-key"))
                .headers(|h| h.on_allowed = true)
                .build()
        };
        let (a, b) = (hybrid(), hybrid());
        let (addr_a, client) = serve(hello().layer(layer(Arc::clone(&a)))).await;
        let (addr_b, _) = serve(hello().layer(layer(Arc::clone(&b)))).await;
        let mut allowed = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        // Rounds through both servers until the quota is spent: a denial asks for a lease,
        // which the next sync brings.
        while allowed < 5 {
            assert!(Instant::now() < deadline, "{:?} {:?}", a.stats(), b.stats());
            for addr in [addr_a, addr_b] {
                let (status, headers) = fetch(&client, addr, "carol").await;
                assert_eq!(
                    headers[1].as_deref(),
                    Some(r#""default";q=5;w=60;hotlimit-burst=5"#)
                );
                if status == 200 {
                    allowed += 1;
                } else {
                    assert_eq!(status, 429);
                    assert!(headers[0].is_some(), "a 429 carries Retry-After");
                }
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        // Spent across the two: both keep answering 429, rounds after rounds of syncs.
        for _ in 0..10 {
            for addr in [addr_a, addr_b] {
                assert_eq!(fetch(&client, addr, "carol").await.0, 429);
            }
            tokio::time::sleep(Duration::from_millis(6)).await;
        }
        assert_eq!(allowed, 5);
        let leased = a.stats().leased + b.stats().leased;
        let returned = a.stats().returned + b.stats().returned;
        assert_eq!(leased - returned, 5, "{:?} {:?}", a.stats(), b.stats());
    });
}

/// A limited request while the server is frozen, on a current-thread runtime: the layer
/// awaits the round trip (a ticker on the same thread keeps ticking, another service keeps
/// answering), the fail mode answers within the I/O timeout, and once the server is back a
/// request gets a real decision again.
fn frozen_server(fail_mode: FailMode) {
    let Some(server) = Server::start() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let io_timeout = Duration::from_millis(300);
        let limiter = Arc::new(
            RedisLimiter::builder(server.url(), "100/s burst 10".parse::<Gcra>().unwrap())
                .key_prefix("frozen:")
                .fail_mode(fail_mode)
                .io_timeout(io_timeout)
                .build_async()
                .await
                .unwrap(),
        );
        let layer = RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-api-key"))
            .headers(|h| h.on_allowed = true)
            .build();
        let svc = layer.layer(tower::service_fn(|_: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::from("hello")))
        }));
        let request = || {
            Request::builder()
                .header("x-api-key", "k")
                .body(String::new())
                .unwrap()
        };
        let real = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(real.status(), StatusCode::OK);
        assert_eq!(real.headers()["ratelimit"], r#""default";r=9;t=1"#);

        server.signal("-STOP");
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                let mut every = tokio::time::interval(Duration::from_millis(10));
                loop {
                    every.tick().await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let start = Instant::now();
        let limited = async {
            let resp = svc.clone().oneshot(request()).await.unwrap();
            (resp, start.elapsed(), ticks.load(Ordering::Relaxed))
        };
        // Another service on the same thread, asked 50 ms into the wait.
        let other = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let other = tower::service_fn(|_: Request<String>| async {
                Ok::<_, Infallible>(Response::new(String::from("other")))
            });
            let resp = other.oneshot(request()).await.unwrap();
            assert_eq!(resp.into_body(), "other");
            start.elapsed()
        };
        let ((resp, took, ticks_then), other_took) = tokio::join!(limited, other);
        ticker.abort();
        server.signal("-CONT");

        // The runtime kept working while the limited request waited on the frozen server.
        assert!(other_took < took, "other {other_took:?}, limited {took:?}");
        assert!(ticks_then >= 10, "{ticks_then} ticks in {took:?}");
        // An upper bound on the timeout that answered: the I/O timeout plus a margin.
        assert!(took < io_timeout + Duration::from_millis(700), "{took:?}");
        assert_eq!(limiter.stats().failures, 1);
        let h = resp.headers();
        // The fail mode's decision knows no remaining: no `RateLimit` field; the policy holds.
        assert!(!h.contains_key("ratelimit"));
        assert_eq!(
            h["ratelimit-policy"],
            r#""default";q=100;w=1;hotlimit-burst=10"#
        ); // 100/s burst 10
        match fail_mode {
            FailMode::Closed { .. } => {
                assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
                assert_eq!(h["retry-after"], "7");
            }
            FailMode::Open => {
                assert_eq!(resp.status(), StatusCode::OK);
                assert!(!h.contains_key("retry-after"));
            }
        }

        // The server is back: the dropped connection is opened again, a real decision.
        let resp = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let ratelimit = resp.headers()["ratelimit"].to_str().unwrap();
        assert!(ratelimit.starts_with(r#""default";r="#), "{ratelimit}");
        assert_eq!(limiter.stats().failures, 1);
    });
}

// Pins G42, G61.
#[test]
fn frozen_server_closed_mode_denies_within_the_timeout_without_blocking_the_runtime() {
    frozen_server(FailMode::Closed {
        retry_after: Duration::from_secs(7),
    });
}

// Pins G42, G61.
#[test]
fn frozen_server_open_mode_allows_within_the_timeout_without_blocking_the_runtime() {
    frozen_server(FailMode::Open);
}

/// An error that is not an outage (here the client's key holds a list, a WRONGTYPE inside the
/// script) is neither an allow nor a rate-limit denial, whatever the fail mode: the layer
/// answers 503 without rate-limit headers, and the limiter counts it in `errors()`, not
/// `failures()`. Other keys are unaffected.
// Pins G42, G61.
#[test]
fn a_backend_error_is_a_503_under_either_fail_mode() {
    let Some(server) = Server::start() else {
        return;
    };
    rt().block_on(async {
        for (i, mode) in [
            FailMode::Open,
            FailMode::Closed {
                retry_after: Duration::from_secs(7),
            },
        ]
        .into_iter()
        .enumerate()
        {
            let limiter = Arc::new(
                RedisLimiter::builder(server.url(), quota())
                    .key_prefix(format!("broken{i}:"))
                    .fail_mode(mode)
                    .build_async()
                    .await
                    .unwrap(),
            );
            let mut raw = redis::Client::open(server.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let _: () = redis::cmd("LPUSH")
                .arg(limiter.redis_key("mallory"))
                .arg("x")
                .query_async(&mut raw)
                .await
                .unwrap();
            let layer =
                RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-api-key"))
                    .build();
            let (addr, client) = serve(hello().layer(layer)).await;
            let (status, headers) = fetch(&client, addr, "mallory").await;
            assert_eq!(status, 503, "{mode:?}");
            assert_eq!(headers, vec![None; 6], "{mode:?}");
            assert_eq!(
                (limiter.stats().errors, limiter.stats().failures),
                (1, 0),
                "{mode:?}"
            );
            assert_eq!(fetch(&client, addr, "alice").await.0, 200, "{mode:?}");
        }
    });
}

/// Plans over Redis: the layer hands the request's quota to `AsyncRedisLimiter`, whose script
/// runs it on the key's one state, and advertises it.
// Pins G62.
#[test]
fn plans_over_redis_decide_and_advertise_each_requests_quota() {
    let Some(server) = Server::start() else {
        return;
    };
    rt().block_on(async {
        let limiter = RedisLimiter::builder(server.url(), quota())
            .key_prefix("plans:")
            .build_async()
            .await
            .unwrap();
        let pro: Gcra = "60/min burst 8".parse().unwrap();
        let layer = RateLimitLayer::builder(Arc::new(limiter), HeaderKey::from_static("x-api-key"))
            .plans(move |_parts, key| key.starts_with("pro_").then_some(pro))
            .build();
        let (addr, client) = serve(hello().layer(layer)).await;
        let admitted = |key: &'static str| {
            let client = client.clone();
            async move {
                let mut n = 0;
                loop {
                    let (status, headers) = fetch(&client, addr, key).await;
                    if status != 200 {
                        assert_eq!(status, 429);
                        return (n, headers[1].clone());
                    }
                    n += 1;
                }
            }
        };
        let (free, free_policy) = admitted("alice").await;
        let (pro, pro_policy) = admitted("pro_bob").await;
        assert_eq!((free, pro), (5, 8));
        assert_eq!(
            free_policy.as_deref(),
            Some(r#""default";q=5;w=60;hotlimit-burst=5"#)
        );
        assert_eq!(
            pro_policy.as_deref(),
            Some(r#""default";q=1;w=1;hotlimit-burst=8"#)
        );
    });
}
