//! A bucket of the debt table: its entries' format (a key's tag or an overflow marker, and the
//! slot it points to; for a key's entry, optionally a code of its own debt in the next cell)
//! and the sequence lock its readers and writers share.

use crate::sync::{fence, AtomicU64, Ordering};

/// 16-bit cells per bucket; with two 96-bit slots and the sequence word, 128 bytes. A cell
/// holds an entry, or the code of the key's entry before it.
pub(super) const ENTRIES: usize = 48;

/// Keys' tags are below this (and above 0); markers' from it up.
const TAGS: u16 = MARKER;

/// Bits of a key's hash beyond its tag that a coded entry keeps ([`Tag::ext`]).
const EXT_BITS: u32 = 5;

/// The largest code a cell holds.
pub(super) const CODE_MAX: u16 = 0x7FF;

/// Cells from here up, among the coded entries, carry the low 11 bits of the code before
/// them: no entry there is a marker, so no entry's cell is this high.
const LOW: u16 = MARKER << 1;

/// No code: the entry's keys owe its slot's debt.
pub(super) const NO_CODE: u32 = u32::MAX;

/// A slot word's flag (above its debt's 96 bits) for codes of two lanes, 11 bits each (else
/// one lane of 22).
pub(super) const TWO_LANES: u128 = 1 << 108;

/// Lanes of a slot's codes.
pub(super) fn code_lanes(slot: u128) -> usize {
    if slot & TWO_LANES != 0 {
        2
    } else {
        1
    }
}

/// Two codes of one slot joined, lane by lane the one that says more (the smaller).
pub(super) fn code_min(slot: u128, a: u32, b: u32) -> u32 {
    if code_lanes(slot) == 1 {
        return a.min(b);
    }
    let lane = u32::from(CODE_MAX);
    (a & lane).min(b & lane) | (a >> 11).min(b >> 11) << 11
}

/// Tags from here up are overflow markers: `MARKER | g1 << 5 | g2` stands for every key of
/// its bucket of overflow group `g1` or `g2` ([`group`]). Keys' tags are below it.
pub(super) const MARKER: u16 = 0x7C00;

/// A key's overflow group, from its tag: 1 to 15 for keys of classes 1 to 15 (the tag modulo
/// 16); for keys of class 0, 16 to 30 by their sub-class (the tag's next four bits) 1 to 15;
/// and 0 for the rest (one key in 256), which no marker ever stands for. A bucket marks
/// groups 16 to 30 only once no key of classes 1 to 15 has an entry of its own there, so that
/// newcomers keep getting through (the keys of class 0, one in 16, then one in 256) however
/// large the flood.
pub(super) fn group(tag: u16) -> u16 {
    let class = tag % 16;
    if class != 0 {
        return class;
    }
    let sub = tag >> 4 & 0xF;
    if sub == 0 {
        0
    } else {
        15 + sub
    }
}

pub(super) fn is_marker(tag: u16) -> bool {
    tag >= MARKER
}

/// Whether an entry's tag stands for a key of tag `tag`: its own, or a marker of its group.
pub(super) fn covers(entry_tag: u16, tag: u16) -> bool {
    if is_marker(entry_tag) {
        let g = group(tag);
        g != 0 && (entry_tag >> 5 & 0x1F == g || entry_tag & 0x1F == g)
    } else {
        entry_tag == tag
    }
}

/// A key as the table tells it apart: the tag every entry of it carries, and 5 more bits of
/// its hash that its entry keeps while it has a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tag {
    /// In `1..TAGS`.
    pub(super) tag: u16,
    /// Below `1 << EXT_BITS`.
    pub(super) ext: u16,
}

/// A bucket as a reader copies it and a writer rewrites it: two debt slots, the entries (0:
/// empty) and each entry's code ([`NO_CODE`]: none) with its key's [`Tag::ext`].
///
/// In cells, entries without a code (and markers) come first, from the front, and coded
/// entries last, up to the end, each followed by its code's cells: the first holds the code's
/// high 11 bits (of 22) and the key's 5 bits of [`Tag::ext`], the second, only where the low
/// 11 are not all 0, those ([`LOW`] above them, which no entry's cell reaches). How many cells
/// the coded entries take is kept in the sequence word. So a coded entry tells keys apart by
/// 20 bits, not 15: two keys of a working set that share a bucket and a tag share an entry,
/// and the one owes the other's debt for as long as that is owed (a key near its limit behind
/// a steady abuser's: locked out for good). A writer whose entries and codes do not fit
/// rounds codes of one lane down to their first cell, then drops the codes that say least
/// (their entries then stand for every key of their tag).
#[derive(Debug, Clone, Copy)]
pub(super) struct Plain {
    pub(super) slots: [u128; 2],
    pub(super) entries: [u16; ENTRIES],
    pub(super) codes: [u32; ENTRIES],
    pub(super) exts: [u16; ENTRIES],
}

