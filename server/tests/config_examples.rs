//! envoyproxy/ratelimit's README "Configuration" examples 1 to 11, each loaded exactly as the
//! README prints it and decided as the README says; the configurations envoyproxy/ratelimit
//! rejects (and hotlimit's `algorithm` extension); and a reload's kept and restarted state.
//!
//! Every service runs on a frozen `ManualClock`, so no window rolls unless a test moves it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hotlimit::ManualClock;
use hotlimit_server::config::{Config, ConfigError, Unit};
use hotlimit_server::engine::Backend;
use hotlimit_server::service::{
    Code, CurrentLimit, Descriptor, Op, Request, Response, Service, Settings, Status,
};

// ---- Helpers ----

/// A service over one YAML text, in memory, on a clock that only moves when told to.
async fn service(yaml: &str) -> (Service, ManualClock) {
    let clock = ManualClock::default();
    let settings = Settings {
        backend: Backend::Memory {
            max_keys: 10_000,
            clock: Some(clock.clone()),
        },
        ..Settings::memory()
    };
    let service = Service::from_sources(
        &[(PathBuf::from("example.yaml"), yaml.to_owned())],
        settings,
    )
    .await
    .unwrap();
    (service, clock)
}

/// A request for `domain` with one descriptor per slice of `(key, value)` entries.
fn req(domain: &str, descriptors: &[&[(&str, &str)]]) -> Request {
    Request {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| Descriptor {
                entries: entries
                    .iter()
                    .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                ..Descriptor::default()
            })
            .collect(),
        hits: 0,
    }
}

/// One check.
async fn check(service: &Service, request: &Request) -> Response {
    service.decide(request, Op::Check).await.unwrap()
}

/// Sends `n` checks; returns how many were answered OK overall, asserting that once one is
/// over the limit every later one is too (the OKs are a prefix).
async fn admitted(service: &Service, request: &Request, n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        match check(service, request).await.overall_code {
            Code::Ok => {
                assert_eq!(ok, i, "request {i} admitted after one over the limit");
                ok += 1;
            }
            Code::OverLimit => {}
        }
    }
    ok
}

/// A `CurrentLimit` as a status reports it.
fn limit(name: &str, requests_per_unit: u32, unit: Unit) -> Option<CurrentLimit> {
    Some(CurrentLimit {
        name: name.to_owned(),
        requests_per_unit,
        unit,
    })
}

/// The status of a descriptor no rule matches.
fn unmatched() -> Status {
    Status {
        code: Code::Ok,
        current_limit: None,
        limit_remaining: 0,
        duration_until_reset: None,
    }
}

/// Loads one file that must be rejected, and returns the error.
fn reject(text: &str) -> ConfigError {
    let err = Config::from_sources([(Path::new("bad.yaml"), text)]).expect_err("must be rejected");
    assert_eq!(err.file, PathBuf::from("bad.yaml"));
    err
}

/// Asserts `err`'s reason contains `reason` and its location is on `line`.
fn assert_rejected(err: &ConfigError, reason: &str, line: Option<usize>) {
    assert!(
        err.reason.contains(reason),
        "reason {:?} lacks {reason:?}",
        err.reason
    );
    assert_eq!(err.location.map(|(l, _)| l), line, "location of {err}");
}

// ---- README examples ----

const EXAMPLE_1: &str = r#"domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
"#;

// Example 1: users and default each 500/s independently, other values unmatched, next second restarts.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_1_two_values_500_per_second_each() {
    let (s, clock) = service(EXAMPLE_1).await;
    let users = req("mongo_cps", &[&[("database", "users")]]);
    let default = req("mongo_cps", &[&[("database", "default")]]);

    let first = check(&s, &users).await;
    assert_eq!(first.overall_code, Code::Ok);
    assert_eq!(
        first.statuses,
        vec![Status {
            code: Code::Ok,
            current_limit: limit("", 500, Unit::Second),
            limit_remaining: 499,
            duration_until_reset: Some(Duration::from_secs(1)),
        }]
    );
    assert_eq!(admitted(&s, &users, 499).await, 499);
    let over = check(&s, &users).await;
    assert_eq!(over.overall_code, Code::OverLimit);
    assert_eq!(over.statuses[0].code, Code::OverLimit);
    assert_eq!(over.statuses[0].limit_remaining, 0);
    assert_eq!(over.statuses[0].current_limit, limit("", 500, Unit::Second));

    // "default" is its own 500, untouched by "users".
    assert_eq!(admitted(&s, &default, 501).await, 500);

    // A value without a rule: always OK, no current limit.
    let other = req("mongo_cps", &[&[("database", "orders")]]);
    for _ in 0..600 {
        let r = check(&s, &other).await;
        assert_eq!(r.overall_code, Code::Ok);
        assert_eq!(r.statuses, vec![unmatched()]);
    }

    // Still within the second: still over. The next second: 500 again, for each value.
    clock.advance(Duration::from_millis(999));
    assert_eq!(admitted(&s, &users, 1).await, 0);
    clock.advance(Duration::from_millis(1));
    assert_eq!(admitted(&s, &users, 501).await, 500);
    assert_eq!(admitted(&s, &default, 501).await, 500);
}

