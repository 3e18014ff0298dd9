//! The fleet under faults between its instances and Redis, and under clocks that disagree:
//! 4 worker processes (the harness of `tests/hybrid_fleet.rs`, `tests/fleet/mod.rs`), every
//! algorithm, the hot shape (a key at 10× its limit, one at 1.2×), each request's answer
//! compared with one exact limiter's. Between the workers and a real `redis-server`, the
//! fault-injecting proxy of `tests/fault_proxy/mod.rs` (loopback), or Redis itself restarted,
//! flushed, started late; the workers' system clocks offset by libfaketime.
//!
//! Each run asserts the bounds docs/GUARANTEES.md states for it (G numbers on each test) and
//! prints one row per algorithm; BENCHMARKS.md ("The fleet under faults") has the table.

mod fault_proxy;
mod fleet;
mod redis_server;

use fault_proxy::Proxy;
use fleet::*;
use redis_server::Server;
use std::time::Duration;

/// This test binary is also the worker (see `tests/hybrid_fleet.rs`).
#[test]
#[ignore = "a fleet worker process's main, started by the fleet tests"]
fn fleet_worker() {
    worker_main();
}

const SECS: Duration = Duration::from_secs(10);

/// One run at a time: two fleets at once would share the machine's cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A fault's run: the hot shape, every algorithm, through a proxy to a server of its own;
/// `faults` sets the proxy up and returns the run's events and fault window. `None` (with a
/// message) without `redis-server`.
fn through_proxy<'a>(
    proxy_slot: &'a mut Option<Proxy>,
    server: &Server,
    faults: impl FnOnce(&'a Proxy) -> Setup<'a>,
) -> Run {
    let proxy = proxy_slot.insert(Proxy::start(([127, 0, 0, 1], server.port).into()));
    let setup = Setup {
        observer_url: Some(server.url()),
        ..faults(proxy)
    };
    hot(proxy.url(), &ALGOS, SECS, setup)
}

