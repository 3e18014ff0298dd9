//! Sliding window counter: the current window's count plus the previous one's, weighted by
//! how much of it still overlaps the sliding window.

use super::window::{check_u32_limit, same_window, validate, window_accessors, Bias, WindowConfig};
use super::{clamp, count_from24, count_up24, honest_wait, Algorithm, Debt};
use crate::decision::{Decision, Policy};
use crate::error::ConfigError;
use std::time::Duration;

/// Sliding window counter ("sliding tail"): at most `limit` per `window`, estimated as
/// `weighted = prev·(1 − elapsed/window) + current + cost`, where `prev` and `current` are the
/// counts of the previous and current fixed windows and `elapsed` the time into the current
/// one. Denied iff `weighted > limit` ([`Bias::Strict`], default) or
/// `⌊weighted⌋ > limit` ([`Bias::Lenient`]). Default policy: leaky.
///
/// The comparison is exact integer arithmetic: `weighted·window` is computed in `u128`.
///
/// **State**: one `u128`: the window index (64 bits) and the two counts (32 bits each). Three
/// fields do not fit 64 bits without limiting both the count and the time range, so this one
/// takes the lock-free double-word CAS. Limits up to 2^32 − 3. Under [`Policy::Strict`] every
/// denied unit is counted (saturating at 2^32 − 2), also once its window becomes the previous
/// one, so a client that keeps hammering stays out until its weighted count falls.
///
/// `retry_after` is the earliest wait after which the same request is allowed with no other
/// traffic (the weighted count only falls as time passes), found in closed form and settled to
/// the nanosecond against the real step.
///
/// # Examples
///
/// ```
/// use hotlimit::algo::{Algorithm, SlidingWindow};
/// use std::time::Duration;
///
/// let s = SlidingWindow::new(4, Duration::from_secs(10))?;
/// let mut state = s.fresh();
/// for _ in 0..4 {
///     assert!(s.update(&mut state, 5_000_000_000, 1).is_allowed()); // window [0 s, 10 s)
/// }
/// // At 12.5 s the previous window's 4 still weigh 4·(1 − 2.5/10) = 3: one more fits.
/// assert!(s.update(&mut state, 12_500_000_000, 1).is_allowed());
/// let denied = s.update(&mut state, 12_500_000_000, 1);
/// // 4·(1 − e/10) + 1 + 1 ≤ 4 once e ≥ 5 s: retry at 15 s.
/// assert_eq!(denied.retry_after(), Duration::from_millis(2_500));
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    config: WindowConfig,
    bias: Bias,
}

/// A count's largest value (strict counts saturate there, one below the all-ones tombstone).
const COUNT_MAX: u64 = u32::MAX as u64 - 1;

/// The counts of the previous and current window, as seen from `now`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
    pub(crate) index: u64,
    pub(crate) prev: u64,
    pub(crate) cur: u64,
    /// Time into the current window, ns.
    elapsed: u64,
}

impl SlidingWindow {
    /// At most `limit` per sliding `window`; bias strict, policy leaky.
    pub fn new(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        let config = validate(limit, window)?;
        check_u32_limit(limit)?;
        Ok(Self {
            config,
            bias: Bias::Strict,
        })
    }

    window_accessors!("The window.");

    /// Sets which way the weighted count errs: [`Bias::Lenient`] forgives a fractional
    /// excess.
    pub fn with_bias(self, bias: Bias) -> Self {
        Self { bias, ..self }
    }

    /// Which way the weighted count errs.
    #[cfg(feature = "redis")]
    pub(crate) fn bias(&self) -> Bias {
        self.bias
    }

    #[inline]
    pub(crate) fn pack(index: u64, prev: u64, cur: u64) -> u128 {
        ((index as u128) << 64) | ((prev as u128) << 32) | cur as u128
    }

    #[inline]
    pub(crate) fn unpack(word: u128) -> (u64, u64, u64) {
        (
            (word >> 64) as u64,
            ((word >> 32) as u32) as u64,
            (word as u32) as u64,
        )
    }

    /// The state as seen from `now`: windows that ended shift the counts.
    #[inline]
    pub(crate) fn view(&self, word: u128, now: u64) -> View {
        let w = self.config.window_ns;
        let (stored, prev, cur) = Self::unpack(word);
        let now_index = now / w;
        // A clock read behind the stored window is taken as the start of it.
        let index = now_index.max(stored);
        let elapsed = if now_index >= index {
            now - index * w
        } else {
            0
        };
        let (prev, cur) = match index - stored {
            0 => (prev, cur),
            1 => (cur, 0),
            _ => (0, 0),
        };
        View {
            index,
            prev,
            cur,
            elapsed,
        }
    }

