//! The debt table: what capacity eviction keeps of the keys it evicts while they still owe,
//! so that a flood of new keys never hands an evicted client a fresh quota.
//!
//! A key evicted for capacity in a state that is not fresh leaves its debt words
//! ([`Debt::debt`](crate::algo::Debt::debt)) here; a key inserted later starts from [`Debt::restore`](crate::algo::Debt::restore) of what
//! the table holds for it. Per debt part, the table is an array of 128-byte buckets; a key
//! hashes to two of them (the first takes it while it has room to spare, else the emptier).
//! A bucket holds two debt words (*slots*) and 48 cells of 16 bits, each an entry (a 15-bit
//! tag of a key's hash and the slot holding, at least, its debt) or the code of the entry
//! before it (below), which also keeps 5 more bits of the key's hash. A bucket is a sequence lock: readers (every
//! key inserted) read it without writing shared memory and retry if a writer (an eviction)
//! was inside; writers take turns.
//!
//! - Keeping a key's debt joins it ([`Debt::debt_join`](crate::algo::Debt::debt_join)) into a slot of one of its
//!   buckets (the slot whose debt is paid closest to its own, so that keys of like debts share)
//!   and files an entry with the key's tag there; a key already filed there joins its entry.
//!   A debt its buckets already cover (its own entry's slot, or its class's marker's, owes at
//!   least as much) is not written at all: it neither grows a slot nor takes an entry.
//! - Reading a key back joins the slots of every live entry of its two buckets that carries its
//!   tag (or a marker of its group, below). A slot only ever grows while an entry needs it, so
//!   a key never comes back owing less than it left with: **no over-admission** while the
//!   table can file every debt (by measurement, floods of 400× `max_keys` forget no key).
//! - A slot and its entries die together, when the slot's debt is paid. A new debt joins a free
//!   slot if there is one, else the slot whose debt is paid closest to its own; so under a
//!   steady flood one slot takes the new debts while the other, left alone, is paid and freed,
//!   and a bucket recycles its entries within about twice the debts' length.
//! - When both buckets of a key are full of live entries (past about 9.3× `max_keys` of debts
//!   owed at once), the table *overflows by group* ([`overflow_into`]). Keys of classes 1 to
//!   15 (the tag modulo 16) are groups 1 to 15: another key's entry gives its place to an
//!   overflow marker of both keys' groups, pointing to that entry's slot, which takes the new
//!   debt; from then on every key of either group in that bucket owes the slot, the displaced
//!   key among them, until it is paid. Keys of class 0 (one in 16) keep entries of their own,
//!   made room for by folding two keys' entries into one marker, so newcomers are denied
//!   gradually (by measurement 0.3% at 10×, under half at 12×, 94% at 100×), never all: only
//!   once a bucket has no entry of groups 1 to 15 left are the keys of class 0 grouped too, by
//!   their next four bits, and one key in 256 (group 0) is never marked. Such a key is the
//!   table's overflow budget: in a bucket of nothing but markers and keys of group 0 it is not
//!   filed, and comes back fresh.
//!
//! What it costs, besides 25.6 bytes per key of `max_keys` (9.6 entries per key; at least
//! 2 KiB a part): a new key
//! whose tag matches a live entry of another key in one of its buckets (under 96 entries
//! against a 15-bit tag, 20 bits where the entry has a code: at most 0.3%, and only while
//! they owe; between two keys of a working set, for as long as the other owes), or whose
//! group is marked in
//! one of its buckets, starts from their debt (a false denial if it is large); a returning key
//! starts from its slot's debt, which joins its own with the debts of the keys sharing the slot
//! (it waits as long as the slowest of them to pay), unless its entry carries a code.
//!
//! - **Codes.** Where the algorithm ranks its debt words ([`Debt::debt_rank`](crate::algo::Debt::debt_rank): every
//!   algorithm of the crate but the in-flight limit), a key's entry carries, in the cell
//!   after it (and the next, for 11 more bits of precision or a second number),
//!   how far below its slot's debt the debts filed under it rank ([`Codes`]); the key comes
//!   back owing that, not its slot-mates' debts, and the entry dies once that is paid. A code
//!   is only ever made with its entry (an entry without one may stand for keys whose own debts
//!   are not known), joined as its keys' debts are, and moved by whole units as its slot
//!   grows. When a bucket's entries and codes do not fit its cells, codes lose their second
//!   cell of precision first, then the codes that say least are dropped (their keys owe the
//!   slot): entries come first, so a flood is told apart as before. Where codes may have two
//!   lanes, the table has 4 keys of `max_keys` per bucket (32 bytes per key), not 5.

