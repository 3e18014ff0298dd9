//! The load-test engine: the command line, the generated key streams, the timed runs and the
//! output. No printing to stdout and no exit codes, so `tests/loadtest.rs` includes this file
//! and runs it in process; `main.rs` is the command-line wrapper (see its docs for the options
//! and the output).

use clap::{Parser, ValueEnum};
use governor::Quota;
use hdrhistogram::Histogram;
use hotlimit::algo::{
    Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow, DEFAULT_BUCKETS,
};
use hotlimit::baseline::ShardedLimiter;
use hotlimit::store::{CompactVariant, Variant};
use hotlimit::{
    Algorithm, Cas, CasLimiter, Clock, CoarseClock, CompactLimiter, Locked, MutexLimiter,
    QuantaClock, Rate, RateLimiter,
};
use rand::distr::Distribution;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::Zipf;
use std::ffi::OsString;
use std::fmt;
use std::io::Write;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

// The table and the JSON output: beside this file, named by path so that `tests/loadtest.rs`,
// which loads this file by path too, finds it.
#[path = "report.rs"]
mod report;
use report::{json, table};

/// How many abusive keys share the `--abusive` part of the traffic (fewer if there are fewer
/// keys).
const ABUSIVE_KEYS: u64 = 8;

/// GCRA's quota, shared with governor so the two compare like for like.
const GCRA_PER_SECOND: u32 = 1000;
const GCRA_BURST: u32 = 100;

/// Per-check latencies above this (10 s) are recorded as this.
const MAX_LATENCY_NS: u64 = 10_000_000_000;

/// The default total of checks per variant, split over the threads: a few seconds per
/// variant on 2 cores.
const DEFAULT_TOTAL_REQUESTS: u64 = 40_000_000;
const DEFAULT_MIN_REQUESTS: u64 = 1_000_000;

/// Runs a keyed-limiter load test: the same pre-generated request stream through hotlimit's
/// CAS limiter, its mutex twin, a sharded Mutex<HashMap> and governor, and prints throughput,
/// latency percentiles, CAS retries and the share allowed.
///
/// Keys are 0..keys, key r-1 having popularity rank r. The abusive keys are the last
/// min(8, keys) keys (the least popular ranks). Each variant starts from an empty limiter and
/// replays exactly the same per-thread key sequences, generated before timing.
///
/// Columns: Mops/s = checks / wall s / 1e6; ns/op = wall ns x threads / checks (per thread);
/// p50/p99/p99.9 = latency of one check in ns, timed with Instant (includes ~20-40 ns of timer
/// overhead); retries/op = CAS retries per check (hotlimit CAS only; 0 in JSON for the
/// others); allowed % = share of checks allowed; vs CAS = throughput / hotlimit CAS's.
#[derive(Debug, Parser)]
#[command(name = "loadtest", verbatim_doc_comment)]
pub struct Args {
    /// Algorithm, each with a fixed per-key quota.
    #[arg(long, value_enum, default_value_t = Algo::Gcra)]
    algo: Algo,

    /// Worker threads [default: available cores, at least 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    threads: Option<u32>,

    /// Distinct keys (0..keys).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=u32::MAX as u64))]
    keys: u64,

    /// Key popularity: `uniform`, or `zipf:<s>` (Zipf over ranks 1..=keys with exponent s >= 0).
    #[arg(long, default_value = "zipf:1.0", value_parser = parse_dist)]
    dist: Dist,

    /// Share of requests (0..1) sent by the abusive keys, far above their quota.
    #[arg(long, default_value_t = 0.1, value_parser = parse_fraction)]
    abusive: f64,

    /// Checks per thread [default: 40,000,000 / threads, at least 1,000,000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    requests: Option<u64>,

    /// Comma-separated limiters to run, in this order (governor only with --algo gcra).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "cas,mutex,sharded-mutex,governor"
    )]
    variants: Vec<VariantName>,

    /// Store of the cas and mutex variants: the papaya map, or the fixed-capacity compact
    /// table (CompactLimiter, sized for --keys).
    #[arg(long, value_enum, default_value_t = Store::Papaya)]
    store: Store,

    /// Clock of every limiter: `exact` (hotlimit's TSC clock, governor's default) or `coarse`
    /// (a 1 ms CoarseClock for hotlimit, a 1 ms quanta upkeep clock for governor).
    #[arg(long, value_enum, default_value_t = ClockKind::Exact)]
    clock: ClockKind,

    /// Seed of the key streams (thread t uses seed + t).
    #[arg(long, default_value_t = 1)]
    seed: u64,

    /// Print one JSON array of result rows on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Algo {
    /// GCRA, 1000/s burst 100 per key (leaky)
    Gcra,
    /// EARRRL, limit 1000/s, half-life 1s (strict)
    Earrrl,
    /// Exponential (Exim), limit 1000 per 1s period (leaky)
    Exponential,
    /// Fixed window, 1000 per 1s window (leaky)
    FixedWindow,
    /// Sliding window counter, 1000 per 1s window (leaky, exact rounding)
    SlidingWindow,
    /// Sliding log, 100 per 100ms window (leaky; a shorter window keeps logs small)
    SlidingLog,
    /// Sub-window counters, 1000 per 1s window in 60 buckets (leaky, erring strict)
    SubWindow,
}

