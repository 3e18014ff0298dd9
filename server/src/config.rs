//! envoyproxy/ratelimit's YAML configuration, as its README documents it: domains, nested
//! descriptors, key/value and wildcard values, `rate_limit` (`unit`, `requests_per_unit`,
//! `name`, `replaces`, `unlimited`), `shadow_mode`, `quota_mode`, `share_threshold`,
//! `detailed_metric`, `value_to_metric`, `metadata`; plus hotlimit's per-rule algorithm and a
//! domain's `all_or_nothing` (its descriptors counted all or none).
//!
//! A file is validated whole before it is used: a bad one is rejected with its file, line and
//! reason, and the running configuration is kept.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hotlimit::algo::{
    Earrrl, Exponential, FixedWindow, Gcra, InFlight, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::{Policy, Rate};
use serde::Deserialize;

use crate::outside::{Algorithms, Outside};

/// A rate limit's time unit, as Envoy's `RateLimitResponse.RateLimit.Unit` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// Seven days.
    Week,
    /// Thirty days (envoyproxy/ratelimit's divider).
    Month,
    /// 365 days (envoyproxy/ratelimit's divider).
    Year,
}

impl Unit {
    /// The unit's length.
    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }

    /// Parses a unit as envoyproxy/ratelimit does: case-insensitive.
    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// The unit's name in Envoy's enum (`SECOND`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

/// How a rule decides: envoyproxy/ratelimit's fixed window by default, or one of hotlimit's
/// algorithms (the `algorithm` extension), built from `requests_per_unit` per `unit`.
#[derive(Debug, Clone)]
pub enum Algorithm {
    /// `requests_per_unit: 0`: every request is over the limit (a block list entry).
    DenyAll,
    /// `fixed_window` (the default): `requests_per_unit` per window of one `unit`.
    FixedWindow(FixedWindow),
    /// `sliding_window`: the weighted estimate over the previous and current windows.
    SlidingWindow(SlidingWindow),
    /// `sub_window`: a window of `buckets` buckets (default 60).
    SubWindow(SubWindow),
    /// `sliding_log`: exact in every window; O(limit) memory per key.
    SlidingLog(SlidingLog),
    /// `gcra`: `requests_per_unit` per `unit`, evenly spread, with a `burst` (default
    /// `requests_per_unit`).
    Gcra(Gcra),
    /// `earrrl`: a decaying average rate of at most `requests_per_unit` per `unit`, with a
    /// `half_life` (default one `unit`); abusers stay locked out while they keep abusing.
    Earrrl(Earrrl),
    /// `exponential`: Exim's smoothed rate of `requests_per_unit` per `unit`.
    Exponential(Exponential),
    /// `in_flight`: at most `requests_per_unit` permits held at once per key, not per unit: a
    /// take holds them, a settle of its ticket with 0 gives them back, and one never given back
    /// expires within its `lease` (default one `unit`, at least 10 s). Every backend.
    InFlight(InFlight),
    /// An algorithm of your own, registered by name ([`crate::outside`]).
    Outside(Outside),
}

impl Algorithm {
    /// The extension's name for it.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::DenyAll => "deny_all",
            Algorithm::FixedWindow(_) => "fixed_window",
            Algorithm::SlidingWindow(_) => "sliding_window",
            Algorithm::SubWindow(_) => "sub_window",
            Algorithm::SlidingLog(_) => "sliding_log",
            Algorithm::Gcra(_) => "gcra",
            Algorithm::Earrrl(_) => "earrrl",
            Algorithm::Exponential(_) => "exponential",
            Algorithm::InFlight(_) => "in_flight",
            Algorithm::Outside(o) => o.name(),
        }
    }
}

