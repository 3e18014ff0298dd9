//! The fleet run of the hybrid limiter, shared by `tests/hybrid_fleet.rs` (which asserts on
//! it) and `examples/hybrid_fleet.rs` (which tabulates and charts it): 4 worker processes
//! (separate clocks, connections, sync threads and subscriptions) against one Redis (a server
//! or a cluster), each running one `HybridLimiter` per algorithm over one shape of traffic:
//!
//! - [`Shape::Hot`]: two keys, `flood` at 10× the limit and `paced` at 1.2× it (jittered),
//!   sent by every worker alike, or with one worker sending most of both (skew);
//! - [`Shape::Sparse`]: thousands of keys, each at a rate equal to its quota across the
//!   fleet, each request to a random worker (Poisson arrivals): each worker sees a key far
//!   less than once a second.
//!
//! Every request's time (Unix ns), key and answer comes back; the parent merges them and
//! replays the merged sequence through one exact in-memory limiter (a `ManualClock` set to
//! each request's time), request by request, for comparison. Not a test target itself (a
//! subdirectory).
#![allow(dead_code)] // each user takes its own part

use hotlimit::algo::{Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingWindow};
use hotlimit::RateLimiter;
use hotlimit::{
    redis::{Fallback, HybridAlgorithm, HybridLimiter, HybridStats},
    CasLimiter, ManualClock, Rate,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Workers.
pub const WORKERS: usize = 4;
/// The sync interval.
pub const INTERVAL: Duration = Duration::from_millis(10);
/// The environment variable that makes a process a worker (its value: the spec, JSON).
pub const WORKER_ENV: &str = "HOTLIMIT_FLEET_WORKER";
/// The algorithms, by name.
pub const ALGOS: [&str; 5] = ["gcra", "fixed", "sliding", "earrrl", "exponential"];
/// The hot shape's keys.
pub const FLOOD: u32 = 0;
pub const PACED: u32 = 1;

/// A shape of traffic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// `flood` at 10× the limit of 100/s, `paced` at 1.2× it; with `skew`, worker 0 sends
    /// that share of both, the others the rest evenly.
    Hot { skew: Option<f64> },
    /// `keys` keys, each with a quota of `rate` per second and a demand of `rate` per
    /// second across the fleet.
    Sparse { keys: u32, rate: f64 },
    /// Issue #46 in the fleet: `legit` keys with a quota of 10 per second (a 1 s window)
    /// and a demand of twice it across the fleet, under `one_off` new keys per second (one
    /// request each, to a random worker), against [`FLOOD_MAX_KEYS`] per instance.
    Flood { legit: u32, one_off: f64 },
}

/// Each instance's `max_keys` in a [`Shape::Flood`] run.
pub const FLOOD_MAX_KEYS: usize = 1_000;
/// The first one-off key of worker `w` is `ONE_OFF + w × ONE_OFF_PER_WORKER`.
pub const ONE_OFF: u32 = 1_000;
pub const ONE_OFF_PER_WORKER: u32 = 100_000_000;

impl Shape {
    /// Every algorithm's limit per second (and per 1 s window).
    pub fn limit(&self) -> f64 {
        match self {
            Shape::Hot { .. } => 100.0,
            Shape::Sparse { rate, .. } => *rate,
            Shape::Flood { .. } => 10.0,
        }
    }

    /// GCRA's burst: a tenth of a second on the hot keys, a second on the sparse ones.
    pub fn burst(&self) -> u64 {
        match self {
            Shape::Hot { .. } => 10,
            Shape::Sparse { rate, .. } => rate.ceil() as u64,
            Shape::Flood { .. } => 10,
        }
    }

    /// Each worker's fallback: a quarter of the quota (4 workers) where that leaves each at
    /// least one request (the limiter refuses a share that rounds to nothing), else the
    /// smallest share that does.
    pub fn share(&self) -> f64 {
        let least = self.burst().min(self.limit() as u64) as f64;
        (0.25f64).max(1.0 / least)
    }

    /// The keys.
    pub fn keys(&self) -> u32 {
        match self {
            Shape::Hot { .. } => 2,
            Shape::Sparse { keys, .. } => *keys,
            Shape::Flood { legit, .. } => *legit,
        }
    }

    /// Worker `w`'s part of a hot key's demand.
    pub fn part(&self, w: usize) -> f64 {
        match self {
            Shape::Hot { skew: Some(s) } if w == 0 => *s,
            Shape::Hot { skew: Some(s) } => (1.0 - s) / (WORKERS - 1) as f64,
            _ => 1.0 / WORKERS as f64,
        }
    }

    /// Each worker's demand on `key`, per second.
    pub fn rate(&self, w: usize, key: u32) -> f64 {
        match self {
            Shape::Hot { .. } if key == FLOOD => 10.0 * self.limit() * self.part(w),
            Shape::Hot { .. } => 1.2 * self.limit() * self.part(w),
            Shape::Sparse { rate, .. } => rate / WORKERS as f64,
            Shape::Flood { .. } => 2.0 * self.limit() / WORKERS as f64,
        }
    }

