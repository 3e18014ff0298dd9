//! A bucket of the debt table: its entries' format (a key's tag or an overflow marker, and the
//! slot it points to) and the sequence lock its readers and writers share.

use crate::sync::{fence, AtomicU64, Ordering};

/// Entries per bucket; with two 96-bit slots and the sequence word, 128 bytes.
pub(super) const ENTRIES: usize = 48;

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

/// A bucket as a reader copies it and a writer rewrites it: two debt slots and the entries
/// (0: empty).
#[derive(Debug, Clone, Copy)]
pub(super) struct Plain {
    pub(super) slots: [u128; 2],
    pub(super) entries: [u16; ENTRIES],
}

impl Plain {
    /// A live entry that stands for a key of tag `tag` (its own, or a marker of its class).
    pub(super) fn find(&self, tag: u16) -> Option<u16> {
        self.entries
            .iter()
            .copied()
            .find(|&e| e != 0 && covers(tag_of(e), tag))
    }

    pub(super) fn free(&self) -> usize {
        self.entries.iter().filter(|&&e| e == 0).count()
    }
}

/// Entries per 64-bit word of a bucket.
pub(super) const PER_WORD: usize = 4;

/// One bucket in the table: a sequence lock over [`Plain`], in 64-bit words (16 loads copy
/// it). `seq` is even while no writer is inside; a writer makes it odd, writes, and makes it
/// even again.
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
        (a >> 64) as u64 | (b as u64) << 32,
        (b >> 32) as u64,
    ]
}

pub(super) fn slots_of([w0, w1, w2]: [u64; 3]) -> [u128; 2] {
    let a = u128::from(w0) | u128::from(w1 & 0xFFFF_FFFF) << 64;
    let b = u128::from(w1 >> 32) | u128::from(w2) << 32;
    [a, b]
}

impl Bucket {
    /// The words, as they are (Relaxed: the sequence word orders them).
    pub(super) fn load(&self) -> Plain {
        let words: [u64; ENTRIES / PER_WORD] =
            std::array::from_fn(|i| self.entries[i].load(Ordering::Relaxed));
        Plain {
            slots: slots_of(std::array::from_fn(|i| {
                self.slots[i].load(Ordering::Relaxed)
            })),
            entries: std::array::from_fn(|i| (words[i / PER_WORD] >> (16 * (i % PER_WORD))) as u16),
        }
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
        self.seq.load(Ordering::Acquire)
    }

    /// A consistent copy, written by no writer while it was read.
    pub(super) fn read(&self) -> Plain {
        self.consistent(|| self.load())
    }

    /// The slots a key of `tag` owes in this bucket (0 where it owes nothing), from a
    /// consistent read: a key's read on insert, which needs neither the entries' copy nor a
    /// slot no entry of it points to.
    pub(super) fn claims(&self, tag: u16) -> [u128; 2] {
        self.consistent(|| {
            let mut hit = [false; 2];
            for word in &self.entries {
                let w = word.load(Ordering::Relaxed);
                for j in 0..PER_WORD {
                    let e = (w >> (16 * j)) as u16;
                    if e != 0 && covers(tag_of(e), tag) {
                        hit[slot_of(e)] = true;
                    }
                }
            }
            if hit == [false; 2] {
                return [0; 2];
            }
            let [a, b] = slots_of(std::array::from_fn(|i| {
                self.slots[i].load(Ordering::Relaxed)
            }));
            [if hit[0] { a } else { 0 }, if hit[1] { b } else { 0 }]
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
        let old = self.load();
        let mut new = old;
        let out = f(&mut new);
        if new.slots != old.slots {
            for (atomic, word) in self.slots.iter().zip(slot_words(new.slots)) {
                atomic.store(word, Ordering::Relaxed);
            }
        }
        for (i, (n, o)) in new
            .entries
            .chunks(PER_WORD)
            .zip(old.entries.chunks(PER_WORD))
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
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
        out
    }
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

/// The 15-bit tag of a key's hash: bits other than those that pick its buckets, in
/// `1..MARKER`.
pub(super) fn tag(hash: u64) -> u16 {
    ((hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as u16 % (MARKER - 1)) + 1
}

#[cfg(all(test, not(hotlimit_loom)))]
mod tests {
    use super::*;
    use crate::algo::DEBT_MAX;

    // Pins G26.
    #[test]
    fn slots_pack_into_three_words() {
        let (a, b) = (DEBT_MAX, 0x0123_4567_89AB_CDEF_0011_2233);
        assert_eq!(slots_of(slot_words([a, b])), [a, b]);
        assert_eq!(slots_of(slot_words([b, 7])), [b, 7]);
    }
}
