//! [`CompactLimiter`]: a fixed-capacity, open-addressing table for keys of a fixed small size,
//! with each key's state inline next to it. The design, and the crates evaluated before
//! writing it, are documented on [`CompactLimiter`] (this module is private; the docs live
//! where rustdoc shows them).

mod slot;

pub use slot::{CompactState, KeyRepr, Slot};

use crate::algo::{clamp, Algorithm, Gcra, Reservation};
use crate::clock::{duration_to_nanos, Clock, QuantaClock};
use crate::decision::Decision;
use crate::error::{check_cost, CostError};
use crate::keyed::DEFAULT_SWEEP_GRACE;
use crate::limiter::{Cas, Locked, RateLimiter, Variant};
use crate::stats::{CasStats, Metrics, Stats};
use crate::sweeper::{
    evict_before_insert, CapacityCut, Signal, SweepReport, SweepTotals, Sweeper, Totals,
};
use crate::sync::Mutex;
use crate::wait::{self, Jitter};
use crossbeam_utils::CachePadded;
use slot::AtomicU8;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Slots per line: four 16-byte pair slots fill one 64-byte cache line.
pub const SLOTS_PER_LINE: usize = 4;

/// The probe window: a key lives at most `WINDOW_LINES - 1` lines past its home line. At the
/// design load (3/4) 87% of keys sit in their home line and the mean look-up scans 1.27
/// lines, but linear probing has a long thin tail: the longest probe was 37–62 lines at 10^6
/// keys and 45–65 at 10^7 over our runs (see [`CompactLimiter::probe_stats`] and
/// `BENCHMARKS.md`). Twice that leaves room to grow, so the window fills only when the table
/// itself is nearly full.
pub const WINDOW_LINES: usize = 128;

/// The `max_keys` of a compact limiter built without [`CompactBuilder::max_keys`].
pub const DEFAULT_MAX_KEYS: usize = 65_536;

/// Home-line lock stripes for inserts (cache-padded: 64 KiB).
const STRIPES: usize = 1024;

/// A key type the compact store can hold inline: it maps to a fixed-size form
/// ([`Repr`](CompactKey::Repr), `u64` or `u128`).
///
/// Implemented for `u32`, `u64`, `u128`, [`Ipv4Addr`], [`Ipv6Addr`], [`IpAddr`] (IPv4 as its
/// IPv4-mapped IPv6 address, so `203.0.113.7` and `::ffff:203.0.113.7` are one key) — all
/// exact — and for [`Hashed<T>`], a 64-bit keyed hash of any `T: Hash`.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock};
///
/// let l = CompactLimiter::<u64, Gcra, _>::with_clock("1/s".parse()?, ManualClock::new());
/// assert!(l.check(&42).is_allowed());
/// assert!(l.check(&42).is_denied());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait CompactKey: 'static {
    /// The inline form.
    type Repr: KeyRepr;
    /// What a request names the key by (`str` for a `Hashed<String>`).
    type Lookup: ?Sized;
    /// The inline form of `key`. `hasher` is the limiter's seeded hasher, used by [`Hashed`].
    fn repr(key: &Self::Lookup, hasher: &ahash::RandomState) -> Self::Repr;

    /// The 64-bit hash that places `repr` in the table (its home line and first slot): `repr`
    /// hashed with the limiter's seeded `hasher`. A [`Hashed`] key is such a hash already and
    /// is its own placement, so a check hashes it once.
    #[inline(always)]
    fn place(repr: Self::Repr, hasher: &ahash::RandomState) -> u64 {
        hasher.hash_one(repr)
    }
}

impl CompactKey for u64 {
    type Repr = u64;
    type Lookup = u64;
    #[inline(always)]
    fn repr(key: &u64, _: &ahash::RandomState) -> u64 {
        *key
    }
}

impl CompactKey for u32 {
    type Repr = u64;
    type Lookup = u32;
    #[inline(always)]
    fn repr(key: &u32, _: &ahash::RandomState) -> u64 {
        u64::from(*key)
    }
}

impl CompactKey for u128 {
    type Repr = u128;
    type Lookup = u128;
    #[inline(always)]
    fn repr(key: &u128, _: &ahash::RandomState) -> u128 {
        *key
    }
}

impl CompactKey for Ipv4Addr {
    type Repr = u64;
    type Lookup = Ipv4Addr;
    #[inline(always)]
    fn repr(key: &Ipv4Addr, _: &ahash::RandomState) -> u64 {
        u64::from(key.to_bits())
    }
}

impl CompactKey for Ipv6Addr {
    type Repr = u128;
    type Lookup = Ipv6Addr;
    #[inline(always)]
    fn repr(key: &Ipv6Addr, _: &ahash::RandomState) -> u128 {
        key.to_bits()
    }
}

impl CompactKey for IpAddr {
    type Repr = u128;
    type Lookup = IpAddr;
    #[inline(always)]
    fn repr(key: &IpAddr, _: &ahash::RandomState) -> u128 {
        match key {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().to_bits(),
            IpAddr::V6(v6) => v6.to_bits(),
        }
    }
}

/// Opt-in key mode: any `T: Hash` (strings, tuples, structs), kept as a 64-bit hash keyed by
/// the limiter's per-process random seed.
///
/// Two distinct keys with the same 64-bit hash share one state (each sees the other's
/// requests). With `n` keys held at once the chance that any two collide is about
/// `n² / 2^65`: 3·10^-8 for a million keys, 3·10^-6 for ten million. The seed is secret and
/// per process, so a client cannot aim for a collision; use the papaya store
/// ([`KeyedLimiter`](crate::KeyedLimiter)) where even that is too much.
///
/// ```
/// use hotlimit::{algo::Gcra, CompactLimiter, Hashed, ManualClock};
///
/// let l = CompactLimiter::<Hashed<str>, Gcra, _>::with_clock("10/s burst 1".parse()?, ManualClock::new());
/// assert!(l.check("alice").is_allowed());
/// assert!(l.check("alice").is_denied());
/// assert!(l.check("bob").is_allowed());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub struct Hashed<T: ?Sized>(PhantomData<fn(&T)>);

impl<T: ?Sized> fmt::Debug for Hashed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hashed")
    }
}

