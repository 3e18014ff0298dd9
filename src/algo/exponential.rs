//! Exim-style exponential rate limiting (Exim's `ratelimit` ACL condition).

use super::{clamp, honest_wait, store, Algorithm, Debt, Step};
use crate::config::NANOS_PER_SEC;
use crate::decision::{Decision, Policy};
use crate::error::{ConfigError, Field};
use std::time::Duration;

/// The smallest interval, in periods, Exim lets a request see: two requests at one instant
/// still decay by `e^{−1e-10}` rather than dividing by zero.
const MIN_INTERVAL: f64 = 1e-10;

/// Exponential rate limiting: `limit` L (cost units, also the largest burst) per `period` P.
///
/// State: the last update time and the average rate `r` (cost per period). For a request of
/// cost `c` at `now`:
/// * `i = max((now − t_prev)/P, 1e-10)`, `α = e^{−i}`, `r_inst = c / i`
/// * `r_now = max((1 − α)·r_inst + α·r_prev, c)`
/// * denied iff `r_now > L`; otherwise `(now, r_now)` is stored (under [`Policy::Strict`]
///   also when denied). Default policy: leaky.
///
/// A burst at one instant is allowed exactly `⌊L / c⌋` times.
///
/// **Packing.** The state is two full-precision numbers, `t_prev` (u64 ns) and `r` (f64),
/// in one `u128` word (`t_prev` high, `r` bits low) that the lock-free store updates with a
/// 128-bit CAS (`cmpxchg16b` on x86-64, `CASP`/`LDXP` on AArch64, via `portable-atomic`).
/// Packing both into 64 bits would cost either time range (a 32-bit timestamp wraps in days)
/// or rate precision, and so would change decisions; the double-word CAS changes none.
///
/// **retry_after** is honest: Exim's closed form `P·ln(r_now/L)` ignores the retried request's
/// own contribution and comes out early, so it is only the starting point of a Newton solve of
/// `(1 − e^{−i})·c/i + e^{−i}·r = L` (the left side is convex and decreasing in `i`, so Newton
/// from the left never overshoots), and the result is checked against the real step.
///
/// [`Decision::rate`] is `r_now` in cost units per second.
///
/// # Examples
///
/// ```
/// use hotlimit::algo::{Algorithm, Exponential};
/// use std::time::Duration;
///
/// let e = Exponential::new(10.0, Duration::from_secs(60))?;
/// let mut s = e.fresh();
/// let mut allowed = 0;
/// for _ in 0..20 {
///     allowed += e.update(&mut s, 0, 3).is_allowed() as u32;
/// }
/// assert_eq!(allowed, 3); // ⌊10 / 3⌋
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exponential {
    limit: f64,
    period_ns: u64,
    policy: Policy,
}

impl Exponential {
    /// `limit` cost units per `period`; the limit must be finite and at least 1 (a smaller one
    /// could never admit a request of cost 1).
    pub fn new(limit: f64, period: Duration) -> Result<Self, ConfigError> {
        let value = || format!("{limit}");
        if limit.is_nan() || limit.is_infinite() {
            return Err(ConfigError::NotFinite {
                field: Field::Limit,
                value: value(),
            });
        }
        if limit < 0.0 {
            return Err(ConfigError::Negative {
                field: Field::Limit,
                value: value(),
            });
        }
        if limit == 0.0 {
            return Err(ConfigError::Zero {
                field: Field::Limit,
                value: value(),
            });
        }
        if limit < 1.0 {
            return Err(ConfigError::TooSmall {
                field: Field::Limit,
                value: value(),
                min: "1 (a request costs at least 1)",
            });
        }
        let period_ns = match u64::try_from(period.as_nanos()) {
            Ok(0) => {
                return Err(ConfigError::Zero {
                    field: Field::Period,
                    value: "0s".into(),
                })
            }
            Ok(ns) => ns,
            Err(_) => {
                return Err(ConfigError::TooLarge {
                    field: Field::Period,
                    value: format!("{period:?}"),
                    max: "u64::MAX nanoseconds (about 584 years)",
                })
            }
        };
        Ok(Self {
            limit,
            period_ns,
            policy: Policy::Leaky,
        })
    }

    /// Sets the policy.
    pub fn with_policy(self, policy: Policy) -> Self {
        Self { policy, ..self }
    }

    /// The limit L, cost units per period.
    pub fn limit(&self) -> f64 {
        self.limit
    }