const EXAMPLE_2: &str = r#"domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

// Example 2: nested marketing 5/day per number, 100/day per number, both descriptors -> logical OR.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_2_nested_descriptors_and_logical_or() {
    let (s, _clock) = service(EXAMPLE_2).await;
    let marketing = |n: &'static str| {
        req(
            "messaging",
            &[&[("message_type", "marketing"), ("to_number", n)]],
        )
    };
    let number = |n: &'static str| req("messaging", &[&[("to_number", n)]]);

    // Each number its own 5 marketing messages a day.
    let r = check(&s, &marketing("2061111111")).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 5, Unit::Day));
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(admitted(&s, &marketing("2061111111"), 5).await, 4);
    assert_eq!(admitted(&s, &marketing("2062222222"), 6).await, 5);
    // The message_type placeholder alone has no limit.
    let placeholder = req("messaging", &[&[("message_type", "marketing")]]);
    assert_eq!(check(&s, &placeholder).await.statuses, vec![unmatched()]);

    // Each number its own 100 a day, apart from the marketing counter.
    let r = check(&s, &number("2061111111")).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 100, Unit::Day));
    assert_eq!(admitted(&s, &number("2061111111"), 100).await, 99);
    assert_eq!(admitted(&s, &number("2062222222"), 101).await, 100);

    // Both descriptors in one request: both rules decide, the answer is their OR.
    let both = req(
        "messaging",
        &[
            &[("message_type", "marketing"), ("to_number", "2063333333")],
            &[("to_number", "2063333333")],
        ],
    );
    for i in 0..5u32 {
        let r = check(&s, &both).await;
        assert_eq!(r.overall_code, Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, 4 - i);
        assert_eq!(r.statuses[1].limit_remaining, 99 - i);
    }
    let r = check(&s, &both).await;
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.statuses[0].current_limit, limit("", 5, Unit::Day));
    assert_eq!(r.statuses[1].code, Code::Ok);
    assert_eq!(r.statuses[1].current_limit, limit("", 100, Unit::Day));
    assert_eq!(r.statuses[1].limit_remaining, 94);
    // The per-number rule counted all six: 94 left for the number alone.
    assert_eq!(admitted(&s, &number("2063333333"), 95).await, 94);
}

const EXAMPLE_3: &str = r#"domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
"#;

// Example 3: 10/s per IP; key/value is matched before key, so 50.0.0.5 (0/s) is always over.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_3_most_specific_match_first() {
    let (s, _clock) = service(EXAMPLE_3).await;
    let ip = |a: &'static str| req("edge_proxy_per_ip", &[&[("remote_address", a)]]);

    assert_eq!(admitted(&s, &ip("50.0.0.1"), 11).await, 10);
    assert_eq!(admitted(&s, &ip("50.0.0.2"), 11).await, 10);

    let r = check(&s, &ip("50.0.0.5")).await;
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.statuses[0].current_limit, limit("", 0, Unit::Second));
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(admitted(&s, &ip("50.0.0.5"), 20).await, 0);
    // The block list entry did not spend the generic rule's count of another address.
    assert_eq!(admitted(&s, &ip("50.0.0.6"), 11).await, 10);
}

const EXAMPLE_4_NO_MATCH: &str = r#"domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
"#;

const EXAMPLE_4_MATCH: &str = r#"domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
"#;

