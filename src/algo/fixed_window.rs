//! Fixed window: at most `limit` per window, windows aligned to the clock's origin.

use super::window::{same_window, validate, window_accessors, WindowConfig};
use super::{clamp, Algorithm, Debt};
use crate::decision::{Decision, Policy};
use crate::error::{ConfigError, Field};
use std::time::Duration;

/// Fixed window: at most `limit` (cost units) per `window`; window `i` covers
/// `[i·window, (i+1)·window)` from the clock's origin. Default policy: leaky.
///
/// **State**: one `u64`, the window index in the high bits and the count in the low bits. The
/// index field is just wide enough for every window index of the whole u64 nanosecond range
/// (so it never wraps), and the count gets the rest; it must hold `limit + 1` (a strict count
/// saturates there: any count above the limit denies alike): roughly,
/// `2·(limit + 1) ≤ window in ns` (`limit` up to 2^29 at a 1 s window, up to ~524k at 1 ms).
/// Larger limits are a [`ConfigError::TooLarge`]. The layout depends on the window alone, so
/// any limit of the same window reads the same states.
///
/// `retry_after` is the time to the end of the window; `remaining` and `reset_after` are
/// exact.
///
/// # Examples
///
/// ```
/// use hotlimit::algo::{Algorithm, FixedWindow};
/// use std::time::Duration;
///
/// // 3 per 60 s: requests at 100 s and 110 s fall in window [60 s, 120 s) with two before.
/// let w = FixedWindow::new(3, Duration::from_secs(60))?;
/// let mut state = w.fresh();
/// for t in [61, 70, 100] {
///     assert!(w.update(&mut state, t * 1_000_000_000, 1).is_allowed());
/// }
/// let denied = w.update(&mut state, 110_000_000_000, 1);
/// assert_eq!(denied.retry_after(), Duration::from_secs(10));
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    config: WindowConfig,
    /// Bits of the count field.
    count_bits: u32,
}

impl FixedWindow {
    /// At most `limit` per `window`; policy leaky.
    pub fn new(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        let config = validate(limit, window)?;
        // The index gets just the bits for the largest window index the clock can reach,
        // kept below the all-ones index (all ones everywhere is the tombstone); the count
        // gets the rest, so the layout depends on the window alone and every limit of one
        // window reads the same states (plans, live switches).
        let max_index = u64::MAX / config.window_ns;
        let index_bits = 128 - (max_index as u128 + 1).leading_zeros();
        let count_bits = 64u32.saturating_sub(index_bits);
        // Counts go up to limit + 1 (in u128: a limit of u64::MAX must not overflow here).
        if count_bits == 0 || limit as u128 + 1 >= 1u128 << count_bits {
            return Err(ConfigError::TooLarge {
                field: Field::Limit,
                value: limit.to_string(),
                max: "what a 64-bit state of window index and count can hold: about (window in ns) / 2",
            });
        }
        Ok(Self { config, count_bits })
    }

    window_accessors!("The window.");

    #[inline]
    pub(crate) fn pack(&self, index: u64, count: u64) -> u64 {
        (index << self.count_bits) | count
    }

    /// The largest count a word holds (it depends on the window alone).
    #[cfg(feature = "redis")]
    pub(crate) fn count_max(&self) -> u64 {
        (1 << self.count_bits) - 1
    }

    #[inline]
    pub(crate) fn unpack(&self, word: u64) -> (u64, u64) {
        (word >> self.count_bits, word & ((1 << self.count_bits) - 1))
    }
}

impl Algorithm for FixedWindow {
    /// A fixed window's count means the same under any limit of the same window (the layout
    /// depends on the window alone): a plan or a live switch changes the limit and policy, and a
    /// count above a smaller limit just denies until the window ends.
    fn check_quota(&self, new: &Self) -> Result<(), ConfigError> {
        same_window(&self.config, &new.config)
    }

    type State = u64;