    /// The period P.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    /// Packs `(t_prev, r)` into the state word.
    #[inline]
    pub(crate) fn pack(t_prev: u64, rate: f64) -> u128 {
        ((t_prev as u128) << 64) | rate.to_bits() as u128
    }

    /// Unpacks the state word into `(t_prev, r)`.
    #[inline]
    pub(crate) fn unpack(word: u128) -> (u64, f64) {
        ((word >> 64) as u64, f64::from_bits(word as u64))
    }

    /// `(1 − e^{−i})·c/i + e^{−i}·r`, the smoothed rate after an interval of `i` periods.
    #[inline]
    fn smoothed(i: f64, cost: f64, r_prev: f64) -> f64 {
        // −expm1(−i) keeps 1 − e^{−i} exact for the tiny intervals of a burst, where 1 − α
        // would cancel to a few digits. No mul_add: without FMA hardware it is a slow libm call
        // and the sum has no cancellation to protect.
        let one_minus_alpha = -(-i).exp_m1();
        one_minus_alpha * cost / i + (-i).exp() * r_prev
    }

    #[inline]
    pub(crate) fn r_now(&self, t_prev: u64, r_prev: f64, now: u64, cost: f64) -> f64 {
        Self::smoothed(self.interval(t_prev, now), cost, r_prev).max(cost)
    }

    /// Periods from `t_prev` to `now`, at least [`MIN_INTERVAL`].
    #[inline]
    fn interval(&self, t_prev: u64, now: u64) -> f64 {
        (now.saturating_sub(t_prev) as f64 / self.period_ns as f64).max(MIN_INTERVAL)
    }

    /// `e^{−i}·r_prev`: what is left at `now` of an average `r_prev` taken at `t_prev`, the
    /// part of [`r_now`](Self::r_now) that is not the new request's (the hybrid limiter's
    /// merged states count each instance's increments).
    #[cfg(feature = "redis")]
    #[inline]
    pub(crate) fn decayed(&self, t_prev: u64, r_prev: f64, now: u64) -> f64 {
        (-self.interval(t_prev, now)).exp() * r_prev
    }

    /// The honest wait before a request of `cost` is allowed for a key in state
    /// `(t_prev, r_prev)` that just saw `r_now > L` at `now`.
    fn retry_after(&self, t_prev: u64, r_prev: f64, now: u64, cost: f64, r_now: f64) -> u64 {
        let p = self.period_ns as f64;
        let i0 = (now.saturating_sub(t_prev) as f64 / p).max(MIN_INTERVAL);
        let g = |i: f64| Self::smoothed(i, cost, r_prev) - self.limit;
        // Exim's estimate ignores the retried request itself, so it is early (g > 0) and a
        // valid left starting point; if rounding made it late, start from i0 instead.
        let exim = i0 + (r_now / self.limit).ln();
        let mut i = if exim.is_finite() && exim > i0 && g(exim) > 0.0 {
            exim
        } else {
            i0
        };
        for _ in 0..64 {
            let e = (-i).exp();
            let slope = cost * (i * e + (-i).exp_m1()) / (i * i) - e * r_prev;
            let next = i - g(i) / slope;
            if !(next.is_finite() && next > i) {
                break;
            }
            let done = next - i <= i * 1e-15;
            i = next;
            if done {
                break;
            }
        }
        let guess = i * p - now.saturating_sub(t_prev) as f64;
        honest_wait(guess, |w| {
            self.r_now(t_prev, r_prev, now.saturating_add(w), cost) <= self.limit
        })
    }
}

impl Exponential {
    /// The step by value: the decision and the new word (`None`: unchanged).
    pub(crate) fn decide(&self, word: u128, now: u64, cost: u64) -> Step<u128> {
        let now = clamp(now);
        let (t_prev, r_prev) = Self::unpack(word);
        let c = cost as f64;
        let r_now = self.r_now(t_prev, r_prev, now, c);
        let per_sec = r_now * NANOS_PER_SEC / self.period_ns as f64;
        // Never move the stored time backwards on a clock read that went backwards.
        let stored = Self::pack(now.max(t_prev), r_now);
        if r_now <= self.limit {
            return Step {
                decision: Decision::allowed().with_rate(per_sec),
                state: Some(stored),
            };
        }
        let wait = match self.policy {
            Policy::Leaky => self.retry_after(t_prev, r_prev, now, c, r_now),
            Policy::Strict => {
                let t = now.max(t_prev);
                let r_next = self.r_now(t, r_now, now, c);
                self.retry_after(t, r_now, now, c, r_next)
            }
        };
        Step {
            decision: Decision::denied_ns(wait).with_rate(per_sec),
            state: (self.policy == Policy::Strict).then_some(stored),
        }
    }
}

