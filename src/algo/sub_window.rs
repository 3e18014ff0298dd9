//! Sub-window counters: the window split into buckets, the last window's buckets summed.

use super::window::{check_u32_limit, same_window, validate, window_accessors, Bias, WindowConfig};
use super::{
    clamp, join_time_and_count, rank_time_and_count, unrank_time_and_count, Algorithm, Debt,
};
use crate::decision::{Decision, Policy};
use crate::error::{ConfigError, Field};
use std::time::Duration;

/// The default number of buckets per window.
pub const DEFAULT_BUCKETS: u32 = 60;

/// The most buckets a sub-window takes: 16 KiB of counters a key.
const MAX_BUCKETS: u32 = 4096;

/// A bucket's largest count (strict counts saturate there).
const COUNT_MAX: u32 = u32::MAX - 1;

/// Sub-window counters (the hybrid of fixed windows and the log): `window` split into `k`
/// buckets of `window / k` (default 60); a request is allowed iff the cost counted in the last
/// window's buckets plus its own is at most `limit`. With [`Bias::Strict`] (the default) one
/// extra bucket is summed so the limiter errs strict, not lenient. Default policy: leaky.
///
/// **Per-key lock.** The state is `k` (+1) counters, not a word, so even the lock-free store
/// keeps it behind a per-key mutex (held for the step only).
///
/// **Memory**: 4 bytes per bucket (61 buckets: 244 bytes) plus 24 bytes of header per key.
/// Limits up to 2^32 − 3. Under [`Policy::Strict`] every denied unit is counted in its bucket
/// (saturating at 2^32 − 2), so a client that keeps hammering stays out until the buckets it
/// hammered leave the span.
///
/// # Examples
///
/// ```
/// use hotlimit::algo::{Algorithm, SubWindow};
/// use std::time::Duration;
///
/// // 2 per 10 s in 10 buckets of 1 s, erring strict (11 buckets summed).
/// let s = SubWindow::new(2, Duration::from_secs(10), 10)?;
/// let mut state = s.fresh();
/// assert!(s.update(&mut state, 500_000_000, 1).is_allowed()); // bucket 0
/// assert!(s.update(&mut state, 3_200_000_000, 1).is_allowed()); // bucket 3
/// let denied = s.update(&mut state, 9_000_000_000, 1);
/// // Bucket 0 leaves the sum when bucket 11 starts, at 11 s.
/// assert_eq!(denied.retry_after(), Duration::from_secs(2));
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubWindow {
    config: WindowConfig,
    /// Bucket width, ns.
    bucket_ns: u64,
    buckets: u32,
    bias: Bias,
}

/// One key's buckets: a ring indexed by absolute bucket number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketState {
    counts: Box<[u32]>,
    /// Absolute number of the newest bucket.
    head: u64,
    total: u64,
}

impl SubWindow {
    /// At most `limit` per `window`, counted in `buckets` buckets (1 to 4,096: each key keeps
    /// a counter of 4 bytes per bucket); erring strict, policy leaky.
    pub fn new(limit: u64, window: Duration, buckets: u32) -> Result<Self, ConfigError> {
        let config = validate(limit, window)?;
        check_u32_limit(limit)?;
        if buckets == 0 {
            return Err(ConfigError::Zero {
                field: Field::Buckets,
                value: "0".into(),
            });
        }
        if buckets > MAX_BUCKETS {
            // A key's counters are allocated whole at its first request: 4 billion buckets
            // would be 16 GiB for one key.
            return Err(ConfigError::TooLarge {
                field: Field::Buckets,
                value: buckets.to_string(),
                max: "4096",
            });
        }
        let bucket_ns = config.window_ns / buckets as u64;
        if bucket_ns == 0 {
            return Err(ConfigError::TooLarge {
                field: Field::Buckets,
                value: buckets.to_string(),
                max: "the window in nanoseconds (a bucket is at least 1 ns)",
            });
        }
        Ok(Self {
            config,
            bucket_ns,
            buckets,
            bias: Bias::Strict,
        })
    }

    window_accessors!("The window, as configured (the buckets span it).");

    /// Sets which way the approximation errs.
    pub fn with_bias(self, bias: Bias) -> Self {
        Self { bias, ..self }
    }

    /// The bucket width.
    #[cfg(feature = "redis")]
    pub(crate) fn bucket(&self) -> Duration {
        Duration::from_nanos(self.bucket_ns)
    }

