//! The Redis backend against a real 3-node Redis Cluster that each test starts on 127.0.0.1
//! (free ports, a temp dir of its own, no persistence). Without `redis-server` and `redis-cli`
//! on the PATH the tests print why and pass, unless `HOTLIMIT_REQUIRE_REDIS=1`, which makes
//! that a failure.

use hotlimit::algo::{
    Algorithm, AllOf, Bias, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow,
    SubWindow,
};
use hotlimit::{
    redis::{FailMode, RedisAlgorithm, RedisLimiter},
    CasLimiter, Decision, ManualClock, Policy, Rate,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::time::{Duration, Instant};

mod redis_server;
use hotlimit::RateLimiter;
use hotlimit::Requests;
use redis_server::{close, Cluster};

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user{i}")).collect()
}

/// 1,000 keys through the standalone URL of one node: upgraded to a cluster client, every key
/// limited exactly, keys on all three nodes, no errors, no fail-mode decisions.
// Pins G39.
#[test]
fn standalone_url_is_upgraded_and_every_key_is_limited_exactly() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    // 1/h: no key expires during the test, so DBSIZE counts them all.
    let r = RedisLimiter::builder(cluster.url(1), "1/h burst 5".parse::<Gcra>().unwrap())
        .key_prefix("up:")
        .build()
        .unwrap();
    assert!(r.is_cluster());
    let keys = keys(1000);
    for key in &keys {
        let decisions: Vec<Decision> = (0..8)
            .map(|_| r.request(key).at(1_000_000_000).check().unwrap())
            .collect();
        let allowed = decisions.iter().filter(|d| d.is_allowed()).count();
        assert_eq!(allowed, 5, "{key}");
        assert!(decisions[..5].iter().all(Decision::is_allowed), "{key}");
        assert_eq!(decisions[5].retry_after(), Duration::from_secs(3600));
    }
    // Through check too (server time).
    for key in &keys[..50] {
        let key = format!("c{key}");
        let allowed = (0..6).filter(|_| r.check(&key).is_allowed()).count();
        assert_eq!(allowed, 5, "{key}");
    }
    assert_eq!((r.stats().errors, r.stats().failures), (0, 0));
    let mut per_node = [0usize; 3];
    for key in &keys {
        per_node[cluster.node_of(&r.redis_key(key))] += 1;
    }
    assert!(per_node.iter().all(|&n| n > 200), "{per_node:?}");
    let sizes: Vec<i64> = (0..3).map(|i| cluster.dbsize(i)).collect();
    assert_eq!(sizes.iter().sum::<i64>(), 1050, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n > 200), "{sizes:?}");
}

