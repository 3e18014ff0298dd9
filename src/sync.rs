//! One import path for every atomic and lock the crate's concurrency protocol uses, and the
//! crate's one compare-and-swap loop ([`cas_loop`]) over them.
//!
//! Under `--cfg hotlimit_loom` these become loom's model-checked types, so the CAS cell, the
//! compact store's pair slot and the eviction protocol run unchanged inside `loom::model`. The
//! cfg is crate-named (not plain `loom`) so it does not flip `cfg(loom)` code inside our
//! dependencies.

#[cfg(not(hotlimit_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};

#[cfg(hotlimit_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};

/// The per-key lock of the pessimistic twin.
#[cfg(not(hotlimit_loom))]
pub(crate) use parking_lot::Mutex;

/// loom's mutex, wrapped to parking_lot's non-poisoning `lock()` signature.
#[cfg(hotlimit_loom)]
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(hotlimit_loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        // A panic inside a model already fails the model; poisoning adds nothing.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn try_lock(&self) -> Option<loom::sync::MutexGuard<'_, T>> {
        self.0.try_lock().ok()
    }
}

/// The compact table's `grow` lock: shared by its walks and kills, exclusive for a split.
#[cfg(not(hotlimit_loom))]
pub(crate) use parking_lot::RwLock;

/// loom's read-write lock, wrapped to parking_lot's signatures.
#[cfg(hotlimit_loom)]
#[derive(Debug, Default)]
pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

#[cfg(hotlimit_loom)]
impl<T> RwLock<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(loom::sync::RwLock::new(value))
    }

    pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// loom's readers never wait behind a writer that waits: `read` serves.
    pub(crate) fn read_recursive(&self) -> loom::sync::RwLockReadGuard<'_, T> {
        self.read()
    }

    pub(crate) fn try_write(&self) -> Option<loom::sync::RwLockWriteGuard<'_, T>> {
        self.0.try_write().ok()
    }

    /// loom has no timed lock: one try, the timeout's outcome where the lock is held.
    pub(crate) fn try_write_for(
        &self,
        _: std::time::Duration,
    ) -> Option<loom::sync::RwLockWriteGuard<'_, T>> {
        self.try_write()
    }
}

/// A `Copy` value read by every request and replaced rarely: a live configuration. A
/// sequence lock (`crossbeam`'s `AtomicCell`): reads never write shared memory.
#[cfg(not(hotlimit_loom))]
pub(crate) use crossbeam_utils::atomic::AtomicCell;

/// Under loom, a model-checked lock with `AtomicCell`'s `load`/`store`.
#[cfg(hotlimit_loom)]
pub(crate) struct AtomicCell<T>(loom::sync::Mutex<T>);

#[cfg(hotlimit_loom)]
impl<T: Copy> AtomicCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(loom::sync::Mutex::new(value))
    }

    pub(crate) fn load(&self) -> T {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn store(&self, value: T) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = value;
    }
}

/// Spin-then-yield backoff after a failed CAS. loom needs an explicit yield to explore the
/// other thread instead of spinning forever.
#[cfg(not(hotlimit_loom))]
pub(crate) use crossbeam_utils::Backoff;

#[cfg(hotlimit_loom)]
#[derive(Debug, Default)]
pub(crate) struct Backoff;

#[cfg(hotlimit_loom)]
impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff
    }

    pub(crate) fn spin(&self) {
        loom::thread::yield_now();
    }

    pub(crate) fn snooze(&self) {
        loom::thread::yield_now();
    }
}

/// A word that one compare-and-swap replaces whole: [`AtomicU64`], or [`Atomic128`] for the
/// two-word states and the compact store's `(key, state)` pairs. Sealed (a public trait in a
/// private module).
///
/// Acquire loads and AcqRel CASes: a request that sees a word also sees everything its writer
/// saw (the eviction protocol relies on this); on x86 they cost nothing over Relaxed.
pub trait CasAtomic: Send + Sync {
    /// The word.
    type Word: Copy + Eq;
    /// An atomic holding `word`.
    fn new(word: Self::Word) -> Self;
    /// The current word.
    fn load(&self) -> Self::Word;
    /// `compare_exchange_weak(current, new)`: `Err` carries the word that won.
    fn cas_weak(&self, current: Self::Word, new: Self::Word) -> Result<Self::Word, Self::Word>;
}

impl CasAtomic for AtomicU64 {
    type Word = u64;

    #[inline(always)]
    fn new(word: u64) -> Self {
        AtomicU64::new(word)
    }

