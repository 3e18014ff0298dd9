//! A hierarchy through the tower layer (issue #62): a user (header `x-user`) inside an
//! organisation (header `x-org`), each level its own limiter and key, all or nothing. Through
//! `tower::ServiceExt::oneshot`, a random sequence against a model of plain counters, and
//! over real loopback HTTP (an axum server, hyper's client). Manual clocks, no sleeps.
//!
//! Run with `cargo test -p hotlimit-tower --test hierarchy`.

use axum::body::Bytes;
use axum::routing::get;
use axum::Router;
use hotlimit::algo::{FixedWindow, Gcra};
use hotlimit::headers::Mode;
use hotlimit::{CasLimiter, Decision, ManualClock, RateLimiter, Requests};
use hotlimit_tower::{
    HeaderKey, HierarchyLayer, MissingKey, OversizedKey, RateLimitLayer, RequestCost,
    ShadowDecision,
};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

type Limiter<A> = CasLimiter<String, A, ManualClock>;
type App = BoxCloneService<Request<()>, Response<String>, Infallible>;

fn gcra(spec: &str, clock: &ManualClock) -> Arc<Limiter<Gcra>> {
    Arc::new(CasLimiter::with_clock(spec.parse().unwrap(), clock.clone()))
}

fn user() -> HeaderKey {
    HeaderKey::from_static("x-user")
}

fn org() -> HeaderKey {
    HeaderKey::from_static("x-org")
}

