//! Replays a trace of timestamped requests through a hotlimit limiter on a manual clock and
//! prints every decision: a reproducible way to see what an algorithm and its settings do.
//!
//! # Usage
//!
//! ```text
//! cargo run --release --example replay -- --algo <ALGO> [ALGORITHM OPTIONS]
//!     [--policy leaky|strict] [--variant cas|mutex] [--store papaya|compact [--max-keys N]] < trace
//!
//! --algo gcra            --rate 10/s [--burst 5]
//! --algo earrrl          --half-life 10s --limit 0.5/s
//! --algo exponential     --limit 10 --period 60s
//! --algo fixed-window    --limit 3 --window 60s
//! --algo sliding-window  --limit 3 --window 60s [--bias strict|lenient]
//! --algo sliding-log     --limit 3 --window 60s
//! --algo sub-window      --limit 3 --window 60s [--buckets 60] [--bias strict|lenient]
//! ```
//!
//! For the window family `--limit` is a positive whole number (cost units per window) and
//! `--window` a duration. `--bias` is which way the sliding window counter and the sub-window
//! err (default `strict`: the weighted count compared as is, one extra bucket summed;
//! `lenient`: a fractional excess forgiven, one bucket fewer); `--buckets` is the sub-window's
//! bucket count (default 60).
//!
//! `--policy` overrides the algorithm's default policy; `--variant` picks the lock-free
//! `CasLimiter` (the default) or its `MutexLimiter` twin. `--store compact` keeps the keys in a
//! `CompactLimiter` instead of the papaya map (keys as 64-bit keyed hashes, `Hashed<str>`;
//! `--max-keys` sizes its table, default 65536); the decisions are the same. Options take their
//! value as the next argument or after `=` (`--rate=10/s`). For example:
//!
//! ```text
//! cargo run --release --example replay -- --algo gcra --rate 10/s --burst 5 < examples/traces/burst.trace
//! cargo run --release --example replay -- --algo fixed-window --limit 3 --window 60s < examples/traces/fixed-window.trace
//! ```
//!
//! # Input (stdin)
//!
//! One request per line: `<seconds since origin> <key> [cost]`, separated by whitespace.
//! The seconds are a plain decimal (`0`, `0.35`, `12.000000001`), read exactly to the
//! nanosecond (digits past the ninth decimal are dropped), and never decrease from one line to
//! the next. The cost is a whole number, 1 by default. Blank lines and lines whose first
//! non-blank character is `#` are skipped.
//!
//! # Output (stdout)
//!
//! One line per request: `allow` or `deny`, then `retry_after=<seconds>` (0 when allowed),
//! then `remaining=<n>` and `rate=<per second>` where the algorithm reports them:
//!
//! ```text
//! allow retry_after=0 remaining=4
//! deny retry_after=0.1 remaining=0
//! ```
//!
//! # Errors
//!
//! A bad command line, or a malformed input line (or a cost the limiter rejects), stops the
//! replay with a message on stderr (`--rate: ...`, `--window: ...`, `line 7: ...`) and exit
//! status 2; the decisions for the lines before it are still printed. An I/O error exits with status 1.

use hotlimit::algo::{
    Algorithm, Bias, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow, SubWindow,
    DEFAULT_BUCKETS,
};
use hotlimit::store::{Cas, Hashed, Locked, DEFAULT_MAX_KEYS};
use hotlimit::{
    CasLimiter, CompactLimiter, ConfigError, Decision, Field, ManualClock, MutexLimiter, Policy,
    QuantaClock, Rate, RateLimiter,
};
use std::fmt::Display;
use std::io::{self, BufRead, BufWriter, Write};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "\
Replays a trace of requests through a hotlimit limiter and prints each decision.

Usage: replay --algo <ALGO> [ALGORITHM OPTIONS] [--policy leaky|strict] [--variant cas|mutex]
              [--store papaya|compact [--max-keys <N>]] < trace

Algorithms:
  --algo gcra            --rate <RATE> [--burst <N>]
                         e.g. --rate 10/s --burst 5
  --algo earrrl          --half-life <DURATION> --limit <RATE>
                         e.g. --half-life 10s --limit 0.5/s
  --algo exponential     --limit <N> --period <DURATION>
                         e.g. --limit 10 --period 60s
  --algo fixed-window    --limit <N> --window <DURATION>
                         e.g. --limit 3 --window 60s
  --algo sliding-window  --limit <N> --window <DURATION> [--bias strict|lenient]
                         e.g. --limit 3 --window 60s --bias lenient   (default: strict)
  --algo sliding-log     --limit <N> --window <DURATION>
                         e.g. --limit 3 --window 60s
  --algo sub-window      --limit <N> --window <DURATION> [--buckets <K>] [--bias strict|lenient]
                         e.g. --limit 3 --window 60s --buckets 60 --bias strict
                         (default: 60 buckets, strict: one extra bucket summed)

