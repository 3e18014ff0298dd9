//! The compact table: lines of slots, probing by line within a window, striped inserts,
//! placement by linear hashing, and window eviction; growth (the splits) is in [`grow`], the
//! sweeps and capacity passes in [`sweeps`]. The design is in `docs/DESIGN.md` (section "The
//! compact table").

mod grow;
mod sweeps;

use super::key::CompactKey;
use super::slot::{AtomicU8, TableSlot, VariantSlot};
use crate::algo::Algorithm;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::BuildError;
use crate::limiter::Variant;
use crate::shared::{Core, Options};
use crate::sweeper::{evict_before_insert, SharedCut};
use crate::sync::{Mutex, RwLock};
use crossbeam_utils::CachePadded;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Slots per line: four 16-byte pair slots fill one 64-byte cache line.
pub(crate) const SLOTS_PER_LINE: usize = 4;

/// The probe window: a key lives at most `WINDOW_LINES - 1` lines past its home line. At the
/// design load (3/4) most keys sit in their home line, but linear probing has a long thin
/// tail (the longest probes measured at 10^6 keys are in `BENCHMARKS.md`, from
/// [`Limiter::probe_stats`](crate::Limiter::probe_stats)); the window is about
/// twice the longest, which leaves room to grow, so it fills only when the table itself is
/// nearly full.
pub(crate) const WINDOW_LINES: usize = 128;

/// The `max_keys` of a compact limiter built without [`Builder::max_keys`](crate::store::Builder::max_keys).
pub const DEFAULT_MAX_KEYS: usize = 65_536;

/// Slots a capacity pass samples to draw its cut.
const SAMPLE: usize = 4096;

/// Home-line lock stripes for inserts (cache-padded: 128 KiB).
const STRIPES: usize = 1024;

/// The most home lines at level 0: the table's most lines are `base · 2^L`, `base` in
/// 33..=64 (or fewer lines when `max_keys` needs fewer), so they exceed what `max_keys` needs
/// by at most 1/32 (a power of two would waste up to half). Under loom, one: the models grow a
/// table of a few keys through its levels.
#[cfg(not(hotlimit_loom))]
const BASE_LINES: usize = 64;
#[cfg(hotlimit_loom)]
const BASE_LINES: usize = 1;

/// Chunk sizes, as a power of two: chunk `c >= 1` holds lines `2^(c-1) · 128 + 128 ..
/// 2^c · 128 + 128`, and chunk 0 the 256 before (16 KiB of pair slots). So each chunk is
/// about as large as all before it: a table of any size takes a few dozen chunks at most, the
/// directory is a fixed few hundred bytes whether the table is bounded or not, and a line's
/// chunk is found from its index's bit length, without a load. The `+ 128` is the probe
/// window past the last home line (`WINDOW_LINES`): a table of `64 · 2^L` home lines (an
/// unbounded one after each level) ends exactly at a chunk's end, not 128 lines into a chunk
/// as large as the whole table. A constant, so the look-up's arithmetic is immediate.
const CHUNK_BITS: u32 = 7;

/// Levels of a table built without a bound, from `BASE_LINES` home lines: 64 · 2^40 lines at
/// most, past any memory, so in practice it grows until memory is refused (on a 32-bit
/// target, 64 · 2^17 lines: half its address space in lines).
const UNBOUNDED_LEVELS: u32 = if usize::BITS >= 64 { 40 } else { 17 };

/// Keys' worth of debt table for a table built without a bound. It evicts for capacity only
/// when memory for its next chunk is refused or a split's image line finds its window full
/// (neither seen in the tests), so a small table suffices to keep those keys' limits.
const UNBOUNDED_DEBT_KEYS: usize = 256;

/// Insert stripes of a table built without a bound: it starts with 64 home lines, like a
/// small bounded table, and may stay that small (a `CasLimiter` of `u64` keys made per
/// route or per tenant), so it does not take `STRIPES`' 128 KiB up front; 64 stripes keep
/// inserts of 16 threads apart all the same (a stripe is held for one insert or one split).
const UNBOUNDED_STRIPES: usize = 64;

/// The chunk holding line `i`. `| 1`: a base-2 log of a number never 0 (one `bsr`, no
/// branch or zero case).
#[inline(always)]
fn chunk_index(i: usize) -> usize {
    ((i.saturating_sub(WINDOW_LINES) >> (CHUNK_BITS - 1)) | 1).ilog2() as usize
}

