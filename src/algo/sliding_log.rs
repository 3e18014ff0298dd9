//! Sliding window log: the timestamps of the counted requests of the last window.

use super::window::{same_window, validate, window_accessors, WindowConfig};
use super::{
    clamp, join_time_and_count, rank_time_and_count, unrank_time_and_count, Algorithm, Debt,
};
use crate::decision::{Decision, Policy};
use crate::error::ConfigError;
use std::collections::VecDeque;
use std::time::Duration;

/// Sliding window log: at most `limit` (cost units) in any `window`: a request at `now` is
/// allowed iff the cost counted in `(now − window, now]` plus its own is at most `limit`.
/// Exact, at the price of memory: O(`limit`) per key. Default policy: leaky.
///
/// **Per-key lock.** The state is a log, not a word, so even the lock-free store
/// ([`CasLimiter`](crate::CasLimiter)) keeps it behind a per-key mutex (held for the step
/// only); [`MutexLimiter`](crate::MutexLimiter) does the same.
///
/// **Memory**: one 16-byte entry (time, cost) per admitted request still in the window, so at
/// most `limit` entries, plus one under [`Policy::Strict`]: a denied request's cost is merged
/// into the newest entry, which takes the denied request's time. That errs strict (the merged
/// cost leaves the window with the latest of them) and keeps the log bounded however hard a
/// client hammers. Requests at one instant share an entry.
///
/// `retry_after` is exact: the time until enough of the oldest entries leave the window.
///
/// # Examples
///
/// ```
/// use hotlimit::algo::{Algorithm, SlidingLog};
/// use std::time::Duration;
///
/// let log = SlidingLog::new(2, Duration::from_secs(10))?;
/// let mut state = log.fresh();
/// assert!(log.update(&mut state, 1_000_000_000, 1).is_allowed());
/// assert!(log.update(&mut state, 4_000_000_000, 1).is_allowed());
/// let denied = log.update(&mut state, 9_000_000_000, 1);
/// assert_eq!(denied.retry_after(), Duration::from_secs(2)); // the 1 s entry leaves at 11 s
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    config: WindowConfig,
}

/// The log of one key: `(time, cost)` entries, oldest first, and their total cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogState {
    entries: VecDeque<(u64, u64)>,
    /// The sum of the entries' costs; u128 so that no cost, however large, overflows it.
    total: u128,
}

impl LogState {
    /// The counted cost still in the log (saturating at `u64::MAX`).
    pub(crate) fn total(&self) -> u64 {
        u64::try_from(self.total).unwrap_or(u64::MAX)
    }

    /// Drops the entries that left the window `(now − window, now]`.
    fn expire(&mut self, now: u64, window: u64) {
        while let Some(&(t, cost)) = self.entries.front() {
            if t.saturating_add(window) > now {
                break;
            }
            self.total -= cost as u128;
            self.entries.pop_front();
        }
    }

    /// Appends `cost` at `now`, sharing the newest entry if it is at the same instant.
    fn push(&mut self, now: u64, cost: u64) {
        match self.entries.back() {
            Some(&(t, _)) if t == now => self.merge(now, cost),
            _ => {
                self.entries.push_back((now, cost));
                self.total += cost as u128;
            }
        }
    }

    /// Takes up to `back` out of the first entry at or after `at`, dropping it if emptied.
    fn refund(&mut self, at: u64, back: u64) {
        let i = self.entries.partition_point(|&(t, _)| t < at);
        let Some((_, c)) = self.entries.get_mut(i) else {
            return;
        };
        let taken = back.min(*c);
        *c -= taken;
        self.total -= taken as u128;
        if *c == 0 {
            self.entries.remove(i);
        }
    }

    /// Adds `cost` to the newest entry and moves it to `now`. The entry's cost saturates;
    /// `total` grows by what the entry really grew, so it stays their exact sum.
    fn merge(&mut self, now: u64, cost: u64) {
        if let Some((t, c)) = self.entries.back_mut() {
            let grown = c.saturating_add(cost);
            self.total += (grown - *c) as u128;
            *t = now;
            *c = grown;
        }
    }
}

