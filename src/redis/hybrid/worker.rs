//! The sync thread: every round (a sync interval), the keys that need Redis (queued by
//! requests, watched for their leases, evicted with something to hand back) go in batches of
//! one script call each; the replies are applied, the failed keys kept for the next round.

use super::entry::HybridCell;
use super::link::Link;
use super::{channel, live_key, Engine, Evicted, Inner, RedisBuilder, SyncError, Visit};
use crate::cell::StateCell;
use ::redis::Value;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Keys per script call on a single server: one call runs atomically, so a round of many keys
/// is cut into calls that each hold Redis only briefly.
const BATCH: usize = 128;

/// How often (ns) the live marker is set, at most.
const MARKER_EVERY: u64 = 1_000_000_000;

/// Sets the live marker (`KEYS[1]`) to expire in `ARGV[1]` ms unless it already lives
/// longer.
const LIVE_MARKER: &str = "if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then \
    redis.call('SET', KEYS[1], 1, 'PX', ARGV[1]) end return 1";

/// What one key sends this round.
struct Call<S> {
    key: String,
    /// The quota it was prepared under (its reply is read by it).
    quota: u32,
    args: Vec<String>,
    what: What<S>,
}

/// A key's call: for its entry, or handing back what an evicted key held.
enum What<S> {
    Entry(S),
    HandBack(Evicted),
}

/// A key the sync thread holds between rounds: its book, when it was last visited, and
/// since when it has waited for its next visit (changes older than the round before).
struct Watch<B> {
    book: B,
    visited: u64,
    waiting_since: Option<u64>,
    /// Queued by a request (or a failed call) since its last visit.
    queued: bool,
    /// Queued by a request that left the key near its limit: visited this round, however
    /// recently it was last.
    urgent: bool,
    /// Visited every interval whether queued or not (a GCRA key holding a lease).
    watched: bool,
}

impl<B: Default> Watch<B> {
    fn new() -> Self {
        Watch {
            book: B::default(),
            visited: 0,
            waiting_since: None,
            queued: true,
            urgent: false,
            watched: false,
        }
    }
}

