//! The load-test engine: the command line, the generated key streams, the timed runs and the
//! output. No printing to stdout and no exit codes, so `tests/loadtest.rs` includes this file
//! and runs it in process; `main.rs` is the command-line wrapper (see its docs for the options
//! and the output).

/// The sharded `Mutex<HashMap>` baseline, shared with the benches.
#[path = "../../benches/common/sharded.rs"]
#[allow(dead_code)] // the load test uses a part
mod sharded;
use clap::{Parser, ValueEnum};
use governor::Quota;
use hdrhistogram::Histogram;
use hotlimit::algo::{
    Algorithm, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
    DEFAULT_BUCKETS,
};
use hotlimit::store::{Cas, Locked};
use hotlimit::{
    CasLimiter, Clock, CoarseClock, CompactLimiter, Decision, MutexLimiter, QuantaClock, Rate,
};
use rand::distr::Distribution;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::Zipf;
use sharded::ShardedLimiter;
use std::ffi::OsString;
use std::fmt;
use std::hint::black_box;
use std::io::Write;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

// The table and the JSON output: beside this file, named by path so that `tests/loadtest.rs`,
// which loads this file by path too, finds it.
#[path = "report.rs"]
mod report;
use hotlimit::RateLimiter;
use report::Report;

/// How many abusive keys share the `--abusive` part of the traffic (fewer if there are fewer
/// keys).
const ABUSIVE_KEYS: u64 = 8;

/// GCRA's quota, shared with governor so the two compare like for like.
const GCRA_PER_SECOND: u32 = 1000;
const GCRA_BURST: u32 = 100;

/// Latencies above this (10 s) are recorded as this.
const MAX_LATENCY_NS: u64 = 10_000_000_000;

/// The default total of checks per variant and round, split over the threads: about a
/// second per variant and round on 2 cores.
const DEFAULT_TOTAL_REQUESTS: u64 = 40_000_000;
const DEFAULT_MIN_REQUESTS: u64 = 1_000_000;

/// The latency pass's default length: this fraction (1/10) of `--requests`.
const LATENCY_SHARE: u64 = 10;

/// Empty timed pairs (`Instant::now()` twice) measured for the timer's own overhead.
const TIMER_PAIRS: usize = 100_000;

/// `--admit-all`: the criterion benches' GCRA quota (`benches/common`), one request per ns
/// with a burst of 2^40, which no run exhausts, so every check takes the write path.
const ADMIT_ALL_GCRA: &str = "1000000000/s burst 1099511627776";

/// Runs a keyed-limiter load test: the same pre-generated request stream through hotlimit's
/// CAS limiter, its mutex twin, a sharded Mutex<HashMap> and governor, in rounds that
/// interleave the variants, and prints throughput, latency percentiles, CAS retries and the
/// share allowed.
///
/// Keys are 0..keys, key r-1 having popularity rank r. The abusive keys are the last
/// min(8, keys) keys (the least popular ranks). Every round runs every variant once, on a
/// fresh limiter, replaying exactly the same per-thread key sequences (generated before
/// timing); round r starts at the r-th variant of --variants, so none always goes first.
///
/// Throughput pass: no per-check timer; each thread reads the clock once before and once
/// after its whole sequence. Latency pass: right after each throughput pass, on the same
/// (now warm) limiter, the first --latency-requests checks of each sequence again, every
/// check timed with Instant, so each value includes the timer's own cost (printed).
///
/// Columns: Mops/s = checks / wall s / 1e6 and ns/op = wall ns x threads / checks, each the
/// median over rounds with its min-max range; p50/p99/p99.9 = latency pass, all rounds and
/// threads merged; retries/op = CAS retries per check in the throughput passes (hotlimit CAS
/// only; 0 in JSON for the others); allowed % = share of the throughput passes' checks
/// allowed; vs CAS = throughput / hotlimit CAS's in the same round, median and range.
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

    /// Checks per thread in each throughput pass [default: 40,000,000 / threads, at least
    /// 1,000,000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    requests: Option<u64>,

    /// Rounds: each runs every variant once, on a fresh limiter, in an order rotated by one
    /// each round.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,

    /// Checks per thread in each latency pass, every one timed (0: no latency pass)
    /// [default: --requests / 10].
    #[arg(long)]
    latency_requests: Option<u64>,

    /// GCRA only: the criterion benches' quotas instead of 1000/s burst 100 (hotlimit 1/ns
    /// burst 2^40, governor u32::MAX/s with an equal burst): every check is allowed and
    /// writes.
    #[arg(long)]
    admit_all: bool,

    /// Check every key (0..keys) once on each fresh limiter before its throughput pass,
    /// untimed and uncounted, as the criterion benches do, so no first-sight insert is timed.
    #[arg(long)]
    prefill: bool,

    /// Comma-separated limiters to run, in this order in the first round, rotated by one each
    /// round after (governor only with --algo gcra).
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

    /// hotlimit's cas and mutex variants (either store) decide their throughput pass in
    /// slices of this many checks through `check_batch` (1: one `check` per key). The latency
    /// pass still times single checks.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=4096))]
    batch: u16,

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
    /// hotlimit's papaya-based CasLimiter (any key, grows)
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

