//! An algorithm written outside the crate, on its public API only (issue #60): a token bucket
//! with whole tokens refilled on ticks, its state one `u64` word. It runs on every in-memory
//! store with the same decisions as its own sequential model, keeps its debts through
//! capacity eviction like the crate's algorithms, and runs under `Live`, which refuses to switch
//! it (it says nothing of which configurations read its states). The same algorithm limits HTTP requests
//! through `hotlimit-tower`'s layer (`tower/tests/outside_algorithm.rs`).

use hotlimit::algo::Algorithm;
use hotlimit::{CasLimiter, CompactLimiter, DirectLimiter, ManualClock, MutexLimiter, RateLimiter};
use hotlimit::{Field, Live, QuotaError};
use std::time::Duration;

mod common;
use common::tick_bucket::{bucket, TickBucket};
use hotlimit::Requests;

/// The same requests, on a limiter and on the algorithm's own state per key: the same
/// decisions (allowed, remaining, retry_after), request by request.
fn matches_the_model(limiter: &dyn RateLimiter<u64>, clock: &ManualClock, name: &str) {
    let algo = bucket();
    let mut model = [algo.fresh(); 4];
    let mut admitted = 0;
    for i in 0..400u64 {
        let (key, now, cost) = (i % 4, i * 17_000_000 + (i % 3) * 1_000_000, 1 + i % 2);
        clock.set(Duration::from_nanos(now));
        let want = algo.update(&mut model[key as usize], now, cost);
        let got = limiter.check_n(&key, cost).unwrap();
        assert_eq!(got.is_allowed(), want.is_allowed(), "{name}: request {i}");
        assert_eq!(got.remaining(), want.remaining(), "{name}: request {i}");
        assert_eq!(got.retry_after(), want.retry_after(), "{name}: request {i}");
        admitted += u64::from(got.is_allowed());
    }
    // Neither all nor none: the trace crosses the limit both ways.
    assert!(
        (100..400).contains(&admitted),
        "{name}: {admitted} admitted"
    );
}

#[test]
fn an_outside_algorithm_decides_alike_on_every_store() {
    let clock = ManualClock::default();
    matches_the_model(
        &CasLimiter::<u64, _, _>::with_clock(bucket(), clock.clone()),
        &clock,
        "cas",
    );
    let clock = ManualClock::default();
    matches_the_model(
        &MutexLimiter::<u64, _, _>::with_clock(bucket(), clock.clone()),
        &clock,
        "mutex",
    );
    let clock = ManualClock::default();
    matches_the_model(
        &CompactLimiter::<u64, _, _>::with_clock(bucket(), clock.clone()),
        &clock,
        "compact",
    );

    // Unkeyed: one state for every request.
    let clock = ManualClock::default();
    let direct = DirectLimiter::<TickBucket, _>::with_clock(bucket(), clock.clone());
    let algo = bucket();
    let mut model = algo.fresh();
    for i in 0..50u64 {
        let now = i * 40_000_000;
        clock.set(Duration::from_nanos(now));
        let want = algo.update(&mut model, now, 1);
        let got = direct.check(&());
        assert_eq!(
            (got.is_allowed(), got.retry_after()),
            (want.is_allowed(), want.retry_after()),
            "direct: request {i}"
        );
    }
}

/// Its debts go through the debt table: a key that spent a token, evicted by a flood of spent
/// new keys, comes back at least as limited as it left, on both bounded stores; a twin that
/// forgets evicted limits shows the flood did evict it (it comes back full).
#[test]
fn an_outside_algorithm_keeps_its_debts_through_a_flood() {
    macro_rules! flood {
        ($name:expr, $builder:expr, $wrap:expr) => {{
            for forget in [false, true] {
                let clock = ManualClock::default();
                let builder = $builder.max_keys(64).clock(clock.clone());
                let builder = if forget {
                    builder.forget_evicted_limits()
                } else {
                    builder
                };
                let limiter = $wrap(builder.build().unwrap());
                // Key 0 spends one token: it owes the least, so eviction takes it first.
                assert!(limiter.check(&0).is_allowed(), "{}", $name);
                // Each spends its tokens (a newcomer may be denied by a tag collision in the
                // debt table: at most 1% through 10x, G26).
                for key in 1..=640u64 {
                    let _ = limiter.check_n(&key, 3);
                    limiter.sweep();
                }
                assert!(
                    limiter.metrics().keys <= 80,
                    "{}: {} keys held",
                    $name,
                    limiter.metrics().keys
                );
                // Three tokens only if the flood reset the key (it kept two at most).
                assert_eq!(
                    limiter.check_n(&0, 3).unwrap().is_allowed(),
                    forget,
                    "{} (forgetting: {forget})",
                    $name
                );
                clock.set(Duration::from_millis(100));
                assert!(limiter.check(&0).is_allowed(), "{}", $name);
            }
        }};
    }
    // The papaya map keyed by `Id` (bounded, a map of `u64` keys is the compact table).
    flood!(
        "cas",
        CasLimiter::<common::id::Id, TickBucket>::builder(bucket()),
        common::ById
    );
    flood!(
        "compact",
        CompactLimiter::<u64, TickBucket>::builder(bucket()),
        std::convert::identity
    );
}

/// `Live` takes any algorithm. One whose `check_quota` keeps the default (it says nothing of
/// which configurations read its states) decides as the plain algorithm does, and refuses
/// every switch and every per-request quota with a typed error, changing nothing.
#[test]
fn a_live_outside_algorithm_refuses_a_switch_and_changes_nothing() {
    let clock = ManualClock::default();
    let live = CasLimiter::<u64, _, _>::with_clock(Live::new(bucket()), clock.clone());
    matches_the_model(&live, &clock, "Live<TickBucket>");
    let before: Vec<_> = (0..4).map(|k| live.request(&k).peek().unwrap()).collect();
    let bigger = TickBucket::new(10, 2, Duration::from_millis(100));
    let err = live.reconfigure(bigger).unwrap_err();
    assert_eq!(err.field(), Field::Quota);
    assert_eq!(
        err.to_string(),
        "quota cannot change from this configuration to another on this limiter: its kept \
         per-key state is measured in it"
    );
    assert_eq!(live.algorithm().get().size, 3);
    assert!(matches!(
        live.request(&1).quota(&Live::new(bigger)).check(),
        Err(QuotaError::Quota(_))
    ));
    let after: Vec<_> = (0..4).map(|k| live.request(&k).peek().unwrap()).collect();
    assert_eq!(after, before);
}