/// The sync thread: a round as soon as a request queues a key (after a moment, to gather
/// more), and every `interval` for the keys it watches, until the limiter stops, then a last
/// one that hands every lease back. A key is visited at most once per `interval`: a key
/// queued again sooner waits for its turn, unless a request left it near its limit (queued
/// urgent: `Merge::near_limit`), which the next round sends.
pub(super) fn sync_loop<A: Engine, C: crate::Clock>(
    inner: &Inner<A, C>,
    config: RedisBuilder<A>,
    interval: Duration,
) {
    let (ctx, fleet, store) = (inner.ctx(), inner.fleet(), &inner.store);
    let channel = channel(&inner.prefix, A::SUFFIX);
    let live = live_key(&inner.prefix, A::SUFFIX);
    // What a round waits for more keys once one is queued.
    let gather = (interval / 8).clamp(Duration::from_micros(100), Duration::from_millis(1));
    let mut link = Link::new(config);
    // The subscription whose live marker was looked at, and the last one a round was run
    // early for (once each: a look-up that failed waits for the next interval).
    let (mut checked, mut hurried) = (0, 0);
    // The keys queued or watched.
    let mut books: HashMap<String, Watch<A::KeyBook>> = HashMap::new();
    let mut prev_start = store.core.clock.now();
    // When the live marker was last set.
    let mut marker_at: Option<u64> = None;
    // When this instance last admitted a request by its fallback.
    let mut alone_at: Option<u64> = None;
    loop {
        let started = Instant::now();
        let closing = ctx.stop.load(Ordering::Acquire);
        let now = store.core.clock.now();
        if ctx.alone.swap(false, Ordering::Relaxed) {
            alone_at = Some(now);
        }
        ctx.next_tick
            .store(now.saturating_add(ctx.interval), Ordering::Relaxed);
        for (key, urgent) in std::mem::take(&mut *ctx.queue.lock()) {
            let w = books.entry(key).or_insert_with(Watch::new);
            w.queued = true;
            w.urgent |= urgent;
        }
        let guard = store.map.guard();
        // Redis' time never heard (a start, Redis away until now): asked before anything is
        // published, and the states this instance stamped by its own clock re-stamped on it,
        // so that no instance reads them stamped in a window they were not in (a cold start
        // with clocks 2 s apart: a window 1.3x its limit as the first round published them).
        if !ctx.time_known() && (!ctx.queue.lock().is_empty() || !books.is_empty()) {
            link.connect();
            if !link.is_cluster() {
                let t0 = store.core.clock.now();
                let reply = link.run(vec![::redis::cmd("TIME")]).into_iter().next();
                if let Some(Ok(Ok((redis_ns, _)))) = reply.map(|r| r.map(split_reply)) {
                    ctx.observe_time(redis_ns, t0, store.core.clock.now());
                    restamp(inner, &guard);
                }
            }
        }
        let mut calls = Vec::new();
        // The oldest change this round sends was made after the last round began, or after a
        // waiting key's last visit.
        let mut oldest = prev_start;
        books.retain(|key, w| {
            let spaced = now.saturating_sub(w.visited) >= ctx.interval;
            if !(w.queued || w.watched || closing) {
                // Nothing to do: kept until its interval is over, so that a request right
                // after its visit waits for the next.
                return !spaced;
            }
            if !spaced && !closing && !w.urgent {
                w.waiting_since.get_or_insert(w.visited);
                return true;
            }
            // A key evicted since it was queued: its changes since its last call would never
            // be sent, and the other instances would admit them again. What it owes in the
            // debt table is sent instead: at least what it counted (a key that owes nothing of
            // its own has nothing to send; without a table, GCRA's evicted lease and debt are
            // handed back below). Read by the limiter's own quota: a per-request quota of a
            // merged algorithm keeps its window, so the word means the same.
            let restored;
            let cell = match store.map.get(key.as_str(), &guard) {
                Some(cell) => cell,
                None => match store.owed(key.as_str()) {
                    Some(state) if w.queued && fleet.algo.entry_debt(&state, 0) != 0 => {
                        restored = HybridCell::new(state);
                        &restored
                    }
                    _ => return false,
                },
            };
            if let Some(since) = w.waiting_since.take() {
                oldest = oldest.min(since);
            }
            w.visited = now;
            w.queued = false;
            w.urgent = false;
            let quota = cell.quota();
            let (algo, plan) = fleet.quota(quota);
            match algo.prepare(plan, ctx, cell, &mut w.book, now, closing) {
                Visit::Skip => {
                    w.watched = false;
                    true
                }
                Visit::Keep => {
                    w.watched = true;
                    true
                }
                Visit::Call(args, sent) => {
                    calls.push(Call {
                        key: key.clone(),
                        quota,
                        args,
                        what: What::Entry(sent),
                    });
                    true
                }
            }
        });
        for e in std::mem::take(&mut *ctx.evicted.lock()) {
            calls.push(Call {
                key: e.key.clone(),
                quota: e.quota,
                args: fleet.quota(e.quota).0.hand_back(ctx, &e),
                what: What::HandBack(e),
            });
        }
        // After a (re)subscription: if no instance wrote within a horizon before it, no
        // state of the prefix is live, and a key not heard of is fresh from now on.
        let subscribed = ctx.subscribed_at.load(Ordering::Acquire);
        let mut extra = Vec::new();
        if subscribed > checked {
            extra.push(::redis::cmd("EXISTS").arg(&live).clone());
            // And Redis' time, before any request needs it: until then decisions are timed
            // by this machine's clock, which may be off (see `observe_time`). Not on a
            // cluster, whose pipelines route by key (its first round's reply says it).
            link.connect();
            if !link.is_cluster() {
                extra.push(::redis::cmd("TIME"));
            }
        }
        let check = !extra.is_empty();
        // The live marker, at most once per `MARKER_EVERY` (a round runs up to every
        // millisecond): set to live a horizon plus that, it outlives every state written
        // until the next refresh. Lengthened, never shortened: each instance knows the quotas
        // it has met, and the marker must outlive the longest-lived state any of them wrote.
        let mark = !calls.is_empty() && marker_at.map_or(true, |t| now >= t + MARKER_EVERY);
        if mark {
            let ms = (fleet.horizon() + MARKER_EVERY).div_ceil(1_000_000);
            let mut set = ::redis::cmd("EVAL");
            set.arg(LIVE_MARKER).arg(1).arg(&live).arg(ms);
            extra.push(set);
        }
        if !calls.is_empty() || check {
            let writes = !calls.is_empty();
            let t0 = store.core.clock.now();
            let replies = run_round(
                inner, &mut link, &channel, &mut books, calls, extra, &guard, now,
            );
            if mark && replies.last().is_some_and(Result::is_ok) {
                marker_at = Some(now);
            }
            if check {
                let done = store.core.clock.now();
                let mut replies = replies.into_iter();
                if let Some(Ok(v)) = replies.next() {
                    checked = subscribed;
                    let current = ctx.subscribed_at.load(Ordering::Acquire) == subscribed;
                    // No marker: nothing published within a horizon. An idle fleet, unless this
                    // instance decided alone within one (a cold start or an outage): then the
                    // others may have too, their states in no hash (a cold start's windows
                    // went to 1.2-1.3x their limit, each instance deciding on its own state
                    // alone once Redis answered). Its keys wait to be heard of instead.
                    let alone = alone_at.is_some_and(|t| now.saturating_sub(t) <= fleet.horizon());
                    if current
                        && !alone
                        && ::redis::from_redis_value::<u64>(&v).is_ok_and(|n| n == 0)
                    {
                        ctx.mirror_clear.store(true, Ordering::Relaxed);
                    }
                }
                // `TIME`'s reply is a round reply's head: seconds, microseconds.
                if let Some(Ok(Ok((redis_ns, _)))) = replies.next().map(|r| r.map(split_reply)) {
                    ctx.observe_time(redis_ns, t0, done);
                }
            }
            if writes {
                let lag = store.core.clock.now().saturating_sub(oldest);
                ctx.stats.lag.store(lag, Ordering::Relaxed);
                ctx.stats.lag_max.fetch_max(lag, Ordering::Relaxed);
            }
        }
        // A clock that jumped (the quickest round trips moved the offset): the states stamped
        // on the old timeline re-stamped on the new one as soon as the round that heard it is
        // over (the decisions between read them on the new one).
        restamp(inner, &guard);
        drop(guard);
        prev_start = now;
        ctx.stats.ticks.fetch_add(1, Ordering::Relaxed);
        ctx.stats
            .round_trips
            .store(link.round_trips, Ordering::Relaxed);
        if closing {
            return;
        }
        // Wait for the next interval, or for a request's key (woken by the request that
        // queues the first key), then a moment more.
        let tick = started + interval;
        loop {
            if ctx.stop.load(Ordering::Acquire) {
                break;
            }
            // A new subscription (it wakes this thread): its look-up now, not an interval on
            // (until it, no key is fresh for the fleet: every decision is the fallback's).
            let subscribed = ctx.subscribed_at.load(Ordering::Acquire);
            if subscribed > checked && subscribed != hurried {
                hurried = subscribed;
                break;
            }
            if !ctx.queue.lock().is_empty() || !ctx.evicted.lock().is_empty() {
                std::thread::sleep(gather.min(tick.saturating_duration_since(Instant::now())));
                break;
            }
            let left = tick.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::park_timeout(left);
        }
    }
}