// Example 4: a two-entry descriptor skips a one-level rule and matches the nested one (300/s).
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_4_rules_apply_at_the_descriptors_depth() {
    let two = req("example4", &[&[("key", "value"), ("subkey", "subvalue")]]);
    let one = req("example4", &[&[("key", "value")]]);

    let (s, _clock) = service(EXAMPLE_4_NO_MATCH).await;
    for _ in 0..301 {
        let r = check(&s, &two).await;
        assert_eq!(r.overall_code, Code::Ok);
        assert_eq!(r.statuses, vec![unmatched()]);
    }
    // The one-level descriptor does match it, and the two-entry requests spent none of it.
    assert_eq!(admitted(&s, &one, 301).await, 300);

    let (s, _clock) = service(EXAMPLE_4_MATCH).await;
    let r = check(&s, &two).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 300, Unit::Second));
    assert_eq!(r.statuses[0].limit_remaining, 299);
    assert_eq!(admitted(&s, &two, 300).await, 299);
    // The one-level descriptor is a placeholder here: no rule at its depth.
    assert_eq!(check(&s, &one).await.statuses, vec![unmatched()]);
}

const EXAMPLE_5: &str = r#"domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#;

// Example 5: an unlimited descriptor is OK with LimitRemaining = MaxUint32; azure 100/min.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_5_unlimited() {
    let (s, _clock) = service(EXAMPLE_5).await;
    let ldap = req("internal", &[&[("ldap", "cn=admin")]]);
    for _ in 0..1000 {
        let r = check(&s, &ldap).await;
        assert_eq!(r.overall_code, Code::Ok);
        assert_eq!(
            r.statuses,
            vec![Status {
                code: Code::Ok,
                current_limit: None,
                limit_remaining: u32::MAX,
                duration_until_reset: None,
            }]
        );
    }
    let azure = req("internal", &[&[("azure", "blob")]]);
    let r = check(&s, &azure).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 100, Unit::Minute));
    assert_eq!(r.statuses[0].limit_remaining, 99);
    assert_eq!(admitted(&s, &azure, 100).await, 99);
    // Unlimited beside a limited descriptor over its limit: OVER_LIMIT overall.
    let r = check(
        &s,
        &req("internal", &[&[("ldap", "x")], &[("azure", "blob")]]),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(r.statuses[1].code, Code::OverLimit);
}

const EXAMPLE_6: &str = r#"domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
"#;

// Example 6: shadow_mode user-a never limited but its breaches of 10/s counted; user-b 20/s.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_6_shadow_mode() {
    let (s, _clock) = service(EXAMPLE_6).await;
    let user_a = req(
        "example6",
        &[&[("service", "auth-service"), ("user", "user-a")]],
    );
    for i in 0..25u32 {
        let r = check(&s, &user_a).await;
        assert_eq!(r.overall_code, Code::Ok, "request {i}");
        assert_eq!(r.statuses[0].code, Code::Ok, "request {i}");
        assert_eq!(r.statuses[0].current_limit, limit("", 10, Unit::Second));
        assert_eq!(r.statuses[0].limit_remaining, 9u32.saturating_sub(i));
        // Past the limit, its fields say it is spent, but an OK answer asks no one to wait.
        let field = |name: &str| r.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        assert_eq!(field("retry-after"), None, "request {i}");
        if i >= 10 {
            assert!(field("ratelimit").unwrap().contains(";r=0;"), "request {i}");
        }
    }
    let metrics = s.metrics.render();
    let series = r#"{domain="example6",rule="example6.service.user_user-a"}"#;
    assert!(
        metrics.contains(&format!("hotlimit_shadow_mode_total{series} 15\n")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("hotlimit_allowed_total{series} 10\n")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("hotlimit_over_limit_total{series} 0\n")),
        "{metrics}"
    );

    let user_b = req(
        "example6",
        &[&[("service", "auth-service"), ("user", "user-b")]],
    );
    assert_eq!(admitted(&s, &user_b, 21).await, 20);
    let r = check(&s, &user_b).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    // A rule enforced: the over-limit answer says when to come back.
    assert!(
        r.headers.iter().any(|(n, _)| n == "retry-after"),
        "{:?}",
        r.headers
    );
    assert_eq!(r.statuses[0].current_limit, limit("", 20, Unit::Second));
    let metrics = s.metrics.render();
    let series = r#"{domain="example6",rule="example6.service.user_user-b"}"#;
    assert!(
        metrics.contains(&format!("hotlimit_over_limit_total{series} 2\n")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("hotlimit_shadow_mode_total{series} 0\n")),
        "{metrics}"
    );
}

