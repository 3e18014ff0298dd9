//! What every store shares: [`Core`] (the algorithm, clock, counters and sweep settings, with
//! the request paths that do not depend on how keys are kept) and [`Builder`], the one
//! builder shape of every limiter. A store adds only its own table: the papaya map
//! ([`CasLimiter`](crate::CasLimiter)), the compact table
//! ([`CompactLimiter`](crate::CompactLimiter)) or one cell
//! ([`DirectLimiter`](crate::DirectLimiter)).

use crate::algo::{clamp, Algorithm, Gcra, Reservation};
use crate::cell::StateCell;
use crate::clock::{duration_to_nanos, Clock, QuantaClock};
use crate::debts::Debts;
use crate::decision::{Decision, Ticket};
use crate::error::{check_cost, BuildError, ConfigError, Field, QuotaError};
use crate::live::Live;
use crate::stats::{Metrics, Stats};
use crate::sweeper::{Signal, Sweeper, Totals};
use crate::sync::Mutex;

/// Whether a background sweeper may run every `interval`: not below 1 ms. A sweeper that
/// never sleeps would spin a core (zero: [`ConfigError::Zero`]), and one that sleeps a few
/// microseconds would pass over the store that often ([`ConfigError::TooSmall`]).
pub(crate) fn check_sweep_interval(interval: std::time::Duration) -> Result<(), ConfigError> {
    if interval.is_zero() {
        return Err(ConfigError::Zero {
            field: Field::SweepInterval,
            value: "0s".into(),
        });
    }
    if interval < std::time::Duration::from_millis(1) {
        return Err(ConfigError::TooSmall {
            field: Field::SweepInterval,
            value: format!("{interval:?}"),
            min: "1ms",
        });
    }
    Ok(())
}

use std::fmt;

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// How far behind the clock an idle sweep judges idleness unless
/// [`Builder::sweep_grace`] says otherwise.
pub(crate) const DEFAULT_SWEEP_GRACE: Duration = Duration::from_secs(1);

/// The settings a [`Builder`] collects.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub(crate) sweep_every: Option<Duration>,
    pub(crate) max_keys: Option<usize>,
    pub(crate) grace: Duration,
    pub(crate) metrics: bool,
    /// [`Builder::forget_evicted_limits`]: no debt table.
    pub(crate) forget: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            sweep_every: None,
            max_keys: None,
            grace: DEFAULT_SWEEP_GRACE,
            metrics: false,
            forget: false,
        }
    }
}

/// Configures a limiter: made by [`Limiter::builder`](crate::Limiter::builder) on every store.
/// `L` names the limiter it builds (on the default clock), `C` the clock chosen.
///
/// Every limiter takes [`clock`](Builder::clock) and [`metrics`](Builder::metrics); the keyed
/// ones also [`max_keys`](Builder::max_keys), [`sweep_every`](Builder::sweep_every) and
/// [`sweep_grace`](Builder::sweep_grace).
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, RateLimiter};
/// use std::time::Duration;
///
/// let limiter = CasLimiter::<String, Gcra>::builder("100/s burst 20".parse()?)
///     .sweep_every(Duration::from_secs(10)) // drop idle keys in the background
///     .max_keys(1_000_000)                  // and never hold many more than a million
///     .build()?;
/// assert!(limiter.check("203.0.113.7").is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct Builder<L, A, C = QuantaClock, X = ()> {
    pub(crate) algo: A,
    pub(crate) clock: C,
    pub(crate) options: Options,
    /// What a limiter with more to configure keeps beside (the hybrid limiter's Redis and
    /// sync settings).
    pub(crate) extra: X,
    _limiter: PhantomData<fn() -> L>,
}

impl<L, A> Builder<L, A> {
    pub(crate) fn new(algo: A) -> Self {
        Self::with(algo, Options::default(), ())
    }
}

impl<L, A, X> Builder<L, A, QuantaClock, X> {
    /// A builder with these options and `extra`, on the default clock.
    pub(crate) fn with(algo: A, options: Options, extra: X) -> Self {
        Self {
            algo,
            clock: QuantaClock::default(),
            options,
            extra,
            _limiter: PhantomData,
        }
    }
}

