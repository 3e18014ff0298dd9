//! The context every decision of a hybrid limiter reads, and its sync thread and
//! subscription write ([`FleetContext`]): Redis' time, whether Redis and the subscription are
//! current, the rounds and own pushes awaited, and the keys to hand back.

use super::report::Counters;
use super::SyncError;
use crate::algo::clamp;
use crate::stats::Stats;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A key the store evicted holding GCRA units or a debt: handed back by the next sync.
#[derive(Debug)]
pub struct Evicted {
    pub(super) key: String,
    /// The quota it ran under ([`Quotas`](super::engine::Quotas)): GCRA's units are in its emission interval.
    pub(super) quota: u32,
    pub(super) units: u64,
    pub(super) debt: u64,
    pub(super) back: bool,
}

/// The most evicted keys waiting to be handed back, and the fewest (below, the limiter's
/// `max_keys`): during an outage a flood of new keys, each admitted by the fallback and
/// evicted, would otherwise grow the list (and each round's work) with every request. At
/// most about 6 MB of entries.
const MAX_HAND_BACKS: usize = 1 << 16;
const MIN_HAND_BACKS: usize = 1 << 10;

/// What every decision, the sync thread and the subscription share.
#[derive(Debug)]
pub struct FleetContext {
    /// This instance's id in the merged hashes and in pushes (random, per limiter).
    pub(super) instance: String,
    pub(super) interval: u64,
    pub(super) share: f64,
    /// Redis' time (ns since the Unix epoch) minus the local clock. Read by every request
    /// beside [`timeline`](Self::timeline): both model-checked (`loom_model` below).
    offset: crate::sync::AtomicU64,
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
    /// Odd from a jump of the offset until every state is re-stamped on the new timeline
    /// (the sync thread's `restamp`), even otherwise: see [`settled_now`](Self::settled_now).
    timeline: crate::sync::AtomicU64,
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
    /// before (50 ms until one is heard): a wait under twice this is no sign of deafness.
    /// Beside it, the
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
    /// Keys for the sync thread (each queued once until it takes them, and once more if a
    /// request makes it urgent), and whether it is urgent.
    pub(super) queue: Mutex<Vec<(String, bool)>>,
    /// Keys evicted with units or a debt, to hand back: at most `max_hand_backs`
    /// ([`FleetContext::hand_back_later`]).
    pub(super) evicted: Mutex<Vec<Evicted>>,
    /// The limiter's `max_keys`, within 1,024 and [`MAX_HAND_BACKS`].
    max_hand_backs: usize,
    pub(super) stop: AtomicBool,
    /// The CAS retries of the sync thread and the subscription (not the requests').
    pub(super) cas: Stats,
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

/// A jump past which requests of merged algorithms wait for the re-stamp ([`settled_now`]):
/// a clock's error (seconds, a cold start's), not the few milliseconds a slow round trip
/// moves the offset by, which a state read across moves by no more than a sync lag does
/// every round (a fleet test that checks in a tight loop on a loaded machine was refused
/// where such a jump fell).
///
/// [`settled_now`]: FleetContext::settled_now
const WAIT_ABOVE: u128 = 10_000_000;

/// A new instance's id: [`random_seed`](super::super::client::random_seed)'s 64 bits. Never a
/// time-seeded generator's: fastrand's seeds from the monotonic clock and the thread id, so
/// two processes started within one tick of a coarse clock got one id, and each then took
/// the other's field for its own and never counted its traffic (a fleet test admitted 13%
/// above one exact limiter when two of its four processes shared an id).
fn instance_id() -> String {
    format!("{:016x}", super::super::client::random_seed())
}

impl FleetContext {
    /// At most `max_keys` evicted keys waiting to be handed back (within 1,024 and
    /// [`MAX_HAND_BACKS`]).
    pub(super) fn with_max_keys(self, max_keys: Option<usize>) -> Self {
        Self {
            max_hand_backs: max_keys
                .map_or(MAX_HAND_BACKS, |m| m.clamp(MIN_HAND_BACKS, MAX_HAND_BACKS)),
            ..self
        }
    }