const EXAMPLE_7: &str = r#"domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
"#;

// Example 7: key_1 5/s, key_2 10/s, both together 10/s with specific_limit neither decided nor counted.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_7_replaces() {
    let key_1: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let key_2: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];

    // Each alone.
    let (s, _clock) = service(EXAMPLE_7).await;
    let r = check(&s, &req("example7", &[key_1])).await;
    assert_eq!(
        r.statuses[0].current_limit,
        limit("specific_limit", 5, Unit::Second)
    );
    assert_eq!(admitted(&s, &req("example7", &[key_1]), 5).await, 4);
    let r = check(&s, &req("example7", &[key_2])).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 10, Unit::Second));
    assert_eq!(admitted(&s, &req("example7", &[key_2]), 10).await, 9);

    // Both in one request, on a fresh service.
    let (s, _clock) = service(EXAMPLE_7).await;
    let both = req("example7", &[key_1, key_2]);
    for i in 0..10u32 {
        let r = check(&s, &both).await;
        assert_eq!(r.overall_code, Code::Ok, "request {i}");
        assert_eq!(
            r.statuses[0],
            unmatched(),
            "the replaced rule is not evaluated"
        );
        assert_eq!(r.statuses[1].current_limit, limit("", 10, Unit::Second));
        assert_eq!(r.statuses[1].limit_remaining, 9 - i);
    }
    let r = check(&s, &both).await;
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(r.statuses[0], unmatched());
    assert_eq!(r.statuses[1].code, Code::OverLimit);
    let metrics = s.metrics.render();
    let series = r#"{domain="example7",rule="example7.key_1_value_1.user_bkthomps"}"#;
    assert!(
        metrics.contains(&format!("hotlimit_allowed_total{series} 0\n")),
        "{metrics}"
    );
    // specific_limit's counter is untouched: its full 5 for key_1 alone; key_2's is spent.
    assert_eq!(admitted(&s, &req("example7", &[key_1]), 6).await, 5);
    assert_eq!(admitted(&s, &req("example7", &[key_2]), 1).await, 0);
}

const EXAMPLE_8: &str = r#"domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

// Example 8: detailed_metric accepted; key1=<any> 10/min per value, key1=value1 20/min.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_8_detailed_metric() {
    let (s, _clock) = service(EXAMPLE_8).await;
    let key1 = |v: &'static str| req("example8", &[&[("key1", v)]]);
    let r = check(&s, &key1("unspecified_value")).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 10, Unit::Minute));
    assert_eq!(admitted(&s, &key1("unspecified_value"), 10).await, 9);
    assert_eq!(admitted(&s, &key1("unspecified_value2"), 11).await, 10);
    let r = check(&s, &key1("value1")).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 20, Unit::Minute));
    assert_eq!(admitted(&s, &key1("value1"), 20).await, 19);
}

const EXAMPLE_9_TRAILING: &str = r#"domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

const EXAMPLE_9_MIDDLE: &str = r#"domain: example9
descriptors:
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

const EXAMPLE_9_MULTIPLE: &str = r#"domain: example9
descriptors:
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

/// Asserts each of `matching` is its own 20/min, and each of `other` matches no rule.
async fn assert_wildcard(yaml: &str, key: &str, matching: &[&str], other: &[&str]) {
    let (s, _clock) = service(yaml).await;
    for v in matching {
        let r = req("example9", &[&[(key, v)]]);
        assert_eq!(
            check(&s, &r).await.statuses[0].current_limit,
            limit("", 20, Unit::Minute),
            "{key}={v}"
        );
        assert_eq!(admitted(&s, &r, 20).await, 19, "{key}={v}");
    }
    for v in other {
        let r = check(&s, &req("example9", &[&[(key, v)]])).await;
        assert_eq!(r.statuses, vec![unmatched()], "{key}={v}");
    }
}

// Example 9: trailing/middle/multiple wildcards match as listed, 20/min per distinct value.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_9_wildcards() {
    assert_wildcard(
        EXAMPLE_9_TRAILING,
        "key1",
        &["value1", "value2", "valueXYZ", "value"],
        &["valu", "xvalue1", "Value1"],
    )
    .await;
    assert_wildcard(
        EXAMPLE_9_MIDDLE,
        "path",
        &["/api/123/action", "/api/user-id/action", "/api//action"],
        &["/api/123/other", "/v2/api/123/action", "/api/123/action/x"],
    )
    .await;
    assert_wildcard(
        EXAMPLE_9_MULTIPLE,
        "route",
        &["/api/v1/resource/123/action", "/api/v2/resource/456/action"],
        &["/api/v1/resource/123/other", "/api/v1/other/123/action"],
    )
    .await;
}

