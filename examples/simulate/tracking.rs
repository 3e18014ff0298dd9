use super::*;

/// The clients' rates, requests per second.
pub const RATES: [f64; 3] = [10.0, 1.0, 0.1];
/// The clients start sending at 50 s...
pub const START: f64 = 50.0;
/// ...and stop at 200 s...
pub const STOP: f64 = 200.0;
/// ...and the run (and the chart) lasts 300 s, to show the estimates decay.
pub const END: f64 = 300.0;
/// The half-lives compared.
pub const HALF_LIVES: [Duration; 2] = [Duration::from_secs(10), Duration::from_secs(1)];
/// High enough that nothing is denied: the point is the estimate, and a denial under the
/// strict policy would not change it anyway.
pub const MAX_RATE: f64 = 1000.0;
/// Steady state: from 75 s after the start (7.5 half-lives of the longer one, so its
/// start-up transient is below 0.6%) until the clients stop.
pub const STEADY_FROM: f64 = 125.0;
/// The estimate is read every 0.25 s at odd eighths of a second (50.125 s, 50.375 s, …):
/// never at a periodic client's request time, where the estimate jumps by λ, and at
/// phases symmetric about each periodic client's mid-period (a quarter and three quarters
/// into the 0.1 s period), so the mean error over the readings is the sawtooth's time
/// average, what a reading at a random time sees.
pub const GRID: Grid = Grid {
    every: SECOND / 4,
    offset: SECOND / 8,
};

/// Three periodic clients (the literal reading: a request every 0.1 s, 1 s, 10 s)
/// and three Poisson clients at the same rates (random gaps: the error real traffic sees).
pub fn scenario() -> Scenario {
    let mut clients = Vec::new();
    for kind in ["periodic", "poisson"] {
        for rate in RATES {
            let arrivals = match kind {
                "periodic" => Arrivals::periodic(rate),
                _ => Arrivals::Poisson { rate },
            };
            clients.push(Client::new(
                &format!("{kind} {rate}/s"),
                kind,
                START,
                STOP,
                arrivals,
            ));
        }
    }
    Scenario {
        name: "tracking",
        clients,
        end: ns(END),
        seed: 11,
    }
}

/// How well one estimate tracked one client.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// The client's index.
    pub client: u32,
    /// The run's half-life.
    pub half_life: Duration,
    /// What the client sends, requests per second.
    pub true_rate: f64,
    /// Seconds from the client's start to the first reading ≥ 90% of its true rate.
    pub rise: Option<f64>,
    /// Mean |estimate − true| / true over the readings in [`STEADY_FROM`], [`STOP`]).
    pub steady_error: f64,
    /// The smallest and largest steady-state readings.
    pub steady_range: (f64, f64),
}

/// The runs (one per half-life) and their statistics per client.
#[derive(Debug, Clone)]
pub struct Report {
    /// What was run.
    pub scenario: Scenario,
    /// One per half-life, in [`HALF_LIVES`] order.
    pub runs: Vec<Run>,
    /// `stats[i]` belongs to `runs[i]`, one entry per client.
    pub stats: Vec<Vec<Stats>>,
}

/// Runs the scenario with each half-life.
pub fn report() -> Report {
    let scenario = scenario();
    let events = scenario.events();
    let mut runs = Vec::new();
    let mut stats = Vec::new();
    for h in HALF_LIVES {
        let name = format!("earrrl-h{}s", h.as_secs());
        let label = format!("EARRRL h = {} s", h.as_secs());
        let run = run(
            &name,
            &label,
            earrrl(h, MAX_RATE),
            &scenario,
            &events,
            Some(GRID),
        );
        stats.push(
            (0..scenario.clients.len() as u32)
                .map(|c| client_stats(&scenario, &run, c, h))
                .collect(),
        );
        runs.push(run);
    }
    Report {
        scenario,
        runs,
        stats,
    }
}

/// How the estimate in `run` tracked `client`.
fn client_stats(scenario: &Scenario, run: &Run, client: u32, half_life: Duration) -> Stats {
    let c = &scenario.clients[client as usize];
    let rate = c.segments[0].arrivals.rate();
    let start = ns(START);
    let samples: Vec<&Sample> = run.samples.iter().filter(|s| s.client == client).collect();
    let rise = samples
        .iter()
        .find(|s| s.t >= start && s.rate >= 0.9 * rate)
        .map(|s| secs(s.t - start));
    let steady: Vec<f64> = samples
        .iter()
        .filter(|s| s.t >= ns(STEADY_FROM) && s.t < ns(STOP))
        .map(|s| s.rate)
        .collect();
    let steady_error =
        steady.iter().map(|r| (r - rate).abs() / rate).sum::<f64>() / steady.len() as f64;
    let steady_range = steady
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| {
            (lo.min(r), hi.max(r))
        });
    Stats {
        client,
        half_life,
        true_rate: rate,
        rise,
        steady_error,
        steady_range,
    }
}
