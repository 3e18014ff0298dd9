//! A flood of new keys against a capacity bound, shared by `tests/flood.rs` (which asserts the
//! bound and that it ends) and `benches/eviction.rs` (which reports its rate and memory).
//! Included by `#[path]`, not through `common/mod.rs`, so the other tests do not compile it.

#![allow(dead_code)]

#[path = "id.rs"]
pub mod id;

use hotlimit::store::{Map, Variant};
use hotlimit::{
    algo::Gcra, CasLimiter, Clock, CoarseClock, CompactLimiter, Limiter, ManualClock, MutexLimiter,
    QuantaClock,
};
use hotlimit::{Metrics, RateLimiter};
use id::Id;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The quota of every flooded key: each new key is admitted and stays live for a second.
pub fn quota() -> Gcra {
    "10/s burst 10".parse().unwrap()
}

/// The clocks a flood runs on: the ones whose keys tie in `idle_at` (a frozen manual clock,
/// a 1 ms coarse clock) and the exact clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockKind {
    Frozen,
    Coarse,
    Exact,
}

impl ClockKind {
    pub const ALL: [ClockKind; 3] = [ClockKind::Frozen, ClockKind::Coarse, ClockKind::Exact];

    pub fn name(self) -> &'static str {
        match self {
            ClockKind::Frozen => "frozen manual",
            ClockKind::Coarse => "coarse 1 ms",
            ClockKind::Exact => "exact (TSC)",
        }
    }
}

/// Which store is flooded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Cas,
    Mutex,
    Compact,
}

impl Store {
    pub const ALL: [Store; 3] = [Store::Cas, Store::Mutex, Store::Compact];

    pub fn name(self) -> &'static str {
        match self {
            Store::Cas => "CasLimiter",
            Store::Mutex => "MutexLimiter",
            Store::Compact => "CompactLimiter",
        }
    }
}

/// One flood's shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub store: Store,
    pub clock: ClockKind,
    pub max_keys: usize,
    pub threads: u64,
    /// Distinct new keys each thread inserts (no two threads share one).
    pub keys_per_thread: u64,
    /// A background sweeper every 10 ms, or none.
    pub sweeper: bool,
}

/// What a flood measured.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    pub elapsed: Duration,
    /// The largest `len()` any inserting thread saw right after its insert.
    pub peak_len: usize,
    /// The documented bound on `len()` for this store and thread count.
    pub bound: usize,
    pub len_after: usize,
    /// Peak resident set growth over the flood, sampled every 5 ms (0 off Linux).
    pub peak_rss_growth: u64,
    /// Sweeps and evictions, by hand, by the background sweeper, and by inserts.
    pub totals: Metrics,
    /// New keys denied their first request: each started from the debt the table holds for
    /// it (its cells shared with keys evicted while they owed), the price of never resetting
    /// a limit. On a frozen clock no debt is ever paid, so it grows with the flood.
    pub denied: u64,
}

impl Report {
    pub fn keys_per_sec(&self, shape: &Shape) -> f64 {
        (shape.threads * shape.keys_per_thread) as f64 / self.elapsed.as_secs_f64()
    }
}

/// A store under flood, as the flood sees it.
trait Target: Send + Sync {
    fn check(&self, key: u64) -> bool;
    fn len(&self) -> usize;
    fn totals(&self) -> Metrics;
}

impl<V: Variant<Gcra>, C: Clock> Target for Limiter<Map<Id, Gcra, C, V>> {
    fn check(&self, key: u64) -> bool {
        RateLimiter::check(self, &Id(key)).is_allowed()
    }
    fn len(&self) -> usize {
        self.metrics().keys as usize
    }
    fn totals(&self) -> Metrics {
        self.metrics()
    }
}

impl<C: Clock> Target for CompactLimiter<u64, Gcra, C> {
    fn check(&self, key: u64) -> bool {
        RateLimiter::check(self, &key).is_allowed()
    }
    fn len(&self) -> usize {
        self.metrics().keys as usize
    }
    fn totals(&self) -> Metrics {
        self.metrics()
    }
}

