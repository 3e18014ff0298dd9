//! Time sources: [`Clock`], the default [`QuantaClock`] (the TSC where the kernel keeps time by
//! it, else the OS monotonic clock), the cached [`CoarseClock`] for the
//! hottest paths, and the test/replay [`ManualClock`].
//!
//! Every algorithm keeps time as `u64` nanoseconds since the clock's origin. Nothing here or in
//! the algorithms panics on a clock that stands still or steps backwards: an algorithm treats a
//! `now` earlier than its stored time as equal to it, which also makes the small cross-core
//! disagreement of a TSC clock harmless.

use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::BuildError;

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
/// let clock = ManualClock::default();
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

/// The default clock: nanoseconds since the moment this value was created, read from the
/// CPU's time-stamp counter through `quanta` **only where the machine's kernel itself keeps
/// time by it**, and from the OS monotonic clock elsewhere.
///
/// The TSC is the cheapest clock there is (no system call, no vDSO page), but it is per core:
/// on machines whose cores' counters disagree (quanta#111: one core 1.6 s off; governor#299)
/// a request on a lagging core is denied wrongly and one on a leading core admitted early.
/// The kernel checks its TSC at boot and under way, and keeps its own time by it only if it
/// passes (Linux: the `tsc` clocksource, `/sys/devices/system/clocksource/clocksource0/
/// current_clocksource`); so [`default`](QuantaClock::default) does the same, and on any other
/// clocksource, or off Linux, reads the OS monotonic clock (`std::time::Instant`) instead.
/// What each costs on the one-key path is in `BENCHMARKS.md` ("The default clock").
/// Nothing here overrules the kernel; a clock of your own (a [`Clock`] over `Instant` is a few
/// lines) reads whatever you choose.
///
/// Clones share the origin, so every clone of one limiter's clock agrees.
///
/// # Examples
///
/// ```
/// use hotlimit::{Clock, QuantaClock};
///
/// let clock = QuantaClock::default();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone)]
pub struct QuantaClock {
    source: Source,
}

#[derive(Debug, Clone)]
enum Source {
    Tsc { clock: quanta::Clock, origin: u64 },
    Os(std::time::Instant),
}

impl QuantaClock {
    /// `quanta`'s clock: the TSC where quanta finds an invariant one (quanta falls back to
    /// the OS clock itself where there is none). Only where the kernel keeps its time by it: a
    /// TSC the kernel does not trust may drift between cores, and no caller should overrule it.
    fn tsc() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self {
            source: Source::Tsc { clock, origin },
        }
    }

    /// The OS monotonic clock (`std::time::Instant`: `clock_gettime(CLOCK_MONOTONIC)` on
    /// Linux), whatever the kernel trusts.
    fn os() -> Self {
        Self {
            source: Source::Os(std::time::Instant::now()),
        }
    }

    /// Whether this clock reads `quanta`'s counter rather than the OS clock.
    #[cfg(test)]
    fn uses_tsc(&self) -> bool {
        matches!(self.source, Source::Tsc { .. })
    }
}

/// Whether the kernel keeps its own time by the TSC, read once per process.
fn kernel_trusts_tsc() -> bool {
    static TRUSTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRUSTED.get_or_init(|| {
        cfg!(target_os = "linux")
            && std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .is_ok_and(|s| s.trim() == "tsc")
    })
}

