//! The tower layer over real loopback HTTP: an axum server bound to 127.0.0.1:0, hyper's
//! client, limiters on a `ManualClock` that the tests move (no sleeps).
//!
//! Run with `cargo test -p hotlimit-tower --test tower`.

use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::{Extension, Router};
use hotlimit::algo::{Earrrl, FixedWindow, Gcra, SlidingWindow};
use hotlimit::headers::{AdvertisedQuota, Mode, QuotaPolicy};
use hotlimit::Requests;
use hotlimit::{
    AsyncRateLimiter, CasLimiter, Decision, ManualClock, MutexLimiter, QuotaError, RateLimiter,
};
use hotlimit_tower::{
    ForwardedIp, HeaderKey, KeyExtractor, MissingKey, OversizedKey, PeerIp, RateLimitLayer,
    ShadowDecision,
};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::{Layer, ServiceExt};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Serves `app` on 127.0.0.1:0 (with the peer address in the extensions, as axum does) and
/// returns its address and a client.
async fn serve(app: Router) -> (SocketAddr, HttpClient) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let client = Client::builder(TokioExecutor::new()).build_http();
    (addr, client)
}

/// A GET with `headers`; the status, the headers and the body as text.
async fn get_with(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let mut req = Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

async fn get_plain(client: &HttpClient, addr: SocketAddr) -> (StatusCode, HeaderMap, String) {
    get_with(client, addr, "/", &[]).await
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

/// Parses `"<name>";r=<r>;t=<t>` (the `RateLimit` field) into (name, r, t).
fn parse_ratelimit(v: &str) -> (String, u64, Option<u64>) {
    let mut items = v.split(';');
    let name = items.next().unwrap().trim_matches('"').to_owned();
    let (mut r, mut t) = (None, None);
    for item in items {
        let (k, v) = item.split_once('=').unwrap();
        match k {
            "r" => r = Some(v.parse().unwrap()),
            "t" => t = Some(v.parse().unwrap()),
            other => panic!("unexpected parameter {other}"),
        }
    }
    (name, r.unwrap(), t)
}

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

fn gcra_limiter(spec: &str, clock: &ManualClock) -> Arc<CasLimiter<String, Gcra, ManualClock>> {
    Arc::new(CasLimiter::with_clock(
        spec.parse::<Gcra>().unwrap(),
        clock.clone(),
    ))
}

fn peer_ip() -> PeerIp {
    PeerIp::from_extension::<ConnectInfo<SocketAddr>>()
}

// Pins G57.
#[tokio::test]
async fn burst_passes_then_429_with_retry_after_then_passes_after_the_clock_moves() {
    let clock = ManualClock::default();
    let limiter = gcra_limiter("5/s burst 5", &clock);
    let decisions = Arc::new(Mutex::new(Vec::<Decision>::new()));
    let seen = decisions.clone();
    let layer = RateLimitLayer::builder(limiter.clone(), peer_ip())
        .headers(|h| (h.on_allowed, h.legacy) = (true, true))
        .on_decision(move |r| seen.lock().unwrap().push(r.decision))
        .build();
    let (addr, client) = serve(hello().layer(layer)).await;

    for remaining in (0..5).rev() {
        let (status, h, body) = get_plain(&client, addr).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "hello");
        assert_eq!(
            header(&h, "ratelimit-policy"),
            Some(r#""default";q=5;w=1;hotlimit-burst=5"#)
        );
        // k requests in: tat = k × 200 ms, so the reset is under a second: t = 1.
        let expected = format!(r#""default";r={remaining};t=1"#);
        assert_eq!(header(&h, "ratelimit"), Some(expected.as_str()));
        assert_eq!(header(&h, "x-ratelimit-limit"), Some("5"));
        assert_eq!(
            header(&h, "x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        assert_eq!(header(&h, "x-ratelimit-reset"), Some("1"));
        assert_eq!(header(&h, "retry-after"), None);
    }

    let (status, h, body) = get_plain(&client, addr).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body, "");
    // The limiter's wait is 200 ms; Retry-After rounds up to whole seconds.
    assert_eq!(header(&h, "retry-after"), Some("1"));
    assert_eq!(
        header(&h, "ratelimit-policy"),
        Some(r#""default";q=5;w=1;hotlimit-burst=5"#)
    );
    assert_eq!(header(&h, "ratelimit"), Some(r#""default";r=0;t=1"#));
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("0"));
    let denial = *decisions.lock().unwrap().last().unwrap();
    assert!(denial.is_denied());
    assert_eq!(denial.retry_after(), Duration::from_millis(200));

    clock.advance(denial.retry_after());
    let (status, h, _) = get_plain(&client, addr).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&h, "ratelimit"), Some(r#""default";r=0;t=1"#));
    let (status, _, _) = get_plain(&client, addr).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    // One key (127.0.0.1), eight decisions.
    assert_eq!(limiter.metrics().keys, 1);
    assert_eq!(decisions.lock().unwrap().len(), 8);
}

// Pins G57.
#[tokio::test]
async fn headers_parse_and_match_the_limiters_decisions() {
    // A fixed window of 3 per minute, 5 s into it: the reset is 55 s away.
    let clock = ManualClock::default();
    clock.set(Duration::from_secs(5));
    let limiter = Arc::new(CasLimiter::<String, _, _>::with_clock(
        FixedWindow::new(3, Duration::from_secs(60)).unwrap(),
        clock.clone(),
    ));
    let decisions = Arc::new(Mutex::new(Vec::<Decision>::new()));
    let seen = decisions.clone();
    let layer = RateLimitLayer::builder(limiter, HeaderKey::from_static("x-api-key"))
        .headers(|h| h.on_allowed = true)
        .on_decision(move |r| seen.lock().unwrap().push(r.decision))
        .build();
    let (addr, client) = serve(hello().layer(layer)).await;

    for i in 0..5 {
        clock.advance(Duration::from_millis(1500));
        let (status, h, _) = get_with(&client, addr, "/", &[("x-api-key", "k1")]).await;
        let d = decisions.lock().unwrap()[i];
        assert_eq!(status.as_u16() == 429, d.is_denied());
        assert_eq!(
            header(&h, "ratelimit-policy"),
            Some(r#""default";q=3;w=60"#)
        );
        let (name, r, t) = parse_ratelimit(header(&h, "ratelimit").unwrap());
        assert_eq!(name, "default");
        assert_eq!(Some(r), d.remaining());
        let reset = d.reset_after().unwrap();
        assert_eq!(
            t,
            Some(reset.as_secs() + u64::from(reset.subsec_nanos() > 0))
        );
        if d.is_denied() {
            let retry: u64 = header(&h, "retry-after").unwrap().parse().unwrap();
            assert!(Duration::from_secs(retry) >= d.retry_after());
            assert!(Duration::from_secs(retry) < d.retry_after() + Duration::from_secs(1));
        }
    }
    // 3 allowed at 6.5, 8 and 9.5 s, then denied until the window ends at 60 s.
    let (status, h, _) = get_with(&client, addr, "/", &[("x-api-key", "k1")]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&h, "retry-after"), Some("48")); // 60 − 12.5 = 47.5 s
    assert_eq!(header(&h, "ratelimit"), Some(r#""default";r=0;t=48"#));
}

// Pins G59.
#[tokio::test]
async fn dry_run_never_denies_and_reports_would_be_denials() {
    let clock = ManualClock::default();
    let limiter = gcra_limiter("5/s burst 5", &clock);
    let would_deny = Arc::new(Mutex::new(Vec::<(String, Decision)>::new()));
    let seen = would_deny.clone();
    let layer = RateLimitLayer::builder(limiter, peer_ip())
        .headers(|h| h.mode = Mode::DryRun)
        .on_decision(move |r| {
            assert_eq!(r.mode, Mode::DryRun);
            if r.decision.is_denied() {
                seen.lock().unwrap().push((r.key.to_owned(), r.decision));
            }
        })
        .build();
    let (addr, client) = serve(hello().layer(layer)).await;

    for i in 0..20 {
        let (status, h, body) = get_plain(&client, addr).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "hello");
        // Dry-run responses carry the headers of the decision, never Retry-After.
        let (_, r, _) = parse_ratelimit(header(&h, "ratelimit").unwrap());
        assert_eq!(r, 4u64.saturating_sub(i));
        assert_eq!(header(&h, "retry-after"), None);
    }
    let denials = would_deny.lock().unwrap();
    assert_eq!(denials.len(), 15);
    assert!(denials
        .iter()
        .all(|(k, d)| k == "127.0.0.1" && d.is_denied()));
    assert_eq!(denials[0].1.retry_after(), Duration::from_millis(200));
}

// Pins G60.
#[tokio::test]
async fn missing_key_is_rejected_with_400_by_default() {
    let clock = ManualClock::default();
    let limiter = gcra_limiter("5/s burst 5", &clock);
    let layer =
        RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-api-key")).build();
    let (addr, client) = serve(hello().layer(layer)).await;

    let (status, _, _) = get_plain(&client, addr).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(limiter.metrics().keys, 0, "nothing was counted");
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", "k1")]).await;
    assert_eq!(status, StatusCode::OK);
    // A value that is not visible ASCII is no key either.
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", "é")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// `x-api-key:` with nothing after it, as a client writes it on the wire (a plain socket on a
/// blocking thread: the test needs no async I/O of its own).
async fn raw_get_with_empty_key(addr: SocketAddr) -> String {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        let request = "GET / HTTP/1.1\r\nhost: x\r\nx-api-key:\r\nconnection: close\r\n\r\n";
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    })
    .await
    .unwrap()
}

// Pins G60.
#[tokio::test]
async fn an_empty_key_is_a_missing_key() {
    let clock = ManualClock::default();
    let limiter = gcra_limiter("5/s burst 5", &clock);
    let layer =
        RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-api-key")).build();
    let (addr, client) = serve(hello().layer(layer)).await;

    // On the wire (no value, not even a space) and from a client (an empty value): 400, no
    // key counted, so such clients do not all share the key "".
    let raw = raw_get_with_empty_key(addr).await;
    assert!(raw.starts_with("HTTP/1.1 400 "), "{raw}");
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", "")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(limiter.metrics().keys, 0);

    // With a fallback extractor the empty header falls through to it: keyed by the peer.
    let limiter = gcra_limiter("5/s burst 5", &clock);
    let key = HeaderKey::from_static("x-api-key").or(peer_ip());
    let (addr, client) =
        serve(hello().layer(RateLimitLayer::builder(limiter.clone(), key).build())).await;
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", "")]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(raw_get_with_empty_key(addr)
        .await
        .starts_with("HTTP/1.1 200 "));
    assert_eq!(limiter.metrics().keys, 1);
    assert!(limiter.request("~:127.0.0.1").peek().unwrap().is_allowed());
    assert!(limiter
        .request("~:127.0.0.1")
        .cost(4)
        .peek()
        .unwrap()
        .is_denied());
    // An API key that is the peer's address is not the peer's key: it spends a budget of its
    // own, and the peer's 3 units are left to it.
    for _ in 0..5 {
        let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", "127.0.0.1")]).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", "127.0.0.1")]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        limiter.request("~:127.0.0.1").peek().unwrap().remaining(),
        Some(2)
    );
    assert_eq!(get_plain(&client, addr).await.0, StatusCode::OK);
    // And an API key written as the peer's key is kept apart too (`~~:127.0.0.1`).
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", "~:127.0.0.1")]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        limiter.request("~:127.0.0.1").peek().unwrap().remaining(),
        Some(1)
    );

    // A closure that yields an empty key is treated the same way, before the limiter.
    let limiter = gcra_limiter("5/s burst 5", &clock);
    let layer = RateLimitLayer::builder(limiter.clone(), |_: &http::request::Parts| {
        Some(String::new())
    })
    .missing_key(MissingKey::Fallback("anonymous".into()))
    .build();
    let (addr, client) = serve(hello().layer(layer)).await;
    assert_eq!(get_plain(&client, addr).await.0, StatusCode::OK);
    assert_eq!(limiter.metrics().keys, 1);
    assert!(limiter
        .request("anonymous")
        .cost(5)
        .peek()
        .unwrap()
        .is_denied());
    assert!(limiter
        .request("anonymous")
        .cost(4)
        .peek()
        .unwrap()
        .is_allowed());
}

// Pins G60.
#[tokio::test]
async fn keyless_requests_share_the_fallback_key() {
    let clock = ManualClock::default();
    let limiter = gcra_limiter("1/s burst 2", &clock);
    let layer = RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-api-key"))
        .missing_key(MissingKey::Fallback("anonymous".into()))
        .build();
    let (addr, client) = serve(hello().layer(layer)).await;

    assert_eq!(get_plain(&client, addr).await.0, StatusCode::OK);
    assert_eq!(get_plain(&client, addr).await.0, StatusCode::OK);
    let (status, h, _) = get_plain(&client, addr).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&h, "retry-after"), Some("1"));
    // Keyed clients have their own budget.
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", "k1")]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(limiter.metrics().keys, 2);
    assert!(limiter.check("anonymous").is_denied());
}

