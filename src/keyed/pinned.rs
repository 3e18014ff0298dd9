//! [`Pinned`]: a [`KeyedLimiter`](crate::KeyedLimiter) pinned for a batch of checks, its
//! map's epoch guard held across them.

use super::Shared;
use crate::algo::Algorithm;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::CostError;
use crate::limiter::Variant;
use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

/// A [`KeyedLimiter`](crate::KeyedLimiter) pinned for a batch of checks; see [`Limiter::pin`](crate::Limiter::pin)(crate::Limiter::pin).
pub struct Pinned<'l, K, A: Algorithm, C, V: Variant<A>> {
    pub(crate) shared: &'l Shared<K, A, C, V>,
    pub(crate) guard: papaya::LocalGuard<'l>,
}

impl<K, A, C, V> Pinned<'_, K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// Decides a request of cost 1 for `key`, as [`Limiter::check`](crate::Limiter::check)(crate::Limiter::check).
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.shared.core.clock.now();
        self.shared.decide_pinned(key, 1, now, &self.guard)
    }

    /// Decides a request of `cost` for `key`, as [`Limiter::check_n`](crate::Limiter::check_n)(crate::Limiter::check_n).
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.shared.core.cost(cost)?;
        let now = self.shared.core.clock.now();
        Ok(self.shared.decide_pinned(key, cost, now, &self.guard))
    }

    /// As [`Limiter::peek`](crate::Limiter::peek)(crate::Limiter::peek).
    #[inline]
    pub fn peek<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.shared.core.clock.now();
        self.shared.peek(key, 1, now, &self.guard)
    }
}

impl<K, A: Algorithm, C, V: Variant<A>> fmt::Debug for Pinned<'_, K, A, C, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pinned").finish_non_exhaustive()
    }
}
