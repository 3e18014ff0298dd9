//! Plans: a quota per request, picked from the request, decided and advertised by the layer.

use super::AdvertisedQuota;
use hotlimit::headers::QuotaPolicy;
use hotlimit::store::Keys;
use hotlimit::Requests;
use hotlimit::{AsyncRateLimiter, ConfigError, Limiter, QuotaError};
use http::request::Parts;
use std::fmt;
use std::future::{ready, Ready};

/// A limiter that decides a request under a quota given with it, for
/// [`LayerBuilder::plans`](super::LayerBuilder::plans): the in-memory keyed limiters
/// ([`CasLimiter`](hotlimit::CasLimiter), [`MutexLimiter`](hotlimit::MutexLimiter), by
/// [`Request::quota`](hotlimit::Request::quota)) and, with this crate's `redis` feature,
/// `AsyncRedisLimiter` (by its `try_check_n_with`).
pub trait PlanLimiter: AsyncRateLimiter<str> {
    /// A quota: the limiter's algorithm, configured per plan.
    type Quota: AdvertisedQuota + Send + Sync + 'static;

    /// Decides a request of `cost` for `key` under `quota` (an in-memory limiter's future is
    /// ready at once); the [`ConfigError`] of a quota that cannot read the limiter's states
    /// ([`Algorithm::check_quota`](hotlimit::algo::Algorithm::check_quota)).
    fn check_n_with(
        &self,
        key: &str,
        cost: u64,
        quota: &Self::Quota,
    ) -> Result<Self::Future, ConfigError>;
}

impl<S: Keys<str>> PlanLimiter for Limiter<S>
where
    S::Algo: AdvertisedQuota + Send + Sync,
{
    type Quota = S::Algo;

    #[inline]
    fn check_n_with(
        &self,
        key: &str,
        cost: u64,
        quota: &S::Algo,
    ) -> Result<Ready<Result<hotlimit::Decision, hotlimit::QuotaError>>, ConfigError> {
        match self.request(key).quota(quota).cost(cost).check() {
            Ok(decision) => Ok(ready(Ok(decision))),
            Err(e @ (QuotaError::ZeroCost | QuotaError::ExceedsCapacity { .. })) => {
                Ok(ready(Err(e)))
            }
            Err(QuotaError::Quota(e)) => Err(*e),
            Err(other) => unreachable!("a check takes no ticket and has no backend: {other}"),
        }
    }
}

/// Plans over Redis: the request's quota in the script's parameters, on the same keys; the
/// fail mode answers an outage, as for `check_n`.
#[cfg(feature = "redis")]
impl<A> PlanLimiter for hotlimit::redis::AsyncRedisLimiter<A>
where
    A: hotlimit::redis::RedisAlgorithm + Copy + AdvertisedQuota + Send + Sync + 'static,
{
    type Quota = A;

    fn check_n_with(&self, key: &str, cost: u64, quota: &A) -> Result<Self::Future, ConfigError> {
        hotlimit::algo::Algorithm::check_quota(self.algorithm(), quota)?;
        let (limiter, key, quota) = (self.clone(), key.to_owned(), *quota);
        Ok(Box::pin(async move {
            let r = limiter.request(&key).cost(cost).quota(&quota).check().await;
            limiter.fail_over(r)
        }))
    }
}

/// What a [`RequestPlan`] starts: the limiter's decision to come (or the [`ConfigError`] of a
/// quota it cannot run) and the policy to advertise for the request.
#[derive(Debug)]
pub struct Planned<F> {
    pub(super) started: Result<F, ConfigError>,
    /// `None`: the layer's own policy; `Some(None)`: none.
    pub(super) policy: Option<Option<QuotaPolicy>>,
}

/// How the layer picks a request's quota: [`NoPlans`] (the limiter's own, the default) or
/// [`Plans`] (a function of the request, from
/// [`LayerBuilder::plans`](super::LayerBuilder::plans)); only these two implement it.
pub trait RequestPlan<L: AsyncRateLimiter<str> + ?Sized>: Send + Sync + 'static {
    /// Starts deciding the request `parts` of `cost` for `key`, under the quota the plan
    /// picks.
    fn start(&self, limiter: &L, parts: &Parts, key: &str, cost: u64) -> Planned<L::Future>;
}

/// Every request under the limiter's own quota: the default [`RequestPlan`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPlans;

impl<L: AsyncRateLimiter<str> + ?Sized> RequestPlan<L> for NoPlans {
    #[inline(always)]
    fn start(&self, limiter: &L, _: &Parts, key: &str, cost: u64) -> Planned<L::Future> {
        Planned {
            started: Ok(limiter.check_n_async(key, cost)),
            policy: None,
        }
    }
}

/// A quota per request, from a function of its head and key (an API key's plan, a tenant's
/// contract): from [`LayerBuilder::plans`](super::LayerBuilder::plans). `None` from the
/// function: the limiter's own quota.
pub struct Plans<F> {
    pick: F,
}

impl<F> Plans<F> {
    pub(super) fn new(pick: F) -> Self {
        Plans { pick }
    }
}

impl<F> fmt::Debug for Plans<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plans").finish_non_exhaustive()
    }
}

impl<L, F> RequestPlan<L> for Plans<F>
where
    L: PlanLimiter + ?Sized,
    F: Fn(&Parts, &str) -> Option<L::Quota> + Send + Sync + 'static,
{
    #[inline]
    fn start(&self, limiter: &L, parts: &Parts, key: &str, cost: u64) -> Planned<L::Future> {
        let Some(quota) = (self.pick)(parts, key) else {
            return NoPlans.start(limiter, parts, key, cost);
        };
        Planned {
            started: limiter.check_n_with(key, cost, &quota),
            policy: Some(quota.advertised_quota()),
        }
    }
}