/// What a matched descriptor is limited by.
#[derive(Debug, Clone)]
pub enum Limit {
    /// `unlimited: true`: always OK, never counted.
    Unlimited,
    /// A limit of `requests_per_unit` per `unit`.
    Limited {
        /// The configured count.
        requests_per_unit: u32,
        /// The configured unit.
        unit: Unit,
        /// How the rule decides.
        algorithm: Algorithm,
        /// Whether the rule names its `policy` (else the server's default applies to a
        /// fixed window: over-limit hits counted, as envoyproxy/ratelimit counts them).
        policy_set: bool,
        /// The rules whose states one limiter can keep for all (the library's per-request
        /// quotas): the algorithm and what its states are laid out for (a window's length, a
        /// sub-window's buckets, EARRRL's half-life).
        class: String,
        /// The quota the class's limiter is built with (it decides nothing: every request
        /// brings its rule's; its sweeps read it).
        base: Algorithm,
    },
}

/// One `rate_limit` block, at its place in a domain's descriptor tree.
#[derive(Debug)]
pub struct Rule {
    /// The domain.
    pub domain: String,
    /// The rule's place: `domain.key_value.key` as envoyproxy/ratelimit names it in its stats.
    pub id: String,
    /// The limit.
    pub limit: Limit,
    /// `rate_limit.name` (empty if unset): what another rule's `replaces` names.
    pub name: String,
    /// The names of the rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `shadow_mode`: decided and counted, but always answered OK.
    pub shadow_mode: bool,
    /// `quota_mode`: over the limit only when every quota-mode descriptor is.
    pub quota_mode: bool,
    /// What identifies the rule's state across reloads: its place and its limit. A reload
    /// keeps the state of every rule whose fingerprint is unchanged.
    pub fingerprint: String,
}

/// A configuration error: the file, the line and column where known, and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// Line and column (1-based), where the YAML parser knows them.
    pub location: Option<(usize, usize)>,
    /// Why it was rejected.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.location {
            Some((line, column)) => write!(
                f,
                "{}:{line}:{column}: {}",
                self.file.display(),
                self.reason
            ),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
    }
}

impl std::error::Error for ConfigError {}

// ---- The YAML as written ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoot {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Siblings,
    // hotlimit's extension.
    #[serde(default)]
    all_or_nothing: bool,
}

/// A descriptor list: its entries' `key_value`s are unique.
#[derive(Default)]
struct Siblings(Vec<Descriptor>);

impl<'de> Deserialize<'de> for Siblings {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `any`, not `seq`: an empty `descriptors:` (null) is an empty list.
        d.deserialize_any(SiblingsVisitor)
    }
}

struct SiblingsVisitor;

impl<'de> serde::de::Visitor<'de> for SiblingsVisitor {
    type Value = Siblings;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of descriptors")
    }

    fn visit_unit<E>(self) -> Result<Siblings, E> {
        Ok(Siblings::default())
    }

    fn visit_none<E>(self) -> Result<Siblings, E> {
        Ok(Siblings::default())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Siblings, A::Error> {
        let mut seen = std::collections::HashSet::new();
        let mut list = Vec::new();
        while let Some(d) = seq.next_element_seed(DescriptorSeed(&mut seen))? {
            list.push(d);
        }
        Ok(Siblings(list))
    }
}

/// Reads one descriptor of a list and validates it inside its own mapping, so that an error
/// carries the descriptor's line (the YAML parser marks an error with the node being read
/// when it is raised), a duplicate's included: `seen` holds its siblings' `key_value`s.
struct DescriptorSeed<'s>(&'s mut std::collections::HashSet<String>);

