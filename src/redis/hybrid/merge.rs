//! Windows, EARRRL and exponential in the hybrid limiter: merged states.
//!
//! Each instance keeps its own traffic's state (the algorithm's own word, in shared time) and
//! publishes it, whole, in a Redis hash per client key (a field per instance); the script
//! pushes the whole hash to every instance, which folds the other instances' states into one
//! word, `others`. A decision runs the algorithm's own step on `merge(own, others)`; when that
//! step counts the request, the own word counts it too. Publishing a whole state, not a delta,
//! makes a retried publish idempotent: a failed or timed-out one is sent again with the newest
//! state, never twice. A key's entry is `(own, others)`: one 128-bit word (fixed window,
//! EARRRL) or a [`Pair`](super::entry::Pair) of them behind the core's per-key lock (sliding
//! window, exponential). Each algorithm's [`Merge`]: `merge/algos.rs` (the counts),
//! `merge/rates.rs` (the decaying rates).

use super::entry::{Halves, HybridCell, Seen};
use super::push::Reader;
use super::{Engine, Fallback, FleetContext, Heard, Mode, Reason, SyncError, Verdict, Visit};
use crate::algo::Algorithm;
use crate::algo::WordStep;
use crate::cell::StateCell;
use crate::cell::StateCells;
use crate::decision::Decision;
use crate::decision::Policy;
use crate::error::ConfigError;
use ::redis::Value;
use std::fmt::{Debug, Display};
use std::str::FromStr;

mod algos;
mod rates;