impl Plain {
    /// A live entry that stands for key `key` (its own, one of its tag without a code, or a
    /// marker of its class).
    pub(super) fn find(&self, key: Tag) -> Option<u16> {
        self.find_at(key).map(|i| self.entries[i])
    }

    /// Where [`find`](Plain::find)'s entry is.
    pub(super) fn find_at(&self, key: Tag) -> Option<usize> {
        (0..ENTRIES).find(|&i| self.stands_for(i, key))
    }

    /// Whether entry `i` stands for key `key`.
    fn stands_for(&self, i: usize, key: Tag) -> bool {
        let e = self.entries[i];
        e != 0
            && covers(tag_of(e), key.tag)
            && (is_marker(tag_of(e)) || self.codes[i] == NO_CODE || self.exts[i] == key.ext)
    }

    /// Whether the key has an entry of its own here (not a marker's).
    pub(super) fn has_own(&self, key: Tag) -> bool {
        (0..ENTRIES).any(|i| self.stands_for(i, key) && !is_marker(tag_of(self.entries[i])))
    }

    /// Files a new entry of key `key` at `at`, on slot `slot` with code `code`.
    pub(super) fn set(&mut self, at: usize, key: Tag, slot: usize, code: u32) {
        self.entries[at] = entry(key.tag, slot);
        self.codes[at] = code;
        self.exts[at] = key.ext;
    }

    /// Entries free (codes dropped to make room as needed).
    pub(super) fn free(&self) -> usize {
        self.entries.iter().filter(|&&e| e == 0).count()
    }

    /// Cells an entry and its code take: a code's second cell only where its low 11 bits are
    /// not 0.
    fn cells_of(&self, i: usize) -> usize {
        match self.codes[i] {
            NO_CODE => 1,
            code => 2 + usize::from(code & u32::from(CODE_MAX) != 0),
        }
    }

    /// Cells free, codes kept (those of one lane cut to their first cell): an entry filed here
    /// keeps its code while this is 2 or more (3 where its slot's codes have two lanes). What
    /// the writers judge room by, as before codes had a second cell of precision: that cell
    /// takes room only where it is free.
    pub(super) fn cells_free(&self) -> usize {
        let used: usize = (0..ENTRIES)
            .filter(|&i| self.entries[i] != 0)
            .map(|i| match self.codes[i] {
                NO_CODE => 1,
                _ => 1 + code_lanes(self.slots[slot_of(self.entries[i])]),
            })
            .sum();
        ENTRIES.saturating_sub(used)
    }

    /// From the bucket's cells, the last `coded` of them coded entries.
    fn parse(slots: [u128; 2], cells: &[u16; ENTRIES], coded: usize) -> Plain {
        let mut plain = Plain {
            slots,
            entries: [0; ENTRIES],
            codes: [NO_CODE; ENTRIES],
            exts: [0; ENTRIES],
        };
        let mut n = 0;
        for_entries(cells, coded, |e, code| {
            plain.entries[n] = e;
            if let Some((code, ext)) = code {
                (plain.codes[n], plain.exts[n]) = (code, ext);
            }
            n += 1;
        });
        plain
    }

