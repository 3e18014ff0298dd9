//! [`CompactLimiter`]: an open-addressing table for keys of a fixed small size, with each
//! key's state inline next to it, growing up to `max_keys`: the key types ([`key`]), the table ([`table`])
//! and its slots ([`slot`]). The table's design is in `docs/DESIGN.md`, section 7.

mod key;
pub(crate) mod slot;
pub(crate) mod table;

pub(crate) use crate::limiter::Variant;
pub use key::{CompactKey, Hashed};
pub use table::{ProbeStats, DEFAULT_MAX_KEYS};

use crate::algo::Algorithm;
use crate::clock::{Clock, QuantaClock};
use crate::decision::Decision;
use crate::error::{BuildError, QuotaError};
use crate::limiter::Cas;
use crate::ops::sealed::{Lookup, Table as StoreTable};
use crate::ops::Limiter;
use crate::shared::{sealed, Core, KeyState, KeyedStore, Options};
use crate::stats::Metrics;
use crate::sweeper::Sweeper;
use std::fmt;
use std::sync::Arc;
use table::{Table, SLOTS_PER_LINE};

/// A keyed rate limiter over an open-addressing table for keys of a fixed small size (`u32`, `u64`, `u128`, IP addresses, or a 64-bit keyed hash of any key with
/// [`Hashed`]), with each key's state inline next to it.
///
/// ```
/// use hotlimit::{algo::Gcra, store::Hashed, CompactLimiter, ManualClock, RateLimiter};
/// use std::net::{IpAddr, Ipv4Addr};
///
/// // Up to a million IPv4 clients, 10 requests per second each, bursts of 5: lock-free.
/// let limiter = CompactLimiter::<Ipv4Addr, Gcra>::builder("10/s burst 5".parse()?)
///     .max_keys(1_000_000)
///     .clock(ManualClock::default())
///     .build()?;
/// let client = Ipv4Addr::new(203, 0, 113, 7);
/// let allowed = (0..10).filter(|_| limiter.check(&client).is_allowed()).count();
/// assert_eq!(allowed, 5);
///
/// // Any address, IPv6 too, lock-free as a 64-bit keyed hash (see `Hashed` for collisions).
/// let any = CompactLimiter::<Hashed<IpAddr>, Gcra>::builder("10/s burst 5".parse()?)
///     .clock(ManualClock::default())
///     .build()?;
/// assert!(any.check(&IpAddr::V6("2001:db8::7".parse()?)).is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// **Which slots are lock-free.** A key form of 64 bits (`u32`, `u64`, `Ipv4Addr`,
/// [`Hashed`]) with a 64-bit state (GCRA, EARRRL, the fixed window) shares one 128-bit word
/// with its state, updated by one CAS: the lock-free slot. A 128-bit key form (`u128`,
/// `Ipv6Addr`, `IpAddr`), a 128-bit state (the sliding window, exponential, a pair of
/// quotas) or a state that is no word (the sliding log, the sub-window) needs more than one
/// CAS covers, so its slot takes a per-slot lock (held
/// for one step, never across a call out) under either variant. On a target without a
/// 16-byte CAS (`portable-atomic` falls back to a lock there), every 128-bit word is behind
/// a lock.
///
/// **When to pick it.** This table takes fixed-size keys, grows with them up to `max_keys`
/// (never shrinking), and keeps key and state in one slot, four to a cache line, so a check of
/// a present key touches one line in the common case: its check is the faster from one key to
/// ten million, and at a million keys it takes less memory per key than the papaya map and its
/// look-up misses the cache once, not twice. A [`CasLimiter`](crate::CasLimiter) over
/// `u64`, `u32` or `Ipv4Addr` keys with a one-word state is this table already (without a
/// bound if built without `max_keys`); name it for any key as a 64-bit keyed hash
/// ([`Hashed`]: IPv6 clients lock-free), for 128-bit keys, or for the default bound
/// ([`DEFAULT_MAX_KEYS`]) without choosing one.
/// The table's design, its costs and the crates evaluated before writing it are in
/// `docs/DESIGN.md` (section 7); measurements in `BENCHMARKS.md`.
///
/// **Sizing.** `max_keys` is the capacity bound, and the table grows toward it as keys
/// arrive, a chunk at a time (each as large as the lines before it): while its lines fit
/// 1 MiB (up to 16,384 home lines) it keeps keys in at most 1/4 of its slots, so almost every
/// key sits in the slot its look-up tries first; beyond, 3/4, where about one key in seven
/// sits past its home line and a look-up scans further. It grows by doubling its lines a line
/// at a time (linear hashing), up to the lines `max_keys` needs at that fill (rounded up by
/// at most 1/32); past them it evicts. `docs/DESIGN.md` (section 7) has the growth protocol.
///
/// **The hot path.** With the [`Cas`] variant and a 64-bit key form ([`u64`], [`u32`], [`Ipv4Addr`](std::net::Ipv4Addr),
/// [`Hashed`]) and a one-word state ([`Gcra`](crate::algo::Gcra), [`Earrrl`](crate::algo::Earrrl),
/// [`FixedWindow`](crate::algo::FixedWindow)), the hot path for a present key is: clock read
/// → hash → the home line from the table's growth word → load the home line's slots → pure
/// algorithm step → one 128-bit `compare_exchange_weak`. No lock, no allocation, one cache
/// line of keys in the common case (and the growth word and chunk pointer, shared by every
/// key and cached).
///
/// **Consistency.** As for the papaya store: decisions are linearizable per key, no update
/// is lost to eviction, and at one fixed `now`, N threads firing at one key get exactly as
/// many allowed as one thread would, and growth loses no update (a key moved by a split takes
/// its state by the same CAS a request's update races). Unlike it, the key count is bounded
/// by `max_keys` (the capacity pass) and by the table's slots at their most.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock, RateLimiter};
/// use std::time::Duration;
///
/// let clock = ManualClock::default();
/// let limiter = CompactLimiter::<u64, Gcra>::builder("10/s burst 2".parse()?)
///     .max_keys(1000)
///     .clock(clock.clone())
///     .sweep_grace(Duration::ZERO)
///     .build()?;
/// assert!(limiter.check(&7).is_allowed());
/// assert!(limiter.check(&7).is_allowed());
/// assert_eq!(limiter.check(&7).retry_after(), Duration::from_millis(100));
/// clock.advance(Duration::from_millis(200));
/// assert_eq!(limiter.sweep().evicted_idle, 1); // back to fresh: dropped, nothing lost
/// assert_eq!(limiter.metrics().keys, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type CompactLimiter<K, A, C = QuantaClock, V = Cas> = Limiter<Compact<K, A, C, V>>;

