//! What every algorithm's hybrid entry runs on: the context decisions read ([`FleetContext`]), a
//! decision's [`Verdict`], the [`Engine`] each algorithm implements (`lease.rs`, `merge.rs`),
//! and [`Fleet`], the algorithm the core's keyed store runs for a hybrid limiter.

use super::entry::{Hybrid, HybridCell};
use super::report::Counters;
use super::{Fallback, SyncError};
use crate::algo::Algorithm;
use crate::algo::{clamp, Earrrl, Exponential, FixedWindow, Gcra, SlidingWindow};
use crate::decision::{Decision, Policy};
use crate::error::ConfigError;
use crate::keyed::Shared;
use crate::stats::Stats;
use ::redis::Value;
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// A key the store evicted holding GCRA units or a debt: handed back by the next sync.
#[derive(Debug)]
pub struct Evicted {
    pub(super) key: String,
    /// The quota it ran under ([`Quotas`]): GCRA's units are in its emission interval.
    pub(super) quota: u32,
    pub(super) units: u64,
    pub(super) debt: u64,
    pub(super) back: bool,
}

/// What every decision, the sync thread and the subscription share.
#[derive(Debug)]
pub struct FleetContext {
    /// This instance's id in the merged hashes and in pushes (random, per limiter).
    pub(super) instance: String,
    pub(super) interval: u64,
    pub(super) share: f64,
    /// Redis' time (ns since the Unix epoch) minus the local clock.
    pub(super) offset: AtomicU64,
    /// Whether the last sync round found Redis unreachable.
    pub(super) down: AtomicBool,
    /// Local time the current (or last) outage began.
    pub(super) down_since: AtomicU64,
    /// Local time the last outage ended (0: none yet).
    pub(super) up_since: AtomicU64,
    /// How long after an outage the fallback decides on (ns): every instance reconnected,
    /// subscribed and published again by then (set by the builder from `reconnect_after`).
    pub(super) recover_for: AtomicU64,
    /// Local time from which every change is heard of (the subscription's start); `u64::MAX`
    /// while not subscribed. A key this instance has heard nothing of is fresh for the fleet
    /// a horizon of its quota after it ([`mode`](Self::mode)), or at once if
    /// [`mirror_clear`](Self::mirror_clear).
    pub(super) mirror_since: AtomicU64,
    /// No instance wrote within a horizon before this subscription (the prefix's live marker,
    /// `live_key`, was gone): no state written before it is live.
    pub(super) mirror_clear: AtomicBool,
    /// Local time of the last (re)subscription, for the sync thread to look at the live
    /// marker after it (0: none yet).
    pub(super) subscribed_at: AtomicU64,
    /// The sync thread, woken for a new subscription's check.
    pub(super) sync_thread: std::sync::OnceLock<std::thread::Thread>,
    /// Local time of the next sync round.
    pub(super) next_tick: AtomicU64,
    /// Local time the round in flight was sent (0: none in flight): a round unanswered for
    /// long is an outage before its I/O timeout says so ([`waiting`](Self::waiting)).
    pub(super) round_since: AtomicU64,
    /// A request was admitted by the fallback since the sync thread last looked (it keeps
    /// the time): an instance that decided alone does not take an empty prefix for an idle
    /// fleet, the others may have decided alone too and published nothing.
    pub(super) alone: AtomicBool,
    /// The timeline's jumps not yet applied to the states (ns; see `observe_time`).
    pub(super) restamp: std::sync::atomic::AtomicI64,
    /// Script calls that published (their reply came back): the subscription should hear
    /// each as a push of its own.
    pub(super) published: AtomicU64,
    /// This instance's own pushes heard, counted from [`published`](Self::published) as it
    /// stood at the subscription: behind it for long, the subscription has gone deaf.
    pub(super) heard_own: AtomicU64,
    /// The [`published`](Self::published) count whose own push is awaited, and the local
    /// time it was published (0: none awaited): a push overdue is a subscription that may
    /// have gone deaf, before the subscription thread says so ([`waiting`](Self::waiting)).
    push_due: AtomicU64,
    push_due_since: AtomicU64,
    /// How long own pushes take to come back (ns): the longest in this second or the one
    /// before (50 ms until one is heard). A cluster's pushes cross its bus (up to 65 ms where
    /// a server's take 1-2): a wait under twice this is no sign of deafness. Beside it, the
    /// longest of this second and the local time it began (the subscription thread's).
    push_lag: AtomicU64,
    push_lag_this: AtomicU64,
    push_lag_since: AtomicU64,
    /// The round trip (ns) of the sample the offset was last set from, and its local time:
    /// the offset follows the quickest round trips, whose error (half the asymmetry of the
    /// way there and back) is the smallest.
    time_rtt: AtomicU64,
    time_at: AtomicU64,
    pub(super) stats: Counters,
    pub(super) last_error: Mutex<Option<SyncError>>,
    /// Keys for the sync thread (each queued once until it takes them).
    pub(super) queue: Mutex<Vec<String>>,
    /// Keys evicted with units or a debt, to hand back.
    pub(super) evicted: Mutex<Vec<Evicted>>,
    pub(super) stop: AtomicBool,
    /// The CAS retries of the sync thread and the subscription (not the requests').
    pub(super) cas: Stats,
}

