//! Runs the load test of `examples/loadtest` in process, through its engine (the code the
//! example runs), with small parameters, and checks its JSON output and its errors.

#[path = "../examples/loadtest/engine.rs"]
mod engine;

use serde_json::Value;

/// What one run of the load test gave: what the example would exit with and print.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the load test with `args`, as `cargo run --example loadtest -- args` would, but in
/// this process: the exit code, stdout and stderr are those the example's `main` would give.
fn loadtest(args: &[&str]) -> Run {
    let mut stderr = Vec::new();
    let result = engine::parse(std::iter::once("loadtest").chain(args.iter().copied()))
        .and_then(|parsed| engine::run(&parsed, &mut stderr));
    let mut stderr = String::from_utf8(stderr).unwrap();
    let (code, stdout) = match result {
        Ok(stdout) => (0, stdout),
        Err(e) => {
            stderr.push_str(&e.to_string());
            (i32::from(e.exit_code()), String::new())
        }
    };
    Run {
        code,
        stdout,
        stderr,
    }
}

/// A small run: 2 threads, 100 keys, 2000 checks per thread and pass.
const SMALL: &[&str] = &["--threads", "2", "--keys", "100", "--requests", "2000"];

/// `SMALL` with `--requests 500`, for the tests that run many rounds.
const SMALLER: &[&str] = &["--threads", "2", "--keys", "100", "--requests", "500"];

/// Runs with `args` (and `--json`), expects success and returns the parsed rows, each
/// checked by [`check_row`].
fn json_rows(args: &[&str]) -> Vec<Value> {
    let args: Vec<&str> = args.iter().chain(&["--json"]).copied().collect();
    let run = loadtest(&args);
    assert_eq!(run.code, 0, "loadtest {args:?} failed: {}", run.stderr);
    let json: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", run.stdout));
    let rows = json.as_array().expect("a JSON array").clone();
    for row in &rows {
        check_row(row);
    }
    rows
}

/// Runs with `SMALL` plus `extra` and returns the rows, which name `SMALL`'s parameters.
fn small_rows(extra: &[&str]) -> Vec<Value> {
    let args: Vec<&str> = SMALL.iter().chain(extra).copied().collect();
    let rows = json_rows(&args);
    for row in &rows {
        assert_eq!(row["threads"], 2);
        assert_eq!(row["keys"], 100);
        assert_eq!(row["requests_per_thread"], 2000);
    }
    rows
}

/// The keys of a row.
const ROW_KEYS: [&str; 30] = [
    "variant",
    "store",
    "clock",
    "batch",
    "algo",
    "quota",
    "prefill",
    "threads",
    "keys",
    "dist",
    "abusive",
    "requests_per_thread",
    "mops",
    "mops_min",
    "mops_max",
    "ns_per_op",
    "ns_per_op_min",
    "ns_per_op_max",
    "vs_cas",
    "vs_cas_min",
    "vs_cas_max",
    "latency_requests_per_thread",
    "latency_samples",
    "timer_overhead_ns",
    "p50_ns",
    "p99_ns",
    "p999_ns",
    "retries_per_op",
    "allowed_pct",
    "rounds",
];
/// The keys of each of a row's per-round objects.
const ROUND_KEYS: [&str; 7] = [
    "round",
    "position",
    "mops",
    "ns_per_op",
    "vs_cas",
    "checks",
    "allowed",
];

/// The median as the load test defines it: the middle value, or the mean of the middle two.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// `name`'s median and range in `row` agree with its per-round values: min ≤ median ≤ max,
/// each equal to what the rounds give.
fn check_spread(row: &Value, name: &str) {
    let per_round: Vec<f64> = rounds(row)
        .iter()
        .map(|r| r[name].as_f64().unwrap())
        .collect();
    let (med, min, max) = (
        row[name].as_f64().unwrap(),
        row[format!("{name}_min")].as_f64().unwrap(),
        row[format!("{name}_max")].as_f64().unwrap(),
    );
    assert!(min <= med && med <= max, "{name} out of order in {row}");
    // serde_json's parser may miss the nearest f64 by an ulp: compare within 1e-12.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
    assert!(
        close(med, median(per_round.clone())),
        "{name} median in {row}"
    );
    let lowest = per_round.iter().copied().fold(f64::INFINITY, f64::min);
    let highest = per_round.iter().copied().fold(0.0, f64::max);
    assert!(
        close(min, lowest) && close(max, highest),
        "{name} range in {row}"
    );
}

