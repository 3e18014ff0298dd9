//! What the sync and async clients share: everything but the connection.

use super::keys::redis_key;
use super::local_deny::LocalDeny;
use super::lua;
use super::{BackendError, FailMode, RedisAlgorithm, RedisBuilder, BATCH_TRIP, MAX_EXPLICIT_NOW};
use crate::decision::{Decision, Ticket};
use crate::error::{check_cost, QuotaError};
use crate::request::Ask;
use ::redis::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Each request's answer in a pipelined batch.
pub(super) type Answers = Vec<Result<Decision, BackendError>>;

/// One argument of a script call: a parameter kept as text, one made for the request, or a
/// number.
enum ScriptArg<'a> {
    Str(&'a str),
    Owned(String),
    Int(u64),
}

impl ::redis::ToRedisArgs for ScriptArg<'_> {
    fn write_redis_args<W: ?Sized + ::redis::RedisWrite>(&self, out: &mut W) {
        match self {
            ScriptArg::Str(s) => s.write_redis_args(out),
            ScriptArg::Owned(s) => s.write_redis_args(out),
            ScriptArg::Int(n) => n.write_redis_args(out),
        }
    }
}

/// One request's time: the server's (µs) or an explicit one (ns).
#[derive(Clone, Copy)]
pub(super) enum At {
    Server,
    Explicit(u64),
}

impl At {
    /// `at`, or the server's clock.
    pub(super) fn of(at: Option<u64>) -> At {
        at.map_or(At::Server, At::Explicit)
    }

    /// The scripts' time unit for this request, in nanoseconds.
    pub(super) fn unit_ns(self) -> f64 {
        match self {
            At::Server => 1e3,
            At::Explicit(_) => 1.0,
        }
    }
}

/// What one script call does (ARGV 4; see `lua.rs`).
#[derive(Clone, Copy)]
pub(super) enum Mode {
    Peek,
    Check,
    /// A check whose reply carries the time it was decided: for a ticket.
    Take,
    /// A partial grant of up to the request's cost.
    UpTo,
    /// Settles the reservation `id` taken at `taken_at` (ns) with the `actual` cost; the
    /// request's cost is the charged one.
    Settle {
        taken_at: u64,
        actual: u64,
        id: u128,
    },
}

impl Mode {
    /// Whether the request counts (so the local fast path may answer it and learns from it).
    fn counts(self) -> bool {
        matches!(self, Mode::Check | Mode::Take)
    }
}

/// One script call: `cost` for `key` at `at`, under `quota` (the limiter's own if `None`).
pub(super) struct Req<'a, A> {
    pub(super) key: &'a str,
    pub(super) cost: u64,
    pub(super) at: At,
    pub(super) mode: Mode,
    pub(super) quota: Option<&'a A>,
}

// By hand: a derive would ask `A: Copy`, and only a reference to it is held.
impl<A> Clone for Req<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Req<'_, A> {}

impl<'a, A> Req<'a, A> {
    pub(super) fn new(key: &'a str, cost: u64, at: At, mode: Mode) -> Self {
        Req {
            key,
            cost,
            at,
            mode,
            quota: None,
        }
    }
}

/// A script's reply, by its request's [`Mode`].
pub(super) enum Reply {
    /// A check's or a peek's.
    Decided(Decision),
    /// A take's: the decision and when it was made (ns on the request's timeline).
    Taken(Decision, u64),
    /// A partial grant's: the units granted and the decision.
    Granted(u64, Decision),
    /// A settle's: whether it applied (false: the reservation was settled already).
    Settled(bool),
}

impl Reply {
    /// A partial grant's units and decision (a local fast-path denial grants none).
    pub(super) fn granted(self) -> Result<(u64, Decision), BackendError> {
        match self {
            Reply::Granted(n, d) => Ok((n, d)),
            Reply::Decided(d) if d.is_denied() => Ok((0, d)),
            _ => Err(BackendError::Reply("not a grant".into())),
        }
    }

    /// Whether a settle applied.
    pub(super) fn settled(self) -> Result<bool, BackendError> {
        match self {
            Reply::Settled(b) => Ok(b),
            _ => Err(BackendError::Reply("not a settle".into())),
        }
    }

