//! The debt table: what capacity eviction keeps of the keys it evicts while they still owe,
//! so that a flood of new keys never hands an evicted client a fresh quota.
//!
//! A key evicted for capacity in a state that is not fresh leaves its debt words
//! ([`Algorithm::debt`]) here; a key inserted later starts from [`Algorithm::restore`] of what
//! the table holds for it. Per debt part, the table is an array of 128-byte buckets; a key
//! hashes to two of them (the less full takes it). A bucket holds two debt words (*slots*) and
//! 50 entries of 16 bits: a 15-bit tag of a key's hash and the slot holding (at least) its
//! debt.
//!
//! - Keeping a key's debt joins it ([`Algorithm::debt_join`]) into a slot of one of its
//!   buckets (the slot whose debt is paid closest to its own, so that keys of like debts share)
//!   and files an entry with the key's tag there; a key already filed there joins its entry.
//! - Reading a key back joins the slots of every live entry of its two buckets that carries its
//!   tag. A slot only ever grows while an entry needs it, so a key never comes back owing less
//!   than it left with: **no over-admission, whatever the flood**.
//! - A slot and its entries die together, when the slot's debt is paid. A new debt joins a free
//!   slot if there is one, else the slot whose debt is paid closest to its own; so under a
//!   steady flood one slot takes the new debts while the other, left alone, is paid and freed,
//!   and a bucket recycles its entries within about twice the debts' length.
//! - When both buckets of a key are full of live entries, the key's debt goes into one of them
//!   whole and that bucket turns *shared*: its slots are joined into one and every key hashed
//!   to it owes it, until it is paid. Beyond what the table can tell apart, it errs on the side
//!   of the limit.
//!
//! What it costs, besides 12.8 bytes per key of `max_keys` (5 entries per key): a new key whose
//! tag matches a live entry of another key in one of its buckets (under 100 entries against a
//! 15-bit tag: at most 0.3%, and only while they owe) or that lands on a shared bucket starts
//! from their debt (a false denial if it is large); a returning key starts from its slot's
//! debt, which joins its own with the debts of the keys sharing the slot (it waits as long as
//! the slowest of them to pay).

use crate::algo::{Algorithm, DEBT_MAX};
use crate::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries per bucket; with two 96-bit slots and the lock, 128 bytes.
const ENTRIES: usize = 50;

/// Keys of `max_keys` per bucket (of each debt part): 12.8 bytes per key, 5 entries.
const KEYS_PER_BUCKET: usize = 10;

/// The tag of a shared bucket's one entry: it stands for every key. Keys' tags are below it.
const SHARED: u16 = 0x7FFF;

/// One bucket: two debt slots (96 bits each, as three `u32`, so the bucket keeps a 4-byte
/// alignment and the lock packs beside it) and the entries (0: empty).
#[derive(Debug)]
struct Bucket {
    slots: [[u32; 3]; 2],
    entries: [u16; ENTRIES],
}

impl Default for Bucket {
    fn default() -> Self {
        Self {
            slots: [[0; 3]; 2],
            entries: [0; ENTRIES],
        }
    }
}

impl Bucket {
    fn slot(&self, i: usize) -> u128 {
        let [a, b, c] = self.slots[i];
        u128::from(a) | u128::from(b) << 32 | u128::from(c) << 64
    }

    fn set_slot(&mut self, i: usize, debt: u128) {
        self.slots[i] = [debt as u32, (debt >> 32) as u32, (debt >> 64) as u32];
    }

    fn shared(&self) -> bool {
        self.entries[0] != 0 && tag_of(self.entries[0]) == SHARED
    }
}

fn entry(tag: u16, slot: usize) -> u16 {
    tag << 1 | slot as u16
}

fn tag_of(entry: u16) -> u16 {
    entry >> 1
}

fn slot_of(entry: u16) -> usize {
    usize::from(entry & 1)
}

