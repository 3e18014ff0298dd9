//! The slots of the compact table: [`PairSlot`] (a 64-bit key and a 64-bit state in one
//! 128-bit word, updated by one compare-and-swap) and [`LockSlot`] (key and state behind a
//! per-slot mutex, for everything else), and the atomics they need that `crate::sync` lacks.

use crate::algo::Algorithm;
use crate::cell::{AtomicWord, StateCells};
use crate::limiter::{Cas, Locked};
use crate::stats::Stats;
pub use crate::storage::{KeyRepr, ReprSlot, StateSlot, TableSlot};
use crate::sync::{cas_loop, Atomic128, AtomicU64, CasAtomic, Mutex, Ordering, Round};
use std::fmt;

pub(crate) use crate::limiter::sealed::VariantSlot;

impl KeyRepr for u64 {}
impl KeyRepr for u128 {}

/// 64-bit keys get the lock-free pair slot.
impl ReprSlot for u64 {
    type WordSlot = PairSlot;
}

/// A 128-bit key and a 64-bit state do not fit one double-width CAS (and loom has no 128-bit
/// atomic to model a versioned design with), so they take the lock slot.
impl ReprSlot for u128 {
    type WordSlot = LockSlot<u128, u64>;
}

impl StateSlot for u64 {
    type CasSlot<R: KeyRepr> = R::WordSlot;
}

/// A u128 state and its key need up to 256 bits: no single CAS covers them, so a lock slot.
impl StateSlot for u128 {
    type CasSlot<R: KeyRepr> = LockSlot<R, u128>;
}

impl StateSlot for crate::algo::LogState {
    type CasSlot<R: KeyRepr> = LockSlot<R, Self>;
}

impl StateSlot for crate::algo::BucketState {
    type CasSlot<R: KeyRepr> = LockSlot<R, Self>;
}

/// Two quotas' states that do not pack into one word ([`AllOf`](crate::algo::AllOf)).
impl<A: crate::algo::State, B: crate::algo::State> StateSlot for crate::algo::PairState<A, B> {
    type CasSlot<R: KeyRepr> = LockSlot<R, Self>;
}

impl<A: Algorithm> VariantSlot<A> for Cas {
    type Slot<R: KeyRepr> = <A::State as StateSlot>::CasSlot<R>;
}

impl<A: Algorithm> VariantSlot<A> for Locked {
    type Slot<R: KeyRepr> = LockSlot<R, A::State>;
}

/// The per-line reach counters (see `compact.rs`): loom's under `--cfg hotlimit_loom`.
#[cfg(not(hotlimit_loom))]
pub(crate) use std::sync::atomic::AtomicU8;

#[cfg(hotlimit_loom)]
pub(crate) use loom::sync::atomic::AtomicU8;

const TOMB: u64 = <u64 as AtomicWord>::TOMBSTONE;

#[inline(always)]
fn pack(key: u64, state: u64) -> u128 {
    (u128::from(key) << 64) | u128::from(state)
}

#[inline(always)]
fn split(word: u128) -> (u64, u64) {
    ((word >> 64) as u64, word as u64)
}

/// One 16-byte slot: `(key, state)` in one 128-bit word, four to a cache line.
///
/// Free iff the state half is the tombstone (all ones, which no algorithm stores), so the key
/// half may take any value. Every write is a CAS on the whole pair, so a request's CAS
/// succeeds only if the slot still holds *its* key with the state it computed from: a request
/// delayed while its key was evicted and the slot reused by another key cannot write into the
/// new owner (the key half differs). If the slot was reused by the same key and holds the very
/// state the request read, the CAS succeeds, and rightly: the request's decision is a pure
/// function of that state, so it is the decision a fresh look-up would have made.
pub struct PairSlot {
    word: Atomic128,
}

impl PairSlot {
    /// The current `(key, state)`. Inlined: a batch's loads pass calls it once a key, and
    /// the fewer instructions stand between two keys' loads, the more of their misses the
    /// CPU keeps in flight (`BENCHMARKS.md`, "Batches: what overlaps").
    #[inline(always)]
    fn get(&self) -> (u64, u64) {
        split(self.word.load())
    }
}

impl fmt::Debug for PairSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (key, state) = self.get();
        f.debug_struct("PairSlot")
            .field("key", &key)
            .field("state", &state)
            .finish()
    }
}

impl TableSlot<u64, u64> for PairSlot {
    fn empty() -> Self {
        Self {
            word: Atomic128::new(pack(0, TOMB)),
        }
    }

    /// `CasCell::update` on the pair: the crate's one CAS loop, writing only into a slot that
    /// still holds `key`.
    #[inline(always)]
    fn try_update<T>(
        &self,
        key: u64,
        _fp: u64,
        stats: &Stats,
        f: &mut impl FnMut(&mut u64) -> T,
    ) -> Option<T> {
        cas_loop(
            &self.word,
            || stats.retry(),
            |current| {
                let (k, state) = split(current);
                if k != key || state == TOMB {
                    return Round::done(None);
                }
                let mut new = state;
                let out = f(&mut new);
                // A leaky denial writes nothing: linearized at the load, which saw `key` live.
                if new == state {
                    Round::done(Some(out))
                } else {
                    Round::write(pack(key, new), Some(out))
                }
            },
        )
    }