impl<'de> serde::de::DeserializeSeed<'de> for DescriptorSeed<'_> {
    type Value = Descriptor;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Descriptor, D::Error> {
        // `any`: anything but a map is refused with what it is ("invalid type: string").
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for DescriptorSeed<'_> {
    type Value = Descriptor;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a descriptor (a map with a `key`)")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Descriptor, A::Error> {
        use serde::de::Error;
        let raw = RawDescriptor::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        let d = Descriptor::try_from(raw).map_err(A::Error::custom)?;
        if !self.0.insert(d.composite.clone()) {
            return Err(A::Error::custom(format_args!(
                "duplicate descriptor composite key '{}'",
                d.composite
            )));
        }
        Ok(d)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: Siblings,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    /// Accepted, not used: metrics are per rule, never per request value.
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: bool,
    /// Accepted, not used, as `detailed_metric`.
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    /// Arbitrary; accepted, not used (no dynamic metadata in responses).
    #[serde(default, rename = "metadata")]
    _metadata: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: String,
    #[serde(default)]
    replaces: Vec<RawReplaces>,
    // hotlimit's extension.
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    half_life: Option<String>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    buckets: Option<u32>,
    #[serde(default)]
    lease: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplaces {
    #[serde(default)]
    name: String,
}

/// A descriptor, validated.
struct Descriptor {
    value: String,
    /// `key` or `key_value`: its name among its siblings.
    composite: String,
    limit: Option<(Limit, String, Vec<String>)>,
    descriptors: Vec<Descriptor>,
    shadow_mode: bool,
    quota_mode: bool,
    share_threshold: bool,
}

impl TryFrom<RawDescriptor> for Descriptor {
    type Error = String;

    fn try_from(raw: RawDescriptor) -> Result<Self, String> {
        if raw.key.is_empty() {
            return Err("descriptor has empty key".into());
        }
        let composite = if raw.value.is_empty() {
            raw.key.clone()
        } else {
            format!("{}_{}", raw.key, raw.value)
        };
        if raw.share_threshold && !raw.value.contains('*') {
            return Err(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{composite}'"
            ));
        }
        let limit = raw.rate_limit.map(validate_rate_limit).transpose()?;
        Ok(Descriptor {
            value: raw.value,
            composite,
            limit,
            descriptors: raw.descriptors.0,
            shadow_mode: raw.shadow_mode,
            quota_mode: raw.quota_mode,
            share_threshold: raw.share_threshold,
        })
    }
}

