//! The subscription: the script that writes a round's keys publishes their new shared states
//! on the prefix's channel, and every instance, subscribed, merges them into its entries, so
//! each knows every key's fleet state within one sync lag of its last change, whatever the
//! gap since it last saw the key itself.
//!
//! A message is a run of length-prefixed fields (`<len>:<bytes>`, as the scripts write
//! them): the publishing instance, Redis' time (seconds, microseconds), then per key its
//! client key and its state (GCRA: the TAT in µs; merged states: the number of fields of the
//! key's hash, then each field's instance and value).

use super::super::connection::{at_node, info_cluster_cmd, says_cluster};
use super::link::SlotMap;
use super::{channel, Engine, Inner, RedisBuilder, SyncError};
use crate::cell::StateCell;
use crate::clock::Clock;
use ::redis::{
    Client, Connection, ConnectionLike, IntoConnectionInfo, ProtocolVersion, PubSub, RedisError,
    RedisResult,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a read on the subscription waits before looking at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// Reads a pushed message's length-prefixed fields.
#[derive(Debug)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    /// The next field; `None` at the end or on a malformed one.
    pub(super) fn bytes(&mut self) -> Option<&'a [u8]> {
        let colon = self.rest.iter().position(|&b| b == b':')?;
        let len: usize = std::str::from_utf8(&self.rest[..colon])
            .ok()?
            .parse()
            .ok()?;
        let end = (colon + 1).checked_add(len)?;
        let body = self.rest.get(colon + 1..end)?;
        self.rest = &self.rest[end..];
        Some(body)
    }

    /// The next field as text.
    pub(super) fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }

    /// The next field, parsed.
    pub(super) fn parse<T: std::str::FromStr>(&mut self) -> Option<T> {
        self.text()?.parse().ok()
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// The subscription thread: subscribes (to the URL's server, or the first seed that
/// answers), merges every message, and after any break marks what it knew of the fleet as
/// heard before it ([`gap`]) and subscribes again, until the limiter stops.
pub(super) fn subscribe_loop<A: Engine, C: Clock>(inner: &Inner<A, C>, config: &RedisBuilder<A>) {
    let ctx = inner.ctx();
    let channel = channel(&inner.prefix, A::SUFFIX);
    while !ctx.stop.load(Ordering::Acquire) {
        match listen(inner, config, &channel) {
            // Stopped.
            Ok(()) => return,
            Err(e) => {
                gap(inner);
                ctx.fail(SyncError::from_backend(super::BackendError::from_redis(e)));
                let until = Instant::now() + config.reconnect_after;
                while Instant::now() < until && !ctx.stop.load(Ordering::Acquire) {
                    std::thread::sleep(POLL.min(config.reconnect_after));
                }
            }
        }
    }
}

/// One subscription, until it breaks (`Err`) or the limiter stops (`Ok`): to the prefix's
/// channel on the first server that answers and, on a cluster, to each primary's shard
/// channel on that primary (one thread each beside this one), where the sync rounds publish.
fn listen<A: Engine, C: Clock>(
    inner: &Inner<A, C>,
    config: &RedisBuilder<A>,
    channel: &str,
) -> RedisResult<()> {
    let ctx = inner.ctx();
    let mut last = None;
    let mut con = None;
    for url in std::iter::once(&config.url).chain(&config.seeds) {
        match Client::open(url.as_str())
            .and_then(|c| c.get_connection_with_timeout(config.connect_timeout))
        {
            Ok(c) => {
                con = Some(c);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(mut con) = con else {
        return Err(last.unwrap_or_else(|| (::redis::ErrorKind::IoError, "no URL").into()));
    };
    // Each confirmation and the cluster's map are round trips: waited for as any reply is
    // (the I/O timeout). Under the polling timeout below, a link slower than 50 ms never
    // subscribed.
    let io = Some(config.io_timeout.max(POLL));
    con.set_write_timeout(Some(config.io_timeout))?;
    con.set_read_timeout(io)?;
    let mut shards = Vec::new();
    if !config.seeds.is_empty() || says_cluster(con.req_command(&info_cluster_cmd())) {
        let reply = con.req_command(::redis::cmd("CLUSTER").arg("SLOTS"))?;
        let map = SlotMap::parse(&reply).ok_or((
            ::redis::ErrorKind::ParseError,
            "CLUSTER SLOTS",
            format!("{reply:?}"),
        ))?;
        let mut first = config.url.as_str().into_connection_info()?;
        // RESP3: a shard channel's messages come as pushes, which `PubSub` reads (in RESP2 it
        // knows only `message` and `pmessage`).
        first.redis.protocol = ProtocolVersion::RESP3;
        for (node, (host, port)) in map.nodes.iter().enumerate() {
            let (Some(shard), Some(info)) = (
                map.shard_channel(node, channel),
                at_node(&first, host.clone(), *port),
            ) else {
                continue;
            };
            // A node that cannot be subscribed to is left out (and said): its keys' calls
            // fail while it is away; once it or its replica is back, the own pushes it takes
            // are not heard, and the subscription is made again by the map of then.
            let subscribed = Client::open(info).and_then(|client| {
                let mut c = client.get_connection_with_timeout(config.connect_timeout)?;
                c.set_write_timeout(Some(config.io_timeout))?;
                c.set_read_timeout(io)?;
                ssubscribe(&mut c, &shard)?;
                Ok(c)
            });
            match subscribed {
                Ok(c) => shards.push(c),
                Err(e) => ctx.fail(SyncError::from_backend(super::BackendError::from_redis(e))),
            }
        }
    }
    let mut sub = con.as_pubsub();
    sub.subscribe(channel)?;
    ctx.stats.subscribed.fetch_add(1, Ordering::Relaxed);
    ctx.subscribed();
    // A push comes back within milliseconds of its call's reply; this long behind, the
    // subscription is taken for deaf (a late push costs a resubscription, decided by the
    // fallback meanwhile; a deaf one undetected, decisions on the others' states as they were).
    let interval = Duration::from_nanos(ctx.interval);
    let deaf_after = (5 * interval)
        .max(Duration::from_millis(100))
        .min(config.io_timeout.max(Duration::from_millis(1)));
    let poll = Some(POLL.min(deaf_after / 2).max(Duration::from_millis(1)));
    sub.set_read_timeout(poll)?;
    for c in &shards {
        c.set_read_timeout(poll)?;
    }
    ctx.recovered();
    // From here on every change is heard of; a state written before lives at most a horizon
    // without a write (sooner, if the sync thread finds no live marker: see `worker.rs`).
    let now = inner.store.core.clock.now();
    ctx.mirror_clear.store(false, Ordering::Relaxed);
    ctx.mirror_since.store(now, Ordering::Relaxed);
    ctx.subscribed_at.store(now.max(1), Ordering::Release);
    if let Some(t) = ctx.sync_thread.get() {
        t.unpark();
    }
    // Set by the first connection to break (or by this thread once it returns): every
    // reader stops; the first error is the subscription's.
    let done = AtomicBool::new(false);
    let broke = Mutex::new(None);
    let end = |e: RedisError| {
        broke.lock().get_or_insert(e);
        done.store(true, Ordering::Release);
    };
    let (done, end) = (&done, &end);
    std::thread::scope(|s| {
        for mut c in shards {
            let spawned = std::thread::Builder::new()
                .name("hotlimit-shard".into())
                .spawn_scoped(s, move || {
                    if let Err(e) = read(inner, &mut c.as_pubsub(), done) {
                        end(e);
                    }
                });
            if let Err(e) = spawned {
                end(e.into());
            }
        }
        if let Err(e) = watch(inner, &mut sub, done, deaf_after) {
            end(e);
        }
        done.store(true, Ordering::Release);
    });
    broke.into_inner().map_or(Ok(()), Err)
}

/// Sends `SSUBSCRIBE channel` on `con` and reads its confirmation (an error reply, such as
/// a slot that moved, is the error).
fn ssubscribe(con: &mut Connection, channel: &str) -> RedisResult<()> {
    con.send_packed_command(&::redis::cmd("SSUBSCRIBE").arg(channel).get_packed_command())?;
    con.recv_response()?.extract_error().map(drop)
}

/// Merges what one subscription is pushed until `done` or the limiter stops (`Ok`), or its
/// connection breaks.
fn read<A: Engine, C: Clock>(
    inner: &Inner<A, C>,
    sub: &mut PubSub<'_>,
    done: &AtomicBool,
) -> RedisResult<()> {
    while !done.load(Ordering::Acquire) && !inner.ctx().stop.load(Ordering::Acquire) {
        next(inner, sub)?;
    }
    Ok(())
}

/// Reads and merges one pushed message, if one comes within the read timeout.
fn next<A: Engine, C: Clock>(inner: &Inner<A, C>, sub: &mut PubSub<'_>) -> RedisResult<()> {
    match sub.get_message() {
        Ok(msg) => {
            merge(inner, msg.get_payload_bytes());
            Ok(())
        }
        Err(e) if e.is_timeout() => Ok(()),
        Err(e) => Err(e),
    }
}

/// [`read`] on the prefix's channel, and the deafness check over every connection.
fn watch<A: Engine, C: Clock>(
    inner: &Inner<A, C>,
    sub: &mut PubSub<'_>,
    done: &AtomicBool,
    deaf_after: Duration,
) -> RedisResult<()> {
    let ctx = inner.ctx();
    // The own push waited for (the published count that brings it) and since when.
    let mut waiting: Option<(u64, Instant)> = None;
    loop {
        if done.load(Ordering::Acquire) || ctx.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        next(inner, sub)?;
        // A half-open subscription (its peer gone without a word, or a proxy that stopped
        // forwarding) reads nothing and never fails, while the sync rounds' commands pass:
        // the instance would decide on the others' states as they were, for good. One own
        // push not coming back within `deaf_after` is the sign. Not the count of them staying
        // behind: under steady traffic some push is always in flight (a round's reply comes
        // back before its push), and on a cluster, whose rounds are longer, a healthy
        // subscription was taken for deaf (8–13 subscriptions for 4 instances, each a gap
        // decided by the fallback).
        let (sent, heard) = (
            ctx.published.load(Ordering::Relaxed),
            ctx.heard_own.load(Ordering::Relaxed),
        );
        waiting = match waiting {
            Some((target, since)) if heard < target => Some((target, since)),
            _ => (heard < sent).then(|| (sent, Instant::now())),
        };
        if let Some(behind) = waiting.and_then(|(_, since)| since.elapsed().checked_sub(deaf_after))
        {
            ctx.stats.deaf.fetch_add(1, Ordering::Relaxed);
            // The pushes lagged that long at least: the lag the others' changes reached
            // this instance with.
            let lag = (behind + deaf_after).as_nanos() as u64;
            ctx.stats.push_lag_max.fetch_max(lag, Ordering::Relaxed);
            return Err((
                ::redis::ErrorKind::IoError,
                "subscription deaf",
                format!("{} own pushes not heard back", sent - heard),
            )
                .into());
        }
    }
}

/// The subscription broke: changes may have been missed, so what is known of the fleet is
/// no longer taken for its state until pushes bring it again (or a horizon after subscribing
/// again). A merged entry keeps the others' state as heard, marked stale: what they held
/// then, a floor of what they hold now, which the fallback counts (forgotten, each instance
/// took its whole share on top of a window the fleet had filled: a window up to
/// `1 + (N − 1)·share` times its limit when Redis went away).
fn gap<A: Engine, C: Clock>(inner: &Inner<A, C>) {
    let ctx = inner.ctx();
    ctx.mirror_since.store(u64::MAX, Ordering::Relaxed);
    ctx.mirror_clear.store(false, Ordering::Relaxed);
    let store = &inner.store;
    let guard = store.map.guard();
    for (_, cell) in store.map.iter(&guard) {
        cell.set_stale(true);
        cell.update(&ctx.cas, |w| inner.fleet().algo.forget(w));
    }
}

/// Merges one message into the store: every key's pushed state, into its entry (made if
/// absent, unless the state says nothing a fresh entry would not).
fn merge<A: Engine, C: Clock>(inner: &Inner<A, C>, payload: &[u8]) {
    let (ctx, algo, store) = (inner.ctx(), &inner.fleet().algo, &inner.store);
    let mut r = Reader::new(payload);
    let header = (r.text(), r.parse::<u64>(), r.parse::<u64>());
    let (Some(from), Some(secs), Some(micros)) = header else {
        ctx.fail(SyncError::Malformed("pushed message"));
        return;
    };
    let now = store.core.clock.now();
    // Saturating: a malformed or hostile message must not overflow (a panic here would end
    // the subscription thread).
    let written = ctx.local(
        secs.saturating_mul(1_000_000_000)
            .saturating_add(micros.saturating_mul(1_000)),
    );
    // Measured once Redis' time is known: before, `written` is this machine's guess, off by
    // its clock's offset (a cold start with clocks 2 s apart read pushes of 2 s).
    if ctx.time_known() {
        let lag = now.saturating_sub(written);
        ctx.stats.push_lag_max.fetch_max(lag, Ordering::Relaxed);
        ctx.stats.messages.fetch_add(1, Ordering::Relaxed);
        ctx.stats.push_lag_sum.fetch_add(lag, Ordering::Relaxed);
    }
    let own = from == ctx.instance;
    if own {
        ctx.heard_own(now);
    }
    let guard = store.map.guard();
    let mut pushes = 0;
    while !r.is_empty() {
        let Some(key) = r.text() else {
            ctx.fail(SyncError::Malformed("pushed key"));
            break;
        };
        match algo.read_push(ctx, key, &mut r, now) {
            Ok(p) => {
                if store.map.get(key, &guard).is_none() {
                    if algo.push_is_idle(ctx, &p, now) {
                        continue;
                    }
                    // Not held here and the store full: kept as what the key owes, as if it
                    // had been evicted, unless a request inserted it meanwhile.
                    let filed = store.owe_if_full(key, || {
                        let mut w = algo.unknown();
                        algo.apply_push(ctx, &mut w, &p, own, now);
                        w
                    });
                    if filed && store.map.get(key, &guard).is_none() {
                        pushes += 1;
                        continue;
                    }
                }
                // Read by the key's quota (GCRA's debt is in its units); a key not held yet
                // owes nothing, and any quota reads its pushed state alike.
                loop {
                    let cell = store.cell(key, &guard);
                    let algo = inner.fleet().quota(cell.quota()).0;
                    if let Some(heard) = store
                        .core
                        .update(cell, |w| algo.apply_push(ctx, w, &p, own, now))
                    {
                        cell.set_stale(false);
                        if let Some(units) = heard.unheard {
                            cell.set_unheard(|_| units);
                        }
                        if heard.republish && cell.enqueue() {
                            ctx.push_key(key, false);
                        }
                        break;
                    }
                    store.remove_dead(key, cell, &guard);
                }
                pushes += 1;
            }
            // The entry was read whole: the next one can be.
            Err(e @ SyncError::ForeignState { .. }) => {
                ctx.stats.errors.fetch_add(1, Ordering::Relaxed);
                ctx.fail(e);
            }
            Err(e) => {
                ctx.fail(e);
                break;
            }
        }
    }
    ctx.stats.pushes.fetch_add(pushes, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::Reader;

    #[test]
    fn a_reader_takes_length_prefixed_fields_whatever_they_hold() {
        let mut r = Reader::new(b"3:a:b0:9:\xe2\x82\xac x:yz:2:17");
        assert_eq!(r.text(), Some("a:b"));
        assert_eq!(r.text(), Some(""));
        assert_eq!(r.bytes(), Some(&b"\xe2\x82\xac x:yz:"[..]));
        assert_eq!(r.parse::<u64>(), Some(17));
        assert!(r.is_empty());
        assert_eq!(r.text(), None);
        // A length past the end, or no length: nothing, never a panic.
        assert_eq!(Reader::new(b"9:abc").text(), None);
        assert_eq!(Reader::new(b"abc").text(), None);
        assert_eq!(Reader::new(b"99999999999999999999999:x").text(), None);
    }
}
