//! No plan or switch gives budget back (#46): a key spends under a quota A, then is denied,
//! overruns and settles under a smaller quota B (a plan passed with the request, or a live
//! switch to B and back); read under A again, it is never more lenient than a twin that saw
//! only the A-phase. Before the fix a fixed window's count was *lowered* by a strict denial or
//! an overrun under a smaller limit (`min(count + cost, limit + 1)`): a limit-20 key with 8
//! spent got 15 remaining back from one strict denial under a limit-3 plan; and a live GCRA
//! switch clamped a debt to the smaller quota's burst, handing the rest back on the switch back.
//!
//! Every reconfigurable algorithm in both policies, on every in-memory store; "never more
//! lenient" is read with peeks under A at once and at later instants, every cost up to 8: a
//! cost the twin denies is denied; at once, `remaining` no higher and the measured rate no
//! lower.

use hotlimit::algo::{
    Algorithm, AllOf, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::store::{Cas, Locked};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{
    CasLimiter, CompactLimiter, ConfigError, Decision, Live, ManualClock, MutexLimiter, Policy,
    Rate,
};
use hotlimit::{QuotaError, Ticket};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::time::Duration;

/// What the test reads of a key: peeks (key 0).
trait Peek {
    fn peek_n(&self, cost: u64) -> Decision;
}

/// A store on quota A serving plans: the B-phase as quotas passed with each request.
trait PlanStore<A: Algorithm + Copy>: Peek {
    fn check_n_with(&self, cost: u64, quota: &A) -> Result<Decision, QuotaError>;
    fn take_with(&self, cost: u64, quota: &A) -> Result<Ticket, QuotaError>;
    fn settle_with(&self, t: &mut Ticket, actual: u64, quota: &A);
}

/// A store on `Live<A>`: the B-phase under a live switch to B.
trait LiveStore<A: Algorithm + Copy>: Peek {
    fn check_n(&self, cost: u64) -> Result<Decision, QuotaError>;
    fn take(&self, cost: u64) -> Result<Ticket, QuotaError>;
    fn settle(&self, t: &mut Ticket, actual: u64);
    fn reconfigure(&self, new: A) -> Result<A, ConfigError>;
}

macro_rules! stores {
    ($($ty:ident $(, $v:ty)?);*) => {$(
        impl<A: Algorithm> Peek for $ty<u64, A, ManualClock $(, $v)?> {
            fn peek_n(&self, cost: u64) -> Decision {
                self.request(&0).cost(cost).peek().unwrap()
            }
        }
        impl<A: Algorithm + Copy> PlanStore<A> for $ty<u64, A, ManualClock $(, $v)?> {
            fn check_n_with(&self, cost: u64, quota: &A) -> Result<Decision, QuotaError> {
                self.request(&0).cost(cost).quota(quota).check()
            }
            fn take_with(&self, cost: u64, quota: &A) -> Result<Ticket, QuotaError> {
                self.request(&0).cost(cost).quota(quota).take()
            }
            fn settle_with(&self, t: &mut Ticket, actual: u64, quota: &A) {
                self.request(&0).quota(quota).settle(t, actual).unwrap();
            }
        }
        impl<A: Algorithm + Copy> LiveStore<A> for $ty<u64, Live<A>, ManualClock $(, $v)?> {
            fn check_n(&self, cost: u64) -> Result<Decision, QuotaError> {
                self.request(&0).cost(cost).check()
            }
            fn take(&self, cost: u64) -> Result<Ticket, QuotaError> {
                self.request(&0).cost(cost).take()
            }
            fn settle(&self, t: &mut Ticket, actual: u64) {
                self.request(&0).settle(t, actual).unwrap();
            }
            fn reconfigure(&self, new: A) -> Result<A, ConfigError> {
                self.reconfigure(new)
            }
        }
    )*};
}
stores!(CasLimiter; MutexLimiter; CompactLimiter, Cas; CompactLimiter, Locked);

/// The four stores running `algo` on `clock`, built by `$make` for each.
macro_rules! every_store {
    ($algo:expr, $clock:expr, $bound:ident) => {{
        let (algo, clock) = ($algo, $clock);
        let v: Vec<(&'static str, Box<dyn $bound<_>>)> = vec![
            (
                "cas",
                Box::new(CasLimiter::<u64, _, _>::with_clock(
                    algo.clone(),
                    clock.clone(),
                )),
            ),
            (
                "mutex",
                Box::new(MutexLimiter::<u64, _, _>::with_clock(
                    algo.clone(),
                    clock.clone(),
                )),
            ),
            (
                "compact",
                Box::new(
                    CompactLimiter::<u64, _, _, Cas>::builder(algo.clone())
                        .clock(clock.clone())
                        .max_keys(64)
                        .build()
                        .unwrap(),
                ),
            ),
            (
                "compact-mutex",
                Box::new(
                    CompactLimiter::<u64, _, _, Locked>::builder(algo.clone())
                        .clock(clock.clone())
                        .max_keys(64)
                        .build()
                        .unwrap(),
                ),
            ),
        ];
        v
    }};
}

/// An operation under the smaller quota B: a request of a cost, or a take settled with an
/// actual cost (an overrun or a refund of that take).
#[derive(Debug, Clone)]
enum Op {
    Check(u64),
    TakeSettle(u64, u64),
}

fn ops() -> impl Strategy<Value = Vec<(u64, Op)>> {
    let op = prop_oneof![
        (1u64..6).prop_map(Op::Check),
        (1u64..4, 0u64..30).prop_map(|(c, a)| Op::TakeSettle(c, a)),
    ];
    prop::collection::vec((prop_oneof![Just(0u64), 0u64..50_000_000], op), 1..12)
}

/// `got` (the key after the B-phase) is never more lenient under A than `want` (its twin).
fn not_more_lenient<A: Algorithm + Copy>(
    name: &str,
    real: &dyn Peek,
    twin: &dyn Peek,
    algo: &A,
    clock: &ManualClock,
) -> Result<(), TestCaseError> {
    let start = hotlimit::Clock::now(clock);
    for later in [0u64, 7_000_000, 150_000_000, 1_100_000_000, 30_000_000_000] {
        clock.set(Duration::from_nanos(start + later));
        for cost in 1..=algo.capacity().min(8) {
            let (got, want) = (real.peek_n(cost), twin.peek_n(cost));
            prop_assert!(
                want.is_allowed() || got.is_denied(),
                "{}: cost {} admitted {} ns on, the twin denies",
                name,
                cost,
                later
            );
            if later == 0 {
                if let (Some(g), Some(w)) = (got.remaining(), want.remaining()) {
                    prop_assert!(g <= w, "{}: remaining {} > {}", name, g, w);
                }
                if let (Some(g), Some(w)) = (got.rate(), want.rate()) {
                    prop_assert!(g >= w * (1.0 - 1e-9), "{}: rate {} < {}", name, g, w);
                }
            }
        }
    }
    clock.set(Duration::from_nanos(start));
    Ok(())
}

/// The B-phase: each op by `check` (a request of a cost) or `take` then `settle`.
fn b_phase<T>(
    ops: &[(u64, Op)],
    clock: &ManualClock,
    check: impl Fn(u64),
    take: impl Fn(u64) -> Option<T>,
    settle: impl Fn(&mut T, u64),
) {
    for (gap, op) in ops {
        clock.advance(Duration::from_nanos(*gap));
        match *op {
            Op::Check(cost) => check(cost),
            Op::TakeSettle(cost, actual) => {
                if let Some(mut t) = take(cost) {
                    settle(&mut t, actual.max(1));
                }
            }
        }
    }
}

fn check<A: Algorithm + Copy>(name: &str, a: A, b: A) {
    let mut runner = TestRunner::new(Config {
        cases: 32,
        ..Config::default()
    });
    runner
        .run(&(0u64..30, ops()), |(spend, ops)| {
            let clock = ManualClock::default();
            // Plans: B passed with each request to a store on A.
            let reals = every_store!(a, &clock, PlanStore);
            let twins = every_store!(a, &clock, PlanStore);
            for ((store, real), (_, twin)) in reals.iter().zip(&twins) {
                clock.set(Duration::from_secs(5));
                for _ in 0..spend {
                    let _ = real.check_n_with(1, &a);
                    let _ = twin.check_n_with(1, &a);
                }
                b_phase(
                    &ops,
                    &clock,
                    |c| {
                        let _ = real.check_n_with(c.min(b.capacity()), &b);
                    },
                    |c| real.take_with(c.min(b.capacity()), &b).ok(),
                    |t, actual| real.settle_with(t, actual, &b),
                );
                let who = format!("{name} / {store} / plan");
                not_more_lenient(&who, real.as_ref(), twin.as_ref(), &a, &clock)?;
            }
            // A live switch to B, the B-phase under it, and back to A.
            let reals = every_store!(Live::new(a), &clock, LiveStore);
            let twins = every_store!(Live::new(a), &clock, LiveStore);
            for ((store, real), (_, twin)) in reals.iter().zip(&twins) {
                clock.set(Duration::from_secs(5));
                for _ in 0..spend {
                    let _ = real.check_n(1);
                    let _ = twin.check_n(1);
                }
                real.reconfigure(b).unwrap();
                b_phase(
                    &ops,
                    &clock,
                    |c| {
                        let _ = real.check_n(c.min(b.capacity()));
                    },
                    |c| real.take(c.min(b.capacity())).ok(),
                    |t, actual| real.settle(t, actual),
                );
                real.reconfigure(a).unwrap();
                let who = format!("{name} / {store} / switch");
                not_more_lenient(&who, real.as_ref(), twin.as_ref(), &a, &clock)?;
            }
            Ok(())
        })
        .unwrap();
}

// Pins G27.
#[test]
fn no_plan_or_switch_gives_budget_back() {
    let minute = Duration::from_secs(60);
    for policy in [Policy::Leaky, Policy::Strict] {
        let gcra = |q: &str| q.parse::<Gcra>().unwrap().with_policy(policy);
        check("gcra", gcra("20/s burst 20"), gcra("5/s burst 3"));
        let earrrl = |r: f64| {
            Earrrl::new(
                Duration::from_secs(1),
                Rate::new(r, Duration::from_secs(1)).unwrap(),
            )
            .unwrap()
            .with_policy(policy)
        };
        check("earrrl", earrrl(10.0), earrrl(3.0));
        let exp = |l: f64| Exponential::new(l, minute).unwrap().with_policy(policy);
        check("exponential", exp(20.0), exp(5.0));
        let fixed = |l: u64| FixedWindow::new(l, minute).unwrap().with_policy(policy);
        check("fixed window", fixed(20), fixed(3));
        let sliding = |l: u64| SlidingWindow::new(l, minute).unwrap().with_policy(policy);
        check("sliding window", sliding(20), sliding(3));
        let log = |l: u64| SlidingLog::new(l, minute).unwrap().with_policy(policy);
        check("sliding log", log(20), log(3));
        let sub = |l: u64| SubWindow::new(l, minute, 6).unwrap().with_policy(policy);
        check("sub-window", sub(20), sub(3));
        check(
            "all-of",
            AllOf::new(gcra("20/s burst 20"), fixed(20)),
            AllOf::new(gcra("5/s burst 3"), fixed(3)),
        );
    }
}

/// The figures of the issue, exactly. A limit-20 strict fixed window with 8 spent (a peek
/// reads 11 remaining) keeps its count through a strict denial under a limit-3 plan (the bug
/// read 15) and through a live switch 20 → 3 → 20; a limit-3 ticket overrunning by 1 on a key
/// at 12 leaves it at 12 (7 remaining; the bug read 15): past the plan's `limit + 1` its count
/// saturates, as a strict count does, never below what is there.
// Pins G27.
#[test]
fn a_fixed_window_keeps_its_count_under_a_smaller_limit() {
    let minute = Duration::from_secs(60);
    let a = FixedWindow::new(20, minute)
        .unwrap()
        .with_policy(Policy::Strict);
    let b = FixedWindow::new(3, minute)
        .unwrap()
        .with_policy(Policy::Strict);
    let clock = ManualClock::default();
    let plans = CasLimiter::<u64, _, _>::with_clock(a, clock.clone());
    for _ in 0..8 {
        assert!(plans.check(&1).is_allowed());
    }
    assert_eq!(plans.request(&1).peek().unwrap().remaining(), Some(11));
    assert!(plans.request(&1).quota(&b).check().unwrap().is_denied());
    assert_eq!(plans.request(&1).peek().unwrap().remaining(), Some(11));

    let mut ticket = plans.request(&2).quota(&b).take().unwrap();
    for _ in 0..11 {
        assert!(plans.check(&2).is_allowed());
    }
    assert_eq!(plans.request(&2).peek().unwrap().remaining(), Some(7));
    assert!(plans.request(&2).quota(&b).settle(&mut ticket, 2).unwrap());
    assert_eq!(plans.request(&2).peek().unwrap().remaining(), Some(7));

    let live = CasLimiter::<u64, _, _>::with_clock(Live::new(a), clock.clone());
    for _ in 0..8 {
        assert!(live.check(&1).is_allowed());
    }
    live.reconfigure(b).unwrap();
    assert!(live.check(&1).is_denied());
    live.reconfigure(a).unwrap();
    assert_eq!(live.request(&1).peek().unwrap().remaining(), Some(11));
}
