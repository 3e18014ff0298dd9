//! EARRRL: the estimated average recent request rate, an exponentially decaying rate that keeps
//! a client locked out while it keeps abusing.

use super::{clamp, honest_wait, store, Algorithm, Debt, Step};
use crate::config::{Rate, NANOS_PER_SEC};
use crate::decision::{Decision, Policy};
use crate::error::{ConfigError, Field};
use std::time::Duration;

/// A key whose rate has decayed below this fraction of the limit `R` is treated as fresh (its
/// residual forgotten), which makes idle eviction exactly lossless: an evicted key and a kept
/// one step identically. 1e-9 of `R` is reached about 30 + log2(λ/R) half-lives after the last
/// request.
pub const IDLE_EPSILON: f64 = 1e-9;

/// EARRRL with half-life `h` and maximum rate `R`; `λ = ln 2 / h`.
///
/// The textbook state is `N` requests assumed to have arrived together at `T`: the rate at
/// `now` is `N·λ·e^{λ(T−now)}`, and a request of cost `c` makes `N ← c + N·e^{λ(T−now)}`,
/// `T ← now`. A request is denied iff the rate just before it is greater than `R`; the state
/// is updated always under [`Policy::Strict`] (the default) and only when allowed under
/// [`Policy::Leaky`].
///
/// The lock-free store keeps ONE word: the virtual time `S = T + ln(N)/λ` (seconds, as `f64`
/// bits; a fresh key has `S = −∞`). Then the rate is `λ·e^{λ(S−now)}` and the update is
/// `S ← now + ln(c + e^{λ(S−now)})/λ`. Property tests run the textbook two-field form `(N, T)`
/// beside it (tests/common/earrrl_pair.rs) and check both give the same decisions and rates
/// (to 1e-9 relative) over long random traces.
///
/// The mutex twin runs the one-word step under its lock, like every other algorithm: two float
/// forms agree in decisions but not in the last bits of the rate, and the twins must print
/// byte-identical decisions so that they differ only in how they synchronize.
///
/// `retry_after` is the time until the rate decays to `R`, `(S − now) + ln(λ/R)/λ`, rounded up
/// to a nanosecond at which the next step really allows. [`Decision::rate`] is the rate just
/// before the request (cost units per second).
///
/// A key whose rate has decayed below [`IDLE_EPSILON`]`·R` is treated as fresh, so idle eviction
/// is exactly lossless.
///
/// The largest cost of one request ([`capacity`](Algorithm::capacity)) is `⌊R/λ⌋`, the cost
/// that takes a fresh key's rate to `R`; a larger one is a [`QuotaError`](crate::QuotaError).
///
/// A clock read earlier than the last update cannot be seen in the one-word form (it stores
/// `S`, not `T`); it is evaluated as is, which makes the rate slightly higher (errs strict) and
/// never produces NaN.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::{Algorithm, Earrrl}, Rate};
/// use std::time::Duration;
///
/// let e = Earrrl::new(Duration::from_secs(2), Rate::new(3.0, Duration::from_secs(1))?)?;
/// let mut s = e.fresh();
/// let _ = e.update(&mut s, 0, 1);
/// let d = e.update(&mut s, 250_000_000, 1);
/// assert!((d.rate().unwrap() - 0.317809383554).abs() < 1e-12);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Earrrl {
    /// λ, per second.
    lambda: f64,
    /// R, cost units per second.
    max_rate: f64,
    /// ln(λ/R)/λ, seconds: the retry-after offset, computed once.
    retry_offset: f64,
    /// ln(λ/(εR))/λ, seconds: from `S` to the time the rate falls to `IDLE_EPSILON·R`.
    idle_offset: f64,
    half_life: Duration,
    policy: Policy,
}

