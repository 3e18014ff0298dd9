//! Eviction reports and the background sweeper thread.
//!
//! The thread is named, sleeps on a condition variable between sweeps (no spinning), is woken
//! early when a capacity bound is exceeded, and is stopped and joined when its limiter is
//! dropped. A sweep takes no lock that `check` waits on: it walks the lock-free map and
//! evicts cell by cell with the tombstone protocol of `cell.rs`.
//!
//! [`CapacityCut`] is the one rule both keyed stores use to pick the keys a capacity pass
//! evicts.

use parking_lot::{Condvar, Mutex};
use std::cell::Cell;
use std::cmp::Ordering as Cmp;
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

/// Before a request inserts a new key into a store holding `len` of `max_keys`: past
/// `max_keys + max_keys/4` it runs `evict` (one capacity pass) here and now, so a flood of new
/// keys that outruns the sweeper pays for its own eviction instead of growing the store; the
/// pass is counted with the sweeps. Below that only the sweeper evicts. Both keyed stores
/// call it, so both keep `len()` below that plus one key per inserting thread.
#[cold]
pub(crate) fn evict_before_insert(
    len: usize,
    max_keys: usize,
    totals: &Totals,
    evict: impl FnOnce() -> u64,
) {
    if len >= max_keys.saturating_add(max_keys / 4) {
        totals.add(&SweepReport {
            evicted_capacity: evict(),
            ..SweepReport::default()
        });
    }
}

/// Which keys one capacity-eviction pass evicts, judged by their `idle_at` (the earliest
/// first): every key below a threshold, and of the keys exactly at it, an evenly spread share.
///
/// Ties are the common case, not a corner: on a frozen or coarse clock a flood of new keys all
/// share one `idle_at`. A pass that evicted the first tied keys it met, in table order (hash
/// order), would empty the front of the table pass after pass and pile the survivors up at the
/// back. In the papaya store that clustering made every resize copy into a table of the same
/// size that could not place them either (papaya 0.2.5 keeps the capacity when the map is
/// under half full), a chain of new tables that never ended; in the compact store it
/// lengthened probes. So the tied share is spread over the table (Bresenham over the ties, in
/// the order the pass meets them), and no cap on the count ends a pass early at some position.
#[derive(Debug)]
pub(crate) struct CapacityCut {
    /// `None`: every key ties (an even spread whatever the states, see [`evict_by`]).
    threshold: Option<u64>,
    /// Of the tied keys, `take` of every `of` are evicted.
    take: u64,
    of: u64,
    acc: Cell<u64>,
}

impl CapacityCut {
    /// The cut that evicts `excess` of `len` keys, given the `idle_at` of `idle` (all the keys,
    /// or a uniform sample of them: its order is changed). `None` if nothing is to go.
    pub(crate) fn new(idle: &mut [u64], excess: u64, len: u64) -> Option<Self> {
        let n = idle.len() as u64;
        if n == 0 || excess == 0 || len == 0 {
            return None;
        }
        // How many of the sample would go, at least one: the rank of the threshold.
        let rank = (u128::from(n) * u128::from(excess))
            .div_ceil(u128::from(len))
            .clamp(1, u128::from(n)) as usize;
        let (_, &mut threshold, _) = idle.select_nth_unstable(rank - 1);
        let below = idle.iter().filter(|&&t| t < threshold).count();
        let at = idle.iter().filter(|&&t| t == threshold).count();
        Some(Self {
            threshold: Some(threshold),
            take: (rank - below) as u64,
            of: at as u64,
            acc: Cell::new(0),
        })
    }

    /// The cut that evicts `excess` of `len` keys evenly spread, whatever their `idle_at`.
    fn spread(excess: u64, len: u64) -> Option<Self> {
        (excess > 0 && len > 0).then(|| Self {
            threshold: None,
            take: excess.min(len),
            of: len,
            acc: Cell::new(0),
        })
    }

    /// The verdict for the next key the pass meets, as a function of that key's `idle_at`
    /// (which may be asked more than once, if a CAS retries; a tie gets one turn per key).
    pub(crate) fn judge(&self) -> impl Fn(u64) -> bool + '_ {
        let turn = Cell::new(None);
        move |idle_at| match self.threshold.map_or(Cmp::Equal, |t| idle_at.cmp(&t)) {
            Cmp::Less => true,
            Cmp::Greater => false,
            Cmp::Equal => match turn.get() {
                Some(doomed) => doomed,
                None => {
                    let doomed = self.tie_turn();
                    turn.set(Some(doomed));
                    doomed
                }
            },
        }
    }

    /// Bresenham: `take` of every `of` ties, evenly spaced.
    fn tie_turn(&self) -> bool {
        let acc = self.acc.get() + self.take;
        let doomed = acc >= self.of;
        self.acc.set(if doomed { acc - self.of } else { acc });
        doomed
    }
}

