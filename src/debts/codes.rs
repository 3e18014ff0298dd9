//! How a coded part's slot words and entries' codes read: the debt table's per-key debts
//! beside the shared slots (see the module above).

use super::bucket::{code_lanes, code_min, slot_of, Plain, CODE_MAX, ENTRIES, NO_CODE, TWO_LANES};
use crate::algo::{Algorithm, DEBT_MAX};

/// The low 96 bits of a slot word: its debt ([`DEBT_MAX`]); above them, a coded part's units.
const DEBT_BITS: u128 = DEBT_MAX;

/// Where a slot word keeps its units' exponents (6 bits each; above them, [`TWO_LANES`]).
const UNIT_SHIFT: u32 = 96;

/// The most a code says in each of two lanes: 11 bits (a cell's).
const LANE_MAX: u64 = CODE_MAX as u64;

/// The most a code of one lane says: 22 bits, the high 11 in its first cell and the low 11
/// in a second one where the bucket has room (else 0s: a code rounded down says no less).
const FINE_MAX: u64 = (1 << 22) - 1;

/// How a part's slot words and codes read. Where the algorithm ranks its debt words
/// ([`Debt::debt_rank`](crate::algo::Debt::debt_rank): one or two numbers, each ordered), the part is *coded*: a slot
/// word holds the debt and, above it (kept in the bucket's sequence word), the exponent `k` of
/// its codes' unit in each lane; a key's entry may carry a code saying that the debts filed
/// under it rank at most `R − c·2^k` in each lane, `R` the slot's debt's rank rounded up to a
/// multiple of 2^k, so a key comes back owing [`Debt::debt_unrank`](crate::algo::Debt::debt_unrank) of that (its own
/// debt, to a unit) rather than its slot's, which joins those of the keys beside it. Where the
/// keys of a slot differ in one lane, `c` has 11 more bits below the point (22 in all, in 2^-11
/// units: two cells, the second kept while the bucket has room); where they differ in both (a
/// sliding window's two counts across windows, a sliding log's time and total), 11 bits in
/// each. As a slot grows its keys are ranked again from their words (exactly, for the crate's
/// algorithms); rounded so, the codes move by whole units (no error piles up), and a code cut to
/// its first cell is one of whole units. A lane's unit is the least that reaches every entry's
/// rank: 2^-11 of their spread (2^-22 where a code keeps both cells).
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

type Rank = [u64; 2];

impl<'a, A: Algorithm> Codes<'a, A> {
    pub(super) fn of(algo: &'a A, part: usize) -> Self {
        Codes {
            algo,
            part,
            coded: algo.debt_lanes(part) > 0,
        }
    }

    /// The debt in slot word `slot`.
    pub(super) fn debt(self, slot: u128) -> u128 {
        slot & DEBT_BITS
    }

    /// When slot word `slot`'s debt is paid (or a word's, without units).
    pub(super) fn paid_at(self, slot: u128) -> u64 {
        self.algo.debt_paid_at(self.part, self.debt(slot))
    }

    /// The exponent of lane `lane`'s unit.
    fn unit(self, slot: u128, lane: usize) -> u32 {
        (slot >> (UNIT_SHIFT + 6 * lane as u32)) as u32 & 0x3F
    }

    fn two(self, slot: u128) -> bool {
        code_lanes(slot) == 2
    }

    /// The rank of debt word `word` beneath slot word `slot`'s debt.
    fn rank(self, slot: u128, word: u128) -> Rank {
        self.algo.debt_rank(self.part, self.debt(slot), word)
    }

    /// The rank of the slot's own debt: the most any code says.
    fn top(self, slot: u128) -> Rank {
        self.rank(slot, self.debt(slot))
    }

    /// `R`: the slot's rank rounded up to its units; never below it (`u64::MAX` where
    /// rounding would pass it).
    fn reference(self, slot: u128) -> Rank {
        self.reference_of(slot, self.top(slot))
    }

    /// [`reference`](Self::reference) from the slot's rank `top`, already known.
    fn reference_of(self, slot: u128, top: Rank) -> Rank {
        [0, 1].map(|lane| {
            let m = (1u64 << self.unit(slot, lane)) - 1;
            top[lane].checked_add(m).map_or(u64::MAX, |r| r & !m)
        })
    }

    /// Code `code`'s counts of units in each lane on slot `slot`, in 2^-11 units (one lane:
    /// its 22 bits; two: each lane's 11, shifted; the second lane's 0 where there is one).
    fn split(self, slot: u128, code: u32) -> [u64; 2] {
        let code = u64::from(code);
        if self.two(slot) {
            [code >> 11 << 11, (code & LANE_MAX) << 11]
        } else {
            [code, 0]
        }
    }

