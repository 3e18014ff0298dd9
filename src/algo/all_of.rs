//! [`AllOf`]: several quotas on one key, all-or-nothing.

use super::{Algorithm, BucketState, Debt, LogState, State};
use crate::decision::{Decision, Policy};
use crate::error::ConfigError;

/// Two quotas on one key (say `10/s` and `1000/h`): a request is allowed only if both allow
/// it, and a request that either denies consumes nothing from the other.
///
/// Both states live in one cell and one step decides both, so a multi-quota check is exactly
/// as consistent as a single one: linearizable per key, with no window in which another
/// thread sees one quota charged and the other not, and no quota ever over-admits. When both
/// states are `u64` words (GCRA, EARRRL, fixed window) they are packed into one `u128` word,
/// still updated by a single compare-and-swap; other pairs sit behind the key's lock
/// (a pair of states of its own). Nest for more quotas: `AllOf<AllOf<A, B>, C>` (a state that no longer
/// fits a word, behind a lock).
///
/// A denied request applies each denying quota's own [`Policy`] to that quota (a strict
/// EARRRL counts it) and leaves the quotas that allowed it untouched.
///
/// The decision: allowed iff both are; [`retry_after`](Decision::retry_after) is the longest
/// among the denying quotas (honest and tight, since a quota that allows now still allows
/// later); [`remaining`](Decision::remaining) the smallest; [`reset_after`](Decision::reset_after)
/// the longest (when denied, an upper bound: a quota that allowed reports it as if charged);
/// [`rate`](Decision::rate) the first quota's if it measures one, else the second's.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::{AllOf, Gcra}, CasLimiter, ManualClock, RateLimiter};
/// use std::time::Duration;
///
/// // 2 per second, but no more than 3 per minute.
/// let quotas = AllOf::new("2/s".parse::<Gcra>()?, "3/min".parse::<Gcra>()?);
/// let clock = ManualClock::default();
/// let limiter = CasLimiter::<u32, _, _>::with_clock(quotas, clock.clone());
/// assert!(limiter.check(&1).is_allowed());
/// assert!(limiter.check(&1).is_allowed());
/// assert!(limiter.check(&1).is_denied()); // the per-second quota
/// clock.advance(Duration::from_secs(1));
/// assert!(limiter.check(&1).is_allowed());
/// let denied = limiter.check(&1); // the per-minute quota is spent...
/// assert_eq!(denied.retry_after(), Duration::from_secs(19)); // ...until 20 s in
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllOf<A, B> {
    first: A,
    second: B,
}

impl<A, B> AllOf<A, B> {
    /// Both quotas, `first` and `second`.
    pub fn new(first: A, second: B) -> Self {
        Self { first, second }
    }

    /// The first quota (its Lua arguments).
    #[cfg(feature = "redis")]
    pub(crate) fn first(&self) -> &A {
        &self.first
    }

    /// The second quota (its Lua arguments).
    #[cfg(feature = "redis")]
    pub(crate) fn second(&self) -> &B {
        &self.second
    }
}

/// How two states are kept as one: packed into a `u128` word when both are `u64` words, a
/// `PairState` otherwise. Implemented for every pair of the crate's states (which are
/// sealed, so no other impl can exist); not nameable outside the crate.
pub trait Pair<B>: Sized {
    /// The combined state.
    type Both: State;
    /// The two states as one.
    fn join(a: Self, b: B) -> Self::Both;
    /// The two states back from one.
    fn parts(both: &Self::Both) -> (Self, B);
}

/// Two `u64` words packed as `first << 64 | second`. Neither half is ever `u64::MAX` (no
/// algorithm stores it), so the pair never equals the `u128` tombstone.
impl Pair<u64> for u64 {
    type Both = u128;

    #[inline]
    fn join(a: u64, b: u64) -> u128 {
        (a as u128) << 64 | b as u128
    }

    #[inline]
    fn parts(both: &u128) -> (u64, u64) {
        ((*both >> 64) as u64, *both as u64)
    }
}

/// Two states that do not fit one word together, kept behind the key's lock.
#[derive(Debug, Clone, PartialEq)]
pub struct PairState<A, B>(A, B);

macro_rules! locked_pairs {
    // `u64` first: every second state but `u64` (packed above).
    (u64 with $($b:ty),*) => {$(
        impl Pair<$b> for u64 {
            type Both = PairState<u64, $b>;
            fn join(a: u64, b: $b) -> Self::Both {
                PairState(a, b)
            }
            fn parts(both: &Self::Both) -> (u64, $b) {
                (both.0, both.1.clone())
            }
        }
    )*};
    // Any other first state: every second state.
    ($($a:ty),*) => {$(
        impl<B: State> Pair<B> for $a {
            type Both = PairState<$a, B>;
            fn join(a: $a, b: B) -> Self::Both {
                PairState(a, b)
            }
            fn parts(both: &Self::Both) -> ($a, B) {
                (both.0.clone(), both.1.clone())
            }
        }
    )*};
}
locked_pairs!(u64 with u128, LogState, BucketState);
locked_pairs!(u128, LogState, BucketState);

