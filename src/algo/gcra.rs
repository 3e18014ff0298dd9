//! GCRA, the generic cell rate algorithm, with its token-bucket and leaky-bucket views.

use super::{clamp, store, Algorithm, Debt, Step, CLOCK_MAX};
use crate::config::{parse_quota, Rate};
use crate::decision::{Decision, Policy};
use crate::error::{ConfigError, Field};
use std::str::FromStr;
use std::time::Duration;

/// GCRA: `rate` = `n` per `period`, burst `B` (default `n`); emission interval `T = period / n`.
///
/// State: one `u64`, the theoretical arrival time `tat` in nanoseconds (fresh key: 0).
/// * `tat' = max(tat, now) + cost·T`
/// * allowed iff `tat' − now ≤ B·T`; then `tat'` is stored and
///   `remaining = ⌊(B·T − (tat' − now)) / T⌋`, `reset_after = tat' − now`.
/// * denied: `retry_after = tat' − B·T − now`; under [`Policy::Strict`] `tat'` is stored
///   anyway, so the honest wait is one `cost·T` longer.
///
/// A token bucket of capacity `B` refilled at `rate` is the same state seen as
/// `tokens = (B·T − (tat − now)) / T` (a decision's `remaining`); so is a leaky bucket used as a
/// meter. Default policy: leaky. All arithmetic is in integer nanoseconds and saturates.
///
/// `T` is rounded to the nearest nanosecond (`3/s` gives `T` = 333,333,333 ns). `B·T` may be
/// at most 2^63 ns (292 years), so that a full burst plus any admissible cost fits a `u64`
/// and the test `tat' − now ≤ B·T` is exact: a slower rate or a larger burst is a
/// [`ConfigError`], never a saturated limiter. A request whose `tat'` would pass
/// [`CLOCK_MAX`] is denied with a `retry_after` of `u64::MAX` ns (no wait admits it).
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::{Algorithm, Gcra}, Policy, Rate};
/// use std::time::Duration;
///
/// let gcra = Gcra::new(Rate::new(10.0, Duration::from_secs(1))?)?.with_burst(5)?;
/// assert_eq!(gcra.emission_interval(), Duration::from_millis(100));
/// assert_eq!(gcra, "10/s burst 5".parse()?);
/// assert_eq!(gcra.policy(), Policy::Leaky);
/// # Ok::<(), hotlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    /// Emission interval T, ns.
    t: u64,
    /// Burst tolerance B·T, ns.
    tau: u64,
    burst: u64,
    policy: Policy,
}

/// The largest burst tolerance `B·T`: a full burst plus a request of any admissible cost
/// (`cost·T ≤ B·T`) then stays within `u64` nanoseconds, so the conformance test is exact.
const MAX_TOLERANCE: u64 = CLOCK_MAX / 2;

/// The outcome of [`Gcra::reserve`]: admit now with a delay (pacing) or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reservation {
    /// Admitted and counted: the caller should wait `delay` before acting.
    Admitted {
        /// How long to wait before acting (zero if the request conforms now).
        delay: Duration,
    },
    /// The delay would exceed the maximum wait; nothing was counted.
    Denied {
        /// How long until the same reservation would be admitted within the maximum wait.
        retry_after: Duration,
    },
}