/// The hybrid limiter on a cluster: two instances lease from the same GCRA states (each
/// client key in its own slot, over all three nodes, a call per key per interval routed by
/// slot) and publish merged window counts; between them, exactly each quota.
// Pins G46, G48.
#[test]
fn hybrid_instances_share_each_limit_on_the_cluster() {
    use hotlimit::redis::{Fallback, HybridLimiter};
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let build = |i: usize| {
        HybridLimiter::builder(cluster.url(i), "1/h burst 5".parse::<Gcra>().unwrap())
            .redis(|r| r.key_prefix("hy:"))
            .sync_interval(Duration::from_millis(5))
            .fallback(Fallback::DENY)
            .build()
            .unwrap()
    };
    let (a, b) = (build(0), build(2));
    let keys = keys(60);
    let mut allowed: HashMap<&String, usize> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Rounds on both until every key has its 5: leases come a sync after the demand.
    while allowed.values().sum::<usize>() < 5 * keys.len() {
        assert!(
            Instant::now() < deadline,
            "{allowed:?} {:?} {:?}",
            a.stats(),
            b.last_error()
        );
        for key in &keys {
            for l in [&a, &b] {
                if l.check(key).is_allowed() {
                    *allowed.entry(key).or_default() += 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // A few more rounds: nothing more is ever admitted.
    for _ in 0..20 {
        for key in &keys {
            assert!(
                a.check(key).is_denied() && b.check(key).is_denied(),
                "{key}"
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(allowed.values().all(|&n| n == 5), "{allowed:?}");
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        (sa.errors, sa.failed_calls, sb.errors, sb.failed_calls),
        (0, 0, 0, 0)
    );
    let mut per_node = [0usize; 3];
    for key in &keys {
        per_node[cluster.node_of(&a.redis_key(key))] += 1;
    }
    assert!(per_node.iter().all(|&n| n > 5), "{per_node:?}");
}

/// The hash tag: one key's Redis key hashes by the escaped client key alone.
// Pins G39.
#[test]
fn redis_keys_carry_a_hash_tag() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let r = RedisLimiter::builder(cluster.url(0), "5/s".parse::<Gcra>().unwrap())
        .key_prefix("p:")
        .build()
        .unwrap();
    assert_eq!(r.redis_key("a"), "p:{a}");
    assert_eq!(r.redis_key(""), "p:{%}");
    assert_eq!(r.redis_key("%"), "p:{%25}");
    assert_eq!(r.redis_key("a}b{"), "p:{a%7Db{}");
    let slot = |k: &str| -> i64 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(k)
            .query(&mut cluster.raw(0))
            .unwrap()
    };
    assert_eq!(slot(&r.redis_key("user7")), slot("user7"));
    assert_eq!(slot(&(r.redis_key("user7") + ":n")), slot("user7"));
}

/// A batch over keys on every node, in order, with exact counts; twice, so the second batch
/// sees the first's state.
// Pins G45.
#[test]
fn pipelined_batches_across_nodes_count_exactly() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let gcra = Gcra::new("1/h".parse().unwrap())
        .unwrap()
        .with_burst(3)
        .unwrap();
    let r = RedisLimiter::builder(cluster.url(2), gcra)
        .key_prefix("pipe:")
        .build()
        .unwrap();
    let keys = keys(60);
    let nodes: std::collections::HashSet<usize> = keys
        .iter()
        .map(|k| cluster.node_of(&r.redis_key(k)))
        .collect();
    assert_eq!(nodes.len(), 3);
    // Each key twice per batch: 120 requests.
    let batch: Vec<(&str, u64)> = keys.iter().chain(&keys).map(|k| (k.as_str(), 1)).collect();
    let a = r.try_check_pipelined(&batch).unwrap();
    let b = r.try_check_pipelined(&batch).unwrap();
    assert!(a.iter().all(Decision::is_allowed));
    // The second batch: the first occurrence of each key is its third request (allowed),
    // the second its fourth (denied).
    assert!(b[..60].iter().all(Decision::is_allowed));
    assert!(b[60..].iter().all(Decision::is_denied));
    let mut allowed: HashMap<&str, usize> = HashMap::new();
    for ((k, _), d) in batch.iter().chain(&batch).zip(a.iter().chain(&b)) {
        *allowed.entry(k).or_default() += d.is_allowed() as usize;
    }
    assert!(allowed.values().all(|&n| n == 3), "{allowed:?}");
    assert_eq!((r.stats().errors, r.stats().failures), (0, 0));
    // Through `check_n_batch` (one `check_n` after another on a cluster): the same counts, on
    // keys of their own.
    let t = RedisLimiter::builder(cluster.url(0), gcra)
        .key_prefix("trait:")
        .build()
        .unwrap();
    let mut out = Vec::new();
    t.check_n_batch(batch.iter().copied(), &mut out);
    assert!(out.iter().all(|a| a.as_ref().is_ok_and(|d| d.is_allowed())));
    t.check_n_batch(batch.iter().copied(), &mut out);
    assert!(out[..60]
        .iter()
        .all(|a| a.as_ref().is_ok_and(|d| d.is_allowed())));
    assert!(out[60..]
        .iter()
        .all(|a| a.as_ref().is_ok_and(|d| d.is_denied())));
    assert_eq!((t.stats().errors, t.stats().failures), (0, 0));
}

/// The in-memory limiter and the cluster, at the same explicit times, over many keys.
fn compare<A: RedisAlgorithm + Algorithm + Clone>(
    cluster: &Cluster,
    algo: A,
    seed: u64,
    mean_gap: u64,
    max_cost: u64,
    same: impl Fn(usize, &Decision, &Decision),
) -> (usize, usize) {
    let keys = keys(40);
    let clock = ManualClock::default();
    let mem = CasLimiter::<String, _, _>::with_clock(algo.clone(), clock.clone());
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let red = RedisLimiter::builder(cluster.url(0), algo)
        .key_prefix(format!("trace{run}:"))
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 0u64;
    let (mut allowed, mut denied) = (0, 0);
    for i in 0..3000 {
        // Bursts at one instant and gaps; a few hot keys take most requests.
        if rng.random_bool(0.3) {
            t += rng.random_range(0..4 * mean_gap);
        }
        let key = if rng.random_bool(0.7) {
            &keys[rng.random_range(0..4)]
        } else {
            &keys[rng.random_range(0..keys.len())]
        };
        let cost = rng.random_range(1..=max_cost);
        clock.set(Duration::from_nanos(t));
        let m = mem.check_n(key, cost).unwrap();
        let r = red.request(key).cost(cost).at(t).check().unwrap();
        same(i, &m, &r);
        if m.is_allowed() {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    assert_eq!((red.stats().errors, red.stats().failures), (0, 0));
    (allowed, denied)
}

// Pins G38.
#[test]
fn same_decisions_as_in_memory_on_the_cluster() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    for policy in [Policy::Leaky, Policy::Strict] {
        let gcra: Gcra = "7/s burst 5".parse().unwrap();
        let (a, d) = compare(
            &cluster,
            gcra.with_policy(policy),
            1,
            315_000_000,
            5,
            |i, m, r| assert_eq!(m, r, "GCRA request {i} ({policy})"),
        );
        eprintln!("GCRA {policy}: {a} allowed, {d} denied");
        assert!(a > 300 && d > 300, "GCRA {policy}: {a} {d}");

        let e = Earrrl::new(
            Duration::from_secs(2),
            Rate::new(3.0, Duration::from_secs(1)).unwrap(),
        )
        .unwrap()
        .with_policy(policy);
        let (a, d) = compare(&cluster, e, 2, 130_000_000, 3, close);
        eprintln!("EARRRL {policy}: {a} allowed, {d} denied");
        assert!(a > 300 && d > 300, "EARRRL {policy}: {a} {d}");

        let x = Exponential::new(10.0, Duration::from_secs(60))
            .unwrap()
            .with_policy(policy);
        let (a, d) = compare(&cluster, x, 3, 3_000_000_000, 3, close);
        eprintln!("exponential {policy}: {a} allowed, {d} denied");
        assert!(a > 300 && d > 300, "exponential {policy}: {a} {d}");
    }
}

/// The four window algorithms and an `AllOf` on the cluster: every field of every decision as
/// in memory.
// Pins G38.
#[test]
fn windows_same_decisions_as_in_memory_on_the_cluster() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let w = Duration::from_nanos(1_300_000_007);
    for policy in [Policy::Leaky, Policy::Strict] {
        let exact = |i: usize, m: &Decision, r: &Decision| {
            assert_eq!(m, r, "request {i} ({policy})");
        };
        let mut runs = vec![
            (
                "fixed window",
                compare(
                    &cluster,
                    FixedWindow::new(10, w).unwrap().with_policy(policy),
                    4,
                    60_000_000,
                    3,
                    exact,
                ),
            ),
            (
                "sliding log",
                compare(
                    &cluster,
                    SlidingLog::new(10, w).unwrap().with_policy(policy),
                    5,
                    60_000_000,
                    3,
                    exact,
                ),
            ),
            (
                "sliding window",
                compare(
                    &cluster,
                    SlidingWindow::new(10, w)
                        .unwrap()
                        .with_bias(Bias::Lenient)
                        .with_policy(policy),
                    6,
                    60_000_000,
                    3,
                    exact,
                ),
            ),
            (
                "sub-window",
                compare(
                    &cluster,
                    SubWindow::new(10, w, 7)
                        .unwrap()
                        .with_bias(Bias::Lenient)
                        .with_policy(policy),
                    7,
                    60_000_000,
                    3,
                    exact,
                ),
            ),
            // Three keys per client (the log, its total, the GCRA state): one slot.
            (
                "all of",
                compare(
                    &cluster,
                    AllOf::new(
                        SlidingLog::new(10, w).unwrap().with_policy(policy),
                        "7/s burst 5".parse::<Gcra>().unwrap().with_policy(policy),
                    ),
                    8,
                    60_000_000,
                    3,
                    exact,
                ),
            ),
        ];
        for (name, (a, d)) in runs.drain(..) {
            eprintln!("{name} {policy}: {a} allowed, {d} denied");
            assert!(a > 50 && d > 300, "{name} {policy}: {a} {d}");
        }
    }
}

/// The sliding log's script touches two keys (the log and its total): the hash tag keeps
/// each client's two in one slot, while 300 clients spread over all three nodes, each limited
/// exactly.
// Pins G39.
#[test]
fn a_multi_key_script_stays_in_one_slot() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let log = SlidingLog::new(4, Duration::from_secs(3600)).unwrap();
    let r = RedisLimiter::builder(cluster.url(2), log)
        .key_prefix("log:")
        .build()
        .unwrap();
    let keys = keys(300);
    let mut per_node = [0usize; 3];
    for key in &keys {
        let allowed = (0..6u64)
            .filter(|&i| r.request(key).at(i).check().unwrap().is_allowed())
            .count();
        assert_eq!(allowed, 4, "{key}");
        let (log_key, total_key) = (r.redis_key(key), r.redis_key(key) + ":n");
        let node = cluster.node_of(&log_key);
        assert_eq!(cluster.node_of(&total_key), node, "{key}");
        per_node[node] += 1;
        let total: String = redis::cmd("GET")
            .arg(&total_key)
            .query(&mut cluster.raw(node))
            .unwrap();
        assert_eq!(total, "4", "{key}");
    }
    assert!(per_node.iter().all(|&n| n > 60), "{per_node:?}");
    assert_eq!((r.stats().errors, r.stats().failures), (0, 0));
}

/// `SCRIPT FLUSH` on every node between requests: each is reloaded (on every primary) and
/// the counts stay exact, for single requests and batches.
// Pins G39.
#[test]
fn script_flush_on_all_nodes_is_survived() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let r = RedisLimiter::builder(cluster.url(0), "10/s burst 5".parse::<Gcra>().unwrap())
        .build()
        .unwrap();
    let keys = keys(30);
    for key in &keys {
        assert!(r.request(key).at(0).check().unwrap().is_allowed());
    }
    cluster.script_flush_all();
    for key in &keys {
        assert_eq!(r.request(key).at(0).check().unwrap().remaining(), Some(3));
    }
    cluster.script_flush_all();
    // Batches run on server time: keys of their own.
    let batch_keys: Vec<String> = keys.iter().map(|k| format!("b{k}")).collect();
    let batch: Vec<(&str, u64)> = batch_keys.iter().map(|k| (k.as_str(), 1)).collect();
    assert!(r
        .try_check_pipelined(&batch)
        .unwrap()
        .iter()
        .all(Decision::is_allowed));
    cluster.script_flush_all();
    for key in &keys {
        assert_eq!(r.request(key).at(0).check().unwrap().remaining(), Some(2));
        assert_eq!(r.request(key).at(0).check().unwrap().remaining(), Some(1));
        assert_eq!(r.request(key).at(0).check().unwrap().remaining(), Some(0));
        assert!(r.request(key).at(0).check().unwrap().is_denied());
    }
    assert_eq!((r.stats().errors, r.stats().failures), (0, 0));
}

/// One node SIGKILLed: its keys get the fail mode (open and closed), counted as failures, not
/// errors; the other nodes' keys still get real decisions.
// Pins G42.
#[test]
fn killed_node_gives_the_fail_mode_for_its_keys_only() {
    let Some(mut cluster) = Cluster::start() else {
        return;
    };
    let gcra: Gcra = "1/h burst 2".parse().unwrap();
    let closed = FailMode::Closed {
        retry_after: Duration::from_secs(3),
    };
    let open = RedisLimiter::builder(cluster.url(0), gcra)
        .key_prefix("o:")
        .fail_mode(FailMode::Open)
        .build()
        .unwrap();
    let shut = RedisLimiter::builder(cluster.url(0), gcra)
        .key_prefix("o:")
        .fail_mode(closed)
        .build()
        .unwrap();
    let keys = keys(30);
    // Use up every key's burst while all nodes are up.
    for key in &keys {
        assert!(open.check(key).is_allowed() && shut.check(key).is_allowed());
        assert!(open.check(key).is_denied() && shut.check(key).is_denied());
    }
    let dead = 2;
    let (on_dead, alive): (Vec<&String>, Vec<&String>) = keys
        .iter()
        .partition(|k| cluster.node_of(&open.redis_key(k)) == dead);
    assert!(!on_dead.is_empty() && !alive.is_empty());
    cluster.kill(dead);

    for key in &on_dead {
        let start = Instant::now();
        assert!(open.check(key).is_allowed(), "fail open");
        let d = shut.check(key);
        assert!(d.is_denied(), "fail closed");
        assert_eq!(d.retry_after(), Duration::from_secs(3));
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
        match open.request(key).check() {
            Err(e) => assert!(e.is_outage(), "{e}"),
            Ok(d) => panic!("a decision from a dead node: {d:?}"),
        }
    }
    // The live nodes still decide (a denial with Redis' own retry_after, not the fail mode).
    for key in &alive {
        let d = open.request(key).check().unwrap();
        assert!(d.is_denied());
        assert!(d.retry_after() > Duration::from_secs(1000), "{d:?}");
    }
    let n = on_dead.len() as u64;
    assert_eq!((open.stats().failures, open.stats().errors), (n, 0));
    assert_eq!((shut.stats().failures, shut.stats().errors), (n, 0));
}

/// A primary killed and its replica promoted (3 primaries, 3 replicas): while the slots have
/// no primary its keys get the fail mode, each counted, none an error; once the replica has
/// taken over, the limiter finds it by itself and decides from the replicated state, exactly
/// (the script reloaded there if its cache lacks it).
// Pins G42.
#[test]
fn a_failed_over_primary_gives_the_fail_mode_then_real_decisions() {
    let Some(mut cluster) = Cluster::start_with(1) else {
        return;
    };
    // On Redis' clock: 1/h, so nothing returns during the test and every count is exact.
    let gcra: Gcra = "1/h burst 5".parse().unwrap();
    let closed = Duration::from_secs(3);
    let r = RedisLimiter::builder(cluster.url(0), gcra)
        .key_prefix("fo:")
        .fail_mode(FailMode::Closed {
            retry_after: closed,
        })
        .reconnect_after(Duration::from_millis(20))
        .build()
        .unwrap();
    let keys = keys(30);
    for key in &keys {
        for _ in 0..2 {
            assert!(r.check(key).is_allowed());
        }
    }
    let primary = cluster.node_of(&r.redis_key(&keys[0]));
    let on_it: Vec<&String> = keys
        .iter()
        .filter(|k| cluster.node_of(&r.redis_key(k)) == primary)
        .collect();
    // Every write so far is on the replica before the primary dies. `WAIT` waits for this
    // connection's own last write, so write first (in keys[0]'s slot): the replication stream
    // is ordered, so the replica then holds the limiter's writes too. (A `WAIT` on a fresh
    // connection returns at once: under load the replica was promoted without them.)
    let mut conn = cluster.raw(primary);
    let _: () = redis::cmd("SET")
        .arg(format!("{}:wait", r.redis_key(&keys[0])))
        .arg(1)
        .query(&mut conn)
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut conn)
        .unwrap();
    assert_eq!(acked, 1);
    cluster.kill(primary);

    // Until a replica is promoted: the closed fail mode, each counted; never an error.
    let key = on_it[0];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut outages = 0;
    let promoted = loop {
        let d = r.check(key);
        if d.is_allowed() {
            break d;
        }
        assert_eq!(d.retry_after(), closed, "{d:?}");
        outages += 1;
        assert_eq!((r.stats().failures, r.stats().errors), (outages, 0));
        assert!(Instant::now() < deadline, "no replica promoted");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(outages > 0);
    // The node asked learns of the promotion by gossip, which can come a moment after the new
    // primary serves (seen once on a loaded CI run): ask until its slot map moves, bounded.
    let moved = (0..50).any(|_| {
        let moved = cluster.node_of(&r.redis_key(key)) != primary;
        if !moved {
            std::thread::sleep(Duration::from_millis(100));
        }
        moved
    });
    assert!(moved, "the slot map still names the dead primary after 5 s");
    // The replicated state: 2 taken before the kill, this is the 3rd.
    assert_eq!(promoted.remaining(), Some(2), "{promoted:?}");
    // Every other key, on the promoted replica or on the primaries that never noticed.
    for key in &keys[1..] {
        assert_eq!(r.check(key).remaining(), Some(2), "{key}");
    }
    assert_eq!((r.stats().failures, r.stats().errors), (outages, 0));
}

// Pins G39.
#[cfg(feature = "redis-async")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_client_on_the_cluster_counts_exactly() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    // 1/h: server time adds nothing between the two batches.
    let a = RedisLimiter::builder(cluster.url(1), "1/h burst 5".parse::<Gcra>().unwrap())
        .key_prefix("async:")
        // 900 requests in flight on a shared 2-core machine: this test counts, it does not
        // time.
        .io_timeout(Duration::from_secs(5))
        .build_async()
        .await
        .unwrap();
    assert!(a.is_cluster());
    let keys = keys(300);
    for key in &keys {
        let mut allowed = 0;
        for _ in 0..7 {
            allowed += a
                .request(key)
                .at(1_000_000_000)
                .check()
                .await
                .unwrap()
                .is_allowed() as usize;
        }
        assert_eq!(allowed, 5, "{key}");
    }
    // A batch over every node: fresh keys, three requests each against a burst of 5, then
    // three more: 5 of 6 allowed per key.
    let fresh: Vec<String> = keys.iter().map(|k| format!("b{k}")).collect();
    let batch: Vec<(&str, u64)> = fresh
        .iter()
        .flat_map(|k| [(k.as_str(), 1), (k.as_str(), 1), (k.as_str(), 1)])
        .collect();
    let x = a.try_check_pipelined(&batch).await.unwrap();
    cluster.script_flush_all();
    let y = a.try_check_pipelined(&batch).await.unwrap();
    assert!(x.iter().all(Decision::is_allowed));
    assert_eq!(y.iter().filter(|d| d.is_allowed()).count(), 2 * fresh.len());
    let per_node: std::collections::HashSet<usize> = fresh
        .iter()
        .map(|k| cluster.node_of(&a.redis_key(k)))
        .collect();
    assert_eq!(per_node.len(), 3);
    // `check_batch`: the batch's keys once more, concurrently to every node: each key's
    // seventh request, denied.
    let mut out = Vec::new();
    let keys: Vec<&str> = fresh.iter().map(String::as_str).collect();
    a.check_batch(keys.iter().copied(), &mut out).await;
    assert_eq!(out.len(), fresh.len());
    assert!(out.iter().all(Decision::is_denied));
    assert_eq!((a.stats().errors, a.stats().failures), (0, 0));
}
