//! Rate-limit response headers over [`http`](https://docs.rs/http) types: the one renderer of
//! `Retry-After`, the IETF `RateLimit-Policy` / `RateLimit` fields, the legacy
//! `X-RateLimit-*` fields and the enforce / dry-run / shadow semantics, used by the tower
//! layer and by any other server or proxy (the pingora example in `examples/pingora`).
//! Enabled by the `http` feature (which `tower` turns on).
//!
//! ```
//! use hotlimit::{algo::Gcra, headers::RateLimitHeaders, CasLimiter, ManualClock};
//! use http::{HeaderMap, StatusCode};
//!
//! let limiter = CasLimiter::<String, Gcra>::with_clock("100/s burst 10".parse()?, ManualClock::new());
//! let headers = RateLimitHeaders::for_limiter(&limiter);
//! for _ in 0..10 {
//!     assert!(!headers.verdict(limiter.check("alice")).deny());
//! }
//! let verdict = headers.verdict(limiter.check("alice"));
//! assert_eq!(verdict.status(), Some(StatusCode::TOO_MANY_REQUESTS));
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
//! ([`Draft::Ietf10`]); [`RateLimitHeaders::with_draft`] picks an older one, since the draft
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
//! | [`Mode::Enforce`] | 429 with `Retry-After` and the fields | pass; the fields if [`RateLimitHeaders::with_on_allowed`] |
//! | [`Mode::DryRun`] | pass, with the fields (that is how a dry run reports) | pass, with the fields |
//! | [`Mode::Shadow`] | pass, no fields (they would tip the client off); [`Verdict::shadow`] tells the application | pass; the fields if `with_on_allowed` |

mod buf;
mod quota;

pub(crate) use buf::Buf;
pub(crate) use quota::ceil_secs;
pub use quota::{AdvertisedQuota, InvalidPolicyName, QuotaPolicy};

use crate::decision::Decision;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
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
    /// Let every request through and leave the choice to the application ([`Verdict::shadow`]),
    /// which can, say, answer 200 but drop the side effect (a shadow ban). Denied requests get
    /// no rate-limit headers (they would tip the client off); allowed ones get them when
    /// [`RateLimitHeaders::with_on_allowed`] is set.
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

/// How decisions become responses and header fields: the policy, the draft, the mode, legacy
/// fields, fields on allowed responses. Small and `Copy`; build it once.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::FixedWindow, CasLimiter, ManualClock, RateLimiter};
/// use hotlimit::headers::{Draft, Mode, RateLimitHeaders};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = CasLimiter::<String, _>::with_clock(FixedWindow::new(2, Duration::from_secs(60))?, clock.clone());
/// let headers = RateLimitHeaders::for_limiter(&limiter)
///     .with_draft(Draft::Ietf07)
///     .with_mode(Mode::DryRun);
/// limiter.check_n("alice", 2)?;
/// clock.advance(Duration::from_secs(15));
/// let verdict = headers.verdict(limiter.check("alice"));
/// assert!(!verdict.deny()); // a dry run never denies...
/// let fields: Vec<_> = verdict.fields().map(|f| format!("{}: {}", f.name, f.value.to_str().unwrap())).collect();
/// assert_eq!(fields, ["ratelimit-policy: 2;w=60", "ratelimit: limit=2, remaining=0, reset=45"]); // ...but reports
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitHeaders {
    quota: Option<QuotaPolicy>,
    draft: Draft,
    mode: Mode,
    legacy: bool,
    on_allowed: bool,
}

impl RateLimitHeaders {
    /// Headers advertising `quota` (`None`: no `RateLimit-Policy` or `X-RateLimit-Limit`),
    /// in [`Mode::Enforce`], the newest draft, without legacy fields, on denials only.
    pub fn new(quota: Option<QuotaPolicy>) -> Self {
        Self {
            quota,
            draft: Draft::default(),
            mode: Mode::Enforce,
            legacy: false,
            on_allowed: false,
        }
    }

    /// [`RateLimitHeaders::new`] with the limiter's own policy ([`AdvertisedQuota`]).
    pub fn for_limiter<L: AdvertisedQuota + ?Sized>(limiter: &L) -> Self {
        Self::new(limiter.advertised_quota())
    }

    /// The same, following `draft` (default: the newest, [`Draft::Ietf10`]).
    pub fn with_draft(self, draft: Draft) -> Self {
        Self { draft, ..self }
    }

