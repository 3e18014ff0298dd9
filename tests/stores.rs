//! Every store answers every operation alike: one generic test body per operation, run over
//! the papaya store (CAS and mutex), the compact store (CAS and mutex) and the single cell
//! (CAS and mutex).
//!
//! The operations are written once, on [`Limiter`], whatever its store; the `Store` trait
//! below is the test's view of one limiter and its key (the single cell's is `()`), with one
//! generic impl over every store. The tests then assert that every store gives the same
//! exact answers.

mod common;

use common::id::Id;
use hotlimit::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, Reservation, SlidingLog, SlidingWindow,
    SubWindow,
};
use hotlimit::store::{Cas, Keys, Locked};
use hotlimit::QuotaError;
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{
    CasLimiter, Clock, CompactLimiter, ConfigError, Decision, DirectLimiter, Limiter, Live,
    ManualClock, Metrics, MutexLimiter, Policy,
};
use std::future::Future;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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

/// A store's key from the test's `u64` (the single cell's is `()`).
trait Key: 'static {
    fn of(k: u64) -> Self;
}

impl Key for u64 {
    fn of(k: u64) -> Self {
        k
    }
}

impl Key for () {
    fn of(_: u64) -> Self {}
}

impl Key for Id {
    fn of(k: u64) -> Self {
        Id(k)
    }
}

/// A limiter over store `S`, asked for keys of type `Q`.
struct On<S: hotlimit::store::Store, Q>(Limiter<S>, PhantomData<fn(Q)>);

fn on<S: hotlimit::store::Store, Q>(limiter: Limiter<S>) -> On<S, Q> {
    On(limiter, PhantomData)
}

/// The operations of every store over GCRA (the direct limiter ignores the key).
trait Store {
    fn check(&self, key: u64) -> Decision;
    fn check_n(&self, key: u64, cost: u64) -> Result<Decision, QuotaError>;
    fn peek(&self, key: u64) -> Result<Decision, QuotaError>;
    fn peek_n(&self, key: u64, cost: u64) -> Result<Decision, QuotaError>;
    /// `until_ready` with a sleep that advances `clock`, of `cost` (and jitter none).
    fn until_ready(&self, key: u64, cost: u64, clock: &ManualClock)
        -> Result<Decision, QuotaError>;
    fn until_ready_blocking(&self, key: u64, cost: u64) -> Result<Decision, QuotaError>;
    fn reserve(&self, key: u64, cost: u64, max_wait: Duration) -> Result<Reservation, QuotaError>;
    fn metrics(&self) -> Metrics;
}

impl<S, Q> Store for On<S, Q>
where
    S: Keys<Q> + hotlimit::store::Store<Algo = Gcra> + Send + Sync,
    Q: Key,
{
    fn check(&self, key: u64) -> Decision {
        self.0.check(&Q::of(key))
    }
    fn check_n(&self, key: u64, cost: u64) -> Result<Decision, QuotaError> {
        self.0.check_n(&Q::of(key), cost)
    }
    fn peek(&self, key: u64) -> Result<Decision, QuotaError> {
        self.0.request(&Q::of(key)).peek()
    }
    fn peek_n(&self, key: u64, cost: u64) -> Result<Decision, QuotaError> {
        self.0.request(&Q::of(key)).cost(cost).peek()
    }
    fn until_ready(
        &self,
        key: u64,
        cost: u64,
        clock: &ManualClock,
    ) -> Result<Decision, QuotaError> {
        let sleep = |d| {
            clock.advance(d);
            std::future::ready(())
        };
        let key = Q::of(key);
        block_on(
            self.0
                .request(&key)
                .cost(cost)
                .jitter(Duration::ZERO)
                .until_ready(sleep),
        )
    }
    fn until_ready_blocking(&self, key: u64, cost: u64) -> Result<Decision, QuotaError> {
        self.0
            .request(&Q::of(key))
            .cost(cost)
            .until_ready_blocking()
    }
    fn reserve(&self, key: u64, cost: u64, max_wait: Duration) -> Result<Reservation, QuotaError> {
        self.0.request(&Q::of(key)).cost(cost).reserve(max_wait)
    }
    fn metrics(&self) -> Metrics {
        self.0.metrics()
    }
}

