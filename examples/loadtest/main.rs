//! A multi-threaded load test: the same pre-generated stream of keyed requests through the
//! lock-free `CasLimiter`, its `MutexLimiter` twin, the sharded `Mutex<HashMap>` baseline and
//! (for GCRA) the `governor` crate, in rounds that interleave them, with throughput (no timer
//! per check), latency percentiles from a separate timed pass, CAS retries and the share of
//! requests allowed.
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
//! --requests N           checks per thread in each throughput pass (default 40000000 / threads,
//!                        at least 1000000)
//! --rounds R             rounds, each running every variant once (default 3)
//! --latency-requests N   checks per thread in each latency pass, 0 for none (default --requests / 10)
//! --admit-all            GCRA only: the criterion benches' quota, which admits every check
//! --prefill              check every key once before each throughput pass (untimed), as the
//!                        criterion benches do
//! --variants LIST        cas,mutex,sharded-mutex,governor (default: all four)
//! --store papaya|compact the store of the cas and mutex variants (default papaya)
//! --clock exact|coarse   the clock of every limiter (default exact; see below)
//! --batch <N>           hotlimit's cas and mutex rows: throughput in slices of N checks
//!                        through `check_batch` (default 1: one `check` each)
//! --seed N               key stream seed (default 1)
//! --json                 one JSON array of rows on stdout instead of the table
//! ```
//!
//! Each algorithm runs with a fixed per-key quota (see `--help`); `--admit-all` replaces GCRA's
//! 1000/s burst 100 with the criterion benches' quota (hotlimit 1 per ns with a burst of 2^40,
//! governor `u32::MAX`/s with an equal burst), so every check is allowed and takes the write
//! path. Keys are the integers `0..keys`; key `r − 1` has popularity rank `r` (rank 1 the most
//! popular under Zipf). The abusive keys are the last `min(8, keys)` keys, the least popular
//! ranks, so under Zipf their traffic is all abuse. Every variant replays exactly the same
//! per-thread key sequences, generated before any timing from the seed. With `--store
//! compact` the `cas` and `mutex` variants are `CompactLimiter`s (the fixed-capacity inline
//! table, sized for `--keys`) instead of the papaya-based `CasLimiter` / `MutexLimiter`; the
//! sharded and governor rows are unchanged. With `--clock coarse` every hotlimit limiter reads
//! one `CoarseClock` (1 ms resolution) instead of the TSC, and governor its own quanta upkeep
//! clock (1 ms), so that both sides trade the same resolution for a cheaper clock read.
//!
//! # How it measures
//!
//! * **Rounds.** Each of `--rounds` rounds runs every variant once, each on a fresh, empty
//!   limiter, over the same key sequences. Round `r` (from 1) runs `--variants` rotated left
//!   by `r − 1` (`cas,mutex,sharded-mutex,governor`, then `mutex,sharded-mutex,governor,cas`,
//!   ...), so no variant always goes first, and variants compared within a round ran seconds
//!   apart: on a VM whose vCPUs the hypervisor moves (the core-to-core round trip here jumps
//!   between ~100 and 450–900 ns within a run), a scenario whose variants ran one after the
//!   other could compare two different machines.
//! * **Throughput pass.** With `--prefill`, every key is checked once first (untimed,
//!   uncounted). Then the threads, released together by a barrier, each check their whole
//!   key sequence in a tight loop with no timer in it: one `Instant::now()` before and one
//!   after. Each decision goes through `black_box` whole (as in the criterion benches), so
//!   the compiler cannot drop the parts of it (`retry_after`, `remaining`) that counting
//!   the allowed ones does not read: 3 ns of a 22 ns check. Wall time runs from the
//!   first thread's start to the last thread's end. (Timing every check, as this test did
//!   before, measured the timer: `Instant::now()` costs 23–30 ns on the 2-vCPU VM, which put a
//!   ~35 ns check at ~180 ns and pushed every ratio towards 1.)
//! * **Latency pass.** Right after each throughput pass, on the same (now warm) limiter, the
//!   threads check the first `--latency-requests` keys of their sequences again, each check
//!   between two `Instant::now()` calls; every round's values and every thread's are merged.
//!   So the percentiles are of a sample taken separately from the throughput, on a limiter
//!   past its first-sight inserts, and **each value includes the timer's own cost**: the
//!   test times 100,000 empty pairs of `Instant::now()` calls first and prints their median
//!   ("an empty timed pair reads 30 ns") beside the percentiles.
//!
//! # Output
//!
//! A progress line on stderr; on stdout a table under three lines (the parameters, how the
//! throughput was measured, how the latency was sampled and the timer's overhead), or with
//! `--json` one JSON array with one object per variant (see below).
//!
//! ```text
//! algo=gcra (1000/s burst 100 per key), store=papaya, clock=exact, threads=2, keys=10000, dist=zipf:1.0, abusive=0.1 (from 8 key(s)), prefill=no, requests/thread=20000000, rounds=3
//! throughput: no timer per check (one clock read per thread before and after its 20000000 checks); median and min-max over 3 round(s), each on fresh limiters, the variants interleaved (round r starts at the r-th)
//! latency: a separate pass after each throughput pass, its first 2000000 checks/thread again on the same limiter, every check timed, all rounds merged; each value includes the timer's own cost: an empty timed pair reads 30 ns (p50)
//! variant        Mops/s    (min-max)  ns/op  (min-max)  p50 ns  p99 ns  p99.9 ns  retries/op  allowed %  vs CAS  (min-max)
//! cas             58.19  57.66-58.34   34.4  34.3-34.7      50     130       151      1.3e-5      16.16    1.00  1.00-1.00
//! mutex           43.72  43.42-44.14   45.7  45.3-46.1      70     131       171           -      18.49    0.75  0.75-0.76
//! sharded-mutex   35.25  34.77-36.18   56.7  55.3-57.5      80     200       281           -      20.28    0.61  0.60-0.62
//! governor        29.39  27.74-29.44   68.1  67.9-72.1     100     190       270           -      22.03    0.50  0.48-0.51
//! ```
//!
//! (The default run on the 2-vCPU development VM, quiet; BENCHMARKS.md has the others.)
//!
//! * `Mops/s`: total checks / wall time / 10^6, for each round; the median over rounds and,
//!   in `(min-max)`, the range.
//! * `ns/op`: wall time × threads / total checks, the time one check costs one thread; median
//!   and range over rounds.
//! * `p50`, `p99`, `p99.9`: the latency pass's values, timer included (`-` with
//!   `--latency-requests 0`).
//! * `retries/op`: CAS retries (`metrics().cas_retries`) per check in the throughput passes,
//!   hotlimit CAS only; the lock-based variants have none and governor's are not observable
//!   (`-` in the table, 0 in JSON).
//! * `allowed %`: the share of the throughput passes' checks allowed, all rounds. It differs
//!   between variants under a real quota: a faster variant replays the same stream in less
//!   time, so fewer tokens accrue during it (and the clocks are read at slightly different
//!   moments).
//! * `vs CAS`: throughput relative to hotlimit CAS **in the same round**, its median and range
//!   over rounds (so a round on a slow machine moves both sides of its ratio).
//!
//! JSON rows: `variant`, `store`, `clock`, `batch`, `algo`, `quota` (`default` or `admit-all`),
//! `prefill`, `threads`, `keys`, `dist`, `abusive`, `requests_per_thread`; `mops`,
//! `ns_per_op` and `vs_cas` (medians; `vs_cas` null without a `cas` variant), each with
//! `_min` and `_max`; `latency_requests_per_thread`, `latency_samples`, `timer_overhead_ns`
//! (the empty pair's median), `p50_ns`, `p99_ns`, `p999_ns` (null without a latency pass);
//! `retries_per_op`, `allowed_pct`; and `rounds`, one object per round in round order:
//! `round`, `position` (where the variant ran in it, from 1), `mops`, `ns_per_op`, `vs_cas`,
//! `checks`, `allowed`.
//!
//! # The same scenario in the criterion benches
//!
//! The benches run GCRA with a quota that admits everything, on limiters that already hold
//! every key, with no abusive share. `--admit-all --prefill --abusive 0` puts the load test
//! in the same scenario; then each bench row has a load-test command:
//!
//! | bench row | load test (add `--admit-all --prefill --abusive 0`) |
//! |---|---|
//! | `keyed/1keys-uniform/{T}t/cas` | `--keys 1 --dist uniform --threads T --variants cas` |
//! | `keyed/10000keys-uniform/{T}t/cas` | `--keys 10000 --dist uniform --threads T --variants cas` |
//! | `keyed/10000keys-zipf1/{T}t/cas` | `--keys 10000 --dist zipf:1.0 --threads T --variants cas` |
//! | `keyed/1000000keys-{uniform,zipf1}/{T}t/cas` | `--keys 1000000 --dist uniform` (or `zipf:1.0`) `--threads T --variants cas` |
//! | `keyed/.../mutex`, `.../sharded-mutex`, `.../governor` | the same with `--variants mutex`, `sharded-mutex`, `governor` |
//! | `keyed/.../compact` | the same with `--store compact --variants cas` |
//! | `keyed/.../cas-coarse` (and every `-coarse` row), `keyed/.../governor-upkeep` | the same with `--clock coarse` (`--variants governor` for `governor-upkeep`) |
//! | `contention/{T}t/keyed-cas`, `contention/{T}t/keyed-mutex` | `--keys 1 --dist uniform --threads T --variants cas` (`mutex`) |
//! | `cargo bench --bench compact`: compact (TSC), papaya CAS, governor, 1 and 2 threads | `--keys 1000000 --dist uniform --threads T --store compact --variants cas,governor`; papaya CAS: `--store papaya --variants cas` |
//! | the same, compact coarse 1 ms / governor upkeep 1 ms | the same with `--clock coarse` |
//!
//! The `cas-pinned-batch` and `papaya-get-cas` rows, the direct limiter's `contention` rows
//! and the compact bench's flat-array and floor rows have no load-test counterpart. What still
//! differs between a bench row and its command: the bench's keys are a sequence of 2^20 per
//! thread read in a cycle, drawn with `SmallRng` from seeds 1 and 2 (the load test's are
//! `--requests` per thread from `StdRng`, seed + thread: the same distribution, not the same
//! keys); the keyed bench calls its check through a `dyn Fn` once per batch of 64; the
//! bench's limiters live through all its samples (and, in the keyed bench, beside the other
//! variants' maps, filled key by key in one loop, so their entries alternate on the heap),
//! where the load test builds and prefills a fresh one for each round; and criterion reports
//! the median of its samples, the load test the median of its rounds. BENCHMARKS.md ("Load test",
//! "Fast at every scale") has the two side by side.
//!
//! **The default scenario** (GCRA 1000/s burst 100, 10k keys zipf 1.0, 10% of the requests
//! from 8 abusive keys, empty limiters, 2 threads) has no bench row. The closest is
//! `keyed/10000keys-zipf1/2t/{cas,mutex,sharded-mutex,governor}`, which differs in the quota
//! (there every check is allowed and writes; here about a quarter are allowed, and a leaky
//! denial reads the state word and writes nothing, so it is cheaper and leaves a hot key's
//! cache line shared between the threads), in the abusive share (8 keys taking 10% of the
//! traffic) and in the 10,000 first-sight inserts (negligible over millions of checks).
//! Adding `--admit-all --prefill --abusive 0` to the default command gives that row's
//! scenario.

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