// Pins G60.
#[tokio::test]
async fn hostile_keys_are_bounded() {
    let clock = ManualClock::default();
    let limiter = gcra_limiter("5/s burst 5", &clock);
    let keys = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = keys.clone();
    let layer = RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-api-key"))
        .on_decision(move |r| seen.lock().unwrap().push(r.key.to_owned()))
        .build();
    let (addr, client) = serve(hello().layer(layer.clone())).await;

    // 10 kB: over the 256-byte bound, under the server's header limit: hashed, not stored.
    let long = "a".repeat(10_000);
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", &long)]).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", &long)]).await;
    assert_eq!(status, StatusCode::OK);
    let other = "b".repeat(10_000);
    assert_eq!(
        get_with(&client, addr, "/", &[("x-api-key", &other)])
            .await
            .0,
        StatusCode::OK
    );
    {
        let keys = keys.lock().unwrap();
        assert_eq!(keys.len(), 3);
        assert!(keys.iter().all(|k| k.len() == 33 && k.starts_with('#')));
        assert_eq!(keys[0], keys[1], "the same long key hashes the same");
        assert_ne!(keys[0], keys[2]);
    }
    assert_eq!(limiter.metrics().keys, 2);

    // 1 MB: hyper refuses it before the layer runs (431, or a closed connection). Either
    // way nothing panics and the server keeps serving.
    let huge = "h".repeat(1 << 20);
    let req = Request::get(format!("http://{addr}/"))
        .header("x-api-key", &huge)
        .body(Empty::new())
        .unwrap();
    if let Ok(resp) = client.request(req).await {
        assert!(resp.status().is_client_error(), "{}", resp.status());
    }
    assert_eq!(
        get_with(&client, addr, "/", &[("x-api-key", "k1")]).await.0,
        StatusCode::OK
    );

    // The layer itself, without hyper's limit in front: a 1 MB key is hashed too.
    let svc = layer.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
    }));
    let req = Request::get("/")
        .header("x-api-key", &huge)
        .body(Body::empty())
        .unwrap();
    assert_eq!(svc.oneshot(req).await.unwrap().status(), StatusCode::OK);
    assert_eq!(keys.lock().unwrap().last().unwrap().len(), 33);

    // A layer built apart (another instance of the service, a restart) keys a long key by
    // the same hash: its budget, already spent above, is not given anew.
    let again = RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-api-key"))
        .on_decision({
            let seen = keys.clone();
            move |r| seen.lock().unwrap().push(r.key.to_owned())
        })
        .build();
    let spent = layer.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
    }));
    let fresh = again.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
    }));
    let with_long = || {
        Request::get("/")
            .header("x-api-key", &long)
            .body(Body::empty())
            .unwrap()
    };
    // 5 in all: 2 above, 1 here, 2 through the other layer; then both deny.
    assert_eq!(
        spent.clone().oneshot(with_long()).await.unwrap().status(),
        StatusCode::OK
    );
    for _ in 0..2 {
        assert_eq!(
            fresh.clone().oneshot(with_long()).await.unwrap().status(),
            StatusCode::OK
        );
    }
    assert_eq!(
        fresh.oneshot(with_long()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        spent.oneshot(with_long()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    {
        let keys = keys.lock().unwrap();
        let last = &keys[keys.len() - 5..];
        assert!(last.iter().all(|k| *k == keys[0]), "{last:?}");
    }

    // Or refused, when configured so.
    let strict = RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-api-key"))
        .max_key_len(64)
        .oversized_key(OversizedKey::Reject)
        .build();
    let (addr, client) = serve(hello().layer(strict)).await;
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", &"c".repeat(65))]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", &"c".repeat(64))]).await;
    assert_eq!(status, StatusCode::OK);
}

