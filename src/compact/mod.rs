//! [`CompactLimiter`]: a fixed-capacity, open-addressing table for keys of a fixed small size,
//! with each key's state inline next to it: the key types ([`key`]), the table ([`table`])
//! and its slots ([`slot`]). The table's design is in `docs/DESIGN.md`, section 7.

mod key;
mod slot;
pub(crate) mod table;

pub use key::{CompactKey, Hashed};
pub use slot::{CompactState, CompactVariant, KeyRepr};
pub use table::{ProbeStats, DEFAULT_MAX_KEYS};

use crate::algo::{Algorithm, Gcra, Reconfigure, Reservation};
use crate::clock::{Clock, QuantaClock};
use crate::decision::{Decision, Ticket};
use crate::error::TicketError;
use crate::error::{ConfigError, CostError, QuotaError};
use crate::limiter::{rate_limiter_by_inherent, Cas};
use crate::live::Live;
use crate::shared::{sealed, Builder, KeyState, KeyedStore, Options};
use crate::stats::Metrics;
use crate::sweeper::{SweepReport, SweepTotals, Sweeper};
use crate::wait::{self, Jitter};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use table::{Table, SLOTS_PER_LINE};

/// A keyed rate limiter over a fixed-capacity, open-addressing table for keys of a fixed
/// small size (`u32`, `u64`, `u128`, IP addresses, or a 64-bit keyed hash of any key with
/// [`Hashed`]), with each key's state inline next to it.
///
/// ```
/// use hotlimit::{algo::Gcra, store::Hashed, CompactLimiter, ManualClock};
/// use std::net::{IpAddr, Ipv4Addr};
///
/// // Up to a million IPv4 clients, 10 requests per second each, bursts of 5: lock-free.
/// let limiter = CompactLimiter::<Ipv4Addr, Gcra>::builder("10/s burst 5".parse()?)
///     .max_keys(1_000_000)
///     .clock(ManualClock::new())
///     .build()?;
/// let client = Ipv4Addr::new(203, 0, 113, 7);
/// let allowed = (0..10).filter(|_| limiter.check(&client).is_allowed()).count();
/// assert_eq!(allowed, 5);
///
/// // Any address, IPv6 too, lock-free as a 64-bit keyed hash (see `Hashed` for collisions).
/// let any = CompactLimiter::<Hashed<IpAddr>, Gcra>::builder("10/s burst 5".parse()?)
///     .clock(ManualClock::new())
///     .build()?;
/// assert!(any.check(&IpAddr::V6("2001:db8::7".parse()?)).is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// **Which slots are lock-free.** A key form of 64 bits (`u32`, `u64`, `Ipv4Addr`,
/// [`Hashed`]) with a 64-bit state (GCRA, EARRRL, the fixed window) shares one 128-bit word
/// with its state, updated by one CAS: the lock-free slot. A 128-bit key form (`u128`,
/// `Ipv6Addr`, `IpAddr`) or a 128-bit state (the sliding and sub-windows, exponential, a
/// pair of quotas) needs more than one CAS covers, so its slot takes a per-slot lock (held
/// for one step, never across a call out) under either variant. On a target without a
/// 16-byte CAS (`portable-atomic` falls back to a lock there), every 128-bit word is behind
/// a lock.
///
/// **When to pick it.** The papaya store ([`KeyedLimiter`](crate::KeyedLimiter)) takes any
/// key and grows; this one takes fixed-size keys, reserves its memory at build (about
/// `4/3 · max_keys` slots of 16 bytes for the lock-free slot) and never grows, and keeps key
/// and state in one slot, four to a cache line, so a check of a present key touches one line
/// in the common case. It is the store to pick from about 100k keys (a proxy keyed by client
/// IP; any key through [`Hashed`]): at a million keys it takes less than half the papaya
/// store's memory per key and its look-up misses the cache once, not twice.
/// The table's design, its costs and the crates evaluated before writing it are in
/// `docs/DESIGN.md` (section 7); measurements in `BENCHMARKS.md`.
///
/// **Sizing.** `max_keys` is both the capacity bound and the table's size: full, the table
/// holds keys in 3/4 of its slots, and about one key in seven sits past its home line, where
/// a look-up scans further. A `max_keys` above the keys you expect to hold buys speed with
/// memory: the look-ups get shorter, and while the table fits the CPU's cache every check
/// gets faster; past the cache a larger table also misses more, so only batches gain there
/// (`BENCHMARKS.md`, "the table's fill").
///
/// **The hot path.** With the [`Cas`] variant and a 64-bit key form ([`u64`], [`u32`], [`Ipv4Addr`](std::net::Ipv4Addr),
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
    pub(crate) table: Arc<Table<K, A, C, V>>,
    /// Stops and joins the background sweeper (if any) when the limiter is dropped.
    _sweeper: Option<Sweeper>,
}

