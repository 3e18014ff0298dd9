//! Hierarchies over Redis in one script call (`RedisLimiter::check_all`, issue #62), against a
//! real `redis-server` (or `valkey-server`, `HOTLIMIT_REDIS_SERVER`) and a real 3-node cluster
//! the tests start: request by request, every answer and every level's state is that of the
//! in-memory `check_all` (a sequential model of the levels), every algorithm, both policies;
//! from 8 clients at once no level is overspent and no level keeps a charge for a request
//! another denied; bad levels get typed errors. Without `redis-server` the tests print why
//! and pass, unless `HOTLIMIT_REQUIRE_REDIS=1` (set by `.ci/run`).

use hotlimit::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::redis::{BackendError, RedisAlgorithm, RedisLimiter};
use hotlimit::{CasLimiter, ConfigError, Decision, Field, ManualClock, Policy, QuotaError, Rate};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

mod redis_server;
use hotlimit::Requests;
use redis_server::{close, Cluster, Server};

/// A prefix no other run used (the servers outlive a run), holding a hash tag: on a cluster
/// every key of the limiter, so every level, lives in one slot.
fn prefix() -> String {
    static RUN: AtomicU32 = AtomicU32::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    format!("levels{run}:{{{}}}:", std::process::id())
}

/// Four users in two organisations under one global budget: user `u`'s levels are
/// `u<u>`, `o<u / 2>` and `g`.
fn keys_of(user: u64) -> [String; 3] {
    [
        format!("u{user}"),
        format!("o{}", user / 2),
        "g".to_string(),
    ]
}

/// The quotas of the three levels: user, organisation, global.
struct Quotas<A> {
    user: A,
    org: A,
    global: A,
}

impl<A> Quotas<A> {
    fn of(&self, level: usize) -> &A {
        [&self.user, &self.org, &self.global][level]
    }
}

/// The sequential model of a hierarchy on one exact in-memory limiter (levels are its keys,
/// each with its quota): a request is admitted iff every level's peek admits it, then taken
/// on each (`Algorithm::take`: a check's charge but for the exponential limiter's, a whole
/// impulse that a refund can undo exactly); denied, checked on the first denying level only (its policy's own answer to a
/// denial), its wait the longest of its own and the later levels'. The level that decides:
/// the first that denied, or the tightest that admitted (the least remaining, the first of
/// equals). Returns the level, the deciding level's decision and the wait the answer gives.
fn model<A: Algorithm + Copy>(
    mem: &CasLimiter<String, A, ManualClock>,
    keys: &[String; 3],
    q: &Quotas<A>,
    cost: u64,
) -> (usize, Decision, Duration) {
    let peeks: Vec<Decision> = (0..3)
        .map(|l| {
            mem.request(&keys[l])
                .quota(q.of(l))
                .cost(cost)
                .peek()
                .unwrap()
        })
        .collect();
    if let Some(i) = peeks.iter().position(|d| d.is_denied()) {
        let d = mem
            .request(&keys[i])
            .quota(q.of(i))
            .cost(cost)
            .check()
            .unwrap();
        let longest = peeks[i + 1..]
            .iter()
            .map(|d| d.retry_after())
            .fold(d.retry_after(), Duration::max);
        return (i, d, longest);
    }
    let checked: Vec<Decision> = (0..3)
        .map(|l| {
            let ticket = mem.request(&keys[l]).quota(q.of(l)).cost(cost).take();
            ticket.unwrap().decision()
        })
        .collect();
    let left = |d: &Decision| d.remaining().unwrap_or(u64::MAX);
    let mut best = 0;
    for (i, d) in checked.iter().enumerate() {
        if left(d) < left(&checked[best]) {
            best = i;
        }
    }
    (best, checked[best], checked[best].retry_after())
}