impl<X: State, Y: State> Pair<PairState<X, Y>> for u64 {
    type Both = PairState<u64, PairState<X, Y>>;
    fn join(a: u64, b: PairState<X, Y>) -> Self::Both {
        PairState(a, b)
    }
    fn parts(both: &Self::Both) -> (u64, PairState<X, Y>) {
        (both.0, both.1.clone())
    }
}

impl<X: State, Y: State, B: State> Pair<B> for PairState<X, Y> {
    type Both = PairState<PairState<X, Y>, B>;
    fn join(a: Self, b: B) -> Self::Both {
        PairState(a, b)
    }
    fn parts(both: &Self::Both) -> (Self, B) {
        (both.0.clone(), both.1.clone())
    }
}

impl<A, B> AllOf<A, B>
where
    A: Algorithm,
    B: Algorithm,
    A::State: Pair<B::State>,
{
    /// A request on both quotas (each by `update`, or by `take`), all or nothing: stored
    /// only if both admit.
    #[inline]
    fn step_both(
        &self,
        state: &mut <Self as Algorithm>::State,
        now: u64,
        cost: u64,
        take: bool,
    ) -> Decision {
        let (a, b) = <A::State as Pair<B::State>>::parts(state);
        let (mut a2, mut b2) = (a.clone(), b.clone());
        let (da, db) = if take {
            (
                self.first.take(&mut a2, now, cost),
                self.second.take(&mut b2, now, cost),
            )
        } else {
            (
                self.first.update(&mut a2, now, cost),
                self.second.update(&mut b2, now, cost),
            )
        };
        if da.is_allowed() && db.is_allowed() {
            *state = Pair::join(a2, b2);
        } else {
            // All-or-nothing: a quota that allowed keeps its old state; one that denied keeps
            // what its own policy made of the denial.
            let a = if da.is_allowed() { a } else { a2 };
            let b = if db.is_allowed() { b } else { b2 };
            *state = Pair::join(a, b);
        }
        Decision::all_of(da, db)
    }
}

impl<A, B> Algorithm for AllOf<A, B>
where
    A: Algorithm,
    B: Algorithm,
    A::State: Pair<B::State>,
{
    type State = <A::State as Pair<B::State>>::Both;

    /// A quota pair whose halves each read their half: both quotas change together.
    fn check_quota(&self, quota: &Self) -> Result<(), ConfigError> {
        self.first.check_quota(&quota.first)?;
        self.second.check_quota(&quota.second)
    }

    #[inline]
    fn fresh(&self) -> Self::State {
        Pair::join(self.first.fresh(), self.second.fresh())
    }

    #[inline]
    fn capacity(&self) -> u64 {
        self.first.capacity().min(self.second.capacity())
    }

    /// Strict if either quota is: a denial may then change the state.
    fn policy(&self) -> Policy {
        match (self.first.policy(), self.second.policy()) {
            (Policy::Leaky, Policy::Leaky) => Policy::Leaky,
            _ => Policy::Strict,
        }
    }

    #[inline]
    fn update(&self, state: &mut Self::State, now: u64, cost: u64) -> Decision {
        self.step_both(state, now, cost, false)
    }

    /// Each quota takes it as its own algorithm does (see [`Algorithm::take`]).
    #[inline]
    fn take(&self, state: &mut Self::State, now: u64, cost: u64) -> Decision {
        self.step_both(state, now, cost, true)
    }

    /// Both quotas settle it, so both must hold the debt.
    fn settle_limit(&self, charged: u64) -> u64 {
        let first = self.first.settle_limit(charged);
        first.min(self.second.settle_limit(charged))
    }

    /// Both quotas admitted the request, so both settle it.
    fn settle(&self, state: &mut Self::State, now: u64, taken_at: u64, charged: u64, actual: u64) {
        let (mut a, mut b) = <A::State as Pair<B::State>>::parts(state);
        self.first.settle(&mut a, now, taken_at, charged, actual);
        self.second.settle(&mut b, now, taken_at, charged, actual);
        *state = Pair::join(a, b);
    }

    /// Fresh once both are: the later of the two.
    #[inline]
    fn idle_at(&self, state: &Self::State) -> u64 {
        let (a, b) = <A::State as Pair<B::State>>::parts(state);
        self.first.idle_at(&a).max(self.second.idle_at(&b))
    }
}

