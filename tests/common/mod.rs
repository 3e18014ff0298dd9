//! Shared test harness: every algorithm (both policies) in every limiter variant.

#![allow(dead_code)]

pub mod id;
#[path = "../../benches/common/sharded.rs"]
pub mod sharded;
pub mod step;
pub mod tick_bucket;
use hotlimit::algo::{
    Algorithm, AllOf, Bias, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow,
    SubWindow,
};
use hotlimit::store::{Ask, Cas, Keys, Locked};
use hotlimit::Metrics;
use hotlimit::Ticket;
use hotlimit::{
    CasLimiter, Clock, CompactLimiter, Decision, DirectLimiter, Limiter, Live, ManualClock,
    MutexLimiter, Policy, QuantaClock, QuotaError, Rate, RateLimiter, Requests,
};
use sharded::ShardedLimiter;
use std::time::Duration;

/// The compact store's `max_keys` in these tests: room for every key they use. Kept small
/// because a compact sweep walks the whole table (O(capacity)), and these tests sweep often.
pub const COMPACT_KEYS: usize = 1024;

/// A limiter under test, built on a given manual clock.
pub type Make = Box<dyn Fn(ManualClock) -> Box<dyn Limit> + Sync>;

/// What these tests ask of every store, whatever its algorithm: `RateLimiter`'s checks, a peek
/// and a blocking wait (a `Request`'s on the library's limiters, the baseline's own on the
/// sharded one), and each store's own `len` and `sweep`.
pub trait Limit: RateLimiter<u64> {
    /// The keys held.
    fn len(&self) -> usize;

    /// A sweep by hand.
    fn sweep(&self) -> Metrics;

    /// The decision `check_n` would return now, counting nothing.
    fn peek_n(&self, key: &u64, cost: u64) -> Result<Decision, QuotaError>;

    /// `peek_n` of cost 1.
    fn peek(&self, key: &u64) -> Decision {
        self.peek_n(key, 1).expect("cost 1 is always valid")
    }

    /// Waits on the clock until a request of cost 1 is allowed: that decision, or the denial
    /// if the wait lies past the clock's range.
    fn until_ready_blocking(&self, key: &u64) -> Decision;
}

impl<S: Keys<u64>> Limit for Limiter<S> {
    fn len(&self) -> usize {
        self.metrics().keys as usize
    }
    fn sweep(&self) -> Metrics {
        Limiter::sweep(self)
    }
    fn peek_n(&self, key: &u64, cost: u64) -> Result<Decision, QuotaError> {
        self.request(key).cost(cost).peek().inspect_err(|e| {
            assert!(
                matches!(e, QuotaError::ZeroCost | QuotaError::ExceedsCapacity { .. }),
                "the limiter's own quota: {e}"
            )
        })
    }
    fn until_ready_blocking(&self, key: &u64) -> Decision {
        let waited = self.request(key).until_ready_blocking();
        waited.expect("cost 1 under the limiter's own quota is always valid")
    }
}

/// `String` keys in this harness, checked by `u64`: every other key a name past the 22 bytes
/// a map keeps inline, so both ways a `CasLimiter<String>` holds a key are under test.
#[allow(dead_code)]
pub struct ByName<S: hotlimit::store::Store>(pub Limiter<S>);

/// The name `ByName` checks for `key`.
#[allow(dead_code)]
pub fn name(key: u64) -> String {
    if key % 2 == 0 {
        format!("{key}")
    } else {
        format!("client-{key:024}")
    }
}

#[allow(dead_code)]
impl<S: Keys<String>> ByName<S> {
    /// The limiter's metrics.
    pub fn metrics(&self) -> Metrics {
        self.0.metrics()
    }

    /// A sweep by hand.
    pub fn sweep(&self) -> Metrics {
        self.0.sweep()
    }
}

impl<S: Keys<String>> RateLimiter<u64> for ByName<S> {
    fn check(&self, key: &u64) -> Decision {
        self.0.check(&name(*key))
    }
    fn check_n(&self, key: &u64, cost: u64) -> Result<Decision, QuotaError> {
        self.0.check_n(&name(*key), cost)
    }
}

