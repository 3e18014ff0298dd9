//! Windows, EARRRL and exponential in the hybrid limiter: merged states.
//!
//! Each instance keeps its own traffic's state (the algorithm's own word, in shared time) and
//! publishes it, whole, in a Redis hash per client key (a field per instance); it reads the
//! other instances' published states back and folds them into one word, `others`. A decision
//! runs the algorithm's own step on `merge(own, others)`; when that step counts the request,
//! the own word counts it too. Publishing a whole state, not a delta, makes a retried publish
//! idempotent: a failed or timed-out one is sent again with the newest state, never twice.

use super::{Ctx, Engine, Step as Todo};
use crate::algo::{Earrrl, Exponential, FixedWindow, SlidingWindow, WordStep};
use crate::cell::AtomicWord;
use crate::decision::Decision;
use crate::sync::{cas_loop, CasAtomic, Round};
use crate::Algorithm;
use ::redis::Value;
use parking_lot::Mutex;
use std::fmt::Display;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

/// How one algorithm's states add up across instances. Sealed (private module).
pub trait Merge:
    WordStep<State = Self::Word> + Clone + std::fmt::Debug + Send + Sync + 'static
{
    /// The state word.
    type Word: AtomicWord + Display + FromStr;

    /// The state of the union of two instances' traffic, as of `now` (shared time, ns).
    fn merge(&self, a: Self::Word, b: Self::Word, now: u64) -> Self::Word;

    /// `own` after counting a request of `cost` at `now` (the merged step counted it).
    fn count(&self, own: Self::Word, now: u64, cost: u64) -> Self::Word;

    /// What the other instances are assumed to hold while Redis is unreachable: all of the
    /// quota but `share` of it, so this instance alone admits its share.
    fn degraded(&self, now: u64, share: f64) -> Self::Word;

    /// The decision on the union, and `own` after it if the step counted the request: the
    /// algorithm's own step on the merged state.
    fn decide_merged(
        &self,
        own: Self::Word,
        others: Self::Word,
        now: u64,
        cost: u64,
    ) -> (Decision, Option<Self::Word>) {
        let step = self.step(self.merge(own, others, now), now, cost);
        let counted = step.state.map(|_| self.count(own, now, cost));
        (step.decision, counted)
    }
}

/// The part of the quota the others are assumed to use, in whole units: `limit − ⌊limit·share⌋`.
fn others_part(limit: u64, share: f64) -> u64 {
    limit - ((limit as f64 * share).floor() as u64).min(limit)
}

impl Merge for FixedWindow {
    type Word = u64;

    fn merge(&self, a: u64, b: u64, now: u64) -> u64 {
        let w = self.window().as_nanos() as u64;
        let ((ia, ca), (ib, cb)) = (self.unpack(a), self.unpack(b));
        let index = (now / w).max(ia).max(ib);
        let at = |i, c| if i == index { c } else { 0 };
        self.pack(index, (at(ia, ca) + at(ib, cb)).min(self.limit() + 1))
    }

    fn count(&self, own: u64, now: u64, cost: u64) -> u64 {
        self.merge(
            own,
            self.pack(now / self.window().as_nanos() as u64, cost),
            now,
        )
    }

    fn degraded(&self, now: u64, share: f64) -> u64 {
        let w = self.window().as_nanos() as u64;
        self.pack(now / w, others_part(self.limit(), share))
    }
}

impl Merge for SlidingWindow {
    type Word = u128;

    fn merge(&self, a: u128, b: u128, now: u64) -> u128 {
        let (ia, ib) = (Self::unpack(a).0, Self::unpack(b).0);
        let w = self.window().as_nanos() as u64;
        // Both seen from the later of their windows and now's.
        let at = now.max(ia.max(ib).saturating_mul(w));
        let (va, vb) = (self.view(a, at), self.view(b, at));
        let max = u32::MAX as u64 - 1;
        Self::pack(
            va.index.max(vb.index),
            (va.prev + vb.prev).min(max),
            (va.cur + vb.cur).min(max),
        )
    }

    fn count(&self, own: u128, now: u64, cost: u64) -> u128 {
        let w = self.window().as_nanos() as u64;
        self.merge(own, Self::pack(now / w, 0, cost), now)
    }

    fn degraded(&self, now: u64, share: f64) -> u128 {
        let w = self.window().as_nanos() as u64;
        Self::pack(now / w, 0, others_part(self.limit(), share))
    }
}

impl Merge for Earrrl {
    type Word = u64;

