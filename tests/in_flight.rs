//! In-flight limits (issue #62): `InFlight` on every in-memory store, through `Permit`.
//! Each test compares with an exact model: a counter of requests inside (checked while they
//! hold their permits), a sequential model of permits and leases, or the debt table's rule
//! (an evicted key's permits are kept, never handed back).

#[path = "common/id.rs"]
mod id;

use hotlimit::algo::InFlight;
use hotlimit::store::Locked;
use hotlimit::{
    CasLimiter, CompactLimiter, Decision, DirectLimiter, Live, ManualClock, MutexLimiter, Permit,
    QuotaError, Requests,
};
use id::Id;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(60);
/// Half the lease: a permit counts in the epoch it was taken in and the next.
const EPOCH_NS: u64 = 30_000_000_000;

fn in_flight(max: u64) -> InFlight {
    InFlight::new(max, LEASE).unwrap()
}

/// A tiny deterministic generator (xorshift), so each run replays the same operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// 8 threads take permits of cost 1 or 2 on `keys` and hold each for a few yields. Inside,
/// each adds its cost to the key's counter and checks it against `max`: never above, and
/// reached. Afterwards every permit is back: each key admits `max` at once.
fn hammer<L, K>(limiter: &L, keys: &[K], max: u64)
where
    L: Requests<K, Algo = InFlight, Error = QuotaError> + Sync,
    K: Copy + Send + Sync,
{
    let inside: Vec<AtomicU64> = keys.iter().map(|_| AtomicU64::new(0)).collect();
    let most: Vec<AtomicU64> = keys.iter().map(|_| AtomicU64::new(0)).collect();
    let (admitted, denied) = (AtomicU64::new(0), AtomicU64::new(0));
    thread::scope(|s| {
        for t in 0..8u64 {
            let (inside, most, admitted, denied) = (&inside, &most, &admitted, &denied);
            s.spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
                for _ in 0..4_000 {
                    let k = rng.below(keys.len() as u64) as usize;
                    let cost = 1 + rng.below(2);
                    let permit = Permit::acquire(limiter, &keys[k], cost).unwrap();
                    if permit.decision().is_denied() {
                        denied.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    admitted.fetch_add(1, Ordering::Relaxed);
                    let now = inside[k].fetch_add(cost, Ordering::SeqCst) + cost;
                    assert!(now <= max, "{now} in flight for key {k}, max {max}");
                    most[k].fetch_max(now, Ordering::Relaxed);
                    for _ in 0..rng.below(3) {
                        thread::yield_now();
                    }
                    inside[k].fetch_sub(cost, Ordering::SeqCst);
                    drop(permit);
                }
            });
        }
    });
    let (admitted, denied) = (admitted.into_inner(), denied.into_inner());
    assert_eq!(admitted + denied, 32_000);
    assert!(denied > 0, "no contention: nothing shows the bound");
    for (k, key) in keys.iter().enumerate() {
        assert_eq!(most[k].load(Ordering::Relaxed), max, "key {k} never full");
        // Every permit came back: the whole limit at once, then nothing.
        let all = Permit::acquire(limiter, key, max).unwrap();
        assert!(all.decision().is_allowed(), "key {k}: a permit was lost");
        let more = Permit::acquire(limiter, key, 1).unwrap();
        assert!(more.decision().is_denied());
    }
}

// Pins G76.
#[test]
fn never_more_than_max_in_flight_from_8_threads_on_every_store() {
    let keys = [3u64, 17, 99];
    let clock = ManualClock::default;
    hammer(
        &CasLimiter::<u64, _, _>::with_clock(in_flight(3), clock()),
        &keys,
        3,
    );
    hammer(
        &MutexLimiter::<u64, _, _>::with_clock(in_flight(3), clock()),
        &keys,
        3,
    );
    hammer(
        &CompactLimiter::<u64, _, _>::with_clock(in_flight(3), clock()),
        &keys,
        3,
    );
    hammer(
        &CompactLimiter::<u64, _, _, Locked>::with_clock(in_flight(3), clock()),
        &keys,
        3,
    );
    hammer(
        &DirectLimiter::<_, _>::with_clock(in_flight(4), clock()),
        &[()],
        4,
    );
    hammer(
        &DirectLimiter::<_, _, Locked>::with_clock(in_flight(4), clock()),
        &[()],
        4,
    );
}

