//! The sync thread's connection: one server or a cluster, found when Redis first answers (the
//! limiter starts without it), the `RedisLimiter`'s timeouts and reconnect rule, and a round's
//! batches in as few round trips as the target allows (one pipeline on a server; one per node
//! on a cluster, each batch routed by its keys' slot).

use super::super::connection::{Con, ConnSlot, Target};
use super::super::{BackendError, RedisBuilder};
use ::redis::{Cmd, ConnectionLike, Value};
use std::time::Instant;

/// A cluster's primaries by slot, from `CLUSTER SLOTS`: which keys one call may hold.
#[derive(Debug, Default)]
pub(super) struct SlotMap {
    /// `(first slot, last slot, node)`, sorted.
    ranges: Vec<(u16, u16, usize)>,
    /// Each node's `(host, port)`, by its number in `ranges`.
    pub(super) nodes: Vec<(String, u16)>,
    /// Each node's shard tag ([`shard_channel`](SlotMap::shard_channel)), found once.
    tags: Vec<Option<u32>>,
}

impl SlotMap {
    /// From a `CLUSTER SLOTS` reply: `[[first, last, [host, port, ...], replicas...], ...]`.
    pub(super) fn parse(v: &Value) -> Option<SlotMap> {
        let Value::Array(ranges) = v else {
            return None;
        };
        let mut nodes: Vec<(String, u16)> = Vec::new();
        let mut out = Vec::new();
        for r in ranges {
            let Value::Array(r) = r else { return None };
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(primary))) =
                (r.first(), r.get(1), r.get(2))
            else {
                return None;
            };
            let host = ::redis::from_redis_value::<String>(primary.first()?).ok()?;
            let Some(Value::Int(port)) = primary.get(1) else {
                return None;
            };
            let port = u16::try_from(*port).ok()?;
            let node = match nodes.iter().position(|n| n.0 == host && n.1 == port) {
                Some(i) => i,
                None => {
                    nodes.push((host, port));
                    nodes.len() - 1
                }
            };
            out.push((
                u16::try_from(*first).ok()?,
                u16::try_from(*last).ok()?,
                node,
            ));
        }
        out.sort_unstable();
        let mut map = SlotMap {
            ranges: out,
            tags: vec![None; nodes.len()],
            nodes,
        };
        // The least tag of each node's slots: a search of a few tags a node, once a map.
        let mut left = map.nodes.len();
        for t in 0u32..1 << 20 {
            if left == 0 {
                break;
            }
            if let Some(node) = map.node(tag_slot(t.to_string().as_bytes())) {
                if map.tags[node].is_none() {
                    map.tags[node] = Some(t);
                    left -= 1;
                }
            }
        }
        Some(map)
    }

    /// The shard channel of `node` for the channel `base`: `{t}` then `base`, for the least
    /// `t` (0, 1, 2...) whose slot the node serves. Every instance reading the same map
    /// names the same channel, a script running on the node may `SPUBLISH` to it (a slot of
    /// its own node), and a message on it stays in the node's shard instead of crossing the
    /// cluster's bus, whose links hold a message behind one not yet acknowledged (a delayed
    /// ACK, ~40 ms). `None` if the node serves no slot.
    pub(super) fn shard_channel(&self, node: usize, base: &str) -> Option<String> {
        self.tags
            .get(node)
            .copied()
            .flatten()
            .map(|t| format!("{{{t}}}{base}"))
    }

    pub(super) fn node(&self, slot: u16) -> Option<usize> {
        let i = self
            .ranges
            .partition_point(|r| r.0 <= slot)
            .checked_sub(1)?;
        let (_, last, node) = self.ranges[i];
        (slot <= last).then_some(node)
    }
}

/// A key's slot: CRC16 (XMODEM) of its hash tag (what is between the first `{` and the next
/// `}`, if not empty) or of the whole key, modulo 16384: the rule of the Redis Cluster spec.
pub(super) fn key_slot(key: &str) -> u16 {
    let k = key.as_bytes();
    let tag = k.iter().position(|&b| b == b'{').and_then(|open| {
        let close = k[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &k[open + 1..open + 1 + close])
    });
    tag_slot(tag.unwrap_or(k))
}

