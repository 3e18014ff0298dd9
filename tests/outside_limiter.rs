//! A limiter written outside the crate, on its public API alone: a budget of units per key
//! that never refills (a quota of calls for a trial, say), implementing [`Requests`] in full.
//! Its `take` issues tickets ([`Ticket::issue`]) and its `settle` checks and closes them
//! ([`Ticket::check_origin`], [`Ticket::close`]) as the crate's limiters do, so it runs the
//! crate's request builder and [`check_all`], whose hierarchies charge by takes. Each answer
//! is checked against the budget's exact arithmetic.

#[path = "common/budget.rs"]
mod budget;

use budget::Budget;
use hotlimit::{check_all, QuotaError, Requests};

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
    // An overrun is charged past the limit: 3 taken, 7 used.
    let mut t = b.request("bob").cost(3).take().unwrap();
    assert_eq!(b.request("bob").settle(&mut t, 7), Ok(true));
    assert_eq!(b.spent("bob"), 7);
    let d = b.request("bob").cost(4).check().unwrap();
    assert_eq!((d.is_denied(), d.remaining()), (true, Some(3)));
}

#[test]
fn a_ticket_settles_only_where_it_was_taken() {
    let (b, other) = (Budget::new(0x5eed2, 10), Budget::new(0x5eed3, 10));
    let mut t = b.request("alice").cost(5).take().unwrap();
    assert_eq!(
        other.request("alice").settle(&mut t, 0),
        Err(QuotaError::TicketFromOtherLimiter)
    );
    assert_eq!(
        b.request("bob").settle(&mut t, 0),
        Err(QuotaError::TicketForOtherKey)
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
        Err(QuotaError::ExceedsCapacity {
            cost: 3,
            capacity: 2
        })
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
