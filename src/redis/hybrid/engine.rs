//! What every algorithm's hybrid entry runs on: a decision's [`Verdict`], the [`Engine`] each
//! algorithm implements (`lease.rs`, `merge.rs`), and [`Fleet`], the algorithm the core's
//! keyed store runs for a hybrid limiter. The context decisions read is `context.rs`.

use super::context::{Evicted, FleetContext};
use super::entry::{Hybrid, HybridCell, Seen};
use super::{Fallback, SyncError};
use crate::algo::{Algorithm, Debt};
use crate::algo::{Earrrl, Exponential, FixedWindow, Gcra, InFlight, SlidingWindow};
use crate::decision::{Decision, Policy};
use crate::error::ConfigError;
use crate::keyed::Shared;
use ::redis::Value;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// How a decision was reached: what the stats count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// From a GCRA lease.
    Lease,
    /// On the fleet's state as known (merged states; GCRA beyond its lease).
    Known,
    /// By the fallback: the fleet's state not known, or Redis away.
    Fallback,
    /// Denied for want of quota in hand until the next sync.
    Waiting,
}

/// A decision and what the limiter does about it.
#[derive(Debug, Clone, Copy)]
pub struct Verdict {
    pub(super) decision: Decision,
    pub(super) reason: Reason,
    /// Whether the sync thread has something to do for the key.
    pub(super) sync: bool,
    /// Whether it should do it in its next round, not a sync interval after the key's last
    /// (a request counted with little of the limit left: see `Merge::near_limit`).
    pub(super) urgent: bool,
    /// Units admitted that the others have not heard of, added to the cell's count
    /// ([`Seen::unheard`]).
    pub(super) unheard: u64,
}

/// What a push tells the subscription beside the entry it changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Heard {
    /// The hash lacks this instance's live state (Redis flushed or restarted empty): it is
    /// to be published again.
    pub(super) republish: bool,
    /// A merged window's units this instance holds beyond what the push held of it: what
    /// the others have not heard of ([`Seen::unheard`]).
    pub(super) unheard: Option<u64>,
}

/// What the sync thread does with a key this round.
#[derive(Debug)]
pub enum Visit<S> {
    /// Nothing, and forget it until a request queues it again.
    Skip,
    /// Nothing now; look again next round.
    Keep,
    /// Send the key's arguments (after the client key) in the round's batch.
    Call(Vec<String>, S),
}

/// How an algorithm runs in the hybrid limiter. Sealed: implemented for [`Gcra`] (leases)
/// and for [`FixedWindow`], [`SlidingWindow`], [`Earrrl`], [`Exponential`] and [`InFlight`]
/// (merged states).
pub trait HybridAlgorithm: Engine {}

impl HybridAlgorithm for Gcra {}
impl HybridAlgorithm for FixedWindow {}
impl HybridAlgorithm for SlidingWindow {}
impl HybridAlgorithm for Earrrl {}
impl HybridAlgorithm for Exponential {}
impl HybridAlgorithm for InFlight {}

mod private {
    use super::*;
    use crate::redis::hybrid::push::Reader;