Options:
  --policy leaky|strict  what a denied request does (default: the algorithm's own)
  --variant cas|mutex    lock-free CasLimiter (default) or MutexLimiter
  --store papaya|compact the papaya map (default) or the fixed-capacity compact table
                         (CompactLimiter, keys kept as 64-bit keyed hashes); same decisions
  --max-keys <N>         with --store compact: the keys its table is sized for (default 65536)
  --help                 print this help

Input: one request per line, `<seconds since origin> <key> [cost]`; times never decrease,
cost defaults to 1; blank lines and `#` comments are skipped.
Output: one line per request, e.g. `allow retry_after=0 remaining=4`, `deny retry_after=0.1 remaining=0`
(`remaining=` and `rate=` where the algorithm reports them).
";

/// Why the replay stopped: the message for stderr and the exit status.
#[derive(Debug)]
struct Fatal {
    message: String,
    code: u8,
}

impl Fatal {
    /// A bad command line or input line: exit status 2.
    fn usage(message: impl Display) -> Self {
        Self {
            message: message.to_string(),
            code: 2,
        }
    }

    /// A bad input line.
    fn line(number: usize, message: impl Display) -> Self {
        Self::usage(format!("line {number}: {message}"))
    }

    /// An I/O failure: exit status 1.
    fn io(what: &str, err: io::Error) -> Self {
        Self {
            message: format!("{what}: {err}"),
            code: 1,
        }
    }
}

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(fatal) => {
            eprintln!("replay: {}", fatal.message);
            ExitCode::from(fatal.code)
        }
    }
}

/// Parses the command line, builds the algorithm it names and replays stdin through it.
fn run(args: Vec<String>) -> Result<(), Fatal> {
    let Some(mut opts) = Options::parse(args)? else {
        print!("{USAGE}");
        return Ok(());
    };
    let algo = opts.required("--algo")?;
    let policy = opts.parsed("--policy", str::parse::<Policy>)?;
    let variant = opts
        .parsed("--variant", parse_variant)?
        .unwrap_or(Variant::Cas);
    let store = opts
        .parsed("--store", parse_store)?
        .unwrap_or(Store::Papaya);
    let max_keys = opts.parsed("--max-keys", |s: &str| match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("expected a positive whole number, got `{s}`")),
    })?;
    if max_keys.is_some() && store != Store::Compact {
        return Err(Fatal::usage("--max-keys: only with --store compact"));
    }
    let setup = Setup {
        policy,
        variant,
        store,
        max_keys: max_keys.unwrap_or(DEFAULT_MAX_KEYS),
        algo: &algo,
    };
    // One arm per algorithm: build it from its options, then hand it to the generic replay.
    match algo.as_str() {
        "gcra" => setup.replay(gcra(&mut opts)?, Gcra::with_policy, opts),
        "earrrl" => setup.replay(earrrl(&mut opts)?, Earrrl::with_policy, opts),
        "exponential" => setup.replay(exponential(&mut opts)?, Exponential::with_policy, opts),
        "fixed-window" => setup.replay(fixed_window(&mut opts)?, FixedWindow::with_policy, opts),
        "sliding-window" => {
            setup.replay(sliding_window(&mut opts)?, SlidingWindow::with_policy, opts)
        }
        "sliding-log" => setup.replay(sliding_log(&mut opts)?, SlidingLog::with_policy, opts),
        "sub-window" => setup.replay(sub_window(&mut opts)?, SubWindow::with_policy, opts),
        other => Err(Fatal::usage(format!(
            "--algo: unknown algorithm `{other}` (expected gcra, earrrl, exponential, \
             fixed-window, sliding-window, sliding-log or sub-window)"
        ))),
    }
}

/// `--algo gcra --rate <RATE> [--burst <N>]`.
fn gcra(opts: &mut Options) -> Result<Gcra, Fatal> {
    let rate = opts.required_parsed("--rate", str::parse::<Rate>)?;
    let burst = opts.parsed("--burst", parse_whole)?;
    let gcra = Gcra::new(rate).map_err(config_error)?;
    match burst {
        Some(b) => gcra.with_burst(b).map_err(config_error),
        None => Ok(gcra),
    }
}

