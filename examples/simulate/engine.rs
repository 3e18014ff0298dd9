//! The scenario engine: clients, their arrivals, and runs of hotlimit limiters on a manual
//! clock. No plotting and no files, so `tests/simulate.rs` includes this file and asserts on
//! what it computes; `main.rs` prints, writes and draws the same numbers.
//!
//! Times are integer nanoseconds since the clock's origin, as in the crate. Every random draw
//! comes from a seeded generator, so a scenario gives the same events (and the same numbers)
//! on every run and every machine.

// The CLI and the tests each use a part of this module.
#![allow(dead_code)]

use hotlimit::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
    DEFAULT_BUCKETS,
};

use hotlimit::RateLimiter;
use hotlimit::Requests;
use hotlimit::{CasLimiter, ManualClock, Rate};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::Exp;
use std::time::Duration;

/// One second, in nanoseconds.
pub const SECOND: u64 = 1_000_000_000;

/// `ns` as seconds.
pub fn secs(ns: u64) -> f64 {
    ns as f64 / SECOND as f64
}

/// How a client sends during one [`Segment`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// One request every `period` ns, the first at the segment's start.
    Periodic { period: u64 },
    /// A Poisson process: exponentially distributed gaps with mean `1/rate` seconds.
    Poisson { rate: f64 },
    /// `size` requests at the same instant every `period` ns, the first at the start.
    Bursty { size: u32, period: u64 },
}

impl Arrivals {
    /// Periodic at `rate` requests per second (the period rounded to the nanosecond).
    pub fn periodic(rate: f64) -> Self {
        Arrivals::Periodic {
            period: (SECOND as f64 / rate).round() as u64,
        }
    }

    /// The mean rate, requests per second.
    pub fn rate(&self) -> f64 {
        match *self {
            Arrivals::Periodic { period } => SECOND as f64 / period as f64,
            Arrivals::Poisson { rate } => rate,
            Arrivals::Bursty { size, period } => size as f64 * SECOND as f64 / period as f64,
        }
    }
}

/// A client sends by `arrivals` from `from` (inclusive) until `until` (exclusive), in ns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Segment {
    /// First instant of the segment, ns.
    pub from: u64,
    /// End of the segment (exclusive), ns.
    pub until: u64,
    /// How the client sends meanwhile.
    pub arrivals: Arrivals,
}

/// A client: one key of the limiter, sending by one or more segments (a piecewise client has
/// several: rate A until `t1`, rate B after).
#[derive(Debug, Clone, PartialEq)]
pub struct Client {
    /// Shown in tables, legends and CSV files.
    pub name: String,
    /// Clients are summed by group ("polite", "abuser") where there are many.
    pub group: String,
    /// In time order, not overlapping.
    pub segments: Vec<Segment>,
}

impl Client {
    /// A client sending by `arrivals` over `[from, until)` (seconds).
    pub fn new(name: &str, group: &str, from: f64, until: f64, arrivals: Arrivals) -> Self {
        Self {
            name: name.into(),
            group: group.into(),
            segments: vec![Segment {
                from: ns(from),
                until: ns(until),
                arrivals,
            }],
        }
    }

    /// Adds a segment after the last one, from its end until `until` (seconds).
    pub fn then(mut self, until: f64, arrivals: Arrivals) -> Self {
        let from = self.segments.last().map_or(0, |s| s.until);
        self.segments.push(Segment {
            from,
            until: ns(until),
            arrivals,
        });
        self
    }

    /// The rate this client means to send at `t` (requests per second): the step line the
    /// estimates are compared with.
    pub fn true_rate(&self, t: u64) -> f64 {
        self.segments
            .iter()
            .find(|s| s.from <= t && t < s.until)
            .map_or(0.0, |s| s.arrivals.rate())
    }