/// How a decision was reached: what the stats count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// From a GCRA lease.
    Lease,
    /// On the fleet's state as known (merged states; GCRA beyond its lease).
    Known,
    /// By the fallback: the fleet's state not known, or Redis away.
    Fallback,
    /// Denied for want of quota in hand until the next sync.
    Waiting,
}

/// A decision and what the limiter does about it.
#[derive(Debug, Clone, Copy)]
pub struct Verdict {
    pub(super) decision: Decision,
    pub(super) reason: Reason,
    /// Whether the sync thread has something to do for the key.
    pub(super) sync: bool,
}

/// How a decision is taken for a key: on the fleet's state as known, by the fallback while
/// it is not known yet, or by the fallback while Redis is away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Known,
    Unknown,
    Degraded,
}

/// A jump of the offset to Redis' time past which the states are re-stamped (ns): the offset
/// moves by fractions of a round trip as it follows the quickest ones, and by a clock's
/// error once, when Redis is first heard.
const RESTAMP_ABOVE: u128 = 1_000_000;

/// A new instance's id: [`random_seed`](super::super::client::random_seed)'s 64 bits. Never a
/// time-seeded generator's: fastrand's seeds from the monotonic clock and the thread id, so
/// two processes started within one tick of a coarse clock got one id, and each then took
/// the other's field for its own and never counted its traffic (a fleet test admitted 13%
/// above one exact limiter when two of its four processes shared an id).
fn instance_id() -> String {
    format!("{:016x}", super::super::client::random_seed())
}

impl FleetContext {
    /// A context at local time `now`, Unix time `unix` (ns), not subscribed yet.
    pub(super) fn new(interval: u64, share: f64, now: u64, unix: u64) -> Self {
        FleetContext {
            instance: instance_id(),
            interval,
            share,
            offset: AtomicU64::new(unix.saturating_sub(now)),
            down: AtomicBool::new(false),
            down_since: AtomicU64::new(now),
            up_since: AtomicU64::new(0),
            recover_for: AtomicU64::new(0),
            mirror_since: AtomicU64::new(u64::MAX),
            mirror_clear: AtomicBool::new(false),
            subscribed_at: AtomicU64::new(0),
            sync_thread: std::sync::OnceLock::new(),
            next_tick: AtomicU64::new(now.saturating_add(interval)),
            round_since: AtomicU64::new(0),
            restamp: std::sync::atomic::AtomicI64::new(0),
            alone: AtomicBool::new(false),
            published: AtomicU64::new(0),
            heard_own: AtomicU64::new(0),
            push_due: AtomicU64::new(0),
            push_due_since: AtomicU64::new(0),
            push_lag: AtomicU64::new(50_000_000),
            push_lag_this: AtomicU64::new(50_000_000),
            push_lag_since: AtomicU64::new(now),
            time_rtt: AtomicU64::new(u64::MAX),
            time_at: AtomicU64::new(0),
            stats: Counters::default(),
            last_error: Mutex::new(None),
            queue: Mutex::new(Vec::new()),
            evicted: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            cas: Stats::default(),
        }
    }

    #[inline]
    pub(super) fn shared_now(&self, local: u64) -> u64 {
        clamp(local.saturating_add(self.offset.load(Ordering::Relaxed)))
    }

    #[inline]
    pub(super) fn local(&self, shared: u64) -> u64 {
        shared.saturating_sub(self.offset.load(Ordering::Relaxed))
    }

    #[inline]
    pub(super) fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// The mode of a key whose state is `known` (it has heard from the fleet about it),
    /// under a quota whose states live `horizon` without a write.
    #[inline]
    pub(super) fn mode(&self, known: bool, now: u64, horizon: u64) -> Mode {
        if self.is_down() {
            Mode::Degraded
        } else if known || self.mirrors(now, horizon) {
            Mode::Known
        } else {
            Mode::Unknown
        }
    }

