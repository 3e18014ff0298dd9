//! loom models of the CAS cell (DESIGN §4): every interleaving of 2–3 threads updating one state
//! word (64-bit, or 128-bit for the exponential limiter) gives the totals and final state of
//! some sequential order.
//!
//! Run with: `RUSTFLAGS="--cfg hotlimit_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom`
//! Under that cfg the crate's atomics and locks are loom's (see `src/sync.rs`). The models use
//! the direct limiter (one cell) rather than the papaya map, which loom does not model.
#![cfg(hotlimit_loom)]

#[path = "common/step.rs"]
mod step;

use hotlimit::algo::{Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog};
use hotlimit::store::{Locked, Variant};
use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{DirectLimiter, ManualClock, Policy, Rate};
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;
use step::WordStep;

const T: u64 = 10_000_000; // 100/s

/// `threads` threads each send `per_thread` requests at a frozen clock; returns the number
/// allowed and the `retry_after` (ns) a further request then sees, which pins the final state.
fn run<A, V>(algo: A, threads: usize, per_thread: usize) -> (usize, u64)
where
    A: Algorithm,
    V: Variant<A>,
{
    let limiter = Arc::new(DirectLimiter::<A, _, V>::with_clock(
        algo,
        ManualClock::default(),
    ));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let l = limiter.clone();
            thread::spawn(move || {
                (0..per_thread)
                    .filter(|_| l.check(&()).is_allowed())
                    .count()
            })
        })
        .collect();
    let allowed = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let after = limiter.check(&());
    assert!(after.is_denied());
    (allowed, after.retry_after().as_nanos() as u64)
}

fn gcra(burst: u64, policy: Policy) -> Gcra {
    "100/s"
        .parse::<Gcra>()
        .unwrap()
        .with_burst(burst)
        .unwrap()
        .with_policy(policy)
}

// Pins G1.
#[test]
fn gcra_leaky_two_threads_two_requests_each() {
    loom::model(|| {
        // Burst 3 of 4 requests: exactly 3 admitted, tat = 3T, next retry after T.
        assert_eq!(
            run::<_, hotlimit::store::Cas>(gcra(3, Policy::Leaky), 2, 2),
            (3, T)
        );
    });
}

// Pins G1.
#[test]
fn gcra_leaky_three_threads() {
    loom::model(|| {
        assert_eq!(
            run::<_, hotlimit::store::Cas>(gcra(2, Policy::Leaky), 3, 1),
            (2, T)
        );
    });
}

// Pins G1.
#[test]
fn gcra_strict_counts_every_request_once() {
    loom::model(|| {
        // Burst 1, 4 requests: 1 admitted; strict stores all 4 (tat = 4T). The fifth, probing
        // request is stored too (tat' = 5T), so its honest wait is tat' + T − B·T = 5T.
        assert_eq!(
            run::<_, hotlimit::store::Cas>(gcra(1, Policy::Strict), 2, 2),
            (1, 5 * T)
        );
    });
}

// Pins G1.
#[test]
fn earrrl_strict_two_threads() {
    let e = Earrrl::new(
        Duration::from_secs(1),
        Rate::new(1.0, Duration::from_secs(1)).unwrap(),
    )
    .unwrap();
    // Sequential reference (outside the model: plain arithmetic, no atomics).
    let mut s = e.fresh();
    let mut allowed = 0;
    for _ in 0..4 {
        let step = e.step(s, 0, 1);
        allowed += step.decision.is_allowed() as usize;
        s = step.state.unwrap_or(s);
    }
    let retry = e.step(s, 0, 1).decision.retry_after().as_nanos() as u64;
    assert_eq!(allowed, 2);
    loom::model(move || {
        // The retry-after of the probe pins the final word: bit-identical float arithmetic.
        assert_eq!(run::<_, hotlimit::store::Cas>(e, 2, 2), (allowed, retry));
    });
}

/// The 128-bit cell: the exponential limiter's `(t_prev, r)` word through the same CAS loop,
/// its atomic loom's model of one indivisible 16-byte CAS (`sync::Atomic128`).
// Pins G1.
#[test]
fn exponential_two_word_state() {
    let x = Exponential::new(3.0, Duration::from_secs(1)).unwrap();
    let mut s = x.fresh();
    let mut allowed = 0;
    for _ in 0..4 {
        allowed += x.update(&mut s, 0, 1).is_allowed() as usize;
    }
    let retry = x.peek(&s, 0, 1).retry_after().as_nanos() as u64;
    assert_eq!(allowed, 3, "a burst at one instant: floor(L / cost)");
    loom::model(move || {
        assert_eq!(run::<_, hotlimit::store::Cas>(x, 2, 2), (allowed, retry));
    });
}