/// The papaya store in this harness: keyed by [`id::Id`] (a map of `u64` keys is the compact
/// table), checked by `u64`.
pub struct ById<S: hotlimit::store::Store>(pub Limiter<S>);

impl<S: Keys<id::Id>> ById<S> {
    /// The limiter's metrics.
    pub fn metrics(&self) -> Metrics {
        self.0.metrics()
    }

    /// A sweep by hand.
    pub fn sweep(&self) -> Metrics {
        self.0.sweep()
    }
}

impl<S: Keys<id::Id>> RateLimiter<u64> for ById<S> {
    fn check(&self, key: &u64) -> Decision {
        self.0.check(&id::Id(*key))
    }
    fn check_n(&self, key: &u64, cost: u64) -> Result<Decision, QuotaError> {
        self.0.check_n(&id::Id(*key), cost)
    }
}

impl<S: Keys<id::Id>> Limit for ById<S> {
    fn len(&self) -> usize {
        self.0.metrics().keys as usize
    }
    fn sweep(&self) -> Metrics {
        self.0.sweep()
    }
    fn peek_n(&self, key: &u64, cost: u64) -> Result<Decision, QuotaError> {
        let peeked = self.0.request(&id::Id(*key)).cost(cost).peek();
        peeked.inspect_err(|e| {
            assert!(
                matches!(e, QuotaError::ZeroCost | QuotaError::ExceedsCapacity { .. }),
                "the limiter's own quota: {e}"
            )
        })
    }
    fn until_ready_blocking(&self, key: &u64) -> Decision {
        let waited = self.0.request(&id::Id(*key)).until_ready_blocking();
        waited.expect("cost 1 under the limiter's own quota is always valid")
    }
}

impl<A: Algorithm, C: Clock> Limit for ShardedLimiter<u64, A, C> {
    fn len(&self) -> usize {
        ShardedLimiter::len(self)
    }
    fn sweep(&self) -> Metrics {
        ShardedLimiter::sweep(self)
    }
    fn peek_n(&self, key: &u64, cost: u64) -> Result<Decision, QuotaError> {
        ShardedLimiter::peek_n(self, key, cost)
    }
    fn until_ready_blocking(&self, key: &u64) -> Decision {
        ShardedLimiter::until_ready_blocking(self, key)
    }
}

