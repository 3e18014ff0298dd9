//! Settle, partial grants and per-request quotas on the Redis backend, against a real
//! `redis-server` and a real 3-node Redis Cluster that the tests start: random traces of
//! takes, refunds, overruns, repeated settles, partial grants and checks under another plan
//! decide in Redis as in memory (every algorithm, both policies), and a settle retried after
//! a lost reply applies once. Without `redis-server` the tests print why and pass, unless
//! `HOTLIMIT_REQUIRE_REDIS=1` (set by `.ci/run`).

use hotlimit::algo::{
    Earrrl, Exponential, FixedWindow, Gcra, InFlight, SlidingLog, SlidingWindow, SubWindow,
};
use hotlimit::redis::{
    BackendError, RedisAlgorithm, RedisLimiter, MARK_CLOCK_MARGIN, SETTLE_MARK_TTL,
};
use hotlimit::Ticket;
use hotlimit::{CasLimiter, ConfigError, Decision, ManualClock, Policy, QuotaError, Rate};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

mod redis_server;
use hotlimit::RateLimiter;
use hotlimit::Requests;
use redis_server::{close, Cluster, Server};

/// How two decisions must agree: exactly, or (EARRRL, exponential) to the last bits.
#[derive(Clone, Copy)]
enum Agree {
    Exact,
    Close,
}

impl Agree {
    fn check(self, what: &str, m: &Decision, r: &Decision) {
        match self {
            Agree::Exact => assert_eq!(m, r, "{what}"),
            Agree::Close => {
                assert_eq!(m.is_allowed(), r.is_allowed(), "{what}: {m:?} vs {r:?}");
                close(0, m, r);
            }
        }
    }
}

/// A prefix no other run used: the servers outlive a run.
fn prefix() -> String {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("settle{run}:")
}

/// A random trace on three keys, run through the in-memory limiter and the Redis one at the
/// same explicit times: takes (tickets kept in pairs), settles of a random ticket (refunds,
/// overruns, the estimate itself; a ticket settled before must change nothing in both),
/// partial grants, and checks under `plan`. Every decision and every settle's answer must
/// agree. Returns how many takes were admitted and denied.
fn run_trace<A>(url: &str, algo: A, plan: A, seed: u64, agree: Agree) -> (usize, usize)
where
    A: RedisAlgorithm + Copy,
{
    let clock = ManualClock::default();
    let mem = CasLimiter::<String, A, _>::with_clock(algo, clock.clone());
    let red = RedisLimiter::builder(url, algo)
        .key_prefix(prefix())
        .build()
        .unwrap();
    let keys = ["a", "b", "c"];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 1_000_000_000u64;
    let mut tickets: Vec<(&str, Ticket, Ticket)> = Vec::new();
    let (mut admitted, mut denied) = (0, 0);
    let most = algo.capacity().min(6);
    for i in 0..600 {
        if rng.random_bool(0.4) {
            t += rng.random_range(0..400_000_000);
        }
        clock.set(Duration::from_nanos(t));
        let key = keys[rng.random_range(0..3)];
        let what = format!("step {i} at {t} on {key}");
        match rng.random_range(0..10) {
            0..=3 => {
                let cost = rng.random_range(1..=most);
                let m = mem.request(key).cost(cost).take().unwrap();
                let r = red.request(key).cost(cost).at(t).take().unwrap();
                agree.check(&what, &m.decision(), &r.decision());
                assert_eq!(r.taken_at(), t, "{what}");
                if m.decision().is_allowed() {
                    admitted += 1;
                } else {
                    denied += 1;
                }
                tickets.push((key, m, r));
            }
            4..=6 if !tickets.is_empty() => {
                let pick = rng.random_range(0..tickets.len());
                let (key, m, r) = &mut tickets[pick];
                let actual = match rng.random_range(0..3) {
                    0 => rng.random_range(0..m.charged()),
                    1 => m.charged() + rng.random_range(1..=most),
                    _ => m.charged(),
                };
                let ms = mem.request(*key).settle(m, actual).unwrap();
                let rs = red.request(key).at(t).settle(r, actual).unwrap();
                assert_eq!(ms, rs, "{what}: settle {pick} with {actual}");
                assert!(!r.is_open(), "{what}");
            }
            7 => {
                let n = rng.random_range(1..=most + 2);
                let (mg, md) = mem.request(key).cost(n).up_to().unwrap();
                let (rg, rd) = red.request(key).cost(n).at(t).up_to().unwrap();
                assert_eq!(mg, rg, "{what}: up to {n}");
                agree.check(&what, &md, &rd);
            }
            _ => {
                let cost = rng.random_range(1..=plan.capacity().min(most));
                let m = mem.request(key).cost(cost).quota(&plan).check().unwrap();
                let r = red
                    .request(key)
                    .cost(cost)
                    .quota(&plan)
                    .at(t)
                    .check()
                    .unwrap();
                agree.check(&what, &m, &r);
            }
        }
        if i % 7 == 0 {
            // The states agree, as what a peek reads.
            let m = mem.request(key).peek().unwrap();
            let r = red.request(key).at(t).peek().unwrap();
            agree.check(&format!("{what} (peek)"), &m, &r);
        }
    }
    (admitted, denied)
}

