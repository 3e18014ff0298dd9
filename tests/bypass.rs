//! A flood never resets a limit: the attack of issue #46, against every store, algorithm and
//! policy, on a frozen and a moving clock, from 1 and 8 threads.
//!
//! A target key spends its quota (an EARRRL abuser gets itself locked out), then a flood of
//! fresh keys, each driven to the target's state, pushes the store far past `max_keys`, so the
//! target is evicted (it spent first: it is the closest to fresh). Then the target asks again,
//! once every 10 ms for a second (moving clock) or 100 times at the same instant (frozen). An
//! unbounded limiter fed the target's requests at the same instants is the exact answer: the
//! bounded one must never admit the target more, nor earlier. Before the debt table, 58 of
//! 60 such cases reset the limit (GCRA 10/s burst 20: 29 admitted against 10).
//!
//! The default run floods 4x and 100x `max_keys` (100); `.ci/run` runs the whole matrix
//! (2x, 4x, 10x, 100x; both clocks; 1 and 8 threads) in release (`--ignored`).

mod common;

use common::{id::Id, ById, ByName};
use hotlimit::algo::{
    Algorithm, AllOf, Bias, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow,
    SubWindow,
};
use hotlimit::store::{Cas, Keys, Locked};
use hotlimit::Metrics;
use hotlimit::{
    CasLimiter, CompactLimiter, Live, ManualClock, MutexLimiter, Policy, QuantaClock, Rate,
    RateLimiter,
};
use std::convert::identity;
use std::sync::Arc;
use std::time::Duration;

const MAX_KEYS: usize = 100;
/// Requests the target (and each flood key) sends at once: twice any burst below.
const SPEND: u64 = 40;
/// The target's key; flood keys count up from 1.
const TARGET: u64 = 0;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Clock {
    Frozen,
    Moving,
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Flood keys, as a multiple of `MAX_KEYS`.
    flood: usize,
    threads: usize,
    clock: Clock,
    /// Sweep by hand every 250 flood keys (the background sweeper's work, deterministic).
    sweeps: bool,
}

/// A bounded limiter of any store, as a flood meets it: its checks, and a sweep by hand.
trait Bounded: RateLimiter<u64> {
    fn sweep(&self);
}

impl<S: Keys<u64>> Bounded for hotlimit::Limiter<S> {
    fn sweep(&self) {
        let _ = hotlimit::Limiter::sweep(self);
    }
}

/// The papaya map, keyed by `Id`: bounded, a map of `u64` keys is the compact table.
impl<S: Keys<Id>> Bounded for ById<S> {
    fn sweep(&self) {
        let _ = self.0.sweep();
    }
}

/// The papaya map of `String` keys (their bytes in its nodes).
impl<S: Keys<String>> Bounded for ByName<S> {
    fn sweep(&self) {
        let _ = self.0.sweep();
    }
}

type Limiter = Arc<dyn Bounded>;

/// What the target got after the flood: admissions, and the index of the first one.
#[derive(Debug, PartialEq)]
struct Outcome {
    admitted: usize,
    first: Option<usize>,
}

/// The instants of the target's last phase (ns), from `t0`.
fn asks(clock: Clock, t0: u64) -> Vec<u64> {
    (0..100)
        .map(|i| match clock {
            Clock::Frozen => t0,
            Clock::Moving => t0 + i * 10_000_000,
        })
        .collect()
}

/// The target's answers to `asks` on `limiter`, the clock set to each instant.
fn ask(limiter: &(impl RateLimiter<u64> + ?Sized), clock: &ManualClock, at: &[u64]) -> Outcome {
    let mut admitted = 0;
    let mut first = None;
    for (i, &t) in at.iter().enumerate() {
        clock.set(Duration::from_nanos(t));
        if limiter.check(&TARGET).is_allowed() {
            admitted += 1;
            first.get_or_insert(i);
        }
    }
    Outcome { admitted, first }
}