/// One capacity pass: `pass` kills the keys `cut` dooms (of the `excess` it was drawn for) and
/// says how many it killed. The cut was drawn from the states before the pass, and a key
/// updated meanwhile is judged on its new state, so traffic that moves many keys at once can
/// leave the pass far short: a fleet's sync thread granting leases to a flood's new keys (a
/// key holding a lease is never closest to fresh) did, killing 25 of 375. A pass that kills
/// less than half its excess is made up at once by a second one over the `live()` keys, the
/// shortfall evenly spread whatever their states, so the bound `max_keys` promises holds
/// however the keys move. The keys evicted, both passes together.
pub(crate) fn evict_by(
    cut: &CapacityCut,
    excess: u64,
    live: impl FnOnce() -> u64,
    pass: impl Fn(&CapacityCut) -> u64,
) -> u64 {
    let killed = pass(cut);
    if killed.saturating_mul(2) >= excess {
        return killed;
    }
    match CapacityCut::spread(excess - killed, live()) {
        Some(rest) => killed + pass(&rest),
        None => killed,
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

#[cfg(test)]
mod tests {
    use super::{evict_by, CapacityCut};
    use std::cell::RefCell;

    /// Evicts with `cut` over `idle` in order; returns the positions evicted.
    fn pass(cut: &CapacityCut, idle: &[u64]) -> Vec<usize> {
        (0..idle.len()).filter(|&i| cut.judge()(idle[i])).collect()
    }

    #[test]
    fn ties_are_evicted_evenly_over_the_table() {
        // 1000 keys with one idle_at: 250 go, every fourth, not the first 250.
        let idle = vec![7u64; 1000];
        let cut = CapacityCut::new(&mut idle.clone(), 250, 1000).unwrap();
        let gone = pass(&cut, &idle);
        assert_eq!(gone.len(), 250);
        assert_eq!(gone.iter().filter(|&&i| i < 500).count(), 125);
        assert_eq!(gone[..3], [3, 7, 11]);
    }

    #[test]
    fn keys_below_the_threshold_all_go_then_a_share_of_the_ties() {
        // idle_at 0..100 once each, then 900 keys at 100: 300 go = the 100 below + 200 of 900.
        let idle: Vec<u64> = (0..100).chain(std::iter::repeat(100).take(900)).collect();
        let cut = CapacityCut::new(&mut idle.clone(), 300, 1000).unwrap();
        let gone = pass(&cut, &idle);
        assert_eq!(gone.len(), 300);
        assert!((0..100).all(|i| gone.contains(&i)));
        // The 200 tied ones spread over the 900, not bunched: half of them in the first half.
        assert_eq!(
            gone.iter().filter(|&&i| (100..550).contains(&i)).count(),
            100
        );
    }

    #[test]
    fn a_sample_scales_to_the_whole_table() {
        // A sample of 4 for a table of 100 with 50 to go: two of the sample's rank.
        let cut = CapacityCut::new(&mut [40, 10, 30, 20], 50, 100).unwrap();
        let judge = cut.judge();
        assert!(judge(10) && judge(19) && !judge(21) && !judge(40));
        assert!(cut.judge()(20)); // the one tie at 20: take 1 of 1
        assert!(CapacityCut::new(&mut [], 5, 10).is_none());
        assert!(CapacityCut::new(&mut [1, 2], 0, 10).is_none());
    }

    /// A pass over `idle` (`None`: evicted) killing what `cut` dooms; the keys it killed.
    fn kill(cut: &CapacityCut, idle: &RefCell<Vec<Option<u64>>>) -> u64 {
        let mut killed = 0;
        for key in idle.borrow_mut().iter_mut() {
            if key.is_some_and(|t| cut.judge()(t)) {
                *key = None;
                killed += 1;
            }
        }
        killed
    }

    #[test]
    fn a_pass_the_states_moved_under_is_made_up_by_an_even_spread() {
        // The cut is drawn for 250 of 1000 keys at idle_at 0..1000 (those below 250), then,
        // before the pass, every key below 900 moves to u64::MAX (a lease granted): the pass
        // dooms nothing below the threshold and the make-up takes 250 evenly.
        let idle: Vec<u64> = (0..1000).collect();
        let cut = CapacityCut::new(&mut idle.clone(), 250, 1000).unwrap();
        let moved: Vec<Option<u64>> = idle
            .iter()
            .map(|&t| Some(if t < 900 { u64::MAX } else { t }))
            .collect();
        let moved = RefCell::new(moved);
        let live = || moved.borrow().iter().flatten().count() as u64;
        assert_eq!(evict_by(&cut, 250, live, |c| kill(c, &moved)), 250);
        let gone: Vec<usize> = (0..1000).filter(|&i| moved.borrow()[i].is_none()).collect();
        assert_eq!(gone.len(), 250);
        assert_eq!(gone[..3], [3, 7, 11]);
        assert_eq!(gone.iter().filter(|&&i| i < 500).count(), 125);
    }

    #[test]
    fn a_pass_that_kills_half_its_excess_is_not_made_up() {
        // 1000 keys at idle_at 0..1000, a cut for 300; before the pass the 150 lowest move up.
        // The pass kills the other 150, half of 300: no second pass.
        let idle: Vec<u64> = (0..1000).collect();
        let cut = CapacityCut::new(&mut idle.clone(), 300, 1000).unwrap();
        let moved = RefCell::new(
            idle.iter()
                .map(|&t| Some(if t < 150 { u64::MAX } else { t }))
                .collect::<Vec<_>>(),
        );
        let passes = std::cell::Cell::new(0);
        let killed = evict_by(
            &cut,
            300,
            || 1000,
            |c| {
                passes.set(passes.get() + 1);
                kill(c, &moved)
            },
        );
        assert_eq!((killed, passes.get()), (150, 1));
        // One key fewer and the make-up runs: 149 + 151 spread.
        let cut = CapacityCut::new(&mut idle.clone(), 300, 1000).unwrap();
        let moved = RefCell::new(
            idle.iter()
                .map(|&t| Some(if t < 151 { u64::MAX } else { t }))
                .collect::<Vec<_>>(),
        );
        let live = || moved.borrow().iter().flatten().count() as u64;
        assert_eq!(evict_by(&cut, 300, live, |c| kill(c, &moved)), 300);
    }

    #[test]
    fn a_key_asked_twice_keeps_its_turn() {
        let cut = CapacityCut::new(&mut [5; 10], 5, 10).unwrap();
        let judge = cut.judge();
        let first = judge(5);
        assert!((0..3).all(|_| judge(5) == first));
    }
}
