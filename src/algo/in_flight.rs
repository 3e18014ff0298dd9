//! In-flight (concurrency) limits: at most `max` units of requests running at once per key,
//! each released when its request ends, or by its lease if it is never released.

use super::{clamp, Algorithm, Debt};
use crate::clock::duration_to_nanos;
use crate::decision::{Decision, Policy};
use crate::error::{ConfigError, Field};
use std::time::Duration;

/// In flight: at most `max` units (permits) held at once per key, not per period. A request
/// takes its cost in permits ([`Request::take`](crate::Request::take), or a
/// [`Permit`](crate::Permit), which gives them back when dropped) and gives them back when
/// its ticket is settled with the permits it still holds: **`settle(ticket, 0)` releases
/// them all**, the crate's settle read for permits (unused units come back; an `actual`
/// above the charge holds the difference too, up to `max`). A rate says nothing about a
/// request that runs for two minutes; this does ("at most 4 generations in flight per API
/// key").
///
/// **Leases.** A permit never released (a leaked guard, a crashed process's over Redis) must
/// not hold its key forever, and a key evicted while it holds permits keeps them as a debt
/// (the debt table) that must end. So every permit is also a lease: time is cut into epochs
/// of half the `lease`, and a permit taken in epoch `e` counts until epoch `e + 2` begins: if
/// it was not released before, it expires between half a lease and a lease after it was
/// taken. A release after that frees nothing (its permits already went back by themselves).
/// Pick a lease at least twice as long as any request runs: a request still running when its
/// permit expires no longer holds it.
///
/// **State**: one `u64`, the epoch in the high 32 bits, the permits taken in the previous
/// epoch and in this one in two 16-bit counts. So `max` is at most 65,535 and the lease at
/// least 10 s (epochs of 5 s: the epoch of the clock's last nanosecond,
/// [`CLOCK_MAX`](super::CLOCK_MAX), then fits 32 bits, so no epoch ever wraps).
///
/// A denial holds nothing (the policy is always [`Policy::Leaky`]); its `retry_after` is the
/// time until enough permits expire by their leases, a bound: a release frees them sooner.
/// `remaining` is the permits free after the request; `reset_after` the time until every
/// permit held would have expired.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::InFlight, CasLimiter, ManualClock, Permit};
/// use std::time::Duration;
///
/// let limiter = CasLimiter::<String, _, _>::with_clock(
///     InFlight::new(2, Duration::from_secs(600))?,
///     ManualClock::default(),
/// );
/// let first = Permit::acquire(&limiter, "api-key-7", 1)?;
/// let second = Permit::acquire(&limiter, "api-key-7", 1)?;
/// assert!(first.decision().is_allowed() && second.decision().is_allowed());
/// // Two generations running: a third waits for one to end.
/// assert!(Permit::acquire(&limiter, "api-key-7", 1)?.decision().is_denied());
/// drop(first); // its response ended
/// assert!(Permit::acquire(&limiter, "api-key-7", 1)?.decision().is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    max: u64,
    /// Half the lease: a permit counts in its epoch and the next.
    epoch_ns: u64,
}

/// The shortest lease: from epochs of half of it on, the epoch of
/// [`CLOCK_MAX`](super::CLOCK_MAX) fits 32 bits.
const MIN_LEASE: Duration = Duration::from_secs(10);

/// The most permits a key can hold: a 16-bit count.
const MAX_PERMITS: u64 = u16::MAX as u64;

impl InFlight {
    /// At most `max` permits held at once per key, each a lease of `lease` at most (see the
    /// type's docs): `max` from 1 to 65,535, `lease` from 10 s.
    pub fn new(max: u64, lease: Duration) -> Result<Self, ConfigError> {
        if max == 0 {
            return Err(ConfigError::Zero {
                field: Field::Limit,
                value: "0".into(),
            });
        }
        if max > MAX_PERMITS {
            return Err(ConfigError::TooLarge {
                field: Field::Limit,
                value: max.to_string(),
                max: "65535 permits (a 16-bit count)",
            });
        }
        if lease < MIN_LEASE {
            return Err(ConfigError::TooSmall {
                field: Field::Lease,
                value: format!("{lease:?}"),
                min: "10s (an epoch of the clock's range, half a lease, must fit 32 bits)",
            });
        }
        Ok(Self {
            max,
            epoch_ns: duration_to_nanos(lease) / 2,
        })
    }