// Pins G59.
#[tokio::test]
async fn shadow_mode_lets_everything_through_and_tells_the_handler() {
    let clock = ManualClock::default();
    let limiter = gcra_limiter("5/s burst 2", &clock);
    let hooked = Arc::new(Mutex::new(0u32));
    let count = hooked.clone();
    let layer = RateLimitLayer::builder(limiter, peer_ip())
        .headers(|h| h.on_allowed = true)
        .shadow_hook(move |decision, parts| {
            *count.lock().unwrap() += 1;
            if decision.is_denied() {
                parts
                    .headers
                    .insert("x-shadow-banned", "1".parse().unwrap());
            }
        })
        .build();
    // The handler answers 200 either way, but only "does the work" when allowed.
    let app = Router::new()
        .route(
            "/",
            get(
                |Extension(ShadowDecision(d)): Extension<ShadowDecision>, h: HeaderMap| async move {
                    match (d.is_allowed(), h.contains_key("x-shadow-banned")) {
                        (true, false) => "done",
                        (false, true) => "dropped",
                        _ => "inconsistent",
                    }
                },
            ),
        )
        .layer(layer);
    let (addr, client) = serve(app).await;

    let mut bodies = Vec::new();
    for _ in 0..4 {
        let (status, h, body) = get_plain(&client, addr).await;
        assert_eq!(status, StatusCode::OK);
        // Headers on allowed responses only: a shadow-banned client sees nothing unusual.
        assert_eq!(h.contains_key("ratelimit"), body == "done");
        assert!(!h.contains_key("retry-after"));
        bodies.push(body);
    }
    assert_eq!(bodies, ["done", "done", "dropped", "dropped"]);
    assert_eq!(*hooked.lock().unwrap(), 4);
}

