//! The pure state machines (DESIGN §1-3): one GCRA, one EARRRL and one exponential
//! configuration, each stepped through the same trace of `(time delta, cost)` requests from a
//! fresh state with non-decreasing `now`.
//!
//! Asserts, through `Algorithm::update` (the checks shared by every algorithm are in
//! `hotlimit_fuzz::drive`):
//! * no panic (also for costs 0 and above the capacity, which are stepped and discarded), and
//!   the new state is never the all-ones eviction tombstone;
//! * `rate()` is present (EARRRL, exponential), finite and >= 0;
//! * allowed: `retry_after` is 0; denied: `retry_after` > 0, and (honest retry) stepping the
//!   state left by the denial at `now + retry_after` with the same cost is allowed, unless
//!   that sum reaches u64::MAX (a wait that saturates the clock) (leaky and strict);
//! * lossless eviction (DESIGN §5): once `now >= idle_at(state)` (`idle_at` of u64::MAX taken as
//!   never), the request gets the same decision and the same new state from `state` as from a
//!   fresh state;
//! * GCRA: `remaining` <= burst, and the allowed cost never exceeds
//!   `burst + floor(elapsed / T)` (elapsed = last now - first now), everywhere: traces start
//!   at 0, anywhere, or just before `CLOCK_MAX`, and rates reach one per century and beyond
//!   (`Span::Days`);
//! * EARRRL: with no request, the rate a state shows never increases as time goes on.
//!
//! Pins G4, G6, G7, G8, G14, G18, G23 (docs/GUARANTEES.md).
#![no_main]

use arbitrary::Arbitrary;
use hotlimit::algo::{Algorithm, Earrrl};
use hotlimit_fuzz::{
    drive, earrrl_unit, exponential_unit, gcra_unit, EarrrlCfg, ExpCfg, GcraCfg, RateKind, Req,
    Start, Timeline,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    gcra: GcraCfg,
    earrrl: EarrrlCfg,
    exponential: ExpCfg,
    start: Start,
    trace: Vec<Req>,
}

fuzz_target!(|input: Input| {
    if let Some(g) = input.gcra.build() {
        let t = g.emission_interval().as_nanos();
        let burst = hotlimit::algo::Algorithm::capacity(&g);
        let mut first: Option<u64> = None;
        let mut last = 0u64;
        let mut allowed: u128 = 0;
        drive(
            &g,
            Timeline {
                unit_ns: gcra_unit(&g),
                start: input.start,
                trace: &input.trace,
            },
            RateKind::Any,
            |&w| w == u64::MAX,
            |_, _, _| {},
            |_, now, cost, d| {
                if let Some(r) = d.remaining() {
                    assert!(r <= burst, "remaining {r} > burst {burst}: {d:?}");
                }
                first.get_or_insert(now);
                last = now;
                if d.is_allowed() {
                    allowed += u128::from(cost);
                }
            },
        );
        // Everywhere: near the end of the clock, at the slowest rates, with a strict key's
        // debt saturated. (This bound once exempted traces whose tat saturated, which hid a
        // GCRA that admitted everything there.)
        if let Some(first) = first {
            let bound = u128::from(burst) + u128::from(last - first) / t;
            assert!(
                allowed <= bound,
                "GCRA allowed {allowed} > burst {burst} + elapsed {} / T {t}",
                last - first
            );
        }
    }

    if let Some(e) = input.earrrl.build() {
        drive(
            &e,
            Timeline {
                unit_ns: earrrl_unit(&e),
                start: input.start,
                trace: &input.trace,
            },
            RateKind::Always,
            |&w| w == u64::MAX,
            |&s, t1, t2| check_decay(&e, s, t1, t2),
            |_, _, _, _| {},
        );
    }

    if let Some(x) = input.exponential.build() {
        drive(
            &x,
            Timeline {
                unit_ns: exponential_unit(&x),
                start: input.start,
                trace: &input.trace,
            },
            RateKind::Always,
            |&w| w == u128::MAX,
            |_, _, _| {},
            |_, _, _, _| {},
        );
    }
});

/// With no request between `t1 <= t2`, the rate of state `s` does not increase (also checked
/// up to the end of time).
fn check_decay(e: &Earrrl, s: u64, t1: u64, t2: u64) {
    let rate = |t| e.peek(&s, t, 1).rate().unwrap();
    let (r1, r2, r_end) = (rate(t1), rate(t2), rate(u64::MAX));
    assert!(
        r1 >= r2 && r2 >= r_end,
        "EARRRL rate of state {s:#x} ({}) rose while idle: {r1} at {t1} ns, {r2} at {t2} ns, \
         {r_end} at u64::MAX",
        f64::from_bits(s)
    );
}
