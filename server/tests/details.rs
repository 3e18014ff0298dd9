//! G74 (docs/GUARANTEES.md): the server's request semantics beyond the Envoy tests, against a
//! real `hotlimit-server` on loopback (gRPC and the JSON API): `quota_mode`, `is_negative_hits`,
//! `hits_addend: 0`, a cost above a rule's limit, the JSON API's 503 and 400, SIGTERM with
//! requests in flight (and signals the moment the ports listen), a configuration error's line
//! and column, `/healthcheck` (and `--health-checks-backend`), `--shadow-mode`,
//! envoyproxy/ratelimit's counting and `hitsAddend` forms, overload and timeouts; and 100,000
//! open tickets, on the JSON API served in this process (no request sequence reaches them
//! quickly). A ticket's 60 s are unit tests in `src/service.rs`, on chosen instants rather
//! than sleeps.
//!
//! Windows are a day long, so none rolls during a test. The Redis test prints why and passes
//! without `redis-server`, unless `HOTLIMIT_REQUIRE_REDIS=1`.

mod common;

use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code as PbCode, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt64Value};
use hotlimit_server::config::Config;
use hotlimit_server::service::{Descriptor, Op, Request, Service, Settings};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tonic::codegen::tokio_stream::Stream;
use tonic::transport::{Channel, Endpoint};

use common::{
    client, free_port, metrics, post, runtime, server, server_command, wait_port, InProcess, Proc,
    Scratch, Server,
};

const RULES: &str = r#"
domain: g74
descriptors:
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: blocked
    rate_limit: {unit: day, requests_per_unit: 0}
  - key: ticket
    rate_limit: {unit: day, requests_per_unit: 1000000}
  - key: fixed_window
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: sliding_window
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: sliding_window}
  - key: sub_window
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: sub_window}
  - key: sliding_log
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: sliding_log}
  - key: gcra
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: gcra}
  - key: exponential
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: exponential}
"#;

const OK: i32 = PbCode::Ok as i32;
const OVER: i32 = PbCode::OverLimit as i32;

/// [`RULES`] written to a new scratch directory named after `tag`: the directory (kept for
/// the test's length) and the configuration's path.
fn rules(tag: &str) -> (Scratch, PathBuf) {
    let dir = Scratch::new(tag);
    let config = dir.write("g74.yaml", RULES);
    (dir, config)
}

// ---- Helpers ----

/// A gRPC client of one server, on a runtime of its own (the tests are synchronous).
struct Rls {
    rt: tokio::runtime::Runtime,
    client: RateLimitServiceClient<Channel>,
}

impl Rls {
    /// A client of the gRPC port `port`.
    fn connect(port: u16) -> Rls {
        let rt = runtime();
        let url = format!("http://127.0.0.1:{port}");
        let client = rt
            .block_on(RateLimitServiceClient::connect(url))
            .expect("connect over gRPC");
        Rls { rt, client }
    }

    /// `ShouldRateLimit`: the answer, or the error's status.
    fn call(&mut self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        let answer = self.rt.block_on(self.client.should_rate_limit(request));
        answer.map(tonic::Response::into_inner)
    }

    /// One call answered (not an error), in brief.
    fn brief(&mut self, request: RateLimitRequest) -> (i32, Vec<(i32, u32)>) {
        brief(&self.call(request).expect("an answer"))
    }
}

/// An answer in brief: the overall code, each descriptor's code and `limit_remaining` (the
/// resets depend on the time of day).
fn brief(r: &RateLimitResponse) -> (i32, Vec<(i32, u32)>) {
    let statuses = r.statuses.iter().map(|s| (s.code, s.limit_remaining));
    (r.overall_code, statuses.collect())
}

/// A one-entry descriptor `key=value`, with its own `hits_addend` if given.
fn desc(key: &str, value: &str, hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..Default::default()
    }
}

/// A descriptor with `is_negative_hits` (and a cost of 2, which must count nothing either).
fn negative(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        is_negative_hits: true,
        ..desc(key, value, Some(2))
    }
}

/// A `g74` request of these descriptors, with the request's `hits_addend`.
fn req(descriptors: Vec<RateLimitDescriptor>, hits_addend: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "g74".into(),
        descriptors,
        hits_addend,
    }
}

/// A JSON API body for one `g74` descriptor `key=value`; the descriptor's and the request's
/// `hitsAddend` when given.
fn body(key: &str, value: &str, descriptor_hits: Option<u64>, hits: Option<u64>) -> String {
    let mut d = json!({"entries": [{"key": key, "value": value}]});
    if let Some(h) = descriptor_hits {
        d["hitsAddend"] = h.into();
    }
    let mut r = json!({"domain": "g74", "descriptors": [d]});
    if let Some(h) = hits {
        r["hitsAddend"] = h.into();
    }
    r.to_string()
}

/// The value of the `/metrics` sample `series` (a name and its labels); it must be there.
fn metric(http: u16, series: &str) -> u64 {
    let text = metrics(http);
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"));
    value.parse().unwrap()
}

/// The counter `hotlimit_<name>_total` of the rule `g74.<key>`.
fn counter(http: u16, name: &str, key: &str) -> u64 {
    metric(
        http,
        &format!("hotlimit_{name}_total{{domain=\"g74\",rule=\"g74.{key}\"}}"),
    )
}

/// `hotlimit-server` started as `common::server` starts it, with `env` set and its stderr
/// lines sent to the channel returned (for the tests that wait on what it logs).
fn server_logged(
    config: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Server, mpsc::Receiver<String>) {
    let (mut srv, lines) = spawn_logged(config, args, env);
    wait_port(srv.grpc, &mut srv.proc, "hotlimit-server");
    wait_port(srv.http, &mut srv.proc, "hotlimit-server");
    (srv, lines)
}

/// [`server_logged`] without the wait for its ports.
fn spawn_logged(
    config: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Server, mpsc::Receiver<String>) {
    let (grpc, http) = (free_port(), free_port());
    let child = server_command(config, args, grpc, http)
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hotlimit-server");
    let mut proc = Proc(child);
    let stderr = proc.0.stderr.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (Server { proc, grpc, http }, lines)
}

/// Waits (at most 10 s) until the server logs exactly `line`.
fn logged(lines: &mpsc::Receiver<String>, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if l == line => return,
            Ok(_) => {}
            Err(e) => panic!("never logged {line:?} ({e})"),
        }
    }
}

/// Sends `signal` (`TERM`, `HUP`) to the process, as `common::Proc::terminate` does.
fn signal(proc: &Proc, signal: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &proc.0.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{signal} failed");
}