/// The slot of a hash tag (or of a whole key without one).
fn tag_slot(tag: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag) % 16384
}

/// The connection of a hybrid limiter's sync thread (only that thread uses it).
pub(super) struct Link<A> {
    config: RedisBuilder<A>,
    /// Found at the first connect that succeeds.
    target: Option<Target>,
    slot: ConnSlot,
    /// On a cluster, the slot map, once asked for (`None` again after an error, which may be
    /// a slot that moved).
    slots: Option<SlotMap>,
    /// After a failed first connect, when to try again.
    down_until: Option<Instant>,
    /// Round trips so far (pipelines, connects).
    pub(super) round_trips: u64,
    /// The script with the cluster's flag, made once (a link runs one script).
    flagged: Option<String>,
}

impl<A> Link<A> {
    /// A link that connects at its first run.
    pub(super) fn new(config: RedisBuilder<A>) -> Self {
        Link {
            config,
            target: None,
            slot: ConnSlot::default(),
            slots: None,
            down_until: None,
            round_trips: 0,
            flagged: None,
        }
    }

    /// On a cluster, its slot map (asked for if not known); `None` if the target is not a
    /// cluster, or the map could not be had.
    pub(super) fn slot_map(&mut self) -> Option<&SlotMap> {
        if !self.is_cluster() {
            return None;
        }
        if self.slots.is_none() {
            let Ok(Con::Cluster(c)) = self.connection() else {
                return None;
            };
            let reply = c.req_command(::redis::cmd("CLUSTER").arg("SLOTS")).ok()?;
            self.round_trips += 1;
            self.slots = SlotMap::parse(&reply);
        }
        self.slots.as_ref()
    }

    /// `EVAL script 1 key`, to which a batch appends its arguments. On a cluster a call
    /// holds one node's keys, of several slots: the script says so. (EVAL, not EVALSHA: the
    /// body is small beside a round's keys, Redis caches its compiled form, and a flushed
    /// script cache or a new cluster node needs no reload.)
    pub(super) fn eval(&mut self, script: &str, key: &str) -> Cmd {
        let mut cmd = ::redis::cmd("EVAL");
        if self.is_cluster() {
            cmd.arg(
                self.flagged
                    .get_or_insert_with(|| format!("#!lua flags=allow-cross-slot-keys\n{script}"))
                    .as_str(),
            );
        } else {
            cmd.arg(script);
        }
        cmd.arg(1).arg(key);
        cmd
    }

    /// Whether the target is a cluster (batches must then hold one slot's keys each);
    /// `false` until known.
    pub(super) fn is_cluster(&self) -> bool {
        self.target.as_ref().is_some_and(Target::is_cluster)
    }

    /// Connects if not connected (the error comes again with the run), so that
    /// [`is_cluster`](Link::is_cluster) knows.
    pub(super) fn connect(&mut self) {
        let _ = self.connection();
    }

    fn connection(&mut self) -> Result<&mut Con, BackendError> {
        if self.target.is_none() {
            if self.down_until.is_some_and(|t| Instant::now() < t) {
                return Err(BackendError::Unavailable);
            }
            self.round_trips += 1;
            match self.config.open_target() {
                Ok((target, slot, trips)) => {
                    self.round_trips += trips.saturating_sub(1);
                    self.target = Some(target);
                    self.slot = slot;
                }
                Err(e) => {
                    self.down_until = Some(Instant::now() + self.config.reconnect_after);
                    return Err(e);
                }
            }
        }
        let target = self.target.as_ref().ok_or(BackendError::Unavailable)?;
        if self.slot.open().is_none() {
            match self.slot.connection(target, &self.config) {
                // A connect tried (not one skipped within `reconnect_after`) is a round trip.
                Err(BackendError::Unavailable) => return Err(BackendError::Unavailable),
                Err(e) => {
                    self.round_trips += 1;
                    return Err(e);
                }
                Ok(_) => self.round_trips += 1,
            }
        }
        self.slot.open().ok_or(BackendError::Unavailable)
    }

