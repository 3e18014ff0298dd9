//! Live reconfiguration: [`Live`], an algorithm whose quota can be swapped while traffic flows.
//! What an algorithm must say about its state for that to be sound is its
//! [`check_quota`](Algorithm::check_quota): which configurations read its states as they are.

use crate::algo::{Algorithm, Debt};
use crate::decision::{Decision, Policy};
use crate::error::ConfigError;
use crate::sync::{AtomicCell, Mutex};
use std::fmt;

/// An algorithm whose configuration can be swapped at run time: give a limiter `Live<A>` and
/// call its [`reconfigure`](crate::Limiter::reconfigure).
///
/// The configuration sits in a `crossbeam` `AtomicCell` (a sequence lock: a read is two loads
/// and a copy, no write), read once per step; limiters built on a plain `A` pay nothing.
/// A switch is atomic for each request: every step runs entirely under the old or entirely
/// under the new configuration. It touches no key: a state means the same under every
/// configuration the switch admits ([`Algorithm::check_quota`]), so each key's next step reads its state as
/// it is under the quota now in force; traffic never stops, no key is lost or reset, and the
/// switch costs the same at one key as at ten million.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::Gcra, CasLimiter, Live, ManualClock, RateLimiter, Requests};
///
/// let limiter = CasLimiter::<String, _, _>::with_clock(
///     Live::new("100/s burst 100".parse::<Gcra>()?),
///     ManualClock::default(),
/// );
/// let allowed = (0..150).filter(|_| limiter.check("k").is_allowed()).count();
/// assert_eq!(allowed, 100);
/// limiter.reconfigure("10/s burst 5".parse()?)?;
/// // The key spent its budget: it stays spent under the new quota, not reset to fresh.
/// assert!(limiter.check("k").is_denied());
/// // ...and owes what it spent: a second of budget, of which the new burst covers 500 ms.
/// // A switch never hands budget back (switching back would otherwise reset it).
/// assert_eq!(limiter.request("k").peek()?.retry_after().as_millis(), 600);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Live<A> {
    /// The configuration in force, and from when: the limiter's clock at the switch (0 before
    /// any; `u64::MAX` while one is under way), read with it in one load (see `settle`).
    current: AtomicCell<(A, u64)>,
    /// Serializes reconfigurations (rare), so each checks the change from the one it replaces.
    switching: Mutex<()>,
}

impl<A: Algorithm + Copy> Live<A> {
    /// Starts with `algo`.
    pub fn new(algo: A) -> Self {
        Self {
            current: AtomicCell::new((algo, 0)),
            switching: Mutex::new(()),
        }
    }

    /// The configuration in force.
    #[inline]
    pub fn get(&self) -> A {
        self.current.load().0
    }

    /// Swaps in `new` if a state kept under the configuration in force means the same under
    /// it, `now` reading the limiter's clock. Returns the configuration replaced.
    pub(crate) fn switch(&self, new: A, now: impl FnOnce() -> u64) -> Result<A, ConfigError> {
        let _one_at_a_time = self.switching.lock();
        let (old, _) = self.current.load();
        old.check_quota(&new)?;
        // In force first, its instant read after: a request that read the old configuration
        // read its clock before this store, so before that instant (on a clock that does not
        // move backwards); until the instant is stored, no refund is made.
        self.current.store((new, u64::MAX));
        self.current.store((new, now()));
        Ok(old)
    }
}

impl<A: Algorithm + Copy> Algorithm for Live<A> {
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
    fn take(&self, state: &mut A::State, now: u64, cost: u64) -> Decision {
        self.get().take(state, now, cost)
    }

    #[inline]
    fn idle_at(&self, state: &A::State) -> u64 {
        self.get().idle_at(state)
    }

    #[inline]
    fn settle_limit(&self, charged: u64) -> u64 {
        self.get().settle_limit(charged)
    }

    /// A refund of a ticket taken before the last switch is not made: priced under the new
    /// configuration it could hand back more than the take charged (GCRA's unit is longer
    /// under a slower rate), and a switch never hands budget back; the provisional charge
    /// stands. An overrun is charged under the configuration in force.
    fn settle(&self, state: &mut A::State, now: u64, taken_at: u64, charged: u64, actual: u64) {
        let (algo, since) = self.current.load();
        if actual < charged && taken_at < since {
            return;
        }
        algo.settle(state, now, taken_at, charged, actual);
    }
}

impl<A: Algorithm + Copy> Debt<A::State> for Live<A> {
    // A debt means the same under every configuration a switch may reach (the state does).
    fn debt_parts(&self) -> usize {
        self.get().debt_parts()
    }

    fn debt(&self, state: &A::State, part: usize) -> u128 {
        self.get().debt(state, part)
    }

    fn debt_join(&self, part: usize, a: u128, b: u128) -> u128 {
        self.get().debt_join(part, a, b)
    }

    fn debt_paid_at(&self, part: usize, debt: u128) -> u64 {
        self.get().debt_paid_at(part, debt)
    }

    fn debt_lanes(&self, part: usize) -> usize {
        self.get().debt_lanes(part)
    }

    fn debt_rank(&self, part: usize, shared: u128, own: u128) -> [u64; 2] {
        self.get().debt_rank(part, shared, own)
    }

