//! What the sync and async clients share: everything but the connection.

use super::scripts;
use super::{BackendError, Builder, FailMode, RedisAlgorithm, MAX_EXPLICIT_NOW};
use crate::decision::Decision;
use crate::error::{check_cost, CostError};
use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::{Client, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisError, Value};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Recently denied keys: `key → (deny until, cost, explicit timeline)`.
struct LocalDeny {
    max: usize,
    map: Mutex<HashMap<String, (u64, u64, bool)>>,
    origin: Instant,
}

impl LocalDeny {
    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn lookup(&self, key: &str, cost: u64, now: u64, explicit: bool) -> Option<Decision> {
        let map = self.map.lock();
        let &(until, c, e) = map.get(key)?;
        (c == cost && e == explicit && until > now).then(|| Decision::denied(until - now))
    }

    fn forget(&self, key: &str) {
        let mut map = self.map.lock();
        if !map.is_empty() {
            map.remove(key);
        }
    }

    fn remember(&self, key: &str, cost: u64, until: u64, explicit: bool) {
        let mut map = self.map.lock();
        if map.len() >= self.max && !map.contains_key(key) {
            let now = self.now();
            map.retain(|_, &mut (u, _, e)| if e { true } else { u > now });
            if map.len() >= self.max {
                // Still full: forget everything rather than grow (only round trips are lost).
                map.clear();
            }
        }
        map.insert(key.to_owned(), (until, cost, explicit));
    }
}

/// One request's time: the server's (µs) or an explicit one (ns).
#[derive(Clone, Copy)]
pub(super) enum At {
    Server,
    Explicit(u64),
}

/// What the sync and async limiters share: the configuration, the script and its SHA1, the
/// parameters, the local fast path and the counters. Everything but the connection.
pub(super) struct Core<A> {
    pub(super) config: Builder<A>,
    script: String,
    sha: Mutex<String>,
    /// ARGV 5.. in microseconds (server time) and in nanoseconds (explicit `now`).
    params_server: Vec<String>,
    params_explicit: Vec<String>,
    local: Option<LocalDeny>,
    round_trips: AtomicU64,
    failures: AtomicU64,
    errors: AtomicU64,
    /// The script's keys: the client's Redis key with each of these appended.
    suffixes: Vec<String>,
}

impl<A: RedisAlgorithm> Core<A> {
    pub(super) fn new(config: Builder<A>) -> Self {
        let mut script = scripts::PRELUDE.replace(
            "EXPLICIT_TTL_MS",
            &super::MIN_EXPLICIT_TTL.as_millis().to_string(),
        );
        let main = config.algo.lua(&mut script, &mut 0);
        script.push_str(&format!("return {main}(KEYS, ARGV, WRITE)\n"));
        Core {
            suffixes: config.algo.key_suffixes(),
            params_server: config.algo.params(1e3),
            params_explicit: config.algo.params(1.0),
            script,
            sha: Mutex::new(String::new()),
            local: config.local.map(|max| LocalDeny {
                max,
                map: Mutex::new(HashMap::new()),
                origin: Instant::now(),
            }),
            round_trips: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            config,
        }
    }

    /// The decision of a script's reply to a request at `at`; a server error anywhere in it
    /// (the reply of an `AllOf` is nested) is the error.
    pub(super) fn decode(&self, v: Value, at: At) -> Result<Decision, BackendError> {
        let v = v.extract_error().map_err(BackendError::from_redis)?;
        self.config.algo.decode(v, at.unit_ns())
    }

    /// The decisions of a pipelined batch: its replies `values`, with `again` (the replies of
    /// the requests at `missed`, run again) in place of their `NOSCRIPT`s.
    pub(super) fn batch_decisions(
        &self,
        mut values: Vec<Value>,
        missed: Vec<usize>,
        again: Vec<Value>,
    ) -> Result<Vec<Decision>, BackendError> {
        for (i, v) in missed.into_iter().zip(again) {
            values[i] = v;
        }
        values
            .into_iter()
            .map(|v| self.decode(v, At::Server))
            .collect()
    }

    /// `prefix + "{" + escape(key) + "}"`: the hash tag keeps every Redis key of one client
    /// key in one cluster slot (for multi-key scripts) while different clients spread over
    /// the nodes. See [`escape`].
    pub(super) fn redis_key(&self, key: &str) -> String {
        redis_key(&self.config.prefix, key)
    }

    pub(super) fn trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests sent to Redis so far.
    pub(super) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Outages answered with the fail mode so far.
    pub(super) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Non-outage errors answered with a denial so far.
    pub(super) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub(super) fn sha(&self) -> String {
        self.sha.lock().clone()
    }

