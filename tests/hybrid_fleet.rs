//! The hybrid limiter in a fleet: 4 processes against one real `redis-server` (and a 3-node
//! cluster), 10 s per shape of traffic, one limiter per algorithm in each (see
//! `tests/fleet/mod.rs`), every request's answer compared with one exact limiter's. The
//! bounds asserted are the ones the docs state (`HybridLimiter`, `docs/fleet.md`); the
//! measured numbers are in BENCHMARKS.md, from `examples/hybrid_fleet.rs`, which runs the
//! same harness.

mod fleet;
mod redis_server;

use fleet::*;
use redis_server::Cluster;
use std::time::Duration;

/// This test binary is also the worker: the fleet runs start it with [`WORKER_ARGS`] and
/// the spec in [`WORKER_ENV`]; this entry is then the worker's main, printing its result.
/// Ignored in a plain run, where there is no spec.
#[test]
#[ignore = "a fleet worker process's main, started by the fleet tests"]
fn fleet_worker() {
    worker_main();
}

const SECS: Duration = Duration::from_secs(10);

/// A sparse run: each of its keys is seen a dozen times or more by the fleet, and a run of
/// one algorithm alone takes about 9 s of CI's fleet step.
const SPARSE_SECS: Duration = Duration::from_secs(6);

/// One run at a time: two fleets at once would share the machine's cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A fleet run of `shape` for every algorithm against a `redis-server` of its own (killed and
/// restarted as `outage` says: `(at, down for)`); `None` (with a message) without
/// `redis-server`.
fn on_a_server_all(shape: Shape, outage: Option<(Duration, Duration)>) -> Option<Run> {
    on_a_server_with(shape, &ALGOS, SECS, outage)
}

/// [`on_a_server_all`] for `algos` only, `secs` long, one run at a time.
fn on_a_server_with(
    shape: Shape,
    algos: &[&'static str],
    secs: Duration,
    outage: Option<(Duration, Duration)>,
) -> Option<Run> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    on_a_server(&WORKER_ARGS, shape, algos, secs, outage)
}

fn report(run: &Run, a: &AlgoRun, c: &Comparison) {
    debug_stats(a);
    eprintln!(
        "{:?} {:<12} fleet {:>6} exact {:>6} ({:.3})  wrongly denied {:.2}%  allowed {:.2}%  lag {:?}  degraded {}  calls/key/interval {:.3}",
        run.shape,
        a.name,
        c.fleet,
        c.exact,
        c.ratio(),
        100.0 * c.wrongly_denied_share(),
        100.0 * c.wrongly_allowed_share(),
        lag(a),
        total(a, "degraded"),
        calls_per_key_interval(run, a),
    );
}

/// Every algorithm on a hot shape: GCRA never above `rate × span + burst` plus its
/// allowance; the windows within their limit plus what the others admit in one lag; EARRRL
/// and exponential within 10% of one exact limiter at a lag of 50 ms or less, and above it
/// by at most 10% per 50 ms of lag beyond (G49: a run on a host that stalled, lags of
/// 90 ms and the fallback deciding, took EARRRL's flood key to 0.86× exact, the requests
/// its first round's wait denied); the paced key at least 90% of exact.
fn hot_bounds(run: &Run, slack: u64) {
    let shape = run.shape;
    for a in &run.algos {
        let lag = lag(a);
        for key in [FLOOD, PACED] {
            let c = compare(a, shape, |k| k == key);
            report(run, a, &c);
            if key == PACED {
                assert!(c.ratio() >= 0.9, "{}: paced key {c:?}", a.name);
            }
            if matches!(a.name, "earrrl" | "exponential") {
                let above = 0.1 * (lag.as_secs_f64() / 0.05).max(1.0);
                assert!(c.ratio() <= 1.0 + above, "{}: key {key}: {c:?}", a.name);
                if lag <= Duration::from_millis(50) {
                    assert!(c.ratio() >= 0.9, "{}: key {key}: {c:?}", a.name);
                }
            }
        }
        assert!(calls_within_g54(run, a), "{}", a.name);
        for key in [FLOOD, PACED] {
            assert_gcra_or_window_bound(run, a, key, slack, 0);
        }
    }
}