impl<T: Hash + ?Sized + 'static> CompactKey for Hashed<T> {
    type Repr = u64;
    type Lookup = T;
    #[inline(always)]
    fn repr(key: &T, hasher: &ahash::RandomState) -> u64 {
        hasher.hash_one(key)
    }

    /// Already a seeded 64-bit hash: uniform and unknown to clients, so used as is.
    #[inline(always)]
    fn place(repr: u64, _: &ahash::RandomState) -> u64 {
        repr
    }
}

/// How the compact store keeps each key's state for a [`Variant`]: the slot type. Sealed;
/// implemented for [`Cas`] (a lock-free pair slot for 64-bit keys and 64-bit states, a lock
/// slot otherwise) and [`Locked`] (always a lock slot).
pub trait CompactVariant<A: Algorithm>: Variant<A> {
    /// The slot for keys of form `R`.
    #[doc(hidden)]
    type Slot<R: KeyRepr>: Slot<R, A::State>;
}

impl<A: Algorithm> CompactVariant<A> for Cas {
    type Slot<R: KeyRepr> = <A::State as CompactState>::CasSlot<R>;
}

impl<A: Algorithm> CompactVariant<A> for Locked {
    type Slot<R: KeyRepr> = slot::LockSlot<R, A::State>;
}

/// One cache line of slots.
#[repr(align(64))]
struct Line<T>([T; SLOTS_PER_LINE]);

type SlotOf<K, A, V> = <V as CompactVariant<A>>::Slot<<K as CompactKey>::Repr>;

/// A keyed rate limiter over a fixed-capacity, open-addressing table for keys of a fixed
/// small size (`u32`, `u64`, `u128`, IP addresses, or a 64-bit keyed hash of any key with
/// [`Hashed`]), with each key's state inline next to it.
///
/// ```
/// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock};
/// use std::net::{IpAddr, Ipv4Addr};
///
/// // Up to a million clients by IP, 10 requests per second each, bursts of 5.
/// let limiter = CompactLimiter::<IpAddr, Gcra>::builder("10/s burst 5".parse()?)
///     .max_keys(1_000_000)
///     .clock(ManualClock::new())
///     .build()?;
/// let client = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7));
/// let allowed = (0..10).filter(|_| limiter.check(&client).is_allowed()).count();
/// assert_eq!(allowed, 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Why a second store
///
/// papaya reaches an entry through its metadata, its slot and a separately allocated entry:
/// about three cache misses for a cold key, and some 54 bytes per key. At a million keys and
/// more (a proxy keyed by client IP) that dominates a check. This store keeps key and state
/// together in one 16-byte slot, four to a cache line, so a check of a present key touches one
/// line in the common case, and a million keys take about 22 bytes each.
///
/// # Design
///
/// * **Table.** `lines` cache lines of 4 slots, fixed at build: enough for
///   [`CompactBuilder::max_keys`] at a load of 3/4, never resized. A key's *home line* is
///   picked from a 64-bit hash of the key by a multiply-shift (so the line count need not be a
///   power of two, which would cost up to 2× the memory).
/// * **Hashing.** `ahash`'s `RandomState`, seeded per process (and per limiter), so a client
///   cannot choose keys that pile onto one line: sequential keys and multiples of 2^k spread
///   like random ones (`tests/compact.rs` checks the probe lengths).
/// * **Probing.** A key lives in its home line or, if that was full when it arrived, in one of
///   the next lines (linear probing by line, at most [`WINDOW_LINES`] lines). Each home line
///   keeps a one-byte *reach*: how many lines past it any of its keys was ever placed. A
///   look-up scans the home line (from a slot picked by the hash, where most keys sit, so the
///   first probe usually matches), and only if the key is not there reads the reach and scans
///   that many more lines: no scan to an empty slot, so freed slots never lengthen a look-up.
/// * **Slots.** For a 64-bit key form and a 64-bit state word (GCRA, EARRRL, fixed window)
///   with the [`Cas`] variant, a slot is `(key, state)` in one 128-bit word, updated by one
///   double-width compare-and-swap (`cmpxchg16b`); no lock. Every other combination (the
///   [`Locked`] variant, 128-bit states, non-word states, 128-bit keys) keeps key and state
///   behind a per-slot mutex in the slot, with a lock-free hint word (the key's fingerprint,
///   or 0 when free) so look-ups lock only the slot that matches. No 128-bit key with a
///   64-bit state fits one double-width CAS, hence the lock there too.
/// * **No ABA.** A request CASes the whole `(key, state)` pair, so it can only write into a
///   slot that still holds its key with the state it computed from; a slot freed and reused by
///   another key meanwhile makes the CAS fail, and the request looks its key up again. If the
///   slot was freed and re-taken by the *same* key with the very state the request read, the
///   CAS succeeds, and rightly: the decision is a pure function of that state. (A CAS on the
///   state word alone would let a stale request write into another key's fresh slot: the loom
///   model in this file fails for it.)
/// * **Inserts.** A key not found is inserted under its home line's lock (striped, 1024
///   stripes): under it, the key is looked for again over the home line's reach, then the
///   first free slot of the window is claimed by CAS (the reach raised first if needed). All
///   inserts of one key take the same lock, so a key is never in two slots; inserts of
///   different home lines still race for a slot, and the claim's CAS settles it. Checks of
///   present keys never take this lock.
/// * **Deletion and reuse.** Eviction CASes a slot's state to the tombstone (all ones) if it
///   is still the idle state it judged, exactly as the papaya store kills a cell. A free slot
///   is reused by the next insert whose window passes it. Reuse is safe because (a) look-ups
///   are bounded by the reach, not by empty slots, so a freed slot in a chain hides nothing
///   and (b) a stale request's CAS cannot land in the new owner (above).
/// * **Capacity.** As in the papaya store, a request inserting a key beyond
///   `max_keys + max_keys/4` first runs one capacity pass (down to 7/8 of `max_keys`), so
///   [`len`](CompactLimiter::len) stays below that plus one key per inserting thread, and
///   never above [`capacity`](CompactLimiter::capacity) (about `4/3 · max_keys`). When an
///   insert still finds its whole window live, it evicts the key in the window closest to
///   fresh (earliest [`Algorithm::idle_at`]) and takes its slot; at a load of 3/4 that does
///   not happen in practice (the longest probe was at most 62 lines at 10^6 keys and 65 at
///   10^7, against a window of 128). A sweep also evicts down to 7/8 of `max_keys` when more
///   are held (by an exact selection of the earliest `idle_at`, not a sample; keys tied at
///   the threshold, as a flood on a coarse clock makes them, are evicted evenly over the
///   table, never the first ones met, which would pile the survivors up in one region).
///
/// # Costs and limits
///
/// * Memory is reserved at build for `max_keys` (about 21 bytes per key of `max_keys` for the
///   lock-free slot, more for lock slots) and never grows or shrinks.
/// * A sweep walks the whole table: O(capacity), not O(keys held). 1M slots take ~8 ms.
/// * A key seen for the first time takes its home line's stripe lock (a `parking_lot` mutex,
///   shared with the keys of 1/1024 of the lines) and scans its window for a free slot.
/// * Reaches only grow. Under long churn a home line's reach tends to the longest probe any
///   of its keys ever needed, so a look-up of an *absent* key (an insert) scans a few more
///   lines; look-ups of present keys are unaffected.
/// * Lock-free only for 64-bit key forms with one-word states; see **Slots**.
///
/// # Choosing it, and the crates evaluated first
///
/// The papaya store ([`KeyedLimiter`](crate::KeyedLimiter)) takes any key and grows; this one
/// takes fixed-size keys, reserves its memory up front and never grows. Before writing it we
/// looked for a crate that keeps a CAS-updatable state word inline with its key and supports
/// lossless removal. `leapfrog` (LeapMap, 0.3, last release 2023) stores key and value as
/// separate atomics and updates the value alone, so a value CAS cannot tell that its key was
/// removed and the cell reused; it reserves value bit patterns and resizes by migration.
/// `scc` (maintained) updates entries under per-bucket locks. `dashmap` shards `RwLock`ed
/// `HashMap`s (104 ns per check at 1M keys, measured). `flurry` allocates a node per entry
/// behind epoch reclamation, like papaya. `concurrent-map` is a B+ tree whose updates replace
/// whole values by allocation. None gives a compare-and-swap over key and state together, so
/// none can evict without risking a lost update; hence this module.
///
/// # The hot path
///
/// With the [`Cas`] variant and a 64-bit key form ([`u64`], [`u32`], [`Ipv4Addr`],
/// [`Hashed`]) and a one-word state ([`Gcra`], [`Earrrl`](crate::algo::Earrrl),
/// [`FixedWindow`](crate::algo::FixedWindow)), the hot path for a present key is: clock read
/// → hash → load the home line's slots → pure algorithm step → one 128-bit
/// `compare_exchange_weak`. No lock, no allocation, one cache line in the common case.
///
/// **Consistency.** As for the papaya store: decisions are linearizable per key, no update
/// is lost to eviction, and at one fixed `now`, N threads firing at one key get exactly as
/// many allowed as one thread would. Unlike it, the key count is bounded by
/// [`capacity`](CompactLimiter::capacity), fixed at build.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
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
/// assert!(limiter.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CompactLimiter<K: CompactKey, A: Algorithm, C = QuantaClock, V: CompactVariant<A> = Cas>
{
    shared: Arc<Shared<K, A, C, V>>,
    /// Stops and joins the background sweeper (if any) when the limiter is dropped.
    _sweeper: Option<Sweeper>,
}