    pub(super) fn load_cmd(&self) -> ::redis::Cmd {
        let mut cmd = ::redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.script);
        cmd
    }

    /// Reads `SCRIPT LOAD`'s reply (the SHA1) and keeps it.
    pub(super) fn loaded(&self, v: Value) -> Result<String, BackendError> {
        let v = v.extract_error().map_err(BackendError::from_redis)?;
        let sha = ::redis::from_redis_value::<String>(&v)
            .map_err(|e| BackendError::Reply(e.to_string()))?;
        *self.sha.lock() = sha.clone();
        Ok(sha)
    }

    pub(super) fn evalsha(
        &self,
        sha: &str,
        key: &str,
        cost: u64,
        at: At,
        write: bool,
    ) -> ::redis::Cmd {
        let mut cmd = ::redis::cmd("EVALSHA");
        let base = self.redis_key(key);
        cmd.arg(sha).arg(self.suffixes.len());
        for suffix in &self.suffixes {
            if suffix.is_empty() {
                cmd.arg(&base);
            } else {
                cmd.arg(format!("{base}{suffix}"));
            }
        }
        let params = match at {
            At::Server => {
                cmd.arg("").arg("1000000");
                &self.params_server
            }
            At::Explicit(now) => {
                cmd.arg(now).arg("1000000000");
                &self.params_explicit
            }
        };
        cmd.arg(cost).arg(if write { "1" } else { "0" });
        for p in params {
            cmd.arg(p.as_str());
        }
        cmd
    }

    /// [`fail_over_outages`](Core::fail_over_outages) for callers that must answer a decision:
    /// an error that is not an outage (a misconfiguration or a bug: a misrouted command, a
    /// wrong type, a bad reply) is the [`error_decision`](Core::error_decision), never an
    /// allow, whatever the fail mode.
    pub(super) fn fail_over(
        &self,
        r: Result<Decision, BackendError>,
    ) -> Result<Decision, CostError> {
        match self.fail_over_outages(r) {
            Ok(d) => Ok(d),
            Err(BackendError::Cost(e)) => Err(e),
            Err(_) => Ok(self.error_decision()),
        }
    }

    /// The one place a backend failure is classified and counted: an outage answers the fail
    /// mode, counted in `failures`; any other backend error is returned, counted in `errors`
    /// (the async trait returns it, so the tower layer answers 503); a cost error is the
    /// caller's, counted nowhere.
    pub(super) fn fail_over_outages(
        &self,
        r: Result<Decision, BackendError>,
    ) -> Result<Decision, BackendError> {
        match r {
            Err(e) if e.is_outage() => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                Ok(self.config.fail_mode.decision())
            }
            Err(e @ BackendError::Cost(_)) => Err(e),
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
            ok => ok,
        }
    }

    /// The denial answered on a non-outage error: the closed fail mode's, else 1 s.
    pub(super) fn error_decision(&self) -> Decision {
        match self.config.fail_mode {
            FailMode::Closed { .. } => self.config.fail_mode.decision(),
            FailMode::Open => Decision::denied(1_000_000_000),
        }
    }

    /// Before the round trip: the cost and time checks, then the local fast path, which may
    /// answer (`Some`).
    pub(super) fn before(
        &self,
        key: &str,
        cost: u64,
        at: At,
        write: bool,
    ) -> Result<Option<Decision>, BackendError> {
        check_cost(cost, self.config.algo.capacity())?;
        if let At::Explicit(now) = at {
            if now > MAX_EXPLICIT_NOW {
                return Err(BackendError::TimeOutOfRange(now));
            }
        }
        let Some(l) = self.local.as_ref().filter(|_| write) else {
            return Ok(None);
        };
        Ok(match at {
            At::Server => l.lookup(key, cost, l.now(), false),
            At::Explicit(now) => l.lookup(key, cost, now, true),
        })
    }

    /// After the round trip: the local fast path learns from Redis' decision.
    pub(super) fn after(&self, key: &str, cost: u64, at: At, write: bool, d: &Decision) {
        let Some(l) = self.local.as_ref().filter(|_| write) else {
            return;
        };
        if d.is_allowed() {
            // The key's state moved: a remembered deadline may now be early.
            l.forget(key);
            return;
        }
        let (now, explicit) = match at {
            // Measured after the reply: Redis decided before this instant.
            At::Server => (l.now(), false),
            At::Explicit(now) => (now, true),
        };
        l.remember(
            key,
            cost,
            now.saturating_add(d.retry_after_nanos()),
            explicit,
        );
    }

    pub(super) fn check_costs(&self, requests: &[(&str, u64)]) -> Result<(), BackendError> {
        for &(_, cost) in requests {
            check_cost(cost, self.config.algo.capacity())?;
        }
        Ok(())
    }

    pub(super) fn pipeline(&self, sha: &str, requests: &[(&str, u64)]) -> ::redis::Pipeline {
        let mut pipe = ::redis::pipe();
        for &(key, cost) in requests {
            pipe.add_command(self.evalsha(sha, key, cost, At::Server, true));
        }
        pipe
    }

    /// The pipeline that runs again the requests at `missed` (indices into `requests`, from
    /// [`noscript_indices`]).
    pub(super) fn retry_pipeline(
        &self,
        sha: &str,
        requests: &[(&str, u64)],
        missed: &[usize],
    ) -> ::redis::Pipeline {
        let again: Vec<(&str, u64)> = missed.iter().map(|&i| requests[i]).collect();
        self.pipeline(sha, &again)
    }
}

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