    /// The decision of a check, a peek or a take.
    pub(super) fn decision(self) -> Result<Decision, BackendError> {
        match self {
            Reply::Decided(d) | Reply::Taken(d, _) => Ok(d),
            _ => Err(BackendError::Reply("not a decision".into())),
        }
    }
}

/// What the sync and async limiters share: the configuration, the script (a `redis::Script`:
/// its SHA1 computed once, loaded by redis-rs), the parameters, the local fast path and the
/// counters. Everything but the connection.
pub(super) struct ClientCore<A> {
    pub(super) config: RedisBuilder<A>,
    pub(super) script: ::redis::Script,
    /// The same functions behind the hierarchy's tail (`levels.rs`).
    pub(super) levels_script: ::redis::Script,
    /// ARGV 5.. in microseconds (server time) and in nanoseconds (explicit `now`).
    pub(super) params_server: Vec<String>,
    pub(super) params_explicit: Vec<String>,
    pub(super) local: Option<LocalDeny>,
    round_trips: AtomicU64,
    failures: AtomicU64,
    errors: AtomicU64,
    /// The script's keys: the client's Redis key with each of these appended.
    pub(super) suffixes: Vec<String>,
    /// Reservation ids: a random seed per client and a counter, so ids are unique across
    /// the fleet's clients (128 bits) without coordination.
    id_seed: u64,
    ids: AtomicU64,
}

/// 64 random bits from the standard library's randomly keyed hasher (no RNG dependency): its
/// keys come from the OS's entropy, and each call in a thread draws new ones, so no two
/// processes or calls share a seed (a generator seeded by the clock and the thread id can:
/// see the hybrid limiter's instance id).
pub(super) fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

impl<A: RedisAlgorithm> ClientCore<A> {
    pub(super) fn new(config: RedisBuilder<A>) -> Self {
        let mut functions = lua::PRELUDE.replace(
            "EXPLICIT_TTL_MS",
            &super::MIN_EXPLICIT_TTL.as_millis().to_string(),
        );
        let main = config.algo.lua(&mut functions, &mut 0);
        // In the tail and in any algorithm's body (the in-flight permits keep a mark longer).
        let script = |tail: &str| {
            let script = functions.clone() + &tail.replace("MAIN", &main);
            let script = script
                .replace(
                    "SETTLE_MARK_MS",
                    &super::SETTLE_MARK_TTL.as_millis().to_string(),
                )
                .replace(
                    "MARK_CLOCK_MARGIN_MS",
                    &super::MARK_CLOCK_MARGIN.as_millis().to_string(),
                );
            ::redis::Script::new(&script)
        };
        ClientCore {
            ids: AtomicU64::new(0),
            id_seed: random_seed(),
            suffixes: config.algo.key_suffixes(),
            params_server: config.algo.params(1e3),
            params_explicit: config.algo.params(1.0),
            script: script(lua::TAIL),
            levels_script: script(lua::LEVELS),
            local: config.local.map(LocalDeny::new),
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

    /// The reply to `req`, by its mode (see [`Reply`]).
    pub(super) fn decode_reply(&self, v: Value, req: &Req<'_, A>) -> Result<Reply, BackendError> {
        let v = v.extract_error().map_err(BackendError::from_redis)?;
        let bad = |v: &Value| BackendError::Reply(format!("{v:?}"));
        let unit = req.at.unit_ns();
        Ok(match req.mode {
            Mode::Peek | Mode::Check => Reply::Decided(self.config.algo.decode(v, unit)?),
            Mode::Settle { .. } => match v {
                Value::Int(n) => Reply::Settled(n == 1),
                v => return Err(bad(&v)),
            },
            Mode::Take | Mode::UpTo => {
                let Value::Array(mut pair) = v else {
                    return Err(bad(&v));
                };
                let (Some(r), Some(first), None) = (pair.pop(), pair.pop(), pair.pop()) else {
                    return Err(bad(&Value::Array(pair)));
                };
                let d = self.config.algo.decode(r, unit)?;
                match (req.mode, first) {
                    // Never more than asked: a reply says what the script counted, and the
                    // script counts at most the request's cost.
                    (Mode::UpTo, Value::Int(n)) if n >= 0 && n as u64 <= req.cost => {
                        Reply::Granted(n as u64, d)
                    }
                    (Mode::Take, Value::BulkString(b)) => {
                        let now = std::str::from_utf8(&b)
                            .ok()
                            .and_then(|s| s.parse::<f64>().ok())
                            .ok_or_else(|| BackendError::Reply(format!("{b:?}")))?;
                        // Whole time units below 2^53: exact, µs to ns exactly too.
                        Reply::Taken(d, (now * unit) as u64)
                    }
                    (_, first) => return Err(bad(&first)),
                }
            }
        })
    }

    /// The quota of a `_with` request: one that reads the limiter's states, else the error.
    /// `ask` for `key` as one script call in `mode`: its quota checked against the states
    /// this limiter keeps, at its instant (else the server's clock). A partial grant's cost
    /// is capped at the quota's capacity; 0 is an error.
    pub(super) fn ask<'a>(
        &self,
        key: &'a str,
        ask: Ask<'a, A>,
        mode: Mode,
    ) -> Result<Req<'a, A>, BackendError> {
        let algo = match ask.quota {
            Some(quota) => {
                self.config.algo.check_quota(quota)?;
                quota
            }
            None => &self.config.algo,
        };
        let mut cost = ask.cost;
        if matches!(mode, Mode::UpTo) {
            if cost == 0 {
                return Err(QuotaError::ZeroCost.into());
            }
            cost = cost.min(algo.capacity());
        }
        let req = Req::new(key, cost, At::of(ask.at), mode);
        Ok(Req {
            quota: ask.quota,
            ..req
        })
    }

