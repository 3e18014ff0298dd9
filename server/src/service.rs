//! The rate limit service, apart from its wire formats: a request's descriptors matched to
//! rules and decided on each rule's limiter, as envoyproxy/ratelimit decides them; `replaces`,
//! `shadow_mode`, `quota_mode`, `unlimited`; the response headers; take and settle; reloads
//! that keep the state of every unchanged rule.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use hotlimit::headers::{Draft, QuotaPolicy, RateLimitHeaders};
use hotlimit::store::Ticket;
use hotlimit::Decision;

use crate::config::{Config, ConfigError, Limit, Unit};
use crate::engine::{Backend, Engine, EngineError};
use crate::metrics::{Metrics, RuleCounters};

/// Which rate limit headers a response carries (`response_headers_to_add` over gRPC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
    /// None.
    Off,
    /// The IETF draft 10 pair, `RateLimit-Policy` and `RateLimit` (and `Retry-After` on a
    /// denial).
    Draft10,
    /// envoyproxy/ratelimit's `X-RateLimit-Limit`, `X-RateLimit-Remaining`,
    /// `X-RateLimit-Reset`.
    XRateLimit,
    /// Both sets.
    Both,
}

impl std::str::FromStr for HeaderStyle {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "none" => Ok(HeaderStyle::Off),
            "draft-10" | "draft10" => Ok(HeaderStyle::Draft10),
            "x-ratelimit" | "legacy" => Ok(HeaderStyle::XRateLimit),
            "both" => Ok(HeaderStyle::Both),
            _ => Err(format!(
                "unknown header style `{s}` (expected off, draft-10, x-ratelimit or both)"
            )),
        }
    }
}

/// The service's settings (the command line's, apart from addresses).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where state lives.
    pub backend: Backend,
    /// The headers responses carry.
    pub headers: HeaderStyle,
    /// Every answer OK, whatever the rules decide (envoyproxy/ratelimit's `SHADOW_MODE`).
    pub global_shadow_mode: bool,
    /// At most this many tickets open (taken, not settled) at once.
    pub max_open_tickets: usize,
    /// An open ticket older than this is dropped (its charge stands).
    pub ticket_ttl: Duration,
}

impl Settings {
    /// In memory, draft 10 headers: what `hotlimit-server --config FILE` runs.
    pub fn memory() -> Settings {
        Settings {
            backend: Backend::Memory {
                max_keys: 100_000,
                clock: None,
            },
            headers: HeaderStyle::Draft10,
            global_shadow_mode: false,
            max_open_tickets: 100_000,
            ticket_ttl: Duration::from_secs(600),
        }
    }
}

/// A response code: envoyproxy/ratelimit's `OK` or `OVER_LIMIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Admitted.
    Ok,
    /// Over the limit.
    OverLimit,
}

/// One descriptor of a request: its entries, and its own cost if it has one.
#[derive(Debug, Clone, Default)]
pub struct Descriptor {
    /// `(key, value)` pairs, outermost first.
    pub entries: Vec<(String, String)>,
    /// This descriptor's cost, overriding the request's `hits_addend`.
    pub hits: Option<u64>,
    /// Envoy's `is_negative_hits` (a refund of earlier hits): answered OK, nothing counted
    /// (refunds go through take and settle here).
    pub negative: bool,
}

/// A request: a domain, descriptors, and a cost (`hits_addend`, 0 meaning 1).
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The domain.
    pub domain: String,
    /// The descriptors, each decided on its own rule.
    pub descriptors: Vec<Descriptor>,
    /// The cost of each descriptor without its own (0 counts as 1, as in Envoy).
    pub hits: u64,
}

/// The limit a descriptor was decided under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// `rate_limit.name`.
    pub name: String,
    /// The configured count.
    pub requests_per_unit: u32,
    /// The configured unit.
    pub unit: Unit,
}

