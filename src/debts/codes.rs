//! How a coded part's slot words and entries' codes read: the debt table's per-key debts
//! beside the shared slots (see the module above).

use super::bucket::{slot_of, Plain, CODE_MAX, ENTRIES, NO_CODE};
use crate::algo::Algorithm;

/// The low 64 bits of a slot word: a coded part's debt.
const DEBT_BITS: u128 = (1 << 64) - 1;

/// How a part's slot words and codes read. Where the algorithm's debt words are ordered as
/// numbers ([`Algorithm::debt_ordered`]: below 2^64, the larger at least as limiting), the part
/// is *coded*: a slot word holds the debt and, above it, the exponent `k` of its codes' unit; a
/// key's entry may carry a code `c` saying that the debts filed under it are all at most
/// `R − c·2^k`, `R` the slot's debt rounded up to a multiple of 2^k. So a key comes back owing
/// its own debt (to a unit) rather than its slot's, which joins those of the keys beside it.
/// Rounded so, a slot's growth moves its codes by whole units (no error piles up); its unit is
/// the least that reaches every entry's: 2^-11 of the spread of its keys' debts (a window's
/// counts: exact).
pub(super) struct Codes<'a, A> {
    pub(super) algo: &'a A,
    pub(super) part: usize,
    pub(super) coded: bool,
}

// Not derived: that would ask `A: Copy`.
impl<A> Clone for Codes<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Codes<'_, A> {}

impl<'a, A: Algorithm> Codes<'a, A> {
    pub(super) fn of(algo: &'a A, part: usize) -> Self {
        Codes {
            algo,
            part,
            coded: algo.debt_ordered(part),
        }
    }

    /// The debt in slot word `slot`.
    pub(super) fn debt(self, slot: u128) -> u128 {
        if self.coded {
            slot & DEBT_BITS
        } else {
            slot
        }
    }

    /// When slot word `slot`'s debt is paid (or a word's, without a unit).
    pub(super) fn paid_at(self, slot: u128) -> u64 {
        self.algo.debt_paid_at(self.part, self.debt(slot))
    }

    fn unit(self, slot: u128) -> u32 {
        (slot >> 64) as u32 & 0x3F
    }

    /// `R`: the slot's debt rounded up to its unit; never below the debt (`u64::MAX` where
    /// rounding would pass it).
    fn reference(self, slot: u128) -> u64 {
        let m = (1u64 << self.unit(slot)) - 1;
        (self.debt(slot) as u64)
            .checked_add(m)
            .map_or(u64::MAX, |r| r & !m)
    }

    /// The debt word the debts under an entry of slot `slot` with code `code` are all at
    /// most (the slot's own at the latest: it joins them).
    pub(super) fn word(self, slot: u128, code: u16) -> u64 {
        let down = u64::try_from(u128::from(code) << self.unit(slot)).unwrap_or(u64::MAX);
        self.reference(slot)
            .saturating_sub(down)
            .min(self.debt(slot) as u64)
    }

    /// The code of a debt word `word` on slot `slot` (which holds it), rounded down so that
    /// it says no less; [`NO_CODE`] where the part is not coded.
    pub(super) fn code(self, slot: u128, word: u64) -> u16 {
        if !self.coded {
            return NO_CODE;
        }
        let units = self.reference(slot).saturating_sub(word) >> self.unit(slot);
        units.min(u64::from(CODE_MAX)) as u16
    }

    /// Sets slot `s` to the debt `joined` (at least as limiting as the slot's) and re-codes
    /// its entries, each to say no less than it said, with the least unit whose codes reach
    /// them all and `need`, a debt about to be filed there. (A finer unit than the slot's
    /// re-codes its entries exactly: their words are multiples of the coarser one.)
    pub(super) fn grow(self, b: &mut Plain, s: usize, joined: u128, need: Option<u64>) {
        if !self.coded {
            b.slots[s] = joined;
            return;
        }
        let before = b.slots[s];
        // The words its coded entries say (an array: a capacity pass allocates nothing).
        let mut words = [None; ENTRIES];
        for (i, word) in words.iter_mut().enumerate() {
            if b.entries[i] != 0 && slot_of(b.entries[i]) == s && b.codes[i] != NO_CODE {
                *word = Some(self.word(before, b.codes[i]));
            }
        }
        let all = || words.iter().flatten().copied().chain(need);
        // The least unit: from the spread of what it must reach, then up by its rounding.
        let top = joined as u64;
        let low = all().min().unwrap_or(top);
        let mut k = 64 - (top.saturating_sub(low) >> 11).leading_zeros();
        let slot = loop {
            let slot = joined | u128::from(k) << 64;
            let reach = |word: u64| self.reference(slot).saturating_sub(word) >> k;
            if k >= 63 || all().all(|w| reach(w) <= u64::from(CODE_MAX)) {
                break slot;
            }
            k += 1;
        };
        b.slots[s] = slot;
        for (i, word) in words.into_iter().enumerate() {
            if let Some(word) = word {
                b.codes[i] = self.code(slot, word);
            }
        }
    }
}
