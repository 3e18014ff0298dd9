//! Helpers the benches share (`mod common;` in each; not a bench target itself). Each bench
//! uses a part, hence the `dead_code` allowance.
#![allow(dead_code)]

use hotlimit::algo::Gcra;
use std::hint::black_box;
use std::time::Instant;

/// A quota no benchmark exhausts: 1 event per ns with a burst of 2^40, so every request
/// takes the write path (a CAS or a locked store).
pub fn gcra() -> Gcra {
    "1000000000/s burst 1099511627776".parse().unwrap()
}

/// The key flood of `tests/flood.rs`, shared so the bench times what the test asserts.
#[path = "../../tests/common/flood.rs"]
pub mod flood;

/// The sharded `Mutex<HashMap>` baseline.
pub mod sharded;

#[allow(unused_imports)] // not every bench measures memory
pub use flood::rss_bytes;

/// ns per request of `op` over `seq`: one loop per row (monomorphized), so no row pays for
/// another's code.
#[inline(never)]
pub fn time(seq: &[u64], op: impl Fn(&u64) -> bool) -> f64 {
    let start = Instant::now();
    let ok = seq.iter().filter(|k| op(k)).count();
    black_box(ok);
    start.elapsed().as_nanos() as f64 / seq.len() as f64
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The rounds a paired bench runs: 31, 9 with `--quick`; `None` for `--list` (cargo bench's
/// listing: nothing to list).
pub fn rounds() -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return None;
    }
    Some(if args.iter().any(|a| a == "--quick") {
        9
    } else {
        31
    })
}

/// `rounds` interleaved rounds of rows `0..rows` (`run(row)`: its ns per request), after one
/// warm-up of each: per row, "median ns (median ratio to the same round's row 0)". Paired
/// with the same round's first row, a slow moment of the machine slows both, so the ratio
/// keeps what the row itself costs.
pub fn paired(rows: usize, rounds: usize, run: impl Fn(usize) -> f64) -> Vec<String> {
    for row in 0..rows {
        run(row); // warm-up, not recorded
    }
    let mut samples = vec![Vec::new(); rows];
    let mut ratios = vec![Vec::new(); rows];
    for _ in 0..rounds {
        let round: Vec<f64> = (0..rows).map(&run).collect();
        for (row, ns) in round.iter().enumerate() {
            samples[row].push(*ns);
            ratios[row].push(ns / round[0]);
        }
    }
    samples
        .into_iter()
        .zip(ratios)
        .map(|(s, r)| format!("{:.1} ({:.2})", median(s), median(r)))
        .collect()
}

/// The markdown table's head for `rows`, after a line saying how it was measured.
pub fn table_head(how: &str, rows: &[&str]) {
    println!("{how}");
    println!();
    println!("| keys | {} |", rows.join(" | "));
    println!("|---|{}", "---|".repeat(rows.len()));
}