/// Waits (at most 10 s) for the process to exit.
fn exited(proc: &mut Proc) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = proc.0.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the server never exited");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads from `stream` until the bytes read end with a blank line (a response's head).
fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).expect("a response head");
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// A request stream whose one message goes out only once released; it says when the
/// transport first asks for it (the request's headers are sent by then).
struct Held {
    asked: Option<oneshot::Sender<()>>,
    release: Option<oneshot::Receiver<RateLimitRequest>>,
}

impl Stream for Held {
    type Item = RateLimitRequest;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RateLimitRequest>> {
        let this = self.get_mut();
        if let Some(asked) = this.asked.take() {
            let _ = asked.send(());
        }
        let Some(release) = this.release.as_mut() else {
            return Poll::Ready(None);
        };
        let message = std::task::ready!(Pin::new(release).poll(cx));
        this.release = None;
        Poll::Ready(message.ok())
    }
}

/// `ShouldRateLimit` with its message from `body`: Envoy's unary call, whose message can be
/// held back while the call is open.
async fn held_call(channel: Channel, body: Held) -> Result<RateLimitResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    let codec = tonic_prost::ProstCodec::<RateLimitRequest, RateLimitResponse>::default();
    let answer = grpc.client_streaming(tonic::Request::new(body), path, codec);
    answer.await.map(tonic::Response::into_inner)
}

/// A call on `channel` whose headers are sent and whose message is held: its task on `rt`,
/// and the sender that sends its message.
fn hold(
    rt: &tokio::runtime::Runtime,
    channel: &Channel,
) -> (
    tokio::task::JoinHandle<Result<RateLimitResponse, tonic::Status>>,
    oneshot::Sender<RateLimitRequest>,
) {
    let (asked, was_asked) = oneshot::channel();
    let (release, released) = oneshot::channel();
    let held = Held {
        asked: Some(asked),
        release: Some(released),
    };
    let call = rt.spawn(held_call(channel.clone(), held));
    rt.block_on(was_asked).unwrap();
    (call, release)
}

// ---- quota_mode ----

// A quota-mode descriptor over its limit fails the request only once every quota-mode
// descriptor of it is over; a normal descriptor over its limit fails it as always.
// Pins G74.
#[test]
fn quota_mode_fails_a_request_only_when_every_quota_mode_descriptor_is_over() {
    let (_dir, config) = rules("details-quota");
    let srv = server(&config, &[]);
    let mut rls = Rls::connect(srv.grpc);
    let quota = |v: &str| vec![desc("quota_a", v, None), desc("quota_b", v, None)];

    // Two quota-mode descriptors, 1 and 2 a day: one over is not enough, both over is.
    let seen: Vec<_> = (0..3).map(|_| rls.brief(req(quota("x"), 0))).collect();
    assert_eq!(
        seen,
        [
            (OK, vec![(OK, 0), (OK, 1)]),
            (OK, vec![(OVER, 0), (OK, 0)]),
            (OVER, vec![(OVER, 0), (OVER, 0)]),
        ]
    );

    // The only quota-mode descriptor over: every one is.
    let one = vec![desc("quota_a", "y", None)];
    assert_eq!(rls.brief(req(one.clone(), 0)), (OK, vec![(OK, 0)]));
    assert_eq!(rls.brief(req(one, 0)), (OVER, vec![(OVER, 0)]));

    // Beside a normal descriptor under its limit: the same rule (the normal one counted).
    let mixed = || [quota("z"), vec![desc("plain", "z", None)]].concat();
    let seen: Vec<_> = (0..3).map(|_| rls.brief(req(mixed(), 0))).collect();
    assert_eq!(
        seen,
        [
            (OK, vec![(OK, 0), (OK, 1), (OK, 2)]),
            (OK, vec![(OVER, 0), (OK, 0), (OK, 1)]),
            (OVER, vec![(OVER, 0), (OVER, 0), (OK, 0)]),
        ]
    );

    // A normal descriptor over its limit fails the request, quota-mode ones under theirs.
    for _ in 0..3 {
        rls.brief(req(vec![desc("plain", "v", None)], 0));
    }
    let both = vec![desc("quota_b", "v", None), desc("plain", "v", None)];
    assert_eq!(rls.brief(req(both, 0)), (OVER, vec![(OK, 1), (OVER, 0)]));
}

// ---- is_negative_hits ----

// A descriptor with `is_negative_hits` is answered OK, with no limit, and counts nothing: not
// its key's count, not a metric; the key still admits its full limit.
// Pins G74.
#[test]
fn a_negative_hits_descriptor_is_answered_ok_and_counts_nothing() {
    let (_dir, config) = rules("details-negative");
    let srv = server(&config, &[]);
    let mut rls = Rls::connect(srv.grpc);
    let refund = DescriptorStatus {
        code: OK,
        ..Default::default()
    };

    for _ in 0..5 {
        let r = rls.call(req(vec![negative("plain", "n")], 0)).unwrap();
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses, std::slice::from_ref(&refund));
        assert!(r.response_headers_to_add.is_empty());
    }
    // Beside a normal descriptor, which is decided and counted as usual.
    let mixed = vec![negative("plain", "n"), desc("fixed_window", "n", None)];
    assert_eq!(rls.brief(req(mixed, 0)), (OK, vec![(OK, 0), (OK, 4)]));

    // plain=n still has its 3.
    let seen: Vec<_> = (0..4)
        .map(|_| rls.brief(req(vec![desc("plain", "n", None)], 0)))
        .collect();
    assert_eq!(
        seen,
        [
            (OK, vec![(OK, 2)]),
            (OK, vec![(OK, 1)]),
            (OK, vec![(OK, 0)]),
            (OVER, vec![(OVER, 0)]),
        ]
    );
    // Over its limit, a refund is still answered OK.
    let r = rls.call(req(vec![negative("plain", "n")], 0)).unwrap();
    assert_eq!((r.overall_code, r.statuses), (OK, vec![refund]));

    assert_eq!(counter(srv.http, "allowed", "plain"), 3);
    assert_eq!(counter(srv.http, "over_limit", "plain"), 1);
    assert_eq!(counter(srv.http, "shadow_mode", "plain"), 0);
    assert_eq!(counter(srv.http, "allowed", "fixed_window"), 1);
    assert_eq!(metric(srv.http, "hotlimit_unmatched_total"), 0);
}

// ---- hits_addend: 0 ----

