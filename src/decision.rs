//! The answer to a request ([`Decision`]) and what a denied request does to the state
//! ([`Policy`]).

use crate::clock::duration_to_nanos;
use crate::error::{ConfigError, Field, QuotaError};
use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

/// What a denied request does to a key's state.
///
/// # Examples
///
/// ```
/// use hotlimit::Policy;
///
/// assert_eq!("strict".parse::<Policy>(), Ok(Policy::Strict));
/// assert_eq!(Policy::Leaky.to_string(), "leaky");
/// let err = "lenient".parse::<Policy>().unwrap_err();
/// assert_eq!(err.to_string(), "cannot parse policy `lenient`: expected leaky or strict");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Policy {
    /// Only allowed requests change the state: a client that retries after a denial is not
    /// punished further.
    Leaky,
    /// Every request, allowed or denied, is counted: a client that keeps hammering stays locked
    /// out until it slows down.
    Strict,
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Leaky => "leaky",
            Policy::Strict => "strict",
        })
    }
}

/// `leaky` or `strict`; anything else is a [`ConfigError::Parse`] of [`Field::Policy`].
impl std::str::FromStr for Policy {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "leaky" => Ok(Policy::Leaky),
            "strict" => Ok(Policy::Strict),
            other => Err(ConfigError::Parse {
                field: Field::Policy,
                input: other.to_owned(),
                reason: "expected leaky or strict",
            }),
        }
    }
}

/// Sentinel for "not known by this algorithm" in the integer fields.
const NONE: u64 = u64::MAX;

/// The answer to one request.
///
/// * [`is_allowed`](Decision::is_allowed): admitted or not.
/// * [`retry_after`](Decision::retry_after): when denied, how long until the same request
///   would be allowed with no other traffic. It is honest: never rounded down, and under
///   [`Policy::Strict`] it accounts for this denied request having been counted. Zero when
///   allowed.
/// * [`remaining`](Decision::remaining), [`reset_after`](Decision::reset_after): where the
///   algorithm knows them, the capacity left after this request and the time until the key is
///   back to fresh.
/// * [`rate`](Decision::rate): for the averaging algorithms (EARRRL, exponential), the measured
///   rate in requests (cost units) per second, so callers can run in dry-run/shadow mode.
///
/// It is 40 bytes and `Copy`; the optional fields use sentinels internally.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::{Algorithm, Gcra}, Rate};
/// use std::time::Duration;
///
/// let gcra = Gcra::new("10/s".parse()?)?.with_burst(1)?;
/// let mut state = gcra.fresh();
/// assert!(gcra.update(&mut state, 0, 1).is_allowed());
/// let second = gcra.update(&mut state, 0, 1);
/// assert!(!second.is_allowed());
/// assert_eq!(second.retry_after(), Duration::from_millis(100));
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Clone, Copy)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a decision is the limiter's answer: a request not checked for it is admitted unlimited"]
pub struct Decision {
    /// 0 when admitted, at least 1 when denied: the one word that says which (a denial always
    /// asks for some wait), so an admission's test is a compare with zero and the admitted
    /// path writes a constant.
    retry_after: u64,
    /// The remaining count times the divisor (or, with a divisor of 1, the count, NONE if
    /// unknown): GCRA's count is a division of times, left to
    /// [`remaining`](Decision::remaining) so that a request whose caller never reads it does
    /// not wait on the divider.
    remaining: u64,
    /// The divisor of `remaining` (at least 1: GCRA's emission interval). Its zero (never
    /// used) is the niche a `Result` keeps its tag in.
    per: NonZeroU64,
    reset_after: u64,
    /// NaN when unknown: written as none, so that formats without NaN (JSON) carry it.
    #[cfg_attr(feature = "serde", serde(with = "nan_as_none"))]
    rate: f64,
}