    fn debt_unrank(&self, part: usize, shared: u128, rank: [u64; 2]) -> u128 {
        self.get().debt_unrank(part, shared, rank)
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> A::State {
        self.get().restore(debt)
    }
}

impl<A: Algorithm + Copy> Clone for Live<A> {
    /// A new, independent `Live` starting from this one's current configuration.
    fn clone(&self) -> Self {
        Self::new(self.get())
    }
}

impl<A: Algorithm + Copy + fmt::Debug> fmt::Debug for Live<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Live").field(&self.get()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{AllOf, Earrrl, Exponential, Gcra};
    use crate::error::Field;
    use crate::Rate;
    use crate::{RateLimiter, Requests};
    use std::time::Duration;

    // Pins G27.
    #[test]
    fn a_switch_keeps_every_gcra_debt() {
        use crate::{CasLimiter, ManualClock};
        let clock = ManualClock::default();
        let big: Gcra = "100/s burst 10".parse().unwrap();
        let l = CasLimiter::<u64, _, _>::with_clock(Live::new(big), clock.clone());
        // A minute of debt under the larger quota: 6000 units past the 10 taken, at 10 ms each,
        // so the key's budget is spent to 60.1 s. Its next unit waits until that less the
        // 90 ms of tolerance: 60.01 s.
        let ticket = &mut l.request(&1).cost(10).take().unwrap();
        assert!(l.request(&1).settle(ticket, 6010).unwrap());
        assert_eq!(
            l.request(&1).peek().unwrap().retry_after().as_millis(),
            60_010
        );
        l.reconfigure("10/s burst 5".parse().unwrap()).unwrap();
        // Kept whole: spent to 60.1 s under the new quota too, so its next unit waits until
        // that less the new 400 ms of tolerance: 59.7 s.
        assert_eq!(
            l.request(&1).peek().unwrap().retry_after().as_millis(),
            59_700
        );
        // A key never seen starts fresh under the new quota.
        assert_eq!(l.request(&2).peek().unwrap().remaining(), Some(4));
        clock.advance(Duration::from_millis(59_699));
        assert!(l.request(&1).peek().unwrap().is_denied());
        clock.advance(Duration::from_millis(1));
        assert!(l.check(&1).is_allowed());
    }

    // A ticket taken before a switch to a slower rate, settled after it with nothing used:
    // priced at the new interval (100 ms a unit, not 1 ms) its refund would have reset the
    // key, handing back the 990 units checked since; not made, the charge stands. A ticket
    // taken after the switch refunds as usual; an overrun across one is charged.
    // Pins G27.
    #[test]
    fn a_refund_across_a_switch_is_not_made() {
        use crate::{CasLimiter, ManualClock};
        let clock = ManualClock::default();
        let fast: Gcra = "1000/s burst 1000".parse().unwrap();
        let l = CasLimiter::<u64, _, _>::with_clock(Live::new(fast), clock.clone());
        clock.set(Duration::from_secs(10));
        let mut before = l.request(&1).cost(10).take().unwrap();
        assert!(l.request(&1).cost(990).check().unwrap().is_allowed());
        clock.advance(Duration::from_millis(1));
        l.reconfigure("10/s burst 10".parse().unwrap()).unwrap();
        let spent = l.request(&1).peek().unwrap().retry_after();
        assert!(!spent.is_zero());
        assert!(l.request(&1).settle(&mut before, 0).unwrap());
        assert_eq!(l.request(&1).peek().unwrap().retry_after(), spent);
        // After the switch: 3 of a take of 5 come back, at the new 100 ms.
        let mut after = l.request(&2).cost(5).take().unwrap();
        assert_eq!(l.request(&2).peek().unwrap().remaining(), Some(4));
        assert!(l.request(&2).settle(&mut after, 2).unwrap());
        assert_eq!(l.request(&2).peek().unwrap().remaining(), Some(7));
        // An overrun across a switch is charged: 20 more units, 2 s at the new rate.
        let mut over = l.request(&3).cost(1).take().unwrap();
        clock.advance(Duration::from_millis(1));
        l.reconfigure("10/s burst 10".parse().unwrap()).unwrap();
        assert!(l.request(&3).settle(&mut over, 21).unwrap());
        assert!(l.request(&3).peek().unwrap().is_denied());
    }

    // Pins G33.
    #[test]
    fn a_half_life_or_period_cannot_change() {
        let r = Rate::new(1.0, Duration::from_secs(1)).unwrap();
        let a = Earrrl::new(Duration::from_secs(1), r).unwrap();
        let b = Earrrl::new(Duration::from_secs(2), r).unwrap();
        let err = Live::new(a).switch(b, || 0).unwrap_err();
        assert_eq!(
            err,
            ConfigError::Unchangeable {
                field: Field::HalfLife,
                from: "1s".into(),
                to: "2s".into()
            }
        );
        let limit_only = Earrrl::new(
            Duration::from_secs(1),
            Rate::new(5.0, Duration::from_secs(1)).unwrap(),
        );
        assert!(Live::new(a).switch(limit_only.unwrap(), || 0).is_ok());
        let e = Exponential::new(10.0, Duration::from_secs(1)).unwrap();
        let f = Exponential::new(10.0, Duration::from_secs(60)).unwrap();
        assert_eq!(e.check_quota(&f).unwrap_err().field(), Field::Period);
        let pair = AllOf::new(a, e);
        assert_eq!(
            pair.check_quota(&AllOf::new(b, e)).unwrap_err().field(),
            Field::HalfLife
        );
    }
}