impl SlidingLog {
    /// At most `limit` in any `window`; policy leaky.
    pub fn new(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        Ok(Self {
            config: validate(limit, window)?,
        })
    }

    window_accessors!("The window.");

    /// When enough of the oldest entries leave the window for `cost` to fit.
    fn retry_at(&self, log: &LogState, cost: u64) -> u64 {
        self.retry_at_of(log.entries.iter().copied(), log.total, cost)
    }

    /// [`retry_at`](Self::retry_at) over `entries` (oldest first) totalling `total`: also
    /// what a peek reads, a view of the log it does not change.
    fn retry_at_of(
        &self,
        entries: impl Iterator<Item = (u64, u64)>,
        total: u128,
        cost: u64,
    ) -> u64 {
        let excess = (total + cost as u128).saturating_sub(self.config.limit as u128);
        let mut dropped = 0u128;
        let mut last = None;
        for (t, c) in entries {
            dropped += c as u128;
            if dropped >= excess {
                return t.saturating_add(self.config.window_ns);
            }
            last = Some(t);
        }
        // Unreachable for cost ≤ limit: dropping every entry leaves cost ≤ limit.
        last.map_or(0, |t| t.saturating_add(self.config.window_ns))
    }
}

impl Algorithm for SlidingLog {
    /// The counts mean the same under any limit and policy of the same window: a plan or a live
    /// switch changes those, and counts above a smaller limit just deny until they leave it.
    fn check_quota(&self, new: &Self) -> Result<(), ConfigError> {
        same_window(&self.config, &new.config)
    }

    type State = LogState;

    fn fresh(&self) -> LogState {
        LogState::default()
    }

    fn capacity(&self) -> u64 {
        self.config.limit
    }

    fn policy(&self) -> Policy {
        self.config.policy
    }

    fn update(&self, log: &mut LogState, now: u64, cost: u64) -> Decision {
        let (limit, w) = (self.config.limit, self.config.window_ns);
        // A clock read behind the newest entry counts as at it.
        let now = log
            .entries
            .back()
            .map_or(clamp(now), |&(t, _)| clamp(now).max(t));
        log.expire(now, w);
        if log.total + cost as u128 <= limit as u128 {
            log.push(now, cost);
            // total ≤ limit here.
            return Decision::allowed()
                .with_remaining(limit - log.total())
                .with_reset_after_ns(self.idle_at(log) - now);
        }
        // A strict denial is counted: what remains after it is nothing.
        let remaining = match self.config.policy {
            Policy::Leaky => limit.saturating_sub(log.total()),
            Policy::Strict => 0,
        };
        if self.config.policy == Policy::Strict {
            if log.entries.is_empty() {
                log.push(now, cost);
            } else {
                log.merge(now, cost);
            }
        }
        Decision::denied_ns(self.retry_at(log, cost).saturating_sub(now).max(1))
            .with_remaining(remaining)
            .with_reset_after_ns(self.idle_at(log).saturating_sub(now))
    }

