//! A sweep never holds what a check waits on (G68): a sweep is stopped in the middle of its
//! pass (an idle pass, and a capacity pass) by an algorithm whose `idle_at` parks the
//! sweeping thread, and every check meanwhile must finish: on every key of a lock-free store,
//! on every key but the one being read of a mutex twin (whose sweep holds that key's lock for
//! one state read, as a check does), and on new keys. Parked, not timed: a check that waited
//! on the sweep would never finish until it is released. Then every key's next decision is
//! the exact one: nothing the checks counted beside the pass was lost.

#[path = "common/id.rs"]
mod id;

use hotlimit::algo::{Algorithm, Debt, Gcra};
use hotlimit::store::{Cas, Locked};
use hotlimit::Metrics;
use hotlimit::RateLimiter;
use hotlimit::{CasLimiter, CompactLimiter, ConfigError, Decision, ManualClock, Policy};
use hotlimit::{Limiter, MutexLimiter};
use id::Id;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The sweeping thread's name: only there does `idle_at` park.
const SWEEPER: &str = "sweep-under-test";

/// How long a check may take before the test calls it waiting on the sweep: a failure
/// detector, not a timing (a check that does not wait finishes in microseconds).
const STUCK: Duration = Duration::from_secs(30);

/// Where the sweep stands, told to the test.
#[derive(Debug, PartialEq)]
enum Sweep {
    Parked,
    Done(Metrics),
}

/// GCRA whose `idle_at`, on the sweeping thread, parks at its `park_at`-th call until the
/// test releases it.
#[derive(Clone, Debug)]
struct Parking {
    gcra: Gcra,
    park_at: u64,
    calls: Arc<AtomicU64>,
    told: Sender<Sweep>,
    release: Arc<Mutex<Receiver<()>>>,
}

impl Algorithm for Parking {
    type State = u64;

    fn fresh(&self) -> u64 {
        self.gcra.fresh()
    }

    fn capacity(&self) -> u64 {
        self.gcra.capacity()
    }

    fn policy(&self) -> Policy {
        self.gcra.policy()
    }

    fn check_quota(&self, _: &Self) -> Result<(), ConfigError> {
        Ok(())
    }

    fn update(&self, state: &mut u64, now: u64, cost: u64) -> Decision {
        self.gcra.update(state, now, cost)
    }

    fn idle_at(&self, state: &u64) -> u64 {
        if std::thread::current().name() == Some(SWEEPER)
            && self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.park_at
        {
            self.told.send(Sweep::Parked).unwrap();
            self.release.lock().unwrap().recv().unwrap();
        }
        self.gcra.idle_at(state)
    }
}

impl Debt<u64> for Parking {
    fn debt(&self, state: &u64, part: usize) -> u128 {
        self.gcra.debt(state, part)
    }