impl Gcra {
    /// GCRA at `rate`, with the burst defaulting to the rate's count (at least 1) and the
    /// leaky policy.
    ///
    /// Fails if the emission interval rounds to 0 ns (more than one event per nanosecond).
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        let t = (rate.period_nanos() as f64 / rate.count()).round();
        if t < 1.0 {
            return Err(ConfigError::TooLarge {
                field: Field::Rate,
                value: rate.to_string(),
                max: "one event per nanosecond",
            });
        }
        if t > MAX_TOLERANCE as f64 {
            return Err(ConfigError::TooSmall {
                field: Field::Rate,
                value: rate.to_string(),
                min: "one event per 2^63 ns (292 years)",
            });
        }
        let t = t as u64;
        // `as` saturates huge counts; with_burst then rejects the overflowing B·T.
        let burst = (rate.count().floor() as u64).max(1);
        Self {
            t,
            tau: t,
            burst: 1,
            policy: Policy::Leaky,
        }
        .with_burst(burst)
    }

    /// Sets the burst: the largest cost admitted at one instant by a fresh key.
    pub fn with_burst(self, burst: u64) -> Result<Self, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::Zero {
                field: Field::Burst,
                value: "0".into(),
            });
        }
        let tau = burst
            .checked_mul(self.t)
            .filter(|&tau| tau <= MAX_TOLERANCE)
            .ok_or_else(|| ConfigError::TooLarge {
                field: Field::Burst,
                value: burst.to_string(),
                max: "burst × emission interval within 2^63 ns (292 years)",
            })?;
        Ok(Self { tau, burst, ..self })
    }

    /// Sets the policy.
    pub fn with_policy(self, policy: Policy) -> Self {
        Self { policy, ..self }
    }

    /// The emission interval `T`.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.t)
    }

    /// The burst tolerance `B·T`, ns.
    #[cfg(feature = "redis")]
    #[inline]
    pub(crate) fn tolerance(&self) -> u64 {
        self.tau
    }

    /// Pacing: admits a request of `cost` now if it would conform within `max_wait_ns`,
    /// returning the delay the caller should wait; otherwise counts nothing.
    ///
    /// Returns the outcome and the new state (`None`: unchanged).
    ///
    /// ```
    /// use hotlimit::algo::{Algorithm, Gcra, Reservation};
    /// use std::time::Duration;
    ///
    /// let g: Gcra = "10/s burst 1".parse()?;
    /// let (r, tat) = g.reserve(g.fresh(), 0, 1, 0);
    /// assert_eq!(r, Reservation::Admitted { delay: Duration::ZERO });
    /// let (r, tat) = g.reserve(tat.unwrap(), 0, 1, 150_000_000);
    /// assert_eq!(r, Reservation::Admitted { delay: Duration::from_millis(100) });
    /// let (r, _) = g.reserve(tat.unwrap(), 0, 1, 150_000_000);
    /// assert_eq!(r, Reservation::Denied { retry_after: Duration::from_millis(50) });
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn reserve(
        &self,
        tat: u64,
        now: u64,
        cost: u64,
        max_wait_ns: u64,
    ) -> (Reservation, Option<u64>) {
        let Ahead { ahead, new_tat, .. } = self.ahead(tat, clamp(now), cost);
        let delay = ahead.saturating_sub(self.tau);
        match new_tat {
            Some(new_tat) if delay <= max_wait_ns => {
                let delay = Duration::from_nanos(delay);
                (Reservation::Admitted { delay }, Some(new_tat))
            }
            _ => {
                let retry_after = match new_tat {
                    Some(_) => Duration::from_nanos(delay - max_wait_ns),
                    None => NEVER,
                };
                (Reservation::Denied { retry_after }, None)
            }
        }
    }
}

/// The wait reported when no wait helps: the request would conform only past the end of
/// the clock's range ([`CLOCK_MAX`]).
const NEVER: Duration = Duration::from_nanos(u64::MAX);

impl FromStr for Gcra {
    type Err = ConfigError;

    /// Parses `<rate> [burst <n>]`: `10/s`, `600/h`, `10/min burst 20`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let (rate, burst) = parse_quota(s)?;
        let gcra = Self::new(rate)?;
        match burst {
            Some(b) => gcra.with_burst(b),
            None => Ok(gcra),
        }
    }
}

/// Where a request would put a key's tat ([`Gcra::ahead`]).
struct Ahead {
    /// `max(tat, now)`: where the request's increment starts.
    base: u64,
    /// `cost · T`, saturating.
    increment: u64,
    /// The new tat, `base + increment`, if the clock can show it: a tat past [`CLOCK_MAX`] is
    /// `None` (saturating it instead would shorten `ahead` and admit everything near the end
    /// of the clock's range).
    new_tat: Option<u64>,
    /// How far the new tat is ahead of `now`: exact up to `u64::MAX` ns (far beyond τ: a
    /// strict key's debt, or a cost no burst admits), where it saturates and denies all the
    /// same.
    ahead: u64,
}

