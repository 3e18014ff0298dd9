//! What the window algorithms share: the validated `limit` per `window`.

use crate::decision::Policy;
use crate::error::{ConfigError, Field};
use std::time::Duration;

/// Which way a window's approximation errs: the [`SlidingWindow`](super::SlidingWindow)
/// counter's weighted count and the [`SubWindow`](super::SubWindow)'s buckets only
/// approximate the sliding window, and this says on which side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bias {
    /// Never admits more than the limit the approximation counts (the default). The sliding
    /// window counter denies iff `weighted > limit`; the sub-window sums the current bucket and
    /// the `k` before it, a span of at least the window, so it never admits more than `limit`
    /// in any window.
    Strict,
    /// Forgives what the approximation cannot tell apart. The sliding window counter denies
    /// iff `⌊weighted⌋ > limit` (a fractional excess forgiven); the sub-window sums the current
    /// bucket and the `k − 1` before it, a span shorter than the window by up to one bucket, so
    /// it can admit slightly more.
    Lenient,
}

impl std::str::FromStr for Bias {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "strict" => Ok(Bias::Strict),
            "lenient" => Ok(Bias::Lenient),
            other => Err(format!(
                "unknown bias `{other}` (expected strict or lenient)"
            )),
        }
    }
}

/// A validated limit and window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowConfig {
    pub(crate) limit: u64,
    pub(crate) window_ns: u64,
    pub(crate) policy: Policy,
}

/// The accessors every window algorithm has over its `config: WindowConfig`: `with_policy` and
/// `window` (documented by the argument). The limit per window is `Algorithm::capacity`.
macro_rules! window_accessors {
    ($window_doc:literal) => {
        /// Sets the policy.
        pub fn with_policy(mut self, policy: Policy) -> Self {
            self.config.policy = policy;
            self
        }

        #[doc = $window_doc]
        pub fn window(&self) -> Duration {
            Duration::from_nanos(self.config.window_ns)
        }
    };
}
pub(crate) use window_accessors;

/// Largest limit of the windows that keep 32-bit counts (saturating at `limit + 1`, which
/// must stay below the all-ones tombstone).
pub(crate) const MAX_LIMIT_U32: u64 = u32::MAX as u64 - 2;

/// Checks `limit ≥ 1` and `1 ns ≤ window ≤ u64::MAX ns`; policy leaky.
pub(crate) fn validate(limit: u64, window: Duration) -> Result<WindowConfig, ConfigError> {
    if limit == 0 {
        return Err(ConfigError::Zero {
            field: Field::Limit,
            value: "0".into(),
        });
    }
    let window_ns = match u64::try_from(window.as_nanos()) {
        Ok(0) => {
            return Err(ConfigError::Zero {
                field: Field::Window,
                value: "0s".into(),
            })
        }
        Ok(ns) => ns,
        Err(_) => {
            return Err(ConfigError::TooLarge {
                field: Field::Window,
                value: format!("{window:?}"),
                max: "u64::MAX nanoseconds (about 584 years)",
            })
        }
    };
    Ok(WindowConfig {
        limit,
        window_ns,
        policy: Policy::Leaky,
    })
}

/// A window algorithm's state is counts laid out for its window: another configuration reads
/// it only if its window is the same (`Unchangeable` otherwise).
pub(crate) fn same_window(from: &WindowConfig, to: &WindowConfig) -> Result<(), ConfigError> {
    if from.window_ns == to.window_ns {
        return Ok(());
    }
    Err(ConfigError::Unchangeable {
        field: Field::Window,
        from: format!("{:?}", Duration::from_nanos(from.window_ns)),
        to: format!("{:?}", Duration::from_nanos(to.window_ns)),
    })
}

/// Rejects limits above [`MAX_LIMIT_U32`].
pub(crate) fn check_u32_limit(limit: u64) -> Result<(), ConfigError> {
    if limit > MAX_LIMIT_U32 {
        Err(ConfigError::TooLarge {
            field: Field::Limit,
            value: limit.to_string(),
            max: "2^32 - 3 (counts are 32-bit)",
        })
    } else {
        Ok(())
    }
}