/// One descriptor's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// OK or over the limit (a shadow-mode rule's over-limit is OK).
    pub code: Code,
    /// The rule's limit (none when no rule matched, or an unlimited one).
    pub current_limit: Option<CurrentLimit>,
    /// What is left (`u32::MAX` for an unlimited rule).
    pub limit_remaining: u32,
    /// Until the limit is whole again.
    pub duration_until_reset: Option<Duration>,
}

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Over the limit if any descriptor is (quota-mode ones: if all are).
    pub overall_code: Code,
    /// One per descriptor, in order.
    pub statuses: Vec<Status>,
    /// Rate limit headers for the client's response.
    pub headers: Vec<(String, String)>,
    /// For a take: the ticket to settle with the real cost (none if nothing was charged).
    pub ticket: Option<u64>,
}

/// Why a request could not be answered.
#[derive(Debug)]
pub enum ServiceError {
    /// Malformed: no domain, no descriptors, a descriptor without entries (gRPC
    /// `INVALID_ARGUMENT`).
    Invalid(String),
    /// A backend failed (gRPC `UNAVAILABLE`: Envoy's `failure_mode_deny` decides).
    Unavailable(String),
    /// No such open ticket, or it belongs elsewhere.
    Ticket(String),
    /// Too many tickets open: settle some first.
    Busy(String),
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceError::Invalid(e)
            | ServiceError::Unavailable(e)
            | ServiceError::Ticket(e)
            | ServiceError::Busy(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for ServiceError {}

/// What to do with a request's descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Decide and count (`ShouldRateLimit`).
    Check,
    /// Decide, counting nothing.
    Peek,
    /// Decide and charge, returning a ticket to settle with the real cost.
    Take,
}

/// A configuration and the limiters of its rules.
struct Loaded {
    config: Config,
    /// By rule id.
    rules: HashMap<String, Slot>,
}

/// A rule's limiter (none for an unlimited rule) and counters.
struct Slot {
    engine: Option<Arc<Engine>>,
    counters: RuleCounters,
}

/// A ticket: the limiters charged and their tickets.
struct Open {
    taken: Instant,
    parts: Vec<(Arc<Engine>, String, Ticket)>,
}

/// The service: the current configuration, its limiters, open tickets, counters.
pub struct Service {
    settings: Settings,
    loaded: RwLock<Arc<Loaded>>,
    /// The file or directory the configuration was read from (for reloads).
    source: Option<PathBuf>,
    /// The text last loaded or rejected: a reload reads again only on change.
    last_text: Mutex<Vec<(PathBuf, String)>>,
    tickets: Mutex<HashMap<u64, Open>>,
    next_ticket: AtomicU64,
    /// Counters for `/metrics`.
    pub metrics: Metrics,
}

impl Service {
    /// A service over a configuration read from `path` (a file or a directory of YAML files).
    pub async fn from_path(path: &Path, settings: Settings) -> Result<Service, StartError> {
        let sources = crate::config::read_sources(path).map_err(StartError::Config)?;
        let mut service = Service::from_sources(&sources, settings).await?;
        service.source = Some(path.to_path_buf());
        Ok(service)
    }

