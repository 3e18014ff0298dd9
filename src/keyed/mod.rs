//! [`CasLimiter`] and [`MutexLimiter`]: a `papaya` map from key to a cell of state, with idle and capacity
//! eviction; partial grants, settle and per-request quotas in `costs.rs`.

mod bytes;
mod costs;
mod evict;
mod inline;

pub(crate) use bytes::ToKey;
use bytes::{KeyBytes, KeyView};

use inline::may_route;

use costs::At;

use crate::algo::Algorithm;
use crate::cell::StateCell;
use crate::clock::{Clock, QuantaClock};
use crate::compact::{At as CompactAt, Compact};
use crate::decision::Decision;
use crate::error::{BuildError, QuotaError};
use crate::limiter::{Cas, Locked, Variant};
use crate::ops::sealed::{Lookup, Table};
use crate::ops::Limiter;
use crate::shared::{sealed, Core, KeyedStore, Options};
use crate::stats::Metrics;
use crate::sweeper::{evict_before_insert, Sweeper};
use papaya::Equivalent;
use std::any::TypeId;
use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

/// Keys sampled to pick the capacity-eviction threshold.
const CAPACITY_SAMPLE: usize = 1024;

/// The lock-free keyed limiter over a [`Map`], the default for any key: a `papaya` concurrent
/// map (hashed with `ahash`) from key to a cell of state; for 64-bit keys, the compact table.
///
/// **Which table.** A limiter of `u64`, `u32` or [`Ipv4Addr`](std::net::Ipv4Addr) keys whose
/// algorithm keeps one 64-bit word a key ([`Gcra`](crate::algo::Gcra),
/// [`Earrrl`](crate::algo::Earrrl), [`FixedWindow`](crate::algo::FixedWindow),
/// [`InFlight`](crate::algo::InFlight)) keeps them in the compact table
/// ([`CompactLimiter`](crate::CompactLimiter)'s, chosen at build by `TypeId`), bounded by
/// [`max_keys`](crate::store::Builder::max_keys) or not: key and state in one 16-byte slot,
/// one CAS, one cache miss a check at a million keys where the map takes two; 1.3–2.7×
/// governor's speed there (two sittings), in 34 bytes a key without a bound and 48 with one
/// (its debt table: `BENCHMARKS.md`). Without a bound it grows as keys come and never
/// evicts for capacity, as the map; set one where clients choose the keys, to bound the
/// memory a flood of new keys can take. The decisions are the same until a key is evicted
/// for capacity, which each table does its own way (`docs/GUARANTEES.md`, G2). Any other key
/// type or state (a 128-bit key or state would take a per-slot lock in the table, a CAS
/// here) is held in the map; so is a key type of your own wrapping a `u64`.
/// `format!("{limiter:?}")` names the table.
///
/// With [`Cas`] the map's hot path for a known key is: clock read → hash →
/// lock-free lookup → load the state word → pure algorithm step → `compare_exchange_weak`
/// (retried with backoff on a lost race). It allocates nothing, and takes no lock for a word
/// state (a `u128` one: where the CPU has a 16-byte CAS); the states that are no word (the
/// sliding log's, the sub-window's) sit behind a per-key mutex, held for the step. A key seen
/// for the first time is inserted (one allocation). With [`Locked`] ([`MutexLimiter`]) the
/// same map holds each key's state behind a `parking_lot::Mutex`, and the same step runs under
/// it.
///
/// Look-ups borrow: a `CasLimiter<String, _>` is checked with `&str`, so a request
/// allocates nothing for a known key. Its map holds each key's bytes in the entry, inline up
/// to 22 bytes (a longer key in an allocation of its own, as a `String`'s): a look-up compares
/// the key where it finds the entry, without another dependent load, and a key of up to 22
/// bytes costs no allocation of its own (at 1M 15-byte keys, 70 bytes a key against
/// governor's 101, and fewer last-level misses a check: `BENCHMARKS.md`). Every operation is [`Limiter`]'s; code generic over the
/// cell names `Limiter<Map<K, A, C, V>>` with `V:` [`Variant`].
pub type CasLimiter<K, A, C = QuantaClock> = Limiter<Map<K, A, C, Cas>>;