    /// The same, in `mode` (default [`Mode::Enforce`]).
    pub fn with_mode(self, mode: Mode) -> Self {
        Self { mode, ..self }
    }

    /// The same, also sending the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (default off).
    pub fn with_legacy(self, on: bool) -> Self {
        Self { legacy: on, ..self }
    }

    /// The same, with the fields on allowed responses too (default off: only denials, and
    /// every response in dry-run, carry them). A client pacing itself needs them.
    pub fn with_on_allowed(self, on: bool) -> Self {
        Self {
            on_allowed: on,
            ..self
        }
    }

    /// The same, advertising `quota` instead.
    pub fn with_quota(self, quota: Option<QuotaPolicy>) -> Self {
        Self { quota, ..self }
    }

    /// The advertised policy.
    pub fn quota(&self) -> Option<QuotaPolicy> {
        self.quota
    }

    /// The draft the fields follow.
    pub fn draft(&self) -> Draft {
        self.draft
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the legacy fields go out.
    pub fn legacy(&self) -> bool {
        self.legacy
    }

    /// Whether allowed responses carry the fields.
    pub fn on_allowed(&self) -> bool {
        self.on_allowed
    }

    /// What to do with a request the limiter decided `decision`: see the
    /// [module docs](self#when-headers-go-out).
    #[inline]
    pub fn verdict(&self, decision: Decision) -> Verdict {
        let fields = |retry_after| {
            Some(Fields {
                decision,
                headers: *self,
                retry_after,
            })
        };
        match self.mode {
            Mode::Enforce if decision.is_denied() => Verdict {
                action: Action::Answer(StatusCode::TOO_MANY_REQUESTS),
                fields: fields(true),
            },
            Mode::Enforce => Verdict {
                action: Action::Pass,
                fields: if self.on_allowed { fields(false) } else { None },
            },
            Mode::DryRun => Verdict {
                action: Action::Pass,
                fields: fields(false),
            },
            Mode::Shadow => Verdict {
                action: Action::Shadow(decision),
                fields: if self.on_allowed && decision.is_allowed() {
                    fields(false)
                } else {
                    None
                },
            },
        }
    }

    /// What to do with a request whose cost exceeds the limiter's capacity (it could never
    /// pass): `413 Content Too Large` with the policy in [`Mode::Enforce`], so the client
    /// learns the quota; let through without fields in the other modes.
    pub fn too_large(&self) -> Verdict {
        match self.mode {
            Mode::Enforce => Verdict {
                action: Action::Answer(StatusCode::PAYLOAD_TOO_LARGE),
                // The policy alone: there is no decision to report.
                fields: self.quota.map(|_| Fields {
                    decision: Decision::allowed(),
                    headers: *self,
                    retry_after: false,
                }),
            },
            Mode::DryRun | Mode::Shadow => Verdict {
                action: Action::Pass,
                fields: None,
            },
        }
    }
}

/// What to do with one request: answer it (429, 413) or let it through, and the header fields
/// for the answer or for the response of the service behind. From
/// [`RateLimitHeaders::verdict`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[must_use]
pub struct Verdict {
    pub(crate) action: Action,
    pub(crate) fields: Option<Fields>,
}

/// What a [`Verdict`] does with the request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Action {
    Pass,
    Shadow(Decision),
    Answer(StatusCode),
}

impl Verdict {
    /// Whether to answer the request yourself ([`Verdict::status`]) instead of passing it on.
    #[inline]
    pub fn deny(&self) -> bool {
        matches!(self.action, Action::Answer(_))
    }

    /// The status to answer with: 429 for a denial in [`Mode::Enforce`], 413 for
    /// [`RateLimitHeaders::too_large`]; `None`: pass the request on.
    #[inline]
    pub fn status(&self) -> Option<StatusCode> {
        match self.action {
            Action::Answer(status) => Some(status),
            Action::Pass | Action::Shadow(_) => None,
        }
    }

    /// In [`Mode::Shadow`], the decision, for the application to act on.
    #[inline]
    pub fn shadow(&self) -> Option<Decision> {
        match self.action {
            Action::Shadow(decision) => Some(decision),
            Action::Pass | Action::Answer(_) => None,
        }
    }

    /// Whether the response gets header fields.
    #[inline]
    pub fn has_fields(&self) -> bool {
        self.fields.is_some()
    }