fn validate_rate_limit(raw: RawRateLimit) -> Result<(Limit, String, Vec<String>), String> {
    for r in &raw.replaces {
        if r.name.is_empty() {
            return Err("should not have an empty replaces entry".into());
        }
        if r.name == raw.name {
            return Err("replaces should not contain name of same descriptor".into());
        }
    }
    let replaces = raw.replaces.into_iter().map(|r| r.name).collect();
    let unit = match raw.unit.as_deref() {
        None | Some("") => None,
        Some(u) => match Unit::parse(u) {
            Some(unit) => Some(unit),
            None if raw.unlimited => None,
            None => return Err(format!("invalid rate limit unit '{u}'")),
        },
    };
    if raw.unlimited {
        if unit.is_some() {
            return Err("should not specify rate limit unit when unlimited".into());
        }
        return Ok((Limit::Unlimited, raw.name, replaces));
    }
    let Some(unit) = unit else {
        return Err(format!(
            "invalid rate limit unit '{}'",
            raw.unit.unwrap_or_default()
        ));
    };
    let n = raw.requests_per_unit;
    let window = unit.duration();
    let policy = raw
        .policy
        .as_deref()
        .map(|p| p.parse::<Policy>().map_err(|e| e.to_string()))
        .transpose()?;
    let name = raw.algorithm.as_deref().unwrap_or("fixed_window");
    let only = |allowed: &[&str]| -> Result<(), String> {
        let given = [
            ("burst", raw.burst.is_some()),
            ("half_life", raw.half_life.is_some()),
            ("buckets", raw.buckets.is_some()),
            ("lease", raw.lease.is_some()),
        ];
        match given.iter().find(|(k, set)| *set && !allowed.contains(k)) {
            Some((k, _)) => Err(format!("'{k}' does not apply to algorithm '{name}'")),
            None => Ok(()),
        }
    };
    let e = |e: hotlimit::ConfigError| e.to_string();
    // A block-all rule (0 a unit) has its options checked all the same, on a one-unit build.
    let m = n.max(1);
    let algorithm = match name {
        "fixed_window" => {
            only(&[])?;
            let q = FixedWindow::new(m.into(), window).map_err(e)?;
            Algorithm::FixedWindow(policy.map_or(q, |p| q.with_policy(p)))
        }
        "sliding_window" => {
            only(&[])?;
            let q = SlidingWindow::new(m.into(), window).map_err(e)?;
            Algorithm::SlidingWindow(policy.map_or(q, |p| q.with_policy(p)))
        }
        "sub_window" => {
            only(&["buckets"])?;
            let q = SubWindow::new(m.into(), window, raw.buckets.unwrap_or(60)).map_err(e)?;
            Algorithm::SubWindow(policy.map_or(q, |p| q.with_policy(p)))
        }
        "sliding_log" => {
            only(&[])?;
            let q = SlidingLog::new(m.into(), window).map_err(e)?;
            Algorithm::SlidingLog(policy.map_or(q, |p| q.with_policy(p)))
        }
        "gcra" => {
            only(&["burst"])?;
            let rate = Rate::new(f64::from(m), window).map_err(e)?;
            let q = Gcra::new(rate)
                .and_then(|g| g.with_burst(raw.burst.unwrap_or(m.into())))
                .map_err(e)?;
            Algorithm::Gcra(policy.map_or(q, |p| q.with_policy(p)))
        }
        "earrrl" => {
            only(&["half_life"])?;
            let half_life = half_life(raw.half_life.as_deref(), window)?;
            let rate = Rate::new(f64::from(m), window).map_err(e)?;
            let q = Earrrl::new(half_life, rate).map_err(e)?;
            Algorithm::Earrrl(policy.map_or(q, |p| q.with_policy(p)))
        }
        "exponential" => {
            only(&[])?;
            let q = Exponential::new(f64::from(m), window).map_err(e)?;
            Algorithm::Exponential(policy.map_or(q, |p| q.with_policy(p)))
        }
        "in_flight" => {
            only(&["lease"])?;
            if policy.is_some() {
                return Err("'policy' does not apply to algorithm 'in_flight'".into());
            }
            let lease = duration("lease", raw.lease.as_deref(), window)?;
            Algorithm::InFlight(InFlight::new(m.into(), lease).map_err(e)?)
        }
        other => match OUTSIDE.with(|o| o.borrow().make(other, m, window)) {
            Some(made) => {
                only(&[])?;
                if policy.is_some() {
                    return Err(format!("'policy' does not apply to algorithm '{other}'"));
                }
                Algorithm::Outside(made?)
            }
            None => {
                let registered: Vec<&str> = OUTSIDE.with(|o| o.borrow().names().collect());
                let extra = registered
                    .iter()
                    .map(|n| format!(", {n}"))
                    .collect::<String>();
                return Err(format!(
                    "unknown algorithm '{other}' (expected fixed_window, sliding_window, sub_window, sliding_log, gcra, earrrl, exponential, in_flight{extra})"
                ));
            }
        },
    };
    let secs = window.as_secs();
    let (class, base) = match &algorithm {
        _ if n == 0 => (format!("deny_all/{secs}s"), Algorithm::DenyAll),
        Algorithm::SubWindow(_) => (
            format!("sub_window/{secs}s/{}", raw.buckets.unwrap_or(60)),
            algorithm.clone(),
        ),
        Algorithm::Gcra(_) => ("gcra".to_owned(), algorithm.clone()),
        // One limiter per lease: any `max` reads its states.
        Algorithm::InFlight(_) => {
            let lease = duration("lease", raw.lease.as_deref(), window)?;
            (
                format!("in_flight/{}ns", lease.as_nanos()),
                algorithm.clone(),
            )
        }
        // One limiter per distinct quota: nothing says another quota reads its states.
        Algorithm::Outside(o) => (o.class(), algorithm.clone()),
        Algorithm::Earrrl(q) => {
            let half_life = half_life(raw.half_life.as_deref(), window)?;
            // The lowest limit a rule can have, one a year: the class's sweeps keep a key
            // until its rate has decayed below a fraction of it, so no rule's key is dropped
            // while that rule would still limit it.
            let base = Rate::new(1.0, Unit::Year.duration())
                .and_then(|r| Earrrl::new(half_life, r))
                .map_or(*q, |b| b.with_policy(policy.unwrap_or(Policy::Strict)));
            (
                format!("earrrl/{}ns", half_life.as_nanos()),
                Algorithm::Earrrl(base),
            )
        }
        other => (format!("{}/{secs}s", other.name()), algorithm.clone()),
    };
    // Nothing admitted: the options were valid, nothing to build.
    let algorithm = if n == 0 {
        Algorithm::DenyAll
    } else {
        algorithm
    };
    Ok((
        Limit::Limited {
            requests_per_unit: n,
            unit,
            algorithm,
            policy_set: policy.is_some(),
            class,
            base,
        },
        raw.name,
        replaces,
    ))
}