    /// The settle of `ticket` with `actual`, or, without a round trip, the answer: `false`
    /// for a ticket already closed (settled, or denied), `true` for an open one settled at
    /// its charged cost (nothing to change). The caller closes the ticket once answered.
    pub(super) fn settle_req<'a>(
        &self,
        key: &'a str,
        ticket: &Ticket,
        actual: u64,
        at: Option<u64>,
    ) -> Result<Req<'a, A>, bool> {
        if !ticket.is_open() || actual == ticket.charged() {
            return Err(ticket.is_open());
        }
        let (taken_at, id) = (ticket.taken_at(), ticket.id());
        let mode = Mode::Settle {
            taken_at,
            actual,
            id,
        };
        Ok(Req::new(key, ticket.charged(), At::of(at), mode))
    }

    /// The ticket of a take's reply (a local fast-path denial holds nothing), bound to the
    /// key's Redis key: any client of the same prefix may settle it, as Redis keeps the state.
    pub(super) fn ticket(&self, req: &Req<'_, A>, reply: Reply) -> Result<Ticket, BackendError> {
        let print = self.key_print(req.key);
        match reply {
            Reply::Taken(d, at) => {
                Ok(Ticket::issue(d, req.cost, at, 0, print).with_id(self.next_id()))
            }
            Reply::Decided(d) if d.is_denied() => Ok(Ticket::issue(d, req.cost, 0, 0, print)),
            _ => Err(BackendError::Reply("not a take".into())),
        }
    }

    /// Whether `ticket` was taken for `key` by a client of this prefix.
    pub(super) fn check_ticket(&self, key: &str, ticket: &Ticket) -> Result<(), BackendError> {
        ticket
            .check_origin(0, self.key_print(key))
            .map_err(|e| match e {
                QuotaError::TicketForOtherKey => BackendError::TicketForOtherKey,
                _ => BackendError::TicketFromOtherLimiter,
            })
    }

    /// What binds a ticket to `key` under this prefix: the pair's hash (the Redis key, built
    /// from the same two, is not allocated for it).
    fn key_print(&self, key: &str) -> u64 {
        crate::shared::key_print(&(self.config.prefix.as_str(), key))
    }

    /// A new reservation id, unique across clients.
    pub(super) fn next_id(&self) -> u128 {
        ((self.id_seed as u128) << 64) | self.ids.fetch_add(1, Ordering::Relaxed) as u128
    }

    /// Each answer of a pipelined batch: its replies `values`, with `again` (the replies of
    /// the requests at `missed`, run again) in place of their `NOSCRIPT`s.
    pub(super) fn batch_decisions(
        &self,
        mut values: Vec<Value>,
        missed: Vec<usize>,
        again: Vec<Value>,
    ) -> Answers {
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
    /// the nodes. See `keys::escape`.
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

    /// The script's keys and arguments for `req`, in order.
    fn script_call<'r>(&'r self, req: &'r Req<'_, A>) -> (Vec<String>, Vec<ScriptArg<'r>>) {
        let base = self.redis_key(req.key);
        let settle = match req.mode {
            Mode::Settle {
                taken_at,
                actual,
                id,
            } => Some((taken_at, actual, id)),
            _ => None,
        };
        let mut keys: Vec<String> = self
            .suffixes
            .iter()
            .map(|suffix| format!("{base}{suffix}"))
            .collect();
        if let Some((_, _, id)) = settle {
            // The reservation's mark: under the client key's hash tag, so in its slot.
            keys.push(format!("{base}:s:{id:032x}"));
        }
        let mut args = Vec::with_capacity(8);
        let own = match req.at {
            At::Server => {
                args.extend([ScriptArg::Str(""), ScriptArg::Str("1000000")]);
                &self.params_server
            }
            At::Explicit(now) => {
                args.extend([ScriptArg::Int(now), ScriptArg::Str("1000000000")]);
                &self.params_explicit
            }
        };
        let mode = match req.mode {
            Mode::Peek => "0",
            Mode::Check => "1",
            Mode::Take => "t",
            Mode::UpTo => "u",
            Mode::Settle { .. } => "s",
        };
        args.extend([ScriptArg::Int(req.cost), ScriptArg::Str(mode)]);
        match req.quota {
            None => args.extend(own.iter().map(|p| ScriptArg::Str(p.as_str()))),
            Some(q) => args.extend(q.params(req.at.unit_ns()).into_iter().map(ScriptArg::Owned)),
        }
        if let Some((taken_at, actual, _)) = settle {
            // The take's time in the request's unit: a server-time ticket holds µs × 1000.
            let taken = match req.at {
                At::Server => taken_at / 1000,
                At::Explicit(_) => taken_at,
            };
            args.extend([ScriptArg::Int(taken), ScriptArg::Int(actual)]);
        }
        (keys, args)
    }

    /// The script's invocation for `req`: redis-rs sends `EVALSHA`, and on `NOSCRIPT` (a
    /// restart, a failover, a `SCRIPT FLUSH`) loads the script and sends it again.
    pub(super) fn invocation(&self, req: &Req<'_, A>) -> ::redis::ScriptInvocation<'_> {
        let (keys, args) = self.script_call(req);
        let mut invocation = self.script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for arg in args {
            invocation.arg(arg);
        }
        invocation
    }

    /// The counter of requests sent to Redis, for a [`Counted`](super::connection::Counted)
    /// connection.
    pub(super) fn trips(&self) -> &AtomicU64 {
        &self.round_trips
    }

    /// [`fail_over_outages`](ClientCore::fail_over_outages) for callers that must answer a decision:
    /// an error that is not an outage (a misconfiguration or a bug: a misrouted command, a
    /// wrong type, a bad reply) is the [`error_decision`](ClientCore::error_decision), never an
    /// allow, whatever the fail mode.
    pub(super) fn fail_over(
        &self,
        r: Result<Decision, BackendError>,
    ) -> Result<Decision, QuotaError> {
        self.fail_over_n(r, 1)
    }

    /// [`fail_over`](ClientCore::fail_over) for an answer that stands for `n` requests (a
    /// batch's failed round trip): counted `n` times.
    pub(super) fn fail_over_n(
        &self,
        r: Result<Decision, BackendError>,
        n: u64,
    ) -> Result<Decision, QuotaError> {
        match self.fail_over_outages_n(r, n) {
            Ok(d) => Ok(d),
            Err(BackendError::Cost(e)) => Err(e),
            Err(_) => Ok(self.error_decision()),
        }
    }

    /// How a backend failure answers a request: an outage answers the fail mode; any other
    /// backend error is returned (the async trait returns it, so the tower layer answers 503);
    /// a cost error is the caller's. See [`fail_over_outages_n`](ClientCore::fail_over_outages_n).
    pub(super) fn fail_over_outages(
        &self,
        r: Result<Decision, BackendError>,
    ) -> Result<Decision, BackendError> {
        self.fail_over_outages_n(r, 1)
    }

    /// The one place a backend failure is classified and counted, for an answer that stands
    /// for `n` requests: an outage in `failures`, any other backend error in `errors`, a cost
    /// error nowhere.
    fn fail_over_outages_n(
        &self,
        r: Result<Decision, BackendError>,
        n: u64,
    ) -> Result<Decision, BackendError> {
        match r {
            Err(e) if e.is_outage() => {
                self.failures.fetch_add(n, Ordering::Relaxed);
                Ok(self.config.fail_mode.decision())
            }
            Err(e @ BackendError::Cost(_)) => Err(e),
            Err(e) => {
                self.errors.fetch_add(n, Ordering::Relaxed);
                Err(e)
            }
            ok => ok,
        }
    }

    /// The denial answered on a non-outage error: the closed fail mode's, else 1 s.
    pub(super) fn error_decision(&self) -> Decision {
        match self.config.fail_mode {
            FailMode::Closed { .. } => self.config.fail_mode.decision(),
            FailMode::Open => Decision::denied(Duration::from_secs(1)),
        }
    }

    /// Before the round trip: the quota, cost and time checks, then the local fast path,
    /// which may answer a counted request (`Some`).
    pub(super) fn before(&self, req: &Req<'_, A>) -> Result<Option<Decision>, BackendError> {
        // A settle's charged cost was admitted by its take; a partial grant's is capped at
        // the capacity by its method.
        if !matches!(req.mode, Mode::Settle { .. }) {
            check_cost(req.cost, req.quota.unwrap_or(&self.config.algo).capacity())?;
        }
        if let At::Explicit(now) = req.at {
            if now > MAX_EXPLICIT_NOW {
                return Err(BackendError::TimeOutOfRange(now));
            }
        }
        // What it remembers are denials under the limiter's own quota: a request's own quota
        // (a plan) may admit what that one denies, so it always asks Redis.
        let Some(l) = self
            .local
            .as_ref()
            .filter(|_| req.mode.counts() && req.quota.is_none())
        else {
            return Ok(None);
        };
        let (key, cost) = (req.key, req.cost);
        Ok(match req.at {
            At::Server => l.lookup(key, cost, l.now(), false),
            At::Explicit(now) => l.lookup(key, cost, now, true),
        })
    }

    /// After the round trip: the local fast path learns from Redis' reply. A settle may
    /// refund, so the key's remembered denial may now be late: it is forgotten.
    pub(super) fn after(&self, req: &Req<'_, A>, reply: &Reply) {
        let Some(l) = self.local.as_ref() else {
            return;
        };
        let (cost, d) = match reply {
            Reply::Decided(d) | Reply::Taken(d, _) if req.mode.counts() => (req.cost, d),
            Reply::Granted(_, d) => (1, d),
            Reply::Settled(true) => return l.forget(req.key),
            _ => return,
        };
        let (key, at) = (req.key, req.at);
        if d.is_allowed() {
            // The key's state moved: a remembered deadline may now be early.
            l.forget(key);
            return;
        }
        if req.quota.is_some() {
            // A denial under a request's own quota says nothing of the limiter's.
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
            now.saturating_add(u64::try_from(d.retry_after().as_nanos()).unwrap_or(u64::MAX)),
            explicit,
        );
    }

    /// A batch of cost-1 answers as `check` gives them: cost 1 is always valid, so an error
    /// (none comes) would be the fail mode's decision.
    pub(super) fn batch_of_ones(
        &self,
        answers: Vec<Result<Decision, QuotaError>>,
        out: &mut Vec<Decision>,
    ) {
        out.clear();
        let fail_mode = self.config.fail_mode.decision();
        out.extend(answers.into_iter().map(|a| a.unwrap_or(fail_mode)));
    }

    pub(super) fn check_costs(&self, requests: &[(&str, u64)]) -> Result<(), BackendError> {
        for &(_, cost) in requests {
            check_cost(cost, self.config.algo.capacity())?;
        }
        Ok(())
    }

    pub(super) fn pipeline(&self, requests: &[(&str, u64)]) -> ::redis::Pipeline {
        let mut pipe = ::redis::pipe();
        for &(key, cost) in requests {
            // redis-rs' `EVALSHA` of the invocation; a pipeline does not load a missing
            // script, so a `NOSCRIPT` among the replies asks for `Script::load` and those
            // requests again (`retry_pipeline`).
            pipe.invoke_script(&self.invocation(&Req::new(key, cost, At::Server, Mode::Check)));
        }
        pipe
    }

    /// The pipeline that runs again the requests at `missed` (indices into `requests`, from
    /// [`noscript_indices`](super::replies::noscript_indices)).
    pub(super) fn retry_pipeline(
        &self,
        requests: &[(&str, u64)],
        missed: &[usize],
    ) -> ::redis::Pipeline {
        let again: Vec<(&str, u64)> = missed.iter().map(|&i| requests[i]).collect();
        self.pipeline(&again)
    }
}