/// The [`Store`](crate::store::Store) of fixed-size keys: an open-addressing table growing up
/// to `max_keys`, with each key's state inline next to it, the slot chosen by `V`; see
/// [`CompactLimiter`].
pub struct Compact<K: CompactKey, A: Algorithm, C = QuantaClock, V: Variant<A> = Cas>(
    pub(crate) Arc<Table<K, A, C, V>>,
);

impl<K: CompactKey, A: Algorithm, V: Variant<A>> sealed::Keyed for Compact<K, A, QuantaClock, V> {}
impl<K: CompactKey, A: Algorithm, V: Variant<A>> KeyedStore for Compact<K, A, QuantaClock, V> {}

impl<K, A, C, V> StoreTable for Compact<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    type Algo = A;
    type Clock = C;
    type WithClock<C2: Clock> = Compact<K, A, C2, V>;

    /// Allocates the table ([`BuildError::OutOfMemory`] if it cannot be) and starts the
    /// background sweeper if one was asked for.
    fn build(algo: A, clock: C, options: &Options) -> Result<(Self, Option<Sweeper>), BuildError> {
        let bounded = Options {
            max_keys: Some(options.max_keys.unwrap_or(DEFAULT_MAX_KEYS)),
            ..*options
        };
        Self::build_table(algo, clock, &bounded)
    }

    #[inline(always)]
    fn core(&self) -> &Core<A, C> {
        &self.0.core
    }

    fn table(&self) -> &'static str {
        "compact table"
    }

    fn keys(&self) -> usize {
        self.0.len()
    }

    fn sweep(&self) -> Metrics {
        self.0.sweep()
    }

    fn sweep_totals(&self) -> crate::Metrics {
        self.0.sweep_totals()
    }
}

impl<K, A, C, V> Lookup<K::Lookup> for Compact<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    type At<'a>
        = At<'a, K, A, C, V>
    where
        Self: 'a;

    #[inline(always)]
    fn at<'a>(&'a self, key: &'a K::Lookup) -> At<'a, K, A, C, V> {
        At::new(&self.0, key)
    }

    #[inline(always)]
    fn decide(&self, algo: &A, key: &K::Lookup, cost: u64, now: u64) -> Decision {
        self.0.apply(key, |state| algo.update(state, now, cost))
    }

    #[inline(always)]
    fn check(&self, key: &K::Lookup, cost: u64) -> Decision {
        let table = &*self.0;
        let now = table.core.clock.now();
        let algo = &table.core.algo;
        table
            .core
            .count(table.apply(key, |state| algo.update(state, now, cost)))
    }

    #[inline]
    fn peek(&self, algo: &A, key: &K::Lookup, cost: u64, now: u64) -> Decision {
        self.0.peek(algo, key, cost, now)
    }

    /// The batch's home lines are loaded back to back before any decision, so their cache
    /// misses overlap.
    #[inline(always)]
    fn decide_batch<'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k K::Lookup, u64)>,
        valid: impl Fn(u64) -> Result<(), QuotaError>,
        emit: impl FnMut(Result<Decision, QuotaError>),
    ) where
        K::Lookup: 'k,
    {
        self.decide_batch_by(requests, |key| self.0.locate(key), valid, emit);
    }
}

