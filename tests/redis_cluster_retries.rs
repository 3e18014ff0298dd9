//! G73: a Redis Cluster request retries at most 3 times (redirections, `TRYAGAIN`, lost node
//! connections), waiting at most 50 ms between tries, and a redirection that never settles
//! surfaces as an error, not an outage; a node that never answers a connect is an outage
//! within one connect timeout per try, not a hang.
//!
//! Against a fake cluster node in this file (one node owning every slot, a minimal RESP2
//! server on 127.0.0.1): a real cluster cannot be made to redirect, or answer `TRYAGAIN`,
//! forever and on cue, and the fake logs when each script call arrived, so the count of
//! tries and the waits between them are read exactly, after the call has returned. The
//! client is the real one: `RedisLimiter::builder(url, algo).build()`, redis-rs' cluster
//! client as `cluster_client` configures it.

use hotlimit::algo::Gcra;
use hotlimit::redis::{BackendError, FailMode, RedisLimiter};
use hotlimit::Requests;
use redis::ErrorKind;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What the fake node answers to every `EVALSHA` / `EVAL`.
#[derive(Clone, Copy)]
enum OnEval {
    /// `-MOVED <slot> <itself>`: a redirection that never settles.
    Moved,
    /// `-ASK <slot> <itself>`: the same, as a migration.
    Ask,
    /// `-TRYAGAIN`: the one reply redis-rs retries after a wait (`WaitAndRetry`).
    TryAgain,
    /// Closes the connection without a reply: a lost node connection.
    Close,
    /// `-MOVED <slot> 127.0.0.1:<port>`: to a node that never answers a connect.
    MovedTo(u16),
}

/// A RESP2 reply.
enum Reply {
    Simple(&'static str),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Array(Vec<Reply>),
}

impl Reply {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Reply::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Reply::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Reply::Bulk(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                items.iter().for_each(|r| r.write(out));
            }
        }
    }
}

/// One node that owns slots 0-16383 and logs every command it gets, with its arrival time.
struct FakeNode {
    port: u16,
    log: Arc<Mutex<Vec<(String, Instant)>>>,
}

const NODE_ID: &str = "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca";

impl FakeNode {
    fn start(on_eval: OnEval) -> FakeNode {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let node_log = log.clone();
        // Lives until the test process ends, as do the connections' threads.
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let log = node_log.clone();
                thread::spawn(move || {
                    // An error is the client's disconnect: the connection ends.
                    let _ = serve(stream, port, on_eval, &log);
                });
            }
        });
        FakeNode { port, log }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The script calls so far, and the log cleared.
    fn take_evals(&self) -> Evals {
        let log = std::mem::take(&mut *self.log.lock().unwrap());
        Evals {
            at: log
                .iter()
                .filter(|(name, _)| name == "EVALSHA" || name == "EVAL")
                .map(|&(_, t)| t)
                .collect(),
            commands: log.into_iter().map(|(name, _)| name).collect(),
        }
    }

    /// What `call` returned, and the script calls it made: asserted to be [`TRIES`].
    fn tried<T>(&self, call: impl FnOnce() -> T) -> (T, Evals) {
        self.take_evals();
        let out = call();
        (out, self.tries_made())
    }

    /// [`tried`](Self::tried) for a future (lazy: nothing is sent before it is awaited).
    #[cfg(feature = "redis-async")]
    async fn tried_async<T>(&self, call: impl std::future::Future<Output = T>) -> (T, Evals) {
        self.take_evals();
        let out = call.await;
        (out, self.tries_made())
    }

    fn tries_made(&self) -> Evals {
        let evals = self.take_evals();
        assert_eq!(evals.at.len(), TRIES, "{:?}", evals.commands);
        evals
    }
}

/// The script calls' arrival times, and every command's name (for failure messages).
struct Evals {
    at: Vec<Instant>,
    commands: Vec<String>,
}