/// The 15-bit tag of a key's hash: bits other than those that pick its buckets, in
/// `1..SHARED`.
fn tag(hash: u64) -> u16 {
    ((hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as u16 % (SHARED - 1)) + 1
}

/// The debt table of one keyed store. See the module docs.
pub(crate) struct Debts {
    /// `parts` arrays of `buckets` buckets, one after another.
    buckets: Box<[Mutex<Bucket>]>,
    per_part: usize,
    parts: usize,
    /// Keys whose debt was kept (evicted while they owed).
    kept: AtomicU64,
    /// Keys inserted with a debt read back.
    restored: AtomicU64,
}

impl std::fmt::Debug for Debts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Debts")
            .field("buckets", &self.buckets.len())
            .field("kept", &self.kept.load(Ordering::Relaxed))
            .field("restored", &self.restored.load(Ordering::Relaxed))
            .finish()
    }
}

/// `hash` scaled onto `0..n` by a multiply-shift (its high bits).
fn scale(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}

impl Debts {
    /// A table for a store of `max_keys` keys running `algo`, or `None` if the algorithm keeps
    /// no debts. Allocated fallibly: a bound beyond memory is an error, not an abort.
    pub(crate) fn new<A: Algorithm>(
        algo: &A,
        max_keys: usize,
    ) -> Result<Option<Self>, std::collections::TryReserveError> {
        let parts = algo.debt_parts();
        if parts == 0 {
            return Ok(None);
        }
        // At least two buckets, so a key's two are distinct.
        let per_part = max_keys.div_ceil(KEYS_PER_BUCKET).max(2);
        let n = per_part.saturating_mul(parts);
        let mut buckets = Vec::new();
        buckets.try_reserve_exact(n)?;
        buckets.extend(std::iter::repeat_with(|| Mutex::new(Bucket::default())).take(n));
        Ok(Some(Self {
            buckets: buckets.into_boxed_slice(),
            per_part,
            parts,
            kept: AtomicU64::new(0),
            restored: AtomicU64::new(0),
        }))
    }

