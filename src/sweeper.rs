//! Eviction reports and the background sweeper thread.
//!
//! The thread is named, sleeps on a condition variable between sweeps (no spinning), is woken
//! early when a capacity bound is exceeded, and is stopped and joined when its limiter is
//! dropped. A sweep takes no lock that `check` waits on: it walks the lock-free map and
//! evicts cell by cell with the tombstone protocol of `cell.rs`.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// What one sweep did.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = CasLimiter::<u64, Gcra, _>::builder("10/s".parse()?)
///     .clock(clock.clone())
///     .sweep_grace(Duration::ZERO)
///     .build()?;
/// limiter.check(&1);
/// limiter.check(&2);
/// assert_eq!(limiter.sweep().evicted_idle, 0); // both still counting down
/// clock.advance(Duration::from_millis(100));
/// let report = limiter.sweep();
/// assert_eq!((report.scanned, report.evicted_idle), (2, 2));
/// assert!(limiter.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Keys looked at.
    pub scanned: u64,
    /// Keys dropped because their state was equivalent to a fresh key's (lossless).
    pub evicted_idle: u64,
    /// Keys dropped to enforce `max_keys` (their live state is forgotten).
    pub evicted_capacity: u64,
    /// How long the sweep took.
    pub elapsed: Duration,
}

/// Totals over every sweep a limiter has run (by hand or in the background).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepTotals {
    /// Sweeps run.
    pub sweeps: u64,
    /// Keys dropped as idle.
    pub evicted_idle: u64,
    /// Keys dropped to enforce `max_keys`.
    pub evicted_capacity: u64,
    /// Time spent sweeping.
    pub busy: Duration,
}

/// Running totals, updated once per sweep.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    sweeps: AtomicU64,
    evicted_idle: AtomicU64,
    evicted_capacity: AtomicU64,
    busy_ns: AtomicU64,
}

impl Totals {
    pub(crate) fn add(&self, r: &SweepReport) {
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        self.evicted_idle
            .fetch_add(r.evicted_idle, Ordering::Relaxed);
        self.evicted_capacity
            .fetch_add(r.evicted_capacity, Ordering::Relaxed);
        let ns = u64::try_from(r.elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> SweepTotals {
        SweepTotals {
            sweeps: self.sweeps.load(Ordering::Relaxed),
            evicted_idle: self.evicted_idle.load(Ordering::Relaxed),
            evicted_capacity: self.evicted_capacity.load(Ordering::Relaxed),
            busy: Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
        }
    }
}

/// How the limiter talks to its sweeper thread.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    /// Set once, when the limiter is dropped. Also read (without the lock) inside a sweep so
    /// a long sweep stops early.
    stop: AtomicBool,
    /// Set by a request that pushed the map over `max_keys`; cleared by the sweeper.
    wake: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Signal {
    /// Asks for a sweep now. Cheap when one is already pending: a single swap. The first
    /// wake of a cycle takes the lock, so its notify cannot fall between the sweeper's check
    /// of the flag and its wait.
    #[inline]
    pub(crate) fn wake(&self) {
        if !self.wake.swap(true, Ordering::AcqRel) {
            let _guard = self.lock.lock();
            self.cv.notify_one();
        }
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// The handle of a running sweeper thread; stops and joins it on drop.
#[derive(Debug)]
pub(crate) struct Sweeper {
    signal: Arc<Signal>,
    thread: Option<JoinHandle<()>>,
}

impl Sweeper {
    /// Spawns a thread that runs `sweep` every `interval`, or sooner when woken.
    pub(crate) fn spawn(
        signal: Arc<Signal>,
        interval: Duration,
        sweep: impl Fn() + Send + 'static,
    ) -> std::io::Result<Self> {
        let s = signal.clone();
        let thread = std::thread::Builder::new()
            .name("hotlimit-sweeper".into())
            .spawn(move || {
                let mut guard = s.lock.lock();
                loop {
                    // Consume a pending wake, or sleep until one (or the interval). A wake
                    // that arrives during the sweep below stays set for the next round.
                    if !s.wake.swap(false, Ordering::AcqRel) && !s.stopping() {
                        s.cv.wait_for(&mut guard, interval);
                        s.wake.swap(false, Ordering::AcqRel);
                    }
                    if s.stopping() {
                        return;
                    }
                    // Sweep without the signal lock, so `wake` and `drop` never wait on it.
                    parking_lot::MutexGuard::unlocked(&mut guard, &sweep);
                }
            })?;
        Ok(Self {
            signal,
            thread: Some(thread),
        })
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.signal.stop.store(true, Ordering::Release);
        {
            // Taking the lock orders the store before the sweeper's next check-then-wait.
            let _guard = self.signal.lock.lock();
            self.signal.cv.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            // A panic in the sweeper already printed its message; nothing to add on drop.
            let _ = thread.join();
        }
    }
}
