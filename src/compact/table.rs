//! The compact table: lines of slots, probing by line within a window, striped inserts,
//! sweeps and capacity eviction. The design is in `docs/DESIGN.md` (section "The compact
//! table").

use super::key::CompactKey;
use super::slot::{AtomicU8, TableSlot, VariantSlot};
use crate::algo::Algorithm;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::Variant;
use crate::shared::{Core, Options};
use crate::stats::Metrics;
use crate::sweeper::{
    capacity_pass, evict_before_insert, evict_by, one_sweep, CapacityCut, SharedCut,
};
use crate::sync::Mutex;
use crossbeam_utils::CachePadded;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Slots per line: four 16-byte pair slots fill one 64-byte cache line.
pub(crate) const SLOTS_PER_LINE: usize = 4;

/// The probe window: a key lives at most `WINDOW_LINES - 1` lines past its home line. At the
/// design load (3/4) most keys sit in their home line, but linear probing has a long thin
/// tail (the longest probes measured at 10^6 and 10^7 keys are in `BENCHMARKS.md`, from
/// [`Limiter::probe_stats`](crate::Limiter::probe_stats)); the window is about
/// twice the longest, which leaves room to grow, so it fills only when the table itself is
/// nearly full.
pub(crate) const WINDOW_LINES: usize = 128;

/// The `max_keys` of a compact limiter built without [`Builder::max_keys`](crate::store::Builder::max_keys).
pub const DEFAULT_MAX_KEYS: usize = 65_536;

/// Slots a capacity pass samples to draw its cut.
const SAMPLE: usize = 4096;

/// Home-line lock stripes for inserts (cache-padded: 64 KiB).
const STRIPES: usize = 1024;

/// A capacity pass shared out in chunks of slots (`Table::work_on`).
struct SharedPass {
    cut: SharedCut,
    /// The sweep's `now`, for the debts kept.
    now: u64,
    /// The next chunk's first slot.
    cursor: AtomicUsize,
    /// Threads working on a chunk.
    busy: AtomicUsize,
    evicted: AtomicU64,
}

/// One cache line of slots.
#[repr(align(64))]
struct Line<T>([T; SLOTS_PER_LINE]);

pub(crate) type SlotOf<K, A, V> =
    <V as VariantSlot<A>>::Slot<<K as crate::compact::key::sealed::Inline>::Repr>;

/// Everything the requests and the sweeper thread share: the table and the store core.
pub(crate) struct Table<K: CompactKey, A: Algorithm, C, V: Variant<A>> {
    lines: Box<[Line<SlotOf<K, A, V>>]>,
    /// Per home line: how many lines past it any of its keys may sit. Raised under the line's
    /// stripe lock before a key is placed there; lowered by sweeps and capacity passes
    /// (`lower_reach`), also under it; bounded by `window - 1`.
    reach: Box<[AtomicU8]>,
    stripes: Box<[CachePadded<Mutex<()>>]>,
    /// Lines a key may be placed in, from its home line: `min(WINDOW_LINES, lines)`.
    window: usize,
    hasher: ahash::RandomState,
    pub(crate) core: Core<A, C>,
    /// Keys held. Signed: a slot may be freed by a sweep before its inserter counts it.
    len: CachePadded<AtomicI64>,
    pub(crate) max_keys: usize,
    /// Keys evicted by inserts that found their window full.
    window_evictions: AtomicU64,
    /// The capacity pass running, for requests that find it running to take part.
    pass_in_flight: Mutex<Option<Arc<SharedPass>>>,
    _key: PhantomData<fn() -> K>,
}

/// Probe lengths of the keys held: how far from its home line each key sits. See
/// [`Limiter::probe_stats`](crate::Limiter::probe_stats).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProbeStats {
    /// Keys held.
    pub keys: u64,
    /// Mean number of lines a look-up of a held key scans (1 = found in its home line).
    pub mean_lines: f64,
    /// The most lines a look-up of a held key scans.
    pub max_lines: u64,
    /// Share of keys found in their home line.
    pub in_home_line: f64,
    /// The largest reach of any home line (lines a miss scans past the home line).
    pub max_reach: u64,
    /// Lines in the table.
    pub lines: u64,
    /// Slots in the table: the most keys it can ever hold.
    pub slots: u64,
    /// The probe window: the most lines a key may sit past its home line, plus one. An
    /// insert that finds its window full evicts the window's key closest to fresh.
    pub window: u64,
}

/// The limiter's hasher: seeded at random per process and per limiter (hash flooding).
#[cfg(not(hotlimit_loom))]
fn hasher() -> ahash::RandomState {
    ahash::RandomState::new()
}

