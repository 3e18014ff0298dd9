//! The algorithms, as pure state machines: `(old state, now, cost) -> (new state, Decision)`.
//!
//! Nothing here touches an atomic or a lock. [`Algorithm::update`] decides a request and
//! updates a state in place; for word states the lock-free store runs it on a local copy of
//! the word inside its CAS loop, and the mutex twin runs it under a lock.

mod all_of;
mod earrrl;
mod exponential;
mod fixed_window;
mod gcra;
pub(crate) mod in_flight;
mod sliding_log;
mod sliding_window;
mod sub_window;
mod window;

pub use all_of::AllOf;
pub(crate) use all_of::PairState;
pub use earrrl::{Earrrl, IDLE_EPSILON};
pub use exponential::Exponential;
pub use fixed_window::FixedWindow;
pub use gcra::{Gcra, Reservation};
pub use in_flight::InFlight;
pub(crate) use sliding_log::LogState;
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;
pub(crate) use sub_window::BucketState;
pub use sub_window::{SubWindow, DEFAULT_BUCKETS};
pub use window::Bias;

use crate::decision::{Decision, Policy};
use crate::error::ConfigError;
use crate::storage::{StateCells, StateSlot};
use std::fmt::Debug;

pub(crate) mod sealed {
    /// Seals [`State`](super::State): the stores implement their storage traits for exactly
    /// these types.
    pub trait Sealed {
        /// One 64-bit word: a state a compact slot holds beside a 64-bit key under one CAS.
        const WORD64: bool = false;
    }
}

/// A per-key state the stores can hold: a word (`u64`, `u128`) or, for the window algorithms
/// whose state cannot fit one, a small owned value kept behind a per-key lock. Sealed. How a
/// store keeps each one is the store's business (its cell or slot), not the algorithm's.
///
/// `Clone` so that [`peek`](crate::Request::peek) can run a step on a copy.
pub trait State:
    sealed::Sealed + StateCells + StateSlot + Clone + Send + Sync + Debug + 'static
{
}

/// A plain integer state word that the lock-free store can compare-and-swap: `u64` or `u128`.
///
/// Floats are stored as their bits (`f64::to_bits`). All ones (`u64::MAX`, `u128::MAX`) is
/// reserved for the stores (the eviction tombstone); no algorithm stores it (a NaN in float
/// words, a time of 584 years in GCRA's, which saturates one below). Sealed.
pub(crate) trait Word: State + Copy + Eq {}

impl sealed::Sealed for u64 {
    const WORD64: bool = true;
}
impl sealed::Sealed for u128 {}

macro_rules! states {
    (words: $($w:ty),*; others: $($t:ty $(, <$($g:ident),*>)?);*) => {
        $(impl State for $w {}
        impl Word for $w {})*
        $(impl$(<$($g: State),*>)? sealed::Sealed for $t {}
        impl$(<$($g: State),*>)? State for $t {})*
    };
}
states!(words: u64, u128; others: LogState; BucketState; PairState<A, B>, <A, B>);

/// The result of one step by value: the decision, and the new state word (`None` when the
/// state is unchanged, so a store can skip the write).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Step<S> {
    /// The answer to the request.
    pub decision: Decision,
    /// The state to store, if it changed.
    pub state: Option<S>,
}

