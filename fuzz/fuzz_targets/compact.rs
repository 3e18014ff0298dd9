//! The compact store: `CompactLimiter<u64, A, ManualClock>` with the lock-free pair slot (`Cas`)
//! and with the lock slot (`Locked`), on one shared manual clock, driven by the same arbitrary
//! operations as `keyed`: requests for `u64` keys (a few small ones, often repeated, or any
//! value), clock steps forward (saturating) and backwards, (GCRA) `reserve`, `peek`, and idle
//! sweeps (no grace). The algorithm is GCRA or EARRRL (one-word states: the pair slot), the
//! exponential limiter (a 128-bit state: a lock slot even under `Cas`), or the sliding log
//! (a state that is not a word).
//!
//! Asserts: both slot kinds give identical results, equal to a reference model (a `HashMap`
//! of states updated with the pure `Algorithm::update`), and hold as many keys as the model.
//! A sweep must evict exactly the keys whose model state is idle. Keys are capped at 512
//! distinct ones against `max_keys(1024)`, so capacity eviction (whose victims are the store's
//! choice) never runs and every decision has one right answer.
//!
//! Pins G2, G18, G23 (docs/GUARANTEES.md).
#![no_main]

use arbitrary::Arbitrary;
use hotlimit::algo::{Algorithm, Gcra, SlidingLog, CLOCK_MAX};
use hotlimit::store::{Cas, Locked, Variant};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{Clock, CompactLimiter, ManualClock};
use hotlimit_fuzz::{
    earrrl_unit, expected, exponential_unit, gcra_unit, window_unit, EarrrlCfg, ExpCfg, GcraCfg,
    Span, WindowCfg,
};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::time::Duration;

const MAX_KEYS: usize = 1024;
/// Distinct keys at most: far below `MAX_KEYS`, so no capacity eviction.
const DISTINCT: usize = 512;

#[derive(Arbitrary, Debug)]
enum Key {
    /// One of 16 keys, spread over the `u64` range (multiples of a large odd number).
    Small(u8),
    /// Any key.
    Raw(u64),
}

type Op = hotlimit_fuzz::Op<Key>;

#[derive(Arbitrary, Debug)]
enum Config {
    Gcra(GcraCfg),
    Earrrl(EarrrlCfg),
    Exponential(ExpCfg),
    SlidingLog(WindowCfg),
}

#[derive(Arbitrary, Debug)]
struct Input {
    config: Config,
    ops: Vec<Op>,
}

type Compact<A, V> = CompactLimiter<u64, A, ManualClock, V>;

struct Twins<A: Algorithm> {
    algo: A,
    clock: ManualClock,
    cas: Compact<A, Cas>,
    locked: Compact<A, Locked>,
    model: HashMap<u64, A::State>,
}

fn build<A: Algorithm, V: Variant<A>>(algo: A, clock: &ManualClock) -> Compact<A, V> {
    CompactLimiter::<u64, A, hotlimit::QuantaClock, V>::builder(algo)
        .clock(clock.clone())
        .max_keys(MAX_KEYS)
        .sweep_grace(Duration::ZERO)
        .build()
        .expect("a table of 1024 keys, no sweeper thread")
}

impl<A: Algorithm + Clone> Twins<A> {
    fn new(algo: A) -> Self {
        let clock = ManualClock::default();
        Self {
            cas: build(algo.clone(), &clock),
            locked: build(algo.clone(), &clock),
            algo,
            clock,
            model: HashMap::new(),
        }
    }

    /// The key of `key`, or, once `DISTINCT` keys are held, one of those.
    fn key(&self, key: &Key) -> u64 {
        let k = match *key {
            Key::Small(i) => u64::from(i % 16).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            Key::Raw(k) => k,
        };
        if self.model.len() < DISTINCT || self.model.contains_key(&k) {
            return k;
        }
        let mut held: Vec<u64> = self.model.keys().copied().collect();
        held.sort_unstable();
        held[(k % held.len() as u64) as usize]
    }

    fn check(&mut self, key: u64, cost: u64) {
        let now = self.clock.now();
        let cas = self.cas.check_n(&key, cost);
        let locked = self.locked.check_n(&key, cost);
        assert_eq!(
            cas, locked,
            "key {key} cost {cost} at {now} ns: cas vs locked"
        );
        let (algo, model) = (&self.algo, &mut self.model);
        let expected = expected(algo.capacity(), cost, || {
            let state = model.entry(key).or_insert_with(|| algo.fresh());
            algo.update(state, now, cost)
        });
        assert_eq!(
            cas, expected,
            "key {key} cost {cost} at {now} ns: cas vs model"
        );
        self.check_len();
    }

    fn check_len(&self) {
        assert_eq!(
            self.cas.metrics().keys,
            self.model.len() as u64,
            "cas: wrong number of keys"
        );
        assert_eq!(
            self.locked.metrics().keys,
            self.model.len() as u64,
            "locked: wrong number of keys"
        );
    }

