//! [`RateLimitHeaders`]: what a decision does to a request (the mode), and its [`Verdict`].

use super::{AdvertisedQuota, Draft, Fields, Mode, QuotaPolicy};
use crate::decision::Decision;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

/// How decisions become responses and header fields: the policy, the draft, the mode, legacy
/// fields, fields on allowed responses. Small and `Copy`; build it once.
///
/// # Examples
///
/// ```
/// use hotlimit::{algo::FixedWindow, CasLimiter, ManualClock, RateLimiter};
/// use hotlimit::headers::{Action, Draft, Mode, RateLimitHeaders};
/// use std::time::Duration;
///
/// let clock = ManualClock::default();
/// let limiter = CasLimiter::<String, _, _>::with_clock(FixedWindow::new(2, Duration::from_secs(60))?, clock.clone());
/// let mut headers = RateLimitHeaders::for_limiter(&limiter);
/// (headers.draft, headers.mode) = (Draft::Ietf07, Mode::DryRun);
/// limiter.check_n("alice", 2)?;
/// clock.advance(Duration::from_secs(15));
/// let verdict = headers.verdict(limiter.check("alice"));
/// assert_eq!(verdict.action, Action::Pass); // a dry run never denies...
/// let fields: Vec<_> = verdict.fields().map(|f| format!("{}: {}", f.name, f.value.to_str().unwrap())).collect();
/// assert_eq!(fields, ["ratelimit-policy: 2;w=60", "ratelimit: limit=2, remaining=0, reset=45"]); // ...but reports
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitHeaders {
    /// The policy advertised (`None`: no `RateLimit-Policy` or `X-RateLimit-Limit`).
    pub quota: Option<QuotaPolicy>,
    /// The draft followed (default: the newest, [`Draft::Ietf10`]).
    pub draft: Draft,
    /// What a denial does (default [`Mode::Enforce`]).
    pub mode: Mode,
    /// Also send the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (default off).
    pub legacy: bool,
    /// The fields on allowed responses too (default off: only denials, and every response in
    /// dry-run, carry them). A client pacing itself needs them.
    pub on_allowed: bool,
}

impl RateLimitHeaders {
    /// Headers advertising `quota` (`None`: no `RateLimit-Policy` or `X-RateLimit-Limit`),
    /// in [`Mode::Enforce`], the newest draft, without legacy fields, on denials only; set
    /// the fields to change that.
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

    /// What to do with a request the limiter decided `decision`: see the
    /// [module docs](crate::headers#when-headers-go-out).
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
    /// What to do with the request.
    pub action: Action,
    pub(crate) fields: Option<Fields>,
}

/// What a [`Verdict`] does with the request. Exhaustive: a layer or proxy matches every
/// case, and a new one would be a breaking change, not a request silently passed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Pass it on to the service (allowed, or any request in [`Mode::DryRun`]).
    Pass,
    /// [`Mode::Shadow`]: pass it on; the decision is for the application to act on.
    Shadow(Decision),
    /// Answer it with this status instead of passing it on: 429 for a denial in
    /// [`Mode::Enforce`], 413 for [`RateLimitHeaders::too_large`].
    Answer(StatusCode),
}

impl Verdict {
    /// Adds the header fields to a response's `headers` (the two IETF fields are appended, the
    /// others replace a value already there).
    pub fn apply(&self, headers: &mut HeaderMap) {
        if let Some(fields) = &self.fields {
            fields.apply(headers);
        }
    }

    /// The header fields, for a response type other than [`HeaderMap`] (pingora's
    /// `ResponseHeader`, say): append those whose [`HeaderField::list`] is set, insert the others,
    /// as [`Verdict::apply`] does.
    pub fn fields(&self) -> impl Iterator<Item = HeaderField> {
        let mut out: [Option<HeaderField>; 6] = Default::default();
        if let Some(fields) = &self.fields {
            let mut at = 0;
            fields.render(|name, value, list| {
                out[at] = Some(HeaderField { name, value, list });
                at += 1;
            });
        }
        out.into_iter().flatten()
    }
}

/// One header field of a [`Verdict`], from [`Verdict::fields`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderField {
    /// The field's name.
    pub name: HeaderName,
    /// Its value.
    pub value: HeaderValue,
    /// Whether it is a list, to append to a value already there (`RateLimit-Policy` and
    /// `RateLimit`: nested limits add their policies to one list, as the draft allows), rather
    /// than replace it (`Retry-After`, the legacy fields).
    pub list: bool,
}