impl Gcra {
    /// Where a request of `cost` at `now` (clamped) would put the key's tat: see [`Ahead`].
    /// The one computation `decide` and `reserve` share.
    #[inline(always)]
    fn ahead(&self, tat: u64, now: u64, cost: u64) -> Ahead {
        let increment = cost.saturating_mul(self.t);
        // A stored tat ahead of `now` also covers a clock read that went backwards.
        let base = tat.max(now);
        // Summed from `base` directly: the CAS waits on this sum and nothing else. Without
        // overflow, `ahead` is that sum less `now` (no second sum for the admission's test).
        let (sum, overflow) = base.overflowing_add(increment);
        Ahead {
            base,
            increment,
            new_tat: (!overflow && sum <= CLOCK_MAX).then_some(sum),
            ahead: if overflow {
                (base - now).saturating_add(increment)
            } else {
                sum - now
            },
        }
    }

    /// The step by value: the decision and the new word (`None`: unchanged).
    #[inline]
    pub(crate) fn decide(&self, tat: u64, now: u64, cost: u64) -> Step<u64> {
        let now = clamp(now);
        let Ahead {
            base,
            increment,
            new_tat,
            ahead,
        } = self.ahead(tat, now, cost);
        if let Some(new_tat) = new_tat.filter(|_| ahead <= self.tau) {
            return Step {
                // ahead ≤ τ < 2^63: no sentinel to avoid.
                decision: Decision::allowed_within(self.tau - ahead, self.t, ahead),
                state: Some(new_tat),
            };
        }
        // A retry after the wait would store the tat `new_tat` (leaky) or `new_tat + cost·T`
        // (strict: this request is counted too); past the end of the clock's range no wait
        // admits it, and the wait says so.
        let debt = ahead.saturating_sub(self.tau);
        match self.policy {
            Policy::Leaky => {
                let ahead_now = base - now;
                let wait = if new_tat.is_some() { debt } else { u64::MAX };
                Step {
                    decision: Decision::denied_after(wait)
                        .with_remaining_of(self.tau.saturating_sub(ahead_now), self.t)
                        .with_reset_after_ns(ahead_now),
                    state: None,
                }
            }
            Policy::Strict => {
                let retry_tat = new_tat.and_then(|t| t.checked_add(increment));
                let wait = match retry_tat {
                    Some(t) if t <= CLOCK_MAX => debt.saturating_add(increment),
                    _ => u64::MAX,
                };
                Step {
                    decision: Decision::denied_after(wait)
                        .with_remaining(0)
                        .with_reset_after_ns(ahead),
                    state: Some(new_tat.unwrap_or(CLOCK_MAX)),
                }
            }
        }
    }
}

impl Algorithm for Gcra {
    /// GCRA's state is the time at which the key's spent budget is paid back, and a new quota
    /// keeps that time as it is, even past what the new burst could reach (`now + B·T`): a key
    /// that spent more than a smaller quota holds stays out until it is paid back, so a switch
    /// to a smaller quota and back never hands back budget (clamping it would, by the difference).
    fn check_quota(&self, _: &Self) -> Result<(), ConfigError> {
        Ok(())
    }

    type State = u64;

    #[inline]
    fn fresh(&self) -> u64 {
        0
    }

    #[inline]
    fn capacity(&self) -> u64 {
        self.burst
    }

    #[inline]
    fn policy(&self) -> Policy {
        self.policy
    }

    #[inline]
    fn update(&self, state: &mut u64, now: u64, cost: u64) -> Decision {
        store(state, self.decide(*state, now, cost))
    }

    /// A debt of more than the clock's range in emission intervals could not be paid off.
    #[inline]
    fn settle_limit(&self, charged: u64) -> u64 {
        charged.saturating_add(CLOCK_MAX / self.t)
    }

    /// Refund: `tat` moves back by the unused units, never below `now` (a full bucket holds
    /// no more). Overrun: `tat` moves forward from `max(tat, now)`, past `now + B·T` if need
    /// be: the key is denied until its debt is paid. Saturates at [`CLOCK_MAX`].
    fn settle(&self, tat: &mut u64, now: u64, _taken_at: u64, charged: u64, actual: u64) {
        let now = clamp(now);
        if actual > charged {
            let over = (actual - charged).saturating_mul(self.t);
            *tat = (*tat).max(now).saturating_add(over).min(CLOCK_MAX);
        } else {
            let back = (charged - actual).saturating_mul(self.t);
            *tat -= back.min(tat.saturating_sub(now));
        }
    }

    /// A key is fresh again once its theoretical arrival time has passed: `max(tat, now)` is
    /// then `now`, as for `tat = 0`.
    #[inline]
    fn idle_at(&self, tat: &u64) -> u64 {
        *tat
    }
}

