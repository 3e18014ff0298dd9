//! Eviction costs: bytes per key, the time to sweep 1M keys, and `check` latency while a sweep
//! runs; then a flood of 2M new keys against `max_keys(100_000)` per store and clock (new keys
//! per second, peak RSS growth, eviction passes). `cargo bench --bench eviction` prints both
//! tables, `cargo bench --bench eviction -- flood` the second only (no criterion: these are
//! one-shot measurements of memory, latency distributions and whole runs, not of a repeated
//! operation).
//!
//! Bytes per key are measured in a child process per variant (this binary re-run with
//! `--rss <variant>`), so one variant's freed memory cannot flatter the next. The `compact`
//! row is the fixed-capacity `CompactLimiter` sized for the 1M keys (its table is allocated
//! whole at build, so its bytes per key are the table's).

mod common;

use common::flood::{self, ClockKind, Shape, Store};
use common::rss_bytes;
use hdrhistogram::Histogram;
use hotlimit::algo::Gcra;
use hotlimit::store::{Cas, Keys, Locked, Map, Variant};
use hotlimit::Metrics;
use hotlimit::{Clock, CompactLimiter, Limiter, ManualClock, QuantaClock, RateLimiter};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const KEYS: u64 = 1_000_000;

/// A limiter of any store, as this bench meets it: its checks, and its sweeps.
trait Swept: RateLimiter<u64> {
    fn sweep(&self) -> Metrics;
}

impl<S: Keys<u64>> Swept for Limiter<S> {
    fn sweep(&self) -> Metrics {
        Limiter::sweep(self)
    }
}

fn gcra() -> Gcra {
    "10/s burst 5".parse().unwrap()
}

/// A limiter of `variant` running `algo` on `clock`, judging idleness `grace` behind it: the
/// papaya store (`cas`, `mutex`) or the compact store sized for the 1M keys (`compact`).
fn build<C: Clock>(variant: &str, algo: Gcra, clock: C, grace: Duration) -> Box<dyn Swept> {
    match variant {
        "cas" => Box::new(papaya::<Cas, C>(algo, clock, grace)),
        "mutex" => Box::new(papaya::<Locked, C>(algo, clock, grace)),
        _ => Box::new(
            CompactLimiter::<u64, Gcra>::builder(algo)
                .max_keys(KEYS as usize)
                .clock(clock)
                .sweep_grace(grace)
                .build()
                .unwrap(),
        ),
    }
}

fn papaya<V: Variant<Gcra>, C: Clock>(
    algo: Gcra,
    clock: C,
    grace: Duration,
) -> Limiter<Map<u64, Gcra, C, V>> {
    Limiter::<Map<u64, Gcra, QuantaClock, V>>::builder(algo)
        .clock(clock)
        .sweep_grace(grace)
        .build()
        .unwrap()
}

/// A limiter of `variant` holding all 1M keys.
fn filled<C: Clock>(variant: &str, algo: Gcra, clock: C, grace: Duration) -> Box<dyn Swept> {
    let limiter = build(variant, algo, clock, grace);
    for key in 0..KEYS {
        let _ = limiter.check(&key);
    }
    limiter
}

/// Child process: RSS growth for 1M keys in one variant (the compact store's table included).
fn measure_rss(variant: &str) -> f64 {
    let before = rss_bytes();
    let limiter = filled(
        variant,
        gcra(),
        ManualClock::default(),
        Duration::from_secs(1),
    );
    let after = rss_bytes();
    black_box(&limiter);
    (after - before) as f64 / KEYS as f64
}

fn child_rss(variant: &str) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--rss", variant])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Time to sweep 1M keys all live (scanned only): the first sweep after the fill (which also
/// finishes papaya's pending incremental resize) and the next one; then all idle (all
/// evicted).
fn sweep_times(variant: &str) -> (Duration, Duration, Duration) {
    let clock = ManualClock::default();
    let limiter = filled(variant, gcra(), clock.clone(), Duration::ZERO);
    let first = limiter.sweep();
    let live = limiter.sweep();
    assert_eq!((live.scanned, live.evicted_idle), (KEYS, 0));
    clock.advance(Duration::from_secs(1));
    let idle = limiter.sweep();
    assert_eq!(idle.evicted_idle, KEYS);
    (first.sweep_busy, live.sweep_busy, idle.sweep_busy)
}

/// `check` latency over 1M live keys, with or without another thread sweeping in a loop.
fn latency(variant: &str, with_sweeps: bool) -> Histogram<u64> {
    let quota = "1000000000/s".parse().unwrap();
    let limiter = filled(
        variant,
        quota,
        QuantaClock::default(),
        Duration::from_secs(1),
    );
    timed_checks(
        with_sweeps,
        &|k| {
            let _ = black_box(limiter.check(&k));
        },
        &|| {
            black_box(limiter.sweep());
        },
    )
}

