//! The fleet run of the hybrid limiter, shared by `tests/hybrid_fleet.rs` (which asserts on
//! it) and `examples/hybrid_fleet.rs` (which charts it): a `redis-server` of its own and 4
//! worker processes (separate clocks, connections and sync threads), each running one
//! `HybridLimiter` per algorithm against two keys for 10 s:
//!
//! - `flood`: 10× the limit across the fleet, spread evenly over the workers;
//! - `paced`: 1.2× the limit across the fleet (just above it), with jittered spacing.
//!
//! Every request's time (Unix ns) and answer comes back; the parent merges them per key and
//! replays the merged sequence through one exact in-memory limiter (a `ManualClock` set to
//! each request's time) for comparison. Not a test target itself (a subdirectory).
#![allow(dead_code)] // each user takes its own part

use hotlimit::algo::{Earrrl, Exponential, FixedWindow, Gcra, SlidingWindow};
use hotlimit::redis::{Fallback, HybridAlgorithm, HybridLimiter, HybridStats};
use hotlimit::{CasLimiter, ManualClock, Rate};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Workers.
pub const WORKERS: usize = 4;
/// Every algorithm's limit: 100 per second.
pub const LIMIT: f64 = 100.0;
/// GCRA's burst.
pub const BURST: u64 = 10;
/// The sync interval.
pub const INTERVAL: Duration = Duration::from_millis(10);
/// Each worker's fallback: a quarter of the quota (4 workers).
pub const SHARE: f64 = 0.25;
/// Fleet demand on `flood` and `paced`, in multiples of the limit.
pub const FLOOD: f64 = 10.0;
pub const PACED: f64 = 1.2;
/// The environment variable that makes a process a worker (its value: the spec, JSON).
pub const WORKER_ENV: &str = "HOTLIMIT_FLEET_WORKER";

/// The algorithms, by name.
pub const ALGOS: [&str; 5] = ["gcra", "fixed", "sliding", "earrrl", "exponential"];

pub fn gcra() -> Gcra {
    Gcra::new(Rate::per_second_of(LIMIT).unwrap())
        .unwrap()
        .with_burst(BURST)
        .unwrap()
}
pub fn fixed() -> FixedWindow {
    FixedWindow::new(LIMIT as u64, Duration::from_secs(1)).unwrap()
}
pub fn sliding() -> SlidingWindow {
    SlidingWindow::new(LIMIT as u64, Duration::from_secs(1)).unwrap()
}
/// Half-life 1 s, at most 100/s (strict, its default).
pub fn earrrl() -> Earrrl {
    Earrrl::new(Duration::from_secs(1), Rate::per_second_of(LIMIT).unwrap()).unwrap()
}
/// 100 per 1 s period (leaky, its default).
pub fn exponential() -> Exponential {
    Exponential::new(LIMIT, Duration::from_secs(1)).unwrap()
}

pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// One key's requests, merged over the fleet and sorted: `(Unix ns, allowed)`.
pub type Trace = Vec<(u64, bool)>;

/// A run's results per algorithm: its two keys' traces and each worker's counters.
pub struct AlgoRun {
    pub name: &'static str,
    pub flood: Trace,
    pub paced: Trace,
    pub stats: Vec<Value>,
}

pub struct Run {
    pub start: u64,
    pub duration: Duration,
    /// `(from, to)` Unix ns of the outage, if any.
    pub outage: Option<(u64, u64)>,
    pub algos: Vec<AlgoRun>,
}

/// The worker's side: runs every algorithm for `spec` and returns the results (JSON).
pub fn worker(spec: &Value) -> Value {
    let url = spec["url"].as_str().unwrap().to_owned();
    let index = spec["worker"].as_u64().unwrap();
    let start = spec["start"].as_u64().unwrap();
    let duration = Duration::from_millis(spec["duration_ms"].as_u64().unwrap());
    let threads: Vec<_> = ALGOS
        .iter()
        .map(|&name| {
            let url = url.clone();
            std::thread::spawn(move || {
                let run = |l: &dyn Fn(&str) -> bool, stats: &dyn Fn() -> HybridStats| {
                    drive(l, index, start, duration, stats)
                };
                let out = match name {
                    "gcra" => with_limiter(&url, name, gcra(), run),
                    "fixed" => with_limiter(&url, name, fixed(), run),
                    "sliding" => with_limiter(&url, name, sliding(), run),
                    "earrrl" => with_limiter(&url, name, earrrl(), run),
                    _ => with_limiter(&url, name, exponential(), run),
                };
                (name, out)
            })
        })
        .collect();
    let mut out = serde_json::Map::new();
    for t in threads {
        let (name, v) = t.join().unwrap();
        out.insert(name.into(), v);
    }
    Value::Object(out)
}

