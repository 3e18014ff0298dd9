//! A fault-injecting TCP proxy for the fleet tests: loopback only, between the hybrid
//! instances and Redis. Every connection through it is forwarded byte for byte, in order,
//! each direction by a reader and a writer thread, with the faults set on [`Faults`] applied
//! as the bytes pass:
//!
//! - **delay** and **jitter**: each chunk read is written `delay ± jitter` later (one way;
//!   never before the chunk ahead of it, as TCP keeps order);
//! - **loss**: a lost segment costs TCP a retransmission timeout, and the stream waits for
//!   it: a chunk is held back [`RTO`] more with the loss's probability (what `tc netem loss`
//!   does to a TCP stream, without needing the privilege it takes);
//! - **stall**: nothing moves either way until it ends (a frozen Redis or a black-holed
//!   path; the connections stay open, the client's timeouts fire);
//! - **half-open pub/sub**: a subscription's connection (its client sent `SUBSCRIBE`) made
//!   deaf, for good, while the fault lasts: what Redis sends on it is dropped, while every
//!   other connection (the commands) passes. The peer is gone without a FIN; only the
//!   client can notice;
//! - **reset**: every open connection closed at once, both ways.
//!
//! Not a test target itself (a subdirectory).
#![allow(dead_code)] // each user takes its own part

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a lost segment costs a TCP stream: Linux's minimum retransmission timeout.
pub const RTO: Duration = Duration::from_millis(200);

/// The faults in force, read as each chunk passes; set them at any time.
#[derive(Debug, Default)]
pub struct Faults {
    delay_us: AtomicU64,
    jitter_us: AtomicU64,
    /// Loss probability, parts per million.
    loss_ppm: AtomicU64,
    stalled: AtomicBool,
    deaf_pubsub: AtomicBool,
    /// Chunks held back by a loss, bytes dropped on deaf subscriptions: the fault happened.
    pub lost: AtomicU64,
    pub dropped: AtomicU64,
    /// Script calls (`EVAL`, `EVALSHA`) a stall has held on their way to Redis: a round is
    /// out, and waits.
    pub held_calls: AtomicU64,
}

impl Faults {
    /// Each chunk `delay ± jitter` late, one way.
    pub fn delay(&self, delay: Duration, jitter: Duration) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
        self.jitter_us
            .store(jitter.as_micros() as u64, Ordering::Relaxed);
    }

    /// A chunk lost (held back one [`RTO`]) with probability `p`.
    pub fn loss(&self, p: f64) {
        self.loss_ppm.store((p * 1e6) as u64, Ordering::Relaxed);
    }

    /// Nothing moves while `on`.
    pub fn stall(&self, on: bool) {
        self.stalled.store(on, Ordering::Relaxed);
    }

    /// Subscriptions open while `on`, or made while it is, deaf for good.
    pub fn deaf_pubsub(&self, on: bool) {
        self.deaf_pubsub.store(on, Ordering::Relaxed);
    }
}

/// One proxied connection's shared flags.
#[derive(Default)]
struct Conn {
    pubsub: AtomicBool,
    deaf: AtomicBool,
}

/// The open connections: each one's flags, its client's socket and its server's.
type Open = Arc<Mutex<Vec<(Arc<Conn>, TcpStream, TcpStream)>>>;

/// The proxy: listening on a loopback port of its own, forwarding to `upstream`, until
/// dropped (every connection closed then).
pub struct Proxy {
    pub port: u16,
    pub faults: Arc<Faults>,
    stop: Arc<AtomicBool>,
    open: Open,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy to `upstream` (`127.0.0.1:port`).
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let faults = Arc::new(Faults::default());
        let stop = Arc::new(AtomicBool::new(false));
        let open: Open = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let (faults, stop, open) = (faults.clone(), stop.clone(), open.clone());
            std::thread::spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64;
                while !stop.load(Ordering::Relaxed) {
                    let client = match listener.accept() {
                        Ok((c, _)) => c,
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                    };
                    seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let Ok(server) = TcpStream::connect(upstream) else {
                        // Redis is down: the client sees its connection closed.
                        continue;
                    };
                    client.set_nonblocking(false).unwrap();
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let conn = Arc::new(Conn::default());
                    if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                        open.lock().unwrap().push((conn.clone(), c, s));
                    }
                    let up = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    pump(up.0, up.1, faults.clone(), conn.clone(), true, seed);
                    pump(server, client, faults.clone(), conn, false, seed ^ 1);
                }
            })
        };
        Proxy {
            port,
            faults,
            stop,
            open,
            accept: Some(accept),
        }
    }

    /// The proxy's URL, for a Redis client.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Closes every open connection, both ways (a reset between the instances and Redis).
    pub fn reset(&self) {
        for (_, c, s) in self.open.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Makes the subscriptions open now deaf for good, and those made until
    /// [`Faults::deaf_pubsub`] is turned off.
    pub fn deafen_pubsub(&self) {
        self.faults.deaf_pubsub(true);
        for (conn, _, _) in self.open.lock().unwrap().iter() {
            if conn.pubsub.load(Ordering::Relaxed) {
                conn.deaf.store(true, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.reset();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Forwards `from` to `to` through a delay line: a reader thread stamps each chunk with its
/// delivery time, a writer thread writes it then (`upward`: client to server).
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    faults: Arc<Faults>,
    conn: Arc<Conn>,
    upward: bool,
    seed: u64,
) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader_faults = faults.clone();
    let reader_conn = conn.clone();
    std::thread::spawn(move || {
        let mut rng = seed | 1;
        let mut next = || {
            // xorshift64: a reproducible stream per connection, no dependency.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut last = Instant::now();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = buf[..n].to_vec();
            if upward && !reader_conn.pubsub.load(Ordering::Relaxed) && is_subscribe(&chunk) {
                reader_conn.pubsub.store(true, Ordering::Relaxed);
                if reader_faults.deaf_pubsub.load(Ordering::Relaxed) {
                    reader_conn.deaf.store(true, Ordering::Relaxed);
                }
            }
            let f = &reader_faults;
            let delay = f.delay_us.load(Ordering::Relaxed) as f64;
            let jitter = f.jitter_us.load(Ordering::Relaxed) as f64;
            let mut us = (delay + jitter * (2.0 * next() - 1.0)).max(0.0);
            if next() * 1e6 < f.loss_ppm.load(Ordering::Relaxed) as f64 {
                us += RTO.as_micros() as f64;
                f.lost.fetch_add(1, Ordering::Relaxed);
            }
            let at = (Instant::now() + Duration::from_micros(us as u64)).max(last);
            last = at;
            if tx.send((at, chunk)).is_err() {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Read);
    });
    std::thread::spawn(move || {
        for (at, chunk) in rx {
            let wait = at.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            if upward && faults.stalled.load(Ordering::Relaxed) && contains(&chunk, b"EVAL") {
                faults.held_calls.fetch_add(1, Ordering::Relaxed);
            }
            while faults.stalled.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            if !upward && conn.deaf.load(Ordering::Relaxed) {
                faults
                    .dropped
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                continue;
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Whether a client's chunk is a subscription (RESP: the command name as a bulk string).
fn is_subscribe(chunk: &[u8]) -> bool {
    contains(chunk, b"SUBSCRIBE")
}

/// Whether `chunk` holds `word`, in any case.
fn contains(chunk: &[u8], word: &[u8]) -> bool {
    chunk
        .windows(word.len())
        .any(|w| w.eq_ignore_ascii_case(word))
}