    /// The lease: a permit never given back expires between half of it and all of it after
    /// it was taken.
    pub fn lease(&self) -> Duration {
        Duration::from_nanos(2 * self.epoch_ns)
    }

    /// Half the lease: an epoch (the Redis script's parameter).
    #[cfg(feature = "redis")]
    pub(crate) fn epoch_ns(&self) -> u64 {
        self.epoch_ns
    }

    /// The epoch of `now`. Below 2^32 − 1 for every `now` up to `CLOCK_MAX`, by the lease's
    /// floor, so a word's epoch never wraps and the word is never all ones.
    #[inline]
    pub(crate) fn epoch(&self, now: u64) -> u32 {
        (clamp(now) / self.epoch_ns) as u32
    }

    /// The start of epoch `e`, in ns (saturated at the clock's end).
    fn start(&self, e: u64) -> u64 {
        e.saturating_mul(self.epoch_ns)
    }
}

/// A state word's parts: (epoch, permits taken in the previous epoch, in this one).
#[inline]
pub(crate) fn unpack(word: u64) -> (u32, u64, u64) {
    ((word >> 32) as u32, word >> 16 & 0xFFFF, word & 0xFFFF)
}

#[inline]
pub(crate) fn pack(epoch: u32, prev: u64, cur: u64) -> u64 {
    u64::from(epoch) << 32 | prev.min(MAX_PERMITS) << 16 | cur.min(MAX_PERMITS)
}

/// `word` as of epoch `e`: a permit of the epoch before moves to `prev`, older ones have
/// expired. An epoch behind the word's (a clock read behind it) counts as the word's.
#[inline]
pub(crate) fn roll(word: u64, e: u32) -> (u32, u64, u64) {
    let (epoch, prev, cur) = unpack(word);
    match e.saturating_sub(epoch) {
        0 => (epoch, prev, cur),
        1 => (e, cur, 0),
        _ => (e, 0, 0),
    }
}

impl Algorithm for InFlight {
    type State = u64;

    fn fresh(&self) -> u64 {
        0
    }

    fn capacity(&self) -> u64 {
        self.max
    }

    /// Always leaky: a denied request holds no permit.
    fn policy(&self) -> Policy {
        Policy::Leaky
    }

    /// The permits held mean the same under any `max` of the same lease: a plan or a live
    /// switch changes `max`, and a key holding more than a smaller `max` is denied until enough
    /// are released (no switch hands a permit back).
    fn check_quota(&self, new: &Self) -> Result<(), ConfigError> {
        if self.epoch_ns != new.epoch_ns {
            return Err(ConfigError::Unchangeable {
                field: Field::Lease,
                from: format!("{:?}", Duration::from_nanos(2 * self.epoch_ns)),
                to: format!("{:?}", Duration::from_nanos(2 * new.epoch_ns)),
            });
        }
        Ok(())
    }

    #[inline]
    fn update(&self, state: &mut u64, now: u64, cost: u64) -> Decision {
        let (epoch, prev, cur) = roll(*state, self.epoch(now));
        let now = clamp(now);
        let held = prev + cur;
        let end = |epochs: u64| self.start(u64::from(epoch) + epochs).saturating_sub(now);
        if held.saturating_add(cost) <= self.max {
            *state = pack(epoch, prev, cur + cost);
            return Decision::allowed()
                .with_remaining(self.max - held - cost)
                .with_reset_after_ns(end(2));
        }
        // Without a release, `prev` expires when the next epoch begins and `cur` one later.
        let retry = if cur.saturating_add(cost) <= self.max {
            end(1)
        } else {
            end(2)
        };
        Decision::denied_ns(retry.max(1))
            .with_remaining(self.max.saturating_sub(held))
            .with_reset_after_ns(if cur > 0 { end(2) } else { end(1) })
    }