impl<K: CompactKey, A: Algorithm, V: CompactVariant<A>> CompactLimiter<K, A, QuantaClock, V> {
    /// A limiter for [`DEFAULT_MAX_KEYS`] keys running `algo` on the default clock, without
    /// background sweeps.
    pub fn new(algo: A) -> Self {
        Self::with_clock(algo, QuantaClock::new())
    }

    /// A limiter for [`DEFAULT_MAX_KEYS`] keys running `algo` on `clock`, without background
    /// sweeps.
    pub fn with_clock<C: Clock>(algo: A, clock: C) -> CompactLimiter<K, A, C, V> {
        match Table::new(algo, clock, &Options::default()) {
            Ok(table) => CompactLimiter {
                table: Arc::new(table),
                _sweeper: None,
            },
            // Out of memory for a default table (a few MB): abort, as any allocation would.
            Err(_) => std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; 64]>()),
        }
    }

    /// A builder for a limiter running `algo`: capacity ([`Builder::max_keys`], which sizes
    /// the table), clock, background sweeper, metrics.
    pub fn builder(algo: A) -> Builder<Self, A> {
        Builder::new(algo)
    }
}

impl<K: CompactKey, A: Algorithm, V: CompactVariant<A>> sealed::Keyed
    for CompactLimiter<K, A, QuantaClock, V>
{
}
impl<K: CompactKey, A: Algorithm, V: CompactVariant<A>> KeyedStore
    for CompactLimiter<K, A, QuantaClock, V>
{
}

impl<K, A, C, V> Builder<CompactLimiter<K, A, QuantaClock, V>, A, C>
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
        let table = Table::new(self.algo, self.clock, &self.options)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, e))?;
        let table = Arc::new(table);
        let sweeper = table.core.spawn_sweeper(&table, |t| {
            t.sweep();
        })?;
        Ok(CompactLimiter {
            table,
            _sweeper: sweeper,
        })
    }
}

impl<K, A, C, V> CompactLimiter<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: CompactVariant<A>,
{
    /// Decides a request of cost 1 for `key`.
    #[inline]
    pub fn check(&self, key: &K::Lookup) -> Decision {
        self.decide(key, 1)
    }

    /// Decides a request of `cost` for `key`. Errors (and counts nothing) if `cost` is 0 or
    /// above the algorithm's capacity.
    #[inline]
    pub fn check_n(&self, key: &K::Lookup, cost: u64) -> Result<Decision, CostError> {
        self.table.core.cost(cost)?;
        Ok(self.decide(key, cost))
    }

    /// The decision [`check`](CompactLimiter::check) would return now, without counting it:
    /// no state changes and an unknown key is not inserted.
    #[inline]
    pub fn peek(&self, key: &K::Lookup) -> Decision {
        self.table.peek(key, 1, self.table.core.clock.now())
    }

    /// The decision [`check_n`](CompactLimiter::check_n) would return now, without counting
    /// it; errors as `check_n` does.
    #[inline]
    pub fn peek_n(&self, key: &K::Lookup, cost: u64) -> Result<Decision, CostError> {
        self.table.core.cost(cost)?;
        Ok(self.table.peek(key, cost, self.table.core.clock.now()))
    }

