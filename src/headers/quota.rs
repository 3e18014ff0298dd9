//! The quota advertised in the headers.

#[cfg(doc)]
use super::RateLimitHeaders;
use crate::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, InFlight, SlidingLog, SlidingWindow,
    SubWindow,
};

use crate::limiter::RateLimiter;
use crate::live::Live;
use crate::ops::{Limiter, Store};
use std::fmt;
use std::time::Duration;

/// A quota policy as `RateLimit-Policy` advertises it: `quota` units per `window` whole
/// seconds, under a name (default `"default"`), with an optional burst.
///
/// The draft's windows are whole seconds, so a limiter's rate is advertised as the most units
/// it sustains over a short whole-second window ([`QuotaPolicy::rate`]): `100/s` is
/// `q=100;w=1`, `100/min` is `q=100;w=60`. A client that spaces its requests `w/q` seconds
/// apart gets the whole rate. The burst, which the draft has no parameter for, goes out as the
/// vendor parameter `hotlimit-burst` (the draft asks for vendor-prefixed extra parameters).
///
/// # Examples
///
/// ```
/// use hotlimit::headers::QuotaPolicy;
/// use std::time::Duration;
///
/// let p = QuotaPolicy::new(100, Duration::from_secs(60)).named("per-minute")?;
/// assert_eq!(p.to_string(), r#""per-minute";q=100;w=60"#);
/// // The draft has no sub-second windows: a window is rounded up to whole seconds.
/// assert_eq!(QuotaPolicy::new(5, Duration::from_millis(500)).to_string(), r#""default";q=5;w=1"#);
/// // A rate goes out over a round whole-second window that carries it: 10 per 500 ms is 20
/// // per second, 1 per 1.5 s is 40 per minute.
/// assert_eq!(QuotaPolicy::rate(10, Duration::from_millis(500)).to_string(), r#""default";q=20;w=1"#);
/// assert_eq!(QuotaPolicy::rate(1, Duration::from_millis(1500)).with_burst(6).to_string(),
///     r#""default";q=40;w=60;hotlimit-burst=6"#);
/// # Ok::<(), hotlimit::headers::InvalidPolicyName>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaPolicy {
    name: &'static str,
    quota: u64,
    window_secs: u64,
    burst: Option<u64>,
    /// Nanoseconds per unit returned, when quota comes back one unit at a time (GCRA): the
    /// time to the next unit is then exact. 0: unknown.
    refill_ns: u64,
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// Whole-second windows tried by [`QuotaPolicy::rate`]: the round ones first, then (after
/// the period's own) the others.
const WINDOWS: [u64; 14] = [
    1, 60, 3600, 86_400, 2, 5, 10, 15, 20, 30, 120, 300, 600, 1800,
];

impl QuotaPolicy {
    /// `quota` units per `window` (rounded up to whole seconds, at least 1), named `"default"`.
    pub fn new(quota: u64, window: Duration) -> Self {
        Self {
            name: "default",
            quota,
            window_secs: ceil_secs(window).max(1),
            burst: None,
            refill_ns: 0,
        }
    }

