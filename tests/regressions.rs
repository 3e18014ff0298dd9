//! Regressions found by the fuzzers (`fuzz/`) and by hostile probing of the public API: each
//! is one finding, fixed, kept here so it stays fixed without running the fuzzers. Debug builds (as `cargo test` runs them) check
//! overflow, so "no panic" is part of each test.

mod common;

use common::step::WordStep;
use hotlimit::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, Reservation, SlidingLog, SlidingWindow,
    SubWindow, CLOCK_MAX,
};
use hotlimit::RateLimiter;
use hotlimit::{CasLimiter, Clock, ConfigError, Field, ManualClock, Policy, Rate};
use std::time::Duration;

/// 1. GCRA at a clock of u64::MAX: the clamp of `tat` below the tombstone made `tat' − now`
///    underflow. The clock now saturates at `CLOCK_MAX` for every algorithm. (This test once
///    asserted the request there was allowed; that admission was the saturation of #8 below:
///    a tat past the end of the clock cannot be kept, so the request is denied, and no wait
///    helps.)
// Pins G4.
#[test]
fn gcra_at_the_end_of_time() {
    let g: Gcra = "10/s".parse().unwrap();
    let step = g.step(g.fresh(), u64::MAX, 1);
    assert!(step.decision.is_denied());
    assert_eq!(step.decision.retry_after(), Duration::from_nanos(u64::MAX));
    let (reservation, _) = g.reserve(0, u64::MAX, 1, 0);
    assert_eq!(
        reservation,
        hotlimit::algo::Reservation::Denied {
            retry_after: Duration::from_nanos(u64::MAX)
        }
    );
}