    /// How many buckets a request is counted against.
    pub(crate) fn span(&self) -> u64 {
        match self.bias {
            Bias::Strict => self.buckets as u64 + 1,
            Bias::Lenient => self.buckets as u64,
        }
    }

    /// Moves the ring forward to bucket `now_bucket`, dropping the buckets that left the span.
    fn advance(&self, st: &mut BucketState, now_bucket: u64) {
        let n = self.span();
        if st.counts.is_empty() {
            st.counts = vec![0; n as usize].into_boxed_slice();
        }
        if now_bucket <= st.head {
            return;
        }
        if now_bucket - st.head >= n {
            st.counts.iter_mut().for_each(|c| *c = 0);
            st.total = 0;
        } else {
            for b in st.head + 1..=now_bucket {
                let slot = &mut st.counts[(b % n) as usize];
                st.total -= *slot as u64;
                *slot = 0;
            }
        }
        st.head = now_bucket;
    }

    /// The start of the bucket after which the oldest counted cost has left enough for `cost`
    /// to fit.
    fn retry_at(&self, st: &BucketState, cost: u64) -> u64 {
        let n = self.span();
        self.retry_at_of(st.head, st.total, cost, |b| st.counts[(b % n) as usize])
    }

    /// [`retry_at`](Self::retry_at) for buckets up to `head` totalling `total`, bucket `b`
    /// counting `count(b)`: also what a peek reads, a view of the ring it does not change.
    fn retry_at_of(&self, head: u64, total: u64, cost: u64, count: impl Fn(u64) -> u32) -> u64 {
        let n = self.span();
        let excess = total.saturating_add(cost).saturating_sub(self.config.limit);
        let oldest = head.saturating_sub(n - 1);
        let mut dropped = 0;
        for b in oldest..=head {
            dropped += count(b) as u64;
            if dropped >= excess {
                // Bucket b leaves the span when bucket b + n starts.
                return b.saturating_add(n).saturating_mul(self.bucket_ns);
            }
        }
        head.saturating_add(n).saturating_mul(self.bucket_ns)
    }

    /// When the newest bucket up to `head` with a count leaves the span (0: none): the
    /// state's [`idle_at`](Algorithm::idle_at), and a peek's of the ring as it would be.
    fn idle_at_of(&self, head: u64, count: impl Fn(u64) -> u32) -> u64 {
        let n = self.span();
        self.newest_of(head, count)
            .map_or(0, |b| b.saturating_add(n).saturating_mul(self.bucket_ns))
    }

    /// The newest bucket up to `head` (within the span) whose count is not 0.
    fn newest_of(&self, head: u64, count: impl Fn(u64) -> u32) -> Option<u64> {
        (0..self.span().min(head + 1))
            .map(|back| head - back)
            .find(|&b| count(b) > 0)
    }
}

impl Algorithm for SubWindow {
    /// The buckets mean the same under any limit and policy of the same window, bucket count and
    /// bias (the ring's layout): a plan or a live switch changes the limit and policy.
    fn check_quota(&self, new: &Self) -> Result<(), ConfigError> {
        same_window(&self.config, &new.config)?;
        if (self.buckets, self.bias) == (new.buckets, new.bias) {
            return Ok(());
        }
        Err(ConfigError::Unchangeable {
            field: Field::Buckets,
            from: format!("{} {:?}", self.buckets, self.bias),
            to: format!("{} {:?}", new.buckets, new.bias),
        })
    }

    type State = BucketState;

    fn fresh(&self) -> BucketState {
        BucketState::default()
    }

    fn capacity(&self) -> u64 {
        self.config.limit
    }

    fn policy(&self) -> Policy {
        self.config.policy
    }