// ---- The loaded configuration ----

/// A node of a domain's descriptor tree.
#[derive(Default, Debug)]
struct Node {
    /// By `key` or `key_value`.
    children: HashMap<String, Node>,
    /// The children whose value has a `*`: (the pattern split on `*`, its composite key).
    wildcards: Vec<(Vec<String>, String)>,
    rule: Option<Arc<Rule>>,
    /// With `share_threshold`: the wildcard value every match counts under.
    shared_pattern: Option<String>,
}

/// Every domain's rules, as loaded from one or more files.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Node>,
    rules: Vec<Arc<Rule>>,
    /// The domains whose requests count all their descriptors or none (`all_or_nothing`).
    all_or_nothing: std::collections::HashSet<String>,
}

/// A descriptor matched to a rule.
#[derive(Debug, Clone)]
pub struct Match {
    /// The rule.
    pub rule: Arc<Rule>,
    /// The state's key: the domain and every entry (a `share_threshold` entry by its pattern).
    pub key: String,
}

thread_local! {
    /// The outside algorithms the configuration being read may name: a rule is validated
    /// inside the YAML parser (so that its errors carry a line), which takes no context.
    static OUTSIDE: std::cell::RefCell<Algorithms> = std::cell::RefCell::default();
}

/// Puts `algorithms` in [`OUTSIDE`] until dropped, then what was there before.
struct Reading(Algorithms);

impl Reading {
    fn start(algorithms: &Algorithms) -> Reading {
        Reading(OUTSIDE.with(|o| o.replace(algorithms.clone())))
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        let before = std::mem::take(&mut self.0);
        OUTSIDE.with(|o| o.replace(before));
    }
}

