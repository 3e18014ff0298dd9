//! The vectors of DESIGN §3.1–3.3, reproduced exactly.

#[path = "common/earrrl_pair.rs"]
mod earrrl_pair;
#[path = "common/step.rs"]
mod step;

use earrrl_pair::{EarrrlPair, PairDecision};
use hotlimit::algo::{Algorithm, Earrrl, Exponential, Gcra};
use hotlimit::{Decision, Policy, Rate};
use std::time::Duration;
use step::WordStep;

const MS: u64 = 1_000_000;

/// Runs `(now, cost)` requests through `algo` from a fresh key, returning each decision.
fn run<A: Algorithm>(algo: &A, requests: &[(u64, u64)]) -> Vec<Decision> {
    let mut state = algo.fresh();
    requests
        .iter()
        .map(|&(now, cost)| algo.update(&mut state, now, cost))
        .collect()
}

/// (allowed, remaining, retry_after ns) of each decision.
fn summary(ds: &[Decision]) -> Vec<(bool, Option<u64>, u64)> {
    ds.iter()
        .map(|d| {
            (
                d.is_allowed(),
                d.remaining(),
                d.retry_after().as_nanos() as u64,
            )
        })
        .collect()
}

// Pins G6.
#[test]
fn gcra_spec_vector_leaky() {
    // 10/s, burst 5: T = 100 ms, B·T = 500 ms.
    let g: Gcra = "10/s burst 5".parse().unwrap();
    let reqs = [
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 1),
        (100 * MS, 1),
        (100 * MS, 1),
        (350 * MS, 1),
        (350 * MS, 1),
        (350 * MS, 1),
    ];
    let expected = vec![
        (true, Some(4), 0),
        (true, Some(3), 0),
        (true, Some(2), 0),
        (true, Some(1), 0),
        (true, Some(0), 0),
        // tat' = 600 ms: retry = 600 − 500 − 0.
        (false, Some(0), 100 * MS),
        (true, Some(0), 0),
        // tat = 600 ms, tat' = 700 ms: retry = 700 − 500 − 100.
        (false, Some(0), 100 * MS),
        // tat = 600 → 700 ms: 700 − 350 = 350 ≤ 500, remaining ⌊150/100⌋ = 1.
        (true, Some(1), 0),
        (true, Some(0), 0),
        // tat' = 900 ms: retry = 900 − 500 − 350 = 50 ms.
        (false, Some(0), 50 * MS),
    ];
    assert_eq!(summary(&run(&g, &reqs)), expected);
}

// Pins G14.
#[test]
fn gcra_strict_retry_counts_the_denied_request() {
    let g = "10/s burst 5"
        .parse::<Gcra>()
        .unwrap()
        .with_policy(Policy::Strict);
    let ds = run(&g, &[(0, 1); 7]);
    // 6th: tat' = 600 ms stored; honest wait = 600 + 100 − 500 = 200 ms.
    assert_eq!(ds[5].retry_after(), Duration::from_millis(200));
    // 7th: tat = 600, tat' = 700 stored; wait = 700 + 100 − 500 = 300 ms.
    assert_eq!(ds[6].retry_after(), Duration::from_millis(300));
    let mut state = 0;
    for &(now, cost) in &[(0, 1); 7] {
        state = g.step(state, now, cost).state.unwrap_or(state);
    }
    assert_eq!(state, 700 * MS);
    // A retry after exactly 300 ms is allowed, 1 ns earlier is not.
    assert!(g.step(state, 300 * MS, 1).decision.is_allowed());
    assert!(!g.step(state, 300 * MS - 1, 1).decision.is_allowed());
}

/// Relative difference.
fn rel(a: f64, b: f64) -> f64 {
    ((a - b) / b).abs()
}

