//! The keyed limiters: the lock-free `CasLimiter<Vec<u8>, _, ManualClock>` and the mutex twin
//! `MutexLimiter` with the same algorithm (GCRA, and also EARRRL and exponential, the latter
//! through the 128-bit CAS cell) on one shared manual clock, driven by the same arbitrary
//! operations: requests for byte-string keys (up to 64 bytes; often a key seen before), clock
//! steps forward (saturating) and backwards, (GCRA) `reserve`, `peek`, and idle sweeps (no
//! grace). `AllOf(GCRA, EARRRL)` runs as a fourth configuration. A third limiter, a
//! `CasLimiter<String>`, gets each key as its bytes in hex (a map of `String` keys holds their
//! bytes in its entries: inline up to 22, so keys of up to 11 bytes here; boxed past that)
//! and must answer as the `CasLimiter<Vec<u8>>` does.
//!
//! Asserts: both give identical `check_n` results (`Decision` compared with `==`, `QuotaError`
//! too) and identical `reserve` results; both equal a reference model, a `HashMap` of states
//! updated with the pure `Algorithm::update`; and both hold as many keys as the model.
//! A sweep must evict from both limiters exactly the keys whose model state is idle
//! (`idle_at ≤ now`), and the model drops them too, so every later request is checked against
//! a model that went through the same evictions.
//! Single-threaded: this checks the map, the keying, the cells and the sweep, not the
//! concurrency (that is `tests/stress.rs`, `tests/eviction.rs` and the loom models).
//!
//! Pins G2, G4, G18, G23 (docs/GUARANTEES.md).
#![no_main]

use arbitrary::Arbitrary;
use hotlimit::algo::{Algorithm, AllOf, Gcra, CLOCK_MAX};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{CasLimiter, Clock, ManualClock, MutexLimiter};
use hotlimit_fuzz::{
    earrrl_unit, expected, exponential_unit, gcra_unit, EarrrlCfg, ExpCfg, GcraCfg, Span,
};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::time::Duration;

const MAX_KEY: usize = 64;

#[derive(Arbitrary, Debug)]
enum Key {
    /// A key given in full (truncated to 64 bytes).
    New(Vec<u8>),
    /// The n-th key used so far (mod their number); the empty key if none yet.
    Again(u8),
}

type Op = hotlimit_fuzz::Op<Key>;

#[derive(Arbitrary, Debug)]
enum Config {
    Gcra(GcraCfg),
    Earrrl(EarrrlCfg),
    Exponential(ExpCfg),
    /// GCRA and EARRRL as two quotas on one key (one packed u128 word).
    AllOf(GcraCfg, EarrrlCfg),
}

#[derive(Arbitrary, Debug)]
struct Input {
    config: Config,
    ops: Vec<Op>,
}

struct Twins<A: Algorithm> {
    algo: A,
    clock: ManualClock,
    cas: CasLimiter<Vec<u8>, A, ManualClock>,
    mutex: MutexLimiter<Vec<u8>, A, ManualClock>,
    named: CasLimiter<String, A, ManualClock>,
    model: HashMap<Vec<u8>, A::State>,
    keys: Vec<Vec<u8>>,
}

impl<A: Algorithm + Clone> Twins<A> {
    fn new(algo: A) -> Self {
        let clock = ManualClock::default();
        Self {
            cas: CasLimiter::<Vec<u8>, A>::builder(algo.clone())
                .clock(clock.clone())
                .sweep_grace(Duration::ZERO)
                .build()
                .expect("no sweeper thread to spawn"),
            mutex: MutexLimiter::<Vec<u8>, A>::builder(algo.clone())
                .clock(clock.clone())
                .sweep_grace(Duration::ZERO)
                .build()
                .expect("no sweeper thread to spawn"),
            named: CasLimiter::<String, A>::builder(algo.clone())
                .clock(clock.clone())
                .sweep_grace(Duration::ZERO)
                .build()
                .expect("no sweeper thread to spawn"),
            algo,
            clock,
            model: HashMap::new(),
            keys: Vec::new(),
        }
    }

    fn key(&mut self, key: &Key) -> Vec<u8> {
        match key {
            Key::New(bytes) => {
                let k = bytes[..bytes.len().min(MAX_KEY)].to_vec();
                self.keys.push(k.clone());
                k
            }
            Key::Again(i) if !self.keys.is_empty() => {
                self.keys[usize::from(*i) % self.keys.len()].clone()
            }
            Key::Again(_) => Vec::new(),
        }
    }

    /// `check_n` on both limiters and the model.
    fn check(&mut self, key: &[u8], cost: u64) {
        let now = self.clock.now();
        let cas = self.cas.check_n(key, cost);
        let mutex = self.mutex.check_n(key, cost);
        assert_eq!(
            cas, mutex,
            "key {key:?} cost {cost} at {now} ns: cas vs mutex"
        );
        let named = self.named.check_n(name(key).as_str(), cost);
        assert_eq!(
            cas, named,
            "key {key:?} cost {cost} at {now} ns: cas vs named"
        );
        let (algo, model) = (&self.algo, &mut self.model);
        let expected = expected(algo.capacity(), cost, || {
            let state = model.entry(key.to_vec()).or_insert_with(|| algo.fresh());
            algo.update(state, now, cost)
        });
        assert_eq!(
            cas, expected,
            "key {key:?} cost {cost} at {now} ns: cas vs model"
        );
        self.check_len();
    }