/// The accessors both clients have, written once (each client holds `core: ClientCore<A>`
/// and `target: Target`); `$build` names its builder's method, for the docs.
macro_rules! client_accessors {
    ($build:ident) => {
        /// The algorithm.
        pub fn algorithm(&self) -> &A {
            &self.core.config.algo
        }

        /// The Redis key that holds `key`'s state: `prefix{escaped key}` (see the module docs).
        pub fn redis_key(&self, key: &str) -> String {
            self.core.redis_key(key)
        }

        #[doc = concat!(
                            "Whether this limiter talks to a Redis Cluster (detected at [`",
                            stringify!($build),
                            "`](super::RedisBuilder::",
                            stringify!($build),
                            "), or asked for with [`seed_nodes`](super::RedisBuilder::seed_nodes))."
                        )]
        pub fn is_cluster(&self) -> bool {
            self.target.is_cluster()
        }

        /// The counters: round trips, outages answered by the fail mode, other errors.
        pub fn stats(&self) -> super::ClientStats {
            super::ClientStats {
                round_trips: self.core.round_trips(),
                failures: self.core.failures(),
                errors: self.core.errors(),
                local_keys: self.core.local.as_ref().map_or(0, |l| l.len() as u64),
            }
        }
    };
}
pub(super) use client_accessors;