// Pins G7.
#[test]
fn earrrl_spec_vector() {
    // h = 2 s, R = 3/s, one request every 0.25 s from t = 0; default policy strict.
    let e = Earrrl::new(
        Duration::from_secs(2),
        Rate::new(3.0, Duration::from_secs(1)).unwrap(),
    )
    .unwrap();
    assert_eq!(e.policy(), Policy::Strict);
    let reqs: Vec<(u64, u64)> = (0..40).map(|k| (k * 250 * MS, 1)).collect();
    let ds = run(&e, &reqs);
    assert_eq!(ds[0].rate(), Some(0.0));
    for (k, want) in [
        (1, 0.317809383554),
        (2, 0.609241873242),
        (3, 0.876486644607),
        (8, 1.914607625636),
        (18, 3.024221906765),
    ] {
        let got = ds[k].rate().unwrap();
        assert!(
            rel(got, want) < 1e-11,
            "request {k}: rate {got}, want {want}"
        );
    }
    let first_denied = ds.iter().position(|d| d.is_denied());
    assert_eq!(first_denied, Some(18));
    // The same vector through the two-field form.
    let mut pair = EarrrlPair::FRESH;
    let locked: Vec<PairDecision> = reqs
        .iter()
        .map(|&(now, cost)| pair.step(&e, Duration::from_secs(2), now, cost))
        .collect();
    for (a, b) in ds.iter().zip(&locked) {
        assert_eq!(a.is_allowed(), b.allowed);
        assert!(rel(a.rate().unwrap(), b.rate) < 1e-9 || a.rate() == Some(0.0));
    }
}

// Pins G14.
#[test]
fn earrrl_retry_after_is_honest_and_tight() {
    for policy in [Policy::Leaky, Policy::Strict] {
        let e = Earrrl::new(
            Duration::from_secs(2),
            Rate::new(3.0, Duration::from_secs(1)).unwrap(),
        )
        .unwrap()
        .with_policy(policy);
        let mut s = e.fresh();
        let mut now = 0;
        // Hammer 10/s until denied.
        let denied = loop {
            let step = e.step(s, now, 1);
            s = step.state.unwrap_or(s);
            if step.decision.is_denied() {
                break step.decision;
            }
            now += 100 * MS;
        };
        let w = denied.retry_after().as_nanos() as u64;
        assert!(w > 0);
        assert!(e.step(s, now + w, 1).decision.is_allowed(), "{policy}");
        assert!(e.step(s, now + w - 1, 1).decision.is_denied(), "{policy}");
    }
}

// Pins G8.
#[test]
fn exponential_burst_at_one_instant() {
    for (limit, cost, want) in [(10.0, 1, 10), (10.0, 3, 3), (10.0, 10, 1), (7.5, 2, 3)] {
        let e = Exponential::new(limit, Duration::from_secs(60)).unwrap();
        let ds = run(&e, &vec![(5 * MS, cost); 40]);
        let allowed = ds.iter().filter(|d| d.is_allowed()).count();
        assert_eq!(allowed, want, "limit {limit} cost {cost}");
        assert!(ds[..want].iter().all(|d| d.is_allowed()));
    }
}

// Pins G14.
#[test]
fn exponential_retry_after_is_honest_and_beats_exims_estimate() {
    for policy in [Policy::Leaky, Policy::Strict] {
        let e = Exponential::new(10.0, Duration::from_secs(60))
            .unwrap()
            .with_policy(policy);
        let mut s = e.fresh();
        let mut now = 0;
        let denied = loop {
            let step = e.step(s, now, 1);
            s = step.state.unwrap_or(s);
            if step.decision.is_denied() {
                break step.decision;
            }
            now += 500 * MS;
        };
        let w = denied.retry_after().as_nanos() as u64;
        assert!(e.step(s, now + w, 1).decision.is_allowed(), "{policy}");
        assert!(e.step(s, now + w - 1, 1).decision.is_denied(), "{policy}");
        // Exim's closed form P·ln(r_now / L) is early: a retry then is denied.
        let r_now = denied.rate().unwrap() * 60.0;
        let exim = (60e9 * (r_now / 10.0).ln()) as u64;
        if policy == Policy::Leaky {
            assert!(exim < w);
            assert!(e.step(s, now + exim, 1).decision.is_denied());
        }
    }
}
