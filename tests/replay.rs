//! Runs `examples/replay.rs` (through `cargo run`) on traces and checks its output and errors.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// What one run of the replayer gave.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }
}

/// A `cargo` command in this crate's directory.
fn cargo() -> Command {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

/// Runs the replayer with `args`, feeding it `stdin`. The example is built once, by the first
/// caller, so that a compile error is reported once and plainly.
fn replay(args: &[&str], stdin: &str) -> Run {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = cargo()
            .args(["build", "--quiet", "--example", "replay"])
            .output()
            .expect("run cargo build");
        assert!(
            out.status.success(),
            "cargo build --example replay failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    let mut child = cargo()
        .args(["run", "--quiet", "--example", "replay", "--"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cargo run");
    // Feed stdin from another thread: the child's output may fill its pipe before it has read
    // all of its input.
    let mut pipe = child.stdin.take().unwrap();
    let input = stdin.to_owned();
    let feeder = std::thread::spawn(move || {
        // The replayer stops reading at the first bad line: a broken pipe is expected then.
        let _ = pipe.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().expect("wait for the replayer");
    feeder.join().unwrap();
    Run {
        code: out.status.code().expect("exit status"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Runs with `args` and expects success.
fn replay_ok(args: &[&str], stdin: &str) -> Run {
    let run = replay(args, stdin);
    assert_eq!(run.code, 0, "replay {args:?} failed: {}", run.stderr);
    run
}

const GCRA_10_BURST_5: &[&str] = &["--algo", "gcra", "--rate", "10/s", "--burst", "5"];

// Pins G6.
#[test]
fn burst_trace_reproduces_the_spec_gcra_vector() {
    let trace = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/traces/burst.trace"
    ))
    .unwrap();
    let run = replay_ok(GCRA_10_BURST_5, &trace);
    let expected = [
        // t = 0: alice's burst of 5, bob's first request in between, alice's 6th denied.
        "allow retry_after=0 remaining=4",
        "allow retry_after=0 remaining=3",
        "allow retry_after=0 remaining=4", // bob
        "allow retry_after=0 remaining=2",
        "allow retry_after=0 remaining=1",
        "allow retry_after=0 remaining=0",
        "deny retry_after=0.1 remaining=0",
        // t = 0.1: one more for alice, then denied again; bob at cost 2.
        "allow retry_after=0 remaining=0",
        "deny retry_after=0.1 remaining=0",
        "allow retry_after=0 remaining=3", // bob, cost 2
        // t = 0.35: two for alice, the third denied for 50 ms; bob again.
        "allow retry_after=0 remaining=1",
        "allow retry_after=0 remaining=0",
        "deny retry_after=0.05 remaining=0",
        "allow retry_after=0 remaining=4", // bob
    ];
    assert_eq!(run.lines(), expected);
    assert_eq!(run.stderr, "");
}

/// A deterministic trace of `n` requests over 20 keys (three of them hot): bursts at one
/// instant, small and large gaps, costs 1 to 3 (mostly 1), the cost of 1 sometimes implicit.
fn generated_trace(n: usize) -> String {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        // Knuth's MMIX LCG; the high bits are the good ones.
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        x >> 33
    };
    let mut now_ns: u64 = 0;
    let mut trace = String::from("# generated\n");
    for _ in 0..n {
        now_ns += match next() % 10 {
            0..=4 => 0,                   // same instant: bursts
            5..=8 => next() % 20_000_000, // up to 20 ms
            _ => next() % 2_000_000_000,  // up to 2 s
        };
        let key = if next() % 2 == 0 {
            next() % 3
        } else {
            next() % 20
        };
        let cost = match next() % 8 {
            0 => 3,
            1 | 2 => 2,
            _ => 1,
        };
        let secs = format!("{}.{:09}", now_ns / 1_000_000_000, now_ns % 1_000_000_000);
        if cost == 1 && next() % 2 == 0 {
            trace.push_str(&format!("{secs} key{key}\n"));
        } else {
            trace.push_str(&format!("{secs} key{key} {cost}\n"));
        }
    }
    trace
}

// Pins G9.
#[test]
fn fixed_window_trace_reproduces_the_spec_vector() {
    let trace = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/traces/fixed-window.trace"
    ))
    .unwrap();
    let requests: Vec<&str> = trace
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        requests,
        ["5 k", "15 k", "61 k", "70 k", "100 k", "110 k", "140 k"]
    );
    let run = replay_ok(
        &["--algo", "fixed-window", "--limit", "3", "--window", "60s"],
        &trace,
    );
    let expected = [
        "allow retry_after=0 remaining=2", // [0, 60) holds 5: 3 − 1
        "allow retry_after=0 remaining=1", // [0, 60) holds 5, 15: 3 − 2
        "allow retry_after=0 remaining=2", // new window [60, 120) holds 61: 3 − 1
        "allow retry_after=0 remaining=1", // 61, 70: 3 − 2
        "allow retry_after=0 remaining=0", // 61, 70, 100: 3 − 3
        "deny retry_after=10 remaining=0", // a 4th in [60, 120): wait 120 − 110 = 10 s
        "allow retry_after=0 remaining=2", // new window [120, 180) holds 140: 3 − 1
    ];
    assert_eq!(run.lines(), expected);
    assert_eq!(run.stderr, "");
    // The lock-free and the mutex limiter agree; leaky is the window family's default.
    for extra in [&["--variant", "mutex"][..], &["--policy", "leaky"]] {
        let mut args = vec!["--algo", "fixed-window", "--limit", "3", "--window", "60s"];
        args.extend(extra);
        assert_eq!(replay_ok(&args, &trace).lines(), expected, "{extra:?}");
    }
}

#[test]
fn window_options_are_applied() {
    // Sliding window counter, 4 per 10 s: four at 8 s, then at 13 s (window [10, 20), e = 3 s)
    // the previous 4 weigh 4·(1 − 3/10) = 2.8: a first request makes 3.8 ≤ 4; a second 4.8,
    // which the strict bias denies (until 4·(1 − e/10) + 2 ≤ 4, e ≥ 5 s: wait 2 s) and the
    // lenient bias allows (⌊4.8⌋ = 4).
    let trace = "8 k 4\n13 k\n13 k\n";
    let sliding = [
        "--algo",
        "sliding-window",
        "--limit",
        "4",
        "--window",
        "10s",
    ];
    let exact = [
        "allow retry_after=0 remaining=0",
        "allow retry_after=0 remaining=0", // ⌊4 − 2.8⌋ − 1 = 0
        "deny retry_after=2 remaining=0",
    ];
    assert_eq!(replay_ok(&sliding, trace).lines(), exact);
    let mut args = sliding.to_vec();
    args.extend(["--bias", "strict"]);
    assert_eq!(replay_ok(&args, trace).lines(), exact);
    let mut args = sliding.to_vec();
    args.extend(["--bias", "lenient"]);
    assert_eq!(
        replay_ok(&args, trace).lines(),
        [
            "allow retry_after=0 remaining=0",
            "allow retry_after=0 remaining=1", // ⌊2.8 + 1 + c⌋ ≤ 4 for c ≤ 1 (⌊4.8⌋ = 4)
            "allow retry_after=0 remaining=0", // ⌊4.8⌋ = 4 ≤ 4; ⌊4.8 + 1⌋ = 5 > 4
        ]
    );

    // Sub-window, 3 per 10 s in 5 buckets of 2 s: requests at 1.5, 3, 5 s fill buckets 0–2;
    // at 10.5 s (bucket 5) the strict bias still sums buckets 0–5 (3 + 1 > 3: denied until
    // bucket 0 leaves at bucket 6, 12 s: wait 1.5 s), the lenient bias only 1–5 (allowed).
    let trace = "1.5 k\n3 k\n5 k\n10.5 k\n";
    let sub = [
        "--algo",
        "sub-window",
        "--limit",
        "3",
        "--window",
        "10s",
        "--buckets",
        "5",
    ];
    let first_three = [
        "allow retry_after=0 remaining=2",
        "allow retry_after=0 remaining=1",
        "allow retry_after=0 remaining=0",
    ];
    for (err, last) in [
        (None, "deny retry_after=1.5 remaining=0"),
        (Some("strict"), "deny retry_after=1.5 remaining=0"),
        (Some("lenient"), "allow retry_after=0 remaining=0"),
    ] {
        let mut args = sub.to_vec();
        if let Some(err) = err {
            args.extend(["--bias", err]);
        }
        let run = replay_ok(&args, trace);
        assert_eq!(run.lines()[..3], first_three, "{err:?}");
        assert_eq!(run.lines()[3], last, "{err:?}");
    }

    // Sliding log, 2 per 10 s: entries at 1 and 4 s; at 9 s the 1 s entry must leave first,
    // at 11 s: wait 2 s.
    let run = replay_ok(
        &["--algo", "sliding-log", "--limit", "2", "--window", "10s"],
        "1 k\n4 k\n9 k\n",
    );
    assert_eq!(
        run.lines(),
        [
            "allow retry_after=0 remaining=1",
            "allow retry_after=0 remaining=0",
            "deny retry_after=2 remaining=0",
        ]
    );
}

// Pins G2.
#[test]
fn cas_and_mutex_variants_print_the_same_decisions() {
    let trace = generated_trace(3000);
    // The twins run the same step code and differ only in how they synchronize, so their
    // output is byte-identical, floats included.
    let algos: [&[&str]; 10] = [
        GCRA_10_BURST_5,
        &["--algo", "earrrl", "--half-life", "2s", "--limit", "3/s"],
        &["--algo", "exponential", "--limit", "10", "--period", "5s"],
        &["--algo", "fixed-window", "--limit", "10", "--window", "5s"],
        &[
            "--algo",
            "sliding-window",
            "--limit",
            "10",
            "--window",
            "5s",
        ],
        &[
            "--algo",
            "sliding-window",
            "--limit",
            "10",
            "--window",
            "5s",
            "--bias",
            "lenient",
        ],
        &["--algo", "sliding-log", "--limit", "10", "--window", "5s"],
        &["--algo", "sub-window", "--limit", "10", "--window", "5s"],
        &[
            "--algo",
            "sub-window",
            "--limit",
            "10",
            "--window",
            "5s",
            "--buckets",
            "10",
            "--bias",
            "lenient",
        ],
        &[
            "--algo",
            "sub-window",
            "--limit",
            "10",
            "--window",
            "5s",
            "--buckets",
            "7",
            "--bias",
            "strict",
        ],
    ];
    for algo in algos {
        for policy in ["leaky", "strict"] {
            let what = format!("{} --policy {policy}", algo.join(" "));
            let with = |variant: &str| {
                let mut args = algo.to_vec();
                args.extend(["--policy", policy, "--variant", variant]);
                replay_ok(&args, &trace)
            };
            let (cas, mutex) = (with("cas"), with("mutex"));
            assert_eq!(cas.lines().len(), 3000, "{what}");
            let denied = cas.lines().iter().filter(|l| l.starts_with("deny")).count();
            assert!(
                (100..2000).contains(&denied),
                "{what}: {denied} denied, the trace should exercise both answers"
            );
            assert_eq!(cas.stdout, mutex.stdout, "{what}: cas and mutex differ");
        }
    }
}

// Pins G2.
#[test]
fn papaya_and_compact_stores_print_the_same_decisions() {
    let trace = generated_trace(2000);
    let algos: [&[&str]; 4] = [
        GCRA_10_BURST_5,
        &["--algo", "earrrl", "--half-life", "2s", "--limit", "3/s"],
        &["--algo", "exponential", "--limit", "10", "--period", "5s"],
        &["--algo", "sliding-log", "--limit", "10", "--window", "5s"],
    ];
    for algo in algos {
        for policy in ["leaky", "strict"] {
            let what = format!("{} --policy {policy}", algo.join(" "));
            let with = |extra: &[&str]| {
                let mut args = algo.to_vec();
                args.extend(["--policy", policy]);
                args.extend(extra);
                replay_ok(&args, &trace)
            };
            let papaya = with(&[]);
            assert_eq!(papaya.lines().len(), 2000, "{what}");
            for extra in [
                &["--store", "compact"][..],
                &[
                    "--store",
                    "compact",
                    "--variant",
                    "mutex",
                    "--max-keys",
                    "100",
                ],
            ] {
                let compact = with(extra);
                assert_eq!(papaya.stdout, compact.stdout, "{what} {extra:?}");
            }
        }
    }
}

// Pins G7.
#[test]
fn earrrl_trace_prints_rates_and_first_denies_request_18() {
    let trace: String = (0..40u64)
        .map(|k| format!("{}.{:02} client\n", k / 4, k % 4 * 25))
        .collect();
    let run = replay_ok(
        &["--algo", "earrrl", "--half-life", "2s", "--limit", "3/s"],
        &trace,
    );
    let lines = run.lines();
    assert_eq!(lines.len(), 40);
    let rate = |line: &str| -> f64 {
        let r = line.split(' ').find_map(|f| f.strip_prefix("rate="));
        r.unwrap_or_else(|| panic!("no rate in `{line}`"))
            .parse()
            .unwrap()
    };
    assert_eq!(lines[0], "allow retry_after=0 rate=0");
    // The DESIGN §3.2 vector.
    for (k, want) in [
        (1, 0.317809383554),
        (2, 0.609241873242),
        (8, 1.914607625636),
        (18, 3.024221906765),
    ] {
        let got = rate(lines[k]);
        assert!(
            ((got - want) / want).abs() < 1e-11,
            "request {k}: rate {got}, want {want}"
        );
    }
    assert_eq!(lines.iter().position(|l| l.starts_with("deny")), Some(18));
    assert!(
        lines[18].starts_with("deny retry_after=0."),
        "{}",
        lines[18]
    );
}

#[test]
fn a_malformed_line_stops_the_replay_after_printing_the_lines_before_it() {
    let run = replay(GCRA_10_BURST_5, "0 a\n0.1 b\n0.2\n0.3 a\n");
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("line 3"), "{}", run.stderr);
    assert_eq!(run.lines().len(), 2, "{}", run.stdout);
    for (input, what) in [
        ("0 a\nsoon a\n", "bad time"),
        ("0 a\n1 a 1 extra\n", "extra field"),
        ("0 a\n1 a one\n", "bad cost"),
        ("1 a\n0.5 a\n", "time going backwards"),
    ] {
        let run = replay(GCRA_10_BURST_5, input);
        assert_eq!(run.code, 2, "{what}");
        assert!(run.stderr.contains("line 2"), "{what}: {}", run.stderr);
        assert_eq!(run.lines().len(), 1, "{what}");
    }
}

#[test]
fn comments_blank_lines_and_times_are_read_exactly() {
    // GCRA 10/s burst 1 admits one request every 100 ms exactly: 1 ns early is denied (for
    // 1 ns). Digits past the ninth decimal are dropped, not rounded.
    let input = "# comment\n\n   # indented comment\n0 a\n0.1 a\n0.2 a\n0.299999999 a\n0.3 a\n\
                 0.3999999999 a\n";
    let run = replay_ok(&["--algo", "gcra", "--rate", "10/s", "--burst", "1"], input);
    assert_eq!(
        run.lines(),
        [
            "allow retry_after=0 remaining=0",
            "allow retry_after=0 remaining=0",
            "allow retry_after=0 remaining=0",
            "deny retry_after=0.000000001 remaining=0",
            "allow retry_after=0 remaining=0",
            "deny retry_after=0.000000001 remaining=0",
        ]
    );
}

#[test]
fn bad_options_exit_2_and_name_the_option() {
    let run = replay(&["--algo", "gcra", "--rate", "0/s"], "0 a\n");
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--rate"), "{}", run.stderr);
    assert_eq!(run.stdout, "");

    let run = replay(&["--algo", "sliding-sausage", "--rate", "10/s"], "0 a\n");
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--algo"), "{}", run.stderr);

    for (args, option) in [
        (&["--algo", "gcra"][..], "--rate"),
        (
            &["--algo", "gcra", "--rate", "10/s", "--burst", "0"],
            "--burst",
        ),
        (
            &["--algo", "gcra", "--rate", "10/s", "--period", "1s"],
            "--period",
        ),
        (
            &["--algo", "earrrl", "--half-life", "ten", "--limit", "1/s"],
            "--half-life",
        ),
        (
            &["--algo", "exponential", "--limit", "0", "--period", "1s"],
            "--limit",
        ),
        (
            &["--algo", "gcra", "--rate", "10/s", "--policy", "lax"],
            "--policy",
        ),
        (
            &["--algo", "gcra", "--rate", "10/s", "--variant", "rwlock"],
            "--variant",
        ),
        (
            &["--algo", "gcra", "--rate", "10/s", "--store", "redis"],
            "--store",
        ),
        (
            &["--algo", "gcra", "--rate", "10/s", "--max-keys", "10"],
            "--max-keys",
        ),
        (
            &[
                "--algo",
                "gcra",
                "--rate",
                "10/s",
                "--store",
                "compact",
                "--max-keys",
                "0",
            ],
            "--max-keys",
        ),
        (
            &["--algo", "fixed-window", "--limit", "3", "--window", "0s"],
            "--window",
        ),
        (&["--algo", "fixed-window", "--limit", "3"], "--window"),
        (
            &["--algo", "sliding-log", "--limit", "0", "--window", "1s"],
            "--limit",
        ),
        (
            &[
                "--algo",
                "sliding-window",
                "--limit",
                "2.5",
                "--window",
                "1s",
            ],
            "--limit",
        ),
        (
            &[
                "--algo",
                "fixed-window",
                "--limit",
                "1000000",
                "--window",
                "1ms",
            ],
            "--limit",
        ),
        (
            &[
                "--algo",
                "sliding-window",
                "--limit",
                "3",
                "--window",
                "1s",
                "--bias",
                "up",
            ],
            "--bias",
        ),
        (
            &[
                "--algo",
                "sub-window",
                "--limit",
                "3",
                "--window",
                "60s",
                "--buckets",
                "0",
            ],
            "--buckets",
        ),
        (
            &[
                "--algo",
                "sub-window",
                "--limit",
                "3",
                "--window",
                "10ns",
                "--buckets",
                "11",
            ],
            "--buckets",
        ),
        (
            &[
                "--algo",
                "sub-window",
                "--limit",
                "3",
                "--window",
                "60s",
                "--bias",
                "lax",
            ],
            "--bias",
        ),
        (
            &[
                "--algo",
                "fixed-window",
                "--limit",
                "3",
                "--window",
                "60s",
                "--buckets",
                "6",
            ],
            "--buckets",
        ),
    ] {
        let run = replay(args, "0 a\n");
        assert_eq!(run.code, 2, "{args:?}");
        assert!(run.stderr.contains(option), "{args:?}: {}", run.stderr);
    }
}

#[test]
fn costs_the_limiter_refuses_exit_2_with_the_line_number() {
    for (cost, message) in [("0", "at least 1"), ("6", "exceeds the capacity 5")] {
        let run = replay(GCRA_10_BURST_5, &format!("0 a\n0 a 5\n0.5 a {cost}\n"));
        assert_eq!(run.code, 2);
        assert!(run.stderr.contains("line 3"), "{}", run.stderr);
        assert!(run.stderr.contains(message), "{}", run.stderr);
        assert_eq!(run.lines().len(), 2);
    }
}

#[test]
fn help_prints_usage_and_exits_0() {
    let run = replay(&["--help"], "");
    assert_eq!(run.code, 0);
    assert!(run.stdout.contains("--algo"), "{}", run.stdout);
}