/// `--algo earrrl --half-life <DURATION> --limit <RATE>`.
fn earrrl(opts: &mut Options) -> Result<Earrrl, Fatal> {
    let half_life = opts.required_parsed("--half-life", parse_duration)?;
    let limit = opts.required_parsed("--limit", str::parse::<Rate>)?;
    Earrrl::new(half_life, limit).map_err(config_error)
}

/// `--algo exponential --limit <N> --period <DURATION>`.
fn exponential(opts: &mut Options) -> Result<Exponential, Fatal> {
    let limit = opts.required_parsed("--limit", str::parse::<u64>)?;
    let period = opts.required_parsed("--period", parse_duration)?;
    Exponential::new(limit as f64, period).map_err(config_error)
}

/// `--limit <N> --window <DURATION>`, shared by the window family.
fn limit_and_window(opts: &mut Options) -> Result<(u64, Duration), Fatal> {
    let limit = opts.required_parsed("--limit", parse_whole)?;
    let window = opts.required_parsed("--window", parse_duration)?;
    Ok((limit, window))
}

/// A duration with a unit (`250ms`, `1.5h`): the period of the rate `1/<DURATION>`, the one
/// duration syntax the library reads.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let refused = || format!("'{s}' is not a duration (a number and a unit: 250ms, 10s, 1.5h)");
    if !s
        .trim_start()
        .starts_with(|c: char| c.is_ascii_digit() || c == '.')
    {
        return Err(refused()); // `1/s` is a rate, but `s` alone is no duration
    }
    format!("1/{s}")
        .parse::<Rate>()
        .map(|r| r.period())
        .map_err(|_| refused())
}

/// `--algo fixed-window --limit <N> --window <DURATION>`.
fn fixed_window(opts: &mut Options) -> Result<FixedWindow, Fatal> {
    let (limit, window) = limit_and_window(opts)?;
    FixedWindow::new(limit, window).map_err(config_error)
}

/// `--algo sliding-window --limit <N> --window <DURATION> [--bias strict|lenient]`.
fn sliding_window(opts: &mut Options) -> Result<SlidingWindow, Fatal> {
    let (limit, window) = limit_and_window(opts)?;
    let bias = opts
        .parsed("--bias", str::parse::<Bias>)?
        .unwrap_or(Bias::Strict);
    SlidingWindow::new(limit, window)
        .map(|w| w.with_bias(bias))
        .map_err(config_error)
}

/// `--algo sliding-log --limit <N> --window <DURATION>`.
fn sliding_log(opts: &mut Options) -> Result<SlidingLog, Fatal> {
    let (limit, window) = limit_and_window(opts)?;
    SlidingLog::new(limit, window).map_err(config_error)
}

/// `--algo sub-window --limit <N> --window <DURATION> [--buckets <K>] [--bias strict|lenient]`.
fn sub_window(opts: &mut Options) -> Result<SubWindow, Fatal> {
    let (limit, window) = limit_and_window(opts)?;
    let buckets = opts
        .parsed("--buckets", |s: &str| {
            s.parse::<u32>()
                .map_err(|_| format!("expected a positive whole number, got `{s}`"))
        })?
        .unwrap_or(DEFAULT_BUCKETS);
    let bias = opts
        .parsed("--bias", str::parse::<Bias>)?
        .unwrap_or(Bias::Strict);
    SubWindow::new(limit, window, buckets)
        .map(|w| w.with_bias(bias))
        .map_err(config_error)
}

/// A `ConfigError` from an algorithm's constructor, reported against the option it came from.
fn config_error(err: ConfigError) -> Fatal {
    let option = match err.field() {
        Field::Rate => "--rate",
        Field::Burst => "--burst",
        Field::HalfLife => "--half-life",
        Field::Limit => "--limit",
        Field::Period => "--period",
        Field::Window => "--window",
        Field::Buckets => "--buckets",
        _ => "--algo",
    };
    Fatal::usage(format!("{option}: {err}"))
}

/// A whole number such as a burst.
fn parse_whole(s: &str) -> Result<u64, String> {
    s.parse()
        .map_err(|_| format!("expected a positive whole number, got `{s}`"))
}

/// Which limiter holds the keys.
#[derive(Debug, Clone, Copy)]
enum Variant {
    Cas,
    Mutex,
}

fn parse_variant(s: &str) -> Result<Variant, String> {
    match s {
        "cas" => Ok(Variant::Cas),
        "mutex" => Ok(Variant::Mutex),
        other => Err(format!("unknown variant `{other}` (expected cas or mutex)")),
    }
}

/// Which store holds the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Papaya,
    Compact,
}

