//! Live reconfiguration: [`Live`], an algorithm whose quota can be swapped while traffic flows,
//! and [`Reconfigure`], what an algorithm must say about its state for that to be sound.

use crate::algo::{clamp, Algorithm, AllOf, Earrrl, Exponential, Gcra, Pair};
use crate::cell::StateCell;
use crate::clock::Clock;
use crate::decision::{Decision, Policy};
use crate::error::{ConfigError, Field};
use crate::stats::Stats;
use crate::sync::{AtomicCell, AtomicU64, Mutex, Ordering};
use std::fmt;

/// An algorithm whose configuration can change while a limiter runs, keeping every key's state.
///
/// The state of these algorithms is physical, not relative to the quota: GCRA keeps a time
/// (how far ahead of the clock a key's budget is spent), EARRRL and the exponential limiter a
/// measured rate. So a state kept under one configuration is still meaningful under another,
/// and the only work left on a switch is to bring states the new quota could never have
/// produced back within its reach ([`fit`](Reconfigure::fit)), instead of resetting them to
/// fresh.
///
/// What can change: every GCRA parameter (rate, burst, policy); EARRRL's limit and policy,
/// not its half-life (the state is measured in it); the exponential limiter's limit and policy,
/// not its period. The window algorithms are not reconfigurable: their state is laid out for
/// their window.
pub trait Reconfigure: Algorithm + Copy {
    /// Whether a state kept under `self` means the same under `new`; an
    /// [`Unchangeable`](ConfigError::Unchangeable) error names the field that differs.
    fn check_change(&self, new: &Self) -> Result<(), ConfigError>;

    /// Brings `state` (kept under any compatible configuration) within this configuration's
    /// reach at `now`: the state a key could have under this quota that is closest to the
    /// kept one and never more lenient than it.
    fn fit(&self, state: &mut Self::State, now: u64);
}

/// GCRA's state is the time at which the key's spent budget is paid back. A new quota keeps
/// that time unless it lies beyond what the new burst can reach (`now + B·T`, a fully spent
/// bucket), where it is clamped: a key that spent everything stays out of budget under the
/// new quota, but not for longer than the new quota could ever keep it.
impl Reconfigure for Gcra {
    fn check_change(&self, _: &Self) -> Result<(), ConfigError> {
        Ok(())
    }

    fn fit(&self, tat: &mut u64, now: u64) {
        let full = clamp(now)
            .saturating_add(self.tolerance())
            .min(u64::MAX - 1);
        *tat = (*tat).min(full);
    }
}

/// EARRRL's state is the key's measured rate, valid under any limit: it is kept as is.
impl Reconfigure for Earrrl {
    fn check_change(&self, new: &Self) -> Result<(), ConfigError> {
        if self.half_life() == new.half_life() {
            Ok(())
        } else {
            Err(ConfigError::Unchangeable {
                field: Field::HalfLife,
                from: format!("{:?}", self.half_life()),
                to: format!("{:?}", new.half_life()),
            })
        }
    }

    fn fit(&self, _: &mut u64, _: u64) {}
}

/// The exponential limiter's state is a smoothed rate per period, valid under any limit: it
/// is kept as is.
impl Reconfigure for Exponential {
    fn check_change(&self, new: &Self) -> Result<(), ConfigError> {
        if self.period() == new.period() {
            Ok(())
        } else {
            Err(ConfigError::Unchangeable {
                field: Field::Period,
                from: format!("{:?}", self.period()),
                to: format!("{:?}", new.period()),
            })
        }
    }

    fn fit(&self, _: &mut u128, _: u64) {}
}

/// Both quotas change together; each state is fitted to its own.
impl<A, B> Reconfigure for AllOf<A, B>
where
    A: Reconfigure,
    B: Reconfigure,
    A::State: Pair<B::State>,
{
    fn check_change(&self, new: &Self) -> Result<(), ConfigError> {
        self.first().check_change(new.first())?;
        self.second().check_change(new.second())
    }

    fn fit(&self, state: &mut Self::State, now: u64) {
        let (mut a, mut b) = <A::State as Pair<B::State>>::parts(state);
        self.first().fit(&mut a, now);
        self.second().fit(&mut b, now);
        *state = Pair::join(a, b);
    }
}

/// An algorithm whose configuration can be swapped at run time: give a limiter `Live<A>` and
/// call its `reconfigure` ([`KeyedLimiter::reconfigure`](crate::KeyedLimiter::reconfigure),
/// [`DirectLimiter::reconfigure`](crate::DirectLimiter::reconfigure)).
///
/// The configuration sits in a `crossbeam` `AtomicCell` (a sequence lock: a read is two loads
/// and a copy, no write), read once per step; limiters built on a plain `A` pay nothing.
/// A switch is atomic for each request: every step runs entirely under the old or entirely
/// under the new configuration. The store then walks its keys, [fitting](Reconfigure::fit)
/// each state to the new quota by a read-modify-write. Until the walk reaches a key, the key's
/// old state is read under the new quota, which for these algorithms is never more lenient
/// than the fitted one. A request that ran its step under the old configuration but wrote
/// after the walk passed its key sees the generation change (its write synchronizes with the
/// walk's) and fits its own state. So once the switch and the requests in flight during it
/// have returned, every kept state fits the new quota; traffic never stops and no key is lost.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, Live, ManualClock};
///
/// let limiter = CasLimiter::<String, _, _>::with_clock(
///     Live::new("100/s burst 100".parse::<Gcra>()?),
///     ManualClock::new(),
/// );
/// let allowed = (0..150).filter(|_| limiter.check("k").is_allowed()).count();
/// assert_eq!(allowed, 100);
/// limiter.reconfigure("10/s burst 5".parse()?)?;
/// // The key spent its budget: it stays spent under the new quota, not reset to fresh.
/// assert!(limiter.check("k").is_denied());
/// // ...and waits only as long as the new quota can make it wait.
/// assert_eq!(limiter.peek("k").retry_after().as_millis(), 100);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Live<A> {
    current: AtomicCell<A>,
    /// Bumped by every switch, after the new configuration is stored and before the walk.
    generation: AtomicU64,
    /// Serializes reconfigurations (rare), so two switches never interleave their walks.
    switching: Mutex<()>,
}