impl Algorithm for Exponential {
    /// The exponential limiter's state is a smoothed rate per period, valid under any limit: it
    /// is kept as is.
    fn check_quota(&self, new: &Self) -> Result<(), ConfigError> {
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

    type State = u128;

    #[inline]
    fn fresh(&self) -> u128 {
        // t = 0, r = 0.0: the first request sees r_now = max(≤ c, c) = c, as Exim's new key.
        0
    }

    #[inline]
    fn capacity(&self) -> u64 {
        // r_now ≥ cost, so a cost above L is never allowed. `as` saturates.
        self.limit.floor() as u64
    }

    #[inline]
    fn policy(&self) -> Policy {
        self.policy
    }

    #[inline]
    fn update(&self, state: &mut u128, now: u64, cost: u64) -> Decision {
        store(state, self.decide(*state, now, cost))
    }

    /// Exim's decision, stored as a whole impulse: the average decayed to `now` plus `cost`
    /// (`e^{−i}·r + cost`), at least what [`update`](Algorithm::update) stores, whose
    /// smoothing adds only `(1 − e^{−i})·cost/i` for a request `i` periods after the last.
    /// So a settle's refund, an impulse of `charged − actual`, takes back no more than the
    /// take added: refunding the full cost of a smoothed charge lowered the average below
    /// where it was before the take (a take and a settle of 0 a period after a burst let the
    /// next burst through whole: 1.26× the limit over a run). A denied take stores what
    /// `update` does: its ticket never settles.
    fn take(&self, word: &mut u128, now: u64, cost: u64) -> Decision {
        let before = *word;
        let (t_prev, r_prev) = Self::unpack(before);
        let decision = self.update(word, now, cost);
        if decision.is_allowed() {
            let t = clamp(now).max(t_prev);
            // An idle key is a fresh one (`idle_at`): what is left of its average is dropped,
            // as a sweep would drop the key.
            let left = if t >= self.idle_at(&before) {
                0.0
            } else {
                (-((t - t_prev) as f64) / self.period_ns as f64).exp() * r_prev
            };
            let impulse = left + cost as f64;
            *word = Self::pack(t, impulse.max(Self::unpack(*word).1));
        }
        decision
    }

    /// A take stores its cost as an impulse at its instant ([`take`](Algorithm::take)), so
    /// the difference is an impulse of `actual − charged` at `taken_at`, decayed to the
    /// state's time and added to `r` (floored at zero). Exact while no later request's
    /// `max(·, cost)` floor hid part of the take's impulse; one that did (a lone request
    /// about a period after the take) keeps part of the refund from being matched by a
    /// charge, by at most `e^{−i}` of it: 0.15% over the limit at worst in a search of
    /// such sequences.
    fn settle(&self, word: &mut u128, _now: u64, taken_at: u64, charged: u64, actual: u64) {
        if actual == charged {
            return;
        }
        let (t_prev, r) = Self::unpack(*word);
        let decay =
            (-(t_prev.saturating_sub(clamp(taken_at)) as f64 / self.period_ns as f64)).exp();
        let impulse = actual.abs_diff(charged) as f64 * decay;
        let r = if actual > charged {
            r + impulse
        } else {
            (r - impulse).max(0.0)
        };
        *word = Self::pack(t_prev, r);
    }

    /// Idle once the next request of any cost sees `r_now = cost`, exactly as a fresh key
    /// does: with `i ≥ 2` periods elapsed, `(1 − e^{−i})/i ≤ 0.44`, so `e^{−i}·r ≤ 0.5` keeps
    /// the smoothed rate below `0.94·cost` (a wide margin over rounding) and `max(·, cost)`
    /// returns `cost`. Both terms only shrink as time goes on, so it stays idle. Exact: no
    /// epsilon, no decision changes.
    fn idle_at(&self, word: &u128) -> u64 {
        let word = *word;
        let (t_prev, r) = Self::unpack(word);
        let periods = (2.0 * r).ln().max(2.0);
        // `as` saturates: a rate too large to decay within u64 nanoseconds is never idle.
        t_prev.saturating_add((periods * self.period_ns as f64).ceil() as u64)
    }
}

impl Debt<u128> for Exponential {
    /// The debt is `(t, q)` in units `u = ⌈P / 2^24⌉` ns: `t` the time of the last request
    /// rounded up, `q = ⌈P·ln r / u⌉ + 1` the log of the rate rounded up (an `i32`, beside `t`
    /// in 96 bits). A later time and a larger rate are each at least as limiting (the next
    /// smoothed rate grows with both), and `τ = t + q`, the time (in units) at which the rate,
    /// decaying, falls to 1, is exact integer arithmetic: joins and ranks lose nothing.
    fn debt(&self, word: &u128, _: usize) -> u128 {
        let (t_prev, r) = Self::unpack(*word);
        if r <= 0.0 {
            return 0;
        }
        let q = if r.is_finite() {
            // `as` saturates; the bounds keep the word non-zero and +∞ for +∞.
            ((self.period_ns as f64 * r.ln() / self.debt_unit() as f64).ceil() as i64)
                .saturating_add(1)
                .clamp(Q_MIN, Q_INFINITE)
        } else {
            Q_INFINITE
        };
        Self::debt_word(t_prev.div_ceil(self.debt_unit()), q)
    }

