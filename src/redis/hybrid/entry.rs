//! How the hybrid limiter's entries sit in the core's keyed store: [`HybridCell`], the
//! store's cell around an algorithm's word (updated by the core's CAS loop, or under the core's
//! per-key lock for a state of two 128-bit words), with one word of hints for the sync
//! thread beside it; and [`Pair`], that two-word state.

use crate::algo::{sealed::Sealed, State};
use crate::cell::{LockCell, StateCell, StateCells};
use crate::limiter::{sealed::VariantCell, Variant};
use crate::stats::Stats;
use crate::sync::{AtomicU64, Ordering};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32};

/// The `pending` bit that says the key is on the sync thread's queue.
const QUEUED: u64 = 1 << 63;
/// The `pending` bit that says the key is on the queue as urgent ([`HybridCell::hurry`]).
const URGENT: u64 = 1 << 62;
/// Where `pending` counts a merged window's units the others have not heard of (bits 32–61,
/// saturating): above the denied units, below the flags.
const UNHEARD_AT: u32 = 32;
const UNHEARD_MAX: u64 = (1 << 30) - 1;

/// What a decision reads of a cell beside its state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// What the entry holds of the others was heard before a gap in the subscription
    /// ([`HybridCell::stale`]).
    pub(super) stale: bool,
    /// Units this instance admitted that the others have not heard of: its state beyond
    /// what the key's last push held of it, and what it admitted since.
    pub(super) unheard: u64,
}

/// A key's cell in the hybrid limiter's store: the state the core's cell keeps (with its
/// eviction tombstone), and `pending`, hints beside it: whether the key is queued, the units
/// denied for want of a lease since the last sync (demand), and a merged window's units the
/// others have not heard of ([`Seen::unheard`]). Being hints, they need no protocol with the
/// state: a dead cell's hints are ignored, and a count off by a request moves a cap by one.
pub struct HybridCell<S: StateCells> {
    state: S::CasCell,
    pending: AtomicU64,
    /// The quota the key's last request ran under (an index of the limiter's `Quotas`, 0:
    /// its own): what the sync thread and the subscription read the state by.
    quota: AtomicU32,
    /// Set when the subscription broke (a gap: pushes may have been missed), cleared by the
    /// key's next push: while set, the others' state as last heard is a floor of what they
    /// hold, not their state. Beside `quota`, in what would be padding.
    stale: AtomicBool,
}

impl<S: StateCells> HybridCell<S> {
    /// Marks the key queued; `true` if it was not (the caller queues it).
    #[inline]
    pub(super) fn enqueue(&self) -> bool {
        // A load first: the common case (already queued this interval) writes nothing.
        self.pending.load(Ordering::Relaxed) & QUEUED == 0
            && self.pending.fetch_or(QUEUED, Ordering::AcqRel) & QUEUED == 0
    }

    /// Marks the key queued and urgent; `true` if it was not urgent (the caller queues it
    /// as urgent, even if it is queued already).
    #[inline]
    pub(super) fn hurry(&self) -> bool {
        self.pending.load(Ordering::Relaxed) & URGENT == 0
            && self.pending.fetch_or(QUEUED | URGENT, Ordering::AcqRel) & URGENT == 0
    }

    /// Adds units denied for want of a lease.
    #[inline]
    pub(super) fn add_denied(&self, units: u64) {
        // Saturating in the low 32 bits: the unheard counts sit above them.
        let _ = self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                let denied = (p & u64::from(u32::MAX)).saturating_add(units);
                Some(p & !u64::from(u32::MAX) | denied.min(u32::MAX.into()))
            });
    }

    /// The quota the key runs under.
    #[inline]
    pub(super) fn quota(&self) -> u32 {
        self.quota.load(Ordering::Relaxed)
    }

    /// Sets the quota the key runs under (before the request that brings it changes the
    /// state, so a sync that reads the change reads it by this quota).
    #[inline]
    pub(super) fn set_quota(&self, index: u32) {
        if self.quota.load(Ordering::Relaxed) != index {
            self.quota.store(index, Ordering::Relaxed);
        }
    }

    /// Whether the others' state in the entry predates a gap in the subscription.
    #[inline]
    pub(super) fn stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }

    /// Marks the others' state as heard before a gap (`true`) or just pushed (`false`).
    #[inline]
    pub(super) fn set_stale(&self, stale: bool) {
        if self.stale.load(Ordering::Relaxed) != stale {
            self.stale.store(stale, Ordering::Relaxed);
        }
    }

    /// Takes the hints (the sync thread, before it reads the state): clears the queued and
    /// urgent bits, so a request after this queues the key again, and returns the denied
    /// units (the unheard count stays: a publish is heard once its push comes back).
    pub(super) fn take_pending(&self) -> u64 {
        let keep = UNHEARD_MAX << UNHEARD_AT;
        self.pending.fetch_and(keep, Ordering::AcqRel) & u64::from(u32::MAX)
    }

    /// What a decision reads beside the state.
    #[inline]
    pub(super) fn seen(&self) -> Seen {
        Seen {
            stale: self.stale(),
            unheard: self.pending.load(Ordering::Relaxed) >> UNHEARD_AT & UNHEARD_MAX,
        }
    }

    /// Counts `units` admitted that the others have not heard of.
    #[inline]
    pub(super) fn add_unheard(&self, units: u64) {
        self.set_unheard(|n| n.saturating_add(units));
    }

    /// Sets the units the others have not heard of, from what a push held of this instance.
    pub(super) fn set_unheard(&self, f: impl Fn(u64) -> u64) {
        let _ = self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                let n = f(p >> UNHEARD_AT & UNHEARD_MAX).min(UNHEARD_MAX);
                Some(p & !(UNHEARD_MAX << UNHEARD_AT) | n << UNHEARD_AT)
            });
    }
}