    /// Whether `key` is one of the shape's keys, not a one-off key of a flood.
    pub fn is_legit(&self, key: u32) -> bool {
        key < ONE_OFF
    }

    fn to_json(self) -> Value {
        match self {
            Shape::Hot { skew } => json!({"hot": skew}),
            Shape::Sparse { keys, rate } => json!({"sparse": [keys, rate]}),
            Shape::Flood { legit, one_off } => json!({"flood": [legit, one_off]}),
        }
    }

    fn from_json(v: &Value) -> Shape {
        if let Some(skew) = v.get("hot") {
            Shape::Hot {
                skew: skew.as_f64(),
            }
        } else if let Some(f) = v.get("flood") {
            Shape::Flood {
                legit: f[0].as_u64().unwrap() as u32,
                one_off: f[1].as_f64().unwrap(),
            }
        } else {
            let s = &v["sparse"];
            Shape::Sparse {
                keys: s[0].as_u64().unwrap() as u32,
                rate: s[1].as_f64().unwrap(),
            }
        }
    }
}

pub fn gcra(s: Shape) -> Gcra {
    Gcra::new(Rate::new(s.limit(), Duration::from_secs(1)).unwrap())
        .unwrap()
        .with_burst(s.burst())
        .unwrap()
}
/// The window algorithms' window, ns: every measure of their windows below is by it.
pub const WINDOW_NS: u64 = 1_000_000_000;
pub fn fixed(s: Shape) -> FixedWindow {
    FixedWindow::new(s.limit() as u64, Duration::from_nanos(WINDOW_NS)).unwrap()
}
pub fn sliding(s: Shape) -> SlidingWindow {
    SlidingWindow::new(s.limit() as u64, Duration::from_nanos(WINDOW_NS)).unwrap()
}
/// Half-life 1 s, at most the limit per second (strict, its default).
pub fn earrrl(s: Shape) -> Earrrl {
    Earrrl::new(
        Duration::from_secs(1),
        Rate::new(s.limit(), Duration::from_secs(1)).unwrap(),
    )
    .unwrap()
}
/// The limit per 1 s period (leaky, its default).
pub fn exponential(s: Shape) -> Exponential {
    Exponential::new(s.limit(), Duration::from_secs(1)).unwrap()
}

/// The true Unix time (ns): the system clock, less this process's offset where a run
/// offset its clock ([`FAKETIME`]).
pub fn unix_ns() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    (t - CLOCK_OFFSET.load(std::sync::atomic::Ordering::Relaxed)) as u64
}

/// This process's clock offset (ns): 0 but in a worker started with one.
static CLOCK_OFFSET: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// libfaketime, which offsets a process's system clock (`CLOCK_REALTIME`, what
/// `SystemTime` reads): how a worker is given a clock that disagrees with the others'. Its
/// monotonic clock is left alone, as NTP would leave it.
pub const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Whether libfaketime is here; if not, a message, and a failure under
/// `HOTLIMIT_REQUIRE_FAKETIME=1` (set by `.ci/run`, which installs it).
pub fn faketime_installed() -> bool {
    if std::path::Path::new(FAKETIME).exists() {
        return true;
    }
    assert!(
        std::env::var("HOTLIMIT_REQUIRE_FAKETIME").as_deref() != Ok("1"),
        "{FAKETIME} is missing (Debian: libfaketime), but HOTLIMIT_REQUIRE_FAKETIME=1"
    );
    eprintln!("skipped: {FAKETIME} is missing (Debian package libfaketime)");
    false
}

/// Requests merged over the fleet and sorted: `(Unix ns, key, allowed)`.
pub type Trace = Vec<(u64, u32, bool)>;

/// A run's results per algorithm: the merged trace and each worker's counters.
pub struct AlgoRun {
    pub name: &'static str,
    pub trace: Trace,
    pub stats: Vec<Value>,
}

pub struct Run {
    pub shape: Shape,
    pub start: u64,
    pub duration: Duration,
    /// `(from, to)` Unix ns of the outage, if any.
    pub outage: Option<(u64, u64)>,
    pub algos: Vec<AlgoRun>,
}

/// What a fleet run is against.
pub struct Target {
    pub url: String,
    /// More cluster nodes (none for a server).
    pub seeds: Vec<String>,
}

/// Redis killed `at` into the run and started again `down_for` later, by `kill` and `restart`.
pub struct Outage<'a> {
    pub at: Duration,
    pub down_for: Duration,
    pub kill: Box<dyn FnOnce() + 'a>,
    pub restart: Box<dyn FnOnce() + 'a>,
}

/// The arguments that make a fleet test binary run only its `fleet_worker` test: each binary
/// of the harness has one, ignored in a plain run, whose body is [`worker_main`].
pub const WORKER_ARGS: [&str; 5] = [
    "--exact",
    "fleet_worker",
    "--ignored",
    "--nocapture",
    "--test-threads=1",
];

