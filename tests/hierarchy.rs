//! Hierarchies checked at once (issue #62): `check_all` over a user, its organisation and a
//! global budget, each with its own quota. From 8 threads on every store no level is ever
//! overspent and no level keeps a charge for a request another denied (each level's state,
//! after a sequential drain, is exactly what its admitted requests spent); request by request,
//! alone, every answer is that of a sequential model of the levels.

use hotlimit::algo::{Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingWindow};
use hotlimit::store::{Ask, Locked};
use hotlimit::RateLimiter;
use hotlimit::{
    check_all, CasLimiter, CompactLimiter, Decision, DirectLimiter, ManualClock, MutexLimiter,
    Policy, QuotaError, Requests, Ticket,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

/// Four users, two organisations (users 0 and 1 in org 0, 2 and 3 in org 1), one global
/// budget: the quotas of each level.
struct Quotas<A> {
    user: A,
    org: A,
    global: A,
}

fn org_of(user: u64) -> u64 {
    user / 2
}

/// The levels of `user` on one keyed limiter: keys 0..4 users, 10..12 organisations, 20 the
/// global budget.
fn levels<'a, L: Requests<u64, Algo = A>, A>(
    l: &'a L,
    q: &'a Quotas<A>,
    keys: &'a [u64; 3],
) -> [(&'a L, &'a u64, Option<&'a A>); 3] {
    [
        (l, &keys[0], Some(&q.user)),
        (l, &keys[1], Some(&q.org)),
        (l, &keys[2], Some(&q.global)),
    ]
}

fn keys_of(user: u64) -> [u64; 3] {
    [user, 10 + org_of(user), 20]
}

/// 8 threads call `check_all` for random users on a frozen clock, then one thread drains every
/// user until denied. No level ever admits beyond its quota (counted per level), and no level
/// holds less than its admitted requests spent (a peek of each shows at most its quota less
/// what it admitted). Leaky (`exact`): each level's state is exactly its admitted requests'
/// and the global budget ends spent on admissions alone, so no level kept a charge for a
/// request another denied. Strict, the level that denies counts the denial, by its policy,
/// also one a concurrent call's passing charge caused: at most as lenient, not exact.
fn threads_never_overspend<L, A>(l: &L, q: &Quotas<A>, limits: [u64; 3], exact: bool)
where
    L: Requests<u64, Algo = A, Error = QuotaError> + Sync,
    A: Algorithm + Sync,
{
    let per_user: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
    let denied = AtomicU64::new(0);
    thread::scope(|s| {
        for t in 0..8u64 {
            let (per_user, denied) = (&per_user, &denied);
            s.spawn(move || {
                for i in 0..200u64 {
                    let user = (t * 7 + i * 3) % 4;
                    let keys = keys_of(user);
                    let (_, d) = check_all(&levels(l, q, &keys), 1).unwrap();
                    if d.is_allowed() {
                        per_user[user as usize].fetch_add(1, Ordering::Relaxed);
                    } else {
                        denied.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert!(denied.load(Ordering::Relaxed) > 0, "nothing contended");
    // A sequential drain: whatever passing charges denied, every user takes what is left.
    for user in 0..4 {
        let keys = keys_of(user);
        while check_all(&levels(l, q, &keys), 1).unwrap().1.is_allowed() {
            per_user[user as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
    let admitted: Vec<u64> = per_user.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let [user_limit, org_limit, global_limit] = limits;
    let total: u64 = admitted.iter().sum();
    // What a level has left: a peek of one unit, plus that unit if admitted.
    let left = |key: u64, quota: &A| {
        let d = l.request(&key).quota(quota).peek().unwrap();
        d.remaining().unwrap() + u64::from(d.is_allowed())
    };
    let holds = |left: u64, limit: u64, spent: u64| {
        if exact {
            left == limit - spent
        } else {
            left <= limit - spent
        }
    };
    assert!(total <= global_limit, "{admitted:?}");
    assert!(
        holds(left(20, &q.global), global_limit, total),
        "{admitted:?}"
    );
    for user in 0..4u64 {
        let own = admitted[user as usize];
        let org = admitted[2 * org_of(user) as usize] + admitted[2 * org_of(user) as usize + 1];
        assert!(own <= user_limit && org <= org_limit, "{admitted:?}");
        assert!(
            holds(left(user, &q.user), user_limit, own),
            "user {user}: {admitted:?}"
        );
        assert!(
            holds(left(10 + org_of(user), &q.org), org_limit, org),
            "{admitted:?}"
        );
    }
    if exact {
        assert_eq!(
            total, global_limit,
            "{admitted:?}: the global budget, spent exactly"
        );
    }
}

fn gcra_quotas() -> Quotas<Gcra> {
    Quotas {
        user: "1/h burst 5".parse().unwrap(),
        org: "1/h burst 7".parse().unwrap(),
        global: "1/h burst 12".parse().unwrap(),
    }
}

// Pins G78.
#[test]
fn threads_never_overspend_a_level_on_every_store() {
    let limits = [5, 7, 12];
    let own: Gcra = "1/h".parse().unwrap();
    let q = gcra_quotas();
    threads_never_overspend(
        &CasLimiter::<u64, _, _>::with_clock(own, ManualClock::default()),
        &q,
        limits,
        true,
    );
    threads_never_overspend(
        &MutexLimiter::<u64, _, _>::with_clock(own, ManualClock::default()),
        &q,
        limits,
        true,
    );
    threads_never_overspend(
        &CompactLimiter::<u64, _, _>::with_clock(own, ManualClock::default()),
        &q,
        limits,
        true,
    );
    threads_never_overspend(
        &CompactLimiter::<u64, _, _, Locked>::with_clock(own, ManualClock::default()),
        &q,
        limits,
        true,
    );
    // The windows (their counts refunded in the window they were taken in), both policies.
    let hour = Duration::from_secs(3_600);
    for policy in [Policy::Leaky, Policy::Strict] {
        let fixed = |n| FixedWindow::new(n, hour).unwrap().with_policy(policy);
        threads_never_overspend(
            &CasLimiter::<u64, _, _>::with_clock(fixed(1), ManualClock::default()),
            &Quotas {
                user: fixed(5),
                org: fixed(7),
                global: fixed(12),
            },
            limits,
            policy == Policy::Leaky,
        );
        let sliding = |n| SlidingWindow::new(n, hour).unwrap().with_policy(policy);
        threads_never_overspend(
            &CasLimiter::<u64, _, _>::with_clock(sliding(1), ManualClock::default()),
            &Quotas {
                user: sliding(5),
                org: sliding(7),
                global: sliding(12),
            },
            limits,
            policy == Policy::Leaky,
        );
    }
}

/// The levels as limiters of their own (one `DirectLimiter` each: a global limit per level),
/// from 8 threads: the same bounds, and each limiter left with exactly its admitted charges.
// Pins G78.
#[test]
fn levels_on_limiters_of_their_own_never_overspend() {
    let direct = |burst| {
        DirectLimiter::<Gcra, _>::with_clock(
            Gcra::new("1/h".parse().unwrap())
                .unwrap()
                .with_burst(burst)
                .unwrap(),
            ManualClock::default(),
        )
    };
    let users = [direct(5), direct(5), direct(5), direct(5)];
    let orgs = [direct(7), direct(7)];
    let global = direct(12);
    let admitted: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
    let walk = |user: usize| {
        let levels = [
            (&users[user], &(), None),
            (&orgs[user / 2], &(), None),
            (&global, &(), None),
        ];
        check_all(&levels, 1).unwrap().1
    };
    thread::scope(|s| {
        for t in 0..8usize {
            let (walk, admitted) = (&walk, &admitted);
            s.spawn(move || {
                for i in 0..100 {
                    let user = (t + i) % 4;
                    if walk(user).is_allowed() {
                        admitted[user].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    for (user, count) in admitted.iter().enumerate() {
        while walk(user).is_allowed() {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
    let admitted: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    assert_eq!(admitted.iter().sum::<u64>(), 12, "{admitted:?}");
    let left = |l: &DirectLimiter<Gcra, ManualClock>| {
        let d = l.request(&()).peek().unwrap();
        d.remaining().unwrap() + u64::from(d.is_allowed())
    };
    for (level, spent) in users.iter().zip(&admitted) {
        assert_eq!(left(level), 5 - spent, "{admitted:?}");
    }
    for org in 0..2 {
        let spent = admitted[2 * org] + admitted[2 * org + 1];
        assert!(spent <= 7, "{admitted:?}");
        assert_eq!(left(&orgs[org]), 7 - spent);
    }
    assert_eq!(left(&global), 0);
}

/// A request denied by one level leaves every other level's state exactly as it was, for
/// the decaying rates too (a refund after a take would only nearly undo their charges: the
/// exponential's over-refunds a lone request, handing budget back): each level is read
/// before any is charged.
// Pins G78.
#[test]
fn a_denial_touches_no_other_level_for_every_algorithm() {
    fn untouched<A: Algorithm>(user: A, org: A) {
        let clock = ManualClock::default();
        let users = CasLimiter::<u64, A, _>::with_clock(user, clock.clone());
        let orgs = CasLimiter::<u64, A, _>::with_clock(org, clock.clone());
        let levels = |u: &'static u64| [(&users, u, None), (&orgs, &10, None)];
        // Alice's requests, below her own rate, until her organisation denies.
        let mut steps = 0;
        while check_all(&levels(&0), 1).unwrap().1.is_allowed() {
            clock.advance(Duration::from_millis(300));
            steps += 1;
            assert!(steps < 1_000, "the organisation never denies");
        }
        clock.advance(Duration::from_millis(700));
        // Bob's state after a lone request of his, a while ago.
        assert!(users.check(&1).is_allowed());
        clock.advance(Duration::from_millis(400));
        let before = users.request(&1).peek().unwrap();
        let (level, d) = check_all(&levels(&1), 1).unwrap();
        assert_eq!(
            (level, d.is_allowed()),
            (1, false),
            "the organisation denies"
        );
        assert_eq!(users.request(&1).peek().unwrap(), before);
    }
    // The organisation's quotas recover over a minute: still spent when bob asks.
    untouched::<Gcra>(
        "4/s burst 3".parse().unwrap(),
        "1/min burst 4".parse().unwrap(),
    );
    let exp = |limit, secs| Exponential::new(limit, Duration::from_secs(secs)).unwrap();
    untouched(exp(4.0, 1), exp(3.0, 60));
    let earrrl =
        |secs, r: &str| Earrrl::new(Duration::from_secs(secs), r.parse().unwrap()).unwrap();
    untouched(earrrl(1, "4/s"), earrrl(60, "1/s"));
    let window = |n, secs| SlidingWindow::new(n, Duration::from_secs(secs)).unwrap();
    untouched(window(4, 1), window(3, 60));
}

/// What a caller sees of a decision: allowed, its wait, what remains.
type Seen = (bool, Duration, Option<u64>);

fn seen(d: &Decision) -> Seen {
    (d.is_allowed(), d.retry_after(), d.remaining())
}

/// The sequential model: one exact limiter per level, a request admitted iff every level's
/// peek admits it, then checked on each; denied, checked on the first denying level only (its
/// policy's own answer to a denial), its wait the longest of its own and the later levels'.
/// The level that decides: the first that denied, or the tightest that admitted (the least
/// remaining, the first of equals).
struct Model {
    levels: Vec<CasLimiter<u64, Gcra, ManualClock>>,
}

impl Model {
    fn decide(&self, keys: &[u64; 3], cost: u64) -> (usize, Seen) {
        let peeks: Vec<Decision> = self
            .levels
            .iter()
            .zip(keys)
            .map(|(l, k)| l.request(k).cost(cost).peek().unwrap())
            .collect();
        if let Some(i) = peeks.iter().position(|d| d.is_denied()) {
            let d = self.levels[i].check_n(&keys[i], cost).unwrap();
            let longest = peeks[i + 1..]
                .iter()
                .map(|d| d.retry_after())
                .fold(d.retry_after(), Duration::max);
            return (i, (false, longest, d.remaining()));
        }
        let checked: Vec<Decision> = self
            .levels
            .iter()
            .zip(keys)
            .map(|(l, k)| l.check_n(k, cost).unwrap())
            .collect();
        let left = |d: &Decision| d.remaining().unwrap_or(u64::MAX);
        let mut best = 0;
        for (i, d) in checked.iter().enumerate() {
            if left(d) < left(&checked[best]) {
                best = i;
            }
        }
        (best, seen(&checked[best]))
    }
}

// Pins G78.
#[test]
fn each_answer_is_the_sequential_models() {
    for policy in [Policy::Leaky, Policy::Strict] {
        let quota = |s: &str| s.parse::<Gcra>().unwrap().with_policy(policy);
        let q = Quotas {
            user: quota("5/s burst 3"),
            org: quota("8/s burst 5"),
            global: quota("12/s burst 8"),
        };
        let clock = ManualClock::default();
        let l = CasLimiter::<u64, _, _>::with_clock(q.user, clock.clone());
        let model = Model {
            levels: [q.user, q.org, q.global]
                .map(|g| CasLimiter::with_clock(g, clock.clone()))
                .into(),
        };
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let (mut admitted, mut denied) = (0, 0);
        for step in 0..3_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Strict counts every denial: slower traffic, or every key stays locked out.
            match policy {
                Policy::Leaky if seed % 5 == 0 => clock.advance(Duration::from_millis(seed % 300)),
                Policy::Strict => clock.advance(Duration::from_millis(seed % 250)),
                _ => {}
            }
            let user = seed >> 8 & 3;
            let cost = 1 + (seed >> 16) % 2;
            let keys = keys_of(user);
            let (level, got) = check_all(&levels(&l, &q, &keys), cost).unwrap();
            let want = model.decide(&keys, cost);
            assert_eq!((level, seen(&got)), want, "step {step} ({policy})");
            if got.is_allowed() {
                admitted += 1;
            } else {
                denied += 1;
            }
        }
        assert!(
            admitted > 300 && denied > 300,
            "{policy}: {admitted} {denied}"
        );
    }
}

/// A limiter whose read always admits: its take alone decides, so a level denies only after
/// the levels before it were taken (the race `check_all` refunds for), made certain.
struct ReadAdmits<'a>(&'a CasLimiter<u64, Gcra, ManualClock>);

impl Requests<u64> for ReadAdmits<'_> {
    type Algo = Gcra;
    type Error = QuotaError;

    fn decide(&self, key: &u64, ask: Ask<'_, Gcra>) -> Result<Decision, QuotaError> {
        self.0.decide(key, ask)
    }

    fn peek(&self, _: &u64, _: Ask<'_, Gcra>) -> Result<Decision, QuotaError> {
        Ok(Decision::allowed())
    }

    fn up_to(&self, key: &u64, ask: Ask<'_, Gcra>) -> Result<(u64, Decision), QuotaError> {
        self.0.up_to(key, ask)
    }

    fn take(&self, key: &u64, ask: Ask<'_, Gcra>) -> Result<Ticket, QuotaError> {
        self.0.take(key, ask)
    }

    fn settle(
        &self,
        key: &u64,
        ticket: &mut Ticket,
        actual: u64,
        ask: Ask<'_, Gcra>,
    ) -> Result<bool, QuotaError> {
        self.0.settle(key, ticket, actual, ask)
    }
}

/// A hierarchy as deep as a caller makes it: 200,000 levels, checked on a thread of 256 KiB
/// of stack (a frame a level would overflow it and abort the process). Admitted, each level
/// is charged once; when the last level's take denies, every level before it is given its
/// charge back.
// Pins G78.
#[test]
fn a_hierarchy_of_any_depth_is_checked_in_bounded_stack() {
    const DEPTH: u64 = 200_000;
    let run = || {
        let clock = ManualClock::default();
        let l = CasLimiter::<u64, Gcra, _>::with_clock("1/h burst 2".parse().unwrap(), clock);
        let keys: Vec<u64> = (0..DEPTH).collect();
        let read_admits = ReadAdmits(&l);
        let levels: Vec<_> = keys.iter().map(|k| (&read_admits, k, None)).collect();
        let (_, first) = check_all(&levels, 1).unwrap();
        assert!(first.is_allowed());
        // The last level spent by a request of its own: its take denies.
        assert!(l.check(&(DEPTH - 1)).is_allowed());
        let (level, denied) = check_all(&levels, 1).unwrap();
        assert_eq!((level as u64, denied.is_allowed()), (DEPTH - 1, false));
        // Every other level holds exactly the first request's charge: one of two left.
        for key in [0, 1, DEPTH / 2, DEPTH - 2] {
            assert_eq!(
                l.request(&key).peek().unwrap().remaining(),
                Some(0),
                "{key}"
            );
            assert!(l.request(&key).peek().unwrap().is_allowed(), "{key}");
        }
    };
    thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(run)
        .unwrap()
        .join()
        .unwrap();
}
