//! The rules' limiters on the configured backend. Rules whose quotas can read one another's
//! states (a *class*: every GCRA rule; the window rules of one unit; EARRRL rules of one
//! half-life...) share one limiter, each request carrying its rule's quota (the library's
//! per-request quota), so threads, connections and fixed memory grow with the classes in use,
//! not with the rules: in memory a `CasLimiter` per class, swept by one thread for all; on
//! Redis an `AsyncRedisLimiter` per class; on the hybrid backend a `HybridLimiter` per class.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hotlimit::algo::Algorithm as Algo;
use hotlimit::redis::{
    AsyncRedisLimiter, BackendError, HybridAlgorithm, HybridLimiter, RedisAlgorithm,
};
use hotlimit::{CasLimiter, Clock, Decision, ManualClock, QuotaError, Requests, Ticket};

use crate::config::Algorithm;

/// Where the rules keep their state.
#[derive(Debug, Clone)]
pub enum Backend {
    /// In this process (the default): a `CasLimiter` per class of rules, at most `max_keys`
    /// keys each.
    Memory {
        /// The capacity bound per class (a flood of new keys never resets a used one).
        max_keys: usize,
        /// A manual clock instead of the system's (tests).
        clock: Option<ManualClock>,
    },
    /// Every decision in Redis or Redis Cluster: exact across replicas, a round trip each.
    Redis {
        /// `redis://host:port/`; a cluster node's URL gives a cluster client.
        url: String,
        /// Prefixes every key (several services on one Redis).
        prefix: String,
    },
    /// The fleet limiter: decisions in memory, one limit across replicas through Redis.
    Hybrid {
        /// `redis://host:port/`.
        url: String,
        /// Prefixes every key.
        prefix: String,
        /// How often each replica exchanges its counts through Redis.
        sync_interval: Duration,
        /// The capacity bound per rule.
        max_keys: usize,
    },
}

impl Backend {
    /// The backend's name, as metrics and logs name it.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory { .. } => "memory",
            Backend::Redis { .. } => "redis",
            Backend::Hybrid { .. } => "hybrid",
        }
    }

    /// Whether a ticket taken on one replica can be settled on another: state in Redis, and
    /// a settle Redis applies once.
    pub fn shared_tickets(&self) -> bool {
        matches!(self, Backend::Redis { .. })
    }
}

/// Why a rule's limiter could not decide.
#[derive(Debug)]
pub enum EngineError {
    /// The cost can never be admitted (more than the limit): over the limit.
    Cost(QuotaError),
    /// A settle's ticket is not this rule's key's, or not this limiter's (one of
    /// `QuotaError`'s two ticket cases).
    Ticket(hotlimit::QuotaError),
    /// The rule's quota cannot run on its class's limiter (another window or layout).
    Quota(hotlimit::QuotaError),
    /// The rule's quota is of another algorithm than its class's limiter.
    WrongClass,
    /// The backend failed (Redis unreachable, ...): the caller's failure mode decides.
    Backend(BackendError),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Cost(e) => e.fmt(f),
            EngineError::Ticket(e) => e.fmt(f),
            EngineError::Quota(e) => e.fmt(f),
            EngineError::WrongClass => {
                f.write_str("the rule's quota is not of its limiter's class")
            }
            EngineError::Backend(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Backend(e) => e.source(),
            _ => None,
        }
    }
}

impl From<hotlimit::QuotaError> for EngineError {
    fn from(e: hotlimit::QuotaError) -> Self {
        match e {
            c @ (hotlimit::QuotaError::ZeroCost | hotlimit::QuotaError::ExceedsCapacity { .. }) => {
                EngineError::Cost(c)
            }
            t @ (hotlimit::QuotaError::TicketForOtherKey
            | hotlimit::QuotaError::TicketFromOtherLimiter) => EngineError::Ticket(t),
            other => EngineError::Quota(other),
        }
    }
}

