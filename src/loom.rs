//! The crate's loom models of its private parts (the hybrid limiter's entry has its own, beside
//! its protocol in `src/redis/hybrid/lease.rs`): the eviction protocol of the
//! papaya store's cells, and the compact table (inserts racing inserts, sweeps racing requests
//! while another key takes the freed slot). The models of the public limiters are in
//! `tests/loom.rs`.
//!
//! `RUSTFLAGS="--cfg hotlimit_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --lib loom`.

// loom models of the eviction protocol: a sweep racing requests for the same key.
//
// `RUSTFLAGS="--cfg hotlimit_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --lib loom`.
// loom cannot model papaya, so a one-slot map (a loom mutex around the key's current cell)
// stands in for it; the cells and their CAS protocol are the real ones, and `check` and
// `sweep` below follow `Shared::decide` and `Shared::sweep` step by step.
mod cells {
    use crate::algo::{Algorithm, Gcra};
    use crate::cell::{CasCell, StateCell};
    use crate::decision::Policy;
    use crate::stats::Stats;
    use loom::sync::{Arc, Mutex};
    use loom::thread;

    pub(super) type Cell = Arc<CasCell<u64>>;

    /// The key's entry in the map: its current cell, if any.
    pub(super) struct MapEntry(pub(super) Mutex<Option<Cell>>);

    impl MapEntry {
        fn get_or_insert(&self, fresh: u64) -> Cell {
            let mut slot = self.0.lock().unwrap();
            slot.get_or_insert_with(|| Arc::new(StateCell::new(fresh)))
                .clone()
        }

        pub(super) fn get(&self) -> Option<Cell> {
            self.0.lock().unwrap().clone()
        }

        /// papaya's `try_insert`: the cell in the slot, and whether it is a new one of `state`.
        pub(super) fn try_insert(&self, state: u64) -> (Cell, bool) {
            let mut slot = self.0.lock().unwrap();
            let inserted = slot.is_none();
            (
                slot.get_or_insert_with(|| Arc::new(StateCell::new(state)))
                    .clone(),
                inserted,
            )
        }

        /// papaya's `remove_if(key, |_, c| ptr::eq(c, cell))`.
        pub(super) fn remove_if_same(&self, cell: &Cell) {
            let mut slot = self.0.lock().unwrap();
            if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, cell)) {
                *slot = None;
            }
        }
    }

    /// A request: `Shared::decide`. Returns whether it was allowed.
    fn check(slot: &MapEntry, g: &Gcra, now: u64, stats: &Stats) -> bool {
        loop {
            let cell = slot.get_or_insert(g.fresh());
            let allowed = cell.update(stats, |w| g.update(w, now, 1).is_allowed());
            match allowed {
                Some(allowed) => return allowed,
                None => slot.remove_if_same(&cell),
            }
        }
    }

    /// One key's share of a sweep: `Shared::sweep`.
    fn sweep(slot: &MapEntry, g: &Gcra, now: u64) {
        if let Some(cell) = slot.get() {
            if cell.kill_if(|w| g.idle_at(w) <= now) {
                slot.remove_if_same(&cell);
            }
        }
    }

    /// Two requests at `now` race a sweep of a key that was idle when they started. Whatever
    /// the interleaving, the totals and the surviving state are those of the two requests run
    /// alone: the sweep loses no update and counts nothing twice.
    fn model(policy: Policy, want_allowed: usize, want_tat: u64) {
        loom::model(move || {
            let g = "100/s burst 1".parse::<Gcra>().unwrap().with_policy(policy);
            let now = 1_000_000_000;
            // Last request long ago: tat in the past, so the key is idle.
            let slot = Arc::new(MapEntry(Mutex::new(Some(Arc::new(StateCell::new(5u64))))));
            let stats = Arc::new(Stats::default());
            let requests: Vec<_> = (0..2)
                .map(|_| {
                    let (slot, stats) = (slot.clone(), stats.clone());
                    thread::spawn(move || check(&slot, &g, now, &stats))
                })
                .collect();
            let sweeper = {
                let slot = slot.clone();
                thread::spawn(move || sweep(&slot, &g, now))
            };
            let allowed = requests
                .into_iter()
                .map(|h| h.join().unwrap())
                .filter(|&a| a)
                .count();
            sweeper.join().unwrap();
            assert_eq!(allowed, want_allowed);
            let tat = slot.get().map(|c| c.load());
            assert_eq!(tat, Some(want_tat));
        });
    }

    // Pins G3.
    #[test]
    fn loom_sweep_vs_checks_leaky() {
        // One admitted (tat = now + T); the denial writes nothing.
        model(Policy::Leaky, 1, 1_000_000_000 + 10_000_000);
    }

    // Pins G3.
    #[test]
    fn loom_sweep_vs_checks_strict() {
        // One admitted, both counted: tat = now + 2T.
        model(Policy::Strict, 1, 1_000_000_000 + 20_000_000);
    }
}

