//! The numbers of `examples/simulate`'s scenarios, computed by its engine (the same code the
//! example prints and plots) and checked against what each algorithm's definition predicts.

#[path = "../examples/simulate/engine.rs"]
mod engine;

use engine::{abuser, mixed, secs, tracking, Record, Totals, SECOND, WINDOW_LIMIT};
use std::sync::OnceLock;

/// Each scenario is simulated once and shared by its tests.
fn tracking_report() -> &'static tracking::Report {
    static R: OnceLock<tracking::Report> = OnceLock::new();
    R.get_or_init(tracking::report)
}

fn abuser_report() -> &'static abuser::Report {
    static R: OnceLock<abuser::Report> = OnceLock::new();
    R.get_or_init(abuser::report)
}

fn mixed_report() -> &'static mixed::Report {
    static R: OnceLock<mixed::Report> = OnceLock::new();
    R.get_or_init(mixed::report)
}

/// λ = ln 2 / h, per second.
fn lambda(half_life_s: f64) -> f64 {
    std::f64::consts::LN_2 / half_life_s
}

// ---------------------------------------------------------------------------------------------
// tracking

#[test]
fn tracking_clients_send_as_specified_and_nothing_is_denied() {
    let r = tracking_report();
    assert_eq!(r.runs.len(), 2);
    for run in &r.runs {
        let totals = run.per_client(r.scenario.clients.len());
        // Periodic clients: exactly rate × 150 s; the Poisson ones vary around it.
        for (i, rate) in tracking::RATES.iter().enumerate() {
            assert_eq!(totals[i].attempted, (rate * 150.0).round() as u64);
        }
        assert!(run.records.iter().all(|rec| rec.allowed), "{}", run.name);
        // One reading per client every 0.25 s over 300 s.
        assert_eq!(run.samples.len(), 6 * 1200);
    }
}

#[test]
fn tracking_short_half_life_converges_faster_long_one_is_more_accurate() {
    let r = tracking_report();
    let (h10, h1) = (&r.stats[0], &r.stats[1]);
    assert_eq!(h10[0].half_life.as_secs(), 10);
    assert_eq!(h1[0].half_life.as_secs(), 1);
    for (long, short) in h10.iter().zip(h1) {
        let name = &r.scenario.clients[long.client as usize].name;
        let (rise_long, rise_short) = (long.rise.unwrap(), short.rise.unwrap());
        assert!(
            rise_short < rise_long,
            "{name}: h = 1 s reaches 90% in {rise_short} s, h = 10 s in {rise_long} s"
        );
        assert!(
            long.steady_error < short.steady_error,
            "{name}: steady error h = 10 s {}, h = 1 s {}",
            long.steady_error,
            short.steady_error
        );
    }
}

#[test]
fn tracking_matches_the_exponential_model() {
    let r = tracking_report();
    // The 10/s periodic client is close to a continuous flow: after a step to rate r the
    // estimate is r·(1 − e^{−λt}), which reaches 90% at t = ln 10 / λ = 3.32 half-lives.
    for (stats, h) in r.stats.iter().zip([10.0, 1.0]) {
        let rise = stats[0].rise.unwrap();
        let model = std::f64::consts::LN_10 / lambda(h);
        assert!(
            (rise - model).abs() <= 0.5_f64.max(0.05 * model),
            "h = {h} s: 90% after {rise} s, model {model} s"
        );
    }
    // In steady state each request lifts the estimate by λ and it decays in between: a
    // sawtooth of height λ about r, whose mean distance from r is λ/4 (for λ ≪ r).
    let h1_10 = &r.stats[1][0];
    let model = lambda(1.0) / 4.0 / 10.0;
    assert!(
        (h1_10.steady_error - model).abs() < 0.1 * model,
        "h = 1 s, 10/s: error {}, model {model}",
        h1_10.steady_error
    );
}

// ---------------------------------------------------------------------------------------------
// abuser

/// The run named `name` and its statistics.
fn abuser_run(name: &str) -> (&'static engine::Run, &'static abuser::Stats) {
    let r = abuser_report();
    let i = abuser::RUNS.iter().position(|n| *n == name).unwrap();
    assert_eq!(r.runs[i].name, name);
    (&r.runs[i], &r.stats[i])
}

const COMPLY: u64 = 150 * SECOND;
const WINDOW_NS: u64 = 60 * SECOND;