/// A row's per-round objects.
fn rounds(row: &Value) -> &Vec<Value> {
    row["rounds"].as_array().expect("rounds is an array")
}

/// Every key present, with the right type and a sane value; medians and ranges consistent
/// with the rounds, and the share allowed with their counts.
fn check_row(row: &Value) {
    let obj = row.as_object().expect("each row is an object");
    for key in ROW_KEYS {
        assert!(obj.contains_key(key), "{key} missing in {row}");
    }
    assert_eq!(obj.len(), ROW_KEYS.len(), "unexpected keys in {row}");
    for key in ["variant", "store", "clock", "algo", "quota", "dist"] {
        assert!(obj[key].is_string(), "{key} is not a string in {row}");
    }
    assert!(obj["prefill"].is_boolean(), "{row}");
    for key in [
        "threads",
        "keys",
        "abusive",
        "requests_per_thread",
        "mops",
        "mops_min",
        "mops_max",
        "ns_per_op",
        "ns_per_op_min",
        "ns_per_op_max",
        "latency_requests_per_thread",
        "latency_samples",
        "timer_overhead_ns",
        "retries_per_op",
        "allowed_pct",
    ] {
        assert!(obj[key].is_number(), "{key} is not a number in {row}");
    }
    assert!(row["mops"].as_f64().unwrap() > 0.0);
    assert!(row["ns_per_op"].as_f64().unwrap() > 0.0);
    check_spread(row, "mops");
    check_spread(row, "ns_per_op");
    if row["vs_cas"].is_null() {
        assert!(
            row["vs_cas_min"].is_null() && row["vs_cas_max"].is_null(),
            "{row}"
        );
    } else {
        check_spread(row, "vs_cas");
    }

    // The latency pass: every check of it timed, one sample each.
    let latency_per_thread = row["latency_requests_per_thread"].as_u64().unwrap();
    let samples = row["latency_samples"].as_u64().unwrap();
    let threads = row["threads"].as_u64().unwrap();
    assert_eq!(
        samples,
        latency_per_thread * threads * rounds(row).len() as u64
    );
    if samples == 0 {
        for key in ["p50_ns", "p99_ns", "p999_ns"] {
            assert!(row[key].is_null(), "{key} without a latency pass in {row}");
        }
    } else {
        let (p50, p99, p999) = (
            row["p50_ns"].as_u64().unwrap(),
            row["p99_ns"].as_u64().unwrap(),
            row["p999_ns"].as_u64().unwrap(),
        );
        assert!(
            p50 <= p99 && p99 <= p999,
            "percentiles out of order in {row}"
        );
    }
    assert!(row["retries_per_op"].as_f64().unwrap() >= 0.0);

    // Each round: its place in the round, all its checks, the share allowed from the counts.
    let requests = row["requests_per_thread"].as_u64().unwrap();
    let (mut checks, mut allowed) = (0, 0);
    for (i, round) in rounds(row).iter().enumerate() {
        let obj = round.as_object().expect("each round is an object");
        assert_eq!(obj.len(), ROUND_KEYS.len(), "unexpected keys in {round}");
        for key in ROUND_KEYS {
            assert!(obj.contains_key(key), "{key} missing in {round}");
        }
        assert_eq!(round["round"], i + 1, "rounds in order in {row}");
        assert!(round["position"].as_u64().unwrap() >= 1);
        assert_eq!(round["checks"], requests * threads, "{round}");
        let a = round["allowed"].as_u64().unwrap();
        assert!(a <= requests * threads, "{round}");
        checks += requests * threads;
        allowed += a;
    }
    let pct = row["allowed_pct"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&pct), "allowed_pct {pct}");
    assert!(
        (pct - 100.0 * allowed as f64 / checks as f64).abs() < 1e-9,
        "{row}"
    );
}

fn variants(rows: &[Value]) -> Vec<&str> {
    rows.iter()
        .map(|r| r["variant"].as_str().unwrap())
        .collect()
}

