//! The compact store against its goals, all in one run: GCRA `check` at 1M uniform u64 keys
//! (all present) with 1 and 2 threads for the compact store (on the exact TSC clock and on a
//! 1 ms `CoarseClock`), the papaya store, governor's keyed limiter (its default clock and its
//! 1 ms quanta upkeep clock) and flat-array baselines (index = key: the same clock read and
//! GCRA step with no look-up at all, on either clock, and a bare load + CAS with neither);
//! then bytes per key by RSS growth at 1M and 10M keys, each variant in a child process.
//!
//! `cargo bench --bench compact` (a table on stdout, no criterion: the ratios must come from
//! one run). `cargo bench --bench compact -- --quick` runs fewer rounds and skips 10M.

mod common;

use common::{gcra, rss_bytes};
use governor::clock::QuantaUpkeepClock;
use governor::{Quota, RateLimiter as Governor};
use hotlimit::{
    algo::Gcra, Algorithm, CasLimiter, Clock, CoarseClock, CompactLimiter, QuantaClock,
};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const KEYS: u64 = 1_000_000;
/// Pre-generated keys per thread, read in a cycle (a power of two).
const SEQ: usize = 1 << 20;

/// ns per request per thread: `threads` threads run `ops` requests each, over their own key
/// sequences, released together.
/// Generic over the check (not `dyn`), so each variant's loop is compiled with its check
/// inlined, as a caller's would be: an indirect call per request would hide part of the
/// overlap between consecutive requests that the CPU finds in a tight loop.
fn time<F: Fn(u64) + Sync>(threads: usize, ops: usize, seqs: &[Vec<u64>], check: &F) -> f64 {
    let barrier = Barrier::new(threads);
    let wall = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, seq) = (&barrier, &seqs[t]);
                s.spawn(move || {
                    barrier.wait();
                    let t0 = Instant::now();
                    for i in 0..ops {
                        check(seq[i & (SEQ - 1)]);
                    }
                    t0.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    });
    wall.as_nanos() as f64 / ops as f64
}

/// Child process: RSS growth per key after inserting `keys` keys into one store.
fn measure_rss(variant: &str, keys: u64) -> f64 {
    let before = rss_bytes();
    let clock = hotlimit::ManualClock::new();
    // Each arm reads the RSS while its store is still alive.
    let after = match variant {
        "compact" => {
            let l = CompactLimiter::<u64, Gcra>::builder(gcra())
                .max_keys(keys as usize)
                .clock(clock)
                .build()
                .unwrap();
            (0..keys).for_each(|k| {
                l.check(&k);
            });
            assert_eq!(l.len() as u64, keys, "no key evicted at the design load");
            black_box(&l);
            let rss = rss_bytes();
            let p = l.probe_stats();
            eprintln!(
                "compact, {keys} keys: mean {:.3} lines, max {} lines, {:.1}% in the home line, max reach {}",
                p.mean_lines,
                p.max_lines,
                p.in_home_line * 100.0,
                p.max_reach
            );
            rss
        }
        "papaya" => {
            let l = CasLimiter::<u64, Gcra, _>::with_clock(gcra(), clock);
            (0..keys).for_each(|k| {
                l.check(&k);
            });
            black_box(&l);
            rss_bytes()
        }
        _ => {
            let max = NonZeroU32::MAX;
            let l = Governor::keyed(Quota::per_second(max).allow_burst(max));
            (0..keys).for_each(|k| {
                let _ = l.check_key(&k);
            });
            black_box(&l);
            rss_bytes()
        }
    };
    (after - before) as f64 / keys as f64
}

