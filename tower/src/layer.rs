//! The layer and its service: deciding a request, the headers, the response future.

use super::extract::{Inline, Key};
use super::options::{ConfigView, Shared};
use super::plan::{NoPlans, Planned, RequestPlan};
use super::{
    AdvertisedQuota, KeyExtractor, LayerBuilder, MissingKey, Mode, OversizedKey, Report,
    RequestCost, ShadowDecision, UnitCost, DEFAULT_MAX_KEY_LEN,
};
use hotlimit::headers::{Action, QuotaPolicy, RateLimitHeaders, Verdict};
use hotlimit::Decision;
#[cfg(doc)]
use hotlimit::RateLimiter;
use hotlimit::{AsyncRateLimiter, QuotaError};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// A `tower::Layer` that rate-limits requests with a hotlimit limiter; see the
/// [module docs](super).
///
/// Cloning is cheap (one `Arc`); every service it makes shares the limiter.
pub struct RateLimitLayer<L: ?Sized, X, C = UnitCost, P = NoPlans> {
    pub(super) shared: Arc<Shared<L, X, C, P>>,
}

impl<L: ?Sized, X, C, P> Clone for RateLimitLayer<L, X, C, P> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<L: ?Sized, X, C, P> fmt::Debug for RateLimitLayer<L, X, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("config", &ConfigView(&self.shared))
            .finish()
    }
}

impl<L, X> RateLimitLayer<L, X, UnitCost, NoPlans>
where
    L: AsyncRateLimiter<str> + AdvertisedQuota + ?Sized,
    X: KeyExtractor,
{
    /// A builder for a layer that limits requests with `limiter`, keyed by `key`, advertising
    /// the limiter's quota ([`AdvertisedQuota`]).
    ///
    /// `limiter` is any [`AsyncRateLimiter<str>`]: every in-memory limiter, every
    /// [`RateLimiter`](hotlimit::RateLimiter) (decided in `call`, as a synchronous layer
    /// would), or the Redis backend's
    /// `AsyncRedisLimiter` (one limit shared by every instance; the response future awaits
    /// the round trip). For a limiter without a quota to advertise (one of your own), pass it
    /// as `Arc<dyn RateLimiter<str>>` and set the policy with
    /// [`LayerBuilder::headers`] (`quota`).
    pub fn builder(limiter: Arc<L>, key: X) -> LayerBuilder<L, X, UnitCost, NoPlans> {
        let headers = RateLimitHeaders::for_limiter(&*limiter);
        LayerBuilder {
            shared: Shared {
                limiter,
                key,
                cost: UnitCost,
                plan: NoPlans,
                headers,
                missing: MissingKey::Reject,
                max_key_len: DEFAULT_MAX_KEY_LEN,
                oversized: OversizedKey::Hash,
                on_decision: None,
                shadow_hook: None,
            },
        }
    }
}

impl<S, L: ?Sized, X, C, P> tower_layer::Layer<S> for RateLimitLayer<L, X, C, P> {
    type Service = RateLimit<S, L, X, C, P>;

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
pub struct RateLimit<S, L: ?Sized, X, C = UnitCost, P = NoPlans> {
    inner: S,
    shared: Arc<Shared<L, X, C, P>>,
}

impl<S: Clone, L: ?Sized, X, C, P> Clone for RateLimit<S, L, X, C, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, L: ?Sized, X, C, P> fmt::Debug for RateLimit<S, L, X, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &ConfigView(&self.shared))
            .finish()
    }
}

impl<S, L: ?Sized, X, C, P> RateLimit<S, L, X, C, P> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// What the layer decided to do with one request.
pub(super) enum Outcome {
    /// What [`RateLimitHeaders`] makes of a decision, or of a cost over capacity.
    Verdict(Verdict),
    /// Answer with this status, without headers (400, 503); or, with `None`, let the request
    /// through without headers.
    Refuse(Option<StatusCode>),
}

/// Where a request stands after `call`: decided, or waiting on the limiter's future.
enum Stage<F> {
    Now(Outcome),
    /// The key is kept (owned) only if [`LayerBuilder::on_decision`] will want it.
    Later {
        decision: F,
        key: Option<String>,
        cost: u64,
        policy: Option<Option<QuotaPolicy>>,
    },
}

