//! hotlimit: a lock-free, high-throughput, concurrent in-memory rate limiter.
#![deny(missing_docs, missing_debug_implementations, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

pub mod algo;
mod clock;
mod config;
mod decision;
mod error;
mod sync;

pub use algo::{Algorithm, Step, Word};
pub use clock::{Clock, ManualClock, QuantaClock};
pub use config::{parse_duration, Rate};
pub use decision::{Decision, Policy};
pub use error::{ConfigError, CostError, Field};

mod cell;
mod limiter;
mod stats;

pub use limiter::{
    Cas, CasLimiter, DirectLimiter, KeyedLimiter, Locked, MutexLimiter, RateLimiter,
    ShardedLimiter, Variant,
};
pub use stats::CasStats;