impl Default for QuantaClock {
    /// A clock whose origin is now: the TSC if the kernel keeps its time by it, else the OS
    /// monotonic clock (see the type's docs).
    fn default() -> Self {
        if kernel_trusts_tsc() {
            Self::tsc()
        } else {
            Self::os()
        }
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> u64 {
        match &self.source {
            // `delta_as_nanos` returns 0 for a raw reading below the origin (TSC skew between
            // cores), so the value never underflows.
            Source::Tsc { clock, origin } => clock.delta_as_nanos(*origin, clock.raw()),
            Source::Os(origin) => duration_to_nanos(origin.elapsed()),
        }
    }
}

/// A clock that costs one load of a shared word: a background thread writes the
/// [`QuantaClock`] time into it every `resolution`, and [`now`](Clock::now) reads the last
/// value written.
///
/// In `cargo bench --bench keyed` it takes a share off every check, most at 1M keys, where the
/// clock read sits between cache misses (`BENCHMARKS.md`, the "coarse" columns). The price is
/// resolution: time moves in steps of `resolution` (plus the ticker thread's scheduling
/// delay), so a limiter sees every request up to that long after it arrived. Over any interval, a quota then admits at most
/// what it would over that interval plus `resolution`; and a key can sustain its rate only if
/// its quota refills its whole burst no faster than one step. **Pick a resolution no larger
/// than your tightest quota's `burst / rate`** (1 ms suits quotas of up to 1,000 requests
/// per second with a burst of 1, or 100,000/s with a burst of 100). For exact
/// per-request time, keep [`QuantaClock`], the default.
///
/// One thread per `CoarseClock::new`; clones share it (give every limiter a clone of one
/// clock). It stops when the last clone is dropped. It is the crate's own rather than
/// `quanta`'s `Clock::recent`: quanta's upkeep thread is one per process with one interval,
/// so a library cannot choose its resolution or know it (another crate may have started it),
/// and `recent()` reads 0 until someone does.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, CoarseClock, RateLimiter};
/// use std::time::Duration;
///
/// let clock = CoarseClock::new(Duration::from_millis(1))?;
/// let limiter = CasLimiter::<u64, Gcra, _>::with_clock("1000/s burst 50".parse()?, clock);
/// assert!(limiter.check(&7).is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct CoarseClock {
    // The word is reached in one step from the clock (which a limiter holds inline); the
    // ticker handle stops the thread when the last clone goes.
    word: Arc<CachePadded<AtomicU64>>,
    // Held for its drop, read only by the tests.
    #[cfg_attr(not(test), allow(dead_code))]
    ticker: Arc<Ticker>,
}

/// The thread that writes the word; dropped with the last [`CoarseClock`] clone.
#[derive(Debug)]
struct Ticker {
    stop: Arc<AtomicBool>,
    #[cfg(test)]
    resolution: Duration,
    thread: JoinHandle<()>,
}

impl CoarseClock {
    /// A clock whose origin is now, refreshed every `resolution` (at least 1 µs) by a new
    /// thread named `hotlimit-clock`.
    ///
    /// # Errors
    ///
    /// [`BuildError::Spawn`] if the thread cannot be started.
    pub fn new(resolution: Duration) -> Result<Self, BuildError> {
        let resolution = resolution.max(Duration::from_micros(1));
        let source = QuantaClock::default();
        // Padded: every request on every core reads it, so it must not share a line with
        // anything written.
        let word = Arc::new(CachePadded::new(AtomicU64::new(source.now())));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (word, stop) = (Arc::clone(&word), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("hotlimit-clock".into())
                .spawn(move || {
                    // One writer, so a plain store keeps the word monotonic as long as this
                    // thread's own readings are (the max guards against TSC skew when the
                    // thread migrates between cores).
                    let mut last = 0;
                    while !stop.load(Ordering::Acquire) {
                        last = last.max(source.now());
                        word.store(last, Ordering::Relaxed);
                        std::thread::park_timeout(resolution);
                    }
                })
                .map_err(BuildError::Spawn)?
        };
        Ok(Self {
            word,
            ticker: Arc::new(Ticker {
                stop,
                #[cfg(test)]
                resolution,
                thread,
            }),
        })
    }

    /// How often the time is refreshed (the requested resolution, at least 1 µs).
    #[cfg(test)]
    fn resolution(&self) -> Duration {
        self.ticker.resolution
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: the value is a time reading, not a publication of other memory.
        self.word.load(Ordering::Relaxed)
    }

    /// Sleeps until this clock has moved `duration` on, not merely until that much real
    /// time has passed: the word lags real time by up to one resolution, so a waiter woken on
    /// real time alone would re-check on a stale reading and be told to wait again.
    fn sleep(&self, duration: Duration) {
        let target = self.now().saturating_add(duration_to_nanos(duration));
        loop {
            let now = self.now();
            if now >= target {
                return;
            }
            std::thread::sleep(Duration::from_nanos(target - now));
        }
    }
}