    /// The later time, and the later `τ` from it: at least as limiting as either, exactly.
    fn debt_join(&self, _: usize, a: u128, b: u128) -> u128 {
        if a == 0 || b == 0 {
            return a.max(b);
        }
        let ((ta, qa), (tb, qb)) = (Self::split_debt(a), Self::split_debt(b));
        let t = ta.max(tb);
        if qa == Q_INFINITE || qb == Q_INFINITE {
            return Self::debt_word(t, Q_INFINITE);
        }
        let tau = (i128::from(ta) + i128::from(qa)).max(i128::from(tb) + i128::from(qb));
        Self::debt_word(t, Self::q_at(tau, t))
    }

    fn debt_lanes(&self, _: usize) -> usize {
        1
    }

    /// `τ` (0 if below): the same for a word and for any word of a later time of that `τ`.
    fn debt_rank(&self, _: usize, _: u128, own: u128) -> [u64; 2] {
        if own == 0 {
            return [0, 0];
        }
        let (t, q) = Self::split_debt(own);
        let tau = (i128::from(t) + i128::from(q)).clamp(0, i128::from(u64::MAX));
        [tau as u64, 0]
    }

    /// At the shared word's time, the `q` of rank `τ`: exactly that rank again.
    fn debt_unrank(&self, _: usize, shared: u128, rank: [u64; 2]) -> u128 {
        if shared == 0 {
            return 0;
        }
        let (t, top) = Self::split_debt(shared);
        Self::debt_word(t, Self::q_at(i128::from(rank[0]), t).min(top))
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> u128 {
        let debt = debt(0);
        if debt == 0 {
            return Self::pack(0, 0.0);
        }
        let (t, q) = Self::split_debt(debt);
        let u = self.debt_unit();
        let r = if q >= Q_INFINITE {
            f64::INFINITY
        } else {
            (q as f64 * u as f64 / self.period_ns as f64).exp()
        };
        Self::pack(t.saturating_mul(u), r)
    }
}

/// The least `q` a debt word keeps (a rate below `e^{−2^31·u/P}`, about `e^{−128}`, is kept
/// as that); its largest, `+∞`.
const Q_MIN: i64 = i32::MIN as i64 + 1;
const Q_INFINITE: i64 = i32::MAX as i64;

impl Exponential {
    /// The unit of a debt word's times: `⌈P / 2^24⌉` ns, so that `q` fits 32 bits.
    fn debt_unit(&self) -> u64 {
        self.period_ns.div_ceil(1 << 24).max(1)
    }

    /// The debt word of `(t, q)` (units).
    fn debt_word(t: u64, q: i64) -> u128 {
        (u128::from(t) << 32) | u128::from((q - i64::from(i32::MIN)) as u32)
    }

    /// A debt word's `(t, q)` (units).
    fn split_debt(debt: u128) -> (u64, i64) {
        (
            (debt >> 32) as u64,
            i64::from(debt as u32) + i64::from(i32::MIN),
        )
    }

    /// The `q` of `τ` at time `t`, raised to the least kept.
    fn q_at(tau: i128, t: u64) -> i64 {
        (tau - i128::from(t)).clamp(i128::from(Q_MIN), i128::from(Q_INFINITE)) as i64
    }
}
