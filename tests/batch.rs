//! Batched checks (`check_batch`, `check_n_batch`): on every algorithm (both policies) and
//! every keyed store, a trace of batches decides exactly as one `check_n` per request in
//! order on a twin limiter at the same instants: the same decisions, the same refused costs,
//! the same keys held; through the inherent methods, through the `RateLimiter` trait, and
//! through the trait's default (one by one) on a limiter that implements only its required
//! methods. Threads sending batches for shared keys at one instant get exactly each key's
//! burst between them.

mod common;

use hotlimit::algo::{Algorithm, Gcra};
use hotlimit::store::{Locked, Variant};
use hotlimit::{
    CasLimiter, Clock, CompactLimiter, Decision, ManualClock, MutexLimiter, QuotaError, RateLimiter,
};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

/// A batch: the gap before it (ns), then its `(key, cost)` requests.
type Batch = (u64, Vec<(u64, u64)>);

/// One store twice: `batched` decides whole batches, `single` one request at a time.
struct Twin<'a, L> {
    batched: &'a L,
    single: &'a L,
}

/// The calls the test makes on a store: batches through the inherent methods or, with
/// `trait_`, through [`RateLimiter`]'s (slices of references, as a `dyn` caller has them).
trait Store: RateLimiter<u64> {
    fn batch(
        &self,
        requests: &[(u64, u64)],
        out: &mut Vec<Result<Decision, QuotaError>>,
        trait_: bool,
    );
    fn batch_of_ones(&self, keys: &[u64], out: &mut Vec<Decision>, trait_: bool);
    fn one(&self, key: u64, cost: u64) -> Result<Decision, QuotaError> {
        self.check_n(&key, cost)
    }
    fn keys(&self) -> usize;
}

/// A batch through the `RateLimiter` trait, as a `dyn` caller makes it (one `check_n` a
/// request: a trait object cannot take the generic iterator).
fn trait_batch(
    l: &dyn RateLimiter<u64>,
    requests: &[(u64, u64)],
    out: &mut Vec<Result<Decision, QuotaError>>,
) {
    RateLimiter::check_n_batch(&l, requests.iter().map(|(k, c)| (k, *c)), out);
}

/// [`trait_batch`] for `check_batch`.
fn trait_batch_of_ones(l: &dyn RateLimiter<u64>, keys: &[u64], out: &mut Vec<Decision>) {
    RateLimiter::check_batch(&l, keys, out);
}

/// The same calls on both keyed store types (their methods are inherent).
macro_rules! store {
    ($($t:tt)*) => {
        $($t)* {
            fn batch(
                &self,
                requests: &[(u64, u64)],
                out: &mut Vec<Result<Decision, QuotaError>>,
                trait_: bool,
            ) {
                if trait_ {
                    trait_batch(self, requests, out);
                } else {
                    self.check_n_batch(requests.iter().map(|(k, c)| (k, *c)), out);
                }
            }
            fn batch_of_ones(&self, keys: &[u64], out: &mut Vec<Decision>, trait_: bool) {
                if trait_ {
                    trait_batch_of_ones(self, keys, out);
                } else {
                    self.check_batch(keys, out);
                }
            }
            fn keys(&self) -> usize {
                self.metrics().keys as usize
            }
        }
    };
}

store!(impl<A: Algorithm, V: Variant<A>> Store for hotlimit::Limiter<hotlimit::store::Map<u64, A, ManualClock, V>>);
store!(impl<A: Algorithm, V: Variant<A>> Store for CompactLimiter<u64, A, ManualClock, V>);

/// A limiter that implements only the trait's required methods (as a user's own type would):
/// its batches are the trait's defaults, one `check` / `check_n` a request.
struct Plain<L>(L);

impl<L: RateLimiter<u64>> RateLimiter<u64> for Plain<L> {
    fn check_n(&self, key: &u64, cost: u64) -> Result<Decision, QuotaError> {
        self.0.check_n(key, cost)
    }
    fn check(&self, key: &u64) -> Decision {
        self.0.check(key)
    }
}

impl<L: Store> Store for Plain<L> {
    fn keys(&self) -> usize {
        self.0.keys()
    }
    fn batch(&self, requests: &[(u64, u64)], out: &mut Vec<Result<Decision, QuotaError>>, _: bool) {
        trait_batch(self, requests, out);
    }
    fn batch_of_ones(&self, keys: &[u64], out: &mut Vec<Decision>, _: bool) {
        trait_batch_of_ones(self, keys, out);
    }
}