/// 2M timed `check`s of uniform random keys, with or without `sweep` looping on another thread.
fn timed_checks(
    with_sweeps: bool,
    check: &(dyn Fn(u64) + Sync),
    sweep: &(dyn Fn() + Sync),
) -> Histogram<u64> {
    let mut hist = Histogram::<u64>::new(3).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        if with_sweeps {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    sweep();
                }
            });
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2_000_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = x % KEYS;
            let t = Instant::now();
            check(key);
            hist.saturating_record(t.elapsed().as_nanos() as u64);
        }
        stop.store(true, Ordering::Relaxed);
    });
    hist
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--rss") {
        let bytes = measure_rss(args.get(i + 1).map_or("cas", String::as_str));
        println!("{bytes:.1}");
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--flood") {
        let n = |k: usize| args[i + k].parse::<usize>().unwrap();
        flood_row(n(1), n(2), n(3) == 1, n(4));
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return; // `cargo bench -- --list` asks harness=false benches to list; nothing to list.
    }
    if !args.iter().any(|a| a == "flood") {
        sweeps_and_latency();
        println!();
    }
    floods();
}

/// 2 threads x 1M new keys against `max_keys(100_000)`, each store on each clock, with and
/// without a 10 ms background sweeper, each in a child process (this binary re-run with
/// `--flood <store> <clock> <sweeper>`) so that its peak RSS is its own. Passes: sweeps by the
/// sweeper plus eviction passes run by inserting requests.
fn floods() {
    println!("key flood: 2 threads x 1M new u64 keys, max_keys 100k, GCRA 10/s burst 10");
    println!();
    println!("| store | clock | sweeper | new keys/s | peak len (bound) | peak RSS of the process | eviction passes | evicted |");
    println!("|---|---|---|---|---|---|---|---|");
    let child = |store: usize, clock: usize, sweeper: usize, max_keys: usize| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .arg("--flood")
            .args([store, clock, sweeper, max_keys].map(|n| n.to_string()))
            .output()
            .unwrap();
        print!("{}", String::from_utf8_lossy(&out.stdout));
    };
    for store in 0..Store::ALL.len() {
        // The baseline: the same 2M new keys into a store bounded above them (nothing
        // evicted; the compact table sized for 4M keys).
        child(store, 2, 0, 4_000_000);
        for clock in 0..ClockKind::ALL.len() {
            for sweeper in 0..2 {
                child(store, clock, sweeper, 100_000);
            }
        }
    }
}

/// Child process: one flood, one table row.
fn flood_row(store: usize, clock: usize, sweeper: bool, max_keys: usize) {
    let (store, clock) = (Store::ALL[store], ClockKind::ALL[clock]);
    let shape = Shape {
        store,
        clock,
        max_keys,
        threads: 2,
        keys_per_thread: 1_000_000,
        sweeper,
    };
    let r = flood::run(shape, Duration::from_secs(300)).unwrap();
    println!(
        "| {}{} | {} | {} | {:.2} M | {} ({}) | {:.1} MiB | {} | {} |",
        store.name(),
        if max_keys > 100_000 {
            ", unbounded (baseline)"
        } else {
            ""
        },
        clock.name(),
        if sweeper { "10 ms" } else { "none" },
        r.keys_per_sec(&shape) / 1e6,
        r.peak_len,
        r.bound,
        flood::peak_rss_bytes() as f64 / (1 << 20) as f64,
        r.totals.sweeps,
        r.totals.evicted_capacity + r.totals.evicted_idle
    );
}

fn sweeps_and_latency() {
    println!("eviction benchmark, {KEYS} u64 keys, GCRA");
    println!();
    println!("| variant | bytes/key (RSS) | sweep, all live: first / next | sweep, all idle | check p50 / p99 / p99.9, no sweep | same, sweeping |");
    println!("|---|---|---|---|---|---|");
    for variant in ["cas", "mutex", "compact"] {
        let rss = child_rss(variant);
        let (first, live, idle) = sweep_times(variant);
        let (quiet, busy) = (latency(variant, false), latency(variant, true));
        let q = |h: &Histogram<u64>| {
            format!(
                "{} / {} / {} ns",
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.value_at_quantile(0.999)
            )
        };
        println!(
            "| {variant} | {rss} | {:.1} / {:.1} ms | {:.1} ms | {} | {} |",
            first.as_secs_f64() * 1e3,
            live.as_secs_f64() * 1e3,
            idle.as_secs_f64() * 1e3,
            q(&quiet),
            q(&busy)
        );
    }
}