impl Evals {
    /// The gaps between consecutive arrivals.
    fn gaps(&self) -> Vec<Duration> {
        self.at.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

/// One RESP2 command (an array of bulk strings), or `None` at the end of the stream.
fn read_command(r: &mut impl BufRead) -> io::Result<Option<Vec<Vec<u8>>>> {
    let bad = || io::Error::from(io::ErrorKind::InvalidData);
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let n: usize = line
        .trim_end()
        .strip_prefix('*')
        .and_then(|n| n.parse().ok())
        .ok_or_else(bad)?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line)?;
        let len: usize = line
            .trim_end()
            .strip_prefix('$')
            .and_then(|n| n.parse().ok())
            .ok_or_else(bad)?;
        let mut arg = vec![0; len + 2];
        r.read_exact(&mut arg)?;
        arg.truncate(len);
        args.push(arg);
    }
    Ok(Some(args))
}

/// Redis Cluster's slot of a key (its hash tag's, if it has one).
fn slot(key: &[u8]) -> u16 {
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key)) % 16384
}

fn serve(
    stream: TcpStream,
    port: u16,
    on_eval: OnEval,
    log: &Mutex<Vec<(String, Instant)>>,
) -> io::Result<()> {
    // As Redis does: no Nagle delay on a second small reply (40 ms with a delayed ACK).
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    while let Some(args) = read_command(&mut reader)? {
        let name = String::from_utf8_lossy(args.first().map_or(&[][..], |a| a)).to_uppercase();
        let sub = args
            .get(1)
            .map(|a| String::from_utf8_lossy(a).to_uppercase())
            .unwrap_or_default();
        log.lock().unwrap().push((name.clone(), Instant::now()));
        let me = format!("127.0.0.1:{port}");
        let reply = match (name.as_str(), sub.as_str()) {
            ("PING", _) => Reply::Simple("PONG"),
            ("INFO", _) => Reply::Bulk(b"# Cluster\r\ncluster_enabled:1\r\n".to_vec()),
            ("CLUSTER", "NODES") => Reply::Bulk(
                format!(
                    "{NODE_ID} {me}@{} myself,master - 0 0 1 connected 0-16383\n",
                    port + 1
                )
                .into_bytes(),
            ),
            ("CLUSTER", "SLOTS") => Reply::Array(vec![Reply::Array(vec![
                Reply::Int(0),
                Reply::Int(16383),
                Reply::Array(vec![
                    Reply::Bulk(b"127.0.0.1".to_vec()),
                    Reply::Int(port.into()),
                    Reply::Bulk(NODE_ID.into()),
                ]),
            ])]),
            ("SCRIPT", "LOAD") => {
                let body = String::from_utf8_lossy(&args[2]).into_owned();
                Reply::Bulk(redis::Script::new(&body).get_hash().as_bytes().to_vec())
            }
            ("EVALSHA" | "EVAL", _) => {
                // EVALSHA sha numkeys key ...: the first key's slot, as a real node names it.
                let slot = args.get(3).map_or(0, |k| slot(k));
                match on_eval {
                    OnEval::Moved => Reply::Error(format!("MOVED {slot} {me}")),
                    OnEval::Ask => Reply::Error(format!("ASK {slot} {me}")),
                    OnEval::TryAgain => Reply::Error(
                        "TRYAGAIN Multiple keys request during rehashing of slot".into(),
                    ),
                    OnEval::Close => return Ok(()),
                    OnEval::MovedTo(to) => Reply::Error(format!("MOVED {slot} 127.0.0.1:{to}")),
                }
            }
            // `CLIENT SETINFO` (redis-rs ignores its reply), `ASKING`, `READONLY`.
            ("CLIENT" | "ASKING" | "READONLY", _) => Reply::Simple("OK"),
            _ => Reply::Error(format!("ERR unknown command '{name}'")),
        };
        let mut out = Vec::new();
        reply.write(&mut out);
        writer.write_all(&out)?;
    }
    Ok(())
}

/// The limiter under test: the default timeouts (250 ms connect, 500 ms I/O), the fail mode
/// open so that an outage and an error answer differently.
fn limiter(node: &FakeNode) -> RedisLimiter<Gcra> {
    let r = RedisLimiter::builder(node.url(), "10/s burst 5".parse::<Gcra>().unwrap())
        .fail_mode(FailMode::Open)
        .build()
        .unwrap();
    assert!(r.is_cluster());
    r
}

/// One try and `CLUSTER_RETRIES` (3) retries.
const TRIES: usize = 4;

/// Every gap between tries at most the 50 ms longest wait plus 250 ms of slack for a loaded
/// machine: still far below redis-rs' default waits (the first at least 1.28 s), so it tells
/// the configured waits from the defaults.
fn assert_waits_at_most_50_ms(evals: &Evals) {
    for gap in evals.gaps() {
        assert!(gap <= Duration::from_millis(50 + 250), "{gap:?}");
    }
}

