//! What capacity eviction keeps of a key is never more lenient than what it evicted: for every
//! algorithm in both policies, a state restored from its debt words
//! ([`Debt::debt`](hotlimit::algo::Debt::debt) → [`Debt::restore`](hotlimit::algo::Debt::restore)), or from a join of them with another key's
//! ([`Debt::debt_join`](hotlimit::algo::Debt::debt_join)), or where the words are ranked ([`Debt::debt_rank`](hotlimit::algo::Debt::debt_rank)) from
//! any rank between its own and the joined word's, admits no request of any cost at any later
//! time (with no traffic between) that the state itself would deny, and over any later trace
//! of requests of cost 1 admits no more of them, and no earlier; and it is not fresh before
//! the state is.
//!
//! (Over traces of mixed costs, total units are not monotone for any limiter with a leaky
//! policy: a more limited state that denies a large request may then admit several small
//! ones the other state no longer has room for. Found here for EARRRL: 98 units against 97.)

mod common;

use common::{on_every_algorithm, OnAlgorithm};
use hotlimit::algo::Algorithm;
use hotlimit::Policy;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// A request: a gap before it (ns) and a cost (capped at the algorithm's capacity).
type Trace = Vec<(u64, u64)>;

fn trace(len: usize) -> impl Strategy<Value = Trace> {
    prop::collection::vec((common::gap(), 1u64..8), 0..len)
}

/// A trace of requests of cost 1.
fn ones(len: usize) -> impl Strategy<Value = Trace> {
    prop::collection::vec((common::gap(), Just(1u64)), 0..len)
}

/// Runs `trace` from `state` at `start`: units admitted and the index of the first admission.
fn run<A: Algorithm>(
    algo: &A,
    mut state: A::State,
    start: u64,
    trace: &Trace,
) -> (u64, Option<usize>) {
    let (mut now, mut units, mut first) = (start, 0, None);
    for (i, &(gap, cost)) in trace.iter().enumerate() {
        now += gap;
        let cost = cost.min(algo.capacity());
        if algo.update(&mut state, now, cost).is_allowed() {
            units += cost;
            first.get_or_insert(i);
        }
    }
    (units, first)
}

/// The state after `trace` from fresh, and the time it ends at.
fn spent<A: Algorithm>(algo: &A, trace: &Trace) -> (A::State, u64) {
    let mut state = algo.fresh();
    let mut now = 0;
    for &(gap, cost) in trace {
        now += gap;
        let _ = algo.update(&mut state, now, cost.min(algo.capacity()));
    }
    (state, now)
}

fn restored<A: Algorithm>(algo: &A, state: &A::State) -> A::State {
    algo.restore(&|part| algo.debt(state, part))
}

struct NeverMoreLenient;

impl OnAlgorithm for NeverMoreLenient {
    type Error = String;