    /// Queues `e` for the next round's hand-back, unless `max_hand_backs` wait already:
    /// then it is dropped and counted (`hand_backs_dropped`). A GCRA key's units left with
    /// Redis only err strict; its debt (what a fallback admitted past its lease) is not
    /// charged to the fleet: at most a fallback's share of its burst per key dropped.
    pub(super) fn hand_back_later(&self, e: Evicted) {
        let mut list = self.evicted.lock();
        if list.len() < self.max_hand_backs {
            list.push(e);
        } else {
            self.stats
                .hand_backs_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A context at local time `now`, Unix time `unix` (ns), not subscribed yet.
    pub(super) fn new(interval: u64, share: f64, now: u64, unix: u64) -> Self {
        FleetContext {
            instance: instance_id(),
            interval,
            share,
            offset: crate::sync::AtomicU64::new(unix.saturating_sub(now)),
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
            timeline: crate::sync::AtomicU64::new(0),
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
            max_hand_backs: MAX_HAND_BACKS,
            stop: AtomicBool::new(false),
            cas: Stats::default(),
        }
    }

    /// Puts `key` on the sync thread's queue, waking it for the first key since it took
    /// the queue.
    pub(super) fn push_key(&self, key: &str, urgent: bool) {
        let mut queue = self.queue.lock();
        queue.push((key.to_owned(), urgent));
        if queue.len() == 1 {
            drop(queue);
            if let Some(t) = self.sync_thread.get() {
                t.unpark();
            }
        }
    }

    #[inline]
    pub(super) fn shared_now(&self, local: u64) -> u64 {
        clamp(local.saturating_add(self.offset.load(Ordering::Acquire)))
    }

    /// [`shared_now`](Self::shared_now), or `None` while a jump of the offset is being
    /// applied to the states: then a state may be stamped on either timeline, and a step
    /// that read it at the other's time would move it by the jump. An instance whose clock
    /// was 2 s behind Redis' decayed a rate's whole state by 2 s in one such step, and the
    /// re-stamp then put it 2 s ahead of the fleet's time. A cold start with clocks ±2 s
    /// apart went over in about 1 run in 12, where a request fell in the microseconds between
    /// the jump and the re-stamp (a sliding window 1.19–1.22x its limit, an exponential
    /// limiter's second 1.11–1.26x its exact twin's); the re-stamp walks every key, so with
    /// many the gap is longer, and held open 20 ms it took every run over (a fixed window to
    /// 1.6–2.0x, the sliding one to 1.5–1.8x, the exponential to 1.2–2.0x).
    ///
    /// Read within a cell's update, for each attempt: the time is that of a timeline on
    /// which no re-stamp ran between the two reads of `timeline`. A state read before the
    /// re-stamp reached its cell and written after it fails its CAS (or waited for the
    /// cell's lock) and is read again; one written before it is re-stamped with the rest.
    pub(super) fn settled_now(&self, local: u64) -> Option<u64> {
        let before = self.timeline.load(Ordering::Acquire);
        let now = self.shared_now(local);
        (before % 2 == 0 && self.timeline.load(Ordering::Acquire) == before).then_some(now)
    }

    /// Every state is re-stamped on the timeline of the last jump (the sync thread, after
    /// applying [`restamp`](Self::restamp) to each).
    pub(super) fn restamped(&self) {
        let t = self.timeline.load(Ordering::Relaxed);
        if t % 2 == 1 {
            self.timeline.store(t + 1, Ordering::Release);
        }
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
        let before = self.offset.load(Ordering::Relaxed);
        // A jump (the first time Redis is heard, after deciding by this machine's clock):
        // the states stamped before it are re-stamped by the sync thread. The timeline is
        // marked as moving before the offset moves (`settled_now`).
        let delta = offset as i128 - before as i128;
        if delta.unsigned_abs() > RESTAMP_ABOVE {
            let t = self.timeline.load(Ordering::Relaxed);
            if t % 2 == 0 && delta.unsigned_abs() > WAIT_ABOVE {
                self.timeline.store(t + 1, Ordering::Release);
            }
            let delta = delta.clamp(i64::MIN.into(), i64::MAX.into()) as i64;
            self.restamp.fetch_add(delta, Ordering::Relaxed);
        }
        self.offset.store(offset, Ordering::Release);
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
        // Pushes that took 40 ms (a slow link): a wait is no sign under 80 ms; then
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
    /// sync thread to re-stamp the states by, and requests wait for it; a move of a fraction
    /// of a round trip is not re-stamped, one of a few milliseconds is without a wait.
    #[test]
    fn a_jump_of_the_timeline_is_left_to_restamp_the_states() {
        let ctx = FleetContext::new(10 * MS, 0.25, 1_000 * MS, 2_000 * MS);
        ctx.observe_time(3_500 * MS, 1_000 * MS, 1_000 * MS);
        assert_eq!(ctx.restamp.load(Ordering::Relaxed), 1_500 * MS as i64);
        // Requests wait until the states are re-stamped.
        assert_eq!(ctx.settled_now(1_000 * MS), None);
        ctx.restamp.store(0, Ordering::Relaxed);
        ctx.restamped();
        assert_eq!(ctx.settled_now(1_000 * MS), Some(3_500 * MS));
        ctx.observe_time(3_600 * MS + MS / 2, 1_100 * MS, 1_100 * MS);
        assert_eq!(ctx.restamp.load(Ordering::Relaxed), 0);
        // 9.5 ms, a slow round trip's worth: re-stamped, but no request waits for it.
        ctx.observe_time(3_710 * MS, 1_200 * MS, 1_200 * MS);
        assert_eq!(ctx.restamp.load(Ordering::Relaxed), 9_500_000);
        assert_eq!(ctx.settled_now(1_200 * MS), Some(3_710 * MS));
    }
}

/// A loom model of the timeline's jump ([`FleetContext::settled_now`]): a request racing the
/// sync thread, which hears Redis' time 2 s ahead of this instance's clock and re-stamps the
/// key's state, on the real context, cell and exponential step. Whatever the interleaving,
/// the request reads its state on the timeline the state is on: it waits, or it is decided
/// on the old timeline before the re-stamp moves what it wrote, or on the new one after.
/// The own part ends on the new timeline, no later than the request's time there, its rate
/// not decayed by the jump (read across it, 40 became 5.4, then stamped 2 s ahead).
///
/// `RUSTFLAGS="--cfg hotlimit_loom" cargo test --release --lib --features redis loom`.
#[cfg(all(test, hotlimit_loom))]
mod loom_model {
    use super::FleetContext;
    use crate::algo::Exponential;
    use crate::cell::StateCell;
    use crate::redis::hybrid::entry::{Halves, HybridCell, Pair, Seen};
    use crate::redis::hybrid::{Engine, Reason};
    use crate::stats::Stats;
    use loom::sync::Arc;
    use loom::thread;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    // Pins G56.
    #[test]
    fn loom_a_request_across_the_jump_of_the_timeline() {
        loom::model(|| {
            let exp = Exponential::new(100.0, Duration::from_secs(1)).unwrap();
            let ctx = FleetContext::new(5 * MS, 0.25, 0, 0);
            ctx.mirror_since.store(0, Ordering::Relaxed); // the key's fleet state is known
            let (own, others) = (Exponential::pack(S, 40.0), Exponential::pack(S, 20.0));
            let cell: Arc<HybridCell<Pair>> = Arc::new(StateCell::new(Pair::join(own, others)));
            let (ctx, stats) = (Arc::new(ctx), Arc::new(Stats::default()));
            let sync = {
                let (ctx, cell, stats) = (ctx.clone(), cell.clone(), stats.clone());
                thread::spawn(move || {
                    // Redis says 2 s more than this clock (local S + 1 ms).
                    ctx.observe_time(3 * S + MS, S + MS, S + MS);
                    let delta = ctx.restamp.swap(0, Ordering::Relaxed);
                    cell.update(&stats, |w| exp.restamp(w, delta));
                    ctx.restamped();
                })
            };
            let v = cell
                .update(&stats, |w| {
                    exp.decide_entry(&0.25, &ctx, w, Seen::default(), S + MS, 1, false)
                })
                .unwrap();
            sync.join().unwrap();
            let (t, r) = Exponential::unpack(cell.inspect(|w| w.split().0).unwrap());
            if v.decision.is_allowed() {
                assert_eq!((v.reason, t), (Reason::Known, 3 * S + MS));
            } else {
                assert_eq!((v.reason, t, r), (Reason::Waiting, 3 * S, 40.0));
            }
            assert!(r > 40.0 * (-0.001f64).exp(), "decayed by the jump: {r}");
        });
    }
}