impl<S: StateCells> StateCell<S> for HybridCell<S> {
    fn new(state: S) -> Self {
        Self {
            state: S::CasCell::new(state),
            pending: AtomicU64::new(0),
            quota: AtomicU32::new(0),
            stale: AtomicBool::new(false),
        }
    }

    #[inline(always)]
    fn update<T>(&self, stats: &Stats, f: impl FnMut(&mut S) -> T) -> Option<T> {
        self.state.update(stats, f)
    }

    fn rewrite(&self, f: impl FnMut(&mut S)) -> bool {
        self.state.rewrite(f)
    }

    fn kill_if(&self, doomed: impl Fn(&S) -> bool) -> bool {
        self.state.kill_if(doomed)
    }

    #[inline]
    fn inspect<T>(&self, f: impl FnOnce(&S) -> T) -> Option<T> {
        self.state.inspect(f)
    }
}

impl<S: StateCells> fmt::Debug for HybridCell<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HybridCell")
            .field("state", &self.state)
            .field("pending", &self.pending.load(Ordering::Relaxed))
            .finish()
    }
}

/// The store variant of the hybrid limiter: its cells are [`HybridCell`]s.
#[derive(Debug, Clone, Copy)]
pub enum Hybrid {}

impl<A: super::Engine> Variant<super::Fleet<A>> for Hybrid {}

/// Required of every variant (the compact table's slot); the hybrid limiter keeps its entries
/// in the keyed map only, so this slot is never built.
impl<A: super::Engine> crate::limiter::sealed::VariantSlot<super::Fleet<A>> for Hybrid {
    type Slot<R: crate::storage::KeyRepr> =
        crate::compact::slot::LockSlot<R, <super::Fleet<A> as crate::algo::Algorithm>::State>;
}

impl<A: super::Engine> VariantCell<super::Fleet<A>> for Hybrid {
    type Cell = HybridCell<A::Word>;
}

/// An instance's own 128-bit state and what it knows of the others' (the sliding window and
/// the exponential limiter): two words, so the core keeps them behind its per-key lock, as it
/// keeps the sliding log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    pub(super) own: u128,
    pub(super) others: u128,
}

impl Sealed for Pair {}
impl State for Pair {}

/// Two 128-bit words: a lock slot, were the hybrid's entries ever kept in a compact table.
impl crate::storage::StateSlot for Pair {
    type CasSlot<R: crate::storage::KeyRepr> = crate::compact::slot::LockSlot<R, Pair>;
}

impl StateCells for Pair {
    type CasCell = LockCell<Pair>;
    type Kept = Option<Pair>;

    fn keep(state: Pair) -> Option<Pair> {
        Some(state)
    }

    fn dead() -> Option<Pair> {
        None
    }

    fn live(kept: &Option<Pair>) -> Option<&Pair> {
        kept.as_ref()
    }

    fn live_mut(kept: &mut Option<Pair>) -> Option<&mut Pair> {
        kept.as_mut()
    }
}

/// A merged state's two halves: this instance's own state word and the others' merged one.
pub trait Halves: State + Copy {
    /// The state word of one side.
    type Half: Copy + Eq;
    /// Both halves.
    fn split(self) -> (Self::Half, Self::Half);
    /// The state of `own` and `others`.
    fn join(own: Self::Half, others: Self::Half) -> Self;
}

/// `own` in the low 64 bits, `others` in the high ones: one word, one CAS (the fixed window,
/// EARRRL). Never all ones (the tombstone): `own` is an algorithm's word, never all ones.
impl Halves for u128 {
    type Half = u64;

    #[inline]
    fn split(self) -> (u64, u64) {
        (self as u64, (self >> 64) as u64)
    }

    #[inline]
    fn join(own: u64, others: u64) -> u128 {
        u128::from(others) << 64 | u128::from(own)
    }
}

impl Halves for Pair {
    type Half = u128;

    #[inline]
    fn split(self) -> (u128, u128) {
        (self.own, self.others)
    }

    #[inline]
    fn join(own: u128, others: u128) -> Pair {
        Pair { own, others }
    }
}
