//! Rate-limit response headers over [`http`](https://docs.rs/http) types: the one renderer of
//! `Retry-After`, the IETF `RateLimit-Policy` / `RateLimit` fields, the legacy
//! `X-RateLimit-*` fields and the enforce / dry-run / shadow semantics, used by the tower
//! layer and by any other server or proxy (the pingora example in `examples/pingora`).
//! Enabled by the `http` feature (which `tower` turns on).
//!
//! ```
//! use hotlimit::{algo::Gcra, headers::{Action, RateLimitHeaders}, CasLimiter, ManualClock, RateLimiter};
//! use http::{HeaderMap, StatusCode};
//!
//! let limiter = CasLimiter::<String, Gcra, _>::with_clock("100/s burst 10".parse()?, ManualClock::default());
//! let headers = RateLimitHeaders::for_limiter(&limiter);
//! for _ in 0..10 {
//!     assert_eq!(headers.verdict(limiter.check("alice")).action, Action::Pass);
//! }
//! let verdict = headers.verdict(limiter.check("alice"));
//! assert_eq!(verdict.action, Action::Answer(StatusCode::TOO_MANY_REQUESTS));
//! let mut map = HeaderMap::new();
//! verdict.apply(&mut map);
//! assert_eq!(map["retry-after"], "1"); // 10 ms, rounded up to whole seconds
//! // The sustained rate, 100 per second, and the burst, 10.
//! assert_eq!(map["ratelimit-policy"], r#""default";q=100;w=1;hotlimit-burst=10"#);
//! assert_eq!(map["ratelimit"], r#""default";r=0;t=1"#);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The fields
//!
//! They follow the newest draft-ietf-httpapi-ratelimit-headers by default
//! ([`Draft::Ietf10`]); [`RateLimitHeaders::draft`] picks an older one, since the draft
//! still changes:
//!
//! | field | [`Draft::Ietf10`] (default), [`Draft::Ietf09`] | [`Draft::Ietf07`] |
//! |---|---|---|
//! | `Retry-After` (denials only) | whole seconds, rounded up, at least 1 | the same |
//! | `RateLimit-Policy` | `"<name>";q=<quota>;w=<window s>[;hotlimit-burst=<burst>]` | `<quota>;w=<window s>[;burst=<burst>]` |
//! | `RateLimit` | `"<name>";r=<remaining>;t=<seconds>` | `limit=<quota>, remaining=<remaining>, reset=<seconds>` |
//! | `X-RateLimit-Limit` (legacy, opt-in) | the quota | the same |
//! | `X-RateLimit-Remaining` (legacy, opt-in) | remaining | the same |
//! | `X-RateLimit-Reset` (legacy, opt-in) | seconds until the quota is whole again (a delay, not a timestamp) | the same |
//!
//! **The policy is the sustained rate** ([`AdvertisedQuota`], [`QuotaPolicy::rate`]): GCRA
//! at `100/s burst 10` advertises `q=100;w=1`, so a client that spaces its requests `w/q`
//! apart gets the whole rate and no 429; the burst, which the draft has no parameter for,
//! goes out as the vendor parameter `hotlimit-burst` (the draft asks for vendor-prefixed
//! extra parameters; draft 07's own examples call it `burst`).
//!
//! **`t`** is, in draft 10, "the number of seconds until additional quota is made available";
//! in drafts 09 and 07, until the quota resets. Both are rounded up to whole seconds (the
//! draft has no fractions), so `t` is never early: a client that waits `t` finds more quota.
//! In draft 10 it is the time to the next unit for GCRA ([`QuotaPolicy::refilling_every`])
//! and to the window's end for the fixed window; otherwise the time until the key's state is
//! fresh (the sliding algorithms return quota gradually, and their decisions do not say when
//! the next unit comes: that is the earliest moment the limiter vouches for, so a client that
//! waits out every `r=0` on a sliding window counter gets about half its rate; pacing by the
//! policy gets all of it). On a denial, in every draft, `t` is the denial's wait, so
//! `Retry-After` is never earlier than `t`, as the draft asks. A field whose value the
//! algorithm does not know is left out (EARRRL and exponential know no `remaining`, so they
//! send no `RateLimit`).
//!
//! The two IETF fields are lists and are appended, so nested limits (per IP, then per API key)
//! advertise both policies; give them distinct names ([`QuotaPolicy::named`]).
//!
//! # When headers go out
//!
//! [`RateLimitHeaders::verdict`] turns a [`Decision`] into a [`Verdict`]: what to answer and
//! which fields to send, by [`Mode`]:
//!
//! | mode | denied | allowed |
//! |---|---|---|
//! | [`Mode::Enforce`] | 429 with `Retry-After` and the fields | pass; the fields if [`RateLimitHeaders::on_allowed`] |
//! | [`Mode::DryRun`] | pass, with the fields (that is how a dry run reports) | pass, with the fields |
//! | [`Mode::Shadow`] | pass, no fields (they would tip the client off); [`Action::Shadow`] tells the application | pass; the fields if `on_allowed` |

