//! Structured fuzz inputs shared by the targets in `fuzz_targets/`.
//!
//! Every number comes in two shapes: a "tame" one that lands near realistic configurations
//! and near each algorithm's limit (so traces reach denials, retries and the interesting
//! float arithmetic), and a raw one (any `u64` / `f64` bit pattern: 0, NaN, infinities,
//! subnormals, `u64::MAX`) for the edges. libFuzzer's mutations pick between them.

use arbitrary::Arbitrary;
use hotlimit::algo::{Algorithm, Earrrl, Exponential, Gcra, CLOCK_MAX};
use hotlimit::{Decision, Policy, QuotaError, Rate};
use std::time::Duration;

/// A float: a ratio `n / (d + 1)` or raw bits.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Num {
    /// `n / (d + 1)`: 0, whole numbers, fractions like 0.5.
    Ratio(u32, u16),
    /// Any `f64`, NaN and infinities included.
    Raw(f64),
}

impl Num {
    /// The value.
    pub fn value(self) -> f64 {
        match self {
            Num::Ratio(n, d) => n as f64 / (d as f64 + 1.0),
            Num::Raw(x) => x,
        }
    }
}

/// A duration: nanoseconds, milliseconds or seconds (the last reaching past `u64::MAX` ns).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Span {
    /// Any number of nanoseconds.
    Nanos(u64),
    /// Milliseconds.
    Millis(u32),
    /// Seconds, up to `u64::MAX` of them (far beyond what u64 nanoseconds hold).
    Secs(u64),
    /// Days: a century is 36,500, and u32 days reach far past u64 nanoseconds (213,503 days),
    /// so the slowest rates a limiter accepts, and the first it refuses, are both near.
    Days(u32),
}

impl Span {
    /// The duration.
    pub fn duration(self) -> Duration {
        match self {
            Span::Nanos(n) => Duration::from_nanos(n),
            Span::Millis(ms) => Duration::from_millis(ms.into()),
            Span::Secs(s) => Duration::from_secs(s),
            Span::Days(d) => Duration::from_secs(u64::from(d) * 86_400),
        }
    }
}

/// A whole number (a cost or a burst): small, or any `u64`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Count {
    /// 0..=255.
    Small(u8),
    /// Any `u64`.
    Raw(u64),
}

impl Count {
    /// The value.
    pub fn value(self) -> u64 {
        match self {
            Count::Small(n) => n.into(),
            Count::Raw(n) => n,
        }
    }
}

/// A forward time step between two requests.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Delta {
    /// The same instant.
    Zero,
    /// `k / 16` of the algorithm's unit (its interval between requests at the limit), so
    /// that traces hover around the limit.
    Units(u8),
    /// Up to about 4.3 s.
    Nanos(u32),
    /// Anything, up to `u64::MAX` (saturating the clock).
    Raw(u64),
}

impl Delta {
    /// The step in nanoseconds, given the algorithm's unit in nanoseconds.
    pub fn nanos(self, unit_ns: f64) -> u64 {
        match self {
            Delta::Zero => 0,
            // `as` saturates (and maps NaN to 0).
            Delta::Units(k) => (k as f64 / 16.0 * unit_ns) as u64,
            Delta::Nanos(n) => n.into(),
            Delta::Raw(n) => n,
        }
    }
}

/// Where a trace's clock starts: at the origin, anywhere, or just before the end of the
/// clock's range ([`CLOCK_MAX`]), where saturating arithmetic used to admit everything.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Start {
    /// 0.
    Origin,
    /// Any time.
    Raw(u64),
    /// `k / 16` of the algorithm's unit before `CLOCK_MAX`.
    BeforeEnd(u16),
    /// `n` nanoseconds before `CLOCK_MAX`.
    NanosBeforeEnd(u32),
}

impl Start {
    /// The starting time, ns.
    pub fn nanos(self, unit_ns: f64) -> u64 {
        match self {
            Start::Origin => 0,
            Start::Raw(n) => n,
            // `as` saturates (and maps NaN to 0).
            Start::BeforeEnd(k) => CLOCK_MAX.saturating_sub((f64::from(k) / 16.0 * unit_ns) as u64),
            Start::NanosBeforeEnd(n) => CLOCK_MAX - u64::from(n),
        }
    }
}