/// The pessimistic twin: the same map and algorithm, each key's state behind a mutex.
pub type MutexLimiter<K, A, C = QuantaClock> = Limiter<Map<K, A, C, Locked>>;

/// The keyed [`Store`](crate::store::Store) of any key: a `papaya` concurrent map (hashed
/// with `ahash`) from key to a cell of state, the cell chosen by `V` ([`Cas`] or [`Locked`]);
/// see [`CasLimiter`]. A map of `u64`, `u32` or `Ipv4Addr` keys under a one-word state is the
/// compact table ([`Compact`]) instead, bounded by
/// [`max_keys`](crate::store::Builder::max_keys) or not, which holds each key and its state
/// in one lock-free slot.
pub struct Map<K, A: Algorithm, C: Clock = QuantaClock, V: Variant<A> = Cas>(
    pub(crate) Route<K, A, C, V>,
);

/// Where a [`Map`] keeps its keys: chosen at build by the key type, the state and the bound.
pub(crate) enum Route<K, A: Algorithm, C: Clock, V: Variant<A>> {
    /// The papaya map.
    Papaya(Arc<Shared<K, A, C, V>>),
    /// The papaya map of `String` keys, holding each key's bytes in its node (inline up to
    /// 22 bytes): a look-up compares them without another dependent load. As for `Compact`,
    /// every use is under `if const { bytes::may_hold::<K>() }` (keys the size of a
    /// `String`), so a map of other keys compiles none of its code.
    Bytes(Arc<Shared<KeyBytes, A, C, V>>),
    /// A compact table of the keys' 64-bit forms (`u32`, `u64`, `Ipv4Addr`), for a one-word
    /// state only: every use is under `if const { may_route::<K, A::State>() }`, so that a map
    /// of any other compiles none of the table's code; the `else` of each, never run, answers
    /// as no admission would.
    Compact(Compact<u64, A, C, V>),
}

/// What a branch for a route that cannot exist answers (a map whose states the table cannot
/// hold never builds one): a denial, never an admission.
#[cold]
fn no_route() -> Decision {
    Decision::denied(std::time::Duration::from_secs(1))
}

/// Whether a map of `K` keys and `S` states is the compact table: `build`'s test, decided by
/// the types alone, so a constant once monomorphized. The request paths test it beside the
/// stored route, so that each map compiles its own route's code only: a `CasLimiter<u64>` no
/// papaya look-up beside the table's, a map of any other key no table. (Matched on the route
/// alone, both stood in one function: the one-key check on the papaya map, coarse clock, took
/// 11.7–12.1 ns against 11.3–11.4 now, `cargo bench --bench scale -- --steps`.)
#[inline(always)]
fn in_table<K: 'static, S: crate::algo::sealed::Sealed>() -> bool {
    (const { may_route::<K, S>() }) && inline::narrow::<K>()
}

/// Whether a map of `K` keys may hold their bytes (`Route::Bytes`): `K` is `String` (whether
/// `str` streams as the route reads it is asked once, at build).
#[inline(always)]
fn of_strings<K: 'static>() -> bool {
    (const { bytes::may_hold::<K>() }) && TypeId::of::<K>() == TypeId::of::<String>()
}

/// Everything the requests and the sweeper thread share: the keyed store itself, which the
/// hybrid limiter (feature `redis`) also keeps its entries in.
pub struct Shared<K, A: Algorithm, C, V: Variant<A>> {
    pub(crate) map: papaya::HashMap<K, V::Cell, ahash::RandomState>,
    pub(crate) core: Core<A, C>,
    /// Told of every key an eviction kills, with the state it killed: what the hybrid
    /// limiter hands back to Redis. `None` for the keyed limiters.
    evicted: Option<EvictHook<K, V::Cell, A::State>>,
    /// Hashes keys for the debt table (papaya keeps its own hasher to itself).
    hasher: ahash::RandomState,
}

/// See `Shared::with_evict_hook` (feature `redis`).
pub(crate) type EvictHook<K, C, S> = Box<dyn Fn(&K, &C, &S) + Send + Sync>;

impl<K: 'static, A: Algorithm, V: Variant<A>> sealed::Keyed for Map<K, A, QuantaClock, V> {}
impl<K: 'static, A: Algorithm, V: Variant<A>> KeyedStore for Map<K, A, QuantaClock, V> {}

