//! A growable one-line table: the layout issue #61 asks of the default store, built small to
//! measure it beside the stores and governor (`benches/scale.rs`, its "growable one-line
//! table" row) and to check its growth loses nothing (`tests/grow_reference.rs`). A reference,
//! not a store: `u64` keys, one `u64` state word per key, no sweeps, no capacity, no debts.
//!
//! A key and its state share one 16-byte slot, four to a 64-byte line, updated by one 128-bit
//! CAS, so a check of a present key loads one line. The table grows by linear hashing: lines
//! live in chunks that are allocated as the table grows and never freed (so no reclamation),
//! and one word, `t`, holds the level and the split pointer that say which line is a key's
//! home. A split moves the keys of one home line whose home becomes its image line
//! `p + n`: each is copied first (invisible: no look-up computes the image as its home before
//! `t` moves on), then freed from its old slot by a CAS that fails if the key was updated
//! meanwhile (the copy is then refreshed and the CAS tried again). Inserts, and a look-up that
//! misses, take the home line's stripe lock, which the split holds, and compute the home again
//! under it. Once the table is 3/4 full (1/4 while its lines fit 1 MiB, a core's L2: at that
//! size speed is worth more than bytes) a level starts, and every insert splits four lines
//! until it ends (one a time lets the unsplit half overflow its windows).

use parking_lot::Mutex;
use portable_atomic::AtomicU128;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

const SLOTS: usize = 4;
/// The state of a free slot (no GCRA state is all ones).
const FREE: u64 = u64::MAX;
/// Lines a key may sit past its home line (the reach fits a byte).
const WINDOW: usize = 128;
const CHUNK_BITS: u32 = 12;
/// Lines per chunk: 256 KiB.
const CHUNK: usize = 1 << CHUNK_BITS;
/// Lines at level 0.
const BASE: usize = 64;
/// Chunks the directory has room for: 2^26 lines, 268M keys.
const CHUNKS: usize = 1 << 14;
const STRIPES: usize = 1024;
/// Splits an insert makes while a level is under way.
const SPLITS: usize = 4;
/// Home lines up to which the table grows at 1/4 full rather than 3/4: 1 MiB of lines.
const SMALL_LINES: usize = 1 << 14;

#[repr(align(64))]
struct Line([AtomicU128; SLOTS]);

struct Chunk {
    lines: Box<[Line]>,
    /// Per home line: how many lines past it its keys may sit.
    reach: Box<[AtomicU8]>,
}

/// See the module documentation.
pub struct GrowTable {
    /// The level (high byte) and the split pointer: `BASE << level` home lines, and the first
    /// `split` of them split into two.
    t: AtomicU64,
    chunks: Box<[OnceLock<Chunk>]>,
    stripes: Box<[Mutex<()>]>,
    grow: Mutex<()>,
    len: AtomicU64,
    hasher: ahash::RandomState,
}

#[inline(always)]
fn pack(key: u64, state: u64) -> u128 {
    (u128::from(key) << 64) | u128::from(state)
}

#[inline(always)]
fn unpack(word: u128) -> (u64, u64) {
    ((word >> 64) as u64, word as u64)
}

/// The home line of a key hashed to `h` under `t`.
#[inline(always)]
fn home_of(h: u64, t: u64) -> usize {
    let (level, split) = (t >> 56, (t << 8) >> 8);
    let n = (BASE as u64) << level;
    let a = h & (n - 1);
    (if a < split { h & (2 * n - 1) } else { a }) as usize
}

/// Home lines under `t`.
fn homes(t: u64) -> usize {
    (BASE << (t >> 56)) + ((t << 8) >> 8) as usize
}

impl Default for GrowTable {
    fn default() -> Self {
        let table = GrowTable {
            t: AtomicU64::new(0),
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            grow: Mutex::new(()),
            len: AtomicU64::new(0),
            hasher: ahash::RandomState::new(),
        };
        table.allocate(BASE + WINDOW);
        table
    }
}

impl GrowTable {
    /// Chunks for every line below `lines`.
    fn allocate(&self, lines: usize) {
        for c in 0..lines.div_ceil(CHUNK).min(CHUNKS) {
            self.chunks[c].get_or_init(|| Chunk {
                lines: (0..CHUNK)
                    .map(|_| Line(std::array::from_fn(|_| AtomicU128::new(pack(0, FREE)))))
                    .collect(),
                reach: (0..CHUNK).map(|_| AtomicU8::new(0)).collect(),
            });
        }
    }