impl From<BackendError> for EngineError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::Cost(c) => EngineError::Cost(c),
            BackendError::TicketForOtherKey => {
                EngineError::Ticket(hotlimit::QuotaError::TicketForOtherKey)
            }
            BackendError::TicketFromOtherLimiter => {
                EngineError::Ticket(hotlimit::QuotaError::TicketFromOtherLimiter)
            }
            other => EngineError::Backend(other),
        }
    }
}

/// Why a class's limiter could not be built.
#[derive(Debug)]
pub enum BuildError {
    /// The in-memory limiter refused its settings or could not start.
    Memory(hotlimit::BuildError),
    /// Redis or the fleet limiter could not be set up.
    Backend(BackendError),
    /// The thread that builds a fleet limiter could not start, or ended without an answer.
    Spawn(std::io::Error),
    /// The hybrid backend does not run this algorithm (its type name).
    NotOnFleet(&'static str),
    /// An outside algorithm (its registered name) on a backend other than memory.
    Outside {
        /// The name it was registered under.
        algorithm: &'static str,
        /// The backend that cannot run it.
        backend: &'static str,
    },
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::Memory(e) => e.fmt(f),
            BuildError::Backend(e) => e.fmt(f),
            BuildError::Spawn(e) => write!(f, "cannot build the fleet limiter: {e}"),
            BuildError::NotOnFleet(algo) => write!(
                f,
                "the hybrid backend does not run this algorithm ({algo}); use gcra, fixed_window, sliding_window, earrrl, exponential or in_flight"
            ),
            BuildError::Outside { algorithm, backend } => write!(
                f,
                "the {backend} backend does not run the outside algorithm '{algorithm}' (the memory backend does)"
            ),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Memory(e) => Some(e),
            BuildError::Backend(e) => Some(e),
            BuildError::Spawn(e) => Some(e),
            BuildError::NotOnFleet(_) | BuildError::Outside { .. } => None,
        }
    }
}

type Answer<T> = Result<T, EngineError>;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = Answer<T>> + Send + 'a>>;

/// A descriptor's state key as each store takes it: the text (Redis, the fleet limiter) and a
/// keyed 128-bit hash of the rule and the text (memory: 16 bytes a key whatever the values'
/// length, and no client can aim two keys at one state without the process's secret keys).
#[derive(Debug, Clone, Copy)]
pub struct Key<'a> {
    /// `<rule>:<algorithm>:<domain>|<key>=<value>...` on Redis; `<domain>|<key>=<value>...`
    /// on the fleet limiter (its prefix names the rule) and in memory (unused).
    pub text: &'a str,
    /// The hash the memory backend keys by (0 on the others, which do not read it).
    pub hash: u128,
}

/// The rule's quota, if it is of the limiter's own algorithm type `A`.
fn pick<A: 'static>(quota: &Algorithm) -> Option<&A> {
    let quota: &dyn std::any::Any = match quota {
        Algorithm::DenyAll => return None,
        Algorithm::FixedWindow(q) => q,
        Algorithm::SlidingWindow(q) => q,
        Algorithm::SubWindow(q) => q,
        Algorithm::SlidingLog(q) => q,
        Algorithm::Gcra(q) => q,
        Algorithm::Earrrl(q) => q,
        Algorithm::Exponential(q) => q,
        Algorithm::InFlight(q) => q,
        Algorithm::Outside(o) => return o.quota(),
    };
    quota.downcast_ref()
}

fn wrong_class() -> EngineError {
    EngineError::WrongClass
}

