//! Partial grants (`check_up_to`): on every algorithm (both policies) and every in-memory store,
//! a trace of grants over several keys decides exactly as a sequential model that tries every
//! count from the most down (no bisection); threads sharing one key are granted exactly the
//! burst between them; `n == 0` is an error and `n` above the capacity is capped.

mod common;

use hotlimit::algo::{Algorithm, Earrrl, Gcra};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{
    CasLimiter, Clock, CompactLimiter, Decision, DirectLimiter, ManualClock, MutexLimiter, Policy,
    QuotaError,
};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The model: the largest count in `1..=min(n, capacity)` the state admits, tried from the
/// top one by one; none: the decision of one unit.
fn model<A: Algorithm>(algo: &A, state: &mut A::State, now: u64, n: u64) -> (u64, Decision) {
    for c in (1..=n.min(algo.capacity())).rev() {
        if algo.peek(state, now, c).is_allowed() {
            return (c, algo.update(state, now, c));
        }
    }
    (0, algo.update(state, now, 1))
}

/// One step of a trace: advance the clock by `gap` ns, then ask key `key` for up to `n`.
type Trace = Vec<(u64, u64, u64)>;

/// Runs `trace` through every store of `algo` and the model; every answer must be equal.
fn same_as_model<A>(name: &str, algo: A, trace: &Trace) -> Result<(), TestCaseError>
where
    A: Algorithm + Clone,
{
    let clock = ManualClock::default();
    // Every store, through the one trait; the single cell sees key 0's requests only.
    let stores = common::stores(&algo, &clock);
    let mut states: HashMap<u64, A::State> = HashMap::new();
    for (i, &(gap, key, n)) in trace.iter().enumerate() {
        clock.advance(Duration::from_nanos(gap));
        let state = states.entry(key).or_insert_with(|| algo.fresh());
        let want = model(&algo, state, clock.now(), n);
        for (store, s, keyed) in &stores {
            if *keyed || key == 0 {
                let got = s.request(&key).cost(n).up_to().unwrap();
                prop_assert_eq!(got, want, "{} {} step {}", name, store, i);
            }
        }
    }
    Ok(())
}

fn trace() -> impl Strategy<Value = Trace> {
    // Gaps from none to a few windows, so that some grants are full, some partial, some 0.
    let gap = common::gap();
    prop::collection::vec((gap, 0u64..3, 1u64..=40), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    // Pins G30.
    #[test]
    fn every_algorithm_and_store_grants_as_the_model(trace in trace(), policy in common::policy()) {
        common::on_every_algorithm(policy, &mut Model(&trace))?;
    }
}

/// Threads asking one key for up to 3 units at one instant are granted exactly the burst
/// between them: no unit lost to a race, none granted twice.
// Pins G1, G30.
#[test]
fn threads_share_one_burst_exactly() {
    let gcra: Gcra = "10/s burst 100".parse().unwrap();
    let clock = ManualClock::default();
    let cas = Arc::new(CasLimiter::<u64, Gcra, _>::with_clock(gcra, clock.clone()));
    let mutex = Arc::new(MutexLimiter::<u64, Gcra, _>::with_clock(
        gcra,
        clock.clone(),
    ));
    let compact = Arc::new(CompactLimiter::<u64, Gcra, _>::with_clock(
        gcra,
        clock.clone(),
    ));
    let direct = Arc::new(DirectLimiter::<Gcra, _>::with_clock(gcra, clock.clone()));
    type Grant = Arc<dyn Fn() -> u64 + Send + Sync>;
    let stores: [(&str, Grant); 4] = [
        (
            "cas",
            Arc::new(move || cas.request(&7).cost(3).up_to().unwrap().0),
        ),
        (
            "mutex",
            Arc::new(move || mutex.request(&7).cost(3).up_to().unwrap().0),
        ),
        (
            "compact",
            Arc::new(move || compact.request(&7).cost(3).up_to().unwrap().0),
        ),
        (
            "direct",
            Arc::new(move || direct.request(&()).cost(3).up_to().unwrap().0),
        ),
    ];
    for (name, grant) in stores {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let grant = grant.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    loop {
                        let g = grant();
                        got.push(g);
                        if g == 0 {
                            return got;
                        }
                    }
                })
            })
            .collect();
        let grants: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        assert_eq!(grants.iter().sum::<u64>(), 100, "{name}");
        assert!(grants.iter().all(|&g| g <= 3), "{name}");
        // Once a thread saw 0, the burst was gone: every thread ends on exactly one 0.
        assert_eq!(grants.iter().filter(|&&g| g == 0).count(), 4, "{name}");
    }
}