    /// A service over YAML texts, each named by a path for errors.
    pub async fn from_sources(
        sources: &[(PathBuf, String)],
        settings: Settings,
    ) -> Result<Service, StartError> {
        let config = Config::from_sources(sources.iter().map(|(p, t)| (p.as_path(), t.as_str())))
            .map_err(StartError::Config)?;
        let metrics = Metrics::default();
        let loaded = build(config, &settings, &metrics, &HashMap::new())
            .await
            .map_err(StartError::Backend)?;
        metrics.config_loaded(true);
        Ok(Service {
            settings,
            loaded: RwLock::new(Arc::new(loaded)),
            source: None,
            last_text: Mutex::new(sources.to_vec()),
            tickets: Mutex::new(HashMap::new()),
            next_ticket: AtomicU64::new(1),
            metrics,
        })
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Replaces the configuration with `sources` if they load; the state of every rule whose
    /// place and limit are unchanged is kept. On an error the running configuration stays.
    pub async fn reload_from(&self, sources: &[(PathBuf, String)]) -> Result<bool, ConfigError> {
        if *self.last_text.lock().expect("poisoned") == sources {
            return Ok(false);
        }
        let config =
            match Config::from_sources(sources.iter().map(|(p, t)| (p.as_path(), t.as_str()))) {
                Ok(c) => c,
                Err(e) => {
                    // The same text fails the same way: not read again until it changes.
                    *self.last_text.lock().expect("poisoned") = sources.to_vec();
                    self.metrics.config_loaded(false);
                    return Err(e);
                }
            };
        let current = self.current();
        let kept: HashMap<&str, &Arc<Engine>> = current
            .config
            .rules()
            .iter()
            .filter_map(|r| {
                let engine = current.rules.get(&r.id)?.engine.as_ref()?;
                Some((r.fingerprint.as_str(), engine))
            })
            .collect();
        let kept = kept
            .into_iter()
            .map(|(f, e)| (f.to_owned(), e.clone()))
            .collect();
        match build(config, &self.settings, &self.metrics, &kept).await {
            Ok(loaded) => {
                // Remembered only once running: a backend that failed is tried again.
                *self.last_text.lock().expect("poisoned") = sources.to_vec();
                *self.loaded.write().expect("poisoned") = Arc::new(loaded);
                self.metrics.config_loaded(true);
                Ok(true)
            }
            Err(e) => {
                self.metrics.config_loaded(false);
                Err(ConfigError {
                    file: sources.first().map(|s| s.0.clone()).unwrap_or_default(),
                    location: None,
                    reason: e,
                })
            }
        }
    }

    /// Reads the configuration's files again and reloads if they changed.
    pub async fn reload(&self) -> Result<bool, ConfigError> {
        let Some(path) = &self.source else {
            return Ok(false);
        };
        let sources = crate::config::read_sources(path)?;
        self.reload_from(&sources).await
    }

    fn current(&self) -> Arc<Loaded> {
        self.loaded.read().expect("poisoned").clone()
    }

    /// Every configured rule's id.
    pub fn rule_ids(&self) -> Vec<String> {
        self.current()
            .config
            .rules()
            .iter()
            .map(|r| r.id.clone())
            .collect()
    }

    /// Answers a request: every descriptor matched and decided (`Check`), previewed (`Peek`)
    /// or charged for a later settle (`Take`).
    pub async fn decide(&self, request: &Request, op: Op) -> Result<Response, ServiceError> {
        if request.domain.is_empty() {
            return Err(ServiceError::Invalid(
                "rate limit domain must not be empty".into(),
            ));
        }
        if request.descriptors.is_empty() {
            return Err(ServiceError::Invalid(
                "rate limit descriptor list must not be empty".into(),
            ));
        }
        let loaded = self.current();
        // Match every descriptor, then drop the rules another matched rule replaces.
        let mut matched = Vec::with_capacity(request.descriptors.len());
        for d in &request.descriptors {
            if d.entries.is_empty() {
                return Err(ServiceError::Invalid("a descriptor has no entries".into()));
            }
            matched.push(loaded.config.matching(&request.domain, &d.entries));
        }
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .flat_map(|m| m.rule.replaces.iter().map(String::as_str))
            .collect();

        let mut statuses = Vec::with_capacity(matched.len());
        let mut decisions: Vec<Option<Decision>> = Vec::with_capacity(matched.len());
        let mut parts = Vec::new();
        for (d, m) in request.descriptors.iter().zip(&matched) {
            let cost = d.hits.unwrap_or(request.hits).max(1);
            let Some(m) = m.as_ref() else {
                self.metrics.unmatched();
                statuses.push(ok_without_limit(0));
                decisions.push(None);
                continue;
            };
            if d.negative {
                // A refund: answered OK, nothing counted (it matched, so not `unmatched`).
                statuses.push(ok_without_limit(0));
                decisions.push(None);
                continue;
            }
            let rule = &*m.rule;
            let slot = loaded.rules.get(&rule.id).expect("a slot per rule");
            let (requests_per_unit, unit) = match &rule.limit {
                Limit::Unlimited => {
                    slot.counters.allowed.inc_by(cost);
                    statuses.push(ok_without_limit(u32::MAX));
                    decisions.push(None);
                    continue;
                }
                Limit::Limited {
                    requests_per_unit,
                    unit,
                    ..
                } => (*requests_per_unit, *unit),
            };
            if !rule.name.is_empty() && replaced.contains(&rule.name.as_str()) {
                // Replaced: not evaluated, its limit untouched.
                statuses.push(ok_without_limit(0));
                decisions.push(None);
                continue;
            }
            let engine = slot.engine.as_ref().expect("a limited rule has an engine");
            let answer = match op {
                Op::Check => engine.check(&m.key, cost).await.map(|o| (o, None)),
                Op::Peek => engine.peek(&m.key, cost).await.map(|o| (o, None)),
                Op::Take => engine.take(&m.key, cost).await,
            };
            let decision = match answer {
                Ok((decision, ticket)) => {
                    if let Some(t) = ticket {
                        parts.push((engine.clone(), m.key.clone(), t));
                    }
                    Some(decision)
                }
                // More than the limit can ever admit: over the limit, as a counter would say.
                Err(EngineError::Cost(_)) => None,
                Err(e) => {
                    self.metrics.backend_error();
                    return Err(ServiceError::Unavailable(format!("{}: {e}", rule.id)));
                }
            };
            let over = decision.is_none_or(|d| d.is_denied());
            if op != Op::Peek {
                match (over, rule.shadow_mode || self.settings.global_shadow_mode) {
                    (false, _) => slot.counters.allowed.inc_by(cost),
                    (true, false) => slot.counters.over_limit.inc_by(cost),
                    (true, true) => slot.counters.shadow.inc_by(cost),
                };
            }
            let remaining = decision
                .and_then(|d| d.remaining())
                .map_or(0, |r| r.min(u64::from(u32::MAX)) as u32);
            let reset = decision
                .map(|d| d.reset_after().unwrap_or(d.retry_after()))
                .unwrap_or(unit.duration());
            statuses.push(Status {
                code: if over && !rule.shadow_mode {
                    Code::OverLimit
                } else {
                    Code::Ok
                },
                current_limit: Some(CurrentLimit {
                    name: rule.name.clone(),
                    requests_per_unit,
                    unit,
                }),
                limit_remaining: if over { 0 } else { remaining },
                duration_until_reset: Some(reset),
            });
            decisions.push(decision);
        }

        // Over the limit if any rate-limit descriptor is, or every quota-mode one is.
        let (mut failed, mut quota, mut quota_failed) = (0, 0, 0);
        for (s, m) in statuses.iter().zip(&matched) {
            let quota_mode = m.as_ref().is_some_and(|m| m.rule.quota_mode);
            quota += usize::from(quota_mode);
            if s.code == Code::OverLimit {
                if quota_mode {
                    quota_failed += 1;
                } else {
                    failed += 1;
                }
            }
        }
        let mut overall = if failed > 0 || (quota > 0 && quota == quota_failed) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        if overall == Code::OverLimit && self.settings.global_shadow_mode {
            overall = Code::Ok;
        }
        let headers = self.headers(&statuses, &decisions);
        let ticket = match parts.is_empty() {
            true => None,
            false => Some(self.open(parts).await?),
        };
        Ok(Response {
            overall_code: overall,
            statuses,
            headers,
            ticket,
        })
    }

    /// The headers of the descriptor closest to its limit (the first over it), as
    /// envoyproxy/ratelimit picks it.
    fn headers(
        &self,
        statuses: &[Status],
        decisions: &[Option<Decision>],
    ) -> Vec<(String, String)> {
        if self.settings.headers == HeaderStyle::Off {
            return Vec::new();
        }
        let mut pick: Option<(usize, u32)> = None;
        for (i, s) in statuses.iter().enumerate() {
            if s.current_limit.is_none() || decisions[i].is_none() {
                continue;
            }
            if s.code == Code::OverLimit {
                pick = Some((i, 0));
                break;
            }
            if pick.is_none_or(|(_, r)| s.limit_remaining < r) {
                pick = Some((i, s.limit_remaining));
            }
        }
        let Some((i, _)) = pick else {
            return Vec::new();
        };
        let (Some(limit), Some(decision)) = (&statuses[i].current_limit, decisions[i]) else {
            return Vec::new();
        };
        let mut h = RateLimitHeaders::new(Some(QuotaPolicy::new(
            limit.requests_per_unit.into(),
            limit.unit.duration(),
        )));
        h.draft = Draft::Ietf10;
        h.on_allowed = true;
        h.legacy = matches!(
            self.settings.headers,
            HeaderStyle::XRateLimit | HeaderStyle::Both
        );
        let draft = matches!(
            self.settings.headers,
            HeaderStyle::Draft10 | HeaderStyle::Both
        );
        h.verdict(decision)
            .fields()
            .filter(|f| draft || f.name.as_str().starts_with("x-ratelimit"))
            .filter_map(|f| Some((f.name.to_string(), f.value.to_str().ok()?.to_owned())))
            .collect()
    }

    /// Holds a take's charges under a new ticket. Refused (503) while `max_open_tickets` are
    /// open and none has expired: then the charges are given back first, so a refused take
    /// costs nothing (the client has no ticket to settle them with).
    async fn open(&self, parts: Vec<(Arc<Engine>, String, Ticket)>) -> Result<u64, ServiceError> {
        match self.open_at(parts, Instant::now()) {
            Ok(id) => Ok(id),
            Err((e, parts)) => {
                for (engine, key, mut t) in parts {
                    // A refund that fails leaves the charge standing, as a lost ticket does.
                    let _ = engine.settle(&key, &mut t, 0).await;
                }
                Err(e)
            }
        }
    }

    /// [`open`](Self::open) at `now` (a seam: tests move time without sleeping); refused, the
    /// charges come back with the error.
    #[allow(clippy::type_complexity)]
    fn open_at(
        &self,
        parts: Vec<(Arc<Engine>, String, Ticket)>,
        now: Instant,
    ) -> Result<u64, (ServiceError, Vec<(Arc<Engine>, String, Ticket)>)> {
        let mut tickets = self.tickets.lock().expect("poisoned");
        if tickets.len() >= self.settings.max_open_tickets {
            let ttl = self.settings.ticket_ttl;
            tickets.retain(|_, t| now.saturating_duration_since(t.taken) < ttl);
            if tickets.len() >= self.settings.max_open_tickets {
                let e = ServiceError::Busy(format!(
                    "{} tickets open: settle some first",
                    self.settings.max_open_tickets
                ));
                return Err((e, parts));
            }
        }
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        tickets.insert(id, Open { taken: now, parts });
        Ok(id)
    }

    /// Settles a ticket from a take with the `actual` cost of each descriptor it charged:
    /// the difference is refunded, or charged as a debt. A ticket settles once.
    pub async fn settle(&self, ticket: u64, actual: u64) -> Result<(), ServiceError> {
        self.settle_at(ticket, actual, Instant::now()).await
    }

    /// [`settle`](Self::settle) at `now` (a seam: tests move time without sleeping).
    async fn settle_at(&self, ticket: u64, actual: u64, now: Instant) -> Result<(), ServiceError> {
        let open = self
            .tickets
            .lock()
            .expect("poisoned")
            .remove(&ticket)
            .filter(|t| now.saturating_duration_since(t.taken) < self.settings.ticket_ttl)
            .ok_or_else(|| ServiceError::Ticket(format!("no open ticket {ticket}")))?;
        for (engine, key, mut t) in open.parts {
            match engine.settle(&key, &mut t, actual).await {
                Ok(_) => {}
                Err(EngineError::Backend(e)) => return Err(ServiceError::Unavailable(e)),
                Err(e) => return Err(ServiceError::Ticket(e.to_string())),
            }
        }
        Ok(())
    }
}

fn ok_without_limit(remaining: u32) -> Status {
    Status {
        code: Code::Ok,
        current_limit: None,
        limit_remaining: remaining,
        duration_until_reset: None,
    }
}

/// Why the service could not start.
#[derive(Debug)]
pub enum StartError {
    /// The configuration was rejected.
    Config(ConfigError),
    /// A backend could not be reached or cannot run a rule.
    Backend(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(e) => e.fmt(f),
            StartError::Backend(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for StartError {}

/// The limiters of `config`'s rules: an unchanged rule's (by fingerprint) from `kept`, a new
/// one's built.
async fn build(
    config: Config,
    settings: &Settings,
    metrics: &Metrics,
    kept: &HashMap<String, Arc<Engine>>,
) -> Result<Loaded, String> {
    let mut rules = HashMap::new();
    for rule in config.rules() {
        let counters = metrics.rule(rule);
        let Limit::Limited {
            unit, algorithm, ..
        } = &rule.limit
        else {
            rules.insert(
                rule.id.clone(),
                Slot {
                    engine: None,
                    counters,
                },
            );
            continue;
        };
        let engine = match kept.get(&rule.fingerprint) {
            Some(e) => e.clone(),
            None => Arc::new(
                Engine::build(
                    &format!("{}:{}:", rule.id, algorithm.name()),
                    algorithm,
                    unit.duration(),
                    &settings.backend,
                )
                .await
                .map_err(|e| format!("{}: {e}", rule.id))?,
            ),
        };
        rules.insert(
            rule.id.clone(),
            Slot {
                engine: Some(engine),
                counters,
            },
        );
    }
    Ok(Loaded { config, rules })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hotlimit::ManualClock;

    /// A service with `hotlimit-server`'s ticket settings (`Settings::memory()`), a rule of
    /// `limit` a day on a frozen clock.
    async fn service(limit: u32) -> Service {
        let settings = Settings {
            backend: Backend::Memory {
                max_keys: 1_000,
                clock: Some(ManualClock::default()),
            },
            ..Settings::memory()
        };
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, requests_per_unit: {limit}}}\n"
        );
        Service::from_sources(&[(PathBuf::from("d.yaml"), yaml)], settings)
            .await
            .unwrap()
    }