    /// Whether at `now` a key not heard of is fresh for the fleet under a quota of
    /// `horizon`: every change since a horizon ago has been heard of.
    #[inline]
    pub(super) fn mirrors(&self, now: u64, horizon: u64) -> bool {
        let since = self.mirror_since.load(Ordering::Relaxed);
        since != u64::MAX
            && (now >= since.saturating_add(horizon) || self.mirror_clear.load(Ordering::Relaxed))
    }

    /// Whether a script call of this instance has been answered (it published).
    #[inline]
    pub(super) fn answered(&self) -> bool {
        self.published.load(Ordering::Relaxed) > 0
    }

    /// Whether Redis' time has been heard (the offset is set from a round trip).
    #[inline]
    pub(super) fn time_known(&self) -> bool {
        self.time_rtt.load(Ordering::Relaxed) != u64::MAX
    }

    /// Whether at local time `now` a round has gone unanswered, or an own push not come back,
    /// for longer than three sync intervals, or four of the quickest round trips if that is
    /// longer (a push: or twice as long as pushes lately took). Meanwhile nothing is heard
    /// from the fleet, and the others go on admitting: a merged state's decisions on the
    /// others' states as last heard each took all the quota had left, and what a sliding
    /// window's previous count gave back as it aged (a 3 s stall: windows 1.6× the limit in
    /// the 200 ms before the I/O timeout said Redis was away; a subscription gone deaf at a
    /// window's start: 2.6× in the 250 ms before it was noticed). Past this, they are the
    /// fallback's, as in an outage.
    #[inline]
    pub(super) fn waiting(&self, now: u64) -> bool {
        let round = self.round_since.load(Ordering::Relaxed);
        let push = self.push_due_since.load(Ordering::Relaxed);
        (round != 0 || push != 0) && {
            // No round trip measured yet: the intervals alone.
            let rtt = match self.time_rtt.load(Ordering::Relaxed) {
                u64::MAX => 0,
                rtt => rtt,
            };
            let patience = (3 * self.interval).max(rtt.saturating_mul(4));
            let push_patience = patience.max(2 * self.push_lag.load(Ordering::Relaxed));
            (round != 0 && now > round.saturating_add(patience))
                || (push != 0 && now > push.saturating_add(push_patience))
        }
    }

    /// A script call published at local time `now`: its push should come back (awaited, if
    /// none is). Only the sync thread calls this.
    pub(super) fn published(&self, now: u64) {
        // SeqCst, here and in `heard_own`: the push may be heard before its call's reply is
        // read (the script publishes before it returns). Each side writes, then reads what
        // the other wrote, so one of them sees both and ends the wait.
        let count = self.published.fetch_add(1, Ordering::SeqCst) + 1;
        if self.push_due_since.load(Ordering::SeqCst) == 0 {
            self.push_due.store(count, Ordering::SeqCst);
            self.push_due_since.store(now.max(1), Ordering::SeqCst);
            self.end_wait_if_heard();
        }
    }

    /// An own push heard at local time `now`: the awaited one, if it has come. Only the
    /// subscription thread calls this.
    pub(super) fn heard_own(&self, now: u64) {
        self.heard_own.fetch_add(1, Ordering::SeqCst);
        if let Some(since) = self.end_wait_if_heard() {
            self.push_took(now.saturating_sub(since), now);
        }
    }