/// The chunk holding line `i`, and `i`'s place in it.
#[cfg(all(test, not(hotlimit_loom)))]
fn chunk_of(i: usize) -> (usize, usize) {
    let c = chunk_index(i);
    (c, i - chunk_start(c))
}

/// The first line of chunk `c`: 0, then `2^(c-1) · 128 + 128`.
fn chunk_start(c: usize) -> usize {
    match c {
        0 => 0,
        _ => (1usize << (c - 1 + CHUNK_BITS as usize)) + WINDOW_LINES,
    }
}

/// Home lines below which the table grows at 1/4 full rather than 3/4: 1 MiB of pair slots,
/// a core's L2. At that size a check is worth more than the bytes: at 1/4 full almost every
/// key sits in the slot its look-up tries first (`BENCHMARKS.md`, "On the development VM":
/// the 10k-key cells). Under loom, 0: the models' tables are the size they name.
#[cfg(not(hotlimit_loom))]
const SMALL_LINES: usize = 1 << 14;
#[cfg(hotlimit_loom)]
const SMALL_LINES: usize = 0;

/// Lines an insert splits while a level is under way: one a time lets the lines not yet split
/// (twice the mean load) overflow their windows (`docs/DESIGN.md`).
const SPLITS: usize = 4;

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
    /// Slots the pass covers: those of the table when it started (a helper that joins late
    /// never walks lines a split has filled since).
    slots: usize,
}

/// One cache line of slots.
#[repr(align(64))]
struct Line<T>([T; SLOTS_PER_LINE]);

pub(crate) type SlotOf<K, A, V> =
    <V as VariantSlot<A>>::Slot<<K as crate::compact::key::sealed::Inline>::Repr>;

/// A run of lines, allocated as the table grows and never freed (so no reclamation), with
/// their home lines' reaches. See `CHUNK_BITS` for their sizes.
struct Chunk<T> {
    /// The table's index of `lines[0]`: kept here, beside the pointer, so that a look-up
    /// subtracts it instead of computing it.
    start: usize,
    lines: Box<[Line<T>]>,
    /// Per home line: how many lines past it any of its keys may sit. Raised under the line's
    /// stripe lock before a key is placed there; lowered by sweeps and capacity passes
    /// (`lower_reach`), also under it; bounded by `window - 1`.
    reach: Box<[AtomicU8]>,
}

type ChunkOf<K, A, V> = Chunk<SlotOf<K, A, V>>;

/// The home line of the key of fingerprint `fp` under the growth word `t`, in a table of
/// `base` lines at level 0: linear hashing. `t` holds the level `L` (high byte) and the split
/// pointer: of the `base · 2^L` lines of the level, the first `split` have been split in two.
/// A home is `a + base · b`: `a` in `0..base` from the fingerprint's top bits (a
/// multiply-shift, so `base` need not be a power of two), `b` its bits 1..=L; a split line's
/// keys are told apart by bit `L + 1`, which adds `base · 2^L` (the line's image) or nothing.
#[inline(always)]
fn home_of(fp: u64, t: u64, base: usize) -> usize {
    let (level, split) = level_and_split(t);
    let a = ((fp >> 32) * base as u64) >> 32;
    let bits = fp >> 1;
    let home = a + base as u64 * (bits & ((1 << level) - 1));
    if home < split {
        // Only while a level is under way (a few inserts in each level's), so a branch.
        return split_home(home, bits, level, base);
    }
    home as usize
}

/// `home_of` for a home line already split in this level: its image for half its keys.
#[cold]
#[inline(never)]
fn split_home(home: u64, bits: u64, level: u64, base: usize) -> usize {
    (home + ((bits >> level) & 1) * ((base as u64) << level)) as usize
}

/// The level (high byte) and the split pointer (the rest) of the growth word `t`.
#[inline(always)]
fn level_and_split(t: u64) -> (u64, u64) {
    (t >> 56, (t << 8) >> 8)
}

/// Home lines under the growth word `t`.
#[inline(always)]
fn homes_of(t: u64, base: usize) -> usize {
    let (level, split) = level_and_split(t);
    (base << level) + split as usize
}

