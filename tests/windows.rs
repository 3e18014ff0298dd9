//! Worked vectors for the window family (DESIGN §3.4): fixed window, sliding window counter
//! (strict and lenient bias: exact and floored weighted counts), sliding log and sub-window counters (strict and lenient bias),
//! each under both policies.
//!
//! Every expected value is derived by hand from the documented definitions (the module docs
//! and DESIGN §3.4); the arithmetic is in the comment next to it. Times are in seconds unless
//! said otherwise; `S` is one second in nanoseconds.
//!
//! The definitions used:
//! * `remaining`: the cost that could still be admitted right after this request (Decision's
//!   doc). Under the strict policy a denied request is counted, so right after it nothing more
//!   fits: a strict denial leaves `remaining = 0`.
//! * `retry_after`: the earliest wait after which the same request is allowed with no other
//!   traffic; under the strict policy it accounts for the denied request having been counted.

use hotlimit::algo::{Algorithm, Bias, FixedWindow, SlidingLog, SlidingWindow, SubWindow};
use hotlimit::{ConfigError, Field, Policy};
use std::fmt::Debug;
use std::time::Duration;

/// One second, in nanoseconds.
const S: u64 = 1_000_000_000;
/// One millisecond, in nanoseconds.
const MS: u64 = 1_000_000;

/// One request of a vector and the decision it must get.
#[derive(Debug, Clone, Copy)]
struct Req {
    /// Time, ns since the origin.
    at: u64,
    cost: u64,
    allowed: bool,
    /// Expected `retry_after`, ns (0 when allowed).
    retry: u64,
    /// Expected `remaining`.
    remaining: u64,
}

/// A request that must be allowed, leaving `remaining`.
fn ok(at: u64, cost: u64, remaining: u64) -> Req {
    Req {
        at,
        cost,
        allowed: true,
        retry: 0,
        remaining,
    }
}

/// A request that must be denied with `retry_after = retry` ns, reporting `remaining`.
fn no(at: u64, cost: u64, retry: u64, remaining: u64) -> Req {
    Req {
        at,
        cost,
        allowed: false,
        retry,
        remaining,
    }
}