    /// Runs `cmds` (a round's script calls, then its other commands) in one pipeline, and
    /// returns each one's reply or error. A failure of the connection fails every one not yet
    /// answered and drops the connection (the next run reconnects).
    pub(super) fn run(&mut self, cmds: Vec<Cmd>) -> Vec<Result<Value, BackendError>> {
        let n = cmds.len();
        if n == 0 {
            return Vec::new();
        }
        let con = match self.connection() {
            Ok(c) => c,
            Err(e) => return (0..n).map(|_| Err(e.copied())).collect(),
        };
        let values = match con {
            Con::Cluster(c) => {
                let mut pipe = ::redis::cluster::cluster_pipe();
                for cmd in cmds {
                    pipe.add_command(cmd);
                }
                pipe.query::<Vec<Value>>(c)
            }
            Con::Single(c) => {
                let mut pipe = ::redis::pipe();
                for cmd in cmds {
                    pipe.add_command(cmd);
                }
                c.req_packed_commands(&pipe.get_packed_pipeline(), 0, n)
            }
        };
        let out: Vec<Result<Value, BackendError>> = match values {
            Ok(values) => values.into_iter().map(reply).collect(),
            Err(e) => {
                let e = BackendError::from_redis(e);
                (0..n).map(|_| Err(e.copied())).collect()
            }
        };
        self.round_trips += 1;
        if out.iter().any(Result::is_err) {
            // A slot may have moved.
            self.slots = None;
        }
        if out
            .iter()
            .any(|r| r.as_ref().is_err_and(BackendError::drops_connection))
        {
            self.slot.drop_connection();
        }
        out
    }
}

/// A reply, or the server's error in it.
fn reply(v: Value) -> Result<Value, BackendError> {
    v.extract_error().map_err(BackendError::from_redis)
}

#[cfg(test)]
mod tests {
    use super::{key_slot, SlotMap};
    use ::redis::Value;

    #[test]
    fn slots_follow_the_cluster_spec() {
        // The spec's examples: CRC16 of "123456789" is 0x31C3.
        assert_eq!(key_slot("123456789"), 0x31c3);
        // A hash tag decides; an empty one does not.
        assert_eq!(key_slot("p:{user1}:h"), key_slot("user1"));
        assert_eq!(key_slot("{}x"), key_slot("{}x"));
        assert_ne!(key_slot("a{}b"), key_slot(""));
        assert_eq!(key_slot("foo{bar}{zap}"), key_slot("bar"));
    }

    /// Each node's shard channel is in a slot of its own, the same for any instance reading
    /// the map (whatever order it lists the ranges in), whatever braces the prefix holds.
    #[test]
    fn each_nodes_shard_channel_is_in_a_slot_it_serves() {
        let range = |first: i64, last: i64, port: i64| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(last),
                Value::Array(vec![
                    Value::BulkString(b"127.0.0.1".to_vec()),
                    Value::Int(port),
                ]),
            ])
        };
        let ranges = [
            range(0, 5460, 7000),
            range(5461, 8191, 7001),
            // A node of one slot.
            range(8192, 8192, 7003),
            range(8193, 10922, 7001),
            range(10923, 16383, 7002),
        ];
        let map = SlotMap::parse(&Value::Array(ranges.to_vec())).unwrap();
        let reversed =
            SlotMap::parse(&Value::Array(ranges.iter().rev().cloned().collect())).unwrap();
        let base = "p{user}:~sync";
        let mut names = Vec::new();
        for node in 0..map.nodes.len() {
            let channel = map.shard_channel(node, base).unwrap();
            assert!(channel.ends_with(base), "{channel}");
            assert_eq!(map.node(key_slot(&channel)), Some(node), "{channel}");
            let same = (0..reversed.nodes.len()).find(|&n| reversed.nodes[n] == map.nodes[node]);
            assert_eq!(
                reversed.shard_channel(same.unwrap(), base),
                Some(channel.clone())
            );
            names.push(channel);
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 4);
    }
}