// The request's `hits_addend: 0` counts 1; a descriptor's own 0 (which overrides the
// request's) checks without counting, over only once the count is *above* the limit (at it:
// OK, nothing left), as envoyproxy/ratelimit; a cost of 2 is 2.
// Pins G74.
#[test]
fn hits_addend_0_counts_1_on_the_request_and_checks_without_counting_on_a_descriptor() {
    let (_dir, config) = rules("details-addend");
    let srv = server(&config, &[]);
    let mut rls = Rls::connect(srv.grpc);
    let three = [
        (OK, vec![(OK, 2)]),
        (OK, vec![(OK, 1)]),
        (OK, vec![(OK, 0)]),
        (OVER, vec![(OVER, 0)]),
    ];

    // The request's 0.
    let seen: Vec<_> = (0..4)
        .map(|_| rls.brief(req(vec![desc("plain", "r0", None)], 0)))
        .collect();
    assert_eq!(seen, three);
    // A descriptor's own 0, over the request's 2: counts nothing, 3 left.
    let zero = || req(vec![desc("plain", "d0", Some(0))], 2);
    let seen: Vec<_> = (0..2).map(|_| rls.brief(zero())).collect();
    assert_eq!(seen, [(OK, vec![(OK, 3)]), (OK, vec![(OK, 3)])]);
    let one = || req(vec![desc("plain", "d0", Some(1))], 0);
    let seen: Vec<_> = (0..3).map(|_| rls.brief(one())).collect();
    assert_eq!(seen, three[..3]);
    // At the limit: OK with nothing left; one more (counted, over) and it is over.
    assert_eq!(rls.brief(zero()), (OK, vec![(OK, 0)]));
    assert_eq!(rls.brief(one()), (OVER, vec![(OVER, 0)]));
    assert_eq!(rls.brief(zero()), (OVER, vec![(OVER, 0)]));
    // Against the request's 2 alone: 2, then 2 more is over.
    let seen: Vec<_> = (0..2)
        .map(|_| rls.brief(req(vec![desc("plain", "r2", None)], 2)))
        .collect();
    assert_eq!(seen, [(OK, vec![(OK, 1)]), (OVER, vec![(OVER, 0)])]);

    // The JSON API: `"hitsAddend": 0` on the request counts 1; on the descriptor (over a 2)
    // it counts nothing.
    let four = |r: u64| {
        [
            (200, json!(r)),
            (200, json!(r)),
            (200, json!(r)),
            (200, json!(r)),
        ]
    };
    let seen: Vec<(u16, Value)> = (0..4)
        .map(|_| {
            let (status, b) = post(
                srv.http,
                "/v1/check",
                &body("plain", "jd0", Some(0), Some(2)),
            );
            (status, b["statuses"][0]["limitRemaining"].clone())
        })
        .collect();
    assert_eq!(seen, four(3));
    let seen: Vec<(u16, Value)> = (0..4)
        .map(|_| {
            let (status, b) = post(srv.http, "/v1/check", &body("plain", "j0", None, Some(0)));
            (status, b["statuses"][0]["limitRemaining"].clone())
        })
        .collect();
    let json_three = [
        (200, json!(2)),
        (200, json!(1)),
        (200, json!(0)),
        (429, json!(0)),
    ];
    assert_eq!(seen, json_three);

    // Counted: 1 a hit, 2 for the cost of 2, nothing for a descriptor's 0.
    assert_eq!(counter(srv.http, "allowed", "plain"), 3 + 3 + 2 + 3);
    assert_eq!(counter(srv.http, "over_limit", "plain"), 1 + 1 + 2 + 1);
}

// ---- A cost above the limit ----

// A cost above a rule's limit is over the limit (not an error), with a whole unit to wait:
// each algorithm whose capacity is its limit, over gRPC and the JSON API. A fixed window that
// counts over-limit hits (a rule without its own `policy`) is then over for the rest of its
// window, as envoyproxy/ratelimit's counter is after its `INCRBY`; the others count nothing
// against the key. (EARRRL's capacity is ⌊R·half-life/ln 2⌋ and a GCRA's its `burst`:
// reported, not pinned here.)
// Pins G74.
#[test]
fn a_cost_above_a_rules_limit_is_over_the_limit() {
    let (_dir, config) = rules("details-cost");
    let srv = server(&config, &[]);
    let mut rls = Rls::connect(srv.grpc);
    let over = DescriptorStatus {
        code: OVER,
        current_limit: Some(PbRateLimit {
            name: String::new(),
            requests_per_unit: 5,
            unit: PbUnit::Day as i32,
        }),
        limit_remaining: 0,
        duration_until_reset: Some(PbDuration {
            seconds: 86_400,
            nanos: 0,
        }),
        ..Default::default()
    };
    let algorithms = [
        "fixed_window",
        "sliding_window",
        "sub_window",
        "sliding_log",
        "gcra",
        "exponential",
    ];
    for key in algorithms {
        // 6 of 5, the request's cost and a descriptor's own.
        for (d, r) in [(None, 6), (Some(6), 1)] {
            let answer = rls.call(req(vec![desc(key, "c", d)], r)).unwrap();
            assert_eq!(answer.overall_code, OVER, "{key}");
            assert_eq!(answer.statuses, std::slice::from_ref(&over), "{key}");
            assert!(answer.response_headers_to_add.is_empty(), "{key}");
        }
        let five = rls.brief(req(vec![desc(key, "c", Some(5))], 0));
        let one = rls.brief(req(vec![desc(key, "c", None)], 0));
        assert_eq!(one, (OVER, vec![(OVER, 0)]), "{key}");
        if key == "fixed_window" {
            // Pinned past its limit: even 5 is over until the window ends.
            assert_eq!(five, (OVER, vec![(OVER, 0)]), "{key}");
            assert_eq!(counter(srv.http, "allowed", key), 0, "{key}");
            assert_eq!(counter(srv.http, "over_limit", key), 6 + 6 + 5 + 1, "{key}");
        } else {
            // Nothing counted: all 5 at once still admitted, then nothing.
            assert_eq!(five, (OK, vec![(OK, 0)]), "{key}");
            assert_eq!(counter(srv.http, "allowed", key), 5, "{key}");
            assert_eq!(counter(srv.http, "over_limit", key), 6 + 6 + 1, "{key}");
        }
    }

    // The JSON API: a 429, the whole answer exactly.
    let (status, answer) = post(
        srv.http,
        "/v1/check",
        &body("fixed_window", "j", Some(6), None),
    );
    assert_eq!(status, 429);
    assert_eq!(
        answer,
        json!({"overallCode": "OVER_LIMIT", "statuses": [{"code": "OVER_LIMIT",
            "currentLimit": {"requestsPerUnit": 5, "unit": "DAY"}, "limitRemaining": 0,
            "durationUntilReset": "86400s"}]})
    );
    // A take too: over, no ticket.
    let (status, answer) = post(
        srv.http,
        "/v1/take",
        &body("fixed_window", "j", None, Some(6)),
    );
    assert_eq!((status, answer.get("ticket")), (429, None));
    assert_eq!(
        post(
            srv.http,
            "/v1/check",
            &body("fixed_window", "j", Some(1), None)
        )
        .0,
        429
    );
    // A peek of a cost above the limit counts nothing, pinned or not.
    let (status, _) = post(
        srv.http,
        "/v1/peek",
        &body("fixed_window", "k", Some(6), None),
    );
    assert_eq!(status, 429);
    assert_eq!(
        post(
            srv.http,
            "/v1/check",
            &body("fixed_window", "k", Some(5), None)
        )
        .0,
        200
    );
}

