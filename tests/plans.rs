//! Per-request quotas (`check_n_with`, `take_with`, `settle_with`): one limiter serving
//! several plans decides every request on every in-memory store exactly as a sequential model
//! running each request's own quota on the key's one state; the limiter's own quota passed
//! with the request decides as `check_n`; a key that changes plan keeps what it spent; a
//! quota that cannot read the state, or a cost beyond the quota, is a typed error that
//! counts nothing.

mod common;

use hotlimit::algo::{
    Algorithm, Bias, Earrrl, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::QuotaError;
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{
    CasLimiter, Clock, CompactLimiter, ConfigError, DirectLimiter, Field, Live, ManualClock, Rate,
};
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

/// One step: advance `gap` ns, then key `key` asks for `cost` under plan `plan` (an index
/// into the plans; taken modulo their number).
type Trace = Vec<(u64, u64, usize, u64)>;

/// Runs `trace` through every store built on `plans[0]` (the limiter's own quota), each
/// request under its plan, and through the model; all answers must be equal.
fn same_as_model<A>(name: &str, plans: &[A], trace: &Trace) -> Result<(), TestCaseError>
where
    A: Algorithm + Copy,
{
    let own = plans[0];
    let clock = ManualClock::default();
    // Every store, through the one trait; the single cell sees key 0's requests only.
    let stores = common::stores(&own, &clock);
    let mut states: HashMap<u64, A::State> = HashMap::new();
    for (i, &(gap, key, plan, cost)) in trace.iter().enumerate() {
        clock.advance(Duration::from_nanos(gap));
        let quota = &plans[plan % plans.len()];
        let cost = cost.min(quota.capacity());
        let state = states.entry(key).or_insert_with(|| own.fresh());
        let want = quota.update(state, clock.now(), cost);
        for (store, s, keyed) in &stores {
            if *keyed || key == 0 {
                let got = s.request(&key).cost(cost).quota(quota).check();
                prop_assert_eq!(got, Ok(want), "{} {} step {}", name, store, i);
            }
        }
    }
    Ok(())
}

fn trace() -> impl Strategy<Value = Trace> {
    let gap = common::gap();
    prop::collection::vec((gap, 0u64..3, 0usize..3, 1u64..=12), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    // Pins G31.
    #[test]
    fn every_store_decides_each_plan_as_the_model(trace in trace(), policy in common::policy()) {
        let second = Duration::from_secs(1);
        let gcra = |q: &str| q.parse::<Gcra>().unwrap().with_policy(policy);
        same_as_model("gcra", &[gcra("100/s burst 20"), gcra("10/s burst 5"), gcra("1000/s burst 12")], &trace)?;
        let fixed = |l| FixedWindow::new(l, second).unwrap().with_policy(policy);
        same_as_model("fixed-window", &[fixed(20), fixed(5), fixed(200)], &trace)?;
        let sliding = |l| SlidingWindow::new(l, second).unwrap().with_policy(policy);
        same_as_model("sliding-window", &[sliding(20), sliding(5), sliding(200)], &trace)?;
        let log = |l| SlidingLog::new(l, second).unwrap().with_policy(policy);
        same_as_model("sliding-log", &[log(20), log(5), log(200)], &trace)?;
        let sub = |l| SubWindow::new(l, second, 10).unwrap().with_bias(Bias::Lenient).with_policy(policy);
        same_as_model("sub-window", &[sub(20), sub(5), sub(200)], &trace)?;
        let earrrl = |r| Earrrl::new(second, Rate::new(r, Duration::from_secs(1)).unwrap()).unwrap().with_policy(policy);
        same_as_model("earrrl", &[earrrl(30.0), earrrl(3.0), earrrl(300.0)], &trace)?;
    }

    /// The limiter's own quota given with the request decides exactly as `check_n`.
    // Pins G31.
    #[test]
    fn the_own_quota_with_the_request_is_check_n(trace in trace(), policy in common::policy()) {
        let own = "100/s burst 20".parse::<Gcra>().unwrap().with_policy(policy);
        let clock = ManualClock::default();
        let a = CasLimiter::<u64, Gcra, _>::with_clock(own, clock.clone());
        let b = CasLimiter::<u64, Gcra, _>::with_clock(own, clock.clone());
        for &(gap, key, _, cost) in &trace {
            clock.advance(Duration::from_nanos(gap));
            prop_assert_eq!(a.request(&key).cost(cost).quota(&own).check(), Ok(b.check_n(&key, cost).unwrap()));
            prop_assert_eq!(a.request(&key).quota(&own).check(), Ok(b.check(&key)));
        }
    }
}

/// A key that spent its pro burst and moves to the free plan waits until its spending fits
/// the free burst, to the nanosecond; moved back, it gains the pro burst at once.
// Pins G31.
#[test]
fn a_key_changing_plan_keeps_what_it_spent() {
    let free: Gcra = "10/s burst 10".parse().unwrap();
    let pro: Gcra = "10/s burst 100".parse().unwrap();
    let clock = ManualClock::default();
    let l = CasLimiter::<String, Gcra, _>::with_clock(free, clock.clone());
    assert!(l
        .request("k")
        .cost(100)
        .quota(&pro)
        .check()
        .unwrap()
        .is_allowed()); // tat = 10 s
    let d = l.request("k").quota(&free).check().unwrap();
    // tat + T − now ≤ 10·T once now ≥ 9.1 s.
    assert_eq!(d.retry_after(), Duration::from_millis(9_100));
    clock.advance(Duration::from_millis(9_100) - Duration::from_nanos(1));
    assert!(l.request("k").quota(&free).check().unwrap().is_denied());
    assert_eq!(
        l.request("k")
            .cost(80)
            .quota(&pro)
            .check()
            .unwrap()
            .remaining(),
        Some(10)
    );
}

/// Settling under a plan refunds in that plan's emission interval.
// Pins G31.
#[test]
fn take_and_settle_under_a_plan() {
    let free: Gcra = "10/s burst 10".parse().unwrap();
    let pro: Gcra = "100/s burst 100".parse().unwrap();
    let l = CasLimiter::<String, Gcra, _>::with_clock(free, ManualClock::default());
    let mut t = l.request("k").cost(100).quota(&pro).take().unwrap();
    assert!(t.decision().is_allowed());
    assert_eq!(l.request("k").quota(&pro).settle(&mut t, 40), Ok(true));
    assert_eq!(
        l.request("k").quota(&pro).check().unwrap().remaining(),
        Some(59)
    );
    assert_eq!(l.request("k").quota(&pro).settle(&mut t, 40), Ok(false));
    let compact = CompactLimiter::<u64, Gcra, _>::with_clock(free, ManualClock::default());
    let mut t = compact.request(&1).cost(100).quota(&pro).take().unwrap();
    assert_eq!(compact.request(&1).quota(&pro).settle(&mut t, 40), Ok(true));
    assert_eq!(
        compact.request(&1).quota(&pro).check().unwrap().remaining(),
        Some(59)
    );
    let direct = DirectLimiter::<Gcra, _>::with_clock(free, ManualClock::default());
    let mut t = direct.request(&()).cost(100).quota(&pro).take().unwrap();
    assert_eq!(direct.request(&()).quota(&pro).settle(&mut t, 40), Ok(true));
    assert_eq!(
        direct.request(&()).quota(&pro).check().unwrap().remaining(),
        Some(59)
    );
}

/// Pacing under a plan: `reserve` paces by the request's quota, not the limiter's own (it
/// paced a free client at the pro rate), and refuses a cost beyond that quota's burst.
// Pins G31.
#[test]
fn reserve_paces_by_the_requests_quota() {
    use hotlimit::algo::Reservation;
    let pro: Gcra = "1000/s burst 1000".parse().unwrap();
    let free: Gcra = "1/s burst 1".parse().unwrap();
    let l = CasLimiter::<u64, Gcra, _>::with_clock(pro, ManualClock::default());
    let wait = Duration::from_secs(2);
    let admitted = |delay| Ok(Reservation::Admitted { delay });
    assert_eq!(
        l.request(&7).quota(&free).reserve(wait),
        admitted(Duration::ZERO)
    );
    assert_eq!(
        l.request(&7).quota(&free).reserve(wait),
        admitted(Duration::from_secs(1))
    );
    assert!(matches!(
        l.request(&7).quota(&free).reserve(Duration::ZERO),
        Ok(Reservation::Denied { .. })
    ));
    assert!(matches!(
        l.request(&8).quota(&free).cost(2).reserve(wait),
        Err(QuotaError::ExceedsCapacity {
            cost: 2,
            capacity: 1
        })
    ));
    // Its own quota, as before: 1 ms a unit.
    assert_eq!(
        l.request(&9).cost(1000).reserve(wait),
        admitted(Duration::ZERO)
    );
    assert_eq!(
        l.request(&9).reserve(wait),
        admitted(Duration::from_millis(1))
    );
}

/// A quota that cannot read the state and a cost beyond the quota are typed errors; nothing
/// is counted or inserted.
// Pins G17, G31.
#[test]
fn incompatible_quotas_and_costs_are_errors() {
    let minute = Duration::from_secs(60);
    let l = CasLimiter::<String, _>::new(FixedWindow::new(20, minute).unwrap());
    let hour = FixedWindow::new(20, Duration::from_secs(3600)).unwrap();
    let err = l.request("k").quota(&hour).check().unwrap_err();
    assert!(
        matches!(
            &err,
            QuotaError::Quota(e) if matches!(**e, ConfigError::Unchangeable {
                field: Field::Window,
                ..
            })
        ),
        "{err}"
    );
    // Every limit of one window reads the same states.
    let wide = FixedWindow::new(1_000_000, minute).unwrap();
    assert_eq!(
        l.request("k")
            .cost(30)
            .quota(&wide)
            .check()
            .unwrap()
            .remaining(),
        Some(999_970)
    );
    assert!(
        l.check("k").is_denied(),
        "30 counted, over the own limit of 20"
    );
    let small = FixedWindow::new(10, minute).unwrap();
    assert_eq!(
        l.request("k").cost(11).quota(&small).check(),
        Err(QuotaError::ExceedsCapacity {
            cost: 11,
            capacity: 10
        })
    );
    assert_eq!(
        l.request("k").cost(0).quota(&small).check(),
        Err(QuotaError::ZeroCost)
    );
    assert!(l.request("k").quota(&hour).take().is_err());
    assert_eq!(
        l.metrics().keys,
        1,
        "only the request that was decided inserted its key"
    );
    let fresh = CasLimiter::<String, _>::new(FixedWindow::new(20, minute).unwrap());
    assert!(
        fresh.request("k").quota(&hour).check().is_err()
            && fresh.request("k").quota(&hour).take().is_err()
    );
    assert!(fresh.request("k").cost(0).quota(&small).check().is_err());
    assert_eq!(fresh.metrics().keys, 0, "an error inserts nothing");
    let sub = CasLimiter::<String, _>::new(SubWindow::new(20, minute, 6).unwrap());
    let other_buckets = SubWindow::new(20, minute, 12).unwrap();
    assert!(matches!(
        sub.request("k").quota(&other_buckets).check(),
        Err(QuotaError::Quota(_))
    ));
    let earrrl = CasLimiter::<String, _>::new(
        Earrrl::new(minute, Rate::new(1.0, Duration::from_secs(1)).unwrap()).unwrap(),
    );
    let other_half_life = Earrrl::new(
        Duration::from_secs(1),
        Rate::new(1.0, Duration::from_secs(1)).unwrap(),
    )
    .unwrap();
    assert!(matches!(
        earrrl.request("k").quota(&other_half_life).check(),
        Err(QuotaError::Quota(_))
    ));
}

/// The windows are reconfigurable now: a live limit change keeps the counts.
// Pins G33.
#[test]
fn a_live_window_changes_its_limit_and_keeps_its_counts() {
    let minute = Duration::from_secs(60);
    let l = CasLimiter::<String, _, _>::with_clock(
        Live::new(SlidingLog::new(10, minute).unwrap()),
        ManualClock::default(),
    );
    assert!(l.check_n("k", 8).unwrap().is_allowed());
    l.reconfigure(SlidingLog::new(5, minute).unwrap()).unwrap();
    assert!(l.check("k").is_denied(), "8 counted, the limit is 5 now");
    assert!(l
        .reconfigure(SlidingLog::new(5, Duration::from_secs(1)).unwrap())
        .is_err());
}