impl<L, A, C, X> Builder<L, A, C, X> {
    /// Uses `clock` instead of the default [`QuantaClock`].
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<L, A, C2, X> {
        Builder {
            algo: self.algo,
            clock,
            options: self.options,
            extra: self.extra,
            _limiter: PhantomData,
        }
    }

    /// Counts allowed and denied decisions for the limiter's `metrics` (off by default: it
    /// costs a `fetch_add` per request, on a per-thread stripe; CAS retries, sweeps and keys
    /// are counted either way).
    pub fn metrics(mut self, enabled: bool) -> Self {
        self.options.metrics = enabled;
        self
    }
}

pub(crate) mod sealed {
    /// Seals [`KeyedStore`](super::KeyedStore).
    pub trait Keyed {}
}

/// The limiters that hold many keys, and so take a capacity bound and sweeps:
/// [`CasLimiter`](crate::CasLimiter), [`MutexLimiter`](crate::MutexLimiter) and [`CompactLimiter`](crate::CompactLimiter).
/// Sealed.
pub trait KeyedStore: sealed::Keyed {}

impl<L: KeyedStore, A, C, X> Builder<L, A, C, X> {
    /// Bounds the number of keys. When a sweep finds more, it evicts the keys whose state is
    /// closest to fresh (the earliest [`Algorithm::idle_at`]) down to 7/8 of the bound.
    ///
    /// **A flood never resets a limit.** A key evicted while it still owes (its state is not
    /// fresh) leaves its debt ([`Debt::debt`](crate::algo::Debt::debt)) in a debt table beside the store, 25.6 bytes
    /// per key of `max_keys` (per quota of an [`AllOf`](crate::algo::AllOf)); inserted again,
    /// it starts from a state at least as limited as the one it lost
    /// ([`Debt::restore`](crate::algo::Debt::restore)), never from a fresh one. The table is bounded, so beyond what
    /// it can tell apart it errs on the side of the limit: a new key whose cells are shared
    /// with keys that owe starts from their joined debt (a false denial, never a false
    /// admission). `docs/limiters.md` states the guarantee per algorithm and its measured
    /// price; [`forget_evicted_limits`](Builder::forget_evicted_limits) opts out.
    ///
    /// The bound is kept in two steps. A request inserting a key beyond `max_keys` wakes the
    /// background sweeper (if there is one). A request inserting a key beyond
    /// `max_keys + max_keys/4` runs one eviction pass itself before inserting (one pass at a
    /// time: a request that finds one running starts none of its own; it helps it or waits
    /// until the store is back under that bound), so
    /// however fast new keys arrive, `len()` stays below `max_keys + max_keys/4` plus the
    /// number of threads inserting at that moment. That request pays the pass in latency; it
    /// happens only under floods that outrun the sweeper. The bound holds whatever the clock
    /// does: on a frozen or coarse clock, where a flood's keys all tie in `idle_at`, the tied
    /// keys are evicted evenly over the table.
    ///
    /// The papaya map, and the compact table behind a `CasLimiter` of `u64` keys, are
    /// unbounded unless this is set. The compact table grows toward it, at a load of 3/4
    /// (a [`CompactLimiter`](crate::CompactLimiter)'s default:
    /// [`DEFAULT_MAX_KEYS`](crate::compact::DEFAULT_MAX_KEYS)); an insert that finds its probe
    /// window full there, the table at its bound, evicts the window's key closest to fresh.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.options.max_keys = Some(max_keys.max(1));
        self
    }

    /// Runs a background sweeper thread every `interval` (and sooner when the capacity bound
    /// is exceeded). It sleeps between sweeps, never blocks a request, and is stopped and
    /// joined when the limiter is dropped. An interval below 1 ms (a sweeper that would spin a
    /// core, a pass over the store every few microseconds) makes `build` fail with
    /// [`BuildError::Config`] carrying a [`ConfigError::Zero`] (for zero) or
    /// [`ConfigError::TooSmall`] for [`Field::SweepInterval`].
    pub fn sweep_every(mut self, interval: Duration) -> Self {
        self.options.sweep_every = Some(interval);
        self
    }

    /// Lets capacity eviction forget what an evicted key owes: the key, inserted again,
    /// starts fresh, as if it had never been limited. Saves the debt table (25.6 bytes per key
    /// of `max_keys`) and its false denials, at the price of the one promise a limiter makes:
    /// a client that can make the store evict it (a flood of new keys from many addresses)
    /// gets its quota back. For keys that cannot be made up by a client (a fixed set of
    /// tenants), or where a reset is acceptable.
    pub fn forget_evicted_limits(mut self) -> Self {
        self.options.forget = true;
        self
    }

    /// Idle sweeps judge idleness at `now − grace` (default 1 s).
    ///
    /// A request reads the clock before it finds its key, so a request delayed between the
    /// two (preempted, say) carries a `now` slightly in the past. The grace keeps such a
    /// request's key from being judged idle by a later clock reading than its own; it only
    /// delays eviction. Zero is right for a manual clock moved between phases.
    pub fn sweep_grace(mut self, grace: Duration) -> Self {
        self.options.grace = grace;
        self
    }
}