    /// One descriptor `k=value` costing `cost`.
    fn request(value: &str, cost: u64) -> Request {
        Request {
            domain: "d".into(),
            descriptors: vec![Descriptor {
                entries: vec![("k".into(), value.into())],
                hits: Some(cost),
                negative: false,
            }],
            hits: 0,
        }
    }

    /// The overall codes of checks of `k=value` at these costs, in order.
    async fn checks(s: &Service, value: &str, costs: &[u64]) -> Vec<Code> {
        let mut codes = Vec::new();
        for &cost in costs {
            let r = s.decide(&request(value, cost), Op::Check).await.unwrap();
            codes.push(r.overall_code);
        }
        codes
    }

    /// A take of `k=value` at `cost`: its ticket and the instant the service took it at.
    async fn take(s: &Service, value: &str, cost: u64) -> (u64, Instant) {
        let r = s.decide(&request(value, cost), Op::Take).await.unwrap();
        let id = r.ticket.expect("an admitted take has a ticket");
        (id, s.tickets.lock().unwrap()[&id].taken)
    }

    /// The message of a settle refused for want of an open ticket (a 404 on the JSON API).
    fn no_ticket(r: Result<(), ServiceError>) -> String {
        match r {
            Err(ServiceError::Ticket(e)) => e,
            other => panic!("expected no open ticket, got {other:?}"),
        }
    }

