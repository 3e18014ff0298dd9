//! [`DirectLimiter`]: one cell shared by every caller (a global limit), the [`Single`] store.

use crate::algo::Algorithm;
use crate::cell::StateCell;
use crate::clock::{Clock, QuantaClock};
use crate::decision::Decision;
use crate::error::BuildError;
use crate::limiter::{Cas, Variant};
use crate::ops::sealed::{Lookup, Table};
use crate::ops::Limiter;
use crate::shared::{Core, KeyState, Options};
use crate::stats::Metrics;
use crate::sweeper::Sweeper;
use crossbeam_utils::CachePadded;
use std::fmt;

/// An unkeyed limiter: one cache-padded cell shared by every caller (a global limit). It
/// offers what the keyed limiters offer, its one key `()`.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, DirectLimiter, ManualClock, RateLimiter};
///
/// let global = DirectLimiter::<Gcra, _>::with_clock("100/s burst 2".parse()?, ManualClock::default());
/// assert!(global.check(&()).is_allowed());
/// assert!(global.check(&()).is_allowed());
/// assert!(global.check(&()).is_denied());
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub type DirectLimiter<A, C = QuantaClock, V = Cas> = Limiter<Single<A, C, V>>;

/// The unkeyed [`Store`](crate::store::Store): one cache-padded cell, looked up by `&()`;
/// see [`DirectLimiter`].
pub struct Single<A: Algorithm, C = QuantaClock, V: Variant<A> = Cas> {
    // Padded: the one word every thread hammers must not share a line with the config.
    cell: CachePadded<V::Cell>,
    core: Core<A, C>,
}

impl<A: Algorithm, C: Clock, V: Variant<A>> Table for Single<A, C, V> {
    type Algo = A;
    type Clock = C;
    type WithClock<C2: Clock> = Single<A, C2, V>;

    fn build(algo: A, clock: C, options: &Options) -> Result<(Self, Option<Sweeper>), BuildError> {
        let single = Self {
            cell: CachePadded::new(V::Cell::new(algo.fresh())),
            core: Core::new(algo, clock, options),
        };
        Ok((single, None))
    }

    #[inline(always)]
    fn core(&self) -> &Core<A, C> {
        &self.core
    }

    fn table(&self) -> &'static str {
        "one cell"
    }

    /// The one cell.
    fn keys(&self) -> usize {
        1
    }

    /// The one cell is never swept.
    fn sweep(&self) -> Metrics {
        Metrics::default()
    }
}

impl<A: Algorithm, C: Clock, V: Variant<A>> Lookup<()> for Single<A, C, V> {
    type At<'a> = &'a Self;

    #[inline(always)]
    fn at<'a>(&'a self, _: &'a ()) -> &'a Self {
        self
    }

    // Always: the unkeyed check is this one step, and inlined whole into the caller it
    // drops what the caller never reads of the decision (issue #61's floor).
    #[inline(always)]
    fn decide(&self, algo: &A, _: &(), cost: u64, now: u64) -> Decision {
        self.apply(|state| algo.update(state, now, cost))
    }

    #[inline]
    fn peek(&self, algo: &A, _: &(), cost: u64, now: u64) -> Decision {
        // Never dead (never swept); were it ever, a fresh state is what it was equivalent to.
        self.cell
            .inspect(|state| algo.peek(state, now, cost))
            .unwrap_or_else(|| algo.peek(&algo.fresh(), now, cost))
    }
}

/// The one cell, for the request paths of the core. It is never swept, so it is never dead;
/// were it ever, `f` would run on a fresh state (what the sweeper guarantees a dead cell was).
impl<A: Algorithm, C: Clock, V: Variant<A>> KeyState<A::State> for &Single<A, C, V> {
    #[inline(always)]
    fn apply<T>(&self, f: impl FnMut(&mut A::State) -> T) -> T {
        self.core.update_live(&*self.cell, f)
    }

    fn key_print(&self) -> u64 {
        0
    }
}

impl<A: Algorithm + fmt::Debug, C: fmt::Debug, V: Variant<A>> fmt::Debug for Single<A, C, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Single")
            .field("core", &self.core)
            .field("cell", &*self.cell)
            .finish()
    }
}
