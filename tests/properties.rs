//! Property tests of the pure algorithm state machines (DESIGN §1–3) and of the parsers (DESIGN §6).
//!
//! Time is passed as `u64` nanoseconds straight to `WordStep::step` / `EarrrlPair::step`: nothing
//! sleeps, every check is exact (or to a stated float tolerance).

#[path = "common/earrrl_pair.rs"]
mod earrrl_pair;
#[path = "common/step.rs"]
mod step;

use earrrl_pair::EarrrlPair;
use hotlimit::algo::{Algorithm, Earrrl, Exponential, Gcra};
use hotlimit::{ConfigError, Decision, Policy, Rate};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::f64::consts::LN_2;
use std::time::Duration;
use step::WordStep;

const NS_PER_SEC: f64 = 1e9;

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![Just(Policy::Leaky), Just(Policy::Strict)]
}

/// An unscaled gap between two requests: a kind and a fraction in [0, 1). See [`scale`].
type Gap = (u8, f64);

fn gap() -> impl Strategy<Value = Gap> {
    (any::<u8>(), 0.0..1.0f64)
}

/// Scales a gap: 1 in 16 at the same instant, 1 in 128 up to `span_ns` (an idle period), the
/// rest up to `2 × unit_ns` (so with `unit_ns` near the mean gap at the limit, traces hover
/// around it).
fn scale((kind, frac): Gap, unit_ns: f64, span_ns: f64) -> u64 {
    match kind {
        0..=15 => 0,
        16..=17 => (frac * span_ns) as u64,
        _ => (frac * 2.0 * unit_ns) as u64,
    }
}

/// Absolute `(now, cost)` requests from gaps and costs, starting at time 0.
fn absolute(trace: &[(Gap, u64)], unit_ns: f64, span_ns: f64) -> Vec<(u64, u64)> {
    let mut now = 0u64;
    trace
        .iter()
        .map(|&(g, cost)| {
            now += scale(g, unit_ns, span_ns);
            (now, cost)
        })
        .collect()
}

/// Maps a raw cost in 1..=∞ onto 1..=cap.
fn cost_within(raw: u64, cap: u64) -> u64 {
    (raw - 1) % cap + 1
}

/// A GCRA rate: `count` per `period_ns`, count 1..1000, period 1 ms..10 s.
fn gcra_rate() -> impl Strategy<Value = Rate> {
    (1u32..1000, 1_000_000u64..10_000_000_000)
        .prop_map(|(n, p)| Rate::new(n as f64, Duration::from_nanos(p)).unwrap())
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// EARRRL with half-life `half_life_ns` and a maximum rate `R` such that `R/λ` (the number of
/// simultaneous requests that reach the limit) is `n_max`, so short traces do reach it.
fn earrrl(half_life_ns: u64, n_max: f64, policy: Policy) -> Earrrl {
    let h = half_life_ns as f64 / NS_PER_SEC;
    let limit = Rate::new(n_max * LN_2 / h, Duration::from_secs(1)).unwrap();
    Earrrl::new(Duration::from_nanos(half_life_ns), limit)
        .unwrap()
        .with_policy(policy)
}

/// `cases` cases per property; no regression files (failures print their minimal input).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// DESIGN §3.2: the one-word form (virtual time `S`) and the textbook two-field form `(N, T)`
    /// are the same algorithm, so over long traces they must agree on every decision, and on the
    /// measured rate and retry_after up to float rounding.
    // Pins G7.
    #[test]
    fn earrrl_one_word_matches_two_field_form(
        half_life_ns in 10_000_000u64..3_600_000_000_000,
        n_max in 1.0..300.0f64,
        policy in policy(),
        trace in prop::collection::vec((gap(), 1u64..=5), 200..2000),
    ) {
        let e = earrrl(half_life_ns, n_max, policy);
        // Mean cost 3 at 10% above the limit R: one request every 2.7/R seconds.
        let unit = 2.7 / e.max_rate() * NS_PER_SEC;
        let reqs = absolute(&trace, unit, 3.0 * half_life_ns as f64);
        let mut word = e.fresh();
        let mut pair: EarrrlPair = EarrrlPair::FRESH;
        for (k, &(now, cost)) in reqs.iter().enumerate() {
            let step = e.step(word, now, cost);
            word = step.state.unwrap_or(word);
            let half_life = Duration::from_nanos(half_life_ns);
            let (a, b) = (step.decision, pair.step(&e, half_life, now, cost));
            let ctx = format!("request {k} at {now} ns, cost {cost}: word {a:?}, pair {b:?}");
            prop_assert_eq!(a.is_allowed(), b.allowed, "{}", ctx);
            let (ra, rb) = (a.rate().unwrap(), b.rate);
            if ra == 0.0 || rb == 0.0 {
                prop_assert!(ra == 0.0 && rb == 0.0, "{}", ctx);
            } else {
                prop_assert!(((ra - rb) / rb).abs() <= 1e-9, "{}", ctx);
            }
            let (wa, wb) = (a.retry_after().as_nanos() as u64, b.retry_after_ns);
            let tolerance = (4.0f64).max(1e-9 * wa.max(wb) as f64);
            prop_assert!(wa.abs_diff(wb) as f64 <= tolerance, "{}", ctx);
        }
    }
}