/// A random trace of hierarchy checks (random users, costs and times) through the
/// [`model`] and Redis' `check_all` at the same explicit times: every level, decision and
/// wait agrees, and so does every level's state as a peek reads it. Returns how many requests
/// were admitted and denied.
fn run_trace<A>(url: &str, q: &Quotas<A>, seed: u64, exact: bool, policy: Policy) -> (u32, u32)
where
    A: RedisAlgorithm + Copy,
{
    let clock = ManualClock::default();
    let mem = CasLimiter::<String, A, _>::with_clock(q.user, clock.clone());
    let red = RedisLimiter::builder(url, q.user)
        .key_prefix(prefix())
        .build()
        .unwrap();
    let agree = |what: &str, m: &Decision, r: &Decision| {
        if exact {
            assert_eq!(m, r, "{what}");
        } else {
            assert_eq!(m.is_allowed(), r.is_allowed(), "{what}: {m:?} vs {r:?}");
            close(0, m, r);
        }
    };
    let most = q.user.capacity().min(3);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 1_000_000_000u64;
    let (mut admitted, mut denied) = (0, 0);
    for i in 0..400 {
        // Strict counts every denial: slower traffic, or every key stays locked out.
        if policy == Policy::Strict {
            t += rng.random_range(0..600_000_000);
        } else if rng.random_bool(0.3) {
            t += rng.random_range(0..300_000_000);
        }
        clock.set(Duration::from_nanos(t));
        let user = rng.random_range(0..4);
        let keys = keys_of(user);
        let cost = rng.random_range(1..=most);
        let what = format!("step {i} at {t}: user {user}, cost {cost}");
        let (ml, m, wait) = model(&mem, &keys, q, cost);
        let levels: Vec<_> = (0..3).map(|l| (keys[l].as_str(), Some(q.of(l)))).collect();
        let (rl, r) = red.check_all(&levels, cost, Some(t)).unwrap();
        assert_eq!(ml, rl, "{what}: the deciding level ({m:?} vs {r:?})");
        assert_eq!(m.remaining(), r.remaining(), "{what}");
        if exact {
            assert_eq!(wait, r.retry_after(), "{what}");
        }
        if m.is_allowed() {
            agree(&what, &m, &r);
            admitted += 1;
        } else {
            denied += 1;
        }
        for (l, key) in keys.iter().enumerate() {
            let m = mem.request(key).quota(q.of(l)).peek().unwrap();
            let r = red.request(key).quota(q.of(l)).at(t).peek().unwrap();
            agree(&format!("{what}: level {l}'s state"), &m, &r);
        }
    }
    (admitted, denied)
}

/// Every algorithm, both policies: Redis answers as the in-memory hierarchy, and the traces
/// saw both answers from every level.
fn every_algorithm(url: &str) {
    let w = Duration::from_nanos(1_300_000_007);
    for policy in [Policy::Leaky, Policy::Strict] {
        let gcra = |s: &str| s.parse::<Gcra>().unwrap().with_policy(policy);
        let earrrl = |r: &str| {
            Earrrl::new(Duration::from_secs(1), r.parse::<Rate>().unwrap())
                .unwrap()
                .with_policy(policy)
        };
        let exp = |l: f64| {
            Exponential::new(l, Duration::from_secs(1))
                .unwrap()
                .with_policy(policy)
        };
        let runs = [
            (
                "gcra",
                run_trace(
                    url,
                    &Quotas {
                        user: gcra("3/s burst 4"),
                        org: gcra("5/s burst 6"),
                        global: gcra("8/s burst 9"),
                    },
                    1,
                    true,
                    policy,
                ),
            ),
            (
                "fixed window",
                run_trace(
                    url,
                    &Quotas {
                        user: FixedWindow::new(5, w).unwrap().with_policy(policy),
                        org: FixedWindow::new(8, w).unwrap().with_policy(policy),
                        global: FixedWindow::new(12, w).unwrap().with_policy(policy),
                    },
                    2,
                    true,
                    policy,
                ),
            ),
            (
                "sliding window",
                run_trace(
                    url,
                    &Quotas {
                        user: SlidingWindow::new(5, w).unwrap().with_policy(policy),
                        org: SlidingWindow::new(8, w).unwrap().with_policy(policy),
                        global: SlidingWindow::new(12, w).unwrap().with_policy(policy),
                    },
                    3,
                    true,
                    policy,
                ),
            ),
            (
                "sub-window",
                run_trace(
                    url,
                    &Quotas {
                        user: SubWindow::new(5, w, 5).unwrap().with_policy(policy),
                        org: SubWindow::new(8, w, 5).unwrap().with_policy(policy),
                        global: SubWindow::new(12, w, 5).unwrap().with_policy(policy),
                    },
                    4,
                    true,
                    policy,
                ),
            ),
            (
                "sliding log",
                run_trace(
                    url,
                    &Quotas {
                        user: SlidingLog::new(5, w).unwrap().with_policy(policy),
                        org: SlidingLog::new(8, w).unwrap().with_policy(policy),
                        global: SlidingLog::new(12, w).unwrap().with_policy(policy),
                    },
                    5,
                    true,
                    policy,
                ),
            ),
            (
                "earrrl",
                run_trace(
                    url,
                    &Quotas {
                        user: earrrl("3/s"),
                        org: earrrl("5/s"),
                        global: earrrl("8/s"),
                    },
                    6,
                    false,
                    policy,
                ),
            ),
            (
                "exponential",
                run_trace(
                    url,
                    &Quotas {
                        user: exp(3.0),
                        org: exp(5.0),
                        global: exp(8.0),
                    },
                    7,
                    false,
                    policy,
                ),
            ),
        ];
        for (name, (admitted, denied)) in runs {
            assert!(
                admitted > 40 && denied > 40,
                "{name} {policy:?}: {admitted} admitted, {denied} denied"
            );
        }
    }
}

