//! Settle at response time: a provisional cost taken from the request, settled with the real
//! one read off the response (its status, a header, a usage extension the handler set), through
//! the crate's own take and settle ([`Request::take`](hotlimit::Request::take),
//! [`Request::settle`](hotlimit::Request::settle)).

use super::layer::Outcome;
use super::options::Shared;
use super::plan::NoPlans;
use super::{KeyExtractor, LayerBuilder, RequestCost};
use hotlimit::headers::Verdict;
use hotlimit::AsyncRateLimiter;
use hotlimit::QuotaError;
use hotlimit::Requests;
use hotlimit::Ticket;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The real cost of a request, read off its response, for [`LayerBuilder::settle`]: `None`
/// keeps the provisional charge. Any `Fn(&Response<B>) -> Option<u64>` is one.
///
/// ```
/// use hotlimit_tower::ResponseCost;
/// use http::{Response, StatusCode};
///
/// // A login endpoint counts failed attempts only: a 401 keeps its unit, anything else is
/// // refunded in full.
/// let failed_only = |r: &Response<()>| Some(u64::from(r.status() == StatusCode::UNAUTHORIZED));
/// let ok = Response::builder().status(200).body(()).unwrap();
/// assert_eq!(failed_only.cost(&ok), Some(0));
///
/// // The tokens a handler reports in a header (an LLM's usage): the charge becomes that.
/// let tokens = |r: &Response<()>| r.headers().get("x-tokens")?.to_str().ok()?.parse().ok();
/// let used = Response::builder().header("x-tokens", "812").body(()).unwrap();
/// assert_eq!(tokens.cost(&used), Some(812));
/// ```
pub trait ResponseCost<B>: Send + Sync + 'static {
    /// The real cost of the request whose response is `response`; `None`: as taken.
    fn cost(&self, response: &Response<B>) -> Option<u64>;
}

impl<B, F> ResponseCost<B> for F
where
    F: Fn(&Response<B>) -> Option<u64> + Send + Sync + 'static,
{
    #[inline]
    fn cost(&self, response: &Response<B>) -> Option<u64> {
        self(response)
    }
}

impl<L, X, C> LayerBuilder<L, X, C, NoPlans>
where
    L: AsyncRateLimiter<str> + Requests<str>,
    X: KeyExtractor,
    C: RequestCost,
{
    /// The layer, settling each admitted request at response time: the request's
    /// [`cost`](LayerBuilder::cost) is taken as a provisional charge
    /// ([`Request::take`](hotlimit::Request::take)) and settled with what `actual` reads off the
    /// response ([`Request::settle`](hotlimit::Request::settle)): units not used are refunded,
    /// an overrun is charged as a debt the key pays before its next admission. A denied
    /// request is answered 429 as by [`build`](LayerBuilder::build), and charged nothing. A
    /// request is never free before its response: a cost of 0 is taken as 1 (and settled to
    /// 0 if `actual` says so), so a request whose cost is an estimate a client sends cannot
    /// skip the check, nor the charge its response reports. Keep a route that must never be
    /// limited (a health check) outside the layer.
    ///
    /// For a limiter that settles in memory (every in-memory limiter, the hybrid limiter).
    /// The key is copied once per admitted request, to settle with.
    ///
    /// ```
    /// use hotlimit::{algo::Gcra, CasLimiter};
    /// use hotlimit_tower::{HeaderKey, RateLimitLayer};
    /// use http::{Response, StatusCode};
    /// use std::sync::Arc;
    ///
    /// // 5 failed logins a minute per user: only a 401 counts.
    /// let limiter = Arc::new(CasLimiter::<String, Gcra>::new("5/min burst 5".parse()?));
    /// let layer = RateLimitLayer::builder(limiter, HeaderKey::from_static("x-user"))
    ///     .settle(|r: &Response<String>| Some(u64::from(r.status() == StatusCode::UNAUTHORIZED)));
    /// # let _ = layer;
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn settle<B, F: ResponseCost<B>>(self, actual: F) -> SettleLayer<L, X, C, F> {
        SettleLayer {
            shared: Arc::new((self.shared, actual)),
        }
    }
}

/// A `tower::Layer` that takes a provisional cost and settles it at response time; from
/// [`LayerBuilder::settle`]. Cloning is cheap (one `Arc`).
pub struct SettleLayer<L: ?Sized, X, C, F> {
    shared: Arc<(Shared<L, X, C, NoPlans>, F)>,
}

impl<L: ?Sized, X, C, F> Clone for SettleLayer<L, X, C, F> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<L: ?Sized, X, C, F> fmt::Debug for SettleLayer<L, X, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleLayer").finish_non_exhaustive()
    }
}

impl<S, L: ?Sized, X, C, F> tower_layer::Layer<S> for SettleLayer<L, X, C, F> {
    type Service = Settle<S, L, X, C, F>;