impl Algo {
    fn name(self) -> &'static str {
        match self {
            Algo::Gcra => "gcra",
            Algo::Earrrl => "earrrl",
            Algo::Exponential => "exponential",
            Algo::FixedWindow => "fixed-window",
            Algo::SlidingWindow => "sliding-window",
            Algo::SlidingLog => "sliding-log",
            Algo::SubWindow => "sub-window",
        }
    }

    /// The quota, for the table's header.
    fn quota(self) -> &'static str {
        match self {
            Algo::Gcra => "1000/s burst 100",
            Algo::Earrrl => "1000/s, half-life 1s",
            Algo::Exponential => "1000 per 1s",
            Algo::FixedWindow | Algo::SlidingWindow => "1000 per 1s",
            Algo::SlidingLog => "100 per 100ms",
            Algo::SubWindow => "1000 per 1s, 60 buckets",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ClockKind {
    /// Read the TSC on every check (QuantaClock; governor's default clock)
    Exact,
    /// A cached time refreshed every 1 ms (CoarseClock; governor's QuantaUpkeepClock)
    Coarse,
}

impl ClockKind {
    fn name(self) -> &'static str {
        match self {
            ClockKind::Exact => "exact",
            ClockKind::Coarse => "coarse",
        }
    }
}

/// The run's clocks: hotlimit's, and governor's upkeep clock when `--clock coarse`.
struct Clocks<C> {
    hotlimit: C,
    governor_upkeep: Option<governor::clock::QuantaUpkeepClock>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Store {
    /// hotlimit's papaya-based KeyedLimiter (any key, grows)
    Papaya,
    /// hotlimit's CompactLimiter (fixed-size keys inline in a fixed-capacity table)
    Compact,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Papaya => "papaya",
            Store::Compact => "compact",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum VariantName {
    /// hotlimit CasLimiter (lock-free)
    Cas,
    /// hotlimit MutexLimiter (same map, per-key mutex)
    Mutex,
    /// hotlimit ShardedLimiter (sharded Mutex<HashMap>)
    ShardedMutex,
    /// governor's keyed limiter (GCRA on a DashMap), --algo gcra only
    Governor,
}

impl VariantName {
    fn name(self) -> &'static str {
        match self {
            VariantName::Cas => "cas",
            VariantName::Mutex => "mutex",
            VariantName::ShardedMutex => "sharded-mutex",
            VariantName::Governor => "governor",
        }
    }
}

/// Key popularity.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Dist {
    Uniform,
    Zipf(f64),
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dist::Uniform => f.write_str("uniform"),
            // `{:?}` keeps a decimal point: `zipf:1.0`, not `zipf:1`.
            Dist::Zipf(s) => write!(f, "zipf:{s:?}"),
        }
    }
}

fn parse_dist(s: &str) -> Result<Dist, String> {
    if s == "uniform" {
        return Ok(Dist::Uniform);
    }
    let Some(exponent) = s.strip_prefix("zipf:") else {
        return Err("expected `uniform` or `zipf:<s>` (e.g. zipf:1.0)".into());
    };
    match exponent.parse::<f64>() {
        Ok(e) if e.is_finite() && e >= 0.0 => Ok(Dist::Zipf(e)),
        _ => Err(format!(
            "bad Zipf exponent `{exponent}`: expected a finite number >= 0 (e.g. zipf:1.0)"
        )),
    }
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("expected a fraction between 0 and 1, got `{s}`")),
    }
}

/// One variant's measurements.
#[derive(Debug)]
struct Row {
    variant: VariantName,
    checks: u64,
    wall: Duration,
    threads: usize,
    latency: Histogram<u64>,
    allowed: u64,
    /// CAS retries, where they are counted.
    retries: Option<u64>,
}