/// What a key's state still owes, as words a limiter's debt table keeps when capacity
/// eviction drops the key, and the state it starts from when it comes back: how **a flood
/// never resets a limit**. Every [`Algorithm`] is one for its state (a supertrait), so the
/// stores reach it through the algorithm; an algorithm of your own writes [`debt`](Debt::debt)
/// and [`restore`](Debt::restore), and the rest keeps its defaults unless its words are
/// several (a log's cells) or can be ranked finer than "the larger word" (see
/// [`debt_lanes`](Debt::debt_lanes)).
///
/// ```
/// use hotlimit::algo::{Algorithm, Debt, Gcra};
///
/// let gcra: Gcra = "10/s burst 2".parse()?;
/// let mut tat = gcra.fresh();
/// gcra.update(&mut tat, 0, 2);
/// // Spent: the key owes its state's word, and comes back from it no more lenient.
/// let owed = gcra.debt(&tat, 0);
/// assert!(owed > 0);
/// let back = gcra.restore(&|_| owed);
/// assert_eq!(gcra.peek(&back, 0, 1), gcra.peek(&tat, 0, 1));
/// // A fresh state owes nothing.
/// assert_eq!(gcra.debt(&gcra.fresh(), 0), 0);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait Debt<S> {
    /// How many words ([`debt`](Debt::debt)) describe what a state still owes: 1 for
    /// most algorithms of the crate; one per cell of time for [`SlidingLog`] and
    /// [`SubWindow`] (each cell's costs come back at its newest time, not the whole log's at
    /// the newest: see their `debt`); the sum of its two quotas' for [`AllOf`]. 0 opts out of
    /// remembering debts, so capacity eviction forgets a limited key: only for an algorithm
    /// whose state is kept elsewhere too.
    #[inline(always)]
    fn debt_parts(&self) -> usize {
        1
    }

    /// Part `part` of what a key in `state` still owes, as a word below 2^96 ([`DEBT_MAX`]);
    /// 0 for nothing (a fresh state's debt is 0). Capacity eviction keeps it in the limiter's
    /// debt table when it evicts a key that is not fresh, so that the key, inserted again,
    /// starts from [`restore`](Debt::restore) instead of a fresh state. The word need
    /// not be exact, only never more lenient: see `restore`.
    fn debt(&self, state: &S, part: usize) -> u128;

    /// A debt word at least as limiting as both `a` and `b` (words of part `part`): what a
    /// debt table cell keeps when two keys share it. The default is the larger word, right
    /// for debts that are one time or one ordered word.
    #[inline]
    fn debt_join(&self, part: usize, a: u128, b: u128) -> u128 {
        let _ = part;
        a.max(b)
    }

    /// The time (ns) from which the debt word `debt` of part `part` limits nothing: its
    /// restored state is then equivalent to a fresh one. A debt table cell whose debt is paid
    /// is free for another key. By default the [`idle_at`](Algorithm::idle_at) of the state
    /// [`restore`](Debt::restore)d from that word alone (0 for a word of 0); an algorithm
    /// whose restore is dear (a log's) answers from the word.
    fn debt_paid_at(&self, part: usize, debt: u128) -> u64
    where
        Self: Algorithm<State = S>,
    {
        if debt == 0 {
            return 0;
        }
        self.idle_at(&self.restore(&|p| if p == part { debt } else { 0 }))
    }

    /// How many numbers rank part `part`'s debt words ([`debt_rank`](Debt::debt_rank)):
    /// 0 (the default) where they are not ranked, so a key evicted for capacity comes back
    /// owing the debt table slot it shares with others; 1 or 2 where they are, so it comes
    /// back owing its own (a working set larger than the store keeps its admissions). GCRA,
    /// EARRRL, the fixed window and the exponential limiter rank by one number; the sliding
    /// window, the sliding log and the sub-window by two (their codes may take two cells, and
    /// their tables have a quarter more buckets).
    #[inline]
    fn debt_lanes(&self, part: usize) -> usize {
        let _ = part;
        0
    }

    /// The *rank* of debt word `own` beneath `shared` (of part `part`; `shared` at least as
    /// limiting as `own`, as a debt table slot's word joins its keys'): numbers (the first
    /// [`debt_lanes`](Debt::debt_lanes), the rest 0), each growing with how limiting
    /// `own` is. The table keeps, beside the debt a key shares with others, how far below the
    /// shared word's rank its own is, and brings the key back owing
    /// [`debt_unrank`](Debt::debt_unrank) of that. As a slot grows, its keys are ranked
    /// again beneath the new word from the words their ranks stand for, so a rank that comes
    /// back from its word unchanged keeps its precision. GCRA, EARRRL and the fixed window rank
    /// a word as itself (their words are ordered as numbers); the exponential limiter by the
    /// time its rate, decaying, falls to 1; the sliding window by its two counts brought to the
    /// shared word's window; the sliding log and the sub-window by their time and total. Only
    /// called where `debt_lanes` is not 0.
    #[inline]
    fn debt_rank(&self, part: usize, shared: u128, own: u128) -> [u64; 2] {
        let _ = (part, shared, own);
        [0; 2]
    }

    /// The debt word a rank `rank` beneath `shared` stands for: for every rank from
    /// `debt_rank(part, shared, own)` (of any `own` that `shared` joins) up to
    /// `debt_rank(part, shared, shared)`, each number, a word at least as limiting as `own`
    /// and at most as limiting as `shared`, growing with the rank, and so paid
    /// ([`debt_paid_at`](Debt::debt_paid_at)) no sooner. Only called where
    /// [`debt_lanes`](Debt::debt_lanes) is not 0.
    #[inline]
    fn debt_unrank(&self, part: usize, shared: u128, rank: [u64; 2]) -> u128 {
        let _ = (part, rank);
        shared
    }

    /// A state **at least as limited** as any state whose debt words are at most `debt(p)` for
    /// each part `p` (a word of 0: that part owes nothing): from it, no sequence of requests is
    /// admitted more, or earlier, than from the state that was evicted. All zeros restore
    /// [`fresh`](Algorithm::fresh).
    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> S;
}