    fn update(&self, st: &mut BucketState, now: u64, cost: u64) -> Decision {
        let limit = self.config.limit;
        let now = clamp(now);
        // A clock read behind the newest bucket counts as in it.
        let bucket = (now / self.bucket_ns).max(st.head);
        self.advance(st, bucket);
        let slot = (bucket % self.span()) as usize;
        if st.total.saturating_add(cost) <= limit {
            // ≤ limit < u32::MAX.
            st.counts[slot] += cost as u32;
            st.total += cost;
            return Decision::allowed()
                .with_remaining(limit - st.total)
                .with_reset_after_ns(self.idle_at(st).saturating_sub(now));
        }
        // A strict denial is counted: what remains after it is nothing.
        let remaining = match self.config.policy {
            Policy::Leaky => limit.saturating_sub(st.total),
            Policy::Strict => 0,
        };
        if self.config.policy == Policy::Strict {
            // Every denied unit counts, so a hammering client stays out until the bucket it
            // hammered leaves the span; the 32-bit bucket saturates one below all ones.
            let before = st.counts[slot];
            let after = (before as u64).saturating_add(cost).min(COUNT_MAX as u64) as u32;
            st.counts[slot] = after;
            st.total += (after - before) as u64;
        }
        Decision::denied_ns(self.retry_at(st, cost).saturating_sub(now).max(1))
            .with_remaining(remaining)
            .with_reset_after_ns(self.idle_at(st).saturating_sub(now))
    }

    /// [`update`](Algorithm::update)'s decision read off the ring in place: the default would
    /// copy the ring (an allocation per peek and per partial grant's probe).
    fn peek(&self, st: &BucketState, now: u64, cost: u64) -> Decision {
        let (limit, n) = (self.config.limit, self.span());
        let now = clamp(now);
        let bucket = (now / self.bucket_ns).max(st.head);
        // The ring as `advance` would leave it: bucket `b` of the span ending at `bucket`
        // counts what the ring holds for it, nothing if it is newer than the ring's head.
        let held = |b: u64| if b <= st.head { self.held(st, b) } else { 0 };
        let total = if bucket - st.head >= n {
            0
        } else {
            // `advance` empties the slots of buckets head + 1..=bucket: the ones that left.
            let slot = |b: u64| u64::from(self.held(st, b));
            st.total - (st.head + 1..=bucket).map(slot).sum::<u64>()
        };
        if total.saturating_add(cost) <= limit {
            let after = total + cost;
            let idle_at = if cost > 0 {
                bucket.saturating_add(n).saturating_mul(self.bucket_ns)
            } else {
                self.idle_at_of(bucket, held)
            };
            return Decision::allowed()
                .with_remaining(limit - after)
                .with_reset_after_ns(idle_at.saturating_sub(now));
        }
        let (remaining, added) = match self.config.policy {
            Policy::Leaky => (limit.saturating_sub(total), 0),
            // A strict denial is counted in the current bucket (saturating).
            Policy::Strict => {
                let before = held(bucket);
                let after = (before as u64).saturating_add(cost).min(COUNT_MAX as u64) as u32;
                (0, after - before)
            }
        };
        let count = |b: u64| held(b) + if b == bucket { added } else { 0 };
        let total = total + added as u64;
        Decision::denied_ns(
            self.retry_at_of(bucket, total, cost, count)
                .saturating_sub(now)
                .max(1),
        )
        .with_remaining(remaining)
        .with_reset_after_ns(self.idle_at_of(bucket, count).saturating_sub(now))
    }

    /// A refund comes out of the bucket the request was counted in while that bucket is in
    /// the span; an overrun is counted in the current bucket (32-bit buckets saturate).
    fn settle(&self, st: &mut BucketState, now: u64, taken_at: u64, charged: u64, actual: u64) {
        let bucket = (clamp(now) / self.bucket_ns).max(st.head);
        self.advance(st, bucket);
        let n = self.span();
        let (at, change) = if actual < charged {
            let taken = clamp(taken_at) / self.bucket_ns;
            if taken > bucket || bucket - taken >= n {
                return;
            }
            (taken, charged - actual)
        } else {
            (bucket, actual - charged)
        };
        let slot = &mut st.counts[(at % n) as usize];
        let before = *slot;
        if actual < charged {
            *slot = before.saturating_sub(u32::try_from(change).unwrap_or(u32::MAX));
            st.total -= (before - *slot) as u64;
        } else {
            *slot = (before as u64).saturating_add(change).min(COUNT_MAX as u64) as u32;
            st.total += (*slot - before) as u64;
        }
    }

    /// Fresh once the newest non-empty bucket has left the span.
    fn idle_at(&self, st: &BucketState) -> u64 {
        self.idle_at_of(st.head, |b| self.held(st, b))
    }
}

