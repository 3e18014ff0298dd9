//! One rule's limiter on the configured backend: in memory (a `CasLimiter` per rule), Redis
//! or Redis Cluster (an `AsyncRedisLimiter` per rule, exact across replicas) or the fleet
//! limiter (a `HybridLimiter` per rule).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use hotlimit::algo::{Algorithm as Algo, FixedWindow};
use hotlimit::redis::{
    AsyncRedisLimiter, BackendError, HybridAlgorithm, HybridLimiter, RedisAlgorithm,
};
use hotlimit::store::Ticket;
use hotlimit::{CasLimiter, Clock, Decision, ManualClock, QuantaClock, Requests};

use crate::config::Algorithm;

/// Where the rules keep their state.
#[derive(Debug, Clone)]
pub enum Backend {
    /// In this process (the default): a `CasLimiter` per rule, at most `max_keys` keys each.
    Memory {
        /// The capacity bound per rule (a flood of new keys never resets a used one).
        max_keys: usize,
        /// A manual clock instead of the monotonic one (tests).
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
}

/// Why a rule's limiter could not decide.
#[derive(Debug)]
pub enum EngineError {
    /// The cost can never be admitted (more than the limit): over the limit.
    Cost(String),
    /// A settle's ticket is not this rule's, or the ticket is already settled.
    Ticket(String),
    /// The backend failed (Redis unreachable, ...): the caller's failure mode decides.
    Backend(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Cost(e) | EngineError::Ticket(e) | EngineError::Backend(e) => {
                f.write_str(e)
            }
        }
    }
}

impl From<hotlimit::store::QuotaError> for EngineError {
    fn from(e: hotlimit::store::QuotaError) -> Self {
        match e {
            hotlimit::store::QuotaError::Cost(c) => EngineError::Cost(c.to_string()),
            other => EngineError::Ticket(other.to_string()),
        }
    }
}

impl From<BackendError> for EngineError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::Cost(c) => EngineError::Cost(c.to_string()),
            BackendError::Ticket(t) => EngineError::Ticket(t.to_string()),
            other => EngineError::Backend(other.to_string()),
        }
    }
}

type Answer<T> = Result<T, EngineError>;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = Answer<T>> + Send + 'a>>;

/// A limiter that answers in memory: one call, no await.
trait Local: Send + Sync {
    fn check(&self, key: &str, cost: u64) -> Answer<Decision>;
    fn peek(&self, key: &str, cost: u64) -> Answer<Decision>;
    fn take(&self, key: &str, cost: u64) -> Answer<Ticket>;
    fn settle(&self, key: &str, ticket: &mut Ticket, actual: u64) -> Answer<bool>;
}

impl<L: Requests<str>> Local for L
where
    EngineError: From<L::Error>,
{
    fn check(&self, key: &str, cost: u64) -> Answer<Decision> {
        Ok(self.request(key).cost(cost).check()?)
    }
    fn peek(&self, key: &str, cost: u64) -> Answer<Decision> {
        Ok(self.request(key).cost(cost).peek()?)
    }
    fn take(&self, key: &str, cost: u64) -> Answer<Ticket> {
        Ok(self.request(key).cost(cost).take()?)
    }
    fn settle(&self, key: &str, ticket: &mut Ticket, actual: u64) -> Answer<bool> {
        Ok(self.request(key).settle(ticket, actual)?)
    }
}

/// A limiter that answers over the network.
trait Remote: Send + Sync {
    fn check<'a>(&'a self, key: &'a str, cost: u64) -> BoxFuture<'a, Decision>;
    fn peek<'a>(&'a self, key: &'a str, cost: u64) -> BoxFuture<'a, Decision>;
    fn take<'a>(&'a self, key: &'a str, cost: u64) -> BoxFuture<'a, Ticket>;
    fn settle<'a>(
        &'a self,
        key: &'a str,
        ticket: &'a mut Ticket,
        actual: u64,
    ) -> BoxFuture<'a, bool>;
}

impl<A: RedisAlgorithm + Send + Sync + 'static> Remote for AsyncRedisLimiter<A> {
    fn check<'a>(&'a self, key: &'a str, cost: u64) -> BoxFuture<'a, Decision> {
        Box::pin(async move { Ok(self.request(key).cost(cost).check().await?) })
    }
    fn peek<'a>(&'a self, key: &'a str, cost: u64) -> BoxFuture<'a, Decision> {
        Box::pin(async move { Ok(self.request(key).cost(cost).peek().await?) })
    }
    fn take<'a>(&'a self, key: &'a str, cost: u64) -> BoxFuture<'a, Ticket> {
        Box::pin(async move { Ok(self.request(key).cost(cost).take().await?) })
    }
    fn settle<'a>(
        &'a self,
        key: &'a str,
        ticket: &'a mut Ticket,
        actual: u64,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async move { Ok(self.request(key).settle(ticket, actual).await?) })
    }
}

/// One rule's limiter.
pub struct Engine(Kind);

