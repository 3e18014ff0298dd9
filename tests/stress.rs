//! Linearizability under real threads (DESIGN §4): N threads firing at one key get exactly the
//! totals of one thread sending the same requests, for every algorithm and store variant.
//!
//! All requests cost 1 and share `now` within a phase, so any sequential order of a phase's
//! requests gives the same total; a lost update or a double admission changes it.

mod common;

use hotlimit::ManualClock;
use hotlimit::RateLimiter;
use hotlimit::Requests;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

const THREADS: usize = 4;
const PER_THREAD: usize = 10_000;

/// Single-threaded reference: `phases` of `n` requests each, at the given times.
fn sequential(make: &common::Make, phases: &[(u64, usize)]) -> u64 {
    let clock = ManualClock::default();
    let limiter = make(clock.clone());
    let mut allowed = 0;
    for &(at, n) in phases {
        clock.set(Duration::from_nanos(at));
        allowed += (0..n).filter(|_| limiter.check(&7).is_allowed()).count() as u64;
    }
    allowed
}

/// `THREADS` threads; in each phase the main thread sets the clock, then every thread sends
/// `per_thread` requests to key 7.
fn concurrent(make: &common::Make, times: &[u64], per_thread: usize) -> u64 {
    let clock = ManualClock::default();
    let limiter = make(clock.clone());
    let allowed = AtomicU64::new(0);
    let start = Barrier::new(THREADS + 1);
    let done = Barrier::new(THREADS + 1);
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in times {
                    start.wait();
                    // Peeks interleaved with the checks (of the hammered key and of one never
                    // checked) change no total and insert no key.
                    let n = (0..per_thread)
                        .filter(|i| {
                            if i % 4 == 0 {
                                let _ = limiter.peek(&7);
                                let _ = limiter.peek(&8);
                            }
                            limiter.check(&7).is_allowed()
                        })
                        .count();
                    allowed.fetch_add(n as u64, Ordering::Relaxed);
                    done.wait();
                }
            });
        }
        for &t in times {
            clock.set(Duration::from_nanos(t));
            start.wait();
            done.wait();
        }
    });
    assert_eq!(limiter.len(), 1);
    allowed.into_inner()
}

// Pins G1, G28.
#[test]
fn frozen_clock_totals_equal_one_thread() {
    for case in common::cases() {
        let mut totals = Vec::new();
        for (variant, make) in &case.variants {
            let want = sequential(make, &[(1_000, THREADS * PER_THREAD)]);
            let got = concurrent(make, &[1_000], PER_THREAD);
            assert_eq!(got, want, "{} {variant}", case.name);
            totals.push(got);
        }
        // CAS, mutex and sharded agree with each other too.
        assert!(totals.windows(2).all(|w| w[0] == w[1]), "{}", case.name);
        // GCRA admits exactly its burst at a frozen clock, every window exactly its limit.
        let exactly_20 = [
            "gcra",
            "fixed-window",
            "sliding-window",
            "sliding-log",
            "sub-window",
        ];
        if exactly_20.iter().any(|p| case.name.starts_with(p)) {
            assert_eq!(totals[0], 20, "{}", case.name);
        }
    }
}

// Pins G1.
#[test]
fn moving_clock_totals_equal_sequential_replay() {
    // 40 phases, 37 ms apart, 250 requests per thread per phase.
    let times: Vec<u64> = (0..40).map(|p| 5_000 + p * 37_000_000).collect();
    let per_thread = 250;
    for case in common::cases() {
        for (variant, make) in &case.variants {
            let phases: Vec<(u64, usize)> =
                times.iter().map(|&t| (t, THREADS * per_thread)).collect();
            let want = sequential(make, &phases);
            let got = concurrent(make, &times, per_thread);
            assert_eq!(got, want, "{} {variant}", case.name);
        }
    }
}

// Pins G1.
#[test]
fn direct_limiter_totals_under_threads() {
    use hotlimit::{algo::Gcra, store::Locked, DirectLimiter};
    let gcra: Gcra = "100/s burst 20".parse().unwrap();
    let cas = DirectLimiter::<_, _>::with_clock(gcra, ManualClock::default());
    let mutex = DirectLimiter::<_, _, Locked>::with_clock(gcra, ManualClock::default());
    let (a, b) = thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    let a = (0..PER_THREAD)
                        .filter(|_| {
                            let _ = cas.request(&()).peek().unwrap();
                            cas.check(&()).is_allowed()
                        })
                        .count();
                    let b = (0..PER_THREAD)
                        .filter(|_| {
                            let _ = mutex.request(&()).peek().unwrap();
                            mutex.check(&()).is_allowed()
                        })
                        .count();
                    (a, b)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, 0), |acc, x| (acc.0 + x.0, acc.1 + x.1))
    });
    assert_eq!((a, b), (20, 20));
}
