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
#[cfg(doc)]
use crate::limiter::RateLimiter;
use crate::limiter::{AsyncRateLimiter, LimiterError, Started};
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
    L: AsyncRateLimiter<str> + AdvertisedQuota + ?Sized,
    X: KeyExtractor,
{
    /// A builder for a layer that limits requests with `limiter`, keyed by `key`, advertising
    /// the limiter's quota ([`AdvertisedQuota`]).
    ///
    /// `limiter` is any [`AsyncRateLimiter<str>`]: every in-memory [`RateLimiter<str>`]
    /// (decided in `call`, as a synchronous layer would), or the Redis backend's
    /// `AsyncRedisLimiter` (one limit shared by every instance; the response future awaits
    /// the round trip). For a limiter without a quota to advertise (a `ShardedLimiter`, your
    /// own), pass it as `Arc<dyn RateLimiter<str>>` and set the policy with
    /// [`Builder::quota`].
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
/// It is ready when the inner service is. A request the layer answers itself (429, 400, 413,
/// 503) never reaches the inner service, whose readiness then carries over to the next call.
///
/// While a limiter's decision is pending (a Redis round trip), the response future holds the
/// ready inner service and `call` leaves a clone in its place, which the next `poll_ready`
/// readies: the usual tower pattern, hence `S: Clone`. A decision ready at once (every
/// in-memory limiter) clones nothing.
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

/// Where a request stands after `call`: decided, or waiting on the limiter's future.
enum Step<F> {
    Now(Outcome),
    /// The key is kept (owned) only if [`Builder::on_decision`] will want it.
    Later {
        decision: F,
        key: Option<String>,
        cost: u64,
    },
}

impl<L, X, C> Shared<L, X, C>
where
    L: AsyncRateLimiter<str> + ?Sized,
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

    #[inline(always)]
    fn decide(&self, parts: &Parts) -> Step<L::Future> {
        let cost = self.cost.cost(parts);
        if cost == 0 {
            return Step::Now(Outcome::Pass(None));
        }
        // An empty key from any extractor is a missing key: one shared bucket for every
        // client that sends nothing would be a key nobody chose.
        let key = match self.key.extract(parts) {
            Some(key) if !key.as_str().is_empty() => key,
            _ => match &self.missing {
                MissingKey::Fallback(k) => Key::borrowed(k),
                MissingKey::Reject => return Step::Now(self.refuse(StatusCode::BAD_REQUEST)),
            },
        };
        let hashed;
        let key = match key.as_str() {
            k if k.len() <= self.max_key_len => k,
            k => match self.oversized {
                OversizedKey::Reject => return Step::Now(self.refuse(StatusCode::BAD_REQUEST)),
                OversizedKey::Hash => {
                    hashed = self.hashed(k);
                    hashed.as_str()
                }
            },
        };
        let started = if cost == 1 {
            // Cost 1 is always valid: an in-memory limiter skips the cost check.
            self.limiter.start_check(key)
        } else {
            self.limiter.start_check_n(key, cost)
        };
        // An in-memory limiter decides here, in `call`, with the key still borrowed, as
        // before the layer was async; a backend's future is awaited by the response future.
        match started {
            Started::Decided(result) => Step::Now(self.outcome(key, cost, result)),
            Started::Waiting(decision) => Step::Later {
                decision,
                key: self.on_decision.as_ref().map(|_| key.to_owned()),
                cost,
            },
        }
    }

    /// What to do with the limiter's answer for `key` (only read by `on_decision`). Always
    /// inlined: its second caller (the cold wait) would otherwise keep it out of line, and
    /// `call` pays a call and a returned `Outcome` through memory.
    #[inline(always)]
    fn outcome(&self, key: &str, cost: u64, result: Result<Decision, L::Error>) -> Outcome {
        let decision = match result {
            Ok(d) => d,
            Err(e) => {
                return match e.cost_error() {
                    Some(CostError::Zero) => Outcome::Pass(None), // not reached: cost > 0
                    Some(CostError::ExceedsCapacity { .. }) => match self.mode {
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
                    },
                    // The limiter could not decide: no decision, so no rate-limit headers
                    // (they would be made up) and no report; never an allow in enforce mode.
                    None => self.refuse(StatusCode::SERVICE_UNAVAILABLE),
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

    /// Carries out `outcome` on the request's head: the headers for the inner service's
    /// response (`Ok`), or the layer's own answer (`Err`).
    #[inline(always)]
    fn admit(
        &self,
        outcome: Outcome,
        parts: &mut Parts,
    ) -> Result<Option<HeaderPlan>, (StatusCode, Option<HeaderPlan>)> {
        match outcome {
            Outcome::Pass(plan) => Ok(plan),
            Outcome::Shadow(decision, plan) => {
                parts.extensions.insert(ShadowDecision(decision));
                if let Some(hook) = &self.shadow_hook {
                    hook(&decision, parts);
                }
                Ok(plan)
            }
            Outcome::Answer(status, plan) => Err((status, plan)),
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
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: Default,
    L: AsyncRateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, Pending<S, ReqB, L, X, C>>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // Extractors and hooks see the head only, whatever the body type.
        let (mut parts, body) = req.into_parts();
        let shared = &*self.shared;
        let outcome = match shared.decide(&parts) {
            Step::Now(outcome) => outcome,
            Step::Later {
                decision,
                key,
                cost,
            } => {
                // The ready service goes with the request; a clone waits for `poll_ready`.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                return ResponseFuture {
                    kind: Kind::Wait {
                        pending: Some(Box::new(Pending {
                            decision,
                            inner,
                            parts,
                            body,
                            key,
                            cost,
                            shared: self.shared.clone(),
                        })),
                    },
                    _body: PhantomData,
                };
            }
        };
        let kind = match shared.admit(outcome, &mut parts) {
            Ok(plan) => Kind::Inner {
                future: self.inner.call(Request::from_parts(parts, body)),
                plan,
            },
            Err((status, plan)) => Kind::Answer { status, plan },
        };
        ResponseFuture {
            kind,
            _body: PhantomData,
        }
    }
}

/// A request waiting for the limiter's decision (a Redis round trip): the limiter's future,
/// the request, and the ready inner service to call once allowed. Opaque; it only appears in
/// the type of [`RateLimit`]'s [`ResponseFuture`].
pub struct Pending<S, ReqB, L, X, C>
where
    L: AsyncRateLimiter<str> + ?Sized,
{
    decision: L::Future,
    inner: S,
    parts: Parts,
    body: ReqB,
    key: Option<String>,
    cost: u64,
    shared: Arc<Shared<L, X, C>>,
}

impl<S, ReqB, L, X, C> fmt::Debug for Pending<S, ReqB, L, X, C>
where
    L: AsyncRateLimiter<str> + ?Sized,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("key", &self.key)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`]: the inner service's, with the rate-limit headers
    /// added, or the layer's own answer; first, if the limiter's decision was not ready in
    /// `call`, the wait for it (`P`, a [`Pending`]).
    pub struct ResponseFuture<F, B, P> {
        #[pin]
        kind: Kind<F, P>,
        _body: PhantomData<fn() -> B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F, P> {
        Inner { #[pin] future: F, plan: Option<HeaderPlan> },
        Answer { status: StatusCode, plan: Option<HeaderPlan> },
        // Boxed: the head, the body and the service would make every response future (the
        // in-memory limiters' too) larger to move; the box is one allocation next to a round
        // trip. An `Option` so that the request and the service can be moved out when decided.
        Wait { pending: Option<Box<P>> },
    }
}

impl<F, B, P> fmt::Debug for ResponseFuture<F, B, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Wait { .. } => "wait",
            Kind::Inner { .. } => "inner",
            Kind::Answer { .. } => "answer",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB, L, X, C> Future for ResponseFuture<S::Future, ResB, Pending<S, ReqB, L, X, C>>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Default,
    L: AsyncRateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
{
    type Output = Result<Response<ResB>, S::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        if let KindProj::Wait { pending } = kind.as_mut().project() {
            let Some(p) = pending else {
                panic!("ResponseFuture polled after a panic");
            };
            let result = match Pin::new(&mut p.decision).poll(cx) {
                Poll::Ready(r) => r,
                Poll::Pending => return Poll::Pending,
            };
            let next = pending.take().map(|p| (*p).resolve(result));
            kind.set(next.unwrap_or_else(|| unreachable!("checked above")));
        }
        match kind.project() {
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
                // Built here, not in `call`: nothing to keep, and a repeated poll gets the
                // same.
                let mut response = Response::new(ResB::default());
                *response.status_mut() = *status;
                if let Some(plan) = plan {
                    plan.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Wait { .. } => unreachable!("decided above"),
        }
    }
}

impl<S, ReqB, ResB, L, X, C> Pending<S, ReqB, L, X, C>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>>,
    L: AsyncRateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
{
    /// Decided: the request's next step (the inner service's future, or the layer's answer).
    /// Out of line and cold: an in-memory limiter never waits, and its response future's
    /// poll stays as small as before the layer was async.
    #[cold]
    #[inline(never)]
    fn resolve(self, result: Result<Decision, L::Error>) -> Kind<S::Future, Self> {
        let Pending {
            mut inner,
            mut parts,
            body,
            key,
            cost,
            shared,
            ..
        } = self;
        // The key is kept only when `on_decision` reads it.
        let outcome = shared.outcome(key.as_deref().unwrap_or(""), cost, result);
        match shared.admit(outcome, &mut parts) {
            Ok(plan) => Kind::Inner {
                future: inner.call(Request::from_parts(parts, body)),
                plan,
            },
            Err((status, plan)) => Kind::Answer { status, plan },
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