/// Every algorithm, both policies, through `url` (a server or a cluster node).
fn every_algorithm(url: &str) {
    let w = Duration::from_nanos(1_300_000_007);
    for policy in [Policy::Leaky, Policy::Strict] {
        let gcra: Gcra = "7/s burst 5".parse().unwrap();
        let pro: Gcra = "20/s burst 8".parse().unwrap();
        let runs = [
            (
                "gcra",
                run_trace(
                    url,
                    gcra.with_policy(policy),
                    pro.with_policy(policy),
                    1,
                    Agree::Exact,
                ),
            ),
            (
                "fixed window",
                run_trace(
                    url,
                    FixedWindow::new(10, w).unwrap().with_policy(policy),
                    FixedWindow::new(14, w).unwrap().with_policy(policy),
                    2,
                    Agree::Exact,
                ),
            ),
            (
                "sliding window",
                run_trace(
                    url,
                    SlidingWindow::new(10, w).unwrap().with_policy(policy),
                    SlidingWindow::new(6, w).unwrap().with_policy(policy),
                    3,
                    Agree::Exact,
                ),
            ),
            (
                "sub-window",
                run_trace(
                    url,
                    SubWindow::new(10, w, 5).unwrap().with_policy(policy),
                    SubWindow::new(16, w, 5).unwrap().with_policy(policy),
                    4,
                    Agree::Exact,
                ),
            ),
            (
                "sliding log",
                run_trace(
                    url,
                    SlidingLog::new(10, w).unwrap().with_policy(policy),
                    SlidingLog::new(13, w).unwrap().with_policy(policy),
                    5,
                    Agree::Exact,
                ),
            ),
            (
                "earrrl",
                run_trace(
                    url,
                    Earrrl::new(Duration::from_secs(1), "8/s".parse::<Rate>().unwrap())
                        .unwrap()
                        .with_policy(policy),
                    Earrrl::new(Duration::from_secs(1), "12/s".parse::<Rate>().unwrap())
                        .unwrap()
                        .with_policy(policy),
                    6,
                    Agree::Close,
                ),
            ),
            (
                "exponential",
                run_trace(
                    url,
                    Exponential::new(6.0, Duration::from_secs(1))
                        .unwrap()
                        .with_policy(policy),
                    Exponential::new(9.0, Duration::from_secs(1))
                        .unwrap()
                        .with_policy(policy),
                    7,
                    Agree::Close,
                ),
            ),
        ];
        for (name, (admitted, denied)) in runs {
            // Both sides of the limit are exercised.
            assert!(
                admitted > 20 && denied > 20,
                "{name} {policy}: {admitted} {denied}"
            );
        }
    }
    // In-flight permits (always leaky): takes hold, settles give back (a settle of 0 all of
    // them), the trace's ~50 s cross many epochs of 5 s, so leases expire on both sides too;
    // a plan of a smaller `max`.
    // The trace's overruns hold permits until their epoch ends, so most takes are denied.
    let lease = Duration::from_secs(10);
    let (admitted, denied) = run_trace(
        url,
        InFlight::new(12, lease).unwrap(),
        InFlight::new(8, lease).unwrap(),
        8,
        Agree::Exact,
    );
    assert!(
        admitted > 20 && denied > 20,
        "in flight: {admitted} {denied}"
    );
}

