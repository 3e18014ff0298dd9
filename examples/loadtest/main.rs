//! A multi-threaded load test: the same pre-generated stream of keyed requests through the
//! lock-free `CasLimiter`, its `MutexLimiter` twin, the sharded `Mutex<HashMap>` baseline and
//! (for GCRA) the `governor` crate, with throughput, per-check latency percentiles, CAS
//! retries and the share of requests allowed.
//!
//! # Usage
//!
//! ```text
//! cargo run --release --example loadtest -- [OPTIONS]
//!
//! --algo gcra|earrrl|exponential|fixed-window|sliding-window|sliding-log|sub-window  (default gcra)
//! --threads N            worker threads (default: available cores, at least 2)
//! --keys N               distinct keys (default 10000)
//! --dist uniform|zipf:S  key popularity (default zipf:1.0)
//! --abusive F            share of requests from 8 abusive keys, 0..1 (default 0.1)
//! --requests N           checks per thread (default 40000000 / threads, at least 1000000)
//! --variants LIST        cas,mutex,sharded-mutex,governor (default: all four)
//! --store papaya|compact the store of the cas and mutex variants (default papaya)
//! --clock exact|coarse   the clock of every limiter (default exact; see below)
//! --seed N               key stream seed (default 1)
//! --json                 one JSON array of rows on stdout instead of the table
//! ```
//!
//! Each algorithm runs with a fixed per-key quota (see `--help`). Keys are the integers
//! `0..keys`; key `r − 1` has popularity rank `r` (rank 1 the most popular under Zipf). The
//! abusive keys are the last `min(8, keys)` keys, the least popular ranks, so under Zipf their
//! traffic is all abuse. Every variant replays exactly the same per-thread key sequences,
//! generated before any timing from the seed; each variant starts from an empty limiter, so a
//! key's first check inserts it. With `--store compact` the `cas` and `mutex` variants are
//! `CompactLimiter`s (the fixed-capacity inline table, sized for `--keys`) instead of the
//! papaya-based `CasLimiter` / `MutexLimiter`; the sharded and governor rows are unchanged.
//! With `--clock coarse` every hotlimit limiter reads one `CoarseClock` (1 ms resolution)
//! instead of the TSC, and governor its own quanta upkeep clock (1 ms), so that both sides
//! trade the same resolution for a cheaper clock read.
//!
//! # Output
//!
//! A progress line on stderr; on stdout a table (or, with `--json`, one JSON array with one
//! object per variant: `variant`, `store`, `clock`, `algo`, `threads`, `keys`, `dist`, `mops`, `ns_per_op`,
//! `p50_ns`, `p99_ns`, `p999_ns`, `retries_per_op`, `allowed_pct`).
//!
//! * `Mops/s`: total checks / wall time / 10^6, the wall time running from the first thread's
//!   start (threads start together at a barrier) to the last thread's end.
//! * `ns/op`: wall time × threads / total checks, the time one check costs one thread.
//! * `p50`, `p99`, `p99.9`: latency of one check, timed with `std::time::Instant` around it
//!   (so they include the timer's own overhead, some 20-40 ns), all threads merged.
//! * `retries/op`: CAS retries (`metrics().cas_retries`) per check, hotlimit CAS only; the lock-based
//!   variants have none and governor's are not observable (`-` in the table, 0 in JSON).
//! * `allowed %`: the share of checks allowed.
//! * `vs CAS`: throughput relative to hotlimit CAS in the same run.

mod engine;

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let stdout = match engine::parse(std::env::args_os())
        .and_then(|args| engine::run(&args, &mut std::io::stderr()))
    {
        Ok(stdout) => stdout,
        // clap prints the help (on stdout, exit 0) or the usage error itself.
        Err(engine::Error::Usage(e)) => e.exit(),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let mut out = std::io::stdout().lock();
    match write!(out, "{stdout}").and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadtest: writing stdout: {e}");
            ExitCode::from(2)
        }
    }
}