const EXAMPLE_10: &str = r#"domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
"#;

const EXAMPLE_10_WILDCARD: &str = r#"domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              unit: minute
              requests_per_unit: 100
"#;

// Example 10: value_to_metric configurations load; 60/min and 100/min per full descriptor.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_10_value_to_metric() {
    let (s, _clock) = service(EXAMPLE_10).await;
    let d = |route: &'static str, method: &'static str, subject: &'static str| {
        req(
            "example10",
            &[&[
                ("route", route),
                ("http_method", method),
                ("subject_id", subject),
            ]],
        )
    };
    let r = check(&s, &d("api", "GET", "123")).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 60, Unit::Minute));
    assert_eq!(admitted(&s, &d("api", "GET", "123"), 60).await, 59);
    assert_eq!(admitted(&s, &d("web", "POST", "456"), 61).await, 60);
    assert_eq!(admitted(&s, &d("api", "GET", "456"), 61).await, 60);
    assert_eq!(admitted(&s, &d("api", "POST", "123"), 61).await, 60);

    let (s, _clock) = service(EXAMPLE_10_WILDCARD).await;
    let d = |user: &'static str, action: &'static str, resource: &'static str| {
        req(
            "example10_wildcard",
            &[&[("user", user), ("action", action), ("resource", resource)]],
        )
    };
    let r = check(&s, &d("alice", "readfile", "documents")).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 100, Unit::Minute));
    assert_eq!(
        admitted(&s, &d("alice", "readfile", "documents"), 100).await,
        99
    );
    assert_eq!(
        admitted(&s, &d("alice", "readdir", "documents"), 101).await,
        100
    );
    assert_eq!(
        admitted(&s, &d("bob", "readfile", "documents"), 101).await,
        100
    );
    let r = check(&s, &d("alice", "writefile", "documents")).await;
    assert_eq!(r.statuses, vec![unmatched()]);
}

const EXAMPLE_11: &str = r#"domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
"#;

const EXAMPLE_11_METRICS: &str = r#"domain: example11_metrics
descriptors:
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit:
          unit: minute
          requests_per_unit: 60
"#;

// Example 11: files/* shares 10/hour (5 a.pdf + 5 b.csv, c.txt over), files_no_share/* 10 each.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn example_11_share_threshold() {
    let (s, _clock) = service(EXAMPLE_11).await;
    let files = |v: &'static str| req("example11", &[&[("files", v)]]);
    let no_share = |v: &'static str| req("example11", &[&[("files_no_share", v)]]);

    let r = check(&s, &files("files/a.pdf")).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 10, Unit::Hour));
    assert_eq!(r.statuses[0].limit_remaining, 9);
    assert_eq!(admitted(&s, &files("files/a.pdf"), 4).await, 4);
    let r = check(&s, &files("files/b.csv")).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 4,
        "b.csv counts on a.pdf's threshold"
    );
    assert_eq!(admitted(&s, &files("files/b.csv"), 4).await, 4);
    let r = check(&s, &files("files/c.txt")).await;
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(admitted(&s, &files("files/a.pdf"), 1).await, 0);

    assert_eq!(
        admitted(&s, &no_share("files_no_share/a.pdf"), 11).await,
        10
    );
    assert_eq!(
        admitted(&s, &no_share("files_no_share/b.csv"), 11).await,
        10
    );
    assert_eq!(
        admitted(&s, &no_share("files_no_share/c.txt"), 11).await,
        10
    );

    let (s, _clock) = service(EXAMPLE_11_METRICS).await;
    let d = |route: &'static str, method: &'static str| {
        req(
            "example11_metrics",
            &[&[("route", route), ("method", method)]],
        )
    };
    let r = check(&s, &d("api/v1", "GET")).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 60, Unit::Minute));
    assert_eq!(admitted(&s, &d("api/v1", "GET"), 60).await, 59);
    // api/v2 shares api/*'s threshold (per method); another method is its own 60.
    assert_eq!(admitted(&s, &d("api/v2", "GET"), 1).await, 0);
    assert_eq!(admitted(&s, &d("api/v2", "POST"), 61).await, 60);
    assert_eq!(
        check(&s, &d("web/v1", "GET")).await.statuses,
        vec![unmatched()]
    );
}