// Pins G44, G76.
#[test]
fn settle_grants_and_plans_decide_as_in_memory_on_one_server() {
    let Some(server) = Server::start() else {
        return;
    };
    every_algorithm(&server.url());
}

// Pins G44.
#[test]
fn settle_grants_and_plans_decide_as_in_memory_on_a_cluster() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    every_algorithm(&cluster.url(0));
}

/// The lost reply: the server is frozen while a settle is in flight, so the client times out
/// and the ticket stays open; the frozen server then runs the settle anyway. The retry finds
/// the reservation's mark and changes nothing: one refund, not two.
// Pins G44.
#[test]
fn a_settle_retried_after_a_lost_reply_refunds_once() {
    let Some(server) = Server::start() else {
        return;
    };
    let gcra: Gcra = "10/s burst 10".parse().unwrap();
    let red = RedisLimiter::builder(server.url(), gcra)
        .key_prefix(prefix())
        .io_timeout(Duration::from_millis(200))
        .reconnect_after(Duration::from_millis(1))
        .build()
        .unwrap();
    let t = 5_000_000_000;
    let mut ticket = red.request("k").cost(8).at(t).take().unwrap();
    server.signal("-STOP");
    let lost = red.request("k").at(t).settle(&mut ticket, 2);
    assert!(matches!(lost, Err(ref e) if e.is_outage()), "{lost:?}");
    assert!(
        ticket.is_open(),
        "a failed settle leaves the ticket to retry"
    );
    server.signal("-CONT");
    // The frozen settle ran when the server resumed: its mark is there, so the retry is a
    // no-op (false), and the key holds exactly one refund: 10 − 2 − the peeked unit.
    let retried = loop {
        match red.request("k").at(t).settle(&mut ticket, 2) {
            Err(e) if e.is_outage() => std::thread::sleep(Duration::from_millis(5)),
            other => break other.unwrap(),
        }
    };
    assert!(!retried, "the first attempt had settled it");
    assert!(!ticket.is_open());
    assert_eq!(red.request("k").at(t).peek().unwrap().remaining(), Some(7));
    // The mark expires on its own, the ticket's 60 s and the 5 s margin for the settlers'
    // clocks after the settle: a process 5 s behind still finds it while it takes the
    // ticket for younger than 60 s.
    let ttl = mark_ttl(&server, &red.redis_key("k"));
    let covers = (SETTLE_MARK_TTL + MARK_CLOCK_MARGIN).as_millis() as i64;
    assert!(
        ttl > SETTLE_MARK_TTL.as_millis() as i64 && ttl <= covers,
        "{ttl}"
    );
}