/// A median with the range it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spread {
    /// The middle value, or the mean of the middle two.
    median: f64,
    /// The smallest value.
    min: f64,
    /// The largest value.
    max: f64,
}

impl Spread {
    /// The median (the mean of the middle two for an even count), minimum and maximum of
    /// `values`, which must not be empty.
    fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = values.into_iter().collect();
        assert!(!v.is_empty(), "a spread of no values");
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// One variant's run in one round: a fresh limiter, its throughput pass, then its latency
/// pass.
#[derive(Debug)]
struct Run {
    /// Which limiter ran.
    variant: VariantName,
    /// The round, from 1.
    round: usize,
    /// Where the variant ran in its round, from 1.
    position: usize,
    /// Checks in the throughput pass, all threads.
    checks: u64,
    /// Threads, one key sequence each.
    threads: usize,
    /// The throughput pass's wall time: from the first thread's start to the last one's end.
    wall: Duration,
    /// Checks allowed in the throughput pass.
    allowed: u64,
    /// CAS retries in the throughput pass, where they are counted.
    retries: Option<u64>,
    /// The latency pass's timed checks, all threads (empty without a latency pass).
    latency: Histogram<u64>,
}

impl Run {
    /// Millions of checks per second, all threads.
    fn mops(&self) -> f64 {
        self.checks as f64 / self.wall.as_secs_f64() / 1e6
    }

    /// What one check cost one thread: wall ns × threads / checks.
    fn ns_per_op(&self) -> f64 {
        self.wall.as_nanos() as f64 * self.threads as f64 / self.checks as f64
    }
}

/// One variant's runs over every round, summarized.
#[derive(Debug)]
struct Row {
    /// Which limiter ran.
    variant: VariantName,
    /// One run per round, in round order.
    runs: Vec<Run>,
    /// Per round (same order): throughput ÷ hotlimit CAS's in that round, if CAS ran.
    vs_cas: Option<Vec<f64>>,
    /// Every round's latency pass merged.
    latency: Histogram<u64>,
}

impl Row {
    /// Gathers `variant`'s runs out of `runs` (all variants, all rounds), with their ratio to
    /// the CAS run of the same round.
    fn gather(variant: VariantName, runs: &mut Vec<Run>) -> Row {
        let (mut mine, rest): (Vec<Run>, Vec<Run>) =
            runs.drain(..).partition(|r| r.variant == variant);
        *runs = rest;
        mine.sort_by_key(|r| r.round);
        let mut latency = histogram();
        for r in &mine {
            latency.add(&r.latency).expect("same bounds");
        }
        Row {
            variant,
            runs: mine,
            vs_cas: None,
            latency,
        }
    }

    /// Mops/s over the rounds.
    fn mops(&self) -> Spread {
        Spread::of(self.runs.iter().map(Run::mops))
    }

    /// ns/op over the rounds.
    fn ns_per_op(&self) -> Spread {
        Spread::of(self.runs.iter().map(Run::ns_per_op))
    }

    /// The ratio to hotlimit CAS over the rounds, if CAS ran.
    fn vs_cas(&self) -> Option<Spread> {
        self.vs_cas.as_ref().map(|v| Spread::of(v.iter().copied()))
    }

    /// Checks in every round's throughput pass.
    fn checks(&self) -> u64 {
        self.runs.iter().map(|r| r.checks).sum()
    }