enum Kind {
    /// `requests_per_unit: 0`: every request over the limit. A one-unit window whose unit was
    /// taken at build, on a clock that never moves: its denial (nothing left, back in one
    /// window) is every request's.
    DenyAll(CasLimiter<u8, FixedWindow, ManualClock>),
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

impl Engine {
    /// A limiter for `algorithm` on `backend`; `window` is the rule's unit (the deny-all
    /// rule's reset), `tag` names the rule in Redis keys (after the backend's prefix), so
    /// that no two rules, nor one rule before and after a change of algorithm, share a key.
    pub async fn build(
        tag: &str,
        algorithm: &Algorithm,
        window: Duration,
        backend: &Backend,
    ) -> Result<Engine, String> {
        let backend = &match backend {
            Backend::Redis { url, prefix } => Backend::Redis {
                url: url.clone(),
                prefix: format!("{prefix}{tag}"),
            },
            Backend::Hybrid {
                url,
                prefix,
                sync_interval,
                max_keys,
            } => Backend::Hybrid {
                url: url.clone(),
                prefix: format!("{prefix}{tag}"),
                sync_interval: *sync_interval,
                max_keys: *max_keys,
            },
            memory => memory.clone(),
        };
        Ok(match algorithm {
            Algorithm::DenyAll => {
                let one = FixedWindow::new(1, window).map_err(|e| e.to_string())?;
                let limiter = CasLimiter::with_clock(one, ManualClock::default());
                let _ = limiter.check(&0);
                Engine(Kind::DenyAll(limiter))
            }
            Algorithm::FixedWindow(q) => on(*q, backend).await?,
            Algorithm::SlidingWindow(q) => on(*q, backend).await?,
            Algorithm::Gcra(q) => on(*q, backend).await?,
            Algorithm::Earrrl(q) => on(*q, backend).await?,
            Algorithm::Exponential(q) => on(*q, backend).await?,
            Algorithm::SubWindow(q) => not_hybrid(*q, backend).await?,
            Algorithm::SlidingLog(q) => not_hybrid(*q, backend).await?,
        })
    }

    /// Decides `cost` for `key`, counting it.
    pub async fn check(&self, key: &str, cost: u64) -> Answer<Decision> {
        match &self.0 {
            Kind::DenyAll(l) => Ok(l.check(&0)),
            Kind::Local(l) => l.check(key, cost),
            Kind::Remote(r) => r.check(key, cost).await,
        }
    }

    /// The decision `cost` would get now, counting nothing.
    pub async fn peek(&self, key: &str, cost: u64) -> Answer<Decision> {
        match &self.0 {
            Kind::DenyAll(l) => Ok(l.check(&0)),
            Kind::Local(l) => l.peek(key, cost),
            Kind::Remote(r) => r.peek(key, cost).await,
        }
    }

    /// Decides and charges `cost`, returning the outcome and, when admitted, a ticket to
    /// settle with the real cost.
    pub async fn take(&self, key: &str, cost: u64) -> Answer<(Decision, Option<Ticket>)> {
        let ticket = match &self.0 {
            Kind::DenyAll(l) => return Ok((l.check(&0), None)),
            Kind::Local(l) => l.take(key, cost)?,
            Kind::Remote(r) => r.take(key, cost).await?,
        };
        let decision = ticket.decision();
        Ok((decision, decision.is_allowed().then_some(ticket)))
    }

    /// Settles `ticket` with the `actual` cost: a refund or a debt.
    pub async fn settle(&self, key: &str, ticket: &mut Ticket, actual: u64) -> Answer<bool> {
        match &self.0 {
            Kind::DenyAll(_) => Ok(false),
            Kind::Local(l) => l.settle(key, ticket, actual),
            Kind::Remote(r) => r.settle(key, ticket, actual).await,
        }
    }
}

async fn on<A>(algo: A, backend: &Backend) -> Result<Engine, String>
where
    A: Algo + RedisAlgorithm + HybridAlgorithm + Send + Sync + 'static,
{
    match backend {
        Backend::Hybrid {
            url,
            prefix,
            sync_interval,
            max_keys,
        } => {
            let url = url.clone();
            let prefix = prefix.clone();
            let (interval, max_keys) = (*sync_interval, *max_keys);
            // The builder connects (blocking): off the runtime's threads.
            let hybrid: HybridLimiter<A> = tokio::task::spawn_blocking(move || {
                HybridLimiter::builder(url, algo)
                    .sync_interval(interval)
                    .max_keys(max_keys)
                    .redis(|r| r.key_prefix(prefix))
                    .build()
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
            Ok(Engine(Kind::Local(Box::new(hybrid))))
        }
        other => not_hybrid(algo, other).await,
    }
}

async fn not_hybrid<A>(algo: A, backend: &Backend) -> Result<Engine, String>
where
    A: Algo + RedisAlgorithm + Send + Sync + 'static,
{
    match backend {
        Backend::Memory { max_keys, clock } => Ok(Engine(Kind::Local(match clock {
            Some(c) => memory(algo, c.clone(), *max_keys)?,
            None => memory(algo, QuantaClock::default(), *max_keys)?,
        }))),
        Backend::Redis { url, prefix } => {
            let limiter = hotlimit::redis::RedisLimiter::builder(url.clone(), algo)
                .key_prefix(prefix.clone())
                .build_async()
                .await
                .map_err(|e| e.to_string())?;
            Ok(Engine(Kind::Remote(Box::new(limiter))))
        }
        Backend::Hybrid { .. } => Err(format!(
            "the hybrid backend does not run this algorithm ({}); use gcra, fixed_window, sliding_window, earrrl or exponential",
            std::any::type_name::<A>().rsplit("::").next().unwrap_or("?")
        )),
    }
}

fn memory<A: Algo + Send + Sync + 'static, C: Clock>(
    algo: A,
    clock: C,
    max_keys: usize,
) -> Result<Box<dyn Local>, String>
where
    CasLimiter<String, A, C>: Requests<str>,
    EngineError: From<<CasLimiter<String, A, C> as Requests<str>>::Error>,
{
    let limiter = CasLimiter::<String, A>::builder(algo)
        .clock(clock)
        .max_keys(max_keys)
        .sweep_every(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Box::new(limiter))
}
