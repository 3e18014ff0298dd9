//! GCRA in the hybrid limiter: leases.
//!
//! An instance holds, per key, a lease of units reserved in the shared GCRA state (the
//! script advances the shared TAT by every unit it grants) and spends it by CAS. Every sync
//! interval it renews the lease to about two intervals of the key's recent demand, hands back
//! what a quiet key holds, and charges the units it admitted without a lease (the fallback:
//! a key's first requests, an outage) and, under [`Policy::Strict`], the units it denied.

use super::{Ctx, Engine, Step as Todo};
use crate::algo::{Gcra, WordStep};
use crate::decision::{Decision, Policy};
use crate::sync::{cas_loop, Round};
use crate::sync::{AtomicU64, Ordering};
use crate::{Algorithm, Rate};
use ::redis::Value;
use parking_lot::Mutex;
use std::sync::atomic::{fence, AtomicBool};

/// A dead entry's lease word: the sweeper removed it; a request looks the key up again.
const DEAD: u64 = u64::MAX;

/// One key's lease.
#[derive(Debug)]
pub struct Entry {
    /// Units leased and not spent; [`DEAD`] once swept.
    units: AtomicU64,
    /// Units denied since the last sync: demand the lease did not cover.
    denied: AtomicU64,
    /// Units admitted without a lease (or denied under a strict policy), not yet charged.
    debt: AtomicU64,
    /// The same, admitted while Redis was unreachable: charged back-dated (see `LEASE`).
    back: AtomicU64,
    /// Local time of the oldest uncharged `back` unit (`u64::MAX`: none).
    back_since: AtomicU64,
    /// A lease reply has arrived: from then on an empty lease means "no quota now", not
    /// "not asked yet".
    synced: AtomicBool,
    /// Local time before which Redis has no unit to lease (its last `wait`).
    next_at: AtomicU64,
    /// The fallback's own GCRA state (local clock).
    fallback: AtomicU64,
    /// The sync thread's bookkeeping.
    book: Mutex<Book>,
}