fn with_limiter<A: HybridAlgorithm>(
    url: &str,
    name: &str,
    algo: A,
    run: impl Fn(&dyn Fn(&str) -> bool, &dyn Fn() -> HybridStats) -> Value,
) -> Value {
    let limiter = HybridLimiter::builder(url, algo)
        .key_prefix(format!("fleet:{name}:"))
        .sync_interval(INTERVAL)
        .fallback(Fallback::share(SHARE).unwrap())
        .connect_timeout(Duration::from_millis(100))
        .io_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    run(&|key| limiter.check(key).is_allowed(), &|| limiter.stats())
}

/// One worker's requests on both keys, at their scheduled times, until `duration` is over.
fn drive(
    check: &dyn Fn(&str) -> bool,
    worker: u64,
    start: u64,
    duration: Duration,
    stats: &dyn Fn() -> HybridStats,
) -> Value {
    let n = WORKERS as f64;
    let flood_gap = 1e9 / (FLOOD * LIMIT / n);
    let paced_gap = 1e9 / (PACED * LIMIT / n);
    let end = start + duration.as_nanos() as u64;
    // The workers' floods interleave; the paced requests are jittered by up to ±40%.
    let mut schedule: Vec<(u64, bool)> = Vec::new();
    let mut k = 0.0;
    loop {
        let t = start + ((k + worker as f64 / n) * flood_gap) as u64;
        if t >= end {
            break;
        }
        schedule.push((t, true));
        k += 1.0;
    }
    let mut k = 0.0;
    loop {
        let jitter = fastrand::f64() * 0.8 - 0.4;
        let t = start + ((k + 0.5 + jitter) * paced_gap) as u64;
        if t >= end {
            break;
        }
        schedule.push((t, false));
        k += 1.0;
    }
    schedule.sort_unstable();
    let (mut flood, mut paced) = (Vec::new(), Vec::new());
    for (t, is_flood) in schedule {
        let now = unix_ns();
        if t > now {
            std::thread::sleep(Duration::from_nanos(t - now));
        }
        let at = unix_ns();
        let key = if is_flood { "flood" } else { "paced" };
        let ok = check(key);
        if is_flood { &mut flood } else { &mut paced }.push(json!([at, ok]));
    }
    let s = stats();
    json!({
        "flood": flood,
        "paced": paced,
        "stats": {
            "ticks": s.ticks, "calls": s.calls, "round_trips": s.round_trips,
            "failed_calls": s.failed_calls, "errors": s.errors, "degraded": s.degraded,
            "leased": s.leased, "returned": s.returned, "charged": s.charged,
        },
    })
}