/// The two-field (tokens, last refill) token bucket of DESIGN §3.1, credit kept in nanoseconds
/// (`tokens × T`) so that it is exact.
struct Bucket {
    t: u64,
    full: u64,
    credit: u64,
    last: u64,
}

impl Bucket {
    fn new(capacity: u64, t: u64) -> Self {
        Self {
            t,
            full: capacity * t,
            credit: capacity * t,
            last: 0,
        }
    }

    fn refill(&mut self, now: u64) {
        self.credit = (self.credit + (now - self.last)).min(self.full);
        self.last = now;
    }

    /// Takes `cost` tokens at `now`: `Ok(())`, or `Err(ns until the bucket holds them)`.
    fn take(&mut self, now: u64, cost: u64) -> Result<(), u64> {
        self.refill(now);
        let need = cost * self.t;
        if self.credit >= need {
            self.credit -= need;
            Ok(())
        } else {
            Err(need - self.credit)
        }
    }

    fn tokens(&self) -> u64 {
        self.credit / self.t
    }
}

/// A signed time step: a number of periods, or raw nanoseconds.
#[derive(Debug, Clone, Copy)]
enum Delta {
    Periods(f64),
    Nanos(i128),
}

/// None, a few periods, anything up to u64::MAX forwards, or anything backwards.
fn delta() -> impl Strategy<Value = Delta> {
    prop_oneof![
        3 => Just(Delta::Nanos(0)),
        6 => (0.0..4.0f64).prop_map(Delta::Periods),
        2 => any::<u64>().prop_map(|d| Delta::Nanos(d.into())),
        1 => any::<u64>().prop_map(|d| Delta::Nanos(-i128::from(d))),
    ]
}