    fn run(&mut self, unit_ns: f64, ops: &[Op], reserve: impl Fn(&mut Self, u64, u64, Span)) {
        for op in ops {
            match op {
                Op::Check { key, delta, cost } => {
                    let key = self.key(key);
                    self.clock
                        .advance(Duration::from_nanos(delta.nanos(unit_ns)));
                    self.check(key, cost.value());
                }
                Op::CheckOne { key, delta } => {
                    let key = self.key(key);
                    self.clock
                        .advance(Duration::from_nanos(delta.nanos(unit_ns)));
                    let now = self.clock.now();
                    let (cas, locked) = (self.cas.check(&key), self.locked.check(&key));
                    assert_eq!(cas, locked, "check({key}) at {now} ns: cas vs locked");
                    let algo = &self.algo;
                    let state = self.model.entry(key).or_insert_with(|| algo.fresh());
                    let expected = algo.update(state, now, 1);
                    assert_eq!(cas, expected, "check({key}) at {now} ns: cas vs model");
                    self.check_len();
                }
                Op::Back(by) => {
                    let now = self.clock.now();
                    self.clock
                        .set(Duration::from_nanos(now.saturating_sub(*by)));
                }
                Op::Reserve {
                    key,
                    delta,
                    cost,
                    max_wait,
                } => {
                    let key = self.key(key);
                    self.clock
                        .advance(Duration::from_nanos(delta.nanos(unit_ns)));
                    reserve(self, key, cost.value(), *max_wait);
                }
                Op::Peek { key, delta, cost } => {
                    let key = self.key(key);
                    self.clock
                        .advance(Duration::from_nanos(delta.nanos(unit_ns)));
                    let (now, cost) = (self.clock.now(), cost.value());
                    let cas = self.cas.request(&key).cost(cost).peek();
                    let locked = self.locked.request(&key).cost(cost).peek();
                    assert_eq!(
                        cas, locked,
                        "peek({key}, {cost}) at {now} ns: cas vs locked"
                    );
                    let expected = expected(self.algo.capacity(), cost, || {
                        let fresh = self.algo.fresh();
                        let state = self.model.get(&key).unwrap_or(&fresh);
                        self.algo.peek(state, now, cost)
                    });
                    assert_eq!(
                        cas,
                        expected.map_err(Into::into),
                        "peek({key}, {cost}) at {now} ns: cas vs model"
                    );
                    self.check_len();
                }
                Op::Sweep { delta } => {
                    self.clock
                        .advance(Duration::from_nanos(delta.nanos(unit_ns)));
                    let now = self.clock.now().min(CLOCK_MAX);
                    let before = self.model.len();
                    let algo = &self.algo;
                    self.model.retain(|_, state| algo.idle_at(state) > now);
                    let idle = (before - self.model.len()) as u64;
                    let (cas, locked) = (self.cas.sweep(), self.locked.sweep());
                    assert_eq!(cas.evicted_idle, idle, "cas swept {cas:?} at {now} ns");
                    assert_eq!(
                        locked.evicted_idle, idle,
                        "locked swept {locked:?} at {now} ns"
                    );
                    assert_eq!((cas.scanned, cas.evicted_capacity), (before as u64, 0));
                    self.check_len();
                }
            }
        }
    }
}

fuzz_target!(|input: Input| {
    match input.config {
        Config::Gcra(cfg) => {
            let Some(g) = cfg.build() else { return };
            Twins::new(g).run(gcra_unit(&g), &input.ops, reserve_gcra);
        }
        Config::Earrrl(cfg) => {
            let Some(e) = cfg.build() else { return };
            Twins::new(e).run(earrrl_unit(&e), &input.ops, |t, key, cost, _| {
                t.check(key, cost)
            });
        }
        Config::Exponential(cfg) => {
            let Some(x) = cfg.build() else { return };
            Twins::new(x).run(exponential_unit(&x), &input.ops, |t, key, cost, _| {
                t.check(key, cost)
            });
        }
        Config::SlidingLog(cfg) => {
            let (limit, window, policy) = cfg.parts();
            // The log keeps one entry per counted request: keep it small.
            if limit > 256 {
                return;
            }
            let Ok(log) = SlidingLog::new(limit, window) else {
                return;
            };
            Twins::new(log.with_policy(policy)).run(
                window_unit(limit, window),
                &input.ops,
                |t, key, cost, _| t.check(key, cost),
            );
        }
    }
});

/// `reserve` on both GCRA limiters and the model (`Gcra::reserve` on the pure state).
fn reserve_gcra(t: &mut Twins<Gcra>, key: u64, cost: u64, max_wait: Span) {
    let now = t.clock.now();
    let max_wait = max_wait.duration();
    let cas = t.cas.request(&key).cost(cost).reserve(max_wait);
    let locked = t.locked.request(&key).cost(cost).reserve(max_wait);
    assert_eq!(
        cas, locked,
        "reserve({key}, {cost}, {max_wait:?}) at {now} ns: cas vs locked"
    );
    let expected = expected(t.algo.capacity(), cost, || {
        let state = t.model.entry(key).or_insert(0);
        let wait_ns = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
        let (outcome, new_state) = t.algo.reserve(*state, now, cost, wait_ns);
        *state = new_state.unwrap_or(*state);
        outcome
    });
    assert_eq!(
        cas,
        expected.map_err(Into::into),
        "reserve({key}, {cost}, {max_wait:?}) at {now} ns: cas vs model"
    );
    t.check_len();
}
