//! One import path for every atomic and lock the crate's concurrency protocol uses.
//!
//! Under `--cfg hotlimit_loom` these become loom's model-checked types, so the CAS cell and the
//! eviction protocol run unchanged inside `loom::model`. The cfg is crate-named (not plain
//! `loom`) so it does not flip `cfg(loom)` code inside our dependencies.

#[cfg(not(hotlimit_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(hotlimit_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

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
}
