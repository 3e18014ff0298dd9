//! [`Fallback`]: what an instance decides on its own, and the one rule for every algorithm
//! (each instance's part of the quota is at least one request).

use crate::error::{ConfigError, Field};

/// What a key does while this instance holds no quota for it from Redis: requests beyond its
/// GCRA lease, a key's requests before the fleet's state of it is known (the first seconds
/// after the limiter subscribes), and every request while Redis is unreachable. For the
/// merged algorithms (windows, EARRRL, exponential) also: while a round has gone unanswered
/// for three sync intervals (or four of the quickest round trips), and for
/// `2 × reconnect_after + 2` sync intervals after Redis came back from an outage. Before an
/// instance's first round is answered, a key's first request is the fallback's and the next
/// wait for that round.
///
/// Each instance may decide `share` of the quota on its own:
/// - *GCRA*: beyond its lease, an instance admits at most `⌊share × burst⌋` units ahead of
///   what Redis has been told (charged at the next sync), and only where the fleet's TAT as
///   this instance knows it has room; where that TAT is not known, or Redis is away, it
///   admits at `share` of the rate with a burst of `⌊share × burst⌋`, continuing from the
///   fleet's TAT as last known.
/// - *fixed and sliding window, exponential*: where the others' states are not known, they
///   are taken to hold all of the limit but `⌊share × limit⌋`.
/// - *EARRRL*: likewise, the others' rate taken as `(1 − share) × R` (a rate: nothing is
///   rounded).
///
/// The rule is the same for every algorithm: each instance's part must be at least one
/// request. A share whose part rounds to nothing (`share(0.25)` of a limit of 2 is half a
/// request) is refused by the [`HybridBuilder`](super::HybridBuilder)'s `build` with a [`ConfigError`] naming the share,
/// rather than quietly becoming [`Fallback::DENY`]. With `N` instances, `share(1/N)` keeps the
/// fleet within the quota even when every instance decides alone.
///
/// [`Fallback::DENY`] (share 0) admits nothing without Redis: GCRA admits only from leases,
/// the others only once the fleet's state is known. What any share admits is reconciled when
/// Redis answers: GCRA charges the units to the shared TAT, the others publish their own
/// state, which counted them.
///
/// ```
/// use hotlimit::redis::Fallback;
///
/// // Four instances: each may decide a quarter of the quota on its own.
/// let quarter = Fallback::share(0.25)?;
/// assert_ne!(quarter, Fallback::FULL);
/// assert!(Fallback::share(1.5).is_err());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fallback {
    share: f64,
}

impl Fallback {
    /// Nothing decided without Redis: GCRA admits only from leases, the others only on a
    /// known fleet state.
    pub const DENY: Fallback = Fallback { share: 0.0 };

    /// Each instance alone may decide the whole quota (the default): what the in-memory
    /// limiter does, so an outage costs at most N× the quota for N instances.
    pub const FULL: Fallback = Fallback { share: 1.0 };

    /// `share` of the quota, decided locally; in `(0, 1]`.
    pub fn share(share: f64) -> Result<Self, ConfigError> {
        let value = share.to_string();
        if !share.is_finite() {
            return Err(ConfigError::NotFinite {
                field: Field::Share,
                value,
            });
        }
        if share <= 0.0 {
            return Err(ConfigError::TooSmall {
                field: Field::Share,
                value,
                min: "a share above 0 (Fallback::DENY for none)",
            });
        }
        if share > 1.0 {
            return Err(ConfigError::TooLarge {
                field: Field::Share,
                value,
                max: "1 (the whole quota)",
            });
        }
        Ok(Fallback { share })
    }

    /// The share of the quota decided locally (0 for [`Fallback::DENY`]).
    pub(crate) fn local_share(&self) -> f64 {
        self.share
    }

    /// `⌊share × quota⌋`, the units an instance decides alone; an error if a share above 0
    /// leaves less than one.
    pub(super) fn part(&self, quota: u64) -> Result<u64, ConfigError> {
        let part = (quota as f64 * self.share).floor();
        if self.share > 0.0 && part < 1.0 {
            return Err(ConfigError::TooSmall {
                field: Field::Share,
                value: format!(
                    "{} of a quota of {quota} ({} of a request)",
                    self.share,
                    quota as f64 * self.share
                ),
                min: "a share that leaves each instance at least one request of the quota \
                      (a larger share, or Fallback::DENY)",
            });
        }
        Ok(part as u64)
    }
}

impl Default for Fallback {
    fn default() -> Self {
        Fallback::FULL
    }
}