impl Entry {
    /// Owes `cost` units admitted (or, strict, denied) without a lease at `now`: back-dated
    /// if Redis is unreachable, else charged as of the next sync.
    fn owe(&self, ctx: &Ctx, now: u64, cost: u64) {
        if ctx.is_down() {
            self.back_since.fetch_min(now, Ordering::Relaxed);
            self.back.fetch_add(cost, Ordering::SeqCst);
        } else {
            self.debt.fetch_add(cost, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
    }
}

#[derive(Debug, Default)]
struct Book {
    /// `units` as the last sync left it: what was spent since is the difference.
    level: u64,
    /// Units spent while the last call was in flight (between its `prepare` and `apply`).
    carry: u64,
    /// Demand per interval, smoothed (units).
    demand: f64,
    /// Intervals between intervals with demand, smoothed: how sparse the key is.
    gap: f64,
    /// Intervals in a row without demand.
    quiet: u32,
    /// Local time of the last interval with demand: a key is swept only a second after.
    last_demand: u64,
}

/// What one lease call charged, to owe again if it fails.
#[derive(Debug)]
pub struct Sent {
    debt: u64,
    back: u64,
    since: u64,
}

/// The fallback GCRA: `share` of the rate and of the burst (at least 1).
fn fallback_gcra(g: &Gcra, share: f64) -> Option<Gcra> {
    let t = g.emission_interval();
    let burst = ((g.burst() as f64 * share).floor() as u64).max(1);
    Gcra::new(Rate::new(share, t).ok()?)
        .ok()?
        .with_burst(burst)
        .ok()
        .map(|f| f.with_policy(g.policy()))
}

impl Engine for Gcra {
    type Entry = Entry;
    type Sent = Sent;

    const SCRIPT: &'static str = super::scripts::LEASE;
    const SUFFIX: &'static str = "";
    const EXTRA_KEYS: &'static [&'static str] = &[":b"];

    fn lease_fallback(&self, share: f64) -> Option<Gcra> {
        fallback_gcra(self, share)
    }

    fn entry(&self) -> Entry {
        Entry {
            units: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            debt: AtomicU64::new(0),
            back: AtomicU64::new(0),
            back_since: AtomicU64::new(u64::MAX),
            synced: AtomicBool::new(false),
            next_at: AtomicU64::new(0),
            fallback: AtomicU64::new(self.fresh()),
            book: Mutex::new(Book::default()),
        }
    }

    fn decide(&self, ctx: &Ctx, e: &Entry, now: u64, cost: u64, write: bool) -> Option<Decision> {
        let spent = cas_loop(
            &e.units,
            || {},
            |units| {
                if units == DEAD {
                    Round::Done(None)
                } else if units < cost {
                    Round::Done(Some(None))
                } else if !write {
                    Round::Done(Some(Some(units)))
                } else {
                    Round::Write(units - cost, Some(Some(units - cost)))
                }
            },
        )?;
        if let Some(left) = spent {
            return Some(Decision::allowed().with_remaining(left));
        }
        // The lease does not cover it. Until Redis has answered for this key, or while it is
        // unreachable, the fallback decides; otherwise Redis has no unit for us right now.
        if ctx.is_down() || !e.synced.load(Ordering::Acquire) {
            let Some(fallback) = ctx.fallback_gcra.as_ref() else {
                if write {
                    e.denied.fetch_add(cost, Ordering::Relaxed);
                }
                return Some(Decision::denied(ctx.until_tick(now)).with_remaining(0));
            };
            let d = cas_loop(
                &e.fallback,
                || {},
                |tat| {
                    let step = fallback.step(tat, now, cost);
                    match step.state {
                        Some(new) if write => Round::Write(new, step.decision),
                        _ => Round::Done(step.decision),
                    }
                },
            );
            if write && (d.is_allowed() || self.policy() == Policy::Strict) {
                e.owe(ctx, now, cost);
                // The sweeper tombstones the lease, then looks at the debt: either it sees
                // this debt (and keeps the key) or this sees the tombstone (and the request
                // is decided again on the live entry: this one was counted nowhere).
                if e.units.load(Ordering::SeqCst) == DEAD {
                    return None;
                }
            }
            if write {
                ctx.stats.degraded.incr();
                if d.is_denied() {
                    e.denied.fetch_add(cost, Ordering::Relaxed);
                }
            }
            return Some(d);
        }
        if write {
            e.denied.fetch_add(cost, Ordering::Relaxed);
            if self.policy() == Policy::Strict {
                e.owe(ctx, now, cost);
                if e.units.load(Ordering::SeqCst) == DEAD {
                    return None;
                }
            }
        }
        let hint = e.next_at.load(Ordering::Relaxed).saturating_sub(now);
        Some(Decision::denied(hint.max(ctx.until_tick(now))).with_remaining(0))
    }

    fn prepare(&self, ctx: &Ctx, e: &Entry, now: u64, closing: bool) -> Todo<Sent> {
        let level = e.units.load(Ordering::Acquire);
        if level == DEAD {
            return Todo::Skip;
        }
        let mut book = e.book.lock();
        let spent = book.level.saturating_sub(level) + std::mem::take(&mut book.carry);
        let denied = e.denied.swap(0, Ordering::Relaxed);
        let demand = spent + denied;
        book.demand = 0.5 * book.demand + 0.5 * demand as f64;
        if demand > 0 {
            book.gap = 0.5 * book.gap + 0.5 * f64::from(book.quiet + 1);
            book.quiet = 0;
            book.last_demand = now;
        } else {
            book.quiet = book.quiet.saturating_add(1);
        }
        // Quiet: no demand for three of the key's usual gaps (2 to 100 intervals). A quiet
        // key (or a closing limiter) hands its lease back: quota it does not use is quota
        // another instance may need. A sparse key keeps its unit between its requests.
        let quiet = f64::from(book.quiet) >= (3.0 * book.gap).clamp(2.0, 100.0);
        let give = if closing || (quiet && level > 0) {
            e.units.swap(0, Ordering::AcqRel)
        } else {
            0
        };
        let level = level - give.min(level);
        book.level = level;
        let want = if closing || quiet {
            0
        } else {
            // About two intervals of demand, at least this interval's and one unit, at most
            // the burst: renewed before it runs out.
            let target = ((2.0 * book.demand).ceil() as u64)
                .max(demand)
                .clamp(1, self.burst());
            target.saturating_sub(level)
        };
        let debt = e.debt.swap(0, Ordering::Relaxed);
        let back = e.back.swap(0, Ordering::Relaxed);
        let since = e.back_since.swap(u64::MAX, Ordering::Relaxed);
        if want == 0 && give == 0 && debt == 0 && back == 0 {
            // Nothing to ask; watch the key while it holds a lease, to hand it back when quiet.
            return if level > 0 { Todo::Keep } else { Todo::Skip };
        }
        let t = self.emission_interval().as_nanos() as f64 / 1e3;
        let tau = self.tolerance() as f64 / 1e3;
        // The back-dated debt's first request, in Redis' time (µs).
        let since_us = if back > 0 {
            ctx.shared_now(since.min(now)) / 1_000
        } else {
            0
        };
        let args = vec![
            format!("{t:.17e}"),
            format!("{tau:.17e}"),
            want.to_string(),
            give.to_string(),
            debt.to_string(),
            back.to_string(),
            since_us.to_string(),
        ];
        ctx.stats.returned.fetch_add(give, Ordering::Relaxed);
        Todo::Call(args, Sent { debt, back, since })
    }

    fn apply(
        &self,
        ctx: &Ctx,
        e: &Entry,
        reply: Value,
        sent: Sent,
        now: u64,
    ) -> Result<bool, String> {
        let (granted, wait_us, redis_us) = parse_lease(reply)?;
        ctx.observe_time((redis_us * 1e3) as u64, now);
        let before = e.units.fetch_add(granted, Ordering::AcqRel);
        let mut book = e.book.lock();
        // What was spent since `prepare` is demand too (a call can take most of an interval).
        book.carry += book.level.saturating_sub(before);
        book.level = before + granted;
        drop(book);
        e.next_at.store(
            now.saturating_add((wait_us * 1e3).ceil() as u64),
            Ordering::Relaxed,
        );
        e.synced.store(true, Ordering::Release);
        ctx.stats.leased.fetch_add(granted, Ordering::Relaxed);
        ctx.stats
            .charged
            .fetch_add(sent.debt + sent.back, Ordering::Relaxed);
        Ok(before + granted > 0)
    }

    /// The call did not reach Redis, or its answer did not come back: the debt stays owed
    /// (if the call did run, it is charged twice: errs strict). Units it handed back are not
    /// taken again, whether or not Redis got them (errs strict too).
    fn failed(&self, _: &Ctx, e: &Entry, sent: Sent) {
        e.debt.fetch_add(sent.debt, Ordering::Relaxed);
        if sent.back > 0 {
            e.back_since.fetch_min(sent.since, Ordering::Relaxed);
            e.back.fetch_add(sent.back, Ordering::Relaxed);
        }
    }

    fn kill(&self, _: &Ctx, e: &Entry, now: u64) -> bool {
        // A busy key's lease runs dry between syncs: swept only a second after its last
        // demand, so its next request does not start over from the fallback.
        if now.saturating_sub(e.book.lock().last_demand) < 1_000_000_000 {
            return false;
        }
        let idle = |e: &Entry| {
            e.debt.load(Ordering::SeqCst) == 0
                && e.back.load(Ordering::SeqCst) == 0
                && self.idle_at(&e.fallback.load(Ordering::SeqCst)) <= now
        };
        if !idle(e) {
            return false;
        }
        let killed = cas_loop(
            &e.units,
            || {},
            |units| {
                if units == 0 {
                    Round::Write(DEAD, true)
                } else {
                    Round::Done(false)
                }
            },
        );
        if !killed {
            return false;
        }
        // Tombstone, fence, look at the debt; a request adds its debt, fences, looks at the
        // lease (`owe`): one of the two sees the other's write. A request that passed the
        // lease before the tombstone may have spent the fallback meanwhile: then the key
        // lives on (requests that saw the tombstone wait for this).
        fence(Ordering::SeqCst);
        if !idle(e) {
            e.units.store(0, Ordering::SeqCst);
            return false;
        }
        true
    }
}

/// `{granted, wait (µs), now (µs)}`.
fn parse_lease(v: Value) -> Result<(u64, f64, f64), String> {
    let (granted, wait, now): (u64, String, String) =
        ::redis::from_redis_value(&v).map_err(|e| e.to_string())?;
    let num = |s: &str| s.parse::<f64>().map_err(|_| format!("lease reply {s:?}"));
    Ok((granted, num(&wait)?, num(&now)?))
}
