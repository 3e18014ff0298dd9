//! The allocation gate: on a key the limiter already holds, `check`, `check_n`, `peek`,
//! `take` and `settle`, a partial grant and both batches allocate nothing, on every in-memory
//! store and every algorithm. The promise "no allocation for a known key" (README), measured
//! with a counting global allocator instead of read off the code.
//!

use hotlimit::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{CasLimiter, CompactLimiter, DirectLimiter, ManualClock, MutexLimiter};
use std::hint::black_box;
use std::time::Duration;

// dhat's allocator counts every allocation of the process (no `unsafe` of ours): one test
// function in this binary, so no other test allocates while it measures.
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// How many allocations `f` makes.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = dhat::HeapStats::get().total_blocks;
    f();
    dhat::HeapStats::get().total_blocks - before
}

/// Every operation on `$key` (already held, the clock moved past any refill): none allocates.
/// The batches' output vectors are given their capacity up front, as a caller reusing them
/// would have. A macro, as the operations are each limiter's own.
macro_rules! gate {
    ($what:expr, $limiter:expr, $clock:expr, $key:expr) => {{
        let (what, limiter, clock, key) = ($what, &$limiter, &$clock, $key);
        let hour = Duration::from_secs(3600);
        // Warm up: the key's entry, this thread's reclamation slot, the clock.
        let (mut out, mut out_n) = (Vec::with_capacity(4), Vec::with_capacity(4));
        for _ in 0..4 {
            let _ = limiter.check(key);
            if let Ok(mut t) = limiter.request(key).take() {
                let _ = limiter.request(key).settle(&mut t, 1);
            }
            limiter.check_batch([key, key], &mut out);
            limiter.check_n_batch([(key, 1), (key, 1)], &mut out_n);
            clock.advance(hour);
        }
        let check = |op: &str, n: u64| {
            assert_eq!(n, 0, "{what}: {op} allocated {n} times on a known key");
            clock.advance(hour);
        };
        check(
            "check",
            allocations(|| {
                let _ = black_box(limiter.check(key));
            }),
        );
        check(
            "check_n",
            allocations(|| {
                let _ = black_box(limiter.check_n(key, 1));
            }),
        );
        check(
            "peek",
            allocations(|| {
                let _ = black_box(limiter.request(key).peek());
            }),
        );
        check(
            "up_to",
            allocations(|| {
                let _ = black_box(limiter.request(key).cost(2).up_to());
            }),
        );
        let quota = limiter.algorithm().clone();
        check(
            "check under a quota",
            allocations(|| {
                let _ = black_box(limiter.request(key).quota(&quota).check());
            }),
        );
        check(
            "take + settle",
            allocations(|| {
                if let Ok(mut t) = limiter.request(key).cost(1).take() {
                    let _ = limiter.request(key).settle(&mut t, 0);
                }
            }),
        );
        check(
            "check_batch",
            allocations(|| limiter.check_batch([key, key, key], &mut out)),
        );
        check(
            "check_n_batch",
            allocations(|| limiter.check_n_batch([(key, 1), (key, 2)], &mut out_n)),
        );
    }};
}

/// Every store for one algorithm.
fn every_store<A: Algorithm + Clone + Send + Sync + 'static>(name: &str, algo: A) {
    let clock = ManualClock::default();
    let cas = CasLimiter::<String, A, _>::with_clock(algo.clone(), clock.clone());
    gate!(format!("CasLimiter<{name}>"), cas, clock, "client-1");
    // A `String` key is held inline up to 22 bytes, in an allocation of its own past that:
    // neither allocates to be found.
    let long = "client-with-a-key-longer-than-22-bytes";
    let _ = cas.check(long);
    gate!(format!("CasLimiter<{name}>, a long key"), cas, clock, long);
    let mutex = MutexLimiter::<String, A, _>::with_clock(algo.clone(), clock.clone());
    gate!(format!("MutexLimiter<{name}>"), mutex, clock, "client-1");
    let compact = CompactLimiter::<u64, A, _>::with_clock(algo.clone(), clock.clone());
    gate!(format!("CompactLimiter<{name}>"), compact, clock, &7);
    // `u64` keys: the compact table without a bound under a one-word state, else the map.
    let cas_u64 = CasLimiter::<u64, A, _>::with_clock(algo.clone(), clock.clone());
    gate!(format!("CasLimiter<u64, {name}>"), cas_u64, clock, &7);
    let direct = DirectLimiter::<A, _>::with_clock(algo, clock.clone());
    gate!(format!("DirectLimiter<{name}>"), direct, clock, &());
}

// Pins G36.
#[test]
fn no_operation_on_a_known_key_allocates_on_any_store() {
    let _profiler = dhat::Profiler::builder().testing().build();
    // The gate can fail: an allocation is seen.
    assert_eq!(allocations(|| drop(black_box(vec![1u8; 16]))), 1);
    assert_eq!(allocations(|| ()), 0);

    let w = Duration::from_secs(60);
    every_store("Gcra", "10/s burst 5".parse::<Gcra>().unwrap());
    every_store("FixedWindow", FixedWindow::new(10, w).unwrap());
    every_store("SlidingWindow", SlidingWindow::new(10, w).unwrap());
    let half_life = Duration::from_secs(2);
    every_store(
        "Earrrl",
        Earrrl::new(half_life, "3/s".parse().unwrap()).unwrap(),
    );
    every_store("Exponential", Exponential::new(10.0, w).unwrap());
    // The sub-window's buckets live on the heap: a peek or a partial grant reads them in
    // place (the default `Algorithm::peek` steps a copy, an allocation this gate found).
    every_store("SubWindow", SubWindow::new(10, w, 60).unwrap());

    // The sliding log keeps a log per key (O(limit)): once it has held its limit's entries,
    // its buffer is reused and a decision allocates nothing either.
    let clock = ManualClock::default();
    let log =
        CasLimiter::<String, _, _>::with_clock(SlidingLog::new(10, w).unwrap(), clock.clone());
    for _ in 0..20 {
        let _ = log.check("k");
    }
    // Its peek reads the log in place, as the sub-window's does its buckets.
    gate!("CasLimiter<SlidingLog>", log, clock, "k");

    // What an empty limiter holds: a `CasLimiter` of `u64` keys is the compact table without a
    // bound, which allocates its first chunk (256 lines), its insert stripes and a small debt
    // table at build: at most 20 KiB more than an empty limiter on the map, whose counters
    // are most of what either holds (`docs/limiters.md`).
    let held = |build: &dyn Fn() -> Box<dyn std::any::Any>| {
        let before = dhat::HeapStats::get().curr_bytes;
        let limiter = build();
        let held = dhat::HeapStats::get().curr_bytes - before;
        drop(limiter);
        held
    };
    let g = "10/s".parse::<Gcra>().unwrap();
    let table = held(&|| {
        Box::new(CasLimiter::<u64, Gcra, _>::with_clock(
            g,
            ManualClock::default(),
        ))
    });
    let map = held(&|| {
        Box::new(CasLimiter::<String, Gcra, _>::with_clock(
            g,
            ManualClock::default(),
        ))
    });
    eprintln!("an empty CasLimiter holds {table} bytes of u64 keys, {map} of String keys");
    assert!(table <= map + (20 << 10), "{table} against {map}");
}