// loom model of the papaya store's capacity eviction with its debt table: `cells`' one-slot
// map, the real cells, the real `Core` and debt table. `check` follows `Shared::apply` and
// `insert_fresh` (the debt's stamp, the start state, the insert, the catch-up) step by step,
// `evict` a capacity pass's `kill_pass` on a key its cut dooms (the debt kept, then the kill).
mod capacity {
    use super::cells::{Cell, MapEntry};
    use crate::algo::{Algorithm, Gcra};
    use crate::cell::StateCell;
    use crate::clock::ManualClock;
    use crate::shared::{Core, Options};
    use loom::sync::{Arc, Mutex};
    use loom::thread;
    use std::time::Duration;

    type Shared = (MapEntry, Core<Gcra, ManualClock>);
    const HASH: u64 = 0x9E37_79B9_7F4A_7C15; // the key's debt hash
    const NOW: u64 = 1_000_000_000;

    fn check((slot, core): &Shared) -> bool {
        loop {
            let cell = slot.get().unwrap_or_else(|| {
                let stamp = core.debt_stamp(HASH);
                let (cell, inserted) = slot.try_insert(core.start_state(|| HASH));
                if inserted {
                    core.catch_up(HASH, stamp, |merge| _ = cell.rewrite(merge));
                }
                cell
            });
            match core.update(&*cell, |w| core.algo.update(w, NOW, 1).is_allowed()) {
                Some(allowed) => return allowed,
                None => slot.remove_if_same(&cell),
            }
        }
    }

    fn evict((slot, core): &Shared) {
        if let Some(cell) = slot.get() {
            let now = core.sweep_now();
            if cell.kill_if(|w| {
                core.keep_debt(|| HASH, w, now);
                true
            }) {
                slot.remove_if_same(&cell);
            }
        }
    }

    /// Two requests for a new key race, one thread then evicting it for capacity: whatever the
    /// interleaving, one is admitted, and the key ends owing it (held, or in the debt table).
    /// The other may insert the key fresh after reading no debt, while the first inserts,
    /// spends and evicts it: only the catch-up (the stamp changed) denies it.
    // Pins G24.
    #[test]
    fn loom_papaya_capacity_eviction_vs_inserts_keeps_the_debt() {
        loom::model(|| {
            let g = "100/s burst 1".parse::<Gcra>().unwrap();
            let (clock, grace) = (ManualClock::default(), Duration::ZERO);
            clock.set(Duration::from_nanos(NOW));
            let options = Options {
                max_keys: Some(3),
                grace,
                ..Options::default()
            };
            let core = Core::new(g, clock, &options).with_debts(&options).unwrap();
            let shared = Arc::new((MapEntry(Mutex::new(None)), core));
            let a = {
                let s = shared.clone();
                thread::spawn(move || check(&s))
            };
            let b = {
                let s = shared.clone();
                thread::spawn(move || (check(&s), evict(&s)).0)
            };
            assert_eq!(a.join().unwrap() as u8 + b.join().unwrap() as u8, 1);
            let (slot, core) = &*shared;
            let held = slot.get().and_then(|c: Cell| c.inspect(|&w| w));
            assert_eq!(
                held.unwrap_or_else(|| core.start_state(|| HASH)),
                NOW + 10_000_000
            );
        });
    }
}

