//! The sync thread's connection: one server or a cluster, the RedisLimiter's timeouts and
//! reconnect rule, and one script run for many keys in as few round trips as the target
//! allows (one pipeline on a server; one request per key on a cluster, routed by slot).

use super::super::shared::{cluster_nodes_cmd, info_cluster_cmd, says_cluster};
use super::super::sync::{open_single, Con};
use super::super::{BackendError, Builder};
use ::redis::{Client, ErrorKind, RedisError, Script, Value};
use std::time::Instant;

enum Target {
    Single(Client),
    Cluster(::redis::cluster::ClusterClient),
}

/// One script call: its keys and arguments.
pub(super) struct Call {
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<String>,
}

/// The connection of a hybrid limiter's sync thread (only that thread uses it).
pub(super) struct Link {
    target: Target,
    con: Option<Con>,
    down_until: Option<Instant>,
    reconnect_after: std::time::Duration,
    /// Connect and I/O timeouts.
    timeouts: (std::time::Duration, std::time::Duration),
    /// Round trips so far (pipelines, loads, connects).
    pub(super) round_trips: u64,
}

impl Link {
    /// Connects (asking `INFO cluster` as [`Builder::build`] does): fails if the URL is
    /// invalid or the server cannot be reached now.
    pub(super) fn open<A>(config: &Builder<A>) -> Result<Self, BackendError> {
        let mut round_trips = 0;
        let timeouts = config.timeouts();
        let (target, con) = if config.seeds.is_empty() {
            let client = Client::open(config.url.as_str()).map_err(BackendError::from_redis)?;
            let mut con = open_single(&client, timeouts).map_err(BackendError::from_redis)?;
            round_trips += 2;
            if says_cluster(::redis::ConnectionLike::req_command(
                &mut con,
                &info_cluster_cmd(),
            )) {
                round_trips += 1;
                let nodes = ::redis::ConnectionLike::req_command(&mut con, &cluster_nodes_cmd())
                    .and_then(|v| ::redis::from_redis_value::<String>(&v))
                    .unwrap_or_default();
                (Target::Cluster(config.cluster_client(&nodes)?), None)
            } else {
                (Target::Single(client), Some(Con::Single(con)))
            }
        } else {
            (Target::Cluster(config.cluster_client("")?), None)
        };
        let mut link = Link {
            target,
            con,
            down_until: None,
            reconnect_after: config.reconnect_after,
            timeouts,
            round_trips,
        };
        link.connection()?;
        Ok(link)
    }

    fn connection(&mut self) -> Result<&mut Con, BackendError> {
        if self.con.is_none() {
            if self.down_until.is_some_and(|t| Instant::now() < t) {
                return Err(BackendError::Unavailable);
            }
            self.round_trips += 1;
            let opened = match &self.target {
                Target::Single(client) => open_single(client, self.timeouts).map(Con::Single),
                Target::Cluster(client) => client.get_connection().and_then(|con| {
                    con.set_write_timeout(Some(self.timeouts.1))?;
                    Ok(Con::Cluster(Box::new(con)))
                }),
            };
            match opened {
                Ok(con) => {
                    self.con = Some(con);
                    self.down_until = None;
                }
                Err(e) => {
                    self.down_until = Some(Instant::now() + self.reconnect_after);
                    return Err(BackendError::from_redis(e));
                }
            }
        }
        self.con
            .as_mut()
            .ok_or_else(|| BackendError::Reply("no connection".into()))
    }

    /// Runs `script` once per call, in order, and returns each call's reply or error. A
    /// failure of the connection fails every call not yet answered, and drops the connection
    /// (the next run reconnects).
    pub(super) fn run(
        &mut self,
        script: &Script,
        calls: &[Call],
    ) -> Vec<Result<Value, BackendError>> {
        if calls.is_empty() {
            return Vec::new();
        }
        let out = match self.connection() {
            Err(e) => return calls.iter().map(|_| Err(copy(&e))).collect(),
            Ok(Con::Cluster(_)) => self.run_cluster(script, calls),
            Ok(Con::Single(_)) => self.run_pipeline(script, calls),
        };
        if out
            .iter()
            .any(|r| r.as_ref().is_err_and(BackendError::drops_connection))
        {
            self.con = None;
        }
        out
    }