impl Earrrl {
    /// EARRRL with the given half-life and maximum rate; policy strict.
    pub fn new(half_life: Duration, limit: Rate) -> Result<Self, ConfigError> {
        if half_life.is_zero() {
            return Err(ConfigError::Zero {
                field: Field::HalfLife,
                value: "0s".into(),
            });
        }
        let lambda = std::f64::consts::LN_2 / half_life.as_secs_f64();
        if !(lambda.is_finite() && lambda > 0.0) {
            // Reachable only by a half-life beyond f64's range of seconds.
            return Err(ConfigError::TooLarge {
                field: Field::HalfLife,
                value: format!("{half_life:?}"),
                max: "a decay constant ln 2 / half-life above 0 in f64",
            });
        }
        // `Rate::new` guarantees a positive finite per-second value.
        let max_rate = limit.per_second();
        let retry_offset = (lambda / max_rate).ln() / lambda;
        let idle_offset = (lambda / (IDLE_EPSILON * max_rate)).ln() / lambda;
        if !(retry_offset.is_finite() && idle_offset.is_finite()) {
            // A limit so far below the decay constant (a 1 ns half-life against one request
            // per century, say) that the time for the rate to fall to it overflows f64: a
            // denial's wait could not be told, nor the key ever judged idle.
            return Err(ConfigError::TooSmall {
                field: Field::Limit,
                value: limit.to_string(),
                min: "a rate whose decay horizon ln(λ/(1e-9·R))/λ is finite",
            });
        }
        Ok(Self {
            lambda,
            max_rate,
            retry_offset,
            idle_offset,
            half_life,
            policy: Policy::Strict,
        })
    }

    /// Sets the policy.
    pub fn with_policy(self, policy: Policy) -> Self {
        Self { policy, ..self }
    }

    /// The half-life.
    pub(crate) fn half_life(&self) -> Duration {
        self.half_life
    }

    /// The maximum rate `R`, cost units per second.
    pub fn max_rate(&self) -> f64 {
        self.max_rate
    }

    /// `(λ, R, retry offset, idle offset)`, for the Redis scripts.
    #[cfg(feature = "redis")]
    pub(crate) fn redis_params(&self) -> (f64, f64, f64, f64) {
        (
            self.lambda,
            self.max_rate,
            self.retry_offset,
            self.idle_offset,
        )
    }

    #[inline]
    fn rate_at(&self, s: f64, now: f64) -> f64 {
        // S = −∞ (fresh) gives e^{−∞} = 0: no special case needed.
        self.lambda * (self.lambda * (s - now)).exp()
    }

    /// `now + ln(cost + e^x)/λ` for `x = λ(S−now)`, given `e^x` (already computed for the
    /// rate). Log-sum-exp: `ln(c + e^x) = max(x, ln c) + ln_1p(min/max)`, because `e^x`
    /// overflows once a client has sent about 700·h worth of requests at one instant while the
    /// ratio of the smaller term to the larger never does; reusing `e^x` for the ratio saves
    /// the second `exp` of the textbook form.
    #[inline]
    fn update(&self, now: f64, x: f64, ex: f64, cost: u64) -> f64 {
        let c = cost as f64;
        let (hi, ratio) = if ex > c {
            (x, c / ex)
        } else {
            // ln(1) = 0: skip the `ln` for the common cost.
            (if cost == 1 { 0.0 } else { c.ln() }, ex / c)
        };
        now + (hi + ratio.ln_1p()) / self.lambda
    }

    /// The state after a request of `cost` at `now` (ns) for a key in word `s`, whatever the
    /// rate: what the hybrid limiter counts in an instance's own state once the merged
    /// step has counted the request.
    #[cfg(feature = "redis")]
    pub(crate) fn counted(&self, word: u64, now_ns: u64, cost: u64) -> u64 {
        let s = self.live(word, now_ns);
        let now = secs(now_ns);
        let x = self.lambda * (s - now);
        self.update(now, x, x.exp(), cost).to_bits()
    }

    /// [`counted`](Self::counted) given `x = λ(S − now)` and `e^x` already computed, `now`
    /// in seconds.
    #[cfg(feature = "redis")]
    pub(crate) fn counted_from(&self, now: f64, x: f64, ex: f64, cost: u64) -> u64 {
        self.update(now, x, ex, cost).to_bits()
    }

    /// The virtual time `S` of `word` at `now_ns`: −∞ once the residual rate is below ε·R
    /// (forgotten: the same test the sweeper evicts on).
    #[inline]
    pub(crate) fn live(&self, word: u64, now_ns: u64) -> f64 {
        if self.idle_at(&word) <= now_ns {
            f64::NEG_INFINITY
        } else {
            f64::from_bits(word)
        }
    }

    /// The honest wait for a key in state `s` at `now` (seconds) to see a rate ≤ R.
    fn retry_after(&self, s: f64, now_ns: u64) -> u64 {
        let guess = (s - secs(now_ns) + self.retry_offset) * NANOS_PER_SEC;
        honest_wait(guess, |w| {
            self.rate_at(s, secs(now_ns.saturating_add(w))) <= self.max_rate
        })
    }
}

#[inline]
fn secs(ns: u64) -> f64 {
    ns as f64 / NANOS_PER_SEC
}

