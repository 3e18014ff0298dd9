//! In-flight limits behind the layer: each admitted request holds its permits
//! ([`InFlight`](hotlimit::algo::InFlight)) until its response body ends, and a request beyond
//! the limit is answered with the status and `Retry-After` the layer was given.

use super::options::Shared;
use super::plan::NoPlans;
use super::{KeyExtractor, LayerBuilder, RequestCost};
use hotlimit::store::Ask;
use hotlimit::{AsyncRateLimiter, Requests, Ticket};
use http::header::{HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

impl<L, X, C> LayerBuilder<L, X, C, NoPlans>
where
    L: AsyncRateLimiter<str> + Requests<str>,
    X: KeyExtractor,
    C: RequestCost,
{
    /// The layer, holding each admitted request's permits until its response body ends
    /// (read to its end, failed, or dropped): for a limiter of
    /// [`InFlight`](hotlimit::algo::InFlight) permits, "at most N requests running per key".
    /// The request's [`cost`](LayerBuilder::cost) is the permits it takes. A request beyond
    /// the limit is answered `denied` (`429 Too Many Requests` or `503 Service Unavailable`,
    /// as you choose) with `Retry-After: retry_after` (whole seconds, rounded up, at least
    /// 1): a permit comes back when any request ends, which no decision can tell. In the
    /// other [modes](hotlimit::headers::Mode) every request goes through, and an admitted
    /// one still holds its permits. No `RateLimit` fields: they describe rates. The response
    /// body is wrapped in an [`InFlightBody`].
    ///
    /// ```
    /// use hotlimit::{algo::InFlight, CasLimiter};
    /// use hotlimit_tower::{HeaderKey, RateLimitLayer};
    /// use http::StatusCode;
    /// use std::{sync::Arc, time::Duration};
    ///
    /// // At most 4 generations running per API key; a fifth is told to come back in 2 s.
    /// let running = Arc::new(CasLimiter::<String, _>::new(InFlight::new(4, Duration::from_secs(600))?));
    /// let layer = RateLimitLayer::builder(running, HeaderKey::from_static("x-api-key"))
    ///     .in_flight(StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(2));
    /// # let _ = layer;
    /// # Ok::<(), hotlimit::ConfigError>(())
    /// ```
    pub fn in_flight(self, denied: StatusCode, retry_after: Duration) -> InFlightLayer<L, X, C> {
        let secs = retry_after
            .as_secs()
            .saturating_add(u64::from(retry_after.subsec_nanos() > 0));
        InFlightLayer {
            shared: Arc::new(InFlightShared {
                shared: self.shared,
                denied,
                retry_after: HeaderValue::from(secs.max(1)),
            }),
        }
    }
}

struct InFlightShared<L: ?Sized, X, C> {
    shared: Shared<L, X, C, NoPlans>,
    denied: StatusCode,
    retry_after: HeaderValue,
}

/// A `tower::Layer` whose requests hold their permits until their response bodies end; from
/// [`LayerBuilder::in_flight`]. Cloning is cheap (one `Arc`).
pub struct InFlightLayer<L: ?Sized, X, C> {
    shared: Arc<InFlightShared<L, X, C>>,
}

impl<L: ?Sized, X, C> Clone for InFlightLayer<L, X, C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<L: ?Sized, X, C> fmt::Debug for InFlightLayer<L, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLayer")
            .field("denied", &self.shared.denied)
            .field("retry_after", &self.shared.retry_after)
            .finish_non_exhaustive()
    }
}

impl<S, L: ?Sized, X, C> tower_layer::Layer<S> for InFlightLayer<L, X, C> {
    type Service = InFlightService<S, L, X, C>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`InFlightLayer`] wraps around an inner service.
pub struct InFlightService<S, L: ?Sized, X, C> {
    inner: S,
    shared: Arc<InFlightShared<L, X, C>>,
}

impl<S: Clone, L: ?Sized, X, C> Clone for InFlightService<S, L, X, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, L: ?Sized, X, C> fmt::Debug for InFlightService<S, L, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// An admitted request's permits: given back when dropped (the body ended or was dropped).
struct Held<L: Requests<str> + ?Sized> {
    limiter: Arc<L>,
    key: String,
    ticket: Ticket,
}

