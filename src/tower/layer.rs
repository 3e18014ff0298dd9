//! The layer and its service: deciding a request, the headers, the response future.

use super::config::{ConfigView, Shared};
use super::key::{Buf, Inline, Key};
use super::{
    AdvertisedQuota, Builder, KeyExtractor, MissingKey, Mode, OversizedKey, QuotaPolicy, Report,
    RequestCost, ShadowDecision, UnitCost, DEFAULT_MAX_KEY_LEN, RATELIMIT, RATELIMIT_POLICY,
    X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::decision::Decision;
use crate::error::CostError;
use crate::limiter::RateLimiter;
use http::header::{HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// A `tower::Layer` that rate-limits requests with a hotlimit limiter; see the
/// [module docs](super).
///
/// Cloning is cheap (one `Arc`); every service it makes shares the limiter.
pub struct RateLimitLayer<L: ?Sized, X, C = UnitCost> {
    pub(super) shared: Arc<Shared<L, X, C>>,
}

impl<L: ?Sized, X, C> Clone for RateLimitLayer<L, X, C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<L: ?Sized, X, C> fmt::Debug for RateLimitLayer<L, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("config", &ConfigView(&self.shared))
            .finish()
    }
}

impl<L, X> RateLimitLayer<L, X, UnitCost>
where
    L: RateLimiter<str> + AdvertisedQuota + ?Sized,
    X: KeyExtractor,
{
    /// A builder for a layer that limits requests with `limiter`, keyed by `key`, advertising
    /// the limiter's quota ([`AdvertisedQuota`]).
    ///
    /// For a limiter without one (a `ShardedLimiter`, your own), pass it as
    /// `Arc<dyn RateLimiter<str>>` and set the policy with [`Builder::quota`].
    pub fn builder(limiter: Arc<L>, key: X) -> Builder<L, X, UnitCost> {
        let quota = limiter.advertised_quota();
        Builder {
            shared: Shared {
                limiter,
                key,
                cost: UnitCost,
                mode: Mode::Enforce,
                quota,
                legacy: false,
                on_allowed: false,
                missing: MissingKey::Reject,
                max_key_len: DEFAULT_MAX_KEY_LEN,
                oversized: OversizedKey::Hash,
                hashers: [ahash::RandomState::new(), ahash::RandomState::new()],
                on_decision: None,
                shadow_hook: None,
            },
        }
    }
}

impl<L: ?Sized, X, C> RateLimitLayer<L, X, C> {
    /// The limiter.
    pub fn limiter(&self) -> &Arc<L> {
        &self.shared.limiter
    }
}

impl<S, L: ?Sized, X, C> tower_layer::Layer<S> for RateLimitLayer<L, X, C> {
    type Service = RateLimit<S, L, X, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The rate-limiting service [`RateLimitLayer`] wraps around an inner service.
///
/// It is ready when the inner service is. A request the layer answers itself (429, 400, 413)
/// never reaches the inner service, whose readiness then carries over to the next call.
pub struct RateLimit<S, L: ?Sized, X, C = UnitCost> {
    inner: S,
    shared: Arc<Shared<L, X, C>>,
}

impl<S: Clone, L: ?Sized, X, C> Clone for RateLimit<S, L, X, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, L: ?Sized, X, C> fmt::Debug for RateLimit<S, L, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &ConfigView(&self.shared))
            .finish()
    }
}