    /// The rate `count` per `period` as a quota over a whole-second window `w`, with
    /// `q = ⌊w · count / period⌋`: the first of 1 s, 1 min, 1 h, 1 day, `period` (rounded up),
    /// 2, 5, 10, 15, 20, 30 s, 2, 5, 10, 30 min that carries the rate exactly; else the
    /// shortest of them that carries at least 99 % of it; else the one closest to it. Never
    /// more than the rate, so a client pacing itself by `q/w` is never ahead of the limiter.
    pub fn rate(count: u64, period: Duration) -> Self {
        let period_ns = period.as_nanos().max(1);
        // Saturating: a period of centuries and a count near u64::MAX overflow even u128
        // (a saturated product only ever lowers the units, never above the rate).
        let wanted = |w: u64| {
            u128::from(w)
                .saturating_mul(1_000_000_000)
                .saturating_mul(u128::from(count))
        };
        let units = |w: u64| u64::try_from(wanted(w) / period_ns).unwrap_or(u64::MAX);
        let own = ceil_secs(period).max(1);
        let mut windows = [own; WINDOWS.len() + 1];
        windows[..4].copy_from_slice(&WINDOWS[..4]);
        windows[5..].copy_from_slice(&WINDOWS[4..]);
        let exact = windows.iter().copied().find(|&w| {
            units(w) > 0 && wanted(w) < u128::MAX && u128::from(units(w)) * period_ns == wanted(w)
        });
        let mut by_length = windows;
        by_length.sort_unstable();
        // q · period ≥ 0.99 · w · count · 1e9, without division.
        let close = || {
            by_length.iter().copied().find(|&w| {
                units(w) > 0
                    && (u128::from(units(w)) * period_ns).saturating_mul(100)
                        >= wanted(w).saturating_mul(99)
            })
        };
        // The largest share q/w of the rate (`own` carries at least `count` per `own`).
        let closest = || {
            by_length.iter().copied().fold(own, |best, w| {
                let wins = u128::from(units(w)) * u128::from(best)
                    > u128::from(units(best)) * u128::from(w);
                if wins {
                    w
                } else {
                    best
                }
            })
        };
        let w = exact.or_else(close).unwrap_or_else(closest);
        Self {
            name: "default",
            quota: units(w),
            window_secs: w,
            burst: None,
            refill_ns: 0,
        }
    }

    /// The same policy with a burst: the most units a client can spend at once, advertised as
    /// the vendor parameter `hotlimit-burst` (`burst` in draft 07's syntax).
    pub fn with_burst(self, burst: u64) -> Self {
        Self {
            burst: Some(burst),
            ..self
        }
    }

    /// The same policy, with quota coming back one unit every `interval` (GCRA's emission
    /// interval): the `RateLimit` field's `t` is then the time to the next unit, exactly,
    /// instead of the time until the quota is whole again.
    pub fn refilling_every(self, interval: Duration) -> Self {
        Self {
            refill_ns: u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
            ..self
        }
    }

    /// The same policy under `name`: printable ASCII without `"` or `\` (it goes out as a
    /// structured-field string).
    pub fn named(self, name: &'static str) -> Result<Self, InvalidPolicyName> {
        if name
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
        {
            Ok(Self { name, ..self })
        } else {
            Err(InvalidPolicyName(name))
        }
    }

    /// The policy's name (`"default"` unless [`named`](Self::named)).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The quota per window, in the limiter's units.
    pub(crate) fn quota(&self) -> u64 {
        self.quota
    }

    /// The window in whole seconds.
    pub(crate) fn window_secs(&self) -> u64 {
        self.window_secs
    }

    /// The burst, if advertised.
    pub(crate) fn burst(&self) -> Option<u64> {
        self.burst
    }

    /// The time one unit takes to come back, if quota comes back one unit at a time.
    pub(crate) fn refill_interval(&self) -> Option<Duration> {
        (self.refill_ns > 0).then(|| Duration::from_nanos(self.refill_ns))
    }
}

impl fmt::Display for QuotaPolicy {
    /// The `RateLimit-Policy` item of the newest draft ([`Draft::Ietf10`](super::Draft)).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "\"{}\";q={};w={}",
            self.name, self.quota, self.window_secs
        )?;
        match self.burst {
            Some(b) => write!(f, ";hotlimit-burst={b}"),
            None => Ok(()),
        }
    }
}

/// A policy name that cannot go into a structured-field string; see [`QuotaPolicy::named`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidPolicyName(pub &'static str);

impl fmt::Display for InvalidPolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid rate-limit policy name {:?}: use printable ASCII without '\"' or '\\'",
            self.0
        )
    }
}

impl std::error::Error for InvalidPolicyName {}

