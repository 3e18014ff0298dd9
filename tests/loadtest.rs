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

const SMALL: &[&str] = &[
    "--threads",
    "2",
    "--keys",
    "100",
    "--requests",
    "2000",
    "--json",
];

/// Runs with `SMALL` plus `extra`, expects success and returns the parsed rows.
fn rows(extra: &[&str]) -> Vec<Value> {
    let args: Vec<&str> = SMALL.iter().chain(extra).copied().collect();
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

/// Every key present, with the right type and a sane value.
fn check_row(row: &Value) {
    let obj = row.as_object().expect("each row is an object");
    for key in ["variant", "store", "clock", "algo", "dist"] {
        assert!(obj[key].is_string(), "{key} is not a string in {row}");
    }
    for key in [
        "threads",
        "keys",
        "mops",
        "ns_per_op",
        "p50_ns",
        "p99_ns",
        "p999_ns",
        "retries_per_op",
        "allowed_pct",
    ] {
        let v = obj
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing in {row}"));
        assert!(v.is_number(), "{key} is not a number in {row}");
    }
    assert_eq!(obj.len(), 14, "unexpected keys in {row}");
    assert_eq!(row["threads"], 2);
    assert_eq!(row["keys"], 100);
    assert_eq!(row["dist"], "zipf:1.0");
    let allowed = row["allowed_pct"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&allowed), "allowed_pct {allowed}");
    assert!(row["mops"].as_f64().unwrap() > 0.0);
    assert!(row["ns_per_op"].as_f64().unwrap() > 0.0);
    let (p50, p99, p999) = (
        row["p50_ns"].as_u64().unwrap(),
        row["p99_ns"].as_u64().unwrap(),
        row["p999_ns"].as_u64().unwrap(),
    );
    assert!(
        p50 <= p99 && p99 <= p999,
        "percentiles out of order in {row}"
    );
    assert!(row["retries_per_op"].as_f64().unwrap() >= 0.0);
}

fn variants(rows: &[Value]) -> Vec<&str> {
    rows.iter()
        .map(|r| r["variant"].as_str().unwrap())
        .collect()
}

#[test]
fn json_has_one_row_per_variant() {
    let rows = rows(&[]);
    assert_eq!(
        variants(&rows),
        ["cas", "mutex", "sharded-mutex", "governor"]
    );
    for row in &rows {
        assert_eq!(row["algo"], "gcra");
    }
    // Only hotlimit CAS counts retries.
    for row in &rows[1..] {
        assert_eq!(row["retries_per_op"], 0.0);
    }
}

#[test]
fn store_option_puts_cas_and_mutex_on_the_compact_table() {
    let papaya = rows(&["--variants", "cas,mutex"]);
    assert!(papaya.iter().all(|r| r["store"] == "papaya"));
    for algo in ["gcra", "sliding-log"] {
        let rows = rows(&[
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
    let exact = rows(&["--variants", "cas"]);
    assert_eq!(exact[0]["clock"], "exact");
    let coarse = rows(&["--clock", "coarse"]);
    assert_eq!(
        variants(&coarse),
        ["cas", "mutex", "sharded-mutex", "governor"]
    );
    assert!(coarse.iter().all(|r| r["clock"] == "coarse"), "{coarse:?}");
    let compact = rows(&[
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
    let rows = rows(&["--variants", "cas,mutex"]);
    assert_eq!(variants(&rows), ["cas", "mutex"]);
}

#[test]
fn governor_is_skipped_with_a_note_for_other_algorithms() {
    let args: Vec<&str> = SMALL
        .iter()
        .chain(&["--algo", "sliding-window", "--variants", "cas,governor"])
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
fn table_names_the_parameters() {
    let run = loadtest(&[
        "--threads",
        "2",
        "--keys",
        "100",
        "--requests",
        "2000",
        "--dist",
        "uniform",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2 + 4, "{}", run.stdout);
    for part in [
        "algo=gcra",
        "threads=2",
        "keys=100",
        "dist=uniform",
        "requests/thread=2000",
    ] {
        assert!(lines[0].contains(part), "{part} missing from {}", lines[0]);
    }
    assert!(lines[1].starts_with("variant"), "{}", lines[1]);
    assert!(lines[2].starts_with("cas "), "{}", lines[2]);
}

#[test]
fn bad_dist_is_refused_naming_the_option() {
    let run = loadtest(&["--dist", "zipf:abc"]);
    assert_ne!(run.code, 0);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert!(run.stderr.contains("--dist"), "{}", run.stderr);

    let run = loadtest(&["--abusive", "1.5"]);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("--abusive"), "{}", run.stderr);
}