    /// The rank code `code` on slot `slot` says the debts under its entry are at most, beside
    /// the slot's own (`top`).
    fn decoded(self, slot: u128, code: u32, top: Rank) -> Rank {
        let (units, r) = (self.split(slot, code), self.reference_of(slot, top));
        [0, 1].map(|lane| {
            // Rounded down: it says no less.
            let down = u64::try_from(u128::from(units[lane]) << self.unit(slot, lane) >> 11);
            r[lane]
                .saturating_sub(down.unwrap_or(u64::MAX))
                .min(top[lane])
        })
    }

    /// The debt word the debts under an entry of slot `slot` with code `code` are all at
    /// most (the slot's own at the latest: it joins them).
    pub(super) fn word(self, slot: u128, code: u32) -> u128 {
        // The slot's rank once: for a sliding window it restores the slot's word.
        let top = self.top(slot);
        let rank = self.decoded(slot, code, top);
        if rank == top {
            self.debt(slot)
        } else {
            self.algo.debt_unrank(self.part, self.debt(slot), rank)
        }
    }

    /// The code of rank `rank` on slot `slot`, rounded down so that it says no less.
    fn code_of(self, slot: u128, rank: Rank) -> u32 {
        let r = self.reference(slot);
        // In 2^-11 units, rounded down.
        let fine = |lane: usize| {
            let units =
                u128::from(r[lane].saturating_sub(rank[lane])) << 11 >> self.unit(slot, lane);
            u64::try_from(units).unwrap_or(u64::MAX)
        };
        let code = if self.two(slot) {
            (fine(0) >> 11).min(LANE_MAX) << 11 | (fine(1) >> 11).min(LANE_MAX)
        } else {
            fine(0).min(FINE_MAX)
        };
        code as u32
    }

    /// Two codes on slot `slot` joined: lane by lane the one that says more.
    pub(super) fn least(self, slot: u128, a: u32, b: u32) -> u32 {
        code_min(slot, a, b)
    }

    /// The code of a debt word `word` on slot `slot` (which joins it); [`NO_CODE`] where the
    /// part is not coded.
    pub(super) fn code(self, slot: u128, word: u128) -> u32 {
        if !self.coded {
            return NO_CODE;
        }
        self.code_of(slot, self.rank(slot, word))
    }

    /// Sets slot `s` to the debt `joined` (at least as limiting as the slot's) and re-codes
    /// its entries, each to say no less than it said, with the least units whose codes reach
    /// them all and `need`, a debt about to be filed there. (A finer unit than the slot's
    /// re-codes its entries exactly: their ranks are multiples of the coarser one.)
    pub(super) fn grow(self, b: &mut Plain, s: usize, joined: u128, need: Option<u128>) {
        if !self.coded {
            b.slots[s] = joined;
            return;
        }
        let before = b.slots[s];
        // Its coded entries ranked again beneath the new debt, from the words their codes
        // stand for (an array: a capacity pass allocates nothing).
        let mut ranks = [None; ENTRIES];
        for (i, rank) in ranks.iter_mut().enumerate() {
            if b.entries[i] != 0 && slot_of(b.entries[i]) == s && b.codes[i] != NO_CODE {
                *rank = Some(self.rank(joined, self.word(before, b.codes[i])));
            }
        }
        let need = need.map(|w| self.rank(joined, w));
        let all = || ranks.iter().flatten().copied().chain(need);
        let top = self.top(joined);
        // Two lanes only where the keys differ in the second.
        let two = all().any(|r| r[1] < top[1]);
        let mut slot = joined | if two { TWO_LANES } else { 0 };
        for lane in 0..usize::from(two) + 1 {
            // The least unit: from the spread of what it must reach, then up by its rounding.
            let low = all().map(|r| r[lane]).min().unwrap_or(top[lane]);
            let spread = top[lane].saturating_sub(low) / (LANE_MAX + 1);
            let mut k = 64 - spread.leading_zeros();
            let shift = UNIT_SHIFT + 6 * lane as u32;
            slot = loop {
                let with = slot & !(0x3F << shift) | u128::from(k) << shift;
                let r = self.reference(with)[lane];
                let reach = |rank: Rank| r.saturating_sub(rank[lane]) >> k;
                if k >= 63 || all().all(|rank| reach(rank) <= LANE_MAX) {
                    break with;
                }
                k += 1;
            };
        }
        b.slots[s] = slot;
        for (i, rank) in ranks.into_iter().enumerate() {
            if let Some(rank) = rank {
                b.codes[i] = self.code_of(slot, rank);
            }
        }
    }
}
