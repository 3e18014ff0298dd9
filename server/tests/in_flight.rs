//! In-flight limits over the JSON API (issue #62): a rule of `algorithm: in_flight` holds a
//! permit per take until its ticket is settled (with 0: nothing still held), and a permit never
//! given back expires within its `lease`. In memory on a manual clock (exact, no waiting) and
//! on a real `redis-server` behind a real server process (a crashed client's permits expire
//! with their key); refused on the fleet backend and with options it does not take.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hotlimit::ManualClock;
use hotlimit_server::engine::Backend;
use hotlimit_server::service::{Service, Settings, StartError};
use serde_json::json;

use common::{post, runtime, server, InProcess, Scratch};

const RULES: &str = r#"
domain: gen
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: in_flight, lease: 60s}
"#;

/// A take of one permit for `api_key=key`: the status and the ticket, if any. No answer
/// carries `RateLimit` header fields: they describe rates, not requests running.
fn take(port: u16, key: &str) -> (u16, Option<String>) {
    let body = json!({
        "domain": "gen",
        "descriptors": [{"entries": [{"key": "api_key", "value": key}]}],
    });
    let (status, answer) = post(port, "/v1/take", &body.to_string());
    let ticket = answer["ticket"].as_str().map(str::to_owned);
    assert_eq!(ticket.is_some(), status == 200, "{answer}");
    assert!(answer.get("responseHeadersToAdd").is_none(), "{answer}");
    (status, ticket)
}

/// Gives a take's permits back: a settle with nothing still held.
fn release(port: u16, ticket: &str) -> (u16, serde_json::Value) {
    let body = json!({ "ticket": ticket, "actual": 0 }).to_string();
    post(port, "/v1/settle", &body)
}

fn start(settings: Settings) -> Result<Service, StartError> {
    runtime().block_on(Service::from_sources(
        &[(PathBuf::from("gen.yaml"), RULES.to_owned())],
        settings,
    ))
}

// Pins G76.
#[test]
fn permits_are_taken_and_released_over_the_json_api_and_expire_by_their_lease() {
    let clock = ManualClock::default();
    let service = start(Settings {
        backend: Backend::Memory {
            max_keys: 1_000,
            clock: Some(clock.clone()),
        },
        ..Settings::memory()
    })
    .unwrap();
    let api = InProcess::serve(Arc::new(service));
    let (s1, first) = take(api.port, "alice");
    let (s2, second) = take(api.port, "alice");
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(take(api.port, "alice").0, 429); // two running
    assert_eq!(take(api.port, "bob").0, 200); // its own permits
    let first = first.unwrap();
    assert_eq!(release(api.port, &first), (200, json!({"settled": true})));
    assert_eq!(release(api.port, &first).0, 404); // once
    let (s3, _third) = take(api.port, "alice");
    assert_eq!(s3, 200);
    assert_eq!(take(api.port, "alice").0, 429);
    // Two permits never given back (a client that crashed): a lease later they are free.
    clock.advance(Duration::from_secs(60));
    let (s4, _) = take(api.port, "alice");
    let (s5, _) = take(api.port, "alice");
    assert_eq!((s4, s5), (200, 200));
    assert_eq!(take(api.port, "alice").0, 429);
    // The expired permit's late release frees nothing newer.
    assert_eq!(release(api.port, &second.unwrap()).0, 200);
    assert_eq!(take(api.port, "alice").0, 429);
}

// Pins G76.
#[test]
fn permits_on_redis_are_leases_that_expire_with_their_key() {
    let Some(redis) = common::redis() else {
        return;
    };
    let dir = Scratch::new("in-flight");
    let config = dir.write("gen.yaml", RULES);
    let url = redis.url();
    let srv = server(&config, &["--backend", "redis", "--redis-url", &url]);
    let port = srv.http;
    let (s1, first) = take(port, "alice");
    let (s2, _second) = take(port, "alice");
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(take(port, "alice").0, 429);
    assert_eq!(release(port, &first.unwrap()).0, 200);
    assert_eq!(take(port, "alice").0, 200);
    // The key holding the permits expires within the lease on Redis' own clock: a client that
    // never releases holds nothing for longer.
    let keys = command(redis.port, "KEYS *api_key=alice}"); // not the settle marks
    let lines: Vec<&str> = keys.lines().collect();
    assert_eq!(lines.first(), Some(&"*1"), "{keys}");
    let pttl: i64 = command(redis.port, &format!("PTTL {}", lines[2]))
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap();
    assert!(pttl > 0 && pttl <= 60_000, "the key's expiry: {pttl} ms");
}

/// Where it cannot run or is misconfigured, the rule is refused with a reason.
#[test]
fn an_in_flight_rule_is_refused_where_it_cannot_run() {
    let refused = |rules: String, settings: Settings| {
        let started = runtime().block_on(Service::from_sources(
            &[(PathBuf::from("gen.yaml"), rules)],
            settings,
        ));
        started.err().expect("refused").to_string()
    };
    let short = RULES.replace("lease: 60s", "lease: 5s");
    let e = refused(short, Settings::memory());
    assert!(e.contains("lease") && e.contains("10s"), "{e}");
    let policy = RULES.replace("lease: 60s", "lease: 60s, policy: strict");
    let e = refused(policy, Settings::memory());
    assert!(
        e.contains("'policy' does not apply to algorithm 'in_flight'"),
        "{e}"
    );
    let burst = RULES.replace("lease: 60s", "lease: 60s, burst: 3");
    let e = refused(burst, Settings::memory());
    assert!(
        e.contains("'burst' does not apply to algorithm 'in_flight'"),
        "{e}"
    );
}

/// On the hybrid backend each replica decides locally and the permits are merged through
/// Redis: a permit one replica holds, the other hears of and counts; one released frees on
/// both once heard.
// Pins G76.
#[test]
fn permits_on_the_hybrid_backend_are_held_across_replicas() {
    let Some(redis) = common::redis() else {
        return;
    };
    let dir = Scratch::new("in-flight-fleet");
    let config = dir.write("gen.yaml", RULES);
    let url = redis.url();
    let args = [
        "--backend",
        "hybrid",
        "--redis-url",
        &url,
        "--sync-ms",
        "10",
    ];
    let (a, b) = (server(&config, &args), server(&config, &args));
    let (s1, first) = take(a.http, "alice");
    let (s2, _second) = take(a.http, "alice");
    assert_eq!((s1, s2), (200, 200));
    // B hears of A's two permits: alice is full there too.
    let until = |port: u16, status: u16| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (got, ticket) = take(port, "alice");
            if got == status {
                return ticket;
            }
            if let Some(t) = ticket {
                release(port, &t);
            }
            assert!(std::time::Instant::now() < deadline, "never {status}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    until(b.http, 429);
    // A releases one: B takes it once heard.
    assert_eq!(release(a.http, &first.unwrap()).0, 200);
    let taken = until(b.http, 200);
    assert!(taken.is_some());
    assert_eq!(take(b.http, "alice").0, 429);
}

/// One inline command to the Redis on `port`: its raw reply (RESP), read until it is whole.
fn command(port: u16, line: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(format!("{line}\r\n").as_bytes()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 512];
    // A reply is whole once the server has nothing more within the timeout.
    while let Ok(n @ 1..) = stream.read(&mut buf) {
        reply.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(reply).unwrap()
}