/// As [`assert_waits_at_most_50_ms`], and a wait really happened before each retry: at least
/// the 5 ms minimum.
fn assert_waits_from_5_to_50_ms(evals: &Evals) {
    for gap in evals.gaps() {
        assert!(gap >= Duration::from_millis(5), "{gap:?}");
    }
    assert_waits_at_most_50_ms(evals);
}

/// `e` is a redirection that never settled: redis-rs' error of `kind`, returned as an error
/// (`BackendError::Script`), never the fail mode's outage.
fn assert_error(e: &BackendError, kind: ErrorKind) {
    let BackendError::Script(cause) = e else {
        panic!("{e:?}");
    };
    assert_eq!(cause.kind(), kind);
    assert!(!e.is_outage());
}

/// `e` is an outage (`BackendError::Connection`, the fail mode's), of `kind` where given.
fn assert_outage(e: &BackendError, kind: Option<ErrorKind>) {
    let BackendError::Connection(cause) = e else {
        panic!("{e:?}");
    };
    if let Some(kind) = kind {
        assert_eq!(cause.kind(), kind);
    }
    assert!(e.is_outage());
}

/// A redirection that never settles: the request is sent 1 + 3 times, then the `MOVED` is
/// an error (not an outage): returned by `request`, a denial from `check` even when open.
// Pins G73.
#[test]
fn moved_forever_is_tried_four_times_then_an_error() {
    let node = FakeNode::start(OnEval::Moved);
    let r = limiter(&node);
    let (e, evals) = node.tried(|| r.request("user").check().unwrap_err());
    assert_waits_at_most_50_ms(&evals);
    assert_error(&e, ErrorKind::Moved);
    // Through `check`, on a new cluster connection (the redirection dropped the old one):
    // the same tries, a denial, counted as an error.
    assert!(node.tried(|| r.check("user")).0.is_denied());
    assert_eq!((r.stats().errors, r.stats().failures), (1, 0));
}

/// `ASK` as `MOVED`: 1 + 3 tries, then an error.
// Pins G73.
#[test]
fn ask_forever_is_tried_four_times_then_an_error() {
    let node = FakeNode::start(OnEval::Ask);
    let r = limiter(&node);
    let (e, evals) = node.tried(|| r.request("user").check().unwrap_err());
    assert_waits_at_most_50_ms(&evals);
    assert_error(&e, ErrorKind::Ask);
}

/// `TRYAGAIN`, the reply redis-rs retries after a wait: 1 + 3 tries, each wait at least the
/// 5 ms minimum and at most the 50 ms maximum (plus slack), then an outage.
// Pins G73.
#[test]
fn tryagain_forever_is_tried_four_times_waiting_at_most_50_ms() {
    let node = FakeNode::start(OnEval::TryAgain);
    let r = limiter(&node);
    let (e, evals) = node.tried(|| r.request("user").check().unwrap_err());
    assert_waits_from_5_to_50_ms(&evals);
    assert_outage(&e, Some(ErrorKind::TryAgain));
    // Through `check`: the fail mode (open: allowed), counted as a failure.
    assert!(node.tried(|| r.check("user")).0.is_allowed());
    assert_eq!((r.stats().errors, r.stats().failures), (0, 1));
}

/// A node that closes the connection on every script call: reconnected and retried 1 + 3
/// times (redis-rs waits only on `TRYAGAIN`-like replies, not here), then an outage.
// Pins G73.
#[test]
fn lost_connection_is_tried_four_times_then_an_outage() {
    let node = FakeNode::start(OnEval::Close);
    let r = limiter(&node);
    let (e, evals) = node.tried(|| r.request("user").check().unwrap_err());
    assert_waits_at_most_50_ms(&evals);
    assert_outage(&e, None);
}

