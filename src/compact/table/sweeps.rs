//! The compact table's walks: idle sweeps, capacity passes (shared out in chunks of slots),
//! the reach lowered after them, and the probe statistics. Each holds the table's `grow` lock
//! while it walks, so no split moves a key under it.

use super::{ProbeStats, SharedPass, SlotOf, Table, SAMPLE, SLOTS_PER_LINE};
use crate::algo::Algorithm;
use crate::clock::Clock;
use crate::compact::key::CompactKey;
use crate::compact::slot::TableSlot;
use crate::limiter::Variant;
use crate::stats::Metrics;
use crate::sweeper::{capacity_pass, evict_by, one_sweep, CapacityCut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The slots an idle sweep walks between two moments it lets a waiting split in.
const WALK_SLOTS: usize = 64 * SLOTS_PER_LINE;

impl<K, A, C, V> Table<K, A, C, V>
where
    K: CompactKey,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    /// Every slot that may hold a key now, `grow` held.
    fn slots(&self) -> impl Iterator<Item = &SlotOf<K, A, V>> {
        (0..self.lines()).flat_map(|i| self.at(i).0.iter())
    }

    pub(crate) fn sweep(&self) -> Metrics {
        let started = Instant::now();
        let now = self.core.sweep_now();
        let mut report = one_sweep();
        {
            let mut grow = self.grow.read();
            for (i, slot) in self.slots().enumerate() {
                if self.core.signal.stopping() {
                    break;
                }
                // Let a split that waits in, every few lines: a new key whose window is full
                // grows the table then, not after the whole walk (it waits `SPLIT_WAIT` at
                // most, then evicts beside the walk). A key a split moves meanwhile may be
                // passed over, or met twice: an idle key passed over goes at the next sweep.
                if i % WALK_SLOTS == WALK_SLOTS - 1 {
                    drop(grow);
                    grow = self.grow.read();
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
        }
        // `grow` released: the pass gate is taken before it, never after.
        if self.len() > self.max_keys {
            report.evicted_capacity = capacity_pass(&self.core.pass, &self.core.totals, || {
                let _grow = self.grow.read();
                self.evict_capacity()
            });
        }
        {
            let _grow = self.grow.read();
            self.lower_reach();
        }
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
    /// sample is the only allocation, whatever the table's size. `grow` held.
    pub(super) fn evict_capacity(&self) -> u64 {
        let target = self.max_keys - self.max_keys / 8;
        let excess = self.len().saturating_sub(target) as u64;
        let now = self.core.sweep_now();
        let slots = self.lines() * SLOTS_PER_LINE;
        evict_by(
            excess,
            |n| {
                let step = (slots / SAMPLE).max(1);
                // Its full size at once: one allocation, not a doubling series.
                let mut sample = Vec::with_capacity(slots.div_ceil(step));
                sample.extend((0..slots).step_by(step).filter_map(|i| {
                    self.slot(i)
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
                    slots,
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
    pub(super) fn help_pass(&self) {
        let pass = self.pass_in_flight.lock().clone();
        if let Some(pass) = pass {
            self.work_on(&pass);
        }
    }

    /// Kills the keys `pass` dooms, a chunk of slots at a time, until every chunk is taken.
    /// Its owner holds `grow` until every chunk taken is done, so no split runs beside.
    fn work_on(&self, pass: &SharedPass) {
        const CHUNK: usize = 4096;
        // Counted busy before taking a chunk, so the pass waits for every chunk taken.
        pass.busy.fetch_add(1, Ordering::SeqCst);
        loop {
            let start = pass.cursor.fetch_add(CHUNK, Ordering::SeqCst);
            if start >= pass.slots || self.core.signal.stopping() {
                break;
            }
            let mut evicted = 0;
            let run = pass.cut.run((start / CHUNK) as u64);
            for i in start..(start + CHUNK).min(pass.slots) {
                let slot = self.slot(i);
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
    /// passed, or a split has moved keys away. Under the line's stripe lock, the one every
    /// insert of its keys takes: no key of it moves meanwhile, and a look-up that read the old
    /// reach and misses goes on to that lock and looks again. `grow` held. A walk of the
    /// reaches, no allocation.
    pub(super) fn lower_reach(&self) {
        for home in 0..self.homes() {
            if self.reach(home).load(Ordering::Acquire) == 0 || self.core.signal.stopping() {
                continue;
            }
            let _stripe = self.stripes[home % self.stripes.len()].lock();
            self.lower_reach_of(home);
        }
    }

    /// Lowers `home`'s reach to the farthest line one of its keys sits in, `home`'s stripe
    /// held (see `lower_reach`).
    pub(super) fn lower_reach_of(&self, home: usize) {
        let reach = self.reach(home).load(Ordering::Acquire) as usize;
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
            self.reach(home).store(farthest as u8, Ordering::Release);
        }
    }

    pub(crate) fn probe_stats(&self) -> ProbeStats {
        let _grow = self.grow.read();
        let lines = self.lines();
        let mut stats = ProbeStats {
            lines: lines as u64,
            slots: (lines * SLOTS_PER_LINE) as u64,
            window: self.window as u64,
            ..ProbeStats::default()
        };
        let (mut total, mut home_hits) = (0u64, 0u64);
        for i in 0..lines {
            for slot in &self.at(i).0 {
                let Some(repr) = slot.inspect(|repr, _| repr) else {
                    continue;
                };
                let d = i - self.place(repr).1;
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
        stats.max_reach = (0..self.homes())
            .map(|home| u64::from(self.reach(home).load(Ordering::Relaxed)))
            .max()
            .unwrap_or(0);
        stats
    }
}