    /// Releases `charged − actual` of the ticket's permits from the epoch they were taken in
    /// (what it lacks from the other live epoch), if they have not expired yet; an `actual`
    /// above the charge holds the difference too, in this epoch (up to `max`).
    #[inline]
    fn settle(&self, state: &mut u64, now: u64, taken_at: u64, charged: u64, actual: u64) {
        let (epoch, mut prev, mut cur) = roll(*state, self.epoch(now));
        if actual < charged {
            let released = charged - actual;
            // From the ticket's epoch's count, and what that lacks from the other live one: a
            // permit can be counted an epoch after its ticket's (taken on a clock read behind
            // the state's epoch, or re-stamped late by the fleet when its offset to Redis'
            // time jumps), and freeing nothing there leaked it to its lease.
            let counts = match epoch.checked_sub(self.epoch(taken_at)) {
                Some(0) => Some((&mut cur, &mut prev)),
                Some(1) => Some((&mut prev, &mut cur)),
                // Expired (or stamped after the state's epoch, which no ticket of this key
                // is): nothing of it is held any more.
                _ => None,
            };
            if let Some((first, second)) = counts {
                let here = released.min(*first);
                *first -= here;
                *second -= (released - here).min(*second);
            }
        } else {
            let more = actual - charged;
            cur = cur
                .saturating_add(more)
                .min(self.max.saturating_sub(prev).max(cur));
        }
        *state = if prev + cur == 0 {
            0
        } else {
            pack(epoch, prev, cur)
        };
    }

    /// Fresh once every permit held has expired: the end of the epoch after its own if it
    /// took any in its epoch, else the end of its own.
    fn idle_at(&self, state: &u64) -> u64 {
        let (epoch, prev, cur) = unpack(*state);
        let epoch = u64::from(epoch);
        if cur > 0 {
            self.start(epoch + 2)
        } else if prev > 0 {
            self.start(epoch + 1)
        } else {
            0
        }
    }
}

impl Debt<u64> for InFlight {
    /// The debt is the state word: restored exactly.
    fn debt(&self, state: &u64, _: usize) -> u128 {
        if self.idle_at(state) == 0 {
            0
        } else {
            u128::from(*state)
        }
    }

    /// Both words as of the later epoch, each count the larger of the two: every permit
    /// either holds is held, and expires no sooner.
    fn debt_join(&self, _: usize, a: u128, b: u128) -> u128 {
        let (a, b) = (a as u64, b as u64);
        let e = unpack(a).0.max(unpack(b).0);
        let ((_, pa, ca), (_, pb, cb)) = (roll(a, e), roll(b, e));
        u128::from(pack(e, pa.max(pb), ca.max(cb)))
    }

    fn debt_paid_at(&self, _: usize, debt: u128) -> u64 {
        self.idle_at(&(debt as u64))
    }