/// How one algorithm's states add up across instances. Sealed (private module), so its
/// crate-private supertrait bounds nothing a user can implement.
#[allow(private_bounds)]
pub trait Merge:
    WordStep<State = Self::Word> + Clone + PartialEq + Debug + Send + Sync + 'static
{
    /// The state word.
    type Word: Copy + Eq + Debug + Display + FromStr + Send + Sync;
    /// A key's entry: the own word and the others'.
    type Entry: Halves<Half = Self::Word> + StateCells + Debug;
    /// `others` while nothing is known of them: a word the algorithm never stores.
    const UNKNOWN: Self::Word;

    /// How long a state can stay live without a write: see [`Engine::horizon`].
    fn horizon(&self) -> u64;

    /// The units a fallback share is a part of (a share that rounds to none of them is a
    /// configuration error): the capacity, for the algorithms that count units.
    fn fallback_units(&self) -> u64 {
        self.capacity()
    }

    /// `word` as of `now` if it is stamped in a later window than `now`'s: its counts kept,
    /// in `now`'s window. An instance decides by its own clock until Redis' time is known
    /// (a cold start), so its states can be stamped ahead of the fleet's time by its clock's
    /// error; taken as they are, the merged state's window is the latest, which drops every
    /// other instance's count of the current one (a fleet whose clocks were ±2 s apart
    /// admitted 1.3–1.9× one exact limiter's windows). Counted now, the requests behind them
    /// (all in the past) are counted at most early, never lost.
    fn pull_back(&self, word: Self::Word, _now: u64) -> Self::Word {
        word
    }

    /// `word`, stamped on a shared timeline that turned out to be `delta` ns behind Redis'
    /// (an instance decides by its own clock until it first hears Redis' time: a cold start),
    /// re-stamped on Redis' timeline: a window's counts into the latest window their requests
    /// may have fallen in (counted late, never early: never lost to a window that is over),
    /// a rate's time moved by `delta`.
    fn shift(&self, word: Self::Word, delta: i64) -> Self::Word;

    /// Whether at `now` (shared; `local` the same instant on the local clock) Redis came back
    /// from an outage within the current window, and too recently for every instance to have
    /// published again (`FleetContext::recover_for`).
    fn recovering(&self, ctx: &FleetContext, local: u64, now: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let up = ctx.up_since.load(Relaxed);
        up != 0
            && up <= local
            && local - up < ctx.recover_for.load(Relaxed)
            && self.one_window(ctx.shared_now(up), now)
    }

    /// Whether shared times `a` and `b` fall in one window (false where there are none): see
    /// [`recovering`](Merge::recovering).
    fn one_window(&self, _a: u64, _b: u64) -> bool {
        false
    }

    /// The others' state once a push brings `pushed` where `known` was heard (neither
    /// unknown, not equal). What the others held never drops by a push, only by time: a hash
    /// emptied under the fleet (a `FLUSHALL`, Redis restarted empty) lacks the instances that
    /// have not published since, and its push, taken as their state, handed back what they had
    /// taken (a flush's sliding window 1.2-1.3x its limit). Joined as debts are (at least as
    /// limiting as both), as it was heard and as it is pushed; each pulled back first into the
    /// current window (a state stamped ahead by a clock not yet set by Redis' would, as the
    /// later window, win the join with its few counts and drop the current window's: a cold
    /// start's sliding window 1.4x its limit).
    fn heard(&self, known: Self::Word, pushed: Self::Word, now: u64) -> Self::Word {
        let (known, pushed) = (self.pull_back(known, now), self.pull_back(pushed, now));
        let new = self.debt(&pushed, 0);
        match self.debt_join(0, self.debt(&known, 0), new) {
            d if d == new => pushed,
            d => self.restore(&|_| d),
        }
    }

    /// The state of the union of two instances' traffic, as of `now` (shared time, ns).
    fn merge(&self, a: Self::Word, b: Self::Word, now: u64) -> Self::Word;

    /// `own` after counting a request of `cost` at `now` (the merged step counted it).
    fn count(&self, own: Self::Word, now: u64, cost: u64) -> Self::Word;

    /// What the other instances are assumed to hold while their states are not heard (Redis
    /// unreachable, or the key not heard of yet), beside `known`, their states as last heard
    /// (fresh if never): what they held then, and all of what the quota had left but `share`
    /// of it, so this instance alone admits its share of what was left. With nothing known
    /// that is its share of the whole quota; mid-window, not of the whole quota: then the
    /// others' shares came on top of what one had taken before (a window up to
    /// `(N − 1)·⌊share·limit⌋` over).
    fn degraded(&self, known: Self::Word, now: u64, share: f64) -> Self::Word;

    /// Whether this instance's admissions the others have not heard of are held to its
    /// share of what the fleet has left ([`Engine::decide_entry`] of merged states says why):
    /// the windows', EARRRL's and the exponential limiter's; GCRA's budget beyond its lease
    /// is the same rule, and the in-flight permits are not admissions over time.
    fn caps_unheard(&self) -> bool {
        false
    }

    /// The units `own` counts beyond `heard` (this instance's state as a push held it) as of
    /// `now` (a window's: in now's window; a rate's: decayed to now): where
    /// [`caps_unheard`](Merge::caps_unheard).
    fn unheard(&self, _own: Self::Word, _heard: Self::Word, _now: u64) -> u64 {
        0
    }

    /// The units the union had left before an admitted request of `cost` that `decision`
    /// (on the union) admitted: what [`caps_unheard`](Merge::caps_unheard) shares out. A
    /// count's: what remains after it and its cost.
    fn left_before(&self, decision: &Decision, cost: u64) -> u64 {
        decision.remaining().unwrap_or(0).saturating_add(cost)
    }

    /// Whether an admitted request's `decision` (on the union) leaves the key so close to its
    /// limit that the others should hear of it at once: a quarter of the limit left or less,
    /// for the algorithms that count it (for the rates: see their implementations).
    fn near_limit(&self, decision: &Decision) -> bool {
        decision
            .remaining()
            .is_some_and(|left| left.saturating_mul(4) <= self.capacity())
    }

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

    /// The own word after an admitted take that [`decide_merged`](Merge::decide_merged)
    /// counted as `counted` (from `own`): what the algorithm's settle can hand back
    /// ([`Algorithm::take`]). By default what a decision counts.
    fn count_take(&self, own: Self::Word, counted: Self::Word, now: u64, cost: u64) -> Self::Word {
        let _ = (own, now, cost);
        counted
    }
}