    /// CAS retries per check in the throughput passes, where they are counted.
    fn retries_per_op(&self) -> Option<f64> {
        let retries: Option<u64> = self.runs.iter().map(|r| r.retries).sum();
        retries.map(|r| r as f64 / self.checks() as f64)
    }

    /// The share of the throughput passes' checks allowed, in percent.
    fn allowed_pct(&self) -> f64 {
        let allowed: u64 = self.runs.iter().map(|r| r.allowed).sum();
        100.0 * allowed as f64 / self.checks() as f64
    }

    /// The latency at `quantile`, `None` without a latency pass.
    fn latency_at(&self, quantile: f64) -> Option<u64> {
        (!self.latency.is_empty()).then(|| self.latency.value_at_quantile(quantile))
    }
}

/// Summarizes the runs (in the order they ran) into one row per variant, in `variants`'
/// order, each with its per-round ratio to hotlimit CAS.
fn rows(variants: &[VariantName], mut runs: Vec<Run>) -> Vec<Row> {
    let mut rows: Vec<Row> = variants
        .iter()
        .map(|&v| Row::gather(v, &mut runs))
        .collect();
    let cas: Option<Vec<f64>> = rows
        .iter()
        .find(|r| r.variant == VariantName::Cas)
        .map(|r| r.runs.iter().map(Run::mops).collect());
    if let Some(cas) = cas {
        for row in &mut rows {
            row.vs_cas = Some(
                row.runs
                    .iter()
                    .zip(&cas)
                    .map(|(r, c)| r.mops() / c)
                    .collect(),
            );
        }
    }
    rows
}

/// An empty latency histogram (1 ns to 10 s, 3 significant digits).
fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds")
}

/// What the timer alone adds to each latency value: `TIMER_PAIRS` empty timed pairs (two
/// `Instant::now()` calls, nothing between), recorded as the latency pass records a check.
fn timer_overhead() -> Histogram<u64> {
    let mut h = histogram();
    for _ in 0..TIMER_PAIRS {
        let t0 = Instant::now();
        let t1 = Instant::now();
        h.saturating_record((t1 - t0).as_nanos() as u64);
    }
    h
}

/// Runs `work` on one thread per stream, all released together by a barrier; returns each
/// thread's result in stream order.
fn on_threads<T: Send>(streams: &[Vec<u32>], work: impl Fn(&[u32]) -> T + Sync) -> Vec<T> {
    let barrier = Barrier::new(streams.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter()
            .map(|keys| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    work(keys)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect()
    })
}

/// The throughput pass: each thread checks its whole key sequence in a tight loop with no
/// timer inside it (the clock is read once before and once after); `check` returns whether
/// the request was allowed (having passed the whole decision through `black_box`, see
/// [`run_variant`]). Returns the wall time from the first thread's start to the last
/// thread's end, and the checks allowed.
fn throughput(streams: &[Vec<u32>], check: &(impl Fn(u64) -> bool + Sync)) -> (Duration, u64) {
    let results = on_threads(streams, |keys| {
        let start = Instant::now();
        let mut allowed = 0u64;
        for &key in keys {
            allowed += u64::from(check(u64::from(key)));
        }
        (start, Instant::now(), allowed)
    });
    let start = results.iter().map(|r| r.0).min().expect("a thread");
    let end = results.iter().map(|r| r.1).max().expect("a thread");
    (end - start, results.iter().map(|r| r.2).sum())
}

/// A store's `check_batch`, for the throughput pass of `--batch`.
type Batch<'a> = &'a (dyn Fn(&[u64], &mut Vec<Decision>) + Sync);

/// The throughput pass in slices of `n` keys through `batch`: as [`throughput`], one call per
/// slice (the slice widened to `u64` keys in a reused buffer, as a caller holding `u32` ids
/// would).
fn throughput_batched(streams: &[Vec<u32>], n: usize, batch: Batch) -> (Duration, u64) {
    let results = on_threads(streams, |keys| {
        let (mut slice, mut out) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let start = Instant::now();
        let mut allowed = 0u64;
        for chunk in keys.chunks(n) {
            slice.clear();
            slice.extend(chunk.iter().map(|&k| u64::from(k)));
            batch(&slice, &mut out);
            allowed += black_box(&out).iter().filter(|d| d.is_allowed()).count() as u64;
        }
        (start, Instant::now(), allowed)
    });
    let start = results.iter().map(|r| r.0).min().expect("a thread");
    let end = results.iter().map(|r| r.1).max().expect("a thread");
    (end - start, results.iter().map(|r| r.2).sum())
}

