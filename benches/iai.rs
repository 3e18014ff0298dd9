// Pins G37.
//! Instructions per check (issue #49): iai-callgrind runs each benchmark once under callgrind
//! and counts the instructions of the benchmark function alone. Its state is prepared before,
//! outside the count (a `#[bench::…(…)]` expression is evaluated before the benchmark function
//! is entered, and callgrind collects from that function's entry to its return), and every
//! limiter is leaked (`&'static`), so dropping it is not counted either. Counts, not time: the
//! same build gives the same numbers on a noisy machine, so `.ci/iai_gate` holds the hot paths
//! to a committed baseline (`benches/iai_baseline.json`).
//!
//! Every limiter runs on a fixed clock (hotlimit's `ManualClock`, governor's
//! `FakeRelativeClock`): each measured step's outcome (allow or deny) is known, asserted in
//! the setup with a `peek`, and no clock read varies.
//!
//! - One key: ONE `check`, an allowed step and a denied step, for every algorithm on the
//!   default store (`CasLimiter<u64>`: its unbounded compact table for a one-word state, the
//!   papaya map for a two-word one) and on the direct limiter; GCRA on the bounded compact
//!   table (`CompactLimiter`), on a `CasLimiter<String>` (the papaya map of the keys' bytes; a
//!   15-byte key, by `&str`), and `Live<Gcra>` on the direct limiter.
//! - Many keys: GCRA, one `check` of each of 10,000 keys present in the default store, or of
//!   100,000 of the 1,000,000 keys present in it or in the bounded table; the row counts them
//!   all (ids `…_each_of_N`; the gate's table divides by N). One key among many would not do: the hash
//!   seeds are random per process (ahash's, std's), so whether a given key sits where its
//!   look-up probes first changes from run to run, and its count with it (measured, one key
//!   among 10,000 in the papaya map: 180 or 191 instructions allowed, 193 to 226 denied, 11 a
//!   probe); the mean over all the keys moves by under 0.5% between runs.
//! - governor 0.10 beside them, on the same quota: its direct limiter's `check()` and its
//!   keyed limiter's `check_key` (dashmap, its default keyed store) on one key and on 10,000.
//!
//! `cargo bench --bench iai` (valgrind and `cargo install iai-callgrind-runner --version
//! 0.16.1 --locked`, the library's version); `.ci/iai_gate` runs it and compares
//! (`docs/development.md`, "Instruction gate").

use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter as Governor};
use hotlimit::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{
    CasLimiter, CompactLimiter, Decision, DirectLimiter, Limiter, Live, ManualClock, Rate,
};
use iai_callgrind::{library_benchmark, library_benchmark_group, main};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

/// The instant every measured call is made at (10 s after the clocks' origin).
const NOW: Duration = Duration::from_secs(10);
/// The one key of the one-key benchmarks.
const KEY: u64 = 7;
/// The one key of the one-key `String` benchmark: a client's name, 15 bytes.
const NAME: &str = "user:0000012345";
/// How many keys a many-keys benchmark checks (one `check` each).
const SAMPLE: u64 = 10_000;
/// Keys present in the million-key benchmarks (the compact table at `max_keys` = the keys).
const MILLION: u64 = 1_000_000;
/// How many of them the million-key benchmarks check: more than [`SAMPLE`], since at a load
/// of 3/4 a compact key's look-up cost has a long tail (keys that spill past their home line),
/// and the unbounded table's vary too.
const MILLION_SAMPLE: u64 = 100_000;

/// Which outcome the measured call must have.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    Allow,
    Deny,
}

/// Every algorithm at the same limit, 100 a second (the quotas of `benches/algorithms.rs`;
/// GCRA with a burst of 100, so that the history of `warm` leaves it headroom).
fn gcra() -> Gcra {
    "100/s burst 100".parse().unwrap()
}
fn earrrl() -> Earrrl {
    Earrrl::new(
        Duration::from_millis(100),
        Rate::new(100.0, Duration::from_secs(1)).unwrap(),
    )
    .unwrap()
}
fn exponential() -> Exponential {
    Exponential::new(100.0, Duration::from_secs(1)).unwrap()
}
fn fixed_window() -> FixedWindow {
    FixedWindow::new(100, Duration::from_secs(1)).unwrap()
}
fn sliding_window() -> SlidingWindow {
    SlidingWindow::new(100, Duration::from_secs(1)).unwrap()
}
fn sub_window() -> SubWindow {
    SubWindow::new(100, Duration::from_secs(1), 60).unwrap()
}
fn sliding_log() -> SlidingLog {
    SlidingLog::new(100, Duration::from_secs(1)).unwrap()
}