// Pins G47, G48, G49, G50, G54.
#[test]
fn hot_keys_four_processes_share_each_limit() {
    let Some(run) = on_a_server_all(Shape::Hot { skew: None }, None) else {
        return;
    };
    hot_bounds(&run, 0);
    let gcra = &run.algos[0];
    let got = admitted(&gcra.trace, FLOOD) as f64;
    assert!(got >= 0.9 * 100.0 * SECS.as_secs_f64(), "gcra flood: {got}");
    for a in &run.algos {
        assert_eq!(total(a, "failed_calls"), 0, "{}", a.name);
        assert_eq!(total(a, "errors"), 0, "{}", a.name);
    }
}

/// One instance sends 90% of both keys' demand: the others' view of it lags one sync round
/// plus a push, as every instance's does, and the bounds hold as on even traffic.
// Pins G47, G48, G49, G50, G54.
#[test]
fn skewed_demand_one_process_sends_ninety_percent() {
    let Some(run) = on_a_server_all(Shape::Hot { skew: Some(0.9) }, None) else {
        return;
    };
    hot_bounds(&run, 0);
}

/// Many keys, each seen by an instance less than once a second: every algorithm admits
/// within 10% of one exact limiter, and wrongly denies at most [`wrongly_denied_bound`] of
/// the requests.
///
/// One algorithm at a time: each request on such a key is a write to Redis that every
/// instance must hear of, and five limiters' worth of that (100,000 key updates a second)
/// is more than one `redis-server` sharing two cores with the fleet keeps up with.
fn sparse(keys: u32, rate: f64, algos: &[&'static str]) {
    each_algorithm_alone(Shape::Sparse { keys, rate }, algos, sparse_bounds);
}

/// A fleet run of `shape` for each of `algos` in turn (`FLEET_ALGO` picks one), `SPARSE_SECS`
/// long, each checked by `check`; nothing (with a message) without `redis-server`.
fn each_algorithm_alone(shape: Shape, algos: &[&'static str], check: impl Fn(&Run)) {
    for &name in algos {
        let only = std::env::var("FLEET_ALGO");
        if only.as_deref().is_ok_and(|o| o != name) {
            continue;
        }
        let Some(run) = on_a_server_with(shape, &[name], SPARSE_SECS, None) else {
            return;
        };
        check(&run);
    }
}

fn sparse_bounds(run: &Run) {
    let shape = run.shape;
    for a in &run.algos {
        let c = compare(a, shape, |_| true);
        report(run, a, &c);
        assert!((0.9..=1.1).contains(&c.ratio()), "{}: {c:?}", a.name);
        let most = wrongly_denied_bound(lag(a));
        assert!(
            c.wrongly_denied_share() <= most,
            "{}: more than {most} wrongly denied at a lag of {:?}: {c:?}",
            a.name,
            lag(a)
        );
        assert_eq!(total(a, "errors"), 0, "{}", a.name);
        if a.name == "gcra" {
            // Every key within `rate × span + burst` and the allowance.
            for (key, t) in by_key(&a.trace) {
                let span = (t.last().unwrap().0 - t[0].0) as f64 / 1e9;
                let bound = gcra_most(shape, span);
                let got = t.iter().filter(|r| r.1).count() as u64;
                assert!(got <= bound, "gcra key {key}: {got} > {bound}");
            }
        }
    }
}

/// The share of a sparse run's requests the docs let the fleet deny wrongly: 2% while the
/// run's lag stays within 50 ms, in proportion to the lag beyond. A request is decided
/// wrongly only where another instance's request on its key fell within one lag before it
/// (an admission the view lacks, then a denial the exact order would not make), and the
/// chance of that grows with the lag.
fn wrongly_denied_bound(lag: Duration) -> f64 {
    0.02 * (lag.as_secs_f64() / 0.05).max(1.0)
}

// Every algorithm on one sparse shape at least, a run (about 9 s of CI's time) being of one
// algorithm alone: GCRA and the fixed window at 10,000 keys (and at 2,000 on a cluster,
// `on_a_three_node_cluster`), EARRRL and the exponential limiter at 2,000, the sliding
// window, whose wrongly denied share is the fleet's largest, at both.

// Pins G47, G50.
#[test]
fn sparse_ten_thousand_keys_at_two_per_second() {
    sparse(10_000, 2.0, &["gcra", "fixed", "sliding"]);
}

// Pins G47, G50.
#[test]
fn sparse_two_thousand_keys_at_ten_per_second() {
    sparse(2_000, 10.0, &["sliding", "earrrl", "exponential"]);
}

// Pins G49, G52, G54.
#[test]
fn hot_keys_ride_out_a_redis_outage() {
    let outage = Some((Duration::from_millis(3500), Duration::from_secs(3)));
    let Some(run) = on_a_server_all(Shape::Hot { skew: None }, outage) else {
        return;
    };
    for a in &run.algos {
        assert!(total(a, "failed_calls") > 0, "{}: no failed call", a.name);
        assert!(total(a, "degraded") > 0, "{}: no degraded decision", a.name);
        let per_s = per_second(&run, &a.trace, FLOOD);
        eprintln!("{:<12} admitted/s {per_s:?}", a.name);
    }
    // Redis comes back empty, its reservations forgotten: one more burst; and each worker's
    // fallback decides its share during the outage, which the back-dated charges pay back
    // only where they reach Redis before the others' grants.
    hot_bounds(
        &run,
        Shape::Hot { skew: None }.burst() + gcra_allowance(run.shape),
    );
    // Converged: from the second after Redis is back, GCRA and the windows admit at least
    // 85% of the limit each second (the outage's charges, back-dated, hold nobody back) and
    // no more than a second's bound with Redis up: GCRA's `rate + burst + allowance`, a
    // window's limit plus what the others admit within one lag.
    let shape = run.shape;
    for a in &run.algos[..3] {
        let per_s = per_second(&run, &a.trace, FLOOD);
        let most = match a.name {
            "gcra" => gcra_most(shape, 1.0),
            _ => shape.limit() as u64 + window_excess(&run, a, FLOOD),
        };
        for (s, &n) in per_s.iter().enumerate().skip(7) {
            assert!(
                (85..=most).contains(&n),
                "{}: {n} admitted in second {s} (at most {most}): {per_s:?}",
                a.name
            );
        }
    }
}

/// GCRA and the fixed window on a 3-node cluster: the hot keys' bounds and the sparse keys'
/// accuracy, as on a server, and pushes as quick as one server's (issue #59: within 2x; each
/// round's call publishes to its node's shard channel, where a plain `PUBLISH` crossed the
/// cluster's bus and waited for its delayed ACKs: 16-56 ms). The hot keys of both algorithms in
/// one run, as on the server; the sparse keys one algorithm at a time (on a cluster each key is
/// one script call: two limiters' worth of sparse keys is more than three nodes sharing two
/// cores with the fleet keep up with).
// Pins G47, G48, G50, G54, G56.
#[test]
fn on_a_three_node_cluster() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Started first: a cluster just formed still settles its configuration (a push of 4 ms in
    // one run's first seconds), and the comparison is of a healthy cluster.
    let Some(cluster) = Cluster::start() else {
        return;
    };
    // One server's push lag, the same shape, in the same sitting.
    let Some(single) = on_a_server(
        &WORKER_ARGS,
        Shape::Hot { skew: None },
        &["gcra", "fixed"],
        SECS,
        None,
    ) else {
        return;
    };
    let target = Target {
        url: cluster.url(0),
        seeds: vec![cluster.url(1), cluster.url(2)],
    };
    let sparse = Shape::Sparse {
        keys: 2_000,
        rate: 10.0,
    };
    // The hot run first, then the sparse ones: the push lags are compared on a cluster that
    // has only just run hot keys, as the one server had, with the same two algorithms at once
    // (one run, as on the server). A hot run right after a sparse one (2,000 keys written on
    // every node) once measured twice the server's lag, 0.50 ms against 0.25, where the run
    // before it, after no sparse run, measured 0.24 against 0.26.
    let hot = run(
        &WORKER_ARGS,
        &target,
        Shape::Hot { skew: None },
        &["gcra", "fixed"],
        SECS,
        None,
    );
    hot_bounds(&hot, 0);
    healthy(&hot);
    for (a, one) in hot.algos.iter().zip(&single.algos) {
        let name = a.name;
        assert_eq!(name, one.name);
        let (on_cluster, on_one) = (push_lag(a), push_lag(one));
        eprintln!("{name}: push lag (the workers' mean) on the cluster {on_cluster:?}, on one server {on_one:?}");
        assert!(
            on_cluster <= 2 * on_one,
            "{name}: push lag {on_cluster:?} on the cluster, {on_one:?} on one server"
        );
    }
    for name in ["gcra", "fixed"] {
        let run = run(&WORKER_ARGS, &target, sparse, &[name], SPARSE_SECS, None);
        sparse_bounds(&run);
        healthy(&run);
    }
}

/// The workers' mean push lag (the longest is one hiccup of a busy machine: 0.5-4 ms on a
/// cluster and on one server alike, either way from run to run).
fn push_lag(a: &AlgoRun) -> Duration {
    let lags: Vec<u64> = a
        .stats
        .iter()
        .map(|s| s["push_lag"].as_u64().unwrap())
        .collect();
    Duration::from_nanos(lags.iter().sum::<u64>() / lags.len() as u64)
}

/// With every node up: one subscription per instance, never taken for deaf, and no decision
/// left to the fallback.
fn healthy(run: &Run) {
    for a in &run.algos {
        let workers = a.stats.len() as u64;
        assert_eq!(total(a, "deaf"), 0, "{}: {:?}", a.name, a.stats);
        assert_eq!(total(a, "subscribed"), workers, "{}", a.name);
        assert_eq!(total(a, "degraded"), 0, "{}", a.name);
    }
}

/// Issue #46 in the fleet: 20 keys at twice their limit of 10 a second under a flood of
/// one-off keys (8,000 a second across the fleet, one request each) against `max_keys(1_000)`
/// in every instance: each instance holds every key the fleet touches (8× its bound), so the
/// legitimate keys are evicted again and again. Evicted, an entry keeps its own count and the
/// others' in the debt table and starts from them when the key comes back: every algorithm
/// stays within the bounds it keeps without a flood (GCRA's: `rate × span + burst` plus the
/// allowance; a window's: its limit plus what the others admit in one lag; EARRRL and
/// exponential within 10% of exact), where forgetting admitted 1.92× exact (fixed window) and
/// 2.05× (sliding window) on this shape. And the flood costs the others little: each instance
/// owes up to 8× (fixed) or 16× (sliding) its bound at once, past where the debt table
/// overflows by group (~9.3×, docs/fleet.md), yet the bounds below hold.
// Pins G47, G48, G55, G72.
#[test]
fn a_flood_of_one_off_keys_against_max_keys_resets_no_limit() {
    let shape = Shape::Flood {
        legit: 20,
        one_off: 8_000.0,
    };
    each_algorithm_alone(shape, &ALGOS, |run| {
        let a = &run.algos[0];
        let name = a.name;
        let legit = compare(a, shape, |k| shape.is_legit(k));
        let one_off = compare(a, shape, |k| !shape.is_legit(k));
        report(run, a, &legit);
        eprintln!(
            "    one-off keys: {} requests, {:.2}% wrongly denied; evicted {} debts kept {} restored {}",
            one_off.requests,
            100.0 * one_off.wrongly_denied_share(),
            total(a, "evicted_capacity"),
            total(a, "debts_kept"),
            total(a, "debts_restored"),
        );
        assert!(total(a, "evicted_capacity") > 0, "{name}: nothing evicted");
        assert!(legit.ratio() <= 1.1, "{name}: legitimate keys {legit:?}");
        // A flood costs only the flooder (issue #59): the legitimate keys keep 0.9x of exact,
        // at most 5% of their requests wrongly denied by the flood, and at most 1% of the
        // one-off keys are denied their one request. (Four processes on a hot key decide
        // some requests in another order than one exact limiter, which moves admissions in
        // time: without a flood 8-13% of the requests are denied wrongly and as many admitted
        // wrongly, BENCHMARKS.md. The flood's share is what is denied beyond those.)
        assert!(legit.ratio() >= 0.9, "{name}: legitimate keys {legit:?}");
        let flood_denied = legit.wrongly_denied_share() - legit.wrongly_allowed_share();
        assert!(flood_denied <= 0.05, "{name}: legitimate keys {legit:?}");
        assert!(
            one_off.wrongly_denied_share() <= 0.01,
            "{name}: one-off keys {one_off:?}"
        );
        let keys = by_key(&a.trace);
        for key in 0..shape.keys() {
            let t = &keys[&key];
            let excess = window_excess(run, a, key);
            match name {
                "gcra" => {
                    let span = (t.last().unwrap().0 - t[0].0) as f64 / 1e9;
                    let bound = gcra_most(shape, span);
                    let got = t.iter().filter(|r| r.1).count() as u64;
                    assert!(got <= bound, "gcra key {key}: {got} > {bound}");
                }
                "fixed" => {
                    let worst = max_per_window(t);
                    let bound = shape.limit() as u64 + excess;
                    assert!(
                        worst <= bound,
                        "fixed key {key}: {worst} in a window > {bound}"
                    );
                }
                "sliding" => {
                    let worst = max_sliding_estimate(t);
                    let bound = shape.limit() + excess as f64;
                    assert!(
                        worst <= bound,
                        "sliding key {key}: estimate {worst} > {bound}"
                    );
                }
                _ => {}
            }
        }
    });
}