#[test]
fn abuser_sends_250_then_150_requests() {
    for st in &abuser_report().stats {
        // Every 600 ms over [0, 150 s), then every 1 s over [150 s, 300 s).
        assert_eq!(st.abuse.attempted, 250);
        assert_eq!(st.comply.attempted, 150);
    }
}

// Pins G9.
#[test]
fn abuser_fixed_window_lets_the_abuser_through_at_every_window() {
    let (run, st) = abuser_run("fixed-window");
    // Every window admits exactly its limit: the abuser sends more than 60 in each.
    assert_eq!(st.per_window, vec![WINDOW_LIMIT; 5]);
    // And the first request of every window, abuse or not, is allowed.
    for w in 0..5 {
        let first = run.records.iter().find(|r| r.t >= w * WINDOW_NS).unwrap();
        assert!(first.allowed, "window {w}");
    }
    // The abuse-phase requests of the window [120 s, 180 s) all fit its limit; the compliant
    // client then gets the rest of it and is denied until the window ends.
    let in_third = |r: &&Record| r.t >= 2 * WINDOW_NS && r.t < COMPLY;
    let abuse_in_third = run.records.iter().filter(in_third).count() as u64;
    assert_eq!(abuse_in_third, 50);
    assert_eq!(st.abuse.allowed, 2 * WINDOW_LIMIT + abuse_in_third);
    let full_at = COMPLY + (WINDOW_LIMIT - abuse_in_third) * SECOND;
    assert_eq!(st.first_allowed, Some(COMPLY));
    assert_eq!(
        st.denied_complying,
        (full_at..3 * WINDOW_NS)
            .step_by(SECOND as usize)
            .collect::<Vec<_>>()
    );
    assert_eq!(st.steady_from, Some(3 * WINDOW_NS));
}

// Pins G6.
#[test]
fn abuser_gcra_never_exceeds_burst_plus_rate_and_admits_the_compliant_client_at_once() {
    let (run, st) = abuser_run("gcra");
    let burst = WINDOW_LIMIT;
    // Conformance: by time t at most B + t/T requests (T = 1 s) have been allowed...
    let mut allowed = 0;
    for r in &run.records {
        allowed += u64::from(r.allowed);
        assert!(
            allowed <= burst + r.t / SECOND,
            "{allowed} allowed by {} s",
            secs(r.t)
        );
    }
    // ...and an abuser always asking for more gets exactly that: 60 + ⌊149.4⌋ by 149.4 s.
    assert_eq!(st.abuse.allowed, burst + 149);
    // It is then let through at once and every time.
    assert_eq!(st.first_allowed, Some(COMPLY));
    assert_eq!(st.comply.allowed, st.comply.attempted);
    assert!(st.denied_complying.is_empty());
}

#[test]
fn abuser_sliding_window_counter_admits_soon_but_its_estimate_denies_once_a_window() {
    let (run, st) = abuser_run("sliding-window");
    assert_eq!(st.first_allowed, Some(COMPLY));
    // It keeps the abuser to about the limit: never more than 60 in a fixed window.
    assert!(st.per_window.iter().all(|&n| n <= WINDOW_LIMIT));
    // A client at exactly the limit is still denied once in each later window, one second
    // in: the previous window's count, weighted as if spread evenly, comes out a fraction
    // over the limit, where the exact count of the last 60 s (a sliding log) is within it.
    assert_eq!(st.denied_complying, vec![181 * SECOND, 241 * SECOND]);
    for &t in &st.denied_complying {
        let allowed_in = |from: u64, to: u64| {
            run.records
                .iter()
                .filter(|r| r.allowed && r.t >= from && r.t < to)
                .count() as f64
        };
        let start = t / WINDOW_NS * WINDOW_NS;
        let elapsed = (t - start) as f64 / WINDOW_NS as f64;
        let weighted =
            allowed_in(start - WINDOW_NS, start) * (1.0 - elapsed) + allowed_in(start, t) + 1.0;
        assert!(weighted > WINDOW_LIMIT as f64, "weighted {weighted} at {t}");
        let exact = allowed_in(t + 1 - WINDOW_NS, t) + 1.0;
        assert!(exact <= WINDOW_LIMIT as f64, "exact {exact} at {t}");
    }
    assert_eq!(st.steady_from, Some(242 * SECOND));
}