impl<L, A: fmt::Debug, C: fmt::Debug, X: fmt::Debug> fmt::Debug for Builder<L, A, C, X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("algo", &self.algo)
            .field("clock", &self.clock)
            .field("options", &self.options)
            .field("extra", &self.extra)
            .finish()
    }
}

/// One key's state in a store, as the request paths of [`Core`] reach it: `apply` runs a step
/// on it through the store's CAS loop (or lock). A trait rather than a closure so that the
/// step is inlined into the loop (a `dyn FnMut` there cost ~10 ns a request).
pub trait KeyState<S> {
    /// Runs `f` on the state (possibly several times, on fresh copies: see
    /// [`Algorithm::update`]) and returns the last result.
    fn apply<T>(&self, f: impl FnMut(&mut S) -> T) -> T;

    /// The key's hash, which binds a [`Ticket`] to it (0 for an unkeyed limiter).
    fn key_print(&self) -> u64;
}

/// A key's hash for binding a [`Ticket`] to it: fixed seeds, the same in every limiter (the
/// tickets never leave the process, and no table is built on it to flood).
pub(crate) fn key_print<Q: std::hash::Hash + ?Sized>(key: &Q) -> u64 {
    static PRINT: ahash::RandomState = ahash::RandomState::with_seeds(
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    );
    PRINT.hash_one(key)
}

/// A new limiter's id, which binds its [`Ticket`]s to it (never 0: a Redis client's): 63
/// random bits per process (std's randomly keyed hasher) told apart by a count, so that a
/// ticket carried to another process (serialized) finds no limiter of its id there, where
/// every process's first limiter was number 1.
pub(crate) fn new_limiter_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // std's, not loom's: never part of a modelled race.
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let base = *BASE.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    // The top bit set: never 0; the count below it: two limiters of a process never alike.
    (base | 1 << 63) ^ (NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & !(1 << 63))
}

/// What every store keeps beside its table, and the request paths that do not depend on how
/// keys are kept.
pub struct Core<A, C> {
    pub(crate) algo: A,
    pub(crate) clock: C,
    pub(crate) stats: Stats,
    /// Whether allowed/denied decisions are counted ([`Builder::metrics`]).
    counting: bool,
    grace_ns: u64,
    pub(crate) max_keys: Option<usize>,
    pub(crate) sweep_every: Option<Duration>,
    pub(crate) signal: Arc<Signal>,
    pub(crate) totals: Totals,
    /// What keys evicted for capacity still owe (keyed stores with a bound, unless opted out).
    pub(crate) debts: Option<Debts>,
    /// Held by the capacity pass in flight: one at a time.
    pub(crate) pass: Mutex<()>,
    /// This limiter's id: its tickets settle here only.
    pub(crate) id: u64,
}

