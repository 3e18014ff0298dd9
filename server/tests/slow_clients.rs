//! Slow and idle clients against a real `hotlimit-server` on loopback: a connection whose
//! headers never finish is closed after `--header-timeout-ms`, one past `--max-connections` is
//! closed as it is accepted, and API requests holding every request slot (bodies that never
//! come), on different routes, fill the one limit of all routes and leave `/healthcheck` and
//! `/metrics` answering. The gRPC port the same: a connection whose HTTP/2 preface never
//! finishes, or that answers no ping, is closed, and one past the cap too; and one past its
//! max age is sent GOAWAY, then closed after its grace.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{check, client, post, server, Scratch};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const RULES: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 100}
"#;

/// Connects to the HTTP port; reads give up after 5 s.
fn connect(http: u16) -> TcpStream {
    let tcp = TcpStream::connect(("127.0.0.1", http)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tcp
}

/// A connection on which `/healthcheck` was answered whole, kept open (keep-alive); `None`
/// if the server closed it instead.
fn served(http: u16) -> Option<TcpStream> {
    let mut tcp = connect(http);
    tcp.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 512];
    while !(reply.starts_with(b"HTTP/1.1 200") && reply.ends_with(b"\r\n\r\nOK")) {
        match tcp.read(&mut buf) {
            Ok(n) if n > 0 => reply.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    Some(tcp)
}

/// An API request whose headers are sent whole and whose body never comes: it holds a
/// request slot until its timeout.
fn hold(http: u16, path: &str) -> TcpStream {
    let mut tcp = connect(http);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"dom"
    );
    tcp.write_all(head.as_bytes()).unwrap();
    tcp
}

/// Whether anything came back on `tcp` yet (an answer, or its end), without waiting.
fn answered(tcp: &mut TcpStream) -> bool {
    tcp.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    let came = !matches!(tcp.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    tcp.set_nonblocking(false).unwrap();
    came
}

/// Whether the server closed `tcp` (end of stream, or a reset) within the read timeout,
/// whatever it sent first; `false` if it kept it open.
fn closed_by_server(tcp: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// On a server started with `--header-timeout-ms 300`: a connection to `port` that sends
/// `half` of what it must, then nothing, and one that never sends a byte, are both closed,
/// not before the timeout.
fn cut_off(port: u16, half: &[u8]) {
    let mut halfway = connect(port);
    halfway.write_all(half).unwrap();
    let mut silent = connect(port);
    let started = Instant::now();
    assert!(closed_by_server(&mut halfway), "never finished, still open");
    assert!(closed_by_server(&mut silent), "never a byte, still open");
    assert!(started.elapsed() >= Duration::from_millis(250));
}

// Pins G75.
#[test]
fn a_client_that_never_finishes_its_headers_is_cut_off() {
    let dir = Scratch::new("slow-headers");
    let config = dir.write("d.yaml", RULES);
    let srv = server(&config, &["--header-timeout-ms", "300"]);
    cut_off(
        srv.http,
        b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Ty",
    );

    // A client that sends its request whole is served as ever.
    assert_eq!(check(srv.http, "d", "user", "alice"), 200);
}

// Pins G75.
#[test]
fn api_requests_on_any_routes_share_one_limit_and_leave_the_probes_answering() {
    let dir = Scratch::new("slow-bodies");
    let config = dir.write("d.yaml", RULES);
    let srv = server(
        &config,
        &["--max-concurrent", "2", "--request-timeout-ms", "30000"],
    );

    // Two API requests on two routes whose bodies never come: each holds a request slot.
    // (One that meets a request of this test's in flight is shed, answered 503 at once: it
    // is sent again.)
    let paths = ["/v1/check", "/v1/peek"];
    let mut held: Vec<TcpStream> = paths.iter().map(|p| hold(srv.http, p)).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let overloaded = loop {
        for (h, path) in held.iter_mut().zip(paths) {
            if answered(h) {
                *h = hold(srv.http, path);
            }
        }
        // Every slot taken, the limit one for all routes: a request on a third is answered
        // 503 at once.
        let (status, body) = post(srv.http, "/v1/take", r#"{"domain":"d","descriptors":[]}"#);
        if status == 503 || Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        overloaded,
        (
            503,
            serde_json::json!({"error": "overloaded: too many requests at once"})
        )
    );
    // The probes answer all the same.
    let health = client()
        .get(format!("http://127.0.0.1:{}/healthcheck", srv.http))
        .call()
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let metrics = client()
        .get(format!("http://127.0.0.1:{}/metrics", srv.http))
        .call()
        .unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    drop(held);
}

/// Fills a port's cap of `cap` connections with connections `served` opens and the server
/// serves, kept open; then one more, sending `hello`, is closed as it is accepted, and once
/// one is closed by its client a new one is served again. Returns the `cap` open.
fn capped(
    port: u16,
    cap: usize,
    served: fn(u16) -> Option<TcpStream>,
    hello: &[u8],
) -> Vec<TcpStream> {
    // Each is served once before the next is opened: until the start's port probe is seen
    // closed, it holds a place of its own, and a connection opened meanwhile is refused; it
    // is opened again.
    let mut open = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while open.len() < cap && Instant::now() < deadline {
        if let Some(tcp) = served(port) {
            open.push(tcp);
        }
    }
    assert_eq!(open.len(), cap);
    // One more is closed as it is accepted, before anything is read from it.
    let mut past = connect(port);
    let _ = past.write_all(hello);
    assert!(closed_by_server(&mut past), "past the cap, still open");
    // One closed by its client frees its place.
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut again = None;
    while again.is_none() && Instant::now() < deadline {
        again = served(port);
    }
    open.push(again.expect("a freed place served nothing"));
    open
}

// Pins G75.
#[test]
fn a_connection_past_the_cap_is_closed_and_a_freed_one_serves_again() {
    let dir = Scratch::new("slow-connections");
    let config = dir.write("d.yaml", RULES);
    let srv = server(&config, &["--max-connections", "3"]);
    let http = capped(
        srv.http,
        3,
        served,
        b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    // The gRPC port's cap is its own: its three are served while the HTTP port's are taken.
    capped(srv.grpc, 3, spoke_http2, PREFACE);
    drop(http);
}

/// The HTTP/2 client preface and an empty SETTINGS frame: what a gRPC client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// A gRPC connection whose preface the server answered with its SETTINGS frame, kept open
/// (it answers nothing after); `None` if the server closed it instead.
fn spoke_http2(grpc: u16) -> Option<TcpStream> {
    let mut tcp = connect(grpc);
    tcp.write_all(PREFACE).ok()?;
    let mut head = [0u8; 9];
    tcp.read_exact(&mut head).ok()?;
    // A frame of type SETTINGS (4) on stream 0.
    (head[3] == 4 && head[5..] == [0; 4]).then_some(tcp)
}

/// The settings of the server's first SETTINGS frame on a fresh gRPC connection to `grpc`:
/// (identifier, value) pairs.
fn server_settings(grpc: u16) -> Vec<(u16, u32)> {
    let mut tcp = connect(grpc);
    tcp.write_all(PREFACE).unwrap();
    let mut head = [0u8; 9];
    tcp.read_exact(&mut head).unwrap();
    assert_eq!((head[3], &head[5..]), (4, &[0u8; 4][..]), "SETTINGS first");
    let mut body = vec![0; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
    tcp.read_exact(&mut body).unwrap();
    body.chunks(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect()
}

// A gRPC connection holds at most `--grpc-max-concurrent-streams` streams (100 by default),
// advertised as HTTP/2's MAX_CONCURRENT_STREAMS (3) and enforced by h2. tonic advertised none:
// one connection could open streams without bound, each holding its state and buffers for as
// long as its client did not read the answer (up to the connection's age).
// Pins G75.
#[test]
fn a_grpc_connection_advertises_and_holds_a_bounded_number_of_streams() {
    let dir = Scratch::new("grpc-streams");
    let config = dir.write("d.yaml", RULES);
    let default = server(&config, &[]);
    let settings = server_settings(default.grpc);
    assert!(settings.contains(&(3, 100)), "{settings:?}");
    let set = server(&config, &["--grpc-max-concurrent-streams", "7"]);
    let settings = server_settings(set.grpc);
    assert!(settings.contains(&(3, 7)), "{settings:?}");
}

/// `ShouldRateLimit` on `user=alice` over a channel of the runtime `rt`: its overall code.
fn rls_call(
    rt: &tokio::runtime::Runtime,
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
) -> i32 {
    let request = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "alice".into(),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let answer = rt
        .block_on(client.should_rate_limit(request))
        .expect("an answer");
    answer.into_inner().overall_code
}

// Pins G75.
#[test]
fn a_grpc_client_that_never_finishes_its_preface_or_answers_no_ping_is_cut_off() {
    let dir = Scratch::new("slow-grpc");
    let config = dir.write("d.yaml", RULES);
    let srv = server(&config, &["--header-timeout-ms", "300"]);
    cut_off(srv.grpc, b"PRI * HTTP/2.0\r\n");
    // A whole preface, then silence: pinged after 300 ms, closed 300 ms after that.
    let mut mute = spoke_http2(srv.grpc).expect("a whole preface is answered");
    assert!(closed_by_server(&mut mute), "answered no ping, still open");

    // A client that answers its pings keeps its connection, and is served across them.
    served_across(srv.grpc, Duration::from_millis(1_500));
}

/// A tonic client's call on `grpc`, `pause` of its runtime driven (its connection answering
/// the server's pings, connecting again after a GOAWAY), then another: both answered OK.
fn served_across(grpc: u16, pause: Duration) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("http://127.0.0.1:{grpc}");
    let mut client = rt
        .block_on(RateLimitServiceClient::connect(url))
        .expect("connect over gRPC");
    assert_eq!(rls_call(&rt, &mut client), Code::Ok as i32);
    rt.block_on(async { tokio::time::sleep(pause).await });
    assert_eq!(rls_call(&rt, &mut client), Code::Ok as i32);
}

/// The frame types read on `tcp` until the server closes it (or the read timeout, 5 s):
/// `None` if it kept it open.
fn frames_until_closed(tcp: &mut TcpStream) -> Option<Vec<u8>> {
    let mut types = Vec::new();
    loop {
        let mut head = [0u8; 9];
        match tcp.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Some(types),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(types),
            Err(_) => return None,
        }
        types.push(head[3]);
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut body = vec![0u8; len];
        if tcp.read_exact(&mut body).is_err() {
            return Some(types);
        }
    }
}

// Pins G75.
#[test]
fn a_grpc_connection_past_its_max_age_is_sent_goaway_then_closed_after_its_grace() {
    let dir = Scratch::new("grpc-age");
    let config = dir.write("d.yaml", RULES);
    // Pings only after 20 s of silence: the age, not the keepalive, ends it.
    let srv = server(
        &config,
        &[
            "--header-timeout-ms",
            "20000",
            "--grpc-max-connection-age",
            "500ms",
            "--grpc-max-connection-age-grace",
            "500ms",
        ],
    );
    // A connection that answers nothing (not the GOAWAY's ping either), so it is never done:
    // GOAWAY at its age, closed at its age and grace (envoyproxy/ratelimit's
    // GRPC_MAX_CONNECTION_AGE and _GRACE: no client holds a connection for good, however it
    // answers).
    let mut idle = connect(srv.grpc);
    idle.write_all(PREFACE).unwrap();
    // The client's SETTINGS frame (empty), completing its side of the handshake.
    idle.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    let started = Instant::now();
    let frames = frames_until_closed(&mut idle).expect("past its age and grace, still open");
    let took = started.elapsed();
    // SETTINGS (4) first, GOAWAY (7) before the end.
    assert_eq!(frames.first(), Some(&4), "frames {frames:?}");
    assert!(
        frames.contains(&7),
        "closed without GOAWAY after {took:?}: frames {frames:?}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "closed after {took:?}"
    );

    // A client's calls go on across its connection's age: it connects again.
    served_across(srv.grpc, Duration::from_millis(1_200));
}