    /// `weighted·window` must not exceed this for a request to be allowed.
    #[inline]
    fn bound(&self) -> u128 {
        let (limit, w) = (self.config.limit as u128, self.config.window_ns as u128);
        match self.bias {
            Bias::Strict => limit * w,
            // ⌊x⌋ ≤ limit ⇔ x < limit + 1 ⇔ x·w ≤ (limit + 1)·w − 1.
            Bias::Lenient => (limit + 1) * w - 1,
        }
    }

    /// `prev·(window − elapsed)`: the previous window's weight, times the window.
    #[inline]
    fn carried(&self, v: &View) -> u128 {
        v.prev as u128 * (self.config.window_ns - v.elapsed) as u128
    }

    fn allowed_at(&self, word: u128, now: u64, cost: u64) -> bool {
        let v = self.view(word, clamp(now));
        self.weighted(&v, cost) <= self.bound()
    }

    /// `weighted·window` for a request of `cost`, in u128. Within the contract (cost ≤ limit
    /// < 2^32) it is below 2^97; a cost near 2^64 with a window near 2^64 saturates, which is
    /// still above any bound.
    #[inline]
    fn weighted(&self, v: &View, cost: u64) -> u128 {
        let counted = (v.cur as u128 + cost as u128).saturating_mul(self.config.window_ns as u128);
        self.carried(v).saturating_add(counted)
    }

    /// A closed-form estimate of the wait, settled exactly by `honest_wait`.
    fn retry_after(&self, word: u128, now: u64, cost: u64) -> u64 {
        let v = self.view(word, now);
        let (w, b) = (self.config.window_ns as f64, self.bound() as f64);
        let need_cur = (v.cur as f64 + cost as f64) * w;
        // Within this window the previous count's weight falls to (b − need_cur) / prev.
        let guess = if v.prev > 0 && b >= need_cur {
            let e = w - (b - need_cur) / v.prev as f64;
            e - v.elapsed as f64
        } else {
            // Next window: the current count becomes the previous one.
            let need = cost as f64 * w;
            let e = if v.cur > 0 {
                (w - (b - need) / v.cur as f64).max(0.0)
            } else {
                0.0
            };
            (w - v.elapsed as f64) + e
        };
        honest_wait(guess, |wait| {
            self.allowed_at(word, now.saturating_add(wait), cost)
        })
    }
}

impl Algorithm for SlidingWindow {
    /// The counts mean the same under any limit and policy of the same window: a plan or a live
    /// switch changes those, and counts above a smaller limit just deny until they leave it.
    fn check_quota(&self, new: &Self) -> Result<(), ConfigError> {
        same_window(&self.config, &new.config)
    }

    type State = u128;

    fn fresh(&self) -> u128 {
        0
    }

    fn capacity(&self) -> u64 {
        self.config.limit
    }

    fn policy(&self) -> Policy {
        self.config.policy
    }

    #[inline]
    fn update(&self, state: &mut u128, now: u64, cost: u64) -> Decision {
        let now = clamp(now);
        let (limit, w) = (self.config.limit, self.config.window_ns as u128);
        let v = self.view(*state, now);
        let carried = self.carried(&v);
        if self.weighted(&v, cost) <= self.bound() {
            *state = Self::pack(v.index, v.prev, v.cur + cost);
            // The largest further cost that would still fit now.
            let room = ((self.bound() - carried) / w) as u64 - (v.cur + cost);
            let reset = self
                .idle_at_view(&View {
                    cur: v.cur + cost,
                    ..v
                })
                .saturating_sub(now);
            return Decision::allowed()
                .with_remaining(room.min(limit))
                .with_reset_after_ns(reset);
        }
        if self.config.policy == Policy::Strict {
            // Every denied unit counts, also once this window becomes the previous one, so a
            // hammering client stays out until its weighted count falls; 32-bit saturation.
            *state = Self::pack(v.index, v.prev, v.cur.saturating_add(cost).min(COUNT_MAX));
        }
        // A strict denial was counted: what remains is what remains after it, nothing.
        let remaining = match self.config.policy {
            Policy::Leaky => (((self.bound().saturating_sub(carried)) / w) as u64)
                .saturating_sub(v.cur)
                .min(limit),
            Policy::Strict => 0,
        };
        Decision::denied_ns(self.retry_after(*state, now, cost))
            .with_remaining(remaining)
            .with_reset_after_ns(self.idle_at(state).saturating_sub(now))
    }

    /// A refund comes out of the count of the window the request was counted in while that
    /// window is still the current or the previous one; an overrun is counted in the current
    /// window (32-bit counts saturate).
    fn settle(&self, state: &mut u128, now: u64, taken_at: u64, charged: u64, actual: u64) {
        let v = self.view(*state, clamp(now));
        let (mut prev, mut cur) = (v.prev, v.cur);
        if actual < charged {
            let back = charged - actual;
            let taken = clamp(taken_at) / self.config.window_ns;
            if taken == v.index {
                cur = cur.saturating_sub(back);
            } else if taken.checked_add(1) == Some(v.index) {
                prev = prev.saturating_sub(back);
            } else {
                return;
            }
        } else if actual > charged {
            cur = cur.saturating_add(actual - charged).min(COUNT_MAX);
        } else {
            return;
        }
        *state = Self::pack(v.index, prev, cur);
    }