/// Brings one key to `step` through `check` (deciding at the clock's time) and `peek` (which
/// must foretell the measured call's outcome): 50 requests 10 ms apart over the 500 ms before
/// [`NOW`] (headroom left: the next one is allowed), the clock then at `NOW`; for a denial,
/// requests at `NOW` until the next one would be denied.
fn warm(
    clock: &ManualClock,
    check: impl Fn() -> Decision,
    peek: impl Fn() -> Decision,
    step: Step,
) {
    for i in 0..50u32 {
        clock.set(NOW - Duration::from_millis(500) + Duration::from_millis(10) * i);
        let _ = check();
    }
    clock.set(NOW);
    if step == Step::Deny {
        for _ in 0..10_000 {
            if peek().is_denied() {
                break;
            }
            let _ = check();
        }
    }
    assert_eq!(peek().is_allowed(), step == Step::Allow, "{step:?}");
}

/// A limiter `make` builds on a manual clock, leaked for the benchmarks, brought to `step`
/// through `check` and `peek`.
fn warmed<L>(
    make: impl FnOnce(ManualClock) -> L,
    check: impl Fn(&L) -> Decision,
    peek: impl Fn(&L) -> Decision,
    step: Step,
) -> &'static L {
    let clock = ManualClock::default();
    let limiter: &'static L = Box::leak(Box::new(make(clock.clone())));
    warm(&clock, || check(limiter), || peek(limiter), step);
    limiter
}

/// A default-store limiter (`CasLimiter<u64>`) on a manual clock, [`KEY`] brought to `step`.
fn cas<A: Algorithm>(algo: A, step: Step) -> &'static CasLimiter<u64, A, ManualClock> {
    warmed(
        |clock| CasLimiter::with_clock(algo, clock),
        |l| l.check(&KEY),
        |l| l.request(&KEY).peek().unwrap(),
        step,
    )
}

/// A `CasLimiter<String>` (the papaya map holding the keys' bytes) on a manual clock,
/// [`NAME`] brought to `step`.
fn cas_str(step: Step) -> &'static CasLimiter<String, Gcra, ManualClock> {
    warmed(
        |clock| CasLimiter::with_clock(gcra(), clock),
        |l| l.check(NAME),
        |l| l.request(NAME).peek().unwrap(),
        step,
    )
}

/// A direct (one-cell) limiter on a manual clock, brought to `step`.
fn direct<A: Algorithm>(algo: A, step: Step) -> &'static DirectLimiter<A, ManualClock> {
    warmed(
        |clock| DirectLimiter::with_clock(algo, clock),
        |l| l.check(&()),
        |l| l.request(&()).peek().unwrap(),
        step,
    )
}

/// A compact-table GCRA limiter (its default size) on a manual clock, [`KEY`] brought to
/// `step`.
fn compact(step: Step) -> &'static CompactLimiter<u64, Gcra, ManualClock> {
    warmed(
        |clock| CompactLimiter::with_clock(gcra(), clock),
        |l| l.check(&KEY),
        |l| l.request(&KEY).peek().unwrap(),
        step,
    )
}

// (The benchmark functions' comments are plain ones: iai-callgrind 0.16's
// `#[library_benchmark]` refuses doc attributes.)
//
// The benchmark function's own instructions, for reading the rows: it takes a limiter and a
// key as the one-key rows do and returns the key through `black_box`, checking nothing.
#[library_benchmark]
#[bench::nothing(cas(gcra(), Step::Allow), KEY)]
fn overhead(limiter: &'static CasLimiter<u64, Gcra, ManualClock>, key: u64) -> u64 {
    black_box(limiter);
    black_box(key)
}

/// One `check` per algorithm on one key, on the default store and on the direct limiter, each
/// an allowed step and a denied step.
macro_rules! one_key {
    ($algo:ty, $make:ident, $cas:ident, $direct:ident) => {
        // `CasLimiter::check` (the default store) running `$algo`, its one key present: one
        // allowed step, one denied step.
        #[library_benchmark]
        #[bench::allow(cas($make(), Step::Allow), KEY)]
        #[bench::deny(cas($make(), Step::Deny), KEY)]
        fn $cas(limiter: &'static CasLimiter<u64, $algo, ManualClock>, key: u64) -> Decision {
            black_box(limiter.check(&key))
        }

        // `DirectLimiter::check` (one cell) running `$algo`: one allowed step, one denied
        // step.
        #[library_benchmark]
        #[bench::allow(direct($make(), Step::Allow))]
        #[bench::deny(direct($make(), Step::Deny))]
        fn $direct(limiter: &'static DirectLimiter<$algo, ManualClock>) -> Decision {
            black_box(limiter.check(&()))
        }
    };
}

