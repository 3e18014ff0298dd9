//! What an in-flight permit and a three-level hierarchy cost (issue #62), against a plain
//! `check` of a rate in the same sitting: every row runs the same key sequence, rounds interleave the rows, and each row
//! reports the median of its rounds and the median of its ratios to the same round's `check`.
//!
//! `cargo bench --bench permits` (`-- --quick`: 9 rounds instead of 31). One thread, the exact
//! clock (`QuantaClock`); 1 key (its cell in L1) and 10k uniform keys (in L2). The limits admit
//! everything, so every request takes the write path.
//!
//! Rows: a GCRA `check` (one CAS); a `Permit` acquired and dropped (two CAS steps on the key:
//! take, then give back, with the permit's ticket between); the same as `take` and
//! `settle(0)` by hand; `check_all` over three levels (the key, one of 100 organisations, a
//! global key; a GCRA quota each: three takes, each a look-up and a CAS).

mod common;

use common::{gcra, time};
use hotlimit::algo::{Gcra, InFlight};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{check_all, CasLimiter, Permit};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

const ROWS: [&str; 4] = [
    "GCRA check",
    "Permit::acquire + drop",
    "take + settle(0)",
    "check_all, 3 levels",
];

/// The limiters of one sitting: a rate, and permits (one per key, always given back).
struct Limiters {
    rate: CasLimiter<u64, Gcra>,
    permits: CasLimiter<u64, InFlight>,
}

fn run(l: &Limiters, row: usize, seq: &[u64]) -> f64 {
    match row {
        0 => time(seq, |k| black_box(l.rate.check(k)).is_allowed()),
        1 => time(seq, |k| {
            let permit = Permit::acquire(&l.permits, k, 1).unwrap();
            permit.decision().is_allowed()
        }),
        2 => time(seq, |k| {
            let mut t = l.permits.request(k).take().unwrap();
            l.permits.request(k).settle(&mut t, 0).unwrap()
        }),
        _ => time(seq, |k| {
            // Users, organisations and the global key apart: 1_000_000 + k / 100, and 2_000_000.
            let org = 1_000_000 + k / 100;
            let levels = [
                (&l.rate, k, None),
                (&l.rate, &org, None),
                (&l.rate, &2_000_000, None),
            ];
            check_all(&levels, 1).unwrap().1.is_allowed()
        }),
    }
}

fn main() {
    let Some(rounds) = common::rounds() else {
        return;
    };
    let ops = 250_000;
    let lease = Duration::from_secs(3_600);
    common::table_head(
        &format!(
            "one thread, exact clock; {rounds} interleaved rounds of {ops} requests per row: \
             median ns per request (median of the rounds' ratios to the GCRA `check`)"
        ),
        &ROWS,
    );
    for keys in [1u64, 10_000] {
        let mut rng = SmallRng::seed_from_u64(7);
        let seq: Vec<u64> = (0..ops).map(|_| rng.random_range(0..keys)).collect();
        let l = Limiters {
            rate: CasLimiter::new(gcra()),
            permits: CasLimiter::new(InFlight::new(1, lease).unwrap()),
        };
        let cells = common::paired(ROWS.len(), rounds, |row| run(&l, row, &seq));
        println!("| {keys} | {} |", cells.join(" | "));
    }
}