/// The cost a request states in `x-cost` (1 without one).
fn stated_cost(parts: &Parts) -> u64 {
    parts
        .headers
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// `layer` around a handler that answers 200 with the request's `ShadowDecision`, if any.
fn service<L, C>(layer: HierarchyLayer<L, HeaderKey, C>) -> App
where
    L: RateLimiter<str> + Requests<str> + 'static,
    C: RequestCost,
{
    BoxCloneService::new(
        layer.layer(tower::service_fn(|req: Request<()>| async move {
            let body = match req.extensions().get::<ShadowDecision>() {
                Some(ShadowDecision(d)) if d.is_denied() => "shadow: denied",
                Some(_) => "shadow: allowed",
                None => "hello",
            };
            Ok::<_, Infallible>(Response::new(body.to_owned()))
        })),
    )
}

/// A request with `headers` through `app`.
async fn send(app: &App, headers: &[(&str, &str)]) -> Response<String> {
    let mut req = Request::builder();
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    app.clone().oneshot(req.body(()).unwrap()).await.unwrap()
}

/// A request from `user` of `org`.
async fn from(app: &App, user: &str, org: &str) -> Response<String> {
    send(app, &[("x-user", user), ("x-org", org)]).await
}

fn header<'a>(r: &'a Response<String>, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

/// Status, `Retry-After`, `RateLimit-Policy`, `RateLimit`: all a response says.
fn seen(r: &Response<String>) -> (StatusCode, Option<&str>, Option<&str>, Option<&str>) {
    (
        r.status(),
        header(r, "retry-after"),
        header(r, "ratelimit-policy"),
        header(r, "ratelimit"),
    )
}

/// What a peek of one unit says now for `key`: `Some(remaining)` if it would be admitted.
fn left<L: Requests<str>>(l: &L, key: &str) -> Option<u64> {
    let d = l.request(key).peek().unwrap();
    d.is_allowed().then(|| d.remaining().unwrap())
}

const USER_POLICY: &str = r#""default";q=2;w=3600;hotlimit-burst=3"#;
const ORG_POLICY: &str = r#""default";q=1;w=3600;hotlimit-burst=5"#;

/// Users of 3 requests (refilling one per 30 min) inside organisations of 5 (one per hour),
/// on a frozen clock: bursts only, so every count is exact.
fn users_in_orgs() -> (Arc<Limiter<Gcra>>, Arc<Limiter<Gcra>>) {
    let clock = ManualClock::default();
    (gcra("2/h burst 3", &clock), gcra("1/h burst 5", &clock))
}

// Pins G78.
#[tokio::test]
async fn each_level_denies_with_its_own_headers_and_a_denial_charges_no_level() {
    let (users, orgs) = users_in_orgs();
    let reports = Arc::new(Mutex::new(Vec::<(String, Decision)>::new()));
    let log = reports.clone();
    let app = service(
        RateLimitLayer::builder(users.clone(), user())
            .headers(|h| h.on_allowed = true)
            .on_decision(move |r| log.lock().unwrap().push((r.key.to_owned(), r.decision)))
            .within([(orgs.clone(), org())]),
    );

    // alice's 3: her own level is the tightest (2, 1, 0 left of 3; acme has 4, 3, 2 of 5).
    for r in (0..3).rev() {
        let res = from(&app, "alice", "acme").await;
        let ratelimit = format!(r#""default";r={r};t=1800"#);
        assert_eq!(
            seen(&res),
            (StatusCode::OK, None, Some(USER_POLICY), Some(&*ratelimit))
        );
        assert_eq!(res.body(), "hello");
    }
    // Her 4th: denied by her level, with her level's headers; acme is not charged.
    let res = from(&app, "alice", "acme").await;
    assert_eq!(
        seen(&res),
        (
            StatusCode::TOO_MANY_REQUESTS,
            Some("1800"),
            Some(USER_POLICY),
            Some(r#""default";r=0;t=1800"#)
        )
    );
    assert_eq!(res.body(), "");
    assert_eq!(
        (left(&users, "alice"), left(&orgs, "acme")),
        (None, Some(1))
    );

    // bob's first: acme (1 left of 5) is now tighter than bob (2 left of 3).
    let res = from(&app, "bob", "acme").await;
    assert_eq!(
        seen(&res),
        (
            StatusCode::OK,
            None,
            Some(ORG_POLICY),
            Some(r#""default";r=1;t=3600"#)
        )
    );
    let res = from(&app, "bob", "acme").await;
    assert_eq!(
        seen(&res),
        (
            StatusCode::OK,
            None,
            Some(ORG_POLICY),
            Some(r#""default";r=0;t=3600"#)
        )
    );
    // bob's third: denied by acme, with acme's headers and wait (an hour, not his 30 min);
    // bob's own level gives its charge back.
    let res = from(&app, "bob", "acme").await;
    assert_eq!(
        seen(&res),
        (
            StatusCode::TOO_MANY_REQUESTS,
            Some("3600"),
            Some(ORG_POLICY),
            Some(r#""default";r=0;t=3600"#)
        )
    );
    assert_eq!((left(&users, "bob"), left(&orgs, "acme")), (Some(0), None));

    // alice again: her level denies first, and her wait covers acme's too (check_all waits
    // for every later level): an hour, not her 30 minutes.
    let res = from(&app, "alice", "acme").await;
    assert_eq!(
        (res.status(), header(&res, "retry-after")),
        (StatusCode::TOO_MANY_REQUESTS, Some("3600"))
    );
    assert_eq!(header(&res, "ratelimit-policy"), Some(USER_POLICY));

    // carol, in another organisation: untouched by acme.
    for r in (0..3).rev() {
        let res = from(&app, "carol", "other").await;
        let ratelimit = format!(r#""default";r={r};t=1800"#);
        assert_eq!(
            seen(&res),
            (StatusCode::OK, None, Some(USER_POLICY), Some(&*ratelimit))
        );
    }
    assert_eq!(
        from(&app, "carol", "other").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // Nothing charged by the denials: each key holds exactly its admissions.
    assert_eq!(left(&users, "alice"), None); // 3 of 3
    assert_eq!(left(&users, "bob"), Some(0)); // 2 of 3: one more would leave 0
    assert_eq!(left(&users, "carol"), None);
    assert_eq!(left(&orgs, "acme"), None); // 5 of 5
    assert_eq!(left(&orgs, "other"), Some(1)); // 3 of 5
    assert_eq!((users.metrics().keys, orgs.metrics().keys), (3, 2));

    // on_decision: the deciding level's key and decision, once per request.
    let reports = reports.lock().unwrap();
    let keys: Vec<_> = reports
        .iter()
        .map(|(k, d)| (k.as_str(), d.is_allowed()))
        .collect();
    assert_eq!(
        keys,
        [
            ("alice", true),
            ("alice", true),
            ("alice", true),
            ("alice", false),
            ("acme", true),
            ("acme", true),
            ("acme", false),
            ("alice", false),
            ("carol", true),
            ("carol", true),
            ("carol", true),
            ("carol", false),
        ]
    );
    assert_eq!(reports[6].1.retry_after(), Duration::from_secs(3600));
    assert_eq!(reports[7].1.retry_after(), Duration::from_secs(3600));
}

#[tokio::test]
async fn a_missing_org_is_refused_or_counted_under_the_fallback() {
    // Reject (the default): 400 without headers, nothing charged on any level.
    let (users, orgs) = users_in_orgs();
    let app =
        service(RateLimitLayer::builder(users.clone(), user()).within([(orgs.clone(), org())]));
    for headers in [
        &[("x-user", "alice")][..],
        &[("x-user", "alice"), ("x-org", "")],
        &[("x-org", "acme")],
    ] {
        let res = send(&app, headers).await;
        assert_eq!(seen(&res), (StatusCode::BAD_REQUEST, None, None, None));
    }
    assert_eq!((users.metrics().keys, orgs.metrics().keys), (0, 0));
    assert_eq!(from(&app, "alice", "acme").await.status(), StatusCode::OK);

    // Fallback: counted under the fallback key on the level that lacks one.
    let (users, orgs) = users_in_orgs();
    let app = service(
        RateLimitLayer::builder(users.clone(), user())
            .missing_key(MissingKey::Fallback("unknown".into()))
            .within([(orgs.clone(), org())]),
    );
    for _ in 0..3 {
        let res = send(&app, &[("x-user", "alice")]).await;
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(left(&orgs, "unknown"), Some(1)); // 3 of 5
    assert_eq!(left(&users, "alice"), None);
    // Keyless users and orgs: both fallbacks, one key per level.
    for _ in 0..2 {
        assert_eq!(send(&app, &[]).await.status(), StatusCode::OK);
    }
    assert_eq!(
        send(&app, &[("x-user", "bob")]).await.status(),
        StatusCode::TOO_MANY_REQUESTS // "unknown" org: 5 of 5
    );
    assert_eq!(left(&users, "unknown"), Some(0)); // 2 of 3
    assert_eq!(left(&users, "bob"), Some(2)); // refunded
    assert_eq!(left(&orgs, "unknown"), None);
}

#[tokio::test]
async fn oversized_keys_are_hashed_or_refused_on_every_level() {
    let long_a = "acme-corporation-emea";
    let long_b = "acme-corporation-apac"; // the same first 8 bytes

    let (users, orgs) = users_in_orgs();
    let app = service(
        RateLimitLayer::builder(users.clone(), user())
            .max_key_len(8)
            .oversized_key(OversizedKey::Reject)
            .within([(orgs.clone(), org())]),
    );
    let res = from(&app, "alice", long_a).await;
    assert_eq!(seen(&res), (StatusCode::BAD_REQUEST, None, None, None));
    let res = from(&app, "a-very-long-user", "acme").await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!((users.metrics().keys, orgs.metrics().keys), (0, 0));

    // Hash (the default): long keys stay distinct, and each stays one key.
    let (users, orgs) = users_in_orgs();
    let app = service(
        RateLimitLayer::builder(users.clone(), user())
            .max_key_len(8)
            .within([(orgs.clone(), org())]),
    );
    for u in ["u1", "u1", "u2", "u2", "u3"] {
        assert_eq!(from(&app, u, long_a).await.status(), StatusCode::OK);
    }
    assert_eq!(
        from(&app, "u3", long_a).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(from(&app, "u4", long_b).await.status(), StatusCode::OK);
    assert_eq!(orgs.metrics().keys, 2);
    assert_eq!(left(&orgs, long_a), Some(4)); // not stored under the long key itself
    assert_eq!(users.metrics().keys, 4);
}

#[tokio::test]
async fn cost_free_and_over_a_levels_capacity() {
    // A user may spend 10 at once, their organisation only 5: a cost of 6 could never pass
    // the organisation, so 413 with its policy, whichever level is asked first.
    let clock = ManualClock::default();
    let (users, orgs) = (gcra("1/h burst 10", &clock), gcra("1/h burst 5", &clock));
    let app = service(
        RateLimitLayer::builder(users.clone(), user())
            .cost(stated_cost)
            .within([(orgs.clone(), org())]),
    );
    let with_cost = |cost: &'static str| {
        let app = app.clone();
        async move {
            send(
                &app,
                &[("x-user", "alice"), ("x-org", "acme"), ("x-cost", cost)],
            )
            .await
        }
    };
    let res = with_cost("6").await;
    assert_eq!(
        seen(&res),
        (StatusCode::PAYLOAD_TOO_LARGE, None, Some(ORG_POLICY), None)
    );
    let res = with_cost("11").await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some(r#""default";q=1;w=3600;hotlimit-burst=10"#) // the user's: the first over
    );
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Free: through, uncounted, no headers (a keyless free request too).
    let res = with_cost("0").await;
    assert_eq!(seen(&res), (StatusCode::OK, None, None, None));
    let res = send(&app, &[("x-cost", "0")]).await;
    assert_eq!(res.status(), StatusCode::OK);
    // Nothing kept: the user's charge for the cost of 6 was given back.
    assert_eq!((left(&users, "alice"), orgs.metrics().keys), (Some(9), 0));
    // A cost of 5 spends acme at once; the next unit is the organisation's to deny.
    assert_eq!(with_cost("5").await.status(), StatusCode::OK);
    let res = with_cost("1").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "ratelimit-policy"), Some(ORG_POLICY));
    assert_eq!(left(&users, "alice"), Some(4)); // 5 of 10
}

#[tokio::test]
async fn dry_run_reports_and_shadow_tells_the_handler_charging_what_was_admitted() {
    for mode in [Mode::DryRun, Mode::Shadow] {
        let (users, orgs) = users_in_orgs();
        let app = service(
            RateLimitLayer::builder(users.clone(), user())
                .headers(|h| h.mode = mode)
                .within([(orgs.clone(), org())]),
        );
        for _ in 0..3 {
            let res = from(&app, "alice", "acme").await;
            assert_eq!(res.status(), StatusCode::OK);
        }
        let res = from(&app, "alice", "acme").await;
        assert_eq!(res.status(), StatusCode::OK);
        match mode {
            // A dry run's every response carries the fields: here, the would-be denial's.
            Mode::DryRun => {
                assert_eq!(res.body(), "hello");
                assert_eq!(
                    seen(&res),
                    (
                        StatusCode::OK,
                        None,
                        Some(USER_POLICY),
                        Some(r#""default";r=0;t=1800"#)
                    )
                );
            }
            _ => assert_eq!(res.body(), "shadow: denied"),
        }
        // A missing org goes through uncounted in these modes.
        let res = send(&app, &[("x-user", "bob")]).await;
        assert_eq!(
            (res.status(), res.body().as_str()),
            (StatusCode::OK, "hello")
        );
        assert_eq!(
            (left(&users, "alice"), left(&orgs, "acme")),
            (None, Some(1))
        );
        assert_eq!((users.metrics().keys, orgs.metrics().keys), (1, 1));
    }
}

/// A random sequence of requests against a model of plain counters, status by status: users
/// of 6 per minute inside organisations of 10 per minute (fixed windows: a count per level,
/// reset when the window turns), costs of 0 to 3 and now and then 7 (above a user's
/// capacity), some requests without `x-org`, the clock moved now and then.
// Pins G78.
#[tokio::test]
async fn a_random_sequence_matches_a_model_of_counters() {
    const USER: u64 = 6;
    const ORG: u64 = 10;
    const WINDOW: u64 = 60;
    let clock = ManualClock::default();
    let window = |limit| {
        let w = FixedWindow::new(limit, Duration::from_secs(WINDOW)).unwrap();
        Arc::new(CasLimiter::<String, _, _>::with_clock(w, clock.clone()))
    };
    let (users, orgs) = (window(USER), window(ORG));
    let app = service(
        RateLimitLayer::builder(users.clone(), user())
            .cost(stated_cost)
            .headers(|h| h.on_allowed = true)
            .within([(orgs.clone(), org())]),
    );
    let user_policy = r#""default";q=6;w=60"#;
    let org_policy = r#""default";q=10;w=60"#;

    let mut rng = rand::rngs::StdRng::seed_from_u64(62);
    // The model: the window's index, and each key's count in it.
    let (mut now, mut index) = (0u64, 0u64);
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut tally: HashMap<StatusCode, u32> = HashMap::new();
    let mut denied_by = [0u32; 2];
    for step in 0..500 {
        if rng.random_ratio(1, 12) {
            let by = rng.random_range(1..=40);
            clock.advance(Duration::from_secs(by));
            now += by;
            if now / WINDOW != index {
                (index, counts) = (now / WINDOW, HashMap::new());
            }
        }
        let u = rng.random_range(0..8u32);
        let (user_key, org_key) = (format!("u{u}"), format!("o{}", u % 3));
        let cost = match rng.random_range(0..40) {
            0 => 0,
            1 => 7,
            _ => rng.random_range(1..=3u64),
        };
        let has_org = !rng.random_ratio(1, 20);
        let cost_text = cost.to_string();
        let mut headers = vec![("x-user", user_key.as_str()), ("x-cost", &cost_text)];
        if has_org {
            headers.push(("x-org", &org_key));
        }
        let res = send(&app, &headers).await;

        let user_used = counts.get(&user_key).copied().unwrap_or(0);
        let org_used = counts.get(&org_key).copied().unwrap_or(0);
        let to_window_end = (index + 1) * WINDOW - now;
        let ctx = format!("step {step}: {user_key}/{org_key} cost {cost} has_org {has_org}");
        let (status, policy) = if cost == 0 {
            (StatusCode::OK, None)
        } else if !has_org {
            (StatusCode::BAD_REQUEST, None)
        } else if cost > USER {
            (StatusCode::PAYLOAD_TOO_LARGE, Some(user_policy))
        } else if user_used + cost > USER {
            denied_by[0] += 1;
            (StatusCode::TOO_MANY_REQUESTS, Some(user_policy))
        } else if org_used + cost > ORG {
            denied_by[1] += 1;
            (StatusCode::TOO_MANY_REQUESTS, Some(org_policy))
        } else {
            *counts.entry(user_key.clone()).or_default() += cost;
            *counts.entry(org_key.clone()).or_default() += cost;
            let (user_left, org_left) = (USER - user_used - cost, ORG - org_used - cost);
            // The tightest level; the first on a tie.
            let (policy, r) = if user_left <= org_left {
                (user_policy, user_left)
            } else {
                (org_policy, org_left)
            };
            let ratelimit = format!(r#""default";r={r};t={to_window_end}"#);
            assert_eq!(header(&res, "ratelimit").unwrap(), ratelimit, "{ctx}");
            (StatusCode::OK, Some(policy))
        };
        assert_eq!(res.status(), status, "{ctx}");
        assert_eq!(header(&res, "ratelimit-policy"), policy, "{ctx}");
        let retry = (status == StatusCode::TOO_MANY_REQUESTS).then(|| to_window_end.to_string());
        assert_eq!(header(&res, "retry-after"), retry.as_deref(), "{ctx}");
        *tally.entry(status).or_default() += 1;
    }
    // The sequence reached every branch of the model.
    for status in [200, 400, 413, 429] {
        let n = tally[&StatusCode::from_u16(status).unwrap()];
        assert!(n >= 5, "{status}: {n} in {tally:?}");
    }
    assert!(denied_by.iter().all(|&n| n >= 20), "{denied_by:?}");
    // And the limiters hold exactly the model's counts in the current window.
    for (key, &count) in &counts {
        let (l, limit) = match key.starts_with('u') {
            true => (&users, USER),
            false => (&orgs, ORG),
        };
        let peek = l.request(key.as_str()).peek().unwrap();
        let expected = limit.checked_sub(count + 1);
        assert_eq!(peek.is_allowed(), expected.is_some(), "{key}");
        if let Some(r) = expected {
            assert_eq!(peek.remaining(), Some(r), "{key}");
        }
    }
}

// Pins G78.
#[tokio::test]
async fn over_loopback_http() {
    let (users, orgs) = users_in_orgs();
    let layer = RateLimitLayer::builder(users.clone(), user()).within([(orgs.clone(), org())]);
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let get = |user: &str, org: &str| {
        let mut req = Request::get(format!("http://{addr}/")).header("x-user", user);
        if !org.is_empty() {
            req = req.header("x-org", org);
        }
        let req = req.body(Empty::new()).unwrap();
        let client = client.clone();
        async move {
            let res = client.request(req).await.unwrap();
            let (parts, body) = res.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let h = |name: &str| {
                parts
                    .headers
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_owned())
            };
            (
                parts.status,
                h("retry-after"),
                h("ratelimit-policy"),
                String::from_utf8(body.to_vec()).unwrap(),
            )
        }
    };
    let ok = (StatusCode::OK, None, None, String::from("hello"));
    for _ in 0..3 {
        assert_eq!(get("alice", "acme").await, ok);
    }
    let denied = |retry: &str, policy: &str| {
        (
            StatusCode::TOO_MANY_REQUESTS,
            Some(retry.to_owned()),
            Some(policy.to_owned()),
            String::new(),
        )
    };
    assert_eq!(get("alice", "acme").await, denied("1800", USER_POLICY));
    assert_eq!(get("bob", "acme").await, ok);
    assert_eq!(get("bob", "acme").await, ok);
    assert_eq!(get("bob", "acme").await, denied("3600", ORG_POLICY));
    assert_eq!(get("carol", "other").await, ok);
    assert_eq!(
        get("dave", "").await,
        (StatusCode::BAD_REQUEST, None, None, String::new())
    );
    assert_eq!((left(&users, "bob"), left(&orgs, "acme")), (Some(0), None));
    assert_eq!(
        (left(&users, "carol"), left(&orgs, "other")),
        (Some(1), Some(3))
    );
}

/// Levels keyed differently (a header inside a tenant from the path), one extractor type:
/// boxed closures, as `LayerBuilder::within`'s docs suggest.
#[tokio::test]
async fn boxed_closures_mix_extractors() {
    type Extract = Box<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
    let by_header: Extract = Box::new(|p| Some(p.headers.get("x-user")?.to_str().ok()?.into()));
    let by_path: Extract = Box::new(|p| p.uri.path().split('/').nth(1).map(str::to_owned));
    let (users, tenants) = users_in_orgs();
    let layer =
        RateLimitLayer::builder(users.clone(), by_header).within([(tenants.clone(), by_path)]);
    let app = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let send = |user: &str, path: &str| {
        let req = Request::get(path).header("x-user", user).body(()).unwrap();
        app.clone().oneshot(req)
    };
    for user in ["a", "a", "a", "b", "b"] {
        assert_eq!(
            send(user, "/acme/x").await.unwrap().status(),
            StatusCode::OK
        );
    }
    let denied = send("b", "/acme/y").await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "ratelimit-policy"), Some(ORG_POLICY));
    // b's charge for the denial was given back: a third request of b's still passes.
    assert_eq!(send("b", "/other").await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        (left(&users, "b"), left(&tenants, "other")),
        (None, Some(3))
    );
}
