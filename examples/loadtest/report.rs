//! The load test's output: the table for people, the JSON for tools.

use super::*;
use serde_json::{json, Value};

/// A finished load test: the parameters it ran with and one row per variant.
pub(super) struct Report<'a> {
    pub(super) args: &'a Args,
    pub(super) threads: usize,
    /// Checks per thread in each throughput pass.
    pub(super) requests: u64,
    /// Checks per thread in each latency pass (0: none).
    pub(super) latency_requests: u64,
    /// The median reading of an empty timed pair: what the timer adds to each latency value.
    pub(super) timer_ns: u64,
    /// One row per variant, in `--variants` order.
    pub(super) rows: Vec<Row>,
}

impl Report<'_> {
    /// The rows as one JSON array, each row with its per-round runs.
    pub(super) fn json(&self) -> String {
        let args = self.args;
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let (mops, ns) = (r.mops(), r.ns_per_op());
                let vs_cas = r.vs_cas();
                let rounds: Vec<Value> = r
                    .runs
                    .iter()
                    .enumerate()
                    .map(|(i, run)| {
                        json!({
                            "round": run.round,
                            "position": run.position,
                            "mops": run.mops(),
                            "ns_per_op": run.ns_per_op(),
                            "vs_cas": r.vs_cas.as_ref().map(|v| v[i]),
                            "checks": run.checks,
                            "allowed": run.allowed,
                        })
                    })
                    .collect();
                json!({
                    "variant": r.variant.name(),
                    "store": args.store.name(),
                    "clock": args.clock.name(),
                    "batch": args.batch,
                    "algo": args.algo.name(),
                    "quota": if args.admit_all { "admit-all" } else { "default" },
                    "prefill": args.prefill,
                    "threads": self.threads,
                    "keys": args.keys,
                    "dist": args.dist.to_string(),
                    "abusive": args.abusive,
                    "requests_per_thread": self.requests,
                    "mops": mops.median,
                    "mops_min": mops.min,
                    "mops_max": mops.max,
                    "ns_per_op": ns.median,
                    "ns_per_op_min": ns.min,
                    "ns_per_op_max": ns.max,
                    "vs_cas": vs_cas.map(|s| s.median),
                    "vs_cas_min": vs_cas.map(|s| s.min),
                    "vs_cas_max": vs_cas.map(|s| s.max),
                    "latency_requests_per_thread": self.latency_requests,
                    "latency_samples": r.latency.len(),
                    "timer_overhead_ns": self.timer_ns,
                    "p50_ns": r.latency_at(0.50),
                    "p99_ns": r.latency_at(0.99),
                    "p999_ns": r.latency_at(0.999),
                    "retries_per_op": r.retries_per_op().unwrap_or(0.0),
                    "allowed_pct": r.allowed_pct(),
                    "rounds": rounds,
                })
            })
            .collect();
        Value::Array(rows).to_string()
    }

    /// The rows as a plain aligned table, under three lines: the run's parameters, how
    /// throughput was measured, how latency was sampled.
    pub(super) fn table(&self) -> String {
        let args = self.args;
        let quota = if args.admit_all {
            "admit all: 1000000000/s burst 2^40, the criterion benches' quota".to_string()
        } else {
            format!("{} per key", args.algo.quota())
        };
        let mut out = format!(
            "algo={} ({quota}), store={}, clock={}, threads={}, keys={}, dist={}, abusive={} (from {} key(s)), prefill={}, requests/thread={}, rounds={}\n",
            args.algo.name(),
            args.store.name(),
            args.clock.name(),
            self.threads,
            args.keys,
            args.dist,
            args.abusive,
            ABUSIVE_KEYS.min(args.keys),
            if args.prefill { "yes" } else { "no" },
            self.requests,
            args.rounds,
        );
        out.push_str(&format!(
            "throughput: no timer per check (one clock read per thread before and after its {} checks); median and min-max over {} round(s), each on fresh limiters, the variants interleaved (round r starts at the r-th)\n",
            self.requests, args.rounds,
        ));
        if args.batch > 1 {
            out.push_str(&format!(
                "batch={}: the hotlimit cas and mutex rows' throughput passes call check_batch on slices of {} keys\n",
                args.batch, args.batch,
            ));
        }
        if self.latency_requests == 0 {
            out.push_str("latency: not measured (--latency-requests 0)\n");
        } else {
            out.push_str(&format!(
                "latency: a separate pass after each throughput pass, its first {} checks/thread again on the same limiter, every check timed, all rounds merged; each value includes the timer's own cost: an empty timed pair reads {} ns (p50)\n",
                self.latency_requests, self.timer_ns,
            ));
        }
        let header = [
            "variant",
            "Mops/s",
            "(min-max)",
            "ns/op",
            "(min-max)",
            "p50 ns",
            "p99 ns",
            "p99.9 ns",
            "retries/op",
            "allowed %",
            "vs CAS",
            "(min-max)",
        ];
        let dash = || "-".to_string();
        let mut cells: Vec<[String; 12]> = vec![header.map(String::from)];
        for r in &self.rows {
            let (mops, ns) = (r.mops(), r.ns_per_op());
            let vs_cas = r.vs_cas();
            let latency = |q| r.latency_at(q).map_or_else(dash, |v| v.to_string());
            cells.push([
                r.variant.name().to_string(),
                format!("{:.2}", mops.median),
                format!("{:.2}-{:.2}", mops.min, mops.max),
                format!("{:.1}", ns.median),
                format!("{:.1}-{:.1}", ns.min, ns.max),
                latency(0.50),
                latency(0.99),
                latency(0.999),
                r.retries_per_op().map_or_else(dash, retries_cell),
                format!("{:.2}", r.allowed_pct()),
                vs_cas.map_or_else(dash, |s| format!("{:.2}", s.median)),
                vs_cas.map_or_else(dash, |s| format!("{:.2}-{:.2}", s.min, s.max)),
            ]);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| cells.iter().map(|row| row[c].len()).max().unwrap_or(0))
            .collect();
        for row in &cells {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c == 0 {
                    line.push_str(&format!("{cell:<w$}", w = widths[c]));
                } else {
                    line.push_str(&format!("  {cell:>w$}", w = widths[c]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Retries per check: rare, so small values keep their digits (`3.1e-6`).
fn retries_cell(x: f64) -> String {
    if x == 0.0 {
        "0".to_string()
    } else if x >= 0.001 {
        format!("{x:.4}")
    } else {
        format!("{x:.1e}")
    }
}
