//! The per-key cells: [`CasCell`] (a word updated by the crate's one CAS loop, `sync::cas_loop`)
//! and [`LockCell`] (the mutex twin), and the eviction tombstone they share.
//!
//! **Eviction protocol.** The sweeper never removes a live cell. It first replaces the cell's
//! word with `TOMBSTONE` (all ones, a value no algorithm stores), by CAS or under the lock, and
//! only if the word it saw is idle; then it removes that exact cell from the map. A request
//! that finds the tombstone (at its load, or as the value that beat its CAS) has not been
//! counted anywhere: it removes the dead cell itself if the sweeper has not yet, and looks the
//! key up again. So an update lands either before the tombstone (and the sweeper's CAS fails,
//! keeping the key) or on a fresh cell, never on an orphan. `tests/loom.rs` model-checks it.

use crate::algo::{BucketState, LogState, PairState, State};
use crate::stats::Stats;
pub use crate::storage::{StateCell, StateCells};
use crate::sync::{cas_loop, Atomic128, AtomicU64, CasAtomic, Mutex, Round};
use std::fmt;

/// A state word and its atomic (from `sync`, where the crate's one CAS loop lives). Sealed:
/// implemented for `u64` and `u128` only.
pub trait AtomicWord: State + Copy + Eq {
    /// All ones: marks a cell being evicted. No algorithm stores it.
    const TOMBSTONE: Self;
    type Atomic: CasAtomic<Word = Self>;
}

impl AtomicWord for u64 {
    const TOMBSTONE: u64 = u64::MAX;
    type Atomic = AtomicU64;
}

impl AtomicWord for u128 {
    const TOMBSTONE: u128 = u128::MAX;
    type Atomic = Atomic128;
}

macro_rules! word_cells {
    ($($t:ty),*) => {$(
        impl StateCells for $t {
            type CasCell = CasCell<$t>;
            type Kept = $t;
            #[inline(always)]
            fn keep(state: Self) -> Self {
                state
            }
            #[inline(always)]
            fn dead() -> Self {
                <$t as AtomicWord>::TOMBSTONE
            }
            #[inline(always)]
            fn live(kept: &Self) -> Option<&Self> {
                (*kept != <$t as AtomicWord>::TOMBSTONE).then_some(kept)
            }
            #[inline(always)]
            fn live_mut(kept: &mut Self) -> Option<&mut Self> {
                (*kept != <$t as AtomicWord>::TOMBSTONE).then_some(kept)
            }
        }
    )*};
}
word_cells!(u64, u128);

/// The states that are not words: behind a lock even in the lock-free store.
macro_rules! locked_cells {
    ($($t:ty $(, <$($g:ident),*>)?);*) => {$(
        impl$(<$($g: State),*>)? StateCells for $t {
            type CasCell = LockCell<Self>;
            type Kept = Option<Self>;
            #[inline(always)]
            fn keep(state: Self) -> Option<Self> {
                Some(state)
            }
            #[inline(always)]
            fn dead() -> Option<Self> {
                None
            }
            #[inline(always)]
            fn live(kept: &Option<Self>) -> Option<&Self> {
                kept.as_ref()
            }
            #[inline(always)]
            fn live_mut(kept: &mut Option<Self>) -> Option<&mut Self> {
                kept.as_mut()
            }
        }
    )*};
}
locked_cells!(LogState; BucketState; PairState<A, B>, <A, B>);

/// A state word updated by compare-and-swap.
pub struct CasCell<W: AtomicWord> {
    word: W::Atomic,
}

impl<W: AtomicWord> CasCell<W> {
    /// The current word.
    #[inline]
    pub(crate) fn load(&self) -> W {
        self.word.load()
    }
}

impl<W: AtomicWord> StateCell<W> for CasCell<W> {
    #[inline]
    fn new(value: W) -> Self {
        Self {
            word: W::Atomic::new(value),
        }
    }

    /// Runs the pure `f` on a copy of the current word and installs what it left by the
    /// crate's one CAS loop, re-running `f` on the word that won a race. An unchanged word (a
    /// leaky denial) needs no CAS at all.
    #[inline(always)]
    fn update<T>(&self, stats: &Stats, mut f: impl FnMut(&mut W) -> T) -> Option<T> {
        cas_loop(
            &self.word,
            || stats.retry(),
            |current| {
                if current == W::TOMBSTONE {
                    return Round::done(None);
                }
                let mut new = current;
                let out = f(&mut new);
                if new == current {
                    Round::done(Some(out))
                } else {
                    Round::write(new, Some(out))
                }
            },
        )
    }

    /// No tombstone test: the cell is never killed, and no algorithm stores all ones.
    #[inline(always)]
    fn update_live<T>(
        &self,
        stats: &Stats,
        mut f: impl FnMut(&mut W) -> T,
        _: impl FnOnce() -> W,
    ) -> T {
        cas_loop(
            &self.word,
            || stats.retry(),
            |current| {
                let mut new = current;
                let out = f(&mut new);
                if new == current {
                    Round::done(out)
                } else {
                    Round::write(new, out)
                }
            },
        )
    }

    fn rewrite(&self, mut f: impl FnMut(&mut W)) -> bool {
        cas_loop(
            &self.word,
            || {},
            |current| {
                if current == W::TOMBSTONE {
                    return Round::done(false);
                }
                let mut new = current;
                f(&mut new);
                // Even when `new == current`: the CAS is the write that later updates read from.
                Round::write(new, true)
            },
        )
    }

    /// A concurrent update makes the CAS fail, and `doomed` is asked again about the word
    /// that won.
    fn kill_if(&self, doomed: impl Fn(&W) -> bool) -> bool {
        cas_loop(
            &self.word,
            || {},
            |current| {
                if current == W::TOMBSTONE || !doomed(&current) {
                    Round::done(false)
                } else {
                    Round::write(W::TOMBSTONE, true)
                }
            },
        )
    }

    #[inline]
    fn inspect<T>(&self, f: impl FnOnce(&W) -> T) -> Option<T> {
        let word = self.load();
        (word != W::TOMBSTONE).then(|| f(&word))
    }
}

impl<W: AtomicWord> fmt::Debug for CasCell<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CasCell").field(&self.load()).finish()
    }
}

/// A key's state behind a `parking_lot` mutex: the pessimistic twin of [`CasCell`], running the
/// same pure step under the lock. Also the lock-free store's cell for states that are not
/// words (the sliding log, the sub-window counters).
pub struct LockCell<S: StateCells> {
    state: Mutex<S::Kept>,
}

impl<S: StateCells> StateCell<S> for LockCell<S> {
    #[inline]
    fn new(state: S) -> Self {
        Self {
            state: Mutex::new(S::keep(state)),
        }
    }

    #[inline(always)]
    fn update<T>(&self, _: &Stats, f: impl FnMut(&mut S) -> T) -> Option<T> {
        S::live_mut(&mut self.state.lock()).map(f)
    }

    fn rewrite(&self, f: impl FnMut(&mut S)) -> bool {
        // The lock orders it with every later update.
        S::live_mut(&mut self.state.lock()).map(f).is_some()
    }

    fn kill_if(&self, doomed: impl Fn(&S) -> bool) -> bool {
        let mut state = self.state.lock();
        if !S::live(&state).is_some_and(doomed) {
            return false;
        }
        *state = S::dead();
        true
    }

    #[inline]
    fn inspect<T>(&self, f: impl FnOnce(&S) -> T) -> Option<T> {
        S::live(&self.state.lock()).map(f)
    }
}

impl<S: StateCells> fmt::Debug for LockCell<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockCell")
            .field(&*self.state.lock())
            .finish()
    }
}