/// Everything the requests and the sweeper thread share: the table and the store core.
///
/// Lines are never wrapped: a key sits at most `window - 1` lines past its home, and the
/// lines past the last home are allocated with it. The table starts at `base` home lines and
/// grows by splitting one line at a time (linear hashing) up to `max_homes`; see `split`.
pub(crate) struct Table<K: CompactKey, A: Algorithm, C, V: Variant<A>> {
    /// The level and split pointer (see `home_of`). Stored only under `grow` and the stripes
    /// of the line split and its image.
    t: crate::sync::AtomicU64,
    /// Home lines at level 0.
    base: usize,
    chunks: Box<[OnceLock<ChunkOf<K, A, V>>]>,
    /// The most home lines: `base · 2^L`, enough for `max_keys` at the design fill. Past
    /// them, inserts evict instead.
    max_homes: usize,
    /// Written by a split, read by a sweep's walk, a capacity pass and a window eviction: a
    /// split never runs beside a walk or a kill of another home's key, and those run beside
    /// one another (each kill is one CAS on its slot). A new key whose window is full waits at
    /// most [`SPLIT_WAIT`] for a walk to let a split in, to grow the table, then evicts from its
    /// window beside the walk: no check waits on a stopped sweep for longer (G68). Taken before
    /// a stripe, never after.
    grow: RwLock<()>,
    stripes: Box<[CachePadded<Mutex<()>>]>,
    /// Lines a key may be placed in, from its home line: `min(WINDOW_LINES, max_homes)`.
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
    /// Lines in the table now: its home lines and the window past the last.
    pub lines: u64,
    /// Slots in the table now: the most keys it can hold before it grows again.
    pub slots: u64,
    /// The probe window: the most lines a key may sit past its home line, plus one. An
    /// insert that finds its window full evicts the window's key closest to fresh.
    pub window: u64,
}

/// How long a new key whose probe window is full, in a table that may still grow, waits for a
/// sweep's walk or a capacity pass to let a split in before it evicts from its window beside
/// them instead. A running walk lets a split in every 64 lines (microseconds); the wait covers
/// a walker the scheduler left off the CPU mid-stretch (1 ms was too short on a loaded 2-core
/// machine: a key of a growing table evicted early); a stopped sweep never ends (G68).
const SPLIT_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

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

/// The slot of its home line a key tries first: bits 44 and 45 of its fingerprint, which
/// its home does not read (the top bits and bits 1..=41; see `home_of`).
#[inline(always)]
pub(crate) fn preferred_slot(fp: u64) -> usize {
    (fp >> 44) as usize % SLOTS_PER_LINE
}