mod buf;
mod quota;
mod render;
#[cfg(test)]
mod tests;
mod verdict;

pub(crate) use buf::Buf;
pub(crate) use quota::ceil_secs;
pub use quota::{AdvertisedQuota, InvalidPolicyName, QuotaPolicy};
pub(crate) use render::Fields;
pub use verdict::{Action, HeaderField, RateLimitHeaders, Verdict};

#[cfg(doc)]
use crate::decision::Decision;
use http::header::HeaderName;
use std::fmt;

/// `RateLimit-Policy`, from draft-ietf-httpapi-ratelimit-headers.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`, from draft-ietf-httpapi-ratelimit-headers.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The legacy `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// The legacy `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// The legacy `X-RateLimit-Reset` (seconds from now, not a timestamp).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Which revision of draft-ietf-httpapi-ratelimit-headers the fields follow.
///
/// # Examples
///
/// ```
/// use hotlimit::headers::Draft;
///
/// assert_eq!(Draft::default(), Draft::Ietf10);
/// assert_eq!("draft-09".parse::<Draft>(), Ok(Draft::Ietf09));
/// assert_eq!(Draft::Ietf07.to_string(), "draft-07");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Draft {
    /// Draft 07: `RateLimit-Policy: 100;w=1;burst=10` and the dictionary
    /// `RateLimit: limit=100, remaining=9, reset=1` (`reset`: until the quota resets). Many
    /// clients still parse this form.
    Ietf07,
    /// Draft 09: the named `"default";q=..;w=..` / `"default";r=..;t=..` pair, `t` the seconds
    /// until the quota resets (whole again).
    Ietf09,
    /// Draft 10, the newest: as draft 09, but `t` is the seconds until additional quota is
    /// made available.
    #[default]
    Ietf10,
}

impl fmt::Display for Draft {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Draft::Ietf07 => "draft-07",
            Draft::Ietf09 => "draft-09",
            Draft::Ietf10 => "draft-10",
        })
    }
}

impl std::str::FromStr for Draft {
    type Err = String;

    /// `draft-07`, `draft-09` or `draft-10` (or just the number).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.strip_prefix("draft-").unwrap_or(s) {
            "07" | "7" => Ok(Draft::Ietf07),
            "09" | "9" => Ok(Draft::Ietf09),
            "10" => Ok(Draft::Ietf10),
            _ => Err(format!(
                "unknown draft `{s}` (expected draft-07, draft-09 or draft-10)"
            )),
        }
    }
}

/// What a limiter's decision does to a request.
///
/// # Examples
///
/// ```
/// use hotlimit::headers::Mode;
///
/// assert_eq!("dry-run".parse::<Mode>(), Ok(Mode::DryRun));
/// assert_eq!(Mode::Shadow.to_string(), "shadow");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Deny: answer `429 Too Many Requests` without calling the service behind.
    #[default]
    Enforce,
    /// Never deny: every request goes through, and its response carries the rate-limit
    /// headers of the decision; for trying a limit on live traffic.
    DryRun,
    /// Let every request through and leave the choice to the application ([`Action::Shadow`]),
    /// which can, say, answer 200 but drop the side effect (a shadow ban). Denied requests get
    /// no rate-limit headers (they would tip the client off); allowed ones get them when
    /// [`RateLimitHeaders::on_allowed`] is set.
    Shadow,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Enforce => "enforce",
            Mode::DryRun => "dry-run",
            Mode::Shadow => "shadow",
        })
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "enforce" => Ok(Mode::Enforce),
            "dry-run" => Ok(Mode::DryRun),
            "shadow" => Ok(Mode::Shadow),
            other => Err(format!(
                "unknown mode `{other}` (expected enforce, dry-run or shadow)"
            )),
        }
    }
}
