//! What every limiter shares: the [`RateLimiter`] trait, and the two ways of keeping a key's
//! state ([`Cas`] and [`Locked`]).

use crate::algo::Algorithm;
use crate::cell::{LockCell, StateCell, StateCells};
use crate::decision::Decision;
use crate::error::CostError;
use crate::sweeper::SweepReport;

/// Anything that decides requests for keys of type `Q`: every keyed limiter of the crate.
/// Tests, benches and tools are written against this trait.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, MutexLimiter, ManualClock, RateLimiter};
///
/// fn admitted(l: &dyn RateLimiter<str>, n: usize) -> usize {
///     (0..n).filter(|_| l.check("k").is_allowed()).count()
/// }
/// let g: Gcra = "10/s burst 3".parse()?;
/// assert_eq!(admitted(&CasLimiter::<String, _>::with_clock(g, ManualClock::new()), 10), 3);
/// assert_eq!(admitted(&MutexLimiter::<String, _>::with_clock(g, ManualClock::new()), 10), 3);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait RateLimiter<Q: ?Sized>: Send + Sync {
    /// Decides a request of `cost` for `key`. Errors if the cost is 0 or can never be
    /// admitted.
    fn check_n(&self, key: &Q, cost: u64) -> Result<Decision, CostError>;

    /// Decides a request of cost 1 for `key`.
    fn check(&self, key: &Q) -> Decision;

    /// The decision [`check_n`](RateLimiter::check_n) would return now, without counting
    /// the request (state untouched, no key inserted).
    fn peek_n(&self, key: &Q, cost: u64) -> Result<Decision, CostError>;

    /// The decision [`check`](RateLimiter::check) would return now, without counting it.
    fn peek(&self, key: &Q) -> Decision;

    /// Waits on the calling thread until a request of cost 1 for `key` is allowed, and
    /// returns that decision (or the denial, if the wait lies past the clock's range); see
    /// [`KeyedLimiter::until_ready_blocking`](crate::KeyedLimiter::until_ready_blocking).
    fn until_ready_blocking(&self, key: &Q) -> Decision;

    /// The number of keys currently held.
    fn len(&self) -> usize;

    /// Whether no key is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the keys whose state is equivalent to a fresh key's (changing no decision), and
    /// enforces the capacity bound if one is set.
    fn sweep(&self) -> SweepReport;
}

mod sealed {
    pub trait Sealed {}
}

/// How a [`KeyedLimiter`](crate::KeyedLimiter) or [`DirectLimiter`](crate::DirectLimiter)
/// keeps each key's state: [`Cas`] or [`Locked`]. Sealed.
///
/// Both are implemented for every algorithm of the crate. The algorithms name no storage, so
/// code generic over the algorithm states the store it builds as a bound on the variant:
///
/// ```
/// use hotlimit::{store::Variant, Algorithm, Cas, CasLimiter, ManualClock};
///
/// fn first_two<A: Algorithm>(algo: A) -> [bool; 2]
/// where
///     Cas: Variant<A>,
/// {
///     let l = CasLimiter::<u64, A>::with_clock(algo, ManualClock::new());
///     [l.check(&1).is_allowed(), l.check(&1).is_allowed()]
/// }
/// assert_eq!(first_two("1/s".parse::<hotlimit::algo::Gcra>()?), [true, false]);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait Variant<A: Algorithm>: sealed::Sealed + Send + Sync + 'static {
    /// The per-key cell.
    #[doc(hidden)]
    type Cell: StateCell<A::State>;
}

/// Optimistic: a word state is updated by compare-and-swap, no lock. (States that are not
/// words, the sliding log and the sub-window counters, take a per-key lock even here.)
#[derive(Debug, Clone, Copy)]
pub enum Cas {}

/// Pessimistic: the state sits behind a `parking_lot::Mutex` and the same step runs under
/// the lock.
#[derive(Debug, Clone, Copy)]
pub enum Locked {}

impl sealed::Sealed for Cas {}
impl sealed::Sealed for Locked {}

impl<A: Algorithm> Variant<A> for Cas
where
    A::State: StateCells,
{
    type Cell = <A::State as StateCells>::CasCell;
}

impl<A: Algorithm> Variant<A> for Locked
where
    A::State: StateCells,
{
    type Cell = LockCell<A::State>;
}