/// The same store over `Live<Gcra>`.
trait LiveStore {
    fn check(&self, key: u64) -> Decision;
    fn peek(&self, key: u64) -> Decision;
    fn reconfigure(&self, new: Gcra) -> Result<Gcra, ConfigError>;
}

impl<S, Q> LiveStore for On<S, Q>
where
    S: Keys<Q> + hotlimit::store::Store<Algo = Live<Gcra>> + Send + Sync,
    Q: Key,
{
    fn check(&self, key: u64) -> Decision {
        self.0.check(&Q::of(key))
    }
    fn peek(&self, key: u64) -> Decision {
        self.0.request(&Q::of(key)).peek().unwrap()
    }
    fn reconfigure(&self, new: Gcra) -> Result<Gcra, ConfigError> {
        self.0.reconfigure(new)
    }
}

/// What the keyed stores add.
trait Keyed {
    fn check(&self, key: u64) -> Decision;
    fn sweep(&self) -> Metrics;
    fn len(&self) -> usize;
}

impl<S: Keys<Q> + hotlimit::store::Store + Send + Sync, Q: Key> Keyed for On<S, Q> {
    fn check(&self, key: u64) -> Decision {
        RateLimiter::check(&self.0, &Q::of(key))
    }
    fn sweep(&self) -> Metrics {
        Limiter::sweep(&self.0)
    }
    fn len(&self) -> usize {
        self.0.metrics().keys as usize
    }
}