/// Everything the requests and the sweeper thread share.
struct Shared<K: CompactKey, A: Algorithm, C, V: CompactVariant<A>> {
    lines: Box<[Line<SlotOf<K, A, V>>]>,
    /// Per home line: how many lines past it any of its keys was ever placed. Raised under
    /// the line's stripe lock, never lowered; bounded by `window - 1`.
    reach: Box<[AtomicU8]>,
    stripes: Box<[CachePadded<Mutex<()>>]>,
    /// Lines a key may be placed in, from its home line: `min(WINDOW_LINES, lines)`.
    window: usize,
    hasher: ahash::RandomState,
    algo: A,
    clock: C,
    stats: Stats,
    /// Keys held. Signed: a slot may be freed by a sweep before its inserter counts it.
    len: CachePadded<AtomicI64>,
    max_keys: usize,
    grace_ns: u64,
    signal: Arc<Signal>,
    totals: Totals,
    /// Keys evicted by inserts that found their window full.
    window_evictions: AtomicU64,
    /// Whether decisions are counted (see [`CompactBuilder::metrics`]).
    counting: bool,
    _key: PhantomData<fn() -> K>,
}

/// Configures a [`CompactLimiter`]: capacity, clock, background sweeper, metrics.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CompactLimiter};
/// use std::time::Duration;
///
/// let limiter = CompactLimiter::<u64, Gcra>::builder("100/s burst 20".parse()?)
///     .max_keys(1_000_000)                  // ~22 MB, allocated now
///     .sweep_every(Duration::from_secs(10)) // drop idle keys in the background
///     .build()?;
/// assert!(limiter.capacity() >= 1_000_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct CompactBuilder<K, A, C, V> {
    algo: A,
    clock: C,
    max_keys: usize,
    sweep_every: Option<Duration>,
    grace: Duration,
    metrics: bool,
    _marker: PhantomData<fn() -> (K, V)>,
}

impl<K, A, C: fmt::Debug, V> fmt::Debug for CompactBuilder<K, A, C, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompactBuilder")
            .field("clock", &self.clock)
            .field("max_keys", &self.max_keys)
            .field("sweep_every", &self.sweep_every)
            .field("grace", &self.grace)
            .field("metrics", &self.metrics)
            .finish()
    }
}

impl<K, A, C, V> CompactBuilder<K, A, C, V> {
    /// Uses `clock` instead of the default TSC clock.
    pub fn clock<C2: Clock>(self, clock: C2) -> CompactBuilder<K, A, C2, V> {
        CompactBuilder {
            algo: self.algo,
            clock,
            max_keys: self.max_keys,
            sweep_every: self.sweep_every,
            grace: self.grace,
            metrics: self.metrics,
            _marker: PhantomData,
        }
    }

