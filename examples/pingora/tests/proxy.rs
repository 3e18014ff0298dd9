//! The proxy binary on loopback, between a real client (hyper-util) and a small upstream
//! (hyper): exact allowed / denied counts and header values in each mode, and two proxies
//! sharing one limit through a `redis-server` of the test's own.
//!
//! Every test limits to `1/h` (the fleet test with a burst of 6, the others 5): nothing
//! refills while a test runs, so the counts and values do not depend on timing.

use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const POLICY: &str = r#""default";q=1;w=3600;hotlimit-burst=5"#;

/// What the upstream saw of each request: its `hotlimit-shadow` and `x-forwarded-for`
/// headers.
type Seen = Arc<Mutex<Vec<(Option<String>, Option<String>)>>>;

/// A tiny upstream on loopback: answers `200 upstream` to everything and records the
/// requests it got.
async fn upstream() -> (SocketAddr, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Seen::default();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let log = log.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let header = |name| {
                    req.headers()
                        .get(name)
                        .map(|v: &hyper::header::HeaderValue| v.to_str().unwrap().to_owned())
                };
                log.lock()
                    .unwrap()
                    .push((header("hotlimit-shadow"), header("x-forwarded-for")));
                // The settle tests' paths: `/used/N` reports N units used (`x-used`),
                // `/login-fail` answers 401.
                let mut resp = Response::new("upstream".to_owned());
                let path = req.uri().path();
                if let Some(n) = path.strip_prefix("/used/") {
                    resp.headers_mut().insert("x-used", n.parse().unwrap());
                } else if path == "/login-fail" {
                    *resp.status_mut() = StatusCode::UNAUTHORIZED;
                }
                async { Ok::<_, Infallible>(resp) }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// The proxy, a child process; killed when dropped.
struct Proxy {
    child: Child,
    addr: SocketAddr,
}

/// Reads all of `from` on a thread (so the child never blocks on a full pipe).
fn drain(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut out = String::new();
        let _ = from.read_to_string(&mut out);
        out
    })
}

impl Proxy {
    /// Starts the proxy in front of `upstream` on a free port, limiting to `1/h` with a burst
    /// of 5, with `args`, and waits for its `listening on <addr>` line.
    fn start(upstream: SocketAddr, args: &[&str]) -> Proxy {
        Self::start_with(
            upstream,
            &[&["--rate", "1/h", "--burst", "5"], args].concat(),
        )
    }