// Pins G1.
#[test]
fn mutex_twin_same_totals() {
    loom::model(|| {
        assert_eq!(run::<_, Locked>(gcra(3, Policy::Leaky), 2, 2), (3, T));
    });
}

// Pins G1.
#[test]
fn fixed_window_packed_word() {
    loom::model(|| {
        // 3 per 60 s at t = 0: 3 of 4 admitted; the probe waits for the window's end.
        let w = FixedWindow::new(3, Duration::from_secs(60)).unwrap();
        assert_eq!(run::<_, hotlimit::store::Cas>(w, 2, 2), (3, 60_000_000_000));
    });
}

// Pins G1.
#[test]
fn sliding_log_behind_its_per_key_lock() {
    loom::model(|| {
        // The log is no word: even the lock-free store keeps it behind a lock. 2 of 3 admitted;
        // the probe waits until the t = 0 entries leave the 10 s window.
        let log = SlidingLog::new(2, Duration::from_secs(10)).unwrap();
        assert_eq!(
            run::<_, hotlimit::store::Cas>(log, 3, 1),
            (2, 10_000_000_000)
        );
    });
}

/// A live switch racing a request (DESIGN §4 for `Live`): whatever the interleaving, the
/// request runs entirely under one configuration and what it wrote is kept, never clamped
/// (a switch hands no budget back, #46).
///
/// The state is `tat` = 150 ms at `now` = 100 ms. Under the old quota (burst 10) the request is
/// allowed and writes 250 ms; under the new one (burst 1) it is denied and leaves 150 ms. So a
/// request at 200 ms under the new quota is allowed exactly when the racing one was denied.
// Pins G27, G33.
#[test]
fn live_switch_racing_a_request_keeps_what_the_request_wrote() {
    use hotlimit::Live;
    loom::model(|| {
        let old: Gcra = "10/s burst 10".parse().unwrap();
        let new: Gcra = "10/s burst 1".parse().unwrap();
        let clock = ManualClock::default();
        let limiter = Arc::new(DirectLimiter::<_, _>::with_clock(
            Live::new(old),
            clock.clone(),
        ));
        clock.set(Duration::from_nanos(50_000_000));
        assert!(limiter.check(&()).is_allowed()); // tat = 150 ms
        clock.set(Duration::from_nanos(100_000_000));
        let l = limiter.clone();
        let request = thread::spawn(move || l.check(&()).is_allowed());
        limiter.reconfigure(new).unwrap();
        let raced = request.join().unwrap();
        clock.set(Duration::from_nanos(200_000_000));
        assert_eq!(limiter.check(&()).is_allowed(), !raced);
    });
}

/// A settle racing a request on one key (DESIGN §4): both go through the one CAS loop, so the
/// outcome is one of the two sequential orders. Burst 3, 3 units taken: refunding 2 before the
/// request of 2 admits it (tat back to T, then 3T); after it, the request is denied and the
/// refund leaves T. Any other final state is a lost update.
// Pins G1, G29.
#[test]
fn settle_racing_a_request_is_one_sequential_order() {
    for policy in [Policy::Leaky, Policy::Strict] {
        loom::model(move || {
            let limiter = Arc::new(DirectLimiter::<Gcra, _>::with_clock(
                gcra(3, policy),
                ManualClock::default(),
            ));
            let mut ticket = limiter.request(&()).cost(3).take().unwrap();
            let l = limiter.clone();
            let request = thread::spawn(move || l.check_n(&(), 2).unwrap().is_allowed());
            assert!(limiter.request(&()).settle(&mut ticket, 1).unwrap());
            let allowed = request.join().unwrap();
            let tat = match (allowed, policy) {
                // Refund first: T, then the request: 3T.
                (true, _) => 3 * T,
                // Request first: denied; leaky writes nothing, the refund leaves T.
                (false, Policy::Leaky) => T,
                // Strict counts the denial (5T), the refund leaves 3T.
                (false, Policy::Strict) => 3 * T,
                _ => unreachable!("a policy this model does not know"),
            };
            // The state left, as a request of one unit sees it.
            assert_eq!(
                limiter.request(&()).peek().unwrap(),
                gcra(3, policy).peek(&tat, 0, 1)
            );
        });
    }
}