/// A rate-limiting algorithm as a pure state machine.
///
/// [`update`](Algorithm::update) must depend only on its arguments: the lock-free store may
/// run it several times for one request (once per CAS attempt, each time on a fresh copy of
/// the word) and keeps only the last result.
///
/// Callers (the limiters) reject a cost of 0 or above [`capacity`](Algorithm::capacity)
/// before calling it; it must still not panic on any input.
///
/// A state that admits a cost admits any smaller one at the same instant: a partial grant
/// ([`Request::up_to`](crate::Request::up_to)) finds the most units available by bisection
/// on [`peek`](Algorithm::peek), on every algorithm.
///
/// An algorithm of your own keeps its state in a `u64` or `u128` word and answers with
/// [`Decision::allowed`](crate::Decision::allowed) and
/// [`Decision::denied`](crate::Decision::denied) (with what it knows: `with_remaining`,
/// `with_reset_after`, `with_rate`), and says what a state owes in its [`Debt`] (a
/// supertrait: `debt` and `restore`, kept through capacity eviction, so a flood of new keys
/// never resets it); it then runs on every in-memory store, behind `hotlimit-tower`'s layer (with
/// [`AdvertisedQuota`](https://docs.rs/hotlimit/latest/hotlimit/headers/trait.AdvertisedQuota.html))
/// and in `hotlimit-server` (registered by name in its settings): `tests/common/tick_bucket.rs`
/// is one, a token bucket refilled on ticks, checked against its own sequential model on each
/// store (`tests/outside_algorithm.rs`), behind the layer and over the server's JSON API.
///
/// # Examples
///
/// ```
/// use hotlimit::algo::{Algorithm, Gcra};
///
/// let gcra: Gcra = "10/s burst 5".parse()?;
/// let mut state = gcra.fresh();
/// let allowed = (0..10).filter(|_| gcra.update(&mut state, 0, 1).is_allowed()).count();
/// assert_eq!(allowed, 5);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
pub trait Algorithm: Debt<<Self as Algorithm>::State> + Send + Sync + 'static {
    /// The state kept per key. A word must never be all ones (the eviction tombstone): the stores
    /// reserve that value to mark a cell being evicted.
    type State: State;

    /// The state of a key never seen before.
    fn fresh(&self) -> Self::State;

    /// The largest cost this algorithm can ever admit at once; at least 1, so a request of
    /// cost 1 is always valid.
    fn capacity(&self) -> u64;

    /// What a denied request does to the state.
    fn policy(&self) -> Policy;

    /// The largest actual cost a settle of a request charged `charged` accepts: above it the
    /// debt could not be held before the end of the clock ([`CLOCK_MAX`]), so the settle is a
    /// [`QuotaError::ExceedsCapacity`](crate::QuotaError::ExceedsCapacity) that changes nothing
    /// and leaves the ticket open (a debt that large is a caller's bug or a hostile count, not
    /// a response's size). GCRA: `charged + CLOCK_MAX / T`; by default, and for the
    /// algorithms whose debt stops at a window's end or decays, any.
    fn settle_limit(&self, charged: u64) -> u64 {
        let _ = charged;
        u64::MAX
    }

    /// Whether `quota` may decide requests on the states this configuration keeps: a quota
    /// that comes with a request ([`Request::quota`](crate::Request::quota)), or the new
    /// configuration of a live switch ([`Live`](crate::Live)); an
    /// [`Unchangeable`](crate::ConfigError::Unchangeable) error names the field that differs.
    /// By default none (for [`Field::Quota`](crate::Field::Quota)).
    ///
    /// The crate's algorithms keep physical states, not states relative to the quota: GCRA a
    /// time (how far ahead of the clock a key's budget is spent), EARRRL and the exponential
    /// limiter a measured rate. So a state kept under one configuration is still meaningful
    /// under another, and is read as it is: **no switch or plan hands budget back**. A state
    /// spent further than the new quota could have spent it stays so until it is paid
    /// (clamping it to the new quota's reach would hand the difference back on a switch to a
    /// smaller quota and back). What may differ: every GCRA parameter (rate, burst, policy);
    /// EARRRL's limit and policy, not its half-life (the state is measured in it); the
    /// exponential limiter's limit and policy, not its period; the window algorithms' limit
    /// and policy, not their window (their counts are laid out for it; nor the sub-window's
    /// buckets and bias, nor the fixed window's count width); the in-flight limit, not its
    /// lease. An algorithm of your own admits only configurations under which its states mean
    /// the same.
    fn check_quota(&self, quota: &Self) -> Result<(), ConfigError> {
        let _ = quota;
        Err(ConfigError::Unchangeable {
            field: crate::Field::Quota,
            from: "this configuration".into(),
            to: "another".into(),
        })
    }

    /// Decides one request of `cost` at `now` (nanoseconds since the clock's origin) and
    /// updates `state` accordingly.
    fn update(&self, state: &mut Self::State, now: u64, cost: u64) -> Decision;

    /// The earliest time (ns) from which `state` is equivalent to [`fresh`](Algorithm::fresh):
    /// every request from then on gets the same decision and the same next state from either,
    /// so dropping the key then loses nothing. Idle eviction is built on it, and capacity
    /// eviction forgets first the keys with the earliest `idle_at` (the least live state).
    fn idle_at(&self, state: &Self::State) -> u64;

    /// The decision [`update`](Algorithm::update) would return, leaving `state` untouched:
    /// what `peek` answers.
    #[inline]
    fn peek(&self, state: &Self::State, now: u64, cost: u64) -> Decision {
        self.update(&mut state.clone(), now, cost)
    }

    /// Decides a request of `cost` at `now` whose cost a [`settle`](Algorithm::settle) may
    /// correct later (a take: [`Request::take`](crate::Request::take)), and updates `state`:
    /// the same decision as [`update`](Algorithm::update), and a state from which the settle
    /// can hand back exactly what the take added, never more. The default is `update`, right
    /// for every algorithm whose request adds what its settle takes back (GCRA's `cost·T`, a
    /// window's count, EARRRL's impulse); the exponential limiter stores the request as a
    /// whole impulse of `cost`, which its smoothing would otherwise spread thinner than the
    /// refund.
    #[inline]
    fn take(&self, state: &mut Self::State, now: u64, cost: u64) -> Decision {
        self.update(state, now, cost)
    }

    /// Settles a request admitted at `taken_at` for `charged` units whose actual cost turned
    /// out to be `actual` (known only after the work: tokens generated, bytes sent), at `now`.
    ///
    /// The crate's algorithms give it one meaning: **unused units come back from where they
    /// were charged, as far as the state still remembers them; an overrun is charged now,
    /// whatever the limit** (a debt the key pays before its next admission). GCRA moves its
    /// `tat` back by `(charged − actual)·T`, never below `now` (a bucket holds at most its
    /// burst), or forward from `max(tat, now)` by `(actual − charged)·T`, past the burst if
    /// need be. The windows take a refund out of the window or bucket the request was counted
    /// in (nothing once it has left the window) and count an overrun in the current one (as
    /// far as their counts go: a window cannot hold a debt past its end). EARRRL and the
    /// exponential limiter measure a rate, not a budget: the difference is an impulse at the
    /// request's time, decayed to the state's time and added (a refund subtracts it, floored
    /// at a zero rate). [`AllOf`] settles both quotas; [`Live`](crate::Live) the configuration
    /// in force.
    ///
    /// `actual == charged` changes nothing. The default, for algorithms outside the crate,
    /// leaves the provisional charge standing. An `actual` above
    /// [`settle_limit`](Algorithm::settle_limit) never reaches it: the settle is an error.
    #[inline]
    fn settle(
        &self,
        _state: &mut Self::State,
        _now: u64,
        _taken_at: u64,
        _charged: u64,
        _actual: u64,
    ) {
    }
}