/// Plays `vector` through `algo` from a fresh key and checks every decision; after every
/// denial also checks that the retry is honest and tight on a clone of the post-denial state:
/// the same request `retry_after` later is allowed, 1 ns earlier denied. Collects every
/// mismatch before failing, so one wrong value does not hide the others. Returns the final
/// state.
fn play<A>(name: &str, algo: &A, vector: &[Req]) -> A::State
where
    A: Algorithm,
    A::State: Clone,
{
    let mut state = algo.fresh();
    let mut wrong = Vec::new();
    for (i, r) in vector.iter().enumerate() {
        let d = algo.update(&mut state, r.at, r.cost);
        let here = format!(
            "{name}, request {} (t = {} ns, cost {})",
            i + 1,
            r.at,
            r.cost
        );
        if d.is_allowed() != r.allowed {
            wrong.push(format!(
                "{here}: allowed {}, expected {}",
                d.is_allowed(),
                r.allowed
            ));
        }
        if d.retry_after() != Duration::from_nanos(r.retry) {
            wrong.push(format!(
                "{here}: retry_after {:?}, expected {:?}",
                d.retry_after(),
                Duration::from_nanos(r.retry)
            ));
        }
        if d.remaining() != Some(r.remaining) {
            wrong.push(format!(
                "{here}: remaining {:?}, expected Some({})",
                d.remaining(),
                r.remaining
            ));
        }
        if d.is_denied() {
            let wait = d.retry_after().as_nanos() as u64;
            let mut then = state.clone();
            if !algo.update(&mut then, r.at + wait, r.cost).is_allowed() {
                wrong.push(format!(
                    "{here}: dishonest retry: denied again after {wait} ns"
                ));
            }
            let mut early = state.clone();
            if wait == 0
                || algo
                    .update(&mut early, r.at + wait - 1, r.cost)
                    .is_allowed()
            {
                wrong.push(format!(
                    "{here}: retry not tight: allowed 1 ns before {wait} ns"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "\n{}\n", wrong.join("\n"));
    state
}

/// Checks `idle_at(state) == idle` and that from `idle` on the state behaves exactly like a
/// fresh one (the same decisions, `reset_after` included, for a few requests), while 1 ns
/// before `idle` it is not yet equivalent: a request there leaves a different next state.
/// (Different decisions are not required that early: under the lenient bias a previous window's
/// weight below one unit is invisible to decisions, yet it is still stored.)
fn check_idle<A>(name: &str, algo: &A, state: &A::State, idle: u64, limit: u64)
where
    A: Algorithm,
    A::State: Clone + Debug + PartialEq,
{
    assert_eq!(algo.idle_at(state), idle, "{name}: idle_at of {state:?}");
    let (mut old, mut new) = (state.clone(), algo.fresh());
    for (at, cost) in [
        (idle, 1),
        (idle, limit),
        (idle + 3 * S, 1),
        (idle + 7 * S, limit),
    ] {
        assert_eq!(
            algo.update(&mut old, at, cost),
            algo.update(&mut new, at, cost),
            "{name}: idle state and fresh state differ at {at} ns, cost {cost}"
        );
        assert_eq!(old, new, "{name}: next states differ at {at} ns");
    }
    // Not earlier: 1 ns before, the old state still holds something.
    let (mut old, mut new) = (state.clone(), algo.fresh());
    let d_old = algo.update(&mut old, idle - 1, 1);
    let d_new = algo.update(&mut new, idle - 1, 1);
    assert!(
        (d_old, &old) != (d_new, &new),
        "{name}: already equivalent to fresh 1 ns before idle_at"
    );
}

// ---------------------------------------------------------------------------------------------
// Fixed window: window i covers [i·w, (i+1)·w); allowed iff count + cost ≤ limit; retry at the
// end of the window; strict counts a denied cost (saturating at limit + 1).

fn fixed_3_per_60s(policy: Policy) -> FixedWindow {
    FixedWindow::new(3, Duration::from_secs(60))
        .unwrap()
        .with_policy(policy)
}

// Pins G9.
#[test]
fn fixed_window_spec_vector_leaky() {
    let w = fixed_3_per_60s(Policy::Leaky);
    assert_eq!(w.policy(), Policy::Leaky);
    let state = play(
        "fixed leaky (DESIGN §3.4)",
        &w,
        &[
            ok(5 * S, 1, 2),   // window [0, 60) holds 5: count 1, remaining 3 − 1 = 2
            ok(15 * S, 1, 1),  // [0, 60) holds 5, 15: count 2, remaining 1
            ok(61 * S, 1, 2),  // new window [60, 120) holds 61: count 1, remaining 2
            ok(70 * S, 1, 1),  // [60, 120) holds 61, 70: count 2, remaining 1
            ok(100 * S, 1, 0), // [60, 120) holds 61, 70, 100: count 3 = limit, remaining 0
            // 110: count 3 + 1 = 4 > 3; retry at the window's end 120 − 110 = 10 s;
            // remaining 3 − 3 = 0 (leaky: the denial counts nothing)
            no(110 * S, 1, 10 * S, 0),
            ok(140 * S, 1, 2), // new window [120, 180) holds 140: count 1, remaining 2
        ],
    );
    // Window 2 ([120 s, 180 s)) holds 1: fresh again when it ends, at 3 · 60 = 180 s.
    check_idle("fixed leaky", &w, &state, 180 * S, 3);
}

/// One trace, both policies: requests at 5, 10 (cost 1), 20 (cost 2), 30, 60 s.
// Pins G9.
#[test]
fn fixed_window_strict_counts_the_denied_cost() {
    play(
        "fixed leaky",
        &fixed_3_per_60s(Policy::Leaky),
        &[
            ok(5 * S, 1, 2),  // [0, 60): count 1, remaining 2
            ok(10 * S, 1, 1), // count 2, remaining 1
            // count 2 + 2 = 4 > 3; retry 60 − 20 = 40 s; remaining 3 − 2 = 1 (nothing counted)
            no(20 * S, 2, 40 * S, 1),
            ok(30 * S, 1, 0), // count 2 + 1 = 3 ≤ 3: the 1 unit left is still there
            ok(60 * S, 1, 2), // [60, 120): count 1, remaining 2
        ],
    );
    let strict = fixed_3_per_60s(Policy::Strict);
    let state = play(
        "fixed strict",
        &strict,
        &[
            ok(5 * S, 1, 2),  // [0, 60): count 1, remaining 2
            ok(10 * S, 1, 1), // count 2, remaining 1
            // count 2 + 2 = 4 > 3: denied and counted, count min(4, limit + 1 = 4) = 4;
            // retry 60 − 20 = 40 s; remaining max(0, 3 − 4) = 0
            no(20 * S, 2, 40 * S, 0),
            // The denied cost counts now: 4 + 1 = 5 > 3, denied (leaky allowed this one);
            // count stays min(5, 4) = 4; retry 60 − 30 = 30 s; remaining 0
            no(30 * S, 1, 30 * S, 0),
            ok(60 * S, 1, 2), // [60, 120): count 1, remaining 2
        ],
    );
    // Window 1 ([60 s, 120 s)) holds 1: fresh at 120 s.
    check_idle("fixed strict", &strict, &state, 120 * S, 3);
}

// ---------------------------------------------------------------------------------------------
// Sliding window counter, 4 per 10 s: weighted = prev·(1 − e/10) + cur + cost, e = time into
// the current window [10·i, 10·i + 10). Exact denies iff weighted > 4, floor iff ⌊weighted⌋ > 4.
// remaining = the largest c with prev·(1 − e/10) + cur + c ≤ 4 (exact) or < 5 (floor).

fn sliding_4_per_10s(bias: Bias, policy: Policy) -> SlidingWindow {
    SlidingWindow::new(4, Duration::from_secs(10))
        .unwrap()
        .with_bias(bias)
        .with_policy(policy)
}

// Pins G10.
#[test]
fn sliding_window_exact_leaky() {
    let w = sliding_4_per_10s(Bias::Strict, Policy::Leaky);
    let state = play(
        "sliding exact leaky",
        &w,
        &[
            ok(2 * S, 2, 2), // window 0: 0 + 0 + 2 = 2 ≤ 4; remaining: 2 + c ≤ 4 → 2
            ok(5 * S, 1, 1), // 0 + 2 + 1 = 3; remaining 1
            ok(8 * S, 1, 0), // 0 + 3 + 1 = 4 ≤ 4; remaining 0 (cur = 4)
            // 9: 0 + 4 + 1 = 5 > 4; remaining 0. Retry: window 0 can never fit (cur 4 + 1);
            // window 1: 4·(1 − e/10) + 0 + 1 ≤ 4 ⇔ e ≥ 2.5 → t = 12.5, wait 12.5 − 9 = 3.5 s
            no(9 * S, 1, 3_500 * MS, 0),
            // 12.5: window 1, prev 4, e = 2.5: 4·0.75 + 0 + 1 = 4 ≤ 4; remaining: 3 + 1 + c ≤ 4
            // → 0
            ok(12_500 * MS, 1, 0),
            // 13: e = 3: 4·0.7 + 1 + 1 = 4.8 > 4 (floor would allow: ⌊4.8⌋ = 4); remaining:
            // 2.8 + 1 + c ≤ 4 → c ≤ 0.2 → 0. Retry: 4·(1 − e/10) + 2 ≤ 4 ⇔ e ≥ 5 → t = 15,
            // wait 2 s
            no(13 * S, 1, 2 * S, 0),
            // 16: e = 6: 4·0.4 + 1 + 2 = 4.6 > 4; remaining: 1.6 + 1 + c ≤ 4 → c ≤ 1.4 → 1.
            // Retry: 4·(1 − e/10) + 3 ≤ 4 ⇔ e ≥ 7.5 → t = 17.5, wait 1.5 s
            no(16 * S, 2, 1_500 * MS, 1),
            // Leaky: the denial counted nothing, so cost 1 fits: 1.6 + 1 + 1 = 3.6 ≤ 4;
            // remaining: 1.6 + 2 + c ≤ 4 → c ≤ 0.4 → 0
            ok(16 * S, 1, 0),
        ],
    );
    // State: window 1, prev 4, cur 2. Both counts are gone once window 1 is two windows back:
    // from window 3, at 3 · 10 = 30 s.
    check_idle("sliding exact leaky", &w, &state, 30 * S, 4);
}

// Pins G10.
#[test]
fn sliding_window_floor_leaky() {
    let w = sliding_4_per_10s(Bias::Lenient, Policy::Leaky);
    let state = play(
        "sliding floor leaky",
        &w,
        &[
            ok(2 * S, 2, 2), // ⌊0 + 0 + 2⌋ = 2 ≤ 4; remaining: ⌊2 + c⌋ ≤ 4 → 2
            ok(5 * S, 1, 1), // 3; remaining 1
            ok(8 * S, 1, 0), // 4; remaining 0 (cur = 4)
            // 9: ⌊0 + 4 + 1⌋ = 5 > 4; remaining 0. Retry: window 1, prev 4:
            // ⌊4·(1 − e/10) + 1⌋ ≤ 4 ⇔ 4·(1 − e/10) < 4 ⇔ e > 0: at 10 s exactly e = 0 gives
            // 5 (denied), at e = 1 ns 5 − 4·10⁻¹⁰ floors to 4 → wait 10 s + 1 ns − 9 s
            no(9 * S, 1, S + 1, 0),
            // 12.5: e = 2.5: 4·0.75 + 0 + 1 = 4 → 4 ≤ 4; remaining: ⌊4 + c⌋ ≤ 4 → 0
            ok(12_500 * MS, 1, 0),
            // 13: e = 3: 4·0.7 + 1 + 1 = 4.8, ⌊4.8⌋ = 4 ≤ 4: allowed where exact denies
            // (4.8 > 4, see sliding_window_exact_leaky); remaining: ⌊4.8 + c⌋ ≤ 4 → 0
            ok(13 * S, 1, 0),
            // 13 again: 2.8 + 2 + 1 = 5.8 → 5 > 4; remaining 0. Retry:
            // ⌊4·(1 − e/10) + 3⌋ ≤ 4 ⇔ 4·(1 − e/10) < 2 ⇔ e > 5 → t = 15 s + 1 ns
            // (at 15 s exactly: 2 + 3 = 5, denied) → wait 2 s + 1 ns
            no(13 * S, 1, 2 * S + 1, 0),
        ],
    );
    // State: window 1, prev 4, cur 2 → fresh from window 3, at 30 s.
    check_idle("sliding floor leaky", &w, &state, 30 * S, 4);
}

// Pins G10.
#[test]
fn sliding_window_floor_allows_what_exact_denies() {
    // The common prefix of the two vectors above, then the request at 13 s: prev 4, cur 1,
    // e = 3 s: weighted = 4·(1 − 3/10) + 1 + 1 = 4.8.
    let prefix = [
        (2 * S, 2),
        (5 * S, 1),
        (8 * S, 1),
        (9 * S, 1),
        (12_500 * MS, 1),
    ];
    for (bias, allowed) in [(Bias::Strict, false), (Bias::Lenient, true)] {
        let w = sliding_4_per_10s(bias, Policy::Leaky);
        let mut state = w.fresh();
        for &(at, cost) in &prefix {
            let _ = w.update(&mut state, at, cost);
        }
        // Exact: 4.8 > 4 denies; floor: ⌊4.8⌋ = 4 ≤ 4 allows.
        let d = w.update(&mut state, 13 * S, 1);
        assert_eq!(d.is_allowed(), allowed, "{bias:?}");
    }
}

// Pins G10.
#[test]
fn sliding_window_exact_strict() {
    let w = sliding_4_per_10s(Bias::Strict, Policy::Strict);
    let state = play(
        "sliding exact strict",
        &w,
        &[
            ok(2 * S, 2, 2), // 2 ≤ 4, remaining 2
            ok(5 * S, 1, 1), // 3, remaining 1
            ok(8 * S, 1, 0), // 4, remaining 0
            // 9: 4 + 1 = 5 > 4, counted: cur = 5; remaining 0.
            // Retry: window 1, prev 5: 5·(1 − e/10) + 1 ≤ 4 ⇔ e ≥ 4 → t = 14, wait 5 s
            // (leaky: 3.5 s)
            no(9 * S, 1, 5 * S, 0),
            // 12.5: prev 5, e = 2.5: 5·0.75 + 0 + 1 = 4.75 > 4: denied where leaky allowed;
            // remaining: 3.75 + c ≤ 4 → 0; counted: cur = 1. Retry: 5·(1 − e/10) + 1 + 1 ≤ 4
            // ⇔ e ≥ 6 → t = 16, wait 3.5 s
            no(12_500 * MS, 1, 3_500 * MS, 0),
            // 16: e = 6: 5·0.4 + 1 + 1 = 4 ≤ 4; remaining: 2 + 2 + c ≤ 4 → 0
            ok(16 * S, 1, 0),
            // 18: e = 8: 5·0.2 + 2 + 2 = 5 > 4; counted: cur = 2 + 2 = 4, so
            // remaining 0 (1 + 4 + c ≤ 4 has no c ≥ 1; before counting it would be 1).
            // Retry: window 1 never fits again (cur 4 + 2 > 4); window 2, prev 4, cur 0:
            // 4·(1 − e/10) + 2 ≤ 4 ⇔ e ≥ 5 → t = 25, wait 7 s
            no(18 * S, 2, 7 * S, 0),
            // The denied cost counts now: 1 + 4 + 1 = 6 > 4 (uncounted: 1 + 2 + 1 = 4, allowed);
            // remaining 0; cur = 4 + 1 = 5. Retry: window 2, prev 5:
            // 5·(1 − e/10) + 1 ≤ 4 ⇔ e ≥ 4 → t = 24, wait 6 s
            no(18 * S, 1, 6 * S, 0),
        ],
    );
    // State: window 1, prev 5, cur 5 → fresh from window 3, at 30 s.
    check_idle("sliding exact strict", &w, &state, 30 * S, 4);
}

// Pins G10.
#[test]
fn sliding_window_floor_strict() {
    let w = sliding_4_per_10s(Bias::Lenient, Policy::Strict);
    play(
        "sliding floor strict",
        &w,
        &[
            ok(2 * S, 2, 2), // ⌊2⌋ ≤ 4, remaining 2
            ok(5 * S, 1, 1), // 3, remaining 1
            ok(8 * S, 1, 0), // 4, remaining 0
            // 9: ⌊5⌋ > 4, counted: cur = 5; remaining 0. Retry: window 1, prev 5:
            // ⌊5·(1 − e/10) + 1⌋ ≤ 4 ⇔ 5·(1 − e/10) < 4 ⇔ e > 2 → t = 12 s + 1 ns,
            // wait 3 s + 1 ns (leaky floor: 1 s + 1 ns)
            no(9 * S, 1, 3 * S + 1, 0),
            // 12: e = 2: 5·0.8 + 0 + 1 = 5 → 5 > 4; remaining: ⌊4 + c⌋ ≤ 4 → 0; counted:
            // cur = 1. Retry: ⌊5·(1 − e/10) + 2⌋ ≤ 4 ⇔ 5·(1 − e/10) < 3 ⇔ e > 4 →
            // t = 14 s + 1 ns, wait 2 s + 1 ns
            no(12 * S, 1, 2 * S + 1, 0),
            // 14.5: e = 4.5: 5·0.55 + 1 + 1 = 4.75 → 4 ≤ 4: allowed (exact would deny);
            // remaining: ⌊4.75 + c⌋ ≤ 4 → 0
            ok(14_500 * MS, 1, 0),
            // 18: e = 8: 5·0.2 + 2 + 2 = 5 → 5 > 4; counted: cur = min(4, 5) = 4, so
            // remaining 0 (⌊1 + 4 + c⌋ ≤ 4 has no c ≥ 1; before counting it would be 1).
            // Retry: window 1 never fits again; window 2, prev 4:
            // ⌊4·(1 − e/10) + 2⌋ ≤ 4 ⇔ 4·(1 − e/10) < 3 ⇔ e > 2.5 → t = 22.5 s + 1 ns,
            // wait 4.5 s + 1 ns
            no(18 * S, 2, 4_500 * MS + 1, 0),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Sliding log, 5 per 10 s: allowed iff the cost counted in (now − 10, now] plus the request's is
// ≤ 5; an entry (t, c) leaves at t + 10. Strict merges a denied cost into the newest entry,
// which takes the denied request's time.

fn log_5_per_10s(policy: Policy) -> SlidingLog {
    SlidingLog::new(5, Duration::from_secs(10))
        .unwrap()
        .with_policy(policy)
}

// Pins G11.
#[test]
fn sliding_log_leaky() {
    let w = log_5_per_10s(Policy::Leaky);
    let state = play(
        "log leaky",
        &w,
        &[
            ok(S, 2, 3),     // log (1, 2): total 2, remaining 5 − 2 = 3
            ok(3 * S, 1, 2), // log (1, 2) (3, 1): total 3, remaining 2
            ok(4 * S, 2, 0), // log (1, 2) (3, 1) (4, 2): total 5, remaining 0
            // 6: 5 + 3 = 8 > 5, excess 3; remaining 0. The oldest entries must leave:
            // (1, 2) frees 2 < 3, (3, 1) frees 3 ≥ 3 → it leaves at 3 + 10 = 13: wait 7 s.
            no(6 * S, 3, 7 * S, 0),
            // 11: (1, 2) left (1 + 10 ≤ 11): total 3 + 1 = 4 ≤ 5; remaining 1.
            // log (3, 1) (4, 2) (11, 1)
            ok(11 * S, 1, 1),
            // 12: nothing left (3 + 10 > 12): 4 + 3 = 7 > 5, excess 2; remaining 5 − 4 = 1.
            // (3, 1) frees 1, (4, 2) frees 3 ≥ 2 → at 4 + 10 = 14: wait 2 s
            no(12 * S, 3, 2 * S, 1),
            // Leaky: the 1 left still fits: 4 + 1 = 5; remaining 0.
            // log (3, 1) (4, 2) (11, 1) (12, 1)
            ok(12 * S, 1, 0),
        ],
    );
    // The newest entry (12 s) leaves at 12 + 10 = 22 s.
    check_idle("log leaky", &w, &state, 22 * S, 5);
}

// Pins G11.
#[test]
fn sliding_log_strict() {
    let w = log_5_per_10s(Policy::Strict);
    let state = play(
        "log strict",
        &w,
        &[
            ok(S, 2, 3),     // (1, 2): total 2, remaining 3
            ok(3 * S, 1, 2), // (1, 2) (3, 1): total 3, remaining 2
            ok(4 * S, 2, 0), // (1, 2) (3, 1) (4, 2): total 5, remaining 0
            // 6: 5 + 3 > 5; remaining 0. Counted: the newest entry becomes (6, 2 + 3 = 5),
            // total 8. Retry: excess 8 + 3 − 5 = 6: (1, 2) → 2, (3, 1) → 3, (6, 5) → 8 ≥ 6
            // → at 6 + 10 = 16: wait 10 s (leaky: 7 s)
            no(6 * S, 3, 10 * S, 0),
            // 13: (1, 2) and (3, 1) left, (6, 5) remains: 5 + 1 = 6 > 5, denied (leaky would
            // have had 2 + 1 = 3 here: allowed); remaining 0. Counted: (13, 6), total 6.
            // Retry: excess 6 + 1 − 5 = 2: (13, 6) → at 23: wait 10 s
            no(13 * S, 1, 10 * S, 0),
            // 23: (13, 6) left (13 + 10 ≤ 23): total 0 + 2 = 2; remaining 3. log (23, 2)
            ok(23 * S, 2, 3),
            // 24: 2 + 4 = 6 > 5. Counted: (24, 2 + 4 = 6), total 6, so remaining 0 (before
            // counting it would be 3). Retry: excess 6 + 4 − 5 = 5: (24, 6) → at 34: 10 s
            no(24 * S, 4, 10 * S, 0),
        ],
    );
    // The newest entry (24 s) leaves at 34 s.
    check_idle("log strict", &w, &state, 34 * S, 5);
}

// ---------------------------------------------------------------------------------------------
// Sub-window counters, 3 per 10 s in 5 buckets of 2 s: bucket b covers [2b, 2b + 2). Bias
// strict sums the current bucket and the 5 before it (6 buckets, 10–12 s ≥ the window); bias
// lenient the current one and the 4 before it (5 buckets, 8–10 s ≤ the window). Bucket b
// leaves the sum when bucket b + 6 (strict) or b + 5 (lenient) starts. Strict policy adds a
// denied cost to the current bucket (every denied unit counts).

fn sub_3_per_10s(bias: Bias, policy: Policy) -> SubWindow {
    SubWindow::new(3, Duration::from_secs(10), 5)
        .unwrap()
        .with_bias(bias)
        .with_policy(policy)
}

// Pins G12.
#[test]
fn sub_window_strict_bias_leaky() {
    let w = sub_3_per_10s(Bias::Strict, Policy::Leaky);
    let state = play(
        "sub strict-bias leaky",
        &w,
        &[
            ok(1_500 * MS, 1, 2), // b0 = 1: sum 1, remaining 2
            ok(3 * S, 1, 1),      // b1 = 1: sum 2, remaining 1
            // 5 (b2): 2 + 2 = 4 > 3; remaining 3 − 2 = 1. Excess 1: b0 frees 1 → it leaves
            // when b6 starts, at 12 s: wait 7 s
            no(5 * S, 2, 7 * S, 1),
            ok(5 * S, 1, 0), // leaky: 2 + 1 = 3 ≤ 3; b2 = 1, remaining 0
            // 9 (b4): sum b0..b4 = 3, 3 + 1 > 3; remaining 0. b0 leaves at b6 = 12 s: 3 s
            no(9 * S, 1, 3 * S, 0),
            // 10.5 (b5): strict bias still sums b0..b5 = [0, 12), which includes 1.5 s: 3 + 1
            // > 3 (lenient allows this one); remaining 0. b0 leaves at 12 s: wait 1.5 s
            no(10_500 * MS, 1, 1_500 * MS, 0),
            // 12 (b6): sums b1..b6: 1 + 1 = 2, + 1 = 3 ≤ 3; remaining 0
            ok(12 * S, 1, 0),
        ],
    );
    // Newest non-empty bucket b6 leaves the sum when b12 starts: 12 · 2 = 24 s.
    check_idle("sub strict-bias leaky", &w, &state, 24 * S, 3);
}

// Pins G12.
#[test]
fn sub_window_lenient_bias_leaky() {
    let w = sub_3_per_10s(Bias::Lenient, Policy::Leaky);
    let state = play(
        "sub lenient-bias leaky",
        &w,
        &[
            ok(1_500 * MS, 1, 2), // b0 = 1: sum 1, remaining 2
            ok(3 * S, 1, 1),      // b1 = 1: sum 2, remaining 1
            // 5 (b2): 2 + 2 > 3; remaining 1. b0 leaves when b5 starts, at 10 s: wait 5 s
            no(5 * S, 2, 5 * S, 1),
            ok(5 * S, 1, 0), // 2 + 1 = 3; b2 = 1, remaining 0
            // 9 (b4): sum b0..b4 = 3, + 1 > 3; remaining 0. b0 leaves at b5 = 10 s: wait 1 s
            no(9 * S, 1, S, 0),
            // 10.5 (b5): lenient sums b1..b5 = [2, 12): 1 + 1 = 2, + 1 = 3 ≤ 3: allowed, though
            // the last 10 s, (0.5, 10.5], hold 1.5, 3, 5 and this one: 4 > 3. remaining 0
            ok(10_500 * MS, 1, 0),
            // 10.5 again: 3 + 1 > 3; remaining 0. Oldest counted b1 (1) leaves when b6
            // starts, at 12 s: wait 1.5 s
            no(10_500 * MS, 1, 1_500 * MS, 0),
        ],
    );
    // Newest non-empty bucket b5 leaves when b10 starts: 10 · 2 = 20 s.
    check_idle("sub lenient-bias leaky", &w, &state, 20 * S, 3);
}

// Pins G12.
#[test]
fn sub_window_strict_bias_strict() {
    let w = sub_3_per_10s(Bias::Strict, Policy::Strict);
    let state = play(
        "sub strict-bias strict",
        &w,
        &[
            ok(1_500 * MS, 1, 2), // b0 = 1: sum 1, remaining 2
            ok(3 * S, 1, 1),      // b1 = 1: sum 2, remaining 1
            // 5 (b2): 2 + 2 > 3. Counted: b2 = 2, total 4, so remaining 0 (before counting
            // it would be 1). Retry: excess 4 + 2 − 3 = 3: b0 → 1, b1 → 2, b2 → 4 ≥ 3 → b2
            // leaves when b8 starts, at 16 s: wait 11 s (leaky: 7 s)
            no(5 * S, 2, 11 * S, 0),
            // 5 again: 4 + 1 > 3, denied (leaky allowed it) and counted too: b2 = 3, total 5;
            // remaining 0. Retry: excess 5 + 1 − 3 = 3: b0 → 1, b1 → 2, b2 → 5 ≥ 3 → b2
            // leaves when b8 starts, at 16 s: wait 11 s
            no(5 * S, 1, 11 * S, 0),
            // 14 (b7): sums b2..b7 = 3 (the hammered bucket is still in the span), + 1 = 4 > 3:
            // denied and counted, b7 = 1, total 4. Retry: excess 2: b2 → 3 ≥ 2 → b2 leaves at
            // 16 s: wait 2 s
            no(14 * S, 1, 2 * S, 0),
            // 16 (b8): sums b3..b8 = 1, + 1 = 2 ≤ 3; remaining 1
            ok(16 * S, 1, 1),
        ],
    );
    // Newest non-empty bucket b8 leaves when b14 starts: 28 s.
    check_idle("sub strict-bias strict", &w, &state, 28 * S, 3);
}

// Pins G12.
#[test]
fn sub_window_lenient_bias_strict() {
    let w = sub_3_per_10s(Bias::Lenient, Policy::Strict);
    play(
        "sub lenient-bias strict",
        &w,
        &[
            ok(1_500 * MS, 1, 2), // b0 = 1: sum 1, remaining 2
            ok(3 * S, 1, 1),      // b1 = 1: sum 2, remaining 1
            // 5 (b2): 2 + 2 > 3. Counted: b2 = 2, total 4, remaining 0. Retry: excess 3:
            // b0 → 1, b1 → 2, b2 → 4 ≥ 3 → b2 leaves when b7 starts, at 14 s: wait 9 s
            // (leaky: 5 s)
            no(5 * S, 2, 9 * S, 0),
            // 5 again: 4 + 1 > 3, denied (leaky allowed it) and counted: b2 = 3, total 5;
            // remaining 0. Retry: excess 3: b0 → 1, b1 → 2, b2 → 5 ≥ 3 → b2 leaves when b7
            // starts, at 14 s: wait 9 s
            no(5 * S, 1, 9 * S, 0),
            // 12 (b6): sums b2..b6 = 3, + 1 = 4 > 3: denied and counted (b6 = 1, total 4).
            // Retry: excess 2: b2 → 3 ≥ 2 → b2 leaves at 14 s: wait 2 s
            no(12 * S, 1, 2 * S, 0),
            // 14 (b7): sums b3..b7 = 1, + 1 = 2 ≤ 3; remaining 1
            ok(14 * S, 1, 1),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Config errors.

// Pins G16.
#[test]
fn zero_limit_window_and_buckets_are_refused() {
    let w = Duration::from_secs(60);
    let zero_limit = |e: ConfigError| {
        matches!(
            e,
            ConfigError::Zero {
                field: Field::Limit,
                ..
            }
        )
    };
    assert!(zero_limit(FixedWindow::new(0, w).unwrap_err()));
    assert!(zero_limit(SlidingWindow::new(0, w).unwrap_err()));
    assert!(zero_limit(SlidingLog::new(0, w).unwrap_err()));
    assert!(zero_limit(SubWindow::new(0, w, 60).unwrap_err()));

    let zero_window = |e: ConfigError| {
        matches!(
            e,
            ConfigError::Zero {
                field: Field::Window,
                ..
            }
        )
    };
    assert!(zero_window(
        FixedWindow::new(3, Duration::ZERO).unwrap_err()
    ));
    assert!(zero_window(
        SlidingWindow::new(3, Duration::ZERO).unwrap_err()
    ));
    assert!(zero_window(SlidingLog::new(3, Duration::ZERO).unwrap_err()));
    assert!(zero_window(
        SubWindow::new(3, Duration::ZERO, 60).unwrap_err()
    ));

    let err = SubWindow::new(3, w, 0).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Zero {
                field: Field::Buckets,
                ..
            }
        ),
        "{err:?}"
    );
    // More buckets than a key's counters should hold (16 GiB of them at u32::MAX, allocated
    // at its first request): refused at build.
    for buckets in [4097, u32::MAX] {
        let err = SubWindow::new(3, Duration::from_secs(3600), buckets).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::TooLarge {
                    field: Field::Buckets,
                    max: "4096",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    assert!(SubWindow::new(3, Duration::from_secs(3600), 4096).is_ok());
    // 11 buckets in a 10 ns window: a bucket would be 0 ns.
    let err = SubWindow::new(3, Duration::from_nanos(10), 11).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::TooLarge {
                field: Field::Buckets,
                ..
            }
        ),
        "{err:?}"
    );
}

// Pins G16.
#[test]
fn limits_beyond_the_state_packing_are_too_large() {
    let too_large_limit = |e: ConfigError| {
        matches!(
            e,
            ConfigError::TooLarge {
                field: Field::Limit,
                ..
            }
        )
    };
    // Fixed window, 1 ms = 10⁶ ns: the largest index is ⌊(2⁶⁴ − 1) / 10⁶⌋ ≈ 1.84·10¹³.
    // Limit 10⁶: counts up to 10⁶ + 1 need 20 bits, leaving 44 for the index, and
    // 2⁴⁴ − 1 ≈ 1.76·10¹³ < 1.84·10¹³: refused.
    let ms = Duration::from_millis(1);
    assert!(too_large_limit(
        FixedWindow::new(1_000_000, ms).unwrap_err()
    ));
    // The boundary: 524_286 + 1 = 2¹⁹ − 1 fits 19 bits, leaving 45 (2⁴⁵ − 1 ≈ 3.5·10¹³):
    // accepted; 524_287 + 1 = 2¹⁹ needs 20 bits: refused.
    assert!(FixedWindow::new(524_286, ms).is_ok());
    assert!(too_large_limit(FixedWindow::new(524_287, ms).unwrap_err()));

    // 32-bit counts: limits up to 2³² − 3.
    let s = Duration::from_secs(1);
    let max = (1u64 << 32) - 3;
    assert!(SlidingWindow::new(max, s).is_ok());
    assert!(too_large_limit(SlidingWindow::new(max + 1, s).unwrap_err()));
    assert!(SubWindow::new(max, s, 60).is_ok());
    assert!(too_large_limit(SubWindow::new(max + 1, s, 60).unwrap_err()));
}
