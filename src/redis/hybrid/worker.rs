//! The sync thread: every round (a sync interval), the keys that need Redis (queued by
//! requests, watched for their leases, evicted with something to hand back) go in batches of
//! one script call each; the replies are applied, the failed keys kept for the next round.

use super::link::{Batch, Link};
use super::{channel, Builder, Engine, Evicted, Inner, SyncError, Visit};
use ::redis::Value;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Keys per script call on a single server: one call runs atomically, so a round of many keys
/// is cut into calls that each hold Redis only briefly.
const BATCH: usize = 128;

/// What one key sends this round.
struct Call<S> {
    key: String,
    args: Vec<String>,
    what: What<S>,
}

/// A key's call: for its entry, or handing back what an evicted key held.
enum What<S> {
    Entry(S),
    HandBack(Evicted),
}

/// The sync thread: rounds every `interval` until the limiter stops, then a last one that
/// hands every lease back.
pub(super) fn sync_loop<A: Engine, C: crate::Clock>(
    inner: &Inner<A, C>,
    config: Builder<A>,
    interval: Duration,
) {
    let (ctx, fleet, store) = (inner.ctx(), inner.fleet(), &inner.store);
    let channel = channel(&inner.prefix, A::SUFFIX);
    let mut link = Link::new(config);
    // The keys visited this round and the next ones: those queued, and those kept.
    let mut books: HashMap<String, A::Book> = HashMap::new();
    let mut prev_start = store.core.clock.now();
    loop {
        let started = Instant::now();
        let closing = ctx.stop.load(Ordering::Acquire);
        let now = store.core.clock.now();
        ctx.next_tick
            .store(now.saturating_add(ctx.interval), Ordering::Relaxed);
        for key in std::mem::take(&mut *ctx.queue.lock()) {
            books.entry(key).or_default();
        }
        let guard = store.map.guard();
        let mut calls = Vec::new();
        books.retain(|key, book| {
            let Some(cell) = store.map.get(key.as_str(), &guard) else {
                return false;
            };
            match fleet
                .algo
                .prepare(&fleet.plan, ctx, cell, book, now, closing)
            {
                Visit::Skip => false,
                Visit::Keep => true,
                Visit::Call(args, sent) => {
                    calls.push(Call {
                        key: key.clone(),
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
                args: fleet.algo.hand_back(ctx, now, &e),
                what: What::HandBack(e),
            });
        }
        if !calls.is_empty() {
            run_round(inner, &mut link, &channel, &mut books, calls, &guard, now);
            let done = store.core.clock.now();
            let lag = done.saturating_sub(prev_start);
            ctx.stats.lag.store(lag, Ordering::Relaxed);
            ctx.stats.lag_max.fetch_max(lag, Ordering::Relaxed);
        }
        drop(guard);
        prev_start = now;
        ctx.stats.ticks.fetch_add(1, Ordering::Relaxed);
        ctx.stats
            .round_trips
            .store(link.round_trips, Ordering::Relaxed);
        if closing {
            return;
        }
        let left = (started + interval).saturating_duration_since(Instant::now());
        if !left.is_zero() && !ctx.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(left);
        }
    }
}

/// Sends one round's calls and applies the replies.
fn run_round<A: Engine, C: crate::Clock>(
    inner: &Inner<A, C>,
    link: &mut Link<A>,
    channel: &str,
    books: &mut HashMap<String, A::Book>,
    calls: Vec<Call<A::Sent>>,
    guard: &impl papaya::Guard,
    now: u64,
) {
    let (ctx, fleet, store) = (inner.ctx(), inner.fleet(), &inner.store);
    let per_batch = if link.is_cluster() { 1 } else { BATCH };
    let batches: Vec<Batch> = calls
        .chunks(per_batch)
        .map(|chunk| {
            let mut args = vec![
                channel.to_owned(),
                ctx.instance.clone(),
                chunk.len().to_string(),
            ];
            args.extend(fleet.algo.batch_args());
            let mut keys = Vec::with_capacity(chunk.len() * (1 + A::EXTRA_KEYS.len()));
            for call in chunk {
                let redis_key = super::redis_key(&inner.prefix, &call.key, A::SUFFIX);
                keys.extend(A::EXTRA_KEYS.iter().map(|x| format!("{redis_key}{x}")));
                keys.insert(keys.len() - A::EXTRA_KEYS.len(), redis_key);
                args.push(call.key.clone());
                args.extend(call.args.iter().cloned());
            }
            Batch { keys, args }
        })
        .collect();
    let t0 = store.core.clock.now();
    let replies = link.run(A::SCRIPT, &batches);
    let done = store.core.clock.now();
    let mid = t0 + done.saturating_sub(t0) / 2;
    ctx.stats
        .calls
        .fetch_add(calls.len() as u64, Ordering::Relaxed);
    let mut replies = replies.into_iter();
    let mut reached = false;
    let mut failure: Option<SyncError> = None;
    let mut calls = calls.into_iter();
    for batch in &batches {
        let reply = replies
            .next()
            .unwrap_or(Err(super::BackendError::Unavailable));
        let items = reply.map_err(SyncError::from_backend).and_then(|v| {
            let (redis_ns, items) = split_reply(v)?;
            ctx.observe_time(redis_ns, mid);
            Ok(items)
        });
        let chunk = calls
            .by_ref()
            .take(chunk_len(batch, A::EXTRA_KEYS.len()))
            .collect::<Vec<_>>();
        match items {
            Ok(items) => {
                reached = true;
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
                    let mut none = A::Book::default();
                    let book = books.get_mut(&call.key).unwrap_or(&mut none);
                    if let Err(e) = fleet
                        .algo
                        .apply(ctx, &call.key, cell, book, item, sent, done)
                    {
                        ctx.stats.errors.fetch_add(1, Ordering::Relaxed);
                        failure = Some(e);
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
                            fleet.algo.failed(ctx, &call.key, cell, sent);
                            // Sent again next round.
                            books.entry(call.key).or_default();
                        }
                        What::HandBack(e) => ctx.evicted.lock().push(e),
                    }
                }
                failure = Some(e);
            }
        }
    }
    if !reached && !ctx.down.load(Ordering::Relaxed) {
        ctx.down_since.store(now, Ordering::Relaxed);
    }
    ctx.down.store(!reached, Ordering::Relaxed);
    match failure {
        Some(e) => ctx.fail(e),
        None => ctx.recovered(),
    }
}

/// The number of client keys a batch holds.
fn chunk_len(batch: &Batch, extra: usize) -> usize {
    batch.keys.len() / (1 + extra)
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
        secs.saturating_mul(1_000_000_000) + micros * 1_000,
        it.collect(),
    ))
}
