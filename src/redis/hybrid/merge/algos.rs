//! How the counting algorithms' states add up across instances ([`Merge`] for the fixed and
//! sliding windows and the in-flight permits): their union, their re-stamping, and what the
//! fallback assumes the others hold. The decaying rates' are in `rates.rs`; the tests of
//! both are here.

use super::super::entry::Pair;
use super::Merge;
use crate::algo::in_flight::{pack, roll, unpack};
use crate::algo::{Algorithm, FixedWindow, InFlight, SlidingWindow};

/// The latest window of length `w` a request stamped in window `index` may fall in once its
/// time is moved by `delta` ns.
fn shifted_index(index: u64, w: u64, delta: i64) -> u64 {
    let last = (i128::from(index) + 1) * i128::from(w) - 1 + i128::from(delta);
    (last.max(0) / i128::from(w)).min(i128::from(u64::MAX >> 1)) as u64
}

/// `t` (ns) moved by `delta`, within `u64`.
pub(super) fn shifted_ns(t: u64, delta: i64) -> u64 {
    (i128::from(t) + i128::from(delta)).clamp(0, i128::from(u64::MAX)) as u64
}

/// The part of the quota the others are assumed to use, in whole units: `limit − ⌊limit·share⌋`.
fn others_part(limit: u64, share: f64) -> u64 {
    limit - ((limit as f64 * share).floor() as u64).min(limit)
}

impl Merge for FixedWindow {
    type Word = u64;
    type Entry = u128;
    /// Window index all ones: beyond what `FixedWindow::new` lets the clock reach.
    const UNKNOWN: u64 = u64::MAX - 1;

    fn horizon(&self) -> u64 {
        self.window().as_nanos() as u64
    }

    fn caps_unheard(&self) -> bool {
        true
    }

    fn unheard(&self, own: u64, heard: u64, now: u64) -> u64 {
        let index = now / self.window().as_nanos() as u64;
        let at = |word| match self.unpack(self.pull_back(word, now)) {
            (i, c) if i >= index => c,
            _ => 0,
        };
        at(own).saturating_sub(at(heard))
    }

    fn pull_back(&self, word: u64, now: u64) -> u64 {
        let (index, count) = self.unpack(word);
        let now_index = now / self.window().as_nanos() as u64;
        if index > now_index {
            self.pack(now_index, count)
        } else {
            word
        }
    }

    fn one_window(&self, a: u64, b: u64) -> bool {
        let w = self.window().as_nanos() as u64;
        a / w == b / w
    }

    fn shift(&self, word: u64, delta: i64) -> u64 {
        match self.unpack(word) {
            (_, 0) => word,
            (index, count) => {
                let index = shifted_index(index, self.window().as_nanos() as u64, delta);
                // Within the word's index field (a shift never reaches past it in practice).
                self.pack(index.min(self.unpack(u64::MAX).0), count)
            }
        }
    }

    fn merge(&self, a: u64, b: u64, now: u64) -> u64 {
        let index = now / self.window().as_nanos() as u64;
        // Now's window: a count of an earlier one is over, one stamped in a later one is
        // counted here ([`pull_back`](Merge::pull_back)).
        let at = |word| match self.unpack(word) {
            (i, c) if i >= index => c,
            _ => 0,
        };
        // Capped where the word's count field ends, not at this quota's limit: the others'
        // states are merged by the limiter's own quota and read by each request's, whose
        // limit may be larger.
        self.pack(index, at(a).saturating_add(at(b)).min(self.count_max()))
    }

    fn count(&self, own: u64, now: u64, cost: u64) -> u64 {
        self.merge(
            own,
            self.pack(now / self.window().as_nanos() as u64, cost),
            now,
        )
    }