// Pins G60.
#[tokio::test]
async fn forwarded_ip_keys_by_the_proxys_entry_not_the_clients() {
    let clock = ManualClock::default();
    let limiter = gcra_limiter("1/s burst 1", &clock);
    let layer = RateLimitLayer::builder(limiter.clone(), ForwardedIp::x_forwarded_for(1)).build();
    let (addr, client) = serve(hello().layer(layer)).await;

    let xff = |v: &'static str| [("x-forwarded-for", v)];
    assert_eq!(
        get_with(&client, addr, "/", &xff("198.51.100.1")).await.0,
        StatusCode::OK
    );
    // The client rotates a spoofed left entry; the proxy's right-most entry stays.
    let (status, _, _) = get_with(&client, addr, "/", &xff("10.9.9.9, 198.51.100.1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        get_with(&client, addr, "/", &xff("198.51.100.2")).await.0,
        StatusCode::OK
    );
    // No header: no key, 400 by default.
    assert_eq!(get_plain(&client, addr).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(limiter.metrics().keys, 2);
}

// Pins G17, G60.
#[tokio::test]
async fn cost_function_free_and_impossible_requests() {
    let clock = ManualClock::default();
    let limiter = gcra_limiter("10/s burst 10", &clock);
    let layer = RateLimitLayer::builder(limiter.clone(), peer_ip())
        .cost(|p: &http::request::Parts| match p.uri.path() {
            "/health" => 0,
            "/big" => 4,
            "/huge" => 11,
            _ => 1,
        })
        .headers(|h| h.on_allowed = true)
        .build();
    let app = Router::new()
        .route("/health", get(|| async { "up" }))
        .route("/big", get(|| async { "big" }))
        .route("/huge", get(|| async { "huge" }))
        .layer(layer);
    let (addr, client) = serve(app).await;

    let (status, h, _) = get_with(&client, addr, "/health", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !h.contains_key("ratelimit"),
        "free requests are not counted"
    );
    assert_eq!(limiter.metrics().keys, 0);
    let (status, h, _) = get_with(&client, addr, "/big", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&h, "ratelimit"), Some(r#""default";r=6;t=1"#));
    // Above the burst: could never pass, so not 429 (a retry would not help).
    let (status, h, _) = get_with(&client, addr, "/huge", &[]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        header(&h, "ratelimit-policy"),
        Some(r#""default";q=10;w=1;hotlimit-burst=10"#)
    );
    assert_eq!(get_with(&client, addr, "/big", &[]).await.0, StatusCode::OK);
    let (status, h, _) = get_with(&client, addr, "/big", &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // 2 left, 4 asked: 2 more tokens needed, 200 ms; still rounded up to 1 s.
    assert_eq!(header(&h, "retry-after"), Some("1"));
    assert_eq!(header(&h, "ratelimit"), Some(r#""default";r=2;t=1"#));
}

// Pins G57.
#[tokio::test]
async fn any_algorithm_and_variant_behind_the_layer() {
    // The mutex twin with a sliding window, and a named policy.
    let clock = ManualClock::default();
    let limiter = Arc::new(MutexLimiter::<String, _, _>::with_clock(
        SlidingWindow::new(2, Duration::from_secs(10)).unwrap(),
        clock.clone(),
    ));
    let policy = QuotaPolicy::new(2, Duration::from_secs(10))
        .named("per-10s")
        .unwrap();
    let layer = RateLimitLayer::builder(limiter, peer_ip())
        .headers(|h| h.quota = Some(policy))
        .build();
    let (addr, client) = serve(hello().layer(layer)).await;
    assert_eq!(get_plain(&client, addr).await.0, StatusCode::OK);
    assert_eq!(get_plain(&client, addr).await.0, StatusCode::OK);
    let (status, h, _) = get_plain(&client, addr).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&h, "ratelimit-policy"),
        Some(r#""per-10s";q=2;w=10"#)
    );
    assert!(header(&h, "ratelimit")
        .unwrap()
        .starts_with(r#""per-10s";r=0;t="#));

    // EARRRL as a `dyn` limiter: no quota, no remaining, so only Retry-After.
    let clock = ManualClock::default();
    let earrrl = Earrrl::new(Duration::from_secs(2), "3/s".parse().unwrap()).unwrap();
    let limiter: Arc<dyn RateLimiter<str>> = Arc::new(CasLimiter::<String, _, _>::with_clock(
        earrrl,
        clock.clone(),
    ));
    let layer = RateLimitLayer::builder(limiter, peer_ip()).build();
    let (addr, client) = serve(hello().layer(layer)).await;
    let mut statuses = Vec::new();
    for _ in 0..30 {
        clock.advance(Duration::from_millis(250));
        let (status, h, _) = get_plain(&client, addr).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert!(header(&h, "retry-after").unwrap().parse::<u64>().unwrap() >= 1);
            assert!(!h.contains_key("ratelimit") && !h.contains_key("ratelimit-policy"));
        }
        statuses.push(status.as_u16());
    }
    // The vector of DESIGN §3.2: one request every 0.25 s, the first denial is request 18.
    assert_eq!(statuses.iter().position(|&s| s == 429), Some(18));
}

// Pins G57.
#[tokio::test]
async fn nested_layers_advertise_both_policies() {
    let clock = ManualClock::default();
    let per_ip = RateLimitLayer::builder(gcra_limiter("10/s burst 10", &clock), peer_ip())
        .headers(|h| {
            h.quota = Some(
                QuotaPolicy::new(10, Duration::from_secs(1))
                    .named("per-ip")
                    .unwrap(),
            )
        })
        .headers(|h| h.on_allowed = true)
        .build();
    let per_key = RateLimitLayer::builder(
        gcra_limiter("1/s burst 1", &clock),
        HeaderKey::from_static("x-api-key"),
    )
    .headers(|h| {
        h.quota = Some(
            QuotaPolicy::new(1, Duration::from_secs(1))
                .named("per-key")
                .unwrap(),
        )
    })
    .headers(|h| h.on_allowed = true)
    .build();
    // The last layer added runs first: per IP, then per key.
    let (addr, client) = serve(hello().layer(per_key).layer(per_ip)).await;

    let (status, h, _) = get_with(&client, addr, "/", &[("x-api-key", "k1")]).await;
    assert_eq!(status, StatusCode::OK);
    let all = |name| {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        all("ratelimit-policy"),
        [r#""per-key";q=1;w=1"#, r#""per-ip";q=10;w=1"#]
    );
    assert_eq!(
        all("ratelimit"),
        [r#""per-key";r=0;t=1"#, r#""per-ip";r=9;t=1"#]
    );
    // The per-key layer denies; the per-IP layer still adds its fields to the 429.
    let (status, h, _) = get_with(&client, addr, "/", &[("x-api-key", "k1")]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(h.get_all("ratelimit").iter().count(), 2);
}

// Pins G59.
#[tokio::test]
async fn dry_run_and_shadow_never_refuse_keyless_or_oversized_requests() {
    for mode in [Mode::DryRun, Mode::Shadow] {
        let clock = ManualClock::default();
        let limiter = gcra_limiter("1/s burst 1", &clock);
        let layer = RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-api-key"))
            .headers(|h| h.mode = mode)
            .max_key_len(8)
            .oversized_key(OversizedKey::Reject)
            .build();
        let app = Router::new()
            .route(
                "/",
                get(|d: Option<Extension<ShadowDecision>>| async move {
                    if d.is_some() {
                        "decided"
                    } else {
                        "not decided"
                    }
                }),
            )
            .layer(layer);
        let (addr, client) = serve(app).await;
        let (status, _, body) = get_plain(&client, addr).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "not decided"),
            "{mode}"
        );
        let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", "123456789")]).await;
        assert_eq!(status, StatusCode::OK, "{mode}");
        assert_eq!(limiter.metrics().keys, 0, "{mode}: nothing counted");
        for _ in 0..3 {
            let (status, _, body) = get_with(&client, addr, "/", &[("x-api-key", "k")]).await;
            assert_eq!(status, StatusCode::OK, "{mode}");
            let expected = if mode == Mode::Shadow {
                "decided"
            } else {
                "not decided"
            };
            assert_eq!(body, expected);
        }
    }
}

/// A limiter whose decision is not ready at the layer's first poll: the in-memory decision,
/// after one yield to the runtime, as a network round trip would be. Exercises the layer's
/// waiting path without a server.
struct Deferred(Arc<CasLimiter<String, Gcra, ManualClock>>);

impl AsyncRateLimiter<str> for Deferred {
    type Error = QuotaError;
    type Future = Pin<Box<dyn Future<Output = Result<Decision, QuotaError>> + Send>>;

    fn check_n_async(&self, key: &str, cost: u64) -> Self::Future {
        let (limiter, key) = (self.0.clone(), key.to_owned());
        Box::pin(async move {
            tokio::task::yield_now().await;
            RateLimiter::check_n(&*limiter, key.as_str(), cost)
        })
    }
}

impl AdvertisedQuota for Deferred {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        self.0.algorithm().advertised_quota()
    }
}

/// The headers a layer serves for `n` requests of one client (status, retry-after, ratelimit,
/// legacy remaining), with the clock never moving.
async fn header_trace(app: Router, n: usize) -> Vec<(u16, Option<String>, Option<String>)> {
    let (addr, client) = serve(app).await;
    let mut out = Vec::new();
    for _ in 0..n {
        let (status, h, _) = get_with(&client, addr, "/", &[("x-api-key", "k")]).await;
        assert_eq!(
            header(&h, "ratelimit-policy"),
            Some(r#""default";q=3;w=1;hotlimit-burst=3"#)
        );
        let owned = |name| header(&h, name).map(str::to_owned);
        out.push((status.as_u16(), owned("retry-after"), owned("ratelimit")));
    }
    out
}

// Pins G61.
#[tokio::test]
async fn a_pending_decision_serves_the_same_responses_as_a_ready_one() {
    fn layer<L: AsyncRateLimiter<str> + AdvertisedQuota>(
        l: Arc<L>,
    ) -> RateLimitLayer<L, HeaderKey> {
        RateLimitLayer::builder(l, HeaderKey::from_static("x-api-key"))
            .headers(|h| h.on_allowed = true)
            .build()
    }
    let ready = header_trace(
        hello().layer(layer(gcra_limiter("3/s burst 3", &ManualClock::default()))),
        5,
    )
    .await;
    let deferred = Arc::new(Deferred(gcra_limiter(
        "3/s burst 3",
        &ManualClock::default(),
    )));
    let pending = header_trace(hello().layer(layer(deferred)), 5).await;
    let allowed = |r: u64| (200, None, Some(format!(r#""default";r={r};t=1"#)));
    let denied = (
        429,
        Some("1".to_owned()),
        Some(r#""default";r=0;t=1"#.to_owned()),
    );
    let want = vec![
        allowed(2),
        allowed(1),
        allowed(0),
        denied.clone(),
        denied.clone(),
    ];
    assert_eq!(ready, want);
    assert_eq!(pending, want);
}

// Pins G59.
#[tokio::test]
async fn a_pending_decision_in_shadow_mode_reaches_the_hook_and_the_handler() {
    let clock = ManualClock::default();
    let limiter = Arc::new(Deferred(gcra_limiter("5/s burst 1", &clock)));
    let reports = Arc::new(Mutex::new(Vec::<(String, bool)>::new()));
    let seen = reports.clone();
    let layer = RateLimitLayer::builder(limiter, HeaderKey::from_static("x-api-key"))
        .on_decision(move |r| {
            seen.lock()
                .unwrap()
                .push((r.key.to_owned(), r.decision.is_denied()))
        })
        .shadow_hook(|decision, parts| {
            if decision.is_denied() {
                parts
                    .headers
                    .insert("x-shadow-banned", "1".parse().unwrap());
            }
        })
        .build();
    let app = Router::new()
        .route(
            "/",
            get(
                |Extension(ShadowDecision(d)): Extension<ShadowDecision>, h: HeaderMap| async move {
                    match (d.is_allowed(), h.contains_key("x-shadow-banned")) {
                        (true, false) => "done",
                        (false, true) => "dropped",
                        _ => "inconsistent",
                    }
                },
            ),
        )
        .layer(layer);
    let (addr, client) = serve(app).await;
    let mut bodies = Vec::new();
    for _ in 0..3 {
        let (status, _, body) = get_with(&client, addr, "/", &[("x-api-key", "alice")]).await;
        assert_eq!(status, StatusCode::OK);
        bodies.push(body);
    }
    assert_eq!(bodies, ["done", "dropped", "dropped"]);
    let alice = |denied| ("alice".to_owned(), denied);
    assert_eq!(
        *reports.lock().unwrap(),
        [alice(false), alice(true), alice(true)]
    );
}

/// A limiter whose backend is down, or that refuses a cost as too large.
struct Broken;

/// Its backend's failure.
#[derive(Debug)]
struct Down;

impl std::fmt::Display for Down {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("down")
    }
}

impl std::error::Error for Down {}

impl AsyncRateLimiter<str> for Broken {
    type Error = QuotaError;
    type Future = std::future::Ready<Result<Decision, QuotaError>>;

    fn check_n_async(&self, _key: &str, cost: u64) -> Self::Future {
        std::future::ready(Err(if cost > 5 {
            QuotaError::ExceedsCapacity { cost, capacity: 5 }
        } else {
            QuotaError::Backend(Arc::new(Down))
        }))
    }
}

impl AdvertisedQuota for Broken {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        Some(QuotaPolicy::new(5, Duration::from_secs(1)))
    }
}

// Pins G61.
#[tokio::test]
async fn a_backend_error_answers_503_without_headers_and_never_allows() {
    let reports = Arc::new(Mutex::new(0u32));
    let seen = reports.clone();
    let layer = RateLimitLayer::builder(Arc::new(Broken), HeaderKey::from_static("x-api-key"))
        .headers(|h| (h.on_allowed, h.legacy) = (true, true))
        .cost(|p: &http::request::Parts| {
            p.headers
                .get("x-cost")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        })
        .on_decision(move |_| *seen.lock().unwrap() += 1)
        .build();
    let (addr, client) = serve(hello().layer(layer)).await;
    let (status, h, body) = get_with(&client, addr, "/", &[("x-api-key", "k")]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "");
    // No decision was made: no header may pretend one was.
    for name in [
        "retry-after",
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert!(!h.contains_key(name), "{name}");
    }
    // A cost error is still the request's own: 413, as with an in-memory limiter.
    let (status, h, _) = get_with(&client, addr, "/", &[("x-api-key", "k"), ("x-cost", "6")]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(&h, "ratelimit-policy"), Some(r#""default";q=5;w=1"#));
    assert_eq!(*reports.lock().unwrap(), 0);

    // Dry-run never refuses: the request passes, uncounted and without headers.
    let layer = RateLimitLayer::builder(Arc::new(Broken), HeaderKey::from_static("x-api-key"))
        .headers(|h| h.mode = Mode::DryRun)
        .build();
    let (addr, client) = serve(hello().layer(layer)).await;
    let (status, h, body) = get_with(&client, addr, "/", &[("x-api-key", "k")]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "hello"));
    assert!(!h.contains_key("ratelimit-policy") && !h.contains_key("ratelimit"));
}

/// A parameter that must be a non-negative sf-integer.
fn non_negative(params: &sfv::Parameters, key: &str) -> Option<u64> {
    params.get(key).map(|v| {
        let n = v
            .as_integer()
            .unwrap_or_else(|| panic!("{key}={v:?} is not an sf-integer"));
        u64::try_from(i64::from(n)).unwrap_or_else(|_| panic!("{key}={n} is negative"))
    })
}

/// Parameters other than the draft's must be vendor-prefixed (`hotlimit-...`).
fn only_known_params(params: &sfv::Parameters, known: &[&str]) {
    for key in params.keys() {
        let key = key.as_str();
        assert!(
            known.contains(&key) || key.starts_with("hotlimit-"),
            "unknown, unprefixed parameter {key}"
        );
    }
}

/// The items of a structured-field List split over every line of `name`: Strings with
/// parameters, nothing else.
fn string_items(h: &HeaderMap, name: &str) -> Vec<(String, sfv::Parameters)> {
    let lines: Vec<&str> = h
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    if lines.is_empty() {
        return Vec::new();
    }
    let list: sfv::List = sfv::Parser::new(&lines.join(", "))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {lines:?} is not an sf-list: {e}"));
    assert!(!list.is_empty(), "{name} is an empty list");
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => {
                let s = item
                    .bare_item
                    .as_string()
                    .unwrap_or_else(|| panic!("{name}: {:?} is not an sf-string", item.bare_item));
                (s.as_str().to_owned(), item.params)
            }
            sfv::ListEntry::InnerList(l) => panic!("{name}: inner list {l:?}"),
        })
        .collect()
}

/// What a client reading only the headers learns from one response of the newest draft,
/// after checking each field against the draft's grammar: the policy's `q`, `w` and burst,
/// the `RateLimit` item's `r` and `t`, and `Retry-After`.
#[derive(Debug, Default, Clone, Copy)]
struct Advice {
    quota: Option<(u64, u64)>,
    burst: Option<u64>,
    remaining: Option<u64>,
    t: Option<u64>,
    retry_after: Option<u64>,
}

fn read_draft_10(h: &HeaderMap) -> Advice {
    let mut advice = Advice::default();
    let policies = string_items(h, "ratelimit-policy");
    for (_, params) in &policies {
        only_known_params(params, &["q", "qu", "w", "pk"]);
        let q = non_negative(params, "q").expect("q is required");
        let w = non_negative(params, "w").expect("hotlimit always sends w");
        assert!(w > 0, "w must be positive");
        advice.quota = Some((q, w));
        advice.burst = non_negative(params, "hotlimit-burst");
    }
    for (name, params) in string_items(h, "ratelimit") {
        only_known_params(&params, &["r", "t", "pk"]);
        if !policies.is_empty() {
            assert!(policies.iter().any(|(p, _)| *p == name), "no policy {name}");
        }
        advice.remaining = Some(non_negative(&params, "r").expect("r is required"));
        advice.t = non_negative(&params, "t");
    }
    if let Some(v) = header(h, "retry-after") {
        // delay-seconds = 1*DIGIT
        assert!(
            !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()),
            "Retry-After: {v}"
        );
        let secs: u64 = v.parse().unwrap();
        // The draft: Retry-After SHOULD NOT reference a point earlier than the reset.
        assert!(
            secs >= advice.t.unwrap_or(0),
            "Retry-After {secs} < t {:?}",
            advice.t
        );
        advice.retry_after = Some(secs);
    }
    advice
}

/// A client that knows nothing but what the headers say: it spaces its requests `w/q` apart
/// (late by up to 5 %, as a real timer is), waits `t` when `r` says 0, and `Retry-After` after
/// a 429. It sends `n` requests on the manual clock and returns (allowed, 429s, seconds).
async fn paced_client(app: Router, clock: &ManualClock, n: u32) -> (u32, u32, f64) {
    use rand::{Rng, SeedableRng};
    let (addr, client) = serve(app).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let (mut allowed, mut denied, mut elapsed) = (0, 0, 0u64);
    for _ in 0..n {
        let (status, h, _) = get_with(&client, addr, "/", &[("x-api-key", "pacer")]).await;
        let advice = read_draft_10(&h);
        let secs = |s: u64| s * 1_000_000_000;
        let (q, w) = advice.quota.expect("every response advertises the policy");
        let interval = secs(w) / q;
        let mut wait = interval + rng.random_range(0..=interval / 20);
        if advice.remaining == Some(0) {
            wait = wait.max(secs(advice.t.unwrap_or(0)));
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            denied += 1;
            wait = wait.max(secs(advice.retry_after.unwrap()));
        } else {
            assert_eq!(status, StatusCode::OK);
            allowed += 1;
        }
        clock.advance(Duration::from_nanos(wait));
        elapsed += wait;
    }
    (allowed, denied, elapsed as f64 / 1e9)
}

/// The pacing client above gets at least 90 % of the configured rate and never a 429, for
/// GCRA with a sub-second and a multi-second burst and for the fixed window: the
/// advertised policy is the sustained rate (it was the burst: `100/s burst 10` advertised
/// `q=10;w=1`, and a client pacing by it got a tenth of its allowance). (The sliding
/// algorithms' `t` is the time until the key is fresh, later than their next unit: a client
/// that waits it out whenever `r` is 0 gets about half the rate of a sliding window counter;
/// see the `headers` module docs.)
// Pins G58.
#[tokio::test]
async fn a_client_pacing_by_the_headers_gets_the_rate_without_a_429() {
    async fn run(
        limiter: Arc<dyn RateLimiter<str>>,
        quota: Option<QuotaPolicy>,
        clock: ManualClock,
        rate: f64,
        policy: &str,
    ) {
        assert_eq!(quota.unwrap().to_string(), policy);
        let layer = RateLimitLayer::builder(limiter, HeaderKey::from_static("x-api-key"))
            .headers(|h| (h.quota, h.on_allowed) = (quota, true))
            .build();
        let n = 1200;
        let (allowed, denied, secs) = paced_client(hello().layer(layer), &clock, n).await;
        let got = f64::from(allowed) / secs;
        println!(
            "{policy}: {allowed} allowed, {denied} denied in {secs:.1} s: {got:.2}/s of {rate}/s"
        );
        assert_eq!((allowed, denied), (n, 0), "{policy}");
        assert!(got >= 0.9 * rate, "{policy}: {got:.2}/s of {rate}/s");
        assert!(got <= rate, "{policy}: {got:.2}/s of {rate}/s");
    }
    let clock = ManualClock::default;
    let gcra = |spec: &str, clock: &ManualClock| {
        let l = gcra_limiter(spec, clock);
        (l.advertised_quota(), l as Arc<dyn RateLimiter<str>>)
    };
    // A burst of 10 ms × 10 = 0.1 s.
    let c = clock();
    let (q, l) = gcra("100/s burst 10", &c);
    run(l, q, c, 100.0, r#""default";q=100;w=1;hotlimit-burst=10"#).await;
    // A burst of 100 ms × 50 = 5 s.
    let c = clock();
    let (q, l) = gcra("10/s burst 50", &c);
    run(l, q, c, 10.0, r#""default";q=10;w=1;hotlimit-burst=50"#).await;
    // 600 ms × 20 = 12 s, and a window of a minute.
    let c = clock();
    let (q, l) = gcra("100/min burst 20", &c);
    run(
        l,
        q,
        c,
        100.0 / 60.0,
        r#""default";q=100;w=60;hotlimit-burst=20"#,
    )
    .await;
    let s = Duration::from_secs;
    let c = clock();
    let l = Arc::new(CasLimiter::<String, _, _>::with_clock(
        FixedWindow::new(100, s(10)).unwrap(),
        c.clone(),
    ));
    let (q, l) = (l.advertised_quota(), l as Arc<dyn RateLimiter<str>>);
    run(l, q, c, 10.0, r#""default";q=100;w=10"#).await;
}

/// Every draft's fields parse by that draft's grammar (structured fields, RFC 9651), on
/// allowed and denied responses, with the legacy fields as plain integers.
// Pins G57.
#[tokio::test]
async fn every_drafts_fields_follow_its_grammar() {
    use hotlimit::headers::Draft;
    for draft in [Draft::Ietf07, Draft::Ietf09, Draft::Ietf10] {
        let clock = ManualClock::default();
        let layer = RateLimitLayer::builder(
            gcra_limiter("2/s burst 3", &clock),
            HeaderKey::from_static("x-api-key"),
        )
        .headers(|h| (h.draft, h.legacy, h.on_allowed) = (draft, true, true))
        .build();
        let (addr, client) = serve(hello().layer(layer)).await;
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let (status, h, _) = get_with(&client, addr, "/", &[("x-api-key", "k")]).await;
            statuses.push(status.as_u16());
            for legacy in [
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
            ] {
                let v = header(&h, legacy).unwrap();
                assert!(v.parse::<u64>().is_ok(), "{legacy}: {v}");
            }
            let (q, w, burst, r, t) = if draft == Draft::Ietf07 {
                // RateLimit-Policy: a list of integer items; RateLimit: a dictionary.
                let policy: sfv::List = sfv::Parser::new(header(&h, "ratelimit-policy").unwrap())
                    .parse()
                    .unwrap();
                let [sfv::ListEntry::Item(item)] = &policy[..] else {
                    panic!("{policy:?}")
                };
                let q = u64::try_from(i64::from(item.bare_item.as_integer().unwrap())).unwrap();
                only_known_params(&item.params, &["w", "burst"]);
                let (w, burst) = (
                    non_negative(&item.params, "w"),
                    non_negative(&item.params, "burst"),
                );
                let dict: sfv::Dictionary = sfv::Parser::new(header(&h, "ratelimit").unwrap())
                    .parse()
                    .unwrap();
                let int = |k: &str| match dict.get(k) {
                    Some(sfv::ListEntry::Item(i)) if i.params.is_empty() => {
                        u64::try_from(i64::from(i.bare_item.as_integer().unwrap())).unwrap()
                    }
                    other => panic!("{k}: {other:?}"),
                };
                assert_eq!(dict.len(), 3);
                assert_eq!(int("limit"), q);
                (q, w, burst, int("remaining"), Some(int("reset")))
            } else {
                let a = read_draft_10(&h);
                let (q, w) = a.quota.unwrap();
                (q, Some(w), a.burst, a.remaining.unwrap(), a.t)
            };
            assert_eq!((q, w, burst), (2, Some(1), Some(3)), "{draft}");
            // 3 allowed at once, then denied; 500 ms per unit.
            let remaining = 3u64.saturating_sub(statuses.len() as u64);
            assert_eq!(r, remaining, "{draft}");
            let want_t = match draft {
                // The next unit, or a denial's wait: 500 ms, rounded up.
                Draft::Ietf10 => 1,
                _ if statuses.len() > 3 => 1,
                // The whole burst back: 500 ms per unit taken.
                _ => (statuses.len() as u64).div_ceil(2),
            };
            assert_eq!(t, Some(want_t), "{draft}");
        }
        assert_eq!(statuses, [200, 200, 200, 429, 429], "{draft}");
    }
}

/// Plans: the quota comes from the request (here the API key's prefix), one limiter serves
/// every plan, and each response advertises the plan that decided it. A plan the limiter
/// cannot run (another window) is a 503, never an allow.
// Pins G61, G62.
#[tokio::test]
async fn plans_decide_and_advertise_each_requests_quota() {
    let clock = ManualClock::default();
    let limiter = gcra_limiter("2/s burst 2", &clock);
    let pro: Gcra = "10/s burst 5".parse().unwrap();
    let layer = RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-api-key"))
        .headers(|h| h.on_allowed = true)
        .plans(move |_parts, key| key.starts_with("pro_").then_some(pro))
        .build();
    let (addr, client) = serve(hello().layer(layer)).await;
    let send = |key: &'static str| {
        let client = client.clone();
        async move { get_with(&client, addr, "/", &[("x-api-key", key)]).await }
    };
    let free_policy = r#""default";q=2;w=1;hotlimit-burst=2"#;
    let pro_policy = r#""default";q=10;w=1;hotlimit-burst=5"#;
    for remaining in (0..2).rev() {
        let (status, h, _) = send("alice").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&h, "ratelimit-policy"), Some(free_policy));
        let expected = format!(r#""default";r={remaining};t=1"#);
        assert_eq!(header(&h, "ratelimit"), Some(expected.as_str()));
    }
    let (status, h, _) = send("alice").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&h, "ratelimit-policy"), Some(free_policy));
    for remaining in (0..5).rev() {
        let (status, h, _) = send("pro_bob").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&h, "ratelimit-policy"), Some(pro_policy));
        let expected = format!(r#""default";r={remaining};t=1"#);
        assert_eq!(header(&h, "ratelimit"), Some(expected.as_str()));
    }
    let (status, h, _) = send("pro_bob").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // The pro plan's pace: one unit every 100 ms, so Retry-After rounds up to 1 s.
    assert_eq!(header(&h, "retry-after"), Some("1"));
    assert_eq!(header(&h, "ratelimit-policy"), Some(pro_policy));
    // One limiter, both keys, each state read by its plan.
    assert_eq!(limiter.metrics().keys, 2);

    // A plan of another window cannot read a fixed window's counts: 503.
    let w = Duration::from_secs(60);
    let windows = Arc::new(CasLimiter::<String, FixedWindow, _>::with_clock(
        FixedWindow::new(3, w).unwrap(),
        clock.clone(),
    ));
    let odd = FixedWindow::new(30, w * 2).unwrap();
    let layer = RateLimitLayer::builder(windows.clone(), HeaderKey::from_static("x-api-key"))
        .plans(move |_parts, key| (key == "odd").then_some(odd))
        .build();
    let (addr, client) = serve(hello().layer(layer)).await;
    let (status, h, _) = get_with(&client, addr, "/", &[("x-api-key", "odd")]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&h, "ratelimit"), None);
    assert_eq!(windows.metrics().keys, 0, "nothing counted");
    let (status, _, _) = get_with(&client, addr, "/", &[("x-api-key", "even")]).await;
    assert_eq!(status, StatusCode::OK);
}

/// Settle at response time: a provisional cost from the request (`x-estimate`), settled with
/// what the response reports (`x-used`): fewer units refunded, more charged as a debt.
// Pins G62.
#[tokio::test]
async fn settle_refunds_what_the_response_did_not_use_and_charges_an_overrun_as_debt() {
    let clock = ManualClock::default();
    let limiter = Arc::new(CasLimiter::<String, Gcra, _>::with_clock(
        "10/min burst 10".parse().unwrap(),
        clock.clone(),
    ));
    // The handler reports what it used, from the path: /use/3 used 3.
    let app = Router::new().route(
        "/use/{n}",
        get(
            |axum::extract::Path(n): axum::extract::Path<u64>| async move {
                Response::builder()
                    .header("x-used", n.to_string())
                    .body(Body::empty())
                    .unwrap()
            },
        ),
    );
    let estimate = |p: &http::request::Parts| -> u64 {
        p.headers
            .get("x-estimate")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    };
    let used = |r: &Response<Body>| -> Option<u64> {
        r.headers().get("x-used")?.to_str().ok()?.parse().ok()
    };
    let layer = RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-user"))
        .cost(estimate)
        .settle(used);
    let (addr, client) = serve(app.layer(layer)).await;
    let send = |path: &'static str, estimate: &'static str| {
        let client = client.clone();
        async move {
            get_with(
                &client,
                addr,
                path,
                &[("x-user", "u"), ("x-estimate", estimate)],
            )
            .await
            .0
        }
    };
    let left = || limiter.request("u").peek().unwrap().remaining();

    // Estimated 5, used 2: 3 refunded. 10 − 2 = 8 left (a peek of one unit says 7).
    assert_eq!(send("/use/2", "5").await, StatusCode::OK);
    assert_eq!(left(), Some(7));
    // Estimated 5, used 8: 3 more charged. 8 − 8 = 0 left: the next unit is denied.
    assert_eq!(send("/use/8", "5").await, StatusCode::OK);
    assert!(limiter.request("u").peek().unwrap().is_denied());
    assert_eq!(send("/use/1", "1").await, StatusCode::TOO_MANY_REQUESTS);
    // 6 s later one unit is back (10/min); a denied request was charged nothing.
    clock.advance(Duration::from_secs(6));
    assert_eq!(left(), Some(0));
    // Estimated 1, used 4: a debt of 3, paid before the next admission (3 × 6 s).
    assert_eq!(send("/use/4", "1").await, StatusCode::OK);
    clock.advance(Duration::from_secs(18));
    assert!(limiter.request("u").peek().unwrap().is_denied());
    clock.advance(Duration::from_secs(6));
    assert_eq!(left(), Some(0));
    // A response without `x-used` keeps the provisional charge.
    let (status, _, _) = get_with(
        &client,
        addr,
        "/nowhere",
        &[("x-user", "v"), ("x-estimate", "4")],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(limiter.request("v").peek().unwrap().remaining(), Some(5));
    // A count past the debt the key can hold (a broken upstream's u64::MAX) is charged that
    // most, not dropped for the provisional 1: the key stays denied, a year on too.
    let (status, _, _) = get_with(
        &client,
        addr,
        "/use/18446744073709551615",
        &[("x-user", "w"), ("x-estimate", "1")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    clock.advance(Duration::from_secs(365 * 86_400));
    assert!(limiter.request("w").peek().unwrap().is_denied());
    // A client's estimate of 0 is no free pass: taken as 1, settled with what was used (8 of
    // 10), and once the key is spent it is denied like any other request.
    let zero = |path: &'static str| {
        let client = client.clone();
        async move {
            get_with(&client, addr, path, &[("x-user", "z"), ("x-estimate", "0")])
                .await
                .0
        }
    };
    assert_eq!(zero("/use/8").await, StatusCode::OK);
    assert_eq!(limiter.request("z").peek().unwrap().remaining(), Some(1));
    assert_eq!(zero("/use/2").await, StatusCode::OK);
    assert_eq!(zero("/use/0").await, StatusCode::TOO_MANY_REQUESTS);
}

/// A login endpoint that counts failed attempts only: every response but a 401 is refunded in
/// full, so a user who logs in right is never limited, and one who guesses gets 3 a minute.
// Pins G62.
#[tokio::test]
async fn a_login_endpoint_counts_only_401s() {
    let clock = ManualClock::default();
    let limiter = Arc::new(CasLimiter::<String, FixedWindow, _>::with_clock(
        FixedWindow::new(3, Duration::from_secs(60)).unwrap(),
        clock.clone(),
    ));
    let app = Router::new().route(
        "/login",
        get(|headers: HeaderMap| async move {
            let right = headers.get("x-password").is_some_and(|p| p == "right");
            let status = if right {
                StatusCode::OK
            } else {
                StatusCode::UNAUTHORIZED
            };
            Response::builder()
                .status(status)
                .body(Body::empty())
                .unwrap()
        }),
    );
    let layer = RateLimitLayer::builder(limiter.clone(), HeaderKey::from_static("x-user"))
        .settle(|r: &Response<Body>| Some(u64::from(r.status() == StatusCode::UNAUTHORIZED)));
    let (addr, client) = serve(app.layer(layer)).await;
    let login = |password: &'static str| {
        let client = client.clone();
        async move {
            get_with(
                &client,
                addr,
                "/login",
                &[("x-user", "ann"), ("x-password", password)],
            )
            .await
            .0
        }
    };
    // Twenty good logins: none counted.
    for _ in 0..20 {
        assert_eq!(login("right").await, StatusCode::OK);
    }
    // Three wrong passwords are answered 401, the fourth attempt 429: locked out, the right
    // password included, until the window ends.
    for _ in 0..3 {
        assert_eq!(login("wrong").await, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(login("wrong").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(login("right").await, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(Duration::from_secs(60));
    assert_eq!(login("right").await, StatusCode::OK);
    assert_eq!(limiter.request("ann").peek().unwrap().remaining(), Some(2));
}