// loom models of the compact table: inserts of one key racing each other, and a sweep racing
// requests while another key takes the freed slot (the ABA case).
//
// `RUSTFLAGS="--cfg hotlimit_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --lib loom`.
// The table, slots, stripe locks and reach counters are the real ones, on loom's atomics and
// mutexes; the 128-bit pair is modelled by a loom mutex (see `sync::Atomic128`). A table of
// 3 keys is one line of 4 slots, so every key shares the home line and competes for slots.
mod compact {
    use crate::algo::Gcra;
    use crate::clock::ManualClock;
    use crate::compact::table::preferred_slot;
    use crate::compact::CompactLimiter;
    use crate::decision::Policy;
    use crate::store::Variant;
    use crate::store::{Cas, Locked};
    use crate::RateLimiter;
    use crate::Requests;
    use loom::sync::Arc;
    use loom::thread;
    use std::time::Duration;

    const T: u64 = 10_000_000; // 100/s
    const NOW: u64 = 1_000_000_000;

    type Limiter<V> = CompactLimiter<u64, Gcra, ManualClock, V>;

    fn limiter<V: Variant<Gcra>>(policy: Policy) -> (Limiter<V>, ManualClock) {
        let g = "100/s burst 1".parse::<Gcra>().unwrap().with_policy(policy);
        let clock = ManualClock::default();
        let l = CompactLimiter::builder(g)
            .max_keys(3)
            .clock(clock.clone())
            .sweep_grace(Duration::ZERO)
            .build()
            .unwrap();
        (l, clock)
    }

    /// The state a key is left in, read through a probe request: with burst 1 and tat ≥ now
    /// the probe is denied, and its retry_after pins tat (leaky: tat − now).
    fn leaky_wait<V: Variant<Gcra>>(l: &Limiter<V>, key: u64) -> u64 {
        let d = l.check(&key);
        assert!(d.is_denied(), "key {key} admitted by the probe: {d:?}");
        d.retry_after_nanos()
    }