    /// Ends the wait for an own push if it has been heard; the local time it began, if it
    /// ended here.
    fn end_wait_if_heard(&self) -> Option<u64> {
        let since = self.push_due_since.load(Ordering::SeqCst);
        (since != 0
            && self.heard_own.load(Ordering::SeqCst) >= self.push_due.load(Ordering::SeqCst)
            && self
                .push_due_since
                .compare_exchange(since, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok())
        .then_some(since)
    }

    /// An own push came back `lag` ns after its call's reply, at local time `now`.
    fn push_took(&self, lag: u64, now: u64) {
        let r = Ordering::Relaxed;
        let mut this = self.push_lag_this.load(r);
        let began = self.push_lag_since.load(r);
        let mut before = self.push_lag.load(r);
        if now.saturating_sub(began) >= 1_000_000_000 {
            // A new second: the last one's longest is the one before; two or more: none.
            before = if now - began < 2_000_000_000 { this } else { 0 };
            this = 0;
            self.push_lag_since.store(now, r);
        }
        this = this.max(lag);
        self.push_lag_this.store(this, r);
        self.push_lag.store(this.max(before), r);
    }

    /// Subscribed: own pushes are counted from here, none awaited (what was published before
    /// may never arrive).
    pub(super) fn subscribed(&self) {
        self.heard_own
            .store(self.published.load(Ordering::Relaxed), Ordering::Relaxed);
        self.push_due_since.store(0, Ordering::Relaxed);
    }

    /// The wait until the next sync round: a denial for want of quota in hand lasts that.
    pub(super) fn until_tick(&self, now: u64) -> u64 {
        self.next_tick
            .load(Ordering::Relaxed)
            .saturating_sub(now)
            .clamp(1, self.interval.max(1))
    }

    /// Redis said `redis_ns` in a round trip sent at local time `sent` and answered at
    /// `answered`: at about its midpoint. Taken if the round trip is within a quarter (or
    /// 1 ms) of the quickest one the offset was set from, or that sample is 10 s old: with
    /// jitter on the way, a slow round trip's midpoint can be off by half of it, and each such
    /// jump would shift every decision's time (only the sync thread calls this).
    pub(super) fn observe_time(&self, redis_ns: u64, sent: u64, answered: u64) {
        let rtt = answered.saturating_sub(sent);
        let local = sent + rtt / 2;
        let best = self.time_rtt.load(Ordering::Relaxed);
        let stale = local.saturating_sub(self.time_at.load(Ordering::Relaxed)) > 10_000_000_000;
        if rtt > best.saturating_add((best / 4).max(1_000_000)) && !stale {
            return;
        }
        if rtt <= best || stale {
            self.time_rtt.store(rtt, Ordering::Relaxed);
            self.time_at.store(local, Ordering::Relaxed);
        }
        let offset = redis_ns.saturating_sub(local);
        let before = self.offset.swap(offset, Ordering::Relaxed);
        // A jump (the first time Redis is heard, after deciding by this machine's clock):
        // the states stamped before it are re-stamped by the sync thread.
        let delta = offset as i128 - before as i128;
        if delta.unsigned_abs() > RESTAMP_ABOVE {
            let delta = delta.clamp(i64::MIN.into(), i64::MAX.into()) as i64;
            self.restamp.fetch_add(delta, Ordering::Relaxed);
        }
    }

    pub(super) fn fail(&self, e: SyncError) {
        *self.last_error.lock() = Some(e);
    }

    /// Redis answered cleanly: an outage or a Redis error is over. A state this limiter
    /// cannot read stays reported (it is in Redis until its writer's state idles).
    pub(super) fn recovered(&self) {
        let mut last = self.last_error.lock();
        if matches!(*last, Some(SyncError::Outage(_) | SyncError::Backend(_))) {
            *last = None;
        }
    }
}

/// What the sync thread does with a key this round.
#[derive(Debug)]
pub enum Visit<S> {
    /// Nothing, and forget it until a request queues it again.
    Skip,
    /// Nothing now; look again next round.
    Keep,
    /// Send the key's arguments (after the client key) in the round's batch.
    Call(Vec<String>, S),
}

/// How an algorithm runs in the hybrid limiter. Sealed: implemented for [`Gcra`] (leases)
/// and for [`FixedWindow`], [`SlidingWindow`], [`Earrrl`] and [`Exponential`] (merged
/// states).
pub trait HybridAlgorithm: Engine {}

impl HybridAlgorithm for Gcra {}
impl HybridAlgorithm for FixedWindow {}
impl HybridAlgorithm for SlidingWindow {}
impl HybridAlgorithm for Earrrl {}
impl HybridAlgorithm for Exponential {}

mod private {
    use super::*;
    use crate::redis::hybrid::push::Reader;

    /// One algorithm's entry, its decisions and its sync (sealed: the trait is not nameable).
    pub trait Engine: Algorithm + Clone + PartialEq + fmt::Debug + Send + Sync + 'static {
        /// The state the store keeps per key: this instance's own and what it knows of the
        /// fleet's.
        type Word: crate::algo::State + Copy + fmt::Debug;
        /// What the limiter fixes at build from the fallback share.
        type Plan: fmt::Debug + Send + Sync + 'static;
        /// The sync thread's bookkeeping of a key it watches.
        type KeyBook: Default + Send + 'static;
        /// What a key's call sent, for when it fails.
        type Sent: Send;
        /// A pushed state, parsed.
        type Pushed;
        /// The batch script.
        const SCRIPT: &'static str;
        /// Appended to the Redis key (`:h` for the merged hashes).
        const SUFFIX: &'static str;
        /// More keys of the script per client key, the Redis key with these appended (same
        /// slot).
        const EXTRA_KEYS: &'static [&'static str];