/// The policy from a flag.
pub fn policy(strict: bool) -> Policy {
    if strict {
        Policy::Strict
    } else {
        Policy::Leaky
    }
}

/// A GCRA configuration: rate `count / period`, optional burst, policy.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct GcraCfg {
    /// The rate's count.
    pub count: Num,
    /// The rate's period.
    pub period: Span,
    /// The burst (default: the count).
    pub burst: Option<Count>,
    /// Strict instead of leaky.
    pub strict: bool,
}

impl GcraCfg {
    /// The algorithm, or `None` where the constructors refuse the configuration.
    pub fn build(&self) -> Option<Gcra> {
        let rate = Rate::new(self.count.value(), self.period.duration()).ok()?;
        let mut gcra = Gcra::new(rate).ok()?;
        if let Some(burst) = self.burst {
            gcra = gcra.with_burst(burst.value()).ok()?;
        }
        Some(gcra.with_policy(policy(self.strict)))
    }
}

/// GCRA's unit: the emission interval, ns.
pub fn gcra_unit(g: &Gcra) -> f64 {
    g.emission_interval().as_nanos() as f64
}

/// An EARRRL configuration: half-life, maximum rate `count / period`, policy.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct EarrrlCfg {
    /// The half-life.
    pub half_life: Span,
    /// The maximum rate's count.
    pub count: Num,
    /// The maximum rate's period.
    pub period: Span,
    /// Strict (the default) or leaky.
    pub strict: bool,
}

impl EarrrlCfg {
    /// The algorithm, or `None` where the constructors refuse the configuration.
    pub fn build(&self) -> Option<Earrrl> {
        let rate = Rate::new(self.count.value(), self.period.duration()).ok()?;
        let e = Earrrl::new(self.half_life.duration(), rate).ok()?;
        Some(e.with_policy(policy(self.strict)))
    }
}

/// EARRRL's unit: the interval between requests at the maximum rate, ns.
pub fn earrrl_unit(e: &Earrrl) -> f64 {
    1e9 / e.max_rate()
}

/// An exponential configuration: limit per period, policy.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct ExpCfg {
    /// The limit L.
    pub limit: Num,
    /// The period P.
    pub period: Span,
    /// Strict instead of leaky (the default).
    pub strict: bool,
}

impl ExpCfg {
    /// The algorithm, or `None` where the constructor refuses the configuration.
    pub fn build(&self) -> Option<Exponential> {
        let e = Exponential::new(self.limit.value(), self.period.duration()).ok()?;
        Some(e.with_policy(policy(self.strict)))
    }
}

/// The exponential algorithm's unit: the interval between requests at the limit, ns.
pub fn exponential_unit(e: &Exponential) -> f64 {
    e.period().as_nanos() as f64 / e.limit()
}

/// One request of a trace: the time step before it and its cost.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct Req {
    /// The time step from the previous request (the first: from 0).
    pub delta: Delta,
    /// The cost (0 and costs above the capacity are stepped too, and their result dropped).
    pub cost: Count,
}

/// A trace and the clock it runs on: `unit_ns`, the algorithm's unit (what a [`Delta`] and a
/// [`Start`] count sixteenths of), and where the clock starts.
#[derive(Debug, Clone, Copy)]
pub struct Timeline<'a> {
    /// The algorithm's unit, ns.
    pub unit_ns: f64,
    /// Where the clock starts.
    pub start: Start,
    /// The requests, each after its delta.
    pub trace: &'a [Req],
}

/// Whether the decisions of an algorithm carry a measured rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateKind {
    /// Always (the averaging algorithms, EARRRL and exponential).
    Always,
    /// Sometimes or never: only checked where present.
    Any,
}