    /// [`update`](Algorithm::update)'s decision read off the log in place: the default would
    /// copy the log (an allocation per peek and per partial grant's probe).
    fn peek(&self, log: &LogState, now: u64, cost: u64) -> Decision {
        let (limit, w) = (self.config.limit, self.config.window_ns);
        let now = log
            .entries
            .back()
            .map_or(clamp(now), |&(t, _)| clamp(now).max(t));
        // What `expire` would drop: the entries that have left the window by `now`.
        let gone = log
            .entries
            .partition_point(|&(t, _)| t.saturating_add(w) <= now);
        let dropped: u128 = log.entries.range(..gone).map(|&(_, c)| c as u128).sum();
        let total = log.total - dropped;
        if total + cost as u128 <= limit as u128 {
            // `update` pushes the cost at `now`: the log then idles a window after it.
            return Decision::allowed()
                .with_remaining(limit - (total as u64 + cost))
                .with_reset_after_ns(now.saturating_add(w) - now);
        }
        let kept = log.entries.range(gone..).copied();
        let (retry_at, idle_at) = match self.config.policy {
            Policy::Leaky => (
                self.retry_at_of(kept, total, cost),
                log.entries
                    .back()
                    .filter(|_| gone < log.entries.len())
                    .map_or(0, |&(t, _)| t.saturating_add(w)),
            ),
            // A strict denial is counted: merged into the newest entry, moved to `now` (or
            // the log's only entry).
            Policy::Strict => {
                let last = log.entries.len() - gone;
                let grown = |(i, (t, c)): (usize, (u64, u64))| {
                    if i + 1 == last {
                        (now, c.saturating_add(cost))
                    } else {
                        (t, c)
                    }
                };
                let (entries, total) = match log.entries.back() {
                    Some(&(_, c)) if last > 0 => (
                        Some(kept.enumerate().map(grown)),
                        total + (c.saturating_add(cost) - c) as u128,
                    ),
                    _ => (None, cost as u128),
                };
                let retry_at = match entries {
                    Some(e) => self.retry_at_of(e, total, cost),
                    None => self.retry_at_of(std::iter::once((now, cost)), total, cost),
                };
                (retry_at, now.saturating_add(w))
            }
        };
        let remaining = match self.config.policy {
            Policy::Leaky => limit.saturating_sub(u64::try_from(total).unwrap_or(u64::MAX)),
            Policy::Strict => 0,
        };
        Decision::denied_ns(retry_at.saturating_sub(now).max(1))
            .with_remaining(remaining)
            .with_reset_after_ns(idle_at.saturating_sub(now))
    }

    /// A refund comes out of the entry the request was logged in (the first at or after
    /// `taken_at`) while `taken_at` is still within the window, at most that entry's cost;
    /// an overrun is logged at `now`.
    fn settle(&self, log: &mut LogState, now: u64, taken_at: u64, charged: u64, actual: u64) {
        let w = self.config.window_ns;
        let now = log
            .entries
            .back()
            .map_or(clamp(now), |&(t, _)| clamp(now).max(t));
        log.expire(now, w);
        if actual < charged {
            if clamp(taken_at).saturating_add(w) > now {
                log.refund(clamp(taken_at), charged - actual);
            }
        } else if actual > charged {
            log.push(now, actual - charged);
        }
    }

    /// Fresh once the newest entry has left the window.
    fn idle_at(&self, log: &LogState) -> u64 {
        log.entries
            .back()
            .map_or(0, |&(t, _)| t.saturating_add(self.config.window_ns))
    }
}

impl Debt<LogState> for SlidingLog {
    /// The log's debt is kept by cell: the window is cut into 8 cells of time (on
    /// one grid for every key: `⌈window / CELLS⌉` ns each), and part `p` holds the entries in
    /// the cells numbered `p` modulo `CELLS + 1` (a window's entries span at most `CELLS + 1`
    /// cells, so a part holds one): their newest time and their total cost (saturating at
    /// 2^32 − 1, which restores as a cost that fills any window). Restored, each part is one
    /// entry of its total at its newest time: every cost stays in the window at least as long
    /// as it did, so the log is at least as full at every later time, and each at most a
    /// cell longer. One time and one total for the whole log held every cost until a window
    /// after the newest request: a key that kept asking came back holding its whole total
    /// again and again (a working set of 4× `max_keys` lost 31–34% against a twin that never
    /// evicts).
    fn debt(&self, log: &LogState, part: usize) -> u128 {
        let (mut newest, mut total) = (0, 0u128);
        for &(t, c) in log.entries.iter().filter(|e| self.part_of(e.0) == part) {
            // Oldest first: the last one is the newest.
            newest = t;
            total += u128::from(c);
        }
        if total == 0 {
            return 0;
        }
        (u128::from(newest) << 32) | total.min(u128::from(u32::MAX))
    }

    fn debt_parts(&self) -> usize {
        CELLS as usize + 1
    }

    /// The later time and the larger total.
    fn debt_join(&self, _: usize, a: u128, b: u128) -> u128 {
        join_time_and_count(a, b)
    }

