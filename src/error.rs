//! Typed errors: [`ConfigError`] for bad configuration, [`BuildError`] for a limiter that
//! cannot be built, [`QuotaError`] for a request that cannot be decided.

use std::fmt;
use std::sync::Arc;

/// The configuration field an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// A rate such as `10/s`.
    Rate,
    /// The period of a rate or quota.
    Period,
    /// The burst (largest cost admitted at one instant).
    Burst,
    /// EARRRL's half-life.
    HalfLife,
    /// A limit (largest count or cost per period or window).
    Limit,
    /// A window length.
    Window,
    /// The number of sub-window buckets.
    Buckets,
    /// A duration given on its own (for example a maximum wait).
    Duration,
    /// A share of a quota (the hybrid limiter's fallback), in `(0, 1]`.
    Share,
    /// The background sweeper's interval
    /// ([`Builder::sweep_every`](crate::store::Builder::sweep_every)).
    SweepInterval,
    /// What a denied request does ([`Policy`](crate::Policy)).
    Policy,
    /// A quota that comes with a request ([`Request::quota`](crate::Request::quota)).
    Quota,
    /// The lease of an in-flight permit ([`InFlight`](crate::algo::InFlight)).
    Lease,
    /// The levels of a hierarchy checked at once (the Redis backend's `check_all`).
    Levels,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Rate => "rate",
            Field::Period => "period",
            Field::Burst => "burst",
            Field::HalfLife => "half-life",
            Field::Limit => "limit",
            Field::Window => "window",
            Field::Buckets => "buckets",
            Field::Duration => "duration",
            Field::SweepInterval => "sweep interval",
            Field::Share => "share",
            Field::Policy => "policy",
            Field::Quota => "quota",
            Field::Lease => "lease",
            Field::Levels => "levels",
        })
    }
}

