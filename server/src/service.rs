//! The rate limit service, apart from its wire formats: a request's descriptors matched to
//! rules and decided on each rule's limiter, as envoyproxy/ratelimit decides them; `replaces`,
//! `shadow_mode`, `quota_mode`, `unlimited`; the response headers; take and settle; reloads
//! that keep the state of every unchanged rule.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hotlimit::algo::{Algorithm as _, FixedWindow};
use hotlimit::headers::{Draft, QuotaPolicy, RateLimitHeaders};
use hotlimit::{Decision, Policy};
use prometheus_client::metrics::counter::Counter;

use crate::config::{Algorithm, Config, ConfigError, Limit, Unit};
use crate::engine::{Backend, Engine, EngineError, Engines, Key};
use crate::metrics::{Metrics, RuleCounters};
use crate::tickets::{NotIssued, Part, Tickets};

/// A request's descriptors' counts, added to their rules' counters when the request is done
/// (answered, or failed with what it charged standing), unless cleared first: a take refused
/// whole, everything it charged given back, counts nothing.
struct Tally<'a> {
    metrics: &'a Metrics,
    counts: Vec<(&'a Counter, u64)>,
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        for (counter, hits) in self.counts.drain(..) {
            self.metrics.count(counter, hits);
        }
    }
}

