//! The Redis backend against a real `redis-server` that each test starts on 127.0.0.1 (a free
//! port, no persistence). Without `redis-server` on the PATH the tests print why and pass,
//! unless `HOTLIMIT_REQUIRE_REDIS=1` (set by `.ci/run`), which makes that a failure.

use hotlimit::algo::{
    Algorithm, AllOf, Bias, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow,
    SubWindow,
};
use hotlimit::{
    redis::{BackendError, FailMode, RedisAlgorithm, RedisLimiter, BATCH_TRIP, MIN_EXPLICIT_TTL},
    CasLimiter, Decision, ManualClock, Policy, QuotaError, Rate,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

mod redis_server;
use hotlimit::RateLimiter;
use hotlimit::Requests;
use redis_server::{close, Server};

fn limiter<A: RedisAlgorithm>(server: &Server, algo: A) -> RedisLimiter<A> {
    RedisLimiter::builder(server.url(), algo)
        .key_prefix("test:")
        .build()
        .unwrap()
}

/// GCRA at 1/h with `burst`: nothing refills while a test runs, so every count is exact.
fn hourly(burst: u64) -> Gcra {
    Gcra::new("1/h".parse().unwrap())
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

/// One request of a trace: (key, time in ns, cost).
type Req = (&'static str, u64, u64);

fn trace(seed: u64, n: usize, mean_gap: u64, max_cost: u64) -> Vec<Req> {
    let keys = ["a", "b", "c"];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 0u64;
    (0..n)
        .map(|_| {
            // Bursts at one instant and gaps of up to 4 mean gaps.
            if rng.random_bool(0.3) {
                t += rng.random_range(0..4 * mean_gap);
            }
            (
                keys[rng.random_range(0..3)],
                t,
                rng.random_range(1..=max_cost),
            )
        })
        .collect()
}

/// Runs `trace` through the in-memory limiter and the Redis one, at the same explicit times,
/// calling `same` on each pair of decisions. Returns (allowed, denied).
fn compare<A: RedisAlgorithm + Algorithm + Clone>(
    server: &Server,
    algo: A,
    trace: &[Req],
    same: impl Fn(usize, &Decision, &Decision),
) -> (usize, usize) {
    let clock = ManualClock::default();
    let mem = CasLimiter::<String, _, _>::with_clock(algo.clone(), clock.clone());
    // A fresh prefix per run: the server outlives it.
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let red = RedisLimiter::builder(server.url(), algo)
        .key_prefix(format!("trace{run}:"))
        .build()
        .unwrap();
    let (mut allowed, mut denied) = (0, 0);
    for (i, &(key, t, cost)) in trace.iter().enumerate() {
        clock.set(Duration::from_nanos(t));
        if i % 5 == 0 {
            // A peek reads the same state and writes nothing, in both.
            let m = mem.request(key).cost(cost).peek().unwrap();
            let r = red.request(key).cost(cost).at(t).peek().unwrap();
            same(i, &m, &r);
        }
        let m = mem.check_n(key, cost).unwrap();
        let r = red.request(key).cost(cost).at(t).check().unwrap();
        same(i, &m, &r);
        if m.is_allowed() {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    (allowed, denied)
}

// Pins G38.
#[test]
fn gcra_same_decisions_as_in_memory_field_for_field() {
    let Some(server) = Server::start() else {
        return;
    };
    for policy in [Policy::Leaky, Policy::Strict] {
        // T = 1/7 s rounds to 142,857,143 ns: not a round number.
        let gcra: Gcra = "7/s burst 5".parse().unwrap();
        let gcra = gcra.with_policy(policy);
        let t = trace(1, 3000, 600_000_000, 5);
        let (allowed, denied) = compare(&server, gcra, &t, |i, m, r| {
            assert_eq!(m, r, "request {i} ({policy})");
        });
        assert!(allowed > 300 && denied > 300, "{allowed} {denied}");
    }
}

/// The window algorithms are integer arithmetic in both: every field of every decision
/// agrees, for both policies and every bias.
// Pins G38.
#[test]
fn windows_same_decisions_as_in_memory_field_for_field() {
    let Some(server) = Server::start() else {
        return;
    };
    // Not a round number of nanoseconds, so window and bucket edges fall anywhere.
    let w = Duration::from_nanos(1_300_000_007);
    for policy in [Policy::Leaky, Policy::Strict] {
        let exact = |i: usize, m: &Decision, r: &Decision| {
            assert_eq!(m, r, "request {i} ({policy})");
        };
        let t = trace(4, 3000, 100_000_000, 3);
        let mut runs = vec![
            (
                "fixed window",
                compare(
                    &server,
                    FixedWindow::new(10, w).unwrap().with_policy(policy),
                    &t,
                    exact,
                ),
            ),
            (
                "sliding log",
                compare(
                    &server,
                    SlidingLog::new(10, w).unwrap().with_policy(policy),
                    &t,
                    exact,
                ),
            ),
        ];
        for bias in [Bias::Strict, Bias::Lenient] {
            let a = SlidingWindow::new(10, w)
                .unwrap()
                .with_bias(bias)
                .with_policy(policy);
            runs.push(("sliding window", compare(&server, a, &t, exact)));
        }
        for bias in [Bias::Strict, Bias::Lenient] {
            let a = SubWindow::new(10, w, 7)
                .unwrap()
                .with_bias(bias)
                .with_policy(policy);
            runs.push(("sub-window", compare(&server, a, &t, exact)));
        }
        for (name, (allowed, denied)) in runs {
            // Strict lockouts keep a hammering trace out longer: fewer allowed, still many.
            assert!(
                allowed > 50 && denied > 300,
                "{name} {policy}: {allowed} {denied}"
            );
        }
    }
}

/// Several quotas on one key in one script call: every field of every decision as the
/// in-memory `AllOf`, nested too, both policies; each quota's state under its own key.
// Pins G38.
#[test]
fn all_of_same_decisions_as_in_memory_field_for_field() {
    let Some(server) = Server::start() else {
        return;
    };
    let w = Duration::from_nanos(1_300_000_007);
    for policy in [Policy::Leaky, Policy::Strict] {
        let exact = |i: usize, m: &Decision, r: &Decision| {
            assert_eq!(m, r, "request {i} ({policy})");
        };
        let t = trace(6, 3000, 200_000_000, 3);
        // A burst quota and a window quota.
        let gcra: Gcra = "7/s burst 5".parse().unwrap();
        let two = AllOf::new(
            gcra.with_policy(policy),
            FixedWindow::new(12, w * 2).unwrap().with_policy(policy),
        );
        let (a, d) = compare(&server, two, &t, exact);
        eprintln!("two {policy}: {a} allowed, {d} denied");
        assert!(a > 100 && d > 300, "two {policy}: {a} {d}");
        // Three, nested, with the two-key sliding log first.
        let three = AllOf::new(
            SlidingLog::new(10, w).unwrap().with_policy(policy),
            AllOf::new(
                gcra.with_policy(policy),
                SubWindow::new(15, w * 3, 5).unwrap().with_policy(policy),
            ),
        );
        let (a, d) = compare(&server, three, &t, exact);
        eprintln!("three {policy}: {a} allowed, {d} denied");
        assert!(a > 100 && d > 300, "three {policy}: {a} {d}");
    }
    // Where the quotas' states are: under the client's key, one each.
    let r = limiter(
        &server,
        AllOf::new(
            SlidingLog::new(10, w).unwrap(),
            "7/s burst 5".parse::<Gcra>().unwrap(),
        ),
    );
    let _ = r.request("k").at(0).check().unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", r.redis_key("k")))
        .query(&mut server.raw())
        .unwrap();
    keys.sort();
    let base = r.redis_key("k");
    assert_eq!(
        keys,
        [
            format!("{base}:0"),
            format!("{base}:0:n"),
            format!("{base}:1")
        ]
    );
}

/// A 3-day sliding window in nanoseconds: its weighted counts (up to 10^3 × 2.6·10^14) are
/// beyond what an `f64` counts exactly, and still agree field for field.
// Pins G38.
#[test]
fn sliding_window_beyond_2_pow_53_same_decisions() {
    let Some(server) = Server::start() else {
        return;
    };
    let w = Duration::from_secs(3 * 86_400) + Duration::from_nanos(13);
    for policy in [Policy::Leaky, Policy::Strict] {
        for bias in [Bias::Strict, Bias::Lenient] {
            let a = SlidingWindow::new(1000, w)
                .unwrap()
                .with_bias(bias)
                .with_policy(policy);
            // A mean gap of w / 2000 and costs up to 3: about twice the limit.
            let t = trace(5, 2000, 130_000_000_000, 3);
            let (allowed, denied) = compare(&server, a, &t, |i, m, r| {
                assert_eq!(m, r, "request {i} ({policy}, {bias:?})");
            });
            assert!(allowed > 300 && denied > 300, "{allowed} {denied}");
        }
    }
}

// Pins G38.
#[test]
fn gcra_spec_vector() {
    let Some(server) = Server::start() else {
        return;
    };
    let r = limiter(&server, "10/s burst 5".parse::<Gcra>().unwrap());
    let ms = 1_000_000;
    for left in (0..5).rev() {
        let d = r.request("k").at(0).check().unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), Some(left));
    }
    let d = r.request("k").at(0).check().unwrap();
    assert_eq!(d.retry_after(), Duration::from_millis(100));
    assert!(r.request("k").at(100 * ms).check().unwrap().is_allowed());
    assert_eq!(
        r.request("k").at(100 * ms).check().unwrap().retry_after(),
        Duration::from_millis(100)
    );
    assert_eq!(
        r.request("k").at(350 * ms).check().unwrap().remaining(),
        Some(1)
    );
    assert_eq!(
        r.request("k").at(350 * ms).check().unwrap().remaining(),
        Some(0)
    );
    assert_eq!(
        r.request("k").at(350 * ms).check().unwrap().retry_after(),
        Duration::from_millis(50)
    );
}

// Pins G38.
#[test]
fn earrrl_same_decisions_as_in_memory() {
    let Some(server) = Server::start() else {
        return;
    };
    for policy in [Policy::Strict, Policy::Leaky] {
        let e = Earrrl::new(
            Duration::from_secs(2),
            Rate::new(3.0, Duration::from_secs(1)).unwrap(),
        )
        .unwrap()
        .with_policy(policy);
        let t = trace(2, 3000, 250_000_000, 3);
        let exact = std::cell::Cell::new(0);
        let (allowed, denied) = compare(&server, e, &t, |i, m, r| {
            close(i, m, r);
            exact.set(exact.get() + (m == r) as u32);
        });
        eprintln!(
            "EARRRL {policy}: {} of {} decisions bit-identical",
            exact.get(),
            t.len()
        );
        assert!(allowed > 300 && denied > 300, "{allowed} {denied}");
    }
}

// Pins G38.
#[test]
fn earrrl_spec_vector() {
    let Some(server) = Server::start() else {
        return;
    };
    let e = Earrrl::new(
        Duration::from_secs(2),
        Rate::new(3.0, Duration::from_secs(1)).unwrap(),
    )
    .unwrap();
    let r = limiter(&server, e);
    let rates: Vec<Decision> = (0..19)
        .map(|i| r.request("k").at(i * 250_000_000).check().unwrap())
        .collect();
    assert!((rates[1].rate().unwrap() - 0.317809383554).abs() < 1e-12);
    assert!((rates[8].rate().unwrap() - 1.914607625636).abs() < 1e-12);
    assert!(rates[..18].iter().all(Decision::is_allowed));
    assert!(rates[18].is_denied());
    assert!((rates[18].rate().unwrap() - 3.024221906765).abs() < 1e-12);
}

// Pins G38.
#[test]
fn exponential_same_decisions_as_in_memory() {
    let Some(server) = Server::start() else {
        return;
    };
    for policy in [Policy::Leaky, Policy::Strict] {
        let e = Exponential::new(10.0, Duration::from_secs(60))
            .unwrap()
            .with_policy(policy);
        let t = trace(3, 3000, 6_000_000_000, 3);
        let exact = std::cell::Cell::new(0);
        let (allowed, denied) = compare(&server, e, &t, |i, m, r| {
            close(i, m, r);
            exact.set(exact.get() + (m == r) as u32);
        });
        eprintln!(
            "exponential {policy}: {} of {} decisions bit-identical",
            exact.get(),
            t.len()
        );
        assert!(allowed > 300 && denied > 300, "{allowed} {denied}");
    }
}

// Pins G38.
#[test]
fn exponential_burst_is_floor_of_limit_over_cost() {
    let Some(server) = Server::start() else {
        return;
    };
    let r = limiter(
        &server,
        Exponential::new(10.0, Duration::from_secs(60)).unwrap(),
    );
    for cost in [1, 3, 4] {
        let key = format!("burst{cost}");
        let allowed = (0..20)
            .filter(|_| {
                r.request(&key)
                    .cost(cost)
                    .at(5)
                    .check()
                    .unwrap()
                    .is_allowed()
            })
            .count();
        assert_eq!(allowed as u64, 10 / cost, "cost {cost}");
    }
}

// Pins G39.
#[test]
fn concurrent_clients_get_exact_totals() {
    let Some(server) = Server::start() else {
        return;
    };
    let burst = 200u64;
    let base = limiter(
        &server,
        Gcra::new("1/h".parse().unwrap())
            .unwrap()
            .with_burst(burst)
            .unwrap(),
    );
    // At one frozen explicit `now`, and on Redis' own clock (1/h: time adds nothing here).
    for (key, at) in [("frozen", Some(1_000_000_000u64)), ("server", None)] {
        let allowed: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let r = base.try_clone().unwrap();
                    s.spawn(move || {
                        (0..150)
                            .filter(|_| {
                                match at {
                                    Some(now) => r.request(key).at(now).check(),
                                    None => r.request(key).check(),
                                }
                                .unwrap()
                                .is_allowed()
                            })
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(allowed as u64, burst, "{key}");
    }
}

// Pins G45.
#[test]
fn pipelined_batches_count_exactly() {
    let Some(server) = Server::start() else {
        return;
    };
    let r = limiter(&server, hourly(50));
    let batch: Vec<(&str, u64)> = (0..40).map(|_| ("p", 1)).collect();
    let before = r.stats().round_trips;
    let a = r.try_check_pipelined(&batch).unwrap();
    let b = r.try_check_pipelined(&batch).unwrap();
    assert_eq!(r.stats().round_trips - before, 2);
    let allowed = a.iter().chain(&b).filter(|d| d.is_allowed()).count();
    assert_eq!(allowed, 50);
    assert!(matches!(
        r.try_check_pipelined(&[("p", 1), ("p", 51)]),
        Err(BackendError::Cost(QuotaError::ExceedsCapacity { .. }))
    ));
}

/// What a `(allowed, remaining)` pair of answers compares: at 1/h nothing refills while a
/// test runs, so Redis on its clock and an in-memory twin at one instant agree on both.
fn seen(a: &Result<Decision, QuotaError>) -> Result<(bool, Option<u64>), QuotaError> {
    a.clone().map(|d| (d.is_allowed(), d.remaining()))
}

/// A batch: one round trip for the whole batch (up to `BATCH_TRIP` requests), each answer what one `check_n` gives (an
/// in-memory twin), a refused cost its error and not sent.
// Pins G45.
#[test]
fn batches_take_one_round_trip_and_decide_as_check_n() {
    let Some(server) = Server::start() else {
        return;
    };
    let gcra = hourly(30);
    let r = limiter(&server, gcra);
    let twin = CasLimiter::<String, Gcra, _>::with_clock(gcra, ManualClock::default());
    // Three keys, costs 1 to 4: each key runs out of its burst within the batch.
    let mut requests: Vec<(&str, u64)> = (0..60)
        .map(|i| (["a", "b", "c"][i % 3], 1 + (i % 4) as u64))
        .collect();
    requests.insert(7, ("a", 0));
    requests.insert(20, ("b", 51));
    let mut out = Vec::new();
    let before = r.stats().round_trips;
    r.check_n_batch(requests.iter().copied(), &mut out);
    assert_eq!(r.stats().round_trips - before, 1);
    let want: Vec<_> = requests
        .iter()
        .map(|&(k, c)| seen(&twin.check_n(k, c)))
        .collect();
    let got: Vec<_> = out.iter().map(seen).collect();
    assert_eq!(got, want);
    assert_eq!(got[7], Err(QuotaError::ZeroCost));
    assert!(got.iter().any(|a| matches!(a, Ok((false, _)))));
    // `check_batch`, cost 1 each (into a vector it clears first): a fresh key and the
    // spent ones.
    let keys = ["d", "a", "d", "b", "d"];
    let mut ones = vec![twin.check("z")];
    r.check_batch(keys, &mut ones);
    assert_eq!(r.stats().round_trips - before, 2);
    let want: Vec<_> = keys.iter().map(|&k| seen(&Ok(twin.check(k)))).collect();
    let got: Vec<_> = ones.iter().map(|&d| seen(&Ok(d))).collect();
    assert_eq!(got, want);
    // A batch longer than a round trip carries goes in several, in order.
    let long: Vec<(&str, u64)> = (0..2 * BATCH_TRIP + 10).map(|_| ("e", 1)).collect();
    let before = r.stats().round_trips;
    r.check_n_batch(long.iter().copied(), &mut out);
    assert_eq!(r.stats().round_trips - before, 3);
    let allowed: Vec<bool> = out
        .iter()
        .map(|a| a.as_ref().unwrap().is_allowed())
        .collect();
    assert_eq!(allowed.len(), long.len());
    assert!(allowed[..30].iter().all(|&a| a) && !allowed[30..].iter().any(|&a| a));
    assert_eq!((r.stats().errors, r.stats().failures), (0, 0));
}

/// A batch whose round trip fails answers every request it carried with the fail mode,
/// counted once each; refused costs keep their errors.
// Pins G42.
#[test]
fn a_batch_in_an_outage_answers_the_fail_mode_for_each_request() {
    let Some(server) = Server::start() else {
        return;
    };
    let retry_after = Duration::from_secs(2);
    let r = RedisLimiter::builder(server.url(), "1/s burst 5".parse::<Gcra>().unwrap())
        .fail_mode(FailMode::Closed { retry_after })
        .build()
        .unwrap();
    assert!(r.check("k").is_allowed());
    drop(server); // kills and reaps the child
    let mut out = Vec::new();
    for round in 1..=2 {
        r.check_n_batch([("k", 1), ("k", 0), ("j", 2), ("k", 9)], &mut out);
        let got: Vec<_> = out
            .iter()
            .map(|a| a.clone().map(|d| (d.is_allowed(), d.retry_after())))
            .collect();
        assert_eq!(
            got,
            [
                Ok((false, retry_after)),
                Err(QuotaError::ZeroCost),
                Ok((false, retry_after)),
                Err(QuotaError::ExceedsCapacity {
                    cost: 9,
                    capacity: 5
                }),
            ],
            "round {round}"
        );
        assert_eq!((r.stats().failures, r.stats().errors), (2 * round, 0));
    }
}

/// With the local fast path, a batch answers the keys it knows are denied without sending
/// them, and learns from the replies of the ones it sends.
// Pins G43.
#[test]
fn a_batch_uses_and_feeds_the_local_fast_path() {
    let Some(server) = Server::start() else {
        return;
    };
    let gcra = hourly(3);
    let r = RedisLimiter::builder(server.url(), gcra)
        .local_fast_path(100)
        .build()
        .unwrap();
    let mut out = Vec::new();
    let before = r.stats().round_trips;
    assert_eq!(r.stats().local_keys, 0);
    r.check_batch(["k"; 5], &mut out);
    assert_eq!(r.stats().round_trips - before, 1);
    let allowed: Vec<bool> = out.iter().map(Decision::is_allowed).collect();
    assert_eq!(allowed, [true, true, true, false, false]);
    // The denied key is what the local fast path now holds.
    assert_eq!(r.stats().local_keys, 1);
    // Learned from the replies: "k" is denied for about an hour, so a batch of it alone
    // takes no round trip, and one with a new key sends only the new key.
    r.check_batch(["k"; 3], &mut out);
    assert_eq!(r.stats().round_trips - before, 1);
    assert!(out.iter().all(Decision::is_denied));
    assert!(out[0].retry_after() > Duration::from_secs(3000));
    r.check_batch(["k", "m", "k"], &mut out);
    assert_eq!(r.stats().round_trips - before, 2);
    let allowed: Vec<bool> = out.iter().map(Decision::is_allowed).collect();
    assert_eq!(allowed, [false, true, false]);
}

// Pins G39.
#[test]
fn script_flush_is_survived() {
    let Some(server) = Server::start() else {
        return;
    };
    let r = limiter(&server, "10/s burst 5".parse::<Gcra>().unwrap());
    assert!(r.request("k").at(0).check().unwrap().is_allowed());
    let mut raw = server.raw();
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(&mut raw)
        .unwrap();
    let before = r.stats().round_trips;
    let d = r.request("k").at(0).check().unwrap();
    assert_eq!(d.remaining(), Some(3), "the flush lost no state");
    // NOSCRIPT, SCRIPT LOAD, EVALSHA again.
    assert_eq!(r.stats().round_trips - before, 3);
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(&mut raw)
        .unwrap();
    let batch = r.try_check_pipelined(&[("q", 1), ("q", 1)]).unwrap();
    assert!(batch.iter().all(Decision::is_allowed));
    assert_eq!(r.request("k").at(0).check().unwrap().remaining(), Some(2));
}

// Pins G42.
#[test]
fn killed_server_gives_the_fail_mode_quickly() {
    let Some(server) = Server::start() else {
        return;
    };
    // A second between retries (and one request a second): what happens "within
    // reconnect_after" stays so through a stall on a loaded machine.
    let gcra: Gcra = "1/s burst 5".parse().unwrap();
    let closed = FailMode::Closed {
        retry_after: Duration::from_secs(2),
    };
    let reconnect = Duration::from_secs(1);
    let open = RedisLimiter::builder(server.url(), gcra)
        .fail_mode(FailMode::Open)
        .reconnect_after(reconnect)
        .build()
        .unwrap();
    let shut = RedisLimiter::builder(server.url(), gcra)
        .fail_mode(closed)
        .reconnect_after(reconnect)
        .build()
        .unwrap();
    for _ in 0..5 {
        assert!(open.check("k").is_allowed());
    }
    assert!(open.check("k").is_denied(), "the server decides while up");
    assert!(shut.check("k").is_denied());
    let port = server.port;
    drop(server); // kills and reaps the child

    for _ in 0..3 {
        let start = Instant::now();
        assert!(open.check("k").is_allowed());
        let d = shut.check("k");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), Duration::from_secs(2));
    }
    assert_eq!((open.stats().failures, shut.stats().failures), (3, 3));
    // The first attempt after the kill found the connection broken, the second could not
    // connect; within reconnect_after no attempt is made at all.
    assert!(matches!(
        open.request("k").check(),
        Err(BackendError::Unavailable)
    ));
    std::thread::sleep(reconnect + Duration::from_millis(50));
    assert!(matches!(
        open.request("k").check(),
        Err(BackendError::Connection(_))
    ));
    // A cost error is the caller's, not the backend's: no fail mode.
    assert_eq!(open.check_n("k", 0), Err(QuotaError::ZeroCost));

    // The server returns (empty: no persistence) on the same port: once reconnect_after has
    // passed, both limiters decide from Redis again, counting no more failures.
    let _server = Server::start_on(Some(port)).unwrap();
    std::thread::sleep(reconnect + Duration::from_millis(50));
    // One key for both: a fresh key on the fresh server, then its second request.
    for (r, remaining) in [(&open, 4), (&shut, 3)] {
        let d = r.check("k");
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.remaining(), Some(remaining));
        assert_eq!((r.stats().failures, r.stats().errors), (3, 0));
    }
}

/// An error that is not an outage (here a key of the wrong type: `WRONGTYPE` from the script)
/// is never let through by the fail mode: `check` denies and counts it in `errors()`.
// Pins G42.
#[test]
fn a_non_outage_error_is_a_denial_not_the_fail_mode() {
    let Some(server) = Server::start() else {
        return;
    };
    for mode in [
        FailMode::Open,
        FailMode::Closed {
            retry_after: Duration::from_secs(7),
        },
    ] {
        let r = RedisLimiter::builder(server.url(), "10/s".parse::<Gcra>().unwrap())
            .fail_mode(mode)
            .build()
            .unwrap();
        assert!(!r.is_cluster());
        redis::cmd("LPUSH")
            .arg(r.redis_key("k"))
            .arg("x")
            .query::<()>(&mut server.raw())
            .unwrap();
        let d = r.check("k");
        assert!(d.is_denied(), "{mode:?}");
        let expect = match mode {
            FailMode::Open => Duration::from_secs(1),
            FailMode::Closed { retry_after } => retry_after,
        };
        assert_eq!(d.retry_after(), expect);
        assert_eq!((r.stats().errors, r.stats().failures), (1, 0));
        // A request returns the error (no fail mode): the caller sees it, nothing counts it.
        for answer in [r.request("k").peek(), r.request("k").check()] {
            match answer {
                Err(e @ BackendError::Script(_)) => assert!(!e.is_outage(), "{e}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((r.stats().errors, r.stats().failures), (1, 0));
        // The connection was kept and still decides other keys.
        assert!(r.check("other").is_allowed());
        // In a batch the error is its request's alone: the others in the same round trip
        // are decided, and it counts once.
        let mut out = Vec::new();
        let before = r.stats().round_trips;
        r.check_batch(["a", "k", "a"], &mut out);
        assert_eq!(r.stats().round_trips - before, 1);
        let got: Vec<_> = out
            .iter()
            .map(|d| (d.is_allowed(), d.retry_after()))
            .collect();
        assert_eq!(
            got,
            [
                (true, Duration::ZERO),
                (false, expect),
                (true, Duration::ZERO)
            ],
            "{mode:?}"
        );
        assert_eq!((r.stats().errors, r.stats().failures), (2, 0));
        redis::cmd("DEL")
            .arg(r.redis_key("k"))
            .arg(r.redis_key("a"))
            .query::<()>(&mut server.raw())
            .unwrap();
    }
}

// Pins G42.
#[test]
fn hung_server_times_out_into_the_fail_mode() {
    let Some(server) = Server::start() else {
        return;
    };
    let r = RedisLimiter::builder(server.url(), "10/s".parse::<Gcra>().unwrap())
        .fail_mode(FailMode::Closed {
            retry_after: Duration::from_secs(1),
        })
        .io_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(r.check("k").is_allowed());
    server.signal("-STOP");
    let start = Instant::now();
    let d = r.check("k");
    let took = start.elapsed();
    server.signal("-CONT");
    assert!(d.is_denied());
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(r.stats().failures, 1);
    // The connection that timed out was dropped; a fresh one works again.
    assert!(r.check("k").is_allowed());
}

// Pins G41.
#[test]
fn keys_expire_when_the_state_is_fresh_again() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut raw = server.raw();
    let ms = 1_000_000u64;

    // Quotas slow enough that every state stays busy past MIN_EXPLICIT_TTL.
    let gcra: Gcra = "1/min burst 5".parse().unwrap();
    let r = limiter(&server, gcra);
    let mut tat = gcra.fresh();
    for _ in 0..2 {
        let _ = gcra.update(&mut tat, 40 * ms, 1);
        let _ = r.request("g").at(40 * ms).check().unwrap();
    }
    let _ = gcra.update(&mut tat, 40 * ms, 1);
    expires_after(
        &mut raw,
        &r.redis_key("g"),
        gcra.idle_at(&tat) - 40 * ms,
        || {
            let _ = r.request("g").at(40 * ms).check().unwrap();
        },
    );

    let e = Earrrl::new(
        Duration::from_secs(60),
        Rate::new(0.1, Duration::from_secs(1)).unwrap(),
    )
    .unwrap();
    let r = limiter(&server, e);
    let mut s = e.fresh();
    let _ = e.update(&mut s, 7 * ms, 2);
    expires_after(&mut raw, &r.redis_key("e"), e.idle_at(&s) - 7 * ms, || {
        let _ = r.request("e").cost(2).at(7 * ms).check().unwrap();
    });

    let x = Exponential::new(10.0, Duration::from_secs(60)).unwrap();
    let r = limiter(&server, x);
    let mut w = x.fresh();
    for _ in 0..3 {
        let _ = x.update(&mut w, 9 * ms, 2);
        let _ = r.request("x").cost(2).at(9 * ms).check().unwrap();
    }
    let _ = x.update(&mut w, 9 * ms, 2);
    expires_after(&mut raw, &r.redis_key("x"), x.idle_at(&w) - 9 * ms, || {
        let _ = r.request("x").cost(2).at(9 * ms).check().unwrap();
    });

    // A leaky denial writes nothing, expiry included.
    let r = limiter(&server, "1/s burst 1".parse::<Gcra>().unwrap());
    let _ = r.request("d").at(0).check().unwrap();
    let mut expiry = || -> i64 {
        redis::cmd("PEXPIRETIME")
            .arg(r.redis_key("d"))
            .query(&mut raw)
            .unwrap()
    };
    let before = expiry();
    assert!(r.request("d").at(0).check().unwrap().is_denied());
    assert_eq!(expiry(), before);
}

/// Runs `write` and checks that `key` then expires exactly `idle_in_ns` (rounded up to a
/// millisecond) after the write: `PEXPIRETIME` (absolute, ms) between the server's `TIME`
/// before and after the write, plus that.
fn expires_after(raw: &mut redis::Connection, key: &str, idle_in_ns: u64, write: impl FnOnce()) {
    let now_ms = |raw: &mut redis::Connection| -> i64 {
        let (s, us): (i64, i64) = redis::cmd("TIME").query(raw).unwrap();
        s * 1000 + us / 1000
    };
    let before = now_ms(raw);
    write();
    let after = now_ms(raw);
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(raw).unwrap();
    // An explicit timeline's expiry is at least MIN_EXPLICIT_TTL; the cases below are above.
    assert!(Duration::from_nanos(idle_in_ns) > MIN_EXPLICIT_TTL, "{key}");
    let ttl = idle_in_ns.div_ceil(1_000_000) as i64;
    assert!(
        (before + ttl..=after + ttl + 1).contains(&at),
        "{key}: expires at {at}, written in [{before}, {after}] ms, idle after {ttl} ms"
    );
}

/// Every window algorithm's keys expire when its state is equivalent to a fresh key's (the
/// in-memory `idle_at` of the same state), and a sub-window hash keeps no field that left
/// the span.
// Pins G41.
#[test]
fn window_keys_expire_when_fresh_and_keep_no_stale_fields() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut raw = server.raw();
    // 60 s windows: every state stays busy past MIN_EXPLICIT_TTL.
    let s = 1_000_000_000u64;
    let w = Duration::from_secs(60);

    fn replay<A: RedisAlgorithm + Clone>(
        raw: &mut redis::Connection,
        server: &Server,
        algo: A,
        key: &str,
        times: &[u64],
    ) -> RedisLimiter<A> {
        let r = limiter(server, algo.clone());
        let mut state = algo.fresh();
        let (&last, rest) = times.split_last().unwrap();
        for &t in rest {
            let _ = algo.update(&mut state, t, 1);
            let _ = r.request(key).at(t).check().unwrap();
        }
        let _ = algo.update(&mut state, last, 1);
        let idle = algo.idle_at(&state) - last;
        expires_after(raw, &r.redis_key(key), idle, || {
            let _ = r.request(key).at(last).check().unwrap();
        });
        r
    }

    replay(
        &mut raw,
        &server,
        FixedWindow::new(3, w).unwrap(),
        "fw",
        &[6 * s, 42 * s],
    );
    replay(
        &mut raw,
        &server,
        SlidingWindow::new(3, w).unwrap(),
        "sw",
        &[54 * s, 78 * s],
    );
    let log = replay(
        &mut raw,
        &server,
        SlidingLog::new(3, w).unwrap(),
        "log",
        &[6 * s, 24 * s],
    );
    // The log's total expires with it, within the millisecond the server's clock may tick
    // between the script's two expiry commands (Redis 7.0 reads it for each).
    let log_key = log.redis_key("log");
    let total_key = format!("{log_key}:n");
    let (a, b): (i64, i64) = redis::pipe()
        .cmd("PEXPIRETIME")
        .arg(&log_key)
        .cmd("PEXPIRETIME")
        .arg(&total_key)
        .query(&mut raw)
        .unwrap();
    assert!((a - b).abs() <= 1, "log expires at {a}, its total at {b}");
    // A total that outlives its log (that millisecond) counts nothing: the log is empty.
    let _: () = redis::cmd("DEL").arg(&log_key).query(&mut raw).unwrap();
    let _: () = redis::cmd("SET")
        .arg(&total_key)
        .arg(3)
        .query(&mut raw)
        .unwrap();
    let d = log.request("log").cost(3).at(30 * s).check().unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), Some(0));

    // 4 buckets of 15 s, strict bias: a request counts against 5. Buckets 0 and 1, then
    // bucket 6, whose span starts at bucket 2: both older fields are deleted.
    let sub = replay(
        &mut raw,
        &server,
        SubWindow::new(10, w, 4).unwrap(),
        "sub",
        &[0, 18 * s, 96 * s],
    );
    let mut fields: Vec<String> = redis::cmd("HKEYS")
        .arg(sub.redis_key("sub"))
        .query(&mut raw)
        .unwrap();
    fields.sort();
    assert_eq!(fields, ["6", "h"]);
}

// Pins G40.
#[test]
fn server_time_decisions() {
    let Some(server) = Server::start() else {
        return;
    };
    // One per second, so the six requests, the wait and the check after it keep their
    // meaning with a stall of up to half a second on a loaded machine.
    let r = limiter(&server, "1/s burst 5".parse::<Gcra>().unwrap());
    let mut allowed = 0;
    let mut last = None;
    for _ in 0..6 {
        let d = r.check("k");
        allowed += d.is_allowed() as u32;
        last = Some(d);
    }
    assert_eq!(allowed, 5);
    let wait = last.unwrap().retry_after();
    // A second from the first request, less the time the six took (µs resolution).
    assert!(
        wait <= Duration::from_secs(1) && wait > Duration::from_millis(500),
        "{wait:?}"
    );
    std::thread::sleep(wait);
    assert!(r.check("k").is_allowed(), "the retry_after is honest");
    let ttl: i64 = redis::cmd("PTTL")
        .arg("test:{k}")
        .query(&mut server.raw())
        .unwrap();
    // The key is idle at its tat, six seconds after the first request: 5 s after the check.
    assert!((4000..=5000).contains(&ttl), "{ttl}");
}

/// On Redis' clock (µs): each window algorithm admits its limit of six back-to-back requests
/// and denies the sixth with an honest wait within the window. The sub-window's 60 buckets of
/// 1/60 s are not whole microseconds.
// Pins G40.
#[test]
fn window_server_time_decisions() {
    let Some(server) = Server::start() else {
        return;
    };
    // Minute windows: a fixed window's boundary between the six requests would admit the
    // sixth. The sub-window keeps 1/60 s buckets (its old buckets are empty).
    let w = Duration::from_secs(60);
    fn six<A: RedisAlgorithm + std::fmt::Debug>(server: &Server, algo: A, window: Duration) {
        let name = format!("{algo:?}");
        let r = limiter(server, algo);
        // One key per algorithm: states of different algorithms must not share a key.
        let d: Vec<Decision> = (0..6).map(|_| r.request(&name).check().unwrap()).collect();
        let allowed = d.iter().filter(|d| d.is_allowed()).count();
        assert_eq!(allowed, 5, "{name}: {d:?}");
        let wait = d[5].retry_after();
        assert!(wait > Duration::ZERO && wait <= window, "{name}: {wait:?}");
        assert_eq!(d[4].remaining(), Some(0), "{name}");
    }
    six(&server, FixedWindow::new(5, w).unwrap(), w);
    six(&server, SlidingWindow::new(5, w).unwrap(), w * 2);
    six(&server, SlidingLog::new(5, w).unwrap(), w);
    let s = Duration::from_secs(1);
    six(&server, SubWindow::new(5, s, 60).unwrap(), s * 61 / 60);
}

// Pins G17, G28.
#[test]
fn peek_counts_nothing_and_costs_are_checked_before_the_round_trip() {
    let Some(server) = Server::start() else {
        return;
    };
    let r = limiter(&server, "10/s burst 2".parse::<Gcra>().unwrap());
    for _ in 0..3 {
        assert!(r.request("k").cost(2).at(0).peek().unwrap().is_allowed());
    }
    assert!(r.request("k").cost(2).at(0).check().unwrap().is_allowed());
    assert!(r.request("k").at(0).peek().unwrap().is_denied());
    let before = r.stats().round_trips;
    assert!(matches!(
        r.request("k").cost(3).check(),
        Err(BackendError::Cost(QuotaError::ExceedsCapacity {
            cost: 3,
            capacity: 2
        }))
    ));
    assert_eq!(r.check_n("k", 0), Err(QuotaError::ZeroCost));
    assert_eq!(r.stats().round_trips, before);
    assert!(matches!(
        r.request("k").at(1 << 53).check(),
        Err(BackendError::TimeOutOfRange(_))
    ));
}

// Pins G43.
#[test]
fn local_fast_path_saves_round_trips_and_keeps_decisions() {
    let Some(server) = Server::start() else {
        return;
    };
    let gcra: Gcra = "10/s burst 3".parse().unwrap();
    let plain = RedisLimiter::builder(server.url(), gcra)
        .key_prefix("plain:")
        .build()
        .unwrap();
    let fast = RedisLimiter::builder(server.url(), gcra)
        .key_prefix("fast:")
        .local_fast_path(100)
        .build()
        .unwrap();
    let t = trace(4, 2000, 20_000_000, 2);
    let (p0, f0) = (plain.stats().round_trips, fast.stats().round_trips);
    let mut denied = 0;
    for (i, &(key, now, cost)) in t.iter().enumerate() {
        let a = plain.request(key).cost(cost).at(now).check().unwrap();
        let b = fast.request(key).cost(cost).at(now).check().unwrap();
        assert_eq!(a.is_allowed(), b.is_allowed(), "request {i}");
        assert_eq!(a.retry_after(), b.retry_after(), "request {i}");
        denied += a.is_denied() as u64;
    }
    let (p, f) = (
        plain.stats().round_trips - p0,
        fast.stats().round_trips - f0,
    );
    assert_eq!(p, t.len() as u64);
    assert!(
        p - f > denied / 3,
        "{p} vs {f} round trips, {denied} denials"
    );
    eprintln!("local fast path: {f} round trips instead of {p} ({denied} denials)");
}

// Pins G40, G43.
#[test]
fn local_fast_path_on_server_time() {
    let Some(server) = Server::start() else {
        return;
    };
    // One per second: a stall on a loaded machine does not admit the third request.
    let r = RedisLimiter::builder(server.url(), "1/s burst 2".parse::<Gcra>().unwrap())
        .local_fast_path(10)
        .build()
        .unwrap();
    assert!(r.check("k").is_allowed() && r.check("k").is_allowed());
    let first = r.check("k");
    assert!(first.is_denied());
    let trips = r.stats().round_trips;
    let again = r.check("k");
    assert!(again.is_denied() && again.retry_after() <= first.retry_after());
    assert_eq!(r.stats().round_trips, trips, "denied locally");
    // Another cost is not known locally: it goes to Redis.
    assert!(matches!(r.check_n("k", 2), Ok(d) if d.is_denied()));
    assert_eq!(r.stats().round_trips, trips + 1);
    std::thread::sleep(first.retry_after());
    assert!(
        r.check("k").is_allowed(),
        "never denied past Redis' retry_after"
    );
    assert_eq!(r.stats().round_trips, trips + 2);
}

// The local fast path remembers denials under the limiter's own quota: a request with its
// own quota (a plan) is never answered by one, nor leaves one behind.
// Pins G43.
#[test]
fn local_fast_path_never_answers_a_request_with_its_own_quota() {
    let Some(server) = Server::start() else {
        return;
    };
    let (tight, loose): (Gcra, Gcra) = (
        "1/s burst 1".parse().unwrap(),
        "10/s burst 100".parse().unwrap(),
    );
    let r = RedisLimiter::builder(server.url(), tight)
        .key_prefix("plans-fast:")
        .local_fast_path(10)
        .build()
        .unwrap();
    let now = 1_000_000_000_000;
    // Spent under its own quota: the denial is remembered, the next one answered locally.
    assert!(r.request("k").at(now).check().unwrap().is_allowed());
    assert!(r.request("k").at(now).check().unwrap().is_denied());
    let trips = r.stats().round_trips;
    assert!(r.request("k").at(now).check().unwrap().is_denied());
    assert_eq!(r.stats().round_trips, trips, "denied locally");
    // The looser plan admits it: Redis is asked.
    let d = r.request("k").quota(&loose).at(now).check().unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(r.stats().round_trips, trips + 1);
    // The other way: a denial under a tight plan says nothing of a loose limiter's own quota.
    let l = RedisLimiter::builder(server.url(), loose)
        .key_prefix("plans-fast-loose:")
        .local_fast_path(10)
        .build()
        .unwrap();
    let under_tight = || l.request("k").quota(&tight).at(now).check().unwrap();
    assert!(under_tight().is_allowed());
    assert!(under_tight().is_denied());
    let trips = l.stats().round_trips;
    assert!(l.request("k").at(now).check().unwrap().is_allowed());
    assert_eq!(l.stats().round_trips, trips + 1);
}

#[cfg(feature = "redis-async")]
mod async_client {
    use super::*;
    use hotlimit::redis::AsyncRedisLimiter;
    use std::sync::Arc;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    async fn limiter<A: RedisAlgorithm>(server: &Server, algo: A) -> AsyncRedisLimiter<A> {
        RedisLimiter::builder(server.url(), algo)
            .key_prefix("async:")
            .build_async()
            .await
            .unwrap()
    }

    // Pins G38.
    #[test]
    fn same_decisions_as_the_sync_client() {
        let Some(server) = Server::start() else {
            return;
        };
        rt().block_on(async {
            let gcra: Gcra = "7/s burst 5".parse().unwrap();
            let a = limiter(&server, gcra).await;
            let s = RedisLimiter::builder(server.url(), gcra)
                .key_prefix("sync:")
                .build()
                .unwrap();
            for (i, &(key, t, cost)) in trace(5, 1000, 600_000_000, 5).iter().enumerate() {
                let x = a.request(key).cost(cost).at(t).check().await.unwrap();
                assert_eq!(
                    x,
                    s.request(key).cost(cost).at(t).check().unwrap(),
                    "request {i}"
                );
            }
        });
    }

    /// The async client's batches: a round trip per `BATCH_TRIP` requests, the answers of one
    /// `check_n` each (an in-memory twin), refused costs not sent; then, the server killed,
    /// the fail mode for each request, counted once each.
    // Pins G42, G45.
    #[test]
    fn batches_decide_as_check_n_and_fail_over_per_request() {
        let Some(server) = Server::start() else {
            return;
        };
        rt().block_on(async {
            let gcra = hourly(30);
            let retry_after = Duration::from_secs(2);
            let a = RedisLimiter::builder(server.url(), gcra)
                .key_prefix("async-batch:")
                .fail_mode(FailMode::Closed { retry_after })
                .build_async()
                .await
                .unwrap();
            let twin = CasLimiter::<String, Gcra, _>::with_clock(gcra, ManualClock::default());
            let mut requests: Vec<(&str, u64)> = (0..BATCH_TRIP + 40)
                .map(|i| (["a", "b", "c"][i % 3], 1 + (i % 4) as u64))
                .collect();
            requests.insert(7, ("a", 0));
            let (mut out, before) = (Vec::new(), a.stats().round_trips);
            a.check_n_batch(requests.iter().copied(), &mut out).await;
            assert_eq!(a.stats().round_trips - before, 2);
            let want: Vec<_> = requests
                .iter()
                .map(|&(k, c)| seen(&twin.check_n(k, c)))
                .collect();
            assert_eq!(out.iter().map(seen).collect::<Vec<_>>(), want);
            let mut ones = Vec::new();
            a.check_batch(["d", "a", "d"], &mut ones).await;
            let want: Vec<_> = ["d", "a", "d"]
                .iter()
                .map(|&k| seen(&Ok(twin.check(k))))
                .collect();
            assert_eq!(ones.iter().map(|&d| seen(&Ok(d))).collect::<Vec<_>>(), want);
            assert_eq!((a.stats().errors, a.stats().failures), (0, 0));
            drop(server); // kills and reaps the child
            a.check_n_batch([("a", 1), ("a", 0), ("e", 2)], &mut out)
                .await;
            let got: Vec<_> = out
                .iter()
                .map(|r| r.clone().map(|d| (d.is_allowed(), d.retry_after())))
                .collect();
            assert_eq!(
                got,
                [
                    Ok((false, retry_after)),
                    Err(QuotaError::ZeroCost),
                    Ok((false, retry_after))
                ]
            );
            assert_eq!((a.stats().errors, a.stats().failures), (0, 2));
        });
    }

    // Pins G39.
    #[test]
    fn concurrent_tasks_get_exact_totals_and_flush_is_survived() {
        let Some(server) = Server::start() else {
            return;
        };
        rt().block_on(async {
            let gcra = hourly(300);
            let a = Arc::new(limiter(&server, gcra).await);
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let a = a.clone();
                    tokio::spawn(async move {
                        let mut n = 0;
                        for _ in 0..50 {
                            n += a.request("k").check().await.unwrap().is_allowed() as usize;
                        }
                        n
                    })
                })
                .collect();
            let mut allowed = 0;
            for t in tasks {
                allowed += t.await.unwrap();
            }
            assert_eq!(allowed, 300);

            redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query::<()>(&mut server.raw())
                .unwrap();
            assert!(a.request("other").check().await.unwrap().is_allowed());
            let batch = a.try_check_pipelined(&[("p", 1), ("p", 1)]).await.unwrap();
            assert!(batch.iter().all(Decision::is_allowed));
        });
    }

    #[test]
    fn killed_server_gives_the_fail_mode_quickly() {
        let Some(server) = Server::start() else {
            return;
        };
        rt().block_on(async {
            let a = RedisLimiter::builder(server.url(), "10/s".parse::<Gcra>().unwrap())
                .fail_mode(FailMode::Closed {
                    retry_after: Duration::from_secs(1),
                })
                .build_async()
                .await
                .unwrap();
            assert!(hotlimit::AsyncRateLimiter::check_async(&a, "k")
                .await
                .unwrap()
                .is_allowed());
            drop(server);
            for _ in 0..3 {
                let start = Instant::now();
                let d = hotlimit::AsyncRateLimiter::check_async(&a, "k")
                    .await
                    .unwrap();
                assert!(d.is_denied());
                assert!(
                    start.elapsed() < Duration::from_secs(2),
                    "{:?}",
                    start.elapsed()
                );
            }
            assert_eq!(a.stats().failures, 3);
        });
    }
}
