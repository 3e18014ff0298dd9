//! How the decaying rates' states add up across instances ([`Merge`] for EARRRL and the
//! exponential limiter): the sum of each instance's rate, decayed to a common time.

use super::super::entry::Pair;
use super::algos::shifted_ns;
use super::Merge;
use crate::algo::{Algorithm, Earrrl, Exponential, WordStep};
use crate::decision::Decision;

impl Merge for Earrrl {
    type Word = u64;
    type Entry = u128;
    /// A NaN: `S` is finite or −∞.
    const UNKNOWN: u64 = 0x7ff8_0000_0000_0001;

    /// The union's rate at three quarters of the maximum or more.
    fn near_limit(&self, decision: &Decision) -> bool {
        decision
            .rate()
            .is_some_and(|r| 4.0 * r >= 3.0 * self.max_rate())
    }

    /// Four half-lives: a rate at the limit has decayed to a sixteenth of it.
    fn horizon(&self) -> u64 {
        4 * self.half_life().as_nanos() as u64
    }

    /// Held as the windows are: under 20 ms ± 10 of latency, each instance admitting on what
    /// it saw of the others' rates took the fleet to 1.2x its exact twin (its worst second
    /// 1.37-1.45x).
    fn caps_unheard(&self) -> bool {
        true
    }

    /// A rate's units are its decayed count `e^{λ(S−t)}` (the rate ÷ λ), and every impulse
    /// decays at the same λ: the difference of the two counts now is what `own` took since
    /// `heard`, decayed to now (rounded to the nearest unit).
    fn unheard(&self, own: u64, heard: u64, now: u64) -> u64 {
        let lambda = self.redis_params().0;
        let t = now as f64 / 1e9;
        let count = |w: u64| (lambda * (self.live(w, now) - t)).exp();
        (count(own) - count(heard)).max(0.0).round() as u64
    }

    /// What the union's rate before the request (the decision's) left below the limit, in
    /// units: `(R − rate) ÷ λ`, whole ones (a request is admitted at a rate at the limit or
    /// below, whatever its cost).
    fn left_before(&self, decision: &Decision, _cost: u64) -> u64 {
        let (lambda, max_rate, ..) = self.redis_params();
        let rate = decision.rate().unwrap_or(max_rate);
        ((max_rate - rate).max(0.0) / lambda) as u64
    }

    /// A share of a rate ([`degraded`](Merge::degraded)), never rounded to units.
    fn fallback_units(&self) -> u64 {
        u64::MAX
    }

    fn shift(&self, word: u64, delta: i64) -> u64 {
        match f64::from_bits(word) {
            s if s.is_finite() => (s + delta as f64 / 1e9).to_bits(),
            _ => word,
        }
    }

    /// Rates add: `λe^{λ(S−t)} = λe^{λ(Sa−t)} + λe^{λ(Sb−t)}`, so `S` is the log-sum-exp of
    /// the two, exact (no time appears: every impulse decays at the same λ).
    fn merge(&self, a: u64, b: u64, now: u64) -> u64 {
        let lambda = self.redis_params().0;
        let live = |w: u64| self.live(w, now);
        let (sa, sb) = (live(a), live(b));
        let (hi, lo) = if sa >= sb { (sa, sb) } else { (sb, sa) };
        if lo == f64::NEG_INFINITY {
            return hi.to_bits();
        }
        (hi + (lambda * (lo - hi)).exp().ln_1p() / lambda).to_bits()
    }

    fn count(&self, own: u64, now: u64, cost: u64) -> u64 {
        self.counted(own, now, cost)
    }

    /// The allowed case without building the merged state: the union's rate is the sum of
    /// the two (2 `exp`, 1 `ln` instead of 3 and 3); a denial takes the general path, for
    /// its honest `retry_after`.
    fn decide_merged(&self, own: u64, others: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        let (lambda, max_rate, ..) = self.redis_params();
        let live = |w: u64| self.live(w, now);
        let t = now as f64 / 1e9;
        let x = lambda * (live(own) - t);
        let e_own = x.exp();
        let rate = lambda * (e_own + (lambda * (live(others) - t)).exp());
        if rate <= max_rate {
            let d = Decision::allowed().with_rate(rate);
            return (d, Some(self.counted_from(t, x, e_own, cost)));
        }
        let step = self.step(self.merge(own, others, now), now, cost);
        let counted = step.state.map(|_| self.count(own, now, cost));
        (step.decision, counted)
    }

    fn degraded(&self, known: u64, now: u64, share: f64) -> u64 {
        let (lambda, max_rate, ..) = self.redis_params();
        let t = now as f64 / 1e9;
        let s = self.live(known, now);
        let held = if s == f64::NEG_INFINITY {
            0.0
        } else {
            lambda * (lambda * (s - t)).exp()
        };
        let rate = held + (1.0 - share) * (max_rate - held).max(0.0);
        if rate <= 0.0 {
            return self.fresh();
        }
        (t + (rate / lambda).ln() / lambda).to_bits()
    }
}

impl Merge for Exponential {
    type Word = u128;
    type Entry = Pair;
    const UNKNOWN: u128 = u128::MAX;