    /// Into cells, and how many of them, at the end, the coded entries take. Where they do
    /// not fit, codes of one lane lose their low 11 bits first (rounded down, they say no
    /// less), those that say least (the smallest) first; then codes are dropped, those that
    /// say least first, and their entries owe their slots.
    fn cells(&mut self) -> ([u16; ENTRIES], usize) {
        // No allocation: a capacity pass on a request writes thousands of buckets.
        let mut need: usize = (0..ENTRIES)
            .filter(|&i| self.entries[i] != 0)
            .map(|i| self.cells_of(i))
            .sum();
        if need > ENTRIES {
            // Sorted once: a slot that grows re-codes its entries whole, and a full bucket cuts
            // them again on every write.
            let low = u32::from(CODE_MAX);
            let (mut cut, mut n) = ([0usize; ENTRIES], 0);
            for i in 0..ENTRIES {
                let (e, code) = (self.entries[i], self.codes[i]);
                if e != 0
                    && code != NO_CODE
                    && code & low != 0
                    && code_lanes(self.slots[slot_of(e)]) == 1
                {
                    cut[n] = i;
                    n += 1;
                }
            }
            let cut = &mut cut[..n];
            cut.sort_unstable_by_key(|&i| self.codes[i]);
            for &i in cut.iter().take(need - ENTRIES) {
                self.codes[i] &= !low;
                need -= 1;
            }
        }
        while need > ENTRIES {
            let Some(i) = (0..ENTRIES)
                .filter(|&i| self.entries[i] != 0 && self.codes[i] != NO_CODE)
                .min_by_key(|&i| self.codes[i])
            else {
                break;
            };
            need -= self.cells_of(i) - 1;
            self.codes[i] = NO_CODE;
        }
        let live = || (0..ENTRIES).filter(|&i| self.entries[i] != 0);
        let coded: usize = live()
            .filter(|&i| self.codes[i] != NO_CODE)
            .map(|i| self.cells_of(i))
            .sum();
        let mut cells = [0u16; ENTRIES];
        let (mut front, mut back) = (0, ENTRIES - coded);
        for i in live() {
            let e = self.entries[i];
            if self.codes[i] == NO_CODE {
                cells[front] = e;
                front += 1;
                continue;
            }
            let code = self.codes[i];
            cells[back] = e;
            cells[back + 1] = self.exts[i] << 11 | (code >> 11) as u16 & CODE_MAX;
            back += 2;
            if code as u16 & CODE_MAX != 0 {
                cells[back] = LOW | code as u16 & CODE_MAX;
                back += 1;
            }
        }
        (cells, coded)
    }
}

/// Calls `f` on each entry of `cells`, the last `coded` of them coded entries: its value (a
/// key's tag or a marker's, and its slot) and, for a coded one, its code and [`Tag::ext`].
fn for_entries(cells: &[u16; ENTRIES], coded: usize, mut f: impl FnMut(u16, Option<(u32, u16)>)) {
    let start = ENTRIES.saturating_sub(coded);
    for &e in cells[..start].iter().filter(|&&e| e != 0) {
        f(e, None);
    }
    let mut i = start;
    while i < ENTRIES {
        let e = cells[i];
        // A writer never leaves a code without its first cell; if one were, its entry would
        // stand for every key of its tag (no code), which is never less than it owes.
        let Some(&high) = cells.get(i + 1) else {
            f(e, None);
            break;
        };
        let low = cells.get(i + 2).filter(|&&c| c >= LOW);
        let code = u32::from(high & CODE_MAX) << 11 | low.map_or(0, |&c| u32::from(c & CODE_MAX));
        f(e, Some((code, high >> 11)));
        i += 2 + usize::from(low.is_some());
    }
}

/// What a key's entries of one slot in a bucket say it owes: nothing (`None`), the slot's
/// whole debt (`Some(None)`: an entry without a code, or a marker), or the slot's debt
/// lowered by the smallest of their codes (`Some(Some(code))`: the largest debt they say).
pub(super) type Claim = Option<Option<u32>>;

/// The join of two claims on slot `slot`.
fn claim_join(slot: u128, a: Claim, b: Claim) -> Claim {
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(Some(x)), Some(Some(y))) => Some(Some(code_min(slot, x, y))),
        _ => Some(None),
    }
}

/// Entries per 64-bit word of a bucket.
pub(super) const PER_WORD: usize = 4;

/// The bits of a bucket's `seq` that count its writes (wrapping: a reader or a stamp would
/// have to span 2^31 writes of one bucket to mistake them); above them, its slots' units and
/// how many cells its coded entries take.
const SEQ_BITS: u64 = (1 << 32) - 1;

/// Where `seq` keeps its slots' units.
const UNIT_SHIFT: u32 = 32;

/// Where `seq` keeps how many cells the coded entries take (6 bits).
const CODED_SHIFT: u32 = UNIT_SHIFT + 2 * UNIT_BITS;

/// A slot's units (13 bits, kept in `seq` from `UNIT_SHIFT`): bits 96 to 108 of its word in
/// [`Plain`].
const UNIT_BITS: u32 = 13;

/// One bucket in the table: a sequence lock over [`Plain`], in 64-bit words (16 loads copy
/// it). `seq`'s low 32 bits are even while no writer is inside; a writer makes them odd,
/// writes, and makes them even again. Its next 26 bits hold each slot's codes' units (see
/// `codes`), its top 6 how many cells the coded entries take: written with the sequence that
/// releases the write, read with the one that checks a read.
#[repr(align(64))]
pub(super) struct Bucket {
    seq: AtomicU64,
    /// Two 96-bit slots in three words: slot 0 in `w0` and the low half of `w1`, slot 1 in
    /// the high half of `w1` and `w2`.
    slots: [AtomicU64; 3],
    /// Four 16-bit entries a word, the first in the low bits.
    entries: [AtomicU64; ENTRIES / PER_WORD],
}