    #[inline(always)]
    fn chunk(&self, line: usize) -> &Chunk {
        // Allocated before any home or window reaches it (`allocate` runs before `t` moves).
        self.chunks[line >> CHUNK_BITS]
            .get()
            .expect("allocated ahead")
    }

    #[inline(always)]
    fn line(&self, line: usize) -> &[AtomicU128; SLOTS] {
        &self.chunk(line).lines[line & (CHUNK - 1)].0
    }

    #[inline(always)]
    fn reach(&self, home: usize) -> &AtomicU8 {
        &self.chunk(home).reach[home & (CHUNK - 1)]
    }

    /// Keys held.
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Relaxed)
    }

    /// Runs `f` on `key`'s state (`fresh` for a key never seen), keeping what it leaves; `f`
    /// may run more than once (a lost CAS race), so it must be pure.
    #[inline(always)]
    pub fn update<T>(&self, key: u64, fresh: u64, mut f: impl FnMut(&mut u64) -> T) -> T {
        let h = self.hasher.hash_one(key);
        loop {
            let home = home_of(h, self.t.load(Ordering::Acquire));
            if let Some(out) = self.find_update(key, h, home, &mut f) {
                return out;
            }
            self.insert(key, h, fresh);
        }
    }

    /// The lock-free look-up: the home line from the key's preferred slot, then as many lines
    /// as the home line's reach.
    #[inline(always)]
    fn find_update<T>(
        &self,
        key: u64,
        h: u64,
        home: usize,
        f: &mut impl FnMut(&mut u64) -> T,
    ) -> Option<T> {
        let first = (h >> 62) as usize;
        let line = self.line(home);
        for i in 0..SLOTS {
            if let Some(out) = try_update(&line[(first + i) % SLOTS], key, f) {
                return Some(out);
            }
        }
        let reach = self.reach(home).load(Ordering::Acquire) as usize;
        for d in 1..=reach {
            for slot in self.line(home + d) {
                if let Some(out) = try_update(slot, key, f) {
                    return Some(out);
                }
            }
        }
        None
    }

    /// Inserts `key` fresh unless it is there, under its home line's stripe lock.
    #[cold]
    #[inline(never)]
    fn insert(&self, key: u64, h: u64, fresh: u64) {
        loop {
            let mut home = home_of(h, self.t.load(Ordering::Acquire));
            let mut stripe = self.stripes[home % STRIPES].lock();
            // A split of this home moves the key and `t` under this lock: once held, the home
            // computed again is the key's until it is released.
            loop {
                let now = home_of(h, self.t.load(Ordering::Acquire));
                if now == home {
                    break;
                }
                drop(stripe);
                home = now;
                stripe = self.stripes[home % STRIPES].lock();
            }
            if self.window_holds(key, home) {
                return;
            }
            if self.place(key, h, fresh, home).is_some() {
                self.len.fetch_add(1, Ordering::Relaxed);
                drop(stripe);
                self.maybe_grow();
                return;
            }
            // A full window: the reference grows instead of evicting, the stripe released
            // (the split takes its own).
            drop(stripe);
            let _g = self.grow.lock();
            self.split();
        }
    }

    fn window_holds(&self, key: u64, home: usize) -> bool {
        let reach = self.reach(home).load(Ordering::Acquire) as usize;
        (0..=reach).any(|d| {
            self.line(home + d).iter().any(|slot| {
                let (k, s) = unpack(slot.load(Ordering::Acquire));
                k == key && s != FREE
            })
        })
    }

    /// Claims a free slot of `home`'s window for `key` with `state`, the home line's stripe
    /// held; `None` if the window is full.
    fn place(&self, key: u64, h: u64, state: u64, home: usize) -> Option<&AtomicU128> {
        let first = (h >> 62) as usize;
        for d in 0..WINDOW {
            let line = self.line(home + d);
            for i in 0..SLOTS {
                let slot = &line[(first + i) % SLOTS];
                let old = slot.load(Ordering::Acquire);
                if unpack(old).1 != FREE {
                    continue;
                }
                // Raised before the claim: a look-up that sees the key sees the reach.
                self.reach(home).fetch_max(d as u8, Ordering::AcqRel);
                let new = pack(key, state);
                if slot
                    .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Some(slot);
                }
            }
        }
        None
    }

    fn maybe_grow(&self) {
        let t = self.t.load(Ordering::Acquire);
        let under_way = (t << 8) >> 8 != 0;
        // A table that fits a core's L2 is kept at 1/4 full (most keys in the first slot
        // their look-up tries), a larger one at 3/4 (its bytes are the cost then).
        let quarters = if homes(t) < SMALL_LINES { 1 } else { 3 };
        if !under_way && self.len() * 4 <= (homes(t) * SLOTS * quarters) as u64 {
            return;
        }
        if let Some(_g) = self.grow.try_lock() {
            for _ in 0..SPLITS {
                self.split();
            }
        }
    }

    /// Splits the home line the split pointer names, the grow lock held.
    fn split(&self) {
        let t = self.t.load(Ordering::Acquire);
        let (level, p) = (t >> 56, ((t << 8) >> 8) as usize);
        let n = BASE << level;
        let q = p + n;
        if (q + WINDOW).div_ceil(CHUNK) > CHUNKS {
            return; // the directory is full: no more growth
        }
        self.allocate(q + 1 + WINDOW);
        let (sp, sq) = (p % STRIPES, q % STRIPES);
        let _a = self.stripes[sp].lock();
        let _b = (sq != sp).then(|| self.stripes[sq].lock());
        let reach = self.reach(p).load(Ordering::Acquire) as usize;
        for d in 0..=reach {
            for slot in self.line(p + d) {
                let (k, s) = unpack(slot.load(Ordering::Acquire));
                if s == FREE {
                    continue;
                }
                let hk = self.hasher.hash_one(k);
                if hk & (n as u64 - 1) == p as u64 && hk & (2 * n as u64 - 1) == q as u64 {
                    self.relocate(slot, k, hk, s, q);
                }
            }
        }
        let next = if p + 1 == n { (level + 1) << 56 } else { t + 1 };
        self.t.store(next, Ordering::Release);
    }

    /// Copies `key` (state `s` when read) into `q`'s window, then frees its old slot; a state
    /// changed meanwhile is copied again.
    fn relocate(&self, slot: &AtomicU128, key: u64, hk: u64, mut s: u64, q: usize) {
        // The image line is new: its window holds only the overflow of the last few homes.
        let copy = self
            .place(key, hk, s, q)
            .expect("room in a new line's window");
        loop {
            match slot.compare_exchange(
                pack(key, s),
                pack(key, FREE),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(now) => {
                    // Only requests write a live key's slot here (no sweeps): it is still
                    // `key`, updated. The copy is no one else's yet.
                    let (_, newer) = unpack(now);
                    copy.store(pack(key, newer), Ordering::Release);
                    s = newer;
                }
            }
        }
    }

    /// Every live `(key, state)`, for checks.
    pub fn entries(&self) -> Vec<(u64, u64)> {
        let lines = homes(self.t.load(Ordering::Acquire)) + WINDOW;
        (0..lines)
            .flat_map(|i| self.line(i).iter())
            .map(|slot| unpack(slot.load(Ordering::Acquire)))
            .filter(|&(_, s)| s != FREE)
            .collect()
    }
}

/// `f` on the slot's state if it holds `key` live, by CAS; `None` if it does not.
#[inline(always)]
fn try_update<T>(slot: &AtomicU128, key: u64, f: &mut impl FnMut(&mut u64) -> T) -> Option<T> {
    let mut word = slot.load(Ordering::Acquire);
    // A lost race backs off as the stores' loop does (`crate::sync::cas_loop`).
    let backoff = crossbeam_utils::Backoff::new();
    loop {
        let (k, s) = unpack(word);
        if k != key || s == FREE {
            return None;
        }
        let mut new = s;
        let out = f(&mut new);
        if new == s {
            return Some(out);
        }
        match slot.compare_exchange_weak(word, pack(key, new), Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Some(out),
            Err(now) => {
                word = now;
                backoff.spin();
            }
        }
    }
}