/// The latency pass: each thread checks the first `len` keys of its sequence, every check
/// timed with two `Instant::now()` calls, so each value includes the timer's own cost.
fn latency(
    streams: &[Vec<u32>],
    len: usize,
    check: &(impl Fn(u64) -> bool + Sync),
) -> Histogram<u64> {
    let results = on_threads(streams, |keys| {
        let mut h = histogram();
        for &key in &keys[..len.min(keys.len())] {
            let t0 = Instant::now();
            let ok = check(u64::from(key));
            let t1 = Instant::now();
            black_box(ok);
            h.saturating_record((t1 - t0).as_nanos() as u64);
        }
        h
    });
    let mut merged = histogram();
    for h in &results {
        merged.add(h).expect("same bounds");
    }
    merged
}

/// What one round runs: the streams, the passes' settings, the clocks.
struct Setup<'a, C> {
    /// The command line.
    args: &'a Args,
    /// One key sequence per thread.
    streams: &'a [Vec<u32>],
    /// Checks per thread in each latency pass.
    latency_len: usize,
    /// The clocks every limiter of the run reads.
    clocks: &'a Clocks<C>,
    /// governor's quota: GCRA's default, or the benches' with `--admit-all`.
    governor_quota: Quota,
}

impl<C> Setup<'_, C> {
    /// The passes on one fresh limiter, reached through `check`: the prefill (if asked), the
    /// throughput pass, then the latency pass. `retries` reads the limiter's CAS retries so
    /// far, where it counts them: the throughput pass's are the difference across it.
    fn passes(
        &self,
        variant: VariantName,
        check: impl Fn(u64) -> bool + Sync,
        retries: impl Fn() -> Option<u64>,
    ) -> Run {
        self.passes_batched(variant, check, None, retries)
    }

    /// [`passes`](Setup::passes) with the throughput pass through `batch` in slices of
    /// `--batch` keys, where the store has one and `--batch` is above 1.
    fn passes_batched(
        &self,
        variant: VariantName,
        check: impl Fn(u64) -> bool + Sync,
        batch: Option<Batch>,
        retries: impl Fn() -> Option<u64>,
    ) -> Run {
        if self.args.prefill {
            for key in 0..self.args.keys {
                check(key);
            }
        }
        let before = retries();
        let n = usize::from(self.args.batch);
        let (wall, allowed) = match batch.filter(|_| n > 1) {
            Some(batch) => throughput_batched(self.streams, n, batch),
            None => throughput(self.streams, &check),
        };
        let retries = retries().zip(before).map(|(after, before)| after - before);
        let latency = latency(self.streams, self.latency_len, &check);
        Run {
            variant,
            round: 0,
            position: 0,
            checks: self.streams.iter().map(|s| s.len() as u64).sum(),
            threads: self.streams.len(),
            wall,
            allowed,
            retries,
            latency,
        }
    }
}