/// [`Algorithm::update`] by value, for algorithms whose state is a [`Word`]: the pure
/// `(old state, now, cost) -> (new state, Decision)` form the stores' CAS loops and the
/// fleet's merges run.
#[cfg(any(test, feature = "redis"))]
pub(crate) trait WordStep: Algorithm {
    /// Decides one request for a key in `state`, returning the decision and the new word.
    fn step(&self, state: Self::State, now: u64, cost: u64) -> Step<Self::State>;
}

#[cfg(any(test, feature = "redis"))]
impl<A: Algorithm> WordStep for A
where
    A::State: Word,
{
    #[inline]
    fn step(&self, state: A::State, now: u64, cost: u64) -> Step<A::State> {
        let mut new = state;
        let decision = self.update(&mut new, now, cost);
        Step {
            decision,
            state: (new != state).then_some(new),
        }
    }
}

/// The largest [`Debt::debt`] word: 96 bits, so that a debt table cell holds one with a
/// 32-bit tag of its key in 128 bits.
pub const DEBT_MAX: u128 = (1 << 96) - 1;

/// The latest time the algorithms work with: `u64::MAX − 1` ns (584 years after the clock's
/// origin). A later reading is taken as this one, so saturated times (`idle_at`, a
/// `tat + cost·T`) never collide with `now` itself and the tombstone stays unreachable.
pub const CLOCK_MAX: u64 = u64::MAX - 1;