    /// The same with `args` alone (the rate and burst among them).
    fn start_with(upstream: SocketAddr, args: &[&str]) -> Proxy {
        let child = Command::new(env!("CARGO_BIN_EXE_hotlimit-pingora"))
            .args(["--listen", "127.0.0.1:0", "--threads", "1", "--upstream"])
            .arg(upstream.to_string())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the proxy");
        // The guard first: a failure below still kills the child.
        let mut proxy = Proxy {
            child,
            addr: ([0, 0, 0, 0], 0).into(),
        };
        // Its stderr (would-be denials in dry-run and shadow mode) is only shown on failure.
        let stderr = drain(proxy.child.stderr.take().unwrap());
        let mut stdout = BufReader::new(proxy.child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        match line.trim_end().strip_prefix("listening on ") {
            Some(addr) => proxy.addr = addr.parse().unwrap(),
            None => {
                let status = proxy.child.wait();
                panic!(
                    "the proxy said {line:?} instead of `listening on <addr>` and exited with \
                     {status:?}; its stderr:\n{}",
                    stderr.join().unwrap()
                );
            }
        }
        drain(stdout);
        proxy
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response, read whole.
struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// The rate-limit fields, as `name: value` lines in order.
    fn fields(&self) -> Vec<String> {
        let names = [
            "retry-after",
            "ratelimit-policy",
            "ratelimit",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ];
        self.headers
            .iter()
            .filter(|(n, _)| names.contains(&n.as_str()))
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect()
    }
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// `GET /` through the proxy, with `headers`.
async fn get(client: &HttpClient, proxy: &Proxy, headers: &[(&str, &str)]) -> Got {
    get_path(client, proxy, "/", headers).await
}

/// `GET path` through the proxy, with `headers`.
async fn get_path(client: &HttpClient, proxy: &Proxy, path: &str, headers: &[(&str, &str)]) -> Got {
    let mut req = Request::get(format!("http://{}{path}", proxy.addr));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// `n` requests through the proxy, with `headers`.
async fn get_n(client: &HttpClient, proxy: &Proxy, n: usize, headers: &[(&str, &str)]) -> Vec<Got> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(get(client, proxy, headers).await);
    }
    out
}

fn ratelimit(remaining: u64) -> String {
    format!("ratelimit: \"default\";r={remaining};t=3600")
}

// Pins G57.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforce_answers_429_itself_with_the_headers() {
    let (up, seen) = upstream().await;
    let proxy = Proxy::start(up, &[]);
    let client = client();
    let got = get_n(&client, &proxy, 8, &[]).await;

    for (i, g) in got[..5].iter().enumerate() {
        assert_eq!(g.status, StatusCode::OK, "request {}", i + 1);
        assert_eq!(g.body, "upstream");
        let remaining = 4 - i as u64;
        assert_eq!(
            g.fields(),
            [format!("ratelimit-policy: {POLICY}"), ratelimit(remaining)]
        );
    }
    for g in &got[5..] {
        assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(g.body, "");
        // The whole emission interval: a retry after 3600 s finds one request.
        assert_eq!(
            g.fields(),
            [
                "retry-after: 3600".to_owned(),
                format!("ratelimit-policy: {POLICY}"),
                ratelimit(0),
            ]
        );
    }
    let denied = got.iter().filter(|g| g.status == 429).count();
    println!("enforce: {} allowed, {denied} denied", got.len() - denied);
    // The denied requests never reached the upstream.
    assert_eq!(seen.lock().unwrap().len(), 5);
}

// Pins G60.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_clients_have_their_own_budgets() {
    let (up, seen) = upstream().await;
    let proxy = Proxy::start(up, &["--key", "forwarded:1"]);
    let client = client();
    let alice = [("x-forwarded-for", "198.51.100.1")];
    // Bob claims to be Alice; behind one trusted proxy only the right-most entry counts.
    let bob = [("x-forwarded-for", "198.51.100.1, 198.51.100.2")];

    let got = get_n(&client, &proxy, 6, &alice).await;
    let statuses: Vec<u16> = got.iter().map(|g| g.status.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let got = get_n(&client, &proxy, 6, &bob).await;
    let statuses: Vec<u16> = got.iter().map(|g| g.status.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    assert_eq!(got[0].header("ratelimit"), Some(r#""default";r=4;t=3600"#));
    println!("forwarded: alice 5 allowed 1 denied, bob 5 allowed 1 denied");

    // No client address: 400, as the tower layer's MissingKey::Reject, without the fields.
    let g = get(&client, &proxy, &[]).await;
    assert_eq!(g.status, StatusCode::BAD_REQUEST);
    assert!(g.fields().is_empty(), "{:?}", g.fields());
    // The upstream learns each client's chain with this hop's peer appended.
    let forwarded: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, f)| f.clone())
        .collect();
    assert_eq!(forwarded.len(), 10);
    assert_eq!(forwarded[0].as_deref(), Some("198.51.100.1, 127.0.0.1"));
    assert_eq!(
        forwarded[9].as_deref(),
        Some("198.51.100.1, 198.51.100.2, 127.0.0.1")
    );
}

// Pins G59.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_never_denies_and_reports_on_the_upstreams_responses() {
    let (up, seen) = upstream().await;
    let proxy = Proxy::start(up, &["--mode", "dry-run"]);
    let client = client();
    let mut got = get_n(&client, &proxy, 7, &[]).await;
    // A client's own `hotlimit-shadow` never reaches the upstream outside shadow mode.
    got.push(get(&client, &proxy, &[("hotlimit-shadow", "allowed")]).await);

    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.status, StatusCode::OK, "request {}", i + 1);
        assert_eq!(g.body, "upstream");
        // Requests 6 to 8 would have been denied: r=0, but no Retry-After (not a 429).
        let remaining = 4u64.saturating_sub(i as u64);
        assert_eq!(
            g.fields(),
            [format!("ratelimit-policy: {POLICY}"), ratelimit(remaining)]
        );
    }
    println!(
        "dry-run: {} reached the upstream",
        seen.lock().unwrap().len()
    );
    assert_eq!(seen.lock().unwrap().len(), 8);
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .all(|(shadow, _)| shadow.is_none()));
}