/// `Decision::rate`'s NaN ("not known") as a missing value, any other rate as itself.
#[cfg(feature = "serde")]
mod nan_as_none {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(rate: &f64, s: S) -> Result<S::Ok, S::Error> {
        (!rate.is_nan()).then_some(*rate).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

/// A divisor of `remaining`, at least 1.
#[inline(always)]
const fn divisor(per: u64) -> NonZeroU64 {
    debug_assert!(per >= 1);
    match NonZeroU64::new(per) {
        Some(per) => per,
        // Unreachable: every divisor is at least 1.
        None => NonZeroU64::MIN,
    }
}

impl Decision {
    /// An admitted request, nothing else known: what an algorithm of your own returns (see
    /// [`Algorithm`](crate::algo::Algorithm)), with [`with_remaining`](Self::with_remaining),
    /// [`with_reset_after`](Self::with_reset_after) and [`with_rate`](Self::with_rate) for
    /// what it knows.
    ///
    /// ```
    /// use hotlimit::Decision;
    /// use std::time::Duration;
    ///
    /// let yes = Decision::allowed().with_remaining(4);
    /// assert!(yes.is_allowed());
    /// assert_eq!(yes.remaining(), Some(4));
    /// let no = Decision::denied(Duration::from_secs(2)).with_reset_after(Duration::from_secs(5));
    /// assert_eq!(no.retry_after(), Duration::from_secs(2));
    /// assert_eq!(no.reset_after(), Some(Duration::from_secs(5)));
    /// // A denial always asks for some wait: zero is read as 1 ns.
    /// let now = Decision::denied(Duration::ZERO);
    /// assert!(now.is_denied());
    /// assert_eq!(now.retry_after(), Duration::from_nanos(1));
    /// ```
    #[inline]
    pub const fn allowed() -> Self {
        Self {
            retry_after: 0,
            remaining: NONE,
            per: NonZeroU64::MIN,
            reset_after: NONE,
            rate: f64::NAN,
        }
    }

    /// A denied decision: retry after `retry_after_ns` (at least 1 ns: see `retry_after`).
    #[inline]
    pub(crate) const fn denied_ns(retry_after_ns: u64) -> Self {
        Self::denied_after(if retry_after_ns == 0 {
            1
        } else {
            retry_after_ns
        })
    }

    /// A denied decision whose wait `retry_after_ns` is known to be at least 1 ns, built
    /// without the check (GCRA's paths, whose waits are a debt or a cost above zero).
    #[inline(always)]
    pub(crate) const fn denied_after(retry_after_ns: u64) -> Self {
        debug_assert!(retry_after_ns >= 1);
        Self {
            retry_after: retry_after_ns,
            remaining: NONE,
            per: NonZeroU64::MIN,
            reset_after: NONE,
            rate: f64::NAN,
        }
    }

    /// A denied request, to be retried after `retry_after` (saturating at `u64::MAX`
    /// nanoseconds, about 584 years; a zero wait is 1 ns, as a denial always asks for one).
    #[inline]
    pub fn denied(retry_after: Duration) -> Self {
        Self::denied_ns(duration_to_nanos(retry_after))
    }

    /// This decision with `reset_after` until the key is back at its full quota.
    #[inline]
    pub fn with_reset_after(self, reset_after: Duration) -> Self {
        self.with_reset_after_ns(duration_to_nanos(reset_after))
    }

    /// This decision with `remaining` requests (or units of cost) left.
    #[inline]
    pub const fn with_remaining(mut self, remaining: u64) -> Self {
        // u64::MAX remaining is indistinguishable from "unknown"; one less changes nothing real.
        self.remaining = if remaining == NONE {
            NONE - 1
        } else {
            remaining
        };
        self.per = NonZeroU64::MIN;
        self
    }

    /// Remaining `span / per` (a whole count, rounded down), divided only when read.
    #[inline]
    pub(crate) const fn with_remaining_of(mut self, span: u64, per: u64) -> Self {
        if per <= 1 {
            return self.with_remaining(span);
        }
        self.remaining = span;
        self.per = divisor(per);
        self
    }

    /// An allowed decision with `span / per` remaining and `reset_after_ns` to fresh, built
    /// with no sentinel checks: both must be below NONE and `per` at least 1 (GCRA's fast
    /// path, where both are at most its tolerance and `per` its interval).
    #[inline(always)]
    pub(crate) const fn allowed_within(span: u64, per: u64, reset_after_ns: u64) -> Self {
        debug_assert!(span < NONE && reset_after_ns < NONE);
        Self {
            retry_after: 0,
            remaining: span,
            per: divisor(per),
            reset_after: reset_after_ns,
            rate: f64::NAN,
        }
    }

    /// The remaining count, NONE if unknown.
    #[inline]
    fn count(&self) -> u64 {
        match self.per.get() {
            1 => self.remaining,
            per => self.remaining / per,
        }
    }

    #[inline]
    pub(crate) const fn with_reset_after_ns(mut self, ns: u64) -> Self {
        self.reset_after = if ns == NONE { NONE - 1 } else { ns };
        self
    }

    /// This denial asking for a wait of at least `ns`.
    #[inline]
    pub(crate) const fn with_retry_at_least_ns(mut self, ns: u64) -> Self {
        if ns > self.retry_after {
            self.retry_after = ns;
        }
        self
    }