/// A partial grant: admits the most units in `1..=most` that `state` admits at `now` and
/// returns how many, with the decision of that cost. If not even one unit is admitted,
/// `(0, d)` where `d` is the decision of a request of cost 1 (which a strict policy counts).
/// `most` is at least 1 and at most the capacity, as the limiters ensure. By bisection on
/// [`peek`](Algorithm::peek), since every algorithm that admits a cost admits any smaller one
/// (an algorithm's contract): at most `log2(most) + 2` steps on copies of the state, then one
/// `update`. No algorithm of the crate had a closed form worth a trait method.
pub(crate) fn update_up_to<A: Algorithm>(
    algo: &A,
    state: &mut A::State,
    now: u64,
    most: u64,
) -> (u64, Decision) {
    let granted = most_admitted(most, |c| algo.peek(state, now, c).is_allowed());
    (granted, algo.update(state, now, granted.max(1)))
}

/// The most units in `1..=most` that `admits` (0 if not even one), for a cost whose admission
/// implies any smaller one's: by bisection, at most `log2(most) + 2` probes. The partial
/// grants' search, for [`update_up_to`] and the hybrid limiter's entries.
pub(crate) fn most_admitted(most: u64, mut admits: impl FnMut(u64) -> bool) -> u64 {
    let most = most.max(1);
    if admits(most) {
        return most;
    }
    if !admits(1) {
        return 0;
    }
    // `lo` is admitted, `hi` is not.
    let (mut lo, mut hi) = (1, most);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if admits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Counts in debt words: 24 bits, exact below 2^19, above that a 5-bit exponent and a 19-bit
/// mantissa rounded up (within 2^-18 of the count, never below it).
pub(crate) fn count_up24(count: u64) -> u128 {
    const M: u32 = 19;
    if count < 1 << M {
        return u128::from(count);
    }
    let mut e = 64 - count.leading_zeros() - M;
    let mut m = count.div_ceil(1 << e);
    if m == 1 << M {
        (e, m) = (e + 1, 1 << (M - 1));
    }
    (u128::from(e) << M) | u128::from(m)
}

/// The count a 24-bit debt count stands for: at least the one encoded.
pub(crate) fn count_from24(code: u128) -> u64 {
    let (e, m) = ((code >> 19) as u32 & 31, (code & ((1 << 19) - 1)) as u64);
    m.checked_shl(e).filter(|v| v >> e == m).unwrap_or(u64::MAX)
}

/// The join of two debt words `(time << 32) | count` (the sliding log's and the sub-window's):
/// the later time and the larger count.
pub(crate) fn join_time_and_count(a: u128, b: u128) -> u128 {
    ((a >> 32).max(b >> 32) << 32) | (a & 0xFFFF_FFFF).max(b & 0xFFFF_FFFF)
}

/// The rank of such a word: its time and its count, each as it is (a word is at least as
/// limiting as another when both are at least the other's).
pub(crate) fn rank_time_and_count(own: u128) -> [u64; 2] {
    [(own >> 32) as u64, own as u32 as u64]
}

/// The word of such a rank beneath `shared`: each at most the shared word's.
pub(crate) fn unrank_time_and_count(shared: u128, rank: [u64; 2]) -> u128 {
    let top = rank_time_and_count(shared);
    (u128::from(rank[0].min(top[0])) << 32) | u128::from(rank[1].min(top[1]))
}

/// `now`, capped at [`CLOCK_MAX`].
#[inline(always)]
pub(crate) fn clamp(now: u64) -> u64 {
    now.min(CLOCK_MAX)
}

/// Stores a by-value step's new word in `state` and returns its decision: `update` for the
/// algorithms written as `decide(word) -> Step`.
#[inline(always)]
pub(crate) fn store<W: Word>(state: &mut W, step: Step<W>) -> Decision {
    if let Some(new) = step.state {
        *state = new;
    }
    step.decision
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
