//! Connections: where they go (one server or a Redis Cluster, found by asking the server at
//! the URL), opening them with the builder's timeouts, and the reconnecting slot that every
//! client holds (a failed connect is not tried again for `reconnect_after`).

use super::{BackendError, RedisBuilder};
use ::redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConnection};
use ::redis::{
    Client, Cmd, Connection, ConnectionAddr, ConnectionInfo, ConnectionLike, IntoConnectionInfo,
    RedisError, RedisResult, Value,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where the connections go: one server, or a Redis Cluster.
pub(super) enum Target {
    Single(Client),
    Cluster(ClusterClient),
}

impl Target {
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(_))
    }
}

/// `INFO cluster`: whether the server is a cluster node.
pub(super) fn info_cluster_cmd() -> ::redis::Cmd {
    let mut cmd = ::redis::cmd("INFO");
    cmd.arg("cluster");
    cmd
}

/// `CLUSTER NODES`: the nodes a cluster node knows, as seeds.
pub(super) fn cluster_nodes_cmd() -> ::redis::Cmd {
    let mut cmd = ::redis::cmd("CLUSTER");
    cmd.arg("NODES");
    cmd
}

/// Whether `INFO cluster`'s reply says `cluster_enabled:1`. An error (a server that renamed
/// `INFO`) reads as standalone.
pub(super) fn says_cluster(reply: Result<Value, RedisError>) -> bool {
    reply
        .and_then(|v| ::redis::from_redis_value::<String>(&v))
        .is_ok_and(|s| s.lines().any(|l| l.trim() == "cluster_enabled:1"))
}

/// The `host:port` of every node in a `CLUSTER NODES` reply that is not marked failed or
/// without address.
fn known_nodes(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let (addr, flags) = (fields.nth(1)?, fields.next()?);
            if flags
                .split(',')
                .any(|f| matches!(f, "fail" | "fail?" | "noaddr" | "handshake"))
            {
                return None;
            }
            // `ip:port@cport[,hostname]`
            let addr = addr.split(['@', ',']).next()?;
            let (host, port) = addr.rsplit_once(':')?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

impl<A> RedisBuilder<A> {
    /// The cluster client: seeded with the URL, the [`seed_nodes`](RedisBuilder::seed_nodes), then
    /// the nodes of `nodes` (a `CLUSTER NODES` reply), with the builder's timeouts. Few
    /// retries and short waits between them, so that a redirection is followed but a failing
    /// node costs a request little more than one timeout (redis-rs' default waits start at
    /// 1.28 s).
    pub(super) fn cluster_client(&self, nodes: &str) -> Result<ClusterClient, BackendError> {
        let first = self
            .url
            .as_str()
            .into_connection_info()
            .map_err(BackendError::from_redis)?;
        let mut seeds = vec![first.clone()];
        for url in &self.seeds {
            seeds.push(
                url.as_str()
                    .into_connection_info()
                    .map_err(BackendError::from_redis)?,
            );
        }
        for (h, p) in known_nodes(nodes) {
            let Some(info) = at_node(&first, h, p) else {
                continue;
            };
            if !seeds.iter().any(|s| s.addr == info.addr) {
                seeds.push(info);
            }
        }
        ClusterClientBuilder::new(seeds)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.io_timeout)
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(5)
            .max_retry_wait(50)
            .build()
            .map_err(BackendError::from_redis)
    }
}

/// The connection `info` (its credentials, TLS, database) to another node, `host:port`;
/// `None` for a Unix socket, which has no other nodes.
pub(super) fn at_node(info: &ConnectionInfo, h: String, p: u16) -> Option<ConnectionInfo> {
    let mut info = info.clone();
    match &mut info.addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            (*host, *port) = (h, p);
        }
        _ => return None,
    }
    Some(info)
}

/// Retries of a cluster request (redirections, reconnects, `TRYAGAIN`).
const CLUSTER_RETRIES: u32 = 3;

impl<A> RedisBuilder<A> {
    /// Where the connections go, asking the server at the URL `INFO cluster` (and, on a
    /// cluster node, `CLUSTER NODES` for seeds) unless seed nodes make it a cluster outright;
    /// with the connection that asked, kept for a single server, and the round trips made.
    pub(super) fn open_target(&self) -> Result<(Target, ConnSlot, u64), BackendError> {
        if !self.seeds.is_empty() {
            return Ok((
                Target::Cluster(self.cluster_client("")?),
                ConnSlot::default(),
                0,
            ));
        }
        let client = Client::open(self.url.as_str()).map_err(BackendError::from_redis)?;
        let mut con = open_single(&client, self.timeouts()).map_err(BackendError::from_redis)?;
        if !says_cluster(con.req_command(&info_cluster_cmd())) {
            let slot = ConnSlot {
                con: Some(Con::Single(con)),
                down_until: None,
            };
            return Ok((Target::Single(client), slot, 1));
        }
        let nodes = con
            .req_command(&cluster_nodes_cmd())
            .and_then(|v| ::redis::from_redis_value::<String>(&v))
            .unwrap_or_default();
        Ok((
            Target::Cluster(self.cluster_client(&nodes)?),
            ConnSlot::default(),
            2,
        ))
    }
}