impl Config {
    /// Loads the YAML files: each is one domain. `name` is what errors name the file by.
    pub fn from_sources<'a>(
        sources: impl IntoIterator<Item = (&'a Path, &'a str)>,
    ) -> Result<Config, ConfigError> {
        Config::from_sources_with(sources, &Algorithms::default())
    }

    /// [`from_sources`](Config::from_sources), where rules may also name the outside
    /// `algorithms`.
    pub fn from_sources_with<'a>(
        sources: impl IntoIterator<Item = (&'a Path, &'a str)>,
        algorithms: &Algorithms,
    ) -> Result<Config, ConfigError> {
        let _reading = Reading::start(algorithms);
        let mut config = Config::default();
        let mut owner: HashMap<String, PathBuf> = HashMap::new();
        for (file, text) in sources {
            let raw: RawRoot = parse_yaml(text).map_err(|(location, reason)| ConfigError {
                file: file.to_path_buf(),
                location,
                reason,
            })?;
            let whole = |reason: String| ConfigError {
                file: file.to_path_buf(),
                location: None,
                reason,
            };
            if raw.domain.is_empty() {
                return Err(whole("config file cannot have empty domain".into()));
            }
            if let Some(first) = owner.insert(raw.domain.clone(), file.to_path_buf()) {
                return Err(whole(format!(
                    "duplicate domain '{}' in config file (also in {})",
                    raw.domain,
                    first.display()
                )));
            }
            let mut root = Node::default();
            let prefix = format!("{}.", raw.domain);
            load(
                &mut root,
                &raw.domain,
                &prefix,
                raw.descriptors.0,
                &mut config.rules,
            );
            if raw.all_or_nothing {
                config.all_or_nothing.insert(raw.domain.clone());
            }
            config.domains.insert(raw.domain, root);
        }
        Ok(config)
    }

    /// Loads a file, or every `*.yaml` / `*.yml` file of a directory (sorted by name).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let texts = read_sources(path)?;
        Config::from_sources(texts.iter().map(|(p, t)| (p.as_path(), t.as_str())))
    }

    /// Every rule, in file order.
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Whether `domain`'s requests count all their descriptors or none (`all_or_nothing:
    /// true`, hotlimit's extension): a user, its organisation and a global budget at once.
    pub fn all_or_nothing(&self, domain: &str) -> bool {
        self.all_or_nothing.contains(domain)
    }

    /// The rule a descriptor's entries match, as envoyproxy/ratelimit matches it: level by
    /// level, `key_value` first, then a wildcard value, then the bare `key`; a rule applies
    /// only at the depth of the descriptor's last entry. Matching reads every entry whole; in
    /// the state key a key or value longer than `long` bytes is its SHA-256 (its first 128
    /// bits, `\#` and 32 hex digits: no escaped text has `\#`), so a client's long value is
    /// counted, under a key of bounded size.
    pub fn matching<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
        long: usize,
    ) -> Option<Match> {
        let mut node = self.domains.get(domain)?;
        let mut shared: Vec<Option<&str>> = Vec::new();
        let mut found = None;
        // One buffer for every level's `key_value`.
        let mut composite = String::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            let (key, value) = (key.as_ref(), value.as_ref());
            composite.clear();
            composite.push_str(key);
            composite.push('_');
            composite.push_str(value);
            let mut next = node.children.get(&composite);
            let mut by_wildcard = false;
            if next.is_none() {
                if let Some((_, child)) = node
                    .wildcards
                    .iter()
                    .find(|(parts, _)| wildcard_match(parts, &composite))
                {
                    next = node.children.get(child);
                    by_wildcard = true;
                }
            }
            if next.is_none() {
                next = node.children.get(key);
            }
            let Some(n) = next else { break };
            if by_wildcard {
                if let Some(pattern) = &n.shared_pattern {
                    shared.resize(i + 1, None);
                    shared[i] = Some(pattern);
                }
            }
            if let Some(rule) = &n.rule {
                if i == entries.len() - 1 {
                    found = Some(rule.clone());
                }
            }
            if n.children.is_empty() {
                break;
            }
            node = n;
        }
        let rule = found?;
        let mut key = String::with_capacity(64);
        push_escaped(&mut key, domain, long);
        for (i, (k, v)) in entries.iter().enumerate() {
            key.push('|');
            push_escaped(&mut key, k.as_ref(), long);
            key.push('=');
            push_escaped(
                &mut key,
                shared.get(i).copied().flatten().unwrap_or(v.as_ref()),
                long,
            );
        }
        Some(Match { rule, key })
    }
}