impl<K, A, C, V> Table for Map<K, A, C, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    type Algo = A;
    type Clock = C;
    type WithClock<C2: Clock> = Map<K, A, C2, V>;

    fn build(algo: A, clock: C, options: &Options) -> Result<(Self, Option<Sweeper>), BuildError> {
        // Bounded or not: the table grows as keys come, up to `max_keys` if set.
        if in_table::<K, A::State>() {
            let (table, sweeper) = Compact::build_table(algo, clock, options)?;
            return Ok((Map(Route::Compact(table)), sweeper));
        }
        if of_strings::<K>() && bytes::str_streams_its_bytes() {
            let (shared, sweeper) = Shared::build(algo, clock, options)?;
            return Ok((Map(Route::Bytes(shared)), sweeper));
        }
        let (shared, sweeper) = Shared::build(algo, clock, options)?;
        Ok((Map(Route::Papaya(shared)), sweeper))
    }

    #[inline(always)]
    fn core(&self) -> &Core<A, C> {
        match &self.0 {
            Route::Papaya(sh) => &sh.core,
            Route::Bytes(sh) => &sh.core,
            Route::Compact(t) => t.core(),
        }
    }

    fn table(&self) -> &'static str {
        match &self.0 {
            Route::Papaya(_) | Route::Bytes(_) => "papaya map",
            Route::Compact(t) => t.table(),
        }
    }

    fn keys(&self) -> usize {
        match &self.0 {
            Route::Papaya(sh) => sh.map.len(),
            Route::Bytes(sh) => sh.map.len(),
            Route::Compact(t) => t.keys(),
        }
    }

    fn sweep(&self) -> Metrics {
        match &self.0 {
            Route::Papaya(sh) => sh.sweep(),
            Route::Bytes(sh) if const { bytes::may_hold::<K>() } => sh.sweep(),
            Route::Bytes(_) => Metrics::default(),
            Route::Compact(t) if const { may_route::<K, A::State>() } => t.sweep(),
            Route::Compact(_) => Metrics::default(),
        }
    }

    fn sweep_totals(&self) -> Metrics {
        match &self.0 {
            Route::Papaya(sh) => sh.core.sweep_totals(),
            Route::Bytes(sh) => sh.core.sweep_totals(),
            Route::Compact(t) => t.sweep_totals(),
        }
    }
}

impl<K, A, C, V, Q> Lookup<Q> for Map<K, A, C, V>
where
    K: Hash + Eq + Send + Sync + Borrow<Q> + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    type At<'a>
        = At<'a, K, A, C, V, Q>
    where
        Self: 'a,
        Q: 'a;

    #[inline(always)]
    fn at<'a>(&'a self, key: &'a Q) -> Self::At<'a> {
        match &self.0 {
            Route::Papaya(sh) => At::Papaya(&**sh, key),
            Route::Bytes(sh) => At::Bytes(&**sh, KeyView(key)),
            Route::Compact(t) => At::Compact(CompactAt::new(&t.0, &inline::form(key))),
        }
    }

    #[inline(always)]
    fn decide(&self, algo: &A, key: &Q, cost: u64, now: u64) -> Decision {
        match &self.0 {
            Route::Compact(t) if in_table::<K, A::State>() => {
                t.decide(algo, &inline::form(key), cost, now)
            }
            Route::Bytes(sh) if of_strings::<K>() => sh.decide(algo, &KeyView(key), cost, now),
            Route::Papaya(sh) if !in_table::<K, A::State>() => sh.decide(algo, key, cost, now),
            _ => no_route(),
        }
    }

    #[inline(always)]
    fn check(&self, key: &Q, cost: u64) -> Decision {
        match &self.0 {
            Route::Compact(t) if in_table::<K, A::State>() => t.check(&inline::form(key), cost),
            Route::Bytes(sh) if of_strings::<K>() => sh.check(&KeyView(key), cost),
            Route::Papaya(sh) if !in_table::<K, A::State>() => sh.check(key, cost),
            _ => no_route(),
        }
    }

    #[inline]
    fn peek(&self, algo: &A, key: &Q, cost: u64, now: u64) -> Decision {
        match &self.0 {
            Route::Compact(t) if in_table::<K, A::State>() => {
                t.peek(algo, &inline::form(key), cost, now)
            }
            Route::Bytes(sh) if of_strings::<K>() => {
                sh.peek(algo, &KeyView(key), cost, now, &sh.map.guard())
            }
            Route::Papaya(sh) if !in_table::<K, A::State>() => {
                sh.peek(algo, key, cost, now, &sh.map.guard())
            }
            _ => no_route(),
        }
    }

    #[inline(always)]
    fn decide_batch<'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k Q, u64)>,
        valid: impl Fn(u64) -> Result<(), QuotaError>,
        emit: impl FnMut(Result<Decision, QuotaError>),
    ) where
        Q: 'k,
    {
        match &self.0 {
            Route::Compact(t) if in_table::<K, A::State>() => {
                let locate = |key: &Q| t.0.locate(&inline::form(key));
                t.decide_batch_by(requests, locate, valid, emit);
            }
            Route::Bytes(sh) if of_strings::<K>() => {
                let requests = requests.into_iter().map(|(key, cost)| (KeyView(key), cost));
                sh.decide_batch(requests, valid, emit)
            }
            Route::Papaya(sh) if !in_table::<K, A::State>() => {
                sh.decide_batch(requests, valid, emit)
            }
            _ => {}
        }
    }
}