        /// What `share` fixes; an error if it leaves an instance less than one request.
        fn plan(&self, fallback: Fallback) -> Result<Self::Plan, ConfigError>;
        /// The entry of a key nothing is known of yet.
        fn unknown(&self) -> Self::Word;
        /// Decides a request of `cost` at local time `now` on `w`, updating it; `stale`: what
        /// `w` holds of the others was heard before a gap in the subscription
        /// ([`HybridCell::stale`]).
        #[allow(clippy::too_many_arguments)]
        fn decide_entry(
            &self,
            plan: &Self::Plan,
            ctx: &FleetContext,
            w: &mut Self::Word,
            stale: bool,
            now: u64,
            cost: u64,
        ) -> Verdict;
        /// Settles at local time `now` a request taken at local time `taken_at` for
        /// `charged`, with the `actual` cost (they differ), on `w`: this instance's part of
        /// the key, as a request changes it. The sync thread then publishes the change.
        fn settle_entry(
            &self,
            ctx: &FleetContext,
            w: &mut Self::Word,
            now: u64,
            taken_at: u64,
            charged: u64,
            actual: u64,
        );
        /// The local time from which `w` is equivalent to [`unknown`](Engine::unknown) in a
        /// subscribed limiter, holding nothing: it may be dropped.
        fn entry_idle_at(&self, ctx: &FleetContext, w: &Self::Word) -> u64;
        /// How long a state of this quota can stay live without a write (a full burst's
        /// payback): how long after subscribing an instance takes a key it has not heard of
        /// as unknown rather than fresh.
        fn horizon(&self) -> u64;
        /// What a gap in the subscription does to what is known of the fleet: a lease stops
        /// being current; a merged entry keeps the others' state as a floor (its cell marked
        /// stale).
        fn forget(&self, w: &mut Self::Word);
        /// Re-stamps `w`'s own state, stamped on a timeline `delta` ns behind Redis' (see
        /// [`FleetContext::observe_time`]). Nothing by default: GCRA's state is Redis' TAT.
        fn restamp(&self, _w: &mut Self::Word, _delta: i64) {}

        /// How many debt words describe an entry (see [`Algorithm::debt_parts`]): 0, the
        /// default, keeps no debt table (GCRA: an evicted entry's lease and debt go back to
        /// Redis, which holds the key's TAT).
        fn entry_debt_parts(&self) -> usize {
            0
        }
        /// Part `part` of what an entry still owes ([`Algorithm::debt`]).
        fn entry_debt(&self, w: &Self::Word, part: usize) -> u128 {
            let _ = (w, part);
            0
        }
        /// Two debt words of part `part` joined ([`Algorithm::debt_join`]).
        fn entry_debt_join(&self, part: usize, a: u128, b: u128) -> u128 {
            let _ = part;
            a.max(b)
        }
        /// The shared time (Redis') from which a debt word limits nothing.
        fn entry_debt_paid_at(&self, part: usize, debt: u128) -> u64 {
            let _ = (part, debt);
            0
        }
        /// An entry at least as limited as the debts ([`Algorithm::restore`]).
        fn entry_restore(&self, debt: &dyn Fn(usize) -> u128) -> Self::Word {
            let _ = debt;
            self.unknown()
        }

        /// The key's call this round, if any.
        fn prepare(
            &self,
            plan: &Self::Plan,
            ctx: &FleetContext,
            cell: &HybridCell<Self::Word>,
            book: &mut Self::KeyBook,
            now: u64,
            closing: bool,
        ) -> Visit<Self::Sent>;
        /// Applies the key's reply at local time `now` (`cell`: `None` if it left the
        /// store meanwhile); `Ok(true)`: visit it again next round.
        #[allow(clippy::too_many_arguments)]
        fn apply(
            &self,
            ctx: &FleetContext,
            key: &str,
            cell: Option<&HybridCell<Self::Word>>,
            book: &mut Self::KeyBook,
            reply: Value,
            sent: Self::Sent,
            now: u64,
        ) -> Result<bool, SyncError>;
        /// The key's call failed: restore what it took.
        fn failed(
            &self,
            ctx: &FleetContext,
            key: &str,
            cell: Option<&HybridCell<Self::Word>>,
            sent: Self::Sent,
        );
        /// The store evicted `key` in state `w`, running under quota `quota`: queue what it
        /// held to be handed back.
        fn evicted(&self, ctx: &FleetContext, key: &str, quota: u32, w: &Self::Word);
        /// The arguments of a call handing back what an evicted key held.
        fn hand_back(&self, ctx: &FleetContext, e: &Evicted) -> Vec<String>;

