//! GCRA in the hybrid limiter: leases, and the fleet's TAT as this instance knows it.
//!
//! A key's entry is one 128-bit word, updated by the core's CAS loop (so a request, the sync
//! thread and the sweeper each change it whole, and the store's tombstone protocol covers
//! it):
//!
//! | bits | field | |
//! |---|---|---|
//! | 0–63 | `view` | the key's TAT as this instance knows it (local clock, ns): the last pushed shared TAT, plus what this instance admitted beyond its lease since |
//! | 64–95 | `units` | lease units left |
//! | 96–124 | `debt` | units admitted beyond the lease (or, strict, denied) and not yet charged: a call in flight still counts them until its reply |
//! | 125 | `known` | `view` holds a pushed TAT (not only the fallback's own) |
//! | 126 | `back` | the debt includes units admitted while Redis was away: charged back-dated |
//!
//! Bit 127 is never set, so a live word is never the tombstone (all ones).

use super::entry::{HybridCell, Seen};
use super::push::Reader;
use super::{
    Engine, Evicted, Fallback, FleetContext, Heard, Mode, Reason, SyncError, Verdict, Visit,
};
use crate::algo::{Gcra, CLOCK_MAX};
use crate::cell::StateCell;
use crate::decision::{Decision, Policy};
use crate::error::{ConfigError, Field};
use crate::{algo::Algorithm, Rate};
use ::redis::Value;
use std::sync::atomic::Ordering;

const UNITS_MAX: u64 = u32::MAX as u64 - 1;
const DEBT_MAX: u64 = (1 << 29) - 1;
const KNOWN: u128 = 1 << 125;
const BACK: u128 = 1 << 126;

/// A GCRA entry, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    view: u64,
    units: u64,
    debt: u64,
    known: bool,
    back: bool,
}

impl Lease {
    #[inline]
    fn unpack(w: u128) -> Self {
        Lease {
            view: w as u64,
            units: (w >> 64) as u64 & 0xffff_ffff,
            debt: (w >> 96) as u64 & DEBT_MAX,
            known: w & KNOWN != 0,
            back: w & BACK != 0,
        }
    }

    #[inline]
    fn pack(self) -> u128 {
        u128::from(self.view)
            | u128::from(self.units.min(UNITS_MAX)) << 64
            | u128::from(self.debt.min(DEBT_MAX)) << 96
            | if self.known { KNOWN } else { 0 }
            | if self.back { BACK } else { 0 }
    }

    /// Owes `cost` more (admitted beyond the lease, or denied under a strict policy).
    #[inline]
    fn owe(&mut self, cost: u64, mode: Mode) {
        self.debt = self.debt.saturating_add(cost).min(DEBT_MAX);
        if mode == Mode::Degraded {
            self.back = true;
        }
    }
}

/// What GCRA fixes at build from the fallback.
#[derive(Debug)]
pub struct Plan {
    /// The fallback: `share` of the rate, `⌊share × burst⌋` of the burst; `None` for DENY.
    fallback: Option<Gcra>,
    /// Units an instance may admit beyond its lease ahead of Redis: `⌊share × burst⌋`.
    budget: u64,
}

/// The sync thread's bookkeeping of a key it watches.
#[derive(Debug, Default)]
pub struct KeyBook {
    /// `units` as the last round left it: what was spent since is the difference.
    level: u64,
    /// Units spent while the last call was in flight.
    carry: u64,
    /// Demand per round, smoothed (units).
    demand: f64,
    /// Rounds between rounds with demand, smoothed: how sparse the key is.
    gap: f64,
    /// Rounds in a row without demand.
    quiet: u32,
}

/// What one key's call carries: the debt it charges (still in the entry until the reply),
/// the units it asks for and those it hands back.
#[derive(Debug)]
pub struct Sent {
    debt: u64,
    want: u64,
    give: u64,
    /// The key's quota (units granted to a key gone meanwhile are handed back in its T).
    quota: u32,
}

/// `share` of `g`: the rate and `burst` units (`burst ≥ 1`).
fn shared_part(g: &Gcra, share: f64, burst: u64) -> Option<Gcra> {
    Gcra::new(Rate::new(share, g.emission_interval()).ok()?)
        .ok()?
        .with_burst(burst)
        .ok()
        .map(|f| f.with_policy(g.policy()))
}