/// `|`, `=` and `\` escaped, so that no two descriptors share a key; a part longer than
/// `long` bytes written as `\#` and the first 128 bits of its SHA-256 in hex (the same on
/// every replica: Redis keys are shared).
fn push_escaped(out: &mut String, s: &str, long: usize) {
    if s.len() > long {
        use sha2::{Digest, Sha256};
        use std::fmt::Write;
        out.push_str("\\#");
        for b in &Sha256::digest(s.as_bytes())[..16] {
            let _ = write!(out, "{b:02x}");
        }
        return;
    }
    for c in s.chars() {
        if matches!(c, '|' | '=' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

fn load(
    node: &mut Node,
    domain: &str,
    parent: &str,
    list: Vec<Descriptor>,
    rules: &mut Vec<Arc<Rule>>,
) {
    for d in list {
        let id = format!("{parent}{}", d.composite);
        let mut child = Node::default();
        if d.value.contains('*') {
            node.wildcards.push((
                d.composite.split('*').map(str::to_owned).collect(),
                d.composite.clone(),
            ));
            if d.share_threshold {
                child.shared_pattern = Some(d.value.clone());
            }
        }
        if let Some((limit, name, replaces)) = d.limit {
            // Place and limit only: a rule taken out of shadow mode goes on counting, as
            // envoyproxy/ratelimit's (and this server's Redis keys) do.
            let fingerprint = format!("{id} {limit:?}");
            let rule = Arc::new(Rule {
                domain: domain.to_owned(),
                id: id.clone(),
                limit,
                name,
                replaces,
                shadow_mode: d.shadow_mode,
                quota_mode: d.quota_mode,
                fingerprint,
            });
            rules.push(rule.clone());
            child.rule = Some(rule);
        }
        load(&mut child, domain, &format!("{id}."), d.descriptors, rules);
        node.children.insert(d.composite, child);
    }
}

/// Whether `value` matches a pattern split on `*`, each `*` matching any run of characters.
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (first, last) = (&parts[0], &parts[parts.len() - 1]);
    if parts.len() == 1 {
        return first == value;
    }
    if value.len() < first.len() + last.len()
        || !value.starts_with(first.as_str())
        || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// The most a configuration file may hold, in bytes.
pub const MAX_FILE_BYTES: usize = 16 * 1024 * 1024;

/// A YAML document read within a budget: nodes, depth and alias replays bounded, so no file
/// (an alias bomb: a few lines that expand to billions of nodes) costs more than a few
/// hundred milliseconds and megabytes; errors with their line and column.
fn parse_yaml<T: serde::de::DeserializeOwned>(
    text: &str,
) -> Result<T, (Option<(usize, usize)>, String)> {
    if text.len() > MAX_FILE_BYTES {
        return Err((
            None,
            format!("the file is larger than {MAX_FILE_BYTES} bytes"),
        ));
    }
    let mut budget = serde_saphyr::Budget::default();
    // A configuration of 100,000 rules, each a few nodes, fits; an expansion past it stops.
    budget.max_nodes = 2_000_000;
    budget.max_events = 4_000_000;
    budget.max_depth = 64;
    budget.max_aliases = 10_000;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.with_snippet = false;
    options.alias_limits.max_total_replayed_events = 100_000;
    serde_saphyr::from_str_with_options(text, options).map_err(|err| {
        let location = err.location().map(|l| {
            (
                usize::try_from(l.line()).unwrap_or(usize::MAX),
                usize::try_from(l.column()).unwrap_or(usize::MAX),
            )
        });
        (location, strip_location(&err.without_snippet().to_string()))
    })
}

/// The parser's message without its trailing " at line L, column C" (the error carries both).
fn strip_location(message: &str) -> String {
    let message = message.strip_prefix("error: ").unwrap_or(message);
    match message.find(" at line ") {
        Some(at) => message[..at].to_owned(),
        None => message.to_owned(),
    }
}

/// The files a path names, with their text.
pub fn read_sources(path: &Path) -> Result<Vec<(PathBuf, String)>, ConfigError> {
    let io = |file: &Path, e: std::io::Error| ConfigError {
        file: file.to_path_buf(),
        location: None,
        reason: e.to_string(),
    };
    let files = if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| io(path, e))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
            })
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).map_err(|e| io(&file, e))?;
            Ok((file, text))
        })
        .collect()
}

/// EARRRL's `half_life`: a duration as humantime writes one (`"2s"`, `"250ms"`, `"1m 30s"`),
/// else one `unit`.
fn half_life(given: Option<&str>, unit: Duration) -> Result<Duration, String> {
    duration("half_life", given, unit)
}