    /// Decides a batch of requests of cost 1, one per key, in order: `out` is cleared, then
    /// holds one decision per key, each what [`check`](CompactLimiter::check) would have
    /// returned at that point of the sequence, all at one instant (one clock read). The
    /// batch's home lines are loaded back to back before any decision, so their cache misses
    /// overlap; see [`KeyedLimiter::check_batch`](crate::KeyedLimiter::check_batch).
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CompactLimiter, ManualClock};
    ///
    /// let l = CompactLimiter::<u64, Gcra>::with_clock("10/s burst 2".parse()?, ManualClock::new());
    /// let mut out = Vec::new();
    /// l.check_batch(&[7, 8, 7, 7], &mut out);
    /// let allowed: Vec<bool> = out.iter().map(|d| d.is_allowed()).collect();
    /// assert_eq!(allowed, [true, true, true, false]);
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn check_batch<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k K::Lookup>,
        out: &mut Vec<Decision>,
    ) where
        K::Lookup: 'k,
    {
        out.clear();
        let requests = keys.into_iter().map(|key| (key, 1));
        // Cost 1 is never refused (capacities are at least 1): every answer is a decision.
        self.decide_batch(requests, |_| Ok(()), |answer| out.extend(answer.ok()));
    }

    /// Decides a batch of `(key, cost)` requests in order, as one
    /// [`check_n`](CompactLimiter::check_n) each: `out` is cleared, then holds one answer per
    /// request; a refused cost is that request's error and counts nothing.
    pub fn check_n_batch<'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k K::Lookup, u64)>,
        out: &mut Vec<Result<Decision, CostError>>,
    ) where
        K::Lookup: 'k,
    {
        out.clear();
        let core = &self.table.core;
        self.decide_batch(requests, |cost| core.cost(cost), |answer| out.push(answer));
    }

    #[inline(always)]
    fn decide_batch<'k>(
        &self,
        requests: impl IntoIterator<Item = (&'k K::Lookup, u64)>,
        valid: impl Fn(u64) -> Result<(), CostError>,
        emit: impl FnMut(Result<Decision, CostError>),
    ) where
        K::Lookup: 'k,
    {
        let (table, core) = (&self.table, &self.table.core);
        let now = core.clock.now();
        let place = |key: &K::Lookup, cost| {
            valid(cost)?;
            Ok(table.locate(key))
        };
        let find = |_: &K::Lookup, &mut (_, fp, home): &mut _| {
            table.touch(fp, home);
        };
        let decide = |_: &K::Lookup, cost, (repr, fp, home)| {
            core.count(table.apply_at(repr, fp, home, |state| core.algo.update(state, now, cost)))
        };
        crate::batch::in_chunks(requests, place, find, decide, emit);
    }

    #[inline(always)]
    fn decide(&self, key: &K::Lookup, cost: u64) -> Decision {
        let core = &self.table.core;
        let now = core.clock.now();
        core.count(
            self.table
                .apply(key, |state| core.algo.update(state, now, cost)),
        )
    }

    /// Waits until a request of cost 1 for `key` is allowed and returns that decision (the
    /// request is counted); `sleep` is the runtime's timer. See
    /// [`KeyedLimiter::until_ready`](crate::KeyedLimiter::until_ready).
    pub async fn until_ready<F, Fut>(&self, key: &K::Lookup, sleep: F) -> Decision
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (peek, check) = (|| Ok(self.peek(key)), || self.check(key));
        wait::infallible(
            self.table
                .core
                .until_ready(Jitter::NONE, peek, check, sleep)
                .await,
        )
    }

    /// [`until_ready`](CompactLimiter::until_ready) for a request of `cost`, adding `jitter`
    /// to each wait; errors if the cost can never be admitted.
    pub async fn until_ready_with<F, Fut>(
        &self,
        key: &K::Lookup,
        cost: u64,
        jitter: Jitter,
        sleep: F,
    ) -> Result<Decision, CostError>
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (peek, check) = (|| self.peek_n(key, cost), || self.decide(key, cost));
        self.table
            .core
            .until_ready(jitter, peek, check, sleep)
            .await
    }

    /// [`until_ready`](CompactLimiter::until_ready) on the calling thread, sleeping with the
    /// limiter's clock.
    pub fn until_ready_blocking(&self, key: &K::Lookup) -> Decision {
        let (peek, check) = (|| Ok(self.peek(key)), || self.check(key));
        wait::infallible(
            self.table
                .core
                .until_ready_blocking(Jitter::NONE, peek, check),
        )
    }

    /// [`until_ready_blocking`](CompactLimiter::until_ready_blocking) for a request of
    /// `cost`, adding `jitter` to each wait; errors if the cost can never be admitted.
    pub fn until_ready_blocking_with(
        &self,
        key: &K::Lookup,
        cost: u64,
        jitter: Jitter,
    ) -> Result<Decision, CostError> {
        let (peek, check) = (|| self.peek_n(key, cost), || self.decide(key, cost));
        self.table.core.until_ready_blocking(jitter, peek, check)
    }

    /// Drops every key whose state is equivalent to a fresh key's at `now − grace` (so no
    /// future decision changes), then, if more than `max_keys` keys are still held, evicts
    /// down to 7/8 of it. Safe to run while other threads `check`. Returns what it did.
    pub fn sweep(&self) -> SweepReport {
        self.table.sweep()
    }

    /// Totals over every sweep so far; `evicted_capacity` also counts keys evicted by inserts
    /// that found their probe window full.
    pub fn sweep_totals(&self) -> SweepTotals {
        self.table.sweep_totals()
    }

    /// The number of keys held (at most [`capacity`](CompactLimiter::capacity)).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of slots: the most keys the table can ever hold.
    pub fn capacity(&self) -> usize {
        self.table.lines() * SLOTS_PER_LINE
    }

    /// The `max_keys` the table was sized for (always set here).
    pub fn max_keys(&self) -> Option<usize> {
        Some(self.table.max_keys)
    }

    /// The background sweeper's interval ([`Builder::sweep_every`]), if one runs.
    pub fn sweep_every(&self) -> Option<Duration> {
        self.table.core.sweep_every
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.table.core.algo
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.table.core.clock
    }

    /// A snapshot of the counters: decisions (if [counted](Builder::metrics)), CAS retries,
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
    /// let allowed = [1, 1, 1, 2].map(|key| limiter.check(&key).is_allowed());
    /// assert_eq!(allowed, [true, true, false, true]);
    /// let m = limiter.metrics();
    /// assert_eq!((m.allowed, m.denied, m.keys), (3, 1, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> Metrics {
        self.table.core.metrics(self.sweep_totals(), self.len())
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
    ///     assert!(l.check(&key).is_allowed());
    /// }
    /// let stats = l.probe_stats();
    /// assert_eq!(stats.keys, 10_000);
    /// assert!(stats.mean_lines < 1.5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn probe_stats(&self) -> ProbeStats {
        self.table.probe_stats()
    }
}

