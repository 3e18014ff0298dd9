//! Prometheus counters: hits allowed, over the limit and in shadow mode, per rule. Labels are
//! the rule's domain and its place in the configuration, never a request's values, so the
//! number of series is bounded by the configuration, not by traffic.

use std::sync::atomic::Ordering;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::config::Rule;

/// A refused request's label: which bound it broke.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// A rule's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    rule: String,
}

/// The service's counters, and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    allowed: Family<RuleLabels, Counter>,
    over_limit: Family<RuleLabels, Counter>,
    shadow: Family<RuleLabels, Counter>,
    unmatched: Counter,
    rejected: Family<ReasonLabels, Counter>,
    backend_errors: Counter,
    config_load_success: Counter,
    config_load_error: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("hotlimit");
        let m = Metrics {
            allowed: Family::default(),
            over_limit: Family::default(),
            shadow: Family::default(),
            unmatched: Counter::default(),
            rejected: Family::default(),
            backend_errors: Counter::default(),
            config_load_success: Counter::default(),
            config_load_error: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("allowed", "Hits admitted, by rule", m.allowed.clone());
        registry.register(
            "over_limit",
            "Hits over the limit and answered so, by rule",
            m.over_limit.clone(),
        );
        registry.register(
            "shadow_mode",
            "Hits over the limit but answered OK (shadow_mode), by rule",
            m.shadow.clone(),
        );
        registry.register(
            "unmatched",
            "Descriptors that matched no rule (or an unknown domain)",
            m.unmatched.clone(),
        );
        registry.register(
            "rejected",
            "Requests refused before anything was counted, by the bound they broke",
            m.rejected.clone(),
        );
        registry.register(
            "backend_errors",
            "Requests answered with an error because the backend failed",
            m.backend_errors.clone(),
        );
        registry.register(
            "config_load_success",
            "Configurations loaded",
            m.config_load_success.clone(),
        );
        registry.register(
            "config_load_error",
            "Configurations rejected (the running one kept)",
            m.config_load_error.clone(),
        );
        Metrics { registry, ..m }
    }
}

fn labels(rule: &Rule) -> RuleLabels {
    RuleLabels {
        domain: rule.domain.clone(),
        rule: rule.id.clone(),
    }
}

/// One rule's counters, looked up once when the rule is loaded (a request counts without
/// building labels).
#[derive(Clone, Debug, Default)]
pub(crate) struct RuleCounters {
    pub(crate) allowed: Counter,
    pub(crate) over_limit: Counter,
    pub(crate) shadow: Counter,
}

impl Metrics {
    /// `rule`'s counters (the same series across reloads: same domain and place).
    pub(crate) fn rule(&self, rule: &Rule) -> RuleCounters {
        let l = labels(rule);
        RuleCounters {
            allowed: self.allowed.get_or_create(&l).clone(),
            over_limit: self.over_limit.get_or_create(&l).clone(),
            shadow: self.shadow.get_or_create(&l).clone(),
        }
    }

    pub(crate) fn unmatched(&self) {
        self.unmatched.inc();
    }

    pub(crate) fn rejected(&self, why: crate::service::Rejection) {
        self.rejected
            .get_or_create(&ReasonLabels { reason: why.name() })
            .inc();
    }

    /// Adds `hits` to `counter`, saturating, so that no count ever wraps back to a small
    /// number (the service bounds what one descriptor adds: its rule's limit plus one).
    pub(crate) fn count(&self, counter: &Counter, hits: u64) {
        let _ = counter
            .inner()
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(hits))
            });
    }

    pub(crate) fn backend_error(&self) {
        self.backend_errors.inc();
    }

    pub(crate) fn config_loaded(&self, ok: bool) {
        match ok {
            true => self.config_load_success.inc(),
            false => self.config_load_error.inc(),
        };
    }

    /// The counters in Prometheus' text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