/// A limiter that answers in memory: one call, no await.
trait Local: Send + Sync {
    fn check(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Decision>;
    fn peek(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Decision>;
    fn take(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Ticket>;
    fn settle(&self, key: Key<'_>, quota: &Algorithm, t: &mut Ticket, actual: u64) -> Answer<bool>;
    /// Ends the limiter, waiting for whatever it still sends (the fleet limiter's last sync).
    fn shutdown(self: Box<Self>) {}
}

/// A class's limiter in memory, keyed by the hash; `per_request`: each request brings its
/// rule's quota (a class of the built-in algorithms), else the class is one quota, the
/// limiter's own (an outside algorithm, which need read no other quota's states).
struct Memory<A: Algo, C: Clock> {
    limiter: CasLimiter<u128, A, C>,
    per_request: bool,
}

impl<A: Algo, C: Clock> Memory<A, C>
where
    CasLimiter<u128, A, C>: Requests<u128, Algo = A>,
{
    /// The request for `key` under the rule's quota `q` (already picked: of the class's
    /// algorithm), if the class decides per request.
    fn request<'a>(
        &'a self,
        key: &'a Key<'_>,
        q: &'a A,
    ) -> hotlimit::Request<'a, CasLimiter<u128, A, C>, u128, A> {
        let request = self.limiter.request(&key.hash);
        if self.per_request {
            request.quota(q)
        } else {
            request
        }
    }
}

impl<A, C> Local for Memory<A, C>
where
    A: Algo + Send + Sync + 'static,
    C: Clock,
    CasLimiter<u128, A, C>: Requests<u128, Algo = A>,
    EngineError: From<<CasLimiter<u128, A, C> as Requests<u128>>::Error>,
{
    fn check(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Decision> {
        let q = pick::<A>(quota).ok_or_else(wrong_class)?;
        Ok(self.request(&key, q).cost(cost).check()?)
    }
    fn peek(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Decision> {
        let q = pick::<A>(quota).ok_or_else(wrong_class)?;
        Ok(self.request(&key, q).cost(cost).peek()?)
    }
    fn take(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Ticket> {
        let q = pick::<A>(quota).ok_or_else(wrong_class)?;
        Ok(self.request(&key, q).cost(cost).take()?)
    }
    fn settle(&self, key: Key<'_>, quota: &Algorithm, t: &mut Ticket, actual: u64) -> Answer<bool> {
        let q = pick::<A>(quota).ok_or_else(wrong_class)?;
        Ok(self.request(&key, q).settle(t, actual)?)
    }
}

/// A class's fleet limiter, each request under its rule's quota.
struct Fleet<A: HybridAlgorithm>(HybridLimiter<A>);

impl<A: HybridAlgorithm + Send + Sync + 'static> Local for Fleet<A>
where
    HybridLimiter<A>: Requests<str, Algo = A>,
    EngineError: From<<HybridLimiter<A> as Requests<str>>::Error>,
{
    fn check(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Decision> {
        let q = pick::<A>(quota).ok_or_else(wrong_class)?;
        Ok(self.0.request(key.text).quota(q).cost(cost).check()?)
    }
    fn peek(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Decision> {
        let q = pick::<A>(quota).ok_or_else(wrong_class)?;
        Ok(self.0.request(key.text).quota(q).cost(cost).peek()?)
    }
    fn take(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Ticket> {
        let q = pick::<A>(quota).ok_or_else(wrong_class)?;
        Ok(self.0.request(key.text).quota(q).cost(cost).take()?)
    }
    fn settle(&self, key: Key<'_>, quota: &Algorithm, t: &mut Ticket, actual: u64) -> Answer<bool> {
        let q = pick::<A>(quota).ok_or_else(wrong_class)?;
        Ok(self.0.request(key.text).quota(q).settle(t, actual)?)
    }
    /// The last sync (leases handed back, debts charged), waited for: the engine is dropped
    /// off the runtime's threads ([`retire`]), or at exit after the runtime stopped.
    fn shutdown(self: Box<Self>) {
        self.0.shutdown();
    }
}

/// A limiter that answers over the network.
trait Remote: Send + Sync {
    fn check<'a>(
        &'a self,
        key: Key<'a>,
        quota: &'a Algorithm,
        cost: u64,
    ) -> BoxFuture<'a, Decision>;
    fn peek<'a>(&'a self, key: Key<'a>, quota: &'a Algorithm, cost: u64)
        -> BoxFuture<'a, Decision>;
    fn take<'a>(&'a self, key: Key<'a>, quota: &'a Algorithm, cost: u64) -> BoxFuture<'a, Ticket>;
    fn settle<'a>(
        &'a self,
        key: Key<'a>,
        quota: &'a Algorithm,
        ticket: &'a mut Ticket,
        actual: u64,
    ) -> BoxFuture<'a, bool>;
}

impl<A: RedisAlgorithm + Send + Sync + 'static> Remote for AsyncRedisLimiter<A> {
    fn check<'a>(
        &'a self,
        key: Key<'a>,
        quota: &'a Algorithm,
        cost: u64,
    ) -> BoxFuture<'a, Decision> {
        Box::pin(async move {
            let q = pick::<A>(quota).ok_or_else(wrong_class)?;
            Ok(self.request(key.text).quota(q).cost(cost).check().await?)
        })
    }
    fn peek<'a>(
        &'a self,
        key: Key<'a>,
        quota: &'a Algorithm,
        cost: u64,
    ) -> BoxFuture<'a, Decision> {
        Box::pin(async move {
            let q = pick::<A>(quota).ok_or_else(wrong_class)?;
            Ok(self.request(key.text).quota(q).cost(cost).peek().await?)
        })
    }
    fn take<'a>(&'a self, key: Key<'a>, quota: &'a Algorithm, cost: u64) -> BoxFuture<'a, Ticket> {
        Box::pin(async move {
            let q = pick::<A>(quota).ok_or_else(wrong_class)?;
            Ok(self.request(key.text).quota(q).cost(cost).take().await?)
        })
    }
    fn settle<'a>(
        &'a self,
        key: Key<'a>,
        quota: &'a Algorithm,
        ticket: &'a mut Ticket,
        actual: u64,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let q = pick::<A>(quota).ok_or_else(wrong_class)?;
            Ok(self
                .request(key.text)
                .quota(q)
                .settle(ticket, actual)
                .await?)
        })
    }
}