    // A ticket settles until it is 10 minutes old (the refund lands); from 10 minutes on a
    // settle is refused (404), once and for good, and the charge stands. No sleeping: the
    // settles are made at chosen instants.
    // Pins G74.
    #[tokio::test(flavor = "current_thread")]
    async fn a_ticket_settles_until_10_minutes_then_is_gone_with_its_charge_standing() {
        let s = service(5).await;
        let ttl = Duration::from_secs(600);
        assert_eq!(s.settings.ticket_ttl, ttl);

        // 3 of 5 taken, settled with 0 used 1 ns before 10 minutes: all 5 back.
        let (id, at) = take(&s, "a", 3).await;
        let just_before = at + ttl - Duration::from_nanos(1);
        s.settle_at(id, 0, just_before).await.unwrap();
        assert_eq!(checks(&s, "a", &[5, 1]).await, [Code::Ok, Code::OverLimit]);

        // 3 of 5 taken, settled at 10 minutes: refused, and the 3 stay charged.
        let (id, at) = take(&s, "b", 3).await;
        let e = no_ticket(s.settle_at(id, 0, at + ttl).await);
        assert_eq!(e, format!("no open ticket {id}"));
        // Gone for good: not even a settle dated within the 10 minutes finds it.
        no_ticket(s.settle_at(id, 0, at).await);
        assert_eq!(checks(&s, "b", &[2, 1]).await, [Code::Ok, Code::OverLimit]);
        assert!(s.tickets.lock().unwrap().is_empty());
    }