        /// Reads one key's pushed state (after its client key), at local time `now`.
        fn read_push(
            &self,
            ctx: &FleetContext,
            key: &str,
            r: &mut Reader<'_>,
            now: u64,
        ) -> Result<Self::Pushed, SyncError>;
        /// Whether a pushed state says nothing a fresh entry would not (no entry is made
        /// for it).
        fn push_is_idle(&self, ctx: &FleetContext, p: &Self::Pushed, now: u64) -> bool;
        /// Merges a pushed state into `w` at local time `now`; `own`: pushed by this
        /// instance's own call.
        fn apply_push(
            &self,
            ctx: &FleetContext,
            w: &mut Self::Word,
            p: &Self::Pushed,
            own: bool,
            now: u64,
        );
    }
}
pub(crate) use private::Engine;

/// The algorithm the core's store runs for a hybrid limiter: `A`'s entry and decisions, with
/// the context they read.
#[derive(Debug)]
pub struct Fleet<A: Engine> {
    pub(super) algo: A,
    pub(super) plan: A::Plan,
    pub(super) ctx: Arc<FleetContext>,
    /// The fallback, which fixes each quota's plan.
    pub(super) fallback: Fallback,
    /// The per-request quotas met so far.
    pub(super) quotas: Quotas<A>,
}

impl<A: Engine> Fleet<A> {
    /// Quota `index` ([`Quotas`]): 0 is the limiter's own; an index no entry can hold (none
    /// is handed out unregistered) reads as the own.
    #[inline]
    pub(super) fn quota(&self, index: u32) -> (&A, &A::Plan) {
        match index.checked_sub(1).and_then(|i| self.quotas.get(i)) {
            Some(q) => (&q.algo, &q.plan),
            None => (&self.algo, &self.plan),
        }
    }

    /// The index of `quota` (a request's, or `None`: the own), registering it if it is new;
    /// `hint`, the index the key's entry holds, is tried first. An error if the limiter's
    /// states cannot be read by it, or its fallback share leaves it less than a unit, or
    /// [`MAX_QUOTAS`] are registered already.
    #[inline]
    pub(super) fn index_of(
        &self,
        quota: Option<&A>,
        hint: u32,
    ) -> Result<(u32, &A, &A::Plan), ConfigError> {
        let Some(quota) = quota else {
            return Ok((0, &self.algo, &self.plan));
        };
        let (algo, plan) = self.quota(hint);
        if algo == quota {
            return Ok((hint, algo, plan));
        }
        if *quota == self.algo {
            return Ok((0, &self.algo, &self.plan));
        }
        self.algo.check_quota(quota)?;
        let i = self.quotas.find_or_add(quota, self.fallback)?;
        let q = self.quotas.get(i).expect("registered");
        Ok((i + 1, &q.algo, &q.plan))
    }

    /// The longest a state of any quota met lives without a write: the live marker's.
    pub(super) fn horizon(&self) -> u64 {
        self.algo
            .horizon()
            .max(self.quotas.horizon.load(Ordering::Relaxed))
    }
}

/// How many distinct per-request quotas a hybrid limiter takes (its own aside): each is
/// kept for the limiter's life (its keys' entries name it), so a limiter serving a
/// configuration that is reloaded with new quotas for ever would grow without this bound.
pub const MAX_QUOTAS: usize = 1 << 16;
const CHUNK: usize = 256;

/// `CHUNK` quotas, each set once.
type Chunk<A> = Box<[OnceLock<Quota<A>>]>;

/// A per-request quota the limiter has met: its algorithm and what the fallback fixes for it.
#[derive(Debug)]
pub struct Quota<A: Engine> {
    algo: A,
    plan: A::Plan,
}

/// The per-request quotas a hybrid limiter has met, numbered in order, so that a key's entry
/// says in 4 bytes which one it runs under: the sync thread and the subscription read it
/// (GCRA's leases, debts and pushed TATs are in the quota's emission intervals). Read
/// without a lock (a chunked array of cells set once); added under a lock, once per quota.
pub struct Quotas<A: Engine> {
    chunks: Box<[OnceLock<Chunk<A>>]>,
    /// Indices by shape (capacity, horizon, policy), each confirmed by equality.
    by_shape: papaya::HashMap<(u64, u64, bool), Box<[u32]>, ahash::RandomState>,
    added: parking_lot::Mutex<u32>,
    /// The longest horizon among them.
    horizon: AtomicU64,
}

impl<A: Engine> fmt::Debug for Quotas<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quotas")
            .field("count", &*self.added.lock())
            .finish()
    }
}

impl<A: Engine> Default for Quotas<A> {
    fn default() -> Self {
        Quotas {
            chunks: (0..MAX_QUOTAS / CHUNK).map(|_| OnceLock::new()).collect(),
            by_shape: papaya::HashMap::builder()
                .hasher(ahash::RandomState::new())
                .build(),
            added: parking_lot::Mutex::new(0),
            horizon: AtomicU64::new(0),
        }
    }
}

