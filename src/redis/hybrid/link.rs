//! The sync thread's connection: one server or a cluster, the RedisLimiter's timeouts and
//! reconnect rule, and one script run for many keys in as few round trips as the target
//! allows (one pipeline on a server; one request per key on a cluster, routed by slot).

use super::super::shared::{noscript_indices, Target};
use super::super::sync::{Con, Slot};
use super::super::{BackendError, Builder};
use ::redis::{ErrorKind, RedisError, Script, Value};

/// One script call: its keys and arguments.
pub(super) struct Call {
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<String>,
}

/// The connection of a hybrid limiter's sync thread (only that thread uses it): the
/// `RedisLimiter`'s target and reconnecting slot, with its builder's settings.
pub(super) struct Link<A> {
    config: Builder<A>,
    target: Target,
    slot: Slot,
    /// Round trips so far (pipelines, loads, connects).
    pub(super) round_trips: u64,
}

impl<A> Link<A> {
    /// Connects (asking `INFO cluster` as [`Builder::build`] does): fails if the URL is
    /// invalid or the server cannot be reached now.
    pub(super) fn open(config: Builder<A>) -> Result<Self, BackendError> {
        let (target, slot, trips) = config.open_target()?;
        let mut link = Link {
            config,
            target,
            slot,
            round_trips: trips,
        };
        if link.slot.open().is_none() {
            link.round_trips += 1;
            link.slot.connection(&link.target, &link.config)?;
        }
        Ok(link)
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
        let connecting = self.slot.open().is_none();
        let out = match self.slot.connection(&self.target, &self.config) {
            Err(e) => {
                // A connect tried (not one skipped within `reconnect_after`) is a round trip.
                self.round_trips += u64::from(!matches!(e, BackendError::Unavailable));
                return calls.iter().map(|_| Err(copy(&e))).collect();
            }
            Ok(con) => {
                let cluster = matches!(con, Con::Cluster(_));
                self.round_trips += u64::from(connecting);
                if cluster {
                    self.run_cluster(script, calls)
                } else {
                    self.run_pipeline(script, calls)
                }
            }
        };
        if out
            .iter()
            .any(|r| r.as_ref().is_err_and(BackendError::drops_connection))
        {
            self.slot.drop_connection();
        }
        out
    }

    /// A cluster: one request per call (each to its key's slot); `invoke` loads the script
    /// on a `NOSCRIPT` (on every primary) and runs the call again.
    fn run_cluster(&mut self, script: &Script, calls: &[Call]) -> Vec<Result<Value, BackendError>> {
        let mut out = Vec::with_capacity(calls.len());
        for call in calls {
            let Some(con) = self.slot.open() else {
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
                self.slot.drop_connection();
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
        self.round_trips += 1;
        let Some(con) = self.slot.open() else {
            return calls
                .iter()
                .map(|_| Err(BackendError::Unavailable))
                .collect();
        };
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
        // After a SCRIPT FLUSH, the calls answered NOSCRIPT were not run.
        let missed = noscript_indices(&values);
        let mut out: Vec<Result<Value, BackendError>> = values.into_iter().map(reply).collect();
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