    fn debt_paid_at(&self, part: usize, debt: u128) -> u64 {
        self.gcra.debt_paid_at(part, debt)
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> u64 {
        self.gcra.restore(debt)
    }
}

/// One store under test: its limiter, and whether a sweep reading a key holds its lock.
struct Under<S: hotlimit::store::Store<Algo = Parking>, K> {
    name: &'static str,
    limiter: Arc<Limiter<S>>,
    locked: bool,
    key: PhantomData<fn(u64) -> K>,
}

/// A store's key type, made from the tests' `u64`s (`u64` itself, or `Id`).
trait Key: From<u64> + Send + Sync + 'static {}

impl<K: From<u64> + Send + Sync + 'static> Key for K {}

/// Every key of `keys` denied once more after the sweep, evicted or not: none came back
/// fresh (each was used up before it).
fn assert_none_reset<S, K: Key>(u: &Under<S, K>, keys: impl IntoIterator<Item = u64>)
where
    S: hotlimit::store::Store<Algo = Parking> + hotlimit::store::Keys<K>,
{
    for key in keys {
        assert!(
            u.limiter.check(&K::from(key)).is_denied(),
            "{}: key {key} came back fresh after the sweep",
            u.name
        );
    }
}

/// The parking algorithm (1/min, burst 3: nothing refills within a test) parking at call
/// `park_at`, its channels, and the manual clock.
fn parking(park_at: u64) -> (Parking, Receiver<Sweep>, Sender<()>) {
    let (told, heard) = channel();
    let (go, release) = channel();
    let algo = Parking {
        gcra: "1/m burst 3".parse().unwrap(),
        park_at,
        calls: Arc::new(AtomicU64::new(0)),
        told,
        release: Arc::new(Mutex::new(release)),
    };
    (algo, heard, go)
}

macro_rules! build {
    ($ty:ty, $algo:expr, $clock:expr, $max:expr) => {
        Arc::new(
            <$ty>::builder($algo.clone())
                .clock($clock.clone())
                .metrics(true)
                .max_keys($max)
                .sweep_grace(Duration::ZERO)
                .build()
                .unwrap(),
        )
    };
}

/// Runs `f` on every keyed store: the papaya map and the compact table, lock-free and locked,
/// each with an algorithm of its own parking at call `park_at`.
macro_rules! every_store {
    ($park_at:expr, $max:expr, $f:ident) => {{
        let clock = ManualClock::default();
        macro_rules! on {
            ($name:expr, $ty:ty, $key:ty, $locked:expr) => {{
                let (algo, heard, go) = parking($park_at);
                let limiter = build!($ty, algo, clock, $max);
                let under = Under::<_, $key> {
                    name: $name,
                    limiter,
                    locked: $locked,
                    key: PhantomData,
                };
                $f(under, &clock, heard, go);
            }};
        }
        // The papaya map keyed by `Id` (bounded, a map of `u64` keys is the compact table).
        on!("cas", CasLimiter::<Id, Parking>, Id, false);
        on!("mutex", MutexLimiter::<Id, Parking>, Id, true);
        on!(
            "compact",
            CompactLimiter::<u64, Parking, _, Cas>,
            u64,
            false
        );
        on!(
            "compact-mutex",
            CompactLimiter::<u64, Parking, _, Locked>,
            u64,
            true
        );
    }};
}

/// Starts a sweep on its own thread and, once it has parked, checks each key `n` times (a
/// key, its `n`) on a thread of its own. Every check must finish while the sweep stays parked
/// but, in a locked store, the one key whose lock the sweep holds, which waits for the
/// release. `parked` runs once the sweep has parked. The decisions by key, and the report.
fn race<S, K: Key>(
    u: &Under<S, K>,
    heard: &Receiver<Sweep>,
    go: &Sender<()>,
    keys: &[(u64, usize)],
    parked: impl FnOnce(),
) -> (Vec<Vec<bool>>, Metrics)
where
    S: hotlimit::store::Store<Algo = Parking> + hotlimit::store::Keys<K>,
{
    let limiter = u.limiter.clone();
    let told = limiter.algorithm().told.clone();
    let sweep = std::thread::Builder::new()
        .name(SWEEPER.into())
        .spawn(move || told.send(Sweep::Done(limiter.sweep())).unwrap())
        .unwrap();
    assert_eq!(
        heard.recv().unwrap(),
        Sweep::Parked,
        "{}: never parked",
        u.name
    );
    parked();
    let mut decisions = vec![Vec::new(); keys.len()];
    std::thread::scope(|s| {
        let (done, finished) = channel();
        for (i, &(key, n)) in keys.iter().enumerate() {
            let (limiter, done) = (&u.limiter, done.clone());
            s.spawn(move || {
                let got: Vec<bool> = (0..n)
                    .map(|_| limiter.check(&K::from(key)).is_allowed())
                    .collect();
                done.send((i, got)).unwrap();
            });
        }
        let mut collect = |what: &str| match finished.recv_timeout(STUCK) {
            Ok((i, got)) => decisions[i] = got,
            Err(RecvTimeoutError::Timeout) => {
                // Released first, so the waiting check ends and the scope can join it.
                let _ = go.send(());
                panic!(
                    "{}: a check {what} ({} of {} keys done)",
                    u.name,
                    decisions.iter().filter(|d| !d.is_empty()).count(),
                    keys.len()
                )
            }
            Err(RecvTimeoutError::Disconnected) => unreachable!(),
        };
        for _ in 0..keys.len() - u.locked as usize {
            collect("waited on the parked sweep");
        }
        go.send(()).unwrap();
        if u.locked {
            collect("never finished after the release");
        }
    });
    let Sweep::Done(report) = heard.recv().unwrap() else {
        panic!("{}: parked twice", u.name);
    };
    sweep.join().unwrap();
    (decisions, report)
}

/// `n` decisions: `allowed` allowed, then denied.
fn allowed_then_denied(allowed: usize, n: usize) -> Vec<bool> {
    (0..n).map(|i| i < allowed).collect()
}

const KEYS: u64 = 72;

/// An idle sweep parked at its first key: 72 keys idle for an hour (the sweep would evict
/// every one), checked 3 times each while it is parked, and 8 new keys; then once more.
fn idle_sweep<S, K: Key>(
    u: Under<S, K>,
    clock: &ManualClock,
    heard: Receiver<Sweep>,
    go: Sender<()>,
) where
    S: hotlimit::store::Store<Algo = Parking> + hotlimit::store::Keys<K>,
{
    for key in 0..KEYS {
        assert!(u.limiter.check(&K::from(key)).is_allowed());
    }
    clock.advance(Duration::from_secs(3600));
    let keys: Vec<(u64, usize)> = (0..KEYS + 8).map(|k| (k, 3)).collect();
    let (decisions, report) = race(&u, &heard, &go, &keys, || {});
    for (k, got) in decisions.iter().enumerate() {
        assert_eq!(got, &allowed_then_denied(3, 3), "{}: key {k}", u.name);
    }
    // A lock-free store's sweep judged every key again on the state the checks left (not
    // idle): nothing evicted. A locked store's evicted the key it held, idle then, before
    // that key's checks (which found it gone, and started fresh).
    assert_eq!(
        report.evicted_idle, u.locked as u64,
        "{}: {report:?}",
        u.name
    );
    assert_none_reset(&u, 0..KEYS + 8);
}

// Pins G68.
#[test]
fn an_idle_sweep_parked_mid_pass_blocks_no_check() {
    every_store!(1, 10_000, idle_sweep);
}

/// A capacity pass parked at its first key: 72 keys against `max_keys(64)` (below the bound
/// of 80 where an insert runs a pass of its own), each used once; the sweep's idle pass reads
/// each (none idle), its capacity pass parks on the first it reads. Meanwhile each key is
/// checked twice (both allowed: burst 3), and 4 new keys 3 times; then every key is denied
/// once more, evicted or not: the pass kept what each evicted key owed.
fn capacity_pass<S, K: Key>(
    u: Under<S, K>,
    clock: &ManualClock,
    heard: Receiver<Sweep>,
    go: Sender<()>,
) where
    S: hotlimit::store::Store<Algo = Parking> + hotlimit::store::Keys<K>,
{
    for key in 0..KEYS {
        assert!(u.limiter.check(&K::from(key)).is_allowed());
        clock.advance(Duration::from_millis(1));
    }
    let mut keys: Vec<(u64, usize)> = (0..KEYS).map(|k| (k, 2)).collect();
    keys.extend((1000..1004).map(|k| (k, 3)));
    let limiter = u.limiter.clone();
    let (decisions, report) = race(&u, &heard, &go, &keys, || {
        // Parked inside the capacity pass, not the idle pass before it.
        assert_eq!(limiter.metrics().most_passes_at_once, 1);
    });
    for (&(key, n), got) in keys.iter().zip(&decisions) {
        assert_eq!(got, &allowed_then_denied(n, n), "{}: key {key}", u.name);
    }
    assert_eq!(report.evicted_idle, 0, "{}: {report:?}", u.name);
    assert!(report.evicted_capacity > 0, "{}: {report:?}", u.name);
    assert_none_reset(&u, keys.iter().map(|&(key, _)| key));
}

// Pins G68.
#[test]
fn a_capacity_pass_parked_mid_pass_blocks_no_check() {
    every_store!(KEYS + 1, 64, capacity_pass);
}

/// New keys whose probe windows are full, checked while an idle sweep is parked mid-walk: the
/// lock-free compact table filled to 61,000 keys against `max_keys(49,000)` (below the 61,250
/// where an insert runs a capacity pass; its slots about 94% full), then 300 new keys. Each
/// finishes, evicting from its window beside the parked walk (the table cannot grow while the
/// walk holds it): such an insert waited for the walk to end, and a stopped sweep never ends.
// Pins G68.
#[test]
fn a_new_key_whose_window_is_full_never_waits_on_a_parked_sweep() {
    let clock = ManualClock::default();
    let (algo, heard, go) = parking(1);
    let limiter = build!(CompactLimiter::<u64, Parking, _, Cas>, algo, clock, 49_000);
    for key in 0..61_000u64 {
        let _ = limiter.check(&key);
    }
    let before = limiter.metrics().evicted_capacity;
    let sweeping = limiter.clone();
    let told = limiter.algorithm().told.clone();
    let sweep = std::thread::Builder::new()
        .name(SWEEPER.into())
        .spawn(move || told.send(Sweep::Done(sweeping.sweep())).unwrap())
        .unwrap();
    assert_eq!(heard.recv().unwrap(), Sweep::Parked);
    let (done, finished) = channel();
    let checking = limiter.clone();
    let checks = std::thread::spawn(move || {
        let allowed = (1_000_000..1_000_300u64)
            .filter(|key| checking.check(key).is_allowed())
            .count();
        done.send(allowed).unwrap();
    });
    match finished.recv_timeout(STUCK) {
        Ok(allowed) => assert_eq!(allowed, 300),
        Err(_) => {
            let _ = go.send(());
            panic!("a new key waited on the parked sweep");
        }
    }
    let beside = limiter.metrics().evicted_capacity - before;
    go.send(()).unwrap();
    assert!(matches!(heard.recv().unwrap(), Sweep::Done(_)));
    sweep.join().unwrap();
    checks.join().unwrap();
    assert!(beside > 0, "no new key found its window full");
}