    fn degraded(&self, known: u64, now: u64, share: f64) -> u64 {
        let index = now / self.window().as_nanos() as u64;
        let held = match self.unpack(self.pull_back(known, now)) {
            (i, c) if i >= index => c,
            _ => 0,
        };
        let left = self.capacity().saturating_sub(held);
        self.pack(
            index,
            held.saturating_add(others_part(left, share))
                .min(self.count_max()),
        )
    }
}

/// The permits each instance holds, per epoch: the fleet holds their sum. A permit counts in
/// its instance's field until that instance gives it back (the field published again) or its
/// lease ends (the field's epochs roll past it, on every instance's reading, and the field
/// itself expires): a crashed instance's permits come back by their leases.
impl Merge for InFlight {
    type Word = u64;
    type Entry = u128;
    /// Epoch all ones: beyond the clock's range (`InFlight::epoch`).
    const UNKNOWN: u64 = u64::MAX - 1;

    fn horizon(&self) -> u64 {
        self.lease().as_nanos() as u64
    }

    fn pull_back(&self, word: u64, now: u64) -> u64 {
        let (epoch, prev, cur) = unpack(word);
        match self.epoch(now) {
            e if epoch > e => pack(e, prev, cur),
            _ => word,
        }
    }

    fn shift(&self, word: u64, delta: i64) -> u64 {
        match unpack(word) {
            (_, 0, 0) => word,
            (epoch, prev, cur) => {
                let epoch = shifted_index(u64::from(epoch), self.epoch_ns(), delta);
                pack(epoch.min(u64::from(u32::MAX - 1)) as u32, prev, cur)
            }
        }
    }

    /// Each count the sum of both (16 bits at most, where the word's field ends), as of now's
    /// epoch: a permit of an earlier epoch moved to `prev` or expired, one stamped ahead
    /// counted now.
    fn merge(&self, a: u64, b: u64, now: u64) -> u64 {
        let e = self.epoch(now);
        let ((_, pa, ca), (_, pb, cb)) = (
            roll(self.pull_back(a, now), e),
            roll(self.pull_back(b, now), e),
        );
        match (pa + pb, ca + cb) {
            (0, 0) => self.fresh(),
            (prev, cur) => pack(e, prev, cur),
        }
    }

    fn count(&self, own: u64, now: u64, cost: u64) -> u64 {
        self.merge(own, pack(self.epoch(now), 0, cost), now)
    }

    /// What they held when heard, and all of the permits that left but `share` of them, held
    /// now (expiring a lease from now: the latest).
    fn degraded(&self, known: u64, now: u64, share: f64) -> u64 {
        let (e, prev, cur) = roll(self.pull_back(known, now), self.epoch(now));
        let left = self.capacity().saturating_sub(prev + cur);
        pack(e, prev, cur + others_part(left, share))
    }

    /// As pushed: a permit given back on another instance is free here as soon as it is
    /// heard (joined with what was heard before, as the rates are, it would stay held to its
    /// lease). The price: a hash emptied under the fleet (a `FLUSHALL`, Redis restarted
    /// empty) hides the permits the others hold until each publishes again (a permit taken
    /// or given back there).
    fn heard(&self, _known: u64, pushed: u64, _now: u64) -> u64 {
        pushed
    }
}

impl Merge for SlidingWindow {
    type Word = u128;
    type Entry = Pair;
    const UNKNOWN: u128 = u128::MAX;

    fn horizon(&self) -> u64 {
        2 * self.window().as_nanos() as u64
    }

    fn caps_unheard(&self) -> bool {
        true
    }

    fn unheard(&self, own: u128, heard: u128, now: u64) -> u64 {
        // Both seen from now's window: the counts of the two windows it weighs.
        let view = |word| self.view(self.pull_back(word, now), now);
        let (o, h) = (view(own), view(heard));
        o.cur.saturating_sub(h.cur) + o.prev.saturating_sub(h.prev)
    }

    fn pull_back(&self, word: u128, now: u64) -> u128 {
        let (index, prev, cur) = Self::unpack(word);
        let now_index = now / self.window().as_nanos() as u64;
        if index > now_index {
            Self::pack(now_index, prev, cur)
        } else {
            word
        }
    }