proptest! {
    #![proptest_config(config(1024))]

    /// DESIGN §3.1: the GCRA state seen as a token bucket is exactly a (tokens, last refill)
    /// bucket of `capacity` refilled at `rate`: same decisions, `remaining`, `reset_after`,
    /// `retry_after` and token count.
    // Pins G6.
    #[test]
    fn gcra_token_bucket_matches_two_field_model(
        capacity in 1u64..=50,
        rate in gcra_rate(),
        trace in prop::collection::vec((gap(), 1u64..=50), 1..300),
    ) {
        let tb = Gcra::new(rate).unwrap().with_burst(capacity).unwrap();
        prop_assert_eq!(tb.policy(), Policy::Leaky);
        let t = nanos(tb.emission_interval());
        let trace: Vec<_> = trace.iter().map(|&(g, c)| (g, cost_within(c, capacity))).collect();
        let reqs = absolute(&trace, t as f64, 2.0 * (capacity * t) as f64);
        let mut model = Bucket::new(capacity, t);
        let mut tat = tb.fresh();
        for (k, &(now, cost)) in reqs.iter().enumerate() {
            let step = tb.step(tat, now, cost);
            tat = step.state.unwrap_or(tat);
            let d = step.decision;
            let want = model.take(now, cost);
            let ctx = format!("request {k} at {now} ns, cost {cost}: {d:?}, model {want:?}");
            prop_assert_eq!(d.is_allowed(), want.is_ok(), "{}", ctx);
            prop_assert_eq!(d.retry_after().as_nanos() as u64, want.err().unwrap_or(0), "{}", ctx);
            prop_assert_eq!(d.remaining(), Some(model.tokens()), "{}", ctx);
            let reset = Duration::from_nanos(model.full - model.credit);
            prop_assert_eq!(d.reset_after(), Some(reset), "{}", ctx);
        }
    }

    /// DESIGN §3.1: GCRA never admits more than `B + ⌊t/T⌋` cost from a fresh key over [0, t],
    /// under either policy (a strict denial only pushes `tat` further).
    // Pins G6.
    #[test]
    fn gcra_never_exceeds_burst_plus_elapsed(
        burst in 1u64..=50,
        rate in gcra_rate(),
        policy in policy(),
        trace in prop::collection::vec((gap(), 1u64..=50), 1..500),
    ) {
        let g = Gcra::new(rate).unwrap().with_burst(burst).unwrap().with_policy(policy);
        let t = nanos(g.emission_interval());
        let trace: Vec<_> = trace.iter().map(|&(g, c)| (g, cost_within(c, burst))).collect();
        // Gaps under T/2 (a load well above the rate) with some idle periods.
        let reqs = absolute(&trace, t as f64 / 4.0, 2.0 * (burst * t) as f64);
        let (mut tat, mut admitted) = (g.fresh(), 0u64);
        for &(now, cost) in &reqs {
            let step = g.step(tat, now, cost);
            tat = step.state.unwrap_or(tat);
            if step.decision.is_allowed() {
                admitted += cost;
            }
            prop_assert!(
                admitted <= burst + now / t,
                "admitted {} by {} ns, bound {}", admitted, now, burst + now / t
            );
        }
    }

    /// DESIGN §1 and 3.3: whatever the time deltas (none, huge, saturating at u64::MAX, or
    /// backwards), the exponential rate is finite and non-negative and a denial says to wait.
    // Pins G4, G8.
    #[test]
    fn exponential_rate_is_always_finite(
        limit in 1.0..1e6f64,
        period_ns in 1u64..=86_400_000_000_000,
        policy in policy(),
        start in prop_oneof![Just(0u64), any::<u64>()],
        trace in prop::collection::vec((delta(), 1u64..=1_000_000), 1..200),
    ) {
        let e = Exponential::new(limit, Duration::from_nanos(period_ns))
            .unwrap()
            .with_policy(policy);
        let mut state = e.fresh();
        let mut now = start;
        for (k, &(delta, cost)) in trace.iter().enumerate() {
            let delta = match delta {
                Delta::Periods(p) => (p * period_ns as f64) as i128,
                Delta::Nanos(ns) => ns,
            };
            now = (i128::from(now) + delta).clamp(0, u64::MAX.into()) as u64;
            let cost = cost_within(cost, e.capacity());
            let step = e.step(state, now, cost);
            state = step.state.unwrap_or(state);
            let d = step.decision;
            let ctx = format!("request {k} at {now} ns, cost {cost}: {d:?}");
            let rate = d.rate();
            prop_assert!(matches!(rate, Some(r) if r.is_finite() && r >= 0.0), "{}", ctx);
            prop_assert!(d.is_allowed() || d.retry_after().as_nanos() as u64 > 0, "{}", ctx);
        }
    }
}

/// A trace ending in a flood at its last instant: `reqs` from a fresh key, then one request of
/// cost `flood`, then requests of cost `cost` until one is denied.
#[derive(Debug, Clone)]
struct RetryCase<A> {
    algo: A,
    reqs: Vec<(u64, u64)>,
    flood: u64,
    cost: u64,
}

