//! Every store offers the same operations under the same names and meanings: one generic test
//! body per operation, run over the papaya store (CAS and mutex), the compact store (CAS and
//! mutex) and the direct limiter (CAS and mutex).
//!
//! The `Store` traits below are the test's view of a limiter. Their impls are written once, by
//! a macro that calls each store's *inherent* methods by name (`check`, `check_n`, `peek`,
//! `peek_n`, `until_ready`, `until_ready_with`, `until_ready_blocking`,
//! `until_ready_blocking_with`, `reserve`, `reconfigure`, `metrics`, and for keyed stores
//! `sweep`, `len`, `max_keys`, `sweep_every`), so a store that lacks one, or names or types it
//! differently, does not compile. The generic tests then assert that every store gives the
//! same exact answers.

use hotlimit::algo::{Algorithm, Gcra, Reservation};
use hotlimit::store::{Cas, Locked, SweepReport};
use hotlimit::{
    CasLimiter, Clock, CompactLimiter, ConfigError, CostError, Decision, DirectLimiter, Jitter,
    Live, ManualClock, Metrics, MutexLimiter,
};
use std::future::Future;
use std::time::Duration;

const MS: u64 = 1_000_000;

/// Runs a future whose sleeps are a manual clock's advances (always ready).
fn block_on<F: Future>(f: F) -> F::Output {
    struct Noop;
    impl std::task::Wake for Noop {
        fn wake(self: std::sync::Arc<Self>) {}
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Noop));
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(out) =
            f.as_mut().poll(&mut std::task::Context::from_waker(&waker))
        {
            return out;
        }
    }
}

/// The operations of every store over GCRA (the direct limiter ignores the key).
trait Store {
    fn check(&self, key: u64) -> Decision;
    fn check_n(&self, key: u64, cost: u64) -> Result<Decision, CostError>;
    fn peek(&self, key: u64) -> Decision;
    fn peek_n(&self, key: u64, cost: u64) -> Result<Decision, CostError>;
    /// `until_ready` with a sleep that advances `clock`.
    fn until_ready(&self, key: u64, clock: &ManualClock) -> Decision;
    fn until_ready_with(
        &self,
        key: u64,
        cost: u64,
        clock: &ManualClock,
    ) -> Result<Decision, CostError>;
    fn until_ready_blocking(&self, key: u64) -> Decision;
    fn until_ready_blocking_with(&self, key: u64, cost: u64) -> Result<Decision, CostError>;
    fn reserve(&self, key: u64, cost: u64, max_wait: Duration) -> Result<Reservation, CostError>;
    fn metrics(&self) -> Metrics;
}

/// The same store over `Live<Gcra>`.
trait LiveStore {
    fn check(&self, key: u64) -> Decision;
    fn peek(&self, key: u64) -> Decision;
    fn reconfigure(&self, new: Gcra) -> Result<Gcra, ConfigError>;
}

/// What the keyed stores add.
trait Keyed {
    fn check(&self, key: u64) -> Decision;
    fn sweep(&self) -> SweepReport;
    fn len(&self) -> usize;
    fn max_keys(&self) -> Option<usize>;
    fn sweep_every(&self) -> Option<Duration>;
}