/// A settle whose script fails (the key's state overwritten by a value of another type:
/// WRONGTYPE) is an error that leaves no settle mark: once the key is readable again, its
/// retry refunds (the mark was set before the script ran, so the retry found it and the
/// refund was lost).
// Pins G44.
#[test]
fn a_settle_that_failed_in_its_script_can_be_retried() {
    let Some(server) = Server::start() else {
        return;
    };
    let gcra: Gcra = "10/s burst 10".parse().unwrap();
    let red = RedisLimiter::builder(server.url(), gcra)
        .key_prefix(prefix())
        .build()
        .unwrap();
    let t = 5_000_000_000;
    let mut ticket = red.request("k").cost(8).at(t).take().unwrap();
    let key = red.redis_key("k");
    let mut raw = server.raw();
    let state: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut raw).unwrap();
    let _: () = redis::cmd("DEL").arg(&key).query(&mut raw).unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("f")
        .arg("v")
        .query(&mut raw)
        .unwrap();
    let failed = red.request("k").at(t).settle(&mut ticket, 2);
    assert!(matches!(failed, Err(ref e) if !e.is_outage()), "{failed:?}");
    assert!(ticket.is_open());
    let _: () = redis::cmd("DEL").arg(&key).query(&mut raw).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg(&key)
        .arg(0)
        .arg(state)
        .query(&mut raw)
        .unwrap();
    assert!(red.request("k").at(t).settle(&mut ticket, 2).unwrap());
    // 10 − 2 − the peeked unit.
    assert_eq!(red.request("k").at(t).peek().unwrap().remaining(), Some(7));
}

/// The expiry (ms) of the one settle mark of the Redis key `key`.
fn mark_ttl(server: &Server, key: &str) -> i64 {
    let mut raw = server.raw();
    let marks: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{key}*:s:*"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(marks.len(), 1, "{marks:?}");
    redis::cmd("PTTL").arg(&marks[0]).query(&mut raw).unwrap()
}

/// The answers without a round trip, and the errors: a settle at the charged cost, a denied
/// ticket, a plan of another window, a grant of zero.
// Pins G44.
#[test]
fn settle_and_plan_edges() {
    let Some(server) = Server::start() else {
        return;
    };
    let w = Duration::from_secs(1);
    let red = RedisLimiter::builder(server.url(), FixedWindow::new(3, w).unwrap())
        .key_prefix(prefix())
        .build()
        .unwrap();
    let t = 1_000_000_000;
    let mut ticket = red.request("k").cost(3).at(t).take().unwrap();
    let trips = red.stats().round_trips;
    // Another key, another prefix, an in-memory ticket: errors, nothing sent, still open.
    assert!(matches!(
        red.request("j").at(t).settle(&mut ticket, 0),
        Err(BackendError::TicketForOtherKey)
    ));
    let elsewhere = RedisLimiter::builder(server.url(), FixedWindow::new(3, w).unwrap())
        .key_prefix(prefix())
        .build()
        .unwrap();
    assert!(matches!(
        elsewhere.request("k").at(t).settle(&mut ticket, 0),
        Err(BackendError::TicketForOtherKey)
    ));
    let mem = CasLimiter::<String, _>::new(FixedWindow::new(3, w).unwrap());
    let mut foreign = mem.request("k").take().unwrap();
    assert!(matches!(
        red.request("k").at(t).settle(&mut foreign, 0),
        Err(BackendError::TicketFromOtherLimiter)
    ));
    assert!(ticket.is_open());
    assert!(red.request("k").at(t).settle(&mut ticket, 3).unwrap());
    assert!(!red.request("k").at(t).settle(&mut ticket, 1).unwrap());
    assert_eq!(red.stats().round_trips, trips, "neither needed Redis");
    let mut denied = red.request("k").at(t).take().unwrap();
    assert!(denied.decision().is_denied() && !denied.is_open());
    assert!(!red.request("k").at(t).settle(&mut denied, 0).unwrap());
    let other = FixedWindow::new(3, w * 2).unwrap();
    assert!(matches!(
        red.request("k").quota(&other).at(t).check(),
        Err(BackendError::Config(ConfigError::Unchangeable { .. }))
    ));
    assert!(matches!(
        red.request("k").cost(0).at(t).up_to(),
        Err(BackendError::Cost(hotlimit::QuotaError::ZeroCost))
    ));
    assert_eq!(
        red.stats().round_trips,
        trips + 1,
        "errors are found before a round trip"
    );
    // A grant above the capacity is capped at it, in the next window.
    let (granted, d) = red
        .request("k")
        .cost(50)
        .at(t + 1_000_000_000)
        .up_to()
        .unwrap();
    assert_eq!((granted, d.remaining()), (3, Some(0)));
}