one_key!(Gcra, gcra, cas_gcra, direct_gcra);

// `CasLimiter<String>::check` by `&str` (the papaya map, each key's bytes in its entry):
// GCRA, its one key present, one allowed step and one denied step.
#[library_benchmark]
#[bench::allow(cas_str(Step::Allow), NAME)]
#[bench::deny(cas_str(Step::Deny), NAME)]
fn cas_gcra_string(
    limiter: &'static CasLimiter<String, Gcra, ManualClock>,
    key: &'static str,
) -> Decision {
    black_box(limiter.check(key))
}

// `DirectLimiter::check` running `Live<Gcra>` (a quota that can be switched while traffic
// flows): what reading the configuration in force costs beside `direct_gcra`.
#[library_benchmark]
#[bench::allow(direct(Live::new(gcra()), Step::Allow))]
#[bench::deny(direct(Live::new(gcra()), Step::Deny))]
fn direct_live_gcra(limiter: &'static DirectLimiter<Live<Gcra>, ManualClock>) -> Decision {
    black_box(limiter.check(&()))
}
one_key!(Earrrl, earrrl, cas_earrrl, direct_earrrl);
one_key!(
    Exponential,
    exponential,
    cas_exponential,
    direct_exponential
);
one_key!(
    FixedWindow,
    fixed_window,
    cas_fixed_window,
    direct_fixed_window
);
one_key!(
    SlidingWindow,
    sliding_window,
    cas_sliding_window,
    direct_sliding_window
);
one_key!(SubWindow, sub_window, cas_sub_window, direct_sub_window);
one_key!(SlidingLog, sliding_log, cas_sliding_log, direct_sliding_log);

// `CompactLimiter::check` (the compact table), GCRA, its one key present: one allowed step,
// one denied step.
#[library_benchmark]
#[bench::allow(compact(Step::Allow), KEY)]
#[bench::deny(compact(Step::Deny), KEY)]
fn compact_gcra(limiter: &'static CompactLimiter<u64, Gcra, ManualClock>, key: u64) -> Decision {
    black_box(limiter.check(&key))
}

/// Brings each of `keys` (each checked once 1 ms before [`NOW`], the clock now at `NOW`) to
/// `step`, a denial by a partial grant (`up_to`) of what is left of its burst; `peek` must
/// then foretell each key's measured step. The keys, leaked for the benchmark.
fn bring<S>(limiter: &Limiter<S>, keys: &[u64], step: Step) -> &'static [u64]
where
    S: hotlimit::store::Store + hotlimit::store::Keys<u64>,
{
    for &k in keys {
        if step == Step::Deny {
            let _ = limiter.request(&k).cost(1_000).up_to().unwrap();
        }
        let peeked = limiter.request(&k).peek().unwrap();
        assert_eq!(peeked.is_allowed(), step == Step::Allow, "{step:?} {k}");
    }
    Box::leak(keys.into())
}

/// A default-store GCRA limiter holding keys `0..SAMPLE`, each brought to `step`.
fn cas_10k(step: Step) -> (&'static CasLimiter<u64, Gcra, ManualClock>, &'static [u64]) {
    let clock = ManualClock::default();
    let limiter = Box::leak(Box::new(CasLimiter::<u64, Gcra, _>::with_clock(
        gcra(),
        clock.clone(),
    )));
    clock.set(NOW - Duration::from_millis(1));
    let keys: Vec<u64> = (0..SAMPLE).collect();
    for k in &keys {
        let _ = limiter.check(k);
    }
    clock.set(NOW);
    let keys = bring(limiter, &keys, step);
    (limiter, keys)
}

// `CasLimiter::check`, GCRA, 10,000 keys present: one `check` of each (an allowed step of
// each; a denied step of each); the row counts all 10,000.
#[library_benchmark]
#[bench::allow_each_of_10000(cas_10k(Step::Allow))]
#[bench::deny_each_of_10000(cas_10k(Step::Deny))]
fn cas_gcra_10k(setup: (&'static CasLimiter<u64, Gcra, ManualClock>, &'static [u64])) {
    let (limiter, keys) = setup;
    for key in keys {
        let _ = black_box(limiter.check(key));
    }
}