/// The async client (redis-rs' async cluster connection, the same retry settings):
/// `MOVED` forever is tried 1 + 3 times, then an error; `TRYAGAIN` forever 1 + 3 times,
/// waiting 5 to 50 ms (plus slack) between tries, then an outage; a connection closed on
/// every script call 1 + 3 times, reconnected without a wait, then an outage; a redirection to
/// a node that never answers a connect, an outage within the connect timeouts.
// Pins G73.
#[cfg(feature = "redis-async")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_client_tries_four_times_waiting_at_most_50_ms() {
    use hotlimit::AsyncRateLimiter as _;
    async fn limiter(node: &FakeNode) -> hotlimit::redis::AsyncRedisLimiter<Gcra> {
        let a = RedisLimiter::builder(node.url(), "10/s burst 5".parse::<Gcra>().unwrap())
            .fail_mode(FailMode::Open)
            .build_async()
            .await
            .unwrap();
        assert!(a.is_cluster());
        a
    }

    let node = FakeNode::start(OnEval::Moved);
    let a = limiter(&node).await;
    let (e, evals) = node.tried_async(a.request("user").check()).await;
    let e = e.unwrap_err();
    assert_waits_at_most_50_ms(&evals);
    assert_error(&e, ErrorKind::Moved);
    // The trait's check returns the error (no fail mode for it), counted.
    assert!(node.tried_async(a.check_async("user")).await.0.is_err());
    assert_eq!((a.stats().errors, a.stats().failures), (1, 0));

    let node = FakeNode::start(OnEval::TryAgain);
    let a = limiter(&node).await;
    let (e, evals) = node.tried_async(a.request("user").check()).await;
    let e = e.unwrap_err();
    assert_waits_from_5_to_50_ms(&evals);
    assert_outage(&e, Some(ErrorKind::TryAgain));
    let (d, _) = node.tried_async(a.check_async("user")).await;
    assert!(d.unwrap().is_allowed());
    assert_eq!((a.stats().errors, a.stats().failures), (0, 1));

    let node = FakeNode::start(OnEval::Close);
    let a = limiter(&node).await;
    let (e, evals) = node.tried_async(a.request("user").check()).await;
    let e = e.unwrap_err();
    assert_waits_at_most_50_ms(&evals);
    assert_outage(&e, None);

    let node = FakeNode::start(OnEval::MovedTo(dead_port()));
    let a = limiter(&node).await;
    let t = Instant::now();
    let e = a.request("user").check().await.unwrap_err();
    let took = t.elapsed();
    assert_dead_node_outage(took, &e);
}

/// A port whose connects hang: a listener that never accepts, its accept queue filled, so the
/// kernel drops every further SYN (a dead or partitioned host, as a connect sees it). The
/// listener and the queued connections are leaked to the end of the test process.
fn dead_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut queued = Vec::new();
    while let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
        queued.push(s);
        assert!(queued.len() < 10_000, "the accept queue never filled");
    }
    std::mem::forget((listener, queued));
    addr.port()
}

/// The longest a request may take against a node that never answers a connect: every try
/// waiting out the 250 ms connect timeout and the 50 ms longest wait, plus 1 s of slack for a
/// loaded machine. Without the connect timeout, the kernel's SYN retries wait about 2 minutes.
const DEAD_NODE_AT_MOST: Duration = Duration::from_millis(TRIES as u64 * (250 + 50) + 1000);

/// A request to a dead node took `took` and failed with `e`: an outage, after at least one
/// connect waited out its timeout (the port really hangs) and within [`DEAD_NODE_AT_MOST`].
fn assert_dead_node_outage(took: Duration, e: &BackendError) {
    assert!(
        (Duration::from_millis(250)..DEAD_NODE_AT_MOST).contains(&took),
        "{took:?}"
    );
    assert_outage(e, None);
}

/// A redirection to a node that never answers a connect (a dead or partitioned host, not a
/// refused port): an outage after at most one connect timeout per try, not a hang; through
/// `check`, the fail mode (open: allowed), counted as a failure.
// Pins G73.
#[test]
fn moved_to_a_dead_node_is_an_outage_within_the_connect_timeouts() {
    let node = FakeNode::start(OnEval::MovedTo(dead_port()));
    let r = limiter(&node);
    let t = Instant::now();
    let e = r.request("user").check().unwrap_err();
    let took = t.elapsed();
    assert_dead_node_outage(took, &e);
    let t = Instant::now();
    assert!(r.check("user").is_allowed());
    assert!(t.elapsed() < DEAD_NODE_AT_MOST, "{:?}", t.elapsed());
    assert_eq!((r.stats().errors, r.stats().failures), (0, 1));
}