impl<A, B> Debt<<A::State as Pair<B::State>>::Both> for AllOf<A, B>
where
    A: Algorithm,
    B: Algorithm,
    A::State: Pair<B::State>,
{
    /// Each quota's debt words, the first's then the second's: each restored on its own.
    fn debt_parts(&self) -> usize {
        self.first.debt_parts() + self.second.debt_parts()
    }

    fn debt(&self, state: &<A::State as Pair<B::State>>::Both, part: usize) -> u128 {
        let (a, b) = <A::State as Pair<B::State>>::parts(state);
        match part.checked_sub(self.first.debt_parts()) {
            None => self.first.debt(&a, part),
            Some(part) => self.second.debt(&b, part),
        }
    }

    fn debt_join(&self, part: usize, x: u128, y: u128) -> u128 {
        match part.checked_sub(self.first.debt_parts()) {
            None => self.first.debt_join(part, x, y),
            Some(part) => self.second.debt_join(part, x, y),
        }
    }

    fn debt_paid_at(&self, part: usize, debt: u128) -> u64 {
        match part.checked_sub(self.first.debt_parts()) {
            None => self.first.debt_paid_at(part, debt),
            Some(part) => self.second.debt_paid_at(part, debt),
        }
    }

    fn debt_lanes(&self, part: usize) -> usize {
        match part.checked_sub(self.first.debt_parts()) {
            None => self.first.debt_lanes(part),
            Some(part) => self.second.debt_lanes(part),
        }
    }

    fn debt_rank(&self, part: usize, shared: u128, own: u128) -> [u64; 2] {
        match part.checked_sub(self.first.debt_parts()) {
            None => self.first.debt_rank(part, shared, own),
            Some(part) => self.second.debt_rank(part, shared, own),
        }
    }

    fn debt_unrank(&self, part: usize, shared: u128, rank: [u64; 2]) -> u128 {
        match part.checked_sub(self.first.debt_parts()) {
            None => self.first.debt_unrank(part, shared, rank),
            Some(part) => self.second.debt_unrank(part, shared, rank),
        }
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> <A::State as Pair<B::State>>::Both {
        let k = self.first.debt_parts();
        Pair::join(
            self.first.restore(debt),
            self.second.restore(&|part| debt(part + k)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{Earrrl, Gcra, SlidingLog, WordStep};
    use crate::Rate;
    use std::time::Duration;

    // Pins G13.
    #[test]
    fn two_u64_words_pack_into_one_u128() {
        let q = AllOf::new(
            "10/s".parse::<Gcra>().unwrap(),
            "1/s".parse::<Gcra>().unwrap(),
        );
        let step = q.step(q.fresh(), 0, 1);
        assert!(step.decision.is_allowed());
        // tat 100 ms in the high half, 1 s in the low half.
        assert_eq!(
            step.state,
            Some((100_000_000u128 << 64) | 1_000_000_000u128)
        );
        assert_eq!(
            <u64 as Pair<u64>>::parts(&step.state.unwrap()),
            (100_000_000, 1_000_000_000)
        );
    }

    // Pins G13.
    #[test]
    fn a_denial_charges_only_the_quotas_that_denied() {
        let loose: Gcra = "10/s burst 10".parse().unwrap();
        let tight: Gcra = "1/s burst 1".parse().unwrap();
        let q = AllOf::new(loose, tight);
        let s = q.step(q.fresh(), 0, 1).state.unwrap();
        let denied = q.step(s, 0, 1);
        assert!(denied.decision.is_denied());
        // Leaky both: nothing changes, so no write.
        assert_eq!(denied.state, None);
        assert_eq!(denied.decision.retry_after(), Duration::from_secs(1));
        assert_eq!(denied.decision.remaining(), Some(0));
    }

    // Pins G13.
    #[test]
    fn strict_earrrl_counts_its_denial_while_gcra_keeps_its_budget() {
        let gcra: Gcra = "100/s burst 100".parse().unwrap();
        let earrrl = Earrrl::new(
            Duration::from_secs(1),
            Rate::new(1.0, Duration::from_secs(1)).unwrap(),
        )
        .unwrap();
        let q = AllOf::new(gcra, earrrl);
        let mut s = q.fresh();
        let mut allowed = 0;
        for _ in 0..10 {
            allowed += q.update(&mut s, 0, 1).is_allowed() as u64;
        }
        let (tat, e) = <u64 as Pair<u64>>::parts(&s);
        // GCRA charged only for the allowed ones, EARRRL for all ten.
        assert_eq!(tat, allowed * 10_000_000);
        let mut alone = earrrl.fresh();
        for _ in 0..10 {
            let _ = earrrl.update(&mut alone, 0, 1);
        }
        assert_eq!(e, alone);
        assert_eq!(q.idle_at(&s), gcra.idle_at(&tat).max(earrrl.idle_at(&e)));
    }

    // Pins G13.
    #[test]
    fn other_pairs_go_behind_the_lock_and_nest() {
        let log = SlidingLog::new(2, Duration::from_secs(1)).unwrap();
        let gcra: Gcra = "3/s burst 3".parse().unwrap();
        let q = AllOf::new(AllOf::new(gcra, gcra), log);
        let mut s = q.fresh();
        let allowed = (0..5)
            .filter(|_| q.update(&mut s, 0, 1).is_allowed())
            .count();
        assert_eq!(allowed, 2);
        assert_eq!(q.capacity(), 2);
    }
}