    /// Sizes the table for `max_keys` keys at a load of 3/4 (default [`DEFAULT_MAX_KEYS`]):
    /// [`capacity`](CompactLimiter::capacity) is about `4/3 · max_keys` slots, 16 bytes each
    /// for the lock-free slot, allocated and initialized at build (resident from then on). The
    /// table never grows.
    ///
    /// A sweep that finds more than `max_keys` keys evicts those closest to fresh (earliest
    /// [`Algorithm::idle_at`]) down to 7/8 of it, and an insert beyond `max_keys` wakes the
    /// background sweeper. A request inserting a key beyond `max_keys + max_keys/4` runs one
    /// such eviction pass itself first (O(capacity): a flood that outruns the sweeper pays for
    /// its own eviction), so the table stays below that plus one key per inserting thread; an
    /// insert that still finds its probe window full evicts the window's key closest to
    /// fresh. Either way an evicted client starts over as a fresh key.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Runs a background sweeper thread every `interval` (and sooner when more than
    /// `max_keys` keys are held). It never blocks `check`, and is stopped and joined when the
    /// limiter is dropped.
    pub fn sweep_every(mut self, interval: Duration) -> Self {
        self.sweep_every = Some(interval);
        self
    }

    /// Idle sweeps judge idleness at `now − grace` (default
    /// [`DEFAULT_SWEEP_GRACE`](crate::DEFAULT_SWEEP_GRACE)), as
    /// [`Builder::sweep_grace`](crate::Builder::sweep_grace).
    pub fn sweep_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Counts allowed and denied decisions for [`CompactLimiter::metrics`] (off by default:
    /// a `fetch_add` per request, on a per-thread stripe), as
    /// [`Builder::metrics`](crate::Builder::metrics).
    pub fn metrics(mut self, enabled: bool) -> Self {
        self.metrics = enabled;
        self
    }
}

impl<K, A, C, V> CompactBuilder<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: CompactVariant<A>,
{
    /// Allocates the table and builds the limiter, starting the background sweeper if one
    /// was asked for. Fails (`ErrorKind::OutOfMemory`) if the table cannot be allocated, or if
    /// the sweeper thread cannot be spawned.
    pub fn build(self) -> std::io::Result<CompactLimiter<K, A, C, V>> {
        let mut shared = Shared::new(self.algo, self.clock, self.max_keys, self.grace)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, e))?;
        shared.counting = self.metrics;
        let shared = Arc::new(shared);
        let sweeper = match self.sweep_every {
            None => None,
            Some(interval) => {
                let s = shared.clone();
                Some(Sweeper::spawn(
                    shared.signal.clone(),
                    interval,
                    move || {
                        s.sweep();
                    },
                )?)
            }
        };
        Ok(CompactLimiter {
            shared,
            _sweeper: sweeper,
        })
    }
}

/// Probe lengths of the keys held: how far from its home line each key sits. See
/// [`CompactLimiter::probe_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProbeStats {
    /// Keys held.
    pub keys: u64,
    /// Mean number of lines a look-up of a held key scans (1 = found in its home line).
    pub mean_lines: f64,
    /// The most lines a look-up of a held key scans.
    pub max_lines: u64,
    /// Share of keys found in their home line.
    pub in_home_line: f64,
    /// The largest reach of any home line (lines a miss scans past the home line).
    pub max_reach: u64,
    /// Lines in the table.
    pub lines: u64,
}

impl<K: CompactKey, A: Algorithm, V: CompactVariant<A>> CompactLimiter<K, A, QuantaClock, V> {
    /// A builder for a limiter running `algo`.
    pub fn builder(algo: A) -> CompactBuilder<K, A, QuantaClock, V> {
        CompactBuilder {
            algo,
            clock: QuantaClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            sweep_every: None,
            grace: DEFAULT_SWEEP_GRACE,
            metrics: false,
            _marker: PhantomData,
        }
    }

    /// A limiter for [`DEFAULT_MAX_KEYS`] keys running `algo` on the default clock, without
    /// background sweeps.
    pub fn new(algo: A) -> Self {
        Self::with_clock(algo, QuantaClock::new())
    }
}

impl<K, A, C, V> CompactLimiter<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: CompactVariant<A>,
{
    /// A limiter for [`DEFAULT_MAX_KEYS`] keys running `algo` on `clock`, without background
    /// sweeps.
    pub fn with_clock(algo: A, clock: C) -> Self {
        match Shared::new(algo, clock, DEFAULT_MAX_KEYS, DEFAULT_SWEEP_GRACE) {
            Ok(shared) => Self {
                shared: Arc::new(shared),
                _sweeper: None,
            },
            // Out of memory for a default table (a few MB): abort, as any allocation would.
            Err(_) => {
                std::alloc::handle_alloc_error(std::alloc::Layout::new::<Line<SlotOf<K, A, V>>>())
            }
        }
    }

    /// Decides a request of cost 1 for `key`.
    #[inline]
    pub fn check(&self, key: &K::Lookup) -> Decision {
        let sh = &*self.shared;
        let now = sh.clock.now();
        sh.count(sh.apply(key, |state| sh.algo.update(state, now, 1)))
    }

    /// Decides a request of `cost` for `key`. Errors (and counts nothing) if `cost` is 0 or
    /// above the algorithm's capacity.
    #[inline]
    pub fn check_n(&self, key: &K::Lookup, cost: u64) -> Result<Decision, CostError> {
        let sh = &*self.shared;
        check_cost(cost, sh.algo.capacity())?;
        let now = sh.clock.now();
        Ok(sh.count(sh.apply(key, |state| sh.algo.update(state, now, cost))))
    }

    /// The decision [`check`](CompactLimiter::check) would return now, without counting it:
    /// no state changes and an unknown key is not inserted.
    #[inline]
    pub fn peek(&self, key: &K::Lookup) -> Decision {
        let sh = &*self.shared;
        sh.peek(key, 1, sh.clock.now())
    }

    /// The decision [`check_n`](CompactLimiter::check_n) would return now, without counting
    /// it; errors as `check_n` does.
    #[inline]
    pub fn peek_n(&self, key: &K::Lookup, cost: u64) -> Result<Decision, CostError> {
        let sh = &*self.shared;
        check_cost(cost, sh.algo.capacity())?;
        Ok(sh.peek(key, cost, sh.clock.now()))
    }