fn parse_store(s: &str) -> Result<Store, String> {
    match s {
        "papaya" => Ok(Store::Papaya),
        "compact" => Ok(Store::Compact),
        other => Err(format!(
            "unknown store `{other}` (expected papaya or compact)"
        )),
    }
}

/// The command line as `--name value` pairs, taken one by one by whoever uses them; whatever
/// is left at the end was not an option of the chosen algorithm.
struct Options {
    pairs: Vec<(String, String)>,
}

impl Options {
    /// `None` when `--help` was asked for.
    fn parse(args: Vec<String>) -> Result<Option<Self>, Fatal> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                return Ok(None);
            }
            if !arg.starts_with("--") || arg.len() == 2 {
                return Err(Fatal::usage(format!(
                    "unexpected argument `{arg}` (see --help)"
                )));
            }
            let (name, value) = match arg.split_once('=') {
                Some((name, value)) => (name.to_owned(), value.to_owned()),
                None => match args.next() {
                    Some(value) => (arg, value),
                    None => return Err(Fatal::usage(format!("{arg}: missing value"))),
                },
            };
            if pairs.iter().any(|(n, _)| *n == name) {
                return Err(Fatal::usage(format!("{name}: given more than once")));
            }
            pairs.push((name, value));
        }
        Ok(Some(Self { pairs }))
    }

    /// Removes and returns the value of `name`, if given.
    fn take(&mut self, name: &str) -> Option<String> {
        let i = self.pairs.iter().position(|(n, _)| n == name)?;
        Some(self.pairs.remove(i).1)
    }

    fn required(&mut self, name: &str) -> Result<String, Fatal> {
        self.take(name)
            .ok_or_else(|| Fatal::usage(format!("{name}: missing (see --help)")))
    }

    /// The value of `name` parsed by `parse`, errors reported against `name`.
    fn parsed<T, E: Display>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Result<Option<T>, Fatal> {
        self.take(name)
            .map(|v| parse(&v).map_err(|e| Fatal::usage(format!("{name}: {e}"))))
            .transpose()
    }

    fn required_parsed<T, E: Display>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Result<T, Fatal> {
        let value = self.required(name)?;
        parse(&value).map_err(|e| Fatal::usage(format!("{name}: {e}")))
    }

    /// Fails on the first option nobody took.
    fn finish(self, algo: &str) -> Result<(), Fatal> {
        match self.pairs.first() {
            Some((name, _)) => Err(Fatal::usage(format!(
                "{name}: not an option of --algo {algo} (see --help)"
            ))),
            None => Ok(()),
        }
    }
}

/// The options common to every algorithm.
struct Setup<'a> {
    policy: Option<Policy>,
    variant: Variant,
    store: Store,
    max_keys: usize,
    algo: &'a str,
}

impl Setup<'_> {
    /// Checks no option is left over, applies the policy, builds the limiter the variant names
    /// on a manual clock and replays stdin through it to stdout.
    fn replay<A>(
        &self,
        algo: A,
        with_policy: fn(A, Policy) -> A,
        opts: Options,
    ) -> Result<(), Fatal>
    where
        A: Algorithm,
    {
        opts.finish(self.algo)?;
        let algo = match self.policy {
            Some(policy) => with_policy(algo, policy),
            None => algo,
        };
        let clock = ManualClock::default();
        match (self.store, self.variant) {
            (Store::Papaya, Variant::Cas) => {
                let limiter = CasLimiter::<String, A, _>::with_clock(algo, clock.clone());
                replay_stdio(&limiter, &clock)
            }
            (Store::Papaya, Variant::Mutex) => {
                let limiter = MutexLimiter::<String, A, _>::with_clock(algo, clock.clone());
                replay_stdio(&limiter, &clock)
            }
            // `--store compact`: string keys as 64-bit keyed hashes in a table for
            // `--max-keys`.
            (Store::Compact, Variant::Cas) => {
                let limiter = CompactLimiter::<Hashed<str>, A, QuantaClock, Cas>::builder(algo)
                    .max_keys(self.max_keys)
                    .clock(clock.clone())
                    .build();
                replay_built(limiter, &clock)
            }
            (Store::Compact, Variant::Mutex) => {
                let limiter = CompactLimiter::<Hashed<str>, A, QuantaClock, Locked>::builder(algo)
                    .max_keys(self.max_keys)
                    .clock(clock.clone())
                    .build();
                replay_built(limiter, &clock)
            }
        }
    }
}

