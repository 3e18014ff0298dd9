//! The window family (DESIGN §3.4) as pure state machines: one fixed window, one sliding window
//! counter, one sliding log and one sub-window counter configuration, each stepped through the
//! same trace of `(time delta, cost)` requests from a fresh state with non-decreasing `now`,
//! starting at 0, anywhere, or just before `CLOCK_MAX`.
//!
//! Asserts the contract shared by every algorithm (`hotlimit_fuzz::drive`: no panic, no
//! tombstone stored, honest `retry_after`, lossless `idle_at`), and the limit itself:
//! * fixed window and sliding window counter: the cost allowed within one aligned window
//!   `[i·window, (i+1)·window)` never exceeds `limit`;
//! * sliding log: the cost allowed within any `(now − window, now]` never exceeds `limit`;
//! * sub-window counters: the cost allowed within any `(now − span, now]` never exceeds
//!   `limit`, where `span` is `k` buckets (strict bias, `k + 1` buckets summed) or `k − 1`
//!   buckets (lenient, `k` summed).
//!
//! Pins G9, G10, G11, G12, G14, G18, G23 (docs/GUARANTEES.md).
#![no_main]

use arbitrary::Arbitrary;
use hotlimit::algo::{Algorithm, Bias, FixedWindow, SlidingLog, SlidingWindow, SubWindow};
use hotlimit::Decision;
use hotlimit_fuzz::{drive, window_unit, RateKind, Req, Start, Timeline, WindowCfg};
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, VecDeque};

#[derive(Arbitrary, Debug)]
struct Input {
    fixed: WindowCfg,
    sliding: WindowCfg,
    floor: bool,
    log: WindowCfg,
    sub: WindowCfg,
    /// Buckets of the sub-window counters: up to 255 (the default is 60). A u32 count is a legal
    /// config, but each request clones the state and scans the buckets, so large counts only
    /// slow the fuzzer down.
    buckets: u8,
    lenient: bool,
    start: Start,
    trace: Vec<Req>,
}

/// Checks that the cost allowed within each aligned window of `window_ns` is at most `limit`.
fn aligned(name: &'static str, window_ns: u64, limit: u64) -> impl FnMut(u64, u64, Decision) {
    let mut per_window: HashMap<u64, u128> = HashMap::new();
    move |now, cost, d| {
        if d.is_allowed() {
            let i = now / window_ns;
            let sum = per_window.entry(i).or_default();
            *sum += u128::from(cost);
            assert!(
                *sum <= u128::from(limit),
                "{name}: {sum} allowed in window {i} of {window_ns} ns, limit {limit}"
            );
        }
    }
}

/// Checks that the cost allowed within any `(now − span_ns, now]` is at most `limit`.
fn sliding(name: &'static str, span_ns: u64, limit: u64) -> impl FnMut(u64, u64, Decision) {
    let mut log: VecDeque<(u64, u64)> = VecDeque::new();
    let mut sum: u128 = 0;
    move |now, cost, d| {
        if !d.is_allowed() {
            return;
        }
        while let Some(&(t, c)) = log.front() {
            if now - t < span_ns {
                break;
            }
            sum -= u128::from(c);
            log.pop_front();
        }
        log.push_back((now, cost));
        sum += u128::from(cost);
        assert!(
            sum <= u128::from(limit),
            "{name}: {sum} allowed within ({} ns, {now} ns], limit {limit}",
            now.saturating_sub(span_ns)
        );
    }
}

fn run<A>(
    algo: &A,
    unit_ns: f64,
    start: Start,
    trace: &[Req],
    is_tombstone: impl Fn(&A::State) -> bool,
    mut check: impl FnMut(u64, u64, Decision),
) where
    A: Algorithm,
    A::State: Clone + PartialEq,
{
    drive(
        algo,
        Timeline {
            unit_ns,
            start,
            trace,
        },
        RateKind::Any,
        is_tombstone,
        |_, _, _| {},
        |_, now, cost, d| check(now, cost, d),
    );
}

fuzz_target!(|input: Input| {
    let (limit, window, policy) = input.fixed.parts();
    if let Ok(w) = FixedWindow::new(limit, window) {
        let w = w.with_policy(policy);
        let window_ns = w.window().as_nanos() as u64;
        run(
            &w,
            window_unit(limit, window),
            input.start,
            &input.trace,
            |&s| s == u64::MAX,
            aligned("fixed window", window_ns, limit),
        );
    }

    let (limit, window, policy) = input.sliding.parts();
    if let Ok(s) = SlidingWindow::new(limit, window) {
        let bias = if input.floor {
            Bias::Lenient
        } else {
            Bias::Strict
        };
        let s = s.with_policy(policy).with_bias(bias);
        let window_ns = s.window().as_nanos() as u64;
        run(
            &s,
            window_unit(limit, window),
            input.start,
            &input.trace,
            |&s| s == u128::MAX,
            aligned("sliding window counter", window_ns, limit),
        );
    }

    let (limit, window, policy) = input.log.parts();
    if let Ok(l) = SlidingLog::new(limit, window) {
        let l = l.with_policy(policy);
        let window_ns = l.window().as_nanos() as u64;
        run(
            &l,
            window_unit(limit, window),
            input.start,
            &input.trace,
            |_| false,
            sliding("sliding log", window_ns, limit),
        );
    }

    let (limit, window, policy) = input.sub.parts();
    if let Ok(s) = SubWindow::new(limit, window, input.buckets.into()) {
        let bias = if input.lenient {
            Bias::Lenient
        } else {
            Bias::Strict
        };
        let s = s.with_policy(policy).with_bias(bias);
        let k = u64::from(input.buckets);
        let spanned = if input.lenient { k - 1 } else { k };
        // The bucket width, as the algorithm computes it (the window split evenly, rounded down).
        let bucket_ns = s.window().as_nanos() as u64 / k;
        let span_ns = bucket_ns.saturating_mul(spanned);
        run(
            &s,
            window_unit(limit, window),
            input.start,
            &input.trace,
            |_| false,
            sliding("sub-window counters", span_ns, limit),
        );
    }
});