/// The hot shape against `url` (a server, the proxy, or the port of a server to come) for
/// `algos`, `secs` long.
fn hot(url: String, algos: &[&'static str], secs: Duration, setup: Setup<'_>) -> Run {
    let target = Target {
        url,
        seeds: Vec::new(),
    };
    run_with(
        &WORKER_ARGS,
        &target,
        Shape::Hot { skew: None },
        algos,
        secs,
        setup,
    )
}

/// The worst window of either hot key, ÷ what one exact limiter allows in one: the fixed
/// window's most in a 1 s window and the sliding window's largest estimate ÷ the limit;
/// GCRA's admissions ÷ `rate × span + burst`; EARRRL's and the exponential limiter's most in
/// a 1 s window ÷ the exact limiter's most in one (their limits are rates: a burst may pass
/// a window's count).
fn worst_window(run: &Run, a: &AlgoRun) -> f64 {
    let shape = run.shape;
    let fleet = by_key(&a.trace);
    let exact: Trace = a
        .trace
        .iter()
        .zip(exact(a.name, shape, &a.trace))
        .map(|(&(at, key, _), ok)| (at, key, ok))
        .collect();
    let exact = by_key(&exact);
    [FLOOD, PACED]
        .iter()
        .map(|key| {
            let t = &fleet[key];
            match a.name {
                "fixed" => max_per_window(t) as f64 / shape.limit(),
                "sliding" => max_sliding_estimate(t) / shape.limit(),
                "gcra" => {
                    let span = (t.last().unwrap().0 - t[0].0) as f64 / 1e9;
                    admitted(&a.trace, *key) as f64 / (shape.limit() * span + shape.burst() as f64)
                }
                _ => max_per_window(t) as f64 / max_per_window(&exact[key]).max(1) as f64,
            }
        })
        .fold(0.0, f64::max)
}

/// Prints each hot key's admissions per 1 s window, the fleet's beside its exact twin's: a
/// failed bound's evidence.
fn per_second_admissions(run: &Run, a: &AlgoRun) {
    let exact: Trace = a
        .trace
        .iter()
        .zip(exact(a.name, run.shape, &a.trace))
        .map(|(&(at, key, _), ok)| (at, key, ok))
        .collect();
    let (fleet, exact) = (by_key(&a.trace), by_key(&exact));
    let per_second = |t: &[(u64, bool)]| {
        let mut counts = std::collections::BTreeMap::new();
        for &(at, ok) in t {
            *counts.entry(at / 1_000_000_000).or_insert(0u64) += u64::from(ok);
        }
        counts.into_iter().collect::<Vec<_>>()
    };
    for key in [FLOOD, PACED] {
        eprintln!(
            "{} key {key}: admissions per second (second, count), fleet {:?}, exact {:?}",
            a.name,
            per_second(&fleet[&key]),
            per_second(&exact[&key])
        );
    }
}

/// The row BENCHMARKS.md's table takes: per algorithm, both hot keys together, and the worst
/// window ([`worst_window`]).
fn report(fault: &str, run: &Run) {
    for a in &run.algos {
        debug_stats(a);
        let c = compare(a, run.shape, |_| true);
        eprintln!(
            "FAULT-ROW | {fault} | {} | {} | {} | {:.3} | {:.3} | {:.2}% | {:.2}% | {} | {} | {} |",
            a.name,
            c.fleet,
            c.exact,
            c.ratio(),
            worst_window(run, a),
            100.0 * c.wrongly_denied_share(),
            100.0 * c.wrongly_allowed_share(),
            lag(a).as_millis(),
            total(a, "degraded"),
            total(a, "failed_calls"),
        );
    }
}

/// The bounds of the hot shape, `slack` above those of a fleet without the fault (G47–G49,
/// G56 in docs/GUARANTEES.md): GCRA never above `rate × span + burst` and the allowance; a
/// window within its limit and what the others admit within one lag (the run's own lag,
/// which the fault stretches); EARRRL and the exponential limiter above one exact limiter by
/// at most [`rate_bound`] of its admissions, or what the others admit within one lag (a
/// burst on a key the others' views lack), whichever is more. Where the fallback decided, a
/// window may also hold the others' fallback shares on top of what one instance had taken
/// ([`fallback_excess`]), and EARRRL and the exponential limiter the fallback's rate (the
/// instances' shares of the limit: all of it) over the time the fleet ran on it, and each
/// instance's burst on turning to it.
fn bounds(run: &Run, slack: u64) {
    let shape = run.shape;
    for a in &run.algos {
        let degraded = total(a, "degraded");
        // The time each instance ran on its fallback, on average: its share of the
        // decisions, of the run.
        let fallback_secs = run.duration.as_secs_f64() * degraded as f64 / a.trace.len() as f64;
        let fallback = if degraded > 0 {
            fallback_excess(shape)
        } else {
            0
        };
        // A rate limiter's fallback starts each instance that turns to it from its own state
        // beside the others' assumed `(1 − f)` of the limit: a burst of up to its share of
        // the limit over the state's time constant (EARRRL's half-life / ln 2, 1.44 s here;
        // the exponential's period, 1 s), once per instance that decided by it.
        let turned = a.stats.iter().filter(|s| s["degraded"].as_u64() > Some(0));
        let fallback_burst =
            turned.count() as f64 * (shape.share() * shape.limit() / std::f64::consts::LN_2).ceil();
        for key in [FLOOD, PACED] {
            if assert_gcra_or_window_bound(run, a, key, slack, fallback) {
                continue;
            }
            let c = compare(a, shape, |k| k == key);
            let lagging =
                (rate_bound(lag(a)) * c.exact as f64).max(window_excess(run, a, key) as f64);
            let most = c.exact as f64 + lagging + shape.limit() * fallback_secs + fallback_burst;
            assert!(
                c.fleet as f64 <= most,
                "{} key {key}: above {most:.0} at a lag of {:?}, {fallback_secs:.2} s \
                 on the fallback: {c:?}",
                a.name,
                lag(a)
            );
        }
        assert_eq!(total(a, "errors"), 0, "{}: errors", a.name);
    }
}

/// Issue #59's faults (a stall, a restart, a flush, a connection reset, a deaf subscription,
/// a cold start, a late joiner) cost the windows nothing beyond a healthy fleet's bound: the
/// limit and what the others admit within one lag, no fallback share on top (G56). Each
/// instance's fallback takes its share of what the quota had left beside what it heard
/// (before the subscription broke too), an own push overdue hands the decisions to it, a
/// push never lowers what the others were heard to hold, the window in which Redis came back
/// stays the fallback's, and a key not heard of waits for the first round after its first
/// request.
fn windows_within_a_lag(run: &Run) {
    for a in run
        .algos
        .iter()
        .filter(|a| matches!(a.name, "fixed" | "sliding"))
    {
        for key in [FLOOD, PACED] {
            assert_gcra_or_window_bound(run, a, key, 0, 0);
        }
    }
}

/// Issue #59's bound for the faults it names (Redis restarted or flushed, an outage with
/// shares, a cold start, with clocks ±2 s apart too, a late joiner): no fixed or sliding
/// window above 1.10× its limit, GCRA not above `1.1 × (rate × span + burst)`, EARRRL's and
/// the exponential limiter's worst second not above 1.10× their exact twin's
/// ([`worst_window`]), at a healthy fleet's lag (50 ms at most, G49's). Beyond it the bound is
/// G48's, which [`windows_within_a_lag`] asserts: with the Valkey suite beside it on two cores,
/// as `.ci/run` runs them, lags of 57–83 ms took a flush's windows to 1.2× and a cold start's
/// fixed window to 1.11×. (A push's lag counts from when Redis' time is known, so a clock
/// 2 s off is no lag of 2 s.) EARRRL's late joiner went to 1.12x before what an instance
/// admits unheard was held to its share of what is left for it too (G49), and to 1.12-1.26x
/// in 5 runs of 23 before the joiner's strict denials while it waits for its first round were
/// counted (its union's slow crossing of the limit came late).
fn within_a_tenth(run: &Run) {
    for a in &run.algos {
        let (worst, lag) = (worst_window(run, a), lag(a));
        if lag > Duration::from_millis(50) {
            eprintln!(
                "{}: worst window {worst:.3}x at a lag of {lag:?}: G48's bound only",
                a.name
            );
            continue;
        }
        if worst > 1.10 {
            // What the next reader needs: which second, on which key, against the twin.
            per_second_admissions(run, a);
        }
        assert!(
            worst <= 1.10,
            "{}: worst window {worst:.3}x at a lag of {lag:?}",
            a.name
        );
    }
}

/// What an outage adds to the bounds (`tests/hybrid_fleet.rs`'s outage): Redis forgets the
/// reservations (one more burst), and each instance's fallback decides its part of the burst
/// ([`gcra_allowance`]).
fn outage_slack(shape: Shape) -> u64 {
    shape.burst() + gcra_allowance(shape)
}

/// What EARRRL and the exponential limiter may admit above one exact limiter, as a share of
/// its admissions: 10% while the lag stays within 50 ms, in proportion to the lag beyond
/// (docs/GUARANTEES.md). Each decides on a union that lacks the others' impulses of the last
/// lag, so the rate it measures is low by what they sent within it.
fn rate_bound(lag: Duration) -> f64 {
    0.1 * (lag.as_secs_f64() / 0.05).max(1.0)
}

/// The fallback's part of a window's excess while pushes are lost: each instance decides
/// alone on its share, whatever it had admitted before, so the others' shares (up to
/// `(N − 1) × ⌊share × limit⌋`) may come on top of what one had taken.
fn fallback_excess(shape: Shape) -> u64 {
    (WORKERS as u64 - 1) * (shape.share() * shape.limit()).floor() as u64
}

/// Every algorithm decided some requests degraded, each counted (G-numbers in
/// docs/GUARANTEES.md): a fault that cut the instances off Redis shows in their stats.
fn degraded_counted(run: &Run) {
    for a in &run.algos {
        assert!(total(a, "failed_calls") > 0, "{}: no failed call", a.name);
        assert!(total(a, "degraded") > 0, "{}: no degraded decision", a.name);
    }
}

/// Every algorithm decided by its fallback (counted) with no call failing: the subscription
/// was lost, not Redis.
fn degraded_counted_without_failures(run: &Run) {
    for a in &run.algos {
        assert!(total(a, "degraded") > 0, "{}: no degraded decision", a.name);
        assert_eq!(total(a, "failed_calls"), 0, "{}", a.name);
    }
}

/// A fault run against a server of its own; nothing (with a message) without `redis-server`.
fn with_server(fault: &str, f: impl FnOnce(&Server) -> Run) -> Option<Run> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start()?;
    let run = f(&server);
    report(fault, &run);
    Some(run)
}

