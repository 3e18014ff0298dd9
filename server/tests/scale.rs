//! 10,000 rules in a real process, in memory, on Redis and on the fleet limiter: the same
//! threads as 10 rules (limiters are shared per class of rules, swept by one thread), a few KB each while idle (measured), and a reload of
//! all 10,000 under traffic that keeps every unchanged rule's state.

mod common;

use std::time::{Duration, Instant};

use common::{check, metrics, server, Scratch};

/// `n` rules in one domain, over the algorithms and units a real configuration mixes; rule
/// `k1` has `k1_limit` a day.
fn rules(n: usize, k1_limit: u32) -> String {
    let mut text = String::from("domain: s\ndescriptors:\n");
    for i in 0..n {
        let rate = match i % 5 {
            _ if i == 1 => format!("{{unit: day, requests_per_unit: {k1_limit}}}"),
            0 => format!("{{unit: hour, requests_per_unit: {}}}", 100 + i),
            1 => format!("{{unit: minute, requests_per_unit: {}}}", 10 + i),
            2 => format!(
                "{{unit: day, requests_per_unit: {}, algorithm: gcra}}",
                50 + i
            ),
            3 => format!(
                "{{unit: second, requests_per_unit: {}, algorithm: sliding_window}}",
                5 + i
            ),
            _ => format!(
                "{{unit: hour, requests_per_unit: {}, algorithm: earrrl}}",
                20 + i
            ),
        };
        text.push_str(&format!("  - key: k{i}\n    rate_limit: {rate}\n"));
    }
    text
}

/// A field of `/proc/PID/status` (Threads, VmRSS in KiB).
fn status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn sample(http: u16, name: &str) -> Option<u64> {
    metrics(http)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// Threads and resident KiB of a server on `n` rules, after one request to each of 10 rules.
fn measure(n: usize, args: &[&str]) -> (u64, u64) {
    let dir = Scratch::new(&format!("scale-{n}"));
    let config = dir.write("s.yaml", &rules(n, 5));
    let mut args = args.to_vec();
    args.extend(["--threads", "2"]);
    let mut srv = server(&config, &args);
    for i in 0..10 {
        assert_eq!(check(srv.http, "s", &format!("k{i}"), "v"), 200);
    }
    let pid = srv.proc.0.id();
    let measured = (status(pid, "Threads:"), status(pid, "VmRSS:"));
    assert!(srv.proc.terminate());
    measured
}

// Pins G75.
#[test]
fn ten_thousand_rules_run_on_the_threads_of_ten_a_few_kb_each() {
    let (threads_10, rss_10) = measure(10, &[]);
    let (threads_10k, rss_10k) = measure(10_000, &[]);
    let per_rule = (rss_10k.saturating_sub(rss_10) * 1024) / 9_990;
    eprintln!(
        "memory backend: 10 rules {threads_10} threads {rss_10} KiB; 10,000 rules {threads_10k} threads {rss_10k} KiB: {per_rule} bytes a rule"
    );
    assert_eq!(threads_10k, threads_10);
    assert!(per_rule <= 4096, "{per_rule} bytes a rule");

    let Some(redis) = common::redis() else {
        return;
    };
    let url = redis.url();
    // The fleet limiter too: a limiter per class (three threads and two connections each),
    // each request bringing its rule's quota.
    for backend in ["redis", "hybrid"] {
        let args = ["--backend", backend, "--redis-url", url.as_str()];
        let (threads_10, rss_10) = measure(10, &args);
        let (threads_10k, rss_10k) = measure(10_000, &args);
        let per_rule = (rss_10k.saturating_sub(rss_10) * 1024) / 9_990;
        eprintln!(
            "{backend} backend: 10 rules {threads_10} threads {rss_10} KiB; 10,000 rules {threads_10k} threads {rss_10k} KiB: {per_rule} bytes a rule"
        );
        assert_eq!(threads_10k, threads_10, "{backend}");
        assert!(per_rule <= 4096, "{backend}: {per_rule} bytes a rule");
    }
}

// A reload of all 10,000 rules while a client keeps checking one of them: the unchanged
// rule's count goes on exactly across it (100 admitted of 300, never 100 more), and the one
// rule whose limit changed starts fresh under its new limit.
// Pins G75.
#[test]
fn a_reload_of_ten_thousand_rules_under_traffic_keeps_the_unchanged_rules_state() {
    let dir = Scratch::new("scale-reload");
    let config = dir.write("s.yaml", &rules(10_000, 5));
    let srv = server(&config, &["--reload-ms", "0"]);
    // k0: 100 an hour. Spend k1's 5 before the reload.
    let k1: Vec<u16> = (0..6).map(|_| check(srv.http, "s", "k1", "v")).collect();
    assert_eq!(k1, [200, 200, 200, 200, 200, 429]);
    let http = srv.http;
    let traffic = std::thread::spawn(move || {
        (0..300)
            .filter(|_| check(http, "s", "k0", "v") == 200)
            .count()
    });
    std::thread::sleep(Duration::from_millis(50));
    std::fs::write(&config, rules(10_000, 6)).unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-HUP", &srv.proc.0.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sample(srv.http, "hotlimit_config_load_success_total ") != Some(2) {
        assert!(Instant::now() < deadline, "the reload never landed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(traffic.join().unwrap(), 100);
    // k1 changed (5 → 6 a day): fresh, its 6.
    let k1: Vec<u16> = (0..7).map(|_| check(srv.http, "s", "k1", "v")).collect();
    assert_eq!(k1, [200, 200, 200, 200, 200, 200, 429]);
}