    /// The memory the buckets take, in bytes.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.buckets)
    }

    /// Keys kept, keys restored so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.kept.load(Ordering::Relaxed),
            self.restored.load(Ordering::Relaxed),
        )
    }

    /// Counts a key inserted with a debt read back.
    pub(crate) fn restored_one(&self) {
        self.restored.fetch_add(1, Ordering::Relaxed);
    }

    /// The two buckets of a key hashed to `hash` for debt part `part` (distinct).
    fn pair(&self, hash: u64, part: usize) -> [&Mutex<Bucket>; 2] {
        let n = self.per_part;
        let first = scale(hash, n);
        // A second choice from other bits of the hash, never the first.
        let second = (first + 1 + scale(hash.rotate_left(32), n - 1)) % n;
        let base = part * n;
        [&self.buckets[base + first], &self.buckets[base + second]]
    }

    /// Keeps what a key hashed to `hash` owes in `state`, judged at `now` (no later than any
    /// request that may still read the key: the sweep's `now − grace`). Must run before the
    /// key's cell is killed, so a request that finds it dead finds its debt here.
    pub(crate) fn keep<A: Algorithm>(&self, algo: &A, hash: u64, state: &A::State, now: u64) {
        let mut owed = false;
        for part in 0..self.parts {
            let debt = algo.debt(state, part);
            debug_assert!(debt <= DEBT_MAX, "a debt word wider than 96 bits");
            let paid_at = algo.debt_paid_at(part, debt);
            if debt == 0 || paid_at <= now {
                continue;
            }
            owed = true;
            self.keep_part(algo, part, hash, debt, paid_at, now);
        }
        if owed {
            self.kept.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn keep_part<A: Algorithm>(
        &self,
        algo: &A,
        part: usize,
        hash: u64,
        debt: u128,
        paid_at: u64,
        now: u64,
    ) {
        let tag = tag(hash);
        let buckets = self.pair(hash, part);
        // Already filed (kept before, then back and evicted again): join it where it is.
        let mut free = [0; 2];
        for (i, bucket) in buckets.iter().enumerate() {
            let mut b = bucket.lock();
            purge(algo, part, &mut b, now);
            if let Some(&e) = b.entries.iter().find(|&&e| e != 0 && tag_of(e) == tag) {
                let slot = slot_of(e);
                let joined = algo.debt_join(part, b.slot(slot), debt);
                b.set_slot(slot, joined);
                return;
            }
            if !b.shared() {
                free[i] = b.entries.iter().filter(|&&e| e == 0).count();
            }
        }
        // The emptier bucket; if neither has room, the first turns shared.
        let i = usize::from(free[1] > free[0]);
        let mut b = buckets[i].lock();
        purge(algo, part, &mut b, now);
        let empty = b.entries.iter().position(|&e| e == 0);
        match (b.shared(), empty) {
            (false, Some(at)) => {
                let slot = pick_slot(algo, part, &b, paid_at);
                let held = b.slot(slot);
                let joined = if held == 0 {
                    debt
                } else {
                    algo.debt_join(part, held, debt)
                };
                b.set_slot(slot, joined);
                b.entries[at] = entry(tag, slot);
            }
            _ => {
                // Every key of this bucket now owes the join of all it holds.
                let all = algo.debt_join(part, b.slot(0), b.slot(1));
                let all = algo.debt_join(part, all, debt);
                b.set_slot(0, all);
                b.set_slot(1, 0);
                b.entries = [0; ENTRIES];
                b.entries[0] = entry(SHARED, 0);
            }
        }
    }

    /// What a key hashed to `hash` owes for part `part` at `now` (0: nothing).
    fn owed<A: Algorithm>(&self, algo: &A, hash: u64, part: usize, now: u64) -> u128 {
        let tag = tag(hash);
        let mut owed = 0;
        for bucket in self.pair(hash, part) {
            let b = bucket.lock();
            for &e in &b.entries {
                if e == 0 || (tag_of(e) != tag && tag_of(e) != SHARED) {
                    continue;
                }
                let debt = b.slot(slot_of(e));
                if debt != 0 && algo.debt_paid_at(part, debt) > now {
                    owed = if owed == 0 {
                        debt
                    } else {
                        algo.debt_join(part, owed, debt)
                    };
                }
            }
        }
        owed
    }

    /// The state a key hashed to `hash` starts from when inserted at `now` (a time no later
    /// than the request's own: the sweep's `now − grace`): what it owes, or `None` to start
    /// fresh.
    pub(crate) fn restore<A: Algorithm>(&self, algo: &A, hash: u64, now: u64) -> Option<A::State> {
        let mut owed = [0u128; 4];
        let mut any = false;
        for (part, o) in owed.iter_mut().enumerate().take(self.parts) {
            *o = self.owed(algo, hash, part, now);
            any |= *o != 0;
        }
        if self.parts > owed.len() {
            any |= (owed.len()..self.parts).any(|p| self.owed(algo, hash, p, now) != 0);
        }
        if !any {
            return None;
        }
        Some(algo.restore(&|part| match owed.get(part) {
            Some(&o) => o,
            None => self.owed(algo, hash, part, now),
        }))
    }
}

/// Frees the slots whose debt is paid at `now`, with their entries.
fn purge<A: Algorithm>(algo: &A, part: usize, b: &mut Bucket, now: u64) {
    let paid = [0, 1].map(|s| {
        let d = b.slot(s);
        d == 0 || algo.debt_paid_at(part, d) <= now
    });
    let mut used = [false; 2];
    for e in b.entries.iter_mut() {
        if *e == 0 {
            continue;
        }
        if paid[slot_of(*e)] {
            *e = 0;
        } else {
            used[slot_of(*e)] = true;
        }
    }
    for (s, used) in used.into_iter().enumerate() {
        if !used {
            b.set_slot(s, 0);
        }
    }
}

/// The slot a new entry whose debt is paid at `paid_at` joins: a free one, else the one whose
/// debt is paid closest to it (keys of like debts share, so each waits little for the others).
fn pick_slot<A: Algorithm>(algo: &A, part: usize, b: &Bucket, paid_at: u64) -> usize {
    if let Some(free) = (0..2).find(|&s| b.slot(s) == 0) {
        return free;
    }
    let gap = |s: usize| algo.debt_paid_at(part, b.slot(s)).abs_diff(paid_at);
    usize::from(gap(1) < gap(0))
}

#[cfg(all(test, not(hotlimit_loom)))]
mod tests {
    use super::*;
    use crate::algo::{FixedWindow, Gcra, WordStep};
    use std::time::Duration;

    #[test]
    fn a_bucket_is_two_cache_lines() {
        assert_eq!(std::mem::size_of::<Mutex<Bucket>>(), 128);
        let gcra: Gcra = "10/s".parse().unwrap();
        let debts = Debts::new(&gcra, 1_000_000).unwrap().unwrap();
        assert_eq!(debts.bytes(), 12_800_000);
    }

    /// Keeps `n` GCRA keys spent to `tat` in a table for `max` keys, then reads back keys
    /// `0..n` (kept) and `n..2n` (new): how many of each come back owing.
    fn fill(n: u64, max: usize) -> (u64, u64) {
        let gcra: Gcra = "10/s burst 20".parse().unwrap();
        let debts = Debts::new(&gcra, max).unwrap().unwrap();
        let tat = 2_000_000_000;
        let h = |k: u64| ahash::RandomState::with_seeds(1, 2, 3, 4).hash_one(k);
        for k in 0..n {
            debts.keep(&gcra, h(k), &tat, 0);
        }
        let owing = |keys: std::ops::Range<u64>| {
            keys.filter(|&k| {
                let state = debts.restore(&gcra, h(k), 0);
                if let Some(s) = state {
                    assert!(s >= tat || k >= n, "key {k} came back owing less");
                }
                state.is_some()
            })
            .count() as u64
        };
        (owing(0..n), owing(n..2 * n))
    }

    #[test]
    fn every_kept_key_comes_back_owing_and_few_new_ones_do() {
        // 40,000 keys kept in a table for 10,000 (5 entries per key): all back, and the new
        // keys owe only by a tag collision.
        let (kept, new) = fill(40_000, 10_000);
        assert_eq!(kept, 40_000);
        assert!(new < 120, "{new} of 40,000 new keys owe");
        // Far past what it can tell apart, it shares: still every kept key owes.
        let (kept, new) = fill(200_000, 10_000);
        assert_eq!(kept, 200_000);
        assert!(new > 180_000, "{new}");
    }

    #[test]
    fn paid_debts_free_their_entries() {
        let gcra: Gcra = "10/s burst 20".parse().unwrap();
        let debts = Debts::new(&gcra, 10).unwrap().unwrap();
        let second = 1_000_000_000;
        // 1,000 keys each owing 100 ms, one every 10 ms into a table of two buckets: the slots
        // take turns, each paid within about 200 ms, so the table never turns shared.
        for k in 0..1_000u64 {
            let now = k * 10_000_000;
            debts.keep(
                &gcra,
                k.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                &(now + second / 10),
                now,
            );
        }
        let now = 999 * 10_000_000;
        // A key never kept owes nothing (no shared bucket), one kept last owes its debt.
        let owing = (0..1_000u64)
            .filter(|k| {
                debts
                    .restore(&gcra, k.wrapping_mul(0x51_7CC1_B727_220B), now)
                    .is_some()
            })
            .count();
        assert!(owing < 10, "{owing} of 1,000 new keys owe");
        let last = 999u64.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        assert_eq!(debts.restore(&gcra, last, now), Some(now + second / 10));
        assert!(debts.restore(&gcra, last, now + second).is_none());
    }

    #[test]
    fn a_window_debt_comes_back_with_its_count() {
        let w = FixedWindow::new(20, Duration::from_secs(60)).unwrap();
        let debts = Debts::new(&w, 100).unwrap().unwrap();
        let mut state = w.fresh();
        for _ in 0..7 {
            state = w.step(state, 0, 1).state.unwrap_or(state);
        }
        debts.keep(&w, 42, &state, 0);
        assert_eq!(debts.restore(&w, 42, 1_000), Some(state));
        assert_eq!(debts.restore(&w, 42, 60_000_000_000), None);
        assert_eq!(debts.counts(), (1, 0));
    }
}