    fn layer(&self, inner: S) -> Self::Service {
        Settle {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`SettleLayer`] wraps around an inner service.
pub struct Settle<S, L: ?Sized, X, C, F> {
    inner: S,
    shared: Arc<(Shared<L, X, C, NoPlans>, F)>,
}

impl<S: Clone, L: ?Sized, X, C, F> Clone for Settle<S, L, X, C, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, L: ?Sized, X, C, F> fmt::Debug for Settle<S, L, X, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settle")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<L, X, C> Shared<L, X, C, NoPlans>
where
    L: AsyncRateLimiter<str> + Requests<str>,
    X: KeyExtractor,
    C: RequestCost,
{
    /// A request through a take (the settle and in-flight layers): the layer's own answer
    /// to the decision or the error (the report, the headers, a cost over capacity, a
    /// limiter that could not decide), and the key and ticket of an admitted request. A cost
    /// below `least` is taken as `least`: the settle layer's 1, since the response, not the
    /// request, says what a request cost.
    pub(super) fn take(&self, parts: &Parts, least: u64) -> (Outcome, Option<(String, Ticket)>) {
        let cost = self.cost.cost(parts).max(least);
        let mut extracted = None;
        let key = match cost {
            // Cost 0: not limited, as in `build`'s layer.
            0 => return (Outcome::Refuse(None), None),
            _ => self.key_of(parts, &mut extracted),
        };
        let key = match key {
            Ok(key) => key,
            Err(status) => return (self.refuse(status), None),
        };
        let (decision, open) = match self.limiter.request(key).cost(cost).take() {
            Ok(ticket) => {
                let decision = ticket.decision();
                let open = decision.is_allowed().then(|| (key.to_owned(), ticket));
                (Ok(decision), open)
            }
            Err(e) => (Err(e), None),
        };
        (self.outcome(key, cost, None, decision), open)
    }
}

/// An admitted request's charge: the key and the ticket to settle.
struct Open {
    key: String,
    ticket: Ticket,
}

impl<S, L, X, C, F, ReqB, ResB> tower_service::Service<Request<ReqB>> for Settle<S, L, X, C, F>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Default,
    L: AsyncRateLimiter<str> + Requests<str>,
    X: KeyExtractor,
    C: RequestCost,
    F: ResponseCost<ResB>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = SettleFuture<S::Future, ResB, L, X, C, F>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let shared = &self.shared.0;
        // Never free before the response: an estimate of 0 (a client's own, say) skipped the
        // settle, and the response's real cost went uncharged.
        let (outcome, open) = shared.take(&parts, 1);
        let open = open.map(|(key, ticket)| Open { key, ticket });
        let kind = match shared.admit(outcome, &mut parts) {
            Ok(fields) => SettleKind::Inner {
                future: self.inner.call(Request::from_parts(parts, body)),
                fields,
                open,
            },
            Err((status, fields)) => SettleKind::Answer { status, fields },
        };
        SettleFuture {
            kind,
            shared: self.shared.clone(),
            _body: PhantomData,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Settle`]: the inner service's response, its request settled
    /// with the cost read off it, the rate-limit headers added; or the layer's own answer.
    pub struct SettleFuture<Fut, B, L: ?Sized, X, C, F> {
        #[pin]
        kind: SettleKind<Fut>,
        shared: Arc<(Shared<L, X, C, NoPlans>, F)>,
        _body: PhantomData<fn() -> B>,
    }
}

pin_project_lite::pin_project! {
    #[project = SettleKindProj]
    enum SettleKind<Fut> {
        Inner { #[pin] future: Fut, fields: Option<Verdict>, open: Option<Open> },
        Answer { status: StatusCode, fields: Option<Verdict> },
    }
}

impl<Fut, B, L: ?Sized, X, C, F> fmt::Debug for SettleFuture<Fut, B, L, X, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleFuture").finish_non_exhaustive()
    }
}

impl<Fut, E, B, L, X, C, F> Future for SettleFuture<Fut, B, L, X, C, F>
where
    Fut: Future<Output = Result<Response<B>, E>>,
    B: Default,
    L: Requests<str>,
    F: ResponseCost<B>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            SettleKindProj::Inner {
                future,
                fields,
                open,
            } => {
                let mut response = match future.poll(cx) {
                    Poll::Ready(Ok(r)) => r,
                    // An error, no response: the provisional charge stands.
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                };
                let (shared, actual) = &**this.shared;
                if let Some(mut o) = open.take() {
                    if let Some(cost) = actual.cost(&response) {
                        // The ticket is this limiter's, for this key: the settle cannot fail
                        // on its origin; a failure would leave the charge as taken.
                        if let Err(e) = shared.limiter.request(&o.key).settle(&mut o.ticket, cost) {
                            // A count past the debt the algorithm can hold (a broken or
                            // hostile upstream's) is charged that most, not dropped: a larger
                            // count never costs less.
                            if let QuotaError::ExceedsCapacity { capacity, .. } = e.into() {
                                let _ = shared
                                    .limiter
                                    .request(&o.key)
                                    .settle(&mut o.ticket, capacity);
                            }
                        }
                    }
                }
                if let Some(fields) = fields.take() {
                    fields.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            SettleKindProj::Answer { status, fields } => {
                let mut response = Response::new(B::default());
                *response.status_mut() = *status;
                if let Some(fields) = fields {
                    fields.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
        }
    }
}