/// `Store` and `LiveStore` for a limiter type, calling its inherent methods with `$key(k)` as
/// the key argument list (`&k` for keyed stores, nothing for the direct one).
macro_rules! store {
    ($ty:ty, $live:ty, |$k:ident| $($key:expr)?) => {
        impl Store for $ty {
            fn check(&self, $k: u64) -> Decision {
                <$ty>::check(self $(, $key)?)
            }
            fn check_n(&self, $k: u64, cost: u64) -> Result<Decision, CostError> {
                <$ty>::check_n(self, $($key,)? cost)
            }
            fn peek(&self, $k: u64) -> Decision {
                <$ty>::peek(self $(, $key)?)
            }
            fn peek_n(&self, $k: u64, cost: u64) -> Result<Decision, CostError> {
                <$ty>::peek_n(self, $($key,)? cost)
            }
            fn until_ready(&self, $k: u64, clock: &ManualClock) -> Decision {
                let sleep = |d| {
                    clock.advance(d);
                    std::future::ready(())
                };
                block_on(<$ty>::until_ready(self, $($key,)? sleep))
            }
            fn until_ready_with(
                &self,
                $k: u64,
                cost: u64,
                clock: &ManualClock,
            ) -> Result<Decision, CostError> {
                let sleep = |d| {
                    clock.advance(d);
                    std::future::ready(())
                };
                block_on(<$ty>::until_ready_with(self, $($key,)? cost, Jitter::NONE, sleep))
            }
            fn until_ready_blocking(&self, $k: u64) -> Decision {
                <$ty>::until_ready_blocking(self $(, $key)?)
            }
            fn until_ready_blocking_with(
                &self,
                $k: u64,
                cost: u64,
            ) -> Result<Decision, CostError> {
                <$ty>::until_ready_blocking_with(self, $($key,)? cost, Jitter::NONE)
            }
            fn reserve(
                &self,
                $k: u64,
                cost: u64,
                max_wait: Duration,
            ) -> Result<Reservation, CostError> {
                <$ty>::reserve(self, $($key,)? cost, max_wait)
            }
            fn metrics(&self) -> Metrics {
                <$ty>::metrics(self)
            }
        }

        impl LiveStore for $live {
            fn check(&self, $k: u64) -> Decision {
                <$live>::check(self $(, $key)?)
            }
            fn peek(&self, $k: u64) -> Decision {
                <$live>::peek(self $(, $key)?)
            }
            fn reconfigure(&self, new: Gcra) -> Result<Gcra, ConfigError> {
                <$live>::reconfigure(self, new)
            }
        }
    };
}

/// `Keyed` for a keyed limiter type.
macro_rules! keyed {
    ($($ty:ty),*) => {$(
        impl Keyed for $ty {
            fn check(&self, k: u64) -> Decision {
                <$ty>::check(self, &k)
            }
            fn sweep(&self) -> SweepReport {
                <$ty>::sweep(self)
            }
            fn len(&self) -> usize {
                <$ty>::len(self)
            }
            fn max_keys(&self) -> Option<usize> {
                <$ty>::max_keys(self)
            }
            fn sweep_every(&self) -> Option<Duration> {
                <$ty>::sweep_every(self)
            }
        }
    )*};
}

type CasGcra = CasLimiter<u64, Gcra, ManualClock>;
type MutexGcra = MutexLimiter<u64, Gcra, ManualClock>;
type CompactGcra = CompactLimiter<u64, Gcra, ManualClock, Cas>;
type CompactMutexGcra = CompactLimiter<u64, Gcra, ManualClock, Locked>;
type DirectGcra = DirectLimiter<Gcra, ManualClock, Cas>;
type DirectMutexGcra = DirectLimiter<Gcra, ManualClock, Locked>;

store!(CasGcra, CasLimiter<u64, Live<Gcra>, ManualClock>, |k| &k);
store!(MutexGcra, MutexLimiter<u64, Live<Gcra>, ManualClock>, |k| &k);
store!(CompactGcra, CompactLimiter<u64, Live<Gcra>, ManualClock, Cas>, |k| &k);
store!(CompactMutexGcra, CompactLimiter<u64, Live<Gcra>, ManualClock, Locked>, |k| &k);
store!(
    DirectGcra,
    DirectLimiter<Live<Gcra>, ManualClock, Cas>,
    |_k| &()
);
store!(
    DirectMutexGcra,
    DirectLimiter<Live<Gcra>, ManualClock, Locked>,
    |_k| &()
);
keyed!(CasGcra, MutexGcra, CompactGcra, CompactMutexGcra);