/// Which rate limit headers a response carries (`response_headers_to_add` over gRPC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
    /// None.
    Off,
    /// The IETF draft 10 pair, `RateLimit-Policy` and `RateLimit` (and `Retry-After` on a
    /// denial).
    Draft10,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`: the names Envoy's
    /// own rate limit filter sends (`enable_x_ratelimit_headers`).
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

/// Bounds on what a client controls: a request beyond one is refused (gRPC
/// `INVALID_ARGUMENT`, HTTP 400, or 413 for a body) before anything is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest domain, in bytes; and the longest descriptor key or value kept whole in a
    /// state key (a longer one is counted under its SHA-256: never refused, which would let
    /// the request through uncounted behind an Envoy that fails open).
    pub max_value_bytes: usize,
    /// The most entries in one descriptor.
    pub max_entries: usize,
    /// The most descriptors in one request.
    pub max_descriptors: usize,
    /// The largest request body (HTTP) or message (gRPC), in bytes.
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_value_bytes: 1024,
            max_entries: 16,
            max_descriptors: 64,
            max_body_bytes: 256 * 1024,
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
    /// envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when a request is
    /// over the limit on one descriptor, its other descriptors are not counted (every domain
    /// read as `all_or_nothing`). The descriptor over the limit counts the hit all the same,
    /// as a fixed-window rule without its own `policy` always does there.
    pub stop_cache_key_increment_when_overlimit: bool,
    /// The bounds on a request.
    pub limits: Limits,
    /// How long a take's ticket can be settled. On the `redis` backend at most
    /// `hotlimit::redis::SETTLE_MARK_TTL` (60 s; a longer one is cut to it), the life Redis'
    /// settle marks cover, so that a replica that never saw a ticket's settle still refuses a
    /// second one (the marks live 5 s more: replicas' clocks may differ that much); a ticket of
    /// in-flight permits alone lives as long as its longest lease instead (its release must
    /// land, and its mark lives as long and the 5 s).
    pub ticket_ttl: Duration,
    /// The secret tickets are signed with: on the `redis` backend, replicas given the same one
    /// settle each other's tickets (on memory and the fleet only the issuing process settles
    /// one). None: random, this process's alone.
    pub ticket_secret: Option<String>,
    /// How many settled tickets are remembered until they expire (48 bytes each and their
    /// tables' slack: 50 to 100 bytes).
    pub max_settled_tickets: usize,
    /// Whether `/healthcheck` fails while the backend does not answer (opt-in: a load
    /// balancer that drops every replica when Redis is down sends the traffic nowhere).
    pub health_checks_backend: bool,
    /// Algorithms of your own that rules may name ([`crate::outside`]); none by default.
    pub algorithms: crate::outside::Algorithms,
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
            stop_cache_key_increment_when_overlimit: false,
            limits: Limits::default(),
            ticket_ttl: hotlimit::redis::SETTLE_MARK_TTL,
            ticket_secret: None,
            max_settled_tickets: crate::tickets::DEFAULT_MAX_SETTLED,
            health_checks_backend: false,
            algorithms: Default::default(),
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
    /// This descriptor's cost, overriding the request's `hits_addend`; 0 checks without
    /// counting (as envoyproxy/ratelimit).
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
    pub hits: u32,
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
    pub ticket: Option<String>,
}

/// Which bound a request broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rejection {
    /// Not a request: malformed JSON or protobuf, a missing domain or descriptor.
    Malformed,
    /// A domain longer than `max_value_bytes`.
    ValueTooLong,
    /// A descriptor with more than `max_entries` entries.
    TooManyEntries,
    /// More than `max_descriptors` descriptors.
    TooManyDescriptors,
    /// A body or message larger than `max_body_bytes`.
    BodyTooLarge,
    /// A request `hits_addend` above 2^32 − 1 (the protocol's `uint32`), or a settle's
    /// `actual` above what its rule can ever owe.
    Cost,
    /// A take whose ticket would be too long for its settle's body (`max_body_bytes`):
    /// refused, what it charged given back.
    TicketTooLarge,
}

impl Rejection {
    /// The name metrics label it with.
    pub fn name(self) -> &'static str {
        match self {
            Rejection::Malformed => "malformed",
            Rejection::ValueTooLong => "value_too_long",
            Rejection::TooManyEntries => "too_many_entries",
            Rejection::TooManyDescriptors => "too_many_descriptors",
            Rejection::BodyTooLarge => "body_too_large",
            Rejection::Cost => "cost",
            Rejection::TicketTooLarge => "ticket_too_large",
        }
    }
}

/// Why a request could not be answered.
#[derive(Debug)]
pub enum ServiceError {
    /// Refused before anything was counted (gRPC `INVALID_ARGUMENT`, HTTP 400 or 413).
    Invalid(Rejection, String),
    /// A backend failed (gRPC `UNAVAILABLE`: Envoy's `failure_mode_deny` decides).
    Unavailable(String),
    /// Not a ticket of this server's, expired, or already settled (HTTP 404).
    Ticket(String),
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceError::Invalid(_, e)
            | ServiceError::Unavailable(e)
            | ServiceError::Ticket(e) => f.write_str(e),
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

/// A rule's limiter (none for an unlimited rule), its quota, and counters.
struct Slot {
    rule: Arc<crate::config::Rule>,
    engine: Option<Arc<Engine>>,
    /// The quota its requests bring (its algorithm, the default policy applied).
    quota: Algorithm,
    /// For a fixed window: the same window one request larger, which tells a check of 0
    /// hits whether the count is *above* the limit (over) or at it (OK), as
    /// envoyproxy/ratelimit tells it.
    at_limit: Option<Algorithm>,
    /// A hash of the rule's fingerprint: a ticket of a changed rule settles nothing.
    version: u64,
    /// The name its limiter is filed under in [`Engines`].
    limiter: Option<String>,
    counters: RuleCounters,
}

/// The service: the current configuration, its limiters, tickets, counters.
pub struct Service {
    settings: Settings,
    loaded: RwLock<Arc<Loaded>>,
    engines: Engines,
    tickets: Tickets,
    /// The file or directory the configuration was read from (for reloads).
    source: Option<PathBuf>,
    /// The text last loaded or rejected: a reload reads again only on change.
    last_text: Mutex<Vec<(PathBuf, String)>>,
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
        let config = Config::from_sources_with(
            sources.iter().map(|(p, t)| (p.as_path(), t.as_str())),
            &settings.algorithms,
        )
        .map_err(StartError::Config)?;
        let metrics = Metrics::default();
        let engines = Engines::new(settings.backend.clone()).map_err(StartError::Spawn)?;
        let tickets = Tickets::new(
            settings.ticket_secret.as_deref(),
            settings.ticket_ttl,
            settings.max_settled_tickets,
            settings.backend.shared_tickets(),
        )
        .map_err(StartError::Tickets)?;
        let loaded = build(config, &metrics, &engines)
            .await
            .map_err(StartError::Rule)?;
        metrics.config_loaded(true);
        Ok(Service {
            settings,
            loaded: RwLock::new(Arc::new(loaded)),
            engines,
            tickets,
            source: None,
            last_text: Mutex::new(sources.to_vec()),
            metrics,
        })
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// How many limiters run (classes of rules in use).
    pub fn limiters(&self) -> usize {
        self.engines.len()
    }

    /// Replaces the configuration with `sources` if they load; the state of every rule whose
    /// place and limit are unchanged is kept. On an error the running configuration stays.
    pub async fn reload_from(&self, sources: &[(PathBuf, String)]) -> Result<bool, ConfigError> {
        if *lock(&self.last_text) == sources {
            return Ok(false);
        }
        let config = match Config::from_sources_with(
            sources.iter().map(|(p, t)| (p.as_path(), t.as_str())),
            &self.settings.algorithms,
        ) {
            Ok(c) => c,
            Err(e) => {
                // The same text fails the same way: not read again until it changes.
                *lock(&self.last_text) = sources.to_vec();
                self.metrics.config_loaded(false);
                return Err(e);
            }
        };
        match build(config, &self.metrics, &self.engines).await {
            Ok(loaded) => {
                // Remembered only once running: a backend that failed is tried again.
                *lock(&self.last_text) = sources.to_vec();
                let keep = in_use(&loaded);
                let old = std::mem::replace(
                    &mut *self.loaded.write().unwrap_or_else(|e| e.into_inner()),
                    Arc::new(loaded),
                );
                // The limiters no rule uses any more, and the old rules, dropped off the
                // runtime once no request holds them.
                self.engines.retain(&keep);
                crate::engine::retire(old);
                self.metrics.config_loaded(true);
                Ok(true)
            }
            Err(e) => {
                self.metrics.config_loaded(false);
                Err(ConfigError {
                    file: sources.first().map(|s| s.0.clone()).unwrap_or_default(),
                    location: None,
                    reason: e.to_string(),
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
        self.loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

    /// Refuses `request` if it breaks a bound (counted in metrics), before anything is read
    /// further: the bounds keep what one request costs in memory and work fixed.
    fn admit(&self, request: &Request) -> Result<(), ServiceError> {
        self.admit_shape(
            &request.domain,
            request.descriptors.len(),
            request.descriptors.iter().map(|d| d.entries.len()),
        )
    }

    /// Refuses a gRPC message whose decoding would take more than the limits allow, from
    /// its wire form, as [`admit`](Self::admit) refuses it decoded (`crate::wire`); `Ok(false)`
    /// for one that cannot be read, refused undecoded (prost would refuse it too).
    pub(crate) fn admit_wire(&self, message: &[u8]) -> Result<bool, ServiceError> {
        let l = &self.settings.limits;
        match crate::wire::oversized(message, l.max_descriptors, l.max_entries) {
            Ok(Some((domain, descriptors, entries))) => self
                .admit_shape(&domain, descriptors, entries)
                .map(|()| true),
            Ok(None) => Ok(true),
            Err(crate::wire::Malformed) => Ok(false),
        }
    }

    /// [`admit`](Self::admit) on a request's shape: its domain, how many descriptors it has
    /// and how many entries each has, walked in order until one is refused. The gRPC port
    /// refuses a message too large to decode from its wire form with it (`crate::wire`): the
    /// same checks, the same answers. An entry's key or value of any length passes (the body
    /// bounds it): refused, a client's long value would fail the call, and Envoy, failing
    /// open by default, would let the request through counted nowhere; it is counted under
    /// its hash instead ([`Config::matching`]).
    pub(crate) fn admit_shape(
        &self,
        domain: &str,
        descriptors: usize,
        entries: impl Iterator<Item = usize>,
    ) -> Result<(), ServiceError> {
        let l = &self.settings.limits;
        let refuse = |why: Rejection, e: String| {
            self.metrics.rejected(why);
            Err(ServiceError::Invalid(why, e))
        };
        if domain.is_empty() {
            return refuse(
                Rejection::Malformed,
                "rate limit domain must not be empty".into(),
            );
        }
        if descriptors == 0 {
            return refuse(
                Rejection::Malformed,
                "rate limit descriptor list must not be empty".into(),
            );
        }
        if descriptors > l.max_descriptors {
            return refuse(
                Rejection::TooManyDescriptors,
                format!(
                    "{descriptors} descriptors: at most {} a request",
                    l.max_descriptors
                ),
            );
        }
        if domain.len() > l.max_value_bytes {
            return refuse(
                Rejection::ValueTooLong,
                format!("the domain is longer than {} bytes", l.max_value_bytes),
            );
        }
        for entries in entries {
            if entries == 0 {
                return refuse(Rejection::Malformed, "a descriptor has no entries".into());
            }
            if entries > l.max_entries {
                return refuse(
                    Rejection::TooManyEntries,
                    format!(
                        "a descriptor of {entries} entries: at most {}",
                        l.max_entries
                    ),
                );
            }
        }
        Ok(())
    }

    /// Answers a request: every descriptor matched and decided (`Check`), previewed (`Peek`)
    /// or charged for a later settle (`Take`).
    pub async fn decide(&self, request: &Request, op: Op) -> Result<Response, ServiceError> {
        self.admit(request)?;
        let loaded = self.current();
        // Match every descriptor, then drop the rules another matched rule replaces.
        let matched: Vec<_> = request
            .descriptors
            .iter()
            .map(|d| {
                let long = self.settings.limits.max_value_bytes;
                loaded.config.matching(&request.domain, &d.entries, long)
            })
            .collect();
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .flat_map(|m| m.rule.replaces.iter().map(String::as_str))
            .collect();

        let mut statuses = Vec::with_capacity(matched.len());
        let mut decisions: Vec<Option<Decision>> = Vec::with_capacity(matched.len());
        let mut parts = Vec::new();
        // Beside each of `parts`, where to give it back if no ticket can carry them.
        let mut undo = Vec::new();
        // The longest lease of the in-flight permits taken: a ticket of permits alone lives
        // at least that long. One with a rate part keeps the ordinary life: that part's
        // Redis settle mark, which stops a replayed settle on another replica, lives no longer.
        let (mut lease, mut rate_part) = (Duration::ZERO, false);
        // An all-or-nothing domain counts a request's descriptors by takes, so that each
        // can be given back if another is over (`held`: the takes to give back then).
        let all_or_nothing = op != Op::Peek
            && (self.settings.stop_cache_key_increment_when_overlimit
                || loaded.config.all_or_nothing(&request.domain));
        let mut held = Vec::new();
        // The tally entries of the descriptors held: not counted if the request is refused.
        let mut given_back = Vec::new();
        let mut tally = Tally {
            metrics: &self.metrics,
            counts: Vec::with_capacity(matched.len()),
        };
        for (d, m) in request.descriptors.iter().zip(&matched) {
            // A descriptor's own count as it is (0: check without counting), else the
            // request's with 0 meaning 1: envoyproxy/ratelimit's reading.
            let hits = d.hits.unwrap_or(u64::from(request.hits.max(1)));
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
            let Some(slot) = loaded.rules.get(&rule.id) else {
                return Err(ServiceError::Unavailable(format!(
                    "{}: no limiter",
                    rule.id
                )));
            };
            let (requests_per_unit, unit) = match &rule.limit {
                Limit::Unlimited => {
                    // At most a request's own bound per descriptor: no client's
                    // `hits_addend` of 2^64 − 1 pins the counter at its ceiling.
                    let counted = hits.min(u64::from(u32::MAX));
                    self.metrics.count(&slot.counters.allowed, counted);
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
            let Some(engine) = slot.engine.as_ref() else {
                return Err(ServiceError::Unavailable(format!(
                    "{}: no limiter",
                    rule.id
                )));
            };
            let mut text = String::new();
            let key = self.key(rule, slot.version, &m.key, &mut text);
            // 0 hits: whether the count is already above the limit, counting nothing.
            let (op, cost, quota) = match hits {
                0 => (Op::Peek, 1, slot.at_limit.as_ref().unwrap_or(&slot.quota)),
                _ => (op, hits, &slot.quota),
            };
            let answer = match op {
                Op::Check if all_or_nothing => engine.take(key, quota, cost).await,
                Op::Check => engine.check(key, quota, cost).await.map(|o| (o, None)),
                Op::Peek => engine.peek(key, quota, cost).await.map(|o| (o, None)),
                Op::Take => engine.take(key, quota, cost).await,
            };
            let mut held_here = false;
            let answer = match answer {
                // All or nothing: an admitted take is kept, to give back if another is over.
                Ok((decision, Some(ticket))) if all_or_nothing => {
                    if ticket.is_open() {
                        held_here = true;
                        let part = Part {
                            rule: rule.id.clone(),
                            version: slot.version,
                            key: m.key.clone(),
                            ticket,
                        };
                        let owned = (key.text.to_owned(), key.hash);
                        held.push((engine.clone(), owned, quota, part));
                    }
                    Ok((decision, None))
                }
                other => other,
            };
            let decision = match answer {
                Ok((decision, ticket)) => {
                    match (&ticket, &slot.quota) {
                        (Some(_), Algorithm::InFlight(q)) => lease = lease.max(q.lease()),
                        (Some(_), _) => rate_part = true,
                        (None, _) => {}
                    }
                    if let Some(ticket) = ticket {
                        undo.push((engine.clone(), (key.text.to_owned(), key.hash), quota));
                        parts.push(Part {
                            rule: rule.id.clone(),
                            version: slot.version,
                            key: m.key.clone(),
                            ticket,
                        });
                    }
                    Some(decision)
                }
                // More than the limit can ever admit: over the limit, as a counter would say.
                // envoyproxy/ratelimit counts it whole (INCRBY), so the key stays over for the
                // rest of its window; a fixed window that counts over-limit hits is pinned one
                // past its limit the same way (never counted whole: no counter at its ceiling).
                Err(EngineError::Cost(_)) => {
                    if let (Some(pin), Algorithm::FixedWindow(q)) = (&slot.at_limit, &slot.quota) {
                        if op != Op::Peek && q.policy() == Policy::Strict {
                            let past = slot.quota_capacity().saturating_add(1);
                            if let Err(e) = engine.check(key, pin, past).await {
                                self.metrics.backend_error();
                                return Err(ServiceError::Unavailable(format!("{}: {e}", rule.id)));
                            }
                        }
                    }
                    None
                }
                Err(e) => {
                    self.metrics.backend_error();
                    return Err(ServiceError::Unavailable(format!("{}: {e}", rule.id)));
                }
            };
            let over = decision.is_none_or(|d| d.is_denied());
            if op != Op::Peek {
                let counter = match (over, rule.shadow_mode || self.settings.global_shadow_mode) {
                    (false, _) => &slot.counters.allowed,
                    (true, false) => &slot.counters.over_limit,
                    (true, true) => &slot.counters.shadow,
                };
                // A cost the limiter refused (no decision: above what the rule admits at
                // once) counts one more than that, whatever its size: counted whole, one
                // request's `hits_addend` of 2^64 − 1 would pin the counter at its ceiling,
                // silencing every rate and alert drawn from it. (A decided cost is within.)
                let counted = match decision {
                    Some(_) => hits,
                    None => hits.min(slot.quota_capacity().saturating_add(1)),
                };
                tally.counts.push((counter, counted));
                if held_here {
                    given_back.push(tally.counts.len() - 1);
                }
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
            // The headers describe rates: an in-flight limit (a count of requests running)
            // has no `RateLimit` fields to give.
            decisions.push(decision.filter(|_| !matches!(slot.quota, Algorithm::InFlight(_))));
        }

        // Over the limit if any rate-limit descriptor is, or every quota-mode one is. As
        // envoyproxy/ratelimit counts them, a quota-mode descriptor is one its rule decided:
        // not an unlimited rule's, a replaced one's or a refund's, which cannot be over, and
        // counted would keep "every quota-mode one" from ever holding.
        let (mut failed, mut quota, mut quota_failed) = (0, 0, 0);
        for ((s, m), d) in statuses.iter().zip(&matched).zip(&request.descriptors) {
            let quota_mode = m.as_ref().is_some_and(|m| {
                let rule = &m.rule;
                let replaced = !rule.name.is_empty() && replaced.contains(&rule.name.as_str());
                rule.quota_mode
                    && matches!(rule.limit, Limit::Limited { .. })
                    && !replaced
                    && !d.negative
            });
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
        if overall == Code::OverLimit {
            // All or nothing: every descriptor that admitted the request gives its count
            // back, and no ticket is issued.
            for (engine, (text, hash), quota, mut part) in held {
                let key = Key { text: &text, hash };
                if let Err(e) = engine.settle(key, quota, &mut part.ticket, 0).await {
                    // The count stands: it errs strict.
                    self.metrics.backend_error();
                    return Err(ServiceError::Unavailable(e.to_string()));
                }
            }
            // ...and is not counted allowed either: a client repeating such a request would
            // raise `allowed` by as much each time, charging nothing.
            for i in given_back {
                tally.counts[i].1 = 0;
            }
        } else if op == Op::Take {
            // Admitted: a take's ticket settles every descriptor it charged.
            for (engine, key, quota, part) in held {
                undo.push((engine, key, quota));
                parts.push(part);
            }
        }
        let headers = self.headers(&statuses, &decisions, overall);
        let ticket = match parts.is_empty() {
            true => None,
            false => {
                // A settle's body is the token and a little JSON around it.
                let max_len = self.settings.limits.max_body_bytes.saturating_sub(64);
                let at_least = if rate_part { Duration::ZERO } else { lease };
                match self
                    .tickets
                    .issue(parts, crate::tickets::unix_ms(), at_least, max_len)
                {
                    Ok(token) => Some(token),
                    Err(NotIssued::Io(e)) => return Err(ServiceError::Unavailable(e.to_string())),
                    Err(NotIssued::TooLarge { len, parts }) => {
                        // A ticket that no settle could carry: the take is refused, and
                        // every part it charged given back, as an all-or-nothing take over
                        // the limit is.
                        for ((engine, (text, hash), quota), mut part) in undo.into_iter().zip(parts)
                        {
                            let key = Key { text: &text, hash };
                            if let Err(e) = engine.settle(key, quota, &mut part.ticket, 0).await {
                                // The count stands: it errs strict.
                                self.metrics.backend_error();
                                return Err(ServiceError::Unavailable(e.to_string()));
                            }
                        }
                        // Refused whole, its charges given back: nothing of it is counted.
                        tally.counts.clear();
                        self.metrics.rejected(Rejection::TicketTooLarge);
                        return Err(ServiceError::Invalid(
                            Rejection::TicketTooLarge,
                            format!(
                                "the take's ticket would be {len} bytes, more than a settle's \
                                 body may carry (max_body_bytes {}): take fewer or shorter \
                                 descriptors",
                                self.settings.limits.max_body_bytes
                            ),
                        ));
                    }
                }
            }
        };
        Ok(Response {
            overall_code: overall,
            statuses,
            headers,
            ticket,
        })
    }

    /// The headers of the descriptor closest to its limit (the first over it), as
    /// envoyproxy/ratelimit picks it. `Retry-After` only where the answer is `overall` over
    /// the limit: a shadow rule's breach is answered OK, and as envoyproxy/ratelimit's its
    /// fields say the limit is spent (remaining 0), but no client is told to wait.
    fn headers(
        &self,
        statuses: &[Status],
        decisions: &[Option<Decision>],
        overall: Code,
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
            .filter(|f| overall == Code::OverLimit || f.name.as_str() != "retry-after")
            .filter_map(|f| Some((f.name.to_string(), f.value.to_str().ok()?.to_owned())))
            .collect()
    }

    /// Settles a take's `ticket` with the `actual` cost of each descriptor it charged: the
    /// difference is refunded, or charged as a debt. All its parts or none: every part is
    /// checked (its rule unchanged, `actual` within what the rule can ever owe) before any is
    /// applied. A ticket settles once, until it expires; a forged, altered, expired or
    /// settled one is refused alike, and changes nothing.
    pub async fn settle(&self, ticket: &str, actual: u64) -> Result<(), ServiceError> {
        self.settle_at(ticket, actual, crate::tickets::unix_ms())
            .await
    }

    /// [`settle`](Self::settle) at `now` (ms since the epoch: a seam, tests move time without
    /// sleeping).
    async fn settle_at(&self, token: &str, actual: u64, now: u64) -> Result<(), ServiceError> {
        let unknown = || ServiceError::Ticket("no such open ticket".into());
        let claims = self.tickets.open(token, now).map_err(|_| unknown())?;
        let loaded = self.current();
        let mut plan = Vec::with_capacity(claims.parts.len());
        for part in &claims.parts {
            let slot = loaded
                .rules
                .get(&part.rule)
                .filter(|s| s.version == part.version)
                .ok_or_else(|| ServiceError::Ticket(format!("the rule {} changed", part.rule)))?;
            let engine = slot.engine.as_ref().ok_or_else(unknown)?;
            let most = slot.quota_capacity();
            if actual > most {
                self.metrics.rejected(Rejection::Cost);
                return Err(ServiceError::Invalid(
                    Rejection::Cost,
                    format!(
                        "actual {actual} is more than the rule {} can ever owe ({most})",
                        part.rule
                    ),
                ));
            }
            let rule = slot.rule.clone();
            plan.push((engine.clone(), &slot.quota, rule, slot.version));
        }
        self.tickets.claim(&claims, now).map_err(|_| unknown())?;
        let nonce = claims.nonce;
        let mut applied = 0;
        for ((engine, quota, rule, version), mut part) in plan.into_iter().zip(claims.parts) {
            let mut text = String::new();
            let key = self.key(&rule, version, &part.key, &mut text);
            match engine.settle(key, quota, &mut part.ticket, actual).await {
                Ok(settled) => applied += usize::from(settled),
                Err(e) => {
                    // Open to a retry only where the backend marks each part's settle.
                    self.tickets.unclaim(&nonce);
                    return Err(match e {
                        EngineError::Backend(e) => {
                            self.metrics.backend_error();
                            ServiceError::Unavailable(e.to_string())
                        }
                        other => ServiceError::Ticket(other.to_string()),
                    });
                }
            }
        }
        // Settled before, on another replica (Redis' marks said so): a replay.
        if applied == 0 {
            return Err(unknown());
        }
        Ok(())
    }

    /// Whether the backend answers: with `health_checks_backend`, a peek of one rule's
    /// limiter (a round trip to Redis), else always.
    pub async fn healthy(&self) -> Result<(), ServiceError> {
        if !self.settings.health_checks_backend {
            return Ok(());
        }
        let loaded = self.current();
        let Some(slot) = loaded
            .rules
            .values()
            .find(|s| s.engine.is_some() && !matches!(s.quota, Algorithm::DenyAll))
        else {
            return Ok(());
        };
        let Some(engine) = &slot.engine else {
            return Ok(());
        };
        let text = "hotlimit:healthcheck";
        let key = Key {
            hash: self.engines.key_hash(0, text),
            text,
        };
        match engine.peek(key, &slot.quota, 1).await {
            Ok(_) | Err(EngineError::Cost(_)) => Ok(()),
            Err(e) => Err(ServiceError::Unavailable(format!(
                "backend unreachable: {e}"
            ))),
        }
    }

    /// The state key of descriptor key `key` under `rule` (of version `version`): in memory
    /// a keyed hash of both (nothing formatted); on Redis and the fleet limiter the text
    /// `<rule>:<algorithm>:<key>`, written into `text`.
    fn key<'a>(
        &self,
        rule: &crate::config::Rule,
        version: u64,
        key: &'a str,
        text: &'a mut String,
    ) -> Key<'a> {
        // Only the memory backend keys by the hash.
        match self.settings.backend {
            Backend::Memory { .. } => Key {
                text: key,
                hash: self.engines.key_hash(version, key),
            },
            Backend::Hybrid { .. } | Backend::Redis { .. } => {
                use std::fmt::Write;
                let _ = write!(text, "{}:{}:{key}", rule.id, rule_algorithm(rule));
                Key { text, hash: 0 }
            }
        }
    }

    /// How many settled tickets the service remembers now (each until it expires).
    pub fn settled_tickets(&self) -> usize {
        self.tickets.remembered()
    }
}

impl Slot {
    /// The most a settle's `actual` may be: what the rule admits at once (a window's limit,
    /// GCRA's burst, EARRRL's capacity), so a settle locks a key for at most one window or
    /// one burst's horizon.
    fn quota_capacity(&self) -> u64 {
        match &self.quota {
            Algorithm::DenyAll => 0,
            Algorithm::FixedWindow(q) => q.capacity(),
            Algorithm::SlidingWindow(q) => q.capacity(),
            Algorithm::SubWindow(q) => q.capacity(),
            Algorithm::SlidingLog(q) => q.capacity(),
            Algorithm::Gcra(q) => q.capacity(),
            Algorithm::Earrrl(q) => q.capacity(),
            Algorithm::Exponential(q) => q.capacity(),
            Algorithm::InFlight(q) => q.capacity(),
            Algorithm::Outside(o) => o.capacity(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The algorithm's name in a rule's state keys.
fn rule_algorithm(rule: &crate::config::Rule) -> &'static str {
    match &rule.limit {
        Limit::Limited { algorithm, .. } => algorithm.name(),
        Limit::Unlimited => "unlimited",
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
    /// A rule's limiter could not be built: its backend could not be reached or cannot run it.
    Rule(RuleError),
    /// The sweep thread could not start.
    Spawn(std::io::Error),
    /// The ticket key could not be made (no randomness, a bad secret).
    Tickets(std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(e) => e.fmt(f),
            StartError::Rule(e) => e.fmt(f),
            StartError::Spawn(e) => write!(f, "cannot start the sweep thread: {e}"),
            StartError::Tickets(e) => write!(f, "tickets: {e}"),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Config(_) => None,
            StartError::Rule(e) => Some(&e.error),
            StartError::Spawn(e) | StartError::Tickets(e) => Some(e),
        }
    }
}

/// A rule whose class's limiter could not be built.
#[derive(Debug)]
pub struct RuleError {
    /// The rule's id.
    pub rule: String,
    /// Why.
    pub error: crate::engine::BuildError,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.rule, self.error)
    }
}

/// The names of the limiters `loaded`'s rules use.
fn in_use(loaded: &Loaded) -> HashSet<String> {
    loaded
        .rules
        .values()
        .filter_map(|s| s.limiter.clone())
        .collect()
}

/// The rules of `config`, each on its class's limiter (built on the class's first rule, kept
/// across reloads while a rule uses it).
async fn build(config: Config, metrics: &Metrics, engines: &Engines) -> Result<Loaded, RuleError> {
    let mut rules = HashMap::new();
    for rule in config.rules() {
        let counters = metrics.rule(rule);
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        rule.fingerprint.hash(&mut hasher);
        let version = hasher.finish();
        let Limit::Limited {
            unit,
            algorithm,
            policy_set,
            class,
            base,
            requests_per_unit,
        } = &rule.limit
        else {
            rules.insert(
                rule.id.clone(),
                Slot {
                    rule: rule.clone(),
                    engine: None,
                    quota: Algorithm::DenyAll,
                    at_limit: None,
                    version,
                    limiter: None,
                    counters,
                },
            );
            continue;
        };
        let (quota, at_limit) = match algorithm {
            Algorithm::FixedWindow(q) => {
                // Hits over the limit count, as envoyproxy/ratelimit counts them (with
                // `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` too: the key going over is still
                // incremented there, only the request's other keys are not).
                let policy = if *policy_set {
                    q.policy()
                } else {
                    Policy::Strict
                };
                let q = q.with_policy(policy);
                let above = FixedWindow::new(u64::from(*requests_per_unit) + 1, unit.duration())
                    .map(|w| Algorithm::FixedWindow(w.with_policy(policy)))
                    .ok();
                (Algorithm::FixedWindow(q), above)
            }
            other => (other.clone(), None),
        };
        // The class's limiter is built with its base quota; each request brings its rule's.
        let base = match base {
            Algorithm::FixedWindow(_) => quota.clone(),
            b => b.clone(),
        };
        let engine = engines
            .get(class, &base, unit.duration())
            .await
            .map_err(|error| RuleError {
                rule: rule.id.clone(),
                error,
            })?;
        rules.insert(
            rule.id.clone(),
            Slot {
                rule: rule.clone(),
                engine: Some(engine),
                quota,
                at_limit,
                version,
                limiter: Some(class.clone()),
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

    const RULES: &str = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: big
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: job
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: in_flight, lease: 10m}
";

    /// A service on a frozen clock with `RULES` (and `max_settled` settled tickets kept).
    async fn service(max_settled: usize) -> Service {
        let settings = Settings {
            backend: Backend::Memory {
                max_keys: 1_000,
                clock: Some(ManualClock::default()),
            },
            max_settled_tickets: max_settled,
            ..Settings::memory()
        };
        Service::from_sources(&[(PathBuf::from("d.yaml"), RULES.into())], settings)
            .await
            .unwrap()
    }

    /// One descriptor per `(key, value)`, each costing `cost`.
    fn request(entries: &[(&str, &str)], cost: u64) -> Request {
        Request {
            domain: "d".into(),
            descriptors: entries
                .iter()
                .map(|(k, v)| Descriptor {
                    entries: vec![((*k).into(), (*v).into())],
                    hits: Some(cost),
                    negative: false,
                })
                .collect(),
            hits: 0,
        }
    }

    /// What `k=value` has left (a peek of 1, plus the peeked unit).
    async fn left(s: &Service, key: &str, value: &str) -> u32 {
        let r = s
            .decide(&request(&[(key, value)], 1), Op::Peek)
            .await
            .unwrap();
        r.statuses[0].limit_remaining + u32::from(r.overall_code == Code::Ok)
    }

    /// A take of `cost` on each entry: its token and when it was issued.
    async fn take(s: &Service, entries: &[(&str, &str)], cost: u64) -> (String, u64) {
        let r = s.decide(&request(entries, cost), Op::Take).await.unwrap();
        let token = r.ticket.expect("an admitted take has a ticket");
        let issued = s.tickets.open(&token, 0).unwrap().issued;
        (token, issued)
    }

    fn refused(r: Result<(), ServiceError>) -> String {
        match r {
            Err(ServiceError::Ticket(e)) => e,
            other => panic!("expected a refused ticket, got {other:?}"),
        }
    }

    // A ticket settles once, until it is 60 s old (the Redis settle mark's life): 1 ms before,
    // the refund lands; at 60 s it is refused and the charge stands; a second settle of a
    // settled ticket is refused. No sleeping: the settles are made at chosen instants.
    // Pins G74, G75.
    #[tokio::test(flavor = "current_thread")]
    async fn a_ticket_settles_once_until_it_is_60_s_old() {
        let s = service(1_000).await;
        let ttl = 60_000;
        assert_eq!(s.settings.ticket_ttl, Duration::from_millis(ttl));

        let (token, at) = take(&s, &[("k", "a")], 3).await;
        s.settle_at(&token, 0, at + ttl - 1).await.unwrap();
        assert_eq!(left(&s, "k", "a").await, 5);
        let e = refused(s.settle_at(&token, 0, at + 1).await);
        assert_eq!(e, "no such open ticket");

        let (token, at) = take(&s, &[("k", "b")], 3).await;
        refused(s.settle_at(&token, 0, at + ttl).await);
        assert_eq!(left(&s, "k", "b").await, 2);
        assert_eq!(s.settled_tickets(), 1);
    }

    // An in-flight permit's ticket lives as long as its lease (10 min here), not the 60 s of
    // the others, so a request that ran long still gives its permit back; once.
    // Pins G76.
    #[tokio::test(flavor = "current_thread")]
    async fn an_in_flight_ticket_lives_as_long_as_its_lease() {
        let s = service(1_000).await;
        let (token, at) = take(&s, &[("job", "x")], 1).await;
        assert_eq!(left(&s, "job", "x").await, 0);
        s.settle_at(&token, 0, at + 9 * 60_000).await.unwrap();
        assert_eq!(left(&s, "job", "x").await, 1);
        refused(s.settle_at(&token, 0, at + 9 * 60_000).await);
        let (token, at) = take(&s, &[("job", "y")], 1).await;
        refused(s.settle_at(&token, 0, at + 10 * 60_000).await);
        assert_eq!(left(&s, "job", "y").await, 0);
        // A take with a rate part too keeps the ordinary 60 s: that part's Redis settle mark
        // lives no longer, and a ticket must not outlive what stops its replay.
        let (token, at) = take(&s, &[("job", "z"), ("k", "z")], 1).await;
        refused(s.settle_at(&token, 0, at + 60_000).await);
        assert_eq!(left(&s, "job", "z").await, 0);
    }

    // A settle's `actual` is bounded by what its rule can ever owe (here the limit, 5): 6 is
    // refused (400) and changes nothing; the ticket then settles at 5, all spent.
    // Pins G75.
    #[tokio::test(flavor = "current_thread")]
    async fn an_actual_above_what_the_rule_can_owe_is_refused_and_changes_nothing() {
        let s = service(1_000).await;
        let (token, at) = take(&s, &[("k", "c")], 1).await;
        match s.settle_at(&token, 6, at).await {
            Err(ServiceError::Invalid(Rejection::Cost, e)) => {
                assert_eq!(e, "actual 6 is more than the rule d.k can ever owe (5)")
            }
            other => panic!("expected a refused actual, got {other:?}"),
        }
        assert_eq!(left(&s, "k", "c").await, 4);
        s.settle_at(&token, 5, at).await.unwrap();
        assert_eq!(left(&s, "k", "c").await, 0);
    }

    // A ticket over two rules settles both or neither: an actual one rule can owe (100) but
    // the other cannot (5) changes neither; one both can owe settles both.
    // Pins G75.
    #[tokio::test(flavor = "current_thread")]
    async fn a_ticket_over_two_rules_settles_both_or_neither() {
        let s = service(1_000).await;
        let (token, at) = take(&s, &[("k", "x"), ("big", "x")], 2).await;
        assert_eq!(
            (left(&s, "k", "x").await, left(&s, "big", "x").await),
            (3, 98)
        );
        assert!(matches!(
            s.settle_at(&token, 50, at).await,
            Err(ServiceError::Invalid(Rejection::Cost, _))
        ));
        assert_eq!(
            (left(&s, "k", "x").await, left(&s, "big", "x").await),
            (3, 98)
        );
        s.settle_at(&token, 0, at).await.unwrap();
        assert_eq!(
            (left(&s, "k", "x").await, left(&s, "big", "x").await),
            (5, 100)
        );
    }

    // The settled set is bounded: with room for 2, a third settle forgets the oldest and
    // from then on refuses every ticket issued up to it (it may have been one of them), so
    // no ticket settles twice; takes are never refused.
    // Pins G75.
    #[tokio::test(flavor = "current_thread")]
    async fn the_settled_set_is_bounded_and_never_lets_a_ticket_settle_twice() {
        let s = service(2).await;
        let mut tickets = Vec::new();
        for v in ["1", "2", "3"] {
            tickets.push(take(&s, &[("k", v)], 1).await);
            // Each issued at a later millisecond.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let now = tickets[2].1;
        for (token, _) in &tickets {
            s.settle_at(token, 0, now).await.unwrap();
        }
        assert_eq!(s.settled_tickets(), 2);
        for (token, _) in &tickets {
            refused(s.settle_at(token, 0, now).await);
        }
        // The forgotten one settled once: its refund once, nothing more.
        assert_eq!(left(&s, "k", "1").await, 5);
    }

    // A rule that changed (its limit) settles no ticket taken under the old one: refused,
    // nothing changed; an unchanged rule's ticket still settles after the reload.
    // Pins G75.
    #[tokio::test(flavor = "current_thread")]
    async fn a_ticket_of_a_changed_rule_is_refused() {
        let s = service(1_000).await;
        let (changed, at) = take(&s, &[("k", "r")], 2).await;
        let (kept, _) = take(&s, &[("big", "r")], 2).await;
        let text = RULES.replace("requests_per_unit: 5", "requests_per_unit: 6");
        assert!(s
            .reload_from(&[(PathBuf::from("d.yaml"), text)])
            .await
            .unwrap());
        let e = refused(s.settle_at(&changed, 0, at).await);
        assert_eq!(e, "the rule d.k changed");
        s.settle_at(&kept, 0, at).await.unwrap();
        assert_eq!(left(&s, "big", "r").await, 100);
    }

    // Every rule of a class shares its limiter: the 2 daily windows share one, the in-flight
    // rule has its own; a GCRA rule adds a third, and a reload that drops it drops its
    // limiter.
    // Pins G75.
    #[tokio::test(flavor = "current_thread")]
    async fn rules_of_one_class_share_a_limiter() {
        let s = service(1_000).await;
        assert_eq!(s.limiters(), 2);
        let more = format!(
            "{RULES}  - key: g\n    rate_limit: {{unit: minute, requests_per_unit: 5, algorithm: gcra}}\n"
        );
        s.reload_from(&[(PathBuf::from("d.yaml"), more)])
            .await
            .unwrap();
        assert_eq!(s.limiters(), 3);
        s.reload_from(&[(PathBuf::from("d.yaml"), RULES.into())])
            .await
            .unwrap();
        assert_eq!(s.limiters(), 2);
    }
}
