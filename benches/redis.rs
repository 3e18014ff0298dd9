//! Throughput of the Redis backend: checks per second from 1, 2 and 4 threads, each with its
//! own connection, one `EVALSHA` per round trip or pipelined batches of them (by
//! `try_check_pipelined`, or by `check_batch`).
//!
//! `cargo bench --features redis --bench redis [-- SECONDS] [hierarchy]`. Starts its own
//! `redis-server` on 127.0.0.1 (a free port, no persistence); prints a markdown table. With
//! `--features redis-async`, also the async client: N concurrent tokio tasks on one
//! multiplexed connection. Then (or alone, with `hierarchy`) a three-level
//! `RedisLimiter::check_all` against a plain check, one thread, rounds interleaved.

use hotlimit::algo::{
    Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::redis::{RedisAlgorithm, RedisLimiter};
use hotlimit::Rate;
use hotlimit::Requests;
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEYS: usize = 10_000;

/// How a thread sends its requests.
#[derive(Clone, Copy)]
enum Sending {
    /// One `try_check_n` (one `EVALSHA` a round trip).
    One,
    /// `try_check_pipelined` batches of this many.
    Pipelined(usize),
    /// `check_batch` batches of this many (the pipeline with `check`'s answers around it).
    Batch(usize),
}

/// Checks per second with `threads` threads, each sending as `send` says.
fn run<A: RedisAlgorithm>(base: &RedisLimiter<A>, threads: usize, send: Sending, secs: f64) -> f64 {
    let keys: Vec<String> = (0..KEYS).map(|i| format!("k{i}")).collect();
    let total: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let r = base.try_clone().expect("connect");
                let keys = &keys;
                s.spawn(move || {
                    let mut i = t * 7919;
                    let mut done = 0u64;
                    let mut out = Vec::new();
                    let start = Instant::now();
                    while start.elapsed().as_secs_f64() < secs {
                        match send {
                            Sending::One => {
                                let _ = r.request(&keys[i % KEYS]).check().expect("check");
                                i += 1;
                                done += 1;
                            }
                            Sending::Pipelined(batch) => {
                                let reqs: Vec<(&str, u64)> = (0..batch)
                                    .map(|j| (keys[(i + j) % KEYS].as_str(), 1))
                                    .collect();
                                r.try_check_pipelined(&reqs).expect("pipeline");
                                i += batch;
                                done += batch as u64;
                            }
                            Sending::Batch(batch) => {
                                let reqs = (0..batch).map(|j| keys[(i + j) % KEYS].as_str());
                                r.check_batch(reqs, &mut out);
                                assert_eq!(out.len(), batch);
                                i += batch;
                                done += batch as u64;
                            }
                        }
                    }
                    assert_eq!(
                        (r.stats().errors, r.stats().failures),
                        (0, 0),
                        "every batch decided"
                    );
                    done
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    total as f64 / secs
}

fn table<A: RedisAlgorithm>(name: &str, url: &str, algo: A, secs: f64) {
    let base = RedisLimiter::builder(url, algo)
        .key_prefix(format!("{name}:"))
        .build()
        .expect("connect");
    for threads in [1, 2, 4] {
        let sends = [
            Sending::One,
            Sending::Pipelined(16),
            Sending::Pipelined(64),
            Sending::Batch(64),
        ];
        let row: Vec<String> = sends
            .iter()
            .map(|&send| format!("{:.0}", run(&base, threads, send, secs)))
            .collect();
        println!("| {name} | {threads} | {} |", row.join(" | "));
    }
}

/// Checks per second from `tasks` concurrent tasks sharing one async limiter (one multiplexed
/// connection, which pipelines them), on a 2-worker tokio runtime.
#[cfg(feature = "redis-async")]
fn run_async(url: &str, tasks: usize, secs: f64) -> f64 {
    use std::sync::Arc;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let limiter = Arc::new(
            RedisLimiter::builder(
                url,
                Gcra::new(Rate::new(1e6, Duration::from_secs(1)).unwrap()).unwrap(),
            )
            .key_prefix("gcra-async:")
            .build_async()
            .await
            .expect("connect"),
        );
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let mut done = 0u64;
                    let mut i = t * 7919;
                    while start.elapsed().as_secs_f64() < secs {
                        let key = format!("k{}", i % KEYS);
                        let _ = limiter.request(&key).check().await.expect("check");
                        i += 1;
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let mut total = 0;
        for h in handles {
            total += h.await.unwrap();
        }
        total as f64 / secs
    })
}

/// One thread, GCRA admitting everything: a plain check against a three-level hierarchy (a
/// user of 1,000, an organisation of 100, a global key, a quota each) in one script call and
/// through the core's `check_all`, in 10 interleaved rounds of `secs / 5` each; per row, calls
/// per second (the rounds' median) and the median of the rounds' ratios to the check.
fn hierarchy(url: &str, secs: f64) {
    let gcra = |r: f64| Gcra::new(Rate::new(r, Duration::from_secs(1)).unwrap()).unwrap();
    let (user, org, global) = (gcra(1e6), gcra(1e7), gcra(1e8));
    let r = RedisLimiter::builder(url, user)
        .key_prefix("levels:{bench}:")
        .build()
        .expect("connect");
    let keys: Vec<[String; 3]> = (0..KEYS)
        .map(|i| {
            [
                format!("u{}", i % 1000),
                format!("o{}", i % 100),
                "g".into(),
            ]
        })
        .collect();
    // 0: a check; 1: the one-script hierarchy; 2: the core's `check_all` over the same
    // limiter, a round trip a level (a read each, then a take each).
    let per_second = |row: usize| {
        let (mut i, mut done) = (0, 0u64);
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < secs / 5.0 {
            let k = &keys[i % KEYS];
            let allowed = match row {
                0 => r.request(&k[0]).check().expect("check").is_allowed(),
                1 => {
                    let levels = [
                        (k[0].as_str(), Some(&user)),
                        (k[1].as_str(), Some(&org)),
                        (k[2].as_str(), Some(&global)),
                    ];
                    r.check_all(&levels, 1, None)
                        .expect("check_all")
                        .1
                        .is_allowed()
                }
                _ => {
                    let levels = [
                        (&r, k[0].as_str(), Some(&user)),
                        (&r, k[1].as_str(), Some(&org)),
                        (&r, k[2].as_str(), Some(&global)),
                    ];
                    hotlimit::check_all(&levels, 1)
                        .expect("check_all")
                        .1
                        .is_allowed()
                }
            };
            assert!(allowed);
            i += 1;
            done += 1;
        }
        done as f64 / (secs / 5.0)
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut cells: [(Vec<f64>, Vec<f64>); 3] = Default::default();
    for _ in 0..10 {
        let rates = [per_second(0), per_second(1), per_second(2)];
        for (row, rate) in rates.iter().enumerate() {
            cells[row].0.push(*rate);
            cells[row].1.push(rates[0] / rate);
        }
    }
    println!("\n| one thread, GCRA | calls per second | time ÷ a check |");
    println!("|---|---|---|");
    let names = [
        "a check",
        "`RedisLimiter::check_all`, 3 levels, one script",
        "`hotlimit::check_all` over it, 3 levels, a round trip each",
    ];
    for (name, (rates, ratios)) in names.iter().zip(cells) {
        println!("| {name} | {:.0} | {:.2} |", median(rates), median(ratios));
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a number is the seconds per cell.
    let secs: f64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1.0);
    if Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        eprintln!("redis-server not found on PATH: nothing to measure");
        return;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn redis-server");
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let url = format!("redis://127.0.0.1:{port}/");
    if std::env::args().any(|a| a == "hierarchy") {
        hierarchy(&url, secs);
        let _ = child.kill();
        let _ = child.wait();
        return;
    }
    println!("checks per second, {KEYS} keys round robin, {secs} s per cell\n");
    println!(
        "| algorithm | threads | unpipelined | pipelined ×16 | pipelined ×64 | `check_batch` ×64 (trait) |"
    );
    println!("|---|---|---|---|---|---|");
    // Quotas that admit everything: every request takes the write path.
    table(
        "gcra",
        &url,
        Gcra::new(Rate::new(1e6, Duration::from_secs(1)).unwrap()).unwrap(),
        secs,
    );
    table(
        "earrrl",
        &url,
        Earrrl::new(
            Duration::from_secs(1),
            Rate::new(1e6, Duration::from_secs(1)).unwrap(),
        )
        .unwrap(),
        secs,
    );
    table(
        "exponential",
        &url,
        Exponential::new(1e6, Duration::from_secs(1)).unwrap(),
        secs,
    );
    let second = Duration::from_secs(1);
    table(
        "fixed window",
        &url,
        FixedWindow::new(100_000_000, second).unwrap(),
        secs,
    );
    table(
        "sliding window",
        &url,
        SlidingWindow::new(1_000_000_000, second).unwrap(),
        secs,
    );
    // A few entries per key: each key sees about (checks per second) / KEYS requests a second.
    table(
        "sliding log",
        &url,
        SlidingLog::new(1_000_000_000, second).unwrap(),
        secs,
    );
    table(
        "sub-window ×60",
        &url,
        SubWindow::new(1_000_000_000, second, 60).unwrap(),
        secs,
    );
    #[cfg(feature = "redis-async")]
    {
        println!("\n| async client, GCRA | 1 task | 16 tasks | 64 tasks |");
        println!("|---|---|---|---|");
        let row: Vec<String> = [1, 16, 64]
            .iter()
            .map(|&tasks| format!("{:.0}", run_async(&url, tasks, secs)))
            .collect();
        println!("| one multiplexed connection | {} |", row.join(" | "));
    }
    hierarchy(&url, secs);
    let _ = child.kill();
    let _ = child.wait();
}