    /// Waits on the calling thread (sleeping with the clock) until a request of cost 1 for
    /// `key` is allowed; see
    /// [`KeyedLimiter::until_ready_blocking`](crate::KeyedLimiter::until_ready_blocking).
    pub fn until_ready_blocking(&self, key: &K::Lookup) -> Decision {
        let sleep = |d| self.shared.clock.sleep(d);
        let (peek, check) = (|| Ok(self.peek(key)), || self.check(key));
        wait::infallible(wait::until_ready_blocking(
            peek,
            check,
            || self.shared.clock.now(),
            Jitter::NONE,
            sleep,
        ))
    }

    /// Drops every key whose state is equivalent to a fresh key's at `now − grace` (so no
    /// future decision changes), then, if more than `max_keys` keys are still held, evicts
    /// down to 7/8 of it. Safe to run while other threads `check`. Returns what it did.
    pub fn sweep(&self) -> SweepReport {
        self.shared.sweep()
    }

    /// Totals over every sweep so far; `evicted_capacity` also counts keys evicted by inserts
    /// that found their probe window full.
    pub fn sweep_totals(&self) -> SweepTotals {
        let mut totals = self.shared.totals.snapshot();
        totals.evicted_capacity += self.shared.window_evictions.load(Ordering::Relaxed);
        totals
    }

    /// The number of keys held (at most [`capacity`](CompactLimiter::capacity)).
    pub fn len(&self) -> usize {
        self.shared.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of slots: the most keys the table can ever hold.
    pub fn capacity(&self) -> usize {
        self.shared.lines.len() * SLOTS_PER_LINE
    }

    /// The `max_keys` the table was sized for.
    pub fn max_keys(&self) -> usize {
        self.shared.max_keys
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.shared.algo
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.shared.clock
    }

    /// CAS retries so far (always zero for lock slots).
    pub fn cas_stats(&self) -> CasStats {
        self.shared.stats.snapshot()
    }

    /// A snapshot of the counters: decisions (if [counted](CompactBuilder::metrics)), retries,
    /// sweeps, evictions (window evictions under `evicted_capacity`, as in
    /// [`sweep_totals`](CompactLimiter::sweep_totals)), keys.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock};
    ///
    /// let limiter = CompactLimiter::<u64, Gcra>::builder("10/s burst 2".parse()?)
    ///     .clock(ManualClock::new())
    ///     .metrics(true)
    ///     .build()?;
    /// for key in [1, 1, 1, 2] {
    ///     limiter.check(&key);
    /// }
    /// let m = limiter.metrics();
    /// assert_eq!((m.allowed, m.denied, m.keys), (3, 1, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> Metrics {
        Metrics::new(&self.shared.stats, self.sweep_totals(), self.len())
    }

    /// Walks the table and measures how far the keys held sit from their home lines. A
    /// snapshot, not atomic with concurrent inserts; O(capacity).
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock};
    ///
    /// let l = CompactLimiter::<u64, Gcra>::builder("1/s".parse()?)
    ///     .max_keys(10_000)
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// for key in 0..10_000 {
    ///     l.check(&key);
    /// }
    /// let stats = l.probe_stats();
    /// assert_eq!(stats.keys, 10_000);
    /// assert!(stats.mean_lines < 1.5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn probe_stats(&self) -> ProbeStats {
        self.shared.probe_stats()
    }
}

impl<K, C, V> CompactLimiter<K, Gcra, C, V>
where
    K: CompactKey,
    C: Clock,
    V: CompactVariant<Gcra>,
{
    /// Pacing: admits a request of `cost` for `key` now with the delay after which it
    /// conforms, if that delay is at most `max_wait`; otherwise counts nothing.
    /// See [`Gcra::reserve`].
    ///
    /// ```
    /// use hotlimit::{algo::{Gcra, Reservation}, CompactLimiter, ManualClock};
    /// use std::time::Duration;
    ///
    /// let l = CompactLimiter::<u32, _, _>::with_clock("10/s burst 1".parse::<Gcra>()?, ManualClock::new());
    /// let wait = Duration::from_secs(1);
    /// assert_eq!(l.reserve(&7, 1, wait), Ok(Reservation::Admitted { delay: Duration::ZERO }));
    /// assert_eq!(l.reserve(&7, 1, wait), Ok(Reservation::Admitted { delay: Duration::from_millis(100) }));
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn reserve(
        &self,
        key: &K::Lookup,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation, CostError> {
        let sh = &*self.shared;
        check_cost(cost, sh.algo.capacity())?;
        let max_wait = duration_to_nanos(max_wait);
        let now = sh.clock.now();
        let reservation = sh.apply(key, |tat| {
            let (reservation, new) = sh.algo.reserve(*tat, now, cost, max_wait);
            *tat = new.unwrap_or(*tat);
            reservation
        });
        if sh.counting {
            sh.stats
                .decided(matches!(reservation, Reservation::Admitted { .. }));
        }
        Ok(reservation)
    }
}

/// The limiter's hasher: seeded at random per process and per limiter (hash flooding).
#[cfg(not(hotlimit_loom))]
fn hasher() -> ahash::RandomState {
    ahash::RandomState::new()
}

/// Under loom, fixed seeds: loom replays a model once per interleaving and needs every run to
/// take the same slots.
#[cfg(hotlimit_loom)]
fn hasher() -> ahash::RandomState {
    ahash::RandomState::with_seeds(1, 2, 3, 4)
}

/// `n` values from `make`, in memory reserved fallibly.
fn filled<T>(
    n: usize,
    make: impl FnMut() -> T,
) -> Result<Box<[T]>, std::collections::TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    v.extend(std::iter::repeat_with(make).take(n));
    Ok(v.into_boxed_slice())
}

/// `hash` scaled onto `0..n` by a multiply-shift (uses the hash's high bits).
#[inline(always)]
fn scale(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}

/// The slot of its home line a key tries first (bits of the hash `scale` barely uses).
#[inline(always)]
fn preferred_slot(fp: u64) -> usize {
    (fp >> 1) as usize % SLOTS_PER_LINE
}