// Pins G17, G30.
#[test]
fn zero_is_an_error_and_more_than_the_capacity_is_capped() {
    let clock = ManualClock::default();
    let l = CasLimiter::<u64, Gcra, _>::with_clock("1/s burst 5".parse().unwrap(), clock.clone());
    assert_eq!(l.request(&1).cost(0).up_to(), Err(QuotaError::ZeroCost));
    assert_eq!(l.metrics().keys, 0, "an error inserts nothing");
    let (granted, decision) = l.request(&1).cost(u64::MAX).up_to().unwrap();
    assert_eq!((granted, decision.remaining()), (5, Some(0)));
    let (granted, decision) = l.request(&1).cost(u64::MAX).up_to().unwrap();
    assert_eq!(granted, 0);
    assert_eq!(decision.retry_after(), Duration::from_secs(1));
    clock.advance(Duration::from_secs(2));
    assert_eq!(l.request(&1).cost(10).up_to().unwrap().0, 2);
}

/// EARRRL admits a request while the rate before it is at most `R`, so its capacity is the
/// cost that takes a fresh key to `R` (`⌊R/λ⌋`: 14 at 10/s with a 1 s half-life): a grant
/// of `u64::MAX` units is 14, and a cost above 14 is an error, not an admission.
// Pins G7.
#[test]
fn earrrl_grants_at_most_the_cost_that_takes_a_fresh_key_to_its_rate() {
    let earrrl = Earrrl::new(Duration::from_secs(1), "10/s".parse().unwrap()).unwrap();
    let want = (10.0 / std::f64::consts::LN_2).floor() as u64;
    assert_eq!((earrrl.capacity(), want), (14, 14));
    let l = CasLimiter::<u64, Earrrl, _>::with_clock(earrrl, ManualClock::default());
    let (granted, decision) = l.request(&1).cost(u64::MAX).up_to().unwrap();
    assert!(decision.is_allowed());
    assert_eq!(granted, 14);
    assert!(decision.rate().unwrap() <= 10.0);
    assert_eq!(
        l.check_n(&2, 15),
        Err(QuotaError::ExceedsCapacity {
            cost: 15,
            capacity: 14
        })
    );
    assert_eq!(l.metrics().keys, 1, "an error inserts nothing");
}

/// Under the strict policy a grant of nothing counts as a denied unit, as `check` does; under
/// the leaky policy it changes nothing.
// Pins G30.
#[test]
fn a_grant_of_nothing_counts_as_one_denied_unit() {
    for policy in [Policy::Leaky, Policy::Strict] {
        let algo = "10/s burst 2".parse::<Gcra>().unwrap().with_policy(policy);
        let clock = ManualClock::default();
        let grants = CasLimiter::<u64, Gcra, _>::with_clock(algo, clock.clone());
        let checks = CasLimiter::<u64, Gcra, _>::with_clock(algo, clock.clone());
        assert_eq!(grants.request(&1).cost(2).up_to().unwrap().0, 2);
        assert!(checks.check_n(&1, 2).unwrap().is_allowed());
        for _ in 0..3 {
            let (granted, denied) = grants.request(&1).cost(2).up_to().unwrap();
            assert_eq!((granted, denied), (0, checks.check(&1)), "{policy}");
        }
        clock.advance(Duration::from_millis(100));
        assert_eq!(
            grants.request(&1).cost(2).up_to().unwrap().1,
            checks.check(&1),
            "{policy}"
        );
    }
}

/// [`same_as_model`] for [`common::on_every_algorithm`].
struct Model<'a>(&'a Trace);

impl common::OnAlgorithm for Model<'_> {
    type Error = TestCaseError;

    fn run<A>(&mut self, name: &str, algo: A) -> Result<(), TestCaseError>
    where
        A: Algorithm + Clone,
    {
        same_as_model(name, algo, self.0)
    }
}