/// On Redis' own clock: a refund comes back and an overrun is a debt, exactly for GCRA.
// Pins G40.
#[test]
fn settle_on_the_server_clock() {
    let Some(server) = Server::start() else {
        return;
    };
    let gcra: Gcra = "1/min burst 10".parse().unwrap();
    let red = RedisLimiter::builder(server.url(), gcra)
        .key_prefix(prefix())
        .build()
        .unwrap();
    let mut ticket = red.request("k").cost(6).take().unwrap();
    assert!(ticket.decision().is_allowed() && ticket.taken_at() > 0);
    assert!(red.request("k").settle(&mut ticket, 1).unwrap());
    assert_eq!(red.request("k").peek().unwrap().remaining(), Some(8));
    let mut ticket = red.request("k").cost(9).take().unwrap();
    assert!(red.request("k").settle(&mut ticket, 12).unwrap());
    // 1 + 12 spent of 10: a debt: 4 minutes until one unit fits the burst again (within a second of it).
    let d = red.request("k").peek().unwrap();
    assert!(d.is_denied());
    let wait = d.retry_after().as_secs_f64();
    assert!((239.0..=241.0).contains(&wait), "{wait}");
}

/// A settle whose debt the clock could not hold (GCRA: more than `CLOCK_MAX / T` units past
/// the charge; `u64::MAX` here) is a cost error over Redis as in memory: nothing sent, the
/// ticket still open, and a sane settle then applies.
// Pins G44.
#[test]
fn a_debt_past_the_clock_is_an_error_and_changes_nothing() {
    let Some(server) = Server::start() else {
        return;
    };
    let gcra: Gcra = "10/s burst 5".parse().unwrap();
    let red = RedisLimiter::builder(server.url(), gcra)
        .key_prefix(prefix())
        .build()
        .unwrap();
    let t = 1_000_000_000;
    let mut ticket = red.request("k").cost(2).at(t).take().unwrap();
    let trips = red.stats().round_trips;
    let limit = 2 + hotlimit::algo::CLOCK_MAX / 100_000_000;
    match red.request("k").at(t).settle(&mut ticket, u64::MAX) {
        Err(BackendError::Cost(QuotaError::ExceedsCapacity { cost, capacity })) => {
            assert_eq!((cost, capacity), (u64::MAX, limit));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(red.stats().round_trips, trips, "nothing sent");
    assert!(ticket.is_open());
    assert!(red.request("k").at(t).settle(&mut ticket, 3).unwrap());
    // 3 of the burst of 5 spent at t: 2 left.
    let d = red.request("k").at(t).peek().unwrap();
    assert_eq!(d.remaining(), Some(1)); // 5 − 3 − the peeked unit
}

/// A permit taken on a clock behind its key's epoch (a failover to a node whose clock is
/// behind) is counted in the key's epoch, an epoch after its ticket's; its release frees it,
/// in Redis as in memory (it looked in the ticket's epoch only, and kept it to its lease).
// Pins G76.
#[test]
fn a_permit_counted_after_its_tickets_epoch_is_released_as_in_memory() {
    let Some(server) = Server::start() else {
        return;
    };
    let permits = InFlight::new(2, Duration::from_secs(20)).unwrap();
    let clock = ManualClock::default();
    let mem = CasLimiter::<String, InFlight, _>::with_clock(permits, clock.clone());
    let red = RedisLimiter::builder(server.url(), permits)
        .key_prefix(prefix())
        .build()
        .unwrap();
    let s = 1_000_000_000u64;
    let mut held = Vec::new();
    // Epoch 1 (10-20 s), then 9 s: behind it.
    for t in [10 * s, 9 * s] {
        clock.set(Duration::from_nanos(t));
        let (m, r) = (
            mem.request("k").take().unwrap(),
            red.request("k").at(t).take().unwrap(),
        );
        assert!(
            m.decision().is_allowed() && r.decision().is_allowed(),
            "{t}"
        );
        assert_eq!(m.decision(), r.decision(), "{t}");
        held.push((m, r));
    }
    let (mut m, mut r) = held.pop().unwrap();
    clock.set(Duration::from_nanos(11 * s));
    assert_eq!(
        mem.request("k").settle(&mut m, 0).unwrap(),
        red.request("k").at(11 * s).settle(&mut r, 0).unwrap()
    );
    // One permit free again (a peek of one admitted, none left after it), the other held.
    let (m, r) = (
        mem.request("k").peek().unwrap(),
        red.request("k").at(11 * s).peek().unwrap(),
    );
    assert!(m.is_allowed(), "{m:?}");
    assert_eq!(m.remaining(), Some(0));
    assert_eq!(m, r);
}

/// The child process of `a_killed_holders_permit_comes_back_by_its_lease`: takes a permit on
/// the server `HOTLIMIT_PERMIT_CHILD` names, on the server's clock (and one at an explicit
/// time, `HOTLIMIT_PERMIT_AT`), says so, and waits to be killed, never giving either back.
#[test]
#[ignore = "the child process of a_killed_holders_permit_comes_back_by_its_lease"]
fn in_flight_child_holds_until_killed() {
    let Ok(url) = std::env::var("HOTLIMIT_PERMIT_CHILD") else {
        return;
    };
    let at: u64 = std::env::var("HOTLIMIT_PERMIT_AT")
        .unwrap()
        .parse()
        .unwrap();
    let red = RedisLimiter::builder(url, InFlight::new(1, Duration::from_secs(10)).unwrap())
        .key_prefix("killed:")
        .build()
        .unwrap();
    let server_time = red.request("job").take().unwrap();
    let explicit = red.request("replayed").at(at).take().unwrap();
    assert!(server_time.decision().is_allowed() && explicit.decision().is_allowed());
    // The tickets are kept, never settled: the process dies holding both permits.
    redis_server::hold_until_killed((server_time, explicit))
}

/// A process holding a permit over Redis is killed (SIGKILL: no drop, no settle). Its permit
/// stays held, and comes back by its lease alone: on an explicit timeline, held until half a
/// lease after it was taken at the earliest and free a lease after at the latest; on the
/// server's clock its key carries an expiry within the lease, so Redis drops it by itself.
// Pins G76.
#[test]
fn a_killed_holders_permit_comes_back_by_its_lease() {
    let Some(server) = Server::start() else {
        return;
    };
    let lease = Duration::from_secs(10);
    let at = 7_000_000_000u64; // epoch 1 of 5 s: expires when epoch 3 begins, at 15 s
    redis_server::killed_once_held(
        "in_flight_child_holds_until_killed",
        &[
            ("HOTLIMIT_PERMIT_CHILD", server.url()),
            ("HOTLIMIT_PERMIT_AT", at.to_string()),
        ],
    );
    let red = RedisLimiter::builder(server.url(), InFlight::new(1, lease).unwrap())
        .key_prefix("killed:")
        .build()
        .unwrap();
    let taken = |key: &str, t: Option<u64>| {
        let request = red.request(key);
        let request = match t {
            Some(t) => request.at(t),
            None => request,
        };
        request.peek().unwrap().is_allowed()
    };
    // Still held after its holder died: nothing gave it back.
    assert!(!taken("job", None));
    assert!(!taken("replayed", Some(at)));
    assert!(!taken("replayed", Some(at + 5_000_000_000))); // half a lease after: epoch 2
    assert!(!taken("replayed", Some(14_999_999_999)));
    assert!(taken("replayed", Some(15_000_000_000))); // within a lease of 7 s: free
    assert!(taken("replayed", Some(at + 10_000_000_000)));
    // On the server's clock the key itself expires within the lease.
    let mut raw = server.raw();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("killed:*job*")
        .query(&mut raw)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let pttl: i64 = redis::cmd("PTTL").arg(&keys[0]).query(&mut raw).unwrap();
    assert!(
        pttl > 0 && pttl <= lease.as_millis() as i64,
        "the held key's expiry: {pttl} ms"
    );
}

/// A permit's ticket may live as long as its lease (a long request's release must land), so
/// its settle mark, which makes a retried or replayed settle a no-op, lives as long. Other
/// algorithms' marks keep their 60 s (`a_settle_retried_after_a_lost_reply_refunds_once`).
// Pins G76.
#[test]
fn a_permits_settle_mark_lives_as_long_as_its_lease() {
    let Some(server) = Server::start() else {
        return;
    };
    let lease = Duration::from_secs(120);
    let red = RedisLimiter::builder(server.url(), InFlight::new(1, lease).unwrap())
        .key_prefix(prefix())
        .build()
        .unwrap();
    let mut ticket = red.request("k").take().unwrap();
    assert!(red.request("k").peek().unwrap().is_denied());
    assert!(red.request("k").settle(&mut ticket, 0).unwrap());
    assert!(red.request("k").peek().unwrap().is_allowed());
    let pttl = mark_ttl(&server, &red.redis_key("k"));
    let covers = (lease + MARK_CLOCK_MARGIN).as_millis() as i64;
    assert!(
        pttl > 120_000 && pttl <= covers,
        "the mark's expiry: {pttl} ms"
    );
}

/// A take settled at 0 hands back what it took and nothing more, in Redis as in memory (the
/// exponential limiter's take stores a whole impulse, `Algorithm::take`): limit 10 a second,
/// a burst, a second's wait, a take of 10 settled at 0, and the next burst gets 6 through,
/// as a key that never took; the smoothed charge's full refund let all 10 through.
// Pins G44.
#[test]
fn a_take_refunded_in_full_hands_back_nothing_more_as_in_memory() {
    let Some(server) = Server::start() else {
        return;
    };
    let exp = Exponential::new(10.0, Duration::from_secs(1)).unwrap();
    let red = RedisLimiter::builder(server.url(), exp)
        .key_prefix(prefix())
        .build()
        .unwrap();
    let clock = ManualClock::default();
    let mem = CasLimiter::<String, _, _>::with_clock(exp, clock.clone());
    let s = 1_000_000_000u64;
    let burst = |key: &str, t: u64| {
        (0..100)
            .take_while(|_| red.request(key).at(t).check().unwrap().is_allowed())
            .count()
    };
    assert_eq!((burst("k", s), burst("twin", s)), (10, 10));
    let mut ticket = red.request("k").cost(10).at(2 * s).take().unwrap();
    assert!(ticket.decision().is_allowed());
    assert!(red.request("k").at(2 * s).settle(&mut ticket, 0).unwrap());
    // The same in memory, to the state's last bits: the next decision's measured rate.
    clock.set(Duration::from_secs(1));
    for _ in 0..10 {
        let _ = mem.check(&"k".to_string());
    }
    clock.set(Duration::from_secs(2));
    let mut ticket = mem.request("k").cost(10).take().unwrap();
    assert!(mem.request("k").settle(&mut ticket, 0).unwrap());
    let m = mem.request("k").peek().unwrap();
    let r = red.request("k").at(2 * s).peek().unwrap();
    close(0, &m, &r);
    assert_eq!((burst("k", 2 * s), burst("twin", 2 * s)), (6, 6));
}