impl Engine for Gcra {
    type Word = u128;
    type Plan = Plan;
    type KeyBook = KeyBook;
    type Sent = Sent;
    type Pushed = u64;

    const SCRIPT: &'static str = super::super::lua::HYBRID_LEASE;
    const SUFFIX: &'static str = "";
    const EXTRA_KEYS: &'static [&'static str] = &[":b"];

    fn plan(&self, fallback: Fallback) -> Result<Plan, ConfigError> {
        if self.capacity() > DEBT_MAX {
            return Err(ConfigError::TooLarge {
                field: Field::Burst,
                value: self.capacity().to_string(),
                max: "2^29 - 1 units in the hybrid limiter (count in larger units)",
            });
        }
        let budget = fallback.part(self.capacity())?;
        let fallback = if budget == 0 {
            None
        } else {
            Some(shared_part(self, fallback.local_share(), budget).ok_or(
                ConfigError::TooSmall {
                    field: Field::Share,
                    value: fallback.local_share().to_string(),
                    min: "a share whose part of the rate the clock can count",
                },
            )?)
        };
        Ok(Plan { fallback, budget })
    }

    fn unknown(&self) -> u128 {
        0
    }

    #[inline]
    fn decide_entry(
        &self,
        plan: &Plan,
        ctx: &FleetContext,
        w: &mut u128,
        // A lease's own `known` bit says it is stale (cleared by `forget`); its debt is what
        // the others have not heard of, against the fallback's budget.
        _seen: Seen,
        now: u64,
        cost: u64,
        // GCRA's take is its update: a lease's units come back whole.
        _take: bool,
    ) -> Verdict {
        let mut l = Lease::unpack(*w);
        if l.units >= cost {
            l.units -= cost;
            *w = l.pack();
            return Verdict {
                decision: Decision::allowed().with_remaining(l.units),
                reason: Reason::Lease,
                sync: true,
                urgent: false,
                unheard: 0,
            };
        }
        let strict = self.policy() == Policy::Strict;
        // A view the fallback moved (or one forgotten) is not the fleet's: such a key stays on
        // the fallback until a push or its round's reply makes it known. (Found as a flake: a
        // round answered mid-burst found no live marker, and "every unknown key is fresh" took
        // the fallback's spent view for the fleet's, denying on it under the whole quota.)
        let mode = match ctx.mode(l.known, now, self.tolerance()) {
            Mode::Known if !l.known && l.view != 0 => Mode::Unknown,
            mode => mode,
        };
        let verdict = if mode == Mode::Known {
            // Beyond the lease: the fleet's TAT as known must have room, and this instance
            // may be at most its budget ahead of Redis. (A key the limiter has not heard of
            // is known once it is current: fresh, a view like any other from then on.)
            l.known = true;
            let step = Gcra::decide(self, l.view, now, cost);
            let fits = l.debt.saturating_add(cost) <= plan.budget;
            // Whether the step's state is taken (the view moves, the units are owed): always,
            // but for a request the fleet has room for and the budget has not, which waits
            // for the next tick (and counts only under the strict policy).
            let (take, verdict) = match step.state {
                Some(_) if step.decision.is_allowed() && !fits => (
                    strict,
                    Verdict {
                        decision: Decision::denied_ns(ctx.until_tick(now)).with_remaining(0),
                        reason: Reason::Waiting,
                        sync: true,
                        urgent: false,
                        unheard: 0,
                    },
                ),
                _ => (
                    true,
                    Verdict {
                        decision: step.decision,
                        reason: Reason::Known,
                        sync: true,
                        urgent: false,
                        unheard: 0,
                    },
                ),
            };
            if let (true, Some(tat)) = (take, step.state) {
                l.view = tat;
                l.owe(cost, mode);
            }
            verdict
        } else {
            // The fleet's TAT unknown, or Redis away: the fallback's share, continuing from
            // the view as last known.
            match &plan.fallback {
                None => Verdict {
                    decision: Decision::denied_ns(ctx.until_tick(now)).with_remaining(0),
                    reason: Reason::Waiting,
                    sync: true,
                    urgent: false,
                    unheard: 0,
                },
                Some(fallback) => {
                    let step = fallback.decide(l.view, now, cost);
                    if let Some(tat) = step.state {
                        l.view = tat;
                        l.owe(cost, mode);
                        // A fallback's view: the next push replaces it.
                        l.known = false;
                    }
                    Verdict {
                        decision: step.decision,
                        reason: Reason::Fallback,
                        sync: true,
                        urgent: false,
                        unheard: 0,
                    }
                }
            }
        };
        *w = l.pack();
        verdict
    }

    /// Through the lease. A refund's units were reserved in the shared TAT (spent from a
    /// lease) or are owed to it (admitted beyond one): either way they are this instance's
    /// to spend again, so they return to the lease, and go back to the fleet when the key goes
    /// quiet. An overrun is spent from the lease as far as it holds, and the rest is a debt
    /// charged to the shared TAT at the next round (the known view moves on past the burst,
    /// as the in-memory GCRA's settle does).
    fn settle_entry(
        &self,
        ctx: &FleetContext,
        w: &mut u128,
        now: u64,
        _taken_at: u64,
        charged: u64,
        actual: u64,
        _wait: bool,
    ) -> bool {
        let mut l = Lease::unpack(*w);
        if actual < charged {
            l.units = l.units.saturating_add(charged - actual).min(UNITS_MAX);
        } else {
            let over = actual - charged;
            let spent = over.min(l.units);
            l.units -= spent;
            let rest = over - spent;
            if rest > 0 {
                Gcra::settle(self, &mut l.view, now, now, 0, rest);
                l.owe(rest, ctx.mode(l.known, now, self.tolerance()));
            }
        }
        *w = l.pack();
        // A lease is in units, not stamped: no timeline to wait for.
        true
    }

    fn entry_idle_at(&self, _: &FleetContext, w: &u128) -> u64 {
        let l = Lease::unpack(*w);
        if l.units > 0 || l.debt > 0 {
            CLOCK_MAX
        } else {
            l.view
        }
    }

    fn horizon(&self) -> u64 {
        self.tolerance()
    }

    fn forget(&self, w: &mut u128) {
        *w &= !KNOWN;
    }

    fn prepare(
        &self,
        plan: &Plan,
        ctx: &FleetContext,
        cell: &HybridCell<u128>,
        book: &mut KeyBook,
        now: u64,
        closing: bool,
    ) -> Visit<Sent> {
        let denied = cell.take_pending();
        // The debt is sent but stays in the word until the reply charges it (`apply`): while
        // the call is out, what this instance admits beyond its lease still counts it, so it
        // is never more than its budget ahead of Redis however long the round trip takes.
        let Some(l) = cell.inspect(|w| Lease::unpack(*w)) else {
            return Visit::Skip;
        };
        let spent = book.level.saturating_sub(l.units) + std::mem::take(&mut book.carry);
        let demand = spent + denied + l.debt;
        book.demand = 0.5 * book.demand + 0.5 * demand as f64;
        if demand > 0 {
            book.gap = 0.5 * book.gap + 0.5 * f64::from(book.quiet + 1);
            book.quiet = 0;
        } else {
            book.quiet = book.quiet.saturating_add(1);
        }
        // Quiet: no demand for three of the key's usual gaps (2 to 100 rounds). A quiet key
        // (or a closing limiter) hands its lease back: quota it does not use is quota
        // another instance may need.
        let quiet = f64::from(book.quiet) >= (3.0 * book.gap).clamp(2.0, 100.0);
        let give_all = closing || quiet;
        let want = if give_all || 2.0 * book.demand <= plan.budget as f64 {
            // Quiet, or a demand the budget beyond the lease covers (a sparse key: no lease;
            // under DENY, whose budget is 0, a key with any recent demand holds one).
            0
        } else {
            // About two rounds of demand, at most the burst.
            ((2.0 * book.demand).ceil() as u64)
                .clamp(1, self.capacity())
                .saturating_sub(l.units)
        };
        let mut give = 0;
        if want > 0 || (give_all && l.units > 0) {
            // The units handed back leave the view, the units asked for enter it now: what
            // this instance admits beyond its lease while the call is out must not count on
            // room the lease is about to take. The call's own push then replaces the view
            // with what Redis granted.
            let t = self.emission_interval().as_nanos() as u64;
            give = cell
                .update(&ctx.cas, |w| {
                    let mut l = Lease::unpack(*w);
                    let give = if give_all { l.units } else { 0 };
                    l.units -= give;
                    if l.known {
                        l.view = l
                            .view
                            .saturating_sub(give.saturating_mul(t))
                            .max(now)
                            .saturating_add(want.saturating_mul(t))
                            .min(CLOCK_MAX);
                    }
                    *w = l.pack();
                    give
                })
                .unwrap_or(0);
        }
        let units = l.units.saturating_sub(give);
        book.level = units;
        if want == 0 && give == 0 && l.debt == 0 && l.known {
            // Nothing to ask; watch the key while it holds a lease, to hand it back when
            // quiet.
            return if units > 0 { Visit::Keep } else { Visit::Skip };
        }
        Visit::Call(
            self.call_args(ctx, want, give, l.debt, l.back),
            Sent {
                debt: l.debt,
                want,
                give,
                quota: cell.quota(),
            },
        )
    }

    fn apply(
        &self,
        ctx: &FleetContext,
        key: &str,
        cell: Option<&HybridCell<u128>>,
        book: &mut KeyBook,
        reply: Value,
        sent: Sent,
        now: u64,
    ) -> Result<bool, SyncError> {
        let (granted, tat_us): (u64, f64) =
            ::redis::from_redis_value(&reply).map_err(|_| SyncError::Malformed("lease reply"))?;
        let granted = granted.min(sent.want);
        let tat = ctx.local((tat_us * 1e3) as u64);
        let st = &ctx.stats;
        st.leased.fetch_add(granted, Ordering::Relaxed);
        st.charged.fetch_add(sent.debt, Ordering::Relaxed);
        st.returned.fetch_add(sent.give, Ordering::Relaxed);
        let t = self.emission_interval().as_nanos() as u64;
        let before = cell.and_then(|c| {
            c.update(&ctx.cas, |w| {
                let mut l = Lease::unpack(*w);
                let before = l.units;
                l.units = (l.units + granted).min(UNITS_MAX);
                // The charged debt leaves the entry; what was admitted beyond the lease while
                // the call was out stays owed. It is back-dated only if it was run up while
                // Redis was away: the outage flag holds for the whole round (the sync thread
                // sets it after the round), so it says how every one of those was decided.
                l.debt = l.debt.saturating_sub(sent.debt);
                l.back = l.back && l.debt > 0 && ctx.is_down();
                // Redis' TAT after this call is the newest this instance can know: it
                // replaces the view (the units asked for and not granted leave it, those
                // handed back too), with what was admitted beyond the lease since on top.
                // Pushes published before it may arrive after it: they are merged by max.
                l.view = tat
                    .max(now)
                    .saturating_add(l.debt.saturating_mul(t))
                    .min(CLOCK_MAX);
                l.known = true;
                *w = l.pack();
                before
            })
        });
        let Some(before) = before else {
            // The key left the store meanwhile: the units go back. (An entry owing a debt is
            // never idle, so only a capacity eviction takes one while its call is out; that
            // eviction handed back the whole debt, this call's charge with it: charged twice,
            // erring strict.)
            if granted > 0 {
                ctx.evicted.lock().push(Evicted {
                    key: key.to_owned(),
                    quota: sent.quota,
                    units: granted,
                    debt: 0,
                    back: false,
                });
            }
            return Ok(false);
        };
        // What was spent while the call was in flight is demand too.
        book.carry += book.level.saturating_sub(before);
        book.level = before + granted;
        Ok(book.level > 0)
    }

    /// The call did not reach Redis, or its answer did not come back: the debt is still in
    /// the entry, owed at the next round (if the call did run, it is charged twice: errs
    /// strict), or, if the entry was evicted meanwhile, in what its eviction handed back.
    /// Units it handed back are not taken again, whether or not Redis got them (errs strict
    /// too).
    fn failed(&self, ctx: &FleetContext, _key: &str, cell: Option<&HybridCell<u128>>, sent: Sent) {
        if sent.want == 0 {
            return;
        }
        let t = self.emission_interval().as_nanos() as u64;
        if let Some(c) = cell {
            c.update(&ctx.cas, |w| {
                let mut l = Lease::unpack(*w);
                if l.known {
                    // The units asked for were not granted: they leave the view again.
                    l.view = l.view.saturating_sub(sent.want.saturating_mul(t));
                }
                *w = l.pack();
            });
        }
    }

    fn evicted(&self, ctx: &FleetContext, key: &str, quota: u32, w: &u128) {
        let l = Lease::unpack(*w);
        if l.units > 0 || l.debt > 0 {
            ctx.hand_back_later(Evicted {
                key: key.to_owned(),
                quota,
                units: l.units,
                debt: l.debt,
                back: l.back,
            });
        }
    }

    /// No lease asked: the units and the debt returned.
    fn hand_back(&self, ctx: &FleetContext, e: &Evicted) -> Vec<String> {
        self.call_args(ctx, 0, e.units, e.debt, e.back)
    }

    fn read_push(
        &self,
        ctx: &FleetContext,
        _key: &str,
        r: &mut Reader<'_>,
        _now: u64,
    ) -> Result<u64, SyncError> {
        let tat_us: f64 = r.parse().ok_or(SyncError::Malformed("pushed TAT"))?;
        Ok(ctx.local((tat_us * 1e3) as u64))
    }

    fn push_is_idle(&self, _: &FleetContext, tat: &u64, now: u64) -> bool {
        *tat <= now
    }

    /// Nothing else: a lease's state is Redis' TAT, not a field of this instance's, and its
    /// debt is what the others have not heard of.
    fn apply_push(&self, _: &FleetContext, w: &mut u128, tat: &u64, _own: bool, now: u64) -> Heard {
        let mut l = Lease::unpack(*w);
        // The pushed TAT counts every charge and lease Redis had; what this instance admitted
        // since its last call (its debt) goes on top.
        let t = self.emission_interval().as_nanos() as u64;
        let base = (*tat).max(now).saturating_add(l.debt.saturating_mul(t));
        // A push may lack this instance's last charge (its call ran first) while the view
        // lacks the others' latest: keep the larger (this instance's own call's reply
        // replaces the view: see `apply`). A view from the fallback is replaced.
        l.view = if l.known { l.view.max(base) } else { base }.min(CLOCK_MAX);
        l.known = true;
        *w = l.pack();
        Heard::default()
    }
}