impl<K, A, C, V> CompactLimiter<K, Live<A>, C, V>
where
    K: CompactKey,
    A: Reconfigure,
    C: Clock,
    V: CompactVariant<Live<A>>,
{
    /// Switches to the configuration `new` while traffic flows, keeping every key; see
    /// [`KeyedLimiter::reconfigure`](crate::KeyedLimiter::reconfigure).
    pub fn reconfigure(&self, new: A) -> Result<A, ConfigError> {
        self.table
            .core
            .reconfigure(new, |fit| self.table.rewrite_all(fit))
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
    /// let l = CompactLimiter::<u32, Gcra>::with_clock("10/s burst 1".parse()?, ManualClock::new());
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
        self.table
            .core
            .reserve(cost, max_wait, At::new(&self.table, key))
    }
}

impl<K, A, C, V> CompactLimiter<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: CompactVariant<A>,
{
    /// A partial grant: admits the most units available now, up to `n`, and says how many:
    /// `(granted, decision)`, `granted` in `0..=n`. For a batch of messages, a streaming
    /// response, a transfer cut to what the quota allows. `n` above the capacity is capped at
    /// it (no request is ever admitted more at once). With nothing available, `granted` is 0
    /// and the decision is the denial of one unit, with its honest `retry_after` (and counted
    /// as one denied unit under the strict policy). Errors only for `n == 0`.
    /// See [`KeyedLimiter::check_up_to`](crate::KeyedLimiter::check_up_to).
    pub fn check_up_to(&self, key: &K::Lookup, n: u64) -> Result<(u64, Decision), CostError> {
        self.table.core.grant_up_to(n, At::new(&self.table, key))
    }

