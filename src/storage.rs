//! How a store keeps a state, as traits only: every [`State`](crate::algo::State) is
//! [`StateCells`] (the papaya store's cell) and [`StateSlot`] (the compact table's slot), so
//! any algorithm runs on any store and no caller writes a storage bound. The impls sit beside
//! the cells (`cell.rs`) and slots (`compact/slot.rs`); this leaf module only declares, so the
//! algorithms can require it without depending on the stores.

use crate::stats::Stats;
use std::fmt;
use std::hash::Hash;

/// The operations every cell offers the stores.
pub trait StateCell<S>: Send + Sync + fmt::Debug {
    /// A cell holding `state`.
    fn new(state: S) -> Self;
    /// Runs `f` on the state (a copy of the word, or the state under the lock) and keeps what
    /// it leaves; `None` if the cell is dead (evicted) and nothing ran. `f` may run more than
    /// once (a lost CAS race re-runs it on the word that won), so it must be pure.
    fn update<T>(&self, stats: &Stats, f: impl FnMut(&mut S) -> T) -> Option<T>;
    /// [`update`](StateCell::update) of a cell no sweep ever kills (the direct limiter's
    /// one): a CAS cell skips the tombstone test; were a cell dead, `f` runs on `fresh()`.
    #[inline(always)]
    fn update_live<T>(
        &self,
        stats: &Stats,
        mut f: impl FnMut(&mut S) -> T,
        fresh: impl FnOnce() -> S,
    ) -> T {
        self.update(stats, &mut f)
            .unwrap_or_else(|| f(&mut fresh()))
    }
    /// Runs `f` on the state and writes the result back (joining a remembered debt into a
    /// state just inserted). `false` if the cell is dead.
    fn rewrite(&self, f: impl FnMut(&mut S)) -> bool;
    /// Replaces the state with the tombstone if `doomed` holds for it; `true` if this call
    /// killed the cell.
    fn kill_if(&self, doomed: impl Fn(&S) -> bool) -> bool;
    /// Looks at the state; `None` if dead.
    fn inspect<T>(&self, f: impl FnOnce(&S) -> T) -> Option<T>;
}

/// How the stores keep a state: the cell of the lock-free store, and how a lock (a
/// `LockCell`, or the compact store's lock slot) marks the state dead. Implemented in
/// `cell.rs` for every state type of `algo`, so that the algorithms know nothing of their
/// storage. Sealed (private module).
pub trait StateCells: Sized + Send + Sync + 'static {
    /// The cell of the lock-free store: a CAS cell for words, a lock cell for the rest.
    type CasCell: StateCell<Self>;
    /// The state as a lock keeps it: a word with its tombstone, any other state in an
    /// `Option` (`None` once dead), so no algorithm state carries a storage flag.
    type Kept: Send + Sync + fmt::Debug;
    fn keep(state: Self) -> Self::Kept;
    fn dead() -> Self::Kept;
    fn live(kept: &Self::Kept) -> Option<&Self>;
    fn live_mut(kept: &mut Self::Kept) -> Option<&mut Self>;
}

/// What every slot offers the table. A slot is free (its state is the tombstone) or holds one
/// key's live state.
pub trait TableSlot<R, S>: Send + Sync + fmt::Debug + Sized {
    /// A free slot.
    fn empty() -> Self;
    /// Runs `f` on the state if the slot holds `key` live, keeping what it leaves; `None` if
    /// it does not (or stopped doing so before `f`'s result could be installed). `f` may run
    /// more than once (a lost CAS race re-runs it on the word that won), so it must be pure.
    /// `fp` is `key`'s fingerprint (odd).
    fn try_update<T>(
        &self,
        key: R,
        fp: u64,
        stats: &Stats,
        f: &mut impl FnMut(&mut S) -> T,
    ) -> Option<T>;
    /// Whether the slot holds `key` live (exact: verified under the lock for a lock slot).
    fn holds(&self, key: R, fp: u64) -> bool;
    /// Whether the slot looks free (a hint for the insert path; [`claim`](TableSlot::claim) is
    /// the authority).
    fn looks_free(&self) -> bool;
    /// Installs `key` with `fresh` if the slot is free; `true` on success.
    fn claim(&self, key: R, fp: u64, fresh: S) -> bool;
    /// Frees the slot if it is live and `doomed` holds for its state; `true` if this call freed
    /// it. A concurrent update makes the attempt fail and `doomed` is asked about the winner.
    fn kill_if(&self, doomed: impl Fn(R, &S) -> bool) -> bool;
    /// Looks at the key and state; `None` if free.
    fn inspect<T>(&self, f: impl FnOnce(R, &S) -> T) -> Option<T>;
}

/// A key's inline form in a slot: `u64` or `u128`. Sealed.
pub trait KeyRepr:
    ReprSlot + Copy + Eq + Hash + Default + Send + Sync + fmt::Debug + 'static
{
}

/// The lock-free slot for a key form holding a 64-bit state word.
pub trait ReprSlot: Sized {
    /// The slot.
    type WordSlot: TableSlot<Self, u64>;
}

/// The slot of the lock-free ([`Cas`](crate::store::Cas)) variant for a state type.
pub trait StateSlot: Sized {
    /// The slot, for keys of form `R`.
    type CasSlot<R: KeyRepr>: TableSlot<R, Self>;
}