impl Default for Bucket {
    fn default() -> Self {
        Self {
            seq: AtomicU64::new(0),
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            entries: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The three slot words of two 96-bit slots, and back.
pub(super) fn slot_words([a, b]: [u128; 2]) -> [u64; 3] {
    [
        a as u64,
        (a >> 64) as u32 as u64 | (b as u64) << 32,
        (b >> 32) as u64,
    ]
}

pub(super) fn slots_of([w0, w1, w2]: [u64; 3]) -> [u128; 2] {
    let a = u128::from(w0) | u128::from(w1 & 0xFFFF_FFFF) << 64;
    let b = u128::from(w1 >> 32) | u128::from(w2) << 32;
    [a, b]
}

impl Bucket {
    /// The cells, as they are (Relaxed: the sequence word orders them).
    fn cells(&self) -> [u16; ENTRIES] {
        let words: [u64; ENTRIES / PER_WORD] =
            std::array::from_fn(|i| self.entries[i].load(Ordering::Relaxed));
        std::array::from_fn(|i| (words[i / PER_WORD] >> (16 * (i % PER_WORD))) as u16)
    }

    /// The slot words, each with its units (from `seq`, the sequence word as read) in bits 96
    /// and up.
    fn slot_words(&self, seq: u64) -> [u128; 2] {
        let units = seq >> UNIT_SHIFT;
        let [a, b] = slots_of(std::array::from_fn(|i| {
            self.slots[i].load(Ordering::Relaxed)
        }));
        let mask = (1 << UNIT_BITS) - 1;
        [
            a | u128::from(units & mask) << 96,
            b | u128::from(units >> UNIT_BITS & mask) << 96,
        ]
    }

    /// The words, as they are (Relaxed: the sequence word orders them; it is read once, for
    /// the units and the coded cells it keeps).
    pub(super) fn load(&self) -> Plain {
        let seq = self.seq.load(Ordering::Relaxed);
        Plain::parse(self.slot_words(seq), &self.cells(), coded_of(seq))
    }

    /// What `load` reads of the bucket while no writer is inside (retried until so).
    pub(super) fn consistent<T>(&self, load: impl Fn() -> T) -> T {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let read = load();
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return read;
                }
            }
            std::hint::spin_loop();
            #[cfg(hotlimit_loom)]
            loom::thread::yield_now();
        }
    }

    /// The sequence word: it grows with every write (see [`Debts::stamp`](super::Debts::stamp)).
    pub(super) fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire) & SEQ_BITS
    }

    /// A consistent copy, written by no writer while it was read.
    pub(super) fn read(&self) -> Plain {
        self.consistent(|| self.load())
    }

    /// What key `key` owes in this bucket, per slot: the slot's debt and the claim on it
    /// ([`Claim`]), from a consistent read (a key's read on insert, which needs neither the
    /// entries' copy nor a slot no entry of it points to).
    pub(super) fn claims(&self, key: Tag) -> [(u128, Claim); 2] {
        self.consistent(|| {
            let cells = self.cells();
            // The slots' flags (in `seq`, as read): how many cells their codes take.
            let seq = self.seq.load(Ordering::Relaxed);
            let units = seq >> UNIT_SHIFT;
            let flags = [units, units >> UNIT_BITS].map(|u| u128::from(u & (1 << 12)) << 96);
            let coded = coded_of(seq);
            let mut claims: [Claim; 2] = [None; 2];
            for_entries(&cells, coded, |e, code| {
                if !covers(tag_of(e), key.tag) {
                    return;
                }
                let s = slot_of(e);
                let claim = match code {
                    // Another key's, of the same tag.
                    Some((_, ext)) if ext != key.ext => return,
                    Some((code, _)) => Some(code),
                    None => None,
                };
                claims[s] = claim_join(flags[s], claims[s], Some(claim));
            });
            if claims == [None; 2] {
                return [(0, None); 2];
            }
            let [a, b] = self.slot_words(seq);
            [(a, claims[0]), (b, claims[1])]
        })
    }

    /// Runs `f` on the bucket with no other writer inside, and writes back what it changed.
    pub(super) fn write<T>(&self, f: impl FnOnce(&mut Plain) -> T) -> T {
        let backoff = crate::sync::Backoff::new();
        let seq = loop {
            let seq = self.seq.load(Ordering::Relaxed);
            if seq & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                break seq;
            }
            backoff.spin();
        };
        // The odd sequence is visible before any word changes.
        fence(Ordering::Release);
        // `seq` as it was before this writer: what the last one left.
        let (old_slots, old_cells) = (self.slot_words(seq), self.cells());
        let mut new = Plain::parse(old_slots, &old_cells, coded_of(seq));
        let out = f(&mut new);
        if new.slots != old_slots {
            for (atomic, word) in self.slots.iter().zip(slot_words(new.slots)) {
                atomic.store(word, Ordering::Relaxed);
            }
        }
        let (new_cells, coded) = new.cells();
        for (i, (n, o)) in new_cells
            .chunks(PER_WORD)
            .zip(old_cells.chunks(PER_WORD))
            .enumerate()
        {
            if n != o {
                let word = n
                    .iter()
                    .enumerate()
                    .fold(0u64, |w, (j, &e)| w | u64::from(e) << (16 * j));
                self.entries[i].store(word, Ordering::Relaxed);
            }
        }
        let units = new
            .slots
            .map(|slot| (slot >> 96) as u64 & ((1 << UNIT_BITS) - 1));
        let next = (seq + 2) & SEQ_BITS
            | (units[0] | units[1] << UNIT_BITS) << UNIT_SHIFT
            | (coded as u64) << CODED_SHIFT;
        self.seq.store(next, Ordering::Release);
        out
    }
}