    /// Two threads insert the same new key at once: exactly one request admitted, one key
    /// held, one slot used.
    fn concurrent_inserts<V: Variant<Gcra>>() {
        loom::model(|| {
            let (l, clock) = limiter::<V>(Policy::Leaky);
            clock.set(Duration::from_nanos(NOW));
            let l = Arc::new(l);
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let l = l.clone();
                    thread::spawn(move || l.check(&7).is_allowed())
                })
                .collect();
            let allowed = hs.into_iter().map(|h| h.join().unwrap());
            assert_eq!(allowed.filter(|&a| a).count(), 1);
            assert_eq!(l.metrics().keys, 1);
            assert_eq!(l.probe_stats().keys, 1);
            assert_eq!(leaky_wait(&l, 7), T);
        });
    }

    // Pins G3.
    #[test]
    fn loom_compact_concurrent_inserts_of_one_key() {
        concurrent_inserts::<Cas>();
    }

    /// The same through lock slots: the hint word read without the lock, the entry under it.
    // Pins G3.
    #[test]
    fn loom_compact_locked_concurrent_inserts_of_one_key() {
        concurrent_inserts::<Locked>();
    }

    /// A request for key 7 races a sweep that may evict it, while a request for a new key
    /// (one that prefers 7's slot) may take the freed slot. Whatever the interleaving, each
    /// key ends with exactly its own request counted: a stale CAS for 7 never lands in the
    /// other key's slot and 7's request is never lost. With `prefill`, 7 starts idle
    /// (tat = T); without, the request inserts 7 fresh, and the sweep can free the slot
    /// between that insert and the request's CAS, so the other key may be installed in it
    /// with the very state (fresh) 7's request read: only the key half of the pair CAS stops
    /// the stale write (a state-only CAS fails this model).
    fn evict_vs_check<V: Variant<Gcra>>(policy: Policy, prefill: bool) {
        loom::model(move || {
            let (l, clock) = limiter::<V>(policy);
            // A second key that prefers the same slot as 7, so it takes 7's slot when the
            // sweep frees it (the reuse under test), not a free neighbour.
            let pref = |k: u64| preferred_slot(l.store.0.locate(&k).1);
            let other = (8..).find(|&k| pref(k) == pref(7)).unwrap();
            if prefill {
                assert!(l.check(&7).is_allowed()); // tat = T
            }
            clock.set(Duration::from_nanos(NOW)); // 7 is idle now
            let l = Arc::new(l);
            let a = {
                let l = l.clone();
                thread::spawn(move || l.check(&7).is_allowed())
            };
            let b = {
                let l = l.clone();
                thread::spawn(move || {
                    l.sweep();
                })
            };
            let c = {
                let l = l.clone();
                thread::spawn(move || l.check(&other).is_allowed())
            };
            assert!(a.join().unwrap());
            b.join().unwrap();
            assert!(c.join().unwrap());
            assert_eq!(l.metrics().keys, 2);
            assert_eq!(l.probe_stats().keys, 2);
            // Each key: tat = NOW + T, so the probe waits exactly T (leaky) or 2T (strict:
            // the probe itself is counted).
            let want = if policy == Policy::Strict { 2 * T } else { T };
            assert_eq!(leaky_wait(&l, 7), want);
            assert_eq!(leaky_wait(&l, other), want);
        });
    }

    // Pins G3.
    #[test]
    fn loom_compact_evict_idle_vs_check_leaky() {
        evict_vs_check::<Cas>(Policy::Leaky, true);
    }

    // Pins G3.
    #[test]
    fn loom_compact_evict_fresh_vs_check_leaky() {
        evict_vs_check::<Cas>(Policy::Leaky, false);
    }

    // Pins G3.
    #[test]
    fn loom_compact_locked_evict_fresh_vs_check_leaky() {
        evict_vs_check::<Locked>(Policy::Leaky, false);
    }

    // Pins G3.
    #[test]
    fn loom_compact_evict_fresh_vs_check_strict() {
        evict_vs_check::<Cas>(Policy::Strict, false);
    }

    /// A request for key `moving` races the split that moves it: four keys in a table of
    /// one home line (`max_keys(6)`: two home lines at most, 3/4 full), the fourth's insert
    /// splits the line, and `moving` is one whose home becomes the new line. Whatever the
    /// interleaving, the request is counted exactly once (or, with `peek`, sees the key's
    /// state, never a fresh one) and every key is held once.
    fn split_vs_request(peek: bool) {
        loom::model(move || {
            let l: Limiter<Cas> = CompactLimiter::builder("100/s burst 1".parse::<Gcra>().unwrap())
                .max_keys(6)
                .clock(ManualClock::default())
                .build()
                .unwrap();
            let moves = |k: u64| (l.store.0.locate(&k).1 >> 1) & 1 == 1;
            let stays = |k: u64| !moves(k);
            let moving = (1..).find(|&k| moves(k)).unwrap();
            let others: Vec<u64> = (1..).filter(|&k| stays(k)).take(2).collect();
            for k in [moving, others[0], others[1]] {
                assert!(l.check(&k).is_allowed()); // tat = T
            }
            assert_eq!(l.probe_stats().lines, 2, "one home line and its window");
            let fourth = (moving + 1..).find(|&k| !others.contains(&k)).unwrap();
            let l = Arc::new(l);
            let a = {
                let l = l.clone();
                thread::spawn(move || {
                    if peek {
                        l.request(&moving).peek().unwrap().is_allowed()
                    } else {
                        l.check(&moving).is_allowed()
                    }
                })
            };
            let b = {
                let l = l.clone();
                thread::spawn(move || l.check(&fourth).is_allowed())
            };
            assert!(!a.join().unwrap(), "key {moving} seen fresh while it moved");
            assert!(b.join().unwrap());
            let stats = l.probe_stats();
            assert_eq!((stats.keys, stats.lines), (4, 3), "{stats:?}");
            assert_eq!(l.metrics().keys, 4);
            // Burst 1, tat = T: a leaky denial writes nothing, so the probe waits T.
            assert_eq!(leaky_wait(&l, moving), T);
        });
    }

    // Pins G3.
    #[test]
    fn loom_compact_split_vs_check() {
        split_vs_request(false);
    }

    // Pins G3.
    #[test]
    fn loom_compact_split_vs_peek() {
        split_vs_request(true);
    }

    /// A check of key `back` races the split that brings it home: a table of two home lines
    /// (`max_keys(12)`: four at most, 3/4 full), line 0 full of its own keys and `back`, a
    /// fifth of line 0's, overflowed into line 1. A seventh key's insert splits line 0: a key
    /// bound for the image leaves, and `back`, which stays, is killed in line 1 and claimed
    /// in line 0. Whatever the interleaving, the check is counted exactly once, every key is
    /// held once, and every key ends in its home line.
    // Pins G3.
    #[test]
    fn loom_compact_split_brings_a_key_home_vs_check() {
        // Seven keys' inserts and a split of two lines take more than loom's default 1,000
        // branches in one execution.
        let mut model = loom::model::Builder::new();
        model.max_branches = 10_000;
        model.check(|| {
            let l: Limiter<Cas> = CompactLimiter::builder("100/s burst 1".parse::<Gcra>().unwrap())
                .max_keys(12)
                .clock(ManualClock::default())
                .build()
                .unwrap();
            // Level 1's home line is hash bit 1; its split's image takes bit 2.
            let fp = |k: u64| l.store.0.locate(&k).1;
            let line = |k: u64| (fp(k) >> 1) & 1;
            let leaves = |k: u64| (fp(k) >> 2) & 1 == 1;
            let zeros: Vec<u64> = (1..).filter(|&k| line(k) == 0).take(64).collect();
            let ones: Vec<u64> = (1..).filter(|&k| line(k) == 1).take(2).collect();
            // Four for line 0, one of them leaving at the split; `back`, the fifth, stays.
            let gone = *zeros.iter().find(|&&k| leaves(k)).unwrap();
            let mut four: Vec<u64> = zeros
                .iter()
                .copied()
                .filter(|&k| !leaves(k))
                .take(4)
                .collect();
            let back = four.pop().unwrap();
            four.push(gone);
            // Three keys fill the one home line; the fourth (line 1's) starts level 1.
            for k in [four[0], four[1], four[2], ones[0], four[3], back] {
                assert!(l.check(&k).is_allowed()); // tat = T
            }
            let before = l.probe_stats();
            // `back` alone sits past its home line.
            assert_eq!(before.keys, 6, "{before:?}");
            assert_eq!(before.in_home_line, 5.0 / 6.0, "{before:?}");
            let l = Arc::new(l);
            let a = {
                let l = l.clone();
                thread::spawn(move || l.check(&back).is_allowed())
            };
            let b = {
                let l = l.clone();
                thread::spawn(move || l.check(&ones[1]).is_allowed())
            };
            assert!(
                !a.join().unwrap(),
                "key {back} seen fresh while it came home"
            );
            assert!(b.join().unwrap());
            let stats = l.probe_stats();
            assert_eq!(stats.keys, 7, "{stats:?}");
            assert_eq!(stats.in_home_line, 1.0, "{stats:?}");
            assert_eq!(l.metrics().keys, 7);
            // Burst 1, tat = T: a leaky denial writes nothing, so the probe waits T.
            assert_eq!(leaky_wait(&l, back), T);
        });
    }

    /// A request for a spent key races the capacity pass that evicts it (it spent first: the
    /// closest to fresh of four keys held against `max_keys(3)`). Whatever the interleaving,
    /// the request is denied and the key keeps its exact state: the pass keeps the key's debt
    /// before the key's slot dies, so a request that finds it gone starts from the debt.
    /// With the debt table opted out (`forget_evicted_limits`) this model fails.
    // Pins G24.
    #[test]
    fn loom_compact_capacity_eviction_vs_check_keeps_the_debt() {
        loom::model(|| {
            let (l, clock) = limiter::<Cas>(Policy::Leaky);
            // tat = t + T: 7 at 10 ms, the others after it; none idle at 5 ms.
            for (i, key) in [7u64, 8, 9, 10].into_iter().enumerate() {
                clock.set(Duration::from_nanos(i as u64 * 1_000_000));
                assert!(l.check(&key).is_allowed());
            }
            clock.set(Duration::from_nanos(5_000_000));
            let l = Arc::new(l);
            let a = {
                let l = l.clone();
                thread::spawn(move || l.check(&7).is_allowed())
            };
            let b = {
                let l = l.clone();
                thread::spawn(move || l.sweep().evicted_capacity)
            };
            assert!(!a.join().unwrap(), "the evicted key was admitted");
            assert_eq!(b.join().unwrap(), 1);
            // 7's tat is still 10 ms: a retry waits exactly 5 ms.
            assert_eq!(leaky_wait(&l, 7), T / 2);
        });
    }
}