/// [`replay_stdio`] on a limiter that may have failed to build.
fn replay_built(
    limiter: Result<impl RateLimiter<str>, hotlimit::BuildError>,
    clock: &ManualClock,
) -> Result<(), Fatal> {
    let limiter = limiter.map_err(|e| Fatal {
        message: format!("building the limiter: {e}"),
        code: 1,
    })?;
    replay_stdio(&limiter, clock)
}

/// Replays stdin to a buffered stdout, flushing what was decided even when a line fails.
fn replay_stdio<L: RateLimiter<str> + ?Sized>(
    limiter: &L,
    clock: &ManualClock,
) -> Result<(), Fatal> {
    let stdin = io::stdin();
    let mut out = BufWriter::new(io::stdout().lock());
    let result = replay(limiter, clock, stdin.lock(), &mut out);
    let flushed = out.flush().map_err(|e| Fatal::io("writing stdout", e));
    result.and(flushed)
}

/// The replay loop: for each request line, set the clock, decide, print the decision.
fn replay<L: RateLimiter<str> + ?Sized>(
    limiter: &L,
    clock: &ManualClock,
    mut input: impl BufRead,
    out: &mut impl Write,
) -> Result<(), Fatal> {
    let mut line = String::new();
    let mut number = 0;
    let mut last_nanos = 0;
    loop {
        line.clear();
        number += 1;
        match input.read_line(&mut line) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(Fatal::line(number, "not valid UTF-8"))
            }
            Err(e) => return Err(Fatal::io("reading stdin", e)),
        }
        let Some(request) = parse_request(&line).map_err(|e| Fatal::line(number, e))? else {
            continue;
        };
        if request.nanos < last_nanos {
            return Err(Fatal::line(
                number,
                format!("time {} is before the previous line's", request.time),
            ));
        }
        last_nanos = request.nanos;
        clock.set(Duration::from_nanos(request.nanos));
        let decision = limiter
            .check_n(request.key, request.cost)
            .map_err(|e| Fatal::line(number, e))?;
        write_decision(out, &decision).map_err(|e| Fatal::io("writing stdout", e))?;
    }
}

/// One request of the trace.
#[derive(Debug, PartialEq)]
struct Request<'a> {
    /// The time as written, for messages.
    time: &'a str,
    nanos: u64,
    key: &'a str,
    cost: u64,
}

/// Parses a trace line; `None` for a blank or comment line.
fn parse_request(line: &str) -> Result<Option<Request<'_>>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let mut fields = line.split_whitespace();
    let time = fields.next().unwrap_or_default();
    let nanos = parse_seconds(time)?;
    let key = fields
        .next()
        .ok_or("missing key (expected `<seconds> <key> [cost]`)")?;
    let cost = match fields.next() {
        None => 1,
        // 0 parses here and is refused by the limiter, like any cost it can never admit.
        Some(c) => c
            .parse()
            .map_err(|_| format!("bad cost `{c}`: expected a positive whole number"))?,
    };
    if let Some(extra) = fields.next() {
        return Err(format!(
            "unexpected field `{extra}` (expected `<seconds> <key> [cost]`)"
        ));
    }
    Ok(Some(Request {
        time,
        nanos,
        key,
        cost,
    }))
}

/// Parses decimal seconds exactly into nanoseconds: `12.5` → 12,500,000,000. Digits past the
/// ninth decimal are dropped; no float is involved.
fn parse_seconds(s: &str) -> Result<u64, String> {
    let bad = || format!("bad time `{s}`: expected decimal seconds such as `0.35`");
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let all_digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !all_digits(whole) || !all_digits(frac) || s.ends_with('.') {
        return Err(bad());
    }
    let too_large = || {
        format!(
            "time `{s}` is too large: at most {} s",
            u64::MAX / 1_000_000_000
        )
    };
    let whole: u64 = whole.parse().map_err(|_| too_large())?;
    let frac: u64 = format!("{:0<9.9}", frac).parse().map_err(|_| bad())?;
    whole
        .checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(frac))
        .ok_or_else(too_large)
}

/// `allow|deny retry_after=<s> [remaining=<n>] [rate=<r>]`.
fn write_decision(out: &mut impl Write, d: &Decision) -> io::Result<()> {
    let verdict = if d.is_allowed() { "allow" } else { "deny" };
    let retry = d.retry_after().as_secs_f64();
    write!(out, "{verdict} retry_after={retry}")?;
    if let Some(remaining) = d.remaining() {
        write!(out, " remaining={remaining}")?;
    }
    if let Some(rate) = d.rate() {
        write!(out, " rate={rate}")?;
    }
    writeln!(out)
}