    /// Rates add: `λe^{λ(S−t)} = λe^{λ(Sa−t)} + λe^{λ(Sb−t)}`, so `S` is the log-sum-exp of
    /// the two, exact (no time appears: every impulse decays at the same λ).
    fn merge(&self, a: u64, b: u64, now: u64) -> u64 {
        let lambda = self.redis_params().0;
        let live = |w: u64| self.live(w, now);
        let (sa, sb) = (live(a), live(b));
        let (hi, lo) = if sa >= sb { (sa, sb) } else { (sb, sa) };
        if lo == f64::NEG_INFINITY {
            return hi.to_bits();
        }
        (hi + (lambda * (lo - hi)).exp().ln_1p() / lambda).to_bits()
    }

    fn count(&self, own: u64, now: u64, cost: u64) -> u64 {
        self.counted(own, now, cost)
    }

    /// The allowed case without building the merged state: the union's rate is the sum of
    /// the two (2 `exp`, 1 `ln` instead of 3 and 3); a denial takes the general path, for
    /// its honest `retry_after`.
    fn decide_merged(&self, own: u64, others: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        let (lambda, max_rate, ..) = self.redis_params();
        let live = |w: u64| self.live(w, now);
        let t = now as f64 / 1e9;
        let x = lambda * (live(own) - t);
        let e_own = x.exp();
        let rate = lambda * (e_own + (lambda * (live(others) - t)).exp());
        if rate <= max_rate {
            let d = Decision::allowed().with_rate(rate);
            return (d, Some(self.counted_from(t, x, e_own, cost)));
        }
        let step = self.step(self.merge(own, others, now), now, cost);
        let counted = step.state.map(|_| self.count(own, now, cost));
        (step.decision, counted)
    }

    fn degraded(&self, now: u64, share: f64) -> u64 {
        let (lambda, max_rate, ..) = self.redis_params();
        let rate = max_rate * (1.0 - share);
        if rate <= 0.0 {
            return self.fresh();
        }
        // λe^{λ(S−now)} = rate.
        (now as f64 / 1e9 + (rate / lambda).ln() / lambda).to_bits()
    }
}

impl Merge for Exponential {
    type Word = u128;

    /// The two averages decayed to the later of their times and added.
    fn merge(&self, a: u128, b: u128, _now: u64) -> u128 {
        let p = self.period().as_nanos() as f64;
        let ((ta, ra), (tb, rb)) = (Self::unpack(a), Self::unpack(b));
        if ra == 0.0 {
            return b;
        }
        if rb == 0.0 {
            return a;
        }
        let t = ta.max(tb);
        let decayed = |ti: u64, r: f64| r * (-((t - ti) as f64) / p).exp();
        Self::pack(t, decayed(ta, ra) + decayed(tb, rb))
    }

    fn count(&self, own: u128, now: u64, cost: u64) -> u128 {
        let (t, r) = Self::unpack(own);
        Self::pack(now.max(t), self.r_now(t, r, now, cost as f64))
    }

    fn degraded(&self, now: u64, share: f64) -> u128 {
        Self::pack(now, self.limit() * (1.0 - share).max(0.0))
    }
}

/// One key's merged state.
pub struct Entry<W: AtomicWord> {
    own: W::Atomic,
    others: W::Atomic,
    /// The others' state has been read from Redis at least once.
    known: AtomicBool,
    /// Fields of the hash found idle at the last read: deleted by the next publish.
    stale: Mutex<Vec<String>>,
}

impl<W: AtomicWord + std::fmt::Debug> std::fmt::Debug for Entry<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("own", &self.own.load())
            .field("others", &self.others.load())
            .finish_non_exhaustive()
    }
}

/// What a publish sent: nothing to restore on failure (the next publish sends the newest own
/// state whole).
#[derive(Debug)]
pub struct Sent;

fn store<A: CasAtomic>(atomic: &A, word: A::Word) {
    cas_loop(atomic, || {}, |_| Round::Write(word, ()));
}

impl<A: Merge + Algorithm<State = <A as Merge>::Word>> Engine for A {
    type Entry = Entry<<A as Merge>::Word>;
    type Sent = Sent;

