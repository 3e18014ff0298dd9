//! The background sweeper's lifecycle: it runs when asked to, and `shutdown` (or a drop, which
//! only signals) stops it (no leaked thread). Its own test binary, so no other test's sweeper threads
//! are counted.

use hotlimit::RateLimiter;
use hotlimit::{algo::Gcra, CasLimiter, ManualClock, MutexLimiter};
#[path = "common/id.rs"]
mod id;
use id::Id;
use std::time::{Duration, Instant};

/// Threads of this process named like the sweeper (Linux: `/proc/self/task/*/comm`, names
/// truncated to 15 bytes).
#[cfg(target_os = "linux")]
fn sweeper_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "hotlimit-sweepe")
        .count()
}

/// Waits (yielding, bounded) until `cond` holds; false if it never did.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

// Pins G21.
#[test]
fn sweeper_runs_and_ends_with_its_limiter() {
    let gcra: Gcra = "10/s burst 5".parse().unwrap();
    let clock = ManualClock::default();
    // An interval of an hour: the sweeps below can only come from wake-ups, and dropping
    // must not wait for the interval either.
    // Keyed by `Id`: the papaya map (bounded, a map of `u64` keys is the compact table).
    let cas = CasLimiter::<Id, Gcra>::builder(gcra)
        .clock(clock.clone())
        .sweep_every(Duration::from_secs(3600))
        .max_keys(1_000)
        .build()
        .unwrap();
    let mutex = MutexLimiter::<u64, Gcra>::builder(gcra)
        .clock(clock.clone())
        .sweep_every(Duration::from_secs(3600))
        .build()
        .unwrap();
    // A thread names itself once it runs, which may be after `build` returns.
    #[cfg(target_os = "linux")]
    assert!(eventually(|| sweeper_threads() == 2));

    // 1,100 keys: past max_keys the inserting requests wake the sweeper, which brings the
    // map down to 7/8 of the bound (875) without any request paying for it.
    for key in 0..1_100u64 {
        let _ = cas.check(&Id(key));
    }
    // Keys disappear while a sweep runs and its totals are recorded when it ends, so wait for
    // both. The interval is an hour: only a wake-up can have run it.
    assert!(
        eventually(|| cas.metrics().keys <= 1_000 && cas.metrics().evicted_capacity >= 100),
        "len {}, {:?}",
        cas.metrics().keys,
        cas.metrics()
    );

    // `shutdown` stops and joins its sweeper; `drop` only signals, and the thread ends by
    // itself. The kernel may list a joined thread in /proc for a moment after (glibc's join
    // returns when the thread clears its tid, before the task is reaped), so wait for the
    // listing to empty. A thread that was not stopped sleeps for its hour-long interval and
    // never leaves it.
    cas.shutdown();
    drop(mutex);
    #[cfg(target_os = "linux")]
    assert!(
        eventually(|| sweeper_threads() == 0),
        "a sweeper thread outlived its limiter: {}",
        sweeper_threads()
    );
}

/// The configuration error both keyed stores' `build` gives for a sweeper every `every`.
fn sweep_error(every: Duration) -> [Option<hotlimit::ConfigError>; 2] {
    let gcra: hotlimit::algo::Gcra = "10/s".parse().unwrap();
    let errors = [
        hotlimit::CasLimiter::<u64, _>::builder(gcra)
            .sweep_every(every)
            .build()
            .unwrap_err(),
        hotlimit::CompactLimiter::<u64, _>::builder(gcra)
            .sweep_every(every)
            .build()
            .unwrap_err(),
    ];
    errors.map(|e| match e {
        hotlimit::BuildError::Config(e) => Some(e),
        _ => None,
    })
}

/// A zero interval would spin a core: `build` refuses it with a typed configuration error, on
/// both keyed stores.
// Pins G16.
#[test]
fn a_zero_sweep_interval_is_a_config_error() {
    let want = hotlimit::ConfigError::Zero {
        field: hotlimit::Field::SweepInterval,
        value: "0s".into(),
    };
    assert_eq!(
        sweep_error(Duration::ZERO),
        [Some(want.clone()), Some(want)]
    );
}

/// Nor an interval below 1 ms (`sweep_every(1 ns)` ran a pass over the store every few
/// microseconds: a whole core): `ConfigError::TooSmall`, on both keyed stores; 1 ms builds.
// Pins G16.
#[test]
fn a_sweep_interval_below_1_ms_is_a_config_error() {
    for tiny in [Duration::from_nanos(1), Duration::from_micros(999)] {
        let want = hotlimit::ConfigError::TooSmall {
            field: hotlimit::Field::SweepInterval,
            value: format!("{tiny:?}"),
            min: "1ms",
        };
        assert_eq!(sweep_error(tiny), [Some(want.clone()), Some(want)]);
    }
    let gcra: hotlimit::algo::Gcra = "10/s".parse().unwrap();
    let ms = Duration::from_millis(1);
    assert!(hotlimit::CasLimiter::<u64, _>::builder(gcra)
        .sweep_every(ms)
        .build()
        .is_ok());
}