    /// One algorithm's entry, its decisions and its sync (sealed: the trait is not nameable).
    pub trait Engine: Algorithm + Clone + PartialEq + fmt::Debug + Send + Sync + 'static {
        /// The state the store keeps per key: this instance's own and what it knows of the
        /// fleet's.
        type Word: crate::algo::State + Copy + fmt::Debug;
        /// What the limiter fixes at build from the fallback share.
        type Plan: fmt::Debug + Send + Sync + 'static;
        /// The sync thread's bookkeeping of a key it watches.
        type KeyBook: Default + Send + 'static;
        /// What a key's call sent, for when it fails.
        type Sent: Send;
        /// A pushed state, parsed.
        type Pushed;
        /// The batch script.
        const SCRIPT: &'static str;
        /// Appended to the Redis key (`:h` for the merged hashes).
        const SUFFIX: &'static str;
        /// More keys of the script per client key, the Redis key with these appended (same
        /// slot).
        const EXTRA_KEYS: &'static [&'static str];

        /// What `share` fixes; an error if it leaves an instance less than one request.
        fn plan(&self, fallback: Fallback) -> Result<Self::Plan, ConfigError>;
        /// The entry of a key nothing is known of yet.
        fn unknown(&self) -> Self::Word;
        /// Decides a request of `cost` at local time `now` on `w`, updating it; `seen`: what
        /// the cell says beside it ([`HybridCell::seen`]); `take`: a take, whose settle may
        /// correct its cost, counted as the algorithm's
        /// [`take`](crate::algo::Algorithm::take) counts it.
        #[allow(clippy::too_many_arguments)]
        fn decide_entry(
            &self,
            plan: &Self::Plan,
            ctx: &FleetContext,
            w: &mut Self::Word,
            seen: Seen,
            now: u64,
            cost: u64,
            take: bool,
        ) -> Verdict;
        /// Settles at local time `now` a request taken at local time `taken_at` for
        /// `charged`, with the `actual` cost (they differ), on `w`: this instance's part of
        /// the key, as a request changes it. The sync thread then publishes the change.
        /// With `wait`, `false` and `w` unchanged while the states are being re-stamped on a
        /// new timeline ([`FleetContext::settled_now`]): the caller tries again. Without, on
        /// the current offset whatever the timeline.
        #[allow(clippy::too_many_arguments)]
        fn settle_entry(
            &self,
            ctx: &FleetContext,
            w: &mut Self::Word,
            now: u64,
            taken_at: u64,
            charged: u64,
            actual: u64,
            wait: bool,
        ) -> bool;
        /// The local time from which `w` is equivalent to [`unknown`](Engine::unknown) in a
        /// subscribed limiter, holding nothing: it may be dropped.
        fn entry_idle_at(&self, ctx: &FleetContext, w: &Self::Word) -> u64;
        /// How long a state of this quota can stay live without a write (a full burst's
        /// payback): how long after subscribing an instance takes a key it has not heard of
        /// as unknown rather than fresh.
        fn horizon(&self) -> u64;
        /// What a gap in the subscription does to what is known of the fleet: a lease stops
        /// being current; a merged entry keeps the others' state as a floor (its cell marked
        /// stale).
        fn forget(&self, w: &mut Self::Word);
        /// Re-stamps `w`'s own state, stamped on a timeline `delta` ns behind Redis' (see
        /// [`FleetContext::observe_time`]). Nothing by default: GCRA's state is Redis' TAT.
        fn restamp(&self, _w: &mut Self::Word, _delta: i64) {}

        /// How many debt words describe an entry (see [`Debt::debt_parts`]): 0, the
        /// default, keeps no debt table (GCRA: an evicted entry's lease and debt go back to
        /// Redis, which holds the key's TAT).
        fn entry_debt_parts(&self) -> usize {
            0
        }
        /// Part `part` of what an entry still owes ([`Debt::debt`]).
        fn entry_debt(&self, w: &Self::Word, part: usize) -> u128 {
            let _ = (w, part);
            0
        }
        /// Two debt words of part `part` joined ([`Debt::debt_join`]).
        fn entry_debt_join(&self, part: usize, a: u128, b: u128) -> u128 {
            let _ = part;
            a.max(b)
        }
        /// The shared time (Redis') from which a debt word limits nothing.
        fn entry_debt_paid_at(&self, part: usize, debt: u128) -> u64 {
            let _ = (part, debt);
            0
        }
        /// An entry at least as limited as the debts ([`Debt::restore`]).
        fn entry_restore(&self, debt: &dyn Fn(usize) -> u128) -> Self::Word {
            let _ = debt;
            self.unknown()
        }

        /// The key's call this round, if any.
        fn prepare(
            &self,
            plan: &Self::Plan,
            ctx: &FleetContext,
            cell: &HybridCell<Self::Word>,
            book: &mut Self::KeyBook,
            now: u64,
            closing: bool,
        ) -> Visit<Self::Sent>;
        /// Applies the key's reply at local time `now` (`cell`: `None` if it left the
        /// store meanwhile); `Ok(true)`: visit it again next round.
        #[allow(clippy::too_many_arguments)]
        fn apply(
            &self,
            ctx: &FleetContext,
            key: &str,
            cell: Option<&HybridCell<Self::Word>>,
            book: &mut Self::KeyBook,
            reply: Value,
            sent: Self::Sent,
            now: u64,
        ) -> Result<bool, SyncError>;
        /// The key's call failed: restore what it took.
        fn failed(
            &self,
            ctx: &FleetContext,
            key: &str,
            cell: Option<&HybridCell<Self::Word>>,
            sent: Self::Sent,
        );
        /// The store evicted `key` in state `w`, running under quota `quota`: queue what it
        /// held to be handed back.
        fn evicted(&self, ctx: &FleetContext, key: &str, quota: u32, w: &Self::Word);
        /// The arguments of a call handing back what an evicted key held.
        fn hand_back(&self, ctx: &FleetContext, e: &Evicted) -> Vec<String>;

        /// Reads one key's pushed state (after its client key), at local time `now`.
        fn read_push(
            &self,
            ctx: &FleetContext,
            key: &str,
            r: &mut Reader<'_>,
            now: u64,
        ) -> Result<Self::Pushed, SyncError>;
        /// Whether a pushed state says nothing a fresh entry would not (no entry is made
        /// for it).
        fn push_is_idle(&self, ctx: &FleetContext, p: &Self::Pushed, now: u64) -> bool;
        /// Merges a pushed state into `w` at local time `now`; `own`: pushed by this
        /// instance's own call. What else the push says of this instance's part: [`Heard`].
        fn apply_push(
            &self,
            ctx: &FleetContext,
            w: &mut Self::Word,
            p: &Self::Pushed,
            own: bool,
            now: u64,
        ) -> Heard;
    }
}
pub(crate) use private::Engine;

