//! The load test's output: the table for people, the JSON for tools.

use super::*;

/// The rows as one JSON array.
pub(super) fn json(args: &Args, threads: usize, rows: &[Row]) -> String {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "variant": r.variant.name(),
                "store": args.store.name(),
                "clock": args.clock.name(),
                "algo": args.algo.name(),
                "threads": threads,
                "keys": args.keys,
                "dist": args.dist.to_string(),
                "mops": r.mops(),
                "ns_per_op": r.ns_per_op(),
                "p50_ns": r.latency.value_at_quantile(0.50),
                "p99_ns": r.latency.value_at_quantile(0.99),
                "p999_ns": r.latency.value_at_quantile(0.999),
                "retries_per_op": r.retries_per_op().unwrap_or(0.0),
                "allowed_pct": r.allowed_pct(),
            })
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// The rows as a plain aligned table, with a header naming the run's parameters.
pub(super) fn table(args: &Args, threads: usize, requests: u64, rows: &[Row]) -> String {
    let cas = rows
        .iter()
        .find(|r| r.variant == VariantName::Cas)
        .map(Row::mops);
    let mut out = format!(
        "algo={} ({} per key), store={}, clock={}, threads={}, keys={}, dist={}, abusive={} (from {} key(s)), requests/thread={}\n",
        args.algo.name(),
        args.algo.quota(),
        args.store.name(),
        args.clock.name(),
        threads,
        args.keys,
        args.dist,
        args.abusive,
        ABUSIVE_KEYS.min(args.keys),
        requests,
    );
    let header = [
        "variant",
        "Mops/s",
        "ns/op",
        "p50 ns",
        "p99 ns",
        "p99.9 ns",
        "retries/op",
        "allowed %",
        "vs CAS",
    ];
    let mut cells: Vec<[String; 9]> = vec![header.map(String::from)];
    for r in rows {
        cells.push([
            r.variant.name().to_string(),
            format!("{:.2}", r.mops()),
            format!("{:.1}", r.ns_per_op()),
            r.latency.value_at_quantile(0.50).to_string(),
            r.latency.value_at_quantile(0.99).to_string(),
            r.latency.value_at_quantile(0.999).to_string(),
            r.retries_per_op()
                .map_or_else(|| "-".to_string(), retries_cell),
            format!("{:.2}", r.allowed_pct()),
            cas.map_or_else(|| "-".to_string(), |c| format!("{:.2}", r.mops() / c)),
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
