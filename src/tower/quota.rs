//! The quota advertised in the headers.

#[cfg(doc)]
use super::{Builder, RateLimitLayer};
use crate::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, Reconfigure, SlidingLog, SlidingWindow,
    SubWindow,
};
use crate::clock::Clock;
use crate::compact::{CompactKey, CompactLimiter, CompactVariant};
use crate::keyed::KeyedLimiter;
use crate::limiter::{RateLimiter, Variant};
use crate::live::Live;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

/// A quota policy as `RateLimit-Policy` advertises it: `quota` units per `window` whole
/// seconds, under a name (default `"default"`).
///
/// # Examples
///
/// ```
/// use hotlimit::tower::QuotaPolicy;
/// use std::time::Duration;
///
/// let p = QuotaPolicy::new(100, Duration::from_secs(60)).named("per-minute")?;
/// assert_eq!(p.to_string(), r#""per-minute";q=100;w=60"#);
/// // The draft has no sub-second windows: a window is rounded up to whole seconds.
/// assert_eq!(QuotaPolicy::new(5, Duration::from_millis(500)).to_string(), r#""default";q=5;w=1"#);
/// # Ok::<(), hotlimit::tower::InvalidPolicyName>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaPolicy {
    name: &'static str,
    quota: u64,
    window_secs: u64,
}

impl QuotaPolicy {
    /// `quota` units per `window` (rounded up to whole seconds, at least 1), named `"default"`.
    pub fn new(quota: u64, window: Duration) -> Self {
        let secs = window.as_secs() + u64::from(window.subsec_nanos() > 0);
        Self {
            name: "default",
            quota,
            window_secs: secs.max(1),
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

    /// The policy's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The quota, in the limiter's units.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// The window in whole seconds.
    pub fn window_secs(&self) -> u64 {
        self.window_secs
    }
}

impl fmt::Display for QuotaPolicy {
    /// The `RateLimit-Policy` field value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "\"{}\";q={};w={}",
            self.name, self.quota, self.window_secs
        )
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
/// [`RateLimitLayer::builder`] reads it from the limiter.
///
/// | algorithm | quota | window |
/// |---|---|---|
/// | [`Gcra`] | the burst | the time to refill it from empty (burst × emission interval) |
/// | [`FixedWindow`], [`SlidingWindow`], [`SlidingLog`], [`SubWindow`] | the limit | the window |
/// | [`Exponential`] | the limit (rounded down) | the period |
/// | [`Earrrl`] | none: a decaying average has no quota window | |
///
/// Windows are rounded up to whole seconds. Override with [`Builder::quota`].
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, tower::{AdvertisedQuota, QuotaPolicy}};
/// use std::time::Duration;
///
/// let g: Gcra = "100/min burst 10".parse()?;
/// assert_eq!(g.advertised_quota(), Some(QuotaPolicy::new(10, Duration::from_secs(6))));
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait AdvertisedQuota {
    /// The policy to advertise, if there is one.
    fn advertised_quota(&self) -> Option<QuotaPolicy>;
}

impl AdvertisedQuota for Gcra {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        // burst × T: the time a drained bucket takes to fill (u128: no overflow).
        let t = self.emission_interval().as_nanos();
        let refill = u64::try_from(t * u128::from(self.burst())).unwrap_or(u64::MAX);
        Some(QuotaPolicy::new(self.burst(), Duration::from_nanos(refill)))
    }
}

/// The window algorithms advertise their limit per window.
macro_rules! window_quota {
    ($($t:ty),*) => {$(
        impl AdvertisedQuota for $t {
            fn advertised_quota(&self) -> Option<QuotaPolicy> {
                Some(QuotaPolicy::new(self.limit(), self.window()))
            }
        }
    )*};
}
window_quota!(FixedWindow, SlidingWindow, SlidingLog, SubWindow);

impl AdvertisedQuota for Exponential {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        // `as` saturates; the limit is finite and positive (validated).
        Some(QuotaPolicy::new(self.limit() as u64, self.period()))
    }
}

impl AdvertisedQuota for Earrrl {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        None
    }
}

impl<K, A, C, V> AdvertisedQuota for KeyedLimiter<K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm + AdvertisedQuota,
    C: Clock,
    V: Variant<A>,
{
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        self.algorithm().advertised_quota()
    }
}

/// A live configuration advertises the one in force.
impl<A: Reconfigure + AdvertisedQuota> AdvertisedQuota for Live<A> {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        self.get().advertised_quota()
    }
}

impl<K, A, C, V> AdvertisedQuota for CompactLimiter<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm + AdvertisedQuota,
    C: Clock,
    V: CompactVariant<A>,
{
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        self.algorithm().advertised_quota()
    }
}

/// A `dyn` limiter advertises nothing; set the policy with [`Builder::quota`].
impl AdvertisedQuota for dyn RateLimiter<str> {
    fn advertised_quota(&self) -> Option<QuotaPolicy> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_are_checked() {
        let q = QuotaPolicy::new(1, Duration::from_secs(1));
        assert!(q.named("per-user 2").is_ok());
        assert_eq!(q.named("a\"b"), Err(InvalidPolicyName("a\"b")));
        assert!(q.named("tab\t").is_err());
        assert!(q.named("é").is_err());
    }

    #[test]
    fn every_store_and_a_live_configuration_advertise_their_quota() {
        use crate::ManualClock;
        let g: Gcra = "10/s burst 5".parse().unwrap();
        let want = Some(QuotaPolicy::new(5, Duration::from_millis(500)));
        let live = Live::new(g);
        assert_eq!(live.advertised_quota(), want);
        live.switch("20/s burst 5".parse().unwrap(), |_| ())
            .unwrap();
        assert_eq!(
            live.advertised_quota(),
            Some(QuotaPolicy::new(5, Duration::from_millis(250)))
        );
        let keyed = KeyedLimiter::<String, Gcra>::with_clock(g, ManualClock::new());
        assert_eq!(keyed.advertised_quota(), want);
        let compact = CompactLimiter::<crate::Hashed<str>, Gcra>::with_clock(g, ManualClock::new());
        assert_eq!(compact.advertised_quota(), want);
    }
}