impl<A> Builder<A> {
    /// The cluster client: seeded with the URL, the [`seed_nodes`](Builder::seed_nodes), then
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
            let mut info = first.clone();
            match &mut info.addr {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    (*host, *port) = (h, p);
                }
                _ => continue,
            }
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

/// Retries of a cluster request (redirections, reconnects, `TRYAGAIN`).
const CLUSTER_RETRIES: u32 = 3;

/// `prefix{escaped key}`: the Redis key of a client key (see the module docs).
pub(super) fn redis_key(prefix: &str, key: &str) -> String {
    let mut k = String::with_capacity(prefix.len() + key.len() + 2);
    k.push_str(prefix);
    k.push('{');
    escape(key, &mut k);
    k.push('}');
    k
}

/// Appends `key` with `%` as `%25` and `}` as `%7D`, and the empty key as a lone `%` (which
/// escaping never yields): injective, and the hash tag is never empty (an empty `{}` would
/// hash the whole key instead).
fn escape(key: &str, out: &mut String) {
    if key.is_empty() {
        out.push('%');
        return;
    }
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

pub(super) fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// `NOSCRIPT`, as a standalone connection returns it (a reply) or a cluster connection (an
/// error).
pub(super) fn is_noscript_result(r: &Result<Value, RedisError>) -> bool {
    match r {
        Ok(v) => is_noscript(v),
        Err(e) => e.kind() == ErrorKind::NoScriptError,
    }
}

/// The requests of a pipelined batch that got `NOSCRIPT` (after a `SCRIPT FLUSH`): they were
/// not run. Their indices in the batch.
pub(super) fn noscript_indices(values: &[Value]) -> Vec<usize> {
    (0..values.len())
        .filter(|&i| is_noscript(&values[i]))
        .collect()
}

impl At {
    /// The scripts' time unit for this request, in nanoseconds.
    pub(super) fn unit_ns(self) -> f64 {
        match self {
            At::Server => 1e3,
            At::Explicit(_) => 1.0,
        }
    }
}

/// Builds the [`Decision`] from one algorithm's reply (a leaf of the script); times in units
/// of `unit_ns` nanoseconds.
/// Server errors were taken out by [`Core::decode`].
pub(super) fn decision(v: Value, unit_ns: f64) -> Result<Decision, BackendError> {
    let bad = || BackendError::Reply(format!("{v:?}"));
    let Value::Array(items) = &v else {
        return Err(bad());
    };
    let [allowed, retry, remaining, reset, rate] = items.as_slice() else {
        return Err(bad());
    };
    let allowed = matches!(allowed, Value::Int(1));
    let field = |x: &Value| -> Result<Option<f64>, BackendError> {
        match x {
            Value::BulkString(b) if b.is_empty() => Ok(None),
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .map(Some)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    };
    // Rounded up: a retry_after from µs arithmetic stays honest in ns. `as` saturates.
    let ns = |x: f64| (x * unit_ns).ceil() as u64;
    let mut d = if allowed {
        Decision::allowed()
    } else {
        Decision::denied(field(retry)?.map_or(0, ns))
    };
    if let Some(r) = field(remaining)? {
        d = d.with_remaining(r as u64);
    }
    if let Some(r) = field(reset)? {
        d = d.with_reset_after(ns(r));
    }
    if let Some(r) = field(rate)? {
        d = d.with_rate(r);
    }
    Ok(d)
}