impl<A: Algorithm, C: Clock> Core<A, C> {
    pub(crate) fn new(algo: A, clock: C, options: &Options) -> Self {
        Self {
            algo,
            clock,
            stats: Stats::default(),
            counting: options.metrics,
            grace_ns: duration_to_nanos(options.grace),
            max_keys: options.max_keys,
            sweep_every: options.sweep_every,
            signal: Arc::default(),
            totals: Totals::default(),
            debts: None,
            pass: Mutex::new(()),
            id: new_limiter_id(),
        }
    }

    /// Adds the debt table a store bounded by `max_keys` keeps, unless the options opt out.
    pub(crate) fn with_debts(
        self,
        options: &Options,
    ) -> Result<Self, std::collections::TryReserveError> {
        match self.max_keys {
            Some(max) => self.with_debt_table(max, options),
            None => Ok(self),
        }
    }

    /// Adds a debt table for `keys` keys' debts, unless the options opt out: for a store
    /// without a bound that may still evict (the compact table's full windows).
    pub(crate) fn with_debt_table(
        mut self,
        keys: usize,
        options: &Options,
    ) -> Result<Self, std::collections::TryReserveError> {
        if !options.forget {
            self.debts = Debts::new(&self.algo, keys)?;
        }
        Ok(self)
    }

    /// Keeps what a key (hashed by `hash`) evicted for capacity in `state` still owes. Called
    /// before the key's cell is killed, with the sweep's `now`.
    #[inline]
    pub(crate) fn keep_debt(&self, hash: impl FnOnce() -> u64, state: &A::State, now: u64) {
        if let Some(debts) = &self.debts {
            debts.keep(&self.algo, hash(), state, now);
        }
    }

    /// The state a key (hashed by `hash`) starts from when inserted: what it owes, if the debt
    /// table holds anything for it, else fresh. A store must read it while no eviction of the
    /// key can run (the compact store: under the key's stripe lock, after finding it absent),
    /// or [`catch_up`](Core::catch_up) after the insert.
    #[inline]
    pub(crate) fn start_state(&self, hash: impl FnOnce() -> u64) -> A::State {
        let Some(debts) = &self.debts else {
            return self.algo.fresh();
        };
        let hash = hash();
        match debts.restore(&self.algo, hash) {
            // A debt already paid restores a state as good as fresh: start fresh (cheaper, and
            // counted apart from the keys that really start owing).
            Some(state) if self.algo.idle_at(&state) > self.sweep_now() => {
                debts.restored_one(hash);
                state
            }
            _ => self.algo.fresh(),
        }
    }

    /// The debt table's stamp for a key (see `Debts::stamp`), read before
    /// [`start_state`](Core::start_state) by a store that inserts without excluding evictions.
    #[inline]
    pub(crate) fn debt_stamp(&self, hash: u64) -> u64 {
        self.debts.as_ref().map_or(0, |d| d.stamp(hash))
    }

    /// After inserting a key with [`start_state`](Core::start_state) read at `stamp`: if a debt
    /// was kept for it meanwhile (it was inserted, used and evicted by others in between), joins
    /// that debt into the state inserted, through `rewrite` (the cell's read-modify-write).
    #[inline]
    pub(crate) fn catch_up(
        &self,
        hash: u64,
        stamp: u64,
        rewrite: impl FnOnce(&dyn Fn(&mut A::State)),
    ) {
        if let Some(debts) = &self.debts {
            if debts.stamp(hash) != stamp {
                self.join_debt(debts, hash, rewrite);
            }
        }
    }

    #[cold]
    fn join_debt(&self, debts: &Debts, hash: u64, rewrite: impl FnOnce(&dyn Fn(&mut A::State))) {
        let Some(owed) = debts.restore(&self.algo, hash) else {
            return;
        };
        let algo = &self.algo;
        rewrite(&|state| {
            let joined = |p| algo.debt_join(p, algo.debt(state, p), algo.debt(&owed, p));
            *state = algo.restore(&joined);
        });
    }