    fn restore(&self, debt: &dyn Fn(usize) -> u128) -> u64 {
        debt(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn f(max: u64) -> InFlight {
        InFlight::new(max, Duration::from_secs(20)).unwrap()
    }

    #[test]
    fn configs_out_of_range_are_refused() {
        assert!(matches!(
            InFlight::new(0, Duration::from_secs(20)),
            Err(ConfigError::Zero { .. })
        ));
        assert!(matches!(
            InFlight::new(65_536, Duration::from_secs(20)),
            Err(ConfigError::TooLarge { .. })
        ));
        assert!(matches!(
            InFlight::new(1, Duration::from_millis(9_999)),
            Err(ConfigError::TooSmall {
                field: Field::Lease,
                ..
            })
        ));
        // The largest config: the last nanosecond's epoch leaves the word below all ones.
        let g = InFlight::new(65_535, Duration::from_secs(10)).unwrap();
        let mut w = g.fresh();
        assert!(g.update(&mut w, u64::MAX, 65_535).is_allowed());
        assert_ne!(w, u64::MAX);
    }

    #[test]
    fn holds_max_and_a_release_frees_one() {
        let g = f(2);
        let mut w = g.fresh();
        assert_eq!(g.update(&mut w, S, 1).remaining(), Some(1));
        assert!(g.update(&mut w, S, 1).is_allowed());
        let denied = g.update(&mut w, S, 1);
        assert!(denied.is_denied());
        // Both were taken in epoch 0 (0–10 s): they expire when epoch 2 begins, at 20 s.
        assert_eq!(denied.retry_after(), Duration::from_secs(19));
        g.settle(&mut w, 2 * S, S, 1, 0);
        assert!(g.update(&mut w, 2 * S, 1).is_allowed());
        assert!(g.update(&mut w, 2 * S, 1).is_denied());
    }

    #[test]
    fn a_leaked_permit_expires_in_one_to_two_leases() {
        let g = f(1);
        let mut w = g.fresh();
        assert!(g.update(&mut w, 9 * S, 1).is_allowed()); // epoch 0
        assert!(g.update(&mut w, 10 * S, 1).is_denied()); // epoch 1: still held
        assert_eq!(g.idle_at(&w), 20 * S);
        assert!(g.update(&mut w, 20 * S, 1).is_allowed()); // epoch 2: expired
    }

    #[test]
    fn a_release_after_expiry_frees_nothing_newer() {
        let g = f(1);
        let mut w = g.fresh();
        assert!(g.update(&mut w, S, 1).is_allowed()); // old, epoch 0
        assert!(g.update(&mut w, 25 * S, 1).is_allowed()); // new, epoch 2
        g.settle(&mut w, 26 * S, S, 1, 0); // the old one's late release
        assert!(g.update(&mut w, 26 * S, 1).is_denied());
        // A release in the next epoch frees it from `prev`.
        g.settle(&mut w, 31 * S, 25 * S, 1, 0);
        assert!(g.update(&mut w, 31 * S, 1).is_allowed());
    }

    #[test]
    fn a_permit_counted_after_its_tickets_epoch_is_still_released() {
        let g = f(2);
        let mut w = g.fresh();
        // Epoch 1, then a clock read behind it: counted in epoch 1, its ticket says epoch 0.
        assert!(g.update(&mut w, 10 * S, 1).is_allowed());
        assert!(g.update(&mut w, 9 * S, 1).is_allowed());
        assert_eq!(unpack(w), (1, 0, 2));
        g.settle(&mut w, 11 * S, 9 * S, 1, 0);
        assert_eq!(unpack(w), (1, 0, 1));
        // Its own epoch's count goes first: the other's stays as it was.
        assert!(g.update(&mut w, 21 * S, 1).is_allowed()); // epoch 2: (2, 1, 1)
        g.settle(&mut w, 21 * S, 21 * S, 1, 0);
        assert_eq!(unpack(w), (2, 1, 0));
        // An expired ticket still frees nothing.
        g.settle(&mut w, 21 * S, 9 * S, 1, 0);
        assert_eq!(unpack(w), (2, 1, 0));
    }

    #[test]
    fn a_released_key_is_fresh_and_owes_nothing() {
        let g = f(3);
        let mut w = g.fresh();
        assert!(g.update(&mut w, 12 * S, 2).is_allowed());
        assert_eq!(g.debt(&w, 0), u128::from(w));
        g.settle(&mut w, 13 * S, 12 * S, 2, 0);
        assert_eq!((w, g.idle_at(&w), g.debt(&w, 0)), (0, 0, 0));
    }

    #[test]
    fn a_joined_debt_holds_what_either_holds() {
        let g = f(4);
        let (mut a, mut b) = (g.fresh(), g.fresh());
        assert!(g.update(&mut a, S, 3).is_allowed()); // epoch 0
        assert!(g.update(&mut b, 11 * S, 1).is_allowed()); // epoch 1
        let j = g.restore(&|_| g.debt_join(0, g.debt(&a, 0), g.debt(&b, 0)));
        assert_eq!(unpack(j), (1, 3, 1));
        assert_eq!(g.debt_paid_at(0, u128::from(j)), 30 * S);
        // Joined either way round.
        let k = g.restore(&|_| g.debt_join(0, g.debt(&b, 0), g.debt(&a, 0)));
        assert_eq!(j, k);
    }

    #[test]
    fn an_overrun_holds_more_up_to_max() {
        let g = f(3);
        let mut w = g.fresh();
        assert!(g.update(&mut w, S, 1).is_allowed());
        g.settle(&mut w, S, S, 1, 10);
        assert_eq!(unpack(w), (0, 0, 3));
        assert!(g.update(&mut w, S, 1).is_denied());
        g.settle(&mut w, S, S, 3, 1); // two of three released
        assert_eq!(unpack(w), (0, 0, 1));
    }

    #[test]
    fn a_smaller_max_gives_nothing_back() {
        let (big, small) = (f(4), f(1));
        assert!(big.check_quota(&small).is_ok());
        let mut w = big.fresh();
        assert!(big.update(&mut w, S, 3).is_allowed());
        assert!(small.update(&mut w, S, 1).is_denied());
        let other = InFlight::new(4, Duration::from_secs(30)).unwrap();
        assert!(matches!(
            big.check_quota(&other),
            Err(ConfigError::Unchangeable {
                field: Field::Lease,
                ..
            })
        ));
    }
}