    /// The union's average at three quarters of the limit or more (the decision's rate is
    /// per second, the limit per period).
    fn near_limit(&self, decision: &Decision) -> bool {
        let per_second = self.limit() / self.period().as_secs_f64();
        decision.rate().is_some_and(|r| 4.0 * r >= 3.0 * per_second)
    }

    /// Three periods: an average at the limit has decayed to 5% of it.
    fn horizon(&self) -> u64 {
        3 * self.period().as_nanos() as u64
    }

    /// Held as the windows are: under 20 ms ± 10 of latency, each instance admitting on what
    /// it saw of the others' parts took the fleet's worst second to 1.10-1.37x its exact
    /// twin's.
    fn caps_unheard(&self) -> bool {
        true
    }

    /// A part's units are its increments to the union's average (a request in a burst adds
    /// about one): what `own` added since `heard`, both decayed to now, rounded.
    fn unheard(&self, own: u128, heard: u128, now: u64) -> u64 {
        let part = |word: u128| {
            let (t, r) = Self::unpack(word);
            self.decayed(t, r, now)
        };
        (part(own) - part(heard)).max(0.0).round() as u64
    }

    /// What the union's average after the request (the decision's rate, per second) leaves
    /// below the limit, and the request's cost: in units of the limit, whole ones.
    fn left_before(&self, decision: &Decision, cost: u64) -> u64 {
        let average = decision.rate().unwrap_or(0.0) * self.period().as_secs_f64();
        ((self.limit() - average).max(0.0) as u64).saturating_add(cost)
    }

    fn shift(&self, word: u128, delta: i64) -> u128 {
        match Self::unpack(word) {
            (_, 0.0) => word,
            (t, r) => Self::pack(shifted_ns(t, delta), r),
        }
    }

    /// The two parts decayed to the later of their times and added: the union's average as
    /// of its last request (see `decide_merged`).
    fn merge(&self, a: u128, b: u128, _now: u64) -> u128 {
        let p = self.period().as_nanos() as f64;
        let ((ta, ra), (tb, rb)) = (Self::unpack(a), Self::unpack(b));
        if ra == 0.0 {
            return b;
        }
        if rb == 0.0 {
            return a;
        }
        let t = ta.max(tb);
        let decayed = |ti: u64, r: f64| r * (-((t - ti) as f64) / p).exp();
        Self::pack(t, decayed(ta, ra) + decayed(tb, rb))
    }

    /// Alone, the instance's own step (what `decide_merged` counts when nothing else is
    /// known).
    fn count(&self, own: u128, now: u64, cost: u64) -> u128 {
        let (t, r) = Self::unpack(own);
        Self::pack(now.max(t), self.r_now(t, r, now, cost as f64))
    }

    fn degraded(&self, known: u128, now: u64, share: f64) -> u128 {
        let (t, r) = Self::unpack(known);
        let p = self.period().as_nanos() as f64;
        let held = r * (-(now.saturating_sub(t) as f64) / p).exp();
        let limit = self.limit();
        Self::pack(
            now.max(t),
            held + (1.0 - share).max(0.0) * (limit - held).max(0.0),
        )
    }

    /// Exim's average is not a sum over instances (each request is weighed by the gap since
    /// the union's previous one), so each instance keeps, instead of its own traffic's
    /// average, its *part* of the union's: the increments its requests made to it. A request
    /// takes Exim's step on the union (the parts decayed to the union's last request and
    /// added: its average then), and adds `r_now − e^{−i}·r_union` to this instance's part.
    /// Increments add, so the parts' sum is the union's average exactly when every part is
    /// current; it lags as the other states do. Alone, the part is Exim's own average.
    fn decide_merged(
        &self,
        own: u128,
        others: u128,
        now: u64,
        cost: u64,
    ) -> (Decision, Option<u128>) {
        let union = self.merge(own, others, now);
        let step = self.step(union, now, cost);
        let counted = step.state.map(|after| {
            let (t_union, r_union) = Self::unpack(union);
            let increment = Self::unpack(after).1 - self.decayed(t_union, r_union, now);
            let (t_own, r_own) = Self::unpack(own);
            let t = now.max(t_own);
            Self::pack(t, self.decayed(t_own, r_own, t) + increment.max(0.0))
        });
        (step.decision, counted)
    }

    /// An admitted take adds its whole cost to this instance's part (at least the increment
    /// a decision adds), as a take in memory stores it: the settle's refund of
    /// `charged − actual` then takes back no more than the take added.
    fn count_take(&self, own: u128, counted: u128, now: u64, cost: u64) -> u128 {
        let (t_own, r_own) = Self::unpack(own);
        let t = now.max(t_own);
        let p = self.period().as_nanos() as f64;
        // As `Algorithm::take`: an idle part is a fresh one.
        let left = if t >= self.idle_at(&own) {
            0.0
        } else {
            (-((t - t_own) as f64) / p).exp() * r_own
        };
        Self::pack(t, (left + cost as f64).max(Self::unpack(counted).1))
    }
}