/// Runs a [`RetryCase`] and checks every denial's retry_after: honest (the same request on the
/// resulting state is allowed after that wait) and, if `tight`, the earliest such wait (1 ns
/// earlier it is denied).
fn check_retry_after<A>(case: &RetryCase<A>, tight: bool) -> Result<(), TestCaseError>
where
    A: Algorithm,
    A::State: Copy + PartialEq,
{
    let RetryCase {
        algo,
        reqs,
        flood,
        cost,
    } = case;
    let last = reqs.last().map_or(0, |r| r.0);
    let flood_reqs = [(last, *flood)].into_iter().chain([(last, *cost); 8]);
    let mut state = algo.fresh();
    for (k, (now, cost)) in reqs.iter().copied().chain(flood_reqs).enumerate() {
        let step = algo.step(state, now, cost);
        state = step.state.unwrap_or(state);
        let d: Decision = step.decision;
        if d.is_allowed() {
            prop_assert!(k < reqs.len() + 8, "the flood was never denied");
            continue;
        }
        let w = d.retry_after().as_nanos() as u64;
        let ctx = format!("request {k} at {now} ns, cost {cost}, state after {state:?}: {d:?}");
        prop_assert!(w > 0, "{}", ctx);
        let retry = algo.step(state, now + w, cost).decision;
        prop_assert!(
            retry.is_allowed(),
            "retry at +{} ns: {:?}; {}",
            w,
            retry,
            ctx
        );
        if tight {
            let early = algo.step(state, now + w - 1, cost).decision;
            prop_assert!(
                early.is_denied(),
                "retry_after is late: at +{} ns already {:?}; {}",
                w - 1,
                early,
                ctx
            );
        }
        if k >= reqs.len() {
            break;
        }
    }
    Ok(())
}

/// GCRA, both policies, around its rate and burst.
fn gcra_case() -> impl Strategy<Value = RetryCase<Gcra>> {
    let trace = prop::collection::vec((gap(), 1u64..=50), 0..300);
    (1u64..=50, gcra_rate(), policy(), 1u64..=50, trace).prop_map(
        |(burst, rate, policy, cost, trace)| {
            let algo = Gcra::new(rate)
                .unwrap()
                .with_burst(burst)
                .unwrap()
                .with_policy(policy);
            let t = nanos(algo.emission_interval());
            let trace: Vec<_> = trace
                .iter()
                .map(|&(g, c)| (g, cost_within(c, burst)))
                .collect();
            let reqs = absolute(&trace, t as f64, 2.0 * (burst * t) as f64);
            RetryCase {
                algo,
                reqs,
                flood: burst,
                cost: cost_within(cost, burst),
            }
        },
    )
}

/// EARRRL, both policies, around its maximum rate.
fn earrrl_case() -> impl Strategy<Value = RetryCase<Earrrl>> {
    let trace = prop::collection::vec((gap(), 1u64..=5), 0..300);
    (
        10_000_000u64..3_600_000_000_000,
        1.0..300.0f64,
        policy(),
        1u64..=5,
        trace,
    )
        .prop_map(|(half_life_ns, n_max, policy, cost, trace)| {
            let algo = earrrl(half_life_ns, n_max, policy);
            let unit = 2.7 / algo.max_rate() * NS_PER_SEC;
            let reqs = absolute(&trace, unit, 3.0 * half_life_ns as f64);
            // A flood of 2·R/λ + 1 at one instant shows a rate above 2R.
            let flood = (2.0 * n_max).ceil() as u64 + 1;
            RetryCase {
                algo,
                reqs,
                flood,
                cost,
            }
        })
}

/// Exponential, both policies, around its limit.
fn exponential_case() -> impl Strategy<Value = RetryCase<Exponential>> {
    let trace = prop::collection::vec((gap(), 1u64..=10_000), 0..300);
    let period = 1_000_000u64..3_600_000_000_000;
    (1.0..1e4f64, period, policy(), 1u64..=10_000, trace).prop_map(
        |(limit, period_ns, policy, cost, trace)| {
            let algo = Exponential::new(limit, Duration::from_nanos(period_ns))
                .unwrap()
                .with_policy(policy);
            let cap = algo.capacity();
            let trace: Vec<_> = trace
                .iter()
                .map(|&(g, c)| (g, cost_within(c, cap)))
                .collect();
            // Mean cost cap/2 at exactly the limit: one request every cap/(2L) periods.
            let unit = period_ns as f64 * cap as f64 / (2.0 * limit);
            let reqs = absolute(&trace, unit, 3.0 * period_ns as f64);
            RetryCase {
                algo,
                reqs,
                flood: cap,
                cost: cost_within(cost, cap),
            }
        },
    )
}