#[test]
fn abuser_strict_earrrl_admits_the_compliant_client_only_after_its_rate_decays() {
    let (run, st) = abuser_run("earrrl-strict");
    let l = lambda(engine::ENFORCING_HALF_LIFE.as_secs_f64());
    // Abuse: only the start-up burst gets through (the estimate reaches 1/s within ~14 s);
    // from then on every request, denied ones included, keeps it above the limit.
    assert!(st.last_abuse_allowed.unwrap() < 15 * SECOND);
    assert_eq!(st.per_window[1..3], [0, 0]);
    // Compliant at exactly 1/s, the estimate just before each request falls as
    // s + (r₀ − s)·e^{−λk} towards s = λ/(e^λ − 1) ≈ 0.966/s, where r₀ is the estimate at
    // 150 s. Predicted first admission: the first k with that ≤ 1.
    let at = |t: u64| run.records.iter().find(|r| r.t == t).unwrap();
    let r0 = at(COMPLY).rate.unwrap();
    assert!(r0 > 1.5, "the estimate at 150 s is {r0}");
    let s = l / l.exp_m1();
    let k = (0..)
        .find(|&k| s + (r0 - s) * (-l * k as f64).exp() <= 1.0)
        .unwrap();
    let predicted = COMPLY + k * SECOND;
    assert_eq!(st.first_allowed, Some(predicted));
    assert!(predicted > COMPLY + 30 * SECOND);
    // Nothing before it, everything after it.
    assert_eq!(
        st.denied_complying,
        (COMPLY..predicted)
            .step_by(SECOND as usize)
            .collect::<Vec<_>>()
    );
    assert_eq!(st.steady_from, st.first_allowed);
    assert!(at(predicted).rate.unwrap() <= 1.0);
    assert!(at(predicted - SECOND).rate.unwrap() > 1.0);
}

// ---------------------------------------------------------------------------------------------
// mixed

/// The statistics of every run, with the run's name.
fn mixed_stats() -> impl Iterator<Item = (&'static str, &'static mixed::Stats)> {
    let r = mixed_report();
    r.runs.iter().map(|r| r.name.as_str()).zip(&r.stats)
}

#[test]
fn mixed_polite_poisson_clients_are_left_alone_by_every_algorithm() {
    for (name, st) in mixed_stats() {
        let t = st.groups[0];
        assert!(t.attempted > 5_000);
        assert!(
            t.denied_share() <= 0.001,
            "{name}: {} of {} denied",
            t.denied(),
            t.attempted
        );
    }
}

#[test]
fn mixed_abusers_are_mostly_denied_and_strict_earrrl_shuts_them_out() {
    for (name, st) in mixed_stats() {
        let t = st.abusers();
        // The limit is a fifth of what they send: no algorithm lets much more through.
        assert!(t.allowed_share() <= 0.25, "{name}: {}", t.allowed_share());
        if name == "earrrl-strict" {
            // Only the start-up burst: every request counts and keeps the rate over 1/s.
            assert!(t.allowed_share() <= 0.02, "{name}: {}", t.allowed_share());
        }
    }
}

// Pins G9.
#[test]
fn mixed_window_algorithms_admit_each_steady_abuser_exactly_the_limit() {
    let r = mixed_report();
    for (run, st) in r.runs.iter().zip(&r.stats) {
        if matches!(run.name.as_str(), "fixed-window" | "sliding-log") {
            // 60 per window, 5 windows, 3 Poisson abusers sending ~300 per window.
            assert_eq!(st.groups[2].allowed, 3 * 5 * WINDOW_LIMIT, "{}", run.name);
        }
    }
}

// Pins G7.
#[test]
fn mixed_page_loads_are_denied_only_by_earrrl_beyond_its_burst() {
    let r = mixed_report();
    for (run, st) in r.runs.iter().zip(&r.stats) {
        let t: Totals = st.groups[1];
        let bursts = t.attempted / 20;
        assert_eq!(t.attempted, bursts * 20);
        if run.name == "earrrl-strict" {
            // The k-th request of a burst sees the rate (k − 1)·λ (plus a residual of the last
            // burst, 6 half-lives old: 2%), so 1 + ⌊R/λ⌋ = 15 of each 20 get through.
            let per_burst =
                1 + (1.0 / lambda(engine::ENFORCING_HALF_LIFE.as_secs_f64())).floor() as u64;
            assert_eq!(per_burst, 15);
            assert_eq!(t.allowed, bursts * per_burst);
        } else {
            // 20 at once is well within a burst of 60.
            assert_eq!(t.denied(), 0, "{}", run.name);
        }
    }
}