/// Runs the attack on `bounded` (built on `clock`); returns the target's outcome and the
/// instant its last phase started.
fn attack(bounded: &Limiter, clock: &ManualClock, shape: Shape) -> (Outcome, u64) {
    for _ in 0..SPEND {
        let _ = bounded.check(&TARGET);
    }
    let keys = (shape.flood * MAX_KEYS) as u64;
    let threads = shape.threads as u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut key = 1 + t;
                while key <= keys {
                    if shape.clock == Clock::Moving {
                        clock.advance(Duration::from_micros(10));
                    }
                    for _ in 0..SPEND {
                        let _ = bounded.check(&key);
                    }
                    if shape.sweeps && t == 0 && key % 250 == 1 {
                        bounded.sweep();
                    }
                    key += threads;
                }
            });
        }
    });
    let t0 = clock.now_ns();
    (ask(&**bounded, clock, &asks(shape.clock, t0)), t0)
}

/// The exact answer: the target alone, at the same instants, on an unbounded limiter.
fn exact<A: Algorithm + Clone>(algo: &A, t0: u64, clock_kind: Clock) -> Outcome {
    let clock = ManualClock::default();
    let l = CasLimiter::<u64, A, _>::with_clock(algo.clone(), clock.clone());
    for _ in 0..SPEND {
        let _ = l.check(&TARGET);
    }
    ask(&l, &clock, &asks(clock_kind, t0))
}

trait ClockExt {
    fn now_ns(&self) -> u64;
}

impl ClockExt for ManualClock {
    fn now_ns(&self) -> u64 {
        hotlimit::Clock::now(self)
    }
}