    fn one_window(&self, a: u64, b: u64) -> bool {
        let w = self.window().as_nanos() as u64;
        a / w == b / w
    }

    fn shift(&self, word: u128, delta: i64) -> u128 {
        match Self::unpack(word) {
            (_, 0, 0) => word,
            (index, prev, cur) => Self::pack(
                shifted_index(index, self.window().as_nanos() as u64, delta),
                prev,
                cur,
            ),
        }
    }

    fn merge(&self, a: u128, b: u128, now: u64) -> u128 {
        // Both seen from now's window, a state stamped in a later one pulled back to it.
        let view = |word| self.view(self.pull_back(word, now), now);
        let (va, vb) = (view(a), view(b));
        let max = u32::MAX as u64 - 1;
        Self::pack(
            va.index.max(vb.index),
            (va.prev + vb.prev).min(max),
            (va.cur + vb.cur).min(max),
        )
    }

    fn count(&self, own: u128, now: u64, cost: u64) -> u128 {
        let w = self.window().as_nanos() as u64;
        self.merge(own, Self::pack(now / w, 0, cost), now)
    }

    fn degraded(&self, known: u128, now: u64, share: f64) -> u128 {
        let w = self.window().as_nanos() as u64;
        let v = self.view(self.pull_back(known, now), now);
        // The others' weighted count now: the previous window's by what is left of it.
        let elapsed = now.saturating_sub(v.index.saturating_mul(w)).min(w);
        let carried = (u128::from(v.prev) * u128::from(w - elapsed)).div_ceil(u128::from(w));
        let held = (carried as u64).saturating_add(v.cur);
        let left = self.capacity().saturating_sub(held);
        let max = u32::MAX as u64 - 1;
        Self::pack(
            v.index,
            v.prev,
            v.cur.saturating_add(others_part(left, share)).min(max),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Merge;
    use crate::algo::in_flight::unpack;
    use crate::algo::{Algorithm, Earrrl, Exponential, FixedWindow, InFlight, SlidingWindow};
    use crate::redis::hybrid::entry::{Halves, Pair, Seen};
    use crate::redis::hybrid::{Engine, FleetContext, Reason};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    const S: u64 = 1_000_000_000;

    /// Admissions in a row of `algo` with the others heard to be in `others`, a share of
    /// `share`, no push coming back meanwhile: each admitted request's units counted
    /// unheard, as the cell counts them. Returns them and the first refusal's reason.
    fn in_a_row<A>(algo: A, others: A::Word, share: f64) -> (u64, Option<Reason>)
    where
        A: Merge + Algorithm<State = <A as Merge>::Word>,
    {
        let ctx = FleetContext::new(5_000_000, share, 0, 0);
        ctx.mirror_since.store(0, Ordering::Relaxed);
        let mut w = A::Entry::join(algo.fresh(), others);
        let mut seen = Seen::default();
        for n in 0..200 {
            let v = algo.decide_entry(&share, &ctx, &mut w, seen, S + n, 1, false);
            if !v.decision.is_allowed() {
                assert!(
                    v.urgent || v.reason != Reason::Waiting,
                    "sent at once: {v:?}"
                );
                return (n, Some(v.reason));
            }
            seen.unheard += v.unheard;
        }
        (200, None)
    }

    /// A window's admissions that the others have not heard of are held to this instance's
    /// share of what is left: with another instance heard to hold 10 of 100, a quarter's
    /// share admits 18 in a row (the 19th would leave 19 unheard, above ⌈72/4⌉), then waits
    /// for its push to come back; a key no other instance is heard to hold anything of, or
    /// under `Fallback::DENY`, is not held back. A push that holds this instance's count
    /// says how much of it is still unheard: the count beyond it, in now's window.
    // Pins G48.
    #[test]
    fn what_the_others_have_not_heard_of_is_held_to_a_share_of_what_is_left() {
        let fixed = FixedWindow::new(100, Duration::from_secs(60)).unwrap();
        let ten = fixed.pack(0, 10);
        assert_eq!(in_a_row(fixed, ten, 0.25), (18, Some(Reason::Waiting)));
        assert_eq!(
            in_a_row(fixed, fixed.pack(0, 0), 0.25),
            (100, Some(Reason::Known))
        );
        assert_eq!(in_a_row(fixed, ten, 0.0), (90, Some(Reason::Known)));
        assert_eq!(fixed.unheard(fixed.pack(0, 25), fixed.pack(0, 20), S), 5);
        assert_eq!(
            fixed.unheard(fixed.pack(1, 3), fixed.pack(0, 20), 61 * S),
            3
        );
        assert_eq!(fixed.unheard(fixed.pack(0, 20), fixed.pack(0, 25), S), 0);
        let sliding = SlidingWindow::new(100, Duration::from_secs(60)).unwrap();
        let (own, heard) = (SlidingWindow::pack(1, 7, 30), SlidingWindow::pack(1, 7, 21));
        assert_eq!(sliding.unheard(own, heard, 61 * S), 9);
        // A window on: what was current is the previous window's, heard or not.
        let heard = SlidingWindow::pack(0, 0, 7);
        assert_eq!(sliding.unheard(own, heard, 61 * S), 30);
        // A push says what is unheard: the count beyond this instance's field, all of it
        // without one (a hash flushed), none of a state gone idle (else a count left from
        // an outage, never published again, would hold the key back for good).
        let ctx = FleetContext::new(5_000_000, 0.25, 0, 0);
        let heard = |own: u64, mine: Option<u64>, at: u64| {
            let mut w = u128::join(own, fixed.pack(0, 10));
            fixed.apply_push(&ctx, &mut w, &(fixed.pack(0, 10), mine), false, at)
        };
        let own = fixed.pack(0, 25);
        assert_eq!(heard(own, Some(fixed.pack(0, 20)), S).unheard, Some(5));
        assert_eq!(heard(own, None, S).unheard, Some(25));
        assert_eq!(heard(own, None, 61 * S).unheard, Some(0));
        assert!(heard(own, None, S).republish);
        assert!(!heard(own, Some(own), S).republish);
    }

    /// The rates are held as the windows are. EARRRL's units are its decayed counts (its
    /// rate ÷ λ): with another instance heard at half its rate of 100/s (72 of the 144 units
    /// it holds at the limit), a quarter's share admits 15 in a row at one instant (the 16th
    /// would leave 16 unheard, above ⌈57/4⌉), then waits; alone, or under
    /// `Fallback::DENY`, it admits to the limit. A push says what this instance took since
    /// its field: the difference of the counts, decayed. The exponential limiter's units are
    /// its part's increments to the union's average, the same way.
    // Pins G49.
    #[test]
    fn a_rate_admitted_unheard_is_held_to_a_share_of_what_is_left() {
        use crate::Rate;
        let earrrl = Earrrl::new(
            Duration::from_secs(1),
            Rate::new(100.0, Duration::from_secs(1)).unwrap(),
        )
        .unwrap();
        let lambda = std::f64::consts::LN_2;
        let t = S as f64 / 1e9;
        // The word whose rate at `S` is `rate`.
        let at = |rate: f64| (t + (rate / lambda).ln() / lambda).to_bits();
        let half = at(50.0);
        assert_eq!(in_a_row(earrrl, half, 0.25), (15, Some(Reason::Waiting)));
        // 145 units: the 145th is admitted at 99.8/s, within the limit.
        assert_eq!(
            in_a_row(earrrl, earrrl.fresh(), 0.25),
            (145, Some(Reason::Known))
        );
        assert_eq!(in_a_row(earrrl, half, 0.0), (73, Some(Reason::Known)));
        // 10/s more is 10/λ = 14.4 units; a state behind what was heard took nothing.
        let (own, heard) = (at(30.0), at(20.0));
        assert_eq!(earrrl.unheard(own, heard, S), 14);
        assert_eq!(earrrl.unheard(heard, own, S), 0);
        let ctx = FleetContext::new(5_000_000, 0.25, 0, 0);
        let mut w = u128::join(own, half);
        let pushed = earrrl.apply_push(&ctx, &mut w, &(half, Some(heard)), false, S);
        assert_eq!(pushed.unheard, Some(14));
        // Held back, a request counts as a denial does: under `Strict` (EARRRL's default),
        // what its admission would have; under `Leaky`, nothing.
        ctx.mirror_since.store(0, Ordering::Relaxed);
        let held = Seen {
            unheard: 100,
            ..Seen::default()
        };
        for (algo, counts) in [
            (earrrl, true),
            (earrrl.with_policy(crate::Policy::Leaky), false),
        ] {
            let mut w = u128::join(own, half);
            let v = algo.decide_entry(&0.25, &ctx, &mut w, held, S, 1, false);
            assert_eq!(v.reason, Reason::Waiting);
            assert_eq!(w.split().0 != own, counts, "{:?}", algo.policy());
            assert_eq!(w.split().1, half);
        }
        // So is a joiner's request held for its first round (a key not heard of, no round
        // answered yet), and one `Fallback::DENY` refuses for want of the key's state: one
        // unit more under `Strict`, as its exact twin counts it.
        let (joiner, unknown) = (FleetContext::new(5_000_000, 0.25, 0, 0), Earrrl::UNKNOWN);
        for (algo, counts) in [(earrrl, 1), (earrrl.with_policy(crate::Policy::Leaky), 0)] {
            for (share, reason) in [(0.25, Reason::Waiting), (0.0, Reason::Fallback)] {
                let mut w = u128::join(own, unknown);
                let v = algo.decide_entry(&share, &joiner, &mut w, Seen::default(), S, 1, false);
                assert_eq!((v.reason, v.decision.is_allowed()), (reason, false));
                assert_eq!(algo.unheard(w.split().0, own, S), counts, "{reason:?}");
                assert_eq!(w.split().1, unknown);
            }
        }
        // The exponential limiter's parts: a request in a burst adds about one.
        let exp = Exponential::new(100.0, Duration::from_secs(1)).unwrap();
        let half = Exponential::pack(S, 50.0);
        // Half of 100 held elsewhere: the 11th in a row would leave 11 unheard, above
        // ⌈39/4⌉.
        assert_eq!(in_a_row(exp, half, 0.25), (10, Some(Reason::Waiting)));
        assert_eq!(in_a_row(exp, exp.fresh(), 0.25), (100, Some(Reason::Known)));
        assert_eq!(in_a_row(exp, half, 0.0), (50, Some(Reason::Known)));
        // 30 now beyond 20 heard half a period ago (20·e^{−1/2} = 12.1 now): 18 unheard.
        let (own, heard) = (Exponential::pack(S, 30.0), Exponential::pack(S / 2, 20.0));
        assert_eq!(exp.unheard(own, heard, S), 18);
    }

    /// Counts stamped on a timeline found 1.5 s behind Redis' (a clock behind, before Redis
    /// was heard) move to the latest window their requests may fall in, 2 s on; 2 s ahead,
    /// 2 s back; a rate's time moves by the jump. A fresh state stays fresh.
    // Pins G56.
    #[test]
    fn a_state_is_restamped_into_the_latest_window_it_may_fall_in() {
        let fixed = FixedWindow::new(100, Duration::from_secs(1)).unwrap();
        let late = (3 * S / 2) as i64;
        assert_eq!(fixed.shift(fixed.pack(10, 5), late), fixed.pack(12, 5));
        assert_eq!(
            fixed.shift(fixed.pack(10, 5), -2 * S as i64),
            fixed.pack(8, 5)
        );
        assert_eq!(fixed.shift(fixed.pack(10, 0), late), fixed.pack(10, 0));
        let sliding = SlidingWindow::new(100, Duration::from_secs(1)).unwrap();
        assert_eq!(
            sliding.shift(SlidingWindow::pack(10, 7, 5), late),
            SlidingWindow::pack(12, 7, 5)
        );
        let exp = Exponential::new(100.0, Duration::from_secs(1)).unwrap();
        assert_eq!(
            exp.shift(Exponential::pack(10 * S, 3.0), late),
            Exponential::pack(10 * S + late as u64, 3.0)
        );
        let earrrl = Earrrl::new(Duration::from_secs(1), "100/s".parse().unwrap()).unwrap();
        assert_eq!(f64::from_bits(earrrl.shift(10.0f64.to_bits(), late)), 11.5);
        assert_eq!(
            earrrl.shift(f64::NEG_INFINITY.to_bits(), late),
            f64::NEG_INFINITY.to_bits()
        );
    }

    /// Between a jump of the timeline (Redis' time first heard, 2 s ahead of this instance's
    /// clock) and the re-stamp of the states, a request waits and a settle is refused (or,
    /// told not to wait, settles on the current offset), the state untouched: read at the new timeline's time, the own rate stamped on the old
    /// one was decayed by the jump (here 40 to 5.4, then put 2 s ahead by the re-stamp: the
    /// cold start's 1.19–1.26x). Re-stamped, it decides on the rate decayed by 1 ms.
    // Pins G56.
    #[test]
    fn a_request_while_the_states_are_restamped_waits_and_changes_nothing() {
        let exp = Exponential::new(100.0, Duration::from_secs(1)).unwrap();
        let ctx = FleetContext::new(5_000_000, 0.25, 0, 0);
        ctx.mirror_since.store(0, Ordering::Relaxed);
        let (own, others) = (Exponential::pack(S, 40.0), Exponential::pack(S, 20.0));
        let mut w = Pair::join(own, others);
        // Redis says 2 s more than this clock, for a round trip at local S + 1 ms.
        ctx.observe_time(3 * S + 1_000_000, S + 1_000_000, S + 1_000_000);
        let v = exp.decide_entry(
            &0.25,
            &ctx,
            &mut w,
            Seen::default(),
            S + 1_000_000,
            1,
            false,
        );
        assert_eq!(
            (v.reason, v.decision.is_allowed(), v.sync),
            (Reason::Waiting, false, false)
        );
        assert!(!exp.settle_entry(&ctx, &mut w, S + 1_000_000, S, 3, 1, true));
        assert_eq!(w, Pair::join(own, others));
        // Not waiting (a re-stamp that never ends): on the current offset.
        let mut forced = w;
        assert!(exp.settle_entry(&ctx, &mut forced, S + 1_000_000, S, 3, 1, false));
        assert_ne!(forced, w);
        // The sync thread's re-stamp: the own state moves by the jump, the others' are Redis'.
        let delta = ctx.restamp.swap(0, Ordering::Relaxed);
        assert_eq!(delta, 2 * S as i64);
        exp.restamp(&mut w, delta);
        ctx.restamped();
        let v = exp.decide_entry(
            &0.25,
            &ctx,
            &mut w,
            Seen::default(),
            S + 1_000_000,
            1,
            false,
        );
        assert_eq!((v.reason, v.decision.is_allowed()), (Reason::Known, true));
        let (t, r) = Exponential::unpack(w.split().0);
        assert_eq!(t, 3 * S + 1_000_000);
        assert!(r > 40.0 * (-0.001f64).exp(), "{r}");
        assert!(exp.settle_entry(&ctx, &mut w, S + 2_000_000, S + 1_000_000, 1, 0, true));
    }

    /// A fleet take settled at 0 leaves this instance's part of an exponential average no
    /// lower than it was before the take: the take adds its whole cost to the part, which the
    /// settle takes back. A decision adds only the union's smoothed increment (here, a
    /// second after the last request, `(1 − e^{−1})·10`), and its full refund took the part
    /// below its decayed self.
    // Pins G29.
    #[test]
    fn a_fleet_take_settled_at_0_leaves_its_part_where_it_was() {
        let exp = Exponential::new(20.0, Duration::from_secs(1)).unwrap();
        let (own, others) = (Exponential::pack(S, 8.0), Exponential::pack(S, 2.0));
        let now = 2 * S;
        let before = 8.0 * (-1.0f64).exp();
        let settled = |counted: Option<u128>| {
            let mut part = counted.expect("admitted and counted");
            exp.settle(&mut part, now, now, 10, 0);
            Exponential::unpack(part).1
        };
        let (d, counted) = exp.decide_merged(own, others, now, 10);
        assert!(d.is_allowed());
        let after = settled(counted.map(|c| exp.count_take(own, c, now, 10)));
        assert!((after - before).abs() < 1e-12, "{after} vs {before}");
        // What a decision counts (6.32) cannot be refunded whole: the part went to zero.
        let (_, counted) = exp.decide_merged(own, others, now, 10);
        assert_eq!(settled(counted), 0.0);
    }

    /// A state stamped two windows ahead (an instance's clock before Redis' time was known)
    /// is counted in the current window beside the others', not taken for the newest window
    /// (which dropped the others' counts: a cold start with clocks ±2 s admitted 1.6–1.9×).
    // Pins G56.
    #[test]
    fn a_window_state_stamped_ahead_is_counted_in_the_current_window() {
        let fixed = FixedWindow::new(100, Duration::from_secs(1)).unwrap();
        let now = 10 * S + S / 2;
        let (ahead, current) = (fixed.pack(12, 30), fixed.pack(10, 50));
        assert_eq!(fixed.merge(ahead, current, now), fixed.pack(10, 80));
        assert_eq!(fixed.merge(current, ahead, now), fixed.pack(10, 80));
        assert_eq!(fixed.pull_back(current, now), current);
        // Counted on it, the own state is re-stamped in the current window.
        assert_eq!(fixed.count(ahead, now, 1), fixed.pack(10, 31));

        let sliding = SlidingWindow::new(100, Duration::from_secs(1)).unwrap();
        let (ahead, current) = (
            SlidingWindow::pack(12, 5, 30),
            SlidingWindow::pack(10, 20, 50),
        );
        assert_eq!(
            sliding.merge(ahead, current, now),
            SlidingWindow::pack(10, 25, 80)
        );
        assert_eq!(sliding.pull_back(current, now), current);
        // A state of the previous window is seen from now's, as before.
        assert_eq!(
            sliding.merge(SlidingWindow::pack(9, 7, 40), current, now),
            SlidingWindow::pack(10, 60, 50)
        );
    }

    /// Permits taken before Redis' time was known, re-stamped into the next epoch by a cold
    /// start found a nanosecond behind, are still given back by their tickets (the release
    /// looked for them in the ticket's epoch only: the fleet kept them to their lease).
    #[test]
    fn permits_restamped_at_a_cold_start_are_released() {
        let permits = InFlight::new(4, Duration::from_secs(20)).unwrap();
        let mut own = permits.fresh();
        for _ in 0..4 {
            assert!(permits.update(&mut own, 3 * S, 1).is_allowed()); // epoch 0
        }
        own = permits.shift(own, 1);
        assert_eq!(unpack(own), (1, 0, 4));
        for released in 1..=4 {
            permits.settle(&mut own, 4 * S, 3 * S + 1, 1, 0);
            assert_eq!(unpack(own).2, 4 - released);
        }
        assert_eq!(own, permits.fresh());
    }
}