/// A configuration value that hotlimit refuses, with the field and the value that caused it.
///
/// Every constructor and parser of the crate returns this instead of panicking.
///
/// # Examples
///
/// ```
/// use hotlimit::{ConfigError, Field, Rate};
///
/// let err = "0/s".parse::<Rate>().unwrap_err();
/// assert_eq!(err, ConfigError::Zero { field: Field::Rate, value: "0/s".into() });
/// assert_eq!(err.to_string(), "rate must be positive, got `0/s`");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// Zero where a positive value is required.
    Zero {
        /// The field.
        field: Field,
        /// The value as given.
        value: String,
    },
    /// A negative value.
    Negative {
        /// The field.
        field: Field,
        /// The value as given.
        value: String,
    },
    /// NaN or infinite.
    NotFinite {
        /// The field.
        field: Field,
        /// The value as given.
        value: String,
    },
    /// Larger than the state packing or the nanosecond arithmetic can represent.
    TooLarge {
        /// The field.
        field: Field,
        /// The value as given.
        value: String,
        /// The largest accepted value, in words.
        max: &'static str,
    },
    /// Smaller than the algorithm can work with.
    TooSmall {
        /// The field.
        field: Field,
        /// The value as given.
        value: String,
        /// The smallest accepted value, in words.
        min: &'static str,
    },
    /// A live reconfiguration or a per-request quota that would change what the kept per-key
    /// state means (an EARRRL half-life, an exponential period, a window's length); see
    /// [`Algorithm::check_quota`](crate::algo::Algorithm::check_quota).
    Unchangeable {
        /// The field.
        field: Field,
        /// The current value.
        from: String,
        /// The value asked for.
        to: String,
    },
    /// A value given twice where each must be distinct (a Redis key at two levels of a
    /// hierarchy).
    Repeated {
        /// The field.
        field: Field,
        /// The value given twice.
        value: String,
    },
    /// A human-readable string (`10/s`, `250ms`, `10/min burst 20`) that does not parse.
    Parse {
        /// The field being parsed.
        field: Field,
        /// The input string.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl ConfigError {
    /// The field this error is about.
    pub fn field(&self) -> Field {
        match self {
            ConfigError::Zero { field, .. }
            | ConfigError::Negative { field, .. }
            | ConfigError::NotFinite { field, .. }
            | ConfigError::TooLarge { field, .. }
            | ConfigError::TooSmall { field, .. }
            | ConfigError::Unchangeable { field, .. }
            | ConfigError::Repeated { field, .. }
            | ConfigError::Parse { field, .. } => *field,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Zero { field, value } => {
                write!(f, "{field} must be positive, got `{value}`")
            }
            ConfigError::Negative { field, value } => {
                write!(f, "{field} must be positive, got negative `{value}`")
            }
            ConfigError::NotFinite { field, value } => {
                write!(f, "{field} must be a finite number, got `{value}`")
            }
            ConfigError::TooLarge { field, value, max } => {
                write!(f, "{field} `{value}` is too large: at most {max}")
            }
            ConfigError::TooSmall { field, value, min } => {
                write!(f, "{field} `{value}` is too small: at least {min}")
            }
            ConfigError::Unchangeable { field, from, to } => write!(
                f,
                "{field} cannot change from {from} to {to} on this limiter: its kept per-key state is measured in it"
            ),
            ConfigError::Repeated { field, value } => {
                write!(f, "{field}: `{value}` is given twice")
            }
            ConfigError::Parse {
                field,
                input,
                reason,
            } => write!(f, "cannot parse {field} `{input}`: {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a limiter (or a [`CoarseClock`](crate::CoarseClock)) could not be built.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, BuildError, CasLimiter, ConfigError, Field};
/// use std::time::Duration;
///
/// let err = CasLimiter::<u64, Gcra>::builder("10/s".parse()?)
///     .sweep_every(Duration::from_nanos(1))
///     .build()
///     .unwrap_err();
/// assert!(matches!(
///     err,
///     BuildError::Config(ConfigError::TooSmall { field: Field::SweepInterval, .. })
/// ));
/// # Ok::<(), ConfigError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// A setting refused (a sweep interval below its floor).
    Config(ConfigError),
    /// A background thread (the sweeper, the coarse clock's ticker) could not be started.
    Spawn(std::io::Error),
    /// A table sized for `max_keys` (or the debt table beside it) could not be allocated.
    OutOfMemory,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Config(e) => e.fmt(f),
            BuildError::Spawn(e) => write!(f, "cannot start a background thread: {e}"),
            BuildError::OutOfMemory => {
                f.write_str("cannot allocate a table sized for max_keys: out of memory")
            }
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Config(e) => Some(e),
            BuildError::Spawn(e) => Some(e),
            BuildError::OutOfMemory => None,
        }
    }
}

impl From<std::collections::TryReserveError> for BuildError {
    fn from(_: std::collections::TryReserveError) -> Self {
        BuildError::OutOfMemory
    }
}

impl From<ConfigError> for BuildError {
    fn from(e: ConfigError) -> Self {
        BuildError::Config(e)
    }
}

/// Why a limiter could not decide a request: its cost can never be admitted (0, or more than
/// the algorithm's capacity: an error, not a denial that would never end), the quota that
/// comes with it cannot be used here ([`Request::quota`](crate::Request::quota)), a settle's
/// ticket is another's, each refused before anything was counted; or the limiter's backend
/// failed (over Redis). The error of every in-memory [`Request`](crate::Request), and the one
/// every [`AsyncRateLimiter`](crate::AsyncRateLimiter)'s error converts into, which is how the
/// tower layer tells a request it refuses (a cost: `413`) from a limiter that cannot decide
/// (`503`).
///
/// ```
/// use hotlimit::{algo::FixedWindow, QuotaError, CasLimiter, RateLimiter, Requests};
/// use std::time::Duration;
///
/// let l = CasLimiter::<String, _>::new(FixedWindow::new(100, Duration::from_secs(60))?);
/// let per_hour = FixedWindow::new(100, Duration::from_secs(3600))?;
/// assert!(matches!(l.request("k").quota(&per_hour).check(), Err(QuotaError::Quota(_))));
/// let small = FixedWindow::new(10, Duration::from_secs(60))?;
/// assert_eq!(
///     l.request("k").cost(11).quota(&small).check(),
///     Err(QuotaError::ExceedsCapacity { cost: 11, capacity: 10 }),
/// );
/// assert_eq!(l.check_n("k", 0), Err(QuotaError::ZeroCost));
/// assert_eq!(
///     l.check_n("k", 101).unwrap_err().to_string(),
///     "cost 101 exceeds the capacity 100: it can never be allowed",
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
/// A settle with a ticket from elsewhere is refused, and the ticket stays open:
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, QuotaError, Requests};
///
/// let l = CasLimiter::<String, Gcra, _>::with_clock("100/min".parse()?, ManualClock::default());
/// let mut ticket = l.request("alice").cost(30).take()?;
/// let other_key = l.request("bob").settle(&mut ticket, 0);
/// assert_eq!(other_key, Err(QuotaError::TicketForOtherKey));
/// let other = CasLimiter::<String, Gcra, _>::with_clock("100/min".parse()?, ManualClock::default());
/// let elsewhere = other.request("alice").settle(&mut ticket, 0);
/// assert_eq!(elsewhere, Err(QuotaError::TicketFromOtherLimiter));
/// assert_eq!(l.request("alice").settle(&mut ticket, 0), Ok(true)); // still open: refunded here
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum QuotaError {
    /// A cost of zero: every request costs at least 1.
    ZeroCost,
    /// A cost above what the algorithm (or the request's quota) can ever admit at once: its
    /// burst, limit or window limit.
    ExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// The largest cost the limiter can ever admit.
        capacity: u64,
    },
    /// The quota cannot read the states this limiter keeps (another window, bucket layout or
    /// count width: [`Algorithm::check_quota`](crate::algo::Algorithm::check_quota)).
    /// Boxed: the error is rare, and a small one keeps `Result<Decision, QuotaError>` the
    /// size of a [`Decision`](crate::Decision) (its niche), which the hot path returns.
    Quota(Box<ConfigError>),
    /// A settle's [`Ticket`](crate::Ticket) was taken from another limiter (or another kind
    /// of store: in memory, the hybrid limiter, a Redis client of another key prefix).
    /// Nothing changed and the ticket stays open, so the right settle can follow.
    TicketFromOtherLimiter,
    /// A settle's ticket was taken for another key. Nothing changed and the ticket stays
    /// open.
    TicketForOtherKey,
    /// The limiter could not decide: its backend failed (a Redis outage its fail mode does
    /// not answer, an error reply). Not the request's fault. The backend's own error (the
    /// Redis backend's `BackendError`), to log or to downcast; never an in-memory limiter's.
    Backend(Arc<dyn std::error::Error + Send + Sync>),
}