/// A worker process's main: runs the spec in [`WORKER_ENV`] and prints its result line.
pub fn worker_main() {
    let spec = std::env::var(WORKER_ENV).expect("started by a fleet test, with its spec");
    let spec: Value = serde_json::from_str(&spec).unwrap();
    println!("FLEET-RESULT {}", worker(&spec));
}

/// The traffic's start (Unix ns), once the parent has sent it: see [`Setup::lead`].
static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
/// Every limiter of this worker built and current (and the main thread, which then says so).
static READY: std::sync::OnceLock<std::sync::Barrier> = std::sync::OnceLock::new();
/// The line a worker prints once its limiters are current, and waits for the start after.
const READY_LINE: &str = "FLEET-READY";

/// The traffic's start: the spec's, or (a run whose workers report ready first) the one the
/// parent sends once they all have.
fn start_of(spec: &Value) -> u64 {
    if spec["start"].as_u64().is_some_and(|s| s > 0) {
        return spec["start"].as_u64().unwrap();
    }
    loop {
        if let Some(&start) = START.get() {
            return start;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The worker's side: runs every algorithm of `spec` and returns the results (JSON).
pub fn worker(spec: &Value) -> Value {
    let offset = spec["clock_offset_ns"].as_i64().unwrap_or(0);
    CLOCK_OFFSET.store(offset, std::sync::atomic::Ordering::Relaxed);
    let shape = Shape::from_json(&spec["shape"]);
    let algos = spec["algos"].as_array().unwrap();
    // Without a start in the spec: each limiter (a late joiner's excepted, built after the
    // start) waits to be current, then this thread says so and reads the start.
    let wait_ready = spec["start"].as_u64() == Some(0);
    let late = spec["join_after_ns"].as_u64().is_some();
    if wait_ready {
        let parties = if late { 1 } else { algos.len() + 1 };
        let _ = READY.set(std::sync::Barrier::new(parties));
    }
    let threads: Vec<_> = algos
        .iter()
        .map(|name| {
            let name = name.as_str().unwrap().to_owned();
            let spec = spec.clone();
            std::thread::spawn(move || {
                let out = match name.as_str() {
                    "gcra" => with_limiter(&spec, &name, gcra(shape)),
                    "fixed" => with_limiter(&spec, &name, fixed(shape)),
                    "sliding" => with_limiter(&spec, &name, sliding(shape)),
                    "earrrl" => with_limiter(&spec, &name, earrrl(shape)),
                    _ => with_limiter(&spec, &name, exponential(shape)),
                };
                (name, out)
            })
        })
        .collect();
    if wait_ready {
        READY.get().unwrap().wait();
        println!("{READY_LINE}");
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .expect("the start, from the parent");
        let _ = START.set(line.trim().parse().expect("the start, in Unix ns"));
    }
    let mut out = serde_json::Map::new();
    for t in threads {
        let (name, v) = t.join().unwrap();
        out.insert(name, v);
    }
    Value::Object(out)
}

fn with_limiter<A: HybridAlgorithm>(spec: &Value, name: &str, algo: A) -> Value {
    let shape = Shape::from_json(&spec["shape"]);
    let mut spec = spec.clone();
    // A late joiner builds its limiter (and takes requests) only from its time.
    if let Some(after) = spec["join_after_ns"].as_u64() {
        let start = start_of(&spec);
        spec["start"] = json!(start);
        spec["join_at"] = json!(start + after);
        std::thread::sleep(Duration::from_nanos(
            (start + after).saturating_sub(unix_ns()),
        ));
    }
    let spec = &mut spec;
    let seeds: Vec<String> = spec["seeds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    let builder = HybridLimiter::builder(spec["url"].as_str().unwrap(), algo)
        .redis(|r| {
            r.key_prefix(format!("fleet:{name}:"))
                .seed_nodes(seeds.clone())
        })
        .sync_interval(INTERVAL)
        .fallback(Fallback::share(shape.share()).unwrap())
        .redis(|r| {
            r.connect_timeout(Duration::from_millis(100))
                .io_timeout(Duration::from_millis(200))
        })
        .redis(|r| r.reconnect_after(Duration::from_millis(50)));
    let limiter = match shape {
        Shape::Flood { .. } => builder.max_keys(FLOOD_MAX_KEYS),
        _ => builder,
    }
    .build()
    .unwrap();
    if spec["start"].as_u64() == Some(0) {
        // Current (subscribed, and every key's state known), then the start: a limiter
        // taking traffic before it is current denies what it cannot know of yet (an
        // EARRRL flood's whole admission, its first 150 ms, went on that on a loaded
        // machine whose workers took over the old fixed 2 s lead to build).
        let by = unix_ns() + 30_000_000_000;
        while !limiter.stats().current && unix_ns() < by {
            std::thread::sleep(Duration::from_millis(1));
        }
        READY.get().unwrap().wait();
        spec["start"] = json!(start_of(spec));
    }
    let spec = &*spec;
    // From halfway through the run (the states of a window's requests idle when it ends,
    // and a hash with them: at the end no fixed window's state may be left), the most ids
    // the merged states were seen under: read again while Redis is away, or until every
    // worker has written again after a restart emptied it (an outage), until the run ends.
    let skip = spec["skip_ids"].as_bool().unwrap_or(false);
    let ids = (name != "gcra" && seeds.is_empty() && !skip).then(|| {
        let url = spec["observer_url"].as_str().or(spec["url"].as_str());
        let (url, name) = (url.unwrap().to_owned(), name.to_owned());
        let start = spec["start"].as_u64().unwrap();
        let span = spec["duration_ms"].as_u64().unwrap() * 1_000_000;
        std::thread::spawn(move || {
            let mut most: Option<usize> = None;
            let mut at = start + span / 2;
            while at < start + span && most.unwrap_or(0) < WORKERS {
                std::thread::sleep(Duration::from_nanos(at.saturating_sub(unix_ns())));
                if let Ok(n) = instances(&url, &name) {
                    most = Some(most.map_or(n, |m| m.max(n)));
                }
                at = unix_ns() + 100_000_000;
            }
            most
        })
    });
    let mut out = drive(&limiter, spec, name);
    // The last sync before the worker reports and exits (a drop would only start it).
    limiter.shutdown();
    if let Some(ids) = ids {
        out["stats"]["instances"] = json!(ids.join().unwrap());
    }
    out
}

/// How many instance ids the merged states of `name`'s keys are under, read from the
/// server: one field per instance in each key's hash. Two workers under one id each take
/// the other's field for its own and never count the other's traffic.
fn instances(url: &str, name: &str) -> redis::RedisResult<usize> {
    let mut con = redis::Client::open(url)?.get_connection()?;
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(format!("fleet:{name}:*"))
        .arg("TYPE")
        .arg("hash")
        .clone()
        .iter(&mut con)?
        .collect();
    let mut pipe = redis::pipe();
    for k in &keys {
        pipe.cmd("HKEYS").arg(k);
    }
    let fields: Vec<Vec<String>> = pipe.query(&mut con)?;
    let ids: std::collections::HashSet<String> = fields.into_iter().flatten().collect();
    Ok(ids.len())
}

/// Worker `w`'s requests: `(Unix ns, key)`, sorted.
fn schedule(shape: Shape, w: usize, start: u64, end: u64) -> Vec<(u64, u32)> {
    let mut rng = fastrand::Rng::with_seed(w as u64 * 7919 + start);
    let mut out = Vec::new();
    match shape {
        Shape::Hot { .. } => {
            // The flood interleaves evenly (worker phases apart); the paced key is jittered
            // by up to ±40% of its gap.
            for key in [FLOOD, PACED] {
                let gap = 1e9 / shape.rate(w, key);
                let phase = if key == FLOOD {
                    w as f64 / WORKERS as f64
                } else {
                    0.5
                };
                let mut k = 0.0;
                loop {
                    let jitter = if key == PACED {
                        rng.f64() * 0.8 - 0.4
                    } else {
                        0.0
                    };
                    let t = start + ((k + phase + jitter) * gap) as u64;
                    if t >= end {
                        break;
                    }
                    out.push((t, key));
                    k += 1.0;
                }
            }
        }
        Shape::Sparse { keys, .. } | Shape::Flood { legit: keys, .. } => {
            if let Shape::Flood { one_off, .. } = shape {
                // This worker's part of the one-off keys, Poisson arrivals.
                let mean = 1e9 * WORKERS as f64 / one_off;
                let (mut t, mut key) = (start as f64, ONE_OFF + w as u32 * ONE_OFF_PER_WORKER);
                loop {
                    t += -mean * (1.0 - rng.f64()).ln();
                    if t >= end as f64 {
                        break;
                    }
                    out.push((t as u64, key));
                    key += 1;
                }
            }
            // Poisson arrivals per key: exponential gaps.
            for key in 0..keys {
                let mean = 1e9 / shape.rate(w, key);
                let mut t = start as f64;
                loop {
                    t += -mean * (1.0 - rng.f64()).ln();
                    if t >= end as f64 {
                        break;
                    }
                    out.push((t as u64, key));
                }
            }
        }
    }
    out.sort_unstable();
    out
}

/// The time in `before..=after` closest to the limiter's own time of an admission whose state
/// resets `windows` windows past the one it was counted in, `reset` ns from then.
fn at_in_window(before: u64, after: u64, windows: u64, reset: u64) -> u64 {
    let own = |k: u64| ((k + windows) * WINDOW_NS).saturating_sub(reset);
    let k = before / WINDOW_NS;
    let nearest = [k.saturating_sub(1), k, k + 1]
        .into_iter()
        .map(own)
        .min_by_key(|t| t.abs_diff(before))
        .unwrap();
    nearest.clamp(before, after)
}

/// One worker's requests at their times, until the run is over; its trace and counters.
///
/// A request's time is read before its check, and a thread descheduled between that read and
/// the check's own (2.4 ms seen on two loaded cores) would put an admission early: the
/// sliding window's estimate at it then weighs the previous window by that much more (a
/// tenth of an admission per millisecond at 100/s). The window algorithms' admissions say in
/// the limiter's own clock when they happened (a fixed window's state resets at the end of
/// the window it counted in, a sliding window's one window later: `reset_after` before that),
/// so their time is that, clamped into when the check ran: within what was observed, never
/// outside it.
fn drive<A: HybridAlgorithm>(limiter: &HybridLimiter<A>, spec: &Value, name: &str) -> Value {
    let shape = Shape::from_json(&spec["shape"]);
    let w = spec["worker"].as_u64().unwrap() as usize;
    let start = spec["start"].as_u64().unwrap();
    let end = start + spec["duration_ms"].as_u64().unwrap() * 1_000_000;
    let names: Vec<String> = (0..shape.keys()).map(|k| format!("k{k}")).collect();
    let mut trace = Vec::new();
    let mut one_off;
    let joined = spec["join_at"].as_u64().unwrap_or(0);
    // After an admission, a window state resets this many windows past its own.
    let windows_to_reset = match name {
        "fixed" => Some(1),
        "sliding" => Some(2),
        _ => None,
    };
    for (t, key) in schedule(shape, w, start, end) {
        if t < joined {
            continue;
        }
        // Requests due within a millisecond go now: the thread sleeps in steps of that
        // order anyway. The time recorded is when the check ran.
        let now = unix_ns();
        if t > now + 1_000_000 {
            std::thread::sleep(Duration::from_nanos(t - now));
        }
        let before = unix_ns();
        let key_name = match names.get(key as usize) {
            Some(name) => name,
            None => {
                one_off = format!("k{key}");
                &one_off
            }
        };
        let d = limiter.check(key_name);
        let after = unix_ns();
        let at = match (windows_to_reset, d.reset_after()) {
            (Some(n), Some(reset)) if d.is_allowed() => {
                at_in_window(before, after, n, reset.as_nanos() as u64)
            }
            _ => before,
        };
        trace.push(json!([at, key, d.is_allowed()]));
    }
    let s: HybridStats = limiter.stats();
    json!({
        "trace": trace,
        "stats": {
            "ticks": s.ticks, "calls": s.calls, "round_trips": s.round_trips,
            "failed_calls": s.failed_calls, "errors": s.errors, "degraded": s.degraded,
            "denied_limit": s.denied_limit, "denied_waiting": s.denied_waiting,
            "leased": s.leased, "returned": s.returned, "charged": s.charged,
            "pushes": s.pushes, "keys": limiter.metrics().keys,
            "subscribed": s.subscribed, "deaf": s.deaf,
            "evicted_capacity": limiter.metrics().evicted_capacity,
            "debts_kept": limiter.metrics().debts_kept,
            "debts_restored": limiter.metrics().debts_restored,
            "sync_lag_max": s.sync_lag_max.as_nanos() as u64,
            "push_lag": s.push_lag.as_nanos() as u64,
            "push_lag_max": s.push_lag_max.as_nanos() as u64,
            "last_error": limiter.last_error().map(|e| e.to_string()),
        },
    })
}

/// Starts the workers (this executable with `args`, the spec in [`WORKER_ENV`]) against
/// `target` for `duration` of `shape`, running `algos`; with `outage`, Redis goes away and
/// comes back as it says.
pub fn run(
    args: &[&str],
    target: &Target,
    shape: Shape,
    algos: &[&'static str],
    duration: Duration,
    outage: Option<Outage<'_>>,
) -> Run {
    let mut events: Vec<Event<'_>> = Vec::new();
    let mut window = None;
    if let Some(o) = outage {
        window = Some((o.at, o.at + o.down_for));
        events.push((o.at, o.kill));
        events.push((o.at + o.down_for, o.restart));
    }
    run_with(
        args,
        target,
        shape,
        algos,
        duration,
        Setup {
            events,
            window,
            ..Setup::default()
        },
    )
}

/// Something done to the fleet's surroundings `at` this long into the run.
pub type Event<'a> = (Duration, Box<dyn FnOnce() + 'a>);

/// How a run is set up beyond its traffic.
#[derive(Default)]
pub struct Setup<'a> {
    /// Done at their times (from the start of the traffic), in order.
    pub events: Vec<Event<'a>>,
    /// The fault's window, from the start of the traffic (the run's `outage`).
    pub window: Option<(Duration, Duration)>,
    /// Each worker's clock offset, seconds (empty: none), through [`FAKETIME`].
    pub clock_offsets: Vec<f64>,
    /// Workers started this long before the traffic. By default the traffic starts 100 ms
    /// after every worker's limiters are current (connected, subscribed, every key's state
    /// known), each worker saying so on its stdout: a fixed lead of 2 s was not always
    /// enough for four processes to build five limiters each on two loaded cores.
    pub lead: Option<Duration>,
    /// Where a worker reads the instance ids in the hashes from, if not the fleet's URL (a
    /// proxy's faults are the fleet's, not the observer's).
    pub observer_url: Option<String>,
    /// A worker that joins late: `(worker, after)`, its limiter built and its requests taken
    /// from `after` into the traffic (the others' demand unchanged).
    pub late: Option<(usize, Duration)>,
    /// No look at the instance ids in the hashes (a fault that keeps every call from
    /// completing leaves them as the calls that got through by chance wrote them).
    pub skip_ids: bool,
}

/// [`run`] with events at their times and the workers' clocks offset as `setup` says.
pub fn run_with(
    args: &[&str],
    target: &Target,
    shape: Shape,
    algos: &[&'static str],
    duration: Duration,
    setup: Setup<'_>,
) -> Run {
    let exe = std::env::current_exe().unwrap();
    // 0: the workers report ready, then get the start (see `Setup::lead`).
    let fixed = setup.lead.map(|lead| unix_ns() + lead.as_nanos() as u64);
    let mut children: Vec<_> = (0..WORKERS)
        .map(|w| {
            let offset = setup.clock_offsets.get(w).copied().unwrap_or(0.0);
            let spec = json!({
                "url": target.url, "seeds": target.seeds, "worker": w,
                "start": fixed.unwrap_or(0),
                "duration_ms": duration.as_millis() as u64, "shape": shape.to_json(),
                "algos": algos, "clock_offset_ns": (offset * 1e9) as i64,
                "observer_url": setup.observer_url, "skip_ids": setup.skip_ids,
                "join_after_ns": setup.late.filter(|l| l.0 == w).map(|l| l.1.as_nanos() as u64),
            });
            let mut cmd = Command::new(&exe);
            cmd.args(args)
                .env(WORKER_ENV, spec.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            if offset != 0.0 {
                cmd.env("LD_PRELOAD", FAKETIME)
                    .env("FAKETIME", format!("{offset:+.3}"))
                    .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                    .env("FAKETIME_NO_CACHE", "1");
            }
            cmd.spawn().expect("spawn a worker")
        })
        .collect();
    // Each worker's stdout, read line by line: its ready line now, its result at the end.
    let mut outputs: Vec<_> = children
        .iter_mut()
        .map(|c| std::io::BufReader::new(c.stdout.take().unwrap()))
        .collect();
    let start = match fixed {
        Some(start) => start,
        None => {
            use std::io::{BufRead, Write};
            for out in &mut outputs {
                // libtest's "test fleet_worker ... " may open the line.
                let mut line = String::new();
                while !line.trim_end().ends_with(READY_LINE) {
                    line.clear();
                    let read = out.read_line(&mut line).unwrap();
                    assert!(read > 0, "a worker ended before it was ready");
                }
            }
            let start = unix_ns() + 100_000_000;
            for child in &mut children {
                let stdin = child.stdin.as_mut().unwrap();
                writeln!(stdin, "{start}").unwrap();
                stdin.flush().unwrap();
            }
            start
        }
    };
    let wait_until = |t: u64| {
        let now = unix_ns();
        if t > now {
            std::thread::sleep(Duration::from_nanos(t - now));
        }
    };
    for (at, event) in setup.events {
        // An event before the traffic (a negative lead is not expressible) happens at once.
        wait_until(start + at.as_nanos() as u64);
        event();
    }
    let window = setup
        .window
        .map(|(from, to)| (start + from.as_nanos() as u64, start + to.as_nanos() as u64));
    let mut per_algo: Vec<(Trace, Vec<Value>)> =
        algos.iter().map(|_| (Vec::new(), Vec::new())).collect();
    for (mut child, mut out) in children.into_iter().zip(outputs) {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut out, &mut text).unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "a worker failed: {status:?}");
        let line = text
            .lines()
            .find_map(|l| l.split_once("FLEET-RESULT ").map(|(_, json)| json))
            .expect("a worker's result line");
        let v: Value = serde_json::from_str(line).unwrap();
        for (i, name) in algos.iter().enumerate() {
            let a = &v[*name];
            per_algo[i]
                .0
                .extend(a["trace"].as_array().unwrap().iter().map(|r| {
                    (
                        r[0].as_u64().unwrap(),
                        r[1].as_u64().unwrap() as u32,
                        r[2].as_bool().unwrap(),
                    )
                }));
            per_algo[i].1.push(a["stats"].clone());
        }
    }
    // Each worker, from halfway through, found every worker's state under an id of its own
    // (null: Redis never answered it; fewer: two workers under one id).
    for (name, (_, stats)) in algos.iter().zip(&per_algo) {
        for ids in stats.iter().filter_map(|s| s.get("instances")) {
            assert_eq!(*ids, WORKERS, "{name}: instance ids in the hashes");
        }
    }
    Run {
        shape,
        start,
        duration,
        outage: window,
        algos: algos
            .iter()
            .zip(per_algo)
            .map(|(&name, (mut trace, stats))| {
                trace.sort_unstable();
                AlgoRun { name, trace, stats }
            })
            .collect(),
    }
}

/// [`run`] against a `redis-server` of its own, killed and restarted on its port as `outage`
/// says (`(at, down for)`); `None` without `redis-server`.
pub fn on_a_server(
    worker_args: &[&str],
    shape: Shape,
    algos: &[&'static str],
    secs: Duration,
    outage: Option<(Duration, Duration)>,
) -> Option<Run> {
    use crate::redis_server::Server;
    let server = Server::start()?;
    let port = server.port;
    let target = Target {
        url: server.url(),
        seeds: Vec::new(),
    };
    let server = std::cell::RefCell::new(Some(server));
    let outage = outage.map(|(at, down_for)| Outage {
        at,
        down_for,
        kill: Box::new(|| drop(server.borrow_mut().take())),
        restart: Box::new(|| *server.borrow_mut() = Server::start_on(Some(port))),
    });
    Some(run(worker_args, &target, shape, algos, secs, outage))
}

/// What one exact in-memory limiter answers to the same requests, in the same order.
pub fn exact(name: &str, shape: Shape, t: &Trace) -> Vec<bool> {
    fn replay<A: Algorithm>(algo: A, t: &Trace) -> Vec<bool> {
        let clock = ManualClock::default();
        let l = CasLimiter::<u32, A, _>::with_clock(algo, clock.clone());
        t.iter()
            .map(|&(at, key, _)| {
                clock.set(Duration::from_nanos(at));
                l.check(&key).is_allowed()
            })
            .collect()
    }
    match name {
        "gcra" => replay(gcra(shape), t),
        "fixed" => replay(fixed(shape), t),
        "sliding" => replay(sliding(shape), t),
        "earrrl" => replay(earrrl(shape), t),
        _ => replay(exponential(shape), t),
    }
}

/// The fleet's answers against one exact limiter's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Comparison {
    pub requests: u64,
    pub fleet: u64,
    pub exact: u64,
    /// Denied by the fleet, allowed by the exact limiter.
    pub wrongly_denied: u64,
    /// Allowed by the fleet, denied by the exact limiter.
    pub wrongly_allowed: u64,
}

impl Comparison {
    pub fn ratio(&self) -> f64 {
        self.fleet as f64 / self.exact.max(1) as f64
    }
    pub fn wrongly_denied_share(&self) -> f64 {
        self.wrongly_denied as f64 / self.requests.max(1) as f64
    }
    pub fn wrongly_allowed_share(&self) -> f64 {
        self.wrongly_allowed as f64 / self.requests.max(1) as f64
    }
}

/// The comparison over the requests for which `keep(key)` holds.
pub fn compare(a: &AlgoRun, shape: Shape, keep: impl Fn(u32) -> bool) -> Comparison {
    let exact = exact(a.name, shape, &a.trace);
    let mut c = Comparison::default();
    for (&(_, key, fleet), exact) in a.trace.iter().zip(exact) {
        if !keep(key) {
            continue;
        }
        c.requests += 1;
        c.fleet += fleet as u64;
        c.exact += exact as u64;
        c.wrongly_denied += (!fleet && exact) as u64;
        c.wrongly_allowed += (fleet && !exact) as u64;
    }
    c
}

/// Each key's trace.
pub fn by_key(t: &Trace) -> HashMap<u32, Vec<(u64, bool)>> {
    let mut out: HashMap<u32, Vec<(u64, bool)>> = HashMap::new();
    for &(at, key, ok) in t {
        out.entry(key).or_default().push((at, ok));
    }
    out
}

/// Admitted requests of `key`.
pub fn admitted(t: &Trace, key: u32) -> u64 {
    t.iter().filter(|r| r.1 == key && r.2).count() as u64
}

/// Admitted requests of `key` per second of the run (index 0: the first second).
pub fn per_second(run: &Run, t: &Trace, key: u32) -> Vec<u64> {
    let secs = run.duration.as_secs() as usize;
    let mut out = vec![0; secs];
    for &(at, k, ok) in t {
        let s = (at.saturating_sub(run.start) / 1_000_000_000) as usize;
        if k == key && ok && s < secs {
            out[s] += 1;
        }
    }
    out
}

/// The most any fixed 1 s window (aligned to the Unix epoch) admitted of one key.
pub fn max_per_window(t: &[(u64, bool)]) -> u64 {
    let mut counts = HashMap::new();
    for &(at, ok) in t {
        if ok {
            *counts.entry(at / WINDOW_NS).or_insert(0u64) += 1;
        }
    }
    counts.into_values().max().unwrap_or(0)
}

/// The sliding window counter's estimate (previous 1 s window weighted by what is left of
/// it, plus the current one) at each of a key's admissions: its largest value.
pub fn max_sliding_estimate(t: &[(u64, bool)]) -> f64 {
    let w = WINDOW_NS;
    let mut counts = HashMap::new();
    let mut worst: f64 = 0.0;
    for &(at, ok) in t {
        if !ok {
            continue;
        }
        let i = at / w;
        *counts.entry(i).or_insert(0u64) += 1;
        let prev = *counts.get(&(i.wrapping_sub(1))).unwrap_or(&0) as f64;
        let cur = counts[&i] as f64;
        worst = worst.max(prev * (1.0 - (at - i * w) as f64 / w as f64) + cur);
    }
    worst
}

/// The largest lag any worker's limiter saw: a sync round's, plus a push's delivery.
pub fn lag(a: &AlgoRun) -> Duration {
    let max = |k: &str| {
        a.stats
            .iter()
            .map(|s| s[k].as_u64().unwrap())
            .max()
            .unwrap()
    };
    Duration::from_nanos(max("sync_lag_max") + max("push_lag_max"))
}

/// What the docs bound a window's excess by: what the other instances admit within one
/// lag, at their demand on `key` (the instance that notices last excepted).
pub fn window_excess(run: &Run, a: &AlgoRun, key: u32) -> u64 {
    let lag = lag(a).as_secs_f64();
    let parts: Vec<u64> = (0..WORKERS)
        .map(|w| (run.shape.rate(w, key) * lag).ceil() as u64)
        .collect();
    parts.iter().sum::<u64>() - parts.iter().min().unwrap()
}

/// GCRA's allowance beyond `rate × span + burst` the docs state: each instance's part of the
/// burst (`⌊share × burst⌋`), admitted beyond its lease on a view a lag old.
pub fn gcra_allowance(shape: Shape) -> u64 {
    WORKERS as u64 * (shape.share() * shape.burst() as f64).floor() as u64
}

/// The most GCRA may admit of one key over `secs` seconds across the fleet, as the docs
/// state: `rate × secs + burst` and the [`gcra_allowance`].
pub fn gcra_most(shape: Shape, secs: f64) -> u64 {
    (shape.limit() * secs) as u64 + shape.burst() + gcra_allowance(shape)
}

/// GCRA's and the windows' bound on a hot `key` (G47, G48): GCRA never above
/// [`gcra_most`] plus `slack`; a window's worst (count, or sliding estimate) never above its
/// limit plus what the others admit within one lag ([`window_excess`]), `slack` and
/// `window_extra` (the fallback's shares where it decided). False for the algorithms it does
/// not bound (EARRRL, exponential: their callers compare with one exact limiter).
pub fn assert_gcra_or_window_bound(
    run: &Run,
    a: &AlgoRun,
    key: u32,
    slack: u64,
    window_extra: u64,
) -> bool {
    let shape = run.shape;
    let keys = by_key(&a.trace);
    let t = &keys[&key];
    let excess = window_excess(run, a, key);
    match a.name {
        "gcra" => {
            let span = (t.last().unwrap().0 - t[0].0) as f64 / 1e9;
            let bound = gcra_most(shape, span) + slack;
            let got = admitted(&a.trace, key);
            assert!(got <= bound, "gcra key {key}: {got} > {bound}");
        }
        "fixed" => {
            let worst = max_per_window(t);
            let bound = shape.limit() as u64 + excess + slack + window_extra;
            assert!(
                worst <= bound,
                "fixed key {key}: {worst} in a window > {bound}"
            );
        }
        "sliding" => {
            let worst = max_sliding_estimate(t);
            let bound = shape.limit() + (excess + slack + window_extra) as f64;
            assert!(
                worst <= bound,
                "sliding key {key}: estimate {worst} > {bound}"
            );
        }
        _ => return false,
    }
    true
}

/// Script calls per key per sync interval over the run: the most any worker made, its keys
/// being every key of the shape (each is called at most once per interval, whatever the
/// rounds, but for the calls a request admitted near the limit hurries: see
/// [`calls_within_g54`]).
pub fn calls_per_key_interval(run: &Run, a: &AlgoRun) -> f64 {
    let intervals = run.duration.as_secs_f64() / INTERVAL.as_secs_f64();
    a.stats
        .iter()
        .map(|s| s["calls"].as_f64().unwrap() / (run.shape.keys() as f64 * intervals))
        .fold(0.0, f64::max)
}

/// G54: every worker called each key at most once per sync interval, plus at most once per
/// request the fleet admitted (a request admitted near the limit hurries its key's call to
/// the next round).
pub fn calls_within_g54(run: &Run, a: &AlgoRun) -> bool {
    let intervals = run.duration.as_secs_f64() / INTERVAL.as_secs_f64();
    let admitted = a.trace.iter().filter(|r| r.2).count() as f64;
    a.stats
        .iter()
        .all(|s| s["calls"].as_f64().unwrap() <= run.shape.keys() as f64 * intervals + admitted)
}

/// Every worker's stats as JSON on stderr, when `FLEET_DEBUG` is set.
pub fn debug_stats(a: &AlgoRun) {
    if std::env::var("FLEET_DEBUG").is_ok() {
        eprintln!("{}", serde_json::to_string(&a.stats).unwrap());
    }
}

/// A stat summed over the workers.
pub fn total(a: &AlgoRun, stat: &str) -> u64 {
    a.stats.iter().map(|s| s[stat].as_u64().unwrap()).sum()
}