impl Row {
    fn mops(&self) -> f64 {
        self.checks as f64 / self.wall.as_secs_f64() / 1e6
    }

    fn ns_per_op(&self) -> f64 {
        self.wall.as_nanos() as f64 * self.threads as f64 / self.checks as f64
    }

    fn retries_per_op(&self) -> Option<f64> {
        self.retries.map(|r| r as f64 / self.checks as f64)
    }

    fn allowed_pct(&self) -> f64 {
        100.0 * self.allowed as f64 / self.checks as f64
    }
}

/// What one thread measured.
struct ThreadResult {
    start: Instant,
    end: Instant,
    latency: Histogram<u64>,
    allowed: u64,
}

/// The timed loop, shared by every variant: each thread checks its own key sequence, all
/// threads released together by a barrier; every check is timed into a per-thread histogram.
/// `check` returns whether the request was allowed.
fn drive(
    streams: &[Vec<u32>],
    check: impl Fn(u64) -> bool + Sync,
) -> (Duration, Histogram<u64>, u64) {
    let barrier = Barrier::new(streams.len());
    let results: Vec<ThreadResult> = std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter()
            .map(|keys| {
                let (barrier, check) = (&barrier, &check);
                s.spawn(move || {
                    let mut latency = Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_NS, 3)
                        .expect("valid histogram bounds");
                    let mut allowed = 0u64;
                    barrier.wait();
                    let start = Instant::now();
                    for &key in keys {
                        let key = u64::from(key);
                        let t0 = Instant::now();
                        let ok = check(key);
                        let t1 = Instant::now();
                        allowed += u64::from(ok);
                        latency.saturating_record((t1 - t0).as_nanos() as u64);
                    }
                    let end = Instant::now();
                    ThreadResult {
                        start,
                        end,
                        latency,
                        allowed,
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect()
    });
    let start = results
        .iter()
        .map(|r| r.start)
        .min()
        .expect("at least one thread");
    let end = results
        .iter()
        .map(|r| r.end)
        .max()
        .expect("at least one thread");
    let mut latency =
        Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid bounds");
    let mut allowed = 0;
    for r in &results {
        latency.add(&r.latency).expect("same bounds");
        allowed += r.allowed;
    }
    (end - start, latency, allowed)
}

/// Runs one hotlimit limiter through [`drive`].
fn run_hotlimit<L: RateLimiter<u64>>(
    variant: VariantName,
    limiter: &L,
    streams: &[Vec<u32>],
    retries: impl FnOnce(&L) -> Option<u64>,
) -> Row {
    let (wall, latency, allowed) = drive(streams, |key| limiter.check(&key).is_allowed());
    Row {
        variant,
        checks: streams.iter().map(|s| s.len() as u64).sum(),
        wall,
        threads: streams.len(),
        latency,
        allowed,
        retries: retries(limiter),
    }
}

/// Runs `variant` (a fresh, empty limiter) on the streams.
fn run_variant<A: Algorithm + Copy, C: Clock + Clone>(
    algo: A,
    variant: VariantName,
    store: Store,
    keys: u64,
    streams: &[Vec<u32>],
    clocks: &Clocks<C>,
) -> Row
where
    Cas: Variant<A> + CompactVariant<A>,
    Locked: Variant<A> + CompactVariant<A>,
{
    // A table for exactly `keys` keys (at its design load of 3/4).
    let max_keys = usize::try_from(keys).unwrap_or(usize::MAX);
    let clock = || clocks.hotlimit.clone();
    match (variant, store) {
        (VariantName::Cas, Store::Compact) => {
            let limiter = CompactLimiter::<u64, A, QuantaClock, Cas>::builder(algo)
                .max_keys(max_keys)
                .clock(clock())
                .build()
                .expect("no sweeper thread to spawn");
            run_hotlimit(variant, &limiter, streams, |l| {
                Some(l.metrics().cas_retries)
            })
        }
        (VariantName::Mutex, Store::Compact) => {
            let limiter = CompactLimiter::<u64, A, QuantaClock, Locked>::builder(algo)
                .max_keys(max_keys)
                .clock(clock())
                .build()
                .expect("no sweeper thread to spawn");
            run_hotlimit(variant, &limiter, streams, |_| None)
        }
        (VariantName::Cas, _) => {
            let limiter = CasLimiter::<u64, A>::with_clock(algo, clock());
            run_hotlimit(variant, &limiter, streams, |l| {
                Some(l.metrics().cas_retries)
            })
        }
        (VariantName::Mutex, _) => {
            let limiter = MutexLimiter::<u64, A>::with_clock(algo, clock());
            run_hotlimit(variant, &limiter, streams, |_| None)
        }
        (VariantName::ShardedMutex, _) => {
            let limiter = ShardedLimiter::<u64, A, C>::with_clock(algo, clock());
            run_hotlimit(variant, &limiter, streams, |_| None)
        }
        (VariantName::Governor, _) => {
            let per_second = NonZeroU32::new(GCRA_PER_SECOND).expect("nonzero");
            let burst = NonZeroU32::new(GCRA_BURST).expect("nonzero");
            let quota = Quota::per_second(per_second).allow_burst(burst);
            let (wall, latency, allowed) = match &clocks.governor_upkeep {
                Some(upkeep) => {
                    let limiter = governor::RateLimiter::dashmap_with_clock(quota, upkeep.clone());
                    drive(streams, |key| limiter.check_key(&key).is_ok())
                }
                None => {
                    let limiter = governor::RateLimiter::keyed(quota);
                    drive(streams, |key| limiter.check_key(&key).is_ok())
                }
            };
            Row {
                variant,
                checks: streams.iter().map(|s| s.len() as u64).sum(),
                wall,
                threads: streams.len(),
                latency,
                allowed,
                retries: None,
            }
        }
    }
}

/// Runs every variant in turn, with a progress line on `stderr`.
fn run_all<A: Algorithm + Copy>(
    algo: A,
    args: &Args,
    variants: &[VariantName],
    streams: &[Vec<u32>],
    stderr: &mut dyn Write,
) -> Vec<Row>
where
    Cas: Variant<A> + CompactVariant<A>,
    Locked: Variant<A> + CompactVariant<A>,
{
    match args.clock {
        ClockKind::Exact => {
            let clocks = Clocks {
                hotlimit: QuantaClock::new(),
                governor_upkeep: None,
            };
            run_each(algo, args, variants, streams, &clocks, stderr)
        }
        ClockKind::Coarse => {
            let clocks = Clocks {
                hotlimit: CoarseClock::new(Duration::from_millis(1)),
                // quanta's one upkeep thread per process: started here, once.
                governor_upkeep: variants.contains(&VariantName::Governor).then(|| {
                    governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                        .expect("no other quanta upkeep thread in this process")
                }),
            };
            run_each(algo, args, variants, streams, &clocks, stderr)
        }
    }
}

fn run_each<A: Algorithm + Copy, C: Clock + Clone>(
    algo: A,
    args: &Args,
    variants: &[VariantName],
    streams: &[Vec<u32>],
    clocks: &Clocks<C>,
    stderr: &mut dyn Write,
) -> Vec<Row>
where
    Cas: Variant<A> + CompactVariant<A>,
    Locked: Variant<A> + CompactVariant<A>,
{
    let mut rows = Vec::new();
    for (i, &variant) in variants.iter().enumerate() {
        progress(
            stderr,
            &format!(
                "running {} ({}/{})...",
                variant.name(),
                i + 1,
                variants.len()
            ),
        );
        rows.push(run_variant(
            algo, variant, args.store, args.keys, streams, clocks,
        ));
    }
    rows
}

/// Rewrites the progress line on `stderr`.
fn progress(stderr: &mut dyn Write, message: &str) {
    let _ = write!(stderr, "\r{message:<40}");
    let _ = stderr.flush();
}

/// The per-thread key sequences, generated in parallel, each thread from its own seed.
/// Keys fit a `u32` (`--keys` is at most `u32::MAX`), halving the streams' memory.
fn generate(args: &Args, threads: usize, requests: u64) -> Result<Vec<Vec<u32>>, String> {
    let keys = args.keys;
    let abusive = ABUSIVE_KEYS.min(keys);
    let zipf = match args.dist {
        Dist::Uniform => None,
        Dist::Zipf(s) => Some(Zipf::new(keys as f64, s).map_err(|e| format!("--dist: {e}"))?),
    };
    let len = usize::try_from(requests).map_err(|_| "--requests: too large".to_string())?;
    Ok(std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|t| {
                let zipf = &zipf;
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(args.seed.wrapping_add(t));
                    (0..len)
                        .map(|_| {
                            let key = if args.abusive > 0.0 && rng.random_bool(args.abusive) {
                                keys - 1 - rng.random_range(0..abusive)
                            } else {
                                match zipf {
                                    // Ranks 1..=keys; rank r is key r - 1.
                                    Some(z) => (z.sample(&mut rng) as u64).clamp(1, keys) - 1,
                                    None => rng.random_range(0..keys),
                                }
                            };
                            key as u32
                        })
                        .collect::<Vec<u32>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("generator thread panicked"))
            .collect()
    }))
}

