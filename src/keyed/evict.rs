//! The papaya store's sweeps: idle eviction, and capacity eviction that keeps what an evicted
//! key owes (the debt table, `crate::debts`).

use super::{Shared, CAPACITY_SAMPLE};
use crate::algo::Algorithm;
use crate::cell::StateCell;
use crate::clock::Clock;
use crate::limiter::Variant;
use crate::stats::Metrics;
use crate::sweeper::{capacity_pass, evict_by, one_sweep, CapacityCut};
use std::hash::Hash;
use std::time::Instant;

impl<K, A, C, V> Shared<K, A, C, V>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    V: Variant<A>,
{
    pub(crate) fn sweep(&self) -> Metrics {
        let started = Instant::now();
        let now = self.core.sweep_now();
        let guard = self.map.guard();
        let mut report = one_sweep();
        (report.scanned, report.evicted_idle) =
            self.kill_pass(&guard, false, || move |idle_at| idle_at <= now);
        if let Some(max) = self.core.max_keys {
            if self.map.len() > max {
                report.evicted_capacity = capacity_pass(&self.core.pass, &self.core.totals, || {
                    self.evict_capacity(max, &guard)
                });
            }
        }
        report.sweep_busy = started.elapsed();
        self.core.totals.add(&report);
        report.keys = self.map.len() as u64;
        report
    }

    /// One pass over the map killing the cells whose `idle_at` the verdict for that cell
    /// condemns (`verdict` is asked once per cell, so a capacity cut can spread its ties);
    /// the keys looked at and the keys killed. `retain` removes in place as it walks the
    /// table: no second hash and probe per evicted key, as `remove_if` would cost. It may ask
    /// about one key twice if the key changed meanwhile; a cell killed the first time is dead
    /// the second, so it is removed, not counted again.
    ///
    /// `keep`: a capacity pass, whose victims may still owe: each one's debt is kept before
    /// its cell dies.
    fn kill_pass<F: Fn(u64) -> bool>(
        &self,
        guard: &impl papaya::Guard,
        keep: bool,
        mut verdict: impl FnMut() -> F,
    ) -> (u64, u64) {
        let (mut scanned, mut killed) = (0, 0);
        let now = self.core.sweep_now();
        self.map.retain(
            |key, cell| {
                scanned += 1;
                if self.core.signal.stopping() {
                    return true;
                }
                let doomed = verdict();
                let Some(kill) = self.judge(key, cell, |state| {
                    let doomed = doomed(self.core.algo.idle_at(state));
                    if doomed && keep {
                        self.core.keep_debt(|| self.debt_hash(key), state, now);
                    }
                    doomed
                }) else {
                    return false;
                };
                killed += kill as u64;
                !kill
            },
            guard,
        );
        (scanned, killed)
    }

    /// A sweep's verdict on one cell: whether it killed it, or `None` if the cell was already
    /// dead (killed by another pass, or by this one if `retain` asks twice). Either way a cell
    /// that ends dead leaves the map, and each is counted once, by the pass that killed it.
    fn judge(&self, key: &K, cell: &V::Cell, doomed: impl Fn(&A::State) -> bool) -> Option<bool> {
        cell.inspect(|_| ())?;
        let killed = match &self.evicted {
            None => cell.kill_if(doomed),
            Some(hook) => {
                // The state the kill replaced: the last one `doomed` passed (a lost CAS asks
                // again about the word that won).
                let seen = std::cell::RefCell::new(None);
                let killed = cell.kill_if(|state| {
                    let doomed = doomed(state);
                    if doomed {
                        *seen.borrow_mut() = Some(state.clone());
                    }
                    doomed
                });
                if let (true, Some(state)) = (killed, seen.take()) {
                    hook(key, cell, &state);
                }
                killed
            }
        };
        (killed || cell.inspect(|_| ()).is_some()).then_some(killed)
    }

    /// Evicts about `len − 7/8·max` keys, those closest to fresh first: a sampled quantile of
    /// `idle_at` picks the [`CapacityCut`], one pass kills the keys it dooms, keeping what
    /// they owe. Sampled rather than exact so it needs no sort of the whole map and no per-key
    /// recency field (which would cost 8 bytes per key and a write per request); iteration
    /// order is hash order, so the first keys are a uniform sample, and the cut spreads ties
    /// so it stays one. A pass that keys updated meanwhile leave far short is re-cut
    /// ([`evict_by`]). The sample is the only allocation: `CAPACITY_SAMPLE` words, whatever
    /// the map's size.
    pub(super) fn evict_capacity(&self, max: usize, guard: &impl papaya::Guard) -> u64 {
        let target = max - max / 8;
        let len = self.map.len();
        let excess = len.saturating_sub(target) as u64;
        evict_by(
            excess,
            |n| {
                // Its full size at once: one allocation, not a doubling series.
                let mut sample = Vec::with_capacity(CAPACITY_SAMPLE.min(self.map.len()));
                sample.extend(
                    self.map
                        .iter(guard)
                        .filter_map(|(_, cell)| cell.inspect(|state| self.core.algo.idle_at(state)))
                        .take(CAPACITY_SAMPLE),
                );
                CapacityCut::new(&mut sample, n, self.map.len() as u64)
            },
            |cut| self.kill_pass(guard, true, || cut.judge()).1,
        )
    }
}