proptest! {
    #![proptest_config(config(512))]

    /// DESIGN §2 and 3.1: a GCRA retry_after is exact (honest and tight), under both policies.
    // Pins G14.
    #[test]
    fn gcra_retry_after_is_honest_and_tight(case in gcra_case()) {
        check_retry_after(&case, true)?;
    }

    /// DESIGN §2 and 3.2: an EARRRL retry after the given wait is allowed, under both policies
    /// (strict: from the state that counted the denied request).
    // Pins G14.
    #[test]
    fn earrrl_retry_after_is_honest(case in earrrl_case()) {
        check_retry_after(&case, false)?;
    }

    /// DESIGN §3.2: the EARRRL retry_after is the earliest such wait, to the nanosecond.
    // Pins G14.
    #[test]
    fn earrrl_retry_after_is_tight(case in earrrl_case()) {
        check_retry_after(&case, true)?;
    }

    /// DESIGN §2 and 3.3: an exponential retry after the given wait is allowed, under both
    /// policies (the wait accounts for the retried request's own contribution).
    // Pins G14.
    #[test]
    fn exponential_retry_after_is_honest(case in exponential_case()) {
        check_retry_after(&case, false)?;
    }

    /// DESIGN §3.3 ("the earliest wait"): the exponential retry_after is tight to the nanosecond.
    // Pins G14.
    #[test]
    fn exponential_retry_after_is_tight(case in exponential_case()) {
        check_retry_after(&case, true)?;
    }
}

/// Pieces of the human grammar, and odd pieces for near misses.
const NUMBERS: &[&str] = &["1", "5", "10", "42", "600", "0.5", "1.5", ".5", "5.", "+2"];
const UNITS: &[&str] = &[
    "s", "ms", "min", "m", "h", "d", "ns", "µs", "us", "sec", "hours",
];
const ODD: &[&str] = &[
    "0",
    "-1",
    "1e3",
    "1.2.3",
    "99999999999999999999999",
    "nan",
    "inf",
    "parsec",
    ".",
    "/",
    "-",
    "+",
    " ",
    "burst",
    "x",
    "\t",
];

fn pick(parts: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::sample::select(parts).prop_map(String::from)
}

fn piece() -> impl Strategy<Value = String> {
    prop_oneof![pick(NUMBERS), pick(UNITS), pick(ODD)]
}

/// Mostly `valid`, sometimes an odd piece or nothing.
fn slot(valid: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    prop_oneof![
        16 => valid,
        1 => pick(ODD),
        1 => Just(String::new()),
    ]
}

/// Human-ish strings: a soup of pieces, or the shape of a quota (`10 / 5s burst 20`) or of a
/// duration (`1.5 h`) with some pieces swapped or dropped.
fn near_misses() -> impl Strategy<Value = String> {
    let space = || prop_oneof![Just(String::new()), Just(" ".to_owned())];
    let soup = prop::collection::vec(piece(), 0..10).prop_map(|v| v.concat());
    let burst = prop_oneof![
        Just(String::new()),
        pick(NUMBERS).prop_map(|n| format!(" burst {n}")),
    ];
    let quota = (
        slot(pick(NUMBERS)),
        slot(space()),
        slot(Just("/".to_owned())),
        slot(space()),
        slot(prop_oneof![Just(String::new()), pick(NUMBERS)]),
        slot(pick(UNITS)),
        slot(burst),
    )
        .prop_map(|(a, b, c, d, e, f, g)| [a, b, c, d, e, f, g].concat());
    let duration = (slot(pick(NUMBERS)), slot(space()), slot(pick(UNITS)))
        .prop_map(|(a, b, c)| [a, b, c].concat());
    prop_oneof![soup, quota, duration]
}