// Pins G76.
#[test]
fn released_keys_are_swept_and_held_ones_are_not() {
    let clock = ManualClock::default();
    let l = CasLimiter::<u64, _, _>::with_clock(in_flight(2), clock.clone());
    let held = Permit::acquire(&l, &1, 1).unwrap();
    drop(Permit::acquire(&l, &2, 2).unwrap());
    assert_eq!(l.metrics().keys, 2);
    let report = l.sweep();
    assert_eq!((report.evicted_idle, l.metrics().keys), (1, 1)); // key 2 released all: fresh
    clock.advance(Duration::from_secs(59)); // taken in the first epoch: held until 60 s
    assert_eq!(l.sweep().evicted_idle, 0);
    drop(held);
    assert_eq!(l.sweep().evicted_idle, 1);
    assert!(l.metrics().keys == 0);
}

/// One operation of the sequential comparison.
#[derive(Debug)]
enum Op {
    Acquire(u64),
    Release(usize),
    Leak(usize),
    Advance(u64),
}

/// The exact model: permits taken at an epoch (half a lease), each counted until two epochs
/// later unless released before.
struct Model {
    max: u64,
    held: Vec<(usize, u64, u64)>, // (id, epoch, cost)
}

impl Model {
    /// Allowed, `remaining` and a denial's `retry_after` of `cost` at `now`; an admitted
    /// request is held as `id`.
    fn decide(&mut self, id: usize, now: u64, cost: u64) -> (bool, Option<u64>, u64) {
        let e = now / EPOCH_NS;
        self.held.retain(|&(_, at, _)| at + 2 > e);
        let total: u64 = self.held.iter().map(|h| h.2).sum();
        let cur: u64 = self.held.iter().filter(|h| h.1 == e).map(|h| h.2).sum();
        if total + cost <= self.max {
            self.held.push((id, e, cost));
            (true, Some(self.max - total - cost), 0)
        } else {
            let at = if cur + cost <= self.max { e + 1 } else { e + 2 };
            (
                false,
                Some(self.max - total.min(self.max)),
                at * EPOCH_NS - now,
            )
        }
    }

    fn release(&mut self, id: usize) {
        self.held.retain(|h| h.0 != id);
    }
}

/// Random acquisitions, releases, leaks and clock moves on one key, each decision compared
/// with the model's: allowed or not, `remaining`, and a denial's `retry_after`.
fn against_the_model<L>(limiter: &L, clock: &ManualClock, seed: u64)
where
    L: Requests<u64, Algo = InFlight, Error = QuotaError>,
{
    use hotlimit::Clock;
    let mut model = Model {
        max: 5,
        held: Vec::new(),
    };
    let mut rng = Rng(seed);
    let mut permits: Vec<(Permit<&L, u64>, usize)> = Vec::new();
    let (mut admitted, mut denied) = (0, 0);
    for id in 0..4_000 {
        let op = match rng.below(20) {
            0..=9 => Op::Acquire(1 + rng.below(3)),
            10..=15 => Op::Release(rng.below(permits.len().max(1) as u64) as usize),
            16 => Op::Leak(rng.below(permits.len().max(1) as u64) as usize),
            _ => Op::Advance(rng.below(EPOCH_NS)),
        };
        match op {
            Op::Acquire(cost) => {
                let p = Permit::acquire(limiter, &42, cost).unwrap();
                let d: Decision = p.decision();
                let want = model.decide(id, clock.now(), cost);
                let got = (
                    d.is_allowed(),
                    d.remaining(),
                    d.retry_after().as_nanos() as u64,
                );
                assert_eq!(got, want, "operation {id}: {op:?}");
                if d.is_allowed() {
                    admitted += 1;
                    permits.push((p, id));
                } else {
                    denied += 1;
                }
            }
            Op::Release(i) if i < permits.len() => {
                let (p, id) = permits.swap_remove(i);
                model.release(id);
                drop(p);
            }
            Op::Leak(i) if i < permits.len() => {
                // Never released: the model keeps it until its lease ends.
                std::mem::forget(permits.swap_remove(i).0);
            }
            Op::Release(_) | Op::Leak(_) => {}
            Op::Advance(ns) => clock.advance(Duration::from_nanos(ns)),
        }
    }
    assert!(
        admitted > 500 && denied > 500,
        "{admitted} admitted, {denied} denied"
    );
}