    /// This decision with the rate the algorithm measured, in cost units per second (an
    /// algorithm of your own that measures one, as EARRRL and the exponential limiter do);
    /// a NaN is none, as if never set.
    ///
    /// ```
    /// use hotlimit::Decision;
    ///
    /// assert_eq!(Decision::allowed().with_rate(12.5).rate(), Some(12.5));
    /// assert_eq!(Decision::allowed().with_rate(f64::NAN).rate(), None);
    /// ```
    #[inline]
    pub const fn with_rate(mut self, per_second: f64) -> Self {
        self.rate = per_second;
        self
    }

    /// Two quotas' decisions as one (see [`AllOf`](crate::algo::AllOf)).
    #[inline]
    pub(crate) fn all_of(a: Self, b: Self) -> Self {
        let allowed = a.is_allowed() && b.is_allowed();
        // Only the quotas that denied hold the request back: one that allows now still
        // allows later, so the longest of their waits is honest and tight.
        let wait = |d: &Self| if d.is_allowed() { 0 } else { d.retry_after };
        let remaining = if allowed {
            a.count().min(b.count())
        } else {
            // A quota that allowed has at least the cost left; one that denied, less.
            [a, b]
                .iter()
                .filter(|d| !d.is_allowed())
                .map(Self::count)
                .min()
                .unwrap_or(NONE)
        };
        Self {
            retry_after: wait(&a).max(wait(&b)),
            remaining,
            per: NonZeroU64::MIN,
            // Unknown (NONE) if either is unknown: fresh needs both fresh.
            reset_after: if a.reset_after == NONE || b.reset_after == NONE {
                NONE
            } else {
                a.reset_after.max(b.reset_after)
            },
            rate: if a.rate.is_nan() { b.rate } else { a.rate },
        }
    }

    /// Whether the request is admitted.
    #[inline]
    pub const fn is_allowed(&self) -> bool {
        self.retry_after == 0
    }

    /// Whether the request is denied.
    #[inline]
    pub const fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// How long until the same request would be allowed, with no other traffic: zero when
    /// allowed, at least 1 ns when denied.
    #[inline]
    pub fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after)
    }

    /// [`retry_after`](Decision::retry_after) in nanoseconds.
    #[inline]
    pub(crate) fn retry_after_nanos(&self) -> u64 {
        self.retry_after
    }

    /// The cost that could still be admitted right after this request, where the algorithm
    /// knows it.
    #[inline]
    pub fn remaining(&self) -> Option<u64> {
        let count = self.count();
        (count != NONE).then_some(count)
    }

    /// How long until the key's state is back to that of a fresh key, where known.
    #[inline]
    pub fn reset_after(&self) -> Option<Duration> {
        (self.reset_after != NONE).then(|| Duration::from_nanos(self.reset_after))
    }

    /// The measured rate in cost units per second (EARRRL: just before this request;
    /// exponential: including it), where the algorithm measures one.
    #[inline]
    pub fn rate(&self) -> Option<f64> {
        (!self.rate.is_nan()).then_some(self.rate)
    }
}

impl PartialEq for Decision {
    /// Exact equality, the rate compared bit for bit (so two "no rate" decisions are equal).
    fn eq(&self, other: &Self) -> bool {
        self.is_allowed() == other.is_allowed()
            && self.retry_after == other.retry_after
            && self.count() == other.count()
            && self.reset_after == other.reset_after
            && self.rate.to_bits() == other.rate.to_bits()
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Decision");
        d.field("allowed", &self.is_allowed())
            .field("retry_after", &self.retry_after());
        if let Some(r) = self.remaining() {
            d.field("remaining", &r);
        }
        if let Some(r) = self.reset_after() {
            d.field("reset_after", &r);
        }
        if let Some(r) = self.rate() {
            d.field("rate", &r);
        }
        d.finish()
    }
}