// ---- Rejected configurations (envoyproxy/ratelimit's own rejection cases) ----

// envoyproxy/ratelimit: "config file cannot have empty domain" (missing or empty).
// Pins G63.
#[test]
fn rejects_an_empty_domain() {
    let err = reject("domain: \"\"\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
    assert_rejected(&err, "config file cannot have empty domain", None);
    let err =
        reject("descriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
    assert_rejected(&err, "config file cannot have empty domain", None);
}

// envoyproxy/ratelimit: "descriptor has empty key" (missing or empty), pointing at it.
// Pins G63.
#[test]
fn rejects_a_descriptor_without_a_key() {
    let missing = r#"domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - value: v
    rate_limit: {unit: second, requests_per_unit: 1}
"#;
    // The keyless descriptor's line, the second of its list.
    assert_rejected(&reject(missing), "descriptor has empty key", Some(5));
    let empty = r#"domain: d
descriptors:
  - key: a
    descriptors:
      - key: ""
        rate_limit: {unit: second, requests_per_unit: 1}
"#;
    // Nested: the keyless descriptor's line.
    assert_rejected(&reject(empty), "descriptor has empty key", Some(5));
}

// envoyproxy/ratelimit: "duplicate descriptor composite key" among siblings (not cousins).
// Pins G63.
#[test]
fn rejects_duplicate_composite_keys() {
    let text = r#"domain: d
descriptors:
  - key: a
    value: b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: b
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;
    // The line of the second `a_b`.
    assert_rejected(
        &reject(text),
        "duplicate descriptor composite key 'a_b'",
        Some(6),
    );
    let nested = r#"domain: d
descriptors:
  - key: a
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
"#;
    // Nested: the line of the second `c`.
    assert_rejected(
        &reject(nested),
        "duplicate descriptor composite key 'c'",
        Some(7),
    );
    // The same key under two different parents, and key vs key_value, are fine.
    let fine = r#"domain: d
descriptors:
  - key: a
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: c
    value: x
    rate_limit: {unit: second, requests_per_unit: 1}
"#;
    assert_eq!(
        Config::from_sources([(Path::new("ok.yaml"), fine)])
            .unwrap()
            .rules()
            .len(),
        4
    );
}

// envoyproxy/ratelimit rejects unknown keys (its strict YAML unmarshal): at every level.
// Pins G63.
#[test]
fn rejects_unknown_fields() {
    let misspelled = r#"domain: d
descriptors:
  - key: a
    ratelimit:
      unit: second
      requests_per_unit: 1
"#;
    assert_rejected(&reject(misspelled), "unknown field `ratelimit`", Some(4));
    let in_rate_limit = r#"domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      foo: bar
"#;
    assert_rejected(&reject(in_rate_limit), "unknown field `foo`", Some(7));
    let top = "domain: d\ndescriptor:\n  - key: a\n";
    assert_rejected(&reject(top), "unknown field `descriptor`", Some(2));
    let in_replaces = r#"domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces:
        - nme: other
"#;
    assert_rejected(&reject(in_replaces), "unknown field `nme`", Some(8));
}

// envoyproxy/ratelimit: a descriptor list entry must be a map.
// Pins G63.
#[test]
fn rejects_descriptors_that_are_not_maps() {
    let text = "domain: d\ndescriptors:\n  - a\n  - b\n";
    assert_rejected(&reject(text), "invalid type: string \"a\"", Some(3));
    let nested = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - 42\n";
    assert_rejected(&reject(nested), "invalid type: integer `42`", Some(5));
}

// envoyproxy/ratelimit: "invalid rate limit unit" (unknown or missing, when not unlimited).
// Pins G63.
#[test]
fn rejects_an_invalid_unit() {
    let text = r#"domain: d
descriptors:
  - key: a
    rate_limit:
      unit: fortnight
      requests_per_unit: 1
"#;
    assert_rejected(
        &reject(text),
        "invalid rate limit unit 'fortnight'",
        Some(3),
    );
    let missing =
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 1\n";
    assert_rejected(&reject(missing), "invalid rate limit unit ''", Some(3));
    // Units are case-insensitive, as in envoyproxy/ratelimit.
    let upper = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: SECOND, requests_per_unit: 1}\n";
    assert!(Config::from_sources([(Path::new("ok.yaml"), upper)]).is_ok());
}

// envoyproxy/ratelimit: "should not specify rate limit unit when unlimited".
// Pins G63.
#[test]
fn rejects_a_unit_on_an_unlimited_rule() {
    let text = r#"domain: d
descriptors:
  - key: a
    rate_limit:
      unlimited: true
      unit: second
"#;
    assert_rejected(
        &reject(text),
        "should not specify rate limit unit when unlimited",
        Some(3),
    );
}

// envoyproxy/ratelimit: "should not have an empty replaces entry".
// Pins G63.
#[test]
fn rejects_an_empty_replaces_name() {
    let text = r#"domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces:
        - name: ""
"#;
    assert_rejected(
        &reject(text),
        "should not have an empty replaces entry",
        Some(3),
    );
    let no_name = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - {}\n";
    assert_rejected(
        &reject(no_name),
        "should not have an empty replaces entry",
        Some(3),
    );
}

// envoyproxy/ratelimit: "replaces should not contain name of same descriptor".
// Pins G63.
#[test]
fn rejects_replacing_itself() {
    let text = r#"domain: d
descriptors:
  - key: a
    rate_limit:
      name: mine
      unit: second
      requests_per_unit: 1
      replaces:
        - name: mine
"#;
    assert_rejected(
        &reject(text),
        "replaces should not contain name of same descriptor",
        Some(3),
    );
}

// envoyproxy/ratelimit: "share_threshold can only be used with wildcard values".
// Pins G63.
#[test]
fn rejects_share_threshold_without_a_wildcard() {
    let text = r#"domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: files
    value: files/a.pdf
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;
    // The offending `files` descriptor's line, the second of its list.
    assert_rejected(
        &reject(text),
        "share_threshold can only be used with wildcard values",
        Some(5),
    );
    let no_value = "domain: d\ndescriptors:\n  - key: files\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
    assert_rejected(
        &reject(no_value),
        "share_threshold can only be used with wildcard values",
        Some(3),
    );
}

// envoyproxy/ratelimit: one domain per file, never the same domain in two files.
// Pins G63.
#[test]
fn rejects_a_duplicate_domain() {
    let a = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let b = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let err = Config::from_sources([(Path::new("a.yaml"), a), (Path::new("b.yaml"), b)])
        .expect_err("must be rejected");
    assert_eq!(err.file, PathBuf::from("b.yaml"));
    assert_rejected(&err, "duplicate domain 'd'", None);
    assert!(err.reason.contains("a.yaml"), "{}", err.reason);
}

// hotlimit's extension: an unknown algorithm is rejected, naming it.
// Pins G63.
#[test]
fn rejects_an_unknown_algorithm() {
    let text = r#"domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: foo
"#;
    assert_rejected(&reject(text), "unknown algorithm 'foo'", Some(3));
    // A block-all rule (0 a unit) is checked all the same.
    let blocked = text.replace("requests_per_unit: 10", "requests_per_unit: 0");
    assert_rejected(&reject(&blocked), "unknown algorithm 'foo'", Some(3));
    let gcra = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 0, algorithm: gcra, burst: 3}\n";
    assert!(loads(gcra));
}

