//! A capacity pass run on a request's path allocates nothing that grows with the table (G69):
//! the request whose insert finds the store past `max_keys + max_keys / 4` runs the pass
//! itself (G19), and what it allocates (the pass's sample of `idle_at`s, the insert's own
//! entry) is the same whatever `max_keys` is. Counted with dhat's global allocator, in a
//! binary of its own (one test function: nothing else allocates while it counts).

use hotlimit::algo::Gcra;
use hotlimit::RateLimiter;
use hotlimit::{CasLimiter, CompactLimiter, ManualClock, MutexLimiter};
#[path = "common/id.rs"]
mod id;
use id::Id;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// Blocks and bytes `f` allocates.
fn allocated(f: impl FnOnce()) -> (u64, u64) {
    let before = dhat::HeapStats::get();
    f();
    let after = dhat::HeapStats::get();
    (
        after.total_blocks - before.total_blocks,
        after.total_bytes - before.total_bytes,
    )
}

/// What the insert that runs a capacity pass allocates, in a `$ty` with `max_keys($max)`,
/// filled with new keys on a frozen clock until one insert runs a pass: (blocks, bytes, keys
/// the pass evicted). `$key` makes a key of the store's type from a `u64`.
macro_rules! pass_on_insert {
    ($ty:ty, $max:expr, $key:expr) => {{
        let limiter = <$ty>::builder("1/m burst 3".parse::<Gcra>().unwrap())
            .clock(ManualClock::default())
            .max_keys($max)
            .metrics(true)
            .build()
            .unwrap();
        let mut key = 0u64;
        loop {
            let before = limiter.metrics().evicted_capacity;
            let (blocks, bytes) = allocated(|| {
                let _ = std::hint::black_box(limiter.check(&$key(key)));
            });
            key += 1;
            let sweep = limiter.metrics();
            if sweep.most_passes_at_once > 0 {
                break (blocks, bytes, sweep.evicted_capacity - before);
            }
            assert!(key < 4 * $max as u64, "no pass ran");
        }
    }};
}

// Pins G69.
#[test]
fn a_capacity_pass_on_a_request_allocates_nothing_that_grows_with_the_table() {
    let _profiler = dhat::Profiler::builder().testing().build();
    for max in [1_000usize, 10_000, 100_000] {
        let cas = pass_on_insert!(CasLimiter::<Id, Gcra>, max, Id);
        let mutex = pass_on_insert!(MutexLimiter::<Id, Gcra>, max, Id);
        let compact = pass_on_insert!(CompactLimiter::<u64, Gcra>, max, u64::from);
        let base = papaya_retain(max + max / 4, cas.2);
        eprintln!("max {max}: cas {cas:?} mutex {mutex:?} compact {compact:?} papaya {base:?}");
        for (store, (blocks, bytes, evicted)) in [("cas", cas), ("mutex", mutex)] {
            assert!(
                evicted >= (max / 4) as u64,
                "{store} {max}: evicted {evicted}"
            );
            // Beyond papaya's own reclamation of the keys evicted: the sample (one
            // allocation of at most 1,024 words) and the new key's entry; one retire batch
            // more where the thread's batch was already begun.
            assert!(
                blocks <= base.0 + 3 && bytes <= base.1 + 8 * 1024 + 16 + BATCH,
                "{store} {max}: {blocks} blocks, {bytes} bytes, papaya's own {base:?}"
            );
        }
        let (blocks, bytes, evicted) = compact;
        assert!(
            evicted >= (max / 4) as u64,
            "compact {max}: evicted {evicted}"
        );
        // The sample (at most 2 × 4,096 slots' words) and the shared pass's record: nothing
        // else, at any size (the table never grows).
        assert_eq!(blocks, 2, "compact {max}: {bytes} bytes");
        assert!(bytes <= 2 * 4096 * 8 + 4096, "compact {max}: {bytes} bytes");
    }
    overflowing_debts_allocate_nothing_more();
}

/// Past the debt table's room (about 9.3 × `max_keys` debts owed, here 30×, every key owing on
/// a frozen clock) the table files a debt by merging entries: a pass still makes the same 2
/// allocations.
fn overflowing_debts_allocate_nothing_more() {
    let max = 1_000u64;
    let limiter = CompactLimiter::<u64, Gcra>::builder("1/m burst 3".parse::<Gcra>().unwrap())
        .clock(ManualClock::default())
        .max_keys(max as usize)
        .metrics(true)
        .build()
        .unwrap();
    for key in 0..30 * max {
        let _ = limiter.check(&key);
    }
    let mut passes = 0;
    for key in 30 * max..32 * max {
        let before = limiter.metrics().evicted_capacity;
        let (blocks, bytes) = allocated(|| {
            let _ = std::hint::black_box(limiter.check(&key));
        });
        if limiter.metrics().evicted_capacity > before {
            passes += 1;
            assert_eq!(blocks, 2, "a pass over full debts: {bytes} bytes");
        }
    }
    assert!(passes > 0, "no pass ran");
}

/// A bound on one of papaya's retire batches (measured: 528 bytes per 16 entries retired).
const BATCH: u64 = 1024;

/// papaya's own price of removing `n` of `len` entries in one `retain` (its collector's
/// batches of retired entries): the baseline a papaya store's pass is measured against.
fn papaya_retain(len: usize, n: u64) -> (u64, u64) {
    let map = papaya::HashMap::<u64, u64>::new();
    for k in 0..len as u64 {
        map.pin().insert(k, k);
    }
    let guard = map.guard();
    allocated(|| map.retain(|k, _| *k >= n, &guard))
}