    /// A cluster: one request per call (each to its key's slot); `invoke` loads the script
    /// on a `NOSCRIPT` (on every primary) and runs the call again.
    fn run_cluster(&mut self, script: &Script, calls: &[Call]) -> Vec<Result<Value, BackendError>> {
        let mut out = Vec::with_capacity(calls.len());
        for call in calls {
            let Some(con) = self.con.as_mut() else {
                out.push(Err(BackendError::Unavailable));
                continue;
            };
            let mut inv = script.prepare_invoke();
            for k in &call.keys {
                inv.key(k);
            }
            for a in &call.args {
                inv.arg(a);
            }
            self.round_trips += 1;
            let r = inv
                .invoke::<Value>(con.like())
                .map_err(BackendError::from_redis);
            if r.as_ref().is_err_and(BackendError::drops_connection) {
                self.con = None;
            }
            out.push(r);
        }
        out
    }

    /// One server: every call in one pipeline (one round trip). Calls answered `NOSCRIPT`
    /// did not run: the script is loaded and those run again, once.
    fn run_pipeline(
        &mut self,
        script: &Script,
        calls: &[Call],
    ) -> Vec<Result<Value, BackendError>> {
        let pipeline = |idx: &mut dyn Iterator<Item = &Call>| {
            let mut pipe = ::redis::pipe();
            for call in idx {
                pipe.cmd("EVALSHA")
                    .arg(script.get_hash())
                    .arg(call.keys.len())
                    .arg(&call.keys)
                    .arg(&call.args);
            }
            pipe
        };
        let Some(con) = self.con.as_mut() else {
            return calls
                .iter()
                .map(|_| Err(BackendError::Unavailable))
                .collect();
        };
        self.round_trips += 1;
        let pipe = pipeline(&mut calls.iter());
        let values =
            match con
                .like()
                .req_packed_commands(&pipe.get_packed_pipeline(), 0, calls.len())
            {
                Ok(v) => v,
                Err(e) => {
                    let e = BackendError::from_redis(e);
                    return calls.iter().map(|_| Err(copy(&e))).collect();
                }
            };
        let mut out: Vec<Result<Value, BackendError>> = values.into_iter().map(reply).collect();
        let missed: Vec<usize> = out
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Err(BackendError::Script(e)) if e.kind() == ErrorKind::NoScriptError))
            .map(|(i, _)| i)
            .collect();
        if missed.is_empty() {
            return out;
        }
        self.round_trips += 2;
        let again = script
            .prepare_invoke()
            .load(con.like())
            .map_err(BackendError::from_redis)
            .and_then(|_| {
                let pipe = pipeline(&mut missed.iter().map(|&i| &calls[i]));
                con.like()
                    .req_packed_commands(&pipe.get_packed_pipeline(), 0, missed.len())
                    .map_err(BackendError::from_redis)
            });
        match again {
            Ok(values) => {
                for (i, v) in missed.into_iter().zip(values) {
                    out[i] = reply(v);
                }
            }
            Err(e) => {
                for i in missed {
                    out[i] = Err(copy(&e));
                }
            }
        }
        out
    }
}

/// A reply, or the server's error in it.
fn reply(v: Value) -> Result<Value, BackendError> {
    v.extract_error().map_err(BackendError::from_redis)
}

/// The same error for every call of a failed round trip (`RedisError` is not `Clone`).
fn copy(e: &BackendError) -> BackendError {
    match e {
        BackendError::Connection(r) => BackendError::Connection(RedisError::from((
            ErrorKind::IoError,
            "connection failed",
            r.to_string(),
        ))),
        BackendError::Script(r) => BackendError::Script(RedisError::from((
            r.kind(),
            "request failed",
            r.to_string(),
        ))),
        BackendError::Reply(s) => BackendError::Reply(s.clone()),
        BackendError::Unavailable => BackendError::Unavailable,
        BackendError::Cost(c) => BackendError::Cost(*c),
        BackendError::TimeOutOfRange(t) => BackendError::TimeOutOfRange(*t),
    }
}