impl<L, X, C, P> Shared<L, X, C, P>
where
    L: AsyncRateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
    P: RequestPlan<L>,
{
    /// Refuses in enforce mode; lets through uncounted otherwise.
    pub(super) fn refuse(&self, status: StatusCode) -> Outcome {
        match self.headers.mode {
            Mode::Enforce => Outcome::Refuse(Some(status)),
            Mode::DryRun | Mode::Shadow => Outcome::Refuse(None),
        }
    }

    #[inline(always)]
    fn decide(&self, parts: &Parts) -> Stage<L::Future> {
        let cost = self.cost.cost(parts);
        if cost == 0 {
            return Stage::Now(Outcome::Refuse(None));
        }
        let mut extracted = None;
        let key = match self.key_of(parts, &mut extracted) {
            Ok(key) => key,
            Err(status) => return Stage::Now(self.refuse(status)),
        };
        let Planned { started, policy } = self.plan.start(&*self.limiter, parts, key, cost);
        // A plan whose quota cannot read the limiter's states: a misconfiguration, never an
        // allow.
        let Ok(mut decision) = started else {
            return Stage::Now(self.refuse(StatusCode::SERVICE_UNAVAILABLE));
        };
        // Polled once here: an in-memory limiter's future is ready at once (`Ready`, the
        // poll inlined away), so it is decided in `call`, with the key still borrowed, as
        // before the layer was async; a backend's future, begun, is awaited by the response
        // future (whose polls give it a real waker).
        match Pin::new(&mut decision).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => Stage::Now(self.outcome(key, cost, policy, result)),
            Poll::Pending => Stage::Later {
                decision,
                key: self.on_decision.as_ref().map(|_| key.to_owned()),
                cost,
                policy,
            },
        }
    }

    /// The request's key: extracted (an empty one is missing), or the fallback, or hashed if
    /// over the length bound; or the status to [`refuse`](Self::refuse) a missing or
    /// oversized key with. `extracted` holds what the key borrows.
    #[inline(always)]
    pub(super) fn key_of<'k>(
        &'k self,
        parts: &'k Parts,
        extracted: &'k mut Option<Key<'k>>,
    ) -> Result<&'k str, StatusCode> {
        Ok(extracted.insert(self.key_by(&self.key, parts)?).as_str())
    }

    /// [`key_of`](Self::key_of) with another extractor (a hierarchy's outer levels), by the
    /// same rules: the key as it is, the fallback, or the hash.
    #[inline(always)]
    pub(super) fn key_by<'k>(
        &'k self,
        extractor: &X,
        parts: &'k Parts,
    ) -> Result<Key<'k>, StatusCode> {
        // An empty key from any extractor is a missing key: one shared bucket for every
        // client that sends nothing would be a key nobody chose.
        let key = match extractor.extract(parts) {
            Some(key) if !key.as_str().is_empty() => key,
            _ => match &self.missing {
                MissingKey::Fallback(k) => Key::from(&**k),
                MissingKey::Reject => return Err(StatusCode::BAD_REQUEST),
            },
        };
        if key.as_str().len() <= self.max_key_len {
            return Ok(key);
        }
        match self.oversized {
            OversizedKey::Reject => Err(StatusCode::BAD_REQUEST),
            OversizedKey::Hash => Ok(self.hashed(key.as_str())),
        }
    }

    /// What to do with the limiter's answer for `key` (only read by `on_decision`). Always
    /// inlined: its second caller (the cold wait) would otherwise keep it out of line, and
    /// `call` pays a call and a returned `Outcome` through memory.
    #[inline(always)]
    pub(super) fn outcome<E: Into<QuotaError>>(
        &self,
        key: &str,
        cost: u64,
        policy: Option<Option<QuotaPolicy>>,
        result: Result<Decision, E>,
    ) -> Outcome {
        // The request's plan's policy, under the layer's policy's name (nested layers keep
        // theirs), if it has a plan; else the layer's.
        let mut headers = self.headers;
        match (policy, self.headers.quota) {
            (None, _) => {}
            (Some(Some(plan)), Some(own)) => {
                headers.quota = Some(plan.named(own.name()).unwrap_or(plan));
            }
            (Some(_), _) => headers.quota = None,
        }
        let decision = match result {
            Ok(d) => d,
            Err(e) => {
                // The request's fault (its cost) or the limiter's (a backend's failure),
                // classified before the answer: matched in one arm with the conversion, the
                // decided path measured 33 instructions a request more (callgrind).
                return match e.into() {
                    QuotaError::ZeroCost => Outcome::Refuse(None), // not reached: cost > 0
                    // Above the capacity (or any cost the limiter can never admit): 413.
                    QuotaError::ExceedsCapacity { .. } => Outcome::Verdict(headers.too_large()),
                    // The limiter could not decide: no decision, so no rate-limit headers
                    // (they would be made up) and no report; never an allow in enforce mode.
                    _ => self.refuse(StatusCode::SERVICE_UNAVAILABLE),
                };
            }
        };
        if let Some(f) = &self.on_decision {
            f(&Report {
                key,
                cost,
                decision,
                mode: self.headers.mode,
            });
        }
        Outcome::Verdict(headers.verdict(decision))
    }

    /// Carries out `outcome` on the request's head: the headers for the inner service's
    /// response (`Ok`), or the layer's own answer (`Err`).
    // Inlined into its one caller and taken apart at once: boxing the error would allocate
    // on every denial for nothing.
    #[allow(clippy::result_large_err)]
    #[inline(always)]
    pub(super) fn admit(
        &self,
        outcome: Outcome,
        parts: &mut Parts,
    ) -> Result<Option<Verdict>, (StatusCode, Option<Verdict>)> {
        let verdict = match outcome {
            Outcome::Verdict(verdict) => verdict,
            Outcome::Refuse(None) => return Ok(None),
            Outcome::Refuse(Some(status)) => return Err((status, None)),
        };
        match verdict.action {
            Action::Pass => Ok(Some(verdict)),
            Action::Shadow(decision) => {
                parts.extensions.insert(ShadowDecision(decision));
                if let Some(hook) = &self.shadow_hook {
                    hook(&decision, parts);
                }
                Ok(Some(verdict))
            }
            Action::Answer(status) => Err((status, Some(verdict))),
        }
    }

    /// `#` and 32 hex digits: the first 128 bits of the key's SHA-256. The same on every
    /// instance, platform and restart, so a shared backend (Redis, the fleet) counts a long
    /// key as one key across the fleet (a per-process seed made it one key per instance, each
    /// with its own budget); and no client can aim its key at another's hash.
    #[cold]
    fn hashed(&self, key: &str) -> Key<'static> {
        use fmt::Write;
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(key.as_bytes());
        let mut inline = Inline::new();
        // 33 bytes: fits INLINE.
        let _ = inline.try_push('#');
        for byte in &digest[..16] {
            let _ = write!(inline, "{byte:02x}");
        }
        Key::inline(inline)
    }
}