/// How many cells, at the end, the coded entries take, by sequence word `seq`.
fn coded_of(seq: u64) -> usize {
    (seq >> CODED_SHIFT) as usize
}

pub(super) fn entry(tag: u16, slot: usize) -> u16 {
    tag << 1 | slot as u16
}

pub(super) fn tag_of(entry: u16) -> u16 {
    entry >> 1
}

pub(super) fn slot_of(entry: u16) -> usize {
    usize::from(entry & 1)
}

/// A key's [`Tag`], from bits of its hash other than those that pick its buckets.
pub(super) fn tag(hash: u64) -> Tag {
    let h = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    Tag {
        tag: ((h >> 48) as u16 % (TAGS - 1)) + 1,
        ext: (h >> 40) as u16 & ((1 << EXT_BITS) - 1),
    }
}

#[cfg(all(test, not(hotlimit_loom)))]
mod tests {
    use super::*;
    use crate::algo::DEBT_MAX;

    /// A bucket of `n` keys' entries on slot 0, each with a one-lane code of 22 bits, written
    /// into cells and read back.
    fn written(n: usize) -> (Vec<u32>, Plain) {
        let mut b = Plain::parse([7, 0], &[0; ENTRIES], 0);
        let codes: Vec<u32> = (0..n as u32).map(|i| (i + 1) << 11 | (0x400 + i)).collect();
        for (i, &code) in codes.iter().enumerate() {
            let key = Tag {
                tag: 100 + i as u16,
                ext: i as u16 % 32,
            };
            b.set(i, key, 0, code);
        }
        let (cells, coded) = b.cells();
        (codes, Plain::parse(b.slots, &cells, coded))
    }

    // Pins G24.
    #[test]
    fn codes_lose_their_low_cells_before_any_code_is_dropped() {
        // 16 entries and their codes' two cells each fill the bucket: every code whole.
        let (codes, back) = written(16);
        assert_eq!(&back.codes[..16], &codes[..]);
        // 20 need 60 cells: the 12 codes that say least (the smallest) keep their high cell
        // only, rounded down (saying no less); none is dropped.
        let (codes, back) = written(20);
        for (i, &code) in codes.iter().enumerate() {
            let kept = if i < 12 { code & !0x7FF } else { code };
            assert_eq!(back.codes[i], kept, "entry {i}");
            assert_eq!(back.exts[i], i as u16 % 32);
        }
        // 25 need 50 cells even so: two codes dropped (a cell each), the smallest, their
        // entries kept.
        let (codes, back) = written(25);
        assert_eq!(back.entries.iter().filter(|&&e| e != 0).count(), 25);
        assert_eq!(back.codes[..2], [NO_CODE; 2]);
        for (i, &code) in codes.iter().enumerate().skip(2) {
            assert_eq!(back.codes[i], code & !0x7FF, "entry {i}");
        }
    }

    // Pins G26.
    #[test]
    fn slots_pack_into_three_words() {
        let (a, b) = (DEBT_MAX, 0x0123_4567_89AB_CDEF_0011_2233);
        assert_eq!(slots_of(slot_words([a, b])), [a, b]);
        assert_eq!(slots_of(slot_words([b, 7])), [b, 7]);
    }
}