/// 2. A fixed-window limit of u64::MAX overflowed `limit + 1` while sizing the count field.
// Pins G16.
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
// Pins G11, G18.
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
// Pins G4.
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
// Pins G4.
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
// Pins G17, G18.
#[test]
fn out_of_contract_costs_do_not_panic() {
    let sw = SlidingWindow::new(10, Duration::from_secs(1)).unwrap();
    let mut s = sw.fresh();
    let _ = sw.update(&mut s, 0, 1);
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
// Pins G4, G23.
#[test]
fn saturated_idle_at_is_never_reached() {
    let x = Exponential::new(10.0, Duration::from_nanos(u64::MAX / 2))
        .unwrap()
        .with_policy(Policy::Strict);
    let clock = ManualClock::default();
    let l = CasLimiter::<String, Exponential>::builder(x)
        .clock(clock.clone())
        .sweep_grace(Duration::ZERO)
        .build()
        .unwrap();
    for _ in 0..6 {
        let _ = l.check_n("k", 10).unwrap();
    }
    clock.set(Duration::from_nanos(u64::MAX));
    assert_eq!(l.sweep().evicted_idle, 0);
    assert!(l.check_n("k", 10).unwrap().is_denied());
}

/// 8. GCRA near the end of the clock admitted everything: at `CLOCK_MAX − 1 s` a `10/s burst
///    10` key allowed 100 of 100, because `tat'` saturated below the tombstone and so
///    `tat' − now ≤ τ` always held. It now holds its limit there.
// Pins G4, G6.
#[test]
fn gcra_near_the_end_of_the_clock_holds_its_limit() {
    let never = Duration::from_nanos(u64::MAX);
    let clock = ManualClock::default();
    clock.set(Duration::from_nanos(CLOCK_MAX - 1_000_000_000));
    let l = CasLimiter::<u64, Gcra, _>::with_clock("10/s burst 10".parse().unwrap(), clock.clone());
    let decisions: Vec<_> = (0..100).map(|_| l.check(&1)).collect();
    assert_eq!(decisions.iter().filter(|d| d.is_allowed()).count(), 10);
    assert!(decisions[..10].iter().all(|d| d.is_allowed()));
    // The key's tat is now CLOCK_MAX itself: any later request would pass the end of the
    // clock, so no wait admits it, and the denial says so.
    assert_eq!(decisions[10].retry_after(), never);
    clock.set(Duration::from_nanos(CLOCK_MAX));
    assert_eq!(l.check(&1).retry_after(), never);
    // Two seconds before the end the waits are the usual ones, and honest.
    clock.set(Duration::from_nanos(CLOCK_MAX - 2_000_000_000));
    assert_eq!((0..20).filter(|_| l.check(&2).is_allowed()).count(), 10);
    let denied = l.check(&2);
    assert_eq!(denied.retry_after(), Duration::from_millis(100));
    clock.advance(Duration::from_millis(100));
    assert!(l.check(&2).is_allowed());
    let strict = "10/s burst 10"
        .parse::<Gcra>()
        .unwrap()
        .with_policy(Policy::Strict);
    let mut tat = strict.fresh();
    assert!(strict.update(&mut tat, CLOCK_MAX, 1).is_denied());
    assert_eq!(tat, CLOCK_MAX, "a strict denial past the end keeps the end");
    // Found by the fuzzer once traces could start near the end: a strict denial whose own
    // tat still fits, but whose retry's would not (stored tat + cost·T past CLOCK_MAX), told a
    // wait of 200 ms after which the retry was denied again. No wait admits it.
    let start = CLOCK_MAX - 1_150_000_000;
    let mut tat = strict.fresh();
    assert!((0..10).all(|_| strict.update(&mut tat, start, 1).is_allowed()));
    let denied = strict.update(&mut tat, start, 1);
    assert_eq!(tat, CLOCK_MAX - 50_000_000, "counted, and it fits");
    assert_eq!(denied.retry_after(), never);
    // ... and a leaky denial's idle state stays idle (the fuzzer's other finding: the
    // lossless-eviction check now compares states as the sweeper does, by idleness).
    let leaky: Gcra = "10/s burst 10".parse().unwrap();
    let mut old = 5u64;
    assert!(leaky.update(&mut old, CLOCK_MAX, 1).is_denied());
    assert_eq!(old, 5);
    assert!(leaky.idle_at(&old) <= CLOCK_MAX);
}

/// 9. Slow GCRA rates were accepted with a saturated `T`: `0.00000000001/s` (T = 10^20 ns)
///    allowed 10 of 10 at t = 0 with `retry_after` 0, and `1/213000d` (T = 1.84·10^19 ns,
///    `2·T` past u64) answered a `retry_after` 422× too early. A quota whose `T`, `B·T` or
///    `B·T + cost·T` does not fit is now a typed error; one per century still works exactly.
// Pins G16.
#[test]
fn gcra_rates_too_slow_to_represent_are_errors() {
    for slow in ["0.00000000001/s", "1/213000d"] {
        let err = slow.parse::<Gcra>().unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::TooSmall {
                    field: Field::Rate,
                    ..
                }
            ),
            "{slow}: {err}"
        );
    }
    // One per century (T = 3.1536·10^18 ns): exact, and the wait honest.
    let century: Gcra = "1/36500d".parse().unwrap();
    let t = century.emission_interval();
    assert_eq!(t, Duration::from_secs(36_500 * 86_400));
    let mut tat = century.fresh();
    assert!(century.update(&mut tat, 0, 1).is_allowed());
    let denied = century.update(&mut tat, 0, 1);
    assert_eq!(denied.retry_after(), t);
    let t_ns = t.as_nanos() as u64;
    assert!(century.update(&mut tat, t_ns - 1, 1).is_denied());
    assert!(century.update(&mut tat, t_ns, 1).is_allowed());
    // A burst of one per century up to the largest `B·T` that fits twice in u64.
    assert!("1/36500d burst 2".parse::<Gcra>().is_ok());
    assert!(matches!(
        "1/36500d burst 3".parse::<Gcra>(),
        Err(ConfigError::TooLarge {
            field: Field::Burst,
            ..
        })
    ));
}

/// 10. `1/ns` with burst `u64::MAX` admitted a cost of `u64::MAX` twice at one instant (both
///     `tat'` saturated to the same value). The burst is now bounded so that `B·T + cost·T`
///     fits; at the bound a full-burst cost is admitted once, and honestly denied after.
// Pins G6.
#[test]
fn gcra_largest_burst_is_exact() {
    let err = Gcra::new(Rate::new(1.0, Duration::from_nanos(1)).unwrap())
        .unwrap()
        .with_burst(u64::MAX)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::TooLarge {
                field: Field::Burst,
                ..
            }
        ),
        "{err}"
    );
    let max = CLOCK_MAX / 2;
    let g = Gcra::new(Rate::new(1.0, Duration::from_nanos(1)).unwrap())
        .unwrap()
        .with_burst(max)
        .unwrap();
    assert!(g.with_burst(max + 1).is_err());
    let mut tat = g.fresh();
    assert!(g.update(&mut tat, 0, max).is_allowed());
    let denied = g.update(&mut tat, 0, max);
    assert!(denied.is_denied());
    assert_eq!(denied.retry_after(), Duration::from_nanos(max));
    let (r, _) = g.reserve(tat, 0, max, 0);
    assert_eq!(
        r,
        Reservation::Denied {
            retry_after: Duration::from_nanos(max)
        }
    );
    // Its tat then reaches CLOCK_MAX exactly (2·(2^63 − 1)), still exact.
    assert!(g.update(&mut tat, max, max).is_allowed());
    assert_eq!(tat, CLOCK_MAX);
}

