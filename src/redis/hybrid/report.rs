//! What the hybrid limiter reports: [`HybridStats`] (and the counters behind them) and
//! [`SyncError`].

use super::BackendError;
use crate::stats::Striped;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Why the hybrid limiter's sync failed last; from [`HybridLimiter::last_error`](super::HybridLimiter::last_error). Cleared by
/// the next sync that reaches Redis without an error.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SyncError {
    /// Redis could not be reached: refused, reset, timed out, a cluster failing over (an
    /// outage: decisions follow the [`Fallback`](super::Fallback) meanwhile).
    Outage(Arc<BackendError>),
    /// Redis answered with an error: a script error, a wrong type, out of memory.
    Backend(Arc<BackendError>),
    /// A state in Redis that this limiter cannot read: a limiter of another algorithm (or
    /// another version) on the same key prefix. Use distinct prefixes.
    ForeignState {
        /// The client key.
        key: String,
        /// What was found.
        found: String,
    },
    /// A reply or a pushed message without the shape the scripts give it.
    Malformed(&'static str),
}

impl SyncError {
    pub(super) fn from_backend(e: BackendError) -> Self {
        if e.is_outage() {
            SyncError::Outage(Arc::new(e))
        } else {
            SyncError::Backend(Arc::new(e))
        }
    }

    /// Whether this is an outage.
    pub fn is_outage(&self) -> bool {
        matches!(self, SyncError::Outage(_))
    }
}

impl fmt::Display for SyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncError::Outage(_) => f.write_str("Redis unreachable"),
            SyncError::Backend(_) => f.write_str("Redis error"),
            SyncError::ForeignState { key, found } => write!(
                f,
                "key {key:?}: not a state of this algorithm in Redis: {found:?} (another \
                 limiter on the same prefix?)"
            ),
            SyncError::Malformed(what) => write!(f, "malformed {what}"),
        }
    }
}

/// The backend's error is the cause, returned by `source` (not printed: a report walking the
/// chain would print it twice).
impl std::error::Error for SyncError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SyncError::Outage(e) | SyncError::Backend(e) => Some(&**e),
            _ => None,
        }
    }
}

/// The hybrid limiter's counters; from [`HybridLimiter::stats`](super::HybridLimiter::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HybridStats {
    /// Sync rounds run.
    pub ticks: u64,
    /// Keys sent to Redis (one per key per round at most: a key is queued once).
    pub calls: u64,
    /// Round trips to Redis (a round's keys go in one pipeline on a server, one per node on
    /// a cluster), connects included.
    pub round_trips: u64,
    /// Keys whose sync failed on an outage; sent again next round.
    pub failed_calls: u64,
    /// Keys whose sync failed otherwise (a script error, a state this limiter cannot read).
    pub errors: u64,
    /// Decisions made by the [`Fallback`](super::Fallback): the fleet's state not known yet, or Redis away.
    pub degraded: u64,
    /// Denials because the fleet's state, as this instance knows it, has no room: the
    /// limit reached.
    pub denied_limit: u64,
    /// Denials for want of quota in hand: an empty GCRA lease with this instance's share
    /// spent until the next sync, or the fallback's share spent. Not (yet) the limit.
    pub denied_waiting: u64,
    /// GCRA units leased from Redis.
    pub leased: u64,
    /// GCRA units handed back unspent (quiet keys, evicted keys, the limiter dropped).
    pub returned: u64,
    /// Evicted GCRA keys not handed back because `max_keys` (within 1,024 and 65,536) were
    /// waiting already (an outage under a flood of new keys): their units stay with Redis,
    /// their debts uncharged.
    pub hand_backs_dropped: u64,
    /// GCRA units admitted beyond a lease (or denied under a strict policy) and charged to
    /// Redis afterwards.
    pub charged: u64,
    /// Keys' states received from the other instances (and this one's own, echoed).
    pub pushes: u64,
    /// Times the subscription was (re)established.
    pub subscribed: u64,
    /// Times the subscription was found deaf (half-open: this instance's own pushes not
    /// heard back within the I/O timeout while its calls succeeded) and made again.
    pub deaf: u64,
    /// The last sync round's lag: from the start of the round before it (the oldest change
    /// it sent) to its replies. What the others' view of this instance's traffic lags by,
    /// before the push's delivery.
    pub sync_lag: Duration,
    /// The largest sync lag so far.
    pub sync_lag_max: Duration,
    /// The mean delay between a state's write in Redis and its push's arrival here, over the
    /// pushed messages heard since Redis' time was first known (zero before).
    pub push_lag: Duration,
    /// The largest delay seen between a state's write in Redis and its push's arrival here,
    /// since Redis' time was first known (before, the write's time is this machine's guess).
    pub push_lag_max: Duration,
    /// Whether the last sync round found Redis unreachable (decisions use the
    /// [`Fallback`](super::Fallback)).
    pub outage: bool,
    /// Whether this instance knows the fleet's state of every key: Redis reachable,
    /// subscribed, and past the horizon after subscribing (at once if no state of the prefix
    /// was live then). Until then a key it has not heard of is decided by the
    /// [`Fallback`](super::Fallback).
    pub current: bool,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) ticks: AtomicU64,
    pub(super) calls: AtomicU64,
    pub(super) round_trips: AtomicU64,
    pub(super) failed_calls: AtomicU64,
    pub(super) errors: AtomicU64,
    /// Written per request: striped by thread, as are the denials.
    pub(super) degraded: Striped,
    pub(super) denied_limit: Striped,
    pub(super) denied_waiting: Striped,
    pub(super) leased: AtomicU64,
    pub(super) returned: AtomicU64,
    pub(super) hand_backs_dropped: AtomicU64,
    pub(super) charged: AtomicU64,
    pub(super) pushes: AtomicU64,
    pub(super) subscribed: AtomicU64,
    pub(super) deaf: AtomicU64,
    pub(super) lag: AtomicU64,
    pub(super) lag_max: AtomicU64,
    pub(super) push_lag_max: AtomicU64,
    /// The pushed messages heard, and the sum of their delays (ns).
    pub(super) messages: AtomicU64,
    pub(super) push_lag_sum: AtomicU64,
}
