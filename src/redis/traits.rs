//! The crate's limiter traits for the Redis limiters: [`RateLimiter<str>`] for the sync
//! [`RedisLimiter`] (and so [`AsyncRateLimiter<str>`] through the blanket impl, blocking),
//! [`AsyncRateLimiter<str>`] for [`AsyncRedisLimiter`], and the tower layer's
//! `AdvertisedQuota` for both. Only the limiters' public API is used here.

#[cfg(feature = "redis-async")]
use super::AsyncRedisLimiter;
use super::{BackendError, RedisAlgorithm, RedisLimiter};
use crate::decision::Decision;
use crate::error::CostError;
use crate::limiter::{LimiterError, RateLimiter};
use crate::sweeper::SweepReport;
#[cfg(feature = "redis-async")]
use crate::AsyncRateLimiter;
#[cfg(feature = "redis-async")]
use std::future::Future;
#[cfg(feature = "redis-async")]
use std::pin::Pin;
use std::time::Duration;

/// A backend failure is not the request's fault; a cost error is.
impl LimiterError for BackendError {
    fn cost_error(&self) -> Option<CostError> {
        match self {
            BackendError::Cost(e) => Some(*e),
            _ => None,
        }
    }
}

/// The sync client as a [`RateLimiter<str>`]: decisions through [`RedisLimiter::check_n`]
/// (the [`FailMode`](super::FailMode) answering backend failures). Every call is a blocking
/// round trip, so through the blanket [`AsyncRateLimiter`](crate::AsyncRateLimiter) impl it
/// blocks the async task that awaits it: in an async server use [`AsyncRedisLimiter`]
/// (feature `redis-async`).
///
/// The keys live in Redis, which expires them itself: [`len`](RateLimiter::len) is 0 and
/// [`sweep`](RateLimiter::sweep) does nothing.
impl<A: RedisAlgorithm> RateLimiter<str> for RedisLimiter<A> {
    fn check_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        RedisLimiter::check_n(self, key, cost)
    }

    fn check(&self, key: &str) -> Decision {
        RedisLimiter::check(self, key)
    }

    /// A backend failure answers the fail mode, without counting it in
    /// [`failures`](RedisLimiter::failures).
    fn peek_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        match self.try_peek_n(key, cost) {
            Ok(d) => Ok(d),
            Err(BackendError::Cost(e)) => Err(e),
            Err(_) => Ok(self.fail_mode().decision()),
        }
    }

    fn peek(&self, key: &str) -> Decision {
        RedisLimiter::peek(self, key)
    }

    /// Sleeps the thread for each denial's `retry_after` and asks again: other instances may
    /// take the freed quota first, so it may wait more than once.
    fn until_ready_blocking(&self, key: &str) -> Decision {
        loop {
            let d = RedisLimiter::check(self, key);
            if d.is_allowed() {
                return d;
            }
            // At least 1 ms, so a zero wait cannot spin on the server.
            std::thread::sleep(d.retry_after().max(Duration::from_millis(1)));
        }
    }

    /// 0: the keys are held by Redis, not here.
    fn len(&self) -> usize {
        0
    }

    /// Nothing to sweep: Redis expires each key when its state is fresh again.
    fn sweep(&self) -> SweepReport {
        SweepReport::default()
    }
}

/// The decision of [`AsyncRedisLimiter::check_n`]: backend failures answer the
/// [`FailMode`](super::FailMode) (and count in [`failures`](AsyncRedisLimiter::failures)); the
/// error is the cost error. The future owns a clone of the limiter and the key.
#[cfg(feature = "redis-async")]
impl<A: RedisAlgorithm> AsyncRateLimiter<str> for AsyncRedisLimiter<A> {
    type Error = BackendError;
    // Boxed: an `async` block has no name, and next to a round trip the box costs nothing.
    type Future = Pin<Box<dyn Future<Output = Result<Decision, BackendError>> + Send>>;

    fn check_n_async(&self, key: &str, cost: u64) -> Self::Future {
        let limiter = self.clone();
        let key = key.to_owned();
        Box::pin(async move {
            AsyncRedisLimiter::check_n(&limiter, &key, cost)
                .await
                .map_err(BackendError::Cost)
        })
    }
}

#[cfg(feature = "tower")]
mod quota {
    use super::*;
    use crate::tower::{AdvertisedQuota, QuotaPolicy};

    /// The algorithm's quota, as the in-memory limiters advertise it.
    impl<A: RedisAlgorithm + AdvertisedQuota> AdvertisedQuota for RedisLimiter<A> {
        fn advertised_quota(&self) -> Option<QuotaPolicy> {
            self.algorithm().advertised_quota()
        }
    }

    /// The algorithm's quota, as the in-memory limiters advertise it.
    #[cfg(feature = "redis-async")]
    impl<A: RedisAlgorithm + AdvertisedQuota> AdvertisedQuota for AsyncRedisLimiter<A> {
        fn advertised_quota(&self) -> Option<QuotaPolicy> {
            self.algorithm().advertised_quota()
        }
    }
}