fn latency(fault: &str, delay: Duration) -> Option<Run> {
    with_server(fault, |server| {
        let mut proxy = None;
        through_proxy(&mut proxy, server, |p| {
            p.faults.delay(delay, delay / 2);
            Setup {
                // A round trip past the I/O timeout: no call completes.
                skip_ids: 2 * delay > Duration::from_millis(200),
                ..Setup::default()
            }
        })
    })
}

/// 20 ms each way (±10 ms): every round trip 40 ms, four sync intervals. The bounds of a
/// fleet without faults hold, at the lag the latency makes.
// Pins G56.
#[test]
fn latency_20ms_with_jitter() {
    let Some(run) = latency("latency 20 ms ± 10", Duration::from_millis(20)) else {
        return;
    };
    bounds(&run, 0);
}

/// 200 ms each way (±100 ms): a round trip of 400 ms, longer than the client's I/O timeout
/// (200 ms): every call times out, and the fleet runs on its fallback, counted.
// Pins G56.
#[test]
fn latency_200ms_with_jitter() {
    let Some(run) = latency("latency 200 ms ± 100", Duration::from_millis(200)) else {
        return;
    };
    bounds(&run, outage_slack(run.shape));
    degraded_counted(&run);
}

/// 5% of the segments lost each way: each loss holds its stream back a retransmission
/// timeout (200 ms), as TCP does.
// Pins G56.
#[test]
fn five_percent_loss() {
    let Some(run) = with_server("loss 5%", |server| {
        let mut proxy = None;
        through_proxy(&mut proxy, server, |p| {
            p.faults.loss(0.05);
            Setup::default()
        })
    }) else {
        return;
    };
    bounds(&run, outage_slack(run.shape));
}

