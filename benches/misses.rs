//! Cache misses per check at 1M keys (issue #61), counted by valgrind's cachegrind, not timed:
//! the driver `.ci/misses` runs; this binary only fills one store and checks it.
//!
//! `misses STORE CHECKS [KEYS]`: fills STORE (`cas`, `compact` or `governor` keyed by `u64`;
//! `cas-str`, `compact-str` (`Hashed<str>`) or `governor-str` keyed by 15-byte `String`s;
//! `cas-long` or `governor-long` keyed by 40-byte ones) with KEYS keys
//! (1M unless given; the compact table sized for them), every
//! quota admitting everything on a frozen clock, then runs CHECKS checks of scattered keys
//! (the same sequence for every store, computed on the fly: no sequence in memory to miss
//! on; a `String` key is written into one reused buffer, in cache, as a server parses it from
//! the request it just read). `.ci/misses` runs it with CHECKS and with 0 and divides the
//! difference by CHECKS: the
//! fill and the process drop out. The
//! store is never dropped (leaked): a drop walks every entry, and how many of those loads hit
//! depends on what the checks left in the cache (±0.25 misses a check for governor's map).

use governor::{clock::FakeRelativeClock, Quota, RateLimiter as Governor};
use hotlimit::algo::Gcra;
use hotlimit::RateLimiter;
use hotlimit::{store::Hashed, CasLimiter, CompactLimiter, ManualClock};
use std::fmt::Write;
use std::hint::black_box;
use std::num::NonZeroU32;

/// The `i`th key of the sequence over `keys` keys: `i` scattered by a multiplicative hash
/// (Fibonacci hashing), a few instructions, the same for every store.
fn key(i: u64, keys: u64) -> u64 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) % keys
}

/// Key `k` as a `String` key, written into `buf`: `user:0000012345` (15 bytes), or with
/// `long` an API key's 40 (`sk_live_` and 32 hex digits), longer than a key held inline.
fn user(buf: &mut String, k: u64, long: bool) -> &str {
    buf.clear();
    if long {
        write!(buf, "sk_live_{k:032x}").unwrap();
    } else {
        write!(buf, "user:{k:010}").unwrap();
    }
    buf
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list" || a == "--bench") {
        return; // `cargo bench`: counted by .ci/misses, not run here.
    }
    let (store, checks, keys) = match &args[1..] {
        [store, checks] => (store.as_str(), checks, "1000000"),
        [store, checks, keys] => (store.as_str(), checks, keys.as_str()),
        _ => panic!(
            "usage: misses cas|compact|governor|cas-str|compact-str|governor-str|cas-long|governor-long CHECKS [KEYS]"
        ),
    };
    let checks = checks.parse::<u64>().expect("CHECKS");
    let keys = keys.parse::<u64>().expect("KEYS");
    let gcra: Gcra = "1000000000/s burst 1099511627776".parse().unwrap();
    let seq = (0..checks).map(|i| key(i, keys));
    // `-long`: the `-str` store keyed by 40-byte keys.
    let long = store.ends_with("-long");
    let store = match store {
        "cas-long" => "cas-str",
        "governor-long" => "governor-str",
        other => other,
    };
    match store {
        "cas" => {
            let l = CasLimiter::<u64, Gcra, _>::with_clock(gcra, ManualClock::default());
            (0..keys).for_each(|k| assert!(l.check(&k).is_allowed()));
            seq.for_each(|k| {
                let _ = black_box(l.check(&k));
            });
            std::mem::forget(l);
        }
        "compact" => {
            let l = CompactLimiter::<u64, Gcra>::builder(gcra)
                .max_keys(keys as usize)
                .clock(ManualClock::default())
                .build()
                .unwrap();
            (0..keys).for_each(|k| assert!(l.check(&k).is_allowed()));
            seq.for_each(|k| {
                let _ = black_box(l.check(&k));
            });
            std::mem::forget(l);
        }
        "governor" => {
            let max = NonZeroU32::MAX;
            let quota = Quota::per_second(max).allow_burst(max);
            let l = Governor::dashmap_with_clock(quota, FakeRelativeClock::default());
            (0..keys).for_each(|k| assert!(l.check_key(&k).is_ok()));
            seq.for_each(|k| {
                let _ = black_box(l.check_key(&k).is_ok());
            });
            std::mem::forget(l);
        }
        "cas-str" => {
            let l = CasLimiter::<String, Gcra, _>::with_clock(gcra, ManualClock::default());
            let mut buf = String::new();
            (0..keys).for_each(|k| assert!(l.check(user(&mut buf, k, long)).is_allowed()));
            seq.for_each(|k| {
                let _ = black_box(l.check(user(&mut buf, k, long)));
            });
            std::mem::forget(l);
        }
        "compact-str" => {
            let l = CompactLimiter::<Hashed<str>, Gcra>::builder(gcra)
                .max_keys(keys as usize)
                .clock(ManualClock::default())
                .build()
                .unwrap();
            let mut buf = String::new();
            (0..keys).for_each(|k| assert!(l.check(user(&mut buf, k, long)).is_allowed()));
            seq.for_each(|k| {
                let _ = black_box(l.check(user(&mut buf, k, long)));
            });
            std::mem::forget(l);
        }
        "governor-str" => {
            let max = NonZeroU32::MAX;
            let quota = Quota::per_second(max).allow_burst(max);
            let l = Governor::dashmap_with_clock(quota, FakeRelativeClock::default());
            // governor's keyed check takes `&String`: the buffer itself, no allocation.
            let mut buf = String::new();
            (0..keys).for_each(|k| {
                user(&mut buf, k, long);
                assert!(l.check_key(&buf).is_ok())
            });
            seq.for_each(|k| {
                user(&mut buf, k, long);
                let _ = black_box(l.check_key(&buf).is_ok());
            });
            std::mem::forget(l);
        }
        other => panic!("no store {other}"),
    }
}