// Pins G78.
#[test]
fn each_answer_is_the_in_memory_hierarchys_on_one_server() {
    let Some(server) = Server::start() else {
        return;
    };
    every_algorithm(&server.url());
}

// Pins G78.
#[test]
fn each_answer_is_the_in_memory_hierarchys_on_a_cluster() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    every_algorithm(&cluster.url(0));
}

/// 8 clients check random users' hierarchies at once on Redis' clock (quotas of one an hour,
/// so nothing refills during the test), then one drains every user until denied. No level
/// admits beyond its quota, and each level's state is exactly what its admitted requests
/// spent (leaky: a denial stores nothing, so no level kept a charge for a request another
/// denied); the global budget ends spent on admissions alone.
fn clients_never_overspend<A>(url: &str, q: &Quotas<A>, limits: [u64; 3])
where
    A: RedisAlgorithm + Sync,
{
    let red = RedisLimiter::builder(url, q.user.clone())
        .key_prefix(prefix())
        .build()
        .unwrap();
    let per_user: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
    let denied = AtomicU64::new(0);
    let check = |red: &RedisLimiter<A>, user: u64| {
        let keys = keys_of(user);
        let levels: Vec<_> = (0..3).map(|l| (keys[l].as_str(), Some(q.of(l)))).collect();
        red.check_all(&levels, 1, None).unwrap().1.is_allowed()
    };
    thread::scope(|s| {
        for t in 0..8u64 {
            let (per_user, denied) = (&per_user, &denied);
            let red = red.try_clone().unwrap();
            s.spawn(move || {
                for i in 0..60u64 {
                    let user = (t * 7 + i * 3) % 4;
                    if check(&red, user) {
                        per_user[user as usize].fetch_add(1, Ordering::Relaxed);
                    } else {
                        denied.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert!(denied.load(Ordering::Relaxed) > 0, "nothing contended");
    for user in 0..4 {
        while check(&red, user) {
            per_user[user as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
    let admitted: Vec<u64> = per_user.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let [user_limit, org_limit, global_limit] = limits;
    // What a level has left: a peek of one unit, plus that unit if admitted.
    let left = |key: &str, quota: &A| {
        let d = red.request(key).quota(quota).peek().unwrap();
        d.remaining().unwrap() + u64::from(d.is_allowed())
    };
    let total: u64 = admitted.iter().sum();
    assert_eq!(
        total, global_limit,
        "{admitted:?}: the global budget, spent exactly"
    );
    assert_eq!(left("g", &q.global), 0, "{admitted:?}");
    for user in 0..4u64 {
        let own = admitted[user as usize];
        let org = user / 2;
        let org_spent = admitted[2 * org as usize] + admitted[2 * org as usize + 1];
        assert!(own <= user_limit && org_spent <= org_limit, "{admitted:?}");
        assert_eq!(
            left(&format!("u{user}"), &q.user),
            user_limit - own,
            "{admitted:?}"
        );
        assert_eq!(
            left(&format!("o{org}"), &q.org),
            org_limit - org_spent,
            "{admitted:?}"
        );
    }
}

fn contended(url: &str) {
    clients_never_overspend(
        url,
        &Quotas {
            user: "1/h burst 5".parse::<Gcra>().unwrap(),
            org: "1/h burst 7".parse().unwrap(),
            global: "1/h burst 12".parse().unwrap(),
        },
        [5, 7, 12],
    );
    let hour = Duration::from_secs(3600);
    clients_never_overspend(
        url,
        &Quotas {
            user: SlidingWindow::new(5, hour).unwrap(),
            org: SlidingWindow::new(7, hour).unwrap(),
            global: SlidingWindow::new(12, hour).unwrap(),
        },
        [5, 7, 12],
    );
}

// Pins G78.
#[test]
fn clients_at_once_never_overspend_a_level_on_one_server() {
    let Some(server) = Server::start() else {
        return;
    };
    contended(&server.url());
}

// Pins G78.
#[test]
fn clients_at_once_never_overspend_a_level_on_a_cluster() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    contended(&cluster.url(0));
}

/// Bad levels are refused before anything is sent, each with its typed error, and nothing
/// is charged (G78); no levels at all is an allowed request; on a cluster, keys in several slots
/// (a prefix without a hash tag) are the cluster's `CROSSSLOT`, and nothing is charged.
#[test]
fn bad_levels_get_typed_errors_and_charge_nothing() {
    let Some(server) = Server::start() else {
        return;
    };
    let gcra: Gcra = "1/h burst 2".parse().unwrap();
    let red = RedisLimiter::builder(server.url(), gcra)
        .key_prefix(prefix())
        .build()
        .unwrap();
    assert_eq!(
        red.check_all(&[], 1, None).unwrap(),
        (0, Decision::allowed())
    );
    let twice = red.check_all(&[("a", None), ("b", None), ("a", None)], 1, None);
    assert!(
        matches!(
            twice,
            Err(BackendError::Config(ConfigError::Repeated {
                field: Field::Levels,
                ..
            }))
        ),
        "{twice:?}"
    );
    let big = red.check_all(&[("a", None), ("b", None)], 3, None);
    assert!(
        matches!(
            big,
            Err(BackendError::Cost(QuotaError::ExceedsCapacity { .. }))
        ),
        "{big:?}"
    );
    let late = red.check_all(&[("a", None)], 1, Some(u64::MAX));
    assert!(
        matches!(late, Err(BackendError::TimeOutOfRange(_))),
        "{late:?}"
    );
    let window = FixedWindow::new(2, Duration::from_secs(60)).unwrap();
    let windows = RedisLimiter::builder(server.url(), window)
        .key_prefix(prefix())
        .build()
        .unwrap();
    let other = FixedWindow::new(2, Duration::from_secs(30)).unwrap();
    let refused = windows.check_all(&[("a", None), ("b", Some(&other))], 1, None);
    assert!(
        matches!(
            refused,
            Err(BackendError::Config(ConfigError::Unchangeable { .. }))
        ),
        "{refused:?}"
    );
    // Nothing above was charged: both keys still have their whole burst.
    for key in ["a", "b"] {
        assert_eq!(
            red.request(key).peek().unwrap().remaining(),
            Some(1),
            "{key}"
        );
        assert_eq!(
            windows.request(key).peek().unwrap().remaining(),
            Some(1),
            "{key}"
        );
    }
    assert_eq!(
        red.check_all(&[("a", None), ("b", None)], 2, None)
            .unwrap()
            .0,
        0
    );
    assert!(red
        .check_all(&[("b", None), ("a", None)], 1, None)
        .unwrap()
        .1
        .is_denied());
    assert_eq!(
        red.check_all(&[("c", None), ("a", None)], 1, None)
            .unwrap()
            .0,
        1
    );
    assert_eq!(
        red.request("c").peek().unwrap().remaining(),
        Some(1),
        "c kept its unit"
    );

    let Some(cluster) = Cluster::start() else {
        return;
    };
    let spread = RedisLimiter::builder(cluster.url(0), gcra)
        .key_prefix(format!("spread{}:", std::process::id()))
        .build()
        .unwrap();
    let (a, b) = (
        (0..)
            .map(|i| format!("k{i}"))
            .find(|k| cluster.node_of(&spread.redis_key(k)) == 0)
            .unwrap(),
        (0..)
            .map(|i| format!("k{i}"))
            .find(|k| cluster.node_of(&spread.redis_key(k)) == 1)
            .unwrap(),
    );
    let crossed = spread.check_all(&[(&a, None), (&b, None)], 1, None);
    assert!(
        matches!(crossed, Err(BackendError::Script(_))),
        "{crossed:?}"
    );
    for key in [&a, &b] {
        assert_eq!(
            spread.request(key).peek().unwrap().remaining(),
            Some(1),
            "{key}"
        );
    }
}

/// The async client decides as the sync one, on the same keys.
#[cfg(feature = "redis-async")]
#[test]
fn the_async_client_decides_as_the_sync_one() {
    let Some(server) = Server::start() else {
        return;
    };
    let gcra: Gcra = "1/h burst 3".parse().unwrap();
    let org: Gcra = "1/h burst 4".parse().unwrap();
    let prefix = prefix();
    let sync = RedisLimiter::builder(server.url(), gcra)
        .key_prefix(prefix.clone())
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let answers = rt.block_on(async {
        let aio = RedisLimiter::builder(server.url(), gcra)
            .key_prefix(prefix)
            .build_async()
            .await
            .unwrap();
        let mut answers = Vec::new();
        for user in ["alice", "bob", "alice", "bob", "alice"] {
            let levels = [(user, None), ("acme", Some(&org))];
            let (level, d) = aio.check_all(&levels, 1, None).await.unwrap();
            answers.push((level, d.is_allowed(), d.remaining()));
        }
        answers
    });
    // alice 3 of her own, bob 1 before acme's 4 are spent.
    assert_eq!(
        answers,
        [
            (0, true, Some(2)),
            (0, true, Some(2)),
            (0, true, Some(1)),
            (1, true, Some(0)),
            (1, false, Some(0)),
        ]
    );
    // The sync client reads the same states: alice has 1 left, acme none.
    assert_eq!(sync.request("alice").peek().unwrap().remaining(), Some(0));
    let levels = [("carol", None), ("acme", Some(&org))];
    assert_eq!(sync.check_all(&levels, 1, None).unwrap().0, 1);
}
