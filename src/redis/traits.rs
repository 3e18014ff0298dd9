//! The crate's traits for the Redis limiters: [`BackendError`] into the one
//! [`QuotaError`] (what an `AsyncRateLimiter`'s error converts to) and the tower layer's
//! `AdvertisedQuota` for both clients. `AsyncRedisLimiter`'s `AsyncRateLimiter<str>`
//! is in `aio.rs`. The sync `RedisLimiter` is not a [`RateLimiter`](crate::RateLimiter) (a
//! `RateLimiter` never waits on I/O, and so is an `AsyncRateLimiter` at no cost, which the tower
//! layer takes): each of its decisions is a blocking round trip. It has the same methods,
//! inherent (`blocking.rs`), and is a [`Requests`](crate::Requests). Only the limiters' public API
//! is used here.

use super::BackendError;
#[cfg(feature = "http")]
use super::{RedisAlgorithm, RedisLimiter};
use crate::error::QuotaError;
use std::sync::Arc;

/// A cost error is the request's, and a ticket from elsewhere the caller's: each stays what
/// it is in memory. Every other backend error is the limiter's failure to decide
/// ([`QuotaError::Backend`], holding it).
impl From<BackendError> for QuotaError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::Cost(c) => c,
            BackendError::TicketFromOtherLimiter => QuotaError::TicketFromOtherLimiter,
            BackendError::TicketForOtherKey => QuotaError::TicketForOtherKey,
            e => QuotaError::Backend(Arc::new(e)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::QuotaError;

    /// What the tower layer reads off an async Redis limiter's error: the request's own
    /// faults as in memory, anything else a backend failure that still holds the error.
    #[test]
    fn a_backend_error_converts_to_the_one_error() {
        let cost = QuotaError::ExceedsCapacity {
            cost: 9,
            capacity: 5,
        };
        assert_eq!(QuotaError::from(BackendError::Cost(cost.clone())), cost);
        assert_eq!(
            QuotaError::from(BackendError::TicketForOtherKey),
            QuotaError::TicketForOtherKey
        );
        assert_eq!(
            QuotaError::from(BackendError::TicketFromOtherLimiter),
            QuotaError::TicketFromOtherLimiter
        );
        let QuotaError::Backend(e) = QuotaError::from(BackendError::Unavailable) else {
            panic!("an outage is the backend's failure");
        };
        let inner = e
            .downcast_ref::<BackendError>()
            .expect("the backend's own error");
        assert!(matches!(inner, BackendError::Unavailable) && inner.is_outage());
    }

    /// And back: a backend error that went through the one error comes out as itself (the
    /// same case, the same message), whatever the case; another backend's error, held in a
    /// `QuotaError`, as a reply this client cannot use, its message kept.
    #[test]
    fn the_one_error_converts_back_to_the_backend_error_it_holds() {
        use redis::{ErrorKind, RedisError};
        let cases = [
            BackendError::Unavailable,
            BackendError::OutOfMemory,
            BackendError::TicketForOtherKey,
            BackendError::TicketFromOtherLimiter,
            BackendError::Cost(QuotaError::ZeroCost),
            BackendError::Reply("an unexpected reply".into()),
            BackendError::Connection(RedisError::from((ErrorKind::IoError, "refused"))),
            BackendError::Script(RedisError::from((ErrorKind::NoScriptError, "gone"))),
            BackendError::Spawn(std::io::Error::other("no threads")),
        ];
        for case in cases {
            let text = case.to_string();
            let kind = std::mem::discriminant(&case);
            let back = BackendError::from(QuotaError::from(case));
            assert_eq!(std::mem::discriminant(&back), kind, "{text}");
            assert_eq!(back.to_string(), text);
        }
        let other = std::io::Error::other("another backend's failure");
        let held = QuotaError::Backend(Arc::new(other));
        assert!(matches!(
            BackendError::from(held),
            BackendError::Reply(m) if m == "another backend's failure"
        ));
    }
}