#[test]
fn json_has_one_row_per_variant() {
    let rows = small_rows(&[]);
    assert_eq!(
        variants(&rows),
        ["cas", "mutex", "sharded-mutex", "governor"]
    );
    for row in &rows {
        assert_eq!(row["algo"], "gcra");
        assert_eq!(row["quota"], "default");
        assert_eq!(row["prefill"], false);
        assert_eq!(row["dist"], "zipf:1.0");
        assert_eq!(row["abusive"], 0.1);
        // Three rounds by default.
        assert_eq!(rounds(row).len(), 3);
    }
    // Only hotlimit CAS counts retries.
    for row in &rows[1..] {
        assert_eq!(row["retries_per_op"], 0.0);
    }
    // CAS against itself, round by round.
    assert!(rounds(&rows[0]).iter().all(|r| r["vs_cas"] == 1.0));
    assert_eq!(
        (&rows[0]["vs_cas_min"], &rows[0]["vs_cas_max"]),
        (&1.0.into(), &1.0.into())
    );
}

#[test]
fn rounds_interleave_the_variants_in_a_rotating_order() {
    let names = ["cas", "mutex", "sharded-mutex", "governor"];
    let rows = json_rows(&[SMALLER, &["--rounds", "4"]].concat());
    assert_eq!(variants(&rows), names);
    // Round r (from 1) runs the variants of --variants rotated left by r - 1.
    for round in 1..=4usize {
        let mut order: Vec<(u64, &str)> = rows
            .iter()
            .map(|row| {
                let r = &rounds(row)[round - 1];
                assert_eq!(r["round"], round);
                (
                    r["position"].as_u64().unwrap(),
                    row["variant"].as_str().unwrap(),
                )
            })
            .collect();
        order.sort();
        let mut expected = names;
        expected.rotate_left(round - 1);
        assert_eq!(
            order,
            (1..=4).zip(expected).collect::<Vec<_>>(),
            "round {round}"
        );
    }
    // So over 4 rounds each variant ran first once, and in every position once.
    for row in &rows {
        let mut positions: Vec<u64> = rounds(row)
            .iter()
            .map(|r| r["position"].as_u64().unwrap())
            .collect();
        positions.sort();
        assert_eq!(positions, [1, 2, 3, 4], "{row}");
    }

    // Two variants, three rounds: cas first, then governor first, then cas again.
    let rows = small_rows(&["--rounds", "3", "--variants", "cas,governor"]);
    let positions = |row: &Value| -> Vec<u64> {
        rounds(row)
            .iter()
            .map(|r| r["position"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(positions(&rows[0]), [1, 2, 1]);
    assert_eq!(positions(&rows[1]), [2, 1, 2]);
}

#[test]
fn one_round_is_its_own_median_and_range() {
    let rows = small_rows(&["--rounds", "1", "--variants", "mutex,cas"]);
    assert_eq!(variants(&rows), ["mutex", "cas"]);
    for row in &rows {
        assert_eq!(rounds(row).len(), 1);
        assert_eq!(row["mops_min"], row["mops_max"]);
        assert_eq!(row["mops"], row["mops_max"]);
        assert_eq!(row["ns_per_op_min"], row["ns_per_op_max"]);
    }
    // The order is --variants' order: mutex ran first.
    assert_eq!(rounds(&rows[0])[0]["position"], 1);
    assert_eq!(rounds(&rows[1])[0]["position"], 2);
}

#[test]
fn without_cas_there_is_no_ratio() {
    let rows = small_rows(&["--variants", "mutex,governor", "--rounds", "2"]);
    for row in &rows {
        for key in ["vs_cas", "vs_cas_min", "vs_cas_max"] {
            assert!(row[key].is_null(), "{key} in {row}");
        }
        assert!(rounds(row).iter().all(|r| r["vs_cas"].is_null()));
    }
}

/// Within one key's burst (GCRA, burst 100), every check is allowed whatever the timing:
/// the counts are exact, in every round, for every variant (each round's limiter is fresh).
#[test]
fn allowed_counts_are_exact_within_the_burst() {
    all_allowed(&burst_rows(&[]));
}

/// 2 threads × 50 checks of one key (the burst is 100), no latency pass, with `extra`.
fn burst_rows(extra: &[&str]) -> Vec<Value> {
    let base = [
        "--threads",
        "2",
        "--keys",
        "1",
        "--dist",
        "uniform",
        "--requests",
        "50",
        "--latency-requests",
        "0",
    ];
    let rows = json_rows(&base.iter().chain(extra).copied().collect::<Vec<_>>());
    assert_eq!(rows.len(), 4, "{extra:?}");
    rows
}

/// Every round of every row checked 100 and allowed 100.
fn all_allowed(rows: &[Value]) {
    for row in rows {
        for r in rounds(row) {
            assert_eq!(
                (&r["checks"], &r["allowed"]),
                (&100.into(), &100.into()),
                "{row}"
            );
        }
        assert_eq!(row["allowed_pct"], 100.0);
    }
}

/// `--admit-all` puts every variant on the criterion benches' quota: every check allowed,
/// with or without `--prefill`, on either store.
#[test]
fn admit_all_allows_every_check() {
    for extra in [
        &[][..],
        &["--prefill"],
        &["--store", "compact", "--prefill"],
    ] {
        let rows = small_rows(&[&["--admit-all", "--abusive", "0"][..], extra].concat());
        assert_eq!(rows.len(), 4);
        for row in &rows {
            assert_eq!(row["quota"], "admit-all");
            assert_eq!(row["prefill"], extra.contains(&"--prefill"));
            assert_eq!(row["abusive"], 0.0);
            for r in rounds(row) {
                assert_eq!(r["allowed"], r["checks"], "{row}");
            }
            assert_eq!(row["allowed_pct"], 100.0);
        }
    }
}

#[test]
fn admit_all_is_gcra_only() {
    let run = loadtest(&[SMALL, &["--algo", "earrrl", "--admit-all"]].concat());
    assert_eq!(run.code, 2);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert!(run.stderr.contains("--admit-all"), "{}", run.stderr);
}

#[test]
fn latency_pass_length_and_its_absence() {
    // Default: a tenth of --requests, every check of it timed, in every round.
    let rows = small_rows(&["--variants", "cas", "--rounds", "2"]);
    assert_eq!(rows[0]["latency_requests_per_thread"], 200);
    assert_eq!(rows[0]["latency_samples"], 200 * 2 * 2);
    assert!(rows[0]["timer_overhead_ns"].as_u64().is_some());

    let rows = small_rows(&["--variants", "cas", "--latency-requests", "700"]);
    assert_eq!(rows[0]["latency_samples"], 700 * 2 * 3);
    // At most the whole sequence.
    let rows = small_rows(&["--variants", "cas", "--latency-requests", "5000"]);
    assert_eq!(rows[0]["latency_requests_per_thread"], 2000);

    let rows = small_rows(&["--variants", "cas,governor", "--latency-requests", "0"]);
    for row in &rows {
        assert_eq!(row["latency_samples"], 0);
        assert!(row["p50_ns"].is_null(), "{row}");
    }
    let run = loadtest(&[SMALL, &["--variants", "cas", "--latency-requests", "0"]].concat());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[2], "latency: not measured (--latency-requests 0)");
    assert!(
        lines[4].split_whitespace().nth(5) == Some("-"),
        "{}",
        lines[4]
    );
}

#[test]
fn store_option_puts_cas_and_mutex_on_the_compact_table() {
    let papaya = small_rows(&["--variants", "cas,mutex"]);
    assert!(papaya.iter().all(|r| r["store"] == "papaya"));
    for algo in ["gcra", "sliding-log"] {
        let rows = small_rows(&[
            "--algo",
            algo,
            "--variants",
            "cas,mutex",
            "--store",
            "compact",
        ]);
        assert_eq!(variants(&rows), ["cas", "mutex"]);
        assert!(rows.iter().all(|r| r["store"] == "compact"), "{rows:?}");
    }
}

#[test]
fn clock_option_runs_every_variant_on_the_coarse_clocks() {
    let exact = small_rows(&["--variants", "cas"]);
    assert_eq!(exact[0]["clock"], "exact");
    let coarse = small_rows(&["--clock", "coarse"]);
    assert_eq!(
        variants(&coarse),
        ["cas", "mutex", "sharded-mutex", "governor"]
    );
    assert!(coarse.iter().all(|r| r["clock"] == "coarse"), "{coarse:?}");
    let compact = small_rows(&[
        "--clock",
        "coarse",
        "--store",
        "compact",
        "--variants",
        "cas",
    ]);
    assert_eq!(compact[0]["store"], "compact");
    assert_eq!(compact[0]["clock"], "coarse");
}

#[test]
fn variants_option_picks_the_rows() {
    let rows = small_rows(&["--variants", "cas,mutex"]);
    assert_eq!(variants(&rows), ["cas", "mutex"]);
}

#[test]
fn governor_is_skipped_with_a_note_for_other_algorithms() {
    let args: Vec<&str> = SMALL
        .iter()
        .chain(&[
            "--algo",
            "sliding-window",
            "--variants",
            "cas,governor",
            "--json",
        ])
        .copied()
        .collect();
    let run = loadtest(&args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("governor"), "{}", run.stderr);
    let rows: Vec<Value> = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(variants(&rows), ["cas"]);
    assert_eq!(rows[0]["algo"], "sliding-window");
}

#[test]
fn table_states_the_parameters_and_how_each_column_was_measured() {
    let run = loadtest(&[SMALL, &["--dist", "uniform", "--rounds", "2"]].concat());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3 + 1 + 4, "{}", run.stdout);
    for part in [
        "algo=gcra (1000/s burst 100 per key)",
        "threads=2",
        "keys=100",
        "dist=uniform",
        "prefill=no",
        "requests/thread=2000",
        "rounds=2",
    ] {
        assert!(lines[0].contains(part), "{part} missing from {}", lines[0]);
    }
    for part in ["no timer per check", "over 2 round(s)", "interleaved"] {
        assert!(lines[1].contains(part), "{part} missing from {}", lines[1]);
    }
    assert!(lines[1].starts_with("throughput: "), "{}", lines[1]);
    for part in [
        "separate pass",
        "first 200 checks/thread",
        "every check timed",
        "includes the timer's own cost",
        "ns (p50)",
    ] {
        assert!(lines[2].contains(part), "{part} missing from {}", lines[2]);
    }
    assert!(lines[2].starts_with("latency: "), "{}", lines[2]);
    assert!(lines[3].starts_with("variant"), "{}", lines[3]);
    for column in ["Mops/s", "ns/op", "p99.9 ns", "vs CAS", "(min-max)"] {
        assert!(
            lines[3].contains(column),
            "{column} missing from {}",
            lines[3]
        );
    }
    let first: Vec<&str> = lines[4].split_whitespace().collect();
    assert_eq!(first[0], "cas");
    // CAS against itself: 1.00, range 1.00-1.00.
    assert_eq!(first[first.len() - 2..], ["1.00", "1.00-1.00"]);
    // Each range cell is `min-max` around the median beside it.
    for line in &lines[4..] {
        let cells: Vec<&str> = line.split_whitespace().collect();
        for (median, range) in [(cells[1], cells[2]), (cells[3], cells[4])] {
            let median: f64 = median.parse().unwrap();
            let (min, max) = range.split_once('-').unwrap();
            let (min, max): (f64, f64) = (min.parse().unwrap(), max.parse().unwrap());
            assert!(min <= median && median <= max, "{line}");
        }
    }

    let run = loadtest(&[SMALL, &["--admit-all", "--prefill", "--variants", "cas"]].concat());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let header = run.stdout.lines().next().unwrap();
    assert!(header.contains("algo=gcra (admit all: "), "{header}");
    assert!(header.contains("prefill=yes"), "{header}");
}

/// `--batch` runs the hotlimit rows' throughput passes through `check_batch`, on either store,
/// with the same exact counts as one check each.
#[test]
fn batch_option_decides_through_check_batch_with_the_same_counts() {
    for store in ["papaya", "compact"] {
        let rows = burst_rows(&["--batch", "16", "--store", store]);
        assert!(rows.iter().all(|r| r["batch"] == 16), "{rows:?}");
        all_allowed(&rows);
    }
    assert!(small_rows(&[]).iter().all(|r| r["batch"] == 1));
}

#[test]
fn bad_options_are_refused_naming_the_option() {
    for (args, option) in [
        (&["--batch", "0"][..], "--batch"),
        (&["--dist", "zipf:abc"], "--dist"),
        (&["--abusive", "1.5"], "--abusive"),
        (&["--rounds", "0"], "--rounds"),
        (&["--latency-requests", "x"], "--latency-requests"),
    ] {
        let run = loadtest(args);
        assert_ne!(run.code, 0, "{args:?}");
        assert!(run.stdout.is_empty(), "{}", run.stdout);
        assert!(run.stderr.contains(option), "{args:?}: {}", run.stderr);
    }
}