    fn run<A>(&mut self, name: &str, algo: A) -> Result<(), String>
    where
        A: Algorithm + Clone,
    {
        let mut runner = TestRunner::new(Config {
            cases: 300,
            ..Config::default()
        });
        let probes = prop::collection::vec((0u64..4_000_000_000, 1u64..8), 8);
        let strategy = (
            trace(40),
            trace(40),
            0u64..3_000_000_000,
            ones(60),
            probes,
            any::<u64>(),
            trace(20),
        );
        runner
            .run(
                &strategy,
                |(mine, other, pause, after, probes, raise, more)| {
                    let (state, end) = spent(&algo, &mine);
                    let (other_state, other_end) = spent(&algo, &other);
                    // A third key, whose requests may come later than the first two's.
                    let more: Trace = std::iter::once((end.max(other_end) + pause / 2, 1))
                        .chain(more)
                        .collect();
                    let (third, third_end) = spent(&algo, &more);
                    let start = end.max(other_end).max(third_end) + pause;
                    let want = run(&algo, state.clone(), start, &after);
                    // Alone, and joined with another key's debt (as a shared bucket holds it).
                    let alone = restored(&algo, &state);
                    let joined = algo.restore(&|p| {
                        algo.debt_join(p, algo.debt(&state, p), algo.debt(&other_state, p))
                    });
                    // And, where the words are ranked, from any rank between the key's own and
                    // its shared word's (what the debt table brings a key back owing by its code:
                    // its own rank, rounded up), and that word ranked again beneath the join with
                    // a third key's debt (as a slot grows), paid no sooner than the key's own.
                    let above = |p: usize| {
                        let d = algo.debt(&state, p);
                        let shared = algo.debt_join(p, d, algo.debt(&other_state, p));
                        if algo.debt_lanes(p) == 0 || d == 0 {
                            return d;
                        }
                        let own = algo.debt_rank(p, shared, d);
                        let top = algo.debt_rank(p, shared, shared);
                        let rank = [0, 1].map(|lane| {
                            assert!(
                                own[lane] <= top[lane],
                                "{name}: {own:?} ranks above its shared word's {top:?}"
                            );
                            let span = top[lane] - own[lane];
                            own[lane] + raise.rotate_left(32 * lane as u32) % span.saturating_add(1)
                        });
                        let w = algo.debt_unrank(p, shared, rank);
                        assert!(
                            algo.debt_paid_at(p, w) >= algo.debt_paid_at(p, d),
                            "{name}: rank {rank:?} paid before {d}"
                        );
                        // Beneath a later word joining the shared one, ranked again from that
                        // word (as the table does when a slot grows).
                        let later = algo.debt_join(p, shared, algo.debt(&third, p));
                        let again = algo.debt_rank(p, later, w);
                        let w2 = algo.debt_unrank(p, later, again);
                        if raise >> 63 == 0 {
                            w
                        } else {
                            w2
                        }
                    };
                    let raised = algo.restore(&above);
                    for (how, from) in [("alone", alone), ("joined", joined), ("raised", raised)] {
                        for &(wait, cost) in &probes {
                            let (at, cost) = (start + wait, cost.min(algo.capacity()));
                            prop_assert!(
                                !algo.peek(&from, at, cost).is_allowed()
                                    || algo.peek(&state, at, cost).is_allowed(),
                                "{} restored {} admits {} at {} where the state denies",
                                name,
                                how,
                                cost,
                                at
                            );
                        }
                        let got = run(&algo, from, start, &after);
                        // Never admitted is later than any admission.
                        let first = |f: Option<usize>| f.unwrap_or(usize::MAX);
                        prop_assert!(
                            got.0 <= want.0 && first(got.1) >= first(want.1),
                            "{} restored {}: {:?} against {:?}",
                            name,
                            how,
                            got,
                            want
                        );
                    }
                    // Paid exactly when the state is fresh again (never sooner).
                    for p in 0..algo.debt_parts() {
                        let paid = algo.debt_paid_at(p, algo.debt(&state, p));
                        prop_assert!(paid <= algo.idle_at(&state).max(paid));
                        if algo.debt(&state, p) != 0 {
                            prop_assert!(
                                algo.idle_at(&restored(&algo, &state)) >= algo.idle_at(&state),
                                "{} paid sooner",
                                name
                            );
                        }
                    }
                    Ok(())
                },
            )
            .map_err(|e: proptest::test_runner::TestError<_>| format!("{name}: {e}"))
    }
}

// Pins G25.
#[test]
fn a_restored_state_is_never_more_lenient() {
    for policy in [Policy::Leaky, Policy::Strict] {
        on_every_algorithm(policy, &mut NeverMoreLenient).unwrap();
    }
}

/// A fresh state owes nothing, and nothing restores fresh.
struct FreshOwesNothing;

impl OnAlgorithm for FreshOwesNothing {
    type Error = TestCaseError;

    fn run<A>(&mut self, name: &str, algo: A) -> Result<(), TestCaseError>
    where
        A: Algorithm + Clone,
    {
        for p in 0..algo.debt_parts() {
            prop_assert_eq!(algo.debt(&algo.fresh(), p), 0, "{}", name);
        }
        let restored = algo.restore(&|_| 0);
        prop_assert_eq!(
            algo.idle_at(&restored),
            algo.idle_at(&algo.fresh()),
            "{}",
            name
        );
        Ok(())
    }
}

// Pins G25.
#[test]
fn fresh_owes_nothing() {
    for policy in [Policy::Leaky, Policy::Strict] {
        on_every_algorithm(policy, &mut FreshOwesNothing).unwrap();
    }
}