    fn debt_paid_at(&self, _: usize, debt: u128) -> u64 {
        match debt {
            0 => 0,
            d => ((d >> 32) as u64).saturating_add(self.config.window_ns),
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

    /// Each part's entry, oldest first (entries at one instant merged). Under the strict
    /// policy the newest entry also carries at least the cost of every entry still in the
    /// window at its time: a strict denial moves the newest entry's cost to its own instant,
    /// and the newest entry restored from a joined debt may be another key's lighter one.
    /// Moved, the evicted key's newest cost would then have stayed behind and left the window
    /// sooner than in the state it came from (the debt proptest found one such: 20 units at
    /// 9.29 s and another key's 2 at 9.58 s, denials merged into the 2, a request admitted at
    /// 10.29 s that the state denied).
    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> LogState {
        let mut entries: Vec<(u64, u64)> = (0..self.debt_parts())
            .map(debt)
            .filter(|&d| d & 0xFFFF_FFFF != 0)
            .map(|d| {
                let total = (d & 0xFFFF_FFFF) as u64;
                let cost = if total == u64::from(u32::MAX) {
                    u64::MAX
                } else {
                    total
                };
                ((d >> 32) as u64, cost)
            })
            .collect();
        entries.sort_unstable();
        if self.config.policy == Policy::Strict {
            if let Some(&(newest, _)) = entries.last() {
                let w = self.config.window_ns;
                let in_window = entries
                    .iter()
                    .filter(|&&(t, _)| t.saturating_add(w) > newest);
                let most = in_window.map(|&(_, c)| c).max().unwrap_or(0);
                if let Some(last) = entries.last_mut() {
                    last.1 = last.1.max(most);
                }
            }
        }
        let mut log = LogState::default();
        for (t, cost) in entries {
            log.push(t, cost);
        }
        log
    }
}

/// The cells of time a sliding log's window is cut into for its debt
/// ([`SlidingLog`]'s `debt`): each cost comes back at most `⌈window / CELLS⌉` late.
const CELLS: u64 = 8;

impl SlidingLog {
    /// The debt part of an entry at `t`: its cell's number modulo `CELLS + 1`.
    fn part_of(&self, t: u64) -> usize {
        let cell = self.config.window_ns.div_ceil(CELLS).max(1);
        (t / cell % (CELLS + 1)) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// A full log restored from its debt frees its oldest cell a window after that cell's
    /// newest entry, not a window after the log's newest: 10 in 10 s, one a second, come back
    /// owing each cell (1.25 s) at its newest time, so the one at 1 s has left at 11.25 s and
    /// the first free unit comes then, 8.75 s before the whole log would have let one in.
    #[test]
    fn a_restored_log_frees_its_cells_one_by_one() {
        let log = SlidingLog::new(10, Duration::from_secs(10)).unwrap();
        let mut state = log.fresh();
        for i in 1..=10 {
            assert!(log.update(&mut state, i * S, 1).is_allowed());
        }
        let parts: Vec<u128> = (0..log.debt_parts()).map(|p| log.debt(&state, p)).collect();
        // Nine cells from 0–1.25 s to 10–11.25 s, one a part.
        assert_eq!(parts.iter().filter(|&&d| d != 0).count(), 9);
        let mut back = log.restore(&|p| parts[p]);
        assert_eq!(back.total(), 10);
        assert_eq!(log.idle_at(&back), 20 * S);
        // Cell 0 holds the entry at 1 s alone: it leaves at 11 s.
        let denied = log.update(&mut back.clone(), 11 * S - 1, 1);
        assert_eq!(denied.retry_after(), Duration::from_nanos(1));
        assert!(log.update(&mut back, 11 * S, 1).is_allowed());
        // Cell 1 (1.25–2.5 s) holds 2 s; cell 2 (2.5–3.75 s) holds 3 s.
        assert!(log.update(&mut back, 12 * S, 1).is_allowed());
        assert!(!log.update(&mut back, 12 * S + 1, 1).is_allowed());
    }
}
