//! What a quota given with each request and a settled provisional cost cost, against a plain
//! `check` in the same sitting: every variant runs the same key sequence, rounds interleave
//! the variants, and each row reports the median of its rounds and the median of its ratios
//! to the same round's `check`.
//!
//! `cargo bench --bench settle` (`-- --quick`: 9 rounds instead of 31). One thread, the exact
//! clock (`QuantaClock`); 1 key (its cell in L1) and 10k uniform keys (in L2). The quotas admit
//! everything, so every request takes the write path (a CAS).
//!
//! Rows: `check`; `check_with` the limiter's own quota and another plan (a per-request
//! quota); `check_n(1)` and `check_n_with(1)` (a cost checked against the quota); `check_n(2)`;
//! `take(2)` (its ticket dropped: it stands); `take(2)` then `settle(1)` (a refund: a second
//! CAS step on the key).

mod common;

use common::{gcra, time};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{algo::Gcra, CasLimiter};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::hint::black_box;

const ROWS: [&str; 8] = [
    "check",
    "request.quota(own).check",
    "request.quota(other).check",
    "check_n(1)",
    "request.cost(2).quota(other).check",
    "check_n(2)",
    "request.cost(2).take, ticket dropped",
    "take(2) + settle(1)",
];

/// `answer`, after the optimizer has had to assume it was read whole where it lies, as a
/// caller rendering headers reads it: by reference, so no row copies its answer (a `Decision`,
/// or a `Result` around one) out to show it, and none can drop the work behind a field.
#[inline(always)]
fn seen<T>(answer: T) -> T {
    black_box(&answer);
    answer
}

/// ns per request of row `row` over `seq`.
fn run(l: &CasLimiter<u64, Gcra>, own: &Gcra, other: &Gcra, row: usize, seq: &[u64]) -> f64 {
    match row {
        0 => time(seq, |k| seen(l.check(k)).is_allowed()),
        1 => time(seq, |k| {
            seen(l.request(k).quota(black_box(own)).check()).is_ok_and(|d| d.is_allowed())
        }),
        2 => time(seq, |k| {
            seen(l.request(k).quota(black_box(other)).check()).is_ok_and(|d| d.is_allowed())
        }),
        3 => time(seq, |k| seen(l.check_n(k, 1)).is_ok_and(|d| d.is_allowed())),
        4 => time(seq, |k| {
            let r = l.request(k).cost(2).quota(black_box(other));
            seen(r.check()).is_ok_and(|d| d.is_allowed())
        }),
        5 => time(seq, |k| seen(l.check_n(k, 2)).is_ok_and(|d| d.is_allowed())),
        6 => time(seq, |k| {
            seen(l.request(k).cost(2).take()).is_ok_and(|t| t.decision().is_allowed())
        }),
        _ => time(seq, |k| {
            let mut t = l.request(k).cost(2).take().unwrap();
            l.request(k).settle(&mut t, 1).unwrap()
        }),
    }
}

fn main() {
    let Some(rounds) = common::rounds() else {
        return;
    };
    let (own, ops) = (gcra(), 250_000);
    let other = own
        .with_burst(hotlimit::algo::Algorithm::capacity(&own) / 2)
        .unwrap();
    common::table_head(
        &format!(
            "one thread, exact clock; {rounds} interleaved rounds of {ops} requests per row: \
             median ns per request (median of the rounds' ratios to `check`)"
        ),
        &ROWS,
    );
    for keys in [1u64, 10_000] {
        let mut rng = SmallRng::seed_from_u64(7);
        let seq: Vec<u64> = (0..ops).map(|_| rng.random_range(0..keys)).collect();
        let l = CasLimiter::<u64, Gcra>::new(own);
        let cells = common::paired(ROWS.len(), rounds, |row| run(&l, &own, &other, row, &seq));
        println!("| {keys} | {} |", cells.join(" | "));
    }
}