    /// Fresh once both counts have left the sliding window: one window after the current one
    /// ends if it counted anything, else when the current one ends.
    fn idle_at(&self, state: &u128) -> u64 {
        let (index, prev, cur) = Self::unpack(*state);
        self.idle_at_view(&View {
            index,
            prev,
            cur,
            elapsed: 0,
        })
    }
}

impl Debt<u128> for SlidingWindow {
    /// The debt is the state in 96 bits: the window index in 48 (every index a window of
    /// 65 µs or more reaches in 584 years; a later index is kept as "locked": it never pays
    /// off) and each count in 24, rounded up past 2^19 (within 2^-18). Restored, it is the
    /// same counts of the same windows, or a little more.
    fn debt(&self, state: &u128, _: usize) -> u128 {
        let (index, prev, cur) = Self::unpack(*state);
        if prev == 0 && cur == 0 {
            return 0;
        }
        let index = u128::from(index.min(DEBT_INDEX_LOCKED));
        (index << 48) | (count_up24(prev) << 24) | count_up24(cur)
    }

    /// Both brought to the later window (the earlier one's counts shift or leave), then the
    /// larger of each count: at least as limited as either at every later time.
    fn debt_join(&self, _: usize, a: u128, b: u128) -> u128 {
        let (a, b) = (self.restore(&|_| a), self.restore(&|_| b));
        let (ia, ..) = Self::unpack(a);
        let (ib, ..) = Self::unpack(b);
        let index = ia.max(ib);
        let at = |word: u128| {
            let (i, prev, cur) = Self::unpack(word);
            match index - i {
                0 => (prev, cur),
                1 => (cur, 0),
                _ => (0, 0),
            }
        };
        let ((pa, ca), (pb, cb)) = (at(a), at(b));
        self.debt(&Self::pack(index, pa.max(pb), ca.max(cb)), 0)
    }

    fn debt_lanes(&self, _: usize) -> usize {
        2
    }

    /// Brought to the shared word's window `I`: what it counts from window `I − 1` on (the
    /// two counts' sum) and in window `I` (the current count). A state is at least as limited
    /// as another of its window when both are at least the other's.
    fn debt_rank(&self, _: usize, shared: u128, own: u128) -> [u64; 2] {
        let (index, prev, cur) = Self::unpack(self.restore(&|_| own));
        match self.index_of(shared).checked_sub(index) {
            _ if own == 0 => [0, 0],
            Some(0) => [prev.saturating_add(cur), cur],
            Some(1) => [cur, 0],
            Some(_) => [0, 0],
            // Never so (`shared` joins it); if it were, as much as the shared word.
            None => [u64::MAX; 2],
        }
    }

    /// In the shared word's window (counts `P`, `C`): the current count `min(c, C)`, the
    /// previous one what is left of the sum `s`, at most `P`.
    fn debt_unrank(&self, _: usize, shared: u128, rank: [u64; 2]) -> u128 {
        let (index, top_prev, top_cur) = Self::unpack(self.restore(&|_| shared));
        if shared == 0 || index == u64::MAX - 2 {
            // Nothing, or locked: the shared word itself.
            return shared;
        }
        let cur = rank[1].min(top_cur);
        let prev = rank[0].saturating_sub(cur).min(top_prev);
        if prev == 0 && cur == 0 {
            // Owes nothing in window `I`, paid as late as anything it stands for (window
            // `I − 2`'s count, paid when `I` starts).
            return self.debt(&Self::pack(index.saturating_sub(2), 0, 1), 0);
        }
        self.debt(&Self::pack(index, prev, cur), 0)
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> u128 {
        let d = debt(0);
        let index = (d >> 48) as u64;
        let count = |code: u128| count_from24(code & 0xFF_FFFF).min(COUNT_MAX);
        let (prev, cur) = (count(d >> 24), count(d));
        if index >= DEBT_INDEX_LOCKED && (prev, cur) != (0, 0) {
            return Self::pack(u64::MAX - 2, COUNT_MAX, COUNT_MAX);
        }
        Self::pack(index, prev, cur)
    }
}

impl SlidingWindow {
    /// The window index of a debt word (as restored).
    fn index_of(&self, debt: u128) -> u64 {
        Self::unpack(self.restore(&|_| debt)).0
    }
}

/// The largest window index a sliding window's debt word keeps; at it, "locked".
const DEBT_INDEX_LOCKED: u64 = (1 << 48) - 1;

impl SlidingWindow {
    fn idle_at_view(&self, v: &View) -> u64 {
        let w = self.config.window_ns;
        let windows = if v.cur > 0 {
            2
        } else if v.prev > 0 {
            1
        } else {
            return 0;
        };
        v.index.saturating_add(windows).saturating_mul(w)
    }
}