// ---- Tickets: nothing kept per open ticket ----

// A ticket is a signed token, nothing kept for it while open: after one client took 100,000
// tickets, another's take is answered and settles; a settled ticket's second settle is a 404,
// and so is a ticket with one character changed. (Expiry and the settled set's bound:
// `src/service.rs`'s unit tests; forgery against a running server: tests/hostile.rs.)
// Pins G74.
#[test]
fn after_100_000_open_tickets_another_take_is_answered_and_settles_once() {
    let rt = runtime();
    let service = rt.block_on(async {
        let settings = Settings::memory();
        assert_eq!(settings.ticket_ttl, Duration::from_secs(60));
        let source = [(Path::new("g74.yaml").to_path_buf(), RULES.to_owned())];
        let service = Service::from_sources(&source, settings).await.unwrap();
        let take = Request {
            domain: "g74".into(),
            descriptors: vec![Descriptor {
                entries: vec![("ticket".into(), "t".into())],
                ..Descriptor::default()
            }],
            hits: 1,
        };
        for _ in 1..=100_000 {
            let answer = service.decide(&take, Op::Take).await.unwrap();
            assert!(answer.ticket.is_some());
        }
        assert_eq!(service.settled_tickets(), 0);
        service
    });
    let api = InProcess::serve(Arc::new(service));
    let take = body("ticket", "t", None, None);
    let (status, answer) = post(api.port, "/v1/take", &take);
    assert_eq!(status, 200, "{answer}");
    let token = answer["ticket"].as_str().unwrap().to_owned();
    let settle = json!({"ticket": token, "actual": 1}).to_string();
    assert_eq!(
        post(api.port, "/v1/settle", &settle),
        (200, json!({"settled": true}))
    );
    let unknown = json!({"error": "no such open ticket"});
    assert_eq!(
        post(api.port, "/v1/settle", &settle),
        (404, unknown.clone())
    );
    let (status, answer) = post(api.port, "/v1/take", &take);
    assert_eq!(status, 200, "{answer}");
    let mut forged = answer["ticket"].as_str().unwrap().to_owned().into_bytes();
    let at = forged.len() / 3;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let settle = json!({"ticket": forged, "actual": 1}).to_string();
    assert_eq!(post(api.port, "/v1/settle", &settle), (404, unknown));
}

// ---- The JSON API's errors ----

// A backend failure (Redis gone) is a 503 with `{"error": ...}` on every decision path, and
// counted in `hotlimit_backend_errors_total`; gRPC answers UNAVAILABLE.
// Pins G74.
#[test]
fn the_json_api_answers_503_when_the_redis_backend_is_gone() {
    let Some(redis) = common::redis() else {
        return;
    };
    let (_dir, config) = rules("details-503");
    let srv = server(
        &config,
        &["--backend", "redis", "--redis-url", &redis.url()],
    );
    let check = body("plain", "r", None, None);
    assert_eq!(post(srv.http, "/v1/check", &check).0, 200);

    drop(redis);
    for path in ["/v1/check", "/json", "/v1/peek", "/v1/take"] {
        let (status, answer) = post(srv.http, path, &check);
        assert_eq!(status, 503, "{path}: {answer}");
        let error = answer.as_object().unwrap();
        assert_eq!(error.len(), 1, "{path}: {answer}");
        let message = error["error"].as_str().unwrap();
        assert!(message.starts_with("g74.plain: "), "{path}: {message}");
    }
    let mut rls = Rls::connect(srv.grpc);
    let status = rls
        .call(req(vec![desc("plain", "r", None)], 0))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(metric(srv.http, "hotlimit_backend_errors_total"), 5);
}

