//! The per-key cells: [`CasCell`] (the crate's one CAS loop) and [`LockCell`] (the mutex twin).

use crate::algo::{Algorithm, Word};
use crate::decision::Decision;
use crate::stats::Stats;
use crate::sync::{AtomicU64, Backoff, Mutex, Ordering};
use std::fmt;

/// Atomic operations over a state word. Sealed: implemented for `u64` and `u128` only.
pub trait AtomicWord: Copy + Eq + fmt::Debug + Send + Sync + 'static {
    #[doc(hidden)]
    type Atomic: Send + Sync;
    #[doc(hidden)]
    fn new_atomic(value: Self) -> Self::Atomic;
    #[doc(hidden)]
    fn load(atomic: &Self::Atomic) -> Self;
    #[doc(hidden)]
    fn cas_weak(atomic: &Self::Atomic, current: Self, new: Self) -> Result<Self, Self>;
}

// Acquire/AcqRel: a request that sees a word also sees everything its writer saw (the
// eviction protocol relies on this); on x86 they cost nothing over Relaxed.
impl AtomicWord for u64 {
    type Atomic = AtomicU64;

    #[inline]
    fn new_atomic(value: u64) -> AtomicU64 {
        AtomicU64::new(value)
    }

    #[inline]
    fn load(atomic: &AtomicU64) -> u64 {
        atomic.load(Ordering::Acquire)
    }

    #[inline]
    fn cas_weak(atomic: &AtomicU64, current: u64, new: u64) -> Result<u64, u64> {
        atomic.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
    }
}

/// 128-bit words go through `portable-atomic` (lock-free `cmpxchg16b`/`CASP`, detected at
/// run time). loom has no 128-bit atomic, so loom models cover the u64 cell only.
impl AtomicWord for u128 {
    type Atomic = portable_atomic::AtomicU128;

    #[inline]
    fn new_atomic(value: u128) -> Self::Atomic {
        portable_atomic::AtomicU128::new(value)
    }

    #[inline]
    fn load(atomic: &Self::Atomic) -> u128 {
        atomic.load(portable_atomic::Ordering::Acquire)
    }

    #[inline]
    fn cas_weak(atomic: &Self::Atomic, current: u128, new: u128) -> Result<u128, u128> {
        atomic.compare_exchange_weak(
            current,
            new,
            portable_atomic::Ordering::AcqRel,
            portable_atomic::Ordering::Acquire,
        )
    }
}

/// A state word updated by compare-and-swap.
pub struct CasCell<W: Word> {
    word: W::Atomic,
}

impl<W: Word> CasCell<W> {
    /// A cell holding `value`.
    #[inline]
    pub(crate) fn new(value: W) -> Self {
        Self {
            word: W::new_atomic(value),
        }
    }

    /// The current word.
    #[inline]
    pub(crate) fn load(&self) -> W {
        W::load(&self.word)
    }

    /// The crate's one CAS loop: runs the pure `f` on the current word; if it returns a new
    /// word, installs it with `compare_exchange_weak`, and on failure re-runs `f` on the word
    /// that won. An unchanged word (a leaky denial) needs no CAS at all.
    #[inline(always)]
    pub(crate) fn update<T>(&self, stats: &Stats, mut f: impl FnMut(W) -> (T, Option<W>)) -> T {
        let mut current = self.load();
        let backoff = Backoff::new();
        loop {
            let (out, new) = f(current);
            let Some(new) = new else { return out };
            match W::cas_weak(&self.word, current, new) {
                Ok(_) => return out,
                Err(actual) => {
                    stats.retry();
                    current = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// Runs one algorithm step.
    #[inline(always)]
    pub(crate) fn step<A: Algorithm<State = W>>(
        &self,
        algo: &A,
        now: u64,
        cost: u64,
        stats: &Stats,
    ) -> Decision {
        self.update(stats, |w| {
            let step = algo.step(w, now, cost);
            (step.decision, step.state)
        })
    }
}

impl<W: Word> fmt::Debug for CasCell<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CasCell").field(&self.load()).finish()
    }
}

/// A key's state behind a `parking_lot` mutex: the pessimistic twin of [`CasCell`].
pub struct LockCell<S> {
    state: Mutex<S>,
}

impl<S> LockCell<S> {
    #[inline]
    pub(crate) fn new(state: S) -> Self {
        Self {
            state: Mutex::new(state),
        }
    }

    /// Runs `f` on the state under the lock.
    #[inline]
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut S) -> T) -> T {
        f(&mut self.state.lock())
    }
}

impl<S: fmt::Debug> fmt::Debug for LockCell<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockCell")
            .field(&*self.state.lock())
            .finish()
    }
}