impl<L: Store> Twin<'_, L> {
    /// Runs `trace`; every answer of a batch equals the one-by-one answer.
    fn run(&self, clock: &ManualClock, trace: &[Batch], what: &str) -> Result<(), TestCaseError> {
        let (mut out, mut ones) = (Vec::new(), Vec::new());
        for (i, (gap, requests)) in trace.iter().enumerate() {
            clock.advance(Duration::from_nanos(*gap));
            // Every other pair of batches through the `RateLimiter` trait.
            let trait_ = i % 4 >= 2;
            if i % 2 == 0 {
                self.batched.batch(requests, &mut out, trait_);
                let want: Vec<_> = requests
                    .iter()
                    .map(|&(k, c)| self.single.one(k, c))
                    .collect();
                prop_assert_eq!(&out, &want, "{} batch {}", what, i);
            } else {
                // Every other batch through `check_batch` (cost 1 each).
                let keys: Vec<u64> = requests.iter().map(|&(k, _)| k).collect();
                self.batched.batch_of_ones(&keys, &mut ones, trait_);
                let want: Vec<_> = keys.iter().map(|&k| self.single.one(k, 1)).collect();
                let got: Vec<_> = ones.iter().copied().map(Ok).collect();
                prop_assert_eq!(got, want, "{} batch of ones {}", what, i);
            }
            prop_assert_eq!(
                self.batched.keys(),
                self.single.keys(),
                "{} keys, batch {}",
                what,
                i
            );
        }
        Ok(())
    }
}

/// Runs a trace through every store of an algorithm.
struct SameAsOneByOne<'a>(&'a [Batch]);

impl common::OnAlgorithm for SameAsOneByOne<'_> {
    type Error = TestCaseError;
    fn run<A>(&mut self, name: &str, algo: A) -> Result<(), TestCaseError>
    where
        A: Algorithm + Clone,
    {
        let clock = ManualClock::default();
        let cas = || CasLimiter::<u64, A, _>::with_clock(algo.clone(), clock.clone());
        let (a, b) = (cas(), cas());
        Twin {
            batched: &a,
            single: &b,
        }
        .run(&clock, self.0, &format!("{name} cas"))?;
        let (a, b) = (Plain(cas()), Plain(cas()));
        Twin {
            batched: &a,
            single: &b,
        }
        .run(&clock, self.0, &format!("{name} trait default"))?;
        let mutex = || MutexLimiter::<u64, A, _>::with_clock(algo.clone(), clock.clone());
        let (a, b) = (mutex(), mutex());
        Twin {
            batched: &a,
            single: &b,
        }
        .run(&clock, self.0, &format!("{name} mutex"))?;
        // Room for every key: a full table's evictions depend on where its random hasher
        // places the keys, which differs between two tables.
        let compact = || {
            CompactLimiter::<u64, A, _>::builder(algo.clone())
                .clock(clock.clone())
                .max_keys(common::COMPACT_KEYS)
                .build()
                .unwrap()
        };
        let (a, b) = (compact(), compact());
        Twin {
            batched: &a,
            single: &b,
        }
        .run(&clock, self.0, &format!("{name} compact"))?;
        // Bounded, a map of `u64` keys under a one-word state is the compact table: its
        // batches through the map's type.
        let bounded = || {
            CasLimiter::<u64, A, _>::builder(algo.clone())
                .clock(clock.clone())
                .max_keys(common::COMPACT_KEYS)
                .build()
                .unwrap()
        };
        let (a, b) = (bounded(), bounded());
        Twin {
            batched: &a,
            single: &b,
        }
        .run(&clock, self.0, &format!("{name} cas bounded"))?;
        let locked = || {
            CompactLimiter::<u64, A, _, Locked>::builder(algo.clone())
                .clock(clock.clone())
                .max_keys(common::COMPACT_KEYS)
                .build()
                .unwrap()
        };
        let (a, b) = (locked(), locked());
        Twin {
            batched: &a,
            single: &b,
        }
        .run(&clock, self.0, &format!("{name} compact-locked"))
    }
}