/// `limiter` (on `clock`) holding [`MILLION`] keys, each checked once 1 ms before [`NOW`];
/// [`MILLION_SAMPLE`] of them, spread over the range, brought to `step`.
fn fill_million<S>(limiter: &Limiter<S>, clock: &ManualClock, step: Step) -> &'static [u64]
where
    S: hotlimit::store::Store + hotlimit::store::Keys<u64>,
{
    clock.set(NOW - Duration::from_millis(1));
    for k in 0..MILLION {
        let _ = limiter.check(&k);
    }
    assert_eq!(limiter.metrics().keys, MILLION);
    clock.set(NOW);
    let sample: Vec<u64> = (0..MILLION_SAMPLE)
        .map(|i| i * (MILLION / MILLION_SAMPLE) + 7)
        .collect();
    bring(limiter, &sample, step)
}

/// A compact-table GCRA limiter sized for [`MILLION`] keys and holding them
/// ([`fill_million`]).
fn compact_1m(
    step: Step,
) -> (
    &'static CompactLimiter<u64, Gcra, ManualClock>,
    &'static [u64],
) {
    let clock = ManualClock::default();
    let limiter = Box::leak(Box::new(
        CompactLimiter::<u64, Gcra>::builder(gcra())
            .max_keys(MILLION as usize)
            .clock(clock.clone())
            .build()
            .unwrap(),
    ));
    (limiter, fill_million(limiter, &clock, step))
}

/// The default-store GCRA limiter holding [`MILLION`] keys ([`fill_million`]): where
/// its look-up's dependent loads cost most (issue #61).
fn cas_1m(step: Step) -> (&'static CasLimiter<u64, Gcra, ManualClock>, &'static [u64]) {
    let clock = ManualClock::default();
    let limiter = Box::leak(Box::new(CasLimiter::<u64, Gcra, _>::with_clock(
        gcra(),
        clock.clone(),
    )));
    (limiter, fill_million(limiter, &clock, step))
}

// `CompactLimiter::check` at a million keys held, on 100,000 of them (an allowed step of
// each); the row counts all 100,000.
#[library_benchmark]
#[bench::allow_each_of_100000(compact_1m(Step::Allow))]
fn compact_gcra_1m(
    setup: (
        &'static CompactLimiter<u64, Gcra, ManualClock>,
        &'static [u64],
    ),
) {
    let (limiter, keys) = setup;
    for key in keys {
        let _ = black_box(limiter.check(key));
    }
}

// `CasLimiter::check` at a million keys held, on 100,000 of them (an allowed step of each);
// the row counts all 100,000.
#[library_benchmark]
#[bench::allow_each_of_100000(cas_1m(Step::Allow))]
fn cas_gcra_1m(setup: (&'static CasLimiter<u64, Gcra, ManualClock>, &'static [u64])) {
    let (limiter, keys) = setup;
    for key in keys {
        let _ = black_box(limiter.check(key));
    }
}

/// governor's quota: the same 100 a second, burst 100, as hotlimit's GCRA above.
fn quota() -> Quota {
    let hundred = NonZeroU32::new(100).unwrap();
    Quota::per_second(hundred).allow_burst(hundred)
}

/// governor's direct limiter on a fake clock.
type GovDirect = governor::RateLimiter<
    governor::state::NotKeyed,
    governor::state::InMemoryState,
    FakeRelativeClock,
    governor::middleware::NoOpMiddleware<<FakeRelativeClock as governor::clock::Clock>::Instant>,
>;

/// governor's keyed limiter, its default store (dashmap, std's hasher), on a fake clock.
type GovKeyed = governor::RateLimiter<
    u64,
    governor::state::keyed::DashMapStateStore<u64>,
    FakeRelativeClock,
    governor::middleware::NoOpMiddleware<<FakeRelativeClock as governor::clock::Clock>::Instant>,
>;

/// The history of [`warm`] on governor's clock, which only moves forward: from `NOW - 500
/// ms`, 50 requests 10 ms apart, the clock then at [`NOW`]; for a denial, requests at `NOW`
/// until one is denied (governor has no peek; a denial writes nothing, so the measured call
/// sees the state that denied).
fn warm_governor(clock: &FakeRelativeClock, check: impl Fn() -> bool, step: Step) {
    clock.advance(NOW - Duration::from_millis(500));
    for i in 0..50 {
        if i > 0 {
            clock.advance(Duration::from_millis(10));
        }
        let _ = check();
    }
    clock.advance(Duration::from_millis(10));
    if step == Step::Deny {
        assert!((0..10_000).any(|_| !check()), "never denied");
    }
}