    /// Adds the header fields to a response's `headers` (the two IETF fields are appended, the
    /// others replace a value already there).
    pub fn apply(&self, headers: &mut HeaderMap) {
        if let Some(fields) = &self.fields {
            fields.apply(headers);
        }
    }

    /// The header fields, for a response type other than [`HeaderMap`] (pingora's
    /// `ResponseHeader`, say): append those whose [`Field::list`] is set, insert the others,
    /// as [`Verdict::apply`] does.
    pub fn fields(&self) -> impl Iterator<Item = Field> {
        let mut out: [Option<Field>; 6] = Default::default();
        if let Some(fields) = &self.fields {
            let mut at = 0;
            fields.render(|name, value, list| {
                out[at] = Some(Field { name, value, list });
                at += 1;
            });
        }
        out.into_iter().flatten()
    }
}

/// One header field of a [`Verdict`], from [`Verdict::fields`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The field's name.
    pub name: HeaderName,
    /// Its value.
    pub value: HeaderValue,
    /// Whether it is a list, to append to a value already there (`RateLimit-Policy` and
    /// `RateLimit`: nested limits add their policies to one list, as the draft allows), rather
    /// than replace it (`Retry-After`, the legacy fields).
    pub list: bool,
}

/// The header fields of one decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fields {
    decision: Decision,
    headers: RateLimitHeaders,
    retry_after: bool,
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
    fn t_nanos(&self) -> Option<u64> {
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
    fn render(&self, mut emit: impl FnMut(HeaderName, HeaderValue, bool)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn render(headers: RateLimitHeaders, decision: Decision) -> Vec<String> {
        let v = headers.verdict(decision);
        let from_iter: Vec<String> = render_verdict(v);
        // `apply` writes the same fields.
        let mut map = HeaderMap::new();
        v.apply(&mut map);
        let from_map: Vec<String> = map
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect();
        assert_eq!(from_iter.len(), from_map.len());
        for f in &from_iter {
            assert!(from_map.contains(f), "{f} not in {from_map:?}");
        }
        from_iter
    }

    #[test]
    fn long_policy_names_still_format() {
        let name = "a-policy-name-long-enough-to-overflow-the-stack-buffer-of-one-hundred-and-twenty-eight-bytes-used-for-header-values";
        let q = QuotaPolicy::new(7, Duration::from_secs(3))
            .named(name)
            .unwrap();
        let headers = RateLimitHeaders::new(Some(q))
            .with_legacy(true)
            .with_on_allowed(true)
            .with_draft(Draft::Ietf09);
        let d = Decision::allowed()
            .with_remaining(2)
            .with_reset_after(1_000_000_001);
        assert_eq!(
            render(headers, d),
            [
                format!("ratelimit-policy: \"{name}\";q=7;w=3"),
                format!("ratelimit: \"{name}\";r=2;t=2"),
                "x-ratelimit-limit: 7".to_owned(),
                "x-ratelimit-remaining: 2".to_owned(),
                "x-ratelimit-reset: 2".to_owned(),
            ]
        );
    }

    #[test]
    fn ceil_secs_rounds_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn every_draft_renders_its_own_syntax() {
        // GCRA 1/s burst 5, three units spent: the next comes back in 0.5 s, all in 2.5 s.
        let q = QuotaPolicy::rate(1, Duration::from_secs(1))
            .with_burst(5)
            .refilling_every(Duration::from_secs(1));
        let d = Decision::allowed()
            .with_remaining(2)
            .with_reset_after(2_500_000_000);
        let h = RateLimitHeaders::new(Some(q)).with_on_allowed(true);
        assert_eq!(
            render(h, d),
            [
                r#"ratelimit-policy: "default";q=1;w=1;hotlimit-burst=5"#,
                r#"ratelimit: "default";r=2;t=1"#
            ]
        );
        assert_eq!(
            render(h.with_draft(Draft::Ietf09), d),
            [
                r#"ratelimit-policy: "default";q=1;w=1;hotlimit-burst=5"#,
                r#"ratelimit: "default";r=2;t=3"#
            ]
        );
        assert_eq!(
            render(h.with_draft(Draft::Ietf07), d),
            [
                "ratelimit-policy: 1;w=1;burst=5",
                "ratelimit: limit=1, remaining=2, reset=3"
            ]
        );
    }

    #[test]
    fn t_of_draft_10_is_the_time_to_more_quota() {
        let s = |n: u64| n * 1_000_000_000;
        let gcra = RateLimitHeaders::new(Some(
            QuotaPolicy::rate(1, Duration::from_secs(2))
                .with_burst(10)
                .refilling_every(Duration::from_secs(2)),
        ))
        .with_on_allowed(true);
        let t = |h: RateLimitHeaders, d: Decision| {
            h.verdict(d)
                .fields
                .unwrap()
                .t_nanos()
                .map(|ns| ns.div_ceil(s(1)))
        };
        // 7 s ahead with a 2 s unit: the next unit in 1 s; exactly 8 s ahead: in 2 s.
        let allowed = |reset| {
            Decision::allowed()
                .with_remaining(3)
                .with_reset_after(reset)
        };
        assert_eq!(t(gcra, allowed(s(7))), Some(1));
        assert_eq!(t(gcra, allowed(s(8))), Some(2));
        assert_eq!(t(gcra, allowed(s(8) + 1)), Some(1));
        assert_eq!(t(gcra, allowed(0)), Some(0));
        // A denial: its retry_after, which Retry-After never undercuts.
        let denied = Decision::denied(1_500_000_000)
            .with_remaining(0)
            .with_reset_after(s(20));
        assert_eq!(t(gcra, denied), Some(2));
        assert_eq!(render(gcra, denied)[..1], ["retry-after: 2".to_owned()]);
        // Without a unit interval (a window), the time until the state is fresh.
        let window = RateLimitHeaders::new(Some(QuotaPolicy::new(10, Duration::from_secs(60))));
        assert_eq!(t(window.with_on_allowed(true), allowed(s(7))), Some(7));
        // No reset known, no t; no remaining known, no RateLimit at all.
        assert_eq!(
            t(
                window.with_on_allowed(true),
                Decision::allowed().with_remaining(1)
            ),
            None
        );
        assert_eq!(
            render(window.with_on_allowed(true), Decision::allowed()),
            [r#"ratelimit-policy: "default";q=10;w=60"#]
        );
    }

    #[test]
    fn modes_decide_what_goes_out() {
        let h = RateLimitHeaders::new(Some(QuotaPolicy::new(10, Duration::from_secs(1))));
        let denied = Decision::denied(300_000_000)
            .with_remaining(0)
            .with_reset_after(900_000_000);
        let allowed = Decision::allowed().with_remaining(4).with_reset_after(1);
        let v = h.verdict(denied);
        assert_eq!(
            (v.deny(), v.status(), v.shadow()),
            (true, Some(StatusCode::TOO_MANY_REQUESTS), None)
        );
        assert_eq!(render(h, denied).len(), 3);
        assert!(!h.verdict(allowed).has_fields());
        assert_eq!(render(h.with_on_allowed(true), allowed).len(), 2);
        let dry = h.with_mode(Mode::DryRun);
        assert!(!dry.verdict(denied).deny());
        assert_eq!(
            render(dry, denied),
            [
                r#"ratelimit-policy: "default";q=10;w=1"#,
                r#"ratelimit: "default";r=0;t=1"#
            ]
        );
        let shadow = h.with_mode(Mode::Shadow).with_on_allowed(true);
        assert_eq!(shadow.verdict(denied).shadow(), Some(denied));
        assert!(!shadow.verdict(denied).deny());
        assert!(render(shadow, denied).is_empty());
        assert_eq!(render(shadow, allowed).len(), 2);
        let big = h.with_legacy(true).too_large();
        assert_eq!(big.status(), Some(StatusCode::PAYLOAD_TOO_LARGE));
        assert_eq!(
            render_verdict(big),
            [
                r#"ratelimit-policy: "default";q=10;w=1"#,
                "x-ratelimit-limit: 10"
            ]
        );
        assert_eq!(dry.too_large().status(), None);
    }

    fn render_verdict(v: Verdict) -> Vec<String> {
        v.fields()
            .map(|f| {
                assert_eq!(f.list, f.name.as_str().starts_with("ratelimit"));
                format!("{}: {}", f.name, f.value.to_str().unwrap())
            })
            .collect()
    }

    #[test]
    fn drafts_parse_and_print() {
        for d in [Draft::Ietf07, Draft::Ietf09, Draft::Ietf10] {
            assert_eq!(d.to_string().parse::<Draft>(), Ok(d));
        }
        assert_eq!("10".parse::<Draft>(), Ok(Draft::Ietf10));
        assert!("draft-11".parse::<Draft>().is_err());
    }
}