/// A published state: `<idle_at, Unix ms>:<state word>`, so the script can drop the fields of
/// instances whose state went idle without knowing the algorithm.
fn field_value<A: Merge>(a: &A, own: A::Word, now: u64) -> Option<(String, u64)> {
    let idle = a.idle_at(&own);
    (idle > now).then(|| {
        let ms = idle.div_ceil(1_000_000);
        (format!("{ms}:{own}"), (idle - now).div_ceil(1_000_000))
    })
}

impl<A> Engine for A
where
    A: Merge + Algorithm<State = <A as Merge>::Word>,
    <A::Entry as Halves>::Half: Eq,
{
    type Word = A::Entry;
    /// The fallback's share.
    type Plan = f64;
    type KeyBook = ();
    type Sent = ();
    /// The others' states, merged, and what the hash held of this instance.
    type Pushed = (<A as Merge>::Word, Option<<A as Merge>::Word>);

    const SCRIPT: &'static str = super::super::lua::HYBRID_PUBLISH;
    /// A hash: never the string key a `RedisLimiter` of the same prefix writes.
    const SUFFIX: &'static str = ":h";
    const EXTRA_KEYS: &'static [&'static str] = &[];

    fn plan(&self, fallback: Fallback) -> Result<f64, ConfigError> {
        fallback.part(self.fallback_units())?;
        Ok(fallback.local_share())
    }

    fn unknown(&self) -> A::Entry {
        A::Entry::join(self.fresh(), A::UNKNOWN)
    }

    /// On the union of this instance's own state and the others' as heard. While another
    /// instance is heard to hold anything of the window, a window's admissions the others
    /// have not heard of ([`Seen::unheard`]: its count beyond its field in the key's last
    /// push) are held to `⌈share × left⌉`, its share of what the union has left (more,
    /// once, where none are unheard: a request that fits is never refused for its size).
    /// Each instance admitting unheard what it saw left, the windows went over their limit
    /// by what the others admitted within one lag (under 20 ms ± 10 of latency, 1.4–1.6×);
    /// held to shares of what is left, the instances together take about what the union had
    /// left when they last heard each other. GCRA's budget beyond its lease is the same
    /// rule.
    #[inline]
    fn decide_entry(
        &self,
        share: &f64,
        ctx: &FleetContext,
        w: &mut A::Entry,
        seen: Seen,
        local: u64,
        cost: u64,
        take: bool,
    ) -> Verdict {
        let stale = seen.stale;
        let (stored, others) = w.split();
        let Some(now) = ctx.settled_now(local) else {
            // The states are being re-stamped on Redis' timeline (its time first heard):
            // this one may be on either, so nothing is read or written until it is done.
            return Verdict {
                decision: Decision::denied_ns(ctx.until_tick(local)).with_remaining(0),
                reason: Reason::Waiting,
                sync: false,
                urgent: false,
                unheard: 0,
            };
        };
        // Re-stamped for good (and published): counted again in its own window later, a
        // state stamped ahead would deny what the fleet's time allows then.
        let own = self.pull_back(stored, now);
        // Heard before a gap in the subscription, the others' state is no longer theirs
        // (they may have admitted since, unheard), only a floor of it.
        let known = others != A::UNKNOWN && !stale;
        let mode = match ctx.mode(known, local, Merge::horizon(self)) {
            // A round unanswered for long: the others' states as heard are getting old.
            Mode::Known if ctx.waiting(local) => Mode::Degraded,
            // Just after Redis came back (within the window and `recover_for`): every instance
            // decided alone, and each publishes what it counted only once it reconnects (up
            // to `reconnect_after` apart), so the hashes lack the ones not back yet; on them
            // each instance took what the others' missing counts left (a restart: a window
            // 1.27x its limit). By the fallback beside what is heard, it is within the limit
            // whatever is missing. (To the window's end, the second after admitted 82%.)
            Mode::Known if self.recovering(ctx, local, now) => Mode::Degraded,
            mode => mode,
        };
        // A denial for want of the fleet's state while Redis is up, counted as the policy
        // counts a denial, as its exact twin counts it: left out, a late joiner's first strict
        // denials held EARRRL's union low, and a slow crossing of its limit came 0.06-0.12 s
        // late (that second 1.12-1.26x the twin's).
        let count_denial = |w: &mut A::Entry| {
            if self.policy() == Policy::Strict {
                *w = A::Entry::join(self.count(own, now, cost), others);
            }
        };
        if mode != Mode::Known && *share == 0.0 {
            // `Fallback::DENY`: nothing decided without the fleet's state. (Standing in for the
            // others as holding the whole limit is not enough: EARRRL's union would then sit at
            // exactly its limit, which admits, once per key per idle period.)
            if mode == Mode::Unknown {
                count_denial(w);
            }
            return Verdict {
                decision: Decision::denied_ns(ctx.until_tick(local)).with_remaining(0),
                reason: Reason::Fallback,
                sync: mode == Mode::Unknown,
                urgent: false,
                unheard: 0,
            };
        }
        if mode == Mode::Unknown && self.idle_at(&own) > now && !ctx.answered() {
            // Before this instance's first round is answered, a key's first request is the
            // fallback's and the next wait for that round (its push brings the fleet's
            // state). Deciding them all by the fallback admitted a joiner's whole share in
            // the burst before its first round, on top of what the others had taken (a late
            // joiner's window 1.25-1.3x its limit). After it, a key not heard of is the
            // fallback's: a subscription that cannot be made must not deny it for good.
            count_denial(w);
            return Verdict {
                decision: Decision::denied_ns(ctx.until_tick(local)).with_remaining(0),
                reason: Reason::Waiting,
                sync: true,
                urgent: false,
                unheard: 0,
            };
        }
        let view = match mode {
            Mode::Known if others == A::UNKNOWN => self.fresh(),
            // Current, or stale with every change of a horizon heard since subscribing: then
            // no one has written the key since, and what they held is all they hold.
            Mode::Known => others,
            // The fallback stands in for the others: beside what they held when last heard,
            // if they were (before a gap too: what they held then, they hold still).
            _ if others != A::UNKNOWN => self.degraded(others, now, *share),
            Mode::Unknown | Mode::Degraded => self.degraded(self.fresh(), now, *share),
        };
        let (decision, counted) = if view == self.fresh() {
            // No other instance holds anything: the union is this instance's own state.
            if take {
                let mut after = own;
                let decision = Algorithm::take(self, &mut after, now, cost);
                (decision, (after != own).then_some(after))
            } else {
                let step = self.step(own, now, cost);
                (step.decision, step.state)
            }
        } else {
            let (decision, counted) = self.decide_merged(own, view, now, cost);
            let counted = match counted {
                Some(c) if take && decision.is_allowed() => {
                    Some(self.count_take(own, c, now, cost))
                }
                counted => counted,
            };
            (decision, counted)
        };
        let caps = self.caps_unheard() && *share > 0.0;
        if caps && mode == Mode::Known && view != self.fresh() && seen.unheard > 0 {
            // What the union had left before this request: its share of it at most unheard.
            let left = self.left_before(&decision, cost);
            let most = (left as f64 * share).ceil() as u64;
            if decision.is_allowed() && seen.unheard.saturating_add(cost) > most {
                // A denial, counted as the policy counts denials: under `Strict`, what the
                // admission would have counted (else a key held back counted less than its
                // exact twin, and was admitted more: EARRRL's paced key 3x).
                if self.policy() == Policy::Strict {
                    if let Some(c) = counted {
                        *w = A::Entry::join(c, others);
                    }
                }
                return Verdict {
                    decision: Decision::denied_ns(ctx.until_tick(local)).with_remaining(0),
                    reason: Reason::Waiting,
                    // Published now: its own push back, the count is heard.
                    sync: true,
                    urgent: true,
                    unheard: 0,
                };
            }
        }
        let after = counted.unwrap_or(own);
        if after != stored {
            *w = A::Entry::join(after, others);
        }
        Verdict {
            decision,
            reason: if mode == Mode::Known {
                Reason::Known
            } else {
                Reason::Fallback
            },
            // Publish what changed; and ask for a key whose fleet state is unknown (the
            // publish's push brings it).
            sync: counted.is_some() || own != stored || mode == Mode::Unknown,
            // Counted with little of the limit left: the others hear it in the next round,
            // not a sync interval on (what they admit unheard meanwhile is what a window goes
            // over its limit by: a healthy fleet's fixed window 1.08-1.10x at a 10 ms interval).
            // Admitted only: a denial (counted under the strict policy) admits nothing the
            // others could overshoot on, and on a key held at its limit it is every request.
            urgent: counted.is_some() && decision.is_allowed() && self.near_limit(&decision),
            unheard: match counted {
                Some(_) if caps && decision.is_allowed() => cost,
                _ => 0,
            },
        }
    }

    /// The instance's own state settles as in memory, on Redis' timeline; the next round
    /// publishes it. With `wait`, not while the states are being re-stamped (see
    /// `decide_entry`).
    fn settle_entry(
        &self,
        ctx: &FleetContext,
        w: &mut A::Entry,
        now: u64,
        taken_at: u64,
        charged: u64,
        actual: u64,
        wait: bool,
    ) -> bool {
        let settled = ctx.settled_now(now);
        let Some(shared) = settled.or((!wait).then(|| ctx.shared_now(now))) else {
            return false;
        };
        // Both on the one offset read: `taken_at` is a local time, as `now` is.
        let taken_at = shared.saturating_sub(now.saturating_sub(taken_at));
        let (mut own, others) = w.split();
        self.settle(&mut own, shared, taken_at, charged, actual);
        *w = A::Entry::join(own, others);
        true
    }

    fn entry_idle_at(&self, ctx: &FleetContext, w: &A::Entry) -> u64 {
        let (own, others) = w.split();
        let idle = self.idle_at(&own);
        let idle = if others == A::UNKNOWN {
            idle
        } else {
            idle.max(self.idle_at(&others))
        };
        ctx.local(idle)
    }

    fn horizon(&self) -> u64 {
        Merge::horizon(self)
    }

    /// Nothing: the others' state stays, as a floor (the cell is marked stale).
    fn forget(&self, _: &mut A::Entry) {}

    /// The own state only: the others' come from Redis, stamped on its time.
    fn restamp(&self, w: &mut A::Entry, delta: i64) {
        let (own, others) = w.split();
        *w = A::Entry::join(self.shift(own, delta), others);
    }

    /// Part 0: the own state's debt; part 1: the others' (none while unknown). Each is the
    /// algorithm's own debt word, so each half restores at least as limited as it was: the
    /// own state never publishes less than this instance counted (the others would lose
    /// it: a publish overwrites this instance's field), and the merged view never holds
    /// less than the fleet's as last heard, until the next push replaces it.
    fn entry_debt_parts(&self) -> usize {
        2
    }

    fn entry_debt(&self, w: &A::Entry, part: usize) -> u128 {
        let (own, others) = w.split();
        match part {
            0 => self.debt(&own, 0),
            _ if others == A::UNKNOWN => 0,
            _ => self.debt(&others, 0),
        }
    }

    fn entry_debt_join(&self, _: usize, a: u128, b: u128) -> u128 {
        self.debt_join(0, a, b)
    }

    fn entry_debt_paid_at(&self, _: usize, debt: u128) -> u64 {
        self.debt_paid_at(0, debt)
    }

    fn entry_restore(&self, debt: &dyn Fn(usize) -> u128) -> A::Entry {
        let own = self.restore(&|_| debt(0));
        let others = match debt(1) {
            0 => A::UNKNOWN,
            d => self.restore(&|_| d),
        };
        A::Entry::join(own, others)
    }

    fn prepare(
        &self,
        _: &f64,
        ctx: &FleetContext,
        cell: &HybridCell<A::Entry>,
        _: &mut (),
        local: u64,
        _closing: bool,
    ) -> Visit<()> {
        cell.take_pending();
        let Some(own) = cell.inspect(|w| w.split().0) else {
            return Visit::Skip;
        };
        // An idle state deletes this instance's field.
        let (value, ttl_ms) =
            field_value(self, own, ctx.shared_now(local)).unwrap_or((String::new(), 0));
        Visit::Call(vec![value, ttl_ms.to_string()], ())
    }

    fn apply(
        &self,
        _: &FleetContext,
        _: &str,
        _: Option<&HybridCell<A::Entry>>,
        _: &mut (),
        _: Value,
        _: (),
        _: u64,
    ) -> Result<bool, SyncError> {
        // The others' states come by the push; requests queue the key again.
        Ok(false)
    }

    /// Nothing to restore: the next publish sends the newest state whole.
    fn failed(&self, _: &FleetContext, _: &str, _: Option<&HybridCell<A::Entry>>, _: ()) {}

    /// Nothing to hand back: the last published state stays in the hash until it idles; what
    /// was counted since (less than one round) is forgotten with the key.
    fn evicted(&self, _: &FleetContext, _: &str, _: u32, _: &A::Entry) {}

    /// Never called: nothing is queued by `evicted`.
    fn hand_back(&self, _: &FleetContext, _: &super::Evicted) -> Vec<String> {
        Vec::new()
    }

    fn read_push(
        &self,
        ctx: &FleetContext,
        key: &str,
        r: &mut Reader<'_>,
        local: u64,
    ) -> Result<Self::Pushed, SyncError> {
        let now = ctx.shared_now(local);
        let n: usize = r.parse().ok_or(SyncError::Malformed("pushed hash"))?;
        let (mut others, mut mine) = (self.fresh(), None);
        // Every field is read, also after a foreign one: the next key's entry follows.
        let mut foreign = None;
        for _ in 0..n {
            let (field, value) = (r.text(), r.text());
            let (Some(field), Some(value)) = (field, value) else {
                return Err(SyncError::Malformed("pushed hash"));
            };
            if field == ctx.instance {
                // Its own state as the others have it (an idle one is as good as none).
                mine = Some(
                    value
                        .split_once(':')
                        .and_then(|(_, w)| w.parse::<<A as Merge>::Word>().ok())
                        .unwrap_or_else(|| self.fresh()),
                );
                continue;
            }
            match value
                .split_once(':')
                .and_then(|(_, w)| w.parse::<<A as Merge>::Word>().ok())
            {
                Some(word) if self.idle_at(&word) > now => others = self.merge(others, word, now),
                Some(_) => {}
                None => foreign = Some(value),
            }
        }
        if let Some(found) = foreign {
            return Err(SyncError::ForeignState {
                key: key.to_owned(),
                found: found.to_owned(),
            });
        }
        Ok((others, mine))
    }

    fn push_is_idle(&self, _: &FleetContext, (others, _): &Self::Pushed, _: u64) -> bool {
        *others == self.fresh()
    }

    /// A hash that lacks this instance's field while its own state is live was emptied
    /// under the fleet (a `FLUSHALL`, Redis restarted empty): every instance that finds
    /// itself missing publishes again, so that the hash is whole within a round. (An
    /// instance held at its limit publishes nothing of its own accord: its count stayed out
    /// of the hash for the rest of the window, and an instance that joined then admitted it
    /// again.)
    ///
    /// The others have the push too: what this instance counts beyond its field in it (all
    /// of its count, where the hash has none), they have not heard of.
    fn apply_push(
        &self,
        ctx: &FleetContext,
        w: &mut A::Entry,
        (pushed, mine): &Self::Pushed,
        _own: bool,
        local: u64,
    ) -> Heard {
        let now = ctx.shared_now(local);
        let (own, known) = w.split();
        let others = if known == A::UNKNOWN || known == *pushed {
            *pushed
        } else {
            self.heard(known, *pushed, now)
        };
        *w = A::Entry::join(own, others);
        Heard {
            // Not while Redis is away: a failed call sends the key again anyway, and more
            // calls timing out kept the fleet's rates 1.2-1.7x their exact twin's worst
            // second under 200 ms of latency.
            republish: mine.is_none() && self.idle_at(&own) > now && !ctx.is_down(),
            // Without a field, all of it: a count left from units counted while no push came
            // back (an outage) would otherwise stay, its own state idle and never published,
            // and hold the key back for good.
            unheard: self
                .caps_unheard()
                .then(|| self.unheard(own, mine.unwrap_or_else(|| self.fresh()), now)),
        }
    }
}