/// Nothing moves between the instances and Redis for 3 s (from 3 s in): the calls time out,
/// the fleet decides by its fallback (counted), and after the stall the back-dated charges
/// land. The bounds of an outage (one more burst and the allowance).
// Pins G56.
#[test]
fn a_three_second_stall() {
    let Some(run) = with_server("stall 3 s", |server| {
        let mut proxy = None;
        through_proxy(&mut proxy, server, |p| {
            let f = p.faults.clone();
            let g = p.faults.clone();
            Setup {
                events: vec![
                    (Duration::from_secs(3), Box::new(move || f.stall(true))),
                    (Duration::from_secs(6), Box::new(move || g.stall(false))),
                ],
                window: Some((Duration::from_secs(3), Duration::from_secs(6))),
                ..Setup::default()
            }
        })
    }) else {
        return;
    };
    bounds(&run, outage_slack(run.shape));
    degraded_counted(&run);
    windows_within_a_lag(&run);
}

/// The subscriptions go deaf for 5 s (from 3 s in): what Redis publishes never reaches
/// them, while the sync rounds' commands pass. The instances notice (their own round's
/// push does not come back) and subscribe again.
// Pins G56.
#[test]
fn half_open_pubsub_for_five_seconds() {
    let Some(run) = with_server("half-open pub/sub 5 s", |server| {
        let mut proxy = None;
        through_proxy(&mut proxy, server, |p| {
            let f = p.faults.clone();
            Setup {
                events: vec![
                    (Duration::from_secs(3), Box::new(move || p.deafen_pubsub())),
                    (
                        Duration::from_secs(8),
                        Box::new(move || f.deaf_pubsub(false)),
                    ),
                ],
                window: Some((Duration::from_secs(3), Duration::from_secs(8))),
                ..Setup::default()
            }
        })
    }) else {
        return;
    };
    for a in &run.algos {
        assert!(
            total(a, "deaf") > 0,
            "{}: the deaf subscription went unnoticed",
            a.name
        );
    }
    bounds(&run, fallback_excess(run.shape));
    windows_within_a_lag(&run);
    degraded_counted_without_failures(&run);
}

