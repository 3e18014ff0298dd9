//! A hierarchy of descriptors checked at once (issue #62): a domain marked
//! `all_or_nothing: true` counts a request's descriptors (a user, its organisation) all or
//! none: a descriptor that admitted the request gives its count back when another is over.
//! Beside it, the same rules without the mark keep envoyproxy/ratelimit's reading (each
//! descriptor counted on its own). In memory (in process) and on a real `redis-server` behind
//! a real server process.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use hotlimit::ManualClock;
use hotlimit_server::engine::Backend;
use hotlimit_server::service::{Service, Settings};
use serde_json::json;

use common::{post, runtime, server, InProcess, Scratch};

const RULES: &str = r#"
domain: api
all_or_nothing: true
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: org
    rate_limit: {unit: hour, requests_per_unit: 3}
"#;

/// The same rules, each descriptor counted on its own (envoyproxy/ratelimit's reading).
fn plain() -> String {
    RULES.replace("domain: api\nall_or_nothing: true", "domain: plain")
}

/// `op` (`check` or `take`) in `domain` for `user`, with their organisation `acme` when
/// `org`: the status, and whether a ticket came back.
fn ask(port: u16, op: &str, domain: &str, user: &str, org: bool) -> (u16, bool) {
    let mut descriptors = vec![json!({"entries": [{"key": "user", "value": user}]})];
    if org {
        descriptors.push(json!({"entries": [{"key": "org", "value": "acme"}]}));
    }
    let body = json!({"domain": domain, "descriptors": descriptors});
    let (status, answer) = post(port, &format!("/v1/{op}"), &body.to_string());
    (status, answer.get("ticket").is_some())
}

/// The sequence both backends must answer alike.
fn hierarchy(port: u16) {
    let check = |domain: &str, user: &str, org: bool| ask(port, "check", domain, user, org).0;
    for domain in ["api", "plain"] {
        assert_eq!(check(domain, "alice", true), 200);
        assert_eq!(check(domain, "alice", true), 200);
        assert_eq!(check(domain, "alice", true), 429); // alice's own 2 an hour
    }
    // All or nothing: alice's third gave acme's count back, so bob gets acme's third; then
    // acme is over and bob's own count is given back too.
    assert_eq!(check("api", "bob", true), 200);
    assert_eq!(check("api", "bob", true), 429);
    assert_eq!(check("api", "bob", false), 200); // bob still has his second
    assert_eq!(check("api", "bob", false), 429);
    // Counted on their own: alice's third charged acme, so bob's first is already over, and
    // it charged bob.
    assert_eq!(check("plain", "bob", true), 429);
    assert_eq!(check("plain", "bob", false), 200);
    assert_eq!(check("plain", "bob", false), 429);
    // A take: a ticket only when every descriptor admits; over, nothing kept, no ticket.
    assert_eq!(ask(port, "take", "api", "carol", true), (429, false)); // acme is full
    assert_eq!(ask(port, "take", "api", "carol", false), (200, true));
    assert_eq!(ask(port, "take", "api", "carol", false), (200, true));
    assert_eq!(ask(port, "take", "api", "carol", false), (429, false));
}

// Pins G78.
#[test]
fn an_all_or_nothing_domain_counts_every_descriptor_or_none_in_memory() {
    let clock = ManualClock::default();
    let service = runtime()
        .block_on(Service::from_sources(
            &[
                (PathBuf::from("api.yaml"), RULES.to_owned()),
                (PathBuf::from("plain.yaml"), plain()),
            ],
            Settings {
                backend: Backend::Memory {
                    max_keys: 1_000,
                    clock: Some(clock),
                },
                ..Settings::memory()
            },
        ))
        .unwrap();
    let api = InProcess::serve(Arc::new(service));
    hierarchy(api.port);
    // A descriptor whose admission was given back is not counted allowed: repeated, such a
    // request raised `allowed` each time while charging nothing. (acme's on alice's third,
    // bob's on his second, carol's on her first take.)
    let text = common::metrics(api.port);
    let counted = |name: &str, rule: &str| {
        let series = format!("hotlimit_{name}_total{{domain=\"api\",rule=\"api.{rule}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
            .parse::<u64>()
            .unwrap()
    };
    assert_eq!(
        (counted("allowed", "user"), counted("over_limit", "user")),
        (6, 3)
    );
    assert_eq!(
        (counted("allowed", "org"), counted("over_limit", "org")),
        (3, 2)
    );
}

// Pins G78.
#[test]
fn an_all_or_nothing_domain_counts_every_descriptor_or_none_on_redis() {
    let Some(redis) = common::redis() else {
        return;
    };
    let dir = Scratch::new("all-or-nothing");
    dir.write("api.yaml", RULES);
    let config = dir.write("plain.yaml", &plain());
    let url = redis.url();
    let srv = server(
        config.parent().unwrap(),
        &["--backend", "redis", "--redis-url", &url],
    );
    hierarchy(srv.http);
}