impl Earrrl {
    /// The step by value: the decision and the new word (`None`: unchanged).
    pub(crate) fn decide(&self, word: u64, now_ns: u64, cost: u64) -> Step<u64> {
        let now_ns = clamp(now_ns);
        let s = self.live(word, now_ns);
        let now = secs(now_ns);
        // One `exp` serves the rate and the update. S = −∞ (fresh) gives e^x = 0.
        let x = self.lambda * (s - now);
        let ex = x.exp();
        let rate = self.lambda * ex;
        if rate <= self.max_rate {
            return Step {
                decision: Decision::allowed().with_rate(rate),
                state: Some(self.update(now, x, ex, cost).to_bits()),
            };
        }
        let after = match self.policy {
            Policy::Leaky => s,
            Policy::Strict => self.update(now, x, ex, cost),
        };
        Step {
            decision: Decision::denied_ns(self.retry_after(after, now_ns)).with_rate(rate),
            state: (self.policy == Policy::Strict).then_some(after.to_bits()),
        }
    }
}

impl Algorithm for Earrrl {
    /// EARRRL's state is the key's measured rate, valid under any limit: it is kept as is.
    fn check_quota(&self, new: &Self) -> Result<(), ConfigError> {
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

    type State = u64;

    #[inline]
    fn fresh(&self) -> u64 {
        f64::NEG_INFINITY.to_bits()
    }

    /// The cost that takes a fresh key's rate to `R`: `⌊R/λ⌋` (`R·half-life/ln 2`), and at
    /// least one unit. A request is admitted while the rate before it is at most `R`, so
    /// without this bound one request could take any number of units
    /// (a partial grant of up to `u64::MAX` granted `u64::MAX`) for a lockout of a few dozen
    /// half-lives. `as` saturates.
    #[inline]
    fn capacity(&self) -> u64 {
        ((self.max_rate / self.lambda).floor() as u64).max(1)
    }

    #[inline]
    fn policy(&self) -> Policy {
        self.policy
    }

    #[inline]
    fn update(&self, state: &mut u64, now: u64, cost: u64) -> Decision {
        store(state, self.decide(*state, now, cost))
    }

    /// The difference is an impulse of `actual − charged` units at `taken_at`, decayed to
    /// `now` and added to `N` (a refund subtracts it; a rate that would fall to zero or below
    /// is fresh). In log space, like the update, so no abuse overflows it.
    fn settle(&self, word: &mut u64, now_ns: u64, taken_at: u64, charged: u64, actual: u64) {
        if actual == charged {
            return;
        }
        let now_ns = clamp(now_ns);
        let now = secs(now_ns);
        // ln N at now (−∞ when fresh) and ln of what is left now of the impulse.
        let x = self.lambda * (self.live(*word, now_ns) - now);
        let z = (actual.abs_diff(charged) as f64).ln()
            + (self.lambda * (secs(clamp(taken_at)) - now)).min(0.0);
        let ln_n = if actual > charged {
            let m = x.max(z);
            m + ((x - m).exp() + (z - m).exp()).ln()
        } else if z < x {
            // ln(e^x − e^z) = x + ln(1 − e^{z−x}).
            x + (-(z - x).exp()).ln_1p()
        } else {
            f64::NEG_INFINITY
        };
        *word = (now + ln_n / self.lambda).to_bits();
    }

    fn idle_at(&self, word: &u64) -> u64 {
        let word = *word;
        let idle_s = f64::from_bits(word) + self.idle_offset;
        // −∞ (fresh) becomes 0; `as` saturates a far future to u64::MAX.
        (idle_s * NANOS_PER_SEC).ceil().max(0.0) as u64
    }
}

impl Debt<u64> for Earrrl {
    /// The debt is the virtual time `S` (the rate at any later time grows with it), as an
    /// order-preserving integer with a fresh key's `−∞` at 0: restored exactly, and the later
    /// of two `S` is the more limited.
    fn debt(&self, word: &u64, _: usize) -> u128 {
        u128::from(ordered(*word) - ordered(f64::NEG_INFINITY.to_bits()))
    }

    fn debt_lanes(&self, _: usize) -> usize {
        1
    }