/// Runs `variant` on a fresh, empty limiter.
///
/// Each check passes its whole decision through `black_box`, as the criterion benches do:
/// a caller reads `retry_after` or `remaining` too, and with only `is_allowed()` in sight
/// the compiler drops their arithmetic (measured: 22.0 against 25.3 ns a check at one key,
/// 31.5 against 34.9 at 10k keys, one thread; governor's `Result` unchanged).
fn run_variant<A: Algorithm + Copy, C: Clock + Clone>(
    algo: A,
    variant: VariantName,
    setup: &Setup<'_, C>,
) -> Run {
    // A table for exactly `keys` keys (at its design load of 3/4).
    let max_keys = usize::try_from(setup.args.keys).unwrap_or(usize::MAX);
    let clock = || setup.clocks.hotlimit.clone();
    match (variant, setup.args.store) {
        (VariantName::Cas, Store::Compact) => {
            let limiter = CompactLimiter::<u64, A, QuantaClock, Cas>::builder(algo)
                .max_keys(max_keys)
                .clock(clock())
                .build()
                .expect("no sweeper thread to spawn");
            setup.passes_batched(
                variant,
                |key| black_box(limiter.check(&key)).is_allowed(),
                Some(&|keys, out| limiter.check_batch(keys, out)),
                || Some(limiter.metrics().cas_retries),
            )
        }
        (VariantName::Mutex, Store::Compact) => {
            let limiter = CompactLimiter::<u64, A, QuantaClock, Locked>::builder(algo)
                .max_keys(max_keys)
                .clock(clock())
                .build()
                .expect("no sweeper thread to spawn");
            setup.passes_batched(
                variant,
                |key| black_box(limiter.check(&key)).is_allowed(),
                Some(&|keys, out| limiter.check_batch(keys, out)),
                || None,
            )
        }
        (VariantName::Cas, _) => {
            let limiter = CasLimiter::<u64, A, _>::with_clock(algo, clock());
            setup.passes_batched(
                variant,
                |key| black_box(limiter.check(&key)).is_allowed(),
                Some(&|keys, out| limiter.check_batch(keys, out)),
                || Some(limiter.metrics().cas_retries),
            )
        }
        (VariantName::Mutex, _) => {
            let limiter = MutexLimiter::<u64, A, _>::with_clock(algo, clock());
            setup.passes_batched(
                variant,
                |key| black_box(limiter.check(&key)).is_allowed(),
                Some(&|keys, out| limiter.check_batch(keys, out)),
                || None,
            )
        }
        (VariantName::ShardedMutex, _) => {
            let limiter = ShardedLimiter::<u64, A, C>::with_clock(algo, clock());
            setup.passes(
                variant,
                |key| black_box(limiter.check(&key)).is_allowed(),
                || None,
            )
        }
        (VariantName::Governor, _) => {
            let quota = setup.governor_quota;
            match &setup.clocks.governor_upkeep {
                Some(upkeep) => {
                    let limiter = governor::RateLimiter::dashmap_with_clock(quota, upkeep.clone());
                    setup.passes(
                        variant,
                        |key| black_box(limiter.check_key(&key)).is_ok(),
                        || None,
                    )
                }
                None => {
                    let limiter = governor::RateLimiter::keyed(quota);
                    setup.passes(
                        variant,
                        |key| black_box(limiter.check_key(&key)).is_ok(),
                        || None,
                    )
                }
            }
        }
    }
}

/// Runs every round on the clocks `--clock` asks for; returns the runs in the order they ran.
fn run_all<A: Algorithm + Copy>(
    algo: A,
    args: &Args,
    variants: &[VariantName],
    streams: &[Vec<u32>],
    latency_len: usize,
    stderr: &mut dyn Write,
) -> Vec<Run> {
    let governor_quota = if args.admit_all {
        Quota::per_second(NonZeroU32::MAX).allow_burst(NonZeroU32::MAX)
    } else {
        let per_second = NonZeroU32::new(GCRA_PER_SECOND).expect("nonzero");
        let burst = NonZeroU32::new(GCRA_BURST).expect("nonzero");
        Quota::per_second(per_second).allow_burst(burst)
    };
    match args.clock {
        ClockKind::Exact => {
            let clocks = Clocks {
                hotlimit: QuantaClock::default(),
                governor_upkeep: None,
            };
            let setup = Setup {
                args,
                streams,
                latency_len,
                clocks: &clocks,
                governor_quota,
            };
            run_rounds(algo, variants, &setup, stderr)
        }
        ClockKind::Coarse => {
            let clocks = Clocks {
                hotlimit: CoarseClock::new(Duration::from_millis(1))
                    .expect("starting the coarse clock"),
                // quanta's one upkeep thread per process: started here, once.
                governor_upkeep: variants.contains(&VariantName::Governor).then(|| {
                    governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                        .expect("no other quanta upkeep thread in this process")
                }),
            };
            let setup = Setup {
                args,
                streams,
                latency_len,
                clocks: &clocks,
                governor_quota,
            };
            run_rounds(algo, variants, &setup, stderr)
        }
    }
}

/// The order of round `round` (from 0): `variants` rotated left by `round`, so that over
/// `variants.len()` rounds each variant goes first once and runs once in every position.
fn round_order(variants: &[VariantName], round: usize) -> Vec<VariantName> {
    let mut order = variants.to_vec();
    order.rotate_left(round % variants.len());
    order
}

