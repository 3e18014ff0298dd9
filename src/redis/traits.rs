//! The crate's traits for the Redis limiters: the error kind of [`BackendError`] and the tower
//! layer's `AdvertisedQuota` for both clients. `AsyncRedisLimiter`'s `AsyncRateLimiter<str>`
//! is in `aio.rs`. The sync `RedisLimiter` is a [`RateLimiter`](crate::RateLimiter) (its impl
//! is in `blocking.rs`) but not [`NonBlocking`](crate::NonBlocking), so it is no
//! `AsyncRateLimiter` (only `NonBlocking` limiters are one at no cost, and the tower layer
//! takes those): each of its decisions is a blocking round trip. Only the limiters' public API
//! is used here.

use super::BackendError;
#[cfg(feature = "http")]
use super::{RedisAlgorithm, RedisLimiter};
use crate::error::CostError;
use crate::limiter::LimiterError;

/// A backend failure is not the request's fault; a cost error is.
impl LimiterError for BackendError {
    fn cost_error(&self) -> Option<CostError> {
        match self {
            BackendError::Cost(e) => Some(*e),
            _ => None,
        }
    }
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