/// Builds every store the same way, through its one builder shape: `$algo` on `$clock`, with
/// decisions counted, and for the keyed stores `max_keys(100)` and a sweep grace of zero.
macro_rules! every_store {
    ($algo:expr, $clock:expr, $as:ty) => {{
        let (algo, clock) = ($algo, $clock);
        let stores: Vec<(&str, Box<$as>)> = vec![
            (
                "cas",
                Box::new(keyed_build!(CasLimiter::<u64, _>, algo, clock)),
            ),
            (
                "mutex",
                Box::new(keyed_build!(MutexLimiter::<u64, _>, algo, clock)),
            ),
            (
                "compact",
                Box::new(keyed_build!(CompactLimiter::<u64, _, _, Cas>, algo, clock)),
            ),
            (
                "compact-mutex",
                Box::new(keyed_build!(
                    CompactLimiter::<u64, _, _, Locked>,
                    algo,
                    clock
                )),
            ),
            (
                "direct",
                Box::new(
                    DirectLimiter::<_, _, Cas>::builder(algo.clone())
                        .clock(clock.clone())
                        .metrics(true)
                        .build()
                        .unwrap(),
                ),
            ),
            (
                "direct-mutex",
                Box::new(
                    DirectLimiter::<_, _, Locked>::builder(algo.clone())
                        .clock(clock.clone())
                        .metrics(true)
                        .build()
                        .unwrap(),
                ),
            ),
        ];
        stores
    }};
}

macro_rules! keyed_build {
    ($ty:ty, $algo:expr, $clock:expr) => {
        <$ty>::builder($algo.clone())
            .clock($clock.clone())
            .metrics(true)
            .max_keys(100)
            .sweep_grace(Duration::ZERO)
            .build()
            .unwrap()
    };
}

fn gcra(quota: &str) -> Gcra {
    quota.parse().unwrap()
}

#[test]
fn check_and_peek_decide_alike_everywhere() {
    let clock = ManualClock::new();
    for (name, s) in every_store!(gcra("10/s burst 2"), clock.clone(), dyn Store) {
        assert!(s.peek(7).is_allowed(), "{name}");
        assert!(
            s.peek_n(7, 2).unwrap().is_allowed(),
            "{name}: peeks count nothing"
        );
        assert!(s.check(7).is_allowed(), "{name}");
        assert!(s.check_n(7, 1).unwrap().is_allowed(), "{name}");
        let denied = s.check(7);
        assert_eq!(denied.retry_after_nanos(), 100 * MS, "{name}");
        assert_eq!(s.peek(7).retry_after_nanos(), 100 * MS, "{name}");
        assert_eq!(s.check_n(7, 0), Err(CostError::Zero), "{name}");
        assert_eq!(
            s.peek_n(7, 3),
            Err(CostError::ExceedsCapacity {
                cost: 3,
                capacity: 2
            }),
            "{name}"
        );
        let m = s.metrics();
        assert_eq!(
            (m.allowed, m.denied),
            (2, 1),
            "{name}: errors and peeks uncounted"
        );
    }
}

#[test]
fn the_waits_end_at_the_honest_time_everywhere() {
    // One clock per store: each wait moves its own clock.
    for i in 0..6 {
        let clock = ManualClock::new();
        let (name, s) = every_store!(gcra("10/s burst 1"), clock.clone(), dyn Store).swap_remove(i);
        assert!(s.check(1).is_allowed(), "{name}");
        assert!(s.until_ready_blocking(1).is_allowed(), "{name}");
        assert_eq!(clock.now(), 100 * MS, "{name}");
        assert!(s.until_ready(1, &clock).is_allowed(), "{name}");
        assert_eq!(clock.now(), 200 * MS, "{name}");
        assert!(
            s.until_ready_blocking_with(1, 1).unwrap().is_allowed(),
            "{name}"
        );
        assert_eq!(clock.now(), 300 * MS, "{name}");
        assert!(
            s.until_ready_with(1, 1, &clock).unwrap().is_allowed(),
            "{name}"
        );
        assert_eq!(clock.now(), 400 * MS, "{name}");
        assert_eq!(
            s.until_ready_with(1, 2, &clock),
            Err(CostError::ExceedsCapacity {
                cost: 2,
                capacity: 1
            }),
            "{name}"
        );
        assert_eq!(
            s.until_ready_blocking_with(1, 0),
            Err(CostError::Zero),
            "{name}"
        );
        assert_eq!(
            clock.now(),
            400 * MS,
            "{name}: a refused wait sleeps nothing"
        );
        let m = s.metrics();
        assert_eq!(
            (m.allowed, m.denied),
            (5, 0),
            "{name}: waiting is never a denial"
        );
    }
}