    // At 100,000 open tickets a take is refused until some are settled or 10 minutes old: the
    // expired are dropped to make room, never a live one.
    // Pins G74.
    #[tokio::test(flavor = "current_thread")]
    async fn at_100_000_open_tickets_only_expired_ones_make_room() {
        let s = service(1_000_000).await;
        assert_eq!(s.settings.max_open_tickets, 100_000);
        let ttl = s.settings.ticket_ttl;
        let (first, first_at) = take(&s, "t", 1).await;
        let mut last = (first, first_at);
        for _ in 1..100_000 {
            last = take(&s, "t", 1).await;
        }
        assert_eq!((first, last.0), (1, 100_000));

        // 1 ns before the oldest is 10 minutes old: none expired, no room.
        let busy = s.open_at(Vec::new(), first_at + ttl - Duration::from_nanos(1));
        match busy {
            Err((ServiceError::Busy(e), _)) => {
                assert_eq!(e, "100000 tickets open: settle some first")
            }
            other => panic!("expected busy, got {other:?}"),
        }
        assert_eq!(s.tickets.lock().unwrap().len(), 100_000);

        // Once the newest is 10 minutes old, all 100,000 are dropped for the new one.
        let id = s
            .open_at(Vec::new(), last.1 + ttl)
            .map_err(|e| e.0)
            .unwrap();
        assert_eq!(id, 100_001);
        let open: Vec<u64> = s.tickets.lock().unwrap().keys().copied().collect();
        assert_eq!(open, [100_001]);
    }

    // A take refused for want of a ticket costs nothing: its charge is given back (with one
    // ticket open at most, a rule of 5: a take of 2 held, a take of 2 refused, then exactly 3
    // more admitted).
    // Pins G74.
    #[tokio::test(flavor = "current_thread")]
    async fn a_take_refused_for_want_of_a_ticket_charges_nothing() {
        let settings = Settings {
            backend: Backend::Memory {
                max_keys: 1_000,
                clock: Some(ManualClock::default()),
            },
            max_open_tickets: 1,
            ..Settings::memory()
        };
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5}\n";
        let s = Service::from_sources(&[(PathBuf::from("d.yaml"), yaml.into())], settings)
            .await
            .unwrap();
        take(&s, "r", 2).await;
        match s.decide(&request("r", 2), Op::Take).await {
            Err(ServiceError::Busy(e)) => assert_eq!(e, "1 tickets open: settle some first"),
            other => panic!("expected busy, got {other:?}"),
        }
        assert_eq!(checks(&s, "r", &[3, 1]).await, [Code::Ok, Code::OverLimit]);
    }
}