    /// The client's request times, in order. `rng` draws the Poisson gaps.
    fn arrivals(&self, rng: &mut StdRng) -> Vec<u64> {
        let mut times = Vec::new();
        for s in &self.segments {
            match s.arrivals {
                Arrivals::Periodic { period } => {
                    times.extend((s.from..s.until).step_by(period.max(1) as usize));
                }
                Arrivals::Bursty { size, period } => {
                    for t in (s.from..s.until).step_by(period.max(1) as usize) {
                        times.extend((0..size).map(|_| t));
                    }
                }
                Arrivals::Poisson { rate } => {
                    // The process is memoryless, so starting afresh at the segment's start is
                    // exact; gaps are rounded to whole nanoseconds, as the clock is.
                    let gap = Exp::new(rate).expect("a positive, finite Poisson rate");
                    let mut t = s.from;
                    loop {
                        let d: f64 = rng.sample(gap);
                        t = t.saturating_add((d * SECOND as f64).round() as u64);
                        if t >= s.until {
                            break;
                        }
                        times.push(t);
                    }
                }
            }
        }
        times
    }
}

/// Seconds (a scenario constant) as nanoseconds.
fn ns(seconds: f64) -> u64 {
    (seconds * SECOND as f64).round() as u64
}

/// One request: client `client` (its index in [`Scenario::clients`]) at `t` ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Event {
    /// When, ns.
    pub t: u64,
    /// Who: an index into [`Scenario::clients`], also the limiter key.
    pub client: u32,
}

/// Clients run together for `end` ns; `seed` fixes every random draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Also the output directory's name.
    pub name: &'static str,
    /// One limiter key each.
    pub clients: Vec<Client>,
    /// The run's length, ns: requests at or after it are dropped.
    pub end: u64,
    /// Seeds every client's generator.
    pub seed: u64,
}

impl Scenario {
    /// Every client's requests merged in time order (ties by client index, then in each
    /// client's own order): the one sequence every algorithm of a scenario is run on.
    pub fn events(&self) -> Vec<Event> {
        let mut events = Vec::new();
        for (i, c) in self.clients.iter().enumerate() {
            // One generator per client, so adding a client leaves the others' arrivals as
            // they were.
            let mut rng = StdRng::seed_from_u64(self.seed ^ (i as u64 + 1).wrapping_mul(GOLDEN));
            events.extend(c.arrivals(&mut rng).into_iter().map(|t| Event {
                t,
                client: i as u32,
            }));
        }
        // Stable: a burst keeps its order.
        events.sort_by_key(|e| (e.t, e.client));
        events.retain(|e| e.t < self.end);
        events
    }
}

/// 2^64 / φ: spreads client indices over the seed space.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The answer to one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    /// The request's time, ns.
    pub t: u64,
    /// The client's index.
    pub client: u32,
    /// The limiter's answer.
    pub allowed: bool,
    /// The measured rate just before the request (EARRRL, exponential).
    pub rate: Option<f64>,
    /// When denied, the honest wait, ns.
    pub retry_after: u64,
}

/// A client's measured rate at `t`, read without sending a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The reading's time, ns.
    pub t: u64,
    /// The client's index.
    pub client: u32,
    /// Requests per second.
    pub rate: f64,
}

/// One algorithm run over a scenario's events.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// A short name (also the CSV file's).
    pub name: String,
    /// The configuration, in words, for tables and legends.
    pub label: String,
    /// One per request, in time order.
    pub records: Vec<Record>,
    /// Measured rates on a regular grid, for algorithms that measure one (empty otherwise).
    pub samples: Vec<Sample>,
}

/// When to read the measured rates: at `offset + k·every` ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// The spacing of the readings, ns.
    pub every: u64,
    /// The first reading's time, ns.
    pub offset: u64,
}

