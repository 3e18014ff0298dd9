//! CAS retry statistics, striped so that counting never becomes the contended hot spot it
//! measures.

use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Stripes: enough that a few dozen threads rarely share one.
const STRIPES: usize = 32;

/// Counts of compare-and-swap attempts and failures in a lock-free limiter.
///
/// `failures / attempts` is the share of CAS attempts that lost a race and re-ran the
/// algorithm; a leaky denial makes no attempt at all.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, ManualClock};
///
/// let limiter = CasLimiter::<u64, _, _>::with_clock("10/s".parse::<Gcra>()?, ManualClock::new());
/// limiter.check(&1);
/// let stats = limiter.cas_stats();
/// assert_eq!((stats.attempts, stats.failures), (1, 0));
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CasStats {
    /// Compare-and-swap attempts.
    pub attempts: u64,
    /// Attempts that failed because another thread changed the word first.
    pub failures: u64,
}

#[derive(Default)]
struct Stripe {
    attempts: AtomicU64,
    failures: AtomicU64,
}

/// Striped counters; each thread writes the stripe its id maps to.
#[doc(hidden)]
pub struct Stats {
    stripes: Box<[CachePadded<Stripe>]>,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| CachePadded::default()).collect(),
        }
    }
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}

fn stripe_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|i| {
        if i.get() == usize::MAX {
            i.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        }
        i.get()
    })
}

impl Stats {
    /// Records one CAS attempt, `failed` (0 or 1) of which failed.
    #[inline]
    pub(crate) fn record(&self, failed: u64) {
        let s = &self.stripes[stripe_index()];
        s.attempts.fetch_add(1, Ordering::Relaxed);
        if failed != 0 {
            s.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> CasStats {
        self.stripes
            .iter()
            .fold(CasStats::default(), |acc, s| CasStats {
                attempts: acc.attempts + s.attempts.load(Ordering::Relaxed),
                failures: acc.failures + s.failures.load(Ordering::Relaxed),
            })
    }
}
