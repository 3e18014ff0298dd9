//! What an in-flight permit costs (issue #62), against a plain `check` of a rate in the same
//! sitting: every row runs the same key sequence, rounds interleave the rows, and each row
//! reports the median of its rounds and the median of its ratios to the same round's `check`.
//!
//! `cargo bench --bench permits` (`-- --quick`: 9 rounds instead of 31). One thread, the exact
//! clock (`QuantaClock`); 1 key (its cell in L1) and 10k uniform keys (in L2). The limits admit
//! everything, so every request takes the write path.
//!
//! Rows: a GCRA `check` (one CAS); a `Permit` acquired and dropped (two CAS steps on the key:
//! take, then give back, with the permit's ticket between); the same as `take` and
//! `settle(0)` by hand.

mod common;

use common::gcra;
use hotlimit::algo::{Gcra, InFlight};
use hotlimit::{CasLimiter, Permit};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::hint::black_box;
use std::time::{Duration, Instant};

const ROWS: [&str; 3] = ["GCRA check", "Permit::acquire + drop", "take + settle(0)"];

/// ns per request of `op` over `seq`: one loop per row (monomorphized).
#[inline(never)]
fn time(seq: &[u64], op: impl Fn(&u64) -> bool) -> f64 {
    let start = Instant::now();
    let ok = seq.iter().filter(|k| op(k)).count();
    black_box(ok);
    start.elapsed().as_nanos() as f64 / seq.len() as f64
}

/// The limiters of one sitting: a rate, and permits (one per key, always given back).
struct Limiters {
    rate: CasLimiter<u64, Gcra>,
    permits: CasLimiter<u64, InFlight>,
}

fn run(l: &Limiters, row: usize, seq: &[u64]) -> f64 {
    match row {
        0 => time(seq, |k| black_box(l.rate.check(k)).is_allowed()),
        1 => time(seq, |k| {
            let permit = Permit::acquire(&l.permits, *k, 1).unwrap();
            permit.decision().is_allowed()
        }),
        _ => time(seq, |k| {
            let mut t = l.permits.request(k).take().unwrap();
            l.permits.request(k).settle(&mut t, 0).unwrap()
        }),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return; // `cargo bench -- --list`: nothing to list.
    }
    let rounds = if args.iter().any(|a| a == "--quick") {
        9
    } else {
        31
    };
    let ops = 250_000;
    let lease = Duration::from_secs(3_600);
    println!(
        "one thread, exact clock; {rounds} interleaved rounds of {ops} requests per row: \
         median ns per request (median of the rounds' ratios to the GCRA `check`)"
    );
    println!();
    println!("| keys | {} |", ROWS.join(" | "));
    println!("|---|{}", "---|".repeat(ROWS.len()));
    for keys in [1u64, 10_000] {
        let mut rng = SmallRng::seed_from_u64(7);
        let seq: Vec<u64> = (0..ops).map(|_| rng.random_range(0..keys)).collect();
        let l = Limiters {
            rate: CasLimiter::new(gcra()),
            permits: CasLimiter::new(InFlight::new(1, lease).unwrap()),
        };
        let mut samples = vec![Vec::new(); ROWS.len()];
        let mut ratios = vec![Vec::new(); ROWS.len()];
        for row in 0..ROWS.len() {
            run(&l, row, &seq); // warm-up, not recorded
        }
        for _ in 0..rounds {
            let round: Vec<f64> = (0..ROWS.len()).map(|row| run(&l, row, &seq)).collect();
            for (row, ns) in round.iter().enumerate() {
                samples[row].push(*ns);
                ratios[row].push(ns / round[0]);
            }
        }
        let cells: Vec<String> = samples
            .into_iter()
            .zip(ratios)
            .map(|(s, r)| format!("{:.1} ({:.2})", median(s), median(r)))
            .collect();
        println!("| {keys} | {} |", cells.join(" | "));
    }
}