impl<K, A, C, V> Table<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// Allocates the table's first lines (fallibly: memory refused, or a `max_keys` whose
    /// table would not fit the address space, is [`BuildError::OutOfMemory`], not an abort).
    /// Without [`max_keys`](crate::store::Builder::max_keys) the table has no bound: it grows as keys come,
    /// never evicts for capacity, and keeps a small debt table for what it evicts otherwise
    /// (`UNBOUNDED_DEBT_KEYS`). The compact limiter's own default bound
    /// ([`DEFAULT_MAX_KEYS`]) is set by its builder, not here.
    // Under loom `SMALL_LINES` is 0, so its comparisons are constant there.
    #[cfg_attr(
        hotlimit_loom,
        allow(clippy::absurd_extreme_comparisons, clippy::unnecessary_min_or_max)
    )]
    pub(crate) fn new(algo: A, clock: C, options: &Options) -> Result<Self, BuildError> {
        let (base, levels, max_keys) = match options.max_keys {
            Some(max_keys) => {
                let max_keys = max_keys.max(1);
                // The fewest home lines holding `max_keys` at the design fill, as
                // `base · 2^levels`.
                let needed = if max_keys <= SMALL_LINES {
                    max_keys
                } else {
                    max_keys.div_ceil(3).max(SMALL_LINES)
                };
                let levels = needed
                    .div_ceil(BASE_LINES)
                    .next_power_of_two()
                    .trailing_zeros();
                (needed.div_ceil(1 << levels), levels, max_keys)
            }
            // A bound no count of keys reaches (`isize::MAX`: it is compared as an `i64`).
            None => (BASE_LINES, UNBOUNDED_LEVELS, isize::MAX as usize),
        };
        let max_homes = base << levels;
        // Past 2^40 lines at level 0's scale the fingerprint's bits run short; far past any
        // memory anyway.
        let fits = max_homes.checked_mul(size_of::<Line<SlotOf<K, A, V>>>())
            <= Some(isize::MAX as usize / 2);
        if levels > UNBOUNDED_LEVELS || !fits {
            return Err(BuildError::OutOfMemory);
        }
        let window = WINDOW_LINES.min(max_homes);
        let core = Core::new(algo, clock, options);
        let core = match options.max_keys {
            Some(_) => core.with_debts(options)?,
            None => core.with_debt_table(UNBOUNDED_DEBT_KEYS, options)?,
        };
        let table = Self {
            t: crate::sync::AtomicU64::new(0),
            base,
            chunks: filled(chunk_index(max_homes + window - 1) + 1, OnceLock::new)?,
            max_homes,
            grow: RwLock::new(()),
            stripes: filled(
                match options.max_keys {
                    Some(_) => STRIPES.min(max_homes),
                    None => UNBOUNDED_STRIPES,
                },
                || CachePadded::new(Mutex::new(())),
            )?,
            window,
            hasher: hasher(),
            core,
            len: CachePadded::new(AtomicI64::new(0)),
            max_keys,
            window_evictions: AtomicU64::new(0),
            pass_in_flight: Mutex::new(None),
            _key: PhantomData,
        };
        table.allocate(base + window)?;
        Ok(table)
    }

    /// Allocates every chunk below line `lines`.
    fn allocate(&self, lines: usize) -> Result<(), std::collections::TryReserveError> {
        let all = self.max_homes + self.window;
        let last = chunk_index(lines.min(all) - 1);
        for (c, chunk) in self.chunks[..=last].iter().enumerate() {
            if chunk.get().is_none() {
                // The last chunk only as long as the table's most lines need.
                let size = (chunk_start(c + 1) - chunk_start(c)).min(all - chunk_start(c));
                let made = Chunk {
                    start: chunk_start(c),
                    lines: filled(size, || Line(std::array::from_fn(|_| TableSlot::empty())))?,
                    reach: filled(size, || AtomicU8::new(0))?,
                };
                // Only under `grow` (or in `new`): no other thread sets it.
                let _ = chunk.set(made);
            }
        }
        Ok(())
    }

    /// The growth word.
    #[inline(always)]
    fn t(&self) -> u64 {
        self.t.load(Ordering::Acquire)
    }

    /// Home lines now.
    fn homes(&self) -> usize {
        homes_of(self.t(), self.base)
    }

    /// Lines that may hold keys now: the homes and the window past the last.
    pub(crate) fn lines(&self) -> usize {
        self.homes() + self.window - 1
    }

    /// The chunk holding line `i` (allocated before any home or window reaches its lines: a
    /// split allocates before it moves `t`).
    #[inline(always)]
    fn chunk(&self, i: usize) -> &Chunk<SlotOf<K, A, V>> {
        match self.chunks[chunk_index(i)].get() {
            Some(chunk) => chunk,
            None => unreachable!("a line used before its chunk was allocated"),
        }
    }

    #[inline(always)]
    fn at(&self, i: usize) -> &Line<SlotOf<K, A, V>> {
        let chunk = self.chunk(i);
        &chunk.lines[i - chunk.start]
    }

    #[inline(always)]
    fn reach(&self, home: usize) -> &AtomicU8 {
        let chunk = self.chunk(home);
        &chunk.reach[home - chunk.start]
    }

    /// The slot of index `i` (line `i / 4`).
    fn slot(&self, i: usize) -> &SlotOf<K, A, V> {
        &self.at(i / SLOTS_PER_LINE).0[i % SLOTS_PER_LINE]
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
        let slots = self.lines() * SLOTS_PER_LINE;
        (self.len.load(Ordering::Relaxed).max(0) as usize).min(slots)
    }

    /// The line `d` lines past `home`.
    #[inline(always)]
    fn line(&self, home: usize, d: usize) -> &Line<SlotOf<K, A, V>> {
        self.at(home + d)
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
        let fp = hash | 1;
        (fp, self.home(fp))
    }

    /// The home line of the key of fingerprint `fp` now (see `home_of`).
    #[inline(always)]
    fn home(&self, fp: u64) -> usize {
        home_of(fp, self.t(), self.base)
    }

    /// Locks the stripe of the home line of the key of fingerprint `fp`: held, no split moves
    /// the key (a split holds the stripes of the line it splits and of its image), so the home
    /// returned stays the key's home until the guard is dropped.
    fn lock_home(&self, fp: u64) -> (usize, impl Sized + '_) {
        let mut home = self.home(fp);
        loop {
            let guard = self.stripes[home % self.stripes.len()].lock();
            let now = self.home(fp);
            if now == home {
                return (home, guard);
            }
            home = now;
        }
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
                    .insert(repr, fp)
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
        self.at(home).0[preferred_slot(fp)].looks_free()
    }

    /// `f` on the state of the first slot of `home`'s reach holding `repr` live.
    fn inspect_key<T>(
        &self,
        repr: K::Repr,
        fp: u64,
        home: usize,
        mut f: impl FnMut(&A::State) -> T,
    ) -> Option<T> {
        let reach = self.reach(home).load(Ordering::Acquire) as usize;
        for d in 0..=reach {
            for slot in &self.line(home, d).0 {
                // `holds` is the cheap filter; `inspect` re-checks the key on the state it
                // reads, since the slot may change owner in between.
                if !slot.holds(repr, fp) {
                    continue;
                }
                if let Some(Some(out)) = slot.inspect(|k, state| (k == repr).then(|| f(state))) {
                    return Some(out);
                }
            }
        }
        None
    }

    /// A step on a copy of `key`'s state, or of a fresh one if the key is absent: the
    /// look-up of `find_apply` without the write, and no insert.
    pub(crate) fn peek(&self, algo: &A, key: &K::Lookup, cost: u64, now: u64) -> Decision {
        let (repr, fp, home) = self.locate(key);
        let step = |state: &A::State| algo.peek(state, now, cost);
        if let Some(decision) = self.inspect_key(repr, fp, home, step) {
            return decision;
        }
        // Missed: a split may have been moving the key. Under its home's stripe no split
        // does, so the look-up there is the truth.
        let (home, _stripe) = self.lock_home(fp);
        if let Some(decision) = self.inspect_key(repr, fp, home, step) {
            return decision;
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
        let chunk = self.chunk(home);
        let at = home - chunk.start;
        let line = &chunk.lines[at].0;
        let first = preferred_slot(fp);
        for i in 0..SLOTS_PER_LINE {
            let slot = &line[(first + i) % SLOTS_PER_LINE];
            if let Some(out) = slot.try_update(repr, fp, &self.core.stats, f) {
                return Some(out);
            }
        }
        let reach = chunk.reach[at].load(Ordering::Acquire) as usize;
        for d in 1..=reach {
            for slot in &self.line(home, d).0 {
                if let Some(out) = slot.try_update(repr, fp, &self.core.stats, f) {
                    return Some(out);
                }
            }
        }
        None
    }

    /// The slot of `home`'s window holding `repr` live, if any (the home's stripe held).
    fn held(&self, repr: K::Repr, fp: u64, home: usize) -> Option<&SlotOf<K, A, V>> {
        let reach = self.reach(home).load(Ordering::Acquire) as usize;
        (0..=reach)
            .flat_map(|d| self.line(home, d).0.iter())
            .find(|slot| slot.holds(repr, fp))
    }

    /// Claims a free slot of `home`'s window for `repr` with `state`, the home's stripe
    /// held; `None` if the window is full.
    fn place_in(
        &self,
        repr: K::Repr,
        fp: u64,
        home: usize,
        state: impl Fn() -> A::State,
    ) -> Option<&SlotOf<K, A, V>> {
        loop {
            let (d, slot) = self.first_free(home, fp)?;
            // Raised before the claim, so the reach covers the key from the moment it is
            // visible; a look-up that read the old reach misses, comes to the stripe and waits.
            self.reach(home).fetch_max(d as u8, Ordering::AcqRel);
            if slot.claim(repr, fp, state()) {
                return Some(slot);
            }
            // Another home line's insert took that slot first: look again.
        }
    }

    /// The slot holding `repr`, inserted fresh if absent. Serialized per home line: every
    /// insert of one key takes the same stripe lock, so under it the key is either found
    /// within the home line's reach or absent from the table.
    #[cold]
    #[inline(never)]
    fn insert(&self, repr: K::Repr, fp: u64) -> &SlotOf<K, A, V> {
        // Rather than let a flood fill the table, so that every new key scans a full window
        // and evicts one key from it. Before the stripe lock: a pass is long.
        evict_before_insert(
            || self.len(),
            self.max_keys,
            &self.core.pass,
            &self.core.totals,
            || {
                let _grow = self.grow.read();
                let evicted = self.evict_capacity();
                // The keys left sit nearer their homes than the flood's fullest moment did:
                // misses (every new key's look-up) scan only as far as they must. (A sweep
                // lowers the reach once, after its own passes.)
                self.lower_reach();
                evicted
            },
            Some(&|| self.help_pass()),
        );
        loop {
            {
                let (home, _stripe) = self.lock_home(fp);
                if let Some(slot) = self.held(repr, fp, home) {
                    return slot;
                }
                let placed = self.place_in(repr, fp, home, || self.core.start_state(|| fp));
                if let Some(slot) = placed {
                    let len = self.len.fetch_add(1, Ordering::Relaxed) + 1;
                    // Woken after the insert, so the sweep it triggers sees this key.
                    if len > self.max_keys as i64 {
                        self.core.signal.wake();
                    }
                    drop(_stripe);
                    self.maybe_grow();
                    return slot;
                }
            }
            // A full window, the stripe released (a split or an eviction takes `grow` first):
            // the table grows if it may and nothing walks it now; else the window's key
            // closest to fresh goes, beside a sweep's walk or a capacity pass, never waiting
            // for one to end (only a split under way, a few lines, is waited for).
            // (At its most homes, as under a flood at the bound, nothing to wait for.)
            if self.homes() < self.max_homes {
                if let Some(_grow) = self.grow.try_write_for(SPLIT_WAIT) {
                    if self.split_some() {
                        continue;
                    }
                }
            }
            // Beside the walk that kept the split out, even with another split waiting.
            let _grow = self.grow.read_recursive();
            let (home, _stripe) = self.lock_home(fp);
            if self.first_free(home, fp).is_none() {
                self.evict_in_window(home);
            }
        }
    }

    /// The first free slot of `home`'s window (in the home line, from the key's preferred
    /// slot) and its distance in lines.
    fn first_free(&self, home: usize, fp: u64) -> Option<(usize, &SlotOf<K, A, V>)> {
        let line = &self.at(home).0;
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

    /// The window is full: evicts its key closest to fresh (earliest `idle_at`). Under `grow`
    /// read (no split moves a key meanwhile) and `home`'s stripe.
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
}

#[cfg(all(test, not(hotlimit_loom)))]
mod tests {
    use super::{chunk_index, chunk_of, chunk_start, BASE_LINES, CHUNK_BITS, WINDOW_LINES};

    /// Chunks tile the lines without gap or overlap, each after the first two as large as
    /// all before it less the window, a line's place being its distance from its chunk's
    /// start; and an unbounded table's lines after each level (`64 · 2^L` homes and the
    /// window) end at a chunk's end.
    #[test]
    fn chunks_tile_the_lines() {
        let first = 1usize << CHUNK_BITS;
        assert_eq!((chunk_start(0), chunk_start(1)), (0, first + WINDOW_LINES));
        for c in 2..50 {
            assert_eq!(
                chunk_start(c + 1) - chunk_start(c),
                chunk_start(c) - WINDOW_LINES
            );
        }
        let mut expected = (0, 0);
        for i in 0..(1 << 20) {
            assert_eq!(chunk_of(i), expected, "line {i}");
            expected.1 += 1;
            if i + 1 == chunk_start(expected.0 + 1) {
                expected = (expected.0 + 1, 0);
            }
        }
        for c in 1..50 {
            let start = chunk_start(c);
            assert_eq!(chunk_of(start), (c, 0));
            assert_eq!(chunk_of(start - 1), (c - 1, start - 1 - chunk_start(c - 1)));
        }
        for level in 1..40 {
            let lines = (BASE_LINES << level) + WINDOW_LINES;
            assert_eq!(
                chunk_start(chunk_index(lines - 1) + 1),
                lines,
                "level {level}"
            );
        }
    }
}