/// Why the load test did not run.
#[derive(Debug)]
pub enum Error {
    /// The command line was refused, or asked for `--help` or `--version`: clap's error, which
    /// `exit()` prints (to stdout for the help) and exits with.
    Usage(clap::Error),
    /// The run could not be made (a parameter the algorithm refuses, `--variants` with nothing
    /// left, ...).
    Run(String),
}

impl Error {
    /// The process's exit code for this error: clap's for the command line, 2 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(e) => u8::try_from(e.exit_code()).unwrap_or(2),
            Error::Run(_) => 2,
        }
    }
}

impl fmt::Display for Error {
    /// What goes on stderr: clap's message, or `loadtest: <message>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(e) => write!(f, "{e}"),
            Error::Run(message) => write!(f, "loadtest: {message}"),
        }
    }
}

/// Parses a command line, the program's name first (as `std::env::args_os()` gives it).
pub fn parse<I, T>(argv: I) -> Result<Args, Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    Args::try_parse_from(argv).map_err(Error::Usage)
}

/// Runs the load test: the progress line and notes go to `stderr`; returns what goes to
/// stdout, the table or (with `--json`) the JSON array and a newline.
pub fn run(args: &Args, stderr: &mut dyn Write) -> Result<String, Error> {
    measure(args, stderr).map_err(Error::Run)
}