impl<K, A, C, V> Compact<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// The table as `options` say, without a bound if they set none (a `CasLimiter` of
    /// `u64` keys), and its background sweeper if one was asked for.
    pub(crate) fn build_table(
        algo: A,
        clock: C,
        options: &Options,
    ) -> Result<(Self, Option<Sweeper>), BuildError> {
        let table = Arc::new(Table::new(algo, clock, options)?);
        let sweeper = table.core.spawn_sweeper(&table, |t| {
            t.sweep();
        })?;
        Ok((Compact(table), sweeper))
    }

    /// A batch whose keys `locate` places in the table (by their look-up form here, by their
    /// inline form from a [`Map`](crate::store::Map) of fixed-size keys).
    #[inline(always)]
    pub(crate) fn decide_batch_by<'k, Q: ?Sized + 'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k Q, u64)>,
        locate: impl Fn(&Q) -> (K::Repr, u64, usize),
        valid: impl Fn(u64) -> Result<(), QuotaError>,
        emit: impl FnMut(Result<Decision, QuotaError>),
    ) {
        let (table, core) = (&*self.0, &self.0.core);
        let now = core.clock.now();
        let place = |key: &Q, cost| {
            valid(cost)?;
            Ok(locate(key))
        };
        let find = |_: &Q, &mut (_, fp, home): &mut _| {
            table.touch(fp, home);
        };
        let decide = |_: &Q, cost, (repr, fp, home)| {
            core.count(table.apply_at(repr, fp, home, |state| core.algo.update(state, now, cost)))
        };
        crate::batch::in_chunks(requests, place, find, decide, emit);
    }
}

impl<K, A, C, V> Limiter<Compact<K, A, C, V>>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// Walks the table and measures how far the keys held sit from their home lines, and
    /// says its size now (its `slots`: the most keys it can hold before it grows again). A
    /// snapshot, not atomic with concurrent inserts; O(slots).
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock, RateLimiter};
    ///
    /// let l = CompactLimiter::<u64, Gcra>::builder("1/s".parse()?)
    ///     .max_keys(10_000)
    ///     .clock(ManualClock::default())
    ///     .build()?;
    /// for key in 0..10_000 {
    ///     assert!(l.check(&key).is_allowed());
    /// }
    /// let stats = l.probe_stats();
    /// assert_eq!(stats.keys, 10_000);
    /// assert!(stats.mean_lines < 1.5);
    /// assert!(stats.slots >= 10_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn probe_stats(&self) -> ProbeStats {
        self.store.0.probe_stats()
    }
}

/// `key`'s slot in `table`, located once (its inline form, fingerprint and home line): what
/// the request paths of the core run their step on, and, by the fingerprint, what binds a
/// ticket to the key (no second hash).
// Not `Debug`: a handle that lives inside one request, never shown.
#[allow(missing_debug_implementations)]
pub struct At<'a, K: CompactKey, A: Algorithm, C, V: Variant<A>> {
    table: &'a Table<K, A, C, V>,
    repr: K::Repr,
    fp: u64,
    home: usize,
}

impl<'a, K: CompactKey, A: Algorithm, C: Clock, V: Variant<A>> At<'a, K, A, C, V> {
    /// The table's algorithm.
    pub(crate) fn algo(&self) -> &'a A {
        &self.table.core.algo
    }

    #[inline(always)]
    pub(crate) fn new(table: &'a Table<K, A, C, V>, key: &K::Lookup) -> Self {
        let (repr, fp, home) = table.locate(key);
        At {
            table,
            repr,
            fp,
            home,
        }
    }
}

impl<K, A, C, V> KeyState<A::State> for At<'_, K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    #[inline(always)]
    fn apply<T>(&self, f: impl FnMut(&mut A::State) -> T) -> T {
        self.table.apply_at(self.repr, self.fp, self.home, f)
    }

    fn key_print(&self) -> u64 {
        self.fp
    }
}

impl<K, A, C, V> fmt::Debug for Compact<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm + fmt::Debug,
    C: Clock + fmt::Debug,
    V: Variant<A>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compact")
            .field("core", &self.0.core)
            .field("keys", &self.0.len())
            .field("slots", &(self.0.lines() * SLOTS_PER_LINE))
            .finish()
    }
}