use crate::algo::{Algorithm, DEBT_MAX};
use crate::sync::{AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

mod bucket;
mod codes;

use bucket::{
    covers, entry, group, is_marker, slot_of, tag, tag_of, Bucket, Plain, Tag, ENTRIES, MARKER,
    NO_CODE,
};
use codes::Codes;

/// A key's first bucket takes its debt at once while it has more free entries than this.
const ROOMY: usize = ENTRIES / 4;

/// Keys of `max_keys` per bucket (of each debt part): 25.6 bytes per key, 9.6 entries, so
/// that a flood of 10× `max_keys` keys that each owe (9× evicted) fits with room to spare.
const KEYS_PER_BUCKET: usize = 5;

/// The same where a part's codes may have two lanes
/// ([`Debt::debt_lanes`](crate::algo::Debt::debt_lanes) 2): 32 bytes per key, so that a
/// working set of 4× `max_keys` keeps its codes (at 5, 94% of the cells).
const KEYS_PER_BUCKET_TWO_LANES: usize = 4;

/// The debt table of one keyed store. See the module docs.
pub(crate) struct Debts {
    /// `parts` arrays of `per_part` buckets, one after another.
    buckets: Box<[Bucket]>,
    per_part: usize,
    parts: usize,
    /// Per stripe (picked by the key's hash): keys whose debt was kept (evicted while they
    /// owed), keys inserted with a debt read back. Striped: a flood restores on every insert,
    /// and one counter would bounce its cache line between the inserting threads.
    counts: Box<[CachePadded<[AtomicU64; 2]>]>,
}

/// The fewest buckets a part has, whatever `max_keys`: 2 KiB.
const MIN_BUCKETS: usize = 16;

/// Counter stripes.
const COUNT_STRIPES: usize = 8;

impl std::fmt::Debug for Debts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Debts")
            .field("buckets", &self.buckets.len())
            .field("counts", &self.counts())
            .finish()
    }
}