    #[inline]
    fn holds(&self, key: u64, _fp: u64) -> bool {
        let (k, state) = self.get();
        k == key && state != TOMB
    }

    #[inline]
    fn looks_free(&self) -> bool {
        self.get().1 == TOMB
    }

    fn claim(&self, key: u64, _fp: u64, fresh: u64) -> bool {
        cas_loop(
            &self.word,
            || {},
            |current| {
                if split(current).1 != TOMB {
                    Round::done(false)
                } else {
                    Round::write(pack(key, fresh), true)
                }
            },
        )
    }

    fn kill_if(&self, doomed: impl Fn(u64, &u64) -> bool) -> bool {
        cas_loop(
            &self.word,
            || {},
            |current| {
                let (k, state) = split(current);
                if state == TOMB || !doomed(k, &state) {
                    return Round::done(false);
                }
                // The key stays as a harmless label: a free slot is told by its state alone.
                Round::write(pack(k, TOMB), true)
            },
        )
    }

    #[inline]
    fn inspect<T>(&self, f: impl FnOnce(u64, &u64) -> T) -> Option<T> {
        let (key, state) = self.get();
        (state != TOMB).then(|| f(key, &state))
    }
}

/// A slot whose key and state sit behind a mutex: the compact store's slot for the
/// [`Locked`] variant, for states that are not 64-bit words, and for 128-bit
/// keys. The same per-key lock as [`LockCell`](crate::cell::LockCell), inline in the table.
///
/// `hint` lets look-ups skip slots without locking them: the key's fingerprint (odd) while
/// the slot is live, 0 while free. It is written under the lock, after the entry, so it is
/// never ahead of the entry; a look-up that is misled by a stale hint either locks and finds
/// the truth, or misses and falls back to the insert path, which re-checks under the home
/// line's lock (see `compact.rs`).
pub struct LockSlot<R, S: StateCells> {
    hint: AtomicU64,
    entry: Mutex<(R, S::Kept)>,
}

impl<R: fmt::Debug, S: StateCells> fmt::Debug for LockSlot<R, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockSlot")
            .field(&*self.entry.lock())
            .finish()
    }
}

impl<R: KeyRepr, S: StateCells> LockSlot<R, S> {
    /// Runs `f` on the state under the lock if the slot holds `key` live.
    #[inline(always)]
    fn locked<T>(&self, key: R, fp: u64, f: impl FnOnce(&mut S) -> T) -> Option<T> {
        if self.hint.load(Ordering::Acquire) != fp {
            return None;
        }
        let mut entry = self.entry.lock();
        if entry.0 != key {
            return None;
        }
        S::live_mut(&mut entry.1).map(f)
    }
}

impl<R, S> TableSlot<R, S> for LockSlot<R, S>
where
    R: KeyRepr,
    S: StateCells,
{
    fn empty() -> Self {
        Self {
            hint: AtomicU64::new(0),
            entry: Mutex::new((R::default(), S::dead())),
        }
    }

    #[inline(always)]
    fn try_update<T>(
        &self,
        key: R,
        fp: u64,
        _stats: &Stats,
        f: &mut impl FnMut(&mut S) -> T,
    ) -> Option<T> {
        self.locked(key, fp, f)
    }

    fn holds(&self, key: R, fp: u64) -> bool {
        if self.hint.load(Ordering::Acquire) != fp {
            return false;
        }
        let entry = self.entry.lock();
        entry.0 == key && S::live(&entry.1).is_some()
    }

    fn looks_free(&self) -> bool {
        self.hint.load(Ordering::Acquire) == 0
    }

    fn claim(&self, key: R, fp: u64, fresh: S) -> bool {
        let mut entry = self.entry.lock();
        if S::live(&entry.1).is_some() {
            return false;
        }
        *entry = (key, S::keep(fresh));
        self.hint.store(fp, Ordering::Release);
        true
    }

    fn kill_if(&self, doomed: impl Fn(R, &S) -> bool) -> bool {
        let mut entry = self.entry.lock();
        let key = entry.0;
        if !S::live(&entry.1).is_some_and(|state| doomed(key, state)) {
            return false;
        }
        entry.1 = S::dead();
        self.hint.store(0, Ordering::Release);
        true
    }

    fn inspect<T>(&self, f: impl FnOnce(R, &S) -> T) -> Option<T> {
        if self.hint.load(Ordering::Acquire) == 0 {
            return None;
        }
        let entry = self.entry.lock();
        S::live(&entry.1).map(|state| f(entry.0, state))
    }
}