/// Every connection between the instances and Redis reset at once, 4 s in.
// Pins G56.
#[test]
fn every_connection_reset() {
    let Some(run) = with_server("connections reset", |server| {
        let mut proxy = None;
        through_proxy(&mut proxy, server, |p| Setup {
            events: vec![(Duration::from_secs(4), Box::new(move || p.reset()))],
            ..Setup::default()
        })
    }) else {
        return;
    };
    bounds(&run, outage_slack(run.shape));
    windows_within_a_lag(&run);
}

/// Redis killed 3.5 s in and started again empty 3 s later (its data lost): the outage's
/// bounds (`tests/hybrid_fleet.rs` has its convergence), its degraded decisions counted.
// Pins G52, G56.
#[test]
fn redis_restarted_empty() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let outage = Some((Duration::from_millis(3500), Duration::from_secs(3)));
    let Some(run) = on_a_server(
        &WORKER_ARGS,
        Shape::Hot { skew: None },
        &ALGOS,
        SECS,
        outage,
    ) else {
        return;
    };
    report("Redis restarted empty (3 s down)", &run);
    bounds(&run, outage_slack(run.shape));
    windows_within_a_lag(&run);
    within_a_tenth(&run);
    degraded_counted(&run);
}

/// `FLUSHALL` 4 s in: every shared state lost while the instances run on.
// Pins G56.
#[test]
fn redis_flushed_mid_run() {
    let Some(run) = with_server("FLUSHALL", |server| {
        let flush = || {
            let mut con = server.raw();
            let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
        };
        hot(
            server.url(),
            &ALGOS,
            SECS,
            Setup {
                events: vec![(Duration::from_secs(4), Box::new(flush))],
                ..Setup::default()
            },
        )
    }) else {
        return;
    };
    bounds(&run, outage_slack(run.shape));
    windows_within_a_lag(&run);
    within_a_tenth(&run);
}

/// The workers' system clocks apart: `offsets` seconds each.
fn clocks(fault: &str, offsets: [f64; 4]) -> Option<Run> {
    if !faketime_installed() {
        return None;
    }
    with_server(fault, |server| {
        hot(
            server.url(),
            &ALGOS,
            SECS,
            Setup {
                clock_offsets: offsets.to_vec(),
                ..Setup::default()
            },
        )
    })
}

/// Clocks 50 ms apart (+50, −50, +25, −25 ms): the instances keep Redis' time, so the bounds
/// of a fleet whose clocks agree hold.
// Pins G56.
#[test]
fn clocks_fifty_ms_apart() {
    let Some(run) = clocks("clocks ±50 ms", [0.05, -0.05, 0.025, -0.025]) else {
        return;
    };
    bounds(&run, 0);
}

/// Clocks 2 s apart (+2, −2, +1, −1 s).
// Pins G56.
#[test]
fn clocks_two_seconds_apart() {
    let Some(run) = clocks("clocks ±2 s", [2.0, -2.0, 1.0, -1.0]) else {
        return;
    };
    bounds(&run, 0);
}

