//! The hybrid limiter in a fleet: 4 processes against one real `redis-server`, 10 s, one
//! limiter per algorithm in each (see `tests/fleet/mod.rs`); then the same with Redis killed
//! for 3 s in the middle. The numbers behind README's "A fleet" section come from
//! `examples/hybrid_fleet.rs`, which runs the same harness.

mod fleet;
mod redis_server;

use fleet::*;
use redis_server::Server;
use std::time::Duration;

/// This test binary is also the worker: the fleet runs start it with [`WORKER_ARGS`] and
/// the spec in [`WORKER_ENV`]; this entry is then the worker's main, printing its result.
/// Ignored in a plain run, where there is no spec.
#[test]
#[ignore = "a fleet worker process's main, started by the fleet tests"]
fn fleet_worker() {
    let spec = std::env::var(WORKER_ENV).expect("started by a fleet test, with its spec");
    let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
    println!("FLEET-RESULT {}", worker(&spec));
}

const WORKER_ARGS: [&str; 5] = [
    "--exact",
    "fleet_worker",
    "--ignored",
    "--nocapture",
    "--test-threads=1",
];

/// One run at a time: two fleets at once would share the machine's cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A fleet run of 10 s against a `redis-server` of its own (killed and restarted as
/// `outage` says); `None` (with a message) without `redis-server`.
fn fleet_run(outage: Option<(Duration, Duration)>) -> Option<Run> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start()?;
    let port = server.port;
    let restart = |p| Server::start_on(Some(p)).unwrap();
    Some(run(
        &WORKER_ARGS,
        port,
        server,
        restart,
        Duration::from_secs(10),
        outage,
    ))
}

/// The assertions both runs share; `slack` is the extra a restarted (empty) Redis allows.
fn common(run: &Run, slack: u64) {
    let secs = run.duration.as_secs_f64();
    for a in &run.algos {
        assert!(
            calls_per_key_interval(a) <= 1.0,
            "{}: {} calls per key per interval",
            a.name,
            calls_per_key_interval(a)
        );
        // Demand just above the limit: at least 90% of what one exact limiter admits.
        let (fleet, exact) = (admitted(&a.paced), exact(a.name, &a.paced));
        assert!(
            fleet as f64 >= 0.9 * exact as f64,
            "{}: paced key, fleet {fleet} < 90% of exact {exact}",
            a.name
        );
        // The averaging algorithms: the merged estimate lags the others' last interval, so
        // the fleet admits a little more than one exact limiter; the README states the
        // measured error (3 to 6%), this bounds it.
        if matches!(a.name, "earrrl" | "exponential") {
            for (key, t) in [("flood", &a.flood), ("paced", &a.paced)] {
                let (f, x) = (admitted(t) as f64, fleet::exact(a.name, t) as f64);
                assert!(
                    (0.9 * x..=1.2 * x).contains(&f),
                    "{}: {key} key, fleet {f} vs exact {x}",
                    a.name
                );
            }
        }
        eprintln!(
            "{:<12} flood {:>5} (exact {:>5})  paced {:>5} (exact {:>5})  calls/key/interval {:.2}  degraded {}",
            a.name,
            admitted(&a.flood),
            fleet::exact(a.name, &a.flood),
            fleet,
            exact,
            calls_per_key_interval(a),
            total(a, "degraded"),
        );
    }
    let gcra = &run.algos[0];
    // GCRA: every admitted unit was reserved (or charged): never above rate × time + burst.
    let span = (span(&gcra.flood) as f64 / 1e9 + 2.0 * INTERVAL.as_secs_f64()).min(secs);
    let bound = (LIMIT * span) as u64 + BURST + slack;
    let got = admitted(&gcra.flood);
    assert!(got <= bound, "gcra flood: {got} > {bound}");
    assert!(
        got as f64 >= 0.9 * LIMIT * secs,
        "gcra flood: {got} admitted in {secs} s"
    );
}

#[test]
fn four_processes_share_each_limit() {
    let Some(run) = fleet_run(None) else {
        return;
    };
    common(&run, 0);
    let fixed = &run.algos[1];
    let worst = max_per_window(&fixed.flood);
    assert!(
        worst <= LIMIT as u64 + window_bound(),
        "fixed window: {worst} in one window, bound {} + {}",
        LIMIT,
        window_bound()
    );
    let sliding = &run.algos[2];
    let worst = max_sliding_estimate(&sliding.flood);
    assert!(
        worst <= LIMIT + window_bound() as f64,
        "sliding window: estimate {worst}, bound {LIMIT} + {}",
        window_bound()
    );
    for a in &run.algos {
        assert_eq!(total(a, "failed_calls"), 0, "{}", a.name);
        assert_eq!(total(a, "errors"), 0, "{}", a.name);
    }
}

#[test]
fn four_processes_ride_out_a_redis_outage() {
    let Some(run) = fleet_run(Some((Duration::from_millis(3500), Duration::from_secs(3)))) else {
        return;
    };
    for a in &run.algos {
        assert!(total(a, "failed_calls") > 0, "{}: no failed call", a.name);
        assert!(total(a, "degraded") > 0, "{}: no degraded decision", a.name);
        let per_s = per_second(&run, &a.flood);
        let paced = per_second(&run, &a.paced);
        eprintln!("{:<12} admitted/s {per_s:?} paced {paced:?}", a.name);
    }
    // Redis comes back empty, its reservations forgotten: one more burst; and each worker's
    // fallback starts the outage with its own burst (a quarter of 10: 2), which the
    // back-dated charges pay back only where they reach Redis before the others' grants.
    common(&run, BURST + WORKERS as u64 * 2);
    // Converged: in the last 2 s, GCRA and the windows admit the limit again (±15%).
    for a in &run.algos[..3] {
        let per_s = per_second(&run, &a.flood);
        for (s, &n) in per_s.iter().enumerate().skip(8) {
            assert!(
                (0.85 * LIMIT..=1.15 * LIMIT).contains(&(n as f64)),
                "{}: {n} admitted in second {s}: {per_s:?}",
                a.name
            );
        }
    }
}
