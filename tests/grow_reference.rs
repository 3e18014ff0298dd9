//! The growable one-line table the scale bench measures (`benches/common/grow.rs`, issue #61's
//! layout) loses nothing while it grows: threads update keys while inserts split lines under
//! them, and every key ends with exactly the updates it was given, held once.

#[path = "../benches/common/grow.rs"]
#[allow(dead_code)]
mod grow;

use grow::GrowTable;
use std::collections::HashMap;

/// A few random keys per thread, from a seed: xorshift, no dependency.
fn keys(seed: u64, n: usize, of: u64) -> Vec<u64> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % of
        })
        .collect()
}

#[test]
fn growth_under_concurrent_updates_loses_no_update_and_holds_each_key_once() {
    // Three threads hammer 1,000 hot keys while a fourth inserts 150,000 new ones: the table
    // grows from 64 lines through a dozen levels, moving hot keys while they are updated.
    const HOT: u64 = 1_000;
    const NEW: u64 = 150_000;
    // Three rounds: a move and an update of one key meet in a window a few instructions wide.
    for round in 0..3 {
        grows_without_loss(round, HOT, NEW);
    }
}

fn grows_without_loss(round: u64, hot_keys: u64, new_keys: u64) {
    let table = GrowTable::default();
    let hot: Vec<Vec<u64>> = (0..3)
        .map(|t| keys(0x9E37 + 8 * round + t, 200_000, hot_keys))
        .collect();
    let new: Vec<u64> = (hot_keys..hot_keys + new_keys).collect();
    std::thread::scope(|s| {
        for seq in hot.iter().chain([&new]) {
            let table = &table;
            s.spawn(move || {
                for &k in seq {
                    table.update(k, 0, |state| *state += 1);
                }
            });
        }
    });
    let mut want: HashMap<u64, u64> = HashMap::new();
    for k in hot.iter().chain([&new]).flatten() {
        *want.entry(*k).or_default() += 1;
    }
    let held = table.entries();
    let mut got: HashMap<u64, u64> = HashMap::new();
    for &(k, state) in &held {
        assert!(got.insert(k, state).is_none(), "key {k} held twice");
    }
    assert_eq!(got.len(), want.len(), "keys held");
    assert_eq!(table.len(), want.len() as u64);
    for (k, n) in &want {
        assert_eq!(got.get(k), Some(n), "key {k}'s updates");
    }
}

#[test]
fn each_update_sees_the_state_the_previous_one_left_on_one_thread() {
    let table = GrowTable::default();
    let seq = keys(7, 50_000, 20_000);
    let mut model: HashMap<u64, u64> = HashMap::new();
    for &k in &seq {
        let seen = table.update(k, 0, |state| {
            *state += 3;
            *state
        });
        let m = model.entry(k).or_default();
        *m += 3;
        assert_eq!(seen, *m, "key {k}");
    }
}