fn measure(args: &Args, stderr: &mut dyn Write) -> Result<String, String> {
    let threads = match args.threads {
        Some(n) => n as usize,
        None => std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .max(2),
    };
    let mut variants: Vec<VariantName> = Vec::new();
    for &v in &args.variants {
        if v == VariantName::Governor && args.algo != Algo::Gcra {
            let _ = writeln!(
                stderr,
                "loadtest: note: skipping governor, which implements GCRA only (--algo {})",
                args.algo.name()
            );
            continue;
        }
        if !variants.contains(&v) {
            variants.push(v);
        }
    }
    if variants.is_empty() {
        return Err("--variants: nothing left to run".into());
    }

    let started = Instant::now();
    progress(stderr, "generating keys...");
    let requests = args
        .requests
        .unwrap_or_else(|| (DEFAULT_TOTAL_REQUESTS / threads as u64).max(DEFAULT_MIN_REQUESTS));
    let streams = generate(args, threads, requests)?;
    let config = |e: hotlimit::ConfigError| format!("--algo {}: {e}", args.algo.name());
    let second = Duration::from_secs(1);
    let rows = match args.algo {
        Algo::Gcra => {
            let gcra = Gcra::new(Rate::per_second_of(GCRA_PER_SECOND.into()).map_err(config)?)
                .and_then(|g| g.with_burst(GCRA_BURST.into()))
                .map_err(config)?;
            run_all(gcra, args, &variants, &streams, stderr)
        }
        Algo::Earrrl => {
            let limit = Rate::per_second_of(1000.0).map_err(config)?;
            run_all(
                Earrrl::new(second, limit).map_err(config)?,
                args,
                &variants,
                &streams,
                stderr,
            )
        }
        Algo::Exponential => run_all(
            Exponential::new(1000.0, second).map_err(config)?,
            args,
            &variants,
            &streams,
            stderr,
        ),
        Algo::FixedWindow => run_all(
            FixedWindow::new(1000, second).map_err(config)?,
            args,
            &variants,
            &streams,
            stderr,
        ),
        Algo::SlidingWindow => run_all(
            SlidingWindow::new(1000, second).map_err(config)?,
            args,
            &variants,
            &streams,
            stderr,
        ),
        Algo::SlidingLog => run_all(
            SlidingLog::new(100, Duration::from_millis(100)).map_err(config)?,
            args,
            &variants,
            &streams,
            stderr,
        ),
        Algo::SubWindow => run_all(
            SubWindow::new(1000, second, DEFAULT_BUCKETS).map_err(config)?,
            args,
            &variants,
            &streams,
            stderr,
        ),
    };
    progress(
        stderr,
        &format!(
            "ran {} variant(s) in {:.1} s",
            rows.len(),
            started.elapsed().as_secs_f64()
        ),
    );
    let _ = writeln!(stderr);

    Ok(if args.json {
        format!("{}\n", json(args, threads, &rows))
    } else {
        table(args, threads, requests, &rows)
    })
}