/// Steps `algo` through `trace` from a fresh state with `Algorithm::update`, the clock
/// starting at `start` and moving forward by each request's delta (saturating at `u64::MAX`, or
/// `u64::MAX − 1` with `HOTLIMIT_FUZZ_CLOCK_BELOW_MAX`), and
/// checks the contract every algorithm shares (DESIGN §1, 2, 5):
///
/// * no panic, also for costs of 0 or above the capacity (stepped, result dropped; not
///   stepped with `HOTLIMIT_FUZZ_SKIP_OUT_OF_CONTRACT`);
/// * the new state is never the eviction tombstone (`is_tombstone`);
/// * a rate, where present, is finite and >= 0;
/// * allowed: `retry_after` is 0; denied: `retry_after` > 0 and honest: the same request on
///   the state the denial left, at `now + retry_after`, is allowed, unless that sum reaches
///   `u64::MAX`: a wait that saturates the clock (or is the `u64::MAX` sentinel) says "not
///   before the clock ends", and is not checked;
/// * lossless eviction: once `idle_at(state) <= now` (the sweeper's test; `idle_at` of
///   `u64::MAX` taken as never), the state gives the same decision and the same new state as
///   a fresh one.
///
/// Before each request within the capacity, `idle(state, t1, t2)` sees the state and the
/// previous and current `now`; after it, `stepped(state before, now, cost, decision)`.
/// Returns whether the clock saturated.
pub fn drive<A>(
    algo: &A,
    Timeline {
        unit_ns,
        start,
        trace,
    }: Timeline,
    rate: RateKind,
    is_tombstone: impl Fn(&A::State) -> bool,
    mut idle: impl FnMut(&A::State, u64, u64),
    mut stepped: impl FnMut(&A::State, u64, u64, Decision),
) -> bool
where
    A: Algorithm,
    A::State: Clone + PartialEq,
{
    let fresh = algo.fresh();
    let mut state = fresh.clone();
    let mut now = start.nanos(unit_ns);
    let mut saturated = false;
    let end = if env_flag("HOTLIMIT_FUZZ_CLOCK_BELOW_MAX") {
        u64::MAX - 1
    } else {
        u64::MAX
    };
    for (k, req) in trace.iter().enumerate() {
        let prev = now;
        now = match now.checked_add(req.delta.nanos(unit_ns)) {
            Some(t) if t <= end => t,
            _ => {
                saturated = true;
                end
            }
        };
        let cost = req.cost.value();
        let in_contract = cost != 0 && cost <= algo.capacity();
        if !in_contract && env_flag("HOTLIMIT_FUZZ_SKIP_OUT_OF_CONTRACT") {
            continue;
        }
        let mut after = state.clone();
        let d = algo.update(&mut after, now, cost);
        assert!(
            !is_tombstone(&after),
            "stored the tombstone: request {k} at {now} ns, cost {cost}, state {state:?}"
        );
        if !in_contract {
            // The limiters refuse these before `update`; it must still not panic.
            continue;
        }
        idle(&state, prev, now);
        let ctx = || format!("request {k} at {now} ns, cost {cost}, state {state:?}: {d:?}");
        match d.rate() {
            Some(r) => assert!(r.is_finite() && r >= 0.0, "rate {r}: {}", ctx()),
            None => assert!(rate != RateKind::Always, "no rate: {}", ctx()),
        }
        let idle_at = algo.idle_at(&state);
        // u64::MAX is where idle_at saturates: "not within u64 time", taken as never (a
        // sweep at a clock of exactly u64::MAX would still evict it: see fuzz/README.md).
        if idle_at <= now && idle_at != u64::MAX {
            let mut f = fresh.clone();
            let df = algo.update(&mut f, now, cost);
            // The same new state, or two that are both idle (equivalent to fresh) at `now`: a
            // step that writes nothing (a leaky denial) leaves each state as it was.
            let idle_now = |s: &A::State| algo.idle_at(s) <= now;
            let same = f == after || (idle_now(&f) && idle_now(&after));
            assert!(
                df == d && same,
                "idle_at {idle_at} <= now, but a fresh state gives {df:?} -> {f:?}, this one \
                 {d:?} -> {after:?}; {}",
                ctx()
            );
        }
        if d.is_allowed() {
            assert_eq!(d.retry_after().as_nanos() as u64, 0, "{}", ctx());
        } else {
            let wait = d.retry_after().as_nanos() as u64;
            assert!(wait > 0, "denied with no wait: {}", ctx());
            if let Some(later) = now.checked_add(wait).filter(|&t| t != u64::MAX) {
                let mut retried = after.clone();
                let retry = algo.update(&mut retried, later, cost);
                assert!(
                    retry.is_allowed(),
                    "dishonest retry_after ({:?} policy): retry at {later} ns from state \
                     {after:?} gives {retry:?}; {}",
                    algo.policy(),
                    ctx()
                );
            }
        }
        stepped(&state, now, cost, d);
        state = after;
    }
    saturated
}