fn child_rss(variant: &str, keys: u64) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--rss", variant, &keys.to_string()])
        .output()
        .unwrap();
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--rss") {
        let keys = args.get(i + 2).and_then(|k| k.parse().ok()).unwrap_or(KEYS);
        println!("{:.1}", measure_rss(&args[i + 1], keys));
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return; // `cargo bench -- --list`: nothing to list.
    }
    let quick = args.iter().any(|a| a == "--quick");
    let rounds = if quick { 3 } else { 7 };
    let ops = 4_000_000;

    let clock = QuantaClock::new();
    let algo = gcra();
    let compact = CompactLimiter::<u64, Gcra>::builder(algo)
        .max_keys(KEYS as usize)
        .build()
        .unwrap();
    let compact_manual = CompactLimiter::<u64, Gcra>::builder(algo)
        .max_keys(KEYS as usize)
        .clock(hotlimit::ManualClock::new())
        .build()
        .unwrap();
    let coarse = CoarseClock::new(Duration::from_millis(1));
    let compact_coarse = CompactLimiter::<u64, Gcra>::builder(algo)
        .max_keys(KEYS as usize)
        .clock(coarse.clone())
        .build()
        .unwrap();
    let papaya = CasLimiter::<u64, Gcra>::new(algo);
    let max = NonZeroU32::MAX;
    let quota = Quota::per_second(max).allow_burst(max);
    let governor = Governor::keyed(quota);
    let upkeep = QuantaUpkeepClock::from_interval(Duration::from_millis(1)).unwrap();
    let governor_upkeep = Governor::dashmap_with_clock(quota, upkeep);
    let flat: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(algo.fresh())).collect();
    for k in 0..KEYS {
        compact.check(&k);
        compact_manual.check(&k);
        compact_coarse.check(&k);
        papaya.check(&k);
        let _ = governor.check_key(&k);
        let _ = governor_upkeep.check_key(&k);
    }
    let seqs: Vec<Vec<u64>> = (0..2)
        .map(|t| {
            let mut rng = SmallRng::seed_from_u64(t + 1);
            (0..SEQ).map(|_| rng.random_range(0..KEYS)).collect()
        })
        .collect();

    // The flat array with the limiter's own work: clock read, GCRA step, CAS loop.
    let flat_step = |k: u64, now: u64| {
        let cell = &flat[k as usize];
        let mut cur = cell.load(Ordering::Acquire);
        loop {
            let mut new = cur;
            let d = algo.update(&mut new, now, 1);
            if new == cur {
                black_box(d);
                return;
            }
            match cell.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    black_box(d);
                    return;
                }
                Err(actual) => cur = actual,
            }
        }
    };
    let flat_gcra = |k: u64| flat_step(k, clock.now());
    let flat_gcra_coarse = |k: u64| flat_step(k, coarse.now());
    // The baseline: a GCRA-like CAS on the value, no clock.
    let flat_bare = |k: u64| {
        let cell = &flat[k as usize];
        let cur = cell.load(Ordering::Acquire);
        let _ = cell.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire);
    };
    let compact_check = |k: u64| {
        black_box(compact.check(&k));
    };
    let papaya_check = |k: u64| {
        black_box(papaya.check(&k));
    };
    let governor_check = |k: u64| {
        let _ = black_box(governor.check_key(&k));
    };
    let manual_check = |k: u64| {
        black_box(compact_manual.check(&k));
    };
    let coarse_check = |k: u64| {
        black_box(compact_coarse.check(&k));
    };
    let governor_upkeep_check = |k: u64| {
        let _ = black_box(governor_upkeep.check_key(&k));
    };
    const ROWS: usize = 9;
    let run = |row: usize, threads: usize, ops: usize| match row {
        0 => time(threads, ops, &seqs, &compact_check),
        1 => time(threads, ops, &seqs, &papaya_check),
        2 => time(threads, ops, &seqs, &governor_check),
        3 => time(threads, ops, &seqs, &flat_gcra),
        4 => time(threads, ops, &seqs, &flat_bare),
        5 => time(threads, ops, &seqs, &manual_check),
        6 => time(threads, ops, &seqs, &coarse_check),
        7 => time(threads, ops, &seqs, &flat_gcra_coarse),
        _ => time(threads, ops, &seqs, &governor_upkeep_check),
    };

    println!("compact store goals: GCRA check, {KEYS} uniform u64 keys (all present), ns per request per thread");
    println!(
        "median of {rounds} rounds of {ops} requests per thread; rounds interleave the variants"
    );
    println!();
    println!("| threads | clock | compact | flat array + clock + GCRA | governor | governor ÷ compact | compact ÷ flat |");
    println!("|---|---|---|---|---|---|---|");
    for threads in [1usize, 2] {
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); ROWS];
        // Warm-up round, not recorded.
        for row in 0..ROWS {
            run(row, threads, ops / 4);
        }
        for _ in 0..rounds {
            for (row, sample) in samples.iter_mut().enumerate() {
                sample.push(run(row, threads, ops));
            }
        }
        let m: Vec<f64> = samples.into_iter().map(median).collect();
        // The exact clock against governor's default; the coarse one against governor's
        // own cached clock as well as its default.
        for (clock, c, flat, gov) in [
            ("TSC", m[0], m[3], m[2]),
            ("coarse 1 ms", m[6], m[7], m[2]),
            ("coarse 1 ms, governor upkeep 1 ms", m[6], m[7], m[8]),
        ] {
            println!(
                "| {threads} | {clock} | {c:.1} | {flat:.1} | {gov:.1} | {:.2} | {:.2} |",
                gov / c,
                c / flat
            );
        }
        eprintln!(
            "  ({threads} thread(s): papaya {:.1} ns ({:.2}x compact); flat array bare CAS {:.1} ns; compact on a manual clock, no clock read: {:.1} ns)",
            m[1],
            m[1] / m[0],
            m[4],
            m[5]
        );
    }
    let stats = compact.probe_stats();
    println!();
    println!(
        "probe lengths at {KEYS} keys: mean {:.3} lines, max {} lines, {:.1}% in the home line, max reach {}",
        stats.mean_lines,
        stats.max_lines,
        stats.in_home_line * 100.0,
        stats.max_reach
    );
    drop((
        compact,
        compact_manual,
        compact_coarse,
        papaya,
        governor,
        governor_upkeep,
        flat,
    ));

    println!();
    println!("| keys | compact bytes/key | papaya bytes/key | governor bytes/key |");
    println!("|---|---|---|---|");
    let sizes: &[u64] = if quick { &[KEYS] } else { &[KEYS, 10 * KEYS] };
    for &keys in sizes {
        println!(
            "| {keys} | {} | {} | {} |",
            child_rss("compact", keys),
            child_rss("papaya", keys),
            child_rss("governor", keys)
        );
    }
}
