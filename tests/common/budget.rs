//! A limiter written outside the crate, on its public API alone: a budget of units per key
//! that never refills, implementing `Requests` in full (its `take` issues tickets, its
//! `settle` checks and closes them, as the crate's limiters do) and `AsyncRateLimiter`.
//! Settled with 0, a take gives all its units back: behind the tower layer's in-flight mode,
//! the budget is a semaphore per key. Used by `tests/outside_limiter.rs` and by
//! `hotlimit-tower`'s `tower/tests/in_flight.rs`.

use hotlimit::store::Ask;
use hotlimit::{AsyncRateLimiter, Decision, QuotaError, Requests, Ticket};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::future::{ready, Ready};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

/// `limit` units per key, ever; a request's quota (`Ask::quota`) is its own limit.
pub struct Budget {
    /// Names this limiter to its tickets.
    id: u64,
    limit: u64,
    spent: Mutex<HashMap<String, u64>>,
}

impl Budget {
    /// A budget of `limit` units per key; `id` names it to its tickets.
    pub fn new(id: u64, limit: u64) -> Self {
        Budget {
            id,
            limit,
            spent: Mutex::new(HashMap::new()),
        }
    }

    /// The decision of `cost` on `spent` under `limit`: a budget that never refills denies
    /// for good.
    fn decision(spent: u64, cost: u64, limit: u64) -> Decision {
        if spent + cost <= limit {
            Decision::allowed().with_remaining(limit - spent - cost)
        } else {
            // An overrun's settle may leave more spent than the limit.
            Decision::denied(Duration::MAX).with_remaining(limit.saturating_sub(spent))
        }
    }

    fn limit(&self, ask: &Ask<'_, u64>) -> u64 {
        ask.quota.copied().unwrap_or(self.limit)
    }

    fn checked(&self, ask: &Ask<'_, u64>) -> Result<u64, QuotaError> {
        let limit = self.limit(ask);
        match ask.cost {
            0 => Err(QuotaError::ZeroCost),
            c if c > limit => Err(QuotaError::ExceedsCapacity {
                cost: c,
                capacity: limit,
            }),
            c => Ok(c),
        }
    }

    fn print(key: &str) -> u64 {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        h.finish()
    }

    /// Units spent on `key`.
    pub fn spent(&self, key: &str) -> u64 {
        self.spent.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

impl Requests<str> for Budget {
    type Algo = u64;
    type Error = QuotaError;

    fn decide(&self, key: &str, ask: Ask<'_, u64>) -> Result<Decision, QuotaError> {
        let cost = self.checked(&ask)?;
        let mut spent = self.spent.lock().unwrap();
        let s = spent.entry(key.to_owned()).or_insert(0);
        let d = Self::decision(*s, cost, self.limit(&ask));
        if d.is_allowed() {
            *s += cost;
        }
        Ok(d)
    }

    fn peek(&self, key: &str, ask: Ask<'_, u64>) -> Result<Decision, QuotaError> {
        let cost = self.checked(&ask)?;
        Ok(Self::decision(self.spent(key), cost, self.limit(&ask)))
    }

    fn up_to(&self, key: &str, ask: Ask<'_, u64>) -> Result<(u64, Decision), QuotaError> {
        let most = self.checked(&ask)?;
        let limit = self.limit(&ask);
        let mut spent = self.spent.lock().unwrap();
        let s = spent.entry(key.to_owned()).or_insert(0);
        let n = most.min(limit.saturating_sub(*s));
        if n == 0 {
            return Ok((0, Self::decision(*s, 1, limit)));
        }
        *s += n;
        Ok((n, Self::decision(*s - n, n, limit)))
    }

    fn take(&self, key: &str, ask: Ask<'_, u64>) -> Result<Ticket, QuotaError> {
        let d = self.decide(key, ask)?;
        Ok(Ticket::issue(
            d,
            ask.cost,
            ask.at.unwrap_or(0),
            self.id,
            Self::print(key),
        ))
    }

    fn settle(
        &self,
        key: &str,
        ticket: &mut Ticket,
        actual: u64,
        _: Ask<'_, u64>,
    ) -> Result<bool, QuotaError> {
        ticket.check_origin(self.id, Self::print(key))?;
        let Some((_, charged)) = ticket.close() else {
            return Ok(false);
        };
        let mut spent = self.spent.lock().unwrap();
        let s = spent.entry(key.to_owned()).or_insert(0);
        // A refund of what the take charged, an overrun charged past the limit.
        *s = s.saturating_sub(charged).saturating_add(actual);
        Ok(true)
    }
}

/// A budget decides at once: its check is ready.
impl AsyncRateLimiter<str> for Budget {
    type Error = QuotaError;
    type Future = Ready<Result<Decision, QuotaError>>;

    fn check_n_async(&self, key: &str, cost: u64) -> Self::Future {
        let mut ask = Ask::default();
        ask.cost = cost;
        ready(self.decide(key, ask))
    }
}