/// A window-family configuration: `limit` per `window`, policy.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct WindowCfg {
    /// The limit (cost units per window).
    pub limit: Count,
    /// The window.
    pub window: Span,
    /// Strict instead of leaky (the default).
    pub strict: bool,
}

impl WindowCfg {
    /// `(limit, window, policy)` for the constructors.
    pub fn parts(&self) -> (u64, Duration, Policy) {
        (
            self.limit.value(),
            self.window.duration(),
            policy(self.strict),
        )
    }
}

/// A window algorithm's unit: the interval between requests at the limit, ns.
pub fn window_unit(limit: u64, window: Duration) -> f64 {
    window.as_nanos() as f64 / limit as f64
}

/// Whether the environment variable `name` is set (to anything), read once per name. Two
/// knobs let a run look past known bugs (fuzz/README.md):
/// * `HOTLIMIT_FUZZ_SKIP_OUT_OF_CONTRACT`: `drive` does not step costs of 0 or above the
///   capacity at all;
/// * `HOTLIMIT_FUZZ_CLOCK_BELOW_MAX`: `drive`'s clock saturates at `u64::MAX − 1` instead of
///   `u64::MAX`.
pub fn env_flag(name: &'static str) -> bool {
    static FLAGS: std::sync::Mutex<Vec<(&'static str, bool)>> = std::sync::Mutex::new(Vec::new());
    let mut flags = FLAGS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, set)) = flags.iter().find(|(n, _)| *n == name) {
        return set;
    }
    let set = std::env::var_os(name).is_some();
    flags.push((name, set));
    set
}

/// What a limiter must answer for a request of `cost`: the cost errors first (nothing
/// counted), else what the model decides (`keyed` and `compact` compare stores with it).
pub fn expected<T>(capacity: u64, cost: u64, decide: impl FnOnce() -> T) -> Result<T, QuotaError> {
    if cost == 0 {
        Err(QuotaError::ZeroCost)
    } else if cost > capacity {
        Err(QuotaError::ExceedsCapacity { cost, capacity })
    } else {
        Ok(decide())
    }
}

/// One operation on a pair of keyed limiters and their reference model (`keyed`, `compact`),
/// for keys drawn as `K`.
#[derive(Arbitrary, Debug)]
pub enum Op<K> {
    /// Advance the clock, then `check_n(key, cost)`.
    Check {
        /// The key.
        key: K,
        /// The clock step first.
        delta: Delta,
        /// The cost.
        cost: Count,
    },
    /// Advance the clock, then `check(key)` (cost 1).
    CheckOne {
        /// The key.
        key: K,
        /// The clock step first.
        delta: Delta,
    },
    /// Move the clock backwards (a TSC read from another core, a manual clock set back).
    Back(u64),
    /// Advance the clock, then `reserve(key, cost, max_wait)` (GCRA only; a check elsewhere).
    Reserve {
        /// The key.
        key: K,
        /// The clock step first.
        delta: Delta,
        /// The cost.
        cost: Count,
        /// The longest delay the caller accepts.
        max_wait: Span,
    },
    /// Advance the clock, then sweep both limiters.
    Sweep {
        /// The clock step first.
        delta: Delta,
    },
    /// Advance the clock, then `peek_n(key, cost)`: must equal the model's step on a copy,
    /// and change nothing (no key inserted, no state changed).
    Peek {
        /// The key.
        key: K,
        /// The clock step first.
        delta: Delta,
        /// The cost.
        cost: Count,
    },
}