/// Runs `algo` over `events`: one key per client in a lock-free [`CasLimiter`] on a
/// [`ManualClock`] set to each request's time. With a `grid`, the measured rate of every
/// client is also read (with `peek`, which counts nothing) at each grid time, just before the
/// requests at that time.
pub fn run<A: Algorithm>(
    name: &str,
    label: &str,
    algo: A,
    scenario: &Scenario,
    events: &[Event],
    grid: Option<Grid>,
) -> Run {
    let clock = ManualClock::default();
    let limiter = CasLimiter::<u32, A, _>::with_clock(algo, clock.clone());
    let mut records = Vec::with_capacity(events.len());
    let mut samples = Vec::new();
    let mut next_sample = grid.map(|g| g.offset);
    let mut sample_until = |t: u64, samples: &mut Vec<Sample>| {
        while let (Some(s), Some(g)) = (next_sample, grid) {
            if s > t || s >= scenario.end {
                break;
            }
            clock.set(Duration::from_nanos(s));
            for client in 0..scenario.clients.len() as u32 {
                if let Some(rate) = limiter.request(&client).peek().unwrap().rate() {
                    samples.push(Sample { t: s, client, rate });
                }
            }
            next_sample = Some(s + g.every);
        }
    };
    for e in events {
        // Samples at a request's own time see the rate just before it, like `Decision::rate`.
        sample_until(e.t.saturating_sub(1), &mut samples);
        clock.set(Duration::from_nanos(e.t));
        let d = limiter.check(&e.client);
        records.push(Record {
            t: e.t,
            client: e.client,
            allowed: d.is_allowed(),
            rate: d.rate(),
            retry_after: d.retry_after().as_nanos() as u64,
        });
    }
    sample_until(scenario.end, &mut samples);
    Run {
        name: name.into(),
        label: label.into(),
        records,
        samples,
    }
}

/// Requests attempted and allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    /// Requests sent.
    pub attempted: u64,
    /// Requests the limiter allowed.
    pub allowed: u64,
}

impl Totals {
    /// Requests the limiter denied.
    pub fn denied(&self) -> u64 {
        self.attempted - self.allowed
    }

    /// The share denied, 0 to 1 (0 when nothing was attempted).
    pub fn denied_share(&self) -> f64 {
        self.denied() as f64 / (self.attempted.max(1)) as f64
    }

    /// The share allowed, 0 to 1 (0 when nothing was attempted).
    pub fn allowed_share(&self) -> f64 {
        self.allowed as f64 / (self.attempted.max(1)) as f64
    }

    fn add(&mut self, allowed: bool) {
        self.attempted += 1;
        self.allowed += u64::from(allowed);
    }
}

impl Run {
    /// Totals for the requests that `keep` selects.
    pub fn totals(&self, keep: impl Fn(&Record) -> bool) -> Totals {
        let mut t = Totals::default();
        for r in self.records.iter().filter(|r| keep(r)) {
            t.add(r.allowed);
        }
        t
    }

    /// Totals per client, in client order.
    pub fn per_client(&self, clients: usize) -> Vec<Totals> {
        let mut t = vec![Totals::default(); clients];
        for r in &self.records {
            t[r.client as usize].add(r.allowed);
        }
        t
    }
}

/// The limit every algorithm of the "abuser" and "mixed" scenarios enforces: 1 request/s,
/// which each window algorithm states as 60 per 60 s.
pub const LIMIT_PER_SEC: u64 = 1;
/// The windows' length.
pub const WINDOW: Duration = Duration::from_secs(60);
/// The windows' (and GCRA's burst) count: `LIMIT_PER_SEC · WINDOW`.
pub const WINDOW_LIMIT: u64 = 60;
/// EARRRL's half-life where it enforces the limit: 10 s. It lets a fresh client burst about
/// `h·R/ln 2` ≈ 14 requests, and forgets an abuser's excess in a few half-lives (30 s would
/// keep the "abuser" scenario's client out past its end).
pub const ENFORCING_HALF_LIFE: Duration = Duration::from_secs(10);

/// The algorithms that enforce the limit, configured alike.
fn fixed_window() -> FixedWindow {
    FixedWindow::new(WINDOW_LIMIT, WINDOW).expect("valid fixed window")
}

fn gcra() -> Gcra {
    // 1/s with a burst of 60: the same 60 at once that the windows allow at a window's start.
    Gcra::new(Rate::new(LIMIT_PER_SEC as f64, Duration::from_secs(1)).expect("valid rate"))
        .and_then(|g| g.with_burst(WINDOW_LIMIT))
        .expect("valid GCRA")
}

