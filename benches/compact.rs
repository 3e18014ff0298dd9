//! The compact store against its goals, all in one run: GCRA `check` at 1M uniform u64 keys
//! (all present) with 1 and 2 threads for the compact store (on the exact TSC clock and on a
//! 1 ms `CoarseClock`), the papaya store, governor's keyed limiter (its default clock and its
//! 1 ms quanta upkeep clock) and flat-array baselines (index = key: the same clock read and
//! GCRA step with no look-up at all, on either clock, and a bare load + CAS with neither);
//! then where the time goes: the compact store against tables of its own shape and size with
//! none of its guarantees (its floor); then bytes per key by RSS growth at 1M and 10M keys,
//! each variant in a child process.
//!
//! `cargo bench --bench compact` (a table on stdout, no criterion: the ratios must come from
//! one run). `cargo bench --bench compact -- --quick` runs fewer rounds and skips 10M.

mod common;

use common::{gcra, rss_bytes};
use governor::clock::QuantaUpkeepClock;
use governor::{Quota, RateLimiter as Governor};
use hotlimit::RateLimiter;
use hotlimit::{
    algo::{Algorithm, Gcra},
    CasLimiter, Clock, CoarseClock, CompactLimiter, QuantaClock,
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
    let clock = hotlimit::ManualClock::default();
    // Each arm reads the RSS while its store is still alive.
    let after = match variant {
        "compact" => {
            let l = CompactLimiter::<u64, Gcra>::builder(gcra())
                .max_keys(keys as usize)
                .clock(clock)
                .build()
                .unwrap();
            (0..keys).for_each(|k| {
                let _ = l.check(&k);
            });
            assert_eq!(l.metrics().keys, keys, "no key evicted at the design load");
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
                let _ = l.check(&k);
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

/// The floors under any look-up at the compact store's footprint: tables shaped like its own
/// (the same slot count, four `(key, state)` pairs to a 64-byte line, home line by a seeded
/// hash and multiply-shift, keys placed from their home line on) but with none of its
/// guarantees: no insert, no reach, no eviction. `W` is the line: eight 8-byte words (state
/// updated by an 8-byte CAS; *not* ABA-safe, so not a limiter) or four 16-byte words (the
/// compact store's own double-width CAS).
struct Floor<W> {
    lines: Vec<W>,
    hasher: ahash::RandomState,
}

#[repr(align(64))]
struct Words8([AtomicU64; 8]);
#[repr(align(64))]
struct Words16([portable_atomic::AtomicU128; 4]);

/// A free slot's state word (as the compact store's).
const FREE: u64 = u64::MAX;

impl<W> Floor<W> {
    /// `key`'s home line and the slot of it tried first, as the compact store picks them.
    #[inline(always)]
    fn home(&self, key: u64) -> (usize, usize) {
        let h = self.hasher.hash_one(key);
        let line = ((u128::from(h) * self.lines.len() as u128) >> 64) as usize;
        (line, (h >> 1) as usize % 4)
    }

    /// The `j`-th slot a look-up from `home` tries: the home line from its first slot, then
    /// the next lines in order (the compact store's order).
    #[inline(always)]
    fn probe(&self, (home, first): (usize, usize), j: usize) -> (&W, usize) {
        let (d, slot) = if j < 4 {
            (0, (first + j) % 4)
        } else {
            (j / 4, j % 4)
        };
        (&self.lines[(home + d) % self.lines.len()], slot)
    }

    /// Places keys `0..keys` in the first free slot in probe order.
    fn build(
        keys: u64,
        line: impl Fn() -> W,
        free: impl Fn(&W, usize) -> bool,
        put: impl Fn(&W, usize, u64),
    ) -> Self {
        let slots = (keys as usize * 4).div_ceil(3);
        let lines = (0..slots.div_ceil(4)).map(|_| line()).collect();
        let floor = Self {
            lines,
            hasher: ahash::RandomState::new(),
        };
        for key in 0..keys {
            let home = floor.home(key);
            let (l, s) = (0..)
                .map(|j| floor.probe(home, j))
                .find(|&(l, s)| free(l, s))
                .unwrap();
            put(l, s, key);
        }
        floor
    }
}

impl Floor<Words8> {
    fn new(keys: u64, fresh: u64) -> Self {
        Self::build(
            keys,
            || {
                Words8(std::array::from_fn(|i| {
                    AtomicU64::new(if i % 2 == 1 { FREE } else { 0 })
                }))
            },
            |l, s| l.0[2 * s + 1].load(Ordering::Relaxed) == FREE,
            |l, s, key| {
                l.0[2 * s].store(key, Ordering::Relaxed);
                l.0[2 * s + 1].store(fresh, Ordering::Relaxed);
            },
        )
    }

    /// The state word of `key`: the home line's four keys compared at once (no branch per
    /// slot), the next lines one slot at a time.
    #[inline(always)]
    fn state(&self, key: u64) -> &AtomicU64 {
        let home = self.home(key);
        let w = &self.lines[home.0].0;
        let hit = (0..4).fold(0u32, |m, s| {
            m | (u32::from(w[2 * s].load(Ordering::Acquire) == key) << s)
        });
        if hit != 0 {
            return &w[2 * hit.trailing_zeros() as usize + 1];
        }
        (4..)
            .map(|j| self.probe(home, j))
            .find(|(l, s)| l.0[2 * s].load(Ordering::Acquire) == key)
            .map(|(l, s)| &l.0[2 * s + 1])
            .unwrap()
    }
}

impl Floor<Words16> {
    fn new(keys: u64, fresh: u64) -> Self {
        use portable_atomic::AtomicU128;
        Self::build(
            keys,
            || Words16(std::array::from_fn(|_| AtomicU128::new(u128::from(FREE)))),
            |l, s| l.0[s].load(portable_atomic::Ordering::Relaxed) as u64 == FREE,
            |l, s, key| {
                l.0[s].store(
                    (u128::from(key) << 64) | u128::from(fresh),
                    portable_atomic::Ordering::Relaxed,
                )
            },
        )
    }

    /// The GCRA step on `key`'s slot by double-width CAS, each slot loaded in probe order (as
    /// the compact store's look-up, without its reach or fallbacks).
    #[inline(always)]
    fn step(&self, key: u64, now: u64, algo: &Gcra) {
        use portable_atomic::Ordering::{AcqRel, Acquire};
        let home = self.home(key);
        for j in 0.. {
            let (l, s) = self.probe(home, j);
            let slot = &l.0[s];
            let mut cur = slot.load(Acquire);
            if (cur >> 64) as u64 != key {
                continue;
            }
            loop {
                let mut new = cur as u64;
                let _ = black_box(algo.update(&mut new, now, 1));
                let pair = (cur >> 64 << 64) | u128::from(new);
                match slot.compare_exchange_weak(cur, pair, AcqRel, Acquire) {
                    Ok(_) => return,
                    Err(actual) => cur = actual,
                }
            }
        }
    }
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

    let clock = QuantaClock::default();
    let algo = gcra();
    let compact = CompactLimiter::<u64, Gcra>::builder(algo)
        .max_keys(KEYS as usize)
        .build()
        .unwrap();
    let compact_manual = CompactLimiter::<u64, Gcra>::builder(algo)
        .max_keys(KEYS as usize)
        .clock(hotlimit::ManualClock::default())
        .build()
        .unwrap();
    let coarse = CoarseClock::new(Duration::from_millis(1)).unwrap();
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
        let _ = compact.check(&k);
        let _ = compact_manual.check(&k);
        let _ = compact_coarse.check(&k);
        let _ = papaya.check(&k);
        let _ = governor.check_key(&k);
        let _ = governor_upkeep.check_key(&k);
    }
    let seqs: Vec<Vec<u64>> = (0..2)
        .map(|t| {
            let mut rng = SmallRng::seed_from_u64(t + 1);
            (0..SEQ).map(|_| rng.random_range(0..KEYS)).collect()
        })
        .collect();

    let flat16: Vec<AtomicU64> = (0..2 * KEYS)
        .map(|_| AtomicU64::new(algo.fresh()))
        .collect();
    let floor8 = Floor::<Words8>::new(KEYS, algo.fresh());
    let floor16 = Floor::<Words16>::new(KEYS, algo.fresh());

    // A CAS loop with the limiter's own work (GCRA step), on any state word.
    let cas_step = |cell: &AtomicU64, now: u64| {
        let mut cur = cell.load(Ordering::Acquire);
        loop {
            let mut new = cur;
            let d = algo.update(&mut new, now, 1);
            if new == cur {
                let _ = black_box(d);
                return;
            }
            match cell.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let _ = black_box(d);
                    return;
                }
                Err(actual) => cur = actual,
            }
        }
    };
    let flat_gcra = |k: u64| cas_step(&flat[k as usize], clock.now());
    let flat_gcra_coarse = |k: u64| cas_step(&flat[k as usize], coarse.now());
    // The floors, all on the coarse clock: the payload alone (a key word and a state word per
    // key, no look-up), and the two look-up floors at the compact table's footprint.
    let flat16_coarse = |k: u64| cas_step(&flat16[2 * k as usize + 1], coarse.now());
    let floor8_coarse = |k: u64| cas_step(floor8.state(k), coarse.now());
    let floor16_coarse = |k: u64| floor16.step(k, coarse.now(), &algo);
    // The baseline: a GCRA-like CAS on the value, no clock.
    let flat_bare = |k: u64| {
        let cell = &flat[k as usize];
        let cur = cell.load(Ordering::Acquire);
        let _ = cell.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire);
    };
    let compact_check = |k: u64| {
        let _ = black_box(compact.check(&k));
    };
    let papaya_check = |k: u64| {
        let _ = black_box(papaya.check(&k));
    };
    let governor_check = |k: u64| {
        let _ = black_box(governor.check_key(&k));
    };
    let manual_check = |k: u64| {
        let _ = black_box(compact_manual.check(&k));
    };
    let coarse_check = |k: u64| {
        let _ = black_box(compact_coarse.check(&k));
    };
    let governor_upkeep_check = |k: u64| {
        let _ = black_box(governor_upkeep.check_key(&k));
    };
    const ROWS: usize = 12;
    let run = |row: usize, threads: usize, ops: usize| match row {
        0 => time(threads, ops, &seqs, &compact_check),
        1 => time(threads, ops, &seqs, &papaya_check),
        2 => time(threads, ops, &seqs, &governor_check),
        3 => time(threads, ops, &seqs, &flat_gcra),
        4 => time(threads, ops, &seqs, &flat_bare),
        5 => time(threads, ops, &seqs, &manual_check),
        6 => time(threads, ops, &seqs, &coarse_check),
        7 => time(threads, ops, &seqs, &flat_gcra_coarse),
        8 => time(threads, ops, &seqs, &governor_upkeep_check),
        9 => time(threads, ops, &seqs, &flat16_coarse),
        10 => time(threads, ops, &seqs, &floor8_coarse),
        _ => time(threads, ops, &seqs, &floor16_coarse),
    };
    let mut floors = Vec::new();

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
        floors.push((threads, m[7], m[9], m[10], m[11], m[6]));
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
    println!();
    println!("where the time goes (coarse clock, ns per request per thread, ratio to the 8 B/key flat array):");
    println!(
        "a key + state per key with no look-up; then tables of the compact store's shape and size"
    );
    println!(
        "with no inserts, reach or eviction: 8-byte words (state by an 8-byte CAS: not ABA-safe,"
    );
    println!("so no limiter can use it) and 16-byte words (the compact store's double-width CAS)");
    println!();
    println!("| threads | flat 8 B/key | flat 16 B/key | table, 8-byte CAS | table, 16-byte CAS | compact |");
    println!("|---|---|---|---|---|---|");
    for (threads, flat8, flat16, t8, t16, compact) in floors {
        let r = |x: f64| format!("{x:.1} ({:.1}×)", x / flat8);
        println!(
            "| {threads} | {flat8:.1} | {} | {} | {} | {} |",
            r(flat16),
            r(t8),
            r(t16),
            r(compact)
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
        flat16,
        floor8,
        floor16,
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
