//! Fast at every scale (issues #33, #61), all in one process: GCRA `check` at 1 key, 10k
//! uniform and zipf(1.0) keys, 1M and 10M uniform keys (all present), 1 and 2 threads, for
//! hotlimit's stores (one check at a time and batched) on the exact and on a 1 ms coarse
//! clock, governor on its default clock and on its quanta upkeep clock (1 ms: its coarse
//! one), rate-net and rateguard (single node), a bare papaya get + CAS and a flat array CAS;
//! then, at one key and one thread, the check taken apart step by step on the exact and the
//! coarse clock; then bytes per key at 1M keys, each store in a child process.
//!
//! Every variant runs the same key sequences; rounds interleave the variants (a round runs
//! each once), each cell is the median of the rounds. Every quota admits everything, so
//! every check writes. ns per check per thread; a coarse-clock row is compared with governor's
//! coarse clock, every other row with governor's default.
//!
//! `cargo bench --bench scale` (7 rounds); `-- --quick` (3 rounds, fewer requests);
//! `-- --steps` the step table only; `-- --strings` the `String`-keyed table only (10k and 1M
//! keys: `CasLimiter<String>`, `CompactLimiter<Hashed<str>>` and governor keyed by `String`)
//! and their bytes per key.
//! `HOTLIMIT_BENCH_THREADS=1,2,4,8,16` runs the many-key scenarios on those thread counts.

mod common;

use common::{gcra, rss_bytes};
use governor::clock::QuantaUpkeepClock;
use governor::{Quota, RateLimiter as Governor};
use hotlimit::algo::Algorithm;
use hotlimit::RateLimiter;
use hotlimit::{
    algo::Gcra, store::Hashed, CasLimiter, Clock, CoarseClock, CompactLimiter, QuantaClock,
};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use rand_distr::Zipf;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const MILLION: u64 = 1_000_000;

/// A variant's loop over one thread's key sequence (`keys` and the same keys as strings,
/// for rateguard, which takes `&str` only). One call per round per thread, so the loop inside
/// is compiled with its check inlined, as a caller's would be.
type Run<'a> = Box<dyn Fn(&[u64], &[&str]) + Sync + 'a>;

/// ns per check per thread: thread `i` runs `run(i)`, its whole sequence of `ops` checks,
/// the threads released together.
fn time(threads: usize, ops: usize, run: &(dyn Fn(usize) + Sync)) -> f64 {
    let barrier = Barrier::new(threads);
    let wall = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let t0 = Instant::now();
                    run(i);
                    t0.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    });
    wall.as_nanos() as f64 / ops as f64
}

/// One column of a table: after a warm-up round, `rounds` rounds interleaving the rows
/// (`time_row(r)` times row `r`), each row's median printed to stderr as it is measured (a
/// run cut short keeps what it measured) and appended to its row of `table`.
fn column(
    rounds: usize,
    label: &str,
    names: &[&str],
    table: &mut Vec<(String, Vec<f64>)>,
    time_row: impl Fn(usize) -> f64,
) {
    let mut samples = vec![Vec::new(); names.len()];
    for r in 0..names.len() {
        time_row(r); // warm-up, not recorded
    }
    for _ in 0..rounds {
        for (r, s) in samples.iter_mut().enumerate() {
            s.push(time_row(r));
        }
    }
    for (name, s) in names.iter().zip(samples) {
        let m = median(s);
        eprintln!("{label} | {name} | {m:.1}");
        match table.iter_mut().find(|(n, _)| n == name) {
            Some((_, cells)) => cells.push(m),
            None => table.push((name.to_string(), vec![m])),
        }
    }
}