/// The algorithm the core's store runs for a hybrid limiter: `A`'s entry and decisions, with
/// the context they read.
#[derive(Debug)]
pub struct Fleet<A: Engine> {
    pub(super) algo: A,
    pub(super) plan: A::Plan,
    pub(super) ctx: Arc<FleetContext>,
    /// The fallback, which fixes each quota's plan.
    pub(super) fallback: Fallback,
    /// The per-request quotas met so far.
    pub(super) quotas: Quotas<A>,
}

impl<A: Engine> Fleet<A> {
    /// Quota `index` ([`Quotas`]): 0 is the limiter's own; an index no entry can hold (none
    /// is handed out unregistered) reads as the own.
    #[inline]
    pub(super) fn quota(&self, index: u32) -> (&A, &A::Plan) {
        match index.checked_sub(1).and_then(|i| self.quotas.get(i)) {
            Some(q) => (&q.algo, &q.plan),
            None => (&self.algo, &self.plan),
        }
    }

    /// The index of `quota` (a request's, or `None`: the own), registering it if it is new;
    /// `hint`, the index the key's entry holds, is tried first. An error if the limiter's
    /// states cannot be read by it, or its fallback share leaves it less than a unit, or
    /// [`MAX_QUOTAS`] are registered already.
    #[inline]
    pub(super) fn index_of(
        &self,
        quota: Option<&A>,
        hint: u32,
    ) -> Result<(u32, &A, &A::Plan), ConfigError> {
        let Some(quota) = quota else {
            return Ok((0, &self.algo, &self.plan));
        };
        let (algo, plan) = self.quota(hint);
        if algo == quota {
            return Ok((hint, algo, plan));
        }
        if *quota == self.algo {
            return Ok((0, &self.algo, &self.plan));
        }
        self.algo.check_quota(quota)?;
        let i = self.quotas.find_or_add(quota, self.fallback)?;
        let q = self.quotas.get(i).expect("registered");
        Ok((i + 1, &q.algo, &q.plan))
    }

    /// The longest a state of any quota met lives without a write: the live marker's.
    pub(super) fn horizon(&self) -> u64 {
        self.algo
            .horizon()
            .max(self.quotas.horizon.load(Ordering::Relaxed))
    }
}

/// How many distinct per-request quotas a hybrid limiter takes (its own aside): each is
/// kept for the limiter's life (its keys' entries name it), so a limiter serving a
/// configuration that is reloaded with new quotas for ever would grow without this bound.
pub const MAX_QUOTAS: usize = 1 << 16;
const CHUNK: usize = 256;

/// `CHUNK` quotas, each set once.
type Chunk<A> = Box<[OnceLock<Quota<A>>]>;

/// A per-request quota the limiter has met: its algorithm and what the fallback fixes for it.
#[derive(Debug)]
pub struct Quota<A: Engine> {
    algo: A,
    plan: A::Plan,
}

/// The per-request quotas a hybrid limiter has met, numbered in order, so that a key's entry
/// says in 4 bytes which one it runs under: the sync thread and the subscription read it
/// (GCRA's leases, debts and pushed TATs are in the quota's emission intervals). Read
/// without a lock (a chunked array of cells set once); added under a lock, once per quota.
pub struct Quotas<A: Engine> {
    chunks: Box<[OnceLock<Chunk<A>>]>,
    /// Indices by shape (capacity, horizon, policy), each confirmed by equality.
    by_shape: papaya::HashMap<(u64, u64, bool), Box<[u32]>, ahash::RandomState>,
    added: parking_lot::Mutex<u32>,
    /// The longest horizon among them.
    horizon: AtomicU64,
}

impl<A: Engine> fmt::Debug for Quotas<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quotas")
            .field("count", &*self.added.lock())
            .finish()
    }
}

impl<A: Engine> Default for Quotas<A> {
    fn default() -> Self {
        Quotas {
            chunks: (0..MAX_QUOTAS / CHUNK).map(|_| OnceLock::new()).collect(),
            by_shape: papaya::HashMap::builder()
                .hasher(ahash::RandomState::new())
                .build(),
            added: parking_lot::Mutex::new(0),
            horizon: AtomicU64::new(0),
        }
    }
}

impl<A: Engine> Quotas<A> {
    #[inline]
    fn get(&self, i: u32) -> Option<&Quota<A>> {
        let i = i as usize;
        self.chunks.get(i / CHUNK)?.get()?[i % CHUNK].get()
    }

