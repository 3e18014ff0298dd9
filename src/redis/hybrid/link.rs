//! The sync thread's connection: one server or a cluster, found when Redis first answers (the
//! limiter starts without it), the `RedisLimiter`'s timeouts and reconnect rule, and a round's
//! batches in as few round trips as the target allows (one pipeline on a server; one per node
//! on a cluster, each batch routed by its keys' slot).

use super::super::shared::Target;
use super::super::sync::{Con, Slot};
use super::super::{BackendError, Builder};
use ::redis::{ConnectionLike, ErrorKind, RedisError, Value};
use std::time::Instant;

/// One script call: its keys and arguments (every key in one slot).
#[derive(Debug)]
pub(super) struct Batch {
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<String>,
}

/// The connection of a hybrid limiter's sync thread (only that thread uses it).
pub(super) struct Link<A> {
    config: Builder<A>,
    /// Found at the first connect that succeeds.
    target: Option<Target>,
    slot: Slot,
    /// After a failed first connect, when to try again.
    down_until: Option<Instant>,
    /// Round trips so far (pipelines, connects).
    pub(super) round_trips: u64,
}

impl<A> Link<A> {
    /// A link that connects at its first run.
    pub(super) fn new(config: Builder<A>) -> Self {
        Link {
            config,
            target: None,
            slot: Slot::default(),
            down_until: None,
            round_trips: 0,
        }
    }

    /// Whether the target is a cluster (batches must then hold one slot's keys each);
    /// `false` until known.
    pub(super) fn is_cluster(&self) -> bool {
        self.target.as_ref().is_some_and(Target::is_cluster)
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

    /// Runs `script` once per batch and returns each batch's reply or error. A failure of
    /// the connection fails every batch not yet answered and drops the connection (the next
    /// run reconnects).
    pub(super) fn run(
        &mut self,
        script: &str,
        batches: &[Batch],
    ) -> Vec<Result<Value, BackendError>> {
        if batches.is_empty() {
            return Vec::new();
        }
        let con = match self.connection() {
            Ok(c) => c,
            Err(e) => return batches.iter().map(|_| Err(copy(&e))).collect(),
        };
        // EVAL, not EVALSHA: the body is small beside a round's keys, Redis caches its
        // compiled form, and a flushed script cache or a new cluster node needs no reload.
        let eval = |b: &Batch| {
            let mut cmd = ::redis::cmd("EVAL");
            cmd.arg(script).arg(b.keys.len()).arg(&b.keys).arg(&b.args);
            cmd
        };
        let values = match con {
            Con::Cluster(c) => {
                let mut pipe = ::redis::cluster::cluster_pipe();
                for b in batches {
                    pipe.add_command(eval(b));
                }
                pipe.query::<Vec<Value>>(c)
            }
            Con::Single(c) => {
                let mut pipe = ::redis::pipe();
                for b in batches {
                    pipe.add_command(eval(b));
                }
                c.req_packed_commands(&pipe.get_packed_pipeline(), 0, batches.len())
            }
        };
        let out: Vec<Result<Value, BackendError>> = match values {
            Ok(values) => values.into_iter().map(reply).collect(),
            Err(e) => {
                let e = BackendError::from_redis(e);
                batches.iter().map(|_| Err(copy(&e))).collect()
            }
        };
        self.round_trips += 1;
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

/// The same error for every batch of a failed round trip (`RedisError` is not `Clone`).
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
        BackendError::Config(c) => BackendError::Config(c.clone()),
    }
}