impl<A: Engine> Quotas<A> {
    #[inline]
    fn get(&self, i: u32) -> Option<&Quota<A>> {
        let i = i as usize;
        self.chunks.get(i / CHUNK)?.get()?[i % CHUNK].get()
    }

    fn shape(quota: &A) -> (u64, u64, bool) {
        (
            quota.capacity(),
            quota.horizon(),
            quota.policy() == Policy::Strict,
        )
    }

    fn find(&self, quota: &A) -> Option<u32> {
        let guard = self.by_shape.guard();
        let found = self.by_shape.get(&Self::shape(quota), &guard)?;
        found
            .iter()
            .copied()
            .find(|&i| self.get(i).is_some_and(|q| q.algo == *quota))
    }

    /// `quota`'s index, added if it is new.
    #[cold]
    fn find_or_add(&self, quota: &A, fallback: Fallback) -> Result<u32, ConfigError> {
        if let Some(i) = self.find(quota) {
            return Ok(i);
        }
        let plan = quota.plan(fallback)?;
        let mut added = self.added.lock();
        // Added by another thread while this one waited.
        if let Some(i) = self.find(quota) {
            return Ok(i);
        }
        let i = *added;
        if i as usize >= MAX_QUOTAS {
            return Err(ConfigError::TooLarge {
                field: crate::Field::Quota,
                value: format!("{} distinct quotas", MAX_QUOTAS + 1),
                max: "65,536 per-request quotas on one hybrid limiter",
            });
        }
        let chunk = self.chunks[i as usize / CHUNK]
            .get_or_init(|| (0..CHUNK).map(|_| OnceLock::new()).collect());
        let _ = chunk[i as usize % CHUNK].set(Quota {
            algo: quota.clone(),
            plan,
        });
        self.horizon.fetch_max(quota.horizon(), Ordering::Relaxed);
        let shape = Self::shape(quota);
        let guard = self.by_shape.guard();
        let mut list = self
            .by_shape
            .get(&shape, &guard)
            .map_or_else(Vec::new, |l| l.to_vec());
        list.push(i);
        self.by_shape.insert(shape, list.into(), &guard);
        *added = i + 1;
        Ok(i)
    }
}

impl<A: Engine> Algorithm for Fleet<A> {
    type State = A::Word;

    fn fresh(&self) -> A::Word {
        self.algo.unknown()
    }

    fn capacity(&self) -> u64 {
        self.algo.capacity()
    }

    fn policy(&self) -> Policy {
        self.algo.policy()
    }

    /// The limiter's own paths decide with the cell at hand ([`HybridCell::stale`]); without
    /// it, the others' state is taken as a floor only.
    #[inline]
    fn update(&self, w: &mut A::Word, now: u64, cost: u64) -> Decision {
        self.algo
            .decide_entry(&self.plan, &self.ctx, w, true, now, cost)
            .decision
    }

    fn settle(&self, w: &mut A::Word, now: u64, taken_at: u64, charged: u64, actual: u64) {
        self.algo
            .settle_entry(&self.ctx, w, now, taken_at, charged, actual);
    }

    fn idle_at(&self, w: &A::Word) -> u64 {
        self.algo.entry_idle_at(&self.ctx, w)
    }

    /// An entry's debt, in the words [`Engine::entry_debt`] gives: the merged states keep
    /// both halves (this instance's own state, which it publishes whole, and the others'), so
    /// a key evicted and inserted again neither publishes less than it counted nor decides as
    /// if the others held nothing. GCRA keeps none (its leases go back to Redis).
    fn debt_parts(&self) -> usize {
        self.algo.entry_debt_parts()
    }

    fn debt(&self, w: &A::Word, part: usize) -> u128 {
        self.algo.entry_debt(w, part)
    }

    fn debt_join(&self, part: usize, a: u128, b: u128) -> u128 {
        self.algo.entry_debt_join(part, a, b)
    }

    /// In local time, as every time the store compares.
    fn debt_paid_at(&self, part: usize, debt: u128) -> u64 {
        self.ctx.local(self.algo.entry_debt_paid_at(part, debt))
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> A::Word {
        self.algo.entry_restore(debt)
    }
}

pub(super) type Store<A, C> = Shared<String, Fleet<A>, C, Hybrid>;

/// What the limiter, its sync thread and its subscription share.
pub(crate) struct Inner<A: Engine, C> {
    pub(super) store: Store<A, C>,
    pub(super) prefix: String,
}

impl<A: Engine, C> Inner<A, C> {
    pub(super) fn fleet(&self) -> &Fleet<A> {
        &self.store.core.algo
    }