/// Starts the workers (this executable with `args`, the spec in [`WORKER_ENV`]) against the
/// Redis at `port`; with `outage`, kills Redis `outage.0` into the run and starts it again
/// (empty, on the same port) `outage.1` later. `start_redis` starts a server on a port.
pub fn run<S>(
    args: &[&str],
    port: u16,
    server: S,
    start_redis: impl Fn(u16) -> S,
    duration: Duration,
    outage: Option<(Duration, Duration)>,
) -> Run {
    let exe = std::env::current_exe().unwrap();
    // Start in 1.5 s: every worker is up and connected by then.
    let start = unix_ns() + 1_500_000_000;
    let url = format!("redis://127.0.0.1:{port}/");
    let children: Vec<_> = (0..WORKERS)
        .map(|w| {
            let spec = json!({
                "url": url, "worker": w, "start": start,
                "duration_ms": duration.as_millis() as u64,
            });
            Command::new(&exe)
                .args(args)
                .env(WORKER_ENV, spec.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    let mut server = Some(server);
    let mut window = None;
    if let Some((at, down_for)) = outage {
        let wait_until = |t: u64| {
            let now = unix_ns();
            if t > now {
                std::thread::sleep(Duration::from_nanos(t - now));
            }
        };
        let from = start + at.as_nanos() as u64;
        wait_until(from);
        drop(server.take()); // killed
        let to = from + down_for.as_nanos() as u64;
        wait_until(to);
        server = Some(start_redis(port));
        window = Some((from, to));
    }
    let mut per_algo: Vec<(Trace, Trace, Vec<Value>)> = ALGOS
        .iter()
        .map(|_| (Vec::new(), Vec::new(), Vec::new()))
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "a worker failed: {:?}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.split_once("FLEET-RESULT ").map(|(_, json)| json))
            .expect("a worker's result line");
        let v: Value = serde_json::from_str(line).unwrap();
        for (i, name) in ALGOS.iter().enumerate() {
            let a = &v[*name];
            let trace = |k: &str| -> Trace {
                a[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|p| (p[0].as_u64().unwrap(), p[1].as_bool().unwrap()))
                    .collect()
            };
            per_algo[i].0.extend(trace("flood"));
            per_algo[i].1.extend(trace("paced"));
            per_algo[i].2.push(a["stats"].clone());
        }
    }
    drop(server);
    Run {
        start,
        duration,
        outage: window,
        algos: ALGOS
            .iter()
            .zip(per_algo)
            .map(|(&name, (mut flood, mut paced, stats))| {
                flood.sort_unstable();
                paced.sort_unstable();
                AlgoRun {
                    name,
                    flood,
                    paced,
                    stats,
                }
            })
            .collect(),
    }
}

/// Admitted count of a trace.
pub fn admitted(t: &Trace) -> u64 {
    t.iter().filter(|r| r.1).count() as u64
}

/// What one exact in-memory limiter admits of the same requests, in the same order.
pub fn exact(name: &str, t: &Trace) -> u64 {
    macro_rules! replay {
        ($algo:expr) => {{
            let clock = ManualClock::new();
            let l = CasLimiter::<String, _>::with_clock($algo, clock.clone());
            t.iter()
                .filter(|&&(at, _)| {
                    clock.set_nanos(at);
                    l.check("k").is_allowed()
                })
                .count() as u64
        }};
    }
    match name {
        "gcra" => replay!(gcra()),
        "fixed" => replay!(fixed()),
        "sliding" => replay!(sliding()),
        "earrrl" => replay!(earrrl()),
        _ => replay!(exponential()),
    }
}

/// Admitted per second of the run (index 0: the first second).
pub fn per_second(run: &Run, t: &Trace) -> Vec<u64> {
    let secs = run.duration.as_secs() as usize;
    let mut out = vec![0; secs];
    for &(at, ok) in t {
        let s = (at.saturating_sub(run.start) / 1_000_000_000) as usize;
        if ok && s < secs {
            out[s] += 1;
        }
    }
    out
}

/// The most a fixed window (1 s, aligned to the Unix epoch) admitted.
pub fn max_per_window(t: &Trace) -> u64 {
    let mut counts = std::collections::HashMap::new();
    for &(at, ok) in t {
        if ok {
            *counts.entry(at / 1_000_000_000).or_insert(0u64) += 1;
        }
    }
    counts.into_values().max().unwrap_or(0)
}

/// The sliding window counter's estimate (previous window weighted by what is left of it,
/// plus the current one) at each admission, over the fleet's admissions: its largest value.
pub fn max_sliding_estimate(t: &Trace) -> f64 {
    let w = 1_000_000_000u64;
    let mut counts = std::collections::HashMap::new();
    let mut worst: f64 = 0.0;
    for &(at, ok) in t {
        if !ok {
            continue;
        }
        let i = at / w;
        *counts.entry(i).or_insert(0u64) += 1;
        let prev = *counts.get(&(i.wrapping_sub(1))).unwrap_or(&0) as f64;
        let cur = counts[&i] as f64;
        let est = prev * (1.0 - (at - i * w) as f64 / w as f64) + cur;
        worst = worst.max(est);
    }
    worst
}

/// The window bound the docs state: what the other instances admit within one sync
/// interval plus a round trip (taken as 10 ms here, loopback on a loaded machine), at this
/// run's flood rate.
pub fn window_bound() -> u64 {
    let per_worker = FLOOD * LIMIT / WORKERS as f64;
    let span = INTERVAL.as_secs_f64() + 0.010;
    ((WORKERS - 1) as f64 * (per_worker * span).ceil()) as u64
}

/// The most script calls per key per sync interval any worker made (2 keys per limiter).
pub fn calls_per_key_interval(a: &AlgoRun) -> f64 {
    a.stats
        .iter()
        .map(|s| s["calls"].as_f64().unwrap() / (2.0 * s["ticks"].as_f64().unwrap().max(1.0)))
        .fold(0.0, f64::max)
}

/// A stat summed over the workers.
pub fn total(a: &AlgoRun, stat: &str) -> u64 {
    a.stats.iter().map(|s| s[stat].as_u64().unwrap()).sum()
}

/// The span of a trace: first to last request, ns.
pub fn span(t: &Trace) -> u64 {
    match (t.first(), t.last()) {
        (Some(a), Some(b)) => b.0 - a.0,
        _ => 0,
    }
}