    fn fresh(&self) -> u64 {
        0
    }

    fn capacity(&self) -> u64 {
        self.config.limit
    }

    fn policy(&self) -> Policy {
        self.config.policy
    }

    #[inline]
    fn update(&self, state: &mut u64, now: u64, cost: u64) -> Decision {
        let now = clamp(now);
        let (limit, w) = (self.config.limit, self.config.window_ns);
        let (stored, count) = self.unpack(*state);
        // A clock read behind the stored window counts as in it.
        let index = (now / w).max(stored);
        let count = if index == stored { count } else { 0 };
        let reset_after = index
            .saturating_add(1)
            .saturating_mul(w)
            .saturating_sub(now);
        let new = count.saturating_add(cost);
        if new <= limit {
            *state = self.pack(index, new);
            return Decision::allowed()
                .with_remaining(limit - new)
                .with_reset_after_ns(reset_after);
        }
        if self.config.policy == Policy::Strict {
            // Capped at limit + 1 (denied for the rest of the window), never below the count:
            // a count kept under a larger limit (a plan, a live switch) must not drop.
            *state = self.pack(index, new.min(limit + 1).max(count));
        }
        // Cost ≤ limit, so the request fits the next window.
        // A strict denial was counted: what remains is what remains after it, nothing.
        let remaining = match self.config.policy {
            Policy::Leaky => limit.saturating_sub(count),
            Policy::Strict => 0,
        };
        Decision::denied_ns(reset_after.max(1))
            .with_remaining(remaining)
            .with_reset_after_ns(reset_after)
    }

    /// A refund comes out of the window the request was counted in, if it is still the
    /// current one; an overrun is counted in the current window, up to `limit + 1` (the key is
    /// denied for the rest of the window), never below the count already there (one kept
    /// under a larger limit: a plan, a live switch).
    fn settle(&self, state: &mut u64, now: u64, taken_at: u64, charged: u64, actual: u64) {
        let w = self.config.window_ns;
        let (stored, count) = self.unpack(*state);
        if actual < charged {
            if clamp(taken_at) / w == stored && clamp(now) / w <= stored {
                *state = self.pack(stored, count.saturating_sub(charged - actual));
            }
        } else if actual > charged {
            let index = (clamp(now) / w).max(stored);
            let count = if index == stored { count } else { 0 };
            let limit = self.config.limit;
            let new = count
                .saturating_add(actual - charged)
                .min(limit + 1)
                .max(count);
            *state = self.pack(index, new);
        }
    }

    /// Fresh once its window has ended (or if it never counted anything).
    fn idle_at(&self, state: &u64) -> u64 {
        let (index, count) = self.unpack(*state);
        if count == 0 {
            0
        } else {
            index
                .saturating_add(1)
                .saturating_mul(self.config.window_ns)
        }
    }
}

impl Debt<u64> for FixedWindow {
    /// The debt is the state word, `(index, count)` with the index in the high bits: restored
    /// exactly (the count of the same window), and of two words the larger is the later window
    /// or, in one window, the larger count: the more limited.
    fn debt(&self, state: &u64, _: usize) -> u128 {
        u128::from(*state)
    }

    /// The end of its window; for a count of 0, its start (from then on as good as fresh),
    /// so that the paid time grows with the word.
    fn debt_paid_at(&self, _: usize, debt: u128) -> u64 {
        let (index, count) = self.unpack(debt as u64);
        index
            .saturating_add(u64::from(count != 0))
            .saturating_mul(self.config.window_ns)
    }

    fn debt_lanes(&self, _: usize) -> usize {
        1
    }

    fn debt_rank(&self, _: usize, _: u128, own: u128) -> [u64; 2] {
        [own as u64, 0]
    }

    fn debt_unrank(&self, _: usize, _: u128, rank: [u64; 2]) -> u128 {
        u128::from(rank[0])
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> u64 {
        debt(0) as u64
    }
}