/// governor's direct limiter, brought to `step`.
fn gov_direct(step: Step) -> &'static GovDirect {
    let clock = FakeRelativeClock::default();
    let limiter = Box::leak(Box::new(Governor::direct_with_clock(
        quota(),
        clock.clone(),
    )));
    warm_governor(&clock, || limiter.check().is_ok(), step);
    limiter
}

/// governor's keyed limiter, [`KEY`] brought to `step`.
fn gov_keyed(step: Step) -> &'static GovKeyed {
    let clock = FakeRelativeClock::default();
    let limiter = Box::leak(Box::new(Governor::dashmap_with_clock(
        quota(),
        clock.clone(),
    )));
    warm_governor(&clock, || limiter.check_key(&KEY).is_ok(), step);
    limiter
}

/// governor's keyed limiter holding keys `0..SAMPLE`, each checked once 1 ms before [`NOW`]
/// and brought to `step` at `NOW`: for a denial, `check_key_n` takes 98 of the 99 cells left
/// (governor grants all or nothing), then checks until one is denied.
fn gov_keyed_10k(step: Step) -> (&'static GovKeyed, &'static [u64]) {
    let clock = FakeRelativeClock::default();
    let limiter = Box::leak(Box::new(Governor::dashmap_with_clock(
        quota(),
        clock.clone(),
    )));
    clock.advance(NOW - Duration::from_millis(1));
    let keys: Vec<u64> = (0..SAMPLE).collect();
    for k in &keys {
        let _ = limiter.check_key(k);
    }
    clock.advance(Duration::from_millis(1));
    if step == Step::Deny {
        let most = NonZeroU32::new(98).unwrap();
        for k in &keys {
            assert!(matches!(limiter.check_key_n(k, most), Ok(Ok(()))), "{k}");
            assert!((0..10).any(|_| limiter.check_key(k).is_err()), "{k}");
        }
    }
    (limiter, Box::leak(keys.into()))
}

// governor `RateLimiter::direct` `check()` (the peer of `DirectLimiter` GCRA): one allowed
// step, one denied step.
#[library_benchmark]
#[bench::allow(gov_direct(Step::Allow))]
#[bench::deny(gov_direct(Step::Deny))]
fn governor_direct(limiter: &'static GovDirect) -> bool {
    black_box(black_box(limiter.check()).is_ok())
}

// governor `RateLimiter::keyed` `check_key` (dashmap store; the peer of `CasLimiter` GCRA),
// its one key present: one allowed step, one denied step.
#[library_benchmark]
#[bench::allow(gov_keyed(Step::Allow), KEY)]
#[bench::deny(gov_keyed(Step::Deny), KEY)]
fn governor_keyed(limiter: &'static GovKeyed, key: u64) -> bool {
    black_box(black_box(limiter.check_key(&key)).is_ok())
}

// governor `check_key` (dashmap store; the peer of `CasLimiter` GCRA at 10,000 keys), 10,000
// keys present: one `check_key` of each (an allowed step of each; a denied step of each); the
// row counts all 10,000.
#[library_benchmark]
#[bench::allow_each_of_10000(gov_keyed_10k(Step::Allow))]
#[bench::deny_each_of_10000(gov_keyed_10k(Step::Deny))]
fn governor_keyed_10k(setup: (&'static GovKeyed, &'static [u64])) {
    let (limiter, keys) = setup;
    for key in keys {
        black_box(black_box(limiter.check_key(key)).is_ok());
    }
}

library_benchmark_group!(
    name = one_key;
    benchmarks =
        overhead,
        cas_gcra, cas_gcra_string, direct_gcra, direct_live_gcra, compact_gcra,
        cas_earrrl, direct_earrrl,
        cas_exponential, direct_exponential,
        cas_fixed_window, direct_fixed_window,
        cas_sliding_window, direct_sliding_window,
        cas_sub_window, direct_sub_window,
        cas_sliding_log, direct_sliding_log
);

library_benchmark_group!(
    name = many_keys;
    benchmarks = cas_gcra_10k, cas_gcra_1m, compact_gcra_1m
);

library_benchmark_group!(
    name = governor_paths;
    benchmarks = governor_direct, governor_keyed, governor_keyed_10k
);

main!(
    library_benchmark_groups = one_key,
    many_keys,
    governor_paths
);
