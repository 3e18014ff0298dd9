//! An algorithm written outside the crate, on its public API only (issue #60): a token bucket
//! with whole tokens refilled on ticks, its state one `u64` word. Shared by
//! `tests/outside_algorithm.rs` (every store) and `tower/tests/outside_algorithm.rs` (the layer).

use hotlimit::algo::{Algorithm, Debt};
use hotlimit::{Decision, Policy};
use std::time::Duration;

/// `size` tokens, `per_tick` more every `tick` ns (whole ticks of the clock), at most `size`.
/// State: the tokens (high 16 bits) as of the tick in the low 48 bits.
#[derive(Debug, Clone, Copy)]
pub struct TickBucket {
    pub size: u64,
    pub per_tick: u64,
    pub tick: u64,
}

const TICK_BITS: u32 = 48;
const TICK_MASK: u64 = (1 << TICK_BITS) - 1;

impl TickBucket {
    pub fn new(size: u16, per_tick: u16, tick: Duration) -> Self {
        TickBucket {
            size: u64::from(size),
            per_tick: u64::from(per_tick.max(1)),
            tick: (tick.as_nanos() as u64).max(1),
        }
    }

    /// The word of `tokens` at tick `at`. The fresh word (0) reads as full: tokens are stored
    /// as what is missing from a full bucket.
    fn word(&self, tokens: u64, at: u64) -> u64 {
        (self.size - tokens.min(self.size)) << TICK_BITS | (at & TICK_MASK)
    }

    /// The tokens a word holds at tick `now_tick` (a clock read before its tick refills
    /// nothing).
    fn tokens(&self, word: u64, now_tick: u64) -> u64 {
        let missing = word >> TICK_BITS;
        let ticks = now_tick.saturating_sub(word & TICK_MASK);
        (self.size - missing)
            .saturating_add(ticks.saturating_mul(self.per_tick))
            .min(self.size)
    }

    /// The first tick at which a word holds `want` tokens.
    fn tick_with(&self, word: u64, want: u64) -> u64 {
        let (at, have) = (word & TICK_MASK, self.size - (word >> TICK_BITS));
        at + want.saturating_sub(have).div_ceil(self.per_tick)
    }
}

impl Algorithm for TickBucket {
    type State = u64;

    fn fresh(&self) -> u64 {
        0
    }

    fn capacity(&self) -> u64 {
        self.size
    }

    fn policy(&self) -> Policy {
        Policy::Leaky
    }

    fn update(&self, state: &mut u64, now: u64, cost: u64) -> Decision {
        let now_tick = (now / self.tick).min(TICK_MASK);
        let tokens = self.tokens(*state, now_tick);
        if tokens >= cost {
            *state = self.word(tokens - cost, now_tick.max(*state & TICK_MASK));
            let full_at = self.tick_with(*state, self.size) * self.tick;
            return Decision::allowed()
                .with_remaining(tokens - cost)
                .with_reset_after(Duration::from_nanos(full_at.saturating_sub(now)));
        }
        let at = self.word(tokens, now_tick.max(*state & TICK_MASK));
        let ready = self.tick_with(at, cost) * self.tick;
        Decision::denied(Duration::from_nanos(ready.saturating_sub(now))).with_remaining(tokens)
    }

    fn idle_at(&self, state: &u64) -> u64 {
        if *state >> TICK_BITS == 0 {
            return 0;
        }
        self.tick_with(*state, self.size).saturating_mul(self.tick)
    }
}

impl Debt<u64> for TickBucket {
    /// What a key owes: the time it is full again (0: nothing).
    fn debt(&self, state: &u64, _part: usize) -> u128 {
        u128::from(self.idle_at(state))
    }

    /// The empty bucket that is full again at the first tick from the debt's end: at every
    /// instant no fuller than any state full by then (refills add at most `per_tick` a tick).
    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> u64 {
        let debt = u64::try_from(debt(0)).unwrap_or(u64::MAX);
        if debt == 0 {
            return 0;
        }
        let full_tick = debt.div_ceil(self.tick).min(TICK_MASK);
        let refill = self.size.div_ceil(self.per_tick);
        self.word(0, full_tick.saturating_sub(refill))
    }
}

/// 3 tokens, one more every 100 ms.
pub fn bucket() -> TickBucket {
    TickBucket::new(3, 1, Duration::from_millis(100))
}
