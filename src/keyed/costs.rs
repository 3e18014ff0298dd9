//! The papaya store's key handle for the core's request paths ([`At`]), and its batches: a
//! batch first locates its keys, then takes on each the step every request takes
//! ([`Shared::apply_found`]).

use super::inline::may_route;
use super::Shared;
use crate::algo::Algorithm;
use crate::batch;
use crate::clock::Clock;
use crate::compact::At as CompactAt;
use crate::decision::Decision;
use crate::error::QuotaError;
use crate::limiter::Variant;
use crate::shared::KeyState;
use std::borrow::Borrow;
use std::hash::Hash;

/// `key`'s state in a [`Map`](super::Map): what the request paths of
/// [`Core`](crate::shared::Core) run their step on. In the papaya map, the key itself (looked
/// up at each step); in a compact table, its slot located once.
// Not `Debug`: a handle that lives inside one request, never shown.
#[allow(missing_debug_implementations)]
pub enum At<'a, K, A: Algorithm, C: Clock, V: Variant<A>, Q: ?Sized> {
    /// The papaya map and the key.
    Papaya(&'a Shared<K, A, C, V>, &'a Q),
    /// A key's 64-bit form in its compact table.
    Compact(CompactAt<'a, u64, A, C, V>),
}

impl<K, A, C, V, Q> KeyState<A::State> for At<'_, K, A, C, V, Q>
where
    K: Hash + Eq + Send + Sync + Borrow<Q>,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    #[inline(always)]
    fn apply<T>(&self, mut f: impl FnMut(&mut A::State) -> T) -> T {
        match self {
            At::Papaya(sh, key) => sh.apply(*key, &sh.map.guard(), f),
            At::Compact(at) if const { may_route::<K, A::State>() } => at.apply(f),
            // Never run (see `Route`): a fresh state, in no table.
            At::Compact(at) => f(&mut at.algo().fresh()),
        }
    }

    fn key_print(&self) -> u64 {
        match self {
            At::Papaya(_, key) => crate::shared::key_print(*key),
            At::Compact(at) => at.key_print(),
        }
    }
}

impl<K, A, C, V> Shared<K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// A batch through [`batch::in_chunks`]: a chunk's cells looked up (absent keys are not
    /// inserted yet), then each request decided from its cell by
    /// [`apply_found`](Shared::apply_found), which looks again for a key absent at the
    /// look-up or a cell since killed.
    #[inline(always)]
    pub(super) fn decide_batch<'k, Q>(
        &self,
        requests: impl IntoIterator<Item = (&'k Q, u64)>,
        valid: impl Fn(u64) -> Result<(), QuotaError>,
        emit: impl FnMut(Result<Decision, QuotaError>),
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized + 'k,
    {
        let (core, guard) = (&self.core, self.map.guard());
        let now = core.clock.now();
        // papaya hashes inside its look-up: nothing to place ahead of it.
        let place = |_: &Q, cost| valid(cost).map(|()| None);
        let find = |key: &Q, found: &mut Option<_>| *found = self.map.get(key, &guard);
        let decide = |key: &Q, cost, found| {
            let step = |state: &mut A::State| core.algo.update(state, now, cost);
            core.count(self.apply_found(key, found, &guard, step))
        };
        batch::in_chunks(requests, place, find, decide, emit);
    }
}