/// Builds every store the same way, through its one builder shape: `$algo` on `$clock`, with
/// decisions counted, and for the keyed stores `max_keys(100)` and a sweep grace of zero.
macro_rules! every_store {
    ($algo:expr, $clock:expr, $as:ty) => {{
        let (algo, clock) = ($algo, $clock);
        let stores: Vec<(&str, Box<$as>)> = vec![
            (
                "cas",
                Box::new(on::<_, Id>(keyed_build!(CasLimiter::<Id, _>, algo, clock))),
            ),
            (
                "mutex",
                Box::new(on::<_, Id>(keyed_build!(
                    MutexLimiter::<Id, _>,
                    algo,
                    clock
                ))),
            ),
            // Bounded maps of `u64` keys: compact tables behind `Map` (GCRA's one word).
            (
                "cas-u64",
                Box::new(on::<_, u64>(keyed_build!(
                    CasLimiter::<u64, _>,
                    algo,
                    clock
                ))),
            ),
            (
                "mutex-u64",
                Box::new(on::<_, u64>(keyed_build!(
                    MutexLimiter::<u64, _>,
                    algo,
                    clock
                ))),
            ),
            // And without a bound: the compact table grown as keys come.
            (
                "cas-u64-unbounded",
                Box::new(on::<_, u64>(keyed_build!(
                    CasLimiter::<u64, _>,
                    algo,
                    clock,
                    unbounded
                ))),
            ),
            (
                "compact",
                Box::new(on::<_, u64>(keyed_build!(
                    CompactLimiter::<u64, _, _, Cas>,
                    algo,
                    clock
                ))),
            ),
            (
                "compact-mutex",
                Box::new(on::<_, u64>(keyed_build!(
                    CompactLimiter::<u64, _, _, Locked>,
                    algo,
                    clock
                ))),
            ),
            (
                "direct",
                Box::new(on::<_, ()>(
                    DirectLimiter::<_, _, Cas>::builder(algo.clone())
                        .clock(clock.clone())
                        .metrics(true)
                        .build()
                        .unwrap(),
                )),
            ),
            (
                "direct-mutex",
                Box::new(on::<_, ()>(
                    DirectLimiter::<_, _, Locked>::builder(algo.clone())
                        .clock(clock.clone())
                        .metrics(true)
                        .build()
                        .unwrap(),
                )),
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
    // Without a bound.
    ($ty:ty, $algo:expr, $clock:expr, unbounded) => {
        <$ty>::builder($algo.clone())
            .clock($clock.clone())
            .metrics(true)
            .sweep_grace(Duration::ZERO)
            .build()
            .unwrap()
    };
}

fn gcra(quota: &str) -> Gcra {
    quota.parse().unwrap()
}

// Pins G2, G17, G28.
#[test]
fn check_and_peek_decide_alike_everywhere() {
    let clock = ManualClock::default();
    for (name, s) in every_store!(gcra("10/s burst 2"), clock.clone(), dyn Store) {
        assert!(s.peek(7).unwrap().is_allowed(), "{name}");
        assert!(
            s.peek_n(7, 2).unwrap().is_allowed(),
            "{name}: peeks count nothing"
        );
        assert!(s.check(7).is_allowed(), "{name}");
        assert!(s.check_n(7, 1).unwrap().is_allowed(), "{name}");
        let denied = s.check(7);
        assert_eq!(denied.retry_after().as_nanos() as u64, 100 * MS, "{name}");
        assert_eq!(
            s.peek(7).unwrap().retry_after().as_nanos() as u64,
            100 * MS,
            "{name}"
        );
        assert_eq!(s.check_n(7, 0), Err(QuotaError::ZeroCost), "{name}");
        assert_eq!(
            s.peek_n(7, 3),
            Err(QuotaError::ExceedsCapacity {
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

// Pins G2, G15.
#[test]
fn the_waits_end_at_the_honest_time_everywhere() {
    // One clock per store: each wait moves its own clock.
    let stores = every_store!(gcra("10/s burst 1"), ManualClock::default(), dyn Store).len();
    for i in 0..stores {
        let clock = ManualClock::default();
        let (name, s) = every_store!(gcra("10/s burst 1"), clock.clone(), dyn Store).swap_remove(i);
        assert!(s.check(1).is_allowed(), "{name}");
        assert!(s.until_ready_blocking(1, 1).unwrap().is_allowed(), "{name}");
        assert_eq!(clock.now(), 100 * MS, "{name}");
        assert!(s.until_ready(1, 1, &clock).unwrap().is_allowed(), "{name}");
        assert_eq!(clock.now(), 200 * MS, "{name}");
        assert!(s.until_ready_blocking(1, 1).unwrap().is_allowed(), "{name}");
        assert_eq!(clock.now(), 300 * MS, "{name}");
        assert!(s.until_ready(1, 1, &clock).unwrap().is_allowed(), "{name}");
        assert_eq!(clock.now(), 400 * MS, "{name}");
        assert_eq!(
            s.until_ready(1, 2, &clock),
            Err(QuotaError::ExceedsCapacity {
                cost: 2,
                capacity: 1
            }),
            "{name}"
        );
        assert_eq!(
            s.until_ready_blocking(1, 0),
            Err(QuotaError::ZeroCost),
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

// Pins G2, G15.
#[test]
fn reserve_paces_alike_everywhere() {
    let clock = ManualClock::default();
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
        assert_eq!(s.reserve(3, 0, wait), Err(QuotaError::ZeroCost), "{name}");
        let m = s.metrics();
        assert_eq!((m.allowed, m.denied), (2, 1), "{name}");
    }
}

// Pins G2, G33.
#[test]
fn reconfigure_keeps_the_state_everywhere() {
    let clock = ManualClock::default();
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
        assert_eq!(
            s.peek(9).retry_after().as_nanos() as u64,
            600 * MS,
            "{name}"
        );
    }
}

// Pins G2, G21.
#[test]
fn keyed_stores_sweep_and_report_alike() {
    let clock = ManualClock::default();
    let g = gcra("10/s");
    let stores: Vec<(&str, Box<dyn Keyed>)> = vec![
        (
            "cas",
            Box::new(on::<_, Id>(keyed_build!(CasLimiter::<Id, _>, g, clock))),
        ),
        (
            "mutex",
            Box::new(on::<_, Id>(keyed_build!(MutexLimiter::<Id, _>, g, clock))),
        ),
        (
            "cas-u64",
            Box::new(on::<_, u64>(keyed_build!(CasLimiter::<u64, _>, g, clock))),
        ),
        (
            "cas-u64-unbounded",
            Box::new(on::<_, u64>(keyed_build!(
                CasLimiter::<u64, _>,
                g,
                clock,
                unbounded
            ))),
        ),
        (
            "compact",
            Box::new(on::<_, u64>(keyed_build!(
                CompactLimiter::<u64, _, _, Cas>,
                g,
                clock
            ))),
        ),
        (
            "compact-mutex",
            Box::new(on::<_, u64>(keyed_build!(
                CompactLimiter::<u64, _, _, Locked>,
                g,
                clock
            ))),
        ),
    ];
    for (name, s) in &stores {
        for k in 0..10 {
            let _ = s.check(k);
        }
        assert_eq!(s.len(), 10, "{name}");
    }
    clock.advance(Duration::from_millis(100));
    for (name, s) in &stores {
        assert_eq!(s.sweep().evicted_idle, 10, "{name}");
        assert_eq!(s.len(), 0, "{name}");
    }
}

/// A map of 64-bit keys (`u64`, `u32`, `Ipv4Addr`) under a one-word state is the compact
/// table, bounded or not, where key and state share one lock-free slot; any other key type or
/// state (a 128-bit one would take a per-slot lock in the table), the papaya map. A limiter
/// shows which.
// Pins G2.
#[test]
fn a_map_of_64_bit_keys_is_the_compact_table() {
    fn table<K, A>(algo: A, bound: Option<usize>) -> String
    where
        K: std::hash::Hash + Eq + Send + Sync + 'static,
        A: Algorithm + std::fmt::Debug,
    {
        let b = CasLimiter::<K, A>::builder(algo).clock(ManualClock::default());
        let b = match bound {
            Some(m) => b.max_keys(m),
            None => b,
        };
        let shown = format!("{:?}", b.build().unwrap());
        let at = shown
            .find("table: \"")
            .expect("the limiter shows its table")
            + 8;
        shown[at..].split('"').next().unwrap().to_string()
    }
    let (g, m) = (gcra("1/s"), Some(100));
    let window = SlidingWindow::new(10, Duration::from_secs(1)).unwrap();
    for (name, bounded, unbounded) in [
        ("u64", table::<u64, _>(g, m), table::<u64, _>(g, None)),
        ("u32", table::<u32, _>(g, m), table::<u32, _>(g, None)),
        (
            "Ipv4Addr",
            table::<Ipv4Addr, _>(g, m),
            table::<Ipv4Addr, _>(g, None),
        ),
    ] {
        assert_eq!(bounded, "compact table", "{name}");
        assert_eq!(unbounded, "compact table", "{name}");
    }
    for (name, bounded) in [
        ("u128", table::<u128, _>(g, m)),
        ("Ipv6Addr", table::<Ipv6Addr, _>(g, m)),
        ("IpAddr", table::<IpAddr, _>(g, m)),
        ("String", table::<String, _>(g, m)),
        ("i64", table::<i64, _>(g, m)),
        ("Id", table::<Id, _>(g, m)),
        ("u64, a 128-bit state", table::<u64, _>(window, m)),
        ("String, unbounded", table::<String, _>(g, None)),
        ("u128, unbounded", table::<u128, _>(g, None)),
    ] {
        assert_eq!(bounded, "papaya map", "{name}");
    }
    let mutex = MutexLimiter::<u64, Gcra>::builder(g)
        .max_keys(100)
        .build()
        .unwrap();
    assert!(format!("{mutex:?}").contains("table: \"compact table\""));
}

/// The compact store is bound by `DEFAULT_MAX_KEYS` unless told otherwise: its table grows to
/// hold that many keys, each one found again, none evicted.
#[test]
fn the_default_compact_table_holds_the_default_bound() {
    let limiter = CompactLimiter::<u64, Gcra>::builder(gcra("1/s"))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let keys = hotlimit::store::DEFAULT_MAX_KEYS as u64;
    for key in 0..keys {
        assert!(RateLimiter::check(&limiter, &key).is_allowed());
    }
    let stats = limiter.probe_stats();
    assert_eq!(stats.keys, keys, "{stats:?}");
    assert!(stats.slots >= keys, "{stats:?}");
    assert_eq!(limiter.metrics().evicted_capacity, 0);
    assert!((0..keys).all(|key| RateLimiter::check(&limiter, &key).is_denied()));
}

/// A `CasLimiter` of `u64` keys built without a bound is the compact table without one: it
/// grows past the compact limiter's own default bound (and through many chunks), keeps every
/// key, evicts none, and each key stays limited.
// Pins G2.
#[test]
fn an_unbounded_map_of_u64_keys_grows_and_keeps_every_key() {
    let limiter = CasLimiter::<u64, Gcra>::builder(gcra("1/s"))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let keys = 3 * hotlimit::store::DEFAULT_MAX_KEYS as u64;
    for key in 0..keys {
        assert!(limiter.check(&key).is_allowed(), "{key}");
    }
    let m = limiter.metrics();
    assert_eq!((m.keys, m.evicted_capacity, m.evicted_idle), (keys, 0, 0));
    assert!((0..keys).all(|key| limiter.check(&key).is_denied()));
    assert!(limiter.check(&keys).is_allowed());
    assert!(format!("{limiter:?}").contains("table: \"compact table\""));
}

/// Both policies, every algorithm (docs/GUARANTEES.md, "Each algorithm's bound"): a leaky
/// denial writes nothing, a strict one counts. Two limiters filled alike, one denied once
/// more: a moment later the two answer alike if the denial wrote nothing (a peek cannot show
/// it on one limiter: under a strict policy it answers as if it were counted).
// Pins G6, G7, G8, G9, G10, G11, G12.
#[test]
fn a_leaky_denial_writes_nothing_a_strict_one_counts() {
    fn each<A: Algorithm + Clone + Send + Sync + 'static>(name: &str, leaky: A, strict: A) {
        for (algo, writes) in [(leaky, false), (strict, true)] {
            let clock = ManualClock::default();
            clock.set(Duration::from_secs(1_000));
            // Filled a millisecond apart (a log's entries then differ), both alike.
            let (denied, kept) = [(); 2]
                .map(|_| CasLimiter::<String, A, _>::with_clock(algo.clone(), clock.clone()))
                .into();
            while denied.check("k").is_allowed() {
                assert!(kept.check("k").is_allowed(), "{name}");
                clock.advance(Duration::from_millis(1));
            }
            assert!(kept.check("k").is_denied(), "{name}");
            clock.advance(Duration::from_millis(1));
            assert!(denied.check("k").is_denied(), "{name}");
            clock.advance(Duration::from_millis(1));
            let (a, b) = (denied.request("k").peek(), kept.request("k").peek());
            let (a, b) = (a.unwrap(), b.unwrap());
            // A window's strict count past its limit goes into its newest window, bucket or
            // entry, which leaves last: no answer shows it (the others' do).
            let visible = writes && !matches!(name, "fixed" | "sub" | "log");
            if writes && !visible {
                continue;
            }
            assert_eq!(a != b, visible, "{name}: {a:?} against {b:?}");
        }
    }
    let w = Duration::from_secs(10);
    let g: Gcra = "5/s burst 3".parse().unwrap();
    each(
        "gcra",
        g.with_policy(Policy::Leaky),
        g.with_policy(Policy::Strict),
    );
    let f = FixedWindow::new(3, w).unwrap();
    each(
        "fixed",
        f.with_policy(Policy::Leaky),
        f.with_policy(Policy::Strict),
    );
    let s = SlidingWindow::new(3, w).unwrap();
    each(
        "sliding",
        s.with_policy(Policy::Leaky),
        s.with_policy(Policy::Strict),
    );
    let log = SlidingLog::new(3, w).unwrap();
    each(
        "log",
        log.with_policy(Policy::Leaky),
        log.with_policy(Policy::Strict),
    );
    let sub = SubWindow::new(3, w, 10).unwrap();
    each(
        "sub",
        sub.with_policy(Policy::Leaky),
        sub.with_policy(Policy::Strict),
    );
    let e = Earrrl::new(Duration::from_secs(2), "3/s".parse().unwrap()).unwrap();
    each(
        "earrrl",
        e.with_policy(Policy::Leaky),
        e.with_policy(Policy::Strict),
    );
    let x = Exponential::new(3.0, w).unwrap();
    each(
        "exponential",
        x.with_policy(Policy::Leaky),
        x.with_policy(Policy::Strict),
    );
}
