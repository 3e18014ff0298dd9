//! The backends in real processes: two replicas on a Redis Cluster share one exact limit; two
//! on the fleet limiter share one; a configuration changed on disk is reloaded by the running
//! server, keeping the state of unchanged rules, and a bad one is rejected with the running one
//! kept. Through the JSON API.

mod common;

use std::time::{Duration, Instant};

use common::{check, post, server, Scratch};

const RULES: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 4}
  - key: token
    rate_limit: {unit: day, requests_per_unit: 20, algorithm: gcra}
"#;

/// Waits (at most 10 s) until `ready` holds.
fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the server on `http` peeks `key=value` as over its limit (another replica's
/// spending has reached it).
fn until_denied(http: u16, key: &str, value: &str) {
    let body = format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    );
    until(&format!("the spending on {key}={value}"), || {
        post(http, "/v1/peek", &body).0 == 429
    });
}

// Pins G65.
#[test]
fn two_replicas_on_a_redis_cluster_share_one_exact_limit() {
    let Some(cluster) = common::cluster() else {
        return;
    };
    let dir = Scratch::new("backends-cluster");
    let config = dir.write("d.yaml", RULES);
    let args = ["--backend", "redis", "--redis-url", &cluster.url()];
    let (a, b) = (server(&config, &args), server(&config, &args));
    // Alternating replicas, many users (keys on every node): exactly 4 each.
    for user in 0..12 {
        let user = format!("u{user}");
        let codes: Vec<u16> = (0..7)
            .map(|i| check(if i % 2 == 0 { a.http } else { b.http }, "d", "user", &user))
            .collect();
        assert_eq!(codes, [200, 200, 200, 200, 429, 429, 429], "user {user}");
    }
}

// Pins G46, G65.
#[test]
fn two_replicas_on_the_fleet_limiter_share_one_limit() {
    let Some(redis) = common::redis() else {
        return;
    };
    let dir = Scratch::new("backends-hybrid");
    // Two GCRA rules of different limits: one class, one limiter, each request under its
    // rule's quota.
    let rules = format!(
        "{RULES}  - key: app\n    rate_limit: {{unit: day, requests_per_unit: 3, algorithm: gcra}}\n"
    );
    let config = dir.write("d.yaml", &rules);
    let args = [
        "--backend",
        "hybrid",
        "--redis-url",
        &redis.url(),
        "--sync-ms",
        "10",
    ];
    let (a, b) = (server(&config, &args), server(&config, &args));
    // A spends the token's 20: alone on the key, its leases cover the whole burst (G47).
    let on_a: usize = (0..25)
        .filter(|_| check(a.http, "d", "token", "t1") == 200)
        .count();
    assert_eq!(on_a, 20);
    // Once A's state has reached B through Redis, B denies the token too.
    until_denied(b.http, "token", "t1");
    assert_eq!(check(b.http, "d", "token", "t1"), 429);
    assert_eq!(check(a.http, "d", "token", "t1"), 429);
    // Another token is untouched on both.
    assert_eq!(check(b.http, "d", "token", "t2"), 200);
    // The other rule of the class, under its own quota: A admits its 3, and once that has
    // reached B, B denies it too, while the token keeps its 20.
    let on_a: usize = (0..5)
        .filter(|_| check(a.http, "d", "app", "x") == 200)
        .count();
    assert_eq!(on_a, 3);
    until_denied(b.http, "app", "x");
    assert_eq!(check(b.http, "d", "app", "x"), 429);
    assert_eq!(check(b.http, "d", "token", "t3"), 200);
}

// Two replicas on the fleet limiter, given one ticket secret: each process remembers its own
// settles, so a ticket settles only on the replica that issued it; on the other it is unknown
// (404) and changes nothing, so no refund is applied once per replica.
// Pins G75.
#[test]
fn on_the_fleet_limiter_a_ticket_settles_only_on_its_issuer() {
    let Some(redis) = common::redis() else {
        return;
    };
    let dir = Scratch::new("backends-hybrid-settle");
    let config = dir.write("d.yaml", RULES);
    let url = redis.url();
    let args = [
        "--backend",
        "hybrid",
        "--redis-url",
        &url,
        "--sync-ms",
        "10",
        "--ticket-secret",
        "s3cret",
    ];
    let (a, b) = (server(&config, &args), server(&config, &args));
    let ticket = take(a.http, "alice", 3);
    let gone = serde_json::json!({"error": "no such open ticket"});
    assert_eq!(settle(b.http, &ticket, 0), (404, gone.clone()));
    assert_eq!(settle(a.http, &ticket, 0).0, 200);
    assert_eq!(settle(a.http, &ticket, 0), (404, gone.clone()));
    assert_eq!(settle(b.http, &ticket, 0), (404, gone));
    // The 3 came back once: A admits the day's 4, then denies.
    let codes: Vec<u16> = (0..5)
        .map(|_| check(a.http, "d", "user", "alice"))
        .collect();
    assert_eq!(codes, [200, 200, 200, 200, 429]);
}