/// A named algorithm configuration, with a limiter factory per store variant.
pub struct Case {
    pub name: String,
    pub variants: Vec<(&'static str, Make)>,
}

fn variants<A>(algo: A) -> Vec<(&'static str, Make)>
where
    A: Algorithm + Clone,
{
    let (a, b, c) = (algo.clone(), algo.clone(), algo.clone());
    let (d, e) = (algo.clone(), algo);
    vec![
        (
            "cas",
            Box::new(move |clock| Box::new(CasLimiter::<u64, A, _>::with_clock(a.clone(), clock))),
        ),
        (
            "mutex",
            Box::new(move |clock| {
                Box::new(MutexLimiter::<u64, A, _>::with_clock(b.clone(), clock))
            }),
        ),
        (
            "sharded",
            Box::new(move |clock| {
                Box::new(ShardedLimiter::<u64, A, ManualClock>::with_clock(
                    c.clone(),
                    clock,
                ))
            }),
        ),
        // The compact store (fixed-capacity inline table): lock-free pair slots for word
        // states, lock slots otherwise; and its mutex variant.
        (
            "compact",
            Box::new(move |clock| {
                Box::new(
                    CompactLimiter::<u64, A, QuantaClock, Cas>::builder(d.clone())
                        .max_keys(COMPACT_KEYS)
                        .clock(clock)
                        .build()
                        .unwrap(),
                )
            }),
        ),
        (
            "compact-mutex",
            Box::new(move |clock| {
                Box::new(
                    CompactLimiter::<u64, A, QuantaClock, Locked>::builder(e.clone())
                        .max_keys(COMPACT_KEYS)
                        .clock(clock)
                        .build()
                        .unwrap(),
                )
            }),
        ),
    ]
}

/// One in-memory store of algorithm `A` under test, through the one trait every limiter
/// implements: each operation of a `Request` reaches every store the same way.
pub type Store<A> = Box<dyn Requests<u64, Algo = A, Error = QuotaError>>;

/// The single cell as a store of `u64` keys: every key is its one key `()`.
pub struct OneKey<L>(pub L);

impl<L: Requests<(), Error = QuotaError>> Requests<u64> for OneKey<L> {
    type Algo = L::Algo;
    type Error = QuotaError;
    fn decide(&self, _: &u64, ask: Ask<'_, L::Algo>) -> Result<Decision, QuotaError> {
        self.0.decide(&(), ask)
    }
    fn peek(&self, _: &u64, ask: Ask<'_, L::Algo>) -> Result<Decision, QuotaError> {
        self.0.peek(&(), ask)
    }
    fn up_to(&self, _: &u64, ask: Ask<'_, L::Algo>) -> Result<(u64, Decision), QuotaError> {
        self.0.up_to(&(), ask)
    }
    fn take(&self, _: &u64, ask: Ask<'_, L::Algo>) -> Result<Ticket, QuotaError> {
        self.0.take(&(), ask)
    }
    fn settle(
        &self,
        _: &u64,
        t: &mut Ticket,
        actual: u64,
        ask: Ask<'_, L::Algo>,
    ) -> Result<bool, QuotaError> {
        self.0.settle(&(), t, actual, ask)
    }
}

/// Every in-memory store of `algo` on `clock`, named, through [`Store`]: the papaya map and
/// the compact table (CAS and mutex), and the single cell (CAS and mutex; `false`: it sees one
/// key, so a test gives it key 0's requests only).
pub fn stores<A: Algorithm + Clone>(
    algo: &A,
    clock: &ManualClock,
) -> Vec<(&'static str, Store<A>, bool)> {
    let compact = |locked: bool| -> Store<A> {
        if locked {
            Box::new(
                CompactLimiter::<u64, A, QuantaClock, Locked>::builder(algo.clone())
                    .max_keys(COMPACT_KEYS)
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            )
        } else {
            Box::new(
                CompactLimiter::<u64, A>::builder(algo.clone())
                    .max_keys(COMPACT_KEYS)
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            )
        }
    };
    vec![
        (
            "cas",
            Box::new(CasLimiter::<u64, A, _>::with_clock(
                algo.clone(),
                clock.clone(),
            )),
            true,
        ),
        (
            "mutex",
            Box::new(MutexLimiter::<u64, A, _>::with_clock(
                algo.clone(),
                clock.clone(),
            )),
            true,
        ),
        ("compact", compact(false), true),
        ("compact-mutex", compact(true), true),
        (
            "direct",
            Box::new(OneKey(DirectLimiter::<A, _>::with_clock(
                algo.clone(),
                clock.clone(),
            ))),
            false,
        ),
        (
            "direct-mutex",
            Box::new(OneKey(DirectLimiter::<A, _, Locked>::with_clock(
                algo.clone(),
                clock.clone(),
            ))),
            false,
        ),
    ]
}

/// Every algorithm, in both policies.
pub fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for policy in [Policy::Leaky, Policy::Strict] {
        let gcra = "100/s burst 20"
            .parse::<Gcra>()
            .unwrap()
            .with_policy(policy);
        let earrrl = Earrrl::new(
            Duration::from_secs(1),
            Rate::new(5.0, Duration::from_secs(1)).unwrap(),
        )
        .unwrap()
        .with_policy(policy);
        let exp = Exponential::new(25.0, Duration::from_secs(1))
            .unwrap()
            .with_policy(policy);
        out.push(Case {
            name: format!("gcra/{policy}"),
            variants: variants(gcra),
        });
        out.push(Case {
            name: format!("earrrl/{policy}"),
            variants: variants(earrrl),
        });
        out.push(Case {
            name: format!("exponential/{policy}"),
            variants: variants(exp),
        });
        let second = Duration::from_secs(1);
        let fixed = FixedWindow::new(20, second).unwrap().with_policy(policy);
        out.push(Case {
            name: format!("fixed-window/{policy}"),
            variants: variants(fixed),
        });
        for bias in [Bias::Strict, Bias::Lenient] {
            let sliding = SlidingWindow::new(20, second)
                .unwrap()
                .with_policy(policy)
                .with_bias(bias);
            out.push(Case {
                name: format!("sliding-window/{bias:?}/{policy}"),
                variants: variants(sliding),
            });
        }
        let log = SlidingLog::new(20, second).unwrap().with_policy(policy);
        out.push(Case {
            name: format!("sliding-log/{policy}"),
            variants: variants(log),
        });
        for bias in [Bias::Strict, Bias::Lenient] {
            let sub = SubWindow::new(20, second, 10)
                .unwrap()
                .with_policy(policy)
                .with_bias(bias);
            out.push(Case {
                name: format!("sub-window/{bias:?}/{policy}"),
                variants: variants(sub),
            });
        }
        // Several quotas on one key: two words packed into one (CAS), and a pair behind the
        // key's lock.
        let per_minute = "600/min burst 30"
            .parse::<Gcra>()
            .unwrap()
            .with_policy(policy);
        out.push(Case {
            name: format!("all-of/gcra+earrrl/{policy}"),
            variants: variants(AllOf::new(per_minute, earrrl)),
        });
        out.push(Case {
            name: format!("all-of/gcra+sliding-log/{policy}"),
            variants: variants(AllOf::new(gcra, log)),
        });
        // A reconfigurable algorithm, never switched here: it must decide exactly as the
        // plain one.
        out.push(Case {
            name: format!("live/all-of/gcra+exponential/{policy}"),
            variants: variants(Live::new(AllOf::new(gcra, exp))),
        });
    }
    out
}

/// Gaps between a property test's steps, in nanoseconds: none (one instant), within a
/// window, or across a few windows.
pub fn gap() -> impl proptest::strategy::Strategy<Value = u64> {
    use proptest::prelude::*;
    prop_oneof![Just(0u64), 0u64..20_000_000, 0u64..2_000_000_000]
}

/// Either policy, for the property tests.
pub fn policy() -> impl proptest::strategy::Strategy<Value = Policy> {
    use proptest::prelude::*;
    prop_oneof![Just(Policy::Leaky), Just(Policy::Strict)]
}

/// A test over one algorithm configuration, generic over the algorithm (which a closure
/// cannot be): what [`on_every_algorithm`] runs.
pub trait OnAlgorithm {
    type Error;
    fn run<A>(&mut self, name: &str, algo: A) -> Result<(), Self::Error>
    where
        A: Algorithm + Clone;
}

/// Runs `test` on every algorithm in `policy` (both biases of each window), two `AllOf` pairs and
/// a `Live` GCRA: the model tests' (grants, settle) configurations.
pub fn on_every_algorithm<T: OnAlgorithm>(policy: Policy, test: &mut T) -> Result<(), T::Error> {
    let second = Duration::from_secs(1);
    let gcra = "100/s burst 20"
        .parse::<Gcra>()
        .unwrap()
        .with_policy(policy);
    test.run("gcra", gcra)?;
    let earrrl = Earrrl::new(second, Rate::new(30.0, Duration::from_secs(1)).unwrap())
        .unwrap()
        .with_policy(policy);
    test.run("earrrl", earrrl)?;
    let exp = Exponential::new(25.0, second).unwrap().with_policy(policy);
    test.run("exponential", exp)?;
    let fixed = FixedWindow::new(20, second).unwrap().with_policy(policy);
    test.run("fixed-window", fixed)?;
    for bias in [Bias::Strict, Bias::Lenient] {
        let sliding = SlidingWindow::new(20, second)
            .unwrap()
            .with_policy(policy)
            .with_bias(bias);
        test.run("sliding-window", sliding)?;
    }
    let log = SlidingLog::new(20, second).unwrap().with_policy(policy);
    test.run("sliding-log", log)?;
    for bias in [Bias::Strict, Bias::Lenient] {
        let sub = SubWindow::new(20, second, 10)
            .unwrap()
            .with_policy(policy)
            .with_bias(bias);
        test.run("sub-window", sub)?;
    }
    let per_minute = "600/min burst 30"
        .parse::<Gcra>()
        .unwrap()
        .with_policy(policy);
    test.run("all-of/gcra+earrrl", AllOf::new(per_minute, earrrl))?;
    test.run("all-of/gcra+sliding-log", AllOf::new(gcra, log))?;
    test.run("live/gcra", Live::new(gcra))
}
