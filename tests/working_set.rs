//! A working set larger than the store (issue #59): 4× `max_keys` legitimate keys, each asking
//! at a steady rate of its own (a quarter of its limit to twice it), on a bounded store and on
//! a twin that never evicts, fed the same requests at the same instants. The bounded store
//! evicts the keys again and again and the debt table brings each back at least as limited as
//! it left: never, key by key, admitted more than on the twin (asserted). Each key's entry in
//! the table carries a code of its own debt's rank (`Debt::debt_rank`), and the key comes
//! back owing that, not its slot-mates' debts: what the bounded store denies beyond the twin
//! stays within issue #59's 5% (asserted; the windows over three windows of 20 s), where
//! sharing its slot's debt cost 27–96%; from one thread and from eight. The sliding log and
//! the sub-window too, since they keep their debt by cell of time (one time and one total for
//! the whole log lost 31–34%). Printed and kept in BENCHMARKS.md.

mod common;

use common::{id::Id, ById};
use hotlimit::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::store::Cas;
use hotlimit::{CasLimiter, CompactLimiter, ManualClock, QuantaClock, Rate, RateLimiter};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Duration;

/// The merged requests of `keys` keys over `secs` seconds: `(instant ns, key)` in time order.
/// Key `k` asks at `limit_per_s × f` with `f` spread from 0.25 to 2 over the keys, each gap
/// exponential (a Poisson process per key).
fn trace(keys: u64, limit_per_s: f64, secs: u64, seed: u64) -> Vec<(u64, u64)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let end = secs * 1_000_000_000;
    let mut out = Vec::new();
    for k in 0..keys {
        let f = 0.25 + 1.75 * k as f64 / (keys - 1).max(1) as f64;
        let mean_gap = 1e9 / (limit_per_s * f);
        let mut t = 0.0f64;
        loop {
            let u: f64 = rng.random::<f64>().max(1e-12);
            t += -u.ln() * mean_gap;
            if t as u64 >= end {
                break;
            }
            out.push((t as u64, k));
        }
    }
    out.sort_unstable();
    out
}

/// Admissions per key of `limiter` (on `clock`) over `trace`, from `threads` threads: with
/// more than one, the requests of each instant are shared out by key (a key's in its order),
/// and all of an instant's are done before the clock moves on.
fn admitted(
    limiter: &(dyn RateLimiter<u64> + Sync),
    clock: &ManualClock,
    trace: &[(u64, u64)],
    threads: usize,
) -> Vec<u64> {
    let keys = trace.iter().map(|&(_, k)| k + 1).max().unwrap_or(0);
    let n: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
    let check = |k: u64| {
        n[k as usize].fetch_add(u64::from(limiter.check(&k).is_allowed()), Ordering::Relaxed);
    };
    if threads == 1 {
        for &(t, k) in trace {
            clock.set(Duration::from_nanos(t));
            check(k);
        }
    } else {
        // The instants' bounds in the trace, handed out between two barriers.
        let (from, to) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let barrier = Barrier::new(threads + 1);
        std::thread::scope(|s| {
            for me in 0..threads as u64 {
                let (from, to, barrier, check) = (&from, &to, &barrier, &check);
                s.spawn(move || loop {
                    barrier.wait();
                    let (a, b) = (from.load(Ordering::Relaxed), to.load(Ordering::Relaxed));
                    if a == usize::MAX {
                        return;
                    }
                    for &(_, k) in &trace[a..b] {
                        if k % threads as u64 == me {
                            check(k);
                        }
                    }
                    barrier.wait();
                });
            }
            let mut a = 0;
            while a < trace.len() {
                let t = trace[a].0;
                let b = a + trace[a..].iter().take_while(|&&(u, _)| u == t).count();
                clock.set(Duration::from_nanos(t));
                from.store(a, Ordering::Relaxed);
                to.store(b, Ordering::Relaxed);
                barrier.wait();
                barrier.wait();
                a = b;
            }
            from.store(usize::MAX, Ordering::Relaxed);
            barrier.wait();
        });
    }
    n.into_iter().map(AtomicU64::into_inner).collect()
}