/// What a limiter or algorithm advertises in `RateLimit-Policy` and `X-RateLimit-Limit`:
/// the tower layer's builder and [`RateLimitHeaders::for_limiter`] read it from the limiter.
///
/// Each advertises the rate it sustains, as a quota over a whole-second window
/// ([`QuotaPolicy::rate`]), so that a client pacing itself by the policy gets all of it:
///
/// | algorithm | policy | burst | `t` (draft 10) |
/// |---|---|---|---|
/// | [`Gcra`] | one unit per emission interval | the burst | the time to the next unit |
/// | [`FixedWindow`], [`SlidingWindow`], [`SlidingLog`], [`SubWindow`] | the limit per window | | the time until the window is fresh (the fixed window: its end, exact) |
/// | [`Exponential`] | the limit (rounded down) per period | | the time until the rate is back under the limit |
/// | [`Earrrl`] | none: a decaying average has no quota window | | |
///
/// Override with the layer's `headers` or [`RateLimitHeaders::new`].
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::{FixedWindow, Gcra}, headers::{AdvertisedQuota, QuotaPolicy}};
/// use std::time::Duration;
///
/// let g: Gcra = "100/min burst 10".parse()?;
/// let p = g.advertised_quota().unwrap();
/// assert_eq!(p.to_string(), r#""default";q=100;w=60;hotlimit-burst=10"#);
/// let w = FixedWindow::new(1000, Duration::from_secs(3600))?;
/// assert_eq!(w.advertised_quota(), Some(QuotaPolicy::new(1000, Duration::from_secs(3600))));
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait AdvertisedQuota {
    /// The policy to advertise, if there is one.
    fn advertised_quota(&self) -> Option<QuotaPolicy>;
}

impl AdvertisedQuota for Gcra {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        let t = self.emission_interval();
        Some(
            QuotaPolicy::rate(1, t)
                .with_burst(crate::algo::Algorithm::capacity(self))
                .refilling_every(t),
        )
    }
}

/// The window algorithms advertise their limit per window; a sub-second window, the same rate
/// over a whole-second one.
macro_rules! window_quota {
    ($($t:ty),*) => {$(
        impl AdvertisedQuota for $t {
            fn advertised_quota(&self) -> Option<QuotaPolicy> {
                let (limit, window) = (crate::algo::Algorithm::capacity(self), self.window());
                Some(if window.subsec_nanos() == 0 {
                    QuotaPolicy::new(limit, window)
                } else {
                    QuotaPolicy::rate(limit, window)
                })
            }
        }
    )*};
}
window_quota!(FixedWindow, SlidingWindow, SlidingLog, SubWindow);

impl AdvertisedQuota for Exponential {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        // `as` saturates; the limit is finite and positive (validated).
        Some(QuotaPolicy::rate(self.limit() as u64, self.period()))
    }
}

impl AdvertisedQuota for Earrrl {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        None
    }
}

/// A concurrency limit is no rate: nothing to advertise.
impl AdvertisedQuota for InFlight {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        None
    }
}

/// Every in-memory limiter advertises its algorithm's quota.
impl<S: Store> AdvertisedQuota for Limiter<S>
where
    S::Algo: AdvertisedQuota,
{
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        self.algorithm().advertised_quota()
    }
}

/// A live configuration advertises the one in force.
impl<A: Algorithm + Copy + AdvertisedQuota> AdvertisedQuota for Live<A> {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        self.get().advertised_quota()
    }
}

