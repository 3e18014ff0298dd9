//! Eviction reports and the background sweeper thread.
//!
//! The thread is named, sleeps on a condition variable between sweeps (no spinning), is woken
//! early when a capacity bound is exceeded, and is stopped and joined when its limiter is
//! dropped. A sweep takes no lock that `check` waits on: it walks the lock-free map and
//! evicts cell by cell with the tombstone protocol of `cell.rs`.
//!
//! [`CapacityCut`] is the one rule both keyed stores use to pick the keys a capacity pass
//! evicts.

use crate::stats::Metrics;
use parking_lot::{Condvar, Mutex};
use std::cell::Cell;
use std::cmp::Ordering as Cmp;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// What one sweep is about to report: a [`Metrics`] of its own (see `Limiter::sweep`).
pub(crate) fn one_sweep() -> Metrics {
    Metrics {
        sweeps: 1,
        ..Metrics::default()
    }
}

/// Running totals, updated once per sweep.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    sweeps: AtomicU64,
    scanned: AtomicU64,
    evicted_idle: AtomicU64,
    evicted_capacity: AtomicU64,
    busy_ns: AtomicU64,
    /// Capacity passes running now, and the most ever at once.
    passes: AtomicU64,
    most_passes: AtomicU64,
}

impl Totals {
    pub(crate) fn add(&self, r: &Metrics) {
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        self.scanned.fetch_add(r.scanned, Ordering::Relaxed);
        self.evicted_idle
            .fetch_add(r.evicted_idle, Ordering::Relaxed);
        self.evicted_capacity
            .fetch_add(r.evicted_capacity, Ordering::Relaxed);
        let ns = u64::try_from(r.sweep_busy.as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The totals, with the debt table's counts (kept, restored): a [`Metrics`] with its
    /// sweep fields set, the rest 0.
    pub(crate) fn snapshot(&self, debts: (u64, u64)) -> Metrics {
        Metrics {
            sweeps: self.sweeps.load(Ordering::Relaxed),
            scanned: self.scanned.load(Ordering::Relaxed),
            evicted_idle: self.evicted_idle.load(Ordering::Relaxed),
            evicted_capacity: self.evicted_capacity.load(Ordering::Relaxed),
            debts_kept: debts.0,
            debts_restored: debts.1,
            most_passes_at_once: self.most_passes.load(Ordering::Relaxed),
            sweep_busy: Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
            ..Metrics::default()
        }
    }

    /// Runs one capacity pass, counted as running while it runs.
    fn run_pass(&self, pass: impl FnOnce() -> u64) -> u64 {
        let at_once = self.passes.fetch_add(1, Ordering::AcqRel) + 1;
        self.most_passes.fetch_max(at_once, Ordering::Relaxed);
        let evicted = pass();
        self.passes.fetch_sub(1, Ordering::AcqRel);
        evicted
    }
}

/// Runs a capacity pass (`evict`, returning the keys it evicted) under `gate`, so that passes
/// never overlap: passes that overlap each see the same excess and together evict several
/// times it, and each judges keys on states the others are changing. A sweep waits for the
/// pass in flight, then runs its own.
pub(crate) fn capacity_pass(
    gate: &crate::sync::Mutex<()>,
    totals: &Totals,
    evict: impl FnOnce() -> u64,
) -> u64 {
    let _pass = gate.lock();
    totals.run_pass(evict)
}

/// Before a request inserts a new key into a store holding `len()` of `max_keys`: past
/// `max_keys + max_keys/4` it runs `evict` (one capacity pass) here and now, so a flood of new
/// keys that outruns the sweeper pays for its own eviction instead of growing the store; the
/// pass is counted with the sweeps. Below that only the sweeper evicts. Single-flight: a
/// request that finds a pass running (`gate` held) runs none of its own. Where the store can
/// share the pass out (`help`: the compact table's, in chunks of slots) it takes part, and
/// inserts as soon as the pass has brought the store back under the bound (the pass evicts as
/// it goes), without waiting for its end; else (papaya's `retain` walks the map in one go) it
/// waits for the pass to end: measured, inserting into the map beside its `retain` made a
/// flood 1.4–1.7× slower than waiting. Both keyed stores call it, so both keep `len()` below
/// that bound plus one key per inserting thread.
#[cold]
pub(crate) fn evict_before_insert(
    len: impl Fn() -> usize,
    max_keys: usize,
    gate: &crate::sync::Mutex<()>,
    totals: &Totals,
    evict: impl FnOnce() -> u64,
    help: Option<&dyn Fn()>,
) {
    let bound = max_keys.saturating_add(max_keys / 4);
    if len() < bound {
        return;
    }
    let backoff = crate::sync::Backoff::new();
    loop {
        if let Some(_pass) = gate.try_lock() {
            // Past the bound still (not just after another pass ended): this request's pass.
            if len() >= bound {
                totals.add(&Metrics {
                    evicted_capacity: totals.run_pass(evict),
                    ..Metrics::default()
                });
            }
            return;
        }
        match help {
            Some(help) => {
                help();
                backoff.snooze();
            }
            None => drop(gate.lock()),
        }
        // A pass that ended (or a sweep, whose cut was drawn before this flood reached it)
        // may have left the store past the bound: then this request runs one.
        if len() < bound {
            return;
        }
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
    threshold: u64,
    /// Of the tied keys, `take` of every `of` are evicted, counted from a point of a Weyl
    /// sequence ([`CapacityCut::new`]).
    take: u64,
    of: u64,
    acc: Cell<u64>,
    /// Where this cut's count starts: its shared runs start there too.
    start: u64,
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
        let at = idle.iter().filter(|&&t| t == threshold).count() as u64;
        // Each cut starts its count at its own point: from 0, every pass spared the first
        // ties it met, so a key in the table's first slots outlived any flood of keys tied
        // with it (a spent key kept through five floods of 20x `max_keys`, 1 run in 10).
        static CUTS_DRAWN: AtomicU64 = AtomicU64::new(0);
        let drawn = CUTS_DRAWN.fetch_add(1, Ordering::Relaxed);
        let start = weyl(drawn, at);
        Some(Self {
            threshold,
            take: (rank - below) as u64,
            of: at,
            acc: Cell::new(start),
            start,
        })
    }

    /// The cut as a `Sync` rule for a pass shared out among threads, each judging its own runs
    /// of slots ([`SharedCut::run`]): the same share, `take` of every `of` ties, evenly spread
    /// over the table.
    pub(crate) fn shared(&self) -> SharedCut {
        SharedCut {
            threshold: self.threshold,
            take: self.take,
            of: self.of.max(1),
            start: self.start,
        }
    }

    /// The verdict for the next key the pass meets, as a function of that key's `idle_at`
    /// (which may be asked more than once, if a CAS retries; a tie gets one turn per key).
    pub(crate) fn judge(&self) -> impl Fn(u64) -> bool + '_ {
        let turn = Cell::new(None);
        move |idle_at: u64| match idle_at.cmp(&self.threshold) {
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

/// A [`CapacityCut`] that threads share: see [`CapacityCut::shared`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct SharedCut {
    threshold: u64,
    take: u64,
    of: u64,
    /// The cut's own starting point (below `of`): every run's start is moved by it, so each
    /// pass spares other ties (run 0 started at 0 in every pass: the first ties of the table,
    /// slot order, were spared pass after pass).
    start: u64,
}

impl SharedCut {
    /// The verdicts for one thread's run of slots (a chunk of a shared pass, numbered
    /// `chunk`): each tie is judged in its turn, `take` of every `of` evenly spaced
    /// (Bresenham), so a run meeting `of` ties dooms exactly `take` of them. A small table is
    /// one run, so its pass evicts what its cut says: judged by a slot's index instead (an
    /// earlier rule) two tied keys whose indices both fell outside the share were never
    /// evicted, and a table for one key held three. Each run starts at its own point of a
    /// Weyl sequence (the golden ratio's multiples modulo 1), so the runs' roundings do not
    /// add up, and a run's share is in step with no period of the table.
    pub(crate) fn run(&self, chunk: u64) -> CutRun {
        CutRun {
            cut: *self,
            acc: Cell::new((weyl(chunk, self.of) + self.start) % self.of),
        }
    }
}

/// The `n`th point of a Weyl sequence (the golden ratio's multiples modulo 1) scaled to
/// `0..of` (0 if `of` is 0): Bresenham counts' starting points that are in step with no
/// period.
fn weyl(n: u64, of: u64) -> u64 {
    let x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((u128::from(x) * u128::from(of)) >> 64) as u64
}

/// One run of a [`SharedCut`]: [`SharedCut::run`].
#[derive(Debug)]
pub(crate) struct CutRun {
    cut: SharedCut,
    acc: Cell<u64>,
}

impl CutRun {
    /// The verdict for the next key of the run, as a function of its `idle_at` (which may be
    /// asked more than once, if a CAS retries: a tie gets one turn per key, as in
    /// [`CapacityCut::judge`]).
    pub(crate) fn judge(&self) -> impl Fn(u64) -> bool + '_ {
        let turn = Cell::new(None);
        move |idle_at: u64| match idle_at.cmp(&self.cut.threshold) {
            Cmp::Less => true,
            Cmp::Greater => false,
            Cmp::Equal => match turn.get() {
                Some(doomed) => doomed,
                None => {
                    let acc = self.acc.get() + self.cut.take;
                    let doomed = acc >= self.cut.of;
                    self.acc.set(if doomed { acc - self.cut.of } else { acc });
                    turn.set(Some(doomed));
                    doomed
                }
            },
        }
    }
}

/// Cuts one capacity pass may draw: the first, and re-cuts for a pass left short.
const CUTS: usize = 3;

/// One capacity pass: `draw(n)` draws a cut to evict `n` keys from the states as they are now
/// (`None`: nothing to evict), `pass` kills the keys a cut dooms and says how many. A key
/// updated meanwhile is judged on its new state, so traffic that moves many keys at once can
/// leave a pass far short: a fleet's sync thread granting leases to a flood's new keys (a key
/// holding a lease is never closest to fresh) did, killing 25 of 375. A pass that kills less
/// than half its excess draws a new cut for the rest from the states as they are then (up to
/// [`CUTS`] in all): every key evicted is at or below the threshold of the cut that judged it,
/// so the keys closest to fresh go first, always. The keys evicted, all cuts together.
pub(crate) fn evict_by(
    excess: u64,
    mut draw: impl FnMut(u64) -> Option<CapacityCut>,
    pass: impl Fn(&CapacityCut) -> u64,
) -> u64 {
    let mut killed = 0u64;
    for round in 0..CUTS {
        if round > 0 && killed.saturating_mul(2) >= excess {
            break;
        }
        let Some(cut) = draw(excess.saturating_sub(killed)) else {
            break;
        };
        killed += pass(&cut);
    }
    killed
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

/// The handle of a running sweeper thread; stops it on drop.
#[derive(Debug)]
pub struct Sweeper {
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

impl Sweeper {
    /// Stops the thread: it sees the flag at its next wake and ends, a sweep under way
    /// finishing first.
    fn stop(&self) {
        self.signal.stop.store(true, Ordering::Release);
        // Taking the lock orders the store before the sweeper's next check-then-wait.
        let _guard = self.signal.lock.lock();
        self.signal.cv.notify_all();
    }

    /// Stops the thread and waits for it to end (a sweep under way finishes first).
    pub(crate) fn shutdown(mut self) {
        self.stop();
        if let Some(thread) = self.thread.take() {
            // A panic in the sweeper already printed its message; nothing to add.
            let _ = thread.join();
        }
    }
}

/// Only signals: a drop never waits on a sweep under way (it may run on an async runtime's
/// thread); the thread ends by itself. [`Limiter::shutdown`](crate::Limiter::shutdown) waits.
impl Drop for Sweeper {
    fn drop(&mut self) {
        self.stop();
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

    // Pins G20.
    #[test]
    fn ties_are_evicted_evenly_over_the_table() {
        // 1000 keys with one idle_at: 250 go, every fourth, not the first 250.
        let idle = vec![7u64; 1000];
        let cut = CapacityCut::new(&mut idle.clone(), 250, 1000).unwrap();
        let gone = pass(&cut, &idle);
        assert_eq!(gone.len(), 250);
        assert!((124..=126).contains(&gone.iter().filter(|&&i| i < 500).count()));
        assert!(
            gone[0] < 4 && gone.windows(2).all(|w| w[1] - w[0] == 4),
            "{gone:?}"
        );
    }

    // Pins G20.
    #[test]
    fn no_place_in_the_table_is_spared_pass_after_pass() {
        // Each cut starts its count at its own point: the first tie met (a key in the table's
        // first slot) goes in about its share of the passes, not in none.
        let idle = vec![7u64; 1000];
        let first_gone = (0..400)
            .filter(|_| {
                let cut = CapacityCut::new(&mut idle.clone(), 250, 1000).unwrap();
                let doomed = cut.judge()(7);
                doomed
            })
            .count();
        assert!((60..=140).contains(&first_gone), "{first_gone} of 400");
    }

    // Pins G20.
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

    // Pins G20.
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

    /// A cut drawn from the keys of `idle` still there, for `n` of them.
    fn draw(idle: &RefCell<Vec<Option<u64>>>, n: u64) -> Option<CapacityCut> {
        let mut live: Vec<u64> = idle.borrow().iter().flatten().copied().collect();
        let len = live.len() as u64;
        CapacityCut::new(&mut live, n, len)
    }

    // Pins G20.
    #[test]
    fn a_pass_the_states_moved_under_is_recut_from_the_states_as_they_are() {
        // The first cut is drawn for 250 of 1000 keys at idle_at 0..1000 (those below 250);
        // before its pass every key below 900 moves to u64::MAX (a lease granted): it dooms
        // nothing, so a second cut is drawn from the moved states: the 100 keys at 900..1000
        // (the closest to fresh now) and 150 of the 900 tied at u64::MAX, spread. No key is
        // ever evicted above the threshold of the cut that judged it.
        let idle: Vec<u64> = (0..1000).collect();
        let moved = RefCell::new(idle.iter().map(|&t| Some(t)).collect::<Vec<_>>());
        let first = std::cell::Cell::new(true);
        let cuts = std::cell::Cell::new(0);
        let killed = evict_by(
            250,
            |n| {
                cuts.set(cuts.get() + 1);
                let cut = draw(&moved, n);
                if first.replace(false) {
                    for t in moved.borrow_mut().iter_mut().flatten() {
                        if *t < 900 {
                            *t = u64::MAX;
                        }
                    }
                }
                cut
            },
            |c| kill(c, &moved),
        );
        assert_eq!(cuts.get(), 2);
        assert_eq!(killed, 250);
        let gone: Vec<usize> = (0..1000).filter(|&i| moved.borrow()[i].is_none()).collect();
        assert!((900..1000).all(|i| gone.contains(&i)));
        // The 150 tied at u64::MAX are spread evenly over the 900.
        assert_eq!(gone.iter().filter(|&&i| i < 450).count(), 75);
    }

    // Pins G20.
    #[test]
    fn a_pass_that_kills_half_its_excess_is_not_made_up() {
        // 1000 keys at idle_at 0..1000, a cut for 300; before the pass the 150 lowest move up.
        // The pass kills the other 150, half of 300: no second pass.
        let idle: Vec<u64> = (0..1000).collect();
        let run = |moved_below: u64| {
            let cut = CapacityCut::new(&mut idle.clone(), 300, 1000);
            let moved = RefCell::new(
                idle.iter()
                    .map(|&t| Some(if t < moved_below { u64::MAX } else { t }))
                    .collect::<Vec<_>>(),
            );
            let (mut cut, passes) = (cut, std::cell::Cell::new(0));
            let killed = evict_by(
                300,
                |n| cut.take().or_else(|| draw(&moved, n)),
                |c| {
                    passes.set(passes.get() + 1);
                    kill(c, &moved)
                },
            );
            (killed, passes.get())
        };
        assert_eq!(run(150), (150, 1));
        // One key fewer and a second cut runs: 149, then 151 of the keys closest to fresh.
        assert_eq!(run(151), (300, 2));
    }

    // Pins G20.
    #[test]
    fn a_shared_cut_dooms_its_share_of_the_ties_each_run_meets() {
        // 1000 keys with one idle_at, 250 to go: a run meeting all 1000 ties dooms exactly 250,
        // evenly (one in each 4 met); one meeting 500, 125 within one; runs that split the
        // table between them (their own starting points) 250 within one a run.
        let cut = CapacityCut::new(&mut vec![7u64; 1000], 250, 1000)
            .unwrap()
            .shared();
        let gone = |chunk: u64, n: usize| {
            let run = cut.run(chunk);
            (0..n).filter(|_| run.judge()(7)).count()
        };
        assert_eq!(gone(0, 1000), 250);
        assert!((124..=126).contains(&gone(3, 500)), "{}", gone(3, 500));
        let split: usize = (0..4).map(|chunk| gone(chunk, 250)).sum();
        assert!((246..=254).contains(&split), "{split}");
        let run = cut.run(0);
        let doomed: Vec<bool> = (0..8).map(|_| run.judge()(7)).collect();
        assert_eq!(doomed.iter().filter(|&&d| d).count(), 2);
        assert!(doomed.windows(2).all(|w| !(w[0] && w[1])), "{doomed:?}");
        // Below the threshold always, above never, and neither takes a tie's turn.
        let run = cut.run(1);
        assert!(run.judge()(6) && !run.judge()(8));
        // A table for one key (max_keys 0 or 1): the one tie of one to go is doomed.
        let one = CapacityCut::new(&mut [7u64; 2], 1, 2).unwrap().shared();
        let run = one.run(0);
        assert_eq!((0..2).filter(|_| run.judge()(7)).count(), 1);
    }

    // Pins G20.
    #[test]
    fn a_key_asked_twice_keeps_its_turn() {
        let cut = CapacityCut::new(&mut [5; 10], 5, 10).unwrap();
        let judge = cut.judge();
        let first = judge(5);
        assert!((0..3).all(|_| judge(5) == first));
    }
}
