//! The configuration: [`RedisBuilder`], from [`RedisLimiter::builder`].

use super::FailMode;
#[cfg(doc)]
use super::{BackendError, RedisLimiter};
use std::fmt;
use std::time::Duration;

/// Configures a [`RedisLimiter`]; from [`RedisLimiter::builder`].
///
/// **Redis Cluster**: [`build`](RedisBuilder::build) asks the server at the URL `INFO cluster`; if
/// it is a cluster node (`cluster_enabled:1`), the limiter becomes a cluster client seeded with
/// that node and the nodes it knows (`CLUSTER NODES`), routing each key to its slot's primary.
/// [`seed_nodes`](RedisBuilder::seed_nodes) names more seeds and makes the limiter a cluster client
/// without asking.
#[derive(Debug, Clone)]
pub struct RedisBuilder<A> {
    pub(super) url: String,
    pub(super) seeds: Vec<String>,
    pub(super) algo: A,
    pub(super) prefix: String,
    pub(super) fail_mode: FailMode,
    pub(super) connect_timeout: Duration,
    pub(super) io_timeout: Duration,
    pub(super) local: Option<usize>,
    pub(super) reconnect_after: Duration,
}

impl<A> RedisBuilder<A> {
    /// The connect and I/O timeouts.
    pub(super) fn timeouts(&self) -> (Duration, Duration) {
        (self.connect_timeout, self.io_timeout)
    }

    /// The defaults, for [`RedisLimiter::builder`].
    pub(super) fn new(url: String, algo: A) -> Self {
        RedisBuilder {
            url,
            seeds: Vec::new(),
            algo,
            prefix: "hotlimit:".into(),
            fail_mode: FailMode::Open,
            connect_timeout: Duration::from_millis(250),
            io_timeout: Duration::from_millis(500),
            local: None,
            reconnect_after: Duration::from_millis(100),
        }
    }
}

impl<A> RedisBuilder<A> {
    /// The prefix of every Redis key (default `hotlimit:`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// What [`RedisLimiter::check`] answers when the backend fails (default
    /// [`FailMode::Open`]).
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// The TCP connect timeout (default 250 ms).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// The read and write timeouts of the connection (default 500 ms).
    pub fn io_timeout(mut self, t: Duration) -> Self {
        self.io_timeout = t;
        self
    }

    /// After a failed connection attempt, answer [`BackendError::Unavailable`] at once
    /// (the [`FailMode`] in `check`) for this long before trying again (default 100 ms), so
    /// an unreachable server costs each request nothing rather than a connect timeout.
    pub fn reconnect_after(mut self, t: Duration) -> Self {
        self.reconnect_after = t;
        self
    }

    /// More seed nodes of a Redis Cluster (URLs like the builder's), tried in order after the
    /// builder's URL when connecting: the limiter is then a cluster client, whatever `INFO`
    /// says, and still connects while some seeds are down. All seeds must share the password,
    /// user name, protocol and TLS mode of the first.
    pub fn seed_nodes<S: Into<String>>(mut self, urls: impl IntoIterator<Item = S>) -> Self {
        self.seeds.extend(urls.into_iter().map(Into::into));
        self
    }

    /// Remember up to `max_keys` recently denied keys in process and deny them locally, without
    /// a round trip, until Redis' `retry_after` has passed (see the module docs).
    pub fn local_fast_path(mut self, max_keys: usize) -> Self {
        self.local = Some(max_keys.max(1));
        self
    }
}

impl<A: fmt::Debug> RedisBuilder<A> {
    pub(super) fn fmt_limiter(&self, f: &mut fmt::Formatter<'_>, name: &str) -> fmt::Result {
        f.debug_struct(name)
            .field("algo", &self.algo)
            .field("url", &self.url)
            .field("seed_nodes", &self.seeds)
            .field("prefix", &self.prefix)
            .field("fail_mode", &self.fail_mode)
            .field("local_fast_path", &self.local)
            .finish_non_exhaustive()
    }
}
