//! The algorithms, as pure state machines: `(old state, now, cost) -> (new state, Decision)`.
//!
//! Nothing here touches an atomic or a lock. The lock-free store runs [`Algorithm::step`] in a
//! CAS loop over the state word, the mutex twin runs [`Algorithm::step_locked`] under a lock,
//! and tests call both directly.

mod earrrl;
mod exponential;
mod gcra;

pub use earrrl::{Earrrl, EarrrlPair, IDLE_EPSILON};
pub use exponential::Exponential;
pub use gcra::{Gcra, Reservation};

use crate::decision::{Decision, Policy};
use std::fmt::Debug;

/// A plain integer state word that the lock-free store can compare-and-swap: `u64` or `u128`.
///
/// Floats are stored as their bits (`f64::to_bits`). All ones (`u64::MAX`, `u128::MAX`) is
/// reserved as the eviction tombstone; no algorithm stores it (a NaN in float words, a time of
/// 584 years in GCRA's, which saturates one below). Sealed: the atomic operations live in a
/// crate-private supertrait.
pub trait Word: crate::cell::AtomicWord {}
impl Word for u64 {}
impl Word for u128 {}

/// The result of one step: the decision, and the new state word (`None` when the state is
/// unchanged, so the store can skip the write).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step<S> {
    /// The answer to the request.
    pub decision: Decision,
    /// The state to store, if it changed.
    pub state: Option<S>,
}

/// A rate-limiting algorithm as a pure state machine.
///
/// `step` must be a pure function of its arguments: the lock-free store may call it several
/// times for one request (once per CAS attempt) and keeps only the last result.
///
/// Callers (the limiters) reject a cost of 0 or above [`capacity`](Algorithm::capacity)
/// before calling `step`; `step` must still not panic on any input.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, Algorithm};
///
/// let gcra: Gcra = "10/s burst 5".parse()?;
/// let mut state = gcra.fresh();
/// let mut allowed = 0;
/// for _ in 0..10 {
///     let step = gcra.step(state, 0, 1);
///     allowed += step.decision.is_allowed() as u32;
///     state = step.state.unwrap_or(state);
/// }
/// assert_eq!(allowed, 5);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait Algorithm: Send + Sync + 'static {
    /// The state word kept per key. It must never be all ones (`Word::TOMBSTONE`): the stores
    /// reserve that value to mark a cell being evicted.
    type State: Word;

    /// The state of a key never seen before.
    fn fresh(&self) -> Self::State;

    /// The largest cost this algorithm can ever admit at once; at least 1, so a request of
    /// cost 1 is always valid.
    fn capacity(&self) -> u64;

    /// What a denied request does to the state.
    fn policy(&self) -> Policy;

    /// Decides one request of `cost` at `now` (nanoseconds since the clock's origin).
    fn step(&self, state: Self::State, now: u64, cost: u64) -> Step<Self::State>;

    /// The earliest time (ns) from which `state` is equivalent to [`fresh`](Algorithm::fresh):
    /// every request from then on gets the same decision and the same next state from either,
    /// so dropping the key then loses nothing. Idle eviction is built on it, and capacity
    /// eviction forgets first the keys with the earliest `idle_at` (the least live state).
    fn idle_at(&self, state: Self::State) -> u64;
}

/// The smallest wait after which `allowed_at` holds, found from the float estimate `guess_ns`.
///
/// Float algorithms estimate the wait in closed form (or by Newton), then settle it with the
/// very arithmetic the next request will run, so a `retry_after` is neither early by a rounding
/// error (dishonest) nor late by one (not the earliest): gallop up to an allowed wait, gallop
/// down to a denied one, bisect between. With a good estimate that is two probes; whatever the
/// estimate, each phase ends within 64 probes. `allowed_at` is monotone in the wait (rates
/// only decay while idle), which the bisection relies on.
pub(crate) fn honest_wait(guess_ns: f64, allowed_at: impl Fn(u64) -> bool) -> u64 {
    // A wait of 0 repeats the request that was just denied.
    let mut denied = 0u64;
    // `as` saturates (NaN becomes 0).
    let mut allowed = (guess_ns.ceil() as u64).max(1);
    let mut step = 1u64;
    while !allowed_at(allowed) {
        if allowed == u64::MAX {
            return allowed;
        }
        denied = allowed;
        allowed = allowed.saturating_add(step);
        step = step.saturating_mul(2);
    }
    step = 1;
    while allowed - denied > 1 {
        let probe = allowed - step.min(allowed - denied - 1);
        if !allowed_at(probe) {
            denied = probe;
            break;
        }
        allowed = probe;
        step = step.saturating_mul(2);
    }
    while allowed - denied > 1 {
        let mid = denied + (allowed - denied) / 2;
        if allowed_at(mid) {
            allowed = mid;
        } else {
            denied = mid;
        }
    }
    allowed
}
