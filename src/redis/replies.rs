//! Reading the scripts' replies: decisions, and the `NOSCRIPT` that asks for the script again.

use super::BackendError;
use crate::decision::Decision;
use ::redis::Value;
use std::time::Duration;

/// `NOSCRIPT` (after a `SCRIPT FLUSH` or a failover) in a pipeline's replies: the script must
/// be loaded again. (A single call's is redis-rs' `ScriptInvocation`'s to handle.)
fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// The requests of a pipelined batch that got `NOSCRIPT` (after a `SCRIPT FLUSH`): they were
/// not run. Their indices in the batch.
pub(super) fn noscript_indices(values: &[Value]) -> Vec<usize> {
    (0..values.len())
        .filter(|&i| is_noscript(&values[i]))
        .collect()
}

/// Builds the [`Decision`] from one algorithm's reply (a leaf of the script); times in units
/// of `unit_ns` nanoseconds.
/// Server errors were taken out by [`ClientCore::decode`](super::client::ClientCore::decode).
pub(super) fn decision(v: Value, unit_ns: f64) -> Result<Decision, BackendError> {
    let bad = || BackendError::Reply(format!("{v:?}"));
    let Value::Array(items) = &v else {
        return Err(bad());
    };
    let [allowed, retry, remaining, reset, rate] = items.as_slice() else {
        return Err(bad());
    };
    let allowed = matches!(allowed, Value::Int(1));
    let field = |x: &Value| -> Result<Option<f64>, BackendError> {
        match x {
            Value::BulkString(b) if b.is_empty() => Ok(None),
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .map(Some)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    };
    // Rounded up: a retry_after from µs arithmetic stays honest in ns. `as` saturates.
    let ns = |x: f64| (x * unit_ns).ceil() as u64;
    let mut d = if allowed {
        Decision::allowed()
    } else {
        Decision::denied(Duration::from_nanos(field(retry)?.map_or(0, ns)))
    };
    if let Some(r) = field(remaining)? {
        d = d.with_remaining(r as u64);
    }
    if let Some(r) = field(reset)? {
        d = d.with_reset_after(Duration::from_nanos(ns(r)));
    }
    if let Some(r) = field(rate)? {
        d = d.with_rate(r);
    }
    Ok(d)
}