fn trace() -> impl Strategy<Value = Vec<Batch>> {
    // Gaps from none to a few windows; keys from a small range (repeats within a batch);
    // costs mostly valid, some 0 or above every capacity.
    let gap = common::gap();
    let key = prop_oneof![0u64..4, 0u64..40];
    let cost = prop_oneof![8 => 1u64..=4, 1 => Just(0u64), 1 => Just(1_000_000u64)];
    let batch = prop::collection::vec((key, cost), 0..70);
    prop::collection::vec((gap, batch), 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    // Pins G32.
    #[test]
    fn every_algorithm_and_store_batches_as_one_by_one(trace in trace(), policy in common::policy()) {
        common::on_every_algorithm(policy, &mut SameAsOneByOne(&trace))?;
    }
}

/// A refused cost answers its error in place and inserts nothing; the requests around it are
/// decided.
// Pins G17, G32.
#[test]
fn a_refused_cost_is_its_own_answer() {
    let l = CasLimiter::<String, Gcra, _>::with_clock(
        "10/s burst 3".parse().unwrap(),
        ManualClock::default(),
    );
    let mut out = Vec::new();
    l.check_n_batch([("a", 2), ("b", 0), ("c", 4), ("a", 1), ("a", 1)], &mut out);
    let allowed: Vec<_> = out
        .iter()
        .map(|r| r.clone().map(|d| d.is_allowed()))
        .collect();
    assert_eq!(
        allowed,
        [
            Ok(true),
            Err(QuotaError::ZeroCost),
            Err(QuotaError::ExceedsCapacity {
                cost: 4,
                capacity: 3
            }),
            Ok(true),
            Ok(false),
        ]
    );
    assert_eq!(l.metrics().keys, 1, "refused requests insert nothing");
    // The output is cleared first: reusing it holds the new batch only.
    let mut ones = Vec::new();
    l.check_batch(["b", "b", "b"], &mut ones);
    l.check_batch(["b", "b"], &mut ones);
    assert_eq!(ones.len(), 2);
    assert_eq!(
        ones.iter().map(Decision::is_allowed).collect::<Vec<_>>(),
        [false, false]
    );
    l.check_n_batch(std::iter::empty::<(&str, u64)>(), &mut out);
    assert!(out.is_empty());
}

/// Threads sending batches over shared keys at one instant are admitted exactly each key's
/// burst between them: no lost update between a batch's look-up and its decision.
// Pins G1, G32.
#[test]
fn threads_batching_shared_keys_get_each_burst_exactly() {
    const KEYS: u64 = 50;
    let gcra: Gcra = "1/s burst 40".parse().unwrap();
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
    // Bounded: the compact table, behind the map's type.
    let bounded = Arc::new(
        CasLimiter::<u64, Gcra>::builder(gcra)
            .clock(clock.clone())
            .max_keys(1_000)
            .build()
            .unwrap(),
    );
    type Batcher = Arc<dyn Fn(&[u64], &mut Vec<Decision>) + Send + Sync>;
    let stores: [(&str, Batcher); 4] = [
        ("cas", Arc::new(move |k, out| cas.check_batch(k, out))),
        (
            "cas bounded",
            Arc::new(move |k, out| bounded.check_batch(k, out)),
        ),
        ("mutex", Arc::new(move |k, out| mutex.check_batch(k, out))),
        (
            "compact",
            Arc::new(move |k, out| compact.check_batch(k, out)),
        ),
    ];
    for (name, batch) in stores {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let batch = batch.clone();
                std::thread::spawn(move || {
                    // Each thread walks the keys from its own offset, 60 rounds of 50 keys:
                    // 3000 requests per key in all against a burst of 40.
                    let keys: Vec<u64> = (0..KEYS).map(|k| (k + t * 13) % KEYS).collect();
                    let mut out = Vec::new();
                    let mut allowed = vec![0u64; KEYS as usize];
                    for _ in 0..60 {
                        batch(&keys, &mut out);
                        for (k, d) in keys.iter().zip(&out) {
                            allowed[*k as usize] += d.is_allowed() as u64;
                        }
                    }
                    allowed
                })
            })
            .collect();
        let mut per_key = vec![0u64; KEYS as usize];
        for h in handles {
            for (total, got) in per_key.iter_mut().zip(h.join().unwrap()) {
                *total += got;
            }
        }
        assert!(per_key.iter().all(|&n| n == 40), "{name}: {per_key:?}");
    }
    assert_eq!(clock.now(), 0);
}