#[test]
fn reserve_paces_alike_everywhere() {
    let clock = ManualClock::new();
    for (name, s) in every_store!(gcra("10/s burst 1"), clock.clone(), dyn Store) {
        let wait = Duration::from_millis(150);
        let delays: Vec<_> = (0..3).map(|_| s.reserve(3, 1, wait)).collect();
        // What the pure algorithm answers for the same three reservations.
        let g = gcra("10/s burst 1");
        let mut tat = g.fresh();
        let want: Vec<_> = (0..3)
            .map(|_| {
                let (r, new) = g.reserve(tat, 0, 1, 150 * MS);
                tat = new.unwrap_or(tat);
                Ok(r)
            })
            .collect();
        assert_eq!(delays, want, "{name}");
        assert_eq!(
            delays[..2],
            [
                Ok(Reservation::Admitted {
                    delay: Duration::ZERO
                }),
                Ok(Reservation::Admitted {
                    delay: Duration::from_millis(100)
                }),
            ],
            "{name}"
        );
        assert!(
            matches!(delays[2], Ok(Reservation::Denied { .. })),
            "{name}"
        );
        assert_eq!(s.reserve(3, 0, wait), Err(CostError::Zero), "{name}");
        let m = s.metrics();
        assert_eq!((m.allowed, m.denied), (2, 1), "{name}");
    }
}

#[test]
fn reconfigure_keeps_the_state_everywhere() {
    let clock = ManualClock::new();
    let live = Live::new(gcra("100/s burst 100"));
    for (name, s) in every_store!(live, clock.clone(), dyn LiveStore) {
        let allowed = (0..150).filter(|_| s.check(9).is_allowed()).count();
        assert_eq!(allowed, 100, "{name}");
        assert_eq!(
            s.reconfigure(gcra("10/s burst 5")),
            Ok(gcra("100/s burst 100")),
            "{name}"
        );
        // Spent under the old quota, still spent under the new one: a second of debt, of
        // which the new burst covers 500 ms (a switch never hands budget back).
        assert!(s.check(9).is_denied(), "{name}");
        assert_eq!(s.peek(9).retry_after_nanos(), 600 * MS, "{name}");
    }
}

#[test]
fn keyed_stores_sweep_and_report_alike() {
    let clock = ManualClock::new();
    let stores: Vec<(&str, Box<dyn Keyed>)> = vec![
        (
            "cas",
            Box::new(keyed_build!(CasLimiter::<u64, _>, gcra("10/s"), clock)),
        ),
        (
            "mutex",
            Box::new(keyed_build!(MutexLimiter::<u64, _>, gcra("10/s"), clock)),
        ),
        (
            "compact",
            Box::new(keyed_build!(
                CompactLimiter::<u64, _, _, Cas>,
                gcra("10/s"),
                clock
            )),
        ),
        (
            "compact-mutex",
            Box::new(keyed_build!(
                CompactLimiter::<u64, _, _, Locked>,
                gcra("10/s"),
                clock
            )),
        ),
    ];
    for (name, s) in &stores {
        for k in 0..10 {
            let _ = s.check(k);
        }
        assert_eq!(s.len(), 10, "{name}");
        assert_eq!(s.max_keys(), Some(100), "{name}");
        assert_eq!(s.sweep_every(), None, "{name}");
    }
    clock.advance(Duration::from_millis(100));
    for (name, s) in &stores {
        assert_eq!(s.sweep().evicted_idle, 10, "{name}");
        assert_eq!(s.len(), 0, "{name}");
    }
}

#[test]
fn sweep_every_is_reported_by_every_keyed_store() {
    let every = Duration::from_secs(3600);
    let g = gcra("10/s");
    let cas = CasLimiter::<u64, Gcra>::builder(g)
        .sweep_every(every)
        .build()
        .unwrap();
    let compact = CompactLimiter::<u64, Gcra>::builder(g)
        .sweep_every(every)
        .build()
        .unwrap();
    assert_eq!(cas.sweep_every(), Some(every));
    assert_eq!(compact.sweep_every(), Some(every));
    assert_eq!(CasLimiter::<u64, Gcra>::new(g).max_keys(), None);
    assert_eq!(
        CompactLimiter::<u64, Gcra>::new(g).max_keys(),
        Some(hotlimit::store::DEFAULT_MAX_KEYS)
    );
}
