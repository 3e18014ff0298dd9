//! The papaya store's key handle for the core's request paths ([`At`]), and its batches: a
//! batch first locates its keys, then takes on each the step every request takes
//! ([`Shared::apply_found`]).

use super::bytes::{may_hold, KeyBytes, KeyView, ToKey};
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
    /// The papaya map of `String` keys held as their bytes, and the key.
    Bytes(&'a Shared<KeyBytes, A, C, V>, KeyView<'a, Q>),
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
            At::Bytes(sh, key) if const { may_hold::<K>() } => sh.apply(key, &sh.map.guard(), f),
            // Never run either: a map of keys unlike `String`'s holds no `Bytes`.
            At::Bytes(sh, _) => f(&mut sh.core.algo.fresh()),
            At::Compact(at) if const { may_route::<K, A::State>() } => at.apply(f),
            // Never run (see `Route`): a fresh state, in no table.
            At::Compact(at) => f(&mut at.algo().fresh()),
        }
    }

    fn key_print(&self) -> u64 {
        match self {
            At::Papaya(_, key) => crate::shared::key_print(*key),
            At::Bytes(_, key) => crate::shared::key_print(key),
            At::Compact(at) => at.key_print(),
        }
    }
}

/// A batch's key as [`Shared::decide_batch`] takes it: a reference to a key of the map
/// (`&Q`), or a [`KeyView`] of a `String` key.
pub(super) trait KeyRef<K>: Copy {
    /// What the map's look-ups and inserts take.
    type Key: ToKey<K> + ?Sized;
    /// The key.
    fn key(&self) -> &Self::Key;
}

impl<K, Q: ToKey<K> + ?Sized> KeyRef<K> for &Q {
    type Key = Q;
    #[inline(always)]
    fn key(&self) -> &Q {
        self
    }
}

impl<Q: Hash + ?Sized> KeyRef<KeyBytes> for KeyView<'_, Q> {
    type Key = Self;
    #[inline(always)]
    fn key(&self) -> &Self {
        self
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
    pub(super) fn decide_batch<R: KeyRef<K>>(
        &self,
        requests: impl IntoIterator<Item = (R, u64)>,
        valid: impl Fn(u64) -> Result<(), QuotaError>,
        emit: impl FnMut(Result<Decision, QuotaError>),
    ) {
        let (core, guard) = (&self.core, self.map.guard());
        let now = core.clock.now();
        // papaya hashes inside its look-up: nothing to place ahead of it.
        let place = |_: R, cost| valid(cost).map(|()| None);
        let find = |key: R, found: &mut Option<_>| *found = self.map.get(key.key(), &guard);
        let decide = |key: R, cost, found| {
            let step = |state: &mut A::State| core.algo.update(state, now, cost);
            core.count(self.apply_found(key.key(), found, &guard, step))
        };
        batch::in_chunks(requests, place, find, decide, emit);
    }
}