/// Signals the thread and returns: it sees the flag when unparked and ends by itself, so the
/// last clone's drop never waits on it (a drop on an async runtime's thread must not block).
impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
    }
}

/// A clock that only moves when told to: for tests, simulation and trace replay.
///
/// It starts at 0 ([`ManualClock::default`]). Clones are handles to the same time, so a test keeps one handle and gives
/// the limiter another. Moving it backwards is allowed (the algorithms tolerate it).
///
/// # Examples
///
/// ```
/// use hotlimit::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::default();
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
    /// Moves the clock forward by `by` (saturating at `u64::MAX` nanoseconds).
    pub fn advance(&self, by: Duration) {
        let nanos = duration_to_nanos(by);
        // fetch_update rather than fetch_add: saturate instead of wrapping around to 0.
        let _ = self
            .nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(nanos))
            });
    }

    /// Sets the clock to `at` after its origin (saturating at `u64::MAX` nanoseconds).
    pub fn set(&self, at: Duration) {
        self.nanos.store(duration_to_nanos(at), Ordering::Release);
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

    // Pins G4, G5.
    #[test]
    fn manual_clock_saturates_and_can_step_back() {
        let c = ManualClock::default();
        c.set(Duration::from_nanos(u64::MAX - 1));
        c.advance(Duration::from_nanos(10));
        assert_eq!(c.now(), u64::MAX);
        c.set(Duration::from_secs(1));
        assert_eq!(c.now(), 1_000_000_000);
        c.set(Duration::MAX);
        assert_eq!(c.now(), u64::MAX);
    }

    // Pins G5.
    #[test]
    fn coarse_clock_moves_forward_and_stops_with_its_last_clone() {
        let clock = CoarseClock::new(Duration::from_micros(50)).unwrap();
        assert_eq!(clock.resolution(), Duration::from_micros(50));
        let copy = clock.clone();
        let first = clock.now();
        // No timing asserted: only that the ticker runs (it must within seconds).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while copy.now() == first {
            assert!(std::time::Instant::now() < deadline, "ticker never ticked");
            std::thread::yield_now();
        }
        let mut last = copy.now();
        for _ in 0..10_000 {
            let t = clock.now();
            assert!(t >= last, "went back from {last} to {t}");
            last = t;
        }
        // A sleep ends only once the clock itself reads the time slept (whatever the real
        // time taken: nothing timed is asserted).
        let before = clock.now();
        clock.sleep(Duration::from_micros(200));
        assert!(
            clock.now() >= before + 200_000,
            "woke before the clock moved"
        );
        let stopped = Arc::downgrade(&clock.ticker.stop);
        drop(clock);
        assert!(
            stopped.upgrade().is_some(),
            "a clone still holds the ticker"
        );
        drop(copy);
        // The drop only signalled the thread, which held the other reference: it ends by
        // itself once unparked.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while stopped.upgrade().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "ticker thread still running"
            );
            std::thread::yield_now();
        }
        assert_eq!(
            CoarseClock::new(Duration::ZERO).unwrap().resolution(),
            Duration::from_micros(1)
        );
    }

    // Pins G5.
    #[test]
    fn the_default_clock_reads_the_tsc_only_where_the_kernel_keeps_time_by_it() {
        let source = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        );
        let kernel_tsc = cfg!(target_os = "linux") && source.is_ok_and(|s| s.trim() == "tsc");
        assert_eq!(QuantaClock::default().uses_tsc(), kernel_tsc);
        assert!(QuantaClock::tsc().uses_tsc());
        let os = QuantaClock::os();
        assert!(!os.uses_tsc());
        let (a, b) = (os.now(), os.clone().now());
        assert!(b >= a);
        std::thread::sleep(Duration::from_millis(2));
        assert!(os.now() >= a + 2_000_000);
    }

    // Pins G5.
    #[test]
    fn quanta_clock_clones_share_origin() {
        let a = QuantaClock::default();
        let b = a.clone();
        let (x, y) = (a.now(), b.now());
        // b was read after a on this thread; same origin means same timeline.
        assert!(y >= x);
    }
}
