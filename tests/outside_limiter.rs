//! A limiter written outside the crate, on its public API alone: a budget of units per key
//! that never refills (a quota of calls for a trial, say), implementing [`Requests`] in full.
//! Its `take` issues tickets ([`Ticket::issue`]) and its `settle` checks and closes them
//! ([`Ticket::check_origin`], [`Ticket::close`]) as the crate's limiters do, so it runs the
//! crate's request builder and [`check_all`], whose hierarchies charge by takes. Each answer
//! is checked against the budget's exact arithmetic.

use hotlimit::store::Ask;
use hotlimit::{check_all, CostError, Decision, QuotaError, Requests, Ticket, TicketError};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

/// `limit` units per key, ever; a request's quota (`Ask::quota`) is its own limit.
struct Budget {
    /// Names this limiter to its tickets.
    id: u64,
    limit: u64,
    spent: Mutex<HashMap<String, u64>>,
}

impl Budget {
    fn new(id: u64, limit: u64) -> Self {
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
            Decision::denied(Duration::MAX).with_remaining(limit - spent)
        }
    }

    fn limit(&self, ask: &Ask<'_, u64>) -> u64 {
        ask.quota.copied().unwrap_or(self.limit)
    }

    fn checked(&self, ask: &Ask<'_, u64>) -> Result<u64, CostError> {
        let limit = self.limit(ask);
        match ask.cost {
            0 => Err(CostError::Zero),
            c if c > limit => Err(CostError::ExceedsCapacity {
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

    fn spent(&self, key: &str) -> u64 {
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

    fn preview(&self, key: &str, ask: Ask<'_, u64>) -> Result<Decision, QuotaError> {
        let cost = self.checked(&ask)?;
        Ok(Self::decision(self.spent(key), cost, self.limit(&ask)))
    }

    fn grant(&self, key: &str, ask: Ask<'_, u64>) -> Result<(u64, Decision), QuotaError> {
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
        *s = (*s - charged).saturating_add(actual);
        Ok(true)
    }
}

#[test]
fn a_take_is_settled_once_with_the_actual_cost() {
    let b = Budget::new(0x5eed1, 10);
    let mut t = b.request("alice").cost(6).take().unwrap();
    assert!(t.decision().is_allowed());
    assert_eq!((t.charged(), t.is_open()), (6, true));
    assert_eq!(b.spent("alice"), 6);
    // 2 of the 6 used: 4 come back.
    assert_eq!(b.request("alice").settle(&mut t, 2), Ok(true));
    assert_eq!(b.spent("alice"), 2);
    assert!(!t.is_open());
    // Settled once: a second settle changes nothing.
    assert_eq!(b.request("alice").settle(&mut t, 9), Ok(false));
    assert_eq!(b.spent("alice"), 2);
    let d = b.request("alice").cost(8).check().unwrap();
    assert_eq!((d.is_allowed(), d.remaining()), (true, Some(0)));
    assert!(b.request("alice").check().unwrap().is_denied());
}

#[test]
fn a_ticket_settles_only_where_it_was_taken() {
    let (b, other) = (Budget::new(0x5eed2, 10), Budget::new(0x5eed3, 10));
    let mut t = b.request("alice").cost(5).take().unwrap();
    assert_eq!(
        other.request("alice").settle(&mut t, 0),
        Err(QuotaError::Ticket(TicketError::OtherLimiter))
    );
    assert_eq!(
        b.request("bob").settle(&mut t, 0),
        Err(QuotaError::Ticket(TicketError::OtherKey))
    );
    // Refused, it changed nothing: still open, still charged, and settles where it belongs.
    assert!(t.is_open());
    assert_eq!(
        (b.spent("alice"), b.spent("bob"), other.spent("alice")),
        (5, 0, 0)
    );
    assert_eq!(b.request("alice").settle(&mut t, 0), Ok(true));
    assert_eq!(b.spent("alice"), 0);
}

#[test]
fn a_denied_take_holds_nothing_to_settle() {
    let b = Budget::new(0x5eed4, 3);
    // A cost its quota can never admit takes nothing and issues no ticket.
    assert_eq!(
        b.request("alice").cost(3).quota(&2).take(),
        Err(QuotaError::Cost(CostError::ExceedsCapacity {
            cost: 3,
            capacity: 2
        }))
    );
    assert!(b.request("alice").cost(3).check().unwrap().is_allowed());
    let mut denied = b.request("alice").take().unwrap();
    assert!(denied.decision().is_denied() && !denied.is_open());
    assert_eq!(b.request("alice").settle(&mut denied, 0), Ok(false));
    assert_eq!(b.spent("alice"), 3);
}

#[test]
fn partial_grants_and_peeks_follow_the_budget() {
    let b = Budget::new(0x5eed5, 10);
    assert_eq!(b.request("k").cost(4).peek().unwrap().remaining(), Some(6));
    assert_eq!(b.spent("k"), 0);
    let (n, d) = b.request("k").cost(7).up_to().unwrap();
    assert_eq!((n, d.is_allowed(), d.remaining()), (7, true, Some(3)));
    let (n, d) = b.request("k").cost(7).up_to().unwrap();
    assert_eq!((n, d.remaining()), (3, Some(0)));
    let (n, d) = b.request("k").cost(7).up_to().unwrap();
    assert_eq!((n, d.is_denied()), (0, true));
}

/// A hierarchy of the outside limiter's keys: a user's budget under an organisation's, the
/// organisation's smaller quota passed with the request. Each admission charges both; the
/// first denial, the organisation's, charges neither.
#[test]
fn a_hierarchy_charges_every_level_or_none() {
    let b = Budget::new(0x5eed6, 5);
    let org = 3;
    let levels = [(&b, "user:bob", None), (&b, "org:acme", Some(&org))];
    for _ in 0..3 {
        let (_, d) = check_all(&levels, 1).unwrap();
        assert!(d.is_allowed());
    }
    let (level, d) = check_all(&levels, 1).unwrap();
    assert_eq!((level, d.is_denied()), (1, true));
    assert_eq!((b.spent("user:bob"), b.spent("org:acme")), (3, 3));
}
