//! EARRRL's textbook two-field form (DESIGN §3.2): `n` requests assumed to have arrived together
//! at `t` seconds. The reference the crate's one-word form is checked against, written here from
//! the paper's formulas and the crate's public parameters only.

use hotlimit::algo::{Algorithm, Earrrl, CLOCK_MAX};
use hotlimit::Policy;
use std::time::Duration;

/// A key's two-field state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EarrrlPair {
    /// N, cost units.
    pub n: f64,
    /// T, seconds since the clock's origin.
    pub t: f64,
}

/// What the two-field form decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairDecision {
    pub allowed: bool,
    /// The measured rate before the request, per second.
    pub rate: f64,
    /// 0 when allowed; else the smallest wait after which the same request is allowed.
    pub retry_after_ns: u64,
}

const NS: f64 = 1e9;

impl EarrrlPair {
    /// A key never seen: no requests.
    pub const FRESH: EarrrlPair = EarrrlPair { n: 0.0, t: 0.0 };

    /// Decides a request of `cost` at `now_ns` under `e` (built with `half_life`), updating the
    /// state in place as `e`'s policy says.
    pub fn step(
        &mut self,
        e: &Earrrl,
        half_life: Duration,
        now_ns: u64,
        cost: u64,
    ) -> PairDecision {
        let lambda = std::f64::consts::LN_2 / half_life.as_secs_f64();
        let max_rate = e.max_rate();
        let now_ns = now_ns.min(CLOCK_MAX);
        // A residual the one-word form forgets (below ε·R) is forgotten here too, by that
        // form's own test on its word, S = T + ln(N)/λ.
        if self.n > 0.0 && e.idle_at(&(self.t + self.n.ln() / lambda).to_bits()) <= now_ns {
            self.n = 0.0;
        }
        // The two-field form knows T, so a clock read that went backwards is clamped to it.
        let now = (now_ns as f64 / NS).max(self.t);
        let decay = (lambda * (self.t - now)).exp();
        let rate = self.n * lambda * decay;
        let allowed = rate <= max_rate;
        if allowed || e.policy() == Policy::Strict {
            self.n = cost as f64 + self.n * decay;
            self.t = now;
        }
        if allowed {
            return PairDecision {
                allowed,
                rate,
                retry_after_ns: 0,
            };
        }
        let (n, t) = (self.n, self.t);
        let allowed_after = |w: u64| {
            let later = (now_ns.saturating_add(w) as f64 / NS).max(t);
            n * lambda * (lambda * (t - later)).exp() <= max_rate
        };
        // The first wait that is allowed: doubling past it, then halving the gap.
        let (mut denied, mut ok) = (0u64, 1u64);
        while !allowed_after(ok) {
            if ok == u64::MAX {
                break;
            }
            denied = ok;
            ok = ok.saturating_mul(2);
        }
        while ok - denied > 1 {
            let mid = denied + (ok - denied) / 2;
            if allowed_after(mid) {
                ok = mid;
            } else {
                denied = mid;
            }
        }
        PairDecision {
            allowed,
            rate,
            retry_after_ns: ok,
        }
    }
}
