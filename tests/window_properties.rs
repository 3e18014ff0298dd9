//! Property tests of the window family (DESIGN §3.4) against naive reference models.
//!
//! Each window algorithm is replayed over long random traces (non-decreasing times mixing
//! bursts at one instant, gaps around the window and bucket scale, exact window and bucket
//! distances, snaps to window and bucket boundaries, and occasional long idle periods) next to
//! a reference written here from the documented definitions: a plain list of the counted
//! `(time, cost)` requests, summed afresh for every decision. Every property also checks idle
//! eviction (DESIGN §5): from `idle_at(state)` on, the state decides exactly like a fresh one.
//!
//! The references prune entries that can never count again (times only move forward), so
//! they stay small; everything else is summed from scratch.

use hotlimit::algo::{Algorithm, Bias, FixedWindow, SlidingLog, SlidingWindow, SubWindow};
use hotlimit::Policy;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::time::Duration;

/// One millisecond, in nanoseconds.
const MS: u64 = 1_000_000;

/// `cases` cases per property; no regression files (failures print their minimal input).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Cases per property: traces are long (200..2000 requests), each request is checked
/// against a reference and an idle probe.
const CASES: u32 = 96;

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![Just(Policy::Leaky), Just(Policy::Strict)]
}

fn bias() -> impl Strategy<Value = Bias> {
    prop_oneof![Just(Bias::Strict), Just(Bias::Lenient)]
}

/// A window, log-uniform in [1 ms, 60 s] (so odd nanosecond counts are common).
fn window_ns() -> impl Strategy<Value = u64> {
    (0.0..=1.0f64).prop_map(|x| ((MS as f64 * 60_000f64.powf(x)) as u64).clamp(MS, 60_000 * MS))
}

/// The time of the first request: the origin, a few minutes in, or far out (2^60..2^62 ns).
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0u64..600_000 * MS, (1u64 << 60)..(1u64 << 62)]
}

/// Offered load relative to the limit (mean gap = the gap at the limit / load).
fn load() -> impl Strategy<Value = f64> {
    0.3..3.0f64
}

/// An unscaled gap before a request: a kind and a fraction in [0, 1). See [`next_time`].
type Gap = (u8, f64);

/// 200..2000 requests: gaps and raw costs (mapped onto 1..=min(limit, 5)).
fn steps() -> impl Strategy<Value = Vec<(Gap, u64)>> {
    prop::collection::vec(((any::<u8>(), 0.0..1.0f64), 1u64..=5), 200..2000)
}

/// The time scales of a trace.
struct Timing {
    /// Mean of the ordinary gaps, ns.
    unit: f64,
    /// The algorithm's window, ns.
    window: u64,
    /// The bucket width (the window for the unbucketed algorithms), ns.
    bucket: u64,
}

/// The next request's time after `now`:
/// * 40/256 at the same instant (bursts);
/// * 4/256 an idle period of up to 4 windows;
/// * 20/256 an exact distance: a window, a bucket, one ns either side of them, half a window;
/// * 16/256 the next window or bucket boundary, or one ns either side of it;
/// * the rest uniform in [0, 2·unit).
fn next_time(now: u64, (kind, frac): Gap, t: &Timing) -> u64 {
    let (w, b) = (t.window, t.bucket);
    match kind {
        0..=39 => now,
        40..=43 => now + (frac * 4.0 * w as f64) as u64,
        44..=63 => now + [w, w - 1, w + 1, b, b - 1, b + 1, w / 2][(frac * 7.0) as usize % 7],
        64..=79 => {
            let grid = if kind < 72 { w } else { b };
            // `next − 1 ≥ now`: the boundary is strictly ahead.
            let next = (now / grid + 1) * grid;
            next - 1 + (frac * 3.0) as u64 % 3
        }
        _ => now + (frac * 2.0 * t.unit) as u64,
    }
}

/// Absolute `(now, cost)` requests from `start`, costs mapped onto 1..=min(limit, 5), the
/// ordinary gaps scaled so the offered load is about `load` times the limit.
fn requests(
    start: u64,
    steps: &[(Gap, u64)],
    limit: u64,
    load: f64,
    window: u64,
    bucket: u64,
) -> Vec<(u64, u64)> {
    let cap = limit.min(5);
    let mean_cost = (1 + cap) as f64 / 2.0;
    let timing = Timing {
        unit: window as f64 * mean_cost / (limit as f64 * load),
        window,
        bucket,
    };
    let mut now = start;
    steps
        .iter()
        .enumerate()
        .map(|(k, &(gap, raw))| {
            if k > 0 {
                now = next_time(now, gap, &timing);
            }
            (now, (raw - 1) % cap + 1)
        })
        .collect()
}