/// Whether `text` loads.
fn loads(text: &str) -> bool {
    Config::from_sources([(Path::new("ok.yaml"), text)]).is_ok()
}

// hotlimit's extension: `burst` is a GCRA setting, rejected on a fixed window.
// Pins G63.
#[test]
fn rejects_burst_on_a_fixed_window() {
    let text = r#"domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 10
      burst: 20
"#;
    assert_rejected(
        &reject(text),
        "'burst' does not apply to algorithm 'fixed_window'",
        Some(3),
    );
    let explicit = text.replace("burst: 20", "algorithm: fixed_window\n      burst: 20");
    assert_rejected(
        &reject(&explicit),
        "'burst' does not apply to algorithm 'fixed_window'",
        Some(3),
    );
}

// hotlimit's extension: gcra with burst 20 admits exactly 20 at an instant, then 1 per 100 ms.
// Pins G63.
#[tokio::test(flavor = "current_thread")]
async fn gcra_with_a_burst() {
    let text = r#"domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: gcra
      burst: 20
"#;
    let (s, clock) = service(text).await;
    let r = req("d", &[&[("a", "x")]]);
    let first = check(&s, &r).await;
    assert_eq!(first.statuses[0].current_limit, limit("", 10, Unit::Second));
    assert_eq!(first.statuses[0].limit_remaining, 19);
    assert_eq!(admitted(&s, &r, 20).await, 19);
    clock.advance(Duration::from_millis(100));
    assert_eq!(admitted(&s, &r, 2).await, 1);
    // Another value is its own burst.
    assert_eq!(admitted(&s, &req("d", &[&[("a", "y")]]), 21).await, 20);
}