// Pins G59.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_tells_the_upstream_and_hides_denials_from_the_client() {
    let (up, seen) = upstream().await;
    let proxy = Proxy::start(up, &["--mode", "shadow"]);
    let client = client();
    let mut got = get_n(&client, &proxy, 7, &[]).await;
    // A client cannot pass itself off as allowed: the proxy's value replaces its own.
    got.push(get(&client, &proxy, &[("hotlimit-shadow", "allowed")]).await);

    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.status, StatusCode::OK, "request {}", i + 1);
        assert_eq!(g.body, "upstream");
    }
    for (i, g) in got[..5].iter().enumerate() {
        let remaining = 4 - i as u64;
        assert_eq!(
            g.fields(),
            [format!("ratelimit-policy: {POLICY}"), ratelimit(remaining)]
        );
    }
    for g in &got[5..] {
        assert!(g.fields().is_empty(), "{:?}", g.fields());
    }
    let seen = seen.lock().unwrap().clone();
    let seen: Vec<_> = seen.iter().map(|(s, _)| s.as_deref()).collect();
    println!("shadow: the upstream saw {seen:?}");
    assert_eq!(seen[..5], [Some("allowed"); 5]);
    assert_eq!(seen[5..], [Some("denied"); 3]);
}

// Pins G57.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_fields_and_an_older_draft() {
    let (up, _) = upstream().await;
    let proxy = Proxy::start(up, &["--legacy-headers", "--draft", "draft-07"]);
    let client = client();
    let got = get_n(&client, &proxy, 6, &[]).await;
    assert_eq!(got[0].status, StatusCode::OK);
    assert_eq!(
        got[0].fields(),
        [
            "ratelimit-policy: 1;w=3600;burst=5",
            "ratelimit: limit=1, remaining=4, reset=3600",
            "x-ratelimit-limit: 1",
            "x-ratelimit-remaining: 4",
            "x-ratelimit-reset: 3600",
        ]
    );
    assert_eq!(got[5].status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        got[5].fields(),
        [
            "retry-after: 3600",
            "ratelimit-policy: 1;w=3600;burst=5",
            // A denial's reset is its wait in every draft (Retry-After is never earlier);
            // the legacy reset stays the time until the quota is whole again.
            "ratelimit: limit=1, remaining=0, reset=3600",
            "x-ratelimit-limit: 1",
            "x-ratelimit-remaining: 0",
            "x-ratelimit-reset: 18000",
        ]
    );
}