/// Prints `table` under `header`, each cell with governor's time over its own: a coarse-clock
/// row against the row `coarse`, every other against `exact`.
fn print_table(header: &[String], table: &[(String, Vec<f64>)], exact: &str, coarse: &str) {
    println!("| variant | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(header.len()));
    let row = |want: &str| &table.iter().find(|(n, _)| n == want).unwrap().1;
    let (governor, governor_coarse) = (row(exact), row(coarse));
    for (name, cells) in table {
        let base = if name.contains("coarse") {
            governor_coarse
        } else {
            governor
        };
        let cells: Vec<String> = cells
            .iter()
            .zip(base)
            .map(|(c, g)| format!("{c:.1} ({:.2}×)", g / c))
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    println!("(in parentheses: governor's time ÷ the row's, > 1 is faster than governor; a coarse-clock row against governor's coarse clock)");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The peers, each admitting everything.
fn governor() -> governor::DefaultKeyedRateLimiter<u64> {
    let max = NonZeroU32::MAX;
    Governor::keyed(Quota::per_second(max).allow_burst(max))
}

fn rate_net(keys: u64) -> rate_net::RateLimiter {
    rate_net::RateLimiter::builder()
        .quota(u32::MAX, Duration::from_secs(1))
        .burst(u32::MAX)
        // Room for every key: its default cap would evict at 1M keys.
        .eviction(rate_net::Eviction::capacity(2 * keys as usize + 1024))
        .build()
}

fn rateguard(keys: u64, rt: &tokio::runtime::Runtime) -> rateguard::Guard {
    let _enter = rt.enter();
    rateguard::Guard::builder()
        .bind("127.0.0.1:0")
        .limit(u32::MAX)
        .burst(rateguard_core_max_burst())
        // Its ceiling is 2^20 keys: room for 1M.
        .tracked_keys((2 * keys as usize + 1024).min(1 << 20))
        .spawn()
        .expect("rateguard, single node on loopback")
}

/// rateguard's largest burst (`rateguard_core::gcra::MAX_BURST`, not re-exported): the
/// largest it accepts.
fn rateguard_core_max_burst() -> u32 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _enter = rt.enter();
    (0..32)
        .rev()
        .map(|bits| (1u32 << bits) - 1)
        .find(|&b| {
            rateguard::Guard::builder()
                .bind("127.0.0.1:0")
                .limit(1)
                .burst(b)
                .spawn()
                .is_ok()
        })
        .unwrap_or(1)
}

/// A one-word GCRA-like step on `cell` at `now`: what any store's CAS does, with no
/// look-up, no decision and no counting.
#[inline(always)]
fn bare_cas(cell: &AtomicU64, now: u64) {
    let cur = cell.load(Ordering::Acquire);
    let new = cur.max(now) + 1;
    let _ = cell.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire);
}

/// The string form of each key, for rateguard.
fn names(keys: u64) -> Vec<String> {
    (0..keys).map(|k| format!("k{k}")).collect()
}

/// The coarse clocks: hotlimit's and governor's (quanta's upkeep thread), 1 ms each.
struct Coarse {
    ours: CoarseClock,
    governor: QuantaUpkeepClock,
}

impl Coarse {
    fn new() -> Self {
        let ms = Duration::from_millis(1);
        Self {
            ours: CoarseClock::new(ms).unwrap(),
            governor: QuantaUpkeepClock::from_interval(ms).unwrap(),
        }
    }
}

type GovernorCoarse =
    Governor<u64, governor::state::keyed::DefaultKeyedStateStore<u64>, QuantaUpkeepClock>;

struct Stores {
    cas: CasLimiter<u64, Gcra>,
    /// Bounded: the compact table, behind `CasLimiter`'s own type.
    cas_bounded: CasLimiter<u64, Gcra>,
    cas_coarse: CasLimiter<u64, Gcra, CoarseClock>,
    compact: CompactLimiter<u64, Gcra>,
    compact_coarse: CompactLimiter<u64, Gcra, CoarseClock>,
    governor: governor::DefaultKeyedRateLimiter<u64>,
    governor_coarse: GovernorCoarse,
    rate_net: rate_net::RateLimiter,
    rateguard: rateguard::Guard,
    papaya: papaya::HashMap<u64, AtomicU64, ahash::RandomState>,
    flat: Vec<AtomicU64>,
}

impl Stores {
    fn new(keys: u64, names: &[String], rt: &tokio::runtime::Runtime, coarse: &Coarse) -> Self {
        let max = NonZeroU32::MAX;
        let quota = Quota::per_second(max).allow_burst(max);
        let s = Self {
            cas: CasLimiter::new(gcra()),
            cas_bounded: CasLimiter::builder(gcra())
                .max_keys(keys as usize)
                .build()
                .unwrap(),
            cas_coarse: CasLimiter::with_clock(gcra(), coarse.ours.clone()),
            compact: CompactLimiter::builder(gcra())
                .max_keys(keys as usize)
                .build()
                .unwrap(),
            compact_coarse: CompactLimiter::<u64, Gcra>::builder(gcra())
                .max_keys(keys as usize)
                .clock(coarse.ours.clone())
                .build()
                .unwrap(),
            governor: governor(),
            governor_coarse: Governor::dashmap_with_clock(quota, coarse.governor.clone()),
            rate_net: rate_net(keys),
            rateguard: rateguard(keys, rt),
            papaya: papaya::HashMap::builder()
                .hasher(ahash::RandomState::new())
                .build(),
            flat: (0..keys).map(|_| AtomicU64::new(0)).collect(),
        };
        let papaya = s.papaya.pin();
        for k in 0..keys {
            assert!(s.cas.check(&k).is_allowed());
            assert!(s.cas_bounded.check(&k).is_allowed());
            assert!(s.cas_coarse.check(&k).is_allowed());
            assert!(s.compact.check(&k).is_allowed());
            assert!(s.compact_coarse.check(&k).is_allowed());
            assert!(s.governor.check_key(&k).is_ok());
            assert!(s.governor_coarse.check_key(&k).is_ok());
            assert!(s.rate_net.check(k).is_allow());
            assert!(s.rateguard.check(&names[k as usize]).is_allowed());
            papaya.insert(k, AtomicU64::new(0));
        }
        drop(papaya);
        s
    }

    /// The rows of the scale table: name and loop.
    fn rows(&self) -> Vec<(String, Run<'_>)> {
        let mut rows: Vec<(String, Run<'_>)> = vec![
            (
                "CasLimiter".into(),
                Box::new(|keys, _| {
                    keys.iter().for_each(|k| {
                        let _ = black_box(self.cas.check(k));
                    })
                }),
            ),
            (
                "CasLimiter, max_keys".into(),
                Box::new(|keys, _| {
                    keys.iter().for_each(|k| {
                        let _ = black_box(self.cas_bounded.check(k));
                    })
                }),
            ),
            (
                "CompactLimiter".into(),
                Box::new(|keys, _| {
                    keys.iter().for_each(|k| {
                        let _ = black_box(self.compact.check(k));
                    })
                }),
            ),
            (
                "CasLimiter, coarse clock".into(),
                Box::new(|keys, _| {
                    keys.iter().for_each(|k| {
                        let _ = black_box(self.cas_coarse.check(k));
                    })
                }),
            ),
            (
                "CompactLimiter, coarse clock".into(),
                Box::new(|keys, _| {
                    keys.iter().for_each(|k| {
                        let _ = black_box(self.compact_coarse.check(k));
                    })
                }),
            ),
        ];
        for batch in [16, 64] {
            rows.push((
                format!("CasLimiter batch {batch}"),
                Box::new(move |keys, _| {
                    let mut out = Vec::with_capacity(batch);
                    for chunk in keys.chunks(batch) {
                        self.cas.check_batch(chunk, &mut out);
                        black_box(&out);
                    }
                }),
            ));
            rows.push((
                format!("CompactLimiter batch {batch}"),
                Box::new(move |keys, _| {
                    let mut out = Vec::with_capacity(batch);
                    for chunk in keys.chunks(batch) {
                        self.compact.check_batch(chunk, &mut out);
                        black_box(&out);
                    }
                }),
            ));
        }
        rows.push((
            "governor".into(),
            Box::new(|keys, _| {
                keys.iter().for_each(|k| {
                    let _ = black_box(self.governor.check_key(k));
                })
            }),
        ));
        rows.push((
            "governor, coarse clock".into(),
            Box::new(|keys, _| {
                keys.iter().for_each(|k| {
                    let _ = black_box(self.governor_coarse.check_key(k));
                })
            }),
        ));
        rows.push((
            "rate-net".into(),
            Box::new(|keys, _| {
                keys.iter().for_each(|&k| {
                    let _ = black_box(self.rate_net.check(k));
                })
            }),
        ));
        rows.push((
            "rateguard".into(),
            Box::new(|_, names| {
                names.iter().for_each(|k| {
                    let _ = black_box(self.rateguard.check(k));
                })
            }),
        ));
        rows.push((
            "bare papaya get+CAS, exact clock".into(),
            Box::new(move |keys, _| {
                let clock = QuantaClock::default();
                for k in keys {
                    let now = clock.now();
                    let guard = self.papaya.guard();
                    if let Some(cell) = self.papaya.get(k, &guard) {
                        bare_cas(cell, now);
                    }
                }
            }),
        ));
        rows.push((
            "flat array CAS, exact clock".into(),
            Box::new(move |keys, _| {
                let clock = QuantaClock::default();
                for &k in keys {
                    bare_cas(&self.flat[k as usize], clock.now());
                }
            }),
        ));
        rows
    }
}

/// One scale table's rows over `scenarios` ((keys, threads) each), interleaved by round.
fn scale(rounds: usize, ops: usize, rt: &tokio::runtime::Runtime) {
    // `HOTLIMIT_BENCH_THREADS=1,2,4,8,16` spreads the many-key scenarios over more threads on
    // a machine with the cores for it; one key stays at 1 and 2 (the contention bench's job).
    let many: Vec<usize> = match std::env::var("HOTLIMIT_BENCH_THREADS") {
        Ok(list) => list
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect(),
        Err(_) => vec![1, 2],
    };
    // (keys, zipf, thread counts): uniform keys unless zipf(1.0), as the table.
    let scenarios: [(u64, bool, &[usize]); 5] = [
        (1, false, &[1, 2]),
        (10_000, false, &many),
        (10_000, true, &many),
        (MILLION, false, &many),
        (10 * MILLION, false, &many),
    ];
    let max_threads = many.iter().copied().chain([2]).max().unwrap_or(2);
    let coarse = Coarse::new();
    let mut table: Vec<(String, Vec<f64>)> = Vec::new();
    let mut header = Vec::new();
    for (keys, zipf, threads) in scenarios {
        let names = names(keys);
        let stores = Stores::new(keys, &names, rt, &coarse);
        let rows = stores.rows();
        let seqs: Vec<(Vec<u64>, Vec<&str>)> = (0..max_threads as u64)
            .map(|t| {
                let mut rng = SmallRng::seed_from_u64(7 + t);
                let seq: Vec<u64> = if zipf {
                    let zipf = Zipf::new(keys as f64, 1.0).unwrap();
                    (0..ops).map(|_| rng.sample(zipf) as u64 - 1).collect()
                } else {
                    (0..ops).map(|_| rng.random_range(0..keys)).collect()
                };
                let strs = seq.iter().map(|&k| names[k as usize].as_str()).collect();
                (seq, strs)
            })
            .collect();
        for &threads in threads {
            header.push(format!(
                "{}{}, {threads} t",
                match keys {
                    1 => "1 key".to_string(),
                    k if k >= MILLION => format!("{}M", k / MILLION),
                    k => format!("{}k", k / 1000),
                },
                if zipf { " zipf" } else { "" }
            ));
            let names: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
            let label = header.last().unwrap();
            column(rounds, label, &names, &mut table, |r| {
                time(threads, ops, &|i| (rows[r].1)(&seqs[i].0, &seqs[i].1))
            });
        }
    }
    print_table(&header, &table, "governor", "governor, coarse clock");
}

/// A `String` key as a client's request brings it: 15 bytes (`user:0000012345`).
fn user(k: u64) -> String {
    let mut key = String::new();
    user_into(&mut key, k);
    key
}

/// [`user`] written into `buf`.
fn user_into(buf: &mut String, k: u64) -> &str {
    use std::fmt::Write;
    buf.clear();
    write!(buf, "user:{k:010}").unwrap();
    buf
}

/// Bytes per key at 1M keys of each variant in `variants`, each in a child process
/// (`--rss VARIANT`), as a table.
fn bytes_table(variants: &[&str]) {
    println!("| store | bytes per key at {MILLION} keys (RSS growth, child process) |");
    println!("|---|---|");
    let me = std::env::current_exe().unwrap();
    for variant in variants {
        let out = std::process::Command::new(&me)
            .args(["--rss", variant])
            .output()
            .unwrap();
        println!(
            "| {variant} | {} |",
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
}

/// The `String`-keyed table (issue #61's "a user keyed by `String`"): each thread's
/// sequence is its own `String`s, allocated in sequence order, so a check reads its key from
/// memory the way a server reads it from the request it just parsed (in cache), and the
/// stores' own misses are what differs. governor's keyed limiter takes `&String` (no borrowed
/// look-up); ours take `&str`.
fn strings(rounds: usize, ops: usize) {
    let coarse = Coarse::new();
    let max = NonZeroU32::MAX;
    let quota = Quota::per_second(max).allow_burst(max);
    let mut table: Vec<(String, Vec<f64>)> = Vec::new();
    let mut header = Vec::new();
    for keys in [10_000, MILLION] {
        let cas = CasLimiter::<String, Gcra>::new(gcra());
        let cas_coarse = CasLimiter::<String, Gcra, _>::with_clock(gcra(), coarse.ours.clone());
        let compact = CompactLimiter::<Hashed<str>, Gcra>::builder(gcra())
            .max_keys(keys as usize)
            .build()
            .unwrap();
        let gov: Governor<String, _, _> = Governor::keyed(quota);
        let gov_coarse: Governor<String, _, _> =
            Governor::dashmap_with_clock(quota, coarse.governor.clone());
        for k in 0..keys {
            let name = user(k);
            assert!(cas.check(name.as_str()).is_allowed());
            assert!(cas_coarse.check(name.as_str()).is_allowed());
            assert!(compact.check(name.as_str()).is_allowed());
            assert!(gov.check_key(&name).is_ok());
            assert!(gov_coarse.check_key(&name).is_ok());
        }
        type StrRun<'a> = (&'static str, Box<dyn Fn(&[String]) + Sync + 'a>);
        let rows: Vec<StrRun<'_>> = vec![
            (
                "CasLimiter<String>",
                Box::new(|seq| {
                    for k in seq {
                        let _ = black_box(cas.check(k.as_str()));
                    }
                }),
            ),
            (
                "CompactLimiter<Hashed<str>>",
                Box::new(|seq| {
                    for k in seq {
                        let _ = black_box(compact.check(k.as_str()));
                    }
                }),
            ),
            (
                "CasLimiter<String>, coarse clock",
                Box::new(|seq| {
                    for k in seq {
                        let _ = black_box(cas_coarse.check(k.as_str()));
                    }
                }),
            ),
            (
                "governor<String>",
                Box::new(|seq| {
                    for k in seq {
                        let _ = black_box(gov.check_key(k));
                    }
                }),
            ),
            (
                "governor<String>, coarse clock",
                Box::new(|seq| {
                    for k in seq {
                        let _ = black_box(gov_coarse.check_key(k));
                    }
                }),
            ),
        ];
        let seqs: Vec<Vec<String>> = (0..2u64)
            .map(|t| {
                let mut rng = SmallRng::seed_from_u64(7 + t);
                (0..ops).map(|_| user(rng.random_range(0..keys))).collect()
            })
            .collect();
        for threads in [1, 2] {
            header.push(format!(
                "{}, {threads} t",
                if keys >= MILLION {
                    format!("{}M", keys / MILLION)
                } else {
                    format!("{}k", keys / 1000)
                }
            ));
            let names: Vec<&str> = rows.iter().map(|(n, _)| *n).collect();
            let label = header.last().unwrap();
            column(rounds, label, &names, &mut table, |r| {
                time(threads, ops, &|i| (rows[r].1)(&seqs[i]))
            });
        }
    }
    print_table(
        &header,
        &table,
        "governor<String>",
        "governor<String>, coarse clock",
    );
}

/// The check at one key and one thread taken apart: each row adds one step, on the exact
/// (TSC) clock and on a 1 ms coarse clock.
fn steps(rounds: usize, ops: usize) {
    let coarse = CoarseClock::new(Duration::from_millis(1)).unwrap();
    let exact = QuantaClock::default();
    let papaya = papaya::HashMap::<u64, AtomicU64, _>::with_hasher(ahash::RandomState::new());
    papaya.pin().insert(0, AtomicU64::new(0));
    // A key type of its own keeps the limiter on the papaya map (a `u64` key is the compact
    // table): the bound is the map's overhead over the bare map.
    #[derive(Clone, Copy, Hash, PartialEq, Eq)]
    struct OnMap(u64);
    let cas = CasLimiter::<OnMap, Gcra>::new(gcra());
    let cas_coarse = CasLimiter::<OnMap, Gcra, _>::with_clock(gcra(), coarse.clone());
    let algo = gcra();
    let seq = vec![0u64; ops];
    type Step<'a> = (&'static str, Box<dyn Fn(&[u64]) + 'a>);
    // The bare get+CAS with GCRA's step in place of the bare one, its decision kept.
    let get_step = |k: &u64, now: u64| {
        let guard = papaya.guard();
        if let Some(cell) = papaya.get(k, &guard) {
            let cur = cell.load(Ordering::Acquire);
            let mut new = cur;
            let d = algo.update(&mut new, now, 1);
            let _ = cell.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire);
            let _ = black_box(d);
        }
    };
    let get_cas = |k: &u64, now: u64| {
        let guard = papaya.guard();
        if let Some(cell) = papaya.get(k, &guard) {
            bare_cas(cell, now);
        }
    };
    let rows: Vec<Step> = vec![
        (
            "exact clock read",
            Box::new(|s| {
                s.iter().for_each(|_| {
                    black_box(exact.now());
                })
            }),
        ),
        (
            "coarse clock read",
            Box::new(|s| {
                s.iter().for_each(|_| {
                    black_box(coarse.now());
                })
            }),
        ),
        (
            "papaya guard + get + CAS (no clock)",
            Box::new(|s| s.iter().for_each(|k| get_cas(k, 0))),
        ),
        (
            "… + exact clock",
            Box::new(|s| s.iter().for_each(|k| get_cas(k, exact.now()))),
        ),
        (
            "… + coarse clock",
            Box::new(|s| s.iter().for_each(|k| get_cas(k, coarse.now()))),
        ),
        (
            "… + GCRA step and decision, exact clock",
            Box::new(|s| s.iter().for_each(|k| get_step(k, exact.now()))),
        ),
        (
            "… + GCRA step and decision, coarse clock",
            Box::new(|s| s.iter().for_each(|k| get_step(k, coarse.now()))),
        ),
        (
            "CasLimiter::check, exact clock",
            Box::new(|s| {
                s.iter().for_each(|k| {
                    let _ = black_box(cas.check(&OnMap(*k)));
                })
            }),
        ),
        (
            "CasLimiter::check, coarse clock",
            Box::new(|s| {
                s.iter().for_each(|k| {
                    let _ = black_box(cas_coarse.check(&OnMap(*k)));
                })
            }),
        ),
    ];
    let mut samples = vec![Vec::new(); rows.len()];
    for (_, run) in &rows {
        run(&seq[..ops / 4]);
    }
    for _ in 0..rounds {
        for (s, (_, run)) in samples.iter_mut().zip(&rows) {
            let t0 = Instant::now();
            run(&seq);
            s.push(t0.elapsed().as_nanos() as f64 / ops as f64);
        }
    }
    println!("| step (1 key, 1 thread) | ns per check |");
    println!("|---|---|");
    for ((name, _), s) in rows.iter().zip(samples) {
        println!("| {name} | {:.1} |", median(s));
    }
    // The bound, `check` ≤ bare get+CAS + one clock read + 3 ns, paired: many short
    // rounds, each timing the three rows back to back (in a rotating order), so a slow moment
    // of the VM slows all three and the difference keeps what the check itself adds.
    let row = |name: &str| rows.iter().position(|(n, _)| *n == name).unwrap();
    let bare = row("papaya guard + get + CAS (no clock)");
    let short = &seq[..ops / 50];
    println!();
    println!("| bound, paired ({PAIRED} rounds of {} checks) | check − bare − clock, ns: median (quartiles) | rounds within 3 ns |", short.len());
    println!("|---|---|---|");
    for (clock, check) in [
        ("exact clock read", "CasLimiter::check, exact clock"),
        ("coarse clock read", "CasLimiter::check, coarse clock"),
    ] {
        let three = [bare, row(clock), row(check)];
        let mut over: Vec<f64> = (0..PAIRED)
            .map(|r| {
                let mut ns = [0.0; 3];
                for i in (0..3).map(|i| (i + r) % 3) {
                    let t0 = Instant::now();
                    (rows[three[i]].1)(short);
                    ns[i] = t0.elapsed().as_nanos() as f64 / short.len() as f64;
                }
                ns[2] - ns[0] - ns[1]
            })
            .collect();
        over.sort_by(f64::total_cmp);
        let within = over.iter().filter(|&&d| d <= 3.0).count();
        println!(
            "| {check} | {:.1} ({:.1} to {:.1}) | {within} of {PAIRED} |",
            over[PAIRED / 2],
            over[PAIRED / 4],
            over[3 * PAIRED / 4]
        );
    }
}

/// Rounds of the paired bound measurement (odd: a median).
const PAIRED: usize = 101;

/// The RSS once `limiter` holds keys `0..keys` (one check each), the limiter still alive.
fn filled<S: hotlimit::store::Keys<u64>>(limiter: hotlimit::Limiter<S>, keys: u64) -> u64 {
    (0..keys).for_each(|k| {
        let _ = limiter.check(&k);
    });
    black_box(&limiter);
    rss_bytes()
}

/// Child process: RSS growth per key after inserting `keys` keys into one store.
fn bytes_per_key(variant: &str, keys: u64) -> f64 {
    let names = if variant == "rateguard" {
        names(keys)
    } else {
        Vec::new()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let before = rss_bytes();
    let after = match variant {
        "CasLimiter" => filled(CasLimiter::<u64, Gcra>::new(gcra()), keys),
        "CompactLimiter" => filled(
            CompactLimiter::<u64, Gcra>::builder(gcra())
                .max_keys(keys as usize)
                .build()
                .unwrap(),
            keys,
        ),
        "CasLimiter, max_keys" => filled(
            CasLimiter::<u64, Gcra>::builder(gcra())
                .max_keys(keys as usize)
                .build()
                .unwrap(),
            keys,
        ),
        "governor" => {
            let l = governor();
            (0..keys).for_each(|k| {
                let _ = l.check_key(&k);
            });
            black_box(&l);
            rss_bytes()
        }
        // The `String` keys: each written into one reused buffer, so what grows is the
        // limiter's own copy of every key, not the caller's.
        "CasLimiter<String>" => {
            let l = CasLimiter::<String, Gcra>::new(gcra());
            let mut buf = String::new();
            (0..keys).for_each(|k| {
                let _ = l.check(user_into(&mut buf, k));
            });
            black_box(&l);
            rss_bytes()
        }
        "CompactLimiter<Hashed<str>>" => {
            let l = CompactLimiter::<Hashed<str>, Gcra>::builder(gcra())
                .max_keys(keys as usize)
                .build()
                .unwrap();
            let mut buf = String::new();
            (0..keys).for_each(|k| {
                let _ = l.check(user_into(&mut buf, k));
            });
            black_box(&l);
            rss_bytes()
        }
        "governor<String>" => {
            let max = NonZeroU32::MAX;
            let l: Governor<String, _, _> =
                Governor::keyed(Quota::per_second(max).allow_burst(max));
            let mut buf = String::new();
            (0..keys).for_each(|k| {
                user_into(&mut buf, k);
                let _ = l.check_key(&buf);
            });
            black_box(&l);
            rss_bytes()
        }
        "rate-net" => {
            let l = rate_net(keys);
            (0..keys).for_each(|k| {
                let _ = l.check(k);
            });
            black_box(&l);
            rss_bytes()
        }
        _ => {
            // The key strings were made before `before`: they are the bench's, not counted.
            let l = rateguard(keys, &rt);
            names.iter().for_each(|k| {
                let _ = l.check(k);
            });
            black_box(&l);
            rss_bytes()
        }
    };
    (after - before) as f64 / keys as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--rss") {
        println!("{:.1}", bytes_per_key(&args[i + 1], MILLION));
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return; // `cargo bench -- --list`: nothing to list.
    }
    let quick = args.iter().any(|a| a == "--quick");
    let (rounds, ops) = if quick {
        (3, 1_000_000)
    } else {
        (7, 2_000_000)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    if args.iter().any(|a| a == "--steps") {
        steps(rounds, ops * 5); // the step table only
        return;
    }
    if args.iter().any(|a| a == "--strings") {
        strings(rounds, ops); // the String-keyed table only
        println!();
        bytes_table(&[
            "CasLimiter<String>",
            "CompactLimiter<Hashed<str>>",
            "governor<String>",
        ]);
        return;
    }
    println!("GCRA check, uniform keys (all present); median ns per check per thread of {rounds} interleaved rounds of {ops} checks per thread");
    println!();
    scale(rounds, ops, &rt);
    println!();
    steps(rounds, ops * 5);
    println!();
    bytes_table(&[
        "CasLimiter",
        "CasLimiter, max_keys",
        "CompactLimiter",
        "governor",
        "rate-net",
        "rateguard",
    ]);
}