// Pins G66.
#[test]
fn a_running_server_reloads_a_changed_file_and_keeps_unchanged_rules_state() {
    let dir = Scratch::new("backends-reload");
    let config = dir.write("d.yaml", RULES);
    let srv = server(&config, &["--reload-ms", "20"]);
    let used: Vec<u16> = (0..5)
        .map(|_| check(srv.http, "d", "user", "ann"))
        .collect();
    assert_eq!(used, [200, 200, 200, 200, 429]);
    assert_eq!(check(srv.http, "d", "token", "t"), 200);

    // `user` unchanged, `token` now 1 a day, a new rule for `ip`.
    let changed = RULES.replace(
        "{unit: day, requests_per_unit: 20, algorithm: gcra}",
        "{unit: day, requests_per_unit: 1, algorithm: gcra}",
    ) + "  - key: ip\n    rate_limit: {unit: day, requests_per_unit: 2}\n";
    std::fs::write(&config, &changed).unwrap();
    until("the new rule", || {
        let (_, body) = post(
            srv.http,
            "/v1/peek",
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"ip","value":"x"}]}]}"#,
        );
        body["statuses"][0].get("currentLimit").is_some()
    });
    // ann's four stand; the changed rule starts afresh with its 1; the new one has its 2.
    assert_eq!(check(srv.http, "d", "user", "ann"), 429);
    assert_eq!(check(srv.http, "d", "token", "t"), 200);
    assert_eq!(check(srv.http, "d", "token", "t"), 429);
    assert_eq!(check(srv.http, "d", "ip", "x"), 200);

    // A bad file: rejected, counted, the running configuration kept.
    std::fs::write(&config, changed.replace("unit: day", "unit: fortnight")).unwrap();
    until("the rejection", || {
        let metrics = common::client()
            .get(format!("http://127.0.0.1:{}/metrics", srv.http))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        metrics.contains("hotlimit_config_load_error_total 1")
    });
    assert_eq!(check(srv.http, "d", "ip", "x"), 200);
    assert_eq!(check(srv.http, "d", "ip", "x"), 429);
    assert_eq!(check(srv.http, "d", "user", "bob"), 200);
}

/// A take of `user=value` at `cost` on a server: its ticket.
fn take(http: u16, value: &str, cost: u64) -> String {
    let body = format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}],"hitsAddend":{cost}}}]}}"#
    );
    let (status, answer) = post(http, "/v1/take", &body);
    assert_eq!(status, 200, "{answer}");
    answer["ticket"].as_str().unwrap().to_owned()
}

fn settle(http: u16, ticket: &str, actual: u64) -> (u16, serde_json::Value) {
    let body = serde_json::json!({ "ticket": ticket, "actual": actual }).to_string();
    post(http, "/v1/settle", &body)
}

// Two replicas on one Redis, given one ticket secret: a take on one is settled on the other
// (the refund lands in the shared state), once: a second settle on either is a 404. A replica
// with another secret refuses the ticket and changes nothing.
// Pins G75.
#[test]
fn a_take_on_one_replica_settles_on_the_other_once() {
    let Some(redis) = common::redis() else {
        return;
    };
    let dir = Scratch::new("backends-settle");
    let config = dir.write("d.yaml", RULES);
    let url = redis.url();
    let shared = [
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--ticket-secret",
        "s3cret",
    ];
    let (a, b) = (server(&config, &shared), server(&config, &shared));
    let other = [
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--ticket-secret",
        "another",
    ];
    let c = server(&config, &other);

    let ticket = take(a.http, "alice", 3);
    let gone = serde_json::json!({"error": "no such open ticket"});
    assert_eq!(settle(c.http, &ticket, 0), (404, gone.clone()));
    assert_eq!(settle(b.http, &ticket, 0).0, 200);
    assert_eq!(settle(b.http, &ticket, 0), (404, gone.clone()));
    assert_eq!(settle(a.http, &ticket, 0), (404, gone));
    // All 4 back once: 4 admitted, on either replica.
    let codes: Vec<u16> = (0..5)
        .map(|i| {
            check(
                if i % 2 == 0 { a.http } else { b.http },
                "d",
                "user",
                "alice",
            )
        })
        .collect();
    assert_eq!(codes, [200, 200, 200, 200, 429]);
}