/// Runs `--rounds` rounds, each every variant once in [`round_order`], with a progress line
/// on `stderr`.
fn run_rounds<A: Algorithm + Copy, C: Clock + Clone>(
    algo: A,
    variants: &[VariantName],
    setup: &Setup<'_, C>,
    stderr: &mut dyn Write,
) -> Vec<Run> {
    let rounds = setup.args.rounds as usize;
    let mut runs = Vec::new();
    for round in 0..rounds {
        for (i, &variant) in round_order(variants, round).iter().enumerate() {
            progress(
                stderr,
                &format!(
                    "round {}/{rounds}: {} ({}/{})...",
                    round + 1,
                    variant.name(),
                    i + 1,
                    variants.len()
                ),
            );
            let mut run = run_variant(algo, variant, setup);
            (run.round, run.position) = (round + 1, i + 1);
            runs.push(run);
        }
    }
    runs
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

/// [`run`] with its errors as messages.
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

    if args.admit_all && args.algo != Algo::Gcra {
        return Err(format!(
            "--admit-all: the criterion benches' quota is GCRA's (--algo gcra), not --algo {}",
            args.algo.name()
        ));
    }

    let started = Instant::now();
    progress(stderr, "generating keys...");
    let requests = args
        .requests
        .unwrap_or_else(|| (DEFAULT_TOTAL_REQUESTS / threads as u64).max(DEFAULT_MIN_REQUESTS));
    let latency_requests = args
        .latency_requests
        .unwrap_or(requests / LATENCY_SHARE)
        .min(requests);
    let latency_len = usize::try_from(latency_requests)
        .map_err(|_| "--latency-requests: too large".to_string())?;
    let streams = generate(args, threads, requests)?;
    progress(stderr, "timing the timer...");
    let timer = timer_overhead();
    let config = |e: hotlimit::ConfigError| format!("--algo {}: {e}", args.algo.name());
    let second = Duration::from_secs(1);
    let runs = match args.algo {
        Algo::Gcra if args.admit_all => run_all(
            ADMIT_ALL_GCRA.parse::<Gcra>().map_err(config)?,
            args,
            &variants,
            &streams,
            latency_len,
            stderr,
        ),
        Algo::Gcra => {
            let gcra = Gcra::new(
                Rate::new(GCRA_PER_SECOND.into(), Duration::from_secs(1)).map_err(config)?,
            )
            .and_then(|g| g.with_burst(GCRA_BURST.into()))
            .map_err(config)?;
            run_all(gcra, args, &variants, &streams, latency_len, stderr)
        }
        Algo::Earrrl => {
            let limit = Rate::new(1000.0, Duration::from_secs(1)).map_err(config)?;
            run_all(
                Earrrl::new(second, limit).map_err(config)?,
                args,
                &variants,
                &streams,
                latency_len,
                stderr,
            )
        }
        Algo::Exponential => run_all(
            Exponential::new(1000.0, second).map_err(config)?,
            args,
            &variants,
            &streams,
            latency_len,
            stderr,
        ),
        Algo::FixedWindow => run_all(
            FixedWindow::new(1000, second).map_err(config)?,
            args,
            &variants,
            &streams,
            latency_len,
            stderr,
        ),
        Algo::SlidingWindow => run_all(
            SlidingWindow::new(1000, second).map_err(config)?,
            args,
            &variants,
            &streams,
            latency_len,
            stderr,
        ),
        Algo::SlidingLog => run_all(
            SlidingLog::new(100, Duration::from_millis(100)).map_err(config)?,
            args,
            &variants,
            &streams,
            latency_len,
            stderr,
        ),
        Algo::SubWindow => run_all(
            SubWindow::new(1000, second, DEFAULT_BUCKETS).map_err(config)?,
            args,
            &variants,
            &streams,
            latency_len,
            stderr,
        ),
    };
    progress(
        stderr,
        &format!(
            "ran {} round(s) of {} variant(s) in {:.1} s",
            args.rounds,
            variants.len(),
            started.elapsed().as_secs_f64()
        ),
    );
    let _ = writeln!(stderr);

    let report = Report {
        args,
        threads,
        requests,
        latency_requests,
        timer_ns: timer.value_at_quantile(0.5),
        rows: rows(&variants, runs),
    };
    Ok(if args.json {
        format!("{}\n", report.json())
    } else {
        report.table()
    })
}