    #[inline(always)]
    fn load(&self) -> u64 {
        AtomicU64::load(self, Ordering::Acquire)
    }

    #[inline(always)]
    fn cas_weak(&self, current: u64, new: u64) -> Result<u64, u64> {
        self.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
    }
}

/// A 128-bit word updated by one double-width compare-and-swap: `portable-atomic`'s
/// `AtomicU128` (lock-free `cmpxchg16b` / `CASP`, detected at run time; on a CPU without
/// them, portable-atomic's lock fallback, as `docs/limiters.md` says).
///
/// loom has no 128-bit atomic. Under `--cfg hotlimit_loom` this is a loom mutex around a
/// `u128` behind the same three operations: each is one indivisible step, which is exactly
/// what the instruction gives, so loom explores every interleaving of those steps; what it does
/// not model is the weaker-than-SeqCst visibility an `AcqRel` CAS allows (on x86-64
/// `cmpxchg16b` is a full barrier anyway).
#[cfg(not(hotlimit_loom))]
#[derive(Debug)]
pub struct Atomic128(portable_atomic::AtomicU128);

/// The loom model of the 128-bit word: see the non-loom definition.
#[cfg(hotlimit_loom)]
#[derive(Debug)]
pub struct Atomic128(loom::sync::Mutex<u128>);

#[cfg(not(hotlimit_loom))]
impl CasAtomic for Atomic128 {
    type Word = u128;

    #[inline(always)]
    fn new(word: u128) -> Self {
        Self(portable_atomic::AtomicU128::new(word))
    }

    #[inline(always)]
    fn load(&self) -> u128 {
        self.0.load(portable_atomic::Ordering::Acquire)
    }

    #[inline(always)]
    fn cas_weak(&self, current: u128, new: u128) -> Result<u128, u128> {
        self.0.compare_exchange_weak(
            current,
            new,
            portable_atomic::Ordering::AcqRel,
            portable_atomic::Ordering::Acquire,
        )
    }
}

#[cfg(hotlimit_loom)]
impl CasAtomic for Atomic128 {
    type Word = u128;

    fn new(word: u128) -> Self {
        Self(loom::sync::Mutex::new(word))
    }

    fn load(&self) -> u128 {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cas_weak(&self, current: u128, new: u128) -> Result<u128, u128> {
        let mut word = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if *word == current {
            *word = new;
            Ok(current)
        } else {
            Err(*word)
        }
    }
}

/// What one round of [`cas_loop`] decides about the word it read: the word to install, if
/// any, and what to return once it is installed (or at once, if there is none).
///
/// A struct, not an enum with `T` in two variants: there `T` sits at a different offset in
/// each, and LLVM copied a `Decision` through that layout in byte pieces, twice the stores
/// on every check whose caller keeps the decision (BENCHMARKS.md, the step table).
pub(crate) struct Round<W, T> {
    write: Option<W>,
    out: T,
}

impl<W, T> Round<W, T> {
    /// Return `out` and write nothing (the word is dead, or the step left it unchanged).
    #[inline(always)]
    pub(crate) fn done(out: T) -> Self {
        Self { write: None, out }
    }

    /// Install `new` in place of the word read, and return `out` if that CAS wins.
    #[inline(always)]
    pub(crate) fn write(new: W, out: T) -> Self {
        Self {
            write: Some(new),
            out,
        }
    }
}

/// The crate's one compare-and-swap loop: `decide` looks at the current word; a
/// [`Round::write`] is installed with `compare_exchange_weak`, and on failure `decide` runs
/// again on the word that won (after `on_retry` and a backoff spin). So `decide` must be a pure
/// function of the word: it may run more than once. Every cell and slot operation (update,
/// rewrite, kill, claim) is a `decide` over this loop.
#[inline(always)]
pub(crate) fn cas_loop<A: CasAtomic, T>(
    atomic: &A,
    mut on_retry: impl FnMut(),
    mut decide: impl FnMut(A::Word) -> Round<A::Word, T>,
) -> T {
    let mut current = atomic.load();
    let backoff = Backoff::new();
    loop {
        let Round { write, out } = decide(current);
        let Some(new) = write else { return out };
        match atomic.cas_weak(current, new) {
            Ok(_) => return out,
            Err(actual) => {
                on_retry();
                current = actual;
                spin(&backoff);
            }
        }
    }
}

/// A lost race's backoff, out of line: the spin's loop and counters would otherwise take
/// registers from every uncontended check that inlines [`cas_loop`].
#[cold]
#[inline(never)]
fn spin(backoff: &Backoff) {
    backoff.spin();
}