/// MurmurHash3's 64-bit finalizer: every bit of `h` moves every bit of the result.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ h >> 33
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
        let per_bucket = if (0..parts).any(|p| algo.debt_lanes(p) > 1) {
            KEYS_PER_BUCKET_TWO_LANES
        } else {
            KEYS_PER_BUCKET
        };
        // At least `MIN_BUCKETS` (two, so a key's two are distinct): a table of a few buckets
        // has no room for chance, and one bucket of four that drew more than its share of a
        // working set's debts dropped their codes (4× `max_keys(16)` lost up to 5.3%).
        let per_part = max_keys.div_ceil(per_bucket).max(MIN_BUCKETS);
        let n = per_part.saturating_mul(parts);
        let mut buckets = Vec::new();
        buckets.try_reserve_exact(n)?;
        buckets.extend(std::iter::repeat_with(Bucket::default).take(n));
        Ok(Some(Self {
            buckets: buckets.into_boxed_slice(),
            per_part,
            parts,
            counts: (0..COUNT_STRIPES)
                .map(|_| CachePadded::new([AtomicU64::new(0), AtomicU64::new(0)]))
                .collect(),
        }))
    }

    /// The memory the buckets take, in bytes.
    #[cfg(all(test, not(hotlimit_loom)))]
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.buckets)
    }

    /// Keys kept, keys restored so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let sum = |i: usize| {
            self.counts
                .iter()
                .map(|c| c[i].load(Ordering::Relaxed))
                .sum()
        };
        (sum(0), sum(1))
    }

    /// Counts one more key of hash `hash`: kept (`i` 0) or restored (1).
    fn count(&self, hash: u64, i: usize) {
        self.counts[(hash >> 61) as usize % COUNT_STRIPES][i].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a key (hashed to `hash`) inserted with a debt read back.
    pub(crate) fn restored_one(&self, hash: u64) {
        self.count(hash, 1);
    }

    /// The two buckets of a key hashed to `hash` for debt part `part` (distinct).
    fn pair(&self, hash: u64, part: usize) -> [&Bucket; 2] {
        // Mixed first: the keys a store evicts together are not a random sample of hashes (a
        // sweep walks its table in hash order), and unmixed they would crowd a few buckets.
        let hash = mix(hash);
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
            self.count(hash, 0);
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
        // Already owed (its own entry, or a shared bucket, holds as much): nothing to write. A
        // flood's keys mostly land here once the table shares, and a read touches one cache
        // line of a shared bucket where a write would touch both.
        let owed = self.owed(algo, hash, part);
        if owed != 0 && algo.debt_join(part, owed, debt) == owed {
            return;
        }
        let c = Codes::of(algo, part);
        // A slot word's debt joined with this one.
        let join = |slot: u128| {
            let held = c.debt(slot);
            if held == 0 {
                debt
            } else {
                algo.debt_join(part, held, debt)
            }
        };
        // The code of this debt on slot `s` (which holds it), where the part is coded.
        let own = |b: &Plain, s: usize| c.code(b.slots[s], debt);
        // Files the debt in a bucket (under its write lock): joined to the key's entry if it
        // has one there (kept before, back, and evicted again), else in a new entry if there
        // is room (`None` if not, unless `overflow`: then under a marker).
        let file = |b: &mut Plain, overflow: bool| {
            purge(c, b, now);
            if let Some(at) = b.find_at(tag) {
                let s = slot_of(b.entries[at]);
                c.grow(b, s, join(b.slots[s]), Some(debt));
                // An entry without a code stands for keys whose own debts are not known: it
                // never takes one.
                if b.codes[at] != NO_CODE {
                    b.codes[at] = c.least(b.slots[s], b.codes[at], own(b, s));
                }
                return Some(());
            }
            if let Some(at) = b.entries.iter().position(|&e| e == 0) {
                let slot = pick_slot(c, b, paid_at);
                c.grow(b, slot, join(b.slots[slot]), Some(debt));
                b.set(at, tag, slot, own(b, slot));
                return Some(());
            }
            if overflow && overflow_into(c, b, tag, paid_at, debt, join, &own) {
                return Some(());
            }
            None
        };
        // The first bucket takes it at once while it has room to spare (one write: a capacity
        // pass keeps thousands of debts, and each costs its cache misses), unless the other
        // has the key's entry: a key filed in both owes the join of both, and its entry there
        // may have lost its code.
        // (Read only where entries carry codes: elsewhere it is one more cache miss per debt
        // kept for nothing.)
        let elsewhere = c.coded && {
            let b = buckets[1].read();
            b.has_own(tag)
        };
        let first = buckets[0].write(|b| {
            let roomy = b.cells_free() > ROOMY && !elsewhere;
            if roomy || b.find(tag).is_some() {
                file(b, false)
            } else {
                None
            }
        });
        if first.is_some() {
            return;
        }
        // Else, judged on copies: the bucket that has the key takes it, else the emptier one;
        // if it filled meanwhile, the other; if neither has room, it overflows.
        let copies = buckets.map(|b| {
            let mut copy = b.read();
            purge(c, &mut copy, now);
            copy
        });
        let has = |b: &Plain| b.find(tag).is_some();
        let i = if has(&copies[0]) {
            0
        } else if has(&copies[1]) {
            1
        } else {
            // Entries first (codes are dropped to make room), then cells (codes kept).
            let room = |b: &Plain| (b.free(), b.cells_free());
            usize::from(room(&copies[1]) > room(&copies[0]))
        };
        // Filled meanwhile: the other one, or overflow there, or overflow here (a key of class
        // 0 needs an entry of a key of classes 1 to 15, which one of the two may lack).
        if buckets[i].write(|b| file(b, false)).is_none()
            && buckets[1 - i].write(|b| file(b, true)).is_none()
        {
            buckets[i].write(|b| file(b, true));
        }
    }

    /// What a key hashed to `hash` owes for part `part` (0: nothing): the join of the slots of
    /// its live entries. Not judged by a clock: a debt already paid restores a state as good
    /// as fresh, so no request, however late its clock, is let off a debt it still owes.
    fn owed<A: Algorithm>(&self, algo: &A, hash: u64, part: usize) -> u128 {
        let tag = tag(hash);
        let c = Codes::of(algo, part);
        let mut owed = 0;
        for bucket in self.pair(hash, part) {
            for (slot, claim) in bucket.claims(tag) {
                let debt = match claim {
                    None => 0,
                    Some(None) => c.debt(slot),
                    // Its entries' own debts, at most what their codes say.
                    Some(Some(code)) => c.word(slot, code),
                };
                if debt != 0 {
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

    /// A number that changes whenever a debt is kept in any bucket of a key hashed to `hash`
    /// (the sum of their sequence words, which only grow). A store that reads a key's debt
    /// before inserting it, without excluding evictions of that key meanwhile, compares it
    /// after the insert: a change means the key may have been inserted, used and evicted in
    /// between, and its debt must be read again.
    pub(crate) fn stamp(&self, hash: u64) -> u64 {
        (0..self.parts)
            .flat_map(|part| self.pair(hash, part))
            .fold(0u64, |sum, b| sum.wrapping_add(b.seq()))
    }

    /// The state a key hashed to `hash` starts from when inserted: what it owes, or `None` to
    /// start fresh.
    pub(crate) fn restore<A: Algorithm>(&self, algo: &A, hash: u64) -> Option<A::State> {
        let mut owed = [0u128; 4];
        let mut any = false;
        for (part, o) in owed.iter_mut().enumerate().take(self.parts) {
            *o = self.owed(algo, hash, part);
            any |= *o != 0;
        }
        if self.parts > owed.len() {
            any |= (owed.len()..self.parts).any(|p| self.owed(algo, hash, p) != 0);
        }
        if !any {
            return None;
        }
        Some(algo.restore(&|part| match owed.get(part) {
            Some(&o) => o,
            None => self.owed(algo, hash, part),
        }))
    }
}

/// Frees the slots whose debt is paid at `now`, with their entries, and the entries whose
/// code says their own debts are paid.
fn purge<A: Algorithm>(c: Codes<'_, A>, b: &mut Plain, now: u64) {
    let paid = [0, 1].map(|s| b.slots[s] != 0 && c.paid_at(b.slots[s]) <= now);
    for i in 0..ENTRIES {
        let e = b.entries[i];
        if e == 0 {
            continue;
        }
        let slot = b.slots[slot_of(e)];
        if paid[slot_of(e)] || (b.codes[i] != NO_CODE && c.paid_at(c.word(slot, b.codes[i])) <= now)
        {
            b.entries[i] = 0;
            b.codes[i] = NO_CODE;
        }
    }
    for (slot, paid) in b.slots.iter_mut().zip(paid) {
        if paid {
            *slot = 0;
        }
    }
}

/// Files a debt (of a key of `tag`, paid at `paid_at`; `join` joins it to a slot's) in a
/// bucket full of live entries, none of them the key's or a marker of its group. Returns
/// whether it was filed.
///
/// - A key's entry that a marker on its slot already stands for gives its place to the key.
/// - Else, for a key of groups 1 to 15: another key's entry of those groups (its own group's
///   first) gives its place to an overflow marker of both keys' groups, pointing to that
///   entry's slot, which takes the debt: from now on every key of either group in the bucket
///   owes that slot (the displaced key among them), until it is paid.
/// - Else, for a key of class 0: two keys' entries of groups 1 to 15 become one marker of both
///   their groups (on the first's slot, joined with the second's) and the second's place is
///   the key's, so that the keys of class 0 keep entries of their own while they can.
/// - Once no key of groups 1 to 15 has an entry in the bucket, the same with groups 16 to 30.
/// - Else a marker of one group (of either level) takes the key's group as its second, on its
///   slot, which takes the debt; else a key of group 0 gives its entry up for a marker of the
///   key's group (that key of group 0 is forgotten, as G24 allows).
/// - Else, in a bucket of nothing but markers of two groups, two markers that share a group
///   make room ([`share_a_group`]).
/// - A key of group 0 with nothing of its level to fold is not filed: the table forgets its
///   debt (its overflow budget). A key of any other group is always filed (G24).
fn overflow_into<A: Algorithm>(
    c: Codes<'_, A>,
    b: &mut Plain,
    tag: Tag,
    paid_at: u64,
    word: u128,
    join: impl Fn(u128) -> u128,
    own: &impl Fn(&Plain, usize) -> u32,
) -> bool {
    let g = group(tag.tag);
    let gap = |b: &Plain, e: u16| c.paid_at(b.slots[slot_of(e)]).abs_diff(paid_at);
    let marker = |g1: u16, g2: u16| MARKER | g1 << 5 | g2;
    // The key's own entry at `at`, in the slot paid closest to its debt.
    let take = |b: &mut Plain, at: usize| {
        let slot = pick_slot(c, b, paid_at);
        c.grow(b, slot, join(b.slots[slot]), Some(word));
        b.set(at, tag, slot, own(b, slot));
        true
    };
    let is_marker_entry = |e: u16| e != 0 && is_marker(tag_of(e));
    let redundant = (0..ENTRIES).find(|&i| {
        let e = b.entries[i];
        e != 0
            && !is_marker(tag_of(e))
            && b.entries.iter().any(|&m| {
                is_marker_entry(m) && slot_of(m) == slot_of(e) && covers(tag_of(m), tag_of(e))
            })
    });
    if let Some(at) = redundant {
        return take(b, at);
    }
    for second_level in [false, true] {
        let level = |g: u16| g != 0 && (g > 15) == second_level;
        // Keys' entries of groups of this level: an array, as a capacity pass allocates
        // nothing (G69), the debt table full or not.
        let mut at_level = [0usize; ENTRIES];
        let mut n = 0;
        for i in 0..ENTRIES {
            let t = tag_of(b.entries[i]);
            if b.entries[i] != 0 && !is_marker(t) && level(group(t)) {
                at_level[n] = i;
                n += 1;
            }
        }
        let of_level = &at_level[..n];
        if level(g) {
            // The entry to displace: of this key's group if there is one (a marker of one
            // group), else in the slot paid closest to this debt.
            if let Some(&at) = of_level
                .iter()
                .min_by_key(|&&i| (group(tag_of(b.entries[i])) != g, gap(b, b.entries[i])))
            {
                let e = b.entries[at];
                let slot = slot_of(e);
                c.grow(b, slot, join(b.slots[slot]), None);
                b.entries[at] = entry(marker(g, group(tag_of(e))), slot);
                b.codes[at] = NO_CODE;
                return true;
            }
            // No key's entry of this level left, but a marker of one group: it takes this one.
            if let Some(at) = (0..ENTRIES).find(|&i| {
                let t = tag_of(b.entries[i]);
                b.entries[i] != 0 && is_marker(t) && t >> 5 & 0x1F == t & 0x1F && level(t & 0x1F)
            }) {
                let e = b.entries[at];
                let slot = slot_of(e);
                c.grow(b, slot, join(b.slots[slot]), None);
                b.entries[at] = entry(marker(tag_of(e) & 0x1F, g), slot);
                b.codes[at] = NO_CODE;
                return true;
            }
        }
        // Two keys' entries of this level into one marker: the first in the slot paid closest
        // to this debt, the second of its slot and group if there is one; the key takes the
        // second's place.
        let Some(&first) = of_level.iter().min_by_key(|&&i| gap(b, b.entries[i])) else {
            continue;
        };
        let e1 = b.entries[first];
        let Some(&second) = of_level.iter().filter(|&&i| i != first).min_by_key(|&&i| {
            let e2 = b.entries[i];
            (
                slot_of(e2) != slot_of(e1),
                group(tag_of(e2)) != group(tag_of(e1)),
            )
        }) else {
            continue;
        };
        let e2 = b.entries[second];
        let (s1, s2) = (slot_of(e1), slot_of(e2));
        if s1 != s2 {
            let (d1, d2) = (c.debt(b.slots[s1]), c.debt(b.slots[s2]));
            c.grow(b, s1, c.algo.debt_join(c.part, d1, d2), None);
        }
        b.entries[first] = entry(marker(group(tag_of(e1)), group(tag_of(e2))), s1);
        b.codes[first] = NO_CODE;
        return take(b, second);
    }
    if g == 0 {
        return false;
    }
    // Nothing of the key's level to fold: only keys of group 0 may be forgotten (G24). A
    // marker of one group, of either level, takes this one too (it keeps covering its own);
    // else a key of group 0 gives its entry up for a marker of this group.
    let single = (0..ENTRIES).find(|&i| {
        let t = tag_of(b.entries[i]);
        b.entries[i] != 0 && is_marker(t) && t >> 5 & 0x1F == t & 0x1F
    });
    let zero = || {
        (0..ENTRIES).find(|&i| {
            let t = tag_of(b.entries[i]);
            b.entries[i] != 0 && !is_marker(t) && group(t) == 0
        })
    };
    let Some(at) = single.or_else(zero) else {
        return share_a_group(c, b, g, join);
    };
    let e = b.entries[at];
    let slot = slot_of(e);
    c.grow(b, slot, join(b.slots[slot]), None);
    let other = if is_marker(tag_of(e)) {
        tag_of(e) & 0x1F
    } else {
        g
    };
    b.entries[at] = entry(marker(other, g), slot);
    b.codes[at] = NO_CODE;
    true
}

/// A bucket of nothing but markers of two groups, none of them `g`: two markers share a group
/// (48 of them name 96 groups of 30), say `(a, x)` on slot `s` and `(a, y)` on slot `t`. The
/// first keeps standing for `a`, its slot joined with `t`'s (the keys of `a` that owed `t`
/// owe it), and the second becomes `(y, g)` on `t`, which takes the key's debt: every key stays
/// covered by a slot at least as limiting as before. `false` only for a bucket with no such pair.
fn share_a_group<A: Algorithm>(
    c: Codes<'_, A>,
    b: &mut Plain,
    g: u16,
    join: impl Fn(u128) -> u128,
) -> bool {
    let groups = |e: u16| {
        let t = tag_of(e);
        (e != 0 && is_marker(t)).then_some((t >> 5 & 0x1F, t & 0x1F))
    };
    let pair = (0..ENTRIES).find_map(|i| {
        let (a1, b1) = groups(b.entries[i])?;
        (0..ENTRIES).filter(|&j| j != i).find_map(|j| {
            let (a2, b2) = groups(b.entries[j])?;
            let other = if a2 == a1 || a2 == b1 {
                b2
            } else if b2 == a1 || b2 == b1 {
                a2
            } else {
                return None;
            };
            Some((i, j, other))
        })
    });
    let Some((keeps, turns, other)) = pair else {
        return false;
    };
    let (s, t) = (slot_of(b.entries[keeps]), slot_of(b.entries[turns]));
    if s != t {
        let (ds, dt) = (c.debt(b.slots[s]), c.debt(b.slots[t]));
        c.grow(b, s, c.algo.debt_join(c.part, ds, dt), None);
    }
    c.grow(b, t, join(b.slots[t]), None);
    b.entries[turns] = entry(MARKER | other << 5 | g, t);
    b.codes[turns] = NO_CODE;
    true
}

/// The slot a new entry whose debt is paid at `paid_at` joins: a free one, else the one whose
/// debt is paid closest to it (keys of like debts share, so each waits little for the others).
fn pick_slot<A: Algorithm>(c: Codes<'_, A>, b: &Plain, paid_at: u64) -> usize {
    if let Some(free) = (0..2).find(|&s| b.slots[s] == 0) {
        return free;
    }
    let gap = |s: usize| c.paid_at(b.slots[s]).abs_diff(paid_at);
    usize::from(gap(1) < gap(0))
}

#[cfg(all(test, not(hotlimit_loom)))]
mod table_tests;