impl<S, L, X, C, P, ReqB, ResB> tower_service::Service<Request<ReqB>> for RateLimit<S, L, X, C, P>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: Default,
    L: AsyncRateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
    P: RequestPlan<L>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, Pending<S, ReqB, L, X, C, P>>;

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
            Stage::Now(outcome) => outcome,
            Stage::Later {
                decision,
                key,
                cost,
                policy,
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
                            policy,
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
pub struct Pending<S, ReqB, L, X, C, P>
where
    L: AsyncRateLimiter<str> + ?Sized,
{
    decision: L::Future,
    inner: S,
    parts: Parts,
    body: ReqB,
    key: Option<String>,
    cost: u64,
    /// The policy of the request's plan, if it has one.
    policy: Option<Option<QuotaPolicy>>,
    shared: Arc<Shared<L, X, C, P>>,
}

impl<S, ReqB, L, X, C, P> fmt::Debug for Pending<S, ReqB, L, X, C, P>
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
        Inner { #[pin] future: F, plan: Option<Verdict> },
        Answer { status: StatusCode, plan: Option<Verdict> },
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

impl<S, ReqB, ResB, L, X, C, P> Future
    for ResponseFuture<S::Future, ResB, Pending<S, ReqB, L, X, C, P>>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Default,
    L: AsyncRateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
    P: RequestPlan<L>,
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
                if let Some(fields) = plan.take() {
                    fields.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Answer { status, plan } => {
                // Built here, not in `call`: nothing to keep, and a repeated poll gets the
                // same.
                let mut response = Response::new(ResB::default());
                *response.status_mut() = *status;
                if let Some(fields) = plan {
                    fields.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Wait { .. } => unreachable!("decided above"),
        }
    }
}

impl<S, ReqB, ResB, L, X, C, P> Pending<S, ReqB, L, X, C, P>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>>,
    L: AsyncRateLimiter<str> + ?Sized,
    X: KeyExtractor,
    C: RequestCost,
    P: RequestPlan<L>,
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
            policy,
            shared,
            ..
        } = self;
        // The key is kept only when `on_decision` reads it.
        let outcome = shared.outcome(key.as_deref().unwrap_or(""), cost, policy, result);
        match shared.admit(outcome, &mut parts) {
            Ok(plan) => Kind::Inner {
                future: inner.call(Request::from_parts(parts, body)),
                plan,
            },
            Err((status, plan)) => Kind::Answer { status, plan },
        }
    }
}