impl<K: Hash + Eq, A: Algorithm + fmt::Debug, C: Clock + fmt::Debug, V: Variant<A>> fmt::Debug
    for Map<K, A, C, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Route::Papaya(sh) => sh.fmt(f),
            Route::Bytes(sh) => sh.fmt(f),
            Route::Compact(t) => f
                .debug_struct("Map")
                .field("core", t.core())
                .field("table", &t.table())
                .field("keys", &t.keys())
                .finish(),
        }
    }
}

impl<K: Hash + Eq, A: Algorithm + fmt::Debug, C: fmt::Debug, V: Variant<A>> fmt::Debug
    for Shared<K, A, C, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Map")
            .field("core", &self.core)
            .field("keys", &self.map.len())
            .finish()
    }
}

impl<K, A, C, V> Shared<K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    pub(crate) fn new(algo: A, clock: C, options: &Options) -> Self {
        Self {
            map: papaya::HashMap::builder()
                .hasher(ahash::RandomState::new())
                .build(),
            core: Core::new(algo, clock, options),
            evicted: None,
            hasher: ahash::RandomState::new(),
        }
    }

    /// The store behind a [`Map`]: with its debt table if the options ask for one, shared
    /// with its sweeper thread if they ask for one.
    fn build(
        algo: A,
        clock: C,
        options: &Options,
    ) -> Result<(Arc<Self>, Option<Sweeper>), BuildError>
    where
        K: 'static,
    {
        let shared = Arc::new(Self::new(algo, clock, options).with_debts(options)?);
        let sweeper = shared.core.spawn_sweeper(&shared, |s| {
            s.sweep();
        })?;
        Ok((shared, sweeper))
    }

    /// A step of `algo` on `key`'s state at `now`, counted nowhere: what a request with a
    /// quota or an instant of its own runs.
    #[inline(always)]
    fn decide<Q>(&self, algo: &A, key: &Q, cost: u64, now: u64) -> Decision
    where
        Q: ToKey<K> + ?Sized,
    {
        self.apply(key, &self.map.guard(), |state| {
            algo.update(state, now, cost)
        })
    }

    /// A plain check of `key`: the clock read, the limiter's own algorithm, counted.
    #[inline(always)]
    fn check<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        Q: ToKey<K> + ?Sized,
    {
        let now = self.core.clock.now();
        let algo = &self.core.algo;
        self.core.count(self.apply(key, &self.map.guard(), |state| {
            algo.update(state, now, cost)
        }))
    }

    /// Adds the debt table, if the options ask for a bounded store that remembers.
    pub(crate) fn with_debts(
        mut self,
        options: &Options,
    ) -> Result<Self, std::collections::TryReserveError> {
        self.core = self.core.with_debts(options)?;
        Ok(self)
    }

    /// The state `key` would start from if inserted now, if the debt table holds a debt for
    /// it (`None`: none, or no table). Reads only: nothing inserted, nothing counted. The
    /// fleet's sync thread sends it for a key evicted before its changes were sent.
    #[cfg(feature = "redis")]
    pub(crate) fn owed<Q: Hash + ?Sized>(&self, key: &Q) -> Option<A::State> {
        let debts = self.core.debts.as_ref()?;
        debts.restore(&self.core.algo, self.debt_hash(key))
    }

    /// Files `state()` as what `key` owes in the debt table, without inserting the key, if the
    /// store is full (as full as a capacity pass leaves it) and keeps debts: whether it did.
    /// For the fleet's pushes of keys this instance does not hold (the other instances'
    /// traffic): inserted, each would push a key in use here out of a full store (4 instances
    /// under a flood of one-off keys: the store turned over four times as fast as its own
    /// keys alone made it). Filed, the key still starts from what the fleet holds when a
    /// request inserts it.
    #[cfg(feature = "redis")]
    pub(crate) fn owe_if_full<Q: Hash + ?Sized>(
        &self,
        key: &Q,
        state: impl FnOnce() -> A::State,
    ) -> bool {
        // Full as a capacity pass leaves it (7/8 of the bound): inserted past that, these
        // keys alone would call the next pass.
        let full = self
            .core
            .max_keys
            .is_some_and(|max| self.map.len() >= max - max / 8);
        if !full || self.core.debts.is_none() {
            return false;
        }
        self.core
            .keep_debt(|| self.debt_hash(key), &state(), self.core.sweep_now());
        true
    }

    /// The hash of `key` the debt table files it under.
    #[inline]
    fn debt_hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Calls `hook` with the key and the state of every cell a sweep kills (idle or for
    /// capacity), after the kill: a state that holds something outside this process (a
    /// lease) is handed back through it.
    #[cfg(feature = "redis")]
    pub(crate) fn with_evict_hook(mut self, hook: EvictHook<K, V::Cell, A::State>) -> Self {
        self.evicted = Some(hook);
        self
    }

    /// A step on a copy of `key`'s state (a fresh one if the key is absent or being
    /// evicted, which is what a dead cell's state was equivalent to).
    #[inline]
    pub(crate) fn peek<Q>(
        &self,
        algo: &A,
        key: &Q,
        cost: u64,
        now: u64,
        guard: &impl papaya::Guard,
    ) -> Decision
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.map
            .get(key, guard)
            .and_then(|cell| cell.inspect(|state| algo.peek(state, now, cost)))
            .unwrap_or_else(|| {
                self.core
                    .peek_absent(algo, || self.debt_hash(key), now, cost)
            })
    }

    /// `key`'s state as held, else as its debt restores it, else fresh: what its next
    /// request starts from.
    #[cfg(feature = "redis")]
    pub(crate) fn state_of<Q>(&self, key: &Q, guard: &impl papaya::Guard) -> A::State
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.map
            .get(key, guard)
            .and_then(|cell| cell.inspect(Clone::clone))
            .unwrap_or_else(|| self.core.absent_state(|| self.debt_hash(key)))
    }

    /// Runs `f` on `key`'s state in its cell, retrying on a fresh cell if the sweeper killed
    /// the one found. Every request path goes through here.
    #[inline(always)]
    pub(crate) fn apply<Q, T>(
        &self,
        key: &Q,
        guard: &impl papaya::Guard,
        f: impl FnMut(&mut A::State) -> T,
    ) -> T
    where
        Q: ToKey<K> + ?Sized,
    {
        self.apply_found(key, None, guard, f)
    }

    /// [`apply`](Shared::apply) starting from `found`, a cell the caller already looked up
    /// for `key` (a batch's first pass), if any: it is tried first, and the look-up (insert
    /// included) runs only when there is none or it turns out dead.
    #[inline(always)]
    pub(crate) fn apply_found<'g, Q, T>(
        &self,
        key: &Q,
        mut found: Option<&'g V::Cell>,
        guard: &'g impl papaya::Guard,
        mut f: impl FnMut(&mut A::State) -> T,
    ) -> T
    where
        K: 'g,
        Q: ToKey<K> + ?Sized,
    {
        loop {
            let cell = match found.take() {
                Some(cell) => cell,
                None => self.cell(key, guard),
            };
            match self.core.update(cell, &mut f) {
                Some(out) => return out,
                None => self.remove_dead(key, cell, guard),
            }
        }
    }

    /// The cell for `key`, inserted fresh on first sight.
    #[inline(always)]
    pub(crate) fn cell<'g, Q>(&self, key: &Q, guard: &'g impl papaya::Guard) -> &'g V::Cell
    where
        K: 'g,
        Q: ToKey<K> + ?Sized,
    {
        match self.map.get(key, guard) {
            Some(cell) => cell,
            None => self.insert_fresh(key, guard),
        }
    }

    /// The miss path of [`cell`](Shared::cell): evicts first if the map is full, then
    /// inserts a fresh cell (or finds the one a racing insert put there). Out of line, so that
    /// a hit keeps fewer values live across the look-up.
    #[cold]
    #[inline(never)]
    fn insert_fresh<'g, Q>(&self, key: &Q, guard: &'g impl papaya::Guard) -> &'g V::Cell
    where
        K: 'g,
        Q: ToKey<K> + ?Sized,
    {
        if let Some(max) = self.core.max_keys {
            // papaya's `retain` walks the map in one go: a waiting request cannot take part.
            evict_before_insert(
                || self.map.len(),
                max,
                &self.core.pass,
                &self.core.totals,
                || self.evict_capacity(max, guard),
                None,
            );
        }
        // Read before the insert, which excludes no eviction of this key: caught up after.
        let hash = self.core.debts.as_ref().map(|_| self.debt_hash(key));
        let stamp = hash.map(|h| self.core.debt_stamp(h));
        let state = match hash {
            Some(h) => self.core.start_state(|| h),
            None => self.core.algo.fresh(),
        };
        // `try_insert`, not `get_or_insert_with`: in papaya 0.2.5, filling a map through
        // `get_or_insert_with` under incremental resizing left later reads ~13x slower
        // (1.35 us vs 0.10 us per get at 1M keys, measured); `try_insert` does not.
        match self
            .map
            .try_insert(key.to_key(), V::Cell::new(state), guard)
        {
            Ok(cell) => {
                if let (Some(hash), Some(stamp)) = (hash, stamp) {
                    self.core.catch_up(hash, stamp, |merge| {
                        cell.rewrite(merge);
                    });
                }
                // Woken after the insert, so the sweep it triggers sees this key: a wake
                // consumed by a sweep that started before the insert would be lost.
                if self.core.max_keys.is_some_and(|max| self.map.len() > max) {
                    self.core.signal.wake();
                }
                cell
            }
            Err(occupied) => occupied.current,
        }
    }

    /// Removes `cell` (found dead) from the map if it is still there: the sweeper that killed
    /// it may not have got to it yet.
    #[cold]
    pub(crate) fn remove_dead<Q>(&self, key: &Q, cell: &V::Cell, guard: &impl papaya::Guard)
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        let _ = self.map.remove_if(key, |_, c| std::ptr::eq(c, cell), guard);
    }
}

