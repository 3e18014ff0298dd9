//! An algorithm written outside hotlimit and this crate, on hotlimit's public API only (issue
//! #60; the tick-refilled token bucket of `tests/common/tick_bucket.rs`, checked on every
//! store by the core's `tests/outside_algorithm.rs` and behind the tower layer by
//! `tower/tests/outside_algorithm.rs`), registered by name and named by a rule: decided over
//! the JSON API exactly as its own model decides, refused with a reason where it cannot run.

mod common;

#[path = "../../tests/common/tick_bucket.rs"]
mod tick_bucket;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hotlimit::algo::Algorithm as _;
use hotlimit::ManualClock;
use hotlimit_server::engine::Backend;
use hotlimit_server::outside::{Algorithms, NameTaken};
use hotlimit_server::service::{Service, Settings, StartError};
use serde_json::json;
use tick_bucket::{bucket, TickBucket};

use common::{post, runtime, InProcess};

const RULES: &str = r#"
domain: outside
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: tick_bucket}
  - key: wide
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: tick_bucket}
"#;

/// `requests_per_unit` tokens, one more every tenth of a `unit`.
fn algorithms() -> Algorithms {
    let mut algorithms = Algorithms::default();
    algorithms
        .register("tick_bucket", |n, unit| {
            let size = u16::try_from(n).map_err(|_| format!("{n} tokens: at most 65535"))?;
            Ok(TickBucket::new(size, 1, unit / 10))
        })
        .unwrap();
    algorithms
}

fn settings(clock: &ManualClock) -> Settings {
    Settings {
        backend: Backend::Memory {
            max_keys: 1_000,
            clock: Some(clock.clone()),
        },
        algorithms: algorithms(),
        ..Settings::memory()
    }
}

/// One `/v1/check` of `hits` on the descriptor `key=value`: the status and the answer.
fn check(port: u16, key: &str, value: &str, hits: u64) -> (u16, serde_json::Value) {
    let body = json!({
        "domain": "outside",
        "descriptors": [{"entries": [{"key": key, "value": value}]}],
        "hitsAddend": hits,
    });
    post(port, "/v1/check", &body.to_string())
}

/// Request by request over the JSON API, the same answers as the algorithm's own state per
/// key: allowed or not (200 or 429), and the tokens remaining.
#[test]
fn an_outside_algorithm_decides_over_the_json_api_as_its_model() {
    let clock = ManualClock::default();
    let service = runtime()
        .block_on(Service::from_sources(
            &[(PathBuf::from("outside.yaml"), RULES.to_owned())],
            settings(&clock),
        ))
        .unwrap();
    let api = InProcess::serve(Arc::new(service));
    let algo = bucket(); // what the rule's 3 a second makes: 3 tokens, one back every 100 ms
    let mut model = [algo.fresh(); 2];
    let mut admitted = 0;
    for i in 0..120u64 {
        let (user, now, cost) = ((i % 2) as usize, i * 37_000_000, 1 + i % 2);
        clock.set(Duration::from_nanos(now));
        let want = algo.update(&mut model[user], now, cost);
        let (status, answer) = check(api.port, "api_key", ["alice", "bob"][user], cost);
        let expected = if want.is_allowed() { 200 } else { 429 };
        assert_eq!(status, expected, "request {i}: {answer}");
        // Over the limit, envoyproxy/ratelimit's answer says 0 remaining.
        let remaining = if want.is_allowed() {
            want.remaining().unwrap_or(0)
        } else {
            0
        };
        assert_eq!(
            answer["statuses"][0]["limitRemaining"].as_u64(),
            Some(remaining),
            "request {i}: {answer}"
        );
        admitted += u64::from(want.is_allowed());
    }
    assert!(
        (20..100).contains(&admitted),
        "{admitted} of 120 admitted: both answers were exercised"
    );
    // The other rule is another quota: a limiter of its own, its 5 tokens untouched.
    for _ in 0..5 {
        assert_eq!(check(api.port, "wide", "alice", 1).0, 200);
    }
    assert_eq!(check(api.port, "wide", "alice", 1).0, 429);
}

/// Where it cannot run, it is refused with a reason: an unregistered name, a name a built-in
/// algorithm has, an option it does not take, and a backend other than memory.
#[test]
fn an_outside_algorithm_is_refused_where_it_cannot_run() {
    let mut taken = Algorithms::default();
    let gcra = taken.register("gcra", |n, unit| Ok(TickBucket::new(n as u16, 1, unit)));
    assert_eq!(gcra.err(), Some(NameTaken("gcra")));
    let rt = runtime();
    let clock = ManualClock::default();
    let start = |rules: &str, settings: Settings| {
        rt.block_on(Service::from_sources(
            &[(PathBuf::from("outside.yaml"), rules.to_owned())],
            settings,
        ))
    };
    let unregistered = start(RULES, Settings::memory()).err().unwrap();
    assert!(
        unregistered
            .to_string()
            .contains("unknown algorithm 'tick_bucket'"),
        "{unregistered}"
    );
    let with_burst = RULES.replace(
        "algorithm: tick_bucket}",
        "algorithm: tick_bucket, burst: 9}",
    );
    let err = start(&with_burst, settings(&clock)).err().unwrap();
    assert!(
        err.to_string()
            .contains("'burst' does not apply to algorithm 'tick_bucket'"),
        "{err}"
    );
    let on_redis = Settings {
        backend: Backend::Redis {
            url: "redis://127.0.0.1:1/".into(),
            prefix: String::new(),
        },
        algorithms: algorithms(),
        ..Settings::memory()
    };
    match start(RULES, on_redis) {
        Err(StartError::Rule(e)) => assert!(
            e.to_string()
                .contains("the redis backend does not run the outside algorithm 'tick_bucket'"),
            "{e}"
        ),
        other => panic!("expected the rule refused, got {:?}", other.err()),
    }
}