fn sliding_window() -> SlidingWindow {
    SlidingWindow::new(WINDOW_LIMIT, WINDOW).expect("valid sliding window")
}

/// EARRRL with the strict policy (its default): denied requests count too.
fn earrrl(half_life: Duration, max_rate: f64) -> Earrrl {
    Earrrl::new(
        half_life,
        Rate::new(max_rate, Duration::from_secs(1)).expect("valid rate"),
    )
    .expect("valid EARRRL")
}

// ---------------------------------------------------------------------------------------------
// Scenario 1: tracking.

/// "tracking": how EARRRL's estimate follows a client's true rate.
#[path = "tracking.rs"]
pub mod tracking;

// ---------------------------------------------------------------------------------------------
// Scenario 2: abuser.

/// "abuser": a client over the limit until it complies; when does each algorithm let it back?
pub mod abuser {
    use super::*;

    /// The abuse phase: one request every 600 ms (1.666… per second) from 0 until 150 s.
    pub const ABUSE_PERIOD: u64 = 600_000_000;
    /// When the client starts to comply, s.
    pub const COMPLY_AT: f64 = 150.0;
    /// Then exactly one request per second until the end.
    pub const COMPLY_PERIOD: u64 = SECOND;
    /// The run's length, s.
    pub const END: f64 = 300.0;

    /// The one client: 1.67/s until 150 s, then 1/s until 300 s.
    pub fn scenario() -> Scenario {
        let client = Client::new(
            "abuser",
            "abuser",
            0.0,
            COMPLY_AT,
            Arrivals::Periodic {
                period: ABUSE_PERIOD,
            },
        )
        .then(
            END,
            Arrivals::Periodic {
                period: COMPLY_PERIOD,
            },
        );
        Scenario {
            name: "abuser",
            clients: vec![client],
            end: ns(END),
            seed: 0,
        }
    }