/// The store of `shape` on `clock`.
fn build<C: Clock>(shape: &Shape, clock: C) -> Box<dyn Target> {
    // The stores' builders share these setters but no trait (yet), hence a macro.
    macro_rules! built {
        ($limiter:ty) => {{
            let b = <$limiter>::builder(quota())
                .clock(clock)
                .max_keys(shape.max_keys);
            let b = if shape.sweeper {
                b.sweep_every(Duration::from_millis(10))
            } else {
                b
            };
            Box::new(b.build().unwrap())
        }};
    }
    match shape.store {
        Store::Cas => built!(CasLimiter<Id, Gcra>),
        Store::Mutex => built!(MutexLimiter<Id, Gcra>),
        Store::Compact => built!(CompactLimiter<u64, Gcra>),
    }
}

/// The documented bound on `len()` under a flood.
pub fn max_keys_bound(shape: &Shape) -> usize {
    shape.max_keys + shape.max_keys / 4 + shape.threads as usize
}

/// Runs the flood on its own thread and waits at most `deadline` for it. `Err` if it did not
/// finish by then: the flood livelocked (its threads are left running; the test process ends
/// them when it exits).
pub fn run(shape: Shape, deadline: Duration) -> Result<Report, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let target = match shape.clock {
            ClockKind::Frozen => build(&shape, ManualClock::default()),
            ClockKind::Coarse => build(&shape, CoarseClock::new(Duration::from_millis(1)).unwrap()),
            ClockKind::Exact => build(&shape, QuantaClock::default()),
        };
        let _ = tx.send(flood(&shape, &*target));
    });
    rx.recv_timeout(deadline).map_err(|_| {
        format!(
            "{} on a {} clock ({} threads x {} keys, max_keys {}, sweeper {}): not done in {deadline:?}",
            shape.store.name(),
            shape.clock.name(),
            shape.threads,
            shape.keys_per_thread,
            shape.max_keys,
            shape.sweeper
        )
    })
}

fn flood(shape: &Shape, target: &dyn Target) -> Report {
    let peak_len = AtomicUsize::new(0);
    let denied = AtomicU64::new(0);
    let peak_rss = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let rss_before = rss_bytes();
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                peak_rss.fetch_max(rss_bytes(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let inserters: Vec<_> = (0..shape.threads)
            .map(|t| {
                let (peak_len, denied) = (&peak_len, &denied);
                s.spawn(move || {
                    let first = t * shape.keys_per_thread;
                    let mut peak = 0;
                    for key in first..first + shape.keys_per_thread {
                        if !target.check(key) {
                            denied.fetch_add(1, Ordering::Relaxed);
                        }
                        // papaya's `len()` sums per-thread counters one by one, so a reader
                        // preempted between two of them can over-count by what the others did
                        // meanwhile (thousands, with a sweeper running). Keys really held stay
                        // held for the second reading; a torn sum does not repeat.
                        peak = peak.max(target.len().min(target.len()));
                    }
                    peak_len.fetch_max(peak, Ordering::Relaxed);
                })
            })
            .collect();
        for inserter in inserters {
            inserter.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    let elapsed = started.elapsed();
    Report {
        elapsed,
        peak_len: peak_len.into_inner(),
        // Both stores (`max_keys` on their builders): a request inserting beyond
        // `max_keys + max_keys/4` evicts first, so at most one key more per inserting thread.
        bound: max_keys_bound(shape),
        len_after: target.len(),
        peak_rss_growth: peak_rss.into_inner().saturating_sub(rss_before),
        denied: denied.into_inner(),
        totals: target.totals(),
    }
}

/// This process's resident set size in bytes (Linux `/proc/self/statm`; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// This process's peak resident set size in bytes (`VmHWM` in `/proc/self/status`; 0 off
/// Linux): meaningful in a process that ran one flood only.
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