/// 11. `until_ready_blocking` never returned when time could not advance (a manual clock
///     saturated at the end of its range), for every algorithm but GCRA: each round slept the
///     denial's wait, the clock stayed put, and the denial repeated. A wait the clock cannot
///     reach now ends with the denial, in every store.
// Pins G4, G15.
#[test]
fn waits_past_the_end_of_the_clock_end() {
    for case in common::cases() {
        for (variant, make) in &case.variants {
            let clock = ManualClock::default();
            clock.set(Duration::from_nanos(u64::MAX));
            let limiter = make(clock.clone());
            // Spend the key's budget at the end of time (every quota here admits < 1000).
            let spent = (0..1000).find(|_| limiter.check(&7).is_denied());
            assert!(spent.is_some(), "{} {variant}: never denied", case.name);
            let waited = limiter.until_ready_blocking(&7);
            assert!(waited.is_denied(), "{} {variant}", case.name);
            assert_eq!(clock.now(), u64::MAX);
        }
    }
}

/// 12. `Rate::per_second` (now crate-private) computed `count · 10^9` before dividing, so `1e300` per second
///     overflowed to infinity and EARRRL called it too small. Rates are now checked where
///     they are made, each error naming what is wrong.
// Pins G16.
#[test]
fn huge_and_tiny_rates_get_the_right_error() {
    let huge = Rate::new(1e300, Duration::from_secs(1)).unwrap();
    assert_eq!(huge.count(), 1e300);
    let e = Earrrl::new(Duration::from_secs(1), huge).unwrap();
    assert_eq!(e.max_rate(), 1e300);
    assert!(matches!(
        Rate::new(1e300, Duration::from_nanos(1)),
        Err(ConfigError::TooLarge {
            field: Field::Rate,
            ..
        })
    ));
    assert!(matches!(
        Rate::new(5e-324, Duration::from_nanos(u64::MAX)),
        Err(ConfigError::TooSmall {
            field: Field::Rate,
            ..
        })
    ));
    // A rate so far below the decay constant that the time for the rate to decay to it
    // overflows f64 (λ/(1e-9·R) = 6.9e8/1e-309): the wait and idleness could not be told.
    let tiny = Rate::new(1e-300, Duration::from_secs(1)).unwrap();
    let e = Earrrl::new(Duration::from_nanos(1), tiny).unwrap_err();
    assert!(
        matches!(
            e,
            ConfigError::TooSmall {
                field: Field::Limit,
                ..
            }
        ),
        "{e}"
    );
    let small = Rate::new(1e-290, Duration::from_secs(1)).unwrap();
    assert!(Earrrl::new(Duration::from_secs(1), small).is_ok());
}

/// The variant of a config error (its field and message aside): what `parse` and `new` must
/// agree on.
fn kind(r: &Result<Rate, ConfigError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(ConfigError::Zero { .. }) => "zero",
        Err(ConfigError::Negative { .. }) => "negative",
        Err(ConfigError::NotFinite { .. }) => "not finite",
        Err(ConfigError::TooLarge { .. }) => "too large",
        Err(ConfigError::TooSmall { .. }) => "too small",
        Err(_) => "other",
    }
}