/// Under loom, fixed seeds: loom replays a model once per interleaving and needs every run to
/// take the same slots.
#[cfg(hotlimit_loom)]
fn hasher() -> ahash::RandomState {
    ahash::RandomState::with_seeds(1, 2, 3, 4)
}

/// `n` values from `make`, in memory reserved fallibly.
fn filled<T>(
    n: usize,
    make: impl FnMut() -> T,
) -> Result<Box<[T]>, std::collections::TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    v.extend(std::iter::repeat_with(make).take(n));
    Ok(v.into_boxed_slice())
}

/// `hash` scaled onto `0..n` by a multiply-shift (uses the hash's high bits).
#[inline(always)]
fn scale(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}

/// The slot of its home line a key tries first (bits of the hash `scale` barely uses).
#[inline(always)]
pub(crate) fn preferred_slot(fp: u64) -> usize {
    (fp >> 1) as usize % SLOTS_PER_LINE
}

impl<K, A, C, V> Table<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// Allocates the table (fallibly: a `max_keys` beyond memory is an error, not an abort).
    pub(crate) fn new(
        algo: A,
        clock: C,
        options: &Options,
    ) -> Result<Self, std::collections::TryReserveError> {
        let max_keys = options.max_keys.unwrap_or(DEFAULT_MAX_KEYS).max(1);
        let slots = max_keys.saturating_mul(4).div_ceil(3);
        let lines = slots.div_ceil(SLOTS_PER_LINE).max(1);
        let options = Options {
            max_keys: Some(max_keys),
            ..*options
        };
        Ok(Self {
            lines: filled(lines, || Line(std::array::from_fn(|_| TableSlot::empty())))?,
            reach: filled(lines, || AtomicU8::new(0))?,
            stripes: filled(STRIPES.min(lines), || CachePadded::new(Mutex::new(())))?,
            window: WINDOW_LINES.min(lines),
            hasher: hasher(),
            core: Core::new(algo, clock, &options).with_debts(&options)?,
            len: CachePadded::new(AtomicI64::new(0)),
            max_keys,
            window_evictions: AtomicU64::new(0),
            pass_in_flight: Mutex::new(None),
            _key: PhantomData,
        })
    }

    /// Lines in the table.
    pub(crate) fn lines(&self) -> usize {
        self.lines.len()
    }

    /// Totals over every sweep, with the window evictions under `evicted_capacity`.
    pub(crate) fn sweep_totals(&self) -> crate::Metrics {
        let mut totals = self.core.sweep_totals();
        totals.evicted_capacity += self.window_evictions.load(Ordering::Relaxed);
        totals
    }

    pub(crate) fn len(&self) -> usize {
        // The count may run ahead of the slots for a moment (a slot killed and re-claimed
        // before its killer counts it down), never the slots themselves.
        let slots = self.lines.len() * SLOTS_PER_LINE;
        (self.len.load(Ordering::Relaxed).max(0) as usize).min(slots)
    }

    /// The line `d` lines past `home`, wrapping.
    #[inline(always)]
    fn line(&self, home: usize, d: usize) -> &Line<SlotOf<K, A, V>> {
        let mut i = home + d;
        if i >= self.lines.len() {
            i -= self.lines.len();
        }
        &self.lines[i]
    }

    /// `key`'s inline form, fingerprint and home line.
    #[inline(always)]
    pub(crate) fn locate(&self, key: &K::Lookup) -> (K::Repr, u64, usize) {
        let repr = K::repr(key, &self.hasher);
        let (fp, home) = self.place(repr);
        (repr, fp, home)
    }

    /// The fingerprint and home line of a key's inline form.
    #[inline(always)]
    fn place(&self, repr: K::Repr) -> (u64, usize) {
        let hash = K::place(repr, &self.hasher);
        // Odd, so never the lock slot's "free" hint (0).
        (hash | 1, scale(hash, self.lines.len()))
    }

    /// Runs `f` on `key`'s state, inserting the key fresh on first sight and retrying if its
    /// slot is freed under it. Every request path goes through here.
    #[inline(always)]
    pub(crate) fn apply<T>(&self, key: &K::Lookup, f: impl FnMut(&mut A::State) -> T) -> T {
        let (repr, fp, home) = self.locate(key);
        self.apply_at(repr, fp, home, f)
    }

    /// [`apply`](Table::apply) for a key already [located](Table::locate).
    #[inline(always)]
    pub(crate) fn apply_at<T>(
        &self,
        repr: K::Repr,
        fp: u64,
        home: usize,
        mut f: impl FnMut(&mut A::State) -> T,
    ) -> T {
        loop {
            // No closure around the look-ups: wrapping them measurably slowed the hot path
            // (issue #19's sitting, in `BENCHMARKS.md`'s git history).
            let out = match self.find_apply(repr, fp, home, &mut f) {
                Some(out) => Some(out),
                None => self
                    .insert(repr, fp, home)
                    .try_update(repr, fp, &self.core.stats, &mut f),
            };
            if let Some(out) = out {
                return out;
            }
            // Freed (by a sweep or a window eviction) between the insert and the update.
        }
    }

    /// Loads the word of the slot where a key placed at `home` with `fp` most likely sits:
    /// what a batch does for each key before deciding any (`crate::batch`), so that the
    /// misses of a batch's keys overlap. The answer is only a hint.
    #[inline(always)]
    pub(crate) fn touch(&self, fp: u64, home: usize) -> bool {
        self.lines[home].0[preferred_slot(fp)].looks_free()
    }

    /// A step on a copy of `key`'s state, or of a fresh one if the key is absent: the
    /// look-up of `find_apply` without the write, and no insert.
    pub(crate) fn peek(&self, algo: &A, key: &K::Lookup, cost: u64, now: u64) -> Decision {
        let (repr, fp, home) = self.locate(key);
        let reach = self.reach[home].load(Ordering::Acquire) as usize;
        for d in 0..=reach {
            for slot in &self.line(home, d).0 {
                // `holds` is the cheap filter; `inspect` re-checks the key on the state it
                // reads, since the slot may change owner in between.
                if !slot.holds(repr, fp) {
                    continue;
                }
                let peeked =
                    slot.inspect(|k, state| (k == repr).then(|| algo.peek(state, now, cost)));
                if let Some(Some(decision)) = peeked {
                    return decision;
                }
            }
        }
        self.core.peek_absent(algo, || fp, now, cost)
    }

    /// The lock-free look-up: the home line, then (only if the key is not there) as many
    /// lines as the home line's reach.
    #[inline(always)]
    fn find_apply<T>(
        &self,
        repr: K::Repr,
        fp: u64,
        home: usize,
        f: &mut impl FnMut(&mut A::State) -> T,
    ) -> Option<T> {
        // The home line from the key's preferred slot: most keys sit in it (see `insert`), so
        // the first probe usually matches and the branch predicts well.
        let line = &self.lines[home].0;
        let first = preferred_slot(fp);
        for i in 0..SLOTS_PER_LINE {
            let slot = &line[(first + i) % SLOTS_PER_LINE];
            if let Some(out) = slot.try_update(repr, fp, &self.core.stats, f) {
                return Some(out);
            }
        }
        let reach = self.reach[home].load(Ordering::Acquire) as usize;
        for d in 1..=reach {
            for slot in &self.line(home, d).0 {
                if let Some(out) = slot.try_update(repr, fp, &self.core.stats, f) {
                    return Some(out);
                }
            }
        }
        None
    }

    /// The slot holding `repr`, inserted fresh if absent. Serialized per home line: every
    /// insert of one key takes the same stripe lock, so under it the key is either found
    /// within the home line's reach or absent from the table.
    #[cold]
    #[inline(never)]
    fn insert(&self, repr: K::Repr, fp: u64, home: usize) -> &SlotOf<K, A, V> {
        // Rather than let a flood fill the table, so that every new key scans a full window
        // and evicts one key from it. Before the stripe lock: a pass is long.
        evict_before_insert(
            || self.len(),
            self.max_keys,
            &self.core.pass,
            &self.core.totals,
            || {
                let evicted = self.evict_capacity();
                // The keys left sit nearer their homes than the flood's fullest moment did:
                // misses (every new key's look-up) scan only as far as they must. (A sweep
                // lowers the reach once, after its own passes.)
                self.lower_reach();
                evicted
            },
            Some(&|| self.help_pass()),
        );
        let _stripe = self.stripes[home % self.stripes.len()].lock();
        loop {
            // Only this stripe's holders raise this reach, so it is stable while we hold it.
            let reach = self.reach[home].load(Ordering::Acquire) as usize;
            for d in 0..=reach {
                for slot in &self.line(home, d).0 {
                    if slot.holds(repr, fp) {
                        return slot;
                    }
                }
            }
            match self.first_free(home, fp) {
                Some((d, slot)) => {
                    if d > reach {
                        // Raised before the claim, so the reach covers the key from the moment
                        // it is visible; a look-up that read the old reach misses, comes here
                        // and waits for us.
                        self.reach[home].fetch_max(d as u8, Ordering::AcqRel);
                    }
                    if slot.claim(repr, fp, self.core.start_state(|| fp)) {
                        let len = self.len.fetch_add(1, Ordering::Relaxed) + 1;
                        // Woken after the insert, so the sweep it triggers sees this key.
                        if len > self.max_keys as i64 {
                            self.core.signal.wake();
                        }
                        return slot;
                    }
                    // Another home line's insert took that slot first: look again.
                }
                None => self.evict_in_window(home),
            }
        }
    }

    /// The first free slot of `home`'s window (in the home line, from the key's preferred
    /// slot) and its distance in lines.
    fn first_free(&self, home: usize, fp: u64) -> Option<(usize, &SlotOf<K, A, V>)> {
        let line = &self.lines[home].0;
        let first = preferred_slot(fp);
        if let Some(slot) = (0..SLOTS_PER_LINE)
            .map(|i| &line[(first + i) % SLOTS_PER_LINE])
            .find(|s| s.looks_free())
        {
            return Some((0, slot));
        }
        (1..self.window).find_map(|d| {
            self.line(home, d)
                .0
                .iter()
                .find(|s| s.looks_free())
                .map(|s| (d, s))
        })
    }

    /// The window is full: evicts its key closest to fresh (earliest `idle_at`).
    #[cold]
    fn evict_in_window(&self, home: usize) {
        let victim = (0..self.window)
            .flat_map(|d| self.line(home, d).0.iter())
            .filter_map(|s| s.inspect(|_, state| (self.core.algo.idle_at(state), s)))
            .min_by_key(|&(idle_at, _)| idle_at);
        if let Some((idle_at, slot)) = victim {
            let now = self.core.sweep_now();
            if slot.kill_if(|repr, state| {
                let doomed = self.core.algo.idle_at(state) <= idle_at;
                if doomed {
                    self.core.keep_debt(|| self.place(repr).0, state, now);
                }
                doomed
            }) {
                self.len.fetch_sub(1, Ordering::Relaxed);
                self.window_evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn slots(&self) -> impl Iterator<Item = &SlotOf<K, A, V>> {
        self.lines.iter().flat_map(|line| line.0.iter())
    }

    pub(crate) fn sweep(&self) -> Metrics {
        let started = Instant::now();
        let now = self.core.sweep_now();
        let mut report = one_sweep();
        for slot in self.slots() {
            if self.core.signal.stopping() {
                break;
            }
            if slot.inspect(|_, _| ()).is_none() {
                continue;
            }
            report.scanned += 1;
            if slot.kill_if(|_, state| self.core.algo.idle_at(state) <= now) {
                report.evicted_idle += 1;
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
        if self.len() > self.max_keys {
            report.evicted_capacity =
                capacity_pass(&self.core.pass, &self.core.totals, || self.evict_capacity());
        }
        self.lower_reach();
        report.sweep_busy = started.elapsed();
        self.core.totals.add(&report);
        report.keys = self.len() as u64;
        report
    }

    /// Evicts `len − 7/8·max_keys` keys, those closest to fresh (earliest `idle_at`) first,
    /// keeping what they owe: a [`CapacityCut`] drawn from a sample of `SAMPLE` slots spread
    /// evenly over the table (keys sit in hash order, so it is a uniform sample), then one
    /// pass kills the keys it dooms, ties spread over the table. Keys updated meanwhile are
    /// judged on their new state; a pass they leave far short is re-cut ([`evict_by`]). The
    /// sample is the only allocation, whatever the table's size.
    fn evict_capacity(&self) -> u64 {
        let target = self.max_keys - self.max_keys / 8;
        let excess = self.len().saturating_sub(target) as u64;
        let now = self.core.sweep_now();
        evict_by(
            excess,
            |n| {
                let slots = self.lines.len() * SLOTS_PER_LINE;
                let step = (slots / SAMPLE).max(1);
                // Its full size at once: one allocation, not a doubling series.
                let mut sample = Vec::with_capacity(slots.div_ceil(step));
                sample.extend((0..slots).step_by(step).filter_map(|i| {
                    self.lines[i / SLOTS_PER_LINE].0[i % SLOTS_PER_LINE]
                        .inspect(|_, state| self.core.algo.idle_at(state))
                }));
                CapacityCut::new(&mut sample, n, self.len() as u64)
            },
            |cut| {
                // Shared out: requests that find this pass running take chunks of it.
                let pass = Arc::new(SharedPass {
                    cut: cut.shared(),
                    now,
                    cursor: AtomicUsize::new(0),
                    busy: AtomicUsize::new(0),
                    evicted: AtomicU64::new(0),
                });
                *self.pass_in_flight.lock() = Some(pass.clone());
                self.work_on(&pass);
                *self.pass_in_flight.lock() = None;
                // Helpers that took a chunk finish it before the pass counts.
                let backoff = crate::sync::Backoff::new();
                while pass.busy.load(Ordering::SeqCst) > 0 {
                    backoff.spin();
                }
                pass.evicted.load(Ordering::SeqCst)
            },
        )
    }

    /// Takes part in the capacity pass running, if one is (a request that found the pass's
    /// gate held, before it inserts beside the pass).
    fn help_pass(&self) {
        let pass = self.pass_in_flight.lock().clone();
        if let Some(pass) = pass {
            self.work_on(&pass);
        }
    }

    /// Kills the keys `pass` dooms, a chunk of slots at a time, until every chunk is taken.
    fn work_on(&self, pass: &SharedPass) {
        const CHUNK: usize = 4096;
        let slots = self.lines.len() * SLOTS_PER_LINE;
        // Counted busy before taking a chunk, so the pass waits for every chunk taken.
        pass.busy.fetch_add(1, Ordering::SeqCst);
        loop {
            let start = pass.cursor.fetch_add(CHUNK, Ordering::SeqCst);
            if start >= slots || self.core.signal.stopping() {
                break;
            }
            let mut evicted = 0;
            let run = pass.cut.run((start / CHUNK) as u64);
            for i in start..(start + CHUNK).min(slots) {
                let slot = &self.lines[i / SLOTS_PER_LINE].0[i % SLOTS_PER_LINE];
                let judge = run.judge();
                if slot.kill_if(|repr, state| {
                    let doomed = judge(self.core.algo.idle_at(state));
                    if doomed {
                        self.core.keep_debt(|| self.place(repr).0, state, pass.now);
                    }
                    doomed
                }) {
                    evicted += 1;
                    self.len.fetch_sub(1, Ordering::Relaxed);
                }
            }
            pass.evicted.fetch_add(evicted, Ordering::SeqCst);
        }
        pass.busy.fetch_sub(1, Ordering::SeqCst);
    }

    /// Lowers each home line's reach to the farthest line one of its keys still sits in, so
    /// that look-ups that miss (new keys) scan no further than they must once a flood has
    /// passed. Under the line's stripe lock, the one every insert of its keys takes: no key
    /// of it moves meanwhile, and a look-up that read the old reach and misses goes on to that
    /// lock and looks again. A walk of the reaches, no allocation.
    fn lower_reach(&self) {
        for home in 0..self.lines.len() {
            if self.reach[home].load(Ordering::Acquire) == 0 || self.core.signal.stopping() {
                continue;
            }
            let _stripe = self.stripes[home % self.stripes.len()].lock();
            let reach = self.reach[home].load(Ordering::Acquire) as usize;
            let farthest = (1..=reach)
                .rev()
                .find(|&d| {
                    self.line(home, d).0.iter().any(|slot| {
                        slot.inspect(|repr, _| self.place(repr).1 == home)
                            .unwrap_or(false)
                    })
                })
                .unwrap_or(0);
            if farthest < reach {
                self.reach[home].store(farthest as u8, Ordering::Release);
            }
        }
    }

    pub(crate) fn probe_stats(&self) -> ProbeStats {
        let lines = self.lines.len();
        let mut stats = ProbeStats {
            lines: lines as u64,
            slots: (lines * SLOTS_PER_LINE) as u64,
            window: self.window as u64,
            ..ProbeStats::default()
        };
        let (mut total, mut home_hits) = (0u64, 0u64);
        for (i, line) in self.lines.iter().enumerate() {
            for slot in &line.0 {
                let Some(repr) = slot.inspect(|repr, _| repr) else {
                    continue;
                };
                let home = self.place(repr).1;
                let d = (i + lines - home) % lines;
                let scanned = d as u64 + 1;
                stats.keys += 1;
                total += scanned;
                home_hits += (d == 0) as u64;
                stats.max_lines = stats.max_lines.max(scanned);
            }
        }
        if stats.keys > 0 {
            stats.mean_lines = total as f64 / stats.keys as f64;
            stats.in_home_line = home_hits as f64 / stats.keys as f64;
        }
        stats.max_reach = self
            .reach
            .iter()
            .map(|r| u64::from(r.load(Ordering::Relaxed)))
            .max()
            .unwrap_or(0);
        stats
    }
}