    /// The decision for a key not held: from what it owes, or fresh.
    #[inline]
    pub(crate) fn peek_absent(
        &self,
        algo: &A,
        hash: impl FnOnce() -> u64,
        now: u64,
        cost: u64,
    ) -> Decision {
        match self
            .debts
            .as_ref()
            .and_then(|d| d.restore(&self.algo, hash()))
        {
            Some(owed) => algo.peek(&owed, now, cost),
            None => algo.peek(&algo.fresh(), now, cost),
        }
    }

    /// The state of a key not held: restored from what it owes, or fresh.
    #[cfg(feature = "redis")]
    pub(crate) fn absent_state(&self, hash: impl FnOnce() -> u64) -> A::State {
        self.debts
            .as_ref()
            .and_then(|d| d.restore(&self.algo, hash()))
            .unwrap_or_else(|| self.algo.fresh())
    }

    /// Rejects a cost the algorithm could never admit.
    #[inline(always)]
    pub(crate) fn cost(&self, cost: u64) -> Result<(), QuotaError> {
        check_cost(cost, self.algo.capacity())
    }

    /// Counts `decision` if counting is on; returns it.
    #[inline(always)]
    pub(crate) fn count(&self, decision: Decision) -> Decision {
        if self.counting {
            self.stats.decided(decision.is_allowed());
        }
        decision
    }

    /// The time an idle sweep judges by: `now − grace`, capped like the algorithms' own
    /// `now` (a saturated `idle_at` is never reached).
    pub(crate) fn sweep_now(&self) -> u64 {
        clamp(self.clock.now()).saturating_sub(self.grace_ns)
    }

    /// One request's update of `cell` (what the papaya and direct stores run). `None` if the
    /// cell is dead.
    #[inline(always)]
    pub(crate) fn update<T>(
        &self,
        cell: &impl StateCell<A::State>,
        f: impl FnMut(&mut A::State) -> T,
    ) -> Option<T> {
        cell.update(&self.stats, f)
    }

    /// [`update`](Core::update) of a cell never killed (the direct limiter's): no
    /// tombstone to test; were it dead, `f` runs on a fresh state.
    #[inline(always)]
    pub(crate) fn update_live<T>(
        &self,
        cell: &impl StateCell<A::State>,
        f: impl FnMut(&mut A::State) -> T,
    ) -> T {
        cell.update_live(&self.stats, f, || self.algo.fresh())
    }

    /// Totals over every sweep, with the debt table's counts.
    pub(crate) fn sweep_totals(&self) -> Metrics {
        let debts = self.debts.as_ref().map_or((0, 0), Debts::counts);
        self.totals.snapshot(debts)
    }

    /// The counters, with `totals` and `keys` from the store.
    pub(crate) fn metrics(&self, totals: Metrics, keys: usize) -> Metrics {
        Metrics::new(&self.stats, totals, keys)
    }