/// Sum of the costs of `counted` whose time satisfies `keep`.
fn sum(counted: &[(u64, u64)], keep: impl Fn(u64) -> bool) -> u64 {
    counted
        .iter()
        .filter(|&&(t, _)| keep(t))
        .map(|&(_, c)| c)
        .sum()
}

/// DESIGN §5: from `idle_at(state)` on, `state` is equivalent to a fresh key. Plays one short
/// sequence of requests, the first exactly at `idle_at`, through a copy of `state` and through
/// a fresh state; every decision must be identical (retry_after, remaining and reset_after
/// included). `k` varies the probes from request to request.
fn check_idle<A>(
    algo: &A,
    state: &A::State,
    k: usize,
    limit: u64,
    window: u64,
) -> Result<(), TestCaseError>
where
    A: Algorithm,
    A::State: Clone,
{
    let idle = algo.idle_at(state);
    let k = k as u64;
    let small = 1 + k % limit.min(5);
    let probes = [
        (0, small),
        (0, limit),
        (1 + k.wrapping_mul(7919) % window, small),
        (window / 2 + k % 3, limit),
        (window, small),
    ];
    let (mut old, mut new) = (state.clone(), algo.fresh());
    let mut at = idle;
    for (i, &(dt, cost)) in probes.iter().enumerate() {
        at += dt;
        let (a, b) = (
            algo.update(&mut old, at, cost),
            algo.update(&mut new, at, cost),
        );
        prop_assert_eq!(
            a,
            b,
            "idle_at {} ns: probe {} at {} ns, cost {}: the idle state (left) and a fresh one \
             (right) differ; state before {:?}",
            idle,
            i,
            at,
            cost,
            state
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(CASES))]

    /// Fixed window (both policies) against the counted list: count = the cost counted in
    /// `now`'s window; allowed iff count + cost ≤ limit; the same `remaining` (leaky: what is
    /// left; a strict denial: 0) and `retry_after` = the end of the window − now for a denial.
    // Pins G9, G14.
    #[test]
    fn fixed_window_matches_reference(
        limit in 1u64..50,
        window in window_ns(),
        policy in policy(),
        start in start(),
        load in load(),
        steps in steps(),
    ) {
        let algo = FixedWindow::new(limit, Duration::from_nanos(window))
            .unwrap()
            .with_policy(policy);
        let mut st = algo.fresh();
        let mut counted: Vec<(u64, u64)> = Vec::new();
        for (k, &(now, cost)) in requests(start, &steps, limit, load, window, window)
            .iter()
            .enumerate()
        {
            let i = now / window;
            // Earlier windows never count again.
            counted.retain(|&(t, _)| t / window == i);
            let count = sum(&counted, |t| t / window == i);
            let allow = count + cost <= limit;
            let d = algo.update(&mut st, now, cost);
            prop_assert_eq!(
                d.is_allowed(), allow,
                "request {} at {} ns, cost {}: {:?}, reference count {}", k, now, cost, d, count
            );
            let (remaining, retry) = if allow {
                (limit - count - cost, 0)
            } else {
                let remaining = match policy {
                    Policy::Leaky => limit - count,
                    Policy::Strict => 0,
                    _ => unreachable!("a policy this model does not know"),
                };
                (remaining, (i + 1) * window - now)
            };
            prop_assert_eq!(
                d.remaining(), Some(remaining),
                "request {} at {} ns, cost {}: {:?}, reference count {}", k, now, cost, d, count
            );
            prop_assert_eq!(
                d.retry_after().as_nanos() as u64, retry,
                "request {} at {} ns, cost {}: {:?}, reference count {}", k, now, cost, d, count
            );
            if allow || policy == Policy::Strict {
                counted.push((now, cost));
            }
            check_idle(&algo, &st, k, limit, window)?;
        }
    }

    /// Sliding window counter (both biases, both policies) against the counted list:
    /// prev and cur = the cost counted in the previous and the current fixed window, allowed
    /// iff `prev·(w − elapsed) + (cur + cost)·w ≤ limit·w` (exact) or `< (limit + 1)·w`
    /// (floor), in u128. A denial's retry_after is honest and tight against the reference:
    /// with no new requests, the same request is allowed after it and denied 1 ns before.
    // Pins G10, G14.
    #[test]
    fn sliding_window_matches_reference(
        limit in 1u64..50,
        window in window_ns(),
        bias in bias(),
        policy in policy(),
        start in start(),
        load in load(),
        steps in steps(),
    ) {
        let algo = SlidingWindow::new(limit, Duration::from_nanos(window))
            .unwrap()
            .with_bias(bias)
            .with_policy(policy);
        let allows = |counted: &[(u64, u64)], now: u64, cost: u64| {
            let i = now / window;
            let elapsed = (now - i * window) as u128;
            let prev = sum(counted, |t| t / window + 1 == i) as u128;
            let cur = sum(counted, |t| t / window == i) as u128;
            let (l, w) = (limit as u128, window as u128);
            let taken = prev * (w - elapsed) + (cur + cost as u128) * w;
            match bias {
                Bias::Strict => taken <= l * w,
                Bias::Lenient => taken < (l + 1) * w,
            }
        };
        let mut st = algo.fresh();
        let mut counted: Vec<(u64, u64)> = Vec::new();
        for (k, &(now, cost)) in requests(start, &steps, limit, load, window, window)
            .iter()
            .enumerate()
        {
            // Windows before the previous one never count again.
            counted.retain(|&(t, _)| t / window + 1 >= now / window);
            let allow = allows(&counted, now, cost);
            let d = algo.update(&mut st, now, cost);
            prop_assert_eq!(
                d.is_allowed(), allow,
                "request {} at {} ns, cost {}: {:?}, reference counted {:?}",
                k, now, cost, d, counted
            );
            if allow || policy == Policy::Strict {
                counted.push((now, cost));
            }
            if !allow {
                let r = d.retry_after().as_nanos() as u64;
                prop_assert!(
                    r >= 1 && allows(&counted, now + r, cost) && !allows(&counted, now + r - 1, cost),
                    "request {} at {} ns, cost {}: {:?}: retry not honest and tight against the \
                     reference (allowed at +r: {}, at +r − 1: {}); reference counted {:?}",
                    k, now, cost, d,
                    allows(&counted, now + r, cost),
                    r >= 1 && allows(&counted, now + r - 1, cost),
                    counted
                );
            } else {
                prop_assert_eq!(d.retry_after().as_nanos() as u64, 0);
            }
            check_idle(&algo, &st, k, limit, window)?;
        }
    }

    /// Sliding log, leaky, against the list of allowed requests: allowed iff the cost with
    /// `t + w > now` plus cost ≤ limit; the same `remaining`; retry_after = the earliest time
    /// (one of the entries' `t + w`) at which the reference allows the same request, − now.
    // Pins G11, G14.
    #[test]
    fn sliding_log_leaky_matches_reference(
        limit in 1u64..50,
        window in window_ns(),
        start in start(),
        load in load(),
        steps in steps(),
    ) {
        let algo = SlidingLog::new(limit, Duration::from_nanos(window)).unwrap();
        prop_assert_eq!(algo.policy(), Policy::Leaky);
        let count = |counted: &[(u64, u64)], now: u64| sum(counted, |t| t + window > now);
        let mut st = algo.fresh();
        let mut counted: Vec<(u64, u64)> = Vec::new();
        for (k, &(now, cost)) in requests(start, &steps, limit, load, window, window)
            .iter()
            .enumerate()
        {
            counted.retain(|&(t, _)| t + window > now);
            let c = count(&counted, now);
            let allow = c + cost <= limit;
            let d = algo.update(&mut st, now, cost);
            prop_assert_eq!(
                d.is_allowed(), allow,
                "request {} at {} ns, cost {}: {:?}, reference counted {:?}",
                k, now, cost, d, counted
            );
            let (remaining, retry) = if allow {
                (limit - c - cost, 0)
            } else {
                let at = counted
                    .iter()
                    .map(|&(t, _)| t + window)
                    .filter(|&at| at > now && count(&counted, at) + cost <= limit)
                    .min();
                prop_assert!(at.is_some(), "no entry leaving lets cost {} in: {:?}", cost, counted);
                (limit - c, at.unwrap() - now)
            };
            prop_assert_eq!(
                d.remaining(), Some(remaining),
                "request {} at {} ns, cost {}: {:?}, reference counted {:?}",
                k, now, cost, d, counted
            );
            prop_assert_eq!(
                d.retry_after().as_nanos() as u64, retry,
                "request {} at {} ns, cost {}: {:?}, reference counted {:?}",
                k, now, cost, d, counted
            );
            if allow {
                counted.push((now, cost));
            }
            check_idle(&algo, &st, k, limit, window)?;
        }
    }

    /// Sliding log, strict, against the exact strict log, which counts every request at its
    /// own time (its counted list is every request so far). The implementation merges a denied
    /// cost into the newest entry, moving it later, which errs strict, so:
    /// * it is never more lenient: whenever it allows, the exact reference allows too, and its
    ///   `remaining` is at most the reference's;
    /// * up to and including the first denial the two are the same log, so the decisions and
    ///   `remaining` are identical (on a trace with no denial, all of them);
    /// * a denial's retry_after is honest and tight against the implementation's own state, and
    ///   honest against the exact reference (which only counts less).
    // Pins G11, G14.
    #[test]
    fn sliding_log_strict_never_more_lenient_than_exact(
        limit in 1u64..50,
        window in window_ns(),
        start in start(),
        load in load(),
        steps in steps(),
    ) {
        let algo = SlidingLog::new(limit, Duration::from_nanos(window))
            .unwrap()
            .with_policy(Policy::Strict);
        let count = |all: &[(u64, u64)], now: u64| sum(all, |t| t + window > now);
        let mut st = algo.fresh();
        let mut all: Vec<(u64, u64)> = Vec::new();
        let mut denied_before = false;
        for (k, &(now, cost)) in requests(start, &steps, limit, load, window, window)
            .iter()
            .enumerate()
        {
            all.retain(|&(t, _)| t + window > now);
            let c = count(&all, now);
            let allow = c + cost <= limit;
            let d = algo.update(&mut st, now, cost);
            let remaining = if allow { limit - c - cost } else { 0 };
            if !denied_before {
                prop_assert_eq!(
                    d.is_allowed(), allow,
                    "request {} at {} ns, cost {} (no denial before): {:?}, reference {:?}",
                    k, now, cost, d, all
                );
                prop_assert_eq!(
                    d.remaining(), Some(remaining),
                    "request {} at {} ns, cost {} (no denial before): {:?}, reference {:?}",
                    k, now, cost, d, all
                );
            }
            prop_assert!(
                d.is_denied() || allow,
                "request {} at {} ns, cost {}: allowed, but the exact strict log denies \
                 (count {}); implementation {:?}, reference {:?}",
                k, now, cost, c, st, all
            );
            prop_assert!(
                d.remaining().is_some_and(|r| r <= remaining),
                "request {} at {} ns, cost {}: {:?} leaves more than the exact strict log ({}); \
                 implementation {:?}, reference {:?}",
                k, now, cost, d, remaining, st, all
            );
            all.push((now, cost));
            if d.is_denied() {
                denied_before = true;
                let r = d.retry_after().as_nanos() as u64;
                prop_assert!(r >= 1, "request {} at {} ns: {:?}", k, now, d);
                let (mut then, mut early) = (st.clone(), st.clone());
                let (at_r, before_r) = (
                    algo.update(&mut then, now + r, cost),
                    algo.update(&mut early, now + r - 1, cost),
                );
                prop_assert!(
                    at_r.is_allowed() && before_r.is_denied(),
                    "request {} at {} ns, cost {}: {:?}: retry not honest and tight against the \
                     implementation (at +r: {:?}, at +r − 1: {:?}); state {:?}",
                    k, now, cost, d, at_r, before_r, st
                );
                prop_assert!(
                    count(&all, now + r) + cost <= limit,
                    "request {} at {} ns, cost {}: {:?}: the exact strict log still denies at \
                     +retry_after; reference {:?}",
                    k, now, cost, d, all
                );
            } else {
                prop_assert_eq!(d.retry_after().as_nanos() as u64, 0);
            }
            check_idle(&algo, &st, k, limit, window)?;
        }
    }

    /// Sub-window counters (both biases, both policies, 1..=20 buckets) against the counted
    /// list: bucket(t) = t / (w / buckets), span = buckets + 1 (strict bias) or buckets
    /// (lenient); allowed iff the cost with `bucket(now) − span < bucket(t) ≤ bucket(now)`
    /// plus cost ≤ limit. The same `remaining` (a strict denial: 0); a denial's retry_after is
    /// honest and tight against the reference.
    // Pins G12, G14.
    #[test]
    fn sub_window_matches_reference(
        limit in 1u64..50,
        window in window_ns(),
        buckets in 1u32..=20,
        bias in bias(),
        policy in policy(),
        start in start(),
        load in load(),
        steps in steps(),
    ) {
        let algo = SubWindow::new(limit, Duration::from_nanos(window), buckets)
            .unwrap()
            .with_bias(bias)
            .with_policy(policy);
        let width = window / buckets as u64;
        let span = match bias {
            Bias::Strict => buckets as u64 + 1,
            Bias::Lenient => buckets as u64,
        };
        // bucket(now) − span < bucket(t) ≤ bucket(now), without underflow.
        let count = |counted: &[(u64, u64)], now: u64| {
            let b = now / width;
            sum(counted, |t| t / width + span > b && t / width <= b)
        };
        let mut st = algo.fresh();
        let mut counted: Vec<(u64, u64)> = Vec::new();
        for (k, &(now, cost)) in requests(start, &steps, limit, load, window, width)
            .iter()
            .enumerate()
        {
            counted.retain(|&(t, _)| t / width + span > now / width);
            let c = count(&counted, now);
            let allow = c + cost <= limit;
            let d = algo.update(&mut st, now, cost);
            prop_assert_eq!(
                d.is_allowed(), allow,
                "request {} at {} ns, cost {}: {:?}, reference count {}, counted {:?}",
                k, now, cost, d, c, counted
            );
            let remaining = match (allow, policy) {
                (true, _) => limit - c - cost,
                (false, Policy::Leaky) => limit - c,
                (false, Policy::Strict) => 0,
                _ => unreachable!("a policy this model does not know"),
            };
            prop_assert_eq!(
                d.remaining(), Some(remaining),
                "request {} at {} ns, cost {}: {:?}, reference count {}, counted {:?}",
                k, now, cost, d, c, counted
            );
            if allow || policy == Policy::Strict {
                counted.push((now, cost));
            }
            if !allow {
                let r = d.retry_after().as_nanos() as u64;
                let ok_at = |at: u64| count(&counted, at) + cost <= limit;
                prop_assert!(
                    r >= 1 && ok_at(now + r) && !ok_at(now + r - 1),
                    "request {} at {} ns, cost {}: {:?}: retry not honest and tight against the \
                     reference (allowed at +r: {}, at +r − 1: {}); counted {:?}",
                    k, now, cost, d, ok_at(now + r), r >= 1 && ok_at(now + r - 1), counted
                );
            } else {
                prop_assert_eq!(d.retry_after().as_nanos() as u64, 0);
            }
            check_idle(&algo, &st, k, limit, window)?;
        }
    }
}