/// The share of the twin's admissions the bounded stores lose, per store, checked from
/// `threads` threads (the twin from one: the same decisions, the same instants).
fn loss<A: Algorithm + Clone>(
    algo: &A,
    max_keys: usize,
    trace: &[(u64, u64)],
    threads: usize,
) -> Vec<(&'static str, f64)> {
    let clock = ManualClock::default();
    let twin = CasLimiter::<u64, A, _>::with_clock(algo.clone(), clock.clone());
    let exact = admitted(&twin, &clock, trace, 1);
    let mut out = Vec::new();
    macro_rules! run {
        ($name:expr, $builder:expr, $wrap:expr) => {{
            let clock = ManualClock::default();
            let l = $builder
                .max_keys(max_keys)
                .clock(clock.clone())
                .sweep_grace(Duration::ZERO)
                .build()
                .unwrap();
            let l = $wrap(l);
            let got = admitted(&l, &clock, trace, threads);
            // Never more than the twin, key by key: no eviction hands anyone budget.
            for (k, (g, e)) in got.iter().zip(&exact).enumerate() {
                assert!(g <= e, "{}: key {k} got {g}, {e} on the twin", $name);
            }
            let (g, e): (u64, u64) = (got.iter().sum(), exact.iter().sum());
            out.push(($name, 1.0 - g as f64 / e as f64));
        }};
    }
    // The papaya map (keyed by `Id`: bounded, a map of `u64` keys is the compact table).
    run!("cas", CasLimiter::<Id, A>::builder(algo.clone()), ById);
    run!(
        "compact",
        CompactLimiter::<u64, A, QuantaClock, Cas>::builder(algo.clone()),
        std::convert::identity
    );
    out
}

// Pins G24.
#[test]
#[ignore = "1,000 keys for a minute on 3 limiters x 7 algorithms, from 1 thread and from 8: run in release (.ci/run does)"]
fn a_working_set_of_4x_max_keys_is_never_admitted_more() {
    let minute = Duration::from_secs(60);
    let gcra: Gcra = "10/s burst 20".parse().unwrap();
    let earrrl = Earrrl::new(
        Duration::from_secs(1),
        Rate::new(10.0, Duration::from_secs(1)).unwrap(),
    )
    .unwrap();
    let exp = Exponential::new(600.0, minute).unwrap();
    // Three windows in the minute: keys evicted in one window come back in the next.
    let fixed = FixedWindow::new(200, Duration::from_secs(20)).unwrap();
    let sliding = SlidingWindow::new(200, Duration::from_secs(20)).unwrap();
    let log = SlidingLog::new(200, Duration::from_secs(20)).unwrap();
    let sub = SubWindow::new(200, Duration::from_secs(20), 10).unwrap();
    // From 1 and 8 threads at 16 and 250 keys (1,000 keys, then 500 from 1 thread, were most
    // of CI's time for this test: past `max_keys` nearly every request inserts and evicts).
    for (max_keys, threads) in [(16usize, 1), (16, 8), (250, 1), (250, 8)] {
        let mut trace = trace(4 * max_keys as u64, 10.0, 60, 7);
        if threads > 1 {
            // The instants rounded down to 100 ms: each is shared out among the threads, two
            // barriers apiece (at 10 ms, 6,000 instants' barriers of 9 threads on 2 cores
            // were most of CI's time for this test).
            for (t, _) in &mut trace {
                *t = *t / 100_000_000 * 100_000_000;
            }
        }
        let trace = &trace;
        let mut runs = vec![
            ("gcra", loss(&gcra, max_keys, trace, threads)),
            ("earrrl", loss(&earrrl, max_keys, trace, threads)),
            ("exponential", loss(&exp, max_keys, trace, threads)),
            ("fixed", loss(&fixed, max_keys, trace, threads)),
            ("sliding", loss(&sliding, max_keys, trace, threads)),
        ];
        runs.push(("sliding log", loss(&log, max_keys, trace, threads)));
        runs.push(("sub-window", loss(&sub, max_keys, trace, threads)));
        for (name, l) in runs {
            let pct: Vec<String> = l
                .iter()
                .map(|(store, loss)| format!("{store} {:.1}%", 100.0 * loss))
                .collect();
            println!(
                "max_keys {max_keys}, {threads} thread(s), {name}: admissions lost against \
                 the twin: {pct:?}"
            );
            for (store, loss) in &l {
                assert!(
                    *loss <= 0.05,
                    "{name} on {store}, {threads} threads: {pct:?}"
                );
            }
        }
    }
}