    pub(super) fn ctx(&self) -> &FleetContext {
        &self.store.core.algo.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::FleetContext;
    use std::sync::atomic::Ordering;

    const MS: u64 = 1_000_000;

    /// A round unanswered for three intervals (or four of the quickest round trips, if
    /// longer) is waited on: the merged algorithms decide by the fallback meanwhile.
    #[test]
    fn a_round_unanswered_for_three_intervals_is_waited_on() {
        let ctx = FleetContext::new(10 * MS, 0.25, 1_000 * MS, 0);
        assert!(!ctx.waiting(5_000 * MS), "no round in flight");
        ctx.round_since.store(1_000 * MS, Ordering::Relaxed);
        assert!(!ctx.waiting(1_030 * MS));
        assert!(ctx.waiting(1_031 * MS));
        // Round trips of 20 ms: 80 ms of patience.
        ctx.observe_time(2_000 * MS, 1_000 * MS, 1_020 * MS);
        assert!(!ctx.waiting(1_080 * MS));
        assert!(ctx.waiting(1_081 * MS));
        ctx.round_since.store(0, Ordering::Relaxed);
        assert!(!ctx.waiting(9_000 * MS));
    }

    /// An own push not back within the rounds' patience (30 ms here), or twice as long as
    /// pushes took in this second or the last (50 ms until one is heard), is waited on too:
    /// counted from a publish while none is awaited, until that one is heard (under steady
    /// traffic some push is always in flight: no wait that never ends); a subscription
    /// counts afresh.
    #[test]
    fn an_own_push_overdue_is_waited_on() {
        let ctx = FleetContext::new(10 * MS, 0.25, 1_000 * MS, 0);
        ctx.subscribed();
        ctx.published(1_000 * MS);
        // The next publishes do not move the wait's start: the first is still out.
        ctx.published(1_010 * MS);
        assert!(!ctx.waiting(1_100 * MS));
        assert!(ctx.waiting(1_101 * MS));
        // The awaited one heard: none awaited until the next publish.
        ctx.heard_own(1_102 * MS);
        assert!(!ctx.waiting(1_200 * MS));
        // Two seconds on, pushes back in 2 ms: the rounds' 30 ms.
        ctx.heard_own(1_103 * MS);
        ctx.published(3_500 * MS);
        ctx.heard_own(3_502 * MS);
        ctx.published(3_600 * MS);
        assert!(!ctx.waiting(3_630 * MS));
        assert!(ctx.waiting(3_631 * MS));
        // Subscribed again: what was published before may never arrive.
        ctx.subscribed();
        assert!(!ctx.waiting(3_631 * MS));
        // A push heard before its call's reply is read: nothing left to wait for.
        ctx.heard_own(3_700 * MS);
        ctx.published(3_710 * MS);
        assert!(!ctx.waiting(4_000 * MS));
        // Pushes that took 40 ms (a cluster's bus): a wait is no sign under 80 ms; then
        // 82 ms, kept through the next second.
        ctx.published(5_000 * MS);
        ctx.heard_own(5_040 * MS);
        ctx.published(5_500 * MS);
        assert!(!ctx.waiting(5_580 * MS));
        assert!(ctx.waiting(5_581 * MS));
        ctx.heard_own(5_582 * MS);
        ctx.published(6_100 * MS);
        ctx.heard_own(6_101 * MS);
        ctx.published(6_500 * MS);
        assert!(!ctx.waiting(6_664 * MS));
        assert!(ctx.waiting(6_665 * MS));
        // Two seconds on, only what the last pushes took.
        ctx.heard_own(6_666 * MS);
        ctx.published(8_200 * MS);
        ctx.heard_own(8_201 * MS);
        ctx.published(8_300 * MS);
        assert!(ctx.waiting(8_331 * MS));
    }

    /// Redis' time first heard 1.5 s ahead of the local guess: the jump is left for the
    /// sync thread to re-stamp the states by; a move of a fraction of a round trip is not.
    #[test]
    fn a_jump_of_the_timeline_is_left_to_restamp_the_states() {
        let ctx = FleetContext::new(10 * MS, 0.25, 1_000 * MS, 2_000 * MS);
        ctx.observe_time(3_500 * MS, 1_000 * MS, 1_000 * MS);
        assert_eq!(ctx.restamp.load(Ordering::Relaxed), 1_500 * MS as i64);
        ctx.restamp.store(0, Ordering::Relaxed);
        ctx.observe_time(3_600 * MS + MS / 2, 1_100 * MS, 1_100 * MS);
        assert_eq!(ctx.restamp.load(Ordering::Relaxed), 0);
    }
}