    /// Starts the background sweeper if one was asked for, running `sweep` on `shared`.
    pub(crate) fn spawn_sweeper<S: Send + Sync + 'static>(
        &self,
        shared: &Arc<S>,
        sweep: fn(&S),
    ) -> Result<Option<Sweeper>, BuildError> {
        let Some(interval) = self.sweep_every else {
            return Ok(None);
        };
        check_sweep_interval(interval)?;
        let s = shared.clone();
        Sweeper::spawn(self.signal.clone(), interval, move || sweep(&s))
            .map(Some)
            .map_err(BuildError::Spawn)
    }

    /// The algorithm a request runs by: `quota` if it comes with one (checked to read this
    /// limiter's states), else the limiter's own.
    #[inline(always)]
    pub(crate) fn pick<'q>(&'q self, quota: Option<&'q A>) -> Result<&'q A, ConfigError> {
        match quota {
            None => Ok(&self.algo),
            Some(quota) => self.algo.check_quota(quota).map(|()| quota),
        }
    }

    /// `at`, or the clock's reading.
    #[inline(always)]
    pub(crate) fn now(&self, at: Option<u64>) -> u64 {
        match at {
            Some(at) => at,
            None => self.clock.now(),
        }
    }

    /// A partial grant by `algo` on the key's state `at`: `n` is capped at the capacity (no
    /// request gets more at once); 0 is an error.
    #[inline]
    pub(crate) fn grant_up_to(
        &self,
        algo: &A,
        n: u64,
        now: u64,
        at: impl KeyState<A::State>,
    ) -> Result<(u64, Decision), QuotaError> {
        if n == 0 {
            return Err(QuotaError::ZeroCost);
        }
        let most = n.min(algo.capacity());
        let (granted, decision) =
            at.apply(|state| crate::algo::update_up_to(algo, state, now, most));
        Ok((granted, self.count(decision)))
    }

    /// `take` of every store: [`Algorithm::take`], counted, and a [`Ticket`] to settle.
    #[inline(always)]
    pub(crate) fn take(
        &self,
        algo: &A,
        cost: u64,
        now: u64,
        at: impl KeyState<A::State>,
    ) -> Result<Ticket, QuotaError> {
        let key = at.key_print();
        check_cost(cost, algo.capacity())?;
        // The algorithm's take: a charge its settle can hand back exactly.
        let decision = self.count(at.apply(|state| algo.take(state, now, cost)));
        Ok(Ticket::issue(decision, cost, now, self.id, key))
    }

    /// `settle` of every store: closes `ticket` and, if it was open and the cost differs,
    /// runs `algo`'s settle on the key's state `at` (the same CAS path as a request). A ticket
    /// taken elsewhere is an error, and stays as it was.
    #[inline(always)]
    pub(crate) fn settle(
        &self,
        algo: &A,
        ticket: &mut Ticket,
        actual: u64,
        now: Option<u64>,
        at: impl KeyState<A::State>,
    ) -> Result<bool, QuotaError> {
        ticket.check_origin(self.id, at.key_print())?;
        settle_limit(algo, ticket, actual)?;
        let Some((taken_at, charged)) = ticket.close() else {
            return Ok(false);
        };
        if actual != charged {
            let now = self.now(now);
            at.apply(|state| algo.settle(state, now, taken_at, charged, actual));
        }
        Ok(true)
    }
}

/// An open `ticket`'s settle with `actual` refused if `algo` could not hold the debt
/// ([`Algorithm::settle_limit`]); the ticket stays open.
pub(crate) fn settle_limit<A: Algorithm>(
    algo: &A,
    ticket: &Ticket,
    actual: u64,
) -> Result<(), QuotaError> {
    let limit = algo.settle_limit(ticket.charged());
    if ticket.is_open() && actual > limit {
        return Err(QuotaError::ExceedsCapacity {
            cost: actual,
            capacity: limit,
        });
    }
    Ok(())
}

impl<C: Clock> Core<Gcra, C> {
    /// `reserve` of every store under `quota` (the limiter's own if `None`), on the key's
    /// state word `at`, at `now`.
    pub(crate) fn reserve(
        &self,
        quota: Option<&Gcra>,
        cost: u64,
        max_wait: Duration,
        now: u64,
        at: impl KeyState<u64>,
    ) -> Result<Reservation, QuotaError> {
        let algo = self.pick(quota)?;
        check_cost(cost, algo.capacity())?;
        let max_wait = duration_to_nanos(max_wait);
        let reservation = at.apply(|tat| {
            let (reservation, new) = algo.reserve(*tat, now, cost, max_wait);
            *tat = new.unwrap_or(*tat);
            reservation
        });
        if self.counting {
            self.stats
                .decided(matches!(reservation, Reservation::Admitted { .. }));
        }
        Ok(reservation)
    }
}

impl<A: Algorithm + Copy, C: Clock> Core<Live<A>, C> {
    /// `reconfigure` of every store: the switch alone, no key touched ([`Live`]).
    pub(crate) fn reconfigure(&self, new: A) -> Result<A, ConfigError> {
        self.algo.switch(new, || self.clock.now())
    }
}

impl<A: fmt::Debug, C: fmt::Debug> fmt::Debug for Core<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("algo", &self.algo)
            .field("clock", &self.clock)
            .field("cas", &self.stats)
            .field("max_keys", &self.max_keys)
            .field("sweeps", &self.totals.snapshot((0, 0)))
            .finish()
    }
}