    /// Takes a provisional cost, to settle once the actual one is known. See
    /// [`KeyedLimiter::take`](crate::KeyedLimiter::take).
    pub fn take(&self, key: &K::Lookup, cost: u64) -> Result<Ticket, CostError> {
        let core = &self.table.core;
        core.take(&core.algo, cost, At::new(&self.table, key))
    }

    /// Settles `ticket` with the actual cost. See
    /// [`KeyedLimiter::settle`](crate::KeyedLimiter::settle).
    pub fn settle(
        &self,
        key: &K::Lookup,
        ticket: &mut Ticket,
        actual: u64,
    ) -> Result<bool, TicketError> {
        let core = &self.table.core;
        core.settle(&core.algo, ticket, actual, At::new(&self.table, key))
    }

    /// A request of cost 1 under a quota that comes with it. See
    /// [`KeyedLimiter::check_with`](crate::KeyedLimiter::check_with).
    pub fn check_with(&self, key: &K::Lookup, quota: &A) -> Result<Decision, QuotaError>
    where
        A: Reconfigure,
    {
        self.check_n_with(key, 1, quota)
    }

    /// A request of `cost` under a quota that comes with it. See
    /// [`KeyedLimiter::check_n_with`](crate::KeyedLimiter::check_n_with).
    pub fn check_n_with(
        &self,
        key: &K::Lookup,
        cost: u64,
        quota: &A,
    ) -> Result<Decision, QuotaError>
    where
        A: Reconfigure,
    {
        let core = &self.table.core;
        let quota = core.quota(quota)?;
        Ok(core.charge(quota, cost, At::new(&self.table, key))?.0)
    }

    /// [`take`](CompactLimiter::take) under a quota that comes with the request.
    pub fn take_with(&self, key: &K::Lookup, cost: u64, quota: &A) -> Result<Ticket, QuotaError>
    where
        A: Reconfigure,
    {
        let core = &self.table.core;
        let quota = core.quota(quota)?;
        Ok(core.take(quota, cost, At::new(&self.table, key))?)
    }

    /// [`settle`](CompactLimiter::settle) under the quota the ticket was taken with.
    pub fn settle_with(
        &self,
        key: &K::Lookup,
        ticket: &mut Ticket,
        actual: u64,
        quota: &A,
    ) -> Result<bool, QuotaError>
    where
        A: Reconfigure,
    {
        let core = &self.table.core;
        let quota = core.quota(quota)?;
        Ok(core.settle(quota, ticket, actual, At::new(&self.table, key))?)
    }
}

rate_limiter_by_inherent! {
    impl[K, A, C, V] RateLimiter<K::Lookup> for CompactLimiter<K, A, C, V>
    where [K: CompactKey, A: Algorithm, C: Clock, V: CompactVariant<A>]
    { keys, batches }
}

/// `key`'s slot in `table`, located once (its inline form, fingerprint and home line): what
/// the request paths of the core run their step on, and, by the fingerprint, what binds a
/// ticket to the key (no second hash).
struct At<'a, K: CompactKey, A: Algorithm, C, V: CompactVariant<A>> {
    table: &'a Table<K, A, C, V>,
    repr: K::Repr,
    fp: u64,
    home: usize,
}

impl<'a, K: CompactKey, A: Algorithm, C: Clock, V: CompactVariant<A>> At<'a, K, A, C, V> {
    #[inline(always)]
    fn new(table: &'a Table<K, A, C, V>, key: &K::Lookup) -> Self {
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
    V: CompactVariant<A>,
{
    #[inline(always)]
    fn apply<T>(&self, f: impl FnMut(&mut A::State) -> T) -> T {
        self.table.apply_at(self.repr, self.fp, self.home, f)
    }

    fn key_print(&self) -> u64 {
        self.fp
    }
}

impl<K, A, C, V> fmt::Debug for CompactLimiter<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm + fmt::Debug,
    C: Clock + fmt::Debug,
    V: CompactVariant<A>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompactLimiter")
            .field("core", &self.table.core)
            .field("keys", &self.table.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}
