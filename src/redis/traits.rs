//! The crate's limiter traits for the Redis limiters: [`RateLimiter<str>`](crate::RateLimiter) for the sync
//! [`RedisLimiter`] (and so `AsyncRateLimiter<str>` through the blanket impl, blocking), the
//! error kind of [`BackendError`], and the tower layer's `AdvertisedQuota` for both clients.
//! `AsyncRedisLimiter`'s `AsyncRateLimiter<str>` is beside it, in `aio.rs`. Only the
//! limiters' public API is used here.

use super::{BackendError, RedisAlgorithm, RedisLimiter};
use crate::error::CostError;
use crate::limiter::{rate_limiter_by_inherent, LimiterError};

/// A backend failure is not the request's fault; a cost error is.
impl LimiterError for BackendError {
    fn cost_error(&self) -> Option<CostError> {
        match self {
            BackendError::Cost(e) => Some(*e),
            _ => None,
        }
    }
}

rate_limiter_by_inherent! {
    /// The sync client as a [`RateLimiter<str>`](crate::RateLimiter): decisions through [`RedisLimiter::check_n`]
    /// (the [`FailMode`](super::FailMode) answering outages, a denial any other backend error).
    /// Every call is a blocking round trip, so through the blanket
    /// [`AsyncRateLimiter`](crate::AsyncRateLimiter) impl it blocks the async task that awaits
    /// it: in an async server use `AsyncRedisLimiter` (feature `redis-async`).
    ///
    /// The keys live in Redis, which expires them itself: [`len`](crate::RateLimiter::len) is 0 and
    /// [`sweep`](crate::RateLimiter::sweep) does nothing.
    impl[A: RedisAlgorithm] RateLimiter<str> for RedisLimiter<A> { stateless, batches }
}

#[cfg(feature = "http")]
mod quota {
    use super::*;
    use crate::headers::{AdvertisedQuota, QuotaPolicy};

    /// The algorithm's quota, as the in-memory limiters advertise it.
    impl<A: RedisAlgorithm + AdvertisedQuota> AdvertisedQuota for RedisLimiter<A> {
        fn advertised_quota(&self) -> Option<QuotaPolicy> {
            self.algorithm().advertised_quota()
        }
    }

    /// The algorithm's quota, as the in-memory limiters advertise it.
    #[cfg(feature = "redis-async")]
    impl<A: RedisAlgorithm + AdvertisedQuota> AdvertisedQuota for super::super::AsyncRedisLimiter<A> {
        fn advertised_quota(&self) -> Option<QuotaPolicy> {
            self.algorithm().advertised_quota()
        }
    }
}