    const SCRIPT: &'static str = super::scripts::PUBLISH;
    /// A hash: never the string key a `RedisLimiter` of the same prefix writes.
    const SUFFIX: &'static str = ":h";
    const EXTRA_KEYS: &'static [&'static str] = &[];

    fn entry(&self) -> Self::Entry {
        Entry {
            own: CasAtomic::new(self.fresh()),
            others: CasAtomic::new(self.fresh()),
            known: AtomicBool::new(false),
            stale: Mutex::new(Vec::new()),
        }
    }

    fn decide(
        &self,
        ctx: &Ctx,
        e: &Self::Entry,
        now: u64,
        cost: u64,
        write: bool,
    ) -> Option<Decision> {
        let now = ctx.shared_now(now);
        // Until the others' states have been read once, or while Redis is away, the fallback
        // stands in for them.
        let down = ctx.is_down() || !e.known.load(Ordering::Acquire);
        let others = if down {
            self.degraded(now, ctx.share())
        } else {
            e.others.load()
        };
        // No other instance holds anything: the union is this instance's own state.
        let alone = others == self.fresh();
        let decision = cas_loop(
            &e.own,
            || {},
            |own| {
                if own == <A as Merge>::Word::TOMBSTONE {
                    return Round::Done(None);
                }
                if alone {
                    let step = self.step(own, now, cost);
                    return match step.state {
                        Some(new) if write => Round::Write(new, Some(step.decision)),
                        _ => Round::Done(Some(step.decision)),
                    };
                }
                match self.decide_merged(own, others, now, cost) {
                    (d, Some(new)) if write => Round::Write(new, Some(d)),
                    (d, _) => Round::Done(Some(d)),
                }
            },
        )?;
        if down && write {
            ctx.stats.degraded.incr();
        }
        Some(decision)
    }

    fn prepare(&self, ctx: &Ctx, e: &Self::Entry, now: u64, _closing: bool) -> Todo<Self::Sent> {
        let now = ctx.shared_now(now);
        let own = e.own.load();
        if own == <A as Merge>::Word::TOMBSTONE {
            return Todo::Skip;
        }
        let idle = self.idle_at(&own);
        let (value, ttl_ms) = if idle <= now {
            (String::new(), 0)
        } else {
            (own.to_string(), (idle - now).div_ceil(1_000_000))
        };
        let mut args = vec![ctx.instance.clone(), value, ttl_ms.to_string()];
        args.append(&mut e.stale.lock());
        Todo::Call(args, Sent)
    }

    fn apply(
        &self,
        ctx: &Ctx,
        e: &Self::Entry,
        reply: Value,
        _sent: Sent,
        local_now: u64,
    ) -> Result<bool, String> {
        let (redis_ns, fields) = parse_publish(reply)?;
        ctx.observe_time(redis_ns, local_now);
        let now = ctx.shared_now(local_now);
        let mut others = self.fresh();
        let mut stale = Vec::new();
        for (field, value) in fields {
            if field == ctx.instance {
                continue;
            }
            let word: <A as Merge>::Word = value
                .parse()
                .map_err(|_| format!("hash field {field}: not a state: {value:?}"))?;
            if self.idle_at(&word) <= now {
                stale.push(field);
            } else {
                others = self.merge(others, word, now);
            }
        }
        store(&e.others, others);
        e.known.store(true, Ordering::Release);
        *e.stale.lock() = stale;
        // Requests queue the key again (each check does, allowed or not).
        Ok(false)
    }

    fn failed(&self, _: &Ctx, _: &Self::Entry, _: Self::Sent) {}

    fn kill(&self, ctx: &Ctx, e: &Self::Entry, local_now: u64) -> bool {
        // Idle for a second at least: a busy key's state is idle for a moment when a window
        // ends, before its next request; sweeping it then would start it over unknown.
        let now = ctx.shared_now(local_now).saturating_sub(1_000_000_000);
        cas_loop(
            &e.own,
            || {},
            |own| {
                if own != <A as Merge>::Word::TOMBSTONE && self.idle_at(&own) <= now {
                    Round::Write(<A as Merge>::Word::TOMBSTONE, true)
                } else {
                    Round::Done(false)
                }
            },
        )
    }
}

/// The publish script's reply: Redis' time (ns since the Unix epoch) and the hash's fields.
fn parse_publish(v: Value) -> Result<(u64, Vec<(String, String)>), String> {
    let items = match v {
        Value::Array(items) => items,
        other => return Err(format!("expected an array, got {other:?}")),
    };
    let mut it = items.into_iter();
    let num = |v: Option<Value>| -> Result<u64, String> {
        ::redis::from_redis_value::<u64>(&v.ok_or("short reply")?).map_err(|e| e.to_string())
    };
    let secs = num(it.next())?;
    let micros = num(it.next())?;
    let flat: Vec<String> = match it.next() {
        Some(v) => ::redis::from_redis_value(&v).map_err(|e| e.to_string())?,
        None => return Err("short reply".into()),
    };
    let fields = flat
        .chunks_exact(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    Ok((secs * 1_000_000_000 + micros * 1_000, fields))
}