/// 13. A parsed rate skipped `Rate::new`'s checks: 10^300 per nanosecond parsed to a rate of
///     infinity per second (which `Rate::new` refuses as too large, and EARRRL then refused as
///     too *small*), and 5·10^-324 per day to a rate of exactly 0 per second.
// Pins G16.
#[test]
fn parsed_rates_are_checked_as_constructed_ones() {
    let huge = format!("1{}/ns", "0".repeat(300));
    assert!(matches!(
        huge.parse::<Rate>(),
        Err(ConfigError::TooLarge {
            field: Field::Rate,
            ..
        })
    ));
    assert!(matches!(
        Rate::new(1e300, Duration::from_nanos(1)),
        Err(ConfigError::TooLarge {
            field: Field::Rate,
            ..
        })
    ));
    let tiny = format!("0.{}5/d", "0".repeat(323));
    assert!(matches!(
        tiny.parse::<Rate>(),
        Err(ConfigError::TooSmall {
            field: Field::Rate,
            ..
        })
    ));
    // The quotas that parse a rate refuse it the same way, before any algorithm sees it.
    assert!(matches!(
        format!("{huge} burst 5").parse::<Gcra>(),
        Err(ConfigError::TooLarge { .. })
    ));
}

/// 14. A strict sliding log restored from a joined debt admitted a request its own state
///     denied (found by `tests/debts.rs`'s proptest, G25). A strict denial moves the newest
///     entry's cost to its instant; restored beside another key's later, lighter entry, that
///     one took the denials and the key's own 20 units left the window on time.
// Pins G25.
#[test]
fn a_strict_log_restored_beside_a_lighter_newer_entry_is_never_more_lenient() {
    use hotlimit::algo::Debt;
    const MS: u64 = 1_000_000;
    let log = SlidingLog::new(20, Duration::from_secs(1))
        .unwrap()
        .with_policy(Policy::Strict);
    let at = |state: &mut _, t: u64, cost: u64| log.update(state, t, cost).is_allowed();
    // The key: 1 at 8.296 s, then 6 + 7 at 9.290 s and a denied 7 (merged there: 20).
    let mut mine = log.fresh();
    assert!(at(&mut mine, 8_296 * MS, 1));
    assert!(at(&mut mine, 9_290 * MS, 6));
    assert!(at(&mut mine, 9_290 * MS, 7));
    assert!(!at(&mut mine, 9_290 * MS, 7));
    // Another key sharing the debt table's slot: 2 at 9.580 s, in another cell of time.
    let mut other = log.fresh();
    assert!(at(&mut other, 9_580 * MS, 2));
    let joined = log.restore(&|p| log.debt_join(p, log.debt(&mine, p), log.debt(&other, p)));
    // Hammered from 10.037 s: each denial moves the key's newest cost on, so it denies at
    // 10.290 s, a window after 9.290 s; the restored state must deny there too.
    let (mut state, mut back) = (mine.clone(), joined);
    for t in [10_037, 10_042, 10_049, 10_290] {
        let (want, got) = (at(&mut state, t * MS, 1), at(&mut back, t * MS, 1));
        assert!(!want, "the state denies at {t} ms");
        assert!(!got, "restored from the joined debt, admitted at {t} ms");
    }
}

proptest::proptest! {
    /// `"<count>/<unit>"` parses exactly when `Rate::new(count, unit)` constructs, to the
    /// same rate, and fails with the same kind of error: over counts from 10^-330 to 10^310
    /// (both ends of f64 and beyond) and every unit.
    // Pins G16.
    #[test]
    fn parse_and_new_agree_on_every_value(
        mantissa in 1u32..10_000,
        exponent in -330i32..310,
        unit in proptest::sample::select(vec![("ns", 1u64), ("us", 1_000), ("ms", 1_000_000),
            ("s", 1_000_000_000), ("min", 60_000_000_000), ("h", 3_600_000_000_000),
            ("d", 86_400_000_000_000)]),
    ) {
        // The count as a plain decimal (the grammar has no exponent).
        let digits = mantissa.to_string();
        let text = if exponent >= 0 {
            format!("{digits}{}", "0".repeat(exponent as usize))
        } else {
            let shift = (-exponent) as usize;
            if shift >= digits.len() {
                format!("0.{}{digits}", "0".repeat(shift - digits.len()))
            } else {
                let (int, frac) = digits.split_at(digits.len() - shift);
                format!("{int}.{frac}")
            }
        };
        let count: f64 = text.parse().unwrap();
        let parsed = format!("{text}/{}", unit.0).parse::<Rate>();
        let constructed = Rate::new(count, Duration::from_nanos(unit.1));
        proptest::prop_assert_eq!(kind(&parsed), kind(&constructed), "{}/{}", text, unit.0);
        if let (Ok(p), Ok(c)) = (parsed, constructed) {
            proptest::prop_assert_eq!(p, c);
        }
    }
}