/// The requests of a batch (`check_n_batch`, both clients) waiting for one round trip, and
/// where in the batch's answers each one's goes.
#[derive(Default)]
pub(super) struct Trip<'k> {
    requests: Vec<(&'k str, u64)>,
    places: Vec<usize>,
}

impl<'k> Trip<'k> {
    /// Takes a batch's next request: answered at once into `out` if its cost check or the
    /// local fast path answers it, else kept for the round trip, its place held in `out`.
    /// `true` when the trip is full ([`BATCH_TRIP`]).
    pub(super) fn add<A: RedisAlgorithm>(
        &mut self,
        core: &ClientCore<A>,
        key: &'k str,
        cost: u64,
        out: &mut Vec<Result<Decision, QuotaError>>,
    ) -> bool {
        match core.before(&Req::new(key, cost, At::Server, Mode::Check)) {
            Ok(Some(d)) => out.push(Ok(d)),
            Ok(None) => {
                self.places.push(out.len());
                self.requests.push((key, cost));
                // A place for Redis' answer, filled whatever the round trip gives.
                out.push(Ok(core.error_decision()));
            }
            Err(e) => out.push(core.fail_over(Err(e))),
        }
        self.requests.len() == BATCH_TRIP
    }

    /// The requests to send.
    pub(super) fn requests(&self) -> &[(&'k str, u64)] {
        &self.requests
    }

    /// The round trip done: writes each request its answer at its place in `out` (the local
    /// fast path learning from each decision), or, if the trip failed, the answer to that
    /// failure for each request, counted once each; then empties the trip.
    pub(super) fn finish<A: RedisAlgorithm>(
        &mut self,
        core: &ClientCore<A>,
        result: Result<Answers, BackendError>,
        out: &mut [Result<Decision, QuotaError>],
    ) {
        match result {
            Ok(answers) => {
                for ((&i, &(key, cost)), answer) in
                    self.places.iter().zip(&self.requests).zip(answers)
                {
                    if let Ok(d) = answer {
                        let req = Req::new(key, cost, At::Server, Mode::Check);
                        core.after(&req, &Reply::Decided(d));
                    }
                    // A script error (a key of the wrong type, say) is its request's alone.
                    out[i] = core.fail_over(answer);
                }
            }
            Err(e) => {
                let answer = core.fail_over_n(Err(e), self.requests.len() as u64);
                for &i in &self.places {
                    out[i] = answer.clone();
                }
            }
        }
        self.requests.clear();
        self.places.clear();
    }
}