impl Debt<u64> for Gcra {
    /// The debt is `tat` itself: restored exactly, and the later of two is the more limited.
    fn debt(&self, tat: &u64, _: usize) -> u128 {
        u128::from(*tat)
    }

    fn debt_paid_at(&self, _: usize, debt: u128) -> u64 {
        debt.min(u128::from(CLOCK_MAX)) as u64
    }

    fn debt_lanes(&self, _: usize) -> usize {
        1
    }

    fn debt_rank(&self, _: usize, _: u128, own: u128) -> [u64; 2] {
        [own as u64, 0]
    }

    fn debt_unrank(&self, _: usize, _: u128, rank: [u64; 2]) -> u128 {
        u128::from(rank[0])
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> u64 {
        self.debt_paid_at(0, debt(0))
    }
}

// Not under loom: proptest is not built there (Cargo.toml).
#[cfg(all(test, not(hotlimit_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Values near the edges the general path guards (0, the clock's end, overflow) and
    /// anything else.
    fn word() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(CLOCK_MAX),
            Just(u64::MAX),
            Just(MAX_TOLERANCE),
            (0u64..1 << 20).prop_map(|d| CLOCK_MAX - d),
            (0u64..1 << 40),
            any::<u64>(),
        ]
    }

    /// GCRA's step in `u128`, where nothing overflows: the model `decide` must equal. Only
    /// the answer's fields are brought back to `u64` (a wait past `u64::MAX` ns saturates,
    /// a reset of `u64::MAX` is the decision's own "unknown" mapping).
    fn model(g: &Gcra, tat: u64, now: u64, cost: u64) -> Step<u64> {
        let (t, tau, end) = (u128::from(g.t), u128::from(g.tau), u128::from(CLOCK_MAX));
        let to_u64 = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        let now = u128::from(now).min(end);
        let base = u128::from(tat).max(now);
        let increment = u128::from(cost) * t;
        let new_tat = base + increment;
        let ahead = new_tat - now;
        // A tat past the clock's range can never be stored: no wait admits it.
        let in_range = new_tat <= end;
        if in_range && ahead <= tau {
            return Step {
                decision: Decision::allowed()
                    .with_remaining(to_u64((tau - ahead) / t))
                    .with_reset_after_ns(to_u64(ahead)),
                state: Some(to_u64(new_tat)),
            };
        }
        match g.policy {
            Policy::Leaky => {
                let ahead_now = base - now;
                let wait = if in_range {
                    to_u64(ahead - tau)
                } else {
                    u64::MAX
                };
                Step {
                    decision: Decision::denied_ns(wait)
                        .with_remaining(to_u64(tau.saturating_sub(ahead_now) / t))
                        .with_reset_after_ns(to_u64(ahead_now)),
                    state: None,
                }
            }
            Policy::Strict => {
                // Counted: the retry stores one more increment.
                let retry_in_range = in_range && new_tat + increment <= end;
                let wait = if retry_in_range {
                    to_u64(ahead - tau + increment)
                } else {
                    u64::MAX
                };
                Step {
                    decision: Decision::denied_ns(wait)
                        .with_remaining(0)
                        .with_reset_after_ns(to_u64(ahead)),
                    state: Some(to_u64(new_tat.min(end))),
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// `decide` answers and stores exactly what the model does, the ends of the clock's
        /// range and saturating costs included.
        // Pins G6.
        #[test]
        fn decide_equals_the_model(
            t in prop_oneof![Just(1u64), 1u64..1_000_000_000, 1u64..=MAX_TOLERANCE],
            burst in prop_oneof![Just(1u64), 1u64..1000, any::<u64>()],
            strict in any::<bool>(),
            tat in word(),
            now in word(),
            cost in prop_oneof![Just(0u64), Just(1), 1u64..100, word()],
        ) {
            let policy = if strict { Policy::Strict } else { Policy::Leaky };
            let gcra = Gcra { t, tau: t, burst: 1, policy };
            let gcra = gcra.with_burst(burst.min(MAX_TOLERANCE / t).max(1)).expect("within τ");
            let (got, want) = (gcra.decide(tat, now, cost), model(&gcra, tat, now, cost));
            prop_assert_eq!(got.decision, want.decision);
            prop_assert_eq!(got.state, want.state);
        }
    }
}
