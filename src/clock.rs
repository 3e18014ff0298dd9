//! Time sources: [`Clock`], the TSC-backed [`QuantaClock`] and the test/replay [`ManualClock`].
//!
//! Every algorithm keeps time as `u64` nanoseconds since the clock's origin. Nothing here or in
//! the algorithms panics on a clock that stands still or steps backwards: an algorithm treats a
//! `now` earlier than its stored time as equal to it, which also makes the small cross-core
//! disagreement of a TSC clock harmless.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A source of "nanoseconds since this clock's origin".
///
/// Implementations must be cheap: [`Clock::now`] is read once per request.
///
/// # Examples
///
/// ```
/// use hotlimit::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// assert_eq!(clock.now(), 0);
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(clock.now(), 5_000_000);
/// ```
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds elapsed since this clock's origin.
    fn now(&self) -> u64;

    /// Blocks the calling thread for `duration` of this clock's time: what
    /// `until_ready_blocking` sleeps with. A real clock sleeps the thread (the default); a
    /// [`ManualClock`] moves itself forward instead, so waiting code runs instantly and
    /// deterministically in tests.
    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }
}

/// The default clock: `quanta`'s TSC-backed monotonic clock, read as nanoseconds since the
/// moment this value was created.
///
/// Clones share the origin, so every clone of one limiter's clock agrees.
///
/// # Examples
///
/// ```
/// use hotlimit::{Clock, QuantaClock};
///
/// let clock = QuantaClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone)]
pub struct QuantaClock {
    clock: quanta::Clock,
    origin: u64,
}

impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self { clock, origin }
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> u64 {
        // `delta_as_nanos` returns 0 for a raw reading below the origin (TSC skew between
        // cores), so the value never underflows.
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// A clock that only moves when told to: for tests, simulation and trace replay.
///
/// It starts at 0. Clones are handles to the same time, so a test keeps one handle and gives
/// the limiter another. Moving it backwards is allowed (the algorithms tolerate it).
///
/// # Examples
///
/// ```
/// use hotlimit::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let handle = clock.clone();
/// handle.set(Duration::from_secs(2));
/// handle.advance(Duration::from_millis(250));
/// assert_eq!(clock.now(), 2_250_000_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by` (saturating at `u64::MAX` nanoseconds).
    pub fn advance(&self, by: Duration) {
        self.advance_nanos(duration_to_nanos(by));
    }

    /// Moves the clock forward by `nanos` nanoseconds (saturating).
    pub fn advance_nanos(&self, nanos: u64) {
        // fetch_update rather than fetch_add: saturate instead of wrapping around to 0.
        let _ = self
            .nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(nanos))
            });
    }

    /// Sets the clock to `at` after its origin (saturating at `u64::MAX` nanoseconds).
    pub fn set(&self, at: Duration) {
        self.set_nanos(duration_to_nanos(at));
    }

    /// Sets the clock to `nanos` nanoseconds after its origin.
    pub fn set_nanos(&self, nanos: u64) {
        self.nanos.store(nanos, Ordering::Release);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.nanos.load(Ordering::Acquire)
    }

    /// Advances the clock by `duration` instead of blocking.
    fn sleep(&self, duration: Duration) {
        self.advance(duration);
    }
}

/// A `Duration` as `u64` nanoseconds, saturating (u64 nanoseconds cover 584 years).
pub(crate) fn duration_to_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_saturates_and_can_step_back() {
        let c = ManualClock::new();
        c.set_nanos(u64::MAX - 1);
        c.advance_nanos(10);
        assert_eq!(c.now(), u64::MAX);
        c.set(Duration::from_secs(1));
        assert_eq!(c.now(), 1_000_000_000);
        c.set(Duration::MAX);
        assert_eq!(c.now(), u64::MAX);
    }

    #[test]
    fn quanta_clock_clones_share_origin() {
        let a = QuantaClock::new();
        let b = a.clone();
        let (x, y) = (a.now(), b.now());
        // b was read after a on this thread; same origin means same timeline.
        assert!(y >= x);
    }
}