/// A `dyn` limiter advertises nothing; set the policy with the layer's `headers` or
/// [`RateLimitHeaders::new`].
impl AdvertisedQuota for dyn RateLimiter<str> {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CasLimiter, CompactLimiter};

    #[test]
    fn policy_names_are_checked() {
        let q = QuotaPolicy::new(1, Duration::from_secs(1));
        assert!(q.named("per-user 2").is_ok());
        assert_eq!(q.named("a\"b"), Err(InvalidPolicyName("a\"b")));
        assert!(q.named("tab\t").is_err());
        assert!(q.named("é").is_err());
    }

    /// `q` per `w` and its share of `count` per `period`.
    fn policy(count: u64, period: Duration) -> (u64, u64) {
        let p = QuotaPolicy::rate(count, period);
        (p.quota(), p.window_secs())
    }

    // Pins G58.
    #[test]
    fn a_rate_goes_out_over_the_shortest_whole_second_window_that_carries_it() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(policy(100, s(1)), (100, 1));
        assert_eq!(policy(1, ms(10)), (100, 1)); // GCRA 100/s: T = 10 ms
        assert_eq!(policy(1, ms(600)), (100, 60)); // 100/min: 1 per 600 ms
        assert_eq!(policy(1, Duration::from_nanos(333_333_333)), (3, 1)); // 3/s, T rounded
        assert_eq!(policy(1, ms(1500)), (40, 60)); // 40/min
        assert_eq!(policy(7, s(7)), (1, 1));
        assert_eq!(policy(1, s(12)), (5, 60)); // 5/min
        assert_eq!(policy(1, s(7)), (1, 7)); // no shorter window holds a whole unit
        assert_eq!(policy(1000, s(3600)), (1000, 3600));
        assert_eq!(policy(5, s(2 * 86_400)), (5, 172_800));
        assert_eq!(policy(100, ms(100)), (1000, 1));
        // 1 per 1.01 s: no window carries it exactly; 59 per minute is 99.3 % of it.
        assert_eq!(policy(1, ms(1010)), (59, 60));
        assert_eq!(policy(10, ms(500)), (20, 1));
        // Never more than the rate: q · period ≤ w · count.
        for (count, period) in [
            (1, ms(1010)),
            (3, ms(7)),
            (13, s(17)),
            (1, Duration::from_nanos(1)),
        ] {
            let (q, w) = policy(count, period);
            assert!(
                u128::from(q) * period.as_nanos()
                    <= u128::from(w) * 1_000_000_000 * u128::from(count)
            );
        }
        // Extremes: no overflow (they panicked in debug builds, and wrapped to a window of
        // 1 s: a quota per second for one per 584 years), never more than the rate.
        assert_eq!(QuotaPolicy::new(1, Duration::MAX).window_secs, u64::MAX);
        let (q, w) = policy(u64::MAX, Duration::from_nanos(u64::MAX - 1));
        assert!(
            w >= 1
                && u128::from(q) * u128::from(u64::MAX - 1)
                    <= u128::from(w) * 1_000_000_000 * u128::from(u64::MAX)
        );
        let (q, w) = policy(1, Duration::MAX);
        assert!(u128::from(q) * Duration::MAX.as_nanos() <= u128::from(w) * 1_000_000_000);
    }

    // Pins G58.
    #[test]
    fn every_store_and_a_live_configuration_advertise_their_quota() {
        use crate::ManualClock;
        let g: Gcra = "10/s burst 5".parse().unwrap();
        let policy = QuotaPolicy::rate(10, Duration::from_secs(1))
            .with_burst(5)
            .refilling_every(Duration::from_millis(100));
        assert_eq!(policy.to_string(), r#""default";q=10;w=1;hotlimit-burst=5"#);
        let want = Some(policy);
        let live = Live::new(g);
        assert_eq!(live.advertised_quota(), want);
        live.switch("20/s burst 5".parse().unwrap(), || 0).unwrap();
        assert_eq!(
            live.advertised_quota().map(|p| p.to_string()),
            Some(r#""default";q=20;w=1;hotlimit-burst=5"#.to_owned())
        );
        let keyed = CasLimiter::<String, Gcra, _>::with_clock(g, ManualClock::default());
        assert_eq!(keyed.advertised_quota(), want);
        let compact = CompactLimiter::<crate::store::Hashed<str>, Gcra, _>::with_clock(
            g,
            ManualClock::default(),
        );
        assert_eq!(compact.advertised_quota(), want);
    }
}