/// A class's limiter.
pub struct Engine(Kind);

impl Drop for Engine {
    /// Shuts the limiter down, waiting for its last sync: an engine is only dropped off the
    /// runtime's worker threads ([`retire`]).
    fn drop(&mut self) {
        if let Kind::Local(local) = std::mem::replace(&mut self.0, Kind::DenyAll(Duration::ZERO)) {
            local.shutdown();
        }
    }
}

enum Kind {
    /// `requests_per_unit: 0`: every request over the limit, back in one unit.
    DenyAll(Duration),
    /// In memory or the fleet limiter.
    Local(Box<dyn Local>),
    /// Redis.
    Remote(Box<dyn Remote>),
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Kind::DenyAll(_) => "Engine::DenyAll",
            Kind::Local(_) => "Engine::Local",
            Kind::Remote(_) => "Engine::Remote",
        })
    }
}

/// A deny-all rule's answer: nothing left, back in one unit. The decision a one-unit window
/// gives its second request at the window's start.
fn denial(window: Duration) -> Decision {
    Decision::denied(window)
        .with_remaining(0)
        .with_reset_after(window)
}

impl Engine {
    /// Decides `cost` for `key` under `quota`, counting it.
    pub async fn check(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Decision> {
        match &self.0 {
            Kind::DenyAll(w) => Ok(denial(*w)),
            Kind::Local(l) => l.check(key, quota, cost),
            Kind::Remote(r) => r.check(key, quota, cost).await,
        }
    }

    /// The decision `cost` would get now, counting nothing.
    pub async fn peek(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Decision> {
        match &self.0 {
            Kind::DenyAll(w) => Ok(denial(*w)),
            Kind::Local(l) => l.peek(key, quota, cost),
            Kind::Remote(r) => r.peek(key, quota, cost).await,
        }
    }

    /// Decides and charges `cost`, returning the outcome and, when admitted, a ticket to
    /// settle with the real cost.
    pub async fn take(
        &self,
        key: Key<'_>,
        quota: &Algorithm,
        cost: u64,
    ) -> Answer<(Decision, Option<Ticket>)> {
        let ticket = match &self.0 {
            Kind::DenyAll(w) => return Ok((denial(*w), None)),
            Kind::Local(l) => l.take(key, quota, cost)?,
            Kind::Remote(r) => r.take(key, quota, cost).await?,
        };
        let decision = ticket.decision();
        Ok((decision, decision.is_allowed().then_some(ticket)))
    }

    /// Settles `ticket` with the `actual` cost: a refund or a debt.
    pub async fn settle(
        &self,
        key: Key<'_>,
        quota: &Algorithm,
        ticket: &mut Ticket,
        actual: u64,
    ) -> Answer<bool> {
        match &self.0 {
            Kind::DenyAll(_) => Ok(false),
            Kind::Local(l) => l.settle(key, quota, ticket, actual),
            Kind::Remote(r) => r.settle(key, quota, ticket, actual).await,
        }
    }
}

/// The system clock, in nanoseconds since the Unix epoch: windows start on the UTC boundaries
/// of their unit (a day at midnight UTC), as envoyproxy/ratelimit's and every replica's do.
/// A step back (NTP) counts as the state's time, never as an error.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnixClock;

impl Clock for UnixClock {
    fn now(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// Something the sweep thread sweeps.
trait Sweep: Send + Sync {
    fn sweep(&self);
}

impl<A: Algo + Send + Sync + 'static, C: Clock> Sweep for Memory<A, C> {
    fn sweep(&self) {
        let _ = self.limiter.sweep();
    }
}

/// How often the sweep thread sweeps every class limiter: idle keys dropped, and the store
/// brought back under `max_keys` (a request past `max_keys + max_keys/4` runs a pass itself).
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Every class's limiter on one backend, and the one thread that sweeps them in memory.
pub struct Engines {
    backend: Backend,
    classes: Mutex<HashMap<String, Arc<Engine>>>,
    swept: Arc<Mutex<Vec<Weak<dyn Sweep>>>>,
    stop: Arc<AtomicBool>,
    /// The keys of the 128-bit hash (per process: state in memory never leaves it).
    hash: (ahash::RandomState, ahash::RandomState),
}

impl std::fmt::Debug for Engines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engines")
            .field("backend", &self.backend.name())
            .finish_non_exhaustive()
    }
}

impl Drop for Engines {
    /// Signals the sweep thread, never waits for it: it ends at its next wake.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Engines {
    /// No limiter yet; the sweep thread (memory) started.
    pub fn new(backend: Backend) -> std::io::Result<Engines> {
        let swept: Arc<Mutex<Vec<Weak<dyn Sweep>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        if matches!(backend, Backend::Memory { .. }) {
            let (swept, stop) = (swept.clone(), stop.clone());
            std::thread::Builder::new()
                .name("hotlimit-sweep".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(SWEEP_EVERY);
                        let live: Vec<Arc<dyn Sweep>> = {
                            let mut list = swept.lock().unwrap_or_else(|e| e.into_inner());
                            list.retain(|w| w.strong_count() > 0);
                            list.iter().filter_map(Weak::upgrade).collect()
                        };
                        for limiter in live {
                            limiter.sweep();
                        }
                    }
                })?;
        }
        Ok(Engines {
            backend,
            classes: Mutex::default(),
            swept,
            stop,
            hash: (ahash::RandomState::new(), ahash::RandomState::new()),
        })
    }

    /// The backend.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The memory backend's key for descriptor key `text` under the rule of version `rule`
    /// (a hash of its fingerprint: a changed rule's keys are new ones).
    pub fn key_hash(&self, rule: u64, text: &str) -> u128 {
        let hi = self.hash.0.hash_one((rule, text));
        let lo = self.hash.1.hash_one((rule, text));
        (u128::from(hi) << 64) | u128::from(lo)
    }

    /// The limiters in use (classes, and fleet limiters of rules).
    pub fn len(&self) -> usize {
        self.classes.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no limiter is built.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The limiter of class `name`, built with `quota` if there is none yet (on the hybrid
    /// backend the class names its Redis keys and channel).
    pub async fn get(
        &self,
        name: &str,
        quota: &Algorithm,
        window: Duration,
    ) -> Result<Arc<Engine>, BuildError> {
        if let Some(e) = self.lock().get(name) {
            return Ok(e.clone());
        }
        let built = Arc::new(self.build(name, quota, window).await?);
        Ok(self.lock().entry(name.to_owned()).or_insert(built).clone())
    }

    /// Forgets every limiter but those `keep` names (after a reload); a dropped one is
    /// dropped off the runtime's threads once no request holds it (its `Drop` waits for the
    /// fleet limiter's last sync).
    pub fn retain(&self, keep: &std::collections::HashSet<String>) {
        let gone: Vec<Arc<Engine>> = {
            let mut classes = self.lock();
            let names: Vec<String> = classes
                .keys()
                .filter(|k| !keep.contains(*k))
                .cloned()
                .collect();
            names.iter().filter_map(|k| classes.remove(k)).collect()
        };
        for engine in gone {
            retire(engine);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Engine>>> {
        self.classes.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn build(
        &self,
        class: &str,
        quota: &Algorithm,
        window: Duration,
    ) -> Result<Engine, BuildError> {
        Ok(match quota {
            Algorithm::DenyAll => Engine(Kind::DenyAll(window)),
            Algorithm::FixedWindow(q) => self.on(*q, class).await?,
            Algorithm::SlidingWindow(q) => self.on(*q, class).await?,
            Algorithm::Gcra(q) => self.on(*q, class).await?,
            Algorithm::Earrrl(q) => self.on(*q, class).await?,
            Algorithm::Exponential(q) => self.on(*q, class).await?,
            Algorithm::SubWindow(q) => self.not_fleet(*q).await?,
            Algorithm::SlidingLog(q) => self.not_fleet(*q).await?,
            Algorithm::InFlight(q) => self.on(*q, class).await?,
            Algorithm::Outside(o) => o.build(self)?,
        })
    }

    /// A class's limiter for an outside algorithm: in memory only.
    pub(crate) fn outside<A>(&self, name: &'static str, algo: A) -> Result<Engine, BuildError>
    where
        A: Algo<State = u64> + Send + Sync + 'static,
    {
        match &self.backend {
            Backend::Memory { max_keys, clock } => match clock {
                Some(c) => self.memory(algo, c.clone(), *max_keys, false),
                None => self.memory(algo, UnixClock, *max_keys, false),
            },
            other => Err(BuildError::Outside {
                algorithm: name,
                backend: other.name(),
            }),
        }
    }

    async fn on<A>(&self, algo: A, class: &str) -> Result<Engine, BuildError>
    where
        A: Algo + RedisAlgorithm + HybridAlgorithm + Send + Sync + 'static,
    {
        match &self.backend {
            Backend::Hybrid {
                url,
                prefix,
                sync_interval,
                max_keys,
            } => {
                let url = url.clone();
                // A prefix per class: its channel carries one algorithm's states.
                let prefix = format!("{prefix}{class}:");
                let (interval, max_keys) = (*sync_interval, *max_keys);
                // The builder connects (blocking): off the runtime's threads, on a thread of its
                // own that ends with it. Not the runtime's blocking pool: its threads linger
                // after the build, and how many depends on timing, not on the rules.
                let (sent, built) = tokio::sync::oneshot::channel();
                std::thread::Builder::new()
                    .name("hotlimit-connect".into())
                    .spawn(move || {
                        let _ = sent.send(
                            HybridLimiter::builder(url, algo)
                                .sync_interval(interval)
                                .max_keys(max_keys)
                                .redis(|r| r.key_prefix(prefix))
                                .build(),
                        );
                    })
                    .map_err(BuildError::Spawn)?;
                let hybrid: HybridLimiter<A> = built
                    .await
                    .map_err(|e| BuildError::Spawn(std::io::Error::other(e)))?
                    .map_err(BuildError::Backend)?;
                Ok(Engine(Kind::Local(Box::new(Fleet(hybrid)))))
            }
            _ => self.not_fleet(algo).await,
        }
    }

    async fn not_fleet<A>(&self, algo: A) -> Result<Engine, BuildError>
    where
        A: Algo + RedisAlgorithm + Send + Sync + 'static,
    {
        match &self.backend {
            Backend::Memory { max_keys, clock } => Ok(match clock {
                Some(c) => self.memory(algo, c.clone(), *max_keys, true)?,
                None => self.memory(algo, UnixClock, *max_keys, true)?,
            }),
            Backend::Redis { url, prefix } => {
                let limiter = hotlimit::redis::RedisLimiter::builder(url.clone(), algo)
                    .key_prefix(prefix.clone())
                    .build_async()
                    .await
                    .map_err(BuildError::Backend)?;
                Ok(Engine(Kind::Remote(Box::new(limiter))))
            }
            Backend::Hybrid { .. } => Err(BuildError::NotOnFleet(
                std::any::type_name::<A>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("?"),
            )),
        }
    }

    fn memory<A, C>(
        &self,
        algo: A,
        clock: C,
        max_keys: usize,
        per_request: bool,
    ) -> Result<Engine, BuildError>
    where
        A: Algo + Send + Sync + 'static,
        C: Clock,
        CasLimiter<u128, A, C>: Requests<u128, Algo = A>,
        EngineError: From<<CasLimiter<u128, A, C> as Requests<u128>>::Error>,
    {
        // No sweeper thread of its own: the one sweep thread serves every class.
        let limiter = CasLimiter::<u128, A>::builder(algo)
            .clock(clock)
            .max_keys(max_keys)
            .build()
            .map_err(BuildError::Memory)?;
        let memory = Arc::new(Memory {
            limiter,
            per_request,
        });
        let weak: Weak<dyn Sweep> = Arc::downgrade(&(memory.clone() as Arc<dyn Sweep>));
        self.swept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(weak);
        Ok(Engine(Kind::Local(Box::new(Shared(memory)))))
    }
}

/// A class limiter in memory, held by its engine and (weakly) by the sweep thread.
struct Shared<A: Algo, C: Clock>(Arc<Memory<A, C>>);

impl<A, C> Local for Shared<A, C>
where
    A: Algo + Send + Sync + 'static,
    C: Clock,
    Memory<A, C>: Local,
{
    fn check(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Decision> {
        self.0.check(key, quota, cost)
    }
    fn peek(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Decision> {
        self.0.peek(key, quota, cost)
    }
    fn take(&self, key: Key<'_>, quota: &Algorithm, cost: u64) -> Answer<Ticket> {
        self.0.take(key, quota, cost)
    }
    fn settle(&self, key: Key<'_>, quota: &Algorithm, t: &mut Ticket, actual: u64) -> Answer<bool> {
        self.0.settle(key, quota, t, actual)
    }
}

/// Drops `engine` on a blocking thread once no request holds it: the last `Arc` of a limiter
/// never goes on a runtime worker, where its `Drop` (the fleet limiter's last sync, waited
/// for) would block others.
pub fn retire<T: Send + Sync + 'static>(engine: Arc<T>) {
    let wait = move || {
        while Arc::strong_count(&engine) > 1 {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(engine);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn_blocking(wait);
        }
        Err(_) => wait(),
    }
}