impl Debt<BucketState> for SubWindow {
    /// The debt is kept by cell of buckets (see `SlidingLog`'s): cells of `⌈(span − 1) /
    /// CELLS⌉` buckets (one bucket a cell for a span of `CELLS + 1` or fewer), as many parts
    /// as the span can touch cells (at most `CELLS + 1`), part `p` holding the cells numbered
    /// `p` modulo the parts: the newest bucket with a count in
    /// the cell and the cell's total (saturating at 2^32 − 1). Restored, each part's total is
    /// counted in that bucket: every count stays in the span at least as long as it did, and
    /// at most a cell longer. One bucket and one total for the whole ring held every count
    /// until the newest bucket left the span: a working set of 4× `max_keys` lost 31–34%.
    fn debt(&self, st: &BucketState, part: usize) -> u128 {
        let n = self.span();
        let (mut newest, mut total) = (0, 0u64);
        for b in (st.head.saturating_sub(n - 1)..=st.head).filter(|&b| self.part_of(b) == part) {
            let count = self.held(st, b);
            if count > 0 {
                newest = b;
                total += u64::from(count);
            }
        }
        if total == 0 {
            return 0;
        }
        (u128::from(newest) << 32) | u128::from(total.min(u64::from(u32::MAX)))
    }

    /// The cells the span's buckets can fall in: `⌈(span − 1) / cell⌉ + 1`.
    fn debt_parts(&self) -> usize {
        (self.span() - 1).div_ceil(self.cell()) as usize + 1
    }

    /// The newer bucket and the larger total.
    fn debt_join(&self, _: usize, a: u128, b: u128) -> u128 {
        join_time_and_count(a, b)
    }

    fn debt_paid_at(&self, _: usize, debt: u128) -> u64 {
        match debt & 0xFFFF_FFFF {
            0 => 0,
            _ => ((debt >> 32) as u64)
                .saturating_add(self.span())
                .saturating_mul(self.bucket_ns),
        }
    }

    fn debt_lanes(&self, _: usize) -> usize {
        2
    }

    fn debt_rank(&self, _: usize, _: u128, own: u128) -> [u64; 2] {
        rank_time_and_count(own)
    }

    fn debt_unrank(&self, _: usize, shared: u128, rank: [u64; 2]) -> u128 {
        unrank_time_and_count(shared, rank)
    }

    /// Each part's total in its bucket, the ring's head the newest of them (a part's bucket
    /// already out of that span is dropped: it would be).
    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> BucketState {
        let parts: Vec<(u64, u64)> = (0..self.debt_parts())
            .map(debt)
            .filter(|&d| d & 0xFFFF_FFFF != 0)
            .map(|d| ((d >> 32) as u64, (d & 0xFFFF_FFFF) as u64))
            .collect();
        let Some(head) = parts.iter().map(|p| p.0).max() else {
            return BucketState::default();
        };
        let n = self.span();
        let mut st = BucketState {
            counts: vec![0; n as usize].into_boxed_slice(),
            head,
            total: 0,
        };
        for (b, count) in parts.into_iter().filter(|&(b, _)| b + n > head) {
            // At most COUNT_MAX in a bucket: above any limit, so it denies all the same.
            let slot = &mut st.counts[(b % n) as usize];
            let before = *slot;
            *slot = (u64::from(before) + count).min(u64::from(COUNT_MAX)) as u32;
            st.total += u64::from(*slot - before);
        }
        st
    }
}

/// A sub-window's span of buckets is cut into at most this many cells for its debt, which
/// keeps one more (see its `debt`): a window of 10 buckets keeps each bucket (with 8 cells,
/// two buckets to a cell, a working set of 4× `max_keys` lost 3.4–4.5%; one to a cell,
/// 0.0–0.8%), at 11 parts of 32 bytes per key of `max_keys`.
const CELLS: u64 = 10;

impl SubWindow {
    /// Buckets per debt cell: `⌈(span − 1) / CELLS⌉`, at least 1.
    fn cell(&self) -> u64 {
        (self.span() - 1).div_ceil(CELLS).max(1)
    }

    /// The debt part of bucket `b`: its cell's number modulo the parts.
    fn part_of(&self, b: u64) -> usize {
        (b / self.cell() % self.debt_parts() as u64) as usize
    }

    /// The count `st`'s ring holds in bucket `b`'s slot (0 for a fresh, empty ring).
    fn held(&self, st: &BucketState, b: u64) -> u32 {
        st.counts
            .get((b % self.span()) as usize)
            .copied()
            .unwrap_or(0)
    }
}