/// A provisional charge: what `take` returns and `settle` settles.
///
/// For costs known only after the work (tokens generated, bytes sent): `take(key, estimate)`
/// decides and charges the estimate like `check_n`; once the work is done,
/// `settle(key, &mut ticket, actual)` refunds the unused units or charges the overrun (past
/// the burst if need be: a debt the key pays before its next admission). A ticket settles
/// once: a repeated settle changes nothing and returns `false`. A ticket never settled (a
/// dropped one) simply stands as charged. A denied ticket holds nothing to settle. Not
/// `Clone`: two copies of one reservation could settle it twice.
///
/// Settle with the limiter and key the ticket was taken from (anywhere else, a settle is a
/// [`QuotaError::TicketForOtherKey`] or [`QuotaError::TicketFromOtherLimiter`] and changes
/// nothing); what a settle means for each algorithm is
/// [`Algorithm::settle`](crate::algo::Algorithm::settle).
///
/// With the `serde` feature a ticket serializes, for a service that hands it to a client and
/// settles it later, or on another replica of a shared backend (a Redis client's ticket is
/// bound to its key alone, and Redis applies its settle once). A deserialized ticket is as
/// good as the original, so it is a capability: keep it where clients cannot change it, or
/// sign it (`hotlimit-server` does), and settle each once: in memory, a second copy of an
/// open ticket settles again.
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock, Requests};
///
/// // 100 tokens per minute, estimated at 30 per request up front.
/// let l = CasLimiter::<String, Gcra, _>::with_clock("100/min".parse()?, ManualClock::default());
/// let mut ticket = l.request("key").cost(30).take()?;
/// assert!(ticket.decision().is_allowed());
/// assert!(l.request("key").settle(&mut ticket, 12)?); // 18 unused tokens come back
/// assert!(!l.request("key").settle(&mut ticket, 12)?); // settled once
/// assert_eq!(l.request("key").peek()?.remaining(), Some(87)); // 100 − 12 − the peeked unit
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a ticket is settled with the actual cost; dropped, it stands as charged"]
pub struct Ticket {
    decision: Decision,
    charged: u64,
    taken_at: u64,
    open: bool,
    /// The reservation's id where a shared backend keeps its settle idempotent (Redis marks
    /// it settled); 0 in memory.
    id: u128,
    /// Where it was taken: the limiter's id (0: a Redis client, bound by its key alone) and
    /// the key's hash, checked by every settle.
    origin: (u64, u64),
}

impl Ticket {
    /// A ticket for a request of `charged` units decided `decision` at `taken_at` (ns of the
    /// issuing limiter's clock), taken from `limiter` for the key whose hash is `key`: open if
    /// `decision` admitted it. What a limiter of your own returns from
    /// [`Requests::take`](crate::Requests::take); its settle then checks the ticket with
    /// [`check_origin`](Ticket::check_origin) and closes it with [`close`](Ticket::close),
    /// as the crate's limiters do. `limiter` names your limiter among every limiter a ticket
    /// could be brought to: draw it at random when the limiter is built (the crate's
    /// in-memory limiters draw theirs so, the Redis clients use 0). Any function of the
    /// key serves as `key`, as long as the settle computes the same.
    ///
    /// ```
    /// use hotlimit::{Decision, QuotaError, Ticket};
    ///
    /// let mut t = Ticket::issue(Decision::allowed(), 3, 1_000, 0xfeed, 42);
    /// assert_eq!(t.check_origin(0xfeed, 7), Err(QuotaError::TicketForOtherKey));
    /// assert_eq!(t.check_origin(0xfeed, 42), Ok(()));
    /// assert_eq!(t.close(), Some((1_000, 3))); // the settle's to make
    /// assert_eq!(t.close(), None); // settled once
    /// ```
    pub fn issue(decision: Decision, charged: u64, taken_at: u64, limiter: u64, key: u64) -> Self {
        Self {
            decision,
            charged,
            taken_at,
            open: decision.is_allowed(),
            id: 0,
            origin: (limiter, key),
        }
    }

    /// Whether a settle on `limiter` for the key whose hash is `key` may settle this ticket
    /// ([`issue`](Ticket::issue)): a ticket taken elsewhere is
    /// [`QuotaError::TicketFromOtherLimiter`] or [`QuotaError::TicketForOtherKey`], and a settle
    /// that gets one changes nothing.
    pub fn check_origin(&self, limiter: u64, key: u64) -> Result<(), QuotaError> {
        if self.origin.0 != limiter {
            Err(QuotaError::TicketFromOtherLimiter)
        } else if self.origin.1 != key {
            Err(QuotaError::TicketForOtherKey)
        } else {
            Ok(())
        }
    }

    /// The ticket with a reservation id (Redis).
    #[cfg(feature = "redis")]
    pub(crate) fn with_id(mut self, id: u128) -> Self {
        self.id = id;
        self
    }

    /// The reservation id (0 in memory).
    #[cfg(feature = "redis")]
    pub(crate) fn id(&self) -> u128 {
        self.id
    }

    /// The decision on the provisional cost.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The provisional cost the ticket was taken for.
    pub fn charged(&self) -> u64 {
        self.charged
    }

    /// When the ticket was taken, in nanoseconds of the limiter's clock.
    pub fn taken_at(&self) -> u64 {
        self.taken_at
    }

    /// Whether the ticket still has a settle to make: admitted and not yet settled.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Closes the ticket, the last step of a settle (after
    /// [`check_origin`](Ticket::check_origin) and whatever else may refuse it, which leaves the
    /// ticket open): `Some((taken_at, charged))` if it was open, the settle's to make; `None`
    /// if it was settled already or denied, and a settle then changes nothing.
    pub fn close(&mut self) -> Option<(u64, u64)> {
        std::mem::replace(&mut self.open, false).then_some((self.taken_at, self.charged))
    }
}
