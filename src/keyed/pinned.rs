//! [`Pinned`]: the papaya [`Map`](super::Map) pinned for a batch of requests, its epoch guard
//! held across them: a store of its own, so a pinned limiter offers the checks and batches
//! (`check`, `check_n`, `check_batch`, `check_n_batch`); the guard is not `Sync`, so it has no
//! `request` (peek, partial grant, take, settle, waits).

use super::costs::At;
use super::Shared;
use crate::algo::Algorithm;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::Variant;
use crate::ops::sealed::{Lookup, Table};
use crate::shared::{Core, KeyState};
use crate::sweeper::SweepReport;
use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

/// A [`Map`](super::Map) pinned for a batch of requests from one thread; see
/// [`Limiter::pin`](crate::Limiter::pin). Neither `Send` nor `Sync`: a pinned limiter has
/// the checks and batches, not `request`.
pub struct Pinned<'l, K, A: Algorithm, C, V: Variant<A>> {
    pub(crate) shared: &'l Shared<K, A, C, V>,
    pub(crate) guard: papaya::LocalGuard<'l>,
}

impl<K, A, C, V> Table for Pinned<'_, K, A, C, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    type Algo = A;
    type Clock = C;

    #[inline(always)]
    fn core(&self) -> &Core<A, C> {
        &self.shared.core
    }

    fn keys(&self) -> usize {
        self.shared.map.len()
    }

    fn sweep(&self) -> SweepReport {
        self.shared.sweep()
    }
}

impl<'l, K, A, C, V, Q> Lookup<Q> for Pinned<'l, K, A, C, V>
where
    K: Hash + Eq + Send + Sync + Borrow<Q> + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    type At<'a>
        = PinnedAt<'a, 'l, K, A, C, V, Q>
    where
        Self: 'a,
        Q: 'a;

    #[inline(always)]
    fn at<'a>(&'a self, key: &'a Q) -> Self::At<'a> {
        PinnedAt(At(self.shared, key), &self.guard)
    }

    #[inline(always)]
    fn decide(&self, algo: &A, key: &Q, cost: u64, now: u64) -> Decision {
        self.shared
            .apply(key, &self.guard, |state| algo.update(state, now, cost))
    }

    #[inline]
    fn peek(&self, algo: &A, key: &Q, cost: u64, now: u64) -> Decision {
        self.shared.peek(algo, key, cost, now, &self.guard)
    }
}

/// A key of a pinned map: [`At`] through the held guard.
// Not `Debug`: a handle that lives inside one request, never shown.
#[allow(missing_debug_implementations)]
pub struct PinnedAt<'a, 'l, K, A: Algorithm, C, V: Variant<A>, Q: ?Sized>(
    At<'a, Shared<K, A, C, V>, Q>,
    &'a papaya::LocalGuard<'l>,
);

impl<K, A, C, V, Q> KeyState<A::State> for PinnedAt<'_, '_, K, A, C, V, Q>
where
    K: Hash + Eq + Send + Sync + Borrow<Q>,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    #[inline(always)]
    fn apply<T>(&self, f: impl FnMut(&mut A::State) -> T) -> T {
        self.0 .0.apply(self.0 .1, self.1, f)
    }

    fn key_print(&self) -> u64 {
        self.0.key_print()
    }
}

impl<K, A: Algorithm, C, V: Variant<A>> fmt::Debug for Pinned<'_, K, A, C, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pinned").finish_non_exhaustive()
    }
}