/// A bounded store under test, with its sweep totals.
type Store = (&'static str, Limiter, Box<dyn Fn() -> Metrics>);

/// The four bounded stores for `algo` on `clock`; `forget` opts out of the debt table.
fn stores<A>(algo: &A, clock: &ManualClock, forget: bool) -> Vec<Store>
where
    A: Algorithm + Clone,
{
    macro_rules! build {
        ($builder:expr, $wrap:expr) => {{
            let b = $builder
                .max_keys(MAX_KEYS)
                .clock(clock.clone())
                .sweep_grace(Duration::ZERO);
            let b = if forget { b.forget_evicted_limits() } else { b };
            let l = Arc::new($wrap(b.build().unwrap()));
            let totals = l.clone();
            (
                l as Limiter,
                Box::new(move || totals.metrics()) as Box<dyn Fn() -> Metrics>,
            )
        }};
    }
    let cas = build!(CasLimiter::<Id, A>::builder(algo.clone()), ById);
    let mutex = build!(MutexLimiter::<Id, A>::builder(algo.clone()), ById);
    let named = build!(CasLimiter::<String, A>::builder(algo.clone()), ByName);
    let compact = build!(
        CompactLimiter::<u64, A, QuantaClock, Cas>::builder(algo.clone()),
        identity
    );
    let compact_mutex = build!(
        CompactLimiter::<u64, A, QuantaClock, Locked>::builder(algo.clone()),
        identity
    );
    vec![
        ("cas", cas.0, cas.1),
        ("mutex", mutex.0, mutex.1),
        ("cas-string", named.0, named.1),
        ("compact", compact.0, compact.1),
        ("compact-mutex", compact_mutex.0, compact_mutex.1),
    ]
}

/// Calls `$f(name, algo, $args..)` for every algorithm of the table and the rest of
/// the family, in `$policy`.
macro_rules! every_algorithm {
    ($policy:expr, $f:ident($($arg:expr),*)) => {{
        let policy: Policy = $policy;
        let minute = Duration::from_secs(60);
        let gcra = "10/s burst 20".parse::<Gcra>().unwrap().with_policy(policy);
        let slow = "1/min burst 5".parse::<Gcra>().unwrap().with_policy(policy);
        let earrrl = Earrrl::new(Duration::from_secs(1), Rate::new(10.0, Duration::from_secs(1)).unwrap())
            .unwrap()
            .with_policy(policy);
        let exp = Exponential::new(20.0, minute).unwrap().with_policy(policy);
        let fixed = FixedWindow::new(20, minute).unwrap().with_policy(policy);
        let sliding = SlidingWindow::new(20, minute).unwrap().with_policy(policy);
        let log = SlidingLog::new(20, minute).unwrap().with_policy(policy);
        let sub = SubWindow::new(20, minute, 10)
            .unwrap()
            .with_policy(policy)
            .with_bias(Bias::Lenient);
        $f("gcra 10/s burst 20", gcra, $($arg),*);
        $f("gcra 1/min burst 5", slow, $($arg),*);
        $f("earrrl 10/s half-life 1 s", earrrl, $($arg),*);
        $f("exponential 20/min", exp, $($arg),*);
        $f("fixed window 20/min", fixed, $($arg),*);
        $f("sliding window 20/min", sliding, $($arg),*);
        $f("sliding log 20/min", log.clone(), $($arg),*);
        $f("sub-window 20/min", sub, $($arg),*);
        $f("all-of gcra + fixed window", AllOf::new(gcra, fixed), $($arg),*);
        $f("live gcra", Live::new(gcra), $($arg),*);
    }};
}

/// The attack in `shape` on every bounded store running `algo`: the target never gets more,
/// nor earlier, than on the unbounded limiter.
fn never_reset<A>(name: &str, algo: A, shape: Shape)
where
    A: Algorithm + Clone,
{
    let clock = ManualClock::default();
    for (store, bounded, totals) in stores(&algo, &clock, false) {
        clock.set(Duration::ZERO);
        let (got, t0) = attack(&bounded, &clock, shape);
        let want = exact(&algo, t0, shape.clock);
        let totals = totals();
        assert!(
            totals.evicted_capacity > 0 && totals.debts_kept > 0,
            "{name} / {store} / {shape:?}: no flood: {totals:?}"
        );
        assert!(totals.most_passes_at_once <= 1, "{totals:?}");
        assert!(
            got.admitted <= want.admitted
                && got.first.unwrap_or(usize::MAX) >= want.first.unwrap_or(usize::MAX),
            "{name} / {store} / {shape:?}: the target got {got:?} after the flood, \
             {want:?} on an unbounded limiter",
        );
    }
}

fn matrix(floods: &[usize], threads: &[usize], clocks: &[Clock]) {
    for policy in [Policy::Leaky, Policy::Strict] {
        for &flood in floods {
            for &threads in threads {
                for &clock in clocks {
                    let shape = Shape {
                        flood,
                        threads,
                        clock,
                        sweeps: clock == Clock::Moving,
                    };
                    every_algorithm!(policy, never_reset(shape));
                }
            }
        }
    }
}

// Pins G20, G24.
#[test]
fn a_flood_never_resets_a_limit() {
    // A corner of the matrix in a debug build (the 100x floods run in release, below: 30 s
    // of the test command's time here).
    matrix(&[4], &[1], &[Clock::Frozen]);
    matrix(&[10], &[8], &[Clock::Moving]);
}

// Pins G24.
#[test]
#[ignore = "the whole matrix: run in release (.ci/run does)"]
fn a_flood_never_resets_a_limit_whole_matrix() {
    matrix(&[2, 4, 10, 100], &[1, 8], &[Clock::Frozen, Clock::Moving]);
}

/// The test bites: with the debt table opted out, the same attack resets the limit (the bug
/// of issue #46) on every store: GCRA 10/s burst 20, 29 admitted against 10.
// Pins G24.
#[test]
fn forgetting_resets_the_limit() {
    let algo: Gcra = "10/s burst 20".parse().unwrap();
    let clock = ManualClock::default();
    let shape = Shape {
        flood: 10,
        threads: 1,
        clock: Clock::Moving,
        sweeps: false,
    };
    for (store, bounded, _) in stores(&algo, &clock, true) {
        clock.set(Duration::ZERO);
        let (got, t0) = attack(&bounded, &clock, shape);
        let want = exact(&algo, t0, shape.clock);
        assert_eq!(want.admitted, 10, "{store}");
        assert_eq!(got.admitted, 29, "{store}: the limit was not reset");
    }
}

/// The threaded flood of issue #46: `spent` keys use their quota, then 8 threads insert
/// `new_keys` fresh keys against `max_keys` on a frozen clock, each spending its quota too
/// (so the spent keys tie with them and are evicted among them). Before the debt table the
/// papaya store forgot 279 to 2,932 of 3,000 spent keys a run, the mutex twin all of them, the
/// compact store 1,208 in one run of six. Now no spent key comes back with budget, and no two
/// capacity passes ever run at once.
fn threaded_flood(runs: usize, spent: u64, new_keys: u64, max_keys: usize) {
    let algo: Gcra = "10/s burst 5".parse().unwrap();
    for run in 0..runs {
        let clock = ManualClock::default();
        macro_rules! build {
            ($builder:expr, $wrap:expr) => {
                Arc::new($wrap(
                    $builder
                        .max_keys(max_keys)
                        .clock(clock.clone())
                        .sweep_grace(Duration::ZERO)
                        .build()
                        .unwrap(),
                ))
            };
        }
        let cas = build!(CasLimiter::<Id, Gcra>::builder(algo), ById);
        let mutex = build!(MutexLimiter::<Id, Gcra>::builder(algo), ById);
        let compact = build!(
            CompactLimiter::<u64, Gcra, QuantaClock, Cas>::builder(algo),
            identity
        );
        let stores: [(&str, Limiter, Metrics); 3] = [
            ("cas", cas.clone(), Metrics::default()),
            ("mutex", mutex.clone(), Metrics::default()),
            ("compact", compact.clone(), Metrics::default()),
        ];
        let totals = [
            Box::new(move || cas.metrics()) as Box<dyn Fn() -> Metrics>,
            Box::new(move || mutex.metrics()),
            Box::new(move || compact.metrics()),
        ];
        for ((store, limiter, _), totals) in stores.iter().zip(&totals) {
            for key in 0..spent {
                let admitted = (0..10).filter(|_| limiter.check(&key).is_allowed()).count();
                assert_eq!(admitted, 5, "{store}");
            }
            std::thread::scope(|s| {
                for t in 0..8u64 {
                    let limiter = limiter.clone();
                    s.spawn(move || {
                        // Each spends its quota too: tied with the spent keys, so the
                        // passes evict spent keys among them.
                        for key in (spent + t..spent + new_keys).step_by(8) {
                            for _ in 0..5 {
                                let _ = limiter.check(&key);
                            }
                        }
                    });
                }
            });
            let forgotten = (0..spent)
                .filter(|key| limiter.check(key).is_allowed())
                .count();
            let t = totals();
            assert_eq!(
                forgotten, 0,
                "{store}, run {run}: {forgotten} spent keys forgotten ({t:?})"
            );
            assert!(t.evicted_capacity > 0, "{store}: no flood: {t:?}");
            assert_eq!(t.most_passes_at_once, 1, "{store}: {t:?}");
        }
    }
}

// Pins G24.
#[test]
fn spent_keys_survive_a_threaded_flood() {
    threaded_flood(1, 750, 20_000, 2_500);
}

// Pins G24.
#[test]
#[ignore = "20 runs of 80,000 new keys: run in release (.ci/run does)"]
fn spent_keys_survive_a_threaded_flood_20_runs() {
    threaded_flood(20, 3_000, 80_000, 10_000);
}

/// 40x: the table overflows, and still no spent key is forgotten: a key of group 0 (one in
/// 256) is forgotten only in a bucket of nothing but markers and keys of group 0, which no
/// flood of 400x reached (docs/limiters.md).
// Pins G24, G26.
#[test]
#[ignore = "5 runs of 400,000 new keys: run in release (.ci/run does)"]
fn past_the_table_a_threaded_flood_forgets_no_one() {
    threaded_flood(5, 3_000, 400_000, 10_000);
}

/// The price of never resetting a limit: the share of newcomers (keys never seen) denied their
/// first request after a flood of `flood × max_keys` keys on a frozen clock, where no debt is
/// ever paid (the worst case: on a moving clock debts are paid and free their entries). Flood
/// keys either each spend the whole burst (the attack above) or each send one request.
/// Returns the share denied, in percent.
fn newcomers_denied<A>(
    algo: A,
    flood: usize,
    spend: u64,
    max_keys: usize,
) -> Vec<(&'static str, f64)>
where
    A: Algorithm + Clone,
{
    let clock = ManualClock::default();
    let mut out = Vec::new();
    macro_rules! run {
        ($name:expr, $builder:expr, $wrap:expr) => {{
            let l = $wrap(
                $builder
                    .max_keys(max_keys)
                    .clock(clock.clone())
                    .sweep_grace(Duration::ZERO)
                    .build()
                    .unwrap(),
            );
            let keys = (flood * max_keys) as u64;
            for key in 0..keys {
                for _ in 0..spend {
                    let _ = l.check(&key);
                }
            }
            let newcomers = 1_000u64;
            let denied = (keys..keys + newcomers)
                .filter(|k| l.check(k).is_denied())
                .count();
            out.push(($name, 100.0 * denied as f64 / newcomers as f64));
        }};
    }
    run!("cas", CasLimiter::<Id, A>::builder(algo.clone()), ById);
    run!(
        "compact",
        CompactLimiter::<u64, A, QuantaClock, Cas>::builder(algo.clone()),
        identity
    );
    out
}

/// A newcomers' flood: how many threads send it, on which clock, and what each flood key sends.
#[derive(Debug, Clone, Copy)]
struct Flood {
    /// Flood keys, as a multiple of `max_keys`.
    times: usize,
    max_keys: usize,
    threads: u64,
    clock: Clock,
    /// Requests per flood key: `SPEND` (twice any burst: the whole quota) or 1.
    spend: u64,
}

/// Newcomers after `flood` on every store running `algo`: the share (percent) of 1,000
/// never-seen keys denied their first request.
fn newcomers_on_every_store<A>(name: &str, algo: A, flood: Flood) -> Vec<f64>
where
    A: Algorithm + Clone,
{
    let clock = ManualClock::default();
    let mut out = Vec::new();
    macro_rules! run {
        ($builder:expr, $wrap:expr) => {{
            clock.set(Duration::ZERO);
            let l = $wrap(
                $builder
                    .max_keys(flood.max_keys)
                    .clock(clock.clone())
                    .sweep_grace(Duration::ZERO)
                    .build()
                    .unwrap(),
            );
            let keys = (flood.times * flood.max_keys) as u64;
            std::thread::scope(|s| {
                for t in 0..flood.threads {
                    let (l, clock) = (&l, &clock);
                    s.spawn(move || {
                        for key in (t..keys).step_by(flood.threads as usize) {
                            if flood.clock == Clock::Moving {
                                clock.advance(Duration::from_micros(10));
                            }
                            for _ in 0..flood.spend {
                                let _ = l.check(&key);
                            }
                        }
                    });
                }
            });
            let denied = (keys..keys + 1_000)
                .filter(|k| l.check(k).is_denied())
                .count();
            assert!(l.metrics().evicted_capacity > 0, "{name}: no flood");
            out.push(denied as f64 / 10.0);
        }};
    }
    run!(CasLimiter::<Id, A>::builder(algo.clone()), ById);
    run!(MutexLimiter::<Id, A>::builder(algo.clone()), ById);
    run!(
        CompactLimiter::<u64, A, QuantaClock, Cas>::builder(algo.clone()),
        identity
    );
    run!(
        CompactLimiter::<u64, A, QuantaClock, Locked>::builder(algo.clone()),
        identity
    );
    out
}

/// Newcomers denied and asked so far, over every algorithm and store of one flood shape.
type Tally = std::cell::Cell<(u64, u64)>;

fn newcomers_pass<A>(name: &str, algo: A, flood: Flood, tally: &Tally)
where
    A: Algorithm + Clone,
{
    let denied = newcomers_on_every_store(name, algo, flood);
    println!("{name}, {flood:?}: newcomers denied (%) {denied:?}");
    for pct in denied {
        let (d, n) = tally.get();
        tally.set((d + (pct * 10.0).round() as u64, n + 1_000));
        if flood.times <= 10 {
            // One cell's 1,000 newcomers, with tag collisions at 0.3%: above 2% is a fault,
            // not chance (the 1% bound is asserted over every cell, below).
            assert!(pct <= 2.0, "{name}, {flood:?}: {pct}% of newcomers denied");
        } else {
            // Past it, most keys of class 0 (one in 16) still start fresh.
            assert!(pct < 100.0, "{name}, {flood:?}: every newcomer denied");
        }
    }
}

/// A flood costs only the flooder: after 2x to 10x `max_keys` flood keys (each spending its
/// whole quota, or sending one request; from 1 or 8 threads; on a frozen or a moving clock) at
/// most 1% of newcomers are denied their first request (over the 40,000 newcomers of every
/// algorithm and store of a shape; at most 2% in any one), and after 100x some still get
/// through, on every store, algorithm and policy (issue #59).
// Pins G26.
#[test]
#[ignore = "floods of 2x and 4x 1,000, 10x 2,000 and 100x 200 keys on every store and algorithm: run in release (.ci/run does)"]
fn newcomers_get_through_floods_on_every_store() {
    let flood = |times, max_keys, threads, clock, spend| Flood {
        times,
        max_keys,
        threads,
        clock,
        spend,
    };
    let (frozen, moving) = (Clock::Frozen, Clock::Moving);
    for policy in [Policy::Leaky, Policy::Strict] {
        for f in [
            // Two sizes below 10x, one shape each, at 1,000 keys (CI's time: 6x and 8x, 9 s,
            // added no shape of their own).
            flood(2, 1_000, 1, frozen, SPEND),
            flood(4, 1_000, 8, moving, SPEND),
            flood(10, 2_000, 1, frozen, SPEND),
            flood(10, 2_000, 8, moving, SPEND),
            flood(10, 2_000, 1, frozen, 1),
            flood(100, 200, 1, frozen, SPEND),
            flood(100, 200, 8, moving, SPEND),
            flood(100, 200, 8, frozen, 1),
        ] {
            let tally = Tally::default();
            every_algorithm!(policy, newcomers_pass(f, &tally));
            let (denied, asked) = tally.get();
            println!("{f:?}, {policy:?}: {denied} of {asked} newcomers denied");
            if f.times <= 10 {
                // The bound, over the 40,000 newcomers of every algorithm and store.
                assert!(denied * 100 <= asked, "{f:?}: {denied} of {asked} denied");
            }
        }
    }
}

/// Prints the table BENCHMARKS.md keeps ("A flood costs only the flooder") and pins it: up to
/// 10x `max_keys` of spent keys, few newcomers pay (tag collisions: ≤ 0.3% expected, ≤ 1%
/// asserted over all, ≤ 2% in a cell of 1,000); far past what the table can tell apart (100x,
/// frozen clock: no debt ever paid) most keys of class 0 still start fresh.
// Pins G26.
#[test]
#[ignore = "floods of up to 10x 10,000 keys: run in release (.ci/run does)"]
fn newcomers_false_denials() {
    let gcra: Gcra = "10/s burst 20".parse().unwrap();
    println!("| flood keys each | flood | store | newcomers denied |");
    println!("|---|---|---|---|");
    // Through 10x: at most 2% in a cell of 1,000 newcomers, at most 1% over all of them.
    let (mut denied, mut asked) = (0.0, 0.0);
    for (what, spend) in [("spend the burst", 20), ("send one request", 1)] {
        for flood in [2, 4, 6, 8, 10, 12, 15, 20, 100] {
            for (store, pct) in newcomers_denied(gcra, flood, spend, 10_000) {
                println!("| {what} | {flood}x | {store} | {pct:.1}% |");
                if flood <= 10 {
                    assert!(pct <= 2.0, "{what}, {flood}x, {store}: {pct}%");
                    denied += pct;
                    asked += 100.0;
                } else {
                    assert!(pct < 100.0, "{what}, {flood}x, {store}: {pct}%");
                }
            }
        }
    }
    assert!(
        denied <= asked / 100.0,
        "{denied} of {asked} newcomers denied"
    );
}