    /// `T = S + 2^32 s` (rounded up: `T − 2^32 ≥ S`), its float's bits in order: for every
    /// `S` from −68 to 136 years `T` lies in one or two binades, where its bits grow as time
    /// does, so a code's unit (2^-22 of its slot's spread, 2^-11 in one cell) is as fine at any `S`, and there
    /// `T − 2^32` is exact, so a rank read back and ranked again is the same rank. Ranked by
    /// the bits of `S` itself, the unit followed the exponents' stretch: a key came back up to
    /// ~80 ms later in `S` (5% more count), and a working set of 4× `max_keys` lost up to 7.4%
    /// of its admissions (2–4% most runs).
    fn debt_rank(&self, _: usize, _: u128, own: u128) -> [u64; 2] {
        if own == 0 {
            return [0, 0];
        }
        let s = f64::from_bits(self.restore(&|_| own));
        let mut t = s + RANK_OFFSET;
        // At most an ulp short where the sum rounded down; a few steps anywhere else.
        for _ in 0..4 {
            if t - RANK_OFFSET >= s {
                return [ordered(t.to_bits()).max(1), 0];
            }
            // The next float up (`f64::next_up` is newer than the crate's MSRV): the next
            // integer in the floats' order.
            t = f64::from_bits(unordered(ordered(t.to_bits()).saturating_add(1)));
        }
        [u64::MAX, 0]
    }

    /// `T − 2^32` of the rank (the very expression the rank was checked with: never below the
    /// ranked word's `S`), at most the shared word's; 0 is fresh, and a rank that is no float
    /// the shared word itself.
    fn debt_unrank(&self, _: usize, shared: u128, rank: [u64; 2]) -> u128 {
        if rank[0] == 0 {
            return 0;
        }
        let t = f64::from_bits(unordered(rank[0]));
        if t.is_nan() {
            return shared;
        }
        self.debt(&(t - RANK_OFFSET).to_bits(), 0).min(shared)
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> u64 {
        let d = u64::try_from(debt(0)).unwrap_or(u64::MAX);
        let key = d.saturating_add(ordered(f64::NEG_INFINITY.to_bits()));
        // Never the NaNs above +∞ (one of them is the tombstone): +∞ at most.
        unordered(key.min(ordered(f64::INFINITY.to_bits())))
    }
}

/// What a debt's rank adds to `S` (seconds): 2^32, so that the sums of the `S` a clock
/// reaches share an exponent or two.
const RANK_OFFSET: f64 = 4_294_967_296.0;

/// `f64` bits mapped to integers in the floats' order (negative floats reversed below the
/// positive ones).
fn ordered(bits: u64) -> u64 {
    if bits >> 63 == 0 {
        bits | 1 << 63
    } else {
        !bits
    }
}

/// The inverse of [`ordered`].
fn unordered(key: u64) -> u64 {
    if key >> 63 == 1 {
        key & !(1 << 63)
    } else {
        !key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A debt's rank grows as `S` does, evenly: a second is as many rank steps at `S` = 5 s
    /// as at 50 s or at a Unix time (so a debt table code's unit is as fine at any `S`); a
    /// rank read back is never below the ranked `S`, within a microsecond of it, and ranks
    /// again to itself (a slot that grows moves no code).
    // Pins G24.
    #[test]
    fn a_debt_ranks_by_time_and_comes_back_to_itself() {
        let e = Earrrl::new(
            Duration::from_secs(1),
            Rate::new(10.0, Duration::from_secs(1)).unwrap(),
        )
        .unwrap();
        let rank = |s: f64| e.debt_rank(0, u128::MAX, e.debt(&s.to_bits(), 0))[0];
        let step = |s: f64| rank(s + 1.0) - rank(s);
        assert_eq!(step(5.0), step(50.0));
        assert_eq!(step(5.0), step(1.8e9));
        let top = e.debt(&f64::INFINITY.to_bits(), 0);
        for s in [-3.25f64, 0.1, 5.123_456_789, 59.999_999_999, 1.8e9 + 0.3] {
            let own = e.debt(&s.to_bits(), 0);
            let r = e.debt_rank(0, top, own);
            let back = e.debt_unrank(0, top, r);
            let again = f64::from_bits(e.restore(&|_| back));
            assert!(back >= own && again - s < 1e-6, "{s}: back {again}");
            assert_eq!(e.debt_rank(0, top, back), r, "{s}");
        }
        // Beneath a shared word, never above it; fresh is fresh.
        let shared = e.debt(&5.0f64.to_bits(), 0);
        assert_eq!(e.debt_unrank(0, shared, [rank(9.0), 0]), shared);
        assert_eq!(e.debt_unrank(0, shared, [0, 0]), 0);
    }
}