/// A connection to one server, with the builder's timeouts. A connect (or its handshake)
/// interrupted by a signal is no outage: tried again at once, twice at most (a test's
/// `try_clone` failed on `EINTR` while servers were being started and stopped beside it).
fn open_single(
    client: &Client,
    (connect, io): (Duration, Duration),
) -> Result<Connection, RedisError> {
    let mut tries = 0;
    let con = loop {
        match client.get_connection_with_timeout(connect) {
            Err(e) if tries < 2 && interrupted(&e) => tries += 1,
            opened => break opened?,
        }
    };
    con.set_read_timeout(Some(io))?;
    con.set_write_timeout(Some(io))?;
    Ok(con)
}

/// Whether `e` is a system call interrupted by a signal (`EINTR`).
fn interrupted(e: &RedisError) -> bool {
    std::error::Error::source(e)
        .and_then(|cause| cause.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::Interrupted)
}

/// An open connection: to one server, or to a cluster (one connection per node, routed by
/// key slot, following `MOVED`/`ASK`).
pub(super) enum Con {
    Single(Connection),
    Cluster(Box<ClusterConnection>),
}

impl Con {
    pub(super) fn like(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Con::Single(con) => con,
            Con::Cluster(con) => &mut **con,
        }
    }
}

/// A connection that counts what it sends (a command, a pipeline: one round trip each) in
/// the limiter's `round_trips`, whoever sends it: the script's invocation and its reload
/// included.
pub(super) struct Counted<'c> {
    con: &'c mut dyn ConnectionLike,
    trips: &'c AtomicU64,
}

impl<'c> Counted<'c> {
    pub(super) fn new(con: &'c mut Con, trips: &'c AtomicU64) -> Self {
        Counted {
            con: con.like(),
            trips,
        }
    }

    fn trip(&self) {
        self.trips.fetch_add(1, Ordering::Relaxed);
    }
}

impl ConnectionLike for Counted<'_> {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.trip();
        self.con.req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.trip();
        self.con.req_packed_commands(cmd, offset, count)
    }

    // A cluster connection routes a command by its keys: it is passed on whole.
    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.trip();
        self.con.req_command(cmd)
    }

    fn get_db(&self) -> i64 {
        self.con.get_db()
    }

    fn supports_pipelining(&self) -> bool {
        self.con.supports_pipelining()
    }

    fn check_connection(&mut self) -> bool {
        self.con.check_connection()
    }

    fn is_open(&self) -> bool {
        self.con.is_open()
    }
}

/// The connection, if open, and until when not to try opening one.
#[derive(Default)]
pub(super) struct ConnSlot {
    con: Option<Con>,
    down_until: Option<Instant>,
}

impl ConnSlot {
    /// The open connection, or a new one to `target` with `config`'s timeouts; after a
    /// failed connect, [`BackendError::Unavailable`] at once for
    /// [`reconnect_after`](RedisBuilder::reconnect_after).
    pub(super) fn connection<A>(
        &mut self,
        target: &Target,
        config: &RedisBuilder<A>,
    ) -> Result<&mut Con, BackendError> {
        if self.con.is_none() {
            if self.down_until.is_some_and(|t| Instant::now() < t) {
                return Err(BackendError::Unavailable);
            }
            let opened = match target {
                Target::Single(client) => open_single(client, config.timeouts()).map(Con::Single),
                Target::Cluster(client) => client.get_connection().and_then(|con| {
                    // The read timeout is the client's response timeout.
                    con.set_write_timeout(Some(config.io_timeout))?;
                    Ok(Con::Cluster(Box::new(con)))
                }),
            };
            match opened {
                Ok(con) => {
                    self.con = Some(con);
                    self.down_until = None;
                }
                Err(e) => {
                    self.down_until = Some(Instant::now() + config.reconnect_after);
                    return Err(BackendError::from_redis(e));
                }
            }
        }
        self.con
            .as_mut()
            .ok_or_else(|| BackendError::Reply("no connection".into()))
    }

    /// Drops the connection: the next request opens a new one.
    pub(super) fn drop_connection(&mut self) {
        self.con = None;
    }

    /// The open connection, if any.
    pub(super) fn open(&mut self) -> Option<&mut Con> {
        self.con.as_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::interrupted;
    use redis::RedisError;
    use std::io::{Error, ErrorKind};

    /// Only a call interrupted by a signal is tried again; a refusal or a timeout is an
    /// outage.
    #[test]
    fn only_an_interrupted_call_is_tried_again() {
        let of = |kind: ErrorKind| RedisError::from(Error::from(kind));
        assert!(interrupted(&of(ErrorKind::Interrupted)));
        assert!(!interrupted(&of(ErrorKind::ConnectionRefused)));
        assert!(!interrupted(&of(ErrorKind::TimedOut)));
    }
}