    /// What one algorithm did to the client.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Stats {
        /// Before [`COMPLY_AT`].
        pub abuse: Totals,
        /// From [`COMPLY_AT`] on.
        pub comply: Totals,
        /// Allowed per 60 s window ([0, 60), [60, 120), …).
        pub per_window: Vec<u64>,
        /// The first request allowed once the client complies (ns).
        pub first_allowed: Option<u64>,
        /// The first request of the compliant phase's final unbroken run of allowed requests:
        /// from then on every request is allowed (ns). `None` if the last request is denied.
        pub steady_from: Option<u64>,
        /// The times of the requests denied once the client complies (ns).
        pub denied_complying: Vec<u64>,
        /// The last request allowed during the abuse phase (ns).
        pub last_abuse_allowed: Option<u64>,
    }

    /// The runs and what each did to the client.
    #[derive(Debug, Clone)]
    pub struct Report {
        /// What was run.
        pub scenario: Scenario,
        /// Fixed window, GCRA, sliding window counter, EARRRL (strict), in that order.
        pub runs: Vec<Run>,
        /// `stats[i]` belongs to `runs[i]`.
        pub stats: Vec<Stats>,
    }

    /// The run names, in [`Report::runs`] order.
    pub const RUNS: [&str; 4] = ["fixed-window", "gcra", "sliding-window", "earrrl-strict"];

    /// Runs the scenario with each algorithm, all enforcing 1 request/s.
    pub fn report() -> Report {
        let scenario = scenario();
        let events = scenario.events();
        let h = ENFORCING_HALF_LIFE.as_secs();
        let runs = vec![
            run(
                RUNS[0],
                "fixed window 60/60 s",
                fixed_window(),
                &scenario,
                &events,
                None,
            ),
            run(
                RUNS[1],
                "GCRA 1/s burst 60",
                gcra(),
                &scenario,
                &events,
                None,
            ),
            run(
                RUNS[2],
                "sliding window 60/60 s",
                sliding_window(),
                &scenario,
                &events,
                None,
            ),
            run(
                RUNS[3],
                &format!("EARRRL 1/s h = {h} s strict"),
                earrrl(ENFORCING_HALF_LIFE, LIMIT_PER_SEC as f64),
                &scenario,
                &events,
                None,
            ),
        ];
        let stats = runs.iter().map(stats).collect();
        Report {
            scenario,
            runs,
            stats,
        }
    }

    /// What `run` did to the client in each phase.
    fn stats(run: &Run) -> Stats {
        let comply = ns(COMPLY_AT);
        let window = WINDOW.as_nanos() as u64;
        let mut per_window = vec![0; ns(END).div_ceil(window) as usize];
        for r in run.records.iter().filter(|r| r.allowed) {
            per_window[(r.t / window) as usize] += 1;
        }
        let complying: Vec<&Record> = run.records.iter().filter(|r| r.t >= comply).collect();
        let steady_from = {
            let i = complying
                .iter()
                .rposition(|r| !r.allowed)
                .map_or(0, |i| i + 1);
            complying.get(i).map(|r| r.t)
        };
        Stats {
            abuse: run.totals(|r| r.t < comply),
            comply: run.totals(|r| r.t >= comply),
            per_window,
            first_allowed: complying.iter().find(|r| r.allowed).map(|r| r.t),
            denied_complying: complying
                .iter()
                .filter(|r| !r.allowed)
                .map(|r| r.t)
                .collect(),
            steady_from,
            last_abuse_allowed: run
                .records
                .iter()
                .rev()
                .find(|r| r.t < comply && r.allowed)
                .map(|r| r.t),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scenario 3: mixed.

/// "mixed": many polite clients and a few abusers, all under the same per-client limit.
pub mod mixed {
    use super::*;

    /// The client groups, in [`Stats::groups`] order, with how many clients each has and how
    /// they send. Polite clients stay under the limit on average; abusers send 5 times it.
    pub const GROUPS: [Group; 4] = [
        Group {
            id: "polite",
            label: "polite, Poisson 0.5/s",
            clients: 40,
            arrivals: Arrivals::Poisson { rate: 0.5 },
        },
        // A browser loading a page: 20 requests at once, once a minute (0.33/s on average).
        Group {
            id: "polite-burst",
            label: "polite, 20 at once every 60 s",
            clients: 10,
            arrivals: Arrivals::Bursty {
                size: 20,
                period: 60 * SECOND,
            },
        },
        Group {
            id: "abuser",
            label: "abuser, Poisson 5/s",
            clients: 3,
            arrivals: Arrivals::Poisson { rate: 5.0 },
        },
        Group {
            id: "abuser-burst",
            label: "abuser, 100 at once every 20 s",
            clients: 2,
            arrivals: Arrivals::Bursty {
                size: 100,
                period: 20 * SECOND,
            },
        },
    ];
    /// [`GROUPS`] indices of the polite and of the abusive groups.
    pub const POLITE: [usize; 2] = [0, 1];
    pub const ABUSIVE: [usize; 2] = [2, 3];
    /// The run's length, s.
    pub const END: f64 = 300.0;

    /// A kind of client in the scenario.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct Group {
        /// [`Client::group`] of its clients.
        pub id: &'static str,
        /// For tables and charts.
        pub label: &'static str,
        /// How many clients it has.
        pub clients: usize,
        /// How each of them sends, all the run long.
        pub arrivals: Arrivals,
    }

    /// Every group's clients, in [`GROUPS`] order.
    pub fn scenario() -> Scenario {
        let mut clients = Vec::new();
        for g in GROUPS {
            for i in 0..g.clients {
                // Bursty clients start at different times (one per 60 s / n), so their bursts
                // do not all land at once; each client has its own key anyway, so this only
                // makes the CSV files easier to read.
                let from = match g.arrivals {
                    Arrivals::Bursty { period, .. } => secs(period) * i as f64 / g.clients as f64,
                    _ => 0.0,
                };
                clients.push(Client::new(
                    &format!("{}-{i}", g.id),
                    g.id,
                    from,
                    END,
                    g.arrivals,
                ));
            }
        }
        Scenario {
            name: "mixed",
            clients,
            end: ns(END),
            seed: 3,
        }
    }

    /// One algorithm's treatment of each group.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Stats {
        /// Per group, in [`GROUPS`] order.
        pub groups: [Totals; 4],
        /// Per group: the clients denied at least once.
        pub clients_denied: [usize; 4],
    }

    impl Stats {
        /// The groups at `indices`, summed.
        pub fn sum(&self, indices: [usize; 2]) -> Totals {
            let [a, b] = indices.map(|i| self.groups[i]);
            Totals {
                attempted: a.attempted + b.attempted,
                allowed: a.allowed + b.allowed,
            }
        }

        /// Every polite client's requests.
        pub fn polite(&self) -> Totals {
            self.sum(POLITE)
        }

        /// Every abuser's requests.
        pub fn abusers(&self) -> Totals {
            self.sum(ABUSIVE)
        }
    }

    /// The runs and how each treated each group.
    #[derive(Debug, Clone)]
    pub struct Report {
        /// What was run.
        pub scenario: Scenario,
        /// One per algorithm, in [`RUNS`] order.
        pub runs: Vec<Run>,
        /// `stats[i]` belongs to `runs[i]`.
        pub stats: Vec<Stats>,
    }

    /// The run names, in [`Report::runs`] order.
    pub const RUNS: [&str; 7] = [
        "fixed-window",
        "sliding-window",
        "sliding-log",
        "sub-window",
        "gcra",
        "exponential",
        "earrrl-strict",
    ];

    /// Runs the scenario with every algorithm, each enforcing 1 request/s per client.
    pub fn report() -> Report {
        let scenario = scenario();
        let events = scenario.events();
        let s = &scenario;
        let e = &events;
        let h = ENFORCING_HALF_LIFE.as_secs();
        let runs = vec![
            run(RUNS[0], "fixed window 60/60 s", fixed_window(), s, e, None),
            run(
                RUNS[1],
                "sliding window 60/60 s",
                sliding_window(),
                s,
                e,
                None,
            ),
            run(
                RUNS[2],
                "sliding log 60/60 s",
                SlidingLog::new(WINDOW_LIMIT, WINDOW).expect("valid sliding log"),
                s,
                e,
                None,
            ),
            run(
                RUNS[3],
                "sub-window 60/60 s, 60 buckets",
                SubWindow::new(WINDOW_LIMIT, WINDOW, DEFAULT_BUCKETS).expect("valid sub-window"),
                s,
                e,
                None,
            ),
            run(RUNS[4], "GCRA 1/s burst 60", gcra(), s, e, None),
            run(
                RUNS[5],
                "exponential 60/60 s",
                Exponential::new(WINDOW_LIMIT as f64, WINDOW).expect("valid exponential"),
                s,
                e,
                None,
            ),
            run(
                RUNS[6],
                &format!("EARRRL 1/s h = {h} s strict"),
                earrrl(ENFORCING_HALF_LIFE, LIMIT_PER_SEC as f64),
                s,
                e,
                None,
            ),
        ];
        let stats = runs.iter().map(|r| stats(s, r)).collect();
        Report {
            scenario,
            runs,
            stats,
        }
    }

    /// What `run` did to each group.
    fn stats(scenario: &Scenario, run: &Run) -> Stats {
        let group_of = |client: u32| {
            let id = &scenario.clients[client as usize].group;
            GROUPS
                .iter()
                .position(|g| g.id == id)
                .expect("every client is in a group")
        };
        let mut groups = [Totals::default(); 4];
        for r in &run.records {
            groups[group_of(r.client)].add(r.allowed);
        }
        let mut clients_denied = [0; 4];
        for (c, t) in run.per_client(scenario.clients.len()).iter().enumerate() {
            if t.denied() > 0 {
                clients_denied[group_of(c as u32)] += 1;
            }
        }
        Stats {
            groups,
            clients_denied,
        }
    }
}