impl Gcra {
    /// A key's arguments in the lease script: `want` units asked, `give` handed back, `debt`
    /// charged (back-dated if `back`).
    fn call_args(
        &self,
        ctx: &FleetContext,
        want: u64,
        give: u64,
        debt: u64,
        back: bool,
    ) -> Vec<String> {
        // Back-dated to the outage's start: every instance's outage debt is counted from
        // there, whatever the order the charges reach Redis in, so the fleet's excess over the
        // outage (if any) is what holds the TAT back. (Each charge back-dated to when its own
        // admissions began would put a late, small one ahead of the others' large ones.)
        let since_us = if back {
            ctx.shared_now(ctx.down_since.load(Ordering::Relaxed)) / 1_000
        } else {
            0
        };
        vec![
            want.to_string(),
            give.to_string(),
            debt.to_string(),
            u8::from(back).to_string(),
            since_us.to_string(),
            // The key's quota: keys of one batch may run under different ones.
            format!("{:.17e}", self.emission_interval().as_nanos() as f64 / 1e3),
            format!("{:.17e}", self.tolerance() as f64 / 1e3),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_packs_every_field_and_is_never_the_tombstone() {
        let l = Lease {
            view: u64::MAX,
            units: UNITS_MAX,
            debt: DEBT_MAX,
            known: true,
            back: true,
        };
        assert_eq!(Lease::unpack(l.pack()), l);
        assert_ne!(l.pack(), u128::MAX);
        let small = Lease {
            view: 7,
            units: 3,
            debt: 2,
            known: false,
            back: true,
        };
        assert_eq!(Lease::unpack(small.pack()), small);
    }

    // Pins G51.
    #[test]
    fn a_fallback_view_stays_on_the_fallback_once_unknown_keys_are_fresh() {
        const S: u64 = 1_000_000_000;
        let g = "8/h burst 8".parse::<Gcra>().unwrap();
        let plan = g.plan(Fallback::share(0.25).unwrap()).unwrap();
        let ctx = FleetContext::new(5_000_000, 0.25, 0, 0);
        // Subscribed, the fleet's states not yet known: the fallback's share, 2 of 8.
        ctx.mirror_since.store(0, Ordering::Relaxed);
        let mut w = g.unknown();
        let mut step = |now| g.decide_entry(&plan, &ctx, &mut w, Seen::default(), now, 1, false);
        let before: Vec<_> = (0..2).map(|i| step(S + i).reason).collect();
        assert_eq!(before, [Reason::Fallback; 2]);
        // A round finds no live marker: a key never seen is fresh for the fleet now, but this
        // one's view is the fallback's. It waits on the fallback, as it did.
        ctx.mirror_clear.store(true, Ordering::Relaxed);
        let after = step(S + 2);
        assert!(!after.decision.is_allowed());
        assert_eq!(after.reason, Reason::Fallback);
        // A key never seen is decided as the fleet's, fresh.
        let mut fresh = g.unknown();
        let v = g.decide_entry(&plan, &ctx, &mut fresh, Seen::default(), S + 3, 1, false);
        assert_eq!((v.reason, v.decision.is_allowed()), (Reason::Known, true));
    }
}

/// A loom model of a GCRA entry's protocol: requests spending a lease and admitting beyond
/// it, the sync thread sending the debt and handing the lease back (as a closing limiter does)
/// and then applying Redis' reply, which takes the charged debt out of the entry,
/// and the store's sweeper killing the entry once idle (handing back what the dead word held,
/// as its eviction hook does), all on the real cell and steps; a one-slot map (a loom mutex
/// around the key's current cell) stands in for papaya, as in `src/loom.rs`. Whatever the
/// interleaving, no unit is lost or counted twice: every leased unit is spent, handed back or
/// still held, every unit admitted beyond the lease is owed exactly once.
///
/// `RUSTFLAGS="--cfg hotlimit_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --lib
/// --features redis loom`.
#[cfg(all(test, hotlimit_loom))]
mod loom_model {
    use super::*;
    use crate::cell::StateCell;
    use crate::stats::Stats;
    use loom::sync::{Arc, Mutex};
    use loom::thread;

    type Cell = Arc<HybridCell<u128>>;

    const NOW: u64 = 1_000_000_000;

    /// The key's entry in the map, and every cell it ever held.
    struct MapEntry(Mutex<(Option<Cell>, Vec<Cell>)>);

    impl MapEntry {
        fn get_or_insert(&self, fresh: u128) -> Cell {
            let mut slot = self.0.lock().unwrap();
            if let Some(c) = &slot.0 {
                return c.clone();
            }
            let c: Cell = Arc::new(StateCell::new(fresh));
            slot.0 = Some(c.clone());
            slot.1.push(c.clone());
            c
        }

        fn get(&self) -> Option<Cell> {
            self.0.lock().unwrap().0.clone()
        }

        fn remove_if_same(&self, cell: &Cell) {
            let mut slot = self.0.lock().unwrap();
            if slot.0.as_ref().is_some_and(|c| Arc::ptr_eq(c, cell)) {
                slot.0 = None;
            }
        }
    }

    /// A request: the limiter's `decide` (a dead cell is removed and the key looked up
    /// again). Its reason if allowed.
    fn check(
        slot: &MapEntry,
        g: &Gcra,
        plan: &Plan,
        ctx: &FleetContext,
        stats: &Stats,
    ) -> Option<Reason> {
        loop {
            let cell = slot.get_or_insert(g.unknown());
            match cell.update(stats, |w| {
                g.decide_entry(plan, ctx, w, Seen::default(), NOW, 1, false)
            }) {
                Some(v) => return v.decision.is_allowed().then_some(v.reason),
                None => slot.remove_if_same(&cell),
            }
        }
    }

    // Pins G46.
    #[test]
    fn loom_hybrid_lease_vs_sync_vs_sweep() {
        loom::model(|| {
            // 1/h, burst 4, half of it beyond the lease: nothing refills during the model.
            let g = "1/h burst 4".parse::<Gcra>().unwrap();
            let plan = g.plan(Fallback::share(0.5).unwrap()).unwrap();
            let mut ctx = FleetContext::new(10_000_000, 0.5, 0, 0);
            ctx.mirror_since = 0.into(); // current: the key's fleet state is known
            ctx.mirror_clear = true.into();
            let (ctx, stats) = (Arc::new(ctx), Arc::new(Stats::default()));
            let _ = plan;
            // A lease of 2 units; the view otherwise idle, so the entry is idle once they are
            // spent or handed back.
            let lease = Lease {
                view: 0,
                units: 2,
                debt: 0,
                known: true,
                back: false,
            };
            let slot = Arc::new(MapEntry(Mutex::new((None, Vec::new()))));
            slot.get_or_insert(lease.pack());
            let requests = {
                let (slot, ctx, stats) = (slot.clone(), ctx.clone(), stats.clone());
                thread::spawn(move || {
                    let plan = g.plan(Fallback::share(0.5).unwrap()).unwrap();
                    (0..3)
                        .filter_map(|_| check(&slot, &g, &plan, &ctx, &stats))
                        .collect::<Vec<_>>()
                })
            };
            let sync = {
                let (slot, ctx) = (slot.clone(), ctx.clone());
                thread::spawn(move || {
                    let plan = g.plan(Fallback::share(0.5).unwrap()).unwrap();
                    // Swept already: the hook handed everything back.
                    let Some(cell) = slot.get() else {
                        return (0, 0);
                    };
                    let mut book = KeyBook::default();
                    match g.prepare(&plan, &ctx, &cell, &mut book, NOW, true) {
                        Visit::Call(args, sent) => {
                            let taken = (args[1].parse::<u64>().unwrap(), sent.debt);
                            // Redis charged the debt and granted nothing (none asked): the
                            // reply takes the charged debt out of the entry, if it is live.
                            let reply = Value::Array(vec![Value::Int(0), Value::Int(0)]);
                            g.apply(&ctx, "k", Some(&cell), &mut book, reply, sent, NOW)
                                .unwrap();
                            taken
                        }
                        _ => (0, 0),
                    }
                })
            };
            let sweep = {
                let (slot, ctx) = (slot.clone(), ctx.clone());
                thread::spawn(move || {
                    // `Shared::judge`: the state the kill replaced goes to the hook.
                    let Some(cell) = slot.get() else {
                        return (0, 0);
                    };
                    let seen = std::cell::Cell::new(None);
                    let killed = cell.kill_if(|w| {
                        let idle = g.entry_idle_at(&ctx, w) <= NOW;
                        if idle {
                            seen.set(Some(*w));
                        }
                        idle
                    });
                    if !killed {
                        return (0, 0);
                    }
                    slot.remove_if_same(&cell);
                    let l = Lease::unpack(seen.get().unwrap());
                    (l.units, l.debt)
                })
            };
            let allowed = requests.join().unwrap();
            let (given, taken) = sync.join().unwrap();
            let (evicted_units, evicted_debt) = sweep.join().unwrap();
            let cells = slot.0.lock().unwrap().1.clone();
            let (left_units, left_debt) = cells
                .iter()
                .filter_map(|c| c.inspect(|w| Lease::unpack(*w)))
                .fold((0, 0), |(u, d), l| (u + l.units, d + l.debt));
            let spent = allowed.iter().filter(|&&r| r == Reason::Lease).count() as u64;
            let beyond = allowed.iter().filter(|&&r| r == Reason::Known).count() as u64;
            assert_eq!(spent + given + evicted_units + left_units, 2, "{allowed:?}");
            assert_eq!(taken + evicted_debt + left_debt, beyond, "{allowed:?}");
            // Each request admitted from the lease, or beyond it within the budget of 2: all
            // three, unless both units were handed back before any was spent (then two).
            let want = if spent == 0 && given == 2 { 2 } else { 3 };
            assert_eq!(allowed.len(), want, "{allowed:?}");
        });
    }
}
