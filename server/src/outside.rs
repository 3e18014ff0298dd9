//! Algorithms of your own, written outside hotlimit and this crate on hotlimit's public
//! `Algorithm` trait, registered by name in [`Settings::algorithms`](crate::service::Settings)
//! so that a rule can say `algorithm: <name>`. They run on the memory backend (Redis and the
//! fleet limiter run scripts and merges only the built-in algorithms have).
//!
//! ```
//! use hotlimit::algo::{Algorithm, FixedWindow};
//! use hotlimit_server::outside::Algorithms;
//!
//! let mut algorithms = Algorithms::default();
//! // Any `Algorithm` with a one-word state; here the library's own, under another name.
//! algorithms
//!     .register("my_window", |requests_per_unit, unit| {
//!         FixedWindow::new(requests_per_unit.into(), unit).map_err(|e| e.to_string())
//!     })
//!     .unwrap();
//! assert!(algorithms.register("gcra", |n, unit| FixedWindow::new(n.into(), unit).map_err(|e| e.to_string())).is_err());
//! ```

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use hotlimit::algo::Algorithm as Algo;

use crate::engine::{BuildError, Engine, Engines};

/// The built-in algorithms' names, which no outside algorithm may take.
pub const BUILT_IN: &[&str] = &[
    "fixed_window",
    "sliding_window",
    "sub_window",
    "sliding_log",
    "gcra",
    "earrrl",
    "exponential",
];

/// A rule's quota of an outside algorithm: its name, the quota itself (type-erased) and how
/// to build a class's limiter for it.
#[derive(Clone)]
pub struct Outside {
    name: &'static str,
    quota: Arc<dyn Any + Send + Sync>,
    capacity: u64,
    /// The quota's `Debug` form: what tells two quotas apart (its class, its fingerprint).
    shown: String,
    build: Arc<Build>,
}

type Build = dyn Fn(&Engines) -> Result<Engine, BuildError> + Send + Sync;
type Make = dyn Fn(u32, Duration) -> Result<Outside, String> + Send + Sync;

impl Outside {
    /// The name it was registered under.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The quota's capacity: the most one request may cost.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The quota, if it is an `A`.
    pub fn quota<A: 'static>(&self) -> Option<&A> {
        self.quota.downcast_ref()
    }

    /// The class its rules share a limiter in: one per distinct quota.
    pub(crate) fn class(&self) -> String {
        format!("{}/{}", self.name, self.shown)
    }

    /// A class's limiter for this quota.
    pub(crate) fn build(&self, engines: &Engines) -> Result<Engine, BuildError> {
        (self.build)(engines)
    }
}

impl fmt::Debug for Outside {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name, self.shown)
    }
}

/// The outside algorithms a configuration may name, each by the function that makes a rule's
/// quota from its `requests_per_unit` and `unit`.
#[derive(Clone, Default)]
pub struct Algorithms {
    makers: BTreeMap<&'static str, Arc<Make>>,
}

/// [`Algorithms::register`]'s refusal: the name is a built-in algorithm's or already taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameTaken(pub &'static str);

impl fmt::Display for NameTaken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the algorithm name '{}' is taken", self.0)
    }
}

impl std::error::Error for NameTaken {}

impl Algorithms {
    /// Lets rules name `A` as `algorithm: <name>`; `make` builds a rule's quota from its
    /// `requests_per_unit` and `unit` (its error is the configuration error reported with
    /// the file). Every rule of one quota shares one limiter.
    pub fn register<A, F>(&mut self, name: &'static str, make: F) -> Result<&mut Self, NameTaken>
    where
        A: Algo<State = u64> + Clone + fmt::Debug + Send + Sync + 'static,
        F: Fn(u32, Duration) -> Result<A, String> + Send + Sync + 'static,
    {
        if BUILT_IN.contains(&name) || self.makers.contains_key(name) {
            return Err(NameTaken(name));
        }
        let make = move |requests_per_unit: u32, unit: Duration| {
            let quota = make(requests_per_unit, unit)?;
            let own = quota.clone();
            Ok(Outside {
                name,
                capacity: quota.capacity(),
                shown: format!("{quota:?}"),
                quota: Arc::new(quota),
                build: Arc::new(move |engines: &Engines| engines.outside(name, own.clone())),
            })
        };
        self.makers.insert(name, Arc::new(make));
        Ok(self)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.makers.keys().copied()
    }

    /// A rule's quota of the algorithm `name`, if one is registered under it.
    pub(crate) fn make(
        &self,
        name: &str,
        requests_per_unit: u32,
        unit: Duration,
    ) -> Option<Result<Outside, String>> {
        self.makers
            .get(name)
            .map(|make| make(requests_per_unit, unit))
    }
}

impl fmt::Debug for Algorithms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.makers.keys()).finish()
    }
}