/// `peek` against `update` on a copy of the state, before each request of a trace: the
/// same decision for the request's own cost, one unit, the limit and one over it, at its
/// time and at a time behind the state's newest (which both count as the newest).
fn peek_is_update_on_a_copy<A: Algorithm>(
    algo: &A,
    trace: &[(u64, u64)],
    limit: u64,
) -> Result<(), TestCaseError> {
    let mut st = algo.fresh();
    for (k, &(now, cost)) in trace.iter().enumerate() {
        for at in [now, now.saturating_sub(1 + now / 7)] {
            for c in [cost, 1, limit, limit + 1] {
                prop_assert_eq!(
                    algo.peek(&st, at, c),
                    algo.update(&mut st.clone(), at, c),
                    "request {} at {} ns, probe cost {}",
                    k,
                    at,
                    c
                );
            }
        }
        let _ = algo.update(&mut st, now, cost);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(CASES))]

    /// The sub-window and the log peek in place, without the copy the default makes
    /// (tests/alloc.rs): the same decision as `update` on a copy, both policies, both biases.
    // Pins G36, G28.
    #[test]
    fn sub_window_and_log_peek_in_place_as_update_on_a_copy(
        limit in 1u64..50,
        window in window_ns(),
        buckets in 1u32..12,
        bias in bias(),
        policy in policy(),
        start in start(),
        load in load(),
        steps in steps(),
    ) {
        let sub = SubWindow::new(limit, Duration::from_nanos(window), buckets)
            .unwrap()
            .with_bias(bias)
            .with_policy(policy);
        let bucket = window / buckets as u64;
        let trace = requests(start, &steps, limit, load, window, bucket);
        peek_is_update_on_a_copy(&sub, &trace, limit)?;
        let log = SlidingLog::new(limit, Duration::from_nanos(window))
            .unwrap()
            .with_policy(policy);
        peek_is_update_on_a_copy(&log, &trace, limit)?;
    }
}