impl<L: Requests<str> + ?Sized> Drop for Held<L> {
    fn drop(&mut self) {
        // Nothing still held. The ticket is this limiter's, for this key: the settle cannot
        // be refused as another's.
        let _ = self
            .limiter
            .settle(&self.key, &mut self.ticket, 0, Ask::default());
    }
}

impl<S, L, X, C, ReqB, ResB> tower_service::Service<Request<ReqB>> for InFlightService<S, L, X, C>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Default,
    L: AsyncRateLimiter<str> + Requests<str>,
    X: KeyExtractor,
    C: RequestCost,
{
    type Response = Response<InFlightBody<ResB, L>>;
    type Error = S::Error;
    type Future = InFlightFuture<S::Future, L>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let outer = &*self.shared;
        let shared = &outer.shared;
        // A cost of 0 holds no permit: not limited, as in `build`'s layer.
        let (outcome, held) = shared.take(&parts, 0);
        let held = held.map(|(key, ticket)| Held {
            limiter: shared.limiter.clone(),
            key,
            ticket,
        });
        let kind = match shared.admit(outcome, &mut parts) {
            Ok(_) => Kind::Inner {
                future: self.inner.call(Request::from_parts(parts, body)),
                held,
            },
            // A denial: the layer's own status and wait, no rate fields.
            Err((StatusCode::TOO_MANY_REQUESTS, _)) => Kind::Answer {
                status: outer.denied,
                retry_after: Some(outer.retry_after.clone()),
            },
            Err((status, _)) => Kind::Answer {
                status,
                retry_after: None,
            },
        };
        InFlightFuture { kind }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`InFlightService`]: the inner service's response, its body
    /// holding the request's permits; or the layer's own answer.
    pub struct InFlightFuture<Fut, L>
    where
        L: ?Sized,
        L: Requests<str>,
    {
        #[pin]
        kind: Kind<Fut, L>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<Fut, L>
    where
        L: ?Sized,
        L: Requests<str>,
    {
        Inner { #[pin] future: Fut, held: Option<Held<L>> },
        Answer { status: StatusCode, retry_after: Option<HeaderValue> },
    }
}

impl<Fut, L: Requests<str> + ?Sized> fmt::Debug for InFlightFuture<Fut, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightFuture").finish_non_exhaustive()
    }
}

impl<Fut, E, B, L> Future for InFlightFuture<Fut, L>
where
    Fut: Future<Output = Result<Response<B>, E>>,
    B: Default,
    L: Requests<str> + ?Sized,
{
    type Output = Result<Response<InFlightBody<B, L>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, held } => {
                // An error, no response: `held` goes with the future, giving the permits back.
                let response = std::task::ready!(future.poll(cx))?;
                let held = held.take();
                Poll::Ready(Ok(response.map(|inner| InFlightBody { inner, held })))
            }
            KindProj::Answer {
                status,
                retry_after,
            } => {
                let mut response = Response::new(InFlightBody {
                    inner: B::default(),
                    held: None,
                });
                *response.status_mut() = *status;
                if let Some(value) = retry_after.take() {
                    response.headers_mut().insert(RETRY_AFTER, value);
                }
                Poll::Ready(Ok(response))
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body that holds its request's permits until it ends: read to its end,
    /// failed, or dropped. Otherwise the inner body, frame for frame.
    pub struct InFlightBody<B, L>
    where
        L: ?Sized,
        L: Requests<str>,
    {
        #[pin]
        inner: B,
        held: Option<Held<L>>,
    }
}

impl<B: fmt::Debug, L: Requests<str> + ?Sized> fmt::Debug for InFlightBody<B, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightBody")
            .field("inner", &self.inner)
            .field("holds", &self.held.is_some())
            .finish()
    }
}

impl<B: Body, L: Requests<str> + ?Sized> Body for InFlightBody<B, L> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        // The end, or a failure that ends it: the request is over.
        if !matches!(frame, Some(Ok(_))) {
            this.held.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