// A malformed body is a 400 with `{"error": ...}` on every path, and counts nothing: no hit,
// no ticket, no settle; the key then admits its full limit.
// Pins G74.
#[test]
fn a_malformed_body_is_a_400_with_an_error_and_counts_nothing() {
    let (_dir, config) = rules("details-400");
    let srv = server(&config, &[]);
    let entry = r#"{"entries": [{"key": "plain", "value": "m"}]}"#;
    // The body, and the error's exact text where it is the service's own.
    let malformed: [(String, Option<&str>); 10] = [
        ("not json".into(), None),
        (String::new(), None),
        (format!(r#"{{"domain": "g74", "descriptors": [{entry}]"#), None),
        (format!(r#"{{"descriptors": [{entry}]}}"#), None),
        (format!(r#"{{"domain": "g74", "descriptors": [{entry}], "x": 1}}"#), None),
        (format!(r#"{{"domain": "g74", "descriptors": [{entry}], "hitsAddend": -1}}"#), None),
        (
            r#"{"domain": "g74", "descriptors": [{"entries": [{"key": "plain", "value": "m"}], "isNegativeHits": true}]}"#.into(),
            None,
        ),
        (
            format!(r#"{{"domain": "", "descriptors": [{entry}]}}"#),
            Some("rate limit domain must not be empty"),
        ),
        (
            r#"{"domain": "g74", "descriptors": []}"#.into(),
            Some("rate limit descriptor list must not be empty"),
        ),
        // The first descriptor is sound: it is not counted either.
        (
            format!(r#"{{"domain": "g74", "descriptors": [{entry}, {{"entries": []}}]}}"#),
            Some("a descriptor has no entries"),
        ),
    ];
    for path in ["/v1/check", "/json", "/v1/peek", "/v1/take"] {
        for (text, reason) in &malformed {
            let (status, answer) = post(srv.http, path, text);
            assert_eq!(status, 400, "{path} {text}: {answer}");
            let error = answer.as_object().unwrap();
            assert_eq!(error.len(), 1, "{path} {text}: {answer}");
            let message = error["error"].as_str().unwrap();
            assert!(!message.is_empty(), "{path} {text}");
            if let Some(reason) = reason {
                assert_eq!(message, *reason, "{path} {text}");
            }
        }
    }
    assert_eq!(counter(srv.http, "allowed", "plain"), 0);
    assert_eq!(counter(srv.http, "over_limit", "plain"), 0);
    assert_eq!(metric(srv.http, "hotlimit_unmatched_total"), 0);

    // Nothing was charged: a take of plain=m leaves 2 of its 3.
    let (status, taken) = post(srv.http, "/v1/take", &body("plain", "m", None, None));
    assert_eq!(status, 200);
    let token = taken["ticket"].as_str().unwrap();
    assert_eq!(taken["statuses"][0]["limitRemaining"], json!(2));
    // A malformed settle settles nothing: the ticket still settles once.
    let missing = json!({ "ticket": token }).to_string();
    for text in [missing.as_str(), r#"{"ticket": 1, "actual": 1}"#, "{"] {
        let (status, answer) = post(srv.http, "/v1/settle", text);
        assert_eq!(status, 400, "{text}: {answer}");
        assert!(answer["error"].is_string(), "{text}: {answer}");
    }
    let settle = json!({ "ticket": token, "actual": 1 }).to_string();
    let settled = post(srv.http, "/v1/settle", &settle);
    assert_eq!(settled, (200, json!({"settled": true})));
    let codes: Vec<u16> = (0..3)
        .map(|_| post(srv.http, "/v1/check", &body("plain", "m", None, None)).0)
        .collect();
    assert_eq!(codes, [200, 200, 429]);
    assert_eq!(counter(srv.http, "allowed", "plain"), 3);
}

// A take whose ticket would be too long for its settle's body (`--max-body-bytes`) is refused
// with 413 and gives back what it charged; one whose ticket fits is settled as ever.
// Pins G75.
#[test]
fn a_take_whose_ticket_no_settle_could_carry_is_refused_and_charges_nothing() {
    let (_dir, config) = rules("details-ticket-size");
    let srv = server(&config, &["--max-body-bytes", "4096"]);
    // Descriptors of `plain` with values of 200 bytes: each part of a ticket names the rule,
    // the descriptor's key and the charge, base64 on top.
    let take = |n: usize| {
        let descriptors: Vec<Value> = (0..n)
            .map(|i| json!({"entries": [{"key": "plain", "value": format!("{i:0>200}")}]}))
            .collect();
        json!({"domain": "g74", "descriptors": descriptors}).to_string()
    };
    let big = take(14);
    assert!(big.len() < 4096, "the take itself is within the bound");
    let (status, answer) = post(srv.http, "/v1/take", &big);
    assert_eq!(status, 413, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("ticket would be"),
        "{answer}"
    );
    assert_eq!(
        metric(
            srv.http,
            r#"hotlimit_rejected_total{reason="ticket_too_large"}"#
        ),
        1
    );
    // Nor counted: what it charged was given back.
    assert_eq!(counter(srv.http, "allowed", "plain"), 0);
    // Nothing stays charged: each of those keys has its 3 whole (a check leaves 2).
    let (status, answer) = post(srv.http, "/v1/check", &take(14));
    assert_eq!(status, 200, "{answer}");
    for s in answer["statuses"].as_array().unwrap() {
        assert_eq!(s["limitRemaining"], json!(2), "{answer}");
    }
    assert_eq!(counter(srv.http, "allowed", "plain"), 14);
    // A take of a few: its ticket fits, and settles.
    let (status, taken) = post(srv.http, "/v1/take", &take(3));
    assert_eq!(status, 200, "{taken}");
    let settle = json!({ "ticket": taken["ticket"], "actual": 0 }).to_string();
    assert_eq!(
        post(srv.http, "/v1/settle", &settle),
        (200, json!({"settled": true}))
    );
}

// Pins G75.
#[test]
fn descriptor_and_entry_limits_above_what_the_json_api_reads_are_refused_at_the_start() {
    // The JSON API reads at most 4,096 descriptors of a request, and entries of one: a limit
    // above that could admit a request it does not read whole.
    let (_dir, config) = rules("details-kept");
    for option in ["--max-descriptors", "--max-entries"] {
        let out = Command::new(env!("CARGO_BIN_EXE_hotlimit-server"))
            .arg("--config")
            .arg(&config)
            .args(["--grpc", &format!("127.0.0.1:{}", free_port())])
            .args(["--http", &format!("127.0.0.1:{}", free_port())])
            .args([option, "4097"])
            .output()
            .expect("run hotlimit-server");
        assert_eq!(out.status.code(), Some(2), "{option}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("4097 is not in 1..=4096"), "{option}: {err}");
    }
    // At it: served.
    let srv = server(
        &config,
        &["--max-descriptors", "4096", "--max-entries", "4096"],
    );
    let (status, answer) = post(srv.http, "/v1/check", &body("plain", "p", None, None));
    assert_eq!(status, 200, "{answer}");
}

// ---- SIGTERM ----

// SIGTERM with a gRPC call and a JSON API check in flight (their headers read by the server,
// their bodies held back): the server stops taking connections, both are answered, decided
// and counted, then it exits 0.
// Pins G74.
#[test]
fn sigterm_answers_the_requests_in_flight_then_exits_0() {
    let (_dir, config) = rules("details-term");
    let (mut srv, log) = server_logged(&config, &[], &[]);
    let rt = runtime();
    let url = format!("http://127.0.0.1:{}", srv.grpc);
    let endpoint = Endpoint::from_shared(url).unwrap();
    let channel = rt.block_on(endpoint.connect()).expect("connect over gRPC");

    // gRPC: a call whose headers are sent and whose message is held.
    let (call, release) = hold(&rt, &channel);
    // A call after it on the same connection answered: the server has read the held one's
    // headers (HTTP/2 frames are read in order).
    let mut rls = RateLimitServiceClient::new(channel);
    let after = rt.block_on(rls.should_rate_limit(req(vec![desc("plain", "after", None)], 0)));
    assert_eq!(brief(&after.unwrap().into_inner()), (OK, vec![(OK, 2)]));

    // HTTP: a check whose body the server has asked for (100 Continue), and is held.
    let check = body("plain", "http", None, None);
    let mut http = TcpStream::connect(("127.0.0.1", srv.http)).unwrap();
    http.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        check.len()
    );
    http.write_all(head.as_bytes()).unwrap();
    assert_eq!(read_head(&mut http), "HTTP/1.1 100 Continue\r\n\r\n");

    // SIGTERM: logged, then neither port takes a connection.
    signal(&srv.proc, "TERM");
    logged(
        &log,
        "hotlimit-server: shutting down (in-flight requests finish)",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while [srv.grpc, srv.http]
        .iter()
        .any(|&p| TcpStream::connect(("127.0.0.1", p)).is_ok())
    {
        assert!(
            Instant::now() < deadline,
            "the server still takes connections"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // Both answered, decided and counted.
    http.write_all(check.as_bytes()).unwrap();
    let mut response = String::new();
    http.read_to_string(&mut response).unwrap();
    let (head, json_body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    let answer: Value = serde_json::from_str(json_body).unwrap();
    assert_eq!(answer["overallCode"], "OK", "{answer}");
    assert_eq!(
        answer["statuses"][0]["limitRemaining"],
        json!(2),
        "{answer}"
    );
    release
        .send(req(vec![desc("plain", "grpc", None)], 0))
        .unwrap();
    let answer = rt.block_on(call).unwrap().expect("the held call answered");
    assert_eq!(brief(&answer), (OK, vec![(OK, 2)]));

    // Then it exits 0.
    drop((rls, rt));
    assert!(exited(&mut srv.proc).success());
}

// SIGHUP and SIGTERM the moment the ports listen are the server's to handle, never their
// default action (the process ended at once): the SIGHUP reloads, the SIGTERM exits 0. Sent
// by bash's builtin `kill` the moment the HTTP port (bound last) takes a connection (a `kill`
// process starts too late to hit the window this closed, 4 starts in 10); ten starts.
// Pins G74.
#[test]
fn signals_as_soon_as_the_ports_listen_are_handled() {
    let (_dir, config) = rules("details-early");
    let script = r#"until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do ((SECONDS < 30)) || exit 1; done
kill -HUP "$2"; kill -TERM "$2""#;
    for _ in 0..10 {
        let (mut srv, log) = spawn_logged(&config, &["--reload-ms", "0"], &[]);
        let sent = Command::new("bash")
            .args(["-c", script, "bash", &srv.http.to_string()])
            .arg(srv.proc.0.id().to_string())
            .status()
            .expect("run bash");
        assert!(sent.success(), "the server never listened");
        logged(
            &log,
            "hotlimit-server: shutting down (in-flight requests finish)",
        );
        assert!(exited(&mut srv.proc).success());
    }
}

// ---- Configuration errors ----

/// A configuration whose nested descriptor (line 9, column 7) has a bad unit.
const BAD_UNIT: &str = "domain: g74
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: path
    descriptors:
    - key: method
      rate_limit: {unit: fortnight, requests_per_unit: 1}
";

// A configuration error names the file, the line and column, and the reason: loaded, at the
// start (the server exits 1) and on a reload (logged, the running configuration kept).
// Pins G74.
#[test]
fn a_configuration_error_names_its_file_line_and_column() {
    let reason = "invalid rate limit unit 'fortnight'";
    let err = Config::from_sources([(Path::new("example.yaml"), BAD_UNIT)]).unwrap_err();
    assert_eq!(err.location, Some((9, 7)));
    assert_eq!(err.to_string(), format!("example.yaml:9:7: {reason}"));

    // At the start: the error on stderr, exit 1, nothing served.
    let dir = Scratch::new("details-config");
    let bad = dir.write("bad.yaml", BAD_UNIT);
    let out = Command::new(env!("CARGO_BIN_EXE_hotlimit-server"))
        .arg("--config")
        .arg(&bad)
        .args(["--grpc", &format!("127.0.0.1:{}", free_port())])
        .args(["--http", &format!("127.0.0.1:{}", free_port())])
        .output()
        .expect("run hotlimit-server");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("hotlimit-server: {}:9:7: {reason}\n", bad.display())
    );

    // On a reload (SIGHUP): logged with its place, the running configuration kept.
    let good = dir.write("g74.yaml", &BAD_UNIT.replace("fortnight", "minute"));
    let (srv, log) = server_logged(&good, &["--reload-ms", "0"], &[]);
    std::fs::write(&good, BAD_UNIT).unwrap();
    signal(&srv.proc, "HUP");
    logged(
        &log,
        &format!(
            "hotlimit-server: configuration rejected, the running one kept: {}:9:7: {reason}",
            good.display()
        ),
    );
    assert_eq!(metric(srv.http, "hotlimit_config_load_error_total"), 1);
    let method = r#"{"domain": "g74", "descriptors": [{"entries": [{"key": "path", "value": "/"}, {"key": "method", "value": "GET"}]}]}"#;
    let (status, answer) = post(srv.http, "/v1/check", method);
    assert_eq!(status, 200);
    assert_eq!(
        answer["statuses"][0]["currentLimit"],
        json!({"requestsPerUnit": 1, "unit": "MINUTE"})
    );
}

// ---- /healthcheck ----

// `GET /healthcheck` answers 200 `OK`.
// Pins G74.
#[test]
fn healthcheck_answers_ok() {
    let (_dir, config) = rules("details-health");
    let srv = server(&config, &[]);
    let mut resp = client()
        .get(format!("http://127.0.0.1:{}/healthcheck", srv.http))
        .call()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.body_mut().read_to_string().unwrap(), "OK");
}

// ---- --shadow-mode ----

// `--shadow-mode` (or `HOTLIMIT_SHADOW_MODE`): every request answered OK (200 on the JSON
// API), whatever each rule decides, still counting: the breaches in
// `hotlimit_shadow_mode_total`. As envoyproxy/ratelimit's `SHADOW_MODE`, each descriptor's
// status keeps the rule's decision.
// Pins G74.
#[test]
fn shadow_mode_answers_ok_to_every_rule_and_still_counts() {
    let (_dir, config) = rules("details-shadow");
    let (flag, _) = server_logged(&config, &["--shadow-mode"], &[]);
    let (env, _) = server_logged(&config, &[], &[("HOTLIMIT_SHADOW_MODE", "true")]);
    for srv in [flag, env] {
        let mut rls = Rls::connect(srv.grpc);
        let seen: Vec<_> = (0..5)
            .map(|_| rls.brief(req(vec![desc("plain", "s", None)], 0)))
            .collect();
        assert_eq!(
            seen,
            [
                (OK, vec![(OK, 2)]),
                (OK, vec![(OK, 1)]),
                (OK, vec![(OK, 0)]),
                (OK, vec![(OVER, 0)]),
                (OK, vec![(OVER, 0)]),
            ]
        );
        // A rule of 0, a cost above the limit, several descriptors over: OK.
        let blocked = rls.brief(req(vec![desc("blocked", "s", None)], 0));
        assert_eq!(blocked, (OK, vec![(OVER, 0)]));
        let cost = rls.brief(req(vec![desc("fixed_window", "s", Some(6))], 0));
        assert_eq!(cost, (OK, vec![(OVER, 0)]));
        let quota = vec![desc("quota_a", "s", Some(2)), desc("plain", "s", None)];
        assert_eq!(rls.brief(req(quota, 0)), (OK, vec![(OVER, 0), (OVER, 0)]));
        let (status, answer) = post(srv.http, "/v1/check", &body("plain", "s", None, None));
        assert_eq!(status, 200);
        assert_eq!(answer["overallCode"], "OK");

        assert_eq!(counter(srv.http, "allowed", "plain"), 3);
        assert_eq!(counter(srv.http, "shadow_mode", "plain"), 2 + 1 + 1);
        assert_eq!(counter(srv.http, "over_limit", "plain"), 0);
        assert_eq!(counter(srv.http, "shadow_mode", "blocked"), 1);
        assert_eq!(counter(srv.http, "shadow_mode", "fixed_window"), 6);
        assert_eq!(counter(srv.http, "shadow_mode", "quota_a"), 2);
    }
}

// ---- envoyproxy/ratelimit's JSON and counting ----

// `hitsAddend` as protobuf's JSON writers may send it, a string, is read as the number; the
// request's field is a `uint32`: 2^32 is a 400 that counts nothing. A descriptor's is a
// `UInt64Value`: a string too.
// Pins G74.
#[test]
fn hits_addend_as_a_string_is_read_and_the_requests_is_a_uint32() {
    let (_dir, config) = rules("details-json");
    let srv = server(&config, &[]);
    let text = |hits: &str| {
        format!(
            r#"{{"domain":"g74","descriptors":[{{"entries":[{{"key":"plain","value":"s"}}]}}],"hitsAddend":{hits}}}"#
        )
    };
    let (status, answer) = post(srv.http, "/v1/check", &text(r#""2""#));
    assert_eq!(
        (status, &answer["statuses"][0]["limitRemaining"]),
        (200, &json!(1))
    );
    for hits in ["4294967296", r#""4294967296""#] {
        let (status, answer) = post(srv.http, "/v1/check", &text(hits));
        assert_eq!(status, 400, "{answer}");
        assert_eq!(
            answer["error"],
            json!("hitsAddend 4294967296 is above 4294967295 (a uint32)")
        );
    }
    let (status, answer) = post(srv.http, "/v1/check", &text(r#""two""#));
    assert_eq!(status, 400, "{answer}");
    let descriptor = r#"{"domain":"g74","descriptors":[{"entries":[{"key":"plain","value":"s"}],"hitsAddend":"1"}]}"#;
    let (status, answer) = post(srv.http, "/v1/check", descriptor);
    assert_eq!(
        (status, &answer["statuses"][0]["limitRemaining"]),
        (200, &json!(0))
    );
    assert_eq!(
        metric(srv.http, "hotlimit_rejected_total{reason=\"cost\"}"),
        2
    );
    assert_eq!(
        metric(srv.http, "hotlimit_rejected_total{reason=\"malformed\"}"),
        1
    );
}

// Over-limit hits count, as envoyproxy/ratelimit counts them (a fixed window without its own
// policy): on 3 a day, 2 then 2 (over, counted) leaves nothing for a 1; with
// `--stop-cache-key-increment-when-overlimit` too, as there (its `getHitsAddend`: the key going
// over is incremented). What that flag changes is the request's other descriptors: a request
// over on `plain` counts nothing on `fixed_window` (5 a day: 2 + 2 of 3 such requests counted
// without it, 2 with it).
// Pins G74.
#[test]
fn over_limit_hits_count_and_stop_cache_key_increment_spares_the_other_descriptors() {
    let (_dir, config) = rules("details-overlimit");
    for (args, fixed_left) in [
        (&[][..], 1),
        (&["--stop-cache-key-increment-when-overlimit"][..], 3),
    ] {
        let srv = server(&config, args);
        let codes: Vec<u16> = [2, 2, 1]
            .iter()
            .map(|&h| post(srv.http, "/v1/check", &body("plain", "o", Some(h), None)).0)
            .collect();
        assert_eq!(codes, [200, 429, 429], "{args:?}");
        let both = json!({"domain": "g74", "hitsAddend": 2, "descriptors": [
            {"entries": [{"key": "plain", "value": "p"}]},
            {"entries": [{"key": "fixed_window", "value": "p"}]},
        ]})
        .to_string();
        let codes: Vec<u16> = (0..2)
            .map(|_| post(srv.http, "/v1/check", &both).0)
            .collect();
        assert_eq!(codes, [200, 429], "{args:?}");
        let (_, peek) = post(srv.http, "/v1/peek", &body("fixed_window", "p", None, None));
        assert_eq!(
            peek["statuses"][0]["limitRemaining"],
            fixed_left - 1,
            "{args:?}: {peek}"
        );
    }
}

// `/healthcheck` answers 200 while Redis is gone, unless `--health-checks-backend`: then 503
// (with the error) while the backend does not answer.
// Pins G74.
#[test]
fn healthcheck_fails_while_the_backend_is_gone_only_when_asked_to() {
    let Some(redis) = common::redis() else {
        return;
    };
    let (_dir, config) = rules("details-health-backend");
    let url = redis.url();
    let plain = server(&config, &["--backend", "redis", "--redis-url", &url]);
    let strict = server(
        &config,
        &[
            "--backend",
            "redis",
            "--redis-url",
            &url,
            "--health-checks-backend",
        ],
    );
    let health = |http: u16| {
        client()
            .get(format!("http://127.0.0.1:{http}/healthcheck"))
            .call()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!((health(plain.http), health(strict.http)), (200, 200));
    drop(redis);
    assert_eq!((health(plain.http), health(strict.http)), (200, 503));
}

// The gRPC port's calls share one limit, as the HTTP port's requests do: with
// `--max-concurrent 1`, a call whose message is held on one connection holds the one place,
// and a call on another connection is answered RESOURCE_EXHAUSTED at once (the limit was per
// connection: every connection had places of its own). Released, both are served.
// Pins G75.
#[test]
fn grpc_calls_on_every_connection_share_one_limit() {
    let (_dir, config) = rules("details-grpc-overload");
    let srv = server(
        &config,
        &["--max-concurrent", "1", "--request-timeout-ms", "30000"],
    );
    let rt = runtime();
    let url = format!("http://127.0.0.1:{}", srv.grpc);
    let connect = || {
        rt.block_on(Endpoint::from_shared(url.clone()).unwrap().connect())
            .expect("connect over gRPC")
    };
    let (held_conn, other_conn) = (connect(), connect());
    let call_on = |client: &mut RateLimitServiceClient<Channel>, value: &str| {
        rt.block_on(client.should_rate_limit(req(vec![desc("ticket", value, None)], 0)))
    };
    // It holds the one place once a call on its own connection is shed. (A call that came
    // first and took the place while the held one's headers arrived had it shed: it is
    // held again.)
    // A call whose message is held, on the first connection; `release` sends it.
    let (mut call, mut release) = hold(&rt, &held_conn);
    let mut own = RateLimitServiceClient::new(held_conn.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while call_on(&mut own, "own").is_ok() {
        assert!(
            Instant::now() < deadline,
            "the held call never held the place"
        );
        if call.is_finished() {
            (call, release) = hold(&rt, &held_conn);
        }
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(20)).await });
    }
    // A call on the other connection is shed too, at once: one limit for all.
    let mut other = RateLimitServiceClient::new(other_conn);
    let shed = call_on(&mut other, "other").expect_err("served: the limit is per connection");
    assert_eq!(shed.code(), tonic::Code::ResourceExhausted, "{shed:?}");
    assert_eq!(shed.message(), "overloaded: too many requests at once");
    // Released: the held call is answered, and the place is free again.
    release
        .send(req(vec![desc("plain", "held", None)], 0))
        .unwrap();
    let answered = rt.block_on(call).unwrap().expect("the held call answered");
    assert_eq!(brief(&answered), (OK, vec![(OK, 2)]));
    let again = rt.block_on(other.should_rate_limit(req(vec![desc("plain", "o", None)], 0)));
    assert_eq!(brief(&again.unwrap().into_inner()), (OK, vec![(OK, 2)]));
}

// A gRPC message over `--max-body-bytes` is refused by tonic before it is read whole, with
// OUT_OF_RANGE (tonic's code for it; docs/server.md says so), and not counted; the
// connection serves on.
// Pins G75.
#[test]
fn a_grpc_message_over_the_body_limit_is_refused_out_of_range_uncounted() {
    let (_dir, config) = rules("details-grpc-oversized");
    let srv = server(&config, &["--max-body-bytes", "1024"]);
    let rt = runtime();
    let url = format!("http://127.0.0.1:{}", srv.grpc);
    let channel = rt
        .block_on(Endpoint::from_shared(url).unwrap().connect())
        .expect("connect over gRPC");
    let mut client = RateLimitServiceClient::new(channel);
    let long = "v".repeat(2_000);
    let refused = rt
        .block_on(client.should_rate_limit(req(vec![desc("plain", &long, None)], 0)))
        .expect_err("a message over the limit was served");
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    let served = rt.block_on(client.should_rate_limit(req(vec![desc("plain", "p", None)], 0)));
    assert_eq!(brief(&served.unwrap().into_inner()), (OK, vec![(OK, 2)]));
    assert_eq!(counter(srv.http, "allowed", "plain"), 1);
}

// The HTTP server bounds its work: with `--max-concurrent 1`, a request whose body is still
// coming holds the one slot, and another is answered 503 at once (never queued); with
// `--request-timeout-ms 300`, the stalled one is answered 503 when its time is up. A body
// of 16 MiB is answered 413 with a JSON error, the connection not cut mid-upload.
// Pins G75.
#[test]
fn overload_and_slow_requests_are_answered_503_and_a_16_mib_body_413() {
    let (_dir, config) = rules("details-overload");
    let srv = server(
        &config,
        &["--max-concurrent", "1", "--request-timeout-ms", "300"],
    );
    let mut slow = TcpStream::connect(("127.0.0.1", srv.http)).unwrap();
    write!(
        slow,
        "POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{{\"domain\""
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    let (status, answer) = post(srv.http, "/v1/check", &body("plain", "x", None, None));
    assert_eq!(
        (status, answer["error"].as_str()),
        (503, Some("overloaded: too many requests at once"))
    );
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    let mut reply = String::new();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = slow.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(reply.contains("the request timed out"), "{reply}");
    // The slot is free again.
    assert_eq!(
        post(srv.http, "/v1/check", &body("plain", "x", None, None)).0,
        200
    );

    let big = format!(
        r#"{{"domain":"g74","descriptors":[{{"entries":[{{"key":"plain","value":"{}"}}]}}]}}"#,
        "v".repeat(16 * 1024 * 1024)
    );
    let srv = server(&config, &[]);
    let (status, answer) = post(srv.http, "/v1/check", &big);
    assert_eq!(
        (status, answer["error"].as_str()),
        (413, Some("the body is larger than 262144 bytes"))
    );
}

// A quota-mode request is over when every quota-mode descriptor its rules decide is: as
// envoyproxy/ratelimit counts them, a replaced rule's descriptor and an unlimited one's are not
// among them (each can never be over: counted, they kept the request OK forever).
// Pins G74.
#[test]
fn quota_mode_counts_only_the_descriptors_a_rule_decides() {
    let dir = Scratch::new("details-quota-replaced");
    let config = dir.write(
        "q.yaml",
        r#"
domain: q
descriptors:
  - key: plan
    value: premium
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 3, name: premium, replaces: [{name: default}]}
  - key: user
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1, name: default}
  - key: free
    quota_mode: true
    rate_limit: {unlimited: true}
"#,
    );
    let srv = server(&config, &[]);
    let check = |descriptors: &[(&str, &str)]| {
        let descriptors: Vec<Value> = descriptors
            .iter()
            .map(|(k, v)| json!({"entries": [{"key": k, "value": v}]}))
            .collect();
        let body = json!({"domain": "q", "descriptors": descriptors}).to_string();
        post(srv.http, "/v1/check", &body).0
    };
    // Premium replaces the user's default: its 3, then over.
    let premium = [("plan", "premium"), ("user", "alice")];
    let codes: Vec<u16> = (0..4).map(|_| check(&premium)).collect();
    assert_eq!(codes, [200, 200, 200, 429]);
    // An unlimited quota-mode descriptor beside the user's 1 a day.
    let free = [("user", "bob"), ("free", "x")];
    let codes: Vec<u16> = (0..2).map(|_| check(&free)).collect();
    assert_eq!(codes, [200, 429]);
}