impl<K, A, C, V> Shared<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: CompactVariant<A>,
{
    /// Allocates the table (fallibly: a `max_keys` beyond memory is an error, not an abort).
    fn new(
        algo: A,
        clock: C,
        max_keys: usize,
        grace: Duration,
    ) -> Result<Self, std::collections::TryReserveError> {
        let max_keys = max_keys.max(1);
        let slots = max_keys.saturating_mul(4).div_ceil(3);
        let lines = slots.div_ceil(SLOTS_PER_LINE).max(1);
        Ok(Self {
            lines: filled(lines, || Line(std::array::from_fn(|_| Slot::empty())))?,
            reach: filled(lines, || AtomicU8::new(0))?,
            stripes: filled(STRIPES.min(lines), || CachePadded::new(Mutex::new(())))?,
            window: WINDOW_LINES.min(lines),
            hasher: hasher(),
            algo,
            clock,
            stats: Stats::default(),
            len: CachePadded::new(AtomicI64::new(0)),
            max_keys,
            grace_ns: duration_to_nanos(grace),
            signal: Arc::default(),
            totals: Totals::default(),
            window_evictions: AtomicU64::new(0),
            counting: false,
            _key: PhantomData,
        })
    }

    fn len(&self) -> usize {
        // The count may run ahead of the slots for a moment (a slot killed and re-claimed
        // before its killer counts it down), never the slots themselves.
        let slots = self.lines.len() * SLOTS_PER_LINE;
        (self.len.load(Ordering::Relaxed).max(0) as usize).min(slots)
    }

    /// Counts `decision` if counting is on; returns it.
    #[inline(always)]
    fn count(&self, decision: Decision) -> Decision {
        if self.counting {
            self.stats.decided(decision.is_allowed());
        }
        decision
    }

    /// The line `d` lines past `home`, wrapping.
    #[inline(always)]
    fn line(&self, home: usize, d: usize) -> &Line<SlotOf<K, A, V>> {
        let mut i = home + d;
        if i >= self.lines.len() {
            i -= self.lines.len();
        }
        &self.lines[i]
    }

    /// `key`'s inline form, fingerprint and home line.
    #[inline(always)]
    fn locate(&self, key: &K::Lookup) -> (K::Repr, u64, usize) {
        let repr = K::repr(key, &self.hasher);
        let hash = K::place(repr, &self.hasher);
        // Odd, so never the lock slot's "free" hint (0).
        (repr, hash | 1, scale(hash, self.lines.len()))
    }

    /// Runs `f` on `key`'s state, inserting the key fresh on first sight and retrying if its
    /// slot is freed under it. Every request path goes through here.
    #[inline(always)]
    fn apply<T>(&self, key: &K::Lookup, mut f: impl FnMut(&mut A::State) -> T) -> T {
        let (repr, fp, home) = self.locate(key);
        loop {
            if let Some(out) = self.find_apply(repr, fp, home, &mut f) {
                return out;
            }
            let slot = self.insert(repr, fp, home);
            if let Some(out) = slot.try_update(repr, fp, &self.stats, &mut f) {
                return out;
            }
            // Freed (by a sweep or a window eviction) between the insert and the update.
        }
    }

    /// A step on a copy of `key`'s state, or of a fresh one if the key is absent: the
    /// look-up of `find_apply` without the write, and no insert.
    fn peek(&self, key: &K::Lookup, cost: u64, now: u64) -> Decision {
        let (repr, fp, home) = self.locate(key);
        let reach = self.reach[home].load(Ordering::Acquire) as usize;
        for d in 0..=reach {
            for slot in &self.line(home, d).0 {
                // `holds` is the cheap filter; `inspect` re-checks the key on the state it
                // reads, since the slot may change owner in between.
                if !slot.holds(repr, fp) {
                    continue;
                }
                let peeked =
                    slot.inspect(|k, state| (k == repr).then(|| self.algo.peek(state, now, cost)));
                if let Some(Some(decision)) = peeked {
                    return decision;
                }
            }
        }
        self.algo.peek(&self.algo.fresh(), now, cost)
    }

    /// The lock-free look-up: the home line, then (only if the key is not there) as many
    /// lines as the home line's reach.
    #[inline(always)]
    fn find_apply<T>(
        &self,
        repr: K::Repr,
        fp: u64,
        home: usize,
        f: &mut impl FnMut(&mut A::State) -> T,
    ) -> Option<T> {
        // The home line from the key's preferred slot: most keys sit in it (see `insert`), so
        // the first probe usually matches and the branch predicts well.
        let line = &self.lines[home].0;
        let first = preferred_slot(fp);
        for i in 0..SLOTS_PER_LINE {
            let slot = &line[(first + i) % SLOTS_PER_LINE];
            if let Some(out) = slot.try_update(repr, fp, &self.stats, f) {
                return Some(out);
            }
        }
        let reach = self.reach[home].load(Ordering::Acquire) as usize;
        for d in 1..=reach {
            for slot in &self.line(home, d).0 {
                if let Some(out) = slot.try_update(repr, fp, &self.stats, f) {
                    return Some(out);
                }
            }
        }
        None
    }

    /// The slot holding `repr`, inserted fresh if absent. Serialized per home line: every
    /// insert of one key takes the same stripe lock, so under it the key is either found
    /// within the home line's reach or absent from the table.
    #[cold]
    #[inline(never)]
    fn insert(&self, repr: K::Repr, fp: u64, home: usize) -> &SlotOf<K, A, V> {
        // Rather than let a flood fill the table, so that every new key scans a full window
        // and evicts one key from it. Before the stripe lock: a pass is long.
        let len = self.len();
        evict_before_insert(len, self.max_keys, &self.totals, || {
            self.evict_capacity(len)
        });
        let _stripe = self.stripes[home % self.stripes.len()].lock();
        loop {
            // Only this stripe's holders raise this reach, so it is stable while we hold it.
            let reach = self.reach[home].load(Ordering::Acquire) as usize;
            for d in 0..=reach {
                for slot in &self.line(home, d).0 {
                    if slot.holds(repr, fp) {
                        return slot;
                    }
                }
            }
            match self.first_free(home, fp) {
                Some((d, slot)) => {
                    if d > reach {
                        // Raised before the claim, so the reach covers the key from the moment
                        // it is visible; a look-up that read the old reach misses, comes here
                        // and waits for us.
                        self.reach[home].fetch_max(d as u8, Ordering::AcqRel);
                    }
                    if slot.claim(repr, fp, self.algo.fresh()) {
                        let len = self.len.fetch_add(1, Ordering::Relaxed) + 1;
                        // Woken after the insert, so the sweep it triggers sees this key.
                        if len > self.max_keys as i64 {
                            self.signal.wake();
                        }
                        return slot;
                    }
                    // Another home line's insert took that slot first: look again.
                }
                None => self.evict_in_window(home),
            }
        }
    }