/// Equal when the same failure: two backend errors are equal only if they are one
/// (`Arc::ptr_eq`), since a backend's error need not compare.
impl PartialEq for QuotaError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (QuotaError::ZeroCost, QuotaError::ZeroCost) => true,
            (
                QuotaError::ExceedsCapacity { cost, capacity },
                QuotaError::ExceedsCapacity {
                    cost: c,
                    capacity: k,
                },
            ) => cost == c && capacity == k,
            (QuotaError::Quota(a), QuotaError::Quota(b)) => a == b,
            (QuotaError::TicketFromOtherLimiter, QuotaError::TicketFromOtherLimiter)
            | (QuotaError::TicketForOtherKey, QuotaError::TicketForOtherKey) => true,
            (QuotaError::Backend(a), QuotaError::Backend(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for QuotaError {}

/// A cause is either printed or returned by `source`, never both (a report walking the
/// chain would print it twice): a refused cost is this error, so it prints and has no
/// source; the quota's configuration error and the backend's error are the cause,
/// returned by `source`.
impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::ZeroCost => f.write_str("a request cost must be at least 1, got 0"),
            QuotaError::ExceedsCapacity { cost, capacity } => write!(
                f,
                "cost {cost} exceeds the capacity {capacity}: it can never be allowed"
            ),
            QuotaError::Quota(_) => f.write_str("this quota cannot be used on this limiter"),
            QuotaError::TicketFromOtherLimiter => {
                f.write_str("the ticket was taken from another limiter")
            }
            QuotaError::TicketForOtherKey => f.write_str("the ticket was taken for another key"),
            QuotaError::Backend(_) => f.write_str("the limiter's backend could not decide"),
        }
    }
}

impl std::error::Error for QuotaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            QuotaError::ZeroCost
            | QuotaError::ExceedsCapacity { .. }
            | QuotaError::TicketFromOtherLimiter
            | QuotaError::TicketForOtherKey => None,
            QuotaError::Quota(e) => Some(&**e),
            QuotaError::Backend(e) => Some(&**e),
        }
    }
}

impl From<ConfigError> for QuotaError {
    fn from(e: ConfigError) -> Self {
        QuotaError::Quota(Box::new(e))
    }
}

/// Checks `cost` against the largest admissible cost.
#[inline]
pub(crate) fn check_cost(cost: u64, capacity: u64) -> Result<(), QuotaError> {
    if cost == 0 {
        Err(QuotaError::ZeroCost)
    } else if cost > capacity {
        Err(QuotaError::ExceedsCapacity { cost, capacity })
    } else {
        Ok(())
    }
}

/// What a report prints of `e`: its message, then each source's after a colon (tests: every
/// cause must show once).
#[cfg(test)]
pub(crate) fn report(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out = format!("{out}: {s}");
        next = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Decision;
    use std::mem::size_of;

    /// The fallible checks return their decision in a `Result` no larger than the decision:
    /// the errors fit beside its niche, so the hot path writes no extra word.
    #[test]
    fn results_are_the_size_of_a_decision() {
        assert_eq!(
            size_of::<Result<Decision, QuotaError>>(),
            size_of::<Decision>()
        );
    }

    /// A report that prints an error and then its sources prints each cause once.
    #[test]
    fn a_quota_error_chain_prints_each_cause_once() {
        let config = ConfigError::Unchangeable {
            field: Field::Window,
            from: "1s".into(),
            to: "1m".into(),
        };
        let e = QuotaError::Quota(Box::new(config.clone()));
        assert_eq!(
            report(&e),
            format!("this quota cannot be used on this limiter: {config}")
        );
        let cost = QuotaError::ExceedsCapacity {
            cost: 7,
            capacity: 5,
        };
        assert_eq!(
            report(&cost),
            "cost 7 exceeds the capacity 5: it can never be allowed"
        );
        let down = Arc::new(std::io::Error::other("connection refused"));
        let e = QuotaError::Backend(down.clone());
        assert_eq!(
            report(&e),
            "the limiter's backend could not decide: connection refused"
        );
        // The same failure is equal to itself; another with the same text is not it.
        assert_eq!(e, QuotaError::Backend(down));
        let other = Arc::new(std::io::Error::other("connection refused"));
        assert_ne!(e, QuotaError::Backend(other));
    }
}
