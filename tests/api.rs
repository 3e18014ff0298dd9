//! The API beyond `check`: peek, several quotas per key, live reconfiguration, metrics and
//! waiting, each in both store variants, under threads where it matters.

mod common;

use common::step::WordStep;
use hotlimit::algo::{Algorithm, AllOf, Earrrl, Gcra, SlidingLog};
use hotlimit::store::{Locked, Map, Variant};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{
    CasLimiter, Clock, DirectLimiter, Limiter, Live, ManualClock, MutexLimiter, Policy, Rate,
};
use proptest::prelude::*;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Barrier;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

const THREADS: usize = 4;

/// Polls a future to completion; the futures here never wait on a waker (their sleep moves a
/// manual clock and is ready at once).
fn block_on<F: Future>(f: F) -> F::Output {
    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    let waker = Waker::from(Arc::new(Noop));
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// peek

/// One step of a trace: advance the clock, maybe peek, then check.
#[derive(Debug, Clone)]
struct Op {
    advance_ms: u64,
    key: u64,
    cost: u64,
    peek: bool,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (0u64..40, 0u64..3, 1u64..=3, any::<bool>()).prop_map(|(advance_ms, key, cost, peek)| Op {
            advance_ms,
            key,
            cost,
            peek,
        }),
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Interleaving peeks into a trace changes none of its decisions, and each peek answers
    /// exactly what the check right after it (same time, same cost) gets. Every algorithm,
    /// every store.
    // Pins G28.
    #[test]
    fn peek_never_changes_a_decision_sequence(trace in ops()) {
        for case in common::cases() {
            for (variant, make) in &case.variants {
                let (clock, peeked_clock) = (ManualClock::default(), ManualClock::default());
                let plain = make(clock.clone());
                let peeked = make(peeked_clock.clone());
                for op in &trace {
                    clock.advance(Duration::from_millis(op.advance_ms));
                    peeked_clock.advance(Duration::from_millis(op.advance_ms));
                    let want = plain.check_n(&op.key, op.cost).unwrap();
                    if op.peek {
                        let p = peeked.peek_n(&op.key, op.cost).unwrap();
                        prop_assert_eq!(p, want, "{} {}: peek", case.name, variant);
                        // A peek of a key never checked inserts nothing.
                        let _ = peeked.peek(&99);
                    }
                    let got = peeked.check_n(&op.key, op.cost).unwrap();
                    prop_assert_eq!(got, want, "{} {}", case.name, variant);
                }
                prop_assert_eq!(plain.len(), peeked.len());
            }
        }
    }

    /// `AllOf` decides exactly as the model: step each quota on its own copy, keep both new
    /// states if both allow, else keep only what the denying quotas' policies made of it.
    // Pins G13.
    #[test]
    fn all_of_matches_the_all_or_nothing_model(trace in ops(), strict in any::<bool>()) {
        let policy = if strict { Policy::Strict } else { Policy::Leaky };
        let a = "20/s burst 5".parse::<Gcra>().unwrap().with_policy(policy);
        let b = Earrrl::new(Duration::from_secs(1), Rate::new(8.0, Duration::from_secs(1)).unwrap())
            .unwrap()
            .with_policy(policy);
        let both = AllOf::new(a, b);
        let (mut sa, mut sb, mut s) = (a.fresh(), b.fresh(), both.fresh());
        let mut now = 0;
        for op in &trace {
            now += op.advance_ms * 1_000_000;
            let (mut na, mut nb) = (sa, sb);
            let da = a.update(&mut na, now, op.cost);
            let db = b.update(&mut nb, now, op.cost);
            let allowed = da.is_allowed() && db.is_allowed();
            if allowed || !da.is_allowed() {
                sa = na;
            }
            if allowed || !db.is_allowed() {
                sb = nb;
            }
            let got = both.step(s, now, op.cost);
            s = got.state.unwrap_or(s);
            prop_assert_eq!(got.decision.is_allowed(), allowed);
            prop_assert_eq!(s, (sa as u128) << 64 | sb as u128);
            let wait = |d: hotlimit::Decision| if d.is_allowed() { 0 } else { d.retry_after().as_nanos() as u64 };
            prop_assert_eq!(got.decision.retry_after().as_nanos() as u64, wait(da).max(wait(db)));
        }
    }

    /// `until_ready` returns at the first time the limiter allows: allowed then, and (under
    /// the leaky policy, where waiting is not counted) a peek one nanosecond earlier, on a
    /// replica with the same history, is denied. Every algorithm, every store.
    // Pins G15.
    #[test]
    fn until_ready_returns_at_the_honest_time(trace in ops()) {
        for case in common::cases() {
            for (variant, make) in &case.variants {
                let (clock, replica_clock) = (ManualClock::default(), ManualClock::default());
                let limiter = make(clock.clone());
                let replica = make(replica_clock.clone());
                for op in &trace {
                    clock.advance(Duration::from_millis(op.advance_ms));
                    replica_clock.advance(Duration::from_millis(op.advance_ms));
                    let _ = limiter.check_n(&op.key, op.cost).unwrap();
                    let _ = replica.check_n(&op.key, op.cost).unwrap();
                }
                let start = clock.now();
                let waited = limiter.until_ready_blocking(&0);
                prop_assert!(waited.is_allowed(), "{} {}", case.name, variant);
                let at = clock.now();
                if at > start && case.name.ends_with("leaky") {
                    replica_clock.set(Duration::from_nanos(at - 1));
                    prop_assert!(replica.peek(&0).is_denied(), "{} {}: woke late", case.name, variant);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// several quotas

/// Four threads hammer one key through 200 phases 25 ms apart. After every phase the total
/// admitted equals the sequential replay and stays within every quota's bound (`bound(now)`,
/// the least of them); the bound is reached at the first phase (the first quota binds) and at
/// the last (the second binds): a denial by one quota charged nothing to the other, or the
/// second would have bound sooner.
fn multi_quota_under_threads<A, V>(
    make: impl Fn(ManualClock) -> Limiter<Map<u64, A, ManualClock, V>>,
    bound: impl Fn(u64) -> u64,
) where
    A: Algorithm,
    V: Variant<A>,
{
    let clock = ManualClock::default();
    let limiter = make(clock.clone());
    let sequential_clock = ManualClock::default();
    let sequential = make(sequential_clock.clone());
    let allowed = AtomicU64::new(0);
    let (start, done) = (Barrier::new(THREADS + 1), Barrier::new(THREADS + 1));
    let phases = 200u64;
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..phases {
                    start.wait();
                    let n = (0..50).filter(|_| limiter.check(&7).is_allowed()).count();
                    allowed.fetch_add(n as u64, Ordering::Relaxed);
                    done.wait();
                }
            });
        }
        let mut want = 0u64;
        for p in 0..phases {
            let now = p * 25_000_000;
            clock.set(Duration::from_nanos(now));
            sequential_clock.set(Duration::from_nanos(now));
            start.wait();
            want += (0..THREADS * 50)
                .filter(|_| sequential.check(&7).is_allowed())
                .count() as u64;
            done.wait();
            let got = allowed.load(Ordering::Relaxed);
            assert_eq!(got, want, "phase {p}");
            assert!(got <= bound(now), "phase {p}: {got} > {}", bound(now));
            if p == 0 || p == phases - 1 {
                assert_eq!(got, bound(now), "phase {p}");
            }
        }
    });
}

/// At most `burst + elapsed/T` by `now`.
fn gcra_bound(g: &Gcra, now: u64) -> u64 {
    g.capacity() + now / g.emission_interval().as_nanos() as u64
}

// Pins G1, G13.
#[test]
fn multi_quota_never_exceeds_any_quota_under_threads() {
    let per_second: Gcra = "40/s burst 10".parse().unwrap();
    let per_minute: Gcra = "600/min burst 30".parse().unwrap();
    // Two GCRA words packed into one CAS word, and the same under the mutex.
    let quotas = AllOf::new(per_second, per_minute);
    let bound = |now| gcra_bound(&per_second, now).min(gcra_bound(&per_minute, now));
    multi_quota_under_threads(|c| CasLimiter::<u64, _, _>::with_clock(quotas, c), bound);
    multi_quota_under_threads(|c| MutexLimiter::<u64, _, _>::with_clock(quotas, c), bound);
    // A pair behind the key's lock: a sliding log allows at most 30 in any minute.
    let log = SlidingLog::new(30, Duration::from_secs(60)).unwrap();
    let pair = AllOf::new(per_second, log);
    let bound = |now| gcra_bound(&per_second, now).min(30);
    multi_quota_under_threads(|c| CasLimiter::<u64, _, _>::with_clock(pair, c), bound);
    multi_quota_under_threads(|c| MutexLimiter::<u64, _, _>::with_clock(pair, c), bound);
}

// ---------------------------------------------------------------------------------------------
// live reconfiguration

/// 64 keys spend their budget under 100/s burst 100; then, while four threads hammer every
/// key, the quota switches to 10/s burst 5; then back to 100/s burst 100 while they hammer
/// again. Exact counts show that no key is lost or reset to fresh, that the stricter quota is
/// never over-admitted, and that no switch hands budget back: a debt run up under the old
/// quota is kept whole under the new one and after switching back (#46).
fn reconfiguration_under_load<V: Variant<Live<Gcra>>>() {
    let old: Gcra = "100/s burst 100".parse().unwrap();
    let new: Gcra = "10/s burst 5".parse().unwrap();
    let keys = 64u64;
    let clock = ManualClock::default();
    let limiter = Limiter::<Map<u64, _, _, V>>::builder(Live::new(old))
        .clock(clock.clone())
        .metrics(true)
        .build()
        .unwrap();
    for k in 0..keys {
        let spent = (0..150).filter(|_| limiter.check(&k).is_allowed()).count();
        assert_eq!(spent, 100);
    }

    // Hammer every key from four threads while `switch` runs; returns the admissions.
    let hammer_during = |switch: &(dyn Fn() + Sync)| -> u64 {
        let admitted = AtomicU64::new(0);
        let go = Barrier::new(THREADS + 1);
        thread::scope(|s| {
            for t in 0..THREADS as u64 {
                let (limiter, admitted, go) = (&limiter, &admitted, &go);
                s.spawn(move || {
                    go.wait();
                    for round in 0..200 {
                        let k = (round + t * 16) % keys;
                        admitted
                            .fetch_add(limiter.check(&k).is_allowed() as u64, Ordering::Relaxed);
                    }
                });
            }
            go.wait();
            switch();
        });
        admitted.into_inner()
    };

    // Tighten at t = 0: every key is spent under both quotas, so nothing is admitted, before
    // or after the switch (a reset would have admitted 5 per key).
    let admitted = hammer_during(&|| {
        assert_eq!(limiter.reconfigure(new).unwrap(), old);
    });
    assert_eq!(admitted, 0);
    assert_eq!(limiter.metrics().keys, keys);
    assert_eq!(limiter.algorithm().get(), new);

    // 300 ms later no key has a token: its debt (1 s under the old quota) is kept whole, not
    // clamped to a spent new bucket (500 ms, which would admit 3) nor reset (5). The new
    // quota admits once the debt is within its burst: at 600 ms.
    clock.advance(Duration::from_millis(300));
    for k in 0..keys {
        let got = (0..10).filter(|_| limiter.check(&k).is_allowed()).count();
        assert_eq!(got, 0, "key {k}");
    }

    // Loosen under load at t = 300 ms: each key's state (spent to 1 s) is kept, so each key
    // gets exactly (300 ms + 1 s − 1 s) / 10 ms = 30, not 100.
    let admitted = hammer_during(&|| {
        limiter.reconfigure(old).unwrap();
    });
    let rest: u64 = (0..keys)
        .map(|k| (0..100).filter(|_| limiter.check(&k).is_allowed()).count() as u64)
        .sum();
    assert_eq!(admitted + rest, 30 * keys);
    assert_eq!(limiter.metrics().keys, keys);
    let m = limiter.metrics();
    assert_eq!(m.allowed, 100 * keys + 30 * keys);

    // Tighten while the hammering writes: fresh keys are being spent under the old quota as
    // the switch happens, so some requests step under the old quota and write after the walk
    // passed their key. Each key's debt is at most the old quota's second, so 1 s later (all
    // of it paid) every key takes exactly the new burst, 5.
    let fresh_keys = || 1_000..1_000 + keys;
    let admitted = AtomicU64::new(0);
    let go = Barrier::new(THREADS + 1);
    thread::scope(|s| {
        for t in 0..THREADS as u64 {
            let (limiter, admitted, go) = (&limiter, &admitted, &go);
            s.spawn(move || {
                go.wait();
                for round in 0..2_000 {
                    let k = 1_000 + (round + t * 16) % keys;
                    admitted.fetch_add(limiter.check(&k).is_allowed() as u64, Ordering::Relaxed);
                }
            });
        }
        go.wait();
        limiter.reconfigure(new).unwrap();
    });
    // Never more than the old quota's burst per key, whatever the interleaving.
    assert!(admitted.into_inner() <= 100 * keys);
    clock.advance(Duration::from_secs(1));
    for k in fresh_keys() {
        let got = (0..10).filter(|_| limiter.check(&k).is_allowed()).count();
        assert_eq!(got, 5, "key {k}");
    }
    assert_eq!(limiter.metrics().keys, 2 * keys);
}

// Pins G27, G33.
#[test]
fn reconfiguration_under_load_keeps_every_key_and_its_state() {
    reconfiguration_under_load::<hotlimit::store::Cas>();
    reconfiguration_under_load::<Locked>();
}

// Pins G33.
#[test]
fn reconfiguration_refuses_a_change_of_meaning_and_changes_nothing() {
    let r = |n| Rate::new(n, Duration::from_secs(1)).unwrap();
    let e = Earrrl::new(Duration::from_secs(1), r(2.0)).unwrap();
    let l = CasLimiter::<u64, _, _>::with_clock(Live::new(e), ManualClock::default());
    let _ = l.check(&1);
    let other = Earrrl::new(Duration::from_secs(9), r(2.0)).unwrap();
    let err = l.reconfigure(other).unwrap_err();
    assert_eq!(err.field(), hotlimit::Field::HalfLife);
    assert_eq!(l.algorithm().get(), e);
    // The limit can change; the measured rate is kept.
    let before = l.request(&1).peek().unwrap();
    l.reconfigure(Earrrl::new(Duration::from_secs(1), r(0.5)).unwrap())
        .unwrap();
    assert_eq!(l.request(&1).peek().unwrap().rate(), before.rate());
    assert!(l.request(&1).peek().unwrap().is_denied()); // rate 0.69/s > 0.5/s

    let d = DirectLimiter::<_, _>::with_clock(
        Live::new("10/s burst 10".parse::<Gcra>().unwrap()),
        ManualClock::default(),
    );
    assert_eq!((0..20).filter(|_| d.check(&()).is_allowed()).count(), 10);
    d.reconfigure("1/s burst 2".parse().unwrap()).unwrap();
    // The debt is kept as time: 1 s, half of the new 2 s bucket, so one more is allowed.
    assert!(d.check(&()).is_allowed());
    assert_eq!(d.check(&()).retry_after(), Duration::from_secs(1));
}

// ---------------------------------------------------------------------------------------------
// metrics

fn metrics_equal_decisions<V: Variant<Gcra>>() {
    let clock = ManualClock::default();
    let limiter = Limiter::<Map<u64, Gcra, _, V>>::builder("100/s burst 20".parse().unwrap())
        .clock(clock.clone())
        .sweep_grace(Duration::ZERO)
        .metrics(true)
        .build()
        .unwrap();
    let (allowed, denied) = (AtomicU64::new(0), AtomicU64::new(0));
    thread::scope(|s| {
        for t in 0..THREADS as u64 {
            let (limiter, allowed, denied) = (&limiter, &allowed, &denied);
            s.spawn(move || {
                for i in 0..20_000u64 {
                    let key = (i * 7 + t) % 500;
                    let counter = if limiter.check(&key).is_allowed() {
                        allowed
                    } else {
                        denied
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    if i % 5_000 == 0 {
                        let _ = limiter.request(&key).peek().unwrap(); // not a decision: not counted
                    }
                }
            });
        }
    });
    let m = limiter.metrics();
    assert_eq!(m.allowed, allowed.load(Ordering::Relaxed));
    assert_eq!(m.denied, denied.load(Ordering::Relaxed));
    assert_eq!(m.allowed + m.denied, THREADS as u64 * 20_000);
    assert_eq!(m.keys, 500);
    clock.advance(Duration::from_secs(1));
    let report = limiter.sweep();
    let m = limiter.metrics();
    assert_eq!(
        (m.sweeps, m.evicted_idle, m.keys),
        (1, report.evicted_idle, 0)
    );
    assert_eq!(report.evicted_idle, 500);
}

// Pins G34.
#[test]
fn metrics_totals_equal_the_decisions_returned() {
    metrics_equal_decisions::<hotlimit::store::Cas>();
    metrics_equal_decisions::<Locked>();
    // Off by default: decisions are not counted, the rest is.
    let l =
        CasLimiter::<u64, _, _>::with_clock("1/s".parse::<Gcra>().unwrap(), ManualClock::default());
    let _ = l.check(&1);
    let _ = l.check(&1);
    let m = l.metrics();
    assert_eq!((m.allowed, m.denied, m.keys), (0, 0, 1));
    let d = DirectLimiter::<Gcra>::builder("1/s".parse().unwrap())
        .clock(ManualClock::default())
        .metrics(true)
        .build()
        .unwrap();
    let _ = d.check(&());
    let _ = d.check(&());
    assert_eq!((d.metrics().allowed, d.metrics().denied), (1, 1));
}

// ---------------------------------------------------------------------------------------------
// waiting

fn until_ready_on<V: Variant<Gcra>>() {
    let clock = ManualClock::default();
    let l = Limiter::<Map<String, Gcra, _, V>>::builder("4/s burst 2".parse().unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    // Blocking, on the manual clock: two immediate, then one every 250 ms exactly.
    for want_ms in [0, 0, 250, 500, 750] {
        assert!(l.request("k").until_ready_blocking().unwrap().is_allowed());
        assert_eq!(clock.now(), want_ms * 1_000_000);
    }
    // Async with a caller's sleep; a cost of 2 waits for two intervals.
    let sleep = |d: Duration| {
        clock.advance(d);
        std::future::ready(())
    };
    let d = block_on(l.request("k").cost(2).until_ready(sleep)).unwrap();
    assert!(d.is_allowed());
    assert_eq!(clock.now(), 1_250_000_000);
    // A cost that can never be admitted errors at once, without waiting.
    let err = block_on(l.request("k").cost(3).until_ready(sleep)).unwrap_err();
    assert_eq!(
        err,
        hotlimit::QuotaError::ExceedsCapacity {
            cost: 3,
            capacity: 2
        }
    );
    assert_eq!(clock.now(), 1_250_000_000);
    // Jitter only ever delays, by at most its maximum.
    let jitter = Duration::from_millis(40);
    for _ in 0..20 {
        let before = clock.now();
        let honest = before + l.request("k").peek().unwrap().retry_after().as_nanos() as u64;
        let _ = l
            .request("k")
            .jitter(jitter)
            .until_ready_blocking()
            .unwrap();
        assert!((honest..=honest + 40_000_000).contains(&clock.now()));
    }
    assert!(block_on(l.request("k").until_ready(sleep))
        .unwrap()
        .is_allowed());
}

// Pins G15.
#[test]
fn until_ready_waits_exactly_the_honest_time() {
    until_ready_on::<hotlimit::store::Cas>();
    until_ready_on::<Locked>();
    let clock = ManualClock::default();
    let d =
        DirectLimiter::<_, _>::with_clock("2/s burst 1".parse::<Gcra>().unwrap(), clock.clone());
    assert!(d.request(&()).until_ready_blocking().unwrap().is_allowed());
    let _ = d.request(&()).until_ready_blocking().unwrap();
    assert_eq!(clock.now(), 500_000_000);
    let sleep = |t: Duration| {
        clock.advance(t);
        std::future::ready(())
    };
    assert!(block_on(d.request(&()).until_ready(sleep))
        .unwrap()
        .is_allowed());
    assert_eq!(clock.now(), 1_000_000_000);
}

/// A strict EARRRL client that waits is not punished for waiting: `until_ready` peeks, so its
/// wait is what the rate's decay takes, while a client that retries by `check` pushes its own
/// wait further each time.
// Pins G15.
#[test]
fn until_ready_under_a_strict_policy_is_not_counted_while_waiting() {
    let e = Earrrl::new(
        Duration::from_secs(1),
        Rate::new(2.0, Duration::from_secs(1)).unwrap(),
    )
    .unwrap();
    let clock = ManualClock::default();
    let l = MutexLimiter::<u64, _, _>::with_clock(e, clock.clone());
    while l.check(&1).is_allowed() {}
    let waiting = l.request(&1).peek().unwrap().retry_after().as_nanos() as u64;
    let start = clock.now();
    assert!(l.request(&1).until_ready_blocking().unwrap().is_allowed());
    assert_eq!(clock.now() - start, waiting);
}

/// Four threads wait on one key at once, each sleeping on the shared manual clock (which each
/// sleep moves). Every wait ends allowed, and together they never get more than the quota
/// allows by the time they are done: `burst + elapsed/T`.
// Pins G1, G15.
#[test]
fn concurrent_waiters_never_over_admit() {
    fn run<V: Variant<Gcra>>() {
        let g: Gcra = "100/s burst 5".parse().unwrap();
        let clock = ManualClock::default();
        let l = Limiter::<Map<u64, Gcra, _, V>>::builder(g)
            .clock(clock.clone())
            .metrics(true)
            .build()
            .unwrap();
        thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..200 {
                        assert!(l.request(&1).until_ready_blocking().unwrap().is_allowed());
                    }
                });
            }
        });
        let m = l.metrics();
        assert_eq!(m.allowed, THREADS as u64 * 200);
        assert!(m.allowed <= gcra_bound(&g, clock.now()));
    }
    run::<hotlimit::store::Cas>();
    run::<Locked>();
}