    /// The first free slot of `home`'s window (in the home line, from the key's preferred
    /// slot) and its distance in lines.
    fn first_free(&self, home: usize, fp: u64) -> Option<(usize, &SlotOf<K, A, V>)> {
        let line = &self.lines[home].0;
        let first = preferred_slot(fp);
        if let Some(slot) = (0..SLOTS_PER_LINE)
            .map(|i| &line[(first + i) % SLOTS_PER_LINE])
            .find(|s| s.looks_free())
        {
            return Some((0, slot));
        }
        (1..self.window).find_map(|d| {
            self.line(home, d)
                .0
                .iter()
                .find(|s| s.looks_free())
                .map(|s| (d, s))
        })
    }

    /// The window is full: evicts its key closest to fresh (earliest `idle_at`).
    #[cold]
    fn evict_in_window(&self, home: usize) {
        let victim = (0..self.window)
            .flat_map(|d| self.line(home, d).0.iter())
            .filter_map(|s| s.inspect(|_, state| (self.algo.idle_at(state), s)))
            .min_by_key(|&(idle_at, _)| idle_at);
        if let Some((idle_at, slot)) = victim {
            if slot.kill_if(|state| self.algo.idle_at(state) <= idle_at) {
                self.len.fetch_sub(1, Ordering::Relaxed);
                self.window_evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn slots(&self) -> impl Iterator<Item = &SlotOf<K, A, V>> {
        self.lines.iter().flat_map(|line| line.0.iter())
    }

    fn sweep(&self) -> SweepReport {
        let started = Instant::now();
        // Capped like the algorithms' own `now`: a saturated `idle_at` is never reached.
        let now = clamp(self.clock.now()).saturating_sub(self.grace_ns);
        let mut report = SweepReport::default();
        for slot in self.slots() {
            if self.signal.stopping() {
                break;
            }
            if slot.inspect(|_, _| ()).is_none() {
                continue;
            }
            report.scanned += 1;
            if slot.kill_if(|state| self.algo.idle_at(state) <= now) {
                report.evicted_idle += 1;
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let len = self.len();
        if len > self.max_keys {
            report.evicted_capacity = self.evict_capacity(len);
        }
        report.elapsed = started.elapsed();
        self.totals.add(&report);
        report
    }

    /// Evicts `len − 7/8·max_keys` keys, those closest to fresh (earliest `idle_at`) first.
    /// Exact, unlike the papaya store's sampled threshold: the sweep walks the flat table
    /// anyway, so it collects every key's `idle_at` (8 bytes per key, for the sweep's
    /// duration) and selects the [`CapacityCut`] in linear time; one more pass kills the keys
    /// it dooms, ties spread over the table. Keys updated meanwhile are judged on their new
    /// state.
    fn evict_capacity(&self, len: usize) -> u64 {
        let target = self.max_keys - self.max_keys / 8;
        let mut idle: Vec<u64> = self
            .slots()
            .filter_map(|s| s.inspect(|_, state| self.algo.idle_at(state)))
            .collect();
        let held = idle.len() as u64;
        let excess = (len.saturating_sub(target) as u64).min(held);
        let Some(cut) = CapacityCut::new(&mut idle, excess, held) else {
            return 0;
        };
        drop(idle);
        let mut evicted = 0;
        for slot in self.slots() {
            if self.signal.stopping() {
                break;
            }
            let doomed = cut.judge();
            if slot.kill_if(|state| doomed(self.algo.idle_at(state))) {
                evicted += 1;
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
        evicted
    }

    fn probe_stats(&self) -> ProbeStats {
        let lines = self.lines.len();
        let mut stats = ProbeStats {
            lines: lines as u64,
            ..ProbeStats::default()
        };
        let (mut total, mut home_hits) = (0u64, 0u64);
        for (i, line) in self.lines.iter().enumerate() {
            for slot in &line.0 {
                let Some(repr) = slot.inspect(|repr, _| repr) else {
                    continue;
                };
                let home = scale(K::place(repr, &self.hasher), lines);
                let d = (i + lines - home) % lines;
                let scanned = d as u64 + 1;
                stats.keys += 1;
                total += scanned;
                home_hits += (d == 0) as u64;
                stats.max_lines = stats.max_lines.max(scanned);
            }
        }
        if stats.keys > 0 {
            stats.mean_lines = total as f64 / stats.keys as f64;
            stats.in_home_line = home_hits as f64 / stats.keys as f64;
        }
        stats.max_reach = self
            .reach
            .iter()
            .map(|r| u64::from(r.load(Ordering::Relaxed)))
            .max()
            .unwrap_or(0);
        stats
    }
}

impl<K, A, C, V> RateLimiter<K::Lookup> for CompactLimiter<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: CompactVariant<A>,
{
    #[inline]
    fn check_n(&self, key: &K::Lookup, cost: u64) -> Result<Decision, CostError> {
        CompactLimiter::check_n(self, key, cost)
    }

    #[inline]
    fn check(&self, key: &K::Lookup) -> Decision {
        CompactLimiter::check(self, key)
    }

    #[inline]
    fn peek_n(&self, key: &K::Lookup, cost: u64) -> Result<Decision, CostError> {
        CompactLimiter::peek_n(self, key, cost)
    }

    #[inline]
    fn peek(&self, key: &K::Lookup) -> Decision {
        CompactLimiter::peek(self, key)
    }

    fn until_ready_blocking(&self, key: &K::Lookup) -> Decision {
        CompactLimiter::until_ready_blocking(self, key)
    }

    fn len(&self) -> usize {
        CompactLimiter::len(self)
    }

    fn sweep(&self) -> SweepReport {
        CompactLimiter::sweep(self)
    }
}

impl<K, A, C, V> fmt::Debug for CompactLimiter<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm + fmt::Debug,
    C: fmt::Debug,
    V: CompactVariant<A>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sh = &*self.shared;
        f.debug_struct("CompactLimiter")
            .field("algo", &sh.algo)
            .field("clock", &sh.clock)
            .field("keys", &sh.len.load(Ordering::Relaxed).max(0))
            .field("capacity", &(sh.lines.len() * SLOTS_PER_LINE))
            .field("max_keys", &sh.max_keys)
            .field("cas", &sh.stats)
            .field("sweeps", &sh.totals.snapshot())
            .finish()
    }
}

/// loom models of the compact table: inserts of one key racing each other, and a sweep racing
/// requests while another key takes the freed slot (the ABA case).
///
/// `RUSTFLAGS="--cfg hotlimit_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --lib loom`.
/// The table, slots, stripe locks and reach counters are the real ones, on loom's atomics and
/// mutexes; the 128-bit pair is modelled by a loom mutex (see `sync::Atomic128`). A table of
/// 3 keys is one line of 4 slots, so every key shares the home line and competes for slots.
#[cfg(all(test, hotlimit_loom))]
mod loom_tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::decision::Policy;
    use loom::sync::Arc;
    use loom::thread;

    const T: u64 = 10_000_000; // 100/s
    const NOW: u64 = 1_000_000_000;

    type Limiter<V> = CompactLimiter<u64, Gcra, ManualClock, V>;

    fn limiter<V: CompactVariant<Gcra>>(policy: Policy) -> (Limiter<V>, ManualClock) {
        let g = "100/s burst 1".parse::<Gcra>().unwrap().with_policy(policy);
        let clock = ManualClock::new();
        let l = CompactLimiter::builder(g)
            .max_keys(3)
            .clock(clock.clone())
            .sweep_grace(Duration::ZERO)
            .build()
            .unwrap();
        (l, clock)
    }

    /// The state a key is left in, read through a probe request: with burst 1 and tat ≥ now
    /// the probe is denied, and its retry_after pins tat (leaky: tat − now).
    fn leaky_wait<V: CompactVariant<Gcra>>(l: &Limiter<V>, key: u64) -> u64 {
        let d = l.check(&key);
        assert!(d.is_denied(), "key {key} admitted by the probe: {d:?}");
        d.retry_after_nanos()
    }

    /// Two threads insert the same new key at once: exactly one request admitted, one key
    /// held, one slot used.
    fn concurrent_inserts<V: CompactVariant<Gcra>>() {
        loom::model(|| {
            let (l, clock) = limiter::<V>(Policy::Leaky);
            clock.set_nanos(NOW);
            let l = Arc::new(l);
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let l = l.clone();
                    thread::spawn(move || l.check(&7).is_allowed())
                })
                .collect();
            let allowed = hs.into_iter().map(|h| h.join().unwrap());
            assert_eq!(allowed.filter(|&a| a).count(), 1);
            assert_eq!(l.len(), 1);
            assert_eq!(l.probe_stats().keys, 1);
            assert_eq!(leaky_wait(&l, 7), T);
        });
    }

    #[test]
    fn loom_compact_concurrent_inserts_of_one_key() {
        concurrent_inserts::<Cas>();
    }

    /// The same through lock slots: the hint word read without the lock, the entry under it.
    #[test]
    fn loom_compact_locked_concurrent_inserts_of_one_key() {
        concurrent_inserts::<Locked>();
    }

    /// A request for key 7 races a sweep that may evict it, while a request for a new key
    /// (one that prefers 7's slot) may take the freed slot. Whatever the interleaving, each
    /// key ends with exactly its own request counted: a stale CAS for 7 never lands in the
    /// other key's slot and 7's request is never lost. With `prefill`, 7 starts idle
    /// (tat = T); without, the request inserts 7 fresh, and the sweep can free the slot
    /// between that insert and the request's CAS, so the other key may be installed in it
    /// with the very state (fresh) 7's request read: only the key half of the pair CAS stops
    /// the stale write (a state-only CAS fails this model).
    fn evict_vs_check<V: CompactVariant<Gcra>>(policy: Policy, prefill: bool) {
        loom::model(move || {
            let (l, clock) = limiter::<V>(policy);
            // A second key that prefers the same slot as 7, so it takes 7's slot when the
            // sweep frees it (the reuse under test), not a free neighbour.
            let pref = |k: u64| preferred_slot(l.shared.locate(&k).1);
            let other = (8..).find(|&k| pref(k) == pref(7)).unwrap();
            if prefill {
                l.check(&7); // tat = T
            }
            clock.set_nanos(NOW); // 7 is idle now
            let l = Arc::new(l);
            let a = {
                let l = l.clone();
                thread::spawn(move || l.check(&7).is_allowed())
            };
            let b = {
                let l = l.clone();
                thread::spawn(move || {
                    l.sweep();
                })
            };
            let c = {
                let l = l.clone();
                thread::spawn(move || l.check(&other).is_allowed())
            };
            assert!(a.join().unwrap());
            b.join().unwrap();
            assert!(c.join().unwrap());
            assert_eq!(l.len(), 2);
            assert_eq!(l.probe_stats().keys, 2);
            // Each key: tat = NOW + T, so the probe waits exactly T (leaky) or 2T (strict:
            // the probe itself is counted).
            let want = if policy == Policy::Strict { 2 * T } else { T };
            assert_eq!(leaky_wait(&l, 7), want);
            assert_eq!(leaky_wait(&l, other), want);
        });
    }

    #[test]
    fn loom_compact_evict_idle_vs_check_leaky() {
        evict_vs_check::<Cas>(Policy::Leaky, true);
    }

    #[test]
    fn loom_compact_evict_fresh_vs_check_leaky() {
        evict_vs_check::<Cas>(Policy::Leaky, false);
    }

    #[test]
    fn loom_compact_locked_evict_fresh_vs_check_leaky() {
        evict_vs_check::<Locked>(Policy::Leaky, false);
    }

    #[test]
    fn loom_compact_evict_fresh_vs_check_strict() {
        evict_vs_check::<Cas>(Policy::Strict, false);
    }
}
