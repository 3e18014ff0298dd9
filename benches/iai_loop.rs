// Pins G37.
//! Instructions per check in a loop (issue #61): the unkeyed check as a caller's loop runs it,
//! where the check inlines into the loop and the per-call costs (the `Decision` returned, the
//! clock read, the CAS) are all that is left. Its own bench binary: in `benches/iai.rs` a
//! second call site of the same check changes what LLVM inlines into the one-check rows.
//!
//! Each row checks [`CHECKS`] times on a fixed clock (every check allowed: a burst above
//! `CHECKS`) and counts as `…_each_of_1000` (the gate divides by 1,000, the loop's own few
//! instructions included). Two shapes of caller: one that reads only whether the request is
//! admitted (the answer through `black_box`: what the decision's other fields cost when
//! nobody reads them), and one that forces the whole result into memory (the `Decision`, or
//! governor's `Result`, through `black_box`). The limiters are built before the count and
//! leaked, as in `iai.rs`. governor's rows are reported, not gated.
//!
//! Issue #61 asks `DirectLimiter`'s check at most 45 instructions in such a loop: the gate
//! holds `loop_direct_gcra_allowed` to it (`.ci/iai_gate`'s `BARS`); see BENCHMARKS.md.

use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter as Governor};
use hotlimit::algo::Gcra;
use hotlimit::RateLimiter;
use hotlimit::{DirectLimiter, ManualClock};
use iai_callgrind::{library_benchmark, library_benchmark_group, main};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

/// Checks per row.
const CHECKS: u32 = 1_000;

/// A quota with room for every check of a row: 1,000 a second, a burst of 2,000.
fn direct() -> &'static DirectLimiter<Gcra, ManualClock> {
    let clock = ManualClock::default();
    clock.set(Duration::from_secs(10));
    let gcra: Gcra = "1000/s burst 2000".parse().unwrap();
    Box::leak(Box::new(DirectLimiter::with_clock(gcra, clock)))
}

type GovDirect = governor::RateLimiter<
    governor::state::NotKeyed,
    governor::state::InMemoryState,
    FakeRelativeClock,
    governor::middleware::NoOpMiddleware<<FakeRelativeClock as governor::clock::Clock>::Instant>,
>;

/// governor's direct limiter on the same quota.
fn gov_direct() -> &'static GovDirect {
    let clock = FakeRelativeClock::default();
    clock.advance(Duration::from_secs(10));
    let quota = Quota::per_second(NonZeroU32::new(1_000).unwrap())
        .allow_burst(NonZeroU32::new(2_000).unwrap());
    Box::leak(Box::new(Governor::direct_with_clock(quota, clock)))
}

// `DirectLimiter::check` (GCRA), 1,000 allowed checks in a loop, reading whether each is
// allowed.
#[library_benchmark]
#[bench::allow_each_of_1000(direct())]
fn loop_direct_gcra_allowed(limiter: &'static DirectLimiter<Gcra, ManualClock>) -> u32 {
    let mut allowed = 0;
    for _ in 0..CHECKS {
        allowed += u32::from(black_box(limiter.check(&()).is_allowed()));
    }
    assert_eq!(allowed, CHECKS);
    allowed
}

// `DirectLimiter::check` (GCRA), 1,000 allowed checks in a loop, each whole `Decision` forced
// into memory.
#[library_benchmark]
#[bench::allow_each_of_1000(direct())]
fn loop_direct_gcra(limiter: &'static DirectLimiter<Gcra, ManualClock>) -> u32 {
    let mut allowed = 0;
    for _ in 0..CHECKS {
        allowed += u32::from(black_box(limiter.check(&())).is_allowed());
    }
    assert_eq!(allowed, CHECKS);
    allowed
}

// governor's direct `check()`, 1,000 allowed checks in a loop, reading whether each is
// allowed.
#[library_benchmark]
#[bench::allow_each_of_1000(gov_direct())]
fn loop_governor_direct_ok(limiter: &'static GovDirect) -> u32 {
    let mut allowed = 0;
    for _ in 0..CHECKS {
        allowed += u32::from(black_box(limiter.check().is_ok()));
    }
    assert_eq!(allowed, CHECKS);
    allowed
}

// governor's direct `check()`, 1,000 allowed checks in a loop, each whole `Result` forced
// into memory.
#[library_benchmark]
#[bench::allow_each_of_1000(gov_direct())]
fn loop_governor_direct(limiter: &'static GovDirect) -> u32 {
    let mut allowed = 0;
    for _ in 0..CHECKS {
        allowed += u32::from(black_box(limiter.check()).is_ok());
    }
    assert_eq!(allowed, CHECKS);
    allowed
}

library_benchmark_group!(
    name = loops;
    benchmarks = loop_direct_gcra_allowed, loop_direct_gcra
);

library_benchmark_group!(
    name = governor_loops;
    benchmarks = loop_governor_direct_ok, loop_governor_direct
);

main!(library_benchmark_groups = loops, governor_loops);