/// A waiter whose cost a live reconfiguration makes impossible stops with the cost error
/// instead of waiting forever.
// Pins G15.
#[test]
fn a_wait_ends_when_a_reconfiguration_makes_its_cost_impossible() {
    let clock = ManualClock::default();
    let l = CasLimiter::<u64, _, _>::with_clock(
        Live::new("10/s burst 5".parse::<Gcra>().unwrap()),
        clock.clone(),
    );
    let _ = l.check_n(&1, 5).unwrap();
    let sleeps = std::cell::Cell::new(0);
    let sleep = |d: Duration| {
        if sleeps.replace(sleeps.get() + 1) == 0 {
            l.reconfigure("10/s burst 2".parse().unwrap()).unwrap();
        }
        clock.advance(d);
        std::future::ready(())
    };
    let got = block_on(l.request(&1).cost(4).until_ready(sleep));
    assert_eq!(
        got,
        Err(hotlimit::QuotaError::ExceedsCapacity {
            cost: 4,
            capacity: 2
        })
    );
    assert_eq!(sleeps.get(), 1);
}

/// A reference to a limiter is a `RateLimiter` (to a `dyn` one, in a `Box` or an `Arc`,
/// too), and so an `AsyncRateLimiter`: each decides on the one limiter's state.
#[test]
fn a_reference_to_a_limiter_is_a_limiter() {
    use hotlimit::{AsyncRateLimiter, RateLimiter};
    fn checks<L: RateLimiter<str>>(l: L) -> bool {
        l.check("k").is_allowed()
    }
    fn checks_async<L: AsyncRateLimiter<str>>(l: L) -> bool {
        // In memory, the future is ready at its first poll.
        let mut waker = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::Pin::new(&mut l.check_n_async("k", 1)).poll(&mut waker) {
            std::task::Poll::Ready(d) => d.unwrap().is_allowed(),
            std::task::Poll::Pending => unreachable!("in memory: decided at once"),
        }
    }
    let gcra: Gcra = "1/s burst 6".parse().unwrap();
    let limiter = Arc::new(CasLimiter::<String, _, _>::with_clock(
        gcra,
        ManualClock::default(),
    ));
    let as_dyn: Arc<dyn RateLimiter<str>> = limiter.clone();
    let boxed: Box<dyn RateLimiter<str>> = Box::new(CasLimiter::<String, Gcra>::new(gcra));
    assert!(checks(&*limiter));
    assert!(checks(&*as_dyn));
    let reference: &CasLimiter<String, Gcra, ManualClock> = &limiter;
    assert!(checks(reference));
    assert!(checks_async(&*as_dyn));
    assert!(checks_async(&*limiter));
    assert!(checks(&*boxed));
    // The sixth on the one state (the boxed limiter is another) is admitted, the seventh not.
    assert!(checks(&*limiter));
    assert!(!checks_async(&*as_dyn));
    assert_eq!(limiter.metrics().keys, 1);
}

/// Behind an `Arc` or a `Box`, with every limiter trait in scope, a limiter's own `check(key)`
/// is what `check` calls: `Requests` is implemented for `Arc<L>` and `Box<L>`, so a method of
/// that name there would shadow it (its check is `decide`).
#[test]
fn an_arc_or_a_box_checks_with_every_trait_in_scope() {
    #[allow(unused_imports)]
    use hotlimit::{AsyncRateLimiter, RateLimiter, Requests};
    let gcra: Gcra = "1/s burst 2".parse().unwrap();
    let arc = Arc::new(CasLimiter::<String, _, _>::with_clock(
        gcra,
        ManualClock::default(),
    ));
    let boxed = Box::new(CasLimiter::<String, _, _>::with_clock(
        gcra,
        ManualClock::default(),
    ));
    assert!(arc.check("k").is_allowed());
    assert!(boxed.check("k").is_allowed());
    assert!(arc.check_n("k", 1).unwrap().is_allowed());
    assert!(arc.check("k").is_denied());
    // A request reaches the same state.
    assert!(arc.request("k").peek().unwrap().is_denied());
    assert_eq!(boxed.request("k").peek().unwrap().remaining(), Some(0));
}