impl<S, L: ?Sized, X, C> RateLimit<S, L, X, C> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// The headers a response gets, computed from one decision.
#[derive(Clone, Copy)]
struct HeaderPlan {
    decision: Decision,
    quota: Option<QuotaPolicy>,
    legacy: bool,
    retry_after: bool,
}

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl HeaderPlan {
    fn apply(self, headers: &mut HeaderMap) {
        let d = self.decision;
        if self.retry_after {
            // Honest: never earlier than the limiter's wait, and a denial never says 0.
            headers.insert(
                RETRY_AFTER,
                HeaderValue::from(ceil_secs(d.retry_after()).max(1)),
            );
        }
        let reset = d.reset_after().map(ceil_secs);
        // The two IETF fields are lists, so append: nested layers (per IP, then per API key)
        // add their policies to one list, as the draft allows (give them distinct names).
        if let Some(q) = self.quota {
            let value = header_value(|b| {
                b.push(b"\"")?;
                b.push(q.name().as_bytes())?;
                b.push(b"\";q=")?;
                b.push_u64(q.quota())?;
                b.push(b";w=")?;
                b.push_u64(q.window_secs())
            });
            headers.append(RATELIMIT_POLICY, value);
        }
        if let Some(r) = d.remaining() {
            let name = self.quota.map_or("default", |q| q.name());
            let value = header_value(|b| {
                b.push(b"\"")?;
                b.push(name.as_bytes())?;
                b.push(b"\";r=")?;
                b.push_u64(r)?;
                match reset {
                    Some(t) => {
                        b.push(b";t=")?;
                        b.push_u64(t)
                    }
                    None => Ok(()),
                }
            });
            headers.append(RATELIMIT, value);
        }
        if self.legacy {
            if let Some(q) = self.quota {
                headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(q.quota()));
            }
            if let Some(r) = d.remaining() {
                headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(r));
            }
            if let Some(t) = reset {
                headers.insert(X_RATELIMIT_RESET, HeaderValue::from(t));
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

/// What the layer decided to do with one request.
enum Outcome {
    /// Call the inner service, adding these headers to its response.
    Pass(Option<HeaderPlan>),
    /// Call the inner service in shadow mode, after telling the application.
    Shadow(Decision, Option<HeaderPlan>),
    /// Answer with this status and these headers.
    Answer(StatusCode, Option<HeaderPlan>),
}

impl<L, X, C> Shared<L, X, C>
where
    L: RateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
{
    /// Refuses in enforce mode; lets through uncounted otherwise.
    fn refuse(&self, status: StatusCode) -> Outcome {
        match self.mode {
            Mode::Enforce => Outcome::Answer(status, None),
            Mode::DryRun | Mode::Shadow => Outcome::Pass(None),
        }
    }

    #[inline]
    fn decide(&self, parts: &Parts) -> Outcome {
        let cost = self.cost.cost(parts);
        if cost == 0 {
            return Outcome::Pass(None);
        }
        // An empty key from any extractor is a missing key: one shared bucket for every
        // client that sends nothing would be a key nobody chose.
        let key = match self.key.extract(parts) {
            Some(key) if !key.as_str().is_empty() => key,
            _ => match &self.missing {
                MissingKey::Fallback(k) => Key::borrowed(k),
                MissingKey::Reject => return self.refuse(StatusCode::BAD_REQUEST),
            },
        };
        let hashed;
        let key = match key.as_str() {
            k if k.len() <= self.max_key_len => k,
            k => match self.oversized {
                OversizedKey::Reject => return self.refuse(StatusCode::BAD_REQUEST),
                OversizedKey::Hash => {
                    hashed = self.hashed(k);
                    hashed.as_str()
                }
            },
        };
        let decision = if cost == 1 {
            // Cost 1 is always valid: skip the cost check.
            Ok(self.limiter.check(key))
        } else {
            self.limiter.check_n(key, cost)
        };
        let decision = match decision {
            Ok(d) => d,
            Err(CostError::Zero) => return Outcome::Pass(None), // not reached: cost > 0
            Err(CostError::ExceedsCapacity { .. }) => {
                return match self.mode {
                    Mode::Enforce => Outcome::Answer(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        self.quota.map(|quota| HeaderPlan {
                            decision: Decision::allowed(),
                            quota: Some(quota),
                            legacy: self.legacy,
                            retry_after: false,
                        }),
                    ),
                    Mode::DryRun | Mode::Shadow => Outcome::Pass(None),
                };
            }
        };
        if let Some(f) = &self.on_decision {
            f(&Report {
                key,
                cost,
                decision,
                mode: self.mode,
            });
        }
        let plan = |retry_after| HeaderPlan {
            decision,
            quota: self.quota,
            legacy: self.legacy,
            retry_after,
        };
        match self.mode {
            Mode::Enforce if decision.is_denied() => {
                Outcome::Answer(StatusCode::TOO_MANY_REQUESTS, Some(plan(true)))
            }
            Mode::Enforce => Outcome::Pass(self.on_allowed.then(|| plan(false))),
            Mode::DryRun => Outcome::Pass(Some(plan(false))),
            Mode::Shadow => Outcome::Shadow(
                decision,
                (self.on_allowed && decision.is_allowed()).then(|| plan(false)),
            ),
        }
    }

    /// `#` and 32 hex digits of a keyed 128-bit hash.
    #[cold]
    fn hashed(&self, key: &str) -> Key<'static> {
        use fmt::Write;
        let [a, b] = &self.hashers;
        let mut inline = Inline::new();
        // 33 bytes: fits INLINE.
        let _ = write!(inline, "#{:016x}{:016x}", a.hash_one(key), b.hash_one(key));
        Key::inline(inline)
    }
}

impl<S, L, X, C, ReqB, ResB> tower_service::Service<Request<ReqB>> for RateLimit<S, L, X, C>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Default,
    L: RateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // Extractors and hooks see the head only, whatever the body type.
        let (mut parts, body) = req.into_parts();
        let shared = &*self.shared;
        let plan = match shared.decide(&parts) {
            Outcome::Pass(plan) => plan,
            Outcome::Shadow(decision, plan) => {
                parts.extensions.insert(ShadowDecision(decision));
                if let Some(hook) = &shared.shadow_hook {
                    hook(&decision, &mut parts);
                }
                plan
            }
            Outcome::Answer(status, plan) => {
                return ResponseFuture {
                    kind: Kind::Answer { status, plan },
                    _body: PhantomData,
                }
            }
        };
        ResponseFuture {
            kind: Kind::Inner {
                future: self.inner.call(Request::from_parts(parts, body)),
                plan,
            },
            _body: PhantomData,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`]: the inner service's, with the rate-limit headers
    /// added, or the layer's own answer.
    pub struct ResponseFuture<F, B> {
        #[pin]
        kind: Kind<F>,
        _body: PhantomData<fn() -> B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Inner { #[pin] future: F, plan: Option<HeaderPlan> },
        Answer { status: StatusCode, plan: Option<HeaderPlan> },
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Answer { .. } => "answer",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Default,
{
    type Output = Result<Response<B>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, plan } => {
                let mut response = match future.poll(cx) {
                    Poll::Ready(Ok(r)) => r,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                };
                if let Some(plan) = plan.take() {
                    plan.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Answer { status, plan } => {
                // Built here, not in `call`: nothing to keep, and a repeated poll gets the same.
                let mut response = Response::new(B::default());
                *response.status_mut() = *status;
                if let Some(plan) = plan {
                    plan.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_policy_names_still_format() {
        let name = "a-policy-name-long-enough-to-overflow-the-stack-buffer-of-one-hundred-and-twenty-eight-bytes-used-for-header-values";
        let q = QuotaPolicy::new(7, Duration::from_secs(3))
            .named(name)
            .unwrap();
        let mut h = HeaderMap::new();
        let plan = HeaderPlan {
            decision: Decision::allowed().with_remaining(2).with_reset_after(1),
            quota: Some(q),
            legacy: true,
            retry_after: false,
        };
        plan.apply(&mut h);
        assert_eq!(h[RATELIMIT_POLICY], format!("\"{name}\";q=7;w=3"));
        assert_eq!(h[RATELIMIT], format!("\"{name}\";r=2;t=1"));
        assert_eq!(h[X_RATELIMIT_LIMIT], "7");
        assert_eq!(h[X_RATELIMIT_REMAINING], "2");
        assert_eq!(h[X_RATELIMIT_RESET], "1");
    }

    #[test]
    fn ceil_secs_rounds_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }
}