#[cfg(all(test, not(hotlimit_loom)))]
mod tests {
    use super::Route;
    use crate::{algo::Gcra, CasLimiter, ManualClock, RateLimiter};

    /// Late in a level the lines not yet split hold twice the mean load and overflow; a
    /// split brings its staying keys back into the room its image keys leave. So once a
    /// level is done (here 65,536 home lines at 46% of their slots), nearly every key of an
    /// unbounded `CasLimiter<u64>` sits in its home line: 90% did before splits did that,
    /// costing every look-up of the rest a second line (issue #61's misses at 1M keys).
    #[test]
    fn after_a_level_keys_sit_in_their_home_lines() {
        let l = CasLimiter::<u64, Gcra, _>::with_clock(
            "1000000000/s burst 1000000".parse().unwrap(),
            ManualClock::default(),
        );
        for key in 0..120_000u64 {
            assert!(l.check(&key).is_allowed());
        }
        let Route::Compact(table) = &l.store.0 else {
            panic!("a CasLimiter<u64> is the compact table");
        };
        let stats = table.0.probe_stats();
        assert_eq!(
            (stats.keys, stats.lines),
            (120_000, 65_536 + 127),
            "{stats:?}"
        );
        assert!(stats.in_home_line > 0.95, "{stats:?}");
        assert!(stats.mean_lines < 1.1, "{stats:?}");
    }
}