/// A `redis-server` of the test's own on a free loopback port (no persistence), killed on
/// drop: the part of the main crate's `tests/redis_server/mod.rs` this test needs.
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts `redis-server`; `None` if it is not on the PATH: the test prints why and
    /// passes, unless `HOTLIMIT_REQUIRE_REDIS=1` (as the main crate's CI sets), which makes
    /// that a failure.
    fn start() -> Option<RedisServer> {
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok();
        if !installed {
            let msg = "redis-server not found on PATH: skipping the fleet test \
                       (install it: apt-get install redis-server)";
            assert!(
                std::env::var("HOTLIMIT_REQUIRE_REDIS").as_deref() != Ok("1"),
                "{msg}, but HOTLIMIT_REQUIRE_REDIS=1"
            );
            eprintln!("SKIPPED: {msg}");
            return None;
        }
        // Redis has no `--port 0`: take a free port from the OS, release it, hand it over.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let mut server = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("redis-server exited with {status} (port {port} taken?)");
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Redis key of the loopback client's shared GCRA state: the proxy's prefix `pingora:`,
/// the key (the client's address) in braces.
const FLEET_KEY: &str = "pingora:{127.0.0.1}";

/// The units of the client's quota charged in Redis, fleet-wide: admitted by a fallback,
/// or leased (spent or held). The key holds the GCRA TAT in µs of Redis' time, one emission
/// interval (1 h) ahead of the first charge for each unit; the test lasts far less than half
/// an hour, so rounding the distance from Redis' `now` counts them exactly. Read before
/// `TIME`, so `now` is never earlier than the value's first charge.
fn units_charged(redis: &mut redis::Connection) -> u64 {
    let tat: Option<f64> = redis::cmd("GET").arg(FLEET_KEY).query(redis).unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(redis).unwrap();
    let now = secs as f64 * 1e6 + micros as f64;
    tat.map_or(0, |tat| ((tat - now) / 3.6e9).round().max(0.0) as u64)
}

/// Polls Redis until exactly `units` are charged (the proxies sync every 10 ms).
async fn wait_for_units(redis: &mut redis::Connection, units: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = units_charged(redis);
        if now == units {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{now} units charged in Redis, not {units}, after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// Pins G46.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_share_one_limit_through_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let (up, seen) = upstream().await;
    // Both proxies in front of the same upstream, sharing the client's 6 units through the
    // same Redis. 0.5 is the share the docs advise for two proxies; every step below makes
    // each fallback decide one request only, so the count holds for any share.
    let fleet = [
        "--redis",
        &url,
        "--rate",
        "1/h",
        "--burst",
        "6",
        "--fallback-share",
        "0.5",
    ];
    let a = Proxy::start_with(up, &fleet);
    let b = Proxy::start_with(up, &fleet);
    let client = client();
    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let policy = r#""default";q=1;w=3600;hotlimit-burst=6"#;

    // Why the total is exactly the burst, 6, whatever the timing of the syncs:
    //
    // - A proxy's first request for a key finds no lease: its fallback admits it (always:
    //   a fresh key), owes the unit, and the next sync charges it to Redis. After that sync
    //   the key is synced, and with Redis up the fallback never decides for it again (nor
    //   is the key swept: its fallback state stays spent for hours at 1/h).
    // - So the test sends each proxy its first request alone and waits, reading Redis, until
    //   that unit is charged and the lease granted with it handed back (quiet key): 1 unit
    //   in Redis after A's, 2 after B's. No lease was spent meanwhile, and neither proxy
    //   holds one: both fallback admissions are charged before any other admission. (The
    //   wait matters: were B's first request to come after A had spent the burst, B's
    //   fallback would admit it all the same, and the fleet 7.)
    // - From then on every admission spends a leased unit, and Redis leases a unit only
    //   while the charged units stay within the burst (1/h: nothing refills during the
    //   test). Charged = admitted + held ≤ 6, so the fleet admits at most 6; requests sent
    //   until 6 are admitted reach it, and every later one is denied.
    let got = get(&client, &a, &[]).await;
    assert_eq!(
        got.status,
        StatusCode::OK,
        "A's first request (its fallback)"
    );
    assert_eq!(got.header("ratelimit-policy"), Some(policy));
    wait_for_units(&mut redis, 1).await;
    let got = get(&client, &b, &[]).await;
    assert_eq!(
        got.status,
        StatusCode::OK,
        "B's first request (its fallback)"
    );
    wait_for_units(&mut redis, 2).await;

    // Rounds of one request through each, a pause between, so the syncs lease what the
    // denials asked for; until the fleet has admitted 6.
    let (mut by_a, mut by_b) = (1, 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while by_a + by_b < 6 {
        assert!(
            Instant::now() < deadline,
            "only {} admitted after 30 s (A {by_a}, B {by_b})",
            by_a + by_b
        );
        by_a += usize::from(get(&client, &a, &[]).await.status == StatusCode::OK);
        by_b += usize::from(get(&client, &b, &[]).await.status == StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(by_a + by_b, 6, "A {by_a}, B {by_b}");
    // Every unit charged was admitted: no proxy holds a lease.
    assert_eq!(units_charged(&mut redis), 6);

    // More rounds, the syncs between them: the fleet's quota is spent, for both.
    for round in 0..10 {
        for (name, proxy) in [("A", &a), ("B", &b)] {
            let got = get(&client, proxy, &[]).await;
            assert_eq!(
                got.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{name}, round {round} after the 6th admission"
            );
            assert_eq!(got.header("ratelimit-policy"), Some(policy));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(units_charged(&mut redis), 6);
    println!("fleet: 6 admitted in all (A {by_a}, B {by_b}), then 20 denied");
    // The denied requests never reached the upstream.
    assert_eq!(seen.lock().unwrap().len(), 6);
}

/// Settle at response time: the provisional cost from `x-estimate`, settled with the upstream's
/// `x-used`: fewer units refunded, more charged as a debt (clients told apart by
/// X-Forwarded-For).
// Pins G62.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_refunds_unused_units_and_charges_an_overrun_as_debt() {
    let (up, _) = upstream().await;
    let args = [
        "--rate",
        "1/h",
        "--burst",
        "10",
        "--key",
        "forwarded:1",
        "--cost-header",
        "x-estimate",
        "--settle-header",
        "x-used",
    ];
    let proxy = Proxy::start_with(up, &args);
    let client = client();
    let send = |path: &'static str, client_ip: &'static str, estimate: &'static str| {
        let (client, proxy) = (&client, &proxy);
        async move {
            get_path(
                client,
                proxy,
                path,
                &[("x-forwarded-for", client_ip), ("x-estimate", estimate)],
            )
            .await
        }
    };
    // Estimated 5 of 10, used 2: the response says 5 left (as taken), 3 come back.
    let g = send("/used/2", "10.0.0.1", "5").await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(g.header("ratelimit"), Some("\"default\";r=5;t=3600"));
    // So 8 can be taken now (without the refund, 5 left: a 429).
    let g = send("/used/8", "10.0.0.1", "8").await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(g.header("ratelimit"), Some("\"default\";r=0;t=3600"));
    assert_eq!(
        send("/used/1", "10.0.0.1", "1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Estimated 5, used 15: 10 more charged, 5 past the burst, a debt. Without it, 5 would
    // be left for the next request.
    assert_eq!(
        send("/used/15", "10.0.0.2", "5").await.status,
        StatusCode::OK
    );
    let g = send("/used/1", "10.0.0.2", "1").await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    // The debt's wait: 6 units short (5 owed and this one) at 1/h.
    assert_eq!(g.header("retry-after"), Some("21600"));

    // Used u64::MAX, past any debt the key can hold: charged that most, not dropped for the
    // provisional 1 (which would leave 9 for the next request).
    let g = send("/used/18446744073709551615", "10.0.0.3", "1").await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(
        send("/used/1", "10.0.0.3", "1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A login endpoint behind the proxy counting only 401s (`--count-status 401`): good logins are
/// refunded in full; the fourth failure in the burst of 3 is a 429, for good logins too.
// Pins G62.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_endpoint_counts_only_failed_attempts() {
    let (up, _) = upstream().await;
    let proxy = Proxy::start_with(
        up,
        &["--rate", "1/h", "--burst", "3", "--count-status", "401"],
    );
    let client = client();
    for i in 0..10 {
        let g = get_path(&client, &proxy, "/login-ok", &[]).await;
        assert_eq!(g.status, StatusCode::OK, "good login {i}");
    }
    for i in 0..3 {
        let g = get_path(&client, &proxy, "/login-fail", &[]).await;
        assert_eq!(g.status, StatusCode::UNAUTHORIZED, "failed login {i}");
    }
    let g = get_path(&client, &proxy, "/login-fail", &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    let g = get_path(&client, &proxy, "/login-ok", &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
}