    fn shape(quota: &A) -> (u64, u64, bool) {
        (
            quota.capacity(),
            quota.horizon(),
            quota.policy() == Policy::Strict,
        )
    }

    fn find(&self, quota: &A) -> Option<u32> {
        let guard = self.by_shape.guard();
        let found = self.by_shape.get(&Self::shape(quota), &guard)?;
        found
            .iter()
            .copied()
            .find(|&i| self.get(i).is_some_and(|q| q.algo == *quota))
    }

    /// `quota`'s index, added if it is new.
    #[cold]
    fn find_or_add(&self, quota: &A, fallback: Fallback) -> Result<u32, ConfigError> {
        if let Some(i) = self.find(quota) {
            return Ok(i);
        }
        let plan = quota.plan(fallback)?;
        let mut added = self.added.lock();
        // Added by another thread while this one waited.
        if let Some(i) = self.find(quota) {
            return Ok(i);
        }
        let i = *added;
        if i as usize >= MAX_QUOTAS {
            return Err(ConfigError::TooLarge {
                field: crate::Field::Quota,
                value: format!("{} distinct quotas", MAX_QUOTAS + 1),
                max: "65,536 per-request quotas on one hybrid limiter",
            });
        }
        let chunk = self.chunks[i as usize / CHUNK]
            .get_or_init(|| (0..CHUNK).map(|_| OnceLock::new()).collect());
        let _ = chunk[i as usize % CHUNK].set(Quota {
            algo: quota.clone(),
            plan,
        });
        self.horizon.fetch_max(quota.horizon(), Ordering::Relaxed);
        let shape = Self::shape(quota);
        let guard = self.by_shape.guard();
        let mut list = self
            .by_shape
            .get(&shape, &guard)
            .map_or_else(Vec::new, |l| l.to_vec());
        list.push(i);
        self.by_shape.insert(shape, list.into(), &guard);
        *added = i + 1;
        Ok(i)
    }
}

impl<A: Engine> Algorithm for Fleet<A> {
    type State = A::Word;

    fn fresh(&self) -> A::Word {
        self.algo.unknown()
    }

    fn capacity(&self) -> u64 {
        self.algo.capacity()
    }

    fn policy(&self) -> Policy {
        self.algo.policy()
    }

    /// The limiter's own paths decide with the cell at hand ([`HybridCell::seen`]); without
    /// it, the others' state is taken as a floor only.
    #[inline]
    fn update(&self, w: &mut A::Word, now: u64, cost: u64) -> Decision {
        let seen = Seen {
            stale: true,
            unheard: 0,
        };
        self.algo
            .decide_entry(&self.plan, &self.ctx, w, seen, now, cost, false)
            .decision
    }

    /// Not the limiter's own settle (`HybridLimiter`'s, which waits out a re-stamp of the
    /// states): settled on the current offset, never refused.
    fn settle(&self, w: &mut A::Word, now: u64, taken_at: u64, charged: u64, actual: u64) {
        self.algo
            .settle_entry(&self.ctx, w, now, taken_at, charged, actual, false);
    }

    fn idle_at(&self, w: &A::Word) -> u64 {
        self.algo.entry_idle_at(&self.ctx, w)
    }
}

impl<A: Engine> Debt<A::Word> for Fleet<A> {
    /// An entry's debt, in the words [`Engine::entry_debt`] gives: the merged states keep
    /// both halves (this instance's own state, which it publishes whole, and the others'), so
    /// a key evicted and inserted again neither publishes less than it counted nor decides as
    /// if the others held nothing. GCRA keeps none (its leases go back to Redis).
    fn debt_parts(&self) -> usize {
        self.algo.entry_debt_parts()
    }

    fn debt(&self, w: &A::Word, part: usize) -> u128 {
        self.algo.entry_debt(w, part)
    }

    fn debt_join(&self, part: usize, a: u128, b: u128) -> u128 {
        self.algo.entry_debt_join(part, a, b)
    }

    /// In local time, as every time the store compares.
    fn debt_paid_at(&self, part: usize, debt: u128) -> u64 {
        self.ctx.local(self.algo.entry_debt_paid_at(part, debt))
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> A::Word {
        self.algo.entry_restore(debt)
    }
}

pub(super) type Store<A, C> = Shared<String, Fleet<A>, C, Hybrid>;

/// What the limiter, its sync thread and its subscription share.
pub(crate) struct Inner<A: Engine, C> {
    pub(super) store: Store<A, C>,
    pub(super) prefix: String,
}

impl<A: Engine, C> Inner<A, C> {
    pub(super) fn fleet(&self) -> &Fleet<A> {
        &self.store.core.algo
    }

    pub(super) fn ctx(&self) -> &FleetContext {
        &self.store.core.algo.ctx
    }
}