/// A rule's duration field `field` as humantime writes one (`"2s"`, `"250ms"`, `"1m 30s"`),
/// else one `unit`.
fn duration(field: &str, given: Option<&str>, unit: Duration) -> Result<Duration, String> {
    match given {
        None => Ok(unit),
        Some(h) => match humantime::parse_duration(h) {
            Ok(d) if !d.is_zero() => Ok(d),
            Ok(_) => Err(format!("{field} '{h}' must be above zero")),
            Err(err) => Err(format!("{field} '{h}': {err}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_like_envoyproxy_ratelimit() {
        let split = |p: &str| p.split('*').map(str::to_owned).collect::<Vec<_>>();
        assert!(wildcard_match(&split("key1_value*"), "key1_value1"));
        assert!(wildcard_match(&split("key1_value*"), "key1_value"));
        assert!(!wildcard_match(&split("key1_value*"), "key1_valu"));
        assert!(wildcard_match(
            &split("path_/api/*/action"),
            "path_/api/123/action"
        ));
        assert!(!wildcard_match(
            &split("path_/api/*/action"),
            "path_/api/123/other"
        ));
        assert!(wildcard_match(
            &split("route_/api/*/resource/*/action"),
            "route_/api/v1/resource/123/action"
        ));
        assert!(!wildcard_match(
            &split("route_/api/*/resource/*/action"),
            "route_/api/v1/resource/action"
        ));
        // "ab*ba" must not match "aba": the prefix and suffix may not overlap.
        assert!(!wildcard_match(&split("ab*ba"), "aba"));
    }

    #[test]
    fn keys_escape_their_separators() {
        let config = Config::from_sources([(
            Path::new("t.yaml"),
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
        )])
        .unwrap();
        let one = config
            .matching("d", &[("a", "x|b=y"), ("b", "z")], 64)
            .unwrap();
        let two = config
            .matching("d", &[("a", "x"), ("b", "y|b=z")], 64)
            .unwrap();
        assert_ne!(one.key, two.key);
        assert_eq!(one.rule.id, "d.a.b");
    }
    /// A key or value past the bound is matched whole and kept as its SHA-256 in the state key:
    /// a key of bounded size, apart from every other value (one a byte apart, and a short value
    /// spelling the digest out, which is escaped).
    // Pins G75.
    #[test]
    fn a_long_value_is_matched_whole_and_keyed_by_its_hash() {
        let config = Config::from_sources([(
            Path::new("t.yaml"),
            "domain: d\ndescriptors:\n  - key: path\n    value: \"/api/*\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: any\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        )])
        .unwrap();
        let long = format!("/api/{}", "x".repeat(100_000));
        let one = config
            .matching("d", &[("path", long.as_str())], 64)
            .unwrap();
        assert_eq!(one.rule.id, "d.path_/api/*");
        assert_eq!(one.key.len(), "d|path=".len() + 2 + 32, "{}", one.key);
        let near = format!("{}y", &long[..long.len() - 1]);
        let two = config
            .matching("d", &[("path", near.as_str())], 64)
            .unwrap();
        assert_ne!(one.key, two.key);
        // A short value spelling a long one's digest, under a rule that takes any value: the
        // digest's `\` is escaped in it, so the two keys differ.
        let long = config.matching("d", &[("any", long.as_str())], 64).unwrap();
        let spelled = long.key["d|any=".len()..].to_owned();
        let forged = config
            .matching("d", &[("any", spelled.as_str())], 64)
            .unwrap();
        assert_eq!(forged.rule.id, long.rule.id);
        assert_ne!(forged.key, long.key);
        // At the bound, kept whole.
        let whole = format!("/api/{}", "x".repeat(59));
        let kept = config
            .matching("d", &[("path", whole.as_str())], 64)
            .unwrap();
        assert_eq!(kept.key, format!("d|path={whole}"));
    }

    #[test]
    fn an_earrrl_half_life_is_a_duration_and_a_bad_one_is_refused() {
        let rule = |half_life: &str| {
            Config::from_sources([(
                Path::new("t.yaml"),
                &*format!("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: second, requests_per_unit: 5, algorithm: earrrl, half_life: \"{half_life}\"}}\n"),
            )])
        };
        let class = |c: &Config| match &c.matching("d", &[("a", "x")], 64).unwrap().rule.limit {
            Limit::Limited { class, .. } => class.clone(),
            Limit::Unlimited => unreachable!("a limited rule"),
        };
        assert_eq!(class(&rule("2s").unwrap()), "earrrl/2000000000ns");
        assert_eq!(class(&rule("1m 30s").unwrap()), "earrrl/90000000000ns");
        assert_eq!(class(&rule("250ms").unwrap()), "earrrl/250000000ns");
        for bad in ["10", "0s", "soon", ""] {
            let err = rule(bad).unwrap_err();
            assert!(err.to_string().contains("half_life"), "{bad:?}: {err}");
        }
    }
}