// ---- Reload ----

const RELOAD_BEFORE: &str = r#"domain: reload
descriptors:
  - key: kept
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: changed
    rate_limit:
      unit: minute
      requests_per_unit: 10
"#;

const RELOAD_AFTER: &str = r#"domain: reload
descriptors:
  - key: kept
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: changed
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

// Reload: an unchanged rule keeps its count, a changed one restarts, a rejected file changes nothing.
// Pins G66.
#[tokio::test(flavor = "current_thread")]
async fn reload_keeps_unchanged_rules_and_survives_a_bad_file() {
    let (s, _clock) = service(RELOAD_BEFORE).await;
    let kept = req("reload", &[&[("kept", "x")]]);
    let changed = req("reload", &[&[("changed", "x")]]);
    assert_eq!(admitted(&s, &kept, 6).await, 6);
    assert_eq!(admitted(&s, &changed, 6).await, 6);

    let file = PathBuf::from("example.yaml");
    // The same text: nothing to do.
    assert!(!s
        .reload_from(&[(file.clone(), RELOAD_BEFORE.to_owned())])
        .await
        .unwrap());
    assert!(s
        .reload_from(&[(file.clone(), RELOAD_AFTER.to_owned())])
        .await
        .unwrap());
    let r = check(&s, &kept).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 10, Unit::Minute));
    assert_eq!(
        r.statuses[0].limit_remaining, 3,
        "kept its 6 earlier requests"
    );
    assert_eq!(admitted(&s, &kept, 4).await, 3);
    let r = check(&s, &changed).await;
    assert_eq!(r.statuses[0].current_limit, limit("", 20, Unit::Minute));
    assert_eq!(
        r.statuses[0].limit_remaining, 19,
        "restarted under its new limit"
    );
    assert_eq!(admitted(&s, &changed, 20).await, 19);

    // A rejected file: an error, and the configuration above still answers, state and all.
    let bad = RELOAD_AFTER.replace(
        "unit: minute\n      requests_per_unit: 20",
        "unit: fortnight\n      requests_per_unit: 20",
    );
    let err = s.reload_from(&[(file.clone(), bad)]).await.unwrap_err();
    assert_eq!(err.file, file);
    assert!(
        err.reason.contains("invalid rate limit unit 'fortnight'"),
        "{err}"
    );
    assert!(s
        .metrics
        .render()
        .contains("hotlimit_config_load_error_total 1\n"));
    let r = check(&s, &changed).await;
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(r.statuses[0].current_limit, limit("", 20, Unit::Minute));
    assert_eq!(admitted(&s, &kept, 1).await, 0);
    let other = req("reload", &[&[("changed", "y")]]);
    assert_eq!(admitted(&s, &other, 21).await, 20);
    assert_eq!(s.rule_ids(), vec!["reload.kept", "reload.changed"]);
}

// A rule taken out of shadow mode keeps its counts, as envoyproxy/ratelimit's (its cache key
// has no shadow flag): what the shadow run counted is what enforcement starts from, in memory
// as on Redis.
// Pins G66.
#[tokio::test(flavor = "current_thread")]
async fn a_rule_taken_out_of_shadow_mode_keeps_its_counts() {
    let shadow = "domain: reload\ndescriptors:\n  - key: soft\n    shadow_mode: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n";
    let (s, _clock) = service(shadow).await;
    let soft = req("reload", &[&[("soft", "x")]]);
    // Shadow: all answered OK, 7 counted.
    assert_eq!(admitted(&s, &soft, 7).await, 7);
    let enforced = shadow.replace("    shadow_mode: true\n", "");
    assert!(s
        .reload_from(&[(PathBuf::from("example.yaml"), enforced)])
        .await
        .unwrap());
    assert_eq!(
        admitted(&s, &soft, 1).await,
        0,
        "the shadow run's 7 still count"
    );
}
