//! The compact table's growth: linear hashing, one home line split at a time into its image
//! while a level is under way, under the table's `grow` lock and both lines' stripes.

use super::{homes_of, level_and_split, Table, SMALL_LINES, SPLITS};
use crate::algo::Algorithm;
use crate::clock::Clock;
use crate::compact::key::CompactKey;
use crate::compact::slot::TableSlot;
use crate::limiter::Variant;
use std::cell::Cell;
use std::sync::atomic::Ordering;

impl<K, A, C, V> Table<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// After an insert: splits lines while a level is under way, or starts one once the
    /// table is past its fill (1/4 while it is small, 3/4 after), unless another thread is
    /// growing it already (inserts never wait for growth).
    // Under loom `SMALL_LINES` is 0, so its comparison is constant there.
    #[cfg_attr(hotlimit_loom, allow(clippy::absurd_extreme_comparisons))]
    pub(super) fn maybe_grow(&self) {
        let t = self.t();
        let homes = homes_of(t, self.base);
        let under_way = level_and_split(t).1 != 0;
        let quarters = if homes < SMALL_LINES { 1 } else { 3 };
        let full = self.len() > homes * quarters;
        if !(under_way || full) || homes >= self.max_homes {
            return;
        }
        if let Some(_grow) = self.grow.try_write() {
            self.split_some();
        }
    }

    /// Splits up to `SPLITS` lines, `grow` held, stopping where a level ends; `false` if the
    /// table may not grow (at `max_homes`, or memory for its next chunk refused).
    pub(super) fn split_some(&self) -> bool {
        for i in 0..SPLITS {
            if !self.split() {
                return i > 0;
            }
            // The next level starts only once the table is past its fill again. Run on into
            // it, a level whose lines are not a multiple of `SPLITS` (a bounded table's odd
            // `base`) would leave the next under way, every insert splitting, level after
            // level: a table bounded to 1M keys held 40,004 lines at 10,000 keys.
            if level_and_split(self.t()).1 == 0 {
                break;
            }
        }
        true
    }

    /// Splits the home line the split pointer names, `grow` held: linear hashing. Its keys
    /// whose home becomes its image line `p + n` (one more bit of their hash) move there, each
    /// killed in its old slot (its state taken by the kill's CAS, so no update is lost) and
    /// claimed in the image's window; its keys that stay but sit past it come back into the
    /// room that leaves, and its reach falls to the farthest left; then `t` moves on. All
    /// under the stripes of both lines: a request that misses the key meanwhile goes to the
    /// insert path, waits on the stripe, and finds the key where `t` then says it is. `grow`
    /// keeps sweeps, capacity passes and window evictions (whose kills would race the move)
    /// out. `false` if the table may not grow.
    fn split(&self) -> bool {
        let t = self.t();
        let (level, p) = level_and_split(t);
        let p = p as usize;
        let n = self.base << level;
        let q = p + n;
        if q >= self.max_homes || self.allocate(q + self.window).is_err() {
            return false;
        }
        let (sp, sq) = (p % self.stripes.len(), q % self.stripes.len());
        let _p = self.stripes[sp].lock();
        let _q = (sq != sp).then(|| self.stripes[sq].lock());
        let reach = self.reach(p).load(Ordering::Acquire) as usize;
        for d in 0..=reach {
            for slot in &self.line(p, d).0 {
                let Some(repr) = slot.inspect(|repr, _| repr) else {
                    continue;
                };
                let (fp, home) = self.place(repr);
                if home != p {
                    continue; // another home's key
                }
                let to_image = ((fp >> 1) >> level) & 1 == 1;
                // A key that stays moves only to come home: one that overflowed while its
                // line held twice the mean load (a line not yet split, late in a level),
                // into the room its image keys just left. Left where it was, it would cost
                // every look-up of it a second line for good (at 1M keys, 10% of keys).
                if !to_image && (d == 0 || !self.at(p).0.iter().any(|s| s.looks_free())) {
                    continue;
                }
                let taken = Cell::new(None);
                let killed = slot.kill_if(|k, state| {
                    let ours = k == repr;
                    if ours {
                        taken.set(Some(state.clone()));
                    }
                    ours
                });
                let Some(state) = taken.into_inner().filter(|_| killed) else {
                    continue; // freed meanwhile: nothing to move
                };
                self.move_to(repr, fp, if to_image { q } else { p }, state);
            }
        }
        let next = if p + 1 == n { (level + 1) << 56 } else { t + 1 };
        self.t.store(next, Ordering::Release);
        // After `t` moves on, so that the keys moved to the image no longer count as `p`'s
        // (its window may reach the image in a small table); both stripes are still held.
        self.lower_reach_of(p);
        true
    }

    /// Claims a slot of `q`'s window for a key a split moves there with `state`; a full
    /// window (rare: a new line's window holds only the overflow of the last homes) first
    /// gives up its key closest to fresh, as an insert's would.
    #[cold]
    fn move_to(&self, repr: K::Repr, fp: u64, q: usize, state: A::State) {
        loop {
            if self.place_in(repr, fp, q, || state.clone()).is_some() {
                return;
            }
            self.evict_in_window(q);
        }
    }
}