// Pins G76.
#[test]
fn each_decision_is_the_models_on_every_store() {
    for seed in 1..=4 {
        let clock = ManualClock::default();
        against_the_model(
            &CasLimiter::<u64, _, _>::with_clock(in_flight(5), clock.clone()),
            &clock,
            seed,
        );
        let clock = ManualClock::default();
        against_the_model(
            &MutexLimiter::<u64, _, _>::with_clock(in_flight(5), clock.clone()),
            &clock,
            seed,
        );
        let clock = ManualClock::default();
        against_the_model(
            &CompactLimiter::<u64, _, _>::with_clock(in_flight(5), clock.clone()),
            &clock,
            seed,
        );
    }
}

/// Key 0 holds both its permits; 2,000 other keys each take one and keep it, 7.8× past
/// `max_keys(256)`, so the store evicts keys that hold permits. An evicted key's permits are
/// kept as its debt: key 0 is never admitted a third, and each release frees exactly one. A
/// new key whose debt-table entries match another's (a 15-bit tag) starts from that debt: at
/// most 1% of the flood's keys are denied so. Once every permit is released, a key that
/// shared a debt slot with one holding more may still owe it (never less than its own) until
/// the leases end; after two leases every key admits its whole limit again.
fn flood_keeps_held_permits<L, K: From<u64> + Clone>(limiter: &L, clock: &ManualClock)
where
    L: Requests<K, Algo = InFlight, Error = QuotaError>,
{
    let take = |key: u64| Permit::acquire(limiter, &K::from(key), 1).unwrap();
    let mut mine = vec![take(0), take(0)];
    assert!(mine.iter().all(|p| p.decision().is_allowed()));
    let flood: Vec<_> = (1..=2_000).map(take).collect();
    let denied = flood.iter().filter(|p| p.decision().is_denied()).count();
    assert!(
        denied <= 20,
        "{denied} of 2,000 new keys denied their first permit"
    );
    assert!(
        take(0).decision().is_denied(),
        "key 0 handed a third permit"
    );
    drop(mine.pop());
    let again = take(0);
    assert!(again.decision().is_allowed(), "a release freed nothing");
    assert!(take(0).decision().is_denied());
    drop((again, mine, flood));
    clock.advance(2 * LEASE);
    for key in [0, 1, 777, 2_000] {
        let all = Permit::acquire(limiter, &K::from(key), 2).unwrap();
        assert!(
            all.decision().is_allowed(),
            "key {key} still owes after its leases"
        );
    }
}

// Pins G76.
#[test]
fn a_flood_of_keys_holding_permits_hands_no_permit_back() {
    // The papaya map, keyed by `Id` (bounded, a map of `u64` keys is the compact table).
    let build = |clock: &ManualClock| {
        CasLimiter::<Id, _>::builder(in_flight(2))
            .max_keys(256)
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let clock = ManualClock::default();
    let l = build(&clock);
    flood_keeps_held_permits(&l, &clock);
    assert!(l.metrics().debts_kept > 0);
    let clock = ManualClock::default();
    let l = MutexLimiter::<Id, _>::builder(in_flight(2))
        .max_keys(256)
        .clock(clock.clone())
        .build()
        .unwrap();
    flood_keeps_held_permits(&l, &clock);
    let clock = ManualClock::default();
    let l = CompactLimiter::<u64, _>::builder(in_flight(2))
        .max_keys(256)
        .clock(clock.clone())
        .build()
        .unwrap();
    flood_keeps_held_permits(&l, &clock);
}

// Pins G76.
#[test]
fn a_smaller_live_limit_hands_no_permit_back() {
    let l = CasLimiter::<u64, _, _>::with_clock(Live::new(in_flight(3)), ManualClock::default());
    let held: Vec<_> = (0..3)
        .map(|_| Permit::acquire(&l, &7, 1).unwrap())
        .collect();
    l.reconfigure(in_flight(1)).unwrap();
    let mut held = held.into_iter();
    assert!(Permit::acquire(&l, &7, 1).unwrap().decision().is_denied());
    drop(held.next());
    drop(held.next());
    assert!(Permit::acquire(&l, &7, 1).unwrap().decision().is_denied());
    drop(held.next());
    assert!(Permit::acquire(&l, &7, 1).unwrap().decision().is_allowed());
    // A lease of another length cannot read the permits held.
    let longer = InFlight::new(1, 2 * LEASE).unwrap();
    assert!(l.reconfigure(longer).is_err());
}