/// An overrun racing a request: the debt and the request's charge both land.
// Pins G1, G29.
#[test]
fn overrun_racing_a_request_lands_both() {
    loom::model(|| {
        let limiter = Arc::new(DirectLimiter::<Gcra, _>::with_clock(
            gcra(4, Policy::Leaky),
            ManualClock::default(),
        ));
        let mut ticket = limiter.request(&()).take().unwrap();
        let l = limiter.clone();
        let request = thread::spawn(move || l.check(&()).is_allowed());
        assert!(limiter.request(&()).settle(&mut ticket, 3).unwrap());
        let allowed = request.join().unwrap();
        // Either order: tat = 3T + T = 4T, the request admitted within burst 4.
        assert!(allowed);
        assert_eq!(
            limiter
                .request(&())
                .peek()
                .unwrap()
                .retry_after()
                .as_nanos() as u64,
            T
        );
    });
}

/// In-flight permits (issue #62): `threads` threads each take a permit of a limit of `max`,
/// count themselves in while they hold it, and give it back. In every interleaving no more
/// than `max` are inside at once, at least one gets in, and every permit comes back: the
/// whole limit is free at the end.
fn permits(threads: usize, max: u64) {
    use hotlimit::algo::InFlight;
    use hotlimit::Permit;
    use loom::sync::atomic::{AtomicU64, Ordering};
    loom::model(move || {
        let limiter = Arc::new(DirectLimiter::<InFlight, _>::with_clock(
            InFlight::new(max, Duration::from_secs(60)).unwrap(),
            ManualClock::default(),
        ));
        let inside = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (l, inside) = (limiter.clone(), inside.clone());
                thread::spawn(move || {
                    let permit = Permit::acquire(&*l, &(), 1).unwrap();
                    if permit.decision().is_denied() {
                        return 0;
                    }
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= max, "{now} inside, max {max}");
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                    1
                })
            })
            .collect();
        let admitted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(admitted >= 1, "the first permit taken is always free");
        let all = Permit::acquire(&*limiter, &(), max).unwrap();
        assert!(all.decision().is_allowed(), "a permit was not given back");
    });
}

// Pins G76.
#[test]
fn permits_two_threads_one_permit() {
    permits(2, 1);
}

// Pins G76.
#[test]
fn permits_three_threads_two_permits() {
    permits(3, 2);
}

/// A hierarchy checked at once (issue #62): two threads each `check_all` a user and their
/// organisation, every level a `DirectLimiter` of its own. In every interleaving exactly
/// `want` are admitted, no level is overspent, and each level ends holding exactly the
/// charges of the admitted calls: a level that admitted a call another level denied was
/// refunded.
fn hierarchy(users: [usize; 2], user_burst: u64, org_burst: u64, want: u64) {
    use hotlimit::check_all;
    loom::model(move || {
        let level = |burst| {
            Arc::new(DirectLimiter::<Gcra, _>::with_clock(
                gcra(burst, Policy::Leaky),
                ManualClock::default(),
            ))
        };
        let user_levels = [level(user_burst), level(user_burst)];
        let org = level(org_burst);
        let handles: Vec<_> = users
            .into_iter()
            .map(|u| {
                let (user, org) = (user_levels[u].clone(), org.clone());
                thread::spawn(move || {
                    let levels = [(&*user, &(), None), (&*org, &(), None)];
                    check_all(&levels, 1).unwrap().1.is_allowed()
                })
            })
            .collect();
        let admitted: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let total = admitted.iter().filter(|&&a| a).count() as u64;
        assert_eq!(total, want, "{admitted:?}");
        // What each level has left: a peek of one unit, plus that unit if admitted.
        let left = |l: &DirectLimiter<Gcra, ManualClock>| {
            let d = l.request(&()).peek().unwrap();
            d.remaining().unwrap() + u64::from(d.is_allowed())
        };
        assert_eq!(left(&org), org_burst - total);
        for (u, level) in user_levels.iter().enumerate() {
            let spent = users
                .iter()
                .zip(&admitted)
                .filter(|&(&user, &a)| user == u && a)
                .count() as u64;
            assert_eq!(left(level), user_burst - spent, "user {u}: {admitted:?}");
        }
    });
}

// Two users, one organisation with room for one: one admitted, the other's user level
// refunded. Pins G78.
#[test]
fn hierarchy_two_users_one_org_slot() {
    hierarchy([0, 1], 1, 1, 1);
}

// One user with room for one, its organisation with room for two: one admitted, the
// organisation charged once. Pins G78.
#[test]
fn hierarchy_one_user_slot_two_org_slots() {
    hierarchy([0, 0], 1, 2, 1);
}
