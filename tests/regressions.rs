//! Regressions found by the fuzzers (`fuzz/`): each is one finding, fixed, kept here so it
//! stays fixed without running the fuzzers. Debug builds (as `cargo test` runs them) check
//! overflow, so "no panic" is part of each test.

use hotlimit::algo::{Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow};
use hotlimit::{Algorithm, CasLimiter, ConfigError, Field, ManualClock, Policy, WordStep};
use std::time::Duration;

/// 1. GCRA at a clock of u64::MAX: the clamp of `tat` below the tombstone made `tat' − now`
///    underflow. The clock now saturates at `CLOCK_MAX` for every algorithm.
#[test]
fn gcra_at_the_end_of_time() {
    let g: Gcra = "10/s".parse().unwrap();
    let step = g.step(g.fresh(), u64::MAX, 1);
    assert!(step.decision.is_allowed());
    let (reservation, _) = g.reserve(0, u64::MAX, 1, 0);
    assert!(matches!(
        reservation,
        hotlimit::algo::Reservation::Admitted { .. }
    ));
}

/// 2. A fixed-window limit of u64::MAX overflowed `limit + 1` while sizing the count field.
#[test]
fn fixed_window_limit_u64_max_is_a_typed_error() {
    assert!(matches!(
        FixedWindow::new(u64::MAX, Duration::from_secs(1)),
        Err(ConfigError::TooLarge {
            field: Field::Limit,
            ..
        })
    ));
}

/// 3. A sliding log with a huge limit overflowed its total, and strict denials grew it
///    without bound. The total is now u128 and tracks the entries exactly.
#[test]
fn sliding_log_huge_costs() {
    let l = SlidingLog::new(u64::MAX, Duration::from_secs(1)).unwrap();
    let mut s = l.fresh();
    assert!(l.update(&mut s, 0, u64::MAX).is_allowed());
    assert!(l.update(&mut s, 0, 1).is_denied());
    let strict = l.with_policy(Policy::Strict);
    for _ in 0..3 {
        assert!(strict.update(&mut s, 0, u64::MAX).is_denied());
    }
    // Everything expires together a window later: nothing was lost or wrapped.
    assert!(strict.update(&mut s, 1_000_000_000, u64::MAX).is_allowed());
}

/// 4. At now = u64::MAX the log forgot everything (`t + window` saturated to `now`).
#[test]
fn sliding_log_at_the_end_of_time() {
    let l = SlidingLog::new(1, Duration::from_secs(1)).unwrap();
    let mut s = l.fresh();
    let allowed = (0..3)
        .filter(|_| l.update(&mut s, u64::MAX, 1).is_allowed())
        .count();
    assert_eq!(allowed, 1);
}

/// 5. Sub-windows of 1 ns near the end of the clock overflowed `bucket + n`.
#[test]
fn sub_window_at_the_end_of_time() {
    let w = SubWindow::new(1, Duration::from_nanos(60), 60).unwrap();
    let mut s = w.fresh();
    assert!(w.update(&mut s, u64::MAX - 1, 1).is_allowed());
    let denied = w.update(&mut s, u64::MAX - 1, 1);
    assert!(denied.is_denied());
    assert!(w.idle_at(&s) >= u64::MAX - 1);
}

/// 6. Costs the limiters reject (0, above capacity) must still not panic the pure step.
#[test]
fn out_of_contract_costs_do_not_panic() {
    let sw = SlidingWindow::new(10, Duration::from_secs(1)).unwrap();
    let mut s = sw.fresh();
    sw.update(&mut s, 0, 1);
    assert!(sw.update(&mut s, 0, u64::MAX).is_denied());
    let strict = sw.with_policy(Policy::Strict);
    assert!(strict.update(&mut s, 0, u64::MAX).is_denied());
    // A cost near 2^64 times a window near 2^64 exceeds even u128: it saturates, denied.
    let wide = SlidingWindow::new(10, Duration::from_nanos(u64::MAX)).unwrap();
    assert!(wide.update(&mut wide.fresh(), 0, u64::MAX).is_denied());
    let log = SlidingLog::new(10, Duration::from_secs(1))
        .unwrap()
        .with_policy(Policy::Strict);
    let mut l = log.fresh();
    assert!(log.update(&mut l, 0, u64::MAX).is_denied());
    let sub = SubWindow::new(10, Duration::from_secs(1), 10).unwrap();
    let mut b = sub.fresh();
    assert!(sub.update(&mut b, 0, u64::MAX).is_denied());
    let strict_sub = sub.with_policy(Policy::Strict);
    assert!(strict_sub.update(&mut b, 0, 5).is_allowed());
    assert!(strict_sub.update(&mut b, 0, u64::MAX).is_denied());
    let fixed = FixedWindow::new(10, Duration::from_secs(1)).unwrap();
    assert!(fixed.update(&mut fixed.fresh(), 0, u64::MAX).is_denied());
    assert!(fixed.update(&mut fixed.fresh(), 0, 0).is_allowed());
}

/// 7. An `idle_at` saturated to u64::MAX counted as idle at a clock of u64::MAX, so a sweep
///    dropped live state. Sweeps now cap the clock like the algorithms do.
#[test]
fn saturated_idle_at_is_never_reached() {
    let x = Exponential::new(10.0, Duration::from_nanos(u64::MAX / 2))
        .unwrap()
        .with_policy(Policy::Strict);
    let clock = ManualClock::new();
    let l = CasLimiter::<String, Exponential>::builder(x)
        .clock(clock.clone())
        .sweep_grace(Duration::ZERO)
        .build()
        .unwrap();
    for _ in 0..6 {
        l.check_n("k", 10).unwrap();
    }
    clock.set_nanos(u64::MAX);
    assert_eq!(l.sweep().evicted_idle, 0);
    assert!(l.check_n("k", 10).unwrap().is_denied());
}