/// An error must name its field and explain itself.
fn check_error(e: &ConfigError) -> Result<(), TestCaseError> {
    prop_assert!(!e.field().to_string().is_empty(), "{:?}", e);
    prop_assert!(!e.to_string().is_empty(), "{:?}", e);
    Ok(())
}

/// DESIGN §6: the parsers never panic, accept only positive finite values, and explain refusals.
fn check_parsers(s: &str) -> Result<(), TestCaseError> {
    match s.parse::<Rate>() {
        Ok(r) => {
            prop_assert!(
                r.count().is_finite() && r.count() > 0.0,
                "{:?} -> {:?}",
                s,
                r
            );
            prop_assert!(
                r.period() >= std::time::Duration::from_nanos(1),
                "{:?} -> {:?}",
                s,
                r
            );
        }
        Err(e) => check_error(&e)?,
    }
    // The duration parser alone, through a rate's period.
    match format!("1/{s}").parse::<Rate>() {
        Ok(r) => prop_assert!(!r.period().is_zero(), "{:?} -> {:?}", s, r),
        Err(e) => check_error(&e)?,
    }
    match s.parse::<Gcra>() {
        Ok(g) => {
            prop_assert!(!g.emission_interval().is_zero(), "{:?} -> {:?}", s, g);
            prop_assert!(g.capacity() >= 1, "{:?} -> {:?}", s, g);
        }
        Err(e) => check_error(&e)?,
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(4096))]

    /// DESIGN §6 on arbitrary strings.
    // Pins G18.
    #[test]
    fn parsers_never_panic_on_any_string(s in ".*") {
        check_parsers(&s)?;
    }

    /// DESIGN §6 on strings close to the grammar, which reach far deeper into it.
    // Pins G18.
    #[test]
    fn parsers_never_panic_on_near_misses(s in near_misses()) {
        check_parsers(&s)?;
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// DESIGN §3.2–3.3, issue "fuzzing and property tests": after any trace, the measured rate
    /// of EARRRL and of the exponential limiter is finite, non-negative, and never rises while
    /// the key stays idle. Probes are evaluated on copies of the state, so the key stays idle.
    // Pins G7, G8.
    #[test]
    fn averaging_rates_decay_monotonically_when_idle(
        half_life_ns in 1_000_000u64..100_000_000_000,
        n_max in 0.5f64..50.0,
        limit in 1.0f64..1000.0,
        period_ns in 1_000_000u64..100_000_000_000,
        policy in policy(),
        trace in prop::collection::vec((gap(), 1u64..4), 1..300),
        probes in prop::collection::vec(0u64..1_000_000_000_000, 1..40),
    ) {
        let e = earrrl(half_life_ns, n_max, policy);
        let x = Exponential::new(limit, Duration::from_nanos(period_ns))
            .unwrap()
            .with_policy(policy);
        let reqs = absolute(&trace, half_life_ns as f64 / 4.0, half_life_ns as f64 * 20.0);
        let (mut se, mut sx) = (e.fresh(), x.fresh());
        for &(now, cost) in &reqs {
            let _ = e.update(&mut se, now, cost);
            let _ = x.update(&mut sx, now, cost.min(x.capacity()));
        }
        let last = reqs.last().map_or(0, |r| r.0);
        let mut times: Vec<u64> = probes.iter().map(|p| last + p).collect();
        times.sort_unstable();
        let (mut prev_e, mut prev_x) = (f64::INFINITY, f64::INFINITY);
        for t in times {
            let re = e.peek(&se, t, 1).rate().unwrap();
            let rx = x.step(sx, t, 1).decision.rate().unwrap();
            for (name, r, prev) in [("earrrl", re, prev_e), ("exponential", rx, prev_x)] {
                prop_assert!(r.is_finite() && r >= 0.0, "{name}: rate {r} at {t}");
                prop_assert!(r <= prev, "{name}: rate rose from {prev} to {r} at {t}");
            }
            (prev_e, prev_x) = (re, rx);
        }
    }
}