/// Applies the timeline's jumps not yet applied to every state (see
/// [`FleetContext::observe_time`](super::FleetContext::observe_time)).
fn restamp<A: Engine, C: crate::Clock>(inner: &Inner<A, C>, guard: &impl papaya::Guard) {
    let (ctx, fleet, store) = (inner.ctx(), inner.fleet(), &inner.store);
    let delta = ctx.restamp.swap(0, Ordering::Relaxed);
    if delta != 0 {
        for (_, cell) in store.map.iter(guard) {
            let algo = fleet.quota(cell.quota()).0;
            cell.update(&ctx.cas, |w| algo.restamp(w, delta));
        }
    }
    // Jumps that added up to none leave no state to move either.
    ctx.restamped();
}

/// Sends one round's calls and `extra` commands, applies the calls' replies and returns the
/// extra commands'.
#[allow(clippy::too_many_arguments)]
fn run_round<A: Engine, C: crate::Clock>(
    inner: &Inner<A, C>,
    link: &mut Link<A>,
    channel: &str,
    books: &mut HashMap<String, Watch<A::KeyBook>>,
    calls: Vec<Call<A::Sent>>,
    extra: Vec<::redis::Cmd>,
    guard: &impl papaya::Guard,
    now: u64,
) -> Vec<Result<Value, super::BackendError>> {
    let (ctx, fleet, store) = (inner.ctx(), inner.fleet(), &inner.store);
    // One buffer for every Redis key this round writes: a round is the sync thread's whole
    // work, and its allocations were half of it.
    let mut redis_key = String::new();
    let key_of = |buf: &mut String, key: &str| {
        buf.clear();
        super::push_redis_key(buf, &inner.prefix, key, A::SUFFIX);
    };
    // A call per `BATCH` keys on a server; per node (and `BATCH`) on a cluster, or per key if
    // the slot map is not to be had. (Connected first: which of the two it is.)
    link.connect();
    let mut calls = calls;
    // Each batch's length and the channel its call publishes on: the prefix's channel on a
    // server; on a cluster, the shard channel of the batch's node (`SPUBLISH`: a push that
    // stays in the node's shard, heard by each instance's subscription to that node), or the
    // prefix's channel by plain `PUBLISH` for a key sent alone while the slot map is not to
    // be had (the subscriptions hear that one too, across the bus).
    let plain = || ("PUBLISH", channel.to_string());
    let cuts: Vec<(usize, (&str, String))> = if !link.is_cluster() {
        (0..calls.len())
            .step_by(BATCH)
            .map(|i| ((calls.len() - i).min(BATCH), plain()))
            .collect()
    } else if let Some(map) = link.slot_map() {
        let mut nodes = Vec::with_capacity(calls.len());
        for c in &calls {
            key_of(&mut redis_key, &c.key);
            nodes.push(map.node(super::link::key_slot(&redis_key)));
        }
        let shard: Vec<Option<String>> = (0..map.nodes.len())
            .map(|n| map.shard_channel(n, channel))
            .collect();
        match nodes.into_iter().collect::<Option<Vec<usize>>>() {
            Some(nodes) => {
                let mut items: Vec<(usize, Call<A::Sent>)> = nodes.into_iter().zip(calls).collect();
                items.sort_by_key(|i| i.0);
                let mut cuts = Vec::new();
                let mut start = 0;
                for i in 1..=items.len() {
                    if i == items.len() || items[i].0 != items[start].0 || i - start == BATCH {
                        let to = match &shard[items[start].0] {
                            Some(c) => ("SPUBLISH", c.clone()),
                            None => plain(),
                        };
                        cuts.push((i - start, to));
                        start = i;
                    }
                }
                calls = items.into_iter().map(|i| i.1).collect();
                cuts
            }
            None => (0..calls.len()).map(|_| (1, plain())).collect(),
        }
    } else {
        (0..calls.len()).map(|_| (1, plain())).collect()
    };
    let mut at = 0;
    let mut cmds: Vec<::redis::Cmd> = Vec::with_capacity(cuts.len() + extra.len());
    for (n, (publish, to)) in &cuts {
        let chunk = &calls[at..at + n];
        at += n;
        // The first key's hash, declared for routing.
        key_of(&mut redis_key, &chunk[0].key);
        let mut cmd = link.eval(A::SCRIPT, &redis_key);
        cmd.arg(*publish)
            .arg(to)
            .arg(&ctx.instance)
            .arg(chunk.len());
        for call in chunk {
            key_of(&mut redis_key, &call.key);
            cmd.arg(&call.key).arg(&redis_key);
            for x in A::EXTRA_KEYS {
                let len = redis_key.len();
                redis_key.push_str(x);
                cmd.arg(&redis_key);
                redis_key.truncate(len);
            }
            cmd.arg(&call.args);
        }
        cmds.push(cmd);
    }
    let batches: Vec<usize> = cuts.into_iter().map(|c| c.0).collect();
    cmds.extend(extra);
    let t0 = store.core.clock.now();
    // Never 0, which says no round is in flight.
    ctx.round_since.store(t0.max(1), Ordering::Relaxed);
    let replies = link.run(cmds);
    ctx.round_since.store(0, Ordering::Relaxed);
    let done = store.core.clock.now();
    ctx.stats
        .calls
        .fetch_add(calls.len() as u64, Ordering::Relaxed);
    let mut replies = replies.into_iter();
    let mut reached = false;
    let mut failure: Option<SyncError> = None;
    let mut calls = calls.into_iter();
    for &batch in &batches {
        let reply = replies
            .next()
            .unwrap_or(Err(super::BackendError::Unavailable));
        let items = reply.map_err(SyncError::from_backend).and_then(|v| {
            let (redis_ns, items) = split_reply(v)?;
            ctx.observe_time(redis_ns, t0, done);
            Ok(items)
        });
        let chunk = calls.by_ref().take(batch).collect::<Vec<_>>();
        match items {
            Ok(items) => {
                reached = true;
                // The call published: its push should come back to this instance too.
                ctx.published(done);
                let mut items = items.into_iter();
                for call in chunk {
                    let item = items.next().unwrap_or(Value::Nil);
                    let sent = match call.what {
                        What::Entry(sent) => sent,
                        What::HandBack(e) => {
                            ctx.stats.returned.fetch_add(e.units, Ordering::Relaxed);
                            ctx.stats.charged.fetch_add(e.debt, Ordering::Relaxed);
                            continue;
                        }
                    };
                    let cell = store.map.get(call.key.as_str(), guard);
                    let mut none = A::KeyBook::default();
                    let book = books.get_mut(&call.key).map_or(&mut none, |w| &mut w.book);
                    let again = fleet
                        .quota(call.quota)
                        .0
                        .apply(ctx, &call.key, cell, book, item, sent, done);
                    match again {
                        // Watched every interval, or left until a request queues it again.
                        Ok(watch) => {
                            if let Some(w) = books.get_mut(&call.key) {
                                w.watched = watch;
                            }
                        }
                        Err(e) => {
                            ctx.stats.errors.fetch_add(1, Ordering::Relaxed);
                            failure = Some(e);
                        }
                    }
                }
            }
            Err(e) => {
                let outage = e.is_outage();
                for call in chunk {
                    let counter = if outage {
                        &ctx.stats.failed_calls
                    } else {
                        &ctx.stats.errors
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    match call.what {
                        What::Entry(sent) => {
                            let cell = store.map.get(call.key.as_str(), guard);
                            fleet.quota(call.quota).0.failed(ctx, &call.key, cell, sent);
                            // Sent again next interval.
                            books.entry(call.key).or_insert_with(Watch::new).queued = true;
                        }
                        What::HandBack(e) => ctx.hand_back_later(e),
                    }
                }
                failure = Some(e);
            }
        }
    }
    if batches.is_empty() {
        // Only the live marker was asked: nothing said about the keys.
        return replies.collect();
    }
    let was_down = ctx.down.load(Ordering::Relaxed);
    if !reached && !was_down {
        ctx.down_since.store(now, Ordering::Relaxed);
    }
    if reached && was_down {
        ctx.up_since.store(now.max(1), Ordering::Relaxed);
    }
    ctx.down.store(!reached, Ordering::Relaxed);
    match failure {
        Some(e) => ctx.fail(e),
        None => ctx.recovered(),
    }
    replies.collect()
}

/// A round's reply: Redis' time (ns since the Unix epoch) and the per-key items.
fn split_reply(v: Value) -> Result<(u64, Vec<Value>), SyncError> {
    let Value::Array(items) = v else {
        return Err(SyncError::Malformed("round reply"));
    };
    let mut it = items.into_iter();
    let num = |v: Option<Value>| -> Result<u64, SyncError> {
        v.and_then(|v| ::redis::from_redis_value::<u64>(&v).ok())
            .ok_or(SyncError::Malformed("round reply"))
    };
    let secs = num(it.next())?;
    let micros = num(it.next())?;
    Ok((
        secs.saturating_mul(1_000_000_000)
            .saturating_add(micros.saturating_mul(1_000)),
        it.collect(),
    ))
}
