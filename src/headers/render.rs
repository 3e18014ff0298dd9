//! Rendering one decision's header fields, on the stack where they fit.

use super::{
    ceil_secs, Buf, Draft, RateLimitHeaders, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::decision::Decision;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::HeaderMap;
use std::fmt;

/// The header fields of one decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fields {
    pub(super) decision: Decision,
    pub(super) headers: RateLimitHeaders,
    pub(super) retry_after: bool,
}

impl Fields {
    /// Adds the fields to `headers`.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        self.render(|name, value, list| {
            // Lists are appended, so nested limits add their policies to one list, as the
            // draft allows; the other fields have one value.
            if list {
                headers.append(name, value);
            } else {
                headers.insert(name, value);
            }
        });
    }

    /// The `t` of `RateLimit`, in nanoseconds: see the module docs.
    pub(super) fn t_nanos(&self) -> Option<u64> {
        let d = &self.decision;
        let reset = d.reset_after()?;
        let reset = u64::try_from(reset.as_nanos()).unwrap_or(u64::MAX);
        // A denial's `t` is its wait in every draft: `Retry-After` must not be earlier.
        if d.is_denied() {
            return Some(d.retry_after_nanos());
        }
        Some(match self.headers.draft {
            Draft::Ietf07 | Draft::Ietf09 => reset,
            Draft::Ietf10 => match self.headers.quota.and_then(|q| q.refill_interval()) {
                // An allowed GCRA state is at most a burst ahead, and the next unit comes
                // back when `reset` is a whole number of units again.
                Some(t) if reset > 0 => {
                    let t = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1);
                    (reset - 1) % t + 1
                }
                _ => reset,
            },
        })
    }

    /// Calls `emit` with each field, in order: `Retry-After`, `RateLimit-Policy`,
    /// `RateLimit`, the legacy fields.
    /// `emit`'s third argument says whether the field is a list (the two IETF fields).
    pub(super) fn render(&self, mut emit: impl FnMut(HeaderName, HeaderValue, bool)) {
        let d = &self.decision;
        let h = &self.headers;
        if self.retry_after {
            // Honest: never earlier than the limiter's wait, and a denial never says 0.
            emit(
                RETRY_AFTER,
                HeaderValue::from(ceil_secs(d.retry_after()).max(1)),
                false,
            );
        }
        let t = self.t_nanos().map(|ns| ns.div_ceil(1_000_000_000));
        let ietf07 = h.draft == Draft::Ietf07;
        if let Some(q) = h.quota {
            emit(
                RATELIMIT_POLICY,
                header_value(|b| {
                    if !ietf07 {
                        b.push(b"\"")?;
                        b.push(q.name().as_bytes())?;
                        b.push(b"\";q=")?;
                    }
                    b.push_u64(q.quota())?;
                    b.push(b";w=")?;
                    b.push_u64(q.window_secs())?;
                    match q.burst() {
                        Some(burst) => {
                            b.push(if ietf07 {
                                b";burst="
                            } else {
                                b";hotlimit-burst="
                            })?;
                            b.push_u64(burst)
                        }
                        None => Ok(()),
                    }
                }),
                true,
            );
        }
        if let Some(r) = d.remaining() {
            let value = if ietf07 {
                header_value(|b| {
                    if let Some(q) = h.quota {
                        b.push(b"limit=")?;
                        b.push_u64(q.quota())?;
                        b.push(b", ")?;
                    }
                    b.push(b"remaining=")?;
                    b.push_u64(r)?;
                    match t {
                        Some(t) => {
                            b.push(b", reset=")?;
                            b.push_u64(t)
                        }
                        None => Ok(()),
                    }
                })
            } else {
                let name = h.quota.map_or("default", |q| q.name());
                header_value(|b| {
                    b.push(b"\"")?;
                    b.push(name.as_bytes())?;
                    b.push(b"\";r=")?;
                    b.push_u64(r)?;
                    match t {
                        Some(t) => {
                            b.push(b";t=")?;
                            b.push_u64(t)
                        }
                        None => Ok(()),
                    }
                })
            };
            emit(RATELIMIT, value, true);
        }
        if h.legacy {
            if let Some(q) = h.quota {
                emit(X_RATELIMIT_LIMIT, HeaderValue::from(q.quota()), false);
            }
            if let Some(r) = d.remaining() {
                emit(X_RATELIMIT_REMAINING, HeaderValue::from(r), false);
            }
            if let Some(reset) = d.reset_after() {
                emit(
                    X_RATELIMIT_RESET,
                    HeaderValue::from(ceil_secs(reset)),
                    false,
                );
            }
        }
    }
}

/// A header value written by `write` (ASCII names, punctuation, digits): on the stack, so
/// the value's own buffer is the one allocation, and on the heap if it does not fit.
fn header_value(write: impl Fn(&mut dyn Sink) -> fmt::Result) -> HeaderValue {
    let mut buf = Buf::<128>::new();
    let value = match write(&mut buf) {
        Ok(()) => HeaderValue::from_bytes(buf.as_bytes()),
        Err(_) => {
            // A long policy name.
            let mut heap = Vec::new();
            let _ = write(&mut heap);
            HeaderValue::from_bytes(&heap)
        }
    };
    // The policy name is validated printable ASCII, the rest digits: this cannot fail, but an
    // empty value is better than a panic if it ever did.
    value.unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Where [`header_value`] writes: the stack buffer, or a `Vec` when that is too small.
trait Sink {
    fn push(&mut self, bytes: &[u8]) -> fmt::Result;
    fn push_u64(&mut self, n: u64) -> fmt::Result;
}

impl<const N: usize> Sink for Buf<N> {
    fn push(&mut self, bytes: &[u8]) -> fmt::Result {
        Buf::push(self, bytes)
    }

    fn push_u64(&mut self, n: u64) -> fmt::Result {
        Buf::push_u64(self, n)
    }
}

impl Sink for Vec<u8> {
    fn push(&mut self, bytes: &[u8]) -> fmt::Result {
        self.extend_from_slice(bytes);
        Ok(())
    }

    fn push_u64(&mut self, n: u64) -> fmt::Result {
        let mut b = Buf::<20>::new();
        b.push_u64(n)?;
        self.extend_from_slice(b.as_bytes());
        Ok(())
    }
}