/// A cold start: the instances built and taking traffic 2 s before Redis answers (its port
/// refuses until then), with clocks apart by `offsets`.
fn cold_start(fault: &str, offsets: [f64; 4]) -> Option<Run> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !redis_server::installed(&[&redis_server::server_bin()], "Redis backend") {
        return None;
    }
    if offsets.iter().any(|&o| o != 0.0) && !faketime_installed() {
        return None;
    }
    let port = redis_server::free_port();
    let server = std::cell::RefCell::new(None);
    let run = hot(
        format!("redis://127.0.0.1:{port}/"),
        &ALGOS,
        SECS,
        Setup {
            events: vec![(
                Duration::from_secs(2),
                Box::new(|| *server.borrow_mut() = Server::start_on(Some(port))),
            )],
            window: Some((Duration::ZERO, Duration::from_secs(2))),
            clock_offsets: offsets.to_vec(),
            lead: Some(Duration::from_millis(300)),
            ..Setup::default()
        },
    );
    report(fault, &run);
    Some(run)
}

/// Started 2.3 s before Redis: the fallback decides the first 2 s (counted), its GCRA debt
/// charged back-dated to each instance's first fallback admission once Redis answers.
// Pins G56.
#[test]
fn cold_start_before_redis() {
    let Some(run) = cold_start("cold start (Redis 2 s late)", [0.0; 4]) else {
        return;
    };
    // An outage's slack (G52): measured, at most 1 unit above G47's own bound (1 run in 3;
    // the fallbacks' charges, each back-dated to its instance's first failed round).
    bounds(&run, outage_slack(run.shape));
    degraded_counted(&run);
    windows_within_a_lag(&run);
    within_a_tenth(&run);
}

/// A cold start with clocks 2 s apart: before Redis answers, an instance knows only its own
/// clock, and its fallback's states are stamped by it, up to 2 s ahead of the fleet's time.
/// Every algorithm within its bounds: a window state stamped ahead is counted in the current
/// window (`Merge::pull_back`). Before that, the fixed window's union took the latest window
/// and dropped the others' counts of the true one: 1.60–1.90× exact, one window 1,000 of a
/// limit of 100; the sliding window 1.26×.
// Pins G56.
#[test]
fn cold_start_with_clocks_two_seconds_apart() {
    let Some(run) = cold_start("cold start, clocks ±2 s", [2.0, -2.0, 1.0, -1.0]) else {
        return;
    };
    degraded_counted(&run);
    bounds(&run, outage_slack(run.shape));
    windows_within_a_lag(&run);
    within_a_tenth(&run);
}

/// A late joiner: worker 3 builds its limiter 4 s into the traffic, while the others have
/// been running: keys it has not heard of are decided by its fallback (counted) until a
/// horizon has passed or a push brings them, within the bounds with the fallback's part.
// Pins G49, G56.
#[test]
fn a_late_joiner() {
    let Some(run) = with_server("late joiner (4 s)", |server| {
        hot(
            server.url(),
            &ALGOS,
            SECS,
            Setup {
                late: Some((3, Duration::from_secs(4))),
                ..Setup::default()
            },
        )
    }) else {
        return;
    };
    bounds(&run, 0);
    windows_within_a_lag(&run);
    within_a_tenth(&run);
}

/// EARRRL under a flood, 2 runs (20, then 10, then 4, before CI's time was cut: 1.006–1.021×
/// exact, then 1.002–1.006× since its unheard admissions are held): the hot keys (one at 10× the
/// limit), EARRRL alone, 6 s a run. Every run within the bound (G49, G56): the run a held-out
/// probe saw once in 8 at 1.4× exact is not reproduced here (its cause is not known; the
/// offset to Redis' time set from a slow round trip, which would shift every decision's time,
/// is one candidate, and it now follows the quickest round trips).
// Pins G49, G56.
#[test]
fn earrrl_under_a_flood_two_runs() {
    let mut ratios = Vec::new();
    for i in 0..2 {
        let Some(run) = with_server(&format!("earrrl flood, run {i}"), |server| {
            hot(
                server.url(),
                &["earrrl"],
                Duration::from_secs(6),
                Setup::default(),
            )
        }) else {
            return;
        };
        bounds(&run, 0);
        ratios.push(compare(&run.algos[0], run.shape, |_| true).ratio());
    }
    ratios.sort_by(f64::total_cmp);
    eprintln!("EARRRL-FLOOD ratios over 2 runs: {ratios:.3?}");
}