    fn check_len(&self) {
        assert_eq!(
            self.cas.metrics().keys,
            self.model.len() as u64,
            "cas holds a wrong number of keys"
        );
        assert_eq!(
            self.mutex.metrics().keys,
            self.model.len() as u64,
            "mutex holds a wrong number of keys"
        );
        assert_eq!(
            self.named.metrics().keys,
            self.model.len() as u64,
            "named holds a wrong number of keys"
        );
    }

    /// Runs `ops`; `reserve` handles `Op::Reserve` (its arguments: the twins, the key, cost
    /// and maximum wait).
    fn run(&mut self, unit_ns: f64, ops: &[Op], reserve: impl Fn(&mut Self, &[u8], u64, Span)) {
        for op in ops {
            match op {
                Op::Check { key, delta, cost } => {
                    let key = self.key(key);
                    self.clock
                        .advance(Duration::from_nanos(delta.nanos(unit_ns)));
                    self.check(&key, cost.value());
                }
                Op::CheckOne { key, delta } => {
                    let key = self.key(key);
                    self.clock
                        .advance(Duration::from_nanos(delta.nanos(unit_ns)));
                    let now = self.clock.now();
                    let (cas, mutex) = (self.cas.check(&key[..]), self.mutex.check(&key[..]));
                    assert_eq!(cas, mutex, "check({key:?}) at {now} ns: cas vs mutex");
                    let named = self.named.check(&name(&key));
                    assert_eq!(cas, named, "check({key:?}) at {now} ns: cas vs named");
                    let algo = &self.algo;
                    let state = self
                        .model
                        .entry(key.clone())
                        .or_insert_with(|| algo.fresh());
                    let expected = algo.update(state, now, 1);
                    assert_eq!(cas, expected, "check({key:?}) at {now} ns: cas vs model");
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
                    reserve(self, &key, cost.value(), *max_wait);
                }
                Op::Peek { key, delta, cost } => {
                    let key = self.key(key);
                    self.clock
                        .advance(Duration::from_nanos(delta.nanos(unit_ns)));
                    let (now, cost) = (self.clock.now(), cost.value());
                    let (cas, mutex) = (
                        self.cas.request(&key).cost(cost).peek(),
                        self.mutex.request(&key).cost(cost).peek(),
                    );
                    assert_eq!(
                        cas, mutex,
                        "peek({key:?}, {cost}) at {now} ns: cas vs mutex"
                    );
                    let named = self.named.request(name(&key).as_str()).cost(cost).peek();
                    assert_eq!(
                        cas, named,
                        "peek({key:?}, {cost}) at {now} ns: cas vs named"
                    );
                    let expected = expected(self.algo.capacity(), cost, || {
                        let fresh = self.algo.fresh();
                        let state = self.model.get(&key).unwrap_or(&fresh);
                        self.algo.peek(state, now, cost)
                    });
                    assert_eq!(
                        cas,
                        expected.map_err(Into::into),
                        "peek({key:?}, {cost}) at {now} ns: cas vs model"
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
                    let (cas, mutex) = (self.cas.sweep(), self.mutex.sweep());
                    let named = self.named.sweep();
                    assert_eq!(
                        named.evicted_idle, idle,
                        "named swept {named:?} at {now} ns"
                    );
                    assert_eq!(cas.evicted_idle, idle, "cas swept {cas:?} at {now} ns");
                    assert_eq!(
                        mutex.evicted_idle, idle,
                        "mutex swept {mutex:?} at {now} ns"
                    );
                    assert_eq!(cas.scanned, before as u64);
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
        Config::AllOf(g, e) => {
            let (Some(g), Some(e)) = (g.build(), e.build()) else {
                return;
            };
            let unit = gcra_unit(&g).min(earrrl_unit(&e));
            Twins::new(AllOf::new(g, e))
                .run(unit, &input.ops, |t, key, cost, _| t.check(key, cost));
        }
    }
});

/// `reserve` on both GCRA limiters and the model (`Gcra::reserve` on the pure state).
fn reserve_gcra(t: &mut Twins<Gcra>, key: &[u8], cost: u64, max_wait: Span) {
    let now = t.clock.now();
    let max_wait = max_wait.duration();
    let cas = t.cas.request(key).cost(cost).reserve(max_wait);
    let mutex = t.mutex.request(key).cost(cost).reserve(max_wait);
    assert_eq!(
        cas, mutex,
        "reserve({key:?}, {cost}, {max_wait:?}) at {now} ns: cas vs mutex"
    );
    let named = t
        .named
        .request(name(key).as_str())
        .cost(cost)
        .reserve(max_wait);
    assert_eq!(
        cas, named,
        "reserve({key:?}, {cost}, {max_wait:?}) at {now} ns: cas vs named"
    );
    let expected = expected(t.algo.capacity(), cost, || {
        let state = t.model.entry(key.to_vec()).or_insert(0);
        let wait_ns = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
        let (outcome, new_state) = t.algo.reserve(*state, now, cost, wait_ns);
        *state = new_state.unwrap_or(*state);
        outcome
    });
    assert_eq!(
        cas,
        expected.map_err(Into::into),
        "reserve({key:?}, {cost}, {max_wait:?}) at {now} ns: cas vs model"
    );
    t.check_len();
}

/// The `String` key of the byte-string key `key`: its bytes in hex, one to one.
fn name(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}