impl<A: Reconfigure> Live<A> {
    /// Starts with `algo`.
    pub fn new(algo: A) -> Self {
        Self {
            current: AtomicCell::new(algo),
            generation: AtomicU64::new(0),
            switching: Mutex::new(()),
        }
    }

    /// The configuration in force.
    #[inline]
    pub fn get(&self) -> A {
        self.current.load()
    }

    /// Swaps in `new` and runs `walk` (the store's pass fitting its states) while holding
    /// the switch lock. Returns the configuration replaced.
    pub(crate) fn switch(&self, new: A, walk: impl FnOnce(&A)) -> Result<A, ConfigError> {
        let _one_at_a_time = self.switching.lock();
        let old = self.current.load();
        old.check_change(&new)?;
        self.current.store(new);
        self.generation.fetch_add(1, Ordering::AcqRel);
        walk(&new);
        Ok(old)
    }
}

/// One request's update of `cell` (what every store runs): `f` on the state, then, if `algo`'s
/// configuration changed meanwhile ([`Live`]), a fit of what it wrote, since its step may have
/// run under the old configuration and landed after the switch's walk passed the cell. For a
/// fixed algorithm the generation is the constant 0 and this is `cell.update`. `None` if the
/// cell is dead.
#[inline(always)]
pub(crate) fn update_fitted<A: Algorithm, T>(
    algo: &A,
    clock: &impl Clock,
    cell: &impl StateCell<A::State>,
    stats: &Stats,
    f: impl FnMut(&mut A::State) -> T,
) -> Option<T> {
    let generation = algo.generation();
    let out = cell.update(stats, f)?;
    if algo.generation() != generation {
        refit(algo, clock, cell);
    }
    Some(out)
}

#[cold]
fn refit<A: Algorithm>(algo: &A, clock: &impl Clock, cell: &impl StateCell<A::State>) {
    let now = clock.now();
    cell.rewrite(|state| algo.refit(state, now));
}

impl<A: Reconfigure> Algorithm for Live<A> {
    type State = A::State;

    /// A fresh state is the same under every configuration of these algorithms.
    #[inline]
    fn fresh(&self) -> A::State {
        self.get().fresh()
    }

    #[inline]
    fn capacity(&self) -> u64 {
        self.get().capacity()
    }

    #[inline]
    fn policy(&self) -> Policy {
        self.get().policy()
    }

    #[inline]
    fn update(&self, state: &mut A::State, now: u64, cost: u64) -> Decision {
        // A cost checked against the previous capacity may exceed the new one: the algorithms
        // deny it (they never panic on any cost).
        self.get().update(state, now, cost)
    }

    #[inline]
    fn idle_at(&self, state: &A::State) -> u64 {
        self.get().idle_at(state)
    }

    #[inline]
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    #[inline]
    fn refit(&self, state: &mut A::State, now: u64) {
        self.get().fit(state, now);
    }
}

impl<A: Reconfigure> Clone for Live<A> {
    /// A new, independent `Live` starting from this one's current configuration.
    fn clone(&self) -> Self {
        Self::new(self.get())
    }
}

impl<A: Reconfigure + fmt::Debug> fmt::Debug for Live<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Live").field(&self.get()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;
    use std::time::Duration;

    #[test]
    fn gcra_fit_clamps_to_a_spent_bucket_and_keeps_the_rest() {
        let g: Gcra = "10/s burst 5".parse().unwrap();
        let mut far = 60_000_000_000; // a minute of debt from a larger quota
        g.fit(&mut far, 1_000_000_000);
        assert_eq!(far, 1_500_000_000);
        let mut near = 1_200_000_000;
        g.fit(&mut near, 1_000_000_000);
        assert_eq!(near, 1_200_000_000);
        let mut fresh = g.fresh();
        g.fit(&mut fresh, 1_000_000_000);
        assert_eq!(fresh, g.fresh());
    }

    #[test]
    fn a_half_life_or_period_cannot_change() {
        let r = Rate::per_second_of(1.0).unwrap();
        let a = Earrrl::new(Duration::from_secs(1), r).unwrap();
        let b = Earrrl::new(Duration::from_secs(2), r).unwrap();
        let err = Live::new(a).switch(b, |_| ()).unwrap_err();
        assert_eq!(
            err,
            ConfigError::Unchangeable {
                field: Field::HalfLife,
                from: "1s".into(),
                to: "2s".into()
            }
        );
        let limit_only = Earrrl::new(Duration::from_secs(1), Rate::per_second_of(5.0).unwrap());
        assert!(Live::new(a).switch(limit_only.unwrap(), |_| ()).is_ok());
        let e = Exponential::new(10.0, Duration::from_secs(1)).unwrap();
        let f = Exponential::new(10.0, Duration::from_secs(60)).unwrap();
        assert_eq!(e.check_change(&f).unwrap_err().field(), Field::Period);
        let pair = AllOf::new(a, e);
        assert_eq!(
            pair.check_change(&AllOf::new(b, e)).unwrap_err().field(),
            Field::HalfLife
        );
    }
}
